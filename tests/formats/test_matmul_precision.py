"""``ampviz.formats.matmul_precision``: the roundings bit for bit against the formats' casts and
torch's, every mode's matmul against an exact sum in fractions, the errors in their order, and
plausible wrong variants (TF32 by truncation, bf16x3 without its lo·hi term) caught."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ampviz.formats import ALL_FORMATS, BF16, TF32, get_format
from ampviz.formats.matmul_precision import (MATMUL_MODES, emulated_matmul, matmul_errors, round_to_bf16,
                                             round_to_tf32, split_bf16)

F32_MAX = float(np.finfo(np.float32).max)


def _bits(x) -> np.ndarray:
    return np.asarray(x, np.float32).view(np.uint32)


def _same_bits(x, y) -> bool:
    """Equal bit for bit, any NaN counting as any NaN."""
    x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
    return x.shape == y.shape and bool(np.all((_bits(x) == _bits(y)) | (np.isnan(x) & np.isnan(y))))


def _wide_float32(n: int, seed: int) -> np.ndarray:
    """float32 values over the whole range: subnormals, normals near the top, exact ties, 0, ±inf, NaN."""
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):  # a few become inf, as they should
        x = (rng.standard_normal(n) * 2.0 ** rng.integers(-150, 128, n)).astype(np.float32)
    ties = (rng.integers(0, 2**19, n // 8, dtype=np.uint32) << 13 | np.uint32(1 << 12)).view(np.float32)
    bf16_ties = (rng.integers(0, 2**16, n // 8, dtype=np.uint32) << 16 | np.uint32(1 << 15)).view(np.float32)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, F32_MAX, -F32_MAX, 2.0**-149, 2.0**-126], np.float32)
    return np.concatenate([x, ties, bf16_ties, specials])


# ------------------------------------------------------------------------------------------------
# The roundings, bit for bit
# ------------------------------------------------------------------------------------------------

def test_the_formats_layer_has_tf32_and_bf16():
    assert ALL_FORMATS["tf32"] is TF32 and get_format("tf32").mantissa_bits == 10
    assert get_format("bf16") is BF16


def test_tf32_rounding_equals_the_formats_cast_bit_for_bit():
    x = _wide_float32(200_000, 0)
    assert _same_bits(round_to_tf32(x), TF32.quantize(x))


@pytest.mark.parametrize("seed", [0, 1])
def test_bf16_rounding_equals_torch_and_the_formats_cast_bit_for_bit(seed):
    x = _wide_float32(200_000, seed)
    torch_cast = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    assert _same_bits(round_to_bf16(x), torch_cast)
    assert _same_bits(round_to_bf16(x), BF16.quantize(x))


def test_bf16x3_split_equals_torch_bit_for_bit():
    x = _wide_float32(200_000, 2)
    x = x[np.abs(x) < 3.3e38]  # nearer float32's max, bf16 rounds up to inf and lo is -inf in both
    t = torch.from_numpy(x)
    hi = t.to(torch.bfloat16)
    lo = (t - hi.float()).to(torch.bfloat16)
    ours_hi, ours_lo = split_bf16(x)
    assert _same_bits(ours_hi, hi.float().numpy()) and _same_bits(ours_lo, lo.float().numpy())
    # hi + lo holds 16 significant bits of x: what is left is below 2^-16 of it (normal range)
    normal = np.isfinite(x) & (np.abs(x) > 2.0**-100)
    rest = np.abs(x[normal].astype(np.float64) - ours_hi[normal] - ours_lo[normal])
    assert np.all(rest <= np.abs(x[normal].astype(np.float64)) * 2.0**-16)


def test_the_split_near_float32s_max_overflows_as_torch_does():
    x = np.array([F32_MAX, -F32_MAX], np.float32)
    t = torch.from_numpy(x)
    hi = t.to(torch.bfloat16)
    lo = (t - hi.float()).to(torch.bfloat16)
    ours_hi, ours_lo = split_bf16(x)
    assert _same_bits(ours_hi, hi.float().numpy()) and _same_bits(ours_lo, lo.float().numpy())
    assert np.all(np.isinf(ours_hi)) and np.isnan(emulated_matmul(x[:1], x[:1], "bf16x3"))


def test_tf32_ties_even_or_away():
    tie = np.float32(1 + 2.0**-11)  # halfway between 1 and 1 + 2^-10
    assert round_to_tf32(tie) == 1.0 and round_to_tf32(tie, "away") == np.float32(1 + 2.0**-10)
    assert round_to_tf32(-tie, "away") == -np.float32(1 + 2.0**-10)
    x = _wide_float32(100_000, 3)
    differ = ~((_bits(round_to_tf32(x)) == _bits(round_to_tf32(x, "away"))) | np.isnan(x))
    is_tie = (_bits(x) & np.uint32(0x1FFF)) == np.uint32(0x1000)
    assert np.any(differ) and np.all(is_tie[differ])  # they differ on ties only


def test_truncation_is_not_the_tf32_cast():
    """The wrong variant: TF32 by dropping 13 bits. It disagrees with the cast on about half the values."""
    x = _wide_float32(100_000, 4)
    truncated = (_bits(x) & np.uint32(0xFFFFE000)).view(np.float32)
    agree = np.mean((_bits(truncated) == _bits(TF32.quantize(x))) | np.isnan(x))
    assert 0.4 < agree < 0.6
    assert np.mean((_bits(round_to_tf32(x)) == _bits(TF32.quantize(x))) | np.isnan(x)) == 1.0


# ------------------------------------------------------------------------------------------------
# The matmul against an exact reference
# ------------------------------------------------------------------------------------------------

def _fraction_to_float32(q: Fraction) -> float:
    """The exact rational q rounded to float32 (nearest, ties to even), overflow to inf."""
    if q == 0:
        return 0.0
    sign, a = (-1.0 if q < 0 else 1.0), abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1  # now 2^e <= a < 2^(e+1)
    quantum = max(e, -126) - 23
    n = round(a / Fraction(2) ** quantum)  # Fraction rounds half to even
    value = n * Fraction(2) ** quantum
    if value >= Fraction(2) ** 128:
        return sign * math.inf
    return sign * float(value)


def _reference(a, b, mode: str) -> np.ndarray:
    """The mode's result built independently: inputs rounded by ampviz.formats' casts (the bf16x3
    split in float32), products and sums as exact fractions, one rounding to float32."""
    a32, b32 = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if mode == "fp32":
        terms = [(a32, b32)]
    elif mode in ("tf32", "bf16"):
        fmt = TF32 if mode == "tf32" else BF16
        terms = [(np.float32(fmt.quantize(a32)), np.float32(fmt.quantize(b32)))]
    else:
        def split(x):
            hi = np.asarray(BF16.quantize(x), np.float32)
            with np.errstate(invalid="ignore"):  # inf - inf is NaN, as in torch
                return hi, np.asarray(BF16.quantize(np.subtract(x, hi, dtype=np.float32)), np.float32)
        (ha, la), (hb, lb) = split(a32), split(b32)
        terms = [(ha, hb), (ha, lb), (la, hb)]
    m, n = a32.shape[0], b32.shape[1]
    out = np.empty((m, n), np.float32)
    for i in range(m):
        for j in range(n):
            values = [float(x) * float(y) for l, r in terms for x, y in zip(l[i], r[:, j])]
            if not all(math.isfinite(v) for v in values):  # inf and NaN: any order gives the same
                with np.errstate(invalid="ignore", over="ignore"):
                    out[i, j] = np.float32(sum(values))
            else:
                out[i, j] = _fraction_to_float32(sum((Fraction(float(x)) * Fraction(float(y))
                                                      for l, r in terms for x, y in zip(l[i], r[:, j])),
                                                     Fraction(0)))
    return out


@pytest.mark.parametrize("mode", list(MATMUL_MODES))
def test_every_mode_equals_the_exact_reference(mode):
    rng = np.random.default_rng(5)
    a = (rng.standard_normal((6, 40)) * 2.0 ** rng.integers(-20, 20, (6, 40))).astype(np.float32)
    b = rng.standard_normal((40, 5)).astype(np.float32)
    assert _same_bits(emulated_matmul(a, b, mode), _reference(a, b, mode))


def test_a_sum_float64_cannot_hold_is_rounded_exactly():
    # 1 + 2^-24 + 2^-53 + 2^-53: float64 in order keeps 1 + 2^-24, a float32 tie (to 1); exactly, it is above the tie
    assert emulated_matmul([1, 2.0**-24, 2.0**-53, 2.0**-53], [1, 1, 1, 1]) == np.float32(1 + 2.0**-23)
    assert emulated_matmul([2.0**-53, 2.0**-53, 1, 2.0**-24], [1, 1, 1, 1]) == np.float32(1 + 2.0**-23)
    # 1 + 2^-24 + 2^-80: even the correctly rounded float64 sum is the float32 tie; rounded to odd, it is not
    assert emulated_matmul([1, 2.0**-24, 2.0**-80], [1, 1, 1]) == np.float32(1 + 2.0**-23)
    assert emulated_matmul([1, 2.0**-24, -(2.0**-80)], [1, 1, 1]) == np.float32(1)


def test_bf16x3_equals_a_product_built_from_torchs_split():
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((5, 30)).astype(np.float32), rng.standard_normal((30, 4)).astype(np.float32)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    ha, hb = ta.to(torch.bfloat16), tb.to(torch.bfloat16)
    la, lb = (ta - ha.float()).to(torch.bfloat16), (tb - hb.float()).to(torch.bfloat16)
    pieces = [(ha, hb), (ha, lb), (la, hb)]
    exact = [[_fraction_to_float32(sum((Fraction(float(x)) * Fraction(float(y))
                                        for l, r in pieces for x, y in zip(l[i].float().tolist(), r[:, j].float().tolist())),
                                       Fraction(0))) for j in range(4)] for i in range(5)]
    assert _same_bits(emulated_matmul(a, b, "bf16x3"), np.array(exact, np.float32))
    # the wrong variant: without lo·hi the product is another one (and further from float64)
    no_lo_hi = [[_fraction_to_float32(sum((Fraction(float(x)) * Fraction(float(y))
                                           for l, r in pieces[:2] for x, y in zip(l[i].float().tolist(), r[:, j].float().tolist())),
                                          Fraction(0))) for j in range(4)] for i in range(5)]
    assert not _same_bits(emulated_matmul(a, b, "bf16x3"), np.array(no_lo_hi, np.float32))


def test_shapes_follow_numpys_matmul():
    rng = np.random.default_rng(7)
    cases = [((3,), (3,)), ((3,), (3, 2)), ((2, 3), (3,)), ((4, 2, 3), (3, 5)), ((2, 3), (4, 3, 5)),
             ((1, 2, 3), (4, 3, 2)), ((2, 0), (0, 3)), ((0, 2), (2, 3))]
    for sa, sb in cases:
        a, b = rng.standard_normal(sa).astype(np.float32), rng.standard_normal(sb).astype(np.float32)
        for mode in MATMUL_MODES:
            got = emulated_matmul(a, b, mode)
            want = np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.float32)
            assert got.shape == want.shape and got.dtype == np.float32
        assert np.array_equal(emulated_matmul(a, b, "fp32"), want)  # these sums are exact enough in float64


def test_tensors_and_float64_are_read_as_float32():
    x = torch.tensor([[1 + 2.0**-30, 2.0]], dtype=torch.float64)
    assert emulated_matmul(x, [[1.0], [1.0]])[0, 0] == np.float32(3.0)


# ------------------------------------------------------------------------------------------------
# The errors, in their order
# ------------------------------------------------------------------------------------------------

def test_errors_order_fp32_bf16x3_tf32_bf16():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 256)).astype(np.float32), rng.standard_normal((256, 256)).astype(np.float32)
    e = matmul_errors(a, b)
    assert list(e) == list(MATMUL_MODES)
    # fp32: the output's rounding alone (about 2^-24 of each value); bf16's inputs lose 2^-9 each
    assert e["fp32"] < 2.0**-24
    assert 2.0**-10 < e["bf16"] < 2.0**-8
    assert 2.0**-13 < e["tf32"] < 2.0**-11 and e["tf32"] < e["bf16"] / 4
    # bf16x3 far below bf16 (over 2^9 times) and below TF32 (over 2^5 times), within 2^8 of fp32
    assert e["bf16x3"] < e["bf16"] / 2**9 and e["bf16x3"] < e["tf32"] / 2**5
    assert e["fp32"] < e["bf16x3"] < e["fp32"] * 2**8


def test_the_wrong_variants_are_further_from_float64():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((32, 128)).astype(np.float32), rng.standard_normal((128, 64)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    e = matmul_errors(a, b)

    def err(x):
        return float(np.linalg.norm(x - ref) / np.linalg.norm(ref))

    def trunc(x):
        return (x.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)

    assert err(trunc(a) @ trunc(b)) > 1.5 * e["tf32"]  # truncation: twice the error, and biased
    (ha, la), (hb, lb) = split_bf16(a), split_bf16(b)
    ha, la, hb, lb = (v.astype(np.float64) for v in (ha, la, hb, lb))
    assert err(ha @ hb + ha @ lb) > 10 * e["bf16x3"]  # without lo·hi, a's low bits are lost


# ------------------------------------------------------------------------------------------------
# Any input: the right result or one clear error
# ------------------------------------------------------------------------------------------------

def test_bad_arguments_are_one_line_errors():
    for call, kind in [(lambda: emulated_matmul([1, 2], [1, 2], "fp64"), ValueError),
                       (lambda: emulated_matmul([1, 2], [1, 2, 3]), ValueError),
                       (lambda: emulated_matmul(np.ones((2, 2, 3)), np.ones((3, 3, 2))), ValueError),
                       (lambda: emulated_matmul(3.0, [1.0]), ValueError),
                       (lambda: emulated_matmul("ab", [1.0]), TypeError),
                       (lambda: emulated_matmul([1, 2], [1, 2], "tf32", tf32_rounding="down"), ValueError),
                       (lambda: round_to_tf32([1.0], rounding=None), ValueError)]:
        with pytest.raises(kind) as info:
            call()
        assert "\n" not in str(info.value) and str(info.value)


_VALUES = st.floats(width=32, allow_nan=True, allow_infinity=True)
_ANY = st.one_of(
    hnp.arrays(np.float32, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4), elements=_VALUES),
    st.lists(st.floats(allow_nan=False), max_size=3),
    st.sampled_from([None, "x", [[1.0], [1.0, 2.0]], True]),
)


@st.composite
def _matching(draw):
    """Two matrices a @ b can multiply: (m, k) and (k, n), any float32 values."""
    m, k, n = draw(st.integers(0, 4)), draw(st.integers(0, 5)), draw(st.integers(0, 4))
    return (draw(hnp.arrays(np.float32, (m, k), elements=_VALUES)),
            draw(hnp.arrays(np.float32, (k, n), elements=_VALUES)))


@settings(max_examples=200, deadline=None)
@given(pair=st.one_of(_matching(), st.tuples(_ANY, _ANY)),
       mode=st.one_of(st.sampled_from(list(MATMUL_MODES)), st.just("fp16")))
def test_any_input_gives_the_exact_result_or_a_one_line_error(pair, mode):
    a, b = pair
    try:
        got = emulated_matmul(a, b, mode)
    except (ValueError, TypeError) as error:
        message = str(error)
        assert message and "\n" not in message
        return
    assert mode in MATMUL_MODES
    with np.errstate(all="ignore"):  # a Python float past float32's range reads as inf
        a32, b32 = np.asarray(a, np.float32), np.asarray(b, np.float32)
        shape = np.matmul(a32.astype(np.float64), b32.astype(np.float64)).shape
    assert got.shape == shape and got.dtype == np.float32
    if a32.ndim == 2 and b32.ndim == 2:
        assert _same_bits(got, _reference(a32, b32, mode))
