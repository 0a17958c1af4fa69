"""ampviz/widgets/js/scaleplot.mjs in Chromium against ampviz.plots.plot_scale_trace and ScalerLab's
lost share and readout, exactly: the step line's change points (and their envelope past
LINE_POINTS), the marked skipped steps and "1 in N" texts, the axis helpers, format_number, the
scalers' colours, underflow_fractions, the whole figure's data and layout (1, 2 and 4 overlaid
scalers, with and without a lost panel and the legend's counts), and three ScalerLabs computed
again in the page from their streams.

The traces are real runs: every preset and custom settings (odd factors, a clamp that stops the
run, a growth interval of 1 over 100,000 steps, a scale that backs off to 0) over every synthetic
scenario at several strengths. Floats are compared bit for bit, with one exception: numpy's log2
is not correctly rounded everywhere (its AVX-512 code is one ulp off for about 1 value in 20,000,
the C library's log2 elsewhere), while the page's is, so where a log2 of the page differs from
numpy's it must be the correctly rounded one (checked with 60-digit decimals) and numpy's the
neighbouring double. Each mutation test
shows that a plausible wrong port differs from the Python on this data."""

import base64
import dataclasses
import functools
import itertools
import math
import types
from decimal import Decimal, localcontext

import numpy as np
import pytest

from ampviz.formats.census import underflow_fractions
from ampviz.plots import format_number, plot_scale_trace
from ampviz.plots.axes import _changes, _log2_scale, _log2_ticks, _marked_part, _padded_range, _share_top, _thin
from ampviz.plots.scaling import LINE_POINTS, _envelope, _scale_steps, _skipped_marks
from ampviz.plots.style import PRESET_COLORS, scaler_colors
from ampviz.scaling import PRESETS, DynamicScaler, TorchGradScaler, simulate, synth
from ampviz.widgets import ScalerLab
import ampviz.widgets.scaler_lab as scaler_lab_module
from conftest import js_module_page

STEPS = 12_000
ODD_NAME = "odd %{x} <b>&'\""  # a hover template placeholder and HTML in a scaler's name
POLICIES = list(PRESETS.values()) + [
    dataclasses.replace(TorchGradScaler(growth_factor=1.5, backoff_factor=0.3, growth_interval=50), name="your settings"),
    dataclasses.replace(TorchGradScaler(growth_factor=1.001, backoff_factor=0.995, growth_interval=10), name="slow"),
    DynamicScaler(name="clamped", min_scale=1.0, max_scale=2.0**20, raise_at_min=True, growth_interval=40,
                  init_scale=8.0),
    DynamicScaler(name=ODD_NAME, growth_factor=3.0, backoff_factor=0.25, growth_interval=100, arithmetic="float32"),
]
MOSTS = (1, 7, 60, 61, 1000)  # markers per scaler: odd counts make linspace land on halves
DTYPES = {"Float64Array": np.float64, "Float32Array": np.float32, "Uint8Array": np.uint8, "Int32Array": np.int32,
          "Uint32Array": np.uint32}


def b64(a) -> str:
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode()


@functools.lru_cache(maxsize=None)
def runs() -> tuple:
    """(trace, stream) pairs: two policies per scenario and strength, then the special cases."""
    out = []
    combos = list(itertools.product(synth.SCENARIOS, (0.0, 0.5, 1.0)))
    for i, (name, strength) in enumerate(combos):
        g = synth.scenario(name, STEPS, strength, np.random.default_rng(i))
        for j in (2 * i, 2 * i + 1):
            loss = "float16" if j % 3 == 2 else "float32"
            out.append((simulate(POLICIES[j % len(POLICIES)], grad_max=g, loss_dtype=loss), g))

    def run(policy, g, **kw):
        out.append((simulate(policy, grad_max=g, **kw), g))

    by_name = {p.name: p for p in POLICIES}
    run(PRESETS["DeepSpeed ZeRO"], synth.scenario("spikes", 20_000, 1.0, np.random.default_rng(1)))  # stops
    run(by_name["clamped"], synth.scenario("warmup", 3000, 1.0, np.random.default_rng(1)))  # stops at step 4
    every = synth.scenario("spikes", 100_000, 0.7, np.random.default_rng(3))
    run(TorchGradScaler(growth_interval=1, init_scale=16.0), every)  # a change at every step
    run(dataclasses.replace(TorchGradScaler(growth_interval=1, growth_factor=1.001, backoff_factor=0.995),
                            name="your settings"), every)
    run(PRESETS["static 1024"], synth.scenario("steady", 5000, 0.0, np.random.default_rng(4)))  # nothing skipped
    run(TorchGradScaler(), np.zeros(0))
    run(TorchGradScaler(), np.ones(1))
    run(TorchGradScaler(), np.full(1, 1e6))
    run(TorchGradScaler(), np.full(300, np.inf))  # backs off to a scale of 0
    run(PRESETS["apex amp"], np.full(1200, np.inf))  # float64 backoffs to 0, then a stop
    return tuple(out)


