// RangeExplorer's figure, readout and scale label in the browser: the same data, layout and text as
// ampviz.plots.plot_census and RangeExplorer, exactly.
//
// A port of ampviz/plots/census.py (plot_census, census_x_range, _count_label, SMALL_BAR_KEY), of
// ampviz/plots/text.py's format_share and format_shares, the band opacity of ampviz/plots/style.py,
// and RangeExplorer's readout, swatches, title and scale label (ampviz/widgets/range_explorer.py);
// what it calls of ampviz/plots/formats.py and text.py (band_edges, the band hovers, _past_max,
// _log2_window, format_pow2, _pow2_short) and the colours are plottext.mjs's, exported here too. A
// census is {fmt, scale, total, counts, log2Bins, log2Counts} (census.mjs's, with the format's name).
//
// Exact where Python is: log2 is scaleplot.mjs's correctly rounded one (every constant a census
// figure takes the log2 of is a power of two or a format's max or overflow boundary, where the C
// library's log2 is correctly rounded too); Python's "{:.3g}" and "{:.2f}" round the exact decimal
// value of a double half to even (toPrecision and toFixed round ties up), so both are done on the
// exact decimal digits (scaleplot.mjs's formatG, plottext.mjs's formatFixed); "{:,}" is written
// digit by digit.

import { BAND_CATEGORIES, CATEGORY_COLORS, bandEdges, bandHover, escapeHtml, formatFixed, formatOf } from "./plottext.mjs";
import { formatPow2, log2, log2Window, pastMax, pow2Short, withCommas } from "./plottext.mjs";
import { formatG } from "./scaleplot.mjs";

export { BAND_CATEGORIES, CATEGORY_COLORS, bandEdges, bandHover, escapeHtml, formatFixed, formatPow2, log2, log2Window,
  pastMax, pow2Short, withCommas };

// ----------------------------------------------------------------- constants (style.py, census.py)
/** The census's categories, in ampviz.formats.CATEGORIES' order. */
export const CATEGORIES = Object.freeze(["zero", "underflow", "subnormal", "normal", "overflow", "nan"]);

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

// ----------------------------------------------------------------- text.py
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
  const hover = bins.map((e, i) => `2^${e} ≤ |v·scale| < 2^${e + 1}<br>${countLabel(counts[i])} (${formatShare(counts[i] / n)})`);
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
  return `<div>${cells}<small>of ${countLabel(result.total)}</small></div>${key}`;
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
