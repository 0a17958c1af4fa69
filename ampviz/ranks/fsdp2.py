"""FSDP2 on real gloo ranks: ``fully_shard`` with a ``MixedPrecisionPolicy(param_dtype, reduce_dtype)``.

* ``run_fsdp2_policy``: one forward and backward of a seeded ``Linear(64, 64)`` under one policy,
  each rank on its own seeded batch; every rank's output dtype, gradient dtype and full (gathered)
  gradient, beside the exact mean gradient over the concatenated batch (float64 arithmetic on the
  same float32 weights and batches), and the divide factors FSDP2 chose for the reduce.
* ``policy_errors``: that run for several policies and world sizes, as a table of relative errors.
* ``divide_factors``: the rule FSDP2 (torch 2.13, ``_fsdp_collectives._get_gradient_divide_factors``)
  uses to average gradients: an fp32 or bf16 reduce is one ``ReduceOp.AVG``; an fp16 reduce is a SUM
  with a divide by about sqrt(world_size) before it and by the rest after it, so that neither the
  sum overflows nor the summands underflow. ``run_fsdp2_reduce`` shows it on given gradients.
* ``run_fsdp2_scaler``: an inf in one rank's gradient lands in another rank's shard; with
  ``ShardedGradScaler`` or a plain ``GradScaler`` every rank finds it and skips.

``_policy_rank``, ``_reduce_rank`` and ``_scaler_rank`` are the code each rank runs.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from ampviz._args import _real, _real_array, _seed, _shown, _whole
from ampviz.ranks.launcher import prewarm, run_ranks
from ampviz.ranks.real import _counted_steps
from ampviz.text import Table, measured, number

#: The dtypes a policy takes, by the names the lessons use.
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_ALIASES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float": "fp32"}
#: The (param_dtype, reduce_dtype) policies ``policy_errors`` runs by default (None: no cast).
COMBOS = ((None, None), ("fp16", "fp32"), ("fp16", "fp16"), ("bf16", "fp32"), ("bf16", "bf16"),
          (None, "fp16"), (None, "bf16"))
#: The most ranks these runs start.
MAX_FSDP2_RANKS = 8
_WIDTH = 64  # the model: Linear(64, 64)


def _dtype(name: str, value) -> str | None:
    """A policy dtype as its short name ("fp32", "bf16", "fp16"), or None (no cast)."""
    if value is None:
        return None
    if isinstance(value, torch.dtype):
        for short, dt in DTYPES.items():
            if value == dt:
                return short
        raise ValueError(f"{name} must be None, 'fp32', 'bf16' or 'fp16' (or that torch dtype), not {value}")
    if isinstance(value, str):
        key = value.strip().lower().replace("torch.", "")
        key = _ALIASES.get(key, key)
        if key in DTYPES:
            return key
    raise (ValueError if isinstance(value, str) else TypeError)(
        f"{name} must be None, 'fp32', 'bf16' or 'fp16' (or that torch dtype), not {_shown(value)}")


def _shown_dtype(d: str | None) -> str:
    return "None" if d is None else d


def _ranks(world_size) -> int:
    return _whole("world_size", world_size, 2, MAX_FSDP2_RANKS)


def _warm() -> None:
    """``prewarm`` and, once in this process, FSDP2's own imports (else each rank pays them)."""
    prewarm()
    import torch.distributed.fsdp  # noqa: F401
    import torch.distributed.fsdp._fully_shard._fsdp_collectives  # noqa: F401
    import torch.distributed.tensor  # noqa: F401


def divide_factors(world_size, reduce_dtype="fp16") -> tuple:
    """What FSDP2 (torch 2.13) divides a gradient by to average it over ``world_size`` ranks, for a
    reduce in ``reduce_dtype``: ``(pre, post, op)``. fp32 and bf16: ``(None, None, "AVG")`` (the
    collective averages; one rank: ``"SUM"``). fp16: ``(pre, post, "SUM")``, ``pre`` the smallest
    power of two with ``pre * pre >= world_size`` that divides it (2 for 2, 3 and 4 ranks, 4 for 8),
    ``post = world_size / pre``: each rank divides by ``pre`` before the sum, the sum by ``post``."""
    world_size = _whole("world_size", world_size, 1, 2**20)
    reduce_dtype = _dtype("reduce_dtype", reduce_dtype) or "fp32"
    if reduce_dtype != "fp16":
        return (None, None, "SUM" if world_size == 1 else "AVG")
    pre = 1
    while world_size % pre == 0 and world_size / pre > pre:
        pre *= 2
    return (pre, world_size / pre, "SUM")


