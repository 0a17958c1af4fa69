"""torch.autocast, measured (ampviz.training.autocast).

Every CPU cell of the op table equals a direct run written here, independently of the module; the
documented CUDA column matches torch's own list in the installed header; the CPU/CUDA differences
are checked as measured facts. The loss dtypes and GradScaler's first step are checked against a
direct run, bit for bit. The weight-cache counts are checked against two independent measurements
(the autograd graph, and whether an in-place update is seen). Each check also shows a wrong
variant that fails it. Arbitrary arguments give a result or a one-line ValueError/TypeError.
"""

import os
import re

import numpy as np

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ampviz.training import autocast as A
from ampviz.training.bf16 import checkers as B16C
from ampviz.pitfalls import autocast_cache

SHORT = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
DTYPES = (torch.float16, torch.bfloat16)


@pytest.fixture(scope="module")
def table():
    return A.op_table()


# ---------------------------------------------------------------- direct runs, written here
def _inputs(dtype):
    gen = torch.Generator().manual_seed(123)

    def t(*shape, kind="normal"):
        x = torch.randn(*shape, generator=gen)
        x = x.abs() + 1.0 if kind == "pos" else torch.sigmoid(x) if kind == "unit" else x
        return x.to(dtype)

    return t


def _labels(n, high):
    return torch.randint(0, high, (n,), generator=torch.Generator().manual_seed(5))


# name -> (make(t, dt) -> args, op); ``t`` makes float inputs in the run's dtype, ``dt`` is the autocast dtype
DIRECT = {
    "linear": (lambda t, dt: (t(4, 8), t(6, 8), t(6)), F.linear),
    "matmul": (lambda t, dt: (t(4, 8), t(8, 6)), lambda a, b: a @ b),
    "bmm": (lambda t, dt: (t(2, 3, 4), t(2, 4, 5)), torch.bmm),
    "addmm": (lambda t, dt: (t(6), t(4, 8), t(8, 6)), torch.addmm),
    "baddbmm": (lambda t, dt: (t(2, 3, 5), t(2, 3, 4), t(2, 4, 5)), torch.baddbmm),
    "mv": (lambda t, dt: (t(6, 8), t(8)), torch.mv),
    "conv1d": (lambda t, dt: (t(1, 2, 7), t(3, 2, 3)), F.conv1d),
    "conv2d": (lambda t, dt: (t(1, 2, 5, 5), t(3, 2, 3, 3)), F.conv2d),
    "scaled_dot_product_attention": (lambda t, dt: (t(1, 2, 4, 8), t(1, 2, 4, 8), t(1, 2, 4, 8)),
                                     F.scaled_dot_product_attention),
    "relu": (lambda t, dt: (t(4, 8),), torch.relu),
    "gelu": (lambda t, dt: (t(4, 8),), F.gelu),
    "tanh": (lambda t, dt: (t(4, 8),), torch.tanh),
    "sigmoid": (lambda t, dt: (t(4, 8),), torch.sigmoid),
    "softplus": (lambda t, dt: (t(4, 8),), F.softplus),
    "softmax": (lambda t, dt: (t(4, 8),), lambda x: x.softmax(-1)),
    "log_softmax": (lambda t, dt: (t(4, 8),), lambda x: x.log_softmax(-1)),
    "layer_norm": (lambda t, dt: (t(4, 8),), lambda x: nn.functional.layer_norm(x, (8,))),
    "group_norm": (lambda t, dt: (t(2, 4, 3),), lambda x: F.group_norm(x, 2)),
    "batch_norm": (lambda t, dt: (t(4, 8), t(8), t(8, kind="pos")),
                   lambda x, m, v: F.batch_norm(x, m, v, training=False)),
    "rms_norm": (lambda t, dt: (t(4, 8),), lambda x: F.rms_norm(x, (8,))),
    "mse_loss": (lambda t, dt: (t(4, 8), t(4, 8)), F.mse_loss),
    "cross_entropy": (lambda t, dt: (t(4, 5), _labels(4, 5)), F.cross_entropy),
    "nll_loss": (lambda t, dt: (t(4, 5), _labels(4, 5)), F.nll_loss),
    "binary_cross_entropy_with_logits": (lambda t, dt: (t(4, 8), t(4, 8, kind="unit")),
                                         F.binary_cross_entropy_with_logits),
    "binary_cross_entropy": (lambda t, dt: (t(4, 8, kind="unit"), t(4, 8, kind="unit")), F.binary_cross_entropy),
    "l1_loss": (lambda t, dt: (t(4, 8), t(4, 8)), F.l1_loss),
    "exp": (lambda t, dt: (t(4, 8),), lambda x: x.exp()),
    "log": (lambda t, dt: (t(4, 8, kind="pos"),), lambda x: x.log()),
    "pow": (lambda t, dt: (t(4, 8),), lambda x: x**2),
    "sum": (lambda t, dt: (t(4, 8),), lambda x: x.sum()),
    "mean": (lambda t, dt: (t(4, 8),), lambda x: x.mean()),
    "cumsum": (lambda t, dt: (t(4, 8),), lambda x: x.cumsum(0)),
    "prod": (lambda t, dt: (t(4, 8),), lambda x: x.prod()),
    "norm": (lambda t, dt: (t(4, 8),), lambda x: x.norm()),
    "add (mixed)": (lambda t, dt: (torch.ones(4, 8, dtype=dt), torch.ones(4, 8)), lambda a, b: a + b),
    "mul (mixed)": (lambda t, dt: (torch.ones(4, 8, dtype=dt), torch.ones(4, 8)), lambda a, b: a * b),
    "cat (mixed)": (lambda t, dt: (torch.ones(4, 8, dtype=dt), torch.ones(4, 8)), lambda a, b: torch.cat((a, b))),
    "cat (fp16 + fp32)": (lambda t, dt: (torch.ones(4, 8, dtype=torch.float16), torch.ones(4, 8)),
                          lambda a, b: torch.cat((a, b))),
    "addcmul (mixed)": (lambda t, dt: (torch.ones(4, 8), torch.ones(4, 8, dtype=dt), torch.ones(4, 8, dtype=dt)),
                        torch.addcmul),
    "dropout": (lambda t, dt: (t(4, 8),), lambda x: F.dropout(x, 0.5, training=False)),
    "embedding": (lambda t, dt: (_labels(4, 6), t(6, 8)), F.embedding),
}
MIXED = {name for name in DIRECT if "(" in name}


