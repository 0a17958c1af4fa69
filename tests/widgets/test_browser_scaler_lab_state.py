"""BrowserScalerLab's Python side: the settings it holds give the same stream, runs, lost share,
readout and figure as ScalerLab at the same settings; the shipped recipes cover every slider
position and any strength set from Python; bad settings are one-line errors in ScalerLab's words."""

import struct

import numpy as np
import pytest
import traitlets
from hypothesis import given, settings, strategies as st

from ampviz.scaling import recipes, synth
from ampviz.widgets import ScalerLab
from ampviz.widgets.browser_scaler_lab import STRENGTHS, BrowserScalerLab, _key
from browser_state_helpers import same_figure_arrays  # tests/widgets/, on the path as pytest runs


@pytest.mark.parametrize("kw", [
    {},
    {"scenario": "bursts", "strength": 0.85, "overlay": ("DeepSpeed", "Megatron"), "growth_interval": 100},
    {"scenario": "warmup", "strength": 1.0, "loss_dtype": "float16", "init_scale": 2.0**24},
    {"scenario": "drift", "strength": 0.35, "growth_factor": 1.7, "backoff_factor": 0.3, "growth_interval": 7},
])
def test_it_shows_what_scaler_lab_shows(kw):
    lab, ref = BrowserScalerLab(steps=20_000, **kw), ScalerLab(steps=20_000, **kw)
    assert np.array_equal(lab.stream, ref.stream)
    for a, b in zip(lab.traces, ref.traces, strict=True):
        assert np.array_equal(a.scale, b.scale) and np.array_equal(a.skipped, b.skipped)
        assert a.policy == b.policy
    for a, b in zip(lab.lost, ref.lost, strict=True):
        assert np.array_equal(a, b)
    assert lab.readout_html() == ref._readout_html()
    same_figure_arrays(lab.figure(), ref.figure)


def test_a_moved_setting_is_read_by_python():
    lab, ref = BrowserScalerLab(steps=5_000), ScalerLab(steps=5_000)
    lab.strength, lab.scenario, lab.init_log2 = 0.15, "steady", 3
    ref.strength_slider.value, ref.scenario_dropdown.value, ref.init_slider.value = 0.15, "steady", 3
    assert np.array_equal(lab.traces[0].scale, ref.traces[0].scale)


def test_every_slider_position_has_its_recipe_and_an_off_grid_strength_is_shipped():
    lab = BrowserScalerLab(steps=3_000, seed=2)
    assert set(lab.recipes) == {_key(n, s) for n in synth.SCENARIOS for s in STRENGTHS}
    z = recipes.normals(3_000, 2)
    assert np.array_equal(np.frombuffer(__import__("base64").b64decode(lab.normals), "<f8"), z)
    lab.strength = 0.37
    entry = lab.recipes[_key("spikes", 0.37)]
    assert entry["recipe"] == recipes.recipe("spikes", 0.37)
    lab.scenario = "drift"
    assert _key("drift", 0.37) in lab.recipes
    # the key is the strength's float64 bits, as the page computes it
    assert _key("x", 0.35).split("|")[1] == struct.pack(">d", 0.35).hex()


def test_bad_settings_are_one_line_errors_in_scaler_labs_words():
    for kw, words in (({"growth_factor": 1.0}, "growth_factor must be a finite number above 1"),
                      ({"backoff_factor": 1.0}, "backoff_factor must be between 0 and 1"),
                      ({"scenario": "gusts"}, "unknown scenario 'gusts'"),
                      ({"strength": 2}, "strength must be between 0 and 1"),
                      ({"overlay": ("torch",)}, "cannot compare with 'torch'"),
                      ({"loss_dtype": "bf16"}, "loss_dtype must be 'float32'"),
                      ({"init_scale": 3.0}, "init_scale must be a power of two"),
                      ({"steps": 0}, "steps must be")):
        with pytest.raises(ValueError, match=words) as e:
            BrowserScalerLab(**kw)
        assert "\n" not in str(e.value)
        if "steps" not in kw:  # the page's limit on steps is its own
            with pytest.raises(ValueError) as e2:
                ScalerLab(**kw)
            assert str(e2.value).split(",")[0] == str(e.value).split(",")[0]
    with pytest.raises(ValueError, match="steps must be at most 1,000,000 here"):
        BrowserScalerLab(steps=10**6 + 1)
    lab = BrowserScalerLab(steps=1_000)
    with pytest.raises(traitlets.TraitError, match="backoff_factor must be between 0 and 1"):
        lab.backoff_factor = 0.0
    assert lab.backoff_factor == 0.5


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(["init_log2", "growth_factor", "backoff_factor", "growth_interval", "scenario",
                             "strength", "loss_dtype", "overlay"]),
       value=st.one_of(st.integers(-50, 10**8), st.floats(allow_nan=True), st.text(max_size=6), st.none(),
                       st.lists(st.sampled_from(["DeepSpeed", "torch", "jmp", "x"]), max_size=2)))
def test_any_value_for_any_setting_is_taken_or_refused_in_one_line(name, value):
    lab = BrowserScalerLab(steps=500)
    before = getattr(lab, name)
    try:
        setattr(lab, name, value)
    except traitlets.TraitError as e:
        assert "\n" not in str(e) and getattr(lab, name) == before
        return
    traces = lab.traces  # whatever was taken runs
    assert traces[0].scale.size == 500
