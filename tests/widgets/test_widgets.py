"""Explorers, headless: set a control's value, check the state, readout and figure against the core."""

import math
import re

import numpy as np
import pytest

import ampviz.widgets as widgets
from ampviz.formats.census import census, profile
from ampviz.formats import CATEGORIES, FORMATS, get_format
from ampviz.plots import BAND_CATEGORIES, format_share, format_shares
from ampviz.widgets import FormatExplorer, RangeExplorer, parse_number
from widget_checks import move_quickly, text  # tests/, on the path as pytest runs
from layout_checks import contains, descendants  # tests/widgets/, on the path as pytest runs

GRADS = (np.random.default_rng(0).lognormal(-16.0, 3.0, 2000) * np.where(np.arange(2000) % 2, 1, -1)).astype(
    np.float32
)
GRADS[:5] = 0.0



def zoom_points(fig):
    """The zoom's markers: {name: value}, the value as its hover writes it (repr: exact)."""
    return {t.name: float(t.hovertext[0].split(": ")[1]) for t in fig.data
            if getattr(t, "xaxis", None) == "x2" and t.name != "values"}


def css(widget):
    return set(widget._dom_classes)


# ----- parsing -----
@pytest.mark.parametrize(
    "typed, value",
    [("0.1", 0.1), (" 1e-8 ", 1e-8), ("65519", 65519.0), ("2^-24", 2.0**-24), ("-2**10", -1024.0),
     ("inf", math.inf), ("−3", -3.0), ("2^5000", math.inf)],
)
def test_parse_number(typed, value):
    assert parse_number(typed) == value


@pytest.mark.parametrize("typed", ["abc", "", "0x3C00", "1,5"])
def test_parse_number_rejects_with_a_readable_message(typed):
    with pytest.raises(ValueError, match="number"):
        parse_number(typed)


# ----- RangeExplorer -----
@pytest.fixture
def range_explorer():
    return RangeExplorer(GRADS, fmt="fp16", log2_scale=0)


def _shares_in(ex):
    return {k: format_share(ex.result.fractions[k]) for k in BAND_CATEGORIES}


def test_range_explorer_starts_with_the_census_at_its_scale(range_explorer):
    ex = range_explorer
    expected = census(GRADS, "fp16", 1.0)
    assert ex.result.counts == expected.counts
    assert ex.result.scale == 1.0
    assert "scale = 2^0 = 1" in text(ex.scale_label)
    assert ex.figure is not None and ex.error is None


@pytest.mark.parametrize("k", [-16, -3, 8, 16, 32])
def test_range_explorer_slider_redraws_as_census_predicts(range_explorer, k):
    ex = range_explorer
    old_bars = list(ex.figure.data[0].x)
    old_range = list(ex.figure.layout.xaxis.range)
    ex.scale_slider.value = k
    expected = census(GRADS, "fp16", 2.0**k)
    assert ex.result.counts == expected.counts and ex.result.scale == 2.0**k
    bars = ex.figure.data[0]
    assert list(np.asarray(bars.x) - 0.5) == expected.log2_bins.tolist()
    assert list(bars.y) == expected.log2_counts.tolist()
    assert list(bars.x) != old_bars  # the histogram moved ...
    assert list(ex.figure.layout.xaxis.range) == old_range  # ... over a fixed axis
    readout = text(ex.readout)
    for cat in BAND_CATEGORIES:
        assert f"{cat} {format_share(expected.fractions[cat])}" in readout
    assert ex.figure.layout.meta["shares"] == format_shares(expected)
    assert f"2^{k}" in text(ex.scale_label)


def test_range_explorer_keeps_its_layout_while_the_scale_moves(range_explorer):
    """The shares live in the readout and the scale beside the slider: the figure's layout (less
    its meta) is the same at every scale whose tallest bar is the same, so FigureView sends only
    the traces and the browser moves them; a format change sends a new layout."""
    from ampviz.widgets.figureview import FigureView

    ex = range_explorer
    assert not [a for a in ex.figure.layout.annotations if a.name == "shares"]
    assert ex.figure.layout.title.text == "2,000 values × the scale above, in fp16"
    keys, styles, points = set(), set(), set()
    for k in (-3, 0, 5, 16):
        ex.scale_slider.value = k
        keys.add(FigureView.prepare(ex.figure).layout_key)
        # the traces differ only in their points and hovers
        traces = [t.to_plotly_json() for t in ex.figure.data]
        point_keys = ("x", "y", "hovertext")
        styles.add(repr([{k: v for k, v in t.items() if k not in point_keys} for t in traces]))
        points.add(repr([[np.asarray(t.get(k)).tolist() for k in point_keys] for t in traces]))
    assert len(keys) == 1 and len(styles) == 1 and len(points) == 4
    sent = ex.view.figure_layout
    ex.scale_slider.value = 6
    assert ex.view.figure_layout is sent  # not sent again
    ex.format_dropdown.value = "bf16"
    assert FigureView.prepare(ex.figure).layout_key not in keys and "bf16" in ex.figure.layout.title.text


def test_range_explorer_readout_is_the_figures_key(range_explorer):
    """The explorer's figure has no legend (a redraw without one is quicker); the readout keys the
    bands instead: before each band's name, a swatch in the band's colour at the bands' opacity,
    in the bands' order."""
    from ampviz.plots import BAND_OPACITY

    ex = range_explorer
    assert ex.figure.layout.showlegend is False
    assert not any(s.showlegend for s in ex.figure.layout.shapes)
    fills = {s.name: (s.fillcolor, s.opacity) for s in ex.figure.layout.shapes if s.type == "rect"}
    swatches = re.findall(r'class="ampviz-swatch" style="[^"]*background:([^;]+);opacity:([0-9.]+)"></span>'
                          r'<b style="color:[^"]+">(\w+)</b>', ex.readout.value)
    assert [(name, (color, float(opacity))) for color, opacity, name in swatches] == \
        [(cat, fills[cat]) for cat in BAND_CATEGORIES]
    assert all(opacity == BAND_OPACITY for _, opacity in fills.values())


