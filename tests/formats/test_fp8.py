"""ampviz.formats.fp8 against its references, bit for bit: torchao 0.18's current-scaling functions on the
CPU (``torchao/float8/float8_utils.py``: ``amax_to_scale``, ``tensor_to_scale``;
``float8_scaling_utils.hp_tensor_to_float8_dynamic``), and a port of Transformer Engine's Python
delayed-scaling update, run in torch below. Each reference is also shown to catch a plausible
wrong variant of its rule.

The torchao tests skip without torchao, except under CI=true, where they fail."""

import math
import time
import zlib
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ampviz.formats import fp8
from ampviz.formats.fp8 import current as fp8_current
from ampviz.formats.fp8 import (EPS, CurrentScaled, DelayedScaler, DelayedState, DelayedTrace,
                                current_quantize, current_scale, recipe_formats, simulate_delayed)
from ampviz.formats import FP8_E4M3, FP8_E5M2

F32 = np.float32
INF, NAN = math.inf, math.nan
FMTS = {"fp8_e4m3": (torch.float8_e4m3fn, 448.0), "fp8_e5m2": (torch.float8_e5m2, 57344.0)}


def same(a, b) -> np.ndarray:
    """Bit-identical float32 values (NaN equals NaN)."""
    a, b = np.asarray(a, F32), np.asarray(b, F32)
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


def amax_stream(rng, shape) -> np.ndarray:
    """Random amaxes: zeros, float32 subnormals, small, ordinary, huge, near powers of two, inf, NaN."""
    kinds = rng.choice(8, size=shape, p=[.08, .06, .12, .46, .08, .12, .04, .04])
    out = np.exp(rng.normal(0, 4, shape))
    out = np.where(kinds == 0, 0.0, out)
    out = np.where(kinds == 1, np.exp(rng.uniform(-103, -87, shape)), out)  # float32 subnormals
    out = np.where(kinds == 2, np.exp(rng.uniform(-87, -30, shape)), out)
    out = np.where(kinds == 4, np.exp(rng.uniform(60, 88.7, shape)), out)
    near = np.ldexp(1.0, rng.integers(-60, 60, shape)) * (1 - rng.integers(0, 5, shape) * 2.0**-24)
    out = np.where(kinds == 5, near, out)
    out = np.where(kinds == 6, INF, out)
    out = np.where(kinds == 7, NAN, out)
    return out.astype(F32)


# ---------------------------------------------------------------- Transformer Engine, ported
# From transformer_engine/pytorch/quantization.py (NVIDIA/TransformerEngine), the unfused
# Python update: _update_amax_history, _default_get_amax_and_update_history, _default_sf_compute
# (its @jit_fuser decorator left out: scripted and compiled, torch gives the same float32 bits).
# ``variant`` switches on one plausible mistake at a time; None is the port itself.
def _update_amax_history(amax_history: torch.Tensor) -> torch.Tensor:
    if amax_history.shape[0] > 1:
        new_amax_history = torch.roll(amax_history, -1, 0)
        amax_history.copy_(new_amax_history)
    amax_history[0].fill_(0.0)
    return amax_history


def _default_get_amax_and_update_history(amax_history: torch.Tensor, amax_compute_algo: str):
    if amax_compute_algo == "max":
        amax = torch.max(amax_history, dim=0).values
    else:  # amax_compute_algo == "most_recent"
        amax = amax_history[0].clone()
    amax_history = _update_amax_history(amax_history)
    return amax_history, amax


def _default_sf_compute(amax, scale, fp8_max: float, margin: int, variant=None,
                        _fp32_max: float = torch.finfo(torch.float32).max):
    if variant == "margin_multiplies":
        sf = (fp8_max / amax) * (2**margin)
    elif variant == "true_division":  # the CUDA kernel's order: (max * 2^-margin) / amax, rounded once
        sf = torch.div(torch.tensor(fp8_max / 2**margin, dtype=torch.float32), amax)
    else:
        sf = (fp8_max / amax) / (2**margin)
    if variant != "zero_not_kept":
        sf = torch.where(amax > 0.0, sf, scale)
    if variant != "inf_not_kept":
        sf = torch.where(torch.isfinite(amax), sf, scale)
    sf = torch.where(torch.isinf(sf), torch.full_like(sf, _fp32_max), sf)
    scale.copy_(sf)
    return scale


def te_delayed(amaxes: np.ndarray, margin: int, history_len: int, algo: str, fp8_max: float, variant=None):
    """(scale in force, window amax) per step for each column of ``amaxes`` (steps x tensors): each
    step's cast records its amax in slot 0 of the history, then the update runs."""
    n, k = amaxes.shape
    length = history_len + {"window_short": -1, "window_long": 1}.get(variant, 0)
    if variant == "algo_swapped":
        algo = {"max": "most_recent", "most_recent": "max"}[algo]
    hist = torch.zeros(max(length, 1), k, dtype=torch.float32)
    scale = torch.ones(k, dtype=torch.float32)
    scales, windows = np.empty((n, k), F32), np.empty((n, k), F32)
    for i in range(n):
        scales[i] = scale.numpy()
        hist[0] = torch.from_numpy(amaxes[i])
        if variant == "nan_dropped":  # fmaxf-style: a NaN amax never enters the window
            hist[0] = torch.nan_to_num(hist[0], nan=0.0, posinf=INF)
        hist, w = _default_get_amax_and_update_history(hist, algo)
        _default_sf_compute(w, scale, fp8_max, margin, variant)
        windows[i] = w.numpy()
    return scales, windows


