# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Start here: mixed-precision training, made visible
#
# A hands-on course on [mixed precision](../GLOSSARY.md#mixed-precision): what fp16, bf16 and fp8 do
# to the numbers a network trains with, and how loss scaling keeps small gradients alive.
#
# In this notebook you will be able to:
# - find your way around the course: what each notebook teaches, and where its exercises are,
# - run cells and use the interactive explorers in JupyterLab (and fix one that does not show),
# - see what *your* machine measures for fp16 and bf16, rather than what a datasheet promises.
#
# Teaching with this course? The [teacher's guide](../TEACHING.md) gives, per notebook, timings,
# the answers to every exercise and what to demo live ([its section on this notebook](../TEACHING.md#nb00)).
# The words the course uses, in English and Chinese (中文), each with a one-line definition: the
# [glossary](../GLOSSARY.md).

# %%
import numpy as np
import torch

from ampviz import env
from ampviz.formats.lesson import (cast_table, check_cast, check_why_1000_1_rounds_to_1000,
                                   check_why_fp16_stalls)
from ampviz.plots import plot_format_ranges
from ampviz.text import measured
from ampviz.training.gpu_record import load_record, record_table
from ampviz.training.live.short import short_runs
from ampviz.widgets import FormatExplorer

rng = np.random.default_rng(0)
_ = torch.manual_seed(0)

# %% [markdown]
# ## Why this course: fp16 without a scaler stops learning
#
# A small network predicts how far a floor beam bends, in metres (notebook 07's model). The cell
# trains it for 100 seeded steps four ways, a few seconds in all: fp32, fp16 (autocast) without a
# loss scaler, fp16 with PyTorch's `GradScaler`, and bf16. Its loss (mean squared error) in mm²:

# %%
# NBVAL_CHECK_OUTPUT
runs = short_runs(steps=100)
for m in runs.losses:
    print(f"{m:12} loss {measured(1e6 * runs.start(m), 2):>3} mm² -> {measured(1e6 * runs.end(m), 2):>3} mm²: "
          f"{runs.verdict(m)}")

# %%
learners = ("fp32", "fp16+scaler", "bf16")
assert runs.verdict("fp16") == "stalls" and all(runs.verdict(m) == "learns" for m in learners)
assert all(runs.end("fp16") > 5 * runs.end(m) for m in learners)  # fp16 alone ends far above the others

# %% [markdown]
# fp16 alone stalls: this model's gradients are so small that fp16 rounds most of them to 0. The
# course shows why and how to fix it: 01 fp16's range, 02 how a loss scale shifts gradients back
# into it, 04 how `GradScaler` does it, and 07 this model's full run, layer by layer.

