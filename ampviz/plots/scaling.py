"""Loss-scale traces as a figure: ``plot_scale_trace`` draws one or more ``ScalerTrace``s' scale
over the steps (a step line through the steps where it changes, at screen resolution for long
runs), their skipped steps in lanes above, and optionally the share of gradients lost."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from ampviz.plots.arguments import _shown, _title
from ampviz.plots.axes import _changes, _log2_scale, _log2_ticks, _marked_part, _padded_range, _share_top, _thin
from ampviz.plots.style import TRACE_COLORS, _LINEAR, _WHITE, _WHITE_AXIS, _figure, scaler_colors


#: A scale line with more change points than this is drawn at screen resolution (``_scale_steps``).
LINE_POINTS = 4000


def _template_text(text: str) -> str:
    """``text`` as literal text in a plotly hovertemplate: "%{" would start a placeholder there."""
    return str(text).replace("%{", "%\u200b{")


def _scale_steps(trace, most: int = LINE_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """The steps where the scale changes (plus the first and last): a step plot of a 1M-step
    trace needs only these, never every step. Where the scale changes at more than ``most``
    steps (a growth interval of 1 changes it at every step), the steps are cut into ``most // 4``
    equal groups, narrower than a pixel, and each group keeps its first and last change and the
    changes to its lowest and highest scale: the line has the same envelope at every screen
    width, every point drawn is a real step, and between groups the line is exact."""
    s = np.asarray(trace.scale, dtype=np.float64)
    if s.size == 0:
        return np.zeros(0, np.int64), np.zeros(0)
    idx = np.concatenate([[0], _changes(s), [s.size - 1]])
    if idx.size > most:
        idx = _envelope(idx, _log2_scale(s[idx]), s.size, max(most // 4, 1))
    return idx, s[idx]


def _envelope(idx: np.ndarray, y: np.ndarray, n: int, groups: int) -> np.ndarray:
    """Of the points (idx, y), sorted by idx < n: per group of n / ``groups`` steps, the first,
    the last, the first lowest and the first highest y (NaN is never lowest or highest)."""
    group = idx * groups // n
    starts = np.flatnonzero(np.diff(group, prepend=-1))
    ends = np.append(starts[1:], idx.size) - 1
    counts = ends - starts + 1
    keep = [starts, ends]
    for reduce in (np.fmin, np.fmax):
        with np.errstate(invalid="ignore"):
            target = np.repeat(reduce.reduceat(y, starts), counts)
        hit = np.flatnonzero(y == target)
        keep.append(hit[np.diff(group[hit], prepend=-1) != 0])  # the first hit in each group
    return idx[np.unique(np.concatenate(keep))]


#: Line styles of overlaid scalers, in order: each later line narrower and dashed differently, and
#: drawn on top, so that scalers whose scales coincide all stay visible.
TRACE_DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
#: The height in pixels of each scaler's lane of skipped steps in ``plot_scale_trace``.
_LANE_PX = 14


def _line_width(k: int, n: int) -> float:
    """Width of the k-th of n overlaid scale lines: 2 alone; else 0.8 wider than the next one,
    down to 1.5 for the last (at most 3.9)."""
    return 2.0 if n == 1 else 1.5 + min(n - 1 - k, 3) * 0.8


def _skipped_marks(trace, most: int) -> tuple:
    """A ``ScalerTrace``'s skipped steps (none after a stop), the ones marked (at most ``most``,
    evenly among them) and how many are marked, in words ("" when all are)."""
    end = trace.steps if trace.stopped_at is None else trace.stopped_at + 1  # no step runs after a stop
    skipped = np.flatnonzero(trace.skipped[:end])
    shown = _thin(skipped, most)
    return skipped, shown, _marked_part(shown.size, skipped.size)


def _scaler_traces(traces) -> list:
    from ampviz.scaling import ScalerTrace

    traces = list(traces) if isinstance(traces, (list, tuple)) else [traces]
    bad = [t for t in traces if not isinstance(t, ScalerTrace)]
    if bad or not traces:
        raise TypeError("traces must be a ScalerTrace or a list of them (from ampviz.scaling.simulate), got "
                        + (type(bad[0]).__name__ if bad else "none"))
    return traces


def plot_scale_trace(traces, *, title=None, lost=None, max_markers: int = 60,
                     legend_counts: bool = True) -> go.Figure:
    """log2(scale) over steps for one or more ``ScalerTrace``s, with their skipped steps.

    The scale is drawn as a step line through the steps where it changes; a trace that changes
    at more than ``LINE_POINTS`` steps is drawn at screen resolution (each group of steps
    narrower than a pixel keeps its first, last, lowest and highest scale), so a figure of a
    million steps sends a few thousand points per trace whatever the settings. Overlaid scalers
    differ in colour, line width and dash (``TRACE_DASHES``: each later line narrower, drawn on
    top), so scales that coincide all stay visible. A preset (``ampviz.scaling.PRESETS``) is drawn
    in its own colour (``PRESET_COLORS``) whatever is drawn with it; other scalers take the
    colours no preset in the figure has (``scaler_colors``). The skipped steps are marked in a strip above
    the scale panel, one lane per scaler (the marks never cover the lines or each other), thinned
    to ``max_markers`` per scaler, evenly among its skipped steps so that dense stretches stay
    dense (the scaler's name then says "1 in N marked"). A scale of exactly 0 is drawn at
    2^-150; a stopped run ends its line and gets a dashed marker. ``lost``: optional dict name ->
    (steps, shares) drawn in a lower panel, e.g. the share of gradients lost to underflow at each
    step's scale; the panels share the step axis, labelled under the lowest one.

    ``legend_counts=False`` leaves the counts out of the legend (each scaler's line is then named
    by the scaler alone; ScalerLab's readout shows the counts): every slider move then keeps the
    figure's names and layout, and the browser only moves its lines and marks. The axes' ranges
    are fixed (to the next tick beyond the values; the lost share to 1, 2 or 5 × 10^k %) for
    the same reason.
    """
    traces = _scaler_traces(traces)
    if not isinstance(legend_counts, (bool, np.bool_)):
        raise TypeError(f"legend_counts must be True or False, got {_shown(legend_counts)}")
    _title(title)
    if isinstance(max_markers, bool) or not isinstance(max_markers, (int, np.integer)) or max_markers < 1:
        raise ValueError(f"max_markers must be a whole number >= 1, got {_shown(max_markers)}")
    if lost is not None and not isinstance(lost, dict):
        raise TypeError(f"lost must be a dict name -> (steps, shares), got {type(lost).__name__}")
    rows = 2 if lost else 1
    data, markers, shapes, notes, ys = [], [], [], [], []
    # a preset keeps its own colour whatever is drawn with it (``PRESET_COLORS``)
    colors = scaler_colors(t.policy.name for t in traces)
    for k, t in enumerate(traces):
        color = colors[k]
        idx, sc = _scale_steps(t)
        name = t.policy.name
        y = _log2_scale(sc)
        ys.append(y)
        _, shown, part = _skipped_marks(t, max_markers)
        thinned = f" ({part} marked)" if part else ""
        data.append({
            "type": "scatter", "x": idx, "y": y, "mode": "lines",
            "line": {"shape": "hv", "color": color, "width": _line_width(k, len(traces)),
                     "dash": TRACE_DASHES[k % len(TRACE_DASHES)]},
            "name": f"{name}: {t.skipped_count:,} skipped{thinned}" if legend_counts else name,
            "legendgroup": name,
            # hover texts from numbers (a template over the scales): a string per point made a
            # slider move send 40 KB of text at a million steps
            "customdata": np.asarray(sc, np.float64),
            "hovertemplate": f"{_template_text(name)} · step %{{x:,}} · scale %{{customdata:,.6~g}}<extra></extra>",
            "meta": {"policy": name, "kind": "scale"},
        })
        if shown.size:
            scale_at = np.asarray(t.scale, np.float64)[shown]
            markers.append({
                "type": "scatter", "x": shown, "y": np.full(shown.size, k, dtype=np.float64), "mode": "markers",
                "marker": {"symbol": "line-ns-open", "size": 11, "color": color,
                           "line": {"width": 1.5, "color": color}},
                "name": f"{name}: skipped" + (f" ({part} shown)" if part and legend_counts else ""),
                "legendgroup": name, "showlegend": False, "yaxis": "y3", "cliponaxis": False,
                "customdata": scale_at,
                "hovertemplate": f"{_template_text(name)} · step %{{x:,}} skipped · scale %{{customdata:,.6~g}}"
                                 "<extra></extra>",
                "meta": {"policy": name, "kind": "skipped"},
            })
        if t.stopped_at is not None:
            shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": t.stopped_at,
                           "x1": t.stopped_at, "y0": 0, "y1": 1, "line": {"color": color, "dash": "dash"}})
            notes.append({"x": t.stopped_at, "xref": "x", "y": 1, "yref": "paper", "showarrow": False,
                          "xanchor": "right", "yanchor": "bottom", "text": f"{name} stopped",
                          "font": {"color": color}})
    data += markers
    color_of = {t.policy.name: c for t, c in zip(traces, colors)}
    for k, (name, (steps, shares)) in enumerate((lost or {}).items()):
        # the colour of the scaler of that name, else of the k-th scaler
        color = color_of.get(name, colors[k] if k < len(colors) else TRACE_COLORS[k % len(TRACE_COLORS)])
        data.append({
            "type": "scatter", "x": np.asarray(steps), "y": 100 * np.asarray(shares, dtype=np.float64),
            "mode": "lines", "line": {"shape": "hv", "color": color, "width": 1.5},
            "name": f"{name}: % lost", "legendgroup": name, "showlegend": False, "yaxis": "y2",
            "meta": {"policy": name, "kind": "lost"},
        })
    n = max((t.steps for t in traces), default=0)
    # pixels: the lanes of skipped steps on top, the scale panel, the lost panel at the bottom
    height, top, bottom = (420, 60, 50) if rows == 1 else (560, 60, 50)
    plot = height - top - bottom
    lanes = _LANE_PX * len(traces)
    lane_domain = [1.0 - lanes / plot, 1.0]
    scale_domain = [0.0 if rows == 1 else 0.34, 1.0 - (lanes + 22) / plot]
    notes.append({"name": "skipped-title", "x": 0, "xref": "paper", "y": lane_domain[0], "yref": "paper",
                  "xanchor": "left", "yanchor": "top", "yshift": -1, "showarrow": False,
                  "font": {"size": 11, "color": "#555555"},
                  "text": "skipped steps, a lane per scaler" if len(traces) > 1 else "skipped steps"})
    ticks = _log2_ticks(np.concatenate(ys))
    scale_range = _padded_range(np.concatenate(ys), ticks["dtick"])
    layout = {
        **_WHITE,
        "title": {"text": title or "Loss scale over training steps", "x": 0.01},
        "height": height,
        "margin": {"l": 70, "r": 20, "t": top, "b": bottom},
        "legend": {"orientation": "h", "x": 0.01, "y": -0.15 if rows == 1 else -0.12, "yanchor": "top"},
        # the step axis under the lowest panel (its ticks and title never run into the panel below)
        "xaxis": {**_WHITE_AXIS, **_LINEAR, "title": {"text": "step"}, "range": [0, max(n - 1, 1)], "tickformat": "~s",
                  "anchor": "y2" if rows == 2 else "y"},
        "yaxis": {**_WHITE_AXIS, **_LINEAR, "title": {"text": "loss scale (log2 axis)"}, "domain": scale_domain,
                  **ticks, **({"range": scale_range} if scale_range else {})},
        "yaxis3": {**_LINEAR, "domain": lane_domain, "range": [len(traces) - 0.5, -0.5], "visible": False,
                   "fixedrange": True, "anchor": "x"},
        "shapes": shapes, "annotations": notes,
    }
    if rows == 2:
        percents = [100 * np.asarray(shares, dtype=np.float64) for _, shares in lost.values()]
        layout["yaxis2"] = {**_WHITE_AXIS, **_LINEAR, "title": {"text": "% of gradients lost"}, "domain": [0, 0.24],
                            "range": [0, _share_top(np.concatenate(percents))], "anchor": "x"}
    return _figure(data, layout)
