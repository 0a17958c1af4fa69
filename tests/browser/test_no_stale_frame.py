"""No stale frame: ten quick slider moves in JupyterLab, and the page ends on the final position.

The moves are pressed without waiting, so they arrive while the kernel still computes; the
explorer drops the intermediate positions. Once the page is quiet, what plotly holds in the page
(every trace's name, x and y) and the readout must equal what a fresh explorer computes in this
process at the final position: a figure or a readout left from an intermediate position fails.
"""

import html
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest

from conftest import OUTPUT, jupyter_lab, open_and_run, outputs_without_tracebacks, write_notebook

STEPS = 200_000
PRESSES = 10

CELLS = [
    "from ampviz.widgets import RangeExplorer, ScalerLab\nimport numpy as np",
    f"ScalerLab(steps={STEPS}, scenario='spikes', strength=0.5)",
    "grads = np.random.default_rng(0).lognormal(-16.0, 3.0, 20_000).astype(np.float32)\n"
    "RangeExplorer(grads, log2_scale=0)",
]

# every trace's name, x and y as plotly holds them (a base64 typed array {bdata, dtype} decoded)
PAGE_TRACES = """(root) => { const gd = document.querySelector(root + ' .js-plotly-plot');
    if (!gd || !gd.data) return null;
    const TYPES = {f8: Float64Array, f4: Float32Array, i4: Int32Array, i2: Int16Array, i1: Int8Array,
                   u4: Uint32Array, u2: Uint16Array, u1: Uint8Array};
    const values = (y) => {
      if (!y) return [];
      if (y.bdata !== undefined) {
        const raw = atob(y.bdata), bytes = new Uint8Array(raw.length);
        for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
        return Array.from(new TYPES[y.dtype](bytes.buffer));
      }
      return Array.from(y, v => v === null ? NaN : Number(v));
    };
    return gd.data.map(t => ({name: t.name || null, x: values(t.x), y: values(t.y)})); }"""
REVISION = """(root) => { const gd = document.querySelector(root + ' .js-plotly-plot');
    return gd ? gd.dataset.revision || null : null; }"""


def _text(markup: str) -> str:
    """Text of an HTML readout without its tags and spacing (the page's inner text joins some
    elements without a space): what the two readouts are compared on."""
    return "".join(html.unescape(re.sub(r"<[^>]+>", "", markup)).split())


def _expected(fig) -> list:
    def values(a):
        return [float(v) for v in (a if a is not None else [])]

    return [{"name": t.name, "x": values(t.x), "y": values(t.y)} for t in fig.data]


def _same(page_traces, expected) -> bool:
    if page_traces is None or len(page_traces) != len(expected):
        return False
    return all(a["name"] == b["name"] and all(np.array_equal(np.asarray(a[k], float), np.asarray(b[k], float),
                                                             equal_nan=True) for k in ("x", "y"))
               for a, b in zip(page_traces, expected))


@pytest.fixture(scope="module")
def page(browser):
    folder = Path(tempfile.mkdtemp(prefix="ampviz-stale-"))
    write_notebook(folder / "stale.ipynb", CELLS)
    with jupyter_lab(folder) as url:
        p = open_and_run(browser, url, "stale.ipynb")
        yield p
        p.close()


def _press_quickly_and_settle(page, root: str, slider: str) -> None:
    widget = page.locator(root).first
    widget.locator(".js-plotly-plot").wait_for(timeout=120_000)
    widget.scroll_into_view_if_needed()
    page.wait_for_function(f"() => ({REVISION})({root!r}) !== null", timeout=60_000)
    handle = widget.locator(f".{slider} .noUi-handle").first
    handle.focus()
    for _ in range(PRESSES):
        page.keyboard.press("ArrowRight")  # no waiting between presses
    # quiet: the drawn revision has not changed for 1.5 s
    last, still = None, 0
    for _ in range(240):
        page.wait_for_timeout(250)
        now = page.evaluate(REVISION, root)
        still = still + 1 if now == last else 0
        last = now
        if still >= 6:
            break
    assert still >= 6, "the figure never settled"


def test_scaler_lab_ends_on_the_final_position(page):
    from ampviz.widgets import ScalerLab

    root = ".ampviz-scaler-lab"
    _press_quickly_and_settle(page, root, "ampviz-scaler-backoff")
    fresh = ScalerLab(steps=STEPS, scenario="spikes", strength=0.5, backoff_factor=0.5 + PRESSES * 0.005)
    shown = page.evaluate(PAGE_TRACES, root)
    readout = page.locator(f"{root} .ampviz-scaler-readout").first.inner_text()
    page.locator(root).first.screenshot(path=str(OUTPUT / "no_stale_frame_scaler_lab.png"))
    assert _same(shown, _expected(fresh.figure)), "the page shows another position's figure"
    assert "".join(readout.split()) == _text(fresh.readout.value)
    # the plausible stale frame (one press short) is a different figure: the check can fail
    short = ScalerLab(steps=STEPS, scenario="spikes", strength=0.5, backoff_factor=0.5 + (PRESSES - 1) * 0.005)
    assert not _same(shown, _expected(short.figure))
    assert outputs_without_tracebacks(page) == []


def test_range_explorer_ends_on_the_final_position(page):
    from ampviz.widgets import RangeExplorer

    root = ".ampviz-range-explorer"
    _press_quickly_and_settle(page, root, "ampviz-scale-slider")
    grads = np.random.default_rng(0).lognormal(-16.0, 3.0, 20_000).astype(np.float32)
    fresh = RangeExplorer(grads, log2_scale=PRESSES)
    shown = page.evaluate(PAGE_TRACES, root)
    readout = page.locator(f"{root} .ampviz-census-readout").first.inner_text()
    page.locator(root).first.screenshot(path=str(OUTPUT / "no_stale_frame_range_explorer.png"))
    assert _same(shown, _expected(fresh.figure)), "the page shows another position's figure"
    assert "".join(readout.split()) == _text(fresh.readout.value)
    assert not _same(shown, _expected(RangeExplorer(grads, log2_scale=PRESSES - 1).figure))
