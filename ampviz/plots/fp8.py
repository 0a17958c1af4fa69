"""FP8 per-tensor scaling as a figure: ``plot_fp8_scaling`` draws an ``Fp8ScalingTrace`` step by
step: each step's amax against the window the scale in force keeps, the scale itself, and the share
of values saturated, underflowed and subnormal."""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go

from ampviz.plots.arguments import _shown, _title
from ampviz.plots.axes import _changes, _finite_log2, _log2_ticks, _padded_range
from ampviz.plots.style import CATEGORY_COLORS, _LINEAR, _WHITE, _WHITE_AXIS, _figure
from ampviz.plots.text import format_number


#: Colours of ``plot_fp8_scaling``, one per series and no two alike (all from ``ampviz.plots.style``'s
#: palette): the amax (black), the scale (green), the largest magnitude the scale keeps (vermillion,
#: overflow's colour), the underflow boundary below which values become 0 (grey, zero's colour), and
#: the shares saturated (orange), underflowed (blue, underflow's colour, as in the census figures) and
#: subnormal (Paul Tol's olive: not a second blue), and the inf or NaN amaxes (NaN's colour).
FP8_COLORS = {"amax": "#000000", "scale": CATEGORY_COLORS["normal"], "ceiling": CATEGORY_COLORS["overflow"],
              "floor": CATEGORY_COLORS["zero"], "saturated": "#E69F00",
              "underflowed": CATEGORY_COLORS["underflow"], "subnormal": "#999933",
              "nonfinite": CATEGORY_COLORS["nan"]}


def _fp8_trace(trace):
    """``trace`` checked to be an ``Fp8ScalingTrace``."""
    from ampviz.formats.fp8 import Fp8ScalingTrace

    if not isinstance(trace, Fp8ScalingTrace):
        raise TypeError(f"trace must be an Fp8ScalingTrace (from ampviz.formats.fp8.simulate_fp8_scaling), "
                        f"got {type(trace).__name__}")
    return trace


def _run_ends(values) -> np.ndarray:
    """The first and last index of each run of equal ``values`` (NaN equal to NaN), in order: a
    step line ("hv") through these points is the step line through every point."""
    v = np.asarray(values)
    if v.size == 0:
        return np.zeros(0, np.int64)
    change = _changes(v)
    return np.unique(np.concatenate([[0], change - 1, change, [v.size - 1]]))


def _log_percent_or_gap(counts, size: int) -> np.ndarray:
    """log10(100 · counts / size), with 0 as NaN: where a share sits on ``plot_fp8_scaling``'s
    share axis."""
    c = np.asarray(counts, np.float64)
    return np.where(c > 0, np.log10(100.0 * np.where(c > 0, c, 1.0) / size), np.nan)


def _percent_decades(lo: float, hi: float) -> dict:
    """Axis settings for a linear axis of log10(percent) from ``lo`` to ``hi``: a tick at each
    power of ten, labelled in percent as plotly labels a log axis ("0.1", "1", "10", "100")."""
    powers = list(range(math.ceil(lo), math.floor(hi) + 1))
    return {"tickmode": "array", "tickvals": powers, "ticktext": [f"{10.0 ** k:g}" for k in powers]}


_FP8_PANELS = 520  # plot_fp8_scaling's three panels and the gaps between them, in px
_FP8_SHARE_DOMAIN = 0.28  # the share panel's share of them
_LONE_TICK_PX = 5  # a lone step's share is drawn this many px above and below it