class _Copies(TorchDispatchMode):
    """Counts the casts that reach the dispatcher (autocast's included)."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default:
            self.n += 1
        return func(*args, **(kwargs or {}))


def _direct(name, dt, inputs_dtype=torch.float32, enabled=True):
    """(output dtype or the exception, casts seen) of the op under CPU autocast, run here."""
    make, op = DIRECT[name]
    args = make(_inputs(inputs_dtype), dt)
    try:
        with _Copies() as copies, torch.autocast("cpu", dtype=dt, enabled=enabled):
            out = op(*args)
    except RuntimeError as exc:
        return exc, 0
    return out.dtype, copies.n


def _expected_cell(name, dt):
    out, casts = _direct(name, dt)
    if isinstance(out, Exception):
        return A.Cell(None, None, f"RuntimeError: {str(out).splitlines()[0]}")
    if out == dt:
        return A.Cell(SHORT[dt], f"ran in {SHORT[dt]}")
    if name in MIXED:
        return A.Cell(SHORT[out], "widest input" if casts else "own promotion")
    again, _ = _direct(name, dt, inputs_dtype=dt)
    return A.Cell(SHORT[out], "ran in fp32" if again == torch.float32 else "as its input")


# ---------------------------------------------------------------- the op table
def test_the_table_covers_the_direct_runs(table):
    assert A.OPS == tuple(DIRECT) == tuple(r.op for r in table.rows)
    assert 25 <= len(A.OPS) <= 45
    assert table.dtypes == ("float16", "bfloat16") and table.device == "cpu"
    assert table.table.columns[:3] == ("op", "CPU fp16 (measured)", "CPU bf16 (measured)")


@pytest.mark.parametrize("dt", DTYPES, ids=["float16", "bfloat16"])
def test_every_cpu_cell_equals_a_direct_run(table, dt):
    key = str(dt).replace("torch.", "")
    for row in table.rows:
        cell, expected = row.measured[key], _expected_cell(row.op, dt)
        if expected.error:  # the exact message, cut as the table cuts it
            assert cell.error is not None and expected.error.startswith(cell.error.removesuffix("...")), row.op
            assert (cell.dtype, cell.rule) == (None, None)
        else:
            assert cell == expected, row.op
        assert table.table.rows[A.OPS.index(row.op)][1 + DTYPES.index(dt)] == str(cell)


def test_a_table_filled_from_the_docs_or_without_autocast_fails_the_direct_runs(table):
    """Wrong variants: the CUDA documentation's column, or autocast off, as the CPU column."""
    from_docs = [r.op for r in table.rows if r.cuda_docs != _expected_cell(r.op, torch.float16)]
    assert {"softmax", "layer_norm", "sum", "exp", "mv", "cat (mixed)", "addcmul (mixed)"} <= set(from_docs)
    disabled = [name for name in ("linear", "conv2d", "bmm") if _direct(name, torch.float16, enabled=False)[0]
                != _direct(name, torch.float16)[0]]
    assert disabled == ["linear", "conv2d", "bmm"]


