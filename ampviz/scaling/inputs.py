"""The checks of what ``simulate`` and ``overflows`` are given: numbers, lists, numpy arrays or
torch tensors turned into numpy arrays (found_inf flags, gradient maxima), the low-precision
format an overflow is modelled in, and the loss's dtype; each mistake is one clear error."""

from __future__ import annotations

import numpy as np

from ampviz._args import _shown
from ampviz.formats import FP32, FloatFormat, get_format


# ------------------------------------------------------------------ inputs
def _is_tensor(x) -> bool:
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "detach")


def _as_array(name: str, values, what: str) -> np.ndarray:
    """``values`` (a number, a list, a numpy array or a torch tensor) as a numpy array, or one
    clear error that says what to pass."""
    if isinstance(values, (str, bytes, bytearray)):
        raise TypeError(f"{name} must be {what}, not a string")
    if _is_tensor(values):
        t = values.detach().cpu()
        if t.is_complex():
            raise TypeError(f"{name} must be real numbers, not a complex tensor")
        try:
            values = t.numpy()
        except (TypeError, RuntimeError):  # bfloat16, float8: numpy has no such dtype
            values = t.float().numpy()
    try:
        return np.asarray(values)
    except (ValueError, TypeError, OverflowError):  # ragged lists, objects numpy cannot hold
        raise ValueError(f"{name} must be {what}; got {_shown(values)}") from None


def _real_values(name: str, values, what: str) -> np.ndarray:
    """``values`` as a float64 array (any shape), or one clear error."""
    arr = _as_array(name, values, what)
    kind = arr.dtype.kind
    if kind == "b":
        raise TypeError(f"{name} must be {what}, not booleans")
    if kind == "O":
        if any(v is None or isinstance(v, (str, bytes, bool, np.bool_)) for v in arr.flat):
            raise TypeError(f"{name} must be {what}; got {_shown(values)}")  # numpy would make None NaN
        try:
            return arr.astype(np.float64)
        except OverflowError:
            raise ValueError(f"{name} has a number too large for a float: pass {what}") from None
        except (TypeError, ValueError):
            raise TypeError(f"{name} must be {what}; got {_shown(values)}") from None
    if kind not in "iuf":
        raise TypeError(f"{name} must be {what} (real numbers), got {arr.dtype} values")
    with np.errstate(over="ignore"):  # a longdouble beyond float64 is inf, as a cast makes it
        return arr.astype(np.float64)


def _flags(found_inf) -> np.ndarray:
    """found_inf as a 1-D bool array: booleans, or 0/1 (ints or floats, as torch's found_inf)."""
    what = "booleans, one per step (True where the step overflowed)"
    arr = _as_array("found_inf", found_inf, what)
    if arr.ndim != 1:
        raise ValueError(f"found_inf must be a 1-D array, one entry per step (got shape {arr.shape})")
    if arr.size == 0:  # an empty list is float64 to numpy: still an empty stream
        return np.zeros(0, bool)
    kind = arr.dtype.kind
    if kind == "b":
        return arr
    if kind not in "iufO":
        raise TypeError(f"found_inf must be booleans (one per step), got {arr.dtype} values")
    try:
        with np.errstate(invalid="ignore"):
            one = np.asarray(arr == 1, dtype=bool)
            zero = np.asarray(arr == 0, dtype=bool)
    except (TypeError, ValueError):
        raise TypeError(f"found_inf must be booleans (one per step); got {_shown(found_inf)}") from None
    if one.shape != arr.shape or zero.shape != arr.shape:
        raise TypeError(f"found_inf must be booleans (one per step); got {_shown(found_inf)}")
    bad = ~(one | zero)
    if bad.any():
        k = int(np.argmax(bad))
        value = arr[k].item() if isinstance(arr[k], np.generic) else arr[k]
        raise ValueError(f"found_inf must be True/False (or 1/0) at every step; step {k} is {_shown(value)}")
    return one


def _gradients(grad_max) -> np.ndarray:
    """grad_max as a 1-D array of real numbers."""
    arr = _as_array("grad_max", grad_max, "numbers, the largest |gradient| of each step")
    if arr.ndim != 1:
        raise ValueError(f"grad_max must be a 1-D array, one entry per step (got shape {arr.shape})")
    if arr.dtype.kind == "b":
        raise TypeError("grad_max must be numbers (the largest |gradient| of each step), not booleans; "
                        "give overflow flags as found_inf=")
    if arr.dtype.kind in "iuf":
        return arr
    return _real_values("grad_max", arr, "numbers, the largest |gradient| of each step")


def _overflow_format(fmt) -> FloatFormat:
    fmt = get_format(fmt)
    if fmt.specials in ("fnuz", "fnu"):
        raise ValueError(
            f"{fmt.name} has no inf: a value past its max {fmt.max:g} becomes NaN instead of inf, so the "
            "overflow to inf modelled here does not happen there; choose a format with inf such as fp16")
    if fmt.specials != "ieee":
        raise ValueError(
            f"{fmt.name} saturates at {fmt.max:g} instead of overflowing to inf, so a loss scaler "
            "never sees an overflow there; choose a format with inf such as fp16")
    return fmt


def _loss_format(loss_dtype, fmt: FloatFormat) -> bool:
    """Whether ``loss_dtype`` is the low-precision format itself (the loss computed in ``fmt``)
    rather than float32 (the loss autocast computes in fp32); anything else is one clear error."""
    try:
        lf = get_format(loss_dtype)
    except (TypeError, ValueError):
        lf = None
    if lf is FP32:
        return False
    if lf is fmt:
        return True
    own = fmt.torch_dtype or fmt.name
    raise ValueError(f"loss_dtype must be 'float32' (the loss autocast computes in fp32, as mse_loss and "
                     f"cross_entropy are) or {own!r} (a loss computed in {fmt.name}), not {_shown(loss_dtype)}")