# From transformer_engine/common/recipe/delayed_scaling.cu (NVIDIA/TransformerEngine), kernel_bulk:
# one thread's view of one tensor, in float32; the fused update Transformer Engine's modules run by
# default (quantization.py, reduce_and_update_fp8_tensors, unless NVTE_UNFUSED_FP8_UPDATE=1 or a
# callable amax_compute_algo / scaling_factor_compute_algo).
def te_cuda_delayed(amaxes: np.ndarray, margin: int, history_len: int, algo: str, fp8_max: float):
    scaled_max = F32(fp8_max) * F32(2.0**-margin)  # fp8_dtype_max(fp8_dtype) * std::pow(2.f, -margin)
    hist = np.zeros(history_len, F32)
    scale = F32(1)
    scales, windows = [], []
    for x in amaxes:
        scales.append(scale)
        hist[0] = x  # the cast's amax, in slot 0
        last_amax = hist[0]
        amax = F32(0)
        if last_amax != 0:
            new = hist.copy()
            for i in range(history_len):
                a = hist[i + 1] if i < history_len - 1 else last_amax
                amax = np.fmax(amax, a)  # fmaxf: NaN dropped
                new[i] = a if i > 0 else 0
            hist = new
        if algo == "most_recent":
            amax = last_amax
        with np.errstate(all="ignore"):
            s = scaled_max / amax if (np.isfinite(amax) and amax > 0) else scale
        scale = np.finfo(F32).max if np.isinf(s) else F32(s)
        windows.append(amax)
    return np.array(scales, F32), np.array(windows, F32)


@pytest.mark.parametrize("margin,length,algo", [(0, 1, "max"), (1, 4, "max"), (2, 5, "most_recent"),
                                                (-2, 7, "max"), (0, 3, "most_recent")])
def test_delayed_cuda_convention_matches_the_kernel(margin, length, algo):
    rng = np.random.default_rng(zlib.crc32(repr((margin, length, algo)).encode()))
    a = amax_stream(rng, (150, 16))
    a[rng.random(a.shape) < 0.15] = 0.0  # zero amaxes: the kernel's skipped roll
    for j in range(a.shape[1]):
        ref_scale, ref_window = te_cuda_delayed(a[:, j], margin, length, algo, 448.0)
        tr = simulate_delayed(a[:, j], margin=margin, history_len=length, algo=algo, convention="cuda")
        assert same(tr.scale, ref_scale).all() and same(tr.window_amax, ref_window).all()
        py = simulate_delayed(a[:, j], margin=margin, history_len=length, algo=algo)
        assert same(py.amax, tr.amax).all()
    # the two conventions part: division order, a zero amax, a NaN in the window
    assert not same(simulate_delayed([3.0], convention="cuda").final.scale, simulate_delayed([3.0]).final.scale)
    z = [8.0, 1.0, 0.0, 1.0, 1.0]  # Python: the zero step rolls the 8 out; CUDA: it changes nothing
    assert simulate_delayed(z, history_len=2).scale.tolist() == [1, 56, 56, 448, 448]
    assert simulate_delayed(z, history_len=2, convention="cuda").scale.tolist() == [1, 56, 56, 56, 448]
    nan = [2.0, NAN, 4.0]
    assert simulate_delayed(nan, history_len=3).scale.tolist() == [1, 224, 224]
    assert simulate_delayed(nan, history_len=3, convention="cuda").scale.tolist() == [1, 224, 224]
    assert simulate_delayed(nan + [1.0], history_len=3, convention="cuda").scale[3] == 112
    assert simulate_delayed(nan + [1.0], history_len=3).scale[3] == 224


CONFIGS = [(0, 1, "max"), (0, 4, "max"), (1, 4, "most_recent"), (3, 16, "max"), (-2, 7, "max"),
           (2, 5, "most_recent"), (1, 64, "max"), (0, 1024, "max")]


@pytest.mark.parametrize("name", list(FMTS))
@pytest.mark.parametrize("margin,length,algo", CONFIGS)
def test_delayed_matches_transformer_engine(name, margin, length, algo):
    """simulate_delayed and DelayedScaler.update, stepped, equal the ported update bit for bit."""
    rng = np.random.default_rng(zlib.crc32(repr((name, margin, length, algo)).encode()))
    a = amax_stream(rng, (300, 24))
    ref_scale, ref_window = te_delayed(a, margin, length, algo, FMTS[name][1])
    scaler = DelayedScaler(margin, length, algo, name)
    for j in range(a.shape[1]):
        tr = simulate_delayed(a[:, j], margin=margin, history_len=length, algo=algo, fmt=name)
        assert same(tr.scale, ref_scale[:, j]).all()
        assert same(tr.window_amax, ref_window[:, j]).all()
        assert np.array_equal(tr.frozen, ~(np.isfinite(ref_window[:, j]) & (ref_window[:, j] > 0)))
    state, stepped = scaler.initial_state(), []
    for x in a[:80, 0]:  # the state machine, one step at a time
        stepped.append(state.scale)
        state = scaler.update(state, float(x))
    assert same(stepped, ref_scale[:80, 0]).all()


@pytest.mark.parametrize("variant", ["margin_multiplies", "true_division", "zero_not_kept", "window_short",
                                     "window_long", "algo_swapped", "nan_dropped", "inf_not_kept"])
def test_delayed_wrong_variants_are_caught(variant):
    """Each plausible mistake changes some scale on the same streams the module matches."""
    rng = np.random.default_rng(7)
    a = amax_stream(rng, (200, 24))
    for margin, length, algo in [(1, 4, "max"), (2, 3, "most_recent")]:
        wrong, _ = te_delayed(a, margin, length, algo, 448.0, variant)
        ours = np.stack([simulate_delayed(a[:, j], margin=margin, history_len=length, algo=algo).scale
                         for j in range(a.shape[1])], axis=1)
        if not same(ours, wrong).all():
            return
    pytest.fail(f"variant {variant} was not told apart")


