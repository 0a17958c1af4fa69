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
# # 08 · Lightning manual optimization: `loss.backward()` vs `self.manual_backward(loss)`
#
# One wrong line in a LightningModule with manual optimization, and the three things it can do:
# crash, run silently, or quietly divide every gradient by 65536. Then two traps that remain with
# the right line: several optimizers, and gradient clipping.
#
# You will be able to:
# - check which precision, precision plugin and loss scaler a Lightning `Trainer` really uses,
# - explain `Attempted unscale_ but _scale is None` from the scaler's state, and find the call that fixes it,
# - tell when several optimizers step with a wrong gradient under Lightning's fp16 plugin, and
#   where gradient clipping must go in manual optimization.
#
# Teaching this lesson? The [teacher's guide](../TEACHING.md#nb08) has its timings, the answers to
# its exercises and what to demo live.
# Its words in English and Chinese (中文), each with a one-line definition: the [glossary](../GLOSSARY.md).

# %%
import torch

from ampviz.pitfalls import versions
from ampviz.pitfalls.writeups import manual_claims
from ampviz.pitfalls.questions import (check_why_clip_in_the_hook, check_why_unscale_without_scale,
                                       check_why_update_once)
from ampviz.pitfalls.manual_backward import (CLIPS, applied_factor, check_clip_before_step_norm,
                                             check_cpu_precision, check_partial_overflow_factor,
                                             check_third_optimizer_factor, check_unscale_wrapper_raises,
                                             clip_table, clipping, cpu_16_mixed, fp16_late_loss_backward,
                                             fp16_loss_backward, fp16_manual_backward, fp32_reference,
                                             norms_table, partial_overflow, precision_table, run_manual,
                                             several_optimizers, steps_table, torch_recipe, trace_table)

_ = torch.manual_seed(0)
torch.set_num_threads(1)
print(versions())

# %% [markdown]
# ## 1. The module
#
# Every run below fits the same seeded model (three linear layers, SGD, four batches of 16) with
# `automatic_optimization = False`. Its `training_step` is the usual manual-optimization loop, with
# the backward call as the one thing that changes:
#
# ```python
# def training_step(self, batch, batch_idx):
#     opt = self.optimizers()
#     opt.zero_grad()
#     loss = F.mse_loss(self(x), y)
#     self.manual_backward(loss)   # the buggy version: loss.backward()
#     opt.step()
# ```
#
# `run_manual(...)` (in `ampviz.pitfalls.manual_backward`) runs it through a quiet `Trainer`: no
# progress bar, no logs, nothing written to this folder.

# %% [markdown]
# ## 2. What `precision="16-mixed"` gives you on the CPU
#
# Ask for fp16 AMP the usual way, `Trainer(accelerator="cpu", precision="16-mixed")`, run the
# **buggy** `loss.backward()`, and look at what Lightning chose. First, your prediction:

# %%
# Predict before you run the next cell: Trainer(accelerator="cpu", precision="16-mixed"),
# what is trainer.precision? (a string)
answer = None
check_cpu_precision(answer)

# %%
# NBVAL_CHECK_OUTPUT
on_cpu = cpu_16_mixed()
print(on_cpu)
print(*on_cpu.details["warnings"], sep="\n")
precision_table(on_cpu)

# %% [markdown]
# Notice: Lightning replaced `16-mixed` by `bf16-mixed`, with `precision_plugin.scaler = None`.
# bf16 needs no loss scaling, so the wrong backward call does no harm here and nothing fails: the
# bug waits for the first run on a GPU. (The warning is out of date: torch itself runs fp16
# autocast on the CPU.) Whatever precision you asked for, check what you got:
#
# ```python
# trainer.precision, type(trainer.precision_plugin).__name__, getattr(trainer.precision_plugin, "scaler", None)
# ```

# %% [markdown]
# ## 3. Real fp16 AMP: the error
#
# To get fp16 autocast and a real `torch.amp.GradScaler("cpu")`, pass the plugin yourself:
# `Trainer(plugins=[MixedPrecision("16-mixed", "cpu")])` (from `lightning.pytorch.plugins`).
# The buggy `loss.backward()`, for real; the exception is caught and printed with the call chain
# from `training_step` to where it was raised:

# %%
# NBVAL_CHECK_OUTPUT
bug = fp16_loss_backward()
print(f"{bug.error_type}: {bug.message}")
print(*bug.details["error_chain"], sep="\n")
precision_table(bug)

# %% [markdown]
# Notice: the error comes from `opt.step()`, not from the backward call. Lightning's precision
# plugin calls `scaler.unscale_(optimizer)` before stepping, and the scaler refuses: it has no
# scale yet. To search for the message, mind the **two spaces** after `None.`

# %% [markdown]
# ## 4. The mechanism: `_scale` is created by `scaler.scale()`
#
# `GradScaler` creates its scale tensor `_scale` lazily, at the first `scaler.scale(loss)`. The
# scaler's `_scale` at three moments of each iteration, in the buggy run and in the fixed one:

# %%
# NBVAL_CHECK_OUTPUT
fix = fp16_manual_backward()
print(trace_table(bug))
print()
print(trace_table(fix))

# %% [markdown]
# Who calls `scaler.scale(...)` in the fixed run? `run_manual` records the call chain each time
# the scaler scales a loss:

# %%
# NBVAL_CHECK_OUTPUT
print(len(fix.details["scale_calls"]), "calls to scaler.scale(); the first from:")
print(*fix.details["scale_calls"][0], sep="\n")
print("in the buggy run:", len(bug.details["scale_calls"]), "calls")

# %% [markdown]
# Notice: `self.manual_backward(loss)` → `Strategy.backward` → the precision plugin's
# `pre_backward`, which returns `scaler.scale(loss)`; that product is what gets `.backward()`.
# A bare `loss.backward()` bypasses all of it: the gradients are not scaled, and the scaler never
# gets a `_scale`.

# %% [markdown]
# ## 5. Worse than the error: the silent case
#
# The assertion fires only while `_scale` is `None`. Once one `manual_backward` has run (say the
# bare `loss.backward()` sits in a branch that is not taken in the first iteration), every later
# bare backward passes unscaled gradients to a plugin that divides them by the scale anyway:

# %%
# NBVAL_CHECK_OUTPUT
fp32 = fp32_reference()
silent = fp16_late_loss_backward()
print(silent)
print(norms_table(silent, fp32))
print(f"iteration 1: ratio × scale = {silent.details['ratio_times_scale']:.3f}")

# %% [markdown]
# Notice: no error and no warning. From iteration 1 on, the optimizer steps with gradients about
# 65536 times too small (ratio × scale ≈ 1), so the model stops learning. (The later ratios drift
# from 1/65536 because those weights no longer match the fp32 run's.)

# %% [markdown]
# ## 6. The fix, checked against fp32
#
# `self.manual_backward(loss)` in every iteration, under the same real fp16 AMP:

# %%
# NBVAL_CHECK_OUTPUT
print(fix)
print(norms_table(fix, fp32))
worst = max(abs(r) for r in fix.details["rel_diff_vs_fp32"])
print(f"largest relative difference from fp32: {'below 0.5%' if worst < 5e-3 else f'{worst:.2%}'}")

# %% [markdown]
# Notice: the gradient norms agree with fp32 to fp16's rounding, and the scale stays 65536.

# %% [markdown]
# ## 7. Several optimizers: `update()` inside every `opt.step()`
#
# PyTorch's recipe for several optimizers calls `scaler.update()` once per iteration, after every
# optimizer has stepped. Lightning's plugin runs `unscale_`, `step` **and `update()`** inside each
# `opt.step()`. Three optimizers (one per layer), one `self.manual_backward(loss)` per iteration,
# and a loss spike (× 2^20) in iteration 1 that overflows all their gradients. One row per
# `opt.step()`: the scale the backward multiplied the gradients by, the scale `unscale_` divided
# them by, whether the scaler skipped the step, the gradient the optimizer applied divided by the
# true one (the gradients after the backward divided by the scale they were multiplied by), and
# the scale after the step:

