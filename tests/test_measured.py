"""``measured``: how a lesson prints a value that float arithmetic computed, the same on every CPU."""

import math
import os

import numpy as np
import pytest
from hypothesis import given, strategies as st

from ampviz.text import MEASURED_REL, STRICT_DIGITS, measured


@pytest.fixture
def strict(monkeypatch):
    """As where checked outputs are written or compared."""
    monkeypatch.setenv(STRICT_DIGITS, "1")


def test_prints_the_digits_asked_for():
    assert measured(1.6967441) == "1.697"
    assert measured(1737.4659) == "1737"
    assert measured(np.float32(0.99999946)) == "1"
    assert measured(0.128053, 3) == "0.128"
    assert measured(-2.5e-7) == "-2.5e-07"
    assert measured(3018787.8) == "3.019e+06"


def test_two_machines_whose_last_bits_differ_print_the_same_text():
    # 05's norm on two CPUs: float32 1.6967441 and its neighbour 1.696744
    assert measured(np.float32(1.6967441)) == measured(np.float32(1.696744)) == "1.697"
    assert measured(np.float32(1737.4659)) == measured(np.float32(1737.4658)) == "1737"


def test_a_value_on_a_rounding_boundary_is_refused(strict):
    with pytest.raises(ValueError, match="rounding boundary at 4 significant digits"):
        measured(1.2345)  # 1.2345 ± 1e-6 relative prints 1.234 or 1.235
    with pytest.raises(ValueError, match="rounding boundary"):
        measured(0.99995)  # 1 or 0.9999
    assert measured(1.2345, 3) == "1.23"  # fewer digits: far from a boundary


def test_zero_infinities_and_nan_print_as_number_prints_them():
    assert [measured(v) for v in (0.0, -0.0, math.inf, -math.inf, math.nan)] == ["0", "-0", "inf", "-inf", "nan"]


@pytest.mark.parametrize("digits", [0, 10, 2.5, True, "4", None])
def test_digits_must_be_a_whole_number_from_1_to_9(digits):
    with pytest.raises(ValueError, match="digits must be a whole number from 1 to 9"):
        measured(1.0, digits)


@pytest.mark.parametrize("x", ["one", None, [1.0, 2.0], object()])
def test_a_value_that_is_not_one_real_number_is_refused(x):
    with pytest.raises(ValueError, match="measured takes one real number"):
        measured(x)


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e30, max_value=1e30),
       st.integers(1, 9), st.floats(-1.0, 1.0))
def test_any_value_it_prints_prints_alike_within_the_tolerance(x, digits, shift):
    os.environ[STRICT_DIGITS] = "1"  # hypothesis runs it many times: no function-scoped fixture
    try:
        text = measured(x, digits)
    except ValueError as exc:
        assert "rounding boundary" in str(exc)
        return
    near = x * (1 + shift * MEASURED_REL * 0.999)  # another CPU's value: printed the same
    assert f"{near:.{digits}g}" == text
    if x != 0:
        assert abs(float(text) / x - 1) <= 0.5 * 10.0 ** (1 - digits)


def teardown_module():
    os.environ.pop(STRICT_DIGITS, None)


def test_a_learners_own_value_on_a_boundary_prints_as_it_is(monkeypatch):
    """Outside the runs that write or compare checked outputs, nothing is refused."""
    monkeypatch.delenv(STRICT_DIGITS, raising=False)
    assert measured(1.2345) == f"{1.2345:.4g}" and measured(0.99995) == f"{0.99995:.4g}"


def test_a_power_of_two_at_the_digits_asked_for_prints_as_one(strict):
    assert measured(0.99999982 * 2.0**-16, pow2=True) == "2^-16"
    assert measured(-1024.0001, pow2=True) == "-2^10"
    assert measured(1.0000001, pow2=True) == "1"
    assert measured(1.5 * 2.0**-16, pow2=True) == "2.289e-05"
    assert measured(1024.0001) == "1024"
    with pytest.raises(ValueError, match="rounding boundary"):
        measured(0.99995 * 2.0**-16, pow2=True)
