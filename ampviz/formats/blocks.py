"""Block scaling, bit for bit: OCP MX (MXFP8, MXFP6, MXFP4) and NVIDIA's NVFP4.

A block format stores a small number per element and one shared scale per block of elements
along the last axis. Both families here are reproduced exactly as their reference libraries
compute them on the CPU, in float32 arithmetic, and where a reference departs from the format's
own rule the rule is followed and the departure is named.

**MX** (``mx_quantize``): blocks of 32 (``block_size``), an E8M0 scale X = 2**k per block, and
elements ``fmt.encode(clamp(x / X, ±max))`` (round to nearest even, saturating). The exponent k
comes from the block's largest magnitude amax and the element format's largest power of two
``emax`` (``fmt.emax``: 8 for E4M3, 15 for E5M2, 4 for E3M2, 2 for E2M3 and E2M1):

* ``"floor"`` (the OCP MX v1.0 rule): k = floor(log2 amax) - emax. amax/X can exceed ``max``
  (E4M3: 500 -> 448), which the clamp absorbs;
* ``"ceil"``: k = ceil(log2 amax) - emax;
* ``"even"``: k = floor(log2 amax') - emax, amax' being amax rounded to the element's mantissa
  bits (ties to even);
* ``"rceil"`` (NVIDIA's rule, the ``cvt.rp.satfinite.ue8m0x2.f32`` instruction): k =
  ceil(log2(amax / max)), computed exactly.

k is clamped to [-127, 127] (scale pattern k + 127). An all-zero block gets 2**-127 (pattern 0).
A block holding NaN gets the NaN scale 255 and dequantizes to NaN. A block holding ±inf (and no
NaN) gets 255 too under floor/ceil/even (log2 inf is beyond E8M0, as in the OCP reference code
``microxcaling``'s ``_quantize_mx``) and 254 under rceil (the saturating instruction, as in
Transformer Engine). The elements of a NaN-scale block do not matter; they are what torchao's
``to_mx`` computes for them: x / 2**128 under floor/ceil/even (±0, and NaN for NaN and ±inf),
the quiet NaN under rceil.

torchao 0.18's ``to_mx`` (eager, CPU) gives the same scale and element patterns on every block
except three, where it departs from the rule above (the tests show each):

1. floor/ceil/even, a nonzero block whose scale is 2**-127 (pattern 0, e.g. a float32-subnormal
   amax): torchao divides by 2**-126 (``F32_MIN_NORMAL``), half the stored scale;
2. floor/ceil/even, a block with ±inf: torchao stores the finite scale 2**(128 - emax) (pattern
   247 for E4M3) and divides by it: inf saturates to ±max, the rest become (nearly) 0;
3. rceil: torchao's float32 ``ceil(log2(amax / max))`` returns k for amax / max just above 2**k
   (log2 rounds to the integer), one scale too small, so the largest element saturates; and for
   a nonzero block with scale pattern 0 it multiplies by 1.0 instead of 2**127.

**NVFP4** (``nvfp4_quantize``): E2M1 elements in blocks of 16, an E4M3 scale per block and a
float32 scale for the tensor, exactly as torchao's ``nvfp4_quantize`` and
``per_tensor_amax_to_scale`` (decode scale amax / (448 * 6)); ``convention="te"`` follows
Transformer Engine's reference quantizer instead (block scales may go below 2**-6, down to 0;
-0 and NaN give pattern 0).

Also: ``stochastic_round`` (unbiased rounding to a format's grid, as NVFP4 training rounds
gradients) and ``random_hadamard_transform`` (the NVFP4 recipe's 16-point transform).

Inputs are numbers, lists, numpy arrays or torch tensors (read as in ``ampviz.formats``), rounded
to float32 first. Results are immutable: NamedTuples of read-only numpy arrays. This module needs
numpy only.

Speed: without ``rng``, both quantizers round the elements through a lookup table per element
format (built on first use from the exact encoder), in cache-sized chunks, and on large inputs
in one thread per processor (``bench/bench_blocks.py`` times them). Blocks holding NaN or inf, and
stochastic rounding, take the straightforward path (``_mx_reference``, ``_nvfp4_reference``),
which the fast one equals bit for bit (``tests/formats/test_blocks_fast.py``).
"""

from __future__ import annotations

import numbers
import os
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from ampviz.formats import (
    E8M0,
    FP4_E2M1,
    FP6_E2M3,
    FP6_E3M2,
    FP8_E4M3,
    FP8_E5M2,
    _TORCH_MAX_NAN,
    FloatFormat,
    _describe,
    _real_array,
    _scalar_or_array,
    get_format,
)

__all__ = [
    "MX_ELEMENT_FORMATS",
    "MX_ROUNDING",
    "NVFP4_CONVENTIONS",
    "TE_RHT_SIGNS",
    "MXBlocks",
    "NVFP4Blocks",
    "mx_quantize",
    "nvfp4_quantize",
    "stochastic_round",
    "hadamard_matrix",
    "random_hadamard_transform",
]

#: The element formats of OCP MX, by name.
MX_ELEMENT_FORMATS = {f.name: f for f in (FP8_E4M3, FP8_E5M2, FP6_E3M2, FP6_E2M3, FP4_E2M1)}
#: How ``mx_quantize`` picks a block's scale (torchao's ``ScaleCalculationMode`` values).
MX_ROUNDING = ("floor", "ceil", "even", "rceil")
#: Whose NVFP4 quantizer ``nvfp4_quantize`` follows.
NVFP4_CONVENTIONS = ("torchao", "te")
#: The fixed signs of Transformer Engine's NVFP4 Hadamard transform (``get_wgrad_sign_vector``).
TE_RHT_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)

