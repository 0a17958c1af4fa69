"""Block scaling, bit for bit: OCP MX (MXFP8, MXFP6, MXFP4) and NVIDIA's NVFP4.

A block format stores a small number per element and one shared scale per block of elements
along the last axis. Both families here are reproduced exactly as their reference libraries
compute them on the CPU, in float32 arithmetic, and where a reference departs from the format's
own rule the rule is followed and the departure is named.

**MX** (``mx_quantize``): blocks of 32 (``block_size``), an E8M0 scale X = 2**k per block, and
elements ``fmt.encode(clamp(x / X, ±max))`` (round to nearest even, saturating). The exponent k
comes from the block's largest magnitude amax and the element format's largest power of two
``emax`` (``fmt.emax``: 8 for E4M3, 15 for E5M2, 4 for E3M2, 2 for E2M3 and E2M1):

* ``"floor"`` (the OCP MX v1.0 rule): k = floor(log2 amax) - emax. amax/X can exceed ``max``
  (E4M3: 500 -> 448), which the clamp absorbs;
* ``"ceil"``: k = ceil(log2 amax) - emax;
* ``"even"``: k = floor(log2 amax') - emax, amax' being amax rounded to the element's mantissa
  bits (ties to even);
* ``"rceil"`` (NVIDIA's rule, the ``cvt.rp.satfinite.ue8m0x2.f32`` instruction): k =
  ceil(log2(amax / max)), computed exactly.

k is clamped to [-127, 127] (scale pattern k + 127). An all-zero block gets 2**-127 (pattern 0).
A block holding NaN gets the NaN scale 255 and dequantizes to NaN. A block holding ±inf (and no
NaN) gets 255 too under floor/ceil/even (log2 inf is beyond E8M0, as in the OCP reference code
``microxcaling``'s ``_quantize_mx``) and 254 under rceil (the saturating instruction, as in
Transformer Engine). The elements of a NaN-scale block do not matter; they are what torchao's
``to_mx`` computes for them: x / 2**128 under floor/ceil/even (±0, and NaN for NaN and ±inf),
the quiet NaN under rceil.

torchao 0.18's ``to_mx`` (eager, CPU) gives the same scale and element patterns on every block
except three, where it departs from the rule above (the tests show each):

1. floor/ceil/even, a nonzero block whose scale is 2**-127 (pattern 0, e.g. a float32-subnormal
   amax): torchao divides by 2**-126 (``F32_MIN_NORMAL``), half the stored scale;
2. floor/ceil/even, a block with ±inf: torchao stores the finite scale 2**(128 - emax) (pattern
   247 for E4M3) and divides by it: inf saturates to ±max, the rest become (nearly) 0;
3. rceil: torchao's float32 ``ceil(log2(amax / max))`` returns k for amax / max just above 2**k
   (log2 rounds to the integer), one scale too small, so the largest element saturates; and for
   a nonzero block with scale pattern 0 it multiplies by 1.0 instead of 2**127.

**NVFP4** (``nvfp4_quantize``): E2M1 elements in blocks of 16, an E4M3 scale per block and a
float32 scale for the tensor, exactly as torchao's ``nvfp4_quantize`` and
``per_tensor_amax_to_scale`` (decode scale amax / (448 * 6)); ``convention="te"`` follows
Transformer Engine's reference quantizer instead (block scales may go below 2**-6, down to 0;
-0 and NaN give pattern 0).

Also: ``stochastic_round`` (unbiased rounding to a format's grid, as NVFP4 training rounds
gradients) and ``random_hadamard_transform`` (the NVFP4 recipe's 16-point transform).

Inputs are numbers, lists, numpy arrays or torch tensors (read as in ``ampviz.formats``), rounded
to float32 first. Results are immutable: NamedTuples of read-only numpy arrays. This module needs
numpy only.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import numpy as np

from ampviz.formats import (
    E8M0,
    FP4_E2M1,
    FP6_E2M3,
    FP6_E3M2,
    FP8_E4M3,
    FP8_E5M2,
    FloatFormat,
    _describe,
    _real_array,
    _scalar_or_array,
    get_format,
)

__all__ = [
    "MX_ELEMENT_FORMATS",
    "MX_ROUNDING",
    "NVFP4_CONVENTIONS",
    "TE_RHT_SIGNS",
    "MXBlocks",
    "NVFP4Blocks",
    "mx_quantize",
    "nvfp4_quantize",
    "stochastic_round",
    "hadamard_matrix",
    "random_hadamard_transform",
]

#: The element formats of OCP MX, by name.
MX_ELEMENT_FORMATS = {f.name: f for f in (FP8_E4M3, FP8_E5M2, FP6_E3M2, FP6_E2M3, FP4_E2M1)}
#: How ``mx_quantize`` picks a block's scale (torchao's ``ScaleCalculationMode`` values).
MX_ROUNDING = ("floor", "ceil", "even", "rceil")
#: Whose NVFP4 quantizer ``nvfp4_quantize`` follows.
NVFP4_CONVENTIONS = ("torchao", "te")
#: The fixed signs of Transformer Engine's NVFP4 Hadamard transform (``get_wgrad_sign_vector``).
TE_RHT_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)

_F32 = np.float32
_F32_MAX = np.finfo(np.float32).max
_NVFP4_BLOCK = 16
_E4M3_MAX = _F32(448.0)
_E4M3_TINY = _F32(2.0**-6)  # torchao's E4M3_EPS: torch.finfo(float8_e4m3fn).tiny
_FP4_MAX = _F32(6.0)


class MXBlocks(NamedTuple):
    """What ``mx_quantize`` returns (read-only arrays)."""

    scales: np.ndarray  #: uint8 E8M0 patterns, shape x.shape[:-1] + (blocks,)
    codes: np.ndarray  #: uint8 element patterns, x's shape (fp6/fp4 in the low bits)
    values: np.ndarray  #: float32 dequantized values, code value * 2**(scale - 127); NaN for scale 255


class NVFP4Blocks(NamedTuple):
    """What ``nvfp4_quantize`` returns (read-only arrays; ``tensor_scale`` None when single-level)."""

    tensor_scale: np.float32 | None  #: float32 decode scale of the tensor
    scales: np.ndarray  #: uint8 E4M3 patterns, shape x.shape[:-1] + (blocks,)
    codes: np.ndarray  #: uint8 E2M1 patterns, one per element (unpacked), x's shape
    values: np.ndarray  #: float32 dequantized values, code value * (tensor_scale * block scale)


# ---------------------------------------------------------------- argument checks
def _frozen(arr: np.ndarray) -> np.ndarray:
    arr = np.array(arr)  # an owned copy
    arr.setflags(write=False)
    return arr


def _float32_blocks(x, block: int, fn: str) -> np.ndarray:
    """x as float32 (float64 rounded once, as torch's cast), shaped (..., blocks, block)."""
    arr = _real_array(x, f"{fn}: x")
    if arr.ndim == 0:
        raise ValueError(f"{fn} needs an array with at least one axis (blocks run along the last), got one number")
    n = arr.shape[-1]
    if n % block:
        raise ValueError(f"{fn}: the last axis ({n} values) must be a multiple of the block size {block}; "
                         f"pad it or pass block_size dividing {n}")
    with np.errstate(over="ignore", invalid="ignore"):
        x32 = arr.astype(np.float32)
    return x32.reshape(*arr.shape[:-1], n // block, block)


def _block_size(block_size) -> int:
    if isinstance(block_size, (bool, np.bool_)) or not isinstance(block_size, (numbers.Integral, np.integer)):
        raise TypeError(f"block_size must be a positive int such as 32, got {_describe(block_size)}")
    if block_size < 1:
        raise ValueError(f"block_size must be a positive int such as 32, got {int(block_size)}")
    return int(block_size)


def _mx_element_format(fmt) -> FloatFormat:
    names = ", ".join(repr(k) for k in MX_ELEMENT_FORMATS)
    try:
        f = get_format(fmt)
    except (TypeError, ValueError):
        f = None
    if f is None or MX_ELEMENT_FORMATS.get(f.name) is not f:
        raise ValueError(f"fmt must be an MX element format ({names}) or its FloatFormat, got {_describe(fmt)}")
    return f


def _choice(value, what: str, choices: tuple) -> str:
    key = getattr(value, "value", value)  # an Enum such as torchao's ScaleCalculationMode
    if isinstance(key, str) and key.strip().lower() in choices:
        return key.strip().lower()
    raise ValueError(f"{what} must be one of {', '.join(repr(c) for c in choices)}, got {_describe(value)}")


def _generator(rng, fn: str):
    if rng is None or isinstance(rng, np.random.Generator):
        return rng
    raise TypeError(f"{fn}: rng must be a numpy Generator (np.random.default_rng(seed)) or None, got {_describe(rng)}")


# ---------------------------------------------------------------- element casts
def _pow2(k) -> np.ndarray:
    """2.0**k as float32 for integer k in [-149, 127] (exact)."""
    return np.ldexp(_F32(1.0), np.asarray(k, np.int32)).astype(np.float32)


def _element_codes(fmt: FloatFormat, v: np.ndarray, rng=None) -> np.ndarray:
    """uint8 patterns of float32 values v already clamped to ±fmt.max (NaN passes through).

    fp8 as torch's cast gives them (NaN: 0x7F with the NaN's sign, in E5M2 too); fp6 and fp4 as
    torchao's ``f32_to_f*_unpacked`` (NaN by its bit arithmetic). ``rng``: round stochastically.
    """
    if rng is not None:
        v = stochastic_round(v, fmt, rng).astype(np.float32)
    if fmt.specials == "finite":
        bits = fmt.encode(v, nan="torchao")
    else:
        bits = fmt.encode(v)
        isnan = np.isnan(v)
        if isnan.any():  # torch writes S.1111.111 for NaN in both fp8 formats
            ones = (1 << (fmt.bits - 1)) - 1
            bits = np.where(isnan, ones | (np.signbit(v).astype(np.int64) << (fmt.bits - 1)), bits)
    return np.asarray(bits).astype(np.uint8)


def _element_values(fmt: FloatFormat, codes: np.ndarray) -> np.ndarray:
    return np.asarray(fmt.decode(codes.astype(np.int64))).astype(np.float32)


def _e4m3_scale_values(codes: np.ndarray) -> np.ndarray:
    """float32 values of E4M3 patterns as torch's cast gives them: a NaN pattern becomes the
    float32 NaN 0x7FF00000 with its sign (c10's ``fp8e4m3fn_to_fp32_value``), whose payload then
    travels through the arithmetic that follows (it decides the E2M1 patterns torchao writes in
    a block whose scale is NaN)."""
    v = _element_values(FP8_E4M3, codes)
    nan_bits = (0x7FF00000 | (codes.astype(np.uint32) >> 7 << 31)).astype(np.uint32)
    return np.where(np.isnan(v), nan_bits.view(np.float32), v)


# ---------------------------------------------------------------- MX
def _mx_exponents(amax: np.ndarray, fmt: FloatFormat, rounding: str) -> np.ndarray:
    """The block scale patterns (int64) from float32 block maxima, by the exact rule."""
    a = amax.astype(np.float64)
    positive = a > 0
    finite = np.isfinite(a)
    safe = np.where(positive & finite, a, 1.0)
    frac, e = np.frexp(safe)  # safe = frac * 2**e, frac in [0.5, 1): floor(log2) = e - 1
    floor_log2 = e.astype(np.int64) - 1
    if rounding == "floor":
        k = floor_log2 - fmt.emax
    elif rounding == "ceil":
        k = floor_log2 + (frac != 0.5) - fmt.emax
    elif rounding == "even":  # amax rounded to the element's mantissa bits (ties to even) first
        m = fmt.mantissa_bits
        k = floor_log2 + (np.rint(frac * 2.0 ** (m + 1)) == 2.0 ** (m + 1)) - fmt.emax
    else:  # rceil: the least k with max * 2**k >= amax (exact: both sides are float64 values)
        k = floor_log2 - int(np.floor(np.log2(fmt.max)))
        k = k - 1 + (np.ldexp(fmt.max, k - 1) < safe) + (np.ldexp(fmt.max, k) < safe)
    k = np.where(positive, k, -127)
    code = np.clip(k, -127, 127) + 127
    if rounding == "rceil":
        code = np.where(np.isinf(a), 254, code)  # saturating, as cvt.rp.satfinite and TE
    else:
        code = np.where(np.isinf(a), 255, code)  # log2(inf) is beyond E8M0: NaN
    return np.where(np.isnan(a), 255, code).astype(np.int64)


def mx_quantize(x, fmt, block_size=32, rounding="floor", *, rng=None) -> MXBlocks:
    """OCP MX block scaling of x along its last axis: ``(scales, codes, values)``.

    ``fmt``: the element format, a name ("fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3",
    "fp4_e2m1"), its FloatFormat or torch dtype. ``block_size``: elements per scale (32 in the MX
    spec); the last axis must be a multiple of it. ``rounding``: how the scale is chosen, "floor"
    (OCP), "ceil", "even" or "rceil" (NVIDIA); see the module. ``rng``: a numpy Generator to round
    the elements stochastically instead of to nearest even (the scales do not change).

    Returns ``MXBlocks``: ``scales`` (uint8 E8M0 patterns, one per block), ``codes`` (uint8
    element patterns, one per element; fp4 unpacked) and ``values`` (float32, the dequantized
    x: element value * scale, as torchao's ``MXTensor.dequantize``; NaN where the scale is NaN).
    """
    fmt = _mx_element_format(fmt)
    block = _block_size(block_size)
    rounding = _choice(rounding, "rounding", MX_ROUNDING)
    rng = _generator(rng, "mx_quantize")
    xb = _float32_blocks(x, block, "mx_quantize")
    with np.errstate(invalid="ignore"):
        amax = np.max(np.abs(xb), axis=-1, initial=_F32(0.0)) if xb.size else np.zeros(xb.shape[:-1], np.float32)
        amax = np.where(np.isnan(xb).any(axis=-1), np.nan, amax).astype(np.float32)
    scales = _mx_exponents(amax, fmt, rounding)
    top = _F32(fmt.max)
    s = scales[..., None]
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        # x / X, exactly (a power of two); a NaN-scale block as torchao computes it: x / 2**128
        # (floor, ceil, even: finite values give ±0) or x * (amax / max) (rceil: every element
        # becomes the quiet NaN that amax carries)
        nan_block = np.full_like(xb, np.nan) if rounding == "rceil" else xb / _F32(np.inf)
        v = np.where(s == 255, nan_block, np.ldexp(xb, (127 - np.minimum(s, 254)).astype(np.int32)))
        v = np.clip(v.astype(np.float32), -top, top)
        codes = _element_codes(fmt, v, rng)
        values = _element_values(fmt, codes) * _pow2(np.minimum(s, 254) - 127)
    values = np.where(s == 255, np.float32(np.nan), values).astype(np.float32)
    shape = xb.shape[:-2] + (xb.shape[-2] * block,)
    return MXBlocks(_frozen(scales.astype(np.uint8)), _frozen(codes.reshape(shape)),
                    _frozen(values.reshape(shape)))


# ---------------------------------------------------------------- NVFP4
def _e4m3_codes(s: np.ndarray) -> np.ndarray:
    """E4M3 patterns of float32 values as torch's cast writes them (NaN: 0x7F with its sign)."""
    return np.asarray(FP8_E4M3.encode(s)).astype(np.uint8)


def _tensor_scale(per_tensor_scale, amax_t: np.float32, convention: str):
    if isinstance(per_tensor_scale, (bool, np.bool_)):
        if not per_tensor_scale:
            if convention == "te":
                raise ValueError("nvfp4_quantize: convention='te' has no single-level scaling; pass "
                                 "per_tensor_scale=True")
            return None
        if convention == "te":
            return None  # computed from the amax below, as the reference does
        return _F32(amax_t / _F32(448.0 * 6.0))  # per_tensor_amax_to_scale
    if isinstance(per_tensor_scale, numbers.Real):
        if convention == "te":
            raise ValueError("nvfp4_quantize: convention='te' computes its scale from the amax; pass "
                             "per_tensor_scale=True")
        try:
            with np.errstate(over="ignore"):
                s = _F32(float(per_tensor_scale))
        except OverflowError:  # an int beyond float64
            s = _F32(np.inf)
        if not (np.isfinite(s) and s > 0):
            raise ValueError(f"per_tensor_scale must be True, False or a positive finite decode scale, "
                             f"got {_describe(per_tensor_scale)}")
        return s
    raise TypeError(f"per_tensor_scale must be True, False or a positive number (a decode scale), "
                    f"got {_describe(per_tensor_scale)}")


def nvfp4_quantize(x, per_tensor_scale=True, *, convention="torchao", rng=None) -> NVFP4Blocks:
    """NVFP4 quantization of x along its last axis: ``(tensor_scale, scales, codes, values)``.

    E2M1 elements in blocks of 16 (the last axis must be a multiple of 16), one E4M3 scale per
    block, and a float32 decode scale for the tensor.

    ``per_tensor_scale``: True (two-level scaling, tensor_scale = amax / (448 * 6) in float32, as
    torchao's ``per_tensor_amax_to_scale``), False (single-level: each block scale alone, clamped
    to [2**-6, 448]; ``tensor_scale`` is None) or a positive number (a calibrated decode scale).

    ``convention``: "torchao" (its ``nvfp4_quantize``, bit for bit: block scale amax/6/tensor_scale
    clamped to [2**-6, 448] and cast to E4M3, elements x * ((1/tensor_scale) / scale)) or "te"
    (Transformer Engine's reference ``_quantize_blockwise_reference``: encode scale
    448*6/amax, block scales not clamped below, so small blocks get E4M3 subnormal scales or 0;
    -0 and NaN elements give pattern 0; tensor_scale is its 1/encode scale). ``rng``: a numpy
    Generator to round the elements stochastically (the scales do not change).

    ``values`` = element value * (tensor_scale * block scale), in float32 as torchao's
    ``NVFP4Tensor.dequantize``.

    Special cases, as torchao: an all-zero tensor has tensor_scale 0, so its block scales are
    0/0 = NaN and its values NaN ("te": scales 0, values 0); a block with ±inf gets a NaN scale
    (inf/inf). A NaN anywhere makes tensor_scale NaN and every block scale NaN. The E2M1
    patterns inside a NaN-scale block mean nothing; they follow the NaN payloads, reproduced
    where torch's arithmetic fixes them (its E4M3 -> float32 cast) but not where a torch
    reduction picks its own NaN (``max`` of a tensor with NaN).
    """
    convention = _choice(convention, "convention", NVFP4_CONVENTIONS)
    rng = _generator(rng, "nvfp4_quantize")
    xb = _float32_blocks(x, _NVFP4_BLOCK, "nvfp4_quantize")
    with np.errstate(invalid="ignore"):
        anynan = np.isnan(xb).any(axis=-1)
        bmax = np.max(np.abs(xb), axis=-1, initial=_F32(0.0)) if xb.size else np.zeros(xb.shape[:-1], np.float32)
        bmax = np.where(anynan, np.nan, bmax).astype(np.float32)
        amax_t = _F32(np.nan) if anynan.any() else _F32(bmax.max(initial=0.0))
    pts = _tensor_scale(per_tensor_scale, amax_t, convention)
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        if convention == "te":
            s_enc = _F32(_F32(448.0 * 6.0) / amax_t)
            s_enc = _F32(1.0) if s_enc == 0 else (s_enc if np.isnan(s_enc) else min(s_enc, _F32_MAX))
            pts = _F32(_F32(1.0) / s_enc)
            mult = _F32(s_enc * np.reciprocal(_FP4_MAX))
            dec = np.minimum((bmax * mult).astype(np.float32), _F32_MAX)
            scales = _e4m3_codes(np.clip(dec, -_E4M3_MAX, _E4M3_MAX))
            sf = _e4m3_scale_values(scales)
            enc = np.minimum((_F32(1.0) / (sf * pts)).astype(np.float32), _F32_MAX)
        else:
            bscale = (bmax / _FP4_MAX).astype(np.float32)
            if pts is not None:
                bscale = (bscale / pts).astype(np.float32)
            scales = _e4m3_codes(np.clip(bscale, _E4M3_TINY, _E4M3_MAX))
            sf = _e4m3_scale_values(scales)
            one = _F32(1.0) if pts is None else _F32(_F32(1.0) / pts)
            enc = (one / sf).astype(np.float32)
        v = np.clip((xb * enc[..., None]).astype(np.float32), -_FP4_MAX, _FP4_MAX)
        codes = _element_codes(FP4_E2M1, v, rng)
        if convention == "te":  # its threshold table: -0 and NaN match no negative range
            codes = np.where((codes == 0x8) & (v == 0) | np.isnan(v), 0, codes).astype(np.uint8)
        dscale = sf if pts is None else (pts * sf).astype(np.float32)
        values = (_element_values(FP4_E2M1, codes) * dscale[..., None]).astype(np.float32)
    shape = xb.shape[:-2] + (xb.shape[-2] * _NVFP4_BLOCK,)
    return NVFP4Blocks(None if pts is None else _F32(pts), _frozen(scales), _frozen(codes.reshape(shape)),
                       _frozen(values.reshape(shape)))


# ---------------------------------------------------------------- stochastic rounding
def stochastic_round(x, fmt, rng) -> np.ndarray:
    """x rounded to one of its two neighbours in ``fmt`` at random, so that the mean is x.

    Each float32 value v between grid neighbours lo < v < hi becomes hi with probability
    (v - lo) / (hi - lo), else lo (one uniform draw from ``rng`` per value; values on the grid stay).
    Values beyond ±max saturate to ±max (as the hardware's ``cvt.rs.satfinite``), so the rounding
    is unbiased within the range only; NaN stays NaN. Returns float64 values of ``fmt``.
    ``fmt``: any format with a sign (not E8M0), or its name.
    """
    fmt = get_format(fmt)
    if fmt is E8M0 or fmt.specials == "fnu":
        raise ValueError("stochastic_round needs a signed element format (fp8, fp6, fp4, ...), not e8m0")
    rng = _generator(rng, "stochastic_round")
    if rng is None:
        raise TypeError("stochastic_round: pass rng=np.random.default_rng(seed)")
    arr = _real_array(x, "stochastic_round: x")
    with np.errstate(over="ignore", invalid="ignore"):
        v = arr.astype(np.float32).astype(np.float64)
    a = np.abs(v)
    top = fmt.max
    inside = np.isfinite(a) & (a < top)
    a_in = np.where(inside, a, 0.0)
    e = np.maximum(np.frexp(a_in)[1] - 1, fmt.emin) - fmt.mantissa_bits  # exponent of one ulp at a
    ulp = np.ldexp(1.0, e)
    lo = np.floor(a_in / ulp) * ulp  # exact: a power-of-two division
    p = (a_in - lo) / ulp
    u = rng.random(np.shape(v))
    q = np.where(u < p, lo + ulp, lo)
    q = np.where(inside, q, np.where(np.isnan(a), np.nan, top))
    return _scalar_or_array(np.copysign(q, v))


# ---------------------------------------------------------------- random Hadamard transform
def hadamard_matrix(signs=TE_RHT_SIGNS) -> np.ndarray:
    """The NVFP4 recipe's transform matrix diag(signs) @ H / sqrt(n), float64 (orthogonal).

    H is Sylvester's Hadamard matrix of size n = len(signs); ``signs``: n values ±1, by default
    Transformer Engine's fixed vector ``TE_RHT_SIGNS`` (n = 16). n must be a power of four (1, 4,
    16, 64, ...), so that 1/sqrt(n) is a power of two and the transform's products are exact.
    """
    s = _real_array(signs, "hadamard_matrix: signs")
    n = s.size
    if s.ndim != 1 or n < 1 or n & (n - 1) or (n.bit_length() - 1) % 2 or not np.all(np.abs(s) == 1):
        raise ValueError(f"signs must be a power-of-four count (16 for NVFP4) of ±1 values, got {_describe(signs)}")
    h = np.ones((1, 1))
    while h.shape[0] < s.size:
        h = np.block([[h, h], [h, -h]])
    return (s.astype(np.float64)[:, None] * h) / np.sqrt(n)


def random_hadamard_transform(x, signs=TE_RHT_SIGNS, *, inverse=False) -> np.ndarray:
    """The NVFP4 recipe's random Hadamard transform of x along its last axis, in chunks of
    len(signs) (16): each chunk c becomes c @ M, M = ``hadamard_matrix(signs)``, as Transformer
    Engine's reference ``x.view(-1, 16) @ (diag(s) @ H / 4)``. ``inverse``: c @ M.T (M is
    orthogonal, so this undoes the transform).

    Each output is the exact sum rounded once to float32 (M's entries are ±1/4 for 16, so every
    product is exact; a float32 matmul may differ in the last bit by its summation order).
    """
    m = hadamard_matrix(signs)
    n = m.shape[0]
    xb = _float32_blocks(x, n, "random_hadamard_transform").astype(np.float64)
    if not isinstance(inverse, (bool, np.bool_)):
        raise TypeError(f"inverse must be True or False, got {_describe(inverse)}")
    mat = m.T if inverse else m
    with np.errstate(over="ignore", invalid="ignore"):
        y = _exact_matmul_f32(xb, mat)
    return y.reshape(*xb.shape[:-2], xb.shape[-2] * n)


def _exact_matmul_f32(xb: np.ndarray, mat: np.ndarray) -> np.ndarray:
    """xb @ mat with each output the exact sum rounded once to float32 (xb: float32 values as
    float64; mat: entries ±2**-j, so every product is exact in float64; inf and NaN as IEEE sums).

    Where a row's terms span few enough binades, float64 adds them exactly and one cast rounds.
    Elsewhere (rare: values 2**29 apart in one chunk) ``math.fsum`` gives the float64 nearest to
    the exact sum, nudged to round-to-odd so that the cast to float32 rounds it once.
    """
    terms = xb[..., :, None] * mat  # (..., n_in, n_out)
    y = terms.sum(axis=-2)
    a = np.abs(xb)
    nz = a > 0
    low = np.where(nz, np.maximum(np.frexp(np.where(nz, a, 1.0))[1] - 24, -149), 10_000).min(axis=-1)
    low = low + int(np.frexp(np.abs(mat[mat != 0]).min())[1]) - 1  # the products' lowest bit
    bound = np.abs(terms).sum(axis=-2).max(axis=-1, initial=0.0)
    exact = (bound < np.ldexp(1.0, np.minimum(low + 53, 1023))) | ~nz.any(axis=-1)
    if not exact.all():
        import math

        flat_terms = terms.reshape(-1, *terms.shape[-2:])
        flat_y = y.reshape(-1, y.shape[-1])
        for r in np.flatnonzero(~exact.reshape(-1)):
            for j in range(flat_y.shape[1]):
                col = flat_terms[r, :, j].tolist()
                if not all(map(math.isfinite, col)):
                    continue  # inf or NaN: the plain sum is what IEEE arithmetic gives
                near = math.fsum(col)
                rest = math.fsum(col + [-near])
                bits = np.float64(near).view(np.int64)
                if rest != 0 and bits % 2 == 0:  # round to odd: step toward the exact sum
                    near = float(np.nextafter(near, np.inf if rest > 0 else -np.inf))
                flat_y[r, j] = near
        y = flat_y.reshape(y.shape)
    return y.astype(np.float32)