def test_range_explorer_readout_keys_the_marks_under_bars_too_short_to_see():
    """The figure marks a bar too short to see with a triangle on the axis; with no legend, the
    readout says what the marks are (with them or without, so that the readout keeps its height
    while the scale moves), and each mark's hover says it too."""
    from ampviz.plots.census import SMALL_BAR_KEY

    def marks(ex):
        return sum(len(t.x) for t in ex.figure.data if t.meta["kind"] == "few")

    key = f"▲ on the axis: {SMALL_BAR_KEY}"
    few = np.concatenate([np.full(10_000, 1.5), np.full(3, 2.0**-26)]).astype(np.float32)
    ex = RangeExplorer(few, fmt="fp16")
    assert marks(ex) == 1 and key in text(ex.readout)
    hover = [h for t in ex.figure.data if t.meta["kind"] == "few" for h in t.hovertext]
    assert hover and all(h.startswith("▲ a bar too short to see at this height") for h in hover)
    even = RangeExplorer(np.full(100, 1.5, np.float32), fmt="fp16")
    assert marks(even) == 0 and key in text(even.readout)


def test_range_explorer_shares_change_when_the_scale_rescues_gradients(range_explorer):
    ex = range_explorer
    before = ex.result.fractions["underflow"]
    ex.scale_slider.value = 16
    assert ex.result.fractions["underflow"] < before
    assert ex.result.fractions["underflow"] == census(GRADS, "fp16", 2.0**16).fractions["underflow"]


def test_range_explorer_format_dropdown(range_explorer):
    ex = range_explorer
    assert list(ex.format_dropdown.options) == ["fp16", "bf16", "fp8_e4m3", "fp8_e5m2"]
    ex.scale_slider.value = 12
    ex.format_dropdown.value = "fp8_e4m3"
    expected = census(GRADS, "fp8_e4m3", 2.0**12)
    assert ex.result.fmt is get_format("fp8_e4m3")
    assert ex.result.counts == expected.counts
    assert ex.figure.layout.meta["fmt"] == "fp8_e4m3"
    rects = {s.name: s for s in ex.figure.layout.shapes if s.type == "rect"}
    assert rects["overflow"].x0 == math.log2(get_format("fp8_e4m3").overflow_boundary)


def test_range_explorer_axis_holds_every_reachable_bar(range_explorer):
    ex = range_explorer
    lo, hi = ex.figure.layout.xaxis.range
    for k in (ex.scale_slider.min, ex.scale_slider.max):
        ex.scale_slider.value = k
        x = np.asarray(ex.figure.data[0].x)
        assert lo <= x.min() - 0.5 and x.max() + 0.5 <= hi


def test_range_explorer_takes_a_profile_and_widens_the_slider():
    ex = RangeExplorer(profile(GRADS), fmt="bf16", log2_scale=40)
    assert ex.scale_slider.max == 40 and ex.scale_slider.value == 40
    assert ex.result.counts == census(GRADS, "bf16", 2.0**40).counts


def test_range_explorer_rejects_other_formats():
    with pytest.raises(ValueError, match="fp16, bf16, fp8_e4m3, fp8_e5m2"):
        RangeExplorer(GRADS, fmt="fp32")


def test_range_explorer_shows_callback_errors(range_explorer, monkeypatch):
    ex = range_explorer

    def broken(*args, **kwargs):
        raise RuntimeError("census failed")

    monkeypatch.setattr(widgets.range_explorer, "census", broken)
    ex.scale_slider.value = 4  # must not raise
    assert "census failed" in ex.error and "RuntimeError" in ex.error
    assert "census failed" in text(ex.message)
    monkeypatch.undo()
    ex.scale_slider.value = 5
    assert ex.error is None and text(ex.message) == ""
    assert ex.result.counts == census(GRADS, "fp16", 2.0**5).counts


def test_range_explorer_css_classes_and_display(range_explorer):
    ex = range_explorer
    assert "ampviz-range-explorer" in css(ex.ui)
    assert "ampviz-scale-slider" in css(ex.scale_slider)
    assert "ampviz-format-dropdown" in css(ex.format_dropdown)
    bundle = ex._repr_mimebundle_()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == ex.ui.model_id


# ----- FormatExplorer -----
def test_format_explorer_starts_at_its_value():
    ex = FormatExplorer("fp16", 1.0)
    assert ex.bits == get_format("fp16").encode(1.0) == 0x3C00
    assert ex.value == 1.0 and ex.category == "normal"
    assert ex.hex_input.value == "0x3C00"
    assert [b.description for b in ex.bit_buttons] == list(format(0x3C00, "016b"))
    assert ex.figure is not None and ex.error is None


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("which", ["sign", "top exponent", "low exponent", "top mantissa", "last mantissa"])
def test_toggling_a_bit_stores_the_decoded_pattern(name, which):
    fmt = FORMATS[name]
    ex = FormatExplorer(fmt, 0.1)
    m = fmt.mantissa_bits
    position = {"sign": fmt.bits - 1, "top exponent": fmt.bits - 2, "low exponent": m,
                "top mantissa": m - 1, "last mantissa": 0}[which]
    old = ex.bits
    button = ex.bit_buttons[fmt.bits - 1 - position]
    assert f"ampviz-bit-{position}" in css(button)
    button.click()
    new = old ^ (1 << position)
    assert ex.bits == new
    expected = fmt.decode(new)
    assert ex.value == expected or (math.isnan(ex.value) and math.isnan(expected))
    assert ex.typed is None
    assert ex.hex_input.value == f"0x{new:0{(fmt.bits + 3) // 4}X}"
    assert ex.error is None


