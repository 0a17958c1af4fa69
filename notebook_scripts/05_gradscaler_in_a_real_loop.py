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
# # 05 · GradScaler in a real loop: accumulation, several optimizers, checkpoints
#
# The real `torch.amp.GradScaler("cpu")` in the loops people write, each one done wrong and then
# right: the exact error, or the silent symptom, measured.
#
# You will be able to:
# - place `scale`, `unscale_`, `step` and `update` in a loop with gradient accumulation, several
#   losses and optimizers, gradient clipping or a gradient penalty,
# - checkpoint and resume a scaler without losing steps, and tell from its scale whether a step happened,
# - check your own training step against a reference, scenario by scenario.
#
# Teaching this lesson? The [teacher's guide](../TEACHING.md#nb05) has its timings, the answers to
# its exercises and what to demo live.
# Its words in English and Chinese (中文), each with a one-line definition: the [glossary](../GLOSSARY.md).

# %%
import dataclasses

import torch

from ampviz.training.loopcheck import (MISTAKES, SCENARIOS, accumulation_report, check_accumulation_scale,
                                       check_loop, check_order_of_updates, check_resume_burst,
                                       check_scale_test_with_two_optimizers, check_train_loop,
                                       check_why_one_update, check_why_save_scaler_state,
                                       check_why_whole_step_skipped,
                                       checkpoint_report, clipping_report, load_checkpoint, mistaken_loop,
                                       optimizers_report, penalty_report, reference_step, save_checkpoint,
                                       skipped_step_report)

_ = torch.manual_seed(0)
torch.set_num_threads(1)

# %% [markdown]
# ## 1. Gradient accumulation: scale every micro-batch, step once
#
# Every run here trains `LoopNet`, two small linear layers `a` and `b` that run in fp16 under
# `torch.autocast("cpu", dtype=torch.float16)`, with the real `GradScaler("cpu")` at scale 2^10.
# A *loss spike* is a batch whose targets jump by 10^4: its scaled fp16 backward overflows.
# Accumulating two micro-batches into one optimizer step, right and wrong:

# %%
# NBVAL_CHECK_OUTPUT
accumulation_report(micro_batches=2)

# %% [markdown]
# Notice:
# - One spike in micro-batch 2 of 2 skips the **whole** step: micro-batch 1's clean gradients go
#   with it, the weights do not move, and the one `update()` halves the scale once (1024 → 512).
#   `unscale_` checks the accumulated gradients, and one inf among them is enough.
# - `update()` after every micro-batch raises at its first call,
#   `AssertionError: No inf checks were recorded prior to update.`: no `step` or `unscale_` has run yet.
# - `unscale_` after every micro-batch raises too,
#   `RuntimeError: unscale_() has already been called on this optimizer since the last update().`
#
# The right loop scales every micro-batch's loss (divided by their number: the step's loss is
# their mean) and unscales, steps and updates once:
#
# ```python
# optimizer.zero_grad()
# for x, y in micro_batches:
#     with torch.autocast("cpu", dtype=torch.float16):
#         loss = model(x, y) / len(micro_batches)
#     scaler.scale(loss).backward()
# scaler.step(optimizer)
# scaler.update()
# ```

# %% [markdown]
# ## 2. Several losses, several optimizers: one `update()`
#
# `model.losses(x, y)` gives part a's loss and part b's; each part has its own SGD optimizer, and
# one scaler serves both. Scale each loss (or their sum) and backward, call `scaler.step` for each
# optimizer, then `update()` **once**. In the rows that say so, part a's targets spike; with
# `growth_interval=1` a clean step doubles the scale:

# %%
# NBVAL_CHECK_OUTPUT
optimizers_report()

# %% [markdown]
# Notice:
# - When a's gradients overflow, only optimizer a skips; b steps, and the one `update()` halves
#   the scale once. The scaler keeps `found_inf` per optimizer.
# - Scaling the sum once gives the same weights, bit for bit, as one scale per loss.
# - `update()` after each optimizer's step raises nothing, and is wrong. b's gradients were scaled
#   by 1024, but `scaler.step(b)` unscales them by the scale a's `update()` has just set: 512 after
#   a's overflow, so b applies **2×** its gradient; 2048 after a growth, so b applies **½×**. And
#   the scale moves twice per iteration: 1024 → 4096 where the right loop gives 2048.