def test_delayed_trace_of_the_fact_sheet():
    """The worked example (length 4, margin 1, E4M3): an inf freezes 'max' for the window."""
    a = [2, 8, 1, 0, INF, 1e-40, 4]
    tr = simulate_delayed(a, margin=1, history_len=4, algo="max")
    assert tr.scale.tolist() == [1, 112, 28, 28, 28, 28, 28] and tr.final.scale == 28
    assert tr.frozen.tolist() == [False, False, False, False, True, True, True]
    assert tr.saturated.tolist() == [False, True, False, False, True, False, False]  # 8 * 112 > 464
    tr = simulate_delayed(a, margin=1, history_len=4, algo="most_recent")
    assert tr.scale[1:].tolist() == [112, 28, 224, 224, 224, float(np.finfo(F32).max)] and tr.final.scale == 56
    # a spike holds the scale down for the whole window, then it recovers
    tr = simulate_delayed([1.0] * 3 + [100.0] + [1.0] * 10, history_len=5)
    low = F32(448) * (F32(1) / F32(100))
    assert same(tr.scale, [1, 448, 448, 448] + [low] * 5 + [448] * 5).all() and tr.saturated.tolist() == [
        False, False, False, True] + [False] * 10


def test_delayed_resumes_from_a_state_and_is_fast():
    rng = np.random.default_rng(3)
    a = amax_stream(rng, (4000,))
    whole = simulate_delayed(a, history_len=64)
    first = simulate_delayed(a[:1500], history_len=64)
    rest = simulate_delayed(a[1500:], history_len=64, state=first.final)
    assert same(np.concatenate((first.scale, rest.scale)), whole.scale).all()
    assert same(whole.final.scale, rest.final.scale) and same(whole.final.history, rest.final.history).all()
    big = np.abs(np.random.default_rng(0).normal(size=1_000_000)).astype(F32)
    start = time.perf_counter()
    tr = simulate_delayed(big, history_len=1024)
    assert time.perf_counter() - start < 5  # about 0.1 s here; the port would take minutes
    # a step saturates only when its amax beats the window the scale came from (a new record)
    record = big[1:] > tr.window_amax[:-1]
    assert (tr.saturated[1:] <= record).all() and 0 < tr.saturated.sum() < record.sum() < 2000


def test_recipe_formats():
    assert recipe_formats() == (FP8_E4M3, FP8_E5M2) == recipe_formats("hybrid")
    assert recipe_formats("E4M3") == (FP8_E4M3, FP8_E4M3)
    with pytest.raises(ValueError, match="pure E5M2"):
        recipe_formats("E5M2")


# ---------------------------------------------------------------- torchao
@pytest.fixture(scope="module")
def ao(torchao_modules):
    """torchao's float8 utilities; skipped without torchao, a failure under CI=true."""
    return torchao_modules("torchao.float8.config", "torchao.float8.float8_scaling_utils",
                           "torchao.float8.float8_training_tensor", "torchao.float8.float8_utils")


def scale_edges() -> np.ndarray:
    """Amaxes whose scales land on and just below powers of two, plus the special values."""
    k = np.arange(-40, 40)
    exact = np.ldexp(448.0, -k)
    below = [np.nextafter(F32(x), F32(np.inf)) for x in exact.astype(F32)]
    special = [0.0, -0.0, 1e-45, 1e-40, 1e-13, 1e-12, 1.1e-12, 1e30, 3.4028235e38, INF, NAN]
    return np.concatenate((exact, np.ldexp(57344.0, -k), below, special)).astype(F32)


@pytest.mark.parametrize("name", list(FMTS))
@pytest.mark.parametrize("pow2", [False, True])
def test_current_scale_matches_torchao(ao, name, pow2):
    _, _, _, utils = ao
    rng = np.random.default_rng(11)
    a = np.concatenate((scale_edges(), amax_stream(rng, (200_000,)),
                        (F32(FMTS[name][1]) / rng.uniform(2**-30, 2**30, 100_000).astype(F32)).astype(F32)))
    a = np.abs(a)
    ref = utils.amax_to_scale(torch.from_numpy(a), FMTS[name][0], pow2).numpy()
    ours = current_scale(a, name, round_to_power_of_2=pow2)
    assert same(ours, ref).all()
    for x in a[:200]:  # 0-d amaxes, as torchao's tensorwise path passes them
        assert same(current_scale(float(x), name, pow2), utils.amax_to_scale(torch.tensor(x), FMTS[name][0], pow2))


def test_power_of_two_rounding_near_powers_of_two(ao):
    """torchao rounds with a float32 log2, which returns k for a scale just below 2**k: that scale
    goes *up* to 2**k. Every float32 scale within 256 ulps of a power of two in the reachable range
    (448 / 3.4e38 .. 57344 / 1e-12) rounds as torchao's does."""
    _, _, _, utils = ao
    k = np.arange(-121, 57)
    bits = (((k + 127) << 23)[:, None] + np.arange(-256, 257)[None, :]).ravel().astype(np.uint32)
    s = bits.view(F32)
    ref = utils._round_scale_down_to_power_of_2(torch.from_numpy(s)).numpy()
    ours = fp8._pow2_floor_torchao(s)
    assert same(ours, ref).all()
    assert (ref > s).sum() > 1000  # the round-ups are many, not a corner case


def test_current_scale_wrong_variants_are_caught(ao):
    """Each mistake differs from torchao somewhere; a float32 division does not (a fact, not a bug)."""
    _, _, _, utils = ao
    rng = np.random.default_rng(5)
    a = np.concatenate((scale_edges(), np.abs(amax_stream(rng, (200_000,)))))
    m = F32(448)
    plain = utils.amax_to_scale(torch.from_numpy(a), torch.float8_e4m3fn, False).numpy()
    pow2 = utils.amax_to_scale(torch.from_numpy(a), torch.float8_e4m3fn, True).numpy()
    with np.errstate(all="ignore"):
        f32_division = m / np.maximum(a, F32(EPS))
        assert same(f32_division, plain).all()
        wrong = {
            "no EPS clamp": (m / a, plain),
            "reciprocal then multiply (TE's Python order)": ((F32(1) / np.maximum(a, F32(EPS))) * m, plain),
            "amax / max": (np.maximum(a, F32(EPS)) / m, plain),
            "power of two by clearing the mantissa (an exact floor)": (fp8._pow2_floor_bits(plain), pow2),
            "nearest power of two": (np.exp2(np.round(np.log2(plain))).astype(F32), pow2),
        }
    for what, (got, ref) in wrong.items():
        assert not same(got, ref).all(), what