def _record_factors(sink: list) -> None:
    """In a rank: note what ``_get_gradient_divide_factors`` returns each time FSDP2 reduces."""
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as collectives

    original = getattr(collectives, "_get_gradient_divide_factors", None)
    if original is None or getattr(original, "_ampviz_recording", False):
        return

    def recording(*args, **kwargs):
        out = original(*args, **kwargs)
        pre, post, rs_op, _ = out
        name = getattr(rs_op, "name", None) or str(rs_op).rsplit(".", 1)[-1]
        sink.append((pre, None if post is None else float(post), str(name)))
        return out

    recording._ampviz_recording = True
    collectives._get_gradient_divide_factors = recording


def _policy(param_dtype, reduce_dtype):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=DTYPES.get(param_dtype), reduce_dtype=DTYPES.get(reduce_dtype))


def _batch(seed: int, rank: int, batch: int):
    g = torch.Generator().manual_seed((seed * 1_000_003 + rank * 10_007) % 2**63)
    return torch.randn(batch, _WIDTH, generator=g), torch.randn(batch, _WIDTH, generator=g)


def _policy_rank(rank: int, world_size: int, combos: tuple, seed: int, batch: int) -> list:
    """One rank of ``run_fsdp2_policy``: for each policy, a fresh seeded ``Linear(64, 64)``,
    ``fully_shard``, one forward/backward of the MSE loss on this rank's batch."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    factors = []
    _record_factors(factors)
    x, target = _batch(seed, rank, batch)
    out = []
    for param_dtype, reduce_dtype in combos:
        torch.manual_seed(seed)  # the same initial weights on every rank
        model = torch.nn.Linear(_WIDTH, _WIDTH)
        weights = [p.detach().clone().numpy() for p in model.parameters()]
        fully_shard(model, mp_policy=_policy(param_dtype, reduce_dtype))
        seen = len(factors)
        y = model(x)
        torch.nn.functional.mse_loss(y.float(), target).backward()
        grads = [p.grad for p in model.parameters()]
        full = [g.full_tensor() if isinstance(g, DTensor) else g for g in grads]
        out.append({"output_dtype": str(y.dtype).replace("torch.", ""),
                    "grad_dtype": str(grads[0].dtype).replace("torch.", ""),
                    "local_grad_dtype": str((grads[0].to_local() if isinstance(grads[0], DTensor) else grads[0]).dtype)
                    .replace("torch.", ""),
                    "dtensor": all(isinstance(g, DTensor) for g in grads),
                    "placements": str(grads[0].placements) if isinstance(grads[0], DTensor) else "",
                    "grad": torch.cat([g.detach().float().reshape(-1) for g in full]).numpy(),
                    "factors": factors[seen] if len(factors) > seen else None,
                    "weights": weights if rank == 0 else None,
                    "x": x.numpy(), "target": target.numpy()})
    return out


def _exact_grad(weights, xs, targets) -> np.ndarray:
    """The gradient of the MSE loss over the concatenated batch, in float64 (weight, then bias)."""
    w, b = (np.asarray(a, np.float64) for a in weights)
    x = np.concatenate(xs).astype(np.float64)
    t = np.concatenate(targets).astype(np.float64)
    d = 2.0 * (x @ w.T + b - t) / t.size
    return np.concatenate([(d.T @ x).reshape(-1), d.sum(axis=0)])


@dataclass(frozen=True, eq=False)
class Fsdp2Run:
    """One policy on real gloo ranks: per rank (index = rank) the forward's ``output_dtype``, the
    gradient's ``grad_dtype`` (and its local shard's), whether it was a ``DTensor`` and its
    ``placements``; ``grads`` (world_size, 4160) float32, each rank's full gathered gradient
    (weight, then bias); ``reference``, the exact mean gradient over all ranks' batches (float64);
    ``factors``: per rank, what FSDP2 divided by, ``(pre, post, reduce-scatter op)`` (None where
    it could not be read)."""

    param_dtype: str | None
    reduce_dtype: str | None
    world_size: int
    output_dtype: tuple
    grad_dtype: tuple
    local_grad_dtype: tuple
    dtensor: tuple
    placements: tuple
    grads: np.ndarray
    reference: np.ndarray
    factors: tuple

    @property
    def error(self) -> np.ndarray:
        """Per rank: ``||grad - reference|| / ||reference||`` (L2 over every weight and bias)."""
        d = self.grads.astype(np.float64) - self.reference
        return np.linalg.norm(d, axis=1) / np.linalg.norm(self.reference)

    @property
    def ranks_identical(self) -> bool:
        """Every rank's gathered gradient is bitwise the same."""
        bits = self.grads.view(np.uint32)
        return bool((bits == bits[:1]).all())

    def __repr__(self) -> str:
        return (f"Fsdp2Run(param={_shown_dtype(self.param_dtype)}, reduce={_shown_dtype(self.reduce_dtype)}, "
                f"{self.world_size} ranks, output {self.output_dtype[0]}, grads {self.grad_dtype[0]}, "
                f"error {measured(self.error[0], 2)})")


