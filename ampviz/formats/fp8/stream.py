"""A stream of tensors under an FP8 scaling recipe: ``tensor_stream`` makes a seeded
``TensorStream`` (one tensor, log-normal, Gaussian or given, times a slow drift in magnitude,
spikes of 2**k, optional inf and NaN steps), and
``simulate_fp8_scaling`` runs delayed or current scaling over it and counts, per step and
exactly, the values that saturate, underflow or land in subnormals (an ``Fp8ScalingTrace``, drawn
by ``ampviz.plots.plot_fp8_scaling``).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from ampviz.formats.catalog import FP8_E4M3
from ampviz.formats.fp8.common import _F32, _choice, _flag, _fp8_format, _readonly, _whole
from ampviz.formats.fp8.current import CONVENTIONS, current_scale
from ampviz.formats.fp8.delayed import DELAYED_CONVENTIONS, simulate_delayed
from ampviz.formats.inputs import _describe
from ampviz.formats.spec import FloatFormat


# ------------------------------------------------------------------ a stream of tensors
#: The recipes ``simulate_fp8_scaling`` runs: Transformer Engine's delayed scaling, or current scaling.
RECIPES = ("delayed", "current")
#: What a non-finite step holds in place of its largest element.
_FINITE, _INF, _NAN = 0, 1, 2


@dataclass(frozen=True)
class TensorStream:
    """A seeded stream of tensors: step ``t`` holds ``f32(base * magnitude[t])``, with the element
    of largest |base| replaced by +inf (``nonfinite[t] == 1``) or NaN (``2``) on a non-finite step.

    ``base`` (float32, ``size`` values: see ``tensor_stream``), ``magnitude``
    (float32 per step: a slow random walk in log2, times ``2**spike_log2`` on the ``spike`` steps),
    ``spike`` (bool per step), ``nonfinite`` (uint8 per step: 0, 1 = inf, 2 = NaN). ``tensor(t)``
    builds one step's tensor; ``amax`` is every step's max |x| (inf or NaN on a non-finite step).
    All arrays are read-only."""

    base: np.ndarray
    magnitude: np.ndarray
    spike: np.ndarray
    nonfinite: np.ndarray

    @property
    def steps(self) -> int:
        return int(self.magnitude.size)

    @property
    def size(self) -> int:
        return int(self.base.size)

    @property
    def sorted_abs(self) -> np.ndarray:
        """|base| sorted ascending (float32; computed once)."""
        cached = self.__dict__.get("_sorted_abs")
        if cached is None:
            cached = _readonly(np.sort(np.abs(self.base)))
            object.__setattr__(self, "_sorted_abs", cached)
        return cached

    @property
    def amax(self) -> np.ndarray:
        """max |x| per step, float32: ``f32(max|base| * magnitude)`` (rounding is monotone), inf or
        NaN on a non-finite step."""
        cached = self.__dict__.get("_amax")
        if cached is None:
            top = self.sorted_abs[-1] if self.size else _F32(0)
            with np.errstate(over="ignore"):
                a = (top * self.magnitude).astype(np.float32)
            a = np.where(self.nonfinite == _INF, np.inf, np.where(self.nonfinite == _NAN, np.nan, a))
            cached = _readonly(a.astype(np.float32))
            object.__setattr__(self, "_amax", cached)
        return cached

    def tensor(self, step) -> np.ndarray:
        """The tensor of step ``step`` (0 to steps - 1), float32, a new writable array."""
        step = _whole("step", step, 0, self.steps - 1, f"0 to {self.steps - 1}")
        with np.errstate(over="ignore"):
            x = (self.base * self.magnitude[step]).astype(np.float32)
        kind = int(self.nonfinite[step])
        if kind != _FINITE and x.size:
            x[int(np.argmax(np.abs(self.base)))] = np.inf if kind == _INF else np.nan
        return x

    def __repr__(self) -> str:
        return (f"TensorStream({self.steps:,} steps × {self.size:,} values, {int(self.spike.sum())} spikes, "
                f"{int((self.nonfinite == _INF).sum())} inf and {int((self.nonfinite == _NAN).sum())} NaN steps)")


def _real_arg(name: str, value, low: float, high: float, hint: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number ({hint}), not {_describe(value)}")
    v = float(value)
    if not low <= v <= high:
        raise ValueError(f"{name} must be a number from {low:g} to {high:g} ({hint}), not {v!r}")
    return v


#: The tensors ``tensor_stream`` draws (``base=``): log2 |x| ~ N(0, spread²), or x ~ N(0, 1).
BASES = ("lognormal", "normal")


def _given_base(base, size):
    """A tensor given as ``tensor_stream``'s base: its values as float32, flattened, checked."""
    from ampviz.formats.inputs import _real_array

    arr = _real_array(base, "base")
    if arr.dtype.kind == "b":
        raise TypeError("base must be numbers (a tensor's values), not booleans")
    with np.errstate(over="ignore", invalid="ignore"):
        values = arr.astype(np.float32).ravel()
    if not 1 <= values.size <= 10**6:
        raise ValueError(f"base must hold 1 to 1,000,000 values, got {values.size:,}")
    if not np.isfinite(values).all():
        raise ValueError("base must hold finite numbers (in float32): inf and NaN steps are inf_prob's and nan_prob's")
    if not values.any():
        raise ValueError("base is all zeros: a stream of zeros has no amax to scale by; pass a tensor with a "
                         "nonzero value")
    if size is not None and _whole("size", size, 1, 10**6, "values per tensor") != values.size:
        raise ValueError(f"size ({size:,}) must be the number of values in base ({values.size:,}), or left out")
    return values


