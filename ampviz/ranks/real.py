"""The simulator's scenarios run for real: ``run_scaler_ranks`` trains on forked gloo ranks with the
real ``GradScaler("cpu")`` (DDP, local scalers, unscale-first, ``ShardedGradScaler``, FSDP1) and
returns a ``RanksRun``: the same ``RanksTrace`` as ``simulate_ranks`` gives, plus every rank's weights
after every step. ``_scaler_rank`` is the code each rank runs; ``_Probe`` is a layer whose gradient is
exactly a given value, and ``_batch``/``_SPIKE`` the MLP's batches and the input that overflows them.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from ampviz._args import _flag, _real, _shown, _whole
from ampviz.ranks.launcher import prewarm, run_ranks
from ampviz.ranks.simulator import RanksTrace, _mode, _stream
from ampviz.scaling import DynamicScaler, TorchGradScaler, simulate
from ampviz.text import number

#: The longest stream ``run_scaler_ranks`` runs for real (a few ms a step per rank).
MAX_REAL_STEPS = 200


@dataclass(frozen=True, eq=False)
class RanksRun:
    """A real multi-rank run: ``trace`` (a ``RanksTrace`` of what each rank's real scaler did, to
    compare with ``simulate_ranks``) and ``weights``, every rank's flattened weights before the
    first step and after each step (shape (world_size, steps + 1, n), float32)."""

    trace: RanksTrace
    weights: np.ndarray

    @property
    def weights_identical(self) -> np.ndarray:
        """Per step (and before the first): every rank's weights are bitwise identical."""
        bits = self.weights.view(np.uint32)
        return (bits == bits[:1]).all(axis=(0, 2))

    @property
    def weights_spread(self) -> np.ndarray:
        """Per step: max over ranks and weights of |w_rank - w_rank0| (NaN once a weight is NaN)."""
        with np.errstate(invalid="ignore"):
            d = np.abs(self.weights.astype(np.float64) - self.weights[:1].astype(np.float64))
        return np.where(np.isnan(d).any(axis=(0, 2)), np.nan, np.nanmax(d, axis=(0, 2), initial=0.0))

    @property
    def weights_finite(self) -> np.ndarray:
        """(world_size, steps + 1): every weight of that rank is finite."""
        return np.isfinite(self.weights).all(axis=2)

    def __repr__(self) -> str:
        return f"RanksRun({self.trace!r}, weights identical at the end: {bool(self.weights_identical[-1])})"


#: The highest scale a ``found_inf`` run may reach (its MLP's clean steps overflow from about 2^16).
MLP_MAX_SCALE = 2.0**14
_SPIKE = 2.0**20  # an input this large overflows the fp16 forward (inf), whatever the scale



def _counted_steps(opt) -> list:
    """Count ``opt.step()`` calls that run (a scaler skips a step by not calling it): the list
    gets one item per call."""
    calls, real_step = [], opt.step

    def counted_step(*args, **kwargs):
        calls.append(1)
        return real_step(*args, **kwargs)

    opt.step = counted_step
    return calls

def _batch(seed: int, rank: int, step: int):
    g = torch.Generator().manual_seed(((seed * 1_000_003) + rank * 10_007 + step) % 2**63)
    x = torch.randn(16, 8, generator=g)
    return x, x[:, :1] - 0.5 * x[:, 1:2]


class _Probe(torch.nn.Module):
    """A layer whose scaled gradient is exactly ``f32(f16(f32(scale * g)))`` for a given ``g``
    (backward through an fp16 cast of the weights, as autocast's casts do), and NaN once the weights
    are NaN, as a network's gradients are."""

    def __init__(self, n: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(n))

    def forward(self, g):
        z = self.weight.half().float()
        return (z * g).sum() + (z * z).sum() * 0.0


_PROBE_PATTERN = (1.0, -0.5, 0.25, -0.125)


_PROBE_CLEAN = 2.0**-7  # a probe's |gradient| at a clean step of a found_inf stream


