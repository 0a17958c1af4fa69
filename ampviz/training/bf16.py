"""bf16 in practice: what bf16 makes unnecessary, what it makes possible, and what it costs.

bf16 keeps fp32's 8 exponent bits and only 7 mantissa bits. Every function here measures one
consequence of that with real torch (2.13, CPU) on seeded models and data:

1. **No loss scaler needed** (``scaler_need``): the beam model's gradients (``ampviz.training.beam``) at
   scale 1, cast to fp16 and to bf16 by torch: the share that fp16 flushes to 0 and bf16 keeps, and
   the gradients of real fp16 and bf16 autocast backward passes of the same batch.
2. **No overflow where fp16 overflows** (``overflow_model``, ``fp16_overflow``): a small seeded
   ReLU network without normalisation whose activations grow layer by layer past 65504. Evaluated
   in bf16 it stays finite; cast to fp16, one layer's outputs become inf and the next turns them
   into NaN. The report gives each layer's largest activation in fp32, bf16 and fp16 and the first
   layer where fp16 gives inf and NaN.
3. **Lost updates in bf16 weights, and three fixes** (``lost_update_runs``): plain gradient
   descent on a seeded linear regression, with the weights kept in five ways on the same data and
   the same gradients: fp32 (the reference), bf16 (each update rounded to nearest into the weight:
   updates up to half a bf16 step, 2^-9 to 2^-8 of the weight, are lost and the weights stall far
   from the optimum), bf16 with fp32 master weights, bf16 with a bf16 Kahan compensation buffer
   (``kahan_add_``), and bf16 with stochastic rounding (``stochastic_round_bf16``). Per step:
   the loss, the share of updates a bf16 weight rounding to nearest loses, and the share after
   which the run's stored state did not change at all.
4. **Stochastic rounding** (``stochastic_round_bf16``): add 16 random bits to the low half of the
   fp32 bit pattern and cut them off. ``rounding_statistics`` tests a rounding function
   statistically (unbiased within a bound from the binomial spread, only the two bf16 neighbours,
   exact values unchanged); ``variant_table`` runs it on the real function and on plausible wrong
   ones (``ROUNDINGS``), which fail.

The forward and backward passes of the regression run in float64 from the stored weights, and the
gradient is rounded once to float32: the runs differ only in how the update lands on the weight.

Thread count and CPU: the figures these functions return do not depend on torch's thread count
(``tests/training/test_bf16.py`` compares 1 and 2 threads bit for bit). The random bits come from
``torch.randint`` on a seeded ``torch.Generator``, which draws in order whatever the threads; the
regression's gradient is a float64 matrix-vector product rounded to float32, so another BLAS
kernel could change it only where a float64 rounding error crosses a float32 rounding boundary.
The fp32, fp16 and bf16 passes of the beam and the overflow network use torch's CPU kernels (matrix
products, autocast): their last bits could differ on another CPU or torch build, which was not
measured; the tests hold the figures to this stack's.

Everything is seeded: models are initialised inside ``torch.random.fork_rng`` and data come from
their own ``torch.Generator``, so the caller's random state is left as it was. This module needs
torch; ``ampviz/__init__.py`` does not import it.
"""

from __future__ import annotations

import copy
import math
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ampviz.text import Table, measured, number
from ampviz._args import _shown
from ampviz._args import _real, _real_array, _seed, _whole
from ampviz.training import torch_cast_counts

__all__ = [
    # stochastic rounding
    "stochastic_round_bf16",
    "ROUNDINGS",
    "RoundingCheck",
    "RoundingStats",
    "rounding_statistics",
    "rounding_table",
    "variant_table",
    "DEFAULT_VALUES",
    # 1: no scaler in bf16
    "GradientShare",
    "RunZeros",
    "GRADIENT_SETS",
    "ScalerNeed",
    "scaler_need",
    "scaler_need_table",
    # 2: overflow in fp16
    "overflow_model",
    "OverflowReport",
    "fp16_overflow",
    "overflow_table",
    # 3: lost updates and their fixes
    "kahan_add_",
    "METHODS",
    "UpdateRun",
    "LostUpdateRuns",
    "lost_update_runs",
    "lost_update_table",
    "lost_update_steps_table",
]

BF16_MAX = float(torch.finfo(torch.bfloat16).max)  # 3.3895314e38


# --------------------------------------------------------------------------------------------
# Stochastic rounding
# --------------------------------------------------------------------------------------------


def _float32_tensor(name: str, x) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a float32 tensor (e.g. torch.tensor([1.0]) or t.float()), not {_shown(x)}")
    if x.dtype != torch.float32:
        raise TypeError(f"{name} must be a float32 tensor, not a {str(x.dtype).replace('torch.', '')} tensor "
                        f"(pass {name}.float())")
    if x.layout != torch.strided or x.device.type == "meta" or x.is_quantized:
        raise TypeError(f"{name} must be a dense float32 tensor holding data, not one with layout "
                        f"{str(x.layout).replace('torch.', '')} on {x.device}")
    return x


def _generator(generator, device: torch.device) -> torch.Generator:
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator (e.g. torch.Generator().manual_seed(0)), "
                        f"not {_shown(generator)}")
    if generator.device.type != device.type:
        raise ValueError(f"generator must be on the tensor's device ({device.type}), not on {generator.device}")
    return generator


