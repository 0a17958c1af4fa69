"""Starting ranks: ``run_ranks`` forks ``world_size`` rank processes from this one (so a function
defined in a notebook cell runs in them), joins them in a gloo process group over a ``FileStore``
and returns their results; ``prewarm`` imports once, in the parent, what each rank would import for
itself. Here too is the care that no rank outlives the call: each rank in its own process group,
killed with its parent (Linux), Ctrl-C held back while forking and reaping, and ``RankError`` for a
rank that raised or died.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import warnings
from datetime import timedelta
from multiprocessing.connection import wait as _wait_for

import torch

from ampviz._args import _real, _shown, _whole
from ampviz.text import number

#: The most ranks ``run_ranks`` starts (each is a process on this machine).
MAX_WORLD_SIZE = 64


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
