// BlockExplorer's figure and readout in the browser: the same data, layout and text as
// ampviz.plots.plot_blocks and BlockExplorer's title and readout (ampviz/widgets/block_explorer.py).
//
// A port of ampviz/plots/blocks.py (_block_element_format, _block_parts, _block_extents,
// block_scale_words, scale_hover, plot_blocks), of the NVFP4 recipe's random Hadamard transform
// (ampviz.formats.blocks.random_hadamard_transform: each output the exact sum rounded once to
// float32), of numpy's mean (its pairwise summation, so that a mean is numpy's to the last bit) and
// of BlockExplorer's title and readout. A quantization `result` is what blocks.mjs returns:
// mxQuantize's {scales, codes, values}, or nvfp4Quantize's, which also holds `tensorScale`.
//
// Exact where Python is; log2 is rounded correctly here (scaleplot.mjs's), where numpy's log2 is
// now and then one ulp off for a value that is not a power of two.

import { FORMATS, decode, pow2 } from "./formats.mjs";
import { LINEAR, WHITE, WHITE_AXIS, formatNumber, log2Scale, log2Ticks } from "./scaleplot.mjs";
import { escapeHtml, formatPow2, formatShare, pow2Short, withCommas } from "./censusplot.mjs";

/** plot_blocks' colours (blocks.py's BLOCK_COLORS). */
export const BLOCK_COLORS = Object.freeze({ original: "#000000", dequantized: "#009E73", saturated: "#D55E00",
  flushed: "#0072B2", range: "#999999", error: "#56B4E9" });

/** The MX element formats, in the order _block_element_format tries them (MX_ELEMENT_FORMATS). */
const MX_ELEMENTS = ["fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1"];

// ----------------------------------------------------------------- exact sums
const F64 = new Float64Array(1);
const U32 = new Uint32Array(F64.buffer); // little-endian: U32[1] holds the sign and exponent
const BASE = -1100; // every float64 is a whole multiple of 2^-1074: sums are kept in units of 2^BASE

function bigOf(t) {
  F64[0] = t;
  const biased = (U32[1] >>> 20) & 0x7ff;
  let m = (BigInt(U32[1] & 0xfffff) << 32n) | BigInt(U32[0]);
  let e = -1074;
  if (biased > 0) { m |= 1n << 52n; e = biased - 1075; }
  m <<= BigInt(e - BASE);
  return U32[1] >>> 31 ? -m : m;
}

/** An integer times 2^BASE rounded to float32, ties to even (beyond float32's range: ±inf). */
function float32OfBig(s) {
  if (s === 0n) return 0;
  const negative = s < 0n, a = negative ? -s : s;
  const length = a.toString(2).length;
  const top = length - 1 + BASE; // a's leading bit is 2^top
  const shift = top >= -126 ? length - 24 : -149 - BASE; // keep 24 bits, or whole multiples of 2^-149
  // shift > 0 always: a normal sum's leading bit is far above 2^(BASE + 24), and a subnormal one
  // keeps multiples of 2^-149; q has at most 25 bits and 2^(BASE + shift) is at least 2^-149, so
  // the product is exact, and fround takes a value past float32's max to infinity
  const s2 = BigInt(shift);
  let q = a >> s2;
  const rest = a - (q << s2), half = 1n << (s2 - 1n);
  if (rest > half || (rest === half && (q & 1n) === 1n)) q += 1n;
  const v = Math.fround(Number(q) * pow2(BASE + shift));
  return negative ? -v : v;
}

/** The exact sum of the numbers `terms` (float64) rounded once to float32 (ties to even), as
 *  hadamard.py's _exact_matmul_f32: added in order in float64 when every step is exact (checked:
 *  TwoSum's error is 0), else summed exactly as integers. Infinities and NaNs: the IEEE sum. */
export function exactSumFloat32(terms) {
  let s = terms[0], exact = true, finite = Number.isFinite(s);
  for (let i = 1; i < terms.length; i++) {
    const t = terms[i], sum = s + t, bb = sum - s;
    if ((s - (sum - bb)) + (t - bb) !== 0) exact = false;
    if (!Number.isFinite(t)) finite = false;
    s = sum;
  }
  if (exact || !finite) return Math.fround(s);
  let big = 0n;
  for (const t of terms) big += bigOf(t);
  return float32OfBig(big);
}

