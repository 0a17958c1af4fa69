"""Every explorer's controls and constructor, driven with arbitrary input (Hypothesis): each answer
is the core's (the figure and readouts follow the control) or a one-line message in the explorer's
message line; never an internal error, never a traceback, never a value other than the one given."""

import math
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ampviz import scaling
from ampviz.scaling import synth
from ampviz.formats.census import census, profile
from ampviz.formats import FORMATS, get_format
from ampviz.widgets import FormatExplorer, LiveTrainer, RangeExplorer, ScalerLab, parse_number, running_trainers
from widget_checks import one_line, refused  # tests/, on the path as pytest runs

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])

ANYTHING = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
    st.lists(st.integers(), max_size=3), st.tuples(st.integers(), st.integers()), st.just(object()),
    st.just(np.float32(2.0)), st.just(np.arange(3)), st.just(complex(1, 1)),
)

NUMBERISH = st.one_of(
    st.text(max_size=40),
    st.from_regex(r"\A[ +-]?(\d{1,8}(\.\d{0,6})?|\.\d{1,6})([eE][+-]?\d{1,4})?\s*\Z"),
    st.from_regex(r"\A-?2\s*(\^|\*\*)\s*\(?[+-]?\d{1,6}\)?\Z"),
    st.sampled_from(["inf", "-inf", "nan", "NaN", "−1", "1e309", "2^" + "9" * 5000, "9" * 5000, "0x3C00", ""]),
)




# ----- FormatExplorer -----
@FUZZ
@given(fmt=st.sampled_from(list(FORMATS)), text=NUMBERISH)
def test_format_explorer_decimal_box(fmt, text):
    fe = FormatExplorer(fmt)
    before = fe.bits
    fe.decimal_input.value = text
    try:
        x = parse_number(text)
    except ValueError:
        assert one_line(fe.error) and fe.bits == before  # the message, and the last good value kept
        return
    if fe.decimal_input.value == text and fe.error is None:
        assert fe.bits == int(get_format(fmt).encode(x)) and fe.typed == x or (math.isnan(x) and math.isnan(fe.typed))
    assert fe.error is None or one_line(fe.error)


@FUZZ
@given(fmt=st.sampled_from(list(FORMATS)), text=st.one_of(st.text(max_size=20), st.integers().map(hex),
                                                          st.integers(-5, 70000).map(str)))
def test_format_explorer_bits_box(fmt, text):
    fe = FormatExplorer(fmt)
    fe.hex_input.value = text
    assert fe.error is None or one_line(fe.error)
    if fe.error is None:
        assert 0 <= fe.bits < 2 ** get_format(fmt).bits


@FUZZ
@given(value=ANYTHING, fmt=st.one_of(st.sampled_from(list(FORMATS)), ANYTHING))
def test_format_explorer_constructor(value, fmt):
    refused(lambda: FormatExplorer(fmt, value=value))


# ----- RangeExplorer -----
GRADS = np.exp2(-np.abs(np.random.default_rng(0).normal(0, 8, 5000))).astype(np.float32)
PROFILE = profile(GRADS)


@FUZZ
@given(k=st.integers(-200, 200), fmt=st.sampled_from(RangeExplorer.FORMAT_CHOICES))
def test_range_explorer_controls(k, fmt):
    rx = RangeExplorer(PROFILE)
    rx.format_dropdown.value = fmt
    rx.scale_slider.value = k  # the slider holds it inside its range
    k = rx.scale_slider.value
    assert rx.error is None and rx.result == census(PROFILE, fmt, 2.0**k)


@FUZZ
@given(log2_scale=ANYTHING, rng=st.one_of(ANYTHING, st.tuples(st.integers(-300, 300), st.integers(-300, 300))))
def test_range_explorer_constructor(log2_scale, rng):
    msg = refused(lambda: RangeExplorer(PROFILE, log2_scale=log2_scale, log2_scale_range=rng))
    if msg is None:
        rx = RangeExplorer(PROFILE, log2_scale=log2_scale, log2_scale_range=rng)
        assert -149 <= rx.scale_slider.min <= rx.scale_slider.value <= rx.scale_slider.max <= 127


# ----- ScalerLab -----
LAB_STEPS = 3000


@pytest.fixture(scope="module")
def lab():
    return ScalerLab(steps=LAB_STEPS)


