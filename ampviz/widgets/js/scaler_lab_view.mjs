// BrowserScalerLab's front end: ScalerLab's controls, figure and readout, computed in the page.
// The stream is rebuilt from the shipped draws and recipe (streams.mjs), every scaler runs as
// ampviz.scaling.simulate does (scaling.mjs), and the figure and readout are ScalerLab's
// (scaleplot.mjs). The settings are the model's synced state: a move sets them (Python reads
// them), and a setting changed from Python moves the control. With no kernel (a static page) the
// model is the page's own, and everything still works.

import { simulate } from "./scaling.mjs";
import { rebuild } from "./streams.mjs";
import { formatG, lostShare, readoutHtml, scaleTraceFigure, scalerLabTitle } from "./scaleplot.mjs";
import { bytesOf } from "./figure.mjs";
import { drawLoop, explorerPage, followModel, mover, onGrid, row, slider } from "./view_parts.mjs";

export const SETTINGS = ["init_log2", "growth_factor", "backoff_factor", "growth_interval", "scenario", "strength",
  "loss_dtype", "overlay"];

/** The key of a scenario's recipe at a strength: the name and the strength's float64 bits in hex
 *  (as ampviz.widgets.browser_scaler_lab keys it: no decimal text to agree on). */
export function recipeKey(scenario, strength) {
  const view = new DataView(new ArrayBuffer(8));
  view.setFloat64(0, strength);
  let hex = "";
  for (let i = 0; i < 8; i++) hex += view.getUint8(i).toString(16).padStart(2, "0");
  return `${scenario}|${hex}`;
}

/** The median of a Float32Array as numpy's of float32 gives it (the mean of the two middle
 *  values computed in float32), found by selection in linear time on a copy (no NaN in a stream). */
export function medianFloat32(a) {
  const n = a.length;
  if (n === 0) return NaN;
  const s = Float32Array.from(a);
  const hi = select(s, n >> 1);
  if (n % 2) return hi;
  let lo = -Infinity;  // the largest value left of the upper middle one: the lower middle one
  for (let i = 0; i < n >> 1; i++) if (s[i] > lo) lo = s[i];
  return Math.fround(Math.fround(lo + hi) / 2);
}

/** The k-th smallest of s (0-based), leaving every smaller value before index k (Hoare's
 *  selection, middle pivot). */
function select(s, k) {
  let left = 0, right = s.length - 1;
  while (left < right) {
    const pivot = s[(left + right) >> 1];
    let i = left, j = right;
    while (i <= j) {
      while (s[i] < pivot) i++;
      while (s[j] > pivot) j--;
      if (i <= j) { const t = s[i]; s[i] = s[j]; s[j] = t; i++; j--; }
    }
    if (k <= j) right = j;
    else if (k >= i) left = i;
    else break;
  }
  return s[k];
}

/** The lab's shipped data (draws, gradient sample, recipes, presets) from the model's state. */
export function shippedData(get) {
  return {
    normals: new Float64Array(bytesOf(get("normals")).buffer),
    shape: new Float32Array(bytesOf(get("grad_shape")).buffer),
    recipes: get("recipes"), presets: get("presets"), torch: get("torch_policy"),
    steps: get("steps"), marks: get("marks"),
  };
}

/** Everything the page shows for ``settings`` (SETTINGS by name): the stream, each scaler's run
 *  (yours first), the lost share, the figure and the readout. ``cache`` keeps recent streams. */
export function compute(data, settings, cache = new Map()) {
  const key = recipeKey(settings.scenario, settings.strength);
  let entry = cache.get(key);
  if (!entry) {
    const shipped = data.recipes[key];
    if (!shipped) throw new RangeError(`no recipe for ${key}`);
    const stream = rebuild(shipped.recipe, data.normals, shipped.steps, shipped.values);
    entry = { stream, level: stream.length ? medianFloat32(stream) : 1.0 };
    cache.set(key, entry);
    if (cache.size > 3) cache.delete(cache.keys().next().value);
  }
  const yours = { ...data.torch, name: "your settings", init_scale: 2 ** settings.init_log2,
    growth_factor: settings.growth_factor, backoff_factor: settings.backoff_factor,
    growth_interval: settings.growth_interval };
  const fp16Loss = settings.loss_dtype === "float16";
  const run = (p) => {
    const r = simulate(p, { gradMax: entry.stream, fmt: "fp16", lossInFormat: fp16Loss });
    return { name: p.name, scale: r.scale, skipped: r.skipped, steps: r.scale.length, stoppedAt: r.stoppedAt,
      stopReason: r.stopReason, final: r.final };
  };
  // a framework's run depends only on the stream and the loss: kept with the stream
  entry.presets ??= new Map();
  const preset = (name) => {
    const k = `${name}|${settings.loss_dtype}`;
    if (!entry.presets.has(k)) entry.presets.set(k, run(data.presets[name]));
    return entry.presets.get(k);
  };
  const traces = [run(yours), ...settings.overlay.map(preset)];
  const lost = lostShare(traces[0].scale, data.shape, entry.level);
  const title = scalerLabTitle(settings.scenario, settings.strength, data.steps, settings.loss_dtype);
  const figure = scaleTraceFigure(traces, { title, lost: { "your settings": lost }, maxMarkers: data.marks,
    legendCounts: false });
  return { stream: entry.stream, traces, lost, figure, readout: readoutHtml(traces, data.marks, { inColumn: true }) };
}

