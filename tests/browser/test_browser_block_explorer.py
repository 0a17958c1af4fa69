"""BrowserBlockExplorer's front end in Chromium, with no kernel (the page's own model, as on a static
page): for seeded random settings of every control (scheme, MX block size and scale rounding,
NVFP4's per-tensor scale, data, outlier, seed, Hadamard transform), the row, its quantization, the
readout and the figure the page computes equal the package's bit for bit (log2 correctly rounded
where numpy's is one ulp off); plot_blocks' port with its legend counts and default title; the
exact Hadamard transform and numpy's mean; key presses, a drag of the outlier slider, a scheme
change, a checkbox, a seed typed and model changes redraw in the page and set the model; in
JupyterLab the kernel reads what the page moved, and ships a new seed's row. Each mutation test
shows that a plausible wrong port differs from the Python on this data."""

import base64
import json
import re

import numpy as np
import pytest

from ampviz.formats import FP8_E4M3
from ampviz.formats.blocks import mx_quantize, nvfp4_quantize, random_hadamard_transform
from ampviz.plots import plot_blocks
from ampviz.plots.blocks import _block_parts
from ampviz.widgets.block_explorer import BlockExplorer
from ampviz.widgets.browser_block_explorer import SETTINGS, BrowserBlockExplorer
from conftest import (drawn, explorer_test_page, figure_dicts, lab_notebook_page, load_data, plain, press_keys,
                      python_side, python_side_cell, render, wait_drawn, wait_python_side)
from test_js_scaleplot import same_log2

SCHEMES = [s for _, s in BlockExplorer.SCHEMES]
BIG_SEED = 987_654_321  # a seed the page holds because the explorer was made with it
FIGURE = ".ampviz-blocks-figure"
NONFINITE = {"nan": "NaN", "inf": "Infinity"}  # as ``asJson`` writes them


@pytest.fixture(scope="module")
def page(browser):
    page = explorer_test_page(browser, "block_explorer_view", BP="blockplot", BQ="blocks")
    page.evaluate(AS_JSON)
    yield page
    page.close()


# ----------------------------------------------------------------- helpers
#: In-page: ``asJson(value)``, the value as JSON (typed arrays as lists; NaN and the infinities, which
#: JSON lacks, as the strings "NaN", "Infinity" and "-Infinity", as ``plain(v, **NONFINITE)`` writes them).
AS_JSON = """() => { window.asJson = (v) => JSON.stringify(v, (k, x) => ArrayBuffer.isView(x) ? Array.from(x)
        : typeof x === "number" && !Number.isFinite(x) ? String(x) : x);
    window.noTemplate = (fig) => ({data: fig.data, layout: {...fig.layout, template: undefined}}); }"""


def loads(text: str):
    """The page's JSON, whole numbers read as floats: JavaScript writes a float above 2^53 as an
    integer's digits (the shortest that name the double), which only a float reads back as the same."""
    return json.loads(text, parse_int=float)


LOG2_KINDS = ("range", "least", "original", "dequantized", "saturated", "flushed")


def log2_sources(kind: str, parts: dict) -> np.ndarray:
    """The magnitudes whose log2 a trace of ``kind`` draws, point by point (NaN at its gaps)."""
    def levels(v):
        out = np.repeat(np.abs(np.asarray(v, np.float64)), 3)
        out[2::3] = np.nan
        return out
    if kind in ("range", "least"):
        return levels(parts["top" if kind == "range" else "least"])
    if kind in ("saturated", "flushed"):
        return levels(parts["values"][np.flatnonzero(parts[kind])])
    return levels(parts["xs" if kind == "original" else "values"])


