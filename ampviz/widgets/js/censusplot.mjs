// RangeExplorer's figure, readout and scale label in the browser: the same data, layout and text as
// ampviz.plots.plot_census and RangeExplorer, exactly.
//
// A port of ampviz/plots/census.py (plot_census, census_x_range, _count_label, SMALL_BAR_KEY), of
// what it calls in ampviz/plots/formats.py (band_edges, the band hovers, _past_max, _log2_window)
// and ampviz/plots/text.py (format_pow2, format_share, format_shares, _pow2_short), the colours of
// ampviz/plots/style.py, and RangeExplorer's readout, swatches, title and scale label
// (ampviz/widgets/range_explorer.py). A census is {fmt, scale, total, counts, log2Bins, log2Counts}
// (census.mjs's, with the format's name).
//
// Exact where Python is: log2 is scaleplot.mjs's correctly rounded one (every constant a census
// figure takes the log2 of is a power of two or a format's max or overflow boundary, where the C
// library's log2 is correctly rounded too); Python's "{:.3g}" and "{:.2f}" round the exact decimal
// value of a double half to even (toPrecision and toFixed round ties up), so both are done here on
// the exact decimal digits; "{:,}" is written digit by digit.

import { FORMATS, frexpExponent, ldexp } from "./formats.mjs";
import { formatG, formatNumber, log2Scale } from "./scaleplot.mjs";

// ----------------------------------------------------------------- constants (style.py, census.py)
/** Each category's colour (style.py's CATEGORY_COLORS). */
export const CATEGORY_COLORS = Object.freeze({
  zero: "#999999", underflow: "#0072B2", subnormal: "#56B4E9", normal: "#009E73", overflow: "#D55E00",
  nan: "#CC79A7",
});

/** The census's categories, in ampviz.formats.CATEGORIES' order. */
export const CATEGORIES = Object.freeze(["zero", "underflow", "subnormal", "normal", "overflow", "nan"]);

/** The categories drawn as bands on the axis (style.py's BAND_CATEGORIES). */
export const BAND_CATEGORIES = Object.freeze(["underflow", "subnormal", "normal", "overflow"]);

/** How opaque the bands are drawn (style.py's BAND_OPACITY), and as Python's str() writes it. */
export const BAND_OPACITY = 0.18;
const BAND_OPACITY_TEXT = "0.18";

/** What a mark on the axis stands for (census.py's SMALL_BAR_KEY). */
export const SMALL_BAR_KEY = "a bar too short to see (hover it for its count)";
const SMALL_BAR_HOVER = "a bar too short to see at this height, not values beyond the axis";
const SMALL_BAR = 0.015; // a bar shorter than this share of the tallest gets a mark on the axis
const HEADROOM = 1.45; // the count axis reaches this many times the tallest bar
const MARGIN_PX = { l: 60, r: 30 };
const PLOT_PX = 560; // the narrowest plot area the band labels are placed for

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

/** log2 of a finite x > 0, correctly rounded (exact for powers of two). */
export function log2(x) {
  return log2Scale([x])[0];
}

/** [frac, e] with x = frac * 2**e, frac in [0.5, 1) (Python's math.frexp), for finite x > 0. */
function frexp(x) {
  const e = frexpExponent(x);
  return [ldexp(x, -e), e];
}

/** The exact decimal digits of a finite a > 0: a = digits * 10^exp10, exp10 <= 0. */
function exactDecimal(a) {
  F64[0] = a;
  const biased = (U32[1] >>> 20) & 0x7ff;
  let m = (BigInt(U32[1] & 0xfffff) << 32n) | BigInt(U32[0]);
  let e = -1074;
  if (biased > 0) { m |= 1n << 52n; e = biased - 1075; }
  if (e >= 0) return { digits: m << BigInt(e), exp10: 0 };
  return { digits: m * 5n ** BigInt(-e), exp10: e };
}

