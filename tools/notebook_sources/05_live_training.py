"""Source of notebooks/05_live_training.ipynb (built by tools/build_notebooks.py)."""

from build_notebooks import code, md

CELLS = [
    md("""
    # 05 · Live training: fp16, a scaler, bf16 and pure half weights

    The same seeded model trained five ways, and what each way does to its gradients and weights.

    You will be able to:
    - find, layer by layer, which gradients fp16 training loses without a loss scaler, and show that one saves them,
    - explain why bf16 needs no scaler, and why pure fp16 weights stop learning where fp32 master weights do not,
    - examine your own model's gradients and pick an initial loss scale, or decide that bf16 is the safer choice.
    """),
    code("""
    import numpy as np
    import torch

    from ampviz.census import census
    from ampviz.doctor import examine, lost_table, make_mlp, moved_share, moved_table, speed_table, train_modes
    from ampviz.lessons import check_fp16_lost_ratio, check_low_scale, check_mode_without_loss
    from ampviz.live import build_task, describe_device
    from ampviz.plots import plot_live
    from ampviz.widgets import LiveTrainer

    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    """),
    md("""
    ## 1. One model, five ways to train it

    `train_modes` trains a fresh copy of the same seeded model in each mode, on the same batches:
    the 12-layer MLP of notebook 02 (64 units wide, ReLU), SGD with momentum, 100 steps, a gradient
    census every 25 steps. The modes: `fp32`; `fp16` (autocast, no scaler); `fp16+scaler`
    (`torch.amp.GradScaler`); `bf16` (autocast); `half` (`model.half()`: fp16 weights, no fp32 master copy).
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    print(describe_device())
    trials = train_modes(("fp32", "fp16", "fp16+scaler", "bf16", "half"), steps=100, census_every=25,
                         census_fmt={"bf16": "bf16"})
    for mode, t in trials.items():
        print(f"{mode:12} loss {t.run['loss'][0]:.2f} -> {t.run['loss'][-1]:.2f}  error: {t.run.error}")
    """),
    md("""
    Notice: every mode runs on this CPU (autocast in fp16 works on the CPU in torch 2.13), and the
    losses hardly differ after 100 steps. The differences are inside: in the gradients and the weights.
    """),
    md("""
    ## 2. Where gradients vanish without a scaler

    Under fp16 autocast the backward pass runs in fp16, so a gradient of 2^-25 or less reaches
    `.grad` as an exact 0. `lost_table` counts, per layer, the gradients that end as 0 beyond the
    exact zeros of the fp32 run (dead ReLU units). The fp32 column says what fp16 *would* lose.
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    lost_table({m: trials[m] for m in ("fp32", "fp16", "fp16+scaler")}, step=0)
    """),
    md("""
    Notice: without a scaler fp16 loses about 2% of all weight gradients, 5–7% in layers fc2 and fc3,
    and almost nothing near the loss (fc9 to fc12): the pattern of notebook 02, now in a real
    training step. With the scaler (its scale stays at 2^16 = 65536 in this run, no step skipped)
    the gradients are multiplied by 2^16 before they can underflow, and none is lost.
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    scaler_run = trials["fp16+scaler"].run
    print("scales used:", sorted(set(scaler_run["scale"].tolist())), "| skipped steps:", int(scaler_run["skipped"].sum()))
    """),
    md("""
    75 steps later the pattern holds. After that many steps of fp16 arithmetic the exact shares
    differ a little from one CPU to another (its vector units round sums in another order), so this
    table's output is not checked; the claims it shows are, at the end of the notebook.
    """),
    code("""
    lost_table({m: trials[m] for m in ("fp32", "fp16", "fp16+scaler")}, step=75)
    """),
    md("""
    ## 3. bf16 needs no scaler

    bf16 has fp32's exponent range: its smallest subnormal is 2^-133, far below any of these
    gradients. The bf16 run's census (in bf16, at scale 1) against fp16's:
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    lost_table({m: trials[m] for m in ("fp16", "bf16")}, step=0, reference=trials["fp32"])
    """),
    md("""
    Notice: nothing underflows in bf16. The 0.02% in fc3 are not lost to bf16's range but ReLU
    units that bf16's coarser forward pass (7 mantissa bits) happened to switch off: bf16 pays in
    precision, not in range. That is why bf16 autocast runs without a scaler.
    """),
    md("""
    ## 4. Pure fp16 weights stop learning

    Notebook 01 showed that an update is lost when it is at most half the gap between the weight
    and its fp16 neighbour on the update's side: between 1/4096 and 1/2048 of the weight,
    depending on where the weight sits in its binade.
    In `half` mode the optimizer adds each update to the fp16 weight itself; with fp32 master
    weights (`fp16+scaler`) it adds it in fp32. Which weights moved at all in 100 steps?
    """),
    code("""
    moved_table({m: trials[m] for m in ("fp32", "fp16+scaler", "half")})
    """),
    md("""
    Notice: with fp32 master weights practically every weight of fc1 moved (over 99.9%); in pure
    fp16 only about 1% did. The first layers' updates (learning rate × gradients around 10^-6) are
    far below 1/4096 of their weights, so they are rounded away step after step: those layers are
    frozen. Only the last layers, whose gradients are larger, learn; the loss curve hides this for
    a while. (After 100 steps of fp16 arithmetic the exact shares differ a little from one CPU to
    another, so this table's output is not checked; its claims are, at the end of the notebook.)
    """),
    md("""
    ## 5. The truth about speed, on this machine

    Mixed precision is sold for speed. The step times of the runs above, measured on this machine
    (they change from run to run, so this cell's output is not checked):
    """),
    code("""
    speed_table(trials)
    """),
    md("""
    On many CPUs fp16 autocast is *slower* than fp32: without fast fp16 matrix units every cast
    costs and nothing is gained; bf16 may or may not help, depending on the CPU. GPUs with tensor
    cores are where fp16 and bf16 are built to run faster, for larger models more than for this
    tiny one: run this notebook there and read the same table. Measure; never assume.
    """),
    md("""
    ## 6. Examine your own model

    `examine(model, batch)` runs one fp32 forward and backward pass, takes a census of every
    parameter gradient and every layer's output gradient, and recommends an initial loss scale
    range: from the smallest power of two that loses < 0.1% of the gradients to the largest that
    overflows none. It says when bf16 would be safer, and why. A fresh copy of the model, one batch:
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    diagnosis = examine(make_mlp(depth=12), build_task("mlp", seed=0, batch_size=256).batch())
    print("\\n".join(diagnosis.summary()))
    diagnosis.table("param")
    """),
    md("""
    Notice: GradScaler's default start, 2^16, lies in the recommended range, which is why the
    scaler of section 2 never had to back off. `examine` leaves the model as it found it (its
    gradients, train/eval mode, buffers) and removes its hooks. Try it on your own model: a model
    whose layer outputs exceed 65504 gets "bf16 safer: yes", because no loss scale fixes the forward pass.
    """),
    md("""
    ## Try it

    Tick the modes, press Start, and move the scaler sliders while it trains: the loss (top),
    the loss scale with skipped steps (middle), and which layers lose gradients (bottom).
    """),
    code("""
    LiveTrainer(modes=("fp16", "fp16+scaler", "half"), steps=200)
    """),
    md("""
    The finished runs of section 1 as a static figure (the heat map: fp16 without a scaler):
    """),
    code("""
    plot_live({m: trials[m].run for m in ("fp16", "fp16+scaler", "half")}, heat_mode="fp16",
              title="100 steps of the 12-layer MLP: fp16, fp16 + scaler, pure half")
    """),
    md("""
    ## Check yourself
    """),
    code("""
    # Which mode lost no gradient to underflow at step 0: "fp16" or "fp16+scaler"?
    answer = None
    check_mode_without_loss(answer)
    """),
    code("""
    # An fp16 weight is 1.0. How many times larger than an update must it be for the update to be lost?
    answer = None
    check_fp16_lost_ratio(answer)
    """),
    code("""
    # examine() recommends a range of initial scales. What is its LOW end for this model (a number)?
    answer = None
    check_low_scale(answer, diagnosis)
    """),
    md("""
    The lesson's claims for this seeded run, checked:
    """),
    code("""
    runs = {m: t.run for m, t in trials.items()}
    assert all(r.error is None and len(r) == 100 for r in runs.values())
    for step in (0, 75):
        lost = {m: lost_table({"fp32": runs["fp32"], m: runs[m]}, step=step).column(m)[-1] for m in ("fp16", "fp16+scaler")}
        assert float(lost["fp16"].rstrip("%")) > 1.0 and lost["fp16+scaler"] == "0.00%"  # the scaler saves them
    assert set(runs["fp16+scaler"]["scale"].tolist()) == {65536.0} and not runs["fp16+scaler"]["skipped"].any()
    bf16_census = [c for r in runs["bf16"].records if r.param_census for c in r.param_census.values()]
    assert bf16_census and all(c.fmt.name == "bf16" and c.counts["underflow"] == 0 for c in bf16_census)
    fp32_grads = np.concatenate(list(examine(make_mlp(), build_task("mlp").batch()).grads.values()))
    assert census(fp32_grads, "bf16").counts["underflow"] == 0 < census(fp32_grads, "fp16").counts["underflow"]
    half, master = trials["half"], trials["fp16+scaler"]
    assert moved_share(half, "fc1.weight") < 0.05 and moved_share(master, "fc1.weight") > 0.999  # frozen
    assert moved_share(half) < moved_share(master) / 4
    lo, hi = diagnosis.scale_range
    assert lo <= 2.0**16 <= hi and diagnosis.lost > 0.001 and not diagnosis.bf16_safer
    print("all claims hold")
    """),
    md("""
    ## Summary

    - fp16 autocast without a scaler loses gradients in its backward pass: about 2% of this model's
      weight gradients, up to 7% in early layers. A loss scaler (here 2^16) loses none.
    - bf16 has fp32's range: nothing underflows at scale 1, so it trains without a scaler; it pays
      in precision (7 mantissa bits), not in range.
    - Pure fp16 weights (`model.half()`) freeze the layers whose updates are below half the fp16
      gap at their weights (1/4096 to 1/2048 of a weight); fp32 master weights keep every update.
    - Speed depends on the hardware: read it off the speed table on yours, never assume it.
    - `examine(model, batch)` recommends an initial loss scale range, or tells you to use bf16.

    **Next:** notebooks 06 to 08 take the three PyTorch Lightning AMP pitfalls apart, starting with
    [06 · Lightning manual optimization: `loss.backward()` vs `self.manual_backward(loss)`](06_lightning_manual_backward.ipynb).

    **Open exercises**
    1. Train with `train_modes(("fp32", "fp16"), depth=6, steps=100, census_every=25)`. Does fp16
       still lose gradients without a scaler? Why fewer?
    2. Make `half` learn: raise `lr`. Which layers start to move, and what happens to the loss?
    3. Run `examine` on the transformer: `task = build_task("transformer")`, then
       `examine(task.model, task.batch())`. Which modules lose gradients at scale 1?
    4. Scale the first layer's weights of a model by 10^4 and examine it again. Why is bf16 now safer?
    """),
]


# The exercise cells (code cells that set `answer = None`), each found by a phrase only it contains:
# (a correct answer, a plausible wrong one), as source text. tests/test_exercises.py runs both.
SOLUTIONS = {
    "lost no gradient to underflow at step 0": ('"fp16+scaler"', '"fp16"'),
    "An fp16 weight is 1.0": ("2048", "1024"),
    "What is its LOW end": ("2**7", "2**16"),
}
