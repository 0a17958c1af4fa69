"""ampviz.scaling: the simulator equals stepping the state machine, and TorchGradScaler equals the
real torch.amp.GradScaler("cpu") step for step (scale, skipped steps, growth tracker)."""

import math
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ampviz.scaling import synth
from ampviz.formats import BF16, FP16, FP32
from ampviz.scaling import (
    ApexAmpScaler, ApexHysteresisScaler, DeepSpeedScaler, DeepSpeedZeroScaler, DynamicScaler, FairseqScaler,
    Keras3Scaler, KerasScaler, MegatronScaler, MetaseqScaler, ScalerState, StaticScaler, TorchGradScaler,
    overflows, simulate,
)

INF = float("inf")


# ---------------------------------------------------------------- references
def fp16_product_overflows(scale, g) -> bool:
    """The fp16 overflow model as numpy's own float16 arithmetic computes it: the scale and the
    gradient cast (through float32) to float16 and multiplied in float16."""
    with np.errstate(over="ignore", invalid="ignore"):
        return not np.isfinite(np.float16(np.float32(scale)) * np.float16(np.float32(g)))


def fp32_loss_overflows(scale, g) -> bool:
    """The fp32-loss overflow model as numpy's own arithmetic computes it: the float32 scale times
    the float32 gradient, rounded to float32 (numpy multiplies float32 in float32), then cast to
    float16."""
    with np.errstate(over="ignore", invalid="ignore"):
        return not np.isfinite(np.float16(np.float32(scale) * np.float32(g)))


# the two overflow models (simulate's loss_dtype), each with its plain reference
MODELS = {"float32": fp32_loss_overflows, "float16": fp16_product_overflows}


def step_by_step(policy, found_inf=None, grad_max=None, fmt=FP16, overflowed=None, state=None,
                 loss_dtype="float32"):
    """The plainest possible simulation: call ``adjust`` once per step. ``overflowed(scale, g)``
    replaces ``overflows`` for long grad_max streams (it is much faster per call). Returns the
    trace's arrays, the final state and (the step that ended the run, its exception) or (None, None)."""
    st = policy.initial_state() if state is None else state
    n = len(found_inf if found_inf is not None else grad_max)
    scale, skipped, tracker, hyst = [], [], [], []
    end = (None, None)  # the step that ended the run, and the exception the framework raises there
    for i in range(n):
        s = st.scale if not st.stopped else math.nan
        if st.stopped:
            f = True
        elif found_inf is not None:
            f = bool(found_inf[i])
        elif overflowed is not None:
            f = overflowed(st.scale, grad_max[i])
        else:
            f = bool(overflows(st.scale, grad_max[i], fmt, loss_dtype))
        scale.append(s)
        before = st
        st = policy.adjust(st, f)
        if st.stopped and not before.stopped:
            end = (i, policy._stop_reason(before, f))
            assert end[1] is not None  # every end has its exception
        skipped.append(f or end[0] == i)  # the step that ends the run is not taken
        tracker.append(st.growth_tracker)
        hyst.append(st.hysteresis)
    return np.array(scale), np.array(skipped, bool), np.array(tracker), np.array(hyst), st, end


class RealGradScaler:
    """Drives torch.amp.GradScaler("cpu") with a parameter whose gradient is set to inf or to a
    finite value each step, and records what it does."""

    def __init__(self, **kwargs):
        self.p = torch.nn.Parameter(torch.zeros(1))
        self.opt = torch.optim.SGD([self.p], lr=0.0)
        self.steps_taken = 0
        inner = self.opt.step

        def counting_step(*args, **kw):
            self.steps_taken += 1
            return inner(*args, **kw)

        self.opt.step = counting_step
        self.scaler = torch.amp.GradScaler("cpu", **kwargs)
        self.scaler.scale(torch.zeros(()))  # the lazy float32 scale and int32 tracker

    def run(self, found_inf):
        scale, skipped, tracker = [], [], []
        for f in found_inf:
            scale.append(self.scaler.get_scale())
            before = self.steps_taken
            self.p.grad = torch.tensor([INF if f else 1.0])
            self.scaler.step(self.opt)
            self.scaler.update()
            skipped.append(self.steps_taken == before)
            tracker.append(self.scaler._get_growth_tracker())
        return np.array(scale, np.float64), np.array(skipped), np.array(tracker)


def torch_kwargs(policy):
    return dict(init_scale=policy.init_scale, growth_factor=policy.growth_factor,
                backoff_factor=policy.backoff_factor, growth_interval=policy.growth_interval)


def same_floats(a, b) -> bool:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return bool(np.all((a == b) | (np.isnan(a) & np.isnan(b))))


def assert_matches_torch(policy, found_inf):
    real_scale, real_skipped, real_tracker = RealGradScaler(**torch_kwargs(policy)).run(found_inf)
    trace = simulate(policy, found_inf=np.asarray(found_inf, bool))
    bad = np.flatnonzero(~((trace.scale.astype(np.float64) == real_scale)
                           | (np.isnan(trace.scale) & np.isnan(real_scale))))
    assert bad.size == 0, f"scale differs first at step {bad[0]}: {trace.scale[bad[0]]!r} vs {real_scale[bad[0]]!r}"
    assert np.array_equal(trace.skipped, real_skipped)
    assert np.array_equal(trace.growth_tracker, real_tracker)


def assert_simulate_equals_stepping(policy, overflowed=None, state=None, **stream):
    scale, skipped, tracker, hyst, final, end = step_by_step(policy, overflowed=overflowed, state=state, **stream)
    trace = simulate(policy, state=state, **stream)
    assert (trace.stopped_at, trace.stop_reason) == end
    bad = np.flatnonzero(~((trace.scale.astype(np.float64) == scale) | (np.isnan(trace.scale) & np.isnan(scale))))
    assert bad.size == 0, f"scale differs first at step {bad[0]}: {trace.scale[bad[0]]!r} vs {scale[bad[0]]!r}"
    assert same_floats(trace.scale, scale)
    assert np.array_equal(trace.skipped, skipped)
    assert np.array_equal(trace.growth_tracker, tracker)
    assert np.array_equal(trace.hysteresis, hyst)
    assert (same_floats(trace.final.scale, final.scale) and trace.final[1:] == final[1:]) \
        or (math.isnan(trace.final.scale) and final.stopped)


