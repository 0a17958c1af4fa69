"""Loss-scale simulation speed: 1,000,000-step streams.

Prints times and ratios against baselines run in the same process (the machine is shared and
noisy): the real torch.amp.GradScaler("cpu"), timed on a 20,000-step sample, and a plain Python
loop over the same update rule. Targets on a 2-core machine: a 1M-step found_inf stream with one
overflow per thousand steps in <= 10 ms; a 1M-step grad_max stream in <= 50 ms.

    .venv/bin/python bench/bench_scaling.py
"""

import math
import time

import numpy as np
import torch

from ampviz.scaling import TorchGradScaler, simulate

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


def real_gradscaler(found_inf):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.0)
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(torch.zeros(()))
    inf, one = torch.tensor([math.inf]), torch.tensor([1.0])
    for f in found_inf.tolist():
        p.grad = inf.clone() if f else one.clone()
        scaler.step(opt)
        scaler.update()
    return scaler.get_scale()


def main():
    rng = np.random.default_rng(0)
    found_inf = np.zeros(N, bool)
    found_inf[rng.choice(N, N // 1000, replace=False)] = True
    grad_max = (2.0**-6 * np.exp2(rng.normal(0, 1, N))).astype(np.float32)
    grad_max[rng.random(N) < 0.001] *= 2.0**14  # rare spikes
    policy = TorchGradScaler()

    # exactness first (the tests do this thoroughly; here a quick check on the bench's own data)
    sample = found_inf[:SAMPLE]
    assert simulate(policy, found_inf=sample).final.scale == real_gradscaler(sample)

    real_per_step = best_ms(lambda: real_gradscaler(sample), 1) / SAMPLE
    rows = []
    t_sim = best_ms(lambda: simulate(policy, found_inf=found_inf))
    t_loop = best_ms(lambda: plain_loop(found_inf), 3)
    rows.append(("found_inf, 1 overflow per 1000 steps", t_sim, t_loop, real_per_step * N))
    t_sim_g = best_ms(lambda: simulate(policy, grad_max=grad_max))
    t_loop_g = best_ms(lambda: plain_loop_grad_max(grad_max), 1)
    rows.append(("grad_max, rare spikes", t_sim_g, t_loop_g, real_per_step * N))

    print(f"{N:,} steps; real GradScaler timed on {SAMPLE:,} steps ({1e3 * real_per_step:.1f} us/step)\n")
    print(f"{'stream':40s} {'simulate ms':>12s} {'plain loop ms':>14s} {'x loop':>8s} {'real GradScaler s':>18s} {'x real':>9s}")
    for name, sim, loop, real in rows:
        print(f"{name:40s} {sim:12.2f} {loop:14.1f} {loop / sim:8.1f} {real / 1e3:18.1f} {real / sim:9.0f}")


if __name__ == "__main__":
    main()
