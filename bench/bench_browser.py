"""Browser latency: from a control moved to its figure repainted, in Chromium, against a floor.

The floor is the front end's own round trip, measured in the same page: a bare plotly
``go.FigureWidget`` whose slider assigns two points to its trace (key -> widget message -> kernel ->
figure message -> plotly redraws). Every explorer is timed the same way in the same page, its moves
interleaved with the floor's so that a busy machine slows both alike:

- ``ScalerLab(steps=1_000_000)``: a press of the backoff slider's arrow key (a new position each
  time: nothing can come from a cache);
- ``RangeExplorer`` over the beam model's 84,608 gradients (notebook 02's): the scale slider;
- ``FormatExplorer``: a mantissa bit's button pressed with the keyboard (focus, then Enter: the
  same click event as the mouse's; Playwright's ``click`` first waits for the button to stand still
  over two animation frames, which would add ~30 ms that no learner's click has);
- ``BlockExplorer`` (MXFP4): the outlier's log2 slider, from 0 up (24 new positions);
- ``Fp8ScalingLab`` (delayed scaling, 2,000 tensors of 4,096 values): the spike size's slider, from
  2^0 up (16 new positions: at most 15 moves after the warm-up one).

In the explorer app both labs start mid-way along those sliders (2^8); before it is timed, each is
sent to its slider's start with the Home key, so that it has as many new positions as in the
notebook.

A move is timed from its key press to its repaint. Before the clock starts, the control is brought
to the top of the view, with what it redraws below it in view as a learner sees it, and focused.
Until 2026-11-27 the focus was timed, and focusing scrolled the page to the control (in JupyterLab
across the notebook between the floor's cell and the explorer's, about 75 ms a move, the floor's
too). Focusing alone, untimed, then left each control wherever focusing had scrolled it: often at
the view's bottom edge, its own figure mostly out of view and the explorer above it in view, and
the same move cost more at some places in the page than at others (two identical BlockExplorers,
one below the other in one JupyterLab page, gave 1.55 and 1.06 times the floor).
A move counts as repainted when the explorer's figure in the page has drawn the new state
(``FigureView`` marks each drawn revision; the floor's trace holds its new point). Measured in
JupyterLab, in Voila (the same notebook), in the explorer app (``ExplorerApp``, a page of its own
with the floor beside it, as Voila serves it), and in the explorer app while its Live training tab
trains a long run (there also: how soon the Pause and Resume presses show on the button). Prints
p50 and p90 per explorer and the ratio of p50s to the floor's, and how long plotly took to draw
each figure in the page, the floor's too (what separates an explorer from the floor: the round
trip through the kernel is the same). Target: every ratio <= 1.3.

    .venv/bin/python bench/bench_browser.py [--moves N]
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "browser"))
import conftest  # noqa: E402  (the browser tests' JupyterLab, Voila and Chromium set-up)

TARGET = 1.3

FLOOR_CELL = """
import ipywidgets as W, plotly.graph_objects as go
floor_figure = go.FigureWidget(go.Scatter(x=[0, 1], y=[0, 0.5]), layout=dict(height=300))
# 500 positions to the right: enough for every tab of the app at the default moves (a floor
# whose slider reached its end would never repaint)
floor_slider = W.FloatSlider(value=0.5, min=0, max=1, step=0.001)
floor_slider.add_class("bench-floor-slider")
def _floor_move(change):
    floor_figure.data[0].y = [0, change["new"]]
