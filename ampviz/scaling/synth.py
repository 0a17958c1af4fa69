"""Seeded gradient and overflow streams that drive loss-scaler simulations.

A loss scaler sees one thing per step: did the scaled gradients overflow? These streams supply that
input in one of two forms:

* ``grad_max``: a float32 array with, for each step, the largest |gradient| before scaling. A step
  overflows in fp16 at scale ``S`` when ``fp16(fp32(S * grad_max))`` is inf or NaN (a float32
  loss, as autocast computes it), or ``fp16(fp16(S) * fp16(grad_max))`` (a loss computed in
  fp16); ``overflows_at`` applies either rule exactly.
* ``found_inf``: a bool array saying directly which steps overflowed (``found_inf_every``,
  ``found_inf_random``), for patterns that are easier to state than to produce from gradients.

The ``grad_max`` streams are log-normal: ``log2`` of each value is ``log2(level)`` plus ``jitter``
times a standard normal draw, so ``jitter`` is measured in binades (powers of two). With
``jitter=0.5`` about one step in three lies more than half a binade (a factor of 1.41) from the
level. Scenarios change the level over time (``drift``, ``warmup``) or lift chosen steps by
``height``: ``spikes`` lifts single steps, ``bursts`` lifts runs of consecutive steps.

Any value of 65520 or more (fp16's max, 65504, plus half an ulp) overflows at every scale of 1
or more; with an fp16 loss it is inf once cast to fp16 and overflows at every scale. Values are
kept between 2**-126 and 2**127 (float32's normal range), so they are always positive and finite.

Randomness comes only from the ``rng`` argument: a ``np.random.Generator`` (as made by
``np.random.default_rng(seed)``) or an int seed. The same seed gives the same stream. There is no
global seed. Every function is vectorised: a million steps take about 20 ms.

``SCENARIOS`` maps a name to a function ``(steps, strength, rng)``, where ``strength`` runs from 0
(mild) to 1 (severe). A widget can then offer a "scenario" menu and a "strength" slider.

This module needs numpy only.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ampviz._args import _shown, _whole
from ampviz.formats import FP16
from ampviz.scaling import overflows

__all__ = [
    "steady",
    "drift",
    "spikes",
    "bursts",
    "warmup",
    "overflows_at",
    "found_inf_every",
    "found_inf_random",
    "SCENARIOS",
    "scenario",
]

_LOG2_MIN, _LOG2_MAX = -126.0, 127.0  # float32's normal range, as powers of two
_PLACEMENTS = ("periodic", "random")


# ------------------------------------------------------------------ argument checks
#: The longest stream made (8 GB of float64): a longer one would not fit in memory.
MAX_STEPS = 10**9


def _steps(value) -> int:
    n = _whole("steps", value, 0)
    if n > MAX_STEPS:
        raise ValueError(f"steps must be at most {MAX_STEPS:,} (a longer stream does not fit in memory), got {n:,}")
    return n


def _number(name: str, value) -> float:
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a number, got {_shown(value)}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number, got {_shown(value)}") from None


def _positive(name: str, value) -> float:
    x = _number(name, value)
    if not (math.isfinite(x) and x > 0):
        raise ValueError(f"{name} must be a positive finite number, got {_shown(value)}")
    return x


def _at_least(name: str, value, minimum: float) -> float:
    x = _number(name, value)
    if not (math.isfinite(x) and x >= minimum):
        raise ValueError(f"{name} must be a finite number >= {minimum:g}, got {_shown(value)}")
    return x


def _fraction(name: str, value) -> float:
    x = _number(name, value)
    if not 0.0 <= x <= 1.0:  # also rejects NaN
        raise ValueError(f"{name} must be between 0 and 1, got {_shown(value)}")
    return x


def _placement(value) -> str:
    if value not in _PLACEMENTS:
        raise ValueError(f"placement must be 'periodic' or 'random', got {_shown(value)}")
    return value


def _generator(rng) -> np.random.Generator:
    """The Generator to draw from: rng itself, or a fresh one seeded with an int rng."""
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, (bool, np.bool_)):
        if rng < 0:
            raise ValueError(f"a seed must be >= 0, got {rng}")
        return np.random.default_rng(int(rng))
    raise TypeError(
        "rng must be a numpy Generator, e.g. np.random.default_rng(0), or an int seed; "
        f"got {_shown(rng)}"
    )


# ------------------------------------------------------------------ building blocks
def _from_log2(log2_level, jitter: float, steps: int, rng: np.random.Generator) -> np.ndarray:
    """log2 of a stream: ``log2_level`` (a number or an array) plus jitter * N(0, 1), as float64."""
    if jitter == 0:
        log2_g = np.empty(steps, np.float64)
        log2_g[:] = log2_level
        return log2_g
    log2_g = rng.standard_normal(steps)  # worked on in place: no temporary arrays
    log2_g *= jitter
    log2_g += log2_level
    return log2_g


def _finish(log2_g: np.ndarray) -> np.ndarray:
    """Clip log2 values to float32's normal range and exponentiate: the final float32 stream."""
    np.clip(log2_g, _LOG2_MIN, _LOG2_MAX, out=log2_g)
    return np.exp2(log2_g).astype(np.float32)


