"""ampviz.scaling.synth: streams have their advertised shapes; overflows_at matches torch's multiply."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ampviz.scaling import synth
from ampviz.formats import BF16, FP8_E4M3, FP16
from ampviz.scaling.synth import (SCENARIOS, bursts, drift, found_inf_every, found_inf_random, overflows_at,
                                  scenario, spikes, steady, warmup)

GENERATORS = {
    "steady": steady,
    "drift": drift,
    "spikes": spikes,
    "spikes_random": lambda steps, rng: spikes(steps, placement="random", every=50, rng=rng),
    "bursts": bursts,
    "bursts_random": lambda steps, rng: bursts(steps, placement="random", burst_every=50, rng=rng),
    "warmup": warmup,
}


def runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, length) of each run of consecutive True values in mask."""
    padded = np.concatenate([[False], mask, [False]]).astype(np.int8)
    d = np.diff(padded)
    starts, ends = np.flatnonzero(d == 1), np.flatnonzero(d == -1)
    return starts, ends - starts


def binomial_band(n: int, p: float, sigmas: float = 6.0) -> tuple[float, float]:
    mean, sd = n * p, math.sqrt(n * p * (1 - p))
    return mean - sigmas * sd, mean + sigmas * sd


# ------------------------------------------------------------------ every grad_max stream
@pytest.mark.parametrize("name", GENERATORS)
def test_reproducible_shape_dtype_positive_finite(name):
    make = GENERATORS[name]
    a = make(20_000, rng=np.random.default_rng(7))
    b = make(20_000, rng=np.random.default_rng(7))
    c = make(20_000, rng=7)  # an int seed is the same as default_rng(seed)
    d = make(20_000, rng=np.random.default_rng(8))
    assert a.dtype == np.float32 and a.shape == (20_000,)
    assert np.array_equal(a, b) and np.array_equal(a, c)
    assert not np.array_equal(a, d)
    assert np.all(np.isfinite(a)) and np.all(a > 0)


@pytest.mark.parametrize("name", GENERATORS)
@pytest.mark.parametrize("steps", [0, 1, 2])
def test_tiny_lengths(name, steps):
    g = GENERATORS[name](steps, rng=0)
    assert g.shape == (steps,) and g.dtype == np.float32


def test_a_shared_generator_moves_on():
    rng = np.random.default_rng(0)
    assert not np.array_equal(steady(100, rng=rng), steady(100, rng=rng))


def test_values_stay_in_float32_normal_range():
    g = spikes(1000, level=1e30, every=10, height=1e300, jitter=3.0, rng=0)
    assert np.all(np.isfinite(g)) and g.max() <= 2.0**127
    g = steady(1000, level=1e-37, jitter=3.0, rng=0)
    assert g.min() >= 2.0**-126


# ------------------------------------------------------------------ shapes of each scenario
def test_steady_is_lognormal_around_level():
    g = steady(200_000, level=2.0**-6, jitter=0.75, rng=1)
    log2 = np.log2(g.astype(np.float64))
    assert abs(np.mean(log2) - (-6)) < 0.01
    assert abs(np.std(log2) - 0.75) < 0.01
    assert np.all(steady(50, level=0.3, jitter=0, rng=1) == np.float32(0.3))


@pytest.mark.parametrize("start,end", [(2.0**-2, 2.0**-8), (2.0**-10, 2.0**-3), (1.0, 1.0)])
def test_drift_moves_by_the_requested_binades(start, end):
    n = 100_000
    g = np.log2(drift(n, start=start, end=end, jitter=0.5, rng=2).astype(np.float64))
    tenth = n // 10
    moved = np.median(g[-tenth:]) - np.median(g[:tenth])
    # the two tenths are centred 5% and 95% of the way along: 0.9 of the whole drift apart
    assert abs(moved - 0.9 * (math.log2(end) - math.log2(start))) < 0.05
    exact = drift(101, start=start, end=end, jitter=0, rng=2)
    assert exact[0] == np.float32(start) and exact[-1] == np.float32(end)
    assert np.allclose(np.log2(exact[50]), (math.log2(start) + math.log2(end)) / 2, atol=1e-6)


