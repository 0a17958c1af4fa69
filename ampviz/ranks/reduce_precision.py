"""Reduce precision: how far an fp32, fp16 or bf16 all-reduce lands from the exact sum as the world
grows (``reduce_errors``, the model with real gloo beside it), and DDP's ``fp16_compress_hook`` (and a
bf16 one) under ``GradScaler``: ``run_compress_hook`` runs it on real ranks, ``simulate_compress_hook``
predicts it step for step; both return a ``CompressTrace``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ampviz._args import _real, _shown, _whole
from ampviz.formats import BF16
from ampviz.ranks.gloo import _rounded, _sum_format, allreduce, run_allreduce
from ampviz.ranks.launcher import MAX_WORLD_SIZE, prewarm, run_ranks
from ampviz.scaling import TorchGradScaler
from ampviz.text import Table, measured, number

def _relative_error(got, exact: np.ndarray) -> float:
    d = np.asarray(got, np.float64) - exact
    return float(np.linalg.norm(d) / np.linalg.norm(exact))


@dataclass(frozen=True, eq=False)
class ReduceErrors:
    """The relative L2 error of an all-reduce SUM in each dtype against the exact (float64) sum of
    the same float32 gradients, per world size: ``error[dtype]`` (one value per world size, from
    ``allreduce``, gloo bit for bit), ``floor[dtype]`` (one rounding of the exact sum: the best any
    order can do), and ``real_equal[(dtype, world_size)]``: real gloo gave every rank the model's
    bits (for the world sizes run for real)."""

    world_sizes: tuple
    dtypes: tuple
    error: dict
    floor: dict
    real_equal: dict

    def table(self) -> Table:
        """Each error to 2 significant digits and its ratio to the floor (``measured``: the same text
        on every CPU, whose BLAS sums the norms in its own order)."""
        rows = []
        for i, ws in enumerate(self.world_sizes):
            cells = [ws]
            for d in self.dtypes:
                e, f = self.error[d][i], self.floor[d][i]
                ratio = f"{measured(e / f, 2)}× floor" if f > 0 else "floor 0"
                cells.append("0 (one rank: no sum)" if ws == 1 else f"{float(measured(e, 2)):.1e} ({ratio})")
            real = [self.real_equal[(d, ws)] for d in self.dtypes if (d, ws) in self.real_equal]
            cells.append(("bit-equal" if all(real) else "DIFFERS") if real else "model only")
            rows.append(cells)
        return Table(("ranks", *(f"{d} sum error" for d in self.dtypes), "real gloo vs model"), rows,
                     title="all-reduce SUM vs the exact sum (relative L2)")


def reduce_errors(world_sizes=(2, 4, 8), dtypes=("float32", "float16", "bfloat16"), *, length=65_536,
                  sigma=1e-3, seed=0, real_up_to=4) -> ReduceErrors:
    """All-reduce (SUM) of ``length`` gradients ~ N(0, ``sigma``) per rank (float32, an independent
    stream per rank, the first ``world_size`` rows of one draw), in each dtype, against the exact sum.
    World sizes up to ``real_up_to`` are also run on real gloo ranks and compared bit for bit with
    the model. One rank sums nothing: its error is 0."""
    sizes = tuple(_whole("world_size", w, 1, MAX_WORLD_SIZE) for w in world_sizes)
    if not sizes:
        raise ValueError("world_sizes must list at least one world size, such as (2, 4, 8)")
    names = tuple(_sum_format(d).torch_dtype.__str__().replace("torch.", "") for d in dtypes)
    length = _whole("length", length, 1, 2**22)
    rng = np.random.default_rng(_whole("seed", seed, 0, None))
    if not 0 < _real("sigma", sigma) < math.inf:
        raise ValueError(f"sigma must be a number above 0 (the gradients' standard deviation), such as 1e-3, "
                         f"not {_shown(sigma)}")
    real_up_to = _whole("real_up_to", real_up_to, 0, 16)
    grads = (rng.standard_normal((max(sizes), length)) * float(sigma)).astype(np.float32)
    error, floor, real_equal = {d: [] for d in names}, {d: [] for d in names}, {}
    for ws in sizes:
        x = grads[:ws]
        for d in names:
            model, once = allreduce(x, d), allreduce(x, d, order="once")
            with np.errstate(invalid="ignore", over="ignore"):
                exact = _rounded(_sum_format(d), x).astype(np.float64).sum(axis=0)
                if not (np.isfinite(model).all() and np.isfinite(once).all() and np.isfinite(exact).all()):
                    raise ValueError(f"with sigma={number(sigma)} the {d} sums overflow (inf), so there is no relative "
                                     f"error: pass a smaller sigma, such as 1e-3")
            if not exact.any():
                raise ValueError(f"with sigma={number(sigma)} every {d} gradient rounds to 0, so there is no "
                                 f"relative error: pass a larger sigma, such as 1e-3")
            error[d].append(_relative_error(model, exact))
            floor[d].append(_relative_error(once, exact))
            if ws <= real_up_to:
                real = run_allreduce(x, d)
                real_equal[(d, ws)] = bool(all(np.array_equal(r.view(np.uint16 if r.dtype == np.float16 else np.uint32),
                                                              model.view(np.uint16 if model.dtype == np.float16
                                                                         else np.uint32)) for r in real))
    return ReduceErrors(sizes, names, {d: np.array(v) for d, v in error.items()},
                        {d: np.array(v) for d, v in floor.items()}, real_equal)


@dataclass(frozen=True, eq=False)
class CompressTrace:
    """DDP steps whose gradient all-reduce is fp32 (``hook=None``) or ``fp16_compress_hook``
    (``"fp16"``), under ``GradScaler("cpu")``: per step the scale used, the number of gradient
    entries that were not finite after the all-reduce, and whether the step was skipped;
    ``ranks_agree``: every rank held the same bits after each all-reduce (real runs only)."""

    hook: str | None
    world_size: int
    scale: np.ndarray
    nonfinite: np.ndarray
    skipped: np.ndarray
    length: int
    ranks_agree: bool = True

    def __repr__(self) -> str:
        name = {None: "fp32 all-reduce", "fp16": "fp16_compress_hook", "bf16": "bf16 hook for gloo"}.get(
            self.hook, self.hook)
        steps = "; ".join(f"scale {number(s)}: {n:,} non-finite, {'skipped' if k else 'stepped'}"
                          for s, n, k in zip(self.scale, self.nonfinite, self.skipped))
        return f"{name}, {self.world_size} ranks: {steps}"

    def same(self, other: "CompressTrace") -> bool:
        return (np.array_equal(self.scale, other.scale) and np.array_equal(self.nonfinite, other.nonfinite)
                and np.array_equal(self.skipped, other.skipped))


#: The gradient all-reduces ``run_compress_hook`` runs: DDP's default (fp32), ``fp16_compress_hook``,
#: a bf16 hook written for gloo (cast, divide, all-reduce in bf16), and torch's ``bf16_compress_hook``
#: (which DDP refuses on gloo: ``run_compress_hook`` then raises ``RankError``, a ``TypeError`` in the ranks).
COMPRESS_HOOKS = (None, "fp16", "bf16", "bf16_compress_hook")


def _bf16_hook_gloo(state, bucket):
    """``bf16_compress_hook`` for gloo: cast the bucket to bf16, divide by the world size, all-reduce."""
    import torch.distributed as dist

    buf = bucket.buffer()
    c = buf.to(torch.bfloat16).div_(dist.get_world_size())
    return dist.all_reduce(c, async_op=True).get_future().then(lambda f: buf.copy_(f.value()[0]))


def _compress_grads(seed: int, rank: int, step: int, length: int) -> np.ndarray:
    g = torch.Generator().manual_seed((seed * 1_000_003 + rank * 10_007 + step) % 2**63)
    return torch.randn(length, generator=g).numpy()


def _compress_args(hook, world_size, steps, init_scale, length, seed):
    if hook not in COMPRESS_HOOKS:
        raise ValueError(f"hook must be None (DDP's fp32 all-reduce), 'fp16' (fp16_compress_hook), 'bf16' (the "
                         f"same in bf16, written for gloo) or 'bf16_compress_hook' (torch's, which DDP refuses "
                         f"on gloo), not {_shown(hook)}")
    return (hook, _whole("world_size", world_size, 1, 8), _whole("steps", steps, 1, 50),
            _real("init_scale", init_scale), _whole("length", length, 1, 2**20), _whole("seed", seed, 0, 2**31))


def _compress_rank(rank, world_size, hook, steps, init_scale, length, seed, growth_interval):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook
    from torch.nn.parallel import DistributedDataParallel

    class Dot(torch.nn.Module):  # loss = w . g: the gradient is g, scaled: S * g in float32
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(length))

        def forward(self, g):
            return (self.weight * g).sum()

    model = Dot()
    net = DistributedDataParallel(model)
    if hook == "fp16":
        net.register_comm_hook(None, fp16_compress_hook)
    elif hook == "bf16":
        net.register_comm_hook(None, _bf16_hook_gloo)
    elif hook == "bf16_compress_hook":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

        net.register_comm_hook(None, bf16_compress_hook)
    opt = torch.optim.SGD(net.parameters(), lr=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    scale, nonfinite, skipped, grads = [], [], [], []
    for t in range(steps):
        opt.zero_grad(set_to_none=True)
        scale.append(scaler.get_scale())
        scaler.scale(net(torch.from_numpy(_compress_grads(seed, rank, t, length)))).backward()
        grad = model.weight.grad
        nonfinite.append(int((~torch.isfinite(grad)).sum()))
        grads.append(grad.numpy().copy())
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        skipped.append(scaler.get_scale() < before)
    return scale, nonfinite, skipped, np.stack(grads)


def run_compress_hook(hook="fp16", *, world_size=2, steps=3, init_scale=4e4, length=65_536, seed=0,
                      growth_interval=2000, timeout=60.0) -> CompressTrace:
    """Real DDP ranks (gloo) training a probe whose scaled gradient is ``S * g`` in float32, ``g`` ~
    N(0, 1) per rank and step, with ``GradScaler("cpu", init_scale)`` and DDP's default fp32
    all-reduce (``hook=None``) or ``fp16_compress_hook`` (``"fp16"``), which casts the *scaled*
    gradients to fp16 before dividing by the world size; ``"bf16"``: the same cast, divide and
    all-reduce in bf16 (a hook written for gloo); ``"bf16_compress_hook"``: torch's, which DDP refuses
    on gloo (``RankError``, a ``TypeError`` in the ranks). ``simulate_compress_hook`` predicts it."""
    args = _compress_args(hook, world_size, steps, init_scale, length, seed)
    growth_interval = _whole("growth_interval", growth_interval, 1, 2**31 - 1)
    prewarm()
    out = run_ranks(_compress_rank, args[1], *args[0:1], *args[2:], growth_interval, timeout=timeout)
    agree = all(np.array_equal(o[3].view(np.uint32), out[0][3].view(np.uint32)) for o in out)
    s, n, k, _ = out[0]
    return CompressTrace(hook, args[1], np.array(s), np.array(n), np.array(k), args[4], agree)


def simulate_compress_hook(hook="fp16", *, world_size=2, steps=3, init_scale=4e4, length=65_536, seed=0,
                           growth_interval=2000) -> CompressTrace:
    """``run_compress_hook`` predicted with ``allreduce`` (gloo bit for bit): each rank's float32
    ``S * g``, then for ``"fp16"`` cast to fp16 (|S g| > 65,504 becomes inf) and divided by the world
    size in fp16, summed in fp16; for ``None`` divided in float32 and summed in float32."""
    hook, world_size, steps, init_scale, length, seed = _compress_args(hook, world_size, steps, init_scale,
                                                                        length, seed)
    policy = TorchGradScaler(init_scale=init_scale, growth_interval=growth_interval)
    state = policy.initial_state()
    scale, nonfinite, skipped = [], [], []
    for t in range(steps):
        s = np.float32(state.scale)
        with np.errstate(over="ignore", invalid="ignore"):
            rows = np.stack([s * _compress_grads(seed, r, t, length) for r in range(world_size)])
            if hook == "fp16":
                rows = (rows.astype(np.float16).astype(np.float32) / np.float32(world_size)).astype(np.float16)
                summed = allreduce(rows, "float16").astype(np.float32)
            elif hook in ("bf16", "bf16_compress_hook"):
                rows = _rounded(BF16, _rounded(BF16, rows.astype(np.float32)) / np.float32(world_size))
                summed = allreduce(rows, "bfloat16")
            else:
                summed = allreduce(rows / np.float32(world_size), "float32")
        bad = int((~np.isfinite(summed)).sum())
        scale.append(float(s))
        nonfinite.append(bad)
        skipped.append(bad > 0)
        state = policy._adjust(state, bad > 0)
    return CompressTrace(hook, world_size, np.array(scale), np.array(nonfinite), np.array(skipped), length)
