"""How a set of values lands in a float format at a given loss scale.

``census(values, fmt, scale)`` counts, for float32 ``values``, what ``values * scale`` becomes when
cast to ``fmt``, exactly as torch computes ``(torch.from_numpy(values) * scale).to(dtype)``: torch
turns the Python ``scale`` into float32, multiplies in float32 (rounding to nearest even; overflow
gives inf, tiny products become float32 subnormals or 0), then the cast rounds into the format.
"zero" counts values that were zero to begin with; "underflow" nonzero values that end as 0, in the
product or in the cast; "overflow" values that end as inf (or saturate in fp8 E4M3), including inf
inputs. ``values`` may be anything ``ampviz.formats`` reads as numbers: a torch tensor of any
real dtype (bf16, fp16, fp8, needing grad, on a GPU) is counted as torch holds it in float32, and
float64 values are rounded to float32 first; the scale is one number (a tensor too).

How it is fast (numpy only)
---------------------------
Multiplying by a positive scale, rounding and casting are all monotone, so a value's category only
grows with its magnitude: for one (format, scale) pair the categories are five intervals of |v|.
Their edges are found exactly by a binary search over float32 bit patterns, done on scalars with the
same float32 arithmetic torch uses; counting is then a handful of integer comparisons per value.
Values are processed in cache-sized chunks, and one ``bincount`` per chunk yields the category
counts and the log2 histogram together.

A ``Profile`` goes further for sliders: it stores, per float32 exponent, how many mantissas lie
past each of the few cut points where a power-of-two scale can put a category edge (the edges of
fp16, bf16, tf32 and both fp8 formats). Re-asking it at another power of two costs microseconds and
no pass over the data. Where an edge falls elsewhere (a scale that is not a power of two, or bf16,
tf32 and fp32 once the product itself reaches float32's subnormal range) the profile falls back
to the exact pass over its stored values.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np

from ampviz.formats import CATEGORIES, UNDERFLOW, ZERO, FloatFormat, _describe, _real_array, get_format

__all__ = ["CensusResult", "Profile", "census", "census_reference", "profile", "underflow_fractions"]

_CHUNK = 1 << 16
_INF_BITS = 0x7F800000
_MANT_MASK = 0x7FFFFF
# Mantissa cut points (23-bit mantissa >= cut) where a power-of-two scale can put a category edge:
# 1 (an exact power of two is a rounding tie to 0 at the underflow edge), 2**23 - 2**(23-m)
# (rounds up to the smallest normal) and 2**23 - 2**(22-m) (rounds up past max) for m = 2, 3, 7, 10
# mantissa bits, and 0x680001 (just above 464 = max + half an ulp of fp8 E4M3, which saturates).
_CUTS = np.array(sorted({1, 0x680001}
                        | {(1 << 23) - (1 << (23 - m)) for m in (2, 3, 7, 10)}
                        | {(1 << 23) - (1 << (22 - m)) for m in (2, 7, 10)}), dtype=np.uint32)
_CUT_INDEX = {0: 0, **{int(c): i + 1 for i, c in enumerate(_CUTS)}}


@dataclass(frozen=True)
class CensusResult:
    """Counts per category and a log2-magnitude histogram of the scaled values.

    ``log2_counts[i]`` counts the finite nonzero values with
    ``2**log2_bins[i] <= |value| * scale < 2**(log2_bins[i] + 1)`` (the exact product, before any
    rounding), so a learner sees where each value sits relative to the format's window.
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

    def __eq__(self, other) -> bool:
        return (isinstance(other, CensusResult) and self.fmt == other.fmt
                and self.scale == other.scale and self.total == other.total
                and self.counts == other.counts
                and np.array_equal(self.log2_bins, other.log2_bins)
                and np.array_equal(self.log2_counts, other.log2_counts))

    __hash__ = None

    def __repr__(self) -> str:
        shares = ", ".join(f"{k} {100 * v:.3g}%" for k, v in self.fractions.items() if self.counts[k])
        return f"CensusResult({self.fmt.name}, scale={self.scale:g}, n={self.total}: {shares})"


# ------------------------------------------------------------------ inputs
def _check_scale(scale) -> np.float32:
    """The scale as torch takes it: one positive number, rounded to float32."""
    try:
        arr = _real_array(scale, "scale")
    except TypeError:
        raise TypeError(f"scale must be a number, got {_describe(scale)}") from None
    if arr.size != 1:
        raise TypeError(f"scale must be one number, got {arr.size} values (shape {arr.shape}); "
                        "for many scales call census once per scale")
    with np.errstate(over="ignore", invalid="ignore"):
        s32 = np.float32(arr.reshape(()).astype(np.float32))
    if not (np.isfinite(s32) and s32 > 0):
        raise ValueError(f"scale must be a positive number that fits in float32, got {_describe(scale)}")
    return s32


