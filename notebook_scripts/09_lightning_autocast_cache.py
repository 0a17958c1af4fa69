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
# # 09 · Lightning pitfall: a `no_grad` pass inside autocast, then a pass with grad
#
# The autocast weight cache: why an extra forward pass under `torch.no_grad()` once cost some
# layers their gradients, why it no longer does on the versions this course pins, and what the
# same cache still does today when a weight changes in place inside one autocast block.
#
# You will be able to:
# - tell from the installed torch and Lightning which part of the autocast cache can bite,
# - recognise the legacy failure: the exact `RuntimeError`, and its silent variant where a layer
#   simply stops learning,
# - predict when a forward under autocast reuses a stale low-precision copy of a weight, and fix
#   it with `cache_enabled=False` or by leaving the autocast block before the weights change.
#
# Teaching this lesson? The [teacher's guide](../TEACHING.md#nb09) has its timings, the answers to
# its exercises and what to demo live.
# Its words in English and Chinese (中文), each with a one-line definition: the [glossary](../GLOSSARY.md).

# %%
import torch

from ampviz.pitfalls.writeups import cache_claims
from ampviz.pitfalls.autocast_cache import (LOOP_CASES, SimulatedLegacyAutocastCache, autocast_source,
                                            check_fabric_loop_loss_changes, check_loop_fixes,
                                            check_no_grad_sees_update, check_params_without_grad,
                                            check_why_legacy_no_grad_pass, check_why_trainer_cache_off, fix_table,
                                            loop_table, make_model, real_lightning, real_plain,
                                            simulated_lightning, simulated_plain, stale_table, summary,
                                            training_loop, which_world, world)

_ = torch.manual_seed(0)
torch.set_num_threads(1)

# %% [markdown]
# ## 1. Which world are you in?
#
# The pattern is common: inside `training_step`, a forward pass under `torch.no_grad()` (a target
# network, an EMA model, a metric), then the forward pass whose loss is trained, both inside the
# autocast that `precision="bf16-mixed"` (or `"16-mixed"`) puts around the step. Whether that
# trains depends on the versions. `which_world()` finds out by trying, not by reading version
# numbers, and also tries the part of the cache that no version has changed:

# %%
# NBVAL_CHECK_OUTPUT
print(which_world())

# %% [markdown]
# ## 2. On the installed versions, a `no_grad` pass then a grad pass works
#
# The pattern in plain torch, with a Linear → ReLU → Linear model and with a Linear → LayerNorm
# model; `summary` names each parameter and whether `backward()` gave it a `.grad`:
#
# ```python
# with torch.autocast("cpu", dtype=torch.bfloat16):
#     with torch.no_grad():
#         model(x)                        # the extra pass
#     loss = F.mse_loss(model(x), y)      # the pass that trains
# loss.backward()
# ```

# %%
# NBVAL_CHECK_OUTPUT
print(summary(real_plain("linear")))
print(summary(real_plain("layernorm")))

# %% [markdown]
# And inside a real `Trainer(precision="bf16-mixed")`, with the same two passes in
# `training_step`; the module also records what it saw of autocast during the step:

# %%
# NBVAL_CHECK_OUTPUT
lit = real_lightning("linear")
print(summary(lit))
print(lit.details["seen in training_step"])

# %% [markdown]
# Notice: every parameter has a gradient, and inside Lightning's step the autocast **cache is
# disabled**. Two independent changes made this pattern safe:
# - **torch**: the autocast cache now always makes its cached casts with grad enabled, even under
#   `no_grad`, and caches nothing in inference mode (pytorch/pytorch PR #165068, fixing #158232).
#   This course's torch 2.13 has it; `which_world()` tells for any installed version by trying.
# - **Lightning ≥ 2.6.0**: the Trainer's precision plugin enters
#   `torch.autocast(..., cache_enabled=False)` (Lightning PR #20921, fixing #20644). Master has
#   since restored caching with a clear when a no-grad block exits (PR #21616, after the memory
#   regression #21611); 2.6.6 does not have it.
#
# Either change alone prevents this failure. Older stacks had neither: Lightning issues #17949
# (closed as won't fix), #19517, #19810, #20251; torch issues #65766, #105211, #112583.
#
# Neither change removed the cache itself. Section 5 says what it still does on torch 2.13, and
# where Lightning turns it on.

# %% [markdown]
# ## 3. A simulation of the legacy rule
#
# What follows is **not** the installed library. `SimulatedLegacyAutocastCache` is a
# `torch.overrides.TorchFunctionMode` that applies the **old** caching rule (torch's former
# `cached_cast`) to `F.linear`, so the failure can be seen on any version. The rule: under CPU
# autocast, the cast of an argument is kept and reused when the target is the autocast dtype and
# the source is an fp32 **leaf that requires grad** and is not a view (a parameter, in practice),
# with the cache enabled. The cache is emptied only when the **outermost** autocast exits (or by
# `torch.clear_autocast_cache()`). A cast made under `no_grad` has no `grad_fn`, and the grad pass
# reuses it. The same pattern as above, under the simulation:

# %%
# NBVAL_CHECK_OUTPUT
print(summary(simulated_plain("linear")))

# %% [markdown]
# Notice: this is the historical message. It is raised by `backward()` when **every** path from
# the loss to a trainable tensor passes through a cached cast: the loss then has no `grad_fn` at all.
# When some path avoids the linear layers, nothing is raised. Linear → LayerNorm (on the CPU,
# autocast runs `layer_norm` without casting its weights):

# %%
# NBVAL_CHECK_OUTPUT
print(summary(simulated_plain("layernorm")))

# %% [markdown]
# Notice: the loss has a `grad_fn` through the LayerNorm, so `backward()` succeeds, the LayerNorm
# learns, and the Linear layer's `.grad` stays `None`. The optimizer skips parameters without a
# gradient, so that layer silently keeps its initial weights. This variant is the worse one.
#
# The same in a real `Trainer`, under the simulation. A `MixedPrecision` plugin whose forward
# context enters autocast with `cache_enabled=True` recreates Lightning ≤ 2.5; the installed
# plugin (`cache_enabled=False`) is shown for comparison:

# %%
# NBVAL_CHECK_OUTPUT
print(summary(simulated_lightning("linear", plugin="legacy")))
print(summary(simulated_lightning("layernorm", plugin="legacy")))
print(summary(simulated_lightning("linear", plugin="installed")))

# %% [markdown]
# ## 4. The fixes, under the simulation
#
# Each arrangement of the two passes, under the simulated legacy rule:

# %%
# NBVAL_CHECK_OUTPUT
print(fix_table("linear"))
print()
print(fix_table("layernorm"))

# %% [markdown]
# Notice:
# - **Fix 1 works everywhere**: turn autocast off for the no-grad pass, and nothing is cast or cached there:
#   ```python
#   with torch.no_grad(), torch.autocast(device_type="cpu", enabled=False):   # "cuda" on a GPU
#       target = target_net(x)
#   ```
# - **Fix 2**, "re-enter autocast for the grad pass", works only when that autocast is top-level.
#   Nested inside an outer autocast, as in a Lightning `training_step`, the cache survives the
#   inner block (it is cleared only at the outermost exit), and the failure stays.
# - **Fix 3**: no cache (`cache_enabled=False`, what Lightning ≥ 2.6 does) or
#   `torch.clear_autocast_cache()` between the passes. Or upgrade torch or Lightning.
# - Running the grad pass first is also safe: its cached casts carry grad.

# %% [markdown]
# ## 5. Still real: a weight changed in place inside one autocast block
#
# The cache itself is taught in
# [03a · Autocast, measured: what runs in which dtype](03a_autocast.ipynb), section 4: its rules,
# and how a copy kept until the **outermost** autocast block exits goes stale when the weight
# changes in place inside the block (an `opt.step()`, a `p.data.copy_(...)`). Section 1's
# `which_world()` found the same on this machine. What is Lightning's own is where it enters
# autocast, read here from the installed source with `inspect.getsource`:

# %%
# NBVAL_CHECK_OUTPUT
print("lightning.fabric   MixedPrecision.forward_context:         ", *autocast_source("fabric"))
print("lightning.pytorch  MixedPrecision.autocast_context_manager:", *autocast_source("trainer"))

# %% [markdown]
# Notice: the Trainer's autocast passes `cache_enabled=False`, so inside `training_step` nothing is
# cached and nothing can go stale. Fabric's does not pass it: the cache is on. Every forward of a
# model returned by `fabric.setup` runs inside this context; on its own that forward is the
# outermost autocast, and its exit empties the cache. `fabric.autocast()` enters the same context,
# for code outside the model's forward: put it around the forward and the loss only, and leave it
# before `opt.step()` (Check yourself runs a loop that does not).

# %% [markdown]
# ## 6. What the write-up says, measured
#
# A Chinese write-up of this pitfall, 《PyTorch Lightning中混合精度训练与手动梯度计算的问题解析》 (the
# index names no author), explains the stale cast and offers two fixes. Its claims, beside the runs of
# sections 2 to 4 (the installed torch, and the simulated legacy rule):

# %%
# NBVAL_CHECK_OUTPUT
cache_claims(real_plain("linear"), simulated_plain("linear"), simulated_plain("linear", "autocast_off_in_no_grad"),
             simulated_plain("linear", "reenter_nested"))

