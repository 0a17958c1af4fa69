"""ampviz.formats against torch's casts and ml_dtypes, exhaustively where the space is small."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch

from ampviz.formats import (
    ALL_FORMATS, BF16, CATEGORIES, FORMATS, FP8_E4M3, FP8_E5M2, FP16, FP32, TF32, FloatFormat, get_format,
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


# ---------------------------------------------------------------- torch tensors as input
def tensor_data(seed: int) -> torch.Tensor:
    """float32 values of every kind plus every fp16 / E4M3 / E5M2 rounding boundary, as a tensor."""
    x = np.concatenate([seeded_float32(20_000, seed)] + [rounding_boundaries(f) for f in SMALL])
    return torch.from_numpy(x)


TENSOR_DTYPES = [torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2, torch.float32,
                 torch.float64, torch.int32, torch.int64, torch.uint8, torch.bool]


@pytest.mark.parametrize("dtype", TENSOR_DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_tensors_of_every_real_dtype_quantize_like_torchs_cast(dtype):
    """quantize, classify, encode of a tensor equal torch's own cast of that tensor (and what numpy
    input of the same values gives), whatever the tensor's dtype and grad state."""
    x = tensor_data(11)
    if dtype.is_floating_point:
        t = x.to(dtype)
        if dtype.itemsize > 1:  # torch has no arithmetic for fp8
            t = t.requires_grad_() * 1  # needs grad and has a grad_fn: numpy() refuses it
    elif dtype == torch.bool:
        t = x > 0
    else:
        big = torch.from_numpy(np.random.default_rng(12).integers(-2**40, 2**40, 20_000))
        t = torch.cat([big, torch.arange(-70_000, 70_000, 7)]).to(dtype)
    for fmt in SMALL:
        ref = t.detach().to(TORCH_DTYPES[fmt.name]).to(torch.float64).numpy()
        assert_same(fmt.quantize(t), ref)
        plain = t.detach().float().numpy() if dtype.is_floating_point and dtype != torch.float64 else t.detach().numpy()
        assert np.array_equal(fmt.classify(t), fmt.classify(plain))
        assert np.array_equal(fmt.classify_codes(t), fmt.classify_codes(plain))
        finite = ~np.isnan(ref)
        assert np.array_equal(fmt.encode(t)[finite], fmt.encode(ref)[finite])


ML_FLOATS = ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz",
             "float8_e3m4", "float8_e4m3", "float8_e8m0fnu", "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn"]


def ml_dtypes_array(name: str, seed: int = 14) -> np.ndarray:
    """Values of every kind (NaN, inf, -0 where the type holds them) in ml_dtypes' type ``name``."""
    dtype = getattr(ml_dtypes, name)
    if name.startswith(("int", "uint")):
        info = ml_dtypes.iinfo(dtype)
        return np.arange(int(info.min), int(info.max) + 1).astype(dtype)
    with np.errstate(all="ignore"):  # overflow and NaN, as the type's own cast makes them
        return seeded_float32(2000, seed).astype(dtype)


@pytest.mark.parametrize("name", ML_FLOATS + ["int4", "uint4", "int2", "uint2"])
def test_ml_dtypes_arrays_are_read_as_their_values(name):
    """An ml_dtypes array (as ampviz.ranks takes one) quantizes, classifies and encodes as the
    same values given as float32, which hold each of them exactly."""
    a = ml_dtypes_array(name)
    plain = a.astype(np.float32)
    assert_same(plain.astype(np.float64), a.astype(np.float64))  # exact
    for fmt in ALL_FORMATS.values():
        assert_same(fmt.quantize(a), fmt.quantize(plain))
        assert np.array_equal(fmt.classify(a), fmt.classify(plain))
        assert np.array_equal(fmt.encode(a), fmt.encode(plain))
    i = np.flatnonzero(np.isfinite(plain))[-1]
    assert FP16.quantize(a[i]) == FP16.quantize(float(plain[i]))  # one value of the type


def test_bf16_tensors_are_read_exactly_not_through_fp16():
    """The data above would catch a conversion through float16 (bf16's range is float32's)."""
    t = tensor_data(13).to(torch.bfloat16)
    right = BF16.quantize(t)
    wrong = BF16.quantize(t.to(torch.float16).numpy())
    assert not same(right, wrong).all()
    assert_same(right, t.to(torch.float64).numpy())


