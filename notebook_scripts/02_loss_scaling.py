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
# # 02 · Loss scaling: keeping small gradients alive in fp16
#
# Real gradients, fp16's window, and the one multiplication that moves them back into it.
#
# You will be able to:
# - measure how many of a model's gradients fp16 flushes to zero, and which layers lose them,
# - explain why multiplying the loss by S shifts every gradient by log2(S), and pick a safe static S,
# - say what one overflowing value does to a training step, and why GradScaler skips such steps.
#
# Teaching this lesson? The [teacher's guide](../TEACHING.md#nb02) has its timings, the answers to
# its exercises and what to demo live.
# Its words in English and Chinese (中文), each with a one-line definition: the [glossary](../GLOSSARY.md).

# %%
import numpy as np
import torch

from ampviz.training.beam import gradients
from ampviz.formats.census import census
from ampviz.scaling.lesson import (census_table, check_batch_effect, check_overflow_action, check_safe_scale,
                                   check_why_real_pass_loses_more, check_why_scaling_works,
                                   largest_safe_scale, layer_table)
from ampviz.plots import plot_census
from ampviz.text import number
from ampviz.training import torch_cast_counts
from ampviz.training.gradscaler import walk_iteration
from ampviz.training.gradscaler.writeups import loss_scaling_claims, step_if_pattern
from ampviz.widgets import RangeExplorer

rng = np.random.default_rng(0)
_ = torch.manual_seed(0)
torch.set_num_threads(1)

# %% [markdown]
# ## 1. Real gradients
#
# The model is the one notebook 07 trains: a small network that predicts how far a floor beam
# bends under two loads (64 deflections in metres, from the beam's load positions, loads and
# stiffness), with LayerNorm, GELU and residual blocks, trained on a mean squared error in m².
# `gradients(seed=0)` builds it fresh, runs its first batch of 256 beams forward and backward in
# fp32, and returns two kinds of gradients:
#
# - `params`: the gradient of every weight and bias (what the optimizer applies),
# - `outputs`: the gradient of every Linear layer's output, one per example and unit. Under fp16
#   autocast these layers run in fp16, so these are the gradients the backward pass carries in
#   fp16 from the loss down to the first layer; the weights' gradients are computed from them.

# %%
# NBVAL_CHECK_OUTPUT
grads = gradients(seed=0)
g = grads.all  # every gradient of both kinds, in one array
print(f"{g.size:,} gradients ({sum(v.size for v in grads.params.values()):,} of weights and biases, "
      f"{sum(v.size for v in grads.outputs.values()):,} of layer outputs)")
print(f"exactly zero: {np.mean(g == 0):.0%}; largest |g|: {np.abs(g).max():.1e}")

# %% [markdown]
# None is exactly zero (GELU, unlike ReLU, has no units that are off for a whole batch), and
# all are small. They are small for a reason you can follow: the loss averages over
# 256 × 64 = 16,384 squared errors of a few millimetres, so its gradient with respect to one
# prediction is about 2 × 0.005 / 16,384 ≈ 6·10⁻⁷, and the network's output is multiplied by
# each gauge's spread in metres (about 10⁻²) on its way out, which multiplies the gradient by it
# again. Here is where they sit on a log2 axis, over fp16's bands (hover the bars):

# %%
plot_census(g, "fp16", scale=1.0, title="Gradients of the beam model, cast to fp16 at scale 1")

# %% [markdown]
# ## 2. What fp16 does to them
#
# Cast to fp16 as they are (scale 1), the gradients fall into the categories of notebook 01:

# %%
# NBVAL_CHECK_OUTPUT
census_table(g, "fp16", scales=[1.0])

# %% [markdown]
# Notice: 86% of all the gradients become 0 in fp16 and the rest are subnormal, kept with only a
# few significant bits; not one is a normal fp16 number. Which ones? The layer outputs' gradients:

# %%
# NBVAL_CHECK_OUTPUT
layer_table(grads.outputs, "fp16")

# %% [markdown]
# Notice: 92% to nearly all of every layer's output gradients are lost. The weights' gradients are sums
# over the batch, so they are larger (up to 7·10⁻⁶), and the cast loses fewer of them:

# %%
# NBVAL_CHECK_OUTPUT
layer_table(grads.params, "fp16")

# %% [markdown]
# Casting fp32's gradients shows the effect in its simplest form. In real fp16 training it is
# worse: the backward pass itself runs in fp16, so the layer outputs' gradients are lost on the
# way, and the weights' gradients are then computed from what is left. The same pass under real
# fp16 autocast (`torch.autocast("cpu", dtype=torch.float16)`, the loss in fp32):