def stochastic_round_bf16(x, generator) -> torch.Tensor:
    """``x`` (a float32 tensor) rounded to bfloat16 stochastically: each value goes to one of its
    two bf16 neighbours, to the one farther from zero with probability equal to the value's
    distance from the nearer one divided by the gap between them, so the rounding is unbiased: on
    average it returns ``x``.

    How: a bf16 value is an fp32 value whose low 16 bits are 0. Add a random integer from 0 to
    65535 (drawn from ``generator`` with ``torch.randint``) to the fp32 bit pattern and clear the
    low 16 bits: the pattern carries into bit 16 exactly when the random number is at least 65536
    minus the low bits, that is with probability (low bits) / 65536, the value's position in the
    gap. The pattern holds the magnitude apart from the sign, so negative values round
    symmetrically (away from zero with the same probability); subnormals and the step from one
    binade to the next need nothing special (the patterns keep counting up); the addition never
    reaches the sign bit. Values that are already bf16 (low bits 0), ±0 and ±inf are returned
    unchanged; NaN stays NaN. A finite value beyond bf16's largest (3.3895e38, up to fp32's
    3.4028e38) becomes inf with probability proportional to its distance past it, inf standing
    where 2^128 would be (as in round to nearest, which gives inf from halfway there).

    ``generator``: a ``torch.Generator`` on x's device; one draw per element, in x's row-major
    order. The result has x's shape, is a new tensor and carries no gradient.
    """
    x = _float32_tensor("x", x)
    gen = _generator(generator, x.device)
    x = x.detach().contiguous()
    noise = torch.randint(0, 1 << 16, x.shape, generator=gen, dtype=torch.int32, device=x.device)
    bits = (x.view(torch.int32) + noise) & -65536  # -65536 is 0xFFFF0000 as an int32
    rounded = bits.view(torch.float32).to(torch.bfloat16)  # exact: the low 16 bits are 0
    return torch.where(torch.isnan(x), x.to(torch.bfloat16), rounded)


def _round_to_nearest(x, generator) -> torch.Tensor:
    """A wrong stochastic rounding: torch's round to nearest (ties to even), no randomness."""
    return _float32_tensor("x", x).detach().to(torch.bfloat16)


def _fifteen_bits(x, generator) -> torch.Tensor:
    """A wrong stochastic rounding: 15 random bits instead of 16 (rounds up too rarely)."""
    x = _float32_tensor("x", x).detach().contiguous()
    gen = _generator(generator, x.device)
    noise = torch.randint(0, 1 << 15, x.shape, generator=gen, dtype=torch.int32, device=x.device)
    rounded = ((x.view(torch.int32) + noise) & -65536).view(torch.float32).to(torch.bfloat16)
    return torch.where(torch.isnan(x), x.to(torch.bfloat16), rounded)


def _seventeen_bits(x, generator) -> torch.Tensor:
    """A wrong stochastic rounding: 17 random bits instead of 16 (can carry twice: two steps up,
    and it moves values that are already bf16)."""
    x = _float32_tensor("x", x).detach().contiguous()
    gen = _generator(generator, x.device)
    noise = torch.randint(0, 1 << 17, x.shape, generator=gen, dtype=torch.int32, device=x.device)
    rounded = ((x.view(torch.int32) + noise) & -65536).view(torch.float32).to(torch.bfloat16)
    return torch.where(torch.isfinite(x), rounded, x.to(torch.bfloat16))


def _sign_blind(x, generator) -> torch.Tensor:
    """A wrong stochastic rounding: floating-point arithmetic that takes the step between the
    neighbours as positive, so a negative value's share of the step is negative and it always
    rounds toward zero (right on positive values)."""
    x = _float32_tensor("x", x).detach().contiguous()
    gen = _generator(generator, x.device)
    low = (x.view(torch.int32) & -65536).view(torch.float32)  # truncated toward zero
    step = ((low.view(torch.int32) + 65536).view(torch.float32) - low).abs()
    share = (x.double() - low.double()) / step.double()
    up = torch.rand(x.shape, generator=gen, dtype=torch.float64, device=x.device) < share
    rounded = torch.where(up, low + step, low).to(torch.bfloat16)
    return torch.where(torch.isfinite(x), rounded, x.to(torch.bfloat16))


#: Rounding functions ``rounding_statistics`` and ``variant_table`` test, by name: the real one
#: and four plausible wrong ones (``f(x, generator)``: float32 tensor -> bfloat16 tensor).
ROUNDINGS = {
    "stochastic": stochastic_round_bf16,
    "round to nearest": _round_to_nearest,
    "15 random bits": _fifteen_bits,
    "17 random bits": _seventeen_bits,
    "sign-blind": _sign_blind,
}

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


def _stats(name: str, value, kind):
    if not isinstance(value, kind):
        article = "an" if kind.__name__[0] in "AEIOU" else "a"
        raise TypeError(f"{name} must be {article} {kind.__name__} (from {_MAKER[kind]}), not {_shown(value)}")
    return value


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


# --------------------------------------------------------------------------------------------
# 1. When bf16 needs no loss scaler and fp16 does
# --------------------------------------------------------------------------------------------

