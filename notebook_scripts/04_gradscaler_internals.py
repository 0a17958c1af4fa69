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
# # 04 · GradScaler internals: the real scaler, call by call
#
# What `torch.amp.GradScaler`, PyTorch's [dynamic loss scaler](../GLOSSARY.md#dynamic-loss-scaling), holds,
# checks and changes in each iteration, and the mistakes it refuses (or silently lets through).
#
# You will be able to:
# - follow one iteration of `torch.amp.GradScaler` through `scale`, `backward`, `unscale_`, `step`
#   and `update`, and predict its scale and growth tracker after any run of clean and overflowing steps,
# - read each of its error messages, and put [clipping](../GLOSSARY.md#gradient-clipping), skipped-step checks and the scheduler in the right place,
# - check a simulator of the scaler against the real one, step for step.
#
# Teaching this lesson? The [teacher's guide](../TEACHING.md#nb04) has its timings, the answers to
# its exercises and what to demo live.
# Its words in English and Chinese (中文), each with a one-line definition: the [glossary](../GLOSSARY.md).

# %%
import numpy as np
import torch

from ampviz.training.gradscaler import (check_amp_loop, check_backoffs_to_zero, check_clip_before_unscale,
                                        check_scale_after_pattern, check_skip_test, check_why_check_before_step,
                                        check_why_clip_after_unscale, check_why_scale_reaches_zero,
                                        clipping_norms, clipping_table, constructor_warnings, error_cases,
                                        found_inf_from, run_real_scaler, same_run, scheduler_report,
                                        skip_detection_table, step_table, unscale_overflow_table, walk_iteration)
from ampviz.training.gradscaler.writeups import gradscaler_claims, update_report
from ampviz.plots import plot_scale_trace
from ampviz.scaling import TorchGradScaler, simulate

rng = np.random.default_rng(0)
_ = torch.manual_seed(0)
torch.set_num_threads(1)

# %% [markdown]
# ## 1. One iteration, call by call
#
# The problem is as small as it gets: one weight vector w = [3, -4], plain SGD (learning rate 0.1)
# and the loss ½‖w‖², whose gradient g is w itself. `walk_iteration()` runs one iteration of the
# real `torch.amp.GradScaler("cpu")` with torch's defaults and reads the scaler's internal state
# after each call:

# %%
# NBVAL_CHECK_OUTPUT
walk_iteration()

# %% [markdown]
# Notice:
# - Constructing the scaler allocates nothing: `_scale` is `None` until the first `scale()`, which
#   creates it as a **float32** tensor on the loss's device (the tracker as int32). Until then
#   `get_scale()` returns `init_scale` exactly as it was passed.
# - `scale(loss)` is a multiplication, 12.5 × 65536. The backward pass then starts from S instead
#   of 1, so every gradient arrives multiplied by S: [196608, -262144] is exactly 65536 · [3, -4].
# - `unscale_` multiplies the gradients by 1/S in place and records `found_inf` per device; the
#   optimizer's stage goes READY → UNSCALED → STEPPED, and `update()` counts one clean step and
#   clears the record.
# - `scaler.step(opt)` returned `None`, although the step ran. Section 7 comes back to this.

# %% [markdown]
# ## 2. An overflow: the step is skipped
#
# In fp16 training, a gradient too large for fp16 (65520 and up rounds to inf) becomes inf
# somewhere in the backward pass. Here one inf is put into the gradient by hand, right after
# `backward()`:

# %%
# NBVAL_CHECK_OUTPUT
walk_iteration(overflow=True)

# %% [markdown]
# Notice: `unscale_` records `found_inf = 1`; `step` then never calls `optimizer.step()`, so w
# stays [3, -4]; `update()` multiplies the scale by `backoff_factor` (0.5) and resets the growth
# tracker to 0. A [skipped step](../GLOSSARY.md#skipped-step) changes nothing but the scale.

# %% [markdown]
# ## 3. The check comes before the division
#
# `unscale_` does two things to each group of gradients, in one operation: it flags any inf or NaN
# among the **scaled** gradients, *then* multiplies them by 1/S. When S has backed off below 1,
# a scaled gradient that passed the check can overflow during that multiplication:

# %%
# NBVAL_CHECK_OUTPUT
unscale_overflow_table(scale=2.0**-10, grad=(1e36, 1.0))

# %% [markdown]
# Notice: `found_inf` is 0, the step runs, and the weight becomes -inf (1e36 × 2^10 ≈ 1e39 is past
# float32's largest value, 3.4e38). A scale below 1 only comes from a long run of overflows,
# which is itself the sign of a problem (a NaN loss, say) that the scaler cannot fix.

# %% [markdown]
# ## 4. `update()`: count, grow, back off
#
# `update()` is a small state machine on two numbers, the scale S (float32) and the growth tracker
# T (int32):
# - after an overflow: S = S × `backoff_factor`, T = 0;
# - after a clean step: T = T + 1, and when T **equals** `growth_interval`, S = S × `growth_factor`
#   (only if the result is finite) and T = 0.
#
# The real scaler, 12 steps with `growth_interval=3`, overflows at steps 3 and 8:

# %%
# NBVAL_CHECK_OUTPUT
grow_run = run_real_scaler(found_inf_from("...x....x..."), growth_interval=3)
step_table(grow_run, steps=range(grow_run.steps))

# %% [markdown]
# Notice: the scale grows on the third clean step in a row (steps 2, 6 and 11), and the tracker
# then reads 0, not 3. The overflow at step 3 backs off and resets the count; step 7 is clean but
# only brings the tracker to 1 before the next overflow.
#
# There is no floor. A run of overflows halves the scale through float32's subnormal numbers.
# The scale is a float32 number: predict first, then run the cell below.

# %%
# Predict: how many overflowing steps in a row take the default scale 2^16 to exactly 0?
answer = None
check_backoffs_to_zero(answer)

# %%
# NBVAL_CHECK_OUTPUT
zero_run = run_real_scaler(np.ones(170, bool))
step_table(zero_run, steps=range(162, 170))

# %% [markdown]
# Notice: 165 halvings take 2^16 to 2^-149, float32's smallest subnormal, and the 166th gives
# exactly 0 (2^-150 is a tie, and ties round to the even neighbour, 0). Zero then stays: 0 × 2 is
# 0. At scale 0 the scaled gradients are 0, unscaling multiplies them by 1/0 = inf, and the next
# clean step runs on NaN gradients (0 × inf): the weights become NaN, and no inf check fires.

# %% [markdown]
# ## 5. Every error, with its exact message
#
# The scaler keeps a stage per optimizer (READY → UNSCALED → STEPPED, back to READY at `update()`)
# and refuses calls out of order. Each case below is really done; torch's exception is caught and
# printed as `type: message`:

# %%
# NBVAL_CHECK_OUTPUT
print(*error_cases(), sep="\n\n")

# %% [markdown]
# Notice:
# - The three `_scale is None` errors mean that no `scaler.scale(...)` ran yet, typically a
#   `loss.backward()` where `scaler.scale(loss).backward()` belongs. To search for the message,
#   mind the **two spaces** after `None.`
# - [GradScaler](../GLOSSARY.md#gradscaler) refuses fp16 *weights*: mixed precision keeps the weights and their gradients in
#   fp32 and runs fp16 only inside `torch.autocast`.
# - A closure (as LBFGS uses) is refused.
# - `update()` needs an inf check recorded in this iteration, and `unscale_` records one: after
#   `unscale_` alone, with no `step()`, `update()` works and counts the iteration as a clean step
#   although the weights never moved. Only `update()` with neither call raises.

# %% [markdown]
# ## 6. Clipping goes after `unscale_`
#
# Gradient clipping compares the gradient norm with a threshold, so it must see the true
# gradients: call `scaler.unscale_(optimizer)`, clip, then `scaler.step(optimizer)` (which does not
# unscale a second time). Clipping to `max_norm=1`, in both orders:

# %%
# NBVAL_CHECK_OUTPUT
clipping_table(max_norm=1.0)

# %% [markdown]
# Notice: in the right order, clipping sees ‖g‖ = 5 and the optimizer applies a gradient of norm 1.
# In the wrong order, clipping sees the scaled norm 327680 and cuts it to 1; `step()` then divides
# by S, and the optimizer applies a gradient of norm 2^-16: w moves by about 10^-6, too little to
# show at the table's 4 digits, with no error and no warning. The right order:
#
# ```python
# scaler.scale(loss).backward()
# scaler.unscale_(optimizer)
# torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
# scaler.step(optimizer)
# scaler.update()
# ```