@pytest.mark.parametrize("every,offset", [(500, 0), (333, 100), (7, 3)])
def test_periodic_spikes_land_where_promised(every, offset):
    n, level, height = 100_000, 2.0**-4, 2.0**8
    g = spikes(n, level=level, every=every, height=height, offset=offset, rng=3)
    above = np.flatnonzero(g > level * math.sqrt(height))  # halfway between, in log2
    assert np.array_equal(above, np.arange(offset, n, every))
    assert len(above) == math.ceil((n - offset) / every)
    # each spike is about `height` times the typical step
    ratio = np.median(g[above]) / np.median(np.delete(g, above))
    assert abs(math.log2(ratio) - math.log2(height)) < 0.1


def test_random_spikes_come_about_every_every_steps():
    n, every = 200_000, 500
    g = spikes(n, every=every, height=2.0**8, placement="random", offset=12345, rng=4)
    above = np.flatnonzero(g > 2.0**-4 * 2.0**4)
    lo, hi = binomial_band(n, 1 / every)
    assert lo <= len(above) <= hi
    gaps = np.diff(above)
    assert gaps.min() < every / 4 and gaps.max() > 2 * every  # not a clock: gaps vary widely


@pytest.mark.parametrize("length,every,offset", [(3, 1000, 0), (1, 100, 5), (8, 50, 49), (4, 4, 0)])
def test_periodic_bursts_are_runs_of_the_given_length(length, every, offset):
    n = 20_000
    g = bursts(n, burst_every=every, burst_length=length, height=2.0**8, offset=offset, rng=5)
    starts, lengths = runs(g > 2.0**-4 * 2.0**4)
    if length == every:  # back-to-back bursts: one long run from offset on
        assert list(starts) == [offset] and lengths[0] == n - offset
        return
    assert np.array_equal(starts, np.arange(offset, n, every))
    assert np.all(lengths[:-1] == length)
    assert lengths[-1] == min(length, n - starts[-1])  # the last burst may be cut by the end


def test_random_bursts():
    n, every, length = 200_000, 1000, 5
    g = bursts(n, burst_every=every, burst_length=length, height=2.0**8, placement="random", rng=6)
    starts, lengths = runs(g > 2.0**-4 * 2.0**4)
    lo, hi = binomial_band(n, 1 / every)
    assert lo <= len(starts) <= hi
    assert np.all(lengths >= length)  # overlapping bursts merge into longer runs
    assert np.mean(lengths == length) > 0.95


def test_warmup_starts_large_and_settles():
    n, w = 10_000, 800
    exact = warmup(n, start=2.0**6, end=2.0**-4, warmup_steps=w, jitter=0, rng=0)
    assert exact[0] == 2.0**6
    assert np.all(np.diff(exact[: w + 1]) < 0)  # shrinks at every warm-up step
    assert np.all(exact[w:] == np.float32(2.0**-4))
    g = np.log2(warmup(n, start=2.0**6, end=2.0**-4, warmup_steps=w, jitter=0.5, rng=7))
    assert abs(np.median(g[:20]) - 6) < 0.5
    assert abs(np.median(g[w:]) - (-4)) < 0.02
    assert np.all(warmup(100, start=8.0, end=0.5, warmup_steps=0, jitter=0, rng=0) == 0.5)


@settings(max_examples=60, deadline=None)
@given(steps=st.integers(0, 300), every=st.integers(1, 40), length=st.integers(1, 40),
       offset=st.integers(0, 60), seed=st.integers(0, 2**32))
def test_spike_and_burst_positions_follow_the_documented_rule(steps, every, length, offset, seed):
    length = min(length, every)
    want_spikes = np.zeros(steps, bool)
    want_bursts = np.zeros(steps, bool)
    for start in range(offset, steps, every):  # the rule, one step at a time
        want_spikes[start] = True
        for i in range(start, min(start + length, steps)):
            want_bursts[i] = True
    g = spikes(steps, level=1.0, jitter=0, every=every, height=4.0, offset=offset, rng=seed)
    assert np.array_equal(g == 4.0, want_spikes) and np.all((g == 1.0) | want_spikes)
    g = bursts(steps, level=1.0, jitter=0, burst_every=every, burst_length=length, height=4.0,
               offset=offset, rng=seed)
    assert np.array_equal(g == 4.0, want_bursts) and np.all((g == 1.0) | want_bursts)
    assert found_inf_every(steps, every, offset).sum() == want_spikes.sum()


