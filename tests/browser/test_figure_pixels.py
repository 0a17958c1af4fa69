"""What the explorers send less of draws the same pixels: plot_fp8_scaling's step lines through the
ends of each run of one scale, its share lines that send a run of gaps as one point, and its
amax line given as y from x0, dx render, in Chromium's plotly, exactly as the same figure with
every step's point written out; and a move drawn by moving the traces draws what a full redraw
draws."""

import json
import re
from pathlib import Path

import numpy as np
import plotly
import pytest

from ampviz.widgets.figureview import _ESM, _figure_parts, pack
from ampviz.formats.fp8 import simulate_fp8_scaling
from ampviz.plots import plot_fp8_scaling
from ampviz.widgets.fp8_lab import lab_stream

PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"

# FigureView's own decoding of packed arrays (its module's functions up to the plotly.js loader),
# so that the figure is drawn from what the widget would hand plotly; run in a function body, where
# its exports are plain declarations
DECODE = re.sub(r"^export ", "", _ESM[_ESM.index("const TYPES"):_ESM.index("async function inflate")], flags=re.M)
DRAW = """async (figure) => {
  %s
  const div = document.getElementById("g");
  Plotly.purge(div);
  await Plotly.newPlot(div, decode(figure.data), decode(figure.layout), {displayModeBar: false});
}""" % DECODE


def _packed(fig) -> dict:
    """``fig`` as FigureView sends it (its arrays as ``pack`` writes them; not as plotly's
    ``to_plotly_json`` would, whose arrays plotly.js reads but FigureView's test of a move cannot)."""
    data, layout = _figure_parts(fig)
    return json.loads(json.dumps({"data": pack(data), "layout": pack(layout)}))


def _every_step(fig) -> dict:
    """``fig`` with every line trace written out at every step (x = 0..n-1): a line through
    some steps holds each point's value up to the next (an "hv" line's runs; a share line's run
    of gaps, sent as its first step); a lone step's tick (two points at one step) stays two
    points."""
    n = fig.layout.meta["steps"]
    steps = np.arange(n)
    data = []
    for t in fig.data:
        d = t.to_plotly_json()
        if d.get("mode") == "lines":
            y = np.asarray(d["y"], np.float64)
            at = steps
            if "x" in d:
                x = np.asarray(d["x"], np.int64)
                at = np.searchsorted(x, steps, side="right") - 1
                ticked = np.flatnonzero(np.diff(x) == 0)  # a tick's first point; its last is at
                at = np.sort(np.concatenate([at, ticked]))
                d["y"] = y[at]
                if "customdata" in d:
                    d["customdata"] = np.asarray(d["customdata"])[at]
                d["x"] = x[at]
            else:
                d["x"] = steps
            d.pop("x0", None), d.pop("dx", None)
        data.append(d)
    return {"data": pack(data), "layout": pack(fig.layout.to_plotly_json())}


def test_fp8_step_lines_through_run_ends_draw_the_pixels_of_every_step(browser):
    trace = simulate_fp8_scaling(lab_stream(0, 6, "some"), "delayed", history_len=16)
    fig = plot_fp8_scaling(trace)
    assert len(fig.data[0].x) < trace.steps  # the runs are fewer points than the steps
    saturated = [t for t in fig.data if t.meta["kind"] == "saturated"][0]
    assert len(saturated.x) < trace.steps / 10 and np.isnan(saturated.y).any()  # runs of gaps, one point each
    sent = _packed(fig)
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
        # another: the share lines' gaps left out (their lines drawn across the steps with none)
        wrong = {"data": [], "layout": sent["layout"]}
        for t in fig.data:
            d = t.to_plotly_json()
            if d["meta"]["kind"] in ("saturated", "underflowed", "subnormal"):
                y = np.asarray(d["y"], np.float64)
                d["x"], d["y"], d["customdata"] = (np.asarray(d[k])[~np.isnan(y)] for k in ("x", "y", "customdata"))
            wrong["data"].append(d)
        page.evaluate(DRAW, json.loads(json.dumps({"data": pack(wrong["data"]), "layout": wrong["layout"]})))
        shots.append(page.locator("#g").screenshot())
    finally:
        page.close()
    assert shots[0] == shots[1]
    assert shots[2] != shots[0] and shots[3] != shots[0]


