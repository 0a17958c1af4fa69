"""The format explorer on the formats beyond the course's six: fp8 fnuz, fp6, fp4 and E8M0.

Every bit pattern of every new format (at most 256 each) is reached by clicking the explorer's bit
buttons, and the value, the buttons, the hex box, the readout and the figure's marker must all say
what ``ampviz.formats`` decodes. The layout is checked against one written out here, so an
explorer that draws E8M0 with a sign bit (or fp4 with fp8's fields) fails.
"""

import math
import re

import pytest

import ampviz.widgets.format_explorer as fe
from ampviz import scaling
from ampviz.formats import ALL_FORMATS, FORMATS, get_format
from ampviz.widgets import FormatExplorer
from widget_checks import text  # tests/, on the path as pytest runs

NEW = [name for name in ALL_FORMATS if name not in FORMATS]

#: (has a sign bit, exponent bits, mantissa bits) of each new format, written out.
LAYOUTS = {
    "fp8_e4m3fnuz": (True, 4, 3),
    "fp8_e5m2fnuz": (True, 5, 2),
    "fp6_e3m2": (True, 3, 2),
    "fp6_e2m3": (True, 2, 3),
    "fp4_e2m1": (True, 2, 1),
    "e8m0": (False, 8, 0),
}



def css(widget):
    return set(widget._dom_classes)


