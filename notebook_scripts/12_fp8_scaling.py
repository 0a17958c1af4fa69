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
# FP8 E4M3 keeps under 18 binades. A tensor's values can span more (a real layer's gradient here
# spans about 25), though many do not (an N(0, 1) tensor of 4,096 values spans about 14). Each tensor
# gets its own scale, from its own [amax](../GLOSSARY.md#amax) (current scaling: torchao's float8 training, and Transformer
# Engine's `Float8CurrentScaling` recipe) or from the amaxes of earlier steps ([delayed scaling](../GLOSSARY.md#delayed-scaling):
# Transformer Engine's `DelayedScaling` recipe; Transformer Engine 2.x also ships block scaling
# recipes, lesson 13's subject). Here both run over three streams of 2,000 tensors with spikes (a wide
# synthetic one, a Gaussian one and a real layer's gradient), counting, value by value, what saturates
# and what becomes 0, and measuring the error of the round trip.
#
# You will be able to:
# - compute a tensor's FP8 scale from its amax, with or without a margin, and say where its values land,
# - predict what one spike does under delayed scaling with `"max"` over a long history and with
#   `"most_recent"`, and what an inf amax does to each recipe,
# - tell the share of values a recipe loses from the error it adds (the RMS error), and say which
#   streams each number holds for,
# - choose the format per tensor as the HYBRID recipe does: E4M3 forward, E5M2 for gradients.
#
# Teaching this lesson? The [teacher's guide](../TEACHING.md#nb12) has its timings, the answers to
# its exercises and what to demo live.
# Its words in English and Chinese (中文), each with a one-line definition: the [glossary](../GLOSSARY.md).

# %%
import numpy as np
import torch

from ampviz.formats.census import census
from ampviz.formats.fp8 import (check_current_scale, check_inf_current, check_margin_scale, check_spike_hold,
                                check_why_fp8_delayed_saturates, check_why_fp8_hybrid_formats,
                                check_why_fp8_margin_trades, current_quantize, current_scale, recipe_formats,
                                recipe_table, rms_errors, simulate_delayed, simulate_fp8_scaling, tensor_stream)
from ampviz.formats import FP8_E4M3, FP8_E5M2
from ampviz.plots import format_shares, plot_fp8_scaling
from ampviz.training.live import trained_parameter
from ampviz.widgets import Fp8ScalingLab

rng = np.random.default_rng(0)
_ = torch.manual_seed(0)
torch.set_num_threads(1)

# %% [markdown]
# ## 1. Why FP8 needs a scale per tensor
#
# E4M3 holds magnitudes from its smallest subnormal, 2^-9, up to 448: under 18 binades. A tensor is
# stored as `fp8(x * scale)` and read back as `data / scale`; the scale slides the tensor's values into
# that window. `tensor_stream` builds the lesson's synthetic tensors: 4,096 values whose log2
# magnitudes spread ~ N(0, 3²), wider than most real tensors, which makes the losses easy to see. Its
# first tensor, as gradients (× 2^-20) and as large activations (× 2^4), at scale 1 and at the scale
# `max / amax`:

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
# single scale serves both tensors, hence one scale per tensor ([per-tensor scaling](../GLOSSARY.md#per-tensor-scaling)). The tensor spans 21.5 binades, more
# than E4M3 keeps, so even the best scale loses its smallest values.
#
# The lesson runs three streams. Each steps one tensor of 4,096 values through the same slow drift and
# the same spikes: the **synthetic** tensor above, a **Gaussian** one (N(0, 1) values), and a **real
# gradient**: the gradient of the course MLP's fourth layer after 100 float32 training steps (the
# layer lesson 13 uses). How wide each is:

# %%
# NBVAL_CHECK_OUTPUT
gradient = trained_parameter("mlp", "fc4.weight", steps=100)["gradient"]
streams = {"synthetic": stream, "Gaussian": tensor_stream(2000, 4096, seed=0, base="normal"),
           "real gradient": tensor_stream(2000, seed=0, base=gradient)}
