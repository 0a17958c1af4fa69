"""RanksLab and plot_ranks, headless: the figure and the table follow the controls exactly as
``simulate_ranks`` predicts; moves from the browser are coalesced; every bad input is a one-line
message."""

import json
import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ampviz.plots import plot_ranks
from ampviz.ranks import MODES, RanksTrace, same_trace, simulate_ranks
from ampviz.scaling import TorchGradScaler
from ampviz.widgets import RanksLab
from ampviz.widgets.ranks_lab import parse_overflow_steps
from widget_checks import move_quickly, one_line, refused, text  # tests/, on the path as pytest runs

FUZZ = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                      HealthCheck.too_slow])
ANYTHING = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
    st.lists(st.integers(), max_size=3), st.tuples(st.integers(), st.integers()), st.just(object()),
    st.just(np.float32(2.0)), st.just(np.arange(3)), st.just(complex(1, 1)),
)





def flags(ranks, rank, steps, at) -> np.ndarray:
    """Own overflows built by hand: only ``rank`` overflows, at the steps ``at``."""
    f = np.zeros((ranks, steps), bool)
    f[rank, list(at)] = True
    return f


def expected(lab_or_kw, found_inf, mode):
    """What simulate_ranks says for the lab's scaler settings."""
    log2_init, interval = lab_or_kw
    return simulate_ranks(TorchGradScaler(init_scale=2.0**log2_init, growth_interval=interval),
                          found_inf=found_inf, mode=mode)


def settings_of(lab):
    return lab.init_slider.value, lab.interval_input.value


def table_rows(lab):
    """The readout table's rows, cell texts, without the header."""
    rows = re.findall(r"<tr>(.*?)</tr>", lab.readout.value)[1:]
    return [[re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)] for row in rows]


def lanes(fig, kind):
    """Per rank, the (x, y) of the figure's trace of ``kind`` (scale, skipped, nonfinite), or None."""
    out = {}
    for t in fig.data:
        if t.meta["kind"] == kind:
            out[t.meta["rank"]] = (np.asarray(t.x), np.asarray(t.y, float))
    return out


def step_line(x, y, steps) -> np.ndarray:
    """A step line (shape "hv") through the points (x, y) read back at every step."""
    return y[np.searchsorted(x, np.arange(steps), side="right") - 1]


def assert_figure_and_table_follow(lab, trace: RanksTrace):
    """The lab shows ``trace`` (computed by the test): its state, every lane of the figure, every
    mark, the table and the summary line."""
    assert lab.error is None
    assert same_trace(lab.trace, trace) and lab.trace.mode == trace.mode
    fig = lab.figure
    assert fig.layout.meta["mode"] == trace.mode and fig.layout.meta["ranks"] == trace.world_size
    scale, skipped, nonfinite = lanes(fig, "scale"), lanes(fig, "skipped"), lanes(fig, "nonfinite")
    assert sorted(scale) == list(range(trace.world_size))
    with np.errstate(divide="ignore"):
        log2 = np.log2(trace.scale)
    log2[trace.scale == 0] = -150
    for r in range(trace.world_size):
        x, y = scale[r]
        assert np.array_equal(step_line(x, y, trace.steps), log2[r])
        want = np.flatnonzero(trace.found_inf[r] & ~trace.nonfinite_step[r])
        got = skipped.get(r, (np.zeros(0, int), None))[0]
        assert np.array_equal(got, want), r
        got = nonfinite.get(r, (np.zeros(0, int), None))[0]
        assert np.array_equal(got, np.flatnonzero(trace.nonfinite_step[r])), r
    rows = table_rows(lab)
    assert len(rows) == trace.world_size
    for r, row in enumerate(rows):
        assert row[0] == f"rank {r}"
        assert row[1].startswith(f"2^{int(np.log2(trace.final_scale[r]))} ") if trace.final_scale[r] > 0 else True
        assert [int(c.replace(",", "")) for c in row[2:]] == [
            int(trace.overflow[r].sum()), int(trace.skipped_count[r]), int(trace.nonfinite_step[r].sum())]
    div = trace.first_divergence
    assert ("agree at every step" in text(lab.readout)) == (div is None)
    if div is not None:
        assert f"differ from step {div:,}" in text(lab.readout)


@pytest.fixture(scope="module")
def lab():
    return RanksLab()


# ----- the lab follows its controls, as simulate_ranks predicts -----
def test_the_lab_starts_as_simulate_ranks_predicts():
    lab = RanksLab(4, mode="ddp", overflow_rank=1, overflow_steps="5, 20", init_scale=2.0**16,
                   growth_interval=10, steps=60)
    want = flags(4, 1, 60, [5, 20])
    assert np.array_equal(lab.found_inf, want) and np.array_equal(lab.overflow_flags(), want)
    assert_figure_and_table_follow(lab, expected((16, 10), want, "ddp"))


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_runs_as_simulate_ranks_predicts(mode):
    lab = RanksLab(3, overflow_rank=2, overflow_steps="4 10-11", init_scale=2.0**10, growth_interval=3, steps=30)
    lab.mode_dropdown.value = mode
    assert_figure_and_table_follow(lab, expected((10, 3), flags(3, 2, 30, [4, 10, 11]), mode))


