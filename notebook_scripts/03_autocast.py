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
# # 03 · Autocast, measured: what runs in which dtype, and bf16 in practice
#
# What `torch.autocast` does to each op, to the loss and to the weights, measured on this machine;
# then when bf16 can do without fp16's loss scaler, and what its 8 bits of precision cost the weights.
#
# You will be able to:
# - predict the dtype an op runs in under CPU or CUDA autocast, and say why the loss comes out fp32
#   and what that does (and does not do) for the first step,
# - tell when autocast reuses a cached low-precision copy of a weight, and when that copy is stale,
# - decide when bf16 needs no loss scaler, recognise a model that overflows in fp16 but not in bf16,
#   and keep bf16 weights learning with fp32 master weights, Kahan summation or stochastic rounding.
#
# Teaching this lesson? The [teacher's guide](../TEACHING.md#nb03) has its timings, the answers to
# its exercises and what to demo live.
# Its words in English and Chinese (中文), each with a one-line definition: the [glossary](../GLOSSARY.md).

# %%
import numpy as np
import torch

from ampviz.training.autocast import (cache_table, check_casts_inside_outer, check_round_up_share,
                                      check_softmax_dtype, check_stochastic_rounding, check_sum_loss_step,
                                      compile_table, layer_walk, loss_report, loss_table, op_table,
                                      under_autocast, weight_casts)
from ampviz.training.bf16 import (fp16_overflow, lost_update_runs, lost_update_steps_table, lost_update_table,
                                  overflow_table, rounding_statistics, rounding_table, scaler_need,
                                  scaler_need_table, variant_table)
from ampviz.formats.lesson import lost_band

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
# Inside one autocast block, torch caches the cast copy of a weight: a second forward of the same
# layer reuses it. `weight_casts(case)` runs two forwards of an `nn.Linear(8, 4)` on the same
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
# ## 6. bf16 in practice
#
# ### 6.1 When bf16 needs no loss scaler
#
# bf16 has fp32's 8 exponent bits: its smallest normal number is 2^-126, fp16's 2^-14. Notebook
# 02's beam model again: its gradients cast from fp32 at scale 1 (and to fp16 at GradScaler's
# 2^16), and the gradients of real fp16 and bf16 autocast backward passes of the same batch:

# %%
# NBVAL_CHECK_OUTPUT
need = scaler_need()
scaler_need_table(need)

# %% [markdown]
# Notice: fp16 flushes 96.92% of the layer outputs' gradients to 0 at scale 1, and a real fp16
# backward pass 97.87% (its smallest nonzero gradient is fp16's smallest, 2^-24); a scale of 2^16
# brings the cast's loss down to 0.08%. bf16 loses none in the cast. The 12 zeros of the bf16 pass
# are not underflow: its smallest nonzero gradient, 3.2·10⁻¹⁶, is far above bf16's smallest
# subnormal (2^-133). Section 3's first step under bf16 autocast, where fp16 overflowed:

# %%
# NBVAL_CHECK_OUTPUT
for loss in ("output.sum()", "output.float().sum()"):
    b = loss_report(loss, "bfloat16")
    print(f"bf16 autocast, {loss}: gradient at the output {b.output_grad_max:g} ({b.output_grad_dtype}), "
          f"step 1 {'skipped' if b.step_skipped else 'runs'}")

# %% [markdown]
# 65536 is an ordinary bf16 number. bf16 autocast trains without a `GradScaler` (notebook 07
# trains this model that way).
#
# ### 6.2 A model that overflows in fp16 and not in bf16
#
# fp16's largest number is 65504; bf16's is about 3.4·10³⁸. No loss scale helps when the forward
# pass itself overflows. `fp16_overflow()` evaluates a seeded ReLU network without normalisation,
# whose ten `Linear(64, 64)` layers each make their input about three times larger, in fp32, in bf16
# and in fp16:

# %%
# NBVAL_CHECK_OUTPUT
overflow = fp16_overflow()
overflow_table(overflow)

