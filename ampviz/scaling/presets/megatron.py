"""Megatron-LM's preset: ``MegatronScaler`` (its ``DynamicGradScaler`` with the optimizer
factory's settings)."""

from __future__ import annotations

from ampviz.scaling.presets.arguments import _real, _steps_count
from ampviz.scaling.scaler import DynamicScaler, _f32


def MegatronScaler(init_scale=2.0**32, min_scale=1.0, growth_interval=1000, hysteresis=2) -> DynamicScaler:
    """Megatron-LM's ``DynamicGradScaler`` with the optimizer factory's settings.

    Source: ``NVIDIA/Megatron-LM@00caa53a: megatron/core/optimizer/grad_scaler.py``; defaults from
    ``optimizer_config.py@0075637c`` (``--initial-loss-scale 2**32 --min-loss-scale 1.0
    --loss-scale-window 1000 --hysteresis 2``; factors 2 and 0.5). Rule: an overflow resets the
    growth tracker and uses up one unit of hysteresis; once none is left it backs off,
    ``max(scale * 0.5, min_scale)``. The ``loss_scale_window``-th clean step in a row doubles the
    scale and refills the hysteresis (only there). No inf guard, no maximum; the scale, factors
    and minimum are float32 tensors. Megatron asserts ``initial_scale > 0``, ``0 < min_scale <=
    initial_scale``, ``growth_interval > 0`` and ``hysteresis > 0``; so does this preset.
    """
    init_scale = _real("init_scale", init_scale, "Megatron's --initial-loss-scale, such as 2**32")
    min_scale = _real("min_scale", min_scale, "Megatron's --min-loss-scale, such as 1.0")
    growth_interval = _steps_count("growth_interval", growth_interval, "Megatron's --loss-scale-window, such as 1000")
    hysteresis = _steps_count("hysteresis", hysteresis, "Megatron's --hysteresis, such as 2")
    if not init_scale > 0:
        raise ValueError(f"init_scale must be > 0 (Megatron asserts initial_scale > 0.0), not {init_scale!r}")
    if not 0 < min_scale <= init_scale:
        raise ValueError(f"min_scale must be > 0 and at most init_scale (Megatron asserts both), not {min_scale!r}")
    return DynamicScaler(
        name="Megatron", init_scale=init_scale, growth_interval=growth_interval, hysteresis=hysteresis,
        refill="growth", min_scale=_f32(min_scale), inf_guard=False, arithmetic="float32",
        source="NVIDIA/Megatron-LM@00caa53a: megatron/core/optimizer/grad_scaler.py (DynamicGradScaler); "
               "megatron/core/optimizer/optimizer_config.py@0075637c",
    )
