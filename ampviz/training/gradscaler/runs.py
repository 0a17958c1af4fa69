"""The real GradScaler over a stream of steps, step by step, beside the simulator.

* ``run_real_scaler``: the real scaler over a stream of overflow flags (``found_inf_from("..x..")``
  makes one from a pattern), returning a ``RealRun`` whose arrays line up with
  ``ampviz.scaling.simulate(TorchGradScaler(...), found_inf=...)``; ``same_run`` compares the two.
* ``step_table``: either of them step by step (scale, skipped, what ``update()`` did).
* ``skip_detection_table``: why ``if scaler.step(opt):`` cannot detect a skipped step, and what can.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ampviz.text import Table, number
from ampviz.scaling import ScalerTrace
from ampviz._args import _shown
from ampviz._args import _whole
from ampviz.training.gradscaler.tiny import INF, _scaler, build_tiny

#: The longest stream ``run_real_scaler`` drives (about 0.2 ms a step: a few seconds); ``simulate``
#: runs millions of steps of the same rule.
MAX_REAL_STEPS = 20_000
#: The most rows ``step_table`` builds.
MAX_TABLE_ROWS = 100_000


class StepOutOfRangeError(ValueError, IndexError):
    """A step index outside the run (a ValueError, and an IndexError as indexing raises)."""


# --------------------------------------------------------------------------------------------
# The real scaler over a stream of steps
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class RealRun:
    """What the real ``torch.amp.GradScaler("cpu")`` did over a stream, one entry per step.

    Arrays line up with ``ampviz.scaling.ScalerTrace``: ``scale`` (float32) is the scale in
    effect at each step, before that step's ``update()``; ``skipped``: ``optimizer.step()`` did
    not run (counted, not inferred); ``growth_tracker`` (int32): the tracker after each
    ``update()``. Also ``found_inf`` (the stream), ``returned`` (what ``scaler.step`` returned at
    each step) and ``final_scale`` (after the last ``update()``).
    """

    found_inf: np.ndarray
    scale: np.ndarray
    skipped: np.ndarray
    growth_tracker: np.ndarray
    returned: tuple
    final_scale: float

    @property
    def steps(self) -> int:
        return int(self.scale.size)

    @property
    def skipped_count(self) -> int:
        return int(self.skipped.sum())

    @property
    def scale_after(self) -> np.ndarray:
        """The scale after each step's ``update()`` (float32)."""
        return np.append(self.scale[1:], np.float32(self.final_scale)).astype(np.float32)

    def __repr__(self) -> str:
        end = number(self.final_scale)
        return f"RealRun({self.steps} steps, {self.skipped_count} skipped, final scale {end})"


def _flags(found_inf) -> np.ndarray:
    if isinstance(found_inf, torch.Tensor):
        if found_inf.device.type == "meta" or found_inf.is_complex():
            raise TypeError(f"found_inf must be booleans (one per step), not {_shown(found_inf)}")
        found_inf = found_inf.detach().cpu()
        found_inf = found_inf.numpy() if found_inf.dtype in (torch.bool, torch.uint8, torch.int8, torch.int16,
                                                             torch.int32, torch.int64) else found_inf.double().numpy()
    try:
        flags = np.asarray(found_inf)
    except (ValueError, TypeError, OverflowError):  # ragged lists, objects numpy cannot hold
        raise ValueError(f"found_inf must be a 1-D sequence of booleans, one per step, "
                         f"not {_shown(found_inf)}") from None
    if flags.ndim != 1:
        raise ValueError(f"found_inf must be a 1-D sequence, one flag per step (got shape {flags.shape})")
    if flags.size and flags.dtype.kind not in "biu":
        raise TypeError(f"found_inf must be booleans (one per step), got {flags.dtype}")
    if flags.size > MAX_REAL_STEPS:
        raise ValueError(f"found_inf must have at most {MAX_REAL_STEPS:,} steps for the real GradScaler "
                         f"(about 0.2 ms a step), not {flags.size:,}; simulate(TorchGradScaler(...)) runs millions")
    return flags.astype(bool)


def run_real_scaler(found_inf, **scaler_kwargs) -> RealRun:
    """Drive the real ``torch.amp.GradScaler("cpu", **scaler_kwargs)`` over a stream of steps.

    Each step does what a training loop does around its backward pass: ``scaler.scale(loss)``
    (the first call creates the scale), then the weight's ``.grad`` is set to ``[inf, 1]`` where
    ``found_inf`` is true (an overflow) and to ``[1, 1]`` elsewhere, then ``scaler.step(opt)`` and
    ``scaler.update()``. The learning rate is 0: only the scaler matters here. Compare with
    ``simulate(TorchGradScaler(**scaler_kwargs), found_inf=found_inf)``. At most
    ``MAX_REAL_STEPS`` steps (about 0.2 ms each); ``simulate`` runs millions.
    """
    flags = _flags(found_inf)
    n = flags.size
    scaler = _scaler(**scaler_kwargs)
    tiny = build_tiny((1.0, 1.0), lr=0.0)
    bad, good = torch.tensor([INF, 1.0]), torch.tensor([1.0, 1.0])
    scale = np.empty(n, np.float32)
    skipped = np.zeros(n, bool)
    tracker = np.empty(n, np.int32)
    returned = []
    for i, f in enumerate(flags.tolist()):
        scaler.scale(tiny.loss())
        scale[i] = scaler.get_scale()
        tiny.weight.grad = (bad if f else good).clone()
        before = tiny.steps_taken
        returned.append(scaler.step(tiny.optimizer))
        scaler.update()
        skipped[i] = tiny.steps_taken == before
        tracker[i] = scaler._get_growth_tracker()
    final = float(np.float32(scaler.get_scale()))  # before any scale(): init_scale as torch will store it
    return RealRun(flags, scale, skipped, tracker, tuple(returned), final)


