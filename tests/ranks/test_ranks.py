"""ampviz.ranks: forked gloo ranks, gloo's all-reduce bit for bit, and loss scalers across ranks.

Real runs are the reference. ``allreduce`` is held to real ``dist.all_reduce`` on gloo (and to a
literal re-enactment of gloo's ring, message by message, over many random cases); the multi-rank
simulator to real DDP / GradScaler("cpu") / ShardedGradScaler runs. For each, plausible wrong models
are shown to fail on the same data. After every test no child process may be left.
"""

import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import ml_dtypes
import numpy as np
import psutil
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ampviz import ranks as R
from ampviz.formats import FP16
from ampviz.ranks import gloo  # the home of GLOO_MAX_SEGMENT_BYTES, which tests set to move the ring's segments
from ampviz.scaling import PRESETS, DynamicScaler, TorchGradScaler, simulate

REAL = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PURE = settings(max_examples=150, deadline=None)
DTYPES = ("float32", "float16", "bfloat16")
NP_DTYPE = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


@pytest.fixture(scope="module", autouse=True)
def warm():
    R.prewarm()


def same_values(a, b) -> bool:
    """Bit for bit, except that any NaN equals any NaN (gloo leaves a NaN's sign to the compiler)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    u = np.uint16 if a.dtype == np.float16 else np.uint32
    return bool(np.array_equal(nan_a, nan_b) and np.array_equal(a.view(u)[~nan_a], b.view(u)[~nan_b]))


def same_bits(a, b) -> bool:
    """Bit for bit, NaNs included."""
    a, b = np.asarray(a), np.asarray(b)
    u = np.uint16 if a.dtype == np.float16 else np.uint32
    return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a.view(u), b.view(u)))


# ============================================================================================
# run_ranks
# ============================================================================================


def _echo(rank, world_size, payload):
    import torch.distributed as dist

    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return rank, world_size, payload, float(t), torch.get_num_threads(), dist.get_backend()


@REAL
@given(world_size=st.integers(1, 4),
       payload=st.one_of(st.integers(), st.text(max_size=5), st.lists(st.floats(), max_size=3)))
def test_run_ranks_returns_each_ranks_result(world_size, payload):
    out = R.run_ranks(_echo, world_size, payload, timeout=30)
    total = float(sum(range(world_size)))
    for rank, got in enumerate(out):
        assert got[:2] == (rank, world_size) and got[3:] == (total, 1, "gloo")
        assert got[2] == payload or (payload != payload)  # a NaN in the list compares unequal


def _raise_on_one(rank, world_size):
    import torch.distributed as dist

    if rank == 1:
        raise ValueError("bad batch on this rank")
    dist.barrier()  # the others wait for rank 1 forever
    return rank


def _raise_and_hang(rank, world_size):
    if rank == 0:
        time.sleep(0.2)
        raise KeyError("missing")
    time.sleep(600)


def _hang(rank, world_size):
    time.sleep(600)


def _exit_early(rank, world_size):
    if rank == 0:
        os._exit(3)
    time.sleep(600)


def _unpicklable(rank, world_size):
    return lambda: rank


def test_a_raising_rank_is_named_in_one_line_and_the_others_are_killed():
    t0 = time.monotonic()
    with pytest.raises(R.RankError) as info:
        R.run_ranks(_raise_on_one, 3, timeout=30)
    assert time.monotonic() - t0 < 5
    assert str(info.value) == "rank 1 raised ValueError: bad batch on this rank"
    assert info.value.rank == 1 and info.value.error == "ValueError"
    assert "raise ValueError" in info.value.remote_traceback


def test_a_raising_rank_and_a_hanging_rank_are_both_cleaned_up_within_the_timeout():
    t0 = time.monotonic()
    with pytest.raises(R.RankError, match=r"^rank 0 raised KeyError: 'missing'$"):
        R.run_ranks(_raise_and_hang, 2, timeout=10)
    assert time.monotonic() - t0 < 5  # the hanging rank was killed, not waited for


def test_hanging_ranks_are_killed_at_the_timeout():
    t0 = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        R.run_ranks(_hang, 3, timeout=1.0)
    assert 1.0 <= time.monotonic() - t0 < 4
    assert str(info.value) == "ranks 0, 1, 2 were still running after 1 s: killed all 3 rank processes"


def test_a_rank_that_dies_and_a_result_that_cannot_be_pickled():
    with pytest.raises(R.RankError, match=r"^rank 0 exited with code 3 without returning a result$"):
        R.run_ranks(_exit_early, 2, timeout=20)
    with pytest.raises(R.RankError, match=r"^rank 0 raised \w+Error returning its result \(it must be picklable\): "):
        R.run_ranks(_unpicklable, 1, timeout=20)


def test_ctrl_c_in_the_parent_kills_every_rank():
    # Python's own Ctrl-C handler, as in a notebook kernel or a script (a server or browser driver
    # started earlier in the same process may have installed another one)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            R.run_ranks(_hang, 2, timeout=30)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - t0 < 5


def test_ranks_die_with_their_parent(tmp_path):
    """A parent killed outright (SIGKILL: no finally runs) takes its ranks with it (Linux). Its
    ranks' store folder, which no finally removes then, lands in the test's own folder."""
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux-only")
    script = textwrap.dedent("""
        import os, sys, time
        from ampviz import ranks
        def hang(rank, world_size):
            os.write(1, f"{os.getpid()}\\n".encode())  # one write: atomic on a pipe
            time.sleep(600)
        ranks.run_ranks(hang, 2, timeout=600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                              env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        pids = [int(parent.stdout.readline()) for _ in range(2)]
        assert all(psutil.pid_exists(p) for p in pids)
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()
    end = time.monotonic() + 5
    alive = pids
    while alive and time.monotonic() < end:
        alive = [p for p in alive if _running(p)]
        time.sleep(0.05)
    assert not alive


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("call, error, message", [
    (lambda: R.run_ranks(3, 2), TypeError, "fn must be a function fn(rank, world_size, *args), not 3"),
    (lambda: R.run_ranks(_echo, 0), ValueError, "world_size must be between 1 and 64, not 0"),
    (lambda: R.run_ranks(_echo, 65), ValueError, "world_size must be between 1 and 64, not 65"),
    (lambda: R.run_ranks(_echo, True), TypeError, "world_size must be a whole number, not True"),
    (lambda: R.run_ranks(_echo, 2.5), ValueError, "world_size must be a whole number, not 2.5"),
    (lambda: R.run_ranks(_echo, 2, timeout=0), ValueError,
     "timeout must be a number of seconds above 0 and at most 1e9, such as 60, not 0.0"),
    (lambda: R.run_ranks(_echo, 2, timeout=math.inf), ValueError,
     "timeout must be a number of seconds above 0 and at most 1e9, such as 60, not inf"),
    (lambda: R.run_ranks(_echo, 2, timeout=1.0000001e9), ValueError,
     "timeout must be a number of seconds above 0 and at most 1e9, such as 60, not 1000000100.0"),
    (lambda: R.run_ranks(_echo, 2, timeout="1"), TypeError, "timeout must be a number, not '1'"),
])
def test_run_ranks_refuses_bad_arguments_in_one_line(call, error, message):
    with pytest.raises(error) as info:
        call()
    assert str(info.value) == message


def _returns_rank(rank, world_size):
    return rank


def test_a_function_without_a_collective_runs_at_every_world_size():
    """Ranks that return at once must not tear the group down under ranks still connecting to it
    (gloo: "connectFullMesh failed ... Connection closed by peer" in one of them)."""
    for world_size, calls in ((16, 10), (R.MAX_WORLD_SIZE, 6)):
        for _ in range(calls):
            assert R.run_ranks(_returns_rank, world_size, timeout=60) == list(range(world_size))


_INTERRUPTED = textwrap.dedent("""
    import sys, threading, time
    import psutil
    from ampviz import ranks

    ranks.prewarm()
    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()  # a kernel has threads too

    def hang(rank, world_size):
        time.sleep(600)

    for _ in range(int(sys.argv[1])):
        try:
            print("go", flush=True)
            ranks.run_ranks(hang, 16, timeout=20)
            outcome = "returned"
        except KeyboardInterrupt:
            outcome = "interrupted"
        except Exception as e:  # noqa: BLE001 - reported to the test
            outcome = type(e).__name__
        print(outcome, len(psutil.Process().children(recursive=True)), flush=True)
""")


def test_ctrl_c_while_the_ranks_are_forked_kills_every_rank_in_a_threaded_process():
    """SIGINT from outside (as Jupyter's Interrupt sends it) at moments spread over the forks of 16
    ranks, in a process with another thread: every time KeyboardInterrupt comes at once and no
    child is left, not even a zombie."""
    delays = [0.0, 0.01, 0.02, 0.03, 0.05, 0.07, 0.09, 0.12, 0.15, 0.2, 0.25, 0.35]
    child = subprocess.Popen([sys.executable, "-c", _INTERRUPTED, str(len(delays))], stdout=subprocess.PIPE,
                             text=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    outcomes = []
    try:
        for delay in delays:
            assert child.stdout.readline() == "go\n"
            time.sleep(delay)
            child.send_signal(signal.SIGINT)
            t0 = time.monotonic()
            outcome, left = child.stdout.readline().split()
            outcomes.append((delay, outcome, int(left), round(time.monotonic() - t0, 1)))
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    assert all(o[1:3] == ("interrupted", 0) and o[3] < 5 for o in outcomes), str(outcomes)


def _start_a_process(rank, world_size, how):
    if how == "popen":
        return subprocess.Popen(["sleep", "60"]).pid
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    return pid


@pytest.mark.parametrize("how", ["popen", "fork"])
def test_a_rank_that_starts_a_process_returns_at_once_and_leaves_none(how):
    t0 = time.monotonic()
    pids = R.run_ranks(_start_a_process, 2, how, timeout=30)
    assert time.monotonic() - t0 < 5
    end = time.monotonic() + 5
    while any(_running(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.05)
    assert not any(_running(p) for p in pids)


def test_the_longest_timeout_works():
    out = R.run_ranks(_echo, 2, "x", timeout=1e9)
    assert [o[:4] for o in out] == [(0, 2, "x", 1.0), (1, 2, "x", 1.0)]


def test_prewarm_is_paid_once():
    assert R.prewarm() < 0.05
    import torch._dynamo  # noqa: F401  (already imported by prewarm)
    assert "torch._dynamo" in sys.modules


# ============================================================================================
# allreduce: the model against gloo
# ============================================================================================


def _data(seed: int, world_size: int, length: int, dtype: str) -> np.ndarray:
    """Gradients of mixed magnitudes with inf, -inf, NaN and, in fp16, values whose sums pass 65504."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 1, (world_size, length)) * np.exp2(rng.integers(-12, 12, (world_size, length)))
    if dtype == "float16":
        x *= 4000.0  # many partial sums beyond 65504
    else:
        x[rng.random((world_size, length)) < 0.02] = 3.0e38  # float32/bf16 sums beyond their max
    u = rng.random((world_size, length))
    x[u < 0.01] = np.inf
    x[(u >= 0.01) & (u < 0.015)] = -np.inf
    x[(u >= 0.015) & (u < 0.02)] = np.nan
    return x.astype(np.float32)


def _wrong_ring(x, dtype, start, step):
    """A ring in another order: chunk c adds ranks c+start, c+start+step, ... (gloo: start -1, step -1)."""
    world_size, n = x.shape
    chunk = R.gloo_chunks(n, world_size, dtype)
    order = (chunk[:, None] + start + step * np.arange(world_size)[None, :]) % world_size
    vals = np.stack([R.allreduce(x[r:r + 1], dtype) for r in range(world_size)])  # each rank's values in dtype
    cols = np.arange(n)
    acc = vals[order[:, 0], cols]
    for k in range(1, world_size):
        acc = R.allreduce(np.stack([vals[order[:, k], cols], acc]), dtype, order="rank")
    return acc


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
def test_allreduce_equals_gloo_bit_for_bit(world_size, dtype):
    length = 8 * world_size * 37 + (0 if world_size % 2 else 5)  # a multiple of 8 x world_size, or not
    x = _data(world_size * 7 + DTYPES.index(dtype), world_size, length, dtype)
    real = R.run_allreduce(x, dtype)
    assert real.dtype == (np.float16 if dtype == "float16" else np.float32)
    assert all(same_values(real[r], real[0]) for r in range(world_size))  # every rank holds the same bits
    model = R.allreduce(x, dtype)
    assert same_values(model, real[0])
    if dtype == "bfloat16":  # every bf16 NaN is 0x7FC0: NaNs too are bit for bit
        assert same_bits(model, real[0])
    assert np.isinf(real[0]).any() and np.isnan(real[0]).any()
    # the plausible wrong models differ from gloo on the same data
    wrong = {order: R.allreduce(x, dtype, order=order) for order in ("rank", "tree", "once")}
    assert same_values(_wrong_ring(x, dtype, -1, -1), model)  # _wrong_ring itself, in gloo's order
    wrong["ring starting at the owner"] = _wrong_ring(x, dtype, 0, -1)
    if world_size > 3:  # with 3 ranks the other direction adds the same first pair
        wrong["ring the other way"] = _wrong_ring(x, dtype, 1, 1)
    if world_size == 2:  # two values: one add (one float32 rounding, then one to dtype), whatever the order
        assert all(same_values(w, real[0]) for w in wrong.values())
    else:
        for name, w in wrong.items():
            assert not same_values(w, real[0]), name


@REAL
@given(seed=st.integers(0, 2**32 - 1), world_size=st.integers(2, 8), length=st.integers(1, 200),
       dtype=st.sampled_from(DTYPES))
def test_allreduce_equals_gloo_for_any_length(seed, world_size, length, dtype):
    x = _data(seed, world_size, length, dtype)
    real = R.run_allreduce(x, dtype)
    assert same_values(R.allreduce(x, dtype), real[0])
    if dtype == "bfloat16":
        assert same_bits(R.allreduce(x, dtype), real[0])


def test_fp16_sums_beyond_65504_depend_on_the_chunk():
    """The same four values per element, [40000, 40000, -40000, -40000], sum to -inf, 0, inf and 0
    in gloo's four chunks (chunk c adds ranks c-1, c-2, c-3, c): the order decides whether a partial
    sum passes 65504. Summing in rank order gives inf everywhere; the exact sum is 0."""
    x = np.repeat(np.array([[40000.0], [40000.0], [-40000.0], [-40000.0]], np.float32), 32, axis=1)
    real = R.run_allreduce(x, "float16")[0]
    expected = np.repeat(np.array([-np.inf, 0.0, np.inf, 0.0], np.float16), 8)
    assert same_values(real, expected)
    assert same_values(R.allreduce(x, "float16"), real)
    assert (R.allreduce(x, "float16", order="rank") == np.inf).all()
    assert (R.allreduce(x, "float16", order="once") == 0).all()
    assert np.array_equal(R.gloo_chunks(32, 4, "float16"), np.repeat(np.arange(4), 8))


def test_gloo_caps_segments_at_1_mib():
    """6.8 MB of float32 on 3 ranks: gloo cuts 9 segments of at most 1 MiB, not 6 (2 x world_size),
    which moves two chunk boundaries; a model without the cap gets those elements wrong."""
    length = 1_700_003
    x = _data(11, 3, length, "float32")
    real = R.run_allreduce(x, "float32", timeout=60)[0]
    assert same_values(R.allreduce(x, "float32"), real)
    saved = gloo.GLOO_MAX_SEGMENT_BYTES
    gloo.GLOO_MAX_SEGMENT_BYTES = 1 << 62
    try:
        uncapped = R.allreduce(x, "float32")
        moved = R.gloo_chunks(length, 3) != _chunks_with_cap(length, 3, 1 << 20)
    finally:
        gloo.GLOO_MAX_SEGMENT_BYTES = saved
    assert moved.sum() == 6
    assert not same_values(uncapped, real)


def _chunks_with_cap(length, world_size, cap):
    saved = gloo.GLOO_MAX_SEGMENT_BYTES
    gloo.GLOO_MAX_SEGMENT_BYTES = cap
    try:
        return R.gloo_chunks(length, world_size)
    finally:
        gloo.GLOO_MAX_SEGMENT_BYTES = saved


def test_summation_order_of_the_design_note():
    """At world size 8 and 65,536 values gloo's chunks are 8,192 long and chunk k adds ranks
    k-1, k-2, ..., k (mod 8)."""
    chunks = R.gloo_chunks(65_536, 8, "bfloat16")
    assert np.array_equal(chunks, np.repeat(np.arange(8), 8192))
    order = R.gloo_summation_order(65_536, 8, "bfloat16")
    for k in range(8):
        assert order[k * 8192].tolist() == [(k - j) % 8 for j in range(1, 9)]
    assert np.array_equal(R.gloo_summation_order(3, 1), np.zeros((3, 1)))


@PURE
@given(length=st.integers(0, 5000), world_size=st.integers(1, 64), dtype=st.sampled_from(DTYPES))
def test_gloo_chunks_are_contiguous_and_even_when_the_length_allows(length, world_size, dtype):
    chunks = R.gloo_chunks(length, world_size, dtype)
    assert chunks.shape == (length,) and (np.diff(chunks) >= 0).all()
    assert length == 0 or (chunks[0] == 0 and chunks[-1] < world_size)
    if length % (2 * world_size) == 0:  # whole segments, two per rank: world_size equal chunks
        assert np.array_equal(chunks, np.arange(length) // (length // world_size) if length else chunks)
    order = R.gloo_summation_order(length, world_size, dtype)
    assert order.shape == (length, world_size)
    assert (np.sort(order, axis=1) == np.arange(world_size)).all()  # every rank once
    assert np.array_equal(order[:, -1], chunks)  # the owner adds last


# ---- a literal re-enactment of gloo's ring (gloo/allreduce.cc, ring), message by message ----


def _add_ref(dtype, a, b):
    s = a.astype(np.float32) + b.astype(np.float32)
    return s.astype(NP_DTYPE[dtype]) if dtype != "float32" else s


def _literal_ring(x32, dtype, max_segment):
    """Each rank's buffer after gloo's ring: the reduce-scatter and all-gather loops with their
    send/recv offsets as in the C++ source, segments of length <= 0 skipped."""
    item = 4 if dtype == "float32" else 2
    world_size, n = x32.shape
    with np.errstate(over="ignore"):
        bufs = [x32[r].astype(NP_DTYPE[dtype]) for r in range(world_size)]
    if world_size == 1 or n == 0:
        return bufs
    total = n * item
    msb = item * max(1, max_segment // item)
    up = lambda v, m: v if v % m == 0 else v + m - v % m  # noqa: E731
    segments = up(max(-(-total // msb), 2 * world_size), world_size)
    per_rank = segments // world_size
    seg = up(-(-total // segments), item) // item

    def piece(index):
        lo = index * seg
        return lo, min(lo + seg, n)

    with np.errstate(all="ignore"):
        for i in range(segments - per_rank):  # reduce-scatter
            sent = {}
            for r in range(world_size):
                lo, hi = piece(((r + 1) * per_rank + i) % segments)
                if hi > lo:
                    sent[r] = (lo, hi, bufs[r][lo:hi].copy())
            for r, (lo, hi, data) in sent.items():
                dest = (r - 1) % world_size
                bufs[dest][lo:hi] = _add_ref(dtype, bufs[dest][lo:hi], data)
        for i in range(segments - per_rank):  # all-gather
            sent = {}
            for r in range(world_size):
                lo, hi = piece((r * per_rank + i) % segments)
                if hi > lo:
                    sent[r] = (lo, hi, bufs[r][lo:hi].copy())
            for r, (lo, hi, data) in sent.items():
                bufs[(r - 1) % world_size][lo:hi] = data
    return bufs


@PURE
@given(seed=st.integers(0, 2**32 - 1), world_size=st.integers(1, 9), length=st.integers(0, 120),
       dtype=st.sampled_from(DTYPES), max_segment=st.sampled_from([2, 4, 6, 10, 16, 1 << 20]))
def test_allreduce_equals_a_literal_ring_for_any_length_and_segment_cap(seed, world_size, length, dtype, max_segment):
    x = _data(seed, world_size, length, dtype)
    saved = gloo.GLOO_MAX_SEGMENT_BYTES
    gloo.GLOO_MAX_SEGMENT_BYTES = max_segment
    try:
        model = R.allreduce(x, dtype)
    finally:
        gloo.GLOO_MAX_SEGMENT_BYTES = saved
    bufs = _literal_ring(x, dtype, max_segment)
    for b in bufs:
        b = b.astype(np.float32) if dtype == "bfloat16" else b
        assert same_values(model, b)


@PURE
@given(seed=st.integers(0, 2**32 - 1), length=st.integers(1, 50), dtype=st.sampled_from(DTYPES))
def test_allreduce_orders_that_coincide(seed, length, dtype):
    x = _data(seed, 2, length, dtype)
    one = R.allreduce(x[:1], dtype)
    assert same_values(one, R.allreduce(x[:1], dtype, order="tree"))
    with np.errstate(over="ignore"):
        ref = x[0].astype(NP_DTYPE[dtype])
    assert same_values(one, ref.astype(np.float32) if dtype == "bfloat16" else ref)
    # two ranks: one add, whatever the order (NaN as NaN)
    pair = R.allreduce(x, dtype)
    assert same_values(pair, R.allreduce(x, dtype, order="rank"))
    assert same_values(pair, R.allreduce(x[::-1], dtype, order="tree"))


@pytest.mark.parametrize("grads, dtype, order, error, message", [
    ([1.0, 2.0], "float32", "gloo", ValueError,
     "grads must be 2-D, one row per rank and one column per element (got shape (2,))"),
    ("ab", "float32", "gloo", TypeError, "grads must be a 2-D array of numbers, one row per rank "
     "(e.g. [[1.0, 2.0], [3.0, 4.0]]), not a string"),
    ([[True, False]], "float32", "gloo", TypeError, "grads must be a 2-D array of numbers, one row per rank "
     "(e.g. [[1.0, 2.0], [3.0, 4.0]]), not bool values"),
    ([[1.0], [2.0, 3.0]], "float32", "gloo", ValueError, "grads must be a 2-D array of numbers, one row per "
     "rank (e.g. [[1.0, 2.0], [3.0, 4.0]]), not [[1.0], [2.0, 3.0]]"),
    (np.zeros((0, 3)), "float32", "gloo", ValueError, "grads must have at least one row (one per rank)"),
    ([[1.0]], "fp8_e4m3", "gloo", ValueError,
     "dtype must be 'float32', 'float16' or 'bfloat16' (or FP32, FP16, BF16), not 'fp8_e4m3'"),
    ([[1.0]], 3, "gloo", ValueError,
     "dtype must be 'float32', 'float16' or 'bfloat16' (or FP32, FP16, BF16), not 3"),
    ([[1.0]], "float16", "ring", ValueError, "order must be one of 'gloo', 'rank', 'tree', 'once', not 'ring'"),
])
def test_allreduce_refuses_bad_arguments_in_one_line(grads, dtype, order, error, message):
    with pytest.raises(error) as info:
        R.allreduce(grads, dtype, order=order)
    assert str(info.value) == message


def test_allreduce_takes_tensors_and_ml_dtypes_arrays():
    x = _data(3, 3, 40, "bfloat16")
    expected = R.allreduce(x, torch.bfloat16)
    assert same_values(R.allreduce(torch.from_numpy(x).to(torch.bfloat16), "bf16"), expected)
    assert same_values(R.allreduce(x.astype(ml_dtypes.bfloat16), "bfloat16"), expected)
    assert same_values(R.allreduce(x.tolist(), "bfloat16"), expected)
    with pytest.raises(ValueError, match="^length must be between 0 and 16,777,216, not -1$"):
        R.gloo_chunks(-1, 2)
    with pytest.raises(ValueError, match="^world_size must be between 1 and 64, not 0$"):
        R.gloo_summation_order(4, 0)


def test_the_layouts_refuse_lengths_they_cannot_hold():
    """A layout is an int array per element (and rank): 2^31 elements would be 16 GiB to 1 TiB."""
    with pytest.raises(ValueError) as info:
        R.gloo_chunks(2**31, 2)
    assert str(info.value) == "length must be between 0 and 16,777,216, not 2,147,483,648"
    with pytest.raises(ValueError) as info:
        R.gloo_summation_order(2**18 + 1, 64, "float16")
    assert str(info.value) == ("length x world_size must be at most 16,777,216 (one rank per element and "
                               "step), not 16,777,280: at 64 ranks pass a length up to 262,144")
    with pytest.raises(ValueError, match=r"^length must be between 0 and 16,777,216, not 2,147,483,648$"):
        R.gloo_summation_order(2**31, 1)


# ============================================================================================
# Loss scalers across ranks: real runs against the simulator
# ============================================================================================


def _sim_for(run, **kw):
    t = run.trace
    return R.simulate_ranks(t.policy, mode=t.mode, **kw)


def test_ddp_one_ranks_overflow_skips_every_rank_and_weights_stay_identical():
    """DDP + GradScaler("cpu"), 4 ranks: rank 1 overflows at step 2, rank 3 at step 5. Every rank
    skips both steps and backs off together; the weights are bitwise identical at every step."""
    flags = ["........", "..x.....", "........", ".....x.."]
    run = R.run_scaler_ranks("ddp", found_inf=flags, growth_interval=2)
    t = run.trace
    assert t.overflow[1, 2] and t.overflow[3, 5] and t.overflow.sum() == 2  # the local gradients, pre-all-reduce
    assert (t.found_inf == np.array([[c == "x" for c in "..x..x.."]] * 4)).all()
    assert run.weights_identical.all() and np.isfinite(run.weights).all()
    assert t.scale[:, 2].tolist() == [2048.0] * 4 and t.scale[:, 3].tolist() == [1024.0] * 4
    assert R.same_trace(_sim_for(run, found_inf=flags), t)
    # wrong: each rank's scaler judging only its own gradients
    assert not R.same_trace(R.simulate_ranks(t.policy, found_inf=flags, mode="local"), t)


def test_a_scaler_per_rank_on_gradients_never_all_reduced_drifts_apart():
    flags = ["..x...", "....x."]
    run = R.run_scaler_ranks("local", found_inf=flags, growth_interval=2)
    t = run.trace
    assert t.found_inf.tolist() == t.overflow.tolist() == [[c == "x" for c in f] for f in flags]
    assert t.first_divergence == 3 and t.final_scale.tolist() == [2048.0, 2048.0]
    assert t.scale[:, 4].tolist() == [1024.0, 4096.0]
    assert not run.weights_identical[1:].any()  # each rank trains on its own batches
    assert R.same_trace(_sim_for(run, found_inf=flags), t)
    assert not R.same_trace(R.simulate_ranks(t.policy, found_inf=flags, mode="ddp"), t)


def test_unscale_and_clip_on_local_gradients_then_all_reduce_steps_one_rank_on_nan():
    """Rank 0's batch overflows at step 2. Rank 1's own gradients are clean: its scaler does not
    skip, and it steps on the all-reduced NaN; from step 3 its gradients are NaN too, so rank 0
    (clean scaler, poisoned gradients) steps on NaN at step 3, and from then on both skip."""
    flags = ["..x...", "......"]
    run = R.run_scaler_ranks("unscale_first", found_inf=flags, growth_interval=2)
    t = run.trace
    assert t.poisoned_at == (3, 2)
    assert run.weights_finite.tolist() == [[True] * 4 + [False] * 3, [True] * 3 + [False] * 4]
    assert t.found_inf[:, 4:].all() and t.final_scale.tolist() == [256.0, 256.0]
    assert R.same_trace(_sim_for(run, found_inf=flags), t)
    # wrong: a model without the poisoned weights (no later overflows), and the DDP model
    assert not R.same_trace(R.simulate_ranks(t.policy, found_inf=flags, mode="local"), t)
    assert not R.same_trace(R.simulate_ranks(t.policy, found_inf=flags, mode="ddp"), t)


def test_sharded_grad_scaler_syncs_found_inf_so_all_skip_together():
    flags = ["..x...", "......"]
    run = R.run_scaler_ranks("synced", found_inf=flags, growth_interval=2)
    t = run.trace
    assert t.found_inf[:, 2].all() and not t.nonfinite_step.any()
    assert run.weights_identical.all() and np.isfinite(run.weights).all()
    assert R.same_trace(_sim_for(run, found_inf=flags), t)
    assert R.same_trace(R.simulate_ranks(TorchGradScaler(init_scale=1024, growth_interval=2),
                                         found_inf=flags, mode="ddp"), t, overflow=True)
    assert not R.same_trace(R.simulate_ranks(t.policy, found_inf=flags, mode="unscale_first"), t)


def test_fsdp1_plain_grad_scaler_drifts_and_half_updates_sharded_grad_scaler_does_not():
    """FSDP1 (FULL_SHARD), 2 ranks: an inf reaches rank 0's shard at step 2 and rank 1's at step 4.
    With a plain GradScaler each rank judges its own shard: rank 0 skips step 2 while rank 1 steps,
    so only half the model moves and the scales part. ShardedGradScaler all-reduces the flag:
    both skip both steps."""
    flags = ["..x...", "....x."]
    plain = R.run_scaler_ranks("local", found_inf=flags, fsdp=True, growth_interval=2)
    t = plain.trace
    assert t.overflow.tolist() == [[c == "x" for c in f] for f in flags]  # each shard's inf, after the reduce-scatter
    assert t.scale[:, 4].tolist() == [1024.0, 4096.0] and t.first_divergence == 3
    moved = plain.weights[0, 3] != plain.weights[0, 2]  # the full model (every rank sees the same) over step 2
    assert moved.tolist() == [False] * 4 + [True] * 4 and plain.weights_identical.all()
    assert R.same_trace(_sim_for(plain, found_inf=flags), t)
    assert not R.same_trace(R.simulate_ranks(t.policy, found_inf=flags, mode="synced"), t)
    sharded = R.run_scaler_ranks("synced", found_inf=flags, fsdp=True, growth_interval=2)
    t = sharded.trace
    assert t.found_inf[:, [2, 4]].all() and t.scales_agree.all()
    assert (sharded.weights[:, 3] == sharded.weights[:, 2]).all()
    assert R.same_trace(_sim_for(sharded, found_inf=flags), t)
    assert not R.same_trace(R.simulate_ranks(t.policy, found_inf=flags, mode="local"), t)


def test_scale_dependent_overflows_follow_each_ranks_own_scale():
    """grad_max: rank 0 overflows at step 1 (100 x 1024 > 65504) and backs off to 512; rank 1 grows
    to 2048. At step 4 both have |g| = 40: 40 x 512 fits, 40 x 4096 does not, so only rank 1
    overflows; a simulator sharing one scale (or ignoring it) gets that step wrong."""
    g = np.array([[1.0, 100.0, 1.0, 1.0, 40.0, 1.0], [1.0, 1.0, 1.0, 1.0, 40.0, 1.0]])
    run = R.run_scaler_ranks("local", grad_max=g, growth_interval=2)
    t = run.trace
    assert t.overflow.tolist() == [[False, True, False, False, False, False],
                                   [False, False, False, False, True, False]]
    assert R.same_trace(_sim_for(run, grad_max=g), t)
    assert not R.same_trace(R.simulate_ranks(t.policy, grad_max=g, mode="ddp"), t)
    flags = np.zeros((2, 6), bool)
    flags[0, 1] = True  # the same overflow, taken as fixed flags, misses rank 1's at step 4
    assert not R.same_trace(R.simulate_ranks(t.policy, found_inf=flags, mode="local"), t)


@REAL
@given(seed=st.integers(0, 2**32 - 1), world_size=st.integers(1, 3), steps=st.integers(1, 8),
       mode=st.sampled_from(R.MODES), log_scale=st.integers(4, 12), interval=st.integers(1, 3), fsdp=st.booleans())
def test_simulator_equals_real_runs_on_random_gradient_streams(seed, world_size, steps, mode, log_scale, interval,
                                                               fsdp):
    rng = np.random.default_rng(seed)
    g = np.exp2(rng.uniform(-2, 9, (world_size, steps))) * rng.choice([-1.0, 1.0], (world_size, steps))
    g[rng.random((world_size, steps)) < 0.05] = np.nan
    g[rng.random((world_size, steps)) < 0.05] = -np.inf
    fsdp = fsdp and mode in ("local", "synced")
    run = R.run_scaler_ranks(mode, grad_max=g, fsdp=fsdp, init_scale=2.0**log_scale, growth_interval=interval)
    assert R.same_trace(_sim_for(run, grad_max=g), run.trace)
    if mode in ("ddp", "synced") or fsdp:
        assert run.weights_identical.all()


@REAL
@given(seed=st.integers(0, 2**32 - 1), world_size=st.integers(2, 3), steps=st.integers(1, 8),
       mode=st.sampled_from(R.MODES))
def test_simulator_equals_real_mlp_runs_on_random_overflow_flags(seed, world_size, steps, mode):
    flags = np.random.default_rng(seed).random((world_size, steps)) < 0.25
    run = R.run_scaler_ranks(mode, found_inf=flags, growth_interval=2)
    assert R.same_trace(_sim_for(run, found_inf=flags), run.trace)


# ============================================================================================
# The simulator on its own (numpy only: many examples)
# ============================================================================================


POLICIES = [TorchGradScaler(init_scale=1024.0, growth_interval=2), TorchGradScaler(growth_interval=1),
            TorchGradScaler(init_scale=4.0, growth_factor=1.001, backoff_factor=0.9, growth_interval=1)]
POLICIES += [PRESETS[name] for name in ("Megatron", "DeepSpeed ZeRO", "fairseq") if name in PRESETS]


def _stream(seed, world_size, steps, flags):
    rng = np.random.default_rng(seed)
    if flags:
        return {"found_inf": rng.random((world_size, steps)) < rng.uniform(0, 0.6)}
    g = np.exp2(rng.uniform(-4, 20, (world_size, steps)))
    g[rng.random((world_size, steps)) < 0.03] = np.nan
    return {"grad_max": g}


@PURE
@given(seed=st.integers(0, 2**32 - 1), world_size=st.integers(1, 5), steps=st.integers(0, 40),
       mode=st.sampled_from(R.MODES), flags=st.booleans(), policy=st.sampled_from(POLICIES))
def test_fast_paths_equal_the_step_loop(seed, world_size, steps, mode, flags, policy):
    stream = _stream(seed, world_size, steps, flags)
    fast = R.simulate_ranks(policy, mode=mode, **stream)
    arr = stream.get("found_inf", stream.get("grad_max"))
    loop = R._step_loop(policy, mode, np.asarray(arr), flags, FP16, "float32")
    assert R.same_trace(fast, loop)
    assert fast.scale.shape == (world_size, steps) and np.array_equal(fast.stepped, ~fast.found_inf)
    table = fast.table(range(min(steps, 3)))
    assert len(table.rows) == min(steps, 3) and len(table.columns) == world_size + 1


def _rare_stream(seed, world_size, steps, flags):
    """Streams whose first overflow comes anywhere in the run, on one rank or several at once, some
    ranks identical (they overflow together), and NaN gradients: where unscale_first poisons ranks."""
    rng = np.random.default_rng(seed)
    if flags:
        f = rng.random((world_size, steps)) < rng.choice([0.0, 0.02, 0.1, 0.5])
        f[rng.random(world_size) < 0.3] = f[0]
        return {"found_inf": f}
    g = np.exp2(rng.uniform(-12, rng.choice([-6, 4, 20]), (world_size, steps)))
    g[rng.random(world_size) < 0.3] = g[0]
    g[rng.random((world_size, steps)) < 0.005] = np.nan
    return {"grad_max": g}


@PURE
@given(seed=st.integers(0, 2**32 - 1), world_size=st.integers(1, 9), steps=st.integers(0, 300),
       flags=st.booleans(), policy=st.sampled_from(POLICIES))
def test_unscale_first_equals_the_step_loop(seed, world_size, steps, flags, policy):
    stream = _rare_stream(seed, world_size, steps, flags)
    arr = np.asarray(stream.get("found_inf", stream.get("grad_max")))
    loop = R._step_loop(policy, "unscale_first", arr, flags, FP16, "float32")
    assert R.same_trace(R.simulate_ranks(policy, mode="unscale_first", **stream), loop)


def test_unscale_first_takes_the_scalers_event_by_event(monkeypatch):
    """8 ranks x 20,000 steps, two overflows: the ranks' scalers move event by event as in the other
    modes (a Python step per rank and step took 54 s for 8 x 1M steps), with the step loop's trace."""
    flags = np.zeros((8, 20_000), bool)
    flags[3, 5_000] = flags[6, 12_345] = True
    policy = TorchGradScaler(init_scale=2.0**10, growth_interval=1000)
    streams = [("found_inf", flags), ("grad_max", np.where(flags, np.inf, 2.0**-4)),
               ("grad_max", np.full(flags.shape, 2.0**-4))]  # every rank overflows at once: none is poisoned
    calls, poisoned = [], []
    adjust = DynamicScaler._adjust
    monkeypatch.setattr(DynamicScaler, "_adjust", lambda self, st, found: calls.append(1) or adjust(self, st, found))
    for key, arr in streams:
        loop = R._step_loop(policy, "unscale_first", arr, key == "found_inf", FP16, "float32")
        calls.clear()
        trace = R.simulate_ranks(policy, mode="unscale_first", **{key: arr})
        assert R.same_trace(trace, loop) and len(calls) < 3_000, len(calls)  # the step loop: 160,000
        poisoned.append(int(trace.nonfinite_step.sum()))
    assert poisoned == [8, 8, 0]


@PURE
@given(seed=st.integers(0, 2**32 - 1), world_size=st.integers(1, 5), steps=st.integers(1, 40),
       flags=st.booleans(), policy=st.sampled_from(POLICIES))
def test_how_the_modes_relate(seed, world_size, steps, flags, policy):
    stream = _stream(seed, world_size, steps, flags)
    ddp, synced, local, first = (R.simulate_ranks(policy, mode=m, **stream) for m in R.MODES)
    assert R.same_trace(ddp, synced)
    assert ddp.scales_agree.all() and not ddp.nonfinite_step.any() and not local.nonfinite_step.any()
    key = "found_inf" if flags else "grad_max"
    for r in range(world_size):  # each rank of "local" is the single-rank simulator
        one = simulate(policy, **{key: stream[key][r]})
        assert np.array_equal(local.scale[r], one.scale.astype(np.float64), equal_nan=True)
    if world_size == 1:  # one rank: no one to share an inf with
        assert R.same_trace(ddp, local) and R.same_trace(first, local)
    if flags:
        shared = stream["found_inf"].any(axis=0)
        assert (ddp.found_inf >= shared).all()  # every rank skips at any rank's overflow...
        live = np.isfinite(ddp.scale[0]) & (ddp.scale[0] > 0)  # ...and only then, until a policy ends the run
        assert np.array_equal(ddp.found_inf[:, live], np.broadcast_to(shared[live], (world_size, live.sum())))
        # before the first overflow anywhere, unscale_first is local; there, every rank that steps
        # steps on the inf (and is poisoned from then on)
        t0 = int(np.argmax(shared)) if shared.any() else steps
        assert np.array_equal(first.found_inf[:, :t0 + 1], local.found_inf[:, :t0 + 1])
        assert not first.nonfinite_step[:, :t0].any()
        if shared.any():
            assert np.array_equal(first.nonfinite_step[:, t0], first.stepped[:, t0])


def test_ranks_trace_table_and_repr():
    trace = R.simulate_ranks(TorchGradScaler(init_scale=1024, growth_interval=2),
                             found_inf=["..x.", "...."], mode="unscale_first")
    text = str(trace.table())
    assert text.splitlines()[0] == "unscale_first: 2 ranks"
    assert "2048 skipped (own overflow)" in text and "2048 stepped on inf/NaN" in text
    assert repr(trace) == ("RanksTrace(unscale_first: 2 ranks, 4 steps, skipped per rank [1, 1], final scales "
                           "[1024, 1024], scales differ from step 3, poisoned at [3, 2])")
    assert len(trace.table(range(2)).rows) == 2
    with pytest.raises(ValueError, match=r"^step 4 is outside the run \(0 to 3\)$"):
        trace.table([4])


@pytest.mark.parametrize("kwargs, error, message", [
    ({}, ValueError, "give exactly one of found_inf (per rank and step: did its gradients overflow?) or "
     "grad_max (per rank and step: its largest |gradient|)"),
    ({"found_inf": [True, False]}, ValueError,
     "found_inf must be 2-D, one row per rank and one column per step (got shape (2,))"),
    ({"found_inf": [[0, 2]]}, ValueError, "found_inf must be True/False (or 1/0) everywhere; rank 0, step 1 is 2"),
    ({"found_inf": ["..y"]}, ValueError, "a found_inf pattern uses x (overflow) and . (clean step) only, not 'y'"),
    ({"found_inf": ["..x", "."]}, ValueError, "found_inf patterns must all have the same number of steps"),
    ({"grad_max": [[True]]}, TypeError, "grad_max must be numbers (each rank's largest |gradient| per step), "
     "not booleans; give overflow flags as found_inf="),
    ({"grad_max": "1"}, TypeError, "grad_max must be numbers, one row per rank and one column per step "
     "(each rank's largest |gradient|), not a string"),
    ({"found_inf": [[True]], "mode": "fsdp"}, ValueError,
     "mode must be one of 'ddp', 'synced', 'local', 'unscale_first', not 'fsdp'"),
    ({"grad_max": [[1.0]], "fmt": "fp8_e4m3"}, ValueError, "fp8_e4m3 saturates at 448 instead of overflowing "
     "to inf, so a loss scaler never sees an overflow there; choose a format with inf such as fp16"),
    ({"found_inf": np.zeros((65, 1), bool)}, ValueError, "give at most 64 ranks (rows), not 65"),
])
def test_simulate_ranks_refuses_bad_arguments_in_one_line(kwargs, error, message):
    with pytest.raises(error) as info:
        R.simulate_ranks(TorchGradScaler(), **kwargs)
    assert str(info.value) == message


def test_run_scaler_ranks_and_same_trace_refuse_bad_arguments():
    with pytest.raises(TypeError, match=r"^policy must be a DynamicScaler \(e.g. TorchGradScaler\(\)\), got 'torch'$"):
        R.simulate_ranks("torch", found_inf=[[True]])
    with pytest.raises(ValueError, match=r"^with found_inf the scale must stay at most 2\^14 .* could grow to 2\^17 "):
        R.run_scaler_ranks("ddp", found_inf=np.zeros((2, 5), bool), init_scale=2.0**15, growth_interval=2)
    with pytest.raises(ValueError, match=r"^give at most 200 steps for a real run"):
        R.run_scaler_ranks("ddp", grad_max=np.ones((2, 201)))
    with pytest.raises(ValueError, match=r"^give at most 8 ranks \(rows\) for a real run, not 9$"):
        R.run_scaler_ranks("local", grad_max=np.ones((9, 2)))
    with pytest.raises(ValueError, match=r"^with fsdp=True give mode='local' \(FSDP1 with a plain GradScaler\) "
                                         r"or 'synced' \(with ShardedGradScaler\), not 'ddp'$"):
        R.run_scaler_ranks("ddp", grad_max=np.ones((2, 2)), fsdp=True)
    with pytest.raises(TypeError, match=r"^fsdp must be True or False, not 1$"):
        R.run_scaler_ranks("local", grad_max=np.ones((2, 2)), fsdp=1)
    with pytest.raises(ValueError, match=r"^growth_factor must be > 1.0, not 1.0$"):
        R.run_scaler_ranks("local", grad_max=np.ones((2, 2)), growth_factor=1.0)
    with pytest.raises(ValueError, match=r"^lr must be a finite number >= 0, not -1.0$"):
        R.run_scaler_ranks("local", grad_max=np.ones((2, 2)), lr=-1)
    with pytest.raises(ValueError, match=r"^seed must be between 0 and 2,147,483,648, not -1$"):
        R.run_scaler_ranks("local", grad_max=np.ones((2, 2)), seed=-1)
    with pytest.raises(ValueError, match=r"^grads must have at most 16 rows for a real run \(one process each\), "
                                         r"not 17$"):
        R.run_allreduce(np.ones((17, 2)))
    flags = torch.tensor([[True, False], [False, False]])
    assert R.same_trace(R.simulate_ranks(TorchGradScaler(), found_inf=flags),
                        R.simulate_ranks(TorchGradScaler(), found_inf=["x.", ".."]))
    assert R.same_trace(R.simulate_ranks(TorchGradScaler(), grad_max=torch.ones(2, 3, dtype=torch.bfloat16)),
                        R.simulate_ranks(TorchGradScaler(), grad_max=np.ones((2, 3))))
    trace = R.simulate_ranks(TorchGradScaler(), found_inf=[[True]])
    with pytest.raises(TypeError, match=r"^b must be a RanksTrace \(simulate_ranks or run_scaler_ranks\), not 3$"):
        R.same_trace(trace, 3)
    assert R.same_trace(trace, trace) and not R.same_trace(
        trace, R.simulate_ranks(DynamicScaler(init_scale=2.0), found_inf=[[True]]))


# ----- reduce precision, the compress hooks, Lightning and the checkers (notebook 11b) -----


def test_reduce_errors_grow_with_the_world_and_real_gloo_gives_the_models_bits():
    e = R.reduce_errors(world_sizes=(2, 4, 8), length=4096, real_up_to=4)
    assert set(e.real_equal) == {(d, ws) for d in e.dtypes for ws in (2, 4)} and all(e.real_equal.values())
    for d in e.dtypes:
        ratio = e.error[d] / e.floor[d]
        assert ratio[0] == 1.0  # two ranks: one rounded add is one rounding of the exact sum
        assert 1.0 < ratio[1] < ratio[2]  # each extra rank adds a rounding
    assert (e.error["float32"] < e.error["float16"]).all() and (e.error["float16"] < e.error["bfloat16"]).all()
    assert "model only" in str(e.table()) and "bit-equal" in str(e.table())


def test_reduce_errors_table_prints_the_digits_the_lesson_needs():
    """Two significant digits (norms summed by BLAS differ in their last bits from CPU to CPU); one
    rank sums nothing: an error of exactly 0, and no ratio to a floor of 0."""
    e = R.reduce_errors(world_sizes=(1, 2, 4), dtypes=("float16", "bfloat16"), length=4096, real_up_to=2)
    assert all(e.real_equal.values()) and set(e.real_equal) == {(d, w) for d in e.dtypes for w in (1, 2)}
    for d in e.dtypes:
        assert e.error[d][0] == e.floor[d][0] == 0 and e.error[d][1] == e.floor[d][1] > 0
    lines = str(e.table()).splitlines()
    assert lines[0] == "all-reduce SUM vs the exact sum (relative L2)"
    cells = [[c.strip() for c in line.split("  ") if c.strip()] for line in lines[3:]]
    assert cells[0] == ["1", "0 (one rank: no sum)", "0 (one rank: no sum)", "bit-equal"]
    assert cells[1][1].endswith("(1× floor)") and cells[2][3] == "model only"
    for row, ws in zip(cells[1:], (2, 4)):
        for cell, d in zip(row[1:3], e.dtypes):
            i = e.world_sizes.index(ws)
            err, ratio = e.error[d][i], e.error[d][i] / e.floor[d][i]
            assert cell == f"{float(f'{err:.2g}'):.1e} ({ratio:.2g}× floor)", cell


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(world_sizes=()), ValueError, "world_sizes must list at least one world size, such as (2, 4, 8)"),
    (dict(sigma=0), ValueError, "sigma must be a number above 0 (the gradients' standard deviation), such as "
     "1e-3, not 0"),
    (dict(sigma=-1), ValueError, "sigma must be a number above 0 (the gradients' standard deviation), such as "
     "1e-3, not -1"),
    (dict(sigma=math.inf), ValueError, "sigma must be a number above 0 (the gradients' standard deviation), "
     "such as 1e-3, not inf"),
    (dict(sigma="1"), TypeError, "sigma must be a number, not '1'"),
    (dict(sigma=1e5, dtypes=("float32", "float16")), ValueError,
     "with sigma=100000 the float16 sums overflow (inf), so there is no relative error: pass a smaller sigma, "
     "such as 1e-3"),
    (dict(sigma=1e-30, dtypes=("float16",)), ValueError,
     "with sigma=1e-30 every float16 gradient rounds to 0, so there is no relative error: pass a larger "
     "sigma, such as 1e-3"),
    (dict(real_up_to=-1), ValueError, "real_up_to must be between 0 and 16, not -1"),
])
def test_reduce_errors_refuses_what_has_no_error_in_one_line(kwargs, error, message):
    with pytest.raises(error) as info:
        R.reduce_errors(**{"length": 256, "real_up_to": 0, **kwargs})
    assert str(info.value) == message


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 16), min_size=1, max_size=3, unique=True), dtype=st.sampled_from(DTYPES),
       log_sigma=st.floats(-5, 2), seed=st.integers(0, 2**32 - 1))