def test_scalar_tensors_give_scalars_and_neighbours_ulp_accept_them():
    for dtype in (torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float32):
        t = torch.tensor(0.3, requires_grad=dtype == torch.float32).to(dtype)
        v = float(t.detach())
        for fmt in SMALL:
            assert fmt.quantize(t) == fmt.quantize(v) and isinstance(fmt.quantize(t), float)
            assert fmt.classify(t) == fmt.classify(v) and fmt.encode(t) == fmt.encode(v)
            assert fmt.neighbours(t) == fmt.neighbours(v) and fmt.ulp(t) == fmt.ulp(v)
            assert fmt.neighbours(t.reshape(1)) == fmt.neighbours(v)  # one value, any shape


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_quantize_like_torch():
    t = tensor_data(14).cuda().to(torch.bfloat16).requires_grad_()
    for fmt in SMALL:
        assert_same(fmt.quantize(t), t.detach().to(TORCH_DTYPES[fmt.name]).double().cpu().numpy())


def test_bools_are_zero_and_one_as_in_numpy_and_torch():
    b = np.array([True, False, True])
    assert list(FP16.quantize(b)) == [1.0, 0.0, 1.0] == list(FP16.quantize(torch.from_numpy(b)))
    assert list(FP16.classify(b)) == ["normal", "zero", "normal"]
    assert FP16.quantize(True) == 1.0


def test_python_ints_beyond_64_bits():
    """Ints numpy holds as objects go through float64 like float64 input; beyond float64, inf."""
    assert FP32.quantize(2**70) == 2.0**70 and FP16.quantize(2**70) == np.inf
    assert list(FP32.quantize([2**2000, -(2**2000), 3])) == [np.inf, -np.inf, 3.0]
    assert list(FP8_E4M3.quantize([2**2000, -(2**2000)])) == [448.0, -448.0]


NOT_NUMBERS = [
    (None, "got None"),
    ("1.5", "not text"),
    (b"1", "not text"),
    (1 + 2j, "complex"),
    (np.array([1.0 + 0j]), "complex"),
    (torch.ones(2, dtype=torch.complex64), "complex"),
    (np.datetime64("2020-01-01"), "datetimes"),
    (np.array([3], dtype="timedelta64[D]"), "time spans"),
    (np.array([b"ab"]), "not bytes"),
    ([1.0, None], "got None"),
    ([1.0, "2"], "not strings"),
    ({1: 2}, "got {1: 2}"),
    (object(), "must be"),
    ([[1.0], [1.0, 2.0]], "must be numbers or an array"),
    (torch.ones(2, device="meta"), "cannot read the values"),
]


@pytest.mark.parametrize("bad, says", NOT_NUMBERS, ids=lambda v: type(v).__name__)
@pytest.mark.parametrize("method", ["quantize", "classify", "classify_codes", "encode", "neighbours", "ulp"])
def test_what_is_not_real_numbers_is_one_clear_type_error(bad, says, method):
    with pytest.raises(TypeError) as info:
        getattr(FP16, method)(bad)
    message = str(info.value)
    assert says in message and "\n" not in message and ("pass" in message or "must be" in message)


@pytest.mark.parametrize("method", ["neighbours", "ulp"])
def test_neighbours_and_ulp_take_one_number(method):
    with pytest.raises(TypeError, match=f"{method} takes one number, got 3 values"):
        getattr(FP16, method)([1.0, 2.0, 3.0])


@pytest.mark.parametrize("bad, error, says", [
    (2**70, ValueError, "0 to 65535"),
    (1e300, ValueError, r"got 1e\+300"),
    (np.nan, ValueError, "got nan"),
    (np.array([True]), TypeError, "not booleans"),
    (None, TypeError, "whole numbers from 0 to 65535"),
    ("0x3C00", TypeError, "whole numbers from 0 to 65535"),
    (np.arange(70_000.0) + 0.5, ValueError, "got 0.5"),
])
def test_bad_bit_patterns_are_one_line_errors(bad, error, says):
    with pytest.raises(error, match=says) as info:
        FP16.decode(bad)
    assert "\n" not in str(info.value)