def test_cpu_and_cuda_autocast_differ_here(table):
    """Measured on the CPU, against the documented (and this build's) CUDA lists."""
    assert table.differences() == ("mv", "softplus", "softmax", "log_softmax", "layer_norm", "group_norm", "rms_norm",
                                   "binary_cross_entropy", "exp", "log", "pow", "sum", "cumsum", "norm",
                                   "cat (mixed)", "cat (fp16 + fp32)", "addcmul (mixed)")
    # softmax and sum: CPU autocast leaves a float16 input in float16; CUDA's lists run them in float32
    half = torch.randn(4, 8).half()
    with torch.autocast("cpu", dtype=torch.float16):
        assert half.softmax(-1).dtype == torch.float16 and half.sum().dtype == torch.float16
        assert torch.mv(torch.randn(3, 4), torch.randn(4)).dtype == torch.float32  # CUDA docs: mv in float16
        p = torch.sigmoid(torch.randn(4))
        assert F.binary_cross_entropy(p, p).dtype == torch.float32  # CUDA: refused
    assert {"softmax", "sum"} <= A.CUDA_DOCS_FP32 and "mv" in A.CUDA_DOCS_FP16
    assert "binary_cross_entropy" in A.CUDA_DOCS_BANNED
    bce = table.row("binary_cross_entropy")
    assert bce.cuda.error.startswith("RuntimeError: torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss "
                                     "are unsafe to autocast.")
    assert str(bce.measured["float16"]) == "fp32, ran in fp32" and str(bce.cuda_docs) == "raises an error"
    # under bf16 CPU autocast, cat of a float16 and a float32 tensor is refused; under fp16 it is promoted
    with pytest.raises(RuntimeError, match=r"^Unexpected floating ScalarType in at::autocast::prioritize$"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.cat((torch.ones(2, dtype=torch.float16), torch.ones(2)))
    assert table.row("cat (fp16 + fp32)").measured["bfloat16"].error == (
        "RuntimeError: Unexpected floating ScalarType in at::autocast::prioritize")
    # the same rows without the differences flag set are the same rule on both
    assert not table.row("linear").differs and not table.row("mse_loss").differs


def _header_lists():
    path = os.path.join(os.path.dirname(torch.__file__), "include", "ATen", "autocast_mode.h")
    if not os.path.exists(path):
        pytest.skip("torch's autocast_mode.h is not installed with this torch")
    with open(path, encoding="utf-8") as f:
        text = f.read()

    def names(macro):
        body = re.search(rf"#define {macro}\(_\)(.*?)\n\n", text, re.S)[1]
        return set(re.findall(r"_\((?:ADD_NS\()?(\w+)", body))

    return {"fp16": names("AT_FORALL_LOWER_PRECISION_FP"),
            "fp32": names("AT_FORALL_FP32") | names("AT_FORALL_FP32_SET_OPT_DTYPE")
            | names("AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE"),
            "promote": names("AT_FORALL_PROMOTE")}


def _docs_disagree(header, fp16, fp32, promote):
    """The ops of the table whose documented CUDA list is not the installed header's list (ops the
    header does not register, such as cross_entropy, a composite, are not compared)."""
    out = []
    for op in A._OPS:
        in_header = [k for k, names in header.items() if op.docs in names]
        docs = "fp16" if op.docs in fp16 else "fp32" if op.docs in fp32 else "promote" if op.docs in promote else None
        if in_header and in_header != [docs]:
            out.append(op.name)
    return out


def test_the_documented_column_agrees_with_the_installed_header():
    """The docs lists were copied by hand; torch's own header (the CUDA autocast lists of this
    build) catches a slip, such as softmax copied into the float16 list."""
    header = _header_lists()
    assert sum(any(op.docs in names for names in header.values()) for op in A._OPS) >= 20
    lists = (A.CUDA_DOCS_FP16, A.CUDA_DOCS_FP32, A.CUDA_DOCS_PROMOTE)
    assert _docs_disagree(header, *lists) == ["scaled_dot_product_attention", "rms_norm"]  # not (yet) in the docs
    slip = (A.CUDA_DOCS_FP16 | {"softmax"}, A.CUDA_DOCS_FP32 - {"softmax"}, A.CUDA_DOCS_PROMOTE)
    assert "softmax" in _docs_disagree(header, *slip)


@pytest.fixture(scope="module")
def fake_table():
    return A.op_table(cuda="fake")


def test_the_fake_cuda_column_matches_the_docs_but_where_the_docs_lag(fake_table):
    table = fake_table
    lag = [r.op for r in table.rows if A._rule_of(r.cuda_docs) != A._rule_of(r.cuda)]
    assert lag == ["scaled_dot_product_attention", "rms_norm"]
    assert str(table.row("scaled_dot_product_attention").cuda) == "fp16, ran in fp16"
    assert str(table.row("rms_norm").cuda) == "fp32, ran in fp32"
    assert table.cuda_source == "this build's CUDA autocast on fake CUDA tensors"
    assert table.table.columns[4] == "CUDA fp16 (fake tensors)"


def test_the_fake_cuda_table_prints_the_same_with_a_gpu(fake_table, monkeypatch):
    """The lesson's checked cell: ``op_table(cuda="fake")`` prints the same text where CUDA is
    available and torch is a CUDA build (here pretended: nothing of it runs on a GPU)."""
    text = str(fake_table)
    assert "torch 2.13.0: torch.autocast on float32 inputs" in text and "+cpu" not in text
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch, "__version__", torch.torch_version.TorchVersion("2.13.0+cu128"))
    again = A.op_table(cuda="fake")
    assert str(again) == text and again.cuda_source == fake_table.cuda_source
    assert A._cuda_where("auto") == "cuda" and A._cuda_where("fake") == "fake-cuda"  # wrong variant: auto


def test_the_default_measures_on_a_gpu_where_there_is_one(table, fake_table):
    if torch.cuda.is_available():
        assert table.cuda_source == "measured on CUDA"
    else:
        assert str(table) == str(fake_table)


def test_the_differences_table(fake_table):
    t = fake_table.differences_table()
    assert t.column("op") == fake_table.differences()
    assert t.columns == ("op", "CPU fp16 (measured)", "CPU bf16 (measured)", "CUDA fp16 (fake tensors)")
    assert t.title == "where CPU and CUDA autocast differ: 17 of 41 ops"
    softmax = t.rows[t.column("op").index("softmax")]
    assert softmax[1:] == ("fp32, as its input", "fp32, as its input", "fp32, ran in fp32")


def test_the_fake_cuda_runs_leave_no_state_behind(table):
    assert torch.is_autocast_enabled("cuda") is False and torch.get_autocast_dtype("cuda") == torch.float16
    assert not torch.is_autocast_enabled("cpu") and A._autocast_depth() == 0


def test_one_dtype_and_a_bf16_first_table():
    t = A.op_table("bfloat16")
    assert t.dtypes == ("bfloat16",) and len(t.table.columns) == 5
    assert str(t.row("linear").cuda) == "bf16, ran in bf16" and str(t.row("linear").cuda_docs) == "bf16, ran in bf16"
    assert "cat (fp16 + fp32)" in t.differences()


