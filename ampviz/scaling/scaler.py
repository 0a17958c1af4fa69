"""The loss scaler itself: ``ScalerState`` (where a scaler stands between two steps) and
``DynamicScaler`` (the configurable state machine whose ``adjust`` gives the next state), with the
arithmetic that rounds the scale as each framework stores it (``_mul``) and the check of a
starting state (``_check_state``). The frameworks' configurations are the ``presets_*`` modules.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import struct
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ampviz._args import _shown


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
