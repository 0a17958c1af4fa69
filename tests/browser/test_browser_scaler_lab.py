"""BrowserScalerLab's front end in Chromium, with no kernel (the page's own model, as on a static
page): for a thousand seeded random settings of every control, the runs, lost share and readout
the page computes equal the package's at the same settings bit for bit; the figure equals
ScalerLab's; a key press or a drag redraws in the page and sets the model Python reads, and a
setting changed on the model moves the control."""

import json

import numpy as np
import pytest

from ampviz.widgets.base import _in_column
from ampviz.widgets.browser_scaler_lab import BrowserScalerLab
from ampviz.widgets.scaler_lab import readout_html
from conftest import (drawn, explorer_test_page, lab_notebook_page, load_data, plain, press_keys, python_side,
                      python_side_cell, render, wait_drawn, wait_python_side)
from test_js_scaleplot import same_log2
from test_js_streams import SIG_JS, sig

SCENARIOS = ["steady", "drift", "spikes", "bursts", "warmup"]
FIGURE = ".ampviz-scaler-figure"


@pytest.fixture(scope="module")
def page(browser):
    page = explorer_test_page(browser, "scaler_lab_view")
    yield page
    page.close()


def random_settings(rng, presets) -> dict:
    interval = int(rng.choice([1, 2, 7, 50, 100, 500, 2000, 10**7])) if rng.random() < 0.5 else int(rng.integers(1, 5000))
    return {"init_log2": int(rng.integers(-10, 41)),
            "growth_factor": round(1.001 + 0.001 * int(rng.integers(0, 3000)), 12),
            "backoff_factor": round(0.005 + 0.005 * int(rng.integers(0, 199)), 12),
            "growth_interval": interval, "scenario": str(rng.choice(SCENARIOS)),
            "strength": round(0.05 * int(rng.integers(0, 21)), 12),
            "loss_dtype": str(rng.choice(["float32", "float16"])),
            "overlay": [str(n) for n in rng.choice(presets, int(rng.integers(0, 4)), replace=False)]}


def test_a_thousand_random_settings_give_the_packages_numbers(page):
    lab = BrowserScalerLab(steps=2_000, seed=3)
    load_data(page, lab)
    rng = np.random.default_rng(0)
    presets = list(lab.presets)
    for batch in range(10):
        settings = [random_settings(rng, presets) for _ in range(100)]
        got = page.evaluate("""([all, sigSrc]) => { const sig = eval(sigSrc);
            return all.map((s) => { const r = V.compute(D, s, CACHE);
              return {scales: r.traces.map((t) => sig(t.scale)), skipped: r.traces.map((t) => sig(t.skipped.length % 4
                        ? Uint8Array.from([...t.skipped, ...new Uint8Array(4 - t.skipped.length % 4)]) : t.skipped)),
                      stopped: r.traces.map((t) => t.stoppedAt), lost: [Array.from(r.lost.steps), Array.from(r.lost.shares)],
                      readout: r.readout, stream: sig(r.stream)}; }); }""", [settings, SIG_JS])
        for s, g in zip(settings, got):
            for k, v in s.items():
                setattr(lab, k, v)
            traces, (steps, shares) = lab._lost_and_traces()  # lab.traces and lab.lost, in one run
            assert g["stream"] == sig(lab.stream), s
            assert g["scales"] == [sig(np.asarray(t.scale, np.float64)) for t in traces], s
            assert g["skipped"] == [sig(np.concatenate([t.skipped.astype(np.uint8),
                                                        np.zeros(-t.skipped.size % 4, np.uint8)])) for t in traces], s
            assert g["stopped"] == [t.stopped_at for t in traces], s
            assert g["lost"][0] == steps.tolist() and g["lost"][1] == shares.tolist(), s
            assert g["readout"] == _in_column(readout_html(traces, lab.marks)), s


@pytest.mark.parametrize("kw", [
    {},
    {"scenario": "bursts", "strength": 0.85, "overlay": ("DeepSpeed", "Megatron", "jmp"), "growth_interval": 100},
    {"scenario": "warmup", "strength": 1.0, "loss_dtype": "float16", "init_scale": 2.0**40, "growth_interval": 1},
    {"scenario": "drift", "strength": 0.35, "growth_factor": 1.7, "backoff_factor": 0.3, "growth_interval": 7},
])
def test_the_figure_is_scaler_labs(page, kw):
    lab = BrowserScalerLab(steps=30_000, **kw)
    load_data(page, lab)
    settings = {k: getattr(lab, k) for k in ("init_log2", "growth_factor", "backoff_factor", "growth_interval",
                                             "scenario", "strength", "loss_dtype", "overlay")}
    got = json.loads(page.evaluate("""(s) => JSON.stringify(V.compute(D, s, CACHE).figure,
        (k, v) => ArrayBuffer.isView(v) ? Array.from(v) : v)""", settings))
    want = plain(lab.figure().to_plotly_json())
    for fig in (got, want):
        fig["layout"].pop("template", None)
    assert got["layout"] == want["layout"]
    assert len(got["data"]) == len(want["data"])
    for a, b in zip(got["data"], want["data"]):
        if b.get("meta", {}).get("kind") == "scale":
            # numpy's log2 is one ulp from the correctly rounded one for a few scales on some CPUs; the
            # page's is correctly rounded (test_js_scaleplot holds it so)
            same_log2(b.pop("y"), a.pop("y"), b["customdata"], kw)
        assert a == b