# %%
# NBVAL_CHECK_OUTPUT
real = gradients(seed=0, autocast="float16")
print(f"weights' gradients that are 0: {census(grads.weights, 'fp16').fractions['underflow']:.0%} "
      f"in the cast of fp32's, {np.mean(real.weights == 0):.0%} after a real fp16 backward pass")
print(f"layer outputs' gradients that are 0 after a real fp16 backward pass: {np.mean(real.layer_outputs == 0):.0%}")

# %% [markdown]
# Notice: almost half of the weights' gradients come out as exact zeros from the real fp16
# pass, not a tenth. Those weights do not learn from this batch at all. Notebook 07 trains this
# model and shows what that costs the loss.

# %% [markdown]
# ## 3. What the paper saw
#
# This is the effect Micikevicius et al. describe in *Mixed Precision Training* (ICLR 2018,
# arXiv:1710.03740, Fig. 3): as reported there, in a histogram of a Multibox SSD detector's
# activation gradients taken during fp32 training, 67% of the values were zero. Those zeros were
# fp32's own, not values fp16 had lost. What fp16 would lose lay among the rest: values down to
# 2^-27, below fp16's smallest subnormal, had to be preserved; SSD diverged without scaling and
# matched fp32 with a [loss scale](../GLOSSARY.md#loss-scale) of 8. NVIDIA's *Mixed Precision
# Training* guide reports, for the same kind of network, that converting to fp16 made "31% of
# these values become zeros, leaving only 5.3% as non-zeros". These are their reported numbers;
# this notebook shows the mechanism on its own model, not theirs.

# %% [markdown]
# ## 4. Multiply the loss, shift every gradient
#
# Backpropagation is linear in the loss: if the loss is multiplied by S, every gradient is
# multiplied by S (chain rule). For a power of two S = 2^k this is exact, with no rounding:
# each gradient moves k places to the right on the log2 axis. Before the optimizer step, the
# gradients are divided by S again, in fp32.

# %%
# NBVAL_CHECK_OUTPUT
scaled = gradients(seed=0, loss_scale=2.0**10).all
print("backward of (loss × 2^10) == 2^10 × gradients, bit for bit:",
      np.array_equal(scaled, g * np.float32(2.0**10)))

# %% [markdown]
# So we can study any scale by multiplying `g`. Losses and subnormals at several scales:

# %%
# NBVAL_CHECK_OUTPUT
census_table(g, "fp16", scales=[2.0**k for k in (0, 4, 8, 12, 16, 20, 24)])

# %% [markdown]
# Notice: each factor of 16 in S cuts the lost share, and faster as it goes: 86% → 34% → 6% → 0.9% → 0.07%
# (at 2^16, GradScaler's starting scale), and nothing is lost from 2^24 on. The subnormal share falls
# too, so the surviving gradients also keep more precision.

# %% [markdown]
# ## 5. How far can we scale? A static S
#
# Too far, and the largest gradients overflow: fp16 rounds to inf from 65520 up. The rule of
# Micikevicius et al.: choose S so that S × max|g| < 65504. Section 1 printed max|g|; work the
# rule out before the next cell does:

# %%
# Predict: what is the largest power-of-two loss scale at which none of the gradients g overflow?
answer = None
check_safe_scale(answer, g)

# %%
# NBVAL_CHECK_OUTPUT
S = largest_safe_scale(g, "fp16")
gmax = float(np.abs(g).max())
print(f"largest safe scale: S = 2^{int(np.log2(S))} = {S:,.0f}")
print(f"S × max|g| = {S * gmax:,.0f} < 65504;  2S × max|g| = {2 * S * gmax:,.0f} ≥ 65520")

# %% [markdown]
# At S = 2^33 nothing is lost and nothing overflows. The loss itself is fp32 (autocast computes
# `mse_loss` in fp32), so S × loss never overflows; only the gradients that reach fp16 can. But
# max|g| changes from step to step as the model trains and is unknown before the backward pass:
# a static S is a guess with a margin. That is why dynamic loss scalers exist (notebook 04).

# %% [markdown]
# ## 6. One step too far: overflow
#
# At 2S, a few of the largest gradients go past 65520:

# %%
# NBVAL_CHECK_OUTPUT
census_table(g, "fp16", scales=[S, 2 * S])

# %% [markdown]
# A real fp16 backward pass agrees, to the gradient: at S every weight's gradient is finite, at 2S
# exactly the weights whose gradients the cast sends past 65520 get an inf gradient.

