"""The real ``torch.amp.GradScaler``, call by call: a tiny problem, a driver, and reports.

``ampviz/__init__.py`` never imports this module, so ``import ampviz`` stays free of torch.

Everything here runs the real ``torch.amp.GradScaler("cpu", ...)`` (torch 2.13) and reports what it
did, so a lesson can show it and a test can hold it to it; if a new torch changed any of it, the
tests (and the lesson's checked outputs) would show the change.

* ``build_tiny``: one weight vector ``w`` and plain SGD, with loss ½‖w‖², so the gradient *is* ``w``
  and every number in a report can be checked by eye. ``Tiny.steps_taken`` counts the optimizer
  steps that really ran (an optimizer step post-hook; a step GradScaler skips never calls it).
* ``walk_iteration``: one iteration (``scale`` → ``backward`` → ``unscale_`` → ``step`` →
  ``update``) with the scaler's internal state after each call.
* ``run_real_scaler``: the real scaler over a stream of overflow flags, returning arrays that
  line up with ``ampviz.scaling.simulate(TorchGradScaler(...), found_inf=...)``; ``step_table``
  prints either of them step by step.
* ``unscale_overflow_table``: the inf check runs *before* the division by the scale.
* ``error_cases``: every state-machine error, raised by torch and caught, with its exact message.
* ``clipping_table``: gradient clipping after ``unscale_`` (right) and before it (wrong).
* ``skip_detection_table``: why ``if scaler.step(opt):`` cannot detect a skipped step, and what can.
* ``constructor_warnings``, ``scheduler_report``: the deprecation warning of ``torch.cuda.amp``,
  the scaler that disables itself without CUDA, and the ``lr_scheduler.step()`` order warning
  after a skipped first step, each captured (nothing reaches stderr).
* ``check_*``: the lesson's exercise checkers (``ampviz.checks.check``).

Reading the scaler's state uses its private attributes (``_scale``, ``_growth_tracker``,
``_per_optimizer_states``): that state is the subject of the lesson.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from ampviz.checks import Check, check
from ampviz.text import Table, measured, number
from ampviz.scaling import ScalerTrace, TorchGradScaler, simulate
from ampviz._args import _shown
from ampviz._args import _flag, _real, _real_array, _whole

__all__ = [
    "Tiny",
    "build_tiny",
    "Snapshot",
    "Walk",
    "walk_iteration",
    "RealRun",
    "run_real_scaler",
    "found_inf_from",
    "same_run",
    "step_table",
    "unscale_overflow_table",
    "ErrorCase",
    "error_cases",
    "clipping_norms",
    "clipping_table",
    "skip_detection_table",
    "Caught",
    "ConstructorReport",
    "constructor_warnings",
    "SchedulerReport",
    "scheduler_report",
    "check_backoffs_to_zero",
    "check_skip_test",
    "check_clip_before_unscale",
    "check_scale_after_pattern",
    "amp_step_reference",
    "check_amp_loop",
]

INF = math.inf
DEFAULTS = {"init_scale": 2.0**16, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000}

#: The longest stream ``run_real_scaler`` drives (about 0.2 ms a step: a few seconds); ``simulate``
#: runs millions of steps of the same rule.
MAX_REAL_STEPS = 20_000
#: The most rows ``step_table`` builds.
MAX_TABLE_ROWS = 100_000
#: The longest ``scheduler_report``.
MAX_ITERATIONS = 10_000
_FLT_MAX = float(torch.finfo(torch.float32).max)
#: The floating-point dtypes a ``Tiny`` can be trained in on the CPU.
_TINY_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class StepOutOfRangeError(ValueError, IndexError):
    """A step index outside the run (a ValueError, and an IndexError as indexing raises)."""


# --------------------------------------------------------------------------------------------
# Checking arguments
# --------------------------------------------------------------------------------------------


def _values(name: str, values, dtype) -> torch.Tensor:
    """A number, a list, an array or a tensor of real numbers as a fresh CPU tensor of ``dtype``
    (the same values ``torch.tensor(values, dtype=dtype)`` gives: both round each value once)."""
    if isinstance(values, torch.Tensor) and not (values.is_complex() or values.dtype == torch.bool
                                                 or values.device.type == "meta"):
        return values.detach().to("cpu", dtype, copy=True)
    return torch.from_numpy(_real_array(name, values, "real numbers (e.g. (3.0, -4.0))")).to(dtype)


def _scale_value(name: str, value) -> float:
    """A loss scale torch can store: any float32 value (inf and NaN too), not a finite value beyond it."""
    x = _real(name, value)
    if math.isfinite(x) and abs(x) > _FLT_MAX:
        raise ValueError(f"{name} must be within float32's range (|{name}| <= 3.4e38, or inf), not {_shown(value)}")
    return x


_SETTINGS = ("init_scale", "growth_factor", "backoff_factor", "growth_interval")


def _scaler_settings(kwargs: dict) -> dict:
    """GradScaler's settings, checked as torch checks them (growth_factor > 1, backoff_factor < 1)
    and for what torch would fail on later (a non-number, a value it cannot store)."""
    for key in kwargs:
        if key not in _SETTINGS:
            raise TypeError(f"unknown GradScaler setting {_shown(key)}: use init_scale, growth_factor, "
                            "backoff_factor or growth_interval")
    out = dict(kwargs)
    if "init_scale" in kwargs:
        out["init_scale"] = _scale_value("init_scale", kwargs["init_scale"])
    if "growth_factor" in kwargs:
        out["growth_factor"] = _real("growth_factor", kwargs["growth_factor"])
        if out["growth_factor"] <= 1.0:
            raise ValueError(f"growth_factor must be > 1.0 (torch's GradScaler refuses others), "
                             f"not {_shown(kwargs['growth_factor'])}")
    if "backoff_factor" in kwargs:
        out["backoff_factor"] = _real("backoff_factor", kwargs["backoff_factor"])
        if out["backoff_factor"] >= 1.0:
            raise ValueError(f"backoff_factor must be < 1.0 (torch's GradScaler refuses others), "
                             f"not {_shown(kwargs['backoff_factor'])}")
    if "growth_interval" in kwargs:
        out["growth_interval"] = _whole("growth_interval", kwargs["growth_interval"], -(2**63), 2**63 - 1)
    return out


# --------------------------------------------------------------------------------------------
# The tiny problem
# --------------------------------------------------------------------------------------------


@dataclass(eq=False)
class Tiny:
    """A weight vector ``weight`` trained by ``optimizer`` (SGD) on the loss ½‖w‖².

    The gradient of that loss is ``w`` itself. ``steps_taken`` counts the calls of
    ``optimizer.step()`` that really ran.
    """

    weight: torch.nn.Parameter
    optimizer: torch.optim.SGD
    steps_taken: int = 0

    def loss(self, half: bool = False) -> torch.Tensor:
        """½‖w‖², a 0-dim tensor; with ``half=True`` computed in float16 (a half-precision loss)."""
        w = self.weight.half() if half else self.weight
        return 0.5 * (w * w).sum()


def build_tiny(weights=(3.0, -4.0), lr: float = 0.1, dtype=torch.float32) -> Tiny:
    """A fresh ``Tiny``: the weights (float32 unless ``dtype`` says otherwise) and SGD with ``lr``."""
    if dtype not in _TINY_DTYPES:
        raise TypeError(f"dtype must be torch.float16, torch.bfloat16, torch.float32 or torch.float64, "
                        f"not {_shown(dtype)}")
    lr_value, top = _real("lr", lr), torch.finfo(dtype).max
    if not 0 <= lr_value <= top:  # SGD's step multiplies by lr in the weights' dtype
        raise ValueError(f"lr must be a number from 0 to {top:.4g} (the largest {str(dtype).replace('torch.', '')}), "
                         f"not {_shown(lr)}")
    weight = torch.nn.Parameter(_values("weights", weights, dtype))
    tiny = Tiny(weight, torch.optim.SGD([weight], lr=lr_value))

    def count(optimizer, args, kwargs):
        tiny.steps_taken += 1

    tiny.optimizer.register_step_post_hook(count)
    return tiny


def _scaler(**kwargs) -> torch.amp.GradScaler:
    """``torch.amp.GradScaler("cpu")`` with the settings given, each checked."""
    return _torch_scaler(**_scaler_settings(kwargs))


def _torch_scaler(**kwargs) -> torch.amp.GradScaler:
    """``torch.amp.GradScaler("cpu")`` exactly as torch builds it (and refuses it)."""
    return torch.amp.GradScaler("cpu", **{**DEFAULTS, **kwargs})


# --------------------------------------------------------------------------------------------
# Reading the scaler's state
# --------------------------------------------------------------------------------------------


def _entry(scaler, optimizer):
    """The scaler's per-optimizer record, or None. ``.get`` on the defaultdict creates nothing."""
    return scaler._per_optimizer_states.get(id(optimizer))


