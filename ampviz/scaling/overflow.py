"""The overflow model: ``overflows(scale, grad_max, fmt, loss_dtype)``, whether a step whose largest
unscaled gradient is ``grad_max`` overflows at ``scale``, and the per-gradient thresholds
(``_thresholds``, ``_thresholds32``) that let the simulator compare a scale with one number per
step instead."""

from __future__ import annotations

import numpy as np

from ampviz.formats import FP16, FloatFormat
from ampviz.scaling.inputs import _loss_format, _overflow_format, _real_values


# ------------------------------------------------------------------ overflow model
def overflows(scale, grad_max, fmt: FloatFormat | str = FP16, loss_dtype="float32") -> np.ndarray:
    """Whether a step whose largest unscaled gradient is ``grad_max`` overflows at ``scale``.

    The model of torch's backward into a low-precision (``fmt``) region. Where the loss is float32
    (``loss_dtype="float32"``, the default: autocast runs ``mse_loss``, ``cross_entropy`` and other
    losses in fp32), the scaled gradient is computed in float32 and reaches ``fmt`` as
    ``f16(f32(f32(scale) * f32(g)))``: it overflows when that is inf or NaN, i.e. when the
    float32 product reaches ``fmt.overflow_boundary`` (65520 for fp16). A small gradient at
    scale 2^16 does not overflow. Where the loss itself is in ``fmt`` (``loss_dtype="float16"``:
    a ``.half()`` model, or a loss computed in fp16), the scale is cast to ``fmt`` first:
    ``f16(f16(scale) * f16(g))``, so a scale of 65520 or more overflows whatever the gradients.
    By monotone rounding the largest |g| decides for a whole tensor. Both products are exact in
    float64, so only their roundings matter. ``scale`` and ``grad_max`` are numbers or arrays of
    matching (broadcastable) shapes.
    """
    fmt = _overflow_format(fmt)
    low = _loss_format(loss_dtype, fmt)
    s = _real_values("scale", scale, "a number (the loss scale) or an array of them")
    g = _real_values("grad_max", grad_max, "numbers (the largest |gradient| of each step)")
    try:
        np.broadcast_shapes(s.shape, g.shape)
    except ValueError:
        raise ValueError(f"scale and grad_max must have matching shapes (or one be a single number); "
                         f"got {s.shape} and {g.shape}") from None
    with np.errstate(invalid="ignore", over="ignore"):
        if low:
            qs = np.abs(np.asarray(fmt.quantize(s), dtype=np.float64))
            qg = np.abs(np.asarray(fmt.quantize(g), dtype=np.float64))
            return _overflowing(qs, qg, fmt.overflow_boundary)
        return _overflowing32(np.abs(s.astype(np.float32)).astype(np.float64),
                              np.abs(g.astype(np.float32)).astype(np.float64), fmt.overflow_boundary)


def _overflowing32(s32, g32, boundary: float):
    """The fp32-loss overflow test on float32 magnitudes (held as float64, where their product is
    exact): the product rounded to float32, then compared with the boundary. Called under
    ``np.errstate``."""
    return ~(np.asarray(s32 * g32).astype(np.float32) < boundary)  # NaN (0 * inf) counts as overflow


def _overflowing(qs, qg, boundary: float):
    """The overflow test on magnitudes already cast to the format whose ``overflow_boundary`` is
    given (kept in one place: every path of the simulator uses it or a threshold derived from it).
    Called under ``np.errstate``: 0 * inf and overflow are the point."""
    return ~(qs * qg < boundary)  # NaN (0 * inf, NaN input) counts as overflow


def _ulp_exponent(fmt: FloatFormat, x: np.ndarray) -> np.ndarray:
    """The exponent of one ulp of ``fmt`` at each magnitude x >= 0 (finite)."""
    _, e = np.frexp(x)
    return np.maximum(e - 1, fmt.emin) - fmt.mantissa_bits


