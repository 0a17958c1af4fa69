"""FigureView: a plotly figure as synced widget state, drawn in the browser with ``Plotly.react``.

plotly's own ``go.FigureWidget`` syncs a figure only as it was *constructed*; every later change
(``batch_update``, a trace's ``x`` assigned) travels as a one-shot message that a view must be
there to receive. A view attached later (a page reload, a second view of the same output, a tab
that was never shown, Voila loading the page) therefore shows the figure as it was built, or
nothing. ``FigureView`` keeps the whole figure -- its traces (``data``), layout
(``figure_layout``) and ``config`` -- as ordinary synced widget state, so every view, attached at any time, draws the
current figure; numeric arrays travel as base64 of their bytes (exact, NaN kept as a gap; binary
widget buffers are not used, since Voila's page drops them from a widget's first state).
Updates assign ``data`` or ``figure_layout``; the browser draws at once when it is idle, and an update
that arrives while a draw runs only asks for one more draw of the newest state when it ends: when
updates come faster than it can draw, the intermediate ones are skipped and the last one always
wins. An update that changes only the traces' points and hover values (``x``, ``y``,
``customdata``, ``hovertext``, ``text``) of scatter traces (and of bar traces drawn with no
opacity, which only carry a hover) under the layout already drawn, on axes whose ranges are fixed
and shown as given, is drawn by moving those traces (``Plotly.animate`` without a redraw), in about
half the time of a full ``Plotly.react``; a figure that keeps its names and ranges while a slider
moves (ScalerLab's, RangeExplorer's) is drawn that way.

plotly.js itself (about 4.8 MB, from the plotly Python package) is sent once per browser page, on
the first view's request, instead of with every widget.
"""

from __future__ import annotations

import base64
import json
import math
import zlib
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import anywidget
import numpy as np
import traitlets

from ampviz.plots.style import figure_config

__all__ = ["FigureView", "Prepared", "pack"]

# numpy dtypes that travel as they are; everything else numeric is converted (int64 -> the narrowest
# integer type that holds its values, or float64:
# JavaScript has no 64-bit integer typed array that plotly.js reads)
_WIRE = {"float64": "f8", "float32": "f4", "int32": "i4", "int16": "i2", "int8": "i1",
         "uint32": "u4", "uint16": "u2", "uint8": "u1"}


def _narrowest_int(a: np.ndarray) -> np.ndarray:
    """An integer array in the narrowest integer type that holds every value (steps 0..1999 travel
    as int16: a quarter of an int64's bytes, half an int32's), or as float64 beyond 32 bits."""
    lo, hi = (int(a.min()), int(a.max())) if a.size else (0, 0)
    for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32):
        info = np.iinfo(t)
        if info.min <= lo and hi <= info.max:
            return a.astype(t)
    return a.astype(np.float64)


def _pack_array(a: np.ndarray):
    if a.ndim == 0:
        return _pack_value(a.item())
    if a.dtype.kind in "OUS" or a.ndim > 2:
        return _pack_value(a.tolist())
    if a.dtype.kind == "b":
        a = a.astype(np.uint8)
    elif a.dtype.kind == "f" and a.dtype.name not in _WIRE:
        a = a.astype(np.float64 if a.dtype.itemsize > 4 else np.float32)
    elif a.dtype.kind in "iu":
        a = _narrowest_int(a)  # any integer type: counts of 4,096 values travel as int16
    elif a.dtype.kind not in "fiu":
        raise TypeError(f"cannot send an array of dtype {a.dtype} to a figure: use numbers or strings")
    a = np.ascontiguousarray(a.astype(a.dtype.newbyteorder("<"), copy=False))
    return {"ampviz_nd": _WIRE[a.dtype.name], "shape": list(a.shape),
            "b64": base64.b64encode(a.tobytes()).decode("ascii")}


class _PackedList(list):
    """Traces already packed (``FigureView.prepare``): sent as they are."""


class _PackedDict(dict):
    """A layout already packed (``FigureView.prepare``): sent as it is."""


