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
# # 13 · MX and NVFP4 block scaling
#
# One [scale per block](../GLOSSARY.md#block-scaling) of 16 or 32 values instead of one per tensor: how OCP [MX](../GLOSSARY.md#mx) (MXFP8, MXFP6, MXFP4)
# and NVIDIA's [NVFP4](../GLOSSARY.md#nvfp4) store numbers in 4 to 8 bits, bit for bit, and what that costs on a real layer.
#
# You will be able to:
# - explain why a per-block scale survives an outlier that a per-tensor scale does not, and count the
#   bits a block format really spends per element, its scales included,
# - choose an [E8M0](../GLOSSARY.md#e8m0) scale by rounding up (rceil, the default of torchao's MX configs) or by the OCP
#   floor rule, and say what each costs (lost small values, or saturation),
# - say why NVFP4 needs its float32 tensor scale, what stochastic rounding and the random [Hadamard](../GLOSSARY.md#hadamard)
#   transform buy, and compare every format's error on a real layer's weights and gradients.
#
# Teaching this lesson? The [teacher's guide](../TEACHING.md#nb13) has its timings, the answers to
# its exercises and what to demo live.
# Its words in English and Chinese (中文), each with a one-line definition: the [glossary](../GLOSSARY.md).

# %%
import numpy as np
import torch

from ampviz.formats.blocks import mx_quantize, nvfp4_quantize, random_hadamard_transform, stochastic_round
from ampviz.formats import ALL_FORMATS
from ampviz.formats.errors import (check_mx_floor_value, check_nvfp4_bits, check_outlier_survivors,
                                   check_single_level_value, check_why_mx_block_survives_outlier,
                                   check_why_mx_floor_saturates, check_why_mx_nvfp4_tensor_scale, format_error,
                                   format_error_table, relative_error, scheme_bits)
from ampviz.formats.lesson import format_table
from ampviz.plots import plot_blocks
from ampviz.training.live import trained_parameter
from ampviz.widgets import BlockExplorer

rng = np.random.default_rng(0)
_ = torch.manual_seed(0)
torch.set_num_threads(1)

# %% [markdown]
# ## 1. One scale per block
#
# Lesson 12 scaled a whole tensor by one number. A block format gives every 32 consecutive values
# along the last axis (MX) their own scale, a power of two 2^k. Take 128 values from N(0, 1) and make
# one of them, in block 1 (elements 32 to 63), an outlier of 2^10. Quantize the row to MXFP4 (E2M1
# elements: 0, 0.5, 1, 1.5, 2, 3, 4, 6) with a scale per 32 values, then with one scale for all 128
# (the scales rounded up, "rceil", as torchao's MX configs choose them by default; section 3):

# %%
# NBVAL_CHECK_OUTPUT
x = rng.standard_normal(128).astype(np.float32)
x[37] = 2.0**10
for block_size in (32, 128):
    q = mx_quantize(x, "fp4_e2m1", block_size, "rceil")
    flushed = ((q.values == 0) & (x != 0)).reshape(4, 32).sum(axis=1)
    print(f"block_size {block_size:3}: scale exponents {q.scales.astype(int) - 127}, "
          f"values flushed to 0 in each block of 32: {flushed}")

# %% [markdown]
# Notice: with a scale per 32 values, block 1's scale is 2^8, the least power of two that brings the
# outlier under E2M1's largest value, 6 (2^10 / 2^8 = 4). Its smallest nonzero value is then
# 0.5 × 2^8 = 128: the other 31 values of that
# block (all below 3 in size) become 0. The three other blocks keep the scale 2^-1 and lose only
# their 2 or 3 smallest values. With one scale for the whole row, every block pays: all 127
# ordinary values are flushed.

# %% [markdown]
# ## 2. The element formats and the E8M0 scale
#
# MX stores each scale as E8M0: 8 exponent bits, no sign, no mantissa, so a power of two from 2^-127
# to 2^127 (pattern 255 is NaN). The elements are fp8 (E4M3, E5M2), fp6 (E3M2, E2M3) or fp4 (E2M1).
# The fp6 and fp4 formats have no inf and no NaN:

# %%
# NBVAL_CHECK_OUTPUT
element_formats = ("fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1", "e8m0")
print(format_table(element_formats))
for name in element_formats[:-1]:
    fmt = ALL_FORMATS[name]
    levels = np.unique(np.abs(fmt.decode(np.arange(2**fmt.bits))))
    print(f"{name}: {np.isfinite(levels).sum()} magnitudes from 0 to {fmt.max:g}, largest power of two 2^{fmt.emax}")

# %% [markdown]
# Notice: fp4 has 8 magnitudes, fp6 32, E4M3 127. E2M3 and E4M3 share 3 mantissa bits (the same
# relative step, 2^-3); E2M3 gives up range, which the block scale supplies. The scale's exponent k
# is chosen so that the block's largest value lands near the element format's top, 2^emax.

# %% [markdown]
# ## 3. Choosing the scale: rceil, and the floor trap
#
# The scale's exponent k decides where the block's largest value lands. torchao's MXFP8 training
# config (`MXFP8TrainingOpConfig`) and its MX inference config (`MXDynamicActivationMXWeightConfig`)
# both default to **rceil**, NVIDIA's rule: k = ceil(log2(amax / max)), the least power of two at
# which amax fits under max. It never clamps; the larger scale coarsens the bottom of the block
# instead. The OCP MX v1.0 spec suggests **floor**: k = floor(log2 amax) − emax, which puts the
# block's largest power of two on 2^emax. But amax itself can be up to twice that power: for E4M3
# (emax 8, max 448 = 1.75 × 2^8), a block with amax 500 gets the scale 2^0, and 500 is clamped to 448.
# torchao's lower-level `to_mx` and `MXTensor.to_mx` still default to floor, and so does `mx_quantize`.
# torchao offers two more rules: "ceil" (the exponent of amax rounded up) and "even" (amax rounded to
# the element's mantissa bits first):

# %%
# NBVAL_CHECK_OUTPUT
row = np.zeros(32, np.float32)
row[:3] = [500.0, -3.0, 0.0015]
for rounding in ("rceil", "floor", "ceil", "even"):
    q = mx_quantize(row, "fp8_e4m3", rounding=rounding)
    print(f"{rounding:5}: scale 2^{int(q.scales[0]) - 127:<2}  500 -> {q.values[0]:g}  "
          f"-3 -> {q.values[1]:g}  0.0015 -> {q.values[2]:g}")

# %% [markdown]
# Notice: rceil picks the scale 2^1, keeps 500 (as 512) and flushes 0.0015. floor keeps 0.0015 (as
# 2^-9 = 0.00195, E4M3's smallest subnormal at scale 1) but cuts 500 to 448: that is the trap. A
# clamped largest value is a large error, a flushed tiny one a small error: Mishra et al. (arXiv
# 2506.08027) report that the floor rule can make MXFP8 pre-training diverge and that rounding the
# scale up fixes it. ceil and even pick rceil's scale here. Section 8 measures what floor costs a
# real layer.

# %% [markdown]
# ## 4. Where torchao departs from the rule
#
# torchao 0.18 computes rceil in `_to_mx_rceil` (`torchao/prototype/mx_formats/mx_tensor.py`), in
# one of two ways. Under `torch.compile`, on an NVIDIA GPU of SM100 or later (Blackwell) and with
# torch 2.12 or later, it converts the float32 quotient amax / max to E8M0 with the PTX instruction
# `cvt.rp.satfinite.ue8m0x2.f32`, which rounds it up to a power of two exactly, as the rule does.
# Everywhere else (eager mode, the CPU, older GPUs, older torch) it falls back to
# `torch.ceil(torch.log2(amax / max))` in float32. For amax / max
# just above a power of two, float32's log2 rounds to the integer, the ceiling finds nothing to
# round up, and the scale comes out one step too small. Here amax is the float32 right after 3.5,
# so amax / 448 is just above 2^-7. `mx_quantize` follows the exact rule; the fallback's
# arithmetic, replayed in numpy float32:

# %%
# NBVAL_CHECK_OUTPUT
amax = np.nextafter(np.float32(3.5), np.float32(4))
row = np.zeros(32, np.float32)
row[0] = amax
exact = mx_quantize(row, "fp8_e4m3", rounding="rceil")
torchao_k = np.ceil(np.log2(amax / np.float32(448)))
print(f"amax = {amax:.9g}, amax / 448 = {amax / np.float32(448):.9g}")
print(f"the rule: scale 2^{int(exact.scales[0]) - 127}, amax -> {exact.values[0]:.9g}")
print(f"float32 log2 gives {np.log2(amax / np.float32(448))}, so torchao's fallback picks 2^{int(torchao_k)}")
print(f"at that scale, as the floor rule also picks: amax -> {mx_quantize(row, 'fp8_e4m3').values[0]:.9g}")

# %% [markdown]
# Notice: the rule gives 2^-6; float32's log2 returns exactly −7, so torchao's fallback stores 2^-7,
# the floor rule's scale, and amax / 2^-7 lies just past 448, where it is clamped. Here the clamp
# costs nothing (3.5 + 2^-22 rounds to 3.5 at either scale), but the scale pattern differs from the
# rule's, and a bit-exact comparison with torchao in eager mode has to expect it.
# `ampviz.formats.blocks` follows torchao's eager path bit for bit everywhere else and names three
# such departures (tests/formats/test_blocks.py shows each against torchao itself).

# %% [markdown]
# ## 5. NVFP4: blocks of 16, E4M3 scales, and a float32 scale for the tensor
#
# NVFP4 keeps E2M1 elements but takes blocks of 16 and an E4M3 block scale (not a power of two: 3
# mantissa bits). E4M3 reaches only from 2^-9 to 448, so NVFP4 adds one float32 scale per tensor,
# amax / (448 × 6), that moves the block scales into E4M3's range. Without it (`per_tensor_scale=False`)
# each block scale is amax_block / 6 clamped to [2^-6, 448]. The same 256 values at three sizes:

# %%
# NBVAL_CHECK_OUTPUT
base = np.random.default_rng(1).standard_normal((16, 16)).astype(np.float32)
for size in (2.0**-24, 1.0, 2.0**24):
    y = base * np.float32(size)
    for two_level in (True, False):
        q = nvfp4_quantize(y, per_tensor_scale=two_level)
        scales = ALL_FORMATS["fp8_e4m3"].decode(q.scales.astype(np.int64))
        print(f"size 2^{int(np.log2(size)):<3} tensor scale {'on ' if two_level else 'off'}: block scales "
              f"{scales.min():<9.4g} to {scales.max():<9.4g} error {relative_error(y, q.values):7.2%}  "
              f"flushed {np.mean(q.values == 0):7.2%}")

# %% [markdown]
# Notice: with the tensor scale, the block scales are the same numbers at every size (176 to 448:
# 448 × each block's amax over the tensor's), and so is the error, 9.99%. Without it, size 1 works
# (block scales 0.1875 to 0.4688, error 10.18%), but at 2^-24 the block scales would be about 2^-26:
# clamped to 2^-6, every value is flushed (error 100%). At 2^24 they would be about 2^22: clamped to
# 448, the values are cut to ±6 × 448 = 2688 (error 99.99%). Real gradients can be that small: the
# beam model of lesson 02, after 20 training steps:

# %%
# NBVAL_CHECK_OUTPUT
beam = trained_parameter("beam", "blocks.0.fc1.weight", steps=20)["gradient"]
for two_level in (True, False):
    q = nvfp4_quantize(beam, per_tensor_scale=two_level)
    print(f"beam blocks.0.fc1 gradient, max |g| {np.abs(beam).max():.2g}, tensor scale {'on ' if two_level else 'off'}: "
          f"error {relative_error(beam, q.values):.2%}, flushed {np.mean((q.values == 0) & (beam != 0)):.2%}")

# %% [markdown]
# Notice: its largest gradient is 1.2e-6; without the tensor scale every value is flushed.

# %% [markdown]
# ## 6. Stochastic rounding: unbiased on average
#
# Round to nearest sends 0.3 to 0.5 every time in E2M1 (its neighbours are 0 and 0.5), and 1.2 to
# 1.0: a bias of +0.2 and −0.2 that a sum of many small gradient contributions keeps. Stochastic
# rounding picks the upper neighbour with probability (x − lower) / (upper − lower), so the mean of
# many roundings is x. NVFP4 training rounds its gradients this way:

# %%
# NBVAL_CHECK_OUTPUT
for value in (0.3, 1.2):
    many = np.full(100_000, value, np.float32)
    nearest = ALL_FORMATS["fp4_e2m1"].quantize(many)
    sr = stochastic_round(many, "fp4_e2m1", np.random.default_rng(3))
    print(f"{value}: round to nearest gives {nearest.mean():.4f} on average; stochastic rounding "
          f"{sr.mean():.4f} (values {sorted(set(sr.tolist()))})")

# %% [markdown]
# Notice: each stochastic result is still 0 or 0.5 (1.0 or 1.5), so one rounding errs more than
# round to nearest, but the errors cancel: 0.3 comes out as 0.3 on average, to within the 100,000
# draws' noise. That is why NVFP4 training uses it for gradients and round to nearest for weights.

# %% [markdown]
# ## 7. The random Hadamard transform spreads an outlier
#
# Multiply each chunk of 16 values by a 16 × 16 Hadamard matrix with fixed random signs, divided by 4
# (orthogonal, so the transpose undoes it). An outlier is then spread over all 16 outputs, each a
# ±1/4 share of it plus a mix of the rest. Quantize the transformed row to NVFP4, undo the transform,
# and compare with quantizing the row itself, on N(0, 1) data with and without one outlier of 2^4 per
# 64 values, in MXFP4 and in NVFP4:

# %%
# NBVAL_CHECK_OUTPUT
plain = np.random.default_rng(2).standard_normal((64, 64)).astype(np.float32)
spiky = plain.copy()
spiky[:, 5] = 2.0**4
quantizers = {"MXFP4": lambda d: mx_quantize(d, "fp4_e2m1", rounding="rceil").values,
              "NVFP4": lambda d: nvfp4_quantize(d).values}
for name, data in (("N(0, 1)", plain), ("N(0, 1) + outliers", spiky)):
    mixed = random_hadamard_transform(data)
    print(f"{name}: mean of the largest |value| per 16: {np.abs(data).reshape(-1, 16).max(1).mean():.2f} "
          f"-> {np.abs(mixed).reshape(-1, 16).max(1).mean():.2f} after the transform")
    for scheme, quantize in quantizers.items():
        back = random_hadamard_transform(quantize(mixed), inverse=True)
        print(f"  {scheme}: error {relative_error(data, quantize(data)):.2%} -> {relative_error(data, back):.2%}")

# %% [markdown]
# Notice: the transform halves the largest value per 16 (5.58 to 2.99 on average). For MXFP4, whose
# power-of-two scale per 32 is coarse, that cuts the error from 18.32% to 11.62%. NVFP4's finer E4M3
# scale per 16 already holds an outlier's block well (9.08%), and on this one tensor the transform
# costs a little (10.26%). On N(0, 1) data there is nothing to spread. The NVFP4 recipe applies the
# transform to the two inputs of the weight-gradient product, where its paper (arXiv 2509.25149)
# reports that it bounds block-level outliers in training; a single tensor's error does not show that.

# %% [markdown]
# ## 8. Every format at equal bits, on a real layer
#
# The course's MLP (`model="mlp"` of `ampviz.training.live`: Linear layers 64 units wide, ReLU between them,
# SGD with momentum), trained for 100 steps in float32: its fourth layer's weights (64 × 64) and
# their gradient at the last step. Each row of the table stores one tensor in one scheme; bits per
# element count the scales (MX: 8 bits per 32 elements; NVFP4: 8 per 16 plus the 32-bit tensor scale;
# fp8: the 32-bit tensor scale). The MX scales are rceil's, as torchao's MX configs choose them:

# %%
# NBVAL_CHECK_OUTPUT
layer = trained_parameter("mlp", "fc4.weight", steps=100)
for kind, t in layer.items():
    print(f"{kind}: max |value| {np.abs(t).max():.3g}, max / RMS {np.abs(t).max() / np.sqrt(np.mean(t**2)):.1f}")
