"""BrowserFp8ScalingLab's Python side: the settings it holds give the same stream, run, readout and
figure as Fp8ScalingLab at the same settings; the pieces shipped rebuild lab_stream at every spike
size and non-finite choice; a seed set from Python has its stream shipped first; bad arguments
and settings are one-line errors in Fp8ScalingLab's words, and a refused setting changes nothing."""

import base64

import numpy as np
import pytest
import traitlets
from hypothesis import given, settings, strategies as st

from ampviz.plots.style import figure_config
from ampviz.widgets.base import _in_column
from ampviz.widgets.browser_fp8_lab import SETTINGS, BrowserFp8ScalingLab
from ampviz.widgets.fp8_lab import Fp8ScalingLab, lab_stream, readout_html
from browser_state_helpers import same_figure_json, same_refusal  # tests/widgets/, on the path as pytest runs


def same_run(a, b) -> None:
    for k in ("amax", "scale", "frozen", "saturated", "underflowed", "subnormal"):
        assert np.array_equal(getattr(a, k), getattr(b, k), equal_nan=k in ("amax", "scale")), k
    assert a.settings == b.settings and a.recipe == b.recipe and a.fmt == b.fmt


@pytest.mark.parametrize("kw", [
    {},
    {"recipe": "current", "fmt": "fp8_e5m2", "nonfinite": "nan", "seed": 5},
    {"history_len": 16, "algo": "most_recent", "margin": -3, "spike_log2": 16, "nonfinite": "inf", "seed": 2},
    {"history_len": 1, "margin": 8, "spike_log2": 0, "fmt": "fp8_e5m2"},
])
def test_it_shows_what_fp8_scaling_lab_shows(kw):
    lab, ref = BrowserFp8ScalingLab(**kw), Fp8ScalingLab(**kw)
    assert lab.settings() == ref.settings()
    stream, trace = lab.simulate()
    assert all(np.array_equal(getattr(stream, k), getattr(ref.stream, k))
               for k in ("base", "magnitude", "spike", "nonfinite"))
    same_run(trace, ref.trace)
    assert lab.readout_html() == ref.readout.value
    same_figure_json(lab.figure(), ref.figure)


def test_settings_moved_are_read_by_python():
    lab, ref = BrowserFp8ScalingLab(), Fp8ScalingLab()
    for name, widget, value in (("spike_log2", "spike_slider", 12), ("margin", "margin_slider", 2),
                                ("history_len", "history_slider", 64), ("nonfinite", "nonfinite_dropdown", "inf"),
                                ("recipe", "recipe_buttons", "current")):
        setattr(lab, name, value)
        getattr(ref, widget).value = value
        assert lab.settings() == ref.settings()
        same_run(lab.trace, ref.trace)
        assert lab.readout_html() == ref.readout.value
    same_figure_json(lab.figure(), ref.figure)


def rebuilt(shipped: dict, k: int, nonfinite: str) -> tuple:
    """lab_stream's sorted |base|, magnitude and non-finite steps, from the pieces, as the page
    rebuilds them."""
    f32 = lambda b: np.frombuffer(base64.b64decode(b), "<f4")  # noqa: E731
    magnitude = f32(shipped["magnitude"]).copy()
    spikes = shipped["spikes"]
    lo = BrowserFp8ScalingLab.SPIKE_RANGE[0]
    magnitude[spikes] = f32(shipped["spike_magnitudes"]).reshape(-1, len(spikes))[k - lo] if spikes else []
    bad = np.zeros(magnitude.size, np.uint8)
    bad[shipped["inf_steps"] if nonfinite == "inf" else []] = 1
    bad[shipped["nan_steps"] if nonfinite == "nan" else []] = 2
    return f32(shipped["sorted_abs"]), magnitude, bad