def test_the_sync_mode_decides_who_skips():
    """What each mode teaches, read off the lab (a lab that ignored the mode fails every line):
    DDP and the synced flag: every rank skips with the one that overflowed and the scales stay
    together; a scaler per rank: only that rank skips and its scale falls behind the others';
    unscale_ first: the clean ranks step on the inf and their weights are poisoned."""
    lab = RanksLab(4, overflow_rank=1, overflow_steps="5", init_scale=2.0**12, growth_interval=4, steps=20)
    labels = dict((m, label) for label, m in RanksLab.MODES)
    assert [m for _, m in lab.mode_dropdown.options] == list(MODES)
    assert labels == {"ddp": "DDP (all-reduce before unscale_)", "synced": "ShardedGradScaler / synced flag",
                      "local": "a scaler per rank, no all-reduce",
                      "unscale_first": "unscale_ + clip before a manual all-reduce"}
    seen = {}
    for mode in MODES:
        lab.mode_dropdown.value = mode
        t = lab.trace
        seen[mode] = t
        assert t.mode == mode and labels[mode] in lab.figure.layout.title.text
    for mode in ("ddp", "synced"):
        t = seen[mode]
        assert t.found_inf[:, 5].all() and t.skipped_count.tolist() == [1, 1, 1, 1]
        assert t.first_divergence is None and not t.nonfinite_step.any()
        assert "agree at every step" in text(lab.readout) or mode != lab.mode
    local = seen["local"]
    assert local.found_inf[:, 5].tolist() == [False, True, False, False]
    assert local.first_divergence == 6 and local.final_scale[1] < local.final_scale[0] == local.final_scale[2]
    first = seen["unscale_first"]
    assert first.nonfinite_step[:, 5].tolist() == [True, False, True, True]
    assert first.poisoned_at == (5, 6, 5, 5)
    assert "Weights inf/NaN: rank 0 from step 5" in text(lab.readout)
    stars = lanes(lab.figure, "nonfinite")
    assert sorted(stars) == [0, 1, 2, 3] and stars[0][0].tolist() == [5]


def test_every_control_redraws():
    lab = RanksLab(2, overflow_rank=1, overflow_steps="3", init_scale=2.0**8, growth_interval=5, steps=25)
    for change, (ranks, rank, at, log2_init, interval, steps) in (
            (lambda: setattr(lab.ranks_slider, "value", 5), (5, 1, [3], 8, 5, 25)),
            (lambda: setattr(lab.rank_dropdown, "value", 4), (5, 4, [3], 8, 5, 25)),
            (lambda: setattr(lab.steps_text, "value", "2, 7-9"), (5, 4, [2, 7, 8, 9], 8, 5, 25)),
            (lambda: setattr(lab.steps_text, "value", "..x"), (5, 4, range(2, 25, 3), 8, 5, 25)),
            (lambda: setattr(lab.init_slider, "value", 20), (5, 4, range(2, 25, 3), 20, 5, 25)),
            (lambda: setattr(lab.interval_input, "value", 2), (5, 4, range(2, 25, 3), 20, 2, 25)),
            (lambda: setattr(lab.steps_input, "value", 40), (5, 4, range(2, 40, 3), 20, 2, 40))):
        before = lab.trace
        change()
        for mode in ("local", "ddp"):  # both: a skip on one rank only, then on every rank
            lab.mode_dropdown.value = mode
            assert_figure_and_table_follow(lab, expected((log2_init, interval), flags(ranks, rank, steps, at), mode))
        assert not same_trace(lab.trace, before)


def test_the_overflowing_rank_follows_the_number_of_ranks():
    lab = RanksLab(8, overflow_rank=6, mode="local")
    assert [v for _, v in lab.rank_dropdown.options] == list(range(8))
    lab.ranks_slider.value = 3  # rank 6 is gone: the last rank overflows
    assert [v for _, v in lab.rank_dropdown.options] == [0, 1, 2] and lab.rank_dropdown.value == 2
    assert lab.trace.overflow[2].any() and not lab.trace.overflow[:2].any()
    lab.rank_dropdown.value = 0
    lab.ranks_slider.value = 6  # rank 0 stays chosen
    assert lab.rank_dropdown.value == 0 and lab.trace.world_size == 6
    assert_figure_and_table_follow(lab, expected((16, 10), flags(6, 0, 60, [5, 20]), "local"))


def test_the_steps_a_learner_types():
    assert np.flatnonzero(parse_overflow_steps("5, 20", 21)).tolist() == [5, 20]
    assert np.flatnonzero(parse_overflow_steps(" 3 7 - 9; 1,", 10)).tolist() == [1, 3, 7, 8, 9]
    assert np.flatnonzero(parse_overflow_steps("..x", 10)).tolist() == [2, 5, 8]
    assert np.flatnonzero(parse_overflow_steps("x. X", 5)).tolist() == [0, 2, 3]
    assert not parse_overflow_steps("  ", 4).any() and parse_overflow_steps("", 4).shape == (4,)
    for bad, message in (("abc", "could not read 'abc' as a step"), ("-5", "could not read '-5'"),
                         ("9-7", "runs backwards"), ("10", "step 10 is beyond the run (steps 0 to 9)"),
                         ("9" * 5000, "is beyond the run"), ("x" * 11, "the pattern is 11 steps long"),
                         ("1.5", "could not read '1.5'")):
        with pytest.raises(ValueError, match=re.escape(message)) as info:
            parse_overflow_steps(bad, 10)
        assert one_line(str(info.value))


@settings(max_examples=60, deadline=None)
@given(at=st.lists(st.integers(0, 49), max_size=8), sep=st.sampled_from([", ", " ", ",", "; "]),
       pattern=st.text(alphabet="x.", min_size=1, max_size=12), use_pattern=st.booleans())
