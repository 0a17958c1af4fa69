"""The overflow model against a real training run: a small MLP trained under CPU fp16 autocast
with a real ``torch.amp.GradScaler`` whose scale climbs into overflow again and again
(growth_interval=1). Each step records the largest unscaled gradient that passes through fp16
(hooks on every fp16 activation, and the weights' gradients, which autocast computes in fp16),
measured at a fixed reference scale, not at the scale the run used; ``simulate`` fed with that
stream must give the real scale before every step and the real skipped steps.

The loss is float32 (autocast runs ``mse_loss`` in fp32), so the default model applies:
f16(f32(scale * g)). The old model, which casts the scale itself to fp16, says every step at a
scale of 2^16 or more overflows; the real run climbs past 2^16 without a skip there.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ampviz.scaling import TorchGradScaler, overflows, simulate

REFERENCE_SCALE = 2.0**10  # the unscaled gradients are measured at this scale (a power of two)


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def _fp16_gradient_max(model: nn.Module, x, y, scale: float, params) -> tuple[float, float]:
    """At ``scale``, without touching the parameters' .grad: the largest |gradient| of any fp16
    tensor of the backward (activations through hooks, weights through their fp32 copies of the
    fp16 gradients), and the loss. Nothing is stepped."""
    seen = []

    def grab(module, inputs, output):
        assert output.dtype == torch.float16
        output.register_hook(lambda g: seen.append(float(g.abs().max())))

    handles = [m.register_forward_hook(grab) for m in model]
    try:
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(x)
            loss = F.mse_loss(out, y)
        assert loss.dtype == torch.float32  # autocast computes this loss in fp32
        grads = torch.autograd.grad(loss * torch.tensor(scale, dtype=torch.float32), params)
    finally:
        for h in handles:
            h.remove()
    seen += [float(g.abs().max()) for g in grads]
    return max(seen), float(loss.detach())


def real_run(steps: int, seed: int = 0, init_scale: float = 2.0**10, lr: float = 0.05):
    """Train for ``steps`` steps with a real GradScaler (growth_interval=1): the scale before each
    step, whether the step was skipped, the loss, and the grad_max stream measured at the
    reference scale."""
    model = _model(seed)
    params = list(model.parameters())
    gen = torch.Generator().manual_seed(seed + 1)
    teacher = torch.randn(16, 4, generator=gen)
    opt = torch.optim.SGD(params, lr=lr)
    taken = []
    inner = opt.step

    def counting(*a, **k):
        taken.append(True)
        return inner(*a, **k)

    opt.step = counting
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_factor=2.0, backoff_factor=0.5,
                                  growth_interval=1)
    scales, skipped, grad_max, losses = [], [], [], []
    for _ in range(steps):
        x = torch.randn(64, 16, generator=gen)
        y = x @ teacher + 0.1 * torch.randn(64, 4, generator=gen)
        m, loss = _fp16_gradient_max(model, x, y, REFERENCE_SCALE, params)
        assert np.isfinite(m) and m < 32768  # nothing overflows at the reference scale
        grad_max.append(np.float32(m) / np.float32(REFERENCE_SCALE))  # exact: a power of two
        losses.append(loss)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(x)
            real_loss = F.mse_loss(out, y)
        scales.append(scaler.get_scale())
        scaler.scale(real_loss).backward()
        before = len(taken)
        scaler.step(opt)
        scaler.update()
        skipped.append(len(taken) == before)
    return (np.array(scales, np.float32), np.array(skipped), np.array(grad_max, np.float32), np.array(losses))


@pytest.fixture(scope="module")
def run():
    return real_run(400)


def test_simulate_reproduces_a_real_run_that_overflows_again_and_again(run):
    scales, skipped, g, losses = run
    policy = TorchGradScaler(init_scale=2.0**10, growth_interval=1)
    trace = simulate(policy, grad_max=g)  # loss_dtype="float32": the loss autocast computes
    bad = np.flatnonzero(trace.scale != scales)
    assert bad.size == 0, f"scale differs first at step {bad[0]}: simulated {trace.scale[bad[0]]}, real {scales[bad[0]]}"
    assert np.array_equal(trace.skipped, skipped)
    # the run is what the test claims: hundreds of steps, many skips, scales past 2^16, and it learns
    assert len(scales) == 400 and 100 <= skipped.sum() <= 300
    assert scales.max() >= 2.0**17 and not skipped[scales >= 65520].all()
    assert losses[-50:].mean() < 0.5 * losses[:10].mean()


def test_the_old_model_does_not_reproduce_it(run):
    """Casting the scale itself to fp16 (the fp16-loss model) skips every step at 2^16, so its
    scale never gets past it: it disagrees with the real run from the first step at 2^16."""
    scales, skipped, g, _ = run
    old = simulate(TorchGradScaler(init_scale=2.0**10, growth_interval=1), grad_max=g, loss_dtype="float16")
    assert old.scale.max() == 2.0**16 and old.skipped[old.scale == 2.0**16].all()
    first = int(np.argmax(scales == 2.0**16))
    assert not skipped[first] and old.skipped[first] and np.array_equal(old.scale[:first + 1], scales[:first + 1])
    assert bool(overflows(2.0**16, g[0], loss_dtype="float16")) and not overflows(2.0**16, g[0])