def traces() -> list:
    return [t for t, _ in runs()]


@pytest.fixture(scope="module")
def page(browser):
    page = js_module_page(browser, "scaleplot", "P")
    page.evaluate("async () => { window.S = await import('/js/scaling.mjs'); }")
    page.evaluate("""() => {
      window.pack = (o) => {
        if (ArrayBuffer.isView(o)) return {$t: o.constructor.name, b: b64(o)};
        if (Array.isArray(o)) return o.map(pack);
        if (o && typeof o === 'object') return Object.fromEntries(Object.entries(o).map(([k, v]) => [k, pack(v)]));
        return o; };
      window.f64 = (t) => new Float64Array(bytesOf(t));
      window.f32 = (t) => new Float32Array(bytesOf(t));
      window.attempt = (f) => { try { return pack(f()); } catch (e) { return {error: e.message}; } }; }""")
    page.evaluate("""(items) => { window.T = items.map((r) => ({name: r.name, scale: f64(r.scale),
        skipped: new Uint8Array(bytesOf(r.skipped)), stoppedAt: r.stoppedAt, stopReason: r.stopReason,
        final: {scale: r.final}})); }""", [js_trace(t) for t in traces()])
    yield page
    page.close()


def js_trace(t) -> dict:
    return {"name": t.policy.name, "scale": b64(np.asarray(t.scale, np.float64)), "skipped": b64(t.skipped.astype(np.uint8)),
            "stoppedAt": t.stopped_at, "stopReason": t.stop_reason, "final": float(t.final.scale)}


# ----------------------------------------------------------------- comparing exactly
def unpack(o):
    """The page's answer with its typed arrays as numpy arrays."""
    if isinstance(o, dict):
        if set(o) == {"$t", "b"}:
            return np.frombuffer(base64.b64decode(o["b"]), DTYPES[o["$t"]])
        return {k: unpack(v) for k, v in o.items()}
    if isinstance(o, list):
        return [unpack(v) for v in o]
    return o


