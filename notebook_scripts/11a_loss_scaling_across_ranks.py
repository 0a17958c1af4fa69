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
# # 11a · Loss scaling across ranks: when the scalers agree
#
# Real `torch.distributed` [ranks](../GLOSSARY.md#rank) on the CPU (gloo, 2 to 4 processes started from a cell), each with its
# own loss scaler: when they agree for free, and three ways to make them disagree. Its second half,
# [11b · Ranks in practice: all-reduce precision, compress hooks and Lightning](11b_allreduce_numerics.ipynb), measures what the [all-reduce](../GLOSSARY.md#all-reduce) itself does to the gradients.
#
# You will be able to:
# - explain why [DDP](../GLOSSARY.md#ddp) with one `GradScaler` per rank needs no extra synchronisation, and spot the loops
#   and wrappers (local gradients, `unscale_` before the all-reduce, FSDP1) that do,
# - fix them by all-reducing the found_inf flag, as `ShardedGradScaler`, Megatron and DeepSpeed do.
#
# Teaching this lesson? The [teacher's guide](../TEACHING.md#nb11a) has its timings, the answers to
# its exercises and what to demo live.
# Its words in English and Chinese (中文), each with a one-line definition: the [glossary](../GLOSSARY.md).

# %%
import numpy as np
import torch

from ampviz.ranks import (check_ddp_skips, check_found_inf_op, check_local_scales, check_why_ddp_agree,
                          check_why_fsdp1_half_step, prewarm, run_scaler_ranks, same_trace, simulate_ranks)
from ampviz.plots import plot_ranks
from ampviz.scaling import TorchGradScaler
from ampviz.widgets import RanksLab

_ = torch.manual_seed(0)
torch.set_num_threads(1)
_ = prewarm()  # imports once here what every forked rank would otherwise import for itself

# %% [markdown]
# ## 1. DDP: one rank's overflow makes every rank skip
#
# `run_scaler_ranks` forks one process per rank, joins them in a gloo process group and trains a small
# MLP in each, under `torch.autocast("cpu", dtype=torch.float16)` with DDP, SGD and its own
# `torch.amp.GradScaler("cpu", init_scale=1024, growth_interval=2)`. Each row of `found_inf` is one
# rank: `x` marks a step where that rank's batch is blown up (× 2^20), so its fp16 forward and its
# gradients overflow. Four ranks;
# rank 1 overflows at step 2 and rank 3 at step 4:

# %%
# NBVAL_CHECK_OUTPUT
flags = ["......", "..x...", "......", "....x."]
ddp = run_scaler_ranks("ddp", found_inf=flags, growth_interval=2)
print(ddp.trace.table())
print("weights bitwise identical on all ranks after every step:", bool(ddp.weights_identical.all()))

# %% [markdown]
# Notice: at step 2 only rank 1's own gradients were not finite ("own overflow", recorded by a comm
# hook *before* the all-reduce), yet all four ranks skip and halve the scale to 1024; the same at
# step 4. The weights stay bitwise identical. Why: DDP all-reduces the gradients *during*
# `backward()`, so `unscale_` (inside `scaler.step`) checks the all-reduced gradients, which are the
# same bits on every rank. One inf in the sum is an inf on every rank: every scaler sees it.
#
# `simulate_ranks` runs the same scalers without processes. Held to the real run, step for step:

# %%
# NBVAL_CHECK_OUTPUT
policy = TorchGradScaler(init_scale=1024, growth_interval=2)
for mode in ("ddp", "local"):
    predicted = simulate_ranks(policy, found_inf=flags, mode=mode)
    print(f"mode={mode!r:8} matches the real run: {same_trace(predicted, ddp.trace)}")

# %% [markdown]
# The model where each scaler judges only its own gradients (`"local"`) does not match: under DDP the
# ranks agree without any code of yours.

# %% [markdown]
# ## 2. Three ways to make ranks disagree
#
# ### a. A scaler per rank on gradients that are never all-reduced
#
# Local SGD, or any loop without DDP: each rank trains on its own gradients with its own scaler. Rank 0
# overflows at step 2, rank 1 at step 4:

# %%
# NBVAL_CHECK_OUTPUT
flags2 = ["..x...", "....x."]
local = run_scaler_ranks("local", found_inf=flags2, growth_interval=2)
print(local.trace.table())
print("simulator agrees:", same_trace(simulate_ranks(policy, found_inf=flags2, mode="local"), local.trace))

