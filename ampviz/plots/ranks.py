"""Loss scales across ranks as a figure: ``plot_ranks`` draws each rank's loss scale over the
steps of a ``RanksTrace`` in a lane of its own, with skipped steps, steps taken on inf/NaN and the
step where the ranks' scales first differ (never importing ``ampviz.ranks``, which loads torch)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from ampviz.plots.arguments import _title
from ampviz.plots.axes import _log2_scale, _log2_ticks, _marked_part, _thin
from ampviz.plots.scaling import _scale_steps
from ampviz.plots.style import TRACE_COLORS, _WHITE, _WHITE_AXIS, _figure
from ampviz.plots.text import format_number


#: Marker colours of ``plot_ranks``: a skipped step (vermillion, as overflow) and a step taken on
#: non-finite gradients (reddish purple, as NaN).
RANK_MARK_COLORS = {"skipped": "#D55E00", "nonfinite": "#CC79A7"}
#: At most this many marks of each kind per rank in ``plot_ranks`` (evenly among that rank's steps).
RANK_MARKS = 400
_RANK_POISON_FILL = "rgba(204, 121, 167, 0.15)"  # the lane after a rank's weights went inf/NaN


def _ranks_trace(trace):
    """``trace`` checked to be a ``RanksTrace`` (without importing ``ampviz.ranks``, which loads
    torch: a RanksTrace exists only once that module is loaded)."""
    import sys

    ranks = sys.modules.get("ampviz.ranks")
    if ranks is None or not isinstance(trace, ranks.RanksTrace):
        raise TypeError(f"trace must be a RanksTrace (from ampviz.ranks.simulate_ranks), got {type(trace).__name__}")
    return trace


def plot_ranks(trace, *, title=None) -> go.Figure:
    """Each rank's loss scale over the steps of a ``RanksTrace``, one lane per rank (rank 0 on top).

    Every lane draws its rank's scale as a step line on a log2 axis (ticks at powers of two, the
    same range in every lane, so scales that drift apart are seen apart), with a mark at each step
    that rank skipped (an "x"; its hover says whether the overflow was the rank's own or arrived
    from another rank) and at each step it took on non-finite gradients (a star: its weights are
    inf/NaN from then on, and the rest of its lane is shaded). Where the ranks' scales first
    differ a dotted line crosses every lane. At most ``RANK_MARKS`` marks of each kind per rank,
    evenly among its steps (the legend then says how many are shown). The figure's
    ``layout.meta`` holds the mode, the number of ranks and steps, the first step at which the
    scales differ and the step at which each rank was poisoned (or None).
    """
    from types import SimpleNamespace

    trace = _ranks_trace(trace)
    _title(title)
    n, steps = trace.world_size, trace.steps
    scale = np.asarray(trace.scale, np.float64)
    skipped = np.asarray(trace.found_inf, bool)
    nonfinite = np.asarray(trace.nonfinite_step, bool)
    own = np.asarray(trace.overflow, bool)
    lane_px = 90 if n <= 4 else 64
    top, bottom, gap = 70, 100, 14  # pixels: title, step axis and legend, space between lanes
    plot = n * lane_px + (n - 1) * gap
    height = plot + top + bottom
    ys = [_log2_scale(row) for row in scale]
    finite = np.concatenate([y[np.isfinite(y)] for y in ys]) if steps else np.zeros(0)
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    y_range = [lo - 1.0, hi + 1.0]
    span = y_range[1] - y_range[0]  # a lane is short: at most about 3 ticks, at whole powers of two
    dtick = next((d for d in (1, 2, 4, 5, 10, 20, 25, 50, 100) if span / d <= 3), 200)
    ticks = {**_log2_ticks(y_range), "dtick": dtick}
    data, marks, shapes, notes = [], [], [], []
    layout_axes = {}
    legend_shown = set()
    poisoned = trace.poisoned_at
    divergence = trace.first_divergence
    for r in range(n):
        axis = "y" if r == 0 else f"y{r + 1}"
        name = "yaxis" if r == 0 else f"yaxis{r + 1}"
        top_edge = 1.0 - r * (lane_px + gap) / plot
        domain = [max(top_edge - lane_px / plot, 0.0), min(top_edge, 1.0)]
        layout_axes[name] = {**_WHITE_AXIS, "domain": domain, "range": y_range, "anchor": "x",
                             "title": {"text": f"rank {r}", "font": {"size": 12}}, **ticks}
        if r:
            layout_axes[name]["matches"] = "y"
        idx, sc = _scale_steps(SimpleNamespace(scale=scale[r]))
        data.append({
            "type": "scatter", "x": idx, "y": _log2_scale(sc), "mode": "lines", "yaxis": axis,
            "line": {"shape": "hv", "color": TRACE_COLORS[0], "width": 2},
            "name": "loss scale", "legendgroup": "scale", "showlegend": r == 0,
            "hovertext": [f"rank {r} · step {i:,} · scale {format_number(v)}"
                          for i, v in zip(idx.tolist(), sc.tolist())],
            "hoverinfo": "text", "meta": {"rank": r, "kind": "scale"},
        })
        for kind, flags, symbol, size, label in (
                ("skipped", skipped[r] & ~nonfinite[r], "x", 9, "skipped"),
                ("nonfinite", nonfinite[r], "star", 12, "stepped on inf/NaN (weights poisoned)")):
            at = np.flatnonzero(flags)
            shown = _thin(at, RANK_MARKS)
            if not shown.size:
                continue
            part = _marked_part(shown.size, at.size)
            why = []
            for i in shown.tolist():
                if kind == "nonfinite":
                    why.append("stepped on inf/NaN from another rank" if not own[r, i] else "stepped on inf/NaN")
                elif np.isnan(scale[r, i]):
                    why.append("skipped (the run had ended)")
                else:
                    why.append("skipped: its own overflow" if own[r, i] else "skipped: another rank's overflow")
            marks.append({
                "type": "scatter", "x": shown, "y": _log2_scale(scale[r, shown]), "mode": "markers", "yaxis": axis,
                "marker": {"symbol": symbol, "size": size, "color": RANK_MARK_COLORS[kind],
                           "line": {"width": 1.5, "color": RANK_MARK_COLORS[kind]}},
                "name": label + (f" ({part} shown)" if part else ""), "legendgroup": kind,
                "showlegend": kind not in legend_shown, "cliponaxis": False,
                "hovertext": [f"rank {r} · step {i:,} {w} · scale {format_number(v)}"
                              for i, w, v in zip(shown.tolist(), why, scale[r, shown].tolist())],
                "hoverinfo": "text", "meta": {"rank": r, "kind": kind},
            })
            legend_shown.add(kind)
        if poisoned[r] is not None:
            shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": poisoned[r], "x1": max(steps - 1, 1),
                           "y0": domain[0], "y1": domain[1], "fillcolor": _RANK_POISON_FILL, "line": {"width": 0},
                           "layer": "below"})
            notes.append({"x": 1, "xref": "paper", "y": domain[1], "yref": "paper", "xanchor": "right",
                          "yanchor": "top", "showarrow": False, "font": {"size": 11, "color": "#8B3A62"},
                          "bgcolor": "rgba(255, 255, 255, 0.85)",
                          "text": f"rank {r}: weights inf/NaN from step {poisoned[r]:,}"})
    if divergence is not None:
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": divergence, "x1": divergence,
                       "y0": 0, "y1": 1, "line": {"color": "#555555", "width": 1, "dash": "dot"}})
    agree = "the ranks' scales agree at every step" if divergence is None else \
        f"the ranks' scales differ from step {divergence:,}"
    notes.append({"name": "agreement", "x": 1, "xref": "paper", "y": 1, "yref": "paper", "xanchor": "right",
                  "yanchor": "bottom", "yshift": 4, "showarrow": False, "font": {"size": 12, "color": "#555555"},
                  "text": agree})
    layout = {
        **_WHITE,
        "title": {"text": title or f"Loss scale per rank ({trace.mode}, {n} ranks)", "x": 0.01},
        "height": height,
        "margin": {"l": 80, "r": 20, "t": top, "b": bottom},
        "legend": {"orientation": "h", "x": 0.01, "y": -56 / plot, "yanchor": "top"},  # under the step title
        "xaxis": {**_WHITE_AXIS, "title": {"text": "step"}, "range": [0, max(steps - 1, 1)],
                  "anchor": f"y{n}" if n > 1 else "y"},
        **layout_axes,
        "shapes": shapes, "annotations": notes,
        "meta": {"mode": trace.mode, "ranks": n, "steps": steps, "first_divergence": divergence,
                 "poisoned_at": list(poisoned)},
    }
    return _figure(data + marks, layout)
