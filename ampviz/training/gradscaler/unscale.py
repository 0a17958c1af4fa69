"""What ``unscale_`` does to the gradients, measured on the real GradScaler.

* ``unscale_overflow_table``: the inf check runs *before* the division by the scale, so a finite
  scaled gradient can still overflow when a scale below 1 divides it.
* ``clipping_norms``, ``clipping_table``: gradient clipping after ``unscale_`` (right) and before
  it (wrong: ``step`` unscales the already clipped gradients afterwards).
"""

from __future__ import annotations

import torch

from ampviz.text import Table, measured, number
from ampviz._args import _flag, _real
from ampviz.training.gradscaler.tiny import (DEFAULTS, _backward_scaled, _found_inf, _scale_value, _scaler,
                                             _values, _vec, build_tiny)


# --------------------------------------------------------------------------------------------
# The inf check comes before the division
# --------------------------------------------------------------------------------------------


def unscale_overflow_table(scale: float = 2.0**-10, grad=(1e36, 1.0), weights=(3.0, -4.0),
                           lr: float = 0.1) -> Table:
    """A finite scaled gradient that overflows only when ``unscale_`` divides it by a scale below 1.

    ``unscale_`` checks the *scaled* gradients for inf/NaN and then multiplies them by 1/S; with
    S < 1 that product can overflow after the check, and the step runs on an inf gradient.
    """
    scale = _scale_value("scale", scale)
    tiny = build_tiny(weights, lr)
    grad = _values("grad", grad, torch.float32)
    if grad.shape != tiny.weight.shape:
        raise ValueError(f"grad must have the shape of weights, {tuple(tiny.weight.shape)}, not {tuple(grad.shape)}")
    scaler = _scaler(init_scale=scale)
    scaler.scale(tiny.loss())
    tiny.weight.grad = grad
    rows = [("scale S", number(scaler.get_scale())),
            ("w.grad after backward (what unscale_ checks)", _vec(tiny.weight.grad))]
    scaler.unscale_(tiny.optimizer)
    rows += [("found_inf recorded by unscale_", number(_found_inf(scaler, tiny.optimizer)["cpu"])),
             ("w.grad after unscale_ (× 1/S)", _vec(tiny.weight.grad))]
    before = tiny.steps_taken
    scaler.step(tiny.optimizer)
    rows += [("optimizer.step()", "ran" if tiny.steps_taken > before else "skipped"),
             ("w after the step", _vec(tiny.weight))]
    scaler.update()
    return Table(("", "value"), rows)


# --------------------------------------------------------------------------------------------
# Gradient clipping
# --------------------------------------------------------------------------------------------


def clipping_norms(unscale_first: bool = True, max_norm: float = 1.0, weights=(3.0, -4.0),
                   lr: float = 0.1, init_scale: float = 2.0**16) -> dict:
    """Gradient norms through one iteration with ``clip_grad_norm_(max_norm)``, clipping after
    ``scaler.unscale_`` (``unscale_first=True``, right) or before it (wrong: ``step`` unscales the
    already clipped gradients afterwards).

    Keys: ``backward`` (‖w.grad‖ after the scaled backward), ``clipped`` (the norm
    ``clip_grad_norm_`` saw), ``applied`` (‖w.grad‖ the optimizer used), ``weight`` (after the step).
    """
    unscale_first = _flag("unscale_first", unscale_first)
    max_norm = _real("max_norm", max_norm)
    scaler = _scaler(init_scale=init_scale)
    tiny = build_tiny(weights, lr)
    _backward_scaled(tiny, scaler)
    norm = lambda: float(tiny.weight.grad.norm())  # noqa: E731
    out = {"backward": norm()}
    if unscale_first:
        scaler.unscale_(tiny.optimizer)
    out["clipped"] = float(torch.nn.utils.clip_grad_norm_([tiny.weight], max_norm))
    scaler.step(tiny.optimizer)  # unscales here if unscale_ was not called
    out["applied"] = norm()
    out["weight"] = tiny.weight.detach().double().numpy().copy()
    scaler.update()
    return out


def clipping_table(max_norm: float = 1.0, **kwargs) -> Table:
    """``clipping_norms`` in both orders, one row each, at the digits every CPU reproduces (the
    optimizer's last bits depend on the CPU): the norms before clipping at 6 significant digits,
    the applied norm and the weights at 4, an applied norm within them of a power of two as that power."""
    max_norm = _real("max_norm", max_norm)
    rows = []
    for first, order in ((True, "unscale_ → clip → step (right)"), (False, "clip → step (wrong)")):
        r = clipping_norms(first, max_norm, **kwargs)
        rows.append((order, measured(r["backward"], 6), measured(r["clipped"], 6), measured(r["applied"], pow2=True),
                     "[" + ", ".join(measured(w) for w in r["weight"]) + "]"))
    return Table(("order", "‖grad‖ after backward", "‖grad‖ clip_grad_norm_ saw",
                  "‖grad‖ the optimizer applied", "w after step"), rows,
                 title=f"clip_grad_norm_(max_norm={number(max_norm)}) at scale "
                       f"{number(kwargs.get('init_scale', DEFAULTS['init_scale']))}")