# ------------------------------------------------------------------ overflows_at against torch
def torch_overflows(g: np.ndarray, scale: float, dtype=torch.float16, loss_dtype="float32") -> np.ndarray:
    """torch's own arithmetic: an fp32 loss multiplies in float32 and casts the product to dtype;
    a loss in dtype multiplies the two casts in dtype."""
    if loss_dtype == "float32":
        p = (torch.tensor(g, dtype=torch.float32) * torch.tensor(scale, dtype=torch.float32)).to(dtype)
    else:
        p = torch.tensor(g, dtype=dtype) * torch.tensor(scale, dtype=dtype)
    return (torch.isinf(p) | torch.isnan(p)).numpy()


def edge_grads(scales) -> np.ndarray:
    """Log-uniform gradients over fp16's whole range and beyond, zeros, inf, NaN, negatives, and
    for each scale the values whose product lands on or next to 65504, 65519, 65520, 65536."""
    rng = np.random.default_rng(0)
    g = np.exp2(rng.uniform(-30, 20, 100_000))
    pieces = [g, -g[:1000], [0.0, -0.0, np.inf, -np.inf, np.nan, 2.0**-24, 2.0**-25, 65504.0,
                             65519.0, 65520.0, 65536.0, 1e5, 3.4e38]]
    for s in scales:
        s16 = FP16.quantize(s)
        if not np.isfinite(s16):
            continue
        for target in (65504.0, 65519.0, 65520.0, 65521.0, 65536.0, 32760.0, 32752.0):
            x = np.float32(target / s16)
            near = [x, np.nextafter(x, np.float32(0)), np.nextafter(x, np.float32(np.inf))]
            down, up = FP16.neighbours(x)  # the fp16 values around it
            pieces.append(near + [down, up])
    pieces.append(np.arange(1, 2048) * 2.0**-6)  # many fp16 significands times many scales
    with np.errstate(over="ignore"):
        return np.concatenate([np.asarray(p, np.float64) for p in pieces]).astype(np.float32)


SCALES = [1.0, 2.0**10, 2.0**16, 65504.0, 65520.0, 1e5, 63.0, 65.0, 3.0, 0.1, 2.0**-10, 2047.0]


@pytest.mark.parametrize("loss_dtype", ["float32", "float16"])
def test_overflows_at_matches_torch_fp16_multiply(loss_dtype):
    g = edge_grads(SCALES)
    assert g.size > 100_000
    for scale in SCALES:
        got = overflows_at(g, scale, loss_dtype=loss_dtype)
        assert got.dtype == bool and got.shape == g.shape
        want = torch_overflows(g, scale, loss_dtype=loss_dtype)
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, f"scale {scale}: differs at g = {g[bad[:5]]}"


def test_overflows_at_edges_that_torch_agrees_on():
    # an fp16 loss: 63 * 1040 = 65520 exactly: the tie rounds to inf; 63 * 1039.5 is not an fp16 product
    low = {"loss_dtype": "float16"}
    assert overflows_at(np.float32([1040.0, 1039.0, 1024.0]), 63.0, **low).tolist() == [True, False, False]
    # a scale of 1e5 (or 65520) is inf in fp16: even a zero gradient gives inf * 0 = NaN
    assert overflows_at(np.float32([0.0, 2.0**-20]), 1e5, **low).all()
    # with an fp32 loss the scale is not cast: a small gradient at 1e5 passes, a zero one too
    assert not overflows_at(np.float32([0.0, 2.0**-20]), 1e5).any()
    assert overflows_at(np.float32([0.0]), 65504.0).tolist() == [False]
    assert overflows_at(np.float32([np.nan]), 1.0).tolist() == [True]
    g = np.float32([0, 1, 65504, 65519, 65520, np.inf])
    for kw in ({}, low):
        assert np.array_equal(overflows_at(g, 1.0, **kw), torch_overflows(g, 1.0, **kw))
        assert overflows_at(g, 1.0, **kw).tolist() == [False, False, False, False, True, True]


@pytest.mark.parametrize("loss_dtype", ["float32", "bfloat16"])
def test_overflows_at_bf16_matches_torch(loss_dtype):
    g = edge_grads([1.0, 2.0**100, 3.0])
    for scale in (1.0, 2.0**100, 3.0, 2.0**127):
        assert np.array_equal(overflows_at(g, scale, fmt=BF16, loss_dtype=loss_dtype),
                              torch_overflows(g, scale, dtype=torch.bfloat16, loss_dtype=loss_dtype))