def from_plotly(o):
    """A figure's to_dict() with its base64 arrays as numpy arrays."""
    if isinstance(o, dict):
        if "bdata" in o and "dtype" in o and set(o) <= {"bdata", "dtype", "shape"}:
            return np.frombuffer(base64.b64decode(o["bdata"]), np.dtype(o["dtype"]))
        return {k: from_plotly(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [from_plotly(v) for v in o]
    return o


def same_bits(want, got, where):
    want, got = np.asarray(want, np.float64), np.asarray(got, np.float64)
    assert want.shape == got.shape, (where, want.shape, got.shape)
    nan = np.isnan(want)
    assert np.array_equal(nan, np.isnan(got)), where
    assert np.array_equal(want[~nan].view(np.uint64), got[~nan].view(np.uint64)), where


def same_array(want, got, where):
    want = np.asarray(want)
    if want.dtype.kind in "iub":
        got = np.asarray(got, np.float64)
        assert got.shape == want.shape and np.array_equal(got, want.astype(np.float64)), where
    else:
        same_bits(want, got, where)


def correctly_rounded_log2(x: float, y: float) -> bool:
    """Whether y is the double nearest log2(x) (60 significant digits decide)."""
    with localcontext() as ctx:
        ctx.prec = 60
        t = Decimal(x).ln() / Decimal(2).ln()
        off = abs(Decimal(y) - t)
        return all(off <= abs(Decimal(float(np.nextafter(y, d))) - t) for d in (-np.inf, np.inf))


LOG2_MISSES = []  # (scale, numpy's log2, the page's) where numpy's log2 is not correctly rounded


def same_log2(want, got, scales, where):
    """log2 values equal bit for bit, except where numpy's is one ulp from the correctly rounded one."""
    want, got, scales = (np.asarray(a, np.float64) for a in (want, got, scales))
    assert want.shape == got.shape, where
    nan = np.isnan(want)
    assert np.array_equal(nan, np.isnan(got)), where
    for i in np.flatnonzero(~nan & (want.view(np.uint64) != got.view(np.uint64))):
        x = abs(float(scales[i]))
        assert np.isfinite(want[i]) and np.nextafter(want[i], got[i]) == got[i], (where, x, want[i], got[i])
        assert correctly_rounded_log2(x, float(got[i])) and not correctly_rounded_log2(x, float(want[i])), \
            (where, x, want[i], got[i])
        LOG2_MISSES.append((x, want[i], got[i]))


def same(want, got, where=()):
    """Python's value (numbers, strings, lists, dicts, numpy arrays) equal to the page's, floats bit for bit."""
    if isinstance(want, np.ndarray):
        same_array(want, got, where)
    elif isinstance(want, dict):
        assert isinstance(got, dict) and set(want) == set(got), (where, sorted(want), got if not isinstance(got, dict)
                                                                  else sorted(got))
        for k in want:
            same(want[k], got[k], where + (k,))
    elif isinstance(want, (list, tuple)):
        if isinstance(got, np.ndarray) or (want and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                        for v in want) and isinstance(got, list)):
            assert len(want) == len(got), where
            same_bits(np.asarray(want, np.float64), np.asarray(got, np.float64), where)
        else:
            assert isinstance(got, list) and len(got) == len(want), (where, got)
            for k, (a, b) in enumerate(zip(want, got)):
                same(a, b, where + (k,))
    elif isinstance(want, (bool, np.bool_)) or want is None or isinstance(want, str):
        assert type(got) is type(bool(want) if isinstance(want, np.bool_) else want) and got == want, (where, want, got)
    elif isinstance(want, (int, float, np.integer, np.floating)):
        assert isinstance(got, (int, float)) and not isinstance(got, bool), (where, got)
        same_bits(np.float64(want), np.float64(got), where)
    else:
        raise AssertionError(f"{where}: cannot compare {type(want).__name__}")


def same_figure(fig, got, where):
    """A plotly figure (plot_scale_trace's) equal to the page's {data, layout}; the scale lines'
    log2 values as same_log2 allows."""
    want = from_plotly(fig.to_dict())
    assert set(want) == set(got) == {"data", "layout"}, where
    assert len(want["data"]) == len(got["data"]), where
    for k, (w, g) in enumerate(zip(want["data"], got["data"])):
        if w.get("meta", {}).get("kind") == "scale":
            same_log2(w["y"], g["y"], w["customdata"], where + (k, "y"))
            w, g = {**w, "y": None}, {**g, "y": None}
        same(w, g, where + ("data", k))
    same(want["layout"], got["layout"], where + ("layout",))


# ----------------------------------------------------------------- log2
def log2_values() -> np.ndarray:
    rng = np.random.default_rng(5)
    scales = np.unique(np.concatenate([np.asarray(t.scale, np.float64) for t in traces()]))
    return np.concatenate([
        scales, rng.random(100_000).astype(np.float32) * np.exp2(rng.integers(-140, 120, 100_000)),
        np.exp2(rng.uniform(-1074, 1024, 100_000)), 1 + np.arange(-500, 500) * 2.0**-52,
        rng.integers(1, 2**52, 2000).view(np.float64), [0.0, -0.0, np.inf, -np.inf, np.nan, -3.0, 5e-324],
        np.exp2(np.arange(-1074, 1024.0))])


def test_log2_scale_is_numpy_log2_or_correctly_rounded(page):
    x = log2_values()
    got = unpack(page.evaluate("(x) => pack(P.log2Scale(f64(x)))", b64(x)))
    before = len(LOG2_MISSES)
    same_log2(_log2_scale(x), got, x, ("log2",))
    misses = len(LOG2_MISSES) - before
    assert misses < x.size / 1000, misses  # rare: numpy's log2 is off by one ulp only now and then
    odd = x[np.isfinite(x) & (x > 0) & (np.frexp(x)[0] != 0.5)]
    assert odd.size > 200_000  # scales of the runs and random values that are not powers of two
    powers = np.frexp(x)[0] == 0.5
    same_bits(_log2_scale(x[powers]), got[powers], "powers of two")  # exact everywhere


def test_math_log2_would_be_caught(page):
    """A port that called Math.log2 would differ from numpy where numpy is correctly rounded."""
    x = log2_values()
    js = unpack(page.evaluate("(x) => pack(f64(x).map((v) => v === 0 ? -150 : Math.log2(Math.abs(v))))", b64(x)))
    want = _log2_scale(x)
    ok = ~np.isnan(want)
    bad = np.flatnonzero(ok & (js.view(np.uint64) != want.view(np.uint64)))
    assert any(correctly_rounded_log2(abs(float(x[i])), float(want[i])) for i in bad[:50])


# ----------------------------------------------------------------- the step line, the marks
SCALE_MOSTS = (LINE_POINTS, 400, 40, 7, 1)


def test_scale_steps_equal_the_package(page):
    got = unpack(page.evaluate("(mosts) => pack(T.map((t) => mosts.map((m) => P.scaleSteps(t.scale, m))))",
                               list(SCALE_MOSTS)))
    enveloped = 0
    for t, per in zip(traces(), got):
        for most, g in zip(SCALE_MOSTS, per):
            idx, sc = _scale_steps(t, most)
            same_array(idx, g["idx"], (t.policy.name, most, "idx"))
            same_bits(sc, g["scale"], (t.policy.name, most, "scale"))
            enveloped += _changes(t.scale).size + 2 > most
    assert enveloped > 20
    ts = traces()  # the runs hold the hard cases
    assert any(_changes(t.scale).size > LINE_POINTS for t in ts) and any(t.steps == 1 for t in ts)
    assert any(t.steps == 0 for t in ts) and any((np.asarray(t.scale) == 0).any() for t in ts)
    assert any(t.stopped_at is not None and t.stopped_at < t.steps - 2 for t in ts)
    default = unpack(page.evaluate("() => pack(T.map((t) => P.scaleSteps(t.scale).idx))"))
    for t, g in zip(traces(), default):
        same_array(_scale_steps(t)[0], g, (t.policy.name, "default"))


def test_skipped_marks_equal_the_package(page):
    got = unpack(page.evaluate("(mosts) => pack(T.map((t) => mosts.map((m) => P.skippedMarks(t, m))))", list(MOSTS)))
    for t, per in zip(traces(), got):
        for most, g in zip(MOSTS, per):
            skipped, shown, part = _skipped_marks(t, most)
            same_array(skipped, g["skipped"], (t.policy.name, most))
            same_array(shown, g["shown"], (t.policy.name, most))
            assert g["part"] == part, (t.policy.name, most)
    ts = traces()  # more skipped steps than marks, none skipped, a run that stops at step 4
    assert any(t.skipped_count > 1000 for t in ts) and any(t.skipped_count == 0 and t.steps > 1 for t in ts)
    assert any(t.stopped_at == 4 for t in ts)


def test_thin_equals_the_package(page):
    cases = [(np.arange(n) * 3 + 1, most) for n in (0, 1, 2, 5, 31, 61, 62, 121, 1000, 4001) for most in MOSTS + (200, 2)]
    got = unpack(page.evaluate("(cases) => pack(cases.map(([x, m]) => P.thin(f64(x), m)))",
                               [[b64(x.astype(np.float64)), m] for x, m in cases]))
    for (x, most), g in zip(cases, got):
        same_array(_thin(x, most), g, (x.size, most))


# ----------------------------------------------------------------- small helpers
def marked_pairs() -> list:
    pairs = [(s, t) for t in range(0, 200) for s in range(0, t + 3)]
    return pairs + [(60, 150), (60, 90), (2, 5), (2, 7), (1000, 1400), (60, 1_234_567), (1000, 2_500_000)]


def test_marked_part_equals_the_package(page):
    pairs = marked_pairs()
    got = page.evaluate("([s, t]) => s.map((x, i) => P.markedPart(x, t[i]))", [list(c) for c in zip(*pairs)])
    assert got == [_marked_part(s, t) for s, t in pairs]
    assert {"1 in 2", "1,000 of 1,400", "1 in 20576", "1 in 2500"} <= set(got)  # 150 / 60 = 2.5: to even


def value_sets() -> list:
    """Arrays of log2 values and of percentages: random, on whole multiples, at the ladders' edges,
    with NaN and inf, empty."""
    rng = np.random.default_rng(9)
    sets = [rng.normal(0, 30, 50), rng.integers(-40, 40, 20).astype(float), np.array([16.0]), np.array([-0.5]),
            np.array([-150.0, 127.0]), np.array([np.nan, 3.0, np.inf]), np.array([np.nan]), np.zeros(0),
            np.array([-0.25, -0.75]), np.array([0.1, 0.2])]
    for span in (6, 12, 30, 60, 120, 150, 300, 600, 601, 1200, 1201):
        sets.append(np.array([-3.0, -3.0 + span]))
        sets.append(np.array([-3.0, -3.0 + span + 1e-9]))
    for top in (1, 2, 5, 10, 50, 100, 500, 1000, 5000, 9000):
        for f in (1 / 1.2, 0.83, 0.84, 0.5, 1.0):
            sets.append(np.array([0.0, top * f]))
    sets += [np.array([41.666666666666664]), np.array([1e-9]), np.array([0.0]), np.array([-5.0]), np.array([1e6])]
    return sets


def test_axis_helpers_equal_the_package(page):
    sets = value_sets()
    steps = (1, 2, 5, 10, 20, 25, 50, 100, 200)
    got = unpack(page.evaluate("""([sets, steps]) => pack(sets.map((s) => ({ticks: P.log2Ticks(f64(s)),
        top: P.shareTop(f64(s)), ranges: steps.map((d) => P.paddedRange(f64(s), d))})))""",
                               [[b64(s) for s in sets], list(steps)]))
    for s, g in zip(sets, got):
        same(_log2_ticks(s), g["ticks"], ("ticks", s.tolist()))
        same(_share_top(s), g["top"], ("top", s.tolist()))
        for d, r in zip(steps, g["ranges"]):
            same(_padded_range(s, d), r, ("range", s.tolist(), d))


def numbers() -> list:
    rng = np.random.default_rng(11)
    f32 = np.float32(65536) * np.cumprod(np.full(120, np.float32(0.3), np.float32))
    grown = np.float32(3.0) * np.cumprod(np.full(120, np.float32(1.7), np.float32))
    special = [0.03125, 1.125e7, 0.125, 2.5, 0.0625, 1e7, 9999999.0, 9999999.5, 1e7 - 1, 12345678.0, 1e-4, 1.234e-5,
               1e-5, 123456.5, 5e-324, 1.7976931348623157e308, 0.0, -0.0, float("nan"), float("inf"), float("-inf"),
               1e16, 2.0**53, -(2.0**60), 0.5, 999.5, 99950000.0, 0.00012345, 1234.5, 0.1, 0.15000000000000002,
               0.35, 0.7000000000000001, 1e-300, 65504.0, 2.0**-24, 3.0e38]
    return ([2.0**k for k in range(-100, 101)] + [-(2.0**k) for k in range(-30, 31, 7)] + f32.tolist()
            + grown.tolist() + (np.exp(rng.uniform(-80, 80, 1500)) * rng.choice([-1, 1], 1500)).tolist() + special)


def test_format_number_equals_the_package(page):
    xs = numbers()
    got = page.evaluate("""(xs) => [xs.map((x) => P.formatNumber(x)),
        [1, 2, 4, 6].map((d) => xs.map((x) => P.formatNumber(x, d))), xs.map((x) => P.formatG(x))]""", xs)
    assert got[0] == [format_number(x) for x in xs]
    for d, g in zip((1, 2, 4, 6), got[1]):
        assert g == [format_number(x, d) for x in xs], d
    assert got[2] == [f"{x:g}" for x in xs]


def test_scaler_colors_equal_the_package(page):
    names = list(PRESET_COLORS) + ["your settings", "mine", ODD_NAME]
    rng = np.random.default_rng(2)
    cases = [[]] + [[n] for n in names] + [list(rng.choice(names, k)) for k in (2, 3, 4, 8, 12, 20) for _ in range(6)]
    cases.append(names + ["a", "b", "c"])
    cases = [[str(n) for n in c] for c in cases]
    assert page.evaluate("(cases) => cases.map((c) => P.scalerColors(c))", cases) == [scaler_colors(c) for c in cases]


# ----------------------------------------------------------------- underflow fractions, lost share
@functools.lru_cache(maxsize=None)
def census_data() -> np.ndarray:
    rng = np.random.default_rng(0)
    n = 20000
    x = (rng.standard_normal(n) * np.exp2(rng.uniform(-40, 20, n))).astype(np.float32)
    x[:50] = 0
    x[50:60] = -0.0
    x[60:200] = (np.float32(2.0**-149) * rng.integers(1, 2**20, 140)).astype(np.float32)
    x[200:210] = np.inf
    x[210:215] = np.nan
    return x


def edge_data(fmt_boundary: float, scales) -> np.ndarray:
    """float32 values whose float32 products with each scale land on and beside the underflow boundary."""
    out = []
    for s in scales:
        with np.errstate(over="ignore", under="ignore"):
            t = np.float32(fmt_boundary / float(np.float32(s)))
            for d in (np.float32(0), np.float32(np.inf)):
                v = t
                for _ in range(4):
                    out.append(v)
                    v = np.nextafter(v, d)
    return np.array(out, np.float32)


FRACTION_SCALES = [2.0**k for k in range(-30, 41, 3)] + [3.0, 1 / 3, 65504.0, 0.7, 1.7**5, 2.0**-140, 3e38, 0.3**9]


def test_underflow_fractions_equal_the_package(page):
    from ampviz.formats import ALL_FORMATS

    cases = []
    for fmt in ("fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "fp32"):
        x = np.concatenate([census_data(), edge_data(ALL_FORMATS[fmt].underflow_boundary, FRACTION_SCALES)])
        cases.append((x, fmt, FRACTION_SCALES + FRACTION_SCALES[:5]))
    cases.append((np.zeros(0, np.float32), "fp16", [1.0, 2.0]))
    cases.append((np.array([np.nan, 0.0], np.float32), "fp16", [1.0]))
    got = unpack(page.evaluate("(cases) => cases.map(([x, fmt, s]) => pack(P.underflowFractions(f32(x), fmt, s)))",
                               [[b64(x), fmt, s] for x, fmt, s in cases]))
    for (x, fmt, s), g in zip(cases, got):
        same_bits(underflow_fractions(x, fmt, s), g, fmt)
        assert fmt == "fp32" or x.size < 10 or np.ptp(g) > 0  # the shares vary with the scale


def test_bad_scales_are_refused_as_in_python(page):
    for s in (0.0, -1.0, np.inf, np.nan, 1e39, 1e-50):
        with pytest.raises(ValueError):
            underflow_fractions(np.ones(3, np.float32), "fp16", [s])
    errors = page.evaluate("""() => [0, -1, Infinity, NaN, 1e39, 1e-50].map((s) =>
        attempt(() => P.underflowFractions(new Float32Array([1, 1, 1]), 'fp16', [s])))""")
    assert all("positive number" in e["error"] for e in errors), errors


def test_a_float64_edge_search_would_be_caught(page):
    """An edge search that multiplied in float64 (no rounding of the product to float32) would
    count some of the edge values differently at odd scales."""
    x = np.concatenate([census_data(), edge_data(2.0**-25, FRACTION_SCALES)])
    got = unpack(page.evaluate("""([x, scales]) => {
        const v = f32(x), bits = new Uint32Array(v.buffer).map((b) => b & 0x7fffffff).filter((b) => b <= 0x7f800000).sort();
        const below = (t) => bits.filter((b) => b < t).length, zeros = below(1);
        const asFloat = (b) => new Float32Array(new Uint32Array([b]).buffer)[0];
        return pack(Float64Array.from(scales, (sc) => { const s = Math.fround(sc); let lo = 1, hi = 0x7f800000;
          while (lo < hi) { const mid = Math.floor((lo + hi) / 2); if (asFloat(mid) * s > 2 ** -25) hi = mid; else lo = mid + 1; }
          return (below(lo) - zeros) / v.length; })); }""", [b64(x), FRACTION_SCALES]))
    want = underflow_fractions(x, "fp16", FRACTION_SCALES)
    assert not np.array_equal(got, want)


@functools.lru_cache(maxsize=None)
def grad_shapes() -> tuple:
    rng = np.random.default_rng(0)
    lab = np.exp2(-np.abs(rng.normal(0.0, 8.0, 20_000))).astype(np.float32)  # ScalerLab's default sample
    odd = np.abs(census_data())
    odd = odd[np.isfinite(odd)]
    return tuple(g / g.max() for g in (lab, odd))


def lost_cases() -> list:
    """(trace, shape, level): every run, at its stream's median level or an odd one."""
    shapes = grad_shapes()
    out = []
    for i, (t, g) in enumerate(runs()):
        typical = float(np.median(g)) if g.size else 1.0
        level = [typical if math.isfinite(typical) else 1.0, 3.7e-3, 1.0][i % 3]
        out.append((t, shapes[i % 2], level))
    return out


def python_lost(trace, shape, level):
    lab = types.SimpleNamespace(_grad_shape=shape, _lost_cache={})
    return ScalerLab._lost_share(lab, trace, level)


def test_lost_share_equals_scaler_labs(page):
    cases = lost_cases()
    shapes = grad_shapes()
    got = unpack(page.evaluate("""([cases, shapes]) => { const sh = shapes.map(f32);
        return cases.map(([i, j, level]) => attempt(() => P.lostShare(T[i].scale, sh[j], level))); }""",
                               [[[i, next(k for k, s in enumerate(shapes) if s is shape), level]
                                 for i, (_, shape, level) in enumerate(cases)], [b64(s) for s in shapes]]))
    refused = nonzero = 0
    for (t, shape, level), g in zip(cases, got):
        try:
            steps, shares = python_lost(t, shape, level)
        except ValueError:  # a float64 scale below float32's least subnormal: Python refuses it too
            refused += 1
            assert "positive number" in g["error"], t.policy.name
            continue
        same_array(steps, g["steps"], (t.policy.name, "steps"))
        same_bits(shares, g["shares"], (t.policy.name, "shares"))
        nonzero += bool(shares.size and 0 < shares.max() < 1)
    assert nonzero > 5 and refused >= 1


def test_lost_sample_is_float32_as_numpy_makes_it(page):
    shape = grad_shapes()[0]
    for level in (0.0625, 0.1234567891234, 3.7e-3, float(np.median(runs()[0][1]))):
        got = unpack(page.evaluate("([s, l]) => pack(P.lostSample(f32(s), l))", [b64(shape), level]))
        want = (shape * level).astype(np.float32)
        assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32)), level