def same_figure(fig, got: dict, x, result, where) -> None:
    """The page's figure (JSON, less its template) equals plot_blocks' bit for bit; the log2 of a
    magnitude that is not a power of two may be one ulp from numpy's where numpy's is not correctly
    rounded (same_log2)."""
    want = figure_dicts(fig, **NONFINITE)
    assert len(want["data"]) == len(got["data"]), where
    parts = _block_parts(x, result)
    for w, g in zip(want["data"], got["data"]):
        kind = w["meta"]["kind"]
        if kind in LOG2_KINDS:
            wy, gy = (np.array([float(v) for v in t["y"]], np.float64) for t in (w, g))
            same_log2(wy, gy, log2_sources(kind, parts), where + (kind,))
            w, g = {**w, "y": None}, {**g, "y": None}
        assert w == g, where + (kind,)
    assert {**got["layout"], "template": None} == {**want["layout"], "template": None}, where


def bits(b64: str, dtype) -> np.ndarray:
    return np.frombuffer(base64.b64decode(b64), dtype)


def random_settings(rng) -> dict:
    return {"scheme": str(rng.choice(SCHEMES)), "block_size": int(rng.choice([16, 32])),
            "rounding": str(rng.choice(["floor", "ceil", "even", "rceil"])),
            "per_tensor_scale": bool(rng.random() < 0.6), "data": str(rng.choice(["normal", "normal", "lognormal"])),
            "log2_outlier": int(rng.integers(0, 25)), "hadamard": bool(rng.random() < 0.35),
            "seed": int(rng.choice([*range(16), BIG_SEED]))}


#: In-page: everything the page computes for each of the settings: the row, the row quantized and
#: its quantization (as bits), the readout and the figure (less its template).
COMPUTE_ALL = """(all) => asJson(all.map((s) => { const r = V.compute(D, s);
    return {row: b64(r.row), x: b64(r.x), scales: b64(r.result.scales), codes: b64(r.result.codes),
            values: b64(r.result.values), tensorScale: r.result.tensorScale ?? null, readout: r.readout,
            figure: noTemplate(r.figure)}; }))"""


def check_page_numbers(g: dict, ex, where) -> None:
    """The page's row, quantization and readout equal the explorer's at its settings."""
    x, result = ex.x, ex.result
    assert np.array_equal(bits(g["row"], "<u4"), ex.data_row.view(np.uint32)), where
    assert np.array_equal(bits(g["x"], "<u4"), x.view(np.uint32)), where
    assert np.array_equal(bits(g["scales"], np.uint8), result.scales), where
    assert np.array_equal(bits(g["codes"], np.uint8), result.codes), where
    assert np.array_equal(bits(g["values"], "<u4"), np.asarray(result.values, np.float32).view(np.uint32)), where
    ts = getattr(result, "tensor_scale", None)
    assert g["tensorScale"] == (None if ts is None else float(ts)), where
    assert g["readout"] == ex.readout_html(), where


def check_page_result(g: dict, ex, s, where) -> None:
    check_page_numbers(g, ex, where)
    same_figure(ex.figure(), g["figure"], ex.x, ex.result, where)


# ----------------------------------------------------------------- the numbers
NUMBERS_ALL = """(all) => asJson(all.map((s) => { const r = V.compute(D, s);
    return {row: b64(r.row), x: b64(r.x), scales: b64(r.result.scales), codes: b64(r.result.codes),
            values: b64(r.result.values), tensorScale: r.result.tensorScale ?? null, readout: r.readout}; }))"""


def test_a_thousand_random_settings_give_the_packages_row_quantization_and_readout(page):
    """A thousand more seeded random settings of every control, the numbers and the readout only
    (the figure, from the same numbers, is held at the 120 settings below)."""
    ex = BrowserBlockExplorer(seed=BIG_SEED)
    load_data(page, ex)
    rng = np.random.default_rng(1)
    for batch in range(5):
        settings = [random_settings(rng) for _ in range(200)]
        got = loads(page.evaluate(NUMBERS_ALL, settings))
        for j, (s, g) in enumerate(zip(settings, got)):
            for k, v in s.items():
                setattr(ex, k, v)
            check_page_numbers(g, ex, (batch, j, tuple(s.values())))
    assert page.errors == []


