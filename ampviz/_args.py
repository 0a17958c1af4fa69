"""Argument checks every layer shares, torch-free: each returns the value as the code needs it or
raises one ValueError/TypeError whose one-line message names the argument and what to pass.

Two families of messages: ``_whole``, ``_real``, ``_seed``, ``_flag`` and ``_real_array`` say
"must be ..., not <value>" (the torch-side lessons); ``_count`` and ``_number`` say "must be ...,
got <value>" (live training and the explorers). ``_real`` and ``_real_array`` read a torch tensor
too, without importing torch: a value can be a tensor only once torch is loaded.
"""

from __future__ import annotations

import math
import numbers
import operator
import sys

import numpy as np


def _shown(value, limit: int = 60) -> str:
    """``repr(value)`` on one line, cut to ``limit`` characters, for a message."""
    try:
        text = " ".join(repr(value).split())
    except Exception:  # an object whose repr fails is still named
        text = f"a {type(value).__name__}"
    return text if len(text) <= limit else text[:limit] + "…"


def _tensor_type():
    """``torch.Tensor`` if torch is loaded, else a class nothing is an instance of."""
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", _NoTensor)


class _NoTensor:
    pass


# --------------------------------------------------------------------------------------------
# "..., not <value>": the torch side (training, ranks, pitfalls) and the gradient streams (synth).
# Each returns the value or raises one ValueError/TypeError naming the argument and what to pass.
# --------------------------------------------------------------------------------------------

#: The seeds torch's generators take (``torch.manual_seed``, ``torch.Generator().manual_seed``).
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


def _whole(name: str, value, lo: int | None, hi: int | None = None) -> int:
    """``value`` as an int in [lo, hi] (None: no bound); a float such as 1e3 counts if it is whole."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a whole number, not {_shown(value)}")
    try:
        n = operator.index(value)
    except TypeError:
        if not isinstance(value, (float, np.floating)):
            raise TypeError(f"{name} must be a whole number, not {_shown(value)}") from None
        if not (math.isfinite(value) and float(value).is_integer()):
            raise ValueError(f"{name} must be a whole number, not {_shown(value)}") from None
        n = int(value)
    if (lo is not None and n < lo) or (hi is not None and n > hi):
        bounds = (f"between {lo:,} and {hi:,}" if hi is not None and lo is not None else
                  f"at least {lo:,}" if lo is not None else f"at most {hi:,}")
        raise ValueError(f"{name} must be {bounds}, not {n:,}")
    return n


def _seed(value, name: str = "seed", *, spare: int = 0) -> int:
    """A seed torch takes; ``spare``: how many seeds above it are used too (``seed + 1``...)."""
    return _whole(name, value, SEED_MIN, SEED_MAX - spare)


def _real(name: str, value) -> float:
    """A real number as a float: an int, a float, a numpy scalar or a 0-d real array or tensor."""
    if isinstance(value, _tensor_type()) and value.dim() == 0 and value.device.type != "meta" \
            and not value.is_complex():
        value = value.detach().item()
    elif isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, not {_shown(value)}")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{name} must be a number within float range, not {_shown(value)}") from None


def _flag(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, not {_shown(value)}")
    return bool(value)


def _real_array(name: str, values, what: str, dtype=np.float64) -> np.ndarray:
    """Real numbers (a number, a list, a numpy array or a tensor; any shape) as an array of
    ``dtype`` (float64, or float32; values beyond its range become inf, as a cast makes them)."""
    if isinstance(values, _tensor_type()):
        if values.is_complex() or values.dtype == sys.modules["torch"].bool or values.device.type == "meta":
            where = " on the meta device" if values.device.type == "meta" else ""
            raise TypeError(f"{name} must be {what}, not a {str(values.dtype).replace('torch.', '')} tensor{where}")
        torch = sys.modules["torch"]
        return values.detach().to("cpu", torch.float32 if dtype == np.float32 else torch.float64).numpy()
    if isinstance(values, (str, bytes, bytearray)):
        raise TypeError(f"{name} must be {what}, not a string")
    try:
        arr = np.asarray(values)
    except (ValueError, TypeError, OverflowError, RuntimeError):  # ragged lists, tensors numpy cannot read...
        raise ValueError(f"{name} must be {what}, not {_shown(values)}") from None
    if arr.dtype.kind == "O":
        if not all(isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) for v in arr.flat):
            raise TypeError(f"{name} must be {what}, not {_shown(values)}")
        try:
            arr = arr.astype(np.float64)
        except OverflowError:
            raise ValueError(f"{name} must be {what} within float range, not {_shown(values)}") from None
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"{name} must be {what}, not {_shown(values)}")
    with np.errstate(over="ignore"):
        return arr.astype(dtype)


def _count(name: str, value, lo: int, hi: int | None = None, *, shown=_shown) -> int:
    """``value`` as an int in [lo, hi] (a float such as 1e3 counts if whole), or a one-line error."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer, float, np.floating)) or (
            isinstance(value, (float, np.floating)) and not float(value).is_integer()):
        raise TypeError(f"{name} must be a whole number, got {shown(value)}")
    v = int(value)
    if v < lo or (hi is not None and v > hi):
        raise ValueError(f"{name} must be between {lo:,} and {hi:,}, got {v:,}" if hi is not None
                         else f"{name} must be at least {lo:,}, got {v:,}")
    return v


def _number(name: str, value, *, shown=_shown) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {shown(value)}")
    return float(value)