def _runs(combos: tuple, world_size: int, seed: int, batch: int, timeout: float) -> list:
    _warm()
    out = run_ranks(_policy_rank, world_size, combos, seed, batch, timeout=timeout)
    runs = []
    for i, (p, r) in enumerate(combos):
        per = [o[i] for o in out]
        ref = _exact_grad(per[0]["weights"], [o["x"] for o in per], [o["target"] for o in per])
        runs.append(Fsdp2Run(p, r, world_size, *(tuple(o[k] for o in per) for k in
                                                  ("output_dtype", "grad_dtype", "local_grad_dtype", "dtensor",
                                                   "placements")),
                             np.stack([o["grad"] for o in per]), ref, tuple(o["factors"] for o in per)))
    return runs


def _common(seed, batch, timeout) -> tuple:
    seed = _seed(seed)
    batch = _whole("batch", batch, 1, 4096)
    timeout = _real("timeout", timeout)
    if not 0 < timeout <= 3600:
        raise ValueError(f"timeout must be a number of seconds above 0 and at most 3600, not {_shown(timeout)}")
    return seed, batch, timeout


def run_fsdp2_policy(param_dtype=None, reduce_dtype=None, world_size=2, *, seed=0, batch=8,
                     timeout=60.0) -> Fsdp2Run:
    """One forward and backward under ``fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype,
    reduce_dtype))`` on ``world_size`` real gloo ranks (2 to 8).

    The model is ``Linear(64, 64)``, seeded with ``seed`` (the same on every rank); each rank takes
    its own seeded batch of ``batch`` rows and targets, and the MSE loss of the output (cast to
    float32). Dtypes: None (no cast), "fp32", "bf16", "fp16" or the torch dtypes. Returns an
    ``Fsdp2Run``: each rank's output dtype, gradient dtype and full gathered gradient, the exact mean
    gradient over the concatenated batch, the relative errors and the divide factors used."""
    combo = (_dtype("param_dtype", param_dtype), _dtype("reduce_dtype", reduce_dtype))
    world_size = _ranks(world_size)
    seed, batch, timeout = _common(seed, batch, timeout)
    return _runs((combo,), world_size, seed, batch, timeout)[0]


