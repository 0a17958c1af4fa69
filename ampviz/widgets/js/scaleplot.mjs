// ScalerLab's figure and readout in the browser: the same data, layout and text as
// ampviz.plots.plot_scale_trace and ScalerLab's readout, exactly.
//
// A port of ampviz/plots/scaling.py (the step line through the steps where the scale changes, at
// screen resolution for long runs; the lanes of skipped steps; the lost-share panel), of the axis
// helpers of ampviz/plots/axes.py, the colours of ampviz/plots/style.py, format_number of
// ampviz/plots/text.py, underflow_fractions of ampviz/formats/census.py, and ScalerLab's
// _lost_share and readout table (ampviz/widgets/scaler_lab.py). A trace is what scaling.mjs's
// `simulate` returns, with the scaler's name: {name, scale, skipped, stoppedAt, stopReason, final}.
//
// Exact where Python is: numpy's linspace(...).round() and Python's "{:.0f}" round half to even,
// Python's "{:.3g}" rounds the exact decimal value of a double half to even (toPrecision rounds
// ties up). log2 is rounded correctly here: Math.log2 is an ulp off for about 1 value in 8,000,
// numpy's log2 (its AVX-512 code, or the C library's) for about 1 in 20,000, so a scale that is
// not a power of two may draw one ulp from numpy's value, never further; powers of two are exact.
// tests/browser/test_js_scaleplot.py holds every export to the Python it ports.

import { FORMATS, float32FromBits } from "./formats.mjs";

// ----------------------------------------------------------------- constants (style.py, scaling.py)
/** Colours for overlaid scalers, in order (style.py's TRACE_COLORS). */
export const TRACE_COLORS = Object.freeze(["#000000", "#D55E00", "#0072B2", "#009E73", "#CC79A7", "#E69F00",
  "#56B4E9", "#F0E442"]);

/** One fixed colour per scaler preset, by name (style.py's PRESET_COLORS). */
export const PRESET_COLORS = Object.freeze({
  "torch": "#000000", "DeepSpeed ZeRO": "#0072B2", "DeepSpeed": "#56B4E9", "Megatron": "#D55E00",
  "NeMo (apex hysteresis)": "#009E73", "Keras 3": "#CC79A7", "jmp": "#E69F00", "static 1024": "#888888",
  "Keras 2": "#882255", "apex amp": "#117733", "fairseq": "#332288", "metaseq": "#999933",
});

/** Line styles of overlaid scalers, in order (scaling.py's TRACE_DASHES). */
export const TRACE_DASHES = Object.freeze(["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"]);

/** A scale line with more change points than this is drawn at screen resolution (LINE_POINTS). */
export const LINE_POINTS = 4000;

const LANE_PX = 14; // the height of a scaler's lane of skipped steps
const LOG2_FLOOR = -150; // where a scale of exactly 0 is drawn
const INF_BITS = 0x7f800000;

/** plotly_white's look spelled out (ampviz.plots.style's _LINEAR, _WHITE_AXIS, _WHITE): a new object
 *  each call, for the figure builders of every explorer. */
export const LINEAR = () => ({ type: "linear" });
export const WHITE_AXIS = () => ({ gridcolor: "#EBF0F8", linecolor: "#EBF0F8", zeroline: false, automargin: true,
  ticklabeloverflow: "allow" });
export const WHITE = () => ({ paper_bgcolor: "white", plot_bgcolor: "white", font: { color: "#2a3f5f" },
  hoverlabel: { align: "left" } });

// ----------------------------------------------------------------- exact arithmetic helpers
const F64 = new Float64Array(1);
const U32 = new Uint32Array(F64.buffer); // little-endian: U32[1] holds the sign and exponent

/** v rounded to a whole number, ties to even (numpy's round, Python's "{:.0f}"), for v >= 0. */
function roundHalfEven(v) {
  const r = Math.floor(v), d = v - r;
  if (d > 0.5) return r + 1;
  if (d < 0.5) return r;
  return r % 2 === 0 ? r : r + 1;
}

/** An integer with thousands separators, as Python's "{:,}". */
function withCommas(n) {
  return String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ",");
}

