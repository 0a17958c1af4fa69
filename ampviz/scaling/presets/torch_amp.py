"""torch's preset: ``TorchGradScaler`` (``torch.amp.GradScaler``'s update rule, bit for bit), and
``StaticScaler``, a scale that never changes."""

from __future__ import annotations

from ampviz.scaling.presets.arguments import _real
from ampviz.scaling.scaler import DynamicScaler


def TorchGradScaler(init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
                    growth_interval=2000) -> DynamicScaler:
    """``torch.amp.GradScaler``'s update rule (torch 2.13), bit for bit.

    Source: ``torch/amp/grad_scaler.py`` and the CPU kernel
    ``aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp`` (``_amp_update_scale_``; the CUDA kernel
    does the same arithmetic). Like torch, it rejects growth_factor <= 1 and backoff_factor >= 1
    and accepts everything else, odd values included.
    """
    return DynamicScaler(
        name="torch", init_scale=init_scale, growth_factor=growth_factor,
        backoff_factor=backoff_factor, growth_interval=growth_interval, arithmetic="torch",
        source="pytorch/pytorch: torch/amp/grad_scaler.py, aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp",
    )


def StaticScaler(scale=2.0**10) -> DynamicScaler:
    """A static loss scale: never changes (an overflowing step is still reported as skipped)."""
    scale = _real("scale", scale, "the fixed loss scale, such as 1024.0")
    return DynamicScaler(name=f"static {scale:g}", init_scale=scale, dynamic=False, growth_interval=0,
                         arithmetic="float64", source="a fixed scale, e.g. Apex loss_scale=128")
