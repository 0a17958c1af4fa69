"""``torch.autocast``, measured: which dtype each op runs in, why the loss comes out float32, and
the weight cache (torch).

``ampviz/__init__.py`` never imports this module, so ``import ampviz`` stays free of torch.

Everything a lesson prints from here is measured by running the installed torch; nothing is taken
from a list of what torch is supposed to do, except the one column that says so ("torch docs").

* ``layer_walk``: one ``nn.Linear`` under CPU autocast as the dispatcher sees it (the casts of
  its input, weight and bias, the ``addmm`` on the copies, the fp32 parameter and its fp32
  gradient); ``under_autocast``: the same record for any code (a lesson's *Try it*).
* ``op_table``: about forty ops learners meet, each run under ``torch.autocast`` on float32
  inputs; each cell is the dtype that came out and the rule that made it (see ``Cell``). Next to
  the CPU columns: what torch's documentation lists for CUDA (documented, not measured), and what
  this torch build's CUDA autocast rules do, run on fake CUDA tensors
  (``torch._subclasses.FakeTensorMode``: the same autocast code picks the dtypes, no GPU kernel
  runs) or on a real GPU (``cuda="fake"``, ``"gpu"``, or ``"auto"``: the GPU when there is one).
  Where CPU and CUDA autocast disagree, the last column says so (``OpTable.differences_table``).
* ``loss_report``, ``loss_table``: a linear model under float16 autocast: the dtype of its output,
  of the loss, of ``loss * 65536``, the largest gradient that reaches the float16 output in the
  scaled backward, and whether a real ``torch.amp.GradScaler("cpu")`` skips the first step.
* ``weight_casts``, ``cache_table``: how often autocast casts a weight in two forwards, counted at
  the dispatcher (a ``TorchDispatchMode`` sees every cast autocast makes), in each arrangement of
  ``CACHE_CASES`` (one block, nested blocks, separate blocks, ``cache_enabled=False``,
  ``torch.clear_autocast_cache()``, ``no_grad``, ``inference_mode``, a frozen weight, a nested
  block with the other dtype); ``cache_table`` puts next to each count whether a weight changed in
  place between the forwards is seen (``ampviz.pitfalls.autocast_cache.in_place_update``).
* ``compile_report``, ``compile_table``: the same in-place update with a ``torch.compile``-d forward.
* ``check_*``: the exercise checkers of lesson 03; each expected answer comes from a real run.

The CPU autocast lists of torch 2.13 (``aten/src/ATen/autocast_mode.cpp``, the
``TORCH_LIBRARY_IMPL(aten, AutocastCPU, m)`` block; the CUDA lists are the ``AT_FORALL_*`` macros of
``aten/src/ATen/autocast_mode.h``, shipped in the wheel as ``torch/include/ATen/autocast_mode.h``):

- ``lower_precision_fp`` (inputs cast to the autocast dtype): conv1d/2d/3d, conv_transpose1d/2d/3d,
  conv_tbc, _convolution, bmm, mm, linalg_vecdot, baddbmm, addmm, _addmm_activation, addbmm,
  linear, matmul, prelu, mkldnn_rnn_layer, scaled_dot_product_attention,
  _native_multi_head_attention;
- ``fp32`` (inputs cast to float32): the losses (mse_loss, nll_loss, cross_entropy_loss, l1_loss,
  smooth_l1/huber, kl_div, binary_cross_entropy, binary_cross_entropy_with_logits, the margin and
  embedding losses, ctc_loss...), prod, quantile, cdist, trace, 3-d pooling, reflection/replication
  padding, grid_sampler, stft and the fft_* ops, the linalg_*/cholesky/qr/svd/... solvers;
- ``promote`` (mixed inputs cast to the widest): cat, stack, index_copy;
- everything else falls through (``m.fallback(makeFallthrough())``) and runs in its input's dtype:
  among them softmax, log_softmax, layer_norm, group_norm, rms_norm, softplus, exp, log, pow, sum,
  cumsum, norm (which CUDA autocast runs in float32), mv and addmv (CUDA: float16), and relu, gelu,
  batch_norm, mean, dropout (which CUDA autocast leaves alone too).

Results that a lesson prints do not depend on the thread count, nor (with ``cuda="fake"``) on
whether a GPU is present. The numbers in ``loss_table``
(a loss, a gradient) come from float16 matrix products and may differ in the last digits from one
CPU kernel set to another; they are printed to four digits, and the dtypes, the overflow and the
skipped step do not depend on them.
"""

from __future__ import annotations

import contextlib
import itertools
import types
import math
import time
import warnings
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from ampviz.checks import Check, _number_text, _said, check
from ampviz.text import Table, measured, number
from ampviz.pitfalls import autocast_cache
from ampviz._args import _shown
from ampviz._args import _seed

__all__ = [
    "CUDA_DOCS_FP16",
    "CUDA_DOCS_FP32",
    "CUDA_DOCS_PROMOTE",
    "OPS",
    "Cell",
    "OpRow",
    "OpTable",
    "op_table",
    "LOSSES",
    "LossReport",
    "loss_report",
    "loss_table",
    "CACHE_CASES",
    "CacheReport",
    "weight_casts",
    "cache_table",
    "BACKENDS",
    "CompileReport",
    "compile_report",
    "compile_table",
    "CUDA_SOURCES",
    "OTHER_LOSSES",
    "layer_walk",
    "AutocastRun",
    "under_autocast",
    "check_softmax_dtype",
    "check_sum_loss_step",
    "check_casts_inside_outer",
    "check_round_up_share",
    "check_stochastic_rounding",
]

SHORT = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64"}

# --------------------------------------------------------------------------------------------
# The CUDA lists of torch's documentation (docs/source/amp.md, "Autocast Op Reference":
# "CUDA Ops that can autocast to float16", "... to float32", "... that promote to the widest input
# type"), copied as they are written there. Documented, not measured: ``op_table`` shows them
# beside what the installed build's CUDA autocast does.
# --------------------------------------------------------------------------------------------

CUDA_DOCS_FP16 = frozenset((
    "__matmul__ addbmm addmm addmv addr baddbmm bmm chain_matmul multi_dot conv1d conv2d conv3d "
    "conv_transpose1d conv_transpose2d conv_transpose3d GRUCell linear LSTMCell matmul mm mv prelu RNNCell").split())
CUDA_DOCS_FP32 = frozenset((
    "__pow__ __rdiv__ __rpow__ __rtruediv__ acos asin binary_cross_entropy_with_logits cosh cosine_embedding_loss "
    "cdist cosine_similarity cross_entropy cumprod cumsum dist erfinv exp expm1 group_norm hinge_embedding_loss "
    "kl_div l1_loss layer_norm log log_softmax log10 log1p log2 margin_ranking_loss mse_loss "
    "multilabel_margin_loss multi_margin_loss nll_loss norm normalize pdist poisson_nll_loss pow prod reciprocal "
    "rsqrt sinh smooth_l1_loss soft_margin_loss softmax softmin softplus sum renorm tan triplet_margin_loss").split())
CUDA_DOCS_PROMOTE = frozenset(
    "addcdiv addcmul atan2 bilinear cross dot grid_sample index_put scatter_add tensordot".split())
#: The docs: "binary_cross_entropy and BCELoss raise an error in autocast-enabled regions" (CUDA).
CUDA_DOCS_BANNED = frozenset({"binary_cross_entropy"})

# --------------------------------------------------------------------------------------------
# Cells and rules
# --------------------------------------------------------------------------------------------

#: The rules a cell names (``{dt}``: the autocast dtype).
RAN_LOW = "ran in {dt}"  # inputs cast down to the autocast dtype (lower_precision_fp)
RAN_FP32 = "ran in fp32"  # low-precision inputs cast up to float32 (fp32 policy)
WIDEST = "widest input"  # mixed inputs: autocast cast the low-precision one up (promote policy)
OWN_PROMOTION = "own promotion"  # mixed inputs: autocast left it; the op's own type promotion
AS_INPUT = "as its input"  # autocast leaves the op alone: it runs in its input's dtype


