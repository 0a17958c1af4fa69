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
# # 06 · The scaling lab: dynamic loss scalers under pressure
#
# Steady, spiky and exploding gradients, and what the loss scalers of torch, DeepSpeed, Megatron,
# NeMo, Keras and JAX (and four legacy ones) do with them.
#
# You will be able to:
# - tell a harmless overflow sawtooth from a scale that ratchets down, and say why it ratchets,
# - predict how hysteresis, floors and a minimum-scale error change a run, framework by framework,
# - read "Gradient overflow. Skipping step" lines in a log and decide whether to worry.
#
# Teaching this lesson? The [teacher's guide](../TEACHING.md#nb06) has its timings, the answers to
# its exercises and what to demo live.
# Its words in English and Chinese (中文), each with a one-line definition: the [glossary](../GLOSSARY.md).

# %%
import numpy as np

from ampviz.scaling import synth
from ampviz.scaling.lesson import (check_hysteresis_skips, check_log_verdict, check_scale_direction,
                                   check_steady_interval, check_why_one_skip_per_interval,
                                   check_why_sawtooth_is_harmless, trace_table)
from ampviz.plots import plot_scale_trace
from ampviz.scaling.scalelog import diagnose, read_log, scale_lines, write_log
from ampviz.scaling import LEGACY, PRESETS, ApexHysteresisScaler, DeepSpeedZeroScaler, TorchGradScaler, simulate
from ampviz.widgets import ScalerLab

rng = np.random.default_rng(0)

# %% [markdown]
# ## 1. The sawtooth: one skipped step per growth interval
#
# Notebook 04 took `torch.amp.GradScaler` apart. Now we run its rule (`TorchGradScaler`, bit for
# bit the same) over long streams. Each step, the stream gives the largest unscaled gradient that
# passes through an fp16 layer. Autocast computes the loss in float32 (`mse_loss`,
# `cross_entropy`), so the scaled gradient `scale × g` is computed in float32 and overflows when
# it reaches 65520 on its way into fp16 (`simulate`'s default, `loss_dtype="float32"`; a test
# replays a real 400-step GradScaler run with it, step for step). First, steady gradients around
# 2^-4:

# %%
# NBVAL_CHECK_OUTPUT
steady = synth.steady(20_000, level=2.0**-4, jitter=0.5, rng=rng)
sawtooth = simulate(TorchGradScaler(), grad_max=steady)
print(trace_table([sawtooth]))
print()
print(write_log(sawtooth))

# %% [markdown]
# Notice: at 2^16 = 65536 even the largest gradients (up to about 0.25) give about 16,000, far
# from 65520, so nothing overflows. Every 2,000 clean steps the scale doubles; at 2^19 a
# gradient of 1/8 or more reaches 65520, that step is skipped and the scale halves to 2^18. From then on
# the cycle repeats: the scale climbs back to 2^19 and overflows once per 2,000 steps or so,
# each time logged by apex as "Gradient overflow. Skipping step" (torch itself prints nothing,
# section 5). That is the scaler doing its job: it keeps the scale as high as the gradients
# allow.
#
# A loss computed in fp16 is different (a `.half()` model, or a loss autocast leaves in fp16,
# such as `out.sum()` of an fp16 output): the backward starts from the scale cast to fp16, and
# 2^16 is already inf in fp16 (everything from 65520 up is). The same stream with
# `loss_dtype="float16"`:

# %%
# NBVAL_CHECK_OUTPUT
fp16_loss = simulate(TorchGradScaler(), grad_max=steady, loss_dtype="float16")
print(f"first step skipped: {bool(fp16_loss.skipped[0])}, {fp16_loss.skipped_count} skipped in all, "
      f"highest scale {fp16_loss.scale.max():g}, final {fp16_loss.final.scale:g}")

# %% [markdown]
# Notice: with an fp16 loss the first step overflows whatever the gradients, and every return
# to 65536 overflows again: the scale can never rise above 32,768, one skipped step per growth
# interval. Which loss you have decides which sawtooth you see.

# %%
plot_scale_trace(sawtooth, title="Steady gradients: the harmless sawtooth")

# %% [markdown]
# ## 2. The ratchet: overflows faster than the scale grows back
#
# Now a spike every 500 steps so large that it overflows at any scale (an inf or NaN in one
# batch, from the forward pass: no scale makes it finite), 20 spikes in 10,000 steps, with torch's
# `growth_interval` of 2,000. Predict first:

# %%
# Predict: growth_interval is 2000 and an overflow comes every 500 steps. Does torch's scale go "up" or "down"?
answer = None
check_scale_direction(answer)