# %% [markdown]
# ## 3. Clipping: after `unscale_`, or it sees S × the norm
#
# `clip_grad_norm_` compares the gradients' norm with `max_norm` and returns the norm it saw. Call
# `scaler.unscale_(optimizer)` first; `scaler.step` then does not unscale again. One step at scale
# 2^10, clipped to `max_norm=1`, in both orders:

# %%
# NBVAL_CHECK_OUTPUT
clipping_report(max_norm=1.0)

# %% [markdown]
# Notice: before `unscale_`, `clip_grad_norm_` sees and returns about 1737, exactly 1024 × the true
# norm (about 1.697): a logged gradient norm that is S times too large is this mistake. It then cuts
# the scaled gradients to norm 1, `step` divides them by 1024, and the optimizer applies a gradient
# of norm 2^-10 instead of 1: training crawls, with no error and no warning.

# %% [markdown]
# ## 4. A gradient penalty: unscale by hand
#
# A gradient penalty adds ‖∇loss‖² to the loss. Take the gradients with `torch.autograd.grad` from
# the **scaled** loss, as torch's AMP examples do: they are S·g, and nothing unscales them, since
# `unscale_` only touches `.grad`. Divide by the scale yourself:
#
# ```python
# scaled = torch.autograd.grad(scaler.scale(loss), params, create_graph=True)
# grads = [g / scaler.get_scale() for g in scaled]
# with torch.autocast("cpu", dtype=torch.float16):
#     loss = loss + sum(g.pow(2).sum() for g in grads)
# scaler.scale(loss).backward()   # then step and update as usual
# ```
#
# The penalty at scale 2^10, and 6 iterations of training with each version:

# %%
# NBVAL_CHECK_OUTPUT
penalty_report(iterations=6)

# %% [markdown]
# Notice: without the division the penalty is 2^20 (S²) times too large and its norm 2^10 (S)
# times. Trained with it, every one of the 6 steps is skipped and the scale falls from 1024 to 16:
# the gradients of the oversized penalty overflow at each of these scales. In a log of the scale,
# the symptom is a scale that keeps falling where a healthy run settles.

# %% [markdown]
# ## 5. Checkpoint and resume: save the scaler too
#
# A scaler's state is five numbers, `scaler.state_dict()`. The run below starts at the default
# 2^16 on targets with larger values, where a scale of 512 or more overflows and 256 does not: the
# scale falls to 256 in its first 8 steps and stays. After 12 iterations it is checkpointed and
# continued for 12 more in fresh objects, once with the scaler's state restored and once without.
# Predict first, then run the cell below.

# %%
# Predict: resumed without the scaler's state, how many of the next 12 steps are skipped?
answer = None
check_resume_burst(answer)

# %%
# NBVAL_CHECK_OUTPUT
checkpoint_report()

# %% [markdown]
# Notice:
# - `state_dict()` holds the scale, the three settings and `_growth_tracker`, the clean steps
#   counted since the last backoff (here 4). Restored, the run goes on with 0 skipped steps and is
#   bit for bit the run that never stopped.
# - Without it, the fresh scaler starts again at 2^16 and falls back to 256: the first 8 steps
#   after resuming are skipped, the same burst as at the start of training, and the run no longer
#   matches. Save and restore it with the rest:
#
# ```python
# checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
#               "scaler": scaler.state_dict()}
# ...
# scaler.load_state_dict(checkpoint["scaler"])
# ```
#
# - After `load_state_dict`, `scaler._scale` is None until the first `scale()` creates it (256).
#   `get_scale()` already reads 256, so log the scale with `get_scale()`.
# - A scaler built with `enabled=False` (an fp32 or bf16 run) saves an empty state dict, and an
#   enabled scaler refuses it: `RuntimeError: The source state dict is empty, possibly because it
#   was saved from a disabled instance of GradScaler.`

# %% [markdown]
# ## 6. Did the step happen? The scheduler and the scale log
#
# `scaler.step()` returns None whether it stepped or not (notebook 04, section 7). `update()` lowers
# the scale exactly when a step was skipped, so compare `get_scale()` across it. Older versions of
# Hugging Face Accelerate computed `optimizer_step_was_skipped` this way; newer ones record whether
# the scaler called `optimizer.step`, as the column "optimizer.step() really" does here (a step
# hook). Section 5's problem from 2^16, with `StepLR(step_size=1, gamma=0.5)` after every iteration:

# %%
# NBVAL_CHECK_OUTPUT
skipped_step_report()

# %% [markdown]
# Notice: comparing the scale gives the real answer at every iteration. The scheduler was stepped
# through the 8 skipped steps, so torch warns, and the first step that runs uses a learning rate of
# 3.90625e-06, 0.001 × 2^-8: 8 values of the schedule went to steps that never happened. Step the
# scheduler only when the step happened:
#
# ```python
# scale_before = scaler.get_scale()
# scaler.step(optimizer)
# scaler.update()
# if scaler.get_scale() >= scale_before:   # not lowered: the step happened
#     scheduler.step()
# ```

# %%
# NBVAL_CHECK_OUTPUT
skipped_step_report(guard=True)

# %% [markdown]
# Notice: no warning, and the first real step uses the schedule's first value, 0.001. The "scale"
# column is the log worth keeping beside the loss: from the default 2^16 it falls in the first
# steps and then holds (or saw-tooths, notebook 06). A scale that keeps falling (section 4) or
# starts over at 2^16 in the middle of a run (section 5) is a bug in the loop.

# %% [markdown]
# ## 7. One checker for the whole loop
#
# `check_loop(train_step, save=..., load=...)` runs a training step through five adversarial
# scenarios beside `reference_step`, and compares the scale, which optimizers skipped and the
# weights after every iteration: bit for bit, or within rounding (a loop written differently, such
# as one backward of the summed losses, sums in another order), which its verdict then says.
# `train_step(model, optimizers, scaler, batches, max_norm)` does one optimizer step: `batches` is
# a list of micro-batches `(x, y)`, `optimizers` a list, `max_norm` a norm to clip to, or None. The scenarios, and the reference loop's verdict:

# %%
# NBVAL_CHECK_OUTPUT
for scenario in SCENARIOS.values():
    print(f"{scenario.name:15} {scenario.title}")
print()
print(check_loop(reference_step, save=save_checkpoint, load=load_checkpoint))

# %% [markdown]
# `mistaken_loop(name)` writes the loop with one classic mistake, one of `MISTAKES`. Section 2's
# silent one, `update()` after each optimizer:

# %%
# NBVAL_CHECK_OUTPUT
check_loop(**mistaken_loop("update() after each optimizer"))

# %% [markdown]
# Notice: one line per scenario; only the scenario with two optimizers catches this mistake, and
# its line says what the loop did and what to do instead. The other four pass, because with one
# optimizer the loop is right.

# %% [markdown]
# ## Try it
#
# Pick a mistake and the scenarios to run it through. A scenario of your own is a copy of one
# with other settings: `dataclasses.replace(SCENARIOS["accumulation"], name="mine", ...)` with a
# spike elsewhere (`spikes=((iteration, micro_batch, "a", "b" or "ab"),)`), `micro_batches=4`,
# `max_norm=0.1`, `growth_interval=1000`... Can you find a scenario that a mistake passes?

# %%
print(*MISTAKES, sep="\n")
mistake = "resume without the scaler's state"
late = dataclasses.replace(SCENARIOS["accumulation"], name="late spike", micro_batches=4, spikes=((4, 3, "ab"),))
check_loop(**mistaken_loop(mistake), scenarios=["resume", late])

# %% [markdown]
# ## Check yourself

# %%
# Gradient accumulation over 4 micro-batches, from scale 1024: loss spikes in micro-batches
# 1 and 3 of the same step. What is the scale after the step?
answer = None
check_accumulation_scale(answer)

# %%
# With gradient accumulation, why does one overflowing micro-batch skip the whole step, the clean
# micro-batches' gradients too? (a letter)
#   a) scaler.scale() checks each micro-batch's loss, and the spike's loss is too large
#   b) every micro-batch's backward adds into the same .grad, and unscale_ checks that sum once per step:
#      an inf in one micro-batch's gradients makes the sum inf
#   c) update() runs after each micro-batch and halves the scale, so the earlier micro-batches'
#      gradients no longer match it
answer = None
check_why_whole_step_skipped(answer)

