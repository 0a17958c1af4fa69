"""The simulator: ``simulate(policy, found_inf=... or grad_max=...)`` runs a scaler over a whole
stream and returns a ``ScalerTrace`` of numpy arrays. ``_run`` divides the work between the
event-by-event method (``events``) and the step-by-step loop (``steps``); the
package's docstring says how, and why the trace equals stepping ``adjust``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ampviz._args import _shown
from ampviz.formats import FP16, get_format
from ampviz.scaling.inputs import _flags, _gradients, _loss_format, _overflow_format
from ampviz.scaling.scaler import DynamicScaler, ScalerState, _check_state
from ampviz.scaling.simulator.arrays import _CHUNK, _DENSE_EVENTS, _DENSE_GAP, _TraceArrays, _int32
from ampviz.scaling.simulator.events import _events
from ampviz.scaling.simulator.steps import _steps
from ampviz.scaling.streams import _FixedOverflows, _ScaleDependentOverflows


# ------------------------------------------------------------------ traces
@dataclass(frozen=True, eq=False)
class ScalerTrace:
    """A simulated run, one entry per step.

    ``scale``: the scale in effect at each step, before that step's update (float32 for torch
    arithmetic, float64 otherwise; NaN after a run was stopped); ``skipped``: the step overflowed,
    ended the run, or came after it; ``growth_tracker`` and ``hysteresis``: the state after
    each step's update; ``stopped_at``: the step at which the framework's scaler ended the run
    (it raised: at its minimum scale, or dividing by a scale of 0, or formatting an infinite one),
    or None; ``stop_reason``: the exception it raised there, as the last line of its traceback
    (such as ``"ZeroDivisionError: float division by zero"``), or None.
    """

    policy: DynamicScaler
    scale: np.ndarray
    skipped: np.ndarray
    growth_tracker: np.ndarray
    hysteresis: np.ndarray
    final: ScalerState
    stopped_at: int | None = None
    stop_reason: str | None = None

    @property
    def steps(self) -> int:
        return int(self.scale.size)

    @property
    def skipped_count(self) -> int:
        """Skipped steps of the run; after a stop (``stopped_at``) no step runs, so none is counted."""
        end = self.steps if self.stopped_at is None else self.stopped_at + 1
        return int(np.count_nonzero(self.skipped[:end]))

    def __repr__(self) -> str:
        return (f"ScalerTrace({self.policy.name}: {self.steps} steps, {self.skipped_count} skipped, "
                f"scale {self.scale[0] if self.steps else float('nan'):g} -> "
                f"{self.scale[-1] if self.steps else float('nan'):g}"
                + (f", stopped at step {self.stopped_at}" if self.stopped_at is not None else "") + ")")


def simulate(policy: DynamicScaler, *, found_inf=None, grad_max=None, fmt=FP16, loss_dtype="float32",
             state: ScalerState | None = None) -> ScalerTrace:
    """Run ``policy`` over a stream of steps.

    Give exactly one of ``found_inf`` (bool per step: the step overflowed; 0/1 work too) or
    ``grad_max`` (the largest unscaled |gradient| per step: the step overflows when
    ``overflows(scale, g, fmt, loss_dtype)`` at the scale of that step; ``loss_dtype`` says whether
    the loss is float32, as autocast computes it, or in ``fmt``). ``state`` starts from a given
    state instead of the initial one. An empty stream gives an empty trace.
    """
    if not isinstance(policy, DynamicScaler):
        raise TypeError(f"policy must be a DynamicScaler (e.g. TorchGradScaler()), got {_shown(policy)}")
    if (found_inf is None) == (grad_max is None):
        raise ValueError("give exactly one of found_inf (bool per step) or grad_max (max |gradient| per step)")
    st = policy.initial_state() if state is None else _check_state(state)
    fmt = get_format(fmt)
    low = _loss_format(loss_dtype, fmt)
    if found_inf is not None:
        flags = _flags(found_inf)
        n = flags.size
        stream = _FixedOverflows(flags)
    else:
        g = _gradients(grad_max)
        n = g.size
        stream = _ScaleDependentOverflows(g, _overflow_format(fmt), low)
    with np.errstate(over="ignore", invalid="ignore"):
        return _run(policy, st, n, stream)


def _run(policy: DynamicScaler, st: ScalerState, n: int, stream) -> ScalerTrace:
    """Steps 0..n-1, each stretch by the cheaper of two methods: where events (overflows and
    growths) are far apart, event by event with numpy searches and fills (``_events``); where they
    come every few steps, step by step in Python (``_steps``). Both equal stepping ``adjust``."""
    if type(policy).adjust is not DynamicScaler.adjust:
        return _run_adjust(policy, st, n, stream)
    out = _TraceArrays(policy, st, n)
    stopped_at = None
    close = near = 0  # events in a row that came within _DENSE_GAP (or the stretch limit) of the last
    limit = _DENSE_GAP if stream.known else 16 * _DENSE_GAP
    i = 0
    while i < n:
        if st.stopped or not policy.dynamic:
            out.tail(i, st, stream)
            break
        if policy.raise_at_zero and st.scale == 0:  # this step divides by the scale: the run ends
            out.step(i, st.scale, True, st.growth_tracker, st.hysteresis)
            st, stopped_at = st._replace(stopped=True), i
            i += 1
            continue
        if close >= _DENSE_EVENTS:
            i, st, stop, _ = _steps(policy, st, i, n, stream, out)
            close = near = 0
        else:
            i, st, stop, gap = _events(policy, st, i, n, stream, out, near >= 4)
            close = close + 1 if gap < _DENSE_GAP else 0
            near = near + 1 if gap < limit else 0
        if stop is not None:
            stopped_at = stop
    reason = None
    if stopped_at is not None:  # the state before that step is the final one, stopped
        found = bool(np.asarray(stream.mask(stopped_at, stopped_at + 1, st.scale))[0])
        reason = policy._stop_reason(st._replace(stopped=False), found)
    return ScalerTrace(policy=policy, scale=out.scale, skipped=out.skipped, growth_tracker=out.tracker,
                       hysteresis=out.hyst, final=st, stopped_at=stopped_at, stop_reason=reason)


def _run_adjust(policy: DynamicScaler, st: ScalerState, n: int, stream) -> ScalerTrace:
    """A subclass that overrides ``adjust`` is stepped through its own ``adjust``, one step at a
    time (the fast paths above are ``DynamicScaler.adjust`` written out)."""
    out = _TraceArrays(policy, st, n)
    out.fixed_hyst, out.hyst = False, np.empty(n, np.int32)  # whatever its adjust does
    scale, skipped, tracker, hyst = out.scale, out.skipped, out.tracker, out.hyst
    stopped_at = reason = None
    scale64 = policy.arithmetic == "float64"
    for lo in range(0, n, _CHUNK):
        hi = min(n, lo + _CHUNK)
        data = stream.chunk(lo, hi, scale64)
        for k in range(lo, hi):
            if st.stopped:
                scale[k], f = np.nan, True
            else:
                scale[k] = st.scale
                f = bool(data[k - lo]) if stream.known else not abs(st.scale) < data[k - lo]
            before = st
            st = policy.adjust(st, f)
            if st.stopped and not before.stopped:
                stopped_at = k
                reason = policy._stop_reason(before, f)
                f = True  # the step that ends the run is not taken
            skipped[k] = f
            tracker[k] = _int32(st.growth_tracker)
            if not out.fixed_hyst:
                hyst[k] = st.hysteresis
    return ScalerTrace(policy=policy, scale=out.scale, skipped=out.skipped, growth_tracker=out.tracker,
                       hysteresis=out.hyst, final=st, stopped_at=stopped_at, stop_reason=reason)
