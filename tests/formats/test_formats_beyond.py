"""The formats beyond the course's six (fnuz fp8, MX fp6/fp4, E8M0) against ml_dtypes and torch:
every bit pattern, every rounding boundary, each library's overflow/NaN convention, and a plausible
wrong variant of each caught."""


import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ampviz.formats import (
    ALL_FORMATS, CATEGORIES, E8M0, FORMATS, FP4_E2M1, FP6_E2M3, FP6_E3M2, FP8_E4M3, FP8_E4M3FNUZ,
    FP8_E5M2, FP8_E5M2FNUZ, E8M0Format, FiniteFormat, FloatFormat, FnuzFormat, get_format,
)

ML = {"fp8_e4m3fnuz": ml_dtypes.float8_e4m3fnuz, "fp8_e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
      "fp6_e3m2": ml_dtypes.float6_e3m2fn, "fp6_e2m3": ml_dtypes.float6_e2m3fn,
      "fp4_e2m1": ml_dtypes.float4_e2m1fn, "e8m0": ml_dtypes.float8_e8m0fnu}
TORCH = {"fp8_e4m3fnuz": torch.float8_e4m3fnuz, "fp8_e5m2fnuz": torch.float8_e5m2fnuz,
         "e8m0": torch.float8_e8m0fnu}
NEW = [ALL_FORMATS[k] for k in ML]
SIGNED = [f for f in NEW if f is not E8M0]
IDS = [f.name for f in NEW]


# ---------------------------------------------------------------- reference casts and data
def same(a, b) -> np.ndarray:
    """Elementwise bit-identity of float64 values (NaN equals NaN; -0.0 differs from 0.0)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a.view(np.int64) == b.view(np.int64)) | (np.isnan(a) & np.isnan(b))


def assert_same(ours, ref, x):
    ok = same(ours, ref)
    i = np.flatnonzero(~ok.ravel())[:5]
    assert ok.all(), (f"{(~ok).sum()} mismatches at {np.ravel(x)[i]!r}: ours {np.ravel(ours)[i]!r}, "
                      f"ref {np.ravel(ref)[i]!r}")


def ml_codes(x: np.ndarray, name: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(x, np.float32).astype(ML[name]).view(np.uint8).astype(np.int64)


def ml_values(x: np.ndarray, name: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(x).astype(ML[name]).astype(np.float64)


def torch_codes(x: np.ndarray, name: str) -> np.ndarray:
    return torch.from_numpy(np.asarray(x, np.float32)).to(TORCH[name]).view(torch.uint8).numpy().astype(np.int64)


def all_codes(fmt) -> np.ndarray:
    return np.arange(1 << fmt.bits)


def boundaries(fmt) -> np.ndarray:
    """Every value of fmt, every midpoint between neighbours (both signs), and the float32
    neighbours of each; the overflow boundary and beyond; zeros, infinities, NaN."""
    vals = np.asarray(fmt.decode(all_codes(fmt)), np.float64)
    vals = np.unique(np.abs(vals[np.isfinite(vals)]))
    pts = np.concatenate([vals, (vals[:-1] + vals[1:]) / 2, [fmt.overflow_boundary, 2 * fmt.max,
                                                             fmt.underflow_boundary, fmt.smallest_subnormal / 2]])
    with np.errstate(over="ignore"):  # 2 * max is inf in float32 for E8M0
        pts = pts.astype(np.float32)
    pts = np.concatenate([pts, np.nextafter(pts, np.float32(np.inf)), np.nextafter(pts, np.float32(0))])
    return np.concatenate([pts, -pts, np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 3e38, 1e-45])])


def seeded_float32(n: int, seed: int) -> np.ndarray:
    """Uniform float32 bit patterns (every exponent, NaN payloads, subnormals) and log-uniform
    magnitudes over the small formats' range."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    window = (rng.choice([-1, 1], n) * np.exp2(rng.uniform(-20, 20, n))).astype(np.float32)
    return np.concatenate([raw, window])


@pytest.fixture(scope="module")
def torchao_cast(torchao_modules):
    """torchao's fp6/fp4 cast; skipped without torchao, a failure under CI=true."""
    (custom_fp_utils,) = torchao_modules("torchao.prototype.custom_fp_utils")
    return custom_fp_utils._f32_to_floatx_unpacked