# %%
# Two optimizers with update() after each optimizer's step (section 2's mistake), and this time
# only part b's gradients overflow. Optimizer a applies its right gradient times what factor?
answer = None
check_order_of_updates(answer)

# %%
# Two optimizers share one scaler. Why must update() run once per iteration, after every
# optimizer's scaler.step, and not after each of them? (a letter)
#   a) a second update() in one iteration raises an error
#   b) the scaler keeps a scale per optimizer, and one update() must see them all to combine them
#   c) there is one scale for all the optimizers: an update() between two steps changes it before the
#      next optimizer's gradients, scaled by the old one, are unscaled
#   d) with an update() per optimizer, one optimizer's overflow skips every optimizer's step
answer = None
check_why_one_update(answer)

# %%
# Two optimizers, one scaler; only part a's gradients overflow, and b steps. Does the scale test
# (get_scale() lower after update() than before) call this iteration skipped? "yes" or "no"
answer = None
check_scale_test_with_two_optimizers(answer)

# %%
# Why must a checkpoint hold scaler.state_dict() as well as the model's and the optimizer's? (a letter)
#   a) the scaler's state holds the last step's scaled gradients, which the next step needs
#   b) resuming without it raises an error at the first scaler.step()
#   c) a fresh scaler starts again at 2^16 and skips steps while it backs off to the scale the run had
#      settled at; restored, the run goes on as if it had never stopped
answer = None
check_why_save_scaler_state(answer)

# %% [markdown]
# Now write the loop yourself: `train_step(model, optimizers, scaler, batches, max_norm)` does one
# optimizer step with gradient accumulation over `batches` (the micro-batches `(x, y)`; the loss
# of one is `model(x, y)`, computed under `torch.autocast("cpu", dtype=torch.float16)`), steps
# every optimizer in `optimizers`, and clips each optimizer's gradients to `max_norm` unless it
# is None. To check resuming too, write `save(model, optimizers, scaler)`, which returns a
# checkpoint, and `load(checkpoint, model, optimizers, scaler)`, which restores it into fresh objects.

# %%
def train_step(model, optimizers, scaler, batches, max_norm):
    ...  # your code here


def save(model, optimizers, scaler):
    ...  # your code here: return the checkpoint


def load(checkpoint, model, optimizers, scaler):
    ...  # your code here


# answer = train_step checks the step; answer = (train_step, save, load) checks resuming too
answer = None
check_train_loop(answer)

# %% [markdown]
# ## Summary
#
# - Accumulation: scale every micro-batch's loss, then `unscale_`, `step` and `update` once per
#   optimizer step. One overflowing micro-batch skips the whole step and halves the scale once;
#   `update()` or `unscale_` per micro-batch raises.
# - Several losses and optimizers: scale each loss (or the sum), `scaler.step` each optimizer, one
#   `update()`. Only the optimizers whose gradients overflowed skip; an `update()` per optimizer
#   silently gives the later optimizers 2× or ½× their gradient.
# - Clip after `unscale_`; gradients from `torch.autograd.grad` on the scaled loss are S·g: divide
#   them by `get_scale()` yourself.
# - Checkpoint `scaler.state_dict()` with the model and the optimizers: resuming without it costs
#   a burst of skipped steps (8 here). `_scale` is None until the first `scale()` after loading;
#   `get_scale()` is not. A disabled scaler's empty state cannot be loaded into an enabled one.
# - A step was skipped when `get_scale()` fell across `update()`; step the scheduler only
#   otherwise, and log the scale.
#
# **Next:** [06 · The scaling lab: dynamic loss scalers under pressure](06_scaling_lab.ipynb) puts the
# loss scalers of torch, DeepSpeed, Megatron, NeMo, Keras and JAX side by side, in a live lab.
#
# **Open exercises**
# 1. Run `checkpoint_report(checkpoint_at=4)`: the checkpoint is taken while the scale is still
#    coming down. What does the state dict hold, and how many steps does resuming without it cost now?
# 2. Run `clipping_report(max_norm=100)`, a threshold the true gradient norm never reaches. What
#    does each order apply?
# 3. Run `check_loop(**mistaken_loop("update() after each optimizer"), scenarios=[mine])` with
#    `mine = dataclasses.replace(SCENARIOS["two_optimizers"], name="mine", spikes=((2, 0, "b"),),
#    growth_interval=1000)`. Why does the mistake pass here, and what would show it in a longer run?
# 4. Run `penalty_report(iterations=64)`. Does the scale of the loop that forgets to unscale ever
#    stop falling? Where, after how many skipped steps, and what does its penalty weigh there?

