// Fp8ScalingLab's figure and readout in the browser: the same data, layout and text as
// ampviz.plots.plot_fp8_scaling and Fp8ScalingLab's readout, exactly.
//
// A port of ampviz/plots/fp8.py (the amax and the window the scale keeps, the scale, the shares
// saturated, underflowed and subnormal on a log10(percent) axis, the axes held still by other
// runs) and of Fp8ScalingLab._readout_html. A trace is what fp8.mjs's simulateFp8Scaling returns,
// with what Fp8ScalingTrace holds beside it: {recipe, settings (an object, in Python's order), fmt
// (a format's name), size, amax, scale, saturated, underflowed, subnormal}.
//
// Exact where Python is: log2 is correctly rounded (scaleplot's), and the lines travel as float32
// as Python sends them; the shares' log10 is Math.log10 rounded to float32 (of the 4,096 shares a
// step can have, tests/browser/test_browser_fp8_lab.py holds each equal to numpy's).

import { FORMATS } from "./formats.mjs";
import { LINEAR, WHITE, WHITE_AXIS, formatG, formatNumber, log2Ticks, paddedRange } from "./scaleplot.mjs";
import { escapeHtml, formatShare, log2, withCommas } from "./censusplot.mjs";

/** plot_fp8_scaling's colours by series (FP8_COLORS). */
export const FP8_COLORS = Object.freeze({ amax: "#000000", scale: "#009E73", ceiling: "#D55E00", floor: "#999999",
  saturated: "#E69F00", underflowed: "#0072B2", subnormal: "#999933", nonfinite: "#CC79A7" });

const PANELS = 520; // the three panels and the gaps between them, in px
const SHARE_DOMAIN = 0.28; // the share panel's share of them
const LONE_TICK_PX = 5; // a lone step's share is drawn this many px above and below it

/** log2 |v| per value (axes.py's _finite_log2), with 0, inf and NaN as NaN. A Float64Array. */
export function finiteLog2(values) {
  return Float64Array.from(values, (v) => {
    const a = Math.abs(v);
    return Number.isFinite(a) && a > 0 ? log2(a) : NaN;
  });
}

/** The first and last index of each run of equal values, NaN equal to NaN (fp8.py's _run_ends). */
export function runEnds(values) {
  const n = values.length;
  if (!n) return [];
  const keep = new Uint8Array(n);
  keep[0] = keep[n - 1] = 1;
  for (let i = 1; i < n; i++) {
    const a = values[i], b = values[i - 1];
    if (a !== b && !(a !== a && b !== b)) keep[i - 1] = keep[i] = 1;
  }
  const out = [];
  for (let i = 0; i < n; i++) if (keep[i]) out.push(i);
  return out;
}

/** log2 of the amax, max / scale, underflow boundary / scale and scale per step (_fp8_lines). */
function lines(trace) {
  const f = FORMATS[trace.fmt];
  return [finiteLog2(trace.amax), finiteLog2(Float64Array.from(trace.scale, (s) => f.max / s)),
    finiteLog2(Float64Array.from(trace.scale, (s) => f.underflowBoundary / s)), finiteLog2(trace.scale)];
}

/** The finite values of the value panel's lines and of the scale's (_fp8_extents). */
function extents([logAmax, ceiling, floor, logScale]) {
  const values = [];
  for (const v of [logAmax, ceiling, floor]) for (const x of v) if (Number.isFinite(x)) values.push(x);
  return [values, Array.from(logScale).filter(Number.isFinite)];
}

/** Python's str of a setting's value (False and True as Python writes them). */
function pyStr(v) {
  return v === true ? "True" : v === false ? "False" : String(v);
}

/** The points of a share line (plot_fp8_scaling's): a run of steps with none kept as its first
 *  step (a gap), a lone step as two points a tick above and below its share. */
function shareLine(counts, size, shareRange, tick) {
  const n = counts.length;
  const share = Float32Array.from(counts, (c) => (c > 0 ? Math.log10(100.0 * c / size) : NaN));
  const some = (i) => i >= 0 && i < n && counts[i] > 0;
  const x = [], y = [], custom = [];
  const lo = Math.fround(shareRange[0]), hi = Math.fround(shareRange[1]), t32 = Math.fround(tick);
  for (let i = 0; i < n; i++) {
    const gap = !(counts[i] > 0);
    if (gap && i > 0 && !(counts[i - 1] > 0)) continue;
    if (!gap && !some(i - 1) && !some(i + 1)) { // lone: float32 arithmetic, as numpy's on the float32 line
      x.push(i, i);
      y.push(Math.max(Math.fround(share[i] - t32), lo), Math.min(Math.fround(share[i] + t32), hi));
      custom.push(counts[i], counts[i]);
    } else {
      x.push(i); y.push(share[i]); custom.push(counts[i]);
    }
  }
  return { x, y: Float32Array.from(y), customdata: custom, steps: counts.reduce((k, c) => k + (c > 0 ? 1 : 0), 0) };
}

