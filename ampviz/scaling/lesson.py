"""The tables and checkers of the loss-scaling lessons (02, 04, 06), numpy only:
``largest_safe_scale``, ``census_table``, ``layer_table`` (choosing a static loss scale and seeing what
it does), ``trace_table`` (scaler traces side by side) and the lessons' ``check_*`` questions.
"""

from __future__ import annotations

import math

import numpy as np

from ampviz.checks import Check, Choice, _text_is, check
from ampviz.formats import get_format
from ampviz.formats.census import census
from ampviz.text import Table, number

__all__ = ['largest_safe_scale', 'census_table', 'layer_table', 'trace_table', 'check_safe_scale', 'check_overflow_action', 'check_batch_effect', 'check_scale_direction', 'check_hysteresis_skips', 'check_steady_interval', 'check_log_verdict', 'check_why_scaling_works', 'check_why_real_pass_loses_more', 'check_why_sawtooth_is_harmless', 'check_why_one_skip_per_interval']


# --------------------------------------------------------------------------------------------
# Loss scaling
# --------------------------------------------------------------------------------------------


def largest_safe_scale(values, fmt="fp16") -> float:
    """The largest power of two S for which no value of ``values * S`` overflows in ``fmt``.

    "Overflows" is as in ``ampviz.formats.census``: the float32 product rounds past the format's max
    (to inf, or to a saturated max in an "fn" format). Only the largest magnitude matters. A scale
    is a float32 number, so the answer is at most 2^127.
    """
    fmt = get_format(fmt)
    with np.errstate(over="ignore"):  # float64 beyond float32's range becomes inf, as torch casts it
        v = np.abs(np.asarray(values, dtype=np.float32).ravel())
    if v.size == 0 or not np.all(np.isfinite(v)):
        raise ValueError("values must be a non-empty array of finite numbers")
    m = float(v.max())
    if m == 0:
        raise ValueError("all values are zero: every scale is safe")
    k = min(math.floor(math.log2(fmt.max / m)) + 1, 127)
    while census(np.float32(m), fmt, 2.0 ** k).counts["overflow"]:
        k -= 1
    return 2.0 ** k


def _scale_label(scale: float) -> str:
    mant, exp = math.frexp(scale)
    return f"2^{exp - 1}" if mant == 0.5 else number(scale)


def _share(count: int, total: int) -> str:
    return f"{count:,} ({100 * count / total:.2f}%)" if total else "0"


def _scale_list(scales) -> list:
    """``census_table``'s scales as a list of numbers: one number, or a sequence (or iterator), 1-D
    numpy array or 1-D torch tensor of them; anything else is one ValueError."""
    from collections.abc import Iterator

    from ampviz.formats import _describe, _real_array

    try:
        arr = _real_array(list(scales) if isinstance(scales, Iterator) else scales, "scales")
    except (TypeError, ValueError):
        arr = None
    if arr is None or arr.ndim > 1 or arr.dtype.kind == "b":
        raise ValueError(f"scales must be one positive number or a list, 1-D numpy array or 1-D torch tensor of "
                         f"them, e.g. [1.0, 2.0**16]; got {_describe(scales)}")
    return arr.reshape(-1).tolist()


def census_table(values, fmt="fp16", scales=(1.0,)) -> Table:
    """What ``values * scale`` becomes in ``fmt`` for each scale: count and share per category.

    ``scales``: one positive number, or a list, 1-D numpy array or 1-D torch tensor of them.
    "lost" counts nonzero values that end as 0 (``underflow``); "overflow" those that round to inf
    (or saturate). Exact zeros in ``values`` are counted apart.
    """
    fmt = get_format(fmt)
    rows, n = [], 0
    for s in _scale_list(scales):
        c = census(values, fmt, s)
        n = c.total
        rows.append((_scale_label(c.scale), _share(c.counts["zero"], n), _share(c.counts["underflow"], n),
                     _share(c.counts["subnormal"], n), _share(c.counts["normal"], n),
                     _share(c.counts["overflow"] + c.counts["nan"], n)))
    return Table(("scale", "zero already", "lost (-> 0)", "subnormal", "normal", "overflow"), rows,
                 title=f"{fmt.name}, {n:,} values" if rows else "")