# %%
# NBVAL_CHECK_OUTPUT
three = several_optimizers(optimizers=3, spike_at=1, iterations=3)
print(steps_table(three))
print("trainer.global_step =", three.details["global_step"], "after", three.details["iterations"], "iterations")

# %% [markdown]
# Notice: each optimizer found inf in its own gradients, and each `opt.step()` ended with an
# `update()`, so this one iteration halved the scale three times, 65536 → 8192. For the same
# reason `growth_interval` counts optimizer steps, and so do `trainer.global_step` and
# `max_steps`: `max_steps=9` with three optimizers is three iterations.
#
# A loss spike reaches every gradient. An overflow can also stay in one part of the network. In
# the next run, iteration 1 writes an inf into one gradient entry of optimizer 1 right after the
# backward (what an fp16 overflow confined to the first layer leaves behind); optimizer 2's
# gradients stay finite.

# %%
# Predict before you run the next cell: two optimizers, one self.manual_backward(loss), and only
# optimizer 1's gradients overflow. Optimizer 2 applies its true gradient times what factor?
answer = None
check_partial_overflow_factor(answer)

# %%
# NBVAL_CHECK_OUTPUT
partial = partial_overflow(optimizers=2, overflow_in=(1,), spike_at=1, iterations=2)
print(steps_table(partial))
print(f"optimizer 2, iteration 1: applied gradient ÷ true gradient = {applied_factor(partial, 1, 2):g}")

# %% [markdown]
# Notice: optimizer 1's `update()` halved the scale to 32768 before optimizer 2 unscaled.
# Optimizer 2's gradients had been multiplied by 65536 and were divided by 32768: it applied a
# gradient exactly 2 times too large, and nothing warned. The scale was halved once, not twice:
# only one optimizer found inf.
#
# The same model, data and overflow in plain PyTorch, with its recipe: one
# `scaler.scale(loss).backward()`, `scaler.step(opt)` for each optimizer, then one `scaler.update()`:

# %%
# NBVAL_CHECK_OUTPUT
recipe = torch_recipe(optimizers=2, overflow_in=(1,), spike_at=1, iterations=2)
steps_table(recipe)

# %% [markdown]
# Notice: both optimizers divide by the same 65536. Optimizer 1 is skipped, optimizer 2 applies
# its true gradient, and the single `update()` halves the scale once. (`torch_recipe(...,
# update_every_step=True)` calls `update()` after every step, as Lightning does, and gets the
# factor 2 back.)
#
# So, under Lightning's fp16 plugin, with one `manual_backward` whose gradients several
# optimizers step with: each optimizer whose gradients overflow halves the scale in its own
# `opt.step()`, and every optimizer that steps after it divides by a scale that is too small (×2
# for each overflowing optimizer before it). One iteration divides the scale by 2^k for k
# overflowing optimizers; "halved once per optimizer" holds only when all of them overflow, as
# with the loss spike above.

# %% [markdown]
# ## 8. Gradient clipping in manual optimization
#
# With `automatic_optimization = False`, Lightning refuses `Trainer(gradient_clip_val=...)`
# ("Automatic gradient clipping is not supported for manual optimization."); you call
# `self.clip_gradients(opt, gradient_clip_val=..., gradient_clip_algorithm="norm")` yourself. Where?
# The plugin unscales inside `opt.step()`, right before it calls the `on_before_optimizer_step`
# hook. Four places, each in a real fp16 run with `gradient_clip_val=0.1` (the true gradient norm
# is about 5 times that, so clipping should act in every step):
#
# ```python
# # "before opt.step()"
# self.clip_gradients(opt, gradient_clip_val=0.1, gradient_clip_algorithm="norm")
# opt.step()
#
# # "after scaler.unscale_(opt)", opt = self.optimizers() (Lightning's wrapper)
# scaler = self.trainer.precision_plugin.scaler
# scaler.unscale_(opt)
# self.clip_gradients(opt, gradient_clip_val=0.1, gradient_clip_algorithm="norm")
# opt.step()
#
# # "after scaler.unscale_(opt.optimizer)": the same, with the torch optimizer inside the wrapper
#
# # "in on_before_optimizer_step"
# def on_before_optimizer_step(self, optimizer):
#     self.clip_gradients(optimizer, gradient_clip_val=0.1, gradient_clip_algorithm="norm")
# ```

