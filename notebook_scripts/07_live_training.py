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
# # 07 · Live training: fp16, a scaler, bf16 and pure half weights
#
# The same seeded model trained five ways, and what each way does to its gradients, its weights and its loss.
#
# You will be able to:
# - find, layer by layer, which gradients fp16 training loses without a loss scaler, what that costs the loss, and show that a scaler saves them,
# - explain why bf16 needs no scaler, and why pure fp16 weights fail where fp32 master weights and optimizer state do not,
# - examine your own model's gradients and pick an initial loss scale, or decide that bf16 is the safer choice.
#
# Teaching this lesson? The [teacher's guide](../TEACHING.md#nb07) has its timings, the answers to
# its exercises and what to demo live.
# Its words in English and Chinese (中文), each with a one-line definition: the [glossary](../GLOSSARY.md).

# %%
import numpy as np
import torch

from ampviz.formats.census import census
from ampviz.training.doctor import (examine, lost_shares, lost_table, moved_share, moved_table, speed_table,
                                    train_modes)
from ampviz.formats.lesson import check_cast
from ampviz.training.lesson import (check_mode_without_loss, check_range_shift, check_why_backward_loses_more,
                                    check_why_first_layers_freeze, check_why_half_diverges)
from ampviz.training.live import TrainConfig, build_task, describe_device, run_training
from ampviz.plots import plot_live
from ampviz.widgets import LiveTrainer

rng = np.random.default_rng(0)
_ = torch.manual_seed(0)
torch.set_num_threads(1)

# %% [markdown]
# ## 1. One model, five ways to train it
#
# The model predicts how far a floor beam bends. Each example is a simply supported beam (span 5 m)
# with two point loads: from the load positions, the loads and the beam's stiffness it predicts the
# deflection at 64 gauges, in metres. It is a small residual network (two pre-LayerNorm blocks, GELU),
# trained with Adam (learning rate 10^-3) on batches of 256 to minimise the mean squared error in m².
# `run_training` trains a fresh copy of the same seeded model in each mode, on the same batches, for
# 200 steps, with a gradient census at the first and the last step (0 and 199). The modes: `fp32`;
# `fp16` (autocast, no scaler); `fp16+scaler` (`torch.amp.GradScaler`); `bf16` (autocast);
# `half` (`model.half()`: fp16 weights and optimizer state, no fp32 copy). Predict before they run:

# %%
# Predict: which mode will lose no gradient to underflow at step 0, "fp16" or "fp16+scaler"?
answer = None
check_mode_without_loss(answer)

# %%
# NBVAL_CHECK_OUTPUT
print(describe_device())
modes = ("fp32", "fp16", "fp16+scaler", "bf16", "half")
runs = {m: run_training(TrainConfig(model="beam", mode=m, steps=200, census_every=199,
                                    census_fmt="bf16" if m == "bf16" else "fp16")) for m in modes}
start = runs["fp32"]["loss"][0]
print(f"starting loss {1e6 * start:.0f} mm² (an RMS error of {1e3 * start ** 0.5:.1f} mm)")
for m, r in runs.items():
    ratio = np.mean(r["loss"][-10:]) / start  # the last 10 steps
    verdict = ("learned: loss below 0.1× its start" if ratio < 0.1 else
               "stalled: loss above 0.3× its start" if ratio > 0.3 else "in between")
    print(f"{m:12}", r.error.split(":")[0] if r.error else verdict)

# %% [markdown]
# Notice: fp32, bf16 and fp16 with a scaler learn; fp16 without a scaler stalls, and pure fp16
# weights fail at the second step (section 5). The loss curves side by side (top, in m², the unit
# the model trains in: 1 mm² is 10^-6 m², so 83 mm² is 8.3·10^-5 m²), the scaler's scale (middle),
# and the share of each layer's gradient that fp16 without a scaler loses (bottom):

# %%
plot_live({m: runs[m] for m in ("fp32", "fp16", "fp16+scaler", "bf16")}, heat_mode="fp16",
          title="200 steps of the beam model: fp32, fp16, fp16 + scaler, bf16")

# %% [markdown]
# The losses at the end in mm² (10^-6 m²), as a share of the start (they differ a little from one
# CPU to another, so this cell's output is not checked; the claims are, at the end of the notebook):

