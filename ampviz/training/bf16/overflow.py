"""A model whose activations overflow in fp16 and stay finite in bf16.

``overflow_model``: a seeded ReLU network without normalisation whose activations grow layer by layer
past 65504; ``fp16_overflow`` evaluates it in fp32, bf16 and fp16 and reports each layer's largest
activation and the first layer where fp16 gives inf and NaN (``OverflowReport``, ``overflow_table``).
"""

from __future__ import annotations

import copy
import math
from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import nn

from ampviz.text import Table, measured
from ampviz._args import _shown
from ampviz._args import _real, _seed, _whole
from ampviz.training.bf16.arguments import _MAKER, _stats

# --------------------------------------------------------------------------------------------
# 2. A bf16 model whose activations overflow in fp16
# --------------------------------------------------------------------------------------------

MAX_WIDTH, MAX_DEPTH, MAX_BATCH = 1024, 64, 4096
MAX_WORK = 10**9  # multiply-adds per forward pass


def _overflow_sizes(width, depth, gain, batch=None):
    width = _whole("width", width, 1, MAX_WIDTH)
    depth = _whole("depth", depth, 1, MAX_DEPTH)
    gain = _real("gain", gain)
    if not (math.isfinite(gain) and 0 < gain <= 1e3):
        raise ValueError(f"gain must be a number above 0 and at most 1000 (4.0 makes each layer about 2.8 "
                         f"times larger), not {_shown(gain)}")
    if batch is None:
        return width, depth, gain
    batch = _whole("batch", batch, 1, MAX_BATCH)
    if batch * width * width * (depth + 1) > MAX_WORK:
        raise ValueError(f"batch={batch}, width={width}, depth={depth} make {batch * width * width * (depth + 1):,} "
                         f"multiply-adds per pass; at most {MAX_WORK:,}")
    return width, depth, gain, batch


def overflow_model(seed: int = 0, *, width: int = 64, depth: int = 10, gain=4.0) -> nn.Sequential:
    """A ReLU network without normalisation whose activations grow with depth (float32, seeded).

    ``depth`` blocks fc1, relu1, ..., fcN, reluN of ``nn.Linear(width, width)`` and a last Linear
    ``head`` (width -> 1). Each Linear's weights are drawn from N(0, gain² / width) and its biases
    are 0, as in a network whose weights grew in training: a layer multiplies the size (root mean
    square) of its input by about gain / √2 (the ReLU keeps half of it), 2.8 with the default gain
    of 4, so ten layers take inputs of size 1 past fp16's 65504. Initialised from torch's global
    generator seeded with ``seed`` inside ``torch.random.fork_rng`` (the caller's state is kept).
    """
    seed = _seed(seed)
    width, depth, gain = _overflow_sizes(width, depth, gain)
    layers = OrderedDict()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for i in range(1, depth + 1):
            fc = nn.Linear(width, width)
            layers[f"fc{i}"], layers[f"relu{i}"] = fc, nn.ReLU()
        layers["head"] = nn.Linear(width, 1)
        with torch.no_grad():
            for name, m in layers.items():
                if isinstance(m, nn.Linear):
                    nn.init.normal_(m.weight, 0.0, gain / math.sqrt(width))
                    nn.init.zeros_(m.bias)
    return nn.Sequential(layers)


@dataclass(frozen=True)
class OverflowReport:
    """Per Linear layer (``layers``, in forward order): the largest |output| in an fp32, a bf16
    and an fp16 evaluation (inf where fp16 gave inf; NaN where all were NaN), and how many outputs
    of the fp16 evaluation are inf and NaN; ``first_inf``/``first_nan``: the first layer whose fp16
    outputs hold an inf/a NaN (None if none); ``bf16_finite``: every bf16 output was finite."""

    seed: int
    layers: tuple
    values: tuple
    fp32_max: tuple
    bf16_max: tuple
    fp16_max: tuple
    fp16_inf: tuple
    fp16_nan: tuple
    first_inf: str | None
    first_nan: str | None
    bf16_finite: bool

    @property
    def largest(self) -> float:
        """The largest |activation| of the bf16 evaluation (NaN if every layer gave only NaN)."""
        return max((m for m in self.bf16_max if not math.isnan(m)), default=math.nan)

    @property
    def largest_at(self) -> str:
        return self.layers[self.bf16_max.index(self.largest)] if not math.isnan(self.largest) else self.layers[-1]


