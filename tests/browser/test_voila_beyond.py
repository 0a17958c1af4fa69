"""The FP8 and block-scaling explorers in a Voila page, as a learner moves them: after each move the
figure in the browser holds exactly the data that a fresh explorer built headless at the new
setting draws (the same numbers, read from the page's plotly figure)."""

import json

import numpy as np
import pytest

from conftest import OUTPUT, VOILA_LOAD_MS, outputs_without_tracebacks, press_slider, voila, write_notebook

CELLS = [
    "from ampviz.widgets import BlockExplorer, Fp8ScalingLab",
    "BlockExplorer('fp4_e2m1', log2_outlier=8)",
    "Fp8ScalingLab(history_len=16)",
]

#: A trace of the explorer's figure, as the page's plotly holds it, by ``meta.kind``: its y values
#: (a base64 typed array ``{dtype, bdata}`` decoded; NaN as null), as JSON text.
TRACE_Y = """([root, kind]) => { const gd = document.querySelector(root + ' .js-plotly-plot');
    if (!gd || !gd.data) return null;
    const t = gd.data.find(d => d.meta && d.meta.kind === kind);
    if (!t || !t.y) return null;
    const TYPES = {f8: Float64Array, f4: Float32Array, i4: Int32Array, i2: Int16Array, i1: Int8Array,
                   u4: Uint32Array, u2: Uint16Array, u1: Uint8Array};
    let y = t.y;
    if (y.bdata !== undefined) {
      const raw = atob(y.bdata), bytes = new Uint8Array(raw.length);
      for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
      y = new TYPES[y.dtype](bytes.buffer);
    }
    return JSON.stringify(Array.from(y, v => (v === null || Number.isNaN(Number(v))) ? null : Number(v))); }"""


@pytest.fixture(scope="module")
def page(browser, tmp_path_factory):
    folder = tmp_path_factory.mktemp("beyond")
    write_notebook(folder / "beyond.ipynb", CELLS)
    with voila(folder / "beyond.ipynb") as url:
        p = browser.new_page(viewport={"width": 1300, "height": 1400})
        p.goto(url, timeout=VOILA_LOAD_MS)
        for root in (".ampviz-block-explorer", ".ampviz-fp8-lab"):
            p.locator(f"{root} .js-plotly-plot").wait_for(timeout=120_000)
        yield p
        p.close()


def _y(page, root, kind):
    text = page.evaluate(TRACE_Y, [root, kind])
    return None if text is None else np.array([np.nan if v is None else v for v in json.loads(text)], dtype=np.float64)


def _trace_y(figure, kind) -> np.ndarray:
    (trace,) = [t for t in figure.data if t.meta and t.meta.get("kind") == kind]
    return np.asarray(trace.y, dtype=np.float64)


def _wait_for_y(page, root, kind, want: np.ndarray):
    """Wait until the page's trace holds ``want`` (NaN where NaN), then return it."""
    expected = [None if np.isnan(v) else float(v) for v in want]
    page.wait_for_function(f"""(want) => {{ const text = ({TRACE_Y})(['{root}', '{kind}']);
        if (text === null) return false;
        const y = JSON.parse(text);
        return y.length === want.length && y.every((v, i) => v === want[i]); }}""", arg=expected, timeout=60_000)
    return _y(page, root, kind)


def test_block_explorer_follows_its_controls(page):
    from ampviz.widgets import BlockExplorer

    root = ".ampviz-block-explorer"
    explorer = page.locator(root)
    start = _trace_y(BlockExplorer("fp4_e2m1", log2_outlier=8).figure, "dequantized")
    got = _wait_for_y(page, root, "dequantized", start)
    np.testing.assert_array_equal(got, start)
    # the outlier two binades larger: its block's scale grows and more of its neighbours flush
    press_slider(explorer, "ampviz-blocks-outlier", 2)
    moved = BlockExplorer("fp4_e2m1", log2_outlier=10)
    want = _trace_y(moved.figure, "dequantized")
    assert not np.array_equal(want, got, equal_nan=True)  # the move changes what is drawn
    np.testing.assert_array_equal(_wait_for_y(page, root, "dequantized", want), want)
    # the scale rule from the menu: rceil rounds the scale up
    explorer.locator(".ampviz-blocks-rounding select").select_option("rceil")
    want = _trace_y(BlockExplorer("fp4_e2m1", log2_outlier=10, rounding="rceil").figure, "dequantized")
    np.testing.assert_array_equal(_wait_for_y(page, root, "dequantized", want), want)
    assert explorer.locator(".ampviz-message").inner_text().strip() == ""
    explorer.screenshot(path=str(OUTPUT / "voila_block_explorer.png"))


def test_fp8_scaling_lab_follows_its_controls(page):
    from ampviz.widgets import Fp8ScalingLab

    root = ".ampviz-fp8-lab"
    lab = page.locator(root)
    start = _trace_y(Fp8ScalingLab(history_len=16).figure, "scale")
    got = _wait_for_y(page, root, "scale", start)
    np.testing.assert_array_equal(got, start)
    # a margin of 2: every scale a quarter of what it was (the same steps held by the spikes)
    press_slider(lab, "ampviz-fp8-margin", 2)
    want = _trace_y(Fp8ScalingLab(history_len=16, margin=2).figure, "scale")
    assert not np.array_equal(want, got, equal_nan=True)
    np.testing.assert_array_equal(_wait_for_y(page, root, "scale", want), want)
    # the other recipe from its button: current scaling follows every amax
    lab.locator(".ampviz-fp8-recipe button", has_text="current").click()
    want = _trace_y(Fp8ScalingLab("current", history_len=16, margin=2).figure, "scale")
    np.testing.assert_array_equal(_wait_for_y(page, root, "scale", want), want)
    assert lab.locator(".ampviz-message").inner_text().strip() == ""
    lab.screenshot(path=str(OUTPUT / "voila_fp8_lab.png"))


def test_no_output_shows_a_traceback(page):
    assert outputs_without_tracebacks(page) == []
