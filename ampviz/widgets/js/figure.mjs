// FigureView's front end: a plotly figure kept as synced widget state, drawn with Plotly.react,
// or by moving its traces when only their points changed (see ampviz/widgets/figureview.py).
// The client-side explorers import drawFigure, loadPlotly and decode from here.
const TYPES = {f8: Float64Array, f4: Float32Array, i4: Int32Array, i2: Int16Array, i1: Int8Array,
               u4: Uint32Array, u2: Uint16Array, u1: Uint8Array};

export function bytesOf(b64) {
  if (Uint8Array.fromBase64) return Uint8Array.fromBase64(b64);  // native where the browser has it
  const raw = atob(b64), bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  return bytes;
}

// A packed array as plotly takes it: a row as the typed array itself (plotly reads typed arrays
// as data; no copy into a JavaScript array), a table as a list of rows.
export function decode(v) {
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

// Whether trace ``b`` has the points of trace ``a`` (every point key the same, element by element).
function samePoints(a, b) {
  for (const k of POINT_KEYS) {
    const u = a[k], v = b[k];
    if (u === v) continue;
    if (u === undefined || v === undefined || u === null || v === null || u.length !== v.length) return false;
    for (let i = 0; i < u.length; i++) {
      if (!Object.is(u[i], v[i]) && JSON.stringify(u[i]) !== JSON.stringify(v[i])) return false;
    }
  }
  return true;
}

// Whether a move draws the trace, its points unchanged, as a full redraw drew it: a trace that
// can move, or a bar of an opaque colour with no outline and no hatching (plotly rounds the edges
// of other bars to whole pixels in a full redraw only, and lays a hatching's pattern anew).
function redrawnAlike(trace) {
  const marker = trace.marker || {}, line = marker.line || {}, pattern = marker.pattern || {};
  const shapes = pattern.shape === undefined ? [] : [].concat(pattern.shape);
  return movable(trace) || (trace.type === "bar" && typeof marker.color === "string" && marker.color.startsWith("#")
    && line.width === 0 && shapes.every((s) => s === ""));
}

// The traces a move draws by moving them (their indices), or false where the move needs a full
// redraw. A move draws every trace of the figure again (plotly's animate takes away those it is
// not given), so every trace must be movable, or keep its points where a move draws it as it was
// (FormatExplorer's band bars). No index: nothing changed. ``drawn``: the figure as plotly holds
// it now (``layout``: its axes' ranges as shown; ``data``: its traces, with a trace the learner
// hid from the legend marked so)
function pointsOnly(before, data, layout, drawn) {
  if (!before || before.data.length !== data.length || drawn.data.length !== data.length) return false;
  let changed = false;
  for (let i = 0; i < data.length; i++) {
    const a = before.data[i], b = data[i];
    if (drawn.data[i].visible !== b.visible) return false;  // a full redraw shows it again, as before
    for (const k of new Set([...Object.keys(a), ...Object.keys(b)])) {
      if (POINT_KEYS.includes(k) ? !(k in b) : JSON.stringify(a[k]) !== JSON.stringify(b[k])) return false;
    }
    const same = samePoints(a, b);
    changed ||= !same;
    if (same && redrawnAlike(b)) continue;
    // a trace that empties: moved, it would keep its last markers drawn (plotly removes a point
    // that has no place only in a full redraw)
    if (pointCount(a) > 0 && pointCount(b) === 0) return false;
    // an empty trace has no legend entry: one in the legend that fills changes it
    if (b.showlegend !== false && pointCount(a) === 0 && pointCount(b) > 0) return false;
    if (!movable(a) || !movable(b)) return false;
    if (!fixedAxis(layout, drawn, b.xaxis, "x") || !fixedAxis(layout, drawn, b.yaxis, "y")) return false;
  }
  return changed ? data.map((_, i) => i) : [];
}

// Draw ``data`` and ``layout`` into ``div``; ``before``: what the last call drew (its return
// value), ``sameLayout``: whether the layout is the one drawn then. Returns what it drew
// (``data``), whether it moved the traces (``moved``) or redrew the figure, and ``settled``, a
// promise of plotly's work on it ending: a move returns as soon as plotly has moved the traces,
// while its transition still waits a timer before it settles (nothing is drawn then).
export async function drawFigure(Plotly, div, data, layout, config, before, sameLayout) {
  const moving = sameLayout && div._transitionData && div._fullLayout && Array.isArray(div.data)
    && pointsOnly(before, data, layout, {layout: div._fullLayout, data: div.data});
  if (moving && !moving.length) return {data, moved: true, settled: Promise.resolve()};  // nothing to draw
  if (moving) {
    // as plain arrays: plotly's animate walks a typed array's every index as an object's key
    // (about 13 ms a move for Fp8ScalingLab's lines of 2,000 steps), and a plain array not at all
    const moved = moving.map((i) => {
      const t = data[i], u = {};
      for (const k of POINT_KEYS) if (k in t) u[k] = ArrayBuffer.isView(t[k]) ? Array.from(t[k]) : t[k];
      return u;
    });
    // with no duration plotly moves the traces at once, right after it says it is transitioning
    let onTransition = null;
    const movedNow = new Promise((resolve) => {
      onTransition = () => Promise.resolve().then(resolve);
      div.once("plotly_transitioning", onTransition);
    });
    const settled = Plotly.animate(div, {data: moved, traces: moving},
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

export function loadPlotly(model) {
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
