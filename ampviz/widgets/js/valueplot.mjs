// FormatExplorer's figure, readout and input parsing in the browser: the same text and numbers as
// the Python package, exactly.
//
// A port of plot_value and its band traces (ampviz/plots/formats.py), the field colours of
// ampviz/plots/style.py, parse_number and _parse_bits (ampviz/widgets/base.py), FloatFormat.neighbours
// and .ulp (ampviz/formats/spec.py and beyond_ieee.py), and FormatExplorer's readout (_readout_html,
// _bits_html, _error_text, _category_note, _fields_text) and field legend
// (ampviz/widgets/format_explorer.py); what it calls of ampviz/plots/text.py and formats.py
// (format_pow2, _pow2_short, band_edges, the band hovers, _past_min, _past_max, _log2_window) and the
// category colours are plottext.mjs's, exported here too.
//
// Python floats are float64, as JavaScript numbers are; the casts go through float32 as in
// formats.mjs. Text is Python's: repr(float) (the shortest digits that round-trip, which
// Number::toString also picks, laid out as Python does: "1e-05", "100.0"), "{:.2f}" and "{:.3g}"
// from the exact decimal value of a double, ties to even (toFixed and toPrecision round ties up),
// repr(str) for the error messages. log2 is rounded correctly (scaleplot.mjs's): the C library's
// log2, which Python's math.log2 calls, is one ulp off for about 1 value in 14,000, so a marker's
// position on the log2 axis may be one ulp from Python's there, never further; a power of two is
// exact. Python's float() and int() read Unicode digits and spaces (float("١٢") is 12.0): so does
// parseNumber, as far as the browser's Unicode tables match Python's (digits added to Unicode after
// Python's version are read here and refused there).
// tests/browser/test_browser_format_explorer.py holds every export to the Python it ports.

import { FORMATS, cast, castBits32, decode, encode, fields, frexpExponent, pow2, quantize } from "./formats.mjs";
import { BAND_CATEGORIES, CATEGORY_COLORS, bandEdges, bandHover, escapeHtml, formatFixed, formatPow2 } from "./plottext.mjs";
import { log2, log2Window, pastMax, pastMin, pow2Short, withCommas } from "./plottext.mjs";
import { formatG, formatNumber } from "./scaleplot.mjs";

export { BAND_CATEGORIES, CATEGORY_COLORS, bandEdges, bandHover, escapeHtml, formatFixed, formatPow2, pow2Short };

// ----------------------------------------------------------------- constants (style.py, base.py)
/** One colour per field of a bit pattern (style.py's FIELD_COLORS). */
export const FIELD_COLORS = Object.freeze({ sign: "#CC79A7", exponent: "#56B4E9", mantissa: "#E69F00" });
/** Light tints of FIELD_COLORS for bits that are 0 (base.py's _FIELD_TINTS). */
export const FIELD_TINTS = Object.freeze({ sign: "#F3DDE9", exponent: "#DDEFFA", mantissa: "#FAEBCC" });
/** Where plot_value draws its markers: a row above the band row (formats.py's _VALUE_MARK_Y). */
const VALUE_MARK_Y = 0.45;

function format(fmt) {
  const f = typeof fmt === "string" ? FORMATS[fmt] : fmt;
  if (!f || FORMATS[f.name] !== f) {
    throw new TypeError(`fmt must be one of ${Object.keys(FORMATS).join(", ")}, not ${String(fmt)}`);
  }
  return f;
}

/** The Python format's ``specials``: "ieee", "fn", "fnuz", "finite" or "fnu" (E8M0). */
export function specials(fmt) {
  const f = format(fmt);
  return f.kind === "e8m0" ? "fnu" : f.kind;
}

/** Whether the format has a sign bit, and subnormals (E8M0 has neither). */
const hasSign = (f) => f.kind !== "e8m0";

// ----------------------------------------------------------------- exact helpers
const F64 = new Float64Array(1);
const U32 = new Uint32Array(F64.buffer); // little-endian: U32[1] holds the sign and exponent

const isNegative = (x) => { F64[0] = x; return U32[1] >>> 31 === 1; }; // -0 included

