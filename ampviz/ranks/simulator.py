"""The multi-rank loss-scaler simulator: ``simulate_ranks`` runs a loss scaler per rank over per-rank
overflow flags or largest |gradient|s, as each ``mode`` lets the ranks see overflows (``"ddp"``,
``"synced"``, ``"local"``, ``"unscale_first"``), and returns a ``RanksTrace`` (per-rank scale,
overflow, skip and step at every step). ``_step_loop`` is the step-by-step reference the fast paths
are tested against; ``same_trace`` compares two traces. ``_rank_flags`` reads per-rank overflow
patterns such as ``["..x.", "...."]`` (the real runs take them too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ampviz._args import _flag, _shown
from ampviz.formats import FP16, get_format
from ampviz.ranks.launcher import MAX_WORLD_SIZE
from ampviz.scaling import DynamicScaler, overflows, simulate
from ampviz.text import Table, number
from ampviz.training.gradscaler import _step_indices

#: How the ranks' scalers see overflows (see ``simulate_ranks``).
MODES = ("ddp", "synced", "local", "unscale_first")
#: The most steps ``simulate_ranks`` takes (times ranks); a table's rows are chosen as GradScaler's step tables
#: choose them (``ampviz.training.gradscaler._step_indices``).
MAX_SIM_CELLS = 50_000_000


@dataclass(frozen=True, eq=False)
class RanksTrace:
    """Per-rank loss scalers over a run: arrays of shape (world_size, steps), row ``r`` for rank ``r``.

    ``scale``: the scale each rank's step used (before its update; float32 values, NaN after a run
    the policy ended); ``overflow``: the rank's own gradients were not finite (before any all-reduce;
    with FSDP, its shard after the reduce-scatter; a rank whose weights went non-finite overflows at
    every later step); ``found_inf``: the rank's
    scaler skipped the step (it saw an inf, or its run had ended); ``stepped``: the rank's optimizer
    step ran (``~found_inf``); ``nonfinite_step``: it ran on gradients that were not finite (the
    all-reduce brought another rank's inf after this rank's own check: its weights are now
    inf/NaN); ``final_scale``: each rank's scale after the last step. ``mode`` and ``policy`` say how
    it was made (``simulate_ranks``) or measured (``run_scaler_ranks``).
    """

    mode: str
    policy: DynamicScaler
    scale: np.ndarray
    overflow: np.ndarray
    found_inf: np.ndarray
    stepped: np.ndarray
    nonfinite_step: np.ndarray
    final_scale: np.ndarray

    @property
    def world_size(self) -> int:
        return int(self.scale.shape[0])

    @property
    def steps(self) -> int:
        return int(self.scale.shape[1])

    @property
    def skipped_count(self) -> np.ndarray:
        """Skipped steps per rank."""
        return self.found_inf.sum(axis=1)

    @property
    def scales_agree(self) -> np.ndarray:
        """Per step: every rank used the same scale (NaN equal to NaN)."""
        s = self.scale
        same = (s == s[:1]) | (np.isnan(s) & np.isnan(s[:1]))
        return same.all(axis=0)

    @property
    def first_divergence(self) -> int | None:
        """The first step at which the ranks' scales differ, or None."""
        bad = np.flatnonzero(~self.scales_agree)
        return int(bad[0]) if bad.size else None

    @property
    def poisoned_at(self) -> tuple:
        """Per rank: the first step it took on non-finite gradients, or None."""
        return tuple(int(np.argmax(row)) if row.any() else None for row in self.nonfinite_step)

    def table(self, steps=None) -> Table:
        """Step by step, each rank's scale and what its optimizer did (``stepped``, ``skipped``,
        ``stepped on inf/NaN``). ``steps``: step indices to show (the first 20 by default)."""
        idx = _step_indices(steps, self.steps)
        rows = []
        for t in idx:
            cells = [t]
            for r in range(self.world_size):
                did = ("stepped on inf/NaN" if self.nonfinite_step[r, t] else
                       "stepped" if self.stepped[r, t] else
                       "skipped (the run had ended)" if np.isnan(self.scale[r, t]) else "skipped")
                cells.append(f"{number(self.scale[r, t])} {did}" + (" (own overflow)" if self.overflow[r, t]
                                                                      and not self.nonfinite_step[r, t] else ""))
            rows.append(cells)
        return Table(("step", *(f"rank {r}: scale, optimizer" for r in range(self.world_size))), rows,
                     title=f"{self.mode}: {self.world_size} ranks")

    def __repr__(self) -> str:
        div = self.first_divergence
        final = ", ".join(number(s) for s in self.final_scale)
        return (f"RanksTrace({self.mode}: {self.world_size} ranks, {self.steps} steps, skipped per rank "
                f"{self.skipped_count.tolist()}, final scales [{final}]"
                + (f", scales differ from step {div}" if div is not None else "")
                + (f", poisoned at {list(self.poisoned_at)}" if self.nonfinite_step.any() else "") + ")")


