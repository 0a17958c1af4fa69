"""The simulator's event-by-event method (``_events``): from one overflow or growth to the next
with numpy searches and slice fills, for events far apart; and the helpers both methods use to
follow a scale that cannot move (``_fixed_scale`` and its tests)."""

from __future__ import annotations

import math

import numpy as np

from ampviz.scaling.scaler import DynamicScaler, ScalerState, _f32
from ampviz.scaling.simulator.arrays import _CHUNK, _STRETCH, _TraceArrays, _identical, _int32, _ramp


def _events(policy: DynamicScaler, st: ScalerState, i: int, n: int, stream, out: _TraceArrays,
            stretch: bool = False):
    """From step i to the next event (overflow or growth) and through it, with numpy: the clean
    stretch before it is filled with slices (the counters that fairseq's tolerance keeps just
    advance by its length), the event goes through ``policy.adjust``. With ``stretch`` (overflows
    have been coming close together), an overflow after which the scale cannot move is followed
    by the whole stretch at that scale (``_fixed_scale``). Returns (next step, state, step where
    the run stopped or None, the number of clean steps before the event)."""
    scale, skipped, tracker, hyst = out.scale, out.skipped, out.tracker, out.hyst
    counting = policy.tolerance > 0
    to_growth = policy._clean_steps_to_growth(st)
    stop = n if to_growth > n - i else i + int(to_growth)
    j = stream.first(i, stop, st.scale)
    clean_end = stop if j is None else j
    grows = j is None and clean_end - i == to_growth
    plain = clean_end - i - grows  # clean steps that only count
    scale[i:clean_end] = st.scale
    if plain:
        h = policy.hysteresis if policy.refill == "clean" else st.hysteresis
        t = st.growth_tracker
        np.add(_ramp(plain), t if -2**31 <= t < 2**31 else np.int64(t), out=tracker[i:i + plain], casting="unsafe")
        if not out.fixed_hyst:
            hyst[i:i + plain] = h
        st = st._replace(growth_tracker=st.growth_tracker + plain, hysteresis=h,
                         steps_since_rescale=st.steps_since_rescale + plain if counting else 0)
    if grows:
        st = policy._adjust(st, False)
        tracker[clean_end - 1] = _int32(st.growth_tracker)
        if not out.fixed_hyst:
            hyst[clean_end - 1] = st.hysteresis
    gap = clean_end - i
    if j is None:
        return clean_end, st, None, gap
    scale[j] = st.scale
    skipped[j] = True
    st = policy._adjust(st, True)
    tracker[j] = _int32(st.growth_tracker)
    if not out.fixed_hyst:
        hyst[j] = st.hysteresis
    if st.stopped:
        return j + 1, st, j, gap
    k = j + 1
    if not (stretch and k < n and _stretches(policy)) or policy.raise_at_zero and st.scale == 0:
        return k, st, None, gap
    rounds = policy.arithmetic != "float64"
    bf = _f32(policy.backoff_factor) if policy.arithmetic == "float32" else policy.backoff_factor
    if not _cannot_move(policy, st.scale, st.hysteresis, bf, rounds):
        return k, st, None, gap
    # the scale stays until the next growth or backoff: take that stretch at once, looking ahead
    # further while it lasts
    keeps = _backoff_keeps(policy, st.scale, bf, rounds)
    size = _CHUNK // 4
    while k < n:
        e = min(n, k + size)
        g, over, t, h = _fixed_scale(policy, st.scale, st.growth_tracker, st.hysteresis,
                                     np.asarray(stream.mask(k, e, st.scale), bool), keeps)
        if g:
            scale[k:k + g] = st.scale
            skipped[k:k + g] = over
            tracker[k:k + g] = t
            if not out.fixed_hyst:
                hyst[k:k + g] = h
            st = st._replace(growth_tracker=int(t[-1]), hysteresis=int(h[-1]), steps_since_rescale=0)
            k += g
        if k < e:  # the growth or backoff that ends it comes next
            break
        size = min(2 * size, 4 * _CHUNK)
    return k, st, None, gap if k == j + 1 else n


