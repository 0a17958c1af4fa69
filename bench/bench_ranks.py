"""Starting ranks from a notebook cell: how long ``run_ranks`` takes, against a bare fork.

Times, in this one process (the machine is shared and noisy, so each figure is the best of a few
runs and is printed as a ratio to a baseline run here too):

* baseline: one ``os.fork()`` of this process (torch imported) whose child exits at once, and the
  parent's ``waitpid``: what starting a process costs at all;
* one DDP step on 4 ranks before and after ``prewarm()`` (the one-off imports in the parent,
  ``torch._dynamo`` above all, which every rank otherwise pays for itself);
* ``run_ranks`` with a function that returns at once, for 2, 4, 8, 16 and 64 ranks: fork, one torch
  thread, a gloo group, the result back, every rank killed and reaped;
* ``run_scaler_ranks("ddp", ...)`` with 4 ranks and 6 steps (the lesson's cell: DDP, autocast fp16,
  GradScaler, one rank's overflow); target <= 2 s on 2 cores once prewarmed;
* ``run_allreduce`` of 65,536 float32 values on 4 ranks, and ``allreduce`` (the model) of the same;
* ``simulate_ranks`` in mode ``"unscale_first"`` (ranks coupled through poisoned weights) as a ratio
  to mode ``"ddp"`` on the same streams, 8 ranks x 200,000 and 1,000,000 steps: a clean stream (every
  rank overflows at once when the scale grows too far: no rank is poisoned) and one overflow on one
  rank (every other rank is poisoned); target: the same order as ``"ddp"``.

    .venv/bin/python bench/bench_ranks.py
"""

import math
import os
import time

T0 = time.perf_counter()
import numpy as np  # noqa: E402
import torch  # noqa: E402, F401

IMPORT_TORCH = time.perf_counter() - T0

from ampviz import ranks  # noqa: E402

TARGET_S = 2.0


def best_ms(fn, repeat=5):
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return 1e3 * best


def bare_fork():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def returns_rank(rank, world_size):
    return rank


def one_ddp_step(rank, world_size):
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    model(torch.randn(4, 8)).sum().backward()
    return float(model.module.weight.grad.sum())


def main():
    torch.set_num_threads(1)
    fork_ms = best_ms(bare_fork, 20)
    rows = []
    cold_ms = best_ms(lambda: ranks.run_ranks(one_ddp_step, 4), 1)
    rows.append(("run_ranks, 4 ranks, one DDP step, no prewarm()", cold_ms))
    t0 = time.perf_counter()
    ranks.prewarm()
    prewarm_s = time.perf_counter() - t0
    rows.append(("run_ranks, 4 ranks, one DDP step, prewarmed", best_ms(lambda: ranks.run_ranks(one_ddp_step, 4), 3)))
    for ws in (2, 4, 8, 16, 64):
        assert ranks.run_ranks(returns_rank, ws) == list(range(ws))
        rows.append((f"run_ranks, {ws} ranks, a function that returns",
                     best_ms(lambda: ranks.run_ranks(returns_rank, ws), 3 if ws > 8 else 5)))
    flags = np.zeros((4, 6), bool)
    flags[1, 2] = True
    run = ranks.run_scaler_ranks("ddp", found_inf=flags, growth_interval=2)
    assert run.trace.found_inf[:, 2].all() and run.weights_identical.all()
    ddp_ms = best_ms(lambda: ranks.run_scaler_ranks("ddp", found_inf=flags, growth_interval=2), 3)
    rows.append(("run_scaler_ranks('ddp'), 4 ranks x 6 steps", ddp_ms))
    x = np.random.default_rng(0).normal(0, 1e-3, (4, 65_536)).astype(np.float32)
    assert np.array_equal(ranks.run_allreduce(x)[0], ranks.allreduce(x))
    rows.append(("run_allreduce, 4 ranks x 65,536 float32", best_ms(lambda: ranks.run_allreduce(x), 3)))
    rows.append(("allreduce (the model), 4 x 65,536 float32", best_ms(lambda: ranks.allreduce(x))))
    rows.append(("allreduce (the model), 4 x 65,536 bfloat16", best_ms(lambda: ranks.allreduce(x, "bfloat16"))))

    print(f"import torch {IMPORT_TORCH:.1f} s; prewarm() {prewarm_s:.1f} s (first call, once per process); "
          f"{os.cpu_count()} CPUs")
    print(f"baseline: bare fork + exit + waitpid {fork_ms:.2f} ms\n")
    print(f"{'what':48s} {'best ms':>9s} {'x fork':>8s}")
    for name, ms in rows:
        print(f"{name:48s} {ms:9.1f} {ms / fork_ms:8.0f}")
    verdict = "met" if ddp_ms <= 1e3 * TARGET_S else "MISSED"
    print(f"\ntarget: 4 ranks start, run a few steps and are joined in <= {TARGET_S:g} s once prewarmed: "
          f"{ddp_ms / 1e3:.2f} s ({verdict})")
    simulator()


def simulator():
    from ampviz.scaling import TorchGradScaler

    policy = TorchGradScaler(init_scale=2.0**16, growth_interval=2000)
    print(f"\nsimulate_ranks, 8 ranks, {policy.name} scalers: mode 'unscale_first' against 'ddp'")
    print(f"{'stream':34s} {'steps':>9s} {'ddp ms':>8s} {'unscale_first ms':>17s} {'x ddp':>6s}")
    for steps in (200_000, 1_000_000):
        one = np.zeros((8, steps), bool)
        one[1, 5] = True
        for name, stream in (("clean, max|g| = 2^-4 on every rank", {"grad_max": np.full((8, steps), 2.0**-4)}),
                             ("rank 1 overflows at step 5", {"found_inf": one})):
            ms = [best_ms(lambda: ranks.simulate_ranks(policy, mode=m, **stream), 3) for m in ("ddp", "unscale_first")]
            print(f"{name:34s} {steps:9,d} {ms[0]:8.0f} {ms[1]:17.0f} {ms[1] / ms[0]:6.1f}")


if __name__ == "__main__":
    main()
