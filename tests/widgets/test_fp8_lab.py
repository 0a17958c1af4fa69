"""Fp8ScalingLab and plot_fp8_scaling, headless: the figure and the readout follow
``ampviz.formats.fp8.simulate_fp8_scaling`` exactly for every control; moves from the browser are
coalesced; every bad input is a one-line message."""

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ampviz.widgets.figureview import FigureView
from ampviz.formats.fp8 import simulate_fp8_scaling, tensor_stream
from ampviz.plots import plot_fp8_scaling
from ampviz.widgets.fp8_lab import HISTORY_LENGTHS, Fp8ScalingLab, lab_stream
from widget_checks import move_quickly, one_line, text  # tests/, on the path as pytest runs
from layout_checks import contains, descendants  # tests/widgets/, on the path as pytest runs

FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ANYTHING = st.one_of(
    st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20), st.lists(st.integers(), max_size=3), st.just(object()), st.just(np.float32(2.0)),
)




def expected(recipe="delayed", history_len=1024, algo="max", margin=0, fmt="fp8_e4m3", spike_log2=8,
             nonfinite="none", seed=0):
    """The trace the core gives for these settings, built here without the lab."""
    p = Fp8ScalingLab.NONFINITE_PROB
    stream = tensor_stream(2000, 4096, seed=seed, spike_log2=spike_log2, inf_prob=p if nonfinite == "inf" else 0.0,
                           nan_prob=p if nonfinite == "nan" else 0.0)
    kw = dict(history_len=history_len, algo=algo, margin=margin) if recipe == "delayed" else {}
    return simulate_fp8_scaling(stream, recipe, fmt=fmt, **kw)


def traces(fig):
    return {t.meta["kind"]: t for t in fig.data}


