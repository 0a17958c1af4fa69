"""The simulator's step-by-step method (``_steps``): ``DynamicScaler.adjust`` written out as a
Python loop on local variables, for events that come every few steps, with its shorter loops
(``_count_steps``, ``_grow_or_back``) and the check that an ``array('f')`` rounds as a C cast does
(``_FAST_F32``)."""

from __future__ import annotations

import math
from array import array

import numpy as np

from ampviz.scaling.scaler import DynamicScaler, ScalerState, _f32
from ampviz.scaling.simulator.arrays import (
    _CHUNK, _COUNTED, _DENSITY, _SPARSE_EVENTS, _STRETCH, _identical, _TraceArrays,
)
from ampviz.scaling.simulator.events import _backoff_keeps, _cannot_move, _fixed_scale, _stretches


def _array_rounds_to_float32() -> bool:
    """Whether storing a double in an ``array('f')`` rounds it as a C cast does (to nearest even,
    inf beyond float32's range), so the step-by-step loop can round with it."""
    a = array("f", [1e300, -1e300, 2.0**-150, 1 + 2.0**-24, 1 + 3 * 2.0**-24, 3.4028235677973366e38])
    return list(a) == [math.inf, -math.inf, 0.0, 1.0, 1 + 2.0**-22, math.inf]


_FAST_F32 = _array_rounds_to_float32()