# %% [markdown]
# ## 7. Did the step happen?
#
# Some articles detect a skipped step with `if scaler.step(optimizer):`. But `scaler.step` returns
# whatever `optimizer.step()` returned when the step ran (`None` for torch's optimizers called
# without a closure), and `None` when it skipped. What does change reliably is the scale: `update()` backs it off
# after a skipped step. One overflowing step, then a clean one:

# %%
# NBVAL_CHECK_OUTPUT
skip_detection_table(found_inf=[True, False])

# %% [markdown]
# Notice: the idiom calls both steps skipped. Comparing the scale across `update()` is right:
#
# ```python
# scale_before = scaler.get_scale()
# scaler.step(optimizer)
# scaler.update()
# skipped = scaler.get_scale() < scale_before
# ```
#
# (`get_scale()` returns `_scale.item()`. On a GPU that is a blocking device-to-host copy: the CPU
# waits until the GPU has finished all the work queued before it, and cannot queue the next
# step's kernels meanwhile. A plain optimizer's `scaler.step()` already waits once, to read
# found_inf; the two `get_scale()` calls add two more waits per step. The comparison stops
# working only at a scale of 0, which cannot shrink any further.)

# %% [markdown]
# ## 8. `torch.cuda.amp` is deprecated, and the default device is `"cuda"`
#
# Older code constructs `torch.cuda.amp.GradScaler()`. Four ways to construct a scaler, with the
# warnings each gives (captured), and what the scaler then does to a loss:

# %%
# NBVAL_CHECK_OUTPUT
print(*constructor_warnings(), sep="\n")

# %% [markdown]
# Notice: `torch.cuda.amp.GradScaler(...)` and `torch.cpu.amp.GradScaler(...)` still work but warn;
# write `torch.amp.GradScaler("cuda", ...)` or `torch.amp.GradScaler("cpu", ...)`. The device
# of a bare `torch.amp.GradScaler()` is `"cuda"`: on a machine without CUDA (like the CPU build
# of torch this course pins) it warns and **disables itself**. `scale(loss)` then returns the
# loss unchanged, `get_scale()` is 1, and fp16 training runs with no loss scaling at all. On a
# machine with CUDA that line reads `is_enabled() = True`. Name the device.

# %% [markdown]
# ## 9. The scheduler warning after a skipped first step
#
# With a half-precision loss, the default scale overflows at once: the backward pass starts
# from fp16(65536), which is inf. The first steps are skipped while the scale comes down, and a
# learning-rate scheduler (`StepLR`, halving every step) called after each iteration warns:

# %%
# NBVAL_CHECK_OUTPUT
scheduler_report()

# %% [markdown]
# Notice: the optimizer skipped iterations 0 to 2, but the scheduler moved on anyway, so the
# learning rates 0.1, 0.05 and 0.025 were never used: "skipping the first value of the learning
# rate schedule", as the warning says. Over a long schedule that is harmless. To keep the schedule
# in step with the optimizer, call `scheduler.step()` only when the scale did not shrink:

# %%
# NBVAL_CHECK_OUTPUT
scheduler_report(guard=True)

# %% [markdown]
# ## 10. The simulator, step for step
#
# `simulate(TorchGradScaler(...), found_inf=...)` from `ampviz.scaling` reproduces `update()` in
# numpy, without torch, fast enough for a million steps. The same stream goes into both: 5,000
# steps, 1% of them overflowing, `growth_interval=50`:

# %%
# NBVAL_CHECK_OUTPUT
stream = np.random.default_rng(1).random(5000) < 0.01
real = run_real_scaler(stream, growth_interval=50)
trace = simulate(TorchGradScaler(growth_interval=50), found_inf=stream)
print(f"real GradScaler: {real.skipped_count} skipped, final scale {real.final_scale:g}")
print(f"simulate:        {trace.skipped_count} skipped, final scale {trace.final.scale:g}")

