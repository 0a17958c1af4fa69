// The figures' shared text and bands in the browser: the same text and numbers as the Python
// package, exactly, for censusplot.mjs (RangeExplorer) and valueplot.mjs (FormatExplorer).
//
// A port of ampviz/plots/text.py (format_pow2, _pow2_short, and Python's "{:.<n>f}", "{:,}" and
// html.escape that they and the readouts use), of ampviz/plots/formats.py (band_edges, _band_hover,
// _past_min, _past_max, _log2_window) and of the colours and bands of ampviz/plots/style.py
// (CATEGORY_COLORS, BAND_CATEGORIES). A format is a format of formats.mjs or its name.
//
// Exact where Python is: log2 is scaleplot.mjs's correctly rounded one (exact for powers of two;
// every constant a band is drawn at is a power of two or a format's max or overflow boundary, where
// the C library's log2 is correctly rounded too); Python's "{:.2f}" rounds the exact decimal value of
// a double half to even (toFixed rounds ties up), so it is done here on the exact binary value;
// "{:,}" is written digit by digit.

import { FORMATS, frexpExponent, ldexp } from "./formats.mjs";
import { formatG, formatNumber, log2Scale } from "./scaleplot.mjs";

// ----------------------------------------------------------------- constants (style.py)
/** Each category's colour (style.py's CATEGORY_COLORS). */
export const CATEGORY_COLORS = Object.freeze({
  zero: "#999999", underflow: "#0072B2", subnormal: "#56B4E9", normal: "#009E73", overflow: "#D55E00",
  nan: "#CC79A7",
});

/** The categories a magnitude can land in, left to right on a log2 axis, drawn as bands
 *  (style.py's BAND_CATEGORIES). */
export const BAND_CATEGORIES = Object.freeze(["underflow", "subnormal", "normal", "overflow"]);

// ----------------------------------------------------------------- exact text helpers
const F64 = new Float64Array(1);
const U32 = new Uint32Array(F64.buffer); // little-endian: U32[1] holds the sign and exponent

/** An integer with thousands separators, as Python's "{:,}". */
export function withCommas(n) {
  const s = String(Math.abs(n)).replace(/\B(?=(\d{3})+(?!\d))/g, ",");
  return n < 0 ? "-" + s : s;
}