def test_reduce_errors_never_beat_one_rounding(sizes, dtype, log_sigma, seed):
    """The floor (the exact sum rounded once) is the nearest value to each sum: no order beats it."""
    e = R.reduce_errors(sizes, (dtype,), length=512, sigma=10.0**log_sigma, seed=seed, real_up_to=0)
    for ws, err, floor in zip(sizes, e.error[dtype], e.floor[dtype]):
        assert 0 <= floor <= err < 1
        assert ws > 2 or err == floor and (ws == 2 or err == 0)
    assert len(e.table().rows) == len(sizes)


@pytest.mark.parametrize("hook", [None, "fp16", "bf16"])
def test_the_compress_hook_model_equals_real_ddp(hook):
    kw = dict(world_size=2, steps=3, init_scale=4e4, length=8192, seed=3)
    real, sim = R.run_compress_hook(hook, **kw), R.simulate_compress_hook(hook, **kw)
    assert real.ranks_agree and real.same(sim), (real, sim)
    if hook == "fp16":  # cast before divide: |S g| > 65,504 is inf on its rank, and so in the sum
        assert real.skipped[0] and 0.15 < real.nonfinite[0] / kw["length"] < 0.23
    else:
        assert not real.skipped.any() and not real.nonfinite.any()


def test_the_compress_hook_model_counts_an_element_lost_on_any_rank():
    sim = R.simulate_compress_hook("fp16", world_size=4, steps=1, init_scale=4e4, length=4096, seed=1)
    g = np.stack([R._compress_grads(1, r, 0, 4096) for r in range(4)])
    lost = (np.abs(np.float32(4e4) * g) > 65_504).any(axis=0)  # 65,504 rounds down, 65,520 up to inf
    assert abs(int(sim.nonfinite[0]) - int(lost.sum())) <= 2  # only entries at the rounding edge may differ


