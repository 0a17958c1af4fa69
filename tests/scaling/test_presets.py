"""ampviz.scaling presets: each framework's preset equals a plain transcription of that framework's
update rule, step for step, and reproduces the behaviour traces recorded in the design notes on
loss scalers (design/loss-scalers.md).

The transcriptions below follow each project's source (file and revision in the preset's
docstring) line by line, in the project's own variable names, storing the scale as the project
does: Python floats (apex amp, DeepSpeed, fairseq, metaseq), numpy float32 scalars for float32
tensors (Megatron, Keras, jmp), and a double product rounded to float for the CUDA kernels (torch,
apex's hysteresis kernel). None of them uses DynamicScaler. Where a framework ends the run by
raising, its transcription raises the same exception from the same expression (a division by the
scale, ``int(scale)`` in a message), and the preset's trace must name it (``stop_reason``).
"""

import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ampviz.scaling as scaling
from ampviz.scaling import (
    PRESETS, ApexAmpScaler, ApexHysteresisScaler, DeepSpeedScaler, DeepSpeedZeroScaler, DynamicScaler,
    FairseqScaler, JmpScaler, Keras3Scaler, KerasScaler, MegatronScaler, MetaseqScaler, StaticScaler,
    TorchGradScaler, simulate,
)

F32 = np.float32


def to_float(x: float) -> float:
    """A C++ ``float = double`` store: round to float32 (overflow gives inf)."""
    with np.errstate(over="ignore"):
        return float(np.float32(x))


# ================================================================ transcriptions
class TorchUpdateScale:
    """torch ``_amp_update_scale_`` (aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp@e402fa84)."""

    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.current_scale = to_float(init_scale)
        self.growth_tracker = 0
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval

    scale = property(lambda self: self.current_scale)

    def step(self, found_inf):
        if found_inf:
            self.current_scale = to_float(self.current_scale * self.backoff_factor)
            self.growth_tracker = 0
        else:
            successful = self.growth_tracker + 1
            if successful == self.growth_interval:
                new_scale = to_float(self.current_scale * self.growth_factor)
                if math.isfinite(new_scale):
                    self.current_scale = new_scale
                self.growth_tracker = 0
            else:
                self.growth_tracker = successful
        return found_inf


class ApexAmpLossScaler:
    """apex/amp/scaler.py ``LossScaler`` at cb65b8ed^, dynamic: ``__init__`` and ``update_scale``."""

    def __init__(self, init_scale=2.0**16, scale_window=2000, min_loss_scale=None, max_loss_scale=2.0**24):
        self._loss_scale = min(max_loss_scale, init_scale)
        self._max_loss_scale = max_loss_scale
        self._min_loss_scale = min_loss_scale
        self._scale_seq_len = scale_window
        self._unskipped = 0

    scale = property(lambda self: self._loss_scale)

    def step(self, has_overflow):
        # amp.scale_loss on exit: LossScaler.unscale multiplies the gradients by 1./scale (the fused
        # kernel's argument, or scale_check_overflow_python's) before update_scale runs
        self.unscale_factor = 1. / self._loss_scale
        if has_overflow:
            should_skip = True
            if self._min_loss_scale:
                self._loss_scale = max(self._min_loss_scale, self._loss_scale / 2.0)
            else:
                self._loss_scale = self._loss_scale / 2.0
            self._unskipped = 0
        else:
            should_skip = False
            self._unskipped += 1
        if self._unskipped == self._scale_seq_len:
            self._loss_scale = min(self._max_loss_scale, self._loss_scale * 2.0)
            self._unskipped = 0
        return should_skip


class ApexUpdateScaleHysteresis:
    """apex csrc/update_scale_hysteresis.cu@6424da3b, as NeMo's GradScaler drives it (the hysteresis
    tracker starts at ``hysteresis``)."""

    def __init__(self, init_scale=2.0**32, growth_factor=2.0, backoff_factor=0.5, growth_interval=1000,
                 hysteresis=2):
        self.current_scale = to_float(init_scale)
        self.growth_tracker = 0
        self.hysteresis_tracker = hysteresis
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval, self.hysteresis = growth_interval, hysteresis

    scale = property(lambda self: self.current_scale)

    def step(self, found_inf):
        if found_inf:
            self.hysteresis_tracker -= 1
            if self.hysteresis_tracker > 0:
                self.growth_tracker = 0
                return True
        if found_inf:
            self.current_scale = to_float(self.current_scale * self.backoff_factor)
            self.growth_tracker = 0
        else:
            successful = self.growth_tracker + 1
            if successful == self.growth_interval:
                new_scale = to_float(self.current_scale * self.growth_factor)
                if math.isfinite(new_scale):
                    self.current_scale = new_scale
                self.growth_tracker = 0
            else:
                self.growth_tracker = successful
        if not found_inf:
            self.hysteresis_tracker = self.hysteresis
        return found_inf


class DeepSpeedDynamicLossScaler:
    """deepspeed/runtime/fp16/loss_scaler.py ``DynamicLossScaler.update_scale`` on rank 0 for fp16, as
    of deepspeedai/DeepSpeed@cf443004 (v0.19.5; unchanged since v0.17.1), or with ``before_0_17_1``
    as of @720787e7 (v0.17.0), whose growth test and class defaults differ. The overflow messages
    are built as DeepSpeed builds them (``int(self.cur_scale)``) and then dropped (``logger.info``)."""

    END = "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run."

    def __init__(self, init_scale=2**32, scale_factor=2.0, scale_window=1000, min_scale=1, delayed_shift=1,
                 consecutive_hysteresis=False, raise_error_at_min_scale=True, before_0_17_1=False):
        self.cur_scale = init_scale
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.scale_factor = scale_factor
        self.scale_window = scale_window
        self.min_scale = min_scale
        self.delayed_shift = delayed_shift
        self.cur_hysteresis = delayed_shift
        self.consecutive_hysteresis = consecutive_hysteresis
        self.raise_error_at_min_scale = raise_error_at_min_scale
        self.before_0_17_1 = before_0_17_1

    scale = property(lambda self: self.cur_scale)

    def step(self, overflow):
        if overflow:
            if self.delayed_shift == 1 or self.cur_hysteresis == 1:
                if (self.cur_scale == self.min_scale) and self.raise_error_at_min_scale:
                    raise Exception(self.END)
                else:
                    next_scale = max(self.cur_scale / self.scale_factor, self.min_scale)
                    overflow_msg = "[deepspeed] OVERFLOW! Rank 0 Skipping step."
                    overflow_msg += f" Attempted loss scale: {int(self.cur_scale)}, reducing to {int(next_scale)}"
                    self.cur_scale = next_scale
            else:
                overflow_msg = "[deepspeed] OVERFLOW! Rank 0 Skipping step."
                overflow_msg += (f" Attempted loss scale: {int(self.cur_scale)}, but hysteresis is "
                                 f"{self.cur_hysteresis}. Reducing hysteresis to {self.cur_hysteresis-1}")
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive_hysteresis:
                self.cur_hysteresis = self.delayed_shift
            if self.before_0_17_1:
                grows = (self.cur_iter - self.last_overflow_iter) % self.scale_window == 0
            else:
                stable_interval = (self.cur_iter - self.last_overflow_iter) - 1
                grows = (stable_interval > 0) and (stable_interval % self.scale_window == 0)
            if grows:
                if not self.consecutive_hysteresis:
                    self.cur_hysteresis = self.delayed_shift
                self.cur_scale *= self.scale_factor
        self.cur_iter += 1
        return overflow


def deepspeed_zero(config: dict, before_0_17_1=False) -> DeepSpeedDynamicLossScaler:
    """What ZeRO builds from the ``fp16`` config block: since 0.17.1 ``precision_config.py``
    ``dynamic_loss_scale_args`` always passes the config's values (defaults filled in); before,
    ``runtime/config.py`` ``get_dynamic_loss_scale_args`` passed them only if the block named one of
    the five keys, and ``CreateLossScaler`` otherwise used the class defaults."""
    keys = ("initial_scale_power", "loss_scale_window", "min_loss_scale", "hysteresis", "consecutive_hysteresis")
    if before_0_17_1 and not any(k in config for k in keys):
        return DeepSpeedDynamicLossScaler(before_0_17_1=True)  # the class defaults
    return DeepSpeedDynamicLossScaler(
        init_scale=2 ** config.get("initial_scale_power", 16), scale_window=config.get("loss_scale_window", 1000),
        delayed_shift=config.get("hysteresis", 2), consecutive_hysteresis=config.get("consecutive_hysteresis", False),
        min_scale=config.get("min_loss_scale", 1), before_0_17_1=before_0_17_1)


