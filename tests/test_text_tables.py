"""How the lessons print: ``ampviz.text``'s ``number`` and ``Table`` (``measured`` has its own file,
tests/test_measured.py)."""

import math

import pytest

from ampviz import checks
from ampviz import text as TX
from ampviz.formats import lesson as FL
from ampviz.scaling import lesson as SL
from ampviz.training import lesson as TL

MODULES = (TX, checks, FL, SL, TL)


# ----- display -----
@pytest.mark.parametrize("x, text", [
    (2.0**-24, "2^-24"), (2.0**-3, "2^-3"), (0.25, "0.25"), (1.0, "1"), (65536.0, "65536"),
    (2.0**17, "2^17"), (-(2.0**-24), "-2^-24"), (65504.0, "65504"), (0.1, "0.1"),
    (math.inf, "inf"), (-math.inf, "-inf"), (math.nan, "nan"), (0.0, "0"), (-0.0, "-0"),
    (1.0 + 2**-10, "1.0009766"),
])
def test_number(x, text):
    assert TX.number(x) == text


def test_number_pow2():
    assert TX.number(0.25, pow2=True) == "2^-2" and TX.number(1024.0, pow2=True) == "2^10"
    assert TX.number(1.0, pow2=True) == "1" and TX.number(3.0, pow2=True) == "3"


def test_table_text_html_and_validation():
    t = TX.Table(("a", "long heading"), [(1, "x<y"), ("22", 3.5)], title="T")
    lines = str(t).splitlines()
    assert lines[0] == "T"
    assert lines[1] == "a   long heading"
    assert lines[2] == "--  ------------"
    assert lines[3] == "1   x<y"
    assert repr(t) == str(t)
    assert "x&lt;y" in t._repr_html_() and "<caption>T</caption>" in t._repr_html_()
    assert t.column("a") == ("1", "22")
    with pytest.raises(ValueError, match="2 cells"):
        TX.Table(("a", "b", "c"), [(1, 2)])