class Cell(NamedTuple):
    """One measured (or documented) result: ``dtype`` of the output ("fp16", "bf16", "fp32"; None
    after an error), the ``rule`` that produced it, or the ``error`` ("RuntimeError: message")."""

    dtype: str | None
    rule: str | None
    error: str | None = None

    def __str__(self) -> str:
        return f"raises {self.error.split(':')[0]}" if self.error else f"{self.dtype}, {self.rule}"


class _Op(NamedTuple):
    name: str
    group: str
    docs: str  # the name looked up in the CUDA documentation's lists
    make: Callable  # _Maker -> tuple of inputs
    call: Callable  # inputs -> output
    mixed: bool = False  # one input in the autocast dtype (or fp16), the other float32


def _op(name, group, make, call, docs=None, mixed=False):
    return _Op(name, group, docs or name, make, call, mixed)


def _ops() -> tuple:
    """The curated op list (shapes tiny: only dtypes matter)."""
    m = "matmul / conv"
    a = "activation"
    n = "normalisation"
    loss = "loss"
    r = "pointwise / reduction"
    mix = "mixed inputs"
    o = "other"
    return (
        _op("linear", m, lambda t: (t.f(4, 8), t.f(6, 8), t.f(6)), F.linear),
        _op("matmul", m, lambda t: (t.f(4, 8), t.f(8, 6)), torch.matmul),
        _op("bmm", m, lambda t: (t.f(2, 3, 4), t.f(2, 4, 5)), torch.bmm),
        _op("addmm", m, lambda t: (t.f(6), t.f(4, 8), t.f(8, 6)), torch.addmm),
        _op("baddbmm", m, lambda t: (t.f(2, 3, 5), t.f(2, 3, 4), t.f(2, 4, 5)), torch.baddbmm),
        _op("mv", m, lambda t: (t.f(6, 8), t.f(8)), torch.mv),
        _op("conv1d", m, lambda t: (t.f(1, 2, 7), t.f(3, 2, 3)), F.conv1d),
        _op("conv2d", m, lambda t: (t.f(1, 2, 5, 5), t.f(3, 2, 3, 3)), F.conv2d),
        _op("scaled_dot_product_attention", m, lambda t: (t.f(1, 2, 4, 8),) * 3, F.scaled_dot_product_attention),
        _op("relu", a, lambda t: (t.f(4, 8),), F.relu),
        _op("gelu", a, lambda t: (t.f(4, 8),), F.gelu),
        _op("tanh", a, lambda t: (t.f(4, 8),), torch.tanh),
        _op("sigmoid", a, lambda t: (t.f(4, 8),), torch.sigmoid),
        _op("softplus", a, lambda t: (t.f(4, 8),), F.softplus),
        _op("softmax", a, lambda t: (t.f(4, 8),), lambda x: F.softmax(x, dim=-1)),
        _op("log_softmax", a, lambda t: (t.f(4, 8),), lambda x: F.log_softmax(x, dim=-1)),
        _op("layer_norm", n, lambda t: (t.f(4, 8), t.f(8), t.f(8)), lambda x, w, b: F.layer_norm(x, (8,), w, b)),
        _op("group_norm", n, lambda t: (t.f(2, 4, 3), t.f(4), t.f(4)), lambda x, w, b: F.group_norm(x, 2, w, b)),
        _op("batch_norm", n, lambda t: (t.f(4, 8), t.f(8), t.pos(8), t.f(8), t.f(8)),
            lambda x, mean, var, w, b: F.batch_norm(x, mean, var, w, b, training=False)),
        _op("rms_norm", n, lambda t: (t.f(4, 8), t.f(8)), lambda x, w: F.rms_norm(x, (8,), w)),
        _op("mse_loss", loss, lambda t: (t.f(4, 8), t.f(4, 8)), F.mse_loss),
        _op("cross_entropy", loss, lambda t: (t.f(4, 5), t.index(4, high=5)), F.cross_entropy),
        _op("nll_loss", loss, lambda t: (t.f(4, 5), t.index(4, high=5)), F.nll_loss),
        _op("binary_cross_entropy_with_logits", loss, lambda t: (t.f(4, 8), t.unit(4, 8)),
            F.binary_cross_entropy_with_logits),
        _op("binary_cross_entropy", loss, lambda t: (t.unit(4, 8), t.unit(4, 8)), F.binary_cross_entropy),
        _op("l1_loss", loss, lambda t: (t.f(4, 8), t.f(4, 8)), F.l1_loss),
        _op("exp", r, lambda t: (t.f(4, 8),), torch.exp),
        _op("log", r, lambda t: (t.pos(4, 8),), torch.log),
        _op("pow", r, lambda t: (t.f(4, 8),), lambda x: torch.pow(x, 2)),
        _op("sum", r, lambda t: (t.f(4, 8),), torch.sum),
        _op("mean", r, lambda t: (t.f(4, 8),), torch.mean),
        _op("cumsum", r, lambda t: (t.f(4, 8),), lambda x: torch.cumsum(x, dim=0)),
        _op("prod", r, lambda t: (t.f(4, 8),), torch.prod),
        _op("norm", r, lambda t: (t.f(4, 8),), torch.norm),
        _op("add (mixed)", mix, lambda t: (t.low(4, 8), t.fp32(4, 8)), torch.add, docs="add", mixed=True),
        _op("mul (mixed)", mix, lambda t: (t.low(4, 8), t.fp32(4, 8)), torch.mul, docs="mul", mixed=True),
        _op("cat (mixed)", mix, lambda t: (t.low(4, 8), t.fp32(4, 8)), lambda a, b: torch.cat([a, b]), docs="cat",
            mixed=True),
        _op("cat (fp16 + fp32)", mix, lambda t: (t.fp16(4, 8), t.fp32(4, 8)), lambda a, b: torch.cat([a, b]),
            docs="cat", mixed=True),
        _op("addcmul (mixed)", mix, lambda t: (t.fp32(4, 8), t.low(4, 8), t.low(4, 8)), torch.addcmul,
            docs="addcmul", mixed=True),
        _op("dropout", o, lambda t: (t.f(4, 8),), lambda x: F.dropout(x, 0.5, training=False)),
        _op("embedding", o, lambda t: (t.index(4, high=6), t.f(6, 8)), F.embedding),
    )


_OPS = _ops()
#: The ops ``op_table`` measures, in its row order. "(mixed)": one input in the autocast dtype, the
#: other float32; "cat (fp16 + fp32)": a float16 and a float32 input, whatever the autocast dtype.
OPS = tuple(op.name for op in _OPS)


def _documented(op: _Op, dt: torch.dtype) -> Cell:
    """What the CUDA documentation's lists say ``op`` does on float32 inputs (mixed: as given)."""
    low = SHORT[dt]
    if op.docs in CUDA_DOCS_BANNED:
        return Cell(None, None, "an error: the docs call it unsafe to autocast")
    if op.docs in CUDA_DOCS_FP16:
        return Cell(low, RAN_LOW.format(dt=low))
    if op.docs in CUDA_DOCS_FP32:
        return Cell("fp32", RAN_FP32)
    if op.docs in CUDA_DOCS_PROMOTE:
        return Cell("fp32", WIDEST)
    return Cell("fp32", OWN_PROMOTION if op.mixed else AS_INPUT)


# --------------------------------------------------------------------------------------------
# Running an op under autocast, counting the casts autocast makes
# --------------------------------------------------------------------------------------------

