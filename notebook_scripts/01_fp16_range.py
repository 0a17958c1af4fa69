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
# # 01 · The fp16 range: bits, subnormals, rounding
#
# What [fp16](../GLOSSARY.md#fp16), [bf16](../GLOSSARY.md#bf16) and [fp8](../GLOSSARY.md#fp8) can store, where they round, and where values vanish or become inf.
#
# You will be able to:
# - read a format's limits (max, smallest normal and [subnormal](../GLOSSARY.md#subnormal), eps) off its bit layout,
# - predict what a cast to fp16 does at both ends of its range (2^-25 becomes 0, 65520 becomes inf),
# - explain why a weight stops learning when it is kept in fp16, and why [AMP](../GLOSSARY.md#amp) keeps [fp32](../GLOSSARY.md#fp32) [master weights](../GLOSSARY.md#master-weights).
#
# Teaching this lesson? The [teacher's guide](../TEACHING.md#nb01) has its timings, the answers to
# its exercises and what to demo live.
# Its words in English and Chinese (中文), each with a one-line definition: the [glossary](../GLOSSARY.md).

# %%
import numpy as np
import torch

from ampviz import FP16, FP8_E4M3, FP8_E5M2
from ampviz.formats import lesson
from ampviz.formats.lesson import (bits_table, cast_rules_table, cast_table, check_why_bf16_range,
                                   check_why_master_weights, format_table, stall_table, update_table)
from ampviz.plots import plot_census, plot_format_ranges, plot_lost_band
from ampviz.training import torch_accumulate, torch_add, torch_cast
from ampviz.widgets import FormatExplorer, RangeExplorer

rng = np.random.default_rng(0)
_ = torch.manual_seed(0)
torch.set_num_threads(1)

# %% [markdown]
# ## 1. A format is three numbers
#
# A float is stored as a [sign bit](../GLOSSARY.md#sign-bit), an [exponent](../GLOSSARY.md#exponent) field and a [mantissa](../GLOSSARY.md#mantissa) field; a [normal number](../GLOSSARY.md#normal-number)'s value
# is ±1.mantissa × 2^(exponent − [bias](../GLOSSARY.md#bias)). The number of exponent bits sets the *range*, the number of
# mantissa bits the *precision*: eps, the gap between 1 and the next value, is 2^-(mantissa bits).
# fp16 and bf16 both use 16 bits, and split them very differently:

# %%
# NBVAL_CHECK_OUTPUT
format_table()

# %% [markdown]
# Notice: bf16 has fp32's range (max 3.4e38) with only 7 mantissa bits; fp16 has 3 more bits of
# precision but stops at 65504. fp8 E4M3 has no inf at all: its largest number is 448, and what a
# cast does with a larger value depends on the cast (section 6).
#
# Here are a few fp16 bit patterns, field by field:

# %%
# NBVAL_CHECK_OUTPUT
bits_table([1.0, 0.1, 65504, 2**-14, 2**-24], "fp16")

# %% [markdown]
# 0.1 has no exact binary form, so it is rounded (to 0.099975586). An exponent field of 0 marks a
# *subnormal*: no implicit leading 1, a fixed exponent of −14, and fewer significant bits.

# %% [markdown]
# ## 2. The bottom of the range: subnormals and 2^-24
#
# Below the smallest normal number, 2^-14, fp16 continues in even steps of 2^-24: the smallest
# positive fp16 number is 2^-24 ≈ 5.96e-8. A cast [rounds to the nearest](../GLOSSARY.md#round-to-nearest) value, ties to even:
# anything above 2^-25 rounds up to 2^-24, and 2^-25 itself, exactly halfway between 0 and 2^-24,
# goes to the even neighbour, 0.

# %%
# NBVAL_CHECK_OUTPUT
cast_table([2**-14, 1e-7, 2**-24, 1.5 * 2**-25, 2**-25, 2**-26], "fp16",
           labels=["2^-14", "1e-7", "2^-24", "1.5 × 2^-25", "2^-25", "2^-26"])