def _as_float32(values) -> np.ndarray:
    """Values as a flat float32 array (float64 values rounded to float32, as torch would hold them;
    torch tensors of any real dtype, device and grad state; bools as 0 and 1)."""
    arr = _real_array(values)
    if arr.dtype != np.float32:
        with np.errstate(over="ignore", invalid="ignore"):
            arr = arr.astype(np.float32)
    return np.ascontiguousarray(arr).ravel()


def _result(fmt, s32, total, above, bins, hist) -> CensusResult:
    """Build a result from counts of |v| at or above each edge: nonzero, subnormal, normal,
    overflow and NaN (as bit patterns)."""
    nonzero, sub, normal, over, nan = (int(c) for c in above)
    counts = {
        "zero": total - nonzero,
        "underflow": nonzero - sub,
        "subnormal": sub - normal,
        "normal": normal - over,
        "overflow": over - nan,
        "nan": nan,
    }
    keep = hist > 0
    return CensusResult(fmt=fmt, scale=float(s32), total=int(total), counts=counts,
                        log2_bins=np.asarray(bins)[keep].astype(np.int64),
                        log2_counts=np.asarray(hist)[keep].astype(np.int64))


# ------------------------------------------------------------------ category edges
def _f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def _edge_finder(fmt: FloatFormat, s32: np.float32):
    """``smallest(level, lo)``: the bit pattern of the smallest |v| >= pattern ``lo`` whose
    product with s32 reaches ``level`` once cast (2 subnormal, 3 normal, 4 overflow), by binary
    search with torch's float32 multiply. (Call under np.errstate: products may overflow.)"""
    ub = fmt.underflow_boundary
    nb = fmt.smallest_normal - fmt.smallest_subnormal / 2  # a tie that rounds up to smallest_normal
    ob = fmt.overflow_boundary
    saturating = fmt.specials == "fn"

    def rank(bits: int) -> int:  # 1 underflow, 2 subnormal, 3 normal, 4 overflow (bits > 0)
        p = float(np.float32(_f32(bits)) * s32)
        if p <= ub:
            return 1
        if p < nb:
            return 2
        if p > ob or (p == ob and not saturating):
            return 4
        return 3

    def smallest(level: int, lo: int = 1) -> int:
        hi = _INF_BITS  # inf always overflows
        while lo < hi:
            mid = (lo + hi) // 2
            if rank(mid) >= level:
                hi = mid
            else:
                lo = mid + 1
        return lo

    return smallest


def _edges(fmt: FloatFormat, s32: np.float32) -> list:
    """Bit patterns of the smallest |v| whose product with s32 is, once cast: nonzero, at least
    subnormal, at least normal, overflowing; then NaN. A list of 5 ints, nondecreasing."""
    smallest = _edge_finder(fmt, s32)
    with np.errstate(over="ignore", under="ignore"):
        sub = smallest(2, 1)
        normal = smallest(3, sub)
        over = smallest(4, normal)
    return [1, sub, normal, over, _INF_BITS + 1]


