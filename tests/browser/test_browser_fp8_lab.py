"""BrowserFp8ScalingLab's front end in Chromium, with no kernel (the page's own model, as on a static
page): for many seeded random settings of every control (recipe, history length, algo, margin,
format, spike size, non-finite steps, stream seed), the stream, the run, the readout and the figure
the page computes equal the package's bit for bit (the functions Fp8ScalingLab draws with, and the kernel's
lab moved to the same settings); a key press, a drag, a typed history length, a recipe change and
a model change redraw in the page and set the model; a seed the page lacks is drawn once its
stream arrives; in JupyterLab the kernel reads what the page moved. Each mutation test shows that
a plausible wrong port differs from the Python on this data."""

import base64
import json

import numpy as np
import pytest

from ampviz.widgets.base import _in_column
from ampviz.widgets.browser_fp8_lab import BrowserFp8ScalingLab
from ampviz.widgets.fp8_lab import Fp8ScalingLab, readout_html
from conftest import (drawn, explorer_test_page, lab_notebook_page, load_data, press_keys, python_figure,
                      python_side, python_side_cell, render, wait_drawn, wait_python_side)

SETTINGS = ("recipe", "history_len", "algo", "margin", "fmt", "spike_log2", "nonfinite", "seed")
FIGURE = ".ampviz-fp8-figure"
NONFINITE = {"inf": "inf"}  # as ``asJson`` writes an infinity (a NaN: null)


@pytest.fixture(scope="module")
def page(browser):
    page = explorer_test_page(browser, "fp8_lab_view", FP="fp8plot")
    page.evaluate(AS_JSON)
    yield page
    page.close()


@pytest.fixture(scope="module")
def lab():
    return BrowserFp8ScalingLab()


#: In-page: ``asJson(value)``, the value as JSON has it (typed arrays as lists, NaN as null), with an
#: infinity as "inf" or "-inf" (JSON has none; ``python_figure(fig, **NONFINITE)`` writes Python's so).
AS_JSON = """() => { window.asJson = (v) => JSON.stringify(v, (k, x) => ArrayBuffer.isView(x) ? Array.from(x)
      : typeof x === "number" && (x === Infinity || x === -Infinity) ? (x > 0 ? "inf" : "-inf") : x);
    window.noTemplate = (fig) => ({data: fig.data, layout: {...fig.layout, template: undefined}}); }"""


def random_settings(rng, seeds=(0, 1, 2, 3)) -> dict:
    lab = BrowserFp8ScalingLab
    return {"recipe": str(rng.choice(["delayed", "delayed", "current"])),
            "history_len": int(rng.choice(lab.HISTORY_LENGTHS)), "algo": str(rng.choice(["max", "most_recent"])),
            "margin": int(rng.integers(lab.MARGIN_RANGE[0], lab.MARGIN_RANGE[1] + 1)),
            "fmt": str(rng.choice(["fp8_e4m3", "fp8_e5m2"])),
            "spike_log2": int(rng.integers(lab.SPIKE_RANGE[0], lab.SPIKE_RANGE[1] + 1)),
            "nonfinite": str(rng.choice(["none", "inf", "nan"])), "seed": int(rng.choice(seeds))}


def move(lab, s: dict) -> None:
    for k in SETTINGS:
        setattr(lab, k, s[k])


def arrays(got: dict, names_types) -> list:
    return [np.frombuffer(base64.b64decode(got[n]), t) for n, t in names_types]


def bits32(a) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


def same32(a, b) -> bool:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    nan = np.isnan(a)
    return np.array_equal(nan, np.isnan(b)) and np.array_equal(bits32(a[~nan]), bits32(b[~nan]))


#: In-page: each setting's stream and run (arrays as base64) and readout.
NUMBERS = """(all) => all.map((s) => { const a = V.acting(s), stream = V.streamOf(D, a.seed, a.spike_log2, a.nonfinite);
    const r = {stream, trace: V.runTrace(stream, a, D.options.size)}; r.readout = FP.fp8Readout(r.trace);
    return {sorted: b64(r.stream.sortedAbs), magnitude: b64(r.stream.magnitude), nonfinite: b64(r.stream.nonfinite),
            amax: b64(r.trace.amax), scale: b64(r.trace.scale), frozen: b64(r.trace.frozen),
            saturated: b64(r.trace.saturated), underflowed: b64(r.trace.underflowed), subnormal: b64(r.trace.subnormal),
            settings: r.trace.settings, readout: r.readout}; })"""