def _stage(scaler, optimizer) -> str:
    entry = _entry(scaler, optimizer)
    return entry["stage"].name if entry else "READY"


def _found_inf(scaler, optimizer) -> dict:
    entry = _entry(scaler, optimizer)
    return {dev.type: float(v) for dev, v in entry["found_inf_per_device"].items()} if entry else {}


def _plain(x: float) -> str:
    """A float32 value as plain text: whole numbers in full (262144), others with 7 significant
    digits (float32 holds about 7), specials as inf / -inf / nan."""
    x = float(x)
    if math.isfinite(x) and x == int(x) and abs(x) < 1e15:
        return str(int(x))
    return number(x, digits=7)


def _vec_np(a) -> str:
    return "None" if a is None else "[" + ", ".join(_plain(x) for x in a.tolist()) + "]"


def _vec(t) -> str:
    if t is None:
        return "None"
    return _vec_np(t.detach().reshape(-1).double().numpy())


def _tensor_or_none(t):
    return None if t is None else t.detach().reshape(-1).double().numpy().copy()


# --------------------------------------------------------------------------------------------
# One iteration, call by call
# --------------------------------------------------------------------------------------------


class Snapshot(NamedTuple):
    """The scaler and the weights right after one call of an iteration.

    ``scale``/``tracker``: the values of ``_scale``/``_growth_tracker`` (None before they exist),
    with their dtypes; ``stage``: the optimizer's stage in the scaler (READY when it has no record);
    ``found_inf``: device type -> flag, as recorded by ``unscale_``; ``grad``/``weight``: float64
    copies; ``note``: what happened.
    """

    key: str
    call: str
    scale: float | None
    scale_dtype: str
    tracker: int | None
    tracker_dtype: str
    stage: str
    found_inf: dict
    grad: np.ndarray | None
    weight: np.ndarray
    note: str


