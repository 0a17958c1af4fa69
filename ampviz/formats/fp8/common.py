"""What the FP8 scaling modules share: the two fp8 formats a scale can aim at (``_fp8_format``),
their argument checks, amaxes read as float32 (``_amaxes``), read-only results (``_readonly``),
and ``recipe_formats``, the formats a Transformer Engine recipe's ``fp8_format`` picks for the
forward and backward tensors. The recipes themselves: ``ampviz.formats.fp8.current`` (current
scaling), ``ampviz.formats.fp8.delayed`` (delayed scaling), ``ampviz.formats.fp8.stream`` (a
stream of tensors under either); ``ampviz.formats.fp8`` tells the whole story.
"""

from __future__ import annotations

import numbers

import numpy as np

from ampviz.formats.catalog import FP8_E4M3, FP8_E5M2, get_format
from ampviz.formats.inputs import _describe, _real_array
from ampviz.formats.spec import FloatFormat

_F32 = np.float32
_FLT_MAX = _F32(np.finfo(np.float32).max)
_FP8 = (FP8_E4M3, FP8_E5M2)


# ------------------------------------------------------------------ argument checks
def _fp8_format(fmt) -> FloatFormat:
    f = get_format(fmt)
    if f not in _FP8:
        raise ValueError(f"fmt must be an fp8 format, fp8_e4m3 (max 448) or fp8_e5m2 (max 57344), not {f.name}")
    return f


def _whole(name: str, value, low: int, high: int, hint: str) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a whole number ({hint}), not {_describe(value)}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be a whole number from {low} to {high} ({hint}), not {value}")
    return int(value)


def _choice(name: str, value, choices: tuple) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}, not {_describe(value)}")
    return value


def _flag(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, not {_describe(value)}")
    return bool(value)


def _float32(x, what: str) -> np.ndarray:
    """x as float32 values (float64 rounded once, as a torch cast does)."""
    arr = _real_array(x, what)
    if arr.dtype.kind == "b":
        raise TypeError(f"{what} must be numbers, not booleans")
    with np.errstate(over="ignore", invalid="ignore"):
        return arr.astype(np.float32)


def _amaxes(x, what: str) -> np.ndarray:
    """amaxes as float32, >= 0 (or NaN; -0 becomes +0, as abs gives it)."""
    a = _float32(x, what)
    neg = a < 0
    if neg.any():
        raise ValueError(f"{what} must be >= 0 (an amax is a largest magnitude), got {a[neg].flat[0]!r}")
    return a + _F32(0.0)  # -0.0 + 0.0 is +0.0


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.array(a, order="C")  # a copy (ascontiguousarray would make a 0-d array 1-d)
    a.flags.writeable = False
    return a


# ------------------------------------------------------------------ recipe formats
def recipe_formats(fp8_format="HYBRID") -> tuple[FloatFormat, FloatFormat]:
    """(forward format, backward format) of a Transformer Engine recipe's ``fp8_format``:
    ``"HYBRID"`` (the default) gives (E4M3, E5M2): activations and weights in E4M3, gradients in
    E5M2; ``"E4M3"`` gives E4M3 for both. ``"E5M2"`` is refused, as Transformer Engine refuses it
    ("Pure E5M2 training is not supported.")."""
    if not isinstance(fp8_format, str):
        raise TypeError(f"fp8_format must be 'HYBRID' or 'E4M3', not {_describe(fp8_format)}")
    key = fp8_format.upper()
    if key == "HYBRID":
        return FP8_E4M3, FP8_E5M2
    if key == "E4M3":
        return FP8_E4M3, FP8_E4M3
    if key == "E5M2":
        raise ValueError("fp8_format 'E5M2' is not a recipe: pure E5M2 training is not supported (use 'HYBRID')")
    raise ValueError(f"fp8_format must be 'HYBRID' or 'E4M3', not {fp8_format!r}")