# %% [markdown]
# Notice: fc9's outputs pass 65504 (7.7·10⁴): 8 of them are inf in fp16. fc10 adds inf and -inf and
# gives NaN (76 of 4,096), and of the head's 64 outputs 15 are inf and 37 NaN. bf16 stays within
# 1% of fp32 in every layer. A model trained in bf16 can break when it is run in fp16, and a
# `GradScaler` cannot help: the overflow is in the forward pass.
#
# ### 6.3 Updates lost in bf16 weights, and three fixes
#
# bf16 pays for its range with precision: 8 significant bits. An update smaller than half the gap
# between a weight and its bf16 neighbour is lost (the ½-ulp rule of notebook 01, section 5). At
# w = 1 the gap above is 2^-7, so updates up to 2^-8 of the weight are lost (2^-8 itself is a tie,
# which rounds to the even neighbour, 1); just below 2, up to about 2^-9 of it. Four fp32 updates
# of bf16 weights at 1.0:

# %%
# NBVAL_CHECK_OUTPUT
u = torch.tensor([2**-9, 2**-8, 1.01 * 2**-8, 2**-7])  # fp32 updates
w = torch.ones(4, dtype=torch.bfloat16).add_(u)  # bf16 weights at 1.0, updated in place
for label, wi in zip(["2^-9", "2^-8", "1.01 × 2^-8", "2^-7"], w.tolist()):
    print(f"1.0 + {label:11} = {wi:.7f} in bf16 ({'lost' if wi == 1.0 else 'kept'})")

# %% [markdown]
# In training, lost updates stop the weights. `lost_update_runs()` runs 400 steps of gradient
# descent (learning rate 0.05) on a seeded linear regression with 16 weights, with the same data
# and gradients, keeping the weights in five ways: fp32; bf16, each update rounded to nearest into
# the weight (`w.add_(u)`); and three fixes, all with bf16 weights in the forward pass:

# %%
# NBVAL_CHECK_OUTPUT
runs = lost_update_runs()
lost_update_table(runs)

# %% [markdown]
# - **fp32 master weights**: the update goes into an fp32 copy of the weights; the forward pass
#   uses its bf16 cast (what AMP does, at 4 more bytes per weight).
# - **Kahan compensation**: a second bf16 tensor keeps what the rounding of the weight dropped and
#   adds it back at the next step (`kahan_add_`, 2 more bytes per weight).
# - **Stochastic rounding**: `w.float() + u` rounded up or down at random, in proportion to the
#   distance (section 6.4; no extra memory).
#
# The loss along the way:

# %%
# NBVAL_CHECK_OUTPUT
lost_update_steps_table(runs)

# %% [markdown]
# Notice:
# - About 85% of all the updates are below half a bf16 step of their weight, in every run: losing
#   them is the common case, not a corner case.
# - bf16 stalls at step 71: from there every update is lost and the loss stays at 0.032. The fp32
#   run goes on to 1.2·10⁻¹¹; its final weights rounded to bf16 give 3.05·10⁻⁵, the best bf16 weights
#   can do there.
# - The three fixes all end within three times that floor (6.45·10⁻⁵, 6.83·10⁻⁵, 5.41·10⁻⁵),
#   over 400 times below the bf16 run. Stochastic rounding leaves the weights unchanged after 82% of
#   the updates, and gets there anyway: the draws that go up make up for the ones that go down.
#
# ### 6.4 Stochastic rounding, tested
#
# Stochastic rounding sends a value to one of its two bf16 neighbours, to the upper one with
# probability (distance from the lower one) / (gap), so on average it returns the value.
# `stochastic_round_bf16(x, generator)` does it with bits: a bf16 number is a float32 whose low 16
# bits are 0; add a random integer from 0 to 65535 to the float32's bit pattern and clear the low
# 16 bits. A test rounds each of 11 values 20,000 times and checks the mean within 5 standard deviations:

# %%
# NBVAL_CHECK_OUTPUT
rounding_table(rounding_statistics())

