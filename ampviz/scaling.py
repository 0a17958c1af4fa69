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

Speed: the state only changes at overflows and growths, so ``simulate`` works per event, not per
step: between events it fills the trace with numpy slices (the counters that fairseq's tolerance
keeps just advance by the length of the clean stretch).

This module needs numpy only.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ampviz.formats import FP16, FloatFormat, get_format

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
    overflow backs off); ``stopped`` is true once a scaler that raises at its minimum scale has
    ended the run. ``overflows_since_rescale`` (overflows since the last backoff) and
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
      back off while the scale is already at ``min_scale`` ends the run (DeepSpeed ZeRO).
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
    source: str = field(default="", compare=False)

    def __post_init__(self):
        """Reject what torch's GradScaler rejects (and types it would fail on later); accept the
        rest, odd values included (a backoff of 0, a NaN factor, an infinite initial scale), so
        that their consequences can be shown. The ScalerLab checks its sliders more strictly."""
        errors = []
        if self.arithmetic not in ARITHMETIC:
            errors.append(f"arithmetic must be one of {', '.join(ARITHMETIC)}, not {self.arithmetic!r}")
        if self.refill not in ("growth", "clean"):
            errors.append(f"refill must be 'growth' or 'clean', not {self.refill!r}")
        if isinstance(self.growth_interval, bool) or not isinstance(self.growth_interval, (int, np.integer)):
            errors.append(f"growth_interval must be a whole number of steps, not {self.growth_interval!r}")
        if isinstance(self.hysteresis, bool) or not isinstance(self.hysteresis, (int, np.integer)) \
                or self.hysteresis < 1:
            errors.append(f"hysteresis must be a whole number >= 1, not {self.hysteresis!r}")
        for name in ("init_scale", "growth_factor", "backoff_factor", "tolerance"):
            if not _number(getattr(self, name)):
                errors.append(f"{name} must be a number, not {getattr(self, name)!r}")
        for name in ("min_scale", "max_scale", "raise_at_scale", "no_backoff_below"):
            if getattr(self, name) is not None and not _number(getattr(self, name)):
                errors.append(f"{name} must be a number or None, not {getattr(self, name)!r}")
        if not errors and self.dynamic:
            if self.growth_factor <= 1.0:  # torch: "The growth factor must be > 1.0."
                errors.append(f"growth_factor must be > 1.0, not {self.growth_factor!r}")
            if self.backoff_factor >= 1.0:  # torch: "The backoff factor must be < 1.0."
                errors.append(f"backoff_factor must be < 1.0, not {self.backoff_factor!r}")
        if not errors and self.arithmetic != "float64" and math.isfinite(self.init_scale) \
                and abs(self.init_scale) > _FLT_MAX:
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
        """The state after one step that did (``found_inf``) or did not overflow."""
        if state.stopped or not self.dynamic:
            return state
        counting = self.tolerance > 0  # fairseq's tolerance counters
        if found_inf:
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
                if self.raise_at_min and self.min_scale is not None and state.scale <= self.min_scale:
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
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


_FLT_MAX = float(np.finfo(np.float32).max)


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
    return DynamicScaler(name=f"static {scale:g}", init_scale=scale, dynamic=False, growth_interval=0,
                         arithmetic="float64", source="a fixed scale, e.g. Apex loss_scale=128")


# ------------------------------------------------------------------ framework presets
# Each preset is a DynamicScaler configured as one framework's scaler, with that framework's
# defaults. Parameters use torch's names; each docstring gives the framework's own. The rules, as
# read from each project's source, are collected in the design notes on loss scalers, and
# tests/test_presets.py checks every preset against a plain transcription of its rule.