/** The random Hadamard transform of the float32 row x (length a multiple of 16), in chunks of
 *  16: each chunk c becomes c @ M (`matrix`: M = hadamard_matrix(signs), 256 numbers row by row),
 *  or c @ M.T with `inverse`; each output the exact sum rounded once to float32. A Float32Array. */
export function hadamardTransform(x, matrix, inverse = false) {
  const n = 16, out = new Float32Array(x.length), terms = new Float64Array(n);
  if (matrix.length !== n * n) throw new RangeError(`the transform's matrix must hold ${n * n} numbers, not ${matrix.length}`);
  if (x.length % n) throw new RangeError(`the ${x.length} values must be a multiple of ${n}`);
  for (let c = 0; c < x.length; c += n) {
    for (let j = 0; j < n; j++) {
      for (let i = 0; i < n; i++) terms[i] = x[c + i] * (inverse ? matrix[j * n + i] : matrix[i * n + j]);
      out[c + j] = exactSumFloat32(terms);
    }
  }
  return out;
}

// ----------------------------------------------------------------- numpy's mean
/** numpy's pairwise sum of a[lo, lo + n) (float64): blocks of at most 128 summed with 8
 *  accumulators, larger spans halved at a multiple of 8. */
function pairwiseSum(a, lo, n) {
  if (n < 8) {
    let res = 0;
    for (let i = 0; i < n; i++) res += a[lo + i];
    return res;
  }
  if (n <= 128) {
    const r = [];
    for (let j = 0; j < 8; j++) r.push(a[lo + j]);
    let i = 8;
    for (; i < n - (n % 8); i += 8) for (let j = 0; j < 8; j++) r[j] += a[lo + i + j];
    let res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; i++) res += a[lo + i];
    return res;
  }
  let n2 = Math.floor(n / 2);
  n2 -= n2 % 8;
  return pairwiseSum(a, lo, n2) + pairwiseSum(a, lo + n2, n - n2);
}

/** The mean of float64 numbers as numpy's ``mean`` gives it (NaN for none). */
export function numpyMean(a) {
  return pairwiseSum(a, 0, a.length) / a.length;
}

/** |q - x| / |x| per element, over the nonzero x (BlockExplorer's _relative_error): a Float64Array. */
export function relativeError(x, q) {
  const out = [];
  for (let i = 0; i < x.length; i++) if (x[i] !== 0) out.push(Math.abs(q[i] - x[i]) / Math.abs(x[i]));
  return Float64Array.from(out);
}

// ----------------------------------------------------------------- blocks.py
/** log2 |v| per value (axes.py's _finite_log2): 0, inf and NaN as NaN. A Float64Array. */
function finiteLog2(values) {
  const out = log2Scale(values);
  for (let i = 0; i < out.length; i++) {
    const a = Math.abs(values[i]);
    if (!(a > 0 && a < Infinity)) out[i] = NaN;
  }
  return out;
}

/** The element format of an MX quantization (_block_element_format): the first MX format whose
 *  decoded codes times the block scales give the values exactly (where both are finite). */
function elementFormat(codes, values, step, bs) {
  let top = 0;
  for (const c of codes) if (c > top) top = c;
  for (const name of MX_ELEMENTS) {
    const f = FORMATS[name];
    if (codes.length && top >= 2 ** f.bits) continue;
    let same = true;
    for (let i = 0; i < codes.length && same; i++) {
      const s = step[Math.floor(i / bs)];
      if (!Number.isFinite(s) || !Number.isFinite(values[i])) continue;
      same = Math.fround(Math.fround(decode(name, codes[i])) * s) === values[i];
    }
    if (same) return f;
  }
  throw new RangeError("result's codes and values match no MX element format: pass the result mxQuantize returned for x");
}