# ---------------------------------------------------------------- simulate == stepping adjust
policies = st.builds(
    DynamicScaler,
    init_scale=st.sampled_from([2.0**16, 1.0, 2.0**-10, 3e38, 2.0**32, 0.0, INF, 2.0**-140]),
    growth_factor=st.sampled_from([2.0, 1.5, 1.001]),
    backoff_factor=st.sampled_from([0.5, 0.9, 0.125, 0.0]),
    growth_interval=st.integers(-1, 40),
    hysteresis=st.integers(1, 3),
    refill=st.sampled_from(["growth", "clean"]),
    min_scale=st.sampled_from([None, 1.0, 2.0**-5, 0.0]),
    max_scale=st.sampled_from([None, 2.0**24, INF]),
    raise_at_min=st.booleans(),
    growth_at_least=st.booleans(),
    inf_guard=st.booleans(),
    tracker_after_overflow=st.sampled_from([0, -1]),
    tolerance=st.sampled_from([0.0, 0.0, 0.02, 0.3, 1.0]),
    raise_at_scale=st.sampled_from([None, None, 1.0, 2.0**-3]),
    no_backoff_below=st.sampled_from([None, None, 1.0, 0.3]),
    window_scaling=st.booleans(),
    arithmetic=st.sampled_from(["torch", "float32", "float64"]),
    raise_at_zero=st.booleans(),
    raise_at_inf=st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(policy=policies, flags=st.lists(st.booleans(), max_size=300))
def test_simulate_found_inf_equals_stepping(policy, flags):
    assert_simulate_equals_stepping(policy, found_inf=np.array(flags, bool))


@settings(max_examples=150, deadline=None)
@given(policy=policies, seed=st.integers(0, 2**32 - 1), n=st.integers(0, 3000),
       level=st.integers(-30, 20), fmt=st.sampled_from([FP16, BF16, FP32]), low=st.booleans())
def test_simulate_grad_max_equals_stepping(policy, seed, n, level, fmt, low):
    rng = np.random.default_rng(seed)
    g = (2.0**level * np.exp2(rng.normal(0, 3, n))).astype(np.float32)
    g[rng.random(n) < 0.01] = np.inf
    g[rng.random(n) < 0.01] = np.nan
    assert_simulate_equals_stepping(policy, grad_max=g, fmt=fmt, loss_dtype=fmt.torch_dtype if low else "float32")


def test_long_runs_equal_stepping():
    rng = np.random.default_rng(3)
    flags = rng.random(30_000) < 0.002
    for policy in (TorchGradScaler(), TorchGradScaler(growth_interval=7, growth_factor=1.5, backoff_factor=0.9),
                   DynamicScaler(hysteresis=2, refill="clean", growth_interval=100, min_scale=1.0),
                   DeepSpeedZeroScaler(growth_interval=100), DeepSpeedZeroScaler(growth_interval=100, version="0.17.0"),
                   DeepSpeedZeroScaler(init_scale=2.0**1000, growth_interval=7),  # inf, then the next overflow ends
                   ApexAmpScaler(init_scale=2.0**-1070, growth_interval=3000)):  # 0 after a few overflows: the end
        assert_simulate_equals_stepping(policy, found_inf=flags)
    assert simulate(DeepSpeedZeroScaler(init_scale=2.0**1000, growth_interval=7), found_inf=flags).stop_reason == (
        "OverflowError: cannot convert float infinity to integer")
    assert simulate(ApexAmpScaler(init_scale=2.0**-1070, growth_interval=3000), found_inf=flags).stop_reason == (
        "ZeroDivisionError: float division by zero")


# ---------------------------------------------------------------- dense streams: every step an event
# Where overflows or growths come every step or every few steps, simulate runs step by step in
# Python, takes whole stretches with numpy where the scale cannot move, and replaces the loop by a
# running product where the updates are exact; each must equal stepping adjust to the bit.
N_DENSE = 20_000  # more than one chunk of the step-by-step loop (16384 steps)
F32_MAX = float(np.finfo(np.float32).max)
DENSE = {
    "gi=1, x4, 0.995 (the widget's slow case)": TorchGradScaler(growth_interval=1, growth_factor=4.0,
                                                                  backoff_factor=0.995),
    "gi=1 at torch's factors": TorchGradScaler(growth_interval=1),
    "gi=1, x1.001, 0.9": TorchGradScaler(growth_interval=1, growth_factor=1.001, backoff_factor=0.9),
    "gi=1, x1.5, 0.75 (float32 factors, not powers of 2)": TorchGradScaler(growth_interval=1, growth_factor=1.5,
                                                                            backoff_factor=0.75),
    "gi=3, x2.5, 0.995": TorchGradScaler(growth_interval=3, growth_factor=2.5, backoff_factor=0.995),
    "gi=10": TorchGradScaler(growth_interval=10),
    "gi=1 from float32's max, x1.001 (saturates)": TorchGradScaler(init_scale=F32_MAX, growth_interval=1,
                                                                    growth_factor=1.001),
    "gi=1 from 3e38, x4 (refused growth)": TorchGradScaler(init_scale=3e38, growth_interval=1, growth_factor=4.0),
    "gi=1 from 2^-140, 0.9 (subnormal scales)": TorchGradScaler(init_scale=2.0**-140, growth_interval=1,
                                                                 backoff_factor=0.9),
    "gi=1, growth to inf allowed (float32)": DynamicScaler(init_scale=2.0**120, growth_interval=1, inf_guard=False,
                                                            arithmetic="float32"),
    "gi=1, growth_at_least, tracker -1": DynamicScaler(growth_interval=1, growth_at_least=True,
                                                        tracker_after_overflow=-1),
    "hysteresis 2, clean refill, gi=1": ApexHysteresisScaler(growth_interval=1),
    "hysteresis 3, clean refill, gi=2000": ApexHysteresisScaler(init_scale=2.0**16, growth_interval=2000, hysteresis=3),
    "hysteresis 2, growth refill, floor 1 (Megatron)": MegatronScaler(),
    "hysteresis 2, floor 1, raises (DeepSpeed ZeRO)": DeepSpeedZeroScaler(growth_interval=2),
    "hysteresis 2, floor 1, raises (DeepSpeed ZeRO before 0.17.1)": DeepSpeedZeroScaler(growth_interval=2,
                                                                                        version="0.17.0"),
    "DeepSpeed ZeRO from 2^1000, gi=1: inf, then an overflow ends the run": DeepSpeedZeroScaler(
        init_scale=2.0**1000, growth_interval=1, consecutive_hysteresis=True, min_scale=2.0**-1000),
    "raise_at_inf without a floor, float32 (inf then NaN-free backoffs)": DynamicScaler(
        init_scale=2.0**120, growth_interval=1, inf_guard=False, arithmetic="float32", raise_at_inf=True,
        hysteresis=2, refill="clean"),
    "float64, floor 1, tracker -1 (DeepSpeed)": DeepSpeedScaler(growth_interval=1),
    "float64, cap 2^24 (apex amp)": ApexAmpScaler(growth_interval=1, min_scale=0.5),
    "apex amp at its defaults (0 ends the run)": ApexAmpScaler(),
    "apex amp without a floor, gi=3, from 2^-1060 (0 ends the run)": ApexAmpScaler(init_scale=2.0**-1060,
                                                                                  growth_interval=3),
    "raise_at_zero, torch arithmetic, backoff 0": DynamicScaler(backoff_factor=0.0, growth_interval=2,
                                                                raise_at_zero=True),
    "raise_at_zero, float32, a ceiling of 0": DynamicScaler(growth_interval=1, max_scale=0.0, raise_at_zero=True,
                                                             arithmetic="float32"),
    "float32, floor 1, growth_at_least (Keras 2)": KerasScaler(growth_interval=1),
    "float32, no floor, no guard (Keras 3)": Keras3Scaler(growth_interval=1),
    "float64, tolerance, raises below 2^-3 (fairseq)": FairseqScaler(growth_interval=1, tolerance=0.25,
                                                                     raise_at_scale=2.0**-3),
    "float64, window follows the scale, no backoff below 2^-5 (metaseq)": MetaseqScaler(growth_interval=1),
    "metaseq at its defaults": MetaseqScaler(),
    "torch at its defaults (decays to 0)": TorchGradScaler(),
    "0.995 at gi=2000 (decays to a subnormal fixed point)": TorchGradScaler(backoff_factor=0.995),
    "backoff 0": TorchGradScaler(backoff_factor=0.0, growth_interval=1),
    "NaN backoff": TorchGradScaler(backoff_factor=math.nan, growth_interval=2),
    "negative backoff": TorchGradScaler(backoff_factor=-0.5, growth_interval=1),
}


def dense_found_inf(kind: str, n: int = N_DENSE) -> np.ndarray:
    rng = np.random.default_rng(len(kind))
    return {
        "every step": np.ones(n, bool),
        "alternating": np.arange(n) % 2 == 0,
        "random half": rng.random(n) < 0.5,
        "runs": (np.arange(n) // 700) % 3 == 0,  # 700 overflows, then 1400 clean steps
    }[kind]


@pytest.mark.parametrize("name", list(DENSE))
def test_dense_found_inf_equals_stepping(name):
    for kind in ("every step", "alternating", "random half", "runs"):
        assert_simulate_equals_stepping(DENSE[name], found_inf=dense_found_inf(kind))


@pytest.mark.parametrize("loss_dtype", list(MODELS))
@pytest.mark.parametrize("name", list(DENSE))
def test_dense_grad_max_equals_stepping(name, loss_dtype):
    for strength in (0.5, 1.0):  # 1.0: spikes that overflow at every scale
        g = synth.scenario("spikes", N_DENSE, strength, np.random.default_rng(4))
        assert_simulate_equals_stepping(DENSE[name], overflowed=MODELS[loss_dtype], grad_max=g, loss_dtype=loss_dtype)


@pytest.mark.parametrize("policy, state", [
    (TorchGradScaler(growth_interval=1), ScalerState(1024.0, 0, 3)),  # hysteresis left over
    (TorchGradScaler(growth_interval=1), ScalerState(math.nan)),
    (TorchGradScaler(growth_interval=2000), ScalerState(math.nan)),
    (DynamicScaler(hysteresis=2, growth_interval=500), ScalerState(0.0, -1, 2)),
    (FairseqScaler(tolerance=0.25, growth_interval=3), ScalerState(128.0, 0, 1, False, 2, 5)),
    (DynamicScaler(raise_at_scale=2.0, min_scale=1.0, growth_interval=1000), ScalerState(1.0)),
    (DynamicScaler(raise_at_scale=2.0, min_scale=4.0, hysteresis=3, growth_interval=1000), ScalerState(4.0, 0, 3)),
    (MetaseqScaler(), ScalerState(2.0**-5, 7, 1, False, 0, 0, 1)),
    (ApexAmpScaler(), ScalerState(0.0)),  # the first step divides by 0
    (ApexAmpScaler(), ScalerState(-0.0, 5)),
    (FairseqScaler(), ScalerState(0.0)),
    (DeepSpeedZeroScaler(), ScalerState(INF, -1, 2)),  # the first overflow formats int(inf)
    (DeepSpeedZeroScaler(), ScalerState(math.nan, 3, 1)),  # int(nan): ValueError
    (DeepSpeedZeroScaler(growth_interval=1), ScalerState(2.0**1023, 0, 2)),
])
def test_starting_states_equal_stepping(policy, state):
    """simulate(state=...) from odd states: hysteresis left on a scaler without it, a NaN or zero
    scale, fairseq's counters half way, a scale at which an overflow ends the run."""
    for kind in ("every step", "alternating", "random half", "runs"):
        assert_simulate_equals_stepping(policy, state=state, found_inf=dense_found_inf(kind, 3000))
    g = synth.scenario("spikes", 3000, 1.0, np.random.default_rng(5))
    for loss_dtype, reference in MODELS.items():
        assert_simulate_equals_stepping(policy, state=state, overflowed=reference, grad_max=g, loss_dtype=loss_dtype)


def test_each_end_names_its_exception():
    """stop_reason is the exception each rule ends the run with (the last line of the traceback)."""
    cases = [
        (ApexAmpScaler(), np.ones(1100, bool), 1091, "ZeroDivisionError: float division by zero"),
        (DeepSpeedZeroScaler(growth_interval=1), np.r_[np.zeros(1100, bool), [True]], 1100,
         "OverflowError: cannot convert float infinity to integer"),
        (DeepSpeedZeroScaler(), np.ones(30, bool), 17,
         "Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run."),
        (FairseqScaler(raise_at_scale=2.0**-3), np.ones(30, bool), 9,
         "FloatingPointError: Minimum loss scale reached (0.125). Your loss is probably exploding. Try lowering "
         "the learning rate, using gradient clipping or increasing the batch size."),
    ]
    for policy, flags, step, reason in cases:
        t = simulate(policy, found_inf=flags)
        assert (t.stopped_at, t.stop_reason) == (step, reason)
        assert_simulate_equals_stepping(policy, found_inf=flags)
    t = simulate(DeepSpeedZeroScaler(), found_inf=[True], state=ScalerState(math.nan, 0, 2))
    assert (t.stopped_at, t.stop_reason) == (0, "ValueError: cannot convert float NaN to integer")
    t = simulate(DynamicScaler(min_scale=INF, raise_at_min=True, raise_at_inf=True), found_inf=[True],
                 state=ScalerState(INF))  # both apply: raise_at_inf is checked first
    assert t.stop_reason.startswith("OverflowError")
    for policy in (TorchGradScaler(), ApexAmpScaler(min_scale=1.0), DeepSpeedScaler()):  # no end
        t = simulate(policy, found_inf=np.ones(1200, bool))
        assert t.stopped_at is None and t.stop_reason is None


def test_real_gradscaler_goes_on_at_scale_0_and_inf():
    """torch ends nothing at a scale of 0 or inf (its unscale multiplies by 1/scale as a float32
    tensor: inf or 0, no error); the simulation goes on as it does, step for step."""
    for init, flags in ((0.0, [False, True, False, False, True]), (INF, [True, False, True, True]),
                        (2.0**-149, [True, True, False, False])):
        policy = TorchGradScaler(init_scale=init, growth_interval=1)
        assert_matches_torch(policy, flags)
        assert simulate(policy, found_inf=flags).stopped_at is None
    # at 0 the scaled gradients are 0, finite: the step is taken, with 0 * (1/0) = NaN gradients
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=0.0)
    scaler.scale((p * 3.0).sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert torch.isnan(p).all() and scaler.get_scale() == 0.0
    assert not simulate(TorchGradScaler(init_scale=0.0), grad_max=[3.0]).skipped[0]  # not skipped here either


def test_refused_growth_on_a_grad_max_stream():
    """At float32's max with gradients that never overflow in bf16, every clean step's growth is
    refused (torch keeps the scale when the product is inf)."""
    g = np.full(5000, 2.0**-100, np.float32)
    g[::7] = np.inf
    for policy in (TorchGradScaler(init_scale=F32_MAX, growth_interval=1, backoff_factor=0.999),
                   TorchGradScaler(init_scale=3e38, growth_interval=1, growth_factor=4.0)):
        for loss_dtype in ("float32", "bfloat16"):
            assert_simulate_equals_stepping(policy, grad_max=g, fmt=BF16, loss_dtype=loss_dtype)


def test_rounding_without_the_array_trick(monkeypatch):
    """Where storing a double in an array('f') does not round as a C cast does, the loop rounds
    with the struct module instead: the same traces."""
    from ampviz.scaling.simulator import steps as simulate_steps  # where the step-by-step loop reads the flag

    monkeypatch.setattr(simulate_steps, "_FAST_F32", False)
    for name in ("gi=1, x4, 0.995 (the widget's slow case)", "gi=3, x2.5, 0.995", "hysteresis 2, clean refill, gi=1"):
        assert_simulate_equals_stepping(DENSE[name], found_inf=dense_found_inf("random half", 3000))
        g = synth.scenario("spikes", 3000, 0.5, np.random.default_rng(6))
        for loss_dtype, reference in MODELS.items():
            assert_simulate_equals_stepping(DENSE[name], overflowed=reference, grad_max=g, loss_dtype=loss_dtype)


def test_collapsed_scales_on_sparse_spikes_are_taken_at_once():
    """Spikes that overflow at every scale, 500 steps apart, drive torch's scale to 0, which no
    backoff moves: the steps from there to the next growth are taken with numpy at once, not
    spike by spike (each used to cost a numpy search)."""
    g = synth.scenario("spikes", 20_000, 1.0, np.random.default_rng(8))
    for policy in (TorchGradScaler(), MegatronScaler(), ApexHysteresisScaler(), KerasScaler()):
        for loss_dtype, reference in MODELS.items():
            assert_simulate_equals_stepping(policy, overflowed=reference, grad_max=g, loss_dtype=loss_dtype)


def test_the_fast_reference_is_the_overflow_model():
    rng = np.random.default_rng(9)
    g = np.exp2(rng.uniform(-30, 20, 3000)).astype(np.float32)
    g[::50] = np.inf
    g[::77] = np.nan
    for s in (1.0, 2.0**10, 65504.0, 65520.0, 3e38, 0.0, 2.0**-140, math.nan):
        for loss_dtype, reference in MODELS.items():
            assert [reference(s, x) for x in g] == overflows(s, g, loss_dtype=loss_dtype).tolist(), (s, loss_dtype)


@pytest.mark.parametrize("policy, flags", [
    (TorchGradScaler(growth_interval=1, growth_factor=4.0, backoff_factor=0.995), "random half"),
    (TorchGradScaler(growth_interval=1, growth_factor=4.0, backoff_factor=0.995), "alternating"),
    (TorchGradScaler(growth_interval=1, growth_factor=1.5, backoff_factor=0.75), "random half"),
    (TorchGradScaler(growth_interval=1, init_scale=3e38, growth_factor=1.001), "random half"),
    (TorchGradScaler(backoff_factor=0.995), "every step"),
    (TorchGradScaler(growth_interval=2, backoff_factor=0.5), "runs"),
])
def test_dense_streams_equal_the_real_gradscaler(policy, flags):
    assert_matches_torch(policy, dense_found_inf(flags, 2500))


def test_a_float32_running_product_is_not_torch():
    """torch multiplies the float32 scale by the double factor and rounds once: for factors that
    are not float32 values (1.001, 0.995) a float32 running product (numpy's cumprod of float32
    factors, or float32 arithmetic) drifts from it, so the simulator keeps such runs step by step."""
    flags = dense_found_inf("random half", 2500)
    right = TorchGradScaler(growth_interval=1, growth_factor=1.001, backoff_factor=0.995)
    assert_matches_torch(right, flags)
    with pytest.raises(AssertionError):
        assert_matches_torch(DynamicScaler(**torch_kwargs(right), arithmetic="float32"), flags)
    running = np.multiply.accumulate(np.r_[np.float32(right.init_scale),
                                           np.where(flags, np.float32(0.995), np.float32(1.001))])[:-1]
    assert not np.array_equal(running, simulate(right, found_inf=flags).scale)


def test_static_scale():
    g = np.float32([1.0, 70.0, 1.0, np.inf])
    trace = simulate(StaticScaler(1024.0), grad_max=g)
    assert list(trace.skipped) == [False, True, False, True] and set(trace.scale) == {1024.0}


# ---------------------------------------------------------------- TorchGradScaler == torch.amp.GradScaler
@settings(max_examples=60, deadline=None)
@given(
    init_scale=st.sampled_from([2.0**16, 1.0, 2.0**-10, 3e38, 3.4028234663852886e38]),
    growth_factor=st.sampled_from([2.0, 1.5, 1.001]),
    backoff_factor=st.sampled_from([0.5, 0.9, 0.125]),
    growth_interval=st.sampled_from([1, 2, 3, 5, 17, 2000]),
    flags=st.lists(st.booleans(), max_size=150),
)
def test_torch_gradscaler_equivalence(init_scale, growth_factor, backoff_factor, growth_interval, flags):
    policy = TorchGradScaler(init_scale, growth_factor, backoff_factor, growth_interval)
    assert_matches_torch(policy, flags)


@pytest.mark.parametrize("case, policy, flags", [
    ("defaults, 4001 clean steps: growth at 2000 and 4000", TorchGradScaler(), [False] * 4001),
    ("one inf: backoff, tracker 0", TorchGradScaler(growth_interval=3), [False] * 4 + [True] + [False] * 5),
    ("gi=1 doubles up to 2^127 and stops there", TorchGradScaler(growth_interval=1), [False] * 120),
    ("float32 max stays", TorchGradScaler(init_scale=float(np.finfo(np.float32).max), growth_interval=1), [False] * 5),
    ("3e38 with gf=1.001 saturates", TorchGradScaler(init_scale=3e38, growth_factor=1.001, growth_interval=1),
     [False] * 200),
    ("166 infs reach exactly 0, which absorbs growth", TorchGradScaler(growth_interval=2), [True] * 170 + [False] * 10),
    ("0.125 backoff: 0 after 56", TorchGradScaler(backoff_factor=0.125), [True] * 60),
    ("0.9 backoff: subnormal fixed point", TorchGradScaler(backoff_factor=0.9), [True] * 1100),
    ("no-op backoff", TorchGradScaler(backoff_factor=1 - 2.0**-30), [True] * 20),
    ("no-op growth", TorchGradScaler(growth_factor=1 + 1e-9, growth_interval=1), [False] * 20),
    ("NaN growth factor never grows", TorchGradScaler(growth_factor=math.nan, growth_interval=2), [False] * 9),
    ("NaN backoff gives a NaN scale", TorchGradScaler(backoff_factor=math.nan), [False, True, False, True]),
    ("zero backoff", TorchGradScaler(backoff_factor=0.0, growth_interval=2), [True, False, False, False]),
    ("negative backoff flips the sign", TorchGradScaler(backoff_factor=-0.5), [True, True, True]),
    ("inf initial scale", TorchGradScaler(init_scale=INF, growth_interval=1), [True, True, False]),
    ("growth_interval 0 never grows", TorchGradScaler(growth_interval=0), [False] * 30),
    ("negative growth_interval never grows", TorchGradScaler(growth_interval=-3), [False] * 30),
])
def test_torch_edge_cases(case, policy, flags):
    assert_matches_torch(policy, flags)


def test_bf16_like_random_stream_with_non_dyadic_factors():
    """gf=1.001, bf=0.9, gi=1: the double-then-float32 rounding matters at every step."""
    flags = np.random.default_rng(5).random(20_000) < 0.5
    assert_matches_torch(TorchGradScaler(growth_factor=1.001, backoff_factor=0.9, growth_interval=1), flags)


def test_documented_trajectory_values():
    """The numbers the lessons quote (gradscaler.md section 5.2), from the simulator."""
    t = simulate(TorchGradScaler(), found_inf=np.ones(170, bool))
    assert t.scale[165] == 2.0**-149 and t.scale[166] == 0.0
    t = simulate(TorchGradScaler(backoff_factor=0.9), found_inf=np.ones(1200, bool))
    assert t.final.scale == 5.605193857299268e-45
    t = simulate(TorchGradScaler(backoff_factor=0.999), found_inf=np.ones(120_000, bool))
    assert t.final.scale == 7.006492321624085e-43
    t = simulate(TorchGradScaler(growth_interval=1), found_inf=np.zeros(200, bool))
    assert t.final.scale == 2.0**127 == 1.7014118346046923e38
    t = simulate(TorchGradScaler(init_scale=3e38, growth_factor=1.001, growth_interval=1),
                 found_inf=np.zeros(200, bool))
    assert t.final.scale == 3.4026332173832063e38


# ---------------------------------------------------------------- plausible wrong variants fail
class TrackerOneAfterGrowth(DynamicScaler):
    def adjust(self, state, found_inf):
        new = super().adjust(state, found_inf)
        grew = not found_inf and new.growth_tracker == 0 and state.growth_tracker + 1 == self.growth_interval
        return new._replace(growth_tracker=1) if grew else new


def test_a_subclass_adjust_is_what_simulate_steps():
    """simulate's fast paths are DynamicScaler.adjust written out; a subclass that overrides
    adjust is stepped through its own, dense streams included."""
    variant = TrackerOneAfterGrowth(growth_interval=3, growth_factor=1.5, backoff_factor=0.9)
    for kind in ("runs", "random half"):  # streams with growths (alternating has none at gi=3)
        flags = dense_found_inf(kind, 3000)
        assert_simulate_equals_stepping(variant, found_inf=flags)
        assert not np.array_equal(simulate(variant, found_inf=flags).growth_tracker,
                                  simulate(TorchGradScaler(2.0**16, 1.5, 0.9, 3), found_inf=flags).growth_tracker)
    g = synth.scenario("spikes", 3000, 0.5, np.random.default_rng(3))
    for loss_dtype, reference in MODELS.items():
        assert_simulate_equals_stepping(variant, overflowed=reference, grad_max=g, loss_dtype=loss_dtype)


@pytest.mark.parametrize("wrong, flags", [
    ("float32 product", [True] * 40),
    (">= instead of ==", [False] * 10),
    ("no finite check on growth", [False] * 140),
    ("tracker 1 after growth", [False] * 12),
])
def test_wrong_variants_are_caught(wrong, flags):
    right = TorchGradScaler(backoff_factor=0.9, growth_interval={"no finite check on growth": 1,
                                                                   ">= instead of ==": 0}.get(wrong, 3))
    kwargs = dict(init_scale=right.init_scale, growth_factor=right.growth_factor,
                  backoff_factor=right.backoff_factor, growth_interval=right.growth_interval)
    variant = {
        "float32 product": DynamicScaler(**kwargs, arithmetic="float32"),
        ">= instead of ==": DynamicScaler(**kwargs, growth_at_least=True),
        "no finite check on growth": DynamicScaler(**kwargs, inf_guard=False),
        "tracker 1 after growth": TrackerOneAfterGrowth(**kwargs),
    }[wrong]
    assert_matches_torch(right, flags)
    with pytest.raises(AssertionError):
        assert_matches_torch(variant, flags)


# ---------------------------------------------------------------- the overflow model
def _near_boundary(scale: float, boundary: float = 65520.0) -> np.ndarray:
    """float32 gradients around boundary / scale: five float32 steps either side."""
    g = np.float32(boundary / float(np.float32(scale)))
    out = [g]
    for _ in range(5):
        out.insert(0, np.nextafter(out[0], np.float32(0)))
        out.append(np.nextafter(out[-1], np.float32(np.inf)))
    return np.array(out, np.float32)


SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, 65504, 65519, 65520, 1e5, 3.4e38, INF, -INF, np.nan, 2.0**-149], np.float32)