def found_inf_from(pattern: str) -> np.ndarray:
    """Overflow flags from a pattern: ``x`` is a step whose gradients overflow, ``.`` a clean
    step (spaces are ignored): ``"..x.."`` is five steps with an overflow in the middle."""
    if not isinstance(pattern, str):
        raise TypeError(f"pattern must be a string of x (overflow) and . (clean step), e.g. '..x..', "
                        f"not {_shown(pattern)}")
    chars = [c for c in pattern if not c.isspace()]
    bad = sorted({c for c in chars if c not in "x."})
    if bad:
        raise ValueError(f"use x (overflow) and . (clean step) only, not {_shown(''.join(bad))}")
    if len(chars) > MAX_REAL_STEPS:
        raise ValueError(f"pattern must have at most {MAX_REAL_STEPS:,} steps, not {len(chars):,}")
    return np.array([c == "x" for c in chars], dtype=bool)


def same_run(a, b) -> bool:
    """True when two runs (``RealRun`` or ``ScalerTrace``) have identical scale (NaN equal to NaN,
    values compared as float64), skipped steps and growth tracker, step for step."""
    _run_arg("a", a), _run_arg("b", b)
    sa, sb = np.asarray(a.scale, np.float64), np.asarray(b.scale, np.float64)
    if sa.shape != sb.shape:
        return False
    same_scale = bool(np.all((sa == sb) | (np.isnan(sa) & np.isnan(sb))))
    return (same_scale and np.array_equal(a.skipped, b.skipped)
            and np.array_equal(np.asarray(a.growth_tracker, np.int64), np.asarray(b.growth_tracker, np.int64)))


def _run_arg(name: str, run):
    if not isinstance(run, (RealRun, ScalerTrace)):
        raise TypeError(f"{name} must be a RealRun (run_real_scaler) or a ScalerTrace (simulate), "
                        f"not {_shown(run)}")
    return run


def _step_indices(steps, n: int) -> list:
    if steps is None:
        return list(range(min(n, 20)))
    if isinstance(steps, (str, bytes)) or not hasattr(steps, "__iter__"):
        raise TypeError(f"steps must be step indices, e.g. range(10) or [0, 5], not {_shown(steps)}")
    idx = []
    for i in steps:
        i = _whole("a step index", i, None)
        if not 0 <= i < n:
            raise StepOutOfRangeError(f"step {i} is outside the run (0 to {n - 1})" if n else
                                      f"step {i} is outside the run: it has no steps")
        if len(idx) == MAX_TABLE_ROWS:
            raise ValueError(f"steps must list at most {MAX_TABLE_ROWS:,} steps")
        idx.append(i)
    return idx


def _final_scale(run) -> float:
    final = getattr(run, "final_scale", None)
    return float(run.final.scale) if final is None else float(final)


def step_table(run, steps=None) -> Table:
    """A ``RealRun`` or a ``ScalerTrace`` (of torch's rule) step by step: scale, whether the step
    ran, what ``update()`` did, and the state after it. ``steps``: the step indices to show (the
    first 20 by default)."""
    n = int(np.asarray(_run_arg("run", run).scale).size)
    idx = _step_indices(steps, n)
    scale = np.asarray(run.scale, np.float64)
    after = np.append(scale[1:], _final_scale(run))
    found = np.asarray(getattr(run, "found_inf", run.skipped), bool)
    rows = []
    for i in idx:
        s, a, t = scale[i], after[i], int(run.growth_tracker[i])
        if run.skipped[i]:
            what = "back off"
        elif t == 0 and (a != s):
            what = "grow"
        elif t == 0:
            what = "grow (scale unchanged)"
        else:
            what = "count"
        rows.append((i, "inf" if found[i] else "-", number(s), "skipped" if run.skipped[i] else "ran",
                     what, number(a), t))
    return Table(("step", "found_inf", "scale", "optimizer.step()", "update()", "scale after",
                  "tracker after"), rows)


# --------------------------------------------------------------------------------------------
# Detecting a skipped step
# --------------------------------------------------------------------------------------------


def skip_detection_table(found_inf=(True, False), **scaler_kwargs) -> Table:
    """For each step of a real run: what ``scaler.step(opt)`` returned, what the idiom
    ``if scaler.step(opt):`` would conclude from it, whether ``optimizer.step()`` really ran, and
    what comparing ``get_scale()`` before and after ``update()`` says.

    The comparison is right whenever a backoff lowers the scale (a backoff factor in (0, 1) and
    a scale above 0); at a scale of 0 nothing can shrink any more.
    """
    run = run_real_scaler(found_inf, **scaler_kwargs)
    rows = []
    for i in range(run.steps):
        ret = run.returned[i]
        before, after = float(run.scale[i]), float(run.scale_after[i])
        rows.append((i, "inf" if run.found_inf[i] else "-", repr(ret),
                     "taken" if ret else "skipped", "skipped" if run.skipped[i] else "ran",
                     f"{number(before)} → {number(after)}", "skipped" if after < before else "taken"))
    return Table(("step", "found_inf", "scaler.step(opt) returned", "`if scaler.step(opt):` says",
                  "optimizer.step() really", "get_scale() across update()", "`get_scale() < before` says"),
                 rows)
