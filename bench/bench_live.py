"""LiveTrainer overhead: the same seeded run with and without the widget drawing it.

One mode ("fp16+scaler", mlp, census every 10 steps), STEPS steps, ``torch.set_num_threads(1)`` as
the notebooks set it for tiny models (with more threads, every new training thread starts its
own OpenMP team and the timings get much noisier). Variants, alternated REPEATS times:

* baseline: ``live.run_training`` alone, in the main thread (first and again last);
* LiveTrainer: ``start()`` + ``wait()``: the training thread, progress line and throttled
  ``batch_update`` redraws of the FigureWidget;
* + JSON: the same, also serialising the figure's traces at every redraw as the widget sends them
  (without a browser no comm is open, so the kernel would not send anything).

Then a long run: 100,000 steps of records (a real run's records, census every 10 steps, repeated
with new step numbers; training them for real would take minutes) appended to a ``live.Run`` as
LiveTrainer keeps them (``max_records=4000``) and to an unbounded one. At 1,000, 10,000 and
100,000 steps it times one redraw (``live_traces`` + the widget's serialisation) and measures the
memory the records hold (tracemalloc), and prints both against the 1,000-step figures and against
the unbounded run.

Prints steps/s (best and median of the runs), the ratios to the baseline (target >= 0.9) and the
share of the widget run spent drawing, which is the figure least disturbed by a noisy machine.

    .venv/bin/python bench/bench_live.py
"""

import copy
import json
import os
import statistics
import time
import tracemalloc

import torch

import ampviz.widgets as widgets
from ampviz.training import live
from ampviz.widgets.figureview import pack
from ampviz.plots import live_traces

STEPS = 400
REPEATS = int(os.environ.get("REPEATS", "5"))
THREADS = int(os.environ.get("THREADS", "1"))
CONFIG = dict(model="mlp", mode="fp16+scaler", steps=STEPS, census_every=10, seed=0)


def baseline() -> float:
    t0 = time.perf_counter()
    run = live.run_training(live.TrainConfig(**CONFIG))
    dt = time.perf_counter() - t0
    assert len(run) == STEPS and run.error is None
    return STEPS / dt


def with_widget(serialise: bool, drawing: list) -> float:
    lt = widgets.LiveTrainer(modes=(CONFIG["mode"],), model=CONFIG["model"], steps=STEPS,
                             census_every=CONFIG["census_every"], seed=CONFIG["seed"])
    draw, spent = lt._draw_live, []

    def timed_draw():
        t = time.perf_counter()
        draw()
        if serialise:
            json.dumps(pack(lt.figure.data))
        spent.append(time.perf_counter() - t)

    lt._draw_live = timed_draw
    t0 = time.perf_counter()
    lt.start()
    assert lt.wait(120)
    dt = time.perf_counter() - t0
    assert len(lt.runs[CONFIG["mode"]]) == STEPS and lt.error is None, lt.error
    drawing.append((len(spent), sum(spent), dt))
    return STEPS / dt


def main():
    torch.set_num_threads(THREADS)
    baseline()  # warm up torch and plotly
    with_widget(False, [])
    base, widget, sent, d_widget, d_sent = [], [], [], [], []
    for _ in range(REPEATS):
        base.append(baseline())
        widget.append(with_widget(False, d_widget))
        sent.append(with_widget(True, d_sent))
    base.append(baseline())
    print(f"live training, {CONFIG['model']} {CONFIG['mode']}, {STEPS} steps, census every "
          f"{CONFIG['census_every']}, torch threads {THREADS}, {REPEATS} runs each")
    b_best, b_med = max(base), statistics.median(base)
    print(f"  {'baseline (run_training)':<26}: best {b_best:5.0f} steps/s, median {b_med:5.0f}   "
          f"(first {base[0]:.0f}, last {base[-1]:.0f})")
    for label, rates, drawing in (("LiveTrainer", widget, d_widget), ("LiveTrainer + JSON", sent, d_sent)):
        best, med = max(rates), statistics.median(rates)
        draws = statistics.median(n for n, _, _ in drawing)
        share = statistics.median(s / dt for _, s, dt in drawing)
        per = 1e3 * statistics.median(s / max(n, 1) for n, s, _ in drawing)
        print(f"  {label:<26}: best {best:5.0f} steps/s, median {med:5.0f}   ratio best {best / b_best:.2f},"
              f" median {med / b_med:.2f}   drawing {100 * share:.1f}% of the run ({draws:.0f} draws,"
              f" {per:.1f} ms each)")


def redraw_ms(run, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        json.dumps(pack(live_traces({CONFIG["mode"]: run})))
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def long_run(total: int = 100_000, max_records: int = 4000):
    source = live.run_training(live.TrainConfig(**{**CONFIG, "steps": 100})).records
    print(f"a long run: {total:,} steps of {CONFIG['mode']} records (census every {CONFIG['census_every']}), "
          f"kept as LiveTrainer keeps them (max_records={max_records:,}) and all of them")
    rows = {}
    for label, limit in (("bounded", max_records), ("unbounded", None)):
        tracemalloc.start()
        run = live.Run(config=live.TrainConfig(**CONFIG), max_records=limit)
        for step in range(total):
            rec = copy.deepcopy(source[step % len(source)])  # a census of its own, as in a real run
            rec.step = step
            run.append(rec)
            if step + 1 in (1_000, 10_000, total):
                memory = tracemalloc.get_traced_memory()[0]
                rows[label, step + 1] = (redraw_ms(run), memory, len(run))
        tracemalloc.stop()
    base_ms, base_mem, _ = rows["bounded", 1_000]
    for (label, steps), (ms, mem, kept) in rows.items():
        print(f"  {label:<9} {steps:>7,} steps: {kept:>7,} records kept, redraw {ms:7.1f} ms "
              f"({ms / base_ms:5.1f}x the 1,000-step redraw), records {mem / 2**20:7.1f} MB "
              f"({mem / base_mem:5.1f}x)")


if __name__ == "__main__":
    main()
    long_run()