@pytest.mark.parametrize("name", list(FMTS))
@pytest.mark.parametrize("granularity,pow2", [("tensorwise", False), ("tensorwise", True), ("rowwise", True),
                                              ("rowwise", False)])
def test_current_quantize_matches_torchao(ao, name, granularity, pow2):
    config, scaling, tensor, utils = ao
    rng = np.random.default_rng(13)
    gran = config.ScalingGranularity.TENSORWISE if granularity == "tensorwise" else config.ScalingGranularity.AXISWISE
    for trial in range(30):
        x = (rng.normal(size=(8, 33)) * np.exp(rng.normal(0, 6, (8, 1)))).astype(F32)
        if trial % 5 == 1:
            x[2] = 0.0
        if trial % 5 == 2:
            x[3, 4] = np.inf
        t = scaling.hp_tensor_to_float8_dynamic(
            torch.from_numpy(x), FMTS[name][0], tensor.LinearMMConfig(), scaling_granularity=gran,
            axiswise_dim=-1 if granularity == "rowwise" else None, round_scales_to_power_of_2=pow2)
        q = current_quantize(x, name, granularity, pow2)
        ref_scale = utils.tensor_to_scale(torch.from_numpy(x), FMTS[name][0], scaling_granularity=gran,
                                          axiswise_dim=-1 if granularity == "rowwise" else None,
                                          round_scales_to_power_of_2=pow2)
        assert same(q.scale, ref_scale.numpy()).all()
        assert same(q.scale, t._scale.numpy()).all() and q.scale.shape == tuple(t._scale.shape)
        assert np.array_equal(q.codes, t._data.view(torch.uint8).numpy())
        assert same(q.dequantized, t.to_original_precision().numpy()).all()


def nan_tensors() -> list:
    """Tensors holding NaN: one NaN, NaN in some rows, all NaN, -NaN, NaN beside inf, NaN with a
    payload, one element, and long rows (torch's vectorized loops and their remainders)."""
    rng = np.random.default_rng(17)
    out = []
    for shape, where in [((3,), [1]), ((8, 33), [(2, 4)]), ((8, 33), [(1, 0), (5, 32), (6, 7)]), ((1,), [0]),
                         ((4, 1), [(2, 0)]), ((2, 100), [(0, 99)]), ((3, 2, 40), [(1, 1, 3)])]:
        x = (rng.normal(size=shape) * np.exp(rng.normal(0, 4, shape[:-1] + (1,)))).astype(F32)
        for w in where:
            x[w] = np.nan
        out.append(x)
    out.append(np.full((2, 3), np.nan, F32))
    out.append(np.full((5, 17), -np.nan, F32))
    out.append(np.array([[1.0, -np.nan, 3.0], [np.inf, np.nan, -2.0]], F32))
    out.append(np.array([1.0, 2.0, 0x7FC12345, 0xFFC00001], np.uint32).view(F32))  # payloads, one negative
    return out


def torchao_agrees_on_nan(ao, x, name, granularity, pow2) -> bool:
    """Whether current_quantize gives torchao's scale (every bit: a NaN's sign decides the codes)
    and codes on x. An element that is NaN itself, under a NaN scale of the other sign, is the one
    place where torch's multiply keeps either NaN (its vectorized loop the scale's, its remainder
    loop the element's): there our code must be the scale's NaN, torchao's either NaN code."""
    config, scaling, tensor, _ = ao
    gran = config.ScalingGranularity.TENSORWISE if granularity == "tensorwise" else config.ScalingGranularity.AXISWISE
    t = scaling.hp_tensor_to_float8_dynamic(
        torch.from_numpy(x.copy()), FMTS[name][0], tensor.LinearMMConfig(), scaling_granularity=gran,
        axiswise_dim=-1 if granularity == "rowwise" else None, round_scales_to_power_of_2=pow2)
    q = current_quantize(x, name, granularity, pow2)
    ref_scale, ref_codes = t._scale.numpy(), t._data.view(torch.uint8).numpy()
    if q.scale.shape != ref_scale.shape or not np.array_equal(q.scale.view(np.uint32), ref_scale.view(np.uint32)):
        return False
    scale = np.broadcast_to(ref_scale, x.shape)
    either = np.isnan(x) & np.isnan(scale) & (np.signbit(x) != np.signbit(scale))
    nan_code = (0x7F | np.signbit(scale).astype(np.uint8) << 7).astype(np.uint8)
    return (np.array_equal(q.codes[~either], ref_codes[~either]) and np.array_equal(q.codes[either], nan_code[either])
            and ((ref_codes[either] & 0x7F) == 0x7F).all())


@pytest.mark.parametrize("name", list(FMTS))
@pytest.mark.parametrize("granularity,pow2", [("tensorwise", False), ("tensorwise", True), ("rowwise", False),
                                              ("rowwise", True)])
def test_current_quantize_with_nan_matches_torchao(ao, name, granularity, pow2):
    """torch's ``max`` over two or more elements writes the NaN 0xFFFFFFFF (negative), so a
    tensorwise scale is that NaN and the codes 0xFF; ``amax`` along a row writes 0x7FC00000."""
    for x in nan_tensors():
        assert torchao_agrees_on_nan(ao, x, name, granularity, pow2), x
    q = current_quantize(np.array([1.0, np.nan, 3.0], F32), name, granularity, pow2)
    assert q.codes.tolist() == ([0xFF] * 3 if granularity == "tensorwise" else [0x7F] * 3)


def test_a_positive_nan_amax_is_caught(ao, monkeypatch):
    """The plausible variant, a tensorwise amax that is the positive NaN numpy writes, differs
    from torchao."""
    x = np.array([[1.0, np.nan, 3.0], [4.0, 5.0, 6.0]], F32)
    assert torchao_agrees_on_nan(ao, x, "fp8_e4m3", "tensorwise", False)
    monkeypatch.setattr(fp8_current, "_TORCH_MAX_NAN", F32(np.nan))  # read where current_quantize lives
    assert not torchao_agrees_on_nan(ao, x, "fp8_e4m3", "tensorwise", False)