def test_typing_65519_in_fp16_stores_65504():
    ex = FormatExplorer("fp16")
    ex.decimal_input.value = "65519"
    fmt = get_format("fp16")
    assert ex.value == fmt.quantize(65519.0) == 65504.0
    assert ex.category == "normal"
    readout = text(ex.readout)
    assert "stored 65504.0" in readout
    assert f"typed − stored = {65519.0 - 65504.0!r}" in readout
    below, above = fmt.neighbours(65504.0)
    assert f"below {below!r} above {above!r}" in readout
    assert f"ulp here {fmt.ulp(65504.0)!r}" in readout
    assert "exponent 11110 = 30, 30 − bias 15 = 15" in readout


def test_typing_65520_in_fp16_overflows_to_inf():
    ex = FormatExplorer("fp16")
    ex.decimal_input.value = "65520"
    assert ex.value == get_format("fp16").quantize(65520.0) == math.inf
    assert ex.category == "overflow"
    readout = text(ex.readout)
    assert "stored inf" in readout and "overflow" in readout and "becomes inf" in readout
    assert [a.text for a in ex.figure.layout.annotations if a.name == "zoom"] == ["inf: beyond max = 65504"]


def test_typing_a_decimal_shows_rounding_error_neighbours_and_fields():
    fmt = get_format("fp16")
    ex = FormatExplorer(fmt)
    ex.decimal_input.value = "0.1"
    stored = fmt.quantize(0.1)
    assert ex.value == stored and ex.typed == 0.1 and ex.bits == fmt.encode(0.1)
    readout = text(ex.readout)
    assert f"typed − stored = {0.1 - stored!r}" in readout
    assert f"relative {abs(0.1 - stored) / 0.1:.3g}" in readout
    sign, exp, man = fmt.fields(ex.bits)
    assert f"{exp} − bias {fmt.bias} = {exp - fmt.bias}" in readout
    assert f"mantissa {man:010b} = {man}" in readout
    below, above = fmt.neighbours(0.1)
    assert zoom_points(ex.figure) == {"below": below, "stored": stored, "above": above, "typed": 0.1}
    assert ex.decimal_input.value == "0.1"  # what was typed stays in the box


@pytest.mark.parametrize(
    "name, typed, category",
    [("fp16", "1e-8", "underflow"), ("fp16", "2^-24", "subnormal"), ("fp8_e4m3", "500", "overflow"),
     ("fp8_e5m2", "-inf", "overflow"), ("bf16", "0", "zero")],
)
def test_typed_values_land_where_the_core_says(name, typed, category):
    fmt = FORMATS[name]
    ex = FormatExplorer(fmt)
    ex.decimal_input.value = typed
    x = parse_number(typed)
    assert ex.value == fmt.quantize(x)
    assert ex.category == category == CATEGORIES[int(fmt.classify_codes(x))]
    assert category in text(ex.readout)


def test_fp8_e4m3_saturates_instead_of_inf():
    ex = FormatExplorer("fp8_e4m3")
    ex.decimal_input.value = "500"
    assert ex.value == 448.0
    assert "saturated to 448" in text(ex.readout)


def test_typing_nan_is_valid_and_shows_nan():
    ex = FormatExplorer("fp16")
    ex.decimal_input.value = "nan"
    assert math.isnan(ex.value) and ex.category == "nan" and ex.error is None
    assert ex.bits == get_format("fp16").nan_bits
    assert "NaN" in text(ex.readout)


def test_typing_abc_shows_a_message_and_keeps_the_value():
    ex = FormatExplorer("fp16", 2.0)
    ex.decimal_input.value = "abc"  # must not raise
    assert ex.value == 2.0
    assert "could not read 'abc' as a number" in ex.error
    assert "could not read 'abc' as a number" in text(ex.message)
    ex.decimal_input.value = "3"
    assert ex.value == 3.0 and ex.error is None and text(ex.message) == ""


def test_out_of_range_bit_pattern_shows_a_message():
    ex = FormatExplorer("fp8_e5m2", 1.0)
    ex.hex_input.value = "0x1FF"
    assert ex.value == 1.0
    assert "0 to 255" in ex.error
    ex.hex_input.value = "zz"
    assert "bit pattern" in ex.error
    ex.hex_input.value = "0x7d"  # a NaN pattern of E5M2
    assert ex.bits == 0x7D and math.isnan(ex.value) and ex.error is None


@pytest.mark.parametrize("name", FORMATS)
def test_switching_format_rebuilds_the_bit_row(name):
    ex = FormatExplorer("fp16", 0.1)
    ex.format_dropdown.value = name
    fmt = FORMATS[name]
    assert ex.fmt is fmt
    assert len(ex.bit_buttons) == len(ex.bits_row.children) == fmt.bits
    assert f"ampviz-bit-{fmt.bits - 1}" in css(ex.bit_buttons[0])
    assert "ampviz-bit-0" in css(ex.bit_buttons[-1])
    assert ex.typed == 0.1 and ex.value == fmt.quantize(0.1)  # the typed number is re-encoded
    # and the new row works
    ex.bit_buttons[-1].click()
    assert ex.value == fmt.decode(fmt.encode(0.1) ^ 1)


