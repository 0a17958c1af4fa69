"""Source of notebooks/06_lightning_manual_backward.ipynb (built by tools/build_notebooks.py)."""

from build_notebooks import code, md

CELLS = [
    md("""
    # 06 · Lightning manual optimization: `loss.backward()` vs `self.manual_backward(loss)`

    One wrong line in a LightningModule with manual optimization, and the three things it can do:
    crash, run silently, or quietly divide every gradient by 65536.

    You will be able to:
    - check which precision, precision plugin and loss scaler a Lightning `Trainer` really uses,
    - explain `Attempted unscale_ but _scale is None` from the scaler's state, and find the call that fixes it,
    - recognise the silent variant, and why `scaler.update()` runs once per optimizer.
    """),
    code("""
    import torch

    from ampviz.pitfalls import versions
    from ampviz.pitfalls.manual_backward import (check_backward_call, check_cpu_precision,
                                                 check_scale_after_overflow, cpu_16_mixed, fp16_late_loss_backward,
                                                 fp16_loss_backward, fp16_manual_backward, fp32_reference,
                                                 norms_table, precision_table, run_manual, scale_table,
                                                 several_optimizers, trace_table)

    torch.manual_seed(0)
    torch.set_num_threads(1)
    print(versions())
    """),
    md("""
    ## 1. The module

    Every run below fits the same seeded model (three linear layers, SGD, four batches of 16) with
    `automatic_optimization = False`. Its `training_step` is the usual manual-optimization loop, with
    the backward call as the one thing that changes:

    ```python
    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        loss = F.mse_loss(self(x), y)
        self.manual_backward(loss)   # the buggy version: loss.backward()
        opt.step()
    ```

    `run_manual(...)` (in `ampviz.pitfalls.manual_backward`) runs it through a quiet `Trainer`: no
    progress bar, no logs, nothing written to this folder.
    """),
    md("""
    ## 2. `precision="16-mixed"` on the CPU is not fp16

    Ask for fp16 AMP the usual way, `Trainer(accelerator="cpu", precision="16-mixed")`, run the
    **buggy** `loss.backward()`, and look at what Lightning chose:
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    on_cpu = cpu_16_mixed()
    print(on_cpu)
    print(*on_cpu.details["warnings"], sep="\\n")
    print(precision_table(on_cpu))
    """),
    md("""
    Notice: Lightning replaced `16-mixed` by `bf16-mixed`, with `precision_plugin.scaler = None`.
    bf16 needs no loss scaling, so the wrong backward call does no harm here and nothing fails: the
    bug waits for the first run on a GPU. (The warning is out of date: torch itself runs fp16
    autocast on the CPU.) Whatever precision you asked for, check what you got:

    ```python
    trainer.precision, type(trainer.precision_plugin).__name__, getattr(trainer.precision_plugin, "scaler", None)
    ```
    """),
    md("""
    ## 3. Real fp16 AMP: the error

    To get fp16 autocast and a real `torch.amp.GradScaler("cpu")`, pass the plugin yourself:
    `Trainer(plugins=[MixedPrecision("16-mixed", "cpu")])` (from `lightning.pytorch.plugins`).
    The buggy `loss.backward()`, for real; the exception is caught and printed with the call chain
    from `training_step` to where it was raised:
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    bug = fp16_loss_backward()
    print(f"{bug.error_type}: {bug.message}")
    print(*bug.details["error_chain"], sep="\\n")
    print(precision_table(bug))
    """),
    md("""
    Notice: the error comes from `opt.step()`, not from the backward call. Lightning's precision
    plugin calls `scaler.unscale_(optimizer)` before stepping, and the scaler refuses: it has no
    scale yet. To search for the message, mind the **two spaces** after `None.`
    """),
    md("""
    ## 4. The mechanism: `_scale` is created by `scaler.scale()`

    `GradScaler` creates its scale tensor `_scale` lazily, at the first `scaler.scale(loss)`. The
    scaler's `_scale` at three moments of each iteration, in the buggy run and in the fixed one:
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    fix = fp16_manual_backward()
    print(trace_table(bug))
    print()
    print(trace_table(fix))
    """),
    md("""
    Who calls `scaler.scale(...)` in the fixed run? `run_manual` records the call chain each time
    the scaler scales a loss:
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    print(len(fix.details["scale_calls"]), "calls to scaler.scale(); the first from:")
    print(*fix.details["scale_calls"][0], sep="\\n")
    print("in the buggy run:", len(bug.details["scale_calls"]), "calls")
    """),
    md("""
    Notice: `self.manual_backward(loss)` → `Strategy.backward` → the precision plugin's
    `pre_backward`, which returns `scaler.scale(loss)`; that product is what gets `.backward()`.
    A bare `loss.backward()` bypasses all of it: the gradients are not scaled, and the scaler never
    gets a `_scale`.
    """),
    md("""
    ## 5. Worse than the error: the silent case

    The assertion fires only while `_scale` is `None`. Once one `manual_backward` has run (say the
    bare `loss.backward()` sits in a branch that is not taken in the first iteration), every later
    bare backward passes unscaled gradients to a plugin that divides them by the scale anyway:
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    fp32 = fp32_reference()
    silent = fp16_late_loss_backward()
    print(silent)
    print(norms_table(silent, fp32))
    print(f"iteration 1: ratio × scale = {silent.details['ratio_times_scale']:.3f}")
    """),
    md("""
    Notice: no error and no warning. From iteration 1 on, the optimizer steps with gradients about
    65536 times too small (ratio × scale ≈ 1), so the model stops learning. (The later ratios drift
    from 1/65536 because those weights no longer match the fp32 run's.)
    """),
    md("""
    ## 6. The fix, checked against fp32

    `self.manual_backward(loss)` in every iteration, under the same real fp16 AMP:
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    print(fix)
    print(norms_table(fix, fp32))
    worst = max(abs(r) for r in fix.details["rel_diff_vs_fp32"])
    print(f"largest relative difference from fp32: {'below 0.5%' if worst < 5e-3 else f'{worst:.2%}'}")
    """),
    md("""
    Notice: the gradient norms agree with fp32 to fp16's rounding, and the scale stays 65536.
    """),
    md("""
    ## 7. `update()` once per optimizer

    With several optimizers, Lightning's plugin runs `unscale_`, `step` **and `update()`** inside
    each `opt.step()`. Three optimizers (one per layer), and a loss spike (× 2^20) in iteration 1
    that overflows fp16:
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    three = several_optimizers(optimizers=3, spike_at=1, iterations=3)
    print(scale_table(three))
    print("trainer.global_step =", three.details["global_step"], "after", three.details["iterations"], "iterations")
    """),
    md("""
    Notice: one overflowing iteration halves the scale three times, 65536 → 8192: each optimizer
    found inf in its own gradients, and each `opt.step()` ended with an `update()`. For the same
    reason `growth_interval` counts optimizer steps, and so do `trainer.global_step` and
    `max_steps`: `max_steps=9` with three optimizers is three iterations.
    """),
    md("""
    ## What write-ups of this error tend to get wrong

    - It is not about having several optimizers or `ReduceLROnPlateau` schedulers: one optimizer
      reproduces it (sections 3 to 6). (Stepping `ReduceLROnPlateau` every batch with a small
      patience collapses the learning rate within a few steps, which is a separate problem: step it per epoch.)
    - `precision="16-mixed"` on a CPU does not test fp16 at all: you get bf16 without a scaler.
    - The assertion is the lucky case. Only a run whose first step has no scaled loss raises;
      later bare `loss.backward()` calls shrink the gradients without a word.
    """),
    md("""
    ## Try it

    Pick a backward call (`"manual_backward"`, `"loss.backward"` or
    `"manual_backward, then loss.backward"`), fp16 or not, and the number of optimizers (1 to 3);
    `spike_at` puts a loss spike into one iteration (or `None`):
    """),
    code("""
    mine = run_manual("manual_backward", fp16=True, optimizers=2, spike_at=2, iterations=4)
    print(mine)
    print(scale_table(mine, optimizers=2) if not mine.failed else trace_table(mine))
    """),
    md("""
    ## Check yourself
    """),
    code("""
    # Trainer(accelerator="cpu", precision="16-mixed"): what is trainer.precision? (a string)
    answer = None
    check_cpu_precision(answer)
    """),
    code("""
    # In a LightningModule with manual optimization, which call makes the scaler scale the loss?
    answer = None
    check_backward_call(answer)
    """),
    code("""
    # Four optimizers, scale 65536, one iteration whose gradients overflow: the scale after it?
    answer = None
    check_scale_after_overflow(answer)
    """),
    md("""
    The lesson's claims, checked on this machine's torch and lightning:
    """),
    code("""
    assert on_cpu.details["precision"] == "bf16-mixed" and on_cpu.details["scaler"] is None and not on_cpu.failed
    assert bug.error_type == "AssertionError" and bug.message.startswith("Attempted unscale_ but _scale is None.  This")
    assert bug.details["iterations"] == 0 and bug.details["scale_calls"] == []  # first step, no scale() ever
    assert bug.details["error_chain"][-3].endswith("MixedPrecision.optimizer_step")  # raised inside opt.step()
    assert fix.details["scale_calls"][0][-1].endswith("MixedPrecision.pre_backward")  # manual_backward scales
    assert abs(silent.details["ratio_times_scale"] - 1) < 0.01  # silent case: gradients / 65536
    assert max(abs(r) for r in fix.details["rel_diff_vs_fp32"]) < 5e-3  # the fix matches fp32
    assert three.scale[3:6] == [32768.0, 16384.0, 8192.0]  # update() once per optimizer
    print("all claims hold")
    """),
    md("""
    ## Summary

    - In manual optimization, call `self.manual_backward(loss)`: it goes through the precision
      plugin, which scales the loss (`pre_backward` returns `scaler.scale(loss)`).
    - A bare `loss.backward()` under real fp16 AMP raises
      `Attempted unscale_ but _scale is None.  This may indicate ...` at the first `opt.step()`;
      once a scale exists, it silently divides later gradients by the scale instead.
    - `Trainer(accelerator="cpu", precision="16-mixed")` runs bf16-mixed with no scaler: check
      `trainer.precision` and `trainer.precision_plugin.scaler`; use
      `plugins=[MixedPrecision("16-mixed", "cpu")]` for real fp16 on the CPU.
    - Lightning calls `scaler.update()` after every `opt.step()`: with N optimizers, one
      overflowing iteration divides the scale by 2^N.

    **Next:**
    [07 · Lightning pitfall: a `no_grad` pass inside autocast, then a pass with grad](07_lightning_autocast_cache.ipynb).

    **Open exercises**
    1. In *Try it*, run `"loss.backward"` with `precision="bf16-mixed"` instead of `fp16=True`.
       Why is this code correct there, and what would break it?
    2. With three optimizers and one `manual_backward`, optimizer 1's `update()` can change the
       scale before optimizers 2 and 3 unscale their gradients. What happens to their gradients
       in the iteration where the scale grows?
    3. Call `self.clip_gradients(opt, ...)` before `opt.step()` in manual optimization: are the
       gradients it clips scaled or not? (Hint: where does the plugin call `unscale_`?)
    """),
]


# The exercise cells (code cells that set `answer = None`), each found by a phrase only it contains:
# (a correct answer, a plausible wrong one), as source text. tests/test_exercises.py runs both.
SOLUTIONS = {
    "what is trainer.precision": ('"bf16-mixed"', '"16-mixed"'),
    "which call makes the scaler scale the loss": ('"self.manual_backward(loss)"', '"loss.backward()"'),
    "Four optimizers, scale 65536": ("4096", "32768"),
}