for name, st in streams.items():
    a = np.abs(st.base[st.base != 0])
    span = np.log2(a.max() / a.min())
    # the real gradient's smallest values are sums that nearly cancel: their digits, and the span's
    # decimal, move from one CPU to another
    span = f"{span:.1f}" if name != "real gradient" else f"about {span:.0f}"
    print(f"{name:13}: {a.size:,} nonzero values, largest / RMS {a.max() / np.sqrt(np.mean(st.base**2)):.1f}, "
          f"spanning {span} binades")

# %% [markdown]
# Notice: the Gaussian tensor spans 13.8 binades and fits E4M3's 17.8 with room to spare. The real
# gradient spans about 25: a third of its values are exactly 0 (ReLU's zeros, 16 whole rows and 4
# whole columns among them), and the others reach far below its largest. The synthetic tensor, 21.5,
# lies between them. Every number below says which stream it comes from.

# %% [markdown]
# ## 2. Current scaling and delayed scaling
#
# **Current scaling** takes the amax of the tensor being cast, then casts: torchao's
# `scale = max / max(amax, 1e-12)`. It needs the amax before the cast, one more pass over the tensor.
# **Delayed scaling** casts with a scale computed from the amaxes of *earlier* steps: the largest of the
# last `history_len` amaxes (`algo="max"`) or the last one (`"most_recent"`), `scale = max / amax / 2^margin`.
# Each stream drifts slowly and has 7 spikes, at the same steps, in which the whole tensor is 2^8
# times larger. Four recipes on each: the steps that saturate, the steps that lose at least 1% of
# their values to underflow, the mean share underflowed, and the relative RMS error of the FP8 round
# trip, RMS(fp8 round trip − x) / RMS(x), a mean over the steps:

# %%
# NBVAL_CHECK_OUTPUT
spikes = np.flatnonzero(stream.spike)
print("spikes at steps", spikes.tolist())
recipes = {"current": dict(recipe="current"), "delayed, max over 1024": dict(history_len=1024),
           "delayed, max over 16": dict(history_len=16), "delayed, most_recent": dict(algo="most_recent")}
print(recipe_table(streams, recipes))
runs = {label: simulate_fp8_scaling(stream, **kw) for label, kw in recipes.items()}  # synthetic, for below

# %% [markdown]
# Notice: current scaling never saturates, on any stream. At every step it loses the synthetic
# tensor's 5 smallest values (0.12%), the real gradient's 4 (0.10%), none of the Gaussian's.
# Delayed scaling saturates at step 0 (the scale starts at 1), at spikes, and with `"most_recent"`
# also at steps where the drift rises faster than the previous step predicted. With Transformer
# Engine's default history of 1,024 steps the scale stays 2^8 low from the first spike on (later
# spikes keep it there): 1,789 of the synthetic stream's 2,000 steps lose at least 1% of their values
# to underflow, 34% on average; 1,790 of the real gradient's, 3.03% on average; none of the Gaussian
# stream's, 0.22%. The RMS error moves far less: 2.57% → 2.77% (synthetic), 2.63% → 2.74% (real
# gradient), 2.67% → 2.69% (Gaussian). The values that underflow are the smallest, and weigh little
# in an RMS. A spike step cast with a scale set before the spike loses most of its RMS (97% to 99%),
# and those few steps lift the delayed recipes' means: the share underflowed counts values, the RMS
# error weighs each by its size.

# %% [markdown]
# ## 3. What a spike does
#
# The first spike, at step 204, step by step, on the synthetic stream, with `"max"` over 16 steps
# (below the table: the same steps on the two other streams):

# %%
# NBVAL_CHECK_OUTPUT
s = int(spikes[0])
long16 = runs["delayed, max over 16"]
print(long16.table([s - 1, s, s + 1, s + 16, s + 17]))
for name in ("Gaussian", "real gradient"):
    other = simulate_fp8_scaling(streams[name], history_len=16)
    print(f"{name}: step {s} saturates {other.saturated[s]:,} values, step {s + 1} underflows "
          f"{other.underflowed[s + 1]:,} (step {s - 1}: {other.underflowed[s - 1]:,})")