def _pattern_rows(values):
    """Rows given as patterns (``"..x.."``: x an overflow) become booleans."""
    if isinstance(values, (list, tuple)) and values and all(isinstance(v, str) for v in values):
        rows = []
        for v in values:
            chars = [c for c in v if not c.isspace()]
            bad = sorted({c for c in chars if c not in "x."})
            if bad:
                raise ValueError(f"a found_inf pattern uses x (overflow) and . (clean step) only, "
                                 f"not {_shown(''.join(bad))}")
            rows.append([c == "x" for c in chars])
        if len({len(r) for r in rows}) > 1:
            raise ValueError("found_inf patterns must all have the same number of steps")
        return np.array(rows, dtype=bool).reshape(len(rows), -1)
    return values


def _rank_flags(found_inf) -> np.ndarray:
    what = "booleans, one row per rank and one column per step (or patterns such as ['..x.', '....'])"
    found_inf = _pattern_rows(found_inf)
    if isinstance(found_inf, torch.Tensor):
        if found_inf.is_complex() or found_inf.device.type == "meta":
            raise TypeError(f"found_inf must be {what}, not {_shown(found_inf)}")
        found_inf = found_inf.detach().cpu().double().numpy() if found_inf.is_floating_point() else \
            found_inf.detach().cpu().numpy()
    if isinstance(found_inf, (str, bytes, bytearray)):
        raise TypeError(f"found_inf must be {what}, not a string")
    try:
        arr = np.asarray(found_inf)
    except (ValueError, TypeError, OverflowError):
        raise ValueError(f"found_inf must be {what}, not {_shown(found_inf)}") from None
    if arr.ndim != 2:
        raise ValueError(f"found_inf must be 2-D, one row per rank and one column per step (got shape {arr.shape})")
    if arr.dtype.kind == "b":
        return arr.astype(bool)
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"found_inf must be {what}, not {arr.dtype} values")
    bad = ~((arr == 0) | (arr == 1))
    if bad.any():
        r, t = (int(v) for v in np.argwhere(bad)[0])
        raise ValueError(f"found_inf must be True/False (or 1/0) everywhere; rank {r}, step {t} is "
                         f"{arr[r, t].item()!r}")
    return arr == 1


def _rank_gradients(grad_max) -> np.ndarray:
    what = "numbers, one row per rank and one column per step (each rank's largest |gradient|)"
    if isinstance(grad_max, torch.Tensor):
        if grad_max.is_complex() or grad_max.dtype == torch.bool or grad_max.device.type == "meta":
            raise TypeError(f"grad_max must be {what}, not a {str(grad_max.dtype).replace('torch.', '')} tensor")
        grad_max = grad_max.detach().cpu().double().numpy()
    if isinstance(grad_max, (str, bytes, bytearray)):
        raise TypeError(f"grad_max must be {what}, not a string")
    try:
        arr = np.asarray(grad_max)
    except (ValueError, TypeError, OverflowError):
        raise ValueError(f"grad_max must be {what}, not {_shown(grad_max)}") from None
    if arr.dtype.kind == "b":
        raise TypeError("grad_max must be numbers (each rank's largest |gradient| per step), not booleans; "
                        "give overflow flags as found_inf=")
    if arr.dtype.kind == "O":
        try:
            arr = arr.astype(np.float64)
        except (TypeError, ValueError, OverflowError):
            raise TypeError(f"grad_max must be {what}, not {_shown(grad_max)}") from None
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"grad_max must be {what}, not {arr.dtype} values")
    if arr.ndim != 2:
        raise ValueError(f"grad_max must be 2-D, one row per rank and one column per step (got shape {arr.shape})")
    with np.errstate(over="ignore"):
        return np.abs(arr.astype(np.float64))


def _stream(found_inf, grad_max):
    if (found_inf is None) == (grad_max is None):
        raise ValueError("give exactly one of found_inf (per rank and step: did its gradients overflow?) "
                         "or grad_max (per rank and step: its largest |gradient|)")
    arr = _rank_flags(found_inf) if found_inf is not None else _rank_gradients(grad_max)
    if arr.shape[0] < 1:
        raise ValueError("give at least one rank (one row)")
    if arr.shape[0] > MAX_WORLD_SIZE:
        raise ValueError(f"give at most {MAX_WORLD_SIZE} ranks (rows), not {arr.shape[0]}")
    if arr.size > MAX_SIM_CELLS:
        raise ValueError(f"ranks x steps must be at most {MAX_SIM_CELLS:,}, not {arr.size:,}")
    return arr, found_inf is not None


