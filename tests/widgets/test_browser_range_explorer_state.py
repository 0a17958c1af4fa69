"""BrowserRangeExplorer's Python side: the settings it holds give the same census, scale label,
readout, x range and figure as RangeExplorer at the same settings; the values reach the page as
the float32 values RangeExplorer counts; bad arguments and settings are one-line errors in
RangeExplorer's words, and a refused setting leaves the explorer as it was."""

import base64

import numpy as np
import pytest
import traitlets
from hypothesis import given, settings, strategies as st

from ampviz.formats import ALL_FORMATS
from ampviz.formats.census import profile
from ampviz.plots.style import figure_config
from ampviz.widgets import RangeExplorer
from ampviz.widgets.browser_range_explorer import BrowserRangeExplorer
from browser_state_helpers import same_figure_json, same_refusal  # tests/widgets/, on the path as pytest runs


def values(seed: int = 0, n: int = 5_000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * np.exp2(rng.uniform(-50, 30, n))).astype(np.float32)
    x[:5], x[5:8], x[8:10], x[10:12] = 0, np.inf, np.nan, np.float32(2.0**-140)
    return x


VALUES = values()
ODD = np.float32([1e-8, 1e-3, 1.0])


def same_as(ex, ref) -> None:
    """ex shows what RangeExplorer ref shows."""
    assert ex.result == ref.result
    assert ex.scale_label() == ref.scale_label.value
    assert ex.readout_html() == ref.readout.value
    assert ex.x_range() == ref.x_range()
    same_figure_json(ex.figure(), ref.figure)


@pytest.mark.parametrize("args, kw", [
    ((VALUES,), {}),
    ((VALUES,), {"fmt": "bf16", "log2_scale": 40, "log2_scale_range": (-8, 36)}),
    ((profile(VALUES),), {"fmt": "fp8_e4m3", "log2_scale": -20}),
    ((VALUES.astype(np.float64) * 3,), {"fmt": "fp8_e5m2", "log2_scale": 7, "log2_scale_range": (0, 9)}),
    ((ODD.tolist(),), {"fmt": ALL_FORMATS["fp16"]}),
    ((np.zeros(0, np.float32),), {}),
])
def test_it_shows_what_range_explorer_shows(args, kw):
    ex, ref = BrowserRangeExplorer(*args, **kw), RangeExplorer(*args, **kw)
    assert (ex.fmt, ex.log2_scale) == (ref.format_dropdown.value, ref.scale_slider.value)
    assert (ex.log2_scale_min, ex.log2_scale_max) == (ref.scale_slider.min, ref.scale_slider.max)
    assert ex.scale == ref.scale
    same_as(ex, ref)


def test_settings_moved_are_read_by_python():
    ex, ref = BrowserRangeExplorer(VALUES), RangeExplorer(VALUES)
    for fmt, k in (("bf16", 12), ("fp8_e5m2", -16), ("fp16", 32), ("fp8_e4m3", 5)):
        ex.fmt, ex.log2_scale = fmt, k
        ref.format_dropdown.value, ref.scale_slider.value = fmt, k
        same_as(ex, ref)
    # a format given as RangeExplorer takes it (a FloatFormat) is held by its name
    ex.fmt = ALL_FORMATS["bf16"]
    assert ex.fmt == "bf16"


def test_the_page_gets_the_values_counted_and_what_it_draws_with():
    x = values(1).astype(np.float64) * 1.1  # rounded to float32, as the census holds them
    ex = BrowserRangeExplorer(x, log2_scale=-3, log2_scale_range=(2, 5))
    shipped = np.frombuffer(base64.b64decode(ex.values), "<f4")
    assert np.array_equal(shipped.view(np.uint32), ex.profile.values.view(np.uint32))
    assert shipped.dtype == np.dtype("<f4") and shipped.size == x.size
    assert (ex.log2_scale_min, ex.log2_scale_max) == (-3, 5)  # widened to hold the scale given
    assert ex.formats == list(RangeExplorer.FORMAT_CHOICES)
    assert ex.template == ex.figure().to_plotly_json()["layout"]["template"]
    assert ex.config == figure_config()
    assert "range_explorer_view.mjs" in ex._esm and "export default" in ex._esm
    state = ex.get_state()
    assert {state["fmt"], state["log2_scale"]} == {"fp16", -3}