def tensor_stream(steps=2000, size=None, *, seed=0, base="lognormal", spread=3.0, wander=0.02, spike_log2=8,
                  spike_prob=0.004, inf_prob=0.0, nan_prob=0.0) -> TensorStream:
    """A seeded ``TensorStream`` of ``steps`` tensors of ``size`` values each (4,096 unless told).

    ``base``: the tensor every step scales. ``"lognormal"`` (the default): random signs, log2 of
    the magnitudes ~ N(0, ``spread``²), a tensor much wider than most (spread 3: 21.5 binades
    at 4,096 values). ``"normal"``: N(0, 1) values (about 14 binades at 4,096 values). Or the values
    of a real tensor (an array, e.g. a layer's weights or gradient; ``size`` is its number of
    values), flattened and rounded to float32.

    From ``np.random.default_rng(seed)``, always in this order (so that changing one setting moves
    nothing else, and three streams of one size and seed share their drift and spikes whatever
    their base): ``size`` standard normal draws z and ``size`` uniform ones for the signs (the base
    is sign · 2**(``spread`` · z), sign · |z|, or the given values), the walk's steps ~ N(0,
    ``wander``²) in log2 (the magnitude drifts slowly), the spike steps (each step with probability
    ``spike_prob``: the whole tensor times ``2**spike_log2``), then the non-finite steps
    (probability ``inf_prob`` of an inf, ``nan_prob`` of a NaN, in place of the largest
    element)."""
    steps = _whole("steps", steps, 1, 10**6, "how many tensors, e.g. 2000")
    if isinstance(base, str):
        if base not in BASES:
            raise ValueError(f"base must be one of {', '.join(map(repr, BASES))} or a tensor's values, not {base!r}")
        given = None
        size = 4096 if size is None else _whole("size", size, 1, 10**6, "values per tensor, e.g. 4096")
    else:
        given = _given_base(base, size)
        size = int(given.size)
    seed = _whole("seed", seed, 0, 2**63 - 1, "any whole number >= 0")
    spread = _real_arg("spread", spread, 0.0, 8.0, "the spread of log2 |value| within a tensor")
    wander = _real_arg("wander", wander, 0.0, 1.0, "the step-to-step drift of log2 magnitude")
    spike_log2 = _whole("spike_log2", spike_log2, 0, 40, "a spike multiplies the tensor by 2**spike_log2")
    spike_prob = _real_arg("spike_prob", spike_prob, 0.0, 1.0, "the chance of a spike per step")
    inf_prob = _real_arg("inf_prob", inf_prob, 0.0, 1.0, "the chance of an inf step")
    nan_prob = _real_arg("nan_prob", nan_prob, 0.0, 1.0, "the chance of a NaN step")
    if inf_prob + nan_prob > 1:
        raise ValueError(f"inf_prob + nan_prob must be at most 1, not {inf_prob + nan_prob!r}")
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 1.0, size)
    signs = np.where(rng.random(size) < 0.5, -1.0, 1.0)
    walk = np.cumsum(rng.normal(0.0, 1.0, steps) * wander)
    spike = rng.random(steps) < spike_prob
    u = rng.random(steps)
    if given is not None:
        base = given
    elif base == "normal":
        base = (signs * np.abs(z)).astype(np.float32)
    else:
        base = (signs * np.exp2(z * spread)).astype(np.float32)
    magnitude = np.exp2(walk + spike_log2 * spike).astype(np.float32)
    nonfinite = np.where(u < inf_prob, _INF, np.where(u < inf_prob + nan_prob, _NAN, _FINITE)).astype(np.uint8)
    return TensorStream(_readonly(base), _readonly(magnitude), _readonly(spike), _readonly(nonfinite))