def test_many_random_settings_give_the_packages_stream_run_and_readout(page, lab):
    """A thousand seeded random settings of every control: stream, run and readout bit for bit."""
    load_data(page, lab)
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(5):
        settings = [random_settings(rng) for _ in range(200)]
        got = page.evaluate(NUMBERS, settings)
        for s, g in zip(settings, got):
            move(lab, s)
            stream, trace = lab.simulate()
            sorted_abs, magnitude, nonfinite = arrays(g, [("sorted", "<f4"), ("magnitude", "<f4"), ("nonfinite", "u1")])
            assert np.array_equal(bits32(sorted_abs), bits32(stream.sorted_abs)), s
            assert np.array_equal(bits32(magnitude), bits32(stream.magnitude)), s
            assert np.array_equal(nonfinite, stream.nonfinite), s
            amax, scale, frozen, sat, under, sub = arrays(g, [("amax", "<f4"), ("scale", "<f4"), ("frozen", "u1"),
                                                              ("saturated", "<f8"), ("underflowed", "<f8"),
                                                              ("subnormal", "<f8")])
            assert same32(amax, trace.amax) and same32(scale, trace.scale), s
            assert np.array_equal(frozen.astype(bool), trace.frozen), s
            assert np.array_equal(sat, trace.saturated) and np.array_equal(under, trace.underflowed), s
            assert np.array_equal(sub, trace.subnormal), s
            assert g["settings"] == trace.settings, s
            assert g["readout"] == _in_column(readout_html(trace)), s
            checked += 1
    assert checked == 1000
    assert page.errors == []


FIGURES = """(all) => all.map((s) => asJson(noTemplate(V.compute(D, s, CACHE).figure)))"""


def test_the_figure_is_fp8_scaling_labs_at_random_settings(page, lab):
    """The page's figure equals BrowserFp8ScalingLab.figure() (fp8_lab's functions, as Fp8ScalingLab draws) at random
    settings of every control, and the kernel's lab, moved by its own controls, draws the same."""
    load_data(page, lab)
    rng = np.random.default_rng(1)
    settings = [random_settings(rng) for _ in range(16)]
    settings[0].update(recipe="current", nonfinite="nan")  # NaN scales: gaps in every scale line
    settings[1].update(recipe="delayed", nonfinite="inf", history_len=1, spike_log2=16)
    got = page.evaluate(FIGURES, settings)
    ref = Fp8ScalingLab()
    kinds = set()
    for k, (s, g) in enumerate(zip(settings, got)):
        move(lab, s)
        want = python_figure(lab.figure(), **NONFINITE)
        assert json.loads(g) == want, s
        kinds |= {t["meta"]["kind"] for t in want["data"]}
        if k < 6:  # the kernel's lab at the same settings
            for name, w in (("recipe", "recipe_buttons"), ("history_len", "history_slider"), ("algo", "algo_dropdown"),
                            ("margin", "margin_slider"), ("fmt", "fmt_dropdown"), ("spike_log2", "spike_slider"),
                            ("nonfinite", "nonfinite_dropdown"), ("seed", "seed_input")):
                getattr(ref, w).value = s[name]
            assert python_figure(ref.figure, **NONFINITE) == want, s
            assert ref.readout.value == lab.readout_html(), s
    assert "nonfinite" in kinds
    template = page.evaluate("() => V.compute(D, {recipe: 'delayed', history_len: 1024, algo: 'max', margin: 0, "
                             "fmt: 'fp8_e4m3', spike_log2: 8, nonfinite: 'none', seed: 0}).figure.layout.template")
    assert template == Fp8ScalingLab().figure.to_plotly_json()["layout"]["template"]
    assert page.errors == []


