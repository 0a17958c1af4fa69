"""ampviz.formats.census: exact against torch's multiply-and-cast, fast paths equal the brute-force path."""

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import ampviz.formats.census as census_module
from ampviz.formats.census import CensusResult, census, census_reference, profile
from ampviz.formats import CATEGORIES, FORMATS

TORCH_DTYPES = {
    "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
    "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2,
}
POW2_SCALES = [2.0**k for k in (-40, -12, -1, 0, 1, 7, 16, 24, 40, 100)]
OTHER_SCALES = [1 / 3, 0.1, 1000.0, 3.0000002, 65536.3, 1e-30, 1e30]


def torch_counts(v: np.ndarray, name: str, scale: float) -> dict:
    """Categories of (torch.from_numpy(v) * scale).to(dtype), read off torch's own results."""
    x = torch.from_numpy(v)
    p = x * scale
    dt = TORCH_DTYPES[name]
    y = p.to(dt).to(torch.float64).abs().numpy()
    p32 = p.numpy()
    zero = v == 0
    nan = np.isnan(v)
    over = np.isinf(y)
    if name == "fp8_e4m3":  # torch saturates at 448; a non-saturating cast tells what overflowed
        with np.errstate(over="ignore", invalid="ignore"):
            over = np.isnan(p32.astype(ml_dtypes.float8_e4m3fn).astype(np.float64)) & ~nan
    under = (y == 0) & ~zero
    sub = (y > 0) & (y < float(torch.finfo(dt).smallest_normal))
    normal = ~(zero | nan | over | under | sub)
    return {"zero": int(zero.sum()), "underflow": int(under.sum()), "subnormal": int(sub.sum()),
            "normal": int(normal.sum()), "overflow": int(over.sum()), "nan": int(nan.sum())}


def edge_data(seed: int = 0) -> np.ndarray:
    """Gradient-like values plus every kind of edge: zeros, inf, NaN, float32 subnormals, every
    fp16/fp8 rounding midpoint and its float32 neighbours, at many binary shifts."""
    rng = np.random.default_rng(seed)
    n = 300_000
    g = (rng.standard_normal(n) * np.exp2(rng.normal(-16, 8, n))).astype(np.float32)
    g[rng.random(n) < 0.2] = 0
    pieces = [g, np.float32([0, -0.0, np.inf, -np.inf, np.nan, 1e-45, 3e-39, 2**-126, 2**-134])]
    for name in ("fp16", "fp8_e4m3", "fp8_e5m2"):
        fmt = FORMATS[name]
        vals = np.unique(np.abs(fmt.decode(np.arange(1 << fmt.bits))))
        vals = vals[np.isfinite(vals)]
        mids = np.concatenate([(vals[:-1] + vals[1:]) / 2, [fmt.overflow_boundary]])
        for shift in (-40, -16, -7, 0, 7, 16):
            with np.errstate(over="ignore", under="ignore"):
                m = (mids * 2.0**shift).astype(np.float32)
            pieces += [m, np.nextafter(m, np.float32(np.inf)), np.nextafter(m, np.float32(0))]
    v = np.concatenate(pieces)
    v[rng.random(v.size) < 0.5] *= -1
    return rng.permutation(v)


@pytest.fixture(scope="module")
def data():
    return edge_data()


@pytest.fixture(scope="module")
def prof(data):
    return profile(data)


# ---------------------------------------------------------------- exact against torch
@pytest.mark.parametrize("name", list(TORCH_DTYPES))
@pytest.mark.parametrize("scale", POW2_SCALES + OTHER_SCALES)
def test_counts_equal_torch(data, prof, name, scale):
    expected = torch_counts(data, name, scale)
    assert census(data, name, scale).counts == expected
    assert census(prof, name, scale).counts == expected


@pytest.mark.parametrize("name", list(FORMATS))
@pytest.mark.parametrize("scale", POW2_SCALES + OTHER_SCALES)
def test_fast_paths_equal_reference(data, prof, name, scale):
    """Counts and histogram, tf32 included (its quantize is tested bit-exact on its own)."""
    ref = census_reference(data, name, scale)
    assert census(data, name, scale) == ref
    assert census(prof, name, scale) == ref


@settings(max_examples=150, deadline=None)
@given(
    v=hnp.arrays(np.float32, st.integers(0, 300), elements=st.floats(width=32)),
    scale=st.floats(min_value=1e-38, max_value=1e38),
    name=st.sampled_from(sorted(FORMATS)),
    pow2=st.integers(-149, 127),
)
def test_any_data_any_scale(v, scale, name, pow2):
    p = profile(v)
    for s in (scale, 2.0**pow2):
        ref = census_reference(v, name, s)
        assert census(v, name, s) == ref
        assert census(p, name, s) == ref