def ApexAmpScaler(init_scale=2.0**16, growth_interval=2000, min_scale=None, max_scale=2.0**24) -> DynamicScaler:
    """Apex's legacy ``amp`` ``LossScaler`` (``amp.initialize`` with opt_level O1 or O2).

    Source: ``NVIDIA/apex: apex/amp/scaler.py`` at ``cb65b8ed^`` (``amp`` was removed in
    ``cb65b8ed``). Rule: an overflow halves the scale (not below ``min_loss_scale`` when one is set)
    and resets the count of unskipped steps; the ``scale_window``-th unskipped step in a row doubles
    it, capped at ``max_loss_scale``. The factors are hard-coded (``scale_factor`` is stored but
    unused), the scale is a Python float, and it starts at ``min(max_loss_scale, init_scale)``.
    Apex's names: ``init_scale``, ``scale_window`` (growth_interval), ``min_loss_scale`` (None or 0:
    no floor), ``max_loss_scale``.
    """
    return DynamicScaler(
        name="apex amp", init_scale=min(max_scale, init_scale), growth_interval=growth_interval,
        min_scale=min_scale or None, max_scale=max_scale, inf_guard=False, arithmetic="float64",
        source="NVIDIA/apex@cb65b8ed^: apex/amp/scaler.py (LossScaler.update_scale), apex/amp/frontend.py",
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
                        consecutive_hysteresis=False, raise_at_min=True, *, config_defaults=True) -> DynamicScaler:
    """DeepSpeed's ``DynamicLossScaler`` as ZeRO stages 1-3 build it.

    Source: ``microsoft/DeepSpeed@38327e07: deepspeed/runtime/fp16/loss_scaler.py``
    (``DynamicLossScaler.update_scale``, ``CreateLossScaler``), with ``runtime/config.py``
    (``get_dynamic_loss_scale_args``). Rule: an overflow while hysteresis is left only uses one up
    (skip, scale kept); otherwise it halves the scale, not below ``min_loss_scale``, and if the
    scale is already at the minimum it raises ("Current loss scale already at minimum", which ends
    the run: ``ScalerState.stopped``). Growth: x2 when ``(iteration - last_overflow) % window == 0``
    (the ``window``-th clean step after an overflow or growth), refilling the hysteresis (on every
    clean step instead with ``consecutive_hysteresis``). No inf guard; the scale is a Python float.

    ``config_defaults=True``: the ``fp16`` config defaults (``initial_scale_power`` 16,
    ``loss_scale_window`` 1000, ``hysteresis`` 2, ``min_loss_scale`` 1). DeepSpeed passes these only
    when one of those keys is in the ``fp16`` block; with just ``{"enabled": true}`` it uses the
    class defaults instead (``init_scale=2**32``, hysteresis ``delayed_shift=1``):
    ``config_defaults=False``. Given arguments override either. (The raise tests
    ``scale == min``: the same as here for ``init_scale >= min_scale``.)
    """
    if init_scale is None:
        init_scale = 2.0**16 if config_defaults else 2.0**32
    if hysteresis is None:
        hysteresis = 2 if config_defaults else 1
    return DynamicScaler(
        name="DeepSpeed ZeRO" if config_defaults else "DeepSpeed ZeRO (class defaults)",
        init_scale=init_scale, growth_interval=growth_interval, hysteresis=hysteresis,
        refill="clean" if consecutive_hysteresis else "growth", min_scale=min_scale,
        raise_at_min=raise_at_min, inf_guard=False, arithmetic="float64",
        source="microsoft/DeepSpeed@38327e07: deepspeed/runtime/fp16/loss_scaler.py (DynamicLossScaler, "
               "CreateLossScaler), runtime/config.py (get_dynamic_loss_scale_args), runtime/constants.py",
    )


def DeepSpeedScaler(init_scale=2.0**16, growth_interval=1000, min_scale=1.0) -> DynamicScaler:
    """DeepSpeed without ZeRO: ``FP16_Optimizer`` / ``FP16_UnfusedOptimizer``'s own ``_update_scale``.

    Source: ``microsoft/DeepSpeed: deepspeed/runtime/fp16/fused_optimizer.py`` (lines 385-407) and
    ``unfused_optimizer.py`` (275-297). Rule: an overflow halves the scale, not below
    ``min_loss_scale``; a clean step doubles it when ``stable = iteration - last_overflow - 1`` is
    positive and a multiple of the window. That is the window-th clean step after a growth but the
    (window+1)-th after an overflow or at the start: the growth tracker starts, and restarts after
    an overflow, at -1. There is no hysteresis (the config's ``hysteresis`` is ignored), no raise,
    no inf guard. The scale is a Python number: the int ``2**initial_scale_power`` doubled by the int
    2 until the first backoff makes it a float, which float64 follows exactly below 2**1024.
    Defaults: ``initial_scale_power`` 16, window 1000, min 1.
    """
    return DynamicScaler(
        name="DeepSpeed", init_scale=init_scale, growth_interval=growth_interval, min_scale=min_scale,
        tracker_after_overflow=-1, inf_guard=False, arithmetic="float64",
        source="microsoft/DeepSpeed: deepspeed/runtime/fp16/fused_optimizer.py:385-407 (FP16_Optimizer._update_scale), "
               "unfused_optimizer.py:275-297",
    )


