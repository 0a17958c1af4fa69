"""ampviz.training.fp8_questions on the CPU with torchao 0.18: which layers a module_filter_fn keeps in
high precision (they stay nn.Linear and make no FP8 cast), the seeded filtered runs; why FP8 needs no
GradScaler (a power-of-two loss scale leaves the FP8 codes, the underflow counts and the final weights
the same bit for bit, unless an amax falls below torchao's 1e-12 floor; fp16's underflow moves with
the scale); and gradient accumulation into bf16 .grad buffers against float32 ones.

The torchao tests skip without torchao, except under CI=true, where they fail."""

import sys

import numpy as np
import pytest
import torch
from torch import nn

from ampviz.formats import FP8_E4M3, FP8_E5M2
from ampviz.formats.fp8 import current_quantize
from ampviz.training.fp8_questions import (FILTERS, GRAD_DTYPES, accumulation_runs, filter_runs, linear_names,
                                           module_filter, scaler_effect)
from ampviz.training.fp8_training import _convert, _record_pass, train_fp8
from ampviz.training.live import build_task

STEPS = 20
BEAM = ("embed", "blocks.0.fc1", "blocks.0.fc2", "blocks.1.fc1", "blocks.1.fc2", "head")
MLP = ("fc1", "fc2", "fc3", "fc4", "fc5", "fc6")


@pytest.fixture(scope="module")
def ao(torchao_modules):
    """torchao's float8 modules; skipped without torchao, a failure under CI=true."""
    return torchao_modules("torchao.float8.float8_linear", "torchao.float8.float8_linear_utils")


# ---------------------------------------------------------------- 1. which layers to keep
def test_the_filters_name_the_layers_they_keep():
    """"ends" keeps the first and the last Linear; "dims16" those with a dim not a multiple of 16 (the
    beam's 5-input embed, the MLP's 10-class head); "torchao" (its documented example) the last and
    those: the same layers as "ends" on the beam, as "dims16" on the MLP."""
    kept = {("beam", "all"): (), ("beam", "ends"): ("embed", "head"), ("beam", "dims16"): ("embed",),
            ("beam", "torchao"): ("embed", "head"), ("mlp", "all"): (), ("mlp", "ends"): ("fc1", "fc6"),
            ("mlp", "dims16"): ("fc6",), ("mlp", "torchao"): ("fc6",)}
    for name, names in (("beam", BEAM), ("mlp", MLP)):
        model = build_task(name, 0).model
        assert linear_names(model) == names
        modules = dict(model.named_modules())
        for f in FILTERS:
            fn = module_filter(f, model)
            assert tuple(n for n in names if not fn(modules[n], n)) == kept[(name, f)], (name, f)
            assert not fn(nn.ReLU(), "relu1")


def test_a_kept_layer_stays_nn_linear_and_makes_no_cast(ao):
    """Converted with the filter, the kept layers are plain nn.Linear and the rest Float8Linear; one
    recorded pass casts only in the converted layers, six casts each."""
    fl, utils = ao
    for name in ("beam", "mlp"):
        task = build_task(name, 0)
        net = _convert(task.model, "rowwise", False, module_filter("ends", task.model))
        kinds = {n: type(m) for n, m in net.named_modules() if isinstance(m, nn.Linear)}
        ends = (list(kinds)[0], list(kinds)[-1])
        assert all(kinds[n] is nn.Linear for n in ends)
        assert all(kinds[n] is fl.Float8Linear for n in kinds if n not in ends)
        _, casts = _record_pass(net, *task.batch(), task.loss)
        layers = [c.layer for c in casts]
        assert set(layers) == set(kinds) - set(ends) and len(layers) == 6 * (len(kinds) - 2)
    # torchao's automatic filter (size thresholds from H100 runs) converts none of these small layers
    for recipe in ("tensorwise", "rowwise"):
        auto = utils._auto_filter_for_recipe(recipe, [])
        assert not any(auto(m, n) for n, m in build_task("beam", 0).model.named_modules() if isinstance(m, nn.Linear))


@pytest.fixture(scope="module")
def beam_filters(ao):
    return filter_runs("beam", "tensorwise", STEPS)


def test_filter_runs_record_the_converted_layers(beam_filters):
    r = beam_filters
    assert (r.model, r.recipe, r.steps, r.seed) == ("beam", "tensorwise", STEPS, 0)
    assert [x.filter for x in r.runs] == list(FILTERS) and r.auto_converted == ()
    for run in r.runs:
        assert run.cast_layers == run.converted  # the casts come from the converted layers alone
        assert set(run.converted).isdisjoint(run.kept) and set(run.converted) | set(run.kept) == set(BEAM)
    assert r.run("all").kept == () and r.run("ends").kept == ("embed", "head") == r.run("torchao").kept
    assert r.run("dims16").kept == ("embed",)