def layer_table(layers: dict, fmt="fp16", scale=1.0) -> Table:
    """One row per named array (e.g. a layer's gradient): size, largest magnitude and what
    ``fmt`` does to it at ``scale`` (shares of that array)."""
    fmt = get_format(fmt)
    if not isinstance(layers, dict):
        raise TypeError(f"layers must be a dict name -> array of values, got {type(layers).__name__}")
    rows = []
    for name, values in layers.items():
        with np.errstate(over="ignore"):  # float64 beyond float32's range becomes inf, as torch casts it
            v = np.asarray(values, dtype=np.float32).ravel()
        c = census(v, fmt, scale)
        f = c.fractions
        big = float(np.max(np.abs(v))) if v.size else 0.0
        rows.append((name, f"{v.size:,}", f"{big:.2g}", f"{100 * f['zero']:.1f}%",
                     f"{100 * f['underflow']:.1f}%", f"{100 * f['subnormal']:.1f}%",
                     f"{100 * f['normal']:.1f}%"))
    return Table(("name", "values", "largest |value|", "zero already", "lost (-> 0)", "subnormal",
                  "normal"), rows, title=f"{fmt.name} at scale {_scale_label(float(np.float32(scale)))}")


def trace_table(traces) -> Table:
    """One row per simulated scaler (``ampviz.scaling.ScalerTrace``): skipped steps, where the
    scale ended and how low it went, and the step at which a scaler that raises stopped the run
    (steps after a stop are not counted as skipped)."""
    from ampviz.scaling import ScalerTrace

    traces = list(traces) if isinstance(traces, (list, tuple)) else [traces]
    if not all(isinstance(t, ScalerTrace) for t in traces):
        raise TypeError("traces must be a ScalerTrace or a list of them (from ampviz.scaling.simulate)")
    rows = []
    for t in traces:
        end = t.steps if t.stopped_at is None else t.stopped_at + 1
        scale = np.asarray(t.scale[:end], dtype=np.float64)
        skipped = t.skipped_count
        final = "stopped" if t.stopped_at is not None else number(t.final.scale)
        rows.append((t.policy.name, f"{skipped:,}", number(scale[0]) if scale.size else "-",
                     final, number(scale.min()) if scale.size else "-",
                     "-" if t.stopped_at is None else f"{t.stopped_at:,}"))
    return Table(("scaler", "skipped steps", "initial scale", "final scale", "lowest scale", "stopped at step"), rows)


# ----- 02: loss scaling -----
def check_safe_scale(answer, values, fmt="fp16") -> Check:
    """Q: the largest power-of-two loss scale at which no value of ``values`` overflows."""
    return check(answer, largest_safe_scale(values, fmt),
                 hint="find max|g|, then the largest power of two S with S * max|g| below 65504")


def check_overflow_action(answer) -> Check:
    """Q: what GradScaler does with a step whose gradients contain inf: "skip" (and lower the scale)."""
    return check(answer, "skip", accept=lambda a: isinstance(a, str) and "skip" in a.casefold(),
                 hint="applying an inf gradient would turn the weights into inf or NaN")


def check_batch_effect(answer) -> Check:
    """Q: with a batch of 1024 instead of 256, does fp16 lose "more" or "fewer" of the beam model's
    gradients at scale 1? "more": the mean over the batch divides each output's gradient by the
    batch size (tests/training/test_beam.py measures it)."""
    def accept(a) -> bool:
        return isinstance(a, str) and a.strip().strip("'\"").strip().casefold() in ("more", "more of them",
                                                                                  "it loses more", "larger", "higher")
    return check(answer, "more", accept=accept,
                 hint="the loss is a mean over batch x 64 numbers: what does a larger batch do to each term's gradient?")


# ----- 04: dynamic loss scalers -----
def check_scale_direction(answer) -> Check:
    """Q: torch's rule (growth_interval 2000), an overflow every 500 steps: does the scale go
    "up" or "down"?"""
    return check(answer, "down", accept=_text_is("down", "it goes down", "goes down", "decreases", "falls",
                                                 "lower"),
                 hint="growth needs growth_interval clean steps in a row")


def check_hysteresis_skips(answer) -> Check:
    """Q: how many overflows in a row Megatron's default scaler skips without backing off."""
    from ampviz.scaling import PRESETS

    return check(answer, PRESETS["Megatron"].hysteresis - 1, hint="the budget is spent before the backoff")


def check_steady_interval(answer, every: int = 500) -> Check:
    """Q: overflows that no scale avoids come every ``every`` steps; the largest ``growth_interval``
    at which torch's scale holds steady instead of ratcheting down: ``every - 1``, the clean steps
    between two overflows (``simulate`` shows it: tests/scaling/test_scaling_lesson.py)."""
    return check(answer, every - 1, hint="growth needs growth_interval clean steps in a row: how many clean "
                                         "steps lie between two overflows?")


def check_log_verdict(answer, scales) -> Check:
    """Q: ``ampviz.scaling.scalelog.diagnose``'s verdict on the scales a log reports after each overflow:
    "sawtooth", "ratchet" or "collapse"."""
    from ampviz.scaling.scalelog import diagnose

    verdict = diagnose(scales).verdict
    return check(answer, verdict, accept=_text_is(verdict),
                 hint="compare the first and the last quarter of the messages")


# --------------------------------------------------------------------------------------------
# Questions that ask why
# --------------------------------------------------------------------------------------------

