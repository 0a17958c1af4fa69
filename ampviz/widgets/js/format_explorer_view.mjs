// BrowserFormatExplorer's front end: FormatExplorer's controls, readout and figure, computed in the
// page. The format's casts and patterns are formats.mjs's, the readout, the figure and the parsing of
// what a learner types are valueplot.mjs's, all equal to the Python package. The settings (fmt, bits,
// typed) are the model's synced state: a move sets them (Python reads them), and a setting changed
// from Python moves the controls. With no kernel (a static page) the model is the page's own.
//
// FormatExplorer's rules hold: a typed number stays typed (the box keeps the text, "2^-24" too) and
// the bits are its cast; a new format casts it (or the stored value) again; bits set directly (a
// click, the bit-pattern box, the slider) leave no typed number, and the box shows the stored value.
//
// The slider walks the format's bit patterns in order, 0 to 2^bits - 1, for a format of at most 16
// bits: a drag moves through +0, the subnormals, the normals, inf and the NaNs, then the same
// negative. A wider format (fp32, tf32) would put thousands of patterns under each pixel, so its
// slider walks the top 16 bits with the others 0 (in fp32, the bf16 values; in tf32, its patterns
// with the last 3 mantissa bits 0); the buttons and the boxes still reach every pattern.

import { FORMATS, decode } from "./formats.mjs";
import { FIELD_COLORS, FIELD_TINTS, bitsHtml, castTyped, categoryOf, checkBits, escapeHtml, fieldOf } from "./valueplot.mjs";
import { hexText, legendHtml, parseBits, plotValue, pyStrip, readNumber, readoutHtml, reprFloat } from "./valueplot.mjs";
import { drawLoop, keepKeys } from "./view_parts.mjs";

export const SETTINGS = ["fmt", "bits", "typed"];

/** The most bits the slider walks one pattern a step. */
export const SLIDER_BITS = 16;

function formatOf(name) {
  const f = FORMATS[name];
  if (!f) throw new RangeError(`unknown format ${String(name)}; choose one of ${Object.keys(FORMATS).join(", ")}`);
  return f;
}

/** The slider over fmt's patterns: {max, shift}: position p stands for pattern p * 2^shift. */
export function sliderScale(fmt) {
  const f = formatOf(fmt);
  const shift = Math.max(0, f.bits - SLIDER_BITS);
  return { max: 2 ** (f.bits - shift) - 1, shift };
}

/** The slider's position for a pattern (its top bits). */
export function sliderPosition(fmt, bits) {
  return Math.floor(bits / 2 ** sliderScale(fmt).shift);
}

/** The pattern at a slider position. */
export function sliderBits(fmt, position) {
  return position * 2 ** sliderScale(fmt).shift;
}

// ----------------------------------------------------------------- FormatExplorer's actions
// Each takes the settings {fmt, bits, typed} and returns new ones (or throws, in Python's words).

/** The typed number as {value, negative}, or null. */
function typedOf(state) {
  return state.typed === null || state.typed === undefined ? null : readNumber(state.typed);
}

/** A new format: the typed number (or the stored value) cast again (FormatExplorer.set_format). */
export function withFormat(state, name) {
  const old = formatOf(state.fmt), f = formatOf(name);
  let x = typedOf(state);
  if (x === null) {
    const value = decode(old, state.bits);
    // Python's decode gives a NaN its pattern's sign in an "ieee" or "fn" format, a positive NaN in the others
    const negative = Number.isNaN(value) ? (old.kind === "ieee" || old.kind === "fn") && state.bits >= 2 ** (old.bits - 1)
      : value < 0 || Object.is(value, -0);
    x = { value, negative };
  }
  return { ...state, fmt: f.name, bits: castTyped(f, x).bits };
}

/** A number typed: kept as typed (stripped), the bits its cast (FormatExplorer.set_decimal). */
export function withDecimal(state, text) {
  const x = readNumber(text);
  return { ...state, typed: pyStrip(text), bits: castTyped(formatOf(state.fmt), x).bits };
}

/** A bit pattern set directly: no typed number (FormatExplorer.set_bits). */
export function withBits(state, bits) {
  return { ...state, bits: checkBits(formatOf(state.fmt), bits), typed: null };
}

/** A bit flipped (FormatExplorer.toggle_bit). */
export function withToggle(state, position) {
  const f = formatOf(state.fmt);
  if (!(Number.isInteger(position) && position >= 0 && position < f.bits)) {
    throw new RangeError(`${f.name} has bits 0 to ${f.bits - 1}, not ${position}`);
  }
  const mask = 2 ** position;
  return withBits(state, Math.floor(state.bits / mask) % 2 ? state.bits - mask : state.bits + mask);
}