# %%
# NBVAL_CHECK_OUTPUT
for s in (S, 2 * S):
    run = gradients(seed=0, loss_scale=s, autocast="float16")
    w = run.weights
    cast = census(grads.weights, "fp16", s).counts["overflow"]
    print(f"scale 2^{int(np.log2(s))}: weights' gradients not finite after a real fp16 pass: "
          f"{int(np.sum(~np.isfinite(w)))} (the cast predicts {cast})")

# %% [markdown]
# Only 24 values of 84,608 became inf, and that is enough to ruin the step: after unscaling, the
# gradient norm is inf, and an optimizer step would turn those weights into ±inf (then NaN in the
# next forward pass).

# %%
# NBVAL_CHECK_OUTPUT
g16 = (torch.from_numpy(g) * (2 * S)).half()
unscaled = g16.float() / (2 * S)
print("inf gradients:", int(torch.isinf(g16).sum()), "| gradient norm after unscaling:", unscaled.norm().item())
weights = torch.full_like(unscaled, 0.5)  # any finite weights
print("weights no longer finite after one SGD step:", int((~torch.isfinite(weights - 0.1 * unscaled)).sum()))

# %% [markdown]
# `torch.amp.GradScaler`'s `unscale_` checks every scaled gradient for inf and NaN, then multiplies it
# by 1/S, all before the optimizer runs (notebook 04, section 3). If it finds one, `step` skips that
# `optimizer.step()` entirely and leaves the scale as it is; the next call, `update()`, multiplies
# the scale by `backoff_factor` (0.5 by default). After `growth_interval` clean steps (2000),
# `update()` doubles the scale again. One iteration of the real scaler on notebook 04's
# two-weight problem, with an inf put into a gradient after the backward pass, and the scale after
# each call:

# %%
# NBVAL_CHECK_OUTPUT
walk = walk_iteration(overflow=True)
for call in ("backward", "unscale_", "step", "update"):
    print(f"{walk[call].call:20} scale {number(walk[call].scale):6}  {walk[call].note}")

# %% [markdown]
# Notice: the scale is still 65536 (2^16) after `step`, which skipped the optimizer; `update()` halves
# it. Notebook 04 takes the real scaler apart, call by call.

# %% [markdown]
# ## 7. What the write-up says, measured
#
# A widely read Chinese write-up on [loss scaling](../GLOSSARY.md#loss-scaling), 《详解混合精度训练的梯度稳定性:从损失缩放原理到PyTorch/TensorFlow实战》
# (the index names no author), makes claims this lesson can run. Each row quotes one, puts it in
# English, and gives what a run on this machine found: the real `torch.amp.GradScaler("cpu")` on
# notebook 04's two-weight problem, torch's own fp16 cast, and for its TensorFlow snippet the real
# `LossScaleOptimizer` of Keras 3 (the Keras of `tf.keras` since TensorFlow 2.16), run on torch.

# %%
# NBVAL_CHECK_OUTPUT
loss_scaling_claims()

# %% [markdown]
# ## Try it
#
# Move the log2-scale slider from 0 to 35: watch the lost share (left) shrink and, past 33, the
# overflow band (right) fill. Switch the format to bf16 to see why bf16 training rarely needs a
# loss scale.

# %%
RangeExplorer(g, fmt="fp16", log2_scale=0, log2_scale_range=(-8, 36))

# %% [markdown]
# The same gradients at GradScaler's starting scale, 2^16, as a static figure:

# %%
plot_census(g, "fp16", scale=2.0**16, title="Gradients of the beam model at GradScaler's starting scale, 2^16")

# %% [markdown]
# ## Check yourself

# %%
# Another model: its largest gradient is 3e-3 and its smallest nonzero gradient 1e-9. What is
# the largest power-of-two scale at which none of its gradients overflow in fp16? (Then ask
# yourself: does that scale also keep the smallest one from becoming 0?)
answer = None
check_safe_scale(answer, np.array([3e-3, 1e-9], np.float32))

# %%
# Predict, then try it with gradients(seed=0, batch_size=1024): with a batch of 1024 instead of
# 256, does fp16 lose "more" or "fewer" of the beam model's gradients at scale 1?
answer = None
check_batch_effect(answer)

# %%
# GradScaler finds an inf among a step's gradients. What does it do with that step? (a word)
answer = None
check_overflow_action(answer)

