// ampviz's scenario gradient streams (ampviz.scaling.synth), rebuilt in the browser bit for bit
// from what ampviz.scaling.recipes ships: the seed's standard normal draws (float64), a recipe of
// float64 scalars per scenario and strength, and the steps where exp2 may round differently here
// than in numpy (with their float32 values). Everything else is IEEE sums and products.

const LOG2_MIN = -126;
const LOG2_MAX = 127;

/** log2 of the level at every step, as numpy computes it: a constant, np.linspace(a, b, n), or a
 *  warm-up from a to b over level.steps steps (then b). */
function log2Level(level, n) {
  const out = new Float64Array(n);
  if (level.kind === "constant") {
    out.fill(level.a);
  } else if (level.kind === "line") {
    // np.linspace: i * step + start (i / div * delta when the step is 0), the last exactly b
    const div = n - 1;
    const delta = level.b - level.a;
    if (div > 0) {
      const step = delta / div;
      for (let i = 0; i < n; i++) out[i] = (step === 0 ? (i / div) * delta : i * step) + level.a;
      out[n - 1] = level.b;
    } else if (n === 1) {
      out[0] = 0 * delta + level.a;
    }
  } else if (level.kind === "warmup") {
    const w = level.steps;
    const span = level.b - level.a;
    for (let i = 0; i < n; i++) out[i] = level.a + span * (w === 0 ? 1 : Math.min(i / w, 1));
  } else {
    throw new RangeError(`unknown level kind ${level.kind}`);
  }
  return out;
}

/** log2 of the stream before exp2: draws * jitter + level, lifted at the events, clipped to
 *  float32's normal range (a Float64Array). */
export function log2Stream(recipe, normals) {
  const n = normals.length;
  const g = log2Level(recipe.level, n);
  const j = recipe.jitter;
  if (j !== 0) for (let i = 0; i < n; i++) g[i] = normals[i] * j + g[i];
  const ev = recipe.events;
  if (ev) {
    const lifted = new Uint8Array(n);
    for (let k = 0; k < ev.length; k++) for (let i = ev.offset + k; i < n; i += ev.every) lifted[i] = 1;
    for (let i = 0; i < n; i++) if (lifted[i]) g[i] += ev.log2_height;
  }
  for (let i = 0; i < n; i++) g[i] = Math.min(Math.max(g[i], LOG2_MIN), LOG2_MAX);
  return g;
}

/** The float32 stream of recipe over the draws normals, with exceptionSteps given their
 *  exceptionValues: equal to ampviz.scaling.synth.scenario for the same scenario, strength and seed. */
export function rebuild(recipe, normals, exceptionSteps = [], exceptionValues = []) {
  const g = log2Stream(recipe, normals);
  const out = new Float32Array(g.length);
  for (let i = 0; i < g.length; i++) out[i] = Math.pow(2, g[i]);
  for (let k = 0; k < exceptionSteps.length; k++) out[exceptionSteps[k]] = exceptionValues[k];
  return out;
}
