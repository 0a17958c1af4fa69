"""ampviz.training.doctor: examine() agrees with independent census() calls, recommends scales, says when
bf16 is safer, and leaves the model as it was; the mode-comparison helpers of notebook 07."""

import numpy as np
import pytest
import torch
from torch import nn

from ampviz.formats.census import census
from ampviz.training.doctor import (LOST_TARGET, examine, lost_shares, lost_table, make_mlp, moved_share,
                                    moved_table, speed_table, train_modes)
from ampviz.scaling.lesson import largest_safe_scale
from ampviz.training.live import build_task


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _independent_grads(model, inputs, target):
    """Parameter and leaf-output gradients of a cross-entropy pass, computed without ampviz."""
    outs = {}
    leaves = {n: m for n, m in model.named_modules() if n and not list(m.children())}
    handles = [m.register_forward_hook(lambda mod, a, o, n=n: outs.setdefault(n, o)) for n, m in leaves.items()]
    try:
        out = model(*inputs)
        for o in outs.values():
            o.retain_grad()
        nn.functional.cross_entropy(out, target).backward()
    finally:
        for h in handles:
            h.remove()
    params = {n: p.grad.detach().reshape(-1).numpy().copy() for n, p in model.named_parameters()}
    acts = {n: o.grad.detach().reshape(-1).numpy().copy() for n, o in outs.items()}
    model.zero_grad(set_to_none=True)
    return params, acts


def test_numbers_equal_independent_census():
    model = make_mlp(depth=8)
    inputs, target = build_task("mlp", seed=0, batch_size=128).batch()
    d = examine(model, (inputs, target))
    params, acts = _independent_grads(model, inputs, target)
    assert list(d.params) == list(params) and list(d.activations) == list(acts)
    for n, g in params.items():
        assert d.params[n] == census(g, "fp16", 1.0)
    for n, g in acts.items():
        assert d.activations[n] == census(g, "fp16", 1.0)
    every = np.concatenate([*params.values(), *acts.values()])
    whole = census(every, "fp16", 1.0)
    assert d.total == every.size and d.lost == whole.counts["underflow"] / every.size
    assert d.grad_max == float(np.abs(every).max())
    assert d.safe_scale == largest_safe_scale(every, "fp16")


def test_small_gradients_get_a_scale_range():
    d = examine(make_mlp(depth=12), build_task("mlp", seed=0, batch_size=256).batch())
    assert d.lost > LOST_TARGET and not d.bf16_safer
    lo, hi = d.scale_range
    assert lo == d.needed_scale > 1 and hi == d.safe_scale and lo <= hi
    every = np.concatenate(list(d.grads.values()))
    assert census(every, "fp16", lo).counts["underflow"] / every.size < LOST_TARGET
    assert census(every, "fp16", lo / 2).counts["underflow"] / every.size >= LOST_TARGET
    assert census(every, "fp16", hi).counts["overflow"] == 0
    assert census(every, "fp16", 2 * hi).counts["overflow"] > 0
    text = str(d)
    assert "recommended initial scale: 2^" in text and "fc1.weight" in text
    assert "<table>" in d._repr_html_()
    assert [r[1] for r in d.table("output").rows] == ["output"] * len(d.activations)


def test_huge_activations_make_bf16_safer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    with torch.no_grad():
        model[0].weight.mul_(1e5)
    d = examine(model, (torch.randn(16, 8), torch.randint(0, 2, (16,))))
    assert d.bf16_safer and d.act_max["0"] > 65504
    assert "overflow in the forward pass" in d.reasons[0]
    assert "bf16 safer: yes" in str(d)


def test_gradients_beyond_fp16_need_bf16():
    model = nn.Linear(4, 1)
    x = torch.full((2, 4), 1e6)
    d = examine(model, (x, None), loss_fn=lambda out, _: out.sum())  # dL/dw = sum of x = 2e6
    assert d.safe_scale < 1 and d.scale_range is None and d.bf16_safer
    assert any("even at scale 1" in r for r in d.reasons)


def test_a_scale_range_that_is_empty_says_bf16():
    model = nn.Linear(2, 1, bias=False)
    x = torch.tensor([[1e4, 1e-9]])
    d = examine(model, (x, None), loss_fn=lambda out, _: out.sum())  # gradients 1e4 and 1e-9
    assert d.needed_scale > d.safe_scale and d.scale_range is None and d.bf16_safer
    assert "recommended initial scale: none" in str(d)


def test_model_left_as_it_was():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    model.eval()
    model[3].train()
    old = torch.randn(8, 4)
    model[0].weight.grad = old
    mean_before = model[1].running_mean.clone()
    d = examine(model, (torch.randn(16, 4), torch.randint(0, 3, (16,))))
    assert d.params["0.weight"].total == 32
    assert model[0].weight.grad is old and model[3].weight.grad is None
    assert [m.training for m in model.modules()] == [False, False, False, False, True]
    assert torch.equal(model[1].running_mean, mean_before)
    for m in model.modules():
        assert not m._forward_hooks


