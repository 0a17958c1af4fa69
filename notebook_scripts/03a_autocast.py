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
# # 03a · Autocast, measured: what runs in which dtype
#
# What `torch.autocast` does to each op, to the loss and to the weights, measured on this machine.
# Its second half, [03b · bf16 in practice: no loss scaler, and the updates bf16 weights lose](03b_bf16_in_practice.ipynb),
# takes the same [autocast](../GLOSSARY.md#autocast) into bf16 training.
#
# You will be able to:
# - predict the dtype an op runs in under CPU or CUDA autocast, and say why the loss comes out fp32
#   and what that does (and does not do) for the first step,
# - tell when autocast reuses a cached low-precision copy of a weight, and when that copy is stale.
#
# Teaching this lesson? The [teacher's guide](../TEACHING.md#nb03a) has its timings, the answers to
# its exercises and what to demo live.
# Its words in English and Chinese (中文), each with a one-line definition: the [glossary](../GLOSSARY.md).

# %%
import numpy as np
import torch

from ampviz.training.autocast import (cache_table, check_casts_inside_outer, check_softmax_dtype,
                                      check_sum_loss_step, check_why_softmax_dtype,
                                      check_why_stale_copy, compile_table, layer_walk, loss_report, loss_table,
                                      op_table, under_autocast, weight_casts)

rng = np.random.default_rng(0)
_ = torch.manual_seed(0)
torch.set_num_threads(1)


# %% [markdown]
# ## 1. What autocast does to one layer
#
# Inside a `torch.autocast` block, some ops cast their inputs to a lower-precision dtype before
# they run. `layer_walk()` runs one `nn.Linear(8, 4)` on a float32 batch inside
# `torch.autocast("cpu", dtype=torch.float16)`, records every op that reaches torch's dispatcher
# (autocast's own casts included), then runs a backward pass after the block:

# %%
# NBVAL_CHECK_OUTPUT
layer_walk()

# %% [markdown]
# Notice:
# - The parameters stay fp32, before, inside and after the block. Autocast makes fp16 **copies**
#   of the bias, the weight and the input (`aten._to_copy`), and the matrix product (`aten.addmm`)
#   runs on the copies. The output `y` is fp16.
# - The cast is part of the autograd graph (`ToCopyBackward0`), so the backward pass goes through
#   it, and `lin.weight.grad` is fp32, like the weight: the fp32 "master weights" of notebook 01
#   are simply the model's own parameters.

# %% [markdown]
# ## 2. Which ops run in which dtype
#
# Autocast keeps lists: ops it runs in the low-precision dtype (matrix products, convolutions),
# ops it runs in fp32 (losses, some reductions), ops whose mixed inputs it casts to the widest
# dtype. Every other op runs in the dtype of its inputs. CPU and CUDA autocast keep separate lists.
# Predict first:

# %%
# Predict: under torch.autocast("cpu", dtype=torch.float16), torch.softmax(lin(x), dim=-1) for a
# Linear layer lin and a float32 batch x: which dtype comes out? (e.g. "fp16" or "fp32")
answer = None
check_softmax_dtype(answer)

# %% [markdown]
# `op_table()` runs 41 ops under CPU autocast on float32 inputs, in fp16 and in bf16, and reads the
# dtype that comes out; where fp32 comes out it runs the op again on low-precision inputs, to tell
# "ran in fp32" (a rule) from "as its input" (no rule). Beside them: torch's documented CUDA lists,
# and this torch build's CUDA rules run on fake CUDA tensors (the CUDA autocast code picks the
# dtypes; no GPU kernel runs, and none is needed). "(mixed)": one input already low-precision.

# %%
# NBVAL_CHECK_OUTPUT
ops = op_table(cuda="fake")
ops

# %% [markdown]
# Notice:
# - The matrix products and convolutions run in fp16 or bf16, on the CPU and on CUDA alike.
# - The losses (`mse_loss`, `cross_entropy`, `nll_loss`, `l1_loss`, ...) and `prod` run in fp32.
# - `relu`, `gelu`, `tanh`, `sigmoid`, `batch_norm`, `mean`, `dropout`, `embedding` are on no list
#   anywhere: they run in the dtype they are given. An fp16 and an fp32 tensor added or multiplied
#   give fp32 by torch's own type promotion, not by autocast.
# - `scaled_dot_product_attention` runs in fp16 on CUDA too, although the documentation's lists
#   leave it out: the documented column is not always what the build does.
#
# The 17 ops where CPU and CUDA autocast disagree:

# %%
# NBVAL_CHECK_OUTPUT
ops.differences_table()

