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
# # 12 · FP8 per-tensor scaling
#
# FP8 keeps about 18 binades; one tensor's values already span more. Each tensor therefore gets its own
# scale, from its own amax (current scaling: torchao's float8 training, and Transformer Engine's
# `Float8CurrentScaling` recipe) or from the amaxes of earlier steps (delayed scaling: Transformer
# Engine's `DelayedScaling` recipe; Transformer Engine 2.x also ships block scaling recipes). Here both
# run over a stream of 2,000 tensors with spikes, counting, value by value, what saturates and what
# becomes 0.
#
# You will be able to:
# - compute a tensor's FP8 scale from its amax, with or without a margin, and say where its values land,
# - predict what one spike does under delayed scaling with `"max"` over a long history and with
#   `"most_recent"`, and what an inf amax does to each recipe,
# - choose the format per tensor as the HYBRID recipe does: E4M3 forward, E5M2 for gradients.
#
# Teaching this lesson? The [teacher's guide](../TEACHING.md#nb12) has its timings, the answers to
# its exercises and what to demo live.
# Its words in English and Chinese (中文), each with a one-line definition: the [glossary](../GLOSSARY.md).

# %%
import numpy as np

from ampviz.formats.census import census
from ampviz.formats.fp8 import (check_current_scale, check_inf_current, check_margin_scale, check_spike_hold,
                                current_quantize, current_scale, recipe_formats, simulate_delayed,
                                simulate_fp8_scaling, tensor_stream)
from ampviz.formats import FP8_E4M3, FP8_E5M2
from ampviz.plots import format_shares, plot_fp8_scaling
from ampviz.widgets import Fp8ScalingLab

rng = np.random.default_rng(0)

# %% [markdown]
# ## 1. Why FP8 needs a scale per tensor
#
# E4M3 holds magnitudes from its smallest subnormal, 2^-9, up to 448: under 18 binades. A tensor is
# stored as `fp8(x * scale)` and read back as `data / scale`; the scale slides the tensor's values into
# that window. `tensor_stream` builds the tensors of this lesson: 4,096 values whose log2 magnitudes
# spread ~ N(0, 3²). Its first tensor, as gradients (× 2^-20) and as large activations (× 2^4), at
# scale 1 and at the scale `max / amax`:

# %%
# NBVAL_CHECK_OUTPUT
stream = tensor_stream(2000, 4096, seed=0)
x = stream.tensor(0)
print(f"E4M3 keeps {np.log2(FP8_E4M3.max / FP8_E4M3.smallest_subnormal):.1f} binades; "
      f"this tensor spans {np.log2(np.abs(x).max() / np.abs(x).min()):.1f}")
for name, t in (("gradients  ", x * np.float32(2**-20)), ("activations", x * np.float32(2**4))):
    scale = current_scale(np.abs(t).max())
    print(f"{name} at scale 1:         {format_shares(census(t, 'fp8_e4m3', scale=1.0))}")
    print(f"{name} at scale {scale:<10.4g} {format_shares(census(t, 'fp8_e4m3', scale=scale))}")

# %% [markdown]
# Notice: at scale 1 every gradient underflows (100%) and 5.4% of the activations overflow. With the
# scale from the tensor's own amax both land the same way: nothing overflows and 0.122% underflows. No
# single scale serves both tensors, hence one scale per tensor. The tensor spans 21.5 binades, more
# than E4M3 keeps, so even the best scale loses its smallest values.

# %% [markdown]
# ## 2. Current scaling and delayed scaling
#
# **Current scaling** takes the amax of the tensor being cast, then casts: torchao's
# `scale = max / max(amax, 1e-12)`. It needs the amax before the cast, one more pass over the tensor.
# **Delayed scaling** casts with a scale computed from the amaxes of *earlier* steps: the largest of the
# last `history_len` amaxes (`algo="max"`) or the last one (`"most_recent"`), `scale = max / amax / 2^margin`.
# The stream drifts slowly and has 7 spikes in which the whole tensor is 2^8 times larger:

# %%
# NBVAL_CHECK_OUTPUT
spikes = np.flatnonzero(stream.spike)
print("spikes at steps", spikes.tolist())
recipes = {"current (torchao)": dict(recipe="current"), "delayed, max over 1024": dict(history_len=1024),
           "delayed, max over 16": dict(history_len=16), "delayed, most_recent": dict(algo="most_recent")}