def test_hooks_removed_and_grads_restored_when_the_loss_fails():
    model = make_mlp(depth=3)

    def bad_loss(out, target):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        examine(model, build_task("mlp").batch(), bad_loss)
    assert all(not m._forward_hooks for m in model.modules())
    assert all(p.grad is None for p in model.parameters())


def test_default_loss_without_target_is_the_mean():
    model = nn.Linear(3, 1)
    x = torch.ones(4, 3)
    d = examine(model, (x, None))
    g = d.grads[("param", "weight")]
    assert np.allclose(g, 1.0)  # d mean(x @ w) / dw = mean over the batch of x = 1


def test_train_modes_and_tables():
    trials = train_modes(("fp32", "fp16", "fp16+scaler", "half"), depth=12, steps=3, census_every=1)
    ref = trials["fp32"].run
    fp16 = lost_shares(trials["fp16"].run, 0, ref)
    scaled = lost_shares(trials["fp16+scaler"].run, 0, ref)
    assert sum(fp16.values()) > 0 and sum(scaled.values()) == 0
    assert lost_shares(ref, 0, ref) == lost_shares(ref, 0)  # fp32: what would underflow
    t = lost_table(trials)
    assert t.columns == ("parameter", "values", "fp32", "fp16", "fp16+scaler", "half")
    assert t.rows[-1][0] == "all" and t.column("fp16+scaler")[-1] == "0.00%"
    assert moved_share(trials["fp32"]) > moved_share(trials["half"])
    assert moved_table(trials).rows[-1][0] == "all"
    assert len(speed_table(trials).rows) == 4
    with pytest.raises(ValueError, match="no parameter census"):
        lost_shares(trials["fp32"].run, step=99)


# ---------------------------------------------------------------- what examine refuses, and how
def _hooks_left(model):
    return any(m._forward_hooks for m in model.modules())


@pytest.mark.parametrize("batch, says", [
    (torch.randn(2, 4), "got a tensor of shape (2, 4)"),  # two rows would unpack as (inputs, target)
    (torch.randn(3, 4), "got a tensor of shape (3, 4)"),
    ((torch.randn(2, 4),), "got a tuple of 1 item;"),
    ((torch.randn(2, 4), None, None), "got a tuple of 3 items"),
    (None, "got None"),
    ({"x": torch.randn(2, 4)}, "got a dict of 1 item;"),
])
def test_a_batch_that_is_not_a_pair_is_one_clear_error(batch, says):
    model = nn.Linear(4, 3)
    with pytest.raises(TypeError) as info:
        examine(model, batch)
    message = str(info.value)
    assert message.startswith("batch must be (inputs, target): " + says) and "\n" not in message
    assert "examine(model, (x, y))" in message


def test_inputs_must_be_a_tensor_or_a_tuple():
    with pytest.raises(TypeError, match=r"inputs \(the first item of batch\) must be a tensor"):
        examine(nn.Linear(4, 3), (3.0, None))


def test_a_model_must_be_a_module_with_trainable_parameters():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        examine(lambda x: x, (torch.randn(2, 4), None))
    with pytest.raises(ValueError, match="no trainable parameters"):
        examine(nn.ReLU(), (torch.randn(2, 4), None))
    frozen = nn.Linear(4, 3).requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        examine(frozen, (torch.randn(2, 4), None))


class Detached(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x).detach()


def test_a_detached_output_is_one_clear_error_and_the_model_is_restored():
    model = Detached()
    with pytest.raises(ValueError, match="the loss does not depend on the model's trainable parameters"):
        examine(model, (torch.randn(2, 4), torch.tensor([0, 1])))
    assert not _hooks_left(model) and model.fc.weight.grad is None
    with pytest.raises(ValueError, match="the loss does not depend"):
        examine(nn.Linear(4, 3), (torch.randn(2, 4), None), loss_fn=lambda out, _: out.detach().sum())


class TwoOutputs(nn.Module):
    def __init__(self, as_dict=False):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 3)
        self.as_dict = as_dict

    def forward(self, x):
        out = self.fc(x)
        return {"logits": out, "hidden": x} if self.as_dict else (out, x)


@pytest.mark.parametrize("as_dict", [False, True], ids=["tuple", "dict"])
def test_an_output_the_default_loss_cannot_use_says_pass_loss_fn(as_dict):
    model = TwoOutputs(as_dict)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    with pytest.raises(TypeError, match=f"the model returned a {'dict' if as_dict else 'tuple'} of 2 items, "
                                        "not a tensor.*pass loss_fn="):
        examine(model, (x, y))
    pick = (lambda out: out["logits"]) if as_dict else (lambda out: out[0])
    d = examine(model, (x, y), loss_fn=lambda out, t: nn.functional.cross_entropy(pick(out), t))
    plain = examine(model.fc, (x, y))  # the same layer on its own: the same gradients
    assert np.array_equal(d.grads[("param", "fc.weight")], plain.grads[("param", "weight")])