class DeepSpeedFP16Optimizer:
    """deepspeed/runtime/fp16/fused_optimizer.py@cf443004 ``FP16_Optimizer._update_scale`` (dynamic;
    logging left out) with ``LossScaleConfig``'s settings: scale_factor 2.0, last_overflow_iter -1."""

    def __init__(self, initial_dynamic_scale=2**16, scale_window=1000, min_loss_scale=1):
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.scale_factor = 2.0
        self.cur_scale = initial_dynamic_scale
        self.scale_window = scale_window
        self.min_loss_scale = min_loss_scale

    scale = property(lambda self: self.cur_scale)

    def step(self, skip):
        if skip:
            self.cur_scale = max(self.cur_scale / self.scale_factor, self.min_loss_scale)
            self.last_overflow_iter = self.cur_iter
        else:
            stable_interval = (self.cur_iter - self.last_overflow_iter) - 1
            if (stable_interval > 0) and (stable_interval % self.scale_window == 0):
                self.cur_scale *= self.scale_factor
        self.cur_iter += 1
        return skip


class MegatronDynamicGradScaler:
    """megatron/core/optimizer/grad_scaler.py@00caa53a ``DynamicGradScaler`` (float32 tensors as
    numpy float32 scalars)."""

    def __init__(self, initial_scale=2.0**32, min_scale=1.0, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=1000, hysteresis=2):
        self._scale = F32(initial_scale)
        self.min_scale = F32(min_scale)
        self.growth_factor = F32(growth_factor)
        self.backoff_factor = F32(backoff_factor)
        self.growth_interval = growth_interval
        self.hysteresis = hysteresis
        self._growth_tracker = 0
        self._hysteresis_tracker = self.hysteresis

    scale = property(lambda self: float(self._scale))

    def step(self, found_inf):
        if found_inf:
            self._growth_tracker = 0
            self._hysteresis_tracker -= 1
            if self._hysteresis_tracker <= 0:
                self._scale = np.maximum(self._scale * self.backoff_factor, self.min_scale)
        else:
            self._growth_tracker += 1
            if self._growth_tracker == self.growth_interval:
                self._growth_tracker = 0
                self._hysteresis_tracker = self.hysteresis
                self._scale = self._scale * self.growth_factor
        return found_inf


class KerasDynamicLossScaleState:
    """keras/mixed_precision/loss_scale_optimizer.py@363ac472 ``_DynamicLossScaleState.update``
    (a float32 variable; multiplier 2)."""

    def __init__(self, initial_loss_scale=2**15, growth_steps=2000, multiplier=2):
        self.current_loss_scale = F32(initial_loss_scale)
        self.counter = 0
        self.growth_steps = growth_steps
        self.multiplier = multiplier

    scale = property(lambda self: float(self.current_loss_scale))

    def step(self, non_finite):
        is_finite = not non_finite
        if is_finite:
            if self.counter + 1 >= self.growth_steps:
                new_loss_scale = self.current_loss_scale * self.multiplier
                if np.isfinite(new_loss_scale):  # _assign_if_finite
                    self.current_loss_scale = new_loss_scale
                self.counter = 0
            else:
                self.counter += 1
        else:
            self.counter = 0
            self.current_loss_scale = np.maximum(self.current_loss_scale / self.multiplier, F32(1))
        return not is_finite


class Keras3LossScaleOptimizer:
    """keras/src/optimizers/loss_scale_optimizer.py@054e2952: ``handle_finite_grads`` /
    ``handle_non_finite_grads`` (``dynamic_scale`` a float32 variable)."""

    def __init__(self, initial_scale=2.0**15, dynamic_growth_steps=2000):
        self.dynamic_scale = F32(initial_scale)
        self.step_counter = 0
        self.dynamic_growth_steps = dynamic_growth_steps

    scale = property(lambda self: float(self.dynamic_scale))

    def step(self, non_finite):
        if not non_finite:
            if self.step_counter == self.dynamic_growth_steps - 1:  # upscale
                self.step_counter = 0
                self.dynamic_scale = self.dynamic_scale * 2.0
            else:  # increment
                self.step_counter += 1
        else:
            self.step_counter = 0
            self.dynamic_scale = self.dynamic_scale / 2.0
        return non_finite


class JmpDynamicLossScale:
    """jmp/_src/loss_scale.py@9c1cdbbf ``DynamicLossScale.adjust`` (float32 loss_scale and
    min_loss_scale; ``jax.lax.select`` as a conditional)."""

    def __init__(self, loss_scale=2.0**15, period=2000, factor=2, min_loss_scale=1.0):
        self.loss_scale = F32(loss_scale)
        self.counter = 0
        self.period = period
        self.factor = factor
        self.min_loss_scale = F32(min_loss_scale)

    scale = property(lambda self: float(self.loss_scale))

    def step(self, non_finite):
        grads_finite = not non_finite

        def first_finite(a, b):
            return a if np.isfinite(a) else b

        if grads_finite:
            if self.counter == (self.period - 1):
                loss_scale = first_finite(self.loss_scale * self.factor, self.loss_scale)
            else:
                loss_scale = self.loss_scale
        else:
            loss_scale = np.maximum(self.min_loss_scale, self.loss_scale / self.factor)
        self.counter = ((self.counter + 1) % self.period) * grads_finite
        self.loss_scale = loss_scale
        return non_finite


class FairseqDynamicLossScaler:
    """fairseq/optim/dynamic_loss_scaler.py@0d77035e, verbatim: ``FP16Optimizer`` calls
    ``check_overflow`` every step (an ``OverflowError`` skips the step, a ``FloatingPointError``
    ends training) and ``update`` after a clean step."""

    END = "Minimum loss scale reached"

    def __init__(self, init_scale=2.0**15, scale_factor=2.0, scale_window=2000, tolerance=0.0, threshold=None,
                 min_loss_scale=1e-4):
        self.loss_scale = init_scale
        self.scale_factor = scale_factor
        self.scale_window = scale_window
        self.tolerance = tolerance
        self.threshold = threshold
        self._iter = 0
        self._last_overflow_iter = -1
        self._last_rescale_iter = -1
        self._overflows_since_rescale = 0
        self.min_loss_scale = min_loss_scale

    scale = property(lambda self: self.loss_scale)

    def update(self):
        if (self._iter - self._last_overflow_iter) % self.scale_window == 0:
            self.loss_scale *= self.scale_factor
            self._last_rescale_iter = self._iter
        self._iter += 1

    def _decrease_loss_scale(self):
        self.loss_scale /= self.scale_factor
        if self.threshold is not None:
            self.loss_scale = max(self.loss_scale, self.threshold)

    def check_overflow(self, overflow):
        if overflow:
            prev_scale = self.loss_scale
            iter_since_rescale = self._iter - self._last_rescale_iter
            if iter_since_rescale == 0:
                iter_since_rescale = 1000
            self._last_overflow_iter = self._iter
            self._overflows_since_rescale += 1
            pct_overflow = self._overflows_since_rescale / float(iter_since_rescale)
            if pct_overflow >= self.tolerance:
                self._decrease_loss_scale()
                self._last_rescale_iter = self._iter
                self._overflows_since_rescale = 0
            if self.loss_scale <= self.min_loss_scale:
                self.loss_scale = prev_scale
                raise FloatingPointError(
                    (
                        "Minimum loss scale reached ({}). Your loss is probably exploding. "
                        "Try lowering the learning rate, using gradient clipping or "
                        "increasing the batch size."
                    ).format(self.min_loss_scale)
                )
            self._iter += 1
            raise OverflowError("setting loss scale to: " + str(self.loss_scale))

    def step(self, overflow):
        # fairseq/trainer.py train_step begins with zero_grad(), and its OverflowError handler calls
        # it again: FP16Optimizer.zero_grad sets _multiply_factor = 1.0 / float(self.scaler.loss_scale)
        self.multiply_factor = 1.0 / float(self.loss_scale)
        try:
            self.check_overflow(overflow)
        except OverflowError:
            self.multiply_factor = 1.0 / float(self.loss_scale)
            return True
        self.update()
        return False


