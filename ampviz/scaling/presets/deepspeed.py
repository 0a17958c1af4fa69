"""DeepSpeed's presets: ``DeepSpeedZeroScaler`` (ZeRO stages 1-3, with the rule of releases before
0.17.1 on request) and ``DeepSpeedScaler`` (the fp16 optimizers without ZeRO)."""

from __future__ import annotations

import math
import re

from ampviz._args import _shown
from ampviz.scaling.presets.arguments import _flag, _real, _steps_count
from ampviz.scaling.scaler import DynamicScaler


def DeepSpeedZeroScaler(init_scale=None, growth_interval=1000, hysteresis=None, min_scale=1.0,
                        consecutive_hysteresis=False, raise_at_min=True, *, version=None,
                        config_defaults=True) -> DynamicScaler:
    """DeepSpeed's ``DynamicLossScaler`` as ZeRO stages 1-3 build it for fp16.

    Source: ``deepspeedai/DeepSpeed@cf443004`` (v0.19.5; this rule is unchanged since v0.17.1):
    ``deepspeed/runtime/fp16/loss_scaler.py`` (``DynamicLossScaler.update_scale``,
    ``CreateLossScaler``) and ``deepspeed/runtime/precision_config.py``
    (``DeepSpeedFP16Config.dynamic_loss_scale_args``). Rule: an overflow while hysteresis is left
    only uses one up (skip, scale kept); otherwise it halves the scale, not below
    ``min_loss_scale``, and if the scale already equals the minimum it raises ``Exception("Current
    loss scale already at minimum - cannot decrease scale anymore. Exiting run.")``, which ends the
    run (``ScalerState.stopped``). Growth: x2 on a clean step when ``stable_interval = iteration -
    last_overflow - 1`` is positive and a multiple of the window: the window-th clean step after a
    growth, the (window+1)-th after an overflow or at the start (the growth tracker starts, and
    restarts after an overflow, at -1, as in ``DeepSpeedScaler``). Growth refills the hysteresis
    (every clean step does, with ``consecutive_hysteresis``). No inf guard: the scale is a Python
    float that can grow to inf, and the next overflow then ends the run with ``OverflowError:
    cannot convert float infinity to integer`` (rank 0's overflow message formats ``int(scale)``),
    hysteresis or not.

    Defaults: the ``fp16`` config's (``initial_scale_power`` 16, ``loss_scale_window`` 1000,
    ``hysteresis`` 2, ``min_loss_scale`` 1, ``consecutive_hysteresis`` false), which DeepSpeed
    passes whatever the ``fp16`` block names. Given arguments override them. ``init_scale`` and
    ``min_scale`` must be above 0 (DeepSpeed checks ``min_loss_scale > 0`` since 0.19.3).

    ``version``: the DeepSpeed release to follow, such as ``"0.17.0"`` (0.9.3 or later); None, the
    default, follows the current one. Releases before 0.17.1 (``deepspeedai/DeepSpeed@720787e7``,
    v0.17.0) grow one step earlier, when ``(iteration - last_overflow) % window == 0`` (the
    window-th clean step after an overflow, a growth or the start), and pass the config's values
    only when the ``fp16`` block names one of ``initial_scale_power``, ``loss_scale_window``,
    ``min_loss_scale``, ``hysteresis`` or ``consecutive_hysteresis``; with just ``{"enabled":
    true}`` they use the class defaults instead (``init_scale=2**32``, ``delayed_shift=1``):
    ``config_defaults=False``, which only those releases accept. DeepSpeed PR #6976 (commit
    ``e440506b``, released in 0.17.1) changed both.
    """
    before = _deepspeed_before_0_17_1(version)
    config_defaults = _flag("config_defaults", config_defaults, "True: the fp16 config's defaults")
    if not config_defaults and not before:
        raise ValueError("config_defaults=False (the class defaults 2**32 and hysteresis 1) exists only in "
                         "DeepSpeed before 0.17.1: pass version='0.17.0' with it, or leave config_defaults=True")
    if init_scale is None:
        init_scale = 2.0**16 if config_defaults else 2.0**32
    if hysteresis is None:
        hysteresis = 2 if config_defaults else 1
    init_scale = _real("init_scale", init_scale, "2 ** initial_scale_power, or None for the default")
    growth_interval = _steps_count("growth_interval", growth_interval, "DeepSpeed's loss_scale_window, such as 1000")
    hysteresis = _steps_count("hysteresis", hysteresis, "DeepSpeed's hysteresis, such as 2, or None for the default")
    init_scale, min_scale = _deepspeed_scales(init_scale, min_scale)
    consecutive_hysteresis = _flag("consecutive_hysteresis", consecutive_hysteresis, "DeepSpeed's setting")
    raise_at_min = _flag("raise_at_min", raise_at_min, "True: DeepSpeed's raise_error_at_min_scale")
    if before:
        name = "DeepSpeed ZeRO < 0.17.1" + ("" if config_defaults else " (class defaults)")
        source = ("deepspeedai/DeepSpeed@720787e7: deepspeed/runtime/fp16/loss_scaler.py (DynamicLossScaler, "
                  "CreateLossScaler), runtime/config.py (get_dynamic_loss_scale_args), runtime/constants.py")
    else:
        name = "DeepSpeed ZeRO"
        source = ("deepspeedai/DeepSpeed@cf443004: deepspeed/runtime/fp16/loss_scaler.py (DynamicLossScaler, "
                  "CreateLossScaler), runtime/precision_config.py (dynamic_loss_scale_args)")
    return DynamicScaler(
        name=name, init_scale=init_scale, growth_interval=growth_interval, hysteresis=hysteresis,
        refill="clean" if consecutive_hysteresis else "growth", min_scale=min_scale, raise_at_min=raise_at_min,
        raise_at_inf=True, tracker_after_overflow=0 if before else -1, inf_guard=False, arithmetic="float64",
        source=source,
    )