# %% [markdown]
# Notice: *[underflow](../GLOSSARY.md#underflow)* means a nonzero value came out as 0. Subnormals survive but coarsely: 1e-7
# is stored as 2^-23 ≈ 1.19e-7, 19% off. This is the line that small gradients cross in notebook 02.

# %% [markdown]
# ## 3. The top of the range: 65504 and 65520
#
# fp16's largest value is 65504 = (2 − 2^-10) × 2^15. The next step up would be 65536, which fp16
# cannot store. Values between round to the nearer one: up to 65520 they round down to 65504;
# 65520 is the tie, and it goes to the "even" side, which is inf.

# %%
# NBVAL_CHECK_OUTPUT
cast_table([65504, 65519, 65520, 70000], "fp16")

# %% [markdown]
# Notice: fp16 [overflows](../GLOSSARY.md#overflow) at 65520, not just above 65504. Once a value is inf, every sum or product
# it enters is inf or NaN.

# %% [markdown]
# ## 4. 1 + 2^-11 == 1
#
# Near 1, fp16's values are 2^-10 apart (eps). Adding 2^-11 lands exactly halfway between 1 and
# 1 + 2^-10, and the tie goes to the even neighbour, 1. torch agrees:

# %%
# NBVAL_CHECK_OUTPUT
one = torch.tensor(1.0, dtype=torch.float16)
half_eps = torch.tensor(2**-11, dtype=torch.float16)
print("torch,  fp16: 1 + 2^-11 == 1 ->", (one + half_eps == one).item())
print("ampviz, fp16: 1 + 2^-11 == 1 ->", lesson.add(1.0, 2**-11, "fp16") == 1.0)
print("ampviz, fp32: 1 + 2^-11 == 1 ->", lesson.add(1.0, 2**-11, "fp32") == 1.0)

# %% [markdown]
# ## 5. Why a weight stops learning in fp16
#
# An optimizer step adds a small update u to each weight w, and fp16 rounds w + u to the nearest
# fp16 value. Two words for what follows. The *[ulp](../GLOSSARY.md#ulp)* (unit in the last place) of a number is the
# gap between it and the next number of larger magnitude: the value of its last mantissa bit,
# 2^-10 × 2^e for a normal fp16 number between 2^e and 2^(e+1). A *[binade](../GLOSSARY.md#binade)* is the set of numbers
# from one power of two up to the next, 2^e ≤ |x| < 2^(e+1): they share the exponent e, so the ulp
# is the same across a binade and doubles in the next one.
#
# So the update is **lost** (w + u == w) exactly when |u| is at most **half the gap between w and
# its neighbour on u's side**: the *½-ulp rule*. That gap is one ulp of w, except when w is a power
# of two and u points toward 0: the neighbour then lies in the binade below, half as far. At
# exactly half (a tie) the [update is lost](../GLOSSARY.md#lost-update) only if w's last mantissa bit is 0 (ties go to the even
# neighbour). So on w = 1 the direction matters.
#
# Predict before you run the table: the fp16 neighbours of 1.0 are 1 + 2^-10 above and 1 − 2^-11
# below. Is the update −2^-11 lost?

# %%
# Predict: an fp16 weight is 1.0. Is the update -2**-11 lost, i.e. does 1.0 - 2**-11 round back
# to 1.0? "yes" or "no"
answer = None
lesson.check_update_lost(answer, w=1.0, u=-2**-11)

# %%
# NBVAL_CHECK_OUTPUT
update_table(w=1.0, formats=("fp32", "bf16", "fp16"))

# %% [markdown]
# bf16 is worse: with 7 mantissa bits, a weight of 1 ignores any positive update 256× smaller.
# A rule like "lost once the weight is 2048× larger than the update" is right only when w is a
# power of two and the update moves it away from 0. The gap is the same across a binade while w
# grows, so relative to w the band of lost updates shrinks from 1/2048 just above a power of two
# to 1/4096 just below the next:

# %%
plot_lost_band("fp16", 1.0, 4.0, points=[(1.9004, 1.9004 / 3000), (1.0, -2**-11), (1.0, 2**-11)])

# %% [markdown]
# Every fp16 weight from 1 to 4 is on the x axis; the updates inside the blue band are lost.
# Two of the marked updates are kept although the weight is 2048× larger or more:
# 1.9004 + 1.9004/3000 (above the band) and 1.0 − 2^-11 (below it). The package and torch agree:

# %%
# NBVAL_CHECK_OUTPUT
examples = {"1.9004 + 1.9004/3000": (1.9004, 1.9004 / 3000), "1.0 - 2^-11": (1.0, -2**-11),
            "1.0 + 2^-11": (1.0, 2**-11), "1.0 - 2^-12": (1.0, -2**-12)}
for text, (w, u) in examples.items():
    lost = lesson.update_lost(w, u, "fp16")
    print(f"{text:21} -> {lesson.add(w, u, 'fp16'):<13.11g} {'lost' if lost else 'kept'}"
          f"   torch: {torch_add(w, u, 'fp16'):.11g}")
lo, hi = lesson.lost_band(1.9004, "fp16")
print(f"lost on w = 1.9004: u from {lo} to {hi}, |u| up to w / {FP16.quantize(1.9004) / hi:.0f}")

# %% [markdown]
# (An optimizer such as SGD computes lr × gradient and the sum in fp32 before rounding into
# fp16; that moves the band's edges by at most one fp32 step:
# `lesson.update_lost(w, u, "fp16", via="fp32")`.)
#
# Now 1000 steps that each add 1e-4 (say learning rate 0.01 × gradient 0.01) to a weight of 1.
# 1e-4 is less than 1/4096 of the weight, inside the band: every step is lost. The weight should
# move by 0.1:

# %%
# NBVAL_CHECK_OUTPUT
stall_table(w0=1.0, update=1e-4, steps=1000)

# %% [markdown]
# Notice: kept in fp16 or bf16, the weight never moves; every single update is lost. This is why
# mixed-precision training keeps an **fp32 master copy** of the weights, applies the updates to
# it, and casts it to fp16 for the forward pass (fourth row). The fp16 copy then follows the
# training: it moved by 0.0996 (it is the fp16 number nearest 1.1) instead of 0. fp32 itself is
# close but not exact: 1.1000166.

# %% [markdown]
# ## 6. fp8: past the largest number, the cast decides
#
# fp8 E4M3 spends its top exponent on numbers, so it has no inf: its largest number is 448, and
# only S.1111.111 is NaN. fp8 E5M2 keeps IEEE's inf: its max is 57344, and it rounds to inf from
# 61440 (halfway to the next power of two) up. What happens to a value past E4M3's max is not
# fixed by the format. Predict first:

# %%
# Predict: what does torch's cast turn 500.0 into in fp8 E4M3? (a number, float("inf") or float("nan"))
answer = None
lesson.check_cast(answer, 500.0, "fp8_e4m3")

# %%
# NBVAL_CHECK_OUTPUT
print(cast_table([448, 464, 480, 500, 1e6], "fp8_e4m3"))
print()
print(cast_table([57344, 60000, 61439, 61440, 1e6], "fp8_e5m2"))

# %% [markdown]
# This course computes every cast as torch 2.13 does on the CPU, and torch's E4M3 cast [saturates](../GLOSSARY.md#saturation):
# 500, 1e6 and even inf become 448 (since torch 2.12; before, a finite overflow gave NaN). Other
# libraries decide differently. ml_dtypes (what JAX uses) gives NaN past 464; CUDA's fp8
# conversions, which Transformer Engine's kernels use, saturate (`__NV_SATFINITE`), in E5M2 too,
# where torch's CPU cast gives inf. `FP8_E4M3.quantize(x, overflow="nan")` and
# `overflow="saturate"` compute the others (a test checks them against ml_dtypes):

# %%
# NBVAL_CHECK_OUTPUT
print(cast_rules_table([448, 464, 465, 500, 1e6], "fp8_e4m3"))
print()
print(cast_rules_table([57344, 61439, 61440, 1e6], "fp8_e5m2"))

