// ampviz's MX block scaling in the browser: the same scales, codes and values as
// ampviz.formats.blocks.mx_quantize (round to nearest even), bit for bit.
//
// A port of ampviz/formats/blocks/mx.py's exact rule (_mx_exponents, _mx_reference): each block of
// `blockSize` float32 values gets an E8M0 scale 2**(code - 127) from its largest magnitude by one of
// four rules, and its elements are divided by the scale (exactly: a power of two), clamped to the
// element format's max and cast to it. NaN inputs give the package's scales and values (NaN); the
// element codes written for a NaN depend on its sign and payload, which JavaScript numbers do not
// keep, so tests/browser/test_js_blocks.py holds the codes on NaN-free blocks (infinities included).

import { FORMATS, castBits32, decode, float32Bits, frexpExponent, pow2 } from "./formats.mjs";

export const MX_ELEMENT_FORMATS = ["fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1"];
export const MX_ROUNDING = ["floor", "ceil", "even", "rceil"];

/** The E8M0 scale pattern of a block whose float32 amax is a (mx.py's _mx_exponents). */
export function mxScaleCode(a, fmt, rounding) {
  const f = FORMATS[fmt];
  if (Number.isNaN(a)) return 255;
  if (a === Infinity) return rounding === "rceil" ? 254 : 255;
  let k;
  if (a > 0) {
    const e = frexpExponent(a);
    const frac = a * pow2(-e); // in [0.5, 1), exact
    const floorLog2 = e - 1;
    if (rounding === "floor") k = floorLog2 - f.emax;
    else if (rounding === "ceil") k = floorLog2 + (frac !== 0.5 ? 1 : 0) - f.emax;
    else if (rounding === "even") {
      const m = f.mantissaBits, top = 2 ** (m + 1), v = frac * top;
      const r = Math.floor(v), d = v - r;
      const rounded = d > 0.5 || (d === 0.5 && r % 2 === 1) ? r + 1 : r;
      k = floorLog2 + (rounded === top ? 1 : 0) - f.emax;
    } else { // rceil: the least k with max * 2**k >= amax
      k = floorLog2 - Math.floor(Math.log2(f.max));
      k = k - 1 + (f.max * pow2(k - 1) < a ? 1 : 0) + (f.max * pow2(k) < a ? 1 : 0);
    }
  } else {
    k = -127;
  }
  return Math.min(Math.max(k, -127), 127) + 127;
}

/** The element pattern of a float32 value v already clamped to ±max (mx's _element_codes). */
function elementCode(fmt, v) {
  const f = FORMATS[fmt];
  if (Number.isNaN(v) && f.kind !== "finite") return (2 ** (f.bits - 1) - 1) | (float32Bits(v) >>> 31 << (f.bits - 1));
  return castBits32(fmt, float32Bits(v), f.kind === "finite" ? { nan: "torchao" } : {}).bits;
}

/** MX block scaling of the float32 values x (a Float32Array, or numbers) along blocks of blockSize:
 *  {scales: Uint8Array (E8M0 patterns), codes: Uint8Array (element patterns), values: Float32Array}. */
export function mxQuantize(x, fmt, blockSize = 32, rounding = "floor") {
  if (!MX_ELEMENT_FORMATS.includes(fmt)) throw new RangeError(`fmt must be one of ${MX_ELEMENT_FORMATS.join(", ")}, not ${fmt}`);
  if (!MX_ROUNDING.includes(rounding)) throw new RangeError(`rounding must be one of ${MX_ROUNDING.join(", ")}, not ${rounding}`);
  if (!Number.isInteger(blockSize) || blockSize < 1) throw new RangeError(`blockSize must be a whole number >= 1, not ${blockSize}`);
  const x32 = x instanceof Float32Array ? x : Float32Array.from(x);
  if (x32.length % blockSize) {
    throw new RangeError(`the ${x32.length} values must be a multiple of the block size ${blockSize}`);
  }
  const f = FORMATS[fmt], top = Math.fround(f.max);
  const blocks = x32.length / blockSize;
  const scales = new Uint8Array(blocks), codes = new Uint8Array(x32.length), values = new Float32Array(x32.length);
  for (let b = 0; b < blocks; b++) {
    const lo = b * blockSize, hi = lo + blockSize;
    let amax = 0, nan = false;
    for (let i = lo; i < hi; i++) {
      const a = Math.abs(x32[i]);
      if (Number.isNaN(a)) nan = true;
      else if (a > amax) amax = a;
    }
    const s = mxScaleCode(nan ? NaN : amax, fmt, rounding);
    scales[b] = s;
    const k = Math.min(s, 254) - 127;
    for (let i = lo; i < hi; i++) {
      let v;
      if (s === 255) v = rounding === "rceil" ? NaN : x32[i] / Infinity;
      else v = Math.fround(x32[i] * pow2(-k));
      if (v > top) v = top;
      else if (v < -top) v = -top;
      codes[i] = elementCode(fmt, v);
      values[i] = s === 255 ? NaN : Math.fround(Math.fround(decode(fmt, codes[i])) * pow2(k));
    }
  }
  return { scales, codes, values };
}