_CAST_OPS = frozenset({torch.ops.aten._to_copy.default, torch.ops.aten.to.dtype, torch.ops.aten.to.dtype_layout,
                       torch.ops.aten.to.device, torch.ops.aten.to.other})


class _CastLog(TorchDispatchMode):
    """Records every dtype cast that reaches the dispatcher below autocast (autocast's own casts
    included): ``casts`` is a list of (source tensor, source dtype, result dtype)."""

    def __init__(self):
        super().__init__()
        self.casts = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in _CAST_OPS and args and isinstance(args[0], torch.Tensor) and isinstance(out, torch.Tensor) \
                and out.dtype != args[0].dtype:
            self.casts.append((args[0], args[0].dtype, out.dtype))
        return out


class _Maker:
    """Inputs for one run: ``f`` in the run's float dtype, ``low`` in the autocast dtype, ``fp32``,
    ``fp16``; ``pos`` positive, ``unit`` in (0, 1); ``index`` class indices. Seeded on the CPU,
    then moved to the device (fake CUDA tensors carry no values: only dtypes matter there)."""

    def __init__(self, device: str, float_dtype, low_dtype, fake: bool):
        self.device, self.float_dtype, self.low_dtype, self.fake = device, float_dtype, low_dtype, fake
        self.gen = torch.Generator().manual_seed(0)

    def _t(self, shape, dtype, kind="normal"):
        if self.fake:
            return torch.empty(shape, device=self.device, dtype=dtype)
        x = torch.randn(shape, generator=self.gen)
        if kind == "pos":
            x = x.abs() + 0.5
        elif kind == "unit":
            x = torch.sigmoid(x)
        return x.to(self.device, dtype)

    def f(self, *shape):
        return self._t(shape, self.float_dtype)

    def pos(self, *shape):
        return self._t(shape, self.float_dtype, "pos")

    def unit(self, *shape):
        return self._t(shape, self.float_dtype, "unit")

    def low(self, *shape):
        return self._t(shape, self.low_dtype)

    def fp32(self, *shape):
        return self._t(shape, torch.float32)

    def fp16(self, *shape):
        return self._t(shape, torch.float16)

    def index(self, *shape, high: int):
        if self.fake:
            return torch.zeros(shape, device=self.device, dtype=torch.long)
        return torch.randint(0, high, shape, generator=self.gen).to(self.device)


@contextlib.contextmanager
def _fake_cuda_autocast(dt: torch.dtype):
    """CUDA autocast switched on directly (``torch.autocast("cuda")`` disables itself on a machine
    without CUDA), as ``torch.autocast.__enter__``/``__exit__`` do it; restored afterwards."""
    prev_enabled, prev_dtype = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", dt)
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled("cuda", prev_enabled)
        torch.set_autocast_dtype("cuda", prev_dtype)


def _error(exc: BaseException) -> str:
    text = " ".join(str(exc).split("\n")[0].split())
    text = text if len(text) <= 100 else text[:97] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _run(op: _Op, where: str, dt: torch.dtype, float_dtype) -> tuple:
    """(output dtype, casts autocast made) of ``op`` under autocast in ``dt`` on ``where`` ("cpu",
    "cuda" or "fake-cuda"), its float inputs in ``float_dtype``."""
    fake = where == "fake-cuda"
    device = "cuda" if fake else where
    mode = FakeTensorMode() if fake else contextlib.nullcontext()
    with mode:
        args = op.make(_Maker(device, float_dtype, dt, fake))
        autocast = _fake_cuda_autocast(dt) if fake else torch.autocast(device, dtype=dt)
        with _CastLog() as log, autocast:
            out = op.call(*args)
    return out.dtype, [(src, to) for _, src, to in log.casts]


def _measure(op: _Op, where: str, dt: torch.dtype) -> Cell:
    """The cell for ``op`` under autocast in ``dt`` on ``where``, from real runs: float32 inputs
    (mixed ops: as they are made); if float32 came out, once more with inputs in ``dt`` to tell
    an op autocast runs in float32 from one it leaves alone."""
    low = SHORT[dt]
    try:
        out, casts = _run(op, where, dt, torch.float32)
    except Exception as exc:  # noqa: BLE001 - an op autocast refuses is a result
        return Cell(None, None, _error(exc))
    if out == dt:
        return Cell(low, RAN_LOW.format(dt=low))
    if op.mixed:
        up = any(to == torch.float32 and src != torch.float32 for src, to in casts)
        return Cell(SHORT.get(out, str(out)), WIDEST if up else OWN_PROMOTION)
    try:
        again, _ = _run(op, where, dt, dt)
    except Exception as exc:  # noqa: BLE001
        return Cell(SHORT.get(out, str(out)), f"with {low} inputs: {_error(exc)}")
    return Cell(SHORT.get(out, str(out)), RAN_FP32 if again == torch.float32 else AS_INPUT)


# --------------------------------------------------------------------------------------------
# One layer, and any code, under autocast: the ops that reach the dispatcher
# --------------------------------------------------------------------------------------------


class _OpLog(TorchDispatchMode):
    """Records every op that reaches the dispatcher below autocast: ``ops`` is a list of (name,
    tensor inputs, output dtypes), casts (``aten._to_copy``) included."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        tensors += [t for a in args if isinstance(a, (list, tuple)) for t in a if isinstance(t, torch.Tensor)]
        outs = out if isinstance(out, (list, tuple)) else (out,)
        self.ops.append((func.__name__.split(".")[0], tuple(tensors),
                         tuple(o.dtype for o in outs if isinstance(o, torch.Tensor))))
        return out


def _dt(dtype) -> str:
    return SHORT.get(dtype, str(dtype).replace("torch.", ""))


def _grad_path(y, names: dict) -> str:
    """``y``'s autograd graph from the output down to the named leaves, one path per leaf:
    "AddmmBackward0 ← TBackward0 ← ToCopyBackward0 ← lin.weight"."""
    paths = []

    def walk(node, path):
        if node is None:
            return
        var = getattr(node, "variable", None)
        if var is not None:
            paths.append(" ← ".join(path + [names.get(id(var), "a leaf")]))
            return
        for nxt, _ in node.next_functions:
            walk(nxt, path + [type(node).__name__])

    walk(y.grad_fn, [])
    return paths


def layer_walk(dtype="float16") -> Table:
    """One ``nn.Linear(8, 4)`` (seed 0) on a float32 batch of 4 under ``torch.autocast("cpu",
    dtype=dtype)``, then a backward pass after the block, as seen at the dispatcher: each op that
    ran (the casts autocast made, named by their source, and the matrix product) with the dtypes
    of its inputs and output; the parameter's dtype before, inside and after the block; the path
    from the output back to the weight in the autograd graph; the dtype of the weight's gradient.

    What it shows on torch 2.13: autocast never changes a parameter; it makes a low-precision copy
    of the input, the weight and the bias (``aten._to_copy``) and runs ``aten.addmm`` on the copies;
    the output is in ``dtype``; the gradient flows back through the cast (``ToCopyBackward0``) and
    arrives in float32, the parameter's dtype."""
    dt = autocast_cache._autocast_dtype(dtype)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        lin = nn.Linear(8, 4)
        x = torch.randn(4, 8)
    names = {id(x): "x", id(lin.weight): "lin.weight", id(lin.bias): "lin.bias"}
    rows = [("x, the input", _dt(x.dtype)), ("lin.weight, lin.bias", f"{_dt(lin.weight.dtype)}, {_dt(lin.bias.dtype)}")]
    with _OpLog() as log:
        with torch.autocast("cpu", dtype=dt):
            y = lin(x)
            inside = lin.weight.dtype
    for name, inputs, outs in log.ops:
        ins = ", ".join(_dt(t.dtype) for t in inputs)
        if name == "_to_copy":
            src = names.get(id(inputs[0]), "a tensor")
            rows.append((f"autocast casts {src}: aten._to_copy", f"{ins} → {_dt(outs[0])} (a new tensor)"))
        else:
            rows.append((f"aten.{name}", f"{ins} → {', '.join(map(_dt, outs))}"))
    rows.append(("y = lin(x)", _dt(y.dtype)))
    rows.append(("lin.weight, inside the block", _dt(inside)))
    for path in _grad_path(y, names):
        rows.append((f"y's graph, back to {path.rsplit(' ← ', 1)[-1]}", path))
    y.float().pow(2).mean().backward()
    rows.append(("after the block: lin.weight, lin.weight.grad",
                 f"{_dt(lin.weight.dtype)}, {_dt(lin.weight.grad.dtype)}"))
    return Table(("nn.Linear(8, 4) on x", "dtype"), rows,
                 title=f'y = lin(x) under torch.autocast("cpu", dtype=torch.{_dt_name(dt)}), then a backward pass')