def test_current_scale_te_convention():
    """Transformer Engine's compute_scale_from_amax (recipe_common.cuh), from its formula: 0, inf
    and NaN give 1, a float32 division, powers of two by an exact floor; torchao differs there."""
    a = np.array([0.0, INF, NAN, 3.0, 1e-40, 448 / 31.999998], F32)
    te = current_scale(a, "fp8_e4m3", convention="te")
    assert te[:3].tolist() == [1, 1, 1] and te[3] == F32(448) / F32(3) and te[4] == np.finfo(F32).max
    assert current_scale(a, "fp8_e4m3")[:2].tolist() == [F32(448e12), 0]  # torchao: EPS, and 448/inf = 0
    rng = np.random.default_rng(2)
    s = np.abs(amax_stream(rng, (3000,)))
    p = current_scale(s, "fp8_e5m2", round_to_power_of_2=True, convention="te")
    plain = current_scale(s, "fp8_e5m2", convention="te")
    for x, y in zip(plain[:3000], p[:3000]):
        assert Fraction(float(y)) == 2 ** math.floor(math.log2(Fraction(float(x))))


# ---------------------------------------------------------------- errors and properties
@pytest.mark.parametrize("call,exc", [
    (lambda: simulate_delayed([1, -2]), ValueError),
    (lambda: simulate_delayed([[1, 2]]), ValueError),
    (lambda: simulate_delayed("1"), TypeError),
    (lambda: simulate_delayed([1], margin=0.5), TypeError),
    (lambda: simulate_delayed([1], history_len=0), ValueError),
    (lambda: simulate_delayed([1], algo="mean"), ValueError),
    (lambda: simulate_delayed([1], fmt="fp16"), ValueError),
    (lambda: simulate_delayed([1], fmt=3), TypeError),
    (lambda: simulate_delayed([1], convention="jax"), ValueError),
    (lambda: simulate_delayed([1], state=(1.0, ())), TypeError),
    (lambda: simulate_delayed([1], history_len=3, state=DelayedState(1.0, (0.0,))), ValueError),
    (lambda: DelayedScaler(history_len=2).update(DelayedState(1.0, (0.0,)), [1, 2]), ValueError),
    (lambda: current_scale(-1.0), ValueError),
    (lambda: current_scale(None), TypeError),
    (lambda: current_scale(1.0, round_to_power_of_2=1), TypeError),
    (lambda: current_scale(1.0, convention="ao"), ValueError),
    (lambda: current_quantize([], "fp8_e4m3"), ValueError),
    (lambda: current_quantize(1.0, granularity="rowwise"), ValueError),
    (lambda: current_quantize([1.0], granularity="colwise"), ValueError),
    (lambda: recipe_formats(None), TypeError),
    (lambda: recipe_formats("E3M4"), ValueError),
])
def test_bad_input_is_one_clear_line(call, exc):
    with pytest.raises(exc) as info:
        call()
    assert "\n" not in str(info.value) and len(str(info.value)) < 200


amax_values = st.one_of(st.floats(0, allow_infinity=True), st.sampled_from([0.0, NAN, INF, 1e-40, 3.4e38]))
junk = st.one_of(st.none(), st.text(max_size=3), st.booleans(), st.floats(), st.integers(-3, 3),
                 st.lists(st.floats(), max_size=3))


@settings(max_examples=80, deadline=None)
@given(a=st.lists(amax_values, max_size=40), margin=st.integers(-3, 5), length=st.integers(1, 9),
       algo=st.sampled_from(["max", "most_recent"]), name=st.sampled_from(list(FMTS)),
       conv=st.sampled_from(["python", "cuda"]))
def test_simulate_delayed_equals_stepping(a, margin, length, algo, name, conv):
    tr = simulate_delayed(a, margin=margin, history_len=length, algo=algo, fmt=name, convention=conv)
    assert isinstance(tr, DelayedTrace) and tr.steps == len(a) and not tr.scale.flags.writeable
    scaler = DelayedScaler(margin, length, algo, name, conv)
    state = scaler.initial_state()
    for i, x in enumerate(a):
        assert same(tr.scale[i], state.scale)
        state = scaler.update(state, x)
    assert same(tr.final.scale, state.scale) and same(tr.final.history, state.history).all()


@settings(max_examples=80, deadline=None)
@given(a=st.one_of(amax_values, hnp.arrays(np.float32, st.integers(0, 6), elements=st.floats(0, width=32))),
       name=st.sampled_from(list(FMTS)), pow2=st.booleans(), conv=st.sampled_from(["torchao", "te"]),
       bad=st.one_of(st.none(), junk))
def test_current_scale_properties(a, name, pow2, conv, bad):
    if bad is not None:  # anything odd is one line, never a crash elsewhere
        try:
            current_scale(bad, name, pow2, conv)
        except (TypeError, ValueError) as e:
            assert "\n" not in str(e)
        return
    s = np.atleast_1d(np.asarray(current_scale(a, name, pow2, conv), F32))
    with np.errstate(over="ignore"):  # beyond float32: inf, as the module rounds it
        x = np.atleast_1d(np.abs(np.asarray(a, F32)))
    ok = np.isfinite(x) & (x > 0)
    if pow2:  # a power of two (or 0 / NaN), and never more than twice the plain scale
        plain = np.atleast_1d(np.asarray(current_scale(a, name, False, conv), F32))
        fin = np.isfinite(s) & (s > 0)
        assert (np.frexp(s[fin])[0] == 0.5).all() and (s[fin] <= 2.0 * plain[fin].astype(np.float64)).all()
        if conv == "te":  # an exact floor
            assert (s[fin] <= plain[fin]).all()
    elif conv == "torchao":
        exact = [float(Fraction(FMTS[name][1]) / Fraction(max(float(v), EPS))) for v in x[ok].ravel()]
        assert np.array_equal(s[ok].ravel(), np.array(exact, F32))