# %% [markdown]
# Notice: each rank skips only its own overflow, so from step 3 the scales differ (1024 on rank 0,
# 2048 on rank 1; 1024 and 4096 at step 4). They meet again at 2048 at step 5 (after step 4's
# update) only because the pattern is symmetric: each rank skipped once. Each rank's weights differ
# from the others' from the first step on: they never share gradients. That is what local SGD
# means, but a loss scale per rank is one more thing that no longer agrees.

# %% [markdown]
# ### b. `unscale_` and clipping on local gradients, then a manual all-reduce
#
# A hand-written data-parallel loop that clips before it averages:
#
# ```python
# scaler.scale(loss).backward()
# scaler.unscale_(opt)                        # found_inf from this rank's own gradients
# torch.nn.utils.clip_grad_norm_(params, 1.0)
# for p in params:
#     dist.all_reduce(p.grad); p.grad /= world_size   # another rank's inf arrives here
# scaler.step(opt); scaler.update()
# ```
#
# Rank 0 overflows at step 2; rank 1 never does:

# %%
# NBVAL_CHECK_OUTPUT
flags3 = ["..x...", "......"]
manual = run_scaler_ranks("unscale_first", found_inf=flags3, growth_interval=2)
print(manual.trace.table())
print("weights finite, rank by rank, before and after each step:")
print(manual.weights_finite.astype(int))
print("simulator agrees:", same_trace(simulate_ranks(policy, found_inf=flags3, mode="unscale_first"), manual.trace))

# %% [markdown]
# Notice: at step 2 rank 1's own gradients were clean, so its scaler did not skip, and it stepped
# on the all-reduced NaN: its weights are NaN from then on. At step 3 rank 1's gradients are NaN
# (own overflow), rank 0's are clean: rank 0 steps on NaN in turn. From step 4 every step of both
# ranks overflows, and the scale halves forever. The fix is to make the flag agree before `step`:
# all-reduce the gradients *before* `unscale_` (as DDP does), or all-reduce `found_inf` itself, which
# `ShardedGradScaler` does inside `unscale_`. The same loop with `ShardedGradScaler("cpu")`:

# %%
# NBVAL_CHECK_OUTPUT
synced = run_scaler_ranks("synced", found_inf=flags3, growth_interval=2)
print(synced.trace.table())
ok = bool(synced.weights_identical.all() and np.isfinite(synced.weights).all())
print("weights bitwise identical and finite:", ok)
print("simulator agrees:", same_trace(simulate_ranks(policy, found_inf=flags3, mode="synced"), synced.trace))

# %% [markdown]
# `ShardedGradScaler` calls `dist.all_reduce(found_inf)` (SUM, over its `process_group`) on every
# rank's flag; a plain `GradScaler` can do the same after `unscale_` with `ReduceOp.MAX` on the
# tensors in `scaler._per_optimizer_states[id(opt)]["found_inf_per_device"]` (a private attribute).

# %% [markdown]
# ### c. FSDP1 with a plain `GradScaler`
#
# [FSDP](../GLOSSARY.md#fsdp) shards the gradients: after the reduce-scatter each rank holds, and checks, only its own
# shard. Here FSDP1 (`FullyShardedDataParallel`, `FULL_SHARD`) wraps a probe of 8 weights, 4 per
# rank; an inf reaches rank 0's shard at step 2 and rank 1's at step 4. First with a plain
# `GradScaler`, then with `ShardedGradScaler`:

# %%
# NBVAL_CHECK_OUTPUT
plain = run_scaler_ranks("local", found_inf=flags2, fsdp=True, growth_interval=2)
print(plain.trace.table())
moved = plain.weights[0, 1:] != plain.weights[0, :-1]  # the full model, step by step
print("weights that moved, one row per step:", moved.astype(int), sep="\n")
print("steps at which both ranks use the same scale:", np.flatnonzero(plain.trace.scales_agree).tolist())
sharded = run_scaler_ranks("synced", found_inf=flags2, fsdp=True, growth_interval=2)
print(sharded.trace.table())
agree = [same_trace(simulate_ranks(policy, found_inf=flags2, mode=r.trace.mode), r.trace) for r in (plain, sharded)]
print("simulator agrees (plain, sharded):", *agree)