class MetaseqDynamicLossScaler:
    """metaseq/optim/dynamic_loss_scaler.py@0ba5657a, verbatim (logging left out), driven like
    fairseq's: ``check_overflow(grad_norm)`` every step, ``update()`` after a clean one."""

    def __init__(self, init_scale=4.0, scale_factor=2.0, scale_window=256, tolerance=0.0, threshold=None,
                 min_loss_scale=2**-5):
        self.loss_scale = init_scale
        self.scale_factor = scale_factor
        self.scale_window = scale_window
        self.tolerance = tolerance
        self.threshold = threshold
        self._iter = 0
        self._last_overflow_iter = -1
        self._last_rescale_iter = -1
        self._overflows_since_rescale = 0
        self.min_loss_scale = min_loss_scale

    scale = property(lambda self: self.loss_scale)

    def update(self):
        if (self._iter - self._last_overflow_iter) % self.scale_window == 0:
            self.loss_scale *= self.scale_factor
            self._last_rescale_iter = self._iter
            self.scale_window *= self.scale_factor
        self._iter += 1

    def _decrease_loss_scale(self):
        self.loss_scale /= self.scale_factor
        self.scale_window = max(int(self.scale_window / self.scale_factor), 1)
        if self.threshold is not None:
            self.loss_scale = max(self.loss_scale, self.threshold)

    def check_overflow(self, grad_norm):
        if grad_norm == float("inf") or grad_norm != grad_norm:
            prev_scale = self.loss_scale
            iter_since_rescale = self._iter - self._last_rescale_iter
            self._last_overflow_iter = self._iter
            self._overflows_since_rescale += 1
            pct_overflow = self._overflows_since_rescale / float(iter_since_rescale)
            if pct_overflow >= self.tolerance:
                self._decrease_loss_scale()
                self._last_rescale_iter = self._iter
                self._overflows_since_rescale = 0
            if self.loss_scale < self.min_loss_scale:
                self.loss_scale = prev_scale
            self._iter += 1
            raise OverflowError("setting loss scale to: " + str(self.loss_scale))

    def step(self, overflow):
        self.multiply_factor = 1.0 / float(self.loss_scale)  # metaseq/trainer.py: zero_grad(), as fairseq's
        try:
            self.check_overflow(math.inf if overflow else 1.0)
        except OverflowError:
            self.multiply_factor = 1.0 / float(self.loss_scale)
            return True
        self.update()
        return False


# ================================================================ running and comparing
# How the frameworks end a run: the exception types their transcriptions may raise
ENDS = (Exception, FloatingPointError, ZeroDivisionError, OverflowError, ValueError)


def run_reference(ref, steps: int, overflowed):
    """Step a transcription: the scale before each step, whether the step was skipped, the step at
    which it ended the run (None), and how: the exception as its traceback's last line.
    ``overflowed(i, scale)`` says whether step i overflows."""
    scale, skipped, stopped_at, reason = [], [], None, None
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):  # float32 growth to inf, x / 0
        for i in range(steps):
            if stopped_at is not None:
                scale.append(math.nan)
                skipped.append(True)
                continue
            s = float(ref.scale)
            scale.append(s)
            try:
                skipped.append(bool(ref.step(bool(overflowed(i, s)))))
            except Exception as e:  # DeepSpeed, fairseq, metaseq and apex amp end the run by raising
                assert type(e) in ENDS, repr(e)  # exactly these types: a bug in a transcription is not an end
                stopped_at, reason = i, f"{type(e).__name__}: {e}"
                skipped.append(True)
    return np.array(scale, np.float64), np.array(skipped, bool), stopped_at, reason


def same_floats(a, b) -> bool:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a.shape == b.shape and bool(np.all((a == b) | (np.isnan(a) & np.isnan(b))))


def assert_matches(preset: DynamicScaler, make_ref, found_inf):
    """simulate(preset, found_inf=...) equals the transcription step for step."""
    flags = np.asarray(found_inf, bool)
    scale, skipped, stopped_at, reason = run_reference(make_ref(), flags.size, lambda i, s: flags[i])
    trace = simulate(preset, found_inf=flags)
    got = trace.scale.astype(np.float64)
    bad = np.flatnonzero(~((got == scale) | (np.isnan(got) & np.isnan(scale))))
    assert bad.size == 0, f"{preset.name}: scale differs first at step {bad[0]}: {got[bad[0]]!r} vs {scale[bad[0]]!r}"
    assert np.array_equal(trace.skipped, skipped), f"{preset.name}: skipped steps differ"
    assert trace.stopped_at == stopped_at, f"{preset.name}: stopped at {trace.stopped_at}, reference {stopped_at}"
    assert trace.stop_reason == reason, f"{preset.name}: ended with {trace.stop_reason!r}, reference {reason!r}"


# ================================================================ presets against transcriptions
def draw_stream(draw):
    """Overflow flags: short arbitrary lists (which shrink well) or seeded streams at a chosen rate."""
    if draw(st.booleans()):
        return np.array(draw(st.lists(st.booleans(), max_size=120)), bool)
    n = draw(st.integers(0, 1500))
    rate = draw(st.sampled_from([0.0, 0.002, 0.02, 0.1, 0.3, 0.6, 0.95]))
    return np.random.default_rng(draw(st.integers(0, 2**32 - 1))).random(n) < rate


WINDOWS = st.integers(1, 12)


@st.composite
def torch_case(draw):
    kw = dict(init_scale=draw(st.sampled_from([2.0**16, 1.0, 3e38, 2.0**-140])),
              growth_factor=draw(st.sampled_from([2.0, 1.5, 1.001])),
              backoff_factor=draw(st.sampled_from([0.5, 0.9, 0.125])), growth_interval=draw(WINDOWS))
    return TorchGradScaler(**kw), lambda: TorchUpdateScale(**kw)


@st.composite
def apex_amp_case(draw):
    # 2**-1070 and 0.0 reach 0 at once (the next step divides by it); 2**1000 with no cap reaches inf
    init = draw(st.sampled_from([2.0**16, 2.0**30, 3.0, 1.0, 2.0**-3, 2.0**-1070, 0.0, 2.0**1000]))
    window = draw(WINDOWS)
    lo, hi = draw(st.sampled_from([None, 0.0, 1.0, 0.3])), draw(st.sampled_from([2.0**24, 2.0**5, math.inf]))
    return (ApexAmpScaler(init, window, lo, hi),
            lambda: ApexAmpLossScaler(init_scale=init, scale_window=window, min_loss_scale=lo, max_loss_scale=hi))


@st.composite
def apex_hysteresis_case(draw):
    kw = dict(init_scale=draw(st.sampled_from([2.0**32, 2.0**16, 3e38, 1.0])),
              growth_factor=draw(st.sampled_from([2.0, 1.5, 1.001])),
              backoff_factor=draw(st.sampled_from([0.5, 0.9, 0.125])),
              growth_interval=draw(WINDOWS), hysteresis=draw(st.integers(1, 4)))
    return ApexHysteresisScaler(**kw), lambda: ApexUpdateScaleHysteresis(**kw)


VERSIONS = {None: False, "0.19.5": False, "0.17.1": False, "0.17.0": True, "0.9.3": True}  # before 0.17.1?


@st.composite
def deepspeed_zero_case(draw):
    version = draw(st.sampled_from(list(VERSIONS)))
    before = VERSIONS[version]
    config = {}
    # 2**-1 starts below the minimum of 1 (it backs off to it first); 2**1000 reaches inf within a few
    # dozen growths, and the next overflow ends the run (int(inf) in the overflow message)
    for key, values in (("initial_scale_power", st.sampled_from([16, 32, 3, 0, -1, 1000])),
                        ("loss_scale_window", WINDOWS), ("hysteresis", st.integers(1, 4)),
                        ("consecutive_hysteresis", st.booleans()), ("min_loss_scale", st.sampled_from([1, 0.25, 2]))):
        if draw(st.booleans()):
            config[key] = draw(values)
    ref = deepspeed_zero(config, before)
    if before and not config:  # {"enabled": true} before 0.17.1: the class defaults
        return (DeepSpeedZeroScaler(version=version, config_defaults=False),
                lambda: deepspeed_zero({}, before_0_17_1=True))
    preset = DeepSpeedZeroScaler(
        init_scale=2.0 ** config.get("initial_scale_power", 16), growth_interval=config.get("loss_scale_window", 1000),
        hysteresis=config.get("hysteresis", 2), min_scale=config.get("min_loss_scale", 1),
        consecutive_hysteresis=config.get("consecutive_hysteresis", False), version=version)
    assert preset.init_scale == ref.cur_scale and preset.min_scale == ref.min_scale
    return preset, lambda: deepspeed_zero(config, before)


