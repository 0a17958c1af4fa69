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
# # 10 · Lightning pitfall: a TransformerEncoder that trains in bf16 and crashes in validation
#
# Under `precision="bf16-mixed"` every training step runs, and the first validation batch raises.
# Why only validation, exactly when, and which fixes really work.
#
# You will be able to:
# - reproduce the crash in a real `Trainer` and name every condition it needs,
# - tell the current error message from the old one that write-ups quote,
# - choose a fix, and say what it costs compared with fp32.
#
# Teaching this lesson? The [teacher's guide](../TEACHING.md#nb10) has its timings, the answers to
# its exercises and what to demo live.
# Its words in English and Chinese (中文), each with a one-line definition: the [glossary](../GLOSSARY.md).

# %%
import torch

from ampviz.pitfalls import versions
from ampviz.pitfalls.writeups import encoder_claims
from ampviz.pitfalls.transformer_eval import (check_all_false_mask, check_fp32_fast_path, check_frozen_encoder,
                                              check_furthest_fix, check_sanity_steps,
                                              check_why_not_under_cuda_autocast, check_why_only_validation,
                                              condition_table, crash, encoder_call, fix_runs, fix_table,
                                              lightning_run, old_message)

_ = torch.manual_seed(0)
torch.set_num_threads(1)
versions()

# %% [markdown]
# ## 1. The crash, in a real Trainer
#
# The model is small: token embedding plus position embedding, an `nn.TransformerEncoder`
# (2 layers of width 16, 2 heads, feed-forward width 32, no dropout, `batch_first=True`, post-norm)
# called with a `src_key_padding_mask` for right-padded sequences, a mean over the real positions,
# a linear head. `crash()` trains it for one epoch of 8 SGD steps under `precision="bf16-mixed"`
# (no sanity-check validation) and then lets Lightning validate:

# %%
# NBVAL_CHECK_OUTPUT
out = crash("bf16-mixed")
print(f"{out.error_type}: {out.message}")
print("training steps done:", out.details["train_steps"], "| validation batches done:", out.details["val_batches"])
print("raised in:", out.details["raised_in"])
print("training ran with:  ", out.details["train_context"])
print("validation ran with:", out.details["val_context"])

# %% [markdown]
# Notice:
# - All 8 training steps ran; the very first validation batch raised, inside
#   `torch._transformer_encoder_layer_fwd`, the fused "fast path" of the encoder layer.
# - Validation differs from training in exactly two ways here: eval mode (`training: False`) and
#   no gradients (`grad_enabled: False`). Autocast is on, in bf16, in both.
# - `trainer.fit` validates under `no_grad`; `trainer.validate`, `trainer.test` and
#   `trainer.predict` run under `inference_mode`, and crash the same way (below).
# - `"16-mixed"` on the CPU is turned into `"bf16-mixed"` by Lightning 2.6, with only a warning
#   (`AMP with fp16 is not supported on CPU. Using precision='bf16-mixed' instead.`), so it gives
#   the same message. Real fp16 autocast, through the `MixedPrecision("16-mixed", "cpu")` plugin,
#   says `Half` instead:

# %%
# NBVAL_CHECK_OUTPUT
for precision, stage in [("16-mixed", "fit"), ("16-mixed-fp16", "fit"), ("bf16-mixed", "validate"),
                         ("bf16-mixed", "test"), ("bf16-mixed", "predict")]:
    out = crash(precision, stage=stage)
    print(f"{precision:14} {stage:9} inference_mode={out.details['val_context']['inference_mode']!s:5}  "
          f"{out.error_type}: {out.message}")

# %% [markdown]
# ## 2. Exactly when: one condition off at a time
#
# The same encoder call in plain torch, no Lightning: a fresh fp32 encoder in eval mode, under
# `no_grad` and CPU autocast in bf16, on a right-padded batch with its padding mask. Each row
# changes one thing. Before you look, one prediction:

# %%
# Predict: an all-False padding mask pads nothing. Given one instead of the right-padded mask,
# does the encoder call still crash? Answer "yes" or "no", then run the next cell.
answer = None
check_all_false_mask(answer)

# %%
# NBVAL_CHECK_OUTPUT
condition_table()

