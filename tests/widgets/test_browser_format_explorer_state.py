"""BrowserFormatExplorer's Python side: at the same settings it shows what FormatExplorer shows (the
bits, value, category, typed number, readout, bits line, boxes and figure), its actions keep
FormatExplorer's rules whether called or made by assigning a setting, a change reaches the page in
one message, and bad input is refused with FormatExplorer's one-line errors, the settings left as
they were. A Hypothesis test drives both explorers through the same random actions."""

import math
import struct

import numpy as np
import pytest
import traitlets
from hypothesis import HealthCheck, given, settings, strategies as st

from ampviz.formats import ALL_FORMATS, FloatFormat
from ampviz.widgets import FormatExplorer, parse_number
from ampviz.widgets.browser_format_explorer import BrowserFormatExplorer
from ampviz.widgets.format_explorer import format_options
from widget_checks import one_line  # tests/, on the path as pytest runs


def same_number(a, b) -> bool:
    """The same float, the sign of 0 and of NaN included (a NaN's payload aside)."""
    if a is None or b is None:
        return a is b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b) and math.copysign(1.0, a) == math.copysign(1.0, b)
    return struct.pack("<d", a) == struct.pack("<d", b)


def same_figure(a, b) -> None:
    ja, jb = a.to_plotly_json(), b.to_plotly_json()
    assert ja["data"] == jb["data"] and ja["layout"] == jb["layout"]


def check_same(lab: BrowserFormatExplorer, ex: FormatExplorer, figure: bool = True) -> None:
    """``lab`` shows what ``ex`` shows."""
    assert lab.fmt == ex.fmt.name and lab.bits == ex.bits
    assert same_number(lab.value, ex.value) and lab.category == ex.category
    assert same_number(lab.typed_value, ex.typed)
    assert lab.readout_html() == ex.readout.value
    assert lab.bits_html() == ex.bits_readout.value
    assert lab.hex_text == ex.hex_input.value
    negative_nan = ex.typed is not None and math.isnan(ex.typed) and math.copysign(1.0, ex.typed) < 0
    # FormatExplorer's box shows repr(-nan), "nan"; the page's text keeps the sign: "-nan"
    assert lab.decimal_text == ("-nan" if negative_nan and ex.decimal_input.value == "nan" else ex.decimal_input.value)
    if figure:
        same_figure(lab.figure(), ex.figure)


@pytest.mark.parametrize("name", list(ALL_FORMATS))
@pytest.mark.parametrize("value", [1.0, 0.1, -0.0, 1e-30, -3e38, math.inf, -math.inf, math.nan, -math.nan, 65519.0,
                                   2.0**-127, -7.0])
def test_it_shows_what_format_explorer_shows(name, value):
    check_same(BrowserFormatExplorer(name, value), FormatExplorer(name, value))


def test_the_formats_shipped_are_the_dropdowns():
    lab = BrowserFormatExplorer()
    assert [(f["label"], f["name"]) for f in lab.formats] == format_options()
    assert [f["description"] for f in lab.formats] == [f.description for f in ALL_FORMATS.values()]
    assert lab.fmt == "fp16" and lab.typed == "1.0" and lab.bits == 0x3C00
    assert "format_explorer_view.mjs" in lab._esm and "valueplot.mjs" in lab._esm


def test_actions_keep_format_explorers_rules():
    lab, ex = BrowserFormatExplorer("fp16"), FormatExplorer("fp16")
    steps = [("set_decimal", " 0.1 "), ("set_format", "bf16"), ("set_format", "fp8_e4m3"), ("toggle_bit", 0),
             ("set_format", "e8m0"), ("set_value", -2.5), ("set_format", "fp4_e2m1"), ("set_bits", 0xF),
             ("set_format", "fp8_e4m3fnuz"), ("set_decimal", "2^-24"), ("set_format", "fp32"), ("toggle_bit", 31),
             ("set_format", "tf32"), ("set_decimal", "\u22121e-8"), ("set_format", "float16"), ("set_decimal", "-nan"),
             ("set_format", "fp6_e3m2"), ("set_bits", np.int64(0x20)), ("set_format", "fp8_e5m2fnuz"),
             ("set_value", 1.0), ("set_bits", 0x40)]  # the pattern already held: the typed number goes
    for action, arg in steps:
        getattr(lab, action)(arg)
        getattr(ex, action)(arg)
        check_same(lab, ex)
    assert lab.fmt == "fp8_e5m2fnuz" and lab.bits == 0x40 and lab.typed is None  # bits set directly leave no typed number


