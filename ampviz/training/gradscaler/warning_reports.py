"""The warnings around GradScaler, each captured (nothing reaches stderr).

* ``constructor_warnings``: the deprecation warning of ``torch.cuda.amp.GradScaler``, and the
  scaler that disables itself without CUDA.
* ``scheduler_report``: the ``lr_scheduler.step()`` order warning after a skipped first step, and
  the guard that avoids it.
* ``_capture``: a call's result and the warnings it issued, as ``Caught``s.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ampviz.text import Table, number
from ampviz._args import _shown
from ampviz._args import _flag, _real, _whole
from ampviz.training.gradscaler.tiny import INF, _FLT_MAX, _scaler, build_tiny

#: The longest ``scheduler_report``.
MAX_ITERATIONS = 10_000


# --------------------------------------------------------------------------------------------
# Warnings
# --------------------------------------------------------------------------------------------


class Caught(NamedTuple):
    """A captured warning: category name and message."""

    category: str
    message: str

    def __str__(self) -> str:
        return f"{self.category}: {self.message}"


def _capture(fn):
    """(fn's result, the warnings it issued as ``Caught``s); nothing reaches stderr."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, tuple(Caught(w.category.__name__, str(w.message)) for w in caught)


class ConstructorReport(NamedTuple):
    """A way of constructing a GradScaler, the warnings it gave, and what the scaler then does."""

    call: str
    warnings: tuple
    enabled: bool
    scale_is_identity: bool
    get_scale: float

    def __str__(self) -> str:
        head = (f"{self.call}: is_enabled() = {self.enabled}, scale(loss) is loss: "
                f"{self.scale_is_identity}, get_scale() = {number(self.get_scale)}")
        return "\n".join([head] + [f"    {w}" for w in self.warnings] + ([] if self.warnings else ["    (no warning)"]))


_CONSTRUCTORS = (
    ("torch.cuda.amp.GradScaler()", lambda: torch.cuda.amp.GradScaler()),
    ("torch.cpu.amp.GradScaler()", lambda: torch.cpu.amp.GradScaler()),
    ("torch.amp.GradScaler()", lambda: torch.amp.GradScaler()),
    ('torch.amp.GradScaler("cpu")', lambda: torch.amp.GradScaler("cpu")),
)


def constructor_warnings() -> list[ConstructorReport]:
    """Four ways to construct a scaler, with their captured warnings.

    The deprecated ``torch.cuda.amp.GradScaler`` / ``torch.cpu.amp.GradScaler`` warn and then
    build ``torch.amp.GradScaler("cuda")`` / ``("cpu")``. The default device of
    ``torch.amp.GradScaler()`` is ``"cuda"``: without CUDA it warns and disables itself, and a
    disabled scaler returns the loss unscaled and reports a scale of 1.0.
    """
    out = []
    for call, make in _CONSTRUCTORS:
        scaler, caught = _capture(make)
        loss = torch.ones(())
        out.append(ConstructorReport(call, caught, scaler.is_enabled(), scaler.scale(loss) is loss,
                                     float(scaler.get_scale())))
    return out


@dataclass(frozen=True, eq=False)
class SchedulerReport:
    """A few iterations with a half-precision loss, a GradScaler and ``StepLR``.

    ``table``: per iteration, the scale, whether ``optimizer.step()`` ran, the learning rate the
    step would use, and whether ``scheduler.step()`` was called; ``warnings``: what was captured.
    """

    table: Table
    warnings: tuple

    def __str__(self) -> str:
        caught = [f"{w}" for w in self.warnings] or ["(no warning)"]
        return str(self.table) + "\n\nwarnings:\n" + "\n".join(caught)

    __repr__ = __str__


def scheduler_report(*, guard: bool = False, iterations: int = 5, gamma: float = 0.5) -> SchedulerReport:
    """Train ``Tiny`` for a few iterations with a float16 loss, the default scale (2^16) and
    ``StepLR(step_size=1, gamma)``, calling ``scheduler.step()`` after every ``update()``; with
    ``guard=True`` only after an iteration whose scale did not shrink (the optimizer stepped).

    At 2^16 the half-precision loss's backward overflows (the upstream gradient fp16(65536) is
    inf), so the first optimizer steps are skipped: the first ``scheduler.step()`` then comes
    before any ``optimizer.step()``, and torch warns.
    """
    guard = _flag("guard", guard)
    iterations = _whole("iterations", iterations, 0, MAX_ITERATIONS)
    gamma = _real("gamma", gamma)
    # SGD's step multiplies by the learning rate in float32: the last one, 0.1 × gamma^(iterations - 1), must fit
    if not 0 <= gamma < INF or (gamma > 1 and (iterations - 1) * math.log(gamma) > math.log(_FLT_MAX / 0.1)):
        raise ValueError(f"gamma must be a number >= 0 that keeps the learning rate 0.1 × gamma^(iterations - 1) "
                         f"within float32's range, not {_shown(gamma)}")

    def train():
        tiny = build_tiny()
        scaler = _scaler()
        sched = torch.optim.lr_scheduler.StepLR(tiny.optimizer, step_size=1, gamma=gamma)
        rows = []
        for i in range(iterations):
            tiny.optimizer.zero_grad()
            lr = tiny.optimizer.param_groups[0]["lr"]
            scaler.scale(tiny.loss(half=True)).backward()
            before_scale, before_steps = scaler.get_scale(), tiny.steps_taken
            scaler.step(tiny.optimizer)
            scaler.update()
            ran = tiny.steps_taken > before_steps
            call = not guard or scaler.get_scale() >= before_scale
            if call:
                sched.step()
            rows.append((i, number(before_scale), "ran" if ran else "skipped", number(lr),
                         "called" if call else "not called"))
        return Table(("iteration", "scale", "optimizer.step()", "lr of this step", "scheduler.step()"), rows)

    table, caught = _capture(train)
    return SchedulerReport(table, caught)