# %%
assert np.array_equal(real.scale, trace.scale)  # the float32 scale at every step, bit for bit
assert np.array_equal(real.skipped, trace.skipped)  # the same steps skipped
assert np.array_equal(real.growth_tracker, trace.growth_tracker)  # the same tracker after every update()
print("real and simulated scaler agree on all", real.steps, "steps")

# %% [markdown]
# ## 11. What the write-up says, measured
#
# A short Chinese tutorial, 《PyTorch自动混合精度训练》 (the index names no author), walks through
# the same calls. Three of its claims, quoted and put in English, beside what the real scaler did
# here: `update()` run after a clean step (`growth_interval=1`) and after an overflow, with the
# weights' dtype read before and after, and the constructor of section 8.

# %%
# NBVAL_CHECK_OUTPUT
gradscaler_claims()

# %% [markdown]
# ## Try it
#
# Change the settings and the pattern (`x`: a step that overflows, `.`: a clean step), then run
# the cell. It simulates the scaler, checks the result against the real `GradScaler`, prints the
# first steps and draws the whole run. (An interactive scaler lab comes in a later notebook.)

# %%
settings = dict(init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=4)
pattern = "xxx" + "." * 20 + "xx" + "." * 40 + "x" + "." * 30
# a random stream instead: found_inf = rng.random(500) < 0.02

found_inf = found_inf_from(pattern)
trace = simulate(TorchGradScaler(**settings), found_inf=found_inf)
print("the real GradScaler agrees:", same_run(run_real_scaler(found_inf, **settings), trace))
print(step_table(trace, steps=range(12)))
plot_scale_trace(trace, title="init_scale 2^16, growth_factor 2, backoff_factor 0.5, growth_interval 4")

# %% [markdown]
# Section 4's run of overflows, drawn the same way: log2(scale) falls by one per step, 166 steps
# down to 0 (drawn at 2^-150).

# %%
plot_scale_trace(simulate(TorchGradScaler(), found_inf=np.ones(170, bool)),
                 title="170 overflows in a row from 2^16: no floor")

# %% [markdown]
# ## Check yourself

# %%
# growth_interval=3, from 2^16, the steps "..x...." (x: an overflow, .: a clean step).
# What is the scale after the seventh update()?
answer = None
check_scale_after_pattern(answer, "..x....", growth_interval=3)

# %%
# Why does the scaler look for inf and NaN before it calls optimizer.step(), rather than after?
# (a letter)
#   a) optimizer.step() raises an error on an inf gradient, and the check avoids that error
#   b) a step taken with an inf or NaN gradient makes the weights inf or NaN; found before, the step
#      is simply not taken and the weights stay as they were
#   c) so that update() can lower the scale and the same step can be redone at the new scale
answer = None
check_why_check_before_step(answer)

# %%
# Why is the scale exactly 0 after 166 overflows in a row from 2^16? (a letter)
#   a) update() sets the scale to 0 after too many overflows in a row, to stop training
#   b) float32 flushes subnormal numbers to 0, so the scale is 0 once it falls below 2^-126
#   c) each overflow halves it and there is no floor: 165 halvings reach 2^-149, float32's smallest
#      subnormal, and half of that is a tie that rounds to the even neighbour, 0
answer = None
check_why_scale_reaches_zero(answer)

# %%
# Which test tells you that the last step was skipped? Answer "a" or "b".
# (a) if not scaler.step(optimizer): ...
# (b) scale_before = scaler.get_scale(); scaler.step(optimizer); scaler.update()
#     if scaler.get_scale() < scale_before: ...
answer = None
check_skip_test(answer)

# %%
# Clip to max_norm=5 BEFORE scaler.unscale_, at scale 2^10:
# what gradient norm does the optimizer apply? (a number)
answer = None
check_clip_before_unscale(answer, max_norm=5.0, init_scale=2.0**10)

# %%
# Why must scaler.unscale_(optimizer) come before clip_grad_norm_? (a letter)
#   a) clip_grad_norm_ needs float32 gradients, and until unscale_ they are fp16
#   b) until unscale_ the gradients are S·g: clipping compares a norm S times too large with max_norm
#      and cuts them, and step() then divides them by S
#   c) scaler.step() raises an error when the gradients were clipped before unscale_
answer = None
check_why_clip_after_unscale(answer)