def test_fp32_and_tf32_bit_rows_wrap():
    ex = FormatExplorer("fp32", 1.0)
    assert len(ex.bit_buttons) == 32
    assert ex.bits_row.layout.flex_flow == "row wrap"
    ex.format_dropdown.value = "tf32"
    assert len(ex.bit_buttons) == 19
    assert {f"ampviz-bit-{i}" for i in range(19)} == set().union(*(css(b) for b in ex.bit_buttons)) - {
        "ampviz-bit-sign", "ampviz-bit-exponent", "ampviz-bit-mantissa"}


def test_methods_mirror_the_controls():
    ex = FormatExplorer("bf16")
    ex.set_bits(0x4049)
    assert ex.value == get_format("bf16").decode(0x4049)
    ex.toggle_bit(15)
    assert ex.value == -get_format("bf16").decode(0x4049)
    with pytest.raises(ValueError):
        ex.toggle_bit(16)
    with pytest.raises(TypeError):
        ex.set_bits(1.5)


def test_format_explorer_css_classes_and_display():
    ex = FormatExplorer()
    assert "ampviz-format-explorer" in css(ex.ui)
    assert "ampviz-decimal-input" in css(ex.decimal_input)
    assert "ampviz-format-dropdown" in css(ex.format_dropdown)
    names = [value for _, value in ex.format_dropdown.options]
    assert names[: len(FORMATS)] == list(FORMATS)  # the course's six first, by name
    assert [label for label, _ in ex.format_dropdown.options][: len(FORMATS)] == list(FORMATS)
    bundle = ex._repr_mimebundle_()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == ex.ui.model_id


# ----- ScalerLab -----
def _lab(**kw):
    from ampviz.widgets import ScalerLab

    return ScalerLab(steps=20_000, **kw)


def test_scaler_lab_simulates_torchs_rule_on_the_scenario_stream():
    from ampviz.scaling import synth
    from ampviz.scaling import TorchGradScaler, simulate

    lab = _lab(scenario="spikes", strength=0.5)
    stream = synth.scenario("spikes", 20_000, 0.5, np.random.default_rng(0))
    assert np.array_equal(lab.stream, stream)
    ref = simulate(TorchGradScaler(), grad_max=stream)
    mine = lab.traces[0]
    assert np.array_equal(mine.scale, ref.scale) and np.array_equal(mine.skipped, ref.skipped)
    assert mine.skipped_count > 0 and f"{mine.skipped_count:,}" in lab.readout.value


def test_scaler_lab_loss_dtype_is_the_overflow_model():
    """The loss control picks the overflow model: with a float32 loss (the default, as autocast
    computes it) small gradients pass at 2^16 and the scale grows past it; with an fp16 loss the
    scale itself is inf in fp16 there, so every step at 2^16 overflows."""
    from ampviz.scaling import synth
    from ampviz.scaling import TorchGradScaler, simulate

    lab = _lab(scenario="steady", strength=0.0, growth_interval=100)
    assert lab.loss_dropdown.value == "float32" and lab.traces[0].scale.max() > 2.0**16
    assert "float32 loss" in lab.figure.layout.title.text
    lab.loss_dropdown.value = "float16"
    stream = synth.scenario("steady", 20_000, 0.0, np.random.default_rng(0))
    ref = simulate(TorchGradScaler(growth_interval=100), grad_max=stream, loss_dtype="float16")
    assert np.array_equal(lab.traces[0].scale, ref.scale) and lab.traces[0].skipped[0]
    assert lab.traces[0].scale.max() == 2.0**16 and "fp16 loss" in lab.figure.layout.title.text
    with pytest.raises(ValueError, match="loss_dtype must be 'float32'"):
        _lab(loss_dtype="bfloat16")
    assert "ampviz-scaler-lab" in css(lab.ui) and lab.figure is not None and lab.error is None


def test_scaler_lab_controls_redraw():
    from ampviz.scaling import synth
    from ampviz.scaling import TorchGradScaler, simulate

    lab = _lab()
    lab.init_slider.value = 10
    line = lab.figure.data[0]
    assert line.y[0] == 10 and lab.traces[0].scale[0] == 2.0**10
    lab.growth_slider.value = 1.5
    lab.backoff_slider.value = 0.25
    lab.interval_input.value = 100
    expected = simulate(TorchGradScaler(2.0**10, 1.5, 0.25, 100), grad_max=lab.stream)
    assert np.array_equal(lab.traces[0].scale, expected.scale)
    lab.scenario_dropdown.value = "warmup"
    lab.strength_slider.value = 1.0
    assert np.array_equal(lab.stream, synth.scenario("warmup", 20_000, 1.0, np.random.default_rng(0)))
    assert "warmup" in lab.figure.layout.title.text
    lost = [d for d in lab.figure.data if d.meta["kind"] == "lost"]
    assert len(lost) == 1 and lab.lost is not None


def test_scaler_lab_every_control_position_is_valid():
    """Home and End on a slider (or any value a front end sends) land on a valid setting: growth
    above 1, backoff strictly between 0 and 1, an interval of at least 1. The old ranges reached
    1.0 (growth), 0 and 1.0 (backoff): each was an error and the plot stopped following."""
    lab = _lab()
    for control in (lab.init_slider, lab.growth_slider, lab.backoff_slider, lab.strength_slider):
        for end in (control.min, control.max):
            control.value = end
            assert lab.error is None, (control.description, end)
            assert lab.traces[0].policy.name == "your settings"
        control.value = control.min if control is not lab.backoff_slider else 0.5
    assert lab.growth_slider.min > 1 and 0 < lab.backoff_slider.min and lab.backoff_slider.max < 1
    for value in (1.0, 0.0, -3.0):  # beyond the ends, a value is clamped to the nearest valid one
        lab.growth_slider.value = value
        assert lab.growth_slider.value == lab.growth_slider.min and lab.error is None
    for value in (0.0, -3.0):
        lab.backoff_slider.value = value
        assert lab.backoff_slider.value == lab.backoff_slider.min and lab.error is None
    lab.backoff_slider.value = 1.0
    assert lab.backoff_slider.value == lab.backoff_slider.max < 1 and lab.error is None
    lab.interval_input.value = 0
    assert lab.interval_input.value == 1 and lab.error is None
    lab.interval_input.value = 10**8
    assert lab.interval_input.value == 10**7 and lab.error is None