def test_typed_steps_are_the_overflows_simulated(lab, at, sep, pattern, use_pattern):
    lab.steps_input.value = 50
    lab.steps_text.value = pattern if use_pattern else sep.join(map(str, at))
    rank = lab.rank_dropdown.value
    want = np.zeros(50, bool)
    if use_pattern:
        want = np.array([pattern[i % len(pattern)] == "x" for i in range(50)])
    else:
        want[at] = True
    assert lab.error is None
    assert np.array_equal(lab.found_inf[rank], want) and not np.delete(lab.found_inf, rank, axis=0).any()
    assert np.array_equal(lab.trace.overflow[rank], want)


# ----- bad input: a one-line message, the last good figure kept -----
def test_bad_text_shows_a_message_and_keeps_the_last_figure():
    lab = RanksLab()
    good, figure, readout = lab.trace, lab.figure, lab.readout.value
    for bad in ("five", "5, 20, 99", "3-1"):
        lab.steps_text.value = bad
        assert one_line(lab.error) and lab.error in text(lab.message)
        assert lab.trace is good and lab.figure is figure and lab.readout.value == readout
    lab.steps_text.value = "5"
    assert lab.error is None and text(lab.message) == "" and lab.trace.overflow[1].sum() == 1
    lab.steps_text.value = "59"
    lab.steps_input.value = 30  # the typed step is now beyond the run
    assert "step 59 is beyond the run" in lab.error


@FUZZ
@given(ranks=st.integers(-5, 20), mode=st.sampled_from(MODES), rank=st.integers(0, 7),
       typed=st.one_of(st.text(max_size=30), st.from_regex(r"\A[\d ,;.x-]{0,20}\Z"),
                       st.text(alphabet="x. ", max_size=20)),
       log2_init=st.integers(-30, 60), interval=st.integers(-5, 10**8), steps=st.integers(-5, 20_000))
def test_every_control_position_is_valid_or_a_one_line_message(lab, ranks, mode, rank, typed, log2_init,
                                                                 interval, steps):
    lab.ranks_slider.value = ranks  # the slider holds it between 2 and 8
    lab.mode_dropdown.value = mode
    lab.rank_dropdown.value = min(rank, lab.ranks_slider.value - 1)
    lab.init_slider.value = log2_init  # held between -10 and 40
    lab.interval_input.value = interval  # held between 1 and 10^7
    lab.steps_input.value = steps  # held between 1 and 10,000
    lab.steps_text.value = typed
    n, s = lab.ranks_slider.value, lab.steps_input.value
    assert 2 <= n <= 8 and 1 <= s <= 10_000 and -10 <= lab.init_slider.value <= 40
    try:
        own = parse_overflow_steps(typed, s)
    except ValueError as e:
        # the message, and that the figure and table still show the last text that could be read
        assert lab.error.startswith(f"{e}. Not applied: the figure and table still show ") and one_line(lab.error)
        return
    assert lab.error is None
    want = np.zeros((n, s), bool)
    want[lab.rank_dropdown.value] = own
    assert same_trace(lab.trace, expected(settings_of(lab), want, mode))
    assert lab.figure.layout.meta["steps"] == s and len(table_rows(lab)) == n


@settings(max_examples=80, deadline=None)
@given(kwargs=st.dictionaries(st.sampled_from(["ranks", "mode", "overflow_rank", "overflow_steps", "init_scale",
                                               "growth_interval", "steps"]), ANYTHING, max_size=3))
def test_every_constructor_argument_is_valid_or_a_one_line_message(kwargs):
    if isinstance(kwargs.get("steps"), int) and not isinstance(kwargs["steps"], bool) and kwargs["steps"] > 30:
        kwargs["steps"] = 30  # a valid size; keeps the test quick
    if refused(lambda: RanksLab(**kwargs)) is None:
        lab = RanksLab(**kwargs)
        assert lab.error is None and isinstance(lab.trace, RanksTrace)


@pytest.mark.parametrize("kwargs, message", [
    (dict(ranks=1), "ranks must be between 2 and 8"),
    (dict(ranks=9), "ranks must be between 2 and 8"),
    (dict(mode="allreduce"), "mode must be one of 'ddp', 'synced', 'local', 'unscale_first'"),
    (dict(overflow_rank=4), "overflow_rank must be between 0 and 3"),
    (dict(overflow_steps="x!"), "could not read 'x!' as a step"),
    (dict(overflow_steps=[3, 99]), "an overflow step must be between 0 and 59"),
    (dict(overflow_steps=5), "overflow_steps must be text"),
    (dict(init_scale=1000.0), "init_scale must be a power of two from 2^-10 to 2^40"),
    (dict(growth_interval=0), "growth_interval must be between 1 and"),
    (dict(steps=10_001), "steps must be between 1 and 10,000"),
])
def test_the_constructor_says_what_is_wrong(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=re.escape(message)) as info:
        RanksLab(**kwargs)
    assert one_line(str(info.value))


def test_constructor_takes_a_list_of_steps():
    lab = RanksLab(overflow_steps=[3, 7], steps=10)
    assert lab.steps_text.value == "3, 7" and np.flatnonzero(lab.found_inf[1]).tolist() == [3, 7]


# ----- one view, updated in place; moves from the browser coalesced -----
def _sent(view):
    from ampviz.widgets.figureview import _to_json

    return json.dumps([_to_json(view.data, view), _to_json(view.figure_layout, view)], sort_keys=True)