def test_bit_patterns_from_torch_tensors():
    patterns = torch.arange(1 << 16, dtype=torch.int32)
    assert_same(FP16.decode(patterns), all_patterns_as_torch("fp16"))
    assert FP16.decode(torch.tensor(0x3C00)) == 1.0


# ---------------------------------------------------------------- validating FloatFormat's fields
@pytest.mark.parametrize("args, error, says", [
    (("x", 4, 0, 7), ValueError, "mantissa_bits must be 1 to 23"),
    (("x", 4, 0, 7, "fn"), ValueError, "mantissa_bits must be 1 to 23"),
    (("x", 5, 24, 15), ValueError, "mantissa_bits must be 1 to 23"),
    (("x", 1, 3, 0), ValueError, "exponent_bits must be 2 to 8"),
    (("x", 0, 3, 0, "fn"), ValueError, "exponent_bits must be 1 to 8"),
    (("x", 11, 52, 1023), ValueError, "exponent_bits must be 2 to 8"),
    (("x", 5, 10, 200), ValueError, "bias must be -97 to 140"),
    (("x", 8, 7, 100), ValueError, "bias must be 127 to 143"),
    (("x", 8, 23, 127, "fn"), ValueError, "does not fit in float32"),
    (("x", 5, 10, 15, "fnuz"), ValueError, "specials must be 'ieee' or 'fn'"),
    (("x", 5, 10, 15, None), ValueError, "specials must be 'ieee' or 'fn'"),
    (("x", 5, 10, 15.0), TypeError, "bias must be an int"),
    (("x", 5.0, 10, 15), TypeError, "exponent_bits must be an int"),
    (("x", True, 10, 15), TypeError, "exponent_bits must be an int"),
    (("x", 5, "10", 15), TypeError, "mantissa_bits must be an int"),
    ((None, 5, 10, 15), TypeError, "name must be a string"),
    (("", 5, 10, 15), ValueError, "name must not be empty"),
    (("x", 5, 10, 15, "ieee", torch.float16), TypeError, "torch_dtype must be a dtype name"),
    (("x", 5, 10, 15, "ieee", None, 3), TypeError, "description must be a string"),
])
def test_fields_are_checked_when_a_format_is_made(args, error, says):
    with pytest.raises(error, match=says) as info:
        FloatFormat(*args)
    assert "\n" not in str(info.value)


def test_numpy_ints_are_accepted_as_fields():
    f = FloatFormat("half", np.int64(5), np.int8(10), np.int32(15))
    assert f == FloatFormat("half", 5, 10, 15) and type(f.bias) is int and f.max == 65504


ML_IEEE = [(ml_dtypes.float8_e3m4, FloatFormat("e3m4", 3, 4, 3)),
           (ml_dtypes.float8_e4m3, FloatFormat("e4m3_ieee", 4, 3, 7))]


@pytest.mark.parametrize("ml, fmt", ML_IEEE, ids=["e3m4", "e4m3"])
def test_other_ieee_formats_match_ml_dtypes(ml, fmt):
    """Formats beyond the built-in ones, made from their fields, decode and round like ml_dtypes."""
    patterns = np.arange(256)
    with np.errstate(invalid="ignore"):
        assert_same(fmt.decode(patterns), patterns.astype(np.uint8).view(ml).astype(np.float64), patterns)
    x = np.concatenate([seeded_float32(100_000, 15), rounding_boundaries(fmt)])
    with np.errstate(over="ignore", invalid="ignore"):
        ref = x.astype(ml).astype(np.float64)
    assert_same(fmt.quantize(x), ref, x)
    fi = ml_dtypes.finfo(ml)
    assert (fmt.max, fmt.smallest_normal, fmt.smallest_subnormal) == (
        float(fi.max), float(fi.smallest_normal), float(fi.smallest_subnormal))


# ---------------------------------------------------------------- get_format
def test_get_format_takes_torch_and_numpy_dtypes():
    assert get_format(torch.bfloat16) is BF16 and get_format(torch.float16) is FP16
    assert get_format(torch.float8_e4m3fn) is FP8_E4M3 and get_format(torch.float8_e5m2) is FP8_E5M2
    assert get_format(np.dtype(np.float16)) is FP16 and get_format(" BF16 ") is BF16
    with pytest.raises(ValueError, match="unknown format torch.int8"):
        get_format(torch.int8)


