"""Keras's presets (TensorFlow): ``KerasScaler`` (tf.keras, Keras 2) and ``Keras3Scaler``
(Keras 3), each its ``LossScaleOptimizer``."""

from __future__ import annotations

from ampviz.scaling.presets.arguments import _real, _steps_count
from ampviz.scaling.scaler import DynamicScaler


def KerasScaler(init_scale=2.0**15, growth_interval=2000) -> DynamicScaler:
    """tf.keras (Keras 2) ``LossScaleOptimizer``'s ``_DynamicLossScaleState``.

    Source: ``keras-team/keras@363ac472: keras/mixed_precision/loss_scale_optimizer.py``. Rule: a
    non-finite step sets ``counter = 0`` and ``scale = max(scale / 2, 1)``; a finite step doubles
    the scale when ``counter + 1 >= growth_steps`` (only if the result is finite) and resets the
    counter, else counts. The scale is a float32 variable. Keras's names: ``initial_scale``,
    ``dynamic_growth_steps`` (growth_interval); the multiplier is 2.
    """
    init_scale = _real("init_scale", init_scale, "Keras's initial_scale, such as 2**15")
    growth_interval = _steps_count("growth_interval", growth_interval, "Keras's dynamic_growth_steps, such as 2000")
    return DynamicScaler(
        name="Keras 2", init_scale=init_scale, growth_interval=growth_interval, min_scale=1.0,
        growth_at_least=True, inf_guard=True, arithmetic="float32",
        source="keras-team/keras@363ac472: keras/mixed_precision/loss_scale_optimizer.py (_DynamicLossScaleState)",
    )


def Keras3Scaler(init_scale=2.0**15, growth_interval=2000) -> DynamicScaler:
    """Keras 3 ``LossScaleOptimizer``.

    Source: ``keras-team/keras@054e2952: keras/src/optimizers/loss_scale_optimizer.py``. Rule: a
    non-finite step sets ``step_counter = 0`` and halves the scale, with no floor; a finite step
    doubles it when ``step_counter == dynamic_growth_steps - 1`` (no inf guard) and resets the
    counter, else counts. The scale is a float32 variable.
    """
    init_scale = _real("init_scale", init_scale, "Keras's initial_scale, such as 2**15")
    growth_interval = _steps_count("growth_interval", growth_interval, "Keras's dynamic_growth_steps, such as 2000")
    return DynamicScaler(
        name="Keras 3", init_scale=init_scale, growth_interval=growth_interval, inf_guard=False,
        arithmetic="float32",
        source="keras-team/keras@054e2952: keras/src/optimizers/loss_scale_optimizer.py",
    )