@dataclass(frozen=True, eq=False)
class PolicyErrors:
    """``runs[(param_dtype, reduce_dtype, world_size)]``: an ``Fsdp2Run`` each; ``table()`` shows their
    errors (and prints as it)."""

    combos: tuple
    world_sizes: tuple
    runs: dict

    def error(self, param_dtype, reduce_dtype, world_size) -> float:
        """The relative error of that run (every rank holds the same gradient; rank 0's)."""
        key = (_dtype("param_dtype", param_dtype), _dtype("reduce_dtype", reduce_dtype), world_size)
        if key not in self.runs:
            raise ValueError(f"no run for param_dtype={key[0]}, reduce_dtype={key[1]}, world_size={_shown(world_size)}")
        return float(self.runs[key].error[0])

    def table(self, digits=2) -> Table:
        """Each error at ``digits`` significant digits (``measured``), "< 1e-6" below 1e-6 (the last
        bits of an fp32 sum, which differ between CPUs); the output and gradient dtypes."""
        digits = _whole("digits", digits, 1, 4)
        rows = []
        for p, r in self.combos:
            first = self.runs[(p, r, self.world_sizes[0])]
            cells = [_shown_dtype(p), _shown_dtype(r), first.output_dtype[0], first.grad_dtype[0]]
            for ws in self.world_sizes:
                e = float(self.runs[(p, r, ws)].error[0])
                cells.append("< 1e-6" if e < 1e-6 else f"{float(measured(e, digits)):.{digits - 1}e}")
            rows.append(cells)
        return Table(("param_dtype", "reduce_dtype", "output", "grads",
                      *(f"error, {ws} ranks" for ws in self.world_sizes)), rows,
                     title="FSDP2 gradient vs the exact fp32 mean (relative L2)")

    def __str__(self) -> str:
        return str(self.table())

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return self.table()._repr_html_()


def policy_errors(world_sizes=(2, 4), combos=COMBOS, *, seed=0, batch=8, timeout=60.0) -> PolicyErrors:
    """``run_fsdp2_policy`` for every (param_dtype, reduce_dtype) in ``combos`` at every world size
    (one start of the ranks per world size). Returns a ``PolicyErrors``; its ``table()`` is the
    lesson's table."""
    if isinstance(world_sizes, (int, np.integer)) and not isinstance(world_sizes, bool):
        world_sizes = (world_sizes,)
    try:
        sizes, combos = list(world_sizes), list(combos)
    except TypeError:
        raise TypeError("world_sizes and combos must be lists, such as (2, 4) and (('bf16', 'fp32'),)") from None
    sizes = tuple(_ranks(w) for w in sizes[:17])
    for c in combos[:17]:
        if isinstance(c, (str, bytes)) or not hasattr(c, "__len__") or len(c) != 2:
            raise TypeError(f"each of combos must be a (param_dtype, reduce_dtype) pair, such as ('bf16', 'fp32'), "
                            f"not {_shown(c)}")
    pairs = tuple((_dtype("param_dtype", p), _dtype("reduce_dtype", r)) for p, r in combos[:17])
    if not sizes or not pairs:
        raise ValueError("give at least one world size and one (param_dtype, reduce_dtype) pair")
    if len(set(sizes)) != len(sizes) or len(set(pairs)) != len(pairs):
        raise ValueError("world_sizes and combos must not repeat an entry")
    if len(pairs) > 16:
        raise ValueError(f"give at most 16 (param_dtype, reduce_dtype) pairs, not {len(pairs)}")
    seed, batch, timeout = _common(seed, batch, timeout)
    runs = {}
    for ws in sizes:
        for run in _runs(pairs, ws, seed, batch, timeout):
            runs[(run.param_dtype, run.reduce_dtype, ws)] = run
    return PolicyErrors(pairs, sizes, runs)


class _Probe(torch.nn.Module):
    """Weights (n,) at zero whose gradient is exactly the input ``g`` (as the policy cast it)."""

    def __init__(self, n: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(n))

    def forward(self, g):
        return (self.weight * g).float().sum()


def _reduce_rank(rank: int, world_size: int, rows: np.ndarray, reduce_dtype: str) -> dict:
    from torch.distributed.fsdp import fully_shard

    factors = []
    _record_factors(factors)
    model = _Probe(rows.shape[1])
    fully_shard(model, mp_policy=_policy(None, reduce_dtype))
    model(torch.from_numpy(rows[rank])).backward()
    grad = model.weight.grad
    return {"grad": grad.full_tensor().numpy(), "shard": grad.to_local().numpy(),
            "factors": factors[0] if factors else None}