# %% [markdown]
# ## The course map
#
# The core path, and three tracks that branch off it (the
# [teacher's guide](../TEACHING.md#the-course-map) says what each track needs):
#
# ```mermaid
# flowchart LR
#     n00["00 start here"] --> n01["01 formats"] --> n02["02 loss scaling"] --> n03a["03a autocast"] --> n03b["03b bf16 in practice"] --> n04["04 GradScaler"] --> n05["05 real loops"] --> n07["07 live training"]
#     n04 -.-> n06["06 scaling lab"]
#     n04 --> n08["08 Lightning: manual_backward"] --> n09["09 Lightning: autocast cache"] --> n10["10 Lightning: TransformerEncoder"]
#     n05 --> n11a["11a loss scaling across ranks"] --> n11b["11b all-reduce numerics"]
#     n02 --> n12["12 FP8 scaling"] --> n13["13 MX and NVFP4"] --> n14["14 FP8 training"]
# ```
#
# | notebook | what you will learn |
# |---|---|
# | 00 · Start here (this page) | the map, how to use the widgets, your environment |
# | [01 · The fp16 range: bits, subnormals, rounding](01_fp16_range.ipynb) | the bits of fp16, bf16 and fp8: ranges, subnormals, rounding, and why a weight stops learning in fp16 |
# | [02 · Loss scaling: keeping small gradients alive in fp16](02_loss_scaling.ipynb) | real gradients that fp16 flushes to zero, and how a static loss scale shifts them back into range |
# | [03a · Autocast, measured: what runs in which dtype](03a_autocast.ipynb) | which dtype each op really runs in under CPU autocast (measured, fp16 and bf16) beside CUDA's lists, why the loss comes out fp32 and what that does to the first step, the weight cache and its stale copy, `torch.compile` |
# | [03b · bf16 in practice: no loss scaler, and the updates bf16 weights lose](03b_bf16_in_practice.ipynb) | bf16 without a loss scaler, a model that overflows in fp16 only, lost updates in bf16 weights with three fixes, and stochastic rounding written and tested |
# | [04 · GradScaler internals: the real scaler, call by call](04_gradscaler_internals.ipynb) | the real `torch.amp.GradScaler` call by call: its float32 scale, `unscale_`, skipped steps, backoff and growth, every error message, clipping and skipped-step checks, and a bit-exact simulator |
# | [05 · GradScaler in a real loop: accumulation, several optimizers, checkpoints](05_gradscaler_in_a_real_loop.ipynb) | the real `torch.amp.GradScaler` in the loops people write, each mistake run with its exact error or silent symptom: gradient accumulation, two losses and two optimizers, clipping, a gradient penalty, checkpoint and resume (the burst of skipped steps without the scaler's state), skipped-step detection and the scheduler, and a checker for your own training step |
# | [06 · The scaling lab: dynamic loss scalers under pressure](06_scaling_lab.ipynb) | the sawtooth, the ratchet and the collapse: the loss scalers of torch, DeepSpeed, Megatron, NeMo, Keras and JAX (and four legacy ones) side by side on the same gradient streams, with a live lab |
# | [07 · Live training: fp16, a scaler, bf16 and pure half weights](07_live_training.ipynb) | one seeded model trained in fp32, fp16 with and without a scaler, bf16 and pure fp16: where gradients vanish, why weights freeze, the measured speed, a live trainer and a gradient check-up for your own model |
# | [08 · Lightning manual optimization: `loss.backward()` vs `self.manual_backward(loss)`](08_lightning_manual_backward.ipynb) | the wrong backward call under fp16 AMP: the `_scale is None` error, its silent variant, and why `precision="16-mixed"` on a CPU hides it (it silently becomes `bf16-mixed`, with no scaler); several optimizers, where one overflow makes the next optimizer apply 2× its gradient; where clipping goes |
# | [09 · Lightning pitfall: a `no_grad` pass inside autocast, then a pass with grad](09_lightning_autocast_cache.ipynb) | cached casts without gradients on older versions and what fixed them; the cached weight copy that still goes stale after an in-place update inside one autocast block, in PyTorch and Fabric, and its fixes |
# | [10 · Lightning pitfall: a TransformerEncoder that trains in bf16 and crashes in validation](10_lightning_transformer_eval.ipynb) | `nn.TransformerEncoder` under `bf16-mixed`: the exact conditions of the crash (the fast path with a padding mask), the old and new messages, and fixes checked against fp32 |
# | [11a · Loss scaling across ranks: when the scalers agree](11a_loss_scaling_across_ranks.ipynb) | real `torch.distributed` ranks (gloo, forked from a cell) with a `GradScaler` each: one rank's overflow under DDP, three ways to make ranks disagree (a scaler per rank on local gradients, `unscale_` before a manual all-reduce, FSDP1 with a plain scaler) and their fixes (`ShardedGradScaler`, FSDP2, Megatron, DeepSpeed), each real run held to a simulator |
# | [11b · Ranks in practice: all-reduce precision, compress hooks and Lightning](11b_allreduce_numerics.ipynb) | fp32, fp16 and bf16 all-reduce error as the world grows, gloo's summation order, the fp16 compress hook's extra skips under a scaler, and Lightning's `"16-mixed"` on CPU ranks |
# | [12 · FP8 per-tensor scaling](12_fp8_scaling.ipynb) | a stream of 2,000 tensors with spikes cast to FP8, value by value: why each tensor needs its own scale, current scaling (the tensor's own amax) against delayed scaling (a history of earlier amaxes, `"max"` or `"most_recent"`), on synthetic, Gaussian and real-layer streams, what a spike, an inf amax and a margin do to the shares saturated and underflowed, and why HYBRID casts gradients to E5M2; `Fp8ScalingLab` to move every setting |
# | [13 · MX and NVFP4 block scaling](13_mx_and_nvfp4.ipynb) | one scale per block of 16 or 32 values, exact against torchao's rules: what a 2^10 outlier costs its block and a per-tensor scale, the fp8, fp6 and fp4 element formats under E8M0 scales, floor against round-up scales, NVFP4's E4M3 block scales and fp32 tensor scale, stochastic rounding and the random Hadamard transform, and the error of every format on a real layer's weights and gradient at equal bits; `BlockExplorer` to pick a block and see its values before and after |
# | [14 · FP8 training for real: torchao's Float8Linear, and what it buys](14_fp8_training.ipynb) | the course's models trained with torchao's `Float8Linear` on the CPU, every FP8 cast recorded and equal to the package's; tensorwise against rowwise, fp32 and bf16; why FP8 with current scaling needs no loss scaler, which layers stay in high precision, the dtype gradients accumulate in; Transformer Engine's recipes on one tensor; and what each precision buys in step time and memory on a real GPU |
#
# Work through 01 and 02 in order: 02 uses the vocabulary of 01 (subnormal, underflow, overflow).
# Some exercises sit in the middle of a lesson: a cell marked **Predict** asks for your answer
# before the next cell shows it (answer first, then run on). The rest are at its end: **Check
# yourself** (questions a cell checks for you; in 03b, a stochastic rounding you write; in 04 and 05, a
# training step you write), then the summary and **open exercises** to explore on your own.
# Six explorers (formats, ranges, the scaling lab, FP8 scaling, block scaling, the live trainer) also
# share one page: the explorer app (`explorer.ipynb`; `make explorer` serves it as a page with Voila).