# %% [markdown]
# The lesson's claims, checked against the real `torch.amp.GradScaler("cpu")`:

# %%
acc = accumulation_report(micro_batches=2)
assert acc[1].stepped == (False,) and acc[1].weights_changed == (False,)  # a spike in 1 of 2 skips the step
assert (acc[1].scale_before, acc[1].scale_after, acc[1].updates) == (1024.0, 512.0, 1)  # halved once
assert acc[2].error == "AssertionError: No inf checks were recorded prior to update." and acc[2].updates == 1
assert acc[3].error == "RuntimeError: unscale_() has already been called on this optimizer since the last update()."
opt = optimizers_report()
assert opt[1].stepped == (False, True) and (opt[1].scale_after, opt[1].updates) == (512.0, 1)  # only a skips
assert opt[2].note == "weights as in the row above: True"  # scaling the sum: the same weights
assert opt[3].note == "b's gradient × 2 of the right one" and opt[5].note == "b's gradient × 0.5 of the right one"
assert (opt[4].scale_after, opt[5].scale_after) == (2048.0, 4096.0)  # the scale moves twice per iteration
clip = clipping_report(max_norm=1.0)
assert clip.ratio == 1024.0 and abs(clip.norm / 1.697 - 1) < 1e-3  # ‖g‖ ≈ 1.697, seen as 1024 × that
assert abs(clip.applied_wrong / 2.0**-10 - 1) < 1e-5 and abs(clip.applied_right - 1) < 1e-5  # norm 2^-10, not 1
pen = penalty_report(iterations=6)
assert pen.wrong_penalty / pen.penalty == 2.0**20 and pen.wrong_norm / pen.norm == 2.0**10  # S², S
assert pen.runs[0][2] == (False,) * 6 and pen.runs[1][2] == (True,) * 6  # every step skipped ...
assert pen.runs[1][1][0] == 512.0 and pen.runs[1][1][-1] == 16.0  # ... the scale from 1024 to 16
ckpt = checkpoint_report()
assert ckpt.skipped_before == 8 and ckpt.settled_scale == 256.0  # 2^16 falls to 256 in 8 skipped steps
assert ckpt.state_dict == {"scale": 256.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000,
                           "_growth_tracker": 4}
assert (ckpt.skipped_with_state, ckpt.same_with_state) == (0, True)  # restored: the same run
assert (ckpt.skipped_without_state, ckpt.same_without_state) == (8, False)  # not restored: 8 skipped
assert ckpt.scales_without_state[0] == 2.0**15 and ckpt.scales_without_state[7] == 256.0  # from 2^16 again
assert ckpt.scale_is_none_after_load and ckpt.get_scale_after_load == ckpt.scale_after_first_scale == 256.0
assert torch.amp.GradScaler("cpu", enabled=False).state_dict() == {}  # a disabled scaler saves nothing
assert ckpt.empty_state_error == ("RuntimeError: The source state dict is empty, possibly because it was saved "
                                  "from a disabled instance of GradScaler.")
plain, guarded = skipped_step_report(), skipped_step_report(guard=True)
assert plain.skipped_by_scale == plain.skipped_really == (True,) * 8 + (False,) * 4  # the scale test is right
assert len(plain.warnings) == 1 and "skipping the first value of the learning rate schedule" in str(plain.warnings[0])
assert plain.lr_at_first_step == 3.90625e-06 == 0.001 * 2.0**-8  # 8 values of the schedule lost
assert guarded.warnings == () and guarded.lr_at_first_step == 0.001
assert check_loop(reference_step, save=save_checkpoint, load=load_checkpoint).verdict == "all 5 scenarios ok"
assert check_loop(**mistaken_loop("update() after each optimizer")).verdict == (
    "1 of 5 scenarios wrong: two_optimizers")
print("all claims hold")