def test_a_setting_assigned_follows_the_same_rules_and_reaches_the_page_in_one_message():
    lab = BrowserFormatExplorer("fp16", 0.1)
    sent = []
    lab._send = lambda msg, buffers=None: sent.append(sorted(msg["state"]))
    lab.fmt = "bf16"  # the typed number, cast again
    assert (lab.typed, lab.bits) == ("0.1", int(ALL_FORMATS["bf16"].encode(0.1))) and sent == [["bits", "fmt"]]
    sent.clear()
    lab.bits = 0x3F80  # bits set directly: no typed number
    assert lab.typed is None and lab.decimal_text == "1.0" and sent == [["bits", "typed"]]
    sent.clear()
    lab.typed = " 2**-3\t"  # a typed text: kept stripped, the bits its cast
    assert lab.typed == "2**-3" and lab.bits == int(ALL_FORMATS["bf16"].encode(0.125)) and sent == [["bits", "typed"]]
    sent.clear()
    lab.fmt = "half"  # get_format's names
    assert lab.fmt == "fp16" and lab.bits == 0x3000 and lab.typed == "2**-3"
    lab.typed = None  # the bits stay, and the box shows the stored value
    assert lab.bits == 0x3000 and lab.decimal_text == "0.125"
    lab.fmt = "fp8_e4m3"  # no typed number: the stored value, cast again
    assert lab.bits == int(ALL_FORMATS["fp8_e4m3"].encode(0.125)) and lab.typed is None


def test_settings_from_the_page_are_taken_as_sent():
    """The page sends its settings in line, in one message, in any order: a pattern of the new
    format is checked against the new format, and nothing is cast again."""
    lab = BrowserFormatExplorer("fp16", 0.1)
    lab.set_state({"bits": 0x3F800000, "fmt": "fp32", "typed": None})
    assert (lab.fmt, lab.bits, lab.typed, lab.value) == ("fp32", 0x3F800000, None, 1.0)
    lab.set_state({"fmt": "fp16", "typed": "65519", "bits": 0x7BFF})
    assert (lab.fmt, lab.bits, lab.typed) == ("fp16", 0x7BFF, "65519")
    ex = FormatExplorer("fp16")
    ex.set_decimal("65519")
    check_same(lab, ex)
    with pytest.raises(traitlets.TraitError, match="fp16 bit patterns have 16 bits"):
        lab.set_state({"bits": 0x10000})
    assert (lab.fmt, lab.bits) == ("fp16", 0x7BFF)


def refused(call):
    """The message and type of ``call``'s error (which must be one line), or None."""
    try:
        call()
    except (ValueError, TypeError, OverflowError) as e:
        assert one_line(str(e)), str(e)
        return type(e).__name__, str(e)
    return None


@pytest.mark.parametrize("kw", [{"fmt": "fp99"}, {"fmt": 3}, {"fmt": None}, {"value": "abc"}, {"value": None},
                                {"value": [1.0]}, {"value": 10**400}, {"value": "2^-24"}, {"value": "0.1"}])
def test_bad_arguments_are_format_explorers_errors(kw):
    assert refused(lambda: BrowserFormatExplorer(**kw)) == refused(lambda: FormatExplorer(**kw))


def test_a_format_of_ones_own_is_refused_in_one_line():
    """The page computes the twelve built-in formats. (FormatExplorer refuses another too: its
    dropdown has no such option, "Invalid selection: value not found".)"""
    mine = FloatFormat("fp12", 5, 6, 15)
    kind, message = refused(lambda: BrowserFormatExplorer(mine))
    assert kind == "ValueError" and "computes the built-in formats only" in message and "fp12" in message
    # one of one's own under a built-in format's name is not that format
    assert "built-in formats only" in refused(lambda: BrowserFormatExplorer(FloatFormat("fp16", 5, 6, 15)))[1]
    with pytest.raises(traitlets.TraitError):
        FormatExplorer(mine)
    lab = BrowserFormatExplorer("fp16")
    assert refused(lambda: lab.set_format(mine)) == (kind, message) and lab.fmt == "fp16"
    lab.fmt = " FP8-E4M3 "  # a name as get_format reads it, kept as the format's own
    assert lab.fmt == "fp8_e4m3"
    # an equal copy of a built-in format is that format
    same = FloatFormat("fp16", 5, 10, 15, torch_dtype="float16", description=ALL_FORMATS["fp16"].description)
    assert BrowserFormatExplorer(same).fmt == "fp16"


