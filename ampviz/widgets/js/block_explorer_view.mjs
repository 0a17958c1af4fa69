// BrowserBlockExplorer's front end: BlockExplorer's controls, readout and figure, computed in the
// page. The row's block scaling is blocks.mjs's (ampviz.formats.blocks, bit for bit), the figure,
// title and readout blockplot.mjs's (plot_blocks and BlockExplorer's). The settings are the
// model's synced state: a move sets them (Python reads them), and a setting changed from Python
// moves the controls. With no kernel (a static page) the model is the page's own.
//
// The rows are numpy's random draws, shipped by Python per seed (``rows``): the normal row holds 1
// at the outlier's place, where the page writes 2^k as BlockExplorer's make_row does. A seed whose
// rows the page lacks is sent to the model at once; Python then ships its rows, and the page draws
// them when they arrive (until then the message says so and the last figure stays).

import { pow2 } from "./formats.mjs";
import { mxQuantize, nvfp4Quantize } from "./blocks.mjs";
import { explorerTitle, hadamardTransform, inColumn, plotBlocks, readoutHtml } from "./blockplot.mjs";
import { withCommas } from "./censusplot.mjs";
import { bytesOf } from "./figure.mjs";
import { explorerPage, followModel, mover, readoutFirst, row, slider } from "./view_parts.mjs";

export const SETTINGS = ["scheme", "block_size", "rounding", "per_tensor_scale", "data", "log2_outlier", "hadamard",
  "seed"];

/** The explorer's shipped data from the model's state: the rows per seed (decoded when first
 *  used), the transform's matrix, the controls' choices and ends, plotly's template. */
export function shippedData(get) {
  return {
    n: get("n"), outlierAt: get("outlier_at"), rows: get("rows"), decoded: new Map(),
    matrix: Float64Array.from(get("hadamard_matrix")), schemes: get("schemes"), datas: get("datas"),
    blockSizes: get("block_sizes"), roundings: get("roundings"), lo: get("log2_outlier_min"),
    hi: get("log2_outlier_max"), maxSeed: get("max_seed"), template: get("template"),
  };
}

/** A value as BlockExplorer's messages show it: a string quoted, anything else as it reads. */
function shown(v) {
  return typeof v === "string" ? `'${v}'` : v === true ? "True" : v === false ? "False" : v === null ? "None" : String(v);
}

function whole(name, v, lo, hi) {
  if (!Number.isInteger(v)) throw new TypeError(`${name} must be a whole number, got ${shown(v)}`);
  if (v < lo || v > hi) throw new RangeError(`${name} must be between ${withCommas(lo)} and ${withCommas(hi)}, got ${withCommas(v)}`);
}

/** The settings checked, in BlockExplorer's words (the page's controls give only good ones; a
 *  setting from elsewhere may not). */
export function checkSettings(data, s) {
  const oneOf = (name, v, values) => {
    if (!values.includes(v)) throw new RangeError(`${name} must be one of ${values.map(shown).join(", ")}, got ${shown(v)}`);
  };
  oneOf("scheme", s.scheme, data.schemes.map(([, v]) => v));
  if (!data.blockSizes.includes(s.block_size)) throw new RangeError(`block_size must be 16 or 32, got ${shown(s.block_size)}`);
  oneOf("rounding", s.rounding, data.roundings);
  for (const name of ["per_tensor_scale", "hadamard"]) {
    if (typeof s[name] !== "boolean") throw new TypeError(`${name} must be True or False, got ${shown(s[name])}`);
  }
  oneOf("data", s.data, data.datas.map(([, v]) => v));
  whole("log2_outlier", s.log2_outlier, data.lo, data.hi);
  whole("seed", s.seed, 0, data.maxSeed);
}

/** The row before any transform (BlockExplorer's make_row), from the rows Python shipped: a
 *  Float32Array. Throws when the seed's rows have not come. */
export function dataRow(data, kind, seed, log2Outlier) {
  const key = String(seed);
  if (!data.decoded.has(key)) {
    const shipped = data.rows[key];
    if (!shipped) {
      throw new Error(`seed ${seed}: its row is numpy's random draws, which Python sends; this page has the rows of ` +
        `seeds ${Object.keys(data.rows).join(", ")} (with a kernel, the new seed's row follows in a moment)`);
    }
    const decoded = {};
    for (const [k, b64] of Object.entries(shipped)) {
      const bytes = bytesOf(b64);
      decoded[k] = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
    }
    data.decoded.set(key, decoded);
  }
  const x = Float32Array.from(data.decoded.get(key)[kind]);
  if (kind === "normal") x[data.outlierAt] = pow2(log2Outlier);
  return x;
}

/** The row's block quantization at the settings (BlockExplorer.quantize): MX with the element
 *  format, block size and scale rule, or NVFP4 (blocks of 16) with or without its tensor scale. */
export function quantize(x, s) {
  return s.scheme === "nvfp4" ? nvfp4Quantize(x, s.per_tensor_scale) : mxQuantize(x, s.scheme, s.block_size, s.rounding);
}

/** Which controls act at these settings (BlockExplorer._enable): the MX block size and scale
 *  rounding not under NVFP4, the per-tensor scale only under NVFP4 (hidden under MX), the outlier
 *  only in the normal data. */
export function controlStates(s) {
  const nvfp4 = s.scheme === "nvfp4";
  return { blockDisabled: nvfp4, roundingDisabled: nvfp4, tensorScaleDisabled: !nvfp4, tensorScaleShown: nvfp4,
    outlierDisabled: s.data !== "normal" };
}

/** Everything the page shows for the settings: the row, the row quantized (transformed when
 *  asked), the quantization, the figure (its value axis held over the outlier slider's ends, as
 *  BlockExplorer holds it) and the readout. */