def _dt_name(dt: torch.dtype) -> str:
    """"float16" for torch.float16."""
    return str(dt).replace("torch.", "")


@dataclass(frozen=True)
class AutocastRun:
    """``under_autocast``'s result: ``ops`` (name, input dtypes, output dtypes) in the order they
    reached the dispatcher (``_to_copy`` rows are casts; autocast's own casts among them);
    ``output``: the dtype of each tensor ``fn`` returned; ``error``: "Type: message" if it raised."""

    dtype: str
    device: str
    ops: tuple
    output: tuple
    error: str | None

    def table(self) -> Table:
        rows = [(("cast " if name == "_to_copy" else "") + f"aten.{name}", ", ".join(ins) or "-", ", ".join(outs))
                for name, ins, outs in self.ops]
        end = f"raised {self.error}" if self.error else "output " + ", ".join(self.output)
        return Table(("op", "inputs", "output"), rows,
                     title=f'under torch.autocast("{self.device}", dtype=torch.{self.dtype}): {end}')

    def __str__(self) -> str:
        return str(self.table())

    __repr__ = __str__


MAX_TRY_OPS = 200


def under_autocast(fn, *args, dtype="float16") -> AutocastRun:
    """Call ``fn(*args)`` under ``torch.autocast("cpu", dtype=dtype)`` and record every op that
    reaches the dispatcher (casts included), with the dtypes of its tensor inputs and outputs, and
    the dtype of what ``fn`` returned (a tensor, or a tuple or list of them). An exception ``fn``
    raises is the result ("Type: message"), not an error of this function. The first
    ``MAX_TRY_OPS`` ops are kept."""
    if not callable(fn):
        raise TypeError(f"fn must be a function of the tensors that follow it (e.g. lambda x: x.softmax(-1)), "
                        f"not {_shown(fn)}")
    dt = autocast_cache._autocast_dtype(dtype)
    error, output = None, ()
    with _OpLog() as log:
        try:
            with torch.autocast("cpu", dtype=dt):
                out = fn(*args)
        except Exception as exc:  # noqa: BLE001 - what the learner's code raises is the result
            error = _error(exc)
        else:
            outs = out if isinstance(out, (list, tuple)) else (out,)
            output = tuple(_dt(o.dtype) if isinstance(o, torch.Tensor) else type(o).__name__ for o in outs)
    ops = tuple((name, tuple(_dt(t.dtype) for t in ins), tuple(map(_dt, outs)))
                for name, ins, outs in log.ops[:MAX_TRY_OPS])
    return AutocastRun(_dt_name(dt), "cpu", ops, output, error)


# --------------------------------------------------------------------------------------------
# The op table
# --------------------------------------------------------------------------------------------


class OpRow(NamedTuple):
    """One op: ``measured`` maps each dtype name ("float16") to the ``Cell`` measured on the
    table's device (a read-only mapping); ``cuda_docs``: what torch's documentation lists for CUDA
    (documented, not measured); ``cuda``: this torch build's CUDA autocast in the table's first
    dtype, run on a GPU or on fake CUDA tensors (``OpTable.cuda_source`` says which; an error there
    if the op cannot run on fake tensors); ``differs``: the rule (or the error) of the first
    measured dtype and of ``cuda`` are not the same."""

    op: str
    group: str
    measured: dict
    cuda_docs: Cell
    cuda: Cell
    differs: bool


@dataclass(frozen=True)
class OpTable:
    """``op_table``'s result: ``rows`` (``OpRow``), the ``dtypes`` and ``device`` measured,
    ``cuda_source`` (how the CUDA column was obtained) and ``table`` to print."""

    rows: tuple
    dtypes: tuple
    device: str
    cuda_source: str
    table: Table

    def row(self, op: str) -> OpRow:
        """The row of ``op`` (a name of ``OPS``)."""
        for r in self.rows:
            if r.op == op:
                return r
        raise ValueError(f"unknown op {_shown(op)}: one of the names in ampviz.training.autocast.OPS")

    def differences(self) -> tuple:
        """The ops whose rule differs between the measured device and CUDA."""
        return tuple(r.op for r in self.rows if r.differs)

    def differences_table(self) -> Table:
        """The rows of ``differences()`` only: the op, the measured columns and this build's CUDA
        column (the documented one and the "differs" column left out)."""
        keep = [i for i, c in enumerate(self.table.columns) if not c.startswith("CUDA docs") and " vs " not in c]
        rows = [tuple(row[i] for i in keep) for r, row in zip(self.rows, self.table.rows) if r.differs]
        return Table(tuple(self.table.columns[i] for i in keep), rows,
                     title=f"where {self.device.upper() if self.device == 'cpu' else 'CUDA'} and CUDA autocast "
                           f"differ: {len(rows)} of {len(self.rows)} ops")

    def __str__(self) -> str:
        return str(self.table)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return self.table._repr_html_()


def _dtypes(dtypes) -> tuple:
    if isinstance(dtypes, (str, torch.dtype)):
        dtypes = (dtypes,)
    if not isinstance(dtypes, (list, tuple)):
        raise TypeError(f"dtypes must be one or two of 'float16', 'bfloat16' (a list or tuple), not {_shown(dtypes)}")
    if not 1 <= len(dtypes) <= 2:
        raise ValueError(f"dtypes must be one or two of 'float16', 'bfloat16', not {_shown(dtypes)}")
    out = tuple(autocast_cache._autocast_dtype(d) for d in dtypes)
    if len(set(out)) != len(out):
        raise ValueError(f"dtypes must not repeat a dtype, not {_shown(dtypes)}")
    return out


def _device(device) -> str:
    if not (isinstance(device, str) and device in ("cpu", "cuda")):
        raise ValueError(f"device must be 'cpu' or 'cuda', not {_shown(device)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' is not available here (torch.cuda.is_available() is False): pass 'cpu'")
    return device


#: Where ``op_table`` takes its CUDA column from (its ``cuda`` argument).
CUDA_SOURCES = ("auto", "fake", "gpu")


def _cuda_where(cuda) -> str:
    if not (isinstance(cuda, str) and cuda in CUDA_SOURCES):
        raise ValueError(f"cuda must be one of {', '.join(map(repr, CUDA_SOURCES))}, not {_shown(cuda)}")
    if cuda == "gpu" and not torch.cuda.is_available():
        raise ValueError("cuda='gpu' needs a GPU (torch.cuda.is_available() is False): pass 'fake' or 'auto'")
    if cuda == "fake" or not torch.cuda.is_available():
        return "fake-cuda"
    return "cuda"


def _release() -> str:
    """torch's version without its build tag ("2.13.0", not "2.13.0+cpu" or "+cu128")."""
    return str(torch.__version__).split("+")[0]


def _rule_of(cell: Cell) -> str:
    return "error" if cell.error else cell.rule


