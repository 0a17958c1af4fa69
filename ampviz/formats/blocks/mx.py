"""OCP MX block scaling (MXFP8, MXFP6, MXFP4): ``mx_quantize`` gives each block of 32 elements an
E8M0 scale, a power of two picked by one of four rules (``MX_ROUNDING``), and rounds the elements
into the element format (``MX_ELEMENT_FORMATS``). Here are the exact rule (``_mx_exponents``,
``_mx_reference``) and the fast path through the lookup tables (``_mx_fast``); the rules, and
where torchao departs from them, are told in ``ampviz.formats.blocks``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ampviz.formats.blocks.common import (
    _F32,
    _block_size,
    _choice,
    _element_codes,
    _element_values,
    _float32_blocks,
    _pow2,
    _sealed,
    _x_shape,
)
from ampviz.formats.blocks.tables import (
    _INF_BITS,
    _TABLES,
    _abs_max_bits,
    _element_table,
    _ElementTable,
    _in_parallel,
    _scaled_elements,
)
from ampviz.formats.catalog import FP4_E2M1, FP6_E2M3, FP6_E3M2, FP8_E4M3, FP8_E5M2, get_format
from ampviz.formats.inputs import _describe
from ampviz.formats.spec import FloatFormat
from ampviz.formats.blocks.stochastic import _generator

#: The element formats of OCP MX, by name.
MX_ELEMENT_FORMATS = {f.name: f for f in (FP8_E4M3, FP8_E5M2, FP6_E3M2, FP6_E2M3, FP4_E2M1)}
#: How ``mx_quantize`` picks a block's scale (torchao's ``ScaleCalculationMode`` values).
MX_ROUNDING = ("floor", "ceil", "even", "rceil")


class MXBlocks(NamedTuple):
    """What ``mx_quantize`` returns (read-only arrays)."""

    scales: np.ndarray  #: uint8 E8M0 patterns, shape x.shape[:-1] + (blocks,)
    codes: np.ndarray  #: uint8 element patterns, x's shape (fp6/fp4 in the low bits)
    values: np.ndarray  #: float32 dequantized values, code value * 2**(scale - 127); NaN for scale 255


def _mx_element_format(fmt) -> FloatFormat:
    names = ", ".join(repr(k) for k in MX_ELEMENT_FORMATS)
    try:
        f = get_format(fmt)
    except (TypeError, ValueError):
        f = None
    if f is None or MX_ELEMENT_FORMATS.get(f.name) is not f:
        raise ValueError(f"fmt must be an MX element format ({names}) or its FloatFormat, got {_describe(fmt)}")
    return f


def _mx_scale_index(abits: np.ndarray, fmt: FloatFormat, rounding: str) -> np.ndarray:
    """An index (0..256) per block, from the patterns ``_abs_max_bits`` gives, that decides the
    block's scale: the biased exponent e of amax, plus one where the rounding moves amax up a
    binade.

    For a normal amax with mantissa field m, floor(log2 amax) + 127 = e. ceil adds one when
    m > 0; even when m rounds up past the element's mantissa bits (ties to even: m >= 2**23 -
    2**(22 - mantissa bits)); rceil when m exceeds the mantissa field of ``fmt.max`` (max * 2**k
    then falls short of amax). Adding 2**23 - 1, 2**(22 - mantissa bits) or 2**23 - 1 - (max's
    mantissa field) to the pattern carries into the exponent exactly then."""
    if rounding == "floor":
        add = 0
    elif rounding == "ceil":
        add = (1 << 23) - 1
    elif rounding == "even":
        add = 1 << (22 - fmt.mantissa_bits)
    else:
        add = (1 << 23) - 1 - (int(np.float32(fmt.max).view(np.uint32)) & 0x7FFFFF)
    index = np.empty(abits.shape, np.intp)
    np.right_shift(abits + np.uint32(add), 23, out=index)
    return index


def _mx_scale_tables(fmt: FloatFormat, rounding: str) -> tuple:
    """(patterns, multipliers, scales), indexed by ``_mx_scale_index`` of a finite amax: the E8M0
    pattern clamp(index - emax, 0, 254) (uint8; the exponent of ``fmt.max`` in place of emax under
    rceil), 2**(127 - pattern) to divide by the scale and 2**(pattern - 127) to dequantize
    (float32). A zero or float32-subnormal amax (index 0 or 1: k far below -127) gets pattern 0.
    An inf or NaN amax is not looked up here (see ``_mx_scale_codes``)."""
    key = ("scales", fmt.name, rounding)
    tables = _TABLES.get(key)
    if tables is None:
        shift = fmt.emax if rounding != "rceil" else int(np.floor(np.log2(fmt.max)))
        codes = np.clip(np.arange(257) - shift, 0, 254)
        mult = np.ldexp(_F32(1.0), (127 - codes).astype(np.int32)).astype(np.float32)
        scale = np.ldexp(_F32(1.0), (codes - 127).astype(np.int32)).astype(np.float32)
        tables = _TABLES[key] = tuple(_sealed(t) for t in (codes.astype(np.uint8), mult, scale))
    return tables


def _mx_scale_codes(abits: np.ndarray, fmt: FloatFormat, rounding: str) -> np.ndarray:
    """The E8M0 scale patterns (uint8) of blocks from their ``_abs_max_bits``, by the rule of
    ``_mx_exponents``: an inf amax gives 255 (254 under rceil), a NaN 255."""
    codes = _mx_scale_tables(fmt, rounding)[0].take(_mx_scale_index(abits, fmt, rounding))
    codes[abits == _INF_BITS] = 254 if rounding == "rceil" else 255
    codes[abits > _INF_BITS] = 255
    return codes


def _mx_fast(x2: np.ndarray, fmt: FloatFormat, rounding: str, table: _ElementTable | None = None):
    """``_mx_reference`` of the rows (blocks) of x2, through the element table: (scales, codes,
    values). Blocks holding an inf or a NaN go through the exact path (their scale is 255, or 254
    for an inf under rceil); in the others no quotient is NaN. ``table``: the element table
    (tests pass a wrong one to show it is caught)."""
    x2 = np.ascontiguousarray(x2)
    n, block = x2.shape
    table = _element_table(fmt) if table is None else table
    scale_codes, scale_mult, scale_value = _mx_scale_tables(fmt, rounding)
    abits = np.empty(n, np.uint32)
    scales = np.empty(n, np.uint8)
    codes = np.empty((n, block), np.uint8)
    values = np.empty((n, block), np.float32)

    def work(r0, r1):
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):  # per thread
            i = _mx_scale_index(_abs_max_bits(x2[r0:r1], abits[r0:r1]), fmt, rounding)
            scale_codes.take(i, out=scales[r0:r1])
            _scaled_elements(x2[r0:r1], scale_mult.take(i), scale_value.take(i), table, codes[r0:r1],
                             values[r0:r1])

    _in_parallel(work, n, block)
    exact = np.flatnonzero(abits >= _INF_BITS)
    if exact.size:
        scales[exact], codes[exact], values[exact] = _mx_reference(x2[exact], fmt, rounding)
    return scales, codes, values


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
    if rng is None and xb.size:
        scales, codes, values = _mx_fast(xb.reshape(-1, block), fmt, rounding)
    else:
        scales, codes, values = _mx_reference(xb, fmt, rounding, rng)
    return MXBlocks(_sealed(scales.reshape(xb.shape[:-1])), _sealed(codes.reshape(_x_shape(xb))),
                    _sealed(values.reshape(_x_shape(xb))))


def _mx_reference(xb: np.ndarray, fmt: FloatFormat, rounding: str, rng=None):
    """MX block scaling of float32 blocks xb (..., blocks, block), straight from the rule, one
    numpy operation over all elements at a time: (scales, codes, values), new writable arrays
    shaped (..., blocks), (..., blocks, block) and (..., blocks, block). ``mx_quantize`` uses it
    for stochastic rounding and for blocks whose scale is NaN; the fast path must equal it."""
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
    return scales.astype(np.uint8), codes.reshape(xb.shape), values.reshape(xb.shape)
