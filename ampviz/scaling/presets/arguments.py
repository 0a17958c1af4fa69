"""The argument checks the framework presets share: a number, a whole count of steps, a tolerance
or a flag, each as a clear error that names the framework's own setting."""

from __future__ import annotations

import math

import numpy as np

from ampviz._args import _shown
from ampviz.scaling.scaler import _number, _whole_number


def _real(name: str, value, what: str) -> float:
    """A preset's numeric argument as a float, or one clear error naming it and what to pass."""
    if not _number(value):
        raise TypeError(f"{name} must be a number ({what}), not {_shown(value)}")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{name} is too large for a float ({what}): {_shown(value)}") from None


def _steps_count(name: str, value, what: str) -> int:
    """A preset's window or count: a whole number >= 1 (the frameworks divide by it or count to it)."""
    if not _whole_number(value):
        raise TypeError(f"{name} must be a whole number of steps ({what}), not {_shown(value)}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1 ({what}), not {value}")
    return int(value)


def _tolerance(value, what: str) -> float:
    value = _real("tolerance", value, what)
    if math.isnan(value):
        raise ValueError(f"tolerance must be a number ({what}), not NaN")
    return value


def _flag(name: str, value, what: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False ({what}), not {_shown(value)}")
    return bool(value)