# %% [markdown]
# Notice:
# - Ten of the fourteen changes stop the crash. The crash needs eval mode, no gradient to record,
#   `nn.TransformerEncoder` with `enable_nested_tensor=True` (the default), the fast path enabled,
#   a padding mask (even one that pads nothing), padding at the end of the sequences,
#   `batch_first=True`, `norm_first=False`, and CPU autocast (bf16 or fp16: fp16 changes only the message).
# - "No gradient to record": `no_grad` and `inference_mode` both give it. The encoder does not ask
#   whether grad mode is on, though; it asks whether autograd would have to record something:
#   grad mode on *and* its input or a weight of its first layer requiring grad (it looks at no
#   other layer).
# - With all of that, the encoder packs the padded batch into a **nested tensor** and each layer
#   runs the fused kernel. Its LayerNorm then gets bf16 activations with fp32 weights: a LayerNorm on
#   a nested tensor refuses that mix with exactly this message, one on an ordinary tensor accepts it.
#   A single `TransformerEncoderLayer` called directly packs nothing and runs; a one-layer
#   *encoder* still crashes.
# - The encoder skips the fast path when `torch.is_autocast_enabled()` is true. Called without a
#   device, that function reports CUDA's autocast only: under CPU autocast it returns `False`.
#   Switch CUDA's flag on by hand (`torch.set_autocast_enabled("cuda", True)`) and the same CPU call runs.
# - The output dtype shows the path taken: bf16 where the fused kernel ran, fp32 where the layers ran
#   as ordinary Python modules. The nested-tensor path alone leaves exact zeros at the padded
#   positions; every other path leaves values there. So pool with the mask, never over all positions.

# %% [markdown]
# ## 3. The message you will find when you search
#
# Older torch failed on the same path with a different message, and most write-ups quote that one.
# It was fixed upstream (pytorch/pytorch#132613). To see it on this torch, call the op that used to
# receive the mixed dtypes, a fused `bias + input @ weight` with a bf16 input and fp32 weights:

# %%
# NBVAL_CHECK_OUTPUT
print(old_message())

# %% [markdown]
# Notice: searching for `mat1 and mat2 must have the same dtype` finds the old bug; the current one
# reads `expected scalar type Float but found BFloat16`. Same cause (a fused kernel fed bf16
# activations and fp32 weights), different op, different text.

# %% [markdown]
# ## 4. The fixes, each with its validation loss
#
# Each fix trains the same seeded model on the same data, then validates. The reference is fp32
# (`precision="32-true"`):
# - `precision="bf16-true"`: weights and activations in bf16, no autocast;
# - an **fp32 island**: `with torch.autocast(device_type, enabled=False): h = encoder(h.float(), ...)`;
# - `enable_nested_tensor=False` on the encoder;
# - `torch.backends.mha.set_fastpath_enabled(False)` around the run (and restored afterwards: it is a
#   global switch).

# %%
# Predict: which of these four fixes ends furthest from fp32's validation loss?
# Answer with its name as in the list above, then run the next cell.
answer = None
check_furthest_fix(answer)

# %%
# NBVAL_CHECK_OUTPUT
runs = fix_runs()
fix_table(runs)

# %% [markdown]
# The exact losses on this machine. They are not checked: their last digits depend on the order in
# which the CPU adds numbers up, which varies between machines. The verdicts above are checked:

# %%
fix_table(runs, exact=True)

# %% [markdown]
# Notice:
# - Every fix validates. None of the bf16 ones gives *exactly* fp32's loss: bf16 rounds during
#   training too, so the trained weights already differ from fp32's. The three bf16-mixed fixes stay
#   within 1e-3 of fp32; `bf16-true` is further off, because its weights themselves are bf16
#   (8 significant bits), so every update to them is rounded to bf16 as well.
# - `32-true` and `bf16-true` avoid the crash by dropping autocast, so they change all of training,
#   not just validation.
# - The two targeted fixes keep bf16-mixed everywhere and change only the encoder's path. Training
#   never takes the fast path, so both train to bit-identical weights; they differ in validation only.
#   With `enable_nested_tensor=False` each layer still runs the fused kernel, on the padded batch;
#   with `set_fastpath_enabled(False)` the layers run as Python modules. The first is local to
#   one module, the second is global.