# %% [markdown]
# Notice: within the range the three casts agree; past it, the same 500 is 448, NaN or 448, and
# the same 1e6 in E5M2 is inf, inf or 57344. Neither answer is safe to rely on: a saturated value
# hides the overflow, a NaN poisons the step. FP8 training recipes avoid overflow instead: each
# tensor gets its own scale, chosen from its largest magnitude (amax), so that its values land
# below the max; Micikevicius et al. (2022, *FP8 Formats for Deep Learning*, arXiv:2209.05433)
# use E4M3 for weights and activations and E5M2 for gradients that way.

# %% [markdown]
# ## Try it
#
# Type a value (65519, 65520, 1e-7, 2**-25), click bits, or switch formats, and watch the
# category and the rounding error:

# %%
FormatExplorer("fp16", value=65519)

# %% [markdown]
# The same point for all formats, as a static figure: where each one holds a value, from the
# underflow band on the left to overflow on the right.

# %%
plot_format_ranges()

# %% [markdown]
# And a whole set of values at once: 10,000 magnitudes spread evenly on a log scale from 2^-30 to
# 2^18. Move the scale slider and watch them enter and leave fp16's window; then try bf16.

# %%
values = 2.0 ** rng.uniform(-30, 18, size=10_000)
RangeExplorer(values, fmt="fp16", log2_scale=0)

# %%
plot_census(values, "fp16", scale=1.0, title="10,000 values from 2^-30 to 2^18, cast to fp16")

# %% [markdown]
# ## Check yourself
#
# Set `answer` and run the cell; it answers with one line.

# %%
# AMD's MI300 GPUs use float8_e4m3fnuz: 4 exponent bits and 3 mantissa bits like E4M3, but the
# exponent bias is 8 instead of 7 (and there is no inf and no -0). What is its smallest positive
# number? (2**-10 style is fine)
answer = None
lesson.check_fnuz_smallest(answer)

# %%
# fp16 turns 65520.0 into inf. What does bf16 turn 65520.0 into?
answer = None
lesson.check_cast(answer, 65520.0, "bf16")

# %%
# A bf16 weight is 256.0 and the update is +1.0. Is the update lost? "yes" or "no"
answer = None
lesson.check_update_lost(answer, w=256.0, u=1.0, fmt="bf16")

# %%
# An fp16 weight is 1.5; the update is 1.5 / 3000, so the weight is 3000 times larger.
# Is the update lost? "yes" or "no"
answer = None
lesson.check_update_lost(answer, w=1.5, u=1.5 / 3000)

# %%
# Why does mixed-precision training keep an fp32 master copy of the weights? (a letter)
#   a) a weight kept in fp16 would overflow: past 65504 it becomes inf, and an inf weight ruins
#      every later step
#   b) the gradients of fp16 weights underflow to 0
#   c) an update at most half the gap between a weight and its neighbour rounds back to the same
#      weight: in fp16 a small update to a large weight is lost every time, while fp32's gaps are
#      2^13 times smaller and the updates add up
#   d) the forward pass must run in fp32 to be accurate, so it needs the weights in fp32
answer = None
check_why_master_weights(answer)

# %%
# bf16 has fp32's range, yet a bf16 weight of 1 loses updates that an fp16 weight of 1 keeps. Why?
# (a letter)
#   a) of its 16 bits bf16 gives 8 to the exponent, as fp32 does, and only 7 to the mantissa:
#      exponent bits set the range, mantissa bits the precision
#   b) bf16 saturates at its largest number instead of going to inf
#   c) bf16's exponent bias is larger (127 against fp16's 15), and a larger bias reaches larger
#      numbers
answer = None
check_why_bf16_range(answer)