# %% [markdown]
# Notice: the spike step itself is cast with the old scale: 1,060 of its 4,096 values saturate at ±448.
# The next 16 steps use a scale 2^8 lower (0.3617 → 0.001495), chosen for an amax that is gone: 1,568
# values (38%) underflow at step 205, against 7 before. At step 221 the spike has left the window and
# the scale recovers. With a history of 1,024 the scale stays this low (or lower) for 1,024 steps.
# The Gaussian tensor loses 9 values at step 205: 8 binades lower, it still fits. Its spike step
# saturates nearly all of it (4,049 values: they lie close to its amax); the real gradient's, 2,166.
# With `"most_recent"`:

# %%
# NBVAL_CHECK_OUTPUT
recent = runs["delayed, most_recent"]
print(recent.table([s - 1, s, s + 1, s + 2]))

# %% [markdown]
# Notice: the spike saturates the same way (1,090 values); the step after it underflows as before, but
# one step only. `"most_recent"` follows the amax closely and pays where the amax grows; `"max"` is
# safe against growth inside its window and pays for every spike `history_len` times.
#
# The figure: amax (black), the window the scale keeps (max / scale above, in vermillion; underflow
# boundary / scale below, in grey), the scale (green), and the shares of each step's values saturated
# (orange), underflowed (blue) and subnormal (olive):

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
# `"most_recent"`, where drift saturates, on the three streams:

# %%
# NBVAL_CHECK_OUTPUT
print(recipe_table(streams, {f"most_recent, margin {m}": dict(algo="most_recent", margin=m) for m in range(4)}))

# %% [markdown]
# Notice: margin 1 removes every saturation from drift: 17 steps → 8 on the synthetic stream (step 0
# and the 7 spikes, which no margin up to 3 absorbs), 16 → 7 on the two others. The price is
# underflow: margin 1 doubles the share underflowed on the synthetic stream (0.27% → 0.54%) and on the
# real gradient (0.14% → 0.31%); the Gaussian stream has binades to spare and loses nothing
# measurable. Margin 3 pushes the synthetic tensor's smallest 1% into underflow at every step (1,992
# steps lose at least 1%). The RMS error falls a little with each margin (2.94% → 2.91% on the
# synthetic stream): the values a margin flushes are the smallest, and its headroom also softens the
# spike steps, which still saturate, but fewer of their values.

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
    print(f"{f.name}: {np.log2(f.max / f.smallest_subnormal):.1f} binades, {f.mantissa_bits} mantissa bits")
print(recipe_table(streams, {f"{f.name}, {label}": dict(kw, fmt=f) for label, kw in
                             (("current", dict(recipe="current")), ("delayed, max over 1024", dict(history_len=1024)))
                             for f in (FP8_E4M3, FP8_E5M2)}))

# %% [markdown]
# Notice: the held-down scale that costs E4M3 34% of the synthetic stream's values costs E5M2 nothing
# measurable (0.00%): its window is wide enough for the tensor's 21.5 binades plus the spike's 8. The
# price is precision: with one mantissa bit fewer, E5M2's RMS error is 1.7 to 2.1 times E4M3's
# (current scaling: 2.57% → 4.44% on the synthetic stream, 2.67% → 5.36% on the Gaussian one,
# 2.63% → 5.56% on the real gradient). Range where a tensor needs it, a finer step where one scale
# covers its range: E5M2 for the gradients, E4M3 forward.

# %% [markdown]
# ## Try it
#
# The lab runs the synthetic stream. It opens at the settings of section 3's figure (delayed, max over
# 16), which is its static twin.
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

# %%
# Section 3: under delayed scaling the spike step saturates 1,060 of its 4,096 values; current scaling
# saturates no value at any step. Why? (a letter)
#   a) delayed scaling's history is too short: a longer history would have remembered a spike that size
#   b) delayed scaling casts each step with a scale computed from earlier steps' amaxes, 2^8 too high
#      for the spike; current scaling computes the scale from the spike's own amax before the cast
#   c) current scaling does not clamp: its largest values become inf instead of being held at ±448
#   d) the spike widens the tensor's span past what E4M3 keeps, and only current scaling can cover it
answer = None
check_why_fp8_delayed_saturates(answer)

