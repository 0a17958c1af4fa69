"""Lesson 12's three streams and what a recipe costs them: ``tensor_stream``'s Gaussian and given
bases, ``rms_errors`` (each step's relative RMS error of the FP8 round trip) against torchao's own
quantized tensors and torch's float8 casts, ``recipe_table``, and the numbers the lesson prints,
stream by stream."""

import numpy as np
import pytest
import torch

from ampviz.formats import FP8_E4M3, FP8_E5M2
from ampviz.formats.fp8 import BASES, recipe_table, rms_errors, simulate_fp8_scaling, tensor_stream
from ampviz.text import Table

F32 = np.float32
FMTS = {"fp8_e4m3": (torch.float8_e4m3fn, 448.0), "fp8_e5m2": (torch.float8_e5m2, 57344.0)}
RECIPES = {"current": dict(recipe="current"), "delayed, max over 1024": dict(history_len=1024),
           "delayed, max over 16": dict(history_len=16), "delayed, most_recent": dict(algo="most_recent")}


def one_line(text: str) -> bool:
    return bool(text) and "\n" not in text and len(text) < 300


# ---------------------------------------------------------------- the bases
def test_the_bases_share_the_drift_the_spikes_and_the_draws():
    """One seed and size give every base the same walk, spikes and non-finite steps; the log-normal
    base is sign · 2^(spread · z) and the Gaussian one sign · |z| from the same draws z, so the
    Gaussian base is N(0, 1)."""
    assert BASES == ("lognormal", "normal")
    log = tensor_stream(500, 2048, seed=4, inf_prob=0.01, nan_prob=0.01)
    gauss = tensor_stream(500, 2048, seed=4, base="normal", inf_prob=0.01, nan_prob=0.01)
    given = tensor_stream(500, seed=4, base=np.arange(2048) - 1000.0, inf_prob=0.01, nan_prob=0.01)
    for s in (gauss, given):
        for field in ("magnitude", "spike", "nonfinite"):
            assert np.array_equal(getattr(s, field), getattr(log, field)), field
    rng = np.random.default_rng(4)
    z = rng.normal(0.0, 1.0, 2048)
    sign = np.where(rng.random(2048) < 0.5, -1.0, 1.0)
    assert np.array_equal(log.base, (sign * np.exp2(3.0 * z)).astype(F32))
    assert np.array_equal(gauss.base, (sign * np.abs(z)).astype(F32))
    assert abs(float(gauss.base.mean())) < 0.1 and abs(float(gauss.base.std()) - 1) < 0.05
    assert np.array_equal(given.base, (np.arange(2048) - 1000.0).astype(F32)) and given.size == 2048
    assert not given.base.flags.writeable and tensor_stream(10).size == 4096


def test_a_given_base_is_any_tensor_of_numbers():
    w = torch.randn(8, 16)
    s = tensor_stream(20, 128, seed=1, base=w)
    assert s.size == 128 and np.array_equal(s.base, w.numpy().ravel())
    assert np.array_equal(s.tensor(3), (s.base * s.magnitude[3]).astype(F32))


@pytest.mark.parametrize("kwargs,error,message", [
    (dict(base="uniform"), ValueError, "base must be one of 'lognormal', 'normal' or a tensor's values"),
    (dict(base=np.ones(10), size=12), ValueError, "size (12) must be the number of values in base (10)"),
    (dict(base=np.zeros(10)), ValueError, "base is all zeros"),
    (dict(base=[1.0, np.inf]), ValueError, "base must hold finite numbers"),
    (dict(base=[1.0, 1e39]), ValueError, "base must hold finite numbers (in float32)"),
    (dict(base=np.ones(3, bool)), TypeError, "base must be numbers"),
    (dict(base=np.ones(0)), ValueError, "base must hold 1 to 1,000,000 values"),
    (dict(base=["a", "b"]), TypeError, "base"),
    (dict(base=None), TypeError, "base"),
    (dict(size=0), ValueError, "size must be a whole number"),
])
def test_a_wrong_base_is_one_clear_error(kwargs, error, message):
    with pytest.raises(error) as info:
        tensor_stream(10, **kwargs)
    assert message in str(info.value) and one_line(str(info.value))


# ---------------------------------------------------------------- rms_errors
def relative_rms(x: torch.Tensor, q: torch.Tensor) -> float:
    x64, q64 = x.double(), q.double()
    return float(torch.sqrt(((q64 - x64) ** 2).sum() / (x64**2).sum()))


