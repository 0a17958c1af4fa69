"""What an FP8 scaling recipe costs a stream in error, and recipes side by side: ``rms_errors``
(each step's relative RMS error of the FP8 round trip, exactly, value by value) and
``recipe_table`` (recipes over several streams: steps that saturate, steps that lose at least 1%
to underflow, the mean share underflowed and the mean RMS error), lesson 12's comparison.

The counts say how many values a recipe loses; the RMS error weighs each value by its size. The
two disagree where the values lost are small: a scale held low can flush many of a wide tensor's
smallest values and hardly move its RMS error, while a step that saturates loses most of its RMS.
"""

from __future__ import annotations

import numpy as np

from ampviz.formats.blocks.tables import _element_table, _table_index
from ampviz.formats.fp8.stream import _FINITE, Fp8ScalingTrace, TensorStream, simulate_fp8_scaling
from ampviz.formats.inputs import _describe
from ampviz.text import Table

#: Steps per chunk of ``rms_errors`` (a chunk of 64 steps of 4,096 values: about 2 MB per array).
_STEPS_PER_CHUNK = 64


def rms_errors(stream, trace) -> np.ndarray:
    """Each step's relative RMS error RMS(q - x) / RMS(x) of the FP8 round trip, float64, one per
    step of ``stream`` (a ``TensorStream``) under ``trace`` (its ``simulate_fp8_scaling``).

    x is the step's tensor (float32); q its FP8 round trip as both libraries compute it:
    ``f32(x * scale)`` clamped to ±max and rounded to the nearest FP8 value (ties to even), then
    divided by the scale in float32 (torchao's ``_data.to(float32) / _scale``). The error is summed
    in float64 over every value. NaN on a step whose tensor holds an inf or a NaN, whose scale is
    0 or not finite, or whose values are all 0. Exact: each value goes through the format's
    rounding table (built from the exact cast, ``ampviz.formats.blocks``), a few hundred ms for
    2,000 steps of 4,096 values."""
    if not isinstance(stream, TensorStream):
        raise TypeError(f"stream must be a TensorStream (from tensor_stream(...)), not {_describe(stream)}")
    if not isinstance(trace, Fp8ScalingTrace):
        raise TypeError(f"trace must be an Fp8ScalingTrace (from simulate_fp8_scaling(stream, ...)), "
                        f"not {_describe(trace)}")
    if trace.size != stream.size or not np.array_equal(trace.amax, stream.amax, equal_nan=True):
        raise ValueError("trace must be a run of this stream: simulate_fp8_scaling(stream, ...) gives it")
    table = _element_table(trace.fmt)
    scale = np.asarray(trace.scale, np.float32)
    out = np.full(stream.steps, np.nan)
    ok = (stream.nonfinite == _FINITE) & np.isfinite(scale) & (scale > 0)
    base = stream.base
    for t0 in range(0, stream.steps, _STEPS_PER_CHUNK):
        at = np.flatnonzero(ok[t0:t0 + _STEPS_PER_CHUNK]) + t0
        if not at.size:
            continue
        s = scale[at, None]
        with np.errstate(over="ignore", invalid="ignore"):
            x = (base[None, :] * stream.magnitude[at, None]).astype(np.float32)
            v = (x * s).astype(np.float32)
        index = np.empty(v.size, np.intp)
        _table_index(v.reshape(-1), np.empty(v.size, np.uint32), index)
        q = (table.values.take(index).reshape(v.shape) / s).astype(np.float32)
        x64 = x.astype(np.float64)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            err = np.sqrt(np.sum((q.astype(np.float64) - x64) ** 2, axis=1) / np.sum(x64**2, axis=1))
        out[at] = np.where(np.isfinite(x).all(axis=1), err, np.nan)
    out.flags.writeable = False
    return out


def _percent(share: float, digits: int = 2) -> str:
    return f"{100 * share:.{digits}f}%"


def recipe_table(streams, recipes) -> Table:
    """Recipes side by side on several streams, one row per stream and recipe: the steps that
    saturate, the steps that lose at least 1% of their values to underflow, the share underflowed
    (mean over the steps) and the relative RMS error of the FP8 round trip (``rms_errors``, mean
    over the steps whose values are finite).

    ``streams``: a dict name -> ``TensorStream``; ``recipes``: a dict label -> the keyword
    arguments of ``simulate_fp8_scaling`` (``recipe``, ``history_len``, ``algo``, ``margin``,
    ``fmt`` ...), e.g. ``{"current": {"recipe": "current"}, "delayed": {}}``."""
    for name, arg, what in (("streams", streams, "name -> TensorStream"),
                            ("recipes", recipes, "label -> simulate_fp8_scaling's keyword arguments")):
        if not isinstance(arg, dict) or not arg:
            raise TypeError(f"{name} must be a non-empty dict {what}, not {_describe(arg)}")
    for label, kw in recipes.items():
        if not isinstance(kw, dict):
            raise TypeError(f"recipes[{label!r}] must be a dict of simulate_fp8_scaling's keyword arguments "
                            f"(e.g. {{'recipe': 'current'}}), not {_describe(kw)}")
    rows = []
    for name, stream in streams.items():
        if not isinstance(stream, TensorStream):
            raise TypeError(f"streams[{name!r}] must be a TensorStream (from tensor_stream(...)), "
                            f"not {_describe(stream)}")
        for label, kw in recipes.items():
            trace = simulate_fp8_scaling(stream, **kw)
            errors = rms_errors(stream, trace)
            lossy = int((trace.underflowed_share >= 0.01).sum())
            rows.append((str(name), str(label), f"{trace.saturated_steps:,}", f"{lossy:,}",
                         _percent(float(trace.underflowed_share.mean())),
                         f"{100 * float(np.nanmean(errors)):.3g}%" if np.isfinite(errors).any() else "nan"))
    return Table(("stream", "recipe", "steps saturating", "steps losing ≥ 1%", "mean underflowed",
                  "mean RMS error"), rows,
                 title="RMS error = RMS(fp8 round trip - x) / RMS(x) of each step, as a mean over the steps")