# %%
# HYBRID casts activations and weights to E4M3 and gradients to E5M2. Why this split? (a letter)
#   a) gradients need E5M2's inf to detect an overflow and skip the step, as a loss scaler does
#   b) gradients are smaller numbers than activations, and E5M2 reaches smaller numbers
#   c) E5M2 keeps 14 more binades, room for the gradients' wider and spikier range; E4M3 keeps one more
#      mantissa bit, a finer step, for the forward tensors
#   d) E5M2 rounds more finely than E4M3, and gradients need the precision
answer = None
check_why_fp8_hybrid_formats(answer)

# %%
# Section 5, synthetic stream: margin 1 removes the saturations that drift causes, and doubles the
# share of values underflowed. Why both? (a letter)
#   a) margin widens E4M3's window by a binade at the top
#   b) margin smooths the amax history, so the scale reacts to the drift more slowly
#   c) margin divides the scale by 2^margin: the window slides down a binade, which leaves a binade of
#      headroom above the amax and drops the binade at its bottom below the smallest subnormal
#   d) margin rounds the scale down to a power of two
answer = None
check_why_fp8_margin_trades(answer)

# %% [markdown]
# ## Summary
#
# - FP8 keeps 17.8 (E4M3) or 31.8 (E5M2) binades; a scale per tensor, `max / amax`, slides each
#   tensor's values into that window. An N(0, 1) tensor of 4,096 values spans 13.8 binades, the
#   lesson's real gradient about 25, its synthetic tensor 21.5.
# - Current scaling (torchao's float8 training; Transformer Engine's `Float8CurrentScaling`) uses the
#   tensor's own amax: it never saturates, at the price of an amax pass before every cast.
# - Delayed scaling (Transformer Engine's `DelayedScaling`) uses earlier amaxes. A spike saturates at
#   its own step (an RMS error of 97% to 99% for a ×2^8 spike); under `"max"` it then holds the scale 2^k low for
#   `history_len` steps, under `"most_recent"` for one step, and drift can saturate. The held-down
#   scale flushes the smallest values (over 1,024 steps: 34% of the synthetic stream's, 3% of the
#   real gradient's, 0.2% of the Gaussian's) and barely moves the RMS error: the share underflowed
#   counts values, the RMS error weighs them by size.
# - An inf amax freezes a delayed scale for `history_len` steps; torchao's current scale becomes 0 and
#   the whole tensor 0 (the inf NaN).
# - `margin` buys headroom against growth, paid in underflow; E5M2's range absorbs what E4M3 cannot, at
#   about twice E4M3's RMS error, hence HYBRID: E5M2 for gradients, E4M3 forward.
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
# the three streams: one drift and the same spikes, three tensors
gauss, real = streams["Gaussian"], streams["real gradient"]
assert all(np.array_equal(st.magnitude, stream.magnitude) for st in (gauss, real)) and real.size == 4096
nonzero = {k: np.abs(st.base[st.base != 0]) for k, st in streams.items()}
spans = {k: float(np.log2(a.max() / a.min())) for k, a in nonzero.items()}
assert round(spans["synthetic"], 1) == 21.5 and round(spans["Gaussian"], 1) == 13.8
assert 24.5 < spans["real gradient"] < 25.5
assert spans["Gaussian"] < 17.8 < spans["synthetic"] < spans["real gradient"]
zeros = gradient == 0
assert round(zeros.mean(), 2) == 0.34 and zeros.all(axis=1).sum() == 16 and zeros.all(axis=0).sum() == 4
by = {(k, label): simulate_fp8_scaling(st, **kw) for k, st in streams.items() for label, kw in recipes.items()}
err = {key: rms_errors(streams[key[0]], run) for key, run in by.items()}
mean_err = {key: f"{100 * np.nanmean(e):.3g}%" for key, e in err.items()}
assert all(by[k, "current"].saturated_steps == 0 for k in streams)
assert [int(by[k, "current"].underflowed.max()) for k in streams] == [5, 0, 4]
assert [int(by[k, "current"].underflowed.min()) for k in streams] == [5, 0, 4]
assert [int((by[k, "delayed, max over 1024"].underflowed_share >= 0.01).sum()) for k in streams] == [1789, 0, 1790]
assert [f"{by[k, 'delayed, max over 1024'].underflowed_share.mean():.2%}" for k in streams] == \
    ["34.18%", "0.22%", "3.03%"]
