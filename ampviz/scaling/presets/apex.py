"""NVIDIA apex's presets: ``ApexAmpScaler`` (the legacy ``amp`` ``LossScaler``) and
``ApexHysteresisScaler`` (NeMo's ``GradScaler``, torch's rule with apex's hysteresis kernel)."""

from __future__ import annotations

from ampviz.scaling.presets.arguments import _real, _steps_count
from ampviz.scaling.scaler import DynamicScaler


def ApexAmpScaler(init_scale=2.0**16, growth_interval=2000, min_scale=None, max_scale=2.0**24) -> DynamicScaler:
    """Apex's legacy ``amp`` ``LossScaler`` (``amp.initialize`` with opt_level O1 or O2).

    Source: ``NVIDIA/apex: apex/amp/scaler.py`` at ``cb65b8ed^`` (``amp`` was removed in
    ``cb65b8ed``). Rule: an overflow halves the scale (not below ``min_loss_scale`` when one is set)
    and resets the count of unskipped steps; the ``scale_window``-th unskipped step in a row doubles
    it, capped at ``max_loss_scale``. The factors are hard-coded (``scale_factor`` is stored but
    unused), the scale is a Python float, and it starts at ``min(max_loss_scale, init_scale)``.
    Without a floor, 1,091 backoffs in a row take 2**16 to exactly 0.0, and the next step ends the
    run: ``amp.scale_loss`` unscales the gradients by ``1./scale`` before it checks them
    (``LossScaler.unscale``), so that step raises ``ZeroDivisionError: float division by zero``
    whether it overflows or not (``raise_at_zero``). An infinite scale (``max_loss_scale=math.inf``)
    ends nothing: ``1./inf`` is 0. Apex's names: ``init_scale``, ``scale_window``
    (growth_interval), ``min_loss_scale`` (None or 0: no floor), ``max_loss_scale`` (``math.inf``:
    no cap).
    """
    init_scale = _real("init_scale", init_scale, "apex's init_scale, such as 2**16")
    growth_interval = _steps_count("growth_interval", growth_interval, "apex's scale_window, such as 2000")
    if min_scale is not None:
        min_scale = _real("min_scale", min_scale, "apex's min_loss_scale, or None for no floor")
    max_scale = _real("max_scale", max_scale, "apex's max_loss_scale, such as 2**24, or math.inf for no cap")
    return DynamicScaler(
        name="apex amp", init_scale=min(max_scale, init_scale), growth_interval=growth_interval,
        min_scale=min_scale or None, max_scale=max_scale, inf_guard=False, raise_at_zero=True, arithmetic="float64",
        source="NVIDIA/apex@cb65b8ed^: apex/amp/scaler.py (LossScaler.update_scale, unscale), apex/amp/handle.py "
               "(scale_loss), apex/amp/frontend.py",
    )


def ApexHysteresisScaler(init_scale=2.0**32, growth_factor=2.0, backoff_factor=0.5, growth_interval=1000,
                         hysteresis=2) -> DynamicScaler:
    """NeMo's ``GradScaler``: torch's rule with apex's fused hysteresis kernel.

    Source: ``NVIDIA/apex@6424da3b: csrc/update_scale_hysteresis.cu``, called as
    ``amp_C.update_scale_hysteresis`` by NeMo's ``GradScaler`` in
    ``nemo/collections/nlp/parts/nlp_overrides.py``. Rule: an overflow uses up one unit of
    hysteresis and, while some is left, is skipped with the scale kept; otherwise the scale backs
    off as torch's does. A clean step follows torch's growth rule (inf guard included) and refills
    the hysteresis, so only ``hysteresis`` overflows *in a row* back off. Defaults are those NeMo's
    ``MegatronTrainerBuilder._grad_scaler`` passes (``nemo/collections/nlp/parts/megatron_trainer_builder.py``:
    ``native_amp_init_scale`` 2**32, ``native_amp_growth_interval`` 1000, ``hysteresis`` 2); the
    class itself defaults to ``hysteresis=1``, which is torch's rule.
    """
    return DynamicScaler(
        name="NeMo (apex hysteresis)", init_scale=init_scale, growth_factor=growth_factor,
        backoff_factor=backoff_factor, growth_interval=growth_interval, hysteresis=hysteresis,
        refill="clean", inf_guard=True, arithmetic="torch",
        source="NVIDIA/apex@6424da3b: csrc/update_scale_hysteresis.cu; NVIDIA/NeMo: "
               "nemo/collections/nlp/parts/nlp_overrides.py (GradScaler), megatron_trainer_builder.py (defaults)",
    )
