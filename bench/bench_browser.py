"""Browser latency: from a ScalerLab slider move to the plot repainted, in Chromium.

Opens a ScalerLab of 1,000,000 simulated steps, presses the backoff slider's arrow key, and times
until the scale curve in the page holds new data (plotly has redrawn it). Repeats, then prints
the median (p50) and the 90th percentile. Target: p50 <= 300 ms. Measured three times: in
JupyterLab and in Voila on a notebook with the ScalerLab alone (beside a baseline: the smallest
explorer of the same shape, whose latency is the front end's own round trip), and in the explorer
app served by Voila (its Loss scaling tab, also 1,000,000 steps).

    .venv/bin/python bench/bench_browser.py
"""

import statistics
import sys
import tempfile
import time
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "browser"))
import conftest  # noqa: E402  (the browser tests' JupyterLab and Chromium set-up)
from conftest import SCALE_Y  # noqa: E402

MOVES = 20


# The baseline, in the same notebook: the smallest explorer of the same shape (a slider whose
# callback draws a two-point go.Figure into an Output). What it costs is JupyterLab's own round
# trip (key -> widget message -> kernel -> display -> plotly), which no explorer can beat.
BASELINE_CELL = """
import ipywidgets as W, plotly.graph_objects as go
from IPython.display import clear_output, display
out, slider = W.Output(), W.FloatSlider(value=0.5, min=0, max=1, step=0.005)
out.add_class("bench-baseline-figure"); slider.add_class("bench-baseline-slider")
def draw(change=None):
    with out:
        clear_output(wait=True)
        display(go.Figure(go.Scatter(x=[0, 1], y=[0, slider.value]), layout=dict(height=300)))
slider.observe(draw, names="value"); draw()
W.VBox([slider, out])
"""
BASELINE_Y = """() => { const gd = document.querySelector('.bench-baseline-figure .js-plotly-plot');
    return gd && gd.data && gd.data[0] ? JSON.stringify(gd.data[0].y) : null; }"""


def measure(page, slider="ampviz-scaler-backoff", curve=SCALE_Y) -> list:
    """Milliseconds from each key press on ``slider`` to the ``curve`` in the page holding new data."""
    page.wait_for_function(f"() => {{ const y = ({curve})(); return y && y.length > 2; }}", timeout=60_000)
    handle = conftest.press_slider(page, slider, 0)
    times = []
    for k in range(MOVES):
        before = page.evaluate(curve)
        t0 = time.perf_counter()
        handle.press("ArrowRight" if k % 2 == 0 else "ArrowLeft")
        page.wait_for_function(f"(prev) => {{ const y = ({curve})(); return y && y !== prev; }}",
                               arg=before, timeout=30_000, polling="raf")
        times.append(1e3 * (time.perf_counter() - t0))
    return sorted(times)


def report(where: str, times: list, baseline: list | None = None) -> None:
    print(f"ScalerLab, 1,000,000 steps, {MOVES} backoff_factor moves in {where} (headless Chromium)")
    print(f"  slider move -> plot repainted: p50 {statistics.median(times):.0f} ms, "
          f"p90 {times[int(0.9 * (len(times) - 1))]:.0f} ms, min {times[0]:.0f} ms (target p50 <= 300 ms)")
    if baseline:
        b = statistics.median(baseline)
        print(f"  baseline (a slider redrawing a two-point figure, same page): p50 {b:.0f} ms; "
              f"ScalerLab / baseline = {statistics.median(times) / b:.2f}")


def main():
    from playwright.sync_api import sync_playwright

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    nb.cells = [nbformat.v4.new_code_cell(
        "from ampviz.widgets import ScalerLab\nScalerLab(steps=1_000_000, scenario='spikes', strength=0.5)"),
        nbformat.v4.new_code_cell(BASELINE_CELL)]
    notebooks = Path(tempfile.mkdtemp(prefix="ampviz-bench-"))
    nbformat.write(nb, notebooks / "latency.ipynb")
    with sync_playwright() as p:
        browser = conftest.launch(p)
        with conftest.jupyter_lab(notebooks) as url:
            page = conftest.open_and_run(browser, url, "latency.ipynb")
            page.locator(".ampviz-scaler-lab .js-plotly-plot").wait_for(timeout=120_000)
            page.locator(".bench-baseline-figure .js-plotly-plot").wait_for(timeout=120_000)
            times = measure(page)
            baseline = measure(page, "bench-baseline-slider", BASELINE_Y)
            report("JupyterLab", times, baseline)
            page.close()
        with conftest.voila(notebooks / "latency.ipynb") as url:
            page = browser.new_page(viewport={"width": 1300, "height": 1000})
            page.goto(url, timeout=conftest.VOILA_LOAD_MS)
            page.locator(".bench-baseline-figure .js-plotly-plot").wait_for(timeout=120_000)
            times = measure(page)
            baseline = measure(page, "bench-baseline-slider", BASELINE_Y)
            report("Voila (the same notebook)", times, baseline)
            page.close()
        with conftest.voila(conftest.ROOT / "notebooks" / "explorer.ipynb") as url:
            page = browser.new_page(viewport={"width": 1300, "height": 1000})
            page.goto(url, timeout=conftest.VOILA_LOAD_MS)
            page.get_by_role("tab", name="Loss scaling").click()
            page.locator(".ampviz-scaler-lab .js-plotly-plot").wait_for(timeout=120_000)
            report("the explorer app (Voila)", measure(page))
            page.close()
        browser.close()


if __name__ == "__main__":
    main()
