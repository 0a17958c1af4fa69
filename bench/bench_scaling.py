"""Loss-scale simulation speed: 1,000,000-step streams, sparse and dense.

Prints times per million steps and ratios against baselines run in the same process (the machine
is shared and noisy): the real torch.amp.GradScaler("cpu"), timed on a 20,000-step sample, and a
plain Python loop over the same update rule. Targets on a 2-core machine: a 1M-step found_inf
stream with one overflow per thousand steps in <= 10 ms; a 1M-step grad_max stream in <= 50 ms.

Dense streams (an overflow or a growth at nearly every step: growth_interval=1, or a scale that
keeps overflowing) used to cost 20-40 us per event: 13-30 s per million steps. Where the scale
cannot move (0, a floor, float32's max) or every update is one exact multiplication (float64, or
factors that are float32 values, on a known found_inf stream), they now take numpy time; where
torch's rounding of a double product to float32 must be followed step by step (factors such as
1.001 or 0.995, or a grad_max stream whose overflows depend on the scale), a Python loop over the
events does it, at about the plain loop's cost ("x loop": the plain loop's time over simulate's).
Presets are timed on found_inf streams that overflow at every other step; the last row is the
10M-step stream that overflows at every step (it took over 15 minutes), per million steps.

    .venv/bin/python bench/bench_scaling.py
"""

import math
import time

import numpy as np
import torch

from ampviz.scaling import synth
from ampviz.scaling import PRESETS, TorchGradScaler, simulate

N = 1_000_000
SAMPLE = 20_000


def best_ms(fn, repeat=7):
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return 1e3 * best


def plain_loop(found_inf, scale=2.0**16, gf=2.0, bf=0.5, gi=2000):
    """The update rule as a bare Python loop (float64 arithmetic, no rounding to float32)."""
    tracker = 0
    out = np.empty(len(found_inf))
    for i, f in enumerate(found_inf.tolist()):
        out[i] = scale
        if f:
            scale *= bf
            tracker = 0
        else:
            tracker += 1
            if tracker == gi:
                scale *= gf
                tracker = 0
    return out


def plain_loop_grad_max(grad_max, scale=2.0**16, gf=2.0, bf=0.5, gi=2000):
    """The same loop deciding overflow per step from the gradient: f16(f16(S) * f16(g))."""
    tracker = 0
    with np.errstate(over="ignore"):  # beyond fp16's range is inf, as in the model
        g16 = np.abs(grad_max.astype(np.float16).astype(np.float64)).tolist()
    out = np.empty(len(g16))
    for i, g in enumerate(g16):
        out[i] = scale
        s16 = float(np.float16(scale)) if scale < 65520 else math.inf
        if not s16 * g < 65520:
            scale *= bf
            tracker = 0
        else:
            tracker += 1
            if tracker == gi:
                scale *= gf
                tracker = 0
    return out


def real_gradscaler(found_inf, **kwargs):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.0)
    scaler = torch.amp.GradScaler("cpu", **kwargs)
    scaler.scale(torch.zeros(()))
    inf, one = torch.tensor([math.inf]), torch.tensor([1.0])
    for f in found_inf.tolist():
        p.grad = inf.clone() if f else one.clone()
        scaler.step(opt)
        scaler.update()
    return scaler.get_scale()


def torch_kwargs(policy):
    return dict(gf=policy.growth_factor, bf=policy.backoff_factor, gi=policy.growth_interval,
                scale=policy.init_scale)