def test_the_figure_is_updated_in_place_in_one_view_and_classes_are_stable():
    from ampviz.widgets.figureview import FigureView

    lab = RanksLab()
    view = lab.view
    assert isinstance(view, FigureView) and view in lab.ui.children
    sent = []
    view.observe(lambda c: sent.append(c["name"]), names=["data", "figure_layout"])
    lab.rank_dropdown.value = 2  # DDP: the same scales on every rank, new hover texts: only the traces travel
    assert lab.view is view and sent == ["data"]
    lab.mode_dropdown.value = "local"  # a new title: the layout too
    assert sent[1:] == ["data", "figure_layout"]
    assert _sent(view) == _sent(RanksLab(mode="local", overflow_rank=2).view)
    classes = {c for w in (lab.ranks_slider, lab.mode_dropdown, lab.rank_dropdown, lab.steps_text, lab.init_slider,
                           lab.interval_input, lab.steps_input, lab.readout, lab.view, lab.ui, lab.message)
               for c in w._dom_classes}
    assert {"ampviz-ranks-count", "ampviz-ranks-mode", "ampviz-ranks-overflow-rank", "ampviz-ranks-overflow-steps",
            "ampviz-ranks-init", "ampviz-ranks-interval", "ampviz-ranks-steps", "ampviz-ranks-readout",
            "ampviz-ranks-figure", "ampviz-ranks-lab", "ampviz-message"} <= classes
    assert "application/vnd.jupyter.widget-view+json" in lab._repr_mimebundle_()


@pytest.mark.parametrize("slider, values", [("init_slider", list(range(1, 11))),
                                            ("ranks_slider", [3, 4, 5, 6, 7, 8, 7, 6, 5, 4])])
def test_browser_moves_are_coalesced_and_the_last_position_wins(slider, values, monkeypatch):
    """Ten moves from the browser (``set_state``, as the front end sends them) while the lab
    computes: the intermediate positions are dropped; the figure, the table and the state end at
    the final position's, equal to a fresh lab's there and not to the one before it."""
    lab = RanksLab(2, mode="local")
    move_quickly(lab, slider, values, monkeypatch)
    kw = {"init_scale": 2.0 ** values[-1]} if slider == "init_slider" else {"ranks": values[-1]}
    before = {"init_scale": 2.0 ** values[-2]} if slider == "init_slider" else {"ranks": values[-2]}
    fresh = RanksLab(**({"ranks": 2} | kw), mode="local")
    assert same_trace(lab.trace, fresh.trace) and lab.readout.value == fresh.readout.value
    assert _sent(lab.view) == _sent(fresh.view)
    assert _sent(lab.view) != _sent(RanksLab(**({"ranks": 2} | before), mode="local").view)
    if slider == "ranks_slider":
        assert [v for _, v in lab.rank_dropdown.options] == list(range(values[-1]))


def test_a_move_made_in_python_redraws_before_it_returns():
    lab = RanksLab()
    lab.init_slider.value = 3
    assert lab._worker is None and lab.trace.scale[0, 0] == 8.0 and lab.settle(0)


def test_the_next_positions_are_drawn_ahead_and_are_exact():
    lab = RanksLab(mode="local")
    lab.init_slider.set_state({"value": 17})
    assert lab.settle(30)
    keys = [dict(k)["log2_init"] for k in lab._drawn_states]
    assert 18 in keys and 16 in keys and keys.index(18) < keys.index(16)
    lab.init_slider.set_state({"value": 18})
    assert lab.settle(30)
    fresh = RanksLab(mode="local", init_scale=2.0**18)
    assert _sent(lab.view) == _sent(fresh.view) and lab.readout.value == fresh.readout.value
    assert len(lab._drawn_states) <= lab.KEPT_DRAWN


def test_a_browser_move_that_fails_shows_its_message():
    lab = RanksLab(steps=60, overflow_steps="50")
    lab.steps_input.set_state({"value": 40})
    assert lab.settle(30)
    assert "step 50 is beyond the run" in lab.error and lab.error in text(lab.message)


# ----- plot_ranks -----
def _trace(mode="unscale_first", ranks=3, steps=40, at=(5, 20), rank=1, log2_init=10, interval=4):
    return simulate_ranks(TorchGradScaler(init_scale=2.0**log2_init, growth_interval=interval),
                          found_inf=flags(ranks, rank, steps, at), mode=mode)


def test_plot_ranks_draws_a_lane_per_rank_on_one_range():
    t = _trace("local", ranks=4)
    fig = plot_ranks(t)
    axes = [fig.layout[f"yaxis{'' if r == 0 else r + 1}"] for r in range(4)]
    assert [a.title.text for a in axes] == ["rank 0", "rank 1", "rank 2", "rank 3"]
    assert all(a.range == axes[0].range and a.tickprefix == "2^" and float(a.dtick).is_integer() for a in axes)
    tops = [a.domain[1] for a in axes]
    assert tops == sorted(tops, reverse=True) and all(a.domain[0] < a.domain[1] for a in axes)
    assert [t.yaxis for t in fig.data if t.meta["kind"] == "scale"] == ["y", "y2", "y3", "y4"]
    lo, hi = axes[0].range
    assert lo < np.log2(t.scale).min() and hi > np.log2(t.scale).max()
    assert fig.layout.meta["first_divergence"] == 6 and "differ from step 6" in fig.layout.annotations[-1].text
    assert fig.layout.title.text == "Loss scale per rank (local, 4 ranks)"
    assert plot_ranks(t, title="mine").layout.title.text == "mine"


