"""The tables and checkers of the loss-scaling lessons (02, 04, 06), numpy only:
``largest_safe_scale``, ``census_table``, ``layer_table`` (choosing a static loss scale and seeing what
it does), ``trace_table`` (scaler traces side by side) and the lessons' ``check_*`` questions.
"""

from __future__ import annotations

import math

import numpy as np

from ampviz.checks import Check, Choice, _text_is, check, check_choice
from ampviz.formats import get_format
from ampviz.formats.census import census
from ampviz.text import Table, number

__all__ = ['largest_safe_scale', 'census_table', 'layer_table', 'trace_table', 'check_safe_scale', 'check_overflow_action', 'check_batch_effect', 'check_scale_direction', 'check_hysteresis_skips', 'check_steady_interval', 'check_log_verdict', 'check_why_scaling_works']


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
    {"a": "every fp16 binade has the same 10 fraction bits: a larger value is no more precise, relative to itself",
     "c": "the beam model's loss is far above fp16's smallest value; section 1 counted the zeros among the gradients",
     "d": "nothing rounds up: the census before and after scaling counts the same cast, with every value S times larger"},
)


def check_why_scaling_works(answer) -> Check:
    """Q: why does scaling the loss keep small gradients alive? (b): the chain rule multiplies every
    gradient by S."""
    return check_choice(answer, WHY_SCALING_WORKS)