/** The figure of plot_fp8_scaling(trace, title=, legend_counts=, hold=) as {data, layout}.
 *  `template`: the plotly template object to put in the layout, as plotly.py fills it in (left out
 *  when not given). */
export function fp8Figure(trace, { title = null, legendCounts = true, hold = [], template = undefined } = {}) {
  const f = FORMATS[trace.fmt];
  const n = trace.amax.length, size = trace.size;
  const own = lines(trace);
  const held = [extents(own), ...hold.map((t) => extents(lines(t)))];
  const [logAmax, ceiling, floor, logScale] = own;
  const bad = [];
  for (let i = 0; i < n; i++) if (!Number.isFinite(trace.amax[i])) bad.push(i);
  let lo = Infinity, hi = -Infinity, any = false;
  for (const [values] of held) for (const v of values) { any = true; if (v < lo) lo = v; if (v > hi) hi = v; }
  if (!any) { lo = 0; hi = 1; }
  const topTicks = log2Ticks([lo - 1.0, hi + 2.0]);
  const topRange = paddedRange([lo - 1.0, hi + 2.0], topTicks.dtick);
  const runs = runEnds(trace.scale);
  const at = (v) => Float32Array.from(runs, (i) => v[i]);
  const data = [
    { type: "scatter", x: runs, y: at(ceiling), mode: "lines", name: "max / scale (above: saturates)",
      line: { color: FP8_COLORS.ceiling, width: 1.5, shape: "hv" }, hoverinfo: "skip", meta: { kind: "ceiling" } },
    { type: "scatter", x: runs, y: at(floor), mode: "lines", name: "underflow boundary / scale (below: becomes 0)",
      line: { color: FP8_COLORS.floor, width: 1.5, shape: "hv" }, hoverinfo: "skip", meta: { kind: "floor" } },
    { type: "scatter", x0: 0, dx: 1, y: Float32Array.from(logAmax), mode: "lines", name: "amax",
      line: { color: FP8_COLORS.amax, width: 1.5 }, customdata: Float32Array.from(trace.amax),
      hovertemplate: "step %{x:,} · amax %{customdata:.4~g}<extra></extra>", meta: { kind: "amax" } },
  ];
  if (bad.length) {
    data.push({ type: "scatter", x: bad, y: bad.map(() => topRange[1] - 0.5), mode: "markers",
      name: `amax inf or NaN: ${withCommas(bad.length)}`,
      marker: { symbol: "star", size: 10, color: FP8_COLORS.nonfinite },
      hovertext: bad.map((i) => `step ${withCommas(i)} · amax ${formatNumber(trace.amax[i])}`),
      hoverinfo: "text", cliponaxis: false, meta: { kind: "nonfinite" } });
  }
  data.push({ type: "scatter", x: runs, y: at(logScale), mode: "lines", name: "scale in force", yaxis: "y2",
    line: { color: FP8_COLORS.scale, width: 2, shape: "hv" }, customdata: at(trace.scale),
    hovertemplate: "step %{x:,} · scale %{customdata:.4~g}<extra></extra>", meta: { kind: "scale" } });
  const shareRange = [Math.floor(Math.log10(50.0 / Math.max(size, 1))) - 0.05, 2.05];
  const tick = LONE_TICK_PX * (shareRange[1] - shareRange[0]) / (SHARE_DOMAIN * PANELS);
  for (const [kind, counts, label] of [["saturated", trace.saturated, "saturated (held at ±max)"],
    ["underflowed", trace.underflowed, "underflowed (became 0)"], ["subnormal", trace.subnormal, "subnormal"]]) {
    const s = shareLine(counts, size, shareRange, tick);
    data.push({ type: "scatter", x: s.x, y: s.y, mode: "lines",
      name: legendCounts ? `${label}: ${withCommas(s.steps)} steps` : label, yaxis: "y3",
      line: { color: FP8_COLORS[kind], width: kind === "saturated" ? 2 : 1 }, customdata: s.customdata,
      hovertemplate: `step %{x:,} · ${kind} %{customdata:,} of ${withCommas(size)}<extra></extra>`, meta: { kind } });
  }
  const worst = worstStep(trace);
  const settings = Object.entries(trace.settings).filter(([k]) => k !== "convention")
    .map(([k, v]) => `${k} ${pyStr(v)}`).join(", ");
  const scales = held.flatMap(([, s]) => s);
  const scaleTicks = log2Ticks(scales);
  const scaleRange = paddedRange(scales, scaleTicks.dtick);
  const powers = [];
  for (let k = Math.ceil(shareRange[0]); k <= Math.floor(shareRange[1]); k++) powers.push(k);
  const layout = {
    ...WHITE(),
    title: { text: title || `FP8 ${trace.recipe} scaling, ${f.name} (${settings})`, x: 0.01 },
    height: 60 + PANELS + 110,
    margin: { l: 80, r: 20, t: 60, b: 110 },
    legend: { orientation: "h", x: 0.01, y: -56 / PANELS, yanchor: "top" },
    xaxis: { ...WHITE_AXIS(), ...LINEAR(), domain: [0, 1], anchor: "y3", title: { text: "step" },
      range: [0, Math.max(n - 1, 1)] },
    yaxis: { ...WHITE_AXIS(), ...LINEAR(), domain: [0.55, 1], range: topRange, title: { text: "log2 |x|" },
      anchor: "x", ...topTicks },
    yaxis2: { ...WHITE_AXIS(), ...LINEAR(), domain: [0.33, 0.5], anchor: "x", title: { text: "scale" },
      ...scaleTicks, ...(scaleRange ? { range: scaleRange } : {}) },
    yaxis3: { ...WHITE_AXIS(), ...LINEAR(), domain: [0, SHARE_DOMAIN], anchor: "x", title: { text: "% of values" },
      range: shareRange, tickmode: "array", tickvals: powers, ticktext: powers.map((k) => formatG(10.0 ** k)) },
    meta: { recipe: trace.recipe, settings: { ...trace.settings }, fmt: f.name, steps: n, size,
      saturated_steps: steps(trace.saturated), worst_step: worst,
      worst: Object.fromEntries(["saturated", "underflowed", "subnormal"].map((k) => [k, n ? trace[k][worst] : 0])) },
  };
  if (template !== undefined) layout.template = template;
  return { data, layout };
}

