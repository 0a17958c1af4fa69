"""The beam model (ampviz.training.beam, live's "beam"): its data are the closed form of beam theory, and
in real training fp32, bf16 and fp16 with a scaler learn while fp16 alone stalls because its
gradients underflow, as the module says."""

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ampviz.training import live
from ampviz.training.beam import GAUGES, SPAN, BeamData, BeamNet, beams, deflection, gradients
from ampviz.training.live.short import SHORT_MODES, short_runs
from ampviz.formats.census import census
from ampviz.scaling.lesson import largest_safe_scale

STEPS = 200


def test_deflection_is_beam_theory():
    """A load P at mid-span deflects the middle by P L^3 / (48 EI), and two loads superpose; the
    deflection is symmetric under mirroring the beam."""
    a = torch.tensor([[SPAN / 2, SPAN / 2]], dtype=torch.float64)
    p = torch.tensor([[4.0, 0.0]], dtype=torch.float64)  # kN
    ei = torch.tensor([[1.0]], dtype=torch.float64)  # MN m^2
    w = deflection(a, p, ei)[0]
    x = (np.arange(GAUGES) + 0.5) / GAUGES * SPAN
    mid = 4e3 * SPAN**3 / (48 * 1e6)
    left = x <= SPAN / 2
    assert np.allclose(w.numpy()[left], (4e3 * x * (3 * SPAN**2 - 4 * x**2) / (48 * 1e6))[left], rtol=1e-12)
    assert float(w.max()) < mid and math.isclose(float(w.max()), mid, rel_tol=1e-3)
    assert np.allclose(w.numpy(), w.numpy()[::-1], rtol=1e-12)
    both = deflection(torch.tensor([[1.0, 3.5]], dtype=torch.float64), torch.tensor([[2.0, 5.0]], dtype=torch.float64), ei)
    one = deflection(torch.tensor([[1.0, 3.5]], dtype=torch.float64), torch.tensor([[2.0, 0.0]], dtype=torch.float64), ei)
    two = deflection(torch.tensor([[1.0, 3.5]], dtype=torch.float64), torch.tensor([[0.0, 5.0]], dtype=torch.float64), ei)
    assert torch.allclose(both, one + two, rtol=1e-12)


def test_data_are_seeded_and_millimetres_to_centimetres():
    x1, y1 = beams(100, torch.Generator().manual_seed(3))
    x2, y2 = beams(100, torch.Generator().manual_seed(3))
    assert torch.equal(x1, x2) and torch.equal(y1, y2) and y1.dtype == torch.float32
    data = BeamData(1)
    spread = data.Y.std(0)
    assert 1e-3 < float(spread.median()) < 3e-2  # the per-gauge spread: about a centimetre at mid-span
    assert torch.equal(BeamData(1).model(0).head.weight, data.model(0).head.weight)


@pytest.fixture(scope="module")
def runs():
    return {m: live.run_training(live.TrainConfig(model="beam", mode=m, steps=STEPS, census_every=STEPS - 1))
            for m in ("fp32", "fp16", "fp16+scaler", "bf16", "half")}


def _loss(run, a, b):
    return float(np.mean(run["loss"][a:b]))


def test_fp32_bf16_and_the_scaler_learn_fp16_alone_stalls(runs):
    start = _loss(runs["fp32"], 0, 1)
    for m in ("fp32", "bf16", "fp16+scaler"):
        assert runs[m].error is None and len(runs[m]) == STEPS
        assert _loss(runs[m], -10, None) < 0.1 * start, m  # well under half its start
    assert runs["fp16"].error is None
    stalled = _loss(runs["fp16"], -10, None)
    assert stalled > 0.3 * start and stalled > 10 * _loss(runs["fp16+scaler"], -10, None)
    scaler = runs["fp16+scaler"]
    assert not np.asarray(scaler["skipped"]).any() and set(np.asarray(scaler["scale"]).tolist()) == {65536.0}


def test_short_runs_show_fp16_alone_stalling():
    """notebook 00's first look: after 100 steps fp16 without a scaler stalls far above the three
    others; torch's thread count is left as it was."""
    threads = torch.get_num_threads()
    runs = short_runs()
    assert torch.get_num_threads() == threads and list(runs.losses) == list(SHORT_MODES)
    assert all(runs.losses[m].shape == (100,) for m in SHORT_MODES)
    learners = ("fp32", "fp16+scaler", "bf16")
    assert runs.verdict("fp16") == "stalls" and all(runs.verdict(m) == "learns" for m in learners)
    assert runs.end("fp16") > 0.7 * runs.start("fp16")  # 0.82 here
    assert all(runs.end(m) < 0.2 * runs.start(m) and runs.end("fp16") > 5 * runs.end(m) for m in learners)
    assert runs.end("fp16") == float(np.mean(runs.losses["fp16"][-10:])) and runs.start("bf16") == runs.losses["bf16"][0]
    for kwargs in ({"steps": 0}, {"modes": "fp16"}, {"modes": ()}, {"modes": ("fp8",)}, {"seed": 1.5}):
        with pytest.raises(ValueError) as e:
            short_runs(**kwargs)
        assert "\n" not in str(e.value)