# %% [markdown]
# Notice:
# - `softmax`, `log_softmax`, `layer_norm`, `group_norm`, `rms_norm`, `softplus`, `exp`, `log`,
#   `pow`, `sum`, `cumsum`, `norm`: CUDA autocast runs them in fp32. CPU autocast has no rule for
#   them, so after a Linear layer they run in fp16 (the prediction above): the same model computes
#   them in fp16 under CPU autocast and in fp32 under CUDA autocast.
# - `mv` runs in fp16 on CUDA and is on no CPU list. `binary_cross_entropy` runs in fp32 on the
#   CPU, and CUDA autocast refuses it. Under CPU bf16 autocast, `torch.cat` of an fp16 and an fp32
#   tensor raises (the widest-dtype rule there expects only bf16 and fp32). The exact messages:

# %%
# NBVAL_CHECK_OUTPUT
print("CPU bf16 autocast, torch.cat([fp16, fp32]):", ops.row("cat (fp16 + fp32)").measured["bfloat16"].error)
print("CUDA autocast, F.binary_cross_entropy:", ops.row("binary_cross_entropy").cuda.error)

# %% [markdown]
# The rest of CUDA's message names the way out: `F.binary_cross_entropy_with_logits` on the logits
# (before the sigmoid), which both devices run in fp32.

# %% [markdown]
# ## 3. Why the loss comes out fp32, and what that does for the first step
#
# The losses are on autocast's fp32 list: the model's output is fp16, its loss fp32. One training
# step with a real `torch.amp.GradScaler("cpu")` at its default scale, 65536, shows what that buys
# (`nn.Linear(4, 3)`, a batch of 8, so 24 outputs; five ways to compute the loss):

# %%
# NBVAL_CHECK_OUTPUT
loss_table()

# %% [markdown]
# Notice:
# - `mse_loss` and `cross_entropy` come out fp32, and so does `scaler.scale(loss)`: cross_entropy ×
#   65536 is about 8.9·10⁴, past fp16's 65504, and a finite fp32 number.
# - The backward pass then carries 65536 × d(loss)/d(output) into the fp16 output. For a mean over
#   24 outputs that is about 10⁴ (1.118·10⁴ and 7460 here): it fits in fp16, and step 1 runs.
# - `output.sum()` and `output.mean()` stay fp16 on the CPU (on no CPU list); the gradient of the
#   fp16 loss itself, 65536, is inf in fp16, so GradScaler skips step 1 and halves the scale.
# - `output.float().sum()` is an fp32 loss and still overflows: d(loss)/d(output) is 1, so 65536
#   enters the fp16 output. An fp32 loss keeps the loss finite; the backward pass needs
#   S × d(loss)/d(output) below 65504, and GradScaler finds such an S by trial (notebook 04).

# %% [markdown]
# ## 4. The weight cache
#
# Inside one autocast block, torch caches the cast copy of a weight (the
# [weight cache](../GLOSSARY.md#weight-cache)): a second forward of the same layer reuses it. `weight_casts(case)` runs two forwards of an `nn.Linear(8, 4)` on the same
# input and counts, at the dispatcher, every cast autocast makes:

# %%
# NBVAL_CHECK_OUTPUT
r = weight_casts("one_block")
print(f"two forwards in one block: casts of lin.weight {r.weight_casts}, of lin.bias {r.bias_casts}, "
      f"of x {r.input_casts}")
print("both outputs hang on the same cast of the weight in the autograd graph:", r.shared_copy)

# %% [markdown]
# The cache keeps the casts of the parameters (fp32 leaf tensors that require grad); the input
# is cast again on every call. When is a new copy made? Eleven arrangements of the two forwards,
# and whether the second forward sees a change made to the weight in place between them
# (`lin.weight.add_(1)` under `torch.no_grad()`):

# %%
# NBVAL_CHECK_OUTPUT
cache_table()

# %% [markdown]
# Notice:
# - The cache is emptied when the **outermost** autocast block exits, or by
#   `torch.clear_autocast_cache()`. An inner block's exit does not empty it, and neither does
#   `torch.no_grad()`: a copy made under `no_grad` is kept, and the next forward with grad uses it.
# - Nothing is cached with `cache_enabled=False`, under `torch.inference_mode()`, or for a frozen
#   weight (`requires_grad_(False)`).
# - One cast for two forwards means a stale copy: after an in-place update inside the block (an
#   `optimizer.step()`, say), the next forward computes with the **old** weight, with no error.
#   Keep autocast around the forward pass and the loss only. Notebook
#   [09 · Lightning pitfall: a `no_grad` pass inside autocast, then a pass with grad](09_lightning_autocast_cache.ipynb)
#   follows the same cache into Lightning.
#
# The cache is keyed by the weight alone, not by the dtype. An inner block with the other dtype is
# handed the copy in the outer block's dtype:

# %%
# NBVAL_CHECK_OUTPUT
print("fp16 block, inner bf16 block:", weight_casts("other_dtype_inside", "float16").error)
print("bf16 block, inner fp16 block:", weight_casts("other_dtype_inside", "bfloat16").error)