ARGUMENT_CASES = [
    ((VALUES,), {"fmt": "fp32"}),
    ((VALUES,), {"fmt": "fp99"}),
    ((VALUES,), {"log2_scale": 1.5}),
    ((VALUES,), {"log2_scale": 200}),
    ((VALUES,), {"log2_scale": "3"}),
    ((VALUES,), {"log2_scale_range": 5}),
    ((VALUES,), {"log2_scale_range": (1, 2, 3)}),
    ((VALUES,), {"log2_scale_range": (4, -4)}),
    ((VALUES,), {"log2_scale_range": (-200, 0)}),
    ((VALUES,), {"log2_scale_range": (0, True)}),
    (("abc",), {}),
    ((None,), {}),
]


@pytest.mark.parametrize("args, kw", ARGUMENT_CASES)
def test_bad_arguments_are_range_explorers_errors_in_one_line(args, kw):
    same_refusal(lambda: BrowserRangeExplorer(*args, **kw), lambda: RangeExplorer(*args, **kw))


def test_too_many_values_for_the_page_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(BrowserRangeExplorer, "MAX_VALUES", 100)
    with pytest.raises(ValueError, match=r"values must be at most 100 here .*got 101$") as e:
        BrowserRangeExplorer(np.ones(101, np.float32))
    assert "\n" not in str(e.value)
    BrowserRangeExplorer(np.ones(100, np.float32))


def test_bad_settings_are_refused_in_one_line_and_change_nothing():
    ex = BrowserRangeExplorer(VALUES, log2_scale=3)
    for name, value, words in (("log2_scale", 33, "log2_scale must be between -16 and 32, got 33"),
                               ("log2_scale", -17, "log2_scale must be between -16 and 32, got -17"),
                               ("log2_scale", 2.5, "log2_scale must be a whole number, got 2.5"),
                               ("log2_scale", True, "log2_scale must be a whole number, got True"),
                               ("fmt", "fp32", "RangeExplorer shows fp16, bf16, fp8_e4m3, fp8_e5m2; got 'fp32'"),
                               ("fmt", "nope", "nope")):
        with pytest.raises(traitlets.TraitError) as e:
            setattr(ex, name, value)
        assert words in str(e.value) and "\n" not in str(e.value)
        assert (ex.fmt, ex.log2_scale) == ("fp16", 3)
    ex.log2_scale = 4.0  # a whole float counts, as RangeExplorer's checks take it
    assert ex.log2_scale == 4 and type(ex.log2_scale) is int
    for name in ("values", "log2_scale_min", "log2_scale_max", "formats", "template", "config"):
        with pytest.raises(traitlets.TraitError):
            setattr(ex, name, getattr(ex, name))


EXPLORER = BrowserRangeExplorer(VALUES, log2_scale_range=(-20, 20))
REFERENCE = RangeExplorer(VALUES, log2_scale_range=(-20, 20))


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(["fmt", "log2_scale"]),
       value=st.one_of(st.integers(-200, 200), st.floats(allow_nan=True), st.booleans(), st.none(),
                       st.sampled_from(["fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "fp32", "e8m0", "x", "",
                                        ALL_FORMATS["fp8_e5m2"], ALL_FORMATS["fp32"], np.float16]),
                       st.text(max_size=6)))
def test_any_value_for_any_setting_is_taken_or_refused_in_one_line(name, value):
    ex = EXPLORER
    before = (ex.fmt, ex.log2_scale)
    try:
        setattr(ex, name, value)
    except traitlets.TraitError as e:
        assert "\n" not in str(e) and (ex.fmt, ex.log2_scale) == before
        return
    assert ex.fmt in RangeExplorer.FORMAT_CHOICES and -20 <= ex.log2_scale <= 20
    # whatever was taken shows what RangeExplorer shows at those settings
    REFERENCE.format_dropdown.value, REFERENCE.scale_slider.value = ex.fmt, ex.log2_scale
    assert ex.result == REFERENCE.result
    assert ex.readout_html() == REFERENCE.readout.value and ex.scale_label() == REFERENCE.scale_label.value
    same_figure_json(ex.figure(), REFERENCE.figure)