/** Python's repr of a float: "0.1", "100.0", "1e-05", "1.5e+16", "-0.0", "inf", "nan". */
export function reprFloat(x) {
  x = Number(x);
  if (Number.isNaN(x)) return "nan";
  if (!Number.isFinite(x)) return x > 0 ? "inf" : "-inf";
  const sign = isNegative(x) ? "-" : "";
  if (x === 0) return `${sign}0.0`;
  // the shortest digits that round-trip, the nearest of them to x (Number::toString and Python's repr agree)
  const m = /^(\d+)(?:\.(\d+))?(?:e([+-]\d+))?$/.exec(String(Math.abs(x)));
  let digits = m[1] + (m[2] || "");
  let point = m[1].length + (m[3] ? Number(m[3]) : 0); // |x| = 0.digits * 10^point
  const lead = /^0*/.exec(digits)[0].length;
  digits = digits.slice(lead).replace(/0+$/, "");
  point -= lead;
  if (point > -4 && point <= 16) { // Python writes 1e-05 and 1e+16 with an exponent, 0.0001 and 1e15 without
    if (point <= 0) return `${sign}0.${"0".repeat(-point)}${digits}`;
    if (point >= digits.length) return `${sign}${digits}${"0".repeat(point - digits.length)}.0`;
    return `${sign}${digits.slice(0, point)}.${digits.slice(point)}`;
  }
  const mant = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
  const exp = point - 1;
  return `${sign}${mant}e${exp < 0 ? "-" : "+"}${String(Math.abs(exp)).padStart(2, "0")}`;
}

/** Python's format(n, "0<width>b"). */
function binary(n, width) {
  return n.toString(2).padStart(width, "0");
}

/** A format's bit pattern as FormatExplorer writes it: "0x3C00" (as many hex digits as the bits need). */
export function hexText(fmt, bits) {
  const f = format(fmt);
  return "0x" + bits.toString(16).toUpperCase().padStart(Math.floor((f.bits + 3) / 4), "0");
}

// ----------------------------------------------------------------- Python's str, repr and whitespace
// str.isspace(): what str.strip() removes, what \s matches in a str pattern, and what float() and
// int() read as a space
const PY_SPACE = "\\t\\n\\v\\f\\r\\x1c-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";
const IS_SPACE = new RegExp(`^[${PY_SPACE}]$`, "u");
const STRIP = new RegExp(`^[${PY_SPACE}]+|[${PY_SPACE}]+$`, "gu");
const ASCII_SPACE = /^[ \t\n\v\f\r]+|[ \t\n\v\f\r]+$/g; // C's isspace, which float() and int() strip
const IS_DIGIT = /^\p{Nd}$/u;
const UNPRINTABLE = /^[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}\p{Zs}]$/u;

/** Python's str.strip() with no argument. */
export function pyStrip(s) {
  return String(s).replace(STRIP, "");
}

const isDigitChar = (cp) => IS_DIGIT.test(String.fromCodePoint(cp));

/** The value of a Unicode decimal digit (category Nd): Unicode places each script's digits 0 to 9
 *  in a run of their own, so the value is the position in the run of digits, modulo 10. */
function digitValue(cp) {
  let k = 0;
  while (isDigitChar(cp - k - 1)) k++;
  return k % 10;
}

/** The text as float() and int() read it (CPython's _PyUnicode_TransformDecimalAndSpaceToASCII):
 *  ASCII as it is, a Unicode space as " ", a Unicode digit as its ASCII digit, and anything else as
 *  "?", where the text ends. */
function toAscii(s) {
  let out = "";
  for (const ch of s) {
    const cp = ch.codePointAt(0);
    if (cp < 127) out += ch;
    else if (IS_SPACE.test(ch)) out += " ";
    else if (isDigitChar(cp)) out += String(digitValue(cp));
    else return out + "?";
  }
  return out;
}

/** Python's repr of a str. */
export function reprStr(s) {
  s = String(s);
  const quote = s.includes("'") && !s.includes('"') ? '"' : "'";
  let out = quote;
  for (const ch of s) {
    const cp = ch.codePointAt(0);
    if (ch === quote || ch === "\\") out += "\\" + ch;
    else if (ch === "\t") out += "\\t";
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (cp < 0x20 || cp === 0x7f) out += "\\x" + cp.toString(16).padStart(2, "0");
    else if (cp < 0x7f || !UNPRINTABLE.test(ch)) out += ch;
    else if (cp <= 0xff) out += "\\x" + cp.toString(16).padStart(2, "0");
    else if (cp <= 0xffff) out += "\\u" + cp.toString(16).padStart(4, "0");
    else out += "\\U" + cp.toString(16).padStart(8, "0");
  }
  return out + quote;
}