# ---------------------------------------------------------------- registry and constants
def test_formats_stays_the_courses_six_and_all_formats_adds_the_new():
    assert list(FORMATS) == ["fp32", "tf32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"]
    assert list(ALL_FORMATS) == list(FORMATS) + ["fp8_e4m3fnuz", "fp8_e5m2fnuz", "fp6_e3m2", "fp6_e2m3",
                                                 "fp4_e2m1", "e8m0"]
    assert all(ALL_FORMATS[k] is v for k, v in FORMATS.items())


@pytest.mark.parametrize("alias, fmt", [
    ("fp8_e4m3fnuz", FP8_E4M3FNUZ), (torch.float8_e4m3fnuz, FP8_E4M3FNUZ), (torch.float8_e5m2fnuz, FP8_E5M2FNUZ),
    (np.dtype(ml_dtypes.float6_e3m2fn), FP6_E3M2), (np.dtype(ml_dtypes.float6_e2m3fn), FP6_E2M3),
    (np.dtype(ml_dtypes.float4_e2m1fn), FP4_E2M1), (torch.float4_e2m1fn_x2, FP4_E2M1),
    (torch.float8_e8m0fnu, E8M0), (" E8M0 ", E8M0), ("fp8-e5m2fnuz", FP8_E5M2FNUZ),
])
def test_get_format_knows_every_name(alias, fmt):
    assert get_format(alias) is fmt


@pytest.mark.parametrize("fmt", NEW, ids=IDS)
def test_constants_match_ml_dtypes_and_torch(fmt):
    infos = [ml_dtypes.finfo(ML[fmt.name])] + ([torch.finfo(TORCH[fmt.name])] if fmt.name in TORCH else [])
    for fi in infos:
        assert (fmt.max, fmt.smallest_normal, fmt.bits) == (float(fi.max), float(fi.smallest_normal), fi.bits)
    ml = infos[0]
    assert fmt.smallest_subnormal == float(ml.smallest_subnormal)
    assert fmt.eps == float(ml.eps)  # (torch 2.13 says 0.125 for e5m2fnuz; 1.0 -> 1.25 is 0.25)
    finite = np.asarray(fmt.decode(all_codes(fmt)), np.float64)
    finite = finite[np.isfinite(finite)]
    assert fmt.max == finite.max() and fmt.smallest_subnormal == finite[finite > 0].min()


def test_documented_constants():
    assert (FP8_E4M3FNUZ.max, FP8_E5M2FNUZ.max, FP6_E3M2.max, FP6_E2M3.max, FP4_E2M1.max) == (240, 57344, 28, 7.5, 6)
    assert (FP8_E4M3FNUZ.bias, FP8_E5M2FNUZ.bias, FP6_E3M2.bias, FP6_E2M3.bias, FP4_E2M1.bias) == (8, 16, 3, 1, 1)
    assert FP8_E4M3FNUZ.overflow_boundary == 248 and FP8_E4M3FNUZ.nan_bits == 0x80 and FP4_E2M1.nan_bits is None
    assert (E8M0.max, E8M0.smallest_normal, E8M0.nan_bits, E8M0.bits) == (2.0**127, 2.0**-127, 0xFF, 8)
    assert E8M0.overflow_boundary == 1.5 * 2.0**127 and E8M0.underflow_boundary == 2.0**-128
    # the MX rules use emax: the exponent of the element format's largest power of two
    assert [f.emax for f in (FP8_E4M3, FP8_E5M2, FP6_E3M2, FP6_E2M3, FP4_E2M1)] == [8, 15, 4, 2, 2]
    assert list(FP4_E2M1.decode(np.arange(8))) == [0, 0.5, 1, 1.5, 2, 3, 4, 6]


# ---------------------------------------------------------------- decode, every pattern
@pytest.mark.parametrize("fmt", NEW, ids=IDS)
def test_decode_every_pattern_like_ml_dtypes_and_torch(fmt):
    codes = all_codes(fmt)
    ours = fmt.decode(codes)
    with np.errstate(invalid="ignore"):
        ref = codes.astype(np.uint8).view(ML[fmt.name]).astype(np.float64)
    assert_same(ours, ref, codes)
    if fmt.name in TORCH:
        t = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(TORCH[fmt.name]).to(torch.float64).numpy()
        assert_same(ours, t, codes)


