"""Live training as a figure: ``plot_live`` draws the loss per mode, the loss scale with skipped
steps, and a heat map of the gradients each parameter loses, from runs that may still be growing
(``live_traces`` gives the traces in a fixed order, so a live figure can take later data)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from ampviz.formats import get_format
from ampviz.plots.arguments import _census_result, _shown, _title
from ampviz.plots.axes import _log2_scale
from ampviz.plots.style import LOST_COLORSCALE, TRACE_COLORS, Figure, _WHITE, _WHITE_AXIS


#: Which mode's census ``plot_live`` draws as the heat map by default: the first of these present
#: (fp16 without a scaler first: its map shows where gradients are lost).
HEAT_MODE_ORDER = ("fp16", "fp16+scaler", "half", "bf16", "fp32")
#: The trace fields that change while a run grows (a live figure updates only these).
LIVE_DATA_KEYS = ("x", "y", "z", "name")
_LIVE_MODE_COLORS = {"fp32": "#000000", "fp16": "#D55E00", "fp16+scaler": "#0072B2", "bf16": "#009E73",
                     "half": "#CC79A7"}


def _runs(runs_by_mode) -> dict:
    """``runs_by_mode`` checked: a dict mode -> ``live.Run`` or list of ``StepRecord``s."""
    if not isinstance(runs_by_mode, dict):
        raise TypeError(f"runs must be a dict mode -> live.Run (or list of StepRecord), got "
                        f"{type(runs_by_mode).__name__}")
    for mode, run in runs_by_mode.items():
        recs = getattr(run, "records", run)
        if not isinstance(recs, (list, tuple)) or not all(
                hasattr(r, "step") and hasattr(r, "loss") and hasattr(r, "error") for r in recs[:1] + recs[-1:]):
            raise TypeError(f"runs[{mode!r}] must be a live.Run or a list of StepRecord, got {type(run).__name__}")
    return runs_by_mode


#: At most this many census steps in the live heat map (spread evenly over the run).
HEAT_COLUMNS = 200


def _records_of(run) -> list:
    """A snapshot of a run's records (a ``live.Run`` or a list of ``StepRecord``), safe to read while
    another thread appends to it."""
    return list(getattr(run, "records", run) or ())


def _loss_note(ok: list, loss: np.ndarray, recs: list) -> str:
    """What the loss line cannot show: the steps whose loss is inf or NaN (not drawn), and a run
    that ended on an error."""
    notes = []
    bad = np.flatnonzero(~np.isfinite(loss))
    if bad.size:
        notes.append(f"{'all' if bad.size == loss.size else f'{bad.size:,}'} not finite, from step "
                     f"{ok[int(bad[0])].step:,}")
    if recs and recs[-1].error is not None:
        notes.append(f"stopped at step {recs[-1].step:,}")
    return f" ({'; '.join(notes)})" if notes else ""


def _skipped_count(run, skipped: list) -> int:
    """Skipped steps of a run: all of them, also those a long ``live.Run`` no longer keeps."""
    count = getattr(run, "skipped_recorded", None)
    return len(skipped) if count is None else max(int(count), len(skipped))


def _mode_color(mode: str, k: int) -> str:
    return _LIVE_MODE_COLORS.get(mode, TRACE_COLORS[k % len(TRACE_COLORS)])


def lost_shares(census_by_name: dict) -> dict:
    """Share of each parameter's gradient that is zero or underflows in a census (by parameter name)."""
    if not isinstance(census_by_name, dict):
        raise TypeError(f"lost_shares takes a dict name -> CensusResult, got {type(census_by_name).__name__}")
    for c in census_by_name.values():
        _census_result(c, "each census")
    return {name: (c.counts["zero"] + c.counts["underflow"]) / max(c.total, 1)
            for name, c in census_by_name.items()}


def heat_mode_of(modes, heat_mode=None) -> str | None:
    """The mode whose census ``plot_live`` draws: ``heat_mode`` if given, else the first of
    ``HEAT_MODE_ORDER`` among ``modes``, else the first mode (None without modes)."""
    modes = list(modes)
    if heat_mode is not None:
        if heat_mode not in modes:
            raise ValueError(f"heat_mode {_shown(heat_mode)} is not one of the runs "
                             f"({', '.join(map(_shown, modes)) or 'none'})")
        return heat_mode
    return next((m for m in HEAT_MODE_ORDER if m in modes), modes[0] if modes else None)


#: Parameter names longer than this are shortened on the live heat map's rows (``_short_names``).
HEAT_LABEL_CHARS = 25
#: The live heat map's height per parameter row in pixels (font 10: every row labelled), and the
#: height of a heat map whose rows are not known yet (a live figure built from empty runs).
_HEAT_ROW_PX = 13
_HEAT_DEFAULT_PX = 240