def test_the_census_shows_where_fp16_loses_the_gradients(runs):
    """At the last census, fp16's backward has flushed most weight gradients to exact zeros; with
    the scaler and in bf16 none is zero (GELU has no dead units)."""
    def zero_share(run):
        rec = [r for r in run.records if r.param_census][-1]
        counts = [c.counts for name, c in rec.param_census.items() if name.endswith("weight") and "norm" not in name]
        return sum(c["zero"] for c in counts) / sum(sum(c.values()) for c in counts)

    assert zero_share(runs["fp16"]) > 0.5  # 81% here after 200 steps (the share varies by CPU)
    assert zero_share(runs["fp16+scaler"]) < 0.001 and zero_share(runs["bf16"]) < 0.001


def test_half_weights_fail_because_adams_eps_is_zero_in_fp16(runs):
    assert torch.tensor(1e-8, dtype=torch.float16).item() == 0.0
    err = runs["half"].error
    assert err.startswith("half diverged at step 1: the previous update made some weights inf or NaN")
    assert "Adam's eps" in err and "\n" not in err


def test_live_trainer_offers_the_beam_with_its_own_defaults():
    from ampviz.widgets import LiveTrainer

    lt = LiveTrainer(modes=("fp32",), steps=3, census_every=0, redraw_interval=0)
    assert "beam" in lt.model_dropdown.options and lt.lr_input.value == 0.05
    lt.model_dropdown.value = "beam"
    assert lt.lr_input.value == 1e-3
    (config,) = lt.configs()
    assert config.batch_size == 256 and config.model == "beam" and config.learning_rate == 1e-3
    lt.model_dropdown.value = "mlp"
    assert lt.lr_input.value == 0.05


def test_gradients_are_the_live_tasks_first_backward_pass():
    """notebook 02's gradients are those of the model and first batch notebook 07 trains."""
    g = gradients(0)
    task = live.build_task("beam", seed=0)
    (x,), y = task.batch()
    task.loss(task.model(x), y).backward()
    for name, p in task.model.named_parameters():
        assert np.array_equal(g.params[name], p.grad.reshape(-1).numpy()), name
    assert list(g.outputs) == ["embed", "blocks.0.fc1", "blocks.0.fc2", "blocks.1.fc1", "blocks.1.fc2", "head"]
    assert g.outputs["head"].size == 256 * GAUGES and (g.weights.size, g.layer_outputs.size) == (10_880, 73_728)
    assert np.array_equal(g.all, np.concatenate([g.weights, g.layer_outputs]))
    assert not np.array_equal(gradients(1).all, g.all)


def test_a_power_of_two_loss_scale_shifts_every_gradient_exactly():
    g, s = gradients(0), gradients(0, loss_scale=2.0**10)
    assert np.array_equal(s.all, g.all * np.float32(2.0**10))
    assert not np.array_equal(gradients(0, loss_scale=1000.0).all, g.all * np.float32(1000.0))


def test_autocast_carries_the_layer_outputs_gradients_in_its_dtype():
    for dtype, np_dtype in (("float16", np.float16), ("bfloat16", None)):
        g = gradients(0, autocast=dtype)
        for name, v in g.outputs.items():
            if np_dtype is not None:
                assert np.array_equal(v.astype(np_dtype).astype(np.float32), v), name
            else:  # bf16: the top 16 bits of a float32
                assert not np.any(v.view(np.uint32) & 0xFFFF), name
    fp32 = gradients(0).outputs["head"]
    assert not np.array_equal(fp32.astype(np.float16).astype(np.float32), fp32)
    # fp16's backward loses most of the layer outputs' gradients; bf16 has fp32's range: its few
    # exact zeros are sums that cancel in its 8 bits, where fp32's gradient is far above its range's end
    assert np.mean(gradients(0, autocast="float16").outputs["head"] == 0) > 0.9
    fp32, bf16 = gradients(0), gradients(0, autocast="bfloat16")
    zeros = 0
    for name, v in bf16.outputs.items():
        assert np.all(np.abs(fp32.outputs[name][v == 0]) > 2.0**-100), name
        zeros += int(np.sum(v == 0))
    assert zeros < 1e-3 * bf16.all.size