# %%
for m in ("fp32", "fp16", "fp16+scaler", "bf16"):
    end = np.mean(runs[m]["loss"][-10:])
    print(f"{m:12} {1e6 * start:.1f} -> {1e6 * end:.2f} mm²  ({end / start:.3f}× its start)")

# %% [markdown]
# ## 2. Why this model's gradients are small
#
# The loss averages over 256 × 64 = 16,384 numbers, so its gradient with respect to one predicted
# deflection is 2 × error / 16,384. The errors are millimetres (about 5·10^-3 m): about 6·10^-7.
# The network predicts standardised deflections, which are turned back into metres by multiplying
# with each gauge's spread (about 10^-2 m), and the chain rule multiplies the gradient by it again:
# about 5·10^-9 where the gradient enters the network's last output: most of those gradients lie
# below fp16's smallest subnormal (2^-24 ≈ 6·10^-8). Nothing is wrong with the model: metres are
# simply a small unit.

# %% [markdown]
# ## 3. Where gradients vanish without a scaler
#
# Under fp16 autocast the backward pass runs in fp16, so a gradient of 2^-25 or less becomes an
# exact 0, and every layer below gets its gradient through those zeros. `lost_table` counts, per
# layer, the gradients that end as 0 beyond the exact zeros of the fp32 run (GELU has no dead
# units: fp32 has none). The fp32 column says what a cast of fp32's own gradients to fp16 would lose.

# %%
lost_table({m: runs[m] for m in ("fp32", "fp16", "fp16+scaler")}, step=0)

# %% [markdown]
# fp16's backward loses far more than the cast of fp32's gradients would: it loses them early, in
# the layer outputs' gradients, and the weights' gradients are computed from what is left. The
# exact shares depend on the CPU (its vector units round sums in another order), so the table
# above is not checked; what it shows, per layer, is:

# %%
# NBVAL_CHECK_OUTPUT
for m in ("fp16", "fp16+scaler"):
    for step in (0, 199):
        shares = lost_shares(runs[m], step, runs["fp32"])
        weights = [n for n in shares if n.endswith("weight")]
        hit, big = (sum(shares[n] > share for n in weights) for share in (0, 0.05))
        print(f"{m:12} step {step:3}: weight layers that lose gradients: {hit} of {len(weights)}, over 5%: {big}")
scaler_run = runs["fp16+scaler"]
print("scales used:", sorted(set(scaler_run["scale"].tolist())), "| skipped steps:", int(scaler_run["skipped"].sum()))

# %% [markdown]
# Notice: without a scaler fp16 loses gradients in every layer, at the first step and the last.
# With the scaler (its scale stays at 2^16 = 65536 in this run, no step skipped) the gradients are
# multiplied by 2^16 before they can underflow, and none is lost. Adam divides each update by the
# running size of that weight's own gradient, so it learns from these tiny gradients as from large
# ones, but only from those that arrive: by the last step fp16 without a scaler hands it mostly zeros.

# %%
lost_table({m: runs[m] for m in ("fp32", "fp16", "fp16+scaler")}, step=199)

# %% [markdown]
# ## 4. bf16 needs no scaler
#
# bf16 has fp32's exponent range: its smallest subnormal is 2^-133, far below any of these
# gradients. The bf16 run's census (in bf16, at scale 1), at the first and the last step:

# %%
# NBVAL_CHECK_OUTPUT
for step in (0, 199):
    cen = next(r.param_census for r in runs["bf16"].records if r.step == step and r.param_census)
    under = sum(c.counts["underflow"] for c in cen.values())
    lost = lost_shares(runs["bf16"], step, runs["fp32"])
    hit = sum(v > 0 for n, v in lost.items() if n.endswith("weight"))
    print(f"bf16 step {step:3}: {under} of {sum(c.total for c in cen.values()):,} gradients underflow; "
          f"weight layers that lose any gradient: {hit}")

# %% [markdown]
# Notice: nothing underflows in bf16 and no weight gradient is lost, so bf16 autocast trains without
# a scaler, and its loss ends close to fp32's (section 1). bf16 pays in precision (7 mantissa bits),
# not in range.