def _event_starts(steps: int, every: int, placement: str, offset: int, rng) -> np.ndarray:
    """Indices where events (spikes or bursts) start.

    "periodic": offset, offset + every, offset + 2 * every, ...
    "random": each step independently with probability 1 / every (so on average one every
    ``every`` steps, at unpredictable times; two may fall close together).
    """
    if placement == "periodic":
        return np.arange(offset, steps, every)
    return np.flatnonzero(rng.random(steps) < 1.0 / every)


# ------------------------------------------------------------------ grad_max streams
def steady(steps, *, level=2.0**-4, jitter=0.5, rng) -> np.ndarray:
    """Gradients that fluctuate around a fixed ``level``. Nothing else happens.

    ``log2(grad_max)`` is normal with mean ``log2(level)`` and standard deviation ``jitter``
    (in binades). With ``jitter=0`` every step equals ``level`` (rounded to float32). A scaler
    fed this stream settles into a sawtooth: it grows until ``scale * grad_max`` overflows on an
    unusually large step, backs off, and grows again.
    """
    steps = _steps(steps)
    level = _positive("level", level)
    jitter = _at_least("jitter", jitter, 0.0)
    rng = _generator(rng)
    return _finish(_from_log2(math.log2(level), jitter, steps, rng))


def drift(steps, *, start=2.0**-2, end=2.0**-8, jitter=0.5, rng) -> np.ndarray:
    """Gradients whose level moves steadily from ``start`` to ``end`` (a straight line in log2).

    The default shrinks by 6 binades over the run, as gradients do once training converges. Small
    gradients need a larger scale to stay clear of fp16's underflow, so the scaler has to keep
    growing to follow them. The level at step ``i`` is
    ``start * (end / start) ** (i / (steps - 1))``, and ``jitter`` works as in ``steady``.
    """
    steps = _steps(steps)
    start = _positive("start", start)
    end = _positive("end", end)
    jitter = _at_least("jitter", jitter, 0.0)
    rng = _generator(rng)
    log2_level = np.linspace(math.log2(start), math.log2(end), steps)
    return _finish(_from_log2(log2_level, jitter, steps, rng))


def spikes(steps, *, level=2.0**-4, jitter=0.5, every=500, height=2.0**8,
           placement="periodic", offset=0, rng) -> np.ndarray:
    """A ``steady`` stream plus a rare spike: one step whose gradient is ``height`` times larger.

    Spikes model batches with a huge gradient, such as a bad sample or a loss spike.

    * ``placement="periodic"``: spikes at steps ``offset, offset + every, offset + 2 * every, ...``
      (as ``found_inf_every``), so ``ceil((steps - offset) / every)`` spikes in all (none if
      ``offset >= steps``).
    * ``placement="random"``: each step spikes independently with probability ``1 / every``,
      about ``steps / every`` spikes in all (``offset`` is ignored).

    If a spike overflows at the current scale and spikes come more often than once per growth
    interval (torch's default is 2000 steps), the scaler backs off more often than it grows. This
    is the "loss scale keeps decreasing" failure. A spike of 65520 or more (for example
    ``level * height`` with ``height=2**24``) overflows at every scale of 1 or more (with an fp16
    loss, at every scale), so the scale falls by half at every spike until it is small enough for
    the spike to fit.
    """
    steps = _steps(steps)
    level = _positive("level", level)
    jitter = _at_least("jitter", jitter, 0.0)
    every = _whole("every", every, 1)
    height = _at_least("height", height, 1.0)
    placement = _placement(placement)
    offset = _whole("offset", offset, 0)
    rng = _generator(rng)
    log2_g = _from_log2(math.log2(level), jitter, steps, rng)
    log2_g[_event_starts(steps, every, placement, offset, rng)] += math.log2(height)
    return _finish(log2_g)