# ---------------------------------------------------------------- the profile's fast path
def test_profile_answers_powers_of_two_without_touching_the_data(prof, monkeypatch):
    """fp16 and fp8 at every power of two; bf16 wherever the product stays a float32 normal."""
    cases = [(name, 2.0**k) for name in ("fp16", "fp8_e4m3", "fp8_e5m2") for k in range(-40, 41, 3)]
    cases += [("bf16", 2.0**k) for k in (0, 8, 30, 100)]
    expected = {case: census_reference(prof.values, *case) for case in cases}

    def no_pass(*args, **kwargs):
        raise AssertionError("the profile should not have needed a pass over the data")

    monkeypatch.setattr(census_module, "_census_pass", no_pass)
    for (name, s), ref in expected.items():
        assert census(prof, name, s) == ref


def test_profile_falls_back_where_an_edge_splits_a_binade():
    """bf16 at scale 2**-10: values near 2**-117 land in float32's subnormal range after the
    multiply, where the edges are not at the profile's cut points."""
    rng = np.random.default_rng(1)
    v = (np.exp2(rng.uniform(-118, -115, 50_000))).astype(np.float32)
    p = profile(v)
    s = np.float32(2.0**-10)
    assert census_module._census_profile(p, FORMATS["bf16"], s) is None
    assert census(p, "bf16", s) == census_reference(v, "bf16", s)
    assert census(p, "bf16", s).counts == torch_counts(v, "bf16", float(s))


# ---------------------------------------------------------------- meaning of the result
def test_result_shape_and_histogram(data):
    r = census(data, "fp16", 2.0**10)
    assert isinstance(r, CensusResult) and list(r.counts) == list(CATEGORIES)
    assert sum(r.counts.values()) == r.total == data.size
    assert abs(sum(r.fractions.values()) - 1) < 1e-12
    finite_nonzero = np.isfinite(data) & (data != 0)
    assert r.log2_counts.sum() == finite_nonzero.sum()
    r0 = census(data, "fp16", 1.0)
    # a power-of-two scale shifts the histogram, nothing else
    normal = r0.log2_bins > -127
    shifted = dict(zip(r.log2_bins, r.log2_counts))
    assert all(shifted[b + 10] == c for b, c in zip(r0.log2_bins[normal], r0.log2_counts[normal]))


def test_lesson_numbers_small_example():
    v = np.float32([0.0, 2.0**-25, 2.0**-24, 3e-8, 1e-4, 1.0, 65504, 65520, np.inf, np.nan])
    assert census(v, "fp16").counts == {"zero": 1, "underflow": 1, "subnormal": 2, "normal": 3,
                                        "overflow": 2, "nan": 1}
    assert census(v, "fp16", 2.0).counts == {"zero": 1, "underflow": 0, "subnormal": 3, "normal": 2,
                                             "overflow": 3, "nan": 1}


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), 1e39])
def test_bad_scale_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="scale must be a positive number"):
        census(np.ones(3, np.float32), "fp16", bad)


def test_bad_inputs_are_clear_errors():
    with pytest.raises(TypeError, match="scale must be a number"):
        census(np.ones(3, np.float32), "fp16", "big")
    with pytest.raises(TypeError, match="values must be numbers"):
        census(np.array(["a", "b"]), "fp16")
    with pytest.raises(ValueError, match="unknown format"):
        census(np.ones(3, np.float32), "fp12")


def test_empty_input():
    r = census(np.zeros(0, np.float32), "fp16")
    assert r.total == 0 and all(c == 0 for c in r.counts.values()) and r.log2_bins.size == 0


# ---------------------------------------------------------------- plausible wrong variants fail
def test_multiplying_in_float64_is_caught():
    """torch rounds the product to float32 before the cast. A census that casts the exact product
    instead gets a value just above the underflow tie wrong: the float32 product lands exactly on
    2**-25 (a tie, so 0), the exact one just above it (so 2**-24)."""
    s32 = np.float32(0.1)
    start = np.float32(2.0**-25 / float(s32))
    candidates = start + np.arange(-4, 5, dtype=np.float32) * np.spacing(start)
    exact = candidates.astype(np.float64) * float(s32)
    rounded = candidates * s32
    v = candidates[(exact > 2.0**-25) & (rounded == np.float32(2.0**-25))]
    assert v.size >= 1
    wrong = FORMATS["fp16"]._round_magnitude(v.astype(np.float64) * float(s32))  # one rounding
    right = torch_counts(v, "fp16", 0.1)
    assert (wrong == 2.0**-24).all() and right["underflow"] == v.size
    assert census(v, "fp16", 0.1).counts == right


def test_treating_the_underflow_tie_as_nonzero_is_caught():
    """2**-25 rounds to 0 (tie to even): a census using < instead of <= would count it subnormal."""
    v = np.float32([2.0**-25, 2.0**-25, 2.0**-24])
    assert census(v, "fp16").counts["underflow"] == torch_counts(v, "fp16", 1.0)["underflow"] == 2


def test_underflow_fractions_equal_census_at_every_scale(data):
    from ampviz.formats.census import underflow_fractions

    scales = [2.0**-10, 1.0, 0.3, 1000.0, 2.0**20, 3e-8, 1.0]
    for name in ("fp16", "bf16", "fp8_e4m3"):
        got = underflow_fractions(data, name, scales)
        expected = [census(data, name, s).fractions["underflow"] for s in scales]
        assert got.tolist() == expected