def _hist_cut(s32: np.float32):
    """For s = 2**k * (1 + g): (k, c) such that a normal v with mantissa field >= c has
    log2|v * s| = exponent(v) + k + 1, else + k (c = 2**23: never)."""
    bits = int(np.float32(s32).view(np.uint32))
    exp, mant = bits >> 23, bits & _MANT_MASK
    if exp == 0:  # a float32-subnormal scale: normalise it
        shift = 24 - mant.bit_length()
        sig, k = mant << shift, -126 - shift
    else:
        sig, k = (1 << 23) | mant, exp - 127
    if sig == 1 << 23:
        return k, 1 << 23
    return k, -(-(1 << 47) // sig) - (1 << 23)  # ceil(2**47 / sig) - 2**23


def _tiny_hist(sub: np.ndarray, s32) -> tuple:
    """Exact log2 histogram of the products of float32-subnormal values (rare; done directly)."""
    if sub.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    _, e = np.frexp(np.abs(sub.astype(np.float64)) * float(s32))
    return np.unique(e.astype(np.int64) - 1, return_counts=True)


def _merge_hist(bins_a, counts_a, bins_b, counts_b):
    bins = np.concatenate([bins_a, bins_b])
    counts = np.concatenate([counts_a, counts_b])
    if bins.size == 0:
        return bins, counts
    lo = bins.min()
    dense = np.bincount(bins - lo, weights=counts, minlength=0).astype(np.int64)
    return np.arange(lo, lo + dense.size), dense


# ------------------------------------------------------------------ the chunked pass
def _level_histogram(u: np.ndarray, thresholds, on_mantissa: bool, split=None) -> np.ndarray:
    """Counts per (exponent field, split bit, level) of float32 bit patterns ``u``.

    The level of a value is how many ``thresholds`` its |bit pattern| (or, with ``on_mantissa``,
    its mantissa field) reaches; the split bit is ``mantissa field >= split``. Work is done in
    cache-sized chunks with preallocated buffers, summing comparisons in uint8, so the cost is a
    few cheap integer operations and one bincount per value.
    """
    n_levels = len(thresholds) + 1
    n_keys = 256 * 2 * n_levels
    th2 = [np.uint32(2 * int(t)) for t in thresholds]  # compared with doubled patterns
    split2 = None if split is None else np.uint32(2 * int(split))
    need_t = on_mantissa or split2 is not None
    a = np.empty(_CHUNK, np.uint32)  # 2|u|: the sign shifted out
    t = np.empty(_CHUNK, np.uint32)  # 2 * mantissa field
    b = np.empty(_CHUNK, bool)
    lv = np.empty(_CHUNK, np.uint8)
    key = np.empty(_CHUNK, np.uint32)
    counts = np.zeros(n_keys, np.int64)
    for i in range(0, u.size, _CHUNK):
        c = u[i:i + _CHUNK]
        m = c.size
        A, T, B, L, K = a[:m], t[:m], b[:m], lv[:m], key[:m]
        np.left_shift(c, 1, out=A)
        if need_t:
            np.bitwise_and(A, 0xFFFFFE, out=T)
        x = T if on_mantissa else A
        L.fill(0) if not th2 else np.greater_equal(x, th2[0], out=L.view(bool))
        for th in th2[1:]:
            np.greater_equal(x, th, out=B)
            np.add(L, B.view(np.uint8), out=L)
        np.right_shift(A, 24, out=K)  # exponent field
        if split2 is None:
            K *= 2 * n_levels
        else:
            K *= 2
            np.greater_equal(T, split2, out=B)
            np.add(K, B, out=K, casting="unsafe")
            K *= n_levels
        np.add(K, L, out=K, casting="unsafe")
        counts += np.bincount(K, minlength=n_keys)
    return counts.reshape(256, 2, n_levels)


def _census_pass(v: np.ndarray, fmt: FloatFormat, s32: np.float32) -> CensusResult:
    """One chunked pass over the data: exact for any scale."""
    k, cut = _hist_cut(s32)
    counts = _level_histogram(v.view(np.uint32), _edges(fmt, s32), on_mantissa=False,
                              split=cut if cut < (1 << 23) else None)
    per_level = counts.sum(axis=(0, 1))  # values reaching exactly j edges
    above = per_level[::-1].cumsum()[::-1][1:]
    # log2 histogram of finite nonzero values: float32-normal ones from their exponent field
    hist = counts[:, :, 1:].sum(axis=2)  # level 0 is zero
    hist[0] = 0  # float32 subnormals: exact histogram below
    hist[255] = 0  # inf, NaN
    exps = np.arange(256) - 127 + k
    bins = np.concatenate([exps, exps + 1])
    hist = np.concatenate([hist[:, 0], hist[:, 1]])
    if counts[0, :, 1:].sum():
        u = v.view(np.uint32)
        tiny = v[((u & np.uint32(_INF_BITS)) == 0) & (v != 0)]
        bins, hist = _merge_hist(bins, hist, *_tiny_hist(tiny, s32))
    else:
        bins, hist = _merge_hist(bins, hist, np.zeros(0, np.int64), np.zeros(0, np.int64))
    return _result(fmt, s32, v.size, above, bins, hist)


# ------------------------------------------------------------------ profiles
@dataclass(frozen=True, eq=False)
class Profile:
    """Values prepared once, so that a slider can re-ask them at another scale or format.

    ``table[e, j]`` counts values with float32 exponent field ``e`` whose mantissa field lies at
    or past exactly ``j`` of the cut points ``_CUTS`` (``j = 0``: below the first one).
    """

    values: np.ndarray
    table: np.ndarray
    tiny: np.ndarray  # the nonzero float32-subnormal values, counted exactly on their own
    tiny_bits: np.ndarray  # their |bit patterns|, sorted

    @property
    def total(self) -> int:
        return int(self.values.size)

    def __repr__(self) -> str:
        return f"Profile({self.total} values)"


def profile(values) -> Profile:
    """Prepare float32 values for repeated ``census`` calls (one pass over the data)."""
    if isinstance(values, Profile):
        return values
    v = _as_float32(values)
    u = v.view(np.uint32)
    table = _level_histogram(u, _CUTS, on_mantissa=True)[:, 0, :]
    tiny = np.zeros(0, np.float32)
    if table[0, 1:].sum():
        tiny = v[((u & np.uint32(_INF_BITS)) == 0) & (v != 0)]
    return Profile(values=v, table=table, tiny=tiny,
                   tiny_bits=np.sort(tiny.view(np.uint32) & np.uint32(0x7FFFFFFF)))


def _census_profile(p: Profile, fmt: FloatFormat, s32: np.float32):
    """Census from the profile alone, or None where an edge falls between its cut points."""
    k, cut = _hist_cut(s32)
    if cut != 1 << 23:
        return None
    edges = _edges(fmt, s32)
    tail = p.table[:, ::-1].cumsum(axis=1)[:, ::-1]  # tail[e, j]: exponent e, level >= j
    above_exp = np.concatenate([p.table.sum(axis=1)[::-1].cumsum()[::-1], [0]])  # exponent >= e
    above = []
    for edge in edges:
        e = edge >> 23
        if e == 0:  # inside float32's subnormal range: count the stored subnormals exactly
            tiny_above = p.tiny_bits.size - np.searchsorted(p.tiny_bits, edge)
            above.append(above_exp[1] + tiny_above)
            continue
        j = _CUT_INDEX.get(edge & _MANT_MASK)
        if j is None:
            if tail[e, 0]:  # values share the edge's binade: only the data can tell
                return None
            j = 0
        above.append(above_exp[e + 1] + tail[e, j])
    counts = p.table.sum(axis=1)
    counts[0] = 0  # float32 zeros and subnormals: histogram done exactly below
    counts[255] = 0  # inf and NaN
    bins = np.arange(256) - 127 + k
    bins, hist = _merge_hist(bins, counts, *_tiny_hist(p.tiny, s32))
    return _result(fmt, s32, p.total, above, bins, hist)


# ------------------------------------------------------------------ public entry points
def census(values, fmt, scale=1.0) -> CensusResult:
    """Census of ``values`` (an array or a ``Profile``) cast to ``fmt`` after multiplying by ``scale``.

    The counts equal what ``(torch.from_numpy(values) * scale).to(dtype)`` gives on the same float32
    data, for any positive scale.
    """
    fmt = get_format(fmt)
    s32 = _check_scale(scale)
    if isinstance(values, Profile):
        fast = _census_profile(values, fmt, s32)
        return fast if fast is not None else _census_pass(values.values, fmt, s32)
    return _census_pass(_as_float32(values), fmt, s32)


def underflow_fractions(values, fmt, scales) -> np.ndarray:
    """For each of ``scales``, the share of ``values`` that ``census(values, fmt, scale)`` counts
    as underflow (nonzero, ending as 0): exact, and cheap for many scales at once (one sort of
    the data, then one edge search and one binary search per distinct scale)."""
    fmt = get_format(fmt)
    v = _as_float32(values)
    bits = np.sort(v.view(np.uint32) & np.uint32(0x7FFFFFFF))
    bits = bits[bits <= _INF_BITS]  # NaN is never underflow
    zeros = int(np.searchsorted(bits, 1))
    try:
        scales = _real_array(scales, "scales").ravel()
    except TypeError:
        raise TypeError(f"scales must be numbers (one or a list of them), got {_describe(scales)}") from None
    out = np.empty(scales.size)
    seen = {}
    for i, sc in enumerate(scales.tolist()):
        if sc not in seen:
            s32 = _check_scale(sc)
            with np.errstate(over="ignore", under="ignore"):  # the smallest |v| that survives
                sub = _edge_finder(fmt, s32)(2)
            seen[sc] = (int(np.searchsorted(bits, sub)) - zeros) / max(v.size, 1)
        out[i] = seen[sc]
    return out


def census_reference(values, fmt, scale=1.0) -> CensusResult:
    """Census by brute force: multiply in float32, classify every value. Exact, not fast."""
    fmt = get_format(fmt)
    s32 = _check_scale(scale)
    v = _as_float32(values.values if isinstance(values, Profile) else values)
    with np.errstate(over="ignore", under="ignore"):
        p = v * s32
    codes = fmt.classify_codes(p)
    codes[(p == 0) & (v != 0)] = UNDERFLOW
    codes[v == 0] = ZERO
    counts = np.bincount(codes, minlength=len(CATEGORIES))
    finite = np.isfinite(v) & (v != 0)
    _, e = np.frexp(np.abs(v[finite].astype(np.float64)) * float(s32))
    bins, hist = np.unique(e.astype(np.int64) - 1, return_counts=True)
    return CensusResult(
        fmt=fmt, scale=float(s32), total=int(v.size),
        counts={name: int(c) for name, c in zip(CATEGORIES, counts)},
        log2_bins=bins, log2_counts=hist.astype(np.int64),
    )
