"""``ampviz._args``, the argument checks every layer shares: torch-free, yet reading tensors once
torch is loaded; each refusal one line that names the argument."""

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ampviz._args import _count, _flag, _number, _real, _real_array, _seed, _shown, _whole


def test_importing_it_loads_no_torch_and_a_value_is_no_tensor_without_torch():
    code = ("import sys; from ampviz._args import _real, _real_array; "
            "assert _real('x', 2) == 2.0 and _real_array('x', [1, 2], 'numbers').tolist() == [1.0, 2.0]; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_tensors_are_read_once_torch_is_loaded():
    torch = pytest.importorskip("torch")
    assert _real("lr", torch.tensor(0.5)) == 0.5
    got = _real_array("grads", torch.tensor([1.0, 2.0], dtype=torch.bfloat16), "numbers", dtype=np.float32)
    assert got.dtype == np.float32 and got.tolist() == [1.0, 2.0]
    with pytest.raises(TypeError, match=r"^grads must be numbers, not a bool tensor$"):
        _real_array("grads", torch.tensor([True]), "numbers")
    with pytest.raises(TypeError, match="lr must be a number"):
        _real("lr", torch.tensor([0.5, 1.0]))  # not 0-d


def test_the_two_families_of_messages():
    with pytest.raises(ValueError, match=r"^steps must be at least 1, not 0$"):
        _whole("steps", 0, 1)
    with pytest.raises(ValueError, match=r"^steps must be between 1 and 10, not 11$"):
        _whole("steps", 11, 1, 10)
    with pytest.raises(ValueError, match=r"^steps must be a whole number, not 2\.5$"):
        _whole("steps", 2.5, 1)
    with pytest.raises(TypeError, match=r"^steps must be a whole number, got True$"):
        _count("steps", True, 1)
    with pytest.raises(ValueError, match=r"^steps must be between 1 and 10, got 11$"):
        _count("steps", 11, 1, 10)
    with pytest.raises(TypeError, match=r"^lr must be a number, got '0\.1'$"):
        _number("lr", "0.1")
    # a caller's own way of showing a value (the explorers cut it at 40 characters)
    with pytest.raises(TypeError, match=r"^lr must be a number, got <x>$"):
        _number("lr", "0.1", shown=lambda v: "<x>")
    with pytest.raises(TypeError, match=r"^flag must be True or False, not 1$"):
        _flag("flag", 1)
    assert _seed(2**64 - 2, spare=1) == 2**64 - 2
    with pytest.raises(ValueError, match="seed must be between"):
        _seed(2**64 - 1, spare=1)


def test_shown_is_one_short_line_even_for_a_broken_repr():
    class Broken:
        def __repr__(self):
            raise RuntimeError("no")

    assert _shown(Broken()) == "a Broken"
    assert "\n" not in _shown(["a\nb", "c"]) and "\n" not in _shown(np.arange(40).reshape(4, 10))
    long = _shown(list(range(100)))
    assert len(long) == 61 and long.endswith("…")


@given(st.one_of(st.integers(-10**30, 10**30), st.floats(allow_nan=True), st.text(max_size=5), st.none(),
                 st.booleans(), st.lists(st.integers(), max_size=3)))
def test_any_value_is_taken_or_refused_in_one_line(value):
    for check in (lambda v: _whole("n", v, 0, 10**6), lambda v: _count("n", v, 0, 10**6),
                  lambda v: _real("x", v), lambda v: _number("x", v)):
        try:
            check(value)
        except (TypeError, ValueError) as e:
            assert "\n" not in str(e) and str(e).split()[0] in ("n", "x")
