"""Every misuse of GradScaler's state machine, really done: ``error_cases`` and the exact message torch raises.

Each ``_case_*`` function makes one mistake (``step`` before ``scale``, ``unscale_`` twice, a
closure, fp16 gradients ...) on a fresh ``Tiny``; ``_CASES`` lists them with a line that says what
was done, and ``error_cases`` runs them all, catching what torch raises as an ``ErrorCase``.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import torch

from ampviz.training.gradscaler.tiny import _backward_scaled, _torch_scaler, build_tiny


# --------------------------------------------------------------------------------------------
# The state machine's errors
# --------------------------------------------------------------------------------------------


class ErrorCase(NamedTuple):
    """What was done, and the exception torch raised (type name and exact message)."""

    case: str
    error: str
    message: str

    def __str__(self) -> str:
        return f"{self.case}\n    {self.error}: {self.message}"


def _case_step_before_scale():
    tiny, scaler = build_tiny(), _torch_scaler()
    tiny.loss().backward()  # loss.backward() where scaler.scale(loss).backward() belongs
    scaler.step(tiny.optimizer)


def _case_unscale_before_scale():
    tiny, scaler = build_tiny(), _torch_scaler()
    tiny.loss().backward()
    scaler.unscale_(tiny.optimizer)


def _case_update_before_scale():
    _torch_scaler().update()


def _case_unscale_twice():
    tiny, scaler = build_tiny(), _torch_scaler()
    _backward_scaled(tiny, scaler)
    scaler.unscale_(tiny.optimizer)
    scaler.unscale_(tiny.optimizer)


def _case_unscale_after_step():
    tiny, scaler = build_tiny(), _torch_scaler()
    _backward_scaled(tiny, scaler)
    scaler.step(tiny.optimizer)
    scaler.unscale_(tiny.optimizer)


def _case_step_twice():
    tiny, scaler = build_tiny(), _torch_scaler()
    _backward_scaled(tiny, scaler)
    scaler.step(tiny.optimizer)
    scaler.step(tiny.optimizer)


def _case_update_without_step():
    tiny, scaler = build_tiny(), _torch_scaler()
    _backward_scaled(tiny, scaler)
    scaler.update()


def _case_update_after_unscale_only():
    tiny, scaler = build_tiny(), _torch_scaler()
    _backward_scaled(tiny, scaler)
    scaler.unscale_(tiny.optimizer)
    before = tiny.weight.detach().clone()
    tracker = int(scaler._get_growth_tracker())
    scaler.update()
    moved = "moved" if not torch.equal(before, tiny.weight) else "did not move"
    return (f"unscale_'s inf check is enough for update(): the weights {moved} (no step), and update() "
            f"counted a clean step (growth tracker {tracker} -> {int(scaler._get_growth_tracker())})")


def _case_step_without_grads():
    tiny, scaler = build_tiny(), _torch_scaler()
    scaler.scale(tiny.loss())  # no backward: every .grad is None
    scaler.step(tiny.optimizer)


def _case_fp16_grads():
    tiny, scaler = build_tiny(dtype=torch.float16), _torch_scaler()
    _backward_scaled(tiny, scaler)
    scaler.unscale_(tiny.optimizer)


def _case_closure():
    tiny, scaler = build_tiny(), _torch_scaler()
    _backward_scaled(tiny, scaler)
    scaler.step(tiny.optimizer, closure=tiny.loss)


def _case_scale_float():
    _torch_scaler().scale(1.0)


def _case_growth_factor():
    _torch_scaler(growth_factor=1.0)


def _case_backoff_factor():
    _torch_scaler(backoff_factor=1.0)


_CASES = (
    ("scaler.step(opt) after loss.backward(), with no scaler.scale() before it", _case_step_before_scale),
    ("scaler.unscale_(opt) with no scaler.scale() before it", _case_unscale_before_scale),
    ("scaler.update() with no scaler.scale() before it", _case_update_before_scale),
    ("scaler.unscale_(opt) twice in one iteration", _case_unscale_twice),
    ("scaler.unscale_(opt) after scaler.step(opt)", _case_unscale_after_step),
    ("scaler.step(opt) twice in one iteration", _case_step_twice),
    ("scaler.update() with neither scaler.unscale_(opt) nor scaler.step(opt) before it", _case_update_without_step),
    ("scaler.update() after scaler.unscale_(opt) alone, no step", _case_update_after_unscale_only),
    ("scaler.step(opt) when every .grad is None (no backward)", _case_step_without_grads),
    ("scaler.unscale_(opt) on fp16 weights and gradients", _case_fp16_grads),
    ("scaler.step(opt, closure=...)", _case_closure),
    ("scaler.scale(1.0), a Python float", _case_scale_float),
    ('GradScaler("cpu", growth_factor=1.0)', _case_growth_factor),
    ('GradScaler("cpu", backoff_factor=1.0)', _case_backoff_factor),
)


def error_cases() -> list[ErrorCase]:
    """Each misuse of the scaler's state machine, really done, with what torch raised.

    A case that does not raise is reported as ``ErrorCase(case, "no error", what happened)``
    (one case is there to show a sequence that works: ``update()`` after ``unscale_`` alone).
    """
    out = []
    for case, run in _CASES:
        try:
            with warnings.catch_warnings(record=True):
                warnings.simplefilter("always")
                result = run()
        except Exception as e:  # noqa: BLE001 - recording any exception is the point
            out.append(ErrorCase(case, type(e).__name__, str(e)))
        else:
            out.append(ErrorCase(case, "no error", result or ""))
    return out
