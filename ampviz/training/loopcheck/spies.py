"""What ``ampviz.training.loopcheck.check_loop`` watches while a learner's function runs, and how it runs it.

* ``LoopSpy``: a real ``torch.amp.GradScaler`` that notes each call made to it into the current
  iteration's ``finding`` (a dict from ``new_finding``): ``scale`` (and whether a backward pass
  went through what it returned), ``unscale_``/``step`` (and whether the gradients were zeroed
  since the backward pass), ``update`` (and whether it was given a new scale), and which
  optimizers stepped through it.
* ``watch``: hooks on a model: autocast in the forward pass; per parameter, the gradient it held
  when a backward pass accumulated into it (stale at the first of a step, lost at a later one).
  ``torch.autograd.grad`` (a gradient penalty) accumulates nothing, so it counts for nothing.
* ``guarded``: calls a learner's function within a time limit, restores torch's global state
  after it (grad mode, autocast, default dtype, anomaly mode), noting what it left changed, and
  notes a ``GradScaler.scale`` call on any scaler but the one passed in.

The time limit: in the main thread (a Jupyter kernel's, pytest's), ``SIGALRM`` from
``signal.setitimer`` raises ``TimedOut`` in the learner's code, interrupting ``time.sleep`` too,
and rings again every 50 ms until the call returns, in case the code catches it. Elsewhere
(another thread, or an alarm already in use) a trace function raises it at the next line of
Python the call runs (a blocking call finishes first). ``TimedOut`` is a ``BaseException``, as
``KeyboardInterrupt`` is, so ``except Exception`` does not swallow it. No thread is started.
"""

from __future__ import annotations

import signal
import sys
import threading
import time

import torch

#: A learner's function that changes one of these and does not change it back leaves it changed
#: for the rest of the loop: (what, how to read it, how to set it, how to change it for a while).
_STATE = (
    ("torch.is_grad_enabled()", torch.is_grad_enabled, torch.set_grad_enabled,
     "switch gradients off only inside a with torch.no_grad(): block"),
    ('torch.is_autocast_enabled("cpu")', lambda: torch.is_autocast_enabled("cpu"),
     lambda v: torch.set_autocast_enabled("cpu", v), 'use autocast as a with torch.autocast("cpu", ...): block'),
    ('torch.get_autocast_dtype("cpu")', lambda: torch.get_autocast_dtype("cpu"),
     lambda v: torch.set_autocast_dtype("cpu", v), "pass the dtype to a with torch.autocast(..., dtype=...): block"),
    ("torch.is_autocast_cache_enabled()", torch.is_autocast_cache_enabled, torch.set_autocast_cache_enabled,
     "pass cache_enabled= to a with torch.autocast(...): block"),
    ("torch.get_default_dtype()", torch.get_default_dtype, torch.set_default_dtype,
     "pass dtype= to the calls that need it"),
    ("torch.is_anomaly_enabled()", torch.is_anomaly_enabled, torch.set_anomaly_enabled,
     "use a with torch.autograd.detect_anomaly(): block"),
)


class TimedOut(BaseException):
    """A learner's function ran past the time limit (``args[0]``: the limit in seconds)."""


def new_finding() -> dict:
    """What the spies see in one iteration, all nothing yet."""
    return {"forwards": 0, "autocast": 0, "scale": 0, "through_scale": 0, "update": 0, "backwards": {},
            "held": {}, "accumulated": set(), "stepped": set(), "stale": False, "lost": False, "cleared": False,
            "new_scale": False, "other_scaler": False, "bypassed": False, "scheduled": (), "leaked": None}


def _nonzero(t) -> bool:
    return isinstance(t, torch.Tensor) and bool(t.ne(0).any())


