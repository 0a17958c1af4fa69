"""The reasons lesson 07's questions that ask why call right (``ampviz.training.lesson``), each
measured on the lesson's own seeded models: fp16's backward loses the layer outputs' gradients on
the way down, pure fp16 Adam divides by 0, and pure fp16 SGD rounds fc1's updates away."""

import pytest
import torch

from ampviz.training.doctor import lost_shares, make_mlp
from ampviz.training.lesson import WHY_BACKWARD_LOSES_MORE, WHY_FIRST_LAYERS_FREEZE, WHY_HALF_DIVERGES
from ampviz.training.live import TrainConfig, build_task, run_training

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _half_step(task, lr, optimizer):
    """One step of ``task`` with its model in fp16 (the half mode): the gradients and the weights
    before the step, and the optimizer."""
    model = task.model.half()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = optimizer(model.parameters(), lr)
    inputs, targets = task.batch()
    inputs = tuple(x.half() if x.is_floating_point() else x for x in inputs)
    task.loss(model(*inputs), targets).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    opt.step()
    return model, before, grads, opt


def test_fp16_loses_the_gradient_entering_the_network_and_every_weight_layer_below_loses_more():
    """WHY_BACKWARD_LOSES_MORE (b): at step 0 the gradient of the last layer's output is mostly an exact 0
    in the fp16 backward (none is 0 in fp32), and every weight layer computed from it loses more than a
    cast of fp32's own gradients; the losses of the two runs at step 0 are the same to 0.1%."""
    assert WHY_BACKWARD_LOSES_MORE.right == "b"
    runs = {m: run_training(TrainConfig(model="beam", mode=m, steps=1, census_every=1)) for m in ("fp32", "fp16")}
    head = {m: runs[m].records[0].act_census["head"] for m in runs}
    assert head["fp32"].counts["zero"] == 0 and head["fp16"].counts["zero"] > 0.9 * head["fp16"].total
    fp16, cast = lost_shares(runs["fp16"], 0, runs["fp32"]), lost_shares(runs["fp32"], 0, runs["fp32"])
    weights = [n for n in fp16 if n.endswith("weight")]
    assert weights and all(fp16[n] > 2 * cast[n] for n in weights)
    assert abs(runs["fp16"]["loss"][0] / runs["fp32"]["loss"][0] - 1) < 1e-3  # same start: nothing learned yet


def test_pure_fp16_adam_divides_by_zero_where_the_squared_gradients_are_zero():
    """WHY_HALF_DIVERGES (b): after Adam's first step on the fp16 beam model, weights are inf or NaN, and
    each of them has a running mean of squared gradients of exactly 0 (eps is 0 in fp16 too)."""
    assert WHY_HALF_DIVERGES.right == "b"
    model, _, grads, opt = _half_step(build_task("beam"), 1e-3, torch.optim.Adam)
    assert all(torch.isfinite(g).all() for g in grads.values())  # nothing overflowed in the backward
    assert torch.tensor(opt.defaults["eps"], dtype=torch.float16).item() == 0.0
    bad = 0
    for p in model.parameters():
        broken = ~torch.isfinite(p.detach())
        bad += int(broken.sum())
        assert (opt.state[p]["exp_avg_sq"][broken] == 0).all()
    assert bad > 0


def test_pure_fp16_sgd_rounds_fc1s_updates_away_though_its_gradients_arrive():
    """WHY_FIRST_LAYERS_FREEZE (c): on the MLP of lesson 07, one SGD step in fp16: fc1's gradients are
    nearly all nonzero and around 10^-6, the learning rate times each is at most half the gap to the
    weight's fp16 neighbour on its side for nearly all of them, and none of those weights moved; fc12's
    gradients are over 1,000 times larger, and far more of its weights moved."""
    assert WHY_FIRST_LAYERS_FREEZE.right == "c"
    lr = 0.05
    task = build_task("mlp")
    task.model = make_mlp(12, 0)
    model, before, grads, _ = _half_step(task, lr, lambda params, lr: torch.optim.SGD(params, lr=lr, momentum=0.9))
    after = dict(model.named_parameters())
    share = {}
    for name in ("fc1.weight", "fc12.weight"):
        w, g = before[name], grads[name].float()
        arrived = g != 0
        away = torch.where(g > 0, torch.tensor(float("-inf"), dtype=w.dtype), torch.tensor(float("inf"), dtype=w.dtype))
        gap = (torch.nextafter(w, away).float() - w.float()).abs()
        lost = arrived & (lr * g.abs() <= gap / 2)
        moved = after[name].detach() != w
        assert not (lost & moved).any()  # an update below half the gap leaves the weight as it was
        share[name] = (float(arrived.float().mean()), float(lost.sum() / arrived.sum()), float(moved.float().mean()),
                       float(g[arrived].abs().mean()))
    arrived, lost, moved, size = share["fc1.weight"]
    assert arrived > 0.9 and lost > 0.99 and moved < 0.01 and 1e-7 < size < 1e-5
    assert share["fc12.weight"][3] > 1000 * size and share["fc12.weight"][2] > 10 * moved
