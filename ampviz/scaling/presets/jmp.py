"""jmp's preset (JAX): ``JmpScaler``, its ``DynamicLossScale``."""

from __future__ import annotations

import math

from ampviz.scaling.presets.arguments import _real, _steps_count
from ampviz.scaling.scaler import DynamicScaler, _f32


def JmpScaler(init_scale=2.0**15, growth_interval=2000, growth_factor=2, min_scale=1.0) -> DynamicScaler:
    """jmp's ``DynamicLossScale`` (JAX).

    Source: ``google-deepmind/jmp@9c1cdbbf: jmp/_src/loss_scale.py`` (``DynamicLossScale.adjust``).
    Rule: a finite step multiplies the scale by ``factor`` when ``counter == period - 1`` (keeping
    the old scale if the product is not finite), then ``counter = (counter + 1) % period``; a
    non-finite step sets ``scale = max(min_loss_scale, scale / factor)`` and ``counter = 0``. jmp's
    names: ``loss_scale`` (no default; its docs use ``jnp.asarray(2. ** 15)``, a float32),
    ``period`` (growth_interval), ``factor``, ``min_loss_scale`` (a float32). ``factor`` must be a
    power of two here: then ``scale / factor`` in float32 equals the multiplication by
    ``1 / factor`` that the simulation does.
    """
    init_scale = _real("init_scale", init_scale, "jmp's loss_scale, such as 2**15")
    growth_interval = _steps_count("growth_interval", growth_interval, "jmp's period, such as 2000")
    growth_factor = _real("growth_factor", growth_factor, "jmp's factor, a power of two such as 2")
    min_scale = _real("min_scale", min_scale, "jmp's min_loss_scale, such as 1.0")
    if not (growth_factor > 1 and math.isfinite(growth_factor) and math.frexp(growth_factor)[0] == 0.5):
        raise ValueError(f"growth_factor (jmp's factor) must be a power of two above 1, not {growth_factor!r}")
    return DynamicScaler(
        name="jmp", init_scale=init_scale, growth_factor=float(growth_factor),
        backoff_factor=1.0 / growth_factor, growth_interval=growth_interval, min_scale=_f32(min_scale),
        inf_guard=True, arithmetic="float32",
        source="google-deepmind/jmp@9c1cdbbf: jmp/_src/loss_scale.py (DynamicLossScale.adjust)",
    )