@pytest.mark.parametrize("kwargs, message", [
    (dict(growth_factor=1.0), "growth_factor must be a finite number above 1"),
    (dict(growth_factor=0.5), "growth_factor must be a finite number above 1"),
    (dict(backoff_factor=1.0), "backoff_factor must be between 0 and 1"),
    (dict(backoff_factor=0.0), "backoff_factor must be between 0 and 1"),
    (dict(growth_interval=0), "growth_interval must be"),
])
def test_scaler_lab_refuses_settings_no_slider_can_show(kwargs, message):
    from ampviz.widgets import ScalerLab

    with pytest.raises(ValueError, match=re.escape(message)) as info:
        ScalerLab(steps=100, **kwargs)
    assert "\n" not in str(info.value)


def test_scaler_lab_valid_values_beyond_the_usual_range_are_shown_as_given():
    lab = _lab(growth_factor=1.0005, backoff_factor=0.9999, growth_interval=1)
    assert (lab.growth_slider.value, lab.backoff_slider.value) == (1.0005, 0.9999) and lab.error is None
    assert lab.growth_slider.min == 1.0005 and lab.backoff_slider.max == 0.9999


def test_scaler_lab_overlays_presets():
    from ampviz.scaling import PRESETS, simulate

    lab = _lab()
    options = [value for _, value in lab.overlay.options]
    assert options == [name for name in PRESETS if name != "torch"]
    # the scalers new training runs with come first; the legacy ones last, and labelled so
    labels = [label for label, _ in lab.overlay.options]
    assert labels[-4:] == ["Keras 2 (legacy)", "apex amp (legacy)", "fairseq (legacy)", "metaseq (legacy)"]
    assert not any("legacy" in label for label in labels[:-4])
    chosen = tuple(options[:2])
    lab.overlay.value = chosen
    assert [t.policy.name for t in lab.traces[1:]] == [PRESETS[n].name for n in chosen]
    for name, t in zip(chosen, lab.traces[1:]):
        assert np.array_equal(t.skipped, simulate(PRESETS[name], grad_max=lab.stream).skipped)
    scale_lines = [d for d in lab.figure.data if d.meta["kind"] == "scale"]
    assert len(scale_lines) == 1 + len(chosen)


def test_scaler_lab_says_why_a_run_ended():
    lab = _lab(scenario="spikes", strength=1.0, overlay=("DeepSpeed ZeRO",))
    zero = lab.traces[1]
    assert zero.stopped_at is not None and zero.stop_reason
    assert f"stopped at step {zero.stopped_at:,} (Exception: Current loss scale already at minimum" in lab.readout.value


def test_the_view_is_a_package_one_module_per_explorer():
    import importlib

    from ampviz.widgets import (BlockExplorer, ExplorerApp, FormatExplorer, Fp8ScalingLab, LiveTrainer, RangeExplorer,
                                RanksLab, ScalerLab)
    from ampviz.widgets.base import _Explorer

    explorers = (BlockExplorer, FormatExplorer, Fp8ScalingLab, LiveTrainer, RangeExplorer, RanksLab, ScalerLab)
    modules = {cls.__module__ for cls in (ExplorerApp, *explorers)}
    assert modules == {"ampviz.widgets.app", "ampviz.widgets.block_explorer", "ampviz.widgets.format_explorer",
                       "ampviz.widgets.fp8_lab", "ampviz.widgets.live_trainer", "ampviz.widgets.range_explorer",
                       "ampviz.widgets.ranks_lab", "ampviz.widgets.scaler_lab"}
    assert all(issubclass(cls, _Explorer) for cls in explorers)
    from ampviz.widgets import BrowserScalerLab
    assert BrowserScalerLab.__module__ == "ampviz.widgets.browser_scaler_lab"
    assert importlib.import_module("ampviz.widgets").__all__ == [
        "BlockExplorer", "BrowserBlockExplorer", "BrowserFormatExplorer", "BrowserFp8ScalingLab", "BrowserRangeExplorer", "BrowserScalerLab",
        "ExplorerApp", "FormatExplorer", "Fp8ScalingLab", "LiveTrainer", "RangeExplorer", "RanksLab",
        "ScalerLab", "parse_number", "running_trainers"]


def test_compare_with_fits_its_names_and_says_how_to_pick_several():
    from ampviz.widgets import ScalerLab

    lab = ScalerLab(steps=1000)
    assert lab.overlay.layout.width == "340px" and "Ctrl" in lab.overlay_hint.value
    assert any(lab.overlay_hint in w.children and lab.overlay in w.children for w in descendants(lab.ui)
               if hasattr(w, "children"))  # under the list


# ----- figures updated in place; moves from the browser coalesced -----
def _trace_ys(fig):
    return [np.asarray(t.y if t.y is not None else [], dtype=float) for t in fig.data]


def _view_y(view, i: int = 0) -> np.ndarray:
    """Trace ``i``'s y as the view holds it (packed as FigureView sends it, plotly's base64
    typed-array form, or a list)."""
    import base64

    y = view.data[i]["y"]
    if isinstance(y, dict) and "ampviz_nd" in y:
        return np.frombuffer(base64.b64decode(y["b64"]), dtype="<" + y["ampviz_nd"]).astype(float)
    if isinstance(y, dict):
        return np.frombuffer(base64.b64decode(y["bdata"]), dtype=y["dtype"]).astype(float)
    return np.asarray(y, dtype=float)