# %% [markdown]
# ## 5. What the usual advice gets wrong or leaves out
#
# - Write-ups quote `mat1 and mat2 must have the same dtype, but got BFloat16 and Float`; torch 2.13
#   prints `expected scalar type Float but found BFloat16` (or `... Half`), so a search for the old
#   text finds an already fixed bug.
# - Their fixes (`bf16-true`, `32-true`, an fp32 island, writing your own layer) work, but are broader
#   than needed; the two one-line fixes, `enable_nested_tensor=False` and
#   `torch.backends.mha.set_fastpath_enabled(False)`, are not mentioned.
# - An fp32 island has two parts: autocast off *and* `h.float()`. Here the embeddings come out in fp32
#   (an embedding is no autocast op), so the cast changes nothing; open exercise 3 shows when it matters.
# - "It's fixed, it doesn't happen on my GPU": CUDA autocast sets the flag the encoder checks, CPU
#   autocast does not.
# - Upstream: Lightning-AI/pytorch-lightning#19980; pytorch/pytorch#132613, #107663, #82783 (PR #84722).

# %% [markdown]
# ## 6. What the write-up says, measured
#
# A Chinese write-up of this crash, 《PyTorch Lightning中Transformer编码器的混合精度训练问题解析》 (the
# index names no author), quotes the old message and suggests `bf16-true` first. Its claims, beside
# section 1's crash, section 2's plain-torch call and section 4's fixes:

# %%
# NBVAL_CHECK_OUTPUT
encoder_claims(crash("bf16-mixed"), encoder_call(), runs)

# %% [markdown]
# ## Try it
#
# Switch conditions yourself: `encoder_call` takes `train`, `grad` ("no_grad", "inference_mode",
# "enabled"), `nested`, `fastpath`, `mask` ("right", "left", "all-false", "none"), `batch_first`,
# `norm_first`, `layers`, `layer_only`, `autocast` (a dtype or `None`), `frozen` (the encoder's
# weights do not require grad) and `causal` (an attention mask besides the padding mask).
# `details` holds the output dtype and whether the padded positions came out as exact zeros.
# Try two changes at once:

# %%
print(encoder_call(mask="left", grad="inference_mode"))
print(encoder_call(autocast=torch.float16, layers=1))

# %% [markdown]
# ## Check yourself
#
# The first two questions ask you to predict a run before the cell after them shows it; the last
# two ask why.

# %%
# Predict: `crash()` switched Lightning's sanity check off. A default Trainer has num_sanity_val_steps=2.
# With it, how many training steps run before the crash? Answer a number.
answer = None
check_sanity_steps(answer)

# %%
# NBVAL_CHECK_OUTPUT
out = crash("bf16-mixed", sanity_steps=2)
print(f"{out.error_type}: {out.message}")
print("training steps done:", out.details["train_steps"], "| raised in the sanity check:", out.details["sanity_check"])

# %%
# Predict: the fp32 reference run (precision="32-true") validates without any error. Does its encoder
# take the nested-tensor fast path in validation all the same? Answer "yes" or "no".
answer = None
check_fp32_fast_path(answer)

# %% [markdown]
# The same call in plain torch, without autocast: the nested-tensor path is the one that leaves
# exact zeros at the padded positions.

# %%
# NBVAL_CHECK_OUTPUT
for train in (False, True):
    out = encoder_call(autocast=None, train=train)
    print(f"{'train' if train else 'eval '} mode, no_grad, no autocast: {out}, "
          f"padded positions all zero: {out.details['padded_zero']}")

# %%
# A new case: a pretrained encoder used as a frozen feature extractor, `encoder.requires_grad_(False)`
# and `encoder.eval()`, called inside a training step (grad enabled) on an input that does not require
# grad, under CPU bf16 autocast, with a right-padded mask. Does the call crash? Answer "yes" or "no".
answer = None
check_frozen_encoder(answer)

