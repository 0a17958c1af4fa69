// ampviz's float formats in the browser: the same numbers as ampviz.formats, bit for bit.
//
// A port of ampviz/formats/spec.py (the "ieee" and "fn" formats) and ampviz/formats/beyond_ieee.py
// ("fnuz", "finite" and E8M0), so that an explorer can compute a format's bits and values without a
// kernel. Every value goes through float32 first, as torch's cast does (Math.fround rounds to
// nearest even, as numpy's float32 cast does), then to the format's grid, ties to even. Values are
// JavaScript numbers (float64), which hold every value of every format exactly; bit patterns are
// plain numbers (at most 32 bits, unsigned).
//
// Two ways in: a number (`cast(fmt, x)`: its float32 value, and for -0 and NaN its sign), or a
// float32 bit pattern (`castBits32(fmt, u)`: exact for NaN's sign too, which JavaScript numbers do
// not promise to keep). tests/browser/test_js_formats.py holds every function to the Python package:
// every bit pattern of every format of at most 16 bits, and thousands of seeded float32 values.

export const CATEGORIES = ["zero", "underflow", "subnormal", "normal", "overflow", "nan"];
const ZERO = 0, UNDERFLOW = 1, SUBNORMAL = 2, NORMAL = 3, OVERFLOW = 4, NAN = 5;

// ----------------------------------------------------------------- exact float64 helpers
const F64 = new Float64Array(1);
const U32 = new Uint32Array(F64.buffer); // little-endian: U32[1] holds the sign and exponent
const F32 = new Float32Array(1);
const F32U = new Uint32Array(F32.buffer);

/** 2**e exactly, for -1074 <= e <= 1023. */
export function pow2(e) {
  if (e < -1022) return pow2(e + 64) * pow2(-64); // a float64 subnormal: exact, no rounding
  U32[0] = 0;
  U32[1] = (e + 1023) << 20;
  return F64[0];
}

/** x * 2**e, exact where the result is a float64 (the formats' values always are). */
export function ldexp(x, e) {
  while (e > 1000) { x *= pow2(1000); e -= 1000; }
  while (e < -1000) { x *= pow2(-1000); e += 1000; }
  return x * pow2(e);
}

/** The exponent of a finite a > 0: a = f * 2**e with f in [0.5, 1) (numpy's frexp). */
export function frexpExponent(a) {
  F64[0] = a;
  const biased = (U32[1] >>> 20) & 0x7ff;
  if (biased === 0) return frexpExponent(a * pow2(64)) - 64; // a float64 subnormal
  return biased - 1022;
}

/** v rounded to an integer, ties to even (numpy's rint), for 0 <= v < 2**53. */
function rint(v) {
  const r = Math.floor(v), d = v - r;
  if (d > 0.5) return r + 1;
  if (d < 0.5) return r;
  return r % 2 === 0 ? r : r + 1;
}

/** Whether a number's sign bit is set (-0 and negative NaNs included). */
function signBit(x) {
  F64[0] = x;
  return U32[1] >>> 31;
}

/** A float32 bit pattern's value (a JavaScript number; a NaN's sign comes back as signBit). */
export function float32FromBits(u) {
  F32U[0] = u >>> 0;
  return F32[0];
}

/** A number's float32 bit pattern (Math.fround's rounding; a NaN keeps its sign). */
export function float32Bits(x) {
  F32[0] = x;
  let u = F32U[0];
  if (Number.isNaN(x)) u = ((signBit(x) << 31) | 0x7fc00000) >>> 0; // a quiet NaN with x's sign
  return u >>> 0;
}

// ----------------------------------------------------------------- the formats
function make(name, kind, exponentBits, mantissaBits, bias) {
  const e = exponentBits, m = mantissaBits;
  const fmt = { name, kind, exponentBits: e, mantissaBits: m, bias };
  if (kind === "e8m0") {
    Object.assign(fmt, { bits: 8, emin: -bias, emax: 254 - bias });
    fmt.max = pow2(fmt.emax);
    fmt.smallestNormal = fmt.smallestSubnormal = pow2(fmt.emin);
    fmt.overflowBoundary = 1.5 * fmt.max;
    fmt.underflowBoundary = pow2(fmt.emin - 1);
    fmt.eps = 1; // 2**-0: a mantissa of no bits
    fmt.nanBits = 0xff;
    return Object.freeze(fmt);
  }
  fmt.bits = 1 + e + m;
  fmt.emin = 1 - bias;
  const top = (1 << e) - 1;
  if (kind === "ieee" || kind === "fn") {
    fmt.emax = (kind === "ieee" ? top - 1 : top) - bias;
    fmt.max = ldexp(kind === "ieee" ? 2 - pow2(-m) : 2 - pow2(1 - m), fmt.emax);
  } else { // "fnuz", "finite": every exponent field holds numbers
    fmt.emax = top - bias;
    fmt.max = ldexp(2 - pow2(-m), fmt.emax);
  }
  fmt.smallestNormal = pow2(fmt.emin);
  fmt.smallestSubnormal = pow2(fmt.emin - m);
  fmt.eps = pow2(-m);
  fmt.overflowBoundary = fmt.max + pow2(fmt.emax - m - 1);
  fmt.underflowBoundary = pow2(fmt.emin - m - 1);
  fmt.nanBits = kind === "fn" ? (top << m) | ((1 << m) - 1)
    : kind === "ieee" ? (top << m) | (1 << (m - 1))
    : kind === "fnuz" ? 2 ** (fmt.bits - 1) : null;
  return Object.freeze(fmt);
}

