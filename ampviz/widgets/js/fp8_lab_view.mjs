// BrowserFp8ScalingLab's front end: Fp8ScalingLab's controls, figure and readout, computed in the
// page. The stream is rebuilt from the seed's shipped pieces (ampviz.widgets.browser_fp8_lab's
// shipped_stream), the recipe runs as ampviz.formats.fp8.simulate_fp8_scaling does (fp8.mjs), and
// the figure and readout are Fp8ScalingLab's (fp8plot.mjs). The settings are the model's synced
// state: a move sets them (Python reads them), and a setting changed from Python moves the
// control. With no kernel (a static page) the model is the page's own, and everything still
// works for the seeds shipped.

import { simulateFp8Scaling } from "./fp8.mjs";
import { fp8Figure, fp8Readout } from "./fp8plot.mjs";
import { withCommas } from "./censusplot.mjs";
import { parseNumber, pyStrip, shownText } from "./valueplot.mjs";
import { bytesOf } from "./figure.mjs";
import { drawLoop, explorerPage, followModel, mover, row, slider } from "./view_parts.mjs";

export const SETTINGS = ["recipe", "history_len", "algo", "margin", "fmt", "spike_log2", "nonfinite", "seed"];
const DELAYED_ONLY = ["history_len", "algo", "margin"];

function f32(b64) {
  const bytes = bytesOf(b64);
  return new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
}

/** The lab's shipped data from the model's state: the streams by seed, the controls' options,
 *  plotly's template. */
export function shippedData(get) {
  return { streams: get("streams"), options: get("options"), template: get("template"), decoded: new Map() };
}

/** lab_stream(seed, spikeLog2, nonfinite) as {sortedAbs, magnitude, nonfinite}, rebuilt from the
 *  seed's shipped pieces (its spike steps take their magnitude at spikeLog2 from the table). */
export function streamOf(data, seed, spikeLog2, nonfinite) {
  const key = String(seed);
  const shipped = data.streams[key];
  if (!shipped) {
    const have = Object.keys(data.streams).map(Number).sort((a, b) => a - b).map(withCommas).join(", ");
    throw new RangeError(`the stream of seed ${withCommas(seed)} comes from the kernel (this page has seeds ${have})`);
  }
  let d = data.decoded.get(key);
  if (!d || d.shipped !== shipped) {
    d = { shipped, sortedAbs: f32(shipped.sorted_abs), magnitude: f32(shipped.magnitude), table: f32(shipped.spike_magnitudes) };
    data.decoded.set(key, d);
  }
  const [lo, hi] = data.options.spike_range;
  if (!(Number.isInteger(spikeLog2) && spikeLog2 >= lo && spikeLog2 <= hi)) {
    throw new RangeError(`spike_log2 must be between ${lo} and ${hi}, got ${spikeLog2}`);
  }
  const magnitude = Float32Array.from(d.magnitude);
  const spikes = shipped.spikes, row0 = (spikeLog2 - lo) * spikes.length;
  spikes.forEach((t, j) => { magnitude[t] = d.table[row0 + j]; });
  const bad = new Uint8Array(magnitude.length);
  if (nonfinite === "inf") for (const t of shipped.inf_steps) bad[t] = 1;
  else if (nonfinite === "nan") for (const t of shipped.nan_steps) bad[t] = 2;
  else if (nonfinite !== "none") throw new RangeError(`nonfinite must be one of 'none', 'inf', 'nan', got ${nonfinite}`);
  return { sortedAbs: d.sortedAbs, magnitude, nonfinite: bad };
}

/** The settings that act (Fp8ScalingLab.settings()): history, algo and margin left out for
 *  current scaling, which does not use them. */
export function acting(settings) {
  const s = { ...settings };
  if (s.recipe !== "delayed") for (const k of DELAYED_ONLY) delete s[k];
  return s;
}

/** A run of the recipe over a stream, as an Fp8ScalingTrace holds it (fp8plot.mjs's trace). */
export function runTrace(stream, s, size) {
  const delayed = s.recipe === "delayed";
  const r = simulateFp8Scaling(stream, s.recipe, delayed ? { margin: s.margin, historyLen: s.history_len, algo: s.algo,
    fmt: s.fmt } : { fmt: s.fmt });
  const settings = delayed ? { margin: s.margin, history_len: s.history_len, algo: s.algo, convention: "python" }
    : { round_to_power_of_2: false, convention: "torchao" };
  return { recipe: s.recipe, settings, fmt: s.fmt, size, ...r };
}

/** Everything the page shows for `settings` (SETTINGS by name): the stream, the trace, the runs at
 *  the spike slider's ends (the figure's axes hold them), the figure and the readout. `cache`
 *  keeps the recent ends, per the settings other than the spike. */
export function compute(data, settings, cache = new Map()) {
  const s = acting(settings);
  const size = data.options.size;
  const stream = streamOf(data, s.seed, s.spike_log2, s.nonfinite);
  const trace = runTrace(stream, s, size);
  const endsKey = JSON.stringify({ ...s, spike_log2: null });
  let ends = cache.get(endsKey);
  if (!ends) {
    ends = data.options.spike_range.map((k) => runTrace(streamOf(data, s.seed, k, s.nonfinite), s, size));
    cache.set(endsKey, ends);
    if (cache.size > 8) cache.delete(cache.keys().next().value);
  }
  const figure = fp8Figure(trace, { legendCounts: false, hold: ends, template: data.template });
  return { stream, trace, ends, figure, readout: fp8Readout(trace) };
}