@dataclass(frozen=True, eq=False)
class Walk:
    """The snapshots of one iteration; ``walk["backward"]`` is the one after that call."""

    snapshots: tuple

    def __getitem__(self, key: str) -> Snapshot:
        for s in self.snapshots:
            if s.key == key:
                return s
        raise KeyError(f"{_shown(key)}: one of {', '.join(_shown(s.key) for s in self.snapshots)}")

    @property
    def table(self) -> Table:
        rows = []
        for s in self.snapshots:
            found = ", ".join(f"{dev}: {number(v)}" for dev, v in s.found_inf.items()) or "-"
            rows.append((s.call, "None" if s.scale is None else number(s.scale),
                         "None" if s.tracker is None else s.tracker, s.stage, found,
                         _vec_np(s.grad), _vec_np(s.weight), s.note))
        return Table(("call", "_scale", "_growth_tracker", "stage", "found_inf", "w.grad", "w",
                      "what happened"), rows)

    def __str__(self) -> str:
        return str(self.table)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return self.table._repr_html_()


def walk_iteration(*, overflow: bool = False, weights=(3.0, -4.0), lr: float = 0.1, **scaler_kwargs) -> Walk:
    """One iteration of the real ``torch.amp.GradScaler("cpu", **scaler_kwargs)`` on a fresh
    ``Tiny``, with a snapshot after each call.

    ``overflow=True`` puts an inf into the first gradient after the backward pass, as an fp16
    backward that overflowed would. ``scaler_kwargs``: ``init_scale``, ``growth_factor``,
    ``backoff_factor``, ``growth_interval`` (torch's defaults unless given).
    """
    overflow = _flag("overflow", overflow)
    scaler = _scaler(**scaler_kwargs)
    tiny = build_tiny(weights, lr)
    if overflow and tiny.weight.numel() == 0:
        raise ValueError("weights must hold at least one number with overflow=True (its gradient becomes inf)")
    opt = tiny.optimizer
    snaps = []

    def snap(key, call, note):
        s, t = scaler._scale, scaler._growth_tracker
        snaps.append(Snapshot(
            key=key, call=call, scale=None if s is None else s.item(),
            scale_dtype="-" if s is None else str(s.dtype), tracker=None if t is None else int(t.item()),
            tracker_dtype="-" if t is None else str(t.dtype), stage=_stage(scaler, opt),
            found_inf=_found_inf(scaler, opt), grad=_tensor_or_none(tiny.weight.grad),
            weight=_tensor_or_none(tiny.weight), note=note))

    snap("GradScaler", 'scaler = GradScaler("cpu")',
         f"nothing allocated yet; get_scale() returns init_scale as given: {scaler.get_scale()!r}")
    loss = tiny.loss()
    scaled = scaler.scale(loss)
    snap("scale", "scaled = scaler.scale(loss)",
         f"_scale created ({str(scaler._scale.dtype).replace('torch.', '')}), tracker "
         f"({str(scaler._growth_tracker.dtype).replace('torch.', '')}); "
         f"scaled = {number(loss.item())} × {number(scaler._scale.item())} = {number(scaled.item())}")
    scaled.backward()
    if overflow:
        with torch.no_grad():
            tiny.weight.grad.view(-1)[0] = INF
    snap("backward", "scaled.backward()",
         "w.grad = S·g (g = w)" + ("; an inf appeared (overflow)" if overflow else ""))
    scaler.unscale_(opt)
    found = any(_found_inf(scaler, opt).values())
    snap("unscale_", "scaler.unscale_(opt)",
         f"checked for inf/NaN (found {'one' if found else 'none'}), then w.grad × 1/S")
    before = tiny.steps_taken
    returned = scaler.step(opt)
    ran = tiny.steps_taken > before
    snap("step", "scaler.step(opt)",
         f"optimizer.step() {'ran' if ran else 'skipped'}; returned {returned!r}")
    old_scale, old_tracker = scaler.get_scale(), scaler._get_growth_tracker()
    scaler.update()
    new_scale, new_tracker = scaler.get_scale(), scaler._get_growth_tracker()
    if found:
        what = f"inf found: S × backoff_factor, {number(old_scale)} → {number(new_scale)}; tracker → 0"
    elif new_tracker == 0 and old_tracker + 1 == scaler.get_growth_interval():
        what = (f"tracker reached growth_interval: S × growth_factor, {number(old_scale)} → "
                f"{number(new_scale)}; tracker → 0")
    else:
        what = f"clean step counted: tracker {old_tracker} → {new_tracker}"
    snap("update", "scaler.update()", what + "; per-optimizer record cleared")
    return Walk(tuple(snaps))


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
# The inf check comes before the division
# --------------------------------------------------------------------------------------------