def _mode(mode) -> str:
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, MODES))}, not {_shown(mode)}")
    return mode


def simulate_ranks(policy: DynamicScaler, *, found_inf=None, grad_max=None, mode="ddp", fmt=FP16,
                   loss_dtype="float32") -> RanksTrace:
    """Every rank's loss scaler over a run, as ``mode`` lets them see overflows.

    Give per rank and step either ``found_inf`` (booleans, shape (world_size, steps), or patterns
    such as ``["..x..", "....."]``: whether that rank's own backward overflowed) or ``grad_max``
    (its largest unscaled |gradient|; it overflows as ``ampviz.scaling.overflows(scale, g, fmt,
    loss_dtype)`` says at that rank's own scale). Each rank runs ``policy`` (e.g.
    ``TorchGradScaler(init_scale=1024)``). ``mode``:

    * ``"ddp"``: the gradients are all-reduced before ``unscale_`` (DDP's backward): any rank's inf
      is in every rank's gradients, so every scaler skips and backs off together.
    * ``"synced"``: the found_inf flag itself is all-reduced (``ShardedGradScaler``, or an
      ``all_reduce(found_inf, MAX)`` after ``unscale_``): the same decisions as ``"ddp"``.
    * ``"local"``: a scaler per rank on its own gradients, which are never all-reduced (local SGD;
      also FSDP1 with a plain GradScaler, if each row says whether that rank's *shard* has an inf):
      each rank skips on its own overflows only, so the scales drift apart.
    * ``"unscale_first"``: ``unscale_`` (and clipping) on local gradients, then a manual all-reduce,
      then ``step``: a rank whose own gradients were clean does not skip, yet steps on the
      all-reduced inf (``nonfinite_step``); its weights are then inf/NaN, so its gradients overflow
      at every later step.
    """
    if not isinstance(policy, DynamicScaler):
        raise TypeError(f"policy must be a DynamicScaler (e.g. TorchGradScaler()), got {_shown(policy)}")
    mode = _mode(mode)
    arr, flags_given = _stream(found_inf, grad_max)
    fmt = get_format(fmt)
    overflows(1.0, 1.0, fmt, loss_dtype)  # checks fmt (one with inf) and loss_dtype
    if mode == "unscale_first":
        return _unscale_first(policy, arr, flags_given, fmt, loss_dtype)
    return _fast(policy, mode, arr, flags_given, fmt, loss_dtype)


def _trace(policy, mode, traces, overflow, nonfinite=None) -> RanksTrace:
    scale = np.stack([t.scale.astype(np.float64) for t in traces])
    skipped = np.stack([t.skipped for t in traces])
    final = np.array([t.final.scale if not t.final.stopped else math.nan for t in traces], np.float64)
    if nonfinite is None:
        nonfinite = np.zeros_like(skipped)
    return RanksTrace(mode, policy, scale, overflow, skipped, ~skipped, nonfinite, final)


def _fast(policy, mode, arr, flags_given, fmt, loss_dtype) -> RanksTrace:
    """``"ddp"``, ``"synced"`` and ``"local"`` with ``ampviz.scaling.simulate`` (one stream per
    rank, or one shared stream: by monotone rounding the largest |gradient| decides)."""
    world_size = arr.shape[0]
    if mode == "local":
        traces = [simulate(policy, found_inf=row) if flags_given else
                  simulate(policy, grad_max=row, fmt=fmt, loss_dtype=loss_dtype) for row in arr]
        if flags_given:
            over = arr.copy()
        else:
            with np.errstate(invalid="ignore", over="ignore"):
                over = np.stack([overflows(t.scale.astype(np.float64), row, fmt, loss_dtype)
                                 for t, row in zip(traces, arr)])
        return _trace(policy, mode, traces, over)
    if flags_given:
        shared = simulate(policy, found_inf=arr.any(axis=0))
        over = arr.copy()
    else:
        with np.errstate(invalid="ignore"):
            worst = np.where(np.isnan(arr).any(axis=0), np.nan, arr.max(axis=0, initial=0.0))
        shared = simulate(policy, grad_max=worst, fmt=fmt, loss_dtype=loss_dtype)
        with np.errstate(invalid="ignore", over="ignore"):
            over = overflows(shared.scale.astype(np.float64)[None, :], arr, fmt, loss_dtype)
    return _trace(policy, mode, [shared] * world_size, over)