_F32 = np.float32
_F32_MAX = np.finfo(np.float32).max
_NVFP4_BLOCK = 16
_E4M3_MAX = _F32(448.0)
_E4M3_TINY = _F32(2.0**-6)  # torchao's E4M3_EPS: torch.finfo(float8_e4m3fn).tiny
_FP4_MAX = _F32(6.0)


class MXBlocks(NamedTuple):
    """What ``mx_quantize`` returns (read-only arrays)."""

    scales: np.ndarray  #: uint8 E8M0 patterns, shape x.shape[:-1] + (blocks,)
    codes: np.ndarray  #: uint8 element patterns, x's shape (fp6/fp4 in the low bits)
    values: np.ndarray  #: float32 dequantized values, code value * 2**(scale - 127); NaN for scale 255


class NVFP4Blocks(NamedTuple):
    """What ``nvfp4_quantize`` returns (read-only arrays; ``tensor_scale`` None when single-level)."""

    tensor_scale: np.float32 | None  #: float32 decode scale of the tensor
    scales: np.ndarray  #: uint8 E4M3 patterns, shape x.shape[:-1] + (blocks,)
    codes: np.ndarray  #: uint8 E2M1 patterns, one per element (unpacked), x's shape
    values: np.ndarray  #: float32 dequantized values, code value * (tensor_scale * block scale)


# ---------------------------------------------------------------- argument checks
def _sealed(arr: np.ndarray) -> np.ndarray:
    """A freshly made array (owned by no one else), made read-only without a copy."""
    arr.setflags(write=False)
    return arr