def bursts(steps, *, level=2.0**-4, jitter=0.5, burst_every=1000, burst_length=3,
           height=2.0**8, placement="periodic", offset=0, rng) -> np.ndarray:
    """A ``steady`` stream plus bursts: runs of ``burst_length`` steps, ``height`` times larger.

    Bursts start every ``burst_every`` steps, at the places ``spikes`` would put a single spike
    (``placement`` and ``offset`` work the same way). With random placement two bursts can overlap
    and merge into a longer one.

    Bursts show what hysteresis absorbs. A scaler with hysteresis ``h`` skips ``h - 1`` overflows
    before it backs off. Where hysteresis is refilled on every clean step (apex's fused kernel, as
    NeMo uses it), bursts shorter than ``h`` cost no scale and a longer one backs off once per
    extra step. Where it is refilled only when the scale grows (Megatron, DeepSpeed), the
    allowance is spent once, and after that every overflow backs off.
    """
    steps = _steps(steps)
    level = _positive("level", level)
    jitter = _at_least("jitter", jitter, 0.0)
    burst_every = _whole("burst_every", burst_every, 1)
    burst_length = _whole("burst_length", burst_length, 1)
    if burst_length > burst_every:
        raise ValueError(
            f"burst_length ({burst_length}) must not exceed burst_every ({burst_every}): "
            "bursts would run into each other"
        )
    height = _at_least("height", height, 1.0)
    placement = _placement(placement)
    offset = _whole("offset", offset, 0)
    rng = _generator(rng)
    log2_g = _from_log2(math.log2(level), jitter, steps, rng)
    starts = _event_starts(steps, burst_every, placement, offset, rng)
    # +1 where a burst starts, -1 where it ends; the running sum is > 0 inside any burst.
    edges = (np.bincount(starts, minlength=steps + 1)
             - np.bincount(np.minimum(starts + burst_length, steps), minlength=steps + 1))
    inside = np.cumsum(edges[:steps]) > 0
    log2_g[inside] += math.log2(height)
    return _finish(log2_g)


def warmup(steps, *, start=2.0**6, end=2.0**-4, warmup_steps=500, jitter=0.5, rng) -> np.ndarray:
    """Large gradients at first that shrink during a warm-up, followed by a steady level.

    The level goes from ``start`` to ``end`` in a straight line (in log2) over the first
    ``warmup_steps`` steps, then stays at ``end``. A scaler that starts high (torch: 2**16) skips
    the first steps while it backs off to fit ``start``. Skipping the very first
    ``optimizer.step()`` is what makes torch warn that ``lr_scheduler.step()`` was called before
    ``optimizer.step()``. The scaler then recovers only one doubling per growth interval, so it
    stays far below what the later, smaller gradients would allow. Steps of 65520 or more
    overflow at every scale; if ``start`` is that high, each of them halves the scale, which
    collapses towards 0.
    """
    steps = _steps(steps)
    start = _positive("start", start)
    end = _positive("end", end)
    warmup_steps = _whole("warmup_steps", warmup_steps, 0)
    jitter = _at_least("jitter", jitter, 0.0)
    rng = _generator(rng)
    if warmup_steps == 0:
        done = np.ones(steps)
    else:  # 0 at the first step, 1 from step warmup_steps on
        done = np.minimum(np.arange(steps) / warmup_steps, 1.0)
    log2_level = math.log2(start) + (math.log2(end) - math.log2(start)) * done
    return _finish(_from_log2(log2_level, jitter, steps, rng))


# ------------------------------------------------------------------ found_inf streams
def overflows_at(grad_max, scale, fmt=FP16, loss_dtype="float32") -> np.ndarray:
    """Which steps overflow at a fixed ``scale``: a bool array shaped like ``grad_max``.

    This is the check a loss scaler makes, applied to the largest gradient of each step, with
    the loss scalers' own overflow model (``ampviz.scaling.overflows``). With a float32 loss (the
    default: autocast computes ``mse_loss`` and ``cross_entropy`` in fp32) the scale times the
    gradient is computed in float32 and then cast to ``fmt``: the step overflows when that cast
    is inf or NaN, i.e. when the float32 product reaches ``fmt.overflow_boundary`` (65520 for
    fp16: 65504 plus half an ulp, and that tie rounds to inf). With ``loss_dtype="float16"`` (a
    loss computed in fp16) the scale and the gradient are each cast to fp16 first, as torch
    computes ``torch.tensor(g, dtype=torch.float16) * torch.tensor(scale, dtype=torch.float16)``,
    so a scale of 65520 or more overflows at every step. Either way ``inf * 0`` counts as an
    overflow, and the sign of ``grad_max`` does not matter.

    ``scale`` may also be an array the same length as ``grad_max`` (one scale per step).
    ``fmt`` must be a format with inf (fp16, bf16, fp32, tf32, fp8 E5M2). fp8 E4M3 saturates at
    448 instead of overflowing, so its casts give no inf for a scaler to find.
    """
    g = np.asarray(grad_max)
    if g.dtype.kind not in "fiu":
        raise TypeError(f"grad_max must be numbers, got an array of {g.dtype}")
    s = np.asarray(scale)
    if s.dtype.kind not in "fiu":
        raise TypeError(f"scale must be a number or an array of numbers, got {scale!r}")
    if np.any(np.isnan(s)) or np.any(s <= 0):
        raise ValueError(f"scale must be positive, got {_shown(scale)}")
    return overflows(s, g, fmt, loss_dtype)  # the loss scalers' own overflow model