@settings(max_examples=60, deadline=None)
@given(x=hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=2, max_side=6),
                    elements=st.floats(width=32, allow_nan=False, allow_infinity=False)),
       name=st.sampled_from(list(FMTS)), gran=st.sampled_from(["tensorwise", "rowwise"]), pow2=st.booleans())
def test_current_quantize_properties(x, name, gran, pow2):
    q = current_quantize(x, name, gran, pow2)
    assert isinstance(q, CurrentScaled) and q.data.shape == x.shape and q.codes.dtype == np.uint8
    fmt = FP8_E4M3 if name == "fp8_e4m3" else FP8_E5M2
    assert (np.abs(q.data) <= fmt.max).all()
    assert same(np.asarray(fmt.decode(q.codes), F32), q.data).all()
    big = np.abs(x) >= np.maximum(q.amax, 1e-30) / 4  # the large elements keep ~fmt's precision
    with np.errstate(all="ignore"):
        rel = np.abs(q.dequantized - x) / np.abs(x)
    fin = np.isfinite(q.dequantized)  # near float32's max the round trip may round up past it, to inf
    assert (np.abs(x[~fin]) > 2.5e38).all()
    assert (rel[fin & big & (x != 0) & (q.amax > 1e-10)] <= 2.0 ** -fmt.mantissa_bits).all()


@settings(max_examples=60, deadline=None)
@given(f=st.one_of(st.sampled_from(["HYBRID", "hybrid", "E4M3", "e4m3", "E5M2"]), junk))
def test_recipe_formats_properties(f):
    try:
        fwd, bwd = recipe_formats(f)
    except (TypeError, ValueError) as e:
        assert "\n" not in str(e)
        return
    assert fwd is FP8_E4M3 and bwd in (FP8_E4M3, FP8_E5M2)


# ---------------------------------------------------------------- a stream of tensors
from ampviz.formats.fp8 import Fp8ScalingTrace, TensorStream, simulate_fp8_scaling, tensor_stream  # noqa: E402

SMALLEST_NORMAL = {"fp8_e4m3": 2.0**-6, "fp8_e5m2": 2.0**-14}


def ml_cast(y: np.ndarray, name: str) -> np.ndarray:
    """ml_dtypes' non-saturating cast of float32 values, back to float32: inf or NaN where rounding
    alone leaves the format's range."""
    import ml_dtypes

    dt = ml_dtypes.float8_e4m3fn if name == "fp8_e4m3" else ml_dtypes.float8_e5m2
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(y, F32).astype(dt).astype(F32)


def torch_counts(x: torch.Tensor, scale, name: str, clamp: bool = True):
    """(saturated, underflowed, subnormal) of one real tensor, quantized as Transformer Engine and
    torchao do: ``f32(x * scale)``, clamped to ±max, then torch's float8 cast. Saturated: the cast
    holds at ±max a value whose rounding alone leaves the range (ml_dtypes' non-saturating cast
    says which)."""
    dtype, fmax = FMTS[name]
    y = x * torch.tensor(scale, dtype=torch.float32)
    q = (y.clamp(-fmax, fmax) if clamp else y).to(dtype).float()
    beyond = ~np.isfinite(ml_cast(y.numpy(), name)) & ~torch.isnan(y).numpy()
    held = torch.from_numpy(beyond) & (q.abs() == fmax)
    underflowed = (x != 0) & (q == 0)
    subnormal = (q != 0) & (q.abs() < SMALLEST_NORMAL[name])
    return int(held.sum()), int(underflowed.sum()), int(subnormal.sum())


def quick_stream(seed=0, steps=300, size=1024, **kw):
    """A stream that changes fast: big drift, frequent spikes, inf and NaN steps."""
    args = dict(spread=3.0, wander=0.5, spike_log2=9, spike_prob=0.04, inf_prob=0.02, nan_prob=0.02)
    args.update(kw)
    return tensor_stream(steps, size, seed=seed, **args)


def counts_of(tr: Fp8ScalingTrace) -> np.ndarray:
    return np.stack([tr.saturated, tr.underflowed, tr.subnormal], axis=1)


DELAYED_CASES = [("fp8_e4m3", 0, 16, "max"), ("fp8_e4m3", 0, 4, "most_recent"), ("fp8_e4m3", 2, 1, "max"),
                 ("fp8_e5m2", 0, 16, "max"), ("fp8_e5m2", 1, 8, "most_recent"), ("fp8_e4m3", -3, 32, "max")]


@pytest.mark.parametrize("name,margin,length,algo", DELAYED_CASES)
def test_delayed_stream_counts_equal_torchs_casts(name, margin, length, algo):
    """Every step's real tensor, its amax taken by torch, the scale from the ported Transformer
    Engine update, quantized with torch's float8 cast after the clamp: the counts equal the
    simulator's, step for step, on streams with spikes, drift, inf and NaN steps."""
    stream = quick_stream(seed=length + margin, spread=3.0 if name == "fp8_e4m3" else 6.0)  # E5M2 is wider
    xs = [torch.from_numpy(stream.tensor(t)) for t in range(stream.steps)]
    amax = np.array([[x.abs().amax().item()] for x in xs], F32)  # torch.amax propagates NaN
    assert same(amax[:, 0], stream.amax).all()
    scales, _ = te_delayed(amax, margin, length, algo, FMTS[name][1])
    tr = simulate_fp8_scaling(stream, "delayed", margin=margin, history_len=length, algo=algo, fmt=name)
    assert same(tr.scale, scales[:, 0]).all()
    want = np.array([torch_counts(x, s, name) for x, s in zip(xs, scales[:, 0])])
    assert np.array_equal(counts_of(tr), want)
    assert want[:, 0].sum() > 0 and want[:, 1].sum() > 0 and want[:, 2].sum() > 0  # every count is exercised