assert [mean_err[k, r] for k in streams for r in ("current", "delayed, max over 1024")] == \
    ["2.57%", "2.77%", "2.67%", "2.69%", "2.63%", "2.74%"]
assert (d1024.scale[s + 1:] < d1024.scale[s] / 128).all()  # 2^8 low from the first spike on
# the spike steps cast with a scale set before the spike: every spike over 16 and most_recent, the first over 1024
spike_err = np.concatenate([err[k, r][spikes[by[k, r].amax[spikes] * by[k, r].scale[spikes] > 2**7 * 448]]
                            for k in streams for r in recipes if r != "current"])
assert spike_err.size == 3 * 15 and 0.97 < spike_err.min() and spike_err.max() < 0.99
assert all(by[k, r].saturated[spikes[0]] > 0 for k in streams for r in recipes if r != "current")
assert all(np.nanmax(err[k, "current"]) < 0.03 for k in streams)
d16g, d16r = by["Gaussian", "delayed, max over 16"], by["real gradient", "delayed, max over 16"]
assert (d16g.saturated[s], d16g.underflowed[s + 1], d16r.saturated[s], d16r.underflowed[s + 1]) == (4049, 9, 2166, 135)
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
for k in ("Gaussian", "real gradient"):
    runs_k = [simulate_fp8_scaling(streams[k], algo="most_recent", margin=m) for m in range(4)]
    assert [r.saturated_steps for r in runs_k] == [16, 7, 7, 7]
real_m = [simulate_fp8_scaling(real, algo="most_recent", margin=m) for m in range(4)]
assert [f"{m.underflowed_share.mean():.2%}" for m in real_m[:2]] == ["0.14%", "0.31%"]
assert all(simulate_fp8_scaling(gauss, algo="most_recent", margin=m).underflowed_share.mean() < 5e-5 for m in range(4))
margin_err = [np.nanmean(rms_errors(stream, m)) for m in margins]
assert all(a >= b for a, b in zip(margin_err, margin_err[1:]))
assert [f"{100 * e:.3g}%" for e in margin_err[::3]] == ["2.94%", "2.91%"]
assert all(margins[3].saturated[i] < margins[0].saturated[i] for i in spikes)
assert all(np.flatnonzero(m.saturated).tolist() == [0, *spikes.tolist()] for m in margins[1:])
assert [round(m.underflowed_share.mean(), 4) for m in margins[:2]] == [0.0027, 0.0054]
assert int((margins[3].underflowed_share >= 0.01).sum()) == 1992
e5 = simulate_fp8_scaling(stream, history_len=1024, fmt=FP8_E5M2)
assert round(e5.underflowed_share.mean(), 4) == 0.0 and 21.5 + 8 < 31.8
e4_cur = [np.nanmean(err[k, "current"]) for k in streams]
e5_cur = [np.nanmean(rms_errors(st, simulate_fp8_scaling(st, "current", fmt=FP8_E5M2))) for st in streams.values()]
assert [f"{100 * e:.3g}%" for e in e5_cur] == ["4.44%", "5.36%", "5.56%"]
assert all(1.7 <= b / a < 2.15 for a, b in zip(e4_cur, e5_cur))
assert FP8_E4M3.mantissa_bits - FP8_E5M2.mantissa_bits == 1
assert simulate_delayed(stream.amax, history_len=16).scale.tolist() == d16.scale.tolist()
print("all claims hold")
