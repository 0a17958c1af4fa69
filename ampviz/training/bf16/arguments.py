"""What the bf16 modules share: ``BF16_MAX`` and their argument checks.

``_float32_tensor`` and ``_generator`` check the arguments of a rounding function; ``_stats`` checks
that a table function was handed the right result type, naming the function that makes it from
``_MAKER`` (each module that defines a result type adds it there).
"""

from __future__ import annotations

import torch

from ampviz._args import _shown

BF16_MAX = float(torch.finfo(torch.bfloat16).max)  # 3.3895314e38


def _float32_tensor(name: str, x) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a float32 tensor (e.g. torch.tensor([1.0]) or t.float()), not {_shown(x)}")
    if x.dtype != torch.float32:
        raise TypeError(f"{name} must be a float32 tensor, not a {str(x.dtype).replace('torch.', '')} tensor "
                        f"(pass {name}.float())")
    if x.layout != torch.strided or x.device.type == "meta" or x.is_quantized:
        raise TypeError(f"{name} must be a dense float32 tensor holding data, not one with layout "
                        f"{str(x.layout).replace('torch.', '')} on {x.device}")
    return x


def _generator(generator, device: torch.device) -> torch.Generator:
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator (e.g. torch.Generator().manual_seed(0)), "
                        f"not {_shown(generator)}")
    if generator.device.type != device.type:
        raise ValueError(f"generator must be on the tensor's device ({device.type}), not on {generator.device}")
    return generator


def _stats(name: str, value, kind):
    if not isinstance(value, kind):
        article = "an" if kind.__name__[0] in "AEIOU" else "a"
        raise TypeError(f"{name} must be {article} {kind.__name__} (from {_MAKER[kind]}), not {_shown(value)}")
    return value


_MAKER = {}  # filled by the modules that define them: result type -> the function that makes it (for messages)
