"""ScalerLab latency: one control change = simulate every scaler + build the figure + serialise it.

Target on a 2-core machine: <= 50 ms per move at 1,000,000 steps where events are sparse (the
default growth interval), and well under a second where the scale changes at every step
(growth_interval=1, growth 4, backoff near 1: each product must be rounded to float32 before the
next, so the simulation is a loop over steps). The figure is serialised to JSON as the kernel
would to send it to the browser (outside IPython nothing is displayed); the baseline printed
beside it is the simulation alone, in the same process. First, the memory a sweep over every
strength of every scenario leaves held (RSS, Linux only): each gradient stream is STEPS long, so
the streams the lab keeps must stay few.

    .venv/bin/python bench/bench_scaler_lab.py
"""

import statistics
import time

import ampviz.widgets as widgets
from ampviz import scaling
from ampviz.scaling import synth

STEPS = 1_000_000


def moves(lab, values):
    times, sizes = [], []
    for v in values:
        t0 = time.perf_counter()
        lab.backoff_slider.value = v
        sizes.append(len(lab.figure.to_json()))  # what the kernel would send
        times.append(1e3 * (time.perf_counter() - t0))
        assert lab.error is None, lab.error
    sim = []
    for _ in range(5):
        t0 = time.perf_counter()
        scaling.simulate(lab.policy(), grad_max=lab.stream)
        sim.append(1e3 * (time.perf_counter() - t0))
    return times, sizes, min(sim)


def main():
    lab = widgets.ScalerLab(steps=STEPS, scenario="spikes", strength=0.5)
    values = [0.45, 0.55, 0.6, 0.4, 0.5, 0.35, 0.65, 0.3] * 3
    times, sizes, sim = moves(lab, values)
    print(f"ScalerLab, {STEPS:,} steps, scenario spikes, growth_interval 2000: {len(values)} backoff_factor moves")
    print(f"  per move: median {statistics.median(times):.1f} ms, max {max(times):.1f} ms "
          f"(figure JSON ~{statistics.median(sizes) / 1e3:.0f} kB)")
    print(f"  simulate alone: best {sim:.1f} ms  ->  a move costs {statistics.median(times) / sim:.1f}x the simulation")

    lab.interval_input.value = 1
    lab.growth_slider.value = 4.0
    values = [0.995, 0.99, 0.999, 0.995, 0.98]
    times, sizes, sim = moves(lab, values)
    print(f"\nthe same, growth_interval 1, growth 4, backoff near 1 (the scale changes at every step): "
          f"{len(values)} moves")
    print(f"  per move: median {statistics.median(times):.1f} ms, max {max(times):.1f} ms "
          f"(figure JSON ~{statistics.median(sizes) / 1e3:.0f} kB; it was ~75,000 kB and 5-11 s per move)")
    print(f"  simulate alone: best {sim:.1f} ms  ->  a move costs {statistics.median(times) / sim:.1f}x the simulation")


def rss_mib(field="VmRSS") -> float:
    """This process's resident memory (``VmHWM``: its peak), in MiB, from /proc (Linux); NaN elsewhere."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith(field + ":"))
    except (OSError, StopIteration):
        return float("nan")


def sweep_memory():
    lab = widgets.ScalerLab(steps=STEPS)
    start = rss_mib()
    positions = [round(k * lab.strength_slider.step, 2) for k in range(round(1 / lab.strength_slider.step) + 1)]
    for scenario in synth.SCENARIOS:
        lab.scenario_dropdown.value = scenario
        for strength in positions:
            lab.strength_slider.value = strength
    held = rss_mib()
    print(f"memory, {STEPS:,} steps: every strength ({len(positions)}) of every scenario ({len(synth.SCENARIOS)})")
    print(f"  RSS {start:.0f} MiB after building the lab, {held:.0f} MiB after the sweep (peak {rss_mib('VmHWM'):.0f} "
          f"MiB): {held / start:.2f}x, {len(lab._streams)} streams kept\n")


if __name__ == "__main__":
    sweep_memory()  # first: the RSS it starts from is a fresh lab's
    main()