def test_every_share_a_step_can_have_sits_where_numpy_puts_it(page):
    """The share axis is log10 of the percent, rounded to float32: for each of the 4,096 counts a
    step can have, the page's value (Math.log10) equals numpy's, and a lone step's tick ends
    (float32 arithmetic) too."""
    size = Fp8ScalingLab.SIZE
    got = page.evaluate("""(size) => { const counts = new Float64Array(size + 1); for (let c = 0; c <= size; c++) counts[c] = c;
        return b64(Float32Array.from(counts, (c) => (c > 0 ? Math.log10(100.0 * c / size) : NaN))); }""", size)
    c = np.arange(size + 1)
    with np.errstate(divide="ignore"):
        want = np.where(c > 0, np.log10(100.0 * np.where(c > 0, c, 1) / size), np.nan).astype(np.float32)
    assert same32(np.frombuffer(base64.b64decode(got), "<f4"), want)


# ----------------------------------------------------------------- in the page, drawn
def shown_figure(page) -> dict:
    """The figure plotly holds: its traces' points and the layout's axes ranges and title."""
    return json.loads(page.evaluate("""(sel) => { const gd = document.querySelector(sel);
        return asJson({data: gd.data.map((t) => ({x: t.x ?? null, y: t.y})), y1: gd.layout.yaxis.range,
          y2: gd.layout.yaxis2.range ?? null, title: gd.layout.title.text}); }""", FIGURE))


def python_shown(lab) -> dict:
    fig = python_figure(lab.figure(), **NONFINITE)
    return {"data": [{"x": t.get("x"), "y": t["y"]} for t in fig["data"]], "y1": fig["layout"]["yaxis"]["range"],
            "y2": fig["layout"]["yaxis2"].get("range"), "title": fig["layout"]["title"]["text"]}


def test_a_key_press_and_a_drag_redraw_in_the_page_and_set_the_model(page):
    page.errors.clear()
    lab = BrowserFp8ScalingLab(spike_log2=8, seed=1)
    render(page, lab, FIGURE)
    assert shown_figure(page) == python_shown(lab)
    page.locator(".ampviz-fp8-margin").focus()
    for _ in range(3):
        page.keyboard.press("ArrowRight")
    wait_drawn(page, FIGURE, margin=3)
    assert page.evaluate("() => M.get('margin')") == 3
    lab.margin = 3
    assert shown_figure(page) == python_shown(lab)
    assert page.inner_html(".ampviz-fp8-readout") == lab.readout_html()
    # a drag of the spike slider, an input event a frame: the last position is drawn, and only real ones
    seen = page.evaluate("""async () => { const s = document.querySelector(".ampviz-fp8-spike");
        const fig = document.querySelector(".ampviz-fp8-figure"), drawn = [], moves = [];
        const watch = new MutationObserver(() => drawn.push({k: JSON.parse(fig.dataset.drawn).spike_log2,
          compute: Number(fig.dataset.computeMs), draw: Number(fig.dataset.drawMs), by: fig.dataset.drawnBy}));
        watch.observe(fig, {attributes: true, attributeFilter: ["data-drawn"]});
        for (let k = 0; k <= 16; k++) { const t = performance.now(); s.value = String(k); s.dispatchEvent(new Event("input"));
          moves.push(performance.now() - t); await new Promise(requestAnimationFrame); }
        await new Promise((r) => setTimeout(r, 500)); watch.disconnect(); return {drawn, moves}; }""")
    assert drawn(page, FIGURE)["spike_log2"] == 16 and page.evaluate("() => M.get('spike_log2')") == 16
    ks = [d["k"] for d in seen["drawn"]]
    assert set(ks) <= set(range(17)) and ks == sorted(ks) and len(ks) >= 3, ks
    assert any(d["by"] == "moving" for d in seen["drawn"])  # the axes hold still: only the lines move
    print(f"\nspike drag: {len(set(ks))} of 17 positions drawn; compute p50 "
          f"{np.median([d['compute'] for d in seen['drawn']]):.1f} ms, draw p50 "
          f"{np.median([d['draw'] for d in seen['drawn']]):.1f} ms")
    lab.spike_log2 = 16
    assert shown_figure(page) == python_shown(lab)
    assert page.errors == []