/** A text as an explorer's message shows it (base.py's _shown): its repr, cut to 40 characters. */
export function shownText(s, limit = 40) {
  const points = [...String(s)];
  if (points.length <= limit) return reprStr(s);
  return `${reprStr(points.slice(0, limit).join(""))}… (${withCommas(points.length)} characters)`;
}

// ----------------------------------------------------------------- parse_number (base.py)
const POW2 = new RegExp(`^([+-]?)2[${PY_SPACE}]*(?:\\^|\\*\\*)[${PY_SPACE}]*\\(?[${PY_SPACE}]*([+-]?\\p{Nd}+)` +
  `[${PY_SPACE}]*\\)?$`, "u");
const DECIMAL = /^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$/;
const WORD = /^([+-]?)(inf|infinity|nan)$/i;

/** Python's float(s) for a str s, as {value, negative} (negative: the sign bit, which a NaN's
 *  JavaScript number need not keep), or null where float() raises ValueError. */
function pyFloat(s) {
  let t = toAscii(s);
  if (t.includes("\0")) return null;
  if (t.includes("_")) { // underscores only between digits, as in Python's literals
    let out = "", prev = "";
    for (const c of t) {
      const digit = c >= "0" && c <= "9";
      if (c === "_") {
        if (!(prev >= "0" && prev <= "9")) return null;
      } else {
        if (prev === "_" && !digit) return null;
        out += c;
      }
      prev = c;
    }
    if (prev === "_") return null;
    t = out;
  }
  t = t.replace(ASCII_SPACE, "");
  const word = WORD.exec(t);
  if (word) {
    const negative = word[1] === "-";
    return { value: word[2].toLowerCase() === "nan" ? NaN : negative ? -Infinity : Infinity, negative };
  }
  if (!DECIMAL.test(t)) return null;
  const value = Number(t); // correctly rounded, as Python's dtoa; "1e999" is inf there too
  return { value, negative: isNegative(value) };
}

/** The number a learner typed (base.py's parse_number) as {value, negative}: a decimal ("0.1",
 *  "1e-8", "65519"), a power of two ("2^-24", "2**-24"), "inf" or "nan"; negative is the sign bit
 *  ("-nan" has it). Throws a RangeError with Python's message otherwise. */
export function readNumber(text) {
  const s = pyStrip(text).replace(/\u2212/g, "-");
  if (!s) throw new RangeError("type a number, e.g. 0.1, 1e-8, 65519, 2^-24, inf or nan");
  const m = POW2.exec(s);
  if (m) {
    const digits = m[2].replace(/^[+-]+/, "").replace(/^0+/, "");
    const points = [...digits];
    // far beyond any float: no need to read the whole (possibly huge) exponent
    let k = points.length <= 6 ? points.reduce((n, c) => 10 * n + digitValue(c.codePointAt(0)), 0) : 1e7;
    if (m[2].startsWith("-")) k = -k;
    const v = k > 1023 ? Infinity : k < -1074 ? 0 : pow2(k); // math.ldexp(1.0, k): 2^-1075 ties to 0
    return m[1] === "-" ? { value: -v, negative: true } : { value: v, negative: false };
  }
  const parsed = pyFloat(s);
  if (parsed === null) {
    throw new RangeError(`could not read ${shownText(s)} as a number: type a decimal such as 0.1, 1e-8 or 65519, ` +
      "a power of two such as 2^-24, or inf / nan");
  }
  return parsed;
}

/** parse_number's value (a NaN's sign aside: see readNumber). */
export function parseNumber(text) {
  return readNumber(text).value;
}

/** A typed number cast into fmt ({bits, value, category}), as fmt.encode, quantize and classify
 *  of Python's float give them: a NaN keeps its sign, and a nonzero number that float32 flushes
 *  is "underflow". */
export function castTyped(fmt, typed) {
  const f = format(fmt);
  // a NaN as Python's float("nan") is (a quiet NaN), with its sign
  return Number.isNaN(typed.value) ? castBits32(f, typed.negative ? 0xffc00000 : 0x7fc00000) : cast(f, typed.value);
}

// ----------------------------------------------------------------- _parse_bits (base.py)
/** Python's int(s, base) of an ASCII-read text (base 0: from its prefix), as a BigInt; null where
 *  int() raises ValueError. */