# %% [markdown]
# ## Using the notebooks in JupyterLab
#
# - **Run a cell** with Shift+Enter; run a whole notebook with *Run → Run All Cells*. Each lesson
#   starts with one setup cell: run it first, and use *Kernel → Restart Kernel and Run All Cells*
#   whenever the state gets confusing.
# - **Explorers** (sliders, text boxes, bit buttons) redraw their figure on every change. Move a
#   slider, type a number and press Enter, or click a bit; the numbers under the controls update too.
# - **Figures** are interactive: hover for exact values, drag to zoom, double-click to reset.
# - **"Error displaying widget"** or a bare text such as `FormatExplorer(...)` instead of controls
#   means the widget's live state is missing (the saved notebook keeps none). Re-run the cell.
#   If JupyterLab says the notebook is *not trusted*, trust it (command palette: *Trust Notebook*)
#   and re-run.

# %% [markdown]
# ## Your environment, measured
#
# `env.check()` lists the versions the course depends on, then *measures* what this machine
# does with fp16 and bf16: whether a matrix multiply runs, how fast it is compared with fp32 (a
# small, rough timing), and whether `torch.autocast` produces fp16/bf16 on this device.

# %%
env.check()

# %% [markdown]
# Read the ratios with care: they come from one small matrix on this machine right now. On many
# CPUs an fp16 matmul is much *slower* than fp32 (no fp16 arithmetic units), while bf16 may be
# faster; on a recent GPU both are usually several times faster. The course never assumes a
# speed-up: where it matters, a notebook measures. This is why anyone trains in low precision,
# measured once on a real GPU (lesson 14 reads the whole record, compiled runs and FP8 included):
# one transformer block of 201 million weights, each training step's median time and the peak memory.

# %%
# NBVAL_CHECK_OUTPUT
print(record_table(load_record()))

# %% [markdown]
# ## A first look
#
# Even an everyday number changes when it is stored in 16 bits. The table shows what a cast to
# fp16 keeps of 0.1, 1/3 and 1000.1:

# %%
# NBVAL_CHECK_OUTPUT
cast_table([0.1, 1 / 3, 1000.1], "fp16", labels=["0.1", "1/3", "1000.1"])

# %% [markdown]
# fp16 keeps 11 significant bits, about 3 decimal digits: 1000.1 becomes 1000, and 0.1 is off
# in the fourth digit. Notebook 01 shows where those bits go.

# %% [markdown]
# ## Try it
#
# Practise with an explorer: type a number into the box (try `65519`, then `65520`), or click a
# bit of the pattern, and watch where the value lands. Switch the format to bf16.

# %%
FormatExplorer("fp16", value=0.1)

# %% [markdown]
# The same idea for every format at once, as a static figure: the range each one covers, from
# its smallest subnormal to its largest value, on one log2 axis.

# %%
plot_format_ranges()

# %% [markdown]
# ## Check yourself
#
# Every lesson ends with questions like this one. Set `answer` and run the cell: it answers with
# one line, ✓ or ✗ with a hint (or "not answered yet"), and never shows the expected value.
# Some questions ask why: answer with the letter of the reason you pick (`answer = "a"`); a wrong
# one tells you what is wrong with that reason.

# %%
# Type 65519 into the explorer above: what does fp16 store for it? (a number)
answer = None
check_cast(answer, 65519, "fp16")

# %%
# In "Why this course", fp16 without a scaler stalls, while bf16, also 16 bits and also without a
# scaler, learns. Why? (a letter)
#   a) fp16 keeps too few significant bits for this model's weights, so they are rounded too
#      coarsely to learn
#   b) most of this model's gradients are so small that fp16 rounds them to 0 (its smallest positive
#      number is 2^-24); bf16 has fp32's range and keeps them
#   c) the fp16 loss overflows to inf, and a loss of inf stops the run
#   d) fp16 is slower than fp32 on a CPU, so in the same time it trains fewer steps
answer = None
check_why_fp16_stalls(answer)

# %%
# The cast table stores 1000.1 as 1000 in fp16. Why? (a letter)
#   a) fp16 keeps about 3 decimal digits, so it rounds to its leading decimal digits
#   b) fp16 drops the fractional part of a number, as an integer type does
#   c) 1000.1 needs more precision than a normal number has, so fp16 stores it as a subnormal
#   d) fp16 keeps 11 significant bits: from 512 to 1024 that leaves one bit after the binary point,
#      so its numbers there are 0.5 apart, and 1000 is the nearest to 1000.1
answer = None
check_why_1000_1_rounds_to_1000(answer)

# %% [markdown]
# ## Summary
#
# - Every lesson, 01 to 14 (03 and 11 in two parts each, a and b), has the same layout: a setup
#   cell, short steps, a *Try it* section (an explorer, or a cell to change and re-run), and at the
#   end *Check yourself*, a summary and open exercises.
# - Explorers redraw on every change; if one shows an error instead of controls, re-run its cell.
# - What fp16 and bf16 cost or save on your hardware is measured, not assumed.
#
# **Next:** open [01 · The fp16 range: bits, subnormals, rounding](01_fp16_range.ipynb).
#
# **Open exercises**
# 1. Run `env.check()` again. Which of its numbers change from run to run, and why?
# 2. In the explorer, find the smallest positive number fp16 can store by clicking bits.