def test_the_other_controls_and_a_model_change_redraw_and_set_the_model(page):
    page.errors.clear()
    lab = BrowserFp8ScalingLab(history_len=16)
    ref = Fp8ScalingLab(history_len=16)
    render(page, lab, FIGURE)
    # a length typed into the history box: a power of two as the kernel's lab reads it
    page.fill(".ampviz-fp8-history-input", "2^7")
    page.press(".ampviz-fp8-history-input", "Enter")
    wait_drawn(page, FIGURE, history_len=128)
    assert page.evaluate("() => M.get('history_len')") == 128
    assert page.eval_on_selector(".ampviz-fp8-history", "(s) => s.value") == "7"
    # text that is not a length: the kernel's lab's message, and the box shows the length in use
    ref.history_slider.value = 128
    for typed in ("100", " abc ", "2^11"):
        page.fill(".ampviz-fp8-history-input", typed)
        page.press(".ampviz-fp8-history-input", "Enter")
        ref.history_input.value = typed
        assert page.eval_on_selector(".ampviz-message", "(m) => m.textContent") == ref.error, typed
        assert page.input_value(".ampviz-fp8-history-input") == "128"
    # current scaling: history, algo and margin act on delayed scaling only, and are disabled
    page.select_option(".ampviz-fp8-recipe", "current")
    wait_drawn(page, FIGURE, recipe="current")
    assert page.evaluate("() => M.get('recipe')") == "current"
    assert page.evaluate("""() => ['history', 'history-input', 'algo', 'margin'].map((c) =>
        document.querySelector('.ampviz-fp8-' + c).disabled)""") == [True] * 4
    for cls, value, name in ((".ampviz-fp8-fmt", "fp8_e5m2", "fmt"), (".ampviz-fp8-nonfinite", "nan", "nonfinite")):
        page.select_option(cls, value)
        wait_drawn(page, FIGURE, **{name: value})
        assert page.evaluate(f"() => M.get('{name}')") == value
    lab.history_len, lab.recipe, lab.fmt, lab.nonfinite = 128, "current", "fp8_e5m2", "nan"
    assert shown_figure(page) == python_shown(lab)
    assert page.inner_html(".ampviz-fp8-readout") == lab.readout_html()
    # settings changed on the model (as Python changes them) move the controls and redraw
    page.evaluate("() => { M.set('recipe', 'delayed'); M.set('algo', 'most_recent'); }")
    wait_drawn(page, FIGURE, recipe="delayed", algo="most_recent")
    assert page.eval_on_selector(".ampviz-fp8-algo", "(s) => [s.value, s.disabled]") == ["most_recent", False]
    lab.recipe, lab.algo = "delayed", "most_recent"
    assert shown_figure(page) == python_shown(lab)
    assert page.errors == []


def test_a_seed_the_page_lacks_is_drawn_when_its_stream_arrives(page):
    page.errors.clear()
    lab = BrowserFp8ScalingLab(seed=2)
    render(page, lab, FIGURE)
    page.fill(".ampviz-fp8-seed", "77")
    page.press(".ampviz-fp8-seed", "Enter")
    page.wait_for_function("() => document.querySelector('.ampviz-message').textContent.includes('seed 77')")
    assert page.evaluate("() => M.get('seed')") == 77
    assert drawn(page, FIGURE)["seed"] == 2  # the last figure stays
    lab.seed = 77  # as the kernel takes the page's setting: the stream is shipped, then the seed
    assert "77" in lab.streams
    page.evaluate("(s) => M.set('streams', s)", lab.streams)
    wait_drawn(page, FIGURE, seed=77)
    assert page.eval_on_selector(".ampviz-message", "(m) => m.textContent") == ""
    assert shown_figure(page) == python_shown(lab)
    assert page.inner_html(".ampviz-fp8-readout") == lab.readout_html()
    page.fill(".ampviz-fp8-seed", "-3")
    page.press(".ampviz-fp8-seed", "Enter")
    assert page.eval_on_selector(".ampviz-message", "(m) => m.textContent") == \
        "seed must be between 0 and 4,294,967,295, got -3"
    assert page.evaluate("() => M.get('seed')") == 77 and page.input_value(".ampviz-fp8-seed") == "77"
    assert page.errors == []


