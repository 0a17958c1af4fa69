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
# # 14 · FP8 training for real: torchao's Float8Linear, and what it buys
#
# Lessons 12 and 13 computed FP8 and block scaling cast by cast. Here a model trains with them:
# torchao's `convert_to_float8_training` turns each `nn.Linear` into a `Float8Linear`, whose forward
# and backward passes cast their inputs, weights and gradients to FP8 with current scaling (lesson
# 12: each tensor's scale from its own amax) and multiply them with `torch._scaled_mm`. All
# of it runs on this CPU. The lesson records every cast and checks it against the package's, trains
# the course's models with both of torchao's recipes, and answers three questions people ask: does
# FP8 need a loss scaler, which layers stay in high precision, and which dtype the gradients should
# accumulate in. It ends with Transformer Engine's recipes on one tensor, and with what all this buys
# on a real GPU. After [13 · MX and NVFP4 block scaling](13_mx_and_nvfp4.ipynb).
#
# You will be able to:
# - convert a model to FP8 training with torchao, and say which tensors each layer casts, to which
#   format, with which scale,
# - compare the loss of fp32, bf16 autocast and FP8 training (tensorwise and rowwise) on one run,
# - say why FP8 training with current scaling needs no loss scaler, and which layers to keep in
#   high precision,
# - tell what a recipe stores (one scale, a scale per row or per block) and what that changes,
# - read a GPU record of step time and memory per precision, and say what made each faster.
#
# Teaching this lesson? The [teacher's guide](../TEACHING.md#nb14) has its timings, the answers to
# its exercises and what to demo live.
# Its words in English and Chinese (中文), each with a one-line definition: the [glossary](../GLOSSARY.md).

# %%
import numpy as np
import torch

from ampviz.plots import plot_loss_curves
from ampviz.training.fp8_lesson import (check_why_fp8_filter, check_why_fp8_finer_blocks, check_why_fp8_no_scaler,
                                        loss_table, outlier_activations, recipe_table)
from ampviz.training.fp8_questions import accumulation_runs, filter_runs, scaler_effect
from ampviz.training.fp8_training import record_fp8_casts, reference_cast, train_fp8
from ampviz.training.gpu_record import load_record, record_table
from ampviz.training.live import build_task

_ = torch.manual_seed(0)
torch.set_num_threads(1)

# %% [markdown]
# ## 1. What a Float8Linear casts
#
# The beam model (lesson 07's) has six `nn.Linear` layers. `record_fp8_casts` converts a copy with
# torchao's recipe, runs one forward and backward pass on the first training batch, and records each
# cast torchao makes: per layer, its input and weight for the forward product, then the gradient of
# its output (`grad_output`) and its weight again for the gradient of its input, and `grad_output`
# and the input again for the gradient of its weight. Six casts per layer, each with the scale
# current scaling chose from that tensor's own amax, `448 / amax` for E4M3:

# %%
task = build_task("beam", 0)
batch = task.batch()  # the first training batch
casts = {recipe: record_fp8_casts(task.model, batch, recipe) for recipe in ("tensorwise", "rowwise")}
print(casts["tensorwise"].table())

# %% [markdown]
# Each cast, recomputed by the package from the same tensor (lesson 12's `current_quantize`), gives
# the same scale and the same FP8 codes, bit for bit. Tensorwise casts gradients to E5M2 and the rest
# to E4M3; rowwise casts everything to E4M3 with a scale per row, rounded down to a power of two.
# Current scaling maps the amax to the format's largest number, so nothing saturates:

# %%
# NBVAL_CHECK_OUTPUT
for recipe, rec in casts.items():
    same = all(np.array_equal(c.codes, reference_cast(c).codes) and np.array_equal(c.scale, reference_cast(c).scale)
               for c in rec.casts)
    formats = sorted({f"{c.role}: {c.fmt.name}" for c in rec.casts})
    print(f"{recipe}: {len(rec.casts)} casts ({len(rec.layers)} layers x 6), equal to the package's: {same}, "
          f"saturated: {rec.total().saturated}")
    print("   ", ", ".join(formats))