# %% [markdown]
# Now write the loop yourself. `train_step` gets a model, its SGD optimizer, a
# `torch.amp.GradScaler("cpu")` and one batch; it must do one whole iteration in fp16 AMP: zero
# the gradients, run the forward pass and the loss (`torch.nn.functional.mse_loss(model(x), y)`)
# under `torch.autocast("cpu", dtype=torch.float16)`, backward, step and update as section 1 did.
# The checker trains a small model with your step for 6 iterations, one of which overflows in
# fp16, beside a correct step, and compares the weights and the scale after each one, bit for bit.

# %%
def train_step(model, optimizer, scaler, x, y):
    ...  # your code here

# When train_step is written, set answer = train_step (the function itself) and run the cell
answer = None
check_amp_loop(answer)

# %% [markdown]
# ## Summary
#
# - `GradScaler` creates its float32 scale at the first `scale()`. The scaled backward gives S·g;
#   `unscale_` checks the scaled gradients for inf/NaN, *then* multiplies by 1/S; `step` skips
#   `optimizer.step()` if anything was flagged; `update()` backs off (S × 0.5, T = 0) or counts,
#   growing S × 2 when T equals `growth_interval` (then T = 0), never to inf, with no floor:
#   166 overflows in a row from 2^16 give exactly 0.
# - Its errors name the call that came out of order; `_scale is None` means no `scale()` ran.
# - Clip after `unscale_`. Detect a skipped step from the scale, not from `step()`'s return
#   value. Use `torch.amp.GradScaler("cuda")` or `("cpu")`; a bare `GradScaler()` without CUDA
#   disables itself. Skipped first steps make the scheduler warn.
# - `simulate(TorchGradScaler(...))` matches the real scaler step for step.
#
# **Next:** [05 · GradScaler in a real loop: accumulation, several optimizers, checkpoints](05_gradscaler_in_a_real_loop.ipynb)
# puts these rules into the loops people write: gradient accumulation, several optimizers, a
# gradient penalty, checkpoint and resume.
#
# **Open exercises**
# 1. In *Try it*, set `backoff_factor=0.9` and `pattern = "x" * 2000`. Where does the scale stop,
#    and why not at 0?
# 2. Run `step_table(run_real_scaler(found_inf_from("." * 8), growth_interval=0))`. What does the
#    tracker do, and does the scale ever grow?
# 3. Predict the scale and tracker after each step of `"..x...x.."` with `growth_interval=2`, then
#    check your answer with `step_table`.
# 4. Why does the half-precision loss of section 9 overflow at 2^16 but not at 2^13? What
#    `init_scale` would have avoided every skipped step there, and what would it cost when the
#    gradients are small?

# %% [markdown]
# The lesson's claims, checked against the real `torch.amp.GradScaler("cpu")`:

# %%
walk = walk_iteration()
assert walk["GradScaler"].scale is None and walk["scale"].scale_dtype == "torch.float32"  # lazy, float32
assert walk["backward"].grad.tolist() == [3 * 2.0**16, -4 * 2.0**16]  # gradients are S·g
assert grow_run.scale_after[:3].tolist() == [2.0**16, 2.0**16, 2.0**17]  # growth when T equals 3 ...
assert grow_run.growth_tracker[2] == 0  # ... and T is 0 after it
assert zero_run.scale_after[164] == 2.0**-149 and zero_run.scale_after[165] == 0.0  # no floor
errors = {e.case: f"{e.error}: {e.message}" for e in error_cases()}
assert errors["scaler.step(opt) after loss.backward(), with no scaler.scale() before it"].startswith(
    "AssertionError: Attempted step but _scale is None.  This may indicate")
assert abs(clipping_norms(unscale_first=True)["applied"] - 1) < 1e-6  # clip after unscale_: norm 1
assert abs(clipping_norms(unscale_first=False)["applied"] / 2.0**-16 - 1) < 1e-5  # clip before: norm 1/S
skips = run_real_scaler([True, False])
assert skips.returned == (None, None) and skips.skipped.tolist() == [True, False]  # None either way
assert scheduler_report().warnings and not scheduler_report(guard=True).warnings
assert update_report().dtypes == ("torch.float32",)  # update() moves the scale, never the dtype
print("all claims hold")