MAX_BEAM_BATCH = 4096


@dataclass(frozen=True)
class GradientShare:
    """What torch's cast of ``values`` fp32 gradients (times ``scale``) to ``dtype`` does:
    ``underflow`` nonzero gradients become 0, ``subnormal`` land among the format's subnormals,
    ``overflow`` become inf (counts from ``ampviz.training.torch_cast_counts``)."""

    gradients: str
    dtype: str
    scale: float
    values: int
    underflow: int
    subnormal: int
    overflow: int

    @property
    def lost(self) -> float:
        """The share of the gradients that become 0."""
        return self.underflow / self.values if self.values else 0.0


@dataclass(frozen=True)
class RunZeros:
    """One set of ``gradients`` ("parameters" or "layer outputs": the gradients of the Linear
    layers' outputs) of one real backward pass (``autocast``: None for fp32, "float16" or
    "bfloat16"): how many are exactly 0, and the smallest nonzero |gradient| (0 if all are 0)."""

    gradients: str
    autocast: str | None
    values: int
    zeros: int
    smallest: float

    @property
    def label(self) -> str:
        return {None: "fp32", "float16": "fp16 autocast", "bfloat16": "bf16 autocast"}[self.autocast]

    @property
    def share(self) -> float:
        """The share of the gradients that are exactly 0."""
        return self.zeros / self.values if self.values else 0.0


GRADIENT_SETS = ("parameters", "layer outputs")
_DTYPE_LABELS = {"float16": "fp16", "bfloat16": "bf16"}


@dataclass(frozen=True)
class ScalerNeed:
    """``scaler_need``'s measurements: ``casts`` (``GradientShare`` per gradient set, dtype and
    scale) and ``runs`` (``RunZeros`` per gradient set of an fp32, an fp16 autocast and a bf16
    autocast backward pass); ``loss``: the fp32 pass's loss (m^2)."""

    seed: int
    batch_size: int
    scale: float
    loss: float
    casts: tuple
    runs: tuple

    def share(self, gradients: str = "layer outputs", dtype: str = "float16", scale=1.0) -> float:
        """The share of ``gradients`` ("parameters" or "layer outputs") that the cast to ``dtype``
        ("float16" or "bfloat16") at ``scale`` (1, or this result's scaler scale in float16) loses."""
        if not isinstance(gradients, str) or gradients not in GRADIENT_SETS:
            raise ValueError(f"gradients must be 'parameters' or 'layer outputs', not {_shown(gradients)}")
        if not isinstance(dtype, str) or dtype not in _DTYPE_LABELS:
            raise ValueError(f"dtype must be 'float16' or 'bfloat16', not {_shown(dtype)}")
        scale = _real("scale", scale)
        for c in self.casts:
            if (c.gradients, c.dtype, c.scale) == (gradients, dtype, scale):
                return c.lost
        raise ValueError(f"no cast to {dtype} at scale {number(scale)} was measured: scale 1, or "
                         f"{number(self.scale)} with float16")

    def zeros(self, gradients: str = "layer outputs", autocast=None) -> float:
        """The share of ``gradients`` that are exactly 0 in the backward pass under ``autocast``
        (None for fp32, "float16" or "bfloat16")."""
        if not isinstance(gradients, str) or gradients not in GRADIENT_SETS:
            raise ValueError(f"gradients must be 'parameters' or 'layer outputs', not {_shown(gradients)}")
        if not (autocast is None or (isinstance(autocast, str) and autocast in _DTYPE_LABELS)):
            raise ValueError(f"autocast must be None (fp32), 'float16' or 'bfloat16', not {_shown(autocast)}")
        return next(r.share for r in self.runs if (r.gradients, r.autocast) == (gradients, autocast))


def scaler_need(seed: int = 0, *, batch_size: int = 256, scale=2.0**16) -> ScalerNeed:
    """The beam model's gradients at scale 1: what fp16 loses and bf16 keeps (``ampviz.training.beam``).

    One fp32 forward and backward pass of the fresh beam model on its first batch
    (``ampviz.training.beam.gradients(seed)``); its parameter gradients and the gradients of its Linear
    layers' outputs (what an fp16 backward pass carries) are cast by torch to float16 and to
    bfloat16 at scale 1, and to float16 at ``scale`` (GradScaler's initial 2^16 by default), and
    counted. Then the same batch runs forward and backward under fp16 and under bf16 autocast
    (real ``torch.autocast("cpu")``): zeros among those gradients are what each really lost
    (and a few exact cancellations: a bf16 sum of two gradients that round to opposite values).
    """
    from ampviz.training.beam import gradients

    seed = _seed(seed, spare=2)
    batch_size = _whole("batch_size", batch_size, 1, MAX_BEAM_BATCH)
    scale = _real("scale", scale)
    with np.errstate(over="ignore"):  # beyond float32's range: inf, refused below
        s32 = float(np.float32(scale))
    if not (math.isfinite(s32) and s32 > 0):
        raise ValueError(f"scale must be a positive number within float32's range, such as 65536.0, not "
                         f"{_shown(scale)}")
    scale = s32
    g = gradients(seed, batch_size=batch_size)
    passes = {None: g}
    for autocast in ("float16", "bfloat16"):
        passes[autocast] = gradients(seed, batch_size=batch_size, autocast=autocast)
    casts, runs = [], []
    for label in GRADIENT_SETS:
        values = g.weights if label == "parameters" else g.layer_outputs
        for dtype, s in (("float16", 1.0), ("bfloat16", 1.0), ("float16", scale)):
            c = torch_cast_counts(values, s, dtype)
            casts.append(GradientShare(label, dtype, s, int(values.size), c["underflow"], c["subnormal"],
                                       c["overflow"] + c["nan"]))
        for autocast, h in passes.items():
            v = h.weights if label == "parameters" else h.layer_outputs
            nonzero = np.abs(v[v != 0])
            runs.append(RunZeros(label, autocast, int(v.size), int((v == 0).sum()),
                                 float(nonzero.min()) if nonzero.size else 0.0))
    return ScalerNeed(seed, batch_size, scale, g.loss, tuple(casts), tuple(runs))