@pytest.mark.parametrize("action, arg", [("set_decimal", "abc"), ("set_decimal", ""), ("set_decimal", "2^^3"),
                                         ("set_decimal", "x" * 100), ("set_bits", -1), ("set_bits", 0x10000),
                                         ("set_bits", 1.5), ("set_bits", "0x3C00"), ("set_bits", 2**70),
                                         ("toggle_bit", 16), ("toggle_bit", -1), ("toggle_bit", "a"),
                                         ("set_format", "fp99"), ("set_format", 1.0), ("set_value", "abc"),
                                         ("set_value", None), ("set_value", 10**400)])
def test_bad_input_is_format_explorers_one_line_error_and_changes_nothing(action, arg):
    lab, ex = BrowserFormatExplorer("fp16", 0.1), FormatExplorer("fp16", 0.1)
    before = lab.get_state()
    got = refused(lambda: getattr(lab, action)(arg))
    assert got is not None and got == refused(lambda: getattr(ex, action)(arg))
    assert lab.get_state() == before


@pytest.mark.parametrize("name, value, words", [
    ("fmt", "fp99", "unknown format 'fp99'"), ("bits", 70000, "fp16 bit patterns have 16 bits: 0 to 65535"),
    ("bits", -1, "got -1"), ("bits", 1.5, "expected an int"), ("typed", "1,5", "could not read '1,5' as a number"),
    ("typed", " ", "type a number"), ("typed", 0.5, "expected a unicode string")])
def test_a_bad_setting_is_refused_in_one_line_and_changes_nothing(name, value, words):
    lab = BrowserFormatExplorer("fp16", 0.1)
    before = lab.get_state()
    with pytest.raises(traitlets.TraitError, match=words) as e:
        setattr(lab, name, value)
    assert one_line(str(e.value)) and lab.get_state() == before


# ----------------------------------------------------------------- every action, at random
TEXTS = st.one_of(
    st.sampled_from(["0.1", "1e-8", "65519", "2^-24", "2**-24", "-2^127", "inf", "-inf", "nan", "-nan", "0", "-0",
                     "1e-50", "1e39", "\u22120.5", " 448 ", "2^-1075", "1_000", "abc", "", "2^^3", "0x10"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(alphabet="0123456789.e-+_^*2 ", max_size=10))
ACTIONS = st.one_of(
    st.tuples(st.just("set_format"), st.sampled_from(list(ALL_FORMATS) + ["half", "float8_e4m3fn", "fp99"])),
    st.tuples(st.just("set_value"), st.floats(allow_nan=True, allow_infinity=True)),
    st.tuples(st.just("set_decimal"), TEXTS),
    st.tuples(st.just("set_bits"), st.one_of(st.integers(0, 2**16), st.integers(-2**40, 2**40))),
    st.tuples(st.just("toggle_bit"), st.integers(-2, 33)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(start=st.sampled_from(list(ALL_FORMATS)), actions=st.lists(ACTIONS, min_size=1, max_size=6))
def test_any_actions_show_what_format_explorer_shows(start, actions):
    lab, ex = BrowserFormatExplorer(start, 1.0), FormatExplorer(start, 1.0)
    for action, arg in actions:
        before = lab.get_state()
        got = refused(lambda: getattr(lab, action)(arg))
        assert got == refused(lambda: getattr(ex, action)(arg)), (action, arg)
        if got is not None:
            assert lab.get_state() == before
        check_same(lab, ex, figure=False)
    same_figure(lab.figure(), ex.figure)
    if lab.typed is not None:  # the typed text reads back as the number typed
        assert same_number(parse_number(lab.typed), ex.typed) or math.isnan(ex.typed)