function pyInt(t, base) {
  if (t.includes("\0")) return null;
  let s = t.replace(ASCII_SPACE, ""), sign = 1n;
  if (s[0] === "+" || s[0] === "-") { if (s[0] === "-") sign = -1n; s = s.slice(1); }
  const p = s.slice(0, 2).toLowerCase();
  if (base === 0) base = p === "0x" ? 16 : p === "0o" ? 8 : p === "0b" ? 2 : 10;
  if ((base === 16 && p === "0x") || (base === 8 && p === "0o") || (base === 2 && p === "0b")) s = s.slice(2);
  if (!s) return null;
  let n = 0n;
  for (const c of s) {
    const d = parseInt(c, 36);
    if (Number.isNaN(d) || d >= base) return null;
    n = n * BigInt(base) + BigInt(d);
  }
  return sign * n;
}

/** A bit pattern typed as hex ("0x3C00", "3c00"), binary ("0b0011110000000000") or octal ("0o17")
 *  (base.py's _parse_bits), as a BigInt; throws a RangeError with Python's message otherwise. */
export function parseBits(text) {
  const raw = pyStrip(text);
  const s = raw.replace(/_/g, "").replace(/ /g, "");
  if (!s) throw new RangeError("type a bit pattern, e.g. 0x3C00 or 0b0011110000000000");
  const base = ["0x", "0b", "0o"].includes(s.slice(0, 2).toLowerCase()) ? 0 : 16;
  const n = pyInt(toAscii(s), base);
  if (n === null) throw new RangeError(`could not read ${shownText(raw)} as a bit pattern: type hex such as 0x3C00`);
  return n;
}

/** bits (a number or BigInt) as a pattern of fmt; throws a RangeError with fmt.fields' message
 *  when it is out of range ("fp16 bit patterns have 16 bits: 0 to 65535 (0xFFFF); got 70000"). */
export function checkBits(fmt, bits) {
  const f = format(fmt);
  const n = BigInt(bits);
  const top = 2n ** BigInt(f.bits) - 1n;
  if (n >= 0n && n <= top) return Number(n);
  let got; // as numpy holds it: int64 or uint64, else a float (an int past float64's range is inf)
  if (n >= -(2n ** 63n) && n < 2n ** 64n) got = n.toString();
  else {
    const x = Number(n);
    got = Number.isInteger(x) && Math.abs(x) < 2 ** 64 ? BigInt(x).toString() : reprFloat(x);
  }
  throw new RangeError(`${f.name} bit patterns have ${f.bits} bits: 0 to ${top} (0x${top.toString(16).toUpperCase()}); ` +
    `got ${got}`);
}

// ----------------------------------------------------------------- neighbours and ulp (spec.py, beyond_ieee.py)
/** The values just below and above the stored value of x (FloatFormat.neighbours): -inf/inf past
 *  the ends of an "ieee" format, NaN (nothing there) in the others; E8M0's powers of two. */
export function neighbours(fmt, x) {
  const f = format(fmt);
  const q = quantize(f, x);
  if (Number.isNaN(q)) return [NaN, NaN];
  if (f.kind === "e8m0") {
    const c = encode(f, q);
    return [c > 0 ? decode(f, c - 1) : NaN, c < 254 ? decode(f, c + 1) : NaN];
  }
  if (!Number.isFinite(q)) return q > 0 ? [f.max, q] : [q, -f.max];
  const magBits = encode(f, Math.abs(q));
  const beyond = f.kind === "ieee" ? Infinity : NaN;
  const up = Math.abs(q) < f.max ? decode(f, magBits + 1) : beyond;
  const down = magBits > 0 ? decode(f, magBits - 1) : -f.smallestSubnormal;
  if (q > 0 || (q === 0 && !isNegative(q))) return [down, up];
  return [-up, -down];
}

/** The spacing of the format's grid at |x| (FloatFormat.ulp); NaN past the finite values. */
export function ulp(fmt, x) {
  const f = format(fmt);
  const a = Math.abs(quantize(f, x));
  if (!Number.isFinite(a)) return NaN;
  const e = a > 0 ? frexpExponent(a) - 1 : f.emin;
  return pow2(Math.max(e, f.emin) - f.mantissaBits);
}

// ----------------------------------------------------------------- FormatExplorer's readout
/** The field bit ``position`` belongs to: "sign", "exponent" or "mantissa" (FormatExplorer._field_of). */
export function fieldOf(fmt, position) {
  const f = format(fmt);
  if (position === f.bits - 1 && hasSign(f)) return "sign";
  return position >= f.mantissaBits ? "exponent" : "mantissa";
}

/** The legend above the bits (FormatExplorer's field_legend): each field's colour, size and bias,
 *  and the format's ``description`` (the Python format's). */
