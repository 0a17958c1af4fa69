"""Dynamic loss scalers as small immutable state machines, and a fast simulator.

A dynamic loss scaler multiplies the loss by a scale S so that small gradients survive in fp16,
and adjusts S as it goes: after an overflow (some gradient became inf or NaN) it skips the
optimizer step and *backs off* (S *= backoff_factor); after enough clean steps in a row it *grows*
(S *= growth_factor). Frameworks differ in the details (hysteresis, floors and ceilings, whether
growth may reach inf, how the product is rounded), and the details decide whether a run survives.

``DynamicScaler`` is one configurable machine; each framework is a configuration of it
(``TorchGradScaler`` and the other presets in ``PRESETS``). Its state is immutable:
``policy.adjust(state, found_inf)`` returns the next state, as jmp's ``DynamicLossScale.adjust``
does. ``simulate(policy, found_inf=...)`` or ``simulate(policy, grad_max=...)`` runs a whole stream
and returns a ``ScalerTrace`` of numpy arrays.

``TorchGradScaler()`` reproduces ``torch.amp.GradScaler``'s ``_amp_update_scale_`` kernel exactly
(torch 2.13): the scale is a float32, each update multiplies in double precision and rounds once to
float32, a backoff resets the growth tracker to 0, growth happens only when the tracker *equals*
``growth_interval`` (and resets it to 0), growth that would give inf (or NaN) is refused, and there
is no floor: repeated backoffs reach float32's subnormals and, with a factor of 0.5, exactly 0.

Some frameworks end the run by raising: DeepSpeed ZeRO and fairseq at their minimum scale, apex amp
(and fairseq and metaseq) at a scale of 0, which they divide by, DeepSpeed ZeRO at an overflow once
its scale is inf. The state then says ``stopped``, and the trace gives the step and the exception
(``ScalerTrace.stopped_at``, ``ScalerTrace.stop_reason``).

Speed: the state only changes at overflows and growths, so ``simulate`` works per event, not per
step. Where events are far apart it searches for the next one with numpy and fills the clean
stretch before it with slices (the counters that fairseq's tolerance keeps just advance by its
length). Where they come every few steps (growth_interval=1, a scale that keeps overflowing) it
runs ``adjust`` written out as a Python loop over events, and takes at once what needs no loop:
a scale that no backoff (or no growth) moves stays until the other kind of step comes, and on a
found_inf stream whose every update is one exactly rounded multiplication (float64, or factors
that are float32 values) the scales are numpy's running product. Torch's rounding of a double
product to float32 (``_mul``) cannot be batched that way for other factors (0.995, 1.001): each
product depends on the rounding of the one before, so those runs stay a loop. The trace equals
stepping ``adjust`` once per step in every case, to the bit.

This module needs numpy only.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import numbers
import re
import struct
from array import array
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ampviz._args import _shown
from ampviz.formats import FP16, FP32, FloatFormat, get_format

__all__ = [
    "DynamicScaler",
    "ScalerState",
    "ScalerTrace",
    "TorchGradScaler",
    "StaticScaler",
    "ApexAmpScaler",
    "ApexHysteresisScaler",
    "DeepSpeedZeroScaler",
    "DeepSpeedScaler",
    "MegatronScaler",
    "KerasScaler",
    "Keras3Scaler",
    "JmpScaler",
    "FairseqScaler",
    "MetaseqScaler",
    "PRESETS",
    "LEGACY",
    "simulate",
    "overflows",
]

ARITHMETIC = ("torch", "float32", "float64")


# ------------------------------------------------------------------ arithmetic
def _f32(x: float) -> float:
    """x rounded to float32 (to nearest even; overflow gives inf), as a Python float."""
    try:
        return _UNPACK_F(_PACK_F(x))[0]
    except OverflowError:  # beyond float32's range: the cast gives inf
        return math.copysign(math.inf, x)


_PACK_F = struct.Struct("<f").pack
_UNPACK_F = struct.Struct("<f").unpack


def _mul(scale: float, factor: float, arithmetic: str) -> float:
    """scale * factor, rounded the way a framework stores its scale.

    "torch": the product of the float32 scale and the (double) factor in double precision,
    rounded once to float32 (``_amp_update_scale_``). "float32": both operands float32, the
    product rounded to float32 (a float32 tensor times a float32-rounded factor). "float64":
    Python floats.
    """
    if arithmetic == "torch":
        return _f32(scale * factor)
    if arithmetic == "float32":
        return _f32(scale * _f32(factor))
    return scale * factor


# ------------------------------------------------------------------ state and policy
class ScalerState(NamedTuple):
    """Where a scaler stands between two steps (immutable).

    ``scale`` is the scale the next step uses; ``growth_tracker`` the clean steps counted toward
    the next growth; ``hysteresis`` the overflows still tolerated before a backoff (1: the next
    overflow backs off); ``stopped`` is true once the framework's scaler has ended the run by
    raising (at its minimum scale, or at a scale of 0 or inf; see ``DynamicScaler``).
    ``overflows_since_rescale`` (overflows since the last backoff) and
    ``steps_since_rescale`` (steps since the last growth or backoff) are fairseq's tolerance
    counters, kept only by a policy with a ``tolerance`` (0 otherwise). ``window`` is the growth
    window of a policy with ``window_scaling`` (0 otherwise).
    """

    scale: float
    growth_tracker: int = 0
    hysteresis: int = 1
    stopped: bool = False
    overflows_since_rescale: int = 0
    steps_since_rescale: int = 0
    window: int = 0


@dataclass(frozen=True)
class DynamicScaler:
    """A dynamic loss scaler, configurable to behave as each framework's does.

    Parameters (names as in ``torch.amp.GradScaler`` where it has them):

    - ``init_scale``, ``growth_factor``, ``backoff_factor``, ``growth_interval``: as in torch.
      ``growth_interval <= 0`` never grows.
    - ``hysteresis``: overflows in a row that are skipped before the scale backs off (1: back off
      at every overflow). ``refill``: when the hysteresis budget is restored, ``"growth"`` (at each
      growth: DeepSpeed, Megatron) or ``"clean"`` (at every clean step: Apex/NeMo).
    - ``min_scale`` / ``max_scale``: clamps (None: none). ``raise_at_min``: an overflow that would
      back off while the scale is already at (equal to) ``min_scale`` ends the run (DeepSpeed
      ZeRO; a scale below the minimum backs off to it first).
    - ``growth_at_least``: grow when the tracker reaches ``growth_interval`` or more (Keras 2),
      instead of exactly equals (torch).
    - ``inf_guard``: refuse a growth whose result is not finite (torch, Keras 2, jmp).
    - ``tracker_after_overflow``: the growth tracker's value after an overflow (0; DeepSpeed's
      non-ZeRO optimizer counts one step later: -1). It is also the starting value.
    - ``tolerance`` (fairseq): an overflow backs off only when the overflows since the last backoff
      (this one included) divided by the steps since the last growth or backoff (this one
      included) reach ``tolerance``; otherwise the step is skipped and the scale kept. 0: every
      overflow backs off.
    - ``raise_at_scale`` (fairseq's ``min_loss_scale``): an overflow after which the scale would be
      at or below this value ends the run instead, the scale unchanged (None: never).
    - ``no_backoff_below`` (metaseq's ``min_loss_scale``): a backoff that would take the scale below
      this value keeps the old scale instead (the step is still skipped; None: never).
    - ``window_scaling`` (metaseq): the growth window is part of the state (``ScalerState.window``,
      starting at ``growth_interval``): each growth multiplies it by ``growth_factor`` and each
      backoff by ``backoff_factor`` (rounded down, at least 1). The growth tracker then counts
      clean steps since the last overflow and is not reset by a growth; a clean step grows the
      scale when the tracker is a positive multiple of the window (``growth_at_least`` is unused).
      A window below 1 never grows and never changes.
    - ``arithmetic``: how the scale is rounded, see ``_mul``.
    - ``dynamic``: False for a static scale, which never changes.
    - ``raise_at_zero``: a step taken at a scale of exactly 0 ends the run, whether it overflows or
      not (apex amp unscales the gradients by ``1./scale``, fairseq and metaseq compute
      ``1.0 / loss_scale`` before each step: ``ZeroDivisionError``).
    - ``raise_at_inf``: an overflow at a scale that is not finite ends the run, hysteresis or not
      (DeepSpeed ZeRO formats ``int(scale)`` into its overflow message: ``OverflowError`` at inf,
      ``ValueError`` at NaN). Checked before ``raise_at_min``.

    A run that ends keeps its state (``ScalerState.stopped`` is set); ``simulate`` reports the step
    (``ScalerTrace.stopped_at``) and the exception the framework raises there
    (``ScalerTrace.stop_reason``).
    """

    name: str = "custom"
    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    hysteresis: int = 1
    refill: str = "growth"
    min_scale: float | None = None
    max_scale: float | None = None
    raise_at_min: bool = False
    growth_at_least: bool = False
    inf_guard: bool = True
    tracker_after_overflow: int = 0
    tolerance: float = 0.0
    raise_at_scale: float | None = None
    no_backoff_below: float | None = None
    window_scaling: bool = False
    arithmetic: str = "torch"
    dynamic: bool = True
    raise_at_zero: bool = False
    raise_at_inf: bool = False
    source: str = field(default="", compare=False)

    def __post_init__(self):
        """Reject what torch's GradScaler rejects, and types it would fail on later (a TypeError
        naming the field); accept the rest, odd values included (a backoff of 0, a NaN factor, an
        infinite initial scale), so that their consequences can be shown. The ScalerLab checks its
        sliders more strictly. Numbers are stored as Python floats and ints."""
        for name in ("name", "source", "arithmetic", "refill"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"{name} must be a string such as {_DEFAULTS[name]!r}, "
                                f"not {_shown(getattr(self, name))}")
        for name in ("growth_interval", "hysteresis", "tracker_after_overflow"):
            value = getattr(self, name)
            if not _whole_number(value):
                raise TypeError(f"{name} must be a whole number such as {_DEFAULTS[name]!r}, not {_shown(value)}")
            object.__setattr__(self, name, int(value))
        for name in ("init_scale", "growth_factor", "backoff_factor", "tolerance",
                     "min_scale", "max_scale", "raise_at_scale", "no_backoff_below"):
            value = getattr(self, name)
            if value is None and _DEFAULTS[name] is None:
                continue
            if not _number(value):
                default = _DEFAULTS[name]
                raise TypeError(f"{name} must be a number" + (" or None" if default is None else
                                                              f" such as {default!r}") + f", not {_shown(value)}")
            try:
                object.__setattr__(self, name, float(value))
            except OverflowError:
                raise ValueError(f"{name} is too large for a float: {_shown(value)}") from None
        for name in ("raise_at_min", "growth_at_least", "inf_guard", "window_scaling", "dynamic", "raise_at_zero",
                     "raise_at_inf"):
            value = getattr(self, name)
            if not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{name} must be True or False, not {_shown(value)}")
            object.__setattr__(self, name, bool(value))
        errors = []
        if self.arithmetic not in ARITHMETIC:
            errors.append(f"arithmetic must be one of {', '.join(ARITHMETIC)}, not {self.arithmetic!r}")
        if self.refill not in ("growth", "clean"):
            errors.append(f"refill must be 'growth' or 'clean', not {self.refill!r}")
        if not -2**63 <= self.growth_interval < 2**63:  # torch passes it to its kernel as an int64
            errors.append(f"growth_interval must fit in an int64 (such as 2000), not {self.growth_interval}")
        if not 1 <= self.hysteresis < 2**31:  # a count of overflows, kept (as torch's tracker) in an int32
            errors.append(f"hysteresis must be a whole number >= 1 (and below 2**31), not {self.hysteresis!r}")
        if not -2**31 <= self.tracker_after_overflow < 2**31:  # torch keeps the tracker in an int32
            errors.append(f"tracker_after_overflow must fit in an int32 (such as 0 or -1), "
                          f"not {self.tracker_after_overflow}")
        if math.isnan(self.tolerance):
            errors.append("tolerance must be a number, not NaN (0 backs off at every overflow)")
        if self.dynamic:
            if self.growth_factor <= 1.0:  # torch: "The growth factor must be > 1.0."
                errors.append(f"growth_factor must be > 1.0, not {self.growth_factor!r}")
            if self.backoff_factor >= 1.0:  # torch: "The backoff factor must be < 1.0."
                errors.append(f"backoff_factor must be < 1.0, not {self.backoff_factor!r}")
        if self.arithmetic != "float64" and math.isfinite(self.init_scale) and abs(self.init_scale) > _FLT_MAX:
            errors.append(f"init_scale {self.init_scale!r} does not fit in float32 (torch raises at the first scale())")
        if errors:
            raise ValueError("; ".join(errors))

    # ----- the state machine -----
    def initial_state(self) -> ScalerState:
        """The state before the first step (the scale rounded as the framework stores it)."""
        scale = float(self.init_scale)
        if self.arithmetic != "float64":
            scale = _f32(scale)
        return ScalerState(scale=scale, growth_tracker=self.tracker_after_overflow,
                           hysteresis=self.hysteresis,
                           window=int(self.growth_interval) if self.window_scaling else 0)

    def adjust(self, state: ScalerState, found_inf: bool) -> ScalerState:
        """The state after one step that did (``found_inf``: True or False, or 1/0) or did not
        overflow."""
        if not (type(state) is ScalerState and type(state.scale) is float and type(state.growth_tracker) is int
                and type(state.hysteresis) is int and type(state.window) is int and type(state.stopped) is bool
                and type(state.overflows_since_rescale) is int and type(state.steps_since_rescale) is int
                and state.steps_since_rescale >= 0):
            state = _check_state(state)
        if not isinstance(found_inf, (bool, np.bool_)):
            if not (_whole_number(found_inf) and found_inf in (0, 1)):
                raise TypeError(f"found_inf must be True or False (did the step overflow?), not {_shown(found_inf)}")
            found_inf = bool(found_inf)
        return self._adjust(state, found_inf)

    def _adjust(self, state: ScalerState, found_inf: bool) -> ScalerState:
        """``adjust`` on a state and flag known to be well formed (the simulator's own)."""
        if state.stopped or not self.dynamic:
            return state
        if self.raise_at_zero and state.scale == 0:  # the step divides by the scale
            return state._replace(stopped=True)
        counting = self.tolerance > 0  # fairseq's tolerance counters
        if found_inf:
            if self.raise_at_inf and not -math.inf < state.scale < math.inf:  # int(scale) in the message
                return state._replace(stopped=True)
            overflows = state.overflows_since_rescale + 1 if counting else 0
            steps = state.steps_since_rescale + 1 if counting else 0
            if state.hysteresis > 1:  # tolerated: skip the step, keep the scale
                new = state._replace(growth_tracker=self.tracker_after_overflow,
                                     hysteresis=state.hysteresis - 1,
                                     overflows_since_rescale=overflows, steps_since_rescale=steps)
            elif counting and not overflows / steps >= self.tolerance:  # below tolerance: keep the scale
                new = state._replace(growth_tracker=self.tracker_after_overflow,
                                     overflows_since_rescale=overflows, steps_since_rescale=steps)
            else:
                if self.raise_at_min and self.min_scale is not None and state.scale == self.min_scale:
                    return state._replace(stopped=True)
                scale = _mul(state.scale, self.backoff_factor, self.arithmetic)
                if self.min_scale is not None:
                    scale = max(scale, self.min_scale)
                if self.no_backoff_below is not None and scale < self.no_backoff_below:
                    scale = state.scale
                new = ScalerState(scale, self.tracker_after_overflow, state.hysteresis,
                                  window=self._resized(state.window, self.backoff_factor))
            if self.raise_at_scale is not None and new.scale <= self.raise_at_scale:
                return state._replace(stopped=True)
            return new
        hyst = self.hysteresis if self.refill == "clean" else state.hysteresis
        tracker = state.growth_tracker + 1
        if self._grows(tracker, state.window):
            scale = self._grow(state.scale)
            if self.refill == "growth":
                hyst = self.hysteresis
            if self.window_scaling:
                return ScalerState(scale, tracker, hyst, False, state.overflows_since_rescale, 0,
                                   self._resized(state.window, self.growth_factor))
            return ScalerState(scale, 0, hyst, False, state.overflows_since_rescale, 0)
        return ScalerState(state.scale, tracker, hyst, False, state.overflows_since_rescale,
                           state.steps_since_rescale + 1 if counting else 0, state.window)

    def _stop_reason(self, state: ScalerState, found_inf: bool) -> str | None:
        """The exception that ends the run at a step taken from ``state`` (not yet stopped) that did
        or did not overflow, as the last line of the framework's traceback; None if that step does
        not end the run. The checks come in ``_adjust``'s order."""
        if state.stopped or not self.dynamic:
            return None
        scale = state.scale
        if self.raise_at_zero and scale == 0:
            return "ZeroDivisionError: float division by zero"
        if not found_inf:
            return None
        if self.raise_at_inf and not -math.inf < scale < math.inf:
            return ("ValueError: cannot convert float NaN to integer" if scale != scale
                    else "OverflowError: cannot convert float infinity to integer")
        if self.tolerance > 0:
            below = not (state.overflows_since_rescale + 1) / (state.steps_since_rescale + 1) >= self.tolerance
        else:
            below = False
        if (state.hysteresis <= 1 and not below and self.raise_at_min and self.min_scale is not None
                and scale == self.min_scale):
            return f"Exception: {_AT_MINIMUM}"
        if self._adjust(state, True).stopped:  # raise_at_scale
            return f"FloatingPointError: {_MINIMUM_REACHED.format(self.raise_at_scale)}"
        return None

    def _grows(self, tracker: int, window: int = 0) -> bool:
        """Whether the clean step that brings the tracker to ``tracker`` grows the scale."""
        if self.window_scaling:
            return window >= 1 and tracker > 0 and tracker % window == 0
        return tracker >= self.growth_interval if self.growth_at_least else tracker == self.growth_interval

    def _resized(self, window: int, factor: float) -> int:
        """The growth window after a growth or backoff (``window_scaling``; 0 otherwise)."""
        if not self.window_scaling or window < 1:
            return window
        w = window * factor
        if not w >= 1:  # below 1, or NaN
            return 1
        return int(w) if math.isfinite(w) else window

    def _grow(self, scale: float) -> float:
        new = _mul(scale, self.growth_factor, self.arithmetic)
        if self.max_scale is not None:
            new = min(new, self.max_scale)
        if self.inf_guard and not math.isfinite(new):
            return scale
        return new

    def _clean_steps_to_growth(self, state: ScalerState) -> float:
        """How many clean steps from ``state`` until the one that grows (inf: never)."""
        tracker = state.growth_tracker
        if self.window_scaling:
            w = state.window
            if w < 1:
                return math.inf
            return w - tracker if tracker < 0 else w - tracker % w
        gi = self.growth_interval
        if tracker < gi:
            return gi - tracker
        return 1 if self.growth_at_least else math.inf  # "==" is never reached again

    def __str__(self) -> str:
        return self.name


def _number(x) -> bool:
    """A real number (an int, float, numpy scalar...), not a bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_))


def _whole_number(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(DynamicScaler)}

# The messages with which DeepSpeed (loss_scaler.py, DynamicLossScaler.update_scale) and fairseq
# (optim/dynamic_loss_scaler.py, check_overflow) end a run at their minimum scale.
_AT_MINIMUM = "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run."
_MINIMUM_REACHED = ("Minimum loss scale reached ({}). Your loss is probably exploding. Try lowering the learning "
                    "rate, using gradient clipping or increasing the batch size.")


_FLT_MAX = float(np.finfo(np.float32).max)


def _real(name: str, value, what: str) -> float:
    """A preset's numeric argument as a float, or one clear error naming it and what to pass."""
    if not _number(value):
        raise TypeError(f"{name} must be a number ({what}), not {_shown(value)}")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{name} is too large for a float ({what}): {_shown(value)}") from None


def _steps_count(name: str, value, what: str) -> int:
    """A preset's window or count: a whole number >= 1 (the frameworks divide by it or count to it)."""
    if not _whole_number(value):
        raise TypeError(f"{name} must be a whole number of steps ({what}), not {_shown(value)}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1 ({what}), not {value}")
    return int(value)


def _tolerance(value, what: str) -> float:
    value = _real("tolerance", value, what)
    if math.isnan(value):
        raise ValueError(f"tolerance must be a number ({what}), not NaN")
    return value


def _flag(name: str, value, what: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False ({what}), not {_shown(value)}")
    return bool(value)


def TorchGradScaler(init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
                    growth_interval=2000) -> DynamicScaler:
    """``torch.amp.GradScaler``'s update rule (torch 2.13), bit for bit.

    Source: ``torch/amp/grad_scaler.py`` and the CPU kernel
    ``aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp`` (``_amp_update_scale_``; the CUDA kernel
    does the same arithmetic). Like torch, it rejects growth_factor <= 1 and backoff_factor >= 1
    and accepts everything else, odd values included.
    """
    return DynamicScaler(
        name="torch", init_scale=init_scale, growth_factor=growth_factor,
        backoff_factor=backoff_factor, growth_interval=growth_interval, arithmetic="torch",
        source="pytorch/pytorch: torch/amp/grad_scaler.py, aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp",
    )


def StaticScaler(scale=2.0**10) -> DynamicScaler:
    """A static loss scale: never changes (an overflowing step is still reported as skipped)."""
    scale = _real("scale", scale, "the fixed loss scale, such as 1024.0")
    return DynamicScaler(name=f"static {scale:g}", init_scale=scale, dynamic=False, growth_interval=0,
                         arithmetic="float64", source="a fixed scale, e.g. Apex loss_scale=128")


# ------------------------------------------------------------------ framework presets
# Each preset is a DynamicScaler configured as one framework's scaler, with that framework's
# defaults. Parameters use torch's names; each docstring gives the framework's own. The rules, as
# read from each project's source, are collected in the design notes on loss scalers, and
# tests/scaling/test_presets.py checks every preset against a plain transcription of its rule.

def ApexAmpScaler(init_scale=2.0**16, growth_interval=2000, min_scale=None, max_scale=2.0**24) -> DynamicScaler:
    """Apex's legacy ``amp`` ``LossScaler`` (``amp.initialize`` with opt_level O1 or O2).

    Source: ``NVIDIA/apex: apex/amp/scaler.py`` at ``cb65b8ed^`` (``amp`` was removed in
    ``cb65b8ed``). Rule: an overflow halves the scale (not below ``min_loss_scale`` when one is set)
    and resets the count of unskipped steps; the ``scale_window``-th unskipped step in a row doubles
    it, capped at ``max_loss_scale``. The factors are hard-coded (``scale_factor`` is stored but
    unused), the scale is a Python float, and it starts at ``min(max_loss_scale, init_scale)``.
    Without a floor, 1,091 backoffs in a row take 2**16 to exactly 0.0, and the next step ends the
    run: ``amp.scale_loss`` unscales the gradients by ``1./scale`` before it checks them
    (``LossScaler.unscale``), so that step raises ``ZeroDivisionError: float division by zero``
    whether it overflows or not (``raise_at_zero``). An infinite scale (``max_loss_scale=math.inf``)
    ends nothing: ``1./inf`` is 0. Apex's names: ``init_scale``, ``scale_window``
    (growth_interval), ``min_loss_scale`` (None or 0: no floor), ``max_loss_scale`` (``math.inf``:
    no cap).
    """
    init_scale = _real("init_scale", init_scale, "apex's init_scale, such as 2**16")
    growth_interval = _steps_count("growth_interval", growth_interval, "apex's scale_window, such as 2000")
    if min_scale is not None:
        min_scale = _real("min_scale", min_scale, "apex's min_loss_scale, or None for no floor")
    max_scale = _real("max_scale", max_scale, "apex's max_loss_scale, such as 2**24, or math.inf for no cap")
    return DynamicScaler(
        name="apex amp", init_scale=min(max_scale, init_scale), growth_interval=growth_interval,
        min_scale=min_scale or None, max_scale=max_scale, inf_guard=False, raise_at_zero=True, arithmetic="float64",
        source="NVIDIA/apex@cb65b8ed^: apex/amp/scaler.py (LossScaler.update_scale, unscale), apex/amp/handle.py "
               "(scale_loss), apex/amp/frontend.py",
    )


def ApexHysteresisScaler(init_scale=2.0**32, growth_factor=2.0, backoff_factor=0.5, growth_interval=1000,
                         hysteresis=2) -> DynamicScaler:
    """NeMo's ``GradScaler``: torch's rule with apex's fused hysteresis kernel.

    Source: ``NVIDIA/apex@6424da3b: csrc/update_scale_hysteresis.cu``, called as
    ``amp_C.update_scale_hysteresis`` by NeMo's ``GradScaler`` in
    ``nemo/collections/nlp/parts/nlp_overrides.py``. Rule: an overflow uses up one unit of
    hysteresis and, while some is left, is skipped with the scale kept; otherwise the scale backs
    off as torch's does. A clean step follows torch's growth rule (inf guard included) and refills
    the hysteresis, so only ``hysteresis`` overflows *in a row* back off. Defaults are those NeMo's
    ``MegatronTrainerBuilder._grad_scaler`` passes (``nemo/collections/nlp/parts/megatron_trainer_builder.py``:
    ``native_amp_init_scale`` 2**32, ``native_amp_growth_interval`` 1000, ``hysteresis`` 2); the
    class itself defaults to ``hysteresis=1``, which is torch's rule.
    """
    return DynamicScaler(
        name="NeMo (apex hysteresis)", init_scale=init_scale, growth_factor=growth_factor,
        backoff_factor=backoff_factor, growth_interval=growth_interval, hysteresis=hysteresis,
        refill="clean", inf_guard=True, arithmetic="torch",
        source="NVIDIA/apex@6424da3b: csrc/update_scale_hysteresis.cu; NVIDIA/NeMo: "
               "nemo/collections/nlp/parts/nlp_overrides.py (GradScaler), megatron_trainer_builder.py (defaults)",
    )


def DeepSpeedZeroScaler(init_scale=None, growth_interval=1000, hysteresis=None, min_scale=1.0,
                        consecutive_hysteresis=False, raise_at_min=True, *, version=None,
                        config_defaults=True) -> DynamicScaler:
    """DeepSpeed's ``DynamicLossScaler`` as ZeRO stages 1-3 build it for fp16.

    Source: ``deepspeedai/DeepSpeed@cf443004`` (v0.19.5; this rule is unchanged since v0.17.1):
    ``deepspeed/runtime/fp16/loss_scaler.py`` (``DynamicLossScaler.update_scale``,
    ``CreateLossScaler``) and ``deepspeed/runtime/precision_config.py``
    (``DeepSpeedFP16Config.dynamic_loss_scale_args``). Rule: an overflow while hysteresis is left
    only uses one up (skip, scale kept); otherwise it halves the scale, not below
    ``min_loss_scale``, and if the scale already equals the minimum it raises ``Exception("Current
    loss scale already at minimum - cannot decrease scale anymore. Exiting run.")``, which ends the
    run (``ScalerState.stopped``). Growth: x2 on a clean step when ``stable_interval = iteration -
    last_overflow - 1`` is positive and a multiple of the window: the window-th clean step after a
    growth, the (window+1)-th after an overflow or at the start (the growth tracker starts, and
    restarts after an overflow, at -1, as in ``DeepSpeedScaler``). Growth refills the hysteresis
    (every clean step does, with ``consecutive_hysteresis``). No inf guard: the scale is a Python
    float that can grow to inf, and the next overflow then ends the run with ``OverflowError:
    cannot convert float infinity to integer`` (rank 0's overflow message formats ``int(scale)``),
    hysteresis or not.

    Defaults: the ``fp16`` config's (``initial_scale_power`` 16, ``loss_scale_window`` 1000,
    ``hysteresis`` 2, ``min_loss_scale`` 1, ``consecutive_hysteresis`` false), which DeepSpeed
    passes whatever the ``fp16`` block names. Given arguments override them. ``init_scale`` and
    ``min_scale`` must be above 0 (DeepSpeed checks ``min_loss_scale > 0`` since 0.19.3).

    ``version``: the DeepSpeed release to follow, such as ``"0.17.0"`` (0.9.3 or later); None, the
    default, follows the current one. Releases before 0.17.1 (``deepspeedai/DeepSpeed@720787e7``,
    v0.17.0) grow one step earlier, when ``(iteration - last_overflow) % window == 0`` (the
    window-th clean step after an overflow, a growth or the start), and pass the config's values
    only when the ``fp16`` block names one of ``initial_scale_power``, ``loss_scale_window``,
    ``min_loss_scale``, ``hysteresis`` or ``consecutive_hysteresis``; with just ``{"enabled":
    true}`` they use the class defaults instead (``init_scale=2**32``, ``delayed_shift=1``):
    ``config_defaults=False``, which only those releases accept. DeepSpeed PR #6976 (commit
    ``e440506b``, released in 0.17.1) changed both.
    """
    before = _deepspeed_before_0_17_1(version)
    config_defaults = _flag("config_defaults", config_defaults, "True: the fp16 config's defaults")
    if not config_defaults and not before:
        raise ValueError("config_defaults=False (the class defaults 2**32 and hysteresis 1) exists only in "
                         "DeepSpeed before 0.17.1: pass version='0.17.0' with it, or leave config_defaults=True")
    if init_scale is None:
        init_scale = 2.0**16 if config_defaults else 2.0**32
    if hysteresis is None:
        hysteresis = 2 if config_defaults else 1
    init_scale = _real("init_scale", init_scale, "2 ** initial_scale_power, or None for the default")
    growth_interval = _steps_count("growth_interval", growth_interval, "DeepSpeed's loss_scale_window, such as 1000")
    hysteresis = _steps_count("hysteresis", hysteresis, "DeepSpeed's hysteresis, such as 2, or None for the default")
    init_scale, min_scale = _deepspeed_scales(init_scale, min_scale)
    consecutive_hysteresis = _flag("consecutive_hysteresis", consecutive_hysteresis, "DeepSpeed's setting")
    raise_at_min = _flag("raise_at_min", raise_at_min, "True: DeepSpeed's raise_error_at_min_scale")
    if before:
        name = "DeepSpeed ZeRO < 0.17.1" + ("" if config_defaults else " (class defaults)")
        source = ("deepspeedai/DeepSpeed@720787e7: deepspeed/runtime/fp16/loss_scaler.py (DynamicLossScaler, "
                  "CreateLossScaler), runtime/config.py (get_dynamic_loss_scale_args), runtime/constants.py")
    else:
        name = "DeepSpeed ZeRO"
        source = ("deepspeedai/DeepSpeed@cf443004: deepspeed/runtime/fp16/loss_scaler.py (DynamicLossScaler, "
                  "CreateLossScaler), runtime/precision_config.py (dynamic_loss_scale_args)")
    return DynamicScaler(
        name=name, init_scale=init_scale, growth_interval=growth_interval, hysteresis=hysteresis,
        refill="clean" if consecutive_hysteresis else "growth", min_scale=min_scale, raise_at_min=raise_at_min,
        raise_at_inf=True, tracker_after_overflow=0 if before else -1, inf_guard=False, arithmetic="float64",
        source=source,
    )


def _deepspeed_before_0_17_1(version) -> bool:
    """Whether ``version`` (a DeepSpeed release such as "0.17.0", or None: the current one) comes
    before 0.17.1, which changed ZeRO's growth step and its defaults."""
    what = "a DeepSpeed release such as '0.17.0' or '0.19.5', or None for the current one"
    if version is None:
        return False
    if not isinstance(version, str):
        raise TypeError(f"version must be {what}, not {_shown(version)}")
    match = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)", version.strip())
    if match is None:
        raise ValueError(f"version must be {what}, not {_shown(version)}")
    release = tuple(int(x) for x in match.groups())
    if release < (0, 9, 3):
        raise ValueError(f"version must be 0.9.3 or later (the rule modelled here, consecutive_hysteresis "
                         f"included, dates from 0.9.3), not {_shown(version)}")
    return release < (0, 17, 1)


def _deepspeed_scales(init_scale: float, min_scale) -> tuple:
    """DeepSpeed's starting scale and minimum, both above 0: DeepSpeed divides by the scale (a
    scale of 0 would end the run in its optimizer step), and rejects ``min_loss_scale <= 0``."""
    min_scale = _real("min_scale", min_scale, "DeepSpeed's min_loss_scale, such as 1")
    if not 0 < min_scale < math.inf:
        raise ValueError(f"min_scale must be a finite number above 0 (DeepSpeed's min_loss_scale, such as 1), "
                         f"not {min_scale!r}")
    if not init_scale > 0:
        raise ValueError(f"init_scale must be above 0 (2 ** initial_scale_power, such as 2**16), not {init_scale!r}")
    return init_scale, min_scale


def DeepSpeedScaler(init_scale=2.0**16, growth_interval=1000, min_scale=1.0) -> DynamicScaler:
    """DeepSpeed without ZeRO: ``FP16_Optimizer`` / ``FP16_UnfusedOptimizer``'s own ``_update_scale``.

    Source: ``deepspeedai/DeepSpeed@cf443004`` (v0.19.5):
    ``deepspeed/runtime/fp16/fused_optimizer.py`` (``FP16_Optimizer._update_scale``) and
    ``unfused_optimizer.py`` (``FP16_UnfusedOptimizer._update_scale``); DeepSpeed PR #6976
    (0.17.1) left this rule as it was. Rule: an overflow halves the scale, not below
    ``min_loss_scale``; a clean step doubles it when ``stable = iteration - last_overflow - 1`` is
    positive and a multiple of the window. That is the window-th clean step after a growth but the
    (window+1)-th after an overflow or at the start: the growth tracker starts, and restarts after
    an overflow, at -1. There is no hysteresis (the config's ``hysteresis`` is ignored), no raise
    (the overflow messages print the scale with ``{}``, inf included), no inf guard. The scale is
    a Python number, ``2**initial_scale_power`` times ``scale_factor``: 2.0 since DeepSpeed 0.19.0,
    so it is a float after the first growth and reaches inf beyond float64's range, as here; the
    fused optimizer's int 2 before 0.19.0 kept it an exact int until the first backoff, which
    float64 follows exactly below 2**1024. Defaults: ``initial_scale_power`` 16, window 1000, min
    1; ``init_scale`` and ``min_scale`` must be above 0, as for ``DeepSpeedZeroScaler``.
    """
    init_scale = _real("init_scale", init_scale, "2 ** initial_scale_power, such as 2**16")
    growth_interval = _steps_count("growth_interval", growth_interval, "DeepSpeed's loss_scale_window, such as 1000")
    init_scale, min_scale = _deepspeed_scales(init_scale, min_scale)
    return DynamicScaler(
        name="DeepSpeed", init_scale=init_scale, growth_interval=growth_interval, min_scale=min_scale,
        tracker_after_overflow=-1, inf_guard=False, arithmetic="float64",
        source="deepspeedai/DeepSpeed@cf443004: deepspeed/runtime/fp16/fused_optimizer.py "
               "(FP16_Optimizer._update_scale), unfused_optimizer.py (FP16_UnfusedOptimizer._update_scale)",
    )


def MegatronScaler(init_scale=2.0**32, min_scale=1.0, growth_interval=1000, hysteresis=2) -> DynamicScaler:
    """Megatron-LM's ``DynamicGradScaler`` with the optimizer factory's settings.

    Source: ``NVIDIA/Megatron-LM@00caa53a: megatron/core/optimizer/grad_scaler.py``; defaults from
    ``optimizer_config.py@0075637c`` (``--initial-loss-scale 2**32 --min-loss-scale 1.0
    --loss-scale-window 1000 --hysteresis 2``; factors 2 and 0.5). Rule: an overflow resets the
    growth tracker and uses up one unit of hysteresis; once none is left it backs off,
    ``max(scale * 0.5, min_scale)``. The ``loss_scale_window``-th clean step in a row doubles the
    scale and refills the hysteresis (only there). No inf guard, no maximum; the scale, factors
    and minimum are float32 tensors. Megatron asserts ``initial_scale > 0``, ``0 < min_scale <=
    initial_scale``, ``growth_interval > 0`` and ``hysteresis > 0``; so does this preset.
    """
    init_scale = _real("init_scale", init_scale, "Megatron's --initial-loss-scale, such as 2**32")
    min_scale = _real("min_scale", min_scale, "Megatron's --min-loss-scale, such as 1.0")
    growth_interval = _steps_count("growth_interval", growth_interval, "Megatron's --loss-scale-window, such as 1000")
    hysteresis = _steps_count("hysteresis", hysteresis, "Megatron's --hysteresis, such as 2")
    if not init_scale > 0:
        raise ValueError(f"init_scale must be > 0 (Megatron asserts initial_scale > 0.0), not {init_scale!r}")
    if not 0 < min_scale <= init_scale:
        raise ValueError(f"min_scale must be > 0 and at most init_scale (Megatron asserts both), not {min_scale!r}")
    return DynamicScaler(
        name="Megatron", init_scale=init_scale, growth_interval=growth_interval, hysteresis=hysteresis,
        refill="growth", min_scale=_f32(min_scale), inf_guard=False, arithmetic="float32",
        source="NVIDIA/Megatron-LM@00caa53a: megatron/core/optimizer/grad_scaler.py (DynamicGradScaler); "
               "megatron/core/optimizer/optimizer_config.py@0075637c",
    )


def KerasScaler(init_scale=2.0**15, growth_interval=2000) -> DynamicScaler:
    """tf.keras (Keras 2) ``LossScaleOptimizer``'s ``_DynamicLossScaleState``.

    Source: ``keras-team/keras@363ac472: keras/mixed_precision/loss_scale_optimizer.py``. Rule: a
    non-finite step sets ``counter = 0`` and ``scale = max(scale / 2, 1)``; a finite step doubles
    the scale when ``counter + 1 >= growth_steps`` (only if the result is finite) and resets the
    counter, else counts. The scale is a float32 variable. Keras's names: ``initial_scale``,
    ``dynamic_growth_steps`` (growth_interval); the multiplier is 2.
    """
    init_scale = _real("init_scale", init_scale, "Keras's initial_scale, such as 2**15")
    growth_interval = _steps_count("growth_interval", growth_interval, "Keras's dynamic_growth_steps, such as 2000")
    return DynamicScaler(
        name="Keras 2", init_scale=init_scale, growth_interval=growth_interval, min_scale=1.0,
        growth_at_least=True, inf_guard=True, arithmetic="float32",
        source="keras-team/keras@363ac472: keras/mixed_precision/loss_scale_optimizer.py (_DynamicLossScaleState)",
    )


def Keras3Scaler(init_scale=2.0**15, growth_interval=2000) -> DynamicScaler:
    """Keras 3 ``LossScaleOptimizer``.

    Source: ``keras-team/keras@054e2952: keras/src/optimizers/loss_scale_optimizer.py``. Rule: a
    non-finite step sets ``step_counter = 0`` and halves the scale, with no floor; a finite step
    doubles it when ``step_counter == dynamic_growth_steps - 1`` (no inf guard) and resets the
    counter, else counts. The scale is a float32 variable.
    """
    init_scale = _real("init_scale", init_scale, "Keras's initial_scale, such as 2**15")
    growth_interval = _steps_count("growth_interval", growth_interval, "Keras's dynamic_growth_steps, such as 2000")
    return DynamicScaler(
        name="Keras 3", init_scale=init_scale, growth_interval=growth_interval, inf_guard=False,
        arithmetic="float32",
        source="keras-team/keras@054e2952: keras/src/optimizers/loss_scale_optimizer.py",
    )


def JmpScaler(init_scale=2.0**15, growth_interval=2000, growth_factor=2, min_scale=1.0) -> DynamicScaler:
    """jmp's ``DynamicLossScale`` (JAX).

    Source: ``google-deepmind/jmp@9c1cdbbf: jmp/_src/loss_scale.py`` (``DynamicLossScale.adjust``).
    Rule: a finite step multiplies the scale by ``factor`` when ``counter == period - 1`` (keeping
    the old scale if the product is not finite), then ``counter = (counter + 1) % period``; a
    non-finite step sets ``scale = max(min_loss_scale, scale / factor)`` and ``counter = 0``. jmp's
    names: ``loss_scale`` (no default; its docs use ``jnp.asarray(2. ** 15)``, a float32),
    ``period`` (growth_interval), ``factor``, ``min_loss_scale`` (a float32). ``factor`` must be a
    power of two here: then ``scale / factor`` in float32 equals the multiplication by
    ``1 / factor`` that the simulation does.
    """
    init_scale = _real("init_scale", init_scale, "jmp's loss_scale, such as 2**15")
    growth_interval = _steps_count("growth_interval", growth_interval, "jmp's period, such as 2000")
    growth_factor = _real("growth_factor", growth_factor, "jmp's factor, a power of two such as 2")
    min_scale = _real("min_scale", min_scale, "jmp's min_loss_scale, such as 1.0")
    if not (growth_factor > 1 and math.isfinite(growth_factor) and math.frexp(growth_factor)[0] == 0.5):
        raise ValueError(f"growth_factor (jmp's factor) must be a power of two above 1, not {growth_factor!r}")
    return DynamicScaler(
        name="jmp", init_scale=init_scale, growth_factor=float(growth_factor),
        backoff_factor=1.0 / growth_factor, growth_interval=growth_interval, min_scale=_f32(min_scale),
        inf_guard=True, arithmetic="float32",
        source="google-deepmind/jmp@9c1cdbbf: jmp/_src/loss_scale.py (DynamicLossScale.adjust)",
    )


def FairseqScaler(init_scale=None, growth_interval=None, tolerance=0.0, min_scale=None, raise_at_scale=1e-4,
                  *, cli_defaults=True, world_size=1, update_freq=1) -> DynamicScaler:
    """fairseq's ``DynamicLossScaler`` as its ``FP16Optimizer`` builds it.

    Source: ``facebookresearch/fairseq@0d77035e: fairseq/optim/dynamic_loss_scaler.py``, with
    ``fairseq/optim/fp16_optimizer.py`` and ``fairseq/dataclass/configs.py``. Rule: on an overflow
    (an inf or NaN gradient norm), if overflows since the last backoff / steps since the last
    rescale >= ``tolerance`` the scale is halved (not below ``threshold_loss_scale``), else it is
    kept; either way the step is skipped, and if the scale would then be at or below
    ``min_loss_scale`` it is kept and ``FloatingPointError("Minimum loss scale reached ...")`` ends
    the run. A clean step doubles it when ``(iteration - last_overflow) % window == 0``. No inf
    guard; the scale is a Python float. The trainer computes ``1.0 / loss_scale`` before every step
    (``zero_grad``), so a starting scale of 0 ends the run at once with ``ZeroDivisionError``
    (``raise_at_zero``); a scale that halves to 0 would end it the same way at that overflow (the
    trainer calls ``zero_grad`` after it), which only a negative ``--min-loss-scale`` allows, so
    ``raise_at_scale`` below 0 needs a floor ``min_scale`` above 0.

    fairseq's names: ``--fp16-init-scale``, ``--fp16-scale-window`` (growth_interval),
    ``--fp16-scale-tolerance``, ``--threshold-loss-scale`` (min_scale, a floor),
    ``--min-loss-scale`` (raise_at_scale). ``cli_defaults=True``: the command line's 2**7 and a
    window of ``int(2**14 / world_size / update_freq)``; False: the class's 2**15 and 2000.
    """
    cli_defaults = _flag("cli_defaults", cli_defaults, "True: the command line's defaults")
    world_size = _steps_count("world_size", world_size, "the number of data-parallel workers, such as 1")
    update_freq = _steps_count("update_freq", update_freq, "fairseq's --update-freq, such as 1")
    if init_scale is None:
        init_scale = 2.0**7 if cli_defaults else 2.0**15
    if growth_interval is None:
        # fairseq's int(2**14 / world_size / update_freq), the same in whole numbers (any size)
        growth_interval = 2**14 // (world_size * update_freq) if cli_defaults else 2000
        if growth_interval < 1:
            raise ValueError(f"world_size * update_freq must be at most 16384: fairseq's window "
                             f"2**14 / world_size / update_freq would be 0 (pass growth_interval)")
    init_scale = _real("init_scale", init_scale, "fairseq's --fp16-init-scale, or None for the default")
    growth_interval = _steps_count("growth_interval", growth_interval,
                                   "fairseq's --fp16-scale-window, or None for the default")
    tolerance = _tolerance(tolerance, "fairseq's --fp16-scale-tolerance, such as 0.0")
    if min_scale is not None:
        min_scale = _real("min_scale", min_scale, "fairseq's --threshold-loss-scale, or None for no floor")
    raise_at_scale = _real("raise_at_scale", raise_at_scale, "fairseq's --min-loss-scale, such as 1e-4")
    if not raise_at_scale >= 0 and not (min_scale is not None and min_scale > 0):
        raise ValueError(f"raise_at_scale (fairseq's --min-loss-scale) must be at least 0 unless min_scale "
                         f"(--threshold-loss-scale) is above 0, not {raise_at_scale!r}: the scale would halve to 0")
    return DynamicScaler(
        name="fairseq" if cli_defaults else "fairseq (class defaults)", init_scale=init_scale,
        growth_interval=growth_interval, tolerance=tolerance, min_scale=min_scale,
        raise_at_scale=raise_at_scale, raise_at_zero=True, inf_guard=False, arithmetic="float64",
        source="facebookresearch/fairseq@0d77035e: fairseq/optim/dynamic_loss_scaler.py, "
               "fairseq/optim/fp16_optimizer.py, fairseq/dataclass/configs.py, fairseq/trainer.py",
    )


def MetaseqScaler(init_scale=4.0, growth_interval=256, tolerance=0.0, min_scale=None,
                  no_backoff_below=2.0**-5) -> DynamicScaler:
    """metaseq's (OPT's) ``DynamicLossScaler``: fairseq's, with a window that follows the scale.

    Source: ``facebookresearch/metaseq@0ba5657a: metaseq/optim/dynamic_loss_scaler.py`` (rationale in
    metaseq PR #115). Rule: fairseq's tolerance and growth test ``(iteration - last_overflow) % window
    == 0``, but every growth doubles the window and every backoff halves it (rounded down, at least
    1), and at the minimum there is no exception: a backoff that would take the scale below
    ``min_loss_scale`` keeps the old scale and it "just continue[s] to skip grad". No inf guard; the
    scale is a Python float. Defaults are the class's: init 4, window 256, min 2**-5. metaseq's
    names: ``scale_window`` (growth_interval), ``threshold`` (min_scale, a floor),
    ``min_loss_scale`` (no_backoff_below). As in fairseq, the trainer computes ``1.0 /
    loss_scale`` before every step and after every overflow: a starting scale of 0 ends the run
    with ``ZeroDivisionError`` (``raise_at_zero``), and ``no_backoff_below`` must be above 0 unless
    ``min_scale`` is (otherwise the scale could halve to 0).
    """
    init_scale = _real("init_scale", init_scale, "metaseq's init_scale, such as 4.0")
    growth_interval = _steps_count("growth_interval", growth_interval, "metaseq's scale_window, such as 256")
    tolerance = _tolerance(tolerance, "metaseq's tolerance, such as 0.0")
    if min_scale is not None:
        min_scale = _real("min_scale", min_scale, "metaseq's threshold, or None for no floor")
    no_backoff_below = _real("no_backoff_below", no_backoff_below, "metaseq's min_loss_scale, such as 2**-5")
    if not no_backoff_below > 0 and not (min_scale is not None and min_scale > 0):
        raise ValueError(f"no_backoff_below (metaseq's min_loss_scale) must be above 0 unless min_scale (its "
                         f"threshold) is, not {no_backoff_below!r}: the scale would halve to 0")
    return DynamicScaler(
        name="metaseq", init_scale=init_scale, growth_interval=growth_interval, tolerance=tolerance,
        min_scale=min_scale, no_backoff_below=no_backoff_below, window_scaling=True, raise_at_zero=True,
        inf_guard=False, arithmetic="float64",
        source="facebookresearch/metaseq@0ba5657a: metaseq/optim/dynamic_loss_scaler.py, metaseq/trainer.py",
    )


#: Each framework's scaler at its defaults, as its current release (apex amp: its last) runs it, by
#: name: first the scalers current training runs with, then a static scale, then the ``LEGACY`` ones.
PRESETS = {p.name: p for p in (
    TorchGradScaler(), DeepSpeedZeroScaler(), DeepSpeedScaler(), MegatronScaler(), ApexHysteresisScaler(),
    Keras3Scaler(), JmpScaler(), StaticScaler(),
    KerasScaler(), ApexAmpScaler(), FairseqScaler(), MetaseqScaler(),
)}

#: The presets of frameworks that new training no longer starts with, and why: kept because their
#: scalers live on in old code, papers and logs.
LEGACY = {
    "Keras 2": "tf.keras's LossScaleOptimizer, replaced by Keras 3's",
    "apex amp": "removed from NVIDIA apex in 2025",
    "fairseq": "its repository is archived",
    "metaseq": "its repository is archived",
}


# ------------------------------------------------------------------ inputs
def _is_tensor(x) -> bool:
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "detach")


def _as_array(name: str, values, what: str) -> np.ndarray:
    """``values`` (a number, a list, a numpy array or a torch tensor) as a numpy array, or one
    clear error that says what to pass."""
    if isinstance(values, (str, bytes, bytearray)):
        raise TypeError(f"{name} must be {what}, not a string")
    if _is_tensor(values):
        t = values.detach().cpu()
        if t.is_complex():
            raise TypeError(f"{name} must be real numbers, not a complex tensor")
        try:
            values = t.numpy()
        except (TypeError, RuntimeError):  # bfloat16, float8: numpy has no such dtype
            values = t.float().numpy()
    try:
        return np.asarray(values)
    except (ValueError, TypeError, OverflowError):  # ragged lists, objects numpy cannot hold
        raise ValueError(f"{name} must be {what}; got {_shown(values)}") from None


def _real_values(name: str, values, what: str) -> np.ndarray:
    """``values`` as a float64 array (any shape), or one clear error."""
    arr = _as_array(name, values, what)
    kind = arr.dtype.kind
    if kind == "b":
        raise TypeError(f"{name} must be {what}, not booleans")
    if kind == "O":
        if any(v is None or isinstance(v, (str, bytes, bool, np.bool_)) for v in arr.flat):
            raise TypeError(f"{name} must be {what}; got {_shown(values)}")  # numpy would make None NaN
        try:
            return arr.astype(np.float64)
        except OverflowError:
            raise ValueError(f"{name} has a number too large for a float: pass {what}") from None
        except (TypeError, ValueError):
            raise TypeError(f"{name} must be {what}; got {_shown(values)}") from None
    if kind not in "iuf":
        raise TypeError(f"{name} must be {what} (real numbers), got {arr.dtype} values")
    with np.errstate(over="ignore"):  # a longdouble beyond float64 is inf, as a cast makes it
        return arr.astype(np.float64)


def _flags(found_inf) -> np.ndarray:
    """found_inf as a 1-D bool array: booleans, or 0/1 (ints or floats, as torch's found_inf)."""
    what = "booleans, one per step (True where the step overflowed)"
    arr = _as_array("found_inf", found_inf, what)
    if arr.ndim != 1:
        raise ValueError(f"found_inf must be a 1-D array, one entry per step (got shape {arr.shape})")
    if arr.size == 0:  # an empty list is float64 to numpy: still an empty stream
        return np.zeros(0, bool)
    kind = arr.dtype.kind
    if kind == "b":
        return arr
    if kind not in "iufO":
        raise TypeError(f"found_inf must be booleans (one per step), got {arr.dtype} values")
    try:
        with np.errstate(invalid="ignore"):
            one = np.asarray(arr == 1, dtype=bool)
            zero = np.asarray(arr == 0, dtype=bool)
    except (TypeError, ValueError):
        raise TypeError(f"found_inf must be booleans (one per step); got {_shown(found_inf)}") from None
    if one.shape != arr.shape or zero.shape != arr.shape:
        raise TypeError(f"found_inf must be booleans (one per step); got {_shown(found_inf)}")
    bad = ~(one | zero)
    if bad.any():
        k = int(np.argmax(bad))
        value = arr[k].item() if isinstance(arr[k], np.generic) else arr[k]
        raise ValueError(f"found_inf must be True/False (or 1/0) at every step; step {k} is {_shown(value)}")
    return one


def _gradients(grad_max) -> np.ndarray:
    """grad_max as a 1-D array of real numbers."""
    arr = _as_array("grad_max", grad_max, "numbers, the largest |gradient| of each step")
    if arr.ndim != 1:
        raise ValueError(f"grad_max must be a 1-D array, one entry per step (got shape {arr.shape})")
    if arr.dtype.kind == "b":
        raise TypeError("grad_max must be numbers (the largest |gradient| of each step), not booleans; "
                        "give overflow flags as found_inf=")
    if arr.dtype.kind in "iuf":
        return arr
    return _real_values("grad_max", arr, "numbers, the largest |gradient| of each step")


def _overflow_format(fmt) -> FloatFormat:
    fmt = get_format(fmt)
    if fmt.specials in ("fnuz", "fnu"):
        raise ValueError(
            f"{fmt.name} has no inf: a value past its max {fmt.max:g} becomes NaN instead of inf, so the "
            "overflow to inf modelled here does not happen there; choose a format with inf such as fp16")
    if fmt.specials != "ieee":
        raise ValueError(
            f"{fmt.name} saturates at {fmt.max:g} instead of overflowing to inf, so a loss scaler "
            "never sees an overflow there; choose a format with inf such as fp16")
    return fmt


def _loss_format(loss_dtype, fmt: FloatFormat) -> bool:
    """Whether ``loss_dtype`` is the low-precision format itself (the loss computed in ``fmt``)
    rather than float32 (the loss autocast computes in fp32); anything else is one clear error."""
    try:
        lf = get_format(loss_dtype)
    except (TypeError, ValueError):
        lf = None
    if lf is FP32:
        return False
    if lf is fmt:
        return True
    own = fmt.torch_dtype or fmt.name
    raise ValueError(f"loss_dtype must be 'float32' (the loss autocast computes in fp32, as mse_loss and "
                     f"cross_entropy are) or {own!r} (a loss computed in {fmt.name}), not {_shown(loss_dtype)}")


# ------------------------------------------------------------------ overflow model
def overflows(scale, grad_max, fmt: FloatFormat | str = FP16, loss_dtype="float32") -> np.ndarray:
    """Whether a step whose largest unscaled gradient is ``grad_max`` overflows at ``scale``.

    The model of torch's backward into a low-precision (``fmt``) region. Where the loss is float32
    (``loss_dtype="float32"``, the default: autocast runs ``mse_loss``, ``cross_entropy`` and other
    losses in fp32), the scaled gradient is computed in float32 and reaches ``fmt`` as
    ``f16(f32(f32(scale) * f32(g)))``: it overflows when that is inf or NaN, i.e. when the
    float32 product reaches ``fmt.overflow_boundary`` (65520 for fp16). A small gradient at
    scale 2^16 does not overflow. Where the loss itself is in ``fmt`` (``loss_dtype="float16"``:
    a ``.half()`` model, or a loss computed in fp16), the scale is cast to ``fmt`` first:
    ``f16(f16(scale) * f16(g))``, so a scale of 65520 or more overflows whatever the gradients.
    By monotone rounding the largest |g| decides for a whole tensor. Both products are exact in
    float64, so only their roundings matter. ``scale`` and ``grad_max`` are numbers or arrays of
    matching (broadcastable) shapes.
    """
    fmt = _overflow_format(fmt)
    low = _loss_format(loss_dtype, fmt)
    s = _real_values("scale", scale, "a number (the loss scale) or an array of them")
    g = _real_values("grad_max", grad_max, "numbers (the largest |gradient| of each step)")
    try:
        np.broadcast_shapes(s.shape, g.shape)
    except ValueError:
        raise ValueError(f"scale and grad_max must have matching shapes (or one be a single number); "
                         f"got {s.shape} and {g.shape}") from None
    with np.errstate(invalid="ignore", over="ignore"):
        if low:
            qs = np.abs(np.asarray(fmt.quantize(s), dtype=np.float64))
            qg = np.abs(np.asarray(fmt.quantize(g), dtype=np.float64))
            return _overflowing(qs, qg, fmt.overflow_boundary)
        return _overflowing32(np.abs(s.astype(np.float32)).astype(np.float64),
                              np.abs(g.astype(np.float32)).astype(np.float64), fmt.overflow_boundary)


def _overflowing32(s32, g32, boundary: float):
    """The fp32-loss overflow test on float32 magnitudes (held as float64, where their product is
    exact): the product rounded to float32, then compared with the boundary. Called under
    ``np.errstate``."""
    return ~(np.asarray(s32 * g32).astype(np.float32) < boundary)  # NaN (0 * inf) counts as overflow


def _overflowing(qs, qg, boundary: float):
    """The overflow test on magnitudes already cast to the format whose ``overflow_boundary`` is
    given (kept in one place: every path of the simulator uses it or a threshold derived from it).
    Called under ``np.errstate``: 0 * inf and overflow are the point."""
    return ~(qs * qg < boundary)  # NaN (0 * inf, NaN input) counts as overflow


def _ulp_exponent(fmt: FloatFormat, x: np.ndarray) -> np.ndarray:
    """The exponent of one ulp of ``fmt`` at each magnitude x >= 0 (finite)."""
    _, e = np.frexp(x)
    return np.maximum(e - 1, fmt.emin) - fmt.mantissa_bits


def _thresholds(fmt: FloatFormat, qg: np.ndarray, scale64: bool) -> np.ndarray:
    """For gradient magnitudes already cast to ``fmt`` (``qg``, float64): the threshold of each,
    such that a step overflows at scale S exactly when ``not abs(S) < threshold``.

    S is a float32 value, or any float64 with ``scale64``; either is cast to float32 and then to
    ``fmt``, as ``overflows`` casts it. The cast is monotone, so the overflowing scales are those
    from the threshold up: the least S whose cast v has v * qg >= B (B = fmt.overflow_boundary,
    the product exact in float64). v is the least grid value >= B / qg (one grid step up where the
    quotient was rounded down; inf where no finite value overflows; 0 where qg is inf), and the
    threshold the least float32 that the cast rounds to v or above: the midpoint below v, or the
    next float32 where that tie rounds down. For float64 scales, the least float64 that rounds to
    that float32 or above, found the same way.
    """
    B = fmt.overflow_boundary
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        v0 = B / qg
        finite = np.isfinite(v0)
        x = np.where(finite, v0, 0.0)
        e = _ulp_exponent(fmt, x)
        v = np.ldexp(np.ceil(np.ldexp(x, -e)), e)  # the least grid value >= v0
        v = np.where(v * qg < B, v + np.ldexp(1.0, _ulp_exponent(fmt, v)), v)
        v = np.where(finite & (v <= fmt.max), v, np.inf)
        pe = _ulp_exponent(fmt, np.where(np.isinf(v), 0.0, v))
        power = (np.frexp(v)[0] == 0.5) & (v > fmt.smallest_normal)  # the ulp below v is half as big
        mid = np.where(np.isinf(v), B, v - np.ldexp(0.5, pe - power))
        c = mid.astype(np.float32)
        up = np.float32(np.inf)
        c = np.where(c < mid, np.nextafter(c, up), c)
        c = np.where((c == mid) & (_cast_array(fmt, c) < v), np.nextafter(c, up), c)
        thr = np.where(v == 0, 0.0, c.astype(np.float64))
        return _thresholds64(thr) if scale64 else thr


def _thresholds64(thr: np.ndarray) -> np.ndarray:
    """Thresholds on a float32 scale (float32 values, 0 or inf) turned into thresholds on a float64
    scale that is cast to float32 first: the least float64 that rounds to the threshold or above."""
    with np.errstate(over="ignore", invalid="ignore"):
        below = np.nextafter(thr.astype(np.float32), np.float32(0)).astype(np.float64)
        mid = (below + np.where(np.isinf(thr), 2.0**128, thr)) / 2
        thr64 = np.where(mid.astype(np.float32).astype(np.float64) >= thr, mid, np.nextafter(mid, np.inf))
    return np.where(thr == 0, 0.0, thr64)


def _thresholds32(fmt: FloatFormat, a: np.ndarray, scale64: bool) -> np.ndarray:
    """``_thresholds`` for the fp32-loss model: for float32 gradient magnitudes ``a``, the least
    float32 scale S with f32(S * g) >= B (B = fmt.overflow_boundary), so that a step overflows
    exactly when ``not abs(S) < threshold``. B / g is within an ulp of it: of the float32 values
    around it, the least that passes the test itself is taken. A zero gradient overflows only at
    an infinite (or NaN) scale, an infinite one at every scale."""
    B = fmt.overflow_boundary
    g = np.asarray(a, np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        c = np.minimum(B / np.where(g > 0, g, 1.0), float(np.finfo(np.float32).max)).astype(np.float32)
        # B / g is within half a float32 step of B / g's own rounding, and the boundary B lies
        # within half a step of its float32 neighbour: two steps down is below the threshold
        for _ in range(2):
            c = np.nextafter(c, np.float32(0))
        thr = np.full(g.shape, np.inf)
        open_ = np.ones(g.shape, bool)
        for _ in range(6):
            hit = open_ & (_overflowing32(c.astype(np.float64), g, B))
            thr[hit] = c[hit]
            open_ &= ~hit
            if not open_.any():
                break
            c = np.nextafter(c, np.float32(np.inf))
        thr = np.where(np.isinf(g), 0.0, np.where(g == 0, np.inf, thr))
    return _thresholds64(thr) if scale64 else thr


def _cast_array(fmt: FloatFormat, x: np.ndarray) -> np.ndarray:
    """float32 values cast to ``fmt``, as float64."""
    if fmt is FP16:  # numpy's own float32 -> float16 cast rounds exactly as torch's
        return x.astype(np.float16).astype(np.float64)
    return np.asarray(fmt.quantize(x), dtype=np.float64)


_FP16_THRESHOLDS: dict = {}


def _fp16_thresholds(scale64: bool) -> np.ndarray:
    """``_thresholds`` for every fp16 value from +0 to +inf, indexed by its bit pattern."""
    table = _FP16_THRESHOLDS.get(scale64)
    if table is None:
        q = np.arange(0x7C01, dtype=np.uint16).view(np.float16).astype(np.float64)
        table = _FP16_THRESHOLDS[scale64] = _thresholds(FP16, q, scale64)
        table.flags.writeable = False
    return table


# ------------------------------------------------------------------ traces
@dataclass(frozen=True, eq=False)
class ScalerTrace:
    """A simulated run, one entry per step.

    ``scale``: the scale in effect at each step, before that step's update (float32 for torch
    arithmetic, float64 otherwise; NaN after a run was stopped); ``skipped``: the step overflowed,
    ended the run, or came after it; ``growth_tracker`` and ``hysteresis``: the state after
    each step's update; ``stopped_at``: the step at which the framework's scaler ended the run
    (it raised: at its minimum scale, or dividing by a scale of 0, or formatting an infinite one),
    or None; ``stop_reason``: the exception it raised there, as the last line of its traceback
    (such as ``"ZeroDivisionError: float division by zero"``), or None.
    """

    policy: DynamicScaler
    scale: np.ndarray
    skipped: np.ndarray
    growth_tracker: np.ndarray
    hysteresis: np.ndarray
    final: ScalerState
    stopped_at: int | None = None
    stop_reason: str | None = None

    @property
    def steps(self) -> int:
        return int(self.scale.size)

    @property
    def skipped_count(self) -> int:
        """Skipped steps of the run; after a stop (``stopped_at``) no step runs, so none is counted."""
        end = self.steps if self.stopped_at is None else self.stopped_at + 1
        return int(np.count_nonzero(self.skipped[:end]))

    def __repr__(self) -> str:
        return (f"ScalerTrace({self.policy.name}: {self.steps} steps, {self.skipped_count} skipped, "
                f"scale {self.scale[0] if self.steps else float('nan'):g} -> "
                f"{self.scale[-1] if self.steps else float('nan'):g}"
                + (f", stopped at step {self.stopped_at}" if self.stopped_at is not None else "") + ")")


def _check_state(state) -> ScalerState:
    """A starting state given to ``simulate``: a ScalerState of sensible values, or one clear error."""
    if not isinstance(state, ScalerState):
        raise TypeError(f"state must be a ScalerState (e.g. policy.initial_state()), got {_shown(state)}")
    if not _number(state.scale):
        raise TypeError(f"state.scale must be a number, not {_shown(state.scale)}")
    ints = {}
    for name, low, high in (("growth_tracker", -2**31, 2**31), ("hysteresis", -2**31, 2**31),
                            ("overflows_since_rescale", 0, 2**62), ("steps_since_rescale", 0, 2**62),
                            ("window", -2**62, 2**62)):
        v = getattr(state, name)
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"state.{name} must be a whole number, not {_shown(v)}")
        if not low <= v < high:
            raise ValueError(f"state.{name} must be a whole number from {low} to {high - 1}, not {v}")
        ints[name] = int(v)
    if not isinstance(state.stopped, (bool, np.bool_)):
        raise TypeError(f"state.stopped must be True or False, not {_shown(state.stopped)}")
    try:
        scale = float(state.scale)
    except OverflowError:
        raise ValueError(f"state.scale {state.scale!r} does not fit in a float") from None
    return ScalerState(scale=scale, stopped=bool(state.stopped), **ints)


def simulate(policy: DynamicScaler, *, found_inf=None, grad_max=None, fmt=FP16, loss_dtype="float32",
             state: ScalerState | None = None) -> ScalerTrace:
    """Run ``policy`` over a stream of steps.

    Give exactly one of ``found_inf`` (bool per step: the step overflowed; 0/1 work too) or
    ``grad_max`` (the largest unscaled |gradient| per step: the step overflows when
    ``overflows(scale, g, fmt, loss_dtype)`` at the scale of that step; ``loss_dtype`` says whether
    the loss is float32, as autocast computes it, or in ``fmt``). ``state`` starts from a given
    state instead of the initial one. An empty stream gives an empty trace.
    """
    if not isinstance(policy, DynamicScaler):
        raise TypeError(f"policy must be a DynamicScaler (e.g. TorchGradScaler()), got {_shown(policy)}")
    if (found_inf is None) == (grad_max is None):
        raise ValueError("give exactly one of found_inf (bool per step) or grad_max (max |gradient| per step)")
    st = policy.initial_state() if state is None else _check_state(state)
    fmt = get_format(fmt)
    low = _loss_format(loss_dtype, fmt)
    if found_inf is not None:
        flags = _flags(found_inf)
        n = flags.size
        stream = _FixedOverflows(flags)
    else:
        g = _gradients(grad_max)
        n = g.size
        stream = _ScaleDependentOverflows(g, _overflow_format(fmt), low)
    with np.errstate(over="ignore", invalid="ignore"):
        return _run(policy, st, n, stream)


class _FixedOverflows:
    """Overflow steps known in advance (``found_inf``)."""

    known = True

    def __init__(self, flags: np.ndarray):
        self.flags = flags
        self.events = np.flatnonzero(flags)
        # few overflows (the event-by-event search sees them all): a list that bisect searches
        self._list = self.events.tolist() if self.events.size <= flags.size // 64 else None

    def first(self, start: int, stop: int, scale: float):
        """The first overflowing step in [start, stop), or None."""
        if self._list is not None:
            k = bisect.bisect_left(self._list, start)
            if k < len(self._list) and self._list[k] < stop:
                return self._list[k]
            return None
        k = int(self.events.searchsorted(start))
        if k < self.events.size and self.events[k] < stop:
            return int(self.events[k])
        return None

    def mask(self, lo: int, hi: int, scale: float) -> np.ndarray:
        """Which steps of [lo, hi) overflow at ``scale``."""
        return self.flags[lo:hi]

    def chunk(self, lo: int, hi: int, scale64: bool) -> bytes:
        """The steps [lo, hi) for the step-by-step loop: one byte per step, 1 = overflow."""
        return self.flags[lo:hi].tobytes()


def _f16(x: float) -> float:
    """x rounded to fp16 (to nearest even; 65520 and beyond give inf), as a Python float."""
    try:
        return _UNPACK_E(_PACK_E(x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


_PACK_E = struct.Struct("<e").pack
_UNPACK_E = struct.Struct("<e").unpack


def _cast_scalar(fmt: FloatFormat, x: float) -> float:
    """One value cast to ``fmt`` as torch casts it (fp16 through the struct module: fast)."""
    if fmt is FP16 and not math.isnan(x):
        return _f16(_f32(x))  # torch casts the float32 scale
    return float(fmt.quantize(x))


class _ScaleDependentOverflows:
    """Overflow steps that depend on the scale: the first step in a range whose gradient
    overflows at the current scale. Rounding is monotone, so a block of steps holds an overflow
    exactly when its largest |gradient| overflows: per-block maxima find it, and only the few
    values looked at are cast to ``fmt``. The step-by-step loop instead compares the scale with
    a per-step threshold (``_thresholds``)."""

    known = False
    BLOCK = 512

    def __init__(self, g: np.ndarray, fmt: FloatFormat, low: bool = False):
        self.fmt = fmt
        self.low = low  # the loss in fmt (the scale cast to fmt), else a float32 loss
        self.boundary = fmt.overflow_boundary
        with np.errstate(over="ignore", invalid="ignore"):
            a = np.abs(np.asarray(g, dtype=np.float32))  # torch casts through float32
        a[np.isnan(a)] = np.inf  # a NaN gradient overflows at every scale
        self.a = a
        b = self.BLOCK
        pad = (-a.size) % b
        self.block_max = np.concatenate([a, np.zeros(pad, np.float32)]).reshape(-1, b).max(axis=1)
        self._qs = {}

    def _cast(self, x: np.ndarray) -> np.ndarray:
        return _cast_array(self.fmt, x) if self.low else np.asarray(x, np.float64)

    def _scale(self, scale: float) -> float:
        qs = self._qs.get(scale)
        if qs is None:
            qs = self._qs[scale] = abs(_cast_scalar(self.fmt, scale) if self.low else _f32(scale))
        return qs

    def _over(self, qs: float, values: np.ndarray) -> np.ndarray:
        if self.low:
            return _overflowing(qs, self._cast(values), self.boundary)
        return _overflowing32(qs, self._cast(values), self.boundary)

    def first(self, start: int, stop: int, scale: float):
        """The first overflowing step in [start, stop) at ``scale``, or None."""
        if start >= stop:
            return None
        qs = self._scale(scale)
        b, a = self.BLOCK, self.a
        end = min(stop, (start // b + 1) * b)  # the partial block at the start
        hit = self._over(qs, a[start:end])
        if hit.any():
            return start + int(np.argmax(hit))
        if end >= stop:
            return None
        b0, b1 = end // b, (stop - 1) // b  # whole blocks (the last may reach past stop)
        hit = self._over(qs, self.block_max[b0:b1 + 1])
        if not hit.any():
            return None
        lo = (b0 + int(np.argmax(hit))) * b
        hit = self._over(qs, a[lo:min(stop, lo + b)])
        if hit.any():
            return lo + int(np.argmax(hit))
        return None  # that block's largest value lies at or beyond stop

    def mask(self, lo: int, hi: int, scale: float) -> np.ndarray:
        """Which steps of [lo, hi) overflow at ``scale``."""
        return self._over(self._scale(scale), self.a[lo:hi])

    def chunk(self, lo: int, hi: int, scale64: bool) -> np.ndarray:
        """The steps [lo, hi) for the step-by-step loop: each step's threshold (float64)."""
        a = self.a[lo:hi]
        if not self.low:
            return _thresholds32(self.fmt, a, scale64)
        with np.errstate(over="ignore"):  # beyond fp16's range is inf: the point
            if self.fmt is FP16:
                return _fp16_thresholds(scale64)[a.astype(np.float16).view(np.uint16)]
            return _thresholds(self.fmt, self._cast(a), scale64)


_RAMP = np.arange(1, 1, dtype=np.int32)


def _ramp(n: int) -> np.ndarray:
    """1, 2, ..., n (int32), kept between calls: sliders re-simulate the same length."""
    global _RAMP
    if _RAMP.size < n:
        _RAMP = np.arange(1, n + 1, dtype=np.int32)
        _RAMP.flags.writeable = False
    return _RAMP[:n]


# How the simulator divides the work (the trace equals stepping ``adjust`` either way):
_CHUNK = 16384  # steps per chunk of the step-by-step loop (its inputs are prepared per chunk)
_DENSE_GAP = 128  # events this close to the one before, _DENSE_EVENTS times in a row, hand over
_DENSE_EVENTS = 8  # to the step-by-step loop
_SPARSE_EVENTS = 64  # a chunk with fewer events hands back to the event-by-event numpy search
_STRETCH = 256  # a fixed scale is followed to the next growth with numpy when that is this far
_COUNTED = 8  # below this growth interval, or with more events per step than _DENSITY, torch's
_DENSITY = 0.25  # rule runs as a loop over steps


def _array_rounds_to_float32() -> bool:
    """Whether storing a double in an ``array('f')`` rounds it as a C cast does (to nearest even,
    inf beyond float32's range), so the step-by-step loop can round with it."""
    a = array("f", [1e300, -1e300, 2.0**-150, 1 + 2.0**-24, 1 + 3 * 2.0**-24, 3.4028235677973366e38])
    return list(a) == [math.inf, -math.inf, 0.0, 1.0, 1 + 2.0**-22, math.inf]


_FAST_F32 = _array_rounds_to_float32()


class _TraceArrays:
    """The arrays of a trace being filled, and the policy's constants that shape them."""

    def __init__(self, policy: DynamicScaler, st: ScalerState, n: int):
        self.policy = policy
        self.scale = np.empty(n, np.float64 if policy.arithmetic == "float64" else np.float32)
        self.skipped = np.zeros(n, bool)
        self.tracker = np.empty(n, np.int32)  # torch keeps its growth tracker in an int32
        self.fixed_hyst = policy.hysteresis == 1 and st.hysteresis == 1  # never changes
        self.hyst = (np.broadcast_to(np.int32(1), (n,)) if self.fixed_hyst
                     else np.full(n, st.hysteresis, np.int32))

    def step(self, k: int, scale: float, skipped: bool, tracker: int, hyst: int) -> None:
        self.scale[k] = scale
        self.skipped[k] = skipped
        self.tracker[k] = _int32(tracker)
        if not self.fixed_hyst:
            self.hyst[k] = hyst

    def session(self, c0: int, c1: int, s0: float, t0: int, h0: int, evp: array, evs: array,
                runs: list) -> None:
        """Steps [c0, c1) of the step-by-step loop, rebuilt from its events: ``evp`` the steps
        where the state changed (~k for an overflow, k for a growth), ``evs`` the scale after
        each, ``runs`` stretches (a, b, overflowed) of steps that left the state as it was.
        Between events the scale stands still and the tracker counts clean steps; the tracker
        and hysteresis follow from which steps overflowed and which grew."""
        size = c1 - c0
        if size <= 0:
            return
        p = policy = self.policy
        pos = np.frombuffer(evp, np.int64) if len(evp) else np.zeros(0, np.int64)
        over = pos < 0
        pos = np.where(over, ~pos, pos) - c0
        vals = np.frombuffer(evs, self.scale.dtype) if len(evs) else np.zeros(0, self.scale.dtype)
        counts = np.diff(np.concatenate(([0], pos + 1, [size])))
        self.scale[c0:c1] = np.repeat(np.concatenate((np.asarray([s0], self.scale.dtype), vals)), counts)
        sk = np.zeros(size, bool)
        sk[pos[over]] = True
        grew = np.zeros(size, bool)
        grew[pos[~over]] = True
        for a, b, overflowed in runs:
            if isinstance(overflowed, np.ndarray):  # a stretch at a fixed scale, without growth
                sk[a - c0:b - c0] = overflowed
            else:
                (sk if overflowed else grew)[a - c0:b - c0] = True
        self.skipped[c0:c1] = sk
        idx = np.arange(size)
        # the tracker counts clean steps from the last step that reset it: an overflow (to
        # tracker_after_overflow) or a growth (to 0; not with a window)
        if not runs:  # the resets are events: a ramp per stretch between them
            resets = pos if not p.window_scaling else pos[over]
            value = np.where(over, np.int64(p.tracker_after_overflow), np.int64(0))
            value = value if not p.window_scaling else value[over]
            base = np.concatenate(([np.int64(t0) + 1], value - resets))
            counts = np.diff(np.concatenate(([0], resets, [size])))
            self.tracker[c0:c1] = np.repeat(base, counts) + idx
        else:
            reset = sk if p.window_scaling else sk | grew
            last = np.maximum.accumulate(np.where(reset, idx, -1))
            value = np.where(sk, np.int64(p.tracker_after_overflow), np.int64(0))
            tracker = np.where(last >= 0, value[last] + (idx - last), np.int64(t0) + 1 + idx)
            self.tracker[c0:c1] = tracker.astype(np.int32)
        if not self.fixed_hyst:
            refill = ~sk if policy.refill == "clean" else grew
            overflows_so_far = np.cumsum(sk)
            lastr = np.maximum.accumulate(np.where(refill, idx, -1))
            since = overflows_so_far - np.where(lastr >= 0, overflows_so_far[lastr], 0)
            href = np.where(lastr >= 0, np.int64(policy.hysteresis), np.int64(h0))
            self.hyst[c0:c1] = np.maximum(href - since, np.minimum(href, 1))

    def tail(self, i: int, st: ScalerState, stream) -> None:
        """Steps i.. once nothing changes any more: a static scale, or a run that was stopped."""
        self.scale[i:] = np.nan if st.stopped else st.scale
        self.tracker[i:] = _int32(st.growth_tracker)
        if not self.fixed_hyst:
            self.hyst[i:] = st.hysteresis
        self.skipped[i:] = True if st.stopped else stream.mask(i, self.scale.size, st.scale)


def _int32(x: int) -> int:
    """x wrapped to an int32, as torch's int32 growth tracker would hold it."""
    return x if -2**31 <= x < 2**31 else (x + 2**31) % 2**32 - 2**31


def _identical(a: float, b: float) -> bool:
    """a and b are the same float (NaN is NaN; 0.0 is not -0.0)."""
    if a == b:
        return a != 0 or math.copysign(1.0, a) == math.copysign(1.0, b)
    return a != a and b != b


def _run(policy: DynamicScaler, st: ScalerState, n: int, stream) -> ScalerTrace:
    """Steps 0..n-1, each stretch by the cheaper of two methods: where events (overflows and
    growths) are far apart, event by event with numpy searches and fills (``_events``); where they
    come every few steps, step by step in Python (``_steps``). Both equal stepping ``adjust``."""
    if type(policy).adjust is not DynamicScaler.adjust:
        return _run_adjust(policy, st, n, stream)
    out = _TraceArrays(policy, st, n)
    stopped_at = None
    close = near = 0  # events in a row that came within _DENSE_GAP (or the stretch limit) of the last
    limit = _DENSE_GAP if stream.known else 16 * _DENSE_GAP
    i = 0
    while i < n:
        if st.stopped or not policy.dynamic:
            out.tail(i, st, stream)
            break
        if policy.raise_at_zero and st.scale == 0:  # this step divides by the scale: the run ends
            out.step(i, st.scale, True, st.growth_tracker, st.hysteresis)
            st, stopped_at = st._replace(stopped=True), i
            i += 1
            continue
        if close >= _DENSE_EVENTS:
            i, st, stop, _ = _steps(policy, st, i, n, stream, out)
            close = near = 0
        else:
            i, st, stop, gap = _events(policy, st, i, n, stream, out, near >= 4)
            close = close + 1 if gap < _DENSE_GAP else 0
            near = near + 1 if gap < limit else 0
        if stop is not None:
            stopped_at = stop
    reason = None
    if stopped_at is not None:  # the state before that step is the final one, stopped
        found = bool(np.asarray(stream.mask(stopped_at, stopped_at + 1, st.scale))[0])
        reason = policy._stop_reason(st._replace(stopped=False), found)
    return ScalerTrace(policy=policy, scale=out.scale, skipped=out.skipped, growth_tracker=out.tracker,
                       hysteresis=out.hyst, final=st, stopped_at=stopped_at, stop_reason=reason)


def _run_adjust(policy: DynamicScaler, st: ScalerState, n: int, stream) -> ScalerTrace:
    """A subclass that overrides ``adjust`` is stepped through its own ``adjust``, one step at a
    time (the fast paths above are ``DynamicScaler.adjust`` written out)."""
    out = _TraceArrays(policy, st, n)
    out.fixed_hyst, out.hyst = False, np.empty(n, np.int32)  # whatever its adjust does
    scale, skipped, tracker, hyst = out.scale, out.skipped, out.tracker, out.hyst
    stopped_at = reason = None
    scale64 = policy.arithmetic == "float64"
    for lo in range(0, n, _CHUNK):
        hi = min(n, lo + _CHUNK)
        data = stream.chunk(lo, hi, scale64)
        for k in range(lo, hi):
            if st.stopped:
                scale[k], f = np.nan, True
            else:
                scale[k] = st.scale
                f = bool(data[k - lo]) if stream.known else not abs(st.scale) < data[k - lo]
            before = st
            st = policy.adjust(st, f)
            if st.stopped and not before.stopped:
                stopped_at = k
                reason = policy._stop_reason(before, f)
                f = True  # the step that ends the run is not taken
            skipped[k] = f
            tracker[k] = _int32(st.growth_tracker)
            if not out.fixed_hyst:
                hyst[k] = st.hysteresis
    return ScalerTrace(policy=policy, scale=out.scale, skipped=out.skipped, growth_tracker=out.tracker,
                       hysteresis=out.hyst, final=st, stopped_at=stopped_at, stop_reason=reason)


def _events(policy: DynamicScaler, st: ScalerState, i: int, n: int, stream, out: _TraceArrays,
            stretch: bool = False):
    """From step i to the next event (overflow or growth) and through it, with numpy: the clean
    stretch before it is filled with slices (the counters that fairseq's tolerance keeps just
    advance by its length), the event goes through ``policy.adjust``. With ``stretch`` (overflows
    have been coming close together), an overflow after which the scale cannot move is followed
    by the whole stretch at that scale (``_fixed_scale``). Returns (next step, state, step where
    the run stopped or None, the number of clean steps before the event)."""
    scale, skipped, tracker, hyst = out.scale, out.skipped, out.tracker, out.hyst
    counting = policy.tolerance > 0
    to_growth = policy._clean_steps_to_growth(st)
    stop = n if to_growth > n - i else i + int(to_growth)
    j = stream.first(i, stop, st.scale)
    clean_end = stop if j is None else j
    grows = j is None and clean_end - i == to_growth
    plain = clean_end - i - grows  # clean steps that only count
    scale[i:clean_end] = st.scale
    if plain:
        h = policy.hysteresis if policy.refill == "clean" else st.hysteresis
        t = st.growth_tracker
        np.add(_ramp(plain), t if -2**31 <= t < 2**31 else np.int64(t), out=tracker[i:i + plain], casting="unsafe")
        if not out.fixed_hyst:
            hyst[i:i + plain] = h
        st = st._replace(growth_tracker=st.growth_tracker + plain, hysteresis=h,
                         steps_since_rescale=st.steps_since_rescale + plain if counting else 0)
    if grows:
        st = policy._adjust(st, False)
        tracker[clean_end - 1] = _int32(st.growth_tracker)
        if not out.fixed_hyst:
            hyst[clean_end - 1] = st.hysteresis
    gap = clean_end - i
    if j is None:
        return clean_end, st, None, gap
    scale[j] = st.scale
    skipped[j] = True
    st = policy._adjust(st, True)
    tracker[j] = _int32(st.growth_tracker)
    if not out.fixed_hyst:
        hyst[j] = st.hysteresis
    if st.stopped:
        return j + 1, st, j, gap
    k = j + 1
    if not (stretch and k < n and _stretches(policy)) or policy.raise_at_zero and st.scale == 0:
        return k, st, None, gap
    rounds = policy.arithmetic != "float64"
    bf = _f32(policy.backoff_factor) if policy.arithmetic == "float32" else policy.backoff_factor
    if not _cannot_move(policy, st.scale, st.hysteresis, bf, rounds):
        return k, st, None, gap
    # the scale stays until the next growth or backoff: take that stretch at once, looking ahead
    # further while it lasts
    keeps = _backoff_keeps(policy, st.scale, bf, rounds)
    size = _CHUNK // 4
    while k < n:
        e = min(n, k + size)
        g, over, t, h = _fixed_scale(policy, st.scale, st.growth_tracker, st.hysteresis,
                                     np.asarray(stream.mask(k, e, st.scale), bool), keeps)
        if g:
            scale[k:k + g] = st.scale
            skipped[k:k + g] = over
            tracker[k:k + g] = t
            if not out.fixed_hyst:
                hyst[k:k + g] = h
            st = st._replace(growth_tracker=int(t[-1]), hysteresis=int(h[-1]), steps_since_rescale=0)
            k += g
        if k < e:  # the growth or backoff that ends it comes next
            break
        size = min(2 * size, 4 * _CHUNK)
    return k, st, None, gap if k == j + 1 else n


def _steps(policy: DynamicScaler, st: ScalerState, i: int, n: int, stream, out: _TraceArrays):
    """From step i, step by step in Python, chunk by chunk, while events come close together.

    This is ``DynamicScaler.adjust`` written out on local variables. A clean stretch is not
    visited step by step: its first overflow is searched in C (``bytes.find`` on found_inf) or
    compared with per-step thresholds (grad_max). A step that leaves the state as it was (a scale
    at 0, at a floor or ceiling, or refused growth) repeats until the other kind of step comes,
    which is searched the same way; a scale that no backoff moves stays until the next growth,
    found with numpy (``_fixed_scale``). Where every clean step grows and every overflow backs
    off, a shorter loop runs (``_grow_or_back``). Only events are recorded;
    ``_TraceArrays.session`` rebuilds the arrays. Returns as ``_events`` does."""
    p = policy
    bf, gf = p.backoff_factor, p.growth_factor
    if p.arithmetic == "float32":
        bf, gf = _f32(bf), _f32(gf)
    rounds = p.arithmetic != "float64"
    fast = rounds and _FAST_F32
    gi, at_least, tao = p.growth_interval, p.growth_at_least, p.tracker_after_overflow
    full, refill_clean = p.hysteresis, p.refill == "clean"
    lo_clamp, hi_clamp, guard = p.min_scale, p.max_scale, p.inf_guard
    raise_min = p.raise_at_min and lo_clamp is not None
    raise_at, keep_below = p.raise_at_scale, p.no_backoff_below
    raise_zero, raise_inf = p.raise_at_zero, p.raise_at_inf
    tol = p.tolerance
    counting = tol > 0
    windowed = p.window_scaling
    wb, wg = p.backoff_factor, p.growth_factor  # the window follows the unrounded factors
    known = stream.known
    scale64 = p.arithmetic == "float64"
    inf = math.inf
    # every clean step grows and every overflow just backs off: the short loop applies
    plain = (full == 1 and not counting and not windowed and lo_clamp is None and hi_clamp is None
             and keep_below is None and raise_at is None and not raise_zero and not raise_inf and (fast or not rounds)
             and ((gi <= 1 and tao + 1 >= gi) if at_least else (gi == 1 and tao == 0)))
    # torch's rule where events come at most steps (a short growth interval, or runs of overflows
    # at a scale that moves): a loop over steps beats one over events
    counted = (full == 1 and not counting and not windowed and lo_clamp is None and hi_clamp is None
               and keep_below is None and raise_at is None and not raise_zero and not raise_inf
               and (fast or not rounds) and gi > 1)
    density = 0.0  # events per step in the last chunk
    # a scale that cannot move is followed to the next growth with numpy (see _fixed_scale)
    stretches = _stretches(p)
    # one correctly rounded multiplication per update, in the scale's own type (numpy can repeat it)
    exact = math.isfinite(gf) and math.isfinite(bf) and (
        scale64 or p.arithmetic == "float32" or (_f32(gf) == gf and _f32(bf) == bf))
    s, t, h, _, ov, sr, w = st
    size = _CHUNK // 8  # the first chunk is short: events may thin out soon
    while i < n:
        e = min(n, i + size)
        size = min(2 * size, _CHUNK)
        data = stream.chunk(i, e, scale64)
        if plain and h == 1 and (t + 1 >= gi if at_least else t == 0):
            s = _grow_or_back(s, i, e, data, known, gf, bf, guard, scale64, exact, out, tao)
            t = tao if out.skipped[e - 1] else 0
            ov = sr = 0
            i = e
            continue
        if counted and h == 1 and (gi < _COUNTED or density > _DENSITY):
            s, t = _count_steps(s, t, i, e, data, known, gf, bf, gi, at_least, tao, guard, scale64, out)
            ov = sr = 0
            overflowed = int(np.count_nonzero(out.skipped[i:e]))
            density = (overflowed + (e - i - overflowed) / gi) / (e - i)  # about: growths not counted
            i = e
            continue
        if known:
            flags = data
            over_at = None

            def next_over(a, b, s, flags=flags, base=i):
                j = flags.find(1, a - base, b - base)
                return b if j < 0 else j + base

            def next_clean(a, b, s, flags=flags, base=i):
                j = flags.find(0, a - base, b - base)
                return b if j < 0 else j + base
        else:
            thr = data
            ta = array("d")
            ta.frombytes(thr.tobytes())

            def over_at(a, b, s, thr=thr, base=i):
                return np.ones(b - a, bool) if s != s else thr[a - base:b - base] <= abs(s)

            def next_over(a, b, s, thr=thr, ta=ta, base=i):
                if s != s:
                    return a
                sa = abs(s)
                if b - a <= 24:
                    for q in range(a - base, b - base):
                        if ta[q] <= sa:
                            return q + base
                    return b
                m = thr[a - base:b - base] <= sa
                j = int(np.argmax(m))
                return a + j if m[j] else b

            def next_clean(a, b, s, thr=thr, base=i):
                if s != s:
                    return b
                m = thr[a - base:b - base] > abs(s)
                j = int(np.argmax(m))
                return a + j if m[j] else b
        s0, t0, h0, i0 = s, t, h, i
        evp, evs, runs = array("q"), array("d" if scale64 else "f"), []
        put_pos, put_scale = evp.append, evs.append
        fb = array("f")
        f32 = fb.append
        k = i
        stop = None
        while k < e:
            if flags[k - i] if known else not -(x := ta[k - i]) < s < x:
                # ----- an overflow at step k (DynamicScaler.adjust, found_inf=True)
                if raise_inf and not -inf < s < inf:
                    stop = k
                    break
                if counting:
                    o2, s2 = ov + 1, sr + 1
                else:
                    o2 = s2 = 0
                if h > 1:  # tolerated: skip the step, keep the scale
                    ns, nh, nw = s, h - 1, w
                elif counting and not o2 / s2 >= tol:  # below tolerance: keep the scale
                    ns, nh, nw = s, h, w
                else:
                    if raise_min and s == lo_clamp:
                        stop = k
                        break
                    if fast:
                        f32(s * bf)
                        ns = fb[-1]
                    elif rounds:
                        ns = _f32(s * bf)
                    else:
                        ns = s * bf
                    if lo_clamp is not None:
                        ns = max(ns, lo_clamp)
                    if keep_below is not None and ns < keep_below:
                        ns = s
                    nh, o2, s2 = h, 0, 0
                    nw = w
                    if windowed and w >= 1:  # DynamicScaler._resized
                        nw = w * wb
                        nw = 1 if not nw >= 1 else int(nw) if -inf < nw < inf else w
                if raise_at is not None and ns <= raise_at:
                    stop = k
                    break
                put_pos(~k)
                put_scale(ns)
                same = ((ns == s or ns != ns) and t == tao and nh == h and nw == w and o2 == ov and s2 == sr
                        and _identical(ns, s))
                s, t, h, w, ov, sr = ns, tao, nh, nw, o2, s2
                k += 1
                if raise_zero and s == 0 and k < n:  # the next step divides by the scale: the run ends
                    stop = k
                    break
                if k < e:
                    if same:  # every overflow from here leaves the state as it is
                        j = next_clean(k, e, s)
                        if j > k:
                            runs.append((k, j, True))
                            k = j
                    elif stretches and _cannot_move(p, s, h, bf, rounds):
                        over = np.frombuffer(flags, bool)[k - i:] if known else over_at(k, e, s)
                        g, over, tracker, hyst = _fixed_scale(p, s, t, h, over, _backoff_keeps(p, s, bf, rounds))
                        if g:
                            runs.append((k, k + g, over))
                            t, h = int(tracker[-1]), int(hyst[-1])
                            k += g
                        if g < _STRETCH // 4:  # short: not worth looking for more in this chunk
                            stretches = False
                continue
            # ----- a clean step k: d clean steps in a row reach the next growth
            if windowed:
                d = (w - t if t < 0 else w - t % w) if w >= 1 else inf
            elif t < gi:
                d = gi - t
            else:
                d = 1 if at_least else inf
            if d > 1:  # steps k.. only count, up to the next overflow or the growth step
                g = k + d - 1
                j = next_over(k + 1, g if g < e else e, s)
                t += j - k
                if counting:
                    sr += j - k
                if refill_clean:
                    h = full
                k = j
                continue
            # ----- step k grows (DynamicScaler.adjust, found_inf=False)
            if fast:
                f32(s * gf)
                ns = fb[-1]
            elif rounds:
                ns = _f32(s * gf)
            else:
                ns = s * gf
            if hi_clamp is not None:
                ns = min(ns, hi_clamp)
            if guard and not -inf < ns < inf:
                ns = s
            if windowed:
                nt, nw = t + 1, w
                if w >= 1:  # DynamicScaler._resized
                    nw = w * wg
                    nw = 1 if not nw >= 1 else int(nw) if -inf < nw < inf else w
            else:
                nt, nw = 0, 0
            put_pos(k)
            put_scale(ns)
            same = (ns == s or ns != ns) and nt == t and full == h and nw == w and sr == 0 and _identical(ns, s)
            s, t, h, w, sr = ns, nt, full, nw, 0
            k += 1
            if raise_zero and s == 0 and k < n:  # a ceiling of 0: the next step divides by it
                stop = k
                break
            if same and k < e:  # every clean step from here grows to the same state
                j = next_over(k, e, s)
                if j > k:
                    runs.append((k, j, False))
                    k = j
        out.session(i, k, s0, t0, h0, evp, evs, runs)
        density = len(evp) / max(k - i, 1)
        if stop is not None:
            out.step(stop, s, True, t, h)
            return stop + 1, ScalerState(s, t, h, True, ov, sr, w), stop, False
        # few events, and no long stretch taken at once: the event-by-event search is cheaper
        covered = sum(b - a for a, b, _ in runs)
        i = k
        if len(evp) < _SPARSE_EVENTS * (e - i0) // _CHUNK and 2 * covered < e - i0:
            break
    return i, ScalerState(s, t, h, False, ov, sr, w), None, False


def _backoff_keeps(p: DynamicScaler, s: float, bf: float, rounds: bool) -> bool:
    """Whether a backoff at scale s leaves it exactly as it is (0, a floor, a subnormal fixed point,
    NaN), and ends nothing (no raise at this scale)."""
    if p.raise_at_min and p.min_scale is not None and s == p.min_scale:
        return False
    if _overflow_ends(p, s) or p.raise_at_zero and s == 0:
        return False
    ns = _f32(s * bf) if rounds else s * bf
    if p.min_scale is not None:
        ns = max(ns, p.min_scale)
    if p.no_backoff_below is not None and ns < p.no_backoff_below:
        ns = s
    return _identical(ns, s)


def _fixed_scale(p: DynamicScaler, s: float, t: int, h: int, over: np.ndarray, keeps: bool):
    """Steps after an overflow (tracker t, hysteresis h after it) while the scale s cannot move:
    up to the next growth, and the next overflow that backs off (unless ``keeps``: a backoff at s
    leaves it) or ends the run. ``over`` says which of the steps ahead overflow at s; the
    tracker and hysteresis then follow with numpy. Returns (how many steps the stretch has, and
    for each of them whether it overflowed, the tracker and the hysteresis after it)."""
    size = over.size
    idx = np.arange(size)
    last = np.maximum.accumulate(np.where(over, idx, -1))
    tracker = np.where(last >= 0, np.int64(p.tracker_after_overflow) + (idx - last), np.int64(t) + 1 + idx)
    end = ~over & ((tracker >= p.growth_interval) if p.growth_at_least else (tracker == p.growth_interval))
    # the hysteresis after each step, without growth (it is refilled by clean steps or at growth)
    refill = ~over if p.refill == "clean" else np.zeros(size, bool)
    overflows = np.cumsum(over)
    lastr = np.maximum.accumulate(np.where(refill, idx, -1))
    since = overflows - np.where(lastr >= 0, overflows[np.maximum(lastr, 0)], 0)
    start = np.where(lastr >= 0, np.int64(p.hysteresis), np.int64(h))
    hyst = np.maximum(start - since, np.minimum(start, 1))
    before = np.concatenate(([h], hyst[:-1]))
    if _overflow_ends(p, s):
        end |= over  # any overflow here ends the run
    elif not keeps:
        end |= over & (before <= 1)  # this overflow backs off (or ends the run)
    g = int(np.argmax(end)) if end.any() else size
    return g, over[:g], tracker[:g], hyst[:g]


def _overflow_ends(p: DynamicScaler, s: float) -> bool:
    """Whether any overflow at scale s ends the run, hysteresis or tolerance notwithstanding (an
    overflow that keeps the scale leaves it at or below ``raise_at_scale``; an infinite or NaN
    scale with ``raise_at_inf``)."""
    return (p.raise_at_scale is not None and s <= p.raise_at_scale) or (p.raise_at_inf and not -math.inf < s < math.inf)


def _stretches(p: DynamicScaler) -> bool:
    """Whether a scale that cannot move is worth following with numpy: no tolerance counters or
    window (they change at every step), and growth far enough away from an overflow."""
    if p.tolerance > 0 or p.window_scaling:
        return False
    gi, tao = p.growth_interval, p.tracker_after_overflow
    to_growth = max(gi - tao, 1) if p.growth_at_least else (gi - tao if tao < gi else math.inf)
    return to_growth >= _STRETCH


def _cannot_move(p: DynamicScaler, s: float, h: int, bf: float, rounds: bool) -> bool:
    """After an overflow, whether the next overflows may leave the scale s as it is: hysteresis
    absorbs them, or a backoff at s gives s again."""
    return h > 1 or (p.refill == "clean" and p.hysteresis > 1) or _backoff_keeps(p, s, bf, rounds)


def _count_steps(s: float, t: int, i: int, e: int, steps, known: bool, gf: float, bf: float, gi: int,
                 at_least: bool, tao: int, guard: bool, scale64: bool, out: _TraceArrays):
    """Steps [i, e) of torch's rule (no hysteresis, floor or ceiling) with a short growth
    interval: events come every few steps, so a loop over steps that keeps just the scale and the
    tracker is cheaper than one over events. Writes the trace; returns (scale, tracker) after."""
    inf = math.inf
    first = s
    new = array("d" if scale64 else "f")  # appending a double to an array("f") rounds it to float32
    put = new.append
    counts = array("q")
    count = counts.append
    if not known:
        thresholds = array("d")
        thresholds.frombytes(steps.tobytes())
        steps = thresholds
    for x in steps:
        if (not x) if known else -x < s < x:  # a clean step
            t += 1
            if t == gi or at_least and t > gi:
                put(s * gf)
                t = 0
                if guard and not -inf < new[-1] < inf:
                    new[-1] = s  # refused: the old scale stays
                else:
                    s = new[-1]
            else:
                put(s)
        else:
            put(s * bf)
            s = new[-1]
            t = tao
        count(t)
    _write_loop(out, i, e, first, new, steps, known)
    out.tracker[i:e] = np.frombuffer(counts, np.int64)
    return s, t


def _write_loop(out: _TraceArrays, i: int, e: int, first: float, new, steps, known: bool) -> np.ndarray:
    """Steps [i, e) of a loop that kept only the scale after each step (``new``, an array of the
    scale's type) into the trace: the scale before each step, whether it overflowed (``steps``:
    a byte per step, or each step's threshold) and hysteresis 1. Returns the skipped flags."""
    scale = out.scale[i:e]
    scale[0] = first
    scale[1:] = np.frombuffer(new, scale.dtype)[:-1]
    skipped = out.skipped[i:e]
    if known:
        skipped[:] = np.frombuffer(steps, bool)
    else:
        skipped[:] = ~(np.abs(scale.astype(np.float64)) < np.frombuffer(steps, np.float64))
    if not out.fixed_hyst:
        out.hyst[i:e] = 1
    return skipped


def _grow_or_back(s: float, i: int, e: int, steps, known: bool, gf: float, bf: float, guard: bool,
                  scale64: bool, exact: bool, out: _TraceArrays, tao: int) -> float:
    """Steps [i, e) where every clean step grows and every overflow backs off: the growth
    tracker is 0 or ``tracker_after_overflow`` after each step and the hysteresis 1, so the scale
    is the whole state, and this loop computes just that. ``steps`` holds one byte per step
    (found_inf) or the thresholds (grad_max). With ``exact`` (float64 arithmetic, or factors
    that are float32 values, so each update is one correctly rounded multiplication in the
    scale's own type), known steps need no loop: numpy's running product (``multiply.accumulate``
    multiplies in order, rounding each product) gives the same scales. Writes the trace;
    returns the last scale."""
    inf = math.inf
    first = s
    dtype = out.scale.dtype
    if known and exact and (scale64 or _f32(s) == s or s != s):  # known steps: a running product
        factors = np.where(np.frombuffer(steps, bool), dtype.type(bf), dtype.type(gf))
        after = np.multiply.accumulate(np.concatenate(([dtype.type(s)], factors)))[1:]
        # a growth to inf that the guard refuses breaks the product: then step by step
        if not guard or np.isfinite(after).all() or not math.isfinite(s) and not np.isfinite(after).any():
            scale = out.scale[i:e]
            scale[0] = first
            scale[1:] = after[:-1]
            skipped = out.skipped[i:e]
            skipped[:] = np.frombuffer(steps, bool)
            out.tracker[i:e] = np.where(skipped, np.int32(tao), np.int32(0))
            if not out.fixed_hyst:
                out.hyst[i:e] = 1
            return float(after[-1])
    new = array("d" if scale64 else "f")  # appending a double to an array("f") rounds it to float32
    put = new.append
    if known:
        for f in steps:
            if f:
                put(s * bf)
                s = new[-1]
            else:
                put(s * gf)
                if guard and not -inf < new[-1] < inf:
                    new[-1] = s  # refused: the old scale stays
                else:
                    s = new[-1]
    else:
        thresholds = array("d")
        thresholds.frombytes(steps.tobytes())
        for x in thresholds:
            if -x < s < x:
                put(s * gf)
                if guard and not -inf < new[-1] < inf:
                    new[-1] = s
                else:
                    s = new[-1]
            else:
                put(s * bf)
                s = new[-1]
    skipped = _write_loop(out, i, e, first, new, steps, known)
    out.tracker[i:e] = np.where(skipped, np.int32(tao), np.int32(0))
    return s
