"""A census as a figure: ``plot_census`` draws the histogram of log2 |value × scale| over a
format's bands, with each band's share, and ``census_x_range`` the x range it uses."""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go

from ampviz.formats.census import CensusResult, census
from ampviz.formats import get_format
from ampviz.plots.arguments import _shown, _title
from ampviz.plots.formats import _band_hover, _log2_window, _past_max, band_edges
from ampviz.plots.style import (BAND_CATEGORIES, BAND_OPACITY, CATEGORY_COLORS, _LABELS_AS_THEY_ARE, _LINEAR,
                                _figure)
from ampviz.plots.text import _pow2_short, format_pow2, format_share, format_shares


#: A census bar shorter than this share of the tallest one (a few pixels) gets a mark on the axis.
_SMALL_BAR = 0.015
#: What such a mark stands for, as the legend says it, and as its hover says it (above the count).
SMALL_BAR_KEY = "a bar too short to see (hover it for its count)"
_SMALL_BAR_HOVER = "a bar too short to see at this height, not values beyond the axis"
#: A census's count axis reaches this many times its tallest bar: the top is for the labels.
_HEADROOM = 1.45


def census_x_range(fmt, log2_lo=None, log2_hi=None) -> tuple[int, int]:
    """The x range ``plot_census`` uses: ``fmt``'s band edges plus 10 binades each side, widened to
    hold the bins ``log2_lo`` .. ``log2_hi`` (each bin e spans [e, e + 1)) plus one binade.

    An explorer passes the lowest and highest bin its scale slider can reach, so the axis stays put
    while the histogram moves.
    """
    lo, hi = _log2_window([get_format(fmt)], margin=10.0, step=1)
    if log2_lo is not None:
        lo = min(lo, int(log2_lo) - 1)
    if log2_hi is not None:
        hi = max(hi, int(log2_hi) + 2)
    return lo, hi


