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
# # 03b · bf16 in practice: no loss scaler, and the updates bf16 weights lose
#
# bf16 has fp32's range and 8 bits of precision. When can bf16 training do without fp16's loss
# scaler, which models break in fp16 and not in bf16, and what do 8 bits of precision cost the
# weights? Measured on this machine, after
# [03a · Autocast, measured: what runs in which dtype](03a_autocast.ipynb).
#
# You will be able to:
# - decide when bf16 needs no loss scaler, and recognise a model that overflows in fp16 but not in bf16,
# - predict which updates bf16 weights lose, and keep them learning with fp32 master weights, Kahan
#   summation or [stochastic rounding](../GLOSSARY.md#stochastic-rounding),
# - write stochastic rounding to bf16 and test it,
# - say what `torch.set_float32_matmul_precision("high")` rounds in a float32 model, what it costs a
#   layer's accuracy and what it bought a real GPU.
#
# Teaching this lesson? The [teacher's guide](../TEACHING.md#nb03b) has its timings, the answers to
# its exercises and what to demo live.
# Its words in English and Chinese (中文), each with a one-line definition: the [glossary](../GLOSSARY.md).

# %%
import numpy as np
import torch

from ampviz.training.autocast import loss_report
from ampviz.training.bf16 import (check_round_up_share, check_stochastic_rounding, check_why_bf16_no_scaler,
                                  check_why_bf16_stalls, check_why_tf32_error, fp16_overflow,
                                  lost_update_runs, lost_update_steps_table, lost_update_table, overflow_table,
                                  rounding_statistics, rounding_table, scaler_need, scaler_need_table,
                                  variant_table)
from ampviz.formats import BF16, FP16, FP32, TF32
from ampviz.formats.lesson import format_table, lost_band
from ampviz.formats.matmul_precision import MATMUL_MODES
from ampviz.text import number
from ampviz.training.gpu_record import load_record
from ampviz.training.matmul_precision import layer_error, precision_switches

rng = np.random.default_rng(0)
_ = torch.manual_seed(0)
torch.set_num_threads(1)

# %% [markdown]
# ## 1. When bf16 needs no loss scaler
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
# subnormal (2^-133). 03a's first step (its section 3) under bf16 autocast, where fp16 overflowed:

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
# ## 2. A model that overflows in fp16 and not in bf16
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
# ## 3. Updates lost in bf16 weights, and three fixes
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
#   distance (section 4; no extra memory).
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
# ## 4. Stochastic rounding, tested
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
#
# ## 5. TF32 and `set_float32_matmul_precision`
#
# One more way into lower precision needs no bf16 tensor at all. A float32 model, no autocast, one
# line: `torch.set_float32_matmul_precision(...)` tells torch how float32 matrix products may be
# computed. The weights, activations and outputs stay float32; only each product's inputs may be
# read in fewer bits. On an NVIDIA GPU ([TF32](../GLOSSARY.md#tf32) tensor cores since Ampere):
#
# - "highest" (the default): float32 inputs, as they are.
# - "high": TF32 tensor cores, or, as torch's documentation also describes, each float32 as the
#   sum of two bf16 numbers (hi + lo) and three bf16 products ("bf16x3").
# - "medium": bf16 inputs, where a fast bf16 kernel exists; otherwise as "high".
#
# TF32 is a compute format, never stored: fp32's 8 exponent bits and fp16's 10 mantissa bits
# (19 bits in all):

# %%
# NBVAL_CHECK_OUTPUT
format_table(("fp32", "tf32", "fp16", "bf16"))

# %%
# NBVAL_CHECK_OUTPUT
for fmt in (FP32, TF32, FP16, BF16):
    print(f"{fmt.name}: 1/3 -> {number(fmt.quantize(1 / 3)):10}  70000 -> {number(fmt.quantize(70000.0))}")

# %% [markdown]
# Notice: TF32 keeps 1/3 as fp16 does (0.33325195: 4 digits), and it keeps 70000, past fp16's
# 65504, as fp32 and bf16 do. TF32 has fp16's precision and fp32's range.
#
# What each mode costs a real layer: `layer_error(mode)` multiplies a seeded batch (64 × 256) by a
# seeded `nn.Linear(256, 256)`'s weights with the inputs rounded as each mode rounds them,
# emulated exactly in numpy, and measures the relative error against the float64 product. Every
# mode sums its products exactly and rounds the result once to float32, so the modes differ only
# in how their inputs are rounded:

# %%
# NBVAL_CHECK_OUTPUT
errors = {mode: layer_error(mode) for mode in MATMUL_MODES}
for mode, what in MATMUL_MODES.items():
    print(f"{mode:7} error {errors[mode]:.1e}   {what}")

# %% [markdown]
# Notice:
# - TF32 is 2.8·10⁻⁴ off, bf16 2.2·10⁻³: 8 times more, 2^3 for its 3 fewer mantissa bits.
# - bf16x3 (4.2·10⁻⁶) is about 70 times closer than TF32: hi + lo keep about 16 significant bits.
#   It is not fp32: fp32's 2.5·10⁻⁸ is only the rounding of the exact result to float32.
# - The settings are not the precision of the weights: every one of these products is stored in
#   float32. A real float32 kernel adds its own summation error, below 10⁻⁶ on this layer.
#
# On a CPU the same call sets oneDNN's flag as well as CUDA's. `precision_switches()` sets each
# setting in turn and reads the flags back:

# %%
# NBVAL_CHECK_OUTPUT
switches = precision_switches()
for row in switches:
    print(f"{row.setting:8} CUDA matmul: {row.cuda_matmul:5} oneDNN matmul: {row.mkldnn_matmul}")

# %% [markdown]
# On CUDA, "medium" sets the same TF32 flag as "high": cuBLAS's float32 matrix products get TF32,
# not bf16. On a CPU, "high" asks oneDNN for TF32, which oneDNN offers only on Intel GPUs, and
# "medium" allows oneDNN to compute float32 products in bf16. Whether your CPU's result moves
# depends on the CPU and the kernel oneDNN picks. The same function ran one `nn.Linear(256, 256)`
# under each setting; see what yours did (this output differs between machines and is not checked):

# %%
for row in switches:
    print(f"{row.setting:8} changed {row.changed_share:4.0%} of the outputs' bits, error {row.error:.1e} "
          f"(closest emulated mode: {row.closest}), oneDNN kernels: {', '.join(row.onednn) or 'none'}")

# %% [markdown]
# What "high" buys on a GPU: one transformer block trained on an NVIDIA H200, in fp32 and in TF32,
# read from the course's record of that run:

# %%
# NBVAL_CHECK_OUTPUT
record = load_record()
eager = {r["mode"]: r for r in record["results"] if not r["compiled"]}
fp32, tf32 = eager["fp32"], eager["tf32"]
print(f"{record['environment']['device']}, a block of {record['params'] / 1e6:.0f}M weights, "
      f"{record['tokens']} tokens a step")
for r in (fp32, tf32):
    print(f"{r['mode']:5} {r['step_ms']:.3g} ms a step, loss {r['loss_first']:.4f} -> {r['loss_last']:.4f}")
print(f"TF32 is {fp32['step_ms'] / tf32['step_ms']:.1f} times faster")

# %% [markdown]
# Notice: one line made a float32 model's step 4 times faster, and its loss after 13 steps agrees
# with fp32's to 4 decimals. The weights, gradients and optimizer states stayed float32; only the
# matmuls' inputs lost 13 of their 23 mantissa bits. The whole record, bf16 autocast and FP8
# included, comes in lesson 14.
# %% [markdown]
# ## Try it
#
# Change the lost-update run's learning rate, seed or size, and watch when the bf16 run stalls.

# %%
my_runs = lost_update_runs(seed=0, steps=400, lr=0.05, features=16)  # try lr=0.01 or 0.2, seed=1
lost_update_table(my_runs)

# %%
lost_update_steps_table(my_runs)  # the loss along the way, for the same runs

# %% [markdown]
# ## Check yourself

# %%
# Stochastic rounding sends 3.01 (a float32) to one of its two bf16 neighbours.
# With what probability to the upper one? (a number)
answer = None
check_round_up_share(answer)

# %%
# At scale 1, fp16 flushes about 97% of the beam model's layer-output gradients to 0, bf16 none. Why?
# (a letter)
#   a) bf16 keeps more significant bits than fp16
#   b) bf16 has fp32's 8 exponent bits: its smallest normal number is 2^-126, so gradients far
#      below fp16's 2^-24 are ordinary bf16 numbers
#   c) bf16 autocast scales the loss by itself
answer = None
check_why_bf16_no_scaler(answer)

