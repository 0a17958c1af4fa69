"""Transformer Engine's scaling recipes, one function each: how ``Float8CurrentScaling``,
``Float8BlockScaling``, ``MXFP8BlockScaling`` and ``NVFP4BlockScaling`` quantize a float32 tensor,
with the scales they store, the values read back, and how many values saturated or underflowed.

Modelled, not run: Transformer Engine needs CUDA. Each function transcribes the source of one
release, v2.18 (commit 27486e03cfc1fa41f6932dcecdc47c71c47eac3e), into numpy; the tests write each
formula again, independently, and compare bit for bit. The input is read as float32 (TE's
``IType`` float), one device (no amax reduction across a process group), and the rowwise usage
(a recipe's columnwise copy is the same rule applied to ``x.T``).

* ``te_current_scaling``: one scale per tensor. amax = max |x| with ``fmaxf`` (NaN dropped);
  ``compute_scale_from_amax`` (``common/recipe/recipe_common.cuh``): amax raised to
  ``amax_epsilon``; amax 0, inf or NaN gives scale 1; else ``max / amax`` in float32, inf
  becoming float32's max; power of two by clearing the mantissa bits. ``scale_inv`` =
  ``__frcp_rn(scale)``. The cast saturates (``satfinite``), E5M2 too.
* ``te_float8_block_scaling``: the same scale rule per block, 1×128 (``block_dim=1``,
  activations and gradients) or 128×128 (``block_dim=2``, weights), powers of two by default.
* ``te_mxfp8``: blocks of 32, E8M0 scale ``float_to_e8m0(amax * f32(1 / max))``, the product's
  power of two rounded *up* (``cvt.rp.satfinite.ue8m0x2.f32``); not torchao's ``amax / max``.
* ``te_nvfp4``: E2M1 in 1×16 blocks (or 16×16 tiles for weights), E4M3 block scales, float32
  tensor scale, as TE's reference quantizer; optional Hadamard transform and stochastic rounding.

Inputs are numbers, lists, numpy arrays or torch tensors. Results are ``TEQuantized``
NamedTuples of read-only numpy arrays. This module needs numpy only.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import numpy as np

from ampviz.formats.blocks.common import _element_codes, _element_values
from ampviz.formats.blocks.hadamard import random_hadamard_transform
from ampviz.formats.blocks.nvfp4 import _e4m3_codes, _e4m3_scale_values
from ampviz.formats.blocks.stochastic import _generator
from ampviz.formats.catalog import FP4_E2M1, FP8_E4M3
from ampviz.formats.fp8.common import _F32, _FLT_MAX, _choice, _flag, _float32, _fp8_format, _readonly
from ampviz.formats.fp8.current import _pow2_floor_bits
from ampviz.formats.inputs import _describe

#: The Transformer Engine release these models follow.
TE_RELEASE = ("v2.18", "27486e03cfc1fa41f6932dcecdc47c71c47eac3e")
#: ``te_nvfp4`` tile shapes: 1×16 (activations, gradients) or 16×16 (weights).
NVFP4_TILES = ("1x16", "16x16")


class TEQuantized(NamedTuple):
    """What a recipe stores and reads back (read-only arrays).

    ``scales``: per block (shape: x's leading axes, then one per block; a 0-d array per tensor),
    float32 ``scale_inv`` (the FP8 recipes), uint8 E8M0 patterns (MXFP8) or uint8 E4M3 patterns
    (NVFP4). ``data``: the stored element values, float32, x's shape. ``dequantized``: what the
    recipe reads back, float32. ``saturated``: finite values clamped to the element format's max.
    ``underflowed``: finite nonzero values stored as 0. ``tensor_scale``: NVFP4's float32 decode
    scale (1 / encode scale), else None."""

    scales: np.ndarray
    data: np.ndarray
    dequantized: np.ndarray
    saturated: int
    underflowed: int
    tensor_scale: np.float32 | None = None


# ------------------------------------------------------------------ shared rules
def _epsilon(amax_epsilon) -> np.float32:
    if isinstance(amax_epsilon, (bool, np.bool_)) or not isinstance(amax_epsilon, numbers.Real):
        raise TypeError(f"amax_epsilon must be a number >= 0 (the recipe's default is 0.0), not "
                        f"{_describe(amax_epsilon)}")
    with np.errstate(over="ignore"):
        e = _F32(float(amax_epsilon))
    if not (np.isfinite(e) and e >= 0):
        raise ValueError(f"amax_epsilon must be a finite number >= 0 (default 0.0), not {amax_epsilon!r}")
    return e


def _input(x, fn: str, min_ndim: int) -> np.ndarray:
    x32 = _float32(x, f"{fn}: x")
    if x32.ndim < min_ndim:
        raise ValueError(f"{fn}: x must have at least {min_ndim} axis{'es' if min_ndim > 1 else ''}, "
                         f"got shape {x32.shape}")
    if x32.size == 0:
        raise ValueError(f"{fn}: x must not be empty: there is no amax to scale by")
    return x32


def _fmax_abs(x: np.ndarray, axis=None) -> np.ndarray:
    """max |x| as CUDA's ``fmaxf`` folds it from 0: NaNs are dropped (all NaN gives 0)."""
    return np.fmax.reduce(np.abs(x), axis=axis, initial=_F32(0.0)).astype(np.float32)


def _te_scale(amax: np.ndarray, fmax: float, pow2: bool, eps: np.float32) -> np.ndarray:
    """``compute_scale_from_amax`` (recipe_common.cuh), value_for_inf = float32's max."""
    a = np.asarray(amax, np.float32)
    a = np.where(a < eps, eps, a).astype(np.float32)  # NaN < eps is false: NaN stays
    ok = np.isfinite(a) & (a != 0)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        s = np.where(ok, _F32(fmax) / np.where(ok, a, _F32(1)), _F32(1)).astype(np.float32)
    s = np.where(np.isinf(s), _FLT_MAX, s).astype(np.float32)
    return _pow2_floor_bits(s).reshape(s.shape) if pow2 else s


def _saturating_cast(y: np.ndarray, f) -> tuple[np.ndarray, np.ndarray]:
    """(values, clamped mask) of ``static_cast<fp8>(y)``: round to nearest even, ``satfinite``."""
    top = _F32(f.max)
    clamped = np.abs(y) > top  # NaN compares false
    return np.asarray(f.quantize(np.clip(y, -top, top)), np.float32), clamped


def _counts(x: np.ndarray, data: np.ndarray, clamped: np.ndarray) -> tuple[int, int]:
    finite = np.isfinite(x)
    return int((clamped & finite).sum()), int((finite & (x != 0) & (data == 0)).sum())


# ------------------------------------------------------------------ Float8CurrentScaling
def te_current_scaling(x, fmt=FP8_E4M3, power_2_scale=False, amax_epsilon=0.0) -> TEQuantized:
    """Transformer Engine v2.18's ``Float8CurrentScaling`` quantizer on one device.

    Follows ``compute_amax`` (``common/recipe/current_scaling.cu``: ``fmaxf(fabsf(val), max)``,
    so a NaN element does not reach the amax), ``compute_scale_from_amax_kernel`` calling
    ``compute_scale_from_amax`` (``common/recipe/recipe_common.cuh``) and the cast in
    ``common/cast/fp8/quantize_fp8.cuh`` (``scale_inv = reciprocal<float>(scale)``, i.e.
    ``__frcp_rn``). The recipe (``common/recipe/__init__.py``: ``Float8CurrentScaling``) uses
    ``amax_epsilon=0.0`` and power-of-two scales only with ``NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES=1``;
    HYBRID sends activations and weights to E4M3, gradients to E5M2 (``fmt``).

    ``scales``: the 0-d float32 ``scale_inv``; ``dequantized`` = data * scale_inv."""
    f = _fp8_format(fmt)
    pow2 = _flag("power_2_scale", power_2_scale)
    eps = _epsilon(amax_epsilon)
    x32 = _input(x, "te_current_scaling", 0)
    scale = _te_scale(_fmax_abs(x32), f.max, pow2, eps)
    with np.errstate(over="ignore", invalid="ignore"):
        data, clamped = _saturating_cast((x32 * scale).astype(np.float32), f)
        scale_inv = (_F32(1) / scale).astype(np.float32)
        deq = (data * scale_inv).astype(np.float32)
    return TEQuantized(_readonly(scale_inv), _readonly(data), _readonly(deq), *_counts(x32, data, clamped))


# ------------------------------------------------------------------ Float8BlockScaling
def te_float8_block_scaling(x, fmt=FP8_E4M3, block_dim=1, power_2_scale=True, amax_epsilon=0.0) -> TEQuantized:
    """Transformer Engine v2.18's ``Float8BlockScaling`` quantizer, rowwise usage.

    ``block_dim=1``: blocks of 1×128 along the last axis (``x_block_scaling_dim`` and
    ``grad_block_scaling_dim``, kernel ``block_scaled_1d_cast_transpose_kernel`` in
    ``common/transpose/quantize_transpose_vector_blockwise.cu``). ``block_dim=2``: 128×128 tiles
    over (leading axes flattened into rows, last axis) (``w_block_scaling_dim``, kernel
    ``block_scaled_cast_transpose_kernel`` in ``quantize_transpose_square_blockwise.cu``). Each
    block: amax by ``fmaxf`` (NaN dropped), scale by ``compute_scale_from_types`` →
    ``compute_scale_from_amax`` (recipe_common.cuh: 0/inf/NaN amax → 1, ``max / amax`` in
    float32, power of two by clearing the mantissa: the recipe's default, off only with
    ``NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1``), ``scale_inv = 1.0 / scale``, data the saturating
    cast of ``x * scale``. A block cut short by the tensor's edge is scaled from the values it has.

    ``scales``: float32 ``scale_inv`` per block; ``dequantized`` = data * scale_inv."""
    f = _fp8_format(fmt)
    pow2 = _flag("power_2_scale", power_2_scale)
    eps = _epsilon(amax_epsilon)
    if isinstance(block_dim, (bool, np.bool_)) or block_dim not in (1, 2):
        raise ValueError(f"block_dim must be 1 (1x128 blocks) or 2 (128x128 tiles), not {_describe(block_dim)}")
    x32 = _input(x, "te_float8_block_scaling", int(block_dim))
    n = x32.shape[-1]
    nb = -(-n // 128)
    if block_dim == 1:
        xp = np.zeros(x32.shape[:-1] + (nb * 128,), np.float32)  # zeros leave every amax as it was
        xp[..., :n] = x32
        blocks = xp.reshape(x32.shape[:-1] + (nb, 128))
        scale = _te_scale(_fmax_abs(blocks, -1), f.max, pow2, eps)
        full = np.repeat(scale, 128, axis=-1)[..., :n]
    else:
        m = int(np.prod(x32.shape[:-1]))
        mb = -(-m // 128)
        xp = np.zeros((mb * 128, nb * 128), np.float32)
        xp[:m, :n] = x32.reshape(m, n)
        tiles = xp.reshape(mb, 128, nb, 128)
        scale = _te_scale(_fmax_abs(tiles, (1, 3)), f.max, pow2, eps)
        full = np.repeat(np.repeat(scale, 128, axis=0), 128, axis=1)[:m, :n].reshape(x32.shape)
    with np.errstate(over="ignore", invalid="ignore"):
        data, clamped = _saturating_cast((x32 * full).astype(np.float32), f)
        scale_inv = (_F32(1) / scale).astype(np.float32)
        deq = (data * (_F32(1) / full)).astype(np.float32)  # each block's scale_inv
    return TEQuantized(_readonly(scale_inv), _readonly(data), _readonly(deq), *_counts(x32, data, clamped))


# ------------------------------------------------------------------ MXFP8BlockScaling
def _float_to_e8m0(v: np.ndarray) -> np.ndarray:
    """``ptx::float_to_e8m0`` (``common/util/ptx.cuh``), its software path bit for bit: NaN →
    0xFF, inf → 0xFE, 0 → 0; else the biased exponent, plus one when the mantissa is nonzero
    (not past 0xFE; a subnormal at most 2**-127 stays 0). The exact power of two rounded up."""
    v = np.ascontiguousarray(v, np.float32)
    bits = v.view(np.uint32)
    e = ((bits >> 23) & 0xFF).astype(np.int64)
    mant = (bits & 0x7FFFFF).astype(np.int64)
    up = (mant > 0) & (e != 0xFE) & ~((e == 0) & (mant <= 0x400000))
    code = e + up
    code = np.where(v == 0, 0, code)
    code = np.where(np.isinf(v), 0xFE, code)
    return np.where(np.isnan(v), 0xFF, code).astype(np.uint8)


def te_mxfp8(x, fmt=FP8_E4M3) -> TEQuantized:
    """Transformer Engine v2.18's ``MXFP8BlockScaling`` quantizer, rowwise usage (blocks of 32
    along the last axis; the columnwise copy is ``te_mxfp8(x.T)``).

    Follows ``quantize_mxfp8_kernel`` (``common/cast/mxfp8/quantize_mxfp8.cuh``): block amax by
    ``fmaxf(thread_amax, fabsf(elt))`` (NaN dropped); ``biased_exponent =
    ptx::float_to_e8m0(thread_amax * Quantized_Limits<OType>::max_norm_rcp)``, the float32 product
    with the float32 reciprocal of max (``common/utils.cuh``), rounded up to a power of two
    (``cvt.rp.satfinite.ue8m0x2.f32`` on Blackwell, the same in software elsewhere: round up, not
    OCP's floor); elements ``static_cast<OType>(in * ptx::exp2f_rcp<float>(biased_exponent))``
    (``exp2f_rcp``: 2**(127 - e), 2**-127 for 254; for 0 it gives 2**127), a saturating cast.
    The recipe's default format is E4M3 for every tensor (``fmt``).

    ``scales``: uint8 E8M0 patterns per block. ``dequantized``: ``dequantize_mxfp8_kernel``
    (``common/cast/mxfp8/dequantize_mxfp8.cuh``): data * ``ptx::exp2f(e)``, the float32 with
    exponent field e, so pattern 0 reads back as 0 (not 2**-127)."""
    f = _fp8_format(fmt)
    x32 = _input(x, "te_mxfp8", 1)
    n = x32.shape[-1]
    if n % 32:
        raise ValueError(f"te_mxfp8: the last axis ({n} values) must be a multiple of 32, the MX block size")
    blocks = x32.reshape(x32.shape[:-1] + (n // 32, 32))
    rcp = _F32(1.0 / f.max)  # static constexpr float max_norm_rcp = 1.0 / max_norm
    with np.errstate(over="ignore", invalid="ignore"):
        codes = _float_to_e8m0((_fmax_abs(blocks, -1) * rcp).astype(np.float32))
        c = codes.astype(np.int64)[..., None]
        mult = np.where(c == 254, _F32(2.0**-127), np.ldexp(_F32(1), (127 - np.minimum(c, 253)).astype(np.int32)))
        mult = np.where(c == 255, _F32(np.nan), mult).astype(np.float32)
        data, clamped = _saturating_cast((blocks * mult).astype(np.float32), f)
        back = (c << 23).astype(np.uint32).view(np.float32)  # ptx::exp2f
        deq = (data * back).astype(np.float32)
    return TEQuantized(_readonly(codes), _readonly(data.reshape(x32.shape)), _readonly(deq.reshape(x32.shape)),
                       *_counts(blocks, data, clamped))


# ------------------------------------------------------------------ NVFP4BlockScaling
def te_nvfp4(x, tile="1x16", rht=False, rng=None) -> TEQuantized:
    """Transformer Engine v2.18's ``NVFP4BlockScaling``, as its reference quantizer computes it
    (``pytorch/custom_recipes/quantization_ref_nvfp4.py``: ``NVFP4QuantizerRef._quantize`` and
    ``_quantize_blockwise_reference``), on a 2-D x (leading axes flattened into rows).

    Encode scale ``S_enc = min(448 * 6 / global_amax, f32 max)`` (0 → 1), ``S_dec = 1 / S_enc``;
    per block ``dec = e4m3(clamp(min(vec_max * (S_enc * (1/6)), f32 max), ±448))``, ``enc =
    min(1 / (dec * S_dec), f32 max)``; elements ``e2m1(clamp(x * enc, ±6))``. ``tile="1x16"``:
    vec_max per 16 values of a row (activations, gradients); ``"16x16"``: one amax per 16×16 tile
    (the recipe's weights, ``fp4_2d_quantization``), broadcast to its rows. ``rht``: the 16-point
    random Hadamard transform first (``_apply_rht``, TE's fixed signs; the recipe applies it to the
    columnwise copy of inputs and gradients, i.e. to ``x.T``), the amax taken after it. ``rng``:
    round the elements stochastically (the recipe's gradients; the kernel's
    ``cvt.rs.satfinite.e2m1x4.f32``; the reference has no such path, so only the mean is exact).
    The recipe's 4over6 and row-scaled options (off by default) are not modelled.

    ``scales``: uint8 E4M3 patterns per block (per row block of a 16×16 tile); ``tensor_scale``:
    S_dec; ``dequantized`` = e2m1 value * (S_dec * dec) (in the transformed basis when ``rht``).
    NaN amaxes propagate as torch's ``amax`` does (no NaN bit patterns are reproduced)."""
    tile = _choice("tile", tile, NVFP4_TILES)
    rht = _flag("rht", rht)
    rng = _generator(rng, "te_nvfp4")
    x32 = _input(x, "te_nvfp4", 2 if tile == "16x16" else 1)
    n = x32.shape[-1]
    m = int(np.prod(x32.shape[:-1]))
    if n % 16 or (tile == "16x16" and m % 16):
        raise ValueError(f"te_nvfp4: x of shape {x32.shape} must have a last axis (and, for 16x16 tiles, "
                         f"a row count) that is a multiple of 16")
    x2 = x32.reshape(m, n)
    if rht:
        x2 = np.asarray(random_hadamard_transform(x2), np.float32)
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        amax_t = _F32(np.max(np.abs(x2)))
        s_enc = min(_F32(_F32(448.0 * 6.0) / amax_t), _FLT_MAX) if not np.isnan(amax_t) else _F32(np.nan)
        s_enc = _F32(1.0) if s_enc == 0 else _F32(s_enc)
        s_dec = _F32(_F32(1.0) / s_enc)
        xb = x2.reshape(m, n // 16, 16)
        if tile == "1x16":
            vec_max = np.max(np.abs(xb), axis=-1)
        else:
            vec_max = np.repeat(np.max(np.abs(x2.reshape(m // 16, 16, n // 16, 16)), axis=(1, 3)), 16, axis=0)
        dec = (vec_max.astype(np.float32) * _F32(s_enc * np.reciprocal(_F32(6.0)))).astype(np.float32)
        dec = np.where(np.isnan(dec), dec, np.minimum(dec, _FLT_MAX))
        scales = _e4m3_codes(np.clip(dec, -_F32(448), _F32(448)))
        sf = _e4m3_scale_values(scales)
        enc = np.minimum((_F32(1.0) / (sf * s_dec)).astype(np.float32), _FLT_MAX)
        y = (xb * enc[..., None]).astype(np.float32)
        clamped = np.abs(y) > _F32(6.0)
        codes = _element_codes(FP4_E2M1, np.clip(y, -_F32(6.0), _F32(6.0)), rng)
        codes = np.where((codes == 0x8) & (y == 0) | np.isnan(y), 0, codes).astype(np.uint8)
        data = _element_values(FP4_E2M1, codes)
        deq = (data * (s_dec * sf)[..., None]).astype(np.float32)
    sat, under = _counts(xb, data, clamped)
    return TEQuantized(_readonly(scales.reshape(x32.shape[:-1] + (n // 16,))), _readonly(data.reshape(x32.shape)),
                       _readonly(deq.reshape(x32.shape)), sat, under, _F32(s_dec))


__all__ = ["TE_RELEASE", "NVFP4_TILES", "TEQuantized", "te_current_scaling", "te_float8_block_scaling",
           "te_mxfp8", "te_nvfp4"]
