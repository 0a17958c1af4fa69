"""Loss scaling across ranks: real ``torch.distributed`` ranks from a notebook cell, gloo's all-reduce
bit for bit, and a multi-rank loss-scaler simulator held to real runs.

``ampviz/__init__.py`` never imports this module, so ``import ampviz`` stays free of torch.

* ``prewarm`` and ``run_ranks``: fork ``world_size`` rank processes (``mp.spawn`` cannot find a
  function defined in a notebook), each on one torch thread and in a gloo process group, run
  ``fn(rank, world_size, *args)`` in each and return their results. No rank process, nor anything
  it started, outlives the call: not when a rank raises, hangs past ``timeout`` or the caller is
  interrupted (every rank is then killed with its process group and reaped), nor when the parent
  dies (Linux: each rank asks the kernel to kill it then). ``prewarm()`` imports once, in the
  parent, what each rank would otherwise import on its first ``DistributedDataParallel``
  (``torch._dynamo``: seconds per rank).
* ``allreduce``: what every rank holds after ``dist.all_reduce(t, SUM)`` on gloo, for float32,
  float16 and bfloat16, bit for bit (NaN as NaN: its sign is not modelled). Gloo's ring
  (``gloo/allreduce.cc``, ``ring``) cuts the buffer into ``numSegments`` segments, at least
  ``2 * world_size`` and a multiple of it, none longer than 1 MiB; rank ``c`` ends up owning chunk
  ``c`` (``numSegments / world_size`` segments in a row), whose elements are summed in the order
  ranks ``c-1, c-2, ..., c`` (mod world_size), rounding to the tensor's dtype after every add
  (``gloo::sum<c10::Half>``/``<c10::BFloat16>``: a float32 add, then a round to nearest even).
  The all-gather then copies each owner's chunk to every rank. ``order=`` gives the plausible wrong
  models for comparison: ranks in order, a pairwise tree, one rounding of a float64 sum.
  ``gloo_chunks`` and ``gloo_summation_order`` show the layout; ``run_allreduce`` runs the real one.
* ``simulate_ranks``: per-rank loss scalers (``ampviz.scaling`` policies, e.g. ``TorchGradScaler``)
  over per-rank overflow flags or per-rank max |gradient|, with the found_inf flag shared (``"ddp"``:
  the gradient all-reduce comes before ``unscale_``, so an inf reaches every rank; ``"synced"``:
  the flag itself is all-reduced, as ``ShardedGradScaler`` does) or not (``"local"``: a scaler per
  rank on gradients never all-reduced, so the scales drift apart; ``"unscale_first"``: ``unscale_``
  and clipping on local gradients, then a manual all-reduce, so a rank whose own gradients were
  clean steps on the others' inf). Returns a ``RanksTrace``: per-rank scale, overflow, skip and
  step at every step.
* ``run_scaler_ranks``: the same scenarios run for real (``GradScaler("cpu")``, DDP,
  ``ShardedGradScaler``, FSDP1 with either scaler; gloo) on forked ranks, returning the same
  ``RanksTrace`` plus every rank's weights after every step.
* ``reduce_errors``: the error of an fp32, fp16 or bf16 all-reduce against the exact sum as the
  world grows (the model, with real gloo beside it); ``run_compress_hook`` and
  ``simulate_compress_hook``: DDP's ``fp16_compress_hook`` (and a bf16 one) under ``GradScaler``,
  real and predicted.
* ``run_fsdp2_policy`` and ``policy_errors``: FSDP2 (``fully_shard``) with a
  ``MixedPrecisionPolicy(param_dtype, reduce_dtype)`` on real ranks, each gradient against the exact
  fp32 mean; ``divide_factors`` and ``run_fsdp2_reduce``: how FSDP2 averages (one AVG in fp32 and
  bf16, a divide by about sqrt(world_size) before and after an fp16 SUM); ``run_fsdp2_scaler``: an inf
  in one rank's shard, and every rank skips with ``ShardedGradScaler`` or a plain ``GradScaler``.
* ``run_lightning_ranks``: ``lightning.Trainer(accelerator="cpu")`` with DDP on the same forked
  ranks, with ``precision="16-mixed"`` (which Lightning turns into bf16 on the CPU) or the
  explicit fp16 plugin with a GradScaler.
* ``check_*``: notebooks 11a's and 11b's exercise checkers.

Real runs are the reference: the tests hold ``allreduce`` to gloo and ``simulate_ranks`` to
``run_scaler_ranks`` step for step, and show that the plausible wrong models fail.

This module only gathers the names; the code lives in one module per concept:

* ``launcher``: starting ranks (``RankError``, ``prewarm``, ``run_ranks``: forks, gloo, a
  ``FileStore``, signal handling, reaping).
* ``gloo``: gloo's ring (``gloo_chunks``, ``gloo_summation_order``) and the all-reduce model
  (``allreduce``, ``run_allreduce``).
* ``simulator``: the multi-rank loss-scaler simulator (``RanksTrace``, ``simulate_ranks``, ``same_trace``).
* ``real``: the same scenarios run for real (``RanksRun``, ``run_scaler_ranks``).
* ``reduce_precision``: ``reduce_errors`` and the compress hooks (``run_compress_hook``,
  ``simulate_compress_hook``).
* ``fsdp2``: FSDP2's mixed precision on real ranks (``Fsdp2Run``, ``run_fsdp2_policy``, ``PolicyErrors``,
  ``policy_errors``, ``divide_factors``, ``Fsdp2Reduce``, ``run_fsdp2_reduce``, ``Fsdp2ScalerRun``,
  ``run_fsdp2_scaler``).
* ``lesson``: notebooks 11a's and 11b's exercise checkers.
* ``lightning``: Lightning on CPU ranks (``LightningRun``, ``run_lightning_ranks``).
"""