def test_the_shipped_pieces_rebuild_the_stream_at_every_spike_and_non_finite_choice():
    lab = BrowserFp8ScalingLab(seed=9)
    assert set(lab.streams) == {"0", "1", "2", "3", "9"}
    lo, hi = BrowserFp8ScalingLab.SPIKE_RANGE
    for seed in (9, 1):
        spikes = 0
        for k in range(lo, hi + 1):
            for nonfinite in ("none", "inf", "nan"):
                want = lab_stream(seed, k, nonfinite)
                sorted_abs, magnitude, bad = rebuilt(lab.streams[str(seed)], k, nonfinite)
                assert np.array_equal(sorted_abs.view(np.uint32), want.sorted_abs.view(np.uint32))
                assert np.array_equal(magnitude.view(np.uint32), want.magnitude.view(np.uint32)), (seed, k)
                assert np.array_equal(bad, want.nonfinite), (seed, k, nonfinite)
                spikes += int(want.spike.sum())
        assert spikes > 0 and lab.streams[str(seed)]["inf_steps"]  # the table and the steps are not empty
    # a seed set from Python is shipped first; the settings, options and look the page draws with
    lab.seed = 123_456
    assert "123456" in lab.streams and lab.seed == 123_456
    assert lab.options["history_lengths"] == list(Fp8ScalingLab.HISTORY_LENGTHS)
    assert lab.options["steps"] == Fp8ScalingLab.STEPS and lab.options["size"] == Fp8ScalingLab.SIZE
    assert lab.template == lab.figure().to_plotly_json()["layout"]["template"]
    assert lab.config == figure_config()
    assert "fp8_lab_view.mjs" in lab._esm and "export default" in lab._esm


ARGUMENT_CASES = [
    {"recipe": "late"}, {"recipe": None}, {"fmt": "fp16"}, {"nonfinite": "inf steps"}, {"algo": "mean"},
    {"history_len": 3}, {"history_len": 2048}, {"history_len": 0}, {"history_len": 16.5}, {"history_len": "16"},
    {"margin": 9}, {"margin": -5}, {"margin": 1.5}, {"spike_log2": 17}, {"spike_log2": True},
    {"seed": -1}, {"seed": 2**32}, {"seed": "3"}, {"seed": None},
]


@pytest.mark.parametrize("kw", ARGUMENT_CASES)
def test_bad_arguments_are_fp8_scaling_labs_errors_in_one_line(kw):
    same_refusal(lambda: BrowserFp8ScalingLab(**kw), lambda: Fp8ScalingLab(**kw))


def test_bad_settings_are_refused_in_one_line_and_change_nothing():
    lab = BrowserFp8ScalingLab(margin=2)
    before = {k: getattr(lab, k) for k in SETTINGS}
    for name, value, words in (("margin", 9, "margin must be between -4 and 8, got 9"),
                               ("history_len", 48, "history_len must be a power of two from 1 to 1,024, got 48"),
                               ("recipe", "late", "recipe must be one of 'delayed', 'current', got 'late'"),
                               ("seed", 1.5, "seed must be a whole number, got 1.5")):
        with pytest.raises(traitlets.TraitError) as e:
            setattr(lab, name, value)
        assert str(e.value) == words
        assert {k: getattr(lab, k) for k in SETTINGS} == before
    lab.margin = 3.0  # a whole float counts, as Fp8ScalingLab's checks take it
    assert lab.margin == 3 and type(lab.margin) is int
    for name in ("streams", "options", "template", "config"):
        with pytest.raises(traitlets.TraitError):
            setattr(lab, name, getattr(lab, name))


LAB = BrowserFp8ScalingLab()


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(SETTINGS),
       value=st.one_of(st.integers(-10, 2000), st.sampled_from([1, 2, 64, 1024, 2**32 - 1, 2**32]),
                       st.floats(allow_nan=True), st.booleans(), st.none(),
                       st.sampled_from(["delayed", "current", "fp8_e4m3", "fp8_e5m2", "none", "inf", "nan", "max",
                                        "most_recent", "fp16", ""]),
                       st.text(max_size=6)))
def test_any_value_for_any_setting_is_taken_or_refused_in_one_line(name, value):
    lab = LAB
    before = {k: getattr(lab, k) for k in SETTINGS}
    try:
        setattr(lab, name, value)
    except traitlets.TraitError as e:
        assert "\n" not in str(e) and {k: getattr(lab, k) for k in SETTINGS} == before
        with pytest.raises((TypeError, ValueError)) as theirs:  # Fp8ScalingLab refuses it in the same words
            Fp8ScalingLab(**{name: value})
        assert str(theirs.value) == str(e)
        return
    # whatever was taken runs as Fp8ScalingLab runs it at those settings
    ref = Fp8ScalingLab(**{k: getattr(lab, k) for k in SETTINGS})
    same_run(lab.trace, ref.trace)
    assert _in_column(readout_html(lab.trace)) == ref.readout.value