_MAKER = {}  # filled below: result type -> the function that makes it (for messages)


def scaler_need_table(need) -> Table:
    """One row per gradient set of a ``ScalerNeed`` and per way of holding it: cast from fp32 to
    fp16 and to bf16 at scale 1 and to fp16 at the scaler's scale (how many become 0), then the
    real fp32, fp16 autocast and bf16 autocast backward passes (how many are 0, and the smallest
    nonzero |gradient|, to two digits: the fp32 pass's moves in the third digit with torch's CPU
    kernel set, ``ATEN_CPU_CAPABILITY``)."""
    need = _stats("need", need, ScalerNeed)
    rows = []
    for label in GRADIENT_SETS:
        for c in need.casts:
            if c.gradients == label:
                rows.append((label, f"{c.values:,}", f"fp32 cast to {_DTYPE_LABELS[c.dtype]} at scale "
                             f"{number(c.scale, pow2=True)}", f"{c.underflow:,} ({100 * c.lost:.2f}%) become 0", ""))
        for r in need.runs:
            if r.gradients == label:
                rows.append((label, f"{r.values:,}", f"{r.label} backward pass",
                             f"{r.zeros:,} ({100 * r.share:.2f}%) are 0", number(r.smallest, digits=2)))
    return Table(("gradients", "values", "held as", "zeros", "smallest nonzero |gradient|"), rows,
                 title=f"beam model, seed {need.seed}, batch {need.batch_size}, scale 1 unless said")


# --------------------------------------------------------------------------------------------
# 2. A bf16 model whose activations overflow in fp16
# --------------------------------------------------------------------------------------------

MAX_WIDTH, MAX_DEPTH, MAX_BATCH = 1024, 64, 4096
MAX_WORK = 10**9  # multiply-adds per forward pass


def _overflow_sizes(width, depth, gain, batch=None):
    width = _whole("width", width, 1, MAX_WIDTH)
    depth = _whole("depth", depth, 1, MAX_DEPTH)
    gain = _real("gain", gain)
    if not (math.isfinite(gain) and 0 < gain <= 1e3):
        raise ValueError(f"gain must be a number above 0 and at most 1000 (4.0 makes each layer about 2.8 "
                         f"times larger), not {_shown(gain)}")
    if batch is None:
        return width, depth, gain
    batch = _whole("batch", batch, 1, MAX_BATCH)
    if batch * width * width * (depth + 1) > MAX_WORK:
        raise ValueError(f"batch={batch}, width={width}, depth={depth} make {batch * width * width * (depth + 1):,} "
                         f"multiply-adds per pass; at most {MAX_WORK:,}")
    return width, depth, gain, batch


def overflow_model(seed: int = 0, *, width: int = 64, depth: int = 10, gain=4.0) -> nn.Sequential:
    """A ReLU network without normalisation whose activations grow with depth (float32, seeded).

    ``depth`` blocks fc1, relu1, ..., fcN, reluN of ``nn.Linear(width, width)`` and a last Linear
    ``head`` (width -> 1). Each Linear's weights are drawn from N(0, gain² / width) and its biases
    are 0, as in a network whose weights grew in training: a layer multiplies the size (root mean
    square) of its input by about gain / √2 (the ReLU keeps half of it), 2.8 with the default gain
    of 4, so ten layers take inputs of size 1 past fp16's 65504. Initialised from torch's global
    generator seeded with ``seed`` inside ``torch.random.fork_rng`` (the caller's state is kept).
    """
    seed = _seed(seed)
    width, depth, gain = _overflow_sizes(width, depth, gain)
    layers = OrderedDict()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for i in range(1, depth + 1):
            fc = nn.Linear(width, width)
            layers[f"fc{i}"], layers[f"relu{i}"] = fc, nn.ReLU()
        layers["head"] = nn.Linear(width, 1)
        with torch.no_grad():
            for name, m in layers.items():
                if isinstance(m, nn.Linear):
                    nn.init.normal_(m.weight, 0.0, gain / math.sqrt(width))
                    nn.init.zeros_(m.bias)
    return nn.Sequential(layers)