def _fp8_lines(trace) -> tuple:
    """log2 of an ``Fp8ScalingTrace``'s amax, max / scale, underflow boundary / scale and scale
    at every step (NaN where not finite)."""
    f = trace.fmt
    scale = np.asarray(trace.scale, np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return (_finite_log2(trace.amax), _finite_log2(f.max / scale), _finite_log2(f.underflow_boundary / scale),
                _finite_log2(scale))


def _fp8_extents(lines) -> tuple:
    """``_fp8_lines``' finite values: the value panel's (amax and both bounds) as one array, and
    the scale's."""
    log_amax, ceiling, floor, log_scale = lines
    values = np.concatenate([v[np.isfinite(v)] for v in (log_amax, ceiling, floor)])
    return values, log_scale[np.isfinite(log_scale)]


def plot_fp8_scaling(trace, *, title=None, legend_counts: bool = True, hold=()) -> go.Figure:
    """An ``Fp8ScalingTrace`` (``ampviz.formats.fp8.simulate_fp8_scaling``) step by step, in three panels.

    Top: log2 of each step's amax, and the window the scale in force keeps: log2(max / scale)
    (the largest magnitude that fits; above it values saturate) and log2(underflow boundary /
    scale) (at or below it nonzero values become 0); a step whose amax is inf or NaN is marked
    at the top of the panel. Middle: log2 of the scale in force (a step line). Bottom: the share
    of each step's values saturated, underflowed and subnormal, in percent on a log scale (``y``
    is log10 of the percent, on a linear axis labelled in percent at each power of ten; a step
    with none leaves a gap; a step with some between two with none is a short vertical tick
    centred on its share, 5 px above and below it: two points of its line at its step, both
    with its count). Hover texts are templates over ``customdata`` (the numbers), not one
    string per step. The step lines of the scale, of max / scale and of the boundary / scale go
    through the first and last step of each run of one scale (drawn "hv": the same line as
    through every step); the lines of every step give ``y`` only, from step 0 one apart (``x0``,
    ``dx``). Every trace carries ``meta["kind"]``; ``layout.meta`` holds the
    recipe, its settings, the format, the steps and values per step, the steps that saturate,
    the worst step and its counts.

    The value and scale axes' ranges are fixed, out to whole ticks; ``hold``: other traces whose
    values they also hold (Fp8ScalingLab passes the runs at its spike slider's ends, so that the
    spike grows against still axes). The shares' legend names say on how many steps each
    happens; ``legend_counts=False`` (Fp8ScalingLab, whose readout has the counts) leaves those
    counts out. A slider move then keeps the layout, and the browser only moves the lines.
    """
    trace = _fp8_trace(trace)
    _title(title)
    if not isinstance(legend_counts, (bool, np.bool_)):
        raise TypeError(f"legend_counts must be True or False, got {_shown(legend_counts)}")
    if not isinstance(hold, (list, tuple)):
        raise TypeError(f"hold must be a list of Fp8ScalingTraces, got {type(hold).__name__}")
    lines = _fp8_lines(trace)
    held = [_fp8_extents(lines)] + [_fp8_extents(_fp8_lines(_fp8_trace(t))) for t in hold]
    f, n, size = trace.fmt, trace.steps, trace.size
    amax = np.asarray(trace.amax, np.float64)
    scale = np.asarray(trace.scale, np.float64)
    log_amax, ceiling, floor, log_scale = lines
    bad = np.flatnonzero(~np.isfinite(amax))
    finite = np.concatenate([values for values, _ in held])
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    # a step below the lowest line and two above the highest (room for the inf/NaN marks), out to
    # whole ticks: the range moves only when the lines cross a tick
    top_ticks = _log2_ticks([lo - 1.0, hi + 2.0])
    top_range = _padded_range([lo - 1.0, hi + 2.0], top_ticks["dtick"])
    # the step lines of the scale (and of max and the underflow boundary over it) through the
    # first and last step of each run of one scale: drawn "hv", the same line as through every
    # step, in a fraction of the points under delayed scaling (46 runs in 2,000 steps at
    # Transformer Engine's defaults); amax's line of every step starts at step 0, one apart (x0,
    # dx), and the share lines keep each run of gaps as its first step (below)
    runs = _run_ends(scale)
    # the lines' points travel as float32: a slider move sends half the bytes of float64, and
    # plotly, drawing at screen resolution, draws the same figure (integers, the steps and the
    # counts, travel in the narrowest type that holds them: FigureView and plotly narrow them)
    ceiling, floor, log_amax, log_scale = (np.asarray(v, np.float32) for v in (ceiling, floor, log_amax, log_scale))
    # hover texts from numbers (a template over customdata: the float32 amaxes and scales, the
    # counts): 2,000 strings per trace made every slider move send and draw 0.6 MB
    data = [
        {"type": "scatter", "x": runs, "y": ceiling[runs], "mode": "lines", "name": "max / scale (above: saturates)",
         "line": {"color": FP8_COLORS["ceiling"], "width": 1.5, "shape": "hv"}, "hoverinfo": "skip",
         "meta": {"kind": "ceiling"}},
        {"type": "scatter", "x": runs, "y": floor[runs], "mode": "lines",
         "name": "underflow boundary / scale (below: becomes 0)",
         "line": {"color": FP8_COLORS["floor"], "width": 1.5, "shape": "hv"}, "hoverinfo": "skip",
         "meta": {"kind": "floor"}},
        {"type": "scatter", "x0": 0, "dx": 1, "y": log_amax, "mode": "lines", "name": "amax",
         "line": {"color": FP8_COLORS["amax"], "width": 1.5}, "customdata": np.asarray(trace.amax, np.float32),
         "hovertemplate": "step %{x:,} · amax %{customdata:.4~g}<extra></extra>",
         "meta": {"kind": "amax"}},
    ]
    if bad.size:
        data.append({"type": "scatter", "x": bad, "y": np.full(bad.size, top_range[1] - 0.5), "mode": "markers",
                     "name": f"amax inf or NaN: {bad.size:,}",
                     "marker": {"symbol": "star", "size": 10, "color": FP8_COLORS["nonfinite"]},
                     "hovertext": [f"step {i:,} · amax {format_number(amax[i])}" for i in bad.tolist()],
                     "hoverinfo": "text", "cliponaxis": False, "meta": {"kind": "nonfinite"}})
    data.append({"type": "scatter", "x": runs, "y": log_scale[runs], "mode": "lines",
                 "name": "scale in force",
                 "yaxis": "y2", "line": {"color": FP8_COLORS["scale"], "width": 2, "shape": "hv"},
                 "customdata": np.asarray(trace.scale, np.float32)[runs],
                 "hovertemplate": "step %{x:,} · scale %{customdata:.4~g}<extra></extra>",
                 "meta": {"kind": "scale"}})
    # down to a power of ten at least half a value below one value's share: every share, and a lone
    # step's tick around it, lies above the lowest labelled tick (a tick below the lowest label read
    # as drawn under the axis)
    share_range = [math.floor(math.log10(50.0 / max(size, 1))) - 0.05, 2.05]
    # a lone step's tick: _LONE_TICK_PX above and below its share, in the share axis's units
    tick = _LONE_TICK_PX * (share_range[1] - share_range[0]) / (_FP8_SHARE_DOMAIN * _FP8_PANELS)
    for kind, counts, label in (("saturated", trace.saturated, "saturated (held at ±max)"),
                                ("underflowed", trace.underflowed, "underflowed (became 0)"),
                                ("subnormal", trace.subnormal, "subnormal")):
        c = np.asarray(counts)
        share = _log_percent_or_gap(c, size).astype(np.float32)
        hover = f"step %{{x:,}} · {kind} %{{customdata:,}} of {size:,}<extra></extra>"
        # a step with none is a gap in its line; a run of such steps travels as its first step
        # alone: plotly draws and hovers the same line, and a slider move has fewer points to send
        # and draw (the saturated line is mostly gaps: 2,000 steps become a few dozen points)
        gap = np.isnan(share)
        kept = np.flatnonzero(~gap | ~np.r_[False, gap[:-1]])
        # a step with some between steps with none has no neighbour to draw a line to: it is
        # drawn as a short vertical tick centred on its share, two points of the same line at
        # its step (a marker trace per kind would cost every move a trace more to draw)
        some = c > 0
        lone = some & ~np.r_[False, some[:-1]] & ~np.r_[some[1:], False]
        points = np.where(lone[kept], 2, 1)
        twice = np.repeat(kept, points)
        y = share[twice]
        first = (np.cumsum(points) - points)[lone[kept]]  # where each lone step's two points begin
        y[first] = np.maximum(y[first] - tick, share_range[0])
        y[first + 1] = np.minimum(y[first + 1] + tick, share_range[1])
        data.append({"type": "scatter", "x": twice, "y": y, "mode": "lines",
                     "name": f"{label}: {int(some.sum()):,} steps" if legend_counts else label, "yaxis": "y3",
                     # saturation comes in lone steps (the spike's): its ticks drawn wider
                     "line": {"color": FP8_COLORS[kind], "width": 2 if kind == "saturated" else 1},
                     "customdata": c[twice], "hovertemplate": hover, "meta": {"kind": kind}})
    worst = trace.worst_step
    settings = ", ".join(f"{k} {v}" for k, v in trace.settings.items() if k != "convention")
    scales = np.concatenate([s for _, s in held])
    scale_ticks = _log2_ticks(scales)
    scale_range = _padded_range(scales, scale_ticks["dtick"])
    layout = {
        **_WHITE,
        "title": {"text": title or f"FP8 {trace.recipe} scaling, {f.name} ({settings})", "x": 0.01},
        "height": 60 + _FP8_PANELS + 110,
        "margin": {"l": 80, "r": 20, "t": 60, "b": 110},
        # under the step axis's numbers and title, at any width (three rows of entries, at 700 px,
        # fit the margin)
        "legend": {"orientation": "h", "x": 0.01, "y": -56 / _FP8_PANELS, "yanchor": "top"},
        # one step axis for the three panels, labelled under the lowest (one axis to lay out and
        # draw at each slider move instead of three matched ones); its range the steps themselves
        # (autoranged, the few markers' padding pushed step 0 away from the panels' left edge)
        "xaxis": {**_WHITE_AXIS, **_LINEAR, "domain": [0, 1], "anchor": "y3", "title": {"text": "step"},
                  "range": [0, max(n - 1, 1)]},
        "yaxis": {**_WHITE_AXIS, **_LINEAR, "domain": [0.55, 1], "range": top_range, "title": {"text": "log2 |x|"},
                  "anchor": "x", **top_ticks},
        "yaxis2": {**_WHITE_AXIS, **_LINEAR, "domain": [0.33, 0.5], "anchor": "x", "title": {"text": "scale"},
                   **scale_ticks, **({"range": scale_range} if scale_range else {})},
        # the shares' log axis drawn as a linear one over log10(percent), labelled as plotly
        # labels a log axis: the same figure, and a points-only move costs plotly about 6 ms less
        "yaxis3": {**_WHITE_AXIS, **_LINEAR, "domain": [0, _FP8_SHARE_DOMAIN], "anchor": "x",
                   "title": {"text": "% of values"},
                   "range": share_range, **_percent_decades(*share_range)},
        "meta": {"recipe": trace.recipe, "settings": dict(trace.settings), "fmt": f.name, "steps": n, "size": size,
                 "saturated_steps": trace.saturated_steps, "worst_step": worst,
                 "worst": {k: int(getattr(trace, k)[worst]) if n else 0
                           for k in ("saturated", "underflowed", "subnormal")}},
    }
    return _figure(data, layout)


def plot_loss_curves(curves: dict, *, title=None) -> go.Figure:
    """Training losses side by side: ``curves`` maps a run's name to its loss per step (a sequence
    of positive numbers); drawn against the step on a log10 loss axis (lesson 14's runs)."""
    if not isinstance(curves, dict) or not curves:
        raise TypeError(f"curves must be a dict of name -> losses per step, not {_shown(curves)}")
    data = []
    for name, losses in curves.items():
        try:
            y = np.asarray(losses, np.float64).reshape(-1)
        except (TypeError, ValueError):
            raise TypeError(f"curves[{name!r}] must be a sequence of numbers, not {_shown(losses)}") from None
        if y.size == 0 or not np.isfinite(y).all() or (y <= 0).any():
            raise ValueError(f"curves[{name!r}] must hold finite losses above 0 (log axis)")
        data.append({"type": "scatter", "mode": "lines", "name": str(name), "x": np.arange(y.size).tolist(),
                     "y": y.tolist()})
    return _figure(data, {"title": {"text": _title(title) or "training loss per step"},
                          "xaxis": {"title": {"text": "step"}, **_LINEAR},
                          "yaxis": {"title": {"text": "loss"}, "type": "log"},
                          "height": 380, "margin": {"t": 50, "b": 40}})