# ----------------------------------------------------------------- wrong ports that the tests catch
def test_axes_from_the_run_alone_would_be_caught(page, lab):
    """The lab's axes hold the runs at the spike slider's ends: a figure whose axes hold only the
    run shown would move its ranges as the spike moves."""
    load_data(page, lab)
    settings = [dict(zip(SETTINGS, ("delayed", 1024, "max", 0, "fp8_e4m3", k, "none", 0))) for k in (0, 4, 8, 12)]
    got = page.evaluate("""(all) => all.map((s) => { const r = V.compute(D, s, CACHE);
        const alone = FP.fp8Figure(r.trace, {legendCounts: false}).layout;
        return [alone.yaxis.range, alone.yaxis2.range]; })""", settings)
    differ = 0
    for s, g in zip(settings, got):
        move(lab, s)
        layout = python_figure(lab.figure(), **NONFINITE)["layout"]
        differ += g != [layout["yaxis"]["range"], layout["yaxis2"]["range"]]
    assert differ > 0


def test_a_spike_as_the_drift_times_two_to_the_k_would_be_caught(page, lab):
    """A spike step's magnitude is f32(2^(walk + k)), not the drift's float32 magnitude times 2^k:
    rebuilt so, some spike steps' magnitudes differ from lab_stream's."""
    load_data(page, lab)
    differ = 0
    for seed in BrowserFp8ScalingLab.SHIPPED_SEEDS:
        got = page.evaluate("""(seed) => { const s0 = V.streamOf(D, seed, 0, 'none'), out = [];
            for (let k = 1; k <= 16; k++) out.push(b64(Float32Array.from(s0.magnitude, (m) => m * 2 ** k))); return out; }""", seed)
        for k, g in zip(range(1, 17), got):
            lab.seed, lab.spike_log2, lab.nonfinite = seed, k, "none"
            differ += not np.array_equal(bits32(np.frombuffer(base64.b64decode(g), "<f4")), bits32(lab.stream.magnitude))
    assert differ > 0


def test_float64_arithmetic_for_a_lone_steps_tick_would_be_caught():
    """numpy draws a lone step's tick in float32 (the share line's dtype): the same ends computed
    in float64 and then rounded differ for some counts."""
    size = Fp8ScalingLab.SIZE
    c = np.arange(1, size + 1)
    share = np.log10(100.0 * c / size).astype(np.float32)
    tick = 5 * (2.05 - (-2.05)) / (0.28 * 520)
    assert ((share - tick) != (share.astype(np.float64) - tick).astype(np.float32)).any()


def test_run_ends_at_the_changes_only_would_be_caught(page, lab):
    """The scale's step line goes through the first and last step of each run: through the
    changes alone, its points would differ from plot_fp8_scaling's."""
    lab.recipe, lab.seed, lab.spike_log2, lab.nonfinite, lab.history_len = "delayed", 0, 8, "none", 16
    want = python_figure(lab.figure(), **NONFINITE)["data"]
    runs = next(t["x"] for t in want if t["meta"]["kind"] == "scale")
    scale = np.asarray(lab.trace.scale)
    changes = [0] + (np.flatnonzero(scale[1:] != scale[:-1]) + 1).tolist() + [scale.size - 1]
    assert changes != runs and len(runs) > 4


# ----------------------------------------------------------------- in JupyterLab, with a kernel
PY_SIDE = python_side_cell("lab", ["spike_log2"], '''
t = lab.trace
python_side.value = f"{lab.spike_log2} | {t.saturated_steps:,} | {int((t.underflowed > 0).sum()):,}"
''')


def test_in_jupyterlab_the_kernel_reads_what_the_page_moved(browser, tmp_path):
    """In JupyterLab, with a kernel: arrow keys move the spike slider (JupyterLab's notebook takes
    arrow keys that a control lets through), the page redraws at once, and the kernel's lab holds
    the new spike and counts what the page's readout shows."""
    cells = ["from ampviz.widgets.browser_fp8_lab import BrowserFp8ScalingLab\n"
             "lab = BrowserFp8ScalingLab(history_len=16)\nlab", PY_SIDE]
    with lab_notebook_page(browser, tmp_path, cells, FIGURE, "8 |") as page:
        press_keys(page.locator(".ampviz-fp8-spike").first, 2)
        wait_drawn(page, FIGURE, spike_log2=10)
        wait_python_side(page, "10 |")
        py = python_side(page)
        readout = page.evaluate("() => document.querySelector('.ampviz-fp8-readout').innerText")
        assert f"steps that saturate: {py[1]} of 2,000" in readout and f"(any: {py[2]})" in readout, (readout, py)