runs = {label: simulate_fp8_scaling(stream, **kw) for label, kw in recipes.items()}
for label, run in runs.items():
    print(f"{label:24} {run.summary()}")

# %% [markdown]
# Notice: current scaling never saturates, and loses 0.12% of the values, the tensor's smallest, at
# every step. Delayed scaling saturates at step 0 (the scale starts at 1), at spikes, and with
# `"most_recent"` also at steps where the drift rises faster than the previous step predicted. With
# Transformer Engine's default history of 1,024 steps, 1,789 of 2,000 steps lose at least 1% of their
# values to underflow: 34% on average.

# %% [markdown]
# ## 3. What a spike does
#
# The first spike, at step 204, step by step. With `"max"` over 16 steps:

# %%
# NBVAL_CHECK_OUTPUT
s = int(spikes[0])
long16 = runs["delayed, max over 16"]
print(long16.table([s - 1, s, s + 1, s + 16, s + 17]))

# %% [markdown]
# Notice: the spike step itself is cast with the old scale: 1,060 of its 4,096 values saturate at ±448.
# The next 16 steps use a scale 2^8 lower (0.3617 → 0.001495), chosen for an amax that is gone: 1,568
# values (38%) underflow at step 205, against 7 before. At step 221 the spike has left the window and
# the scale recovers. With a history of 1,024 the scale stays this low (or lower) for 1,024 steps. With `"most_recent"`:

# %%
# NBVAL_CHECK_OUTPUT
recent = runs["delayed, most_recent"]
print(recent.table([s - 1, s, s + 1, s + 2]))

# %% [markdown]
# Notice: the spike saturates the same way (1,090 values); the step after it underflows as before, but
# one step only. `"most_recent"` follows the amax closely and pays where the amax grows; `"max"` is
# safe against growth inside its window and pays for every spike `history_len` times.
#
# The figure: amax (black), the window the scale keeps (max / scale above, underflow boundary / scale
# below), the scale, and the shares lost per step:

# %%
plot_fp8_scaling(long16)

# %% [markdown]
# ## 4. An inf amax freezes the scale
#
# Transformer Engine keeps the scale when the window's amax is inf or NaN. Under `"max"` an inf stays in
# the window for `history_len` steps, so the scale is frozen that long while the tensor drifts. The same
# stream with rare inf steps (the largest value replaced by inf), history 16:

# %%
# NBVAL_CHECK_OUTPUT
stream_inf = tensor_stream(2000, 4096, seed=0, inf_prob=0.002)
bad = int(np.flatnonzero(stream_inf.nonfinite)[0])
frozen = simulate_fp8_scaling(stream_inf, history_len=16)
print(frozen.table([bad - 1, bad, bad + 1, bad + 16, bad + 17]))
print("updates that kept the scale, from step", bad, ":", int(frozen.frozen[bad:bad + 20].sum()))
for convention in ("torchao", "te"):
    cur = simulate_fp8_scaling(stream_inf, "current", convention=convention)
    print(f"current scaling ({convention}) at step {bad}: scale {cur.scale[bad]:g}, "
          f"{cur.underflowed[bad]:,} values become 0")

# %% [markdown]
# Notice: the scale stays 0.3948 for steps 522 to 537 (16 updates kept it); step 537 saturates a value
# because the amax has drifted above what the frozen scale allows. Current scaling has no memory, but
# torchao's `max / inf` is a scale of 0: every finite value of that tensor becomes 0, and the inf
# becomes NaN (0 · inf). Transformer Engine's current-scaling kernel uses scale 1 instead. Either way the
# step is lost; a loss scaler would skip it.

# %% [markdown]
# ## 5. The margin trades saturation for underflow
#
# `margin` divides every scale by 2^margin: headroom for an amax that grows before the scale catches up.
# `"most_recent"`, where drift saturates:

# %%
# NBVAL_CHECK_OUTPUT
for margin in range(4):
    run = simulate_fp8_scaling(stream, algo="most_recent", margin=margin)
    print(f"margin {margin}: {run.summary()}")

# %% [markdown]
# Notice: margin 1 removes every saturation from drift (17 steps → 8: step 0 and the 7 spikes, which no
# margin up to 3 absorbs) and doubles the share underflowed (0.27% → 0.54%). Margin 3 pushes
# the smallest 1% of every tensor into underflow: 1,992 steps lose at least 1%.

