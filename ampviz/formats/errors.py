"""Every format's error at equal bits (lesson 13), numpy only: ``scheme_bits``, ``relative_error``,
``format_error``, ``format_error_table`` (what fp8 with a scale per tensor, MX and NVFP4 block
scaling do to a tensor, scales included) and the lesson's ``check_*`` questions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ampviz.checks import Check, Choice, check
from ampviz.formats import get_format
from ampviz.formats.lesson import _brief, _close
from ampviz.text import Table

__all__ = ['ERROR_SCHEMES', 'DEFAULT_ERROR_SCHEMES', 'DEFAULT_MX_ROUNDING', 'FormatError', 'scheme_bits', 'relative_error', 'format_error', 'format_error_table', 'check_mx_floor_value', 'check_outlier_survivors', 'check_nvfp4_bits', 'check_single_level_value', 'check_why_mx_block_survives_outlier', 'check_why_mx_nvfp4_tensor_scale', 'check_why_mx_floor_saturates']


# --------------------------------------------------------------------------------------------
# Block formats: the error of every format at equal bits
# --------------------------------------------------------------------------------------------

#: The schemes ``format_error`` knows: a plain cast (bf16, fp16), FP8 with one float32 scale per
#: tensor (torchao's current scaling, ``ampviz.formats.fp8.current_quantize``), OCP MX with blocks of 32
#: and E8M0 scales (``ampviz.formats.blocks.mx_quantize``) and NVFP4 (``ampviz.formats.blocks.nvfp4_quantize``).
ERROR_SCHEMES = {
    "bf16": "bf16, cast",
    "fp16": "fp16, cast",
    "fp8_e4m3": "fp8 E4M3, one scale per tensor",
    "fp8_e5m2": "fp8 E5M2, one scale per tensor",
    "mxfp8_e4m3": "MXFP8 E4M3",
    "mxfp8_e5m2": "MXFP8 E5M2",
    "mxfp6_e3m2": "MXFP6 E3M2",
    "mxfp6_e2m3": "MXFP6 E2M3",
    "mxfp4": "MXFP4 E2M1",
    "nvfp4": "NVFP4",
}
#: The schemes ``format_error_table`` compares unless told otherwise.
DEFAULT_ERROR_SCHEMES = ("fp8_e4m3", "fp8_e5m2", "mxfp8_e4m3", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4", "nvfp4")
_MX_ELEMENT = {"mxfp8_e4m3": "fp8_e4m3", "mxfp8_e5m2": "fp8_e5m2", "mxfp6_e3m2": "fp6_e3m2",
               "mxfp6_e2m3": "fp6_e2m3", "mxfp4": "fp4_e2m1"}
MX_BLOCK, NVFP4_BLOCK = 32, 16
#: How MX picks its block scales unless told otherwise: "rceil", as torchao's MXFP8 training config
#: (``MXFP8TrainingOpConfig.scale_calculation_mode``) and MX inference config
#: (``MXDynamicActivationMXWeightConfig.scaling_mode``) do by default. (torchao's lower-level
#: ``to_mx`` and ``MXTensor.to_mx`` default to the OCP rule, "floor", as ``mx_quantize`` does.)
DEFAULT_MX_ROUNDING = "rceil"


@dataclass(frozen=True, eq=False)
class FormatError:
    """How one scheme stores one tensor: ``bits`` per element, the scales' share included;
    ``error``, the relative error RMS(q - x) / RMS(x) of the dequantized values q; ``flushed``,
    the share of nonzero values that become 0; ``saturated``, the share of values more than half a
    step past the largest magnitude their block (or tensor) holds, which the clamp to that
    magnitude decided, not the rounding (in bf16 and fp16 they become inf); ``values``, q
    (float32, x's shape)."""

    scheme: str
    bits: float
    error: float
    flushed: float
    saturated: float
    values: np.ndarray


def _scheme(scheme) -> str:
    if not isinstance(scheme, str) or scheme not in ERROR_SCHEMES:
        raise ValueError(f"scheme must be one of {', '.join(map(repr, ERROR_SCHEMES))}, got {_brief(scheme)}")
    return scheme


def scheme_bits(scheme, n) -> float:
    """Bits per element of a tensor of ``n`` elements stored in ``scheme``, its scales included:
    16 for bf16 and fp16; 8 + 32/n for fp8 with a float32 scale per tensor; element bits + 8/32
    for MX (an E8M0 scale per 32 elements); 4 + 8/16 + 32/n for NVFP4 (an E4M3 scale per 16
    elements and a float32 scale per tensor)."""
    scheme = _scheme(scheme)
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be the number of elements, a positive int, got {_brief(n)}")
    n = int(n)
    if scheme in ("bf16", "fp16"):
        return 16.0
    if scheme in ("fp8_e4m3", "fp8_e5m2"):
        return 8 + 32 / n
    if scheme == "nvfp4":
        return 4 + 8 / NVFP4_BLOCK + 32 / n
    return get_format(_MX_ELEMENT[scheme]).bits + 8 / MX_BLOCK


def _half_step_past(fmt) -> float:
    """The format's max plus half the gap to the value that would follow it (E4M3: 448 + 16):
    where round to nearest would leave max behind if the format went on."""
    return fmt.max + 2.0 ** (math.floor(math.log2(fmt.max)) - fmt.mantissa_bits - 1)


def _dequantized(x32: np.ndarray, scheme: str, rounding: str):
    """(dequantized float32 values, float64 magnitudes beyond which each element is saturated:
    half a step past the largest value its block or tensor holds)."""
    from ampviz.formats.blocks import mx_quantize, nvfp4_quantize
    from ampviz.formats import FP4_E2M1, FP8_E4M3
    from ampviz.formats.fp8 import current_quantize

    if scheme in ("bf16", "fp16"):
        fmt = get_format(scheme)
        return np.asarray(fmt.quantize(x32), np.float32), np.full(x32.shape, _half_step_past(fmt))
    if scheme in ("fp8_e4m3", "fp8_e5m2"):
        fmt = get_format(scheme)
        q = current_quantize(x32, fmt)
        return q.dequantized, np.full(x32.shape, _half_step_past(fmt) / np.float64(q.scale))
    if scheme == "nvfp4":
        q = nvfp4_quantize(x32)
        with np.errstate(over="ignore", under="ignore"):
            block = np.asarray(FP8_E4M3.decode(q.scales.astype(np.int64)), np.float32)
            if q.tensor_scale is not None:
                block = (q.tensor_scale * block).astype(np.float32)  # as the dequantize multiplies
        return q.values, np.repeat(_half_step_past(FP4_E2M1) * block.astype(np.float64), NVFP4_BLOCK, axis=-1)
    fmt = get_format(_MX_ELEMENT[scheme])
    q = mx_quantize(x32, fmt, MX_BLOCK, rounding)
    top = np.ldexp(_half_step_past(fmt), q.scales.astype(np.int32) - 127)
    return q.values, np.repeat(top, MX_BLOCK, axis=-1)


def _tensor(x, what: str, block: int) -> np.ndarray:
    from ampviz.formats import _real_array

    arr = _real_array(x, what)
    if arr.ndim == 0 or arr.size == 0:
        raise ValueError(f"{what} must be a non-empty array (blocks run along its last axis), got shape {arr.shape}")
    with np.errstate(over="ignore", invalid="ignore"):
        x32 = arr.astype(np.float32)
    if not np.isfinite(x32).all():
        raise ValueError(f"{what} must hold finite numbers (in float32): an inf or NaN makes every error inf or NaN")
    if not x32.any():
        raise ValueError(f"{what} is all zeros: its relative error is 0/0; pass a tensor with a nonzero value")
    if x32.shape[-1] % block:
        raise ValueError(f"{what}: the last axis ({x32.shape[-1]} values) must be a multiple of {block} for "
                         f"these schemes' blocks; pass a weight or gradient whose rows are, or pad them")
    return x32


def _rounding(rounding) -> str:
    from ampviz.formats.blocks import MX_ROUNDING

    if isinstance(rounding, str) and rounding in MX_ROUNDING:
        return rounding
    raise ValueError(f"rounding must be one of {', '.join(map(repr, MX_ROUNDING))} (how MX picks a block's "
                     f"scale), got {_brief(rounding)}")


def _block_of(schemes) -> int:
    if any(s in _MX_ELEMENT for s in schemes):
        return MX_BLOCK
    return NVFP4_BLOCK if "nvfp4" in schemes else 1


def format_error(x, scheme, *, rounding=DEFAULT_MX_ROUNDING) -> FormatError:
    """What ``scheme`` (one of ``ERROR_SCHEMES``) does to the tensor ``x`` (float32 first; blocks
    run along its last axis, which must be a multiple of 32 for MX and 16 for NVFP4).
    ``rounding``: how MX picks a block's scale: "rceil" (NVIDIA's rule, the default of torchao's
    MXFP8 training and MX inference configs), "floor" (the OCP MX rule, which can saturate a
    block's largest value), "ceil" or "even"; see ``ampviz.formats.blocks``. FP8 is scaled as
    torchao's tensorwise current scaling, NVFP4 with its float32 tensor scale, as torchao; see
    ``FormatError`` for the numbers."""
    scheme = _scheme(scheme)
    rounding = _rounding(rounding)
    x32 = _tensor(x, "x", _block_of((scheme,)))
    return _format_error(x32, scheme, rounding)


def relative_error(x, q) -> float:
    """RMS(q - x) / RMS(x) of a tensor ``x`` and its dequantized values ``q`` (both read as float32,
    computed in float64): the error of a quantization as a share of the tensor's size."""
    from ampviz.formats import _real_array

    x, q = _real_array(x, "x"), _real_array(q, "q")
    if x.shape != q.shape:
        raise ValueError(f"x and q must have one shape (q: x dequantized), got {x.shape} and {q.shape}")
    # a number past float32's range reads as inf (and the error as inf or NaN), as a cast gives it
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        x64, q64 = x.astype(np.float32).astype(np.float64), q.astype(np.float32).astype(np.float64)
        return math.sqrt(np.sum((q64 - x64) ** 2) / np.sum(x64 ** 2))


def _format_error(x32: np.ndarray, scheme: str, rounding: str) -> FormatError:
    q, top = _dequantized(x32, scheme, rounding)
    x64 = x32.astype(np.float64)
    error = relative_error(x32, q)
    nonzero = x32 != 0
    flushed = np.count_nonzero(nonzero & (q == 0)) / np.count_nonzero(nonzero)
    saturated = np.count_nonzero(np.abs(x64) > top) / x32.size
    values = np.array(q, np.float32)
    values.setflags(write=False)
    return FormatError(scheme, scheme_bits(scheme, x32.size), error, flushed, saturated, values)


def _bits_text(bits: float) -> str:
    return f"{bits:.3f}".rstrip("0").rstrip(".")


def _percent(share: float, digits: int = 2) -> str:
    return f"{100 * share:.{digits}f}%"


def format_error_table(tensors, schemes=DEFAULT_ERROR_SCHEMES, *, rounding=DEFAULT_MX_ROUNDING) -> Table:
    """One row per tensor and scheme: bits per element (scales included), the relative error
    RMS(q - x) / RMS(x) of the dequantized values, and the shares flushed to zero and saturated
    (see ``format_error``). ``tensors``: a dict name -> array (a layer's weights, its gradient);
    ``schemes``: names from ``ERROR_SCHEMES`` (one name, or a list); ``rounding``: MX's scale rule."""
    if not isinstance(tensors, dict) or not tensors:
        raise TypeError(f"tensors must be a non-empty dict name -> array (e.g. {{'weight': w, 'gradient': g}}), "
                        f"got {_brief(tensors)}")
    if isinstance(schemes, str):
        schemes = (schemes,)
    if not isinstance(schemes, (list, tuple)) or not schemes:
        raise TypeError(f"schemes must be a scheme name or a non-empty list of them ({', '.join(ERROR_SCHEMES)}), "
                        f"got {_brief(schemes)}")
    schemes = tuple(_scheme(s) for s in schemes)
    rounding = _rounding(rounding)
    block = _block_of(schemes)
    rows = []
    for name, x in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensors' keys must be names (str), got {_brief(name)}")
        x32 = _tensor(x, f"tensors[{name!r}]", block)
        for s in schemes:
            r = _format_error(x32, s, rounding)
            rows.append((name, ERROR_SCHEMES[s], _bits_text(r.bits), f"{100 * r.error:.3g}%",
                         _percent(r.flushed), _percent(r.saturated)))
    title = "relative error = RMS(dequantized - x) / RMS(x)" + ("" if block == 1 else f"; MX scales: {rounding}")
    return Table(("tensor", "scheme", "bits/element", "relative error", "flushed to 0", "saturated"), rows,
                 title=title)


# ----- 13: MX and NVFP4 block scaling -----
def check_mx_floor_value(answer) -> Check:
    """Q: MXFP8 E4M3 with the OCP floor scale; a block of 32 whose largest value is 500 (the rest
    0): what does 500 dequantize to? 448: the scale is 2^(8 - 8) = 1 and 500 saturates."""
    from ampviz.formats.blocks import mx_quantize

    row = np.zeros(MX_BLOCK, np.float32)
    row[0] = 500.0
    expected = float(mx_quantize(row, "fp8_e4m3", MX_BLOCK, "floor").values[0])
    return check(answer, expected, hint="the floor scale is 2^(floor(log2 amax) - 8); divide 500 by it and "
                                        "compare with E4M3's largest value")


def check_outlier_survivors(answer) -> Check:
    """Q: MXFP4 (floor scale), one block of 32: 31 values 1.0 and one 1024. How many of the 31 ones
    are still nonzero after dequantizing? 0: the scale is 2^(10 - 2) = 256 and 1/256 rounds to 0."""
    from ampviz.formats.blocks import mx_quantize

    row = np.ones(MX_BLOCK, np.float32)
    row[5] = 1024.0
    q = mx_quantize(row, "fp4_e2m1", MX_BLOCK, "floor").values
    expected = int(np.count_nonzero(np.delete(q, 5)))
    return check(answer, expected, hint="find the block's scale from 1024, then what 1.0 divided by it becomes "
                                        "in E2M1, whose smallest nonzero magnitude is 0.5")


def check_nvfp4_bits(answer, n: int = 4096) -> Check:
    """Q: bits per element of NVFP4 for a tensor of ``n`` (4096) elements, both levels of scales
    included: 4 + 8/16 + 32/4096 = 4.5078125 (within 2e-4 of it, relatively)."""
    expected = scheme_bits("nvfp4", n)
    return check(answer, expected, accept=_close(expected, 2e-4),
                 hint="each element's 4 bits, plus its share of an 8-bit scale per 16 elements and of one "
                      "32-bit scale for the whole tensor")


def check_single_level_value(answer) -> Check:
    """Q: NVFP4 without the tensor scale (``per_tensor_scale=False``), a block of 16 values all
    1e-3: what does 1e-3 dequantize to? 0: the block scale 1e-3/6 is below E4M3's 2^-6, where it
    is clamped, and 1e-3 / 2^-6 = 0.064 rounds to 0 in E2M1."""
    from ampviz.formats.blocks import nvfp4_quantize

    expected = float(nvfp4_quantize(np.full(NVFP4_BLOCK, 1e-3, np.float32), per_tensor_scale=False).values[0])
    return check(answer, expected, hint="the block scale is amax / 6, held between E4M3's 2^-6 and 448; divide "
                                        "1e-3 by it and round to E2M1")


# ----- 13: questions that ask why -----
WHY_MX_BLOCK_SURVIVES_OUTLIER = Choice(
    "why_mx_block_survives_outlier",
    "Section 1: with a scale per 32 values, the 2^10 outlier flushes its own block only; with one scale for "
    "all 128 values, it flushes all 127 others. Why?",
    {"a": "each block's scale comes from its own largest value: only the outlier's block gets the scale 2^8, "
          "whose smallest nonzero step is 128; the other blocks keep 2^-1",
     "b": "smaller blocks spend more bits per element, so their values are rounded more finely",
     "c": "the outlier is clamped to its block's largest value, so it no longer sets the scale",
     "d": "a per-block scale can be any float, finer than a per-tensor scale's power of two"},
    "a",
    {"b": "both runs store E2M1 elements, the same 8 magnitudes (section 2): the block size changes how many "
          "values share a scale, not the grid each value is rounded to",
     "c": "block 1's scale is 2^8, set by the outlier itself (section 1's scale exponents): the outlier keeps "
          "its size and sets its block's scale",
     "d": "both runs store E8M0 scales, powers of two (section 1 prints their exponents): only how many values "
          "share one changes"},
)


check_why_mx_block_survives_outlier = WHY_MX_BLOCK_SURVIVES_OUTLIER.checker()


WHY_MX_NVFP4_TENSOR_SCALE = Choice(
    "why_mx_nvfp4_tensor_scale",
    "NVFP4 already gives every block of 16 values its own scale. Why does it also need a float32 scale per "
    "tensor?",
    {"a": "without it, a block's largest value cannot be stored in E2M1",
     "b": "its block scales are E4M3 numbers, which reach only from 2^-9 to 448 (torchao holds them between "
          "2^-6 and 448): a tensor far from size 1 needs block scales outside that range, and the tensor "
          "scale brings them back inside",
     "c": "the tensor scale turns the block scales into powers of two, as in MX"},
    "b",
    {"a": "at size 1 without the tensor scale, each block's scale is still its largest value over 6, and the "
          "error is 10.18%, close to the 9.99% with it (section 5)",
     "c": "NVFP4's block scales are E4M3 numbers with 3 mantissa bits: with the tensor scale they run from "
          "176 to 448 (section 5), not powers of two"},
)


check_why_mx_nvfp4_tensor_scale = WHY_MX_NVFP4_TENSOR_SCALE.checker()


WHY_MX_FLOOR_SATURATES = Choice(
    "why_mx_floor_saturates",
    "In MXFP8 E4M3 the OCP floor rule can clamp a block's largest value to 448; the rceil rule never "
    "clamps one (section 3). Why?",
    {"a": "floor rounds each element down, toward zero, so the largest elements lose the most",
     "b": "an E8M0 scale cannot exceed 1, so a block of large values always saturates",
     "c": "floor aims the largest power of two in amax at E4M3's 2^8, but amax can be up to twice that power "
          "while E4M3's largest value is 1.75 × 2^8 = 448: past 1.75 times its power of two, amax lands "
          "beyond max and is clamped; rceil takes the least scale with amax / scale <= 448",
     "d": "a block's largest value can lie beyond E4M3's range whatever the scale"},
    "c",
    {"a": "every rule rounds the elements to nearest even; floor and rceil name how the scale's exponent is "
          "chosen (section 3)",
     "b": "E8M0 reaches 2^127: for the block with 500, rceil picks the scale 2^1 (section 3)",
     "d": "an E8M0 scale reaches 2^127, so some scale always holds a float32 amax: rceil stores 500 as 512 "
          "with the scale 2^1 (section 3)"},
)


check_why_mx_floor_saturates = WHY_MX_FLOOR_SATURATES.checker()