def _scaler_rank(rank: int, world_size: int, mode: str, stream: np.ndarray, flags_given: bool, fsdp: bool,
                 settings: dict, seed: int, lr: float, max_norm: float) -> dict:
    """One rank of ``run_scaler_ranks`` (runs in a forked rank)."""
    import torch.distributed as dist

    torch.manual_seed(seed)  # the same initial weights on every rank
    probe = fsdp or not flags_given
    if probe:
        width = len(_PROBE_PATTERN)
        model = _Probe(width * (world_size if fsdp else 1))
        region = slice(width * rank, width * (rank + 1)) if fsdp else slice(0, width)  # FSDP: this rank's shard
    else:
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    net = model
    local_finite = []
    if fsdp:
        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

        with warnings.catch_warnings():  # one rank: FSDP says it falls back to NO_SHARD, as intended
            warnings.filterwarnings("ignore", message="FSDP is switching to use `NO_SHARD`", category=UserWarning)
            net = FullyShardedDataParallel(model, device_id=torch.device("cpu"),
                                           sharding_strategy=ShardingStrategy.FULL_SHARD)
    elif mode == "ddp":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        from torch.nn.parallel import DistributedDataParallel

        def recording_hook(state, bucket):  # the local gradients, before DDP's all-reduce
            local_finite.append(bool(torch.isfinite(bucket.buffer()).all()))
            return allreduce_hook(state, bucket)

        net = DistributedDataParallel(model)
        net.register_comm_hook(None, recording_hook)
    params = list(net.parameters())  # FSDP: this rank's flat shard
    opt = torch.optim.SGD(params, lr=lr)
    calls = _counted_steps(opt)
    if mode == "synced":
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        scaler = ShardedGradScaler("cpu", **settings)
    else:
        scaler = torch.amp.GradScaler("cpu", **settings)

    def weights():
        if fsdp:
            with FullyShardedDataParallel.summon_full_params(net):
                return model.weight.detach().clone()
        return torch.cat([p.detach().reshape(-1) for p in params]).clone()

    steps = stream.shape[1]
    scale = np.empty(steps)
    over = np.zeros(steps, bool)
    stepped = np.zeros(steps, bool)
    nonfinite = np.zeros(steps, bool)
    history = [weights()]
    pattern = torch.tensor(_PROBE_PATTERN)
    for t in range(steps):
        opt.zero_grad(set_to_none=True)
        scale[t] = scaler.get_scale()
        if probe:
            value = float(stream[rank, t]) if not flags_given else (math.inf if stream[rank, t] else _PROBE_CLEAN)
            g = torch.zeros(model.weight.numel())
            g[region] = torch.tensor(value, dtype=torch.float32) * pattern
            loss = net(g)
        else:
            x, y = _batch(seed, rank, t)
            if stream[rank, t]:
                x = x * _SPIKE
            with torch.autocast("cpu", dtype=torch.float16):
                out = net(x)
            loss = torch.nn.functional.mse_loss(out.float(), y)
        local_finite.clear()
        scaler.scale(loss).backward()
        grads = [p.grad for p in params if p.grad is not None]
        if mode == "ddp" and not fsdp:
            over[t] = not all(local_finite)
        else:  # FSDP: this rank's shard, after the reduce-scatter
            over[t] = not all(bool(torch.isfinite(gr).all()) for gr in grads)
        if mode in ("unscale_first", "synced") and not fsdp:
            scaler.unscale_(opt)  # ShardedGradScaler all-reduces found_inf here
            torch.nn.utils.clip_grad_norm_(params, max_norm)
            for gr in grads:
                dist.all_reduce(gr)
                gr /= world_size
        reduced_finite = all(bool(torch.isfinite(gr).all()) for gr in grads)
        before = len(calls)
        scaler.step(opt)  # ShardedGradScaler (FSDP): its unscale_ all-reduces found_inf
        scaler.update()
        stepped[t] = len(calls) > before
        nonfinite[t] = stepped[t] and not reduced_finite
        history.append(weights())
    return {"scale": scale, "overflow": over, "stepped": stepped, "nonfinite": nonfinite,
            "final": float(scaler.get_scale()), "weights": torch.stack(history).numpy()}