def test_a_float64_sample_would_be_caught():
    """numpy multiplies the float32 shape by the level rounded to float32 first: a product in
    float64, rounded once, differs in many values."""
    shape = grad_shapes()[0]
    level = 0.1234567891234
    assert not np.array_equal((shape * level).astype(np.float32), (shape.astype(np.float64) * level).astype(np.float32))


# ----------------------------------------------------------------- the whole figure
def figure_cases() -> list:
    """(trace indices, lost: None or name -> (steps, shares), max_markers, legend_counts, title)."""
    ts = traces()
    shapes = grad_shapes()
    lost_of = {}

    def lost(i):
        if i not in lost_of:
            try:
                lost_of[i] = python_lost(ts[i], shapes[i % 2], 3.7e-3 * (1 + i))
            except ValueError:
                lost_of[i] = (np.array([0, 1]), np.array([0.25, 0.5]))
        return lost_of[i]

    n = len(ts)
    cases = [((i,), None, 60, True, None) for i in range(n)]
    cases += [((i,), {"your settings": lost(i)}, 7, False, "") for i in range(0, n, 3)]
    cases += [((i, (i + 5) % n), {ts[i].policy.name: lost(i)}, 61, i % 2 == 0, "two ∑ %{x}") for i in range(0, n, 2)]
    cases += [(tuple((i + 7 * k) % n for k in range(4)), {"your settings": lost(i), "other": lost((i + 1) % n)},
               [1, 60, 1000][i % 3], i % 3 == 0, None) for i in range(0, n, 2)]
    cases += [((0,), {"a": lost(0), "b": lost(1), "c": lost(2)}, 60, True, None), ((0, 1), {}, 60, True, "empty lost")]
    return cases