# %% [markdown]
# On a GPU the same casts feed cuBLAS's FP8 matrix multiply instead of the CPU's; the test suite
# checks on CUDA that the casts are the same there, bit for bit.
#
# ## 2. Training with it
#
# `train_fp8(mode, steps)` is the course's training loop (lesson 07's) in fp32, in bf16 autocast, or
# with the model converted to FP8 by torchao's tensorwise or rowwise recipe. The beam model, 200
# seeded steps each:

# %%
beam = {mode: train_fp8(mode, 200) for mode in ("fp32", "bf16-autocast", "tensorwise", "rowwise")}
plot_loss_curves({m: r.losses for m, r in beam.items()}, title="beam model: loss per step")

# %%
loss_table(beam.values())

# %% [markdown]
# And the live trainer's small transformer (two encoder layers), 100 steps. There
# `nn.MultiheadAttention` reads its projection weights directly, so attention stays in float32 and
# only the feed-forward layers and the head cast to FP8:

# %%
small = {mode: train_fp8(mode, 100, model="transformer") for mode in ("fp32", "bf16-autocast", "tensorwise", "rowwise")}
loss_table(small.values())

# %% [markdown]
# The exact losses depend on this CPU's sums; what holds everywhere, checked:

# %%
# NBVAL_CHECK_OUTPUT
for name, runs in (("beam", beam), ("transformer", small)):
    fp32 = runs["fp32"].end
    for mode, run in runs.items():
        print(f"{name:<11} {mode:<13} learned (last 10 under half the first): {run.end < run.start / 2}, "
              f"within 1.5x of fp32's: {fp32 / 1.5 < run.end < fp32 * 1.5}")

# %% [markdown]
# Over 200 steps FP8 learns about as well as fp32 on these small models: each recipe ends close to
# the fp32 run, not on top of it. Whether that lasts is open exercise 1.
#
# ## 3. Does FP8 need a loss scaler?
#
# fp16 needs one because its range is fixed: gradients below 2^-24 become 0 (lessons 01 and 02).
# An FP8 cast under current scaling is not fixed: each `grad_output` gets its own scale from its own
# amax. `scaler_effect` trains the beam model 20 steps with the loss multiplied by S and the gradients
# multiplied back by 1/S, as a scaler does, and fingerprints every gradient cast. Beside it, the first
# batch's gradients under fp16 autocast at the same S:

# %%
# NBVAL_CHECK_OUTPUT
effect = scaler_effect()
for s in (2.0**16, 2.0**-20):
    run = effect.run(s)
    print(f"S = 2^{int(np.log2(s))}: FP8 codes and final weights as at S = 1, bit for bit: {effect.same(1.0, s)}; "
          f"some gradient amax below torchao's 1e-12 floor: {run.floored.sum() > 0}")
for u in effect.fp16:
    print(f"fp16 autocast, S = 2^{int(np.log2(u.scale))}: {u.underflowed / u.values:.0%} of the layer-output "
          "gradients are 0")

# %% [markdown]
# A power of two S multiplies the tensor and divides its scale by the same power of two, exactly: the
# same codes come out. So an FP8 recipe with current scaling needs no loss scaler, *unless* a gradient
# tensor's amax falls below torchao's floor of 1e-12 (the `EPS` its scale is clamped at): at
# S = 2^-20 some do, their scale stops growing, and their codes change. Multiplying the loss by 2^-20
# is the same as measuring it in units 2^20 times larger (the beam's loss is in m²): a loss in
# such units reaches the floor without any scaler. fp16 at S = 1 loses nearly every gradient here;
# a scaler is what saves it.
#
# ## 4. Which layers to keep in high precision
#
# torchao's documentation filters the layers it converts: not the last one, and not a layer whose
# `in_features` or `out_features` is not a multiple of 16, because cuBLAS's FP8 matrix multiply
# refuses such shapes on a GPU (the CPU accepts them). `filter_runs` trains the beam model with
# each filter:

# %%
# NBVAL_CHECK_OUTPUT
filters = filter_runs(steps=200)
for run in filters.runs:
    close = filters.fp32_end / 1.5 < run.end < filters.fp32_end * 1.5
    print(f"{run.filter:<8} keeps {', '.join(run.kept) or 'none':<11} converts {len(run.converted)}; "
          f"within 1.5x of fp32's loss: {close}")