# %%
# The run with bf16 weights stops learning at step 71 while the fp32 run goes on. Why? (a letter)
#   a) its gradients underflow to 0 in bf16
#   b) each update (learning rate × gradient) is below half the gap between the weight and its bf16
#      neighbour, so w.add_(u) rounds back to w
#   c) its forward pass overflows in bf16
#   d) the learning rate is too large for bf16: a smaller one would not stall
answer = None
check_why_bf16_stalls(answer)

# %%
# In section 5, TF32's error on the layer is about 8 times smaller than bf16's. Why? (a letter)
#   a) TF32 sums the products in higher precision than bf16
#   b) TF32 keeps 10 mantissa bits to bf16's 7: each input is rounded to a step 2^3 = 8 times
#      finer
#   c) TF32 has more exponent bits than bf16
answer = None
check_why_tf32_error(answer)

# %% [markdown]
# Now write stochastic rounding yourself. `stochastic_round(x, generator)` gets a float32 tensor
# and a `torch.Generator`, and returns `x` rounded to bf16 stochastically, its random numbers
# drawn from `generator` (`torch.randint(..., generator=generator)`). Section 4 describes the bit
# trick; `x.view(torch.int32)` reads the bit patterns. NaN must stay NaN, ±inf and ±0 unchanged.
# The checker runs section 4's statistical test on your function, then rounds NaN, inf and 0.

# %%
def stochastic_round(x, generator):
    ...  # your code here

# When stochastic_round is written, set answer = stochastic_round (the function itself) and run the cell
answer = None
check_stochastic_rounding(answer)

# %% [markdown]
# ## Summary
#
# - bf16 needs no loss scaler: it has fp32's exponent range, so the gradients fp16 flushes at scale
#   1 stay nonzero, and the first step that overflowed in fp16 runs.
# - bf16 holds activations that overflow fp16: no loss scale helps a forward pass that overflows.
# - bf16 pays with precision: updates below half a bf16 step (2^-8 of the weight at a power of
#   two) are lost, and bf16 weights stall. fp32 master weights, Kahan compensation and stochastic
#   rounding each bring them back near the best bf16 can do.
# - Stochastic rounding is unbiased only if the random number covers exactly the 16 dropped bits
#   and the sign is left to the bit pattern; a test on positive values alone misses a sign bug.
# - `torch.set_float32_matmul_precision("high")` lets an NVIDIA GPU read a float32 matmul's inputs
#   as TF32 (fp32's range, fp16's 10 mantissa bits): 2.8·10⁻⁴ error on a real layer where bf16's
#   is 2.2·10⁻³, and one H200 block trained 4.1 times faster than in fp32. On a CPU it may change
#   nothing.
#
# **Next:** [04 · GradScaler internals: the real scaler, call by call](04_gradscaler_internals.ipynb)
# takes apart the scaler that skipped 03a's first step in fp16.
#
# **Open exercises**
# 1. Run `lost_update_runs(lr=...)` for lr 0.01, 0.02, 0.1 and 0.2. When does the bf16 run stall,
#    and at what loss? Why does a smaller learning rate stall later, and worse?

# %% [markdown]
# The lesson's claims, measured again here with margins where a CPU's last bits could move a number:

# %%
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
assert (TF32.exponent_bits, TF32.mantissa_bits) == (FP32.exponent_bits, FP16.mantissa_bits) == (8, 10)
assert FP16.quantize(1 / 3) == TF32.quantize(1 / 3) and FP16.quantize(70000.0) == np.inf
assert TF32.quantize(70000.0) == 70016 and torch.get_float32_matmul_precision() == "highest"  # the default
assert errors["fp32"] < errors["bf16x3"] < errors["tf32"] < errors["bf16"]
assert 7 < errors["bf16"] / errors["tf32"] < 9 and 60 < errors["tf32"] / errors["bf16x3"] < 80
assert 2.5e-4 < errors["tf32"] < 3e-4 and 2e-3 < errors["bf16"] < 2.5e-3 and errors["fp32"] < 2**-24
assert switches[0].error < 1e-6  # a real float32 kernel's summation error on this layer
assert [(r.cuda_matmul, r.mkldnn_matmul) for r in switches] == [("ieee", "ieee"), ("tf32", "tf32"), ("tf32", "bf16")]
assert 3.5 < fp32["step_ms"] / tf32["step_ms"] < 4.5 and record["warmup"] + record["steps"] == 13
assert round(fp32["loss_last"], 4) == round(tf32["loss_last"], 4) and round(fp32["loss_first"], 4) == round(tf32["loss_first"], 4)
assert FP32.mantissa_bits - TF32.mantissa_bits == 13
print("all claims hold")