/** plot_blocks' per-element arrays (_block_parts) of the row x and its quantization result. */
export function blockParts(x, result) {
  const xs = x instanceof Float32Array ? x : Float32Array.from(x);
  const values = result.values instanceof Float32Array ? result.values : Float32Array.from(result.values);
  const codes = result.codes, scales = result.scales;
  const n = xs.length, blocks = scales.length;
  if (values.length !== n || !blocks || n % blocks) {
    throw new RangeError(`x must be one row and result its quantization: x has ${n} values, result's values ` +
      `${values.length} and scales ${blocks}`);
  }
  const bs = n / blocks, nvfp4 = "tensorScale" in result;
  const blockScale = new Float64Array(blocks), step = new Float32Array(blocks);
  let ts = null, fmt;
  if (nvfp4) {
    fmt = FORMATS.fp4_e2m1;
    ts = result.tensorScale === null || result.tensorScale === undefined ? null : Number(result.tensorScale);
    for (let b = 0; b < blocks; b++) {
      blockScale[b] = decode("fp8_e4m3", scales[b]);
      step[b] = ts === null ? blockScale[b] : Math.fround(ts) * Math.fround(blockScale[b]);
    }
  } else {
    for (let b = 0; b < blocks; b++) {
      blockScale[b] = scales[b] === 255 ? NaN : pow2(scales[b] - 127);
      step[b] = blockScale[b];
    }
    fmt = elementFormat(codes, values, step, bs);
  }
  const top = new Float64Array(blocks), least = new Float64Array(blocks);
  for (let b = 0; b < blocks; b++) { top[b] = fmt.max * step[b]; least[b] = fmt.smallestSubnormal * step[b]; }
  const saturated = new Uint8Array(n), flushed = new Uint8Array(n), err = new Float64Array(n);
  for (let i = 0; i < n; i++) {
    const t = top[Math.floor(i / bs)], a = Math.abs(xs[i]), v = values[i];
    saturated[i] = Number.isFinite(t) && a > t ? 1 : 0;
    flushed[i] = xs[i] !== 0 && Number.isFinite(xs[i]) && v === 0 ? 1 : 0;
    err[i] = xs[i] !== 0 ? Math.abs(v - xs[i]) / a : Math.abs(v);
  }
  return { xs, values, scales, n, blocks, bs, nvfp4, fmt, blockScale, ts, step, top, least, saturated, flushed, err };
}

/** Block b's scale in words (block_scale_words): "E4M3 scale 448 × tensor scale 0.000866 = 0.388"
 *  for NVFP4, "scale 2^8 (E8M0)" for MX. */
export function blockScaleWords(parts, label, b) {
  if (!parts.nvfp4) return `scale ${label} (E8M0)`;
  const step = parts.step[b];
  const total = Number.isFinite(step) ? formatNumber(step) : "NaN";
  if (parts.ts === null) return `E4M3 scale ${label} (no tensor scale)`;
  return `E4M3 scale ${label} × tensor scale ${formatNumber(parts.ts)} = ${total}`;
}

/** What hovering each block's scale label shows (scale_hover). */
export function scaleHover(parts, labels) {
  return labels.map((label, b) => `block ${b}: ${blockScaleWords(parts, label, b)}`);
}

/** The finite log2 magnitudes plot_blocks draws on its value axis for these parts (_block_extents). */
function blockExtents(parts) {
  const out = [];
  for (const k of ["xs", "values", "top", "least"]) for (const v of finiteLog2(parts[k])) if (Number.isFinite(v)) out.push(v);
  return out;
}

/** Points of one path drawing a level from i - half to i + half at height y[k] for each element
 *  i = at[k], a gap after each (plot_blocks' levels). */
function levels(at, y, half) {
  const lx = new Float64Array(3 * at.length), ly = new Float64Array(3 * at.length);
  at.forEach((i, k) => {
    lx[3 * k] = i - half; lx[3 * k + 1] = i + half; lx[3 * k + 2] = NaN;
    ly[3 * k] = ly[3 * k + 1] = y[k]; ly[3 * k + 2] = NaN;
  });
  return [lx, ly];
}

/** plot_blocks(x, result, {title, legend_counts, hold}): the row and its block quantization,
 *  element by element (see ampviz/plots/blocks.py). `hold`: [x, result] pairs whose extents the
 *  value axis holds too. `template`: plotly's template to put in the layout (left out when not given). */
