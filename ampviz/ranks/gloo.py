"""gloo's all-reduce, bit for bit: the ring's layout (``gloo_chunks``: which rank sums which
element; ``gloo_summation_order``: in which order), ``allreduce`` (what every rank holds after
``dist.all_reduce(t, SUM)`` in float32, float16 or bfloat16, with three plausible wrong orders beside
it) and ``run_allreduce`` (the real one, on forked ranks). ``_rounded`` and ``_sum_format`` (rounding
to a dtype as torch does) are shared with the reduce-precision module.
"""

from __future__ import annotations

import numpy as np
import torch

from ampviz._args import _shown, _whole
from ampviz.formats import BF16, FP16, FP32, FloatFormat, get_format
from ampviz.ranks.launcher import MAX_WORLD_SIZE, prewarm, run_ranks

#: gloo's ``AllreduceOptions::kMaxSegmentSize`` (torch leaves it at the default): 1 MiB.
GLOO_MAX_SEGMENT_BYTES = 1 << 20
#: Ways ``allreduce`` can sum: gloo's ring (what gloo does) and three plausible wrong models.
ORDERS = ("gloo", "rank", "tree", "once")

_DTYPES = {FP32: np.float32, FP16: np.float16, BF16: np.float32}


def _sum_format(dtype) -> FloatFormat:
    try:
        fmt = get_format(dtype)
    except (TypeError, ValueError):
        fmt = None
    if fmt not in _DTYPES:
        raise ValueError(f"dtype must be 'float32', 'float16' or 'bfloat16' (or FP32, FP16, BF16), "
                         f"not {_shown(dtype)}")
    return fmt


def _grads(grads) -> np.ndarray:
    """One row per rank of real numbers as float32 (a bfloat16 or float16 tensor or array exactly;
    other values rounded to float32 first, as torch's ``.to(dtype)`` from float64 goes through it)."""
    what = "a 2-D array of numbers, one row per rank (e.g. [[1.0, 2.0], [3.0, 4.0]])"
    if isinstance(grads, torch.Tensor):
        if grads.is_complex() or grads.dtype == torch.bool or grads.device.type == "meta":
            raise TypeError(f"grads must be {what}, not a {str(grads.dtype).replace('torch.', '')} tensor")
        grads = grads.detach().cpu()
        arr = grads.numpy() if grads.dtype in (torch.float16, torch.float32, torch.float64) else \
            grads.double().numpy()
    elif isinstance(grads, (str, bytes, bytearray)):
        raise TypeError(f"grads must be {what}, not a string")
    else:
        try:
            arr = np.asarray(grads)
        except (ValueError, TypeError, OverflowError):
            raise ValueError(f"grads must be {what}, not {_shown(grads)}") from None
        if arr.dtype.name == "bfloat16":  # ml_dtypes
            arr = arr.astype(np.float32)
    if arr.dtype.kind == "O":
        try:
            arr = arr.astype(np.float64)
        except (TypeError, ValueError, OverflowError):
            raise TypeError(f"grads must be {what}, not {_shown(grads)}") from None
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"grads must be {what}, not {arr.dtype} values")
    if arr.ndim != 2:
        raise ValueError(f"grads must be 2-D, one row per rank and one column per element (got shape {arr.shape})")
    if arr.shape[0] < 1:
        raise ValueError("grads must have at least one row (one per rank)")
    with np.errstate(over="ignore"):  # beyond float32 is inf, as a cast makes it
        return arr.astype(np.float32)


def _rounded(fmt: FloatFormat, x32: np.ndarray) -> np.ndarray:
    """float32 values rounded to ``fmt`` (round to nearest even, overflow to inf), as torch's cast
    from float32 does; returned as float16 (fp16) or float32. A NaN keeps its sign in fp16
    (``c10::Half``: 0x7E00 | sign) and becomes the one positive NaN 0x7FC0 in bf16
    (``c10::BFloat16``'s ``round_to_nearest_even``)."""
    if fmt is FP32:
        return x32
    with np.errstate(invalid="ignore", over="ignore"):
        q = fmt.quantize(x32).astype(_DTYPES[fmt])
    if fmt is BF16:
        q[np.isnan(q)] = np.float32(np.nan)  # 0x7FC00000
    return q