# ------------------------------------------------------------------ found_inf patterns
def test_found_inf_every():
    f = found_inf_every(1_000_000, 1000)
    assert f.dtype == bool and f.shape == (1_000_000,) and f.sum() == 1000
    assert np.array_equal(np.flatnonzero(f), np.arange(0, 1_000_000, 1000))
    assert found_inf_every(1_000_000, 1000, offset=999).sum() == 1000
    assert found_inf_every(10, 3, offset=2).tolist() == [i in (2, 5, 8) for i in range(10)]
    assert found_inf_every(10, 1).all() and not found_inf_every(10, 4, offset=10).any()
    assert found_inf_every(0, 5).shape == (0,)


def test_found_inf_random():
    n, rate = 1_000_000, 1e-3
    f = found_inf_random(n, rate, rng=np.random.default_rng(11))
    lo, hi = binomial_band(n, rate)
    assert f.dtype == bool and f.shape == (n,) and lo <= f.sum() <= hi
    assert np.array_equal(f, found_inf_random(n, rate, 11))
    assert not np.array_equal(f, found_inf_random(n, rate, 12))
    assert not found_inf_random(1000, 0, 0).any() and found_inf_random(1000, 1, 0).all()
    g = found_inf_random(100_000, 0.3, 0)
    assert abs(g.mean() - 0.3) < 0.01


# ------------------------------------------------------------------ the registry
def test_registry_names():
    assert list(SCENARIOS) == ["steady", "drift", "spikes", "bursts", "warmup"]
    for name, fn in SCENARIOS.items():
        assert fn.__name__ == name and "strength" in fn.__doc__  # the docstring says what it does


@pytest.mark.parametrize("name", list(SCENARIOS))
@pytest.mark.parametrize("strength", [0, 0.5, 1])
@pytest.mark.parametrize("steps", [0, 1, 3000])
def test_every_scenario_runs(name, strength, steps):
    g = SCENARIOS[name](steps, strength, np.random.default_rng(0))
    assert g.dtype == np.float32 and g.shape == (steps,)
    assert np.all(np.isfinite(g)) and np.all(g > 0)
    assert np.array_equal(g, scenario(name, steps, strength, 0))


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_strength_makes_a_scenario_more_severe(name):
    mild, severe = (SCENARIOS[name](20_000, s, 0) for s in (0.0, 1.0))
    if name == "drift":  # smaller gradients at the end
        assert np.median(severe[-1000:]) < np.median(mild[-1000:]) / 2**10
    elif name == "steady":  # wider fluctuation
        assert np.std(np.log2(severe)) > 1.5 and np.std(np.log2(mild)) == 0
    else:  # more overflows at a moderate scale
        assert overflows_at(severe, 2.0**10).sum() > overflows_at(mild, 2.0**10).sum()


def test_spikes_scenario_strengths():
    steps = 10_000
    clock = found_inf_every(steps, 500)
    assert not overflows_at(scenario("spikes", steps, 0, 0), 2.0**10).any()
    half = scenario("spikes", steps, 0.5, 0)  # spikes near 256
    assert np.array_equal(overflows_at(half, 2.0**10), clock)
    assert not overflows_at(half, 2.0**4).any()
    full = scenario("spikes", steps, 1, 0)  # spikes beyond fp16's range
    assert np.array_equal(overflows_at(full, 1.0), clock)  # with an fp32 loss: at every scale from 1
    assert not overflows_at(full, 2.0**-8).any()  # (spikes near 2^20 times 2^-8 are finite in fp16)
    assert np.array_equal(overflows_at(full, 2.0**-24, loss_dtype="float16"), clock)  # fp16 loss: every scale


@pytest.mark.parametrize("strength,length", [(0, 1), (0.5, 5), (1, 8)])
def test_bursts_scenario_lengths(strength, length):
    g = scenario("bursts", 10_000, strength, 0)
    starts, lengths = runs(overflows_at(g, 2.0**10))
    assert np.array_equal(starts, np.arange(0, 10_000, 1000)) and np.all(lengths == length)
    assert not overflows_at(g, 2.0**4).any()


