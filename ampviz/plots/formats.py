"""A format's bands on a log2 axis and one value in a format: ``band_edges`` (each band's
magnitude edges from the format's constants), what a cast does in each band (the hover and band
texts), ``plot_format_ranges`` (formats side by side) and ``plot_value`` (where one value sits,
with a linear zoom on its neighbours)."""

from __future__ import annotations

import math

import plotly.graph_objects as go

from ampviz.formats import FloatFormat, get_format
from ampviz.plots.style import BAND_CATEGORIES, CATEGORY_COLORS, Figure, _LABELS_AS_THEY_ARE, _LINEAR, _figure
from ampviz.plots.text import _pow2_short, format_number, format_pow2


#: The formats ``plot_format_ranges`` compares by default, widest first.
DEFAULT_RANGE_FORMATS = ("fp32", "tf32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2")


#: Where ``plot_value`` draws its markers: a row above the band row (at 0, 0.5 thick).
_VALUE_MARK_Y = 0.45


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
    fig = Figure(data=[*_band_traces(fmts, x_range), _landmark_trace(fmts)])
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


#: Where the zoom panel puts its values: this many gaps either side of the stored value (a gap:
#: the larger of the spaces from the stored value to its neighbours), unless a typed number lies
#: further out.
ZOOM_REACH = 1.4
#: A typed number's value is written under it only this many gaps from every other point.
_TYPED_ROOM = 1 / 3


def _zoom(f, stored: float, typed) -> tuple:
    """The zoom panel's points, (label, value, position, colour, symbol) each, and its x range.

    A point's position is its distance from the stored value in gaps, ``(v - stored) / gap``: the
    neighbours sit at -1 and +1 (-0.5 below a power of two, where the grid's spacing halves), a
    typed number within half a gap. So the panel's axis stays where it is from one pattern to the
    next, and moving through the patterns only moves its points and texts.
    """
    points = []
    below, above = f.neighbours(stored)
    for label, v, color, symbol in (
        ("below", below, "#777777", "line-ns-open"),
        ("stored", stored, "black", "diamond"),
        ("above", above, "#777777", "line-ns-open"),
    ):
        if math.isfinite(v):
            points.append([label, v, color, symbol])
    if typed is not None and math.isfinite(float(typed)) and float(typed) != stored:
        points.append(["typed", float(typed), "#E69F00", "x"])
    gaps = [abs(v - stored) for label, v, _, _ in points if label in ("below", "above")]
    gap = max(gaps) if gaps else 1.0
    zoom = [(label, v, (v - stored) / gap, color, symbol) for label, v, color, symbol in points]
    xs = [x for _, _, x, _, _ in zoom]
    if min(xs) >= -1.0 and max(xs) <= 1.0:
        x_range = [-ZOOM_REACH, ZOOM_REACH]
    else:  # a typed number far out (past a saturating format's max): every point in view
        lo, hi = min(-1.0, *xs), max(1.0, *xs)
        x_range = [lo - 0.15 * (hi - lo), hi + 0.15 * (hi - lo)]
    return zoom, x_range


def plot_value(fmt, value, typed=None) -> go.Figure:
    """Where ``value`` sits in ``fmt``: on top, the format's bands on a log2 axis with a marker
    above the band row at the stored value (and at ``typed``, the number before rounding, when
    given); below, a zoom on the stored value between its neighbours below and above
    (``fmt.neighbours``), with ``typed`` among them, each value written out under it.

    The zoom is drawn in gaps from the stored value (see ``_zoom``), so from one bit pattern to the
    next only the markers and texts move: the layout stays the same within a format (a browser
    redraws nothing else). A stored 0 is marked at the left end of the top axis and inf (or a value
    past it) at the right end; markers are never clipped at the edges.
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
    zoom, zoom_range = ([], [-ZOOM_REACH, ZOOM_REACH])
    if math.isfinite(stored):
        zoom, zoom_range = _zoom(f, stored, typed)
    else:
        why = "NaN is not on the number line" if math.isnan(stored) else (
            f"{format_number(stored)}: beyond max = {format_number(f.max)}"
        )
        annotations.append(
            {"name": "zoom", "text": why, "x": 0.5, "y": 0.15, "xref": "paper", "yref": "paper",
             "showarrow": False, "font": {"size": 12}}
        )
    for label, v, x, color, symbol in zoom:
        traces.append({
            "type": "scatter",
            "name": label,
            "x": [x],
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
    if zoom:
        # each value written out as a number ("65504", not "6.55e+4") under its marker, where an
        # axis has its tick labels; a typed value too close to the others to give its number room
        # is named by its marker only
        values = {}
        for label, v, x, _, _ in zoom:
            room = min(abs(x - w) for k, _, w, _, _ in zoom if k != "typed")
            if label != "typed" or room > _TYPED_ROOM:
                values.setdefault(v, x)
        shown = sorted(values)
        traces.append({
            "type": "scatter",
            "name": "values",
            "x": [values[v] for v in shown],
            "y": [-1.0] * len(shown),
            "mode": "text",
            "text": _distinct_texts(shown, [v for _, v, _, _, _ in zoom]),
            "textposition": "bottom center",
            "textfont": {"size": 12, "color": "#444444"},
            "hoverinfo": "skip",
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
        "title": {"text": f"{f.name}: the stored value on the format's range, and between its neighbours",
                  "x": 0.01, "font": {"size": 13}},
        "xaxis": {"range": list(x_range), "tickprefix": "2^", "zeroline": False, "domain": [0, 1],
                  **_LABELS_AS_THEY_ARE, **_LINEAR},
        "yaxis": {"domain": [0.6, 1.0], "range": [-0.3, 0.65], "tickvals": [0], "ticktext": [f.name],
                  "showgrid": False, "zeroline": False, "fixedrange": True, **_LABELS_AS_THEY_ARE, **_LINEAR},
        # the zoom's axis in gaps from the stored value: no ticks (the values are written under
        # their markers), a line through the markers
        "xaxis2": {"anchor": "y2", "domain": [0, 1], "range": zoom_range, "showgrid": False,
                   "showticklabels": False, "zeroline": False, **_LABELS_AS_THEY_ARE, **_LINEAR},
        "yaxis2": {"domain": [0.0, 0.4], "visible": False, "range": [-1, 1.2], "fixedrange": True, **_LINEAR},
        "shapes": [{"type": "line", "xref": "x2 domain", "x0": 0, "x1": 1, "yref": "y2", "y0": 0, "y1": 0,
                    "line": {"color": "#cccccc", "width": 1}, "layer": "below"}] if zoom else [],
        "meta": {"fmt": f.name, "stored": stored if math.isfinite(stored) else None},
    }
    return _figure(traces, layout)