@pytest.mark.gpu
def test_on_a_gpu_the_measured_cuda_column_is_the_fake_one(fake_table):
    """What the lesson prints from fake tensors (its checked cell) is what the GPU does."""
    measured = A.op_table(cuda="gpu")
    assert measured.cuda_source == "measured on CUDA"
    for gpu, fake in zip(measured.rows, fake_table.rows):
        assert A._rule_of(gpu.cuda) == A._rule_of(fake.cuda), gpu.op
        assert (gpu.cuda.dtype, gpu.differs) == (fake.cuda.dtype, fake.differs), gpu.op
    assert measured.differences() == fake_table.differences()


@pytest.mark.gpu
def test_on_a_gpu_cuda_is_measured_and_agrees_with_the_fake_run():
    t = A.op_table(device="cuda")
    assert t.cuda_source == "measured on CUDA" and t.table.columns[1] == "CUDA fp16 (measured)"
    for row in t.rows:  # the dispatch on fake CUDA tensors gives the rule a real GPU gives
        fake = A._measure(A._OPS[A.OPS.index(row.op)], "fake-cuda", torch.float16)
        assert A._rule_of(fake) == A._rule_of(row.measured["float16"]), row.op


# ---------------------------------------------------------------- the loss
def _direct_step(loss, dt, seed=0, init_scale=2.0**16):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = nn.Linear(4, 3)
        g = torch.Generator().manual_seed(seed)
        x, target, labels = torch.randn(8, 4, generator=g), torch.randn(8, 3, generator=g), torch.randint(
            0, 3, (8,), generator=g)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = model.weight.detach().clone()
    with torch.autocast("cpu", dtype=dt):
        out = model(x)
        value = {"mse_loss": lambda: F.mse_loss(out, target), "cross_entropy": lambda: F.cross_entropy(out, labels),
                 "output.sum()": out.sum, "output.mean()": out.mean,
                 "output.float().sum()": lambda: out.float().sum()}[loss]()
    scaled = scaler.scale(value)
    scaled.backward()
    scaler.step(opt)
    scaler.update()
    return value.detach(), scaled.detach(), not torch.equal(w, model.weight.detach()), scaler.get_scale()


@pytest.mark.parametrize("loss", list(A.LOSSES))
def test_loss_report_equals_a_direct_step(loss):
    r = A.loss_report(loss)
    value, scaled, stepped, scale = _direct_step(loss, torch.float16)
    assert (r.loss, r.scaled) == (float(value), float(scaled))  # bit for bit
    assert (r.loss_dtype, r.scaled_dtype) == (SHORT[value.dtype], SHORT[scaled.dtype])
    assert (r.step_skipped, r.scale_after) == (not stepped, scale)
    assert r.scaled == r.loss * 65536.0  # a power of two: exact in float32


def test_the_loss_comes_out_float32_and_the_scaled_loss_does_not_overflow():
    for loss in ("mse_loss", "cross_entropy"):
        r = A.loss_report(loss)
        assert (r.output_dtype, r.loss_dtype, r.scaled_dtype) == ("fp16", "fp32", "fp32")
        assert r.output_grad_dtype == "fp16" and 0 < r.output_grad_max < 65504
        assert r.weight_grad_finite and not r.step_skipped and r.scale_after == 65536.0
    ce = A.loss_report("cross_entropy")
    assert ce.scaled > 65504 and not ce.scaled_fits_fp16  # would be inf in float16, is finite in float32


def test_where_the_first_step_overflows():
    for loss in ("output.sum()", "output.mean()"):  # a float16 loss: d(loss)*65536 is inf in float16
        r = A.loss_report(loss)
        assert r.loss_dtype == "fp16" and r.output_grad_max == float("inf")
        assert not r.weight_grad_finite and r.step_skipped and r.scale_after == 32768.0
    r = A.loss_report("output.float().sum()")  # a float32 loss does not protect the float16 backward
    assert r.loss_dtype == "fp32" and r.output_grad_max == float("inf") and r.step_skipped
    # wrong variants: bfloat16 autocast, or a smaller scale, and the same step runs
    bf = A.loss_report("output.sum()", "bfloat16")
    assert bf.loss_dtype == "bf16" and bf.output_grad_max == 65536.0 and not bf.step_skipped
    assert _direct_step("output.sum()", torch.float16, init_scale=2.0**12)[2] is True
    # at 2^13 the gradient at the output (8192 each) fits, but the weight-gradient product overflows
    assert _direct_step("output.sum()", torch.float16, init_scale=2.0**13)[2] is False


def test_loss_table():
    t = A.loss_table()
    assert [r[0] for r in t.rows] == list(A.LOSSES)
    assert t.column("loss dtype") == ("fp32", "fp32", "fp16", "fp16", "fp32")
    assert t.column("step 1") == ("runs, scale 65536",) * 2 + ("skipped, scale 32768",) * 3
    assert t.column("max |grad| at the output")[2] == "fp16 inf"
    assert A.loss_table("bfloat16").column("step 1") == ("runs, scale 65536",) * 5


# ---------------------------------------------------------------- the weight cache
CASTS = {"one_block": 1, "nested_blocks": 1, "separate_blocks": 2, "cache_disabled": 2, "clear_cache": 2,
         "no_grad": 1, "no_grad_then_grad": 1, "inference_mode": 2, "frozen_weight": 2, "other_dtype_inside": 1,
         "no_autocast": 0}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_weight_casts_per_case(dtype):
    for case, n in CASTS.items():
        r = A.weight_casts(case, dtype)
        assert r.weight_casts == n and r.bias_casts == n, case
        assert r.input_casts == (0 if case == "no_autocast" else 2), case
        assert not r.inside_autocast