def op_table(dtypes=("float16", "bfloat16"), device: str = "cpu", cuda: str = "auto") -> OpTable:
    """Each op of ``OPS`` run under ``torch.autocast(device, dtype=...)`` for each of ``dtypes``
    (one or two of "float16", "bfloat16"), on float32 inputs ("(mixed)" ops: one input in the
    autocast dtype, one float32). Each cell: the output dtype and the rule that gave it:

    - "ran in fp16" / "ran in bf16": autocast cast the inputs down (its lower-precision list);
    - "ran in fp32": autocast runs it in float32 (its fp32 list): found by running the op once more
      on inputs in the autocast dtype, which still gives float32;
    - "as its input": autocast leaves it alone: on inputs in the autocast dtype it stays there;
    - "widest input": mixed inputs, autocast cast the low-precision one up to float32 (its promote
      list; seen as a cast at the dispatcher);
    - "own promotion": mixed inputs, autocast left the op alone; the op's own type promotion gave
      float32;
    - "error: ...": the op raised under autocast.

    The CUDA columns: torch's documented CUDA lists (not measured), and this build's CUDA autocast in
    the first dtype, from where ``cuda`` says: "fake" runs it on fake CUDA tensors (the same
    autocast dispatch picks the dtype; no GPU kernel runs, and none is needed), "gpu" measures it on
    the GPU (only where ``torch.cuda.is_available()``), "auto" (the default) measures it on the GPU
    when there is one, else on fake tensors. With ``cuda="fake"`` the table prints the same text
    with or without a GPU (a lesson's checked output); a test marked ``gpu`` holds the fake run to
    the GPU's. ``device="cuda"`` measures the main columns on the GPU too (only where one is
    available).
    """
    dts, device = _dtypes(dtypes), _device(device)
    cuda_where = _cuda_where(cuda)
    cuda_source = "measured on CUDA" if cuda_where == "cuda" else "this build's CUDA autocast on fake CUDA tensors"
    rows = []
    for op in _OPS:
        measured = types.MappingProxyType({str(dt).replace("torch.", ""): _measure(op, device, dt) for dt in dts})
        cuda = _measure(op, cuda_where, dts[0])
        first = measured[str(dts[0]).replace("torch.", "")]
        rows.append(OpRow(op.name, op.group, measured, _documented(op, dts[0]), cuda,
                          _rule_of(first) != _rule_of(cuda)))
    dev = device.upper() if device == "cpu" else "CUDA"
    columns = ("op", *(f"{dev} {SHORT[dt]} (measured)" for dt in dts), "CUDA docs (not measured)",
               f"CUDA {SHORT[dts[0]]} ({'measured' if cuda_where == 'cuda' else 'fake tensors'})",
               f"{dev} vs CUDA")
    table_rows = [(r.op, *map(str, r.measured.values()), str(r.cuda_docs), str(r.cuda),
                   "differs" if r.differs else "same") for r in rows]
    title = f"torch {_release()}: torch.autocast on float32 inputs"
    return OpTable(tuple(rows), tuple(str(d).replace("torch.", "") for d in dts), device, cuda_source,
                   Table(columns, table_rows, title=title))


# --------------------------------------------------------------------------------------------
# Why the loss comes out float32
# --------------------------------------------------------------------------------------------

#: The losses ``loss_report`` computes from the model output ``output`` (targets ``target``,
#: class labels ``labels``), under autocast.
LOSSES = {
    "mse_loss": "F.mse_loss(output, target)",
    "cross_entropy": "F.cross_entropy(output, labels)",
    "output.sum()": "output.sum()",
    "output.mean()": "output.mean()",
    "output.float().sum()": "output.float().sum()",
}
#: More losses ``loss_report`` computes (``loss_table`` does not show them: an exercise asks about
#: one of them).
OTHER_LOSSES = {
    "mse_loss(reduction='sum')": "F.mse_loss(output, target, reduction='sum')",
    "l1_loss": "F.l1_loss(output, target)",
}
#: GradScaler's default ``init_scale``.
DEFAULT_SCALE = 2.0**16
_FP16_MAX = float(torch.finfo(torch.float16).max)


@dataclass(frozen=True)
class LossReport:
    """One scaled training step of a ``nn.Linear(4, 3)`` model (batch 8) under CPU autocast in
    ``dtype``, with a real ``torch.amp.GradScaler("cpu")`` at its default scale 65536:

    ``output_dtype``, ``loss_dtype``, ``scaled_dtype``: of the model output, of the loss, of
    ``scaler.scale(loss)``; ``loss``, ``scaled``: their values (``scaled`` is finite: a float32
    loss times 65536 does not overflow; ``scaled_fits_fp16``: whether it would fit in float16 at
    all); ``output_grad_dtype``, ``output_grad_max``: the gradient that reaches the model output in
    the scaled backward and its largest magnitude (inf where the backward overflowed: it runs in the
    output's dtype); ``weight_grad_finite``: whether the fp32 ``.grad`` of the weight is finite;
    ``step_skipped``: the weights did not change (GradScaler found an inf and skipped the step);
    ``scale_after``: the scale after ``update()`` (65536 kept, or halved to 32768)."""

    loss_name: str
    dtype: str
    output_dtype: str
    loss_dtype: str
    scaled_dtype: str
    loss: float
    scaled: float
    scaled_fits_fp16: bool
    output_grad_dtype: str
    output_grad_max: float
    weight_grad_finite: bool
    step_skipped: bool
    scale_after: float


def _loss_name(loss) -> str:
    if not (isinstance(loss, str) and (loss in LOSSES or loss in OTHER_LOSSES)):
        raise ValueError(f"unknown loss {_shown(loss)}: one of {', '.join(map(repr, {**LOSSES, **OTHER_LOSSES}))}")
    return loss


def _loss_of(name: str, output, target, labels):
    if name == "mse_loss":
        return F.mse_loss(output, target)
    if name == "cross_entropy":
        return F.cross_entropy(output, labels)
    if name == "output.sum()":
        return output.sum()
    if name == "output.mean()":
        return output.mean()
    if name == "mse_loss(reduction='sum')":
        return F.mse_loss(output, target, reduction="sum")
    if name == "l1_loss":
        return F.l1_loss(output, target)
    return output.float().sum()


def loss_report(loss: str = "mse_loss", dtype="float16", seed: int = 0) -> LossReport:
    """Run one step of ``LossReport``'s model with ``loss`` (a key of ``LOSSES`` or ``OTHER_LOSSES``)
    under CPU autocast in ``dtype`` ("float16" or "bfloat16") with a real
    ``torch.amp.GradScaler("cpu")``; ``seed``
    draws the model and the batch (``torch.random.fork_rng``: the global RNG is left as it was).

    What it shows (float16): ``mse_loss`` and ``cross_entropy`` come out float32 (CPU autocast's
    fp32 list), so ``loss * 65536`` is a finite float32 even where it exceeds 65504. The overflow
    GradScaler guards against happens in the backward, where the gradient enters the float16
    output: ``output.sum()`` and ``output.mean()`` stay float16 on the CPU (CUDA autocast runs sum
    in float32), their 0-dim gradient 65536 becomes inf in float16 and step 1 is skipped; even a
    float32 loss overflows there when d(loss)/d(output) is about 1 (``output.float().sum()``)."""
    name, dt = _loss_name(loss), autocast_cache._autocast_dtype(dtype)
    seed = _seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = nn.Linear(4, 3)
        gen = torch.Generator().manual_seed(seed)
        x, target = torch.randn(8, 4, generator=gen), torch.randn(8, 3, generator=gen)
        labels = torch.randint(0, 3, (8,), generator=gen)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    before = [p.detach().clone() for p in model.parameters()]
    with torch.autocast("cpu", dtype=dt):
        output = model(x)
        value = _loss_of(name, output, target, labels)
    seen = {}
    output.register_hook(lambda g: seen.setdefault("grad", g.detach()))
    scaled = scaler.scale(value)
    scaled.backward()
    scaler.step(opt)
    scaler.update()
    g = seen["grad"]
    skipped = all(torch.equal(b, p.detach()) for b, p in zip(before, model.parameters()))
    s = float(scaled.detach())
    return LossReport(
        loss_name=name, dtype=str(dt).replace("torch.", ""), output_dtype=SHORT[output.dtype],
        loss_dtype=SHORT[value.dtype], scaled_dtype=SHORT[scaled.dtype], loss=float(value.detach()), scaled=s,
        scaled_fits_fp16=math.isfinite(s) and abs(s) <= _FP16_MAX, output_grad_dtype=SHORT[g.dtype],
        output_grad_max=float(g.float().abs().max()), weight_grad_finite=bool(torch.isfinite(model.weight.grad).all()),
        step_skipped=skipped, scale_after=float(scaler.get_scale()))