class LoopSpy(torch.amp.GradScaler):
    """A real GradScaler that notes the calls made to it into ``finding`` (set per iteration)."""

    finding: dict | None = None

    def scale(self, outputs):
        out, f = super().scale(outputs), self.finding
        if f is not None:
            f["scale"] += 1
            for t in out if isinstance(out, (list, tuple)) else (out,):
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(lambda grad, f=f: f.__setitem__("through_scale", f["through_scale"] + 1))
        return out

    def _look(self, optimizer):
        """Gradients a backward pass accumulated this iteration, every one zeroed (or None) by now,
        as ``zero_grad()`` leaves them (clipping an overflowed step zeroes the finite ones only)."""
        f = self.finding
        if f is None:
            return
        grads = [p.grad for group in getattr(optimizer, "param_groups", ()) for p in group["params"]
                 if isinstance(p, torch.Tensor) and id(p) in f["accumulated"]]
        f["cleared"] |= bool(grads) and not any(map(_nonzero, grads))

    def unscale_(self, optimizer):
        self._look(optimizer)
        return super().unscale_(optimizer)

    def step(self, optimizer, *args, **kwargs):
        self._look(optimizer)
        if self.finding is not None:
            self.finding["stepped"].add(id(optimizer))
        return super().step(optimizer, *args, **kwargs)

    def update(self, new_scale=None):
        if self.finding is not None:
            self.finding["update"] += 1
            self.finding["new_scale"] |= new_scale is not None
        return super().update(new_scale)


def watch(model, forward, finding: dict) -> list:
    """Hooks (their handles) on ``model``: autocast when ``forward`` (a submodule every forward
    pass runs) runs; per parameter, the gradient it held when ``.backward()`` accumulated into it."""

    def forward_hook(module, args, output):
        finding["forwards"] += 1
        if torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.float16:
            finding["autocast"] += 1

    handles = [forward.register_forward_hook(forward_hook)]
    for p in model.parameters():
        def reached(grad, p=p):  # any backward pass reaching p, autograd.grad's too
            finding["held"][id(p)] = _nonzero(p.grad)

        def accumulated(p):  # .backward() only, after adding into p.grad
            seen, held = finding["backwards"].get(id(p), 0), finding["held"].pop(id(p), False)
            finding["stale"] |= seen == 0 and held
            finding["lost"] |= seen > 0 and not held and id(p) in finding["accumulated"]
            finding["backwards"][id(p)] = seen + 1
            if _nonzero(p.grad):
                finding["accumulated"].add(id(p))

        handles += [p.register_hook(reached), p.register_post_accumulate_grad_hook(accumulated)]
    return handles


def _autocast_nesting() -> int:
    n = torch.autocast_increment_nesting()
    torch.autocast_decrement_nesting()
    return n - 1


def _limit(seconds):
    """Start a time limit of ``seconds`` (None: none) on this thread; returns what stops it."""
    if seconds is None:
        return lambda: None
    armed = [True]
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer") \
            and signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, signal.SIG_IGN) \
            and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0):
        def ring(signum, frame):
            if armed[0]:
                raise TimedOut(seconds)

        old = signal.signal(signal.SIGALRM, ring)
        signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3), 0.05)

        def stop():
            armed[0] = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        return stop
    end, old = time.monotonic() + seconds, sys.gettrace()

    def trace(frame, event, arg):
        if armed[0] and time.monotonic() > end:
            raise TimedOut(seconds)
        return trace

    def stop():
        armed[0] = False
        sys.settrace(old)

    sys.settrace(trace)
    return stop


def guarded(fn, args, kwargs, *, timeout, scaler, finding: dict):
    """``fn(*args, **kwargs)``, raising ``TimedOut`` in it after ``timeout`` seconds (None: no
    limit); torch's global state is restored after it (``finding["leaked"]``: what it left
    changed, as ``(what, was, now, how)``), and a ``scale`` call it makes on a GradScaler other
    than ``scaler`` sets ``finding["other_scaler"]``."""
    saved, nesting, thread = [read() for _, read, _, _ in _STATE], _autocast_nesting(), threading.get_ident()
    real_scale = torch.amp.GradScaler.scale

    def scale(self, outputs):
        if self is not scaler and threading.get_ident() == thread:  # not another thread's training
            finding["other_scaler"] = True
        return real_scale(self, outputs)

    torch.amp.GradScaler.scale = scale
    stop = _limit(timeout)
    try:
        return fn(*args, **kwargs)
    finally:
        while True:  # the alarm may ring once more before it is stopped
            try:
                stop()
                break
            except TimedOut:
                continue
        torch.amp.GradScaler.scale = real_scale
        for (what, read, write, how), was in zip(_STATE, saved):
            now = read()
            if now != was:
                finding["leaked"] = finding["leaked"] or (what, was, now, how)
                write(was)
        if _autocast_nesting() != nesting:
            while _autocast_nesting() > nesting:
                torch.autocast_decrement_nesting()
            torch.clear_autocast_cache()  # an autocast left open kept float16 copies of the old weights