# %% [markdown]
# Notice: with the plain scaler, rank 0 skips step 2 while rank 1 steps, so only rank 1's half of
# the model moves (weights 4 to 7); at step 4 it is the other way round. The scales differ at steps
# 3 and 4 (1024 and 4096 at step 4) and meet again at 2048 at step 5, because each rank skipped
# once. What does not come back is the half-model step: after step 2 the model held weights that
# no single scaler would have produced, and in a real network the gradients of steps 3 and 4 were
# computed from them. (This probe's gradients do not depend on the weights, so here the two halves
# are level again after step 4, four updates each.) With `ShardedGradScaler` both ranks skip both
# steps and keep one scale. FSDP1 did not hang here, since its optimizer step is local; fairscale's
# sharded optimizer did hang on the same mismatch.
#
# **FSDP2** (`fully_shard`) needs no special scaler in torch 2.13: its gradients are `DTensor`s,
# and the DTensor dispatch of `_amp_foreach_non_finite_check_and_unscale_` reduces `found_inf`
# with MAX over the mesh (pytorch PR #132816), so a plain `GradScaler` agrees across ranks.
#
# **Megatron-LM** and **DeepSpeed** OR the flag themselves, with MAX over every group that shards
# gradients. Megatron (`MixedPrecisionOptimizer._unscale_main_grads_and_check_for_nan`):
#
# ```python
# torch.distributed.all_reduce(
#     self.found_inf, op=torch.distributed.ReduceOp.MAX, group=self.get_grad_stats_parallel_group()
# )
# ```
#
# DeepSpeed ZeRO stage 1 and 2 (`has_overflow`), then again over the model-parallel group:
#
# ```python
# dist.all_reduce(overflow_gpu, op=dist.ReduceOp.MAX, group=self.dp_process_group)
# ```
#
# The pattern: data-parallel replicas agree for free; whatever shards gradients or parameters must
# OR the flag (MAX, or SUM then "> 0") over the sharding group.

# %% [markdown]
# ## Try it
#
# Change the [world size](../GLOSSARY.md#world-size), the overflow rate and the mode (`"ddp"`, `"synced"`, `"local"`,
# `"unscale_first"`), then run the cell. The simulator takes any number of ranks; the real run beside it
# is capped at 4 ranks here (and 8 by `run_scaler_ranks`).

# %%
world_size, steps, rate, mode = 4, 12, 0.1, "local"
settings = dict(init_scale=1024, growth_interval=3)  # real runs keep the scale at most 2^14
try_flags = np.random.default_rng(2).random((world_size, steps)) < rate
sim = simulate_ranks(TorchGradScaler(**settings), found_inf=try_flags, mode=mode)
print(sim)
if world_size <= 4:
    real_run = run_scaler_ranks(mode, found_inf=try_flags, **settings)
    print("real run agrees:", same_trace(sim, real_run.trace))
sim.table()

# %% [markdown]
# Or move the controls: `RanksLab` simulates 2 to 8 ranks in each mode, with the overflow on the rank
# and at the steps you choose, one lane per rank. Under DDP the lanes move together; with a scaler per
# rank they part at the first overflow.

# %%
RanksLab(ranks=4, mode="local", overflow_rank=1, overflow_steps="5, 20")

# %% [markdown]
# The same run as a static figure (what the lab draws at those settings):

# %%
plot_ranks(simulate_ranks(TorchGradScaler(growth_interval=10),
                          found_inf=["." * 60, "." * 5 + "x" + "." * 14 + "x" + "." * 39, "." * 60, "." * 60],
                          mode="local"))

# %% [markdown]
# ## Check yourself

# %%
# DDP + GradScaler("cpu"), 4 ranks; only rank 3's backward overflows, at step 1
# (found_inf = ["....", "....", "....", ".x.."]). How many ranks skip step 1?
answer = None
check_ddp_skips(answer)

# %%
# A scaler per rank on gradients never all-reduced, from 1024 with growth_interval=2, 2 ranks,
# found_inf = ["x...", "...."]. Each rank's scale after the last step, as (rank 0, rank 1)?
answer = None
check_local_scales(answer)

# %%
# Sharded gradients on gloo: the ranks' found_inf flags are [0, 1, 0, 0], and each rank all-reduces
# its flag before the step. Which reduce op ("sum", "max", "min" or "avg") does NOT make every rank skip?
answer = None
check_found_inf_op(answer)