def test_a_key_press_redraws_in_the_page_and_sets_the_model(page):
    page.errors.clear()
    lab = BrowserScalerLab(steps=20_000, strength=0.5)
    render(page, lab, FIGURE)
    slider = page.locator(".ampviz-scaler-strength")
    slider.focus()
    for _ in range(3):
        page.keyboard.press("ArrowRight")
    wait_drawn(page, FIGURE, strength=0.65)
    assert page.evaluate("() => M.get('strength')") == 0.65
    lab.strength = 0.65
    y = page.evaluate("() => Array.from(document.querySelector('.ampviz-scaler-figure').data[0].y)")
    assert y == plain(lab.figure().to_plotly_json()["data"][0]["y"])
    # a setting changed on the model (as Python changes it) moves the control and redraws
    page.evaluate("() => M.set('scenario', 'drift')")
    wait_drawn(page, FIGURE, scenario="drift")
    assert page.eval_on_selector(".ampviz-scaler-scenario", "(s) => s.value") == "drift"
    # a strength off the slider's positions, set from Python: its recipe arrives first, then the setting
    lab.scenario, lab.strength = "drift", 0.37
    page.evaluate("([r]) => { M.set('recipes', r); M.set('strength', 0.37); }", [lab.recipes])
    wait_drawn(page, FIGURE, strength=0.37)
    y = page.evaluate("() => Array.from(document.querySelector('.ampviz-scaler-figure').data[0].y)")
    assert y == plain(lab.figure().to_plotly_json()["data"][0]["y"])
    assert page.eval_on_selector(".ampviz-message", "(m) => m.textContent") == ""
    assert page.errors == []


def test_a_drag_draws_the_last_position_and_only_real_settings(page):
    page.errors.clear()
    lab = BrowserScalerLab(steps=20_000, strength=0.0)
    render(page, lab, FIGURE)
    seen = page.evaluate("""async () => { const s = document.querySelector(".ampviz-scaler-strength");
        const fig = document.querySelector(".ampviz-scaler-figure"), seen = new Set();
        const watch = new MutationObserver(() => seen.add(JSON.parse(fig.dataset.drawn).strength));
        watch.observe(fig, {attributes: true, attributeFilter: ["data-drawn"]});
        for (let k = 1; k <= 20; k++) { s.value = String(k * 0.05); s.dispatchEvent(new Event("input")); await new Promise(requestAnimationFrame); }
        await new Promise((r) => setTimeout(r, 1500)); watch.disconnect(); return [...seen]; }""")
    assert drawn(page, FIGURE)["strength"] == 1.0
    grid = {round(k * 0.05, 12) for k in range(21)}
    assert set(seen) <= grid and len(seen) >= 5, seen
    assert page.errors == []


PY_SIDE = python_side_cell("lab", ["backoff_factor"], '''
from ampviz.plots import format_number
t = lab.traces[0]
python_side.value = f"{lab.backoff_factor!r} | {int(t.skipped.sum()):,} | {format_number(t.final.scale)}"
''')


def test_in_jupyterlab_the_kernel_reads_what_the_page_moved(browser, tmp_path):
    """In JupyterLab, with a kernel: arrow keys move the slider (JupyterLab's notebook takes arrow
    keys that a control lets through), the page redraws at once, and the kernel's lab holds the new
    setting and computes the same run as the page's readout shows."""
    cells = ["from ampviz.widgets import BrowserScalerLab\nlab = BrowserScalerLab(steps=20_000)\nlab", PY_SIDE]
    with lab_notebook_page(browser, tmp_path, cells, FIGURE, "0.5 |") as page:
        press_keys(page.locator(".ampviz-scaler-backoff").first, 2)
        wait_drawn(page, FIGURE, backoff_factor=0.51)
        wait_python_side(page, "0.51 |")
        py = python_side(page)
        cells = page.evaluate("() => Array.from(document.querySelectorAll('.ampviz-scaler-readout td'))"
                              ".slice(0, 4).map((c) => c.innerText)")
        assert cells[0] == "your settings"
        assert cells[1].split(" ")[0] == py[1] and cells[2] == py[2], (cells, py)
