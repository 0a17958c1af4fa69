"""What the explorers send less of draws the same pixels: plot_fp8_scaling's step lines through the
ends of each run of one scale (and its lines of every step given as y from x0, dx) render, in
Chromium's plotly, exactly as the same figure with every step's point written out."""

import json
from pathlib import Path

import numpy as np
import plotly

from ampviz.figureview import _ESM, pack
from ampviz.fp8 import simulate_fp8_scaling
from ampviz.plots import plot_fp8_scaling
from ampviz.widgets.fp8_lab import lab_stream

PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"

# FigureView's own decoding of packed arrays (its module's functions up to the plotly.js loader),
# so that the figure is drawn from what the widget would hand plotly
DECODE = _ESM[_ESM.index("const TYPES"):_ESM.index("async function inflate")]
DRAW = """async (figure) => {
  %s
  const div = document.getElementById("g");
  Plotly.purge(div);
  await Plotly.newPlot(div, decode(figure.data), decode(figure.layout), {displayModeBar: false});
}""" % DECODE


def _every_step(fig) -> dict:
    """``fig`` with every line trace written out at every step (x = 0..n-1, "hv" lines held)."""
    n = fig.layout.meta["steps"]
    steps = np.arange(n)
    data = []
    for t in fig.data:
        d = t.to_plotly_json()
        if d.get("mode") == "lines":
            y = np.asarray(d["y"], np.float64)
            if "x" in d:
                x = np.asarray(d["x"], np.int64)
                at = np.searchsorted(x, steps, side="right") - 1
                d["y"] = y[at]
                if "customdata" in d:
                    d["customdata"] = np.asarray(d["customdata"])[at]
            d.pop("x0", None), d.pop("dx", None)
            d["x"] = steps
        data.append(d)
    return {"data": pack(data), "layout": pack(fig.layout.to_plotly_json())}


def test_fp8_step_lines_through_run_ends_draw_the_pixels_of_every_step(browser):
    trace = simulate_fp8_scaling(lab_stream(0, 6, "some"), "delayed", history_len=16)
    fig = plot_fp8_scaling(trace)
    assert len(fig.data[0].x) < trace.steps  # the runs are fewer points than the steps
    sent = {"data": pack(fig.to_plotly_json()["data"]), "layout": pack(fig.to_plotly_json()["layout"])}
    page = browser.new_page(viewport={"width": 1000, "height": 800})
    try:
        page.set_content('<div id="g" style="width:950px"></div>')
        page.add_script_tag(path=str(PLOTLY_JS))
        shots = []
        for figure in (sent, _every_step(fig)):
            page.evaluate(DRAW, json.loads(json.dumps(figure)))
            shots.append(page.locator("#g").screenshot())
        # a plausible wrong rendering (the run ends drawn as a plain line, not "hv") differs
        wrong = json.loads(json.dumps(sent))
        for t in wrong["data"]:
            if t.get("line", {}).get("shape") == "hv":
                t["line"]["shape"] = "linear"
        page.evaluate(DRAW, wrong)
        shots.append(page.locator("#g").screenshot())
    finally:
        page.close()
    assert shots[0] == shots[1]
    assert shots[2] != shots[0]