# %% [markdown]
# Each spike halves the scale; growth needs 2,000 clean steps in a row, and the next spike always
# comes first:

# %%
# NBVAL_CHECK_OUTPUT
spikes = synth.found_inf_every(10_000, 500, offset=250)
ratchet = simulate(TorchGradScaler(), found_inf=spikes)
print(trace_table([ratchet]))
print(diagnose(read_log(write_log(ratchet))))

# %% [markdown]
# Notice: 20 halvings take 2^16 to 2^-4 = 0.0625, and nothing ever brings it back. `diagnose`
# calls the result a collapse: below 1 the scale no longer protects small gradients at all, it
# makes underflow *worse*.
#
# That only happens because these overflows do not depend on the scale. Most overflows do: a
# spike of large but finite gradients (here 4, 64 times the usual 2^-4, every 500 steps, for
# 30,000 steps) overflows only while scale × 4 reaches 65520, and backing off removes the cause:

# %%
# NBVAL_CHECK_OUTPUT
big = synth.spikes(30_000, level=2.0**-4, jitter=0.0, every=500, height=2.0**6, offset=250, rng=rng)
settled = simulate(TorchGradScaler(), grad_max=big)
print(trace_table([settled]))
print("skipped at steps:", ", ".join(map(str, np.flatnonzero(settled.skipped)[:6])), "...")
print(diagnose(read_log(write_log(settled))))

# %% [markdown]
# Notice: three spikes in a row overflow (at 2^16, 2^15 and 2^14: 4 × 2^14 = 65536 is already
# past 65520), and from 2^13 on the spikes fit. The scale settles: it grows back to 2^14 after
# 2,000 clean steps, the next spike sends it to 2^13 again, and it saws between the two: one
# skipped step per 2,500 steps. (`diagnose` needs a long enough log for this verdict: the first
# messages, while the scale comes down, look like a ratchet.) So the
# rule of thumb: if overflows that *no scale avoids* come more often than once per
# `growth_interval`, the scale can only go down. Then the fix is not in the scaler: find what
# makes those steps overflow (a NaN or inf loss, a bad batch, a learning rate that is too high, a
# layer whose forward pass exceeds fp16's range).

# %% [markdown]
# ## 3. Hysteresis, floors and errors: four answers to the same spikes
#
# Other frameworks' scalers differ exactly here. **Hysteresis** tolerates some overflows before
# backing off (NeMo refills it on every clean step; DeepSpeed and Megatron only at growth). A
# **floor** stops the fall; DeepSpeed ZeRO instead **raises an error** at an overflow that finds
# the scale already at its minimum. The same 20 spikes:

# %%
# NBVAL_CHECK_OUTPUT
contenders = [TorchGradScaler(), ApexHysteresisScaler(init_scale=2.0**16),
              PRESETS["DeepSpeed ZeRO"], PRESETS["Megatron"]]
spike_runs = [simulate(p, found_inf=spikes) for p in contenders]
trace_table(spike_runs)

# %% [markdown]
# Notice:
# - NeMo's hysteresis (2, refilled on every clean step) absorbs every isolated spike: it skips
#   the step and keeps the scale at 65536.
# - DeepSpeed ZeRO's hysteresis is refilled only at growth, so after the first spike it backs
#   off like torch, down to its minimum of 1, and the next spike ends the run (step 8,750).
# - Megatron starts at 2^32 and never goes below its floor of 1; here it ends at 8192.
#
# Hysteresis is not free: on a stream where overflows come in runs, it skips one extra step per
# run. Section 4 shows that cost.
#
# A run that ends, ends with an exception. Each trace names it: DeepSpeed ZeRO's here, and apex
# amp's after overflows at every step (apex amp has no floor by default, and it divides the
# gradients by the scale):

# %%
# NBVAL_CHECK_OUTPUT
zero = spike_runs[2]
apex = simulate(PRESETS["apex amp"], found_inf=np.ones(1200, bool))
for run in (zero, apex):
    print(f"{run.policy.name} stopped at step {run.stopped_at:,} (scale {run.scale[run.stopped_at]:g}): "
          f"{run.stop_reason}")

# %% [markdown]
# Notice: apex amp halves 2^16 to exactly 0 in 1,091 backoffs, and the next step's `1./scale`
# raises `ZeroDivisionError`, whether that step overflows or not. `torch.amp.GradScaler` raises
# nothing at 0: it multiplies the gradients by 1/0 = inf, so a step whose scaled gradients are
# all 0 is not skipped but applied as NaN. DeepSpeed ZeRO can also end at the other extreme:
# without an inf guard its scale can grow to inf, and the next overflow fails while it prints
# `int(scale)` (`OverflowError`).