def unscale_overflow_table(scale: float = 2.0**-10, grad=(1e36, 1.0), weights=(3.0, -4.0),
                           lr: float = 0.1) -> Table:
    """A finite scaled gradient that overflows only when ``unscale_`` divides it by a scale below 1.

    ``unscale_`` checks the *scaled* gradients for inf/NaN and then multiplies them by 1/S; with
    S < 1 that product can overflow after the check, and the step runs on an inf gradient.
    """
    scale = _scale_value("scale", scale)
    tiny = build_tiny(weights, lr)
    grad = _values("grad", grad, torch.float32)
    if grad.shape != tiny.weight.shape:
        raise ValueError(f"grad must have the shape of weights, {tuple(tiny.weight.shape)}, not {tuple(grad.shape)}")
    scaler = _scaler(init_scale=scale)
    scaler.scale(tiny.loss())
    tiny.weight.grad = grad
    rows = [("scale S", number(scaler.get_scale())),
            ("w.grad after backward (what unscale_ checks)", _vec(tiny.weight.grad))]
    scaler.unscale_(tiny.optimizer)
    rows += [("found_inf recorded by unscale_", number(_found_inf(scaler, tiny.optimizer)["cpu"])),
             ("w.grad after unscale_ (× 1/S)", _vec(tiny.weight.grad))]
    before = tiny.steps_taken
    scaler.step(tiny.optimizer)
    rows += [("optimizer.step()", "ran" if tiny.steps_taken > before else "skipped"),
             ("w after the step", _vec(tiny.weight))]
    scaler.update()
    return Table(("", "value"), rows)


# --------------------------------------------------------------------------------------------
# The state machine's errors
# --------------------------------------------------------------------------------------------


class ErrorCase(NamedTuple):
    """What was done, and the exception torch raised (type name and exact message)."""

    case: str
    error: str
    message: str

    def __str__(self) -> str:
        return f"{self.case}\n    {self.error}: {self.message}"


def _backward_scaled(tiny, scaler):
    scaler.scale(tiny.loss()).backward()


def _case_step_before_scale():
    tiny, scaler = build_tiny(), _torch_scaler()
    tiny.loss().backward()  # loss.backward() where scaler.scale(loss).backward() belongs
    scaler.step(tiny.optimizer)


def _case_unscale_before_scale():
    tiny, scaler = build_tiny(), _torch_scaler()
    tiny.loss().backward()
    scaler.unscale_(tiny.optimizer)


def _case_update_before_scale():
    _torch_scaler().update()


def _case_unscale_twice():
    tiny, scaler = build_tiny(), _torch_scaler()
    _backward_scaled(tiny, scaler)
    scaler.unscale_(tiny.optimizer)
    scaler.unscale_(tiny.optimizer)


def _case_unscale_after_step():
    tiny, scaler = build_tiny(), _torch_scaler()
    _backward_scaled(tiny, scaler)
    scaler.step(tiny.optimizer)
    scaler.unscale_(tiny.optimizer)


def _case_step_twice():
    tiny, scaler = build_tiny(), _torch_scaler()
    _backward_scaled(tiny, scaler)
    scaler.step(tiny.optimizer)
    scaler.step(tiny.optimizer)


def _case_update_without_step():
    tiny, scaler = build_tiny(), _torch_scaler()
    _backward_scaled(tiny, scaler)
    scaler.update()


def _case_update_after_unscale_only():
    tiny, scaler = build_tiny(), _torch_scaler()
    _backward_scaled(tiny, scaler)
    scaler.unscale_(tiny.optimizer)
    before = tiny.weight.detach().clone()
    tracker = int(scaler._get_growth_tracker())
    scaler.update()
    moved = "moved" if not torch.equal(before, tiny.weight) else "did not move"
    return (f"unscale_'s inf check is enough for update(): the weights {moved} (no step), and update() "
            f"counted a clean step (growth tracker {tracker} -> {int(scaler._get_growth_tracker())})")


