// BrowserRangeExplorer's front end: RangeExplorer's controls, readout and figure, computed in the page.
// The census at each power-of-two scale equals ampviz.formats.census.census (as census.mjs computes
// it, value by value), and the figure, readout and scale label are RangeExplorer's (censusplot.mjs).
// The settings (fmt, log2_scale) are the model's synced state: a move sets them (Python reads them),
// and a setting changed from Python moves the controls. With no kernel (a static page) the model is
// the page's own, and everything still works.
//
// Why the census is not census.mjs's loop: that pass over the values costs 16 ms a move for the
// course's 84,608 gradients in Chromium (a million values: 0.3 s), and a drag should repaint at
// every position. Each value's category only grows with its magnitude (multiplying by a positive
// scale, rounding to float32 and casting are all monotone), so with the magnitudes sorted once, a
// census is three binary searches that cast about 50 values, each exactly as census.mjs casts it;
// and at a power-of-two scale 2^k the exact product's binade is the value's binade plus k, so the
// histogram is the values' binade counts, shifted. A move then costs microseconds, whatever the
// number of values.

import { FORMATS, cast, float32FromBits, pow2 } from "./formats.mjs";
import { CATEGORIES, censusXRange, rangeExplorerFigure, readoutHtml, scaleLabel, withCommas } from "./censusplot.mjs";
import { bytesOf } from "./figure.mjs";
import { followModel, keepKeys, mover, readoutFirst } from "./view_parts.mjs";

export const SETTINGS = ["fmt", "log2_scale"];

/** log2 of the scales a census can take: every power of two float32 holds (RangeExplorer.LOG2_LIMITS). */
export const LOG2_LIMITS = Object.freeze([-149, 127]);

const INF_BITS = 0x7f800000;
const LOWEST_BINADE = -149; // float32's smallest subnormal is 2^-149; its largest finite value < 2^128
const BINADES = 128 - LOWEST_BINADE;
// a cast's category, ranked as a census counts it: a product that became 0 is underflow
const RANK = { zero: 1, underflow: 1, subnormal: 2, normal: 3, overflow: 4, nan: 5 };

/** The first index in [lo, hi) of the sorted array `a` at which `a[i] >= x` (hi when none). */
function lowerBound(a, x, lo = 0, hi = a.length) {
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (a[mid] < x) lo = mid + 1; else hi = mid;
  }
  return lo;
}

/** The binade e of a finite nonzero float32 magnitude pattern: 2^e <= |v| < 2^(e + 1). */
function binade(bits) {
  const biased = bits >>> 23;
  return biased ? biased - 127 : 31 - Math.clz32(bits) + LOWEST_BINADE;
}

/** Float32 values (a Float32Array, or numbers) prepared for a census at any power-of-two scale:
 *  their magnitudes' bit patterns sorted (zeros first, then finite values, infinities, NaNs), and
 *  how many finite nonzero values lie in each binade. */
export function prepareValues(values) {
  const v = values instanceof Float32Array ? values : Float32Array.from(values);
  const n = v.length;
  const bits = new Uint32Array(v.buffer, v.byteOffset, n);
  const magnitudes = new Uint32Array(n);
  for (let i = 0; i < n; i++) magnitudes[i] = bits[i] & 0x7fffffff;
  magnitudes.sort();
  const zeros = lowerBound(magnitudes, 1), infinities = lowerBound(magnitudes, INF_BITS, zeros);
  const nans = lowerBound(magnitudes, INF_BITS + 1, infinities);
  const binades = new Float64Array(BINADES);
  for (let i = zeros; i < infinities; i++) binades[binade(magnitudes[i]) - LOWEST_BINADE]++;
  let lowest = null, highest = null;
  binades.forEach((c, j) => {
    if (c) { if (lowest === null) lowest = j + LOWEST_BINADE; highest = j + LOWEST_BINADE; }
  });
  return { total: n, magnitudes, zeros, nans, binades, extent: lowest === null ? null : [lowest, highest] };
}

function checkFormat(fmt) {
  if (!Object.prototype.hasOwnProperty.call(FORMATS, fmt)) {
    throw new RangeError(`fmt must be one of ${Object.keys(FORMATS).join(", ")}, not ${String(fmt)}`);
  }
}

function checkLog2Scale(k, lo, hi) {
  if (!Number.isInteger(k)) throw new TypeError(`log2_scale must be a whole number, got ${String(k)}`);
  if (k < lo || k > hi) {
    throw new RangeError(`log2_scale must be between ${withCommas(lo)} and ${withCommas(hi)}, got ${withCommas(k)}`);
  }
}

/** The census of the prepared values in fmt at the scale 2^k (k whole, -149 to 127): counts per
 *  category and the log2 histogram, as ampviz.formats.census.census gives them, with the format's
 *  name: {fmt, scale, total, counts, log2Bins, log2Counts}. */
