"""The simulator's shared pieces: the constants that divide its work between the event-by-event
search and the step-by-step loop, and ``_TraceArrays``, the arrays of a trace being filled (with
the int32 wrap of torch's growth tracker and the exact float comparison both methods use)."""

from __future__ import annotations

import math
from array import array

import numpy as np

from ampviz.scaling.scaler import DynamicScaler, ScalerState


_RAMP = np.arange(1, 1, dtype=np.int32)


def _ramp(n: int) -> np.ndarray:
    """1, 2, ..., n (int32), kept between calls: sliders re-simulate the same length."""
    global _RAMP
    if _RAMP.size < n:
        _RAMP = np.arange(1, n + 1, dtype=np.int32)
        _RAMP.flags.writeable = False
    return _RAMP[:n]


# How the simulator divides the work (the trace equals stepping ``adjust`` either way):
_CHUNK = 16384  # steps per chunk of the step-by-step loop (its inputs are prepared per chunk)
_DENSE_GAP = 128  # events this close to the one before, _DENSE_EVENTS times in a row, hand over
_DENSE_EVENTS = 8  # to the step-by-step loop
_SPARSE_EVENTS = 64  # a chunk with fewer events hands back to the event-by-event numpy search
_STRETCH = 256  # a fixed scale is followed to the next growth with numpy when that is this far
_COUNTED = 8  # below this growth interval, or with more events per step than _DENSITY, torch's
_DENSITY = 0.25  # rule runs as a loop over steps


class _TraceArrays:
    """The arrays of a trace being filled, and the policy's constants that shape them."""

    def __init__(self, policy: DynamicScaler, st: ScalerState, n: int):
        self.policy = policy
        self.scale = np.empty(n, np.float64 if policy.arithmetic == "float64" else np.float32)
        self.skipped = np.zeros(n, bool)
        self.tracker = np.empty(n, np.int32)  # torch keeps its growth tracker in an int32
        self.fixed_hyst = policy.hysteresis == 1 and st.hysteresis == 1  # never changes
        self.hyst = (np.broadcast_to(np.int32(1), (n,)) if self.fixed_hyst
                     else np.full(n, st.hysteresis, np.int32))

    def step(self, k: int, scale: float, skipped: bool, tracker: int, hyst: int) -> None:
        self.scale[k] = scale
        self.skipped[k] = skipped
        self.tracker[k] = _int32(tracker)
        if not self.fixed_hyst:
            self.hyst[k] = hyst

    def session(self, c0: int, c1: int, s0: float, t0: int, h0: int, evp: array, evs: array,
                runs: list) -> None:
        """Steps [c0, c1) of the step-by-step loop, rebuilt from its events: ``evp`` the steps
        where the state changed (~k for an overflow, k for a growth), ``evs`` the scale after
        each, ``runs`` stretches (a, b, overflowed) of steps that left the state as it was.
        Between events the scale stands still and the tracker counts clean steps; the tracker
        and hysteresis follow from which steps overflowed and which grew."""
        size = c1 - c0
        if size <= 0:
            return
        p = policy = self.policy
        pos = np.frombuffer(evp, np.int64) if len(evp) else np.zeros(0, np.int64)
        over = pos < 0
        pos = np.where(over, ~pos, pos) - c0
        vals = np.frombuffer(evs, self.scale.dtype) if len(evs) else np.zeros(0, self.scale.dtype)
        counts = np.diff(np.concatenate(([0], pos + 1, [size])))
        self.scale[c0:c1] = np.repeat(np.concatenate((np.asarray([s0], self.scale.dtype), vals)), counts)
        sk = np.zeros(size, bool)
        sk[pos[over]] = True
        grew = np.zeros(size, bool)
        grew[pos[~over]] = True
        for a, b, overflowed in runs:
            if isinstance(overflowed, np.ndarray):  # a stretch at a fixed scale, without growth
                sk[a - c0:b - c0] = overflowed
            else:
                (sk if overflowed else grew)[a - c0:b - c0] = True
        self.skipped[c0:c1] = sk
        idx = np.arange(size)
        # the tracker counts clean steps from the last step that reset it: an overflow (to
        # tracker_after_overflow) or a growth (to 0; not with a window)
        if not runs:  # the resets are events: a ramp per stretch between them
            resets = pos if not p.window_scaling else pos[over]
            value = np.where(over, np.int64(p.tracker_after_overflow), np.int64(0))
            value = value if not p.window_scaling else value[over]
            base = np.concatenate(([np.int64(t0) + 1], value - resets))
            counts = np.diff(np.concatenate(([0], resets, [size])))
            self.tracker[c0:c1] = np.repeat(base, counts) + idx
        else:
            reset = sk if p.window_scaling else sk | grew
            last = np.maximum.accumulate(np.where(reset, idx, -1))
            value = np.where(sk, np.int64(p.tracker_after_overflow), np.int64(0))
            tracker = np.where(last >= 0, value[last] + (idx - last), np.int64(t0) + 1 + idx)
            self.tracker[c0:c1] = tracker.astype(np.int32)
        if not self.fixed_hyst:
            refill = ~sk if policy.refill == "clean" else grew
            overflows_so_far = np.cumsum(sk)
            lastr = np.maximum.accumulate(np.where(refill, idx, -1))
            since = overflows_so_far - np.where(lastr >= 0, overflows_so_far[lastr], 0)
            href = np.where(lastr >= 0, np.int64(policy.hysteresis), np.int64(h0))
            self.hyst[c0:c1] = np.maximum(href - since, np.minimum(href, 1))

    def tail(self, i: int, st: ScalerState, stream) -> None:
        """Steps i.. once nothing changes any more: a static scale, or a run that was stopped."""
        self.scale[i:] = np.nan if st.stopped else st.scale
        self.tracker[i:] = _int32(st.growth_tracker)
        if not self.fixed_hyst:
            self.hyst[i:] = st.hysteresis
        self.skipped[i:] = True if st.stopped else stream.mask(i, self.scale.size, st.scale)


def _int32(x: int) -> int:
    """x wrapped to an int32, as torch's int32 growth tracker would hold it."""
    return x if -2**31 <= x < 2**31 else (x + 2**31) % 2**32 - 2**31


def _identical(a: float, b: float) -> bool:
    """a and b are the same float (NaN is NaN; 0.0 is not -0.0)."""
    if a == b:
        return a != 0 or math.copysign(1.0, a) == math.copysign(1.0, b)
    return a != a and b != b