def _case_step_without_grads():
    tiny, scaler = build_tiny(), _torch_scaler()
    scaler.scale(tiny.loss())  # no backward: every .grad is None
    scaler.step(tiny.optimizer)


def _case_fp16_grads():
    tiny, scaler = build_tiny(dtype=torch.float16), _torch_scaler()
    _backward_scaled(tiny, scaler)
    scaler.unscale_(tiny.optimizer)


def _case_closure():
    tiny, scaler = build_tiny(), _torch_scaler()
    _backward_scaled(tiny, scaler)
    scaler.step(tiny.optimizer, closure=tiny.loss)


def _case_scale_float():
    _torch_scaler().scale(1.0)


def _case_growth_factor():
    _torch_scaler(growth_factor=1.0)


def _case_backoff_factor():
    _torch_scaler(backoff_factor=1.0)


_CASES = (
    ("scaler.step(opt) after loss.backward(), with no scaler.scale() before it", _case_step_before_scale),
    ("scaler.unscale_(opt) with no scaler.scale() before it", _case_unscale_before_scale),
    ("scaler.update() with no scaler.scale() before it", _case_update_before_scale),
    ("scaler.unscale_(opt) twice in one iteration", _case_unscale_twice),
    ("scaler.unscale_(opt) after scaler.step(opt)", _case_unscale_after_step),
    ("scaler.step(opt) twice in one iteration", _case_step_twice),
    ("scaler.update() with neither scaler.unscale_(opt) nor scaler.step(opt) before it", _case_update_without_step),
    ("scaler.update() after scaler.unscale_(opt) alone, no step", _case_update_after_unscale_only),
    ("scaler.step(opt) when every .grad is None (no backward)", _case_step_without_grads),
    ("scaler.unscale_(opt) on fp16 weights and gradients", _case_fp16_grads),
    ("scaler.step(opt, closure=...)", _case_closure),
    ("scaler.scale(1.0), a Python float", _case_scale_float),
    ('GradScaler("cpu", growth_factor=1.0)', _case_growth_factor),
    ('GradScaler("cpu", backoff_factor=1.0)', _case_backoff_factor),
)


def error_cases() -> list[ErrorCase]:
    """Each misuse of the scaler's state machine, really done, with what torch raised.

    A case that does not raise is reported as ``ErrorCase(case, "no error", what happened)``
    (one case is there to show a sequence that works: ``update()`` after ``unscale_`` alone).
    """
    out = []
    for case, run in _CASES:
        try:
            with warnings.catch_warnings(record=True):
                warnings.simplefilter("always")
                result = run()
        except Exception as e:  # noqa: BLE001 - recording any exception is the point
            out.append(ErrorCase(case, type(e).__name__, str(e)))
        else:
            out.append(ErrorCase(case, "no error", result or ""))
    return out


# --------------------------------------------------------------------------------------------
# Gradient clipping
# --------------------------------------------------------------------------------------------


def clipping_norms(unscale_first: bool = True, max_norm: float = 1.0, weights=(3.0, -4.0),
                   lr: float = 0.1, init_scale: float = 2.0**16) -> dict:
    """Gradient norms through one iteration with ``clip_grad_norm_(max_norm)``, clipping after
    ``scaler.unscale_`` (``unscale_first=True``, right) or before it (wrong: ``step`` unscales the
    already clipped gradients afterwards).

    Keys: ``backward`` (‖w.grad‖ after the scaled backward), ``clipped`` (the norm
    ``clip_grad_norm_`` saw), ``applied`` (‖w.grad‖ the optimizer used), ``weight`` (after the step).
    """
    unscale_first = _flag("unscale_first", unscale_first)
    max_norm = _real("max_norm", max_norm)
    scaler = _scaler(init_scale=init_scale)
    tiny = build_tiny(weights, lr)
    _backward_scaled(tiny, scaler)
    norm = lambda: float(tiny.weight.grad.norm())  # noqa: E731
    out = {"backward": norm()}
    if unscale_first:
        scaler.unscale_(tiny.optimizer)
    out["clipped"] = float(torch.nn.utils.clip_grad_norm_([tiny.weight], max_norm))
    scaler.step(tiny.optimizer)  # unscales here if unscale_ was not called
    out["applied"] = norm()
    out["weight"] = tiny.weight.detach().double().numpy().copy()
    scaler.update()
    return out