export function censusAt(prepared, fmt, k) {
  checkFormat(fmt);
  checkLog2Scale(k, ...LOG2_LIMITS);
  const s = pow2(k); // a float32 power of two: exact
  const m = prepared.magnitudes;
  // census.mjs's category of one value: its float32 product with s, cast into fmt
  const rank = (i) => RANK[cast(fmt, Math.fround(float32FromBits(m[i]) * s)).category];
  const first = (level, lo) => {
    let hi = prepared.nans; // infinities always overflow: the search ends among them at the latest
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (rank(mid) < level) lo = mid + 1; else hi = mid;
    }
    return lo;
  };
  const sub = first(2, prepared.zeros), normal = first(3, sub), over = first(4, normal);
  const counts = {
    zero: prepared.zeros, underflow: sub - prepared.zeros, subnormal: normal - sub, normal: over - normal,
    overflow: prepared.nans - over, nan: prepared.total - prepared.nans,
  };
  const log2Bins = [], log2Counts = [];
  prepared.binades.forEach((c, j) => {
    if (c) { log2Bins.push(j + LOWEST_BINADE + k); log2Counts.push(c); }
  });
  return { fmt, scale: s, total: prepared.total, counts: Object.fromEntries(CATEGORIES.map((c) => [c, counts[c]])),
    log2Bins, log2Counts };
}

/** The figure's x range (RangeExplorer.x_range): the format's window and every bin the slider's
 *  scales from 2^lo to 2^hi can reach. */
export function explorerXRange(prepared, fmt, lo, hi) {
  if (prepared.extent === null) return censusXRange(fmt);
  return censusXRange(fmt, prepared.extent[0] + lo, prepared.extent[1] + hi);
}

/** The explorer's shipped data from the model's state: the values (float32, prepared), the slider's
 *  ends, the formats offered, plotly's template and config. */
export function shippedData(get) {
  const bytes = bytesOf(get("values"));
  return {
    prepared: prepareValues(new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4)),
    lo: get("log2_scale_min"), hi: get("log2_scale_max"), formats: get("formats"), template: get("template"),
  };
}

/** Everything the page shows for settings {fmt, log2_scale}: the census, the x range, the label
 *  beside the slider, the readout and the figure. */
export function compute(data, settings) {
  if (!data.formats.includes(settings.fmt)) {
    throw new RangeError(`RangeExplorer shows ${data.formats.join(", ")}; got '${String(settings.fmt)}'`);
  }
  checkLog2Scale(settings.log2_scale, data.lo, data.hi);
  const result = censusAt(data.prepared, settings.fmt, settings.log2_scale);
  const xRange = explorerXRange(data.prepared, settings.fmt, data.lo, data.hi);
  return { result, xRange, label: scaleLabel(result.scale), readout: readoutHtml(result),
    figure: rangeExplorerFigure(result, xRange, data.template) };
}

// ----- the controls -----
function row(label, ...items) {
  const div = document.createElement("div");
  div.className = "ampviz-browser-row";
  div.style.cssText = "display:flex;flex-wrap:wrap;align-items:center;gap:8px;margin:4px 0";
  const name = document.createElement("label");
  name.textContent = label;
  name.style.cssText = "width:80px;flex:0 0 80px;text-align:right";
  div.append(name, ...items);
  return div;
}

export default {
  render({ model, el }) {
    el.classList.add("ampviz-browser-range-explorer");
    const dropKeys = keepKeys(el);
    const data = shippedData((k) => model.get(k));

    const slider = document.createElement("input");
    Object.assign(slider, { type: "range", min: String(data.lo), max: String(data.hi), step: "1" });
    slider.className = "ampviz-scale-slider";
    slider.style.width = "320px";
    const shown = document.createElement("span");
    shown.className = "ampviz-scale-value";
    shown.style.cssText = "width:36px;font-variant-numeric:tabular-nums";
    const label = document.createElement("span");
    label.className = "ampviz-scale-label";
    const dropdown = document.createElement("select");
    dropdown.className = "ampviz-format-dropdown";
    for (const name of data.formats) dropdown.append(new Option(name, name));
    const message = document.createElement("div");
    message.className = "ampviz-message";
    message.style.color = "#b00020";
    const readout = document.createElement("div");
    readout.className = "ampviz-census-readout";
    const figure = document.createElement("div");
    figure.className = "ampviz-census-figure";
    el.append(row("log2 scale", slider, shown, label), row("format", dropdown), message, readout, figure);

    // the page's settings: the model's, until a control moves
    const settings = Object.fromEntries(SETTINGS.map((k) => [k, model.get(k)]));
    const showSettings = () => {
      slider.value = String(settings.log2_scale);
      shown.textContent = String(settings.log2_scale);
      dropdown.value = settings.fmt;
    };
    // the readout and the label follow every move at once (the census, readout and figure take
    // well under a millisecond; plotly's draw, which follows when it is free, some 10-30)
    const { refresh, schedule, stop } = readoutFirst(model, figure, message,
      () => ({ settings: { ...settings }, result: compute(data, settings) }),
      (result) => { readout.innerHTML = result.readout; label.innerHTML = result.label; });
    const redraw = () => { showSettings(); refresh(); schedule(); };
    const moved = mover(model, settings, redraw);
    slider.addEventListener("input", () => moved("log2_scale", Math.round(Number(slider.value))));
    dropdown.addEventListener("change", () => moved("fmt", dropdown.value));
    // a setting changed from Python
    const unfollow = followModel(model, SETTINGS, settings, redraw);
    showSettings();
    refresh();
    schedule();
    return () => {
      stop();
      dropKeys();
      unfollow();
    };
  },
};