def _graph_copies(ys, weight):
    """Distinct cast nodes of ``weight`` that the outputs hang on (found here, from the autograd graph)."""
    found = set()
    for y in ys:
        todo = [y.grad_fn]
        while todo:
            node = todo.pop()
            if node is None:
                continue
            if type(node).__name__ == "ToCopyBackward0" and any(
                    getattr(n, "variable", None) is weight for n, _ in node.next_functions):
                found.add(node)
            todo.extend(n for n, _ in node.next_functions)
    return len(found)


@pytest.mark.parametrize("cache_enabled", [True, False])
def test_the_count_agrees_with_the_autograd_graph(cache_enabled):
    torch.manual_seed(0)
    lin, x = nn.Linear(8, 4), torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.float16, cache_enabled=cache_enabled):
        ys = [lin(x), lin(x)]
    case = "one_block" if cache_enabled else "cache_disabled"
    r = A.weight_casts(case)
    assert _graph_copies(ys, lin.weight) == r.weight_casts == (1 if cache_enabled else 2)
    assert r.shared_copy is cache_enabled


def test_a_cached_copy_is_a_stale_copy():
    """Two independent measurements: one cast for two forwards ⇔ an in-place update is not seen."""
    for dtype in ("float16", "bfloat16"):
        for case, stale_case in A._STALE_CASE.items():
            cached = A.weight_casts(case, dtype).weight_casts == 1
            changed = autocast_cache.in_place_update(stale_case, dtype).details["output changed"]
            assert cached is (not changed), (case, dtype)


def test_no_grad_caches_a_copy_that_carries_grad_and_inference_mode_does_not_cache():
    r = A.weight_casts("no_grad_then_grad")
    assert r.weight_casts == 1 and r.grad_fn is True  # pytorch/pytorch PR #165068
    assert A.weight_casts("no_grad").weight_casts == 1
    assert A.weight_casts("inference_mode").weight_casts == 2


def test_the_cache_is_keyed_by_the_weight_not_the_dtype():
    assert A.weight_casts("other_dtype_inside", "float16").error == (
        "RuntimeError: mat1 and mat2 must have the same dtype, but got BFloat16 and Half")
    assert A.weight_casts("other_dtype_inside", "bfloat16").error == (
        "RuntimeError: mat1 and mat2 must have the same dtype, but got Half and BFloat16")
    # wrong variant: without the cache the same arrangement runs
    torch.manual_seed(0)
    lin, x = nn.Linear(8, 4), torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.float16, cache_enabled=False):
        lin(x)
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
            assert lin(x).dtype == torch.bfloat16


def test_inside_an_outer_block_the_outer_block_keeps_the_cache():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        r = A.weight_casts("separate_blocks")
    assert r.inside_autocast and r.weight_casts == 1
    assert A.weight_casts("separate_blocks").weight_casts == 2


def test_cache_table():
    t = A.cache_table()
    assert t.column("two forwards of nn.Linear") == tuple(A.CACHE_CASES.values())
    assert t.column("casts of the weight") == ("1", "1", "2", "2", "2", "1", "1", "2", "2", "raises RuntimeError", "0")
    assert t.column("sees an in-place update") == ("no: stale copy", "no: stale copy", "yes", "yes", "yes",
                                                   "no: stale copy", "—", "yes", "yes", "—", "yes")
    assert A.cache_table("clear_cache", "bfloat16").rows == (
        ("one block, torch.clear_autocast_cache() between the forwards", "2", "yes"),)


# ---------------------------------------------------------------- torch.compile
@pytest.mark.parametrize("backend,dtype", [("aot_eager", "float16"), ("aot_eager", "bfloat16"),
                                           ("inductor", "bfloat16")])
def test_compile_sees_the_update(backend, dtype):
    r = A.compile_report(backend, dtype)
    short = SHORT[getattr(torch, dtype)]
    assert (r.output_dtype, r.compiled_output_dtype) == (short, short)
    assert r.eager_sees_update is False and r.compiled_sees_update is True and r.same_as_fresh_eager is True
    assert 0 < r.seconds < 60