@pytest.mark.parametrize("name", list(FMTS))
def test_current_scalings_errors_are_torchaos_round_trips(torchao_modules, name):
    """Current scaling: torchao's ``hp_tensor_to_float8_dynamic`` quantizes each step's tensor and
    ``_data.to(float32) / _scale`` reads it back; the relative RMS error of that is ``rms_errors``',
    step for step (NaN where a step holds an inf or a NaN)."""
    config, scaling, tensor = torchao_modules("torchao.float8.config", "torchao.float8.float8_scaling_utils",
                                              "torchao.float8.float8_training_tensor")
    for base in ("lognormal", "normal"):
        stream = tensor_stream(120, 512, seed=2, base=base, wander=0.5, spike_prob=0.05, inf_prob=0.03,
                               nan_prob=0.03)
        got = rms_errors(stream, simulate_fp8_scaling(stream, "current", fmt=name))
        for t in range(stream.steps):
            x = torch.from_numpy(stream.tensor(t))
            if stream.nonfinite[t]:
                assert np.isnan(got[t])
                continue
            f = scaling.hp_tensor_to_float8_dynamic(x, FMTS[name][0], tensor.LinearMMConfig(),
                                                    scaling_granularity=config.ScalingGranularity.TENSORWISE)
            assert got[t] == pytest.approx(relative_rms(x, f._data.to(torch.float32) / f._scale), rel=1e-12)


@pytest.mark.parametrize("name", list(FMTS))
@pytest.mark.parametrize("kw", [dict(history_len=16), dict(algo="most_recent", margin=2), dict(margin=-3)])
def test_delayed_scalings_errors_are_torchs_casts(name, kw):
    """Delayed scaling: each step cast as Transformer Engine casts it, ``f32(x * scale)`` clamped to
    ±max, torch's float8 cast, read back divided by the scale; saturating steps included."""
    dtype, fmax = FMTS[name]
    stream = tensor_stream(150, 256, seed=9, wander=0.3, spike_log2=24, spike_prob=0.05)
    trace = simulate_fp8_scaling(stream, fmt=name, **kw)
    got = rms_errors(stream, trace)
    assert trace.saturated_steps > 0 and trace.underflowed.sum() > 0
    for t in range(stream.steps):
        x = torch.from_numpy(stream.tensor(t))
        s = torch.tensor(trace.scale[t])
        q = (x * s).clamp(-fmax, fmax).to(dtype).to(torch.float32) / s
        assert got[t] == pytest.approx(relative_rms(x, q), rel=1e-12)


def test_errors_are_nan_where_a_step_has_no_error_to_measure():
    """An inf or NaN step, and torchao's scale 0 for an inf amax, give NaN, not a number."""
    stream = tensor_stream(300, 64, seed=0, inf_prob=0.05, nan_prob=0.05)
    for trace in (simulate_fp8_scaling(stream, "current"), simulate_fp8_scaling(stream, history_len=4)):
        e = rms_errors(stream, trace)
        assert np.isnan(e[stream.nonfinite != 0]).all() and np.isfinite(e[stream.nonfinite == 0]).all()
        assert not e.flags.writeable and e.dtype == np.float64


@pytest.mark.parametrize("args,error,message", [
    ((None, None), TypeError, "stream must be a TensorStream"),
    ((tensor_stream(10), None), TypeError, "trace must be an Fp8ScalingTrace"),
    ((tensor_stream(10), simulate_fp8_scaling(tensor_stream(10, seed=1))), ValueError,
     "trace must be a run of this stream"),
    ((tensor_stream(10), simulate_fp8_scaling(tensor_stream(10, 64))), ValueError,
     "trace must be a run of this stream"),
])
def test_rms_errors_refuses_a_trace_of_another_stream(args, error, message):
    with pytest.raises(error) as info:
        rms_errors(*args)
    assert message in str(info.value) and one_line(str(info.value))


