"""GPU training speed, in two parts (``--part live``, ``--part block``, or both, the default).

Part "block": what mixed precision buys on a large layer. One seeded transformer block
(``ampviz.training.gpu_record``: d_model 4096, 32 heads, feed-forward 16384, 4 sequences of 2048
tokens, 201M weights) trained with AdamW in fp32, TF32, bf16 autocast, fp16 autocast with a
GradScaler and torchao's FP8 (tensorwise and rowwise), eager and then through ``torch.compile``;
per mode the median step time and the peak device memory, printed with each mode's ratio to fp32
from the same process. ``--record FILE`` writes the record the course shows (after every mode, so
an interrupted run keeps what it measured); ``--deadline S`` leaves out the modes not begun after S
seconds. The record is made with::

    python bench/bench_gpu.py --part block --record ampviz/training/gpu_record.json

Part "live": the live trainer's fp32, fp16+scaler and bf16 steps per second on CUDA.

Each case is the same seeded run (``live.run_training``, census off, ``device="cuda"``) in the three
modes. After one short warm-up run per mode (CUDA context, cuBLAS and cuDNN set-up), the modes are
alternated REPEATS times. Two rates per run:

* step: 1 / the median of ``StepRecord.step_time`` (transfer of the batch, forward, backward and
  optimizer step, with a ``torch.cuda.synchronize`` before the clock stops), first 10 steps left out;
* wall: STEPS / the run's wall time, which also counts making each batch on the CPU.

Printed per case: the median over the runs of each rate, and each mode's ratio to fp32 measured in
this process (the speed-up of fp16 with a loss scaler is the ``fp16+scaler / fp32`` ratio).

Cases: the live trainer's own "mlp" (width 64, batch 64) and "transformer" (batch 64), both so small
that kernel launches, not arithmetic, set the pace (expect no speed-up; the scaler's ``unscale_`` and
its inf check even add work), and a wide mlp on the same task (width 1280, within the trainer's
limit of 10,000,000 weights at depth 6; batch 1024, passed to ``run_training(model=...)``), where
the tensor cores' fp16 and bf16 throughput shows.

On a machine without CUDA it prints one line saying so and exits with status 0.

    .venv/bin/python bench/bench_gpu.py
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

STEPS = int(os.environ.get("STEPS", "200"))
REPEATS = int(os.environ.get("REPEATS", "3"))
MODES = ("fp32", "fp16+scaler", "bf16")


def wide_mlp():
    from ampviz.training import MLP

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return MLP(width=1280)


#: (label, TrainConfig settings, a function that makes the model, or None for the task's own)
CASES = (
    ("mlp (the live trainer's: width 64, batch 64)", dict(model="mlp"), None),
    ("transformer (the live trainer's: batch 64)", dict(model="transformer"), None),
    ("wide mlp (width 1280, batch 1024, lr 0.01)", dict(model="mlp", batch_size=1024, lr=0.01), wide_mlp),
)


def one_run(settings: dict, make_model, mode: str, steps: int):
    """(step rate, wall rate) of one run, or the run's error sentence."""
    from ampviz.training import live

    config = live.TrainConfig(mode=mode, steps=steps, census_every=0, device="cuda", **settings)
    model = make_model() if make_model is not None else None
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    run = live.run_training(config, model=model)
    wall = time.perf_counter() - t0
    if run.error is not None:
        return run.error
    step = statistics.median(run["step_time"][min(10, steps - 1):].tolist())
    return 1.0 / step, steps / wall


