"""Source of notebooks/02_loss_scaling.ipynb (built by tools/build_notebooks.py)."""

from build_notebooks import code, md

CELLS = [
    md("""
    # 02 · Loss scaling: keeping small gradients alive in fp16

    Real gradients, fp16's window, and the one multiplication that moves them back into it.

    You will be able to:
    - measure how many of a model's gradients fp16 flushes to zero, and which layers lose them,
    - explain why multiplying the loss by S shifts every gradient by log2(S), and pick a safe static S,
    - say what one overflowing value does to a training step, and why GradScaler skips such steps.
    """),
    code("""
    import numpy as np
    import torch

    from ampviz.census import census
    from ampviz.lessons import (census_table, check_lost_share, check_overflow_action,
                                check_safe_scale, largest_safe_scale, layer_table)
    from ampviz.plots import plot_census
    from ampviz.training import layer_gradients, model_gradients, torch_cast_counts
    from ampviz.widgets import RangeExplorer

    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    """),
    md("""
    ## 1. Real gradients

    `model_gradients(seed=0)` builds a plain 12-layer MLP (64 units wide, ReLU, PyTorch's default
    initialisation), runs one batch of 256 synthetic examples forward and backward in fp32, and
    returns the gradient of every parameter as one array.
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    g = model_gradients(seed=0)
    print(f"{g.size:,} gradients; exactly zero: {np.mean(g == 0):.1%}; largest |g|: {np.abs(g).max():.3g}")
    """),
    md("""
    About half are exactly zero: ReLU units that were off for the whole batch pass no gradient.
    Here is where the rest sit on a log2 axis, over fp16's bands (hover the bars):
    """),
    code("""
    plot_census(g, "fp16", scale=1.0, title="Gradients of the seeded MLP, cast to fp16 at scale 1")
    """),
    md("""
    ## 2. What fp16 does to them

    Cast to fp16 as they are (scale 1), the gradients fall into the categories of notebook 01.
    (In real fp16 training the backward pass itself runs in fp16, so gradients can underflow on
    the way too; casting the fp32 result shows the effect in its simplest form.)
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    census_table(g, "fp16", scales=[1.0])
    """),
    md("""
    Notice: 3.90% of all gradients (1,731 values, nonzero in fp32) become 0 in fp16. Another 40.95%
    are subnormal, kept with only a few significant bits; only 6.03% are normal fp16 numbers.
    Which layers lose them? The weight gradients, layer by layer:
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    layers = layer_gradients(seed=0)
    layer_table({name: v for name, v in layers.items() if name.endswith("weight")}, "fp16")
    """),
    md("""
    Notice: gradients shrink on the way back from the loss (fc12) to the input (fc1), by about 2^12
    in largest size. The first layers lose 5–11% of their gradients outright and keep the rest only
    as subnormals: in fp16 they would barely learn.
    """),
    md("""
    ## 3. What the paper saw

    This is the effect Micikevicius et al. describe in *Mixed Precision Training* (ICLR 2018,
    arXiv:1710.03740, Fig. 3): as reported there, 67% of the activation gradients of a Multibox SSD
    detector were zero, and values down to 2^-27, below fp16's smallest subnormal, had to be
    preserved; SSD diverged without scaling and matched fp32 with a loss scale of 8. NVIDIA's *Mixed Precision
    Training* guide reports, for the same kind of network, that converting to fp16 made "31% of
    these values become zeros, leaving only 5.3% as non-zeros". These are their reported numbers;
    this notebook shows the mechanism on its own model, not theirs.
    """),
    md("""
    ## 4. Multiply the loss, shift every gradient

    Backpropagation is linear in the loss: if the loss is multiplied by S, every gradient is
    multiplied by S (chain rule). For a power of two S = 2^k this is exact, with no rounding:
    each gradient moves k places to the right on the log2 axis. Before the optimizer step, the
    gradients are divided by S again, in fp32.
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    scaled = model_gradients(seed=0, loss_scale=2.0**10)
    print("backward of (loss × 2^10) == 2^10 × gradients, bit for bit:",
          np.array_equal(scaled, g * np.float32(2.0**10)))
    """),
    md("""
    So we can study any scale by multiplying `g`. Losses and subnormals at several scales:
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    census_table(g, "fp16", scales=[2.0**k for k in (0, 3, 4, 8, 12, 16, 20)])
    """),
    md("""
    Notice: each factor of 16 in S cuts the lost share about 8-fold here: 3.90% → 0.45% → 0.06%,
    and nothing is lost from 2^12 on. The subnormal share falls too, so the surviving gradients also keep more
    precision. At 2^3 (the SSD paper's factor 8) these gradients still lose 0.81%.
    """),
    md("""
    ## 5. How far can we scale? A static S

    Too far, and the largest gradients overflow: fp16 rounds to inf from 65520 up. The rule of
    Micikevicius et al.: choose S so that S × max|g| < 65504. The largest power of two that keeps
    every one of these gradients finite:
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    S = largest_safe_scale(g, "fp16")
    gmax = float(np.abs(g).max())
    print(f"largest safe scale: S = 2^{int(np.log2(S))} = {S:,.0f}")
    print(f"S × max|g| = {S * gmax:,.0f} < 65504;  2S × max|g| = {2 * S * gmax:,.0f} ≥ 65520")
    """),
    md("""
    At S = 2^20 nothing is lost and nothing overflows (table above). But max|g| changes from step to
    step and is unknown before the backward pass: a static S is a guess with a margin. That is why
    dynamic loss scalers exist (notebook 03).
    """),
    md("""
    ## 6. One step too far: overflow

    At 2S, a few of the largest gradients go past 65520:
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    census_table(g, "fp16", scales=[S, 2 * S])
    """),
    md("""
    Only 3 values of 44,362 became inf, and that is enough to ruin the step: after unscaling, the
    gradient norm is inf, and an optimizer step would turn those weights into ±inf (then NaN in the
    next forward pass).
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    g16 = (torch.from_numpy(g) * (2 * S)).half()
    unscaled = g16.float() / (2 * S)
    print("inf gradients:", int(torch.isinf(g16).sum()), "| gradient norm after unscaling:", unscaled.norm().item())
    weights = torch.full_like(unscaled, 0.5)  # any finite weights
    print("weights no longer finite after one SGD step:", int((~torch.isfinite(weights - 0.1 * unscaled)).sum()))
    """),
    md("""
    `torch.amp.GradScaler` checks every gradient for inf and NaN after unscaling. If it finds one, it
    skips that `optimizer.step()` entirely and multiplies the scale by `backoff_factor` (0.5 by
    default); after `growth_interval` clean steps (2000) it doubles the scale again. Notebook 03
    simulates this bit for bit.
    """),
    md("""
    ## Try it

    Move the log2-scale slider from 0 to 21: watch the lost share (left) shrink and, past 20, the
    overflow band (right) fill. Switch the format to bf16 to see why bf16 training rarely needs a
    loss scale.
    """),
    code("""
    RangeExplorer(g, fmt="fp16", log2_scale=0)
    """),
    md("""
    The same gradients at the largest safe scale, as a static figure:
    """),
    code("""
    plot_census(g, "fp16", scale=S, title="Gradients at the largest safe scale, 2^20")
    """),
    md("""
    ## Check yourself
    """),
    code("""
    # At scale 1, what share of ALL the gradients in g (a number from 0 to 1) does fp16 flush to 0?
    answer = None
    check_lost_share(answer, g)
    """),
    code("""
    # What is the largest power-of-two loss scale at which none of these gradients overflow?
    answer = None
    check_safe_scale(answer, g)
    """),
    code("""
    # GradScaler finds an inf among a step's gradients. What does it do with that step? (a word)
    answer = None
    check_overflow_action(answer)
    """),
    md("""
    The lesson's numbers for this seeded model, each census checked against torch's own cast
    (`(g * s).to(torch.float16)`, counted with torch only):
    """),
    code("""
    for s in [1.0, 2.0**3, 2.0**4, 2.0**8, 2.0**12, 2.0**16, S, 2 * S]:
        assert census(g, "fp16", s).counts == torch_cast_counts(g, s, "float16"), s
    at_1, at_S, at_2S = (torch_cast_counts(g, s, "float16") for s in (1.0, S, 2 * S))
    assert (at_1["underflow"], g.size) == (1731, 44362)  # 3.90% lost at scale 1
    assert at_S["underflow"] == at_S["overflow"] == 0  # nothing lost or inf at S = 2^20
    assert S == 2.0**20 and S * gmax < 65504 and 2 * S * gmax >= 65520
    assert at_2S["overflow"] == 3 and not torch.isfinite(unscaled.norm())  # 2S: inf, step ruined
    print("all claims hold")
    """),
    md("""
    ## Summary

    - fp16 flushes gradients of 2^-25 and below to zero (3.90% of this model's gradients) and keeps
      those below 2^-14 only as subnormals (another 40.95%); layers far from the loss suffer most.
    - Multiplying the loss by S = 2^k multiplies every gradient by exactly 2^k, moving the whole
      histogram k binades to the right; the optimizer unscales in fp32.
    - A static S must satisfy S × max|g| < 65504; here S = 2^20 loses nothing. One step further,
      3 gradients become inf and the step must be skipped.

    **Next:** [03 · GradScaler internals: the real scaler, call by call](03_gradscaler_internals.ipynb)
    takes `torch.amp.GradScaler` apart: how it finds S on its own.

    **Open exercises**
    1. `census_table(g, "bf16")`: how many gradients does bf16 lose at scale 1? Why?
    2. Try `model_gradients(seed=1)` and `model_gradients(seed=0, depth=16)`. Does S = 2^20 still
       lose nothing? Is there still a scale that neither loses nor overflows anything?
    3. The NVIDIA guide reports that a scale of 32K "would recover all but 0.1%" for SSD. What is
       the smallest power of two that loses less than 0.1% of *these* gradients?
    4. The first layers' gradients are ~2^12 smaller than the last layer's. Why would one loss
       scale per layer (not one per model) help, and what would it cost?
    """),
]


# The exercise cells (code cells that set `answer = None`), each found by a phrase only it contains:
# (a correct answer, a plausible wrong one), as source text. tests/test_exercises.py runs both.
SOLUTIONS = {
    "what share of ALL the gradients": ("0.039", "0.077"),  # wrong: the share of the nonzero ones
    "largest power-of-two loss scale": ("2**20", "2**21"),
    "What does it do with that step": ('"skip"', '"clip"'),
}
