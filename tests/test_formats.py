"""ampviz.formats against torch's casts and ml_dtypes, exhaustively where the space is small."""

import ml_dtypes
import numpy as np
import pytest
import torch

from ampviz.formats import (
    BF16, CATEGORIES, FORMATS, FP8_E4M3, FP8_E5M2, FP16, FP32, TF32, FloatFormat, get_format,
)

TORCH_DTYPES = {
    "fp16": torch.float16, "bf16": torch.bfloat16,
    "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2,
}
ML_DTYPES = {
    "fp16": np.float16, "bf16": ml_dtypes.bfloat16,
    "fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2,
}
SMALL = [FORMATS[k] for k in TORCH_DTYPES]
SMALL_IDS = [f.name for f in SMALL]
INT_VIEW = {1: torch.uint8, 2: torch.int16}


# ---------------------------------------------------------------- reference helpers
def torch_cast(x: np.ndarray, name: str) -> np.ndarray:
    """What torch's cast gives, as float64."""
    return torch.from_numpy(x).to(TORCH_DTYPES[name]).to(torch.float64).numpy()


def torch_bits(x: np.ndarray, name: str) -> np.ndarray:
    dt = TORCH_DTYPES[name]
    t = torch.from_numpy(x).to(dt)
    bits = t.view(INT_VIEW[t.element_size()]).to(torch.int64).numpy()
    return bits & ((1 << (8 * t.element_size())) - 1)


def all_patterns_as_torch(name: str) -> np.ndarray:
    dt = TORCH_DTYPES[name]
    n = torch.finfo(dt).bits
    ints = torch.arange(1 << n, dtype=torch.int64)
    if n == 8:
        ints = ints.to(torch.uint8)
    else:
        ints = ints.to(torch.int32).to(torch.int16)  # wraps 32768.. to negatives: same bits
    return ints.view(dt).to(torch.float64).numpy()


def same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise bit-identity of float64 values (NaN equals NaN; -0.0 differs from 0.0)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a.view(np.int64) == b.view(np.int64)) | (np.isnan(a) & np.isnan(b))


def assert_same(ours, ref, x=None):
    ok = same(ours, ref)
    if not ok.all():
        i = np.flatnonzero(~ok)[:5]
        where = f" at inputs {np.asarray(x).ravel()[i]!r}" if x is not None else ""
        raise AssertionError(f"{(~ok).sum()} mismatches{where}: ours {np.asarray(ours).ravel()[i]!r}, "
                             f"reference {np.asarray(ref).ravel()[i]!r}")


def rounding_boundaries(fmt: FloatFormat) -> np.ndarray:
    """Every midpoint between neighbouring values of fmt, and its float32 neighbours.

    Includes 65520, 2**-25 (fp16), 464 (E4M3), 61440 (E5M2) and their mirror images.
    """
    vals = np.asarray(fmt.decode(np.arange(1 << fmt.bits)))
    vals = np.unique(vals[np.isfinite(vals)])
    mids = (vals[:-1] + vals[1:]) / 2
    top = fmt.overflow_boundary
    with np.errstate(over="ignore"):  # 2 * top is inf in float32 for the wide formats
        pts = np.concatenate([mids, [top, 2 * top, fmt.underflow_boundary]]).astype(np.float32)
    pts = np.concatenate([pts, np.nextafter(pts, np.float32(np.inf)), np.nextafter(pts, np.float32(-np.inf))])
    return np.concatenate([pts, vals.astype(np.float32)])


