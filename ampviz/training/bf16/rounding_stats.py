"""A statistical test of a rounding function to bf16.

``rounding_statistics`` rounds each value many times (seeded) and checks that only the value's two
bf16 neighbours come out, that the mean is the value within a bound from the binomial spread, and
that exact values stay unchanged (``RoundingCheck`` per value, ``RoundingStats`` overall);
``rounding_table`` prints one verdict, ``variant_table`` runs the test on every rounding of
``ROUNDINGS`` (the real one passes, the wrong ones fail).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ampviz.text import Table, measured, number
from ampviz._args import _shown
from ampviz._args import _real, _real_array, _seed, _whole
from ampviz.training.bf16.arguments import BF16_MAX, _MAKER, _stats
from ampviz.training.bf16.rounding import ROUNDINGS

#: Values the statistical test uses by default: a quarter, a half and three quarters of the way
#: between two bf16 neighbours (1 + 2^-8 is the tie of round to nearest), 2^-16 of the way, the same
#: positions below zero, just below a power of two (the upper neighbour is in the next binade), a
#: subnormal, 0.1, a value near bf16's largest, and an exact value (3).
DEFAULT_VALUES = (1 + 2.0**-9, 1 + 2.0**-8, 1 + 3 * 2.0**-9, 1 + 2.0**-23, -(1 + 2.0**-9), -(3 + 3 * 2.0**-8),
                  2 - 2.0**-9, 1e-40, 0.1, 3.3e38, 3.0)

MAX_DRAWS = 10**6
MAX_SAMPLES = 10**7  # values x draws
MAX_VALUES = 256


@dataclass(frozen=True)
class RoundingCheck:
    """One value rounded ``draws`` times. ``lower``/``upper``: its two bf16 neighbours (both the
    value itself if it is a bf16 value); ``expected``: the probability of ``upper`` that unbiased
    rounding has, (value - lower) / (upper - lower); ``share_up``: how often ``upper`` came out;
    ``others``: results that are neither neighbour; ``error``: the average result minus the value
    (float64, summed term by term); ``bound``: how far the average may lie from the value,
    ``sigmas`` binomial standard deviations of it, (upper - lower) · sigmas · sqrt(p (1 - p) / draws)
    for p = ``expected`` (0 for an exact value: every result must be the value)."""

    value: float
    lower: float
    upper: float
    expected: float
    share_up: float
    others: int
    error: float
    bound: float

    @property
    def mean(self) -> float:
        """The average result."""
        return self.value + self.error

    @property
    def neighbours_only(self) -> bool:
        return self.others == 0

    @property
    def unbiased(self) -> bool:
        return abs(self.error) <= self.bound

    @property
    def passed(self) -> bool:
        return self.neighbours_only and self.unbiased


@dataclass(frozen=True)
class RoundingStats:
    """``rounding_statistics``'s verdict on one rounding function: one ``RoundingCheck`` per value."""

    rounding: str
    draws: int
    sigmas: float
    seed: int
    checks: tuple

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def worst(self) -> float:
        """The largest |mean - value| / bound over the values (inf when a value that must stay
        exact moved; 0 when every mean is the value)."""
        out = 0.0
        for c in self.checks:
            err = abs(c.error)
            out = max(out, err / c.bound if c.bound > 0 else (math.inf if err > 0 else 0.0))
        return out


def _rounding(rounding):
    """(name, function) from a name in ``ROUNDINGS`` or a function."""
    if isinstance(rounding, str):
        if rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be one of {', '.join(map(repr, ROUNDINGS))} or a function "
                             f"f(x, generator), not {_shown(rounding)}")
        return rounding, ROUNDINGS[rounding]
    if not callable(rounding) or isinstance(rounding, type):
        raise TypeError(f"rounding must be one of {', '.join(map(repr, ROUNDINGS))} or a function "
                        f"f(x, generator) returning a bfloat16 tensor, not {_shown(rounding)}")
    return getattr(rounding, "__name__", "a function"), rounding