WHY_SCALING_WORKS = Choice(
    "why_scaling_works",
    "Why does multiplying the loss by S keep small gradients from becoming 0 in fp16?",
    {"a": "fp16 keeps more significant bits for larger values",
     "b": "the backward pass is linear in the loss, so every gradient is S times larger and lands "
          "above fp16's smallest subnormal; dividing by S in fp32 undoes it",
     "c": "the loss itself underflows in fp16, and scaling keeps it nonzero",
     "d": "the scaler rounds gradients below 2^-24 up to 2^-24"},
    "b",
    {"a": "a gradient becomes 0 because it lies below fp16's range, not for lack of bits: every normal fp16 "
          "binade keeps the same 10 fraction bits, and 2^-25 becomes 0 whatever bits larger values keep",
     "c": "the beam model's loss is far above fp16's smallest value; section 1 counted the zeros among the gradients",
     "d": "nothing rounds up: the census before and after scaling counts the same cast, with every value S times larger"},
)


check_why_scaling_works = WHY_SCALING_WORKS.checker()


WHY_REAL_PASS_LOSES_MORE = Choice(
    "why_real_pass_loses_more",
    "Section 2: cast to fp16, a tenth of fp32's weight gradients become 0; after a real fp16 backward pass "
    "almost half of them are 0. Why more?",
    {"a": "autocast computes the loss in fp16, and the loss itself underflows",
     "b": "the real pass runs another batch, with smaller gradients",
     "c": "the weights' gradients are sums over the batch, and in fp16 those sums overflow",
     "d": "each weight's gradient is computed from the gradient of its layer's output, and the fp16 pass "
          "has already rounded most of those to 0 on the way down"},
    "d",
    {"a": "autocast computes this mean squared error in fp32 (section 5 says so): the loss never passes "
          "through fp16",
     "b": "gradients(seed=0, autocast=\"float16\") runs the same model on the same first batch: only the "
          "precision of the pass changes",
     "c": "an overflow gives inf, not 0: section 6 needed a scale of 2^34 before any weight's gradient "
          "overflowed"},
)


check_why_real_pass_loses_more = WHY_REAL_PASS_LOSES_MORE.checker()


# ----- 06: the scaling lab -----
WHY_SAWTOOTH_IS_HARMLESS = Choice(
    "why_sawtooth_is_harmless",
    "Why is section 1's sawtooth harmless, while section 2's ratchet takes torch's scale down to 2^-4?",
    {"a": "the ratchet skips far more steps than the sawtooth, and skipped steps are what harm training",
     "b": "the sawtooth's overflows come from large gradients, which fit again once the scale backs off, "
          "so it grows back to the same level; the ratchet's happen at every scale and more often than once "
          "per growth_interval, so no halving is ever undone",
     "c": "each of the ratchet's overflows halves the scale more than one of the sawtooth's does",
     "d": "the ratchet is the scaler finding a lower scale that keeps larger gradients in fp16's range"},
    "b",
    {"a": "NeMo's scaler skips the same 20 steps in section 3 and keeps its scale at 65536: the harm is "
          "where torch's scale ends, below 1, where it makes underflow worse",
     "c": "every overflow halves torch's scale once (backoff_factor 0.5): 20 spikes took 2^16 to 2^-4, "
          "20 halvings (section 2)",
     "d": "section 2's spikes are inf or NaN from the forward pass, which no scale keeps in range; its "
          "large but finite spikes settle between 2^13 and 2^14 instead"},
)


check_why_sawtooth_is_harmless = WHY_SAWTOOTH_IS_HARMLESS.checker()


WHY_ONE_SKIP_PER_INTERVAL = Choice(
    "why_one_skip_per_interval",
    "Section 1's gradients are steady, with no spikes, yet once its scale has settled torch skips about one "
    "step per growth_interval. Why?",
    {"a": "the steady stream still holds an inf or NaN every 2,000 steps or so",
     "b": "torch halves the scale on a timer, every growth_interval steps, whether a step overflows or not",
     "c": "the scaler learns that a scale is too high only from an overflow: after growth_interval clean "
          "steps it doubles to 2^19, where the largest gradients soon reach 65520, and that step is "
          "skipped and the scale halved",
     "d": "the loss is computed in fp16, where a scale of 2^19 is already inf"},
    "c",
    {"a": "section 1's gradients are all finite, around 2^-4: its overflows stop at 2^18, which an inf's "
          "or a NaN's would not",
     "b": "torch halves only at an overflow: section 1's scale first grows for 6,000 steps without one skip",
     "d": "section 1's first run computes the loss in float32 (the default); with an fp16 loss the run "
          "below it overflows at 65536 already, far below 2^19"},
)


check_why_one_skip_per_interval = WHY_ONE_SKIP_PER_INTERVAL.checker()