def seeded_float32(n: int, seed: int) -> np.ndarray:
    """Every kind of float32: uniform random bit patterns (all exponents, NaN, inf, subnormals)
    plus log-uniform magnitudes over the small formats' windows."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    window = (rng.choice([-1, 1], n) * np.exp2(rng.uniform(-30, 20, n))).astype(np.float32)
    return np.concatenate([raw, window])


# ---------------------------------------------------------------- constants
@pytest.mark.parametrize("fmt", SMALL, ids=SMALL_IDS)
def test_constants_match_torch_and_ml_dtypes(fmt):
    for fi in (torch.finfo(TORCH_DTYPES[fmt.name]), ml_dtypes.finfo(ML_DTYPES[fmt.name])):
        assert fmt.max == float(fi.max)
        assert fmt.smallest_normal == float(fi.smallest_normal)
        assert fmt.eps == float(fi.eps)
        assert fmt.bits == fi.bits
    mf = ml_dtypes.finfo(ML_DTYPES[fmt.name])
    assert fmt.smallest_subnormal == float(mf.smallest_subnormal)


def test_fp32_constants_match_numpy():
    fi = np.finfo(np.float32)
    assert (FP32.max, FP32.smallest_normal, FP32.smallest_subnormal, FP32.eps) == (
        float(fi.max), float(fi.smallest_normal), float(fi.smallest_subnormal), float(fi.eps))


def test_documented_constants():
    assert FP16.max == 65504 and FP16.smallest_subnormal == 2.0**-24 and FP16.smallest_normal == 2.0**-14
    assert FP8_E4M3.max == 448 and FP8_E5M2.max == 57344
    assert BF16.smallest_subnormal == 2.0**-133 and TF32.eps == 2.0**-10
    assert FP16.overflow_boundary == 65520 and FP8_E4M3.overflow_boundary == 464
    assert FP8_E5M2.overflow_boundary == 61440 and FP16.underflow_boundary == 2.0**-25
    assert set(FORMATS) == {"fp32", "tf32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"}


# ---------------------------------------------------------------- decode / encode, exhaustive
@pytest.mark.parametrize("fmt", SMALL, ids=SMALL_IDS)
def test_decode_every_bit_pattern_like_torch_and_ml_dtypes(fmt):
    patterns = np.arange(1 << fmt.bits)
    ours = fmt.decode(patterns)
    assert_same(ours, all_patterns_as_torch(fmt.name), patterns)
    store = np.uint8 if fmt.bits == 8 else np.uint16
    with np.errstate(invalid="ignore"):  # ml_dtypes warns when it casts its NaNs
        ml = patterns.astype(store).view(ML_DTYPES[fmt.name]).astype(np.float64)
    assert_same(ours, ml, patterns)


@pytest.mark.parametrize("fmt", SMALL + [TF32], ids=SMALL_IDS + ["tf32"])
def test_encode_inverts_decode_on_every_pattern(fmt):
    patterns = np.arange(1 << fmt.bits)
    values = fmt.decode(patterns)
    keep = ~np.isnan(values)
    assert np.array_equal(fmt.encode(values[keep]), patterns[keep])
    nan_bits = fmt.encode(values[~keep])
    assert np.isnan(fmt.decode(nan_bits)).all()


@pytest.mark.parametrize("fmt", SMALL, ids=SMALL_IDS)
def test_encode_matches_torch_bits(fmt):
    x = seeded_float32(200_000, seed=1)
    x = x[~np.isnan(x)]  # NaN payloads are not part of the format's meaning
    assert np.array_equal(fmt.encode(x), torch_bits(x, fmt.name))


def test_fp32_decode_encode_via_numpy_view():
    bits = np.random.default_rng(2).integers(0, 1 << 32, 100_000, dtype=np.int64)
    with np.errstate(invalid="ignore"):  # signalling NaN patterns
        ref = bits.astype(np.uint32).view(np.float32).astype(np.float64)
    assert_same(FP32.decode(bits), ref)
    keep = ~np.isnan(ref)
    assert np.array_equal(FP32.encode(ref[keep]), bits[keep])


def test_scalar_in_scalar_out():
    assert FP16.decode(0x3C00) == 1.0 and isinstance(FP16.decode(0x3C00), float)
    assert FP16.encode(1.0) == 0x3C00 and isinstance(FP16.encode(1.0), int)
    assert FP16.quantize(0.1) == 0.0999755859375
    assert FP16.classify(1e-9) == "underflow"
    assert FP16.fields(0xBC00) == (1, 15, 0)


@pytest.mark.parametrize("bad", [-1, 65536, 1 << 40, 1.5])
def test_out_of_range_bit_pattern_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="fp16 bit patterns"):
        FP16.decode(bad)


def test_unknown_format_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown format 'fp12'"):
        get_format("fp12")
    assert get_format("float16") is FP16 and get_format(BF16) is BF16


# ---------------------------------------------------------------- quantize: bit-exact vs torch
@pytest.mark.parametrize("fmt", SMALL, ids=SMALL_IDS)
def test_quantize_matches_torch_on_millions_of_values(fmt):
    x = seeded_float32(1_000_000, seed=3)
    assert_same(fmt.quantize(x), torch_cast(x, fmt.name), x)


@pytest.mark.parametrize("fmt", SMALL, ids=SMALL_IDS)
def test_quantize_matches_torch_at_every_rounding_boundary(fmt):
    x = rounding_boundaries(fmt)
    x = np.concatenate([x, -x, np.array([0.0, -0.0, np.inf, -np.inf, np.nan], np.float32)])
    assert_same(fmt.quantize(x), torch_cast(x, fmt.name), x)


@pytest.mark.parametrize("fmt", SMALL, ids=SMALL_IDS)
def test_float64_input_is_cast_through_float32_like_torch(fmt):
    rng = np.random.default_rng(4)
    edges = np.float64(rounding_boundaries(fmt))
    x = np.concatenate([edges * (1 + rng.uniform(-1e-7, 1e-7, edges.size)), [65519.99999, 464.00001]])
    ref = torch.from_numpy(x).to(TORCH_DTYPES[fmt.name]).to(torch.float64).numpy()
    assert_same(fmt.quantize(x), ref, x)


def test_named_edges():
    assert list(FP16.quantize([65519.0, 65520.0, 2.0**-25, 2.0**-25 * (1 + 2.0**-20)])) == [65504, np.inf, 0, 2.0**-24]
    assert FP16.quantize(1 + 2.0**-11) == 1.0 and FP16.quantize(1 + 2.0**-10) == 1 + 2.0**-10
    assert list(FP8_E4M3.quantize([500.0, 1e6, np.inf, 464.0])) == [448.0] * 4
    assert list(FP8_E5M2.quantize([60000.0, 61440.0])) == [57344.0, np.inf]
    assert np.signbit(FP16.quantize(-1e-10)) and FP16.quantize(-1e-10) == 0


def test_fp32_quantize_is_the_float32_cast():
    x = np.random.default_rng(5).standard_normal(100_000) * np.exp2(np.random.default_rng(6).uniform(-160, 140, 100_000))
    with np.errstate(over="ignore"):
        assert_same(FP32.quantize(x), x.astype(np.float32).astype(np.float64))


def tf32_reference(x32: np.ndarray) -> np.ndarray:
    """TF32 by bit arithmetic: round the fp32 pattern's low 13 bits away, ties to even."""
    u = x32.view(np.uint32).astype(np.uint64)
    lsb = (u >> 13) & 1
    r = ((u + 0xFFF + lsb) & ~np.uint64(0x1FFF)).astype(np.uint32)
    with np.errstate(invalid="ignore"):  # NaN patterns (handled on the next line)
        out = r.view(np.float32).astype(np.float64)
    return np.where(np.isnan(x32), np.nan, out)


