"""Figures: data in, ``plotly.graph_objects.Figure`` out.

Every ``plot_*`` function is pure: it reads a format (``ampviz.formats``) or a census
(``ampviz.formats.census``) and returns a new figure, so notebooks can show it, tests can assert on
``fig.data`` / ``fig.layout``, and explorers can redraw it on every change.

Magnitudes are drawn on a log2 axis: x = log2 |value|, so one unit is one binade [2^e, 2^(e+1)).
A format's window is split into the bands that ``FloatFormat.classify`` sorts values into, with
edges taken from the format's own constants:

* underflow: 0 < |x| <= ``underflow_boundary`` (half the smallest subnormal) becomes 0;
* subnormal: ``underflow_boundary`` < |x| < ``smallest_normal`` (stored with fewer bits);
* normal: ``smallest_normal`` <= |x| < ``overflow_boundary`` (values above ``max`` round down to it);
* overflow: |x| >= ``overflow_boundary`` becomes inf (in an "fn" format such as fp8 E4M3 only
  values above the boundary overflow, and torch's cast saturates them to ``max``; ml_dtypes' cast
  gives NaN). The figures write in the band what happens there ("becomes inf", "saturates to 448").

Colours are fixed per category (``CATEGORY_COLORS``) and per bit field (``FIELD_COLORS``).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

from ampviz.formats.census import CensusResult, census
from ampviz.formats import CATEGORIES, FloatFormat, get_format

__all__ = [
    "BAND_CATEGORIES",
    "BAND_OPACITY",
    "CATEGORY_COLORS",
    "DEFAULT_RANGE_FORMATS",
    "FIELD_COLORS",
    "HEAT_MODE_ORDER",
    "LINE_POINTS",
    "LIVE_DATA_KEYS",
    "band_edges",
    "census_x_range",
    "format_number",
    "format_pow2",
    "format_shares",
    "format_share",
    "heat_mode_of",
    "live_traces",
    "lost_shares",
    "plot_census",
    "plot_format_ranges",
    "plot_live",
    "plot_lost_band",
    "plot_scale_trace",
    "plot_value",
]

#: One colour per category of ``ampviz.formats.CATEGORIES`` (Okabe-Ito, readable for colour-blind eyes).
CATEGORY_COLORS = {
    "zero": "#999999",
    "underflow": "#0072B2",  # blue: the value vanishes
    "subnormal": "#56B4E9",  # light blue: kept, with fewer significant bits
    "normal": "#009E73",  # green: full precision
    "overflow": "#D55E00",  # vermillion: inf, or saturated to max
    "nan": "#CC79A7",
}

#: One colour per field of a bit pattern.
FIELD_COLORS = {"sign": "#CC79A7", "exponent": "#56B4E9", "mantissa": "#E69F00"}

#: The categories a magnitude can land in, left to right on a log2 axis.
BAND_CATEGORIES = ("underflow", "subnormal", "normal", "overflow")

#: The formats ``plot_format_ranges`` compares by default, widest first.
DEFAULT_RANGE_FORMATS = ("fp32", "tf32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2")

#: How opaque the bands of categories are drawn (their colour over white: light enough to read bars on).
BAND_OPACITY = 0.18
#: A census bar shorter than this share of the tallest one (a few pixels) gets a mark on the axis.
_SMALL_BAR = 0.015
#: A census's count axis reaches this many times its tallest bar: the top is for the labels.
_HEADROOM = 1.45
#: Where ``plot_value`` draws its markers: a row above the band row (at 0, 0.5 thick).
_VALUE_MARK_Y = 0.45


# ----- numbers as text -----
def format_number(x, digits: int = 3) -> str:
    """x as short text: whole numbers below 10^7 in full ("65504"), others with ``digits``
    significant digits ("5.96e-08"); "inf", "-inf", "nan" for the specials."""
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == int(x) and abs(x) < 1e7:
        return ("-" if math.copysign(1.0, x) < 0 else "") + str(abs(int(x)))
    return f"{x:.{digits}g}"


def format_pow2(x, digits: int = 3) -> str:
    """x as a power of two and a decimal: "2^-24 ≈ 5.96e-08", "2^0 = 1",
    "(2 - 2^-10)·2^15 = 65504" (the shape of a format's max), otherwise "0.1 ≈ 2^-3.32".

    "=" when the decimal is exact, "≈" when it is rounded to ``digits`` significant digits.
    """
    x = float(x)
    if x == 0 or not math.isfinite(x):
        return format_number(x)
    sign = "-" if x < 0 else ""
    a = abs(x)
    dec = format_number(a, digits)
    rel = "=" if float(dec) == a else "≈"
    frac, e = math.frexp(a)  # a = frac * 2**e, frac in [0.5, 1)
    if frac == 0.5:
        return f"{sign}2^{e - 1} {rel} {sign}{dec}"
    dfrac, de = math.frexp(2.0 - 2.0 * frac)  # 2 - (significand in [1, 2))
    if dfrac == 0.5 and de - 1 <= -2:
        return f"{sign}(2 - 2^{de - 1})·2^{e - 1} {rel} {sign}{dec}"
    log2 = math.log2(a)
    shown = f"{log2:.2f}" if abs(log2) >= 0.005 else f"{log2:.2g}"  # never "2^0.00" for a number that is not 1
    return f"{sign}{dec} ≈ {sign}2^{shown}"


def _power_text(p: float) -> str:
    """A power of two as a tick label: a short exact decimal ("4", "2048", "0.125") when there is
    one, else "2^-7" (never the rounded "0.00781")."""
    text = format_number(p, 17)
    return text if len(text) <= 6 and float(text) == p else _pow2_short(p)


def _pow2_short(x) -> str:
    """"2^-24" for a power of two, else the short decimal ("65504", "3.39e+38")."""
    frac, e = math.frexp(float(x))
    return f"2^{e - 1}" if frac == 0.5 else format_number(x)


def format_share(fraction) -> str:
    """A share as a percentage with 3 significant digits; never rounds a nonzero share to 0% or
    a share below one to 100% ("<0.01%", ">99.9%")."""
    fraction = float(fraction)
    if fraction <= 0:
        return "0%"
    if fraction >= 1:
        return "100%"
    pct = 100.0 * fraction
    if pct < 0.01:
        return "<0.01%"
    text = f"{pct:.3g}"
    return ">99.9%" if float(text) >= 100 else f"{text}%"


def format_shares(result: CensusResult) -> str:
    """The shares of a census as one line: "underflow 31.2% · subnormal 4.1% · normal 64.7% ·
    overflow 0%", with zero and nan added only when the census has some."""
    _census_result(result)
    shown = [k for k in CATEGORIES if k in BAND_CATEGORIES or result.counts[k]]
    return " · ".join(f"{k} {format_share(result.fractions[k])}" for k in shown)


# ----- the bands of a format -----
def band_edges(fmt) -> dict:
    """Magnitude edges (lo, hi) of each band of ``BAND_CATEGORIES``, from the format's constants.

    ``underflow`` is (0, underflow_boundary), ``subnormal`` (underflow_boundary, smallest_normal),
    ``normal`` (smallest_normal, overflow_boundary), ``overflow`` (overflow_boundary, inf).
    A format without subnormals (E8M0) has an empty subnormal band at ``underflow_boundary``, and
    its normal band starts there (what lies between rounds to its smallest value, as ``classify`` says).
    """
    fmt = get_format(fmt)
    if not _has_subnormals(fmt):
        return {
            "underflow": (0.0, fmt.underflow_boundary),
            "subnormal": (fmt.underflow_boundary, fmt.underflow_boundary),
            "normal": (fmt.underflow_boundary, fmt.overflow_boundary),
            "overflow": (fmt.overflow_boundary, math.inf),
        }
    return {
        "underflow": (0.0, fmt.underflow_boundary),
        "subnormal": (fmt.underflow_boundary, fmt.smallest_normal),
        "normal": (fmt.smallest_normal, fmt.overflow_boundary),
        "overflow": (fmt.overflow_boundary, math.inf),
    }


def _has_subnormals(fmt: FloatFormat) -> bool:
    """Whether the format has subnormals (E8M0, powers of two only, has none)."""
    return fmt.specials != "fnu"


def _past_min(fmt: FloatFormat) -> str:
    """What a cast does with a value in the underflow band: "becomes 0", or, in a format with no
    zero (E8M0), "becomes 2^-127" (its smallest value)."""
    return "becomes 0" if _has_subnormals(fmt) else f"becomes {_pow2_short(fmt.smallest_normal)}"


def _band_hover(fmt: FloatFormat, category: str) -> str:
    name = fmt.name
    if category == "underflow":
        if not _has_subnormals(fmt):
            return (f"{name} underflow: 0 < |x| ≤ {format_pow2(fmt.underflow_boundary)} becomes its smallest "
                    f"value {format_pow2(fmt.smallest_normal)} (no zero)")
        return f"{name} underflow: 0 < |x| ≤ {format_pow2(fmt.underflow_boundary)} becomes 0"
    if category == "subnormal" and not _has_subnormals(fmt):
        return f"{name} has no subnormals: every value is a power of two"
    if category == "normal" and not _has_subnormals(fmt):
        return (
            f"{name}: {format_pow2(fmt.underflow_boundary)} < |x| < {format_number(fmt.overflow_boundary)} "
            f"rounds to a power of two<br>{format_pow2(fmt.smallest_normal)} … {format_pow2(fmt.max)}, "
            f"no sign, no mantissa"
        )
    if category == "subnormal":
        return (
            f"{name} subnormal: {format_pow2(fmt.underflow_boundary)} < |x| < "
            f"{format_pow2(fmt.smallest_normal)}<br>grid spacing {format_pow2(fmt.smallest_subnormal)}"
            f" (the smallest subnormal), fewer than {fmt.mantissa_bits + 1} significant bits"
        )
    if category == "normal":
        return (
            f"{name} normal: {format_pow2(fmt.smallest_normal)} ≤ |x| < "
            f"{format_number(fmt.overflow_boundary)}<br>max {format_pow2(fmt.max)}, "
            f"{fmt.mantissa_bits + 1} significant bits"
        )
    if fmt.specials == "fn":
        return (
            f"{name} overflow: |x| > {format_number(fmt.overflow_boundary)} saturates to "
            f"max = {format_number(fmt.max)} (no inf)<br>in torch's cast and CUDA's saturating one; "
            f"ml_dtypes' cast gives NaN"
        )
    if fmt.specials == "finite":
        return (
            f"{name} overflow: |x| ≥ {format_number(fmt.overflow_boundary)} saturates to "
            f"max = {format_number(fmt.max)}<br>no inf and no NaN: every pattern is a number"
        )
    if fmt.specials in ("fnuz", "fnu"):
        return (
            f"{name} overflow: |x| ≥ {format_number(fmt.overflow_boundary)} becomes NaN "
            f"(no inf)<br>in torch's and ml_dtypes' casts; a saturating cast gives max = {format_number(fmt.max)}"
        )
    return f"{name} overflow: |x| ≥ {format_number(fmt.overflow_boundary)} becomes inf"


def _past_max(fmt: FloatFormat) -> str:
    """What a cast does with a value past ``fmt``'s range, in a few words: "becomes inf" in an
    "ieee" format; in an "fn" format (no inf, e.g. fp8 E4M3) "saturates to 448 (ml_dtypes: NaN)",
    torch's cast (``FloatFormat.quantize``) first and ml_dtypes' after it."""
    if fmt.specials == "fn":
        return f"saturates to {format_number(fmt.max)} (ml_dtypes: NaN)"
    if fmt.specials == "finite":
        return f"saturates to max {format_number(fmt.max)}"
    if fmt.specials in ("fnuz", "fnu"):
        return "becomes NaN"
    return "becomes inf"


def _log2_window(fmts, margin: float = 5.0, step: int = 10) -> tuple[int, int]:
    """An x range (in log2 units) holding every band edge of ``fmts`` plus a margin."""
    lo = min(math.log2(f.underflow_boundary) for f in fmts) - margin
    hi = max(math.log2(f.overflow_boundary) for f in fmts) + margin
    return int(math.floor(lo / step) * step), int(math.ceil(hi / step) * step)


@lru_cache(maxsize=None)
def _template(name: str) -> dict:
    """plotly's template ``name`` as the JSON a validated figure holds, made once and kept: no
    figure shares it (``go.Figure`` deep-copies the layout it is built from)."""
    return pio.templates[name].to_plotly_json()


#: The layout's lists of items (validation leaves an empty one out).
_LAYOUT_ARRAYS = ("annotations", "shapes", "images", "selections", "sliders", "updatemenus")


def _figure(data: list, layout: dict) -> go.Figure:
    """A ``go.Figure`` of trace dicts and a layout dict, built without plotly's validation, which
    costs 5-30 ms a figure (the template alone is copied several times), too slow for a slider;
    the template named in ``layout`` (or plotly's default) is filled in as validation would. The
    figures built this way are tested to hold exactly what validating them gives."""
    layout = {k: v for k, v in layout.items() if not (k in _LAYOUT_ARRAYS and len(v) == 0)}  # as validated
    layout["template"] = _template(layout.get("template") or pio.templates.default)
    return go.Figure({"data": list(data), "layout": layout}, _validate=False)


def _band_traces(fmts, x_range, *, showlegend=True, xaxis="x", yaxis="y", y=None, width=None) -> list:
    """One horizontal bar trace per category; one bar per format, spanning the band in log2 units,
    at y = the format's name (or at the positions ``y``, ``width`` thick).

    ``customdata`` holds the band's magnitude edges [lo, hi] exactly (None for 0 and inf).
    """
    lo_x, hi_x = x_range
    names = [f.name for f in fmts] if y is None else list(y)
    traces = []
    for cat in BAND_CATEGORIES:
        bases, widths, custom, hover, text = [], [], [], [], []
        for f in fmts:
            lo, hi = band_edges(f)[cat]
            x0 = lo_x if lo == 0 else math.log2(lo)
            x1 = hi_x if math.isinf(hi) else math.log2(hi)
            bases.append(x0)
            widths.append(x1 - x0)
            custom.append([lo if lo > 0 else None, hi if math.isfinite(hi) else None])
            hover.append(_band_hover(f, cat))
            if cat == "normal":
                text.append(f"{_pow2_short(f.smallest_normal)} … {format_number(f.max)}")
            elif cat == "subnormal":
                text.append(f"from {_pow2_short(f.smallest_subnormal)}" if _has_subnormals(f) else "")
            elif cat == "underflow":
                text.append(_past_min(f))
            else:
                text.append(_past_max(f))
        traces.append({
            "type": "bar",
            "name": cat,
            "y": names,
            "x": widths,
            "base": bases,
            "orientation": "h",
            "marker": {"color": CATEGORY_COLORS[cat], "line": {"width": 0},
                       # hatched: the values past the max of a format without inf saturate
                       "pattern": {"shape": ["/" if cat == "overflow" and f.specials in ("fn", "finite") else ""
                                             for f in fmts], "fgcolor": "rgba(255,255,255,0.5)", "solidity": 0.12}},
            "opacity": 0.85,
            "customdata": custom,
            "hovertext": hover,
            "hoverinfo": "text",
            "text": text,
            "textposition": "inside",
            "insidetextanchor": "middle",
            "textfont": {"color": "white"},
            "showlegend": showlegend,
            "legendgroup": cat,
            "xaxis": xaxis,
            "yaxis": yaxis,
            **({} if width is None else {"width": width}),
        })
    return traces


def _landmark_trace(fmts, *, xaxis="x", yaxis="y") -> go.Scatter:
    """Tick marks at each format's smallest subnormal, smallest normal and max."""
    xs, ys, hover = [], [], []
    for f in fmts:
        for label, v in (
            *((("smallest subnormal", f.smallest_subnormal),) if _has_subnormals(f) else ()),
            ("smallest normal" if _has_subnormals(f) else "smallest value", f.smallest_normal),
            ("max", f.max),
        ):
            xs.append(math.log2(v))
            ys.append(f.name)
            hover.append(f"{f.name} {label}: {format_pow2(v)}")
    return go.Scatter(
        name="smallest subnormal, smallest normal, max",
        x=xs,
        y=ys,
        mode="markers",
        marker={"symbol": "line-ns-open", "size": 22, "color": "black", "line": {"width": 2}},
        hovertext=hover,
        hoverinfo="text",
        showlegend=False,
        xaxis=xaxis,
        yaxis=yaxis,
    )


def plot_format_ranges(formats=None) -> go.Figure:
    """Each format's range on one log2 number line: a row per format with its underflow,
    subnormal, normal and overflow bands (edges from the format's constants, see ``band_edges``)
    and tick marks at its smallest subnormal, smallest normal and max.

    ``formats``: names or ``FloatFormat``s, default ``DEFAULT_RANGE_FORMATS``. The x range holds
    every band edge of the formats shown (about -160..140 with fp32, -40..30 for fp16 alone).
    """
    fmts = [get_format(f) for f in (DEFAULT_RANGE_FORMATS if formats is None else formats)]
    if not fmts:
        raise ValueError("plot_format_ranges needs at least one format")
    x_range = _log2_window(fmts)
    fig = go.Figure(data=[*_band_traces(fmts, x_range), _landmark_trace(fmts)])
    fig.update_layout(
        title={"text": "Where each format can hold a value", "x": 0.01, "y": 0.99, "yanchor": "top"},
        barmode="overlay",
        bargap=0.35,
        height=130 + 48 * len(fmts),
        margin={"l": 80, "r": 20, "t": 80, "b": 50},
        template="plotly_white",
        legend={"orientation": "h", "x": 0.01, "y": 1.02, "yanchor": "bottom", "traceorder": "normal"},
        uniformtext={"minsize": 9, "mode": "hide"},
        hovermode="closest",
        meta={"formats": [f.name for f in fmts]},
    )
    fig.update_xaxes(
        range=list(x_range), title_text="|value| on a log2 axis", tickprefix="2^", zeroline=False
    )
    fig.update_yaxes(autorange="reversed", type="category")
    return fig


# ----- a census -----
#: Tick labels drawn where they fall, never measured to hide those that stick out past the axis
#: (plotly's default, ``ticklabeloverflow="hide past div"``, measures every label's box on every
#: draw: about a fifth of a slider move's drawing time in the browser). The explorers' figures
#: leave room for their labels, so none is cut.
_LABELS_AS_THEY_ARE = {"ticklabeloverflow": "allow"}
#: An axis of numbers, said so: left unsaid, plotly reads up to 1,000 values of every trace on it
#: at every draw to guess whether they are dates or categories (several ms a slider move).
_LINEAR = {"type": "linear"}


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
    four bands; ``legend=False`` leaves it out (RangeExplorer, whose readout names them beside
    their colours: plotly redraws the figure about 5 ms sooner without it, of some 30).
    ``shares=False`` leaves the shares line out (RangeExplorer's readout prints them), so that the
    layout stays the same while the scale moves.

    Traces: ``data[0]`` is a bar trace of the counts (``x`` the binades' middles, ``y`` the counts)
    drawn with no opacity: it carries the hover of each binade. What shows are each band's bars, as
    one filled outline per band (``meta`` ``{"band": ...}``, kind ``"bars"``), and a mark on the
    axis under each bar too short to see (kind ``"few"``, one trace per band). Every band has its
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
    # the "smallest normal" label (which sits between them), under the other two labels' row
    for cat, text, x, side in (
        ("underflow", "becomes 0", math.log2(f.underflow_boundary), "right"),
        ("overflow", _past_max(f).replace(" (", "<br>("), math.log2(f.overflow_boundary), "left"),
    ):
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
        f"2^{e} ≤ |v·scale| < 2^{e + 1}<br>{c:,} values ({format_share(c / n)})"
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
    # the hover, and the count of a band that small under the shares line)
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
            "hovertext": [h for h, s in zip(hover, mine.tolist()) if s],
            "hoverinfo": "text",
            "showlegend": False,
            "meta": {"kind": "few", "band": cat},
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
        "margin": {"l": 60, "r": 30, "t": (100 if counted else 90) if shares else 60, "b": 100 if legend else 60},
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


def _count_label(n: int) -> str:
    """"1 value" / "1,000 values"."""
    return f"{n:,} value" + ("" if n == 1 else "s")


# ----- one value -----
def _distinct_texts(values, others=(), digits: int = 3) -> list:
    """Short texts of ``values`` (``format_number``) with as many significant digits as it takes
    to tell them apart, and apart from ``others``: 0.1 next to 0.0999756 is "0.1" and "0.099976",
    never "0.1" twice."""
    every = [*values, *(v for v in others if v not in values)]
    for d in range(digits, 18):
        texts = [format_number(v, d) for v in every]
        if len(set(texts)) == len(set(every)):
            return texts[:len(values)]
    return [repr(float(v)) for v in values]


def plot_value(fmt, value, typed=None) -> go.Figure:
    """Where ``value`` sits in ``fmt``: on top, the format's bands on a log2 axis with a marker
    above the band row at the stored value (and at ``typed``, the number before rounding, when
    given); below, a linear zoom on the stored value and its neighbours below and above
    (``fmt.neighbours``), with ``typed`` between them, its ticks at those values.

    A stored 0 is marked at the left end of the axis and inf (or a value past it) at the right
    end; markers are never clipped at the edges.
    """
    f = get_format(fmt)
    stored = float(f.quantize(value))
    x_range = _log2_window([f], margin=5.0, step=5)
    lo_x, hi_x = x_range

    def log2_pos(v):
        a = abs(v)
        if a == 0:
            return lo_x + 1.0
        if math.isinf(a):
            return hi_x - 1.0
        return min(max(math.log2(a), lo_x + 1.0), hi_x - 1.0)

    # the band row at y = 0 (half a unit thick), the markers on a row of their own above it, so
    # that they never sit on the band's label
    traces = _band_traces([f], x_range, showlegend=False, y=[0.0], width=0.5)
    marks = [("stored", stored, "black", "diamond")]
    if typed is not None and not math.isnan(float(typed)) and float(typed) != stored:
        marks.append(("typed", float(typed), "#E69F00", "x"))
    for label, v, color, symbol in marks:
        if math.isnan(v):
            continue
        traces.append({
            "type": "scatter",
            "name": label,
            "x": [log2_pos(v)],
            "y": [_VALUE_MARK_Y],
            "mode": "markers",
            "marker": {"symbol": symbol, "size": 12, "color": color, "line": {"width": 1, "color": "white"}},
            "hovertext": [f"{label}: {format_pow2(v)} (full: {v!r})"],
            "hoverinfo": "text",
            "showlegend": False,
            "cliponaxis": False,
        })

    annotations = []
    zoom = []
    if math.isfinite(stored):
        below, above = f.neighbours(stored)
        for label, v, color, symbol in (
            ("below", below, "#777777", "line-ns-open"),
            ("stored", stored, "black", "diamond"),
            ("above", above, "#777777", "line-ns-open"),
        ):
            if math.isfinite(v):
                zoom.append((label, v, color, symbol))
        if typed is not None and math.isfinite(float(typed)) and float(typed) != stored:
            zoom.append(("typed", float(typed), "#E69F00", "x"))
    else:
        why = "NaN is not on the number line" if math.isnan(stored) else (
            f"{format_number(stored)}: beyond max = {format_number(f.max)}"
        )
        annotations.append(
            {"name": "zoom", "text": why, "x": 0.5, "y": 0.15, "xref": "paper", "yref": "paper",
             "showarrow": False, "font": {"size": 12}}
        )
    for label, v, color, symbol in zoom:
        traces.append({
            "type": "scatter",
            "name": label,
            "x": [v],
            "y": [0],
            "mode": "markers+text",
            "text": [label],
            "textposition": "top center" if label != "typed" else "bottom center",
            "marker": {"symbol": symbol, "size": 14, "color": color, "line": {"width": 2, "color": color}},
            "hovertext": [f"{label}: {v!r}"],
            "hoverinfo": "text",
            "showlegend": False,
            "cliponaxis": False,
            "xaxis": "x2",
            "yaxis": "y2",
        })
    layout = {
        "barmode": "overlay",
        "height": 240,
        "margin": {"l": 70, "r": 30, "t": 30, "b": 30},
        "template": "plotly_white",
        "showlegend": False,
        "annotations": annotations,
        "uniformtext": {"minsize": 9, "mode": "hide"},
        "title": {"text": f"{f.name}: {format_pow2(stored, digits=6)}", "x": 0.01, "font": {"size": 13}},
        "xaxis": {"range": list(x_range), "tickprefix": "2^", "zeroline": False, "domain": [0, 1],
                  **_LABELS_AS_THEY_ARE, **_LINEAR},
        "yaxis": {"domain": [0.6, 1.0], "range": [-0.3, 0.65], "tickvals": [0], "ticktext": [f.name],
                  "showgrid": False, "zeroline": False, "fixedrange": True, **_LABELS_AS_THEY_ARE, **_LINEAR},
        "xaxis2": {"anchor": "y2", "domain": [0, 1], "zeroline": False, **_LABELS_AS_THEY_ARE, **_LINEAR},
        "yaxis2": {"domain": [0.0, 0.4], "visible": False, "range": [-1, 1.2], **_LINEAR},
        "meta": {"fmt": f.name, "stored": stored if math.isfinite(stored) else None},
    }
    if zoom:
        xs = [v for _, v, _, _ in zoom]
        span = max(xs) - min(xs) or f.ulp(stored) or f.smallest_subnormal
        layout["xaxis2"]["range"] = [min(xs) - 0.15 * span, max(xs) + 0.15 * span]
        # ticks at the values themselves, written out as numbers ("65504", not "6.55e+4"); a typed
        # value too close to the stored one to give its number room is named by its marker only
        ticks = sorted({v for label, v, _, _ in zoom
                        if label != "typed" or min(abs(v - w) for k, w, _, _ in zoom if k != "typed") > span / 6})
        layout["xaxis2"].update(tickvals=ticks, ticktext=_distinct_texts(ticks, xs))
    return _figure(traces, layout)


# ----- loss-scale traces -----
#: Colours for overlaid scalers, in order (Okabe-Ito).
TRACE_COLORS = ("#000000", "#D55E00", "#0072B2", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442")
_LOG2_FLOOR = -150  # where a scale of exactly 0 is drawn (below float32's smallest subnormal)


def _log2_scale(scale: np.ndarray) -> np.ndarray:
    """log2 of |scale|, with 0 drawn at ``_LOG2_FLOOR`` and NaN (a stopped run) kept as a gap."""
    a = np.abs(np.asarray(scale, dtype=np.float64))
    with np.errstate(divide="ignore"):
        out = np.log2(a)
    out[a == 0] = _LOG2_FLOOR
    return out


#: A scale line with more change points than this is drawn at screen resolution (``_scale_steps``).
LINE_POINTS = 4000


def _template_text(text: str) -> str:
    """``text`` as literal text in a plotly hovertemplate: "%{" would start a placeholder there."""
    return str(text).replace("%{", "%\u200b{")


def _changes(values) -> np.ndarray:
    """The indices whose value differs from the one before it (NaN equal to NaN): where each run
    of equal ``values`` after the first begins."""
    v = np.asarray(values)
    same = v[1:] == v[:-1]
    if v.dtype.kind in "fc":
        same |= np.isnan(v[1:]) & np.isnan(v[:-1])
    return np.flatnonzero(~same) + 1


def _scale_steps(trace, most: int = LINE_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """The steps where the scale changes (plus the first and last): a step plot of a 1M-step
    trace needs only these, never every step. Where the scale changes at more than ``most``
    steps (a growth interval of 1 changes it at every step), the steps are cut into ``most // 4``
    equal groups, narrower than a pixel, and each group keeps its first and last change and the
    changes to its lowest and highest scale: the line has the same envelope at every screen
    width, every point drawn is a real step, and between groups the line is exact."""
    s = np.asarray(trace.scale, dtype=np.float64)
    if s.size == 0:
        return np.zeros(0, np.int64), np.zeros(0)
    idx = np.concatenate([[0], _changes(s), [s.size - 1]])
    if idx.size > most:
        idx = _envelope(idx, _log2_scale(s[idx]), s.size, max(most // 4, 1))
    return idx, s[idx]


def _envelope(idx: np.ndarray, y: np.ndarray, n: int, groups: int) -> np.ndarray:
    """Of the points (idx, y), sorted by idx < n: per group of n / ``groups`` steps, the first,
    the last, the first lowest and the first highest y (NaN is never lowest or highest)."""
    group = idx * groups // n
    starts = np.flatnonzero(np.diff(group, prepend=-1))
    ends = np.append(starts[1:], idx.size) - 1
    counts = ends - starts + 1
    keep = [starts, ends]
    for reduce in (np.fmin, np.fmax):
        with np.errstate(invalid="ignore"):
            target = np.repeat(reduce.reduceat(y, starts), counts)
        hit = np.flatnonzero(y == target)
        keep.append(hit[np.diff(group[hit], prepend=-1) != 0])  # the first hit in each group
    return idx[np.unique(np.concatenate(keep))]


def _thin(idx: np.ndarray, most: int) -> np.ndarray:
    """At most ``most`` of the indices, evenly spread (markers beyond a few thousand only cost)."""
    if idx.size <= most:
        return idx
    return idx[np.linspace(0, idx.size - 1, most).round().astype(np.int64)]


#: plotly_white's look, spelled out: a figure that sliders redraw many times a second skips the
#: template machinery (resolving a template costs ~10 ms per figure).
_WHITE_AXIS = {"gridcolor": "#EBF0F8", "linecolor": "#EBF0F8", "zeroline": False, "automargin": True,
               **_LABELS_AS_THEY_ARE}
_WHITE = {"paper_bgcolor": "white", "plot_bgcolor": "white", "font": {"color": "#2a3f5f"},
          "hoverlabel": {"align": "left"}}


#: Line styles of overlaid scalers, in order: each later line narrower and dashed differently, and
#: drawn on top, so that scalers whose scales coincide all stay visible.
TRACE_DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
#: The height in pixels of each scaler's lane of skipped steps in ``plot_scale_trace``.
_LANE_PX = 14


def _line_width(k: int, n: int) -> float:
    """Width of the k-th of n overlaid scale lines: 2 alone; else 0.8 wider than the next one,
    down to 1.5 for the last (at most 3.9)."""
    return 2.0 if n == 1 else 1.5 + min(n - 1 - k, 3) * 0.8


def _marked_part(shown: int, total: int) -> str:
    """How many of ``total`` skipped steps are marked, in words: "" (all), "1 in 6", or "60 of 64"
    (where "1 in 1" would round away the difference)."""
    if shown >= total:
        return ""
    ratio = total / max(shown, 1)
    return f"1 in {ratio:.0f}" if ratio >= 1.5 else f"{shown:,} of {total:,}"


def _skipped_marks(trace, most: int) -> tuple:
    """A ``ScalerTrace``'s skipped steps (none after a stop), the ones marked (at most ``most``,
    evenly among them) and how many are marked, in words ("" when all are)."""
    end = trace.steps if trace.stopped_at is None else trace.stopped_at + 1  # no step runs after a stop
    skipped = np.flatnonzero(trace.skipped[:end])
    shown = _thin(skipped, most)
    return skipped, shown, _marked_part(shown.size, skipped.size)


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


def plot_scale_trace(traces, *, title=None, lost=None, max_markers: int = 60,
                     legend_counts: bool = True) -> go.Figure:
    """log2(scale) over steps for one or more ``ScalerTrace``s, with their skipped steps.

    The scale is drawn as a step line through the steps where it changes; a trace that changes
    at more than ``LINE_POINTS`` steps is drawn at screen resolution (each group of steps
    narrower than a pixel keeps its first, last, lowest and highest scale), so a figure of a
    million steps sends a few thousand points per trace whatever the settings. Overlaid scalers
    differ in colour, line width and dash (``TRACE_DASHES``: each later line narrower, drawn on
    top), so scales that coincide all stay visible. The skipped steps are marked in a strip above
    the scale panel, one lane per scaler (the marks never cover the lines or each other), thinned
    to ``max_markers`` per scaler, evenly among its skipped steps so that dense stretches stay
    dense (the scaler's name then says "1 in N marked"). A scale of exactly 0 is drawn at
    2^-150; a stopped run ends its line and gets a dashed marker. ``lost``: optional dict name ->
    (steps, shares) drawn in a lower panel, e.g. the share of gradients lost to underflow at each
    step's scale; the panels share the step axis, labelled under the lowest one.

    ``legend_counts=False`` leaves the counts out of the legend (each scaler's line is then named
    by the scaler alone; ScalerLab's readout shows the counts): every slider move then keeps the
    figure's names and layout, and the browser only moves its lines and marks. The axes' ranges
    are fixed (to the next tick beyond the values; the lost share to 1, 2 or 5 × 10^k %) for
    the same reason.
    """
    traces = _scaler_traces(traces)
    if not isinstance(legend_counts, (bool, np.bool_)):
        raise TypeError(f"legend_counts must be True or False, got {_shown(legend_counts)}")
    _title(title)
    if isinstance(max_markers, bool) or not isinstance(max_markers, (int, np.integer)) or max_markers < 1:
        raise ValueError(f"max_markers must be a whole number >= 1, got {_shown(max_markers)}")
    if lost is not None and not isinstance(lost, dict):
        raise TypeError(f"lost must be a dict name -> (steps, shares), got {type(lost).__name__}")
    rows = 2 if lost else 1
    data, markers, shapes, notes, ys = [], [], [], [], []
    for k, t in enumerate(traces):
        color = TRACE_COLORS[k % len(TRACE_COLORS)]
        idx, sc = _scale_steps(t)
        name = t.policy.name
        y = _log2_scale(sc)
        ys.append(y)
        _, shown, part = _skipped_marks(t, max_markers)
        thinned = f" ({part} marked)" if part else ""
        data.append({
            "type": "scatter", "x": idx, "y": y, "mode": "lines",
            "line": {"shape": "hv", "color": color, "width": _line_width(k, len(traces)),
                     "dash": TRACE_DASHES[k % len(TRACE_DASHES)]},
            "name": f"{name}: {t.skipped_count:,} skipped{thinned}" if legend_counts else name,
            "legendgroup": name,
            # hover texts from numbers (a template over the scales): a string per point made a
            # slider move send 40 KB of text at a million steps
            "customdata": np.asarray(sc, np.float64),
            "hovertemplate": f"{_template_text(name)} · step %{{x:,}} · scale %{{customdata:,.6~g}}<extra></extra>",
            "meta": {"policy": name, "kind": "scale"},
        })
        if shown.size:
            scale_at = np.asarray(t.scale, np.float64)[shown]
            markers.append({
                "type": "scatter", "x": shown, "y": np.full(shown.size, k, dtype=np.float64), "mode": "markers",
                "marker": {"symbol": "line-ns-open", "size": 11, "color": color,
                           "line": {"width": 1.5, "color": color}},
                "name": f"{name}: skipped" + (f" ({part} shown)" if part and legend_counts else ""),
                "legendgroup": name, "showlegend": False, "yaxis": "y3", "cliponaxis": False,
                "customdata": scale_at,
                "hovertemplate": f"{_template_text(name)} · step %{{x:,}} skipped · scale %{{customdata:,.6~g}}"
                                 "<extra></extra>",
                "meta": {"policy": name, "kind": "skipped"},
            })
        if t.stopped_at is not None:
            shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": t.stopped_at,
                           "x1": t.stopped_at, "y0": 0, "y1": 1, "line": {"color": color, "dash": "dash"}})
            notes.append({"x": t.stopped_at, "xref": "x", "y": 1, "yref": "paper", "showarrow": False,
                          "xanchor": "right", "yanchor": "bottom", "text": f"{name} stopped",
                          "font": {"color": color}})
    data += markers
    for k, (name, (steps, shares)) in enumerate((lost or {}).items()):
        data.append({
            "type": "scatter", "x": np.asarray(steps), "y": 100 * np.asarray(shares, dtype=np.float64),
            "mode": "lines", "line": {"shape": "hv", "color": TRACE_COLORS[k % len(TRACE_COLORS)], "width": 1.5},
            "name": f"{name}: % lost", "legendgroup": name, "showlegend": False, "yaxis": "y2",
            "meta": {"policy": name, "kind": "lost"},
        })
    n = max((t.steps for t in traces), default=0)
    # pixels: the lanes of skipped steps on top, the scale panel, the lost panel at the bottom
    height, top, bottom = (420, 60, 50) if rows == 1 else (560, 60, 50)
    plot = height - top - bottom
    lanes = _LANE_PX * len(traces)
    lane_domain = [1.0 - lanes / plot, 1.0]
    scale_domain = [0.0 if rows == 1 else 0.34, 1.0 - (lanes + 22) / plot]
    notes.append({"name": "skipped-title", "x": 0, "xref": "paper", "y": lane_domain[0], "yref": "paper",
                  "xanchor": "left", "yanchor": "top", "yshift": -1, "showarrow": False,
                  "font": {"size": 11, "color": "#555555"},
                  "text": "skipped steps, a lane per scaler" if len(traces) > 1 else "skipped steps"})
    ticks = _log2_ticks(np.concatenate(ys))
    scale_range = _padded_range(np.concatenate(ys), ticks["dtick"])
    layout = {
        **_WHITE,
        "title": {"text": title or "Loss scale over training steps", "x": 0.01},
        "height": height,
        "margin": {"l": 70, "r": 20, "t": top, "b": bottom},
        "legend": {"orientation": "h", "x": 0.01, "y": -0.15 if rows == 1 else -0.12, "yanchor": "top"},
        # the step axis under the lowest panel (its ticks and title never run into the panel below)
        "xaxis": {**_WHITE_AXIS, **_LINEAR, "title": {"text": "step"}, "range": [0, max(n - 1, 1)], "tickformat": "~s",
                  "anchor": "y2" if rows == 2 else "y"},
        "yaxis": {**_WHITE_AXIS, **_LINEAR, "title": {"text": "loss scale (log2 axis)"}, "domain": scale_domain,
                  **ticks, **({"range": scale_range} if scale_range else {})},
        "yaxis3": {**_LINEAR, "domain": lane_domain, "range": [len(traces) - 0.5, -0.5], "visible": False,
                   "fixedrange": True, "anchor": "x"},
        "shapes": shapes, "annotations": notes,
    }
    if rows == 2:
        percents = [100 * np.asarray(shares, dtype=np.float64) for _, shares in lost.values()]
        layout["yaxis2"] = {**_WHITE_AXIS, **_LINEAR, "title": {"text": "% of gradients lost"}, "domain": [0, 0.24],
                            "range": [0, _share_top(np.concatenate(percents))], "anchor": "x"}
    return _figure(data, layout)


# ----- live training -----
#: Which mode's census ``plot_live`` draws as the heat map by default: the first of these present
#: (fp16 without a scaler first: its map shows where gradients are lost).
HEAT_MODE_ORDER = ("fp16", "fp16+scaler", "half", "bf16", "fp32")
#: The trace fields that change while a run grows (a live figure updates only these).
LIVE_DATA_KEYS = ("x", "y", "z", "name")
_LIVE_MODE_COLORS = {"fp32": "#000000", "fp16": "#D55E00", "fp16+scaler": "#0072B2", "bf16": "#009E73",
                     "half": "#CC79A7"}


def _shown(value, limit: int = 60) -> str:
    """``repr(value)`` on one line, cut to ``limit`` characters, for a message."""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[:limit] + "…"


def _title(title):
    """A figure title: a string, or None for the default."""
    if title is not None and not isinstance(title, str):
        raise TypeError(f"title must be a string (or None), got {type(title).__name__}")
    return title


def _census_result(result, what: str = "result") -> CensusResult:
    if not isinstance(result, CensusResult):
        raise TypeError(f"{what} must be a CensusResult (from ampviz.formats.census.census), got {type(result).__name__}")
    return result


def _scaler_traces(traces) -> list:
    from ampviz.scaling import ScalerTrace

    traces = list(traces) if isinstance(traces, (list, tuple)) else [traces]
    bad = [t for t in traces if not isinstance(t, ScalerTrace)]
    if bad or not traces:
        raise TypeError("traces must be a ScalerTrace or a list of them (from ampviz.scaling.simulate), got "
                        + (type(bad[0]).__name__ if bad else "none"))
    return traces


def _runs(runs_by_mode) -> dict:
    """``runs_by_mode`` checked: a dict mode -> ``live.Run`` or list of ``StepRecord``s."""
    if not isinstance(runs_by_mode, dict):
        raise TypeError(f"runs must be a dict mode -> live.Run (or list of StepRecord), got "
                        f"{type(runs_by_mode).__name__}")
    for mode, run in runs_by_mode.items():
        recs = getattr(run, "records", run)
        if not isinstance(recs, (list, tuple)) or not all(
                hasattr(r, "step") and hasattr(r, "loss") and hasattr(r, "error") for r in recs[:1] + recs[-1:]):
            raise TypeError(f"runs[{mode!r}] must be a live.Run or a list of StepRecord, got {type(run).__name__}")
    return runs_by_mode


#: At most this many census steps in the live heat map (spread evenly over the run).
HEAT_COLUMNS = 200


def _records_of(run) -> list:
    """A snapshot of a run's records (a ``live.Run`` or a list of ``StepRecord``), safe to read while
    another thread appends to it."""
    return list(getattr(run, "records", run) or ())


def _loss_note(ok: list, loss: np.ndarray, recs: list) -> str:
    """What the loss line cannot show: the steps whose loss is inf or NaN (not drawn), and a run
    that ended on an error."""
    notes = []
    bad = np.flatnonzero(~np.isfinite(loss))
    if bad.size:
        notes.append(f"{'all' if bad.size == loss.size else f'{bad.size:,}'} not finite, from step "
                     f"{ok[int(bad[0])].step:,}")
    if recs and recs[-1].error is not None:
        notes.append(f"stopped at step {recs[-1].step:,}")
    return f" ({'; '.join(notes)})" if notes else ""


def _skipped_count(run, skipped: list) -> int:
    """Skipped steps of a run: all of them, also those a long ``live.Run`` no longer keeps."""
    count = getattr(run, "skipped_recorded", None)
    return len(skipped) if count is None else max(int(count), len(skipped))


def _mode_color(mode: str, k: int) -> str:
    return _LIVE_MODE_COLORS.get(mode, TRACE_COLORS[k % len(TRACE_COLORS)])


def lost_shares(census_by_name: dict) -> dict:
    """Share of each parameter's gradient that is zero or underflows in a census (by parameter name)."""
    if not isinstance(census_by_name, dict):
        raise TypeError(f"lost_shares takes a dict name -> CensusResult, got {type(census_by_name).__name__}")
    for c in census_by_name.values():
        _census_result(c, "each census")
    return {name: (c.counts["zero"] + c.counts["underflow"]) / max(c.total, 1)
            for name, c in census_by_name.items()}


def heat_mode_of(modes, heat_mode=None) -> str | None:
    """The mode whose census ``plot_live`` draws: ``heat_mode`` if given, else the first of
    ``HEAT_MODE_ORDER`` among ``modes``, else the first mode (None without modes)."""
    modes = list(modes)
    if heat_mode is not None:
        if heat_mode not in modes:
            raise ValueError(f"heat_mode {_shown(heat_mode)} is not one of the runs "
                             f"({', '.join(map(_shown, modes)) or 'none'})")
        return heat_mode
    return next((m for m in HEAT_MODE_ORDER if m in modes), modes[0] if modes else None)


#: Parameter names longer than this are shortened on the live heat map's rows (``_short_names``).
HEAT_LABEL_CHARS = 25
#: The live heat map's height per parameter row in pixels (font 10: every row labelled), and the
#: height of a heat map whose rows are not known yet (a live figure built from empty runs).
_HEAT_ROW_PX = 13
_HEAT_DEFAULT_PX = 240


def _short_name(name: str, limit: int) -> str:
    """``name`` in at most ``limit`` characters, keeping what tells parameters apart: the block it
    sits in (up to its index) and its own last parts. "encoder.layers.0.self_attn.in_proj_weight"
    becomes "…layers.0…in_proj_weight"; "…" marks what is left out."""
    if len(name) <= limit:
        return name
    parts = name.split(".")
    index = max((i for i, p in enumerate(parts[:-1]) if p.isdigit()), default=None)
    if index is None:
        head, rest = [], parts
    else:
        first = max(index - 1, 0)  # the container and its index: "layers.0"
        head, rest = parts[first:index + 1], parts[index + 1:]
        if first > 0:
            head[0] = "…" + head[0]
    head_text = ".".join(head)
    tail = [rest[-1]]
    for p in reversed(rest[:-1]):
        if len(head_text) + 1 + len(".".join([p, *tail])) > limit:
            break
        tail.insert(0, p)
    gap = "." if len(tail) == len(rest) else "…"
    text = (head_text + gap if head else ("" if len(tail) == len(rest) else "…")) + ".".join(tail)
    if len(text) > limit:  # one long last part: keep its end
        text = "…" + text[-(limit - 1):]
    return text


def _short_names(names) -> list:
    """Row labels for parameter names: each at most ``HEAT_LABEL_CHARS`` characters
    (``_short_name``); names whose short forms would coincide keep their full names, so that every
    row keeps a label of its own."""
    names = [str(n) for n in names]
    short = [_short_name(n, HEAT_LABEL_CHARS) for n in names]
    seen: dict = {}
    for s in short:
        seen[s] = seen.get(s, 0) + 1
    out = [n if seen[s] > 1 else s for n, s in zip(names, short)]
    return out if len(set(out)) == len(out) else names


def _loss_width(k: int, n: int) -> float:
    """Width of the k-th of n loss lines: earlier lines wider, so that coinciding losses (fp32 and
    fp16 with a scaler often are) all stay visible, each later one drawn on top, narrower."""
    return 1.5 if n == 1 else 1.2 + 0.7 * (n - 1 - k)


def live_traces(runs_by_mode: dict, *, heat_mode=None) -> list:
    """The traces of ``plot_live`` as plain dicts, in a fixed order that depends only on the modes
    (never on how many records there are), so a live figure built from empty runs can take the data
    of later calls trace by trace (``LIVE_DATA_KEYS``).

    Per mode: a loss line named after the mode (steps of the records without an error), each
    mode's line narrower than the one before, so coinciding losses stay visible. Per mode with a
    loss scaler (records carrying a ``scale``, or the mode "fp16+scaler"): a log2(scale) step line
    and the skipped steps as markers. Last, one heat map of ``heat_mode``'s parameter census: x the
    census steps, y the parameter names (those longer than ``HEAT_LABEL_CHARS`` characters
    shortened, "…" marking what is left out, e.g. "…layers.0…in_proj_weight"), z the share of each
    parameter's gradient that is zero or underflows (``lost_shares``; at most ``HEAT_COLUMNS``
    census steps, spread evenly), its colour bar under the step axis. Every trace's ``meta`` says
    its mode and kind ("loss", "scale", "skipped", "heat").
    """
    snap = {mode: _records_of(run) for mode, run in _runs(runs_by_mode).items()}
    data = []
    for k, (mode, recs) in enumerate(snap.items()):
        ok = [r for r in recs if r.error is None]
        loss = np.array([r.loss for r in ok], dtype=np.float64)
        data.append({
            "type": "scatter", "mode": "lines", "x": np.array([r.step for r in ok], dtype=np.int64),
            "y": loss, "name": mode + _loss_note(ok, loss, recs),
            "legendgroup": mode, "line": {"color": _mode_color(mode, k), "width": _loss_width(k, len(snap))},
            "xaxis": "x", "yaxis": "y", "meta": {"mode": mode, "kind": "loss"},
        })
    for k, (mode, recs) in enumerate(snap.items()):
        scaled = [r for r in recs if r.error is None and r.scale is not None]
        if not scaled and mode != "fp16+scaler":
            continue
        color = _mode_color(mode, k)
        skipped = [r for r in scaled if r.skipped]
        data.append({
            "type": "scatter", "mode": "lines", "x": np.array([r.step for r in scaled], dtype=np.int64),
            "y": _log2_scale(np.array([r.scale for r in scaled], dtype=np.float64)),
            "name": f"{mode} log2(scale)", "legendgroup": mode, "showlegend": False,
            "line": {"shape": "hv", "color": color, "width": 2},
            "xaxis": "x2", "yaxis": "y2", "meta": {"mode": mode, "kind": "scale"},
        })
        data.append({
            "type": "scatter", "mode": "markers", "x": np.array([r.step for r in skipped], dtype=np.int64),
            "y": _log2_scale(np.array([r.scale for r in skipped], dtype=np.float64)),
            "name": f"{mode}: {_skipped_count(runs_by_mode[mode], skipped):,} skipped", "legendgroup": mode,
            "marker": {"symbol": "x", "size": 8, "color": color},
            "xaxis": "x2", "yaxis": "y2", "meta": {"mode": mode, "kind": "skipped"},
        })
    hm = heat_mode_of(snap, heat_mode)
    cens = [r for r in snap.get(hm, ()) if r.error is None and r.param_census]
    if len(cens) > HEAT_COLUMNS:  # evenly spread columns: a long run costs no more to draw
        cens = [cens[i] for i in np.linspace(0, len(cens) - 1, HEAT_COLUMNS).round().astype(int)]
    names = list(cens[0].param_census) if cens else []
    shares = [lost_shares(r.param_census) for r in cens]
    z = np.array([[s.get(n, np.nan) for s in shares] for n in names],
                 dtype=np.float64).reshape(len(names), len(cens))
    data.append({
        "type": "heatmap", "x": np.array([r.step for r in cens], dtype=np.int64), "y": _short_names(names),
        "z": z, "name": f"{hm} lost gradient share", "zmin": 0.0, "zmax": 1.0, "colorscale": "Blues",
        # under the step axis, at the right: the figure's width stays with the panels
        "colorbar": {"title": {"text": "lost", "side": "right"}, "orientation": "h", "lenmode": "pixels",
                     "len": 140, "thickness": 10, "x": 1.0, "xanchor": "right", "xref": "paper",
                     "y": 0.0, "yanchor": "bottom", "yref": "container", "ypad": 6, "tickformat": ".0%",
                     "tickvals": [0, 0.5, 1], "tickfont": {"size": 10}},
        "hovertemplate": "step %{x}<br>%{y}: %{z:.1%} zero or underflow<extra></extra>",
        "xaxis": "x3", "yaxis": "y3", "meta": {"mode": hm, "kind": "heat"},
    })
    return data


def _live_geometry(rows: int) -> dict:
    """The live figure's layout in pixels, turned into paper fractions: the loss panel, the scale
    panel and the heat map (``_HEAT_ROW_PX`` per parameter row, between 12 and 40 rows' worth; a
    heat map of unknown rows gets ``_HEAT_DEFAULT_PX``), with room above each lower panel for its
    title, the title and legend above the loss panel, and the step axis under the heat map."""
    heat = _HEAT_DEFAULT_PX if rows == 0 else _HEAT_ROW_PX * min(max(rows, 12), 40)
    loss, scale, gap_scale, gap_heat, top, bottom = 200, 110, 34, 44, 96, 90
    plot = loss + gap_scale + scale + gap_heat + heat
    f = 1.0 / plot
    return {
        "height": top + plot + bottom, "margin": {"l": 60, "r": 20, "t": top, "b": bottom},
        "heat": [0.0, heat * f], "scale": [(heat + gap_heat) * f, (heat + gap_heat + scale) * f],
        "loss": [1.0 - loss * f, 1.0], "legend_y": 1.0 + 6 * f,
    }


def plot_live(runs_by_mode: dict, *, steps=None, heat_mode=None, fmt="fp16", title=None) -> go.Figure:
    """Live training on one figure: the loss per mode (top), the loss scale on a log2 axis with
    skipped steps marked for the modes with a scaler (middle), and a heat map of ``heat_mode``'s
    parameter census over time (bottom): per parameter, the share of its gradient (× the step's
    scale) that is zero or underflows in ``fmt``. The legend sits above the loss panel.

    ``runs_by_mode``: mode -> ``live.Run`` or list of ``StepRecord``, possibly empty: a figure of
    empty runs has every trace already (see ``live_traces``), so a live figure built from it can take
    the traces of later calls as the runs grow. ``steps`` fixes the x range to [0, steps - 1] (else
    [0, the last step recorded]); ``fmt`` only names the format in the heat map's title (the
    census's own format is used). The heat map is ``_HEAT_ROW_PX`` pixels per parameter row, so
    every row is labelled (from 12 to 40 rows; more rows share the labels, every second or third
    one labelled); a figure of empty runs leaves room for 18 rows.
    """
    data = live_traces(runs_by_mode, heat_mode=heat_mode)
    _title(title)
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0):
        raise ValueError(f"steps must be a whole number >= 0 (or None), got {_shown(steps)}")
    heat = data[-1]["meta"]["mode"]
    has_scale = any(d["meta"]["kind"] == "scale" for d in data)
    last = max((int(np.max(d["x"])) for d in data if len(d["x"])), default=0)
    if steps:
        x_axis = {**_WHITE_AXIS, "range": [0, max(int(steps) - 1, 1)]}
    elif last > 0:  # the recorded steps, not the heat map's cells (which reach half a census gap beyond)
        x_axis = {**_WHITE_AXIS, "range": [0, last]}
    else:
        x_axis = {**_WHITE_AXIS, "autorange": True}
    x_axis["tickformat"] = "~s"
    g = _live_geometry(len(data[-1]["y"]))
    heat_title = (f"{heat}: share of each parameter's gradient<br>(× scale) that is zero or underflows in "
                  f"{get_format(fmt).name}" if heat else "no run: no gradient census")
    notes = [
        {"name": "heat-title", "text": heat_title, "x": 0, "xref": "paper", "y": g["heat"][1], "yref": "paper",
         "xanchor": "left", "yanchor": "bottom", "yshift": 2, "align": "left", "showarrow": False,
         "font": {"size": 11}},
        {"name": "scale-title", "x": 0, "xref": "paper", "y": g["scale"][1], "yref": "paper", "xanchor": "left",
         "yanchor": "bottom", "yshift": 4, "showarrow": False, "font": {"size": 12},
         "text": "loss scale (× = skipped step)" if has_scale else "loss scale: no mode with a scaler"},
    ]
    layout = {
        **_WHITE,
        "title": {"text": title or f"Loss, loss scale and gradients lost in {get_format(fmt).name}", "x": 0.01,
                  "y": 1.0 - 12.0 / g["height"], "yanchor": "top", "font": {"size": 16}},
        "height": g["height"],
        "margin": g["margin"],
        # above the loss panel, as wide as the figure: it names the lines right where they start
        "legend": {"orientation": "h", "x": 0, "xanchor": "left", "y": g["legend_y"], "yanchor": "bottom",
                   "font": {"size": 12}},
        "xaxis": {**x_axis, "anchor": "y", "showticklabels": False},
        "yaxis": {**_WHITE_AXIS, "title": {"text": "loss"}, "domain": g["loss"], "tickformat": "~g"},
        "xaxis2": {**x_axis, "anchor": "y2", "matches": "x", "showticklabels": False},
        # whole powers of two: the axis always spans 2^0 (no scaling) to 2^16 (GradScaler's start)
        "yaxis2": {**_WHITE_AXIS, "title": {"text": "scale"}, "domain": g["scale"], "tickprefix": "2^",
                   "autorangeoptions": {"include": [0, 16]}},
        "xaxis3": {**x_axis, "anchor": "y3", "matches": "x", "title": {"text": "step"}},
        "yaxis3": {**_WHITE_AXIS, "domain": g["heat"], "autorange": "reversed", "type": "category",
                   "tickfont": {"size": 10}},
        "annotations": notes,
        "meta": {"modes": list(runs_by_mode), "heat_mode": heat, "fmt": get_format(fmt).name},
    }
    return go.Figure(data=data, layout=layout)


# ----- updates a low-precision weight loses -----
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
    return go.Figure(data=data, layout=layout)


# ----- loss scales across ranks -----
#: Marker colours of ``plot_ranks``: a skipped step (vermillion, as overflow) and a step taken on
#: non-finite gradients (reddish purple, as NaN).
RANK_MARK_COLORS = {"skipped": "#D55E00", "nonfinite": "#CC79A7"}
#: At most this many marks of each kind per rank in ``plot_ranks`` (evenly among that rank's steps).
RANK_MARKS = 400
_RANK_POISON_FILL = "rgba(204, 121, 167, 0.15)"  # the lane after a rank's weights went inf/NaN


def _ranks_trace(trace):
    """``trace`` checked to be a ``RanksTrace`` (without importing ``ampviz.ranks``, which loads
    torch: a RanksTrace exists only once that module is loaded)."""
    import sys

    ranks = sys.modules.get("ampviz.ranks")
    if ranks is None or not isinstance(trace, ranks.RanksTrace):
        raise TypeError(f"trace must be a RanksTrace (from ampviz.ranks.simulate_ranks), got {type(trace).__name__}")
    return trace


def plot_ranks(trace, *, title=None) -> go.Figure:
    """Each rank's loss scale over the steps of a ``RanksTrace``, one lane per rank (rank 0 on top).

    Every lane draws its rank's scale as a step line on a log2 axis (ticks at powers of two, the
    same range in every lane, so scales that drift apart are seen apart), with a mark at each step
    that rank skipped (an "x"; its hover says whether the overflow was the rank's own or arrived
    from another rank) and at each step it took on non-finite gradients (a star: its weights are
    inf/NaN from then on, and the rest of its lane is shaded). Where the ranks' scales first
    differ a dotted line crosses every lane. At most ``RANK_MARKS`` marks of each kind per rank,
    evenly among its steps (the legend then says how many are shown). The figure's
    ``layout.meta`` holds the mode, the number of ranks and steps, the first step at which the
    scales differ and the step at which each rank was poisoned (or None).
    """
    from types import SimpleNamespace

    trace = _ranks_trace(trace)
    _title(title)
    n, steps = trace.world_size, trace.steps
    scale = np.asarray(trace.scale, np.float64)
    skipped = np.asarray(trace.found_inf, bool)
    nonfinite = np.asarray(trace.nonfinite_step, bool)
    own = np.asarray(trace.overflow, bool)
    lane_px = 90 if n <= 4 else 64
    top, bottom, gap = 70, 100, 14  # pixels: title, step axis and legend, space between lanes
    plot = n * lane_px + (n - 1) * gap
    height = plot + top + bottom
    ys = [_log2_scale(row) for row in scale]
    finite = np.concatenate([y[np.isfinite(y)] for y in ys]) if steps else np.zeros(0)
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    y_range = [lo - 1.0, hi + 1.0]
    span = y_range[1] - y_range[0]  # a lane is short: at most about 3 ticks, at whole powers of two
    dtick = next((d for d in (1, 2, 4, 5, 10, 20, 25, 50, 100) if span / d <= 3), 200)
    ticks = {**_log2_ticks(y_range), "dtick": dtick}
    data, marks, shapes, notes = [], [], [], []
    layout_axes = {}
    legend_shown = set()
    poisoned = trace.poisoned_at
    divergence = trace.first_divergence
    for r in range(n):
        axis = "y" if r == 0 else f"y{r + 1}"
        name = "yaxis" if r == 0 else f"yaxis{r + 1}"
        top_edge = 1.0 - r * (lane_px + gap) / plot
        domain = [max(top_edge - lane_px / plot, 0.0), min(top_edge, 1.0)]
        layout_axes[name] = {**_WHITE_AXIS, "domain": domain, "range": y_range, "anchor": "x",
                             "title": {"text": f"rank {r}", "font": {"size": 12}}, **ticks}
        if r:
            layout_axes[name]["matches"] = "y"
        idx, sc = _scale_steps(SimpleNamespace(scale=scale[r]))
        data.append({
            "type": "scatter", "x": idx, "y": _log2_scale(sc), "mode": "lines", "yaxis": axis,
            "line": {"shape": "hv", "color": TRACE_COLORS[0], "width": 2},
            "name": "loss scale", "legendgroup": "scale", "showlegend": r == 0,
            "hovertext": [f"rank {r} · step {i:,} · scale {format_number(v)}"
                          for i, v in zip(idx.tolist(), sc.tolist())],
            "hoverinfo": "text", "meta": {"rank": r, "kind": "scale"},
        })
        for kind, flags, symbol, size, label in (
                ("skipped", skipped[r] & ~nonfinite[r], "x", 9, "skipped"),
                ("nonfinite", nonfinite[r], "star", 12, "stepped on inf/NaN (weights poisoned)")):
            at = np.flatnonzero(flags)
            shown = _thin(at, RANK_MARKS)
            if not shown.size:
                continue
            part = _marked_part(shown.size, at.size)
            why = []
            for i in shown.tolist():
                if kind == "nonfinite":
                    why.append("stepped on inf/NaN from another rank" if not own[r, i] else "stepped on inf/NaN")
                elif np.isnan(scale[r, i]):
                    why.append("skipped (the run had ended)")
                else:
                    why.append("skipped: its own overflow" if own[r, i] else "skipped: another rank's overflow")
            marks.append({
                "type": "scatter", "x": shown, "y": _log2_scale(scale[r, shown]), "mode": "markers", "yaxis": axis,
                "marker": {"symbol": symbol, "size": size, "color": RANK_MARK_COLORS[kind],
                           "line": {"width": 1.5, "color": RANK_MARK_COLORS[kind]}},
                "name": label + (f" ({part} shown)" if part else ""), "legendgroup": kind,
                "showlegend": kind not in legend_shown, "cliponaxis": False,
                "hovertext": [f"rank {r} · step {i:,} {w} · scale {format_number(v)}"
                              for i, w, v in zip(shown.tolist(), why, scale[r, shown].tolist())],
                "hoverinfo": "text", "meta": {"rank": r, "kind": kind},
            })
            legend_shown.add(kind)
        if poisoned[r] is not None:
            shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": poisoned[r], "x1": max(steps - 1, 1),
                           "y0": domain[0], "y1": domain[1], "fillcolor": _RANK_POISON_FILL, "line": {"width": 0},
                           "layer": "below"})
            notes.append({"x": 1, "xref": "paper", "y": domain[1], "yref": "paper", "xanchor": "right",
                          "yanchor": "top", "showarrow": False, "font": {"size": 11, "color": "#8B3A62"},
                          "bgcolor": "rgba(255, 255, 255, 0.85)",
                          "text": f"rank {r}: weights inf/NaN from step {poisoned[r]:,}"})
    if divergence is not None:
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": divergence, "x1": divergence,
                       "y0": 0, "y1": 1, "line": {"color": "#555555", "width": 1, "dash": "dot"}})
    agree = "the ranks' scales agree at every step" if divergence is None else \
        f"the ranks' scales differ from step {divergence:,}"
    notes.append({"name": "agreement", "x": 1, "xref": "paper", "y": 1, "yref": "paper", "xanchor": "right",
                  "yanchor": "bottom", "yshift": 4, "showarrow": False, "font": {"size": 12, "color": "#555555"},
                  "text": agree})
    layout = {
        **_WHITE,
        "title": {"text": title or f"Loss scale per rank ({trace.mode}, {n} ranks)", "x": 0.01},
        "height": height,
        "margin": {"l": 80, "r": 20, "t": top, "b": bottom},
        "legend": {"orientation": "h", "x": 0.01, "y": -56 / plot, "yanchor": "top"},  # under the step title
        "xaxis": {**_WHITE_AXIS, "title": {"text": "step"}, "range": [0, max(steps - 1, 1)],
                  "anchor": f"y{n}" if n > 1 else "y"},
        **layout_axes,
        "shapes": shapes, "annotations": notes,
        "meta": {"mode": trace.mode, "ranks": n, "steps": steps, "first_divergence": divergence,
                 "poisoned_at": list(poisoned)},
    }
    return _figure(data + marks, layout)