@pytest.mark.parametrize("name", list(FMTS))
@pytest.mark.parametrize("pow2", [False, True])
def test_current_stream_counts_equal_torchaos_quantized_tensors(ao, name, pow2):
    """Current scaling: torchao's own ``hp_tensor_to_float8_dynamic`` quantizes each real tensor
    (tensorwise); its scale and its FP8 data give the simulator's counts (an inf amax makes the
    scale 0, so the whole tensor becomes 0 or NaN)."""
    config, scaling, tensor, _ = ao
    stream = quick_stream(seed=5, steps=200)
    tr = simulate_fp8_scaling(stream, "current", fmt=name, round_to_power_of_2=pow2)
    got = []
    for t in range(stream.steps):
        x = torch.from_numpy(stream.tensor(t))
        f = scaling.hp_tensor_to_float8_dynamic(x, FMTS[name][0], tensor.LinearMMConfig(),
                                                scaling_granularity=config.ScalingGranularity.TENSORWISE,
                                                round_scales_to_power_of_2=pow2)
        assert same(f._scale.item(), tr.scale[t])
        q = f._data.float()
        y = (x * f._scale).numpy()
        beyond = ~np.isfinite(ml_cast(y, name)) & ~np.isnan(y)
        got.append((int((beyond & (q.abs() == FMTS[name][1]).numpy()).sum()), int(((x != 0) & (q == 0)).sum()),
                    int(((q != 0) & (q.abs() < SMALLEST_NORMAL[name])).sum())))
    assert np.array_equal(counts_of(tr), np.array(got))
    assert (tr.underflowed[stream.nonfinite == 1] == stream.size - 1).all()  # scale 0: all but the inf


def test_wrong_variants_of_the_stream_model_fail():
    """Plausible mistakes give other counts than the real casts: delayed scaling with the step's
    own amax (current scaling's scale), a cast without the clamp (E5M2 overflows to inf), underflow
    read as truncation, and saturation read as "past max" (not past the rounding boundary)."""
    name, length = "fp8_e5m2", 16
    stream = quick_stream(seed=1)
    xs = [torch.from_numpy(stream.tensor(t)) for t in range(stream.steps)]
    tr = simulate_fp8_scaling(stream, "delayed", history_len=length, fmt=name)
    right = np.array([torch_counts(x, s, name) for x, s in zip(xs, tr.scale)])
    assert np.array_equal(counts_of(tr), right)
    # 1. the step's own amax: no spike saturates any more
    own = current_scale(stream.amax, name, convention="te")
    assert not np.array_equal(np.array([torch_counts(x, s, name) for x, s in zip(xs, own)]), right)
    # 2. no clamp: torch's E5M2 cast gives inf, not max, for what the clamp holds
    unclamped = np.array([torch_counts(x, s, name, clamp=False) for x, s in zip(xs, tr.scale)])
    assert unclamped[:, 0].sum() == 0 < right[:, 0].sum()
    # 3. underflow read as "below the smallest subnormal" (truncation), not rounding to nearest
    trunc = [int(((x != 0) & ((x * float(sc)).abs() < 2.0**-16)).sum()) for x, sc in zip(xs, tr.scale)]
    assert not np.array_equal(np.array(trunc), right[:, 1])
    # 4. saturation read as "past max": current scales rounded up put the amax an ulp past max,
    # where it rounds to max anyway; the torch-held count stays 0
    cur = simulate_fp8_scaling(stream, "current", fmt="fp8_e4m3")
    past_max = [int(((x * float(sc)).abs() > 448).sum()) for x, sc in zip(xs, cur.scale)]
    assert cur.saturated.sum() == 0 < sum(past_max)
    assert sum(torch_counts(x, sc, "fp8_e4m3")[0] for x, sc in zip(xs, cur.scale)) == 0


def test_the_stream_is_what_it_says():
    s = tensor_stream(400, 512, seed=3, spread=2.0, wander=0.01, spike_log2=6, spike_prob=0.05, inf_prob=0.01,
                      nan_prob=0.01)
    assert isinstance(s, TensorStream) and s.steps == 400 and s.size == 512
    assert not any(a.flags.writeable for a in (s.base, s.magnitude, s.spike, s.nonfinite, s.amax, s.sorted_abs))
    x = s.tensor(10)
    assert x.dtype == F32 and x.flags.writeable
    lg = np.log2(s.magnitude.astype(np.float64)) - 6 * s.spike
    assert np.abs(np.diff(lg)).max() < 0.06  # a slow walk, apart from the spikes
    for t in np.flatnonzero(s.nonfinite):
        x = s.tensor(t)
        assert np.isnan(x).sum() + np.isinf(x).sum() == 1 and (np.isinf(x).any() == (s.nonfinite[t] == 1))
    # each setting moves only itself: the spikes stay where they were when their size changes
    t = tensor_stream(400, 512, seed=3, spread=2.0, wander=0.01, spike_log2=9, spike_prob=0.05, inf_prob=0.01,
                      nan_prob=0.01)
    assert np.array_equal(s.spike, t.spike) and np.array_equal(s.base, t.base)
    assert np.array_equal(s.nonfinite, t.nonfinite)


def test_a_spike_under_max_holds_the_scale_down_for_the_window():
    """One spike of 2^8 at step 100 (no drift): under "max" the steps 101..100+len use a scale 2^8
    lower (more underflow), under "most_recent" step 101 alone; the spike step saturates under both."""
    base = tensor_stream(300, 2048, seed=0, wander=0.0, spike_prob=0.0)
    mag = np.ones(300, F32)
    mag[100] = 256
    s = TensorStream(base.base, fp8._readonly(mag), fp8._readonly(mag > 1), base.nonfinite)
    mx = simulate_fp8_scaling(s, "delayed", history_len=16, algo="max")
    mr = simulate_fp8_scaling(s, "delayed", history_len=16, algo="most_recent")
    for tr in (mx, mr):
        assert tr.saturated[100] > 0 and (tr.saturated[1:100] == 0).all() and (tr.saturated[101:] == 0).all()
    low = mx.scale[1] / 256
    assert (mx.scale[101:117] == low).all() and (mx.scale[117:] == mx.scale[1]).all()
    assert (mr.scale[101] == low) and (mr.scale[102:] == mr.scale[1]).all()
    assert (mx.underflowed[101:117] > mx.underflowed[99]).all() and mx.underflowed[117] == mx.underflowed[99]