def _thresholds(fmt: FloatFormat, qg: np.ndarray, scale64: bool) -> np.ndarray:
    """For gradient magnitudes already cast to ``fmt`` (``qg``, float64): the threshold of each,
    such that a step overflows at scale S exactly when ``not abs(S) < threshold``.

    S is a float32 value, or any float64 with ``scale64``; either is cast to float32 and then to
    ``fmt``, as ``overflows`` casts it. The cast is monotone, so the overflowing scales are those
    from the threshold up: the least S whose cast v has v * qg >= B (B = fmt.overflow_boundary,
    the product exact in float64). v is the least grid value >= B / qg (one grid step up where the
    quotient was rounded down; inf where no finite value overflows; 0 where qg is inf), and the
    threshold the least float32 that the cast rounds to v or above: the midpoint below v, or the
    next float32 where that tie rounds down. For float64 scales, the least float64 that rounds to
    that float32 or above, found the same way.
    """
    B = fmt.overflow_boundary
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        v0 = B / qg
        finite = np.isfinite(v0)
        x = np.where(finite, v0, 0.0)
        e = _ulp_exponent(fmt, x)
        v = np.ldexp(np.ceil(np.ldexp(x, -e)), e)  # the least grid value >= v0
        v = np.where(v * qg < B, v + np.ldexp(1.0, _ulp_exponent(fmt, v)), v)
        v = np.where(finite & (v <= fmt.max), v, np.inf)
        pe = _ulp_exponent(fmt, np.where(np.isinf(v), 0.0, v))
        power = (np.frexp(v)[0] == 0.5) & (v > fmt.smallest_normal)  # the ulp below v is half as big
        mid = np.where(np.isinf(v), B, v - np.ldexp(0.5, pe - power))
        c = mid.astype(np.float32)
        up = np.float32(np.inf)
        c = np.where(c < mid, np.nextafter(c, up), c)
        c = np.where((c == mid) & (_cast_array(fmt, c) < v), np.nextafter(c, up), c)
        thr = np.where(v == 0, 0.0, c.astype(np.float64))
        return _thresholds64(thr) if scale64 else thr


def _thresholds64(thr: np.ndarray) -> np.ndarray:
    """Thresholds on a float32 scale (float32 values, 0 or inf) turned into thresholds on a float64
    scale that is cast to float32 first: the least float64 that rounds to the threshold or above."""
    with np.errstate(over="ignore", invalid="ignore"):
        below = np.nextafter(thr.astype(np.float32), np.float32(0)).astype(np.float64)
        mid = (below + np.where(np.isinf(thr), 2.0**128, thr)) / 2
        thr64 = np.where(mid.astype(np.float32).astype(np.float64) >= thr, mid, np.nextafter(mid, np.inf))
    return np.where(thr == 0, 0.0, thr64)


def _thresholds32(fmt: FloatFormat, a: np.ndarray, scale64: bool) -> np.ndarray:
    """``_thresholds`` for the fp32-loss model: for float32 gradient magnitudes ``a``, the least
    float32 scale S with f32(S * g) >= B (B = fmt.overflow_boundary), so that a step overflows
    exactly when ``not abs(S) < threshold``. B / g is within an ulp of it: of the float32 values
    around it, the least that passes the test itself is taken. A zero gradient overflows only at
    an infinite (or NaN) scale, an infinite one at every scale."""
    B = fmt.overflow_boundary
    g = np.asarray(a, np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        c = np.minimum(B / np.where(g > 0, g, 1.0), float(np.finfo(np.float32).max)).astype(np.float32)
        # B / g is within half a float32 step of B / g's own rounding, and the boundary B lies
        # within half a step of its float32 neighbour: two steps down is below the threshold
        for _ in range(2):
            c = np.nextafter(c, np.float32(0))
        thr = np.full(g.shape, np.inf)
        open_ = np.ones(g.shape, bool)
        for _ in range(6):
            hit = open_ & (_overflowing32(c.astype(np.float64), g, B))
            thr[hit] = c[hit]
            open_ &= ~hit
            if not open_.any():
                break
            c = np.nextafter(c, np.float32(np.inf))
        thr = np.where(np.isinf(g), 0.0, np.where(g == 0, np.inf, thr))
    return _thresholds64(thr) if scale64 else thr


def _cast_array(fmt: FloatFormat, x: np.ndarray) -> np.ndarray:
    """float32 values cast to ``fmt``, as float64."""
    if fmt is FP16:  # numpy's own float32 -> float16 cast rounds exactly as torch's
        return x.astype(np.float16).astype(np.float64)
    return np.asarray(fmt.quantize(x), dtype=np.float64)


_FP16_THRESHOLDS: dict = {}


def _fp16_thresholds(scale64: bool) -> np.ndarray:
    """``_thresholds`` for every fp16 value from +0 to +inf, indexed by its bit pattern."""
    table = _FP16_THRESHOLDS.get(scale64)
    if table is None:
        q = np.arange(0x7C01, dtype=np.uint16).view(np.float16).astype(np.float64)
        table = _FP16_THRESHOLDS[scale64] = _thresholds(FP16, q, scale64)
        table.flags.writeable = False
    return table