def log2_or_nan(v):
    a = np.abs(np.asarray(v, np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(np.isfinite(a) & (a > 0), np.log2(np.where(a > 0, a, 1)), np.nan)


def f32(v):
    """``v`` as the figure sends it: its lines' points travel as float32."""
    return np.asarray(v, np.float32).astype(np.float64)


def every_step(t, n, ticks=None):
    """A line trace's value at each of ``n`` steps: ``y`` itself for a line of every step (from
    x0 = 0, dx = 1), the "hv" step line through its points (x, y), or a line whose runs of gaps
    travel as their first step alone (every step with a value is there, and a step missing lies
    in a run of gaps: the point before it is a gap). ``ticks``: ``(tick, lo, hi)`` for a share
    line, whose lone steps are two points at their step, max(v - tick, lo) and min(v + tick, hi)
    (v is given back for them, computed from the point not held at the axis, to within float32)."""
    y = np.asarray(t.y, np.float64)
    if t.x is None:
        assert t.x0 == 0 and t.dx == 1 and y.size == n
        return y
    x = np.asarray(t.x, np.int64)
    step = np.diff(x)
    if ticks is not None:
        tick, lo, hi = ticks
        at = np.flatnonzero(step == 0)  # a lone step's first point; the second follows it
        assert np.all(y[at] <= y[at + 1]) and (at.size < 2 or np.diff(at).min() > 2)
        y = y.copy()
        y[at] = np.where(y[at] > lo, y[at] + tick, y[at + 1] - tick)
        x, y = np.delete(x, at + 1), np.delete(y, at + 1)
        step = np.diff(x)
    assert x.size == y.size and np.all(step > 0) and (not n or x[0] == 0)
    if t.line.shape == "hv":
        assert not n or x[-1] == n - 1
    else:
        assert np.all(np.isnan(y[:-1][step > 1])) and (not n or x[-1] == n - 1 or np.isnan(y[-1]))
        assert not np.any(np.isnan(y[:-1]) & np.isnan(y[1:]) & (step == 1))  # one point a run
    return y[np.searchsorted(x, np.arange(n), side="right") - 1]


def share_ticks(fig) -> tuple:
    """``(tick, lo, hi)``: a lone step's tick is drawn 5 px above and below its share, on the share
    panel (28% of the figure's 520 px of panels) whose axis runs from lo to hi."""
    lo, hi = fig.layout.yaxis3.range
    return 5 * (hi - lo) / (0.28 * 520), lo, hi


def assert_figure_follows(fig, tr):
    """Every trace of the figure holds what the core says, value for value, at every step (the
    lines' points as float32, as they travel to the browser)."""
    t = traces(fig)
    n = tr.steps
    eq = lambda a, b: np.array_equal(np.asarray(a, np.float64), np.asarray(b, np.float64), equal_nan=True)  # noqa: E731
    assert eq(every_step(t["amax"], n), f32(log2_or_nan(tr.amax)))
    assert eq(every_step(t["scale"], n), f32(log2_or_nan(tr.scale)))
    assert eq(np.asarray(t["scale"].customdata), tr.scale.astype(np.float32)[np.asarray(t["scale"].x)])
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        assert eq(every_step(t["ceiling"], n), f32(log2_or_nan(tr.fmt.max / tr.scale.astype(np.float64))))
        assert eq(every_step(t["floor"], n), f32(log2_or_nan(tr.fmt.underflow_boundary / tr.scale.astype(np.float64))))
    ticks = share_ticks(fig)
    for kind in ("saturated", "underflowed", "subnormal"):
        c = getattr(tr, kind)
        with np.errstate(divide="ignore"):
            want = f32(np.where(c > 0, np.log10(100.0 * c / tr.size), np.nan))
        got = every_step(t[kind], n, ticks)
        lone = (c > 0) & (np.r_[0, c[:-1]] == 0) & (np.r_[c[1:], 0] == 0)
        assert eq(got[~lone], want[~lone]) and np.allclose(got[lone], want[lone], rtol=0, atol=1e-5), kind
    bad = np.flatnonzero(~np.isfinite(tr.amax))
    assert ("nonfinite" in t) == bool(bad.size) and (not bad.size or eq(t["nonfinite"].x, bad))
    meta = fig.layout.meta
    assert meta["saturated_steps"] == tr.saturated_steps and meta["worst_step"] == tr.worst_step
    assert meta["recipe"] == tr.recipe and meta["fmt"] == tr.fmt.name


def assert_lab_follows(lab, **kw):
    tr = expected(**kw)
    for name in ("amax", "scale", "saturated", "underflowed", "subnormal", "frozen"):
        assert np.array_equal(getattr(lab.trace, name), getattr(tr, name), equal_nan=True), name
    assert_figure_follows(lab.figure, tr)
    assert f"steps that saturate: {tr.saturated_steps:,} of 2,000" in text(lab.readout)
    assert f"worst step {tr.worst_step:,}:" in text(lab.readout) and lab.error is None


# ----- the lab follows the core -----
def test_the_lab_starts_at_transformer_engines_defaults():
    lab = Fp8ScalingLab()
    assert lab.trace.settings == {"margin": 0, "history_len": 1024, "algo": "max", "convention": "python"}
    assert_lab_follows(lab)


@pytest.mark.parametrize("control,value,kw", [
    ("recipe_buttons", "current", {"recipe": "current"}),
    ("history_slider", 16, {"history_len": 16}),
    ("algo_dropdown", "most_recent", {"algo": "most_recent"}),
    ("margin_slider", 3, {"margin": 3}),
    ("margin_slider", -4, {"margin": -4}),
    ("fmt_dropdown", "fp8_e5m2", {"fmt": "fp8_e5m2"}),
    ("spike_slider", 14, {"spike_log2": 14}),
    ("nonfinite_dropdown", "inf", {"nonfinite": "inf"}),
    ("nonfinite_dropdown", "nan", {"nonfinite": "nan"}),
    ("seed_input", 7, {"seed": 7}),
])
def test_every_control_follows_the_core(control, value, kw):
    lab = Fp8ScalingLab()
    getattr(lab, control).value = value
    assert_lab_follows(lab, **kw)


def test_a_wiring_that_ignored_a_control_would_fail():
    """The settings each control moves change the figure: a lab that ignored one would fail."""
    base = expected()
    for kw in ({"history_len": 16}, {"algo": "most_recent"}, {"margin": 3}, {"fmt": "fp8_e5m2"},
               {"spike_log2": 14}, {"nonfinite": "inf"}, {"seed": 7}, {"recipe": "current"}):
        with pytest.raises(AssertionError):
            assert_figure_follows(plot_fp8_scaling(expected(**kw)), base)


def test_current_scaling_disables_the_delayed_controls_and_ignores_them():
    lab = Fp8ScalingLab("current", history_len=4, algo="most_recent", margin=2)
    assert lab.history_slider.disabled and lab.algo_dropdown.disabled and lab.margin_slider.disabled
    assert_lab_follows(lab, recipe="current")
    key = len(lab._drawn_states)
    lab.margin_slider.value = 5  # no new drawing: the same settings
    assert len(lab._drawn_states) == key
    lab.recipe_buttons.value = "delayed"
    assert not lab.history_slider.disabled
    assert_lab_follows(lab, history_len=4, algo="most_recent", margin=5)


def test_the_readout_reads_a_spike_held_in_the_window():
    """History 1024, "max": the first spike holds the scale down for the rest of the run, so most
    steps lose values to underflow; history 1 loses them at a handful of steps only."""
    lab = Fp8ScalingLab()
    long = int((lab.trace.underflowed_share >= 0.01).sum())
    lab.history_slider.value = 1
    short = int((lab.trace.underflowed_share >= 0.01).sum())
    assert long > 1000 > 20 > short > 0
    assert f"steps that lose ≥ 1% to underflow: {short:,}" in text(lab.readout)


@FUZZ
@given(recipe=st.sampled_from(["delayed", "current"]), history_len=st.sampled_from(HISTORY_LENGTHS),
       algo=st.sampled_from(["max", "most_recent"]), margin=st.integers(-4, 8),
       fmt=st.sampled_from(["fp8_e4m3", "fp8_e5m2"]), spike_log2=st.integers(0, 16),
       nonfinite=st.sampled_from(["none", "inf", "nan"]), seed=st.integers(0, 2**32 - 1))
def test_every_control_position_follows_the_core(recipe, history_len, algo, margin, fmt, spike_log2, nonfinite, seed):
    lab = Fp8ScalingLab()
    lab.seed_input.value = seed
    lab.nonfinite_dropdown.value = nonfinite
    lab.spike_slider.value = spike_log2
    lab.fmt_dropdown.value = fmt
    lab.margin_slider.value = margin
    lab.algo_dropdown.value = algo
    lab.history_slider.value = history_len
    lab.recipe_buttons.value = recipe
    kw = dict(history_len=history_len, algo=algo, margin=margin) if recipe == "delayed" else {}
    assert_lab_follows(lab, recipe=recipe, fmt=fmt, spike_log2=spike_log2, nonfinite=nonfinite, seed=seed, **kw)


# ----- bad input: one line -----
@pytest.mark.parametrize("kwargs,message", [
    ({"recipe": "dynamic"}, "recipe must be one of 'delayed', 'current'"),
    ({"history_len": 3}, "history_len must be a power of two"),
    ({"history_len": 2048}, "history_len must be between 1 and 1,024"),
    ({"history_len": 1.5}, "history_len must be a whole number"),
    ({"algo": "mean"}, "algo must be one of 'max', 'most_recent'"),
    ({"margin": 9}, "margin must be between -4 and 8"),
    ({"fmt": "fp16"}, "fmt must be one of 'fp8_e4m3', 'fp8_e5m2'"),
    ({"spike_log2": -1}, "spike_log2 must be between 0 and 16"),
    ({"nonfinite": True}, "nonfinite must be one of"),
    ({"seed": "x"}, "seed must be a whole number"),
])
def test_the_constructor_says_what_is_wrong(kwargs, message):
    with pytest.raises((ValueError, TypeError)) as info:
        Fp8ScalingLab(**kwargs)
    assert message in str(info.value) and one_line(str(info.value))


@settings(max_examples=40, deadline=None)
@given(kwargs=st.dictionaries(st.sampled_from(["recipe", "history_len", "algo", "margin", "fmt", "spike_log2",
                                               "nonfinite", "seed"]), ANYTHING, max_size=2))
def test_every_constructor_argument_is_valid_or_a_one_line_message(kwargs):
    try:
        lab = Fp8ScalingLab(**kwargs)
    except (ValueError, TypeError) as e:
        assert one_line(str(e)), str(e)
        return
    assert lab.error is None and lab.trace is not None


def test_an_error_in_a_redraw_is_shown_on_one_line(monkeypatch):
    lab = Fp8ScalingLab()

    def broken(*a, **k):
        raise ValueError("history_len must be a whole number from 1 to 16777216")

    monkeypatch.setattr("ampviz.widgets.fp8_lab.simulate_fp8_scaling", broken)
    lab.spike_slider.value = 3
    assert lab.error == "history_len must be a whole number from 1 to 16777216" and "⚠" in lab.message.value
    monkeypatch.undo()
    lab.spike_slider.value = 4
    assert lab.error is None and lab.message.value == ""


# ----- one view, updated in place; moves from the browser coalesced -----
def _sent(view):
    from ampviz.widgets.figureview import _to_json

    return json.dumps([_to_json(view.data, view), _to_json(view.figure_layout, view)], sort_keys=True)


def test_the_figure_is_updated_in_place_and_classes_are_stable():
    from ampviz.widgets.figureview import FigureView

    lab = Fp8ScalingLab()
    view = lab.view
    assert isinstance(view, FigureView) and contains(lab.ui, view)
    lab.history_slider.value = 16
    assert lab.view is view and _sent(view) == _sent(Fp8ScalingLab(history_len=16).view)
    classes = {c for w in (lab.recipe_buttons, lab.history_slider, lab.algo_dropdown, lab.margin_slider,
                           lab.fmt_dropdown, lab.spike_slider, lab.nonfinite_dropdown, lab.seed_input, lab.readout,
                           lab.view, lab.ui, lab.message) for c in w._dom_classes}
    assert {"ampviz-fp8-recipe", "ampviz-fp8-history", "ampviz-fp8-algo", "ampviz-fp8-margin", "ampviz-fp8-fmt",
            "ampviz-fp8-spike", "ampviz-fp8-nonfinite", "ampviz-fp8-seed", "ampviz-fp8-readout",
            "ampviz-fp8-figure", "ampviz-fp8-lab", "ampviz-message"} <= classes


def test_browser_moves_are_coalesced_and_the_last_position_wins(monkeypatch):
    lab = Fp8ScalingLab()
    values = list(range(1, 12))
    move_quickly(lab, "spike_slider", values, monkeypatch)
    fresh = Fp8ScalingLab(spike_log2=values[-1])
    assert _sent(lab.view) == _sent(fresh.view) and lab.readout.value == fresh.readout.value
    assert_lab_follows(lab, spike_log2=values[-1])


def test_a_move_made_in_python_redraws_before_it_returns():
    lab = Fp8ScalingLab()
    lab.spike_slider.value = 12
    assert lab._worker is None and lab.settle(0)
    assert_lab_follows(lab, spike_log2=12)


@pytest.mark.parametrize("slider, name, start, to, ahead, behind", [
    ("spike_slider", "spike_log2", 8, 10, 11, 9),
    ("margin_slider", "margin", 0, -1, -2, 0),
    ("history_slider", "history_len", 1024, 32, 16, 64),
])
def test_the_moved_sliders_next_positions_are_drawn_ahead_and_are_exact(slider, name, start, to, ahead, behind):
    """After a browser move, the moved slider's neighbours are drawn ahead, the way it went first;
    the next press finds them, and what it sends is what a fresh lab sends there."""
    lab = Fp8ScalingLab(**{name: start})
    control = getattr(lab, slider)
    control.set_state({"index": control.options.index(to)} if name == "history_len" else {"value": to})
    assert lab.settle(30) and control.value == to
    keys = [dict(k)[name] for k in lab._drawn_states]
    assert ahead in keys and behind in keys and keys.index(ahead) < keys.index(behind)
    kept = len(lab._drawn_states)
    control.set_state({"index": control.options.index(ahead)} if name == "history_len" else {"value": ahead})
    assert lab.settle(30)
    assert _sent(lab.view) == _sent(Fp8ScalingLab(**{name: ahead}).view)
    assert_lab_follows(lab, **{name: ahead})
    assert len(lab._drawn_states) <= lab.KEPT_DRAWN and kept >= 3


def test_a_move_made_in_python_draws_nothing_ahead():
    lab = Fp8ScalingLab()
    lab.spike_slider.value = 9
    assert [dict(k)["spike_log2"] for k in lab._drawn_states] == [8, 9]

def test_the_lab_stream_is_the_core_stream():
    s = lab_stream(3, 5, "nan")
    t = tensor_stream(2000, 4096, seed=3, spike_log2=5, nan_prob=Fp8ScalingLab.NONFINITE_PROB)
    assert np.array_equal(s.magnitude, t.magnitude) and np.array_equal(s.nonfinite, t.nonfinite)


# ----- plot_fp8_scaling -----
def _wire_and_json(fig):
    import plotly.io as pio

    from ampviz.widgets.figureview import pack

    return json.dumps(pack(fig.to_plotly_json()), sort_keys=True), json.loads(pio.to_json(fig))


@settings(max_examples=25, deadline=None)
@given(recipe=st.sampled_from(["delayed", "current"]), steps=st.integers(1, 60), size=st.integers(1, 40),
       seed=st.integers(0, 100), spike=st.integers(0, 40), bad=st.floats(0, 0.3),
       fmt=st.sampled_from(["fp8_e4m3", "fp8_e5m2"]), margin=st.integers(-30, 30))
def test_plot_fp8_scaling_holds_the_trace_and_what_validation_gives(recipe, steps, size, seed, spike, bad, fmt, margin):
    import plotly.graph_objects as go

    s = tensor_stream(steps, size, seed=seed, spike_log2=spike, spike_prob=0.2, inf_prob=bad, nan_prob=bad / 2)
    tr = simulate_fp8_scaling(s, recipe, fmt=fmt, **({"margin": margin, "history_len": 4} if recipe == "delayed"
                                                       else {}))
    fig = plot_fp8_scaling(tr)
    assert _wire_and_json(fig) == _wire_and_json(go.Figure(fig.to_plotly_json()))
    assert_figure_follows(fig, tr)


@pytest.mark.parametrize("bad,message", [
    (None, "trace must be an Fp8ScalingTrace"),
    ([1, 2], "trace must be an Fp8ScalingTrace"),
])
def test_plot_fp8_scaling_refuses_what_is_not_a_trace(bad, message):
    with pytest.raises(TypeError) as info:
        plot_fp8_scaling(bad)
    assert message in str(info.value) and one_line(str(info.value))


def test_the_figure_sends_numbers_not_texts_and_marks_the_lone_steps():
    """Hover texts are templates over the numbers (no string per step), and a step with some
    saturated, underflowed or subnormal values between two steps with none (which a line cannot
    show) is drawn as a vertical tick centred on its share: exactly those steps, found here by
    walking the counts."""
    tr = expected(history_len=16)
    fig = plot_fp8_scaling(tr)
    assert all(t.hovertext is None for t in fig.data)
    t = traces(fig)
    runs = np.asarray(t["scale"].x)
    assert np.array_equal(t["amax"].customdata, tr.amax) and np.array_equal(t["scale"].customdata, tr.scale[runs])
    wire = FigureView.prepare(fig)
    sent = len(json.dumps(wire.data)) + len(json.dumps(wire.layout))
    assert sent < 220_000, sent  # with a text and a marker per step: 0.6 MB in plotly's JSON
    # the scale's step lines go through the ends of its runs only: 832 points here, not 2,000
    changes = np.flatnonzero(tr.scale[1:] != tr.scale[:-1]) + 1
    assert set(runs.tolist()) == {0, tr.steps - 1} | set(changes.tolist()) | set((changes - 1).tolist())
    assert runs.size < 0.6 * tr.steps and t["ceiling"].x is not None and t["amax"].x is None
    assert not any("alone" in d.meta["kind"] or d.mode != "lines" for d in fig.data)  # no marker traces
    tick, lo, hi = share_ticks(fig)
    some_runs = 0
    for kind in ("saturated", "underflowed", "subnormal"):
        c = getattr(tr, kind)
        share = f32(np.log10(100.0 * np.where(c > 0, c, 1) / tr.size))
        lone = [i for i in range(tr.steps) if c[i] > 0 and (i == 0 or c[i - 1] == 0)
                and (i == tr.steps - 1 or c[i + 1] == 0)]
        x, y = np.asarray(t[kind].x, int), np.asarray(t[kind].y, np.float64)
        assert t[kind].mode == "lines" and np.array_equal(t[kind].customdata, c[x])
        # each run of steps with none travels as its first step (a gap), the steps with some all
        assert set(x.tolist()) == {i for i in range(tr.steps) if c[i] > 0 or i == 0 or c[i - 1] > 0}
        # a lone step twice: its share less and plus the tick, within the axis
        twice = [i for i in np.unique(x) if (x == i).sum() == 2]
        assert twice == lone and (np.bincount(x) <= 2).all(), kind
        for i in lone:
            at = np.flatnonzero(x == i)
            assert at[1] == at[0] + 1, kind
            assert np.isclose(y[at[0]], max(share[i] - tick, lo), rtol=0, atol=1e-5), kind
            assert np.isclose(y[at[1]], min(share[i] + tick, hi), rtol=0, atol=1e-5), kind
        single = np.isin(x, lone, invert=True)
        assert np.array_equal(y[single], np.where(c[x[single]] > 0, share[x[single]], np.nan), equal_nan=True), kind
        some_runs += len(lone) < int((c > 0).sum())  # steps in runs are drawn by the line, not ticked
    assert len(np.unique(t["saturated"].x)) < len(t["saturated"].x) and some_runs >= 1  # the spikes saturate alone
    assert t["saturated"].line.width > t["underflowed"].line.width  # its ticks drawn wider


def test_the_spike_grows_against_still_axes():
    """Every position of the spike slider draws the same layout (axes that hold the runs at both
    ends of the slider, names without counts): a move only moves the lines. The readout keeps the
    counts the legend no longer shows; the plot function without ``hold`` fits its own run."""
    from ampviz.widgets.figureview import FigureView
    from ampviz.plots import plot_fp8_scaling

    lab = Fp8ScalingLab(history_len=16, spike_log2=0)
    keys = set()
    for v in range(lab.spike_slider.min, lab.spike_slider.max + 1):
        lab.spike_slider.value = v
        keys.add(FigureView.prepare(lab.figure).layout_key)
    assert len(keys) == 1
    names = [d.name for d in lab.figure.data if d.meta["kind"] in ("saturated", "underflowed", "subnormal")]
    assert names == ["saturated (held at ±max)", "underflowed (became 0)", "subnormal"]
    tr = lab.trace
    some = [int((np.asarray(c) > 0).sum()) for c in (tr.underflowed, tr.subnormal)]
    assert f"(any: {some[0]:,})" in text(lab.readout) and f"steps with subnormals: {some[1]:,}" in text(lab.readout)
    # the ranges hold the lines of every run given, and move with them without ``hold``
    low, high = lab._spike_ends()
    for fig, runs in ((lab.figure, (tr, low, high)), (plot_fp8_scaling(low), (low,))):
        for axis, kind in (("yaxis", "amax"), ("yaxis2", "scale")):
            lo, hi = getattr(fig.layout, axis).range
            for run in runs:
                y = np.log2(np.asarray(run.amax if kind == "amax" else run.scale, np.float64))
                assert lo < y[np.isfinite(y)].min() and y[np.isfinite(y)].max() < hi
    assert plot_fp8_scaling(low).layout.yaxis.range != lab.figure.layout.yaxis.range
    assert [d.name for d in plot_fp8_scaling(low).data if d.meta["kind"] == "saturated"][0].endswith(" steps")
    with pytest.raises(TypeError, match="hold must be a list of Fp8ScalingTraces"):
        plot_fp8_scaling(low, hold=low)
    with pytest.raises(TypeError, match="Fp8ScalingTrace"):
        plot_fp8_scaling(low, hold=[1])
    with pytest.raises(TypeError, match="legend_counts must be True or False"):
        plot_fp8_scaling(low, legend_counts=None)


def test_the_share_axis_reads_as_a_log_axis_in_percent():
    """The share panel draws log10 of each percent on a linear axis: every power of ten in its
    range is a tick labelled with that percent (as a log axis would be), and 10^y of a share's
    point is its percent; the range reaches down below one value in ``size``."""
    from ampviz.plots import plot_fp8_scaling

    lab = Fp8ScalingLab(history_len=16, spike_log2=8)
    ax = lab.figure.layout.yaxis3
    lo, hi = ax.range
    assert ax.type == "linear" and lo < math.log10(100.0 / lab.trace.size) and hi > 2
    assert list(ax.tickvals) == list(range(math.ceil(lo), math.floor(hi) + 1))
    assert [float(t) for t in ax.ticktext] == [10.0 ** k for k in ax.tickvals]
    assert list(ax.ticktext)[-3:] == ["1", "10", "100"]
    t = {d.meta["kind"]: d for d in plot_fp8_scaling(lab.trace).data}
    y, c = np.asarray(t["underflowed"].y, np.float64), np.asarray(t["underflowed"].customdata)
    shown = np.isfinite(y)
    assert np.allclose(10.0 ** y[shown], 100.0 * c[shown] / lab.trace.size, rtol=1e-6)
    assert np.array_equal(shown, c > 0)


# ----- the history length shown is the one in use -----
def test_the_history_box_always_shows_the_length_in_use():
    """A SelectionSlider's readout can be typed into in the browser but reads nothing typed, and
    went blank after "-1e9" + Enter while the title said 128: the slider shows no readout, and a
    box beside it shows the length in use, takes a length typed, and refuses any other text with a
    message, showing the length in use again."""
    lab = Fp8ScalingLab(history_len=128)
    assert lab.history_slider.readout is False and lab.history_input.value == "128"
    assert lab.history_input.continuous_update is False  # read on Enter
    assert "history length" in lab.history_slider.description
    figure = lab.figure
    for typed in ("-1e9", "abc", "", "100", "2048", "nan", "1.5"):
        lab.history_input.value = typed
        assert lab.history_input.value == "128", typed  # never blank, never other than the length in use
        assert one_line(lab.error) and lab.error.startswith("the history length must be a power of two from 1 to "
                                                            "1,024, got ") and "the figure still uses 128" in lab.error
        assert lab.error in text(lab.message)
        assert lab.figure is figure and lab.trace.settings["history_len"] == 128
    assert "'-1e9'" not in lab.error  # the message names what was typed last
    lab.history_input.value = "16"  # a length typed: the slider and the figure follow
    assert lab.error is None and lab.history_slider.value == 16 and lab.history_input.value == "16"
    assert_lab_follows(lab, history_len=16)
    assert "16" in lab.figure.layout.title.text
    lab.history_input.value = " 2^5 "
    assert lab.history_slider.value == 32 and lab.history_input.value == "32" and lab.error is None
    lab.history_slider.value = 512  # the slider moved: the box follows
    assert lab.history_input.value == "512"
    lab.recipe_buttons.value = "current"  # the history does not act: its box is disabled with the slider
    assert lab.history_input.disabled and lab.history_slider.disabled
    lab.recipe_buttons.value = "delayed"
    assert not lab.history_input.disabled
    assert "ampviz-fp8-history-input" in lab.history_input._dom_classes and any(
        lab.history_input in w.children and lab.history_slider in w.children for w in descendants(lab.ui)
        if hasattr(w, "children"))  # beside the slider
