// ampviz's FP8 per-tensor scaling in the browser: the same traces as
// ampviz.formats.fp8.simulate_fp8_scaling, bit for bit.
//
// A port of ampviz/formats/fp8/delayed.py (Transformer Engine's delayed scaling, stepped: its
// Python update or its CUDA kernel), current.py (torchao's and Transformer Engine's current
// scale) and stream.py's exact counts (a binary search per step over the sorted |base|, evaluating
// the float32 arithmetic itself). A stream is {sortedAbs, magnitude, nonfinite} as
// ampviz.formats.fp8.TensorStream holds them (sorted |base|, float32 magnitude per step, 0 / 1 = inf
// / 2 = NaN per step). tests/browser/test_js_fp8.py holds it to the Python package.

import { FORMATS } from "./formats.mjs";

const F32_MAX = 3.4028234663852886e38;
const EPS = 1e-12; // torchao's floor under an amax
const FINITE = 0, INF = 1, NAN_STEP = 2;

function fp8(fmt) {
  if (fmt !== "fp8_e4m3" && fmt !== "fp8_e5m2") throw new RangeError(`fmt must be "fp8_e4m3" or "fp8_e5m2", not ${fmt}`);
  return FORMATS[fmt];
}

/** Each step's largest |x| (float32): f32(max |base| * magnitude), inf or NaN on a non-finite step. */
export function streamAmax(stream) {
  const top = stream.sortedAbs.length ? stream.sortedAbs[stream.sortedAbs.length - 1] : 0;
  return Float32Array.from(stream.magnitude, (m, t) =>
    stream.nonfinite[t] === INF ? Infinity : stream.nonfinite[t] === NAN_STEP ? NaN : Math.fround(top * m));
}

/** The current scale of each amax: torchao's amax_to_scale or Transformer Engine's (current.py). */
export function currentScale(amax, fmt = "fp8_e4m3", roundToPowerOf2 = false, convention = "torchao") {
  const f = fp8(fmt);
  const top32 = Math.fround(f.max);
  const out = new Float32Array(amax.length);
  for (let i = 0; i < amax.length; i++) {
    const a = amax[i];
    let s;
    if (convention === "torchao") {
      s = Math.fround(f.max / Math.max(a, EPS));
      if (roundToPowerOf2) {
        const k = Math.floor(Math.fround(Math.log2(s)));
        s = Number.isFinite(k) ? Math.fround(2 ** k) : Number.isNaN(k) ? NaN : k > 0 ? Infinity : 0;
      }
      if (Number.isNaN(a)) s = NaN;
    } else if (convention === "te") {
      s = Number.isFinite(a) && a > 0 ? Math.fround(top32 / a) : 1;
      if (s === Infinity) s = F32_MAX;
      if (roundToPowerOf2) s = floorPow2(s);
    } else {
      throw new RangeError(`convention must be "torchao" or "te", not ${convention}`);
    }
    out[i] = s;
  }
  return out;
}

/** The float32 power of two at or below a positive float32 s: its mantissa bits cleared. */
function floorPow2(s) {
  const b = new Float32Array([s]);
  const u = new Uint32Array(b.buffer);
  u[0] &= 0xff800000;
  return b[0];
}

/** Transformer Engine's delayed scaling over an amax stream, stepped (delayed.py's DelayedScaler):
 *  {scale (in force at each step), frozen (the update after the step kept the scale)}. */