@dataclass(frozen=True, eq=False)
class Fsdp2Reduce:
    """``grads`` (world_size, n): each rank's own gradient (float32); ``reduced`` (world_size, n): the
    full averaged gradient each rank holds after FSDP2's reduce-scatter (gathered, float32);
    ``factors``: per rank, ``(pre, post, op)`` as FSDP2 chose them (None where unreadable);
    ``expected``: ``divide_factors(world_size, reduce_dtype)``."""

    reduce_dtype: str
    grads: np.ndarray
    reduced: np.ndarray
    factors: tuple
    expected: tuple

    def __repr__(self) -> str:
        pre, post, op = self.factors[0] or (None, None, "?")
        return (f"Fsdp2Reduce({self.reduce_dtype} reduce, {len(self.grads)} ranks: divide by "
                f"{number(pre or 1)} before the {op}, by {number(post or 1)} after)")


def run_fsdp2_reduce(grads, reduce_dtype="fp16", *, timeout=60.0) -> Fsdp2Reduce:
    """FSDP2's gradient average on given gradients: row ``r`` of ``grads`` (2 to 8 rows, at most 4096
    values, float32) is rank ``r``'s own gradient of a probe layer (params fp32, so the gradient is
    the row exactly), reduced with ``MixedPrecisionPolicy(reduce_dtype=reduce_dtype)``. With an fp16
    reduce, 40000 on every rank stays 40000 on 2 ranks (divided by 2 first) but overflows on 4 (each
    divided by 2 only, and 4 x 20000 > 65504)."""
    rows = _real_array("grads", grads, "a (world_size, n) array of gradients", np.float32)
    if rows.ndim != 2 or not 2 <= rows.shape[0] <= MAX_FSDP2_RANKS or not 1 <= rows.shape[1] <= 4096:
        raise ValueError(f"grads must be a (world_size, n) array with 2 to {MAX_FSDP2_RANKS} rows and 1 to 4096 "
                         f"columns, not shape {rows.shape}")
    reduce_dtype = _dtype("reduce_dtype", reduce_dtype) or "fp32"
    timeout = _common(0, 1, timeout)[2]
    _warm()
    out = run_ranks(_reduce_rank, rows.shape[0], np.ascontiguousarray(rows), reduce_dtype, timeout=timeout)
    return Fsdp2Reduce(reduce_dtype, rows, np.stack([o["grad"] for o in out]), tuple(o["factors"] for o in out),
                       divide_factors(rows.shape[0], reduce_dtype))


SCALERS = ("sharded", "plain")
_PATTERN = (1.0, -0.5, 0.25, -0.125)
_CLEAN = 2.0**-7


def _scaler_rank(rank: int, world_size: int, scaler_kind: str, inf_rank, shard: int, param_dtype,
                 reduce_dtype, init_scale: float) -> dict:
    """One rank of ``run_fsdp2_scaler``: one scaled backward, ``unscale_``, ``step``, ``update``."""
    from torch.distributed.fsdp import fully_shard

    width = len(_PATTERN)
    model = _Probe(width * world_size)
    fully_shard(model, mp_policy=_policy(param_dtype, reduce_dtype))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = _counted_steps(opt)
    if scaler_kind == "sharded":
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        scaler = ShardedGradScaler("cpu", init_scale=init_scale)
    else:
        scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    g = torch.zeros(width * world_size)
    g[width * rank: width * (rank + 1)] = _CLEAN * torch.tensor(_PATTERN)  # this rank's clean gradient
    if inf_rank is not None and rank == inf_rank:
        g[width * shard] = math.inf  # lands in rank ``shard``'s shard after the reduce-scatter
    before = model.weight.to_local().detach().clone()
    scaler.scale(model(g)).backward()
    shard_finite = bool(torch.isfinite(model.weight.grad.to_local()).all())
    with warnings.catch_warnings():  # ShardedGradScaler's found_inf of shape (1,) on a DTensor
        warnings.filterwarnings("ignore", message="Found a non-scalar tensor", category=UserWarning)
        scaler.unscale_(opt)
        state = getattr(scaler, "_per_optimizer_states", {}).get(id(opt), {})
        flags = state.get("found_inf_per_device", {}) if isinstance(state, dict) else {}
        found = float(sum(float(v.sum()) for v in flags.values())) if flags else math.nan
        scaler.step(opt)
        scaler.update()
    return {"shard_finite": shard_finite, "found_inf": found, "stepped": bool(calls),
            "scale": float(scaler.get_scale()),
            "changed": bool((model.weight.to_local().detach() != before).any())}