def test_tf32_matches_bit_level_reference():
    x = seeded_float32(1_000_000, seed=7)
    x = np.concatenate([x, np.float32([1 + 2**-11, 1 + 3 * 2**-11, 3.4028235e38, 2**-149, 2**-137])])
    assert_same(TF32.quantize(x), tf32_reference(x), x)


# ---------------------------------------------------------------- classify
def torch_categories(x: np.ndarray, name: str) -> np.ndarray:
    """Categories derived from torch's cast (and ml_dtypes' non-saturating cast for E4M3)."""
    y = torch_cast(x, name)
    tiny = float(torch.finfo(TORCH_DTYPES[name]).smallest_normal)
    cat = np.full(x.shape, "normal", dtype=object)
    cat[np.abs(y) < tiny] = "subnormal"
    cat[(y == 0) & (x != 0)] = "underflow"
    cat[x == 0] = "zero"
    over = np.isinf(y)
    if name == "fp8_e4m3":  # torch saturates; ml_dtypes gives NaN where the value does not fit
        with np.errstate(over="ignore", invalid="ignore"):
            over = np.isnan(x.astype(ml_dtypes.float8_e4m3fn).astype(np.float64)) & ~np.isnan(x)
    cat[over] = "overflow"
    cat[np.isnan(x)] = "nan"
    return cat.astype(str)