/** Every built-in format, by name, as ampviz.formats.ALL_FORMATS has them. */
export const FORMATS = Object.freeze(Object.fromEntries([
  make("fp32", "ieee", 8, 23, 127),
  make("tf32", "ieee", 8, 10, 127),
  make("fp16", "ieee", 5, 10, 15),
  make("bf16", "ieee", 8, 7, 127),
  make("fp8_e4m3", "fn", 4, 3, 7),
  make("fp8_e5m2", "ieee", 5, 2, 15),
  make("fp8_e4m3fnuz", "fnuz", 4, 3, 8),
  make("fp8_e5m2fnuz", "fnuz", 5, 2, 16),
  make("fp6_e3m2", "finite", 3, 2, 3),
  make("fp6_e2m3", "finite", 2, 3, 1),
  make("fp4_e2m1", "finite", 2, 1, 1),
  make("e8m0", "e8m0", 8, 0, 127),
].map((f) => [f.name, f])));

function format(fmt) {
  const f = typeof fmt === "string" ? FORMATS[fmt] : fmt;
  if (!f || !FORMATS[f.name]) {
    throw new TypeError(`fmt must be one of ${Object.keys(FORMATS).join(", ")}, not ${String(fmt)}`);
  }
  return f;
}

// ----------------------------------------------------------------- decoding
/** The value of a bit pattern (0 to 2**bits - 1), as ampviz's FloatFormat.decode gives it. */
export function decode(fmt, bits) {
  const f = format(fmt);
  if (!Number.isInteger(bits) || bits < 0 || bits >= 2 ** f.bits) {
    throw new RangeError(`${f.name} bit patterns are whole numbers from 0 to ${2 ** f.bits - 1}, not ${bits}`);
  }
  if (f.kind === "e8m0") return bits === 0xff ? NaN : pow2(bits - f.bias);
  const m = f.mantissaBits, e = f.exponentBits;
  const sign = Math.floor(bits / 2 ** (m + e));
  const exp = Math.floor(bits / 2 ** m) % 2 ** e;
  const man = bits % 2 ** m;
  const top = 2 ** e - 1;
  let value = exp === 0 ? ldexp(man, f.emin - m) : ldexp(man + 2 ** m, exp - f.bias - m);
  if (f.kind === "ieee" && exp === top) value = man === 0 ? Infinity : NaN;
  if (f.kind === "fn" && exp === top && man === 2 ** m - 1) value = NaN;
  if (f.kind === "fnuz" && bits === f.nanBits) value = NaN;
  return sign === 1 ? -value : value;
}

/** (sign, exponent field, mantissa field) of a bit pattern. */
export function fields(fmt, bits) {
  const f = format(fmt);
  decode(f, bits); // the same check of the pattern
  const m = f.mantissaBits, e = f.exponentBits;
  if (f.kind === "e8m0") return [0, bits, 0];
  return [Math.floor(bits / 2 ** (m + e)), Math.floor(bits / 2 ** m) % 2 ** e, bits % 2 ** m];
}

// ----------------------------------------------------------------- the cast
function roundMagnitude(f, a) {
  if (a === 0) return 0;
  const e = Math.max(frexpExponent(a) - 1, f.emin) - f.mantissaBits; // one ulp at a is 2**e
  return ldexp(rint(ldexp(a, -e)), e);
}

/** Bit pattern (sign clear) of a finite magnitude already on the format's grid. */
function magnitudeBits(f, a) {
  if (!Number.isFinite(a) || a === 0) return 0;
  const m = f.mantissaBits;
  const e = frexpExponent(a) - 1;
  if (a >= f.smallestNormal) return (e + f.bias) * 2 ** m + (ldexp(a, m - e) - 2 ** m);
  return ldexp(a, m - f.emin);
}

/** The base rounding of "ieee", "fn", "fnuz" and "finite": [signed value, category]. x32 is the
 *  float32 value, sign its sign bit, isZero whether the input itself was 0. */
function quantizeWithCode(f, x32, sign, isZero) {
  const a = Math.abs(x32);
  const finite = Number.isFinite(a);
  let q = roundMagnitude(f, finite ? a : 0);
  const over = q > f.max || a === Infinity;
  if (over) q = f.kind === "fn" ? f.max : Infinity;
  const isNaN = Number.isNaN(a);
  if (isNaN) q = NaN;
  let code = NORMAL;
  if (q < f.smallestNormal) code = SUBNORMAL;
  if (q === 0) code = UNDERFLOW;
  if (isZero) code = ZERO;
  if (over) code = OVERFLOW;
  if (isNaN) code = NAN;
  return [sign ? -q : q, code];
}