/** The message for a history length typed into its box that is not one of the lengths
 *  (Fp8ScalingLab._on_history_typed's), or null when `typed` names one: {value} then. */
export function typedHistory(typed, lengths, inUse) {
  let value = null;
  try { value = parseNumber(typed); } catch (e) { value = null; }
  if (value === null || !lengths.includes(value)) {
    return { error: `the history length must be a power of two from 1 to 1,024, got ${shownText(pyStrip(typed), 20)}: `
      + `the figure still uses ${withCommas(inUse)}` };
  }
  return { value };
}

function select(cls, options) {
  const el = document.createElement("select");
  el.className = cls;
  for (const [label, value] of options) el.append(new Option(label, value));
  return el;
}

export default {
  render({ model, el }) {
    const { column, figure, message, remove } = explorerPage(el, "ampviz-browser-fp8-lab", "ampviz-fp8-figure");
    const data = shippedData((k) => model.get(k));
    const o = data.options, lengths = o.history_lengths;
    const cache = new Map();
    const recipe = select("ampviz-fp8-recipe", o.recipes);
    const history = slider("ampviz-fp8-history", 0, lengths.length - 1, 1);
    history.style.width = "120px";
    const historyBox = document.createElement("input");
    Object.assign(historyBox, { type: "text", className: "ampviz-fp8-history-input",
      title: "amax_history_len: a power of two from 1 to 1,024 (then Enter)" });
    historyBox.style.width = "56px";
    const algo = select("ampviz-fp8-algo", o.algos.map((a) => [a, a]));
    const margin = slider("ampviz-fp8-margin", o.margin_range[0], o.margin_range[1], 1);
    const fmt = select("ampviz-fp8-fmt", o.formats);
    const spike = slider("ampviz-fp8-spike", o.spike_range[0], o.spike_range[1], 1);
    const nonfinite = select("ampviz-fp8-nonfinite", o.nonfinite);
    const seed = document.createElement("input");
    Object.assign(seed, { type: "number", min: "0", max: String(o.max_seed), step: "1", className: "ampviz-fp8-seed" });
    seed.style.width = "120px";
    const shown = { margin: document.createElement("span"), spike_log2: document.createElement("span") };
    const readout = document.createElement("div");
    readout.className = "ampviz-fp8-readout";
    column.append(row("recipe", recipe), row("history length", history, historyBox), row("amax algo", algo),
      row("margin", margin, shown.margin), row("format", fmt), row("log2 spike", spike, shown.spike_log2),
      row("non-finite", nonfinite), row("stream seed", seed), message, readout);

    // the page's settings: the model's, until a control moves
    const settings = Object.fromEntries(SETTINGS.map((k) => [k, model.get(k)]));
    const showSettings = () => {
      recipe.value = settings.recipe;
      history.value = String(lengths.indexOf(settings.history_len));
      historyBox.value = String(settings.history_len);
      algo.value = settings.algo;
      margin.value = String(settings.margin);
      shown.margin.textContent = String(settings.margin);
      fmt.value = settings.fmt;
      spike.value = String(settings.spike_log2);
      shown.spike_log2.textContent = String(settings.spike_log2);
      nonfinite.value = settings.nonfinite;
      seed.value = String(settings.seed);
      const current = settings.recipe !== "delayed"; // history, algo and margin act on delayed scaling only
      history.disabled = historyBox.disabled = algo.disabled = margin.disabled = current;
    };
    const { schedule, stop } = drawLoop(model, figure, message, () => {
      const drawn = { ...settings };
      return { ...compute(data, drawn, cache), settings: drawn };
    }, (result) => { readout.innerHTML = result.readout; }, (layout) => JSON.stringify({ ...layout, meta: undefined }));
    const redraw = () => { showSettings(); schedule(); };
    const moved = mover(model, settings, redraw);
    recipe.addEventListener("change", () => moved("recipe", recipe.value));
    history.addEventListener("input", () => moved("history_len", lengths[Math.round(Number(history.value))]));
    historyBox.addEventListener("change", () => {
      const typed = typedHistory(historyBox.value, lengths, settings.history_len);
      if (typed.error) { message.textContent = typed.error; showSettings(); return; }
      if (typed.value === settings.history_len) showSettings(); // "128.0" or " 128": shown as the length in use
      else moved("history_len", typed.value);
    });
    algo.addEventListener("change", () => moved("algo", algo.value));
    margin.addEventListener("input", () => moved("margin", Math.round(Number(margin.value))));
    fmt.addEventListener("change", () => moved("fmt", fmt.value));
    spike.addEventListener("input", () => moved("spike_log2", Math.round(Number(spike.value))));
    nonfinite.addEventListener("change", () => moved("nonfinite", nonfinite.value));
    seed.addEventListener("change", () => {
      const text = seed.value, v = Number(text);
      if (text.trim() === "" || !Number.isInteger(v)) {
        message.textContent = `seed must be a whole number, got ${Number.isFinite(v) && text.trim() !== "" ? text.trim() : shownText(text)}`;
      } else if (v < 0 || v > o.max_seed) {
        message.textContent = `seed must be between 0 and ${withCommas(o.max_seed)}, got ${withCommas(v)}`;
      } else {
        moved("seed", v);
        return;
      }
      showSettings();
    });
    // a setting changed from Python; a seed's stream shipped by the kernel (after the page asked
    // for that seed): drawn when it comes
    const unfollow = followModel(model, SETTINGS, settings, redraw,
      { streams: (s) => { data.streams = s; schedule(); } });
    showSettings();
    schedule();
    return () => {
      stop();
      remove();
      unfollow();
    };
  },
};