def _deepspeed_before_0_17_1(version) -> bool:
    """Whether ``version`` (a DeepSpeed release such as "0.17.0", or None: the current one) comes
    before 0.17.1, which changed ZeRO's growth step and its defaults."""
    what = "a DeepSpeed release such as '0.17.0' or '0.19.5', or None for the current one"
    if version is None:
        return False
    if not isinstance(version, str):
        raise TypeError(f"version must be {what}, not {_shown(version)}")
    match = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)", version.strip())
    if match is None:
        raise ValueError(f"version must be {what}, not {_shown(version)}")
    release = tuple(int(x) for x in match.groups())
    if release < (0, 9, 3):
        raise ValueError(f"version must be 0.9.3 or later (the rule modelled here, consecutive_hysteresis "
                         f"included, dates from 0.9.3), not {_shown(version)}")
    return release < (0, 17, 1)


def _deepspeed_scales(init_scale: float, min_scale) -> tuple:
    """DeepSpeed's starting scale and minimum, both above 0: DeepSpeed divides by the scale (a
    scale of 0 would end the run in its optimizer step), and rejects ``min_loss_scale <= 0``."""
    min_scale = _real("min_scale", min_scale, "DeepSpeed's min_loss_scale, such as 1")
    if not 0 < min_scale < math.inf:
        raise ValueError(f"min_scale must be a finite number above 0 (DeepSpeed's min_loss_scale, such as 1), "
                         f"not {min_scale!r}")
    if not init_scale > 0:
        raise ValueError(f"init_scale must be above 0 (2 ** initial_scale_power, such as 2**16), not {init_scale!r}")
    return init_scale, min_scale


def DeepSpeedScaler(init_scale=2.0**16, growth_interval=1000, min_scale=1.0) -> DynamicScaler:
    """DeepSpeed without ZeRO: ``FP16_Optimizer`` / ``FP16_UnfusedOptimizer``'s own ``_update_scale``.

    Source: ``deepspeedai/DeepSpeed@cf443004`` (v0.19.5):
    ``deepspeed/runtime/fp16/fused_optimizer.py`` (``FP16_Optimizer._update_scale``) and
    ``unfused_optimizer.py`` (``FP16_UnfusedOptimizer._update_scale``); DeepSpeed PR #6976
    (0.17.1) left this rule as it was. Rule: an overflow halves the scale, not below
    ``min_loss_scale``; a clean step doubles it when ``stable = iteration - last_overflow - 1`` is
    positive and a multiple of the window. That is the window-th clean step after a growth but the
    (window+1)-th after an overflow or at the start: the growth tracker starts, and restarts after
    an overflow, at -1. There is no hysteresis (the config's ``hysteresis`` is ignored), no raise
    (the overflow messages print the scale with ``{}``, inf included), no inf guard. The scale is
    a Python number, ``2**initial_scale_power`` times ``scale_factor``: 2.0 since DeepSpeed 0.19.0,
    so it is a float after the first growth and reaches inf beyond float64's range, as here; the
    fused optimizer's int 2 before 0.19.0 kept it an exact int until the first backoff, which
    float64 follows exactly below 2**1024. Defaults: ``initial_scale_power`` 16, window 1000, min
    1; ``init_scale`` and ``min_scale`` must be above 0, as for ``DeepSpeedZeroScaler``.
    """
    init_scale = _real("init_scale", init_scale, "2 ** initial_scale_power, such as 2**16")
    growth_interval = _steps_count("growth_interval", growth_interval, "DeepSpeed's loss_scale_window, such as 1000")
    init_scale, min_scale = _deepspeed_scales(init_scale, min_scale)
    return DynamicScaler(
        name="DeepSpeed", init_scale=init_scale, growth_interval=growth_interval, min_scale=min_scale,
        tracker_after_overflow=-1, inf_guard=False, arithmetic="float64",
        source="deepspeedai/DeepSpeed@cf443004: deepspeed/runtime/fp16/fused_optimizer.py "
               "(FP16_Optimizer._update_scale), unfused_optimizer.py (FP16_UnfusedOptimizer._update_scale)",
    )