def bench_case(label: str, settings: dict, make_model) -> float | None:
    """Print one case; return its fp16+scaler / fp32 step-rate ratio (None if a run failed)."""
    for mode in MODES:  # warm-up, not counted
        one_run(settings, make_model, mode, 20)
    rates = {mode: [] for mode in MODES}
    errors = {}
    for _ in range(REPEATS):
        for mode in MODES:
            result = one_run(settings, make_model, mode, STEPS)
            if isinstance(result, str):
                errors[mode] = result
            else:
                rates[mode].append(result)
    print(label)
    median = {}
    for mode in MODES:
        if mode in errors:
            print(f"  {mode:<12}: a run stopped: {errors[mode]}")
            continue
        step = statistics.median(r[0] for r in rates[mode])
        wall = statistics.median(r[1] for r in rates[mode])
        median[mode] = (step, wall)
        ratio = ""
        if mode != "fp32" and "fp32" in median:
            base_step, base_wall = median["fp32"]
            ratio = f"   {step / base_step:5.2f}x fp32 (wall {wall / base_wall:5.2f}x)"
        print(f"  {mode:<12}: {step:8.0f} steps/s (median step), {wall:8.0f} steps/s (wall){ratio}")
    if "fp32" in median and "fp16+scaler" in median:
        return median["fp16+scaler"][0] / median["fp32"][0]
    return None


def bench_block(record_path: str | None, deadline: float | None, device: str = "cuda", shape=None,
                compiled=(False, True)) -> dict:
    """Part "block": the record of ``ampviz.training.gpu_record``, printed (and written); returned.
    (``device``, ``shape`` and ``compiled`` are there for the CPU test of this part.)"""
    from ampviz.training import gpu_record

    def save(rec):
        if record_path is not None:
            Path(record_path).write_text(json.dumps(rec, indent=1) + "\n")
        r = rec["results"][-1]
        kind = "compiled" if r["compiled"] else "eager"
        shown = r["error"] or (f"{r['step_ms']:.2f} ms/step, peak "
                               + (f"{r['peak_mib']:.0f} MiB, " if r["peak_mib"] is not None else "- (no counter), ")
                               + f"loss {r['loss_first']:.4f} -> {r['loss_last']:.4f}"
                               + (f", first step {r['compile_s']:.1f} s" if r["compile_s"] else ""))
        print(f"  {kind:<8} {r['mode']:<15} {shown}", flush=True)

    shape = gpu_record.BlockShape() if shape is None else shape
    print(f"block: {shape}, {shape.params / 1e6:.0f}M weights, {shape.tokens} tokens a step", flush=True)
    rec = gpu_record.record(gpu_record.MODES, shape, device, steps=10, warmup=3, compiled=compiled,
                            deadline_s=deadline, on_result=save)
    if rec["skipped"]:
        print(f"  {rec['skipped']} mode(s) left out: past the {deadline:g} s deadline")
    for c in compiled:
        print(gpu_record.record_table(rec, compiled=c))
    return rec


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("all", "block", "live"), default="all")
    parser.add_argument("--record", default=None, help="write part block's record to this JSON file")
    parser.add_argument("--deadline", type=float, default=None, help="seconds after which part block starts no mode")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gpu: needs a CUDA device (torch.cuda.is_available() is False); nothing measured")
        return 0
    if args.part in ("all", "block"):
        bench_block(args.record, args.deadline)
    if args.part == "block":
        return 0
    from ampviz.training import live

    tf32 = "on" if torch.backends.cuda.matmul.allow_tf32 else "off"
    print(f"GPU training speed on {live.describe_device('cuda')}; torch {torch.__version__}, "
          f"{STEPS} steps, {REPEATS} run{'s' if REPEATS != 1 else ''} per mode, TF32 matmul {tf32}")
    if not torch.cuda.is_bf16_supported():
        print("  (this GPU has no native bfloat16: bf16 runs are emulated)")
    speedups = []
    for label, settings, make_model in CASES:
        ratio = bench_case(label, settings, make_model)
        speedups.append(f"{label.split(' (')[0]} {ratio:.2f}x" if ratio is not None else
                        f"{label.split(' (')[0]} -")
    print("fp16+scaler speed-up against fp32 (per step, same process): " + ", ".join(speedups))
    return 0


if __name__ == "__main__":
    sys.exit(main())