def MegatronScaler(init_scale=2.0**32, min_scale=1.0, growth_interval=1000, hysteresis=2) -> DynamicScaler:
    """Megatron-LM's ``DynamicGradScaler`` with the optimizer factory's settings.

    Source: ``NVIDIA/Megatron-LM@00caa53a: megatron/core/optimizer/grad_scaler.py``; defaults from
    ``optimizer_config.py@0075637c`` (``--initial-loss-scale 2**32 --min-loss-scale 1.0
    --loss-scale-window 1000 --hysteresis 2``; factors 2 and 0.5). Rule: an overflow resets the
    growth tracker and uses up one unit of hysteresis; once none is left it backs off,
    ``max(scale * 0.5, min_scale)``. The ``loss_scale_window``-th clean step in a row doubles the
    scale and refills the hysteresis (only there). No inf guard, no maximum; the scale, factors
    and minimum are float32 tensors.
    """
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
    if not (_number(growth_factor) and growth_factor > 1 and math.frexp(growth_factor)[0] == 0.5):
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
    guard; the scale is a Python float.

    fairseq's names: ``--fp16-init-scale``, ``--fp16-scale-window`` (growth_interval),
    ``--fp16-scale-tolerance``, ``--threshold-loss-scale`` (min_scale, a floor),
    ``--min-loss-scale`` (raise_at_scale). ``cli_defaults=True``: the command line's 2**7 and a
    window of ``int(2**14 / world_size / update_freq)``; False: the class's 2**15 and 2000.
    """
    if init_scale is None:
        init_scale = 2.0**7 if cli_defaults else 2.0**15
    if growth_interval is None:
        growth_interval = int(2**14 / world_size / update_freq) if cli_defaults else 2000
    return DynamicScaler(
        name="fairseq" if cli_defaults else "fairseq (class defaults)", init_scale=init_scale,
        growth_interval=growth_interval, tolerance=tolerance, min_scale=min_scale,
        raise_at_scale=raise_at_scale, inf_guard=False, arithmetic="float64",
        source="facebookresearch/fairseq@0d77035e: fairseq/optim/dynamic_loss_scaler.py, "
               "fairseq/optim/fp16_optimizer.py, fairseq/dataclass/configs.py",
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
    ``min_loss_scale`` (no_backoff_below).
    """
    return DynamicScaler(
        name="metaseq", init_scale=init_scale, growth_interval=growth_interval, tolerance=tolerance,
        min_scale=min_scale, no_backoff_below=no_backoff_below, window_scaling=True, inf_guard=False,
        arithmetic="float64",
        source="facebookresearch/metaseq@0ba5657a: metaseq/optim/dynamic_loss_scaler.py",
    )


PRESETS = {p.name: p for p in (
    TorchGradScaler(), ApexAmpScaler(), ApexHysteresisScaler(), DeepSpeedZeroScaler(),
    DeepSpeedZeroScaler(config_defaults=False), DeepSpeedScaler(), MegatronScaler(), KerasScaler(),
    Keras3Scaler(), JmpScaler(), FairseqScaler(), MetaseqScaler(), StaticScaler(),
)}