def test_filter_runs_are_seeded_finite_and_learn(beam_filters):
    """Every run is finite and learns; "all" is train_fp8's run; a filter changes the losses (kept
    layers skip their casts), the same filter gives the same layers the same losses."""
    r = beam_filters
    assert np.array_equal(r.run("all").losses, train_fp8("tensorwise", STEPS).losses)
    assert np.array_equal(r.fp32, train_fp8("fp32", STEPS).losses)
    for run in r.runs:
        assert run.error is None and run.losses.shape == (STEPS,) and np.isfinite(run.losses).all()
        assert not run.losses.flags.writeable
        assert run.end < 0.7 * run.start and abs(run.end / r.fp32_end - 1) < 0.01
    assert not np.array_equal(r.run("ends").losses, r.run("all").losses)
    assert np.array_equal(r.run("torchao").losses, r.run("ends").losses)  # the same two layers kept
    again = filter_runs("beam", "tensorwise", STEPS, filters="dims16")
    assert np.array_equal(again.runs[0].losses, r.run("dims16").losses)
    other = filter_runs("beam", "tensorwise", 3, seed=1, filters=("dims16",))
    assert not np.array_equal(other.runs[0].losses, r.run("dims16").losses[:3])


# ---------------------------------------------------------------- 2. does FP8 need a GradScaler?
def logs(seed=0, n=4096):
    """float32 values of magnitudes 1e-16 to 1e3, some rows far below the others."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * 10.0 ** rng.uniform(-16, 3, n)).astype(np.float32).reshape(64, -1)
    x[:8] *= np.float32(1e-6)
    return x


@pytest.mark.parametrize("fmt, granularity, pow2", [(FP8_E4M3, "tensorwise", False), (FP8_E5M2, "tensorwise", False),
                                                    (FP8_E4M3, "rowwise", True)])
def test_a_power_of_two_leaves_the_fp8_codes_unchanged(fmt, granularity, pow2):
    """Current scaling of S * x, S = 2^k: the scale comes out divided by S exactly and the codes are
    the same, for every k that keeps each amax at or above 1e-12; below it (the floor) codes change.
    S = 3: rowwise's power-of-two scales cannot absorb it, and codes change; tensorwise's scale
    absorbs it up to float32 rounding (not exactly), which moves none of these 4,096 codes."""
    x = logs()
    ref = current_quantize(x, fmt, granularity, pow2)
    amax = np.abs(x).max(axis=None if granularity == "tensorwise" else -1)
    for k in range(-40, 41):
        s = np.float32(2.0**k)
        q = current_quantize(x * s, fmt, granularity, pow2)
        if (amax * s >= 1e-12).all():
            assert np.array_equal(q.codes, ref.codes), k
            assert np.array_equal(q.scale * s, ref.scale), k
        else:
            assert not np.array_equal(q.codes, ref.codes), k
    three = current_quantize(x * np.float32(3), fmt, granularity, pow2)
    assert np.array_equal(three.codes, ref.codes) == (granularity == "tensorwise")


@pytest.fixture(scope="module", params=["tensorwise", "rowwise"])
def effect(ao, request):
    return scaler_effect(request.param, (1.0, 2.0**-20, 2.0**16), steps=10)


def test_a_power_of_two_loss_scale_changes_nothing_in_fp8(effect):
    """S = 1 and S = 2^16: the same FP8 codes of every grad_output cast at every step, the same
    underflow counts, losses and final weights, bit for bit; the gradients themselves are S times
    larger in high precision."""
    one, big = effect.run(1.0), effect.run(2.0**16)
    assert effect.same(1.0, 2.0**16)
    assert one.digests == big.digests and len(set(one.digests)) == effect.steps
    assert np.array_equal(one.underflowed, big.underflowed) and np.array_equal(one.losses, big.losses)
    assert np.array_equal(one.weights, big.weights) and not one.floored.any() and not big.floored.any()
    a, b = one.first.select(role="grad_output"), big.first.select(role="grad_output")
    assert len(a) == len(b) == 12
    for x, y in zip(a, b):
        assert np.array_equal(x.codes, y.codes) and x.counts == y.counts
        assert np.array_equal(y.hp, x.hp * np.float32(2.0**16))
        assert np.array_equal(y.scale * np.float32(2.0**16), x.scale)
    assert one.values == 2 * 256 * sum((32, 64, 32, 64, 32, 64))  # each grad_output cast twice


def test_a_scale_below_the_floor_changes_the_run(effect):
    """S = 2^-20 takes the beam's gradient amaxes below 1e-12: the scale stops growing, the codes
    and the weights change, and more values underflow."""
    one, small = effect.run(1.0), effect.run(2.0**-20)
    assert small.floored.all() and not effect.same(1.0, 2.0**-20)
    assert small.underflowed.sum() > one.underflowed.sum() and np.isfinite(small.losses).all()


def test_the_wrong_claim_larger_scale_less_fp8_underflow(effect):
    """"FP8 gradients underflow less with a larger loss scale": false; fp16's do."""
    def claim(underflow_at):
        return underflow_at(2.0**16) < underflow_at(1.0)

    assert not claim(lambda s: effect.run(s).underflowed.sum())
    fp16 = {f.scale: f for f in effect.fp16}
    assert claim(lambda s: fp16[s].underflowed)
    assert fp16[2.0**-20].underflowed == fp16[1.0].values == 73728
    assert fp16[1.0].underflowed > 0.9 * fp16[1.0].values and fp16[2.0**16].underflowed < 0.01 * fp16[1.0].values
    # the first step's FP8 casts of the same gradients, at S = 1: under 1% lost
    assert effect.run(1.0).underflowed[0] < 0.01 * effect.run(1.0).values


