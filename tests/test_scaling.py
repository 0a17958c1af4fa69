"""ampviz.scaling: the simulator equals stepping the state machine, and TorchGradScaler equals the
real torch.amp.GradScaler("cpu") step for step (scale, skipped steps, growth tracker)."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ampviz.formats import BF16, FP16, FP32
from ampviz.scaling import (
    DynamicScaler, ScalerState, StaticScaler, TorchGradScaler, overflows, simulate,
)

INF = float("inf")


# ---------------------------------------------------------------- references
def step_by_step(policy, found_inf=None, grad_max=None, fmt=FP16):
    """The plainest possible simulation: call ``adjust`` once per step."""
    st = policy.initial_state()
    n = len(found_inf if found_inf is not None else grad_max)
    scale, skipped, tracker, hyst = [], [], [], []
    for i in range(n):
        s = st.scale if not st.stopped else math.nan
        if st.stopped:
            f = True
        elif found_inf is not None:
            f = bool(found_inf[i])
        else:
            f = bool(overflows(st.scale, grad_max[i], fmt))
        scale.append(s)
        skipped.append(f)
        st = policy.adjust(st, f)
        tracker.append(st.growth_tracker)
        hyst.append(st.hysteresis)
    return np.array(scale), np.array(skipped, bool), np.array(tracker), np.array(hyst), st


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


def assert_simulate_equals_stepping(policy, **stream):
    scale, skipped, tracker, hyst, final = step_by_step(policy, **stream)
    trace = simulate(policy, **stream)
    assert same_floats(trace.scale, scale)
    assert np.array_equal(trace.skipped, skipped)
    assert np.array_equal(trace.growth_tracker, tracker)
    assert np.array_equal(trace.hysteresis, hyst)
    assert trace.final == final or (math.isnan(trace.final.scale) and final.stopped)


# ---------------------------------------------------------------- simulate == stepping adjust
policies = st.builds(
    DynamicScaler,
    init_scale=st.sampled_from([2.0**16, 1.0, 2.0**-10, 3e38, 2.0**32]),
    growth_factor=st.sampled_from([2.0, 1.5, 1.001]),
    backoff_factor=st.sampled_from([0.5, 0.9, 0.125]),
    growth_interval=st.integers(-1, 40),
    hysteresis=st.integers(1, 3),
    refill=st.sampled_from(["growth", "clean"]),
    min_scale=st.sampled_from([None, 1.0, 2.0**-5]),
    max_scale=st.sampled_from([None, 2.0**24]),
    raise_at_min=st.booleans(),
    growth_at_least=st.booleans(),
    inf_guard=st.booleans(),
    tracker_after_overflow=st.sampled_from([0, -1]),
    tolerance=st.sampled_from([0.0, 0.0, 0.02, 0.3, 1.0]),
    raise_at_scale=st.sampled_from([None, None, 1.0, 2.0**-3]),
    no_backoff_below=st.sampled_from([None, None, 1.0, 0.3]),
    window_scaling=st.booleans(),
    arithmetic=st.sampled_from(["torch", "float32", "float64"]),
)


@settings(max_examples=300, deadline=None)
@given(policy=policies, flags=st.lists(st.booleans(), max_size=300))
def test_simulate_found_inf_equals_stepping(policy, flags):
    assert_simulate_equals_stepping(policy, found_inf=np.array(flags, bool))


@settings(max_examples=150, deadline=None)
@given(policy=policies, seed=st.integers(0, 2**32 - 1), n=st.integers(0, 3000),
       level=st.integers(-30, 20), fmt=st.sampled_from([FP16, BF16, FP32]))
def test_simulate_grad_max_equals_stepping(policy, seed, n, level, fmt):
    rng = np.random.default_rng(seed)
    g = (2.0**level * np.exp2(rng.normal(0, 3, n))).astype(np.float32)
    g[rng.random(n) < 0.01] = np.inf
    g[rng.random(n) < 0.01] = np.nan
    assert_simulate_equals_stepping(policy, grad_max=g, fmt=fmt)


def test_long_runs_equal_stepping():
    rng = np.random.default_rng(3)
    flags = rng.random(30_000) < 0.002
    for policy in (TorchGradScaler(), TorchGradScaler(growth_interval=7, growth_factor=1.5, backoff_factor=0.9),
                   DynamicScaler(hysteresis=2, refill="clean", growth_interval=100, min_scale=1.0)):
        assert_simulate_equals_stepping(policy, found_inf=flags)


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
def test_overflows_matches_torch_fp16_multiply():
    rng = np.random.default_rng(7)
    g = np.concatenate([np.exp2(rng.uniform(-30, 20, 20_000)), [0, 1, 65504, 65519, 65520, 1e5, INF, np.nan]])
    g = g.astype(np.float32)
    for s in (1.0, 2.0**10, 2.0**16, 65504.0, 65520.0, 1e5, 0.0):
        ref = torch.tensor(g).half() * torch.tensor(s).half()
        assert np.array_equal(overflows(s, g), ~torch.isfinite(ref).numpy()), s


def test_grad_max_stream_equals_real_fp16_backward():
    """gradscaler.md 12.22: a parameter used as p.half() * g16 in the loss; GradScaler skips a step
    exactly when f16(f16(S) * f16(max|g|)) is not finite."""
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
    trace = simulate(policy, grad_max=g)
    assert np.array_equal(trace.scale, np.array(scales, np.float32))
    assert np.array_equal(trace.skipped, np.array(skipped))
    assert 0 < trace.skipped_count < len(g)


# ---------------------------------------------------------------- errors a learner can make
@pytest.mark.parametrize("kwargs, message", [
    (dict(growth_factor=1.0), "growth_factor must be > 1.0"),
    (dict(backoff_factor=1.0), "backoff_factor must be < 1.0"),
    (dict(growth_interval=2.5), "growth_interval must be a whole number"),
    (dict(init_scale=1e39), "does not fit in float32"),
    (dict(hysteresis=0), "hysteresis must be a whole number >= 1"),
    (dict(growth_factor="2"), "growth_factor must be a number"),
])
def test_invalid_policies_are_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DynamicScaler(**kwargs)


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