def test_plot_ranks_marks_skips_and_poisoned_steps():
    t = _trace("unscale_first")
    fig = plot_ranks(t)
    skipped, stars = lanes(fig, "skipped"), lanes(fig, "nonfinite")
    assert stars[0][0].tolist() == [5] and stars[1][0].tolist() == [6] and stars[2][0].tolist() == [5]
    for r in range(3):
        assert np.array_equal(skipped[r][0], np.flatnonzero(t.found_inf[r] & ~t.nonfinite_step[r]))
    hover = [tr.hovertext for tr in fig.data if tr.meta == {"rank": 0, "kind": "nonfinite"}][0]
    assert "inf/NaN from another rank" in hover[0]
    shaded = [s for s in fig.layout.shapes if s.type == "rect"]
    assert [s.x0 for s in shaded] == [5, 6, 5] and fig.layout.meta["poisoned_at"] == [5, 6, 5]
    ddp = plot_ranks(_trace("ddp"))
    hover = [tr.hovertext for tr in ddp.data if tr.meta == {"rank": 0, "kind": "skipped"}][0]
    assert hover[0].startswith("rank 0 · step 5 skipped: another rank's overflow")
    hover = [tr.hovertext for tr in ddp.data if tr.meta == {"rank": 1, "kind": "skipped"}][0]
    assert "skipped: its own overflow" in hover[0]
    assert not lanes(ddp, "nonfinite") and "agree at every step" in ddp.layout.annotations[-1].text
    legend = [tr.name for tr in fig.data if tr.showlegend is not False]
    assert legend == ["loss scale", "skipped", "stepped on inf/NaN (weights poisoned)"]


def test_plot_ranks_thins_marks_on_long_runs():
    from ampviz.plots import RANK_MARKS

    t = _trace("unscale_first", steps=5000, at=range(0, 5000, 2))
    fig = plot_ranks(t)
    for kind, (x, _) in lanes(fig, "skipped").items():
        assert x.size <= RANK_MARKS
    assert any("shown" in tr.name for tr in fig.data if tr.meta["kind"] == "skipped")


@pytest.mark.parametrize("bad", [None, np.zeros((2, 3)), "ddp", 3])
def test_plot_ranks_refuses_what_is_not_a_ranks_trace(bad):
    with pytest.raises(TypeError, match="RanksTrace"):
        plot_ranks(bad)
    with pytest.raises(TypeError, match="title"):
        plot_ranks(_trace(), title=3)


def _wire_and_json(fig):
    import plotly.io as pio

    from ampviz.widgets.figureview import pack

    return json.dumps(pack(fig.to_plotly_json()), sort_keys=True), json.loads(pio.to_json(fig))


@settings(max_examples=30, deadline=None)
@given(mode=st.sampled_from(MODES), ranks=st.integers(1, 8), steps=st.integers(1, 300),
       at=st.lists(st.integers(0, 299), max_size=6), log2_init=st.integers(-10, 40), interval=st.integers(1, 20))
def test_plot_ranks_holds_what_validation_gives(mode, ranks, steps, at, log2_init, interval):
    import plotly.graph_objects as go

    t = _trace(mode, ranks=ranks, steps=steps, at=[a for a in at if a < steps], rank=ranks - 1,
               log2_init=log2_init, interval=interval)
    fig = plot_ranks(t)
    assert _wire_and_json(fig) == _wire_and_json(go.Figure(fig.to_plotly_json()))


def test_plots_and_the_lab_module_stay_free_of_torch():
    """plot_ranks never imports ampviz.ranks (torch); the lab loads it only when one is made."""
    code = ("import sys, ampviz.plots, ampviz.widgets, ampviz.widgets.ranks_lab; "
            "assert 'torch' not in sys.modules, 'torch'")
    subprocess.run([sys.executable, "-c", code], check=True)


# ----- the all-reduce dtype: fp32 (DDP's default), fp16_compress_hook, a bf16 hook -----
def hook_expected(lab_or_kw, found_inf, mode, reduce_dtype, log2_grad):
    """The lab's model for its settings (``simulate_lab``)."""
    from ampviz.widgets.ranks_lab import simulate_lab

    log2_init, interval = lab_or_kw
    return simulate_lab(TorchGradScaler(init_scale=2.0**log2_init, growth_interval=interval), found_inf,
                        2.0**log2_grad, mode, reduce_dtype)


def test_the_all_reduce_dtype_starts_at_fp32_and_changes_nothing_there():
    lab = RanksLab()
    assert lab.reduce_dtype == "fp32" and lab.grad_max == 1.0 and not lab.reduce_dropdown.disabled
    assert [d for _, d in lab.reduce_dropdown.options] == ["fp32", "fp16", "bf16"]
    assert_figure_and_table_follow(lab, expected((16, 10), flags(4, 1, 60, [5, 20]), "ddp"))
    assert "fp16_compress_hook" not in text(lab.readout)


@settings(max_examples=60, deadline=None)
@given(mode=st.sampled_from(MODES), ranks=st.integers(2, 8), rank=st.integers(0, 7), steps=st.integers(1, 300),
       p=st.sampled_from([0.0, 0.05, 0.5, 1.0]), log2_init=st.integers(-10, 40),
       interval=st.sampled_from([1, 2, 10, 1000]), seed=st.integers(0, 2**16))
def test_the_fp32_all_reduce_reproduces_simulate_ranks_exactly(mode, ranks, rank, steps, p, log2_init, interval,
                                                               seed):
    """fp32 with max|g| = 1 (the lab's default) is today's model exactly, in every mode (a float32
    scale stays below 2^128); so is any dtype outside the DDP mode (no DDP all-reduce there)."""
    from ampviz.widgets.ranks_lab import simulate_lab

    f = np.zeros((ranks, steps), bool)
    f[min(rank, ranks - 1)] = np.random.default_rng(seed).random(steps) < p
    policy = TorchGradScaler(init_scale=2.0**log2_init, growth_interval=interval)
    want = simulate_ranks(policy, found_inf=f, mode=mode)
    assert same_trace(simulate_lab(policy, f, 1.0, mode, "fp32"), want)
    if mode != "ddp":
        for d in ("fp16", "bf16"):
            assert same_trace(simulate_lab(policy, f, 2.0**8, mode, d), simulate_lab(policy, f, 2.0**8, mode, "fp32"))


