"""Loss scaling across ranks: real ``torch.distributed`` ranks from a notebook cell, gloo's all-reduce
bit for bit, and a multi-rank loss-scaler simulator held to real runs.

``ampviz/__init__.py`` never imports this module, so ``import ampviz`` stays free of torch.

* ``prewarm`` and ``run_ranks``: fork ``world_size`` rank processes (``mp.spawn`` cannot find a
  function defined in a notebook), each on one torch thread and in a gloo process group, run
  ``fn(rank, world_size, *args)`` in each and return their results. No rank process, nor anything
  it started, outlives the call: not when a rank raises, hangs past ``timeout`` or the caller is
  interrupted (every rank is then killed with its process group and reaped), nor when the parent
  dies (Linux: each rank asks the kernel to kill it then). ``prewarm()`` imports once, in the
  parent, what each rank would otherwise import on its first ``DistributedDataParallel``
  (``torch._dynamo``: seconds per rank).
* ``allreduce``: what every rank holds after ``dist.all_reduce(t, SUM)`` on gloo, for float32,
  float16 and bfloat16, bit for bit (NaN as NaN: its sign is not modelled). Gloo's ring
  (``gloo/allreduce.cc``, ``ring``) cuts the buffer into ``numSegments`` segments, at least
  ``2 * world_size`` and a multiple of it, none longer than 1 MiB; rank ``c`` ends up owning chunk
  ``c`` (``numSegments / world_size`` segments in a row), whose elements are summed in the order
  ranks ``c-1, c-2, ..., c`` (mod world_size), rounding to the tensor's dtype after every add
  (``gloo::sum<c10::Half>``/``<c10::BFloat16>``: a float32 add, then a round to nearest even).
  The all-gather then copies each owner's chunk to every rank. ``order=`` gives the plausible wrong
  models for comparison: ranks in order, a pairwise tree, one rounding of a float64 sum.
  ``gloo_chunks`` and ``gloo_summation_order`` show the layout; ``run_allreduce`` runs the real one.
* ``simulate_ranks``: per-rank loss scalers (``ampviz.scaling`` policies, e.g. ``TorchGradScaler``)
  over per-rank overflow flags or per-rank max |gradient|, with the found_inf flag shared (``"ddp"``:
  the gradient all-reduce comes before ``unscale_``, so an inf reaches every rank; ``"synced"``:
  the flag itself is all-reduced, as ``ShardedGradScaler`` does) or not (``"local"``: a scaler per
  rank on gradients never all-reduced, so the scales drift apart; ``"unscale_first"``: ``unscale_``
  and clipping on local gradients, then a manual all-reduce, so a rank whose own gradients were
  clean steps on the others' inf). Returns a ``RanksTrace``: per-rank scale, overflow, skip and
  step at every step.
* ``run_scaler_ranks``: the same scenarios run for real (``GradScaler("cpu")``, DDP,
  ``ShardedGradScaler``, FSDP1 with either scaler; gloo) on forked ranks, returning the same
  ``RanksTrace`` plus every rank's weights after every step.
* ``reduce_errors``: the error of an fp32, fp16 or bf16 all-reduce against the exact sum as the
  world grows (the model, with real gloo beside it); ``run_compress_hook`` and
  ``simulate_compress_hook``: DDP's ``fp16_compress_hook`` (and a bf16 one) under ``GradScaler``,
  real and predicted.
* ``run_lightning_ranks``: ``lightning.Trainer(accelerator="cpu")`` with DDP on the same forked
  ranks, with ``precision="16-mixed"`` (which Lightning turns into bf16 on the CPU) or the
  explicit fp16 plugin with a GradScaler.
* ``check_*``: notebook 11's exercise checkers.

Real runs are the reference: the tests hold ``allreduce`` to gloo and ``simulate_ranks`` to
``run_scaler_ranks`` step for step, and show that the plausible wrong models fail.
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing as mp
import os
import pickle
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import warnings
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import wait as _wait_for

import numpy as np
import torch

from ampviz.formats import BF16, FP16, FP32, FloatFormat, get_format
from ampviz.training.gradscaler import _step_indices
from ampviz.checks import Check, _number_text, _said, check
from ampviz.text import Table, measured, number
from ampviz.scaling import DynamicScaler, TorchGradScaler, overflows, simulate
from ampviz._args import _shown
from ampviz._args import _flag, _real, _whole

__all__ = [
    "RankError",
    "prewarm",
    "run_ranks",
    "allreduce",
    "run_allreduce",
    "ORDERS",
    "gloo_chunks",
    "gloo_summation_order",
    "MODES",
    "RanksTrace",
    "simulate_ranks",
    "RanksRun",
    "run_scaler_ranks",
    "same_trace",
    "ReduceErrors",
    "reduce_errors",
    "CompressTrace",
    "COMPRESS_HOOKS",
    "run_compress_hook",
    "simulate_compress_hook",
    "LightningRun",
    "run_lightning_ranks",
    "check_ddp_skips",
    "check_local_scales",
    "check_found_inf_op",
    "check_compress_share",
]

#: The most ranks ``run_ranks`` starts (each is a process on this machine).
MAX_WORLD_SIZE = 64
#: gloo's ``AllreduceOptions::kMaxSegmentSize`` (torch leaves it at the default): 1 MiB.
GLOO_MAX_SEGMENT_BYTES = 1 << 20
#: Ways ``allreduce`` can sum: gloo's ring (what gloo does) and three plausible wrong models.
ORDERS = ("gloo", "rank", "tree", "once")
#: How the ranks' scalers see overflows (see ``simulate_ranks``).
MODES = ("ddp", "synced", "local", "unscale_first")
#: The longest stream ``run_scaler_ranks`` runs for real (a few ms a step per rank).
MAX_REAL_STEPS = 200
#: The most steps ``simulate_ranks`` takes (times ranks); a table's rows are chosen as GradScaler's step tables
#: choose them (``ampviz.training.gradscaler._step_indices``).
MAX_SIM_CELLS = 50_000_000


# ============================================================================================
# Starting ranks
# ============================================================================================


class RankError(RuntimeError):
    """A rank raised (``rank``, ``error``: the exception's type name, ``remote_traceback``: its
    traceback as the rank printed it) or ended without a result."""

    def __init__(self, message: str, rank: int, error: str = "", remote_traceback: str = ""):
        super().__init__(message)
        self.rank = rank
        self.error = error
        self.remote_traceback = remote_traceback


_PREWARMED = False


def prewarm() -> float:
    """Import, once in this process, what each rank would otherwise import for itself: the
    distributed package, ``DistributedDataParallel``, its comm hooks, ``ShardedGradScaler`` and
    ``torch._dynamo`` (which the first ``DistributedDataParallel(...)`` in a process imports: several
    seconds, paid by every forked rank unless the parent paid it first). Call it in a lesson's setup
    cell. Returns the seconds it took (about 0 the second time)."""
    global _PREWARMED
    t0 = time.perf_counter()
    if not _PREWARMED:
        import torch._dynamo  # noqa: F401
        import torch.distributed  # noqa: F401
        import torch.distributed.algorithms.ddp_comm_hooks.default_hooks  # noqa: F401
        import torch.distributed.fsdp.sharded_grad_scaler  # noqa: F401
        import torch.nn.parallel  # noqa: F401
        _PREWARMED = True
    return time.perf_counter() - t0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - an exception whose str() fails is still named
        return ""


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "…"


def _die_with_parent(parent: int) -> None:
    """Linux: have the kernel kill this process when its parent dies (then the parent cannot leave a
    rank behind even if it is killed itself)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before prctl
        os._exit(1)