# FigureView's drawing of a figure after another (its module's drawFigure), counting which of
# plotly's calls drew it
MOVE = """async ([first, second, sameLayout, fresh]) => {
  %s
  const div = document.getElementById("g");
  const calls = [], typed = [];
  for (const name of ["react", "animate"]) {
    if (!Plotly["__" + name]) Plotly["__" + name] = Plotly[name];
    Plotly[name] = (...a) => {
      calls.push(name);
      // typed arrays in a frame: plotly's animate walks each one's every index as a key
      if (name === "animate") typed.push(a[1].data.flatMap((t) => Object.values(t)).filter((v) => ArrayBuffer.isView(v)).length);
      return Plotly["__" + name](...a);
    };
  }
  Plotly.purge(div);
  let shown = null;
  const config = {displayModeBar: false};
  if (!fresh) {
    shown = await drawFigure(Plotly, div, decode(first.data), decode(first.layout), config, null, false);
    await shown.settled;
  }
  calls.length = 0;
  typed.length = 0;
  // FigureView counts a move drawn a microtask after plotly says it is transitioning: at that
  // moment the traces have not moved yet, a microtask later they have
  const svg = () => Array.from(div.querySelectorAll(".main-svg"), (e) => e.outerHTML).join("");
  const atEvent = {};
  if (!fresh) div.once("plotly_transitioning", () => {  // (a div plotly has not drawn has no events)
    atEvent.now = svg();
    Promise.resolve().then(() => { atEvent.next = svg(); });
  });
  const drawn = await drawFigure(Plotly, div, decode(second.data), decode(second.layout), config, shown, sameLayout);
  // what drawFigure's return shows (FigureView marks the figure drawn then), and what plotly has
  // once its work on the figure has settled: the same
  const atReturn = svg();
  await drawn.settled;
  const final = svg();
  return {calls, typed, moved: drawn.moved, sameAtReturn: atReturn === final,
          listening: div._ev ? div._ev.listeners("plotly_transitioning").length : null,
          atEvent: atEvent.now === undefined ? null : [atEvent.now === final, atEvent.next === final],
          customdata: div._fullData.map((t) => t.customdata ? Array.from(t.customdata) : null),
          points: div.calcdata.map((c) => c.length)};
}""" % DECODE


def _most_moved(a, b) -> int:
    """The index of the trace whose points (y, then x) differ most between figures ``a`` and ``b``."""
    def gap(s, t):
        s, t = np.asarray(s if s is not None else [], np.float64), np.asarray(t if t is not None else [], np.float64)
        return np.inf if s.shape != t.shape else float(np.nansum(np.abs(s - t)))
    return int(np.argmax([gap(s.y, t.y) * 1e6 + gap(s.x, t.x) for s, t in zip(a.data, b.data)]))


def _scaler_figures() -> list:
    from ampviz.widgets import ScalerLab

    lab = ScalerLab(steps=20_000)
    figs = []
    for backoff in (0.5, 0.55, 0.6, 0.65, 0.45, 0.4):
        lab.backoff_slider.value = backoff
        figs.append(lab.figure)
    return figs


def _fp8_figures() -> list:
    from ampviz.widgets import Fp8ScalingLab

    lab = Fp8ScalingLab(history_len=16, spike_log2=4)
    figs = []
    for spike in (4, 5):
        lab.spike_slider.value = spike
        figs.append(lab.figure)
    return figs


def _block_figures() -> list:
    from ampviz.widgets import BlockExplorer

    explorer = BlockExplorer("fp4_e2m1", log2_outlier=8)
    figs = [explorer.figure]
    explorer.outlier_slider.value = 9  # the outlier's block: a new scale, its text and its range
    return figs + [explorer.figure]


