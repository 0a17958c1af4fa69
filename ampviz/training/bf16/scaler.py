"""When bf16 needs no loss scaler and fp16 does, measured on the beam model's gradients.

``scaler_need``: the gradients of one fp32 backward pass cast to fp16 and to bf16 at scale 1 and to
fp16 at the scaler's scale (how many become 0: ``GradientShare``), beside real fp16 and bf16 autocast
backward passes of the same batch (how many are 0: ``RunZeros``); ``scaler_need_table`` prints them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ampviz.text import Table, number
from ampviz._args import _shown
from ampviz._args import _real, _seed, _whole
from ampviz.training import torch_cast_counts
from ampviz.training.bf16.arguments import _MAKER, _stats

# --------------------------------------------------------------------------------------------
# 1. When bf16 needs no loss scaler and fp16 does
# --------------------------------------------------------------------------------------------

MAX_BEAM_BATCH = 4096


@dataclass(frozen=True)
class GradientShare:
    """What torch's cast of ``values`` fp32 gradients (times ``scale``) to ``dtype`` does:
    ``underflow`` nonzero gradients become 0, ``subnormal`` land among the format's subnormals,
    ``overflow`` become inf (counts from ``ampviz.training.torch_cast_counts``)."""

    gradients: str
    dtype: str
    scale: float
    values: int
    underflow: int
    subnormal: int
    overflow: int

    @property
    def lost(self) -> float:
        """The share of the gradients that become 0."""
        return self.underflow / self.values if self.values else 0.0


@dataclass(frozen=True)
class RunZeros:
    """One set of ``gradients`` ("parameters" or "layer outputs": the gradients of the Linear
    layers' outputs) of one real backward pass (``autocast``: None for fp32, "float16" or
    "bfloat16"): how many are exactly 0, and the smallest nonzero |gradient| (0 if all are 0)."""

    gradients: str
    autocast: str | None
    values: int
    zeros: int
    smallest: float

    @property
    def label(self) -> str:
        return {None: "fp32", "float16": "fp16 autocast", "bfloat16": "bf16 autocast"}[self.autocast]

    @property
    def share(self) -> float:
        """The share of the gradients that are exactly 0."""
        return self.zeros / self.values if self.values else 0.0


GRADIENT_SETS = ("parameters", "layer outputs")
_DTYPE_LABELS = {"float16": "fp16", "bfloat16": "bf16"}


@dataclass(frozen=True)
class ScalerNeed:
    """``scaler_need``'s measurements: ``casts`` (``GradientShare`` per gradient set, dtype and
    scale) and ``runs`` (``RunZeros`` per gradient set of an fp32, an fp16 autocast and a bf16
    autocast backward pass); ``loss``: the fp32 pass's loss (m^2)."""

    seed: int
    batch_size: int
    scale: float
    loss: float
    casts: tuple
    runs: tuple

    def share(self, gradients: str = "layer outputs", dtype: str = "float16", scale=1.0) -> float:
        """The share of ``gradients`` ("parameters" or "layer outputs") that the cast to ``dtype``
        ("float16" or "bfloat16") at ``scale`` (1, or this result's scaler scale in float16) loses."""
        if not isinstance(gradients, str) or gradients not in GRADIENT_SETS:
            raise ValueError(f"gradients must be 'parameters' or 'layer outputs', not {_shown(gradients)}")
        if not isinstance(dtype, str) or dtype not in _DTYPE_LABELS:
            raise ValueError(f"dtype must be 'float16' or 'bfloat16', not {_shown(dtype)}")
        scale = _real("scale", scale)
        for c in self.casts:
            if (c.gradients, c.dtype, c.scale) == (gradients, dtype, scale):
                return c.lost
        raise ValueError(f"no cast to {dtype} at scale {number(scale)} was measured: scale 1, or "
                         f"{number(self.scale)} with float16")

    def zeros(self, gradients: str = "layer outputs", autocast=None) -> float:
        """The share of ``gradients`` that are exactly 0 in the backward pass under ``autocast``
        (None for fp32, "float16" or "bfloat16")."""
        if not isinstance(gradients, str) or gradients not in GRADIENT_SETS:
            raise ValueError(f"gradients must be 'parameters' or 'layer outputs', not {_shown(gradients)}")
        if not (autocast is None or (isinstance(autocast, str) and autocast in _DTYPE_LABELS)):
            raise ValueError(f"autocast must be None (fp32), 'float16' or 'bfloat16', not {_shown(autocast)}")
        return next(r.share for r in self.runs if (r.gradients, r.autocast) == (gradients, autocast))


