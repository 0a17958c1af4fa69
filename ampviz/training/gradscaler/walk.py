"""One iteration of the real GradScaler, call by call: ``walk_iteration`` and its ``Walk`` of snapshots.

``walk_iteration`` runs ``scale`` → ``backward`` → ``unscale_`` → ``step`` → ``update`` on a fresh
``Tiny`` and keeps a ``Snapshot`` of the scaler's internal state (scale, growth tracker, stage,
found_inf) and of the weights after each call; ``Walk.table`` shows them, one row per call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from ampviz.text import Table, number
from ampviz._args import _shown
from ampviz._args import _flag
from ampviz.training.gradscaler.tiny import (INF, _found_inf, _scaler, _stage, _tensor_or_none, _vec_np,
                                             build_tiny)


# --------------------------------------------------------------------------------------------
# One iteration, call by call
# --------------------------------------------------------------------------------------------


class Snapshot(NamedTuple):
    """The scaler and the weights right after one call of an iteration.

    ``scale``/``tracker``: the values of ``_scale``/``_growth_tracker`` (None before they exist),
    with their dtypes; ``stage``: the optimizer's stage in the scaler (READY when it has no record);
    ``found_inf``: device type -> flag, as recorded by ``unscale_``; ``grad``/``weight``: float64
    copies; ``note``: what happened.
    """

    key: str
    call: str
    scale: float | None
    scale_dtype: str
    tracker: int | None
    tracker_dtype: str
    stage: str
    found_inf: dict
    grad: np.ndarray | None
    weight: np.ndarray
    note: str


@dataclass(frozen=True, eq=False)
class Walk:
    """The snapshots of one iteration; ``walk["backward"]`` is the one after that call."""

    snapshots: tuple

    def __getitem__(self, key: str) -> Snapshot:
        for s in self.snapshots:
            if s.key == key:
                return s
        raise KeyError(f"{_shown(key)}: one of {', '.join(_shown(s.key) for s in self.snapshots)}")

    @property
    def table(self) -> Table:
        rows = []
        for s in self.snapshots:
            found = ", ".join(f"{dev}: {number(v)}" for dev, v in s.found_inf.items()) or "-"
            rows.append((s.call, "None" if s.scale is None else number(s.scale),
                         "None" if s.tracker is None else s.tracker, s.stage, found,
                         _vec_np(s.grad), _vec_np(s.weight), s.note))
        return Table(("call", "_scale", "_growth_tracker", "stage", "found_inf", "w.grad", "w",
                      "what happened"), rows)

    def __str__(self) -> str:
        return str(self.table)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return self.table._repr_html_()


def walk_iteration(*, overflow: bool = False, weights=(3.0, -4.0), lr: float = 0.1, **scaler_kwargs) -> Walk:
    """One iteration of the real ``torch.amp.GradScaler("cpu", **scaler_kwargs)`` on a fresh
    ``Tiny``, with a snapshot after each call.

    ``overflow=True`` puts an inf into the first gradient after the backward pass, as an fp16
    backward that overflowed would. ``scaler_kwargs``: ``init_scale``, ``growth_factor``,
    ``backoff_factor``, ``growth_interval`` (torch's defaults unless given).
    """
    overflow = _flag("overflow", overflow)
    scaler = _scaler(**scaler_kwargs)
    tiny = build_tiny(weights, lr)
    if overflow and tiny.weight.numel() == 0:
        raise ValueError("weights must hold at least one number with overflow=True (its gradient becomes inf)")
    opt = tiny.optimizer
    snaps = []

    def snap(key, call, note):
        s, t = scaler._scale, scaler._growth_tracker
        snaps.append(Snapshot(
            key=key, call=call, scale=None if s is None else s.item(),
            scale_dtype="-" if s is None else str(s.dtype), tracker=None if t is None else int(t.item()),
            tracker_dtype="-" if t is None else str(t.dtype), stage=_stage(scaler, opt),
            found_inf=_found_inf(scaler, opt), grad=_tensor_or_none(tiny.weight.grad),
            weight=_tensor_or_none(tiny.weight), note=note))

    snap("GradScaler", 'scaler = GradScaler("cpu")',
         f"nothing allocated yet; get_scale() returns init_scale as given: {scaler.get_scale()!r}")
    loss = tiny.loss()
    scaled = scaler.scale(loss)
    snap("scale", "scaled = scaler.scale(loss)",
         f"_scale created ({str(scaler._scale.dtype).replace('torch.', '')}), tracker "
         f"({str(scaler._growth_tracker.dtype).replace('torch.', '')}); "
         f"scaled = {number(loss.item())} × {number(scaler._scale.item())} = {number(scaled.item())}")
    scaled.backward()
    if overflow:
        with torch.no_grad():
            tiny.weight.grad.view(-1)[0] = INF
    snap("backward", "scaled.backward()",
         "w.grad = S·g (g = w)" + ("; an inf appeared (overflow)" if overflow else ""))
    scaler.unscale_(opt)
    found = any(_found_inf(scaler, opt).values())
    snap("unscale_", "scaler.unscale_(opt)",
         f"checked for inf/NaN (found {'one' if found else 'none'}), then w.grad × 1/S")
    before = tiny.steps_taken
    returned = scaler.step(opt)
    ran = tiny.steps_taken > before
    snap("step", "scaler.step(opt)",
         f"optimizer.step() {'ran' if ran else 'skipped'}; returned {returned!r}")
    old_scale, old_tracker = scaler.get_scale(), scaler._get_growth_tracker()
    scaler.update()
    new_scale, new_tracker = scaler.get_scale(), scaler._get_growth_tracker()
    if found:
        what = f"inf found: S × backoff_factor, {number(old_scale)} → {number(new_scale)}; tracker → 0"
    elif new_tracker == 0 and old_tracker + 1 == scaler.get_growth_interval():
        what = (f"tracker reached growth_interval: S × growth_factor, {number(old_scale)} → "
                f"{number(new_scale)}; tracker → 0")
    else:
        what = f"clean step counted: tracker {old_tracker} → {new_tracker}"
    snap("update", "scaler.update()", what + "; per-optimizer record cleared")
    return Walk(tuple(snaps))