@dataclass(frozen=True, eq=False)
class Fsdp2ScalerRun:
    """Per rank (index = rank): ``shard_finite`` (its gradient shard after the reduce-scatter),
    ``found_inf`` (the sum of its scaler's found_inf flags after ``unscale_``; NaN if unreadable),
    ``stepped`` (``optimizer.step`` ran), ``scale`` (after ``update``), ``changed`` (its weight shard
    moved)."""

    scaler: str
    init_scale: float
    shard_finite: np.ndarray
    found_inf: np.ndarray
    stepped: np.ndarray
    scale: np.ndarray
    changed: np.ndarray

    @property
    def skipped(self) -> np.ndarray:
        return ~self.stepped

    def table(self) -> Table:
        rows = [(r, "yes" if self.shard_finite[r] else "no (inf)", number(self.found_inf[r]),
                 "skipped" if self.skipped[r] else "stepped", number(self.scale[r]))
                for r in range(len(self.stepped))]
        name = "ShardedGradScaler" if self.scaler == "sharded" else "GradScaler"
        return Table(("rank", "shard finite", "found_inf", "optimizer.step", "scale after"), rows,
                     title=f"FSDP2 with {name}(\"cpu\", init_scale={number(self.init_scale)})")

    def __repr__(self) -> str:
        return str(self.table())


def run_fsdp2_scaler(scaler="plain", world_size=2, *, inf_rank=1, shard=0, param_dtype="fp16",
                     reduce_dtype="fp32", init_scale=1024.0, timeout=60.0) -> Fsdp2ScalerRun:
    """One scaled step of FSDP2 (a probe layer of 4 weights per rank, rank ``r``'s shard being
    weights ``4r`` to ``4r + 3``) with ``ShardedGradScaler("cpu")`` (``scaler="sharded"``) or a plain
    ``torch.amp.GradScaler("cpu")`` (``"plain"``). Rank ``inf_rank``'s gradient holds an inf in
    rank ``shard``'s region, so after the reduce-scatter only rank ``shard``'s shard holds it
    (``inf_rank=None``: no inf, a clean step). In
    torch 2.13 both scalers skip on every rank: ``ShardedGradScaler`` all-reduces its found_inf
    (SUM), and a plain ``GradScaler``'s unscale of ``DTensor`` gradients MAX-reduces it over the
    mesh."""
    if scaler not in SCALERS:
        raise ValueError(f"scaler must be 'sharded' (ShardedGradScaler) or 'plain' (GradScaler), not {_shown(scaler)}")
    world_size = _ranks(world_size)
    inf_rank = None if inf_rank is None else _whole("inf_rank", inf_rank, 0, world_size - 1)
    shard = _whole("shard", shard, 0, world_size - 1)
    param_dtype, reduce_dtype = _dtype("param_dtype", param_dtype), _dtype("reduce_dtype", reduce_dtype)
    init_scale = _real("init_scale", init_scale)
    if not 1 <= init_scale <= 2.0**16:
        raise ValueError(f"init_scale must be from 1 to 2^16 here, not {_shown(init_scale)}")
    timeout = _common(0, 1, timeout)[2]
    _warm()
    out = run_ranks(_scaler_rank, world_size, scaler, inf_rank, shard, param_dtype, reduce_dtype, init_scale,
                    timeout=timeout)
    col = lambda k, t: np.array([o[k] for o in out], t)  # noqa: E731
    return Fsdp2ScalerRun(scaler, init_scale, col("shard_finite", bool), col("found_inf", float),
                          col("stepped", bool), col("scale", float), col("changed", bool))
