"""Property tests for ampviz.scaling and ampviz.scaling.scalelog: every public function answers arbitrary
input with a correct result or one ValueError/TypeError whose message is a single line; and
``simulate`` equals stepping ``adjust`` once per step for random configurations, dense ones
(an event at every step) included."""

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ampviz import scaling
from ampviz.formats import BF16, FP16, FP32
from ampviz.scaling.scalelog import Diagnosis, diagnose, read_log, write_log
from ampviz.scaling import (
    PRESETS, DynamicScaler, ScalerState, ScalerTrace, TorchGradScaler, overflows, simulate,
)

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------- arbitrary input
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-10, 10), st.integers(), st.integers(min_value=10**300, max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True), st.floats(-1e3, 1e3), st.text(max_size=4),
    st.binary(max_size=4), st.complex_numbers(max_magnitude=1e3), st.fractions(max_denominator=10),
    st.decimals(allow_nan=False, allow_infinity=False, places=2, min_value=-100, max_value=100),
    st.sampled_from([np.float32(0.5), np.int64(3), np.bool_(True), np.float16(np.inf), np.datetime64("2020")]),
    st.from_type(type).flatmap(lambda t: st.just(t)),  # a class where a value was expected
)
odd_dtypes = st.sampled_from([np.bool_, np.int8, np.uint16, np.int64, np.uint64, np.float16, np.float32,
                              np.float64, np.longdouble, np.complex64, "datetime64[s]", "timedelta64[ms]", "U3",
                              object])
arrays = st.one_of(
    hnp.arrays(odd_dtypes, hnp.array_shapes(min_dims=0, max_dims=2, max_side=6)),
    hnp.arrays(np.float32, st.integers(0, 8), elements=st.floats(width=32, allow_nan=True, allow_infinity=True)),
)
tensors = st.builds(
    lambda values, dtype: torch.tensor(values, dtype=dtype),
    st.lists(st.floats(-1e3, 1e3), max_size=6),
    st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.complex64, torch.int64,
                     torch.bool]),
)
anything = st.one_of(scalars, st.lists(scalars, max_size=6), st.lists(st.lists(scalars, max_size=3), max_size=3),
                     st.lists(st.booleans(), max_size=8), st.lists(st.sampled_from([0, 1, 0.0, 1.0]), max_size=8),
                     st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=8),
                     arrays, tensors, st.dictionaries(st.text(max_size=2), scalars, max_size=2),
                     st.tuples(scalars, scalars))


def one_clear_error(exc: BaseException) -> None:
    assert isinstance(exc, (ValueError, TypeError)), f"{type(exc).__name__} leaked out: {exc}"
    text = str(exc)
    assert text.strip() and "\n" not in text, repr(text)