def loss_table(dtype="float16", seed: int = 0) -> Table:
    """``loss_report`` for every loss of ``LOSSES``: dtypes, the scaled loss, the largest gradient
    at the model output (values to four digits) and what GradScaler did with step 1."""
    dt = autocast_cache._autocast_dtype(dtype)
    seed = _seed(seed)
    rows = []
    for name in LOSSES:
        r = loss_report(name, dt, seed)
        step = (f"skipped, scale {number(r.scale_after)}" if r.step_skipped else
                f"runs, scale {number(r.scale_after)}")
        rows.append((name, r.output_dtype, r.loss_dtype, f"{r.scaled_dtype} {measured(r.scaled)}",
                     f"{r.output_grad_dtype} {measured(r.output_grad_max)}", step))
    return Table(("loss", "output", "loss dtype", "loss × 65536", "max |grad| at the output", "step 1"), rows,
                 title=f"nn.Linear(4, 3) under {SHORT[dt]} CPU autocast, GradScaler('cpu') at scale 65536")


# --------------------------------------------------------------------------------------------
# The weight cache
# --------------------------------------------------------------------------------------------

#: Arrangements of two forwards ``y1 = lin(x)``, ``y2 = lin(x)``; keys are ``weight_casts``'s ``case``.
CACHE_CASES = {
    "one_block": "both forwards in one autocast block",
    "nested_blocks": "each forward in an inner autocast, inside one outer block",
    "separate_blocks": "each forward in its own autocast block",
    "cache_disabled": "one block with cache_enabled=False",
    "clear_cache": "one block, torch.clear_autocast_cache() between the forwards",
    "no_grad": "one block, both forwards under torch.no_grad()",
    "no_grad_then_grad": "one block, the first forward under torch.no_grad()",
    "inference_mode": "one block, all under torch.inference_mode()",
    "frozen_weight": "one block, the weight frozen (requires_grad_(False))",
    "other_dtype_inside": "one block, the second forward in an inner block with the other dtype",
    "no_autocast": "no autocast",
}
#: ``cache_table``'s stale column: the ``ampviz.pitfalls.autocast_cache.STALE_CASES`` key of each case.
_STALE_CASE = {"one_block": "one_block", "nested_blocks": "nested_blocks", "separate_blocks": "separate_blocks",
               "cache_disabled": "cache_disabled", "clear_cache": "clear_cache", "no_grad": "no_grad_passes",
               "inference_mode": "inference_mode", "frozen_weight": "frozen_weight", "no_autocast": "no_autocast"}


@dataclass(frozen=True)
class CacheReport:
    """``weight_casts``'s result: ``weight_casts``/``bias_casts``/``input_casts``: how many casts of
    the layer's weight, bias and input reached the dispatcher in the two forwards (each cast autocast
    makes is one ``aten._to_copy``/``aten.to``; a cached copy reused makes none); ``output_dtypes``;
    ``grad_fn``: whether the second output has a ``grad_fn``; ``shared_copy``: whether both outputs
    hang on the same cast node of the weight in the autograd graph (None where there is no graph);
    ``error``: "Type: message" if the second forward raised; ``inside_autocast``: the call itself
    ran inside an autocast block (then that outer block, not these, decides when the cache is
    emptied)."""

    case: str
    description: str
    dtype: str
    weight_casts: int
    bias_casts: int
    input_casts: int
    output_dtypes: tuple
    grad_fn: bool | None
    shared_copy: bool | None
    error: str | None
    inside_autocast: bool


def _case(case) -> str:
    if not (isinstance(case, str) and case in CACHE_CASES):
        raise ValueError(f"unknown case {_shown(case)}: one of {', '.join(map(repr, CACHE_CASES))}")
    return case


def _weight_node(y, weight):
    """The ``ToCopyBackward0`` node (the cast of ``weight``) that ``y`` hangs on (None if none)."""
    seen, todo = set(), [y.grad_fn] if y is not None and y.grad_fn is not None else []
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__ == "ToCopyBackward0":
            leaves = [n for n, _ in node.next_functions if n is not None]
            if any(getattr(n, "variable", None) is weight for n in leaves):
                return node
        todo.extend(n for n, _ in node.next_functions)
    return None


def _autocast_depth() -> int:
    depth = torch.autocast_increment_nesting()
    torch.autocast_decrement_nesting()
    return depth - 1


def weight_casts(case: str = "one_block", dtype="float16") -> CacheReport:
    """Two forwards of ``nn.Linear(8, 4)`` (seed 0) on the same input, arranged as ``case`` says (a
    key of ``CACHE_CASES``), under CPU autocast in ``dtype``; every dtype cast that reaches the
    dispatcher is counted (a ``TorchDispatchMode`` below autocast), per source tensor.

    On torch 2.13: a weight that requires grad is cast once for both forwards of one block (the
    second forward reuses the cached copy: ``weight_casts == 1``, and in grad mode both outputs hang
    on the same cast node), also in nested blocks and under ``no_grad`` (cached copies carry grad:
    pytorch/pytorch PR #165068); it is cast for each forward with ``cache_enabled=False``, after
    ``torch.clear_autocast_cache()``, in separate blocks (the cache is emptied when the outermost
    block exits), under ``inference_mode`` and for a frozen weight. The input is cast every time.
    ``other_dtype_inside``: the cache is keyed by the weight alone, so an inner block with the other
    dtype is handed the cached copy in the first dtype and the matrix product raises.
    (``clear_cache`` empties the whole cache, an enclosing block's too.)"""
    case, dt = _case(case), autocast_cache._autocast_dtype(dtype)
    other = torch.bfloat16 if dt == torch.float16 else torch.float16
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        lin = nn.Linear(8, 4)
        x = torch.randn(4, 8)
    if case == "frozen_weight":
        lin.requires_grad_(False)
    inside = _autocast_depth() > 0
    block = lambda **kw: torch.autocast("cpu", dtype=kw.pop("dtype", dt), **kw)  # noqa: E731
    ys, error = [], None
    with _CastLog() as log:
        try:
            if case == "no_autocast":
                ys += [lin(x), lin(x)]
            elif case == "separate_blocks":
                with block():
                    ys.append(lin(x))
                with block():
                    ys.append(lin(x))
            elif case == "nested_blocks":
                with block():
                    with block():
                        ys.append(lin(x))
                    with block():
                        ys.append(lin(x))
            else:
                mode = (torch.inference_mode() if case == "inference_mode" else
                        torch.no_grad() if case == "no_grad" else contextlib.nullcontext())
                with mode, block(cache_enabled=case != "cache_disabled"):
                    with torch.no_grad() if case == "no_grad_then_grad" else contextlib.nullcontext():
                        ys.append(lin(x))
                    if case == "clear_cache":
                        torch.clear_autocast_cache()
                    if case == "other_dtype_inside":
                        with block(dtype=other):
                            ys.append(lin(x))
                    else:
                        ys.append(lin(x))
        except RuntimeError as exc:  # the other dtype's cached copy: the lesson is the error
            error = _error(exc)
    count = lambda t: sum(src is t for src, _, _ in log.casts)  # noqa: E731
    last = ys[-1] if len(ys) == 2 else None
    nodes = [_weight_node(y, lin.weight) for y in ys]
    shared = (nodes[0] is nodes[1]) if len(nodes) == 2 and None not in nodes else None
    return CacheReport(
        case=case, description=CACHE_CASES[case], dtype=str(dt).replace("torch.", ""),
        weight_casts=count(lin.weight), bias_casts=count(lin.bias), input_casts=count(x),
        output_dtypes=tuple(SHORT[y.dtype] for y in ys), grad_fn=None if last is None else last.grad_fn is not None,
        shared_copy=shared, error=error, inside_autocast=inside)