def test_torchs_bf16_compress_hook_is_refused_on_gloo_and_no_rank_is_left():
    with pytest.raises(R.RankError, match=r"raised TypeError: BF16 all reduce communication hook required"):
        R.run_compress_hook("bf16_compress_hook", world_size=2, steps=1, length=16)


def test_compress_hook_refuses_bad_arguments():
    with pytest.raises(ValueError, match=r"^hook must be None \(DDP's fp32 all-reduce\), 'fp16'"):
        R.simulate_compress_hook("fp8")
    with pytest.raises(ValueError, match=r"^world_size must be between 1 and 8"):
        R.run_compress_hook("fp16", world_size=9)


def test_lightning_16_mixed_on_cpu_is_bf16_and_the_fp16_plugin_skips_together():
    pytest.importorskip("lightning")
    mixed = R.run_lightning_ranks("16-mixed", found_inf=["x...", "...."])
    assert (mixed.precision, mixed.scaler, mixed.out_dtype) == ("bf16-mixed", False, "bfloat16")
    assert "Using `precision='bf16-mixed'` instead." in mixed.warnings[0]
    assert mixed.stepped.all() and mixed.weights_identical.all() and not mixed.weights_finite[:, -1].any()
    fp16 = R.run_lightning_ranks(found_inf=["x...", "...."], init_scale=1024)
    assert (fp16.precision, fp16.scaler, fp16.out_dtype, fp16.warnings) == ("16-mixed", True, "float16", ())
    assert fp16.stepped.tolist() == [[False, True, True, True]] * 2 and (fp16.scale == 512).all()
    assert fp16.global_step.tolist() == [[1, 2, 3, 4]] * 2  # global_step counts the skipped step
    assert fp16.weights_identical.all() and fp16.weights_finite.all()
    with pytest.raises(ValueError, match=r"^give 1 to 4 ranks"):
        R.run_lightning_ranks(found_inf=["."] * 5)


