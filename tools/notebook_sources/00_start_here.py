"""Source of notebooks/00_start_here.ipynb (built by tools/build_notebooks.py)."""

from build_notebooks import code, md

CELLS = [
    md("""
    # Start here: mixed-precision training, made visible

    A hands-on course on what fp16, bf16 and fp8 do to the numbers a network trains with, and how
    loss scaling keeps small gradients alive.

    In this notebook you will be able to:
    - find your way around the course: what each notebook teaches and which ones are ready,
    - run cells and use the interactive explorers in JupyterLab (and fix one that does not show),
    - see what *your* machine measures for fp16 and bf16, rather than what a datasheet promises.
    """),
    code("""
    import numpy as np
    import torch

    from ampviz import env
    from ampviz.lessons import cast_table
    from ampviz.plots import plot_format_ranges
    from ampviz.widgets import FormatExplorer

    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    """),
    md("""
    ## The course map

    | # | notebook | what you will learn | status |
    |---|---|---|---|
    | 00 | start here | this page: the map, how to use the widgets, your environment | **available** |
    | 01 | fp16 range | the bits of fp16, bf16 and fp8: ranges, subnormals, rounding, and why a weight stops learning in fp16 | **available** |
    | 02 | loss scaling | real gradients that fp16 flushes to zero, and how a static loss scale shifts them back into range | **available** |
    | 03 | GradScaler internals | the real `torch.amp.GradScaler` call by call: its float32 scale, `unscale_`, skipped steps, backoff and growth, every error message, clipping and skipped-step checks, and a bit-exact simulator | **available** |
    | 04 | scaling lab | the sawtooth, the ratchet and the collapse: a dozen frameworks' loss scalers side by side on the same gradient streams, with a live lab | **available** |
    | 05 | live AMP training | one seeded model trained in fp32, fp16 with and without a scaler, bf16 and pure fp16: where gradients vanish, why weights freeze, the measured speed, a live trainer and a gradient check-up for your own model | **available** |
    | 06 | Lightning pitfall 1 | `loss.backward()` instead of `self.manual_backward(loss)` under fp16 AMP, and why `precision="16-mixed"` on a CPU hides it (it silently becomes `bf16-mixed`, with no scaler) | **available** |
    | 07 | Lightning pitfall 2 | a `no_grad` pass and then a grad pass inside one autocast: cached casts without gradients on older versions, and why the pinned versions are safe | **available** |
    | 08 | Lightning pitfall 3 | `nn.TransformerEncoder` under `bf16-mixed` that trains, then crashes in the first validation (the fast path with a padding mask) | **available** |

    Work through 01 and 02 in order: 02 uses the vocabulary of 01 (subnormal, underflow, overflow).
    """),
    md("""
    ## Using the notebooks in JupyterLab

    - **Run a cell** with Shift+Enter; run a whole notebook with *Run → Run All Cells*. Each lesson
      starts with one setup cell: run it first, and use *Kernel → Restart Kernel and Run All Cells*
      whenever the state gets confusing.
    - **Explorers** (sliders, text boxes, bit buttons) redraw their figure on every change. Move a
      slider, type a number and press Enter, or click a bit; the numbers under the controls update too.
    - **Figures** are interactive: hover for exact values, drag to zoom, double-click to reset.
    - **"Error displaying widget"** or a bare text such as `FormatExplorer(...)` instead of controls
      means the widget's live state is missing (the saved notebook keeps none). Re-run the cell.
      If JupyterLab says the notebook is *not trusted*, trust it (command palette: *Trust Notebook*)
      and re-run.
    """),
    md("""
    ## Your environment, measured

    `env.check()` lists the versions the course depends on, then *measures* what this machine
    does with fp16 and bf16: whether a matrix multiply runs, how fast it is compared with fp32 (a
    small, rough timing), and whether `torch.autocast` produces fp16/bf16 on this device.
    """),
    code("""
    env.check()
    """),
    md("""
    Read the ratios with care: they come from one small matrix on this machine right now. On many
    CPUs an fp16 matmul is much *slower* than fp32 (no fp16 arithmetic units), while bf16 may be
    faster; on a recent GPU both are usually several times faster. The course never assumes a
    speed-up: where it matters, a notebook measures.
    """),
    md("""
    ## A first look

    Even an everyday number changes when it is stored in 16 bits. The table shows what a cast to
    fp16 keeps of 0.1, 1/3 and 1000.1:
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    cast_table([0.1, 1 / 3, 1000.1], "fp16", labels=["0.1", "1/3", "1000.1"])
    """),
    md("""
    fp16 keeps 11 significant bits, about 3 decimal digits: 1000.1 becomes 1000, and 0.1 is off
    in the fourth digit. Notebook 01 shows where those bits go.
    """),
    md("""
    ## Try it

    Practise with an explorer: type a number into the box (try `65519`, then `65520`), or click a
    bit of the pattern, and watch where the value lands. Switch the format to bf16.
    """),
    code("""
    FormatExplorer("fp16", value=0.1)
    """),
    md("""
    The same idea for every format at once, as a static figure: the range each one covers, from
    its smallest subnormal to its largest value, on one log2 axis.
    """),
    code("""
    plot_format_ranges()
    """),
    md("""
    ## Summary

    - All nine notebooks, 00 to 08, follow the same layout: a setup cell, short steps,
      an explorer under *Try it*, and *Check yourself* at the end.
    - Explorers redraw on every change; if one shows an error instead of controls, re-run its cell.
    - What fp16 and bf16 cost or save on your hardware is measured, not assumed.

    **Next:** open `01_fp16_range.ipynb`.

    **Open exercises**
    1. Run `env.check()` again. Which of its numbers change from run to run, and why?
    2. In the explorer, find the smallest positive number fp16 can store by clicking bits.
    """),
]
