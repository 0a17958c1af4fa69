"""ampviz/widgets/js/streams.mjs in Chromium against ampviz.scaling.synth, bit for bit: every
scenario at every position of ScalerLab's strength slider over 100,000 steps, strengths between
them, other seeds and lengths; log2 of the stream before the exp2 equal to the float64 bit, and
the float32 stream equal once the shipped exceptions are applied."""

import base64

import numpy as np
import pytest

from ampviz.scaling import recipes, synth
from conftest import js_module_page

GRID = [round(k * 0.05, 12) for k in range(21)]


@pytest.fixture(scope="module")
def page(browser):
    page = js_module_page(browser, "streams", "T")
    yield page
    page.close()


def load_normals(page, z: np.ndarray) -> None:
    page.evaluate("(b) => { window.Z = new Float64Array(bytesOf(b)); }", base64.b64encode(z.tobytes()).decode())


SIG_JS = """(t) => { const w = new Uint32Array(t.buffer, t.byteOffset, t.byteLength / 4); let a = 0, b = 0;
    for (let i = 0; i < w.length; i++) { a = (a + Math.imul(w[i], 2 * i + 1)) >>> 0;
      b = (b + Math.imul(w[i], 2 * ((i * i) % 2147483648) + 1)) >>> 0; } return [a, b]; }"""


def sig(a: np.ndarray) -> list:
    """Two sums of the array's 32-bit words, each word times an odd weight (mod 2^32): any one
    word changed changes both (an odd weight is invertible mod 2^32). The page computes the same."""
    w = np.frombuffer(np.ascontiguousarray(a).tobytes(), np.uint32).astype(np.uint64)
    i = np.arange(w.size, dtype=np.uint64)
    mask = np.uint64(2**32 - 1)
    a_ = int(((w * (2 * i + 1)) & mask).sum() & mask)
    b_ = int(((w * (2 * ((i * i) % np.uint64(2**31)) + 1)) & mask).sum() & mask)
    return [a_, b_]


def js_streams(page, recs: list, with_exceptions: list, whole: bool) -> list:
    """Per recipe, log2 of the stream and the float32 stream as the page computes them: the arrays
    (whole) or their signatures."""
    got = page.evaluate("""([recs, exc, whole, sigSrc]) => { const sig = eval(sigSrc);
        const out = (t) => whole ? b64(t) : sig(t);
        return recs.map((r, k) => ({ log2: out(T.log2Stream(r, Z)), g: out(T.rebuild(r, Z, exc[k][0], exc[k][1])) })); }""",
                        [recs, with_exceptions, whole, SIG_JS])
    if not whole:
        return [(o["log2"], o["g"]) for o in got]
    return [(np.frombuffer(base64.b64decode(o["log2"]), np.float64),
             np.frombuffer(base64.b64decode(o["g"]), np.float32)) for o in got]


def check(page, steps: int, seed: int, strengths, whole: bool = True) -> int:
    z = recipes.normals(steps, seed)
    load_normals(page, z)
    recs, exc, want = [], [], []
    for name in synth.SCENARIOS:
        for s in strengths:
            rec = recipes.recipe(name, s)
            at, values = recipes.exceptions(rec, z)
            recs.append(rec)
            exc.append([at.tolist(), values.astype(np.float64).tolist()])
            want.append((recipes._log2_stream(rec, z), synth.scenario(name, steps, s, np.random.default_rng(seed))))
    exceptions = 0
    for rec, (log2, g), (want_log2, want_g), (at, _) in zip(recs, js_streams(page, recs, exc, whole), want, exc):
        if whole:
            assert np.array_equal(log2, want_log2), rec
            assert np.array_equal(g, want_g), rec
        else:
            assert log2 == sig(want_log2) and g == sig(want_g), rec
        exceptions += len(at)
    return exceptions


def test_the_signature_sees_any_one_word_changed(page):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(1001).astype(np.float32)
    got = page.evaluate("([b, src]) => eval(src)(new Float32Array(bytesOf(b)))", [base64.b64encode(a.tobytes()).decode(), SIG_JS])
    assert got == sig(a)
    for k in (0, 500, 1000):
        for flip in (1, 2**31, 2**20 + 3):
            b = a.copy().view(np.uint32)
            b[k] ^= np.uint32(flip)
            s = sig(b.view(np.float32))
            assert s[0] != got[0] and s[1] != got[1], (k, flip)


def test_every_scenario_at_every_slider_position_is_the_same_stream(page):
    # the grid holds a step next to a float32 midpoint: the shipped exception is exercised
    assert check(page, 100_000, 0, GRID, whole=False) >= 1
    check(page, 20_000, 0, GRID[::4])


def test_strengths_between_positions_seeds_and_lengths(page):
    rng = np.random.default_rng(5)
    check(page, 5_000, 3, list(rng.random(8)) + [0.35000000000000003, 1e-300])
    for steps in (1, 2, 3):
        check(page, steps, 1, [0.0, 0.5, 1.0])


def test_the_float64_arithmetic_is_what_the_test_holds(page):
    """A JS linspace as a + i * (b - a) / div (one plausible port) changes log2 of the drift stream
    in the last bit, which the test above compares: it would be caught."""
    z = recipes.normals(20_000, 0)
    load_normals(page, z)
    rec = recipes.recipe("drift", 0.7)
    wrong = page.evaluate("""(r) => { const n = Z.length, out = new Float64Array(n);
        for (let i = 0; i < n; i++) out[i] = Z[i] * r.jitter + (r.level.a + i * (r.level.b - r.level.a) / (n - 1));
        return b64(out); }""", rec)
    assert not np.array_equal(np.frombuffer(base64.b64decode(wrong), np.float64), recipes._log2_stream(rec, z))


def test_an_unknown_level_is_an_error(page):
    msg = page.evaluate("""() => { try { T.log2Stream({jitter: 0, level: {kind: "zigzag"}, events: null}, Z); }
        catch (e) { return e.message; } }""")
    assert msg == "unknown level kind zigzag"