# %% [markdown]
# Notice: the inner block casts the input to its own dtype (mat1), the weight comes from the cache
# in the outer block's (mat2). `cache_enabled=False` on the outer block avoids it.

# %% [markdown]
# ## 5. `torch.compile` and autocast
#
# The same in-place update, with the forward compiled by `torch.compile` and called twice inside
# one bf16 autocast block. The `aot_eager` backend traces the graph as the default `inductor`
# backend does, then runs it with torch's own kernels instead of generating C++, so it compiles fast:

# %%
# NBVAL_CHECK_OUTPUT
compile_table(backend="aot_eager", dtype="bfloat16")

# %% [markdown]
# Notice: the compiled forward runs in bf16 like the eager one, and it sees the update: its
# output is bit for bit an eager forward of the new weight in a fresh block. The compiled forward
# casts the weight afresh on every call instead of reusing autocast's cached copy. The same code
# can give a stale result in eager mode and a fresh one compiled.

# %% [markdown]
# ## Try it
#
# Write any code of `x` and see which dtype each op runs in under CPU autocast, and which casts
# autocast makes: a layer, a loss, a reduction, an fp16 or bf16 input (`x.half()`), `torch.cat`
# of mixed inputs.

# %%
x = torch.randn(4, 8)  # try x.half(), x.bfloat16(), torch.randint(0, 5, (4, 8))
dtype = "float16"  # or "bfloat16"


def code(x):  # any code of x
    return torch.softmax(x @ x.T, dim=-1).sum()


under_autocast(code, x, dtype=dtype)

# %% [markdown]
# ## Check yourself

# %%
# In section 3's step, replace mse_loss's mean by a sum: F.mse_loss(output, target, reduction="sum"),
# same model, same batch, fp16 CPU autocast, GradScaler at 65536. Does step 1 "run" or is it "skipped"?
answer = None
check_sum_loss_step(answer)

# %%
# A function runs two forwards of a Linear, each in its own torch.autocast("cpu", dtype=torch.float16)
# block: 2 casts of the weight (section 4). You call it from inside your own fp16 autocast block.
# How many casts of the weight does it make now?
answer = None
check_casts_inside_outer(answer)

# %%
# After a Linear layer, softmax runs in fp16 under CPU autocast and in fp32 under CUDA autocast. Why?
# (a letter)
#   a) the CPU has no fp32 softmax kernel
#   b) CPU and CUDA autocast keep separate lists: softmax is on CUDA's fp32 list and on no CPU
#      list, so on the CPU it runs in the dtype it is given, the Linear's fp16
#   c) autocast casts every op's output to the autocast dtype, and CUDA casts it back for softmax
answer = None
check_why_softmax_dtype(answer)

# %%
# Inside one fp16 autocast block: y1 = lin(x), then lin.weight.add_(1) under torch.no_grad(),
# then y2 = lin(x). y2 is computed with the old weight. Why? (a letter)
#   a) an update made under no_grad only takes effect when the block exits
#   b) autocast keeps the fp16 copy of the weight made by the first forward and hands it out again
#      until the outermost block exits; nothing compares it with the weight
#   c) adding 1 is less than half an fp16 step of the weight, so the update rounds away
#   d) autograd keeps the old weight for the backward pass, and the forward reads it from there
answer = None
check_why_stale_copy(answer)

# %% [markdown]
# ## Summary
#
# - Autocast never changes a parameter: a Linear runs on fp16 (or bf16) copies of its input,
#   weight and bias, its output is low-precision, and the gradients of the fp32 weights are fp32.
# - The lists differ by device. Measured on the CPU: matrix products and convolutions run low,
#   losses in fp32, and softmax, layer_norm, exp, sum and the other ops CUDA runs in fp32 run in
#   their input's dtype. `mv` runs in fp16 on CUDA only; `binary_cross_entropy` is refused on
#   CUDA only; `torch.cat` of fp16 and fp32 raises under CPU bf16 autocast.
# - The loss comes out fp32, so the scaled loss is finite; the first step still overflows when
#   65536 × d(loss)/d(output) is too large for the fp16 output (a sum, an fp16 loss), and
#   GradScaler skips it.
# - The weight cache reuses one cast per parameter until the outermost autocast block exits (not
#   an inner one, not `no_grad`); an in-place update inside the block is not seen. A compiled
#   forward casts on every call and sees it.
#
# **Next:** [03b · bf16 in practice: no loss scaler, and the updates bf16 weights lose](03b_bf16_in_practice.ipynb)
# runs section 3's step in bf16, where nothing overflows, and finds what bf16 costs the weights instead.
#
# **Open exercises**
# 1. With `under_autocast`, run a `torch.nn.LayerNorm(4)` on the output of an `nn.Linear(8, 4)`
#    under CPU fp16 autocast. In which dtype does the layer norm run, and what happens to its own
#    fp32 weight and bias? What would CUDA autocast give (section 2's table)?
# 2. Predict which rows of section 4's table change when the two forwards run in bf16, then run
#    `cache_table(dtype="bfloat16")`. Why does the dtype not matter to the cache?
# 3. Run `compile_table(backend="inductor")` (its first compile takes longer). Does the default
#    backend agree with `aot_eager`? Which forward would you trust inside a loop that steps the
#    optimizer within one autocast block, and what would you change instead?