def _pack_value(v):
    if isinstance(v, (_PackedList, _PackedDict)):
        return v
    if isinstance(v, np.ndarray):
        return _pack_array(v)
    if isinstance(v, dict):
        return {str(k): _pack_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        if v and all(isinstance(x, (float, int, np.floating, np.integer)) and not isinstance(x, bool)
                     for x in v):
            return _pack_array(np.asarray(v, dtype=np.float64))
        return [_pack_value(x) for x in v]
    if isinstance(v, np.generic):
        return _pack_value(v.item())
    if isinstance(v, float) and not math.isfinite(v):
        return None  # JSON has no NaN or inf; plotly reads null as "no value"
    if v is None or isinstance(v, (str, bool, int, float)):
        return v
    raise TypeError(f"cannot send a {type(v).__name__} to a figure: use numbers, strings, lists, dicts "
                    f"or numpy arrays of numbers")


def pack(value):
    """``value`` (traces, a layout: dicts, lists, numpy arrays, numbers, strings) as widget state:
    numeric arrays and lists become ``{"ampviz_nd": dtype, "shape": [...], "b64": base64 of the
    little-endian bytes}`` (decoded into arrays in the browser), non-finite scalars None. Anything
    else (a set, bytes, a complex number, an object) is a TypeError that says what to pass."""
    return _pack_value(value)


def _check(value) -> None:
    """What ``pack`` would refuse, refused now (without encoding anything): a figure part is
    checked when it is assigned, not when it is sent."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "fiub" or value.ndim == 0:
            if value.ndim == 0:
                _check(value.item())
            return
        if value.dtype.kind in "OUS" or value.ndim > 2:
            for x in value.ravel().tolist():
                _check(x)
            return
        raise TypeError(f"cannot send an array of dtype {value.dtype} to a figure: use numbers or strings")
    if isinstance(value, dict):
        for x in value.values():
            _check(x)
    elif isinstance(value, (list, tuple)):
        for x in value:
            _check(x)
    elif not (value is None or isinstance(value, (str, bool, int, float, np.generic))) or \
            isinstance(value, (np.complexfloating, np.datetime64, np.timedelta64, np.void)):
        raise TypeError(f"cannot send a {type(value).__name__} to a figure: use numbers, strings, lists, "
                        f"dicts or numpy arrays of numbers")


def _layout_key(layout: dict) -> str:
    """The layout as its wire text: equal keys mean the browser would receive the same layout."""
    return json.dumps(pack(layout), sort_keys=True)


def _to_json(value, widget):
    return pack(value)


def _figure_parts(figure) -> tuple[list, dict]:
    """``(data, layout)`` of a ``go.Figure`` or a dict ``{"data": [...], "layout": {...}}``."""
    if hasattr(figure, "to_plotly_json"):
        # a go.Figure holds its traces and layout as plain dicts (``_data``, ``_layout``), which
        # ``to_plotly_json`` deep-copies first: ~10 ms a figure that a slider move need not pay,
        # since nothing here changes them (packing builds new ones)
        data, layout = getattr(figure, "_data", None), getattr(figure, "_layout", None)
        figure = {"data": data, "layout": layout} if isinstance(data, list) and isinstance(layout, dict) \
            else figure.to_plotly_json()
    if not isinstance(figure, dict):
        raise TypeError(f"a figure must be a plotly Figure or a dict with data and layout, got {type(figure).__name__}")
    data = figure.get("data", [])
    layout = figure.get("layout", {})
    if not isinstance(data, (list, tuple)) or not all(isinstance(t, dict) for t in data) \
            or not isinstance(layout, dict):
        raise TypeError("a figure's data must be a list of trace dicts and its layout a dict")
    _check(data)
    _check(layout)
    # layout.meta (facts about the figure for Python; plotly draws nothing from it) stays with the
    # figure: it changes at every move of a slider while the drawn layout stays, and the layout
    # would travel again each time
    return list(data), {k: v for k, v in layout.items() if k != "meta"}


@lru_cache(maxsize=1)
def _plotly_js() -> bytes:
    """plotly.js from the plotly package, deflated (the browser inflates it)."""
    import plotly

    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    return zlib.compress(path.read_bytes(), 6)


_ESM = (Path(__file__).parent / "js" / "figure.mjs").read_text()


def answer_plotly_request(widget, content, buffers=None) -> None:
    """A widget's message handler: plotly.js, deflated, to a front end that asks for it
    (``loadPlotly`` in ``js/figure.mjs``: the first view of a page asks once)."""
    if isinstance(content, dict) and content.get("type") == "plotly.js?":
        widget.send({"type": "plotly.js"}, buffers=[_plotly_js()])


class Prepared(NamedTuple):
    """A figure as ``FigureView`` sends it: traces and layout packed, and the layout's wire text."""

    data: list
    layout: dict
    layout_key: str


class FigureView(anywidget.AnyWidget):
    """A plotly figure as synced widget state (see the module's docstring).

    ``FigureView(fig)`` takes a ``go.Figure`` (or ``{"data": [...], "layout": {...}}``);
    ``update(fig)`` replaces the whole figure, ``set_data(traces)`` only the traces (a list of
    trace dicts, numpy arrays welcome), ``set_layout(layout)`` only the layout. Each sends its
    part in one message. ``data`` and ``figure_layout`` hold what was last assigned (packed,
    after ``update``), less the layout's ``meta`` (plotly draws nothing from it; it stays with the
    figure).

    The figure's layout is not called ``layout`` in the widget's state: that name is every
    DOM widget's CSS layout (``view.layout``, an ``ipywidgets.Layout``, as for any widget), which
    the browser's widget manager reads as a widget of its own; a figure's layout there made it
    fail, with an uncaught error in the page's console, each time a view was shown and each time
    the layout changed.
    """

    _esm = _ESM
    _css = ".ampviz-figure-view { width: 100%; min-height: 60px; }"

    data = traitlets.List().tag(sync=True, to_json=_to_json)
    figure_layout = traitlets.Dict().tag(sync=True, to_json=_to_json)
    config = traitlets.Dict().tag(sync=True, to_json=_to_json)
    revision = traitlets.Int(0).tag(sync=True)

    def __init__(self, figure=None, *, config=None, **kwargs):
        data, layout = _figure_parts(figure) if figure is not None else ([], {})
        # no plotly logo and no "Share chart" upload to Plotly Cloud (``FIGURE_CONFIG``), unless
        # ``config`` says otherwise
        super().__init__(data=data, figure_layout=layout, config=figure_config(config), **kwargs)
        self._shown_layout = _layout_key(self.figure_layout)
        self.on_msg(self._on_custom)

    def _on_custom(self, widget, content, buffers) -> None:
        answer_plotly_request(widget, content, buffers)

    @staticmethod
    def prepare(figure) -> "Prepared":
        """``figure`` checked and packed for sending, ahead of time: ``update(prepared)`` then
        only sends it (an explorer prepares the figures of the positions a slider reaches next)."""
        data, layout = _figure_parts(figure)
        packed_layout = pack(layout)
        return Prepared(_PackedList(pack(data)), _PackedDict(packed_layout),
                        json.dumps(packed_layout, sort_keys=True))

    def update(self, figure) -> None:
        """Replace the whole figure in one message: the traces always, the layout only when it
        differs from the one shown (a slider move usually changes only the data). ``figure``: a
        ``go.Figure``, a dict with data and layout, or what ``prepare`` made of one."""
        # packed here once: the layout's key and the message are made from the same packing (a
        # layout with plotly's template costs several ms to pack, and FormatExplorer's changes with
        # every bit)
        data, layout, key = figure if isinstance(figure, Prepared) else self.prepare(figure)
        with self.hold_sync():
            self.data = data
            if key != self._shown_layout:
                self.figure_layout = layout
                self._shown_layout = key
            self.revision += 1

    def set_data(self, data) -> None:
        """Replace the traces (a list of trace dicts) and keep the layout."""
        if not isinstance(data, (list, tuple)) or not all(isinstance(t, dict) for t in data):
            raise TypeError("set_data takes a list of trace dicts, e.g. [{'type': 'scatter', 'x': ..., 'y': ...}]")
        _check(data)
        with self.hold_sync():
            self.data = list(data)
            self.revision += 1

    def set_layout(self, layout) -> None:
        """Replace the layout and keep the traces."""
        if not isinstance(layout, dict):
            raise TypeError("set_layout takes a layout dict")
        _check(layout)
        with self.hold_sync():
            self.figure_layout = {k: v for k, v in layout.items() if k != "meta"}  # as in update
            self._shown_layout = _layout_key(self.figure_layout)
            self.revision += 1