print("layers torchao's automatic filter would convert:", filters.auto_converted or "none")

# %% [markdown]
# The filters cost this model nothing measurable; their reasons are the GPU's shapes and the output's
# precision. torchao's automatic filter (`_auto_filter_for_recipe`) also leaves out layers too small
# to gain: from its H100 benchmarks, tensorwise converts a layer only if it has more than 4,096
# inputs or 1,024 outputs. None of this course's layers is that large. The FP8 products are faster
# only for large matrices; section 7 shows one.
#
# ## 5. The dtype gradients accumulate in
#
# Gradient accumulation sums the gradients of several micro-batches into `.grad` before one optimizer
# step. With bf16 parameters `.grad` is bf16 too, and every addition rounds the running sum to 8
# significant bits. `accumulation_runs` sums 1, 8 and 32 micro-batches of the beam model into float32
# and into bf16 buffers and compares each with the float64 sum of the same gradients; the floor is
# that sum rounded once to the buffer's dtype:

# %%
# NBVAL_CHECK_OUTPUT
for run in accumulation_runs((1, 8, 32), "fp32"):
    print(f"fp32 .grad, {run.micro_batches:>2} micro-batches: error below 1e-7: {run.relative_error < 1e-7}")
for run in accumulation_runs((1, 8, 32), "bf16"):
    print(f"bf16 .grad, {run.micro_batches:>2} micro-batches: error {run.relative_error:.0e}, "
          f"{run.relative_error / run.floor:.0f}x the floor")

# %% [markdown]
# In float32 the error stays near float32's own rounding, below 1e-7. In bf16 it grows with every
# micro-batch: after 32, over 3 times the error of one rounding. That is why FP8 and bf16 recipes keep float32 *main
# gradients* (Megatron's and Transformer Engine's `main_grad`, FSDP2's `reduce_dtype=torch.float32`).
#
# ## 6. Transformer Engine's recipes, on one tensor
#
# Transformer Engine (TE) needs CUDA, so this CPU cannot run it. The package models each of its
# recipes from TE's source (release v2.18), and the tests check each model against the source's
# formulas written again. Below, torchao's two recipes (run, as section 1 showed) and TE's five
# (modelled) cast one tensor shaped like a transformer's activations: N(0, 1) values with four outlier
# channels 200 times larger, as large language models have:

# %%
# NBVAL_CHECK_OUTPUT
x, outlier_columns = outlier_activations()
recipe_table(x, outlier_columns)

# %% [markdown]
# The FP8 rows lose almost nothing either way: E4M3 keeps every value to about 2.7% wherever the
# scale puts it, and only the smallest values fall below its smallest subnormal. How many depends on
# how many values share a scale with an outlier: one scale per tensor flushes 175, a scale per 32
# values (MXFP8) 6. At 4 bits it is another story: NVFP4's blocks of 16 keep the outlier-free
# values to 9.5% without the outliers (run `recipe_table(*outlier_activations(factor=1))`), 33% with
# them, because its block scales are themselves E4M3 and the tensor scale is set by the outliers.
#
# ## 7. What it buys, measured on a GPU
#
# Everything above ran on a CPU, where low precision saves nothing. The point of it all is speed and
# memory on a GPU. `bench/bench_gpu.py --part block` trained one transformer block (d_model 4,096,
# 32 heads, a feed-forward of 16,384: 201 million weights; 4 sequences of 2,048 tokens a step) with
# AdamW in each precision on an NVIDIA GPU and kept the record this cell reads. Eager first, then
# through `torch.compile`:

# %%
# NBVAL_CHECK_OUTPUT
record = load_record()
print(record_table(record))
print()
print(record_table(record, compiled=True))
print()
print("made by:", record["command"])

