"""BrowserBlockExplorer's Python side: the settings it holds give the same row, quantization,
readout and figure as BlockExplorer at the same settings; the rows shipped are make_row's for every
seed the page holds, and a new seed's rows are shipped before the seed; bad settings are one-line
errors in BlockExplorer's words, from the constructor and from any setting."""

import base64

import numpy as np
import pytest
import traitlets
from hypothesis import HealthCheck, given, settings, strategies as st

from ampviz.formats.blocks import TE_RHT_SIGNS, hadamard_matrix
from ampviz.widgets.block_explorer import BlockExplorer, make_row
from ampviz.widgets.browser_block_explorer import SETTINGS, SHIPPED_SEEDS, BrowserBlockExplorer
from browser_state_helpers import same_figure_arrays, same_refusal  # tests/widgets/, on the path as pytest runs


def same_result(a, b):
    for name in ("scales", "codes", "values"):
        assert np.array_equal(np.asarray(getattr(a, name)), np.asarray(getattr(b, name)), equal_nan=True), name
    assert getattr(a, "tensor_scale", None) == getattr(b, "tensor_scale", None)


def move(ref: BlockExplorer, s: dict) -> None:
    """The kernel's explorer moved by its own controls to the settings ``s``."""
    for widget, name in ((ref.scheme_dropdown, "scheme"), (ref.block_dropdown, "block_size"),
                         (ref.rounding_dropdown, "rounding"), (ref.tensor_scale_checkbox, "per_tensor_scale"),
                         (ref.data_dropdown, "data"), (ref.outlier_slider, "log2_outlier"), (ref.seed_input, "seed"),
                         (ref.hadamard_checkbox, "hadamard")):
        widget.value = s[name]


CASES = [
    {},
    {"scheme": "fp8_e5m2", "block_size": 16, "rounding": "rceil", "log2_outlier": 20, "seed": 3},
    {"scheme": "fp4_e2m1", "rounding": "even", "data": "lognormal", "hadamard": True, "seed": 77},
    {"scheme": "nvfp4", "per_tensor_scale": False, "log2_outlier": 0},
    {"scheme": "nvfp4", "hadamard": True, "log2_outlier": 24, "seed": 5},
    {"scheme": "fp6_e2m3", "rounding": "ceil", "n": 64, "outlier_at": 63, "log2_outlier": 13},
]


@pytest.mark.parametrize("kw", CASES)
def test_it_shows_what_block_explorer_shows(kw):
    ex, ref = BrowserBlockExplorer(**kw), BlockExplorer(**kw)
    assert np.array_equal(ex.data_row, ref.data) and np.array_equal(ex.x, ref.x)
    same_result(ex.result, ref.result)
    assert ex.readout_html() == ref.readout.value
    same_figure_arrays(ex.figure(), ref.figure)


def test_a_moved_setting_is_read_by_python():
    ex, ref = BrowserBlockExplorer(), BlockExplorer()
    s = {"scheme": "fp6_e3m2", "block_size": 16, "rounding": "even", "per_tensor_scale": True, "data": "normal",
         "log2_outlier": 17, "hadamard": True, "seed": 9}
    for k, v in s.items():
        setattr(ex, k, v)
    move(ref, s)
    assert ex.readout_html() == ref.readout.value
    same_figure_arrays(ex.figure(), ref.figure)
    same_result(ex.result, ref.result)


def rows_of(ex, seed):
    return {k: np.frombuffer(base64.b64decode(v), "<f4") for k, v in ex.rows[str(seed)].items()}