function e8m0Cast(f, u, isZero, overflow, nonpositive) {
  const exp = (u >>> 23) & 0xff, man = u & 0x7fffff;
  const up = (man & 0x400000) !== 0 && ((man & 0x3fffff) !== 0 || exp > 0) ? 1 : 0;
  let bits = exp === 0xff ? 0xff : exp + up;
  const x32 = float32FromBits(u);
  const isNaN = Number.isNaN(x32);
  const over = bits === 0xff && !isNaN;
  if (overflow === "saturate" && over) bits = 0xfe;
  if (nonpositive === "nan" && (x32 <= 0 || u >>> 31 === 1)) bits = 0xff;
  let code = NORMAL;
  if (Math.abs(x32) <= f.underflowBoundary) code = UNDERFLOW;
  if (isZero) code = ZERO;
  if (over) code = OVERFLOW;
  if (isNaN) code = NAN;
  return { bits, value: decode(f, bits), category: CATEGORIES[code] };
}

/** What finite formats make of a float32 NaN pattern u under torchao's bit arithmetic. */
function torchaoNanBits(f, u) {
  const e = f.exponentBits, m = f.mantissaBits, shift = 23 - m;
  const a = u & 0x7fffffff;
  const add = (f.bias - 127) * 2 ** 23 + 2 ** (shift - 1) - 1;
  const code = Math.floor((a + add + (Math.floor(a / 2 ** shift) & 1)) / 2 ** shift) & 0xff;
  return code | ((u >>> 31) << (e + m)); // an OR, as torchao's: the code may hold that bit already
}

const CHOICES = {
  ieee: { overflow: [undefined, null] }, fn: { overflow: [undefined, null] },
  fnuz: { overflow: [undefined, null, "nan", "saturate"] },
  finite: { overflow: [undefined, null, "saturate"], nan: [undefined, null, "torchao"] },
  e8m0: { overflow: [undefined, null, "nan", "saturate"], nonpositive: [undefined, null, "nan"] },
};

function checkOptions(f, options) {
  for (const [key, value] of Object.entries(options)) {
    const allowed = CHOICES[f.kind][key];
    if (!allowed || !allowed.includes(value)) {
      throw new RangeError(`${f.name} takes no ${key}=${String(value)}`);
    }
  }
}

function castWith(f, u, x32, sign, isZero, options) {
  checkOptions(f, options);
  if (f.kind === "e8m0") return e8m0Cast(f, u, isZero, options.overflow, options.nonpositive);
  const [q, code] = quantizeWithCode(f, x32, sign, isZero);
  const m = f.mantissaBits, signBitValue = 2 ** (f.bits - 1);
  let bits;
  if (f.kind === "ieee" || f.kind === "fn") {
    const a = Math.abs(q);
    const top = 2 ** f.exponentBits - 1;
    bits = a === Infinity ? top * 2 ** m : magnitudeBits(f, a);
    if (code === NAN) bits = f.nanBits;
    if (sign) bits += signBitValue;
    return { bits, value: q, category: CATEGORIES[code] };
  }
  if (f.kind === "fnuz") {
    bits = code === OVERFLOW ? magnitudeBits(f, f.max) : magnitudeBits(f, Math.abs(q));
    if (sign && bits !== 0) bits += signBitValue;
    if (code === NAN || (code === OVERFLOW && options.overflow !== "saturate")) bits = f.nanBits;
  } else { // "finite"
    bits = magnitudeBits(f, code === OVERFLOW ? f.max : Math.abs(q));
    if (sign) bits += signBitValue;
    if (code === NAN) {
      if (options.nan === "torchao") {
        if (f.bits > 8) throw new RangeError(`nan="torchao" reproduces torchao's cast to at most 8 bits`);
        bits = torchaoNanBits(f, u);
      } else {
        bits = (1 - (u >>> 31)) * signBitValue;
      }
    }
  }
  return { bits, value: decode(f, bits), category: CATEGORIES[code] };
}

/** A float32 bit pattern u cast into fmt: {bits, value, category}, as ampviz's encode, quantize
 *  and classify give them. options: {overflow, nan, nonpositive}, as the Python methods take them. */
export function castBits32(fmt, u, options = {}) {
  const f = format(fmt);
  if (!Number.isInteger(u) || u < 0 || u > 0xffffffff) {
    throw new RangeError(`a float32 bit pattern is a whole number from 0 to 0xFFFFFFFF, not ${u}`);
  }
  const x32 = float32FromBits(u);
  return castWith(f, u, x32, u >>> 31, x32 === 0, options);
}

/** A number x cast into fmt (through its float32 value): {bits, value, category}. A nonzero x
 *  that float32 flushes to 0 is "underflow", as in the Python package. */
export function cast(fmt, x, options = {}) {
  const f = format(fmt);
  if (typeof x !== "number") throw new TypeError(`x must be a number, not ${typeof x}`);
  const u = float32Bits(x);
  return castWith(f, u, float32FromBits(u), u >>> 31, x === 0, options);
}

export const encode = (fmt, x, options) => cast(fmt, x, options).bits;
export const quantize = (fmt, x, options) => cast(fmt, x, options).value;
export const classify = (fmt, x) => cast(fmt, x).category;
