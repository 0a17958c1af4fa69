"""The ops ``op_table`` measures, and how one op is measured under autocast.

Here: the CUDA lists of torch's documentation (``CUDA_DOCS_*``, documented, not measured), the rules
a cell names and ``Cell``, the curated op list (``OPS``: about forty ops learners meet, tiny shapes),
and ``_measure``: one op run under CPU autocast, CUDA autocast on a GPU, or CUDA autocast on fake
CUDA tensors (``FakeTensorMode``: no GPU needed), its rule found from the output dtype and the casts
autocast made. ``dtype_table.op_table`` puts the cells together.
"""

from __future__ import annotations

import contextlib
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch._subclasses import FakeTensorMode

from ampviz.training.autocast.dispatch import SHORT, _CastLog, _error

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