def test_random_settings_of_every_control_give_the_packages_row_readout_and_figure(page):
    """120 seeded random settings of every control: the page's row, quantization, readout and
    figure equal BrowserBlockExplorer's (the package's) bit for bit; at some of them the kernel's
    BlockExplorer itself, moved by its controls, shows the same readout and figure."""
    ex = BrowserBlockExplorer(seed=BIG_SEED)
    load_data(page, ex)
    rng = np.random.default_rng(0)
    ref = BlockExplorer()
    for batch in range(4):
        settings = [random_settings(rng) for _ in range(30)]
        got = loads(page.evaluate(COMPUTE_ALL, settings))
        for j, (s, g) in enumerate(zip(settings, got)):
            for k, v in s.items():
                setattr(ex, k, v)
            check_page_result(g, ex, s, (batch, j, tuple(s.values())))
            if j % 10 == 0:  # the kernel's explorer, moved by its own widgets to the same settings
                for widget, name in ((ref.scheme_dropdown, "scheme"), (ref.block_dropdown, "block_size"),
                                     (ref.rounding_dropdown, "rounding"), (ref.tensor_scale_checkbox, "per_tensor_scale"),
                                     (ref.data_dropdown, "data"), (ref.outlier_slider, "log2_outlier"),
                                     (ref.seed_input, "seed"), (ref.hadamard_checkbox, "hadamard")):
                    widget.value = s[name]
                assert g["readout"] == ref.readout.value, s
                same_figure(ref.figure, g["figure"], ref.x, ref.result, (batch, j, "kernel"))
    # plotly's template, which the page puts in the layout as plotly.py fills it in
    page_template = page.evaluate("(s) => V.compute(D, s).figure.layout.template",
                                  {k: getattr(ex, k) for k in SETTINGS})
    assert page_template == ex.figure().to_plotly_json()["layout"]["template"]
    assert page.errors == []


def test_figure_dicts_are_what_to_plotly_json_gives():
    """The comparisons read the figure's own dicts: they hold what to_plotly_json gives."""
    for kw in ({}, {"scheme": "nvfp4", "hadamard": True}):
        fig = BrowserBlockExplorer(**kw).figure()
        want = plain(fig.to_plotly_json(), **NONFINITE)
        want["layout"].pop("template")
        assert figure_dicts(fig, **NONFINITE) == want


