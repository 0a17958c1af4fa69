"""Opening the explorer app in Voila: how long until the page shows something, and its first figure.

Serves notebooks/explorer.ipynb with Voila as ``make explorer`` does (the project's voila.json and
page template), opens it LOADS times in headless Chromium (a fresh page each time, a new kernel
each time) and prints the median, from the moment the browser starts to load the page, of:

- first content: the browser's first contentful paint (any text or image, e.g. a loading line);
- app shown: the app's intro text (``.ampviz-explorer-intro``) visible on the page;
- first figure: the first plotly figure (``.js-plotly-plot``) drawn with its data;
- page complete: the browser's load event (every resource the page asked for has arrived);
- figure after content: first figure minus first content, per load.

Target on a 2-core machine: first content within 3 s, and the first figure within 3 s of it. The
baseline, served beside the app and opened in turn with it (so that a busy spell of a shared
machine hits both alike), is a notebook whose one cell shows a short text and a two-point figure:
what Voila, the kernel's start and the widget front end cost before any of the app's own work.
The ratio app / baseline is the number to compare across machines. Every request that leaves this
machine (anything but 127.0.0.1 or localhost) is counted: the page must work offline.

    .venv/bin/python bench/bench_voila_open.py [LOADS]
"""

import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "browser"))
import conftest  # noqa: E402  (the browser tests' Voila and Chromium set-up)

LOADS = 3
LOCAL_HOSTS = {"127.0.0.1", "localhost"}

# Recorded in the page, in ms since navigation start (performance.now()): set once, when first seen.
MARKS = r"""
(() => {
  const t = window.__ampvizOpen = {};
  try {
    new PerformanceObserver((list) => {
      for (const e of list.getEntries()) if (e.name === "first-contentful-paint") t.content = e.startTime;
    }).observe({type: "paint", buffered: true});
  } catch (e) { /* no paint timing: content stays unset */ }
  const shown = (el) => el && el.getClientRects().length > 0 && el.offsetParent !== null;
  const check = () => {
    if (t.app === undefined && shown(document.querySelector(".ampviz-explorer-intro, .bench-baseline-text")))
      t.app = performance.now();
    if (t.figure === undefined) {
      const gd = document.querySelector(".js-plotly-plot");
      if (shown(gd) && gd.data && gd.querySelector(".main-svg")) t.figure = performance.now();
    }
  };
  new MutationObserver(check).observe(document, {subtree: true, childList: true, attributes: true});
  const timer = setInterval(() => {
    check();
    if (t.app !== undefined && t.figure !== undefined) clearInterval(timer);
  }, 20);
  window.addEventListener("load", () => { t.load = performance.now(); });
})();
"""

BASELINE_CELL = """\
import ipywidgets as W
from ampviz.widgets.figureview import FigureView
text = W.HTML("A short text and a two-point figure.")
text.add_class("bench-baseline-text")
W.VBox([text, FigureView({"data": [{"type": "scatter", "x": [0, 1], "y": [0, 1]}], "layout": {"height": 300}})])"""


def open_once(browser, url: str) -> dict:
    """One page load: the marks (ms) and the hosts of requests that left the machine."""
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    outside = []
    page.on("request", lambda r: outside.append(r.url) if urlparse(r.url).hostname not in LOCAL_HOSTS
            and not r.url.startswith(("data:", "blob:")) else None)
    page.add_init_script(MARKS)
    page.goto(url, timeout=conftest.VOILA_LOAD_MS, wait_until="commit")
    page.wait_for_function("() => window.__ampvizOpen && window.__ampvizOpen.app !== undefined"
                           " && window.__ampvizOpen.figure !== undefined", timeout=conftest.VOILA_LOAD_MS,
                           polling=100)
    page.wait_for_load_state("load", timeout=conftest.VOILA_LOAD_MS)
    marks = page.evaluate("() => window.__ampvizOpen")
    page.close()
    time.sleep(1.0)  # let the closed page's kernel shut down before the next load
    return {**marks, "outside": outside}


def measure(browser, notebooks: list, loads: int) -> list:
    """``loads`` page loads of each notebook, served side by side and opened in turn (so that a
    busy spell of the machine hits both alike); one list of loads per notebook."""
    with contextlib.ExitStack() as servers:
        urls = [servers.enter_context(conftest.voila(nb)) for nb in notebooks]
        for url in urls:
            open_once(browser, url)  # warm-up: the OS's file caches, Voila's first template render
        results = [[] for _ in urls]
        for _ in range(loads):
            for url, result in zip(urls, results):
                result.append(open_once(browser, url))
        return results


def median(loads: list, key: str) -> float:
    values = [m[key] for m in loads if m.get(key) is not None]
    return statistics.median(values) if values else float("nan")


def report(what: str, loads: list, baseline: list | None = None) -> None:
    print(f"{what}: median of {len(loads)} loads (ms since the page was requested)")
    for key, name in (("content", "first content"), ("app", "app shown"), ("figure", "first figure"),
                      ("load", "page complete"), ("after", "figure after content")):
        line = f"  {name:20s} {median(loads, key):7.0f} ms   (each: " + \
            ", ".join(f"{m.get(key, float('nan')):.0f}" for m in loads) + ")"
        if baseline:
            line += f"   app / baseline = {median(loads, key) / median(baseline, key):.2f}"
        print(line)
    hosts = sorted({urlparse(u).hostname for m in loads for u in m["outside"]})
    print(f"  requests that left the machine: {sum(len(m['outside']) for m in loads)}"
          + (f" ({', '.join(hosts)})" if hosts else ""))


def main():
    from playwright.sync_api import sync_playwright

    arg = sys.argv[1] if len(sys.argv) > 1 else str(LOADS)
    if not arg.isdigit() or int(arg) < 1:
        sys.exit(f"LOADS must be a whole number of page loads, at least 1, got {arg!r}")
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    nb.cells = [nbformat.v4.new_code_cell(BASELINE_CELL)]
    with tempfile.TemporaryDirectory(prefix="ampviz-bench-") as folder, sync_playwright() as p:
        nbformat.write(nb, Path(folder) / "baseline.ipynb")
        browser = conftest.launch(p)
        baseline, app = measure(browser, [Path(folder) / "baseline.ipynb",
                                          conftest.ROOT / "notebooks" / "explorer.ipynb"], int(arg))
        browser.close()
    for series in (baseline, app):
        for m in series:
            if m.get("figure") is not None and m.get("content") is not None:
                m["after"] = m["figure"] - m["content"]
    report("baseline (a text and a two-point figure, Voila)", baseline)
    report("the explorer app (Voila)", app, baseline)
    print("  target: first content within 3,000 ms, first figure within 3,000 ms of it")


if __name__ == "__main__":
    main()
