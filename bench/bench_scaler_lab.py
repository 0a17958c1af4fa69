"""ScalerLab latency: one slider move = simulate every scaler + build the figure + serialise it.

Target on a 2-core machine: <= 50 ms per move at 1,000,000 steps. The figure is serialised to
JSON as the kernel would to send it to the browser (display is replaced by that step here, since
there is no browser); the baseline printed beside it is the simulation alone.

    .venv/bin/python bench/bench_scaler_lab.py
"""

import statistics
import time

import ampviz.widgets as widgets
from ampviz import scaling

STEPS = 1_000_000


def main():
    sent = []
    widgets.display = lambda fig, **kw: sent.append(len(fig.to_json()))  # what the kernel would send
    widgets.clear_output = lambda **kw: None
    lab = widgets.ScalerLab(steps=STEPS, scenario="spikes", strength=0.5)
    moves = [0.45, 0.55, 0.6, 0.4, 0.5, 0.35, 0.65, 0.3] * 3
    times = []
    for v in moves:
        t0 = time.perf_counter()
        lab.backoff_slider.value = v
        times.append(1e3 * (time.perf_counter() - t0))
        assert lab.error is None
    sim = []
    for _ in range(7):
        t0 = time.perf_counter()
        scaling.simulate(lab.policy(), grad_max=lab.stream)
        sim.append(1e3 * (time.perf_counter() - t0))
    print(f"ScalerLab, {STEPS:,} steps, scenario spikes: {len(moves)} backoff_factor moves")
    print(f"  per move: median {statistics.median(times):.1f} ms, max {max(times):.1f} ms "
          f"(figure JSON ~{statistics.median(sent) / 1e3:.0f} kB)")
    print(f"  simulate alone: best {min(sim):.1f} ms  ->  drawing costs {statistics.median(times) / min(sim):.1f}x the simulation")


if __name__ == "__main__":
    main()