def test_the_lab_sized_stream_is_fast():
    """2,000 steps of 4,096 values, both recipes: milliseconds (a slider's budget is ~100 ms)."""
    s = tensor_stream(2000, 4096, seed=0, inf_prob=0.001)
    simulate_fp8_scaling(s)
    start = time.perf_counter()
    for recipe in ("delayed", "current"):
        simulate_fp8_scaling(s, recipe)
    assert time.perf_counter() - start < 0.5  # loose: shared machines; typically ~6 ms


@pytest.mark.parametrize("call,exc", [
    (lambda: tensor_stream(0), ValueError),
    (lambda: tensor_stream(10, 1.5), TypeError),
    (lambda: tensor_stream(10, spread=-1), ValueError),
    (lambda: tensor_stream(10, spike_log2=2.5), TypeError),
    (lambda: tensor_stream(10, spike_prob="x"), TypeError),
    (lambda: tensor_stream(10, inf_prob=0.7, nan_prob=0.7), ValueError),
    (lambda: tensor_stream(10, seed=-1), ValueError),
    (lambda: tensor_stream(10).tensor(10), ValueError),
    (lambda: simulate_fp8_scaling([1.0, 2.0]), TypeError),
    (lambda: simulate_fp8_scaling(tensor_stream(10), "dynamic"), ValueError),
    (lambda: simulate_fp8_scaling(tensor_stream(10), fmt="fp16"), ValueError),
    (lambda: simulate_fp8_scaling(tensor_stream(10), history_len=0), ValueError),
    (lambda: simulate_fp8_scaling(tensor_stream(10), algo="mean"), ValueError),
    (lambda: simulate_fp8_scaling(tensor_stream(10), round_to_power_of_2=True), ValueError),
    (lambda: simulate_fp8_scaling(tensor_stream(10), "current", round_to_power_of_2=1), TypeError),
    (lambda: simulate_fp8_scaling(tensor_stream(10), "current", convention="python"), ValueError),
])
def test_stream_bad_input_is_one_clear_line(call, exc):
    with pytest.raises(exc) as info:
        call()
    assert "\n" not in str(info.value) and len(str(info.value)) < 200


def brute_counts(stream: TensorStream, scale: np.ndarray, fmt) -> np.ndarray:
    """The counts from every value of every tensor, with ampviz.formats' rounding (no search)."""
    out = []
    for t in range(stream.steps):
        x = stream.tensor(t)
        with np.errstate(over="ignore", invalid="ignore"):
            y = (x * scale[t]).astype(F32)
            q = np.asarray(fmt.quantize(np.clip(y, -fmt.max, fmt.max)), F32)
            a = np.abs(y)
            beyond = (a > fmt.overflow_boundary) if fmt.specials == "fn" else (a >= fmt.overflow_boundary)
        out.append((int(beyond.sum()), int(((x != 0) & (q == 0)).sum()),
                    int(((q != 0) & (np.abs(q) < fmt.smallest_normal)).sum())))
    return np.array(out).reshape(-1, 3)


@settings(max_examples=60, deadline=None)
@given(steps=st.integers(1, 40), size=st.integers(1, 64), seed=st.integers(0, 2**32), spread=st.floats(0, 8),
       wander=st.floats(0, 1), spike_log2=st.integers(0, 40), spike_prob=st.floats(0, 1),
       bad=st.tuples(st.floats(0, 0.5), st.floats(0, 0.5)), recipe=st.sampled_from(["delayed", "current"]),
       margin=st.integers(-20, 20), length=st.integers(1, 40), algo=st.sampled_from(["max", "most_recent"]),
       name=st.sampled_from(list(FMTS)), pow2=st.booleans(), conv=st.booleans())
def test_simulate_fp8_scaling_equals_counting_every_value(steps, size, seed, spread, wander, spike_log2, spike_prob,
                                                          bad, recipe, margin, length, algo, name, pow2, conv):
    s = tensor_stream(steps, size, seed=seed, spread=spread, wander=wander, spike_log2=spike_log2,
                      spike_prob=spike_prob, inf_prob=bad[0], nan_prob=bad[1])
    if recipe == "delayed":
        tr = simulate_fp8_scaling(s, recipe, margin=margin, history_len=length, algo=algo, fmt=name,
                                  convention="cuda" if conv else None)
        want_scale = simulate_delayed(s.amax, margin, length, algo, name, convention="cuda" if conv else "python").scale
    else:
        tr = simulate_fp8_scaling(s, recipe, fmt=name, round_to_power_of_2=pow2, convention="te" if conv else None)
        want_scale = current_scale(s.amax, name, pow2, "te" if conv else "torchao")
    assert same(tr.scale, want_scale).all() and tr.steps == steps and tr.size == size
    assert not any(a.flags.writeable for a in (tr.amax, tr.scale, tr.saturated, tr.underflowed, tr.subnormal))
    assert np.array_equal(counts_of(tr), brute_counts(s, tr.scale, tr.fmt))
    assert ((tr.saturated + tr.underflowed + tr.subnormal) <= size).all()
    assert 0 <= tr.worst_step < steps and repr(tr).startswith("Fp8ScalingTrace(")


@settings(max_examples=60, deadline=None)
@given(kwargs=st.dictionaries(st.sampled_from(["steps", "size", "seed", "spread", "wander", "spike_log2",
                                               "spike_prob", "inf_prob", "nan_prob"]), junk, max_size=3),
       sim=st.dictionaries(st.sampled_from(["recipe", "margin", "history_len", "algo", "fmt", "round_to_power_of_2",
                                            "convention"]), junk, max_size=2))
def test_stream_arguments_are_valid_or_one_line(kwargs, sim):
    kwargs = {"steps": 5, "size": 8, **kwargs}
    try:
        s = tensor_stream(**kwargs)
        recipe = sim.pop("recipe", "delayed")
        simulate_fp8_scaling(s, recipe, **sim)
    except (TypeError, ValueError) as e:
        assert "\n" not in str(e) and str(e)