__all__ += ["plot_ranks"]


# ----- block scaling: MX and NVFP4 -----
#: Colours of ``plot_blocks``: the original values, the dequantized ones, an element held at its
#: block's largest value (vermillion, as overflow) and one that became 0 (blue, as underflow).
BLOCK_COLORS = {"original": "#000000", "dequantized": "#009E73", "saturated": "#D55E00", "flushed": "#0072B2",
                "range": "#999999", "error": "#56B4E9"}


def _block_element_format(result, codes: np.ndarray, values: np.ndarray, step: np.ndarray):
    """The element format of an ``MXBlocks`` (it does not store one): the MX format whose decoded
    codes times the block scales give ``values`` exactly (the first of ``MX_ELEMENT_FORMATS`` when
    several do, as in a row of zeros, where nothing saturates whichever it is)."""
    from ampviz.formats.blocks import MX_ELEMENT_FORMATS

    ok = np.isfinite(step) & np.isfinite(values)
    for f in MX_ELEMENT_FORMATS.values():
        if codes.size and int(codes.max()) >= 1 << f.bits:
            continue
        with np.errstate(over="ignore", invalid="ignore"):
            got = (np.asarray(f.decode(codes.astype(np.int64))).astype(np.float32) * step).astype(np.float32)
        if np.array_equal(got[ok], values[ok]):
            return f
    raise ValueError("result's codes and values match no MX element format: pass the MXBlocks that "
                     "mx_quantize returned for x")