def test_figures_equal_plot_scale_trace(page):
    from ampviz.plots.style import _template
    import plotly.io as pio

    ts = traces()
    cases = figure_cases()
    template = _template(pio.templates.default)
    payload = [[list(ix), None if lost is None else [[k, b64(np.asarray(s, np.float64)), b64(np.asarray(v, np.float64))]
                                                      for k, (s, v) in lost.items()], most, counts, title]
               for ix, lost, most, counts, title in cases]
    got = unpack(page.evaluate("""([cases, template]) => cases.map(([ix, lost, most, counts, title]) => pack(
        P.scaleTraceFigure(ix.map((i) => T[i]), {title, maxMarkers: most, legendCounts: counts, template,
          lost: lost && new Map(lost.map(([k, s, v]) => [k, {steps: f64(s), shares: f64(v)}]))})))""",
                               [payload, template]))
    for (ix, lost, most, counts, title), g in zip(cases, got):
        fig = plot_scale_trace([ts[i] for i in ix], lost=lost, max_markers=most, legend_counts=counts, title=title)
        same_figure(fig, g, (ix, most, counts))


# ----------------------------------------------------------------- the readout
def test_readout_equals_scaler_labs(page, monkeypatch):
    ts = traces()
    groups = [[i] for i in range(len(ts))] + [list(range(k, len(ts), 5)) for k in range(5)]
    got = page.evaluate("""(groups) => groups.flatMap((g) => [60, 7].map((m) => [P.readoutRows(g.map((i) => T[i]), m),
        P.readoutHtml(g.map((i) => T[i]), m)]))""", groups)
    want_html = [ScalerLab._readout_html(types.SimpleNamespace(MARKS=m), [ts[i] for i in g]) for g in groups for m in (60, 7)]
    monkeypatch.setattr(scaler_lab_module, "_table", lambda head, rows: [list(r) for r in rows])
    want_rows = [ScalerLab._readout_html(types.SimpleNamespace(MARKS=m), [ts[i] for i in g]) for g in groups for m in (60, 7)]
    assert [r for r, _ in got] == want_rows
    assert [h for _, h in got] == want_html
    assert any("stopped at step" in h and "(Exception" in h for h in want_html) and any("&lt;b&gt;&amp;&#x27;&quot;" in h
                                                                                      for h in want_html)


