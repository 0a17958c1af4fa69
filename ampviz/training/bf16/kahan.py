"""``kahan_add_``: ``weight += update`` with a Kahan compensation buffer, in the weight's own dtype.

One of the three fixes for updates lost in bf16 weights that ``updates.lost_update_runs``
measures: an update too small to move the weight waits in the buffer until it is large enough.
"""

from __future__ import annotations

import torch

from ampviz._args import _shown
from ampviz._args import _real

def kahan_add_(weight, compensation, update):
    """``weight += update`` with Kahan compensation, in place, in the weight's own dtype.

    ``compensation`` (same dtype and shape as ``weight``, zeros at the start) carries what the
    rounding of the weight has not yet absorbed; four torch ops, all in the weight's dtype (torch
    adds bf16 tensors in fp32 and rounds the result into bf16):

        compensation += update          # what should be added now
        before = weight.clone()
        weight += compensation          # rounded: only part of it lands
        compensation += before - weight # keep the part that did not (before - weight is exact)

    An update too small to move the weight on its own stays in the compensation buffer until the
    buffer is large enough to move it. The buffer is bf16 too, so it holds the pending amount to
    8 bits: adding 1e-4 a thousand times to 1.0 leaves the weight at 1.1015625, the bf16 value
    nearest the exact 1.1 (plain bf16 stays at 1.0), and weight + buffer about a third of a bf16
    step above 1.1. ``update``: a tensor that broadcasts to the weight's shape
    (any float dtype; an fp32 update is added to the buffer in fp32 and rounded once) or a number
    (torch first casts it to the buffer's dtype). Runs under ``torch.no_grad()``; returns ``weight``.
    """
    for name, t in (("weight", weight), ("compensation", compensation)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor (e.g. a bfloat16 weight), not {_shown(t)}")
        if t.layout != torch.strided or t.device.type == "meta":
            raise TypeError(f"{name} must be a dense tensor holding data, not one with layout "
                            f"{str(t.layout).replace('torch.', '')} on {t.device}")
    if compensation.dtype != weight.dtype or compensation.shape != weight.shape \
            or compensation.device != weight.device:
        raise ValueError(f"compensation must match the weight's dtype, shape and device ({weight.dtype}, "
                         f"{tuple(weight.shape)}, {weight.device}); start from torch.zeros_like(weight)")
    if weight.numel() and weight.untyped_storage().data_ptr() == compensation.untyped_storage().data_ptr():
        raise ValueError("weight and compensation must be separate tensors (start from torch.zeros_like(weight))")
    if isinstance(update, torch.Tensor):
        if not (update.is_floating_point() or update.dtype in (torch.int8, torch.int16, torch.int32, torch.int64,
                                                                torch.uint8)):
            raise TypeError(f"update must be a real tensor or a number, not a {update.dtype} tensor")
        try:
            same = torch.broadcast_shapes(update.shape, weight.shape) == weight.shape
        except RuntimeError:
            same = False
        if not same or update.device != weight.device or update.layout != torch.strided:
            raise ValueError(f"update must be a dense tensor that broadcasts to the weight's shape "
                             f"{tuple(weight.shape)} on {weight.device}, not shape {tuple(update.shape)} on "
                             f"{update.device}")
    else:
        try:
            update = _real("update", update)
        except TypeError:
            raise TypeError(f"update must be a tensor that broadcasts to the weight's shape, or a number, "
                            f"not {_shown(update)}") from None
    with torch.no_grad():
        # the four ops on copies, written back at the end: a tensor that cannot be written in place
        # (an expanded one, whose elements share memory) is refused with both tensors unchanged
        w, c = weight.clone(), compensation.clone()
        c.add_(update)
        before = w.clone()
        w.add_(c)
        c.add_(before.sub_(w))
        kept = compensation.clone()
        try:
            compensation.copy_(c)
            try:
                weight.copy_(w)
            except RuntimeError:
                compensation.copy_(kept)
                raise
        except RuntimeError as exc:
            raise ValueError(f"cannot update these tensors in place ({str(exc).strip().splitlines()[0]}); "
                             "pass tensors of their own, e.g. t.clone()") from None
    return weight