/** A pattern typed in the bit-pattern box ("0x3C00"). */
export function withHex(state, text) {
  return withBits(state, parseBits(text));
}

/** Everything the page shows for the settings (the model's state: fmt, bits, typed, and formats,
 *  the shipped labels and descriptions): the pattern, value, category, the boxes' texts, the
 *  buttons, the bits line, the legend, the readout, the slider's position and the figure. */
export function compute(state) {
  const f = formatOf(state.fmt);
  const bits = checkBits(f, state.bits);
  const typedText = state.typed === undefined ? null : state.typed;
  const typed = typedText === null ? null : readNumber(typedText).value;
  const value = decode(f, bits);
  const info = (state.formats || []).find((o) => o.name === f.name);
  const buttons = [];
  for (let j = 0; j < f.bits; j++) {
    const position = f.bits - 1 - j;
    const on = Math.floor(bits / 2 ** position) % 2 === 1;
    const field = fieldOf(f, position);
    buttons.push({ position, field, on, label: on ? "1" : "0", color: on ? FIELD_COLORS[field] : FIELD_TINTS[field] });
  }
  return {
    fmt: f.name, bits, value, typed, category: categoryOf(f, bits, typed),
    decimal: typedText !== null ? typedText : reprFloat(value),
    hex: hexText(f, bits),
    bitsHtml: bitsHtml(f, bits),
    legend: legendHtml(f, info ? info.description : ""),
    readout: readoutHtml(f, bits, typed),
    buttons,
    slider: { ...sliderScale(f.name), position: sliderPosition(f.name, bits) },
    figure: plotValue(f, value, typed),
  };
}

// ----------------------------------------------------------------- the page
function element(tag, className, css = "") {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (css) e.style.cssText = css;
  return e;
}

function labelled(text, input) {
  const wrap = element("label", "ampviz-browser-row",
    "display:inline-flex;align-items:center;gap:6px;margin:4px 12px 4px 0");
  wrap.append(text, input);
  return wrap;
}