# %% [markdown]
# ## Summary
#
# - A format's exponent bits set its range, its mantissa bits its precision (eps = 2^-mantissa bits).
# - fp16 stores 2^-24 to 65504. 2^-25 and below become 0; 65520 and above become inf.
#   Subnormals (2^-24 to 2^-14) survive with fewer significant bits.
# - An update is lost when it is at most half the gap between the weight and its neighbour on the
#   update's side (a tie is lost only on an even weight): in fp16 between 1/4096 and 1/2048 of the
#   weight, depending on where it sits in its binade (bf16: 1/512 to 1/256). On w = 1, +2^-11 is
#   lost but −2^-11 is kept. AMP keeps fp32 master weights so small updates add up.
# - fp8 E4M3 has no inf: past 448, torch's CPU cast saturates, ml_dtypes gives NaN; E5M2 rounds
#   to inf from 61440 (CUDA's conversions saturate both). FP8 training avoids overflow with a
#   scale per tensor, not by relying on either.
#
# **Next:** [02 · Loss scaling: keeping small gradients alive in fp16](02_loss_scaling.ipynb) puts real
# gradients into this picture.
#
# **Open exercises**
# 1. What is the largest integer *n* such that every integer from 0 to *n* is exact in fp16?
#    (Try `FP16.quantize(2049)`.)
# 2. Some online fp8 explorers show E4M3's max as 240, and `torch.finfo(torch.float8_e4m3fnuz).max`
#    is 240 too. Find the bit pattern of the largest number in each case: in E4M3 read with
#    IEEE's convention (the all-ones exponent kept for inf and NaN), and in float8_e4m3fnuz
#    (bias 8, only 0x80 is NaN). Why do two different reasons give the same 240? (Hint:
#    `bits_table([448, 240], "fp8_e4m3")`.)
# 3. bf16 is fp32 with the mantissa *rounded* to 7 bits. Find a value where truncating instead of
#    rounding gives a different bf16 number.
# 4. For w = 1.5 instead of 1.0, what is `lesson.lost_band(1.5, "fp16")`? Why is w / u not 2048,
#    and why are both sides the same here but not at 1.0? Which fp16 weight in [1, 2) has the
#    narrowest band relative to itself?

# %% [markdown]
# The lesson's claims, checked against torch's own casts and arithmetic (after the summary, so
# that the exercises keep their answers to themselves):

# %%
assert FP16.smallest_subnormal == 2**-24 and FP16.smallest_normal == 2**-14 and FP16.max == 65504
assert torch_cast([2**-25, 1.5 * 2**-25, 65519, 65520], "fp16").tolist() == [0, 2**-24, 65504, np.inf]
assert torch_add(1, 2**-11, "fp16") == 1 and torch_add(1, 2**-10, "fp16") == 1 + 2**-10
assert lesson.lost_band(1.0, "fp16") == (-2**-12, 2**-11)  # below 1 the gap is half as wide
assert torch_add(1, -2**-11, "fp16") == 1 - 2**-11 and not lesson.update_lost(1, -2**-11, "fp16")
assert torch_add(1.9004, 1.9004 / 3000, "fp16") != FP16.quantize(1.9004)  # 3000x smaller, kept
assert not lesson.update_lost(1.9004, 1.9004 / 3000, "fp16")
fp16_weight = torch_accumulate(1.0, 1e-4, 1000, "fp16")
assert (fp16_weight == 1.0).all()  # the stalled weight, in torch
assert (lesson.accumulate(1.0, 1e-4, 1000, "fp16") == fp16_weight).all()
assert torch_cast([500, 1e6], "fp8_e4m3").tolist() == [FP8_E4M3.max] * 2 == [448, 448]
assert torch_cast([60000, 61439, 61440], "fp8_e5m2").tolist() == [FP8_E5M2.max] * 2 + [np.inf]
assert torch_cast([np.inf], "fp8_e4m3").tolist() == [448]  # torch >= 2.12 saturates inf too
assert np.isnan(FP8_E4M3.quantize(500, overflow="nan")) and FP8_E4M3.quantize(464, overflow="nan") == 448
assert FP8_E5M2.quantize(1e6, overflow="saturate") == 57344
print("all claims hold")