export function plotBlocks(x, result, { title = null, legendCounts = true, hold = [], template = undefined } = {}) {
  const p = blockParts(x, result);
  const held = [blockExtents(p)];
  for (const [hx, hr] of hold) held.push(blockExtents(blockParts(hx, hr)));
  const { xs, values, n, blocks, bs, fmt, step, nvfp4, ts, err } = p;
  const worst = []; // each block's largest error, NaN left out (nanmax); null where none is finite
  for (let b = 0; b < blocks; b++) {
    let w = null, anyFinite = false;
    for (let i = b * bs; i < (b + 1) * bs; i++) {
      const e = err[i];
      if (Number.isFinite(e)) anyFinite = true;
      if (!Number.isNaN(e) && (w === null || e > w)) w = e;
    }
    worst.push(anyFinite ? w : null);
  }

  // the value axis: whole powers of two over every extent held, and two binades under them the zeros
  let lo = Infinity, hi = -Infinity, count = 0;
  for (const list of held) for (const v of list) { count++; if (v < lo) lo = v; if (v > hi) hi = v; }
  [lo, hi] = count ? [Math.floor(lo), Math.ceil(hi)] : [-1, 1];
  const dtick = log2Ticks([lo, hi]).dtick;
  const zeroY = lo - 2;
  const start = Math.ceil(lo / dtick) * dtick, powers = [];
  const size = Math.max(0, Math.ceil((hi + dtick / 2 - start) / dtick));
  for (let k = 0; k < size; k++) powers.push(start + k * dtick);
  const yAxis = { range: [zeroY - 1, hi + 0.75], tickmode: "array", tickvals: [zeroY, ...powers],
    ticktext: ["0", ...powers.map((v) => `2^${Math.trunc(v)}`)] };

  const onAxis = (v) => {
    const y = finiteLog2(v);
    for (let i = 0; i < v.length; i++) if (v[i] === 0) y[i] = zeroY;
    return y;
  };
  const scaleText = (b) => {
    if (!Number.isFinite(step[b])) return "NaN";
    return nvfp4 ? formatNumber(p.blockScale[b]) : pow2Short(p.blockScale[b]);
  };
  const idx = Array.from({ length: n }, (_, i) => i);
  const [origX, origY] = levels(idx, onAxis(xs), 0.45);
  const origData = [];
  for (let i = 0; i < n; i++) {
    const row = [Math.floor(i / bs), xs[i]];
    origData.push(row, row, [NaN, NaN]);
  }
  const [tickX, tickY] = levels(idx, onAxis(values), 0.35);
  const scaleTexts = Array.from({ length: blocks }, (_, b) => scaleText(b));
  const tickData = [];
  for (let i = 0; i < n; i++) {
    const row = [scaleTexts[Math.floor(i / bs)], values[i]];
    tickData.push(row, row, [null, null]);
  }
  const edges = new Float64Array(3 * blocks).fill(NaN);
  for (let b = 0; b < blocks; b++) { edges[3 * b] = b * bs - 0.5; edges[3 * b + 1] = b * bs + bs - 0.5; }
  const blockSteps = (v) => {
    const l = finiteLog2(v), y = new Float64Array(3 * blocks).fill(NaN);
    for (let b = 0; b < blocks; b++) y[3 * b] = y[3 * b + 1] = l[b];
    return y;
  };

  const data = [
    { type: "scatter", x: edges, y: blockSteps(p.top), mode: "lines", name: "block's largest value (max × scale)",
      line: { color: BLOCK_COLORS.range, width: 1.5 }, hoverinfo: "skip", meta: { kind: "range" } },
    { type: "scatter", x: edges, y: blockSteps(p.least), mode: "lines", name: "smallest nonzero (× scale)",
      line: { color: BLOCK_COLORS.range, width: 1.5, dash: "dot" }, hoverinfo: "skip", meta: { kind: "least" } },
    { type: "scatter", x: origX, y: origY, mode: "lines", name: "original",
      line: { color: BLOCK_COLORS.original, width: 1.5 }, customdata: origData, hoveron: "points",
      hovertemplate: "element %{x:.0f} (block %{customdata[0]}) · x = %{customdata[1]:.4~g}<extra></extra>",
      meta: { kind: "original" } },
    { type: "scatter", x: tickX, y: tickY, mode: "lines", name: "dequantized",
      line: { color: BLOCK_COLORS.dequantized, width: 2.5 }, customdata: tickData, hoveron: "points",
      hovertemplate: "element %{x:.0f} · q = %{customdata[1]:.4~g} · "
        + (nvfp4 ? "E4M3 block scale" : "block scale") + " %{customdata[0]}<extra></extra>",
      meta: { kind: "dequantized" } },
  ];
  for (const [kind, flags, label] of [["saturated", p.saturated, "saturated (held at the block's max)"],
    ["flushed", p.flushed, "flushed to 0"]]) {
    const at = idx.filter((i) => flags[i]);
    const [lx, ly] = levels(at, onAxis(at.map((i) => values[i])), 0.45);
    const hover = [];
    for (const i of at) {
      const t = `element ${i} ${kind}: x = ${formatNumber(xs[i], 4)} → ${formatNumber(values[i], 4)}`;
      hover.push(t, t, "");
    }
    data.push({ type: "scatter", x: lx, y: ly, mode: "lines", name: legendCounts ? `${label}: ${at.length}` : label,
      line: { color: BLOCK_COLORS[kind], width: 5 }, hovertext: hover, hoverinfo: "text", hoveron: "points",
      meta: { kind } });
  }
  const errX = new Float64Array(n + 2), errY = new Float64Array(n + 2), errData = new Float64Array(n + 2);
  errX[0] = -0.5; errX[n + 1] = n - 0.5; errY[0] = err[0]; errY[n + 1] = err[n - 1]; errData[0] = 0; errData[n + 1] = n - 1;
  for (let i = 0; i < n; i++) { errX[i + 1] = i; errY[i + 1] = err[i]; errData[i + 1] = i; }
  data.push({ type: "scatter", x: errX, y: errY, mode: "lines", name: "relative error", xaxis: "x2", yaxis: "y2",
    line: { shape: "hvh", width: 0, color: BLOCK_COLORS.error }, fill: "tozeroy", fillcolor: BLOCK_COLORS.error,
    hoveron: "points", customdata: errData, hovertemplate: "element %{customdata} · error %{y:.3~%}<extra></extra>",
    showlegend: false, meta: { kind: "error" } });
  data.push({ type: "scatter", x: Float64Array.from({ length: blocks }, (_, b) => b * bs + (bs - 1) / 2),
    y: new Float64Array(blocks).fill(1), yaxis: "y3", mode: "text", text: scaleTexts, textposition: "top center",
    cliponaxis: false, textfont: { size: 10, color: "#555555" }, hovertext: scaleHover(p, scaleTexts),
    hoverinfo: "text", showlegend: false, meta: { kind: "scale" } });
  const shapes = [];
  for (let b = 1; b < blocks; b++) {
    shapes.push({ type: "line", xref: "x", yref: "paper", x0: b * bs - 0.5, x1: b * bs - 0.5, y0: 0, y1: 1,
      line: { color: "#888888", width: 1, dash: "dot" } });
  }
  const scheme = nvfp4 ? "NVFP4" : `MX ${fmt.name}`;
  const tsText = !nvfp4 ? "" : ts === null ? ", no tensor scale" : `, tensor scale ${formatNumber(ts)}`;
  let errMax = -Infinity;
  for (const e of err) if (Number.isFinite(e) && e > errMax) errMax = e;
  const errTop = errMax > -Infinity ? Math.max(1.05, errMax * 1.05) : 1.05;
  const layout = {
    ...WHITE(),
    title: { text: title || `${scheme}: blocks of ${bs}${tsText}`, x: 0.01 },
    height: 600,
    margin: { l: 80, r: 20, t: 110, b: 100 },
    legend: { orientation: "h", x: 0.01, y: 0, yref: "container", yanchor: "bottom" },
    xaxis: { ...WHITE_AXIS(), ...LINEAR(), domain: [0, 1], anchor: "y", range: [-0.5, n - 0.5], showticklabels: false },
    yaxis: { ...WHITE_AXIS(), ...LINEAR(), domain: [0.4, 1], title: { text: "|value|" }, ...yAxis },
    yaxis3: { ...LINEAR(), domain: [0.4, 1], range: [0, 1], overlaying: "y", visible: false, fixedrange: true },
    xaxis2: { ...WHITE_AXIS(), ...LINEAR(), domain: [0, 1], anchor: "y2", matches: "x", range: [-0.5, n - 0.5],
      title: { text: "element" } },
    yaxis2: { ...WHITE_AXIS(), ...LINEAR(), domain: [0, 0.3], anchor: "x2", range: [0, errTop],
      title: { text: "relative error" }, tickformat: ".0%" },
    meta: { scheme: nvfp4 ? "nvfp4" : "mx", fmt: fmt.name, block_size: bs, scale_codes: Array.from(p.scales),
      scales: Array.from(step, (v) => (Number.isFinite(v) ? v : null)), scale_labels: scaleTexts,
      scale_words: scaleTexts.map((label, b) => blockScaleWords(p, label, b)), tensor_scale: ts,
      saturated: p.saturated.reduce((a, v) => a + v, 0), flushed: p.flushed.reduce((a, v) => a + v, 0),
      block_worst: worst, zero_y: zeroY },
  };
  if (shapes.length) layout.shapes = shapes; // an empty list is left out, as plotly's validation does
  if (template !== undefined) layout.template = template;
  return { data, layout };
}

