"""What the block quantizers (``ampviz.formats.blocks.mx``, ``ampviz.formats.blocks.nvfp4``) and the Hadamard
transform share: their argument checks (x cut into float32 blocks along the last axis, the block
size, a choice among names), read-only results (``_sealed``), and the exact element casts: the bit
patterns torch and torchao write for values already scaled into an element format
(``_element_codes``) and the values of those patterns (``_element_values``).

The rules of MX and NVFP4 themselves are told in ``ampviz.formats.blocks``.
"""

from __future__ import annotations

import numbers

import numpy as np

from ampviz.formats.inputs import _describe, _real_array
from ampviz.formats.spec import FloatFormat
from ampviz.formats.blocks.stochastic import stochastic_round

_F32 = np.float32


# ---------------------------------------------------------------- argument checks
def _sealed(arr: np.ndarray) -> np.ndarray:
    """A freshly made array (owned by no one else), made read-only without a copy."""
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
        x32 = arr.astype(np.float32, copy=False)  # read only, so float32 input is not copied
    return x32.reshape(*arr.shape[:-1], n // block, block)


def _block_size(block_size) -> int:
    if isinstance(block_size, (bool, np.bool_)) or not isinstance(block_size, (numbers.Integral, np.integer)):
        raise TypeError(f"block_size must be a positive int such as 32, got {_describe(block_size)}")
    if block_size < 1:
        raise ValueError(f"block_size must be a positive int such as 32, got {int(block_size)}")
    return int(block_size)


def _choice(value, what: str, choices: tuple) -> str:
    key = getattr(value, "value", value)  # an Enum such as torchao's ScaleCalculationMode
    if isinstance(key, str) and key.strip().lower() in choices:
        return key.strip().lower()
    raise ValueError(f"{what} must be one of {', '.join(repr(c) for c in choices)}, got {_describe(value)}")


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


def _x_shape(xb: np.ndarray) -> tuple:
    """The shape of the array that was cut into the blocks xb (..., blocks, block)."""
    return xb.shape[:-2] + (xb.shape[-2] * xb.shape[-1],)