def run_scaler_ranks(mode="ddp", *, found_inf=None, grad_max=None, fsdp=False, init_scale=1024.0,
                     growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, seed=0, lr=0.01, max_norm=1.0,
                     timeout=60.0) -> RanksRun:
    """Run a ``simulate_ranks`` scenario for real: one forked rank per row, gloo, CPU.

    Each rank trains with the real ``torch.amp.GradScaler("cpu", init_scale=..., growth_factor=...,
    backoff_factor=..., growth_interval=...)`` (``ShardedGradScaler`` in ``"synced"`` mode) and SGD:

    * ``found_inf`` (per rank and step): a small MLP (8-16-1, the same initial weights on every
      rank) under ``autocast("cpu", float16)`` with MSE loss on the rank's own seeded batches; where
      a flag is set the batch is multiplied by 2^20, so the fp16 forward overflows and every gradient
      is inf/NaN (whatever the scale); elsewhere the gradients stay finite at the scales allowed here
      (at most 2^14).
    * ``grad_max`` (per rank and step): a probe layer whose gradient is exactly
      ``g * [1, -0.5, 0.25, -0.125]`` with ``g`` that value, scaled and cast to fp16 on its way back
      (so it overflows exactly when ``overflows(scale, g, "fp16")`` says), and NaN once its weights
      are NaN.

    ``mode``: ``"ddp"`` wraps the model in ``DistributedDataParallel`` (a comm hook records each
    rank's local gradients before the all-reduce); ``"local"`` never all-reduces; ``"unscale_first"``
    runs ``unscale_``, ``clip_grad_norm_(max_norm)``, then ``dist.all_reduce`` of each gradient (and
    divides by world_size) before ``step``; ``"synced"`` does the same with ``ShardedGradScaler``,
    whose ``unscale_`` all-reduces found_inf.

    ``fsdp=True``: FSDP1 (``FullyShardedDataParallel``, FULL_SHARD) over a probe of 4 weights per
    rank, rank ``r``'s shard being weights ``4r`` to ``4r + 3``; each row then says what reaches that
    rank's *shard* (its own gradient, put in its shard's region, whose reduce-scatter carries it
    there): an inf (``found_inf``) or a largest |gradient| (``grad_max``). ``mode="local"`` is FSDP1
    with a plain GradScaler (each rank judges its own shard: the scales drift apart and a skip on one
    rank leaves the model half-updated); ``mode="synced"`` is FSDP1 with ``ShardedGradScaler`` (the
    flag is all-reduced: every rank skips). ``trace.overflow`` is then the shard's inf, after the
    reduce-scatter.

    Returns a ``RanksRun``; ``simulate_ranks`` with the same arguments must give the same ``trace``
    (``same_trace``). At most ``MAX_REAL_STEPS`` steps and 8 ranks.
    """
    mode = _mode(mode)
    fsdp = _flag("fsdp", fsdp)
    if fsdp and mode not in ("local", "synced"):
        raise ValueError(f"with fsdp=True give mode='local' (FSDP1 with a plain GradScaler) or 'synced' "
                         f"(with ShardedGradScaler), not {mode!r}")
    arr, flags_given = _stream(found_inf, grad_max)
    if arr.shape[1] > MAX_REAL_STEPS:
        raise ValueError(f"give at most {MAX_REAL_STEPS} steps for a real run (simulate_ranks runs "
                         f"millions), not {arr.shape[1]}")
    settings = {"init_scale": _real("init_scale", init_scale), "growth_factor": _real("growth_factor", growth_factor),
                "backoff_factor": _real("backoff_factor", backoff_factor),
                "growth_interval": _whole("growth_interval", growth_interval, 1, 2**31 - 1)}
    policy = TorchGradScaler(**settings)  # checks them as GradScaler does
    if not (0 < settings["init_scale"] <= 2.0**24):
        raise ValueError(f"init_scale must be above 0 and at most 2^24 for these runs, not {_shown(init_scale)}")
    if mode == "synced":  # ShardedGradScaler's CPU update: float32 tensor arithmetic, no finite check
        policy = DynamicScaler(name="sharded", arithmetic="float32", inf_guard=False, **settings,
                               source="torch/distributed/fsdp/sharded_grad_scaler.py")
    seed = _whole("seed", seed, 0, 2**31)
    lr = _real("lr", lr)
    max_norm = _real("max_norm", max_norm)
    if not (lr >= 0 and math.isfinite(lr)):
        raise ValueError(f"lr must be a finite number >= 0, not {_shown(lr)}")
    if not (max_norm > 0):
        raise ValueError(f"max_norm must be a positive number, not {_shown(max_norm)}")
    world_size = arr.shape[0]
    if world_size > 8:
        raise ValueError(f"give at most 8 ranks (rows) for a real run, not {world_size}")
    if flags_given:  # the highest scale the run can reach: every step clean
        top = np.nanmax(simulate(policy, found_inf=np.zeros(arr.shape[1] + 1, bool)).scale, initial=0.0)
        if top > MLP_MAX_SCALE:
            raise ValueError(f"with found_inf the scale must stay at most 2^14 (this MLP's clean steps overflow "
                             f"from about 2^16), but init_scale={number(settings['init_scale'])} could grow to "
                             f"{number(top)} in {arr.shape[1]} steps: use a smaller init_scale or a longer "
                             f"growth_interval")
    prewarm()
    stream = arr.astype(np.float32) if not flags_given else arr
    out = run_ranks(_scaler_rank, world_size, mode, stream, flags_given, fsdp, settings, seed, lr, max_norm,
                    timeout=timeout)
    stepped = np.stack([o["stepped"] for o in out])
    trace = RanksTrace(mode, policy, np.stack([o["scale"] for o in out]), np.stack([o["overflow"] for o in out]),
                       ~stepped, stepped, np.stack([o["nonfinite"] for o in out]),
                       np.array([o["final"] for o in out]))
    return RanksRun(trace, np.stack([o["weights"] for o in out]))