def hard_rows(seed: int, n: int = 64 * 16) -> np.ndarray:
    """Rows whose 16-value chunks span many binades (the Hadamard sums round, some of them only
    through an exact sum), with zeros, float32 subnormals and huge values."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-60, 60, n))).astype(np.float32)
    x[:16] = 0
    x[16:32] = np.float32(2.0**-140) * rng.integers(-50, 50, 16)
    x[32:48] = rng.standard_normal(16).astype(np.float32) * np.float32(2.0**100)
    # 1 + 2^-24 ± 2^-80 (over 4): within 2^-80 of a float32 tie, which a float64 sum loses
    x[48:64] = 0
    x[48:51] = np.float32([1.0, 2.0**-24, 2.0**-80])
    x[64:80] = 0
    x[64:67] = np.float32([-3.0, 2.0**-23, -(2.0**-90)])
    return x


def test_the_hadamard_transform_and_numpys_mean_are_the_packages(page):
    x = np.concatenate([hard_rows(s) for s in range(4)])
    got = page.evaluate("""([x, m]) => [b64(BP.hadamardTransform(new Float32Array(bytesOf(x)), m)),
        b64(BP.hadamardTransform(new Float32Array(bytesOf(x)), m, true))]""",
                        [base64.b64encode(x.tobytes()).decode(), BrowserBlockExplorer().hadamard_matrix])
    for g, inverse in zip(got, (False, True)):
        want = random_hadamard_transform(x, inverse=inverse)
        assert np.array_equal(bits(g, "<u4"), want.view(np.uint32)), inverse
    rng = np.random.default_rng(1)
    arrays = [rng.lognormal(0, 3, int(n)) for n in rng.integers(1, 300, 400)]
    means = page.evaluate("(all) => all.map((a) => BP.numpyMean(Float64Array.from(a)))", [a.tolist() for a in arrays])
    assert means == [float(a.mean()) for a in arrays]


def test_plot_blocks_is_ported_with_its_legend_counts_and_default_title(page):
    """plotBlocks as plot_blocks draws on its own: every MX element format and NVFP4 with and
    without its tensor scale, its default title and the legend's counts, over rows with zeros,
    float32 subnormals, huge values and infinities (MX), and a held row."""
    cases = []
    for j, fmt in enumerate(["fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1"]):
        x = hard_rows(10 + j, 256)
        x[100] = np.inf if j % 2 else -np.inf
        cases.append((x, fmt, (16, 32)[j % 2], ("floor", "ceil", "even", "rceil", "floor")[j]))
    for pts in (True, False):
        x = hard_rows(20, 256)
        x[32:48] /= np.float32(2.0**60)
        cases.append((x, "nvfp4", 16, pts))
    held = hard_rows(30, 256) * np.float32(2.0**20)
    got = page.evaluate("""([cases, held]) => cases.map(([b, fmt, block, opt], k) => {
        const x = new Float32Array(bytesOf(b)), q = (v) => fmt === 'nvfp4' ? BQ.nvfp4Quantize(v, opt) : BQ.mxQuantize(v, fmt, block, opt);
        const h = new Float32Array(bytesOf(held));
        return asJson(BP.plotBlocks(x, q(x), k === 0 ? {hold: [[h, q(h)]]} : {})); })""",
                        [[[base64.b64encode(x.tobytes()).decode(), f, b, o] for x, f, b, o in cases],
                         base64.b64encode(held.tobytes()).decode()])
    for k, ((x, fmt, block, opt), g) in enumerate(zip(cases, got)):
        q = (lambda v: nvfp4_quantize(v, per_tensor_scale=opt)) if fmt == "nvfp4" else (
            lambda v: mx_quantize(v, fmt, block_size=block, rounding=opt))
        fig = plot_blocks(x, q(x), hold=[(held, q(held))] if k == 0 else ())
        g = loads(g)
        same_figure(fig, g, x, q(x), (fmt, block, opt))
    assert all(loads(g)["data"][4]["name"].startswith("saturated (held at the block's max): ") for g in got)


# ----------------------------------------------------------------- wrong ports that the tests catch
def test_a_mean_summed_in_order_would_be_caught(page):
    """numpy sums pairwise: a mean summed left to right differs in the last bits for some arrays
    (the readout's percentages show 3 digits: it is held at the source)."""
    rng = np.random.default_rng(2)
    arrays = [rng.lognormal(0, 3, int(n)) for n in rng.integers(9, 300, 200)]
    naive = page.evaluate("(all) => all.map((a) => a.reduce((s, v) => s + v, 0) / a.length)", [a.tolist() for a in arrays])
    assert sum(g != float(a.mean()) for g, a in zip(naive, arrays)) > 20


def test_a_transform_rounded_from_a_float64_sum_would_be_caught(page):
    """A float64 sum of a chunk's products, then rounded to float32, rounds twice where the chunk
    spans more than float64 holds: it differs from the package's exactly rounded transform."""
    x = np.concatenate([hard_rows(s) for s in range(4)])
    got = page.evaluate("""([x, m]) => { const v = new Float32Array(bytesOf(x)), out = new Float32Array(v.length);
        for (let c = 0; c < v.length; c += 16) for (let j = 0; j < 16; j++) { let s = 0;
          for (let i = 0; i < 16; i++) s += v[c + i] * m[i * 16 + j]; out[c + j] = s; }
        return b64(out); }""", [base64.b64encode(x.tobytes()).decode(), BrowserBlockExplorer().hadamard_matrix])
    want = random_hadamard_transform(x)
    assert (bits(got, "<u4") != want.view(np.uint32)).sum() > 0


def test_an_axis_over_the_row_alone_would_be_caught(page):
    """BlockExplorer's value axis holds the rows at the outlier slider's ends, so that it stays
    still while the outlier moves: plot_blocks over the row alone moves it."""
    ex = BrowserBlockExplorer()
    load_data(page, ex)
    ranges = page.evaluate("""() => Array.from({length: 25}, (_, k) => { const s = {scheme: 'fp8_e4m3', block_size: 32,
        rounding: 'floor', per_tensor_scale: true, data: 'normal', log2_outlier: k, hadamard: false, seed: 0};
        const r = V.compute(D, s); return [r.figure.layout.yaxis.range, BP.plotBlocks(r.x, r.result).layout.yaxis.range]; })""")
    want = ex.figure().layout.yaxis.range
    assert all(list(held) == list(want) for held, _ in ranges)
    assert sum(list(alone) != list(want) for _, alone in ranges) > 10


def test_nvfp4_scales_not_rounded_to_float32_would_be_caught(page):
    """An NVFP4 block's scale is the float32 product of the tensor scale and its E4M3 scale: the
    float64 product differs from the package's."""
    ex = BrowserBlockExplorer(scheme="nvfp4")
    load_data(page, ex)
    scales = page.evaluate("""() => { const r = V.compute(D, {scheme: 'nvfp4', block_size: 32, rounding: 'floor',
        per_tensor_scale: true, data: 'normal', log2_outlier: 8, hadamard: false, seed: 0});
        return r.figure.layout.meta.scales; }""")
    ts = float(ex.result.tensor_scale)
    in_float64 = [ts * float(FP8_E4M3.decode(int(c))) for c in ex.result.scales]
    want = ex.figure().layout.meta["scales"]
    assert scales == want
    assert sum(a != b for a, b in zip(in_float64, want)) > 0


# ----------------------------------------------------------------- in the page, drawn
def shown_figure(page) -> dict:
    """The figure plotly holds: its traces' x and hover texts, the layout's axes and title."""
    return page.evaluate("""() => { const gd = document.querySelector('.ampviz-blocks-figure');
        return JSON.parse(asJson({data: gd.data.map((t) => ({x: t.x, text: t.text ?? null, hovertext: t.hovertext ?? null})),
          yrange: gd.layout.yaxis.range, y2range: gd.layout.yaxis2.range, title: gd.layout.title.text})); }""")


def python_shown(ex) -> dict:
    fig = figure_dicts(ex.figure(), **NONFINITE)
    return {"data": [{"x": t.get("x"), "text": t.get("text"), "hovertext": t.get("hovertext")} for t in fig["data"]],
            "yrange": fig["layout"]["yaxis"]["range"], "y2range": fig["layout"]["yaxis2"]["range"],
            "title": fig["layout"]["title"]["text"]}


def parsed(page, html: str) -> str:
    """``html`` as the page holds it once parsed (a table gains its tbody), to compare with a readout shown."""
    return page.evaluate("(h) => { const d = document.createElement('div'); d.innerHTML = h; return d.innerHTML; }", html)


def controls(page) -> dict:
    return page.evaluate("""() => { const q = (c) => document.querySelector(c);
        return {block: q('.ampviz-blocks-block-size').disabled, rounding: q('.ampviz-blocks-rounding').disabled,
                tensor: q('.ampviz-blocks-tensor-scale input').disabled,
                tensorShown: q('.ampviz-blocks-tensor-scale').style.display !== 'none',
                outlier: q('.ampviz-blocks-outlier').disabled}; }""")


def kernel_controls(**kw) -> dict:
    ref = BlockExplorer(**kw)
    return {"block": ref.block_dropdown.disabled, "rounding": ref.rounding_dropdown.disabled,
            "tensor": ref.tensor_scale_checkbox.disabled, "tensorShown": ref.tensor_scale_checkbox.layout.display != "none",
            "outlier": ref.outlier_slider.disabled}


def test_key_presses_redraw_in_the_page_and_set_the_model(page):
    page.errors.clear()
    ex = BrowserBlockExplorer()
    render(page, ex, FIGURE)
    assert shown_figure(page) == python_shown(ex)
    assert controls(page) == kernel_controls()
    page.locator(".ampviz-blocks-outlier").focus()
    for _ in range(3):
        page.keyboard.press("ArrowRight")
    wait_drawn(page, FIGURE, log2_outlier=11)
    assert page.evaluate("() => M.get('log2_outlier')") == 11
    ex.log2_outlier = 11
    assert page.inner_html(".ampviz-blocks-readout") == parsed(page, ex.readout_html())
    assert page.eval_on_selector(".ampviz-blocks-outlier-value", "(s) => s.textContent") == "11"
    assert shown_figure(page) == python_shown(ex)
    assert page.errors == []


def test_a_drag_of_the_outlier_slider_repaints_and_sets_the_model(page):
    """A drag sends an input event a frame: the readout follows each one at once and the figure
    draws the newest position whenever plotly is free (the last one always); then a slow drag
    back, each move drawn before the next: every figure drawn is the package's."""
    page.errors.clear()
    ex = BrowserBlockExplorer(scheme="nvfp4", log2_outlier=0, hadamard=True)
    render(page, ex, FIGURE)
    seen = page.evaluate("""async () => { const s = document.querySelector(".ampviz-blocks-outlier");
        const fig = document.querySelector(".ampviz-blocks-figure"), drawn = [], readouts = [], moves = [];
        const watch = new MutationObserver(() => drawn.push({k: JSON.parse(fig.dataset.drawn).log2_outlier,
          compute: Number(fig.dataset.computeMs), draw: Number(fig.dataset.drawMs), by: fig.dataset.drawnBy}));
        watch.observe(fig, {attributes: true, attributeFilter: ["data-drawn"]});
        for (let k = 1; k <= 24; k++) { const t = performance.now(); s.value = String(k); s.dispatchEvent(new Event("input"));
          moves.push(performance.now() - t); readouts.push(document.querySelector(".ampviz-blocks-readout").innerHTML);
          await new Promise(requestAnimationFrame); }
        await new Promise((r) => setTimeout(r, 500)); watch.disconnect(); return {drawn, readouts, moves}; }""")
    assert drawn(page, FIGURE, loads)["log2_outlier"] == 24 and page.evaluate("() => M.get('log2_outlier')") == 24
    ks = [d["k"] for d in seen["drawn"]]
    assert set(ks) <= set(range(1, 25)) and ks == sorted(ks) and len(ks) >= 5, ks
    for k, readout in zip(range(1, 25), seen["readouts"]):
        ex.log2_outlier = k
        assert readout == parsed(page, ex.readout_html()), k
    print(f"\nfast drag: {len(set(ks))} of 24 positions drawn; input handler p50 {np.median(seen['moves']):.2f} ms "
          f"(quantization, transform, readout and figure computed in it), max {max(seen['moves']):.2f} ms; "
          f"draw p50 {np.median([d['draw'] for d in seen['drawn']]):.1f} ms, max {max(d['draw'] for d in seen['drawn']):.1f} ms; "
          f"{sum(d['by'] == 'moving' for d in seen['drawn'])} of {len(ks)} draws moved the traces")
    for k in range(21, -1, -7):
        page.eval_on_selector(".ampviz-blocks-outlier", "(s, k) => { s.value = String(k); s.dispatchEvent(new Event('input')); }", k)
        wait_drawn(page, FIGURE, log2_outlier=k)
        ex.log2_outlier = k
        assert shown_figure(page) == python_shown(ex), k
    assert page.errors == []


def test_a_scheme_a_checkbox_a_seed_and_model_changes_redraw_and_move_the_controls(page):
    page.errors.clear()
    ex = BrowserBlockExplorer(log2_outlier=16)
    render(page, ex, FIGURE)
    page.select_option(".ampviz-blocks-scheme", "nvfp4")
    wait_drawn(page, FIGURE, scheme="nvfp4")
    assert page.evaluate("() => M.get('scheme')") == "nvfp4"
    assert controls(page) == kernel_controls(scheme="nvfp4")
    page.click(".ampviz-blocks-tensor-scale input")  # NVFP4 with no per-tensor scale
    wait_drawn(page, FIGURE, per_tensor_scale=False)
    page.click(".ampviz-blocks-hadamard input")
    wait_drawn(page, FIGURE, hadamard=True)
    ex.scheme, ex.per_tensor_scale, ex.hadamard = "nvfp4", False, True
    assert page.evaluate("() => [M.get('per_tensor_scale'), M.get('hadamard')]") == [False, True]
    assert shown_figure(page) == python_shown(ex)
    assert page.inner_html(".ampviz-blocks-readout") == parsed(page, ex.readout_html())
    # settings changed on the model (as Python changes them) move the controls and redraw
    page.evaluate("() => { M.set('scheme', 'fp6_e3m2'); M.set('data', 'lognormal'); }")
    wait_drawn(page, FIGURE, scheme="fp6_e3m2", data="lognormal")
    assert page.eval_on_selector(".ampviz-blocks-data", "(s) => s.value") == "lognormal"
    assert controls(page) == kernel_controls(scheme="fp6_e3m2", data="lognormal")
    page.select_option(".ampviz-blocks-rounding", "rceil")
    page.select_option(".ampviz-blocks-block-size", "16")
    wait_drawn(page, FIGURE, rounding="rceil", block_size=16)
    ex.scheme, ex.data, ex.rounding, ex.block_size = "fp6_e3m2", "lognormal", "rceil", 16
    assert shown_figure(page) == python_shown(ex)
    # a seed the page holds draws at once; one it lacks waits for Python's rows (a static page: for ever)
    page.fill(".ampviz-blocks-seed", "12")
    wait_drawn(page, FIGURE, seed=12)
    page.fill(".ampviz-blocks-seed", "4000000000")
    assert page.evaluate("() => M.get('seed')") == 4_000_000_000
    assert "seed 4000000000" in page.inner_text(".ampviz-message")
    assert drawn(page, FIGURE, loads)["seed"] == 12  # the last figure stays
    ex.seed = 4_000_000_000  # Python ships its rows, as the kernel does when the page sets the seed
    page.evaluate("(rows) => M.set('rows', rows)", ex.rows)
    wait_drawn(page, FIGURE, seed=4_000_000_000)
    assert page.inner_text(".ampviz-message") == ""
    assert shown_figure(page) == python_shown(ex)
    assert page.inner_html(".ampviz-blocks-readout") == parsed(page, ex.readout_html())
    page.fill(".ampviz-blocks-seed", "-4")
    assert "seed must be between 0 and 4,294,967,295" in page.inner_text(".ampviz-message")
    assert page.evaluate("() => M.get('seed')") == 4_000_000_000
    assert page.errors == []


# ----------------------------------------------------------------- in JupyterLab, with a kernel
PY_SIDE = python_side_cell("explorer", ["seed", "log2_outlier"], '''
meta = explorer.figure().layout.meta
python_side.value = f"{explorer.seed} {explorer.log2_outlier} | {meta['saturated']:,} | {meta['flushed']:,}"
''')


def page_counts(page) -> list:
    text = page.evaluate("() => document.querySelector('.ampviz-blocks-readout div div').innerText")
    return re.findall(r"\((\d+)\)", text)


def test_in_jupyterlab_the_kernel_reads_what_the_page_moved(browser, tmp_path):
    """In JupyterLab, with a kernel: arrow keys move the outlier slider, the page redraws at once
    and the kernel's explorer holds the new setting and counts what the page's readout shows; a
    seed typed in the page reaches the kernel, which ships its row, and the page draws it."""
    cells = ["from ampviz.widgets.browser_block_explorer import BrowserBlockExplorer\n"
             "explorer = BrowserBlockExplorer(scheme='fp4_e2m1')\nexplorer", PY_SIDE]
    with lab_notebook_page(browser, tmp_path, cells, FIGURE, "0 8 |") as page:
        press_keys(page.locator(".ampviz-blocks-outlier").first, 2)
        wait_drawn(page, FIGURE, log2_outlier=10)
        wait_python_side(page, "0 10 |")
        py = python_side(page)
        assert page_counts(page) == py[1:], (page_counts(page), py)
        page.locator(".ampviz-blocks-seed").first.fill("31337")
        wait_drawn(page, FIGURE, timeout=60_000, seed=31337)
        wait_python_side(page, "31337 10 |")
        py = python_side(page)
        assert page_counts(page) == py[1:], (page_counts(page), py)