# %% [markdown]
# ## 6. HYBRID: E4M3 forward, E5M2 for gradients
#
# E5M2 has one mantissa bit fewer than E4M3 but 14 more binades (57344 down to 2^-16). Transformer
# Engine's default recipe, `Format.HYBRID`, casts activations and weights to E4M3 and gradients, whose
# range is wider and spikier, to E5M2:

# %%
# NBVAL_CHECK_OUTPUT
print("HYBRID:", [f.name for f in recipe_formats("HYBRID")])
for f in (FP8_E4M3, FP8_E5M2):
    span = np.log2(f.max / f.smallest_subnormal)
    run = simulate_fp8_scaling(stream, history_len=1024, fmt=f)
    print(f"{f.name} ({span:.1f} binades), delayed max over 1024: {run.summary()}")

# %% [markdown]
# Notice: the same held-down scale that costs E4M3 34% of the values costs E5M2 nothing measurable
# (0.00%): its window is wide enough for the tensor's 21.5 binades plus the spike's 8.

# %% [markdown]
# ## Try it
#
# The lab opens at the settings of section 3's figure (delayed, max over 16), which is its static twin.
# Switch the recipe, shorten the history, change the algo, the margin, the format, the spike size, add
# inf or NaN steps. The readout counts the steps that saturate and those that lose at least 1% to
# underflow.

# %%
Fp8ScalingLab(history_len=16)

# %% [markdown]
# ## Check yourself

# %%
# Delayed scaling, history_len=16, algo="max". The amax is flat except one step that is 2^8 times
# larger. For how many steps after the spike is the scale 2^8 lower?
answer = None
check_spike_hold(answer)

# %%
# torchao's current scaling, E4M3. A tensor's amax is 3.5: what is its scale?
answer = None
check_current_scale(answer)

# %%
# torchao's current scaling: one value of a tensor is inf, the others are finite.
# What share of the finite values becomes 0? (a fraction, or "100%")
answer = None
check_inf_current(answer)

# %%
# Delayed scaling, E4M3, margin=1: the window's amax is 3.5. What scale does the next step use?
answer = None
check_margin_scale(answer)

# %% [markdown]
# ## Summary
#
# - FP8 keeps 17.8 (E4M3) or 31.8 (E5M2) binades; a scale per tensor, `max / amax`, slides each
#   tensor's values into that window.
# - Current scaling (torchao's float8 training; Transformer Engine's `Float8CurrentScaling`) uses the
#   tensor's own amax: it never saturates, at the price of an amax pass before every cast.
# - Delayed scaling (Transformer Engine's `DelayedScaling`) uses earlier amaxes. A spike saturates at its own step; under
#   `"max"` it then holds the scale 2^k low for `history_len` steps (underflow), under `"most_recent"`
#   for one step, and drift can saturate.
# - An inf amax freezes a delayed scale for `history_len` steps; torchao's current scale becomes 0 and
#   the whole tensor 0 (the inf NaN).
# - `margin` buys headroom against growth, paid in underflow; E5M2's range absorbs what E4M3 cannot,
#   hence HYBRID: E5M2 for gradients.
#
# **Next:** [13 · MX and NVFP4 block scaling](13_mx_and_nvfp4.ipynb) gives a scale to every block of
# 16 or 32 values instead of one per tensor: what an outlier costs its block, E8M0 and E4M3 block
# scales, and every format's error on a real layer at equal bits.
#
# **Open exercises**
# 1. In the lab, find the shortest history for which `"max"` saturates no more steps than it does at
#    1,024. What does that say about how fast the drift can move?
# 2. Run `simulate_fp8_scaling(stream, "current", round_to_power_of_2=True)` (torchao's rowwise
#    recipe rounds scales down to powers of two). How much more underflows, and why can a power-of-two
#    scale never add rounding error of its own?
# 3. Make spikes of 2^14 (`tensor_stream(2000, 4096, seed=0, spike_log2=14)`). Which recipe and
#    history keep the mean underflow under 1% in E4M3? In E5M2?
# 4. Transformer Engine's CUDA kernel drops NaN amaxes from the window (`convention="cuda"`). Compare
#    it with the Python update on `tensor_stream(2000, 4096, seed=0, nan_prob=0.002)`: which freezes?