// ----------------------------------------------------------------- BlockExplorer
/** A readout's table (base.py's _table): head and rows already HTML. */
export function table(head, rows) {
  const cell = 'style="padding: 0 1.2em 0 0; text-align: left"';
  const top = head.map((h) => `<th ${cell}>${h}</th>`).join("");
  const body = rows.map((r) => "<tr>" + r.map((c) => `<td ${cell}>${c}</td>`).join("") + "</tr>").join("");
  return `<table class="ampviz-readout-table"><tr>${top}</tr>${body}</table>`;
}

/** A readout as the controls' column shows it (base.py's _in_column). */
export function inColumn(text) {
  return `<div class="ampviz-column-text" style="line-height:1.35">${text}</div>`;
}

/** BlockExplorer's figure title for the settings {scheme, block_size, rounding, hadamard}, the
 *  scheme's label and the quantization (its tensor scale, under NVFP4). */
export function explorerTitle(label, settings, result) {
  const nvfp4 = settings.scheme === "nvfp4";
  let title = `${label}: blocks of ${nvfp4 ? 16 : settings.block_size}`;
  if (!nvfp4) title += `, scale rounding ${settings.rounding}`;
  else title += result.tensorScale !== null ? `, per-tensor scale ${formatNumber(result.tensorScale)}` : ", no per-tensor scale";
  if (settings.hadamard) title += ", after the Hadamard transform";
  return title;
}