def clipping_table(max_norm: float = 1.0, **kwargs) -> Table:
    """``clipping_norms`` in both orders, one row each, at the digits every CPU reproduces (the
    optimizer's last bits depend on the CPU): the norms before clipping at 6 significant digits,
    the applied norm and the weights at 4, an applied norm within them of a power of two as that power."""
    max_norm = _real("max_norm", max_norm)
    rows = []
    for first, order in ((True, "unscale_ → clip → step (right)"), (False, "clip → step (wrong)")):
        r = clipping_norms(first, max_norm, **kwargs)
        rows.append((order, measured(r["backward"], 6), measured(r["clipped"], 6), measured(r["applied"], pow2=True),
                     "[" + ", ".join(measured(w) for w in r["weight"]) + "]"))
    return Table(("order", "‖grad‖ after backward", "‖grad‖ clip_grad_norm_ saw",
                  "‖grad‖ the optimizer applied", "w after step"), rows,
                 title=f"clip_grad_norm_(max_norm={number(max_norm)}) at scale "
                       f"{number(kwargs.get('init_scale', DEFAULTS['init_scale']))}")


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


# --------------------------------------------------------------------------------------------
# Warnings
# --------------------------------------------------------------------------------------------


class Caught(NamedTuple):
    """A captured warning: category name and message."""

    category: str
    message: str

    def __str__(self) -> str:
        return f"{self.category}: {self.message}"


def _capture(fn):
    """(fn's result, the warnings it issued as ``Caught``s); nothing reaches stderr."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, tuple(Caught(w.category.__name__, str(w.message)) for w in caught)


class ConstructorReport(NamedTuple):
    """A way of constructing a GradScaler, the warnings it gave, and what the scaler then does."""

    call: str
    warnings: tuple
    enabled: bool
    scale_is_identity: bool
    get_scale: float

    def __str__(self) -> str:
        head = (f"{self.call}: is_enabled() = {self.enabled}, scale(loss) is loss: "
                f"{self.scale_is_identity}, get_scale() = {number(self.get_scale)}")
        return "\n".join([head] + [f"    {w}" for w in self.warnings] + ([] if self.warnings else ["    (no warning)"]))


_CONSTRUCTORS = (
    ("torch.cuda.amp.GradScaler()", lambda: torch.cuda.amp.GradScaler()),
    ("torch.cpu.amp.GradScaler()", lambda: torch.cpu.amp.GradScaler()),
    ("torch.amp.GradScaler()", lambda: torch.amp.GradScaler()),
    ('torch.amp.GradScaler("cpu")', lambda: torch.amp.GradScaler("cpu")),
)


def constructor_warnings() -> list[ConstructorReport]:
    """Four ways to construct a scaler, with their captured warnings.

    The deprecated ``torch.cuda.amp.GradScaler`` / ``torch.cpu.amp.GradScaler`` warn and then
    build ``torch.amp.GradScaler("cuda")`` / ``("cpu")``. The default device of
    ``torch.amp.GradScaler()`` is ``"cuda"``: without CUDA it warns and disables itself, and a
    disabled scaler returns the loss unscaled and reports a scale of 1.0.
    """
    out = []
    for call, make in _CONSTRUCTORS:
        scaler, caught = _capture(make)
        loss = torch.ones(())
        out.append(ConstructorReport(call, caught, scaler.is_enabled(), scaler.scale(loss) is loss,
                                     float(scaler.get_scale())))
    return out


@dataclass(frozen=True, eq=False)
class SchedulerReport:
    """A few iterations with a half-precision loss, a GradScaler and ``StepLR``.

    ``table``: per iteration, the scale, whether ``optimizer.step()`` ran, the learning rate the
    step would use, and whether ``scheduler.step()`` was called; ``warnings``: what was captured.
    """

    table: Table
    warnings: tuple

    def __str__(self) -> str:
        caught = [f"{w}" for w in self.warnings] or ["(no warning)"]
        return str(self.table) + "\n\nwarnings:\n" + "\n".join(caught)

    __repr__ = __str__


def scheduler_report(*, guard: bool = False, iterations: int = 5, gamma: float = 0.5) -> SchedulerReport:
    """Train ``Tiny`` for a few iterations with a float16 loss, the default scale (2^16) and
    ``StepLR(step_size=1, gamma)``, calling ``scheduler.step()`` after every ``update()``; with
    ``guard=True`` only after an iteration whose scale did not shrink (the optimizer stepped).

    At 2^16 the half-precision loss's backward overflows (the upstream gradient fp16(65536) is
    inf), so the first optimizer steps are skipped: the first ``scheduler.step()`` then comes
    before any ``optimizer.step()``, and torch warns.
    """
    guard = _flag("guard", guard)
    iterations = _whole("iterations", iterations, 0, MAX_ITERATIONS)
    gamma = _real("gamma", gamma)
    # SGD's step multiplies by the learning rate in float32: the last one, 0.1 × gamma^(iterations - 1), must fit
    if not 0 <= gamma < INF or (gamma > 1 and (iterations - 1) * math.log(gamma) > math.log(_FLT_MAX / 0.1)):
        raise ValueError(f"gamma must be a number >= 0 that keeps the learning rate 0.1 × gamma^(iterations - 1) "
                         f"within float32's range, not {_shown(gamma)}")

    def train():
        tiny = build_tiny()
        scaler = _scaler()
        sched = torch.optim.lr_scheduler.StepLR(tiny.optimizer, step_size=1, gamma=gamma)
        rows = []
        for i in range(iterations):
            tiny.optimizer.zero_grad()
            lr = tiny.optimizer.param_groups[0]["lr"]
            scaler.scale(tiny.loss(half=True)).backward()
            before_scale, before_steps = scaler.get_scale(), tiny.steps_taken
            scaler.step(tiny.optimizer)
            scaler.update()
            ran = tiny.steps_taken > before_steps
            call = not guard or scaler.get_scale() >= before_scale
            if call:
                sched.step()
            rows.append((i, number(before_scale), "ran" if ran else "skipped", number(lr),
                         "called" if call else "not called"))
        return Table(("iteration", "scale", "optimizer.step()", "lr of this step", "scheduler.step()"), rows)

    table, caught = _capture(train)
    return SchedulerReport(table, caught)


# --------------------------------------------------------------------------------------------
# Exercise checkers
# --------------------------------------------------------------------------------------------


_UNREADABLE = object()


def _as_answer(answer):
    """The answer as ``check`` reads it: a one-element tensor is its value; an answer that float()
    cannot read without an error or a warning (an int beyond float's range, a complex or meta
    tensor) is unreadable, hence wrong. Text, None and other objects pass as they are."""
    if isinstance(answer, torch.Tensor):
        if answer.numel() != 1 or answer.is_complex() or answer.device.type == "meta":
            return _UNREADABLE
        return answer.detach().reshape(()).item()
    if answer is None or isinstance(answer, str):
        return answer
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            float(answer)
    except (TypeError, ValueError):
        return answer  # check() finds it wrong
    except Exception:  # noqa: BLE001 - OverflowError, a warning, an odd __float__: never the checker's error
        return _UNREADABLE
    return answer


def _check(answer, expected, **kwargs) -> Check:
    answer = _as_answer(answer)
    if answer is _UNREADABLE:
        return check(answer, expected, accept=lambda a: False, hint=kwargs.get("hint", ""))
    return check(answer, expected, **kwargs)


def check_backoffs_to_zero(answer) -> Check:
    """Q: how many overflowing steps in a row take torch's default scale 2^16 to exactly 0."""
    trace = simulate(TorchGradScaler(), found_inf=np.ones(400, bool))
    after = np.append(trace.scale[1:], trace.final.scale)
    return _check(answer, int(np.flatnonzero(after == 0)[0]) + 1,
                 hint="16 halvings reach 1, 126 more the smallest normal float32, "
                      "and float32 has subnormals below that")