def scaler_need(seed: int = 0, *, batch_size: int = 256, scale=2.0**16) -> ScalerNeed:
    """The beam model's gradients at scale 1: what fp16 loses and bf16 keeps (``ampviz.training.beam``).

    One fp32 forward and backward pass of the fresh beam model on its first batch
    (``ampviz.training.beam.gradients(seed)``); its parameter gradients and the gradients of its Linear
    layers' outputs (what an fp16 backward pass carries) are cast by torch to float16 and to
    bfloat16 at scale 1, and to float16 at ``scale`` (GradScaler's initial 2^16 by default), and
    counted. Then the same batch runs forward and backward under fp16 and under bf16 autocast
    (real ``torch.autocast("cpu")``): zeros among those gradients are what each really lost
    (and a few exact cancellations: a bf16 sum of two gradients that round to opposite values).
    """
    from ampviz.training.beam import gradients

    seed = _seed(seed, spare=2)
    batch_size = _whole("batch_size", batch_size, 1, MAX_BEAM_BATCH)
    scale = _real("scale", scale)
    with np.errstate(over="ignore"):  # beyond float32's range: inf, refused below
        s32 = float(np.float32(scale))
    if not (math.isfinite(s32) and s32 > 0):
        raise ValueError(f"scale must be a positive number within float32's range, such as 65536.0, not "
                         f"{_shown(scale)}")
    scale = s32
    g = gradients(seed, batch_size=batch_size)
    passes = {None: g}
    for autocast in ("float16", "bfloat16"):
        passes[autocast] = gradients(seed, batch_size=batch_size, autocast=autocast)
    casts, runs = [], []
    for label in GRADIENT_SETS:
        values = g.weights if label == "parameters" else g.layer_outputs
        for dtype, s in (("float16", 1.0), ("bfloat16", 1.0), ("float16", scale)):
            c = torch_cast_counts(values, s, dtype)
            casts.append(GradientShare(label, dtype, s, int(values.size), c["underflow"], c["subnormal"],
                                       c["overflow"] + c["nan"]))
        for autocast, h in passes.items():
            v = h.weights if label == "parameters" else h.layer_outputs
            nonzero = np.abs(v[v != 0])
            runs.append(RunZeros(label, autocast, int(v.size), int((v == 0).sum()),
                                 float(nonzero.min()) if nonzero.size else 0.0))
    return ScalerNeed(seed, batch_size, scale, g.loss, tuple(casts), tuple(runs))


def scaler_need_table(need) -> Table:
    """One row per gradient set of a ``ScalerNeed`` and per way of holding it: cast from fp32 to
    fp16 and to bf16 at scale 1 and to fp16 at the scaler's scale (how many become 0), then the
    real fp32, fp16 autocast and bf16 autocast backward passes (how many are 0, and the smallest
    nonzero |gradient|, to two digits: the fp32 pass's moves in the third digit with torch's CPU
    kernel set, ``ATEN_CPU_CAPABILITY``)."""
    need = _stats("need", need, ScalerNeed)
    rows = []
    for label in GRADIENT_SETS:
        for c in need.casts:
            if c.gradients == label:
                rows.append((label, f"{c.values:,}", f"fp32 cast to {_DTYPE_LABELS[c.dtype]} at scale "
                             f"{number(c.scale, pow2=True)}", f"{c.underflow:,} ({100 * c.lost:.2f}%) become 0", ""))
        for r in need.runs:
            if r.gradients == label:
                rows.append((label, f"{r.values:,}", f"{r.label} backward pass",
                             f"{r.zeros:,} ({100 * r.share:.2f}%) are 0", number(r.smallest, digits=2)))
    return Table(("gradients", "values", "held as", "zeros", "smallest nonzero |gradient|"), rows,
                 title=f"beam model, seed {need.seed}, batch {need.batch_size}, scale 1 unless said")


_MAKER.update({ScalerNeed: "scaler_need"})
