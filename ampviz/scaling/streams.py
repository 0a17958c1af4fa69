"""The streams of steps the simulator runs over: ``_FixedOverflows`` (overflows known in advance,
``found_inf``) and ``_ScaleDependentOverflows`` (overflows that depend on the scale, from
``grad_max``), each able to find the next overflow, mask a range, and hand a chunk to the
step-by-step loop."""

from __future__ import annotations

import bisect
import math
import struct

import numpy as np

from ampviz.formats import FP16, FloatFormat
from ampviz.scaling.overflow import (
    _cast_array, _fp16_thresholds, _overflowing, _overflowing32, _thresholds, _thresholds32,
)
from ampviz.scaling.scaler import _f32


class _FixedOverflows:
    """Overflow steps known in advance (``found_inf``)."""

    known = True

    def __init__(self, flags: np.ndarray):
        self.flags = flags
        self.events = np.flatnonzero(flags)
        # few overflows (the event-by-event search sees them all): a list that bisect searches
        self._list = self.events.tolist() if self.events.size <= flags.size // 64 else None

    def first(self, start: int, stop: int, scale: float):
        """The first overflowing step in [start, stop), or None."""
        if self._list is not None:
            k = bisect.bisect_left(self._list, start)
            if k < len(self._list) and self._list[k] < stop:
                return self._list[k]
            return None
        k = int(self.events.searchsorted(start))
        if k < self.events.size and self.events[k] < stop:
            return int(self.events[k])
        return None

    def mask(self, lo: int, hi: int, scale: float) -> np.ndarray:
        """Which steps of [lo, hi) overflow at ``scale``."""
        return self.flags[lo:hi]

    def chunk(self, lo: int, hi: int, scale64: bool) -> bytes:
        """The steps [lo, hi) for the step-by-step loop: one byte per step, 1 = overflow."""
        return self.flags[lo:hi].tobytes()


def _f16(x: float) -> float:
    """x rounded to fp16 (to nearest even; 65520 and beyond give inf), as a Python float."""
    try:
        return _UNPACK_E(_PACK_E(x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


_PACK_E = struct.Struct("<e").pack
_UNPACK_E = struct.Struct("<e").unpack


def _cast_scalar(fmt: FloatFormat, x: float) -> float:
    """One value cast to ``fmt`` as torch casts it (fp16 through the struct module: fast)."""
    if fmt is FP16 and not math.isnan(x):
        return _f16(_f32(x))  # torch casts the float32 scale
    return float(fmt.quantize(x))


class _ScaleDependentOverflows:
    """Overflow steps that depend on the scale: the first step in a range whose gradient
    overflows at the current scale. Rounding is monotone, so a block of steps holds an overflow
    exactly when its largest |gradient| overflows: per-block maxima find it, and only the few
    values looked at are cast to ``fmt``. The step-by-step loop instead compares the scale with
    a per-step threshold (``_thresholds``)."""

    known = False
    BLOCK = 512

    def __init__(self, g: np.ndarray, fmt: FloatFormat, low: bool = False):
        self.fmt = fmt
        self.low = low  # the loss in fmt (the scale cast to fmt), else a float32 loss
        self.boundary = fmt.overflow_boundary
        with np.errstate(over="ignore", invalid="ignore"):
            a = np.abs(np.asarray(g, dtype=np.float32))  # torch casts through float32
        a[np.isnan(a)] = np.inf  # a NaN gradient overflows at every scale
        self.a = a
        b = self.BLOCK
        pad = (-a.size) % b
        self.block_max = np.concatenate([a, np.zeros(pad, np.float32)]).reshape(-1, b).max(axis=1)
        self._qs = {}

    def _cast(self, x: np.ndarray) -> np.ndarray:
        return _cast_array(self.fmt, x) if self.low else np.asarray(x, np.float64)

    def _scale(self, scale: float) -> float:
        qs = self._qs.get(scale)
        if qs is None:
            qs = self._qs[scale] = abs(_cast_scalar(self.fmt, scale) if self.low else _f32(scale))
        return qs

    def _over(self, qs: float, values: np.ndarray) -> np.ndarray:
        if self.low:
            return _overflowing(qs, self._cast(values), self.boundary)
        return _overflowing32(qs, self._cast(values), self.boundary)

    def first(self, start: int, stop: int, scale: float):
        """The first overflowing step in [start, stop) at ``scale``, or None."""
        if start >= stop:
            return None
        qs = self._scale(scale)
        b, a = self.BLOCK, self.a
        end = min(stop, (start // b + 1) * b)  # the partial block at the start
        hit = self._over(qs, a[start:end])
        if hit.any():
            return start + int(np.argmax(hit))
        if end >= stop:
            return None
        b0, b1 = end // b, (stop - 1) // b  # whole blocks (the last may reach past stop)
        hit = self._over(qs, self.block_max[b0:b1 + 1])
        if not hit.any():
            return None
        lo = (b0 + int(np.argmax(hit))) * b
        hit = self._over(qs, a[lo:min(stop, lo + b)])
        if hit.any():
            return lo + int(np.argmax(hit))
        return None  # that block's largest value lies at or beyond stop

    def mask(self, lo: int, hi: int, scale: float) -> np.ndarray:
        """Which steps of [lo, hi) overflow at ``scale``."""
        return self._over(self._scale(scale), self.a[lo:hi])

    def chunk(self, lo: int, hi: int, scale64: bool) -> np.ndarray:
        """The steps [lo, hi) for the step-by-step loop: each step's threshold (float64)."""
        a = self.a[lo:hi]
        if not self.low:
            return _thresholds32(self.fmt, a, scale64)
        with np.errstate(over="ignore"):  # beyond fp16's range is inf: the point
            if self.fmt is FP16:
                return _fp16_thresholds(scale64)[a.astype(np.float16).view(np.uint16)]
            return _thresholds(self.fmt, self._cast(a), scale64)
