"""The gradient census of a live run: the activation-gradient hooks and the census at a step's scale.

``_ActivationWatch`` keeps the gradient of each watched module's output during a census step;
``_census_at`` takes the census of ``gradient × scale`` (also at the scale 0 a collapsed scaler
reaches). The training loop (``ampviz.training.live``) calls both every ``census_every`` steps.

What the census sees
--------------------
The gradient census classifies ``true gradient × scale`` cast to float16 (``ampviz.formats.census.census``
with the step's scale; scale 1 without a scaler): what the float16 backward pass holds. Under fp16
autocast the weight gradients are *computed* in float16, so a gradient that underflowed in the
backward pass reaches ``.grad`` as an exact 0 and is counted as "zero", not "underflow"; the share
of zeros (dead ReLU units aside) is then what fp16 lost. In fp32 and bf16 modes the census says what
*would* vanish in float16 at that scale.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from torch import nn

from ampviz.formats.census import CensusResult, census


# ------------------------------------------------------------------ activation-gradient census
class _ActivationWatch:
    """Forward hooks that, while ``active``, put a tensor hook on each watched module's output and
    keep its gradient (as float32 numpy). A tensor hook rather than ``register_full_backward_hook``:
    the latter warns when a module's inputs need no gradient (the first layer, the embedding)."""

    def __init__(self, model: nn.Module, names):
        modules = dict(model.named_modules())
        missing = [n for n in names if n not in modules]
        if missing:
            raise ValueError(f"no module named {', '.join(map(repr, missing))} in the model")
        self.names = tuple(names)
        self.active = False
        self.grads: dict = {}
        self.handles = []
        for name in names:
            self.handles.append(modules[name].register_forward_hook(self._forward_hook(name)))

    def _forward_hook(self, name):
        def keep(grad):
            g = grad.detach().float().reshape(-1).cpu().numpy()
            self.grads[name] = np.concatenate([self.grads[name], g]) if name in self.grads else g.copy()

        def hook(module, args, output):
            if self.active and isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(keep)

        return hook

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []


def _census_at(values, fmt, scale) -> CensusResult:
    """``census(values, fmt, scale)``, also at the scale 0 a collapsed scaler reaches: there
    ``gradient × 0`` is 0 for every finite gradient (counted as "zero": everything is lost) and
    NaN for an infinite or NaN one, as torch's multiply-then-cast gives."""
    if scale != 0:
        return census(values, fmt, scale)
    v = np.asarray(values, dtype=np.float32)
    with np.errstate(invalid="ignore"):
        return replace(census(v * np.float32(0.0), fmt, 1.0), scale=0.0)