def _rank_main(rank: int, world_size: int, store: str, conn, fn, args: tuple, parent: int,
               timeout: float) -> None:
    """A forked rank: a process group of its own (what it starts is killed with it), one torch
    thread (fork-safety, and steadier timings), a gloo group, ``fn``, its result (or error) sent to
    the parent. Then it waits to be killed: a rank that left at once would close its connections
    under ranks still connecting to it ("connectFullMesh failed ... Connection closed by peer"),
    and a rank that raised would add the others' "connection closed" errors to its own."""
    stage = "init_process_group"
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and kills the ranks
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # held back by the parent while forking
        os.setpgid(0, 0)
        _die_with_parent(parent)
        torch.set_num_threads(1)
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout + 60))
        stage = "run"
        result = fn(rank, world_size, *args)
        stage = "return"
        data = pickle.dumps(("ok", result), protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException as exc:  # noqa: BLE001 - everything is reported to the parent
        data = pickle.dumps(("error", stage, type(exc).__name__, _one_line(_text(exc)), traceback.format_exc()))
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    try:
        conn.send_bytes(data)
    except OSError:  # the parent is gone
        os._exit(1)
    time.sleep(timeout + 60)
    os._exit(1)


@contextlib.contextmanager
def _interrupts_held():
    """Ctrl-C (SIGINT) in the block is held back, and raised as it would have been once the block
    ends: no fork is cut off from its bookkeeping, no killing of the ranks cut short. The calling
    thread blocks SIGINT (a rank starts with it blocked); whichever thread the signal reaches,
    Python runs its handler in the main thread, where a handler that only notes it stands in."""
    came = []
    previous = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if previous is not None:
        signal.signal(signal.SIGINT, lambda signum, frame: came.append(frame))
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # one pending now is noted now
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
            if came and callable(previous):
                previous(signal.SIGINT, came[0])
            elif came and previous == signal.SIG_DFL:
                signal.raise_signal(signal.SIGINT)


#: The longest ``timeout`` of ``run_ranks``, in seconds (about 31 years; the ranks' gloo timeouts
#: count nanoseconds in 64 bits, which hold 292 years).
MAX_TIMEOUT = 1e9


def run_ranks(fn, world_size, *args, timeout=60.0) -> list:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` forked rank processes joined in a gloo
    process group; return their results (picklable values), indexed by rank.

    Each rank is forked from this process (so ``fn`` may be defined in a notebook cell), sets
    ``torch.set_num_threads(1)`` first (a fork after a multi-threaded op could otherwise hang) and
    joins ``init_process_group("gloo", "file://<a temporary file>")`` (a ``FileStore``: a
    ``TCPStore`` asks the DNS for the name of every rank's address, 5 s more at 64 ranks where the
    resolver dropped some). Once every rank has returned, all are killed, each with its process
    group: whatever a rank started goes too.
    Every rank process is gone when this returns or raises: if a rank raises, the
    others are killed and ``RankError`` says ``rank 1 raised ValueError: ...`` (its traceback is in
    ``.remote_traceback``); if the ranks are not all done within ``timeout`` seconds (up to
    ``MAX_TIMEOUT``), all are killed and ``TimeoutError`` says which were still running; on Ctrl-C
    (KeyboardInterrupt) all are killed too. Call ``prewarm()`` once first: then 4 ranks start, run a
    few DDP steps and are joined in well under 2 s on 2 cores.
    """
    if not callable(fn):
        raise TypeError(f"fn must be a function fn(rank, world_size, *args), not {_shown(fn)}")
    world_size = _whole("world_size", world_size, 1, MAX_WORLD_SIZE)
    timeout = _real("timeout", timeout)
    if not 0 < timeout <= MAX_TIMEOUT:
        raise ValueError(f"timeout must be a number of seconds above 0 and at most 1e9, such as 60, not "
                         f"{_shown(timeout)}")
    if not hasattr(os, "fork"):
        raise RuntimeError("run_ranks forks its ranks, and this platform has no fork (use Linux or macOS)")
    if torch.cuda.is_initialized():
        raise RuntimeError("run_ranks forks its ranks, which is unsafe once CUDA is initialised in this "
                           "process; start the ranks before any CUDA call")
    deadline = time.monotonic() + timeout
    for stream in (sys.stdout, sys.stderr):  # else each rank inherits what is buffered, and prints it again
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a stream that cannot flush has nothing to pass on
            pass
    parent, folder, pids, conns = os.getpid(), None, [], []
    try:
        folder = tempfile.mkdtemp(prefix="ampviz-ranks-")  # in the try: a Ctrl-C now still removes it
        with _interrupts_held(), warnings.catch_warnings():  # Python >= 3.12 warns about fork with threads
            warnings.filterwarnings("ignore", message=".*multi-threaded.*fork", category=DeprecationWarning)
            for rank in range(world_size):
                recv, send = mp.Pipe(duplex=False)
                conns.append(recv)
                pid = os.fork()
                if pid == 0:
                    try:
                        _rank_main(rank, world_size, os.path.join(folder, "store"), send, fn, args, parent, timeout)
                    finally:
                        os._exit(1)
                pids.append(pid)
                send.close()
                try:
                    os.setpgid(pid, pid)  # the rank does it too: whichever comes first
                except OSError:
                    pass
        return _collect(pids, conns, deadline, timeout)
    finally:
        with _interrupts_held():
            _reap(pids, conns)
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)


def _exit_code(pid: int, wait: float = 0.0):
    """A rank's exit code (minus the signal that killed it), or None while it runs (at most
    ``wait`` seconds more). Linux leaves it unreaped, so that its process group id is not reused
    before ``_reap`` kills the group; macOS has no ``os.waitid``, and reaps it."""
    end = time.monotonic() + wait
    while True:
        if hasattr(os, "waitid"):
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            code = None if info is None else info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        else:
            done, status = os.waitpid(pid, os.WNOHANG)
            code = os.waitstatus_to_exitcode(status) if done else None
        if code is not None or time.monotonic() >= end:
            return code
        time.sleep(0.01)


def _collect(pids, conns, deadline: float, timeout: float) -> list:
    n = len(pids)
    results = [None] * n
    pending = set(range(n))
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            ranks = sorted(pending)
            which = f"rank {ranks[0]} was" if len(ranks) == 1 else \
                f"ranks {', '.join(map(str, ranks))} were"
            raise TimeoutError(f"{which} still running after {number(timeout)} s: killed all {n} rank processes")
        # short waits: a Ctrl-C that another thread took is raised within one, and a rank that ended
        # is seen even when a process it started holds its pipe open
        _wait_for([conns[r] for r in pending], timeout=min(left, 0.1))
        errors = []
        for r in sorted(pending):
            code = _exit_code(pids[r])  # first: what a rank sent before it ended is in its pipe
            if conns[r].poll():
                try:
                    msg = pickle.loads(conns[r].recv_bytes())
                except EOFError:
                    msg = None
                except Exception as exc:  # noqa: BLE001 - a result this process cannot unpickle
                    raise RankError(f"rank {r} returned a result that cannot be unpickled here: "
                                    f"{type(exc).__name__}: {_one_line(exc)}", r, type(exc).__name__) from None
            elif code is None:
                continue
            else:
                msg = None
            pending.discard(r)
            if msg is None:
                code = _exit_code(pids[r], 1.0) if code is None else code
                how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
                errors.append(RankError(f"rank {r} {how} without returning a result", r))
            elif msg[0] == "ok":
                results[r] = msg[1]
            else:
                _, stage, name, text, tb = msg
                where = {"init_process_group": " in init_process_group", "run": "",
                         "return": " returning its result (it must be picklable)"}[stage]
                errors.append(RankError(f"rank {r} raised {name}{where}: {text}", r, name, tb))
        if errors:  # a rank that died first: the others' errors may only be its closed connections
            raise min(errors, key=lambda e: (e.error != "", e.rank))
    return results


def _reap(pids, conns) -> None:
    """Kill every rank with its process group (whatever it started), and reap them (no zombie)."""
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:  # not a group leader (yet): the rank alone
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    for c in conns:
        c.close()


# ============================================================================================
# gloo's all-reduce, bit for bit
# ============================================================================================

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


# ============================================================================================
# Loss scalers across ranks: the simulator
# ============================================================================================


@dataclass(frozen=True, eq=False)
class RanksTrace:
    """Per-rank loss scalers over a run: arrays of shape (world_size, steps), row ``r`` for rank ``r``.

    ``scale``: the scale each rank's step used (before its update; float32 values, NaN after a run
    the policy ended); ``overflow``: the rank's own gradients were not finite (before any all-reduce;
    with FSDP, its shard after the reduce-scatter; a rank whose weights went non-finite overflows at
    every later step); ``found_inf``: the rank's
    scaler skipped the step (it saw an inf, or its run had ended); ``stepped``: the rank's optimizer
    step ran (``~found_inf``); ``nonfinite_step``: it ran on gradients that were not finite (the
    all-reduce brought another rank's inf after this rank's own check: its weights are now
    inf/NaN); ``final_scale``: each rank's scale after the last step. ``mode`` and ``policy`` say how
    it was made (``simulate_ranks``) or measured (``run_scaler_ranks``).
    """

    mode: str
    policy: DynamicScaler
    scale: np.ndarray
    overflow: np.ndarray
    found_inf: np.ndarray
    stepped: np.ndarray
    nonfinite_step: np.ndarray
    final_scale: np.ndarray

    @property
    def world_size(self) -> int:
        return int(self.scale.shape[0])

    @property
    def steps(self) -> int:
        return int(self.scale.shape[1])

    @property
    def skipped_count(self) -> np.ndarray:
        """Skipped steps per rank."""
        return self.found_inf.sum(axis=1)

    @property
    def scales_agree(self) -> np.ndarray:
        """Per step: every rank used the same scale (NaN equal to NaN)."""
        s = self.scale
        same = (s == s[:1]) | (np.isnan(s) & np.isnan(s[:1]))
        return same.all(axis=0)

    @property
    def first_divergence(self) -> int | None:
        """The first step at which the ranks' scales differ, or None."""
        bad = np.flatnonzero(~self.scales_agree)
        return int(bad[0]) if bad.size else None

    @property
    def poisoned_at(self) -> tuple:
        """Per rank: the first step it took on non-finite gradients, or None."""
        return tuple(int(np.argmax(row)) if row.any() else None for row in self.nonfinite_step)

    def table(self, steps=None) -> Table:
        """Step by step, each rank's scale and what its optimizer did (``stepped``, ``skipped``,
        ``stepped on inf/NaN``). ``steps``: step indices to show (the first 20 by default)."""
        idx = _step_indices(steps, self.steps)
        rows = []
        for t in idx:
            cells = [t]
            for r in range(self.world_size):
                did = ("stepped on inf/NaN" if self.nonfinite_step[r, t] else
                       "stepped" if self.stepped[r, t] else
                       "skipped (the run had ended)" if np.isnan(self.scale[r, t]) else "skipped")
                cells.append(f"{number(self.scale[r, t])} {did}" + (" (own overflow)" if self.overflow[r, t]
                                                                      and not self.nonfinite_step[r, t] else ""))
            rows.append(cells)
        return Table(("step", *(f"rank {r}: scale, optimizer" for r in range(self.world_size))), rows,
                     title=f"{self.mode}: {self.world_size} ranks")

    def __repr__(self) -> str:
        div = self.first_divergence
        final = ", ".join(number(s) for s in self.final_scale)
        return (f"RanksTrace({self.mode}: {self.world_size} ranks, {self.steps} steps, skipped per rank "
                f"{self.skipped_count.tolist()}, final scales [{final}]"
                + (f", scales differ from step {div}" if div is not None else "")
                + (f", poisoned at {list(self.poisoned_at)}" if self.nonfinite_step.any() else "") + ")")


def _pattern_rows(values):
    """Rows given as patterns (``"..x.."``: x an overflow) become booleans."""
    if isinstance(values, (list, tuple)) and values and all(isinstance(v, str) for v in values):
        rows = []
        for v in values:
            chars = [c for c in v if not c.isspace()]
            bad = sorted({c for c in chars if c not in "x."})
            if bad:
                raise ValueError(f"a found_inf pattern uses x (overflow) and . (clean step) only, "
                                 f"not {_shown(''.join(bad))}")
            rows.append([c == "x" for c in chars])
        if len({len(r) for r in rows}) > 1:
            raise ValueError("found_inf patterns must all have the same number of steps")
        return np.array(rows, dtype=bool).reshape(len(rows), -1)
    return values


def _rank_flags(found_inf) -> np.ndarray:
    what = "booleans, one row per rank and one column per step (or patterns such as ['..x.', '....'])"
    found_inf = _pattern_rows(found_inf)
    if isinstance(found_inf, torch.Tensor):
        if found_inf.is_complex() or found_inf.device.type == "meta":
            raise TypeError(f"found_inf must be {what}, not {_shown(found_inf)}")
        found_inf = found_inf.detach().cpu().double().numpy() if found_inf.is_floating_point() else \
            found_inf.detach().cpu().numpy()
    if isinstance(found_inf, (str, bytes, bytearray)):
        raise TypeError(f"found_inf must be {what}, not a string")
    try:
        arr = np.asarray(found_inf)
    except (ValueError, TypeError, OverflowError):
        raise ValueError(f"found_inf must be {what}, not {_shown(found_inf)}") from None
    if arr.ndim != 2:
        raise ValueError(f"found_inf must be 2-D, one row per rank and one column per step (got shape {arr.shape})")
    if arr.dtype.kind == "b":
        return arr.astype(bool)
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"found_inf must be {what}, not {arr.dtype} values")
    bad = ~((arr == 0) | (arr == 1))
    if bad.any():
        r, t = (int(v) for v in np.argwhere(bad)[0])
        raise ValueError(f"found_inf must be True/False (or 1/0) everywhere; rank {r}, step {t} is "
                         f"{arr[r, t].item()!r}")
    return arr == 1


def _rank_gradients(grad_max) -> np.ndarray:
    what = "numbers, one row per rank and one column per step (each rank's largest |gradient|)"
    if isinstance(grad_max, torch.Tensor):
        if grad_max.is_complex() or grad_max.dtype == torch.bool or grad_max.device.type == "meta":
            raise TypeError(f"grad_max must be {what}, not a {str(grad_max.dtype).replace('torch.', '')} tensor")
        grad_max = grad_max.detach().cpu().double().numpy()
    if isinstance(grad_max, (str, bytes, bytearray)):
        raise TypeError(f"grad_max must be {what}, not a string")
    try:
        arr = np.asarray(grad_max)
    except (ValueError, TypeError, OverflowError):
        raise ValueError(f"grad_max must be {what}, not {_shown(grad_max)}") from None
    if arr.dtype.kind == "b":
        raise TypeError("grad_max must be numbers (each rank's largest |gradient| per step), not booleans; "
                        "give overflow flags as found_inf=")
    if arr.dtype.kind == "O":
        try:
            arr = arr.astype(np.float64)
        except (TypeError, ValueError, OverflowError):
            raise TypeError(f"grad_max must be {what}, not {_shown(grad_max)}") from None
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"grad_max must be {what}, not {arr.dtype} values")
    if arr.ndim != 2:
        raise ValueError(f"grad_max must be 2-D, one row per rank and one column per step (got shape {arr.shape})")
    with np.errstate(over="ignore"):
        return np.abs(arr.astype(np.float64))


def _stream(found_inf, grad_max):
    if (found_inf is None) == (grad_max is None):
        raise ValueError("give exactly one of found_inf (per rank and step: did its gradients overflow?) "
                         "or grad_max (per rank and step: its largest |gradient|)")
    arr = _rank_flags(found_inf) if found_inf is not None else _rank_gradients(grad_max)
    if arr.shape[0] < 1:
        raise ValueError("give at least one rank (one row)")
    if arr.shape[0] > MAX_WORLD_SIZE:
        raise ValueError(f"give at most {MAX_WORLD_SIZE} ranks (rows), not {arr.shape[0]}")
    if arr.size > MAX_SIM_CELLS:
        raise ValueError(f"ranks x steps must be at most {MAX_SIM_CELLS:,}, not {arr.size:,}")
    return arr, found_inf is not None


def _mode(mode) -> str:
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, MODES))}, not {_shown(mode)}")
    return mode


def simulate_ranks(policy: DynamicScaler, *, found_inf=None, grad_max=None, mode="ddp", fmt=FP16,
                   loss_dtype="float32") -> RanksTrace:
    """Every rank's loss scaler over a run, as ``mode`` lets them see overflows.

    Give per rank and step either ``found_inf`` (booleans, shape (world_size, steps), or patterns
    such as ``["..x..", "....."]``: whether that rank's own backward overflowed) or ``grad_max``
    (its largest unscaled |gradient|; it overflows as ``ampviz.scaling.overflows(scale, g, fmt,
    loss_dtype)`` says at that rank's own scale). Each rank runs ``policy`` (e.g.
    ``TorchGradScaler(init_scale=1024)``). ``mode``:

    * ``"ddp"``: the gradients are all-reduced before ``unscale_`` (DDP's backward): any rank's inf
      is in every rank's gradients, so every scaler skips and backs off together.
    * ``"synced"``: the found_inf flag itself is all-reduced (``ShardedGradScaler``, or an
      ``all_reduce(found_inf, MAX)`` after ``unscale_``): the same decisions as ``"ddp"``.
    * ``"local"``: a scaler per rank on its own gradients, which are never all-reduced (local SGD;
      also FSDP1 with a plain GradScaler, if each row says whether that rank's *shard* has an inf):
      each rank skips on its own overflows only, so the scales drift apart.
    * ``"unscale_first"``: ``unscale_`` (and clipping) on local gradients, then a manual all-reduce,
      then ``step``: a rank whose own gradients were clean does not skip, yet steps on the
      all-reduced inf (``nonfinite_step``); its weights are then inf/NaN, so its gradients overflow
      at every later step.
    """
    if not isinstance(policy, DynamicScaler):
        raise TypeError(f"policy must be a DynamicScaler (e.g. TorchGradScaler()), got {_shown(policy)}")
    mode = _mode(mode)
    arr, flags_given = _stream(found_inf, grad_max)
    fmt = get_format(fmt)
    overflows(1.0, 1.0, fmt, loss_dtype)  # checks fmt (one with inf) and loss_dtype
    if mode == "unscale_first":
        return _unscale_first(policy, arr, flags_given, fmt, loss_dtype)
    return _fast(policy, mode, arr, flags_given, fmt, loss_dtype)


def _trace(policy, mode, traces, overflow, nonfinite=None) -> RanksTrace:
    scale = np.stack([t.scale.astype(np.float64) for t in traces])
    skipped = np.stack([t.skipped for t in traces])
    final = np.array([t.final.scale if not t.final.stopped else math.nan for t in traces], np.float64)
    if nonfinite is None:
        nonfinite = np.zeros_like(skipped)
    return RanksTrace(mode, policy, scale, overflow, skipped, ~skipped, nonfinite, final)


def _fast(policy, mode, arr, flags_given, fmt, loss_dtype) -> RanksTrace:
    """``"ddp"``, ``"synced"`` and ``"local"`` with ``ampviz.scaling.simulate`` (one stream per
    rank, or one shared stream: by monotone rounding the largest |gradient| decides)."""
    world_size = arr.shape[0]
    if mode == "local":
        traces = [simulate(policy, found_inf=row) if flags_given else
                  simulate(policy, grad_max=row, fmt=fmt, loss_dtype=loss_dtype) for row in arr]
        if flags_given:
            over = arr.copy()
        else:
            with np.errstate(invalid="ignore", over="ignore"):
                over = np.stack([overflows(t.scale.astype(np.float64), row, fmt, loss_dtype)
                                 for t, row in zip(traces, arr)])
        return _trace(policy, mode, traces, over)
    if flags_given:
        shared = simulate(policy, found_inf=arr.any(axis=0))
        over = arr.copy()
    else:
        with np.errstate(invalid="ignore"):
            worst = np.where(np.isnan(arr).any(axis=0), np.nan, arr.max(axis=0, initial=0.0))
        shared = simulate(policy, grad_max=worst, fmt=fmt, loss_dtype=loss_dtype)
        with np.errstate(invalid="ignore", over="ignore"):
            over = overflows(shared.scale.astype(np.float64)[None, :], arr, fmt, loss_dtype)
    return _trace(policy, mode, [shared] * world_size, over)


def _unscale_first(policy, arr, flags_given, fmt, loss_dtype) -> RanksTrace:
    """``"unscale_first"`` from ``"local"`` (the step loop's trace, bit for bit): no rank is
    poisoned before the first step where some rank overflows and another steps, on the all-reduced
    inf; from there on a poisoned rank overflows at every step, so each rank is "local" up to its
    first step taken from then on (on inf/NaN), and overflows at every step after it."""
    local = _fast(policy, "local", arr, flags_given, fmt, loss_dtype)
    steps = arr.shape[1]
    stepped = ~local.found_inf
    hit = np.flatnonzero(local.overflow.any(axis=0) & stepped.any(axis=0))
    scale, over, skipped, final = local.scale, local.overflow, local.found_inf, local.final_scale
    nonfinite, tails = np.zeros_like(skipped), {}  # ranks poisoned at one step in one state share a tail
    for r in range(arr.shape[0]) if hit.size else ():
        later = np.flatnonzero(stepped[r, hit[0]:])
        if not later.size:
            continue
        t = int(hit[0] + later[0])  # its step on inf/NaN
        nonfinite[r, t] = True
        head = {"found_inf": arr[r, :t + 1]} if flags_given else {"grad_max": arr[r, :t + 1], "fmt": fmt,
                                                                     "loss_dtype": loss_dtype}
        state = simulate(policy, **head).final
        if (t, state) not in tails:
            tails[t, state] = simulate(policy, found_inf=np.ones(steps - t - 1, bool), state=state)
        tail = tails[t, state]
        scale[r, t + 1:], skipped[r, t + 1:], over[r, t + 1:] = tail.scale, tail.skipped, True
        final[r] = tail.final.scale if not tail.final.stopped else math.nan
    return RanksTrace("unscale_first", policy, scale, over, skipped, ~skipped, nonfinite, final)


def _step_loop(policy, mode, arr, flags_given, fmt, loss_dtype) -> RanksTrace:
    """Step by step, every rank's state machine, for any mode: the reference that the tests hold
    the fast paths to."""
    world_size, steps = arr.shape
    states = [policy.initial_state() for _ in range(world_size)]
    scale = np.full((world_size, steps), np.nan)
    over = np.zeros((world_size, steps), bool)
    skipped = np.zeros((world_size, steps), bool)
    nonfinite = np.zeros((world_size, steps), bool)
    poisoned = np.zeros(world_size, bool)
    for t in range(steps):
        if poisoned.all():  # from here every rank overflows at every step: no coupling is left
            for r in range(world_size):
                tail = simulate(policy, found_inf=np.ones(steps - t, bool), state=states[r])
                scale[r, t:] = tail.scale
                skipped[r, t:] = tail.skipped
                states[r] = tail.final
            over[:, t:] = True
            break
        s = np.array([st.scale if not st.stopped else math.nan for st in states])
        if flags_given:
            own = arr[:, t].copy()
        else:
            with np.errstate(invalid="ignore", over="ignore"):
                own = np.asarray(overflows(s, arr[:, t], fmt, loss_dtype), bool)
        own |= poisoned
        shared = own.any()
        seen = np.full(world_size, shared) if mode in ("ddp", "synced") else own
        for r in range(world_size):
            st = states[r]
            scale[r, t] = s[r]
            if st.stopped:
                skipped[r, t] = True
                continue
            new = policy._adjust(st, bool(seen[r]))
            skipped[r, t] = bool(seen[r]) or new.stopped
            states[r] = new
        over[:, t] = own
        if mode == "unscale_first":
            nonfinite[:, t] = ~skipped[:, t] & shared
            poisoned |= nonfinite[:, t]
    final = np.array([st.scale if not st.stopped else math.nan for st in states], np.float64)
    return RanksTrace(mode, policy, scale, over, skipped, ~skipped, nonfinite, final)


def same_trace(a: RanksTrace, b: RanksTrace, *, overflow: bool = True) -> bool:
    """True when two traces agree step for step: scales (NaN equal to NaN), skips, steps on
    non-finite gradients, final scales, and (``overflow=True``) each rank's own overflows."""
    for name, x in (("a", a), ("b", b)):
        if not isinstance(x, RanksTrace):
            raise TypeError(f"{name} must be a RanksTrace (simulate_ranks or run_scaler_ranks), not {_shown(x)}")
    _flag("overflow", overflow)
    if a.scale.shape != b.scale.shape:
        return False

    def same(x, y):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        return bool(np.all((x == y) | (np.isnan(x) & np.isnan(y))))

    return (same(a.scale, b.scale) and same(a.final_scale, b.final_scale)
            and np.array_equal(a.found_inf, b.found_inf) and np.array_equal(a.nonfinite_step, b.nonfinite_step)
            and (not overflow or np.array_equal(a.overflow, b.overflow)))


# ============================================================================================
# The same scenarios, run for real
# ============================================================================================


@dataclass(frozen=True, eq=False)
class RanksRun:
    """A real multi-rank run: ``trace`` (a ``RanksTrace`` of what each rank's real scaler did, to
    compare with ``simulate_ranks``) and ``weights``, every rank's flattened weights before the
    first step and after each step (shape (world_size, steps + 1, n), float32)."""

    trace: RanksTrace
    weights: np.ndarray

    @property
    def weights_identical(self) -> np.ndarray:
        """Per step (and before the first): every rank's weights are bitwise identical."""
        bits = self.weights.view(np.uint32)
        return (bits == bits[:1]).all(axis=(0, 2))

    @property
    def weights_spread(self) -> np.ndarray:
        """Per step: max over ranks and weights of |w_rank - w_rank0| (NaN once a weight is NaN)."""
        with np.errstate(invalid="ignore"):
            d = np.abs(self.weights.astype(np.float64) - self.weights[:1].astype(np.float64))
        return np.where(np.isnan(d).any(axis=(0, 2)), np.nan, np.nanmax(d, axis=(0, 2), initial=0.0))

    @property
    def weights_finite(self) -> np.ndarray:
        """(world_size, steps + 1): every weight of that rank is finite."""
        return np.isfinite(self.weights).all(axis=2)

    def __repr__(self) -> str:
        return f"RanksRun({self.trace!r}, weights identical at the end: {bool(self.weights_identical[-1])})"


#: The highest scale a ``found_inf`` run may reach (its MLP's clean steps overflow from about 2^16).
MLP_MAX_SCALE = 2.0**14
_SPIKE = 2.0**20  # an input this large overflows the fp16 forward (inf), whatever the scale


def _batch(seed: int, rank: int, step: int):
    g = torch.Generator().manual_seed(((seed * 1_000_003) + rank * 10_007 + step) % 2**63)
    x = torch.randn(16, 8, generator=g)
    return x, x[:, :1] - 0.5 * x[:, 1:2]


class _Probe(torch.nn.Module):
    """A layer whose scaled gradient is exactly ``f32(f16(f32(scale * g)))`` for a given ``g``
    (backward through an fp16 cast of the weights, as autocast's casts do), and NaN once the weights
    are NaN, as a network's gradients are."""

    def __init__(self, n: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(n))

    def forward(self, g):
        z = self.weight.half().float()
        return (z * g).sum() + (z * z).sum() * 0.0


_PROBE_PATTERN = (1.0, -0.5, 0.25, -0.125)


_PROBE_CLEAN = 2.0**-7  # a probe's |gradient| at a clean step of a found_inf stream


def _scaler_rank(rank: int, world_size: int, mode: str, stream: np.ndarray, flags_given: bool, fsdp: bool,
                 settings: dict, seed: int, lr: float, max_norm: float) -> dict:
    """One rank of ``run_scaler_ranks`` (runs in a forked rank)."""
    import torch.distributed as dist

    torch.manual_seed(seed)  # the same initial weights on every rank
    probe = fsdp or not flags_given
    if probe:
        width = len(_PROBE_PATTERN)
        model = _Probe(width * (world_size if fsdp else 1))
        region = slice(width * rank, width * (rank + 1)) if fsdp else slice(0, width)  # FSDP: this rank's shard
    else:
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    net = model
    local_finite = []
    if fsdp:
        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

        with warnings.catch_warnings():  # one rank: FSDP says it falls back to NO_SHARD, as intended
            warnings.filterwarnings("ignore", message="FSDP is switching to use `NO_SHARD`", category=UserWarning)
            net = FullyShardedDataParallel(model, device_id=torch.device("cpu"),
                                           sharding_strategy=ShardingStrategy.FULL_SHARD)
    elif mode == "ddp":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        from torch.nn.parallel import DistributedDataParallel

        def recording_hook(state, bucket):  # the local gradients, before DDP's all-reduce
            local_finite.append(bool(torch.isfinite(bucket.buffer()).all()))
            return allreduce_hook(state, bucket)

        net = DistributedDataParallel(model)
        net.register_comm_hook(None, recording_hook)
    params = list(net.parameters())  # FSDP: this rank's flat shard
    opt = torch.optim.SGD(params, lr=lr)
    calls = []
    real_step = opt.step

    def counted_step(*a, **k):
        calls.append(1)
        return real_step(*a, **k)

    opt.step = counted_step
    if mode == "synced":
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        scaler = ShardedGradScaler("cpu", **settings)
    else:
        scaler = torch.amp.GradScaler("cpu", **settings)

    def weights():
        if fsdp:
            with FullyShardedDataParallel.summon_full_params(net):
                return model.weight.detach().clone()
        return torch.cat([p.detach().reshape(-1) for p in params]).clone()

    steps = stream.shape[1]
    scale = np.empty(steps)
    over = np.zeros(steps, bool)
    stepped = np.zeros(steps, bool)
    nonfinite = np.zeros(steps, bool)
    history = [weights()]
    pattern = torch.tensor(_PROBE_PATTERN)
    for t in range(steps):
        opt.zero_grad(set_to_none=True)
        scale[t] = scaler.get_scale()
        if probe:
            value = float(stream[rank, t]) if not flags_given else (math.inf if stream[rank, t] else _PROBE_CLEAN)
            g = torch.zeros(model.weight.numel())
            g[region] = torch.tensor(value, dtype=torch.float32) * pattern
            loss = net(g)
        else:
            x, y = _batch(seed, rank, t)
            if stream[rank, t]:
                x = x * _SPIKE
            with torch.autocast("cpu", dtype=torch.float16):
                out = net(x)
            loss = torch.nn.functional.mse_loss(out.float(), y)
        local_finite.clear()
        scaler.scale(loss).backward()
        grads = [p.grad for p in params if p.grad is not None]
        if mode == "ddp" and not fsdp:
            over[t] = not all(local_finite)
        else:  # FSDP: this rank's shard, after the reduce-scatter
            over[t] = not all(bool(torch.isfinite(gr).all()) for gr in grads)
        if mode in ("unscale_first", "synced") and not fsdp:
            scaler.unscale_(opt)  # ShardedGradScaler all-reduces found_inf here
            torch.nn.utils.clip_grad_norm_(params, max_norm)
            for gr in grads:
                dist.all_reduce(gr)
                gr /= world_size
        reduced_finite = all(bool(torch.isfinite(gr).all()) for gr in grads)
        before = len(calls)
        scaler.step(opt)  # ShardedGradScaler (FSDP): its unscale_ all-reduces found_inf
        scaler.update()
        stepped[t] = len(calls) > before
        nonfinite[t] = stepped[t] and not reduced_finite
        history.append(weights())
    return {"scale": scale, "overflow": over, "stepped": stepped, "nonfinite": nonfinite,
            "final": float(scaler.get_scale()), "weights": torch.stack(history).numpy()}


def run_scaler_ranks(mode="ddp", *, found_inf=None, grad_max=None, fsdp=False, init_scale=1024.0,
                     growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, seed=0, lr=0.01, max_norm=1.0,
                     timeout=60.0) -> RanksRun:
    """Run a ``simulate_ranks`` scenario for real: one forked rank per row, gloo, CPU.

    Each rank trains with the real ``torch.amp.GradScaler("cpu", init_scale=..., growth_factor=...,
    backoff_factor=..., growth_interval=...)`` (``ShardedGradScaler`` in ``"synced"`` mode) and SGD:

    * ``found_inf`` (per rank and step): a small MLP (8-16-1, the same initial weights on every
      rank) under ``autocast("cpu", float16)`` with MSE loss on the rank's own seeded batches; where
      a flag is set the batch is multiplied by 2^20, so the fp16 forward overflows and every gradient
      is inf/NaN (whatever the scale); elsewhere the gradients stay finite at the scales allowed here
      (at most 2^14).
    * ``grad_max`` (per rank and step): a probe layer whose gradient is exactly
      ``g * [1, -0.5, 0.25, -0.125]`` with ``g`` that value, scaled and cast to fp16 on its way back
      (so it overflows exactly when ``overflows(scale, g, "fp16")`` says), and NaN once its weights
      are NaN.

    ``mode``: ``"ddp"`` wraps the model in ``DistributedDataParallel`` (a comm hook records each
    rank's local gradients before the all-reduce); ``"local"`` never all-reduces; ``"unscale_first"``
    runs ``unscale_``, ``clip_grad_norm_(max_norm)``, then ``dist.all_reduce`` of each gradient (and
    divides by world_size) before ``step``; ``"synced"`` does the same with ``ShardedGradScaler``,
    whose ``unscale_`` all-reduces found_inf.

    ``fsdp=True``: FSDP1 (``FullyShardedDataParallel``, FULL_SHARD) over a probe of 4 weights per
    rank, rank ``r``'s shard being weights ``4r`` to ``4r + 3``; each row then says what reaches that
    rank's *shard* (its own gradient, put in its shard's region, whose reduce-scatter carries it
    there): an inf (``found_inf``) or a largest |gradient| (``grad_max``). ``mode="local"`` is FSDP1
    with a plain GradScaler (each rank judges its own shard: the scales drift apart and a skip on one
    rank leaves the model half-updated); ``mode="synced"`` is FSDP1 with ``ShardedGradScaler`` (the
    flag is all-reduced: every rank skips). ``trace.overflow`` is then the shard's inf, after the
    reduce-scatter.

    Returns a ``RanksRun``; ``simulate_ranks`` with the same arguments must give the same ``trace``
    (``same_trace``). At most ``MAX_REAL_STEPS`` steps and 8 ranks.
    """
    mode = _mode(mode)
    fsdp = _flag("fsdp", fsdp)
    if fsdp and mode not in ("local", "synced"):
        raise ValueError(f"with fsdp=True give mode='local' (FSDP1 with a plain GradScaler) or 'synced' "
                         f"(with ShardedGradScaler), not {mode!r}")
    arr, flags_given = _stream(found_inf, grad_max)
    if arr.shape[1] > MAX_REAL_STEPS:
        raise ValueError(f"give at most {MAX_REAL_STEPS} steps for a real run (simulate_ranks runs "
                         f"millions), not {arr.shape[1]}")
    settings = {"init_scale": _real("init_scale", init_scale), "growth_factor": _real("growth_factor", growth_factor),
                "backoff_factor": _real("backoff_factor", backoff_factor),
                "growth_interval": _whole("growth_interval", growth_interval, 1, 2**31 - 1)}
    policy = TorchGradScaler(**settings)  # checks them as GradScaler does
    if not (0 < settings["init_scale"] <= 2.0**24):
        raise ValueError(f"init_scale must be above 0 and at most 2^24 for these runs, not {_shown(init_scale)}")
    if mode == "synced":  # ShardedGradScaler's CPU update: float32 tensor arithmetic, no finite check
        policy = DynamicScaler(name="sharded", arithmetic="float32", inf_guard=False, **settings,
                               source="torch/distributed/fsdp/sharded_grad_scaler.py")
    seed = _whole("seed", seed, 0, 2**31)
    lr = _real("lr", lr)
    max_norm = _real("max_norm", max_norm)
    if not (lr >= 0 and math.isfinite(lr)):
        raise ValueError(f"lr must be a finite number >= 0, not {_shown(lr)}")
    if not (max_norm > 0):
        raise ValueError(f"max_norm must be a positive number, not {_shown(max_norm)}")
    world_size = arr.shape[0]
    if world_size > 8:
        raise ValueError(f"give at most 8 ranks (rows) for a real run, not {world_size}")
    if flags_given:  # the highest scale the run can reach: every step clean
        top = np.nanmax(simulate(policy, found_inf=np.zeros(arr.shape[1] + 1, bool)).scale, initial=0.0)
        if top > MLP_MAX_SCALE:
            raise ValueError(f"with found_inf the scale must stay at most 2^14 (this MLP's clean steps overflow "
                             f"from about 2^16), but init_scale={number(settings['init_scale'])} could grow to "
                             f"{number(top)} in {arr.shape[1]} steps: use a smaller init_scale or a longer "
                             f"growth_interval")
    prewarm()
    stream = arr.astype(np.float32) if not flags_given else arr
    out = run_ranks(_scaler_rank, world_size, mode, stream, flags_given, fsdp, settings, seed, lr, max_norm,
                    timeout=timeout)
    stepped = np.stack([o["stepped"] for o in out])
    trace = RanksTrace(mode, policy, np.stack([o["scale"] for o in out]), np.stack([o["overflow"] for o in out]),
                       ~stepped, stepped, np.stack([o["nonfinite"] for o in out]),
                       np.array([o["final"] for o in out]))
    return RanksRun(trace, np.stack([o["weights"] for o in out]))


# ============================================================================================
# Reduce precision: the error of a low-precision all-reduce, and the fp16 compress hook
# ============================================================================================


def _relative_error(got, exact: np.ndarray) -> float:
    d = np.asarray(got, np.float64) - exact
    return float(np.linalg.norm(d) / np.linalg.norm(exact))


@dataclass(frozen=True, eq=False)
class ReduceErrors:
    """The relative L2 error of an all-reduce SUM in each dtype against the exact (float64) sum of
    the same float32 gradients, per world size: ``error[dtype]`` (one value per world size, from
    ``allreduce``, gloo bit for bit), ``floor[dtype]`` (one rounding of the exact sum: the best any
    order can do), and ``real_equal[(dtype, world_size)]``: real gloo gave every rank the model's
    bits (for the world sizes run for real)."""

    world_sizes: tuple
    dtypes: tuple
    error: dict
    floor: dict
    real_equal: dict

    def table(self) -> Table:
        """Each error to 2 significant digits and its ratio to the floor (``measured``: the same text
        on every CPU, whose BLAS sums the norms in its own order)."""
        rows = []
        for i, ws in enumerate(self.world_sizes):
            cells = [ws]
            for d in self.dtypes:
                e, f = self.error[d][i], self.floor[d][i]
                ratio = f"{measured(e / f, 2)}× floor" if f > 0 else "floor 0"
                cells.append("0 (one rank: no sum)" if ws == 1 else f"{float(measured(e, 2)):.1e} ({ratio})")
            real = [self.real_equal[(d, ws)] for d in self.dtypes if (d, ws) in self.real_equal]
            cells.append(("bit-equal" if all(real) else "DIFFERS") if real else "model only")
            rows.append(cells)
        return Table(("ranks", *(f"{d} sum error" for d in self.dtypes), "real gloo vs model"), rows,
                     title="all-reduce SUM vs the exact sum (relative L2)")


def reduce_errors(world_sizes=(2, 4, 8), dtypes=("float32", "float16", "bfloat16"), *, length=65_536,
                  sigma=1e-3, seed=0, real_up_to=4) -> ReduceErrors:
    """All-reduce (SUM) of ``length`` gradients ~ N(0, ``sigma``) per rank (float32, an independent
    stream per rank, the first ``world_size`` rows of one draw), in each dtype, against the exact sum.
    World sizes up to ``real_up_to`` are also run on real gloo ranks and compared bit for bit with
    the model. One rank sums nothing: its error is 0."""
    sizes = tuple(_whole("world_size", w, 1, MAX_WORLD_SIZE) for w in world_sizes)
    if not sizes:
        raise ValueError("world_sizes must list at least one world size, such as (2, 4, 8)")
    names = tuple(_sum_format(d).torch_dtype.__str__().replace("torch.", "") for d in dtypes)
    length = _whole("length", length, 1, 2**22)
    rng = np.random.default_rng(_whole("seed", seed, 0, None))
    if not 0 < _real("sigma", sigma) < math.inf:
        raise ValueError(f"sigma must be a number above 0 (the gradients' standard deviation), such as 1e-3, "
                         f"not {_shown(sigma)}")
    real_up_to = _whole("real_up_to", real_up_to, 0, 16)
    grads = (rng.standard_normal((max(sizes), length)) * float(sigma)).astype(np.float32)
    error, floor, real_equal = {d: [] for d in names}, {d: [] for d in names}, {}
    for ws in sizes:
        x = grads[:ws]
        for d in names:
            model, once = allreduce(x, d), allreduce(x, d, order="once")
            with np.errstate(invalid="ignore", over="ignore"):
                exact = _rounded(_sum_format(d), x).astype(np.float64).sum(axis=0)
                if not (np.isfinite(model).all() and np.isfinite(once).all() and np.isfinite(exact).all()):
                    raise ValueError(f"with sigma={number(sigma)} the {d} sums overflow (inf), so there is no relative "
                                     f"error: pass a smaller sigma, such as 1e-3")
            if not exact.any():
                raise ValueError(f"with sigma={number(sigma)} every {d} gradient rounds to 0, so there is no "
                                 f"relative error: pass a larger sigma, such as 1e-3")
            error[d].append(_relative_error(model, exact))
            floor[d].append(_relative_error(once, exact))
            if ws <= real_up_to:
                real = run_allreduce(x, d)
                real_equal[(d, ws)] = bool(all(np.array_equal(r.view(np.uint16 if r.dtype == np.float16 else np.uint32),
                                                              model.view(np.uint16 if model.dtype == np.float16
                                                                         else np.uint32)) for r in real))
    return ReduceErrors(sizes, names, {d: np.array(v) for d, v in error.items()},
                        {d: np.array(v) for d, v in floor.items()}, real_equal)


@dataclass(frozen=True, eq=False)
class CompressTrace:
    """DDP steps whose gradient all-reduce is fp32 (``hook=None``) or ``fp16_compress_hook``
    (``"fp16"``), under ``GradScaler("cpu")``: per step the scale used, the number of gradient
    entries that were not finite after the all-reduce, and whether the step was skipped;
    ``ranks_agree``: every rank held the same bits after each all-reduce (real runs only)."""

    hook: str | None
    world_size: int
    scale: np.ndarray
    nonfinite: np.ndarray
    skipped: np.ndarray
    length: int
    ranks_agree: bool = True

    def __repr__(self) -> str:
        name = {None: "fp32 all-reduce", "fp16": "fp16_compress_hook", "bf16": "bf16 hook for gloo"}.get(
            self.hook, self.hook)
        steps = "; ".join(f"scale {number(s)}: {n:,} non-finite, {'skipped' if k else 'stepped'}"
                          for s, n, k in zip(self.scale, self.nonfinite, self.skipped))
        return f"{name}, {self.world_size} ranks: {steps}"

    def same(self, other: "CompressTrace") -> bool:
        return (np.array_equal(self.scale, other.scale) and np.array_equal(self.nonfinite, other.nonfinite)
                and np.array_equal(self.skipped, other.skipped))


#: The gradient all-reduces ``run_compress_hook`` runs: DDP's default (fp32), ``fp16_compress_hook``,
#: a bf16 hook written for gloo (cast, divide, all-reduce in bf16), and torch's ``bf16_compress_hook``
#: (which DDP refuses on gloo: ``run_compress_hook`` then raises ``RankError``, a ``TypeError`` in the ranks).
COMPRESS_HOOKS = (None, "fp16", "bf16", "bf16_compress_hook")


def _bf16_hook_gloo(state, bucket):
    """``bf16_compress_hook`` for gloo: cast the bucket to bf16, divide by the world size, all-reduce."""
    import torch.distributed as dist

    buf = bucket.buffer()
    c = buf.to(torch.bfloat16).div_(dist.get_world_size())
    return dist.all_reduce(c, async_op=True).get_future().then(lambda f: buf.copy_(f.value()[0]))


def _compress_grads(seed: int, rank: int, step: int, length: int) -> np.ndarray:
    g = torch.Generator().manual_seed((seed * 1_000_003 + rank * 10_007 + step) % 2**63)
    return torch.randn(length, generator=g).numpy()


def _compress_args(hook, world_size, steps, init_scale, length, seed):
    if hook not in COMPRESS_HOOKS:
        raise ValueError(f"hook must be None (DDP's fp32 all-reduce), 'fp16' (fp16_compress_hook), 'bf16' (the "
                         f"same in bf16, written for gloo) or 'bf16_compress_hook' (torch's, which DDP refuses "
                         f"on gloo), not {_shown(hook)}")
    return (hook, _whole("world_size", world_size, 1, 8), _whole("steps", steps, 1, 50),
            _real("init_scale", init_scale), _whole("length", length, 1, 2**20), _whole("seed", seed, 0, 2**31))


def _compress_rank(rank, world_size, hook, steps, init_scale, length, seed, growth_interval):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook
    from torch.nn.parallel import DistributedDataParallel

    class Dot(torch.nn.Module):  # loss = w . g: the gradient is g, scaled: S * g in float32
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(length))

        def forward(self, g):
            return (self.weight * g).sum()

    model = Dot()
    net = DistributedDataParallel(model)
    if hook == "fp16":
        net.register_comm_hook(None, fp16_compress_hook)
    elif hook == "bf16":
        net.register_comm_hook(None, _bf16_hook_gloo)
    elif hook == "bf16_compress_hook":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

        net.register_comm_hook(None, bf16_compress_hook)
    opt = torch.optim.SGD(net.parameters(), lr=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    scale, nonfinite, skipped, grads = [], [], [], []
    for t in range(steps):
        opt.zero_grad(set_to_none=True)
        scale.append(scaler.get_scale())
        scaler.scale(net(torch.from_numpy(_compress_grads(seed, rank, t, length)))).backward()
        grad = model.weight.grad
        nonfinite.append(int((~torch.isfinite(grad)).sum()))
        grads.append(grad.numpy().copy())
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        skipped.append(scaler.get_scale() < before)
    return scale, nonfinite, skipped, np.stack(grads)


def run_compress_hook(hook="fp16", *, world_size=2, steps=3, init_scale=4e4, length=65_536, seed=0,
                      growth_interval=2000, timeout=60.0) -> CompressTrace:
    """Real DDP ranks (gloo) training a probe whose scaled gradient is ``S * g`` in float32, ``g`` ~
    N(0, 1) per rank and step, with ``GradScaler("cpu", init_scale)`` and DDP's default fp32
    all-reduce (``hook=None``) or ``fp16_compress_hook`` (``"fp16"``), which casts the *scaled*
    gradients to fp16 before dividing by the world size; ``"bf16"``: the same cast, divide and
    all-reduce in bf16 (a hook written for gloo); ``"bf16_compress_hook"``: torch's, which DDP refuses
    on gloo (``RankError``, a ``TypeError`` in the ranks). ``simulate_compress_hook`` predicts it."""
    args = _compress_args(hook, world_size, steps, init_scale, length, seed)
    growth_interval = _whole("growth_interval", growth_interval, 1, 2**31 - 1)
    prewarm()
    out = run_ranks(_compress_rank, args[1], *args[0:1], *args[2:], growth_interval, timeout=timeout)
    agree = all(np.array_equal(o[3].view(np.uint32), out[0][3].view(np.uint32)) for o in out)
    s, n, k, _ = out[0]
    return CompressTrace(hook, args[1], np.array(s), np.array(n), np.array(k), args[4], agree)


def simulate_compress_hook(hook="fp16", *, world_size=2, steps=3, init_scale=4e4, length=65_536, seed=0,
                           growth_interval=2000) -> CompressTrace:
    """``run_compress_hook`` predicted with ``allreduce`` (gloo bit for bit): each rank's float32
    ``S * g``, then for ``"fp16"`` cast to fp16 (|S g| > 65,504 becomes inf) and divided by the world
    size in fp16, summed in fp16; for ``None`` divided in float32 and summed in float32."""
    hook, world_size, steps, init_scale, length, seed = _compress_args(hook, world_size, steps, init_scale,
                                                                        length, seed)
    policy = TorchGradScaler(init_scale=init_scale, growth_interval=growth_interval)
    state = policy.initial_state()
    scale, nonfinite, skipped = [], [], []
    for t in range(steps):
        s = np.float32(state.scale)
        with np.errstate(over="ignore", invalid="ignore"):
            rows = np.stack([s * _compress_grads(seed, r, t, length) for r in range(world_size)])
            if hook == "fp16":
                rows = (rows.astype(np.float16).astype(np.float32) / np.float32(world_size)).astype(np.float16)
                summed = allreduce(rows, "float16").astype(np.float32)
            elif hook in ("bf16", "bf16_compress_hook"):
                rows = _rounded(BF16, _rounded(BF16, rows.astype(np.float32)) / np.float32(world_size))
                summed = allreduce(rows, "bfloat16")
            else:
                summed = allreduce(rows / np.float32(world_size), "float32")
        bad = int((~np.isfinite(summed)).sum())
        scale.append(float(s))
        nonfinite.append(bad)
        skipped.append(bad > 0)
        state = policy._adjust(state, bad > 0)
    return CompressTrace(hook, world_size, np.array(scale), np.array(nonfinite), np.array(skipped), length)


# ============================================================================================
# Exercise checkers (notebook 11); the expected answers come from the simulator, held to real runs
# ============================================================================================


def check_ddp_skips(answer) -> Check:
    """Q: DDP + GradScaler("cpu"), 4 ranks; only rank 3's backward overflows, at step 1
    (``["....", "....", "....", ".x.."]``). How many ranks skip step 1?"""
    trace = simulate_ranks(TorchGradScaler(init_scale=1024), found_inf=["....", "....", "....", ".x.."], mode="ddp")
    return check(answer, int(trace.found_inf[:, 1].sum()),
                 hint="DDP all-reduces the gradients during backward, before any rank's unscale_ looks at them")


def check_local_scales(answer) -> Check:
    """Q: a scaler per rank on gradients never all-reduced, from 1024 with ``growth_interval=2``,
    2 ranks, overflows ``["x...", "...."]``: each rank's scale after the last step, as
    ``(rank 0, rank 1)``."""
    trace = simulate_ranks(TorchGradScaler(init_scale=1024, growth_interval=2), found_inf=["x...", "...."],
                           mode="local")
    expected = tuple(float(s) for s in trace.final_scale)

    def accept(a) -> bool:
        if isinstance(a, str) or not hasattr(a, "__len__") or len(a) != len(expected):
            return False
        got = [_number_text(v) if isinstance(v, str) else v for v in a]
        return all(not isinstance(g, (str, bool, np.bool_)) and float(g) == e for g, e in zip(got, expected))

    return check(answer, expected, accept=accept,
                 hint="walk each rank on its own: an overflow halves its scale and resets its count; "
                      "2 clean steps in a row double it")


def check_found_inf_op(answer) -> Check:
    """Q: sharded gradients on gloo; the ranks' found_inf flags are ``[0, 1, 0, 0]`` and each rank
    all-reduces its flag before the step. Which of "sum", "max", "min" and "avg" does *not* make
    every rank skip? (Real gloo gives 1, 1, 0 and 0.25 on every rank: only "min" leaves 0.) Torch's
    own ``dist.ReduceOp.MIN``, or its name as text, counts too."""
    import torch.distributed as dist

    if answer is None or answer is Ellipsis:
        return check(answer, "min")
    if isinstance(answer, (dist.ReduceOp, dist.ReduceOp.RedOpType)):  # torch's own, e.g. dist.ReduceOp.MIN
        answer = "min" if answer == dist.ReduceOp.MIN else "not min"
    said = _said(answer)
    ok = said is not None and re.fullmatch(r"((torch\.distributed|dist)\.)?(reduceop\.)?(redoptype\.|op\.)?min", said)
    if ok:
        return Check("right", "✓ correct")
    return Check("wrong", "✗ not quite: all-reduce [0, 1, 0, 0] with each op in your head: a rank skips "
                          "when its flag is not 0; which op gives every rank 0?")


def _share_text(a):
    if isinstance(a, str) and a.strip().endswith("%"):
        v = _number_text(a.strip()[:-1])
        return v / 100 if isinstance(v, float) else a
    return _number_text(a) if isinstance(a, str) else a


def check_compress_share(answer) -> Check:
    """Q: ``fp16_compress_hook`` at 8 ranks, gradients ~ N(0, 1), scale 40,000: what share of the
    all-reduced gradient entries is not finite? (within 0.02; 0.3 or "30%")"""
    sim = simulate_compress_hook("fp16", world_size=8, steps=1, length=16_384)
    expected = float(sim.nonfinite[0] / sim.length)

    def accept(a) -> bool:
        v = _share_text(a)
        return not isinstance(v, (str, bool, np.bool_)) and abs(float(v) - expected) <= 0.02

    return check(answer, expected, accept=accept,
                 hint="one rank's entry is finite after the cast when |40,000 g| <= 65,504; an element of "
                      "the sum is finite only if it is finite on every rank")


# ============================================================================================
# Lightning on CPU ranks
# ============================================================================================


@dataclass(frozen=True, eq=False)
class LightningRun:
    """A real ``lightning.Trainer(accelerator="cpu", devices=world_size)`` fit with DDP, one forked
    rank per row: ``precision`` (the precision plugin's, as Lightning resolved it),
    ``scaler`` (the plugin holds a GradScaler), ``out_dtype`` (the model's output dtype in
    ``training_step``), ``warnings`` (what constructing the Trainer warned, rank 0), and per rank and
    batch: ``scale`` (after the batch; NaN without a scaler), ``stepped`` (the optimizer's step
    ran: SGD moved the weights), ``global_step`` (``trainer.global_step`` after the batch), ``weights_finite``;
    ``weights_identical``: per batch, every rank's weights bitwise identical (both also before the
    first batch: shape (world_size, steps + 1) and (steps + 1,))."""

    precision: str
    scaler: bool
    out_dtype: str
    warnings: tuple
    scale: np.ndarray
    stepped: np.ndarray
    global_step: np.ndarray
    weights_finite: np.ndarray
    weights_identical: np.ndarray

    def __repr__(self) -> str:
        scale = ", ".join(number(s) for s in self.scale[0]) if self.scaler else "none"
        return (f"LightningRun(plugin precision {self.precision!r}, GradScaler: {self.scaler}, output dtype "
                f"{self.out_dtype}; optimizer steps {self.stepped.sum(axis=1).tolist()} per rank, global_step "
                f"{self.global_step[0, -1]}; scale after each batch: {scale}; weights finite on every rank: "
                f"{bool(self.weights_finite.all())}; identical across ranks: {bool(self.weights_identical.all())})")


def _lightning_rank(rank, world_size, port, precision, init_scale, flags, seed):
    import lightning as L
    from lightning.pytorch.plugins.precision import MixedPrecision
    from lightning.pytorch.strategies import DDPStrategy

    class JoinedDDP(DDPStrategy):
        """DDP in processes started by someone else (here ``run_ranks``; torchrun and SLURM do the
        same): no launcher, so Lightning neither starts processes nor refuses to run in a notebook
        kernel, and it joins the gloo group that is already up."""

        def _configure_launcher(self) -> None:
            self._launcher = None

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size), NODE_RANK="0")  # the gloo group is already up: Lightning joins it
    steps = flags.shape[1]
    record = {"scale": [], "stepped": [], "global_step": [], "weights": [], "dtype": None}

    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(seed)
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

        def _weights(self):
            return torch.cat([p.detach().reshape(-1) for p in self.parameters()]).numpy().copy()

        def on_train_start(self):
            record["weights"].append(self._weights())

        def training_step(self, batch, i):
            x, y = batch
            if flags[rank, i]:
                x = x * _SPIKE
            out = self.net(x)
            record["dtype"] = str(out.dtype).replace("torch.", "")
            return torch.nn.functional.mse_loss(out.float(), y)

        def on_train_batch_end(self, outputs, batch, i):
            sc = self.trainer.precision_plugin.scaler if hasattr(self.trainer.precision_plugin, "scaler") else None
            record["scale"].append(math.nan if sc is None else float(sc.get_scale()))
            record["global_step"].append(int(self.trainer.global_step))
            record["weights"].append(self._weights())
            before, after = record["weights"][-2:]  # SGD moved the weights: its step ran
            record["stepped"].append(not np.array_equal(before.view(np.uint32), after.view(np.uint32)))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    batches = [_batch(seed, rank, t) for t in range(steps)]
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.cat([b[0] for b in batches]),
                                                                      torch.cat([b[1] for b in batches])),
                                       batch_size=16)
    kwargs = {"precision": precision} if init_scale is None else \
        {"plugins": [MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", init_scale=init_scale))]}
    loggers = [logging.getLogger(n) for n in ("lightning.pytorch", "lightning.fabric", "lightning")]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as root:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer = L.Trainer(accelerator="cpu", devices=world_size, strategy=JoinedDDP(), max_steps=steps,
                                use_distributed_sampler=False, enable_progress_bar=False,
                                enable_model_summary=False, logger=False, enable_checkpointing=False,
                                default_root_dir=root, **kwargs)
        said = tuple(_one_line(w.message) for w in caught if "precision" in str(w.message))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(Net(), data)
    plugin = trainer.precision_plugin
    return {"precision": str(getattr(plugin, "precision", type(plugin).__name__)),
            "scaler": getattr(plugin, "scaler", None) is not None, "dtype": record["dtype"], "warnings": said,
            "scale": record["scale"], "stepped": record["stepped"], "global_step": record["global_step"],
            "weights": np.stack(record["weights"])}


def run_lightning_ranks(precision="16-mixed", *, found_inf=("x...", "...."), init_scale=None, seed=0,
                        timeout=60.0) -> LightningRun:
    """Fit a small MLP (8-16-1, SGD) with ``lightning.Trainer(accelerator="cpu", devices=world_size,
    precision=precision)`` on forked gloo ranks, one per row of ``found_inf`` (patterns as in
    ``run_scaler_ranks``: ``x`` blows up that rank's batch so an fp16 forward overflows), one batch
    per step. Its ``DDPStrategy`` joins the ranks ``run_ranks`` started, as under torchrun: no
    Lightning launcher, so it runs in a notebook kernel too. ``init_scale``: instead of ``precision``, pass
    ``plugins=[MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", init_scale))]``,
    the explicit fp16 plugin. Needs ``lightning``. Returns a ``LightningRun``."""
    flags = _rank_flags(found_inf)
    if not 1 <= flags.shape[0] <= 4 or not 1 <= flags.shape[1] <= 20:
        raise ValueError(f"give 1 to 4 ranks (rows) and 1 to 20 steps, not shape {flags.shape}")
    if init_scale is not None:
        init_scale = _real("init_scale", init_scale)
        if not (0 < init_scale <= MLP_MAX_SCALE):
            raise ValueError(f"init_scale must be above 0 and at most 2^14, not {_shown(init_scale)}")
    seed = _whole("seed", seed, 0, 2**31)
    prewarm()
    import lightning  # noqa: F401 - once here, not in every rank

    out = run_ranks(_lightning_rank, flags.shape[0], _free_port(), precision, init_scale, flags, seed,
                    timeout=timeout)
    weights = np.stack([o["weights"] for o in out])
    bits = weights.view(np.uint32)
    return LightningRun(out[0]["precision"], out[0]["scaler"], out[0]["dtype"], out[0]["warnings"],
                        np.array([o["scale"] for o in out]), np.array([o["stepped"] for o in out]),
                        np.array([o["global_step"] for o in out]), np.isfinite(weights).all(axis=2),
                        (bits == bits[:1]).all(axis=(0, 2)))
