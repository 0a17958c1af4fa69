"""Lesson 14's tables and questions (FP8 training for real): ``loss_table`` (the runs of
``train_fp8`` side by side), ``outlier_activations`` and ``recipe_table`` (torchao's two recipes and
Transformer Engine's, on one tensor), and the questions that ask why.

``recipe_table`` says which rows ran and which are modelled: torchao's tensorwise and rowwise casts
are the package's ``current_quantize`` (equal to torchao's own casts bit for bit, in
``tests/training/test_fp8_training.py``); Transformer Engine's rows are ``te_recipes``' models of
its v2.18 source, since Transformer Engine needs CUDA.
"""

from __future__ import annotations

import numpy as np

from ampviz._args import _seed, _shown, _whole
from ampviz.checks import Choice
from ampviz.formats.errors import relative_error
from ampviz.formats.fp8 import current_quantize
from ampviz.formats.fp8 import te_recipes as te
from ampviz.text import Table, measured

__all__ = ["loss_table", "outlier_activations", "recipe_table", "RECIPE_ROWS", "WHY_FP8_NO_SCALER",
           "WHY_FP8_FILTER", "WHY_FP8_FINER_BLOCKS", "check_why_fp8_no_scaler", "check_why_fp8_filter",
           "check_why_fp8_finer_blocks"]


def loss_table(runs) -> Table:
    """``train_fp8``'s runs (``Fp8Run``s) as a table: mode, the first loss, the mean of the last 10
    and its ratio to the first run's (the fp32 run, where it comes first), at 2 significant digits."""
    try:
        runs = None if isinstance(runs, (str, bytes)) else tuple(runs)
    except TypeError:
        runs = None
    if not runs or not all(hasattr(r, "losses") and hasattr(r, "mode") for r in runs):
        raise TypeError(f"runs must be a list of train_fp8's runs, not {_shown(runs)}")
    base = runs[0].end
    rows = [(r.mode, measured(r.start, 2), measured(r.end, 2), f"{r.end / base:.2f}x") for r in runs]
    return Table(("mode", "first loss", "last 10, mean", f"vs {runs[0].mode}"), rows,
                 f"{runs[0].model}, {len(runs[0].losses)} steps")


def outlier_activations(rows: int = 256, cols: int = 512, outliers: int = 4, factor: float = 200.0,
                        seed: int = 0) -> tuple:
    """A seeded float32 tensor shaped like a transformer's activations: N(0, 1) values, with
    ``outliers`` channels (columns) ``factor`` times larger, as large language models' activations
    have. Returns (tensor, the outlier columns' indices)."""
    rows, cols = _whole("rows", rows, 1, 4096), _whole("cols", cols, 1, 4096)
    outliers = _whole("outliers", outliers, 0, cols)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1e6:
        raise ValueError(f"factor must be a number above 0 and at most 1e6, not {_shown(factor)}")
    rng = np.random.default_rng(_seed(seed))
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    columns = np.sort(rng.choice(cols, outliers, replace=False))
    x[:, columns] *= np.float32(factor)
    x.flags.writeable = False
    return x, columns


#: ``recipe_table``'s rows: (name, who computes it, run or modelled).
RECIPE_ROWS = (
    ("tensorwise (E4M3)", "torchao", "run"),
    ("rowwise (E4M3, 2^k scales)", "torchao", "run"),
    ("Float8CurrentScaling", "Transformer Engine", "modelled"),
    ("Float8BlockScaling 1x128", "Transformer Engine", "modelled"),
    ("Float8BlockScaling 128x128", "Transformer Engine", "modelled"),
    ("MXFP8BlockScaling", "Transformer Engine", "modelled"),
    ("NVFP4BlockScaling (FP4)", "Transformer Engine", "modelled"),
)


def _recipes(x: np.ndarray) -> list:
    out = []
    for granularity, pow2 in (("tensorwise", False), ("rowwise", True)):
        q = current_quantize(x, granularity=granularity, round_to_power_of_2=pow2)
        d = np.asarray(q.dequantized, np.float32)
        out.append((np.asarray(q.scale).size, d, 0, int(((d == 0) & (x != 0)).sum())))
    for q in (te.te_current_scaling(x), te.te_float8_block_scaling(x, block_dim=1),
              te.te_float8_block_scaling(x, block_dim=2), te.te_mxfp8(x), te.te_nvfp4(x)):
        out.append((q.scales.size, q.dequantized, q.saturated, q.underflowed))
    return out