@pytest.mark.parametrize("fmt", NEW, ids=IDS)
def test_encode_inverts_decode(fmt):
    codes = all_codes(fmt)
    vals = np.asarray(fmt.decode(codes))
    keep = ~np.isnan(vals)
    if isinstance(fmt, FiniteFormat):
        assert keep.all()
    assert np.array_equal(fmt.encode(vals[keep]), codes[keep])
    assert list(np.flatnonzero(~keep)) == ([] if fmt.nan_bits is None else [fmt.nan_bits])


# ---------------------------------------------------------------- encode / quantize against the libraries
@pytest.mark.parametrize("fmt", NEW, ids=IDS)
def test_encode_and_quantize_match_ml_dtypes_everywhere(fmt):
    """A million float32 values (NaN payloads, both signs, every exponent) and every rounding
    boundary: the patterns ml_dtypes writes, its convention where libraries differ."""
    x = np.concatenate([seeded_float32(500_000, 1), boundaries(fmt)])
    kw = {"nonpositive": "nan"} if fmt is E8M0 else {}
    ref = ml_codes(x, fmt.name)
    ours = np.asarray(fmt.encode(x, **kw))
    bad = ours != ref
    assert not bad.any(), (x[bad][:5], ours[bad][:5], ref[bad][:5])
    assert_same(fmt.quantize(x, **kw), ml_values(x, fmt.name), x)


@pytest.mark.parametrize("fmt", [f for f in NEW if f.name in TORCH], ids=lambda f: f.name)
def test_encode_matches_torchs_cast(fmt):
    """fnuz: torch and ml_dtypes agree; E8M0: the default is torch's (sign dropped, 0 -> 2**-127)."""
    x = np.concatenate([seeded_float32(500_000, 2), boundaries(fmt)])
    ref = torch_codes(x, fmt.name)
    ours = np.asarray(fmt.encode(x))
    bad = ours != ref
    assert not bad.any(), (x[bad][:5], ours[bad][:5], ref[bad][:5])
    t = torch.from_numpy(x).to(TORCH[fmt.name]).to(torch.float64).numpy()
    assert_same(fmt.quantize(x), t, x)


@pytest.mark.parametrize("fmt", NEW, ids=IDS)
def test_float64_input_is_rounded_through_float32_as_the_libraries_do(fmt):
    b = boundaries(fmt).astype(np.float64)
    b = b[np.isfinite(b) & (b > 0)]
    x = np.concatenate([b * (1 + 2.0**-40), b * (1 - 2.0**-40)])  # a hair off each tie
    assert_same(fmt.quantize(x), ml_values(x.astype(np.float32), fmt.name), x)
    assert_same(fmt.quantize(x), ml_values(x, fmt.name), x)  # ml_dtypes casts float64 via float32 too


def test_e8m0_rounds_to_the_nearest_power_of_two_ties_up_and_flags_subnormals_like_torch():
    assert list(E8M0.encode([1.4999999, 1.5, 3.0, 0.75, 0.7499999, 2.0**127, 1.5 * 2.0**127])) == [
        127, 128, 129, 127, 126, 254, 255]
    # a float32 subnormal above 2**-127 with more than the top mantissa bit set rounds to 2**-126
    sub = np.uint32([0x400000, 0x400001, 0x200000, 0x7FFFFF, 1]).view(np.float32)
    assert list(E8M0.encode(sub)) == [0, 1, 0, 1, 0] == list(torch_codes(sub, "e8m0"))
    # every subnormal float32, exhaustively, against torch and ml_dtypes
    every = np.arange(1, 1 << 23, dtype=np.uint32).view(np.float32)
    assert np.array_equal(E8M0.encode(every), torch_codes(every, "e8m0"))
    assert np.array_equal(E8M0.encode(every), ml_codes(every, "e8m0"))