@dataclass(frozen=True)
class OverflowReport:
    """Per Linear layer (``layers``, in forward order): the largest |output| in an fp32, a bf16
    and an fp16 evaluation (inf where fp16 gave inf; NaN where all were NaN), and how many outputs
    of the fp16 evaluation are inf and NaN; ``first_inf``/``first_nan``: the first layer whose fp16
    outputs hold an inf/a NaN (None if none); ``bf16_finite``: every bf16 output was finite."""

    seed: int
    layers: tuple
    values: tuple
    fp32_max: tuple
    bf16_max: tuple
    fp16_max: tuple
    fp16_inf: tuple
    fp16_nan: tuple
    first_inf: str | None
    first_nan: str | None
    bf16_finite: bool

    @property
    def largest(self) -> float:
        """The largest |activation| of the bf16 evaluation (NaN if every layer gave only NaN)."""
        return max((m for m in self.bf16_max if not math.isnan(m)), default=math.nan)

    @property
    def largest_at(self) -> str:
        return self.layers[self.bf16_max.index(self.largest)] if not math.isnan(self.largest) else self.layers[-1]


def _largest(t: torch.Tensor) -> float:
    a = t.detach().float().abs()
    a = a[~torch.isnan(a)]
    return float(a.max()) if a.numel() else math.nan


def _evaluate(model: nn.Sequential, x: torch.Tensor, dtype: torch.dtype):
    """(name, output) of each Linear layer of a copy of ``model`` in ``dtype`` on ``x`` (cast to it)."""
    m = copy.deepcopy(model).to(dtype)
    h = x.to(dtype)
    out = []
    with torch.no_grad():
        for name, layer in m.named_children():
            h = layer(h)
            if isinstance(layer, nn.Linear):
                out.append((name, h))
    return out


def fp16_overflow(seed: int = 0, *, width: int = 64, depth: int = 10, gain=4.0, batch: int = 64) -> OverflowReport:
    """Evaluate ``overflow_model(seed, ...)`` on a batch of standard normal inputs (a generator
    seeded with ``seed + 1``) three times: in float32, with the model and inputs cast to bfloat16,
    and cast to float16, and report each Linear layer's outputs (``OverflowReport``).

    With the defaults the activations pass 65504 in fc9 and reach about 2.4e5 in fc10: bf16 holds
    them (its range reaches 3.4e38); fp16 turns the values of fc9 past 65520 into inf, and fc10,
    whose sums add inf and -inf, gives NaN.
    """
    seed = _seed(seed, spare=1)
    width, depth, gain, batch = _overflow_sizes(width, depth, gain, batch)
    model = overflow_model(seed, width=width, depth=depth, gain=gain)
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(seed + 1))
    runs = {dt: _evaluate(model, x, dt) for dt in (torch.float32, torch.bfloat16, torch.float16)}
    names = tuple(n for n, _ in runs[torch.float32])
    half = [t for _, t in runs[torch.float16]]
    inf = tuple(int(torch.isinf(t).sum()) for t in half)
    nan = tuple(int(torch.isnan(t).sum()) for t in half)
    first = lambda counts: next((n for n, c in zip(names, counts) if c), None)  # noqa: E731
    return OverflowReport(
        seed=seed, layers=names, values=tuple(t.numel() for t in half),
        fp32_max=tuple(_largest(t) for _, t in runs[torch.float32]),
        bf16_max=tuple(_largest(t) for _, t in runs[torch.bfloat16]),
        fp16_max=tuple(_largest(t) for t in half), fp16_inf=inf, fp16_nan=nan,
        first_inf=first(inf), first_nan=first(nan),
        bf16_finite=all(bool(torch.isfinite(t).all()) for _, t in runs[torch.bfloat16]))


def overflow_table(report) -> Table:
    """One row per Linear layer of an ``OverflowReport``: largest |activation| in fp32, bf16 and
    fp16, and the fp16 outputs that are inf and NaN."""
    report = _stats("report", report, OverflowReport)
    rows = [(name, measured(report.fp32_max[i]), f"{report.bf16_max[i]:.4g}", f"{report.fp16_max[i]:.4g}",
             f"{report.fp16_inf[i]:,} of {report.values[i]:,}", f"{report.fp16_nan[i]:,}")
            for i, name in enumerate(report.layers)]
    return Table(("layer", "largest |output| fp32", "bf16", "fp16", "fp16 inf", "fp16 NaN"), rows,
                 title=f"overflow_model(seed={report.seed}): first inf in fp16 at {report.first_inf or 'none'}, "
                       f"first NaN at {report.first_nan or 'none'}")


# --------------------------------------------------------------------------------------------
# 3. Lost updates in bf16 weights, and three fixes
# --------------------------------------------------------------------------------------------