def _cases(cases) -> tuple:
    if cases is None:
        return tuple(CACHE_CASES)
    if isinstance(cases, str):
        cases = (cases,)
    if not isinstance(cases, (list, tuple)) or not cases:
        raise TypeError(f"cases must be a list of keys of CACHE_CASES ({', '.join(map(repr, CACHE_CASES))}), "
                        f"not {_shown(cases)}")
    return tuple(_case(c) for c in cases)


def cache_table(cases=None, dtype="float16") -> Table:
    """``weight_casts`` for each of ``cases`` (keys of ``CACHE_CASES``; default: all) in ``dtype``:
    the casts of the weight in two forwards, and whether a weight changed in place between two
    forwards is seen by the second (``ampviz.pitfalls.autocast_cache.in_place_update``, the same
    arrangement; "—" where it has none). One cast for two forwards means the second forward used
    the cached copy, and a cached copy does not see an in-place update."""
    cases, dt = _cases(cases), autocast_cache._autocast_dtype(dtype)
    rows = []
    for case in cases:
        r = weight_casts(case, dt)
        casts = f"raises {r.error.split(':')[0]}" if r.error else str(r.weight_casts)
        stale = "—"
        if case in _STALE_CASE:
            o = autocast_cache.in_place_update(_STALE_CASE[case], dt)
            stale = o.error_type if o.failed else ("yes" if o.details["output changed"] else "no: stale copy")
        rows.append((r.description, casts, stale))
    return Table(("two forwards of nn.Linear", "casts of the weight", "sees an in-place update"), rows,
                 title=f"the autocast weight cache, {SHORT[dt]} CPU autocast")


# --------------------------------------------------------------------------------------------
# torch.compile
# --------------------------------------------------------------------------------------------

#: The ``torch.compile`` backends ``compile_report`` takes: "aot_eager" traces and runs the graph
#: with eager kernels (about a second); "inductor" generates and compiles C++ (its first compile in
#: a fresh cache takes many seconds, later ones reuse its on-disk cache). ``compile_report`` reports
#: the time it took.
BACKENDS = ("aot_eager", "inductor")
_fresh = itertools.count()


@dataclass(frozen=True)
class CompileReport:
    """``compile_report``'s result: ``backend``; ``output_dtype`` of the eager and of the compiled
    forward under autocast; ``eager_sees_update``/``compiled_sees_update``: whether, inside one
    autocast block, a forward after an in-place update of the weight gives a different output
    (eager: no, the cached copy; compiled: the graph casts the weight on every call);
    ``same_as_fresh_eager``: the compiled output after the update equals, bit for bit, an eager
    forward of the updated weight in a fresh block; ``seconds``: the compile and first call."""

    backend: str
    dtype: str
    output_dtype: str
    compiled_output_dtype: str
    eager_sees_update: bool
    compiled_sees_update: bool
    same_as_fresh_eager: bool
    seconds: float
    warnings: tuple = ()


def _fresh_forward():
    """``forward(model, x) = model(x)`` as a new code object each time, so each ``torch.compile``
    compiles afresh (no recompiles of a shared one, no global reset)."""
    namespace = {}
    exec(compile("def forward(model, x):\n    return model(x)\n", f"<ampviz.training.autocast forward {next(_fresh)}>",
                 "exec"), namespace)
    return namespace["forward"]