# ----------------------------------------------------------------- ScalerLab, computed again in the page
LABS = [
    dict(steps=20_000, scenario="spikes", strength=1.0, loss_dtype="float16",
         overlay=("DeepSpeed ZeRO", "Megatron", "apex amp")),
    dict(steps=30_000, scenario="warmup", strength=0.95, growth_factor=1.7, backoff_factor=0.3, growth_interval=7,
         init_scale=2.0**20, overlay=("fairseq",)),
    dict(steps=12_000, scenario="drift", strength=0.85, growth_interval=1, backoff_factor=0.995, growth_factor=1.001,
         overlay=("jmp", "DeepSpeed", "NeMo (apex hysteresis)")),
]


def as_js(policy) -> dict:
    fields = dataclasses.asdict(policy)
    fields.pop("source")
    return fields


def test_scaler_lab_equals_the_page(page):
    from ampviz.plots.style import _template
    import plotly.io as pio

    template = _template(pio.templates.default)
    lost_seen = 0
    for settings in LABS:
        lab = ScalerLab(**settings)
        g = lab.stream
        loss = lab.loss_dropdown.value
        policies = [lab.policy()] + [PRESETS[n] for n in lab.overlay.value]
        got = unpack(page.evaluate("""([policies, g, loss, shape, level, title, template]) => {
            const traces = policies.map((p) => ({name: p.name, ...S.simulate(p, {gradMax: f64(g), fmt: 'fp16',
              lossInFormat: loss === 'float16'})}));
            const lost = P.lostShare(traces[0].scale, f32(shape), level);
            return pack({lost, readout: P.readoutHtml(traces, 60), column: P.readoutHtml(traces, 60, {inColumn: true}),
              title: P.scalerLabTitle(...title),
              figure: P.scaleTraceFigure(traces, {title: P.scalerLabTitle(...title), lost: {'your settings': lost},
                legendCounts: false, maxMarkers: 60, template})}); }""",
                                   [[as_js(p) for p in policies], b64(np.asarray(g, np.float64)), loss, b64(lab._grad_shape),
                                    float(np.median(g)), [lab.scenario_dropdown.value, lab.strength_slider.value,
                                                          lab.steps, loss], template]))
        steps, shares = lab.lost
        same_array(steps, got["lost"]["steps"], "lost steps")
        same_bits(shares, got["lost"]["shares"], "lost shares")
        lost_seen += shares.max() > 0
        assert got["readout"] == lab._readout_html()
        assert got["column"] == lab.readout.value
        assert got["title"] == lab.figure.layout.title.text
        same_figure(lab.figure, got["figure"], (settings["scenario"],))
    assert lost_seen >= 2