# %% [markdown]
# ## Try it
#
# Write the two passes your own way under the simulation, and see which parameters get a
# gradient. Try a different order, `cache_enabled=False`, a nested `torch.autocast`, or a
# `torch.clear_autocast_cache()` between the passes:

# %%
model = make_model("layernorm")
x, y = torch.randn(32, 8), torch.randn(32, 4)
with SimulatedLegacyAutocastCache() as sim:           # the simulated legacy rule
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.no_grad():
            model(x)
        loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
print("casts reused from the cache:", sim.hits)
print({name: p.grad is not None for name, p in model.named_parameters()})

# %% [markdown]
# And the installed torch, no simulation: change the weight in place between two forwards, and
# see whether the second one notices. Try `cache_enabled=False`, `torch.inference_mode()` around
# the block, `lin.requires_grad_(False)`, or an `opt.step()` in place of the `add_`:

# %%
lin = torch.nn.Linear(8, 4)
x = torch.randn(4, 8)
with torch.autocast("cpu", dtype=torch.bfloat16):
    y1 = lin(x)
    with torch.no_grad():
        lin.weight.add_(1.0)
    y2 = lin(x)
print("y2 differs from y1:", not torch.equal(y1, y2))

# %% [markdown]
# ## Check yourself
#
# The first four questions ask you to predict a run: answer each before you run the cell that
# follows it. The last two ask why.

# %%
# Predict: under the simulated legacy rule, a Linear -> LayerNorm -> Linear model ("sandwich"),
# a no_grad pass then a grad pass inside one autocast, then backward(). How many of its six
# parameters (three weights, three biases) keep .grad = None? Answer with a number.
answer = None
check_params_without_grad(answer)

# %%
# NBVAL_CHECK_OUTPUT
print(summary(simulated_plain("sandwich")))

# %%
# Predict: on the installed torch, one autocast block (cache on); y1 = lin(x) under torch.no_grad(),
# then lin.weight.add_(1), then y2 = lin(x) under torch.no_grad() again. Does y2 differ from y1?
# Answer "yes" or "no".
answer = None
check_no_grad_sees_update(answer)

# %%
# NBVAL_CHECK_OUTPUT
print(stale_table(["no_grad_passes", "inference_mode", "frozen_weight"]))

# %%
# Predict: Fabric(accelerator="cpu", precision="bf16-mixed"), a model and an SGD optimizer from
# fabric.setup, and this loop on one fixed batch:
#     with fabric.autocast():
#         for step in range(5):
#             opt.zero_grad(); loss = F.mse_loss(model(x), y); fabric.backward(loss); opt.step()
# Does the loss change from step to step? Answer "yes" or "no".
answer = None
check_fabric_loop_loss_changes(answer)

# %%
# NBVAL_CHECK_OUTPUT
print(loop_table(["fabric_outer", "fabric_per_step", "outer", "per_step"]))

# %%
# A plain torch loop that never trains (the loss stays at its first value):
#     with torch.autocast("cpu", dtype=torch.bfloat16):
#         for step in range(5):
#             opt.zero_grad()
#             loss = F.mse_loss(model(x), y)
#             loss.backward()
#             opt.step()
# Which of these changes, each made alone, make its loss fall? Answer with the letters, e.g. "a, c".
#   (a) wrap opt.step() in torch.no_grad()
#   (b) pass cache_enabled=False to torch.autocast
#   (c) call opt.zero_grad(set_to_none=False) in place of opt.zero_grad()
#   (d) call torch.clear_autocast_cache() right after opt.step()
answer = None
check_loop_fixes(answer)

# %%
# NBVAL_CHECK_OUTPUT
print(loop_table(["outer_no_grad_step", "outer_cache_disabled", "outer_zero_grad_keep",
                  "outer_clear_after_step"]))

# %%
# Under the simulated legacy rule, the Linear -> LayerNorm model runs a no_grad pass, then a grad
# pass, inside one autocast block, and backward() leaves its Linear layer with .grad = None. Why?
# (a letter)
#   a) torch.no_grad() switches requires_grad off on the parameters until the autocast block exits
#   b) the no_grad pass cached the bf16 casts of the Linear weights, made without a grad_fn, and
#      the grad pass was handed the same casts: the cache is emptied only when the outermost
#      autocast exits
#   c) a bf16 cast made under autocast never carries a gradient back to its fp32 weight
#   d) the optimizer skips the Linear layers, whose bf16 gradients are too small
answer = None
check_why_legacy_no_grad_pass(answer)

# %%
# Inside a Trainer(precision="bf16-mixed") training_step, a weight changed in place is never
# served stale, yet a training loop inside one `with fabric.autocast():` computes the same loss at
# every step. Why the difference? (a letter)
#   a) the Trainer clears the autocast cache after every optimizer step
#   b) the Trainer's precision plugin enters autocast with cache_enabled=False, so nothing is
#      cached; Fabric's enters it without that argument, with the cache on
#   c) training_step runs outside autocast: the Trainer casts the model to bf16 itself
#   d) Fabric's bf16-mixed keeps the weights themselves in bf16, so opt.step()'s small updates are
#      rounded away
answer = None
check_why_trainer_cache_off(answer)