def _same_figure(a, b) -> bool:
    ya, yb = _trace_ys(a), _trace_ys(b)
    return len(ya) == len(yb) and all(np.array_equal(x, y, equal_nan=True) for x, y in zip(ya, yb)) \
        and a.layout.title.text == b.layout.title.text


def test_figures_are_updated_in_place_in_one_view():
    """Every explorer keeps one FigureView and assigns new traces to it; the layout travels only
    when it changed (most moves of the backoff slider change only the data: the axes' ranges
    move only when the scales cross a tick)."""
    from ampviz.widgets.figureview import FigureView

    lab = _lab()
    view = lab.view
    assert isinstance(view, FigureView) and contains(lab.ui, view)
    sent = []
    view.observe(lambda c: sent.append(c["name"]), names=["data", "figure_layout"])
    shown = FigureView.prepare(lab.figure).layout_key
    same = [v for v in np.round(np.arange(0.3, 0.95, 0.05), 2)
            if FigureView.prepare(lab._drawn(backoff_slider=float(v))[3]).layout_key == shown and v != 0.5]
    assert len(same) >= 3, same  # most neighbours keep the layout
    lab.backoff_slider.value = float(same[0])
    assert lab.view is view and sent == ["data"]
    assert np.array_equal(_view_y(view), lab.figure.data[0].y)
    lab.scenario_dropdown.value = "warmup"  # a new title: the layout is sent too
    assert sent[1:] == ["data", "figure_layout"] and "warmup" in view.figure_layout["title"]["text"]
    for ex in (FormatExplorer("fp16", 0.1), RangeExplorer(GRADS)):
        assert isinstance(ex.view, FigureView) and ex.view.data


@pytest.mark.parametrize("which", ["scaler", "range"])
def test_browser_moves_are_coalesced_and_the_last_position_wins(which, monkeypatch):
    """Ten slider moves from the browser (``set_state``, as the front end sends them) while the
    explorer computes: the intermediate positions are dropped, and the figure and readout end at
    the final position's, equal to a fresh explorer's at that position."""
    if which == "scaler":
        ex, slider, values = _lab(), "backoff_slider", [round(0.3 + 0.02 * k, 3) for k in range(10)]
    else:
        ex, slider, values = RangeExplorer(GRADS), "scale_slider", list(range(1, 11))
    move_quickly(ex, slider, values, monkeypatch)
    if which == "scaler":
        fresh = _lab(backoff_factor=values[-1])
        assert ex.readout.value == fresh.readout.value
    else:
        fresh = RangeExplorer(GRADS, log2_scale=values[-1])
        assert ex.result.counts == fresh.result.counts and ex.readout.value == fresh.readout.value
    assert _same_figure(ex.figure, fresh.figure)
    assert np.array_equal(_view_y(ex.view), _trace_ys(fresh.figure)[0], equal_nan=True)
    # the plausible wrong variant: the figure of an intermediate position differs
    assert not _same_figure(ex.figure, (_lab(backoff_factor=values[-2]) if which == "scaler"
                                        else RangeExplorer(GRADS, log2_scale=values[-2])).figure)


def test_a_move_made_in_python_redraws_before_it_returns():
    lab = _lab()
    lab.backoff_slider.value = 0.25
    assert lab._worker is None and lab.traces[0].policy.backoff_factor == 0.25
    assert lab.settle(0)


def test_a_browser_move_that_fails_shows_its_message(monkeypatch):
    ex = RangeExplorer(GRADS)

    def broken(*a, **k):
        raise RuntimeError("census failed")

    monkeypatch.setattr(widgets.range_explorer, "census", broken)
    ex.scale_slider.set_state({"value": 3})
    assert ex.settle(30)
    assert "census failed" in ex.error and "census failed" in text(ex.message)


@pytest.mark.parametrize("bad", [-1, float("nan"), "soon", None, True])
def test_settle_refuses_a_bad_timeout(bad):
    with pytest.raises((TypeError, ValueError), match="timeout"):
        _lab().settle(bad)


def test_scaler_lab_works_ahead_on_the_moved_slider_and_its_runs_are_exact():
    """After moves from the browser, the next positions of the moved slider are run ahead; the
    run a later move finds is the run a fresh ScalerLab computes at that position, bit for bit."""
    lab = _lab()
    s = lab.backoff_slider
    s.set_state({"value": 0.5 + 0.005})  # a browser's sum: 0.505 exactly here
    assert lab.settle(30) and s.value == 0.505
    ahead = lab._on_grid(s, s.value + s.step)
    assert ahead == 0.51 and ("yours", lab._settings(backoff_slider=0.51)) in lab._runs
    s.set_state({"value": 0.505 + 0.005})  # 0.51000000000000001 in binary: runs as 0.51
    assert lab.settle(30) and s.value == 0.505 + 0.005  # the slider keeps what the browser sent
    assert lab.traces[0].policy.backoff_factor == 0.51
    fresh = _lab(backoff_factor=0.51)
    assert np.array_equal(lab.traces[0].scale, fresh.traces[0].scale)
    assert np.array_equal(lab.traces[0].skipped, fresh.traces[0].skipped)
    assert lab.readout.value == fresh.readout.value and _same_figure(lab.figure, fresh.figure)
    # a wrong variant: the run of the neighbouring position is a different run
    assert not np.array_equal(lab.traces[0].scale, _lab(backoff_factor=0.515).traces[0].scale)
    assert len(lab._runs) <= 2 * lab.KEPT_RUNS
    # the figure was drawn ahead too: what the view sent is what a fresh ScalerLab sends
    assert _sent(lab.view) == _sent(fresh.view) != _sent(_lab(backoff_factor=0.515).view)
    assert len(lab._drawn_states) <= lab.KEPT_RUNS