def _fp8_filling_figures() -> list:
    """An Fp8ScalingLab move in which the saturated line gets its first lone step's tick (two
    points at one step: the line's points change in number)."""
    from ampviz.widgets import Fp8ScalingLab

    lab = Fp8ScalingLab(history_len=16, margin=-4, spike_log2=3)
    figs = [lab.figure]
    lab.spike_slider.value = 4
    figs.append(lab.figure)
    ticks = [int((np.diff([t for t in f.data if t.meta["kind"] == "saturated"][0].x) == 0).sum()) for f in figs]
    assert ticks[0] == 0 < ticks[1]
    return figs


def _fp8_emptying_figures() -> list:
    """The move above backwards: the saturated line's tick goes."""
    return _fp8_filling_figures()[::-1]


def _format_figures() -> list:
    """FormatExplorer's figure at 0.1 and at 0.2 in fp16: one layout (the zoom is drawn in gaps from
    the stored value), its band bars as they were (drawn opaque: left as drawn), the markers and the
    values written under the zoom's markers moved."""
    from ampviz.plots import plot_value

    figs = [plot_value("fp16", 0.1), plot_value("fp16", 0.2)]
    texts = [[t.text for t in f.data if t.name == "values"] for f in figs]
    assert texts[0] != texts[1]
    return figs


def _range_figures() -> list:
    """A RangeExplorer scale move from 2^-8 to 2^3 over the beam model's gradients: bars change
    bands (the subnormal band's outline and its mark of a bar too short to see fill), every
    count's bar moves."""
    from ampviz.training.beam import gradients
    from ampviz.widgets import RangeExplorer

    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    explorer = RangeExplorer(gradients(0).all, log2_scale=-8, log2_scale_range=(-16, 36))
    figs = [explorer.figure]
    explorer.scale_slider.value = 3
    figs.append(explorer.figure)
    sizes = [{(t.meta["kind"], t.meta.get("band")): len(t.x) for t in f.data} for f in figs]
    assert sizes[0][("bars", "subnormal")] == sizes[0][("few", "subnormal")] == 0
    assert sizes[1][("bars", "subnormal")] > 0 and sizes[1][("few", "subnormal")] > 0
    assert not any(n and not sizes[1][key] for key, n in sizes[0].items())  # nothing empties
    return figs


@pytest.mark.parametrize("figures", [_scaler_figures, _fp8_figures, _block_figures, _fp8_filling_figures,
                                     _fp8_emptying_figures, _range_figures, _format_figures])
def test_a_move_of_points_only_draws_the_pixels_of_a_full_redraw(browser, figures):
    """A ScalerLab, Fp8ScalingLab, BlockExplorer, RangeExplorer or FormatExplorer move that keeps the layout is drawn by moving the traces
    (Plotly.animate, no redraw); the pixels, the hover's numbers and the points plotly holds equal
    a full redraw of the new figure. A move that leaves one trace out (the one whose points change
    most) draws other pixels."""
    from ampviz.widgets.figureview import FigureView

    figs = figures()
    keys = [FigureView.prepare(f).layout_key for f in figs]
    a, b = next((figs[i], figs[j]) for i in range(len(figs)) for j in range(len(figs))
                if i != j and keys[i] == keys[j])
    assert json.dumps(_packed(a)["data"]) != json.dumps(_packed(b)["data"])  # the points did move
    first, second = _packed(a), _packed(b)
    page = browser.new_page(viewport={"width": 1000, "height": 800})
    try:
        page.set_content('<div id="g" style="width:950px"></div>')
        page.add_script_tag(path=str(PLOTLY_JS))
        moved = page.evaluate(MOVE, [first, second, True, False])
        moved_shot = page.locator("#g").screenshot()
        full = page.evaluate(MOVE, [first, second, True, True])
        full_shot = page.locator("#g").screenshot()
        # the layout sent again (a new object): a full redraw
        again = page.evaluate(MOVE, [first, second, False, False])
        # a plausible wrong move: one trace left out of the frame (an index off by one)
        page.evaluate(MOVE, [first, first, True, True])
        page.evaluate("""async ([w, skip]) => { %s
            const div = document.getElementById("g");
            const moved = decode(w.data).map((t) => ({x: t.x, y: t.y})).filter((_, i) => i !== skip);
            const frame = {data: moved, traces: w.data.map((_, i) => i).filter((i) => i !== skip)};
            await Plotly.animate(div, frame, {transition: {duration: 0}, frame: {duration: 0, redraw: false},
                                              mode: "immediate"}); }"""
                      % DECODE, [second, _most_moved(a, b)])
        wrong_shot = page.locator("#g").screenshot()
    finally:
        page.close()
    assert moved["calls"] == ["animate"] and full["calls"] == ["react"] and again["calls"] == ["react"]
    # the frame's points are plain arrays: as typed arrays (as they travel) plotly's animate takes
    # ~13 ms longer a move for Fp8ScalingLab's lines (bench/bench_browser.py)
    assert moved["typed"] == [0]
    assert moved["moved"] and not full["moved"] and not again["moved"]
    assert moved["sameAtReturn"] and full["sameAtReturn"]  # drawn when drawFigure returns
    assert moved["atEvent"] == [False, True]  # (marked at the event itself, it would be too early)
    assert moved["listening"] == 0  # drawFigure leaves no listener behind
    assert moved["customdata"] == full["customdata"] and moved["points"] == full["points"]
    assert moved_shot == full_shot
    assert wrong_shot != full_shot