def recipe_table(x, outlier_columns=()) -> Table:
    """Each recipe of ``RECIPE_ROWS`` on the 2-D float32 tensor ``x`` (rows of a multiple of 128
    values for the block recipes to fill their blocks): how many scales it stores, how many values
    saturate and underflow, and the RMS error of the round trip (``relative_error``) over the whole
    tensor and over the values outside ``outlier_columns``, at 2 significant digits."""
    x = np.asarray(x, np.float32) if isinstance(x, np.ndarray) else None
    if x is None or x.ndim != 2 or x.shape[1] % 128 or not np.isfinite(x).all():
        raise ValueError("x must be a finite 2-D float32 numpy array whose rows hold a multiple of 128 values")
    try:
        columns = np.array(sorted({int(c) for c in outlier_columns}), np.int64)
    except (TypeError, ValueError):
        raise TypeError(f"outlier_columns must be column indices, not {_shown(outlier_columns)}") from None
    if columns.size and not (0 <= columns.min() and columns.max() < x.shape[1]):
        raise ValueError(f"outlier_columns must lie in 0 to {x.shape[1] - 1}")
    rest = np.ones(x.shape[1], bool)
    rest[columns] = False
    rows = []
    for (name, who, how), (scales, d, saturated, underflowed) in zip(RECIPE_ROWS, _recipes(x)):
        rows.append((name, f"{who} ({how})", f"{scales:,}", f"{saturated:,}", f"{underflowed:,}",
                     f"{100 * relative_error(x, d):.2g}%", f"{100 * relative_error(x[:, rest], d[:, rest]):.2g}%"))
    return Table(("recipe", "computed by", "scales", "saturated", "underflowed", "RMS error", "RMS error, other values"),
                 rows, f"one {x.shape[0]}x{x.shape[1]} tensor, {x.size:,} values, {columns.size} outlier columns")


# ------------------------------------------------------------------ the questions that ask why
WHY_FP8_NO_SCALER = Choice(
    "why_fp8_no_scaler",
    "A loss scale of 2^16 leaves every FP8 gradient code and the final weights unchanged, bit for bit, "
    "while in fp16 the same scale keeps most gradients from underflowing. Why?",
    {"a": "FP8 E5M2 reaches smaller numbers than fp16, so no gradient underflows in the first place",
     "b": "each grad_output cast takes its scale from that tensor's own amax: a tensor 2^16 times larger gets "
          "a scale 2^16 times smaller, exactly, so it lands on the same FP8 codes",
     "c": "torchao's Float8Linear runs a GradScaler of its own inside its backward pass",
     "d": "the gradients never reach FP8: they stay in bf16 or float32 all the way"},
    "b",
    {"a": "E5M2 reaches 2^-16, fp16 2^-24: FP8 has the smaller range, and section 1 counts gradient values "
          "that underflow in it",
     "c": "nothing in section 3's runs scales the loss but the lesson's own factor: Float8Linear has no scaler",
     "d": "section 1 records two grad_output casts per layer, each to FP8"},
)

WHY_FP8_FILTER = Choice(
    "why_fp8_filter",
    "torchao's recommended filter keeps the beam model's embed (5 inputs) and head layers as nn.Linear. Why?",
    {"a": "the first and last layers have the largest values, which would saturate E4M3",
     "b": "FP8 matrix multiplies on NVIDIA GPUs need both dimensions to be multiples of 16, which embed's 5 "
          "inputs are not, and the filter keeps the last layer, whose output is the model's, in high precision",
     "c": "torchao cannot convert a layer with a bias",
     "d": "converting them makes the loss diverge"},
    "b",
    {"a": "current scaling maps each tensor's amax to 448: section 1 counts no saturated value in any layer",
     "c": "every Linear of the beam model has a bias, and the four in the blocks are converted",
     "d": "section 4's run that converts every layer learns too; its loss ends close to the filtered run's"},
)

WHY_FP8_FINER_BLOCKS = Choice(
    "why_fp8_finer_blocks",
    "In section 5, the finer the blocks, the fewer values underflow (tensorwise, 1x128, MXFP8's 32). Why?",
    {"a": "smaller blocks use a wider FP8 format",
     "b": "a block's scale is set by the largest value in that block: with finer blocks, fewer ordinary values "
          "share a block with an outlier channel, so fewer are pushed below FP8's smallest subnormal",
     "c": "finer blocks round the scale to a power of two, which adds no rounding error",
     "d": "Transformer Engine's recipes clamp small values instead of flushing them"},
    "b",
    {"a": "every FP8 row of the table stores E4M3 elements; only the number of scales changes",
     "c": "the rowwise and 1x128 rows round to powers of two and still differ; MXFP8's E8M0 scales are powers "
          "of two too: the power of two does not explain the counts",
     "d": "the table counts values stored as 0 in every recipe: they are flushed, not clamped"},
)

check_why_fp8_no_scaler = WHY_FP8_NO_SCALER.checker()
check_why_fp8_filter = WHY_FP8_FILTER.checker()
check_why_fp8_finer_blocks = WHY_FP8_FINER_BLOCKS.checker()