def _unscale_first(policy, arr, flags_given, fmt, loss_dtype) -> RanksTrace:
    """``"unscale_first"`` from ``"local"`` (the step loop's trace, bit for bit): no rank is
    poisoned before the first step where some rank overflows and another steps, on the all-reduced
    inf; from there on a poisoned rank overflows at every step, so each rank is "local" up to its
    first step taken from then on (on inf/NaN), and overflows at every step after it."""
    local = _fast(policy, "local", arr, flags_given, fmt, loss_dtype)
    steps = arr.shape[1]
    stepped = ~local.found_inf
    hit = np.flatnonzero(local.overflow.any(axis=0) & stepped.any(axis=0))
    scale, over, skipped, final = local.scale, local.overflow, local.found_inf, local.final_scale
    nonfinite, tails = np.zeros_like(skipped), {}  # ranks poisoned at one step in one state share a tail
    for r in range(arr.shape[0]) if hit.size else ():
        later = np.flatnonzero(stepped[r, hit[0]:])
        if not later.size:
            continue
        t = int(hit[0] + later[0])  # its step on inf/NaN
        nonfinite[r, t] = True
        head = {"found_inf": arr[r, :t + 1]} if flags_given else {"grad_max": arr[r, :t + 1], "fmt": fmt,
                                                                     "loss_dtype": loss_dtype}
        state = simulate(policy, **head).final
        if (t, state) not in tails:
            tails[t, state] = simulate(policy, found_inf=np.ones(steps - t - 1, bool), state=state)
        tail = tails[t, state]
        scale[r, t + 1:], skipped[r, t + 1:], over[r, t + 1:] = tail.scale, tail.skipped, True
        final[r] = tail.final.scale if not tail.final.stopped else math.nan
    return RanksTrace("unscale_first", policy, scale, over, skipped, ~skipped, nonfinite, final)


def _step_loop(policy, mode, arr, flags_given, fmt, loss_dtype) -> RanksTrace:
    """Step by step, every rank's state machine, for any mode: the reference that the tests hold
    the fast paths to."""
    world_size, steps = arr.shape
    states = [policy.initial_state() for _ in range(world_size)]
    scale = np.full((world_size, steps), np.nan)
    over = np.zeros((world_size, steps), bool)
    skipped = np.zeros((world_size, steps), bool)
    nonfinite = np.zeros((world_size, steps), bool)
    poisoned = np.zeros(world_size, bool)
    for t in range(steps):
        if poisoned.all():  # from here every rank overflows at every step: no coupling is left
            for r in range(world_size):
                tail = simulate(policy, found_inf=np.ones(steps - t, bool), state=states[r])
                scale[r, t:] = tail.scale
                skipped[r, t:] = tail.skipped
                states[r] = tail.final
            over[:, t:] = True
            break
        s = np.array([st.scale if not st.stopped else math.nan for st in states])
        if flags_given:
            own = arr[:, t].copy()
        else:
            with np.errstate(invalid="ignore", over="ignore"):
                own = np.asarray(overflows(s, arr[:, t], fmt, loss_dtype), bool)
        own |= poisoned
        shared = own.any()
        seen = np.full(world_size, shared) if mode in ("ddp", "synced") else own
        for r in range(world_size):
            st = states[r]
            scale[r, t] = s[r]
            if st.stopped:
                skipped[r, t] = True
                continue
            new = policy._adjust(st, bool(seen[r]))
            skipped[r, t] = bool(seen[r]) or new.stopped
            states[r] = new
        over[:, t] = own
        if mode == "unscale_first":
            nonfinite[:, t] = ~skipped[:, t] & shared
            poisoned |= nonfinite[:, t]
    final = np.array([st.scale if not st.stopped else math.nan for st in states], np.float64)
    return RanksTrace(mode, policy, scale, over, skipped, ~skipped, nonfinite, final)


def same_trace(a: RanksTrace, b: RanksTrace, *, overflow: bool = True) -> bool:
    """True when two traces agree step for step: scales (NaN equal to NaN), skips, steps on
    non-finite gradients, final scales, and (``overflow=True``) each rank's own overflows."""
    for name, x in (("a", a), ("b", b)):
        if not isinstance(x, RanksTrace):
            raise TypeError(f"{name} must be a RanksTrace (simulate_ranks or run_scaler_ranks), not {_shown(x)}")
    _flag("overflow", overflow)
    if a.scale.shape != b.scale.shape:
        return False

    def same(x, y):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        return bool(np.all((x == y) | (np.isnan(x) & np.isnan(y))))

    return (same(a.scale, b.scale) and same(a.final_scale, b.final_scale)
            and np.array_equal(a.found_inf, b.found_inf) and np.array_equal(a.nonfinite_step, b.nonfinite_step)
            and (not overflow or np.array_equal(a.overflow, b.overflow)))