# ------------------------------------------------------------------ overflow model
def overflows(scale, grad_max, fmt: FloatFormat | str = FP16) -> np.ndarray:
    """Whether a step whose largest unscaled gradient is ``grad_max`` overflows at ``scale``.

    The model of torch's backward in a low-precision region: the incoming gradient is the scale
    cast to ``fmt``, multiplied by the gradient cast to ``fmt``, rounded to ``fmt``:
    ``f16(f16(scale) * f16(g))``. It overflows when that is inf or NaN; by monotone rounding the
    largest |g| decides for a whole tensor. The product of two fp16 (or bf16, fp32) values is exact
    in float64, so only its final rounding matters: |product| >= ``fmt.overflow_boundary``.
    """
    fmt = get_format(fmt)
    if fmt.specials != "ieee":
        raise ValueError(
            f"{fmt.name} saturates at {fmt.max:g} instead of overflowing to inf, so a loss scaler "
            "never sees an overflow there; choose a format with inf such as fp16")
    qs = np.abs(np.asarray(fmt.quantize(scale), dtype=np.float64))
    qg = np.abs(np.asarray(fmt.quantize(np.asarray(grad_max, dtype=np.float64)), dtype=np.float64))
    with np.errstate(invalid="ignore", over="ignore"):
        return ~(qs * qg < fmt.overflow_boundary)  # NaN (0 * inf, NaN input) counts as overflow


# ------------------------------------------------------------------ traces
@dataclass(frozen=True, eq=False)
class ScalerTrace:
    """A simulated run, one entry per step.

    ``scale``: the scale in effect at each step, before that step's update (float32 for torch
    arithmetic, float64 otherwise; NaN after a run was stopped); ``skipped``: the step overflowed
    (or came after the run was stopped); ``growth_tracker`` and ``hysteresis``: the state after
    each step's update; ``stopped_at``: the step at which a scaler that raises at its minimum
    ended the run, or None.
    """

    policy: DynamicScaler
    scale: np.ndarray
    skipped: np.ndarray
    growth_tracker: np.ndarray
    hysteresis: np.ndarray
    final: ScalerState
    stopped_at: int | None = None

    @property
    def steps(self) -> int:
        return int(self.scale.size)

    @property
    def skipped_count(self) -> int:
        return int(self.skipped.sum())

    def __repr__(self) -> str:
        return (f"ScalerTrace({self.policy.name}: {self.steps} steps, {self.skipped_count} skipped, "
                f"scale {self.scale[0] if self.steps else float('nan'):g} -> "
                f"{self.scale[-1] if self.steps else float('nan'):g}"
                + (f", stopped at step {self.stopped_at}" if self.stopped_at is not None else "") + ")")


def _check_stream(name: str, values, dtype) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, one entry per step (got shape {arr.shape})")
    if dtype is bool and arr.dtype != bool:
        if arr.dtype.kind not in "iub":
            raise TypeError(f"found_inf must be booleans (one per step), got {arr.dtype}")
        arr = arr != 0
    return arr


def simulate(policy: DynamicScaler, *, found_inf=None, grad_max=None, fmt=FP16,
             state: ScalerState | None = None) -> ScalerTrace:
    """Run ``policy`` over a stream of steps.

    Give exactly one of ``found_inf`` (bool per step: the step overflowed) or ``grad_max`` (the
    largest unscaled |gradient| per step: the step overflows when ``overflows(scale, g, fmt)`` at
    the scale of that step). ``state`` starts from a given state instead of the initial one.
    """
    if (found_inf is None) == (grad_max is None):
        raise ValueError("give exactly one of found_inf (bool per step) or grad_max (max |gradient| per step)")
    if not isinstance(policy, DynamicScaler):
        raise TypeError(f"policy must be a DynamicScaler (e.g. TorchGradScaler()), got {policy!r}")
    st = policy.initial_state() if state is None else state
    if found_inf is not None:
        flags = _check_stream("found_inf", found_inf, bool)
        n = flags.size
        events = np.flatnonzero(flags)
        next_overflow = _FixedOverflows(events)
    else:
        g = _check_stream("grad_max", grad_max, float)
        n = g.size
        next_overflow = _ScaleDependentOverflows(g, get_format(fmt))
    with np.errstate(over="ignore", invalid="ignore"):
        return _run(policy, st, n, next_overflow)