# ---------------------------------------------------------------- 3. the dtype gradients accumulate in
def test_torch_accumulates_into_a_bf16_grad_as_a_bf16_sum():
    """A bf16 parameter used as float32: each backward casts its gradient to bf16 and autograd adds
    it into the bf16 .grad, exactly a bf16 sum of the float32 gradients cast to bf16."""
    torch.manual_seed(0)
    layer = nn.Linear(64, 32)
    with torch.no_grad():
        layer.weight.copy_(layer.weight.bfloat16().float())
    w = layer.weight.detach().bfloat16().requires_grad_()
    total = None
    for i in range(16):
        x = torch.randn(8, 64, generator=torch.Generator().manual_seed(i))
        g, = torch.autograd.grad(nn.functional.linear(x, layer.weight).square().mean(), layer.weight)
        nn.functional.linear(x, w.float()).square().mean().backward()
        total = g.bfloat16() if total is None else total + g.bfloat16()
        assert torch.equal(w.grad, total), i


@pytest.fixture(scope="module")
def accumulation():
    return {d: accumulation_runs((1, 8, 32), d) for d in GRAD_DTYPES}


def test_bf16_accumulation_error_grows_with_micro_batches(accumulation):
    """bf16: one micro-batch costs one rounding (the floor); each addition rounds again, and the error
    grows with their number, to over twice the floor at 32; float32 stays at float32's level."""
    bf16, fp32 = accumulation["bf16"], accumulation["fp32"]
    assert [r.micro_batches for r in bf16] == [1, 8, 32] and all(r.grad_dtype == "bf16" for r in bf16)
    errors = [r.relative_error for r in bf16]
    assert errors[0] == bf16[0].floor and errors[0] < errors[1] < errors[2]
    assert errors[2] > 2 * bf16[2].floor and 2.0**-10 < bf16[2].floor < 2.0**-8
    assert fp32[0].relative_error == 0.0  # one float32 gradient, exactly
    for r in fp32:
        assert r.relative_error <= r.micro_batches * 2.0**-24 and r.relative_error < 1e-6
        assert r.values == bf16[0].values
    for a, b in zip(fp32[1:], bf16[1:]):
        assert b.relative_error > 1000 * a.relative_error
    assert accumulation_runs(8, "bf16") == (bf16[1],)  # seeded


# ---------------------------------------------------------------- errors
def test_clear_errors(ao, monkeypatch):
    model = build_task("beam", 0).model
    with pytest.raises(ValueError, match="^filter must be one of 'all', 'ends', 'dims16', 'torchao', not 'first'$"):
        module_filter("first", model)
    with pytest.raises(ValueError, match="no nn.Linear"):
        module_filter("ends", nn.ReLU())
    with pytest.raises(TypeError, match="model must be a torch nn.Module"):
        linear_names("beam")
    with pytest.raises(ValueError, match="^model must be 'beam' or 'mlp', not 'transformer'$"):
        filter_runs("transformer")
    with pytest.raises(ValueError, match="recipe must be one of"):
        filter_runs("beam", "mxfp8")
    with pytest.raises(ValueError, match="filters must be names from"):
        filter_runs("beam", filters=("all", "last"))
    with pytest.raises(ValueError, match="steps must be between"):
        filter_runs("beam", steps=0)
    with pytest.raises(ValueError, match="scales must be positive numbers"):
        scaler_effect(scales=(1.0, 0.0))
    with pytest.raises(ValueError, match="scales must be positive numbers"):
        scaler_effect(scales=(2.0**-140,))  # its reciprocal is inf in float32
    with pytest.raises(TypeError, match="scales must be positive numbers"):
        scaler_effect(scales=65536.0)
    with pytest.raises(ValueError, match="recipe must be one of"):
        scaler_effect("delayed")
    with pytest.raises(ValueError, match="^grad_dtype must be 'fp32' or 'bf16', not 'fp16'$"):
        accumulation_runs(grad_dtype="fp16")
    with pytest.raises(ValueError, match="micro_batches must be whole numbers from 1 to 1,024"):
        accumulation_runs((1, 0))
    with pytest.raises(TypeError, match="micro_batches must be whole numbers"):
        accumulation_runs((1, 2.5))
    with pytest.raises(ValueError, match="batch_size must be between"):
        accumulation_runs(batch_size=0)
    effect = scaler_effect(scales=(1.0,), steps=1)
    with pytest.raises(ValueError, match="scale must be one of the scales run"):
        effect.run(2.0)
    monkeypatch.setitem(sys.modules, "torchao.float8", None)
    with pytest.raises(ImportError, match="needs torchao"):
        filter_runs("beam", steps=2)
    with pytest.raises(ImportError, match="needs torchao"):
        scaler_effect(steps=2)