export function legendHtml(fmt, description) {
  const f = format(fmt);
  const sign = hasSign(f) ? `<span style="color:${FIELD_COLORS.sign}">■ sign (1 bit)</span>`
    : '<span style="color:#777">no sign bit</span>';
  const mantissa = f.mantissaBits
    ? `<span style="color:${FIELD_COLORS.mantissa}">■ mantissa (${f.mantissaBits} bits)</span>`
    : '<span style="color:#777">no mantissa</span>';
  return `${sign} &nbsp; <span style="color:${FIELD_COLORS.exponent}">■ exponent (${f.exponentBits} bits, ` +
    `bias ${f.bias})</span> &nbsp; ${mantissa} &nbsp; <i>${escapeHtml(description)}</i>`;
}

/** The bits in their field colours and the hex pattern (FormatExplorer._bits_html). */
export function bitsHtml(fmt, bits) {
  const f = format(fmt);
  const text = binary(bits, f.bits);
  const s = hasSign(f) ? 1 : 0;
  const parts = [text.slice(0, s), text.slice(s, s + f.exponentBits), text.slice(s + f.exponentBits)];
  const spans = ["sign", "exponent", "mantissa"].map((name, k) => [name, parts[k]]).filter(([, part]) => part)
    .map(([name, part]) => `<span style="color:${FIELD_COLORS[name]}">${part}</span>`);
  return `<code style="font-size:1.1em">${spans.join(" ")}</code> &nbsp; = ${hexText(f, bits)}`;
}

/** The rounding error row (FormatExplorer._error_text). */
export function errorText(typed, stored) {
  if (Number.isNaN(typed) || Number.isNaN(stored)) return "— (NaN)";
  if (!Number.isFinite(typed) && typed === stored) return "0";
  const err = typed - stored;
  if (!Number.isFinite(err)) return `${reprFloat(err)} (the value overflowed)`;
  const rel = typed !== 0 && Number.isFinite(typed) ? ` &nbsp; relative ${formatG(Math.abs(err) / Math.abs(typed), 3)}` : "";
  return `typed − stored = ${reprFloat(err)}${rel}`;
}

/** What the category means in this format (FormatExplorer._category_note). */
export function categoryNote(fmt, cat, typed, stored) {
  const f = format(fmt), kind = specials(f);
  if (cat === "overflow") {
    if (kind === "fn" || kind === "finite") {
      return ` — beyond max, saturated to ${formatNumber(f.max)} (no inf in ${f.name})`;
    }
    if (kind === "fnuz" || kind === "fnu") {
      return ` — at or beyond ${formatNumber(f.overflowBoundary)}, becomes NaN ` +
        `(no inf in ${f.name}; a saturating cast gives max ${formatNumber(f.max)})`;
    }
    return ` — at or beyond ${formatNumber(f.overflowBoundary)}, becomes inf`;
  }
  if (cat === "underflow") {
    if (!hasSign(f)) {
      return ` — at most ${formatPow2(f.underflowBoundary)}: ${f.name} has no zero, ` +
        `becomes its smallest value ${formatPow2(f.smallestNormal)}`;
    }
    return ` — at most ${formatPow2(f.underflowBoundary)}, becomes 0`;
  }
  if (cat === "zero" && !hasSign(f)) {
    return ` — ${f.name} has no zero: torch's cast gives its smallest value ${formatPow2(f.smallestNormal)}`;
  }
  if (cat === "normal" && !hasSign(f) && typed !== null && typed < 0) {
    return ` — ${f.name} has no sign: torch's cast keeps |x|`;
  }
  if (cat === "subnormal") return ` — below the smallest normal ${formatPow2(f.smallestNormal)}: fewer significant bits`;
  return "";
}

