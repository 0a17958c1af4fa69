"""What reaches torch's dispatcher under autocast, shared by the autocast modules.

``SHORT`` names dtypes ("fp16", "bf16", "fp32"); ``_CastLog`` records every dtype cast that reaches
the dispatcher below autocast (autocast's own casts included), ``_OpLog`` every op with the dtypes of
its inputs and outputs (both ``TorchDispatchMode``s); ``_error`` turns an exception into one line
("Type: message"); ``_dt`` and ``_dt_name`` spell a dtype for a table.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SHORT = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64"}


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


def _error(exc: BaseException) -> str:
    text = " ".join(str(exc).split("\n")[0].split())
    text = text if len(text) <= 100 else text[:97] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _dt(dtype) -> str:
    return SHORT.get(dtype, str(dtype).replace("torch.", ""))


def _dt_name(dt: torch.dtype) -> str:
    """"float16" for torch.float16."""
    return str(dt).replace("torch.", "")
