"""FormatExplorer's decimal box, its "typed" readout and its bits agree after every control change.

A learner types 0.1 and then picks another format: the box still says 0.1, the readout's "typed"
row says 0.1, and the bits are 0.1 cast into the new format (never the box showing the stored
value while "typed" still shows 0.1). Bits set directly (a click, the hex box) leave no typed
number: the box then shows the stored value, and the readout has no "typed" row.
"""

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ampviz.formats import ALL_FORMATS, FORMATS, get_format
from ampviz.widgets import FormatExplorer, parse_number
from widget_checks import one_line, text  # tests/, on the path as pytest runs


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def check_agrees(ex) -> None:
    """The box, the "typed" row, the bits, the bit buttons, the hex box and the stored value agree."""
    fmt = ex.fmt
    assert ex.error is None
    readout = text(ex.readout)
    boxed = parse_number(ex.decimal_input.value)
    if ex.typed is not None:
        # the box holds the typed number, the readout names it, the bits are its cast
        assert same(boxed, ex.typed), (ex.decimal_input.value, ex.typed)
        assert readout.startswith(f"typed {ex.typed!r} stored "), readout[:80]
        assert ex.bits == int(fmt.encode(ex.typed))
    else:
        # no typed number: the box shows the stored value, and the readout has no "typed" row
        assert same(boxed, ex.value), (ex.decimal_input.value, ex.value)
        assert readout.startswith("stored ") and "typed" not in readout
    assert same(ex.value, float(fmt.decode(ex.bits)))
    assert f"stored {ex.value!r}" in readout
    assert ex.hex_input.value == f"0x{ex.bits:0{(fmt.bits + 3) // 4}X}"
    assert [b.description for b in ex.bit_buttons] == list(format(ex.bits, f"0{fmt.bits}b"))
    stored = ex.figure.layout.meta["stored"]
    assert (stored is None and not math.isfinite(ex.value)) or same(stored, ex.value)


@pytest.mark.parametrize("name", [n for n in ALL_FORMATS if n != "fp16"])
def test_a_typed_number_stays_typed_in_every_format(name):
    """Typed 0.1, then a new format: the box still says 0.1, "typed" says 0.1, the bits are 0.1
    cast into the new format; and back to fp16 the same."""
    ex = FormatExplorer("fp16")
    ex.decimal_input.value = "0.1"
    check_agrees(ex)
    ex.format_dropdown.value = name
    assert ex.decimal_input.value == "0.1" and ex.typed == 0.1
    assert ex.bits == int(get_format(name).encode(0.1))
    check_agrees(ex)
    ex.format_dropdown.value = "fp16"
    assert ex.decimal_input.value == "0.1" and ex.bits == 0x2E66
    check_agrees(ex)


def test_the_box_keeps_the_number_as_it_was_typed():
    """"2^-24" stays "2^-24" in the box through a format change (its value in the "typed" row)."""
    ex = FormatExplorer("fp16")
    ex.decimal_input.value = "2^-24"
    ex.format_dropdown.value = "bf16"
    assert ex.decimal_input.value == "2^-24" and ex.typed == 2.0**-24
    check_agrees(ex)


def test_bits_set_directly_show_the_stored_value_in_every_format():
    """A bit clicked: no typed number; a new format casts the stored value, and the box shows
    what the new format stores."""
    ex = FormatExplorer("fp16", 0.1)
    ex.bit_buttons[-1].click()
    assert ex.typed is None and ex.decimal_input.value == repr(ex.value)
    check_agrees(ex)
    before = ex.value
    ex.format_dropdown.value = "fp8_e4m3"
    assert ex.typed is None and ex.value == float(get_format("fp8_e4m3").quantize(before))
    assert ex.decimal_input.value == repr(ex.value)
    check_agrees(ex)


def test_a_refused_number_keeps_its_message_until_the_next_change():
    """Text that is not a number stays in the box with the message; the next change (here a new
    format) shows the typed number again, cast into that format, and clears the message."""
    ex = FormatExplorer("fp16")
    ex.decimal_input.value = "0.1"
    ex.decimal_input.value = "abc"
    assert one_line(ex.error) and ex.decimal_input.value == "abc" and ex.typed == 0.1
    ex.format_dropdown.value = "bf16"
    assert ex.decimal_input.value == "0.1"
    check_agrees(ex)


NUMBERS = st.sampled_from(["0.1", "1e-8", "65519", "65520", "2^-24", "-3.5", "0", "-0", "nan", "-inf", "448",
                           "1e-40", "3e38", "1.0000001"])
ACTIONS = st.lists(st.one_of(
    st.tuples(st.just("format"), st.sampled_from(list(ALL_FORMATS))),
    st.tuples(st.just("decimal"), NUMBERS),
    st.tuples(st.just("value"), st.floats(allow_nan=True, allow_infinity=True)),
    st.tuples(st.just("bit"), st.integers(0, 31)),
    st.tuples(st.just("hex"), st.integers(0, 2**32 - 1)),
), min_size=1, max_size=8)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(start=st.sampled_from(list(FORMATS)), actions=ACTIONS)
def test_every_sequence_of_control_changes_keeps_box_typed_and_bits_together(start, actions):
    ex = FormatExplorer(start, 0.1)
    check_agrees(ex)
    for kind, arg in actions:
        if kind == "format":
            ex.format_dropdown.value = arg
        elif kind == "decimal":
            ex.decimal_input.value = arg
        elif kind == "value":
            ex.set_value(arg)
        elif kind == "bit":
            ex.bit_buttons[arg % ex.fmt.bits].click()
        else:
            ex.hex_input.value = hex(arg % (1 << ex.fmt.bits))
        check_agrees(ex)