def _steps(policy: DynamicScaler, st: ScalerState, i: int, n: int, stream, out: _TraceArrays):
    """From step i, step by step in Python, chunk by chunk, while events come close together.

    This is ``DynamicScaler.adjust`` written out on local variables. A clean stretch is not
    visited step by step: its first overflow is searched in C (``bytes.find`` on found_inf) or
    compared with per-step thresholds (grad_max). A step that leaves the state as it was (a scale
    at 0, at a floor or ceiling, or refused growth) repeats until the other kind of step comes,
    which is searched the same way; a scale that no backoff moves stays until the next growth,
    found with numpy (``_fixed_scale``). Where every clean step grows and every overflow backs
    off, a shorter loop runs (``_grow_or_back``). Only events are recorded;
    ``_TraceArrays.session`` rebuilds the arrays. Returns as ``_events`` does."""
    p = policy
    bf, gf = p.backoff_factor, p.growth_factor
    if p.arithmetic == "float32":
        bf, gf = _f32(bf), _f32(gf)
    rounds = p.arithmetic != "float64"
    fast = rounds and _FAST_F32
    gi, at_least, tao = p.growth_interval, p.growth_at_least, p.tracker_after_overflow
    full, refill_clean = p.hysteresis, p.refill == "clean"
    lo_clamp, hi_clamp, guard = p.min_scale, p.max_scale, p.inf_guard
    raise_min = p.raise_at_min and lo_clamp is not None
    raise_at, keep_below = p.raise_at_scale, p.no_backoff_below
    raise_zero, raise_inf = p.raise_at_zero, p.raise_at_inf
    tol = p.tolerance
    counting = tol > 0
    windowed = p.window_scaling
    wb, wg = p.backoff_factor, p.growth_factor  # the window follows the unrounded factors
    known = stream.known
    scale64 = p.arithmetic == "float64"
    inf = math.inf
    # every clean step grows and every overflow just backs off: the short loop applies
    plain = (full == 1 and not counting and not windowed and lo_clamp is None and hi_clamp is None
             and keep_below is None and raise_at is None and not raise_zero and not raise_inf and (fast or not rounds)
             and ((gi <= 1 and tao + 1 >= gi) if at_least else (gi == 1 and tao == 0)))
    # torch's rule where events come at most steps (a short growth interval, or runs of overflows
    # at a scale that moves): a loop over steps beats one over events
    counted = (full == 1 and not counting and not windowed and lo_clamp is None and hi_clamp is None
               and keep_below is None and raise_at is None and not raise_zero and not raise_inf
               and (fast or not rounds) and gi > 1)
    density = 0.0  # events per step in the last chunk
    # a scale that cannot move is followed to the next growth with numpy (see _fixed_scale)
    stretches = _stretches(p)
    # one correctly rounded multiplication per update, in the scale's own type (numpy can repeat it)
    exact = math.isfinite(gf) and math.isfinite(bf) and (
        scale64 or p.arithmetic == "float32" or (_f32(gf) == gf and _f32(bf) == bf))
    s, t, h, _, ov, sr, w = st
    size = _CHUNK // 8  # the first chunk is short: events may thin out soon
    while i < n:
        e = min(n, i + size)
        size = min(2 * size, _CHUNK)
        data = stream.chunk(i, e, scale64)
        if plain and h == 1 and (t + 1 >= gi if at_least else t == 0):
            s = _grow_or_back(s, i, e, data, known, gf, bf, guard, scale64, exact, out, tao)
            t = tao if out.skipped[e - 1] else 0
            ov = sr = 0
            i = e
            continue
        if counted and h == 1 and (gi < _COUNTED or density > _DENSITY):
            s, t = _count_steps(s, t, i, e, data, known, gf, bf, gi, at_least, tao, guard, scale64, out)
            ov = sr = 0
            overflowed = int(np.count_nonzero(out.skipped[i:e]))
            density = (overflowed + (e - i - overflowed) / gi) / (e - i)  # about: growths not counted
            i = e
            continue
        if known:
            flags = data
            over_at = None

            def next_over(a, b, s, flags=flags, base=i):
                j = flags.find(1, a - base, b - base)
                return b if j < 0 else j + base

            def next_clean(a, b, s, flags=flags, base=i):
                j = flags.find(0, a - base, b - base)
                return b if j < 0 else j + base
        else:
            thr = data
            ta = array("d")
            ta.frombytes(thr.tobytes())

            def over_at(a, b, s, thr=thr, base=i):
                return np.ones(b - a, bool) if s != s else thr[a - base:b - base] <= abs(s)

            def next_over(a, b, s, thr=thr, ta=ta, base=i):
                if s != s:
                    return a
                sa = abs(s)
                if b - a <= 24:
                    for q in range(a - base, b - base):
                        if ta[q] <= sa:
                            return q + base
                    return b
                m = thr[a - base:b - base] <= sa
                j = int(np.argmax(m))
                return a + j if m[j] else b

            def next_clean(a, b, s, thr=thr, base=i):
                if s != s:
                    return b
                m = thr[a - base:b - base] > abs(s)
                j = int(np.argmax(m))
                return a + j if m[j] else b
        s0, t0, h0, i0 = s, t, h, i
        evp, evs, runs = array("q"), array("d" if scale64 else "f"), []
        put_pos, put_scale = evp.append, evs.append
        fb = array("f")
        f32 = fb.append
        k = i
        stop = None
        while k < e:
            if flags[k - i] if known else not -(x := ta[k - i]) < s < x:
                # ----- an overflow at step k (DynamicScaler.adjust, found_inf=True)
                if raise_inf and not -inf < s < inf:
                    stop = k
                    break
                if counting:
                    o2, s2 = ov + 1, sr + 1
                else:
                    o2 = s2 = 0
                if h > 1:  # tolerated: skip the step, keep the scale
                    ns, nh, nw = s, h - 1, w
                elif counting and not o2 / s2 >= tol:  # below tolerance: keep the scale
                    ns, nh, nw = s, h, w
                else:
                    if raise_min and s == lo_clamp:
                        stop = k
                        break
                    if fast:
                        f32(s * bf)
                        ns = fb[-1]
                    elif rounds:
                        ns = _f32(s * bf)
                    else:
                        ns = s * bf
                    if lo_clamp is not None:
                        ns = max(ns, lo_clamp)
                    if keep_below is not None and ns < keep_below:
                        ns = s
                    nh, o2, s2 = h, 0, 0
                    nw = w
                    if windowed and w >= 1:  # DynamicScaler._resized
                        nw = w * wb
                        nw = 1 if not nw >= 1 else int(nw) if -inf < nw < inf else w
                if raise_at is not None and ns <= raise_at:
                    stop = k
                    break
                put_pos(~k)
                put_scale(ns)
                same = ((ns == s or ns != ns) and t == tao and nh == h and nw == w and o2 == ov and s2 == sr
                        and _identical(ns, s))
                s, t, h, w, ov, sr = ns, tao, nh, nw, o2, s2
                k += 1
                if raise_zero and s == 0 and k < n:  # the next step divides by the scale: the run ends
                    stop = k
                    break
                if k < e:
                    if same:  # every overflow from here leaves the state as it is
                        j = next_clean(k, e, s)
                        if j > k:
                            runs.append((k, j, True))
                            k = j
                    elif stretches and _cannot_move(p, s, h, bf, rounds):
                        over = np.frombuffer(flags, bool)[k - i:] if known else over_at(k, e, s)
                        g, over, tracker, hyst = _fixed_scale(p, s, t, h, over, _backoff_keeps(p, s, bf, rounds))
                        if g:
                            runs.append((k, k + g, over))
                            t, h = int(tracker[-1]), int(hyst[-1])
                            k += g
                        if g < _STRETCH // 4:  # short: not worth looking for more in this chunk
                            stretches = False
                continue
            # ----- a clean step k: d clean steps in a row reach the next growth
            if windowed:
                d = (w - t if t < 0 else w - t % w) if w >= 1 else inf
            elif t < gi:
                d = gi - t
            else:
                d = 1 if at_least else inf
            if d > 1:  # steps k.. only count, up to the next overflow or the growth step
                g = k + d - 1
                j = next_over(k + 1, g if g < e else e, s)
                t += j - k
                if counting:
                    sr += j - k
                if refill_clean:
                    h = full
                k = j
                continue
            # ----- step k grows (DynamicScaler.adjust, found_inf=False)
            if fast:
                f32(s * gf)
                ns = fb[-1]
            elif rounds:
                ns = _f32(s * gf)
            else:
                ns = s * gf
            if hi_clamp is not None:
                ns = min(ns, hi_clamp)
            if guard and not -inf < ns < inf:
                ns = s
            if windowed:
                nt, nw = t + 1, w
                if w >= 1:  # DynamicScaler._resized
                    nw = w * wg
                    nw = 1 if not nw >= 1 else int(nw) if -inf < nw < inf else w
            else:
                nt, nw = 0, 0
            put_pos(k)
            put_scale(ns)
            same = (ns == s or ns != ns) and nt == t and full == h and nw == w and sr == 0 and _identical(ns, s)
            s, t, h, w, sr = ns, nt, full, nw, 0
            k += 1
            if raise_zero and s == 0 and k < n:  # a ceiling of 0: the next step divides by it
                stop = k
                break
            if same and k < e:  # every clean step from here grows to the same state
                j = next_over(k, e, s)
                if j > k:
                    runs.append((k, j, False))
                    k = j
        out.session(i, k, s0, t0, h0, evp, evs, runs)
        density = len(evp) / max(k - i, 1)
        if stop is not None:
            out.step(stop, s, True, t, h)
            return stop + 1, ScalerState(s, t, h, True, ov, sr, w), stop, False
        # few events, and no long stretch taken at once: the event-by-event search is cheaper
        covered = sum(b - a for a, b, _ in runs)
        i = k
        if len(evp) < _SPARSE_EVENTS * (e - i0) // _CHUNK and 2 * covered < e - i0:
            break
    return i, ScalerState(s, t, h, False, ov, sr, w), None, False