def test_scaler_lab_keeps_few_streams_and_a_revisited_one_draws_the_same():
    """A sweep over every scenario and strength keeps a bounded number of gradient streams (each
    is steps long: a million steps at every position once took RSS from 92 to 592 MiB), and a
    stream dropped and made again draws exactly what it drew the first time."""
    from ampviz.scaling import synth

    lab = _lab(overlay=("DeepSpeed",))
    first, first_stream = _sent(lab.view), lab.stream.copy()
    kept = []
    for scenario in synth.SCENARIOS:
        for strength in (0.0, 0.25, 0.5, 0.75, 1.0):
            lab.scenario_dropdown.value = scenario
            lab.strength_slider.value = strength
            assert lab.error is None
            kept.append(len(lab._streams))
    assert max(kept) <= lab.KEPT_STREAMS < len(synth.SCENARIOS) * 5, kept
    assert ("spikes", 0.5) not in lab._streams  # dropped by the sweep
    lab.scenario_dropdown.value, lab.strength_slider.value = "spikes", 0.5
    assert np.array_equal(lab.stream, first_stream) and _sent(lab.view) == first
    assert _sent(lab.view) == _sent(_lab(overlay=("DeepSpeed",)).view)


def _sent(view):
    """What a FigureView sends for its traces and layout (the wire's text)."""
    import json

    from ampviz.widgets.figureview import _to_json

    return json.dumps([_to_json(view.data, view), _to_json(view.figure_layout, view)], sort_keys=True)


def test_range_explorer_draws_the_next_positions_ahead_and_they_are_exact():
    """After a move from the browser, the scale slider's neighbours are drawn ahead (the way it
    moved first); a later move shows them, and the view sends exactly what a fresh explorer's
    sends at that position."""
    from ampviz.widgets import RangeExplorer

    ex = RangeExplorer(GRADS, fmt="fp16", log2_scale=0, log2_scale_range=(-4, 4))
    ex.scale_slider.set_state({"value": 1})
    assert ex.settle(30)
    keys = [k[:2] for k in ex._drawn_states]
    assert (2, "fp16") in keys and (0, "fp16") in keys and keys.index((2, "fp16")) < keys.index((0, "fp16"))
    ex.scale_slider.set_state({"value": 2})
    assert ex.settle(30)
    fresh = RangeExplorer(GRADS, fmt="fp16", log2_scale=2, log2_scale_range=(-4, 4))
    assert _sent(ex.view) == _sent(fresh.view) and ex.readout.value == fresh.readout.value
    assert ex.scale_label.value == fresh.scale_label.value
    assert _sent(ex.view) != _sent(RangeExplorer(GRADS, fmt="fp16", log2_scale=3, log2_scale_range=(-4, 4)).view)
    ex.scale_slider.set_state({"value": 4})  # the top: nothing beyond it is drawn
    assert ex.settle(30) and all(k[0] <= 4 for k in ex._drawn_states)
    assert len(ex._drawn_states) <= ex.KEPT_DRAWN


def test_scaler_lab_reuses_the_frameworks_runs_while_only_your_settings_move(monkeypatch):
    from ampviz import scaling

    lab = _lab(overlay=("DeepSpeed ZeRO",))
    calls = []
    real = scaling.simulate
    monkeypatch.setattr(scaling, "simulate", lambda p, **k: (calls.append(p.name), real(p, **k))[1])
    lab.backoff_slider.value = 0.25
    assert calls == ["your settings"]
    lab.scenario_dropdown.value = "warmup"  # a new stream: every scaler runs again
    assert sorted(calls[1:]) == sorted(["your settings", scaling.PRESETS["DeepSpeed ZeRO"].name])


def test_readout_tables_space_their_columns():
    """Every readout table's cells carry space to their right: a bare table in a widget's HTML has
    none, and in Voila "final scale" ran into "lowest scale"."""
    from ampviz.widgets import BlockExplorer, RanksLab, ScalerLab
    from ampviz.widgets.base import _table

    for readout in (ScalerLab(steps=200).readout.value, BlockExplorer().readout.value,
                    RanksLab(steps=30).readout.value):
        cells = re.findall(r"<(td|th)( [^>]*)?>", readout)
        assert cells and all("padding: 0 1.2em 0 0" in (attrs or "") for _, attrs in cells), readout
    # the helper's shape: a head row, then one row per entry, cells as given
    got = _table(("a", "b"), [("1", "2"), ("3", "&lt;4")])
    assert re.sub(r" style=\"[^\"]*\"", "", got) == (
        '<table class="ampviz-readout-table"><tr><th>a</th><th>b</th></tr>'
        "<tr><td>1</td><td>2</td></tr><tr><td>3</td><td>&lt;4</td></tr></table>")


@pytest.mark.parametrize("make, slider, value", [
    (lambda: widgets.ScalerLab(steps=500), "backoff_slider", 0.25),
    (lambda: RangeExplorer(GRADS, fmt="fp16", log2_scale=0), "scale_slider", 3),
    (lambda: widgets.BlockExplorer(), "outlier_slider", 5),
    (lambda: widgets.Fp8ScalingLab(), "spike_slider", 4),
])
def test_a_move_sends_the_figure_before_the_readout(make, slider, value):
    """A move's figure leaves the kernel before its readout: the browser then starts plotly's draw,
    the slow part of a repaint, as early as it can (the readout arrives while it draws)."""
    ex = make()
    sent = []
    ex.view.observe(lambda change: sent.append("figure"), names="revision")
    ex.readout.observe(lambda change: sent.append("readout"), names="value")
    getattr(ex, slider).value = value
    assert sent[:1] == ["figure"] and "readout" in sent, sent


