"""The fast paths of block quantization: each element format's rounding as a lookup table (built
once from the exact cast), the largest magnitude of each block read from float32 bit patterns,
and the work cut into cache-sized chunks and shared among threads. ``ampviz.formats.blocks.mx`` and
``ampviz.formats.blocks.nvfp4`` use them when the input allows; the exact paths there must give the same
bits (``tests/formats/test_blocks_fast.py``).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from ampviz.formats.blocks.common import _F32, _element_codes, _element_values, _sealed
from ampviz.formats.spec import FloatFormat


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