export function simulateDelayed(amax, { margin = 0, historyLen = 1024, algo = "max", fmt = "fp8_e4m3", convention = "python" } = {}) {
  const f = fp8(fmt);
  if (!Number.isInteger(historyLen) || historyLen < 1) throw new RangeError(`historyLen must be a whole number >= 1, not ${historyLen}`);
  if (!Number.isInteger(margin) || Math.abs(margin) > 126) throw new RangeError(`margin must be a whole number from -126 to 126, not ${margin}`);
  if (algo !== "max" && algo !== "most_recent") throw new RangeError(`algo must be "max" or "most_recent", not ${algo}`);
  if (convention !== "python" && convention !== "cuda") throw new RangeError(`convention must be "python" or "cuda", not ${convention}`);
  const cuda = convention === "cuda";
  const n = amax.length;
  const scale = new Float32Array(n), frozen = new Uint8Array(n);
  const hist = new Array(historyLen - 1).fill(0); // oldest first
  let s = 1;
  const top32 = Math.fround(f.max), two = Math.fround(2 ** margin), twoInv = Math.fround(2 ** -margin);
  for (let t = 0; t < n; t++) {
    scale[t] = s;
    const a = Math.fround(amax[t]);
    if (cuda && a === 0) { frozen[t] = 1; continue; } // the kernel skips the roll; the scale stays
    let w;
    if (algo === "most_recent") w = a;
    else if (cuda) { // fmaxf from 0: NaNs dropped
      w = Number.isNaN(a) ? 0 : a;
      for (const h of hist) if (!Number.isNaN(h) && h > w) w = h;
    } else if (hist.length === 0) w = a;
    else if (Number.isNaN(a) || hist.some(Number.isNaN)) w = NaN;
    else { w = a; for (const h of hist) if (h > w) w = h; }
    if (hist.length) { hist.shift(); hist.push(a); }
    const ok = Number.isFinite(w) && w > 0;
    frozen[t] = ok ? 0 : 1;
    if (ok) {
      let sf = cuda ? Math.fround(Math.fround(top32 * twoInv) / w) : Math.fround(Math.fround(Math.fround(1 / w) * top32) / two);
      if (sf === Infinity) sf = F32_MAX;
      s = sf;
    }
  }
  return { scale, frozen };
}

/** The first index i < count with test(sortedAbs[i]) true (count where it never is); the test is
 *  false, then true, along the sorted values. */
function firstTrue(sortedAbs, count, test) {
  let lo = 0, hi = count;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (test(sortedAbs[mid])) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

/** The stream cast at each step's scale, counted exactly: saturated, underflowed and subnormal. */
function streamCounts(stream, scale, f) {
  const steps = stream.magnitude.length, size = stream.sortedAbs.length;
  const big = Math.fround(f.overflowBoundary), ub = Math.fround(f.underflowBoundary);
  const topSub = Math.fround(f.smallestNormal - f.smallestSubnormal / 2);
  const fn = f.kind === "fn";
  const saturated = new Float64Array(steps), underflowed = new Float64Array(steps), subnormal = new Float64Array(steps);
  const b = stream.sortedAbs;
  for (let t = 0; t < steps; t++) {
    const m = stream.magnitude[t], s = scale[t];
    const n = stream.nonfinite[t] !== FINITE ? size - 1 : size;
    const scaled = (v) => Math.abs(Math.fround(Math.fround(v * m) * s));
    const zeroX = firstTrue(b, n, (v) => Math.fround(v * m) > 0);
    const zeroQ = firstTrue(b, n, (v) => !(scaled(v) <= ub));
    const belowNormal = firstTrue(b, n, (v) => !(scaled(v) < topSub));
    const over = n - firstTrue(b, n, (v) => (fn ? scaled(v) > big : scaled(v) >= big));
    saturated[t] = over + (stream.nonfinite[t] === INF && s > 0 ? 1 : 0);
    underflowed[t] = Math.max(zeroQ - zeroX, 0);
    subnormal[t] = Math.max(belowNormal - zeroQ, 0);
  }
  return { saturated, underflowed, subnormal };
}

/** simulate_fp8_scaling: a recipe ("delayed" or "current") over a stream, with the counts per step. */
export function simulateFp8Scaling(stream, recipe = "delayed", { margin = 0, historyLen = 1024, algo = "max",
  fmt = "fp8_e4m3", roundToPowerOf2 = false, convention = null } = {}) {
  const f = fp8(fmt);
  const amax = streamAmax(stream);
  let scale, frozen;
  if (recipe === "delayed") {
    if (roundToPowerOf2) throw new RangeError("roundToPowerOf2 applies to current scaling only");
    ({ scale, frozen } = simulateDelayed(amax, { margin, historyLen, algo, fmt, convention: convention ?? "python" }));
  } else if (recipe === "current") {
    scale = currentScale(amax, fmt, roundToPowerOf2, convention ?? "torchao");
    frozen = new Uint8Array(amax.length);
  } else {
    throw new RangeError(`recipe must be "delayed" or "current", not ${recipe}`);
  }
  return { amax, scale, frozen, ...streamCounts(stream, scale, f) };
}