@pytest.mark.parametrize("s", [1.0, 3.0, 0.7, 2.0**10, 2.0**16, 65504.0, 65520.0, 1e5, 2.0**40, 3e38, 0.0, -0.0,
                               2.0**-149, INF, math.nan])
def test_overflows_matches_torch_casts(s):
    """Both models against torch's own arithmetic, at every scale, at the boundary (65520 / scale
    and its neighbours), for +-0, inf and NaN: an fp16 loss multiplies the fp16 scale by the fp16
    gradient in fp16; an fp32 loss multiplies in float32 and the product is cast to fp16 (and the
    same for bf16)."""
    rng = np.random.default_rng(7)
    g = np.concatenate([np.exp2(rng.uniform(-40, 20, 20_000)), SPECIAL,
                        _near_boundary(s) if 1e-30 < abs(s) < INF and 65520 / abs(s) < F32_MAX / 2 else []])
    g = np.where(rng.random(g.size) < 0.3, -g, g).astype(np.float32)
    gt, st_ = torch.tensor(g), torch.tensor(s, dtype=torch.float32)
    for fmt, dtype, boundary in ((FP16, torch.float16, 65520.0), (BF16, torch.bfloat16, BF16.overflow_boundary)):
        low = gt.to(dtype) * st_.to(dtype)
        assert np.array_equal(overflows(s, g, fmt, loss_dtype=dtype), ~torch.isfinite(low).numpy()), (s, fmt)
        high = (gt * st_).to(dtype)
        assert np.array_equal(overflows(s, g, fmt), ~torch.isfinite(high).numpy()), (s, fmt)
        if 1e-30 < abs(s) < INF and boundary / abs(s) < F32_MAX / 2:  # a float32 gradient reaches it
            near = _near_boundary(s, boundary)
            ref = ~torch.isfinite((torch.tensor(near) * st_).to(dtype)).numpy()
            assert 0 < ref.sum() < near.size  # the boundary lies among them
            assert np.array_equal(overflows(s, near, fmt), ref)