def _backoff_keeps(p: DynamicScaler, s: float, bf: float, rounds: bool) -> bool:
    """Whether a backoff at scale s leaves it exactly as it is (0, a floor, a subnormal fixed point,
    NaN), and ends nothing (no raise at this scale)."""
    if p.raise_at_min and p.min_scale is not None and s == p.min_scale:
        return False
    if _overflow_ends(p, s) or p.raise_at_zero and s == 0:
        return False
    ns = _f32(s * bf) if rounds else s * bf
    if p.min_scale is not None:
        ns = max(ns, p.min_scale)
    if p.no_backoff_below is not None and ns < p.no_backoff_below:
        ns = s
    return _identical(ns, s)


def _fixed_scale(p: DynamicScaler, s: float, t: int, h: int, over: np.ndarray, keeps: bool):
    """Steps after an overflow (tracker t, hysteresis h after it) while the scale s cannot move:
    up to the next growth, and the next overflow that backs off (unless ``keeps``: a backoff at s
    leaves it) or ends the run. ``over`` says which of the steps ahead overflow at s; the
    tracker and hysteresis then follow with numpy. Returns (how many steps the stretch has, and
    for each of them whether it overflowed, the tracker and the hysteresis after it)."""
    size = over.size
    idx = np.arange(size)
    last = np.maximum.accumulate(np.where(over, idx, -1))
    tracker = np.where(last >= 0, np.int64(p.tracker_after_overflow) + (idx - last), np.int64(t) + 1 + idx)
    end = ~over & ((tracker >= p.growth_interval) if p.growth_at_least else (tracker == p.growth_interval))
    # the hysteresis after each step, without growth (it is refilled by clean steps or at growth)
    refill = ~over if p.refill == "clean" else np.zeros(size, bool)
    overflows = np.cumsum(over)
    lastr = np.maximum.accumulate(np.where(refill, idx, -1))
    since = overflows - np.where(lastr >= 0, overflows[np.maximum(lastr, 0)], 0)
    start = np.where(lastr >= 0, np.int64(p.hysteresis), np.int64(h))
    hyst = np.maximum(start - since, np.minimum(start, 1))
    before = np.concatenate(([h], hyst[:-1]))
    if _overflow_ends(p, s):
        end |= over  # any overflow here ends the run
    elif not keeps:
        end |= over & (before <= 1)  # this overflow backs off (or ends the run)
    g = int(np.argmax(end)) if end.any() else size
    return g, over[:g], tracker[:g], hyst[:g]


def _overflow_ends(p: DynamicScaler, s: float) -> bool:
    """Whether any overflow at scale s ends the run, hysteresis or tolerance notwithstanding (an
    overflow that keeps the scale leaves it at or below ``raise_at_scale``; an infinite or NaN
    scale with ``raise_at_inf``)."""
    return (p.raise_at_scale is not None and s <= p.raise_at_scale) or (p.raise_at_inf and not -math.inf < s < math.inf)


def _stretches(p: DynamicScaler) -> bool:
    """Whether a scale that cannot move is worth following with numpy: no tolerance counters or
    window (they change at every step), and growth far enough away from an overflow."""
    if p.tolerance > 0 or p.window_scaling:
        return False
    gi, tao = p.growth_interval, p.tracker_after_overflow
    to_growth = max(gi - tao, 1) if p.growth_at_least else (gi - tao if tao < gi else math.inf)
    return to_growth >= _STRETCH


def _cannot_move(p: DynamicScaler, s: float, h: int, bf: float, rounds: bool) -> bool:
    """After an overflow, whether the next overflows may leave the scale s as it is: hysteresis
    absorbs them, or a backoff at s gives s again."""
    return h > 1 or (p.refill == "clean" and p.hysteresis > 1) or _backoff_keeps(p, s, bf, rounds)