const share = (e) => (e.length ? formatShare(numpyMean(e)) : "0%");
const most = (e) => (e.length ? formatShare(e.reduce((a, v) => (v > a || Number.isNaN(v) ? v : a), -Infinity)) : "0%");

/** BlockExplorer's readout (_readout_html, in its column): the errors, the shares saturated and
 *  flushed, with the transform the errors after undoing it (`matrix`: its matrix), each block's
 *  scale and worst error. `data`: the row before any transform; `x`: the row quantized; `meta`:
 *  the figure's layout.meta. */
export function readoutHtml(data, x, result, meta, hadamard, matrix) {
  const err = relativeError(x, result.values);
  const n = x.length;
  const line = `mean relative error ${share(err)} · max ${most(err)} · `
    + `saturated ${formatShare(meta.saturated / n)} (${withCommas(meta.saturated)}) · `
    + `flushed to zero ${formatShare(meta.flushed / n)} (${withCommas(meta.flushed)}) of ${withCommas(n)} values`;
  let extra = "";
  if (hadamard) {
    const e = relativeError(data, hadamardTransform(result.values, matrix, true));
    extra = `<div>${escapeHtml(`After undoing the transform: mean relative error ${share(e)} · max ${most(e)}`)}</div>`;
  }
  const worst = meta.block_worst.map((w) => escapeHtml(w !== null ? formatShare(w) : "nan"));
  let tableHtml;
  if (meta.scheme === "nvfp4") {
    const ts = meta.tensor_scale;
    const note = "NVFP4: above each block the figure writes its E4M3 scale; "
      + (ts !== null ? `its values are multiplied by that × the per-tensor scale ${formatNumber(ts)}.`
        : "with no per-tensor scale, that is the scale its values take.");
    extra += `<div>${escapeHtml(note)}</div>`;
    const scaleHead = ts !== null ? "scale = E4M3 scale × tensor scale" : "scale";
    const times = ts === null ? "" : `${formatNumber(ts)} = `;
    const product = (label, s) => (ts !== null && s !== null ? `${label} × ${times}${formatNumber(s)}`
      : s !== null ? formatNumber(s) : "nan");
    tableHtml = table(["block", "E4M3 scale (above the block)", scaleHead, "worst relative error"],
      meta.scale_labels.map((label, b) => [String(b), escapeHtml(label), escapeHtml(product(label, meta.scales[b])), worst[b]]));
  } else {
    tableHtml = table(["block", "scale (E8M0, above the block)", "worst relative error"],
      meta.scales.map((s, b) => [String(b), escapeHtml(s !== null ? formatPow2(s) : "nan"), worst[b]]));
  }
  return `<div>${escapeHtml(line)}</div>${extra}${tableHtml}`;
}