def test_the_fp32_loss_model_does_not_skip_a_first_step_of_small_gradients():
    """The old model (the scale cast to fp16 whatever the loss) says a step at the default scale
    2^16 overflows whatever its gradients; with an fp32 loss a small gradient passes, and only an
    fp16 loss overflows there."""
    assert not overflows(2.0**16, 2.0**-4) and overflows(2.0**16, 2.0**-4, loss_dtype="float16")
    trace = simulate(TorchGradScaler(), grad_max=np.full(10, 2.0**-4, np.float32))
    assert trace.skipped_count == 0
    assert simulate(TorchGradScaler(), grad_max=np.full(10, 2.0**-4, np.float32), loss_dtype="float16").skipped[0]


@pytest.mark.parametrize("loss_dtype, fmt, message", [
    ("float64", "fp16", "loss_dtype must be 'float32'"),
    ("bfloat16", "fp16", "or 'float16' (a loss computed in fp16)"),
    ("float16", "bf16", "or 'bfloat16' (a loss computed in bf16)"),
    (None, "fp16", "not None"),
    (3, "fp16", "not 3"),
])
def test_loss_dtype_errors(loss_dtype, fmt, message):
    for call in (lambda: overflows(1.0, 1.0, fmt, loss_dtype=loss_dtype),
                 lambda: simulate(TorchGradScaler(), grad_max=[1.0], fmt=fmt, loss_dtype=loss_dtype)):
        with pytest.raises(ValueError, match=re.escape(message)) as info:
            call()
        assert "\n" not in str(info.value)