def test_the_fp16_hook_skips_every_step_whose_scaled_gradients_reach_65520_on_every_rank():
    """DDP, max|g| = 1, scale from 2^16: fp16_compress_hook casts S·g before dividing, so every
    step at scale 2^16 (65,536 >= 65,520) is skipped by every rank; the fp32 all-reduce and the bf16
    hook skip only the typed overflows, and their scale climbs higher."""
    lab = RanksLab(4, overflow_rank=1, overflow_steps="5, 20", init_scale=2.0**16, growth_interval=10, steps=60)
    fp32 = lab.trace
    lab.reduce_dropdown.value = "fp16"
    t = lab.trace
    assert_figure_and_table_follow(lab, hook_expected((16, 10), flags(4, 1, 60, [5, 20]), "ddp", "fp16", 0))
    assert (t.found_inf == t.found_inf[:1]).all() and t.first_divergence is None  # every rank, together
    typed = np.zeros(60, bool)
    typed[[5, 20]] = True
    assert np.array_equal(t.found_inf[0], typed | (t.scale[0] * 1.0 >= 65520))
    assert t.found_inf[0, 0] and t.scale[0, 1] == 2.0**15  # 2^16 · 1 overflows the cast at once
    assert t.skipped_count[0] > fp32.skipped_count[0] and t.final_scale[0] < fp32.final_scale[0]
    assert t.scale.max() == 2.0**16 and fp32.scale.max() > 2.0**16
    assert "fp16_compress_hook every rank skips" in text(lab.readout) and "65,520" in text(lab.readout)
    assert "fp16 all-reduce" in lab.figure.layout.title.text
    lab.reduce_dropdown.value = "bf16"
    assert same_trace(lab.trace, fp32)  # bf16's range is fp32's: no extra skip here
    lab.reduce_dropdown.value = "fp16"
    lab.steps_input.value = 200
    lab.grad_slider.value = -4  # gradients 16 times smaller: the scale settles 16 times higher
    t = lab.trace
    assert t.scale.max() == 2.0**20 and t.found_inf[0, t.scale[0] == 2.0**20].all() and t.final_scale[0] >= 2.0**19


def test_the_dtype_acts_in_the_ddp_mode_only_and_says_so():
    lab = RanksLab(reduce_dtype="fp16", mode="local")
    assert lab.reduce_dropdown.disabled and "DDP mode only" in lab.reduce_dropdown.tooltip
    assert "acts in the DDP mode only" in text(lab.readout)
    assert_figure_and_table_follow(lab, expected((16, 10), flags(4, 1, 60, [5, 20]), "local"))
    for mode in MODES:
        lab.mode_dropdown.value = mode
        assert lab.reduce_dropdown.disabled == (mode != "ddp") and lab.error is None
        if mode != "ddp":
            assert same_trace(lab.trace, expected((16, 10), flags(4, 1, 60, [5, 20]), mode))
    lab.mode_dropdown.value = "ddp"
    assert lab.trace.skipped_count[0] > expected((16, 10), flags(4, 1, 60, [5, 20]), "ddp").skipped_count[0]


def test_the_cast_rule_at_the_boundaries():
    from ampviz.widgets.ranks_lab import cast_overflows

    # f32(S·g) is what the hook casts: fp16 keeps 65,504 and everything that rounds below 65,520
    assert cast_overflows(np.array([65504.0, 65519.0, 65520.0, 65536.0]), 1.0, "fp16").tolist() == \
        [False, False, True, True]
    assert not cast_overflows(2.0**15, 1.999, "fp16") and cast_overflows(2.0**15, 2.0, "fp16")
    for d in ("fp32", "bf16"):
        assert not cast_overflows(2.0**16, 2.0**30, d) and cast_overflows(2.0**127, 2.0, d)
    assert not cast_overflows(2.0**127, 1.99, "bf16")  # bf16 keeps its largest, 1.9921875 * 2^127
    assert cast_overflows(2.0**127, 1.997, "bf16") and not cast_overflows(2.0**127, 1.997, "fp32")  # bf16 rounds up
    assert cast_overflows(1.0, np.inf, "fp32")
    for bad in ("fp8", None, 16):
        assert "reduce_dtype must be one of 'fp32', 'fp16', 'bf16'" in refused(lambda: cast_overflows(1.0, 1.0, bad))


def _per_step_rule(scale, g, ws, divide_first=False):
    """Per step: does some rank's gradient become inf in the fp16 hook? ``g``: (ranks, steps) max|g|."""
    if not divide_first:
        from ampviz.widgets.ranks_lab import cast_overflows

        return cast_overflows(scale[None, :], g, "fp16").any(axis=0)
    with np.errstate(over="ignore"):  # the wrong order: S·g / world_size, then the cast
        y = (scale[None, :].astype(np.float32) * g.astype(np.float32)) / np.float32(ws)
        return (~np.isfinite(y.astype(np.float16))).any(axis=0)