floor_slider.observe(_floor_move, names="value")
floor = W.VBox([floor_slider, floor_figure]); floor.add_class("bench-floor")
floor
"""
EXPLORER_CELLS = [
    "import torch\n_ = torch.manual_seed(0)\ntorch.set_num_threads(1)\n"
    "from ampviz.training.beam import gradients\nfrom ampviz.widgets import FormatExplorer, RangeExplorer, ScalerLab\n"
    "grads = gradients(0).all",
    "ScalerLab(steps=1_000_000, scenario='spikes', strength=0.5, gradients=grads)",
    "RangeExplorer(grads, log2_scale=0, log2_scale_range=(-16, 36))",
    "FormatExplorer('fp16', 0.1)",
    "from ampviz.widgets import BlockExplorer, Fp8ScalingLab\nBlockExplorer('fp4_e2m1', log2_outlier=0)",
    "Fp8ScalingLab(history_len=16, spike_log2=0)",
]
APP_CELL = "from ampviz.widgets import ExplorerApp\nExplorerApp()"

# What each explorer's move is, and how the page shows it repainted.
REVISION = """() => {{ const el = document.querySelector('{root} .ampviz-figure-view .js-plotly-plot');
    return el ? el.dataset.revision || null : null; }}"""
# how long plotly took to draw the explorer's figure (FigureView marks it beside the revision)
DRAW_MS = """() => {{ const el = document.querySelector('{root} .ampviz-figure-view .js-plotly-plot');
    return el && el.dataset.drawMs ? Number(el.dataset.drawMs) : null; }}"""
# whether FigureView drew that move by moving the traces ("moving") or by a full redraw
DRAWN_BY = """() => {{ const el = document.querySelector('{root} .ampviz-figure-view .js-plotly-plot');
    return el ? el.dataset.drawnBy || null : null; }}"""
# the floor's plot, from plotly's own events around it (the handler returns nothing: false would
# cancel the plot)
FLOOR_TIMER = """() => { const gd = document.querySelector('.bench-floor .js-plotly-plot');
    if (gd.__benchTimed) return; gd.__benchTimed = true;
    gd.on('plotly_beforeplot', () => { gd.__benchStart = performance.now(); });
    gd.on('plotly_afterplot', () => { if (gd.__benchStart !== undefined)
        gd.dataset.drawMs = (performance.now() - gd.__benchStart).toFixed(1); }); }"""
FLOOR_DRAW_MS = """() => { const gd = document.querySelector('.bench-floor .js-plotly-plot');
    return gd && gd.dataset.drawMs ? Number(gd.dataset.drawMs) : null; }"""
FLOOR_Y = """() => { const gd = document.querySelector('.bench-floor .js-plotly-plot');
    return gd && gd.data && gd.data[0] ? JSON.stringify(gd.data[0].y) : null; }"""
# a control brought to the top of the view (the notebook's scroller or the page's): what it redraws,
# below it, is in view, and every move of that control starts from the same scroll position
SCROLL = "(e) => e.scrollIntoView({block: 'start', inline: 'nearest'})"
# two animation frames: the page has drawn what came before
SETTLED = "() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))"
EXPLORERS = {
    # name: (root CSS class, what moves it)
    "ScalerLab, 1,000,000 steps (backoff slider)": (".ampviz-scaler-lab", ("slider", "ampviz-scaler-backoff")),
    "RangeExplorer, 84,608 gradients (scale slider)": (".ampviz-range-explorer", ("slider", "ampviz-scale-slider")),
    "FormatExplorer (a bit pressed)": (".ampviz-format-explorer", ("key", ".ampviz-bit-0")),
    "BlockExplorer, MXFP4 (outlier slider)": (".ampviz-block-explorer", ("slider", "ampviz-blocks-outlier")),
    "Fp8ScalingLab, 2,000 tensors of 4,096 values (spike slider)": (".ampviz-fp8-lab",
                                                                    ("slider", "ampviz-fp8-spike", 16)),
}
# The explorer app's tabs (one page each is measured against the floor): its two labs start
# mid-way along these sliders (2^8); the Home key sends each to the slider's start first (untimed),
# where the notebook's start.
APP_EXPLORERS = {
    **{name: EXPLORERS[name] for name in list(EXPLORERS)[:3]},
    "Fp8ScalingLab in the app (spike slider, from 2^0 after Home)": (".ampviz-fp8-lab",
                                                                     ("slider", "ampviz-fp8-spike", 16, "Home")),
    "BlockExplorer in the app (outlier slider, from 2^0 after Home)": (".ampviz-block-explorer",
                                                                       ("slider", "ampviz-blocks-outlier", None,
                                                                        "Home")),
}


class Mover:
    """One control in the page and how to tell its figure has repainted."""

    def __init__(self, page, name, root, action):
        self.page, self.name, self.root = page, name, root
        kind, target = action[:2]
        self.limit = action[2] if len(action) > 2 else None  # new positions the slider has
        self.start = action[3] if len(action) > 3 else None  # a key that sends the slider to its start
        scope = page.locator(root).first if root else page
        if kind == "slider":
            self.handle = scope.locator(f".{target} .noUi-handle").first
            self.control = self.handle
            self.press = lambda: self.handle.press("ArrowRight")
        else:
            self.control = button = scope.locator(target).first
            self.press = lambda: button.press("Enter")
        self.js = FLOOR_Y if root is None else REVISION.format(root=root)
        self.draw_js = FLOOR_DRAW_MS if root is None else DRAW_MS.format(root=root)
        self.times: list = []
        self.draws: list = []  # plotly's draw of each move, in the page (explorers only)
        self.moved: list = []  # whether each move was drawn by moving the traces (explorers only)

    def ready(self):
        self.page.wait_for_function(f"() => ({self.js})() !== null", timeout=180_000)
        if self.start:  # to the slider's start, untimed, once its figure shows that position
            before = self.page.evaluate(self.js)
            self.handle.focus()
            self.handle.press(self.start)
            self.page.wait_for_function(f"(prev) => ({self.js})() !== prev", arg=before, timeout=60_000)
        if self.root is None:
            self.page.evaluate(FLOOR_TIMER)

    def move(self):
        before = self.page.evaluate(self.js)
        # in view and focused before the clock starts, the control at the top of the view and what
        # it redraws below it, as a learner sees it while moving it (scrolling there, across the
        # notebook between the floor's cell and the explorer's in JupyterLab, ~75 ms a move, is no
        # part of its round trip)
        self.control.evaluate(SCROLL)
        self.control.focus()
        self.page.evaluate(SETTLED)
        t0 = time.perf_counter()
        self.press()
        try:
            self.page.wait_for_function(f"(prev) => {{ const s = ({self.js})(); return s !== null && s !== prev; }}",
                                        arg=before, timeout=60_000, polling="raf")
        except Exception as exc:
            raise RuntimeError(f"{self.name}: no repaint within 60 s of a move ({type(exc).__name__})") from None
        self.times.append(1e3 * (time.perf_counter() - t0))
        self.draws.append(self.page.evaluate(self.draw_js))
        if self.root is not None:
            self.moved.append(self.page.evaluate(DRAWN_BY.format(root=self.root)) == "moving")
        self.page.wait_for_timeout(150)  # let the kernel go idle before the next move


def run_page(page, explorers: dict, moves: int) -> tuple:
    floor = Mover(page, "floor", None, ("slider", "bench-floor-slider"))
    others = [Mover(page, name, root, action) for name, (root, action) in explorers.items()]
    for m in [floor, *others]:
        m.ready()
    for m in [floor, *others]:  # one warm-up move each (plotly's first restyle, caches of the page)
        m.move()
        m.times.clear()
        m.draws.clear()
        m.moved.clear()
    for k in range(moves):  # interleaved: a busy moment slows every control alike
        for m in [floor, *others]:
            if m.limit is None or k < m.limit - 1:  # the warm-up move took the first
                m.move()
    return floor, others


def _drawn(m) -> str:
    draws = [d for d in m.draws if d is not None]
    moved = f"; {sum(m.moved)} of {len(m.moved)} moves drew by moving the traces" if m.moved else ""
    return f" (plotly's draw in the page p50 {statistics.median(draws):.0f} ms{moved})" if draws else ""


def report(where: str, floor, others: list) -> list:
    f50 = statistics.median(floor.times)
    print(f"{where} (headless Chromium), {len(floor.times)} moves each, interleaved")
    print(f"  floor (a FigureWidget whose slider assigns two points): p50 {f50:.0f} ms, "
          f"p90 {sorted(floor.times)[int(0.9 * (len(floor.times) - 1))]:.0f} ms{_drawn(floor)}")
    ratios = []
    for m in others:
        t = sorted(m.times)
        p50 = statistics.median(t)
        ratio = p50 / f50
        ratios.append(ratio)
        fewer = f" ({len(t)} moves)" if len(t) != len(floor.times) else ""
        print(f"  {m.name}{fewer}: p50 {p50:.0f} ms, p90 {t[int(0.9 * (len(t) - 1))]:.0f} ms{_drawn(m)}, "
              f"ratio to the floor {ratio:.2f} ({'within' if ratio <= TARGET else 'ABOVE'} {TARGET}x)")
    return ratios


def while_training(page, moves: int) -> list:
    """The explorer app while its Live training tab trains (the beam model, three modes, a run
    long enough to outlast the measurement): Pause and Resume until the button shows the new
    state, then the Ranges and Loss scaling tabs' moves against the floor, as above."""
    page.get_by_role("tab", name="Live training").click()
    live = page.locator(".ampviz-live-trainer").first
    live.wait_for(timeout=180_000)
    steps = live.locator(".ampviz-live-steps input").first
    steps.fill("100000")
    steps.press("Enter")
    live.locator(".ampviz-live-start").first.click()
    page.wait_for_function("() => /running/.test(document.querySelector('.ampviz-live-status').innerText)",
                           timeout=120_000)
    page.wait_for_timeout(2000)  # the run under way, drawing as it goes
    button = live.locator(".ampviz-live-pause").first
    shown = []
    for _ in range(moves):
        for expect in ("Resume", "Pause"):
            button.focus()
            page.evaluate(SETTLED)
            t0 = time.perf_counter()
            button.press("Enter")
            page.wait_for_function(f"() => document.querySelector('.ampviz-live-pause').innerText.includes('{expect}')",
                                   timeout=60_000, polling="raf")
            shown.append(1e3 * (time.perf_counter() - t0))
            page.wait_for_timeout(300)
    print(f"the explorer app while Live training trains: Pause/Resume shown after p50 "
          f"{statistics.median(shown):.0f} ms, p90 {sorted(shown)[int(0.9 * (len(shown) - 1))]:.0f} ms "
          f"({len(shown)} presses)")
    ratios = []
    tabs = {"Ranges": "RangeExplorer, 84,608 gradients (scale slider)",
            "Loss scaling": "ScalerLab, 1,000,000 steps (backoff slider)"}
    for tab, name in tabs.items():
        page.get_by_role("tab", name=tab).click()
        ratios += report(f"the explorer app while Live training trains, {tab} tab",
                         *run_page(page, {name: EXPLORERS[name]}, moves))
    status = page.evaluate("() => document.querySelector('.ampviz-live-status').innerText")
    print(f"  (the live run at the end: {status})")
    return ratios


