"""The look shared by every figure: one colour per category of a format and per bit field, the
colours of overlaid lines, and how a figure is built quickly (``_figure``: no plotly validation,
the template filled in once) with plotly_white's look spelled out for figures that sliders redraw.
"""

from __future__ import annotations

from functools import lru_cache

import plotly.graph_objects as go
import plotly.io as pio


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

#: How opaque the bands of categories are drawn (their colour over white: light enough to read bars on).
BAND_OPACITY = 0.18


#: Colours for overlaid scalers, in order (Okabe-Ito).
TRACE_COLORS = ("#000000", "#D55E00", "#0072B2", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442")


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


#: Tick labels drawn where they fall, never measured to hide those that stick out past the axis
#: (plotly's default, ``ticklabeloverflow="hide past div"``, measures every label's box on every
#: draw: about a fifth of a slider move's drawing time in the browser). The explorers' figures
#: leave room for their labels, so none is cut.
_LABELS_AS_THEY_ARE = {"ticklabeloverflow": "allow"}
#: An axis of numbers, said so: left unsaid, plotly reads up to 1,000 values of every trace on it
#: at every draw to guess whether they are dates or categories (several ms a slider move).
_LINEAR = {"type": "linear"}


#: plotly_white's look, spelled out: a figure that sliders redraw many times a second skips the
#: template machinery (resolving a template costs ~10 ms per figure).
_WHITE_AXIS = {"gridcolor": "#EBF0F8", "linecolor": "#EBF0F8", "zeroline": False, "automargin": True,
               **_LABELS_AS_THEY_ARE}
_WHITE = {"paper_bgcolor": "white", "plot_bgcolor": "white", "font": {"color": "#2a3f5f"},
          "hoverlabel": {"align": "left"}}