from __future__ import annotations

from ampviz.ranks import launcher as _launcher
from ampviz.ranks.launcher import MAX_WORLD_SIZE, RankError, prewarm, run_ranks
from ampviz.ranks.gloo import ORDERS, allreduce, gloo_chunks, gloo_summation_order, run_allreduce
from ampviz.ranks.simulator import MODES, RanksTrace, _step_loop, same_trace, simulate_ranks
from ampviz.ranks.real import RanksRun, run_scaler_ranks
from ampviz.ranks.reduce_precision import (COMPRESS_HOOKS, CompressTrace, ReduceErrors, _compress_grads,
    reduce_errors, run_compress_hook, simulate_compress_hook)
from ampviz.ranks.lesson import (check_compress_share, check_ddp_skips, check_found_inf_op, check_local_scales,
    check_why_compress_skips, check_why_ddp_agree, check_why_fsdp1_half_step, check_why_ring_order)
from ampviz.ranks.lightning import LightningRun, run_lightning_ranks
from ampviz.ranks.fsdp2 import (Fsdp2Reduce, Fsdp2Run, Fsdp2ScalerRun, PolicyErrors, divide_factors, policy_errors,
    run_fsdp2_policy, run_fsdp2_reduce, run_fsdp2_scaler)

__all__ = [
    "RankError",
    "prewarm",
    "run_ranks",
    "allreduce",
    "run_allreduce",
    "ORDERS",
    "gloo_chunks",
    "gloo_summation_order",
    "MODES",
    "RanksTrace",
    "simulate_ranks",
    "RanksRun",
    "run_scaler_ranks",
    "same_trace",
    "ReduceErrors",
    "reduce_errors",
    "CompressTrace",
    "COMPRESS_HOOKS",
    "run_compress_hook",
    "simulate_compress_hook",
    "LightningRun",
    "run_lightning_ranks",
    "Fsdp2Run",
    "run_fsdp2_policy",
    "PolicyErrors",
    "policy_errors",
    "divide_factors",
    "Fsdp2Reduce",
    "run_fsdp2_reduce",
    "Fsdp2ScalerRun",
    "run_fsdp2_scaler",
    "check_ddp_skips",
    "check_local_scales",
    "check_found_inf_op",
    "check_compress_share",
    "check_why_ddp_agree",
    "check_why_fsdp1_half_step",
    "check_why_ring_order",
    "check_why_compress_skips",
]


def __getattr__(name):
    """``_PREWARMED`` (whether ``prewarm`` ran) read from ``launcher``, where ``prewarm`` sets it."""
    if name == "_PREWARMED":
        return _launcher._PREWARMED
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