def _finite_log2(values) -> np.ndarray:
    """log2 |values| (float64), with 0, inf and NaN as NaN (a gap in a line)."""
    a = np.abs(np.asarray(values, np.float64))
    out = np.full(a.shape, np.nan)
    ok = np.isfinite(a) & (a > 0)
    out[ok] = np.log2(a[ok])
    return out


def _block_parts(x, result, what: str = "x") -> dict:
    """``plot_blocks``' per-element arrays for a row ``x`` and its quantization ``result``,
    checked: the row, the dequantized values, the codes, the block scales and the element format,
    each block's largest and smallest nonzero value, and which elements saturated or flushed."""
    from ampviz.formats.blocks import MXBlocks, NVFP4Blocks
    from ampviz.formats import FP4_E2M1, FP8_E4M3

    if not isinstance(result, (MXBlocks, NVFP4Blocks)):
        raise TypeError(f"result must be MXBlocks or NVFP4Blocks (from ampviz.formats.blocks), got {type(result).__name__}")
    try:
        xs = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be a row of numbers, got {_shown(x)}") from None
    with np.errstate(over="ignore"):
        xs = xs.astype(np.float32)
    values = np.asarray(result.values, np.float32)
    codes = np.asarray(result.codes)
    scales = np.asarray(result.scales)
    if xs.ndim != 1 or values.shape != xs.shape or scales.ndim != 1 or not scales.size \
            or xs.size % scales.size:
        raise ValueError(f"{what} must be one row and result its quantization: {what} has shape {xs.shape}, "
                         f"result's values {values.shape} and scales {scales.shape}")
    n, blocks = xs.size, scales.size
    bs = n // blocks
    nvfp4 = isinstance(result, NVFP4Blocks)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if nvfp4:
            fmt = FP4_E2M1
            block_scale = np.asarray(FP8_E4M3.decode(scales.astype(np.int64)), np.float64)
            ts = None if result.tensor_scale is None else float(result.tensor_scale)
            step = (block_scale if ts is None else np.float32(ts) * block_scale.astype(np.float32)).astype(np.float32)
        else:
            ts = None
            block_scale = np.where(scales == 255, np.nan, np.ldexp(1.0, scales.astype(np.int64) - 127))
            step = block_scale.astype(np.float32)
        elem_step = np.repeat(step, bs)
        fmt = fmt if nvfp4 else _block_element_format(result, codes, values, elem_step)
        top = fmt.max * step.astype(np.float64)  # each block's largest value
        least = fmt.smallest_subnormal * step.astype(np.float64)  # and its smallest nonzero one
        ax = np.abs(xs.astype(np.float64))
        saturated = np.isfinite(np.repeat(top, bs)) & (ax > np.repeat(top, bs))
        flushed = (xs != 0) & np.isfinite(xs) & (values == 0)
        err = np.where(xs != 0, np.abs(values.astype(np.float64) - xs) / ax, np.abs(values.astype(np.float64)))
    return {"xs": xs, "values": values, "scales": scales, "n": n, "blocks": blocks, "bs": bs, "nvfp4": nvfp4,
            "fmt": fmt, "block_scale": block_scale, "ts": ts, "step": step, "top": top, "least": least,
            "saturated": saturated, "flushed": flushed, "err": err}