/** The three fields and how they make the value (FormatExplorer._fields_text). */
export function fieldsText(fmt, sign, exp, man, stored) {
  const f = format(fmt);
  const m = f.mantissaBits, e = f.exponentBits;
  const top = 2 ** e - 1;
  const expBits = binary(exp, e), manBits = m ? binary(man, m) : "";
  if (!hasSign(f)) { // E8M0: the exponent alone, every code a power of two but the NaN
    if (Number.isNaN(stored)) return `exponent ${expBits} = ${exp} (all ones): NaN<br>no sign bit, no mantissa`;
    return `exponent ${expBits} = ${exp}, ${exp} − bias ${f.bias} = ${exp - f.bias}<br>` +
      `no sign bit, no mantissa: value 2^${exp - f.bias} = ${reprFloat(stored)}`;
  }
  const parts = [`sign ${sign} (${sign ? "−" : "+"})`];
  if (Number.isNaN(stored) && f.kind === "fnuz") {
    parts.push(`exponent ${expBits} and mantissa ${manBits} with sign 1: the pattern −0 would have ` +
      `is NaN in ${f.name} (no −0, no inf)`);
    return parts.join("<br>");
  }
  if (Number.isNaN(stored)) {
    parts.push(`exponent ${expBits} (all ones) and mantissa ${manBits}: NaN`);
    return parts.join("<br>");
  }
  if (!Number.isFinite(stored)) {
    parts.push(`exponent ${expBits} (all ones) and mantissa 0: inf`);
    return parts.join("<br>");
  }
  let significand, power;
  if (exp === 0) {
    parts.push(`exponent ${expBits} = 0: subnormal, exponent 1 − ${f.bias} = ${f.emin}`);
    parts.push(`mantissa ${manBits} = ${man} → significand 0 + ${man}/2^${m}`);
    significand = man / 2 ** m;
    power = f.emin;
  } else {
    power = exp - f.bias;
    parts.push(`exponent ${expBits} = ${exp}, ${exp} − bias ${f.bias} = ${power}`);
    parts.push(`mantissa ${manBits} = ${man} → significand 1 + ${man}/2^${m}`);
    significand = 1 + man / 2 ** m;
  }
  parts.push(`value (−1)^${sign} × ${reprFloat(significand)} × 2^${power} = ${reprFloat(stored)}`);
  if (exp === top) parts.push(`(${f.name} has no inf: the top exponent holds numbers)`);
  if (f.kind === "finite" && exp === top && man === 2 ** m - 1) {
    parts.push(`(${f.name} has no NaN either: every pattern is a number)`);
  }
  return parts.join("<br>");
}

/** The category FormatExplorer shows: of the typed number once cast, or of the stored value when
 *  none was typed (``typed``: a number or null). */
export function categoryOf(fmt, bits, typed = null) {
  const f = format(fmt);
  if (typed !== null) return Number.isNaN(typed) ? "nan" : cast(f, typed).category;
  const stored = decode(f, bits);
  return Number.isNaN(stored) ? "nan" : cast(f, stored).category;
}

/** The readout table (FormatExplorer._readout_html) of pattern ``bits`` and the number typed
 *  (null when the bits were set directly). */
export function readoutHtml(fmt, bits, typed = null) {
  const f = format(fmt);
  const stored = decode(f, bits);
  const [sign, exp, man] = fields(f, bits);
  const cat = categoryOf(f, bits, typed);
  const rows = [];
  if (typed !== null) rows.push(["typed", reprFloat(typed)]);
  rows.push(["stored", `${reprFloat(stored)} &nbsp; (${escapeHtml(formatPow2(stored, 6))})`]);
  if (typed !== null) rows.push(["rounding error", errorText(typed, stored)]);
  rows.push(["category", `<b style="color:${CATEGORY_COLORS[cat]}">${cat}</b>` + categoryNote(f, cat, typed, stored)]);
  const [below, above] = neighbours(f, stored);
  rows.push(["neighbours", `below ${reprFloat(below)} &nbsp; above ${reprFloat(above)}`]);
  const u = ulp(f, stored);
  rows.push(["ulp here", reprFloat(u) + (Number.isFinite(u) ? ` &nbsp; (${escapeHtml(formatPow2(u))})` : "")]);
  rows.push(["fields", fieldsText(f, sign, exp, man, stored)]);
  const body = rows.map(([k, v]) => `<tr><td style="padding-right:1em;color:#555">${k}</td><td>${v}</td></tr>`).join("");
  return `<table>${body}</table>`;
}

// ----------------------------------------------------------------- plot_value (formats.py)
/** One bar trace per band category of one format, at y = ``y`` and ``width`` thick (formats.py's
 *  _band_traces for one format, as plot_value draws it). */