# ---------------------------------------------------------------- each library's convention, stated
def test_fnuz_conventions():
    """torch and ml_dtypes: no -0 (it becomes +0), past the range and ±inf give NaN (0x80)."""
    x = np.float32([-0.0, -1e-30, 248.0, 247.99, -300.0, np.inf, -np.inf, np.nan, -np.nan])
    want = [0, 0, 0x80, 0x7F, 0x80, 0x80, 0x80, 0x80, 0x80]
    assert list(FP8_E4M3FNUZ.encode(x)) == want == list(ml_codes(x, "fp8_e4m3fnuz"))
    assert not np.signbit(FP8_E4M3FNUZ.quantize(-1e-30))
    sat = FP8_E4M3FNUZ.quantize(x, overflow="saturate")
    assert list(sat[2:7]) == [240, 240, -240, 240, -240] and np.isnan(sat[7:]).all()
    assert FP8_E5M2FNUZ.quantize(61440.0) != FP8_E5M2FNUZ.quantize(61439.0) == 57344  # the tie overflows
    for bad in ("inf", "clamp", 1):
        with pytest.raises(ValueError, match="overflow for fp8_e4m3fnuz must be one of None, 'nan', 'saturate'"):
            FP8_E4M3FNUZ.encode(1.0, overflow=bad)


def test_finite_formats_saturate_and_their_nan_is_a_convention():
    """No NaN, no inf: everything past the range saturates (ml_dtypes and torchao agree); ml_dtypes
    writes +NaN as -0 and -NaN as +0."""
    x = np.float32([100.0, -100.0, np.inf, -np.inf, np.nan, -np.nan, -0.0, 6.5, 7.0])
    assert list(FP4_E2M1.encode(x)) == [7, 15, 7, 15, 8, 0, 8, 7, 7] == list(ml_codes(x, "fp4_e2m1"))
    assert list(FP4_E2M1.classify(x)) == ["overflow"] * 4 + ["nan"] * 2 + ["zero", "normal", "overflow"]
    assert same(FP4_E2M1.quantize([np.nan]), [-0.0]).all()
    for fmt in (FP6_E3M2, FP6_E2M3, FP4_E2M1):
        assert FP4_E2M1.quantize(1e9, overflow="saturate") == 6
        with pytest.raises(ValueError, match=f"overflow for {fmt.name} must be one of None, 'saturate'"):
            fmt.quantize(1e9, overflow="nan")
        with pytest.raises(ValueError, match=f"nan for {fmt.name} must be one of None, 'torchao'"):
            fmt.encode(np.nan, nan="zero")


@pytest.mark.parametrize("fmt", [FP6_E3M2, FP6_E2M3, FP4_E2M1], ids=lambda f: f.name)
def test_torchao_nan_convention_is_its_bit_arithmetic(fmt, torchao_cast):
    """nan="torchao" reproduces torchao's f32_to_f*_unpacked on every NaN payload (and on numbers,
    where it agrees with ml_dtypes)."""
    cast = torchao_cast
    rng = np.random.default_rng(5)
    payload = rng.integers(1, 1 << 23, 20_000, dtype=np.uint32)
    nans = ((np.uint32(0xFF) << 23) | payload | (rng.integers(0, 2, 20_000, dtype=np.uint32) << 31)).view(np.float32)
    x = np.concatenate([nans, np.float32([np.nan, -np.nan]), boundaries(fmt)[:-6], seeded_float32(20_000, 6)[20_000:]])
    ref = cast(torch.from_numpy(x), fmt.exponent_bits, fmt.mantissa_bits).numpy().astype(np.int64)
    assert np.array_equal(fmt.encode(x, nan="torchao"), ref)
    assert list(FP4_E2M1.encode(np.float32([np.nan, -np.nan]), nan="torchao")) == [0x3, 0xB]


def test_e8m0_conventions():
    """torch drops the sign and makes 0 pattern 0; ml_dtypes makes 0 and negatives NaN; both give
    NaN past 2**127 and for ±inf; "saturate" gives 254 (as Transformer Engine's float_to_e8m0 for inf)."""
    x = np.float32([0.0, -0.0, -3.0, 3e38, np.inf, -np.inf, np.nan, 1e-45])
    assert list(E8M0.encode(x)) == [0, 0, 129, 255, 255, 255, 255, 0] == list(torch_codes(x, "e8m0"))
    assert list(E8M0.encode(x, nonpositive="nan")) == [255] * 7 + [0] == list(ml_codes(x, "e8m0"))
    assert list(E8M0.encode(x, overflow="saturate")) == [0, 0, 129, 254, 254, 254, 255, 0]
    assert list(E8M0.classify(x)) == ["zero", "zero", "normal", "overflow", "overflow", "overflow", "nan", "underflow"]
    assert E8M0.neighbours(3.0) == (2.0, 8.0) and np.isnan(E8M0.neighbours(2.0**127)[1])
    assert np.isnan(E8M0.neighbours(1e-45)[0]) and E8M0.ulp(4.0) == 4.0
    assert E8M0.fields(0x85) == (0, 0x85, 0)
    with pytest.raises(ValueError, match="nonpositive for e8m0 must be one of None, 'nan'"):
        E8M0.encode(1.0, nonpositive="abs")


