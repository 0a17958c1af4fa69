"""The scenario streams of ``synth.SCENARIOS`` in a form a browser rebuilds exactly.

Every scenario stream is ``float32(exp2(clip(log2_g)))`` where ``log2_g`` is the seed's standard
normal draws times a jitter, plus a level per step, plus a height at chosen steps (spikes, bursts).
The draws depend only on the seed and the number of steps, so one array of them serves every
scenario and every strength. What a strength changes is a handful of float64 scalars: the
*recipe*. ``recipe(name, strength)`` computes them as ``synth`` does (its ``math.log2`` and
``2.0 ** x``, so no other libm has to agree), and ``rebuild(recipe, normals)`` is the arithmetic
that remains: IEEE sums and products, which JavaScript computes to the same bits, and one
``exp2``.

``exp2`` is the one step another libm may round differently (by an ulp of float64). That changes
the float32 stream only where the float64 power lies within a few ulps of a midpoint between two
float32 values: about one value in 10^8. ``exceptions(recipe, normals)`` lists those steps with
their float32 values, so a page that applies them rebuilds the stream bit for bit whatever its
``Math.pow`` does. ``parts(name, steps, strength, seed)`` bundles all three.

Needs numpy only.
"""

from __future__ import annotations

import math

import numpy as np

from ampviz.scaling import synth
from ampviz._args import _shown

__all__ = ["recipe", "normals", "rebuild", "exceptions", "parts", "MIDPOINT_ULPS"]

#: How near (in float64 ulps of the power) a midpoint between float32 values must be for a step to
#: be shipped as an exception: far more than any libm's error in exp2 (well under 2 ulps).
MIDPOINT_ULPS = 16


def recipe(name: str, strength) -> dict:
    """The scalars of scenario ``name`` at ``strength`` (0 to 1), as ``synth`` computes them.

    ``jitter``: binades per unit of the normal draw; ``level``: ``{"kind": "constant", "a"}``,
    ``{"kind": "line", "a", "b"}`` (numpy's ``linspace`` from a to b) or ``{"kind": "warmup", "a",
    "b", "steps"}`` (a to b over ``steps`` steps, then b); ``events``: None or ``{"every",
    "offset", "length", "log2_height"}`` (periodic runs of ``length`` steps lifted by
    ``log2_height``)."""
    if not isinstance(name, str) or name not in synth.SCENARIOS:
        raise ValueError(f"unknown scenario {_shown(name)}; choose one of {', '.join(synth.SCENARIOS)}")
    s = synth._fraction("strength", strength)
    constant = {"kind": "constant", "a": math.log2(2.0**-4)}
    if name == "steady":
        return {"name": name, "strength": s, "jitter": 2.0 * s, "level": constant, "events": None}
    if name == "drift":
        level = {"kind": "line", "a": math.log2(2.0**-2), "b": math.log2(2.0 ** (-2 - 16 * s))}
        return {"name": name, "strength": s, "jitter": 0.5, "level": level, "events": None}
    if name == "spikes":
        events = {"every": 500, "offset": 0, "length": 1, "log2_height": math.log2(2.0 ** (24 * s))}
        return {"name": name, "strength": s, "jitter": 0.5, "level": constant, "events": events}
    if name == "bursts":
        events = {"every": 1000, "offset": 0, "length": 1 + round(7 * s), "log2_height": math.log2(2.0**12)}
        return {"name": name, "strength": s, "jitter": 0.5, "level": constant, "events": events}
    level = {"kind": "warmup", "a": math.log2(2.0 ** (-4 + 20 * s)), "b": math.log2(2.0**-4), "steps": 500}
    return {"name": name, "strength": s, "jitter": 0.5, "level": level, "events": None}


def normals(steps: int, seed: int) -> np.ndarray:
    """The standard normal draws every scenario of ``steps`` steps starts from, for ``seed``."""
    steps, seed = synth._steps(steps), synth._whole("seed", seed, 0)
    return np.random.default_rng(seed).standard_normal(steps)


def _log2_level(level: dict, steps: int):
    if level["kind"] == "constant":
        return level["a"]
    if level["kind"] == "line":
        return np.linspace(level["a"], level["b"], steps)
    n = level["steps"]
    done = np.ones(steps) if n == 0 else np.minimum(np.arange(steps) / n, 1.0)
    return level["a"] + (level["b"] - level["a"]) * done


def _log2_stream(rec: dict, z: np.ndarray) -> np.ndarray:
    """log2 of the stream, clipped to float32's normal range: everything before the exp2."""
    steps = z.size
    level = _log2_level(rec["level"], steps)
    if rec["jitter"] == 0:
        log2_g = np.empty(steps, np.float64)
        log2_g[:] = level
    else:
        log2_g = z * rec["jitter"]
        log2_g += level
    ev = rec["events"]
    if ev is not None:
        lifted = np.zeros(steps, bool)
        for k in range(ev["length"]):
            lifted[ev["offset"] + k::ev["every"]] = True
        log2_g[lifted] += ev["log2_height"]
    return np.clip(log2_g, synth._LOG2_MIN, synth._LOG2_MAX)


def rebuild(rec: dict, z: np.ndarray) -> np.ndarray:
    """The float32 stream of recipe ``rec`` from the draws ``z``: equal to ``synth.scenario``."""
    return np.exp2(_log2_stream(rec, np.asarray(z, np.float64))).astype(np.float32)


def exceptions(rec: dict, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(steps, float32 values) where ``exp2`` lands within ``MIDPOINT_ULPS`` of a float32 midpoint."""
    y = np.exp2(_log2_stream(rec, np.asarray(z, np.float64)))
    y32 = y.astype(np.float32)
    near = y32.astype(np.float64)
    other = np.where(near <= y, np.nextafter(y32, np.float32(np.inf)),
                     np.nextafter(y32, np.float32(0))).astype(np.float64)
    mid = (near + other) / 2  # exact: two float32 values' sum fits a float64
    close = np.abs(y - mid) <= MIDPOINT_ULPS * np.spacing(y)
    steps = np.flatnonzero(close)
    return steps, y32[steps]


def parts(name: str, steps: int, strength, seed: int = 0) -> dict:
    """Everything a page needs to rebuild ``synth.scenario(name, steps, strength, seed)``."""
    rec = recipe(name, strength)
    z = normals(steps, seed)
    at, values = exceptions(rec, z)
    return {"recipe": rec, "normals": z, "exception_steps": at, "exception_values": values}
