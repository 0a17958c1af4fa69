"""FP8 current scaling, bit for bit: each tensor is scaled by its own amax, computed just before the
cast, as torchao's ``float8`` training does (or Transformer Engine's current-scaling kernel, with
``convention="te"``). ``current_scale`` turns amaxes into scales (optionally powers of two);
``current_quantize`` quantizes a tensor, per tensor or per row, NaN patterns included. The
formulas and their sources are told in ``ampviz.formats.fp8``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ampviz.formats.catalog import FP8_E4M3
from ampviz.formats.fp8.common import _F32, _FLT_MAX, _amaxes, _choice, _flag, _float32, _fp8_format, _readonly
from ampviz.formats.inputs import _TORCH_MAX_NAN
from ampviz.formats.spec import FloatFormat

#: Current-scaling granularities: one scale per tensor, or one per row (last axis).
GRANULARITIES = ("tensorwise", "rowwise")
#: Whose current-scaling formula: torchao's ``amax_to_scale`` or Transformer Engine's kernel.
CONVENTIONS = ("torchao", "te")
#: torchao's floor on the amax (``float8_utils.EPS``).
EPS = 1e-12


# ------------------------------------------------------------------ current scaling
def _pow2_floor_torchao(scale: np.ndarray) -> np.ndarray:
    """torchao's ``exp2(floor(log2(scale)))`` on float32 scales. Its float32 log2 rounds a scale
    just below 2**k to k, so such a scale rounds *up* to 2**k; the float32 rounding of an accurate
    log2 gives the same floors (checked against torch on every scale within 2**16 ulps of a power
    of two), and ``ldexp`` builds the power exactly."""
    s = np.asarray(scale, np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        lg = np.log2(s.astype(np.float64)).astype(np.float32)
        k = np.floor(lg)
        finite = np.isfinite(k)
        out = np.ldexp(np.float32(1), np.where(finite, k, 0).astype(np.int32)).astype(np.float32)
    return np.where(finite, out, np.where(np.isnan(k), np.float32(np.nan), np.where(k > 0, np.inf, 0))).astype(
        np.float32)


def _pow2_floor_bits(scale: np.ndarray) -> np.ndarray:
    """Transformer Engine's power-of-two scale: the float32 bits with the mantissa cleared."""
    s = np.ascontiguousarray(scale, np.float32)
    return (s.view(np.uint32) & np.uint32(0xFF800000)).view(np.float32)


def _current_scale(a: np.ndarray, f: FloatFormat, pow2: bool, convention: str) -> np.ndarray:
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        if convention == "torchao":
            # amax.to(float64); finfo.max / clamp(amax, min=EPS); .to(float32)
            res = (np.float64(f.max) / np.maximum(a.astype(np.float64), EPS)).astype(np.float32)
            res = _pow2_floor_torchao(res) if pow2 else res
            return np.where(np.isnan(a), a, res).astype(np.float32)  # torch keeps the amax's NaN, sign and all
        # Transformer Engine: amax clamped up to epsilon (0); 0, inf, NaN -> 1; max / amax in float32
        ok = np.isfinite(a) & (a > 0)
        res = np.where(ok, _F32(f.max) / np.where(ok, a, _F32(1)), _F32(1)).astype(np.float32)
        res = np.where(np.isinf(res), _FLT_MAX, res).astype(np.float32)
        return _pow2_floor_bits(res) if pow2 else res


def current_scale(amax, fmt=FP8_E4M3, round_to_power_of_2=False, convention="torchao"):
    """The current-scaling scale(s) for ``amax`` (a number or an array of them, >= 0), float32.

    ``convention="torchao"``: torchao 0.18's ``amax_to_scale(amax, dtype, round_scales_to_power_of_2)``
    bit for bit: ``f32(max / max(amax, 1e-12))`` computed in float64, then (optionally)
    ``exp2(floor(log2(scale)))`` in float32, which turns a scale just below a power of two into that
    power; a NaN amax gives that NaN, sign and payload. ``convention="te"``: Transformer Engine's
    ``compute_scale_from_amax``: 0, inf and NaN amaxes give 1, otherwise ``max / amax`` in float32
    (inf becomes float32's max), and powers of two by clearing the mantissa (an exact floor).
    Returns a Python float for a single number, else a read-only float32 array of amax's shape.
    """
    f = _fp8_format(fmt)
    pow2 = _flag("round_to_power_of_2", round_to_power_of_2)
    convention = _choice("convention", convention, CONVENTIONS)
    a = _amaxes(amax, "amax")
    res = _current_scale(a, f, pow2, convention)
    if res.ndim == 0:
        return float(res)
    return _readonly(res)


