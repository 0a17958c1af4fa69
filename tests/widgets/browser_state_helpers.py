"""Checks shared by the tests of the page explorers' Python side (test_browser_*_state): a
figure the same as the kernel widget's, and a bad argument refused as the kernel widget refuses it."""

import numpy as np
import plotly.io as pio
import pytest


def same_figure_arrays(a, b) -> None:
    """The same traces (arrays compared as arrays, NaNs of a float array equal) and layout."""
    ja, jb = a.to_plotly_json(), b.to_plotly_json()
    assert len(ja["data"]) == len(jb["data"])
    for ta, tb in zip(ja["data"], jb["data"]):
        assert ta.keys() == tb.keys()
        for k in ta:
            va, vb = ta[k], tb[k]
            if isinstance(va, np.ndarray) or isinstance(vb, np.ndarray):
                assert np.array_equal(np.asarray(va), np.asarray(vb), equal_nan=np.asarray(va).dtype.kind == "f"), k
            else:
                assert va == vb, k
    assert ja["layout"] == jb["layout"]


def same_figure_json(a, b) -> None:
    """The same figure, arrays and template included, as plotly writes it."""
    assert pio.to_json(a, validate=False) == pio.to_json(b, validate=False)


def same_refusal(make, make_reference) -> None:
    """``make()`` and ``make_reference()`` both raise a ValueError or a TypeError, of one type and in
    the same words, one line."""
    with pytest.raises((TypeError, ValueError)) as mine:
        make()
    with pytest.raises((TypeError, ValueError)) as theirs:
        make_reference()
    assert type(mine.value) is type(theirs.value), (mine.value, theirs.value)
    assert str(mine.value) == str(theirs.value), (mine.value, theirs.value)
    assert "\n" not in str(mine.value), mine.value