# %% [markdown]
# ## 5. Pure fp16 weights fail, and why optimizer state stays fp32
#
# In `half` mode the model's weights are fp16, and so is everything Adam keeps for them. Adam divides
# each update by the square root of the running mean of the squared gradient plus a small `eps`
# (10^-8) that keeps it from dividing by 0. In fp16 both are 0: a gradient of 10^-6 squared is
# 10^-12, and 10^-8 itself is below half of fp16's smallest subnormal (2^-25 ≈ 3·10^-8).

# %%
# NBVAL_CHECK_OUTPUT
print(runs["half"].error)
print("Adam's eps in fp16:", torch.tensor(1e-8, dtype=torch.float16).item(),
      "| (10^-6)² in fp16:", (torch.tensor(1e-6, dtype=torch.float16) ** 2).item())

# %% [markdown]
# Notice: the first update divides by 0, so the weights become inf or NaN and the next loss is NaN.
# This is why mixed precision keeps the weights and the optimizer's state in fp32 and runs only the
# forward and backward arithmetic in fp16 (autocast): fp16's range is too narrow for the optimizer's
# own small numbers.

# %% [markdown]
# ### A separate small experiment: pure fp16 weights freeze
#
# Even an optimizer with no small number of its own loses updates on fp16 weights. Notebook 01
# showed that an update is lost when it is at most half the gap between the weight and its fp16
# neighbour on the update's side: between 1/4096 and 1/2048 of the weight, depending on where the
# weight sits in its binade. To see it in training, this experiment uses a plain 12-layer MLP
# (64 units wide, ReLU, SGD with momentum, learning rate 0.05), not the beam, for
# 100 steps, with fp32 master weights and in pure fp16. It hardly learns its task in 100 steps in
# any mode; the question here is only which weights move at all.

# %%
mlp = train_modes(("fp16+scaler", "half"), steps=100, census_every=0)
moved_table(mlp)

# %% [markdown]
# Notice: with fp32 master weights practically every weight of fc1 moved; in pure fp16 only about
# 1% did. The first layers' updates (learning rate × gradients around 10^-6) are far below 1/4096
# of their weights, so they are rounded away step after step: those layers are frozen. Only the
# last layers, whose gradients are larger, move about as much as with master weights.
# (After 100 steps of fp16 arithmetic the exact shares differ a little from one CPU to another,
# so this table's output is not checked; its claims are, at the end of the notebook.)

# %% [markdown]
# ## 6. The truth about speed, on this machine
#
# Mixed precision is sold for speed. The step times of the beam runs above, measured on this machine
# (they change from run to run, so this cell's output is not checked):

# %%
speed_table({m: runs[m] for m in ("fp32", "fp16", "fp16+scaler", "bf16")})

# %% [markdown]
# On many CPUs fp16 autocast is *slower* than fp32: without fast fp16 matrix units every cast
# costs and nothing is gained; bf16 may or may not help, depending on the CPU. GPUs with tensor
# cores are where fp16 and bf16 are built to run faster, for larger models more than for this
# tiny one: run this notebook there and read the same table. Measure; never assume.

# %% [markdown]
# ## 7. Examine your own model
#
# `examine(model, batch, loss_fn)` runs one fp32 forward and backward pass, takes a census of every
# parameter gradient and every layer's output gradient, and recommends an initial loss scale
# range: from the smallest power of two that loses < 0.1% of the gradients to the largest that
# overflows none. It says when bf16 would be safer, and why. A fresh copy of the beam model, its first batch:

# %%
# NBVAL_CHECK_OUTPUT
task = build_task("beam")
diagnosis = examine(task.model, task.batch(), task.loss)
lo, hi = diagnosis.scale_range
# the low end sits near its 0.1% threshold (2^15 here, 2^16 on some CPUs): the checked line
# says what holds on every CPU, the exact range follows
print(f"GradScaler's default 2^16 is in the recommended range: {'yes' if lo <= 2.0**16 <= hi else 'no'}; "
      f"bf16 safer: {'yes' if diagnosis.bf16_safer else 'no'}")

# %%
print(f"recommended initial scale: 2^{np.log2(lo):.0f} to 2^{np.log2(hi):.0f}")

# %% [markdown]
# The whole diagnosis, layer by layer (its counts differ a little from one CPU to another, so this
# cell's output is not checked):

# %%
print("\n".join(diagnosis.summary()))
diagnosis.table("param")