@dataclass(frozen=True)
class Fp8ScalingTrace:
    """How a ``TensorStream`` lands in an FP8 format, step by step, under a scaling recipe.

    ``recipe`` ("delayed" or "current") and ``settings`` (the recipe's arguments as a dict),
    ``fmt``, ``size`` (values per step); per step: ``amax`` (float32), ``scale`` (the scale in
    force, float32), ``frozen`` (bool: delayed scaling's update after the step kept the scale, as
    ``DelayedTrace.frozen``; all False for current scaling), and counts (int64) of the step's values:

    * ``saturated``: |f32(x * scale)| lies past ``fmt.overflow_boundary`` (max plus half a step at
      max: beyond 464 for E4M3, from 61440 on for E5M2; an inf x too, at a scale > 0), where rounding
      alone would give inf or NaN: the clamp to ±max that Transformer Engine and torchao apply before
      the cast holds it at ±max. (A value between max and the boundary rounds to max anyway, as does
      an amax that a current scale rounded up puts one ulp past max: the same rule as
      ``DelayedTrace.saturated``.)
    * ``underflowed``: x != 0 whose FP8 value is 0 (|x * scale| at most half the smallest subnormal);
    * ``subnormal``: FP8 value nonzero and below ``fmt.smallest_normal`` (fewer significant bits).

    NaN elements, and the NaNs a scale of 0 or NaN makes, count in none of them. The
    ``*_share`` properties are the counts over ``size``."""

    recipe: str
    settings: dict
    fmt: FloatFormat
    size: int
    amax: np.ndarray
    scale: np.ndarray
    frozen: np.ndarray
    saturated: np.ndarray
    underflowed: np.ndarray
    subnormal: np.ndarray

    @property
    def steps(self) -> int:
        return int(self.amax.size)

    @property
    def saturated_share(self) -> np.ndarray:
        return self.saturated / self.size

    @property
    def underflowed_share(self) -> np.ndarray:
        return self.underflowed / self.size

    @property
    def subnormal_share(self) -> np.ndarray:
        return self.subnormal / self.size

    @property
    def saturated_steps(self) -> int:
        """How many steps hold at least one saturated value."""
        return int((self.saturated > 0).sum())

    @property
    def worst_step(self) -> int:
        """The first step that loses the most values (saturated + underflowed)."""
        return int(np.argmax(self.saturated + self.underflowed)) if self.steps else 0

    def summary(self) -> str:
        """One line: the steps that saturate, the steps that lose at least 1% of their values to
        underflow, and the mean share underflowed."""
        lossy = int((self.underflowed_share >= 0.01).sum())
        mean = float(self.underflowed_share.mean()) if self.steps else 0.0
        return (f"{self.saturated_steps:>5,} steps saturate · {lossy:>5,} steps lose ≥ 1% to underflow · "
                f"mean underflowed {mean:6.2%}")

    def table(self, steps) -> str:
        """The given steps as a text table: amax, scale in force, and the counts."""
        idx = [_whole("step", int(t) if isinstance(t, np.integer) else t, 0, self.steps - 1,
                      f"0 to {self.steps - 1}") for t in steps]
        rows = [f"{'step':>6} {'amax':>10} {'scale':>10} {'saturated':>10} {'underflowed':>12} {'subnormal':>10}"]
        for t in idx:
            rows.append(f"{t:>6} {float(self.amax[t]):>10.4g} {float(self.scale[t]):>10.4g} "
                        f"{int(self.saturated[t]):>10,} {int(self.underflowed[t]):>12,} {int(self.subnormal[t]):>10,}")
        return "\n".join(rows)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.settings.items())
        return (f"Fp8ScalingTrace({self.recipe}, {args}, {self.steps:,} steps × {self.size:,} values: "
                f"{self.saturated_steps:,} steps saturate, mean underflowed {self.underflowed_share.mean():.2%})")


def _first_true(sorted_abs: np.ndarray, count: np.ndarray, test) -> np.ndarray:
    """Per step, the first index i < count[step] of ``sorted_abs`` where ``test(values, steps)``
    holds (``count[step]`` where it never does), for a test that is False then True along the
    sorted values: a binary search on every step at once, evaluating the test itself."""
    lo = np.zeros(count.size, np.int64)
    hi = count.astype(np.int64).copy()
    top = max(sorted_abs.size - 1, 0)
    while True:
        active = np.flatnonzero(lo < hi)
        if not active.size:
            return lo
        mid = (lo[active] + hi[active]) // 2
        ok = test(sorted_abs[np.minimum(mid, top)], active)
        hi[active] = np.where(ok, mid, hi[active])
        lo[active] = np.where(ok, lo[active], mid + 1)