def _float32_blocks(x, block: int, fn: str) -> np.ndarray:
    """x as float32 (float64 rounded once, as torch's cast), shaped (..., blocks, block)."""
    arr = _real_array(x, f"{fn}: x")
    if arr.ndim == 0:
        raise ValueError(f"{fn} needs an array with at least one axis (blocks run along the last), got one number")
    n = arr.shape[-1]
    if n % block:
        raise ValueError(f"{fn}: the last axis ({n} values) must be a multiple of the block size {block}; "
                         f"pad it or pass block_size dividing {n}")
    with np.errstate(over="ignore", invalid="ignore"):
        x32 = arr.astype(np.float32, copy=False)  # read only, so float32 input is not copied
    return x32.reshape(*arr.shape[:-1], n // block, block)


def _block_size(block_size) -> int:
    if isinstance(block_size, (bool, np.bool_)) or not isinstance(block_size, (numbers.Integral, np.integer)):
        raise TypeError(f"block_size must be a positive int such as 32, got {_describe(block_size)}")
    if block_size < 1:
        raise ValueError(f"block_size must be a positive int such as 32, got {int(block_size)}")
    return int(block_size)


def _mx_element_format(fmt) -> FloatFormat:
    names = ", ".join(repr(k) for k in MX_ELEMENT_FORMATS)
    try:
        f = get_format(fmt)
    except (TypeError, ValueError):
        f = None
    if f is None or MX_ELEMENT_FORMATS.get(f.name) is not f:
        raise ValueError(f"fmt must be an MX element format ({names}) or its FloatFormat, got {_describe(fmt)}")
    return f


def _choice(value, what: str, choices: tuple) -> str:
    key = getattr(value, "value", value)  # an Enum such as torchao's ScaleCalculationMode
    if isinstance(key, str) and key.strip().lower() in choices:
        return key.strip().lower()
    raise ValueError(f"{what} must be one of {', '.join(repr(c) for c in choices)}, got {_describe(value)}")


def _generator(rng, fn: str):
    if rng is None or isinstance(rng, np.random.Generator):
        return rng
    raise TypeError(f"{fn}: rng must be a numpy Generator (np.random.default_rng(seed)) or None, got {_describe(rng)}")


# ---------------------------------------------------------------- element casts
def _pow2(k) -> np.ndarray:
    """2.0**k as float32 for integer k in [-149, 127] (exact)."""
    return np.ldexp(_F32(1.0), np.asarray(k, np.int32)).astype(np.float32)


def _element_codes(fmt: FloatFormat, v: np.ndarray, rng=None) -> np.ndarray:
    """uint8 patterns of float32 values v already clamped to ±fmt.max (NaN passes through).

    fp8 as torch's cast gives them (NaN: 0x7F with the NaN's sign, in E5M2 too); fp6 and fp4 as
    torchao's ``f32_to_f*_unpacked`` (NaN by its bit arithmetic). ``rng``: round stochastically.
    """
    if rng is not None:
        v = stochastic_round(v, fmt, rng).astype(np.float32)
    if fmt.specials == "finite":
        bits = fmt.encode(v, nan="torchao")
    else:
        bits = fmt.encode(v)
        isnan = np.isnan(v)
        if isnan.any():  # torch writes S.1111.111 for NaN in both fp8 formats
            ones = (1 << (fmt.bits - 1)) - 1
            bits = np.where(isnan, ones | (np.signbit(v).astype(np.int64) << (fmt.bits - 1)), bits)
    return np.asarray(bits).astype(np.uint8)


def _element_values(fmt: FloatFormat, codes: np.ndarray) -> np.ndarray:
    return np.asarray(fmt.decode(codes.astype(np.int64))).astype(np.float32)


def _e4m3_scale_values(codes: np.ndarray) -> np.ndarray:
    """float32 values of E4M3 patterns as torch's cast gives them: a NaN pattern becomes the
    float32 NaN 0x7FF00000 with its sign (c10's ``fp8e4m3fn_to_fp32_value``), whose payload then
    travels through the arithmetic that follows (it decides the E2M1 patterns torchao writes in
    a block whose scale is NaN)."""
    v = _element_values(FP8_E4M3, codes)
    nan_bits = (0x7FF00000 | (codes.astype(np.uint32) >> 7 << 31)).astype(np.uint32)
    return np.where(np.isnan(v), nan_bits.view(np.float32), v)


# ---------------------------------------------------------------- fast paths
# A block quantizer divides each element by its block's scale and rounds the quotient v into the
# element format (saturating, ties to even). The fast paths below do the rounding with a lookup
# table instead of arithmetic: an element format has at most 3 mantissa bits, so the pattern of v
# depends only on v's sign, exponent and top 7 mantissa bits (the top 16 bits of its float32
# pattern) and on whether any of its 16 lower bits is set (which decides ties). That is 2**17
# cases, and the table holds the pattern and the value for each, computed once per format by the
# exact encoder above on one float32 value of each case. (Rounding to m <= 6 mantissa bits,
# ties to even, needs the m kept bits, the next one and whether anything below it is set; the
# comparison with max, which has m bits too, needs no more.) Large inputs go through in chunks of
# ``_CHUNK`` elements, so that each chunk's temporaries stay in the processor's cache, and in
# pieces shared among threads (``_in_parallel``).

_CHUNK = 1 << 16  # elements per chunk: with its temporaries about 1.6 MB, within a core's L2 cache
_ABS_BITS = np.uint32(0x7FFFFFFF)  # float32 pattern without its sign
_INF_BITS = 0x7F800000  # float32 +inf; any pattern above it (without sign) is a NaN
_TABLES: dict = {}


class _ElementTable(NamedTuple):
    """An element format's rounding as two tables indexed by ``_table_index`` (2**17 entries)."""

    codes: np.ndarray  #: uint8 element patterns
    values: np.ndarray  #: float32 values of those patterns


def _table_representatives() -> np.ndarray:
    """One float32 value per table index i: the top 16 bits i >> 1, and lowest bit i & 1 (the
    "some lower bit set" flag), so that ``_table_index`` of it is i."""
    i = np.arange(1 << 17, dtype=np.uint32)
    return ((i >> 1) << 16 | (i & 1)).view(np.float32)


def _element_table(fmt: FloatFormat, convention: str = "torchao") -> _ElementTable:
    """The table of ``fmt`` (built on first use): entry i holds what the exact path gives for
    every float32 v with ``_table_index(v) == i`` and v not NaN: the pattern of clamp(v, ±max) as
    ``_element_codes`` writes it (with Transformer Engine's -0 -> 0 for ``convention="te"``)."""
    key = (fmt.name, convention)
    table = _TABLES.get(key)
    if table is None:
        v = _table_representatives()
        top = _F32(fmt.max)
        with np.errstate(invalid="ignore"):
            v = np.clip(v, -top, top)
            codes = _element_codes(fmt, v)
            if convention == "te":  # as in nvfp4_quantize below
                codes = np.where((codes == 0x8) & (v == 0) | np.isnan(v), 0, codes).astype(np.uint8)
            values = _element_values(fmt, codes)
        table = _TABLES[key] = _ElementTable(_sealed(codes), _sealed(values))
    return table


def _table_index(v: np.ndarray, scratch: np.ndarray, out: np.ndarray) -> None:
    """out = the table index of each float32 v: (top 16 bits << 1) | (any of the low 16 bits set).

    ``scratch``: a uint32 array of v's size. The low 15 bits plus 0x7FFF carry into bit 15 exactly
    when one of them is set; or-ed with v's own bit 15, bit 15 then says "some low bit set", and a
    shift by 15 gives the index."""
    u = v.view(np.uint32)
    np.bitwise_and(u, 0x7FFF, out=scratch)
    np.add(scratch, 0x7FFF, out=scratch)
    np.bitwise_or(scratch, u, out=scratch)
    np.right_shift(scratch, 15, out=out)


def _abs_max_bits(x2: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The float32 pattern of each row's largest magnitude, as uint32 (rows of a C-contiguous
    float32 array x2): without the sign, float32 patterns order as their magnitudes, and every
    NaN pattern lies above +inf's, so a row holding a NaN gives a pattern above ``_INF_BITS``.

    While the rows have an even length, neighbours are paired (one pass over a chunk, not one
    short loop per row), between two buffers (an output overlapping its inputs would make numpy
    copy them first); what is left is reduced per row. ``out``: where to write (n uint32)."""
    n, block = x2.shape
    rows = max(1, _CHUNK // block)
    out = np.empty(n, np.uint32) if out is None else out
    u = x2.view(np.uint32)
    size = min(rows, n) * block
    scratch, other = np.empty(size, np.uint32), np.empty(size // 2, np.uint32)
    for r0 in range(0, n, rows):
        r1 = min(r0 + rows, n)
        part, spare = scratch[: (r1 - r0) * block], other
        np.bitwise_and(u[r0:r1].reshape(-1), _ABS_BITS, out=part)
        width = block
        while width % 2 == 0:
            half = spare[: part.size // 2]
            np.maximum(part[0::2], part[1::2], out=half)
            part, spare, width = half, part, width // 2
        if width == 1:
            out[r0:r1] = part
        else:
            np.max(part.reshape(-1, width), axis=1, out=out[r0:r1])
    return out


def _scaled_elements(x2: np.ndarray, mult: np.ndarray, dscale: np.ndarray, table: _ElementTable,
                     codes: np.ndarray, values: np.ndarray) -> None:
    """Write the patterns and values of the rows of a C-contiguous float32 array x2, each row
    multiplied by its ``mult`` (float32, one per row) and rounded by ``table``, into ``codes``
    (uint8) and ``values`` (float32, table value * ``dscale``, one float32 per row), both shaped
    as x2. Each product is rounded once to float32, as the exact path computes it. No product
    x * mult may be NaN (the table's NaN entries mean nothing)."""
    n, block = x2.shape
    rows = max(1, _CHUNK // block)
    size = min(rows, n) * block
    v = np.empty(size, np.float32)
    scratch = np.empty(size, np.uint32)
    index = np.empty(size, np.intp)
    for r0 in range(0, n, rows):
        r1 = min(r0 + rows, n)
        k = (r1 - r0) * block
        vk, ik = v[:k], index[:k]
        np.multiply(x2[r0:r1], mult[r0:r1, None], out=vk.reshape(-1, block))
        _table_index(vk, scratch[:k], ik)
        np.take(table.codes, ik, out=codes[r0:r1].reshape(-1), mode="wrap")
        out = values[r0:r1]
        np.take(table.values, ik, out=out.reshape(-1), mode="wrap")
        np.multiply(out, dscale[r0:r1, None], out=out)


_PARALLEL_MIN = 1 << 20  # elements: below this, one thread
_PIECE = 1 << 20  # elements per task when threaded


def _in_parallel(work, n: int, block: int) -> None:
    """Call work(r0, r1) on consecutive row ranges covering range(n): in threads (one per processor
    this process may use, at most 8) when the input is large, else at once. numpy releases the
    interpreter lock inside its loops, so the threads run together; each call writes its own rows
    only. The ranges are small and taken in turn, so a thread slowed by other work on the machine
    takes fewer of them."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cpus = os.cpu_count() or 1
    workers = min(cpus, 8, n * block // (_PARALLEL_MIN // 2))
    if workers < 2:
        work(0, n)
        return
    rows = max(1, _PIECE // block)
    with ThreadPoolExecutor(workers) as pool:
        for job in [pool.submit(work, r0, min(r0 + rows, n)) for r0 in range(0, n, rows)]:
            job.result()  # re-raises an error of the worker


def _mx_scale_index(abits: np.ndarray, fmt: FloatFormat, rounding: str) -> np.ndarray:
    """An index (0..256) per block, from the patterns ``_abs_max_bits`` gives, that decides the
    block's scale: the biased exponent e of amax, plus one where the rounding moves amax up a
    binade.

    For a normal amax with mantissa field m, floor(log2 amax) + 127 = e. ceil adds one when
    m > 0; even when m rounds up past the element's mantissa bits (ties to even: m >= 2**23 -
    2**(22 - mantissa bits)); rceil when m exceeds the mantissa field of ``fmt.max`` (max * 2**k
    then falls short of amax). Adding 2**23 - 1, 2**(22 - mantissa bits) or 2**23 - 1 - (max's
    mantissa field) to the pattern carries into the exponent exactly then."""
    if rounding == "floor":
        add = 0
    elif rounding == "ceil":
        add = (1 << 23) - 1
    elif rounding == "even":
        add = 1 << (22 - fmt.mantissa_bits)
    else:
        add = (1 << 23) - 1 - (int(np.float32(fmt.max).view(np.uint32)) & 0x7FFFFF)
    index = np.empty(abits.shape, np.intp)
    np.right_shift(abits + np.uint32(add), 23, out=index)
    return index


def _mx_scale_tables(fmt: FloatFormat, rounding: str) -> tuple:
    """(patterns, multipliers, scales), indexed by ``_mx_scale_index`` of a finite amax: the E8M0
    pattern clamp(index - emax, 0, 254) (uint8; the exponent of ``fmt.max`` in place of emax under
    rceil), 2**(127 - pattern) to divide by the scale and 2**(pattern - 127) to dequantize
    (float32). A zero or float32-subnormal amax (index 0 or 1: k far below -127) gets pattern 0.
    An inf or NaN amax is not looked up here (see ``_mx_scale_codes``)."""
    key = ("scales", fmt.name, rounding)
    tables = _TABLES.get(key)
    if tables is None:
        shift = fmt.emax if rounding != "rceil" else int(np.floor(np.log2(fmt.max)))
        codes = np.clip(np.arange(257) - shift, 0, 254)
        mult = np.ldexp(_F32(1.0), (127 - codes).astype(np.int32)).astype(np.float32)
        scale = np.ldexp(_F32(1.0), (codes - 127).astype(np.int32)).astype(np.float32)
        tables = _TABLES[key] = tuple(_sealed(t) for t in (codes.astype(np.uint8), mult, scale))
    return tables


def _mx_scale_codes(abits: np.ndarray, fmt: FloatFormat, rounding: str) -> np.ndarray:
    """The E8M0 scale patterns (uint8) of blocks from their ``_abs_max_bits``, by the rule of
    ``_mx_exponents``: an inf amax gives 255 (254 under rceil), a NaN 255."""
    codes = _mx_scale_tables(fmt, rounding)[0].take(_mx_scale_index(abits, fmt, rounding))
    codes[abits == _INF_BITS] = 254 if rounding == "rceil" else 255
    codes[abits > _INF_BITS] = 255
    return codes


def _mx_fast(x2: np.ndarray, fmt: FloatFormat, rounding: str, table: _ElementTable | None = None):
    """``_mx_reference`` of the rows (blocks) of x2, through the element table: (scales, codes,
    values). Blocks holding an inf or a NaN go through the exact path (their scale is 255, or 254
    for an inf under rceil); in the others no quotient is NaN. ``table``: the element table
    (tests pass a wrong one to show it is caught)."""
    x2 = np.ascontiguousarray(x2)
    n, block = x2.shape
    table = _element_table(fmt) if table is None else table
    scale_codes, scale_mult, scale_value = _mx_scale_tables(fmt, rounding)
    abits = np.empty(n, np.uint32)
    scales = np.empty(n, np.uint8)
    codes = np.empty((n, block), np.uint8)
    values = np.empty((n, block), np.float32)

    def work(r0, r1):
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):  # per thread
            i = _mx_scale_index(_abs_max_bits(x2[r0:r1], abits[r0:r1]), fmt, rounding)
            scale_codes.take(i, out=scales[r0:r1])
            _scaled_elements(x2[r0:r1], scale_mult.take(i), scale_value.take(i), table, codes[r0:r1],
                             values[r0:r1])

    _in_parallel(work, n, block)
    exact = np.flatnonzero(abits >= _INF_BITS)
    if exact.size:
        scales[exact], codes[exact], values[exact] = _mx_reference(x2[exact], fmt, rounding)
    return scales, codes, values


# ---------------------------------------------------------------- MX
def _mx_exponents(amax: np.ndarray, fmt: FloatFormat, rounding: str) -> np.ndarray:
    """The block scale patterns (int64) from float32 block maxima, by the exact rule."""
    a = amax.astype(np.float64)
    positive = a > 0
    finite = np.isfinite(a)
    safe = np.where(positive & finite, a, 1.0)
    frac, e = np.frexp(safe)  # safe = frac * 2**e, frac in [0.5, 1): floor(log2) = e - 1
    floor_log2 = e.astype(np.int64) - 1
    if rounding == "floor":
        k = floor_log2 - fmt.emax
    elif rounding == "ceil":
        k = floor_log2 + (frac != 0.5) - fmt.emax
    elif rounding == "even":  # amax rounded to the element's mantissa bits (ties to even) first
        m = fmt.mantissa_bits
        k = floor_log2 + (np.rint(frac * 2.0 ** (m + 1)) == 2.0 ** (m + 1)) - fmt.emax
    else:  # rceil: the least k with max * 2**k >= amax (exact: both sides are float64 values)
        k = floor_log2 - int(np.floor(np.log2(fmt.max)))
        k = k - 1 + (np.ldexp(fmt.max, k - 1) < safe) + (np.ldexp(fmt.max, k) < safe)
    k = np.where(positive, k, -127)
    code = np.clip(k, -127, 127) + 127
    if rounding == "rceil":
        code = np.where(np.isinf(a), 254, code)  # saturating, as cvt.rp.satfinite and TE
    else:
        code = np.where(np.isinf(a), 255, code)  # log2(inf) is beyond E8M0: NaN
    return np.where(np.isnan(a), 255, code).astype(np.int64)


def mx_quantize(x, fmt, block_size=32, rounding="floor", *, rng=None) -> MXBlocks:
    """OCP MX block scaling of x along its last axis: ``(scales, codes, values)``.

    ``fmt``: the element format, a name ("fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3",
    "fp4_e2m1"), its FloatFormat or torch dtype. ``block_size``: elements per scale (32 in the MX
    spec); the last axis must be a multiple of it. ``rounding``: how the scale is chosen, "floor"
    (OCP), "ceil", "even" or "rceil" (NVIDIA); see the module. ``rng``: a numpy Generator to round
    the elements stochastically instead of to nearest even (the scales do not change).

    Returns ``MXBlocks``: ``scales`` (uint8 E8M0 patterns, one per block), ``codes`` (uint8
    element patterns, one per element; fp4 unpacked) and ``values`` (float32, the dequantized
    x: element value * scale, as torchao's ``MXTensor.dequantize``; NaN where the scale is NaN).
    """
    fmt = _mx_element_format(fmt)
    block = _block_size(block_size)
    rounding = _choice(rounding, "rounding", MX_ROUNDING)
    rng = _generator(rng, "mx_quantize")
    xb = _float32_blocks(x, block, "mx_quantize")
    if rng is None and xb.size:
        scales, codes, values = _mx_fast(xb.reshape(-1, block), fmt, rounding)
    else:
        scales, codes, values = _mx_reference(xb, fmt, rounding, rng)
    return MXBlocks(_sealed(scales.reshape(xb.shape[:-1])), _sealed(codes.reshape(_x_shape(xb))),
                    _sealed(values.reshape(_x_shape(xb))))


def _x_shape(xb: np.ndarray) -> tuple:
    """The shape of the array that was cut into the blocks xb (..., blocks, block)."""
    return xb.shape[:-2] + (xb.shape[-2] * xb.shape[-1],)


def _mx_reference(xb: np.ndarray, fmt: FloatFormat, rounding: str, rng=None):
    """MX block scaling of float32 blocks xb (..., blocks, block), straight from the rule, one
    numpy operation over all elements at a time: (scales, codes, values), new writable arrays
    shaped (..., blocks), (..., blocks, block) and (..., blocks, block). ``mx_quantize`` uses it
    for stochastic rounding and for blocks whose scale is NaN; the fast path must equal it."""
    with np.errstate(invalid="ignore"):
        amax = np.max(np.abs(xb), axis=-1, initial=_F32(0.0)) if xb.size else np.zeros(xb.shape[:-1], np.float32)
        amax = np.where(np.isnan(xb).any(axis=-1), np.nan, amax).astype(np.float32)
    scales = _mx_exponents(amax, fmt, rounding)
    top = _F32(fmt.max)
    s = scales[..., None]
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        # x / X, exactly (a power of two); a NaN-scale block as torchao computes it: x / 2**128
        # (floor, ceil, even: finite values give ±0) or x * (amax / max) (rceil: every element
        # becomes the quiet NaN that amax carries)
        nan_block = np.full_like(xb, np.nan) if rounding == "rceil" else xb / _F32(np.inf)
        v = np.where(s == 255, nan_block, np.ldexp(xb, (127 - np.minimum(s, 254)).astype(np.int32)))
        v = np.clip(v.astype(np.float32), -top, top)
        codes = _element_codes(fmt, v, rng)
        values = _element_values(fmt, codes) * _pow2(np.minimum(s, 254) - 127)
    values = np.where(s == 255, np.float32(np.nan), values).astype(np.float32)
    return scales.astype(np.uint8), codes.reshape(xb.shape), values.reshape(xb.shape)


# ---------------------------------------------------------------- NVFP4
def _e4m3_codes(s: np.ndarray) -> np.ndarray:
    """E4M3 patterns of float32 values as torch's cast writes them (NaN: 0x7F with its sign)."""
    return np.asarray(FP8_E4M3.encode(s)).astype(np.uint8)


def _tensor_scale(per_tensor_scale, amax_t: np.float32, convention: str):
    if isinstance(per_tensor_scale, (bool, np.bool_)):
        if not per_tensor_scale:
            if convention == "te":
                raise ValueError("nvfp4_quantize: convention='te' has no single-level scaling; pass "
                                 "per_tensor_scale=True")
            return None
        if convention == "te":
            return None  # computed from the amax below, as the reference does
        return _F32(amax_t / _F32(448.0 * 6.0))  # per_tensor_amax_to_scale
    if isinstance(per_tensor_scale, numbers.Real):
        if convention == "te":
            raise ValueError("nvfp4_quantize: convention='te' computes its scale from the amax; pass "
                             "per_tensor_scale=True")
        try:
            with np.errstate(over="ignore"):
                s = _F32(float(per_tensor_scale))
        except OverflowError:  # an int beyond float64
            s = _F32(np.inf)
        if not (np.isfinite(s) and s > 0):
            raise ValueError(f"per_tensor_scale must be True, False or a positive finite decode scale, "
                             f"got {_describe(per_tensor_scale)}")
        return s
    raise TypeError(f"per_tensor_scale must be True, False or a positive number (a decode scale), "
                    f"got {_describe(per_tensor_scale)}")


def nvfp4_quantize(x, per_tensor_scale=True, *, convention="torchao", rng=None) -> NVFP4Blocks:
    """NVFP4 quantization of x along its last axis: ``(tensor_scale, scales, codes, values)``.

    E2M1 elements in blocks of 16 (the last axis must be a multiple of 16), one E4M3 scale per
    block, and a float32 decode scale for the tensor.

    ``per_tensor_scale``: True (two-level scaling, tensor_scale = amax / (448 * 6) in float32, as
    torchao's ``per_tensor_amax_to_scale``), False (single-level: each block scale alone, clamped
    to [2**-6, 448]; ``tensor_scale`` is None) or a positive number (a calibrated decode scale).

    ``convention``: "torchao" (its ``nvfp4_quantize``, bit for bit: block scale amax/6/tensor_scale
    clamped to [2**-6, 448] and cast to E4M3, elements x * ((1/tensor_scale) / scale)) or "te"
    (Transformer Engine's reference ``_quantize_blockwise_reference``: encode scale
    448*6/amax, block scales not clamped below, so small blocks get E4M3 subnormal scales or 0;
    -0 and NaN elements give pattern 0; tensor_scale is its 1/encode scale; a NaN block scale is
    0x7F, where torch's vectorized ``min`` may write 0xFF). ``rng``: a numpy
    Generator to round the elements stochastically (the scales do not change).

    ``values`` = element value * (tensor_scale * block scale), in float32 as torchao's
    ``NVFP4Tensor.dequantize``.

    Special cases, as torchao: an all-zero tensor has tensor_scale 0, so its block scales are
    0/0 = NaN and its values NaN ("te": scales 0, values 0); a block with ±inf gets a NaN scale
    (inf/inf). A NaN anywhere makes tensor_scale NaN and every block scale NaN, bit for bit as
    torch 2.13 writes them: its ``max`` of |x| gives the negative NaN 0xFFFFFFFF, so the tensor
    scale is that NaN, a block without NaN gets the scale pattern 0xFF (its amax / the tensor
    scale) and a block with NaN 0x7F (its own amax's NaN, positive, comes first in the division).
    The E2M1 patterns inside a NaN-scale block mean nothing; they follow the NaNs' signs and
    payloads as torch's vectorized loops carry them (``_nan_kept``). Not reproduced: where torch
    runs a loop's remainder instead (its last elements, as many as the processor's vector width
    leaves), an element that is NaN itself may keep its own NaN, and so its own pattern; and the
    payloads of NaN ``values``.
    """
    convention = _choice(convention, "convention", NVFP4_CONVENTIONS)
    rng = _generator(rng, "nvfp4_quantize")
    xb = _float32_blocks(x, _NVFP4_BLOCK, "nvfp4_quantize")
    fast = _nvfp4_fast(xb, per_tensor_scale, convention) if rng is None and xb.size else None
    pts, scales, codes, values = fast or _nvfp4_reference(xb, per_tensor_scale, convention, rng)
    return NVFP4Blocks(None if pts is None else _F32(pts), _sealed(scales.reshape(xb.shape[:-1])),
                       _sealed(codes.reshape(_x_shape(xb))), _sealed(values.reshape(_x_shape(xb))))


def _nvfp4_reference(xb: np.ndarray, per_tensor_scale, convention: str, rng=None):
    """NVFP4 quantization of float32 blocks xb (..., blocks, 16), one numpy operation over all
    elements at a time: (tensor scale or None, scales, codes, values), new arrays. ``nvfp4_quantize``
    uses it for stochastic rounding and for inputs the fast path leaves (NaN, inf, a zero scale)."""
    with np.errstate(invalid="ignore"):
        anynan = np.isnan(xb).any(axis=-1)
        bmax = np.max(np.abs(xb), axis=-1, initial=_F32(0.0)) if xb.size else np.zeros(xb.shape[:-1], np.float32)
        bmax = np.where(anynan, np.nan, bmax).astype(np.float32)
        amax_t = _TORCH_MAX_NAN if anynan.any() else _F32(bmax.max(initial=0.0))  # torch.max's NaN
    pts = _tensor_scale(per_tensor_scale, amax_t, convention)
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        if convention == "te":
            s_enc = _F32(_F32(448.0 * 6.0) / amax_t)
            s_enc = _F32(1.0) if s_enc == 0 else (_F32(np.nan) if np.isnan(s_enc) else min(s_enc, _F32_MAX))
            pts = _F32(_F32(1.0) / s_enc)
            mult = _F32(s_enc * np.reciprocal(_FP4_MAX))
            dec = _nan_kept(bmax * mult, _F32(np.nan), np.minimum(bmax * mult, _F32_MAX))  # torch.min
            scales = _e4m3_codes(np.clip(dec, -_E4M3_MAX, _E4M3_MAX))
            sf = _e4m3_scale_values(scales)
            enc = np.minimum((_F32(1.0) / (sf * pts)).astype(np.float32), _F32_MAX)
        else:
            bscale = (bmax / _FP4_MAX).astype(np.float32)
            if pts is not None:
                bscale = _nan_kept(bscale, bscale, bscale / pts)
            scales = _e4m3_codes(np.clip(bscale, _E4M3_TINY, _E4M3_MAX))
            sf = _e4m3_scale_values(scales)
            one = _F32(1.0) if pts is None else _F32(_F32(1.0) / pts)
            enc = _nan_kept(one, one, one / sf)
        v = np.clip(_nan_kept(enc[..., None], enc[..., None], xb * enc[..., None]), -_FP4_MAX, _FP4_MAX)
        codes = _element_codes(FP4_E2M1, v, rng)
        if convention == "te":  # its threshold table: -0 and NaN match no negative range
            codes = np.where((codes == 0x8) & (v == 0) | np.isnan(v), 0, codes).astype(np.uint8)
        dscale = sf if pts is None else _nan_kept(pts, pts, pts * sf)
        values = (_element_values(FP4_E2M1, codes) * dscale[..., None]).astype(np.float32)
    return pts, scales, codes.reshape(xb.shape), values.reshape(xb.shape)


def _nan_kept(a, nan, result) -> np.ndarray:
    """``result`` as float32, ``nan`` where a is NaN: the NaN torch writes. When both operands are
    NaN, torch's vectorized division keeps its first operand's and its multiply the broadcast
    operand's (sign and payload decide the patterns that follow; numpy's choice varies), and its
    ``min`` writes 0x7FC00000 (0xFFFFFFFF in its vectorized loop: the sign of a NaN block scale
    under ``convention="te"`` is not reproduced)."""
    return np.where(np.isnan(a), nan, result).astype(np.float32)


def _e4m3_lookup(s: np.ndarray) -> np.ndarray:
    """``_e4m3_codes`` of float32 values s in [-448, 448] (no NaN), through the E4M3 table."""
    scratch = np.empty(s.shape, np.uint32)
    index = np.empty(s.shape, np.intp)
    _table_index(np.ascontiguousarray(s, np.float32), scratch, index)
    return _element_table(FP8_E4M3).codes.take(index, mode="wrap")


def _e4m3_scale_table() -> np.ndarray:
    """``_e4m3_scale_values`` of all 256 patterns (made on first use), to look patterns up in."""
    table = _TABLES.get("e4m3 scale values")
    if table is None:
        table = _TABLES["e4m3 scale values"] = _sealed(_e4m3_scale_values(np.arange(256, dtype=np.uint8)))
    return table


def _nvfp4_fast(xb: np.ndarray, per_tensor_scale, convention: str):
    """``_nvfp4_reference`` of xb (no stochastic rounding) with the scales computed by the same
    float32 operations (one per block) and the elements through the E2M1 table; None where the
    input needs the exact path: a NaN or inf in x, or a scale that makes an element's quotient
    NaN (a zero tensor, a tensor scale whose reciprocal overflows)."""
    x2 = np.ascontiguousarray(xb).reshape(-1, _NVFP4_BLOCK)
    abits = np.empty(x2.shape[0], np.uint32)
    _in_parallel(lambda r0, r1: _abs_max_bits(x2[r0:r1], abits[r0:r1]), *x2.shape)
    if abits.max() >= _INF_BITS:
        return None
    bmax = abits.view(np.float32)
    amax_t = _F32(bmax.max())
    pts = _tensor_scale(per_tensor_scale, amax_t, convention)
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        if convention == "te":  # the same operations as _nvfp4_reference; amax_t is finite here
            s_enc = _F32(_F32(448.0 * 6.0) / amax_t)
            s_enc = _F32(1.0) if s_enc == 0 else min(s_enc, _F32_MAX)
            pts = _F32(_F32(1.0) / s_enc)
            mult = _F32(s_enc * np.reciprocal(_FP4_MAX))
            dec = np.minimum((bmax * mult).astype(np.float32), _F32_MAX)
            scales = _e4m3_lookup(np.clip(dec, -_E4M3_MAX, _E4M3_MAX))
            sf = _e4m3_scale_table().take(scales)
            enc = np.minimum((_F32(1.0) / (sf * pts)).astype(np.float32), _F32_MAX)
        else:
            if pts is not None and not pts > 0:  # a zero tensor: 0/0 scales
                return None
            bscale = (bmax / _FP4_MAX).astype(np.float32)
            if pts is not None:
                bscale = (bscale / pts).astype(np.float32)
            scales = _e4m3_lookup(np.clip(bscale, _E4M3_TINY, _E4M3_MAX))
            sf = _e4m3_scale_table().take(scales)
            one = _F32(1.0) if pts is None else _F32(_F32(1.0) / pts)
            enc = (one / sf).astype(np.float32)
        if not np.isfinite(enc).all():  # 0 * inf would be NaN
            return None
        dscale = sf if pts is None else (pts * sf).astype(np.float32)
    table = _element_table(FP4_E2M1, convention)
    codes = np.empty(x2.shape, np.uint8)
    values = np.empty(x2.shape, np.float32)

    def work(r0, r1):
        with np.errstate(over="ignore", under="ignore"):  # per thread
            _scaled_elements(x2[r0:r1], enc[r0:r1], dscale[r0:r1], table, codes[r0:r1], values[r0:r1])

    _in_parallel(work, *x2.shape)
    return pts, scales, codes, values


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


# ---------------------------------------------------------------- random Hadamard transform
def hadamard_matrix(signs=TE_RHT_SIGNS) -> np.ndarray:
    """The NVFP4 recipe's transform matrix diag(signs) @ H / sqrt(n), float64 (orthogonal).

    H is Sylvester's Hadamard matrix of size n = len(signs); ``signs``: n values ±1, by default
    Transformer Engine's fixed vector ``TE_RHT_SIGNS`` (n = 16). n must be a power of four (1, 4,
    16, 64, ...), so that 1/sqrt(n) is a power of two and the transform's products are exact.
    """
    s = _real_array(signs, "hadamard_matrix: signs")
    n = s.size
    if s.ndim != 1 or n < 1 or n & (n - 1) or (n.bit_length() - 1) % 2 or not np.all(np.abs(s) == 1):
        raise ValueError(f"signs must be a power-of-four count (16 for NVFP4) of ±1 values, got {_describe(signs)}")
    h = np.ones((1, 1))
    while h.shape[0] < s.size:
        h = np.block([[h, h], [h, -h]])
    return (s.astype(np.float64)[:, None] * h) / np.sqrt(n)


def random_hadamard_transform(x, signs=TE_RHT_SIGNS, *, inverse=False) -> np.ndarray:
    """The NVFP4 recipe's random Hadamard transform of x along its last axis, in chunks of
    len(signs) (16): each chunk c becomes c @ M, M = ``hadamard_matrix(signs)``, as Transformer
    Engine's reference ``x.view(-1, 16) @ (diag(s) @ H / 4)``. ``inverse``: c @ M.T (M is
    orthogonal, so this undoes the transform).

    Each output is the exact sum rounded once to float32 (M's entries are ±1/4 for 16, so every
    product is exact; a float32 matmul may differ in the last bit by its summation order).
    """
    m = hadamard_matrix(signs)
    n = m.shape[0]
    xb = _float32_blocks(x, n, "random_hadamard_transform").astype(np.float64)
    if not isinstance(inverse, (bool, np.bool_)):
        raise TypeError(f"inverse must be True or False, got {_describe(inverse)}")
    mat = m.T if inverse else m
    with np.errstate(over="ignore", invalid="ignore"):
        y = _exact_matmul_f32(xb, mat)
    return y.reshape(*xb.shape[:-2], xb.shape[-2] * n)


def _exact_matmul_f32(xb: np.ndarray, mat: np.ndarray) -> np.ndarray:
    """xb @ mat with each output the exact sum rounded once to float32 (xb: float32 values as
    float64; mat: entries ±2**-j, so every product is exact in float64; inf and NaN as IEEE sums).

    Where a row's terms span few enough binades, float64 adds them exactly and one cast rounds.
    Elsewhere (rare: values 2**29 apart in one chunk) ``math.fsum`` gives the float64 nearest to
    the exact sum, nudged to round-to-odd so that the cast to float32 rounds it once.
    """
    terms = xb[..., :, None] * mat  # (..., n_in, n_out)
    y = terms.sum(axis=-2)
    a = np.abs(xb)
    nz = a > 0
    low = np.where(nz, np.maximum(np.frexp(np.where(nz, a, 1.0))[1] - 24, -149), 10_000).min(axis=-1)
    low = low + int(np.frexp(np.abs(mat[mat != 0]).min())[1]) - 1  # the products' lowest bit
    bound = np.abs(terms).sum(axis=-2).max(axis=-1, initial=0.0)
    exact = (bound < np.ldexp(1.0, np.minimum(low + 53, 1023))) | ~nz.any(axis=-1)
    if not exact.all():
        import math

        flat_terms = terms.reshape(-1, *terms.shape[-2:])
        flat_y = y.reshape(-1, y.shape[-1])
        for r in np.flatnonzero(~exact.reshape(-1)):
            for j in range(flat_y.shape[1]):
                col = flat_terms[r, :, j].tolist()
                if not all(map(math.isfinite, col)):
                    continue  # inf or NaN: the plain sum is what IEEE arithmetic gives
                near = math.fsum(col)
                rest = math.fsum(col + [-near])
                bits = np.float64(near).view(np.int64)
                if rest != 0 and bits % 2 == 0:  # round to odd: step toward the exact sum
                    near = float(np.nextafter(near, np.inf if rest > 0 else -np.inf))
                flat_y[r, j] = near
        y = flat_y.reshape(y.shape)
    return y.astype(np.float32)