/** Python's html.escape (quotes included). */
function escapeHtml(s) {
  return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
    .replace(/"/g, "&quot;").replace(/'/g, "&#x27;");
}

// Double-double arithmetic for a correctly rounded log2: a value is hi + lo, |lo| <= ulp(hi) / 2.
let ddH = 0, ddL = 0; // the result of the last dd operation

function twoSum(a, b) { const s = a + b, bb = s - a; ddH = s; ddL = (a - (s - bb)) + (b - bb); }
function fastTwoSum(a, b) { const s = a + b; ddH = s; ddL = b - (s - a); }
function split(a) { const c = 134217729 * a; const hi = c - (c - a); return hi; } // Veltkamp: the high 26 bits
function twoProd(a, b) {
  const p = a * b, ah = split(a), al = a - ah, bh = split(b), bl = b - bh;
  ddH = p; ddL = ((ah * bh - p) + ah * bl + al * bh) + al * bl;
}
function ddAdd(ah, al, bh, bl) {
  twoSum(ah, bh); const s1 = ddH, s2 = ddL;
  twoSum(al, bl); const t1 = ddH, t2 = ddL;
  fastTwoSum(s1, s2 + t1); fastTwoSum(ddH, ddL + t2);
}
function ddMul(ah, al, bh, bl) {
  twoProd(ah, bh); const p = ddH, e = ddL + (ah * bl + al * bh);
  fastTwoSum(p, e);
}

/** ln(c) for c > 0 near 1, as double-double: 2 atanh((c - 1) / (c + 1)) summed to 2^-106. */
function lnSeries(c) {
  // w = (c - 1) / (c + 1): c - 1 is exact for c in [0.5, 2]
  twoSum(c, 1); const dh = ddH, dl = ddL;
  ddDiv(c - 1, 0, dh, dl); const wh = ddH, wl = ddL;
  ddMul(wh, wl, wh, wl); const w2h = ddH, w2l = ddL;
  let sh = wh, sl = wl, th = wh, tl = wl;
  for (let k = 3; k < 200; k += 2) {
    ddMul(th, tl, w2h, w2l); th = ddH; tl = ddL;
    ddDiv(th, tl, k, 0);
    if (Math.abs(ddH) < Math.abs(sh) * 2 ** -110) break;
    ddAdd(sh, sl, ddH, ddL); sh = ddH; sl = ddL;
  }
  ddH = 2 * sh; ddL = 2 * sl;
}

/** (ah + al) / (bh + bl) as double-double, to about 2^-104. */
function ddDiv(ah, al, bh, bl) {
  const q1 = ah / bh;
  ddMul(q1, 0, bh, bl); ddAdd(ah, al, -ddH, -ddL);
  const rh = ddH, rl = ddL, q2 = rh / bh;
  ddMul(q2, 0, bh, bl); ddAdd(rh, rl, -ddH, -ddL);
  const q3 = ddH / bh;
  fastTwoSum(q1, q2); ddAdd(ddH, ddL, q3, 0);
}

// 1 / ln 2 and log2(1 + j/128) for j = -64..64, as double-double, computed once at load (about 0.1 ms).
lnSeries(2); const LN2_H = ddH, LN2_L = ddL; // ln 2 = 2 atanh(1/3)
ddDiv(1, 0, LN2_H, LN2_L);
const INV_LN2_H = ddH, INV_LN2_L = ddL;
const LOG2_TABLE_H = new Float64Array(129), LOG2_TABLE_L = new Float64Array(129);
for (let j = -64; j <= 64; j++) {
  if (j === 0) continue;
  lnSeries(1 + j / 128);
  ddMul(ddH, ddL, INV_LN2_H, INV_LN2_L);
  LOG2_TABLE_H[j + 64] = ddH; LOG2_TABLE_L[j + 64] = ddL;
}

/** log2(x) from a double-double value (error near 2^-100) rounded once, so correctly rounded unless
 *  the exact value lies closer than that to a tie: 0 -> -inf; NaN and inf as log2 has them. */
function log2(x) {
  if (!(x > 0)) return x === 0 ? -Infinity : NaN;
  if (x === Infinity) return Infinity;
  F64[0] = x;
  let biased = (U32[1] >>> 20) & 0x7ff, e0 = 0;
  if (biased === 0) { F64[0] = x * 2 ** 64; biased = (U32[1] >>> 20) & 0x7ff; e0 = -64; } // a subnormal
  let e = biased - 1023 + e0;
  U32[1] = (U32[1] & 0x800fffff) | (1023 << 20); // x = m * 2^e, m in [1, 2)
  let m = F64[0];
  if (m === 1) return e; // a power of two: exact
  if (m > Math.SQRT2) { m /= 2; e += 1; } // m in [0.707, 1.414]: a result near 0 keeps its digits
  const j = Math.round((m - 1) * 128), c = 1 + j / 128;
  // log2(m) = log2(c) + 2 atanh(u) / ln 2, u = (m - c) / (m + c), |u| < 2^-8.5 (m - c is exact)
  const num = m - c;
  twoSum(m, c); const dh = ddH, dl = ddL;
  const u1 = num / dh;
  twoProd(u1, dh);
  const u2 = (((num - ddH) - ddL) - u1 * dl) / dh;
  const u1s = u1 * u1;
  const tail = u1 * u1s * (2 / 3 + u1s * (2 / 5 + u1s * (2 / 7 + u1s * (2 / 9 + u1s * (2 / 11)))));
  fastTwoSum(2 * u1, 2 * u2 + tail);
  ddMul(ddH, ddL, INV_LN2_H, INV_LN2_L);
  if (j !== 0) ddAdd(LOG2_TABLE_H[j + 64], LOG2_TABLE_L[j + 64], ddH, ddL);
  const lh = ddH, ll = ddL;
  twoSum(e, lh);
  return ddH + (ddL + ll);
}

// ----------------------------------------------------------------- axes.py
/** log2 |scale| per value (axes.py's _log2_scale): 0 drawn at 2^-150, NaN kept (a gap). A Float64Array. */
export function log2Scale(scale) {
  const out = new Float64Array(scale.length);
  for (let i = 0; i < scale.length; i++) {
    const a = Math.abs(scale[i]);
    out[i] = a === 0 ? LOG2_FLOOR : log2(a);
  }
  return out;
}

/** The indices whose value differs from the one before it, NaN equal to NaN (axes.py's _changes). */
function changes(v) {
  const out = [];
  for (let i = 1; i < v.length; i++) {
    const a = v[i], b = v[i - 1];
    if (a !== b && !(a !== a && b !== b)) out.push(i);
  }
  return out;
}

/** The positions numpy's linspace(0, size - 1, most).round() gives (ties to even). */
function evenPositions(size, most) {
  const out = new Float64Array(most);
  if (most === 1) return out; // linspace of one point: [0]
  const step = (size - 1) / (most - 1);
  for (let k = 0; k < most - 1; k++) out[k] = roundHalfEven(k * step);
  out[most - 1] = size - 1; // linspace's last point is the stop itself
  return out;
}

/** At most `most` of the indices `idx`, evenly spread (axes.py's _thin): idx itself when it fits. */
export function thin(idx, most) {
  if (idx.length <= most) return idx;
  const pos = evenPositions(idx.length, most);
  const out = new Float64Array(most);
  for (let k = 0; k < most; k++) out[k] = idx[pos[k]];
  return out;
}

/** How many of `total` skipped steps are marked, in words (axes.py's _marked_part): "" (all),
 *  "1 in 6", or "60 of 64" (where "1 in 1" would round the difference away). */
export function markedPart(shown, total) {
  if (shown >= total) return "";
  const ratio = total / Math.max(shown, 1);
  return ratio >= 1.5 ? `1 in ${roundHalfEven(ratio)}` : `${withCommas(shown)} of ${withCommas(total)}`;
}

function finiteValues(values) {
  const out = [];
  for (let i = 0; i < values.length; i++) if (Number.isFinite(values[i])) out.push(Number(values[i]));
  return out;
}

function minMax(v) {
  let lo = Infinity, hi = -Infinity;
  for (const x of v) { if (x < lo) lo = x; if (x > hi) hi = x; }
  return [lo, hi];
}

/** An axis range over the finite values, a quarter step beyond them, out to the next multiples of
 *  step (axes.py's _padded_range); null when no value is finite. */
export function paddedRange(values, step) {
  const v = finiteValues(values);
  if (!v.length) return null;
  const [lo, hi] = minMax(v);
  const pad = step / 4;
  return [Math.floor((lo - pad) / step) * step, Math.ceil((hi + pad) / step) * step];
}

const DECADES = [1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1, 1e1, 1e2, 1e3]; // Python's 10.0 ** k, k = -6..3

/** The top of a share axis in percent (axes.py's _share_top): the first of 1, 2, 5 x 10^k at or
 *  above 1.2 times the largest finite share; 1 when none is above 0. */
export function shareTop(percent) {
  const v = finiteValues(percent);
  const top = v.length ? 1.2 * minMax(v)[1] : 0;
  if (!(top > 0)) return 1;
  for (const p of DECADES) for (const m of [1, 2, 5]) if (m * p >= top) return m * p;
  return top;
}

/** Axis settings for log2 values: ticks at whole powers of two, about 6 at most (axes.py's _log2_ticks). */
export function log2Ticks(values) {
  const v = finiteValues(values);
  const [lo, hi] = minMax(v);
  const span = v.length ? hi - lo : 0;
  const step = [1, 2, 5, 10, 20, 25, 50, 100].find((d) => span / d <= 6) ?? 200;
  return { tickmode: "linear", tick0: 0, dtick: step, tickprefix: "2^" };
}

// ----------------------------------------------------------------- text.py
/** The exact decimal digits of a finite a > 0: a = digits * 10^exp10. */
function exactDecimal(a) {
  F64[0] = a;
  const biased = (U32[1] >>> 20) & 0x7ff;
  let m = (BigInt(U32[1] & 0xfffff) << 32n) | BigInt(U32[0]);
  let e = -1074;
  if (biased > 0) { m |= 1n << 52n; e = biased - 1075; }
  if (e >= 0) return { digits: (m << BigInt(e)).toString(), exp10: 0 };
  return { digits: (m * 5n ** BigInt(-e)).toString(), exp10: e };
}

/** x as Python's "{:.<p>g}" writes a float: the exact value rounded to p significant digits, ties
 *  to even; fixed notation for exponents from -4 to p - 1, else "1.5e-08"; trailing zeros dropped. */
export function formatG(x, p = 6) {
  x = Number(x);
  if (Number.isNaN(x)) return "nan";
  F64[0] = x;
  const sign = U32[1] >>> 31 ? "-" : "";
  const a = Math.abs(x);
  if (a === Infinity) return `${sign}inf`;
  p = Math.max(1, p);
  if (a === 0) return `${sign}0`;
  const { digits, exp10 } = exactDecimal(a);
  let point = digits.length + exp10; // a = 0.digits * 10^point
  let head = digits.slice(0, p).padEnd(p, "0");
  if (digits.length > p) {
    const rest = digits.slice(p);
    const up = rest[0] > "5" || (rest[0] === "5" && (/[1-9]/.test(rest.slice(1)) || Number(head[p - 1]) % 2 === 1));
    if (up) {
      head = (BigInt(head) + 1n).toString();
      if (head.length > p) { head = head.slice(0, p); point += 1; }
    }
  }
  const exp = point - 1;
  const trim = (s) => (s.includes(".") ? s.replace(/0+$/, "").replace(/\.$/, "") : s);
  if (exp >= -4 && exp < p) {
    let s;
    if (point <= 0) s = "0." + "0".repeat(-point) + head;
    else if (point >= p) s = head + "0".repeat(point - p);
    else s = head.slice(0, point) + "." + head.slice(point);
    return sign + trim(s);
  }
  const mant = trim(head.length > 1 ? head[0] + "." + head.slice(1) : head);
  return `${sign}${mant}e${exp < 0 ? "-" : "+"}${String(Math.abs(exp)).padStart(2, "0")}`;
}

/** x as short text (text.py's format_number): whole numbers below 10^7 in full ("65504"), others
 *  with `digits` significant digits ("5.96e-08"); "inf", "-inf", "nan" for the specials. */
export function formatNumber(x, digits = 3) {
  x = Number(x);
  if (Number.isNaN(x)) return "nan";
  if (!Number.isFinite(x)) return x > 0 ? "inf" : "-inf";
  if (Number.isInteger(x) && Math.abs(x) < 1e7) {
    F64[0] = x;
    return (U32[1] >>> 31 ? "-" : "") + String(Math.abs(x));
  }
  return formatG(x, digits);
}

// ----------------------------------------------------------------- style.py
/** The colour of each scaler named, in order (style.py's scaler_colors): a preset's own; any other
 *  takes the next of TRACE_COLORS that no preset drawn with it has. */
export function scalerColors(names) {
  names = [...names].map(String);
  const has = (n) => Object.prototype.hasOwnProperty.call(PRESET_COLORS, n);
  const taken = new Set(names.filter(has).map((n) => PRESET_COLORS[n]));
  let free = TRACE_COLORS.filter((c) => !taken.has(c));
  if (!free.length) free = [...TRACE_COLORS];
  let k = 0;
  return names.map((n) => (has(n) ? PRESET_COLORS[n] : free[k++ % free.length]));
}

// ----------------------------------------------------------------- census.py
/** The smallest float32 bit pattern whose product with s32 (in float32) is above `ub`: where
 *  nonzero values stop underflowing (census.py's _edge_finder(fmt, s32)(2)). */
function survivingBits(ub, s32) {
  let lo = 1, hi = INF_BITS; // inf always survives
  while (lo < hi) {
    const mid = Math.floor((lo + hi) / 2);
    if (!(Math.fround(float32FromBits(mid) * s32) <= ub)) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

/** How many of the sorted values are below x. */
function lowerBound(sorted, x) {
  let lo = 0, hi = sorted.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (sorted[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/** For each scale, the share of the float32 `values` (a Float32Array; numbers are rounded to
 *  float32) that a census in `fmt` counts as underflow: nonzero, 0 once multiplied by the float32
 *  scale in float32 and cast (census.py's underflow_fractions). A Float64Array. */
export function underflowFractions(values, fmt, scales) {
  const f = FORMATS[fmt];
  if (!f) throw new RangeError(`fmt must be one of ${Object.keys(FORMATS).join(", ")}, not ${fmt}`);
  const v = values instanceof Float32Array ? values : Float32Array.from(values);
  const u = new Uint32Array(v.buffer, v.byteOffset, v.length);
  const kept = [];
  for (let i = 0; i < u.length; i++) { const b = u[i] & 0x7fffffff; if (b <= INF_BITS) kept.push(b); } // NaN never underflows
  const bits = Uint32Array.from(kept).sort();
  const zeros = lowerBound(bits, 1);
  const out = new Float64Array(scales.length);
  const seen = new Map();
  for (let i = 0; i < scales.length; i++) {
    const sc = Number(scales[i]);
    if (!seen.has(sc)) {
      const s32 = Math.fround(sc);
      if (!(Number.isFinite(s32) && s32 > 0)) {
        throw new RangeError(`scale must be a positive number that fits in float32, got ${sc}`);
      }
      seen.set(sc, (lowerBound(bits, survivingBits(f.underflowBoundary, s32)) - zeros) / Math.max(v.length, 1));
    }
    out[i] = seen.get(sc);
  }
  return out;
}

// ----------------------------------------------------------------- ScalerLab's lost share
/** ScalerLab's gradient sample at a level: the float32 shape (g / g.max()) times the level, in
 *  float32 as numpy multiplies a float32 array by a Python float (the level rounded to float32 first). */
export function lostSample(shape, level) {
  const l32 = Math.fround(level);
  const out = new Float32Array(shape.length);
  for (let i = 0; i < shape.length; i++) out[i] = shape[i] * l32; // float32 * float32 is exact in float64
  return out;
}

/** Share of the gradient sample lost to fp16 underflow at the scale in effect, at the steps where
 *  the scale changes (at most 200 of them, evenly), then the last step (ScalerLab._lost_share).
 *  traceScale: the trace's scales; sampleShape: g / g.max() in float32; level: the stream's
 *  typical largest gradient. Returns {steps, shares} (Float64Arrays). */
export function lostShare(traceScale, sampleShape, level) {
  const s = traceScale, n = s.length;
  if (n === 0) return { steps: new Float64Array(0), shares: new Float64Array(0) };
  let idx = [0];
  for (let i = 1; i < n; i++) if (s[i] !== s[i - 1]) idx.push(i); // NaN != NaN: a change, as numpy's !=
  if (idx.length > 200) idx = Array.from(evenPositions(idx.length, 200), (p) => idx[p]);
  const scales = idx.map((i) => s[i]);
  const shares = new Float64Array(idx.length + 1);
  const usable = [];
  scales.forEach((sc, k) => {
    shares[k] = sc === 0 ? 1 : 0; // a zero scale loses every gradient
    if (Number.isFinite(sc) && sc > 0 && sc <= 3e38) usable.push(k);
  });
  if (usable.length) {
    const got = underflowFractions(lostSample(sampleShape, level), "fp16", usable.map((k) => scales[k]));
    usable.forEach((k, i) => { shares[k] = got[i]; });
  }
  shares[idx.length] = shares[idx.length - 1];
  const steps = new Float64Array(idx.length + 1);
  steps.set(idx);
  steps[idx.length] = n - 1;
  return { steps, shares };
}

// ----------------------------------------------------------------- scaling.py
/** `text` as literal text in a plotly hovertemplate ("%{" would start a placeholder). */
function templateText(text) {
  return String(text).split("%{").join("%\u200b{");
}

/** The first, last, first lowest and first highest y of each of `groups` equal groups of steps
 *  (scaling.py's _envelope; NaN is never lowest or highest): positions into idx, ascending. */
function envelope(idx, y, n, groups) {
  const m = idx.length, keep = new Uint8Array(m);
  let start = 0;
  while (start < m) {
    const g = Math.floor(idx[start] * groups / n);
    let end = start;
    while (end + 1 < m && Math.floor(idx[end + 1] * groups / n) === g) end++;
    keep[start] = keep[end] = 1;
    let lo = NaN, hi = NaN; // np.fmin / np.fmax: NaN only where the whole group is NaN
    for (let i = start; i <= end; i++) {
      const v = y[i];
      if (v !== v) continue;
      if (!(lo <= v)) lo = v;
      if (!(hi >= v)) hi = v;
    }
    for (let i = start; i <= end; i++) if (y[i] === lo) { keep[i] = 1; break; }
    for (let i = start; i <= end; i++) if (y[i] === hi) { keep[i] = 1; break; }
    start = end + 1;
  }
  const out = [];
  for (let i = 0; i < m; i++) if (keep[i]) out.push(idx[i]);
  return out;
}

/** The steps where the scale changes, plus the first and last (scaling.py's _scale_steps): where
 *  there are more than `most`, each of most / 4 equal groups of steps keeps its first, last, lowest
 *  and highest change. Returns {idx, scale} (Float64Arrays). */
export function scaleSteps(scale, most = LINE_POINTS) {
  const n = scale.length;
  if (n === 0) return { idx: new Float64Array(0), scale: new Float64Array(0) };
  let idx = [0, ...changes(scale), n - 1]; // a 1-step trace gives [0, 0], as numpy's concatenate
  if (idx.length > most) {
    idx = envelope(idx, log2Scale(idx.map((i) => scale[i])), n, Math.max(Math.floor(most / 4), 1));
  }
  return { idx: Float64Array.from(idx), scale: Float64Array.from(idx, (i) => scale[i]) };
}

function traceSteps(t) {
  return t.steps ?? t.scale.length;
}

/** A trace's skipped steps (none after a stop), the ones marked (at most `most`, evenly among them)
 *  and how many are marked, in words (scaling.py's _skipped_marks): {skipped, shown, part}. */
export function skippedMarks(trace, most) {
  const end = trace.stoppedAt == null ? traceSteps(trace) : trace.stoppedAt + 1; // no step runs after a stop
  const skipped = [];
  for (let i = 0; i < Math.min(end, trace.skipped.length); i++) if (trace.skipped[i]) skipped.push(i);
  const all = Float64Array.from(skipped);
  const shown = thin(all, most);
  return { skipped: all, shown, part: markedPart(shown.length, all.length) };
}

/** Width of the k-th of n overlaid scale lines (scaling.py's _line_width). */
function lineWidth(k, n) {
  return n === 1 ? 2 : 1.5 + Math.min(n - 1 - k, 3) * 0.8;
}

function lostEntries(lost) {
  if (lost == null) return [];
  const entries = lost instanceof Map ? [...lost.entries()] : Object.entries(lost);
  return entries.map(([name, v]) => [name, ...(Array.isArray(v) ? v : [v.steps, v.shares])]);
}

/** The figure of plot_scale_trace(traces, title=, lost=, max_markers=, legend_counts=) as
 *  {data, layout}: each trace's log2 scale as a step line, its skipped steps in a lane above, and
 *  `lost` (name -> [steps, shares] or {steps, shares}, an object or a Map) in a lower panel.
 *  traces: {name, scale, skipped, stoppedAt} (scaling.mjs's simulate, named). `template`: the
 *  plotly template object to put in the layout, as plotly.py fills it in (left out when not given). */
export function scaleTraceFigure(traces, { title = null, lost = null, maxMarkers = 60, legendCounts = true,
  template = undefined } = {}) {
  traces = Array.isArray(traces) ? traces : [traces];
  if (!traces.length) throw new TypeError("traces must be a trace or a list of them, got none");
  if (typeof legendCounts !== "boolean") throw new TypeError(`legendCounts must be true or false, got ${legendCounts}`);
  if (!Number.isInteger(maxMarkers) || maxMarkers < 1) {
    throw new RangeError(`maxMarkers must be a whole number >= 1, got ${maxMarkers}`);
  }
  const lostList = lostEntries(lost);
  const rows = lostList.length ? 2 : 1;
  const data = [], markers = [], shapes = [], notes = [], ys = [];
  const colors = scalerColors(traces.map((t) => t.name));
  traces.forEach((t, k) => {
    const color = colors[k], name = String(t.name);
    const { idx, scale: sc } = scaleSteps(t.scale);
    const y = log2Scale(sc);
    ys.push(y);
    const { skipped, shown, part } = skippedMarks(t, maxMarkers);
    const thinned = part ? ` (${part} marked)` : "";
    data.push({
      type: "scatter", x: idx, y, mode: "lines",
      line: { shape: "hv", color, width: lineWidth(k, traces.length), dash: TRACE_DASHES[k % TRACE_DASHES.length] },
      name: legendCounts ? `${name}: ${withCommas(skipped.length)} skipped${thinned}` : name,
      legendgroup: name,
      customdata: sc,
      hovertemplate: `${templateText(name)} · step %{x:,} · scale %{customdata:,.6~g}<extra></extra>`,
      meta: { policy: name, kind: "scale" },
    });
    if (shown.length) {
      markers.push({
        type: "scatter", x: shown, y: new Float64Array(shown.length).fill(k), mode: "markers",
        marker: { symbol: "line-ns-open", size: 11, color, line: { width: 1.5, color } },
        name: `${name}: skipped` + (part && legendCounts ? ` (${part} shown)` : ""),
        legendgroup: name, showlegend: false, yaxis: "y3", cliponaxis: false,
        customdata: Float64Array.from(shown, (i) => t.scale[i]),
        hovertemplate: `${templateText(name)} · step %{x:,} skipped · scale %{customdata:,.6~g}<extra></extra>`,
        meta: { policy: name, kind: "skipped" },
      });
    }
    if (t.stoppedAt != null) {
      shapes.push({ type: "line", xref: "x", yref: "paper", x0: t.stoppedAt, x1: t.stoppedAt, y0: 0, y1: 1,
        line: { color, dash: "dash" } });
      notes.push({ x: t.stoppedAt, xref: "x", y: 1, yref: "paper", showarrow: false, xanchor: "right",
        yanchor: "bottom", text: `${name} stopped`, font: { color } });
    }
  });
  data.push(...markers);
  const colorOf = new Map(traces.map((t, k) => [String(t.name), colors[k]]));
  const percents = [];
  lostList.forEach(([name, steps, shares], k) => {
    const color = colorOf.get(name) ?? (k < colors.length ? colors[k] : TRACE_COLORS[k % TRACE_COLORS.length]);
    const y = Float64Array.from(shares, (v) => 100 * v);
    for (const v of y) percents.push(v);
    data.push({
      type: "scatter", x: steps, y, mode: "lines", line: { shape: "hv", color, width: 1.5 },
      name: `${name}: % lost`, legendgroup: name, showlegend: false, yaxis: "y2",
      meta: { policy: name, kind: "lost" },
    });
  });
  const n = Math.max(...traces.map(traceSteps));
  const [height, top, bottom] = rows === 1 ? [420, 60, 50] : [560, 60, 50];
  const plot = height - top - bottom;
  const lanes = LANE_PX * traces.length;
  const laneDomain = [1 - lanes / plot, 1];
  const scaleDomain = [rows === 1 ? 0 : 0.34, 1 - (lanes + 22) / plot];
  notes.push({ name: "skipped-title", x: 0, xref: "paper", y: laneDomain[0], yref: "paper", xanchor: "left",
    yanchor: "top", yshift: -1, showarrow: false, font: { size: 11, color: "#555555" },
    text: traces.length > 1 ? "skipped steps, a lane per scaler" : "skipped steps" });
  const allY = [];
  for (const y of ys) for (const v of y) allY.push(v);
  const ticks = log2Ticks(allY);
  const scaleRange = paddedRange(allY, ticks.dtick);
  const layout = {
    ...WHITE(),
    title: { text: title || "Loss scale over training steps", x: 0.01 },
    height,
    margin: { l: 70, r: 20, t: top, b: bottom },
    legend: { orientation: "h", x: 0.01, y: rows === 1 ? -0.15 : -0.12, yanchor: "top" },
    xaxis: { ...WHITE_AXIS(), ...LINEAR(), title: { text: "step" }, range: [0, Math.max(n - 1, 1)], tickformat: "~s",
      anchor: rows === 2 ? "y2" : "y" },
    yaxis: { ...WHITE_AXIS(), ...LINEAR(), title: { text: "loss scale (log2 axis)" }, domain: scaleDomain, ...ticks,
      ...(scaleRange ? { range: scaleRange } : {}) },
    yaxis3: { ...LINEAR(), domain: laneDomain, range: [traces.length - 0.5, -0.5], visible: false, fixedrange: true,
      anchor: "x" },
    annotations: notes,
  };
  if (shapes.length) layout.shapes = shapes; // plotly.py leaves an empty list out
  if (rows === 2) {
    layout.yaxis2 = { ...WHITE_AXIS(), ...LINEAR(), title: { text: "% of gradients lost" }, domain: [0, 0.24],
      range: [0, shareTop(percents)], anchor: "x" };
  }
  if (template !== undefined) layout.template = template;
  return { data, layout };
}

// ----------------------------------------------------------------- ScalerLab's readout
/** The readout's rows (ScalerLab._readout_html), as HTML cells: [scaler, skipped steps (and how
 *  many are marked), final scale (or where the run stopped, and why), lowest scale]. */
export function readoutRows(traces, maxMarkers = 60) {
  return traces.map((t) => {
    let low = Infinity, any = false;
    for (let i = 0; i < t.scale.length; i++) {
      const v = t.scale[i];
      if (Number.isFinite(v)) { any = true; if (v < low) low = v; }
    }
    let end;
    if (t.stoppedAt != null) {
      const reason = t.stopReason;
      end = `stopped at step ${withCommas(t.stoppedAt)}` + (reason ? ` (${escapeHtml(reason)})` : "");
    } else {
      end = formatNumber(t.final.scale);
    }
    const { skipped, part } = skippedMarks(t, maxMarkers);
    const count = withCommas(skipped.length) + (part ? ` (${part} marked)` : "");
    return [escapeHtml(t.name), count, end, any ? formatNumber(low) : "—"];
  });
}

/** The readout's table as ScalerLab writes it (_readout_html; with inColumn, as its readout widget
 *  shows it, in the controls' column). */
export function readoutHtml(traces, maxMarkers = 60, { inColumn = false } = {}) {
  const cell = 'style="padding: 0 1.2em 0 0; text-align: left"';
  const head = ["scaler", "skipped steps", "final scale", "lowest scale"].map((h) => `<th ${cell}>${h}</th>`).join("");
  const body = readoutRows(traces, maxMarkers).map((row) => "<tr>" + row.map((c) => `<td ${cell}>${c}</td>`).join("")
    + "</tr>").join("");
  const table = `<table class="ampviz-readout-table"><tr>${head}</tr>${body}</table>`;
  return inColumn ? `<div class="ampviz-column-text" style="line-height:1.35">${table}</div>` : table;
}

/** ScalerLab's figure title for a stream and loss dtype ("float32" or "float16"). */
export function scalerLabTitle(scenario, strength, steps, loss) {
  return `${scenario} gradients (strength ${formatG(strength, 6)}), ${withCommas(steps)} steps, `
    + `${loss === "float32" ? "float32" : "fp16"} loss`;
}