# %% [markdown]
# The lesson's claims, checked against the simulator (itself held to torch's float8 casts, torchao and a
# port of Transformer Engine's update in `tests/formats/test_fp8.py`):

# %%
g, act = x * np.float32(2**-20), x * np.float32(2**4)
assert round(float(np.log2(FP8_E4M3.max / FP8_E4M3.smallest_subnormal)), 1) == 17.8
assert round(float(np.log2(FP8_E5M2.max / FP8_E5M2.smallest_subnormal)), 1) == 31.8
assert round(float(np.log2(np.abs(x).max() / np.abs(x).min())), 1) == 21.5
assert census(g, "fp8_e4m3", scale=1.0).fractions["underflow"] == 1
assert round(census(act, "fp8_e4m3", scale=1.0).fractions["overflow"], 3) == 0.054
for t in (g, act):
    r = census(t, "fp8_e4m3", scale=current_scale(np.abs(t).max()))
    assert r.fractions["overflow"] == 0 and round(r.fractions["underflow"], 5) == 0.00122
assert spikes.size == 7 and s == 204 and (stream.magnitude[spikes] / stream.magnitude[spikes - 1] > 200).all()
cur, d1024, d16, mr = runs.values()
assert cur.saturated_steps == 0 and round(cur.underflowed_share.mean(), 4) == 0.0012
assert (cur.underflowed == 5).all() and round(5 / 4096, 4) == 0.0012  # the same 5 smallest values, every step
assert d1024.saturated[0] > 0 and all(r.saturated[spikes[0]] > 0 for r in (d1024, d16, mr))
assert int((d1024.underflowed_share >= 0.01).sum()) == 1789 and round(d1024.underflowed_share.mean(), 2) == 0.34
assert mr.saturated_steps == 17 and d16.saturated_steps == 9
assert {0, *spikes.tolist()} <= set(np.flatnonzero(mr.saturated))
assert d16.saturated[s] == 1060 and d16.underflowed[s + 1] == 1568 and d16.underflowed[s - 1] == 7
assert round(d16.underflowed_share[s + 1], 2) == 0.38
assert round(float(d16.scale[s]), 4) == 0.3617 and round(float(d16.scale[s + 1]), 6) == 0.001495
assert d16.scale[s] / d16.scale[s + 1] > 200 and (d16.scale[s + 1:s + 17] == d16.scale[s + 1]).all()
assert d16.scale[s + 17] > d16.scale[s + 1] * 200 and d16.scale[s + 17] == d16.scale[221]
assert (d1024.scale[s + 1:s + 1025] <= d1024.scale[s + 1]).all()
assert mr.saturated[s] == 1090 and mr.underflowed[s + 1] == 1568 and mr.underflowed[s + 2] < 10
assert bad == 521 and (frozen.scale[bad:bad + 17] == frozen.scale[bad]).all()
assert frozen.scale[bad + 17] != frozen.scale[bad]
assert round(float(frozen.scale[bad]), 4) == 0.3948 and int(frozen.frozen[bad:bad + 20].sum()) == 16
assert frozen.saturated[bad + 16] == 1 and bad + 16 == 537
cur_ao = simulate_fp8_scaling(stream_inf, "current")
assert cur_ao.scale[bad] == 0 and cur_ao.underflowed[bad] == 4095
assert np.isnan(current_quantize(stream_inf.tensor(bad)).data).sum() == 1
assert simulate_fp8_scaling(stream_inf, "current", convention="te").scale[bad] == 1
margins = [simulate_fp8_scaling(stream, algo="most_recent", margin=m) for m in range(4)]
assert [m.saturated_steps for m in margins] == [17, 8, 8, 8]
assert all(np.flatnonzero(m.saturated).tolist() == [0, *spikes.tolist()] for m in margins[1:])
assert [round(m.underflowed_share.mean(), 4) for m in margins[:2]] == [0.0027, 0.0054]
assert int((margins[3].underflowed_share >= 0.01).sum()) == 1992
e5 = simulate_fp8_scaling(stream, history_len=1024, fmt=FP8_E5M2)
assert round(e5.underflowed_share.mean(), 4) == 0.0 and 21.5 + 8 < 31.8
assert FP8_E4M3.mantissa_bits - FP8_E5M2.mantissa_bits == 1
assert simulate_delayed(stream.amax, history_len=16).scale.tolist() == d16.scale.tolist()
print("all claims hold")