@pytest.mark.parametrize("bad", [None, 16, 1.5, ["fp16"], object()])
def test_get_format_refuses_what_is_not_a_format(bad):
    with pytest.raises(TypeError, match="fmt must be a FloatFormat or a format name"):
        get_format(bad)


def test_reading_tensors_needs_no_torch_import():
    """Tensors are recognised by their type, so the numpy core never imports torch itself."""
    import subprocess
    import sys

    code = ("import sys; import ampviz.formats as f, ampviz.formats.census as c, ampviz.explain; "
            "f.FP16.quantize([1.0, 2.0]); c.census([1.0], 'fp16'); f.get_format('bf16'); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------- what other libraries' casts do past the max
@pytest.mark.parametrize("fmt", [FP8_E4M3, FP8_E5M2], ids=["fp8_e4m3", "fp8_e5m2"])
def test_overflow_rules_match_each_librarys_cast(fmt):
    """None is torch 2.13's CPU cast (e4m3 saturates, e5m2 gives inf); ml_dtypes gives NaN past
    E4M3's max and inf past E5M2's: "nan" and "inf"; "saturate" is ±max for everything past it."""
    x = rounding_boundaries(fmt)
    x = np.concatenate([x, -x, np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 1e6, -1e6, 3e38])])
    assert_same(fmt.quantize(x, overflow=None), torch_cast(x, fmt.name), x)
    ml = x.astype(ML_DTYPES[fmt.name]).astype(np.float64)
    rule = "nan" if fmt is FP8_E4M3 else "inf"
    ours = fmt.quantize(x, overflow=rule)
    assert np.array_equal(np.isnan(ours), np.isnan(ml)) and np.array_equal(ours[~np.isnan(ml)], ml[~np.isnan(ml)])
    sat = fmt.quantize(x, overflow="saturate")
    over = fmt.classify(x) == "overflow"
    assert over.sum() > 10 and not np.isnan(sat[over]).any()
    assert_same(sat, np.where(over, np.copysign(fmt.max, x), fmt.quantize(x)), x)
    if fmt is FP8_E4M3:
        assert_same(sat, fmt.quantize(x), x)  # torch's E4M3 cast is the saturating one
    # the course's E4M3 cast is torch's saturating one, not ml_dtypes': 500 is 448 here, NaN there
    assert fmt.quantize(500.0) == (448.0 if fmt is FP8_E4M3 else 512.0)
    if fmt is FP8_E4M3:
        assert np.isnan(np.float32(500).astype(ml_dtypes.float8_e4m3fn).astype(np.float32))
        assert fmt.quantize(464.0, overflow="nan") == 448.0 and np.isnan(fmt.quantize(464.01, overflow="nan"))


def test_overflow_rule_is_checked():
    with pytest.raises(ValueError, match="fp8_e4m3 has no inf"):
        FP8_E4M3.quantize(1.0, overflow="inf")
    for bad in ("clamp", 1, np.array([1, 2]), [None]):
        with pytest.raises(ValueError, match="overflow must be one of None, 'saturate', 'nan', 'inf'"):
            FP16.quantize(1.0, overflow=bad)
    assert FP16.quantize([70000.0, -np.inf], overflow="saturate").tolist() == [65504.0, -65504.0]


@settings(max_examples=200, deadline=None)
@given(overflow=st.one_of(st.none(), st.text(max_size=9), st.sampled_from(["saturate", "nan", "inf"]), st.integers(),
                          st.floats(), st.lists(st.none(), max_size=2), st.just(np.array(["nan", "inf"]))),
       x=st.floats(width=32) | st.lists(st.floats(width=32), max_size=4))
def test_quantize_answers_any_overflow_rule(overflow, x):
    for fmt in (FP16, FP8_E4M3, FP8_E5M2):
        try:
            q = np.asarray(fmt.quantize(x, overflow=overflow))
        except ValueError as e:
            assert "\n" not in str(e) and ("overflow must be one of" in str(e) or "has no inf" in str(e))
            continue
        base = np.asarray(fmt.quantize(x))
        over = np.asarray(fmt.classify(x)) == "overflow"
        assert_same(q[~over], base[~over])