// ----------------------------------------------------------------- NVFP4
const F32_MAX = 3.4028234663852886e38;
const NVFP4_BLOCK = 16;
const FP4_MAX = 6, E4M3_MAX = 448, E4M3_TINY = 2 ** -6;
const SIXTH = Math.fround(1 / 6);
export const NVFP4_CONVENTIONS = ["torchao", "te"];

const pyMin = (a, b) => (b < a ? b : a);
const clip = (v, lo, hi) => (v < lo ? lo : v > hi ? hi : v); // NaN passes, as np.clip's

function e4m3Code(s) {
  return castBits32("fp8_e4m3", float32Bits(s)).bits;
}

function tensorScale(perTensorScale, amaxT, convention) {
  if (perTensorScale === true || perTensorScale === false) {
    if (!perTensorScale) {
      if (convention === "te") throw new RangeError("convention 'te' has no single-level scaling: pass perTensorScale true");
      return null;
    }
    return convention === "te" ? null : Math.fround(amaxT / 2688);
  }
  if (typeof perTensorScale === "number") {
    if (convention === "te") throw new RangeError("convention 'te' computes its scale from the amax: pass perTensorScale true");
    const s = Math.fround(perTensorScale);
    if (!(Number.isFinite(s) && s > 0)) throw new RangeError(`perTensorScale must be true, false or a positive finite decode scale, not ${perTensorScale}`);
    return s;
  }
  throw new TypeError(`perTensorScale must be true, false or a positive number, not ${String(perTensorScale)}`);
}

/** NVFP4 quantization of finite float32 values x along blocks of 16, as
 *  ampviz.formats.blocks.nvfp4_quantize (round to nearest): {tensorScale (null when single-level),
 *  scales (Uint8Array of E4M3 patterns), codes (Uint8Array of E2M1 patterns), values (Float32Array)}.
 *  convention "torchao" (torchao's nvfp4_quantize) or "te" (Transformer Engine's reference). */
export function nvfp4Quantize(x, perTensorScale = true, convention = "torchao") {
  if (!NVFP4_CONVENTIONS.includes(convention)) throw new RangeError(`convention must be "torchao" or "te", not ${convention}`);
  const x32 = x instanceof Float32Array ? x : Float32Array.from(x);
  if (x32.length % NVFP4_BLOCK) throw new RangeError(`the ${x32.length} values must be a multiple of the block size 16`);
  if (!x32.every(Number.isFinite)) throw new RangeError("nvfp4Quantize takes finite values (inf and NaN: the Python package)");
  const blocks = x32.length / NVFP4_BLOCK;
  const bmax = new Float64Array(blocks);
  let amaxT = 0;
  for (let b = 0; b < blocks; b++) {
    let m = 0;
    for (let i = b * NVFP4_BLOCK; i < (b + 1) * NVFP4_BLOCK; i++) m = Math.max(m, Math.abs(x32[i]));
    bmax[b] = m;
    amaxT = Math.max(amaxT, m);
  }
  let pts = tensorScale(perTensorScale, amaxT, convention);
  const scales = new Uint8Array(blocks), codes = new Uint8Array(x32.length), values = new Float32Array(x32.length);
  let sEnc = null, mult = null;
  if (convention === "te") {
    sEnc = Math.fround(2688 / amaxT);
    sEnc = sEnc === 0 ? 1 : Number.isNaN(sEnc) ? NaN : pyMin(sEnc, F32_MAX);
    pts = Math.fround(1 / sEnc);
    mult = Math.fround(sEnc * SIXTH);
  }
  for (let b = 0; b < blocks; b++) {
    let code, sf, enc;
    if (convention === "te") {
      const product = Math.fround(bmax[b] * mult);
      const dec = Number.isNaN(product) ? NaN : pyMin(product, F32_MAX);
      code = e4m3Code(clip(dec, -E4M3_MAX, E4M3_MAX));
      sf = decode("fp8_e4m3", code);
      enc = pyMin(Math.fround(1 / Math.fround(sf * pts)), F32_MAX);
    } else {
      let bscale = Math.fround(bmax[b] / FP4_MAX);
      if (pts !== null && !Number.isNaN(bscale)) bscale = Math.fround(bscale / pts);
      code = e4m3Code(clip(bscale, E4M3_TINY, E4M3_MAX));
      sf = decode("fp8_e4m3", code);
      const one = pts === null ? 1 : Math.fround(1 / pts);
      enc = Number.isNaN(one) ? one : Math.fround(one / sf);
    }
    scales[b] = code;
    const dscale = pts === null ? sf : Number.isNaN(pts) ? pts : Math.fround(pts * sf);
    for (let i = b * NVFP4_BLOCK; i < (b + 1) * NVFP4_BLOCK; i++) {
      const v = clip(Number.isNaN(enc) ? enc : Math.fround(x32[i] * enc), -FP4_MAX, FP4_MAX);
      let c = castBits32("fp4_e2m1", float32Bits(v), { nan: "torchao" }).bits;
      if (convention === "te" && ((c === 0x8 && v === 0) || Number.isNaN(v))) c = 0;
      codes[i] = c;
      values[i] = Math.fround(decode("fp4_e2m1", c) * dscale);
    }
  }
  return { tensorScale: pts, scales, codes, values };
}