def _updated_twice(forward, dt):
    """``(y1, y2, fresh)``: y1, an in-place update of the weight, y2 in one autocast block; then an
    eager forward of the updated weight in a new block."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        lin = nn.Linear(8, 4)
        x = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=dt):
        y1 = forward(lin, x)
        with torch.no_grad():
            lin.weight.add_(1.0)
        y2 = forward(lin, x)
    with torch.autocast("cpu", dtype=dt):
        fresh = lin(x)
    return y1.detach(), y2.detach(), fresh.detach()


def compile_report(backend: str = "aot_eager", dtype="bfloat16") -> CompileReport:
    """``forward(model, x) = model(x)`` compiled with ``torch.compile(backend=backend)`` (one of
    ``BACKENDS``) and called twice inside one CPU autocast block in ``dtype``, with the weight
    changed in place between the calls, beside the same in eager mode. Measured on torch 2.13: the
    eager forward reuses the cached low-precision weight (stale); the compiled forward sees the
    update (Dynamo traces autocast into the graph with its cache off, so the graph casts the
    weight on every call)."""
    if not (isinstance(backend, str) and backend in BACKENDS):
        raise ValueError(f"unknown backend {_shown(backend)}: one of {', '.join(map(repr, BACKENDS))}")
    dt = autocast_cache._autocast_dtype(dtype)
    e1, e2, _ = _updated_twice(lambda model, x: model(x), dt)
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = torch.compile(_fresh_forward(), backend=backend)
        c1, c2, fresh = _updated_twice(compiled, dt)
    seconds = time.perf_counter() - start
    return CompileReport(backend=backend, dtype=str(dt).replace("torch.", ""), output_dtype=SHORT[e2.dtype],
                         compiled_output_dtype=SHORT[c2.dtype], eager_sees_update=not torch.equal(e1, e2),
                         compiled_sees_update=not torch.equal(c1, c2), same_as_fresh_eager=torch.equal(c2, fresh),
                         seconds=seconds, warnings=tuple(str(w.message).splitlines()[0] for w in caught))


def compile_table(backend: str = "aot_eager", dtype="bfloat16") -> Table:
    """``compile_report(backend, dtype)`` as a table, beside the same two forwards in eager mode:
    for each, the output dtype, whether the second forward (after the in-place update of the
    weight, inside the same autocast block) gives a different output, and whether it equals an
    eager forward of the updated weight in a fresh block. No timings (they change from run to run)."""
    r = compile_report(backend, dtype)
    dt = autocast_cache._autocast_dtype(dtype)
    _, e2, fresh = _updated_twice(lambda model, x: model(x), dt)
    yes = lambda b: "yes" if b else "no"  # noqa: E731
    rows = [("eager", r.output_dtype, "yes" if r.eager_sees_update else "no: stale copy",
             yes(torch.equal(e2, fresh))),
            (f'torch.compile(forward, backend="{r.backend}")', r.compiled_output_dtype,
             "yes" if r.compiled_sees_update else "no: stale copy", yes(r.same_as_fresh_eager))]
    return Table(("forward", "output", "y2 sees the in-place update", "y2 equals a fresh eager forward"), rows,
                 title=f"y1 = forward(lin, x); lin.weight.add_(1); y2 = forward(lin, x), in one {SHORT[dt]} CPU "
                       "autocast block")


# --------------------------------------------------------------------------------------------
# Exercise checkers (the expected answers come from real runs)
# --------------------------------------------------------------------------------------------

#: How a learner may write each dtype (text is folded: case, quotes and spaces ignored).
_DTYPE_WORDS = {
    "fp16": {"fp16", "float16", "half", "torch.float16", "torch.half", "f16"},
    "bf16": {"bf16", "bfloat16", "torch.bfloat16", "brain float", "bfloat"},
    "fp32": {"fp32", "float32", "float", "single", "torch.float32", "torch.float", "f32"},
}


def _dtype_said(answer) -> str | None:
    """A dtype answer as "fp16", "bf16" or "fp32" (a torch dtype or text), else None."""
    if isinstance(answer, torch.dtype):
        return SHORT.get(answer)
    if not isinstance(answer, str):
        return None
    said = " ".join(answer.strip().strip("'\"").strip().rstrip(".").casefold().split())
    return next((k for k, words in _DTYPE_WORDS.items() if said in words), None)


def check_softmax_dtype(answer, dtype="float16") -> Check:
    """Q: under ``torch.autocast("cpu", dtype=dtype)``, ``torch.softmax`` of a Linear layer's
    output: which dtype comes out? Measured by running it (CPU autocast has no rule for softmax,
    so it runs in the dtype the Linear gave it; CUDA autocast would run it in float32)."""
    dt = autocast_cache._autocast_dtype(dtype)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        lin, x = nn.Linear(8, 4), torch.randn(4, 8)
    with torch.autocast("cpu", dtype=dt):
        expected = SHORT[torch.softmax(lin(x), dim=-1).dtype]
    return check(answer, expected, accept=lambda a: _dtype_said(a) == expected,
                 hint="which dtype does the Linear hand to softmax, and is softmax on CPU autocast's lists at all? "
                      '(answer with a dtype: "fp16", "fp32" or torch.float16, ...)')


def check_sum_loss_step(answer) -> Check:
    """Q: ``loss_report``'s model and batch with ``F.mse_loss(output, target, reduction="sum")``
    instead of the mean, fp16 CPU autocast, GradScaler at 65536: does step 1 "run" or is it
    "skipped"? Measured with ``loss_report``."""
    skipped = loss_report("mse_loss(reduction='sum')").step_skipped
    words = ({"skipped", "skip", "skips", "it is skipped", "it's skipped", "skipped step"} if skipped
             else {"runs", "run", "ran", "it runs", "it runs", "step runs"})
    return check(answer, "skipped" if skipped else "runs", accept=lambda a: _said(a) in words,
                 hint="the loss is fp32 either way; how large is d(loss)/d(output) × 65536 with a sum over 24 "
                      "outputs instead of their mean, and in which dtype does that gradient enter the output? "
                      '(answer "runs" or "skipped")')


def check_casts_inside_outer(answer) -> Check:
    """Q: a function runs two forwards of a Linear, each in its own fp16 autocast block (two casts
    of the weight when called on its own); called from inside the caller's own autocast block, how
    many casts of the weight does it make? Measured with ``weight_casts`` inside an outer block."""
    with torch.autocast("cpu", dtype=torch.float16):
        expected = weight_casts("separate_blocks", "float16").weight_casts
    return check(answer, expected, accept=lambda a: _whole_answer(a) == expected,
                 hint="the cache is emptied when which autocast block exits: the inner ones, or the outermost?")


def _whole_answer(answer):
    if isinstance(answer, bool) or answer is None:
        return None
    if isinstance(answer, str):
        answer = _number_text(answer)
    try:
        value = float(answer)
    except (TypeError, ValueError, OverflowError):
        return None
    return int(value) if math.isfinite(value) and value == int(value) else None


def check_round_up_share(answer, value: float = 3.01) -> Check:
    """Q: stochastic rounding sends ``value`` (as float32) to one of its two bf16 neighbours: with
    what probability to the upper one? (within 0.005; the neighbours from torch's bf16 cast and
    ``nextafter``, as ``ampviz.training.bf16.rounding_statistics`` finds them)."""
    from ampviz.training.bf16 import rounding_statistics

    expected = rounding_statistics([value], draws=1).checks[0].expected
    return check(answer, expected, tol=0.005,
                 hint="bf16 keeps 8 significant bits, so between 2 and 4 its numbers are 2^-6 apart; the chance "
                      "of the upper neighbour is the distance from the lower one divided by that gap")


#: Bit patterns ``check_stochastic_rounding`` also rounds: NaNs with payloads (the quiet NaN torch
#: makes, a signalling one, the largest negative one), +inf, -inf, +0 and -0.
_SPECIAL_BITS = (0x7FC00000, 0x7F800001, 0x7FBFFFFF, 0xFFFFFFFF, 0x7F800000, 0xFF800000, 0x00000000, 0x80000000)


def _special_values_kept(fn):
    """True if ``fn`` keeps every NaN NaN and returns ±inf and ±0 unchanged (200 draws each), else a hint."""
    bits = torch.tensor([b - (1 << 32) if b >= 1 << 31 else b for b in _SPECIAL_BITS], dtype=torch.int32)
    x = bits.view(torch.float32).repeat(200)
    try:
        out = fn(x, torch.Generator().manual_seed(1))
        nan = torch.isnan(x)
        kept = bool(torch.isnan(out[nan]).all()) and bool(
            torch.equal(out[~nan].view(torch.int16).to(torch.int32) & 0xFFFF,
                        (x[~nan].view(torch.int32) >> 16) & 0xFFFF))
    except Exception as exc:  # noqa: BLE001 - the learner's function on NaN and inf
        return f"your function raised {type(exc).__name__} on NaN or inf: {' '.join(str(exc).split())[:80]}"
    return True if kept else ("NaN must stay NaN and ±inf, ±0 unchanged: the bit trick can carry a NaN's bits into "
                              "inf or a number (torch.where(torch.isnan(x), ...))")


def check_stochastic_rounding(answer) -> Check:
    """Q: write ``f(x, generator)``: a float32 tensor rounded stochastically to bfloat16, drawing
    its random numbers from ``generator``. The answer is the function; the checker runs the
    statistical test of ``ampviz.training.bf16.rounding_statistics`` on it (eleven values, 20,000 draws
    each: only the two neighbours, unbiased within 5 sigmas, exact values unchanged), then rounds
    NaNs (with payloads, whose bit patterns the trick can carry into inf or a number), ±inf and
    ±0 200 times each, with a hint for the way it fails."""
    from ampviz.training.bf16 import rounding_statistics

    if answer is None or answer is Ellipsis:
        return check(answer, None)
    if not callable(answer) or isinstance(answer, type):
        return Check("wrong", "✗ not quite: set answer = your function itself (no call, no quotes)")
    try:
        stats = rounding_statistics(rounding=answer)
    except Exception as exc:  # noqa: BLE001 - whatever the learner's function does is an answer
        first = " ".join(str(exc).split("\n")[0].split())[:120]
        if first.startswith("rounding must return a bfloat16 tensor"):
            return Check("wrong", "✗ not quite: return a bfloat16 tensor of x's shape "
                                  "(.to(torch.bfloat16) at the end)")
        return Check("wrong", f"✗ not quite: your function raised {type(exc).__name__}: {first}")
    if stats.passed:
        special = _special_values_kept(answer)
        if special is True:
            return Check("right", "✓ correct")
        return Check("wrong", f"✗ not quite: {special}")
    if not all(c.neighbours_only for c in stats.checks):
        return Check("wrong", "✗ not quite: some results are not one of the value's two bf16 neighbours (or an "
                              "exact bf16 value moved): the random number must stay below 2^16")
    negative = [c.passed for c in stats.checks if c.value < 0]
    positive = [c.passed for c in stats.checks if c.value >= 0]
    if all(positive) and not all(negative):
        return Check("wrong", "✗ not quite: right for positive values, biased for negative ones: a float32's bits "
                              "hold the magnitude apart from the sign")
    return Check("wrong", "✗ not quite: biased: the mean result is not the value; round up with probability "
                          "(distance to the lower neighbour) / (gap), e.g. 16 random bits added to the low 16 bits")
