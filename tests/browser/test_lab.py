"""The course in JupyterLab, as a learner uses it: run a notebook, move its controls, look."""

import re

from conftest import OUTPUT, SCALE_Y, TOKEN, open_and_run, outputs_without_tracebacks, press_slider, shown_whole



def test_scaling_lab_sliders_change_the_scale_curve(browser, lab):
    page = open_and_run(browser, lab, "06_scaling_lab.ipynb")
    lab_widget = page.locator(".ampviz-scaler-lab").first
    lab_widget.locator(".js-plotly-plot").wait_for(timeout=120_000)
    lab_widget.scroll_into_view_if_needed()
    page.wait_for_function(f"() => {{ const y = ({SCALE_Y})(); return y && y.length > 2; }}", timeout=60_000)
    before = page.evaluate(SCALE_Y)
    lab_widget.screenshot(path=str(OUTPUT / "scaling_lab_start.png"))
    press_slider(lab_widget, "ampviz-scaler-backoff", 5)
    press_slider(lab_widget, "ampviz-scaler-growth", 20)
    page.wait_for_function(f"(prev) => {{ const y = ({SCALE_Y})(); return y && y !== prev; }}",
                           arg=before, timeout=30_000)
    after = page.evaluate(SCALE_Y)
    assert after != before
    readout = lab_widget.locator(".ampviz-scaler-readout").inner_text()
    assert "your settings" in readout
    lab_widget.screenshot(path=str(OUTPUT / "scaling_lab_moved.png"))
    assert outputs_without_tracebacks(page) == []
    # on a 1400 × 900 screen, with the file browser open, the controls and the figure beside them
    # are in view at once (stacked, the figure's foot was below the screen)
    assert shown_whole(page, lab_widget) == []
    page.screenshot(path=str(OUTPUT / "scaling_lab_1400x900.png"))
    page.close()


def test_format_explorer_bit_toggle(browser, lab):
    page = open_and_run(browser, lab, "01_fp16_range.ipynb")
    explorer = page.locator(".ampviz-format-explorer").first
    explorer.wait_for(timeout=120_000)
    explorer.scroll_into_view_if_needed()
    readout = explorer.locator(".ampviz-format-readout")
    page.wait_for_function("() => document.querySelector('.ampviz-format-explorer .ampviz-format-readout')"
                           " && document.querySelector('.ampviz-format-explorer .ampviz-format-readout').innerText.includes('65504')",
                           timeout=60_000)
    explorer.screenshot(path=str(OUTPUT / "format_explorer_65519.png"))
    explorer.locator(".ampviz-bit-0").first.click()  # the last mantissa bit: 0x7BFF -> 0x7BFE
    # wait for the new bit pattern (65472 alone would also match the old readout's neighbour)
    page.wait_for_function("() => document.querySelector('.ampviz-format-explorer .ampviz-bits-readout')"
                           ".innerText.includes('0x7BFE')", timeout=30_000)
    page.wait_for_function("() => document.querySelector('.ampviz-format-explorer .ampviz-format-readout')"
                           ".innerText.includes('(2 - 2^-9)')", timeout=30_000)
    text = readout.inner_text()
    assert re.search(r"stored\s+65472\.0", text), text
    assert "0x7BFE" in explorer.locator(".ampviz-bits-readout").inner_text()
    explorer.screenshot(path=str(OUTPUT / "format_explorer_bit0.png"))
    assert outputs_without_tracebacks(page) == []
    page.close()


def test_no_news_toast_covers_the_notebook(browser, lab):
    """The course's JupyterLab settings (tools/jupyterlab_overrides.json, installed by make and by
    binder/postBuild) turn off the news question that otherwise covers the notebook."""
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    page.goto(f"{lab}/lab/tree/00_start_here.ipynb?reset&token={TOKEN}")
    page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=90_000)
    page.wait_for_timeout(5_000)  # the question appears a few seconds after the page
    assert page.get_by_text("official Jupyter news").count() == 0
    page.screenshot(path=str(OUTPUT / "lab_00_start_here.png"))
    page.close()
