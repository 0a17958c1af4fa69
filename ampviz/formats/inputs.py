"""Reading what the format functions are given: numbers, lists, numpy arrays (ml_dtypes' too) and
torch tensors become one numpy array of real numbers (``_real_array``), or one clear TypeError that
says what to pass; ``_describe`` writes a value into such a message. Also the float32 rounding every
cast starts with (``_as_float32_values``), the Python scalar a one-number input gets back
(``_scalar_or_array``), and the NaN torch's ``max`` writes (``_TORCH_MAX_NAN``).

A newcomer finds here how inputs are read; the formats themselves are in ``ampviz.formats.spec``.
This module needs numpy only (it recognises tensors without importing torch).
"""

from __future__ import annotations

import math
import numbers

import numpy as np


def _describe(x) -> str:
    """A short, one-line description of x for an error message."""
    if isinstance(x, np.ndarray):
        return f"an array of {x.dtype} with shape {x.shape}"
    try:
        text = repr(x)
    except Exception:  # a broken __repr__ must not hide the real message
        text = ""
    if text and len(text) <= 60 and "\n" not in text:
        return text
    name = type(x).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _first_line(exc: BaseException) -> str:
    try:
        lines = str(exc).strip().splitlines()
    except Exception:
        lines = []
    return lines[0] if lines else type(exc).__name__


def _is_tensor(x) -> bool:
    """Whether x is a torch tensor (or a subclass, e.g. a Parameter), told without importing torch."""
    return any(c.__name__ == "Tensor" and c.__module__ == "torch" for c in type(x).__mro__)


def _tensor_values(t, what: str) -> np.ndarray:
    """A torch tensor's values as numpy: detached, on the CPU, and bf16/fp16/fp8 upcast to float32
    (exact: float32 holds every value of those formats); float64 stays float64, integers and bools
    stay as they are, sparse and quantized tensors give the values they stand for."""
    if t.is_complex():
        raise TypeError(f"{what} must be real numbers, got a complex tensor ({t.dtype}); "
                        "pass its real part (t.real) or its magnitude (t.abs())")
    try:
        t = t.detach()
        if str(t.layout) != "torch.strided":  # sparse
            t = t.to_dense()
        if t.is_quantized:
            t = t.dequantize()
        t = t.cpu()
        if t.is_floating_point() and str(t.dtype) not in ("torch.float32", "torch.float64"):
            t = t.float()
        return t.numpy()
    except Exception as exc:  # meta tensors (no data), nested tensors, dtypes numpy cannot hold
        problem = _first_line(exc)
    raise TypeError(f"{what}: cannot read the values of this {t.dtype} tensor on {t.device} ({problem}); "
                    "pass a tensor that holds real numbers")


def _object_values(arr: np.ndarray, what: str) -> np.ndarray:
    """An object array of real Python numbers (ints too long for 64 bits, fractions, a mix) as
    float64; an int beyond float64's range becomes inf of its sign, as its cast would."""
    out = np.empty(arr.shape, np.float64)
    flat = out.reshape(-1)
    for i, v in enumerate(arr.reshape(-1)):
        if not isinstance(v, (numbers.Real, np.bool_)):
            raise TypeError(f"{what} must be real numbers (a number, a list of numbers, a numpy array or "
                            f"a torch tensor), got {_describe(v)}")
        try:
            flat[i] = float(v)
        except OverflowError:
            flat[i] = math.inf if v > 0 else -math.inf
    return out


#: The NaN torch 2.13's ``max`` over a whole CPU tensor of two or more elements writes when one
#: is NaN: 0xFFFFFFFF, negative (its vectorized max ORs an all-ones mask in); ``amax`` writes
#: the positive quiet NaN 0x7FC00000 instead.
_TORCH_MAX_NAN = np.uint32(0xFFFFFFFF).view(np.float32)

_REFUSED_KINDS = {
    "c": "complex numbers; pass the real part (x.real) or the magnitude (abs(x))",
    "M": "datetimes; pass numbers",
    "m": "time spans; pass numbers (e.g. x / np.timedelta64(1, 's'))",
    "U": "strings; pass numbers (e.g. float(text))",
    "S": "bytes; pass numbers",
    "V": "raw records; pass numbers",
}


def _real_array(x, what: str = "values") -> np.ndarray:
    """x as a numpy array of real numbers (dtype kind b, i, u or f), with one clear TypeError for
    anything else.

    Accepted: Python numbers and bools, (nested) lists of them, numpy arrays and scalars, arrays of
    ml_dtypes' types (bfloat16, float8_*, float6_*, float4_e2m1fn, float8_e8m0fnu, int4, ...: read
    as their values in float32, which holds each exactly; told by the dtype, without importing
    ml_dtypes), and torch tensors of any real dtype, device and grad state. Bools count as 0 and 1
    (as numpy and torch cast them). Refused: None, text, bytes, complex numbers, datetimes and other objects.
    """
    if x is None:
        raise TypeError(f"{what} must be numbers (a number, a list of numbers, a numpy array or a torch "
                        "tensor), got None")
    if isinstance(x, (str, bytes, bytearray)):
        raise TypeError(f"{what} must be numbers, not text: got {_describe(x)}; pass e.g. float(text)")
    if _is_tensor(x):
        return _tensor_values(x, what)
    if isinstance(x, (list, tuple)) and any(_is_tensor(v) for v in x):  # e.g. a list of 0-d losses
        x = [_tensor_values(v, what) if _is_tensor(v) else v for v in x]
    try:
        arr = np.asarray(x)
    except MemoryError:
        raise
    except Exception as exc:  # ragged lists, objects whose __array__ fails
        raise TypeError(f"{what} must be numbers or an array of them, got {_describe(x)} "
                        f"({_first_line(exc)})") from None
    if getattr(arr.dtype.type, "__module__", "").partition(".")[0] == "ml_dtypes":  # bfloat16, float8_*, int4, ...
        return arr.astype(np.float32)  # exact: float32 holds every value of ml_dtypes' types
    kind = arr.dtype.kind
    if kind in "biuf":
        return arr
    if kind == "O":
        return _object_values(arr, what)
    raise TypeError(f"{what} must be numbers, not {_REFUSED_KINDS.get(kind, str(arr.dtype))}")


def _as_float32_values(x) -> tuple[np.ndarray, np.ndarray]:
    """(x as an array, x rounded to float32 as float64): torch casts float64 through float32."""
    arr = _real_array(x)
    # Overflow to inf is the point; signalling NaNs (any NaN payload) are quietly NaN.
    with np.errstate(over="ignore", invalid="ignore"):
        return arr, arr.astype(np.float32).astype(np.float64)


def _scalar_or_array(result: np.ndarray):
    """A Python scalar for a 0-d result (the input was one number), else the array."""
    if np.ndim(result) == 0:
        return np.asarray(result)[()].item()
    return result
