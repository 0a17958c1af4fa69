"""Stochastic rounding: ``stochastic_round`` rounds each value to one of its two neighbours in a
format at random, with the probabilities that keep the mean exact (as NVFP4 training rounds
gradients); the block quantizers use it when given ``rng``.
"""

from __future__ import annotations

import numpy as np

from ampviz.formats.catalog import E8M0, get_format
from ampviz.formats.inputs import _describe, _real_array, _scalar_or_array


def _generator(rng, fn: str):
    if rng is None or isinstance(rng, np.random.Generator):
        return rng
    raise TypeError(f"{fn}: rng must be a numpy Generator (np.random.default_rng(seed)) or None, got {_describe(rng)}")


# ---------------------------------------------------------------- stochastic rounding
def stochastic_round(x, fmt, rng) -> np.ndarray:
    """x rounded to one of its two neighbours in ``fmt`` at random, so that the mean is x.

    Each float32 value v between grid neighbours lo < v < hi becomes hi with probability
    (v - lo) / (hi - lo), else lo (one uniform draw from ``rng`` per value; values on the grid stay).
    Values beyond ±max saturate to ±max (as the hardware's ``cvt.rs.satfinite``), so the rounding
    is unbiased within the range only; NaN stays NaN. Returns float64 values of ``fmt``.
    ``fmt``: any format with a sign (not E8M0), or its name.
    """
    fmt = get_format(fmt)
    if fmt is E8M0 or fmt.specials == "fnu":
        raise ValueError("stochastic_round needs a signed element format (fp8, fp6, fp4, ...), not e8m0")
    rng = _generator(rng, "stochastic_round")
    if rng is None:
        raise TypeError("stochastic_round: pass rng=np.random.default_rng(seed)")
    arr = _real_array(x, "stochastic_round: x")
    with np.errstate(over="ignore", invalid="ignore"):
        v = arr.astype(np.float32).astype(np.float64)
    a = np.abs(v)
    top = fmt.max
    inside = np.isfinite(a) & (a < top)
    a_in = np.where(inside, a, 0.0)
    e = np.maximum(np.frexp(a_in)[1] - 1, fmt.emin) - fmt.mantissa_bits  # exponent of one ulp at a
    ulp = np.ldexp(1.0, e)
    lo = np.floor(a_in / ulp) * ulp  # exact: a power-of-two division
    p = (a_in - lo) / ulp
    u = rng.random(np.shape(v))
    q = np.where(u < p, lo + ulp, lo)
    q = np.where(inside, q, np.where(np.isnan(a), np.nan, top))
    return _scalar_or_array(np.copysign(q, v))