def test_a_failing_forward_pass_says_what_to_pass_and_keeps_the_cause():
    model = nn.Linear(4, 3)
    with pytest.raises(ValueError, match=r"model\(\*inputs\) failed \(RuntimeError: mat1 and mat2 shapes") as info:
        examine(model, (torch.randn(2, 5), None))
    assert isinstance(info.value.__cause__, RuntimeError) and "\n" not in str(info.value)
    assert not _hooks_left(model)
    with pytest.raises(TypeError, match=r"model\(\*inputs\) failed \(TypeError: .*positional argument"):
        examine(model, ((torch.randn(2, 4), torch.randn(2, 4)), None))


@pytest.mark.parametrize("target, error, says", [
    (torch.tensor([0, 7]), ValueError, "cross-entropy of the output .* failed .*out of bounds"),
    (torch.tensor([0, 1, 2]), ValueError, "cross-entropy of the output"),
    ([0, 1], TypeError, "target must be a tensor"),
    ("labels", TypeError, "target must be a tensor"),
])
def test_a_target_the_default_loss_cannot_use_is_one_clear_error(target, error, says):
    with pytest.raises(error, match=says) as info:
        examine(nn.Linear(4, 3), (torch.randn(2, 4), target))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("loss_fn, error, says", [
    (lambda out, _: out, ValueError, r"the loss must be one number, got a tensor of shape \(2, 3\)"),
    (lambda out, _: 1.0, TypeError, "loss_fn must return the loss as a tensor, got 1.0"),
    ("mse", TypeError, "loss_fn must be a function"),
])
def test_a_loss_that_is_not_one_number_is_one_clear_error(loss_fn, error, says):
    with pytest.raises(error, match=says):
        examine(nn.Linear(4, 3), (torch.randn(2, 4), None), loss_fn=loss_fn)


def test_a_bad_format_is_one_clear_error():
    with pytest.raises(ValueError, match="unknown format 'fp12'"):
        examine(nn.Linear(4, 3), (torch.randn(2, 4), None), fmt="fp12")
    with pytest.raises(TypeError, match="fmt must be a FloatFormat"):
        examine(nn.Linear(4, 3), (torch.randn(2, 4), None), fmt=None)


class Scaled(nn.Module):
    """A linear layer whose output is multiplied by ``factor`` (nan or inf poisons the gradients)."""

    def __init__(self, factor):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 3)
        self.factor = factor

    def forward(self, x):
        return self.fc(x) * self.factor


@pytest.mark.parametrize("factor", [float("nan"), float("inf")])
def test_gradients_that_are_all_nan_or_inf_are_reported_as_such_not_as_zero(factor):
    model = Scaled(factor)
    x = torch.randn(4, 4)
    d = examine(model, (x, None))
    model(x).float().mean().backward()  # the same pass, by hand
    every = np.concatenate([p.grad.reshape(-1).numpy() for p in model.parameters()])
    assert not np.isfinite(every).any()  # the premise: no gradient is finite
    assert d.nonfinite == d.total == every.size + 12  # + the gradient of fc's output (4 x 3)
    assert d.safe_scale is None and not d.bf16_safer  # bf16 has float32's range: it cannot help
    text = str(d)
    assert "every gradient is 0" not in text
    assert "every gradient is inf or NaN" in text and "already inf or NaN in float32" in text


def test_some_nan_gradients_are_counted_and_the_rest_still_diagnosed():
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    x = torch.randn(8, 4)
    x[0, 2] = float("nan")  # poisons weight[0, 2]'s gradient and the bias's, not the others
    d = examine(model, (x, None))
    g = d.grads[("param", "weight")]
    assert np.isnan(g[2]) and np.isfinite(np.delete(g, 2)).all()
    every = np.concatenate(list(d.grads.values()))
    assert d.nonfinite == int((~np.isfinite(every)).sum()) > 0
    assert d.grad_max == float(np.abs(every[np.isfinite(every)]).max()) > 0
    assert d.safe_scale == largest_safe_scale(every[np.isfinite(every)], "fp16")
    assert "largest finite |gradient|" in str(d)


def test_all_zero_gradients_still_say_zero():
    model = nn.Linear(4, 3)
    d = examine(model, (torch.zeros(2, 4), None), loss_fn=lambda out, _: (out * 0).sum())
    assert d.nonfinite == 0 and d.safe_scale is None
    assert "every gradient is 0" in str(d)


def test_table_kind_is_checked():
    d = examine(nn.Linear(4, 3), (torch.randn(2, 4), None))
    with pytest.raises(ValueError, match="kind must be 'param', 'output' or None"):
        d.table("weights")


def test_a_larger_batch_raises_the_low_end_of_the_beams_range():
    """notebook 07's exercise: at a batch of 1024 the beam model loses more at scale 1, so the
    smallest scale that loses < 0.1% is higher; the largest safe scale stays."""
    from ampviz.training.live import build_task

    ranges = {}
    for b in (256, 1024):
        task = build_task("beam", batch_size=b)
        ranges[b] = examine(task.model, task.batch(), task.loss).scale_range
    assert ranges[1024][0] > ranges[256][0] and ranges[1024][1] == ranges[256][1]