# %%
# Why does multiplying the loss by S keep small gradients from becoming 0 in fp16? (a letter)
#   a) fp16 keeps more significant bits for larger values
#   b) the backward pass is linear in the loss, so every gradient is S times larger and lands
#      above fp16's smallest subnormal; dividing by S in fp32 undoes it
#   c) the loss itself underflows in fp16, and scaling keeps it nonzero
#   d) the scaler rounds gradients below 2^-24 up to 2^-24
answer = None
check_why_scaling_works(answer)

# %%
# Section 2: cast to fp16, a tenth of fp32's weight gradients become 0; after a real fp16 backward
# pass almost half of them are 0. Why more? (a letter)
#   a) autocast computes the loss in fp16, and the loss itself underflows
#   b) the real pass runs another batch, with smaller gradients
#   c) the weights' gradients are sums over the batch, and in fp16 those sums overflow
#   d) each weight's gradient is computed from the gradient of its layer's output, and the fp16 pass
#      has already rounded most of those to 0 on the way down
answer = None
check_why_real_pass_loses_more(answer)

# %% [markdown]
# ## Summary
#
# - fp16 flushes gradients of 2^-25 and below to zero and keeps those below 2^-14 only as
#   subnormals. Cast at scale 1, this model loses 86% of its gradients: nearly all of its layer
#   outputs' gradients, a tenth of its weights'. A real fp16 backward pass loses more, almost
#   half of the weights' gradients, because it loses the layer outputs' gradients on the way.
# - Multiplying the loss by S = 2^k multiplies every gradient by exactly 2^k, moving the whole
#   histogram k binades to the right; the optimizer unscales in fp32.
# - A static S must satisfy S × max|g| < 65504; here S = 2^33 loses nothing. One step further,
#   24 gradients become inf, in the cast and in a real fp16 pass alike, and the step must be skipped.
#
# **Next:** [03a · Autocast, measured: what runs in which dtype](03a_autocast.ipynb)
# shows which ops autocast runs in fp16 (the fp16 pass above was one), and when bf16 needs no S at
# all; then 04 takes `torch.amp.GradScaler` apart: how it finds S on its own.
#
# **Open exercises**
# 1. `census_table(g, "bf16")`: how many gradients does bf16 lose at scale 1? Why?
# 2. Measure the lost share at scale 1 for batches of 64, 256 and 1024
#    (`gradients(seed=0, batch_size=...)`). Does the largest safe scale move with the batch? Why
#    does one move and the other not?
# 3. The NVIDIA guide reports that a scale of 32K "would recover all but 0.1%" for SSD. What is
#    the smallest power of two that loses less than 0.1% of *these* gradients?
# 4. The layer outputs' gradients are about 2^5 smaller than the largest weight gradients. Why
#    would one loss scale per tensor (not one per model) help, and what would it cost?

# %% [markdown]
# The lesson's numbers for this seeded model, each census checked against torch's own cast
# (`(g * s).to(torch.float16)`, counted with torch only), with margins where a CPU's last bits
# could move a count:

# %%
for s in [2.0**k for k in (0, 4, 8, 12, 16, 20, 24)] + [S, 2 * S]:
    assert census(g, "fp16", s).counts == torch_cast_counts(g, s, "float16"), s
at_1, at_S, at_2S = (torch_cast_counts(g, s, "float16") for s in (1.0, S, 2 * S))
assert g.size == 84_608 and not np.any(g == 0)
assert 0.85 < at_1["underflow"] / g.size < 0.87 and at_1["normal"] == 0  # 86% lost at scale 1
assert all(census(v, "fp16").fractions["underflow"] > 0.9 for v in grads.outputs.values())
cast_w = census(grads.weights, "fp16").fractions["underflow"]
assert 0.09 < cast_w < 0.12 and 0.4 < np.mean(real.weights == 0) < 0.5  # a tenth vs almost half
assert 0.0005 < census(g, "fp16", 2.0**16).fractions["underflow"] < 0.001  # 0.07% at 2^16
assert census(g, "fp16", 2.0**24).counts["underflow"] == 0
assert at_S["underflow"] == at_S["overflow"] == 0  # nothing lost or inf at S = 2^33
assert S == 2.0**33 and S * gmax < 65504 and 2 * S * gmax >= 65520
assert at_2S["overflow"] == 24 and not torch.isfinite(unscaled.norm())  # 2S: inf, step ruined
assert walk["unscale_"].found_inf == {"cpu": 1.0} and walk["step"].weight.tolist() == [3.0, -4.0]  # skipped
assert [walk[c].scale for c in ("backward", "unscale_", "step", "update")] == [2.0**16] * 3 + [2.0**15]
assert step_if_pattern(2).crashed_at == 2  # the write-up's `if scaler.step(...)` test crashes
print("all claims hold")