# ---------------------------------------------------------------- classify
def ml_categories(x: np.ndarray, fmt) -> np.ndarray:
    """Categories from ml_dtypes' cast: past the range is what rounds beyond max (or is inf)."""
    y = ml_values(x, fmt.name)
    cat = np.full(x.shape, "normal", dtype=object)
    with np.errstate(invalid="ignore"):
        cat[np.abs(y) < fmt.smallest_normal] = "subnormal"
        cat[(y == 0) & (x != 0)] = "underflow"
        cat[x == 0] = "zero"
        over = np.isinf(x) | (np.abs(x.astype(np.float64)) >= fmt.overflow_boundary)
        if fmt.specials == "finite":  # the boundary tie rounds up, past max (and saturates)
            over = np.isinf(x) | (np.abs(x) >= fmt.overflow_boundary)
        cat[over] = "overflow"
    cat[np.isnan(x)] = "nan"
    return cat.astype(str)


@pytest.mark.parametrize("fmt", SIGNED, ids=[f.name for f in SIGNED])
def test_classify_matches_categories_from_ml_dtypes(fmt):
    x = np.concatenate([seeded_float32(100_000, 7), boundaries(fmt)])
    ours = fmt.classify(x)
    ref = ml_categories(x, fmt)
    bad = ours != ref
    assert not bad.any(), (x[bad][:5], ours[bad][:5], ref[bad][:5])
    assert set(np.unique(ours)) == set(CATEGORIES)
    if isinstance(fmt, FnuzFormat):  # overflow is exactly where the cast gives NaN for a number
        num = ~np.isnan(x)
        assert np.array_equal(ours[num] == "overflow", np.isnan(ml_values(x[num], fmt.name)))


# ---------------------------------------------------------------- plausible wrong variants are caught
def test_fnuz_with_the_fn_bias_is_caught():
    """E4M3 fnuz has bias 8 (max 240); with E4M3's bias 7 the decode differs from ml_dtypes."""
    wrong = FnuzFormat("fp8_e4m3fnuz", 4, 3, 7)
    with np.errstate(invalid="ignore"):
        ref = np.arange(256).astype(np.uint8).view(ml_dtypes.float8_e4m3fnuz).astype(np.float64)
    assert not same(wrong.decode(np.arange(256)), ref).all()
    assert wrong.max == 480 != float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fnuz).max)


def test_fp4_with_ieee_specials_is_caught():
    """Reading E2M1's top exponent as inf/NaN (an IEEE layout) loses 4 and 6: the decode test fails."""
    wrong = FloatFormat("fp4_e2m1", 2, 1, 1, specials="ieee")
    ref = np.arange(16).astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    assert wrong.max == 3 and not same(wrong.decode(np.arange(16)), ref).all()


class KeepsNegativeZero(FnuzFormat):
    def encode(self, x, overflow=None):
        bits = np.asarray(super().encode(x, overflow))
        q = np.asarray(self._quantize_with_codes(x)[0])
        return np.where((q == 0) & np.signbit(q), 0x80, bits)  # -0 written as the sign bit: NaN


def test_fnuz_keeping_negative_zero_is_caught():
    wrong = KeepsNegativeZero("fp8_e4m3fnuz", 4, 3, 8)
    x = boundaries(FP8_E4M3FNUZ)
    assert not np.array_equal(wrong.encode(x), ml_codes(x, "fp8_e4m3fnuz"))


class FloorE8M0(E8M0Format):
    def _encode_with_codes(self, x, overflow=None, nonpositive=None):
        bits, codes = super()._encode_with_codes(x, overflow, nonpositive)
        x32 = np.asarray(x, np.float32)
        return np.where(bits < 255, (x32.view(np.uint32) >> 23) & 0xFF, bits), codes