def test_a_move_that_empties_a_trace_redraws_the_figure(browser):
    """The move above backwards: a trace empties (RangeExplorer's subnormal outline and mark).
    Moved, plotly would leave the emptied trace's last marker drawn; FigureView redraws the
    figure instead, and the pixels are a full redraw's."""
    before, after = _range_figures()
    page = browser.new_page(viewport={"width": 1000, "height": 800})
    try:
        page.set_content('<div id="g" style="width:950px"></div>')
        page.add_script_tag(path=str(PLOTLY_JS))
        moved = page.evaluate(MOVE, [_packed(after), _packed(before), True, False])
        moved_shot = page.locator("#g").screenshot()
        page.evaluate(MOVE, [_packed(after), _packed(before), True, True])
        full_shot = page.locator("#g").screenshot()
    finally:
        page.close()
    assert moved_shot == full_shot
    assert moved["calls"] == ["react"] and not moved["moved"]


POINTS_ONLY = """([before, data, layout, drawn, drawnData]) => { %s
  return pointsOnly({data: before}, data, layout, {layout: drawn, data: drawnData || before}); }""" % DECODE


def test_only_points_on_fixed_axes_take_the_fast_path(browser):
    """FigureView's test for a points-only move: any change but a trace's points and hover values,
    another trace type, an axis without a fixed range or shown at another (zoomed) range, a trace
    hidden from the legend, a trace that empties or fills, or another number of traces takes a
    full redraw. A move moves every trace (plotly's animate takes away those it is not given): a
    bar whose points stay may be among them where a move draws it as a full redraw does (an opaque
    colour, no outline); one whose points change takes a full redraw."""
    line = {"type": "scatter", "x": [0, 1], "y": [1, 2], "name": "a", "customdata": [1, 2]}
    bar = {"type": "bar", "x": [0, 1], "y": [1, 2], "name": "b", "opacity": 0.85,
           "marker": {"color": "#009E73", "line": {"width": 0}, "pattern": {"shape": [""]}}}
    fixed = {"xaxis": {"range": [0, 1]}, "yaxis": {"range": [0, 3]}, "yaxis2": {"range": [0, 1]}}
    matched = {**fixed, "xaxis2": {"range": [0, 1], "matches": "x"}}
    cases = [
        ([line], [{**line, "y": [2, 1], "x": [0, 0.5, 1], "customdata": [3, 4]}], fixed, True),
        ([line], [{**line, "y": [2, 1], "name": "b"}], fixed, False),  # the legend would change
        ([line], [{**line, "line": {"width": 3}}], fixed, False),  # a style
        ([line], [{k: v for k, v in line.items() if k != "customdata"}], fixed, False),  # hover values dropped
        ([line], [line, line], fixed, False),
        ([{**line, "type": "bar"}], [{**line, "type": "bar", "y": [2, 1]}], fixed, False),
        # a bar trace that shows nothing (the census's hover): no pixel of it to round
        ([{**line, "type": "bar", "opacity": 0}], [{**line, "type": "bar", "opacity": 0, "y": [2, 1]}], fixed, True),
        ([{**line, "type": "bar", "opacity": 0.5}], [{**line, "type": "bar", "opacity": 0.5, "y": [2, 1]}], fixed,
         False),
        ([line], [{**line, "y": [2, 1]}], {**fixed, "yaxis": {}}, False),  # autoranged
        ([line], [{**line, "y": [2, 1]}], {**fixed, "yaxis": {"range": [0, 3], "autorange": True}}, False),
        ([{**line, "yaxis": "y2"}], [{**line, "yaxis": "y2", "y": [0.5, 0.2]}], fixed, True),
        ([{**line, "yaxis": "y2"}], [{**line, "yaxis": "y2", "y": [0.5, 0.2]}], {**fixed, "yaxis2": {}}, False),
        # an axis that matches another: fixed when that one is, over the same range
        ([{**line, "xaxis": "x2"}], [{**line, "xaxis": "x2", "y": [2, 1]}], matched, True),
        ([{**line, "xaxis": "x2"}], [{**line, "xaxis": "x2", "y": [2, 1]}],
         {**matched, "xaxis2": {"range": [0, 2], "matches": "x"}}, False),
        ([{**line, "xaxis": "x2"}], [{**line, "xaxis": "x2", "y": [2, 1]}], {**matched, "xaxis": {}}, False),
        # a trace that empties or fills: its legend entry comes or goes
        ([line], [{**line, "x": [], "y": [], "customdata": []}], fixed, False),
        ([{**line, "x": [], "y": [], "customdata": []}], [line], fixed, False),
        ([{**line, "x": [], "y": [], "customdata": [], "showlegend": False}], [{**line, "showlegend": False}], fixed,
         True),  # not in the legend
        # emptied, even out of the legend: plotly would leave its last markers drawn
        ([{**line, "showlegend": False}], [{**line, "x": [], "y": [], "customdata": [], "showlegend": False}], fixed,
         False),
        ([{**line, "text": ["a", "b"]}], [{**line, "text": ["c", "d"], "y": [2, 1]}], fixed, True),  # a text trace's texts
        # a bar drawn opaque that stays beside a line that moves: only the line is moved
        ([bar, line], [bar, {**line, "y": [2, 1]}], fixed, [0, 1]),
        ([bar, line], [{**bar, "x": [1, 0]}, {**line, "y": [2, 1]}], fixed, False),
        ([bar, line], [bar, line], fixed, []),  # nothing to move
        # a bar whose edges a full redraw rounds to whole pixels: a translucent colour, an outline
        ([{**bar, "marker": {"color": "rgba(0,0,0,0.5)", "line": {"width": 0}}}, line],
         [{**bar, "marker": {"color": "rgba(0,0,0,0.5)", "line": {"width": 0}}}, {**line, "y": [2, 1]}], fixed, False),
        ([{**bar, "marker": {"color": "#000000", "line": {"width": 1}}}, line],
         [{**bar, "marker": {"color": "#000000", "line": {"width": 1}}}, {**line, "y": [2, 1]}], fixed, False),
        # hatched (fp8_e4m3's overflow band, which saturates): a move lays the pattern otherwise
        ([{**bar, "marker": {"color": "#000000", "line": {"width": 0}, "pattern": {"shape": ["/"]}}}, line],
         [{**bar, "marker": {"color": "#000000", "line": {"width": 0}, "pattern": {"shape": ["/"]}}},
          {**line, "y": [2, 1]}], fixed, False),
    ]
    zoomed = {**fixed, "xaxis": {"range": [0.2, 0.6]}}  # as plotly holds it after a zoom
    cases = [(before, data, layout, {**fixed, **matched}, None, [0] if want is True else want)
             for before, data, layout, want in cases] + [
        ([line], [{**line, "y": [2, 1]}], fixed, zoomed, None, False),
        ([line], [{**line, "y": [2, 1]}], fixed, fixed, [{**line, "visible": "legendonly"}], False)]
    page = browser.new_page()
    try:
        got = [page.evaluate(POINTS_ONLY, [before, data, layout, drawn, drawn_data])
               for before, data, layout, drawn, drawn_data, _ in cases]
    finally:
        page.close()
    assert got == [want for *_, want in cases]