def plot_census(data, fmt="fp16", scale=1.0, title=None, x_range=None, *, legend: bool = True,
                shares: bool = True) -> go.Figure:
    """Histogram of log2 |value × scale| laid over ``fmt``'s bands, with each category's share.

    ``data``: a ``CensusResult`` (then ``fmt`` and ``scale`` are the census's own), or values / a
    ``Profile`` (then ``census(data, fmt, scale)`` is taken). Bar ``e`` counts the scaled values
    with 2^e <= |v| < 2^(e+1) (``log2_bins``, ``log2_counts``). The x range is fixed by the format
    (its window plus 10 binades each side, widened to hold every bar) unless ``x_range`` is given,
    so at a fixed ``x_range`` the histogram moves when the scale changes. The shares are printed on
    the figure (annotation named "shares") and kept in ``fig.layout.meta``. The legend names the
    four bands and the mark under a bar too short to see; ``legend=False`` leaves it out
    (RangeExplorer, whose readout names them beside their colours: plotly redraws the figure
    about 5 ms sooner without it, of some 30).
    ``shares=False`` leaves the shares line out (RangeExplorer's readout prints them), so that the
    layout stays the same while the scale moves.

    Traces: ``data[0]`` is a bar trace of the counts (``x`` the binades' middles, ``y`` the counts)
    drawn with no opacity: it carries the hover of each binade. What shows are each band's bars, as
    one filled outline per band (``meta`` ``{"band": ...}``, kind ``"bars"``), and a mark on the
    axis under each bar too short to see (kind ``"few"``, one trace per band; its hover says what
    the mark is, above the binade's count), and last a trace with no points that keys those marks
    in the legend (kind ``"few-key"``, named ``SMALL_BAR_KEY``). Every band has its
    two traces, empty or not, so a scale move changes only points: FigureView then moves the traces
    instead of redrawing the figure (in a bare page 7-14 ms against a full redraw's 19-31), and the
    outlines draw the same pixels either way (plotly rounds a bar's edges to whole pixels only in a
    full redraw, so bars drawn as bars could not be moved).
    """
    result = data if isinstance(data, CensusResult) else census(data, fmt, scale)
    _title(title)
    if not isinstance(legend, (bool, np.bool_)):
        raise TypeError(f"legend must be True or False, got {_shown(legend)}")
    if not isinstance(shares, (bool, np.bool_)):
        raise TypeError(f"shares must be True or False, got {_shown(shares)}")
    f = result.fmt
    bins = np.asarray(result.log2_bins, dtype=np.int64)
    counts = np.asarray(result.log2_counts, dtype=np.int64)
    if x_range is not None:
        try:
            lo_given, hi_given = (float(v) for v in x_range)
        except (TypeError, ValueError):
            raise TypeError(f"x_range must be two numbers (lowest, highest log2), got {_shown(x_range)}") from None
        if not (math.isfinite(lo_given) and math.isfinite(hi_given) and lo_given < hi_given):
            raise ValueError(f"x_range must be two finite numbers, lowest first, got {_shown(x_range)}")
    if x_range is None:
        x_range = census_x_range(f, *((int(bins.min()), int(bins.max())) if bins.size else ()))
    lo_x, hi_x = float(x_range[0]), float(x_range[1])

    edges = band_edges(f)
    shapes = []
    for cat in BAND_CATEGORIES:
        lo, hi = edges[cat]
        x0 = lo_x if lo == 0 else max(math.log2(lo), lo_x)
        x1 = hi_x if math.isinf(hi) else min(math.log2(hi), hi_x)
        shapes.append(
            {
                "type": "rect",
                "name": cat,
                "xref": "x",
                "yref": "paper",
                "x0": x0,
                "x1": max(x0, x1),
                "y0": 0,
                "y1": 1,
                "fillcolor": CATEGORY_COLORS[cat],
                "opacity": BAND_OPACITY,
                "line": {"width": 0},
                "layer": "below",
                "showlegend": bool(legend),
                "legendgroup": cat,
            }
        )
    annotations = []
    for i, (name, label, v) in enumerate(
        (
            ("smallest_subnormal", "smallest subnormal", f.smallest_subnormal),
            ("smallest_normal", "smallest normal", f.smallest_normal),
            ("max", "max", f.max),
        )
    ):
        x = math.log2(v)
        shapes.append(
            {
                "type": "line",
                "name": name,
                "xref": "x",
                "yref": "paper",
                "x0": x,
                "x1": x,
                "y0": 0,
                "y1": 1,
                "line": {"color": "#555555", "width": 1, "dash": "dot"},
            }
        )
        annotations.append(
            {
                "name": name,
                "x": x,
                "xref": "x",
                "y": 0.98 if i != 1 else 0.84,
                "yref": "paper",
                "xanchor": "right" if name == "max" else "left",
                "yanchor": "top",
                "xshift": -3 if name == "max" else 3,
                "bgcolor": "rgba(255,255,255,0.75)",
                "showarrow": False,
                "align": "right" if name == "max" else "left",
                "font": {"size": 11, "color": "#333333"},
                "text": f"{_pow2_short(v)}<br>{label}",
                "hovertext": f"{f.name} {label}: {format_pow2(v)}",
            }
        )
    # what happens in the two outer bands, written inside them at their inner edge, on the row of
    # the "smallest normal" label (which sits between them), under the other two labels' row; a
    # band too narrow on screen for its words (bf16's overflow band, 10 binades of 282) gets them
    # against the plot's outer edge instead, reaching into the next band: never cut by the edge
    for cat, text, x, side in (
        ("underflow", "becomes 0", math.log2(f.underflow_boundary), "right"),
        ("overflow", _past_max(f).replace(" (", "<br>("), math.log2(f.overflow_boundary), "left"),
    ):
        room = (x - lo_x if side == "right" else hi_x - x) / (hi_x - lo_x) * _PLOT_PX \
            + (_MARGIN_PX["l"] if side == "right" else _MARGIN_PX["r"])
        if room < _text_px(text):
            x, side = (lo_x, "left") if side == "right" else (hi_x, "right")
        annotations.append(
            {
                "name": f"{cat}-band",
                "x": x,
                "xref": "x",
                "y": 0.84,
                "yref": "paper",
                "xanchor": side,
                "yanchor": "top",
                "xshift": 3 if side == "left" else -3,
                "align": side,
                "bgcolor": "rgba(255,255,255,0.75)",
                "showarrow": False,
                "font": {"size": 11, "color": CATEGORY_COLORS[cat]},
                "text": text,
                "hovertext": _band_hover(f, cat),
            }
        )
    share_line = format_shares(result)
    counted = " · ".join(  # a share too small to see as a bar also says how many values it is
        f"{k} {_count_label(result.counts[k])}" for k in BAND_CATEGORIES if 0 < result.fractions[k] < 0.01
    ) if shares else ""
    if shares:
        annotations.append({
            "name": "shares",
            "x": 0,
            "xref": "paper",
            "y": 1.0,
            "yref": "paper",
            "xanchor": "left",
            "yanchor": "bottom",
            "yshift": 4,
            "showarrow": False,
            "font": {"size": 13},
            "align": "left",
            "text": share_line + (f"<br><span style='font-size:11px'>({counted})</span>" if counted else ""),
        })

    n = max(result.total, 1)
    hover = [
        f"2^{e} ≤ |v·scale| < 2^{e + 1}<br>{_count_label(c)} ({format_share(c / n)})"
        for e, c in zip(bins.tolist(), counts.tolist())
    ]
    # each bar in the colour of the band its binade lies in (a binade that straddles an edge: the
    # band of its middle), so the bands stay readable through the histogram
    mids = bins + 0.5
    bar_cats = np.select(
        [mids <= math.log2(f.underflow_boundary), mids < math.log2(f.smallest_normal),
         mids < math.log2(f.overflow_boundary)],
        ["underflow", "subnormal", "normal"], "overflow",
    ) if bins.size else np.zeros(0, dtype=str)
    tallest = int(counts.max()) if counts.size else 0
    small = (counts > 0) & (counts < _SMALL_BAR * tallest)
    # the counts and their hover: a bar per binade that shows nothing (hovering anywhere over a bar
    # names its binade and count)
    traces = [{
        "type": "bar",
        "name": "values × scale",
        "x": mids.astype(float),
        "y": counts,
        "width": 1.0,
        "opacity": 0,
        "marker": {"color": "#000000", "line": {"width": 0}},
        "hovertext": hover,
        "hoverinfo": "text",
        "hoverlabel": {"bgcolor": "#ffffff", "bordercolor": "#555555", "font": {"color": "#222222"}},
        "showlegend": False,
        "meta": {"kind": "counts"},
    }]
    for cat in BAND_CATEGORIES:
        mine = bar_cats == cat
        # the band's bars as one outline: left foot, left top, right top, right foot, then a gap
        # (NaN) before the next bar; plotly fills each piece on its own
        left, height = bins[mine].astype(float), counts[mine].astype(float)
        xs = np.stack([left, left, left + 1, left + 1, np.full_like(left, np.nan)], axis=1).ravel()[:-1]
        ys = np.stack([np.zeros_like(height), height, height, np.zeros_like(height),
                       np.full_like(height, np.nan)], axis=1).ravel()[:-1]
        traces.append({
            "type": "scatter",
            "name": f"{cat} bars",
            "x": xs,
            "y": ys,
            "mode": "lines",
            "fill": "toself",
            "fillcolor": CATEGORY_COLORS[cat],
            "line": {"width": 1, "color": "rgba(0,0,0,0.55)"},
            "hoverinfo": "skip",
            "showlegend": False,
            "meta": {"kind": "bars", "band": cat},
        })
    # a bar too short to see gets a mark on the axis under it, visible at any width (its count in
    # the hover, and the count of a band that small under the shares line); the mark says what it
    # is in its hover, and the legend has a key for it (the tails of a census are where they sit,
    # and a triangle at the end of a histogram reads as "more values beyond the axis": the axis
    # always holds every bar)
    for cat in BAND_CATEGORIES:
        mine = small & (bar_cats == cat)
        traces.append({
            "type": "scatter",
            "name": f"few {cat} values",
            "x": mids[mine].astype(float),
            "y": np.zeros(int(mine.sum())),
            "mode": "markers",
            "marker": {"symbol": "triangle-up", "size": 9, "color": CATEGORY_COLORS[cat],
                       "line": {"width": 1, "color": "#333333"}},
            "cliponaxis": False,
            "hovertext": [f"▲ {_SMALL_BAR_HOVER}<br>{h}" for h, s in zip(hover, mine.tolist()) if s],
            "hoverinfo": "text",
            "showlegend": False,
            "meta": {"kind": "few", "band": cat},
        })
    # the legend's key for those marks (a trace whose one point is NaN: it draws nothing), in
    # every census figure, so that the traces are the same with the legend or without it
    traces.append({
        "type": "scatter",
        "name": SMALL_BAR_KEY,
        "x": np.full(1, np.nan),
        "y": np.full(1, np.nan),
        "mode": "markers",
        "marker": {"symbol": "triangle-up", "size": 9, "color": "#BBBBBB",
                   "line": {"width": 1, "color": "#333333"}},
        "hoverinfo": "skip",
        "showlegend": bool(legend),
        "legendrank": 1001,  # after the four bands (at plotly's 1000)
        "meta": {"kind": "few-key"},
    })
    if title is None:
        title = f"{_count_label(result.total)} in {f.name} at scale = {format_pow2(result.scale)}"
    layout = {
        "title": {"text": title, "x": 0.01, "y": 0.97, "yanchor": "top"},
        "shapes": shapes,
        "annotations": annotations,
        "bargap": 0,
        # the same plot area with or without the legend and the shares line
        "height": (420 if legend else 380) - (0 if shares else 30),
        "margin": {**_MARGIN_PX, "t": (100 if counted else 90) if shares else 60, "b": 100 if legend else 60},
        "template": "plotly_white",
        # at the bottom of the figure, under the axis title, with room for a second row
        "legend": {"orientation": "h", "x": 0.01, "y": 0, "yref": "container", "yanchor": "bottom"},
        "showlegend": bool(legend),
        "hovermode": "closest",
        "meta": {
            "fmt": f.name,
            "scale": result.scale,
            "total": result.total,
            "counts": dict(result.counts),
            "fractions": dict(result.fractions),
            "shares": share_line,
        },
        "xaxis": {"range": [lo_x, hi_x], "title": {"text": "|value × scale| on a log2 axis"}, "tickprefix": "2^",
                  "zeroline": False, **_LABELS_AS_THEY_ARE, **_LINEAR},
        # counts as a learner writes them (2,000, not 2k), whole numbers only, and headroom above the
        # tallest bar for the labels at the top (the bars never hide behind them)
        "yaxis": {"title": {"text": "values per binade"}, "range": [0, _HEADROOM * max(tallest, 1)], "tickformat": ",",
                  **({"dtick": 1} if tallest <= 5 else {}), **_LABELS_AS_THEY_ARE, **_LINEAR},
    }
    return _figure(traces, layout)


#: The census figure's side margins, and the narrowest plot area (pixels) its band labels are
#: placed for (a figure in a narrow notebook column; wider ones only have more room).
_MARGIN_PX = {"l": 60, "r": 30}
_PLOT_PX = 560


def _text_px(text: str, size: int = 11) -> float:
    """About how wide ``text`` (lines split by "<br>") is drawn at font ``size`` in pixels, its
    background's padding and shift included: 0.62 em a character, as wide as plotly's Open Sans
    draws digits and lower-case letters."""
    longest = max((len(line) for line in text.split("<br>")), default=0)
    return longest * 0.62 * size + 8


def _count_label(n: int) -> str:
    """"1 value" / "1,000 values"."""
    return f"{n:,} value" + ("" if n == 1 else "s")
