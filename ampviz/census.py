"""How a set of values lands in a float format at a given loss scale.

``census(values, fmt, scale)`` counts, for float32 ``values``, what ``(values * scale)`` becomes when
cast to ``fmt``, exactly as torch computes it: the product is a float32 multiply (torch turns a
Python scale into float32 first), then the cast rounds to nearest even. Categories are those of
``ampviz.formats.CATEGORIES``; "zero" is a value that was zero to begin with, "underflow" a nonzero
value that ends as 0 (in the product or in the cast).

Exact reference path: this module (numpy only).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ampviz.formats import CATEGORIES, FloatFormat, UNDERFLOW, ZERO, get_format

__all__ = ["CensusResult", "Profile", "census", "profile"]


@dataclass(frozen=True)
class CensusResult:
    """Counts of each category, and a log2-magnitude histogram of the scaled values.

    ``log2_bins[i] = e`` counts the finite nonzero scaled values with 2**e <= |v * scale| < 2**(e+1),
    before the cast (so a learner sees where values sit relative to the format's window).
    """

    fmt: FloatFormat
    scale: float
    total: int
    counts: dict
    log2_bins: np.ndarray
    log2_counts: np.ndarray

    @property
    def fractions(self) -> dict:
        n = max(self.total, 1)
        return {k: v / n for k, v in self.counts.items()}

    def __repr__(self) -> str:
        shares = ", ".join(f"{k} {100 * v:.3g}%" for k, v in self.fractions.items() if self.counts[k])
        return f"CensusResult({self.fmt.name}, scale={self.scale:g}, n={self.total}: {shares})"


def _check_scale(scale) -> np.float32:
    try:
        s = float(scale)
    except (TypeError, ValueError):
        raise TypeError(f"scale must be a number, got {scale!r}") from None
    s32 = np.float32(s)
    if not (np.isfinite(s32) and s32 > 0):
        raise ValueError(f"scale must be a positive finite float32 number, got {scale!r}")
    return s32


def _as_float32(values) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype != np.float32:
        if arr.dtype.kind not in "fiub":
            raise TypeError(f"values must be numbers, got an array of {arr.dtype}")
        with np.errstate(over="ignore"):
            arr = arr.astype(np.float32)
    return arr.ravel()


def census_reference(values, fmt, scale=1.0) -> CensusResult:
    """Census by brute force: multiply in float32, classify every value. Exact, not fast."""
    fmt = get_format(fmt)
    s32 = _check_scale(scale)
    v = _as_float32(values)
    with np.errstate(over="ignore", under="ignore"):
        p = v * s32
    codes = fmt.classify_codes(p)
    codes[(p == 0) & (v != 0)] = UNDERFLOW
    codes[v == 0] = ZERO
    counts = np.bincount(codes, minlength=len(CATEGORIES))
    finite = np.isfinite(p) & (p != 0)
    _, e = np.frexp(p[finite])
    bins, hist = np.unique(e.astype(np.int64) - 1, return_counts=True)
    return CensusResult(
        fmt=fmt,
        scale=float(s32),
        total=int(v.size),
        counts={k: int(c) for k, c in zip(CATEGORIES, counts)},
        log2_bins=bins,
        log2_counts=hist.astype(np.int64),
    )


@dataclass(frozen=True)
class Profile:
    """Values prepared once so a slider can re-ask them at another scale or format quickly."""

    values: np.ndarray


def profile(values) -> Profile:
    return Profile(values=_as_float32(values))


def census(values, fmt, scale=1.0) -> CensusResult:
    """Census of ``values`` (an array or a ``Profile``) cast to ``fmt`` after multiplying by ``scale``."""
    if isinstance(values, Profile):
        values = values.values
    return census_reference(values, fmt, scale)