class _FixedOverflows:
    """Overflow steps known in advance."""

    def __init__(self, events: np.ndarray):
        self.events = events
        self.k = 0

    def first(self, start: int, stop: int, scale: float):
        ev, k = self.events, self.k
        while k < ev.size and ev[k] < start:
            k += 1
        self.k = k
        if k < ev.size and ev[k] < stop:
            return int(ev[k])
        return None


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
    values looked at are cast to ``fmt``."""

    BLOCK = 512

    def __init__(self, g: np.ndarray, fmt: FloatFormat):
        self.fmt = fmt
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
        if self.fmt is FP16:  # numpy's own float32 -> float16 cast rounds exactly as torch's
            return x.astype(np.float16).astype(np.float64)
        return np.asarray(self.fmt.quantize(x), dtype=np.float64)

    def _over(self, qs: float, values: np.ndarray) -> np.ndarray:
        """(Called under np.errstate: overflow and 0 * inf are the point.)"""
        return ~(qs * self._cast(values) < self.boundary)

    def first(self, start: int, stop: int, scale: float):
        if start >= stop:
            return None
        qs = self._qs.get(scale)
        if qs is None:
            qs = self._qs[scale] = abs(_cast_scalar(self.fmt, scale))
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


_RAMP = np.arange(1, 1, dtype=np.int32)


def _ramp(n: int) -> np.ndarray:
    """1, 2, ..., n (int32), kept between calls: sliders re-simulate the same length."""
    global _RAMP
    if _RAMP.size < n:
        _RAMP = np.arange(1, n + 1, dtype=np.int32)
        _RAMP.flags.writeable = False
    return _RAMP[:n]


def _run(policy: DynamicScaler, st: ScalerState, n: int, next_overflow) -> ScalerTrace:
    """Event by event: clean stretches are numpy fills, overflows and growths go through
    ``policy.adjust``, so the trace equals stepping ``adjust`` once per step."""
    scale = np.empty(n, np.float64 if policy.arithmetic == "float64" else np.float32)
    skipped = np.zeros(n, bool)
    tracker = np.empty(n, np.int32)  # torch keeps its growth tracker in an int32
    fixed_hyst = policy.hysteresis == 1 and st.hysteresis == 1  # never changes
    hyst = np.broadcast_to(np.int32(1), (n,)) if fixed_hyst else np.full(n, st.hysteresis, np.int32)
    ramp = _ramp(n)
    refill_clean = policy.refill == "clean"
    counting = policy.tolerance > 0
    stopped_at = None
    i = 0
    while i < n:
        if st.stopped or not policy.dynamic:
            # nothing changes any more: a static scale, or a run that was stopped
            scale[i:] = np.nan if st.stopped else st.scale
            tracker[i:] = st.growth_tracker
            if not fixed_hyst:
                hyst[i:] = st.hysteresis
            if st.stopped:
                skipped[i:] = True
            else:
                j = next_overflow.first(i, n, st.scale)
                while j is not None:
                    skipped[j] = True
                    j = next_overflow.first(j + 1, n, st.scale)
            break
        to_growth = policy._clean_steps_to_growth(st)
        stop = n if to_growth > n - i else i + int(to_growth)
        j = next_overflow.first(i, stop, st.scale)
        clean_end = stop if j is None else j
        grows = j is None and clean_end - i == to_growth
        plain = clean_end - i - grows  # clean steps that only count
        scale[i:clean_end] = st.scale
        if plain:
            h = policy.hysteresis if refill_clean else st.hysteresis
            np.add(ramp[:plain], st.growth_tracker, out=tracker[i:i + plain], casting="unsafe")
            if not fixed_hyst:
                hyst[i:i + plain] = h
            st = st._replace(growth_tracker=st.growth_tracker + plain, hysteresis=h,
                             steps_since_rescale=st.steps_since_rescale + plain if counting else 0)
        if grows:
            st = policy.adjust(st, False)
            tracker[clean_end - 1] = st.growth_tracker
            if not fixed_hyst:
                hyst[clean_end - 1] = st.hysteresis
        if j is None:
            i = clean_end
            continue
        scale[j] = st.scale
        skipped[j] = True
        st = policy.adjust(st, True)
        if st.stopped:
            stopped_at = j
        tracker[j] = st.growth_tracker
        if not fixed_hyst:
            hyst[j] = st.hysteresis
        i = j + 1
    return ScalerTrace(policy=policy, scale=scale, skipped=skipped, growth_tracker=tracker,
                       hysteresis=hyst, final=st, stopped_at=stopped_at)
