// ampviz's loss scalers in the browser: the same traces as ampviz.scaling.simulate, bit for bit.
//
// A port of ampviz/scaling/scaler.py (DynamicScaler's state machine: torch's GradScaler and every
// framework preset, which are DynamicScalers with other settings) and of the overflow model of
// ampviz/scaling/overflow.py, stepped one step at a time as ampviz.scaling.simulator's reference
// loop does. A policy is a plain object with DynamicScaler's fields, by their Python names
// (`policyFromPython` in the tests makes one from a preset); PRESETS below holds torch's.
// tests/browser/test_js_scaling.py holds `simulate` to the Python package on every preset.

import { FORMATS, quantize } from "./formats.mjs";

/** torch.amp.GradScaler at its defaults, as ampviz.scaling.TorchGradScaler() has it. */
export const TORCH = Object.freeze({
  name: "torch", init_scale: 65536, growth_factor: 2, backoff_factor: 0.5, growth_interval: 2000,
  hysteresis: 1, refill: "growth", min_scale: null, max_scale: null, raise_at_min: false,
  growth_at_least: false, inf_guard: true, tracker_after_overflow: 0, tolerance: 0,
  raise_at_scale: null, no_backoff_below: null, window_scaling: false, arithmetic: "torch",
  dynamic: true, raise_at_zero: false, raise_at_inf: false,
});

const AT_MINIMUM = "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.";
const MINIMUM_REACHED = (s) => `Minimum loss scale reached (${pyFloat(s)}). Your loss is probably exploding. ` +
  "Try lowering the learning rate, using gradient clipping or increasing the batch size.";

/** A number as Python's str() prints a float (for the one message that formats a scale). */
function pyFloat(x) {
  if (Number.isInteger(x) && Math.abs(x) < 1e16) return x.toFixed(1);
  return String(x);
}

/** scale * factor, rounded as the framework stores its scale (scaler.py's _mul). */
function mul(scale, factor, arithmetic) {
  if (arithmetic === "torch") return Math.fround(scale * factor);
  if (arithmetic === "float32") return Math.fround(scale * Math.fround(factor));
  return scale * factor;
}

/** x wrapped to an int32, as torch's int32 growth tracker would hold it. */
function int32(x) {
  return x >= -(2 ** 31) && x < 2 ** 31 ? x : ((((x + 2 ** 31) % 2 ** 32) + 2 ** 32) % 2 ** 32) - 2 ** 31;
}

export function initialState(p) {
  let scale = Number(p.init_scale);
  if (p.arithmetic !== "float64") scale = Math.fround(scale);
  return { scale, growth_tracker: p.tracker_after_overflow, hysteresis: p.hysteresis, stopped: false,
    overflows_since_rescale: 0, steps_since_rescale: 0, window: p.window_scaling ? p.growth_interval : 0 };
}

function grows(p, tracker, window) {
  if (p.window_scaling) return window >= 1 && tracker > 0 && tracker % window === 0;
  return p.growth_at_least ? tracker >= p.growth_interval : tracker === p.growth_interval;
}

function resized(p, window, factor) {
  if (!p.window_scaling || window < 1) return window;
  const w = window * factor;
  if (!(w >= 1)) return 1;
  return Number.isFinite(w) ? Math.trunc(w) : window;
}

function grow(p, scale) {
  let next = mul(scale, p.growth_factor, p.arithmetic);
  if (p.max_scale !== null) next = p.max_scale < next ? p.max_scale : next; // Python's min(next, max_scale)
  if (p.inf_guard && !Number.isFinite(next)) return scale;
  return next;
}

function state(scale, growth_tracker, hysteresis, stopped, overflows_since_rescale, steps_since_rescale, window) {
  return { scale, growth_tracker, hysteresis, stopped, overflows_since_rescale, steps_since_rescale, window };
}