def outcome(fn, *args, **kwargs):
    """fn's result, or None after checking that it raised one clear ValueError/TypeError."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # checked: only ValueError/TypeError with a one-line message
        one_clear_error(exc)
        return None


valid_policies = st.one_of(
    st.sampled_from(list(PRESETS.values())),
    st.builds(TorchGradScaler, init_scale=st.sampled_from([2.0**16, 1.0, 3e38, 2.0**-140]),
              growth_factor=st.sampled_from([2.0, 4.0, 1.001, 1.5]), backoff_factor=st.sampled_from([0.5, 0.995, 0.0]),
              growth_interval=st.sampled_from([1, 2, 7, 2000, 0])),
)


# ---------------------------------------------------------------- scaling's public functions
@FUZZ
@given(policy=st.one_of(valid_policies, anything), found_inf=anything, grad_max=anything,
       which=st.sampled_from(["found_inf", "grad_max", "both", "neither"]),
       fmt=st.one_of(st.sampled_from(["fp16", "bf16", "fp32", "fp8_e4m3", FP16, "float16"]), anything),
       state=st.one_of(st.none(), st.none(), st.builds(ScalerState, scale=scalars, growth_tracker=scalars),
                       st.builds(ScalerState, scale=st.floats(), growth_tracker=st.integers(-3, 3),
                                 hysteresis=st.integers(-1, 3), steps_since_rescale=st.integers(-2, 3)), anything),
       loss_dtype=st.one_of(st.sampled_from(["float32", "float16", "bfloat16", "fp32"]), anything))
def test_simulate_answers_anything(policy, found_inf, grad_max, which, fmt, state, loss_dtype):
    kwargs = {"fmt": fmt, "state": state, "loss_dtype": loss_dtype}
    if which in ("found_inf", "both"):
        kwargs["found_inf"] = found_inf
    if which in ("grad_max", "both"):
        kwargs["grad_max"] = grad_max
    trace = outcome(simulate, policy, **kwargs)
    if trace is None:
        return
    assert isinstance(trace, ScalerTrace) and which in ("found_inf", "grad_max")
    n = trace.steps
    assert trace.skipped.shape == trace.growth_tracker.shape == trace.hysteresis.shape == (n,)
    assert trace.skipped.dtype == bool and trace.growth_tracker.dtype == np.int32
    if which == "found_inf" and n:
        flags = np.asarray(found_inf.numpy() if isinstance(found_inf, torch.Tensor) else found_inf) != 0
        stop = n if trace.stopped_at is None else trace.stopped_at
        assert np.array_equal(trace.skipped[:stop], flags[:stop])


@FUZZ
@given(scale=anything, grad_max=anything, fmt=st.one_of(st.sampled_from(["fp16", "bf16", "fp8_e4m3"]), anything),
       loss_dtype=st.one_of(st.sampled_from(["float32", "float16", "bfloat16"]), anything))
def test_overflows_answers_anything(scale, grad_max, fmt, loss_dtype):
    result = outcome(overflows, scale, grad_max, fmt, loss_dtype)
    if result is None:
        return
    assert np.asarray(result).dtype == bool
    if fmt == "fp16":  # the models as numpy's float32 and float16 arithmetic compute them
        s = np.asarray(scale.numpy() if isinstance(scale, torch.Tensor) else scale, dtype=np.float64)
        g = np.asarray(grad_max.float().numpy() if isinstance(grad_max, torch.Tensor) else grad_max, dtype=np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            if loss_dtype == "float16":
                ref = ~np.isfinite(s.astype(np.float32).astype(np.float16) * g.astype(np.float32).astype(np.float16))
            else:
                ref = ~np.isfinite((s.astype(np.float32) * g.astype(np.float32)).astype(np.float16))
        assert np.array_equal(result, ref)


FACTORIES = [scaling.TorchGradScaler, scaling.StaticScaler, scaling.ApexAmpScaler, scaling.ApexHysteresisScaler,
             scaling.DeepSpeedZeroScaler, scaling.DeepSpeedScaler, scaling.MegatronScaler, scaling.KerasScaler,
             scaling.Keras3Scaler, scaling.JmpScaler, scaling.FairseqScaler, scaling.MetaseqScaler]


@pytest.mark.parametrize("factory", FACTORIES, ids=[f.__name__ for f in FACTORIES])
@FUZZ
@given(data=st.data())
def test_preset_constructors_answer_anything(factory, data):
    import inspect

    names = list(inspect.signature(factory).parameters)
    plausible = st.one_of(anything, st.sampled_from([None, 0, 1, 2, 4, 0.5, 2.0**16, -1.0, math.nan, math.inf, True]))
    kwargs = data.draw(st.dictionaries(st.sampled_from(names), plausible, max_size=3))
    policy = outcome(factory, **kwargs)
    if policy is not None:
        assert isinstance(policy, DynamicScaler)
        trace = outcome(simulate, policy, found_inf=[True, False, True])
        assert trace is not None and trace.steps == 3


FIELDS = [f for f in DynamicScaler.__dataclass_fields__ if f != "source"]


@FUZZ
@given(data=st.data())
def test_dynamic_scaler_answers_anything(data):
    kwargs = data.draw(st.dictionaries(st.sampled_from(FIELDS), st.one_of(anything, st.sampled_from(
        [None, 0, 1, -1, 2, 2000, 0.5, 2.0, math.nan, math.inf, "torch", "clean", True, False])), max_size=4))
    policy = outcome(DynamicScaler, **kwargs)
    if policy is not None:
        st0 = policy.initial_state()
        assert isinstance(st0, ScalerState) and type(st0.scale) is float
        assert outcome(simulate, policy, found_inf=np.arange(40) % 3 == 0) is not None


@FUZZ
@given(policy=valid_policies, state=st.one_of(anything, st.builds(
    ScalerState, scale=st.one_of(st.floats(), scalars), growth_tracker=st.one_of(st.integers(-5, 5), scalars),
    hysteresis=st.one_of(st.integers(-1, 3), scalars), stopped=st.one_of(st.booleans(), scalars),
    overflows_since_rescale=st.integers(-1, 3), steps_since_rescale=st.integers(-1, 3), window=st.integers(-1, 9))),
    found_inf=st.one_of(st.booleans(), anything))
def test_adjust_answers_anything(policy, state, found_inf):
    new = outcome(policy.adjust, state, found_inf)
    if new is not None:
        assert isinstance(new, ScalerState) and type(new.scale) is float


# ---------------------------------------------------------------- scalelog's public functions
traces = st.builds(lambda p, flags: simulate(p, found_inf=flags), valid_policies,
                   st.lists(st.booleans(), max_size=60))


@FUZZ
@given(trace=st.one_of(traces, anything), style=st.one_of(st.sampled_from(["apex", "deepspeed", "fairseq"]), anything))
def test_write_log_answers_anything(trace, style):
    text = outcome(write_log, trace, style)
    if text is None:
        return
    assert isinstance(text, str)
    lines = text.splitlines()
    assert len(lines) <= trace.skipped_count
    backed_off = read_log(text)  # what the log says is the scale after each backoff, in order
    steps = [int(line.split(":")[0].split()[1]) for line in lines]
    after = np.append(trace.scale[1:], trace.final.scale).astype(np.float64)
    assert np.array_equal(backed_off, after[steps], equal_nan=True)
    assert all(trace.skipped[steps]) and (trace.stopped_at is None or all(k < trace.stopped_at for k in steps))


texts = st.one_of(
    st.text(max_size=200),
    st.lists(st.sampled_from([
        "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to ",
        "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: ", ", reducing to ",
        "NOTE: overflow detected, setting loss scale to: ", "1", "0", ".", "e", "-", "+", "inf", "nan", " ", "\n",
        "x", "E5", "1" * 50]), max_size=40).map("".join),
)


@FUZZ
@given(text=st.one_of(texts, texts.map(str.encode), anything))
def test_read_log_answers_anything(text):
    scales = outcome(read_log, text)
    if scales is not None:
        assert isinstance(text, (str, bytes)) and scales.dtype == np.float64 and scales.ndim == 1
        assert scales.size <= len(text.splitlines())


@FUZZ
@given(scales=st.one_of(anything, st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=12)))
def test_diagnose_answers_anything(scales):
    d = outcome(diagnose, scales)
    if d is None:
        return
    assert isinstance(d, Diagnosis) and d.verdict in ("sawtooth", "ratchet", "collapse", "unclear") and d.reason
    s = np.abs(np.asarray(scales.double().numpy() if isinstance(scales, torch.Tensor) else scales, dtype=np.float64))
    if s.size and (np.isnan(s).any() or np.isinf(s).any() or s.min() <= 1):
        assert d.verdict == "collapse"
    elif s.size < 4:
        assert d.verdict == "unclear"
    assert "inf to inf" not in d.reason and "nan to nan" not in d.reason


# ---------------------------------------------------------------- simulate == stepping adjust, dense too
def stepped(policy, flags=None, grad_max=None, loss_dtype="float32"):
    """adjust once per step; grad_max steps overflow as numpy computes the model: the float32
    product cast to float16 (an fp32 loss), or the float16 product (an fp16 loss). Returns the
    trace's arrays, the final state and (the step that ended the run, its exception)."""
    s = policy.initial_state()
    out = []
    end = (None, None)  # the step that ended the run, and the exception the framework raises there
    n = len(flags) if flags is not None else len(grad_max)
    with np.errstate(over="ignore", invalid="ignore"):
        for i in range(n):
            if s.stopped:
                out.append((math.nan, True, s.growth_tracker, s.hysteresis))
                continue
            if flags is not None:
                f = bool(flags[i])
            else:
                if loss_dtype == "float16":
                    f = not np.isfinite(np.float16(np.float32(s.scale)) * np.float16(grad_max[i]))
                else:
                    f = not np.isfinite(np.float16(np.float32(s.scale) * np.float32(grad_max[i])))
            before = s
            s = policy.adjust(s, f)
            if s.stopped:  # this step ended the run (it is not taken)
                end = (i, policy._stop_reason(before, f))
            out.append((before.scale, f or s.stopped, s.growth_tracker, s.hysteresis))
    scale, skipped, tracker, hyst = (np.array(c) for c in zip(*out)) if out else (np.zeros(0),) * 4
    return scale, skipped.astype(bool), tracker, hyst, s, end