// ----- the controls -----
const STRENGTHS = Array.from({ length: 21 }, (_, k) => Number((k * 0.05).toFixed(12)));

export default {
  render({ model, el }) {
    const { column, figure, message, remove } = explorerPage(el, "ampviz-browser-scaler-lab", "ampviz-scaler-figure");
    const data = shippedData((k) => model.get(k));
    const cache = new Map();
    const inputs = {
      init_log2: slider("ampviz-scaler-init", -10, 40, 1),
      growth_factor: slider("ampviz-scaler-growth", 1.001, Math.max(4, model.get("growth_factor")), 0.001),
      backoff_factor: slider("ampviz-scaler-backoff", 0.005, 0.995, 0.005),
      strength: slider("ampviz-scaler-strength", 0, 1, 0.05),
    };
    const shown = Object.fromEntries(Object.keys(inputs).map((k) => [k, document.createElement("span")]));
    const interval = document.createElement("input");
    Object.assign(interval, { type: "number", min: "1", max: "10000000", step: "1", className: "ampviz-scaler-interval" });
    interval.style.width = "120px";
    const scenario = document.createElement("select");
    scenario.className = "ampviz-scaler-scenario";
    const names = [...new Set(Object.keys(data.recipes).map((k) => k.split("|")[0]))];
    for (const n of names) scenario.append(new Option(n, n));
    const loss = document.createElement("select");
    loss.className = "ampviz-scaler-loss";
    loss.append(new Option("float32 (autocast)", "float32"), new Option("fp16 (a .half() model)", "float16"));
    const overlay = document.createElement("select");
    Object.assign(overlay, { multiple: true, size: 6, className: "ampviz-scaler-overlay" });
    overlay.style.width = "220px";
    for (const [n, p] of Object.entries(data.presets)) overlay.append(new Option(p.label, n));
    const hint = document.createElement("small");
    hint.textContent = "Ctrl- or Shift-click to compare several";
    hint.style.cssText = "display:block;margin:0 0 0 118px";
    const readout = document.createElement("div");
    readout.className = "ampviz-scaler-readout";
    readout.style.lineHeight = "1.35";
    column.append(row("log2 init_scale", inputs.init_log2, shown.init_log2),
      row("growth_factor", inputs.growth_factor, shown.growth_factor),
      row("backoff_factor", inputs.backoff_factor, shown.backoff_factor),
      row("growth_interval", interval), row("scenario", scenario),
      row("strength", inputs.strength, shown.strength), row("loss", loss), row("compare with", overlay),
      hint, message, readout);

    // the page's settings: the model's, until a control moves
    const settings = Object.fromEntries(SETTINGS.map((k) => [k, model.get(k)]));
    const showSettings = () => {
      for (const k of Object.keys(inputs)) { inputs[k].value = String(settings[k]); }
      shown.init_log2.textContent = String(settings.init_log2);
      shown.growth_factor.textContent = formatG(settings.growth_factor);
      shown.backoff_factor.textContent = formatG(settings.backoff_factor);
      shown.strength.textContent = formatG(settings.strength);
      interval.value = String(settings.growth_interval);
      scenario.value = settings.scenario;
      loss.value = settings.loss_dtype;
      for (const o of overlay.options) o.selected = settings.overlay.includes(o.value);
    };

    const { schedule, stop } = drawLoop(model, figure, message, () => {
      const drawn = { ...settings };
      return { ...compute(data, drawn, cache), settings: drawn };
    }, (result) => { readout.innerHTML = result.readout; });
    const redraw = () => { showSettings(); schedule(); };
    const moved = mover(model, settings, redraw);
    inputs.init_log2.addEventListener("input", () => moved("init_log2", Math.round(Number(inputs.init_log2.value))));
    inputs.growth_factor.addEventListener("input", () => moved("growth_factor", onGrid(Number(inputs.growth_factor.value), 1.001, 0.001)));
    inputs.backoff_factor.addEventListener("input", () => moved("backoff_factor", onGrid(Number(inputs.backoff_factor.value), 0.005, 0.005)));
    inputs.strength.addEventListener("input", () => moved("strength", STRENGTHS[Math.round(Number(inputs.strength.value) / 0.05)]));
    interval.addEventListener("change", () => {
      const v = Number(interval.value);
      if (Number.isInteger(v) && v >= 1 && v <= 1e7) moved("growth_interval", v);
      else { message.textContent = "growth_interval must be a whole number from 1 to 10,000,000"; interval.value = String(settings.growth_interval); }
    });
    scenario.addEventListener("change", () => moved("scenario", scenario.value));
    loss.addEventListener("change", () => moved("loss_dtype", loss.value));
    overlay.addEventListener("change", () => moved("overlay", [...overlay.selectedOptions].map((o) => o.value)));
    // a setting changed from Python
    const unfollow = followModel(model, SETTINGS, settings, redraw,
      { recipes: (r) => { data.recipes = r; schedule(); } });
    showSettings();
    schedule();
    return () => {
      stop();
      remove();
      unfollow();
    };
  },
};
