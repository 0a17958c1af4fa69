// ampviz's census in the browser: the same counts as ampviz.formats.census.census, exactly.
//
// census(values, fmt, scale): each float32 value multiplied by the float32 scale in float32 (as
// torch's `tensor * scale`), cast to fmt, and counted by category: zero (the value itself is 0),
// underflow (nonzero, cast to 0), subnormal, normal, overflow (inf included) and nan; and the
// log2 histogram of the exact products |value| * scale of the finite nonzero values (bins with a
// count only). One pass over the values, a few operations each; tests/browser/test_js_census.py
// holds it to the Python package.

import { FORMATS, frexpExponent } from "./formats.mjs";
import { cast } from "./formats.mjs";

export const CENSUS_CATEGORIES = ["zero", "underflow", "subnormal", "normal", "overflow", "nan"];

/** The census of float32 values (a Float32Array, or numbers) in fmt at a positive scale. */
export function census(values, fmt, scale = 1) {
  if (!FORMATS[fmt]) throw new RangeError(`fmt must be one of ${Object.keys(FORMATS).join(", ")}, not ${fmt}`);
  const s = Math.fround(Number(scale));
  if (!(Number.isFinite(s) && s > 0)) throw new RangeError(`scale must be a positive number that fits in float32, not ${scale}`);
  const v = values instanceof Float32Array ? values : Float32Array.from(values);
  const counts = Object.fromEntries(CENSUS_CATEGORIES.map((c) => [c, 0]));
  const bins = new Map();
  for (let i = 0; i < v.length; i++) {
    const a = Math.abs(v[i]);
    if (a === 0) { counts.zero++; continue; }
    if (Number.isNaN(a)) { counts.nan++; continue; }
    const category = cast(fmt, Math.fround(a * s)).category;
    counts[category === "zero" ? "underflow" : category]++; // a product float32 flushed: underflow
    if (a !== Infinity) {
      const bin = frexpExponent(a * s) - 1; // the exact product's binade
      bins.set(bin, (bins.get(bin) ?? 0) + 1);
    }
  }
  const log2Bins = [...bins.keys()].sort((x, y) => x - y);
  return { total: v.length, scale: s, counts, log2Bins, log2Counts: log2Bins.map((b) => bins.get(b)) };
}