# %% [markdown]
# ## Summary
#
# - Fixed: on torch with PR #165068 (this course's 2.13 has it) and on Lightning ≥ 2.6.0, a
#   `no_grad` pass then a grad pass inside one autocast trains correctly: cached casts carry grad,
#   and the Trainer's autocast does not cache.
# - Under the legacy rule, casts of parameters made in the `no_grad` pass were reused by the grad
#   pass until the outermost autocast exited. If every path to a trainable tensor went through
#   them: `RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn`.
#   Otherwise, silently, some layers got no gradient. Portable fix:
#   `with torch.no_grad(), torch.autocast(device_type, enabled=False):` for the extra pass.
# - Still real on torch 2.13: the cache keeps a weight's bf16/fp16 copy until the outermost
#   autocast exits. A weight changed in place inside one block (an `opt.step()`, an EMA copy) is
#   not seen by later forwards there, under `no_grad` too; a whole training loop inside one
#   autocast (or one `fabric.autocast()`) computes the same loss at every step.
# - Fix: `cache_enabled=False`, or `torch.clear_autocast_cache()` after the update, or autocast
#   around the forward and the loss only, left before `opt.step()`. Re-entering autocast inside
#   an outer block does not clear anything. Lightning's Trainer passes `cache_enabled=False`;
#   Fabric's autocast keeps the cache on.
#
# **Next:**
# [10 · Lightning pitfall: a TransformerEncoder that trains in bf16 and crashes in validation](10_lightning_transformer_eval.ipynb).
#
# **Open exercises**
# 1. In the first *Try it* cell, put the grad pass first and the `no_grad` pass second. How many
#    casts are reused from the cache, do all parameters get a gradient, and why is this order safe
#    under the legacy rule?
# 2. What does the cache buy? In the second *Try it* cell, make `lin` an `nn.Linear(4096, 4096)`
#    and `x` a `(64, 4096)` batch, and time 20 forwards inside one autocast block against 20
#    forwards each in its own block (`time.perf_counter`), in bf16 and in fp16. How much does
#    the cache save on this machine?
# 3. Keep `fabric.autocast()` in the frozen Fabric loop of *Check yourself*, but move it so that
#    the model trains. Where must the `with` go, and what does the loss do over 5 steps?
# 4. A `Trainer(precision="bf16-mixed")` with manual optimization: in one `training_step`, a
#    forward, `opt.step()`, then a second forward of the same batch. Does the second forward see
#    the update on Lightning 2.6.6? What changes with a plugin that enters autocast with
#    `cache_enabled=True`, as Lightning ≤ 2.5 did?

# %% [markdown]
# The lesson's claims, checked:

# %%
error = "RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn"
w = world()
assert w["torch: grad pass after a no_grad pass gets gradients"]  # fixed in the installed torch
assert not w["torch: in-place weight update seen inside one autocast block"]  # still real
assert w["lightning bf16-mixed autocast cache_enabled"] is False  # the Trainer: no cache
assert w["lightning fabric bf16-mixed autocast cache_enabled"] is True  # Fabric: the cache is on
assert "cache_enabled" not in autocast_source("fabric")[0]
assert "cache_enabled=False" in autocast_source("trainer")[0]
assert None not in real_plain("linear").grad_norms.values()
assert None not in lit.grad_norms.values() and not lit.details["seen in training_step"]["autocast cache enabled"]
assert summary(simulated_plain("linear")).endswith(error)  # the simulation: the error ...
silent = simulated_plain("layernorm").grad_norms  # ... and the silent variant
assert silent["0.weight"] is None and silent["1.weight"] is not None
assert summary(simulated_lightning("linear", plugin="legacy")).endswith(error)
for fix in ("autocast_off_in_no_grad", "reenter_top_level", "cache_disabled", "clear_cache"):
    assert simulated_plain("linear", fix).grad_norms == real_plain("linear").grad_norms, fix
assert summary(simulated_plain("linear", "reenter_nested")).endswith(error)  # nested re-entry fails
stale = stale_table()
assert stale.column("bf16: y2") == stale.column("fp16: y2") == ("stale: old weight",) * 2 + ("changes",) * 4
losses = {case: training_loop(case).details["losses"] for case in LOOP_CASES}
frozen = {case for case, values in losses.items() if len(set(values)) == 1}
assert frozen == {"outer", "outer_no_grad_step", "outer_zero_grad_keep", "fabric_outer"}, frozen
print("all claims hold")