/** x as Python's "{:.<p>f}" writes a finite float: the exact value rounded to p decimals, ties to even. */
export function formatFixed(x, p = 2) {
  F64[0] = x;
  const sign = U32[1] >>> 31 ? "-" : "";
  const a = Math.abs(x);
  let n = 0n; // round(a * 10^p)
  if (a > 0) {
    const { digits, exp10 } = exactDecimal(a);
    const shift = exp10 + p;
    if (shift >= 0) n = digits * 10n ** BigInt(shift);
    else {
      const d = 10n ** BigInt(-shift), q = digits / d, r2 = 2n * (digits % d);
      n = r2 > d || (r2 === d && q % 2n === 1n) ? q + 1n : q;
    }
  }
  const text = n.toString().padStart(p + 1, "0");
  return sign + (p ? `${text.slice(0, text.length - p)}.${text.slice(text.length - p)}` : text);
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
  const rest = 2.0 - 2.0 * frac;
  if (rest > 0) {
    const [dfrac, de] = frexp(rest);
    if (dfrac === 0.5 && de - 1 <= -2) return `${sign}(2 - 2^${de - 1})·2^${e - 1} ${rel} ${sign}${dec}`;
  }
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

/** A share as a percentage with 3 significant digits (text.py's format_share): never a nonzero
 *  share as 0% or a share below one as 100% ("<0.01%", ">99.9%"). */
export function formatShare(fraction) {
  fraction = Number(fraction);
  if (fraction <= 0) return "0%";
  if (fraction >= 1) return "100%";
  const pct = 100.0 * fraction;
  if (pct < 0.01) return "<0.01%";
  const text = formatG(pct, 3);
  return Number(text) >= 100 ? ">99.9%" : `${text}%`;
}

/** A census's share of each category: count / max(total, 1) (CensusResult.fractions). */
export function fractions(result) {
  const n = Math.max(result.total, 1);
  return Object.fromEntries(CATEGORIES.map((k) => [k, result.counts[k] / n]));
}

/** The categories a census's shares name: the four bands, and zero and nan when it has some. */
function shownCategories(result) {
  return CATEGORIES.filter((k) => BAND_CATEGORIES.includes(k) || result.counts[k]);
}

/** The shares of a census on one line (text.py's format_shares). */
export function formatShares(result) {
  const f = fractions(result);
  return shownCategories(result).map((k) => `${k} ${formatShare(f[k])}`).join(" · ");
}

/** "1 value" / "1,000 values" (census.py's _count_label). */
export function countLabel(n) {
  return `${withCommas(n)} value` + (n === 1 ? "" : "s");
}

// ----------------------------------------------------------------- formats.py
function formatOf(fmt) {
  const f = typeof fmt === "string" ? FORMATS[fmt] : fmt;
  if (!f || !FORMATS[f.name]) throw new TypeError(`fmt must be one of ${Object.keys(FORMATS).join(", ")}, not ${String(fmt)}`);
  return f;
}

/** Whether the format has subnormals (E8M0, powers of two only, has none). */
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

/** What a cast does past the format's range, in a few words (formats.py's _past_max). */
export function pastMax(fmt) {
  const f = formatOf(fmt);
  if (f.kind === "fn") return `saturates to ${formatNumber(f.max)} (ml_dtypes: NaN)`;
  if (f.kind === "finite") return `saturates to max ${formatNumber(f.max)}`;
  if (f.kind === "fnuz" || f.kind === "e8m0") return "becomes NaN";
  return "becomes inf";
}

/** An x range (log2 units) holding every band edge of the formats plus a margin (formats.py's _log2_window). */
export function log2Window(fmts, margin = 5.0, step = 10) {
  const fs = fmts.map(formatOf);
  const lo = Math.min(...fs.map((f) => log2(f.underflowBoundary))) - margin;
  const hi = Math.max(...fs.map((f) => log2(f.overflowBoundary))) + margin;
  return [Math.floor(lo / step) * step, Math.ceil(hi / step) * step];
}

// ----------------------------------------------------------------- census.py
/** The x range plot_census uses (census.py's census_x_range): the format's band edges plus 10
 *  binades each side, widened to hold the bins log2Lo .. log2Hi plus one binade. */
export function censusXRange(fmt, log2Lo = null, log2Hi = null) {
  let [lo, hi] = log2Window([fmt], 10.0, 1);
  if (log2Lo !== null && log2Lo !== undefined) lo = Math.min(lo, Math.trunc(log2Lo) - 1);
  if (log2Hi !== null && log2Hi !== undefined) hi = Math.max(hi, Math.trunc(log2Hi) + 2);
  return [lo, hi];
}

/** About how wide text (lines split by "<br>") is drawn at font size, in pixels (census.py's _text_px). */
function textPx(text, size = 11) {
  const longest = Math.max(0, ...text.split("<br>").map((line) => [...line].length));
  return longest * 0.62 * size + 8;
}

/** The band each binade's bar is drawn in: the band of its middle (np.select in plot_census). */
function barCategory(mid, f) {
  if (mid <= log2(f.underflowBoundary)) return "underflow";
  if (mid < log2(f.smallestNormal)) return "subnormal";
  if (mid < log2(f.overflowBoundary)) return "normal";
  return "overflow";
}

/** The census figure (census.py's plot_census) of a census: data and layout as plotly.py's
 *  to_plotly_json gives them, arrays as Float64Arrays. Options as plot_census takes them:
 *  title (null: the default), xRange ([lo, hi], null: from the format and the bins), legend and
 *  shares (booleans); template: the plotly template object to put in the layout (plotly.py fills
 *  in the one named, "plotly_white"; left out when not given). */
export function plotCensus(result, { title = null, xRange = null, legend = true, shares = true, template = undefined } = {}) {
  if (title !== null && typeof title !== "string") throw new TypeError(`title must be a string (or null), got ${typeof title}`);
  if (typeof legend !== "boolean") throw new TypeError(`legend must be true or false, got ${legend}`);
  if (typeof shares !== "boolean") throw new TypeError(`shares must be true or false, got ${shares}`);
  const f = formatOf(result.fmt);
  const bins = Array.from(result.log2Bins, Number), counts = Array.from(result.log2Counts, Number);
  if (xRange !== null) {
    const [a, b] = Array.from(xRange, Number);
    if (!(Number.isFinite(a) && Number.isFinite(b) && a < b)) {
      throw new RangeError(`xRange must be two finite numbers, lowest first, got ${xRange}`);
    }
  } else {
    xRange = bins.length ? censusXRange(f, Math.min(...bins), Math.max(...bins)) : censusXRange(f);
  }
  const loX = Number(xRange[0]), hiX = Number(xRange[1]);
  const share = fractions(result);

  const edges = bandEdges(f);
  const shapes = BAND_CATEGORIES.map((cat) => {
    const [lo, hi] = edges[cat];
    const x0 = lo === 0 ? loX : Math.max(log2(lo), loX);
    const x1 = hi === Infinity ? hiX : Math.min(log2(hi), hiX);
    return { type: "rect", name: cat, xref: "x", yref: "paper", x0, x1: Math.max(x0, x1), y0: 0, y1: 1,
      fillcolor: CATEGORY_COLORS[cat], opacity: BAND_OPACITY, line: { width: 0 }, layer: "below", showlegend: legend,
      legendgroup: cat };
  });
  const annotations = [];
  [["smallest_subnormal", "smallest subnormal", f.smallestSubnormal], ["smallest_normal", "smallest normal", f.smallestNormal],
    ["max", "max", f.max]].forEach(([name, label, v], i) => {
    const x = log2(v), isMax = name === "max";
    shapes.push({ type: "line", name, xref: "x", yref: "paper", x0: x, x1: x, y0: 0, y1: 1,
      line: { color: "#555555", width: 1, dash: "dot" } });
    annotations.push({ name, x, xref: "x", y: i !== 1 ? 0.98 : 0.84, yref: "paper", xanchor: isMax ? "right" : "left",
      yanchor: "top", xshift: isMax ? -3 : 3, bgcolor: "rgba(255,255,255,0.75)", showarrow: false,
      align: isMax ? "right" : "left", font: { size: 11, color: "#333333" }, text: `${pow2Short(v)}<br>${label}`,
      hovertext: `${f.name} ${label}: ${formatPow2(v)}` });
  });
  // the outer bands' words at their inner edge, or against the plot's edge where the band is too narrow
  for (let [cat, text, x, side] of [["underflow", "becomes 0", log2(f.underflowBoundary), "right"],
    ["overflow", pastMax(f).replace(" (", "<br>("), log2(f.overflowBoundary), "left"]]) {
    const room = (side === "right" ? x - loX : hiX - x) / (hiX - loX) * PLOT_PX
      + (side === "right" ? MARGIN_PX.l : MARGIN_PX.r);
    if (room < textPx(text)) [x, side] = side === "right" ? [loX, "left"] : [hiX, "right"];
    annotations.push({ name: `${cat}-band`, x, xref: "x", y: 0.84, yref: "paper", xanchor: side, yanchor: "top",
      xshift: side === "left" ? 3 : -3, align: side, bgcolor: "rgba(255,255,255,0.75)", showarrow: false,
      font: { size: 11, color: CATEGORY_COLORS[cat] }, text, hovertext: bandHover(f, cat) });
  }
  const shareLine = formatShares(result);
  const counted = shares ? BAND_CATEGORIES.filter((k) => share[k] > 0 && share[k] < 0.01)
    .map((k) => `${k} ${countLabel(result.counts[k])}`).join(" · ") : "";
  if (shares) {
    annotations.push({ name: "shares", x: 0, xref: "paper", y: 1.0, yref: "paper", xanchor: "left", yanchor: "bottom",
      yshift: 4, showarrow: false, font: { size: 13 }, align: "left",
      text: shareLine + (counted ? `<br><span style='font-size:11px'>(${counted})</span>` : "") });
  }

  const n = Math.max(result.total, 1);
  const hover = bins.map((e, i) => `2^${e} ≤ |v·scale| < 2^${e + 1}<br>${withCommas(counts[i])} values (${formatShare(counts[i] / n)})`);
  const mids = Float64Array.from(bins, (e) => e + 0.5);
  const cats = Array.from(mids, (m) => barCategory(m, f));
  const tallest = counts.length ? Math.max(...counts) : 0;
  const small = counts.map((c) => c > 0 && c < SMALL_BAR * tallest);
  const data = [{
    type: "bar", name: "values × scale", x: mids, y: Float64Array.from(counts), width: 1.0, opacity: 0,
    marker: { color: "#000000", line: { width: 0 } }, hovertext: hover, hoverinfo: "text",
    hoverlabel: { bgcolor: "#ffffff", bordercolor: "#555555", font: { color: "#222222" } }, showlegend: false,
    meta: { kind: "counts" },
  }];
  for (const cat of BAND_CATEGORIES) {
    // the band's bars as one outline: left foot, left top, right top, right foot, then a gap (NaN)
    const xs = [], ys = [];
    bins.forEach((e, i) => {
      if (cats[i] !== cat) return;
      if (xs.length) { xs.push(NaN); ys.push(NaN); }
      xs.push(e, e, e + 1, e + 1);
      ys.push(0, counts[i], counts[i], 0);
    });
    data.push({ type: "scatter", name: `${cat} bars`, x: Float64Array.from(xs), y: Float64Array.from(ys), mode: "lines",
      fill: "toself", fillcolor: CATEGORY_COLORS[cat], line: { width: 1, color: "rgba(0,0,0,0.55)" },
      hoverinfo: "skip", showlegend: false, meta: { kind: "bars", band: cat } });
  }
  for (const cat of BAND_CATEGORIES) {
    const mine = bins.map((_, i) => small[i] && cats[i] === cat);
    const xs = mids.filter((_, i) => mine[i]);
    data.push({ type: "scatter", name: `few ${cat} values`, x: xs, y: new Float64Array(xs.length), mode: "markers",
      marker: { symbol: "triangle-up", size: 9, color: CATEGORY_COLORS[cat], line: { width: 1, color: "#333333" } },
      cliponaxis: false, hovertext: hover.filter((_, i) => mine[i]).map((h) => `▲ ${SMALL_BAR_HOVER}<br>${h}`),
      hoverinfo: "text", showlegend: false, meta: { kind: "few", band: cat } });
  }
  data.push({ type: "scatter", name: SMALL_BAR_KEY, x: Float64Array.of(NaN), y: Float64Array.of(NaN), mode: "markers",
    marker: { symbol: "triangle-up", size: 9, color: "#BBBBBB", line: { width: 1, color: "#333333" } },
    hoverinfo: "skip", showlegend: legend, legendrank: 1001, meta: { kind: "few-key" } });
  if (title === null) title = `${countLabel(result.total)} in ${f.name} at scale = ${formatPow2(result.scale)}`;
  const layout = {
    title: { text: title, x: 0.01, y: 0.97, yanchor: "top" },
    shapes,
    annotations,
    bargap: 0,
    height: (legend ? 420 : 380) - (shares ? 0 : 30),
    margin: { ...MARGIN_PX, t: shares ? (counted ? 100 : 90) : 60, b: legend ? 100 : 60 },
    legend: { orientation: "h", x: 0.01, y: 0, yref: "container", yanchor: "bottom" },
    showlegend: legend,
    hovermode: "closest",
    meta: { fmt: f.name, scale: result.scale, total: result.total, counts: { ...result.counts }, fractions: share,
      shares: shareLine },
    xaxis: { range: [loX, hiX], title: { text: "|value × scale| on a log2 axis" }, tickprefix: "2^", zeroline: false,
      ticklabeloverflow: "allow", type: "linear" },
    yaxis: { title: { text: "values per binade" }, range: [0, HEADROOM * Math.max(tallest, 1)], tickformat: ",",
      ...(tallest <= 5 ? { dtick: 1 } : {}), ticklabeloverflow: "allow", type: "linear" },
  };
  if (template !== undefined) layout.template = template;
  return { data, layout };
}

// ----------------------------------------------------------------- RangeExplorer
/** A band's colour as the census figure fills it (RangeExplorer's _swatch). */
export function swatch(category) {
  return '<span class="ampviz-swatch" style="display:inline-block;width:0.9em;height:0.9em;margin-right:0.3em;'
    + `vertical-align:-0.1em;background:${CATEGORY_COLORS[category]};opacity:${BAND_OPACITY_TEXT}"></span>`;
}

/** RangeExplorer's readout (_readout_html): each category's swatch, name, share and count, and
 *  what the marks on the axis stand for. */
export function readoutHtml(result) {
  const share = fractions(result);
  const cells = shownCategories(result).map((k) => '<span style="margin-right:1.2em">'
    + (BAND_CATEGORIES.includes(k) ? swatch(k) : "") + `<b style="color:${CATEGORY_COLORS[k]}">${k}</b> `
    + `${formatShare(share[k])} <small>(${withCommas(result.counts[k])})</small></span>`).join("");
  const key = `<div class="ampviz-census-marks"><small>▲ on the axis: ${escapeHtml(SMALL_BAR_KEY)}</small></div>`;
  return `<div>${cells}<small>of ${withCommas(result.total)} values</small></div>${key}`;
}

/** The label beside RangeExplorer's slider: "scale = 2^16 = 65536". */
export function scaleLabel(scale) {
  return `scale = ${escapeHtml(formatPow2(scale))}`;
}

/** RangeExplorer's figure title: "84,608 values × the scale above, in fp16". */
export function rangeExplorerTitle(total, fmt) {
  return `${countLabel(total)} × the scale above, in ${fmt}`;
}

/** RangeExplorer's figure of a census (its legend and shares left out: the readout keys it), over
 *  the x range its slider's reach gives. */
export function rangeExplorerFigure(result, xRange, template = undefined) {
  return plotCensus(result, { xRange, legend: false, shares: false, title: rangeExplorerTitle(result.total, result.fmt),
    template });
}