def _short_name(name: str, limit: int) -> str:
    """``name`` in at most ``limit`` characters, keeping what tells parameters apart: the block it
    sits in (up to its index) and its own last parts. "encoder.layers.0.self_attn.in_proj_weight"
    becomes "…layers.0…in_proj_weight"; "…" marks what is left out."""
    if len(name) <= limit:
        return name
    parts = name.split(".")
    index = max((i for i, p in enumerate(parts[:-1]) if p.isdigit()), default=None)
    if index is None:
        head, rest = [], parts
    else:
        first = max(index - 1, 0)  # the container and its index: "layers.0"
        head, rest = parts[first:index + 1], parts[index + 1:]
        if first > 0:
            head[0] = "…" + head[0]
    head_text = ".".join(head)
    tail = [rest[-1]]
    for p in reversed(rest[:-1]):
        if len(head_text) + 1 + len(".".join([p, *tail])) > limit:
            break
        tail.insert(0, p)
    gap = "." if len(tail) == len(rest) else "…"
    text = (head_text + gap if head else ("" if len(tail) == len(rest) else "…")) + ".".join(tail)
    if len(text) > limit:  # one long last part: keep its end
        text = "…" + text[-(limit - 1):]
    return text


def _short_names(names) -> list:
    """Row labels for parameter names: each at most ``HEAT_LABEL_CHARS`` characters
    (``_short_name``); names whose short forms would coincide keep their full names, so that every
    row keeps a label of its own."""
    names = [str(n) for n in names]
    short = [_short_name(n, HEAT_LABEL_CHARS) for n in names]
    seen: dict = {}
    for s in short:
        seen[s] = seen.get(s, 0) + 1
    out = [n if seen[s] > 1 else s for n, s in zip(names, short)]
    return out if len(set(out)) == len(out) else names


def _loss_width(k: int, n: int) -> float:
    """Width of the k-th of n loss lines: earlier lines wider, so that coinciding losses (fp32 and
    fp16 with a scaler often are) all stay visible, each later one drawn on top, narrower."""
    return 1.5 if n == 1 else 1.2 + 0.7 * (n - 1 - k)