def same(a: float, b: float) -> bool:
    """Equal, NaN equal to NaN, and -0 told from +0."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def layout_problems(ex) -> list:
    """How the explorer's bit row differs from the format's layout written out in LAYOUTS."""
    signed, e, m = LAYOUTS[ex.fmt.name]
    width = int(signed) + e + m
    want = (["sign"] if signed else []) + ["exponent"] * e + ["mantissa"] * m
    problems = []
    if len(ex.bit_buttons) != width:
        problems.append(f"{len(ex.bit_buttons)} buttons, not {width}")
    for j, (b, field) in enumerate(zip(ex.bit_buttons, want)):
        position = width - 1 - j
        if f"ampviz-bit-{position}" not in css(b) or f"ampviz-bit-{field}" not in css(b):
            problems.append(f"button {j} is {sorted(css(b))}, not bit {position} ({field})")
        if b.tooltip != f"bit {position} ({field})":
            problems.append(f"button {j} says {b.tooltip!r}")
    legend = text(ex.field_legend)
    if ("sign (1 bit)" in legend) != signed or ("no sign bit" in legend) == signed:
        problems.append(f"legend {legend!r}")
    return problems


def check_shows(ex, bits: int) -> None:
    """The explorer holds ``bits`` and every control, the readout and the figure agree with the core."""
    fmt = ex.fmt
    value = float(fmt.decode(bits))
    assert ex.bits == bits and same(ex.value, value) and ex.error is None
    assert [b.description for b in ex.bit_buttons] == list(format(bits, f"0{fmt.bits}b"))
    assert ex.hex_input.value == f"0x{bits:0{(fmt.bits + 3) // 4}X}"
    assert same(float(ex.decimal_input.value), value)
    readout = text(ex.readout)
    assert f"stored {value!r}" in readout
    assert re.sub(r"<[^>]+>|\s", "", ex.bits_readout.value).startswith(format(bits, f"0{fmt.bits}b"))
    fig = ex.figure
    top = [t for t in fig.data if t.name == "stored" and getattr(t, "xaxis", None) != "x2"]
    if math.isnan(value):
        assert top == [] and "NaN" in readout
        return
    lo, _ = fig.layout.xaxis.range
    assert top[0].x[0] == (lo + 1.0 if value == 0 else math.log2(abs(value)))
    assert fig.layout.meta["stored"] == value
    if fmt.name == "e8m0":
        assert f"value 2^{bits - 127} = {value!r}" in readout and "sign" not in readout.split("fields")[1][:12]


def gray(i: int) -> int:
    return i ^ (i >> 1)


@pytest.mark.parametrize("name", NEW)
def test_every_bit_pattern_round_trips_through_the_bit_buttons(name):
    """Walk every pattern in Gray-code order: each step is one click on one bit button."""
    fmt = ALL_FORMATS[name]
    ex = FormatExplorer(name, 0.0)
    assert layout_problems(ex) == []
    ex.set_bits(0)
    check_shows(ex, 0)
    seen = {0}
    for i in range(1, 1 << fmt.bits):
        flip = gray(i) ^ gray(i - 1)
        position = flip.bit_length() - 1
        ex.bit_buttons[fmt.bits - 1 - position].click()
        check_shows(ex, gray(i))
        seen.add(ex.bits)
    assert seen == set(range(1 << fmt.bits))


def test_a_wrong_layout_fails_the_check(monkeypatch):
    """The layout check catches E8M0 drawn with a sign bit."""
    monkeypatch.setattr(fe, "_has_sign", lambda fmt: True)
    ex = FormatExplorer("e8m0", 1.0)
    assert layout_problems(ex) != []


@pytest.mark.parametrize("name", NEW)
def test_the_dropdown_offers_every_format_and_labels_the_new_ones(name):
    ex = FormatExplorer("fp16", 0.1)
    options = dict((value, label) for label, value in ex.format_dropdown.options)
    assert list(options) == list(ALL_FORMATS)
    assert options[name].startswith(f"{name} (new") and all(options[n] == n for n in FORMATS)
    assert "MX/NVFP4" in options["fp4_e2m1"]
    ex.format_dropdown.value = name  # a learner's choice
    fmt = get_format(name)
    assert ex.fmt is fmt and ex.error is None and layout_problems(ex) == []
    assert same(ex.value, float(fmt.quantize(0.1)))
    ex.format_dropdown.value = "fp16"  # and back
    assert ex.fmt is get_format("fp16") and len(ex.bit_buttons) == 16 and ex.error is None


@pytest.mark.parametrize("name", NEW)
def test_starts_in_each_new_format(name):
    ex = FormatExplorer(name)
    assert ex.fmt is get_format(name) and ex.value == 1.0 and ex.error is None


@pytest.mark.parametrize("name, typed, stored, category, words", [
    ("fp8_e4m3fnuz", "1000", math.nan, "overflow", "becomes NaN"),
    ("fp8_e4m3fnuz", "-0", 0.0, "zero", ""),
    ("fp8_e5m2fnuz", "inf", math.nan, "overflow", "becomes NaN"),
    ("fp6_e3m2", "100", 28.0, "overflow", "saturated to 28"),
    ("fp6_e2m3", "-1e9", -7.5, "overflow", "saturated to 7.5"),
    ("fp4_e2m1", "5", 4.0, "normal", ""),
    ("fp4_e2m1", "0.2", 0.0, "underflow", "becomes 0"),
    ("e8m0", "0", 2.0**-127, "zero", "no zero"),
    ("e8m0", "-3", 4.0, "normal", "no sign"),
    ("e8m0", "2^-200", 2.0**-127, "underflow", "no zero"),
    ("e8m0", "1e39", math.nan, "overflow", "becomes NaN"),
    ("e8m0", "nan", math.nan, "nan", ""),
])
def test_typed_numbers_land_where_the_core_casts_them(name, typed, stored, category, words):
    fmt = get_format(name)
    ex = FormatExplorer(name)
    ex.decimal_input.value = typed
    assert ex.error is None and same(ex.value, stored) and same(ex.value, float(fmt.quantize(ex.typed)))
    assert ex.category == category and words in text(ex.readout)
    assert ex.decimal_input.value == typed


@pytest.mark.parametrize("name, hex_text, top", [
    ("fp8_e4m3fnuz", "0x100", 255), ("fp6_e3m2", "0x40", 63), ("fp6_e2m3", "0x40", 63),
    ("fp4_e2m1", "0x10", 15), ("e8m0", "0x100", 255),
])
def test_out_of_range_patterns_are_a_one_line_message(name, hex_text, top):
    ex = FormatExplorer(name, 1.0)
    before = ex.bits
    ex.hex_input.value = hex_text
    assert ex.bits == before and ex.error is not None and "\n" not in ex.error
    assert f"0 to {top}" in ex.error
    with pytest.raises(ValueError):
        ex.toggle_bit(ex.fmt.bits)


def test_fnuz_nan_is_0x80_and_there_is_no_minus_zero():
    ex = FormatExplorer("fp8_e4m3fnuz", 0.0)
    ex.bit_buttons[0].click()  # the sign bit of +0
    assert ex.bits == 0x80 and math.isnan(ex.value)
    assert "the pattern −0 would have is NaN" in text(ex.readout)
    ex.hex_input.value = "0x80"
    assert math.isnan(ex.value) and ex.error is None


def test_e8m0_has_no_sign_bit_and_no_mantissa():
    ex = FormatExplorer("e8m0", 1.0)
    assert ex.bits == 127 and len(ex.bit_buttons) == 8
    assert not any("sign" in b.tooltip or "mantissa" in b.tooltip for b in ex.bit_buttons)
    legend = text(ex.field_legend)
    assert "no sign bit" in legend and "no mantissa" in legend
    ex.bit_buttons[0].click()  # the top bit is an exponent bit: 0x7F -> 0xFF, NaN
    assert ex.bits == 0xFF and math.isnan(ex.value)
    ex.bit_buttons[0].click()
    ex.bit_buttons[-1].click()  # 0x7E: 2^-1
    assert ex.value == 0.5


def test_scaling_refuses_formats_without_inf_with_the_right_reason():
    with pytest.raises(ValueError, match="becomes NaN") as info:
        scaling._overflow_format("fp8_e4m3fnuz")
    assert "saturates" not in str(info.value)
    with pytest.raises(ValueError, match="becomes NaN"):
        scaling._overflow_format("e8m0")
    for name in ("fp8_e4m3", "fp4_e2m1", "fp6_e3m2"):
        with pytest.raises(ValueError, match="saturates"):
            scaling._overflow_format(name)