@pytest.mark.parametrize("ws", [2, 3, 4])
def test_the_labs_skips_are_the_compress_hooks(ws):
    """For the same scale and gradients (N(0, 1) per rank and step, as the hook run uses), the lab's
    model (each rank's max|g|, ``simulate_lab`` in DDP mode) skips exactly where
    ``simulate_compress_hook`` (the full cast, divide and gloo all-reduce, held to real DDP in
    test_ranks.py) finds inf/NaN, step for step with the same scales, for fp32, fp16 and bf16. The
    wrong order, dividing by the world size before the cast, disagrees."""
    from ampviz import ranks as R
    from ampviz.widgets.ranks_lab import simulate_lab

    length, steps, seed = 2048, 8, 3
    g = np.array([[np.abs(R._compress_grads(seed, r, t, length)).max() for t in range(steps)] for r in range(ws)])
    wrong_differs = False
    for init in (2.0**13, 2.0**14, 2e4, 3e4, 4e4, 2.0**16, 2.0**125, 2.0**126):
        for hook, dtype in ((None, "fp32"), ("fp16", "fp16"), ("bf16", "bf16")):
            sim = R.simulate_compress_hook(hook, world_size=ws, steps=steps, init_scale=init, length=length,
                                           seed=seed, growth_interval=1)
            lab = simulate_lab(TorchGradScaler(init_scale=init, growth_interval=1), np.zeros((ws, steps), bool), g,
                               "ddp", dtype)
            assert np.array_equal(lab.scale[0], sim.scale) and np.array_equal(lab.found_inf[0], sim.skipped), \
                (init, dtype, lab.found_inf[0], sim.skipped)
            if dtype == "fp16":
                assert np.array_equal(_per_step_rule(sim.scale, g, ws), sim.skipped)
                wrong_differs |= not np.array_equal(_per_step_rule(sim.scale, g, ws, divide_first=True), sim.skipped)
    assert wrong_differs


def test_the_labs_rule_agrees_with_the_real_fp16_compress_hook():
    """A small real DDP run (2 gloo ranks, fp16_compress_hook, GradScaler from 2^15, growth every
    step): the lab's model gives its scales and skips; dividing before the cast does not."""
    from ampviz import ranks as R
    from ampviz.widgets.ranks_lab import simulate_lab

    ws, steps, length = 2, 6, 256
    real = R.run_compress_hook("fp16", world_size=ws, steps=steps, init_scale=2.0**15, length=length,
                               growth_interval=1)
    assert real.ranks_agree and real.skipped.any() and not real.skipped.all()
    g = np.array([[np.abs(R._compress_grads(0, r, t, length)).max() for t in range(steps)] for r in range(ws)])
    lab = simulate_lab(TorchGradScaler(init_scale=2.0**15, growth_interval=1), np.zeros((ws, steps), bool), g,
                       "ddp", "fp16")
    assert np.array_equal(lab.scale[0], real.scale) and np.array_equal(lab.found_inf[0], real.skipped)
    assert not np.array_equal(_per_step_rule(real.scale, g, ws, divide_first=True), real.skipped)


@pytest.fixture(scope="module")
def hook_lab():
    return RanksLab()


@FUZZ
@given(mode=st.sampled_from(MODES), reduce_dtype=st.sampled_from(["fp32", "fp16", "bf16"]),
       log2_grad=st.integers(-40, 40), log2_init=st.integers(-30, 60), interval=st.integers(-5, 50),
       steps=st.integers(-5, 400), typed=st.sampled_from(["", "5", "..x", "3-7", "99"]))
def test_every_dtype_and_gradient_position_is_valid_or_a_one_line_message(hook_lab, mode, reduce_dtype, log2_grad,
                                                                         log2_init, interval, steps, typed):
    from ampviz.widgets.ranks_lab import cast_overflows

    lab = hook_lab
    lab.mode_dropdown.value = mode
    lab.reduce_dropdown.value = reduce_dtype
    lab.grad_slider.value = log2_grad  # held between -30 and 30
    lab.init_slider.value = log2_init
    lab.interval_input.value = interval
    lab.steps_input.value = steps
    lab.steps_text.value = typed
    n, s, k = lab.ranks_slider.value, lab.steps_input.value, lab.grad_slider.value
    assert -30 <= k <= 30 and lab.reduce_dropdown.disabled == (mode != "ddp")
    try:
        own = parse_overflow_steps(typed, s)
    except ValueError as e:
        # the message, and that the figure and table still show the last text that could be read
        assert lab.error.startswith(f"{e}. Not applied: the figure and table still show ") and one_line(lab.error)
        return
    assert lab.error is None
    want = np.zeros((n, s), bool)
    want[lab.rank_dropdown.value] = own
    t = lab.trace
    assert same_trace(t, hook_expected(settings_of(lab), want, mode, reduce_dtype, k))
    if mode == "ddp":  # a step is skipped when a rank's backward or its cast overflowed
        live = ~np.isnan(t.scale[0])
        rule = own | cast_overflows(np.nan_to_num(t.scale[0]), 2.0**k, reduce_dtype)
        assert np.array_equal(t.found_inf[0][live], rule[live])


@pytest.mark.parametrize("kwargs, message", [
    (dict(reduce_dtype="fp8"), "reduce_dtype must be one of 'fp32', 'fp16', 'bf16'"),
    (dict(reduce_dtype=None), "reduce_dtype must be one of"),
    (dict(grad_max=3.0), "grad_max must be a power of two from 2^-30 to 2^30"),
    (dict(grad_max=2.0**31), "grad_max must be a power of two from 2^-30 to 2^30"),
    (dict(grad_max="big"), "grad_max"),
])
def test_the_constructor_says_what_is_wrong_with_the_dtype_or_the_gradients(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=re.escape(message)) as info:
        RanksLab(**kwargs)
    assert one_line(str(info.value))