def check_skip_test(answer) -> Check:
    """Q: which test detects a skipped step: (a) ``if not scaler.step(opt):`` or (b)
    ``scaler.get_scale() < scale_before`` after ``update()``."""
    return check(answer, "b", accept=lambda a: isinstance(a, str) and a.strip().strip("()").casefold() == "b",
                 hint="what does scaler.step(opt) return for a step SGD did take?")


def check_clip_before_unscale(answer, max_norm: float = 1.0, init_scale: float = 2.0**16) -> Check:
    """Q: clipping to ``max_norm`` *before* ``unscale_`` at scale ``init_scale``: the gradient norm
    the optimizer applies (within 1%), measured by a real GradScaler iteration."""
    expected = clipping_norms(unscale_first=False, max_norm=max_norm, init_scale=init_scale)["applied"]
    return _check(answer, expected, tol=0.01 * abs(expected),
                 hint="clip_grad_norm_ brings the scaled norm to max_norm; then step() divides by the scale")


def check_scale_after_pattern(answer, pattern: str = "..x....", growth_interval: int = 3) -> Check:
    """Q: torch's scaler from 2^16 with ``growth_interval``, over the steps of ``pattern`` (``x``
    overflows, ``.`` is clean): the scale after the last ``update()`` (as ``simulate`` and the real
    GradScaler give it)."""
    trace = simulate(TorchGradScaler(growth_interval=growth_interval), found_inf=found_inf_from(pattern))
    return _check(answer, trace.final.scale,
                 hint="walk the steps: an overflow halves S and sets the tracker to 0; a clean step adds 1, "
                      "and the scale doubles when the tracker reaches growth_interval (then it is 0 again)")


# --------------------------------------------------------------------------------------------
# The learner's own training step
# --------------------------------------------------------------------------------------------