# %% [markdown]
# What made each faster: TF32 runs float32 matmuls on the tensor cores (lesson 03b §5); bf16 and fp16
# halve the bytes and use the tensor cores' 16-bit rate. Eager FP8 is *slower* than bf16: every cast
# (an amax, a multiply, a clamp) runs as kernels of its own, six per layer per step. Compiled, the casts
# fuse into the neighbouring kernels and tensorwise FP8 is the fastest and the smallest. Peak memory
# falls less than the bytes per value suggest: every run keeps float32 weights, gradients and AdamW's
# two states, 3 GiB of each peak, and only the activations shrink. One block, one run of each mode
# (a second run agreed within 3%), on one GPU.

# %% [markdown]
# ## Try it
#
# Train the beam model with your own filter: `filter_runs(steps=200, filters=("ends", "dims16"))`,
# or another recipe (`recipe="rowwise"`). Record a rowwise run's casts and compare a layer's scales
# with tensorwise's (`casts["rowwise"].select(layer="head")`): why are they all powers of two?

# %%
# your code here

# %% [markdown]
# ## Check yourself

# %%
# Section 3: a loss scale of 2^16 leaves every FP8 gradient code and the final weights unchanged, bit
# for bit, while in fp16 the same scale keeps most gradients from underflowing. Why? (a letter)
#   a) FP8 E5M2 reaches smaller numbers than fp16, so no gradient underflows in the first place
#   b) each grad_output cast takes its scale from that tensor's own amax: a tensor 2^16 times larger gets
#      a scale 2^16 times smaller, exactly, so it lands on the same FP8 codes
#   c) torchao's Float8Linear runs a GradScaler of its own inside its backward pass
#   d) the gradients never reach FP8: they stay in bf16 or float32 all the way
answer = None
check_why_fp8_no_scaler(answer)

# %%
# Section 4: torchao's recommended filter keeps the beam model's embed (5 inputs) and head layers as
# nn.Linear. Why? (a letter)
#   a) the first and last layers have the largest values, which would saturate E4M3
#   b) FP8 matrix multiplies on NVIDIA GPUs need both dimensions to be multiples of 16, which embed's 5
#      inputs are not, and the filter keeps the last layer, whose output is the model's, in high precision
#   c) torchao cannot convert a layer with a bias
#   d) converting them makes the loss diverge
answer = None
check_why_fp8_filter(answer)

# %%
# Section 6: the finer the blocks, the fewer values underflow (tensorwise, 1x128, MXFP8's 32). Why?
# (a letter)
#   a) smaller blocks use a wider FP8 format
#   b) a block's scale is set by the largest value in that block: with finer blocks, fewer ordinary values
#      share a block with an outlier channel, so fewer are pushed below FP8's smallest subnormal
#   c) finer blocks round the scale to a power of two, which adds no rounding error
#   d) Transformer Engine's recipes clamp small values instead of flushing them
answer = None
check_why_fp8_finer_blocks(answer)

# %% [markdown]
# ## Summary
#
# - torchao's `convert_to_float8_training` swaps each `nn.Linear` for a `Float8Linear`: six FP8 casts
#   per layer per step, each with a current scale from its own amax, so nothing saturates. Each cast
#   equals the package's, bit for bit, on this CPU and (in the tests) on CUDA.
# - Over 200 steps on the course's models, both recipes learn about as well as fp32 and bf16 autocast.
# - FP8 with current scaling needs no loss scaler: a power-of-two loss scale changes no FP8 code, unless
#   an amax falls below torchao's 1e-12 floor. fp16 needs one.
# - Keep out of FP8 the layers whose shapes the GPU's FP8 product refuses (dimensions not multiples of
#   16), the last layer, and layers too small to gain. Accumulate gradients in float32.
# - Finer scales (per row, per 128 values, per 32) flush fewer small values next to outliers; at 4
#   bits, outliers cost NVFP4 far more than they cost FP8.
# - On an NVIDIA H200, one 201M-weight block trained 4 times faster in TF32 than in fp32, about 10
#   times faster in bf16 or fp16 with a scaler, and fastest, compiled, in tensorwise FP8.
#
# **Next:** the course map in [00 · Start here](00_start_here.ipynb#the-course-map): this is its last
# lesson.
#
# **Open exercises**
# 1. Train the beam model in `"tensorwise"` for 1,000 steps (`train_fp8("tensorwise", 1000)`). Does
#    the gap to fp32 grow or close? Try two other seeds before you answer.
# 2. Find the smallest loss scale S (a power of two) at which `scaler_effect(scales=(1.0, S))` reports
#    floored amaxes. How far below 1e-12 were the gradients at S = 1?
# 3. Run `recipe_table` on `outlier_activations(factor=f)` for f = 10, 1,000 and 100,000. At which f do
#    the FP8 rows start to lose values to saturation or to the RMS error?