# ---------------------------------------------------------------- one layer; any code under autocast
class _Ops(TorchDispatchMode):
    """Every op that reaches the dispatcher: (name, input dtypes, output dtype), written here."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.seen.append((func.__name__.split(".")[0], tuple(a.dtype for a in args if isinstance(a, torch.Tensor)),
                          out.dtype))
        return out


@pytest.mark.parametrize("dt", DTYPES, ids=["float16", "bfloat16"])
def test_layer_walk_equals_a_direct_run(dt):
    torch.manual_seed(0)
    lin, x = nn.Linear(8, 4), torch.randn(4, 8)
    with _Ops() as ops, torch.autocast("cpu", dtype=dt):
        y = lin(x)
        assert lin.weight.dtype == torch.float32  # the parameter itself is never cast
    y.float().pow(2).mean().backward()
    low = SHORT[dt]
    t = A.layer_walk(str(dt).replace("torch.", ""))
    rows = dict(t.rows)
    casts = [name for name, _, out in ops.seen if name == "_to_copy" and out == dt]
    assert len(casts) == 3 == sum(k.startswith("autocast casts") for k in rows)  # x, weight, bias: once each
    assert {k for k in rows if k.startswith("autocast casts")} == {
        f"autocast casts {n}: aten._to_copy" for n in ("x", "lin.weight", "lin.bias")}
    assert set(rows[f"autocast casts {n}: aten._to_copy"] for n in ("x", "lin.weight", "lin.bias")) == {
        f"fp32 → {low} (a new tensor)"}
    addmm = next(d for name, d, _ in ops.seen if name == "addmm")
    assert rows["aten.addmm"] == f"{', '.join(SHORT[d] for d in addmm)} → {low}" == f"{low}, {low}, {low} → {low}"
    assert rows["y = lin(x)"] == SHORT[y.dtype] == low
    assert rows["lin.weight, inside the block"] == "fp32"
    assert rows["y's graph, back to lin.weight"] == "AddmmBackward0 ← TBackward0 ← ToCopyBackward0 ← lin.weight"
    assert rows["after the block: lin.weight, lin.weight.grad"] == f"fp32, {SHORT[lin.weight.grad.dtype]}"
    # wrong variant: the same forward without autocast casts nothing and stays fp32
    with _Ops() as plain:
        assert lin(x).dtype == torch.float32
    assert not any(name == "_to_copy" for name, _, _ in plain.seen)


def test_under_autocast_records_what_the_dispatcher_sees():
    x = torch.randn(4, 8)
    run = A.under_autocast(lambda x: torch.softmax(x @ x.T, dim=-1), x)
    with _Ops() as ops, torch.autocast("cpu", dtype=torch.float16):
        direct = torch.softmax(x @ x.T, dim=-1)
    assert run.ops == tuple((n, tuple(SHORT[d] for d in ins), (SHORT[o],)) for n, ins, o in ops.seen)
    assert run.output == (SHORT[direct.dtype],) == ("fp16",) and run.error is None
    assert [n for n, _, _ in run.ops] == ["permute", "_to_copy", "_to_copy", "mm", "_softmax"]
    assert run.table().title == 'under torch.autocast("cpu", dtype=torch.float16): output fp16'
    assert run.table().column("op")[1] == "cast aten._to_copy"
    # an error of the code under autocast is the result
    bad = A.under_autocast(lambda a, b: torch.cat([a, b]), x.half(), x, dtype="bfloat16")
    assert bad.error == "RuntimeError: Unexpected floating ScalarType in at::autocast::prioritize"
    assert str(bad).startswith('under torch.autocast("cpu", dtype=torch.bfloat16): raised RuntimeError')
    pair = A.under_autocast(lambda x: (x.exp(), x @ x.T, 3), x)
    assert pair.output == ("fp32", "fp16", "int")
    assert not torch.is_autocast_enabled("cpu")


def test_compile_table():
    t = A.compile_table()
    assert t.rows == (("eager", "bf16", "no: stale copy", "no"),
                      ('torch.compile(forward, backend="aot_eager")', "bf16", "yes", "yes"))
    assert "bf16 CPU autocast" in t.title


# ---------------------------------------------------------------- the exercises
@pytest.mark.parametrize("loss", list(A.OTHER_LOSSES))
def test_the_other_losses_equal_a_direct_step(loss):
    fn = {"mse_loss(reduction='sum')": lambda o, t: F.mse_loss(o, t, reduction="sum"),
          "l1_loss": lambda o, t: F.l1_loss(o, t)}[loss]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = nn.Linear(4, 3)
        g = torch.Generator().manual_seed(0)
        x, target = torch.randn(8, 4, generator=g), torch.randn(8, 3, generator=g)
    scaler, opt = torch.amp.GradScaler("cpu"), torch.optim.SGD(model.parameters(), lr=0.1)
    w = model.weight.detach().clone()
    with torch.autocast("cpu", dtype=torch.float16):
        value = fn(model(x), target)
    scaler.scale(value).backward()
    scaler.step(opt)
    scaler.update()
    r = A.loss_report(loss)
    assert r.loss == float(value.detach()) and r.loss_dtype == "fp32"
    assert r.step_skipped is torch.equal(w, model.weight.detach()) and r.scale_after == scaler.get_scale()
    assert r.step_skipped is (loss == "mse_loss(reduction='sum')")  # the sum: 24x the mean's gradient
    assert loss not in A.loss_table().column("loss")


ANSWERS = [  # checker, right answers, wrong answers
    (A.check_softmax_dtype, ["fp16", "float16", torch.float16, " Half ", "torch.float16"],
     ["fp32", torch.float32, "bf16", 16, None.__class__]),
    (A.check_sum_loss_step, ["skipped", "Skipped.", "skip"], ["runs", "run", "no", 1]),
    (A.check_casts_inside_outer, [1, "1", 1.0, "one"], [2, 0, "2", True, "1.5"]),
    (B16C.check_round_up_share, [0.64, "0.64", 0.6399994, 0.642], [0.5, 0.36, 0.65, "64%"]),
]


@pytest.mark.parametrize("checker, right, wrong", ANSWERS, ids=lambda v: getattr(v, "__name__", ""))
def test_checkers_answer_three_ways(checker, right, wrong):
    assert checker(None).status == "unanswered" and str(checker(None)).startswith("not answered yet")
    for a in right:
        assert checker(a).status == "right" and str(checker(a)) == "✓ correct", a
    for a in wrong:
        c = checker(a)
        assert c.status == "wrong" and str(c).startswith("✗ not quite") and "\n" not in str(c), a


def test_the_checkers_expected_answers_are_measured():
    """Each expected answer, measured here independently of the checker."""
    torch.manual_seed(3)
    lin, x = nn.Linear(8, 4), torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.float16):
        assert torch.softmax(lin(x), dim=-1).dtype == torch.float16  # not float32, as on CUDA
    assert A.check_softmax_dtype("bf16", "bfloat16").status == "right"
    assert _direct_step_other("sum") is False and _direct_step_other("mean") is True
    with torch.autocast("cpu", dtype=torch.float16):  # the outer block keeps the cache: one cast
        assert A.weight_casts("separate_blocks").weight_casts == 1
    v = float(np.float32(3.01))
    assert abs((v - 3.0) / 2.0**-6 - 0.64) < 1e-6  # bf16 neighbours 3 and 3 + 2^-6
    assert B16C.check_round_up_share(0.5, value=1 + 2.0**-8).status == "right"


def _direct_step_other(reduction):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = nn.Linear(4, 3)
        g = torch.Generator().manual_seed(0)
        x, target = torch.randn(8, 4, generator=g), torch.randn(8, 3, generator=g)
    scaler, opt = torch.amp.GradScaler("cpu"), torch.optim.SGD(model.parameters(), lr=0.1)
    w = model.weight.detach().clone()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.mse_loss(model(x), target, reduction=reduction)
    scaler.scale(loss).backward()
    scaler.step(opt)
    return not torch.equal(w, model.weight.detach())


def test_the_stochastic_rounding_checker():
    from ampviz.training import bf16 as B

    def written_here(x, generator):
        noise = torch.randint(0, 1 << 16, x.shape, generator=generator, dtype=torch.int32)
        out = ((x.contiguous().view(torch.int32) + noise) & -65536).view(torch.float32).to(torch.bfloat16)
        return torch.where(torch.isnan(x), x.to(torch.bfloat16), out)

    check = B16C.check_stochastic_rounding
    assert check(None).status == "unanswered"
    assert str(check(B.stochastic_round_bf16)) == str(check(written_here)) == "✓ correct"
    hints = {name: str(check(fn)) for name, fn in B.ROUNDINGS.items() if name != "stochastic"}
    assert hints["17 random bits"].startswith("✗ not quite: some results are not one of the value's two")
    assert hints["sign-blind"].startswith("✗ not quite: right for positive values, biased for negative ones")
    assert hints["round to nearest"] == hints["15 random bits"]
    assert hints["round to nearest"].startswith("✗ not quite: biased")
    def unguarded(x, generator):  # right on every finite value; a NaN with a payload becomes inf or a number
        noise = torch.randint(0, 1 << 16, x.shape, generator=generator, dtype=torch.int32)
        return ((x.view(torch.int32) + noise) & -65536).view(torch.float32).to(torch.bfloat16)

    assert B.rounding_statistics(rounding=unguarded).passed
    assert str(check(unguarded)).startswith("✗ not quite: NaN must stay NaN and ±inf, ±0 unchanged")
    nan_to_zero = lambda x, g: torch.nan_to_num(B.stochastic_round_bf16(x, g), nan=0.0)  # noqa: E731
    assert str(check(nan_to_zero)).startswith("✗ not quite: NaN must stay NaN")
    minus_zero_lost = lambda x, g: B.stochastic_round_bf16(x, g) + 0.0  # noqa: E731 - -0 becomes +0
    assert str(check(minus_zero_lost)).startswith("✗ not quite: NaN must")
    assert str(check(lambda x, g: x)).startswith("✗ not quite: return a bfloat16 tensor")
    assert str(check(lambda x: x)).startswith("✗ not quite: your function raised TypeError")
    assert str(check("stochastic_round")) == "✗ not quite: set answer = your function itself (no call, no quotes)"
    assert str(check(torch.Tensor)).startswith("✗ not quite: set answer")


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("call,error,message", [
    (lambda: A.op_table("float32"), ValueError, "dtype must be torch.bfloat16 or torch.float16"),
    (lambda: A.op_table(("float16", "fp16")), ValueError, "dtypes must not repeat a dtype"),
    (lambda: A.op_table(()), ValueError, "dtypes must be one or two of 'float16', 'bfloat16', not ()"),
    (lambda: A.op_table({"float16"}), TypeError, "dtypes must be one or two of 'float16', 'bfloat16' (a list"),
    (lambda: A.op_table("float16").row("softmax2"), ValueError, "unknown op 'softmax2'"),
    (lambda: A.op_table(device="cuda"), ValueError, "device 'cuda' is not available here"),
    (lambda: A.op_table(device="mps"), ValueError, "device must be 'cpu' or 'cuda', not 'mps'"),
    (lambda: A.op_table(cuda="real"), ValueError, "cuda must be one of 'auto', 'fake', 'gpu', not 'real'"),
    (lambda: A.op_table(cuda="gpu"), ValueError, "cuda='gpu' needs a GPU"),
    (lambda: A.under_autocast("softmax"), TypeError, "fn must be a function of the tensors that follow it"),
    (lambda: A.under_autocast(torch.exp, torch.ones(2), dtype="float32"), ValueError, "dtype must be torch.bf"),
    (lambda: A.layer_walk(3), TypeError, "dtype must be a torch dtype"),
    (lambda: A.compile_table("eager"), ValueError, "unknown backend 'eager'"),
    (lambda: A.loss_report("bce"), ValueError, "unknown loss 'bce': one of 'mse_loss'"),
    (lambda: A.loss_report(seed=1.5), ValueError, "seed must be a whole number"),
    (lambda: A.loss_table(dtype=None), TypeError, "dtype must be a torch dtype"),
    (lambda: A.weight_casts("twice"), ValueError, "unknown case 'twice': one of 'one_block'"),
    (lambda: A.cache_table(cases=[]), TypeError, "cases must be a list of keys of CACHE_CASES"),
    (lambda: A.compile_report("eager"), ValueError, "unknown backend 'eager': one of 'aot_eager', 'inductor'"),
])
def test_bad_input_is_refused_in_one_line(call, error, message):
    if message.startswith(("device 'cuda'", "cuda='gpu'")) and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(error) as info:
        call()
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


# ---------------------------------------------------------------- arbitrary arguments
ANYTHING = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5), st.integers(), st.floats(), st.text(max_size=8),
    st.lists(st.text(max_size=3), max_size=3), st.tuples(st.sampled_from(["float16", "bfloat16", "x"])),
    st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.int8, "fp16", "bf16", "float16", "cpu",
                     "cuda", "meta", "", object(), torch.ones(2), 2.0**70, float("nan")]))


def _answers_or_refuses(fn, *args):
    try:
        return fn(*args)
    except (ValueError, TypeError) as exc:
        assert str(exc).strip() and "\n" not in str(exc), repr(str(exc))
        return None


FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@settings(FUZZ, max_examples=12)
@given(dtypes=st.one_of(ANYTHING, st.just(("bfloat16",))), device=st.one_of(ANYTHING, st.just("cpu")))
@example(dtypes=["bfloat16", torch.float16], device="cpu")
def test_op_table_answers_or_refuses(dtypes, device):
    t = _answers_or_refuses(A.op_table, dtypes, device)
    if t is not None:
        assert len(t.rows) == len(A.OPS) and t.device == "cpu"


@settings(FUZZ, max_examples=40)
@given(loss=st.one_of(ANYTHING, st.sampled_from(list(A.LOSSES))), dtype=st.one_of(ANYTHING, st.sampled_from(
    ["float16", "bfloat16"])), seed=st.one_of(ANYTHING, st.integers(0, 2**64 - 1)))
@example(loss="output.mean()", dtype="fp16", seed=-3)
def test_loss_report_answers_or_refuses(loss, dtype, seed):
    r = _answers_or_refuses(A.loss_report, loss, dtype, seed)
    if r is not None:
        assert r.loss_dtype in ("fp16", "bf16", "fp32") and r.scaled_dtype == "fp32"
        assert r.step_skipped is (r.output_grad_max == float("inf")) is (r.scale_after == 32768.0)


@settings(FUZZ, max_examples=15)
@given(dtype=st.one_of(ANYTHING, st.sampled_from(["float16", "bfloat16"])), seed=st.one_of(ANYTHING, st.integers()))
@example(dtype=torch.bfloat16, seed=7)
def test_loss_table_answers_or_refuses(dtype, seed):
    t = _answers_or_refuses(A.loss_table, dtype, seed)
    if t is not None:
        assert len(t.rows) == len(A.LOSSES)


@settings(FUZZ, max_examples=40)
@given(case=st.one_of(ANYTHING, st.sampled_from(list(A.CACHE_CASES))),
       dtype=st.one_of(ANYTHING, st.sampled_from(["float16", "bfloat16", torch.float16])))
@example(case="inference_mode", dtype="bf16")
def test_weight_casts_answers_or_refuses(case, dtype):
    r = _answers_or_refuses(A.weight_casts, case, dtype)
    if r is not None:
        assert r.weight_casts == CASTS[case]


@settings(FUZZ, max_examples=15)
@given(cases=st.one_of(ANYTHING, st.lists(st.sampled_from(list(A.CACHE_CASES)), min_size=1, max_size=3)),
       dtype=st.one_of(ANYTHING, st.just("bfloat16")))
@example(cases="frozen_weight", dtype="bfloat16")
def test_cache_table_answers_or_refuses(cases, dtype):
    t = _answers_or_refuses(A.cache_table, cases, dtype)
    if t is not None:
        assert len(t.rows) == (len(A.CACHE_CASES) if cases is None else 1 if isinstance(cases, str) else len(cases))


@settings(FUZZ, max_examples=8)
@given(backend=st.one_of(ANYTHING, st.just("aot_eager")), dtype=st.one_of(ANYTHING, st.just("float16")))
@example(backend="aot_eager", dtype=torch.float16)
def test_compile_report_answers_or_refuses(backend, dtype):
    r = _answers_or_refuses(A.compile_report, backend, dtype)
    if r is not None:
        assert r.compiled_sees_update and not r.eager_sees_update


@settings(FUZZ, max_examples=25)
@given(fn=st.one_of(ANYTHING, st.sampled_from([torch.exp, torch.relu, lambda *a: a[0] @ a[0].T, print, len])),
       args=st.lists(st.one_of(ANYTHING, st.just(torch.ones(2, 2)), st.just(torch.ones(3, dtype=torch.float16))),
                     max_size=3),
       dtype=st.one_of(ANYTHING, st.just("bfloat16")))
def test_under_autocast_answers_or_refuses(fn, args, dtype):
    r = _answers_or_refuses(lambda: A.under_autocast(fn, *args, dtype=dtype))
    if r is not None:
        assert isinstance(str(r), str) and len(r.ops) <= A.MAX_TRY_OPS
        assert (r.error is None) or (r.output == () and "\n" not in r.error)
    assert not torch.is_autocast_enabled("cpu")


@settings(FUZZ, max_examples=30)
@given(answer=st.one_of(ANYTHING, st.just(lambda x, g: x), st.just(lambda: 1), st.just(torch.ones(3)),
                        st.just(torch.tensor(1.0)), st.just(float("inf")), st.just(2**2000)))
def test_every_checker_answers_anything_in_one_line(answer):
    for checker in (A.check_softmax_dtype, A.check_sum_loss_step, A.check_casts_inside_outer,
                    B16C.check_round_up_share, B16C.check_stochastic_rounding):
        c = checker(answer)
        assert c.status in ("right", "wrong", "unanswered") and "\n" not in str(c)
        assert str(c).startswith(("✓ correct", "✗ not quite", "not answered yet"))


def test_import_ampviz_stays_free_of_torch():
    import subprocess
    import sys

    code = "import ampviz, sys; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0