@pytest.mark.parametrize("fmt", [FP16, BF16, FP32])
def test_fp32_loss_thresholds_are_the_least_overflowing_scales(fmt):
    """The step-by-step loop compares the scale with a threshold per step: the least float32 scale
    at which the gradient overflows (and the float32 just below it does not), also for float64
    scales; a zero gradient overflows only at an infinite scale, an infinite one at every scale."""
    from ampviz.scaling import _thresholds32

    rng = np.random.default_rng(11)
    a = np.concatenate([np.exp2(rng.uniform(-149, 128, 40_000)), [0.0, INF, 2.0**-149, 3.4e38, 1.0, 65520.0]])
    a = a.astype(np.float32)
    thr = _thresholds32(fmt, a, False)
    mid = np.isfinite(thr) & (thr > 0)
    t = thr[mid].astype(np.float32)
    assert overflows(t, a[mid], fmt).all()
    assert not overflows(np.nextafter(t, np.float32(0)), a[mid], fmt).any()
    top = np.isinf(thr)  # no finite scale overflows these
    assert not overflows(np.float32(F32_MAX), a[top], fmt).any() and overflows(INF, a[top], fmt).all()
    assert thr[a == INF].tolist() == [0.0] and thr[a == 0].tolist() == [INF]
    thr64 = _thresholds32(fmt, a, True)[mid]  # the least float64 whose float32 is the threshold or above
    assert np.array_equal(thr64.astype(np.float32), t)
    below = np.nextafter(thr64, 0.0)
    assert (below.astype(np.float32) < t).all()