def test_e8m0_by_floor_is_caught():
    """Taking the float32 exponent (a floor, as MX scale rules do) is not the E8M0 cast."""
    wrong = FloorE8M0("e8m0", 8, 0, 127)
    x = np.float32([1.5, 3.0, 0.75, 1.25, 100.0])
    assert not np.array_equal(wrong.encode(x), torch_codes(x, "e8m0"))
    assert np.array_equal(E8M0.encode(x), torch_codes(x, "e8m0"))


def test_nan_as_plus_zero_is_caught():
    """Writing every NaN as +0 (a tempting simplification) is neither ml_dtypes' nor torchao's."""
    x = np.float32([np.nan, -np.nan])
    assert list(ml_codes(x, "fp4_e2m1")) == list(FP4_E2M1.encode(x)) == [8, 0]
    assert list(FP4_E2M1.encode(x)) != [0, 0]


# ---------------------------------------------------------------- construction, neighbours, errors
@pytest.mark.parametrize("cls, args, says", [
    (FnuzFormat, ("x", 4, 3, 8, "fn"), "specials of a FnuzFormat must be 'fnuz'"),
    (FiniteFormat, ("x", 2, 0, 1), "mantissa_bits must be 1 to 23"),
    (FiniteFormat, ("x", 9, 1, 1), "exponent_bits must be 1 to 8"),
    (FiniteFormat, ("x", 2, 1, 200), "bias must be -124 to 149"),
    (E8M0Format, ("x", 8, 1, 127), "8 exponent bits, 0 mantissa bits and bias 127"),
    (FloatFormat, ("x", 4, 3, 8, "fnuz"), "FnuzFormat"),
])
def test_bad_layouts_are_one_line_errors(cls, args, says):
    with pytest.raises(ValueError, match=says) as info:
        cls(*args)
    assert "\n" not in str(info.value)


def test_new_formats_are_immutable_values():
    again = FnuzFormat("fp8_e4m3fnuz", 4, 3, 8, torch_dtype="float8_e4m3fnuz", description=FP8_E4M3FNUZ.description)
    assert again == FP8_E4M3FNUZ and hash(again) == hash(FP8_E4M3FNUZ)
    assert len({FP4_E2M1, FP6_E2M3, FiniteFormat("fp4_e2m1", 2, 1, 1, description=FP4_E2M1.description)}) == 2
    with pytest.raises(AttributeError):
        FP4_E2M1.bias = 2
    assert repr(FP4_E2M1).startswith("FiniteFormat(fp4_e2m1") and "E8M0Format(e8m0" in repr(E8M0)


@pytest.mark.parametrize("fmt", SIGNED, ids=[f.name for f in SIGNED])
def test_neighbours_are_the_adjacent_patterns(fmt):
    vals = np.asarray(fmt.decode(all_codes(fmt)), np.float64)
    grid = np.unique(vals[np.isfinite(vals)])
    for i in range(1, grid.size - 1):
        lo, hi = fmt.neighbours(grid[i])
        assert (lo, hi) == (grid[i - 1], grid[i + 1]) or (grid[i] == 0 and (lo, hi) == (-grid[i + 1], grid[i + 1]))
    assert np.isnan(fmt.neighbours(fmt.max)[1]) and fmt.ulp(fmt.max) == fmt.max - grid[-2]


@settings(max_examples=150, deadline=None)
@given(x=st.one_of(st.floats(width=32), st.lists(st.floats(width=32), max_size=5), st.integers(-10**6, 10**6),
                   st.none(), st.text(max_size=3), st.complex_numbers(), st.lists(st.none(), max_size=2)),
       fmt=st.sampled_from(NEW),
       method=st.sampled_from(["encode", "quantize", "classify", "classify_codes", "decode", "fields", "neighbours",
                               "ulp"]))
def test_every_method_answers_or_refuses_clearly(x, fmt, method):
    try:
        got = getattr(fmt, method)(x)
    except (TypeError, ValueError) as exc:
        assert "\n" not in str(exc) and str(exc).strip()
        return
    if method in ("encode", "quantize") and np.size(got):
        ref = ml_codes(np.asarray(x, np.float64).astype(np.float32), fmt.name)
        kw = {"nonpositive": "nan"} if fmt is E8M0 else {}
        assert np.array_equal(np.ravel(fmt.encode(x, **kw)), np.ravel(ref))