def open_voila(browser, url):
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    page.goto(url, timeout=conftest.VOILA_LOAD_MS)
    return page


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--moves", type=int, default=20, help="moves per control (default 20)")
    parser.add_argument("--where", default="lab,voila,app,training",
                        help="front ends to measure, of lab, voila, app, training (the explorer app while "
                             "its Live training tab trains; default all four)")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    folder = Path(tempfile.mkdtemp(prefix="ampviz-bench-"))
    conftest.write_notebook(folder / "latency.ipynb", (FLOOR_CELL, *EXPLORER_CELLS))
    conftest.write_notebook(folder / "app_latency.ipynb", (FLOOR_CELL, APP_CELL))
    all_ratios = []
    with sync_playwright() as p:
        browser = conftest.launch(p)
        where = set(args.where.split(","))
        if "lab" in where:
            with conftest.jupyter_lab(folder) as url:
                page = conftest.open_and_run(browser, url, "latency.ipynb")
                all_ratios += report("JupyterLab", *run_page(page, EXPLORERS, args.moves))
                page.close()
        if "voila" in where:
            with conftest.voila(folder / "latency.ipynb") as url:
                page = open_voila(browser, url)
                all_ratios += report("Voila, the same notebook", *run_page(page, EXPLORERS, args.moves))
                page.close()
        if "training" in where:
            with conftest.voila(folder / "app_latency.ipynb") as url:
                page = open_voila(browser, url)
                all_ratios += while_training(page, args.moves)
                page.close()
        if "app" in where:
            with conftest.voila(folder / "app_latency.ipynb") as url:
                page = open_voila(browser, url)
                tabs = {"Formats": "FormatExplorer (a bit pressed)",
                        "Ranges": "RangeExplorer, 84,608 gradients (scale slider)",
                        "Loss scaling": "ScalerLab, 1,000,000 steps (backoff slider)",
                        "FP8 scaling": "Fp8ScalingLab in the app (spike slider, from 2^0 after Home)",
                        "Block scaling": "BlockExplorer in the app (outlier slider, from 2^0 after Home)"}
                for tab, name in tabs.items():  # each tab against the floor measured beside it
                    page.get_by_role("tab", name=tab).click()
                    all_ratios += report(f"the explorer app (Voila), {tab} tab",
                                         *run_page(page, {name: APP_EXPLORERS[name]}, args.moves))
                page.close()
        browser.close()
    worst = max(all_ratios)
    print(f"worst ratio to the floor: {worst:.2f} (target <= {TARGET})")


if __name__ == "__main__":
    main()