def test_warmup_scenario():
    mild, severe = scenario("warmup", 5000, 0, 0), scenario("warmup", 5000, 1, 0)
    assert not overflows_at(mild, 2.0**10).any()
    assert np.median(severe[:10]) > 2.0**15  # starts near 2**16 ...
    assert overflows_at(severe[:10], 1.0).any()  # ... so some first steps are beyond fp16's range
    assert overflows_at(severe[:10], 2.0**-24, loss_dtype="float16").any()  # (an fp16 loss: at any scale)
    assert not overflows_at(severe[500:], 2.0**10).any()  # then settled


# ------------------------------------------------------------------ bad arguments
BAD = [
    (lambda: steady(-1, rng=0), ValueError, "steps must be at least 0"),
    (lambda: steady(2.5, rng=0), ValueError, "steps must be a whole number"),
    (lambda: steady("10", rng=0), TypeError, "steps must be a whole number"),
    (lambda: steady(10, level=np.inf, rng=0), ValueError, "level must be a positive finite"),
    (lambda: steady(10, level=float("nan"), rng=0), ValueError, "level must be a positive finite"),
    (lambda: steady(10, level=0, rng=0), ValueError, "level must be a positive finite"),
    (lambda: steady(10, jitter=-1, rng=0), ValueError, "jitter must be a finite number >= 0"),
    (lambda: steady(10, rng=None), TypeError, "rng must be a numpy Generator"),
    (lambda: steady(10, rng=-3), ValueError, "seed must be >= 0"),
    (lambda: drift(10, end=-1.0, rng=0), ValueError, "end must be a positive finite"),
    (lambda: spikes(10, every=0, rng=0), ValueError, "every must be at least 1"),
    (lambda: spikes(10, height=0.5, rng=0), ValueError, "height must be a finite number >= 1"),
    (lambda: spikes(10, placement="clock", rng=0), ValueError, "placement must be 'periodic' or"),
    (lambda: spikes(10, offset=-1, rng=0), ValueError, "offset must be at least 0"),
    (lambda: bursts(10, burst_every=3, burst_length=4, rng=0), ValueError, "must not exceed"),
    (lambda: bursts(10, burst_length=0, rng=0), ValueError, "burst_length must be at least 1"),
    (lambda: warmup(10, warmup_steps=-5, rng=0), ValueError, "warmup_steps must be at least 0"),
    (lambda: found_inf_every(10, 0), ValueError, "every must be at least 1"),
    (lambda: found_inf_every(-1, 3), ValueError, "steps must be at least 0"),
    (lambda: found_inf_random(10, 1.5, 0), ValueError, "rate must be between 0 and 1"),
    (lambda: found_inf_random(10, -0.1, 0), ValueError, "rate must be between 0 and 1"),
    (lambda: found_inf_random(10, float("nan"), 0), ValueError, "rate must be between 0 and 1"),
    (lambda: overflows_at([1.0], 0.0), ValueError, "scale must be positive"),
    (lambda: overflows_at([1.0], float("nan")), ValueError, "scale must be positive"),
    (lambda: overflows_at([1.0], 1.0, fmt=FP8_E4M3), ValueError, "saturates at 448"),
    (lambda: overflows_at([1.0], 1.0, fmt="fp12"), ValueError, "unknown format"),
    (lambda: overflows_at(["a"], 1.0), TypeError, "grad_max must be numbers"),
    (lambda: SCENARIOS["spikes"](10, 1.5, 0), ValueError, "strength must be between 0 and 1"),
    (lambda: scenario("noisy", 10, 0.5, 0), ValueError, "unknown scenario 'noisy'; choose one of"),
]


@pytest.mark.parametrize("call,error,message", BAD, ids=[b[2] for b in BAD])
def test_bad_arguments_are_explained(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_whole_floats_are_accepted_for_counts():
    assert steady(1e3, rng=0).shape == (1000,)
    assert found_inf_every(np.int64(10), np.int32(5)).sum() == 2


def test_import_stays_numpy_only():
    import subprocess
    import sys

    code = ("import ampviz.scaling.synth, sys; "
            "assert not {'plotly', 'ipywidgets', 'torch'} & set(sys.modules), sys.modules.keys()")
    subprocess.run([sys.executable, "-c", code], check=True)
    assert synth.__all__