# %%
plot_scale_trace(spike_runs, title="A spike every 500 steps: four scalers")

# %% [markdown]
# ## 4. The frameworks' scalers on one stream
#
# Every preset in `PRESETS` is one framework's rule and defaults, each tested step for step
# against a line-by-line transcription of its source (torch's also against the real
# `GradScaler`). Gradients of exactly 1 for 10,000
# steps: an overflow whenever the scale reaches 65536 (65536 × 1 is inf in fp16). First the
# scalers training runs with today:

# %%
# NBVAL_CHECK_OUTPUT
ones = np.ones(10_000, np.float32)
runs = [simulate(p, grad_max=ones) for p in PRESETS.values()]
trace_table([t for t in runs if t.policy.name not in LEGACY])

# %% [markdown]
# And four legacy ones, which you meet in older code, papers and logs:

# %%
# NBVAL_CHECK_OUTPUT
for name, why in LEGACY.items():
    print(f"{name}: {why}")
trace_table([t for t in runs if t.policy.name in LEGACY])

# %% [markdown]
# Notice:
# - Starting high costs a calibration: Megatron and NeMo start at 2^32 and skip their first 18
#   steps (17 halvings down to 2^15, plus one overflow their hysteresis tolerates); Keras starts
#   at 2^15 and skips none at first. jmp's `DynamicLossScale` has no default initial scale (you
#   pass `loss_scale`); the preset here (`JmpScaler`) starts at 2^15, the value in jmp's
#   documentation, and so skips none at first either.
# - DeepSpeed ZeRO grows on the 1,001st clean step after an overflow (since DeepSpeed 0.17.1; on
#   the 1,000th before), and its hysteresis skips two steps per tooth of the sawtooth: 20 skipped
#   steps where torch skips 5.
# - Legacy: fairseq's command-line default (2^7, a window of 16,384 steps) never grows within
#   this run: it never overflows, but it also never uses more of fp16's range. metaseq doubles
#   its growth window each time it grows, so it grows ever more slowly.
# - A static scale never changes: whether that is safe depends on the gradients (notebook 02).

# %% [markdown]
# ## 5. Reading a real log
#
# Not every framework prints a line when it skips a step. apex, fairseq, metaseq and DeepSpeed
# (since 0.17.6 only with `"log_level": "info"` in its config) print one per overflow, with the
# new scale; Megatron reports only a count of skipped iterations and the scale in its periodic
# progress line. `torch.amp.GradScaler`, PyTorch Lightning, NeMo, Keras and jmp print nothing.
#
# When a run does print "Gradient overflow. Skipping step", look at the scale *after* each
# message. `read_log` pulls it out of every one of those frameworks' lines; `diagnose` says
# whether it keeps coming back (harmless), keeps falling (ratchet), or reached 1 or less
# (collapse):

# %%
# NBVAL_CHECK_OUTPUT
log = """
epoch 3 | loss 2.817
Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0
epoch 3 | loss 2.809
[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 32768, reducing to 16384
NOTE: overflow detected, setting loss scale to: 8192.0
Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 4096.0
Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 2048.0
Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 1024.0
Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 512.0
Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 256.0
"""
scales = read_log(log)
print("scales after each overflow:", scales.tolist())
print(diagnose(scales))
print(diagnose(read_log(write_log(sawtooth))))

# %% [markdown]
# Notice: the same message means different things. In the sawtooth it appears once per growth
# interval and the scale returns to the same level; in the log above the scale halves eight
# times in a row: something overflows every few steps.
#
# With torch or Lightning, write the log yourself: record `scaler.get_scale()` before training
# and after every `scaler.update()` (Lightning's scaler is `trainer.precision_plugin.scaler`). A
# drop means that step was skipped; `scale_lines` turns the record into lines `read_log` reads.
# Here, the scales the sawtooth run used, as such a record would hold them:

# %%
# NBVAL_CHECK_OUTPUT
recorded = [*sawtooth.scale.tolist(), sawtooth.final.scale]  # get_scale() before each step, and after the last
lines = scale_lines(recorded)
print(lines.splitlines()[0])
print(diagnose(read_log(lines)))

# %% [markdown]
# ## Try it
#
# Move the sliders: a smaller `growth_interval` lets the scale recover between spikes; a
# `backoff_factor` closer to 1 falls more slowly; raise the spike `strength` to 1 (spikes of
# 2^20, beyond fp16's range: they overflow at every scale above about 2^-4) and compare with the
# frameworks you select; switch the `loss` to fp16 to see the scale capped below 65520. The lower
# panel shows the share of a fixed sample of gradients lost to fp16 underflow at your scale.