def _add(fmt: FloatFormat, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``gloo::sum<T>``: ``c = a + b`` with T float, c10::Half or c10::BFloat16, i.e. a float32 add
    and, for the 16-bit types, one rounding of its result."""
    with np.errstate(invalid="ignore", over="ignore"):
        s = np.add(a.astype(np.float32), b.astype(np.float32))
    return _rounded(fmt, s)


def _round_up(value: int, multiple: int) -> int:
    return value if value % multiple == 0 else value + multiple - value % multiple


def _ring_layout(length: int, world_size: int, item: int) -> tuple[int, int]:
    """(elements per segment, segments per rank) of gloo's ring for ``length`` elements of ``item``
    bytes (``gloo/allreduce.cc``, ``ring``)."""
    total = length * item
    max_segment = item * max(1, GLOO_MAX_SEGMENT_BYTES // item)
    segments = _round_up(max(-(-total // max_segment), 2 * world_size), world_size)
    segment_bytes = _round_up(-(-total // segments), item)
    return segment_bytes // item, segments // world_size


#: The longest layout ``gloo_chunks`` gives, in elements (``gloo_summation_order``: elements x ranks).
MAX_LAYOUT = 2**24


def _length_args(length, world_size, dtype) -> tuple[int, int, FloatFormat]:
    length = _whole("length", length, 0, MAX_LAYOUT)
    world_size = _whole("world_size", world_size, 1, MAX_WORLD_SIZE)
    return length, world_size, _sum_format(dtype)


def _chunks(length: int, world_size: int, fmt: FloatFormat) -> np.ndarray:
    if length == 0:
        return np.zeros(0, np.int64)
    per_segment, per_rank = _ring_layout(length, world_size, fmt.bits // 8)
    return np.minimum(np.arange(length) // per_segment // per_rank, world_size - 1)


def gloo_chunks(length, world_size, dtype="float32") -> np.ndarray:
    """For each of ``length`` elements (at most ``MAX_LAYOUT``), the rank that owns it after gloo's
    reduce-scatter (its chunk): rank ``c`` sums chunk ``c``. Chunks follow gloo's segments (at least
    ``2 * world_size`` of them, none over 1 MiB), so they depend on the dtype's size and are uneven
    for some lengths."""
    return _chunks(*_length_args(length, world_size, dtype))


def gloo_summation_order(length, world_size, dtype="float32") -> np.ndarray:
    """The order in which gloo adds the ranks' values, element by element: an int array of shape
    (length, world_size) whose row ``i`` lists ranks, first to last (element ``i`` of chunk ``c`` is
    ``x[c-1] + ...``: ``c-1, c-2, ..., c`` mod world_size). ``world_size`` 1 is the value itself.
    At most ``MAX_LAYOUT`` entries (length x world_size)."""
    length, world_size, fmt = _length_args(length, world_size, dtype)
    if length * world_size > MAX_LAYOUT:
        raise ValueError(f"length x world_size must be at most {MAX_LAYOUT:,} (one rank per element and step), "
                         f"not {length * world_size:,}: at {world_size} ranks pass a length up to "
                         f"{MAX_LAYOUT // world_size:,}")
    steps = np.arange(1, world_size + 1)
    return (_chunks(length, world_size, fmt)[:, None] - steps[None, :]) % world_size


def allreduce(grads, dtype="float32", *, order="gloo") -> np.ndarray:
    """What every rank holds after ``dist.all_reduce(t, op=SUM)`` on gloo, when rank ``r``'s tensor
    is ``grads[r]`` in ``dtype`` (``"float32"``, ``"float16"`` or ``"bfloat16"``).

    ``grads``: one row per rank (a 2-D array, list or tensor); values are rounded to ``dtype`` first
    as ``torch.tensor(float32 values).to(dtype)`` does (other values through float32). Every length
    and world size is modelled (see ``gloo_chunks``); equal to real gloo bit for bit. (NaNs too in
    bfloat16, where every NaN is 0x7FC0; in float32 and float16 a NaN's sign, when two NaNs meet
    in an add, is the compiler's choice of operand order, so compare NaN as NaN there.) Returns
    float32 for float32 and bfloat16 (whose values float32 holds exactly), float16 for float16.

    ``order`` picks the summation: ``"gloo"`` (what gloo does) or a plausible wrong model:
    ``"rank"`` (``((x0 + x1) + x2) + ...``, rounding after each add), ``"tree"`` (pairwise:
    ``(x0 + x1) + (x2 + x3)``, rounding after each add), ``"once"`` (the float64 sum, rounded once, through float32).
    """
    fmt = _sum_format(dtype)
    if not isinstance(order, str) or order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(map(repr, ORDERS))}, not {_shown(order)}")
    x = _rounded(fmt, _grads(grads))
    world_size, length = x.shape
    if world_size > MAX_WORLD_SIZE:
        raise ValueError(f"grads must have at most {MAX_WORLD_SIZE} rows (ranks), not {world_size}")
    if world_size == 1 or length == 0:
        return x[0].copy()
    if order == "once":
        with np.errstate(invalid="ignore", over="ignore"):
            return _rounded(fmt, x.astype(np.float64).sum(axis=0).astype(np.float32))
    if order == "rank":
        acc = x[0]
        for r in range(1, world_size):
            acc = _add(fmt, acc, x[r])
        return acc
    if order == "tree":
        rows = list(x)
        while len(rows) > 1:
            rows = [_add(fmt, rows[i], rows[i + 1]) if i + 1 < len(rows) else rows[i]
                    for i in range(0, len(rows), 2)]
        return rows[0]
    chunk, cols = _chunks(length, world_size, fmt), np.arange(length)
    acc = x[(chunk - 1) % world_size, cols]  # the order of gloo_summation_order, a column at a time
    for k in range(2, world_size + 1):
        acc = _add(fmt, x[(chunk - k) % world_size, cols], acc)  # gloo: out = local + received
    return acc


def _allreduce_rank(rank: int, world_size: int, rows: np.ndarray, dtype: str) -> np.ndarray:
    import torch.distributed as dist

    t = torch.from_numpy(rows[rank].copy()).to(getattr(torch, dtype))
    dist.all_reduce(t)
    return t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()


def run_allreduce(grads, dtype="float32", *, timeout=60.0) -> np.ndarray:
    """The real thing: ``dist.all_reduce(t, SUM)`` on gloo with rank ``r``'s tensor ``grads[r]`` in
    ``dtype`` (one forked rank per row, as ``run_ranks`` starts them). Returns what each rank holds
    afterwards, shape (world_size, length): float32 for float32 and bfloat16, float16 for float16.
    ``allreduce(grads, dtype)`` models every row, bit for bit."""
    fmt = _sum_format(dtype)
    x = _grads(grads)
    if x.shape[0] > 16:
        raise ValueError(f"grads must have at most 16 rows for a real run (one process each), not {x.shape[0]}")
    if x.size > 2**26:
        raise ValueError(f"grads must have at most {2**26:,} values for a real run, not {x.size:,}")
    prewarm()
    return np.stack(run_ranks(_allreduce_rank, x.shape[0], x, fmt.torch_dtype, timeout=timeout))