@FUZZ
@given(init=st.integers(-20, 50), growth=st.floats(0, 5), backoff=st.floats(-0.5, 1.5),
       interval=st.integers(-5, 10**8), scenario=st.sampled_from(list(synth.SCENARIOS)),
       strength=st.floats(0, 1), overlay=st.lists(st.sampled_from([n for n in scaling.PRESETS if n != "torch"]),
                                                 max_size=2, unique=True),
       loss=st.sampled_from(["float32", "float16"]))
def test_scaler_lab_controls(lab, init, growth, backoff, interval, scenario, strength, overlay, loss):
    for control, value in ((lab.init_slider, init), (lab.growth_slider, growth), (lab.backoff_slider, backoff),
                           (lab.interval_input, interval), (lab.scenario_dropdown, scenario),
                           (lab.strength_slider, strength), (lab.loss_dropdown, loss), (lab.overlay, tuple(overlay))):
        control.value = value
    gf, bf, gi = lab.growth_slider.value, lab.backoff_slider.value, lab.interval_input.value
    valid = gf > 1 and 0 < bf < 1 and gi >= 1
    if not valid:
        assert one_line(lab.error)
        return
    assert lab.error is None
    mine = scaling.simulate(lab.policy(), grad_max=lab.stream, loss_dtype=loss)
    np.testing.assert_array_equal(lab.traces[0].scale, mine.scale)
    np.testing.assert_array_equal(lab.traces[0].skipped, mine.skipped)
    assert [t.policy.name for t in lab.traces[1:]] == list(lab.overlay.value)


@settings(max_examples=80, deadline=None)
@given(kwargs=st.dictionaries(st.sampled_from(["init_scale", "growth_factor", "backoff_factor", "growth_interval",
                                               "strength", "scenario", "overlay", "steps", "seed",
                                               "loss_dtype"]),
                              ANYTHING, max_size=3))
def test_scaler_lab_constructor(kwargs):
    if isinstance(kwargs.get("steps"), int) and kwargs["steps"] > 5000:
        kwargs["steps"] = 5000  # a valid size; keeps the test quick
    msg = refused(lambda: ScalerLab(**kwargs))
    if msg is None:
        lab = ScalerLab(**kwargs)
        for name, control in (("growth_factor", lab.growth_slider), ("backoff_factor", lab.backoff_slider)):
            if name in kwargs:
                assert control.value == float(kwargs[name])  # shown as given, never moved
        assert lab.error is None or one_line(lab.error)


# ----- LiveTrainer -----
@pytest.fixture(autouse=True)
def no_training_left_behind():
    yield
    for t in running_trainers():
        t.stop(wait=True, timeout=30)


@settings(max_examples=25, deadline=None)
@given(lr=st.floats(allow_nan=True, allow_infinity=True), steps=st.integers(-5, 3),
       modes=st.lists(st.booleans(), min_size=5, max_size=5), model=st.sampled_from(["mlp", "transformer"]))
def test_live_trainer_controls(lr, steps, modes, model):
    lt = LiveTrainer(modes=("fp32",), steps=2, census_every=0, redraw_interval=0)
    for box, on in zip(lt.mode_checks.values(), modes):
        box.value = on
    lt.model_dropdown.value = model
    lt.lr_input.value = lr
    lt.steps_input.value = steps  # BoundedIntText keeps it between 1 and 10^7
    lt.start_button.click()
    if lt.thread is None:  # refused: one line, nothing started
        assert one_line(lt.error) and not lt.running
        return
    assert lt.wait(120)
    assert lt.error is None or one_line(lt.error) and re.match(r"\S+ (overflowed|diverged|stopped) at step", lt.error)
    for run in lt.runs.values():  # a mode that failed ends early, with its sentence; the others run to the end
        assert run.steps_recorded == lt.steps_input.value if run.error is None else run.error in lt.error


@settings(max_examples=80, deadline=None)
@given(kwargs=st.dictionaries(st.sampled_from(["modes", "model", "steps", "lr", "growth_factor", "backoff_factor",
                                               "growth_interval", "init_scale", "census_every", "seed",
                                               "batch_size", "redraw_interval", "max_records"]),
                              ANYTHING, max_size=3))
def test_live_trainer_constructor(kwargs):
    msg = refused(lambda: LiveTrainer(**kwargs))
    if msg is None:
        lt = LiveTrainer(**kwargs)
        if "growth_factor" in kwargs:
            assert lt.growth_slider.value == float(kwargs["growth_factor"])
        if "backoff_factor" in kwargs:
            assert lt.backoff_slider.value == float(kwargs["backoff_factor"])