def main():
    rng = np.random.default_rng(0)
    found_inf = np.zeros(N, bool)
    found_inf[rng.choice(N, N // 1000, replace=False)] = True
    grad_max = (2.0**-6 * np.exp2(rng.normal(0, 1, N))).astype(np.float32)
    grad_max[rng.random(N) < 0.001] *= 2.0**14  # rare spikes
    spikes = synth.scenario("spikes", N, 0.5, np.random.default_rng(1))  # the ScalerLab's default stream
    policy = TorchGradScaler()

    # exactness first (the tests do this thoroughly; here a quick check on the bench's own data)
    sample = found_inf[:SAMPLE]
    assert simulate(policy, found_inf=sample).final.scale == real_gradscaler(sample)
    dense = TorchGradScaler(growth_interval=1, growth_factor=4.0, backoff_factor=0.995)
    alternating = np.arange(N) % 2 == 0
    assert simulate(dense, found_inf=alternating[:SAMPLE // 10]).final.scale == \
        real_gradscaler(alternating[:SAMPLE // 10], growth_interval=1, growth_factor=4.0, backoff_factor=0.995)

    real_per_step = best_ms(lambda: real_gradscaler(sample), 1) / SAMPLE
    rows = []
    t_sim = best_ms(lambda: simulate(policy, found_inf=found_inf))
    t_loop = best_ms(lambda: plain_loop(found_inf), 3)
    rows.append(("found_inf, 1 overflow per 1000 steps", t_sim, t_loop))
    t_sim_g = best_ms(lambda: simulate(policy, grad_max=grad_max))
    t_loop_g = best_ms(lambda: plain_loop_grad_max(grad_max), 1)
    rows.append(("grad_max, rare spikes", t_sim_g, t_loop_g))

    # dense: an event at (nearly) every step
    half = np.random.default_rng(2).random(N) < 0.5
    cases = [
        ("found_inf, every step overflows", policy, dict(found_inf=np.ones(N, bool))),
        ("found_inf, alternating, gi=1", TorchGradScaler(growth_interval=1), dict(found_inf=alternating)),
        ("found_inf, half random, gi=1 x4 .995", dense, dict(found_inf=half)),
        ("found_inf, half random, gi=1 x1.001 .9",
         TorchGradScaler(growth_interval=1, growth_factor=1.001, backoff_factor=0.9), dict(found_inf=half)),
        ("grad_max spikes, gi=1 x4 .995", dense, dict(grad_max=spikes)),
        ("grad_max spikes, gi=1", TorchGradScaler(growth_interval=1), dict(grad_max=spikes)),
        ("grad_max spikes, gi=10", TorchGradScaler(growth_interval=10), dict(grad_max=spikes)),
        ("grad_max spikes, gi=100", TorchGradScaler(growth_interval=100), dict(grad_max=spikes)),
        ("grad_max spikes, strength 1, defaults", policy,
         dict(grad_max=synth.scenario("spikes", N, 1.0, np.random.default_rng(1)))),
    ]
    for name, p, stream in cases:
        t = best_ms(lambda: simulate(p, **stream), 3)
        if "found_inf" in stream:
            loop = best_ms(lambda: plain_loop(stream["found_inf"], **torch_kwargs(p)), 1)
        else:
            loop = best_ms(lambda: plain_loop_grad_max(stream["grad_max"], **torch_kwargs(p)), 1)
        rows.append((name, t, loop))
    for name in ("Megatron", "NeMo (apex hysteresis)", "metaseq"):
        rows.append((f"found_inf, alternating, {name}",
                     best_ms(lambda: simulate(PRESETS[name], found_inf=alternating), 3), None))
    ten = np.ones(10 * N, bool)  # the stream that took over 15 minutes
    rows.append(("found_inf, 10M steps all overflowing (per 1M)",
                 best_ms(lambda: simulate(policy, found_inf=ten), 1) / 10, None))

    print(f"{N:,} steps; real GradScaler timed on {SAMPLE:,} steps ({1e3 * real_per_step:.1f} us/step)\n")
    real = real_per_step * N
    print(f"{'stream (ms per 1M steps)':48s} {'simulate ms':>12s} {'plain loop ms':>14s} {'x loop':>8s} "
          f"{'real GradScaler s':>18s} {'x real':>9s}")
    for name, sim, loop in rows:
        loop_text = f"{loop:14.1f} {loop / sim:8.1f}" if loop is not None else f"{'':14s} {'':8s}"
        print(f"{name:48s} {sim:12.2f} {loop_text} {real / 1e3:18.1f} {real / sim:9.0f}")


if __name__ == "__main__":
    main()