# %%
# Predict before you run the next cell: scaler.unscale_(opt) with opt = self.optimizers(), then
# clip_gradients, then opt.step(). Does opt.step() raise an error? ("yes" or "no")
answer = None
check_unscale_wrapper_raises(answer)

# %%
# NBVAL_CHECK_OUTPUT
clips = {where: clipping(where, clip_val=0.1, iterations=2) for where in CLIPS}
print(clip_table(*clips.values()))
refused = clips["after scaler.unscale_(opt.optimizer)"]
print(f"{refused.error_type}: {refused.message}")
print(*refused.details["error_chain"], sep="\n")

# %% [markdown]
# Notice:
# - **before `opt.step()`** the gradients are still multiplied by 65536. `clip_gradients` clips
#   *their* norm to 0.1, then the plugin's `unscale_` divides by 65536: the optimizer applies a
#   norm of 0.1 / 65536 (applied norm × scale = the clip value), in every step, without a word.
# - **after `scaler.unscale_(opt)`** nothing raises either. The scaler keeps its per-optimizer
#   state by `id(optimizer)`, and the plugin unscales the torch optimizer inside Lightning's
#   wrapper, another object: the gradients are divided by 65536 twice, and the optimizer again
#   applies 0.1 / 65536.
# - **after `scaler.unscale_(opt.optimizer)`** the scaler recognises the optimizer, and the
#   plugin's own `unscale_` inside `opt.step()` refuses.
# - **in `on_before_optimizer_step`** the gradients are already unscaled: the applied norm is the
#   clip value. This is the place.

# %% [markdown]
# ## What write-ups of this error tend to get wrong
#
# - It is not about having several optimizers or `ReduceLROnPlateau` schedulers: one optimizer
#   reproduces it (sections 3 to 6). (Stepping `ReduceLROnPlateau` every batch with a small
#   patience collapses the learning rate within a few steps, which is a separate problem: step it per epoch.)
# - `precision="16-mixed"` on a CPU does not test fp16 at all: you get bf16 without a scaler.
# - The assertion is the lucky case. Only a run whose first step has no scaled loss raises;
#   later bare `loss.backward()` calls shrink the gradients without a word.
# - "With N optimizers, an overflow halves the scale N times" is true only when all N overflow.
#   The worse effect of the per-step `update()` is the wrong gradient of the optimizers that step
#   after an overflowing one.
# - A manual `self.clip_gradients(opt, ...)` right before `opt.step()` looks right and runs, but
#   under fp16 AMP it clips the scaled gradients.

# %% [markdown]
# ## 9. What the write-up says, measured
#
# A Chinese write-up of this error, 《PyTorch Lightning混合精度训练中的手动优化陷阱》 (the index names
# no author), gets the cause right. Its fixed `training_step`, though, never calls `zero_grad()`.
# Below, its claims beside sections 2 and 3's runs, and its snippet in a real fp32 `Trainer` on one
# fixed batch, with and without `opt.zero_grad()`:

# %%
# NBVAL_CHECK_OUTPUT
manual_claims(bug, on_cpu)

# %% [markdown]
# ## Try it
#
# Pick a backward call (`"manual_backward"`, `"loss.backward"`, `"manual_backward, then loss.backward"`
# or `"manual_backward per optimizer"`: a forward pass, a backward and a step per optimizer), fp16
# or not, and the number of optimizers (1 to 3). `spike_at` puts a loss spike into one iteration
# (or `None`); add `overflow_in=(1,)` (optimizer numbers) to make only those optimizers' gradients
# overflow in that iteration. `clip=` takes one of `CLIPS`, and `growth_interval=` (fp16 only)
# replaces the scaler's 2000:

# %%
mine = run_manual("manual_backward", fp16=True, optimizers=2, spike_at=1, iterations=3)
print(mine)
print(trace_table(mine) if mine.failed else steps_table(mine))

# %% [markdown]
# ## Check yourself
#
# Two cases the lesson did not run (work them out on paper first; `run_manual` can check you
# afterwards), then three questions that ask why.

# %%
# Three optimizers (one per layer), one self.manual_backward(loss) per iteration, Lightning's fp16
# plugin. In one iteration only optimizer 2's gradients overflow. Optimizer 3 applies its true
# gradient times what factor?
answer = None
check_third_optimizer_factor(answer)

# %%
# A LightningModule trains under Trainer(plugins=[MixedPrecision("16-mixed", "cpu")]):
#
#     def training_step(self, batch, batch_idx):
#         opt = self.optimizers()
#         opt.zero_grad()
#         self.manual_backward(self.loss(batch))
#         self.clip_gradients(opt, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
#         opt.step()
#
# The scale is 32768 after an earlier overflow, and the true gradient norm is 5. What is the
# norm of the gradient the optimizer applies? (a number)
answer = None
check_clip_before_step_norm(answer)

# %%
# Under real fp16 AMP in manual optimization, a bare loss.backward() makes the first opt.step()
# raise 'Attempted unscale_ but _scale is None'. Why? (a letter)
#   a) the precision plugin has no scaler, as with precision="16-mixed" on the CPU
#   b) the first iteration's fp16 gradients overflowed, and the scaler dropped its scale
#   c) the scaler makes its _scale at its first scaler.scale(loss), and only
#      self.manual_backward(loss) calls that (in the plugin's pre_backward); loss.backward() goes
#      around it, and opt.step() unscales all the same
#   d) the scaler cannot tell several optimizers (or a ReduceLROnPlateau scheduler) apart, and
#      unscales the wrong one
answer = None
check_why_unscale_without_scale(answer)

# %%
# One self.manual_backward(loss) feeds two optimizers under Lightning's fp16 plugin, and only
# optimizer 1's gradients overflow. Why does optimizer 2 apply twice its true gradient, while
# PyTorch's recipe (one scaler.update() after every optimizer has stepped) applies it exactly?
# (a letter)
#   a) an overflow halves the scale once for every optimizer, so the scale falls twice as fast
#   b) Lightning runs update() inside each opt.step(): optimizer 1's update() halved the scale
#      before optimizer 2 unscaled, so gradients multiplied by 65536 were divided by 32768
#   c) growth_interval counts optimizer steps, not iterations, so with two optimizers the scale
#      grows twice as often
answer = None
check_why_update_once(answer)

# %%
# Under fp16 AMP in manual optimization, why must self.clip_gradients run in
# on_before_optimizer_step, and not right before opt.step()? (a letter)
#   a) right before opt.step() the gradients are still multiplied by the scale: clipping cuts that
#      scaled norm to the clip value, and the plugin's unscale_ then divides it by the scale; the
#      hook runs after that unscale_
#   b) clipping right before opt.step() raises 'unscale_() has already been called on this
#      optimizer'
#   c) Lightning clips for you inside opt.step(), so a clip of your own before it clips twice
answer = None
check_why_clip_in_the_hook(answer)