def live_traces(runs_by_mode: dict, *, heat_mode=None) -> list:
    """The traces of ``plot_live`` as plain dicts, in a fixed order that depends only on the modes
    (never on how many records there are), so a live figure built from empty runs can take the data
    of later calls trace by trace (``LIVE_DATA_KEYS``).

    Per mode: a loss line named after the mode (steps of the records without an error), each
    mode's line narrower than the one before, so coinciding losses stay visible. Per mode with a
    loss scaler (records carrying a ``scale``, or the mode "fp16+scaler"): a log2(scale) step line
    and the skipped steps as markers. Last, one heat map of ``heat_mode``'s parameter census: x the
    census steps, y the parameter names (those longer than ``HEAT_LABEL_CHARS`` characters
    shortened, "…" marking what is left out, e.g. "…layers.0…in_proj_weight"), z the share of each
    parameter's gradient that is zero or underflows (``lost_shares``; at most ``HEAT_COLUMNS``
    census steps, spread evenly), its colour bar under the step axis. Every trace's ``meta`` says
    its mode and kind ("loss", "scale", "skipped", "heat").
    """
    snap = {mode: _records_of(run) for mode, run in _runs(runs_by_mode).items()}
    data = []
    for k, (mode, recs) in enumerate(snap.items()):
        ok = [r for r in recs if r.error is None]
        loss = np.array([r.loss for r in ok], dtype=np.float64)
        data.append({
            "type": "scatter", "mode": "lines", "x": np.array([r.step for r in ok], dtype=np.int64),
            "y": loss, "name": mode + _loss_note(ok, loss, recs),
            "legendgroup": mode, "line": {"color": _mode_color(mode, k), "width": _loss_width(k, len(snap))},
            "xaxis": "x", "yaxis": "y", "meta": {"mode": mode, "kind": "loss"},
        })
    for k, (mode, recs) in enumerate(snap.items()):
        scaled = [r for r in recs if r.error is None and r.scale is not None]
        if not scaled and mode != "fp16+scaler":
            continue
        color = _mode_color(mode, k)
        skipped = [r for r in scaled if r.skipped]
        data.append({
            "type": "scatter", "mode": "lines", "x": np.array([r.step for r in scaled], dtype=np.int64),
            "y": _log2_scale(np.array([r.scale for r in scaled], dtype=np.float64)),
            "name": f"{mode} log2(scale)", "legendgroup": mode, "showlegend": False,
            "line": {"shape": "hv", "color": color, "width": 2},
            "xaxis": "x2", "yaxis": "y2", "meta": {"mode": mode, "kind": "scale"},
        })
        data.append({
            "type": "scatter", "mode": "markers", "x": np.array([r.step for r in skipped], dtype=np.int64),
            "y": _log2_scale(np.array([r.scale for r in skipped], dtype=np.float64)),
            "name": f"{mode}: {_skipped_count(runs_by_mode[mode], skipped):,} skipped", "legendgroup": mode,
            "marker": {"symbol": "x", "size": 8, "color": color},
            "xaxis": "x2", "yaxis": "y2", "meta": {"mode": mode, "kind": "skipped"},
        })
    hm = heat_mode_of(snap, heat_mode)
    cens = [r for r in snap.get(hm, ()) if r.error is None and r.param_census]
    if len(cens) > HEAT_COLUMNS:  # evenly spread columns: a long run costs no more to draw
        cens = [cens[i] for i in np.linspace(0, len(cens) - 1, HEAT_COLUMNS).round().astype(int)]
    names = list(cens[0].param_census) if cens else []
    shares = [lost_shares(r.param_census) for r in cens]
    z = np.array([[s.get(n, np.nan) for s in shares] for n in names],
                 dtype=np.float64).reshape(len(names), len(cens))
    data.append({
        "type": "heatmap", "x": np.array([r.step for r in cens], dtype=np.int64), "y": _short_names(names),
        "z": z, "name": f"{hm} lost gradient share", "zmin": 0.0, "zmax": 1.0,
        # explicit, light (0% lost) to dark: plotly.js's own "Blues" runs the other way
        "colorscale": [list(stop) for stop in LOST_COLORSCALE],
        # under the step axis, at the right: the figure's width stays with the panels
        "colorbar": {"title": {"text": "lost", "side": "right"}, "orientation": "h", "lenmode": "pixels",
                     "len": 140, "thickness": 10, "x": 1.0, "xanchor": "right", "xref": "paper",
                     "y": 0.0, "yanchor": "bottom", "yref": "container", "ypad": 6, "tickformat": ".0%",
                     "tickvals": [0, 0.5, 1], "tickfont": {"size": 10}},
        "hovertemplate": "step %{x}<br>%{y}: %{z:.1%} zero or underflow<extra></extra>",
        "xaxis": "x3", "yaxis": "y3", "meta": {"mode": hm, "kind": "heat"},
    })
    return data


def _live_geometry(rows: int) -> dict:
    """The live figure's layout in pixels, turned into paper fractions: the loss panel, the scale
    panel and the heat map (``_HEAT_ROW_PX`` per parameter row, between 12 and 40 rows' worth; a
    heat map of unknown rows gets ``_HEAT_DEFAULT_PX``), with room above each lower panel for its
    title, the title and legend above the loss panel, and the step axis under the heat map."""
    heat = _HEAT_DEFAULT_PX if rows == 0 else _HEAT_ROW_PX * min(max(rows, 12), 40)
    loss, scale, gap_scale, gap_heat, top, bottom = 200, 110, 34, 44, 96, 90
    plot = loss + gap_scale + scale + gap_heat + heat
    f = 1.0 / plot
    return {
        "height": top + plot + bottom, "margin": {"l": 60, "r": 20, "t": top, "b": bottom},
        "heat": [0.0, heat * f], "scale": [(heat + gap_heat) * f, (heat + gap_heat + scale) * f],
        "loss": [1.0 - loss * f, 1.0], "legend_y": 1.0 + 6 * f,
    }


#: The loss's unit by model (``live.Run.config.model``): the beam model's loss is a mean squared
#: error in m^2; the classifiers' cross-entropy has no unit.
LOSS_UNITS = {"beam": "m²"}


def _loss_axis_title(runs_by_mode: dict, model=None) -> str:
    """"loss", with its unit where ``model`` (a model's name) has one, or else where every run
    names its model (a ``live.Run``) and all name one model that has a unit ("loss (m²)" for the
    beam)."""
    if model is not None:
        unit = LOSS_UNITS.get(model) if isinstance(model, str) else None
        return f"loss ({unit})" if unit else "loss"
    models = {getattr(getattr(run, "config", None), "model", None) for run in runs_by_mode.values()}
    unit = LOSS_UNITS.get(models.pop()) if len(models) == 1 else None
    return f"loss ({unit})" if isinstance(unit, str) else "loss"