# %%
# Under DDP with a GradScaler per rank, only rank 1's backward overflows at step 2, yet all four ranks
# skip step 2. Why? (a letter)
#   a) DDP sends rank 0's found_inf flag to every rank
#   b) DDP all-reduces the gradients during backward(), before unscale_ checks them: every scaler
#      checks the same summed gradients, and one inf in the sum is an inf on every rank
#   c) GradScaler all-reduces its found_inf flag over the process group by itself
answer = None
check_why_ddp_agree(answer)

# %%
# FSDP1 with a plain GradScaler: an inf reaches rank 0's shard at step 2; rank 0 skips and rank 1
# steps. Why does rank 1's scaler not see the inf? (a letter)
#   a) after the reduce-scatter each rank holds and checks only its own shard of the gradients, and
#      a plain GradScaler does not share its flag
#   b) rank 1's scale is lower, so the same gradient does not overflow there
#   c) the reduce-scatter drops non-finite values before they reach rank 1
#   d) FSDP1 casts the gradients to fp32, which turns an inf back into a number
answer = None
check_why_fsdp1_half_step(answer)

# %% [markdown]
# ## Summary
#
# - DDP all-reduces gradients during `backward()`, before `unscale_`: every rank's scaler sees the
#   same bits, so all ranks skip together and the weights stay bitwise identical. No sync code needed.
# - Ranks disagree when each one judges gradients the others do not share: a scaler per rank on
#   local gradients (the scales drift), `unscale_` before a manual all-reduce (a rank steps on NaN),
#   FSDP1 with a plain `GradScaler` (half the model steps; the scales drift too).
# - The fix is to OR the flag over the group that shards: `ShardedGradScaler` (SUM), FSDP2's DTensor
#   dispatch (MAX), Megatron and DeepSpeed (MAX).
#
# **Next:** [11b · Ranks in practice: all-reduce precision, compress hooks and Lightning](11b_allreduce_numerics.ipynb) measures the all-reduce these ranks share: its
# rounding in gloo's ring order, DDP's fp16 compress hook under a scaler, and Lightning on CPU ranks.
#
# **Open exercises**
# 1. In section 2b, make rank 1 overflow at step 2 too (`["..x...", "..x..."]`). Does anyone step on
#    NaN now? Predict with `simulate_ranks`, run it for real, and do the same for FSDP1 with a plain
#    `GradScaler` (section 2c). What does that say about testing a distributed loop with one overflow?

# %% [markdown]
# The lesson's claims, checked against the real ranks and the simulator:

# %%
t = ddp.trace
assert t.overflow.sum() == 2 and t.overflow[1, 2] and t.overflow[3, 4]  # own overflows before the all-reduce
assert t.found_inf[:, 2].all() and t.found_inf[:, 4].all() and t.skipped_count.tolist() == [2] * 4
assert t.scale[:, 3].tolist() == [1024.0] * 4 and ddp.weights_identical.all()  # halved together; identical
assert same_trace(simulate_ranks(policy, found_inf=flags, mode="ddp"), t)
assert not same_trace(simulate_ranks(policy, found_inf=flags, mode="local"), t)
t = local.trace
assert t.first_divergence == 3 and t.scale[:, 3].tolist() == [1024.0, 2048.0]
assert t.scale[:, 4].tolist() == [1024.0, 4096.0]
assert t.final_scale.tolist() == [2048.0, 2048.0] and not local.weights_identical[1:].any()
t = manual.trace
assert t.poisoned_at == (3, 2) and not t.found_inf[1, 2] and t.found_inf[:, 4:].all()
assert manual.weights_finite.tolist() == [[True] * 4 + [False] * 3, [True] * 3 + [False] * 4]
assert synced.trace.found_inf[:, 2].all() and not synced.trace.nonfinite_step.any() and synced.weights_identical.all()
assert moved[2].tolist() == [False] * 4 + [True] * 4 and moved[4].tolist() == [True] * 4 + [False] * 4
assert plain.trace.scale[:, 4].tolist() == [1024.0, 4096.0] and plain.trace.scale[:, 5].tolist() == [2048.0] * 2
assert plain.trace.scales_agree.tolist() == [True] * 3 + [False] * 2 + [True]  # they meet again at step 5
before, after = plain.weights[0, 2], plain.weights[0, 3]  # the full model before and after step 2
assert (after[:4] == before[:4]).all() and (after[4:] != before[4:]).all()
assert np.array_equal(plain.weights[0, 5], sharded.weights[0, -1])  # level after step 4: four updates per half
assert sharded.trace.found_inf[:, [2, 4]].all() and sharded.trace.scales_agree.all()
print("all claims hold")