def test_the_largest_safe_scale_of_the_cast_holds_in_a_real_fp16_backward_pass():
    """notebook 02: 2^33 keeps every gradient finite, at 2^34 the same weights' gradients overflow
    in a real fp16 autocast pass as in the cast of fp32's gradients."""
    g = gradients(0)
    assert largest_safe_scale(g.all, "fp16") == 2.0**33
    for k in (33, 34):
        real = gradients(0, loss_scale=2.0**k, autocast="float16")
        for name, v in g.params.items():
            with np.errstate(over="ignore"):
                cast = (v * np.float32(2.0**k)).astype(np.float16)
            assert np.array_equal(~np.isfinite(real.params[name]), np.isinf(cast)), (k, name)
        assert (sum(int((~np.isfinite(v)).sum()) for v in real.params.values()) > 0) == (k == 34)


def test_gradients_refuse_what_they_cannot_take():
    for kwargs, err in (({"autocast": "fp16"}, ValueError), ({"autocast": torch.float16}, ValueError),
                        ({"batch_size": 0}, ValueError), ({"loss_scale": "2"}, TypeError),
                        ({"seed": 1.5}, ValueError)):
        with pytest.raises(err) as e:
            gradients(**kwargs)
        assert "\n" not in str(e.value) and str(e.value)


ANY = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30), st.floats(), st.text(max_size=5),
                st.just(torch.ones(2, 2)), st.just(torch.ones(3)), st.just(torch.tensor([[1.0, 9.0]])),
                st.just(np.zeros((1, 1))), st.just(torch.Generator()), st.just(object()), st.just(1 + 2j),
                st.lists(st.floats(), max_size=3), st.integers(0, 50))


def _answers(fn, *args):
    try:
        return fn(*args)
    except (ValueError, TypeError) as e:
        assert str(e).strip() and "\n" not in str(e), repr(str(e))
        return None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=ANY, gen=ANY, a=ANY, p=ANY, ei=ANY, seed=ANY, batch=ANY, dims=st.lists(ANY, min_size=3, max_size=3))
def test_every_public_function_answers_any_argument(n, gen, a, p, ei, seed, batch, dims):
    out = _answers(beams, n, gen)
    if out is not None:
        assert out[0].shape == (n, 5) and out[1].shape == (n, GAUGES)
    w = _answers(deflection, a, p, ei)
    if w is not None:
        assert w.shape == (torch.as_tensor(a).shape[0], GAUGES) and bool(torch.isfinite(w).all())
    data = _answers(BeamData, seed) if isinstance(seed, int) and 0 <= seed < 3 else None
    if data is not None:
        sampler = _answers(data.sampler, batch, seed)
        if sampler is not None:
            (x,), y = sampler()
            assert x.shape == (batch, 5) and y.shape == (batch, GAUGES)
        _answers(data.model, seed)
    small = batch if isinstance(batch, int) and not isinstance(batch, bool) and abs(batch) <= 64 else 8
    g = _answers(lambda: gradients(seed if not isinstance(seed, int) or abs(seed) < 10**6 else 0, loss_scale=a,
                                   batch_size=small, autocast=p if p is None or isinstance(p, str) else ei))
    if g is not None:
        assert g.all.dtype == np.float32 and g.outputs["head"].size == small * GAUGES
    m = torch.zeros(5)
    net = _answers(lambda *d: BeamNet(m, m + 1, torch.zeros(3), torch.ones(3), *d),
                   *[d if not isinstance(d, int) or abs(d) < 100 else 3 for d in dims])
    if net is not None:
        assert net(torch.zeros(2, 5)).shape == (2, 3)


def test_a_larger_batch_loses_more_gradients_in_fp16():
    """notebook 02's exercise: the mean over batch x 64 divides each output's gradient by the
    batch size, so fp16 loses more of them at scale 1; the largest safe scale (set by the weights'
    gradients, sums over the batch) stays."""
    from ampviz.scaling.lesson import check_batch_effect

    lost = {b: census(gradients(0, batch_size=b).all, "fp16").fractions["underflow"] for b in (64, 256, 1024)}
    assert lost[64] < lost[256] < lost[1024]
    assert len({largest_safe_scale(gradients(0, batch_size=b).all) for b in (64, 256, 1024)}) == 1
    for right in ("more", " More ", "'more'", "it loses more"):
        assert check_batch_effect(right).status == "right"
    for wrong in ("fewer", "less", "same", 1, True):
        assert check_batch_effect(wrong).status == "wrong"
    assert check_batch_effect(None).status == "unanswered"