every = ("bf16", "fp8_e4m3", "fp8_e5m2", "mxfp8_e4m3", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4", "nvfp4")
format_error_table(layer, every)

# %% [markdown]
# Notice: the weights are still close to torch's uniform initialisation in ±1/8 (99% of them lie
# inside it) and have no outliers (max / RMS 1.9); the gradient has some (max / RMS 13.2). At about
# 8 bits, MXFP8 E4M3 (2.39% on the weights, 2.54% on the gradient) beats fp8 E4M3 with one scale per
# tensor (2.71% and 2.63%) for a quarter of a bit more, and MXFP6 E2M3 at 6.25 bits (2.49% and
# 2.91%) comes close to both: the same mantissa, its range from the scale. At about 4 bits the layer
# splits: on the weights, without outliers, MXFP4 (4.25 bits: 9.79%) edges out NVFP4 (4.51 bits:
# 10.3%); on the gradient NVFP4's smaller blocks and finer scales win (9.18% against 12.3%), where
# MXFP4 flushes 28.52% of the values. The same layer with the OCP floor rule:

# %%
# NBVAL_CHECK_OUTPUT
format_error_table(layer, ("mxfp8_e4m3", "mxfp4"), rounding="floor")

# %% [markdown]
# Notice: floor saturates 6.57% of the weights in MXFP8 E4M3 and takes their error from 2.39% to 4.2%,
# above per-tensor fp8's 2.71%: in 96 of the 128 blocks the largest |w| lies between 2^-4 and 2^-3,
# the floor rule's scale is 2^-12, and every weight above 448 × 2^-12 = 0.109375 is clamped to it.
# MXFP4's weights go from 9.79% to 13%. On the gradient floor flushes fewer values (23.73% against
# 28.52% in MXFP4) but saturates some, and the error hardly moves (12.4% against 12.3%).

# %% [markdown]
# ## Try it
#
# Pick a scheme, the scale rounding (it opens at rceil: switch to floor to see saturation), the data
# and the outlier's size; tick the Hadamard box for NVFP4. The upper panel draws sizes on a log2
# axis: each element's original size is a thin black level and its dequantized one a green level
# over it (where they agree, only the black ends show).
# Each block's range lies between its grey steps, its largest value (solid) and its smallest
# nonzero one (dotted); a value beyond the solid step is held at it (saturated: a thick orange
# level), and a value at most half the dotted step is flushed to 0 (a thick blue level on the 0
# row). Watch the outlier's block: its range rises with the outlier, its neighbours fall below its
# floor, and their errors rise with it.

# %%
BlockExplorer(rounding="rceil")

# %% [markdown]
# The same point as a static figure: the row of section 1 in MXFP4, blocks of 32. Block 1's scale
# is 2^8, so its range runs from 2^7 (dotted) to 6 × 2^8 (solid), far above its other values,
# which sit on the 0 row (thick blue levels):

# %%
plot_blocks(x, mx_quantize(x, "fp4_e2m1", rounding="rceil"))

# %% [markdown]
# ## Check yourself

# %%
# MXFP8 E4M3, OCP floor scale: a block of 32 whose largest value is 500 (the rest 0).
# What does 500 dequantize to?
answer = None
check_mx_floor_value(answer)

# %%
# MXFP4, floor scale: one block of 31 values 1.0 and one value 1024.
# How many of the 31 ones are still nonzero after dequantizing?
answer = None
check_outlier_survivors(answer)

# %%
# NVFP4 on a tensor of 4096 elements: how many bits per element, both levels of scales included?
answer = None
check_nvfp4_bits(answer)

# %%
# NVFP4 without the tensor scale (per_tensor_scale=False): a block of 16 values, all 1e-3.
# What does 1e-3 dequantize to?
answer = None
check_single_level_value(answer)

# %%
# Section 1: with a scale per 32 values, the 2^10 outlier flushes its own block only; with one scale
# for all 128 values, it flushes all 127 others. Why? (a letter)
#   a) each block's scale comes from its own largest value: only the outlier's block gets the scale 2^8,
#      whose smallest nonzero step is 128; the other blocks keep 2^-1
#   b) smaller blocks spend more bits per element, so their values are rounded more finely
#   c) the outlier is clamped to its block's largest value, so it no longer sets the scale
#   d) a per-block scale can be any float, finer than a per-tensor scale's power of two
answer = None
check_why_mx_block_survives_outlier(answer)

# %%
# NVFP4 already gives every block of 16 values its own scale. Why does it also need a float32 scale
# per tensor? (a letter)
#   a) without it, a block's largest value cannot be stored in E2M1
#   b) its block scales are E4M3 numbers, which reach only from 2^-9 to 448 (torchao holds them between
#      2^-6 and 448): a tensor far from size 1 needs block scales outside that range, and the tensor
#      scale brings them back inside
#   c) the tensor scale turns the block scales into powers of two, as in MX
answer = None
check_why_mx_nvfp4_tensor_scale(answer)

# %%
# In MXFP8 E4M3 the OCP floor rule can clamp a block's largest value to 448; the rceil rule never
# clamps one (section 3). Why? (a letter)
#   a) floor rounds each element down, toward zero, so the largest elements lose the most
#   b) an E8M0 scale cannot exceed 1, so a block of large values always saturates
#   c) floor aims the largest power of two in amax at E4M3's 2^8, but amax can be up to twice that power
#      while E4M3's largest value is 1.75 × 2^8 = 448: past 1.75 times its power of two, amax lands
#      beyond max and is clamped; rceil takes the least scale with amax / scale <= 448
#   d) a block's largest value can lie beyond E4M3's range whatever the scale
answer = None
check_why_mx_floor_saturates(answer)

# %% [markdown]
# ## Summary
#
# - A block format spends a few extra bits on scales: MX 8 bits per 32 elements (+0.25 per element),
#   NVFP4 8 per 16 plus one float32 per tensor (+0.5 and a little). In return an outlier costs only its
#   own block: one 2^10 value flushes its block of 32, not the tensor.
# - MX scales are powers of two (E8M0). torchao's MX configs round them up (rceil), which never clamps
#   and flushes more small values instead; the OCP floor rule, the default of torchao's lower-level
#   `to_mx`, can clamp a block's largest value (E4M3: 500 becomes 448). torchao's rceil fallback (a
#   float32 log2: eager mode, the CPU, GPUs before SM100, torch before 2.12) is one step short just
#   above a power of two; compiled on SM100 and later GPUs, its PTX conversion is exact.
# - NVFP4's E4M3 block scales need the float32 tensor scale: without it a tensor of size 2^-24 is
#   flushed entirely and one of size 2^24 saturates.
# - Stochastic rounding is unbiased on average. The 16-point random Hadamard transform spreads an
#   outlier over its chunk: it cuts MXFP4's error on outlier-heavy data, not NVFP4's on one tensor.
# - On a real layer: per-tensor fp8 E4M3, MXFP8 E4M3 and MXFP6 E2M3 (rceil scales) all land between
#   2.3% and 3%; the floor rule saturates 6.57% of the MLP's weights in MXFP8 E4M3 (error 4.2%). At
#   4 bits MXFP4 edges out NVFP4 on the weights, which have no outliers; NVFP4 wins on the gradient.
#
# **Previous:** [12 · FP8 per-tensor scaling](12_fp8_scaling.ipynb). **Next:**
# [14 · FP8 training for real: torchao's Float8Linear, and what it buys](14_fp8_training.ipynb) trains the course's models with torchao's FP8
# recipes, runs Transformer Engine's block recipes on one tensor, and shows what each precision buys
# on a real GPU.
#
# **Open exercises**
# 1. Run `format_error_table(layer, ("mxfp8_e4m3", "mxfp4"), rounding=r)` for `r` in `("ceil",
#    "even")` too. Which rule gives MXFP4 the lowest error on the weights? Why does "even" still saturate
#    some MXFP8 E4M3 values but no MXFP4 ones?
# 2. Quantize the gradient of section 8 after the random Hadamard transform (`layer["gradient"]` has rows
#    of 64: transform, `format_error`, transform back and `relative_error`). Does the transform help
#    NVFP4 on this gradient? Compare the gradient's largest |value| per 16 before and after.
# 3. Train the beam model for 20 steps (`trained_parameter("beam", "head.weight", steps=20)`) and
#    tabulate its gradient in every scheme. Which schemes flush it, and what does fp16 do to it?

# %% [markdown]
# The lesson's claims, checked:

# %%
q32, q128 = mx_quantize(x, "fp4_e2m1", 32, "rceil"), mx_quantize(x, "fp4_e2m1", 128, "rceil")
assert (q32.scales.astype(int) - 127).tolist() == [-1, 8, -1, -1] and q128.scales.tolist() == [127 + 8]
assert ((q32.values == 0) & (x != 0)).reshape(4, 32).sum(1).tolist() == [3, 31, 2, 3]
assert ((q128.values == 0) & (x != 0)).sum() == 127 and np.abs(np.delete(x, 37)).max() < 3
assert [scheme_bits(s, 4096) for s in ("mxfp8_e4m3", "mxfp6_e2m3", "mxfp4", "nvfp4")] == [8.25, 6.25, 4.25, 4.5078125]
levels = {n: np.isfinite(np.unique(np.abs(ALL_FORMATS[n].decode(np.arange(2**ALL_FORMATS[n].bits))))).sum()
          for n in ("fp8_e4m3", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1")}
assert levels == {"fp8_e4m3": 127, "fp6_e3m2": 32, "fp6_e2m3": 32, "fp4_e2m1": 8}
row = np.zeros(32, np.float32)
row[:3] = [500.0, -3.0, 0.0015]
by_rule = {r: mx_quantize(row, "fp8_e4m3", rounding=r) for r in ("floor", "ceil", "even", "rceil")}
assert by_rule["floor"].values[:3].tolist() == [448, -3, 2**-9] and by_rule["floor"].scales[0] == 127
assert all(by_rule[r].values[:3].tolist() == [512, -3, 0] and by_rule[r].scales[0] == 128 for r in ("ceil", "even", "rceil"))
amax_row = np.zeros(32, np.float32)
amax_row[0] = amax
floor_q = mx_quantize(amax_row, "fp8_e4m3")
assert exact.scales[0] == 127 - 6 and torchao_k == -7 and floor_q.scales[0] == 127 - 7
assert amax / np.float32(2.0**-7) > 448 and exact.values[0] == floor_q.values[0] == 3.5
sizes = {(size, two): nvfp4_quantize(base * np.float32(size), per_tensor_scale=two) for size in (2.0**-24, 1.0, 2.0**24)
         for two in (True, False)}
errors = {k: relative_error(base * np.float32(k[0]), q.values) for k, q in sizes.items()}
assert all(np.array_equal(sizes[(s, True)].scales, sizes[(1.0, True)].scales) for s in (2.0**-24, 2.0**24))
assert all(f"{errors[(s, True)]:.2%}" == "9.99%" for s in (2.0**-24, 1.0, 2.0**24)) and f"{errors[(1.0, False)]:.2%}" == "10.18%"
assert (sizes[(2.0**-24, False)].values == 0).all() and (np.abs(sizes[(2.0**24, False)].values) == 2688).all()
assert f"{errors[(2.0**24, False)]:.2%}" == "99.99%" and set(sizes[(2.0**24, False)].scales.ravel().tolist()) == {126}
block_amax = np.abs(base).reshape(16, 16).max(1) / 6
assert (block_amax * 2.0**-24 > 2.0**-27).all() and (block_amax * 2.0**-24 < 2.0**-25).all()
assert (block_amax * 2.0**24 > 2.0**21).all() and (block_amax * 2.0**24 < 2.0**23).all()
scales_on = ALL_FORMATS["fp8_e4m3"].decode(sizes[(1.0, True)].scales.astype(np.int64))
assert (scales_on.min(), scales_on.max()) == (176, 448)
assert f"{np.abs(beam).max():.2g}" == "1.2e-06" and (nvfp4_quantize(beam, per_tensor_scale=False).values == 0).all()
assert ALL_FORMATS["fp4_e2m1"].quantize(0.3) == 0.5 and ALL_FORMATS["fp4_e2m1"].quantize(1.2) == 1.0
sr = {v: stochastic_round(np.full(100_000, v, np.float32), "fp4_e2m1", np.random.default_rng(3)).mean() for v in (0.3, 1.2)}
assert abs(sr[0.3] - 0.3) < 5e-4 and abs(sr[1.2] - 1.2) < 5e-4  # seeded; one standard error is about 8e-4
rht_errors = {}
for name, data in (("plain", plain), ("spiky", spiky)):
    mixed = random_hadamard_transform(data)
    for scheme, quantize in quantizers.items():
        rht_errors[name, scheme] = (relative_error(data, quantize(data)),
                                    relative_error(data, random_hadamard_transform(quantize(mixed), inverse=True)))
assert [f"{e:.2%}" for e in rht_errors["spiky", "MXFP4"] + rht_errors["spiky", "NVFP4"]] == ["18.32%", "11.62%", "9.08%", "10.26%"]
assert f"{np.abs(spiky).reshape(-1, 16).max(1).mean():.2f}" == "5.58"
assert f"{np.abs(random_hadamard_transform(spiky)).reshape(-1, 16).max(1).mean():.2f}" == "2.99"
assert layer["weight"].shape == layer["gradient"].shape == (64, 64)
peak = {t: np.abs(v).max() / np.sqrt(np.mean(v**2)) for t, v in layer.items()}
assert f"{peak['weight']:.1f}" == "1.9" and f"{peak['gradient']:.1f}" == "13.2"
assert f"{np.mean(np.abs(layer['weight']) <= 1 / 8):.0%}" == "99%"  # inside the initialisation's ±1/8
rceil = {(t, s): format_error(layer[t], s) for t in layer for s in every}  # rceil: the default
floor = {(t, s): format_error(layer[t], s, rounding="floor") for t in layer for s in ("mxfp8_e4m3", "mxfp4")}
pct = lambda v: f"{100 * v:.3g}%"  # noqa: E731 - as the table prints them
assert [pct(rceil[t, s].error) for t in layer for s in ("fp8_e4m3", "mxfp8_e4m3", "mxfp6_e2m3", "mxfp4", "nvfp4")] == \
    ["2.71%", "2.39%", "2.49%", "9.79%", "10.3%", "2.63%", "2.54%", "2.91%", "12.3%", "9.18%"]
assert all(r.saturated == 0 for r in rceil.values()) and f"{rceil['gradient', 'mxfp4'].flushed:.2%}" == "28.52%"
assert [pct(floor[t, s].error) for t in layer for s in ("mxfp8_e4m3", "mxfp4")] == ["4.2%", "13%", "3.37%", "12.4%"]
assert f"{floor['weight', 'mxfp8_e4m3'].saturated:.2%}" == "6.57%" and rceil["weight", "fp8_e4m3"].saturated == 0
assert f"{floor['gradient', 'mxfp4'].flushed:.2%}" == "23.73%" and floor["gradient", "mxfp4"].saturated > 0
block_max = np.abs(layer["weight"]).reshape(-1, 32).max(1)
in_binade = (block_max >= 2.0**-4) & (block_max < 2.0**-3)
mx_w = mx_quantize(layer["weight"], "fp8_e4m3", rounding="floor")
assert block_max.size == 128 and in_binade.sum() == 96 and 448 * 2.0**-12 == 0.109375
k = mx_w.scales.ravel().astype(int) - 127
assert (k[in_binade] == -12).all() and (k[~in_binade] > -12).all()
clamped = (np.abs(layer["weight"]).reshape(-1, 32) > 0.109375) & in_binade[:, None]
assert (np.abs(mx_w.values).reshape(-1, 32)[clamped] == np.float32(0.109375)).all() and clamped.any()
near = [rceil[t, s].error for t in layer for s in ("fp8_e4m3", "mxfp8_e4m3", "mxfp6_e2m3")]
assert all(0.023 <= e < 0.03 for e in near)
assert all(rceil[t, "mxfp8_e4m3"].error < rceil[t, "fp8_e4m3"].error < floor[t, "mxfp8_e4m3"].error for t in layer)
assert all(abs(rceil[t, "mxfp6_e2m3"].error - rceil[t, "fp8_e4m3"].error) < 0.004 for t in layer)
assert f"{rceil['weight', 'nvfp4'].bits:.2f}" == "4.51" and rceil["weight", "mxfp4"].bits == 4.25
assert rceil["weight", "mxfp4"].error < rceil["weight", "nvfp4"].error
assert rceil["gradient", "nvfp4"].error < rceil["gradient", "mxfp4"].error
print("all claims hold")