export default {
  render({ model, el }) {
    el.classList.add("ampviz-browser-format-explorer");
    const top = element("div", "", "display:flex;flex-wrap:wrap;align-items:center");
    const dropdown = element("select", "ampviz-format-dropdown", "width:300px");
    const formats = model.get("formats") || Object.keys(FORMATS).map((name) => ({ name, label: name, description: "" }));
    for (const o of formats) dropdown.append(new Option(o.label, o.name));
    const decimal = element("input", "ampviz-decimal-input", "width:160px");
    Object.assign(decimal, { type: "text", placeholder: "0.1, 1e-8, 65519, 2^-24, nan", spellcheck: false });
    const hex = element("input", "ampviz-hex-input", "width:120px");
    Object.assign(hex, { type: "text", spellcheck: false });
    top.append(labelled("format", dropdown), labelled("decimal", decimal), labelled("bits (hex)", hex));
    const legend = element("div", "ampviz-field-legend", "margin:4px 0");
    const row = element("div", "ampviz-bits-row", "display:flex;flex-wrap:nowrap;align-items:center;margin:4px 0");
    const bitsLine = element("div", "ampviz-bits-readout", "margin:4px 0");
    const slider = element("input", "ampviz-bits-slider", "width:100%;max-width:736px");
    Object.assign(slider, { type: "range", min: "0", step: "1" });
    const sliderRow = element("div", "ampviz-slider-row", "display:flex;align-items:center;gap:8px;margin:4px 0");
    const sliderNote = element("span", "ampviz-slider-note", "color:#555;white-space:nowrap");
    sliderRow.append(slider, sliderNote);
    const message = element("div", "ampviz-message");
    const readout = element("div", "ampviz-format-readout", "line-height:1.35");
    const figure = element("div", "ampviz-format-figure", "width:100%;min-height:240px");
    el.append(top, legend, row, bitsLine, sliderRow, message, readout, figure);
    const dropKeys = keepKeys(el);

    let state = { fmt: model.get("fmt"), bits: model.get("bits"), typed: model.get("typed") ?? null };
    let shown = null; // the last compute(state)
    let buttons = [], buttonsFor = null;
    const showError = (text) => {
      message.innerHTML = text ? `<span style="color:#B00020;font-weight:600">⚠ ${escapeHtml(text)}</span>` : "";
    };

    const buildButtons = (f) => {
      row.replaceChildren();
      const [size, least] = f.bits <= 16 ? ["32px", "20px"] : ["22px", "10px"];
      buttons = [];
      for (let j = 0; j < f.bits; j++) {
        const position = f.bits - 1 - j, field = fieldOf(f, position);
        const b = element("button", `ampviz-bit-${position} ampviz-bit-${field}`,
          `flex:1 1 ${least};min-width:${least};max-width:${size};height:30px;padding:0;` +
          `margin:${size === "32px" ? "1px" : "0 1px 0 0"};border:1px solid #ccc;border-radius:2px;cursor:pointer` +
          (f.bits > 16 ? ";font-size:11px" : ""));
        b.type = "button";
        b.title = `bit ${position} (${field})`;
        b.addEventListener("click", () => act(() => withToggle(state, position)));
        buttons.push(b);
      }
      row.append(...buttons);
      buttonsFor = f.name;
    };

    const written = new WeakMap(); // what each element was last given (HTML, or a button's colour)
    // everything but the figure, at once; ``source``: the control the learner is using (left as it is)
    const show = (source = null) => {
      const r = compute({ ...state, formats });
      shown = r;
      const f = FORMATS[r.fmt];
      if (buttonsFor !== r.fmt) buildButtons(f);
      // only what changed is written: every write makes the page lay itself out again, and a
      // JupyterLab page is large
      r.buttons.forEach((b, j) => {
        const e = buttons[j];
        if (e.textContent !== b.label) e.textContent = b.label;
        if (written.get(e) !== b.color) { e.style.background = b.color; written.set(e, b.color); }
        const weight = b.on ? "bold" : "normal";
        if (e.style.fontWeight !== weight) e.style.fontWeight = weight;
      });
      if (source !== dropdown) dropdown.value = r.fmt;
      if (source !== decimal) decimal.value = r.decimal;
      if (source !== hex) hex.value = r.hex;
      slider.max = String(r.slider.max);
      if (source !== slider) slider.value = String(r.slider.position);
      sliderNote.textContent = r.slider.shift ? `top ${SLIDER_BITS} bits` : `pattern ${r.bits} of ${r.slider.max}`;
      for (const [el, html] of [[legend, r.legend], [bitsLine, r.bitsHtml], [readout, r.readout]]) {
        if (written.get(el) !== html) { el.innerHTML = html; written.set(el, html); }
      }
      readout.dataset.state = JSON.stringify({ fmt: r.fmt, bits: r.bits, typed: state.typed });
      return r;
    };

    const { schedule, stop } = drawLoop(model, figure, message, () => {
      const r = shown;
      return { figure: r.figure, settings: { fmt: r.fmt, bits: r.bits, typed: state.typed } };
    });

    let sending = false;
    const send = (before) => {
      const changed = SETTINGS.filter((k) => before[k] !== state[k]);
      if (!changed.length) return;
      sending = true;
      try {
        for (const k of changed) model.set(k, state[k]);
      } finally {
        sending = false;
      }
      model.save_changes();
    };
    // a move: new settings, shown at once, drawn, sent; a refused one leaves everything as it was
    const act = (next, source = null, quiet = false) => {
      let after;
      try {
        after = next();
      } catch (e) {
        if (!quiet) showError(String(e.message || e));
        return false;
      }
      const before = state;
      state = after;
      showError("");
      show(source);
      schedule();
      send(before);
      return true;
    };

    dropdown.addEventListener("change", () => act(() => withFormat(state, dropdown.value), dropdown));
    // a number or pattern is taken as it is typed, once it reads; what does not read is said on Enter or on leaving the box
    decimal.addEventListener("input", () => act(() => withDecimal(state, decimal.value), decimal, true));
    decimal.addEventListener("change", () => {
      if (act(() => withDecimal(state, decimal.value), decimal)) decimal.value = shown.decimal;
    });
    hex.addEventListener("input", () => act(() => withHex(state, hex.value), hex, true));
    hex.addEventListener("change", () => {
      if (act(() => withHex(state, hex.value), hex)) hex.value = shown.hex;
    });
    slider.addEventListener("input",
      () => act(() => withBits(state, sliderBits(state.fmt, Math.round(Number(slider.value)))), slider));

    // a setting changed from Python (all of a change arrive together)
    const fromModel = () => {
      if (sending) return;
      const next = { fmt: model.get("fmt"), bits: model.get("bits"), typed: model.get("typed") ?? null };
      if (SETTINGS.every((k) => next[k] === state[k])) return;
      state = next;
      try {
        showError("");
        show();
        schedule();
      } catch (e) {
        showError(String(e.message || e));
      }
    };
    for (const k of SETTINGS) model.on(`change:${k}`, fromModel);
    try {
      show();
      schedule();
    } catch (e) {
      showError(String(e.message || e));
    }
    return () => {
      stop();
      dropKeys();
      for (const k of SETTINGS) model.off(`change:${k}`, fromModel);
    };
  },
};