# %%
ScalerLab(steps=200_000, scenario="spikes", strength=0.5, overlay=("DeepSpeed ZeRO", "Megatron"))

# %% [markdown]
# The same comparison as a static figure, on a stream with bursts of consecutive overflows:

# %%
bursts = synth.scenario("bursts", 20_000, 0.5, np.random.default_rng(1))
plot_scale_trace([simulate(PRESETS[name], grad_max=bursts) for name in ("torch", "NeMo (apex hysteresis)", "Megatron")],
                 title="Bursts of overflows: torch, NeMo and Megatron")

# %% [markdown]
# ## Check yourself

# %%
# Overflows that no scale avoids come every 500 steps. What is the largest growth_interval at
# which torch's scale holds steady instead of ratcheting down? (Check it with simulate.)
answer = None
check_steady_interval(answer, every=500)

# %%
# Megatron's default hysteresis is 2. How many overflows in a row does it skip WITHOUT backing off?
answer = None
check_hysteresis_skips(answer)

# %%
# A fairseq log this lesson did not show. Verdict: "sawtooth", "ratchet" or "collapse"?
fairseq_log = """
| epoch 001:  1200 / 4000 loss=7.102
NOTE: gradient overflow detected, ignoring gradient, setting loss scale to: 64.0
| epoch 001:  2400 / 4000 loss=6.871
NOTE: gradient overflow detected, ignoring gradient, setting loss scale to: 64.0
NOTE: gradient overflow detected, ignoring gradient, setting loss scale to: 32.0
| epoch 002:  1000 / 4000 loss=6.533
NOTE: gradient overflow detected, ignoring gradient, setting loss scale to: 64.0
NOTE: gradient overflow detected, ignoring gradient, setting loss scale to: 64.0
| epoch 002:  3000 / 4000 loss=6.310
NOTE: gradient overflow detected, ignoring gradient, setting loss scale to: 64.0
"""
answer = None
check_log_verdict(answer, read_log(fairseq_log))

# %%
# Why is section 1's sawtooth harmless, while section 2's ratchet takes torch's scale down to 2^-4?
# (a letter)
#   a) the ratchet skips far more steps than the sawtooth, and skipped steps are what harm training
#   b) the sawtooth's overflows come from large gradients, which fit again once the scale backs off,
#      so it grows back to the same level; the ratchet's happen at every scale and more often than
#      once per growth_interval, so no halving is ever undone
#   c) each of the ratchet's overflows halves the scale more than one of the sawtooth's does
#   d) the ratchet is the scaler finding a lower scale that keeps larger gradients in fp16's range
answer = None
check_why_sawtooth_is_harmless(answer)

# %%
# Section 1's gradients are steady, with no spikes, yet once its scale has settled torch skips about
# one step per growth_interval. Why? (a letter)
#   a) the steady stream still holds an inf or NaN every 2,000 steps or so
#   b) torch halves the scale on a timer, every growth_interval steps, whether a step overflows or
#      not
#   c) the scaler learns that a scale is too high only from an overflow: after growth_interval clean
#      steps it doubles to 2^19, where the largest gradients soon reach 65520, and that step is
#      skipped and the scale halved
#   d) the loss is computed in fp16, where a scale of 2^19 is already inf
answer = None
check_why_one_skip_per_interval(answer)

# %% [markdown]
# ## Summary
#
# - One "Gradient overflow. Skipping step" per growth interval is the normal sawtooth: harmless.
# - An overflow caused by large gradients goes away when the scale backs off: the scale settles
#   into a sawtooth below them. An overflow no scale avoids (inf or NaN from the forward pass),
#   coming more often than once per `growth_interval`, makes a scaler without hysteresis ratchet
#   down, below 1 and even to 0.
# - Frameworks differ in hysteresis (and when it refills), floors, a minimum-scale error, the
#   starting scale and rounding; the same stream can be harmless in one and fatal in another.
# - Read a log by the scale after each message: stable means fine, falling means find the cause.
#
# **Next:** [07 · Live training: fp16, a scaler, bf16 and pure half weights](07_live_training.ipynb)
# trains a real model in fp16 with and without a scaler, in bf16 and in pure fp16, and examines
# your own model's gradients.
#
# **Open exercises**
# 1. In section 2, set `growth_interval` to the answer of the exercise above and to one more.
#    Where does each run's scale end? Both skip the same number of steps there: what does the
#    shorter interval cost instead on section 1's steady stream?
# 2. Give DeepSpeed ZeRO `consecutive_hysteresis=True`
#    (`DeepSpeedZeroScaler(consecutive_hysteresis=True)`). Does it still stop at step 8,750?
# 3. With the "warmup" scenario at strength 1, how many steps does each framework skip before the
#    scale settles? Which one pays the most for its starting scale?
# 4. `write_log(trace, "deepspeed")` prints a simulated run as DeepSpeed would. Write a log for the
#    bursts stream and diagnose it; then diagnose it again without the first messages, those
#    written while the scale came down from its start. Which verdict is right, and why?