@st.composite
def deepspeed_case(draw):
    # FP16_Optimizer's scale_factor is 2.0 (since DeepSpeed 0.19.0), so its scale is a Python float
    # from the first growth on, as the float64 simulation's is; 2**1000 with a window of 1 reaches inf,
    # which ends nothing here.
    power = draw(st.sampled_from([16, 32, 3, 0, 1000]))
    window, lo = draw(WINDOWS), draw(st.sampled_from([1, 0.25]))
    return (DeepSpeedScaler(2.0**power, window, lo),
            lambda: DeepSpeedFP16Optimizer(initial_dynamic_scale=2**power, scale_window=window, min_loss_scale=lo))


@st.composite
def megatron_case(draw):
    kw = dict(initial_scale=draw(st.sampled_from([2.0**32, 2.0**16, 3.0, 3e38])),
              min_scale=draw(st.sampled_from([1.0, 0.1, 2.0**-5])),
              growth_interval=draw(WINDOWS), hysteresis=draw(st.integers(1, 4)))
    return (MegatronScaler(kw["initial_scale"], kw["min_scale"], kw["growth_interval"], kw["hysteresis"]),
            lambda: MegatronDynamicGradScaler(**kw))


@st.composite
def keras_case(draw):
    init, window = draw(st.sampled_from([2.0**15, 3.0, 3e38, 1.0, 0.5])), draw(WINDOWS)
    return KerasScaler(init, window), lambda: KerasDynamicLossScaleState(init, window)


@st.composite
def keras3_case(draw):
    init, window = draw(st.sampled_from([2.0**15, 3.0, 3e38, 2.0**-140])), draw(WINDOWS)
    return Keras3Scaler(init, window), lambda: Keras3LossScaleOptimizer(init, window)


@st.composite
def jmp_case(draw):
    init, period = draw(st.sampled_from([2.0**15, 3.0, 3e38, 1.0])), draw(WINDOWS)
    factor, lo = draw(st.sampled_from([2, 4])), draw(st.sampled_from([1.0, 0.1, 2.0**-20]))
    return JmpScaler(init, period, factor, lo), lambda: JmpDynamicLossScale(init, period, factor, lo)


TOLERANCES = st.sampled_from([0.0, 0.0, 0.01, 0.05, 0.25, 1.0, 2.0])


@st.composite
def fairseq_case(draw):
    init = draw(st.sampled_from([2.0**7, 2.0**15, 1e-3, 3.0, 0.0, 2.0**1000]))  # 0: zero_grad divides by it
    window, tol = draw(WINDOWS), draw(TOLERANCES)
    threshold, lo = draw(st.sampled_from([None, 0.5, 2.0**-10])), draw(st.sampled_from([1e-4, 1.0, 0.5, 0.0]))
    return (FairseqScaler(init, window, tol, threshold, lo),
            lambda: FairseqDynamicLossScaler(init_scale=init, scale_window=window, tolerance=tol, threshold=threshold,
                                             min_loss_scale=lo))


@st.composite
def metaseq_case(draw):
    init = draw(st.sampled_from([4.0, 2.0**15, 3.0, 2.0**-5, 0.0]))  # 0: zero_grad divides by it
    window, tol = draw(WINDOWS), draw(TOLERANCES)
    threshold, lo = draw(st.sampled_from([None, 2.0**-3, 2.0**-10])), draw(st.sampled_from([2.0**-5, 1.0, 0.3]))
    return (MetaseqScaler(init, window, tol, threshold, lo),
            lambda: MetaseqDynamicLossScaler(init_scale=init, scale_window=window, tolerance=tol, threshold=threshold,
                                             min_loss_scale=lo))


CASES = {
    "torch": torch_case(), "apex amp": apex_amp_case(), "NeMo (apex hysteresis)": apex_hysteresis_case(),
    "DeepSpeed ZeRO": deepspeed_zero_case(), "DeepSpeed": deepspeed_case(), "Megatron": megatron_case(),
    "Keras 2": keras_case(), "Keras 3": keras3_case(), "jmp": jmp_case(), "fairseq": fairseq_case(),
    "metaseq": metaseq_case(),
}


@pytest.mark.parametrize("framework", list(CASES))
@settings(max_examples=120, deadline=None)
@given(data=st.data())
def test_preset_equals_transcription_on_random_streams(framework, data):
    preset, make_ref = data.draw(CASES[framework])
    assert_matches(preset, make_ref, draw_stream(data.draw))


DEFAULTS = [  # each preset at its defaults, and the transcription at the framework's defaults
    (TorchGradScaler(), TorchUpdateScale),
    (ApexAmpScaler(), ApexAmpLossScaler),
    (ApexHysteresisScaler(), ApexUpdateScaleHysteresis),
    (DeepSpeedZeroScaler(), lambda: deepspeed_zero({})),  # since 0.17.1 always the config's defaults
    (DeepSpeedZeroScaler(version="0.17.0"), lambda: deepspeed_zero({"hysteresis": 2}, True)),  # any key: the config's
    (DeepSpeedZeroScaler(version="0.17.0", config_defaults=False), lambda: deepspeed_zero({}, True)),
    (DeepSpeedScaler(), DeepSpeedFP16Optimizer),
    (MegatronScaler(), MegatronDynamicGradScaler),
    (KerasScaler(), KerasDynamicLossScaleState),
    (Keras3Scaler(), Keras3LossScaleOptimizer),
    (JmpScaler(), JmpDynamicLossScale),
    (FairseqScaler(), lambda: FairseqDynamicLossScaler(init_scale=2.0**7, scale_window=2**14)),  # CLI, one GPU
    (FairseqScaler(cli_defaults=False), FairseqDynamicLossScaler),
    (MetaseqScaler(), MetaseqDynamicLossScaler),
]


@pytest.mark.parametrize("preset, make_ref", DEFAULTS, ids=[p.name for p, _ in DEFAULTS])
def test_presets_at_defaults_on_long_streams(preset, make_ref):
    rng = np.random.default_rng(11)
    for rate in (0.0003, 0.002, 0.05):  # sparse overflows let the default windows grow the scale
        flags = rng.random(40_000) < rate
        assert_matches(preset, make_ref, flags)
    assert_matches(preset, make_ref, np.ones(300, bool))  # straight down to the floor (or the end)