def _largest(t: torch.Tensor) -> float:
    a = t.detach().float().abs()
    a = a[~torch.isnan(a)]
    return float(a.max()) if a.numel() else math.nan


def _evaluate(model: nn.Sequential, x: torch.Tensor, dtype: torch.dtype):
    """(name, output) of each Linear layer of a copy of ``model`` in ``dtype`` on ``x`` (cast to it)."""
    m = copy.deepcopy(model).to(dtype)
    h = x.to(dtype)
    out = []
    with torch.no_grad():
        for name, layer in m.named_children():
            h = layer(h)
            if isinstance(layer, nn.Linear):
                out.append((name, h))
    return out


def fp16_overflow(seed: int = 0, *, width: int = 64, depth: int = 10, gain=4.0, batch: int = 64) -> OverflowReport:
    """Evaluate ``overflow_model(seed, ...)`` on a batch of standard normal inputs (a generator
    seeded with ``seed + 1``) three times: in float32, with the model and inputs cast to bfloat16,
    and cast to float16, and report each Linear layer's outputs (``OverflowReport``).

    With the defaults the activations pass 65504 in fc9 and reach about 2.4e5 in fc10: bf16 holds
    them (its range reaches 3.4e38); fp16 turns the values of fc9 past 65520 into inf, and fc10,
    whose sums add inf and -inf, gives NaN.
    """
    seed = _seed(seed, spare=1)
    width, depth, gain, batch = _overflow_sizes(width, depth, gain, batch)
    model = overflow_model(seed, width=width, depth=depth, gain=gain)
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(seed + 1))
    runs = {dt: _evaluate(model, x, dt) for dt in (torch.float32, torch.bfloat16, torch.float16)}
    names = tuple(n for n, _ in runs[torch.float32])
    half = [t for _, t in runs[torch.float16]]
    inf = tuple(int(torch.isinf(t).sum()) for t in half)
    nan = tuple(int(torch.isnan(t).sum()) for t in half)
    first = lambda counts: next((n for n, c in zip(names, counts) if c), None)  # noqa: E731
    return OverflowReport(
        seed=seed, layers=names, values=tuple(t.numel() for t in half),
        fp32_max=tuple(_largest(t) for _, t in runs[torch.float32]),
        bf16_max=tuple(_largest(t) for _, t in runs[torch.bfloat16]),
        fp16_max=tuple(_largest(t) for t in half), fp16_inf=inf, fp16_nan=nan,
        first_inf=first(inf), first_nan=first(nan),
        bf16_finite=all(bool(torch.isfinite(t).all()) for _, t in runs[torch.bfloat16]))


def overflow_table(report) -> Table:
    """One row per Linear layer of an ``OverflowReport``: largest |activation| in fp32, bf16 and
    fp16, and the fp16 outputs that are inf and NaN."""
    report = _stats("report", report, OverflowReport)
    rows = [(name, measured(report.fp32_max[i]), f"{report.bf16_max[i]:.4g}", f"{report.fp16_max[i]:.4g}",
             f"{report.fp16_inf[i]:,} of {report.values[i]:,}", f"{report.fp16_nan[i]:,}")
            for i, name in enumerate(report.layers)]
    return Table(("layer", "largest |output| fp32", "bf16", "fp16", "fp16 inf", "fp16 NaN"), rows,
                 title=f"overflow_model(seed={report.seed}): first inf in fp16 at {report.first_inf or 'none'}, "
                       f"first NaN at {report.first_nan or 'none'}")


_MAKER.update({OverflowReport: "fp16_overflow"})