# %% [markdown]
# Notice: at scale 1 most of this model's gradients are lost in fp16, and GradScaler's default
# start, 2^16, lies at the low end of the recommended range, which is why the scaler of section 3
# never had to back off. `examine` leaves the model as it found it (its gradients, train/eval mode,
# buffers) and removes its hooks. Try it on your own model: a model whose layer outputs exceed
# 65504 gets "bf16 safer: yes", because no loss scale fixes the forward pass.

# %% [markdown]
# ## Try it
#
# Tick the modes, press Start, and move the scaler sliders while the beam model trains: the loss
# (top), the loss scale with skipped steps (middle), and which layers lose gradients (bottom: fp16
# without a scaler while it is ticked, else the scaler's run).

# %%
LiveTrainer(modes=("fp16", "fp16+scaler", "bf16"), model="beam", steps=200)

# %% [markdown]
# The finished runs of section 1 as a static figure (the heat map: fp16 without a scaler):

# %%
plot_live({m: runs[m] for m in ("fp16", "fp16+scaler", "bf16")}, heat_mode="fp16",
          title="200 steps of the beam model: fp16, fp16 + scaler, bf16")

# %% [markdown]
# ## Check yourself

# %%
# At step 0, fp16 autocast's backward pass loses far more of each layer's weight gradients than a cast of
# fp32's gradients to fp16 would. Why? (a letter)
#   a) the fp16 run has learned less than the fp32 run, so its gradients are smaller
#   b) the backward pass runs in fp16 layer by layer: a layer output's gradient that underflows is 0
#      there, and every gradient computed from it, the weights' below included, is lost with it
#   c) the loss underflows in fp16, so the backward pass starts from 0
#   d) autocast keeps the fp16 run's weights in fp16
answer = None
check_why_backward_loses_more(answer)

# %%
# Pure fp16 (the "half" mode) keeps Adam's state in fp16 too. Adam's eps is 1e-8:
# what does 1e-8 become in fp16?
answer = None
check_cast(answer, 1e-8, "fp16")

# %%
# The beam model with pure fp16 weights and Adam (the half mode) diverges at step 1. Why? (a letter)
#   a) its gradients overflow fp16 in the first backward pass
#   b) Adam divides each update by the square root of its running mean of squared gradients plus eps,
#      and in fp16 eps is 0 and so are the squares of gradients this small: the first update divides by 0
#   c) the learning rate, 10^-3, rounds to 0 in fp16
#   d) its loss overflows fp16 at step 0
answer = None
check_why_half_diverges(answer)

# %%
# In section 5's MLP with pure fp16 weights, fc1 hardly moves in 100 steps while fc12 moves about as much
# as with fp32 master weights. Why? (a letter)
#   a) the learning rate rounds to 0 in fp16
#   b) SGD's own small numbers are 0 in fp16, as Adam's eps was
#   c) fc1's updates, the learning rate times gradients around 10^-6, are below half the gap between
#      each weight and its fp16 neighbour, so the weight rounds back to itself; the last layers'
#      gradients are larger
answer = None
check_why_first_layers_freeze(answer)

# %%
# Predict, then check with examine on task = build_task("beam", batch_size=1024): with a batch of
# 1024 instead of 256, does the low end of the recommended initial scale go "up" or "down"?
answer = None
check_range_shift(answer)

# %% [markdown]
# ## Summary
#
# - The beam model's gradients are small because its loss is in m², averaged over 16,384 numbers:
#   where they enter the network they lie below fp16's smallest subnormal.
# - fp16 autocast without a scaler loses them in its backward pass, in every layer, and the model
#   stalls; a loss scaler (here 2^16) loses none, and the model learns as in fp32.
# - bf16 has fp32's range: nothing underflows at scale 1, so it trains without a scaler; it pays
#   in precision (7 mantissa bits), not in range.
# - Pure fp16 weights fail: Adam's eps (10^-8) is 0 in fp16, so its first update divides by 0;
#   and even plain SGD's updates below half the fp16 gap at a weight (1/4096 to 1/2048 of it) are
#   lost. Keep weights and optimizer state in fp32 and let autocast run the arithmetic in fp16.
# - Speed depends on the hardware: read it off the speed table on yours, never assume it.
# - `examine(model, batch, loss_fn)` recommends an initial loss scale range, or tells you to use bf16.
#
# **Next:** notebooks 08 to 10 take the three PyTorch Lightning AMP pitfalls apart, starting with
# [08 · Lightning manual optimization: `loss.backward()` vs `self.manual_backward(loss)`](08_lightning_manual_backward.ipynb).
#
# **Open exercises**
# 1. Train the beam in fp16 on smaller batches:
#    `run_training(TrainConfig(model="beam", mode="fp16", steps=200, batch_size=32, census_every=199))`.
#    Does fp16 still stall without a scaler? Why should its gradients be larger?
# 2. Make the MLP's `half` weights learn: raise `lr` in `train_modes(("half",), steps=100, lr=...)`.
#    Which layers start to move, and what happens to the loss?
# 3. Run `examine` on the transformer: `task = build_task("transformer")`, then
#    `examine(task.model, task.batch())`. Which modules lose gradients at scale 1?
# 4. Multiply the beam model's first layer (`task.model.embed.weight`) by 10^4 and examine it
#    again; then by 3·10^4. When does `examine` call bf16 safer, and why only then?