/** Python's html.escape (quotes included). */
export function escapeHtml(s) {
  return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
    .replace(/"/g, "&quot;").replace(/'/g, "&#x27;");
}

/** log2 of a finite x > 0, correctly rounded (scaleplot.mjs's; exact for powers of two). */
export function log2(x) {
  return log2Scale([x])[0];
}

/** [frac, e] with x = frac * 2**e, frac in [0.5, 1) (Python's math.frexp), for finite x > 0. */
function frexp(x) {
  const e = frexpExponent(x);
  return [ldexp(x, -e), e];
}

/** A finite double as (m, e) with BigInt m: |x| = m * 2**e exactly. */
function exactParts(x) {
  F64[0] = x;
  const biased = (U32[1] >>> 20) & 0x7ff;
  let m = (BigInt(U32[1] & 0xfffff) << 32n) | BigInt(U32[0]);
  if (biased > 0) m |= 1n << 52n;
  return [m, biased > 0 ? biased - 1075 : -1074];
}

/** Python's "{:.<n>f}": the exact value rounded to n decimals, ties to even; "-0.00" keeps its
 *  sign; "nan", "inf", "-inf". */
export function formatFixed(x, n = 2) {
  if (Number.isNaN(x)) return "nan";
  if (!Number.isFinite(x)) return x > 0 ? "inf" : "-inf";
  F64[0] = x;
  const negative = U32[1] >>> 31 === 1; // -0 included
  const [m, e] = exactParts(x);
  let num = m * 10n ** BigInt(n), den = 1n;
  if (e >= 0) num <<= BigInt(e); else den <<= BigInt(-e);
  let q = num / den;
  const twice = 2n * (num - q * den);
  if (twice > den || (twice === den && q % 2n === 1n)) q += 1n;
  const s = q.toString().padStart(n + 1, "0");
  return (negative ? "-" : "") + (n ? `${s.slice(0, -n)}.${s.slice(-n)}` : s);
}

// ----------------------------------------------------------------- text.py
/** x as a power of two and a decimal (text.py's format_pow2): "2^-24 ≈ 5.96e-08", "2^0 = 1",
 *  "(2 - 2^-10)·2^15 = 65504", otherwise "0.1 ≈ 2^-3.32". */
export function formatPow2(x, digits = 3) {
  x = Number(x);
  if (x === 0 || !Number.isFinite(x)) return formatNumber(x);
  const sign = x < 0 ? "-" : "";
  const a = Math.abs(x);
  const dec = formatNumber(a, digits);
  const rel = Number(dec) === a ? "=" : "≈";
  const [frac, e] = frexp(a);
  if (frac === 0.5) return `${sign}2^${e - 1} ${rel} ${sign}${dec}`;
  const rest = 2.0 - 2.0 * frac; // exact, in (0, 1)
  const [dfrac, de] = frexp(rest);
  if (dfrac === 0.5 && de - 1 <= -2) return `${sign}(2 - 2^${de - 1})·2^${e - 1} ${rel} ${sign}${dec}`;
  const l = log2(a);
  const shown = Math.abs(l) >= 0.005 ? formatFixed(l, 2) : formatG(l, 2);
  return `${sign}${dec} ≈ ${sign}2^${shown}`;
}

/** "2^-24" for a power of two, else the short decimal (text.py's _pow2_short). */
export function pow2Short(x) {
  x = Number(x);
  if (x > 0 && x < Infinity) {  // a negative x has a negative fraction: never 0.5
    const [frac, e] = frexp(x);
    if (frac === 0.5) return `2^${e - 1}`;
  }
  return formatNumber(x);
}

// ----------------------------------------------------------------- formats.py
/** The format of formats.mjs that fmt is or names; a TypeError naming the formats otherwise. */
export function formatOf(fmt) {
  const f = typeof fmt === "string" ? FORMATS[fmt] : fmt;
  if (!f || !FORMATS[f.name]) throw new TypeError(`fmt must be one of ${Object.keys(FORMATS).join(", ")}, not ${String(fmt)}`);
  return f;
}

/** Whether the format has subnormals, and a sign and a zero (E8M0, powers of two only, has none). */
function hasSubnormals(f) {
  return f.kind !== "e8m0";
}

/** Each band's magnitude edges [lo, hi] (formats.py's band_edges). */
export function bandEdges(fmt) {
  const f = formatOf(fmt);
  const sub = hasSubnormals(f) ? [f.underflowBoundary, f.smallestNormal] : [f.underflowBoundary, f.underflowBoundary];
  return {
    underflow: [0, f.underflowBoundary],
    subnormal: sub,
    normal: [sub[1], f.overflowBoundary],
    overflow: [f.overflowBoundary, Infinity],
  };
}

/** What a cast does in a band, as its hover says (formats.py's _band_hover). */
export function bandHover(fmt, category) {
  const f = formatOf(fmt), name = f.name, p2 = formatPow2, num = formatNumber;
  if (category === "underflow") {
    if (!hasSubnormals(f)) {
      return `${name} underflow: 0 < |x| ≤ ${p2(f.underflowBoundary)} becomes its smallest value ${p2(f.smallestNormal)} (no zero)`;
    }
    return `${name} underflow: 0 < |x| ≤ ${p2(f.underflowBoundary)} becomes 0`;
  }
  if (category === "subnormal" && !hasSubnormals(f)) return `${name} has no subnormals: every value is a power of two`;
  if (category === "normal" && !hasSubnormals(f)) {
    return `${name}: ${p2(f.underflowBoundary)} < |x| < ${num(f.overflowBoundary)} rounds to a power of two<br>`
      + `${p2(f.smallestNormal)} … ${p2(f.max)}, no sign, no mantissa`;
  }
  if (category === "subnormal") {
    return `${name} subnormal: ${p2(f.underflowBoundary)} < |x| < ${p2(f.smallestNormal)}<br>grid spacing `
      + `${p2(f.smallestSubnormal)} (the smallest subnormal), fewer than ${f.mantissaBits + 1} significant bits`;
  }
  if (category === "normal") {
    return `${name} normal: ${p2(f.smallestNormal)} ≤ |x| < ${num(f.overflowBoundary)}<br>max ${p2(f.max)}, `
      + `${f.mantissaBits + 1} significant bits`;
  }
  if (f.kind === "fn") {
    return `${name} overflow: |x| > ${num(f.overflowBoundary)} saturates to max = ${num(f.max)} (no inf)<br>`
      + "in torch's cast and CUDA's saturating one; ml_dtypes' cast gives NaN";
  }
  if (f.kind === "finite") {
    return `${name} overflow: |x| ≥ ${num(f.overflowBoundary)} saturates to max = ${num(f.max)}<br>`
      + "no inf and no NaN: every pattern is a number";
  }
  if (f.kind === "fnuz" || f.kind === "e8m0") {
    return `${name} overflow: |x| ≥ ${num(f.overflowBoundary)} becomes NaN (no inf)<br>in torch's and ml_dtypes' `
      + `casts; a saturating cast gives max = ${num(f.max)}`;
  }
  return `${name} overflow: |x| ≥ ${num(f.overflowBoundary)} becomes inf`;
}

/** What a cast does below the format's range, in a few words (formats.py's _past_min). */
export function pastMin(fmt) {
  const f = formatOf(fmt);
  return hasSubnormals(f) ? "becomes 0" : `becomes ${pow2Short(f.smallestNormal)}`;
}

/** What a cast does past the format's range, in a few words (formats.py's _past_max). */
export function pastMax(fmt) {
  const f = formatOf(fmt);
  if (f.kind === "fn") return `saturates to ${formatNumber(f.max)} (ml_dtypes: NaN)`;
  if (f.kind === "finite") return `saturates to max ${formatNumber(f.max)}`;
  if (f.kind === "fnuz" || f.kind === "e8m0") return "becomes NaN";
  return "becomes inf";
}

/** An x range (log2 units) holding every band edge of the formats (a list) plus a margin, its ends
 *  multiples of step (formats.py's _log2_window; whole numbers, as Python's ints: never -0). */
export function log2Window(fmts, margin = 5.0, step = 10) {
  const fs = fmts.map(formatOf);
  const lo = Math.min(...fs.map((f) => log2(f.underflowBoundary))) - margin;
  const hi = Math.max(...fs.map((f) => log2(f.overflowBoundary))) + margin;
  return [Math.floor(lo / step) * step + 0, Math.ceil(hi / step) * step + 0];
}