def test_grad_max_stream_equals_real_fp16_backward():
    """An fp16 loss: a parameter used as p.half() * g16 and summed in fp16; GradScaler skips a step
    exactly when f16(f16(S) * f16(max|g|)) is not finite (loss_dtype="float16")."""
    rng = np.random.default_rng(8)
    g = (2.0**-2 * np.exp2(rng.normal(0, 2, 300))).astype(np.float32)
    g[::37] *= 2.0**10
    policy = TorchGradScaler(init_scale=2.0**14, growth_interval=5)
    real = RealGradScaler(**torch_kwargs(policy))
    scales, skipped = [], []
    for gi in g:
        real.opt.zero_grad()
        loss = (real.p.half() * torch.tensor([gi]).half()).sum()
        real.scaler.scale(loss).backward()  # the fp16 backward: f16(f16(S) * f16(g))
        scales.append(real.scaler.get_scale())
        before = real.steps_taken
        real.scaler.step(real.opt)
        real.scaler.update()
        skipped.append(real.steps_taken == before)
    trace = simulate(policy, grad_max=g, loss_dtype="float16")  # the fp16 loss of that recipe
    assert np.array_equal(trace.scale, np.array(scales, np.float32))
    assert np.array_equal(trace.skipped, np.array(skipped))
    assert 0 < trace.skipped_count < len(g)
    assert not np.array_equal(simulate(policy, grad_max=g).skipped, trace.skipped)  # the fp32-loss model differs


