"""NVIDIA's NVFP4 block scaling: ``nvfp4_quantize`` rounds x into E2M1 elements in blocks of 16,
with an E4M3 scale per block and a float32 scale for the tensor, as torchao's ``nvfp4_quantize``
(the default) or Transformer Engine's reference quantizer (``convention="te"``) computes them, NaN
patterns included. Here are the exact path (``_nvfp4_reference``) and the fast one through the
lookup tables (``_nvfp4_fast``); ``ampviz.formats.blocks`` tells the whole story.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import numpy as np

from ampviz.formats.blocks.common import (
    _F32,
    _choice,
    _element_codes,
    _element_values,
    _float32_blocks,
    _sealed,
    _x_shape,
)
from ampviz.formats.blocks.tables import (
    _INF_BITS,
    _TABLES,
    _abs_max_bits,
    _element_table,
    _in_parallel,
    _scaled_elements,
    _table_index,
)
from ampviz.formats.catalog import FP4_E2M1, FP8_E4M3
from ampviz.formats.inputs import _TORCH_MAX_NAN, _describe
from ampviz.formats.blocks.stochastic import _generator

#: Whose NVFP4 quantizer ``nvfp4_quantize`` follows.
NVFP4_CONVENTIONS = ("torchao", "te")

_F32_MAX = np.finfo(np.float32).max
_NVFP4_BLOCK = 16
_E4M3_MAX = _F32(448.0)
_E4M3_TINY = _F32(2.0**-6)  # torchao's E4M3_EPS: torch.finfo(float8_e4m3fn).tiny
_FP4_MAX = _F32(6.0)


class NVFP4Blocks(NamedTuple):
    """What ``nvfp4_quantize`` returns (read-only arrays; ``tensor_scale`` None when single-level)."""

    tensor_scale: np.float32 | None  #: float32 decode scale of the tensor
    scales: np.ndarray  #: uint8 E4M3 patterns, shape x.shape[:-1] + (blocks,)
    codes: np.ndarray  #: uint8 E2M1 patterns, one per element (unpacked), x's shape
    values: np.ndarray  #: float32 dequantized values, code value * (tensor_scale * block scale)


def _e4m3_scale_values(codes: np.ndarray) -> np.ndarray:
    """float32 values of E4M3 patterns as torch's cast gives them: a NaN pattern becomes the
    float32 NaN 0x7FF00000 with its sign (c10's ``fp8e4m3fn_to_fp32_value``), whose payload then
    travels through the arithmetic that follows (it decides the E2M1 patterns torchao writes in
    a block whose scale is NaN)."""
    v = _element_values(FP8_E4M3, codes)
    nan_bits = (0x7FF00000 | (codes.astype(np.uint32) >> 7 << 31)).astype(np.uint32)
    return np.where(np.isnan(v), nan_bits.view(np.float32), v)


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
    -0 and NaN elements give pattern 0; tensor_scale is its 1/encode scale; a NaN block scale is
    0x7F, where torch's vectorized ``min`` may write 0xFF). ``rng``: a numpy
    Generator to round the elements stochastically (the scales do not change).

    ``values`` = element value * (tensor_scale * block scale), in float32 as torchao's
    ``NVFP4Tensor.dequantize``.

    Special cases, as torchao: an all-zero tensor has tensor_scale 0, so its block scales are
    0/0 = NaN and its values NaN ("te": scales 0, values 0); a block with ±inf gets a NaN scale
    (inf/inf). A NaN anywhere makes tensor_scale NaN and every block scale NaN, bit for bit as
    torch 2.13 writes them: its ``max`` of |x| gives the negative NaN 0xFFFFFFFF, so the tensor
    scale is that NaN, a block without NaN gets the scale pattern 0xFF (its amax / the tensor
    scale) and a block with NaN 0x7F (its own amax's NaN, positive, comes first in the division).
    The E2M1 patterns inside a NaN-scale block mean nothing; they follow the NaNs' signs and
    payloads as torch's vectorized loops carry them (``_nan_kept``). Not reproduced: where torch
    runs a loop's remainder instead (its last elements, as many as the processor's vector width
    leaves), an element that is NaN itself may keep its own NaN, and so its own pattern; and the
    payloads of NaN ``values``.
    """
    convention = _choice(convention, "convention", NVFP4_CONVENTIONS)
    rng = _generator(rng, "nvfp4_quantize")
    xb = _float32_blocks(x, _NVFP4_BLOCK, "nvfp4_quantize")
    fast = _nvfp4_fast(xb, per_tensor_scale, convention) if rng is None and xb.size else None
    pts, scales, codes, values = fast or _nvfp4_reference(xb, per_tensor_scale, convention, rng)
    return NVFP4Blocks(None if pts is None else _F32(pts), _sealed(scales.reshape(xb.shape[:-1])),
                       _sealed(codes.reshape(_x_shape(xb))), _sealed(values.reshape(_x_shape(xb))))


def _nvfp4_reference(xb: np.ndarray, per_tensor_scale, convention: str, rng=None):
    """NVFP4 quantization of float32 blocks xb (..., blocks, 16), one numpy operation over all
    elements at a time: (tensor scale or None, scales, codes, values), new arrays. ``nvfp4_quantize``
    uses it for stochastic rounding and for inputs the fast path leaves (NaN, inf, a zero scale)."""
    with np.errstate(invalid="ignore"):
        anynan = np.isnan(xb).any(axis=-1)
        bmax = np.max(np.abs(xb), axis=-1, initial=_F32(0.0)) if xb.size else np.zeros(xb.shape[:-1], np.float32)
        bmax = np.where(anynan, np.nan, bmax).astype(np.float32)
        amax_t = _TORCH_MAX_NAN if anynan.any() else _F32(bmax.max(initial=0.0))  # torch.max's NaN
    pts = _tensor_scale(per_tensor_scale, amax_t, convention)
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        if convention == "te":
            s_enc = _F32(_F32(448.0 * 6.0) / amax_t)
            s_enc = _F32(1.0) if s_enc == 0 else (_F32(np.nan) if np.isnan(s_enc) else min(s_enc, _F32_MAX))
            pts = _F32(_F32(1.0) / s_enc)
            mult = _F32(s_enc * np.reciprocal(_FP4_MAX))
            dec = _nan_kept(bmax * mult, _F32(np.nan), np.minimum(bmax * mult, _F32_MAX))  # torch.min
            scales = _e4m3_codes(np.clip(dec, -_E4M3_MAX, _E4M3_MAX))
            sf = _e4m3_scale_values(scales)
            enc = np.minimum((_F32(1.0) / (sf * pts)).astype(np.float32), _F32_MAX)
        else:
            bscale = (bmax / _FP4_MAX).astype(np.float32)
            if pts is not None:
                bscale = _nan_kept(bscale, bscale, bscale / pts)
            scales = _e4m3_codes(np.clip(bscale, _E4M3_TINY, _E4M3_MAX))
            sf = _e4m3_scale_values(scales)
            one = _F32(1.0) if pts is None else _F32(_F32(1.0) / pts)
            enc = _nan_kept(one, one, one / sf)
        v = np.clip(_nan_kept(enc[..., None], enc[..., None], xb * enc[..., None]), -_FP4_MAX, _FP4_MAX)
        codes = _element_codes(FP4_E2M1, v, rng)
        if convention == "te":  # its threshold table: -0 and NaN match no negative range
            codes = np.where((codes == 0x8) & (v == 0) | np.isnan(v), 0, codes).astype(np.uint8)
        dscale = sf if pts is None else _nan_kept(pts, pts, pts * sf)
        values = (_element_values(FP4_E2M1, codes) * dscale[..., None]).astype(np.float32)
    return pts, scales, codes.reshape(xb.shape), values.reshape(xb.shape)


def _nan_kept(a, nan, result) -> np.ndarray:
    """``result`` as float32, ``nan`` where a is NaN: the NaN torch writes. When both operands are
    NaN, torch's vectorized division keeps its first operand's and its multiply the broadcast
    operand's (sign and payload decide the patterns that follow; numpy's choice varies), and its
    ``min`` writes 0x7FC00000 (0xFFFFFFFF in its vectorized loop: the sign of a NaN block scale
    under ``convention="te"`` is not reproduced)."""
    return np.where(np.isnan(a), nan, result).astype(np.float32)


def _e4m3_lookup(s: np.ndarray) -> np.ndarray:
    """``_e4m3_codes`` of float32 values s in [-448, 448] (no NaN), through the E4M3 table."""
    scratch = np.empty(s.shape, np.uint32)
    index = np.empty(s.shape, np.intp)
    _table_index(np.ascontiguousarray(s, np.float32), scratch, index)
    return _element_table(FP8_E4M3).codes.take(index, mode="wrap")


def _e4m3_scale_table() -> np.ndarray:
    """``_e4m3_scale_values`` of all 256 patterns (made on first use), to look patterns up in."""
    table = _TABLES.get("e4m3 scale values")
    if table is None:
        table = _TABLES["e4m3 scale values"] = _sealed(_e4m3_scale_values(np.arange(256, dtype=np.uint8)))
    return table


def _nvfp4_fast(xb: np.ndarray, per_tensor_scale, convention: str):
    """``_nvfp4_reference`` of xb (no stochastic rounding) with the scales computed by the same
    float32 operations (one per block) and the elements through the E2M1 table; None where the
    input needs the exact path: a NaN or inf in x, or a scale that makes an element's quotient
    NaN (a zero tensor, a tensor scale whose reciprocal overflows)."""
    x2 = np.ascontiguousarray(xb).reshape(-1, _NVFP4_BLOCK)
    abits = np.empty(x2.shape[0], np.uint32)
    _in_parallel(lambda r0, r1: _abs_max_bits(x2[r0:r1], abits[r0:r1]), *x2.shape)
    if abits.max() >= _INF_BITS:
        return None
    bmax = abits.view(np.float32)
    amax_t = _F32(bmax.max())
    pts = _tensor_scale(per_tensor_scale, amax_t, convention)
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        if convention == "te":  # the same operations as _nvfp4_reference; amax_t is finite here
            s_enc = _F32(_F32(448.0 * 6.0) / amax_t)
            s_enc = _F32(1.0) if s_enc == 0 else min(s_enc, _F32_MAX)
            pts = _F32(_F32(1.0) / s_enc)
            mult = _F32(s_enc * np.reciprocal(_FP4_MAX))
            dec = np.minimum((bmax * mult).astype(np.float32), _F32_MAX)
            scales = _e4m3_lookup(np.clip(dec, -_E4M3_MAX, _E4M3_MAX))
            sf = _e4m3_scale_table().take(scales)
            enc = np.minimum((_F32(1.0) / (sf * pts)).astype(np.float32), _F32_MAX)
        else:
            if pts is not None and not pts > 0:  # a zero tensor: 0/0 scales
                return None
            bscale = (bmax / _FP4_MAX).astype(np.float32)
            if pts is not None:
                bscale = (bscale / pts).astype(np.float32)
            scales = _e4m3_lookup(np.clip(bscale, _E4M3_TINY, _E4M3_MAX))
            sf = _e4m3_scale_table().take(scales)
            one = _F32(1.0) if pts is None else _F32(_F32(1.0) / pts)
            enc = (one / sf).astype(np.float32)
        if not np.isfinite(enc).all():  # 0 * inf would be NaN
            return None
        dscale = sf if pts is None else (pts * sf).astype(np.float32)
    table = _element_table(FP4_E2M1, convention)
    codes = np.empty(x2.shape, np.uint8)
    values = np.empty(x2.shape, np.float32)

    def work(r0, r1):
        with np.errstate(over="ignore", under="ignore"):  # per thread
            _scaled_elements(x2[r0:r1], enc[r0:r1], dscale[r0:r1], table, codes[r0:r1], values[r0:r1])

    _in_parallel(work, *x2.shape)
    return pts, scales, codes, values