class CurrentScaled(NamedTuple):
    """A tensor quantized with current scaling: ``amax`` and ``scale`` (float32; a 0-d array for
    ``"tensorwise"``, shape ``(..., 1)`` for ``"rowwise"``, as torchao keeps them), ``data`` (the FP8
    values, float32, of x's shape), ``codes`` (their bit patterns, uint8, as torch's cast writes
    them: NaN is 0x7F or 0xFF in both formats) and ``dequantized`` (``data / scale``, float32, as
    torchao's ``to_original_precision``)."""

    amax: np.ndarray
    scale: np.ndarray
    data: np.ndarray
    codes: np.ndarray
    dequantized: np.ndarray


def current_quantize(x, fmt=FP8_E4M3, granularity="tensorwise", round_to_power_of_2=False,
                     convention="torchao") -> CurrentScaled:
    """Quantize ``x`` (at least 1-D for ``"rowwise"``) with current scaling, as torchao's
    ``hp_tensor_to_float8_dynamic`` does on the CPU: amax = max |x| (per row for ``"rowwise"``;
    NaN propagates), ``scale = current_scale(amax, ...)``, data = saturating cast of
    ``f32(x * scale)`` (clamped to ±max, NaN stays NaN).

    NaN, bit for bit as torch 2.13 writes it: ``max`` over a whole tensor of two elements or more
    gives the negative NaN 0xFFFFFFFF (its vectorized max ORs an all-ones mask in), so a tensorwise
    scale is that NaN and every code 0xFF; ``amax`` along rows gives the positive 0x7FC00000
    (codes 0x7F); a lone element gives its own |NaN|. The one place not reproduced: an element that
    is NaN itself under a NaN scale of the other sign, where torch's multiply keeps the scale's NaN
    in its vectorized loop but may keep the element's in the loop's remainder (its last few
    elements, as many as the processor's vector width leaves); here it is always the scale's."""
    f = _fp8_format(fmt)
    granularity = _choice("granularity", granularity, GRANULARITIES)
    pow2 = _flag("round_to_power_of_2", round_to_power_of_2)
    convention = _choice("convention", convention, CONVENTIONS)
    x32 = _float32(x, "x")
    if x32.size == 0:
        raise ValueError("x must not be empty: there is no amax to scale by")
    if granularity == "rowwise" and x32.ndim == 0:
        raise ValueError("x must be at least 1-D for rowwise scaling (one scale per row, along the last axis)")
    ax = np.abs(x32)
    with np.errstate(over="ignore", invalid="ignore"):  # x * scale may overflow: the clamp saturates it
        amax = np.max(ax, axis=None if granularity == "tensorwise" else -1, keepdims=granularity != "tensorwise")
        amax = np.asarray(amax, np.float32)  # np.max propagates NaN; torch's NaN bits follow
        if granularity == "rowwise":
            amax = np.where(np.isnan(amax), _F32(np.nan), amax).astype(np.float32)  # 0x7FC00000
        elif np.isnan(amax):
            amax = np.asarray(_TORCH_MAX_NAN if x32.size > 1 else ax.reshape(()), np.float32)
        scale = _current_scale(amax, f, pow2, convention)
        y = np.where(np.isnan(scale), scale, x32 * scale)  # a NaN scale's NaN wins, as in torch's vector loop
        y = np.clip(y, -_F32(f.max), _F32(f.max))
    data = np.asarray(f.quantize(y), np.float32)
    codes = np.asarray(f.encode(y)).astype(np.uint8)
    # NaN: torch's cast writes 0x7F (with the sign) in both formats (ml_dtypes' E5M2 NaN is 0x7E)
    codes = np.where(np.isnan(y), np.uint8(0x7F) | (np.signbit(y).astype(np.uint8) << 7), codes).astype(np.uint8)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        deq = (data / scale).astype(np.float32)
    return CurrentScaled(*(_readonly(np.asarray(v, dt)) for v, dt in (
        (amax, np.float32), (scale, np.float32), (data, np.float32), (codes, np.uint8), (deq, np.float32))))
