"""Why the loss comes out float32 under autocast, and where the overflow GradScaler guards against happens.

``loss_report``: one scaled step of a ``nn.Linear(4, 3)`` under float16 (or bfloat16) CPU autocast
with a real ``torch.amp.GradScaler("cpu")``: the dtypes of the output, the loss and the scaled loss,
the largest gradient that reaches the output in the backward, and whether step 1 is skipped;
``loss_table``: the same for each loss of ``LOSSES``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ampviz.text import Table, measured, number
from ampviz.pitfalls import autocast_cache
from ampviz._args import _shown
from ampviz._args import _seed
from ampviz.training.autocast.dispatch import SHORT

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