dense_policies = st.builds(
    DynamicScaler,
    init_scale=st.sampled_from([2.0**16, 1.0, 3e38, 3.4028234663852886e38, 2.0**-140, 0.0, math.inf]),
    growth_factor=st.sampled_from([2.0, 4.0, 1.5, 1.001, 2.5]),
    backoff_factor=st.sampled_from([0.5, 0.995, 0.9, 0.125, 0.0, -0.5]),
    growth_interval=st.sampled_from([1, 1, 1, 2, 3, 300, 2000, 0]),
    hysteresis=st.sampled_from([1, 1, 2, 3]),
    refill=st.sampled_from(["growth", "clean"]),
    min_scale=st.sampled_from([None, None, 1.0, 2.0**-5]),
    max_scale=st.sampled_from([None, None, 2.0**24]),
    raise_at_min=st.booleans(),
    growth_at_least=st.booleans(),
    inf_guard=st.booleans(),
    tracker_after_overflow=st.sampled_from([0, 0, -1]),
    tolerance=st.sampled_from([0.0, 0.0, 0.0, 0.05, 1.0]),
    raise_at_scale=st.sampled_from([None, None, None, 2.0**-3]),
    no_backoff_below=st.sampled_from([None, None, None, 0.3]),
    window_scaling=st.sampled_from([False, False, True]),
    arithmetic=st.sampled_from(["torch", "float32", "float64"]),
    raise_at_zero=st.sampled_from([False, False, True]),
    raise_at_inf=st.sampled_from([False, False, True]),
)