def _bf16_neighbours(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(lower, upper) bf16 neighbours of each float32 value, from torch's rounding and nextafter."""
    near = v.to(torch.bfloat16)
    inf = torch.full_like(near, math.inf)
    above = near.float() > v
    below = near.float() < v
    lower = torch.where(above, torch.nextafter(near, -inf), near)
    upper = torch.where(below, torch.nextafter(near, inf), near)
    return lower, upper


def rounding_statistics(values=DEFAULT_VALUES, rounding="stochastic", *, draws: int = 20_000, seed: int = 0,
                        sigmas: float = 5.0) -> RoundingStats:
    """Round each of ``values`` (as float32) ``draws`` times with ``rounding`` and test the results.

    ``rounding``: a name in ``ROUNDINGS`` ("stochastic", "round to nearest", "15 random bits",
    "17 random bits", "sign-blind") or a function ``f(x, generator)`` taking a float32 tensor and
    returning a bfloat16 tensor of its shape. The draws of all values come from one ``torch.Generator`` seeded
    with ``seed``. A rounding passes a value when every result is one of the value's two bf16
    neighbours and the mean result lies within ``sigmas`` binomial standard deviations of the value
    (for unbiased rounding the number of upward results is binomial with p = the value's position
    in the gap). With 5 sigmas a correct rounding fails a value about once in 1.7 million tries
    where draws · p · (1 - p) is large (the normal approximation), and more often for a value very
    near a neighbour, such as 1 + 2^-23, whose count of upward results is nearly Poisson (with
    20,000 draws, about 3 times in 10,000); the draws are seeded, so a verdict does not change from
    run to run. An exact bf16 value must come back unchanged every time. Values must be finite and
    at most bf16's largest in magnitude (beyond it the upper neighbour is inf).
    """
    name, fn = _rounding(rounding)
    draws = _whole("draws", draws, 1, MAX_DRAWS)
    seed = _seed(seed)
    sigmas = _real("sigmas", sigmas)
    if not (math.isfinite(sigmas) and sigmas > 0):
        raise ValueError(f"sigmas must be a positive number such as 5.0, not {_shown(sigmas)}")
    v = torch.from_numpy(_real_array("values", values, "real numbers", np.float32)).reshape(-1)
    if v.numel() == 0 or v.numel() > MAX_VALUES:
        raise ValueError(f"values must be 1 to {MAX_VALUES} numbers, not {v.numel():,}")
    if not bool((v.abs() <= BF16_MAX).all()):  # also refuses inf and NaN
        raise ValueError(f"values must be finite and at most bf16's largest value ({number(BF16_MAX)}) in "
                         "magnitude, once stored in float32")
    if v.numel() * draws > MAX_SAMPLES:
        raise ValueError(f"{v.numel()} values x {draws:,} draws is {v.numel() * draws:,} roundings; at most "
                         f"{MAX_SAMPLES:,} (fewer draws)")
    x = v.repeat_interleave(draws)
    out = fn(x, torch.Generator().manual_seed(seed))
    if not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16 or out.shape != x.shape:
        raise TypeError(f"rounding must return a bfloat16 tensor of its input's shape, not {_shown(out)}")
    out = out.detach().cpu().double().reshape(v.numel(), draws)
    lower, upper = (t.double() for t in _bf16_neighbours(v))
    v64 = v.double()
    gap = upper - lower
    p = torch.where(gap > 0, (v64 - lower) / torch.where(gap > 0, gap, 1.0), 0.0)
    is_up = (out == upper[:, None]) & (gap[:, None] > 0)
    is_low = out == lower[:, None]
    others = (~(is_up | is_low)).sum(1)
    # the mean minus the value, term by term (exact for the two neighbours: no large sums)
    err = (is_up.sum(1) * (upper - v64) + is_low.sum(1) * (lower - v64)
           + torch.where(is_up | is_low, 0.0, out - v64[:, None]).sum(1)) / draws
    bound = sigmas * gap * torch.sqrt(p * (1 - p) / draws)
    checks = tuple(RoundingCheck(float(v[i]), float(lower[i]), float(upper[i]), float(p[i]),
                                 float(is_up[i].sum()) / draws, int(others[i]), float(err[i]), float(bound[i]))
                   for i in range(v.numel()))
    return RoundingStats(name, draws, sigmas, seed, checks)


def rounding_table(stats) -> Table:
    """One row per value of a ``RoundingStats``: its neighbours, the expected and the observed
    share of upward roundings, the mean's distance from the value against the bound, and the verdict."""
    stats = _stats("stats", stats, RoundingStats)
    rows = []
    for c in stats.checks:
        verdict = ("ok" if c.passed else "other values" if not c.neighbours_only else "biased")
        rows.append((number(c.value), number(c.lower), number(c.upper), f"{c.expected:.5f}", f"{c.share_up:.5f}",
                     measured(c.error, 3), measured(c.bound, 3), verdict))
    return Table(("value", "lower", "upper", "P(upper)", "share upper", "mean - value", "bound", "verdict"), rows,
                 title=f"{stats.rounding}: {stats.draws:,} draws per value, bound {number(stats.sigmas)} sigmas")


def variant_table(values=DEFAULT_VALUES, *, draws: int = 20_000, seed: int = 0, sigmas: float = 5.0) -> Table:
    """The statistical test (``rounding_statistics``) on each rounding of ``ROUNDINGS``: how many
    values it passes, the worst |mean - value| in bounds, whether it only ever gives the two
    neighbours, and the verdict. The real stochastic rounding passes; the wrong ones fail."""
    rows = []
    for name in ROUNDINGS:
        s = rounding_statistics(values, name, draws=draws, seed=seed, sigmas=sigmas)
        passed = sum(c.passed for c in s.checks)
        rows.append((name, f"{passed} of {len(s.checks)}", "inf" if math.isinf(s.worst) else f"{s.worst:.2f}",
                     "yes" if all(c.neighbours_only for c in s.checks) else "no",
                     "passes" if s.passed else "fails"))
    return Table(("rounding", "values passed", "worst |mean - value| / bound", "only the two neighbours", "verdict"),
                 rows, title=f"{draws:,} draws per value, bound {number(sigmas)} sigmas")


_MAKER.update({RoundingStats: "rounding_statistics"})