/** How many steps have a count above 0. */
function steps(counts) {
  let k = 0;
  for (const c of counts) if (c > 0) k++;
  return k;
}

/** The first step that loses the most values, saturated + underflowed (Fp8ScalingTrace.worst_step). */
export function worstStep(trace) {
  let best = 0, most = -1;
  for (let i = 0; i < trace.amax.length; i++) {
    const lost = trace.saturated[i] + trace.underflowed[i];
    if (lost > most) { most = lost; best = i; }
  }
  return best;
}

/** Fp8ScalingLab's readout (_readout_html), as its readout widget shows it in the controls'
 *  column. The mean share underflowed: each share is a count over 4,096 values (a power of two),
 *  so every partial sum is exact and the sum is numpy's in any order. */
export function fp8Readout(trace) {
  const n = trace.amax.length, size = trace.size;
  let lossy = 0, sum = 0;
  for (const c of trace.underflowed) { const s = c / size; if (s >= 0.01) lossy++; sum += s; }
  const w = worstStep(trace);
  const line = `steps that saturate: ${withCommas(steps(trace.saturated))} of ${withCommas(n)} · `
    + `steps that lose ≥ 1% to underflow: ${withCommas(lossy)} (any: ${withCommas(steps(trace.underflowed))}) · `
    + `steps with subnormals: ${withCommas(steps(trace.subnormal))} · mean underflowed ${formatShare(sum / n)}`;
  const worst = `worst step ${withCommas(w)}: ${withCommas(trace.saturated[w])} saturated, `
    + `${withCommas(trace.underflowed[w])} underflowed (${formatShare(trace.underflowed[w] / size)}) of `
    + `${withCommas(size)} values, amax ${formatG(trace.amax[w], 3)}, scale ${formatG(trace.scale[w], 3)}`;
  return `<div class="ampviz-column-text" style="line-height:1.35"><div>${escapeHtml(line)}</div>`
    + `<div>${escapeHtml(worst)}</div></div>`;
}