def kahan_add_(weight, compensation, update):
    """``weight += update`` with Kahan compensation, in place, in the weight's own dtype.

    ``compensation`` (same dtype and shape as ``weight``, zeros at the start) carries what the
    rounding of the weight has not yet absorbed; four torch ops, all in the weight's dtype (torch
    adds bf16 tensors in fp32 and rounds the result into bf16):

        compensation += update          # what should be added now
        before = weight.clone()
        weight += compensation          # rounded: only part of it lands
        compensation += before - weight # keep the part that did not (before - weight is exact)

    An update too small to move the weight on its own stays in the compensation buffer until the
    buffer is large enough to move it. The buffer is bf16 too, so it holds the pending amount to
    8 bits: adding 1e-4 a thousand times to 1.0 leaves the weight at 1.1015625, the bf16 value
    nearest the exact 1.1 (plain bf16 stays at 1.0), and weight + buffer about a third of a bf16
    step above 1.1. ``update``: a tensor that broadcasts to the weight's shape
    (any float dtype; an fp32 update is added to the buffer in fp32 and rounded once) or a number
    (torch first casts it to the buffer's dtype). Runs under ``torch.no_grad()``; returns ``weight``.
    """
    for name, t in (("weight", weight), ("compensation", compensation)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor (e.g. a bfloat16 weight), not {_shown(t)}")
        if t.layout != torch.strided or t.device.type == "meta":
            raise TypeError(f"{name} must be a dense tensor holding data, not one with layout "
                            f"{str(t.layout).replace('torch.', '')} on {t.device}")
    if compensation.dtype != weight.dtype or compensation.shape != weight.shape \
            or compensation.device != weight.device:
        raise ValueError(f"compensation must match the weight's dtype, shape and device ({weight.dtype}, "
                         f"{tuple(weight.shape)}, {weight.device}); start from torch.zeros_like(weight)")
    if weight.numel() and weight.untyped_storage().data_ptr() == compensation.untyped_storage().data_ptr():
        raise ValueError("weight and compensation must be separate tensors (start from torch.zeros_like(weight))")
    if isinstance(update, torch.Tensor):
        if not (update.is_floating_point() or update.dtype in (torch.int8, torch.int16, torch.int32, torch.int64,
                                                                torch.uint8)):
            raise TypeError(f"update must be a real tensor or a number, not a {update.dtype} tensor")
        try:
            same = torch.broadcast_shapes(update.shape, weight.shape) == weight.shape
        except RuntimeError:
            same = False
        if not same or update.device != weight.device or update.layout != torch.strided:
            raise ValueError(f"update must be a dense tensor that broadcasts to the weight's shape "
                             f"{tuple(weight.shape)} on {weight.device}, not shape {tuple(update.shape)} on "
                             f"{update.device}")
    else:
        try:
            update = _real("update", update)
        except TypeError:
            raise TypeError(f"update must be a tensor that broadcasts to the weight's shape, or a number, "
                            f"not {_shown(update)}") from None
    with torch.no_grad():
        # the four ops on copies, written back at the end: a tensor that cannot be written in place
        # (an expanded one, whose elements share memory) is refused with both tensors unchanged
        w, c = weight.clone(), compensation.clone()
        c.add_(update)
        before = w.clone()
        w.add_(c)
        c.add_(before.sub_(w))
        kept = compensation.clone()
        try:
            compensation.copy_(c)
            try:
                weight.copy_(w)
            except RuntimeError:
                compensation.copy_(kept)
                raise
        except RuntimeError as exc:
            raise ValueError(f"cannot update these tensors in place ({str(exc).strip().splitlines()[0]}); "
                             "pass tensors of their own, e.g. t.clone()") from None
    return weight


#: How the runs of ``lost_update_runs`` keep the weights: key -> label.
METHODS = {
    "fp32": "fp32 weights",
    "bf16": "bf16 weights",
    "master": "bf16 + fp32 master weights",
    "kahan": "bf16 + Kahan compensation",
    "stochastic": "bf16 + stochastic rounding",
}

MAX_STEPS = 5000
MAX_FEATURES = 256
MAX_ROWS = 4096
MAX_TRACE = 250_000  # steps x features kept per run
MAX_RUN_WORK = 5 * 10**8  # steps x samples x features


@dataclass(frozen=True, eq=False)
class UpdateRun:
    """One way of keeping the weights (``method``, a key of ``METHODS``), step by step.

    ``weights``: (steps + 1, features) the weights the forward pass used before each step and
    after the last (bf16 values, or fp32 for the "fp32" run), as float64; ``updates``: (steps,
    features) each step's update -lr · gradient (float32); ``loss``: (steps + 1,) the loss at
    ``weights``; ``lost``: (steps,) the share of the step's nonzero updates that a bf16 weight
    rounding to nearest loses, ``(w.float() + u).to(bfloat16) == w`` with w the step's weights in
    bf16 (the ½-ulp rule); ``unchanged``: the share of nonzero updates after which the run's
    stored state was bit for bit what it was before the step (the weights, and the master copy or
    the compensation buffer where the run keeps one). For the bf16 run the two are the same; the
    fixes keep what the weight alone would lose (for stochastic rounding a step that leaves a
    weight unchanged drew "down", and the draws that go up make up for it on average).
    """

    method: str
    weights: np.ndarray
    updates: np.ndarray
    loss: np.ndarray
    lost: np.ndarray
    unchanged: np.ndarray

    @property
    def label(self) -> str:
        return METHODS[self.method]

    @property
    def final_loss(self) -> float:
        return float(self.loss[-1])

    @property
    def final_weights(self) -> np.ndarray:
        return self.weights[-1]


@dataclass(frozen=True, eq=False)
class LostUpdateRuns:
    """``lost_update_runs``'s five runs (``runs``: method key -> ``UpdateRun``) on one problem:
    ``target`` (the weights that generated the data, the optimum), the settings, and
    ``floor_loss``: the loss at the fp32 run's final weights rounded to bf16 (the best any bf16
    weights come to near there)."""

    seed: int
    steps: int
    lr: float
    features: int
    samples: int
    target: np.ndarray
    runs: dict
    floor_loss: float
    floor_distance: float

    def distance(self, method: str) -> float:
        """‖w - w_fp32‖ / ‖w_fp32‖ for the final weights of ``method``'s run and of the fp32 run."""
        if method not in self.runs:
            raise ValueError(f"method must be one of {', '.join(map(repr, self.runs))}, not {_shown(method)}")
        return _relative_distance(self.runs[method].final_weights, self.runs["fp32"].final_weights)

    @property
    def stalled_at(self) -> int | None:
        """The step from which the bf16 run lost every update to the end (None if it never did)."""
        lost = self.runs["bf16"].unchanged
        if lost.size == 0 or lost[-1] < 1:
            return None
        moving = np.flatnonzero(lost < 1)
        return int(moving[-1] + 1) if moving.size else 0


def _relative_distance(w: np.ndarray, ref: np.ndarray) -> float:
    """‖w - ref‖ / ‖ref‖ (‖w - ref‖ where ref is 0); NaN or inf once a run has diverged."""
    with np.errstate(all="ignore"):  # a diverged run's inf - inf is NaN, quietly
        norm = float(np.linalg.norm(ref))
        d = float(np.linalg.norm(w - ref))
        return d / norm if norm else d


def _run_sizes(steps, lr, features, samples):
    steps = _whole("steps", steps, 0, MAX_STEPS)
    lr = _real("lr", lr)
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a positive number such as 0.05, not {_shown(lr)}")
    features = _whole("features", features, 1, MAX_FEATURES)
    samples = _whole("samples", samples, 1, MAX_ROWS)
    if steps * features > MAX_TRACE:
        raise ValueError(f"steps={steps:,} x features={features} is {steps * features:,} weights to keep per run; "
                         f"at most {MAX_TRACE:,}")
    if steps * features * samples > MAX_RUN_WORK:
        raise ValueError(f"steps x samples x features is {steps * features * samples:,}; at most {MAX_RUN_WORK:,}")
    return steps, lr, features, samples


def _problem(seed: int, features: int, samples: int):
    """(X, y, target): standard normal inputs (samples, features), targets y = X @ target, and
    target weights of magnitude 0.5 to 2 with random signs, all float64 from one generator."""
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(samples, features, generator=gen, dtype=torch.float64)
    size = 0.5 + 1.5 * torch.rand(features, generator=gen, dtype=torch.float64)
    sign = torch.where(torch.rand(features, generator=gen, dtype=torch.float64) < 0.5, -1.0, 1.0)
    target = size * sign
    return X, X @ target, target


def _share(mask: torch.Tensor, moving: torch.Tensor) -> float:
    n = int(moving.sum())
    return float((mask & moving).sum()) / n if n else 0.0


def _one_run(method: str, X, y, lr: float, steps: int, seed: int) -> UpdateRun:
    n, d = X.shape
    gen = torch.Generator().manual_seed(seed)
    w32 = torch.zeros(d)  # the fp32 weights, or the master copy
    w = torch.zeros(d, dtype=torch.bfloat16)
    comp = torch.zeros(d, dtype=torch.bfloat16)
    weights = np.empty((steps + 1, d))
    updates = np.empty((steps, d), dtype=np.float32)
    loss = np.empty(steps + 1)
    lost = np.empty(steps)
    unchanged = np.empty(steps)

    def forward_weights():
        return w32 if method == "fp32" else w

    for k in range(steps + 1):
        fw = forward_weights()
        residual = X @ fw.double() - y
        loss[k] = 0.5 * float((residual * residual).mean())
        weights[k] = fw.double().numpy()
        if k == steps:
            break
        u = (X.T @ residual / n).float() * -lr  # the gradient, rounded once to fp32, times -lr in fp32
        updates[k] = u.numpy()
        moving = u != 0
        as_bf16 = fw.to(torch.bfloat16)
        lost[k] = _share((as_bf16.float() + u).to(torch.bfloat16) == as_bf16, moving)
        state = (w32.clone(), w.clone(), comp.clone())
        if method == "fp32":
            w32.add_(u)
        elif method == "bf16":
            w.add_(u)  # torch adds in fp32 and rounds the sum to nearest into bf16
        elif method == "master":
            w32.add_(u)
            w = w32.to(torch.bfloat16)
        elif method == "kahan":
            kahan_add_(w, comp, u)
        else:
            w = stochastic_round_bf16(w.float() + u, gen)
        same = ((w32.view(torch.int32) == state[0].view(torch.int32))
                & (w.view(torch.int16) == state[1].view(torch.int16))
                & (comp.view(torch.int16) == state[2].view(torch.int16)))
        unchanged[k] = _share(same, moving)
    return UpdateRun(method, weights, updates, loss, lost, unchanged)


def lost_update_runs(seed: int = 0, *, steps: int = 400, lr=0.05, features: int = 16, samples: int = 256,
                     methods=tuple(METHODS)) -> LostUpdateRuns:
    """Gradient descent on one seeded linear regression, the weights kept in each of ``methods``.

    The problem: ``samples`` standard normal inputs of ``features`` values, targets ``X @ target``
    with target weights of magnitude 0.5 to 2 (random signs), loss ½ · mean squared error, weights
    starting at 0 (data from a generator seeded with ``seed``). Each step computes the gradient at
    the weights the forward pass uses (in float64, rounded once to float32), and adds the update
    u = -lr · gradient (float32) to the weights as the method says:

    * "fp32": ``w.add_(u)`` on fp32 weights (the reference);
    * "bf16": ``w.add_(u)`` on bf16 weights: torch adds in fp32 and rounds into bf16, so an update
      within half a bf16 step of the weight (2^-9 to 2^-8 of it) is lost;
    * "master": fp32 master weights take the update, the forward pass uses their bf16 copy;
    * "kahan": bf16 weights and a bf16 compensation buffer (``kahan_add_``);
    * "stochastic": ``w = stochastic_round_bf16(w.float() + u, generator)`` with a generator
      seeded with ``seed + 1``.

    With the defaults the fp32 run converges (the loss falls from about 18 to about 1e-11); the
    bf16 run stops moving once every update is lost, far from the optimum; the three fixes come
    near the best bf16 weights can do there. ``methods`` must include "fp32" and "bf16" (the
    reference and the run the fixes are compared with).
    """
    seed = _seed(seed, spare=1)
    steps, lr, features, samples = _run_sizes(steps, lr, features, samples)
    if isinstance(methods, str) or not isinstance(methods, (list, tuple)) \
            or not all(isinstance(m, str) and m in METHODS for m in methods) \
            or not {"fp32", "bf16"} <= set(methods):
        raise ValueError(f"methods must be a list of keys of METHODS ({', '.join(map(repr, METHODS))}) that "
                         f"includes 'fp32' and 'bf16', not {_shown(methods)}")
    X, y, target = _problem(seed, features, samples)
    runs = {m: _one_run(m, X, y, lr, steps, seed + 1) for m in METHODS if m in methods}
    ref = torch.from_numpy(runs["fp32"].final_weights).to(torch.bfloat16).double()
    residual = X @ ref - y
    floor = 0.5 * float((residual * residual).mean())
    return LostUpdateRuns(seed, steps, lr, features, samples, target.numpy(), runs, floor,
                          _relative_distance(ref.numpy(), runs["fp32"].final_weights))


def lost_update_table(result) -> Table:
    """One row per run of a ``LostUpdateRuns``: final loss, distance of the final weights to the
    fp32 run's, the share of all the run's nonzero updates that a bf16 weight rounding to nearest
    would lose (below ½ ulp) and the share after which the run's state did not change (over all
    steps, and at the last step); then the floor row (the fp32 run's final weights rounded to bf16)."""
    result = _stats("result", result, LostUpdateRuns)
    rows = []
    pct = lambda a: f"{100 * float(a):.1f}%"  # noqa: E731
    mean = lambda a: pct(a.mean()) if a.size else "-"  # noqa: E731
    last = lambda a: pct(a[-1]) if a.size else "-"  # noqa: E731
    for key, run in result.runs.items():
        rows.append((run.label, measured(run.final_loss, 3), measured(result.distance(key), 3),
                     mean(run.lost), mean(run.unchanged), last(run.unchanged)))
    rows.append(("fp32 run's weights rounded to bf16", measured(result.floor_loss, 3), measured(result.floor_distance, 3),
                 "", "", ""))
    stalled = result.stalled_at
    return Table(("weights", "final loss", "distance to fp32", "updates below ½ ulp", "state unchanged",
                  "state unchanged (last step)"), rows,
                 title=f"{result.steps:,} steps, lr {number(result.lr)}, {result.features} weights; bf16 stalled "
                       + (f"from step {stalled:,}" if stalled is not None else "never"))


def lost_update_steps_table(result, steps=None) -> Table:
    """The loss of each run of a ``LostUpdateRuns`` at a few ``steps`` (default: 0, 25, 50, the step
    from which the bf16 run stalled, 100, 200 and the last), to three digits: the bf16 run stops
    where every update is lost, the fp32 run and the three fixes go on."""
    result = _stats("result", result, LostUpdateRuns)
    if steps is None:
        steps = sorted({0, 25, 50, 100, 200, result.steps} | ({result.stalled_at} if result.stalled_at else set()))
        steps = [k for k in steps if k <= result.steps]
    elif isinstance(steps, (str, bytes)) or not isinstance(steps, (list, tuple, range)) or not steps:
        raise TypeError(f"steps must be a list of whole numbers from 0 to {result.steps}, not {_shown(steps)}")
    steps = [_whole("steps", k, 0, result.steps) for k in steps]
    stalled = result.stalled_at
    rows = [(run.label, *(measured(run.loss[k], 3) for k in steps)) for run in result.runs.values()]
    return Table(("weights", *(f"step {k:,}" + (" (stall)" if k == stalled else "") for k in steps)), rows,
                 title=f"loss (½ · mean squared error) by step, lr {number(result.lr)}")


_MAKER.update({RoundingStats: "rounding_statistics", ScalerNeed: "scaler_need", OverflowReport: "fp16_overflow",
               LostUpdateRuns: "lost_update_runs"})