def _count_steps(s: float, t: int, i: int, e: int, steps, known: bool, gf: float, bf: float, gi: int,
                 at_least: bool, tao: int, guard: bool, scale64: bool, out: _TraceArrays):
    """Steps [i, e) of torch's rule (no hysteresis, floor or ceiling) with a short growth
    interval: events come every few steps, so a loop over steps that keeps just the scale and the
    tracker is cheaper than one over events. Writes the trace; returns (scale, tracker) after."""
    inf = math.inf
    first = s
    new = array("d" if scale64 else "f")  # appending a double to an array("f") rounds it to float32
    put = new.append
    counts = array("q")
    count = counts.append
    if not known:
        thresholds = array("d")
        thresholds.frombytes(steps.tobytes())
        steps = thresholds
    for x in steps:
        if (not x) if known else -x < s < x:  # a clean step
            t += 1
            if t == gi or at_least and t > gi:
                put(s * gf)
                t = 0
                if guard and not -inf < new[-1] < inf:
                    new[-1] = s  # refused: the old scale stays
                else:
                    s = new[-1]
            else:
                put(s)
        else:
            put(s * bf)
            s = new[-1]
            t = tao
        count(t)
    _write_loop(out, i, e, first, new, steps, known)
    out.tracker[i:e] = np.frombuffer(counts, np.int64)
    return s, t