# ---------------------------------------------------------------- torch tensors, and what is refused
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2,
                                   torch.float32, torch.float64],
                         ids=lambda d: str(d).replace("torch.", ""))
def test_tensors_of_any_float_dtype_count_like_torch(data, dtype):
    """A tensor (low precision, needing grad, float64) is counted as torch computes it: its values
    as torch casts them to float32, multiplied by the scale in float32, cast to the format."""
    t = torch.from_numpy(data).to(dtype)
    if dtype.itemsize > 1:  # torch has no arithmetic for fp8
        t = t.requires_grad_() * 1
    v = t.detach().to(torch.float32).numpy()  # torch's own cast to float32
    p = profile(t)
    for name in ("fp16", "bf16", "fp8_e4m3"):
        for scale in (1.0, 2.0**16, 0.1):
            expected = torch_counts(v, name, scale)
            assert census(t, name, scale).counts == expected
            assert census(p, name, scale).counts == expected
            assert census_reference(t, name, scale) == census(v, name, scale)
    from ampviz.formats.census import underflow_fractions

    assert underflow_fractions(t, "fp16", [1.0, 2.0**10]).tolist() == [
        census(v, "fp16", s).fractions["underflow"] for s in (1.0, 2.0**10)]


def test_scale_may_be_a_tensor_or_a_numpy_number():
    v = np.float32([1e-6, 3.0, 7e4])
    expected = census(v, "fp16", 1024.0)
    for s in (torch.tensor(1024.0, requires_grad=True), torch.tensor([1024.0], dtype=torch.bfloat16),
              np.float16(1024), np.int64(1024), 1024):
        assert census(v, "fp16", s) == expected


@pytest.mark.parametrize("bad, error, says", [
    ("1000", TypeError, "scale must be a number"),  # a string is not a scale, even if it reads as one
    (b"1000", TypeError, "scale must be a number"),
    (None, TypeError, "scale must be a number"),
    (1 + 1j, TypeError, "scale must be a number"),
    ([2.0, 4.0], TypeError, "scale must be one number, got 2 values"),
    (torch.tensor([2.0, 4.0]), TypeError, "scale must be one number, got 2 values"),
    pytest.param(10**400, ValueError, "scale must be a positive number that fits in float32", id="10**400"),
    pytest.param(-(10**400), ValueError, "scale must be a positive number that fits in float32", id="-10**400"),
])
def test_bad_scales_are_one_line_errors(bad, error, says):
    with pytest.raises(error, match=says) as info:
        census(np.ones(3, np.float32), "fp16", bad)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("bad, says", [
    (None, "got None"),
    ([1.0, None], "got None"),
    (np.array([1 + 1j]), "not complex numbers"),
    (torch.ones(3, dtype=torch.complex64), "complex"),
    (np.array(["1.5"]), "not strings"),
    ("1.5", "not text"),
    (np.array([1], dtype="datetime64[D]"), "not datetimes"),
    (np.array([1], dtype="timedelta64[D]"), "not time spans"),
    (torch.ones(3, device="meta"), "cannot read the values"),
])
@pytest.mark.parametrize("fn", ["census", "census_reference", "profile", "underflow_fractions"])
def test_values_that_are_not_real_numbers_are_one_clear_type_error(bad, says, fn):
    call = {"census": lambda v: census(v, "fp16"), "census_reference": lambda v: census_reference(v, "fp16"),
            "profile": profile, "underflow_fractions": lambda v: census_module.underflow_fractions(v, "fp16", [1.0])}
    with pytest.raises(TypeError, match=says) as info:
        call[fn](bad)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("bad", [["a"], None, "1", [1.0, None], 1 + 1j])
def test_bad_scales_for_underflow_fractions_are_one_clear_type_error(bad):
    with pytest.raises(TypeError, match="scales must be numbers") as info:
        census_module.underflow_fractions(np.ones(3, np.float32), "fp16", bad)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float6_e3m2fn",
                                  "float4_e2m1fn", "float8_e8m0fnu"])
def test_ml_dtypes_arrays_count_as_their_float32_values(data, name):
    """An ml_dtypes array is counted as its values, which float32 holds exactly."""
    with np.errstate(all="ignore"):
        a = data[:20_000].astype(getattr(ml_dtypes, name))
    plain = a.astype(np.float32)
    for fmt in ("fp16", "bf16", "fp8_e4m3"):
        for scale in (1.0, 2.0**12, 3.0):
            assert census(a, fmt, scale) == census(plain, fmt, scale) == census(profile(a), fmt, scale)
            assert census_reference(a, fmt, scale) == census_reference(plain, fmt, scale)
        scales = [1.0, 2.0**-8, 5.0]
        assert np.array_equal(census_module.underflow_fractions(a, fmt, scales),
                              census_module.underflow_fractions(plain, fmt, scales))


def test_bools_count_as_zero_and_one():
    b = np.array([True, False, True])
    assert census(b, "fp16").counts == census(np.float32([1, 0, 1]), "fp16").counts
    assert census(torch.from_numpy(b), "fp16") == census(b, "fp16")
