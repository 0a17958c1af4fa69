"""fairseq's preset and its descendant's: ``FairseqScaler`` (fairseq's ``DynamicLossScaler`` as
its ``FP16Optimizer`` builds it) and ``MetaseqScaler`` (metaseq's, OPT's, with a growth window that
follows the scale)."""

from __future__ import annotations

from ampviz.scaling.presets.arguments import _flag, _real, _steps_count, _tolerance
from ampviz.scaling.scaler import DynamicScaler


def FairseqScaler(init_scale=None, growth_interval=None, tolerance=0.0, min_scale=None, raise_at_scale=1e-4,
                  *, cli_defaults=True, world_size=1, update_freq=1) -> DynamicScaler:
    """fairseq's ``DynamicLossScaler`` as its ``FP16Optimizer`` builds it.

    Source: ``facebookresearch/fairseq@0d77035e: fairseq/optim/dynamic_loss_scaler.py``, with
    ``fairseq/optim/fp16_optimizer.py`` and ``fairseq/dataclass/configs.py``. Rule: on an overflow
    (an inf or NaN gradient norm), if overflows since the last backoff / steps since the last
    rescale >= ``tolerance`` the scale is halved (not below ``threshold_loss_scale``), else it is
    kept; either way the step is skipped, and if the scale would then be at or below
    ``min_loss_scale`` it is kept and ``FloatingPointError("Minimum loss scale reached ...")`` ends
    the run. A clean step doubles it when ``(iteration - last_overflow) % window == 0``. No inf
    guard; the scale is a Python float. The trainer computes ``1.0 / loss_scale`` before every step
    (``zero_grad``), so a starting scale of 0 ends the run at once with ``ZeroDivisionError``
    (``raise_at_zero``); a scale that halves to 0 would end it the same way at that overflow (the
    trainer calls ``zero_grad`` after it), which only a negative ``--min-loss-scale`` allows, so
    ``raise_at_scale`` below 0 needs a floor ``min_scale`` above 0.

    fairseq's names: ``--fp16-init-scale``, ``--fp16-scale-window`` (growth_interval),
    ``--fp16-scale-tolerance``, ``--threshold-loss-scale`` (min_scale, a floor),
    ``--min-loss-scale`` (raise_at_scale). ``cli_defaults=True``: the command line's 2**7 and a
    window of ``int(2**14 / world_size / update_freq)``; False: the class's 2**15 and 2000.
    """
    cli_defaults = _flag("cli_defaults", cli_defaults, "True: the command line's defaults")
    world_size = _steps_count("world_size", world_size, "the number of data-parallel workers, such as 1")
    update_freq = _steps_count("update_freq", update_freq, "fairseq's --update-freq, such as 1")
    if init_scale is None:
        init_scale = 2.0**7 if cli_defaults else 2.0**15
    if growth_interval is None:
        # fairseq's int(2**14 / world_size / update_freq), the same in whole numbers (any size)
        growth_interval = 2**14 // (world_size * update_freq) if cli_defaults else 2000
        if growth_interval < 1:
            raise ValueError(f"world_size * update_freq must be at most 16384: fairseq's window "
                             f"2**14 / world_size / update_freq would be 0 (pass growth_interval)")
    init_scale = _real("init_scale", init_scale, "fairseq's --fp16-init-scale, or None for the default")
    growth_interval = _steps_count("growth_interval", growth_interval,
                                   "fairseq's --fp16-scale-window, or None for the default")
    tolerance = _tolerance(tolerance, "fairseq's --fp16-scale-tolerance, such as 0.0")
    if min_scale is not None:
        min_scale = _real("min_scale", min_scale, "fairseq's --threshold-loss-scale, or None for no floor")
    raise_at_scale = _real("raise_at_scale", raise_at_scale, "fairseq's --min-loss-scale, such as 1e-4")
    if not raise_at_scale >= 0 and not (min_scale is not None and min_scale > 0):
        raise ValueError(f"raise_at_scale (fairseq's --min-loss-scale) must be at least 0 unless min_scale "
                         f"(--threshold-loss-scale) is above 0, not {raise_at_scale!r}: the scale would halve to 0")
    return DynamicScaler(
        name="fairseq" if cli_defaults else "fairseq (class defaults)", init_scale=init_scale,
        growth_interval=growth_interval, tolerance=tolerance, min_scale=min_scale,
        raise_at_scale=raise_at_scale, raise_at_zero=True, inf_guard=False, arithmetic="float64",
        source="facebookresearch/fairseq@0d77035e: fairseq/optim/dynamic_loss_scaler.py, "
               "fairseq/optim/fp16_optimizer.py, fairseq/dataclass/configs.py, fairseq/trainer.py",
    )


def MetaseqScaler(init_scale=4.0, growth_interval=256, tolerance=0.0, min_scale=None,
                  no_backoff_below=2.0**-5) -> DynamicScaler:
    """metaseq's (OPT's) ``DynamicLossScaler``: fairseq's, with a window that follows the scale.

    Source: ``facebookresearch/metaseq@0ba5657a: metaseq/optim/dynamic_loss_scaler.py`` (rationale in
    metaseq PR #115). Rule: fairseq's tolerance and growth test ``(iteration - last_overflow) % window
    == 0``, but every growth doubles the window and every backoff halves it (rounded down, at least
    1), and at the minimum there is no exception: a backoff that would take the scale below
    ``min_loss_scale`` keeps the old scale and it "just continue[s] to skip grad". No inf guard; the
    scale is a Python float. Defaults are the class's: init 4, window 256, min 2**-5. metaseq's
    names: ``scale_window`` (growth_interval), ``threshold`` (min_scale, a floor),
    ``min_loss_scale`` (no_backoff_below). As in fairseq, the trainer computes ``1.0 /
    loss_scale`` before every step and after every overflow: a starting scale of 0 ends the run
    with ``ZeroDivisionError`` (``raise_at_zero``), and ``no_backoff_below`` must be above 0 unless
    ``min_scale`` is (otherwise the scale could halve to 0).
    """
    init_scale = _real("init_scale", init_scale, "metaseq's init_scale, such as 4.0")
    growth_interval = _steps_count("growth_interval", growth_interval, "metaseq's scale_window, such as 256")
    tolerance = _tolerance(tolerance, "metaseq's tolerance, such as 0.0")
    if min_scale is not None:
        min_scale = _real("min_scale", min_scale, "metaseq's threshold, or None for no floor")
    no_backoff_below = _real("no_backoff_below", no_backoff_below, "metaseq's min_loss_scale, such as 2**-5")
    if not no_backoff_below > 0 and not (min_scale is not None and min_scale > 0):
        raise ValueError(f"no_backoff_below (metaseq's min_loss_scale) must be above 0 unless min_scale (its "
                         f"threshold) is, not {no_backoff_below!r}: the scale would halve to 0")
    return DynamicScaler(
        name="metaseq", init_scale=init_scale, growth_interval=growth_interval, tolerance=tolerance,
        min_scale=min_scale, no_backoff_below=no_backoff_below, window_scaling=True, raise_at_zero=True,
        inf_guard=False, arithmetic="float64",
        source="facebookresearch/metaseq@0ba5657a: metaseq/optim/dynamic_loss_scaler.py, metaseq/trainer.py",
    )