def amp_step_reference(model, optimizer, scaler, x, y):
    """One correct fp16 AMP training step on the CPU (the model answer of notebook 04's exercise):
    zero the gradients, forward and loss under autocast, backward from the scaled loss, step
    through the scaler, update the scale once."""
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = torch.nn.functional.mse_loss(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss


class _SpyScaler(torch.amp.GradScaler):
    """A real GradScaler that counts the calls made to it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = {"scale": 0, "unscale_": 0, "step": 0, "update": 0}

    def scale(self, outputs):
        self.calls["scale"] += 1
        return super().scale(outputs)

    def unscale_(self, optimizer):
        self.calls["unscale_"] += 1
        return super().unscale_(optimizer)

    def step(self, optimizer, *args, **kwargs):
        self.calls["step"] += 1
        return super().step(optimizer, *args, **kwargs)

    def update(self, new_scale=None):
        self.calls["update"] += 1
        return super().update(new_scale)


#: The loop check: 6 iterations; the batch of iteration 2 is so large that its fp16 forward pass
#: overflows (outputs past 65504), so a correct step skips it and halves the scale; growth every
#: 2 clean steps, so the scale also grows within the run.
LOOP_ITERATIONS, LOOP_OVERFLOW_AT = 6, 2


def _loop_run(train_step):
    """(weights after each iteration, scale after each iteration, the spy, autocast seen) for
    ``train_step`` on a fresh seeded model; exceptions propagate."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        gen = torch.Generator().manual_seed(1)
        batches = [(torch.randn(8, 4, generator=gen), torch.randn(8, 2, generator=gen))
                   for _ in range(LOOP_ITERATIONS)]
    x, y = batches[LOOP_OVERFLOW_AT]
    batches[LOOP_OVERFLOW_AT] = (x * 1e6, y)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = _SpyScaler("cpu", init_scale=2.0**16, growth_interval=2)
    seen = {"autocast": False, "forwards": 0}

    def hook(module, args, output):
        seen["forwards"] += 1
        seen["autocast"] |= torch.is_autocast_enabled("cpu") and output.dtype == torch.float16

    handle = model.register_forward_hook(hook)
    weights, scales, updates = [], [], []
    try:
        for x, y in batches:
            before = scaler.calls["update"]
            train_step(model, optimizer, scaler, x, y)
            updates.append(scaler.calls["update"] - before)
            weights.append(torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()]))
            scales.append(scaler.get_scale())
    finally:
        handle.remove()
    return weights, scales, scaler, seen, updates


def check_amp_loop(answer) -> Check:
    """Q: write ``train_step(model, optimizer, scaler, x, y)``, one fp16 AMP training step with
    ``torch.amp.GradScaler`` (the loss: ``mse_loss(model(x), y)``). The checker trains a small model
    with it for 6 iterations, one of which overflows in fp16, beside ``amp_step_reference``, and
    compares the weights and the scale after every iteration, bit for bit; a wrong step gets one
    line that names what is missing."""
    if answer is None or answer is Ellipsis:
        return check(None, None)
    if not callable(answer):
        return Check("wrong", "✗ not quite: set answer = train_step, the function itself (no call, no quotes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            weights, scales, scaler, seen, updates = _loop_run(answer)
    except Exception as exc:  # noqa: BLE001 - whatever the learner's step raises is the verdict
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        return Check("wrong", f"✗ not quite: train_step raised {type(exc).__name__}: {first}")
    ref_weights, ref_scales, *_ = _loop_run(amp_step_reference)
    calls = scaler.calls
    if seen["forwards"] == 0:
        return Check("wrong", "✗ not quite: train_step never ran the model: compute the loss from model(x)")
    if not seen["autocast"]:
        return Check("wrong", '✗ not quite: the forward pass did not run under torch.autocast("cpu", '
                              "dtype=torch.float16), so nothing ran in fp16")
    if calls["scale"] == 0:
        return Check("wrong", "✗ not quite: the loss was never scaled: backward from scaler.scale(loss), "
                              "not from loss")
    if calls["step"] == 0:
        return Check("wrong", "✗ not quite: step through the scaler, scaler.step(optimizer): it unscales the "
                              "gradients and skips a step whose gradients overflowed")
    if any(n != 1 for n in updates):
        return Check("wrong", "✗ not quite: call scaler.update() exactly once per iteration, after "
                              "scaler.step(optimizer)")
    for i, (w, r) in enumerate(zip(weights, ref_weights)):
        if not torch.equal(w, r) or scales[i] != ref_scales[i]:
            if i == LOOP_OVERFLOW_AT:
                hint = ("the iteration whose fp16 forward pass overflowed changed the weights: let "
                        "scaler.step(optimizer) decide whether to step, it skips such a step")
            else:
                hint = "are the gradients zeroed (optimizer.zero_grad()) in every iteration?"
            return Check("wrong", f"✗ not quite: after iteration {i} the weights or the scale differ from a "
                                  f"correct step: {hint}")
    return Check("right", "✓ correct")