def test_the_rows_shipped_are_make_rows_and_a_new_seed_is_shipped_first():
    ex = BrowserBlockExplorer(seed=123_456, n=96, outlier_at=50)
    assert set(ex.rows) == {str(s) for s in (*SHIPPED_SEEDS, 123_456)}
    for seed in (0, 7, 15, 123_456):
        rows = rows_of(ex, seed)
        assert np.array_equal(rows["lognormal"], make_row("lognormal", 96, seed, 0, 50))
        for k in (0, 5, 24):  # the page writes 2^k at the outlier's place: make_row's row at k
            x = rows["normal"].copy()
            x[50] = np.float32(2.0**k)
            assert np.array_equal(x, make_row("normal", 96, seed, k, 50))
    seen = []
    ex.observe(lambda c: seen.append((c["name"], "4000000000" in ex.rows)), names=["rows", "seed"])
    ex.seed = 4_000_000_000
    assert seen == [("rows", True), ("seed", True)]  # the rows change first: the page finds them with the seed
    assert np.array_equal(rows_of(ex, 4_000_000_000)["lognormal"], make_row("lognormal", 96, 4_000_000_000, 0, 50))
    assert np.array_equal(np.reshape(ex.hadamard_matrix, (16, 16)), hadamard_matrix(TE_RHT_SIGNS))
    assert ex.schemes == [list(p) for p in BlockExplorer.SCHEMES] and ex.datas == [list(p) for p in BlockExplorer.DATA]
    assert (ex.log2_outlier_min, ex.log2_outlier_max) == BlockExplorer.LOG2_OUTLIER_RANGE


BAD = [
    {"scheme": "mxfp8"}, {"scheme": None}, {"block_size": 64}, {"block_size": True}, {"block_size": 32.0},
    {"rounding": "nearest"}, {"per_tensor_scale": 1}, {"hadamard": "yes"}, {"data": "uniform"},
    {"log2_outlier": 25}, {"log2_outlier": 2.5}, {"log2_outlier": -1}, {"seed": -1}, {"seed": 2**32},
    {"seed": "0"}, {"n": 100}, {"n": 512}, {"outlier_at": 128}, {"n": 64, "outlier_at": 64},
    {"scheme": "x", "seed": -1},  # the first bad argument, in BlockExplorer's order
]


@pytest.mark.parametrize("kw", BAD)
def test_bad_arguments_are_block_explorers_one_line_errors(kw):
    same_refusal(lambda: BrowserBlockExplorer(**kw), lambda: BlockExplorer(**kw))


def test_a_bad_setting_is_refused_and_the_old_one_kept():
    ex = BrowserBlockExplorer()
    for name, value, words, kept in (("block_size", 8, "block_size must be 16 or 32, got 8", 32),
                                     ("seed", -3, "seed must be between 0 and 4,294,967,295", 0),
                                     ("hadamard", None, "hadamard must be True or False, got None", False)):
        with pytest.raises(traitlets.TraitError, match=words):
            setattr(ex, name, value)
        assert getattr(ex, name) == kept
    assert len(ex.rows) == len(SHIPPED_SEEDS)  # no rows for a refused seed


VALUES = {"scheme": st.sampled_from(["fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1", "nvfp4", "fp16"]),
          "block_size": st.sampled_from([16, 32, 8, True]), "rounding": st.sampled_from(["floor", "ceil", "even",
                                                                                          "rceil", "up"]),
          "per_tensor_scale": st.sampled_from([True, False, 1]), "hadamard": st.sampled_from([True, False, 0]),
          "data": st.sampled_from(["normal", "lognormal", "laplace"]), "log2_outlier": st.integers(-2, 26),
          "seed": st.one_of(st.integers(0, 20), st.integers(-5, 2**33))}
ANY = st.one_of(st.none(), st.floats(allow_nan=True), st.text(max_size=5), st.lists(st.integers(), max_size=2))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(SETTINGS), data=st.data())
def test_any_value_for_any_setting_is_taken_or_refused_in_one_line(name, data):
    """Every setting, a plausible or an odd value: taken (and then what the page shows is
    BlockExplorer's at the same settings) or refused in one line with the old value kept."""
    value = data.draw(st.one_of(VALUES[name], ANY))
    ex = BrowserBlockExplorer(scheme="nvfp4" if name == "per_tensor_scale" else "fp8_e4m3")
    before = getattr(ex, name)
    try:
        setattr(ex, name, value)
    except traitlets.TraitError as e:
        assert "\n" not in str(e) and getattr(ex, name) == before
        with pytest.raises((ValueError, TypeError)) as want:  # the kernel's explorer refuses it too, in the same words
            BlockExplorer(**{"scheme": ex.scheme, name: value})
        assert str(want.value) == str(e)
        return
    s = {k: getattr(ex, k) for k in SETTINGS}
    ref = BlockExplorer(**s)
    assert ex.readout_html() == ref.readout.value
    same_result(ex.result, ref.result)