# ---------------------------------------------------------------- recipe_table
def test_the_table_holds_each_runs_counts_and_mean_error():
    streams = {"a": tensor_stream(200, 256, seed=3), "b": tensor_stream(200, 256, seed=3, base="normal")}
    table = recipe_table(streams, RECIPES)
    assert isinstance(table, Table) and len(table.rows) == 8
    assert table.columns == ("stream", "recipe", "steps saturating", "steps losing ≥ 1%", "mean underflowed",
                             "mean RMS error")
    rows = iter(table.rows)
    for name, stream in streams.items():
        for label, kw in RECIPES.items():
            tr = simulate_fp8_scaling(stream, **kw)
            e = rms_errors(stream, tr)
            lossy = int((tr.underflowed_share >= 0.01).sum())
            assert next(rows) == (name, label, f"{tr.saturated_steps:,}", f"{lossy:,}",
                                  f"{100 * tr.underflowed_share.mean():.2f}%", f"{100 * np.nanmean(e):.3g}%")


@pytest.mark.parametrize("streams,recipes,error,message", [
    ({}, RECIPES, TypeError, "streams must be a non-empty dict"),
    ({"a": 1}, RECIPES, TypeError, "streams['a'] must be a TensorStream"),
    ({"a": tensor_stream(10)}, [], TypeError, "recipes must be a non-empty dict"),
    ({"a": tensor_stream(10)}, {"x": "current"}, TypeError, "recipes['x'] must be a dict"),
    ({"a": tensor_stream(10)}, {"x": dict(recipe="dynamic")}, ValueError, "recipe must be one of"),
])
def test_a_wrong_table_is_one_clear_error(streams, recipes, error, message):
    with pytest.raises(error) as info:
        recipe_table(streams, recipes)
    assert message in str(info.value) and one_line(str(info.value))


# ---------------------------------------------------------------- lesson 12's numbers
def lesson_streams():
    from ampviz.training.live import trained_parameter

    gradient = trained_parameter("mlp", "fc4.weight", steps=100)["gradient"]
    return {"synthetic": tensor_stream(2000, 4096, seed=0),
            "Gaussian": tensor_stream(2000, 4096, seed=0, base="normal"),
            "real gradient": tensor_stream(2000, seed=0, base=gradient)}


def test_lesson_12s_streams_and_what_each_recipe_costs_them():
    """The spans, shares underflowed and RMS errors lesson 12 prints for its three streams. The
    synthetic stream's log-normal spread makes underflow large; N(0, 1) tensors of 4,096 values span
    about 14 binades, and a scale held 2^8 low (delayed, max over 1024) flushes about 0.2% of them
    with the RMS error unchanged at the printed digits' scale; the real gradient lies between."""
    streams = lesson_streams()
    spans = {k: float(np.log2(np.abs(s.base[s.base != 0]).max() / np.abs(s.base[s.base != 0]).min()))
             for k, s in streams.items()}
    assert round(spans["synthetic"], 1) == 21.5 and round(spans["Gaussian"], 1) == 13.8
    assert 24.5 < spans["real gradient"] < 25.5
    table = recipe_table(streams, RECIPES)
    rows = {(r[0], r[1]): r[2:] for r in table.rows}
    assert rows["synthetic", "current"] == ("0", "0", "0.12%", "2.57%")
    assert rows["synthetic", "delayed, max over 1024"] == ("4", "1,789", "34.18%", "2.77%")
    assert rows["Gaussian", "current"] == ("0", "0", "0.00%", "2.67%")
    assert rows["Gaussian", "delayed, max over 1024"] == ("3", "0", "0.22%", "2.69%")
    assert rows["real gradient", "current"] == ("0", "0", "0.10%", "2.63%")
    assert rows["real gradient", "delayed, max over 1024"] == ("3", "1,790", "3.03%", "2.74%")
    # the RMS error barely moves where the held-down scale flushes a third of the values
    for k in streams:
        cur = simulate_fp8_scaling(streams[k], "current")
        low = simulate_fp8_scaling(streams[k], history_len=1024)
        e_cur, e_low = rms_errors(streams[k], cur), rms_errors(streams[k], low)
        quiet = ~streams[k].spike & (np.arange(2000) > 204)  # after the first spike, spike steps aside
        assert np.nanmean(e_low[quiet]) - np.nanmean(e_cur[quiet]) < 0.002, k
    # E5M2: no underflow to speak of, about twice E4M3's error (one mantissa bit fewer)
    for k, s in streams.items():
        e4 = np.nanmean(rms_errors(s, simulate_fp8_scaling(s, "current", fmt=FP8_E4M3)))
        e5 = np.nanmean(rms_errors(s, simulate_fp8_scaling(s, "current", fmt=FP8_E5M2)))
        assert 1.7 <= e5 / e4 < 2.15, k