# %% [markdown]
# ## Summary
#
# - In manual optimization, call `self.manual_backward(loss)`: it goes through the precision
#   plugin, which scales the loss (`pre_backward` returns `scaler.scale(loss)`).
# - A bare `loss.backward()` under real fp16 AMP raises
#   `Attempted unscale_ but _scale is None.  This may indicate ...` at the first `opt.step()`;
#   once a scale exists, it silently divides later gradients by the scale instead.
# - `Trainer(accelerator="cpu", precision="16-mixed")` runs bf16-mixed with no scaler: check
#   `trainer.precision` and `trainer.precision_plugin.scaler`; use
#   `plugins=[MixedPrecision("16-mixed", "cpu")]` for real fp16 on the CPU.
# - Lightning calls `scaler.update()` inside every `opt.step()`. With one `manual_backward` for
#   several optimizers, an optimizer whose gradients overflow halves the scale before the next
#   ones unscale, and each of those applies its gradient ×2. The scale falls by 2^k for k
#   overflowing optimizers (2^N only when all N overflow). PyTorch's recipe, one `update()` per
#   iteration, skips the overflowing optimizer and steps the others with their true gradients.
# - Clip in `on_before_optimizer_step`. Right before `opt.step()` you clip the scaled gradients
#   (the optimizer applies clip value / scale); your own `scaler.unscale_(opt)` unscales twice
#   (with Lightning's wrapper) or makes `opt.step()` raise (with `opt.optimizer`).
#
# **Open exercises**
# 1. Run `run_manual("loss.backward", precision="bf16-mixed")` and compare its gradient norms
#    with `fp32_reference()` (`norms_table`). Why does the wrong backward call do no harm here,
#    and which change to the Trainer makes it fail?
# 2. The mirror image of section 7: with `growth_interval=1`, two optimizers and no overflow,
#    optimizer 1's `update()` grows the scale before optimizer 2 unscales. What does optimizer 2
#    apply? With the default `growth_interval=2000`, can this happen, and when? (Try
#    `growth_interval=2` with and without `overflow_in=(1,)` at `spike_at=0`.)
# 3. Clip in `on_before_optimizer_step` and add a loss spike (`clip="in on_before_optimizer_step"`,
#    `spike_at=1`): the hook now clips gradients that hold inf and NaN. What does clipping do to
#    them, and does the optimizer step in that iteration? Why?
# 4. The GAN pattern: each optimizer gets its own forward pass, its own `self.manual_backward`
#    and its own `opt.step()` (`"manual_backward per optimizer"`). Only optimizer 1 overflows:
#    what does optimizer 2 apply now, and what happens to the scale?
#
# **Next:**
# [09 · Lightning pitfall: a `no_grad` pass inside autocast, then a pass with grad](09_lightning_autocast_cache.ipynb).

# %% [markdown]
# The lesson's claims, checked on this machine's torch and lightning:

# %%
assert on_cpu.details["precision"] == "bf16-mixed" and on_cpu.details["scaler"] is None and not on_cpu.failed
assert bug.error_type == "AssertionError" and bug.message.startswith("Attempted unscale_ but _scale is None.  This")
assert bug.details["iterations"] == 0 and bug.details["scale_calls"] == []  # first step, no scale() ever
assert bug.details["error_chain"][-3].endswith("MixedPrecision.optimizer_step")  # raised inside opt.step()
assert fix.details["scale_calls"][0][-1].endswith("MixedPrecision.pre_backward")  # manual_backward scales
assert abs(silent.details["ratio_times_scale"] - 1) < 0.01  # silent case: gradients / 65536
assert max(abs(r) for r in fix.details["rel_diff_vs_fp32"]) < 5e-3  # the fix matches fp32
assert three.scale[3:6] == [32768.0, 16384.0, 8192.0]  # all three overflow: halved three times
assert partial.scale[2:] == [32768.0, 32768.0] and applied_factor(partial, 1, 1) is None  # one halving
assert applied_factor(partial, 1, 2) == 2.0  # optimizer 2 applies twice its gradient
assert applied_factor(recipe, 1, 1) is None and applied_factor(recipe, 1, 2) == 1.0  # the recipe: right
assert recipe.scale[-1] == 32768.0
for where in CLIPS[:2]:  # clipped while scaled: applied norm × scale = the clip value
    assert all(abs(s["applied_norm"] * s["unscaled_by"] / 0.1 - 1) < 1e-4 for s in clips[where].details["steps"])
assert clips[CLIPS[2]].message == "unscale_() has already been called on this optimizer since the last update()."
assert all(abs(s["applied_norm"] / 0.1 - 1) < 1e-4 for s in clips[CLIPS[3]].details["steps"])  # the hook: right
print("all claims hold")