export function compute(data, s) {
  checkSettings(data, s);
  const row = dataRow(data, s.data, s.seed, s.log2_outlier);
  const quantized = (r) => {
    const x = s.hadamard ? hadamardTransform(r, data.matrix) : r;
    return [x, quantize(x, s)];
  };
  const [x, result] = quantized(row);
  const hold = s.data === "normal" ? [data.lo, data.hi].map((k) => quantized(dataRow(data, "normal", s.seed, k))) : [];
  const label = data.schemes.find(([, v]) => v === s.scheme)[0];
  const figure = plotBlocks(x, result, { title: explorerTitle(label, s, result), legendCounts: false, hold,
    template: data.template });
  return { row, x, result, figure, readout: inColumn(readoutHtml(row, x, result, figure.layout.meta, s.hadamard, data.matrix)) };
}

// ----- the controls -----
function select(cls, options) {
  const e = document.createElement("select");
  e.className = cls;
  for (const [label, value] of options) e.append(new Option(label, String(value)));
  return e;
}

function checkbox(cls, text) {
  const wrap = document.createElement("label");
  wrap.className = `ampviz-browser-row ${cls}`;
  wrap.style.cssText = "display:flex;align-items:center;gap:6px;margin:4px 0 4px 118px";
  const box = document.createElement("input");
  box.type = "checkbox";
  wrap.append(box, text);
  return [wrap, box];
}

export default {
  render({ model, el }) {
    const { column, figure, message, remove } = explorerPage(el, "ampviz-browser-block-explorer", "ampviz-blocks-figure");
    const data = shippedData((k) => model.get(k));
    const scheme = select("ampviz-blocks-scheme", data.schemes);
    scheme.style.width = "230px";
    const block = select("ampviz-blocks-block-size", data.blockSizes.map((b) => [String(b), b]));
    const rounding = select("ampviz-blocks-rounding", data.roundings.map((r) => [r, r]));
    const [tensorRow, tensorBox] = checkbox("ampviz-blocks-tensor-scale", "NVFP4 per-tensor scale");
    const dataSelect = select("ampviz-blocks-data", data.datas);
    dataSelect.style.width = "230px";
    const outlier = slider("ampviz-blocks-outlier", data.lo, data.hi, 1);
    const outlierShown = document.createElement("span");
    outlierShown.className = "ampviz-blocks-outlier-value";
    const seed = document.createElement("input");
    Object.assign(seed, { type: "number", min: "0", max: String(data.maxSeed), step: "1", className: "ampviz-blocks-seed" });
    seed.style.width = "120px";
    const [hadamardRow, hadamardBox] = checkbox("ampviz-blocks-hadamard", "random Hadamard transform (16)");
    const readout = document.createElement("div");
    readout.className = "ampviz-blocks-readout";
    column.append(row("scheme", scheme), row("MX block size", block), row("MX scale", rounding), tensorRow,
      row("data", dataSelect), row("log2 outlier", outlier, outlierShown), row("seed", seed), hadamardRow, message,
      readout);

    // the page's settings: the model's, until a control moves
    const settings = Object.fromEntries(SETTINGS.map((k) => [k, model.get(k)]));
    const showSettings = () => {
      scheme.value = settings.scheme;
      block.value = String(settings.block_size);
      rounding.value = settings.rounding;
      tensorBox.checked = settings.per_tensor_scale;
      dataSelect.value = settings.data;
      outlier.value = String(settings.log2_outlier);
      outlierShown.textContent = String(settings.log2_outlier);
      if (document.activeElement !== seed || Number(seed.value) !== settings.seed) seed.value = String(settings.seed);
      hadamardBox.checked = settings.hadamard;
      const on = controlStates(settings);
      block.disabled = on.blockDisabled;
      rounding.disabled = on.roundingDisabled;
      tensorBox.disabled = on.tensorScaleDisabled;
      tensorRow.style.display = on.tensorScaleShown ? "flex" : "none";
      outlier.disabled = on.outlierDisabled;
    };
    // the readout follows every move at once; plotly's draw follows when it is free
    const { refresh, schedule, stop } = readoutFirst(model, figure, message,
      () => ({ settings: { ...settings }, result: compute(data, settings) }),
      (result) => { readout.innerHTML = result.readout; });
    const redraw = () => { showSettings(); refresh(); schedule(); };
    const moved = mover(model, settings, redraw);
    scheme.addEventListener("change", () => moved("scheme", scheme.value));
    block.addEventListener("change", () => moved("block_size", Number(block.value)));
    rounding.addEventListener("change", () => moved("rounding", rounding.value));
    tensorBox.addEventListener("change", () => moved("per_tensor_scale", tensorBox.checked));
    dataSelect.addEventListener("change", () => moved("data", dataSelect.value));
    outlier.addEventListener("input", () => moved("log2_outlier", Math.round(Number(outlier.value))));
    hadamardBox.addEventListener("change", () => moved("hadamard", hadamardBox.checked));
    seed.addEventListener("input", () => {
      const text = seed.value.trim(), v = Number(text);
      if (text !== "" && Number.isInteger(v) && v >= 0 && v <= data.maxSeed) moved("seed", v);
      else message.textContent = `seed must be between 0 and ${withCommas(data.maxSeed)}, got ${text || "nothing"}`;
    });
    seed.addEventListener("change", () => { seed.value = String(settings.seed); }); // on leaving: the seed in use
    // a setting changed from Python
    // a new seed's rows, shipped by Python
    const unfollow = followModel(model, SETTINGS, settings, redraw,
      { rows: (r) => { data.rows = r; refresh(); schedule(); } });
    showSettings();
    refresh();
    schedule();
    return () => {
      stop();
      remove();
      unfollow();
    };
  },
};