# ---------------------------------------------------------------- errors a learner can make
@pytest.mark.parametrize("kwargs, error, message", [
    (dict(growth_factor=1.0), ValueError, "growth_factor must be > 1.0"),
    (dict(backoff_factor=1.0), ValueError, "backoff_factor must be < 1.0"),
    (dict(growth_interval=2.5), TypeError, "growth_interval must be a whole number such as 2000"),
    (dict(init_scale=1e39), ValueError, "does not fit in float32"),
    (dict(hysteresis=0), ValueError, "hysteresis must be a whole number >= 1"),
    (dict(growth_factor="2"), TypeError, "growth_factor must be a number such as 2.0"),
    (dict(init_scale=None), TypeError, "init_scale must be a number such as 65536.0, not None"),
    (dict(min_scale="1"), TypeError, "min_scale must be a number or None"),
    (dict(tracker_after_overflow=None), TypeError, "tracker_after_overflow must be a whole number"),
    (dict(tracker_after_overflow=2**40), ValueError, "tracker_after_overflow must fit in an int32"),
    (dict(inf_guard="yes"), TypeError, "inf_guard must be True or False"),
    (dict(arithmetic=None), TypeError, "arithmetic must be a string such as 'torch'"),
    (dict(arithmetic="bfloat16"), ValueError, "arithmetic must be one of torch, float32, float64"),
    (dict(init_scale=10**400, arithmetic="float64"), ValueError, "init_scale is too large for a float"),
    (dict(tolerance=math.nan), ValueError, "tolerance must be a number, not NaN"),
])
def test_invalid_policies_are_clear_errors(kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)) as info:
        DynamicScaler(**kwargs)
    assert "\n" not in str(info.value)


def test_policy_numbers_are_python_numbers():
    """numpy scalars are stored as Python floats and ints: a float32 factor would otherwise make
    ``adjust`` compute in float32 (numpy's promotion) while torch computes in double."""
    p = DynamicScaler(growth_factor=np.float32(1.5), backoff_factor=np.float64(0.5), growth_interval=np.int64(3),
                      min_scale=np.float32(0.25), inf_guard=np.bool_(True))
    assert type(p.growth_factor) is float and type(p.growth_interval) is int and type(p.min_scale) is float
    assert type(p.inf_guard) is bool and p == DynamicScaler(growth_factor=1.5, growth_interval=3, min_scale=0.25)
    st = p.adjust(p.initial_state(), False)
    assert type(st.scale) is float


@pytest.mark.parametrize("stream", [dict(found_inf=[]), dict(found_inf=np.zeros(0)), dict(found_inf=()),
                                    dict(grad_max=[]), dict(grad_max=np.zeros(0, np.float32))])