# %%
# Why does the encoder train under precision="bf16-mixed" and crash only when Lightning validates?
# (a letter)
#   a) Lightning switches autocast off in validation, so bf16 weights meet fp32 activations
#   b) Lightning validates under torch.inference_mode(), which autocast does not support
#   c) only in eval mode with no gradient to record does the encoder pack the padded batch into a
#      nested tensor and run its fused fast path, whose LayerNorm refuses bf16 activations with
#      fp32 weights
#   d) validation batches are padded and training batches are not
answer = None
check_why_only_validation(answer)

# %%
# On a GPU, under CUDA autocast, the same encoder validates without a crash. Why? (a letter)
#   a) the bug is fixed in newer torch, and GPU builds are newer
#   b) the encoder asks torch.is_autocast_enabled(), which reports CUDA's autocast only: under
#      CUDA autocast it sees autocast and runs its layers as Python modules, under CPU autocast it
#      does not and takes the fast path
#   c) the GPU's fused kernel accepts bf16 activations with fp32 weights
answer = None
check_why_not_under_cuda_autocast(answer)

# %% [markdown]
# ## Summary
#
# - Under CPU autocast, `nn.TransformerEncoder` in eval mode, with no gradient to record, packs a
#   right-padded batch into a nested tensor and runs a fused kernel that rejects bf16 activations
#   with fp32 weights: training works, validation crashes with
#   `expected scalar type Float but found BFloat16`. With Lightning's default sanity check it
#   crashes before the first training step.
# - The message older write-ups quote (`mat1 and mat2 must have the same dtype ...`) belongs to an
#   already fixed op.
# - Fix it locally with `enable_nested_tensor=False` (or globally with
#   `torch.backends.mha.set_fastpath_enabled(False)`, restored afterwards); `bf16-true`, `32-true` and
#   an fp32 island also work but change more. Expect a validation loss close to fp32's, not equal.
# - The nested-tensor path leaves exact zeros at padded positions, in fp32 too: pool with the mask.
#
# **Next:** [11a · Loss scaling across ranks: when the scalers agree](11a_loss_scaling_across_ranks.ipynb) runs real
# `torch.distributed` ranks from a cell, one `GradScaler` each, and shows when their skip decisions
# agree and how they come apart.
#
# **Open exercises**
# 1. Pool over all positions instead of the real ones: `fix_table(fix_runs(pool="all"))`. Which
#    runs now fall outside 1e-3 of the fp32 reference? Is the reference still the right yardstick?
#    Compare `lightning_run("32-true", pool="all", fastpath=False)`, and use `encoder_call(...).details`
#    to see which path each run takes in validation.
# 2. Give the encoder a causal attention mask besides the padding mask: `encoder_call(causal=True)`.
#    Does it crash? Find the check in `nn.TransformerEncoder.forward` that explains it, and say why a
#    causal mask is still no fix for this model.
# 3. Put an `nn.Linear(16, 16)` in front of the encoder and keep the fp32 island, but leave out
#    `h.float()`: `lightning_run(project=True, fp32_island=True, cast=False)`. At which step does it
#    fail, in which op, with which message? Then run it with `cast=True` and compare its loss with
#    `lightning_run("32-true", project=True)`.

# %% [markdown]
# The lesson's claims, checked on this machine's torch and lightning:

# %%
assert crash().message == "expected scalar type Float but found BFloat16"
assert encoder_call(train=True).error_type is None and encoder_call(grad="enabled").error_type is None
assert encoder_call(nested=False).error_type is None and encoder_call(fastpath=False).error_type is None
assert old_message().message == "mat1 and mat2 must have the same dtype, but got BFloat16 and Float"
ref = runs['precision="32-true" (the fp32 reference)'].loss
assert all(not out.failed for out in runs.values())
assert all(abs(out.loss - ref) < 1e-3 for name, out in runs.items() if "bf16-true" not in name)
assert abs(runs['precision="bf16-true"'].loss - ref) < 2e-2
assert torch.backends.mha.get_fastpath_enabled()  # the global switch was restored
assert encoder_call(mask="all-false").message == crash().message  # a mask that pads nothing
assert crash(sanity_steps=2).details["train_steps"] == 0  # the default sanity check comes first
assert encoder_call(autocast=None).details["padded_zero"]  # fp32 validation takes the nested path too
assert encoder_call(grad="enabled", frozen=True).failed  # nothing to record: the fast path
print("all claims hold")