@pytest.mark.parametrize("fmt", SMALL, ids=SMALL_IDS)
def test_classify_matches_categories_from_torch(fmt):
    x = np.concatenate([seeded_float32(300_000, seed=8), rounding_boundaries(fmt)])
    ours = fmt.classify(x)
    ref = torch_categories(x, fmt.name)
    bad = ours != ref
    assert not bad.any(), (x[bad][:5], ours[bad][:5], ref[bad][:5])
    assert set(np.unique(ours)) == set(CATEGORIES)


# ---------------------------------------------------------------- plausible wrong variants fail
class TruncatingFormat(FloatFormat):
    """A common bug: truncating the mantissa instead of rounding to nearest even."""

    def _round_magnitude(self, a):
        m = self.mantissa_bits
        _, e = np.frexp(a)
        e = np.maximum(e - 1, self.emin) - m
        return np.ldexp(np.floor(np.ldexp(a, -e)), e)


def test_truncation_variant_is_caught():
    for good in (FP16, BF16):
        wrong = TruncatingFormat(good.name, good.exponent_bits, good.mantissa_bits, good.bias)
        x = rounding_boundaries(good)
        assert not same(wrong.quantize(x), torch_cast(x, good.name)).all()
        with pytest.raises(AssertionError, match="mismatches"):
            assert_same(wrong.quantize(x), torch_cast(x, good.name), x)


def test_e4m3_with_ieee_specials_is_caught():
    """Decoding exponent 1111 as inf/NaN gives max 240: the exhaustive decode test rejects it."""
    wrong = FloatFormat("fp8_e4m3", 4, 3, 7, specials="ieee")
    assert wrong.max == 240 != float(torch.finfo(torch.float8_e4m3fn).max)
    patterns = np.arange(256)
    with pytest.raises(AssertionError, match="mismatches"):
        assert_same(wrong.decode(patterns), all_patterns_as_torch("fp8_e4m3"), patterns)


# ---------------------------------------------------------------- neighbours, ulp
def test_neighbours_and_ulp():
    assert FP16.neighbours(1.0) == (1 - 2.0**-11, 1 + 2.0**-10)
    assert FP16.ulp(1.0) == 2.0**-10 and FP16.ulp(3e-8) == 2.0**-24 and FP16.ulp(60000) == 32
    assert FP16.neighbours(65504) == (65472, np.inf)
    lo, hi = FP8_E4M3.neighbours(448)
    assert lo == 416 and np.isnan(hi)
    assert FP16.neighbours(0.0) == (-(2.0**-24), 2.0**-24)
    assert FP16.neighbours(-1.0) == (-(1 + 2.0**-10), -(1 - 2.0**-11))


def test_tiny_float64_is_underflow_not_zero():
    """float64 input goes through float32 (as in torch), but a nonzero value is never 'zero'."""
    assert list(FP16.classify(np.array([1e-50, 0.0]))) == ["underflow", "zero"]
    assert FP32.classify(1e-50) == "underflow"


def test_ulp_at_zero_is_the_smallest_subnormal():
    for fmt in FORMATS.values():
        assert fmt.ulp(0.0) == fmt.smallest_subnormal == fmt.ulp(fmt.smallest_subnormal)
