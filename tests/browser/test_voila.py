"""The explorer app as a standalone page (Voila), as a learner uses it: no code on the page, a tab
per explorer, every control answering in the browser."""

import json
import re
import time

import pytest

from conftest import (OUTPUT, ROOT, SCALE_Y, TOKEN, VOILA_LOAD_MS, kernel_processes, outputs_without_tracebacks,
                      press_slider, shown_whole, voila)

LIVE_POINTS = """() => { const gd = document.querySelector('.ampviz-live-figure .js-plotly-plot');
    return gd && gd.data ? gd.data.map(t => (t.x && t.x.length) || 0).reduce((a, b) => a + b, 0) : 0; }"""


LOSS_POINTS = """() => { const gd = document.querySelector('.ampviz-live-figure .js-plotly-plot');
    return gd && gd.data ? gd.data.filter(t => t.meta && t.meta.kind === 'loss').map(t => (t.y && t.y.length) || 0)
                         : []; }"""


#: What the app's page wrote to its console as errors, and the errors it raised and did not catch,
#: from the moment it was opened (the tests below use the page in turn; one near the end reads it).
PAGE_ERRORS: list = []


def record_errors(p, errors: list) -> None:
    """Keep in ``errors`` each console error and each uncaught error of page ``p``."""
    p.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
    p.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))


@pytest.fixture(scope="module")
def page(browser):
    with voila(ROOT / "notebooks" / "explorer.ipynb") as url:
        p = browser.new_page(viewport={"width": 1300, "height": 1000})
        record_errors(p, PAGE_ERRORS)
        p.goto(url, timeout=VOILA_LOAD_MS)
        p.locator(".ampviz-explorer-app").wait_for(timeout=120_000)
        p.locator(".ampviz-format-explorer .js-plotly-plot").wait_for(timeout=60_000)
        yield p
        p.close()


def _tab(page, name):
    page.get_by_role("tab", name=name).click()


def _wait_for_text(page, selector: str, pattern: str, timeout: int = 30_000) -> None:
    """Wait until the first element at ``selector`` shows text the JS regex ``pattern`` matches.
    A readout's rows change in one message and its bits in another: wait for the row the test
    reads, as a whole row (the value sought may already be in the old readout as a neighbour)."""
    page.wait_for_function("([selector, pattern]) => { const el = document.querySelector(selector);"
                           " return !!el && new RegExp(pattern).test(el.innerText); }",
                           arg=[selector, pattern], timeout=timeout)


def test_the_page_shows_the_app_and_no_code(page):
    assert page.get_by_role("tab").all_inner_texts() == ["Formats", "Ranges", "Loss scaling", "FP8 scaling",
                                                         "Block scaling", "Live training"]
    assert page.locator(".jp-CodeCell .jp-InputArea, .jp-CodeMirrorEditor, .cm-editor").count() == 0
    text = page.locator("body").inner_text()
    assert "ampviz explorer" in text and "ExplorerApp" not in text and "import" not in text
    page.screenshot(path=str(OUTPUT / "voila_formats.png"))


def test_format_tab_bit_toggle(page):
    _tab(page, "Formats")
    explorer = page.locator(".ampviz-format-explorer")
    assert "0x2E66" in explorer.locator(".ampviz-bits-readout").inner_text()  # 0.1 in fp16
    explorer.locator(".ampviz-bit-0").first.click()  # the last mantissa bit: 0x2E66 -> 0x2E67
    page.wait_for_function("() => document.querySelector('.ampviz-format-explorer .ampviz-bits-readout')"
                           ".innerText.includes('0x2E67')", timeout=30_000)
    # 0.10003662109375 is in the old readout too, as 0.1's neighbour above: wait for the "stored" row
    _wait_for_text(page, ".ampviz-format-explorer .ampviz-format-readout", r"stored\s+0\.10003662109375")
    assert re.search(r"stored\s+0\.10003662109375", explorer.locator(".ampviz-format-readout").inner_text())
    explorer.screenshot(path=str(OUTPUT / "voila_format_bit0.png"))