# %% [markdown]
# Notice: all 11 pass: negative values; 1 + 2^-8, the tie that round to nearest always sends to 1,
# goes up half the time; a value just below 2, whose upper neighbour is in the next binade; a
# subnormal; a value near bf16's largest; and 3, already bf16, which never moves. The same test
# on four plausible wrong versions (15 or 17 random bits instead of 16, round to nearest, and one
# written with floating-point arithmetic that takes the gap as positive for negative values too):

# %%
# NBVAL_CHECK_OUTPUT
variant_table()

# %% [markdown]
# Notice: each wrong version fails in its own way. Round to nearest and 15 random bits are biased;
# 17 random bits gives values that are not neighbours and moves exact values; the sign-blind one
# is right on every positive value and biased on the negative ones. A test on positive values only
# would pass it.

# %% [markdown]
# ## Try it
#
# Write any code of `x` and see which dtype each op runs in under CPU autocast, and which casts
# autocast makes: a layer, a loss, a reduction, an fp16 or bf16 input (`x.half()`), `torch.cat`
# of mixed inputs. Then change the lost-update run's learning rate, seed or size.

# %%
x = torch.randn(4, 8)  # try x.half(), x.bfloat16(), torch.randint(0, 5, (4, 8))
dtype = "float16"  # or "bfloat16"


def code(x):  # any code of x
    return torch.softmax(x @ x.T, dim=-1).sum()


under_autocast(code, x, dtype=dtype)

# %%
my_runs = lost_update_runs(seed=0, steps=400, lr=0.05, features=16)  # try lr=0.01 or 0.2, seed=1
print(lost_update_table(my_runs))
print(lost_update_steps_table(my_runs))

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
# Stochastic rounding sends 3.01 (a float32) to one of its two bf16 neighbours.
# With what probability to the upper one? (a number)
answer = None
check_round_up_share(answer)

# %% [markdown]
# Now write stochastic rounding yourself. `stochastic_round(x, generator)` gets a float32 tensor
# and a `torch.Generator`, and returns `x` rounded to bf16 stochastically, its random numbers
# drawn from `generator` (`torch.randint(..., generator=generator)`). Section 6.4 describes the bit
# trick; `x.view(torch.int32)` reads the bit patterns. NaN must stay NaN, ±inf and ±0 unchanged.
# The checker runs section 6.4's statistical test on your function, then rounds NaN, inf and 0.

# %%
def stochastic_round(x, generator):
    ...  # your code here