def test_notebook_11_checkers():
    assert R.check_ddp_skips(None).status == "unanswered"
    assert R.check_ddp_skips(4) and R.check_ddp_skips("4") and not R.check_ddp_skips(1)
    assert R.check_local_scales((1024, 4096)) and R.check_local_scales(["1024", "2^12"])
    assert not R.check_local_scales((1024, 2048)) and not R.check_local_scales("1024, 4096")
    assert not R.check_local_scales(4096)
    import torch.distributed as dist

    for right in ("min", "MIN", "ReduceOp.MIN", " Min. ", "dist.ReduceOp.MIN", "torch.distributed.ReduceOp.MIN",
                  "RedOpType.MIN", str(dist.ReduceOp.MIN), dist.ReduceOp.MIN, dist.ReduceOp(dist.ReduceOp.MIN)):
        assert R.check_found_inf_op(right), right
    for wrong in ("max", "sum", "avg", 0, "product", dist.ReduceOp.MAX, dist.ReduceOp.SUM, "dist.ReduceOp.MAX",
                  "torch.distributed.ReduceOp.SUM", "dist.min.max", "minimum.MIN", "numpy.min", "ReduceOp.MIN.MAX"):
        assert R.check_found_inf_op(wrong).status == "wrong", wrong
    assert R.check_found_inf_op(None).status == "unanswered"
    for right in (0.575, "57%", "0.56", 1 - 0.9**8):
        assert R.check_compress_share(right), right
    for wrong in (0.1, "10%", 0.9, True, "most"):
        assert R.check_compress_share(wrong).status == "wrong", wrong
    # the expected answers, from the simulator that the tests above hold to real runs
    t = R.simulate_ranks(TorchGradScaler(init_scale=1024, growth_interval=2), found_inf=["x...", "...."],
                         mode="local")
    assert t.final_scale.tolist() == [1024.0, 4096.0]