def dense_flags(draw):
    n = draw(st.integers(0, 20_000))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["rate", "alternating", "runs", "all"]))
    if kind == "rate":
        return rng.random(n) < draw(st.sampled_from([0.3, 0.5, 0.9, 0.99, 0.001]))
    if kind == "alternating":
        return np.arange(n) % draw(st.integers(2, 4)) == 0
    if kind == "runs":
        return (np.arange(n) // draw(st.integers(1, 800))) % draw(st.integers(2, 3)) == 0
    return np.ones(n, bool)


def assert_same(policy, trace, ref):
    scale, skipped, tracker, hyst, final, end = ref
    assert (trace.stopped_at, trace.stop_reason) == end and (end[0] is None or end[1] is not None)
    got = trace.scale.astype(np.float64)
    bad = np.flatnonzero(~((got == scale) | (np.isnan(got) & np.isnan(scale))))
    assert bad.size == 0, f"{policy}: scale differs first at step {bad[0]}: {got[bad[0]]!r} vs {scale[bad[0]]!r}"
    assert np.array_equal(trace.skipped, skipped)
    assert np.array_equal(trace.growth_tracker, tracker.astype(np.int64).astype(np.int32))
    assert np.array_equal(trace.hysteresis, hyst)
    f = trace.final
    assert f[1:] == final[1:] and (f.scale == final.scale or math.isnan(f.scale) and math.isnan(final.scale))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=dense_policies, data=st.data())
def test_simulate_equals_stepping_on_dense_found_inf(policy, data):
    flags = dense_flags(data.draw)
    assert_same(policy, simulate(policy, found_inf=flags), stepped(policy, flags=flags))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=dense_policies, seed=st.integers(0, 2**32 - 1), n=st.integers(0, 20_000),
       level=st.integers(-20, 10), jitter=st.sampled_from([0.2, 2.0]), spikes=st.sampled_from([0.0, 0.01, 0.3]),
       loss_dtype=st.sampled_from(["float32", "float16"]))
def test_simulate_equals_stepping_on_dense_grad_max(policy, seed, n, level, jitter, spikes, loss_dtype):
    rng = np.random.default_rng(seed)
    g = (2.0**level * np.exp2(rng.normal(0, jitter, n))).astype(np.float32)
    g[rng.random(n) < spikes] = np.inf
    g[rng.random(n) < 0.002] = np.nan
    assert_same(policy, simulate(policy, grad_max=g, loss_dtype=loss_dtype),
                stepped(policy, grad_max=g, loss_dtype=loss_dtype))


@pytest.mark.parametrize("low", [False, True], ids=["fp32 loss", "loss in fmt"])
@pytest.mark.parametrize("fmt", [FP16, BF16, FP32], ids=lambda f: f.name)
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), scale64=st.booleans())
def test_the_per_step_thresholds_are_the_overflow_model(fmt, low, seed, scale64):
    """The step-by-step loop decides an overflow as ``not abs(scale) < threshold``: at the threshold
    and on either side of it (one ulp of the scale's type) that equals ``overflows``."""
    rng = np.random.default_rng(seed)
    g = np.exp2(rng.uniform(-140, 127, 4000)).astype(np.float32)
    g[rng.random(g.size) < 0.05] = rng.choice(np.float32([0.0, np.inf, np.nan, 65504, 65520, 2.0**-24, 1e-45]))
    thr = scaling._ScaleDependentOverflows(g, fmt, low).chunk(0, g.size, scale64)
    loss_dtype = fmt.torch_dtype if low else "float32"
    kind = np.float64 if scale64 else np.float32
    for s in (thr.astype(kind), np.nextafter(thr.astype(kind), kind(np.inf)), np.nextafter(thr.astype(kind), kind(0))):
        s = s.astype(np.float64)
        assert np.array_equal(~(np.abs(s) < thr), overflows(s, g, fmt, loss_dtype))
    if fmt is not FP32:  # a plausible shortcut, the boundary over the gradient, decides some steps wrongly
        with np.errstate(divide="ignore", invalid="ignore"):
            naive = fmt.overflow_boundary / np.abs(fmt.quantize(g.astype(np.float64)) if low else g.astype(np.float64))
        s = thr.astype(kind).astype(np.float64)
        assert not np.array_equal(~(np.abs(s) < naive), overflows(s, g, fmt, loss_dtype))