/** The state after one step that did (foundInf) or did not overflow: DynamicScaler._adjust. */
export function adjust(p, st, foundInf) {
  if (st.stopped || !p.dynamic) return st;
  if (p.raise_at_zero && st.scale === 0) return { ...st, stopped: true };
  const counting = p.tolerance > 0;
  if (foundInf) {
    if (p.raise_at_inf && !(st.scale > -Infinity && st.scale < Infinity)) return { ...st, stopped: true };
    const overflows = counting ? st.overflows_since_rescale + 1 : 0;
    const steps = counting ? st.steps_since_rescale + 1 : 0;
    let next;
    if (st.hysteresis > 1) {
      next = { ...st, growth_tracker: p.tracker_after_overflow, hysteresis: st.hysteresis - 1,
        overflows_since_rescale: overflows, steps_since_rescale: steps };
    } else if (counting && !(overflows / steps >= p.tolerance)) {
      next = { ...st, growth_tracker: p.tracker_after_overflow, overflows_since_rescale: overflows,
        steps_since_rescale: steps };
    } else {
      if (p.raise_at_min && p.min_scale !== null && st.scale === p.min_scale) return { ...st, stopped: true };
      let scale = mul(st.scale, p.backoff_factor, p.arithmetic);
      if (p.min_scale !== null) scale = pyMax(scale, p.min_scale);
      if (p.no_backoff_below !== null && scale < p.no_backoff_below) scale = st.scale;
      next = state(scale, p.tracker_after_overflow, st.hysteresis, false, 0, 0, resized(p, st.window, p.backoff_factor));
    }
    if (p.raise_at_scale !== null && next.scale <= p.raise_at_scale) return { ...st, stopped: true };
    return next;
  }
  let hyst = p.refill === "clean" ? p.hysteresis : st.hysteresis;
  const tracker = st.growth_tracker + 1;
  if (grows(p, tracker, st.window)) {
    const scale = grow(p, st.scale);
    if (p.refill === "growth") hyst = p.hysteresis;
    if (p.window_scaling) {
      return state(scale, tracker, hyst, false, st.overflows_since_rescale, 0, resized(p, st.window, p.growth_factor));
    }
    return state(scale, 0, hyst, false, st.overflows_since_rescale, 0, 0);
  }
  return state(st.scale, tracker, hyst, false, st.overflows_since_rescale,
    counting ? st.steps_since_rescale + 1 : 0, st.window);
}

/** Python's max(a, b): a unless b is larger (NaN as Python compares it). */
function pyMax(a, b) {
  return b > a ? b : a;
}

/** The exception that ends the run at a step taken from st (not stopped): DynamicScaler._stop_reason. */
export function stopReason(p, st, foundInf) {
  if (st.stopped || !p.dynamic) return null;
  const scale = st.scale;
  if (p.raise_at_zero && scale === 0) return "ZeroDivisionError: float division by zero";
  if (!foundInf) return null;
  if (p.raise_at_inf && !(scale > -Infinity && scale < Infinity)) {
    return Number.isNaN(scale) ? "ValueError: cannot convert float NaN to integer"
      : "OverflowError: cannot convert float infinity to integer";
  }
  const below = p.tolerance > 0
    ? !((st.overflows_since_rescale + 1) / (st.steps_since_rescale + 1) >= p.tolerance) : false;
  if (st.hysteresis <= 1 && !below && p.raise_at_min && p.min_scale !== null && scale === p.min_scale) {
    return `Exception: ${AT_MINIMUM}`;
  }
  if (adjust(p, st, true).stopped) return `FloatingPointError: ${MINIMUM_REACHED(p.raise_at_scale)}`;
  return null;
}

/** Whether a step whose largest unscaled |gradient| is g overflows at scale s (overflow.py). With
 *  lossInFormat the loss is in fmt (the scale cast to fmt first); else float32, as autocast has it. */
export function overflows(s, g, fmt = "fp16", lossInFormat = false) {
  const B = FORMATS[fmt].overflowBoundary;
  if (lossInFormat) return !(Math.abs(quantize(fmt, s)) * Math.abs(quantize(fmt, g)) < B);
  return !(Math.fround(Math.abs(Math.fround(s)) * Math.abs(Math.fround(g))) < B);
}

/** A run of policy p over a stream: {foundInf} (0/1 per step) or {gradMax} (the largest |gradient|
 *  per step, with fmt and lossInFormat for the overflow model). Returns the trace as
 *  ampviz.scaling.simulate's ScalerTrace holds it: scale, skipped, growth_tracker, hysteresis
 *  (typed arrays), final, stoppedAt, stopReason. */
export function simulate(p, { foundInf = null, gradMax = null, fmt = "fp16", lossInFormat = false, start = null } = {}) {
  if ((foundInf === null) === (gradMax === null)) {
    throw new RangeError("give exactly one of foundInf (0/1 per step) or gradMax (max |gradient| per step)");
  }
  if (!FORMATS[fmt]) throw new RangeError(`fmt must be one of ${Object.keys(FORMATS).join(", ")}, not ${fmt}`);
  const n = (foundInf ?? gradMax).length;
  const out = { scale: new Float64Array(n), skipped: new Uint8Array(n), growth_tracker: new Int32Array(n),
    hysteresis: new Int32Array(n), final: null, stoppedAt: null, stopReason: null };
  let st = start ?? initialState(p);
  for (let k = 0; k < n; k++) {
    let f;
    if (st.stopped) {
      out.scale[k] = NaN;
      f = true;
    } else {
      out.scale[k] = st.scale;
      f = foundInf !== null ? Boolean(foundInf[k]) : overflows(st.scale, gradMax[k], fmt, lossInFormat);
    }
    const before = st;
    st = adjust(p, st, f);
    if (st.stopped && !before.stopped) {
      out.stoppedAt = k;
      out.stopReason = stopReason(p, before, f);
      f = true; // the step that ends the run is not taken
    }
    out.skipped[k] = f ? 1 : 0;
    out.growth_tracker[k] = int32(st.growth_tracker);
    out.hysteresis[k] = st.hysteresis;
  }
  out.final = st;
  return out;
}