# %% [markdown]
# The lesson's claims for these seeded runs, checked:

# %%
learners = ("fp32", "fp16", "fp16+scaler", "bf16")
fp32_records = [r for r in runs["fp32"].records if r.param_census]
assert [r.step for r in fp32_records] == [0, 199]
assert not any(c.counts["zero"] for r in fp32_records for c in r.param_census.values())  # no dead units
head = fp32_records[0].act_census["head"]  # the gradient where it enters the network's last output
assert head.counts["underflow"] > 0.5 * head.total  # mostly below fp16's range
assert all(runs[m].error is None and len(runs[m]) == 200 for m in learners)
end = {m: np.mean(runs[m]["loss"][-10:]) for m in learners}
assert all(end[m] < 0.1 * start for m in ("fp32", "fp16+scaler", "bf16")) and end["fp16"] > 0.3 * start
assert end["fp16"] > 10 * end["fp16+scaler"] and end["bf16"] < 1.2 * end["fp32"]  # bf16 ends close to fp32
for step in (0, 199):
    lost = {m: lost_shares(runs[m], step, runs["fp32"]) for m in ("fp16", "fp16+scaler", "bf16")}
    weights = [n for n in lost["fp16"] if n.endswith("weight")]
    assert all(lost["fp16"][n] > 0.05 for n in weights) and not any(lost["fp16+scaler"].values())
    assert not any(lost["bf16"][n] for n in weights)  # bf16 loses no weight gradient
cast, fp16 = (lost_shares(runs[m], 0, runs["fp32"]) for m in ("fp32", "fp16"))  # cast: fp32's gradients cast
assert all(fp16[n] > 2 * cast[n] for n in weights)  # fp16's backward loses more than a cast would
last = next(r.param_census for r in runs["fp16"].records if r.step == 199 and r.param_census)
w = [c for n, c in last.items() if n.endswith("weight")]
assert sum(c.counts["zero"] + c.counts["underflow"] for c in w) > 0.5 * sum(c.total for c in w)  # mostly zeros
assert set(runs["fp16+scaler"]["scale"].tolist()) == {65536.0} and not runs["fp16+scaler"]["skipped"].any()
bf16_census = [c for r in runs["bf16"].records if r.param_census for c in r.param_census.values()]
assert bf16_census and all(c.fmt.name == "bf16" and c.counts["underflow"] == 0 for c in bf16_census)
fp32_grads = np.concatenate(list(diagnosis.grads.values()))
assert census(fp32_grads, "bf16").counts["underflow"] == 0 < census(fp32_grads, "fp16").counts["underflow"]
assert runs["half"].error.startswith("half diverged at step 1:") and "Adam's eps" in runs["half"].error
assert torch.tensor(1e-8, dtype=torch.float16).item() == 0.0 == (torch.tensor(1e-6, dtype=torch.float16) ** 2).item()
half, master = mlp["half"], mlp["fp16+scaler"]
assert moved_share(half, "fc1.weight") < 0.05 and moved_share(master, "fc1.weight") > 0.999  # frozen
assert moved_share(half) < moved_share(master) / 4
assert moved_share(half, "fc12.weight") > moved_share(master, "fc12.weight") / 2  # the last layer moves
assert 2.0**15 <= lo <= 2.0**16 <= hi and diagnosis.lost > 0.5 and not diagnosis.bf16_safer
print("all claims hold")