def test_format_tab_keeps_the_typed_number_in_a_new_format(page):
    """Typed 0.1, then bf16: the box still says 0.1, the readout's "typed" row says 0.1, and the bits
    are 0.1 in bf16 (0x3DCD); the figure is redrawn with the new layout."""
    _tab(page, "Formats")
    explorer = page.locator(".ampviz-format-explorer")
    box = explorer.locator(".ampviz-decimal-input input")
    box.fill("0.1")
    box.press("Enter")
    page.wait_for_function("() => document.querySelector('.ampviz-format-explorer .ampviz-bits-readout')"
                           ".innerText.includes('0x2E66')", timeout=30_000)
    explorer.locator(".ampviz-format-dropdown select").select_option("bf16")
    page.wait_for_function("() => document.querySelector('.ampviz-format-explorer .ampviz-bits-readout')"
                           ".innerText.includes('0x3DCD')", timeout=30_000)
    page.wait_for_function("() => document.querySelector('.ampviz-format-explorer .gtitle')"
                           ".textContent.includes('bf16')", timeout=30_000)
    _wait_for_text(page, ".ampviz-format-explorer .ampviz-format-readout", r"stored\s+0\.10009765625")
    assert box.input_value() == "0.1"
    readout = explorer.locator(".ampviz-format-readout").inner_text()
    assert re.search(r"typed\s+0\.1\s", readout) and re.search(r"stored\s+0\.10009765625", readout), readout
    explorer.screenshot(path=str(OUTPUT / "voila_format_bf16_typed.png"))


def test_range_tab_scale_slider(page):
    _tab(page, "Ranges")
    explorer = page.locator(".ampviz-range-explorer")
    explorer.locator(".js-plotly-plot").wait_for(timeout=30_000)
    assert "underflow 85.8%" in explorer.locator(".ampviz-census-readout").inner_text()  # notebook 02's share
    press_slider(explorer, "ampviz-scale-slider", 10)
    page.wait_for_function("() => document.querySelector('.ampviz-range-explorer .ampviz-scale-label')"
                           ".innerText.includes('2^10')", timeout=30_000)
    page.wait_for_function("() => !document.querySelector('.ampviz-range-explorer .ampviz-census-readout')"
                           ".innerText.includes('underflow 85.8%')", timeout=30_000)
    explorer.screenshot(path=str(OUTPUT / "voila_ranges_2^10.png"))


def test_scaling_tab_sliders_change_the_scale_curve(page):
    _tab(page, "Loss scaling")
    lab = page.locator(".ampviz-scaler-lab")
    page.wait_for_function(f"() => {{ const y = ({SCALE_Y})(); return y && y.length > 2; }}", timeout=60_000)
    before = page.evaluate(SCALE_Y)
    assert "1,000,000 steps" in lab.locator(".gtitle").first.text_content()
    lab.screenshot(path=str(OUTPUT / "voila_scaling_start.png"))
    press_slider(lab, "ampviz-scaler-backoff", 5)
    press_slider(lab, "ampviz-scaler-growth", 20)
    page.wait_for_function(f"(prev) => {{ const y = ({SCALE_Y})(); return y && y !== prev; }}",
                           arg=before, timeout=30_000)
    assert page.evaluate(SCALE_Y) != before
    page.wait_for_function("() => document.querySelector('.ampviz-scaler-growth .widget-readout')"
                           ".innerText.trim() === '2.020'", timeout=30_000)
    lab.screenshot(path=str(OUTPUT / "voila_scaling_moved.png"))
    # Home and End reach the ends of each factor's slider: valid settings, the curve follows
    for slider, key, end in (("ampviz-scaler-growth", "Home", "1.001"), ("ampviz-scaler-backoff", "End", "0.995"),
                             ("ampviz-scaler-backoff", "Home", "0.005")):
        before = page.evaluate(SCALE_Y)
        press_slider(lab, slider, 1, key=key)
        page.wait_for_function(f"() => parseFloat(document.querySelector('.{slider} .widget-readout').innerText) === {end}",
                               timeout=30_000)
        page.wait_for_function(f"(prev) => {{ const y = ({SCALE_Y})(); return y && y !== prev; }}",
                               arg=before, timeout=30_000)
        assert lab.locator(".ampviz-message").inner_text().strip() == ""