# %% [markdown]
# The lesson's claims, checked:

# %%
assert 0.24 < steady.max() < 0.25 and 2.0**16 * steady.max() < 16_100  # far from 65520 at 2^16
assert not sawtooth.skipped[:6000].any() and sawtooth.scale.max() == 2.0**19  # grows past 2^16
assert sawtooth.skipped_count == 7 and sawtooth.final.scale == 2.0**18  # then one skip per interval
assert fp16_loss.skipped[0] and fp16_loss.skipped_count == 10 and fp16_loss.scale.max() == 2.0**16
assert ratchet.final.scale == 0.0625 == 2.0**16 / 2**20  # 20 spikes, 20 halvings, no growth
assert np.flatnonzero(settled.skipped)[:3].tolist() == [250, 750, 1250] and settled.scale.min() == 2.0**13
assert set(settled.scale[1251:].tolist()) == {2.0**13, 2.0**14}  # settled: saws between 2^13 and 2^14
assert set(np.diff(np.flatnonzero(settled.skipped)[2:]).tolist()) == {2500}  # one skip per 2,500 steps
assert diagnose(read_log(write_log(settled))).verdict == "sawtooth"
nemo, zero, megatron = spike_runs[1:]
assert list(PRESETS)[:3] == ["torch", "DeepSpeed ZeRO", "DeepSpeed"] and list(PRESETS)[-4:] == list(LEGACY)
assert nemo.final.scale == 65536 and nemo.skipped_count == 20  # hysteresis absorbs each spike
assert zero.stopped_at == 8750 and zero.final.scale == 1 and megatron.final.scale == 8192
assert zero.stop_reason == ("Exception: Current loss scale already at minimum - cannot decrease scale anymore. "
                            "Exiting run.")
assert (apex.stopped_at, apex.scale[1090], apex.scale[1091]) == (1091, 2.0**-1074, 0.0)  # 2^16 halved 1,091 times
assert apex.stop_reason == "ZeroDivisionError: float division by zero"
assert simulate(TorchGradScaler(), found_inf=np.ones(1200, bool)).stopped_at is None  # torch goes on at 0
to_inf = simulate(DeepSpeedZeroScaler(growth_interval=1), found_inf=np.r_[np.zeros(1100, bool), True])
assert (to_inf.stopped_at, to_inf.scale[1100]) == (1100, np.inf) and to_inf.stop_reason.startswith("OverflowError")
skipped = {t.policy.name: t.skipped_count for t in runs}
assert (skipped["torch"], skipped["DeepSpeed ZeRO"], skipped["Megatron"], skipped["jmp"]) == (5, 20, 36, 4)
zero_runs = [t for t in runs if t.policy.name == "DeepSpeed ZeRO"][0]
ups = np.flatnonzero(zero_runs.scale[1:] > zero_runs.scale[:-1])  # steps whose update grew the scale
assert ups[0] == 1002 and zero_runs.skipped[:2].all() and not zero_runs.skipped[2:1003].any()  # 1,001 clean
before = simulate(DeepSpeedZeroScaler(version="0.17.0"), grad_max=ones)  # DeepSpeed before 0.17.1
assert np.flatnonzero(before.scale[1:] > before.scale[:-1])[0] == 1001  # its 1,000th clean step
assert "DeepSpeed ZeRO (class defaults)" not in skipped  # not in DeepSpeed since 0.17.1
assert skipped["fairseq"] == 0 and skipped["static 1024"] == 0
calibration = {t.policy.name: int(np.argmin(t.skipped)) for t in runs}  # the first clean step
assert calibration["Megatron"] == calibration["NeMo (apex hysteresis)"] == 18 and calibration["jmp"] == 0
assert [diagnose(read_log(log)).verdict, diagnose(read_log(write_log(sawtooth))).verdict] == ["ratchet", "sawtooth"]
print("all claims hold")