def plot_live(runs_by_mode: dict, *, steps=None, heat_mode=None, fmt="fp16", title=None,
              model=None) -> go.Figure:
    """Live training on one figure: the loss per mode (top), the loss scale on a log2 axis with
    skipped steps marked for the modes with a scaler (middle), and a heat map of ``heat_mode``'s
    parameter census over time (bottom): per parameter, the share of its gradient (× the step's
    scale) that is zero or underflows in ``fmt``. The legend sits above the loss panel.

    ``runs_by_mode``: mode -> ``live.Run`` or list of ``StepRecord``, possibly empty: a figure of
    empty runs has every trace already (see ``live_traces``), so a live figure built from it can take
    the traces of later calls as the runs grow. The loss axis names the loss's unit where the runs
    are ``live.Run``s of one model that has one ("loss (m²)" for the beam model), or where ``model``
    names it (a figure of empty runs, as LiveTrainer builds). ``steps`` fixes the x range to [0, steps - 1] (else
    [0, the last step recorded]); ``fmt`` only names the format in the heat map's title (the
    census's own format is used). The heat map is ``_HEAT_ROW_PX`` pixels per parameter row, so
    every row is labelled (from 12 to 40 rows; more rows share the labels, every second or third
    one labelled); a figure of empty runs leaves room for 18 rows.
    """
    data = live_traces(runs_by_mode, heat_mode=heat_mode)
    _title(title)
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0):
        raise ValueError(f"steps must be a whole number >= 0 (or None), got {_shown(steps)}")
    heat = data[-1]["meta"]["mode"]
    has_scale = any(d["meta"]["kind"] == "scale" for d in data)
    last = max((int(np.max(d["x"])) for d in data if len(d["x"])), default=0)
    if steps:
        x_axis = {**_WHITE_AXIS, "range": [0, max(int(steps) - 1, 1)]}
    elif last > 0:  # the recorded steps, not the heat map's cells (which reach half a census gap beyond)
        x_axis = {**_WHITE_AXIS, "range": [0, last]}
    else:
        x_axis = {**_WHITE_AXIS, "autorange": True}
    x_axis["tickformat"] = "~s"
    g = _live_geometry(len(data[-1]["y"]))
    heat_title = (f"{heat}: share of each parameter's gradient<br>(× scale) that is zero or underflows in "
                  f"{get_format(fmt).name}" if heat else "no run: no gradient census")
    notes = [
        {"name": "heat-title", "text": heat_title, "x": 0, "xref": "paper", "y": g["heat"][1], "yref": "paper",
         "xanchor": "left", "yanchor": "bottom", "yshift": 2, "align": "left", "showarrow": False,
         "font": {"size": 11}},
        {"name": "scale-title", "x": 0, "xref": "paper", "y": g["scale"][1], "yref": "paper", "xanchor": "left",
         "yanchor": "bottom", "yshift": 4, "showarrow": False, "font": {"size": 12},
         "text": "loss scale (× = skipped step)" if has_scale else "loss scale: no mode with a scaler"},
    ]
    layout = {
        **_WHITE,
        "title": {"text": title or f"Loss, loss scale and gradients lost in {get_format(fmt).name}", "x": 0.01,
                  "y": 1.0 - 12.0 / g["height"], "yanchor": "top", "font": {"size": 16}},
        "height": g["height"],
        "margin": g["margin"],
        # above the loss panel, as wide as the figure: it names the lines right where they start
        "legend": {"orientation": "h", "x": 0, "xanchor": "left", "y": g["legend_y"], "yanchor": "bottom",
                   "font": {"size": 12}},
        "xaxis": {**x_axis, "anchor": "y", "showticklabels": False},
        "yaxis": {**_WHITE_AXIS, "title": {"text": _loss_axis_title(runs_by_mode, model)}, "domain": g["loss"],
                  "tickformat": "~g"},
        "xaxis2": {**x_axis, "anchor": "y2", "matches": "x", "showticklabels": False},
        # whole powers of two: the axis always spans 2^0 (no scaling) to 2^16 (GradScaler's start)
        "yaxis2": {**_WHITE_AXIS, "title": {"text": "scale"}, "domain": g["scale"], "tickprefix": "2^",
                   "autorangeoptions": {"include": [0, 16]}},
        "xaxis3": {**x_axis, "anchor": "y3", "matches": "x", "title": {"text": "step"}},
        "yaxis3": {**_WHITE_AXIS, "domain": g["heat"], "autorange": "reversed", "type": "category",
                   "tickfont": {"size": 10}},
        "annotations": notes,
        "meta": {"modes": list(runs_by_mode), "heat_mode": heat, "fmt": get_format(fmt).name},
    }
    return Figure(data=data, layout=layout)