# %% [markdown]
# The lesson's claims, checked against the runs above (the casts are held to torchao in
# `tests/training/test_fp8_training.py`, the questions' runs in `tests/training/test_fp8_questions.py`,
# Transformer Engine's models in `tests/formats/test_te_recipes.py`, the record in
# `tests/training/test_gpu_record.py`):

# %%
assert all(len(rec.casts) == 36 and len(rec.layers) == 6 for rec in casts.values())
assert all(rec.total().saturated == 0 for rec in casts.values())
assert {c.fmt.name for c in casts["rowwise"].casts} == {"fp8_e4m3"}
assert {c.fmt.name for c in casts["tensorwise"].casts if c.role == "grad_output"} == {"fp8_e5m2"}
assert all(float(np.log2(s)).is_integer() for c in casts["rowwise"].casts for s in np.ravel(c.scale))
for runs in (beam, small):
    assert all(r.error is None and r.end < r.start / 2 for r in runs.values())
    assert all(runs["fp32"].end / 1.5 < r.end < runs["fp32"].end * 1.5 for r in runs.values())
assert effect.same(1.0, 2.0**16) and not effect.same(1.0, 2.0**-20)
assert effect.run(2.0**16).floored.sum() == 0 < effect.run(2.0**-20).floored.sum()
fp16 = {u.scale: u.underflowed / u.values for u in effect.fp16}
assert fp16[1.0] > 0.95 and fp16[2.0**16] < 0.01
assert {r.filter: r.kept for r in filters.runs} == {"all": (), "ends": ("embed", "head"), "dims16": ("embed",),
                                                    "torchao": ("embed", "head")}
assert filters.auto_converted == ()
assert all(filters.fp32_end / 1.5 < r.end < filters.fp32_end * 1.5 for r in filters.runs)
acc = {(d, r.micro_batches): r for d in ("fp32", "bf16") for r in accumulation_runs((1, 8, 32), d)}
assert all(acc["fp32", n].relative_error < 1e-7 for n in (1, 8, 32))
assert acc["bf16", 1].relative_error == acc["bf16", 1].floor
assert acc["bf16", 1].relative_error < acc["bf16", 8].relative_error < acc["bf16", 32].relative_error
assert 3 < acc["bf16", 32].relative_error / acc["bf16", 32].floor < 5
table = recipe_table(x, outlier_columns)
assert table.column("underflowed") == ("175", "89", "175", "41", "162", "6", "21,934")
assert set(table.column("RMS error")[:6]) == {"2.7%"} and table.column("RMS error, other values")[6] == "33%"
assert recipe_table(*outlier_activations(factor=1)).column("RMS error, other values")[6] == "9.5%"
eager = {r["mode"]: r for r in record["results"] if not r["compiled"]}
compiled = {r["mode"]: r for r in record["results"] if r["compiled"]}
assert 3.5 < eager["fp32"]["step_ms"] / eager["tf32"]["step_ms"] < 4.5
assert all(eager["fp32"]["step_ms"] / eager[m]["step_ms"] > 8 for m in ("bf16", "fp16+scaler"))
assert all(eager[m]["step_ms"] > eager["bf16"]["step_ms"] for m in ("fp8-tensorwise", "fp8-rowwise"))
assert min(compiled, key=lambda m: compiled[m]["step_ms"]) == "fp8-tensorwise"
assert min(compiled, key=lambda m: compiled[m]["peak_mib"]) == "fp8-tensorwise"
assert record["environment"]["device"] == "NVIDIA H200" and record["params"] == 201_379_840
assert round(record["params"] * 4 * 4 / 2**30, 1) == 3.0  # weights, gradients, two AdamW states
print("all claims hold")
