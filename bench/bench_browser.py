"""Browser latency: from a ScalerLab slider move to the plot repainted, in Chromium.

Opens a ScalerLab of 1,000,000 simulated steps, presses the backoff slider's arrow key, and times
until the scale curve in the page holds new data (plotly has redrawn it). Repeats, then prints
the median (p50) and the 90th percentile. Target: p50 <= 300 ms. Measured twice: in JupyterLab
(a notebook with the ScalerLab alone) and in the explorer app served by Voila (its Loss scaling
tab, also 1,000,000 steps, with two other frameworks' scalers drawn beside yours).

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

SCALE_Y = """() => { const gd = document.querySelector('.ampviz-scaler-lab .js-plotly-plot');
    return gd && gd.data && gd.data[0] ? JSON.stringify(gd.data[0].y) : null; }"""
MOVES = 20


def measure(page) -> list:
    """Milliseconds from each backoff_factor key press to the scale curve holding new data."""
    page.wait_for_function(f"() => {{ const y = ({SCALE_Y})(); return y && y.length > 2; }}", timeout=60_000)
    handle = page.locator(".ampviz-scaler-backoff .noUi-handle").first
    handle.focus()
    times = []
    for k in range(MOVES):
        before = page.evaluate(SCALE_Y)
        t0 = time.perf_counter()
        handle.press("ArrowRight" if k % 2 == 0 else "ArrowLeft")
        page.wait_for_function(f"(prev) => {{ const y = ({SCALE_Y})(); return y && y !== prev; }}",
                               arg=before, timeout=30_000, polling="raf")
        times.append(1e3 * (time.perf_counter() - t0))
    return sorted(times)


def report(where: str, times: list) -> None:
    print(f"ScalerLab, 1,000,000 steps, {MOVES} backoff_factor moves in {where} (headless Chromium)")
    print(f"  slider move -> plot repainted: p50 {statistics.median(times):.0f} ms, "
          f"p90 {times[int(0.9 * (len(times) - 1))]:.0f} ms, min {times[0]:.0f} ms (target p50 <= 300 ms)")


def main():
    from playwright.sync_api import sync_playwright

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    nb.cells = [nbformat.v4.new_code_cell(
        "from ampviz.widgets import ScalerLab\nScalerLab(steps=1_000_000, scenario='spikes', strength=0.5)")]
    notebooks = Path(tempfile.mkdtemp(prefix="ampviz-bench-"))
    nbformat.write(nb, notebooks / "latency.ipynb")
    with sync_playwright() as p:
        browser = conftest.launch(p)
        with conftest.jupyter_lab(notebooks) as url:
            page = conftest.open_and_run(browser, url, "latency.ipynb")
            page.locator(".ampviz-scaler-lab .js-plotly-plot").wait_for(timeout=120_000)
            report("JupyterLab", measure(page))
            page.close()
        with conftest.voila(conftest.ROOT / "notebooks" / "explorer.ipynb") as url:
            page = browser.new_page(viewport={"width": 1300, "height": 1000})
            page.goto(url)
            page.get_by_role("tab", name="Loss scaling").click()
            page.locator(".ampviz-scaler-lab .js-plotly-plot").wait_for(timeout=120_000)
            report("the explorer app (Voila)", measure(page))
            page.close()
        browser.close()


if __name__ == "__main__":
    main()