# When stochastic_round is written, set answer = stochastic_round (the function itself) and run the cell
answer = None
check_stochastic_rounding(answer)


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
# - bf16 needs no loss scaler (fp32's exponent range) and holds activations that overflow fp16, but
#   loses updates below half a bf16 step (2^-8 of the weight at a power of two): bf16 weights stall.
#   fp32 master weights, Kahan compensation and stochastic rounding each bring them back near the
#   best bf16 can do.
#
# **Next:** [04 · GradScaler internals: the real scaler, call by call](04_gradscaler_internals.ipynb)
# takes apart the scaler that skipped section 3's first step.
#
# **Open exercises**
# 1. With `under_autocast`, run a `torch.nn.LayerNorm(4)` on the output of an `nn.Linear(8, 4)`
#    under CPU fp16 autocast. In which dtype does the layer norm run, and what happens to its own
#    fp32 weight and bias? What would CUDA autocast give (section 2's table)?
# 2. Predict which rows of section 4's table change when the two forwards run in bf16, then run
#    `cache_table(dtype="bfloat16")`. Why does the dtype not matter to the cache?
# 3. Run `lost_update_runs(lr=...)` for lr 0.01, 0.02, 0.1 and 0.2. When does the bf16 run stall,
#    and at what loss? Why does a smaller learning rate stall later, and worse?
# 4. Run `compile_table(backend="inductor")` (its first compile takes longer). Does the default
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
assert 0.96 < need.share("layer outputs", "float16") < 0.975 and 0.97 < need.zeros("layer outputs", "float16") < 0.985
assert need.share("layer outputs", "float16", need.scale) < 0.001 and need.share("layer outputs", "bfloat16") == 0
smallest = {(z.gradients, z.autocast): z.smallest for z in need.runs}
assert smallest[("layer outputs", "float16")] == 2.0**-24 and 1e-16 < smallest[("layer outputs", "bfloat16")] < 1e-15
assert sum(z.zeros for z in need.runs if z.autocast == "bfloat16" and z.gradients == "layer outputs") == 12
assert all(not loss_report(n, "bfloat16").step_skipped for n in ("output.sum()", "output.float().sum()"))
assert (overflow.first_inf, overflow.first_nan) == ("fc9", "fc10") and overflow.bf16_finite
assert 7e4 < overflow.fp32_max[8] < 8e4 and overflow.fp16_inf[8] == 8 and overflow.fp16_nan[9] == 76
assert (overflow.fp16_inf[-1], overflow.fp16_nan[-1]) == (15, 37) and overflow.layers[:10][-1] == "fc10"
assert 2.5 < (overflow.fp32_max[9] / overflow.fp32_max[0]) ** (1 / 9) < 3.5  # about three times per layer
assert 3.3e38 < torch.finfo(torch.bfloat16).max < 3.4e38 and torch.finfo(torch.float16).max == 65504
assert all(abs(b / f - 1) < 0.01 for b, f in zip(overflow.bf16_max, overflow.fp32_max))
assert w.tolist() == [1.0, 1.0, 1.0078125, 1.0078125]
assert abs(lost_band(1.0, "bf16", via="fp32")[1] / 2**-8 - 1) < 1e-4  # 2^-8 of w at w = 1 ...
assert abs(lost_band(1.9921875, "bf16", via="fp32")[1] / 1.9921875 / 2**-9 - 1) < 0.01  # ... about 2^-9 below 2
bf = runs.runs["bf16"]
assert runs.stalled_at == 71 and bf.final_loss == bf.loss[71] and 0.03 < bf.final_loss < 0.034
assert all(0.84 < run.lost.mean() < 0.86 for run in runs.runs.values())
assert runs.runs["fp32"].final_loss < 1e-10 and 2.9e-5 < runs.floor_loss < 3.2e-5
for key in ("master", "kahan", "stochastic"):
    assert runs.runs[key].final_loss < 3 * runs.floor_loss and bf.final_loss > 400 * runs.runs[key].final_loss, key
assert 0.8 < runs.runs["stochastic"].unchanged.mean() < 0.84
assert torch.float32.itemsize - torch.bfloat16.itemsize == 2 and torch.float32.itemsize == 4  # bytes per weight
stats = rounding_statistics()
assert (len(stats.checks), stats.draws, stats.sigmas) == (11, 20_000, 5.0)
tie = next(c for c in stats.checks if c.value == 1 + 2**-8)
assert abs(tie.share_up - 0.5) < 0.01 and torch.tensor(1 + 2**-8).to(torch.bfloat16).item() == 1.0
assert next(c for c in stats.checks if c.value == 3.0).share_up == 0 and any(c.value < 0 for c in stats.checks)
blind = rounding_statistics(rounding="sign-blind")
assert [c.passed for c in blind.checks] == [c.value >= 0 for c in blind.checks]  # right on positive values only
assert variant_table().column("only the two neighbours") == ("yes", "yes", "yes", "no", "yes")
assert torch.finfo(torch.bfloat16).eps == 2.0**-7  # 8 significant bits
assert stats.passed and variant_table().column("verdict") == ("passes",) + ("fails",) * 4
assert torch.finfo(torch.bfloat16).smallest_normal == 2.0**-126
assert torch.finfo(torch.float16).smallest_normal == 2.0**-14
assert torch.tensor(2.0**-133, dtype=torch.bfloat16).item() == 2.0**-133  # bf16's smallest subnormal ...
assert torch.tensor(2.0**-134, dtype=torch.bfloat16).item() == 0.0  # ... below it, 0
assert weight_casts("no_grad_then_grad").grad_fn is True  # the copy made under no_grad carries grad
print("all claims hold")
