// What every page-computed explorer's front end shares: its page (the controls' column beside the
// figure, keys kept from JupyterLab), labelled rows and sliders, and the figure drawn one draw at
// a time, the newest settings winning (as FigureView draws).

import { drawFigure, loadPlotly } from "./figure.mjs";

/** plotly.js's config (ampviz.plots.style's FIGURE_CONFIG: no logo, no upload to Plotly Cloud). */
export const FIGURE_CONFIG = { displaylogo: false, showSendToCloud: false,
  modeBarButtonsToRemove: ["sendDataToCloud", "sendChartToCloud"], responsive: true };

/** Keys pressed in ``el`` stay there: JupyterLab's notebook, an ancestor, takes arrow keys (and
 *  cancels their default, a range input's step) unless they stop. Returns the undoing function. */
export function keepKeys(el) {
  const ownKeys = (e) => e.stopPropagation();
  el.addEventListener("keydown", ownKeys);
  return () => el.removeEventListener("keydown", ownKeys);
}

/** The explorer's page in ``el``: a column of controls 360 pixels wide and the figure beside it
 *  (under it on a page too narrow for both), as the kernel explorers' ``_beside``. */
export function explorerPage(el, rootClass, figureClass) {
  el.classList.add(rootClass);
  const remove = keepKeys(el);
  el.style.cssText = "display:flex;flex-wrap:wrap;align-items:flex-start";
  const column = document.createElement("div");
  column.className = "ampviz-controls";
  column.style.cssText = "width:360px;flex:0 0 360px;margin:0 16px 0 0";
  const figure = document.createElement("div");
  figure.className = figureClass;
  figure.style.cssText = "flex:1 1 560px;min-width:560px";
  const message = document.createElement("div");
  message.className = "ampviz-message";
  message.style.color = "#b00020";
  el.append(column, figure);
  return { column, figure, message, remove };
}

/** A labelled row of the controls' column: the label, the control, and what it shows (optional). */
export function row(label, input, shown) {
  const div = document.createElement("div");
  div.className = "ampviz-browser-row";
  div.style.cssText = "display:flex;align-items:center;gap:8px;margin:4px 0";
  const name = document.createElement("label");
  name.textContent = label;
  name.style.cssText = "width:110px;flex:0 0 110px;text-align:right";
  div.append(name, input);
  if (shown) { shown.style.cssText = "width:52px;font-variant-numeric:tabular-nums"; div.append(shown); }
  return div;
}

/** A range input from min to max in steps, with a CSS class. */
export function slider(cls, min, max, step) {
  const input = document.createElement("input");
  Object.assign(input, { type: "range", min: String(min), max: String(max), step: String(step) });
  input.className = cls;
  input.style.width = "170px";
  return input;
}

/** The position nearest ``value`` on a slider's grid (min + k * step), as a decimal names it. */
export function onGrid(value, min, step, digits = 12) {
  return Number((min + Math.round((value - min) / step) * step).toFixed(digits));
}

/** A layout's JSON less its meta. */
function withoutMeta(layout) {
  return JSON.stringify({ ...layout, meta: undefined });
}

/** Draws the explorer's figures into ``div``, one draw at a time: ``schedule()`` asks for a draw
 *  of what ``compute()`` returns then ({figure, settings}, or throws to show a message); asks
 *  that come while one draw runs are answered by one more draw of the newest settings. After each
 *  draw ``div`` is marked with the settings drawn and how long computing and drawing took.
 *  ``layoutKey``: the text that tells whether a layout is the one drawn before (only then may a
 *  draw move the traces); by default the layout's JSON less its meta (numbers for a reader of the
 *  figure, which plotly draws nothing from), as FigureView leaves it out. */
export function drawLoop(model, div, message, compute, onResult = () => {}, layoutKey = withoutMeta) {
  let alive = true, drawing = false, again = false, shown = null, layoutText = null;
  const draw = async () => {
    const start = performance.now();
    let result;
    try {
      result = compute();
      message.textContent = "";
    } catch (e) {
      message.textContent = String(e.message || e);  // the last good figure stays
      return;
    }
    onResult(result);
    const computed = performance.now();
    const Plotly = await loadPlotly(model);
    if (!alive) return;
    const text = layoutKey(result.figure.layout);
    shown = await drawFigure(Plotly, div, result.figure.data, result.figure.layout,
      model.get("config") || { ...FIGURE_CONFIG }, shown, text === layoutText);
    layoutText = text;
    // for the benches: how long the page computed, how long plotly drew (and how)
    div.dataset.computeMs = (computed - start).toFixed(1);
    div.dataset.drawMs = (performance.now() - computed).toFixed(1);
    div.dataset.drawnBy = shown.moved ? "moving" : "redrawing";
    div.dataset.drawn = JSON.stringify(result.settings);
    await shown.settled;
  };
  const schedule = async () => {
    if (!alive) return;
    if (drawing) { again = true; return; }
    drawing = true;
    try {
      do { again = false; await draw(); } while (again && alive);
    } catch (e) {
      shown = null;
      message.textContent = "The figure could not be drawn: " + e;
    } finally {
      drawing = false;
    }
  };
  const stop = () => {
    alive = false;
    if (globalThis.Plotly && div.classList.contains("js-plotly-plot")) globalThis.Plotly.purge(div);
  };
  return { schedule, stop };
}

/** What a control's move does: ``settings[k]`` takes ``value``, ``redraw()`` shows it (the
 *  controls, the readout, the figure's next draw), and Python is told (the model's ``k``).
 *  Returns moved(k, value). */
export function mover(model, settings, redraw) {
  return (k, value) => {
    settings[k] = value;
    redraw();
    model.set(k, value);
    model.save_changes();
  };
}

/** Follows the model (Python's side of the settings): when any of ``keys`` changes there,
 *  ``settings`` takes the new values and ``onChange()`` runs once; ``shipped`` ({trait: f}) hands
 *  each data trait Python ships later to its f. Returns the function that stops following. */
export function followModel(model, keys, settings, onChange, shipped = {}) {
  const fromModel = () => {
    let changed = false;
    for (const k of keys) {
      const v = model.get(k);
      if (JSON.stringify(v) !== JSON.stringify(settings[k])) { settings[k] = v; changed = true; }
    }
    if (changed) onChange();
  };
  const handlers = [...keys.map((k) => [k, fromModel]),
    ...Object.entries(shipped).map(([k, f]) => [k, () => f(model.get(k))])];
  for (const [k, h] of handlers) model.on(`change:${k}`, h);
  return () => { for (const [k, h] of handlers) model.off(`change:${k}`, h); };
}

/** An explorer whose readout follows every move at once while its figure is drawn when plotly is
 *  free: ``refresh()`` computes (``compute()``, throwing to show a message) and shows the result
 *  (``show(result)``); ``schedule()`` draws the last result computed. */
export function readoutFirst(model, div, message, compute, show) {
  let latest = null;
  const refresh = () => {
    try {
      latest = compute();
      message.textContent = "";
    } catch (e) {
      latest = null;
      message.textContent = String(e.message || e);
      return;
    }
    show(latest.result);
  };
  const { schedule, stop } = drawLoop(model, div, message, () => {
    if (!latest) throw new Error(message.textContent);
    return { figure: latest.result.figure, settings: latest.settings };
  });
  return { refresh, schedule, stop };
}