@PURE
@given(prefix=st.sampled_from(["", "dist.", "torch.distributed.", "ReduceOp.", "dist.ReduceOp.", "RedOpType.",
                               "torch.distributed.ReduceOp.", "dist.ReduceOp.RedOpType."]),
       op=st.sampled_from(["MIN", "min", "Min", "MAX", "SUM", "AVG", "PRODUCT", "BAND"]), text=st.text(max_size=20))
def test_the_found_inf_op_checker_reads_torchs_names(prefix, op, text):
    assert R.check_found_inf_op(f" {prefix}{op}. ").status == ("right" if op.lower() == "min" else "wrong")
    assert R.check_found_inf_op(text).status == "wrong" or "min" in text.casefold()


def _reduce_flag(rank, world_size, op):
    import torch.distributed as dist

    t = torch.tensor([float(rank == 1)])
    dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
    return t.item()


def test_found_inf_reduced_with_each_op_on_gloo():
    """The facts behind check_found_inf_op: only MIN leaves every rank's flag at 0."""
    got = {op: R.run_ranks(_reduce_flag, 4, op) for op in ("SUM", "MAX", "MIN", "AVG")}
    assert got == {"SUM": [1.0] * 4, "MAX": [1.0] * 4, "MIN": [0.0] * 4, "AVG": [0.25] * 4}


def test_what_was_printed_before_the_ranks_start_is_printed_once():
    """A rank is a fork: without a flush first, it inherits this process's buffered output and
    prints it again (a notebook cell then showed its table three times)."""
    code = ("import os, sys; from ampviz.ranks import run_ranks\n"
            "class Buffered:  # as a notebook kernel's stdout: text kept in Python until a flush\n"
            "    def __init__(self): self.text = ''\n"
            "    def write(self, text): self.text += text; return len(text)\n"
            "    def flush(self): os.write(1, self.text.encode()); self.text = ''\n"
            "sys.stdout = Buffered()\n"
            "print('printed before', end='')\n"
            "run_ranks(lambda rank, n: rank, 2)\n"
            "print(' and after')\n"
            "sys.stdout.flush()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "printed before and after\n"