def test_fp8_and_block_tabs_answer_their_sliders(page):
    """The two tabs show their explorers, and a slider move in each repaints its figure (the
    figure's data after a move is checked value for value in test_voila_beyond.py); a move of the
    block explorer's outlier is drawn by moving its traces."""
    for tab, root, slider, drawn_by in (("FP8 scaling", ".ampviz-fp8-lab", "ampviz-fp8-margin", None),
                                        ("Block scaling", ".ampviz-block-explorer", "ampviz-blocks-outlier",
                                         "moving")):
        _tab(page, tab)
        explorer = page.locator(root)
        explorer.locator(".js-plotly-plot").wait_for(timeout=60_000)
        revision = f"() => document.querySelector('{root} .js-plotly-plot').dataset.revision || null"
        page.wait_for_function(f"() => ({revision})() !== null", timeout=60_000)
        before = page.evaluate(revision)
        press_slider(explorer, slider, 1)
        page.wait_for_function(f"(prev) => ({revision})() !== prev", arg=before, timeout=30_000)
        assert explorer.locator(".ampviz-message").inner_text().strip() == ""
        # FigureView marks how long plotly took to draw it (what bench_browser reports)
        draw_ms = page.evaluate(f"() => Number(document.querySelector('{root} .js-plotly-plot').dataset.drawMs)")
        assert 0 < draw_ms < 30_000
        # and whether it moved the traces or redrew the figure: an outlier move keeps the layout
        way = page.evaluate(f"() => document.querySelector('{root} .js-plotly-plot').dataset.drawnBy")
        assert way in ("moving", "redrawing") and (drawn_by is None or way == drawn_by)
        explorer.screenshot(path=str(OUTPUT / f"voila_{tab.split()[0].lower()}_tab.png"))


@pytest.mark.parametrize("tab, root", [("Loss scaling", ".ampviz-scaler-lab"), ("FP8 scaling", ".ampviz-fp8-lab"),
                                       ("Block scaling", ".ampviz-block-explorer")])
def test_each_explorer_fits_a_1400_by_900_screen(page, tab, root):
    """On a 1400 × 900 screen, scrolled to the explorer, its controls and its whole figure are in
    view at once: the controls in a column, the figure beside them (stacked, the figure's foot was
    below the screen, and a learner moving a slider could not see the figure change)."""
    try:
        _tab(page, tab)
        explorer = page.locator(root)
        explorer.locator(".js-plotly-plot").wait_for(timeout=60_000)
        assert shown_whole(page, explorer) == []
        page.screenshot(path=str(OUTPUT / f"voila_1400x900_{tab.split()[0].lower()}.png"))
    finally:
        page.locator(".ampviz-explorer-app").evaluate("(e) => e.scrollIntoView({block: 'start'})")
        page.set_viewport_size({"width": 1300, "height": 1000})


def test_live_tab_trains_and_draws(page):
    _tab(page, "Live training")
    trainer = page.locator(".ampviz-live-trainer")
    trainer.locator(".js-plotly-plot").wait_for(timeout=30_000)
    assert page.evaluate(LIVE_POINTS) == 0
    trainer.locator(".ampviz-live-start").click()
    page.wait_for_function("() => document.querySelector('.ampviz-live-status').innerText.includes('done')",
                           timeout=120_000)
    page.wait_for_function(f"() => ({LIVE_POINTS})() > 0", timeout=60_000)
    assert re.search(r"900 / 900 steps", trainer.locator(".ampviz-live-status").inner_text())
    # every mode's loss curve holds all 300 steps: the figure shows the finished run, not a stale frame
    page.wait_for_function(f"() => JSON.stringify(({LOSS_POINTS})()) === JSON.stringify([300, 300, 300])",
                           timeout=60_000)
    trainer.screenshot(path=str(OUTPUT / "voila_live_done.png"))