def test_an_empty_stream_is_an_empty_trace(stream):
    """``found_inf=[]`` used to raise a misleading TypeError (numpy makes an empty list float64)."""
    for policy in (TorchGradScaler(), StaticScaler(), DynamicScaler(hysteresis=3, window_scaling=True)):
        t = simulate(policy, **stream)
        assert t.steps == 0 and t.skipped_count == 0 and t.final == policy.initial_state()
        assert t.scale.dtype == (np.float64 if policy.arithmetic == "float64" else np.float32)
        assert t.growth_tracker.dtype == np.int32 and t.hysteresis.size == 0


def test_found_inf_takes_bools_and_zero_one_numbers():
    flags = [True, False, False, True, True, False]
    ref = simulate(TorchGradScaler(growth_interval=2), found_inf=np.array(flags))
    for same in ([int(f) for f in flags], [float(f) for f in flags], np.array(flags, np.uint8),
                 np.array(flags, object), torch.tensor(flags), torch.tensor(flags, dtype=torch.float32)):
        t = simulate(TorchGradScaler(growth_interval=2), found_inf=same)
        assert np.array_equal(t.scale, ref.scale) and np.array_equal(t.skipped, ref.skipped)
    g = simulate(TorchGradScaler(init_scale=1024.0), grad_max=torch.tensor([0.25, 1e5], dtype=torch.bfloat16))
    assert g.skipped.tolist() == [False, True]


@pytest.mark.parametrize("stream, error, message", [
    (dict(found_inf=[0, 2, 1]), ValueError, "step 1 is 2"),
    (dict(found_inf=[0.5, 1.0]), ValueError, "found_inf must be True/False (or 1/0) at every step; step 0 is 0.5"),
    (dict(found_inf=[True, None]), ValueError, "step 1 is None"),
    (dict(found_inf=["yes"]), TypeError, "found_inf must be booleans (one per step)"),
    (dict(found_inf="TFT"), TypeError, "found_inf must be booleans, one per step"),
    (dict(found_inf=[[True], [False, True]]), ValueError, "found_inf must be booleans, one per step"),
    (dict(found_inf=[1 + 1j]), TypeError, "found_inf must be booleans (one per step), got complex128"),
    (dict(grad_max=[True, False]), TypeError, "grad_max must be numbers (the largest |gradient| of each step), "
                                              "not booleans; give overflow flags as found_inf="),
    (dict(grad_max=[1.0, None]), TypeError, "grad_max must be numbers"),
    (dict(grad_max=["1.0"]), TypeError, "grad_max must be numbers"),
    (dict(grad_max=[1.0, 10**400]), ValueError, "grad_max has a number too large for a float"),
    (dict(grad_max=np.zeros(2, complex)), TypeError, "grad_max must be numbers"),
    (dict(grad_max=[1.0], fmt="fp8_e4m3"), ValueError, "saturates"),
    (dict(grad_max=[1.0], fmt="fp7"), ValueError, "unknown format"),
    (dict(found_inf=[True], state=(1.0, 0)), TypeError, "state must be a ScalerState"),
    (dict(found_inf=[True], state=ScalerState("1")), TypeError, "state.scale must be a number"),
    (dict(found_inf=[True], state=ScalerState(1.0, steps_since_rescale=-1)), ValueError,
     "state.steps_since_rescale must be a whole number from 0"),
])
def test_stream_and_state_errors_say_what_to_pass(stream, error, message):
    with pytest.raises(error, match=re.escape(message)) as info:
        simulate(TorchGradScaler(), **stream)
    assert "\n" not in str(info.value)


def test_adjust_refuses_what_is_not_a_step():
    p = TorchGradScaler()
    with pytest.raises(TypeError, match="found_inf must be True or False"):
        p.adjust(p.initial_state(), np.array([True, False]))
    with pytest.raises(TypeError, match="state must be a ScalerState"):
        p.adjust((65536.0, 0), True)
    assert p.adjust(p.initial_state(), 1) == p.adjust(p.initial_state(), True)
    assert p.adjust(ScalerState(65536), False) == ScalerState(65536.0, 1, 1)


def test_stream_errors():
    with pytest.raises(ValueError, match="exactly one of found_inf"):
        simulate(TorchGradScaler())
    with pytest.raises(ValueError, match="exactly one of found_inf"):
        simulate(TorchGradScaler(), found_inf=[True], grad_max=[1.0])
    with pytest.raises(ValueError, match="1-D array"):
        simulate(TorchGradScaler(), found_inf=np.zeros((2, 2), bool))
    with pytest.raises(TypeError, match="DynamicScaler"):
        simulate("torch", found_inf=[True])
    with pytest.raises(ValueError, match="saturates"):
        overflows(1.0, [1.0], "fp8_e4m3")


def test_state_is_immutable_and_adjust_returns_a_new_one():
    policy = TorchGradScaler(growth_interval=2)
    s0 = policy.initial_state()
    s1 = policy.adjust(s0, False)
    assert s0 == ScalerState(65536.0, 0, 1) and s1 == ScalerState(65536.0, 1, 1)
    assert policy.adjust(s1, False) == ScalerState(131072.0, 0, 1)
    assert policy.adjust(s1, True) == ScalerState(32768.0, 0, 1)
    with pytest.raises(AttributeError):
        s0.scale = 1.0


def test_a_stopped_run_counts_no_skipped_step_after_its_stop():
    """DeepSpeed ZeRO stops at its minimum scale; the steps after the stop never ran, so they are
    not skipped steps (ScalerLab's readout and trace_table both read skipped_count)."""
    from ampviz.scaling.lesson import trace_table
    from ampviz.scaling import PRESETS

    trace = simulate(PRESETS["DeepSpeed ZeRO"], found_inf=np.ones(5_000, bool))
    assert trace.stopped_at is not None and trace.stopped_at < 100
    assert trace.skipped_count == int(trace.skipped[:trace.stopped_at + 1].sum()) < int(trace.skipped.sum())
    assert trace_table([trace]).rows[0][1] == f"{trace.skipped_count:,}"