DENSE_STREAMS = {  # every step an event: overflows at every step, every other step, half the steps
    "every step": np.ones(20_000, bool),
    "alternating": np.arange(20_000) % 2 == 0,
    "random half": np.random.default_rng(12).random(20_000) < 0.5,
    "runs of 700": (np.arange(20_000) // 700) % 3 == 0,
}


@pytest.mark.parametrize("preset, make_ref", DEFAULTS, ids=[p.name for p, _ in DEFAULTS])
def test_presets_at_defaults_on_dense_streams(preset, make_ref):
    for flags in DENSE_STREAMS.values():
        assert_matches(preset, make_ref, flags)


DENSE_CASES = [  # the frameworks' rules with windows of 1 and 2: growth at nearly every clean step
    (ApexAmpScaler(growth_interval=1, min_scale=0.25), lambda: ApexAmpLossScaler(scale_window=1, min_loss_scale=0.25)),
    (ApexHysteresisScaler(growth_interval=1, hysteresis=3),
     lambda: ApexUpdateScaleHysteresis(growth_interval=1, hysteresis=3)),
    (ApexHysteresisScaler(growth_interval=1, growth_factor=1.001, backoff_factor=0.995),
     lambda: ApexUpdateScaleHysteresis(growth_interval=1, growth_factor=1.001, backoff_factor=0.995)),
    (DeepSpeedZeroScaler(growth_interval=1, consecutive_hysteresis=True, min_scale=2.0**-20),
     lambda: deepspeed_zero({"loss_scale_window": 1, "consecutive_hysteresis": True, "min_loss_scale": 2.0**-20})),
    (DeepSpeedZeroScaler(growth_interval=1, consecutive_hysteresis=True, min_scale=2.0**-20, version="0.17.0"),
     lambda: deepspeed_zero({"loss_scale_window": 1, "consecutive_hysteresis": True, "min_loss_scale": 2.0**-20},
                            True)),
    # growth to inf within the stream, then an overflow there ends the run (OverflowError)
    (DeepSpeedZeroScaler(init_scale=2.0**1000, growth_interval=1, hysteresis=1),
     lambda: deepspeed_zero({"initial_scale_power": 1000, "loss_scale_window": 1, "hysteresis": 1})),
    (ApexAmpScaler(init_scale=2.0**-1070, growth_interval=2),  # no floor: 0 after five backoffs, then the end
     lambda: ApexAmpLossScaler(init_scale=2.0**-1070, scale_window=2)),
    (DeepSpeedScaler(growth_interval=2), lambda: DeepSpeedFP16Optimizer(scale_window=2)),
    (MegatronScaler(growth_interval=1, min_scale=2.0**-10),
     lambda: MegatronDynamicGradScaler(growth_interval=1, min_scale=2.0**-10)),
    (KerasScaler(growth_interval=1), lambda: KerasDynamicLossScaleState(growth_steps=1)),
    (Keras3Scaler(growth_interval=1), lambda: Keras3LossScaleOptimizer(dynamic_growth_steps=1)),
    (JmpScaler(growth_interval=1, growth_factor=4), lambda: JmpDynamicLossScale(period=1, factor=4)),
    (FairseqScaler(growth_interval=1, tolerance=0.3, raise_at_scale=0.0),
     lambda: FairseqDynamicLossScaler(init_scale=2.0**7, scale_window=1, tolerance=0.3, min_loss_scale=0.0)),
    (MetaseqScaler(growth_interval=1), lambda: MetaseqDynamicLossScaler(scale_window=1)),
    (MetaseqScaler(tolerance=0.05), lambda: MetaseqDynamicLossScaler(tolerance=0.05)),
]


@pytest.mark.parametrize("preset, make_ref", DENSE_CASES, ids=[p.name for p, _ in DENSE_CASES])
def test_presets_with_short_windows_on_dense_streams(preset, make_ref):
    for flags in DENSE_STREAMS.values():
        assert_matches(preset, make_ref, flags[:6000])


def test_static_scale_never_changes():
    flags = np.random.default_rng(1).random(500) < 0.3
    trace = simulate(StaticScaler(128.0), found_inf=flags)
    assert set(trace.scale.tolist()) == {128.0} and np.array_equal(trace.skipped, flags)


# ================================================================ documented behaviour traces
def trace_numbers(run):
    """(skipped steps, first growth) of a run: ``run`` gives (scale before each step, skipped);
    the first growth is the step whose update raised the scale (None: never)."""
    scale, skipped = run
    up = np.flatnonzero(scale[1:] > scale[:-1])
    return int(np.sum(skipped)), (int(up[0]) if up.size else None)


# design/loss-scalers.md, "Behaviour traces": overflow when S * gmax > 65504, 10,000 steps at defaults.
# Its DeepSpeed ZeRO row (1001 and 999) is DeepSpeed before 0.17.1; since then ZeRO grows a step later.
# (scaler, transcription, gmax=1: skipped, first growth; gmax=8: skipped; no overflows: first growth)
TRACE_TABLE = [
    (TorchGradScaler(), TorchUpdateScale, 5, 2000, 8, 1999),
    (ApexAmpScaler(), ApexAmpLossScaler, 5, 2000, 8, 1999),
    (DeepSpeedZeroScaler(), lambda: deepspeed_zero({}), 20, 1002, 23, 1000),
    (DeepSpeedZeroScaler(version="0.17.0"), lambda: deepspeed_zero({"hysteresis": 2}, True), 20, 1001, 23, 999),
    (DeepSpeedScaler(), DeepSpeedFP16Optimizer, 10, 1001, 13, 1000),
    (MegatronScaler(), MegatronDynamicGradScaler, 36, 1017, 39, 999),
    (KerasScaler(), KerasDynamicLossScaleState, 4, 1999, 7, 1999),
    (Keras3Scaler(), Keras3LossScaleOptimizer, 4, 1999, 7, 1999),
    (JmpScaler(), JmpDynamicLossScale, 4, 1999, 7, 1999),
    (FairseqScaler(), lambda: FairseqDynamicLossScaler(init_scale=2.0**7, scale_window=2**14), 0, None, 0, None),
    (MetaseqScaler(), MetaseqDynamicLossScaler, 0, 255, 0, 255),
]


@pytest.mark.parametrize("preset, make_ref, skipped1, growth1, skipped8, growth_clean", TRACE_TABLE,
                         ids=[row[0].name for row in TRACE_TABLE])
def test_documented_trace_table(preset, make_ref, skipped1, growth1, skipped8, growth_clean):
    n = 10_000
    for gmax, skipped, growth in ((1.0, skipped1, growth1), (8.0, skipped8, None)):
        t = simulate(preset, grad_max=np.full(n, gmax, np.float32))  # the fp16 overflow model
        ref = run_reference(make_ref(), n, lambda i, s: s * gmax > 65504)  # the doc's condition
        assert trace_numbers((t.scale.astype(np.float64), t.skipped)) == trace_numbers(ref[:2])
        got_skipped, got_growth = trace_numbers(ref[:2])
        assert got_skipped == skipped
        if growth is not None:
            assert got_growth == growth
    t = simulate(preset, found_inf=np.zeros(n, bool))
    assert trace_numbers((t.scale.astype(np.float64), t.skipped)) == (0, growth_clean)


def test_metaseq_growth_slows_as_the_window_doubles():
    """"4→8 at step 255, …, 256 at step ~8191": growth at 255, 511, 1023, 2047, 4095 and 8191
    (the window doubles, but the count runs from the last overflow, not the last growth)."""
    t = simulate(MetaseqScaler(), grad_max=np.ones(10_000, np.float32))
    up = np.flatnonzero(t.scale[1:] > t.scale[:-1])
    assert up.tolist() == [255, 511, 1023, 2047, 4095, 8191]
    assert t.scale[up + 1].tolist() == [8.0, 16.0, 32.0, 64.0, 128.0, 256.0]
    assert t.final.window == 256 * 2**6


def spike_stream(n=10_000, every=500, first=250) -> np.ndarray:
    """The spurious-spike scenario: one overflowing step every 500 steps, otherwise clean. With
    the first spike at step 250, DeepSpeed ZeRO raises at step 8750 as documented."""
    flags = np.zeros(n, bool)
    flags[first::every] = True
    return flags


def test_spurious_spike_scenario():
    flags = spike_stream()
    assert flags.sum() == 20

    # torch: 20 backoffs, no growth between spikes 500 steps apart: 2**16 / 2**20.
    t = simulate(TorchGradScaler(), found_inf=flags)
    assert t.final.scale == 0.0625
    ref = TorchUpdateScale()
    run_reference(ref, flags.size, lambda i, s: flags[i])
    assert ref.scale == 0.0625

    # apex/NeMo hysteresis, refilled on every clean step, absorbs every isolated spike: the scale
    # never moves (65536 from torch's 2**16 start; NeMo's own default start, 2**32, stays too).
    for preset in (ApexHysteresisScaler(init_scale=2.0**16, growth_interval=2000), ApexHysteresisScaler()):
        t = simulate(preset, found_inf=flags)
        assert set(t.scale.tolist()) == {preset.init_scale} and t.skipped_count == 20
    assert set(simulate(ApexHysteresisScaler(init_scale=2.0**16), found_inf=flags).scale.tolist()) == {65536.0}

    # DeepSpeed ZeRO (config defaults): hysteresis is refilled only at growth, which never comes,
    # so after one tolerated spike each spike halves the scale: 2**16 -> 1 after 16 backoffs, and
    # the 18th spike, at step 8750, raises "Current loss scale already at minimum". The same before
    # 0.17.1: 500 steps between spikes are too few for either growth step.
    for version, ref in ((None, deepspeed_zero({})), ("0.17.0", deepspeed_zero({"hysteresis": 2}, True))):
        t = simulate(DeepSpeedZeroScaler(version=version), found_inf=flags)
        assert t.stopped_at == 8750 and t.final.scale == 1.0
        assert t.stop_reason == f"Exception: {DeepSpeedDynamicLossScaler.END}"
        assert run_reference(ref, flags.size, lambda i, s: flags[i])[2:] == (8750, t.stop_reason)
    # Before 0.17.1, with {"enabled": true} alone (2**32, no hysteresis), the same run survived:
    # 2**32 / 2**20.
    assert simulate(DeepSpeedZeroScaler(version="0.17.0", config_defaults=False), found_inf=flags).final.scale == 4096.0

    # Megatron: one tolerated spike, then 19 backoffs from 2**32: 8192. The design notes say "falls
    # to 32"; that does not follow from Megatron's rule (hysteresis refilled only at growth) on
    # this stream. 32 comes out only if the hysteresis is re-armed after every backoff *and* the
    # steps between spikes overflow at scales above 65504 (S * 1 > 65504) -- neither is the case.
    t = simulate(MegatronScaler(), found_inf=flags)
    assert t.final.scale == 8192.0
    ref = MegatronDynamicGradScaler()
    run_reference(ref, flags.size, lambda i, s: flags[i])
    assert ref.scale == 8192.0


# ================================================================ plausible wrong configurations fail
def fields(preset: DynamicScaler) -> dict:
    keep = [f for f in DynamicScaler.__dataclass_fields__ if f not in ("name", "source")]
    return {k: getattr(preset, k) for k in keep}


def variant(preset: DynamicScaler, **changes) -> DynamicScaler:
    return DynamicScaler(**{**fields(preset), **changes})


ZERO, ZERO_REF = DeepSpeedZeroScaler(), (lambda: deepspeed_zero({}))
ZERO_HIGH = DeepSpeedZeroScaler(init_scale=2.0**1000, growth_interval=1)  # inf after 24 growths
ZERO_HIGH_REF = (lambda: deepspeed_zero({"initial_scale_power": 1000, "loss_scale_window": 1}))
MEGATRON_HIGH = MegatronScaler(init_scale=2.0**125, growth_interval=1)
FAIRSEQ_LOW = FairseqScaler(init_scale=1.0, raise_at_scale=0.25)
FAIRSEQ_TOL = FairseqScaler(tolerance=0.25, growth_interval=100)

# (what is wrong, the preset, the wrong configuration, the transcription, a stream that tells them apart)
WRONG = [
    ("DeepSpeed ZeRO with hysteresis refilled on every clean step",
     ZERO, variant(ZERO, refill="clean"), ZERO_REF, spike_stream()),
    ("DeepSpeed ZeRO without the raise at the minimum",
     ZERO, variant(ZERO, raise_at_min=False), ZERO_REF, spike_stream()),
    ("DeepSpeed ZeRO growing at the step of releases before 0.17.1 (one step early)",
     ZERO, variant(ZERO, tracker_after_overflow=0), ZERO_REF, np.zeros(1500, bool)),
    ("DeepSpeed ZeRO before 0.17.1 growing at the current step (one step late)",
     DeepSpeedZeroScaler(version="0.17.0"), variant(DeepSpeedZeroScaler(version="0.17.0"), tracker_after_overflow=-1),
     lambda: deepspeed_zero({"hysteresis": 2}, True), np.zeros(1500, bool)),
    ("DeepSpeed ZeRO running on at an infinite scale", ZERO_HIGH, variant(ZERO_HIGH, raise_at_inf=False),
     ZERO_HIGH_REF, np.r_[np.zeros(40, bool), np.ones(3, bool), np.zeros(3, bool)]),
    ("apex amp running on at a scale of 0", ApexAmpScaler(), variant(ApexAmpScaler(), raise_at_zero=False),
     ApexAmpLossScaler, np.ones(1100, bool)),
    ("fairseq running on from a scale of 0", FairseqScaler(init_scale=0.0),
     variant(FairseqScaler(init_scale=0.0), raise_at_zero=False),
     lambda: FairseqDynamicLossScaler(init_scale=0.0, scale_window=2**14), np.zeros(5, bool)),
    ("DeepSpeed non-ZeRO growing at ZeRO's step",
     DeepSpeedScaler(), variant(DeepSpeedScaler(), tracker_after_overflow=0), DeepSpeedFP16Optimizer,
     np.zeros(1500, bool)),
    ("Megatron with an inf guard", MEGATRON_HIGH, variant(MEGATRON_HIGH, inf_guard=True),
     lambda: MegatronDynamicGradScaler(initial_scale=2.0**125, growth_interval=1), np.zeros(5, bool)),
    ("Megatron in float64 instead of float32", MEGATRON_HIGH, variant(MEGATRON_HIGH, arithmetic="float64"),
     lambda: MegatronDynamicGradScaler(initial_scale=2.0**125, growth_interval=1), np.zeros(5, bool)),
    ("Megatron with hysteresis refilled on every clean step",
     MegatronScaler(), variant(MegatronScaler(), refill="clean"), MegatronDynamicGradScaler, spike_stream()),
    ("Keras 3 with Keras 2's floor at 1",
     Keras3Scaler(), variant(Keras3Scaler(), min_scale=1.0), Keras3LossScaleOptimizer, np.ones(20, bool)),
    ("jmp without its inf guard", JmpScaler(init_scale=3e38, growth_interval=1),
     variant(JmpScaler(init_scale=3e38, growth_interval=1), inf_guard=False),
     lambda: JmpDynamicLossScale(3e38, period=1), np.zeros(3, bool)),
    ("fairseq raising DeepSpeed's way (at the minimum, not below it)", FAIRSEQ_LOW,
     variant(FAIRSEQ_LOW, raise_at_scale=None, min_scale=0.25, raise_at_min=True),
     lambda: FairseqDynamicLossScaler(init_scale=1.0, min_loss_scale=0.25), np.ones(5, bool)),
    ("fairseq without its tolerance", FAIRSEQ_TOL, variant(FAIRSEQ_TOL, tolerance=0.0),
     lambda: FairseqDynamicLossScaler(init_scale=2.0**7, scale_window=100, tolerance=0.25),
     np.isin(np.arange(400), [50, 150, 160])),
    ("metaseq with a fixed window", MetaseqScaler(), variant(MetaseqScaler(), window_scaling=False),
     MetaseqDynamicLossScaler, np.zeros(1000, bool)),
]


@pytest.mark.parametrize("case, right, wrong, make_ref, flags", WRONG, ids=[w[0] for w in WRONG])
def test_plausible_wrong_configurations_fail(case, right, wrong, make_ref, flags):
    assert_matches(right, make_ref, flags)
    with pytest.raises(AssertionError):
        assert_matches(wrong, make_ref, flags)


# ================================================================ the presets themselves
FACTORIES = [TorchGradScaler, ApexAmpScaler, ApexHysteresisScaler, DeepSpeedZeroScaler, DeepSpeedScaler,
             MegatronScaler, KerasScaler, Keras3Scaler, JmpScaler, FairseqScaler, MetaseqScaler, StaticScaler]


def test_presets_are_listed_and_cite_their_source():
    assert {f.__name__ for f in FACTORIES} <= set(scaling.__all__)
    assert all(name == p.name for name, p in PRESETS.items())
    assert {p.name for p in PRESETS.values()} == {f().name for f in FACTORIES}  # one each, at its defaults
    assert "DeepSpeed ZeRO" in PRESETS and not any("0.17" in name or "class defaults" in name for name in PRESETS)
    for f in FACTORIES[1:-1]:  # the framework presets: the docstring cites the file that `source` names
        source = f().source
        repo, first_file = re.match(r"([\w.-]+/[\w.-]+)\S*: ([\w/.]+\.(?:py|cu))", source).groups()
        assert "Source:" in f.__doc__ and "Rule:" in f.__doc__, f.__name__
        assert repo in f.__doc__ and first_file in f.__doc__, (f.__name__, repo, first_file)
        revision = re.match(r"[^@:]+@([0-9a-f]{8})", source)
        if revision:
            assert revision.group(1) in f.__doc__, f.__name__


@pytest.mark.parametrize("name, arithmetic", [
    ("torch", "torch"), ("apex amp", "float64"), ("NeMo (apex hysteresis)", "torch"), ("DeepSpeed ZeRO", "float64"),
    ("DeepSpeed", "float64"), ("Megatron", "float32"), ("Keras 2", "float32"), ("Keras 3", "float32"),
    ("jmp", "float32"), ("fairseq", "float64"), ("metaseq", "float64"),
])
def test_each_preset_rounds_as_its_framework_stores_the_scale(name, arithmetic):
    """Python floats (apex amp, DeepSpeed, fairseq, metaseq), float32 tensors (Megatron, Keras,
    jmp), or a double product stored to float (torch's and apex's CUDA kernels)."""
    assert PRESETS[name].arithmetic == arithmetic


def test_deepspeed_zero_defaults_by_version():
    """Since 0.17.1 ZeRO always passes the fp16 config's values (2**16, hysteresis 2), and grows one
    step later than before. Before 0.17.1, with only {"enabled": true}, ZeRO used the class defaults
    (2**32, no hysteresis): that configuration exists only with a version before 0.17.1."""
    cfg = DeepSpeedZeroScaler()
    assert (cfg.init_scale, cfg.hysteresis, cfg.growth_interval, cfg.min_scale) == (2.0**16, 2, 1000, 1.0)
    assert cfg.tracker_after_overflow == -1 and cfg.raise_at_inf and cfg.name == "DeepSpeed ZeRO"
    ref = deepspeed_zero({})
    assert (ref.cur_scale, ref.delayed_shift, ref.scale_window, ref.min_scale) == (2**16, 2, 1000, 1)
    for version in ("0.17.1", "0.19.5", "v0.19.8", "1.0.0"):
        assert DeepSpeedZeroScaler(version=version) == cfg
    old = DeepSpeedZeroScaler(version="0.17.0")
    assert (old.init_scale, old.hysteresis, old.tracker_after_overflow) == (2.0**16, 2, 0)
    assert DeepSpeedZeroScaler(version="0.9.3") == old and old.name == "DeepSpeed ZeRO < 0.17.1"
    cls = DeepSpeedZeroScaler(version="0.17.0", config_defaults=False)
    assert (cls.init_scale, cls.hysteresis, cls.growth_interval, cls.min_scale) == (2.0**32, 1, 1000, 1.0)
    assert cls.name == "DeepSpeed ZeRO < 0.17.1 (class defaults)"
    old_ref = deepspeed_zero({}, before_0_17_1=True)
    assert (old_ref.cur_scale, old_ref.delayed_shift) == (2**32, 1)
    assert DeepSpeedZeroScaler(hysteresis=3, version="0.16.4", config_defaults=False).hysteresis == 3
    # a clean stream: the first growth is at step 1000 now (step 999 before 0.17.1)
    clean = np.zeros(1001, bool)
    assert simulate(cfg, found_inf=clean).scale[1000] == 2.0**16
    assert simulate(old, found_inf=clean).scale[1000] == 2.0**17
    assert_matches(cfg, lambda: deepspeed_zero({}), clean)
    assert_matches(old, lambda: deepspeed_zero({"hysteresis": 2}, True), clean)


def test_deepspeed_zero_raises_at_the_minimum_it_has_reached():
    """DeepSpeed raises when the scale *equals* min_loss_scale: a scale that starts below it (2**-1
    with a minimum of 1) first backs off up to the minimum, and the next overflow raises."""
    preset = DeepSpeedZeroScaler(init_scale=0.5, hysteresis=1)
    t = simulate(preset, found_inf=np.ones(4, bool))
    assert t.scale[:2].tolist() == [0.5, 1.0] and t.stopped_at == 1
    assert_matches(preset, lambda: deepspeed_zero({"initial_scale_power": -1, "hysteresis": 1}), np.ones(4, bool))


# ================================================================ runs that end, and runs that go on
INF, TINIEST = math.inf, 2.0**-1074
ZERO_END = "ZeroDivisionError: float division by zero"
INF_END = "OverflowError: cannot convert float infinity to integer"

# (case, preset, transcription, stream, the step that ends the run, the scale it was taken at, the exception)
ENDINGS = [
    ("apex amp: 1,091 backoffs reach 0.0; the next step divides by it", ApexAmpScaler(), ApexAmpLossScaler,
     np.ones(1200, bool), 1091, 0.0, ZERO_END),
    ("apex amp: that step ends the run even without an overflow", ApexAmpScaler(), ApexAmpLossScaler,
     np.r_[np.ones(1091, bool), np.zeros(20, bool)], 1091, 0.0, ZERO_END),
    ("apex amp starting at 0", ApexAmpScaler(init_scale=0.0), lambda: ApexAmpLossScaler(init_scale=0.0),
     np.zeros(5, bool), 0, 0.0, ZERO_END),
    ("DeepSpeed ZeRO: growth to inf, then an overflow (hysteresis 2)", ZERO_HIGH, ZERO_HIGH_REF,
     np.r_[np.zeros(40, bool), np.ones(3, bool)], 40, INF, INF_END),
    ("DeepSpeed ZeRO at inf, hysteresis 1 (the backoff's message)",
     DeepSpeedZeroScaler(init_scale=2.0**1000, growth_interval=1, hysteresis=1),
     lambda: deepspeed_zero({"initial_scale_power": 1000, "loss_scale_window": 1, "hysteresis": 1}),
     np.r_[np.zeros(30, bool), [True]], 30, INF, INF_END),
    ("DeepSpeed ZeRO before 0.17.1 at inf", DeepSpeedZeroScaler(init_scale=2.0**1000, growth_interval=1,
                                                                 version="0.17.0"),
     lambda: deepspeed_zero({"initial_scale_power": 1000, "loss_scale_window": 1}, True),
     np.r_[np.zeros(30, bool), [True]], 30, INF, INF_END),
    ("DeepSpeed ZeRO at its minimum", ZERO, ZERO_REF, np.ones(40, bool), 17, 1.0,
     f"Exception: {DeepSpeedDynamicLossScaler.END}"),
    ("fairseq at its minimum", FairseqScaler(), lambda: FairseqDynamicLossScaler(init_scale=2.0**7, scale_window=2**14),
     np.ones(40, bool), 20, 2.0**-13,
     "FloatingPointError: Minimum loss scale reached (0.0001). Your loss is probably exploding. Try lowering the "
     "learning rate, using gradient clipping or increasing the batch size."),
    ("fairseq starting at 0 (zero_grad divides by it)", FairseqScaler(init_scale=0.0),
     lambda: FairseqDynamicLossScaler(init_scale=0.0, scale_window=2**14), np.zeros(5, bool), 0, 0.0, ZERO_END),
    ("metaseq starting at 0", MetaseqScaler(init_scale=0.0), lambda: MetaseqDynamicLossScaler(init_scale=0.0),
     np.zeros(5, bool), 0, 0.0, ZERO_END),
]


@pytest.mark.parametrize("case, preset, make_ref, flags, step, scale, reason", ENDINGS, ids=[e[0] for e in ENDINGS])
def test_runs_end_where_the_framework_raises(case, preset, make_ref, flags, step, scale, reason):
    """The step, the scale it was taken at and the exception, as the transcription raises it (from
    the framework's own expression: 1./scale, int(scale), its minimum-scale check)."""
    assert_matches(preset, make_ref, flags)
    t = simulate(preset, found_inf=flags)
    assert (t.stopped_at, t.scale[step], t.stop_reason) == (step, scale, reason)
    assert t.skipped[step] and np.isnan(t.scale[step + 1:]).all() and t.final.stopped
    if scale == 0.0 and step:
        assert t.scale[step - 1] == TINIEST  # apex: the last backoff halved 2**-1074 to 0.0


# (case, preset, transcription, stream, the scale the run reaches and goes on at)
GOES_ON = [
    ("torch at 0: no error (its unscale multiplies by inf)", TorchGradScaler(), TorchUpdateScale,
     np.r_[np.ones(200, bool), np.zeros(50, bool)], 0.0),
    ("torch started at inf: every overflow keeps it", TorchGradScaler(init_scale=INF),
     lambda: TorchUpdateScale(init_scale=INF), np.ones(5, bool), INF),
    ("Keras 3 at 0 (no floor)", Keras3Scaler(), Keras3LossScaleOptimizer, np.ones(200, bool), 0.0),
    ("Keras 3 at inf (no guard)", Keras3Scaler(init_scale=3e38, growth_interval=1),
     lambda: Keras3LossScaleOptimizer(3e38, 1), np.r_[np.zeros(3, bool), np.ones(3, bool)], INF),
    ("Megatron at inf (no guard; --check-for-nan-in-loss-and-grad is off with dynamic scaling)",
     MegatronScaler(init_scale=3e38, growth_interval=1), lambda: MegatronDynamicGradScaler(3e38, growth_interval=1),
     np.r_[np.zeros(3, bool), np.ones(3, bool)], INF),
    ("jmp at 0 with min_loss_scale 0", JmpScaler(min_scale=0.0), lambda: JmpDynamicLossScale(min_loss_scale=0.0),
     np.ones(200, bool), 0.0),
    ("DeepSpeed without ZeRO at inf (its messages print the scale with {})",
     DeepSpeedScaler(init_scale=2.0**1000, growth_interval=1),
     lambda: DeepSpeedFP16Optimizer(2**1000, scale_window=1), np.r_[np.zeros(40, bool), np.ones(3, bool)], INF),
    ("apex amp at inf with no cap (1./inf is 0)", ApexAmpScaler(init_scale=2.0**1000, growth_interval=1,
                                                                max_scale=INF),
     lambda: ApexAmpLossScaler(2.0**1000, 1, None, INF), np.r_[np.zeros(40, bool), np.ones(3, bool)], INF),
    ("fairseq at inf", FairseqScaler(init_scale=2.0**1000, growth_interval=1),
     lambda: FairseqDynamicLossScaler(init_scale=2.0**1000, scale_window=1), np.r_[np.zeros(40, bool),
                                                                                   np.ones(3, bool)], INF),
]


@pytest.mark.parametrize("case, preset, make_ref, flags, reached", GOES_ON, ids=[g[0] for g in GOES_ON])
def test_runs_go_on_where_the_framework_does_not_raise(case, preset, make_ref, flags, reached):
    assert_matches(preset, make_ref, flags)
    t = simulate(preset, found_inf=flags)
    assert t.stopped_at is None and t.stop_reason is None and t.final.scale == reached


# ================================================================ arguments
@pytest.mark.parametrize("factory, kwargs, error, message", [
    (ApexAmpScaler, dict(max_scale=None), TypeError, "max_scale must be a number (apex's max_loss_scale"),
    (ApexAmpScaler, dict(init_scale="1"), TypeError, "init_scale must be a number"),
    (ApexAmpScaler, dict(growth_interval=0), ValueError, "growth_interval must be at least 1 (apex's scale_window"),
    (ApexHysteresisScaler, dict(hysteresis=None), TypeError, "hysteresis must be a whole number"),
    (ApexHysteresisScaler, dict(hysteresis=0), ValueError, "hysteresis must be a whole number >= 1"),
    (DeepSpeedZeroScaler, dict(min_scale=None), TypeError, "min_scale must be a number (DeepSpeed's min_loss_scale"),
    (DeepSpeedZeroScaler, dict(config_defaults="no"), TypeError, "config_defaults must be True or False"),
    (DeepSpeedZeroScaler, dict(config_defaults=False), ValueError,
     "config_defaults=False (the class defaults 2**32 and hysteresis 1) exists only in DeepSpeed before 0.17.1: "
     "pass version='0.17.0' with it"),
    (DeepSpeedZeroScaler, dict(version="0.17"), ValueError, "version must be a DeepSpeed release such as '0.17.0'"),
    (DeepSpeedZeroScaler, dict(version="latest"), ValueError, "version must be a DeepSpeed release such as"),
    (DeepSpeedZeroScaler, dict(version=0.17), TypeError, "version must be a DeepSpeed release such as '0.17.0'"),
    (DeepSpeedZeroScaler, dict(version="0.8.0"), ValueError, "version must be 0.9.3 or later"),
    (DeepSpeedZeroScaler, dict(min_scale=0), ValueError, "min_scale must be a finite number above 0"),
    (DeepSpeedZeroScaler, dict(min_scale=math.inf), ValueError, "min_scale must be a finite number above 0"),
    (DeepSpeedZeroScaler, dict(init_scale=0.0), ValueError, "init_scale must be above 0"),
    (DeepSpeedZeroScaler, dict(init_scale=math.nan), ValueError, "init_scale must be above 0"),
    (DeepSpeedScaler, dict(min_scale=-1.0), ValueError, "min_scale must be a finite number above 0"),
    (DeepSpeedScaler, dict(init_scale=0), ValueError, "init_scale must be above 0"),
    (DeepSpeedZeroScaler, dict(growth_interval=0), ValueError, "growth_interval must be at least 1"),
    (DeepSpeedScaler, dict(min_scale=None), TypeError, "min_scale must be a number"),
    (MegatronScaler, dict(min_scale=None), TypeError, "min_scale must be a number (Megatron's --min-loss-scale"),
    (MegatronScaler, dict(min_scale=0.0), ValueError, "min_scale must be > 0 and at most init_scale"),
    (MegatronScaler, dict(min_scale=8.0, init_scale=4.0), ValueError, "min_scale must be > 0 and at most init_scale"),
    (MegatronScaler, dict(init_scale=-1.0), ValueError, "init_scale must be > 0"),
    (MegatronScaler, dict(hysteresis=0), ValueError, "hysteresis must be at least 1"),
    (KerasScaler, dict(growth_interval=2.5), TypeError, "growth_interval must be a whole number of steps"),
    (Keras3Scaler, dict(init_scale=None), TypeError, "init_scale must be a number"),
    (JmpScaler, dict(min_scale=None), TypeError, "min_scale must be a number (jmp's min_loss_scale"),
    (JmpScaler, dict(growth_factor="2"), TypeError, "growth_factor must be a number"),
    (JmpScaler, dict(growth_interval=0), ValueError, "growth_interval must be at least 1 (jmp's period"),
    (FairseqScaler, dict(world_size=0), ValueError, "world_size must be at least 1"),
    (FairseqScaler, dict(update_freq=None), TypeError, "update_freq must be a whole number"),
    (FairseqScaler, dict(world_size=2**15), ValueError, "world_size * update_freq must be at most 16384"),
    (FairseqScaler, dict(raise_at_scale=None), TypeError,
     "raise_at_scale must be a number (fairseq's --min-loss-scale"),
    (FairseqScaler, dict(tolerance=math.nan), ValueError, "tolerance must be a number"),
    (FairseqScaler, dict(raise_at_scale=-1.0), ValueError,
     "raise_at_scale (fairseq's --min-loss-scale) must be at least 0 unless min_scale (--threshold-loss-scale) "
     "is above 0, not -1.0: the scale would halve to 0"),
    (MetaseqScaler, dict(no_backoff_below=0.0), ValueError,
     "no_backoff_below (metaseq's min_loss_scale) must be above 0 unless min_scale (its threshold) is"),
    (MetaseqScaler, dict(no_backoff_below=None), TypeError, "no_backoff_below must be a number"),
    (StaticScaler, dict(scale="1"), TypeError, "scale must be a number (the fixed loss scale"),
    (StaticScaler, dict(scale=None), TypeError, "scale must be a number"),
    (StaticScaler, dict(scale=10**400), ValueError, "scale is too large for a float"),
    (TorchGradScaler, dict(init_scale=None), TypeError, "init_scale must be a number such as 65536.0"),
    (TorchGradScaler, dict(growth_factor=1.0), ValueError, "growth_factor must be > 1.0"),
])
def test_preset_arguments_are_checked_where_they_are_given(factory, kwargs, error, message):
    """None, 0 or a wrong type used to fail deep inside (a comparison with None, struct.error,
    ZeroDivisionError); now one line names the argument and what to pass."""
    with pytest.raises(error, match=re.escape(message)) as info:
        factory(**kwargs)
    assert "\n" not in str(info.value)


def test_a_floor_lets_fairseq_and_metaseq_take_minimums_at_or_below_0():
    """A minimum at or below 0 would let the scale halve to 0, where fairseq's and metaseq's trainers
    divide by it; with a floor (fairseq's --threshold-loss-scale, metaseq's threshold) above 0 it
    cannot, and those minimums are accepted."""
    flags = np.ones(60, bool)
    preset = FairseqScaler(raise_at_scale=-1.0, min_scale=0.5)
    assert_matches(preset, lambda: FairseqDynamicLossScaler(init_scale=2.0**7, scale_window=2**14, threshold=0.5,
                                                            min_loss_scale=-1.0), flags)
    assert simulate(preset, found_inf=flags).final.scale == 0.5
    preset = MetaseqScaler(no_backoff_below=0.0, min_scale=2.0**-3)
    assert_matches(preset, lambda: MetaseqDynamicLossScaler(threshold=2.0**-3, min_loss_scale=0.0), flags)


def test_none_keeps_its_documented_meaning():
    """Where a preset documents None (the framework's default, or no floor), None still works."""
    assert DeepSpeedZeroScaler(init_scale=None, hysteresis=None) == DeepSpeedZeroScaler()
    assert FairseqScaler(init_scale=None, growth_interval=None, min_scale=None) == FairseqScaler()
    assert FairseqScaler(world_size=4).growth_interval == 2**12
    assert ApexAmpScaler(min_scale=None).min_scale is None and ApexAmpScaler(min_scale=0).min_scale is None
    assert MetaseqScaler(min_scale=None).min_scale is None
    assert ApexAmpScaler(max_scale=math.inf).init_scale == 2.0**16


def test_jmp_factor_must_be_a_power_of_two():
    with pytest.raises(ValueError, match="power of two"):
        JmpScaler(growth_factor=3)
    assert JmpScaler(growth_factor=4).backoff_factor == 0.25