def test_no_output_shows_a_traceback(page):
    assert outputs_without_tracebacks(page) == []
    text = page.locator("body").inner_text()
    assert "Traceback" not in text and "internal error" not in text and "⚠" not in text


def test_the_page_logs_no_error(page):
    """From its opening through every tab above, the page wrote no error to its console and raised
    none uncaught. Voila loads the lab extensions installed beside it; jupytext's needs JupyterLab's
    document manager, which Voila's page does not provide ("The getter for the shared module is not
    a function ... #RUNTIME-012 ... @jupyterlab/docmanager"): voila.json leaves it out. Every figure
    view once raised "Cannot read properties of undefined (reading 'then')" when shown and at each
    new layout: the figure's layout took the name of the widget's own CSS layout."""
    assert "jupyterlab-jupytext" in json.loads((ROOT / "voila.json").read_text())["VoilaConfiguration"][
        "extension_denylist"]
    assert PAGE_ERRORS == []


def test_the_app_also_renders_inside_jupyter_server(browser, lab):
    """Binder's explorer link opens ``voila/render/...`` on the Jupyter server (Voila's server
    extension), not a Voila server of its own: the same page must come up there."""
    p = browser.new_page(viewport={"width": 1300, "height": 1000})
    errors = []
    record_errors(p, errors)
    p.goto(f"{lab}/voila/render/explorer.ipynb?token={TOKEN}", timeout=VOILA_LOAD_MS)
    p.locator(".ampviz-explorer-app .ampviz-format-explorer .js-plotly-plot").wait_for(timeout=120_000)
    assert p.get_by_role("tab").all_inner_texts() == ["Formats", "Ranges", "Loss scaling", "FP8 scaling",
                                                      "Block scaling", "Live training"]
    assert outputs_without_tracebacks(p) == []
    p.wait_for_timeout(1_000)
    # the server's Voila reads the same voila.json (from the folder it runs in): no error from the
    # lab extensions either (the page there links MathJax from a CDN, which a machine offline cannot
    # fetch: that failed request is the one console error allowed here)
    assert [e for e in errors if not e.startswith("console: Failed to load resource: net::")] == []
    p.close()


def test_closed_pages_leave_no_kernel_behind(browser):
    """Every page Voila serves starts a kernel (0.4-0.7 GB here). The project's voila.json has Voila
    cull a kernel whose page is gone, even one whose live training still runs (its figure updates
    are not a user's activity); here with shorter times, the same settings otherwise."""
    config = json.loads((ROOT / "voila.json").read_text())["MappingKernelManager"]
    assert config["cull_connected"] is False and 0 < config["cull_interval"] <= config["cull_idle_timeout"] <= 600
    assert "comm_msg" in config["untracked_message_types"]
    server = {}
    fast = {"MappingKernelManager": {"cull_idle_timeout": 4, "cull_interval": 1}}
    with voila(ROOT / "notebooks" / "explorer.ipynb", settings=fast, server=server) as url:
        pid = server["proc"].pid
        pages = []
        for _ in range(2):  # a page, then a reload (a second page and kernel)
            p = browser.new_page()
            p.goto(url, timeout=VOILA_LOAD_MS)
            p.locator(".ampviz-explorer-app").wait_for(timeout=120_000)
            pages.append(p)
        assert len(kernel_processes(pid)) == 2
        # the reload starts a long live run and is closed while it trains
        training = pages[1]
        _tab(training, "Live training")
        steps = training.locator(".ampviz-live-steps input")
        steps.fill("1000000")
        steps.press("Enter")
        training.locator(".ampviz-live-start").click()
        training.wait_for_function(
            "() => /^[1-9][0-9,]* \\/ /.test(document.querySelector('.ampviz-live-status').innerText)",
            timeout=60_000)
        time.sleep(8)  # twice the idle timeout: an open page's kernel is never culled
        assert len(kernel_processes(pid)) == 2
        assert "done" not in training.locator(".ampviz-live-status").inner_text()
        for p in pages:
            p.close()
        deadline = time.monotonic() + 60
        while kernel_processes(pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert kernel_processes(pid) == []
