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


_ESM = r"""
const TYPES = {f8: Float64Array, f4: Float32Array, i4: Int32Array, i2: Int16Array, i1: Int8Array,
               u4: Uint32Array, u2: Uint16Array, u1: Uint8Array};

function bytesOf(b64) {
  if (Uint8Array.fromBase64) return Uint8Array.fromBase64(b64);  // native where the browser has it
  const raw = atob(b64), bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  return bytes;
}

// A packed array as plotly takes it: a row as the typed array itself (plotly reads typed arrays
// as data; no copy into a JavaScript array), a table as a list of rows.
function decode(v) {
  if (Array.isArray(v)) return v.map(decode);
  if (v && typeof v === "object") {
    if (v.ampviz_nd) {
      const arr = new TYPES[v.ampviz_nd](bytesOf(v.b64).buffer);
      if (v.shape.length === 2) {
        const [rows, cols] = v.shape, out = [];
        for (let i = 0; i < rows; i++) out.push(Array.from(arr.subarray(i * cols, (i + 1) * cols)));
        return out;
      }
      return arr;
    }
    const out = {};
    for (const k of Object.keys(v)) out[k] = decode(v[k]);
    return out;
  }
  return v;
}

// A move that changes only the traces' points and what their hover shows, under the layout
// already drawn and on axes whose ranges are fixed, is drawn by moving those traces
// (Plotly.animate without a redraw): plotly then skips drawing the axes, the legend and the
// annotations, about half of a full redraw. Anything else takes Plotly.react.
const POINT_KEYS = ["x", "y", "customdata", "hovertext", "text"];

function fixedAxis(layout, drawn, ref, letter, matched) {
  const name = letter + "axis" + (typeof ref === "string" ? ref.slice(1) : "");
  const ax = layout[name], now = drawn.layout[name];
  const range = ax && ax.range;  // a list, or a typed array as it travelled
  const fixed = !!range && (Array.isArray(range) || ArrayBuffer.isView(range)) && range.length === 2
    && (ax.autorange === undefined || ax.autorange === false) && ax.scaleanchor === undefined
    // as drawn: a learner's zoom or pan is reset by a full redraw, as on every other move
    && !!now && !!now.range && now.range[0] === range[0] && now.range[1] === range[1];
  if (!fixed || ax.matches === undefined) return fixed;
  // an axis that matches another: fixed when that one is, over the same range
  const other = layout[letter + "axis" + String(ax.matches).slice(1)];
  return !matched && !!other && !!other.range && other.range[0] === range[0] && other.range[1] === range[1]
    && fixedAxis(layout, drawn, ax.matches, letter, true);
}

function pointCount(trace) {
  const x = trace.x, y = trace.y;
  return x && x.length !== undefined ? x.length : y && y.length !== undefined ? y.length : 0;
}

// A scatter trace moves as a full redraw would draw it. A bar trace does only where nothing of it
// shows (no opacity: the census's counts, there for the hover): plotly rounds bars' edges to whole
// pixels in a full redraw and not in a move.
function movable(trace) {
  const type = trace.type || "scatter";
  return type === "scatter" || (type === "bar" && trace.opacity === 0);
}

// ``drawn``: the figure as plotly holds it now (``layout``: its axes' ranges as shown; ``data``:
// its traces, with a trace the learner hid from the legend marked so)
function pointsOnly(before, data, layout, drawn) {
  if (!before || before.data.length !== data.length || drawn.data.length !== data.length) return false;
  for (let i = 0; i < data.length; i++) {
    const a = before.data[i], b = data[i];
    if (drawn.data[i].visible !== b.visible) return false;  // a full redraw shows it again, as before
    // a trace that empties: moved, it would keep its last markers drawn (plotly removes a point
    // that has no place only in a full redraw)
    if (pointCount(a) > 0 && pointCount(b) === 0) return false;
    // an empty trace has no legend entry: one in the legend that fills changes it
    if (b.showlegend !== false && pointCount(a) === 0 && pointCount(b) > 0) return false;
    if (!movable(a) || !movable(b)) return false;
    for (const k of new Set([...Object.keys(a), ...Object.keys(b)])) {
      if (POINT_KEYS.includes(k) ? !(k in b) : JSON.stringify(a[k]) !== JSON.stringify(b[k])) return false;
    }
    if (!fixedAxis(layout, drawn, b.xaxis, "x") || !fixedAxis(layout, drawn, b.yaxis, "y")) return false;
  }
  return true;
}

// Draw ``data`` and ``layout`` into ``div``; ``before``: what the last call drew (its return
// value), ``sameLayout``: whether the layout is the one drawn then. Returns what it drew
// (``data``), whether it moved the traces (``moved``) or redrew the figure, and ``settled``, a
// promise of plotly's work on it ending: a move returns as soon as plotly has moved the traces,
// while its transition still waits a timer before it settles (nothing is drawn then).
async function drawFigure(Plotly, div, data, layout, config, before, sameLayout) {
  const moving = sameLayout && div._transitionData && div._fullLayout && Array.isArray(div.data)
    && pointsOnly(before, data, layout, {layout: div._fullLayout, data: div.data});
  if (moving) {
    // as plain arrays: plotly's animate walks a typed array's every index as an object's key
    // (about 13 ms a move for Fp8ScalingLab's lines of 2,000 steps), and a plain array not at all
    const moved = data.map((t) => {
      const u = {};
      for (const k of POINT_KEYS) if (k in t) u[k] = ArrayBuffer.isView(t[k]) ? Array.from(t[k]) : t[k];
      return u;
    });
    // with no duration plotly moves the traces at once, right after it says it is transitioning
    let onTransition = null;
    const movedNow = new Promise((resolve) => {
      onTransition = () => Promise.resolve().then(resolve);
      div.once("plotly_transitioning", onTransition);
    });
    const settled = Plotly.animate(div, {data: moved, traces: data.map((_, i) => i)},
                                   {transition: {duration: 0}, frame: {duration: 0, redraw: false}, mode: "immediate"});
    try {
      await Promise.race([movedNow, settled]);
    } finally {
      div.removeListener("plotly_transitioning", onTransition);  // a move that never began leaves none
    }
    return {data, moved: true, settled};
  }
  await Plotly.react(div, data, layout, config);
  return {data, moved: false, settled: Promise.resolve()};
}

async function inflate(view) {
  const stream = new Blob([view]).stream().pipeThrough(new DecompressionStream("deflate"));
  return await new Response(stream).blob();
}

function loadPlotly(model) {
  if (globalThis.Plotly && globalThis.Plotly.react) return Promise.resolve(globalThis.Plotly);
  if (!globalThis.__ampvizPlotly) {
    globalThis.__ampvizPlotly = new Promise((resolve, reject) => {
      const timer = setTimeout(() => { model.off("msg:custom", onMsg); reject(new Error("plotly.js did not arrive")); }, 60000);
      async function onMsg(msg, buffers) {
        if (!msg || msg.type !== "plotly.js") return;
        model.off("msg:custom", onMsg);
        clearTimeout(timer);
        try {
          const blob = await inflate(buffers[0]);
          const url = URL.createObjectURL(new Blob([blob], {type: "text/javascript"}));
          const script = document.createElement("script");
          script.src = url;
          script.onload = () => resolve(globalThis.Plotly);
          script.onerror = () => reject(new Error("plotly.js did not load"));
          document.head.appendChild(script);
        } catch (e) { reject(e); }
      }
      model.on("msg:custom", onMsg);
      model.send({type: "plotly.js?"});
    }).catch((e) => { globalThis.__ampvizPlotly = null; throw e; });
  }
  return globalThis.__ampvizPlotly;
}

export default {
  render({ model, el }) {
    el.classList.add("ampviz-figure-view");
    const div = document.createElement("div");
    el.appendChild(div);
    let alive = true, drawing = false, again = false, width = 0, shown = null, shownLayout = null;
    const draw = async () => {
      const Plotly = await loadPlotly(model);
      if (!alive) return;
      // the newest state, read now: updates that arrived while the last one was drawn are skipped
      const revision = model.get("revision");
      const packedLayout = model.get("figure_layout") || {};
      const layout = decode(packedLayout);
      const data = decode(model.get("data") || []);
      const start = performance.now();
      // the kernel sends the layout only when it changed: the same object is the same layout
      shown = await drawFigure(Plotly, div, data, layout, model.get("config") || {}, shown,
                               packedLayout === shownLayout);
      shownLayout = packedLayout;
      // how long plotly took to draw it, for the latency bench (set before the revision it drew)
      div.dataset.drawMs = (performance.now() - start).toFixed(1);
      div.dataset.drawnBy = shown.moved ? "moving" : "redrawing";
      div.dataset.revision = String(revision);
      await shown.settled;  // the next draw starts once plotly is done with this one
    };
    // Draw at once when idle; while a draw runs, later updates only ask for one more draw of the
    // newest state once it ends (the intermediate ones are never drawn).
    const schedule = async () => {
      if (!alive) return;
      if (drawing) { again = true; return; }
      drawing = true;
      try {
        do {
          again = false;
          await draw();
        } while (again && alive);
      } catch (e) {
        shown = null;
        div.textContent = "The figure could not be drawn: " + e;
      } finally {
        drawing = false;
      }
    };
    model.on("change:revision", schedule);
    schedule();
    // a view drawn while hidden (a tab not shown) has no width: draw again once it has one
    const observer = new ResizeObserver(() => {
      const w = el.clientWidth;
      if (w > 0 && Math.abs(w - width) > 1) {
        width = w;
        if (div.classList.contains("js-plotly-plot") && globalThis.Plotly) globalThis.Plotly.Plots.resize(div);
      }
    });
    observer.observe(el);
    return () => {
      alive = false;
      observer.disconnect();
      model.off("change:revision", schedule);
      if (globalThis.Plotly && div.classList.contains("js-plotly-plot")) globalThis.Plotly.purge(div);
    };
  },
};
"""


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
        if not isinstance(content, dict):
            return
        if content.get("type") == "plotly.js?":
            self.send({"type": "plotly.js"}, buffers=[_plotly_js()])

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
