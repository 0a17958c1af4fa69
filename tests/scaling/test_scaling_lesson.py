"""``ampviz.scaling.lesson``: choosing a static loss scale (``largest_safe_scale``, ``census_table``,
``layer_table``), ``trace_table`` and the scaling lessons' questions."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ampviz import checks
from ampviz import text as TX
from ampviz.formats import lesson as FL
from ampviz.scaling import lesson as SL
from ampviz.training import lesson as TL

MODULES = (TX, checks, FL, SL, TL)
from ampviz.formats.census import census


# ----- loss scaling -----
def test_largest_safe_scale_by_brute_force():
    rng = np.random.default_rng(3)
    for fmt in ("fp16", "fp8_e5m2", "fp8_e4m3", "bf16"):
        for _ in range(50):
            g = (rng.standard_normal(100) * 2.0 ** rng.uniform(-30, 5)).astype(np.float32)
            s = SL.largest_safe_scale(g, fmt)
            assert math.log2(s).is_integer()
            assert census(g, fmt, s).counts["overflow"] == 0
            if s < 2.0**127:
                assert census(g, fmt, 2 * s).counts["overflow"] > 0


def test_largest_safe_scale_edges():
    assert SL.largest_safe_scale([1.0], "fp16") == 32768.0  # 65536 overflows
    assert SL.largest_safe_scale([65504.0], "fp16") == 1.0
    assert SL.largest_safe_scale([0.5, -0.99], "fp16") == 65536.0  # 0.99 * 65536 = 64880.6 < 65504
    assert SL.largest_safe_scale([2.0**-140], "bf16") == 2.0**127  # capped: a scale is a float32
    for bad in ([], [0.0, 0.0], [1.0, math.inf], [math.nan]):
        with pytest.raises(ValueError):
            SL.largest_safe_scale(bad, "fp16")


def test_census_table_counts_match_census():
    rng = np.random.default_rng(4)
    g = (rng.standard_normal(1000) * 1e-6).astype(np.float32)
    g[:10] = 0
    g[10] = 1.0
    t = SL.census_table(g, "fp16", [1.0, 2.0**16, 2.0**17, 3.0])
    assert t.column("scale") == ("2^0", "2^16", "2^17", "3")
    assert t.title == "fp16, 1,000 values"
    for row, s in zip(t.rows, [1.0, 2.0**16, 2.0**17, 3.0]):
        c = census(g, "fp16", s).counts
        expected = [c["zero"], c["underflow"], c["subnormal"], c["normal"], c["overflow"] + c["nan"]]
        assert [int(cell.split()[0].replace(",", "")) for cell in row[1:]] == expected
    assert t.rows[0][1] == "10 (1.00%)"
    assert t.rows[2][5] == "1 (0.10%)"  # 1.0 * 2^17 overflows


SCALES = [1.0, 2.0**16, 3.0]


@pytest.mark.parametrize("scales, same_as", [
    (np.array(SCALES), SCALES), (torch.tensor(SCALES), SCALES), (tuple(SCALES), SCALES), (iter(SCALES), SCALES),
    (np.float32(SCALES), SCALES), ([1, 65536, np.float32(3)], SCALES), (4.0, [4.0]), (np.float32(4), [4.0]),
    (torch.tensor(4.0), [4.0]), (np.array([4.0]), [4.0]), (4, [4.0]), ([], []), (np.array([]), []),
])
def test_census_table_takes_a_scale_or_a_sequence_array_or_tensor_of_them(scales, same_as):
    g = np.float32([0, 1e-8, 1e-6, 1.0, 7e4])
    t = SL.census_table(g, "fp16", scales)
    assert t == SL.census_table(g, "fp16", same_as) and len(t.rows) == len(same_as)


@pytest.mark.parametrize("scales", [np.ones((2, 2)), torch.ones(2, 1), "2.0", None, [1.0, None], {"a": 1.0}, [True],
                                    [1.0, "x"], object(), 1 + 2j, [[1.0], [2.0]], [0.0], [-1.0], [math.nan], math.inf])
def test_census_table_refuses_other_scales_in_one_line_saying_what_to_pass(scales):
    with pytest.raises(ValueError, match="scale") as info:
        SL.census_table(np.float32([1.0, 2.0]), "fp16", scales)
    assert "\n" not in str(info.value) and ("pass" in str(info.value) or "positive number" in str(info.value))


@settings(max_examples=60, deadline=None)
@given(scales=st.one_of(st.floats(), st.lists(st.floats(), max_size=4),
                        hnp.arrays(np.float64, hnp.array_shapes(min_dims=0, max_dims=2, max_side=3)),
                        st.integers(-2**70, 2**70), st.text(max_size=3), st.none()))
def test_census_table_answers_or_refuses_any_scales(scales):
    try:
        t = SL.census_table(np.float32([0, 1e-8, 1.0, 7e4]), "bf16", scales)
    except ValueError as e:
        assert "\n" not in str(e) and "scale" in str(e)
        return
    assert len(t.rows) == np.size(scales) and all(len(row) == 6 for row in t.rows)


def test_layer_table():
    t = SL.layer_table({"a": np.array([0.0, 1e-9, 1e-6, 1.0], np.float32), "b": np.array([2.0], np.float32)})
    assert t.column("name") == ("a", "b")
    assert t.rows[0][1:] == ("4", "1", "25.0%", "25.0%", "25.0%", "25.0%")
    assert t.title == "fp16 at scale 2^0"


def test_trace_table():
    from ampviz.scaling.lesson import trace_table
    from ampviz.scaling import DynamicScaler, TorchGradScaler, simulate

    flags = np.zeros(50, bool)
    flags[[3, 4, 10]] = True
    t1 = simulate(TorchGradScaler(growth_interval=5), found_inf=flags)
    t2 = simulate(DynamicScaler(name="raises", min_scale=2.0**15, raise_at_min=True), found_inf=flags)
    table = trace_table([t1, t2])
    assert table.column("scaler") == ("torch", "raises")
    assert table.column("skipped steps") == (str(t1.skipped_count), "2")  # steps after the stop excluded
    assert t2.stopped_at == 4 and table.column("stopped at step") == ("-", "4")
    assert table.column("final scale")[1] == "stopped"
    assert table.column("lowest scale")[0] == TX.number(float(t1.scale.min()))


def test_the_steady_interval_is_the_clean_steps_between_overflows():
    from ampviz.scaling import synth
    from ampviz.scaling import TorchGradScaler, simulate

    spikes = synth.found_inf_every(10_000, 500, offset=250)
    steady = simulate(TorchGradScaler(growth_interval=499), found_inf=spikes)
    ratchet = simulate(TorchGradScaler(growth_interval=500), found_inf=spikes)
    assert steady.scale.min() == 2.0**15 and steady.final.scale == 2.0**15 and ratchet.final.scale == 2.0**-4
    assert SL.check_steady_interval(499) and SL.check_steady_interval("499")
    assert SL.check_steady_interval(500).status == "wrong" and SL.check_steady_interval(2000).status == "wrong"
    assert SL.check_steady_interval(None).status == "unanswered"


def test_the_fairseq_log_of_notebook_04_is_a_sawtooth():
    from ampviz.scaling.scalelog import diagnose, read_log

    line = "NOTE: gradient overflow detected, ignoring gradient, setting loss scale to: {}"
    log = "\n".join(line.format(s) for s in (64.0, 64.0, 32.0, 64.0, 64.0, 64.0))
    assert read_log(log).tolist() == [64.0, 64.0, 32.0, 64.0, 64.0, 64.0] and diagnose(read_log(log)).verdict == "sawtooth"
    assert SL.check_log_verdict("sawtooth", read_log(log)) and not SL.check_log_verdict("ratchet", read_log(log))


# ----- the reasons lessons 02 and 06's questions that ask why accept -----
def test_a_real_fp16_pass_zeroes_the_weight_gradients_of_units_whose_output_gradients_it_lost():
    """02: each Linear weight's gradient is computed from its layer's output gradients; where the fp16
    pass lost a unit's output gradient for every example, that unit's row of weight gradients is 0
    (``WHY_REAL_PASS_LOSES_MORE``)."""
    from ampviz.training.beam import gradients

    fp32, real = gradients(seed=0), gradients(seed=0, autocast="float16")
    dead_rows = 0
    for name, out in real.outputs.items():
        units = out.size // 256
        weight = real.params[f"{name}.weight"].reshape(units, -1)
        dead = (out.reshape(256, units) == 0).all(axis=0)
        assert (weight[dead] == 0).all(), name
        dead_rows += int(dead.sum())
    assert dead_rows > 50 and np.mean(real.layer_outputs == 0) > 0.95
    assert np.mean(real.weights == 0) > 3 * census(fp32.weights, "fp16").fractions["underflow"]
    assert SL.check_why_real_pass_loses_more("d") and SL.check_why_real_pass_loses_more("a").status == "wrong"


def test_the_sawtooth_backs_off_below_its_overflows_and_the_ratchet_never_does():
    """06: the steady stream overflows only at 2^19, soon after each growth, and never at 2^18; the
    spikes that overflow at every scale take torch to 2^-4 with one skip each, while NeMo skips the
    same steps at 65536 (``WHY_SAWTOOTH_IS_HARMLESS``, ``WHY_ONE_SKIP_PER_INTERVAL``)."""
    from ampviz.scaling import ApexHysteresisScaler, TorchGradScaler, simulate, synth

    steady = synth.steady(20_000, level=2.0**-4, jitter=0.5, rng=np.random.default_rng(0))
    sawtooth = simulate(TorchGradScaler(), grad_max=steady)
    skips = np.flatnonzero(sawtooth.skipped)
    grows = np.flatnonzero(sawtooth.scale[1:] > sawtooth.scale[:-1]) + 1
    assert len(skips) == 7 and set(sawtooth.scale[skips].tolist()) == {2.0**19} and skips[0] > 6000
    assert all(0 <= s - grows[grows <= s].max() < 100 for s in skips)  # soon after a growth to 2^19
    assert 2.0**18 * steady.max() < 65520 and simulate(TorchGradScaler(), grad_max=steady,
                                                       loss_dtype="float16").skipped[0]
    spikes = synth.found_inf_every(10_000, 500, offset=250)
    ratchet = simulate(TorchGradScaler(), found_inf=spikes)
    nemo = simulate(ApexHysteresisScaler(init_scale=2.0**16), found_inf=spikes)
    assert ratchet.skipped_count == nemo.skipped_count == 20
    assert ratchet.final.scale == 2.0**-4 and set(nemo.scale.tolist()) == {65536.0}
    assert SL.check_why_sawtooth_is_harmless("b") and SL.check_why_sawtooth_is_harmless("d").status == "wrong"
    assert SL.check_why_one_skip_per_interval("c") and SL.check_why_one_skip_per_interval("b").status == "wrong"