def found_inf_every(steps, every, offset=0) -> np.ndarray:
    """True at steps ``offset, offset + every, offset + 2 * every, ...``: a clockwork overflow.

    ``found_inf_every(1_000_000, 1000)`` is one overflow per thousand steps, exactly
    ``ceil((steps - offset) / every)`` of them.
    """
    steps = _steps(steps)
    every = _whole("every", every, 1)
    offset = _whole("offset", offset, 0)
    found_inf = np.zeros(steps, bool)
    found_inf[offset::every] = True
    return found_inf


def found_inf_random(steps, rate, rng) -> np.ndarray:
    """Each step overflows independently with probability ``rate`` (between 0 and 1).

    The number of overflows is binomial: about ``rate * steps``, give or take
    ``sqrt(rate * (1 - rate) * steps)``.
    """
    steps = _steps(steps)
    rate = _fraction("rate", rate)
    rng = _generator(rng)
    return rng.random(steps) < rate


# ------------------------------------------------------------------ scenarios for sliders
#: name -> function ``(steps, strength, rng) -> grad_max``, with ``strength`` from 0 (mild) to 1
#: (severe). Each function's docstring says what strength changes.
SCENARIOS: dict = {}


def _scenario(name: str):
    """Register a scenario under ``name``, checking its strength first."""

    def register(fn):
        @functools.wraps(fn)
        def run(steps, strength, rng):
            return fn(steps, _fraction("strength", strength), rng)

        run.__name__ = run.__qualname__ = name
        SCENARIOS[name] = run
        return run

    return register


@_scenario("steady")
def _steady_scenario(steps, strength, rng):
    """Level 2**-4; jitter grows from 0 (a constant) to 2 binades at strength 1."""
    return steady(steps, level=2.0**-4, jitter=2.0 * strength, rng=rng)


@_scenario("drift")
def _drift_scenario(steps, strength, rng):
    """From 2**-2 down by 16 * strength binades over the run (2**-18 at strength 1); jitter 0.5."""
    return drift(steps, start=2.0**-2, end=2.0 ** (-2 - 16 * strength), jitter=0.5, rng=rng)


@_scenario("spikes")
def _spikes_scenario(steps, strength, rng):
    """Level 2**-4, a spike every 500 steps (from step 0), 24 * strength binades high.

    At 0 there are no spikes. At 0.5 a spike reaches 256, which overflows once the scale is 256
    or more. At 1 a spike reaches 2**20, beyond fp16's range: it overflows at every scale above
    about 2**-4 (with an fp16 loss, where it is inf once cast, at every scale).
    """
    return spikes(steps, level=2.0**-4, jitter=0.5, every=500, height=2.0 ** (24 * strength),
                  rng=rng)


@_scenario("bursts")
def _bursts_scenario(steps, strength, rng):
    """Level 2**-4, a burst every 1000 steps (from step 0), each burst step 2**12 higher (256,
    which overflows once the scale is 256 or more). A burst lasts 1 step at strength 0 and grows
    to 8 consecutive steps at strength 1."""
    return bursts(steps, level=2.0**-4, jitter=0.5, burst_every=1000,
                  burst_length=1 + round(7 * strength), height=2.0**12, rng=rng)


@_scenario("warmup")
def _warmup_scenario(steps, strength, rng):
    """Settles at 2**-4 after a 500-step warm-up that starts 20 * strength binades higher.

    At 0 there is no warm-up. At 1 the warm-up starts at 2**16, at fp16's limit: many of the first
    steps are 65520 or more and overflow at every scale of 1 or more.
    """
    return warmup(steps, start=2.0 ** (-4 + 20 * strength), end=2.0**-4, warmup_steps=500,
                  jitter=0.5, rng=rng)


def scenario(name, steps, strength, rng) -> np.ndarray:
    """The ``grad_max`` stream of ``SCENARIOS[name]``, with a clear error for an unknown name."""
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; choose one of {', '.join(SCENARIOS)}")
    return SCENARIOS[name](steps, strength, rng)