def _stream_counts(stream: TensorStream, scale: np.ndarray, f: FloatFormat):
    """(saturated, underflowed, subnormal) counts per step, exactly, from the sorted |base|."""
    b = stream.sorted_abs
    m = stream.magnitude
    s = np.asarray(scale, np.float32)
    bad = stream.nonfinite != _FINITE
    n = np.where(bad, stream.size - 1, stream.size).astype(np.int64)  # the largest element is special
    big, ub = _F32(f.overflow_boundary), _F32(f.underflow_boundary)
    fn = f.specials == "fn"  # E4M3: past 464 overflows (464 ties to 448); E5M2: from 61440 on
    top_sub = _F32(f.smallest_normal - f.smallest_subnormal / 2)  # from here on, the cast rounds up to normal

    def scaled(v, at):
        with np.errstate(over="ignore", invalid="ignore"):
            return np.abs((v * m[at]).astype(np.float32) * s[at]).astype(np.float32)

    with np.errstate(invalid="ignore"):
        zero_x = _first_true(b, n, lambda v, at: (v * m[at]).astype(np.float32) > 0)
        zero_q = _first_true(b, n, lambda v, at: ~(scaled(v, at) <= ub))  # q == 0 below this index
        below_normal = _first_true(b, n, lambda v, at: ~(scaled(v, at) < top_sub))
        over = n - _first_true(b, n, lambda v, at: (scaled(v, at) > big) if fn else (scaled(v, at) >= big))
    inf_sat = (stream.nonfinite == _INF) & (s > 0)  # inf * scale: inf, clamped to max (0 or NaN: NaN)
    saturated = over + inf_sat
    underflowed = np.maximum(zero_q - zero_x, 0)
    subnormal = np.maximum(below_normal - zero_q, 0)
    return saturated.astype(np.int64), underflowed.astype(np.int64), subnormal.astype(np.int64)


def simulate_fp8_scaling(stream, recipe="delayed", *, margin=0, history_len=1024, algo="max", fmt=FP8_E4M3,
                         round_to_power_of_2=False, convention=None) -> Fp8ScalingTrace:
    """Quantize every tensor of ``stream`` (a ``TensorStream``) to ``fmt`` at the scale a recipe puts
    in force, and count per step what saturates, underflows and lands in subnormals.

    ``recipe="delayed"``: the scales of ``simulate_delayed(stream.amax, margin, history_len, algo,
    fmt, convention=convention or "python")`` (each step's scale comes from earlier steps' amaxes).
    ``recipe="current"``: ``current_scale(stream.amax, fmt, round_to_power_of_2, convention or
    "torchao")`` (each step's own amax). Each value is then cast as both libraries cast it:
    ``f32(x * scale)`` clamped to ±max, rounded to the nearest FP8 value (ties to even). The counts
    are exact: a binary search per step over the sorted |base| evaluates that arithmetic itself
    (it is monotone in |base|), so a few thousand steps of a few thousand values take milliseconds.
    """
    if not isinstance(stream, TensorStream):
        raise TypeError(f"stream must be a TensorStream (from tensor_stream(...)), not {_describe(stream)}")
    recipe = _choice("recipe", recipe, RECIPES)
    f = _fp8_format(fmt)
    if recipe == "delayed":
        if round_to_power_of_2 is not False:
            raise ValueError("round_to_power_of_2 applies to current scaling only: leave it False for 'delayed'")
        conv = "python" if convention is None else _choice("convention", convention, DELAYED_CONVENTIONS)
        d = simulate_delayed(stream.amax, margin=margin, history_len=history_len, algo=algo, fmt=f, convention=conv)
        scale, frozen = d.scale, d.frozen
        settings = {"margin": d.scaler.margin, "history_len": d.scaler.history_len, "algo": algo, "convention": conv}
    else:
        pow2 = _flag("round_to_power_of_2", round_to_power_of_2)
        conv = "torchao" if convention is None else _choice("convention", convention, CONVENTIONS)
        scale = np.asarray(current_scale(stream.amax, f, pow2, conv), np.float32)
        frozen = np.zeros(stream.steps, bool)
        settings = {"round_to_power_of_2": pow2, "convention": conv}
    sat, under, sub = _stream_counts(stream, scale, f)
    return Fp8ScalingTrace(recipe, settings, f, stream.size, stream.amax, _readonly(scale), _readonly(frozen),
                           _readonly(sat), _readonly(under), _readonly(sub))