def _block_extents(parts: dict) -> np.ndarray:
    """The finite log2 magnitudes ``plot_blocks`` draws on its value axis for ``parts``: the
    row's, the dequantized values' and each block's largest and smallest nonzero value."""
    logs = np.concatenate([_finite_log2(parts[k]) for k in ("xs", "values", "top", "least")])
    return logs[np.isfinite(logs)]


def plot_blocks(x, result, *, title=None, legend_counts: bool = True, hold=()) -> go.Figure:
    """A row of values ``x`` and its block quantization ``result`` (``ampviz.formats.blocks.mx_quantize``'s
    ``MXBlocks`` or ``nvfp4_quantize``'s ``NVFP4Blocks`` of the same row), element by element.

    Top panel, magnitudes on a log2 axis (block scaling keeps the sign; what it loses is size):
    each original |value| (a thin black level across the element) and its dequantized one (a
    shorter, thicker green level over it: where the two agree only the black level's ends show
    beside the green), the blocks delimited by dotted lines, each block's range as two grey steps, its
    largest value (element max × block scale, solid) and its smallest nonzero one (the element
    format's smallest subnormal × block scale, dotted), and its scale written above it (2^k for
    MX's E8M0 scale; for NVFP4 the E4M3 block scale, which the tensor scale, given in the default
    title, multiplies). A value of 0 sits on a row of its own, labelled 0, under the axis's
    powers of two. An element beyond its block's range is held at it (saturated: a thick orange
    level at the block's largest value); a nonzero element that dequantizes to 0 is flushed (a
    thick blue level on the 0 row): an outlier lifts its
    block's range, and the neighbours that fall below the range's floor are flushed. Bottom
    panel: each element's relative error |q - x| / |x| (0 where x is 0) as a filled step one
    element wide.

    Every per-element row is a single path, not a mark per element: the dequantized row's points
    are ``(i - 0.35, log2|q_i|), (i + 0.35, log2|q_i|), gap`` for each element i (its
    ``customdata`` holds, per point, the block scale's text and q); the originals', the saturated
    and the flushed elements' are the same with ``i ± 0.45`` (the originals' ``customdata`` holds,
    per point, the element's block and value; NaN at the gaps); the error row's are
    ``(-0.5, e_0)``, then ``(i, e_i)`` for each element, then ``(n - 0.5, e_{n-1})``, drawn as a
    centred step (its ``customdata`` holds the element). The scale texts are a text trace (kind
    "scale") above the value panel.

    The value axis's range is fixed, out to whole ticks, over this row and the ``(x, result)``
    pairs given in ``hold`` (BlockExplorer passes the rows at its outlier slider's ends, so that
    the outlier moves against a still axis and a move only moves the marks). The saturated and
    flushed traces are there even when empty (an empty trace has no legend entry). With
    ``legend_counts=False`` the legend names them without their counts.

    Every trace carries ``meta["kind"]`` (range, least, original, dequantized, saturated,
    flushed, error, scale); ``layout.meta`` holds the scheme, element format, block size, each
    block's scale (its pattern and value), the tensor scale, the counts saturated and flushed,
    each block's worst relative error and the zero row's place on the value axis (``zero_y``).
    """
    _title(title)
    if not isinstance(legend_counts, (bool, np.bool_)):
        raise TypeError(f"legend_counts must be True or False, got {_shown(legend_counts)}")
    if not isinstance(hold, (list, tuple)):
        raise TypeError(f"hold must be a list of (x, result) pairs, got {type(hold).__name__}")
    p = _block_parts(x, result)
    held = [_block_extents(p)]
    for pair in hold:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise TypeError(f"hold must be a list of (x, result) pairs, got an item {_shown(pair)}")
        held.append(_block_extents(_block_parts(*pair, what="each held x")))
    xs, values, n, blocks, bs, fmt, step = p["xs"], p["values"], p["n"], p["blocks"], p["bs"], p["fmt"], p["step"]
    nvfp4, ts, err = p["nvfp4"], p["ts"], p["err"]
    idx = np.arange(n)
    worst = [float(np.nanmax(err[b * bs:(b + 1) * bs])) if np.isfinite(err[b * bs:(b + 1) * bs]).any() else None
             for b in range(blocks)]

    # the value axis: whole powers of two from below the lowest magnitude to above the highest,
    # and two binades under them the row of zeros
    finite = np.concatenate(held)
    lo, hi = (float(np.floor(finite.min())), float(np.ceil(finite.max()))) if finite.size else (-1.0, 1.0)
    ticks = _log2_ticks([lo, hi])
    dtick = ticks["dtick"]
    zero_y = lo - 2.0
    powers = np.arange(np.ceil(lo / dtick) * dtick, hi + dtick / 2, dtick)
    y_axis = {"range": [zero_y - 1.0, hi + 0.75], "tickmode": "array",
              "tickvals": [zero_y, *powers.tolist()], "ticktext": ["0", *[f"2^{int(v)}" for v in powers]]}

    def on_axis(v):
        """log2 |v|, with 0 on the zero row (inf and NaN: not drawn)."""
        y = _finite_log2(v)
        y[np.asarray(v) == 0] = zero_y
        return y

    def scale_text(b: int) -> str:
        if not np.isfinite(step[b]):
            return "NaN"
        return format_number(p["block_scale"][b]) if nvfp4 else _pow2_short(p["block_scale"][b])

    def levels(at, y, half):
        """Points of one path drawing a level from i - half to i + half at height y_i for each
        element i of ``at``, a gap after each."""
        lx = np.repeat(at.astype(np.float64), 3) + np.tile([-half, half, np.nan], at.size)
        ly = np.repeat(np.asarray(y, np.float64), 3)
        ly[2::3] = np.nan
        return lx, ly

    # the originals and the dequantized values as levels across their elements, one path each
    # (see the docstring): a mark per element costs the browser more to draw at every move
    orig_x, orig_y = levels(idx, on_axis(xs), 0.45)
    orig_data = np.repeat(np.column_stack([idx // bs, xs.astype(np.float64)]), 3, axis=0)
    orig_data[2::3] = np.nan
    tick_x, tick_y = levels(idx, on_axis(values), 0.35)
    scale_texts = [scale_text(b) for b in range(blocks)]
    tick_data = np.empty((3 * n, 2), dtype=object)
    tick_data[:, 0] = np.repeat(np.array(scale_texts, dtype=object)[idx // bs], 3)
    tick_data[:, 1] = np.repeat(values.astype(np.float64), 3)
    tick_data[2::3] = None
    edges = np.full(3 * blocks, np.nan)
    edges[0::3], edges[1::3] = idx[::bs] - 0.5, idx[::bs] + bs - 0.5

    def block_steps(v):
        y = np.full(3 * blocks, np.nan)
        y[0::3] = y[1::3] = _finite_log2(v)
        return y

    data = [
        {"type": "scatter", "x": edges, "y": block_steps(p["top"]), "mode": "lines",
         "name": "block's largest value (max × scale)", "line": {"color": BLOCK_COLORS["range"], "width": 1.5},
         "hoverinfo": "skip", "meta": {"kind": "range"}},
        {"type": "scatter", "x": edges, "y": block_steps(p["least"]), "mode": "lines",
         "name": "smallest nonzero (× scale)", "line": {"color": BLOCK_COLORS["range"], "width": 1.5, "dash": "dot"},
         "hoverinfo": "skip", "meta": {"kind": "least"}},
        # hover texts are templates over numbers (and each element's block scale as text), not a
        # string per element: a slider move sends less than half the bytes
        {"type": "scatter", "x": orig_x, "y": orig_y, "mode": "lines", "name": "original",
         "line": {"color": BLOCK_COLORS["original"], "width": 1.5}, "customdata": orig_data, "hoveron": "points",
         "hovertemplate": "element %{x:.0f} (block %{customdata[0]}) · x = %{customdata[1]:.4~g}<extra></extra>",
         "meta": {"kind": "original"}},
        {"type": "scatter", "x": tick_x, "y": tick_y, "mode": "lines", "name": "dequantized",
         "line": {"color": BLOCK_COLORS["dequantized"], "width": 2.5},
         "customdata": tick_data, "hoveron": "points",
         "hovertemplate": "element %{x:.0f} · q = %{customdata[1]:.4~g} · block scale %{customdata[0]}"
                          "<extra></extra>",
         "meta": {"kind": "dequantized"}},
    ]
    for kind, flags, label in (("saturated", p["saturated"], "saturated (held at the block's max)"),
                               ("flushed", p["flushed"], "flushed to 0")):
        at = np.flatnonzero(flags)
        lx, ly = levels(at, on_axis(values[at]), 0.45)
        texts = [f"element {i} {kind}: x = {format_number(xs[i], 4)} → {format_number(values[i], 4)}"
                 for i in at.tolist()]
        data.append({"type": "scatter", "x": lx, "y": ly, "mode": "lines",
                     "name": f"{label}: {at.size}" if legend_counts else label,
                     "line": {"color": BLOCK_COLORS[kind], "width": 5},
                     "hovertext": [s for t in texts for s in (t, t, "")], "hoverinfo": "text", "hoveron": "points",
                     "meta": {"kind": kind}})
    # the relative error as a filled step one element wide around each element (see the docstring)
    data.append({"type": "scatter", "x": np.concatenate([[-0.5], idx, [n - 0.5]]),
                 "y": np.concatenate([err[:1], err, err[-1:]]), "mode": "lines", "name": "relative error",
                 "xaxis": "x2", "yaxis": "y2", "line": {"shape": "hvh", "width": 0, "color": BLOCK_COLORS["error"]},
                 "fill": "tozeroy", "fillcolor": BLOCK_COLORS["error"], "hoveron": "points",
                 "customdata": np.concatenate([[0], idx, [n - 1]]),
                 "hovertemplate": "element %{customdata} · error %{y:.3~%}<extra></extra>",
                 "showlegend": False, "meta": {"kind": "error"}})
    # each block's scale above it, on an axis of its own over the value panel: a trace, so that a
    # new scale moves no layout
    data.append({"type": "scatter", "x": idx[::bs] + (bs - 1) / 2, "y": np.ones(blocks), "yaxis": "y3",
                 "mode": "text", "text": scale_texts, "textposition": "top center", "cliponaxis": False,
                 "textfont": {"size": 10, "color": "#555555"}, "hoverinfo": "skip", "showlegend": False,
                 "meta": {"kind": "scale"}})
    shapes = [{"type": "line", "xref": "x", "yref": "paper", "x0": b * bs - 0.5, "x1": b * bs - 0.5, "y0": 0, "y1": 1,
               "line": {"color": "#888888", "width": 1, "dash": "dot"}} for b in range(1, blocks)]
    scheme = "NVFP4" if nvfp4 else f"MX {fmt.name}"
    ts_text = "" if not nvfp4 else (", no tensor scale" if ts is None else f", tensor scale {format_number(ts)}")
    finite_err = err[np.isfinite(err)]
    err_top = max(1.05, float(finite_err.max()) * 1.05) if finite_err.size else 1.05
    layout = {
        **_WHITE,
        "title": {"text": title or f"{scheme}: blocks of {bs}{ts_text}", "x": 0.01},
        "height": 560,
        "margin": {"l": 80, "r": 20, "t": 110, "b": 60},
        "legend": {"orientation": "h", "x": 0.01, "y": -0.1, "yanchor": "top"},
        "xaxis": {**_WHITE_AXIS, **_LINEAR, "domain": [0, 1], "anchor": "y", "range": [-0.5, n - 0.5],
                  "showticklabels": False},
        "yaxis": {**_WHITE_AXIS, **_LINEAR, "domain": [0.4, 1], "title": {"text": "|value|"}, **y_axis},
        "yaxis3": {**_LINEAR, "domain": [0.4, 1], "range": [0, 1], "overlaying": "y", "visible": False,
                   "fixedrange": True},
        "xaxis2": {**_WHITE_AXIS, **_LINEAR, "domain": [0, 1], "anchor": "y2", "matches": "x",
                   "range": [-0.5, n - 0.5], "title": {"text": "element"}},
        "yaxis2": {**_WHITE_AXIS, **_LINEAR, "domain": [0, 0.3], "anchor": "x2", "range": [0, err_top],
                   "title": {"text": "relative error"}, "tickformat": ".0%"},
        "shapes": shapes,
        "meta": {"scheme": "nvfp4" if nvfp4 else "mx", "fmt": fmt.name, "block_size": int(bs),
                 "scale_codes": p["scales"].astype(int).tolist(),
                 "scales": [float(v) if np.isfinite(v) else None for v in step.astype(np.float64)],
                 "tensor_scale": ts, "saturated": int(p["saturated"].sum()), "flushed": int(p["flushed"].sum()),
                 "block_worst": worst, "zero_y": zero_y},
    }
    return _figure(data, layout)


__all__ += ["BLOCK_COLORS", "plot_blocks"]


# ----- FP8 per-tensor scaling over a stream of tensors -----
#: Colours of ``plot_fp8_scaling``: the amax, the scale, the largest and smallest magnitudes the
#: scale keeps, and the shares saturated, underflowed and subnormal (as the census bands).
FP8_COLORS = {"amax": "#000000", "scale": "#009E73", "ceiling": CATEGORY_COLORS["overflow"],
              "floor": CATEGORY_COLORS["underflow"], "saturated": CATEGORY_COLORS["overflow"],
              "underflowed": CATEGORY_COLORS["underflow"], "subnormal": CATEGORY_COLORS["subnormal"],
              "nonfinite": CATEGORY_COLORS["nan"]}


def _fp8_trace(trace):
    """``trace`` checked to be an ``Fp8ScalingTrace``."""
    from ampviz.formats.fp8 import Fp8ScalingTrace

    if not isinstance(trace, Fp8ScalingTrace):
        raise TypeError(f"trace must be an Fp8ScalingTrace (from ampviz.formats.fp8.simulate_fp8_scaling), "
                        f"got {type(trace).__name__}")
    return trace


def _run_ends(values) -> np.ndarray:
    """The first and last index of each run of equal ``values`` (NaN equal to NaN), in order: a
    step line ("hv") through these points is the step line through every point."""
    v = np.asarray(values)
    if v.size == 0:
        return np.zeros(0, np.int64)
    change = _changes(v)
    return np.unique(np.concatenate([[0], change - 1, change, [v.size - 1]]))


def _log_percent_or_gap(counts, size: int) -> np.ndarray:
    """log10(100 · counts / size), with 0 as NaN: where a share sits on ``plot_fp8_scaling``'s
    share axis."""
    c = np.asarray(counts, np.float64)
    return np.where(c > 0, np.log10(100.0 * np.where(c > 0, c, 1.0) / size), np.nan)


def _percent_decades(lo: float, hi: float) -> dict:
    """Axis settings for a linear axis of log10(percent) from ``lo`` to ``hi``: a tick at each
    power of ten, labelled in percent as plotly labels a log axis ("0.1", "1", "10", "100")."""
    powers = list(range(math.ceil(lo), math.floor(hi) + 1))
    return {"tickmode": "array", "tickvals": powers, "ticktext": [f"{10.0 ** k:g}" for k in powers]}


_FP8_PANELS = 520  # plot_fp8_scaling's three panels and the gaps between them, in px
_FP8_SHARE_DOMAIN = 0.28  # the share panel's share of them
_LONE_TICK_PX = 5  # a lone step's share is drawn this many px above and below it


def _fp8_lines(trace) -> tuple:
    """log2 of an ``Fp8ScalingTrace``'s amax, max / scale, underflow boundary / scale and scale
    at every step (NaN where not finite)."""
    f = trace.fmt
    scale = np.asarray(trace.scale, np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return (_finite_log2(trace.amax), _finite_log2(f.max / scale), _finite_log2(f.underflow_boundary / scale),
                _finite_log2(scale))


def _fp8_extents(lines) -> tuple:
    """``_fp8_lines``' finite values: the value panel's (amax and both bounds) as one array, and
    the scale's."""
    log_amax, ceiling, floor, log_scale = lines
    values = np.concatenate([v[np.isfinite(v)] for v in (log_amax, ceiling, floor)])
    return values, log_scale[np.isfinite(log_scale)]


def plot_fp8_scaling(trace, *, title=None, legend_counts: bool = True, hold=()) -> go.Figure:
    """An ``Fp8ScalingTrace`` (``ampviz.formats.fp8.simulate_fp8_scaling``) step by step, in three panels.

    Top: log2 of each step's amax, and the window the scale in force keeps: log2(max / scale)
    (the largest magnitude that fits; above it values saturate) and log2(underflow boundary /
    scale) (at or below it nonzero values become 0); a step whose amax is inf or NaN is marked
    at the top of the panel. Middle: log2 of the scale in force (a step line). Bottom: the share
    of each step's values saturated, underflowed and subnormal, in percent on a log scale (``y``
    is log10 of the percent, on a linear axis labelled in percent at each power of ten; a step
    with none leaves a gap; a step with some between two with none is a short vertical tick
    centred on its share, 5 px above and below it: two points of its line at its step, both
    with its count). Hover texts are templates over ``customdata`` (the numbers), not one
    string per step. The step lines of the scale, of max / scale and of the boundary / scale go
    through the first and last step of each run of one scale (drawn "hv": the same line as
    through every step); the lines of every step give ``y`` only, from step 0 one apart (``x0``,
    ``dx``). Every trace carries ``meta["kind"]``; ``layout.meta`` holds the
    recipe, its settings, the format, the steps and values per step, the steps that saturate,
    the worst step and its counts.

    The value and scale axes' ranges are fixed, out to whole ticks; ``hold``: other traces whose
    values they also hold (Fp8ScalingLab passes the runs at its spike slider's ends, so that the
    spike grows against still axes). The shares' legend names say on how many steps each
    happens; ``legend_counts=False`` (Fp8ScalingLab, whose readout has the counts) leaves those
    counts out. A slider move then keeps the layout, and the browser only moves the lines.
    """
    trace = _fp8_trace(trace)
    _title(title)
    if not isinstance(legend_counts, (bool, np.bool_)):
        raise TypeError(f"legend_counts must be True or False, got {_shown(legend_counts)}")
    if not isinstance(hold, (list, tuple)):
        raise TypeError(f"hold must be a list of Fp8ScalingTraces, got {type(hold).__name__}")
    lines = _fp8_lines(trace)
    held = [_fp8_extents(lines)] + [_fp8_extents(_fp8_lines(_fp8_trace(t))) for t in hold]
    f, n, size = trace.fmt, trace.steps, trace.size
    amax = np.asarray(trace.amax, np.float64)
    scale = np.asarray(trace.scale, np.float64)
    log_amax, ceiling, floor, log_scale = lines
    bad = np.flatnonzero(~np.isfinite(amax))
    finite = np.concatenate([values for values, _ in held])
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    # a step below the lowest line and two above the highest (room for the inf/NaN marks), out to
    # whole ticks: the range moves only when the lines cross a tick
    top_ticks = _log2_ticks([lo - 1.0, hi + 2.0])
    top_range = _padded_range([lo - 1.0, hi + 2.0], top_ticks["dtick"])
    # the step lines of the scale (and of max and the underflow boundary over it) through the
    # first and last step of each run of one scale: drawn "hv", the same line as through every
    # step, in a fraction of the points under delayed scaling (46 runs in 2,000 steps at
    # Transformer Engine's defaults); amax's line of every step starts at step 0, one apart (x0,
    # dx), and the share lines keep each run of gaps as its first step (below)
    runs = _run_ends(scale)
    # the lines' points travel as float32: a slider move sends half the bytes of float64, and
    # plotly, drawing at screen resolution, draws the same figure (integers, the steps and the
    # counts, travel in the narrowest type that holds them: FigureView and plotly narrow them)
    ceiling, floor, log_amax, log_scale = (np.asarray(v, np.float32) for v in (ceiling, floor, log_amax, log_scale))
    # hover texts from numbers (a template over customdata: the float32 amaxes and scales, the
    # counts): 2,000 strings per trace made every slider move send and draw 0.6 MB
    data = [
        {"type": "scatter", "x": runs, "y": ceiling[runs], "mode": "lines", "name": "max / scale (above: saturates)",
         "line": {"color": FP8_COLORS["ceiling"], "width": 1.5, "shape": "hv"}, "hoverinfo": "skip",
         "meta": {"kind": "ceiling"}},
        {"type": "scatter", "x": runs, "y": floor[runs], "mode": "lines",
         "name": "underflow boundary / scale (below: becomes 0)",
         "line": {"color": FP8_COLORS["floor"], "width": 1.5, "shape": "hv"}, "hoverinfo": "skip",
         "meta": {"kind": "floor"}},
        {"type": "scatter", "x0": 0, "dx": 1, "y": log_amax, "mode": "lines", "name": "amax",
         "line": {"color": FP8_COLORS["amax"], "width": 1.5}, "customdata": np.asarray(trace.amax, np.float32),
         "hovertemplate": "step %{x:,} · amax %{customdata:.4~g}<extra></extra>",
         "meta": {"kind": "amax"}},
    ]
    if bad.size:
        data.append({"type": "scatter", "x": bad, "y": np.full(bad.size, top_range[1] - 0.5), "mode": "markers",
                     "name": f"amax inf or NaN: {bad.size:,}",
                     "marker": {"symbol": "star", "size": 10, "color": FP8_COLORS["nonfinite"]},
                     "hovertext": [f"step {i:,} · amax {format_number(amax[i])}" for i in bad.tolist()],
                     "hoverinfo": "text", "cliponaxis": False, "meta": {"kind": "nonfinite"}})
    data.append({"type": "scatter", "x": runs, "y": log_scale[runs], "mode": "lines",
                 "name": "scale in force",
                 "yaxis": "y2", "line": {"color": FP8_COLORS["scale"], "width": 2, "shape": "hv"},
                 "customdata": np.asarray(trace.scale, np.float32)[runs],
                 "hovertemplate": "step %{x:,} · scale %{customdata:.4~g}<extra></extra>",
                 "meta": {"kind": "scale"}})
    share_range = [math.log10(50.0 / max(size, 1)), 2.05]
    # a lone step's tick: _LONE_TICK_PX above and below its share, in the share axis's units
    tick = _LONE_TICK_PX * (share_range[1] - share_range[0]) / (_FP8_SHARE_DOMAIN * _FP8_PANELS)
    for kind, counts, label in (("saturated", trace.saturated, "saturated (held at ±max)"),
                                ("underflowed", trace.underflowed, "underflowed (became 0)"),
                                ("subnormal", trace.subnormal, "subnormal")):
        c = np.asarray(counts)
        share = _log_percent_or_gap(c, size).astype(np.float32)
        hover = f"step %{{x:,}} · {kind} %{{customdata:,}} of {size:,}<extra></extra>"
        # a step with none is a gap in its line; a run of such steps travels as its first step
        # alone: plotly draws and hovers the same line, and a slider move has fewer points to send
        # and draw (the saturated line is mostly gaps: 2,000 steps become a few dozen points)
        gap = np.isnan(share)
        kept = np.flatnonzero(~gap | ~np.r_[False, gap[:-1]])
        # a step with some between steps with none has no neighbour to draw a line to: it is
        # drawn as a short vertical tick centred on its share, two points of the same line at
        # its step (a marker trace per kind would cost every move a trace more to draw)
        some = c > 0
        lone = some & ~np.r_[False, some[:-1]] & ~np.r_[some[1:], False]
        points = np.where(lone[kept], 2, 1)
        twice = np.repeat(kept, points)
        y = share[twice]
        first = (np.cumsum(points) - points)[lone[kept]]  # where each lone step's two points begin
        y[first] = np.maximum(y[first] - tick, share_range[0])
        y[first + 1] = np.minimum(y[first + 1] + tick, share_range[1])
        data.append({"type": "scatter", "x": twice, "y": y, "mode": "lines",
                     "name": f"{label}: {int(some.sum()):,} steps" if legend_counts else label, "yaxis": "y3",
                     # saturation comes in lone steps (the spike's): its ticks drawn wider
                     "line": {"color": FP8_COLORS[kind], "width": 2 if kind == "saturated" else 1},
                     "customdata": c[twice], "hovertemplate": hover, "meta": {"kind": kind}})
    worst = trace.worst_step
    settings = ", ".join(f"{k} {v}" for k, v in trace.settings.items() if k != "convention")
    scales = np.concatenate([s for _, s in held])
    scale_ticks = _log2_ticks(scales)
    scale_range = _padded_range(scales, scale_ticks["dtick"])
    layout = {
        **_WHITE,
        "title": {"text": title or f"FP8 {trace.recipe} scaling, {f.name} ({settings})", "x": 0.01},
        "height": 60 + _FP8_PANELS + 110,
        "margin": {"l": 80, "r": 20, "t": 60, "b": 110},
        # under the step axis's numbers and title, at any width (three rows of entries, at 700 px,
        # fit the margin)
        "legend": {"orientation": "h", "x": 0.01, "y": -56 / _FP8_PANELS, "yanchor": "top"},
        # one step axis for the three panels, labelled under the lowest (one axis to lay out and
        # draw at each slider move instead of three matched ones); its range the steps themselves
        # (autoranged, the few markers' padding pushed step 0 away from the panels' left edge)
        "xaxis": {**_WHITE_AXIS, **_LINEAR, "domain": [0, 1], "anchor": "y3", "title": {"text": "step"},
                  "range": [0, max(n - 1, 1)]},
        "yaxis": {**_WHITE_AXIS, **_LINEAR, "domain": [0.55, 1], "range": top_range, "title": {"text": "log2 |x|"},
                  "anchor": "x", **top_ticks},
        "yaxis2": {**_WHITE_AXIS, **_LINEAR, "domain": [0.33, 0.5], "anchor": "x", "title": {"text": "scale"},
                   **scale_ticks, **({"range": scale_range} if scale_range else {})},
        # the shares' log axis drawn as a linear one over log10(percent), labelled as plotly
        # labels a log axis: the same figure, and a points-only move costs plotly about 6 ms less
        "yaxis3": {**_WHITE_AXIS, **_LINEAR, "domain": [0, _FP8_SHARE_DOMAIN], "anchor": "x",
                   "title": {"text": "% of values"},
                   "range": share_range, **_percent_decades(*share_range)},
        "meta": {"recipe": trace.recipe, "settings": dict(trace.settings), "fmt": f.name, "steps": n, "size": size,
                 "saturated_steps": trace.saturated_steps, "worst_step": worst,
                 "worst": {k: int(getattr(trace, k)[worst]) if n else 0
                           for k in ("saturated", "underflowed", "subnormal")}},
    }
    return _figure(data, layout)


__all__ += ["FP8_COLORS", "plot_fp8_scaling"]