function bandTraces(f, [loX, hiX], y, width) {
  const edges = bandEdges(f);
  return BAND_CATEGORIES.map((cat) => {
    const [lo, hi] = edges[cat];
    const x0 = lo === 0 ? loX : log2(lo);
    const x1 = hi === Infinity ? hiX : log2(hi);
    let text;
    if (cat === "normal") text = `${pow2Short(f.smallestNormal)} … ${formatNumber(f.max)}`;
    else if (cat === "subnormal") text = hasSign(f) ? `from ${pow2Short(f.smallestSubnormal)}` : "";
    else if (cat === "underflow") text = pastMin(f);
    else text = pastMax(f);
    const hatched = cat === "overflow" && (f.kind === "fn" || f.kind === "finite");
    return {
      type: "bar", name: cat, y: [y], x: [x1 - x0], base: [x0], orientation: "h",
      marker: { color: CATEGORY_COLORS[cat], line: { width: 0 },
        pattern: { shape: [hatched ? "/" : ""], fgcolor: "rgba(255,255,255,0.5)", solidity: 0.12 } },
      opacity: 0.85,
      customdata: [[lo > 0 ? lo : null, Number.isFinite(hi) ? hi : null]],
      hovertext: [bandHover(f, cat)], hoverinfo: "text", text: [text], textposition: "inside",
      insidetextanchor: "middle", textfont: { color: "white" }, showlegend: false, legendgroup: cat,
      xaxis: "x", yaxis: "y", width,
    };
  });
}

/** Python's min and max of numbers: the first of equal ones (so -0 and 0 stay as they came). */
function pyMin(xs) { return xs.reduce((a, b) => (b < a ? b : a)); }
function pyMax(xs) { return xs.reduce((a, b) => (b > a ? b : a)); }

/** Short texts of ``values`` with as many significant digits as it takes to tell them apart, and
 *  apart from ``others`` (formats.py's _distinct_texts). */
export function distinctTexts(values, others = [], digits = 3) {
  const every = [...values, ...others.filter((v) => !values.some((w) => w === v))];
  const distinct = new Set(every).size; // a Set: -0 and 0 are one value, as in Python's set
  for (let d = digits; d < 18; d++) {
    const texts = every.map((v) => formatNumber(v, d));
    if (new Set(texts).size === distinct) return texts.slice(0, values.length);
  }
  return values.map(reprFloat);
}

/** How many gaps either side of the stored value the zoom reaches (formats.py's ZOOM_REACH). */
export const ZOOM_REACH = 1.4;
const TYPED_ROOM = 1 / 3;

/** The zoom panel's points, [label, value, position, colour, symbol] each, and its x range
 *  (formats.py's _zoom): a point's position is (v - stored) / gap, the gap the larger of the
 *  spaces from the stored value to its finite neighbours. */
export function zoomPoints(fmt, stored, typed = null) {
  const f = format(fmt);
  const points = [];
  const [below, above] = neighbours(f, stored);
  for (const item of [["below", below, "#777777", "line-ns-open"], ["stored", stored, "black", "diamond"],
    ["above", above, "#777777", "line-ns-open"]]) {
    if (Number.isFinite(item[1])) points.push(item);
  }
  if (typed !== null && Number.isFinite(typed) && typed !== stored) points.push(["typed", typed, "#E69F00", "x"]);
  const gaps = points.filter((p) => p[0] === "below" || p[0] === "above").map((p) => Math.abs(p[1] - stored));
  const gap = gaps.length ? pyMax(gaps) : 1.0;
  const zoom = points.map(([label, v, color, symbol]) => [label, v, (v - stored) / gap, color, symbol]);
  const xs = zoom.map((z) => z[2]);
  let range;
  if (pyMin(xs) >= -1.0 && pyMax(xs) <= 1.0) {
    range = [-ZOOM_REACH, ZOOM_REACH];
  } else { // a typed number far out (past a saturating format's max): every point in view
    const lo = pyMin([-1.0, ...xs]), hi = pyMax([1.0, ...xs]);
    range = [lo - 0.15 * (hi - lo), hi + 0.15 * (hi - lo)];
  }
  return { zoom, range };
}

/** Where ``value`` sits in ``fmt`` (formats.py's plot_value): {data, layout}, as
 *  plot_value(fmt, value, typed).to_plotly_json() has them, the template aside. ``typed``: the
 *  number before rounding, or null. Within a format the layout is the same for every stored value
 *  (the zoom is drawn in gaps from the stored value), so a move only moves points and texts. */