# %% [markdown]
# The lesson's claims, measured again here with margins where a CPU's last bits could move a number:

# %%
t = layer_walk().rows
assert dict(t)["lin.weight, lin.bias"] == "fp32, fp32" and dict(t)["y = lin(x)"] == "fp16"
assert dict(t)["after the block: lin.weight, lin.weight.grad"] == "fp32, fp32"
assert sum(k.startswith("autocast casts") for k, _ in t) == 3  # the input, the weight and the bias
assert len(ops.rows) == 41 and len(ops.differences()) == 17
cpu = {row.op: str(row.measured["float16"]) for row in ops.rows}
cuda = {row.op: str(row.cuda) for row in ops.rows}
for op in ("linear", "matmul", "bmm", "addmm", "baddbmm", "conv1d", "conv2d", "scaled_dot_product_attention"):
    assert cpu[op] == cuda[op] == "fp16, ran in fp16", op
for op in ("mse_loss", "cross_entropy", "nll_loss", "l1_loss", "prod"):
    assert cpu[op] == "fp32, ran in fp32", op
for op in ("relu", "gelu", "tanh", "sigmoid", "batch_norm", "mean", "dropout", "embedding"):
    assert cpu[op] == cuda[op] == "fp32, as its input", op
for op in ("softmax", "log_softmax", "layer_norm", "group_norm", "rms_norm", "softplus", "exp", "log", "pow",
           "sum", "cumsum", "norm"):
    assert cpu[op] == "fp32, as its input" and cuda[op] == "fp32, ran in fp32", op
assert cpu["mv"] == "fp32, as its input" and cuda["mv"] == "fp16, ran in fp16"
assert cpu["add (mixed)"] == cpu["mul (mixed)"] == "fp32, own promotion"
assert str(ops.row("scaled_dot_product_attention").cuda_docs) == "fp32, as its input"  # the docs lag
assert ops.row("binary_cross_entropy").cuda.error.startswith("RuntimeError")
assert cpu["binary_cross_entropy_with_logits"] == cuda["binary_cross_entropy_with_logits"] == "fp32, ran in fp32"
assert ops.row("cat (fp16 + fp32)").measured["bfloat16"].error.startswith("RuntimeError")
reports = {name: loss_report(name) for name in ("mse_loss", "cross_entropy", "output.sum()", "output.mean()",
                                                "output.float().sum()")}
assert all(reports[n].loss_dtype == reports[n].scaled_dtype == "fp32" for n in ("mse_loss", "cross_entropy"))
assert 8.5e4 < reports["cross_entropy"].scaled < 9.3e4 and not reports["cross_entropy"].scaled_fits_fp16
assert 5e3 < reports["cross_entropy"].output_grad_max < reports["mse_loss"].output_grad_max < 1.5e4
assert all(not reports[n].step_skipped and reports[n].scale_after == 65536 for n in ("mse_loss", "cross_entropy"))
for n in ("output.sum()", "output.mean()", "output.float().sum()"):
    assert reports[n].step_skipped and reports[n].output_grad_max == float("inf") and reports[n].scale_after == 32768
assert reports["output.sum()"].loss_dtype == reports["output.mean()"].loss_dtype == "fp16"
assert (r.weight_casts, r.bias_casts, r.input_casts, r.shared_copy) == (1, 1, 2, True)
casts = {c: weight_casts(c).weight_casts for c in ("nested_blocks", "separate_blocks", "cache_disabled",
                                                    "clear_cache", "no_grad", "no_grad_then_grad", "inference_mode",
                                                    "frozen_weight")}
assert casts == {"nested_blocks": 1, "separate_blocks": 2, "cache_disabled": 2, "clear_cache": 2, "no_grad": 1,
                 "no_grad_then_grad": 1, "inference_mode": 2, "frozen_weight": 2}
assert cache_table().column("sees an in-place update")[:3] == ("no: stale copy", "no: stale copy", "yes")
assert weight_casts("other_dtype_inside").error.endswith("but got BFloat16 and Half")
assert compile_table().rows[1][2:] == ("yes", "yes") and compile_table().rows[0][2] == "no: stale copy"
assert weight_casts("no_grad_then_grad").grad_fn is True  # the copy made under no_grad carries grad
print("all claims hold")