def test_scaler_lab_title_equals_the_labs_for_slider_strengths(page):
    strengths = [0.0, 1.0, 0.05, 0.15000000000000002, 0.35, 0.7000000000000001, 1 / 3, 0.123456789]
    got = page.evaluate("(xs) => xs.map((x) => P.scalerLabTitle('bursts', x, 1234567, 'float16'))", strengths)
    assert got == [f"bursts gradients (strength {x:g}), 1,234,567 steps, fp16 loss" for x in strengths]


# ----------------------------------------------------------------- wrong ports that the tests catch
def test_thinning_half_up_would_be_caught():
    """numpy's round is half to even: a half-up thinning marks other steps (where `most` is odd,
    linspace lands on halves; at ScalerLab's 60 and 200 it never does)."""
    def half_up(idx, most):
        return idx if idx.size <= most else idx[np.floor(np.linspace(0, idx.size - 1, most) + 0.5).astype(np.int64)]

    differ = 0
    for t in traces():
        skipped = _skipped_marks(t, 10**9)[0]
        for most in MOSTS:
            differ += not np.array_equal(half_up(skipped, most), _thin(skipped, most))
    assert differ > 0


def test_envelope_keeping_the_last_lowest_would_be_caught():
    def last_lowest(idx, y, n, groups):
        group = idx * groups // n
        keep = set()
        for g in np.unique(group):
            pos = np.flatnonzero(group == g)
            keep |= {pos[0], pos[-1]}
            ys = y[pos]
            if not np.isnan(ys).all():
                keep.add(pos[np.flatnonzero(ys == np.nanmin(ys))[-1]])
                keep.add(pos[np.flatnonzero(ys == np.nanmax(ys))[0]])
        return idx[sorted(keep)]

    differ = 0
    for t in traces():
        s = np.asarray(t.scale, np.float64)
        if not s.size:
            continue
        idx = np.concatenate([[0], _changes(s), [s.size - 1]])
        for most in SCALE_MOSTS:
            if idx.size > most:
                args = (idx, _log2_scale(s[idx]), s.size, max(most // 4, 1))
                differ += not np.array_equal(last_lowest(*args), _envelope(*args))
    assert differ > 0


def test_share_top_without_headroom_would_be_caught():
    def no_headroom(percent):
        v = np.asarray(percent, np.float64)
        v = v[np.isfinite(v)]
        top = float(v.max()) if v.size else 0.0
        return _share_top(np.array([top / 1.2])) if top > 0 else 1.0

    percents = [100 * np.asarray(lost[1], np.float64) for _, lost, *_ in figure_cases() if lost
                for lost in lost.values()] + value_sets()
    assert any(no_headroom(p) != _share_top(p) for p in percents)


def test_changes_without_nan_equal_to_nan_would_be_caught():
    """After a stop the scale is NaN at every step: a change test with NaN != NaN would draw a point
    at each of them."""
    stopped = [t for t in traces() if t.stopped_at is not None and t.stopped_at < t.steps - 2]
    assert stopped
    for t in stopped:
        s = np.asarray(t.scale, np.float64)
        assert not np.array_equal(np.flatnonzero(s[1:] != s[:-1]) + 1, _changes(s))


def test_marked_part_rounding_half_up_would_be_caught():
    def half_up(shown, total):
        ratio = total / max(shown, 1)
        return "" if shown >= total else (f"1 in {math.floor(ratio + 0.5)}" if ratio >= 1.5 else f"{shown:,} of {total:,}")

    assert any(half_up(s, t) != _marked_part(s, t) for s, t in marked_pairs())


def test_padded_range_without_the_quarter_step_would_be_caught():
    def no_pad(values, step):
        v = np.asarray(values, np.float64)
        v = v[np.isfinite(v)]
        return None if not v.size else [float(np.floor(v.min() / step) * step), float(np.ceil(v.max() / step) * step)]

    ys = [_log2_scale(_scale_steps(t)[1]) for t in traces()]
    assert any(no_pad(y, _log2_ticks(y)["dtick"]) != _padded_range(y, _log2_ticks(y)["dtick"]) for y in ys if y.size)


def test_skipped_counted_after_a_stop_would_be_caught():
    """The legend counts no skipped step after a stop (every later step is flagged skipped)."""
    stopped = [t for t in traces() if t.stopped_at is not None and t.stopped_at < t.steps - 2]
    assert all(int(t.skipped.sum()) != t.skipped_count for t in stopped)


def test_to_precision_formatting_would_be_caught(page):
    """Number.prototype.toPrecision rounds a tie up, Python's "{:.3g}" to even (2^-5 = 0.03125 is
    "0.0312"): a port on toPrecision would write some powers of two differently."""
    xs = [x for x in numbers() if math.isfinite(x) and x != int(x)]
    got = page.evaluate("(xs) => xs.map((x) => String(Number(x.toPrecision(3))))", xs)
    assert any(g != format_number(x) for g, x in zip(got, xs) if "e" not in format_number(x))
