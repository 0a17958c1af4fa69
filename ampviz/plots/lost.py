"""Updates a low-precision weight loses, as a figure: ``plot_lost_band`` draws, for every value w
of a format in a range, the band of updates u (relative to w) that w + u rounds back to w."""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go

from ampviz.formats import FloatFormat, get_format
from ampviz.plots.arguments import _shown, _title
from ampviz.plots.style import Figure, _WHITE, _WHITE_AXIS
from ampviz.plots.text import _pow2_short, _power_text, format_number


# The most weights ``plot_lost_band`` draws (a wider range is drawn at evenly spaced bit patterns).
_LOST_BAND_POINTS = 4096
_BAND_FILL = "rgba(0, 114, 178, 0.25)"  # blue, as underflow: the update vanishes
_BAND_LINE = "#0072B2"
_POINT_COLORS = {"lost": "#0072B2", "kept": "#D55E00"}


def _float(value) -> float:
    """A real number as a float (inf for an int beyond float64's range)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _positive_number(value, what: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{what} must be a positive number, got {_shown(value)}")
    x = _float(value)
    if not (math.isfinite(x) and x > 0):
        raise ValueError(f"{what} must be a positive finite number (the band of -w mirrors that of w), got "
                         f"{_shown(value)}")
    return x


def _band_weights(f: FloatFormat, w_min: float, w_max: float) -> np.ndarray:
    """Every value of f in [w_min, w_max] (at most ``_LOST_BAND_POINTS`` of them, evenly spaced bit
    patterns plus every power of two, where the band jumps)."""
    p0 = int(f.encode(w_min))
    p0 += int(f.decode(p0) < w_min)
    p1 = int(f.encode(w_max))
    p1 -= int(not f.decode(p1) <= w_max)  # (also steps back from inf to max)
    if p1 < p0:
        raise ValueError(f"no {f.name} value lies between w_min = {format_number(w_min)} and "
                         f"w_max = {format_number(w_max)}: widen the range")
    if p1 - p0 + 1 <= _LOST_BAND_POINTS:
        patterns = np.arange(p0, p1 + 1)
    else:
        lo_e = max(math.floor(math.log2(w_min)), f.emin - f.mantissa_bits)
        powers = np.arange(lo_e, min(math.ceil(math.log2(w_max)), f.emax) + 1)
        pow2 = [p for p in (int(f.encode(2.0 ** e)) for e in powers) if p0 <= p <= p1]
        patterns = np.unique(np.concatenate([np.linspace(p0, p1, _LOST_BAND_POINTS).round().astype(np.int64),
                                             np.asarray(pow2, dtype=np.int64)]))
    return np.asarray(f.decode(patterns), dtype=np.float64)


def _band_points(points, f: FloatFormat, via):
    """(stored |w|, u/w, lost?) for each (w, u) pair of ``points``."""
    from ampviz.formats.lesson import update_lost

    try:
        pairs = [(w, u) for w, u in points]
    except (TypeError, ValueError):
        raise TypeError(f"points must be a list of (w, u) pairs of numbers, got {_shown(points)}") from None
    out = []
    for w, u in pairs:
        for value, what in ((w, "w"), (u, "u")):
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise TypeError(f"points must be (w, u) pairs of numbers, got {what} = {_shown(value)}")
        wq = float(f.quantize(w))
        if not (math.isfinite(wq) and wq != 0 and math.isfinite(_float(u))):
            raise ValueError(f"points: w must store as a nonzero finite {f.name} value and u must be finite, got "
                             f"({_shown(w)}, {_shown(u)})")
        out.append((abs(wq), _float(u) / wq, bool(update_lost(wq, u, f, via=via)), w, u))
    return out


def plot_lost_band(fmt="fp16", w_min=1.0, w_max=4.0, *, points=None, via=None, title=None) -> go.Figure:
    """The band of updates lost on a weight, relative to the weight: for every value w of ``fmt``
    from ``w_min`` to ``w_max`` (positive), the most negative and the largest lost update divided
    by w (``ampviz.formats.lesson.lost_band``), filled between. Dotted lines mark eps/2 and eps/4
    (1/2048 and 1/4096 in fp16): just above a power of two the band reaches eps/2 upwards and
    eps/4 downwards, then it narrows towards eps/4 on both sides until the next power of two.

    ``points``: optional (w, u) pairs, drawn at |w| and u / w as "lost" or "kept" markers
    (``ampviz.formats.lesson.update_lost``; a negative w is drawn as -w with -u, which rounds alike).
    ``via``: None or "fp32", as in ``update_lost``. The x axis is log2-spaced (one binade, one
    width); a range of more than 4096 values is drawn at 4096 evenly spaced bit patterns plus
    every power of two.
    """
    from ampviz.formats.lesson import lost_band

    f = get_format(fmt)
    _title(title)
    lo_w, hi_w = _positive_number(w_min, "w_min"), _positive_number(w_max, "w_max")
    if not lo_w < hi_w:
        raise ValueError(f"w_min must be below w_max, got {format_number(lo_w)} and {format_number(hi_w)}")
    ws = _band_weights(f, lo_w, hi_w)
    lo, hi = lost_band(ws, f, via=via)  # (refuses any via but None and "fp32")
    via_name = None if via is None else "fp32"
    marks = [] if points is None else _band_points(points, f, via)
    half, quarter = f.eps / 2, f.eps / 4
    hover = [f"w = {format_number(w, 8)}<br>lost: u from {format_number(a, 6)} to {format_number(b, 6)}"
             f"<br>u / w from {format_number(a / w, 4)} to {format_number(b / w, 4)}"
             for w, a, b in zip(ws.tolist(), lo.tolist(), hi.tolist())]
    data = [
        {"type": "scatter", "x": ws, "y": lo / ws, "mode": "lines", "line": {"color": _BAND_LINE, "width": 1},
         "name": "most negative lost update / w", "showlegend": False, "hovertext": hover, "hoverinfo": "text",
         "meta": {"kind": "lower"}},
        {"type": "scatter", "x": ws, "y": hi / ws, "mode": "lines", "line": {"color": _BAND_LINE, "width": 1},
         "fill": "tonexty", "fillcolor": _BAND_FILL, "name": "lost: u / w inside the band",
         "hovertext": hover, "hoverinfo": "text", "meta": {"kind": "upper"}},
    ]
    for kind, symbol in (("lost", "circle"), ("kept", "diamond")):
        shown = [m for m in marks if m[2] == (kind == "lost")]
        if shown:
            data.append({
                "type": "scatter", "x": [m[0] for m in shown], "y": [m[1] for m in shown], "mode": "markers",
                "marker": {"symbol": symbol, "size": 10, "color": _POINT_COLORS[kind],
                           "line": {"color": "white", "width": 1}},
                "name": f"{kind} update", "hoverinfo": "text", "meta": {"kind": kind},
                "hovertext": [f"w = {format_number(m[3], 8)}, u = {format_number(m[4], 6)}: {kind}"
                              for m in shown],
            })
    lines = [(sign * y, f"{'-' if sign < 0 else ''}1/{round(1 / y)}") for y in (half, quarter) for sign in (1, -1)]
    shapes = [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": y, "y1": y,
               "line": {"color": "#888888", "width": 1, "dash": "dot"}} for y, _ in lines]
    notes = [{"x": 1, "xref": "paper", "y": y, "yref": "y", "xanchor": "right", "yanchor": "bottom",
              "showarrow": False, "text": text, "font": {"size": 11, "color": "#666666"}} for y, text in lines]
    exps = range(math.floor(math.log2(ws[0])), math.floor(math.log2(ws[-1])) + 1)
    powers = [2.0 ** e for e in exps[::max(1, math.ceil(len(exps) / 12))]]  # at most about 12 ticks
    # below 1 either every tick is a short decimal (0.5, 0.25) or every one is a power (2^-7)
    as_pow2 = any(p < 1 and _power_text(p).startswith("2^") for p in powers)
    via_note = "" if via_name is None else ", update and sum in fp32"
    layout = {
        **_WHITE,
        "title": {"text": title or f"Updates a {f.name} weight loses (u / w inside the band){via_note}", "x": 0.01},
        "height": 420,
        "margin": {"l": 80, "r": 20, "t": 60, "b": 60},
        "legend": {"orientation": "h", "x": 0.01, "y": -0.18, "yanchor": "top"},
        "xaxis": {**_WHITE_AXIS, "type": "log", "title": {"text": f"weight w ({f.name} values, log axis)"},
                  "tickvals": powers,
                  "ticktext": [_pow2_short(p) if as_pow2 and p < 1 else _power_text(p) for p in powers]},
        "yaxis": {**_WHITE_AXIS, "title": {"text": "update / weight (u / w)"}, "exponentformat": "power"},
        "shapes": shapes,
        "annotations": notes,
        "meta": {"fmt": f.name, "via": via_name, "weights": int(ws.size)},
    }
    return Figure(data=data, layout=layout)
