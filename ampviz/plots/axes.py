"""Long series made short and axes chosen for them, shared by the step-line figures: log2 of a
scale (0 and gaps drawn), where a run of equal values changes, thinning marks evenly (and saying
how many are marked), axis ranges that move only at whole ticks, and ticks at powers of two."""

from __future__ import annotations

import numpy as np


_LOG2_FLOOR = -150  # where a scale of exactly 0 is drawn (below float32's smallest subnormal)


def _log2_scale(scale: np.ndarray) -> np.ndarray:
    """log2 of |scale|, with 0 drawn at ``_LOG2_FLOOR`` and NaN (a stopped run) kept as a gap."""
    a = np.abs(np.asarray(scale, dtype=np.float64))
    with np.errstate(divide="ignore"):
        out = np.log2(a)
    out[a == 0] = _LOG2_FLOOR
    return out


def _changes(values) -> np.ndarray:
    """The indices whose value differs from the one before it (NaN equal to NaN): where each run
    of equal ``values`` after the first begins."""
    v = np.asarray(values)
    same = v[1:] == v[:-1]
    if v.dtype.kind in "fc":
        same |= np.isnan(v[1:]) & np.isnan(v[:-1])
    return np.flatnonzero(~same) + 1


def _thin(idx: np.ndarray, most: int) -> np.ndarray:
    """At most ``most`` of the indices, evenly spread (markers beyond a few thousand only cost)."""
    if idx.size <= most:
        return idx
    return idx[np.linspace(0, idx.size - 1, most).round().astype(np.int64)]


def _marked_part(shown: int, total: int) -> str:
    """How many of ``total`` skipped steps are marked, in words: "" (all), "1 in 6", or "60 of 64"
    (where "1 in 1" would round away the difference)."""
    if shown >= total:
        return ""
    ratio = total / max(shown, 1)
    return f"1 in {ratio:.0f}" if ratio >= 1.5 else f"{shown:,} of {total:,}"


def _padded_range(values, step: float) -> list | None:
    """An axis range over the finite ``values``, a quarter ``step`` beyond them and then out to
    the next multiples of ``step``: it moves only when the values cross a multiple plus or minus a
    quarter step (a slider's figure then keeps its layout, and the browser draws it without a full
    redraw), and values on whole multiples, as scales of powers of two are, sit between those
    edges. None when no value is finite."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if not v.size:
        return None
    pad = step / 4
    return [float(np.floor((v.min() - pad) / step) * step), float(np.ceil((v.max() + pad) / step) * step)]


def _share_top(percent) -> float:
    """The top of a share axis (percent) that starts at 0: the first of 1, 2, 5 × 10^k at or above
    1.2 times the largest finite share (1 when there is none above 0), so that it rarely moves
    and the largest share fills a third of the axis or more."""
    v = np.asarray(percent, dtype=np.float64)
    v = v[np.isfinite(v)]
    top = 1.2 * float(v.max()) if v.size else 0.0
    if top <= 0:
        return 1.0
    for k in range(-6, 4):
        for m in (1, 2, 5):
            if m * 10.0 ** k >= top:
                return float(m * 10.0 ** k)
    return top


def _log2_ticks(values) -> dict:
    """Axis settings for log2 values: ticks at whole powers of two, at most about 6 of them,
    written "2^16" (never "2^15.5")."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    span = float(v.max() - v.min()) if v.size else 0.0
    step = next((d for d in (1, 2, 5, 10, 20, 25, 50, 100) if span / d <= 6), 200)
    return {"tickmode": "linear", "tick0": 0, "dtick": step, "tickprefix": "2^"}


def _finite_log2(values) -> np.ndarray:
    """log2 |values| (float64), with 0, inf and NaN as NaN (a gap in a line)."""
    a = np.abs(np.asarray(values, np.float64))
    out = np.full(a.shape, np.nan)
    ok = np.isfinite(a) & (a > 0)
    out[ok] = np.log2(a[ok])
    return out