def _write_loop(out: _TraceArrays, i: int, e: int, first: float, new, steps, known: bool) -> np.ndarray:
    """Steps [i, e) of a loop that kept only the scale after each step (``new``, an array of the
    scale's type) into the trace: the scale before each step, whether it overflowed (``steps``:
    a byte per step, or each step's threshold) and hysteresis 1. Returns the skipped flags."""
    scale = out.scale[i:e]
    scale[0] = first
    scale[1:] = np.frombuffer(new, scale.dtype)[:-1]
    skipped = out.skipped[i:e]
    if known:
        skipped[:] = np.frombuffer(steps, bool)
    else:
        skipped[:] = ~(np.abs(scale.astype(np.float64)) < np.frombuffer(steps, np.float64))
    if not out.fixed_hyst:
        out.hyst[i:e] = 1
    return skipped


def _grow_or_back(s: float, i: int, e: int, steps, known: bool, gf: float, bf: float, guard: bool,
                  scale64: bool, exact: bool, out: _TraceArrays, tao: int) -> float:
    """Steps [i, e) where every clean step grows and every overflow backs off: the growth
    tracker is 0 or ``tracker_after_overflow`` after each step and the hysteresis 1, so the scale
    is the whole state, and this loop computes just that. ``steps`` holds one byte per step
    (found_inf) or the thresholds (grad_max). With ``exact`` (float64 arithmetic, or factors
    that are float32 values, so each update is one correctly rounded multiplication in the
    scale's own type), known steps need no loop: numpy's running product (``multiply.accumulate``
    multiplies in order, rounding each product) gives the same scales. Writes the trace;
    returns the last scale."""
    inf = math.inf
    first = s
    dtype = out.scale.dtype
    if known and exact and (scale64 or _f32(s) == s or s != s):  # known steps: a running product
        factors = np.where(np.frombuffer(steps, bool), dtype.type(bf), dtype.type(gf))
        after = np.multiply.accumulate(np.concatenate(([dtype.type(s)], factors)))[1:]
        # a growth to inf that the guard refuses breaks the product: then step by step
        if not guard or np.isfinite(after).all() or not math.isfinite(s) and not np.isfinite(after).any():
            scale = out.scale[i:e]
            scale[0] = first
            scale[1:] = after[:-1]
            skipped = out.skipped[i:e]
            skipped[:] = np.frombuffer(steps, bool)
            out.tracker[i:e] = np.where(skipped, np.int32(tao), np.int32(0))
            if not out.fixed_hyst:
                out.hyst[i:e] = 1
            return float(after[-1])
    new = array("d" if scale64 else "f")  # appending a double to an array("f") rounds it to float32
    put = new.append
    if known:
        for f in steps:
            if f:
                put(s * bf)
                s = new[-1]
            else:
                put(s * gf)
                if guard and not -inf < new[-1] < inf:
                    new[-1] = s  # refused: the old scale stays
                else:
                    s = new[-1]
    else:
        thresholds = array("d")
        thresholds.frombytes(steps.tobytes())
        for x in thresholds:
            if -x < s < x:
                put(s * gf)
                if guard and not -inf < new[-1] < inf:
                    new[-1] = s
                else:
                    s = new[-1]
            else:
                put(s * bf)
                s = new[-1]
    skipped = _write_loop(out, i, e, first, new, steps, known)
    out.tracker[i:e] = np.where(skipped, np.int32(tao), np.int32(0))
    return s
