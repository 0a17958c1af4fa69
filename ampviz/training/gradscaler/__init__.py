"""The real ``torch.amp.GradScaler``, call by call: a tiny problem, a driver, and reports.

``ampviz/__init__.py`` never imports this module, so ``import ampviz`` stays free of torch.

Everything here runs the real ``torch.amp.GradScaler("cpu", ...)`` (torch 2.13) and reports what it
did, so a lesson can show it and a test can hold it to it; if a new torch changed any of it, the
tests (and the lesson's checked outputs) would show the change.

* ``build_tiny``: one weight vector ``w`` and plain SGD, with loss ½‖w‖², so the gradient *is* ``w``
  and every number in a report can be checked by eye. ``Tiny.steps_taken`` counts the optimizer
  steps that really ran (an optimizer step post-hook; a step GradScaler skips never calls it).
* ``walk_iteration``: one iteration (``scale`` → ``backward`` → ``unscale_`` → ``step`` →
  ``update``) with the scaler's internal state after each call.
* ``run_real_scaler``: the real scaler over a stream of overflow flags, returning arrays that
  line up with ``ampviz.scaling.simulate(TorchGradScaler(...), found_inf=...)``; ``step_table``
  prints either of them step by step.
* ``unscale_overflow_table``: the inf check runs *before* the division by the scale.
* ``error_cases``: every state-machine error, raised by torch and caught, with its exact message.
* ``clipping_table``: gradient clipping after ``unscale_`` (right) and before it (wrong).
* ``skip_detection_table``: why ``if scaler.step(opt):`` cannot detect a skipped step, and what can.
* ``constructor_warnings``, ``scheduler_report``: the deprecation warning of ``torch.cuda.amp``,
  the scaler that disables itself without CUDA, and the ``lr_scheduler.step()`` order warning
  after a skipped first step, each captured (nothing reaches stderr).
* ``check_*``: the lesson's exercise checkers (``ampviz.checks.check``), and its questions that ask
  why (``ampviz.checks.check_choice``).

Reading the scaler's state uses its private attributes (``_scale``, ``_growth_tracker``,
``_per_optimizer_states``): that state is the subject of the lesson.

Where each part lives (this module re-exports the public API, ``__all__``, and the private names
other modules and tests use):

* ``tiny``: the tiny problem (``Tiny``, ``build_tiny``), the scaler it drives, the
  argument checks, and reading the scaler's private state.
* ``walk``: ``walk_iteration``, one iteration call by call.
* ``runs``: ``run_real_scaler``, ``RealRun``, ``found_inf_from``, ``same_run``,
  ``step_table``, ``skip_detection_table``.
* ``unscale``: ``unscale_overflow_table``, ``clipping_norms``, ``clipping_table``.
* ``errors``: ``error_cases``, every state-machine error.
* ``warning_reports``: ``constructor_warnings``, ``scheduler_report``, ``_capture``.
* ``checks``: the ``check_*`` checkers and ``amp_step_reference``.
"""

from __future__ import annotations

from ampviz.training.gradscaler.tiny import Tiny, build_tiny
from ampviz.training.gradscaler.walk import Snapshot, Walk, walk_iteration
from ampviz.training.gradscaler.runs import (RealRun, _step_indices, found_inf_from, run_real_scaler,
    same_run, skip_detection_table, step_table)
from ampviz.training.gradscaler.unscale import clipping_norms, clipping_table, unscale_overflow_table
from ampviz.training.gradscaler.errors import ErrorCase, _CASES, error_cases
from ampviz.training.gradscaler.warning_reports import (Caught, ConstructorReport, SchedulerReport, _capture,
    constructor_warnings, scheduler_report)
from ampviz.training.gradscaler.checks import (_SpyScaler, _check, amp_step_reference, check_amp_loop,
    check_backoffs_to_zero, check_clip_before_unscale, check_scale_after_pattern, check_skip_test,
    check_why_check_before_step, check_why_clip_after_unscale, check_why_scale_reaches_zero)

__all__ = [
    "Tiny",
    "build_tiny",
    "Snapshot",
    "Walk",
    "walk_iteration",
    "RealRun",
    "run_real_scaler",
    "found_inf_from",
    "same_run",
    "step_table",
    "unscale_overflow_table",
    "ErrorCase",
    "error_cases",
    "clipping_norms",
    "clipping_table",
    "skip_detection_table",
    "Caught",
    "ConstructorReport",
    "constructor_warnings",
    "SchedulerReport",
    "scheduler_report",
    "check_backoffs_to_zero",
    "check_skip_test",
    "check_clip_before_unscale",
    "check_scale_after_pattern",
    "check_why_clip_after_unscale",
    "check_why_check_before_step",
    "check_why_scale_reaches_zero",
    "amp_step_reference",
    "check_amp_loop",
]