export function plotValue(fmt, value, typed = null) {
  const f = format(fmt);
  const stored = quantize(f, value);
  const xRange = log2Window([f], 5, 5);
  const [loX, hiX] = xRange;
  const log2Pos = (v) => {
    const a = Math.abs(v);
    if (a === 0) return loX + 1;
    if (a === Infinity) return hiX - 1;
    return Math.min(Math.max(log2(a), loX + 1), hiX - 1);
  };
  const traces = bandTraces(f, xRange, 0, 0.5);
  const marks = [["stored", stored, "black", "diamond"]];
  if (typed !== null && !Number.isNaN(typed) && typed !== stored) marks.push(["typed", typed, "#E69F00", "x"]);
  for (const [label, v, color, symbol] of marks) {
    if (Number.isNaN(v)) continue;
    traces.push({
      type: "scatter", name: label, x: [log2Pos(v)], y: [VALUE_MARK_Y], mode: "markers",
      marker: { symbol, size: 12, color, line: { width: 1, color: "white" } },
      hovertext: [`${label}: ${formatPow2(v)} (full: ${reprFloat(v)})`], hoverinfo: "text", showlegend: false,
      cliponaxis: false,
    });
  }
  const annotations = [];
  let zoom = [], zoomRange = [-ZOOM_REACH, ZOOM_REACH];
  if (Number.isFinite(stored)) {
    ({ zoom, range: zoomRange } = zoomPoints(f, stored, typed));
  } else {
    const why = Number.isNaN(stored) ? "NaN is not on the number line"
      : `${formatNumber(stored)}: beyond max = ${formatNumber(f.max)}`;
    annotations.push({ name: "zoom", text: why, x: 0.5, y: 0.15, xref: "paper", yref: "paper", showarrow: false,
      font: { size: 12 } });
  }
  for (const [label, v, x, color, symbol] of zoom) {
    traces.push({
      type: "scatter", name: label, x: [x], y: [0], mode: "markers+text", text: [label],
      textposition: label !== "typed" ? "top center" : "bottom center",
      marker: { symbol, size: 14, color, line: { width: 2, color } },
      hovertext: [`${label}: ${reprFloat(v)}`], hoverinfo: "text", showlegend: false, cliponaxis: false,
      xaxis: "x2", yaxis: "y2",
    });
  }
  if (zoom.length) {
    // each value written out under its marker; a typed value too close to the others is named by its marker only
    // [value, position] each, as Python's dict: -0 and 0 one key, the first of them kept (a Map keeps 0)
    const values = [];
    for (const [label, v, x] of zoom) {
      const far = label !== "typed" || pyMin(zoom.filter((z) => z[0] !== "typed").map((z) => Math.abs(x - z[2]))) > TYPED_ROOM;
      if (far && !values.some(([w]) => w === v)) values.push([v, x]);
    }
    values.sort((p, q) => p[0] - q[0]);
    const shown = values.map(([v]) => v);
    traces.push({
      type: "scatter", name: "values", x: values.map(([, x]) => x), y: shown.map(() => -1.0), mode: "text",
      text: distinctTexts(shown, zoom.map((z) => z[1])), textposition: "bottom center",
      textfont: { size: 12, color: "#444444" }, hoverinfo: "skip", showlegend: false, cliponaxis: false,
      xaxis: "x2", yaxis: "y2",
    });
  }
  const labelsAsTheyAre = { ticklabeloverflow: "allow" }, linear = { type: "linear" };
  const layout = {
    barmode: "overlay",
    height: 240,
    margin: { l: 70, r: 30, t: 30, b: 30 },
    showlegend: false,
    ...(annotations.length ? { annotations } : {}), // an empty list is left out, as plotly's validation does
    uniformtext: { minsize: 9, mode: "hide" },
    title: { text: `${f.name}: the stored value on the format's range, and between its neighbours`, x: 0.01,
      font: { size: 13 } },
    xaxis: { range: [...xRange], tickprefix: "2^", zeroline: false, domain: [0, 1], ...labelsAsTheyAre, ...linear },
    yaxis: { domain: [0.6, 1.0], range: [-0.3, 0.65], tickvals: [0], ticktext: [f.name], showgrid: false,
      zeroline: false, fixedrange: true, ...labelsAsTheyAre, ...linear },
    xaxis2: { anchor: "y2", domain: [0, 1], range: zoomRange, showgrid: false, showticklabels: false, zeroline: false,
      ...labelsAsTheyAre, ...linear },
    yaxis2: { domain: [0.0, 0.4], visible: false, range: [-1, 1.2], fixedrange: true, ...linear },
    ...(zoom.length ? { shapes: [{ type: "line", xref: "x2 domain", x0: 0, x1: 1, yref: "y2", y0: 0, y1: 0,
      line: { color: "#cccccc", width: 1 }, layer: "below" }] } : {}),
    meta: { fmt: f.name, stored: Number.isFinite(stored) ? stored : null },
  };
  return { data: traces, layout };
}