def test_the_constructor_takes_the_dtype_and_the_gradients():
    lab = RanksLab(reduce_dtype="fp16", grad_max=2.0**-4, steps=30)
    assert lab.reduce_dtype == "fp16" and lab.grad_slider.value == -4 and lab.error is None
    assert same_trace(lab.trace, hook_expected((16, 10), flags(4, 1, 30, [5, 20]), "ddp", "fp16", -4))
    assert {"ampviz-ranks-reduce-dtype", "ampviz-ranks-grad"} <= set(lab.reduce_dropdown._dom_classes) | \
        set(lab.grad_slider._dom_classes)


def test_the_gradient_slider_is_drawn_ahead():
    lab = RanksLab(reduce_dtype="fp16")
    lab.grad_slider.set_state({"value": 2})
    assert lab.settle(30)
    keys = [dict(k)["log2_grad"] for k in lab._drawn_states]
    assert 3 in keys and 1 in keys
    lab.grad_slider.set_state({"value": 3})
    assert lab.settle(30)
    fresh = RanksLab(reduce_dtype="fp16", grad_max=8.0)
    assert _sent(lab.view) == _sent(fresh.view) and lab.readout.value == fresh.readout.value


@pytest.mark.parametrize("dropdown, message", [
    ("reduce_dropdown", "choose the all-reduce dtype: fp32, fp16 or bf16"),
    ("mode_dropdown", "choose how the ranks sync: DDP, a synced flag, a scaler per rank, or unscale_ before the "
                      "all-reduce"),
])
def test_a_dropdown_left_empty_says_what_to_choose(dropdown, message):
    lab = RanksLab(steps=30)
    trace, figure = lab.trace, lab.figure
    getattr(lab, dropdown).value = None  # what a dropdown holds with nothing chosen
    assert lab.error == message and text(lab.message) == f"⚠ {message}"
    assert lab.trace is trace and lab.figure is figure  # the last good figure stays
    getattr(lab, dropdown).value = getattr(lab, dropdown).options[1][1]
    assert lab.error is None and lab.trace is not trace


@FUZZ
@given(mode=st.sampled_from([None, *MODES]), reduce_dtype=st.sampled_from([None, "fp32", "fp16", "bf16"]),
       rank=st.sampled_from([None, 0, 1, 3]))
def test_every_dropdown_position_is_valid_or_a_one_line_message(hook_lab, mode, reduce_dtype, rank):
    lab = hook_lab
    lab.ranks_slider.value, lab.steps_text.value, lab.steps_input.value = 4, "5", 30
    lab.mode_dropdown.value, lab.reduce_dropdown.value, lab.rank_dropdown.value = mode, reduce_dtype, rank
    if mode is None or reduce_dtype is None:
        assert one_line(lab.error) and lab.error.startswith("choose ")
        return
    assert lab.error is None
    want = np.zeros((lab.ranks_slider.value, 30), bool)
    want[rank or 0, 5] = True
    assert same_trace(lab.trace, hook_expected(settings_of(lab), want, mode, reduce_dtype, lab.grad_slider.value))


# ----- the box, the message and the figure agree -----
def test_text_that_cannot_be_read_is_not_applied_and_the_message_says_what_is_shown():
    """Typing "1e309": the box is read on Enter, not keystroke by keystroke, so the "1" typed on
    the way never reaches the figure from the browser; and text that cannot be read keeps the last
    good figure and table, the message saying that the box is not applied and what they show."""
    lab = RanksLab()
    assert lab.steps_text.continuous_update is False
    assert "Simulated: rank 1 overflows at steps 5, 20." in text(lab.readout)
    lab.steps_text.value = "1"  # as if "1" had been applied (Enter pressed after it)
    trace, figure, readout = lab.trace, lab.figure, lab.readout.value
    assert "Simulated: rank 1 overflows at step 1." in text(lab.readout)
    lab.steps_text.value = "1e309"
    assert lab.steps_text.value == "1e309"  # the box keeps what was typed
    assert lab.error == ("could not read '1e309' as a step: type steps such as '5, 20', a range such as '7-9', "
                         "or a pattern such as '..x' (x: an overflow). Not applied: the figure and table still "
                         "show rank 1 overflowing at step 1 (of 60 steps)")
    assert one_line(lab.error) and lab.error in text(lab.message)
    assert lab.trace is trace and lab.figure is figure and lab.readout.value == readout
    assert np.flatnonzero(lab.found_inf[1]).tolist() == [1]  # what the message says is what is shown
    lab.steps_text.value = "13"
    assert lab.error is None and "Simulated: rank 1 overflows at step 13." in text(lab.readout)
    lab.steps_input.value = 10  # the steps typed now lie beyond the run
    assert lab.error.startswith("step 13 is beyond the run (steps 0 to 9)")
    assert lab.error.endswith("Not applied: the figure and table still show rank 1 overflowing at step 13 "
                              "(of 60 steps)")
    assert lab.figure.layout.meta["steps"] == 60


def test_the_readout_names_the_overflows_simulated():
    from ampviz.widgets.ranks_lab import overflow_summary

    assert overflow_summary(np.zeros(5, bool)) == "no step"
    assert overflow_summary(parse_overflow_steps("3", 10)) == "step 3"
    assert overflow_summary(parse_overflow_steps("..x", 60)) == "steps 2, 5, 8, 11, 14, 17, … (20 in all)"
    lab = RanksLab(overflow_steps="", steps=30)
    assert "Simulated: rank 1 never overflows." in text(lab.readout)
    lab.steps_text.value = "x!"
    assert lab.error.endswith(". Not applied: the figure and table still show no overflow (of 30 steps)")