@pytest.mark.parametrize("press", [
    lambda ex: ex.bit_buttons[-1].click(),  # a bit pressed (the button's own click)
    lambda ex: setattr(ex.hex_input, "value", "0x3C00"),
    lambda ex: setattr(ex.format_dropdown, "value", "bf16"),
])
def test_a_format_explorer_change_sends_the_figure_first(press, monkeypatch):
    """FormatExplorer sends a change's figure before anything else it changes (the bit buttons,
    the hex and decimal boxes, the readouts), so the browser starts plotly's draw first; and it
    waits for the kernel to send it before it changes them."""
    import ampviz.widgets.format_explorer as fe

    ex = FormatExplorer("fp16", 0.1)
    sent = []
    monkeypatch.setattr(fe, "_wait_until_sent", lambda: sent.append("sent"))
    ex.view.observe(lambda change: sent.append("figure"), names="revision")
    for name, w in (("readout", ex.readout), ("bits", ex.bits_readout), ("hex", ex.hex_input),
                    ("decimal", ex.decimal_input)):
        w.observe(lambda change, name=name: sent.append(name), names="value")
    for b in ex.bit_buttons:
        b.observe(lambda change: sent.append("button"), names="description")
    press(ex)
    assert ex.error is None
    assert sent[:2] == ["figure", "sent"] and sent.count("sent") == 1 and "readout" in sent and len(sent) > 3, sent


def test_scaler_lab_counts_skips_in_its_readout_not_its_legend():
    """ScalerLab's figure names each scaler without counts (a move then keeps its layout); the
    readout says how many steps were skipped and, when the marks are thinned, how many are marked,
    as the figure marks them."""
    from ampviz.plots import _marked_part

    class FewMarks(widgets.ScalerLab):
        MARKS = 5

    lab = FewMarks(steps=20_000, scenario="spikes", strength=1.0)
    scale = [d for d in lab.figure.data if d.meta["kind"] == "scale"]
    marks = [d for d in lab.figure.data if d.meta["kind"] == "skipped"]
    assert [d.name for d in scale] == ["your settings"] and [d.name for d in marks] == ["your settings: skipped"]
    run = lab.traces[0]
    assert run.skipped_count > lab.MARKS and len(marks[0].x) == lab.MARKS
    part = _marked_part(lab.MARKS, run.skipped_count)
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", lab.readout.value)
    assert cells[:2] == ["your settings", f"{run.skipped_count:,} ({part} marked)"] and part.startswith("1 in ")


def test_wait_until_sent_waits_for_the_iopub_thread_and_only_in_a_kernel(monkeypatch):
    """Outside a kernel there is nothing to wait for; in one, the wait ends when the IOPub thread
    runs what was scheduled after the queued messages (and not before: a thread that never gets to
    it makes the wait time out)."""
    import time
    import types

    from ipykernel.kernelbase import Kernel

    from ampviz.widgets.base import _wait_until_sent

    assert _wait_until_sent(5) is False  # these tests run outside a kernel
    ran = []
    thread = types.SimpleNamespace(schedule=lambda f: (ran.append(f), f()))
    monkeypatch.setattr(Kernel, "initialized", classmethod(lambda cls: True))
    monkeypatch.setattr(Kernel, "instance", classmethod(lambda cls: types.SimpleNamespace(iopub_thread=thread)))
    assert _wait_until_sent(5) is True and len(ran) == 1
    thread.schedule = lambda f: None  # a thread that never runs it
    t = time.monotonic()
    assert _wait_until_sent(0.2) is False and time.monotonic() - t >= 0.15
    monkeypatch.setattr(Kernel, "instance", classmethod(lambda cls: types.SimpleNamespace()))
    assert _wait_until_sent(5) is False  # a kernel without an IOPub thread to ask


def test_range_explorer_in_bf16_writes_the_overflow_bands_words_whole():
    """bf16's overflow band is a sliver of its 282-binade axis: "becomes inf" written from the band's
    edge ran past the figure ("becomes in"); it is set against the plot's right edge instead."""
    ex = RangeExplorer(GRADS, fmt="bf16")
    notes = {a.name: a for a in ex.figure.layout.annotations}
    over, hi = notes["overflow-band"], ex.figure.layout.xaxis.range[1]
    assert over.text == "becomes inf" and over.xanchor == "right" and over.x == hi
    assert notes["underflow-band"].text == "becomes 0"
    ex.format_dropdown.value = "fp16"  # room enough: at the band's edge, as before
    over = {a.name: a for a in ex.figure.layout.annotations}["overflow-band"]
    assert over.text == "becomes inf" and over.xanchor == "left" and over.x == math.log2(get_format("fp16").overflow_boundary)


def test_scaler_lab_draws_each_framework_in_its_own_colour():
    from ampviz.plots import PRESET_COLORS

    lab = widgets.ScalerLab(steps=2000, overlay=("Megatron",))

    def colors():
        return {t.meta["policy"]: t.line.color for t in lab.figure.data if t.meta["kind"] == "scale"}

    first = colors()
    lab.overlay.value = ("DeepSpeed ZeRO", "Megatron")
    second = colors()
    lab.overlay.value = ("DeepSpeed ZeRO",)
    third = colors()
    assert first["Megatron"] == second["Megatron"] == PRESET_COLORS["Megatron"]
    assert second["DeepSpeed ZeRO"] == third["DeepSpeed ZeRO"] == PRESET_COLORS["DeepSpeed ZeRO"]
    assert first["your settings"] == second["your settings"] == third["your settings"] == "#000000"
