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

#: One fixed colour per scaler preset (``ampviz.scaling.PRESETS``, by name): a framework keeps its
#: colour in every figure and in ScalerLab, whatever else is drawn with it (Okabe-Ito, then Paul
#: Tol's muted colours). A scaler of no preset (e.g. ScalerLab's "your settings") takes the first
#: of ``TRACE_COLORS`` that no preset in the same figure has (``scaler_colors``).
PRESET_COLORS = {
    "torch": "#000000",
    "DeepSpeed ZeRO": "#0072B2",
    "DeepSpeed": "#56B4E9",
    "Megatron": "#D55E00",
    "NeMo (apex hysteresis)": "#009E73",
    "Keras 3": "#CC79A7",
    "jmp": "#E69F00",
    "static 1024": "#888888",
    "Keras 2": "#882255",
    "apex amp": "#117733",
    "fairseq": "#332288",
    "metaseq": "#999933",
}


def scaler_colors(names) -> list:
    """The colour of each scaler named in ``names``, in order: a preset's own (``PRESET_COLORS``);
    any other takes the next of ``TRACE_COLORS`` that no preset drawn with it has."""
    names = [str(n) for n in names]
    taken = {PRESET_COLORS[n] for n in names if n in PRESET_COLORS}
    free = [c for c in TRACE_COLORS if c not in taken] or list(TRACE_COLORS)
    out, k = [], 0
    for n in names:
        if n in PRESET_COLORS:
            out.append(PRESET_COLORS[n])
        else:
            out.append(free[k % len(free)])
            k += 1
    return out


#: The colour scale of every heat map (the live trainer's "gradients lost"), spelled out as
#: [position, colour] pairs from light (0: nothing lost) to dark blue (1: all lost; ColorBrewer's
#: Blues). A named scale would not do: plotly.py resolves "Blues" light to dark, while plotly.js,
#: which draws the live figure's traces as sent, runs its own "Blues" dark to light.
LOST_COLORSCALE = [[0.0, "rgb(247,251,255)"], [0.125, "rgb(222,235,247)"], [0.25, "rgb(198,219,239)"],
                   [0.375, "rgb(158,202,225)"], [0.5, "rgb(107,174,214)"], [0.625, "rgb(66,146,198)"],
                   [0.75, "rgb(33,113,181)"], [0.875, "rgb(8,81,156)"], [1.0, "rgb(8,48,107)"]]

#: plotly.js's config for every figure (the explorers' ``FigureView``s and the figures the notebooks
#: show): no plotly logo, and no "Share chart" link or button that uploads the figure to Plotly
#: Cloud (plotly.js 3 shows one by default, also in the offline Voila app; it no longer has the
#: older "showLink" option, which plotly.py would warn about).
FIGURE_CONFIG = {"displaylogo": False, "showSendToCloud": False,
                 "modeBarButtonsToRemove": ["sendDataToCloud", "sendChartToCloud"]}


def figure_config(config=None) -> dict:
    """``FIGURE_CONFIG`` with ``config`` (a dict, or None) over it, as a new dict."""
    if config is not None and not isinstance(config, dict):
        raise TypeError(f"config must be a dict of plotly.js options, got {type(config).__name__}")
    merged = {**FIGURE_CONFIG, **(config or {})}
    merged["modeBarButtonsToRemove"] = list(merged.get("modeBarButtonsToRemove") or [])
    return merged


class Figure(go.Figure):
    """A ``go.Figure`` that is shown with ``FIGURE_CONFIG`` (no "Share chart" upload to Plotly
    Cloud), in a notebook, by ``show()`` and in HTML; every ``plot_*`` returns one. A ``config``
    given to ``show`` or ``to_html`` goes over ``FIGURE_CONFIG``."""

    config = property(lambda self: figure_config(), doc="The plotly.js config the figure is shown with.")

    def _ipython_display_(self):
        if pio.renderers.render_on_display and pio.renderers.default:
            self.show()
        else:
            print(repr(self))

    def _repr_mimebundle_(self, include=None, exclude=None, validate=True, **kwargs):
        kwargs["config"] = figure_config(kwargs.get("config"))
        return super()._repr_mimebundle_(include, exclude, validate, **kwargs)

    def show(self, *args, **kwargs):
        kwargs["config"] = figure_config(kwargs.get("config"))
        return super().show(*args, **kwargs)

    def to_html(self, *args, **kwargs):
        if not args:  # the config is to_html's first argument
            kwargs["config"] = figure_config(kwargs.get("config"))
        return super().to_html(*args, **kwargs)

    def write_html(self, *args, **kwargs):
        if len(args) < 2:  # the file, then the config
            kwargs["config"] = figure_config(kwargs.get("config"))
        return super().write_html(*args, **kwargs)


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
    return Figure({"data": list(data), "layout": layout}, _validate=False)


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
