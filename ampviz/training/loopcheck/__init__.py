"""GradScaler in the training loops people write, and a checker for a learner's own loop.

``ampviz/__init__.py`` never imports this module, so ``import ampviz`` stays free of torch.

Everything here runs the real ``torch.amp.GradScaler("cpu", ...)`` (torch 2.13) with CPU float16
autocast on a small seeded model, ``LoopNet``: two linear parts ``a`` and ``b`` (4 inputs, 2
outputs each) fit to two target columns each by mean squared error; ``model(x, y)`` returns the
sum of the two losses, ``model.losses(x, y)`` each. The loss is computed in float32 (autocast
upcasts ``mse_loss``); the linear layers run in float16, so a large gradient overflows where AMP
overflows in practice, in the float16 backward pass. A *loss spike* is a batch whose targets are
shifted by 10^4: at any scale of 8 or more its scaled backward overflows.

Part 1, the loops people write, each shown right and wrong and measured:

* ``accumulation_report``: gradient accumulation; ``update()`` or ``unscale_`` per micro-batch
  (their exact errors); a spike in one micro-batch skips the whole step (weights unchanged, the
  scale halved once).
* ``optimizers_report``: two losses and two optimizers; one optimizer's gradients overflow: only
  that optimizer skips and ``update()`` backs off once; ``update()`` per optimizer instead.
* ``clipping_report``: ``clip_grad_norm_`` after ``unscale_`` (right) and before it (it sees a
  norm S times too large).
* ``penalty_report``: a gradient penalty from ``torch.autograd.grad`` on the scaled loss,
  unscaled by hand (right) or not (a penalty S² times too large, a norm S times).
* ``checkpoint_report``: what ``scaler.state_dict()`` holds, what resuming without it costs (the
  skipped steps, counted, and the scale logged after each iteration), the lazy ``_scale`` after
  ``load_state_dict``, and loading the empty state of a disabled scaler.
* ``skipped_step_report``: telling a skipped step by comparing ``get_scale()`` across
  ``update()``, the ``lr_scheduler.step()`` warning after skipped first steps, the scale as a log.

Part 2, the loop checker (``ampviz.training.loopcheck.checker``): a learner writes ``train_step(model,
optimizers, scaler, batches, max_norm)`` (one optimizer step; ``reference_step`` is a correct one)
and, for the resume scenario, ``save(model, optimizers, scaler)`` and ``load(checkpoint, model,
optimizers, scaler)``. ``check_loop`` runs it through adversarial ``SCENARIOS`` (and, when named,
``MORE_SCENARIOS``: a gradient penalty, a learning-rate scheduler, each passed to a step that
takes ``penalty=`` or ``schedulers=``) beside the reference and compares the weights, the scale,
which optimizer steps were skipped and the learning rates after every iteration: bit for bit, or
within rounding (``ROUNDING``), which the verdict notes. Spies (``ampviz.training.loopcheck.spies``) name
the mistake behind a difference; each call of the learner's functions has a time limit and
cannot leak torch's global state into the reference run. ``check_train_loop`` is the exercise
checker (``ampviz.checks.Check``). ``mistaken_loop(name)`` writes a loop with one classic
mistake (``MISTAKES``) to run through the checker.

Part 3, the questions of notebook 05 (``check_accumulation_scale``, ``check_order_of_updates``,
``check_scale_test_with_two_optimizers``, ``check_resume_burst``): each expected answer comes from
a real run; and its questions that ask why (``check_why_one_update``, ``check_why_save_scaler_state``,
``check_why_whole_step_skipped``), each right reason measured by a report of part 1.

Every result is computed by a real run. The runs use a handful of 4×2 float16 matrix products,
so they give the same bits on one or two torch threads (the tests check it), and the reports print
the same text on torch's default, AVX2 and AVX512 CPU kernels; the skipped-step counts and scales
depend only on which gradients overflow, and each overflow (or not) holds by a factor of 1.3 or
more; a value torch computes (a norm, a penalty) prints at 4 significant digits
(``ampviz.text.measured``), the same on every CPU. Reading the scaler's state uses its private
attributes (``_scale``, ``_growth_tracker``): that state is the subject. ``LoopNet``,
``reference_step`` and the checkpoint functions live in ``ampviz.training.loopcheck.problem``.
"""

from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ampviz.training.gradscaler import _capture, _check, _SpyScaler
from ampviz.checks import Check, Choice, _yes_no, check
from ampviz.text import Table, number
from ampviz.training.loopcheck.checker import (MAX_SCENARIOS, MISTAKES, MORE_SCENARIOS, ROUNDING, SCENARIOS,
                                               CheckReport, Scenario, ScenarioResult, check_loop,
                                               check_train_loop, mistaken_loop)
from ampviz.training.loopcheck.problem import (LARGE_TARGETS, MAX_ITERATIONS, MAX_MICRO_BATCHES, PART1_SCALE,
                                               SPIKE, _PARTS, LoopNet, _error, _factor, _measured, _params,
                                               _setup, _Setup, load_checkpoint, reference_step,
                                               save_checkpoint)
from ampviz._args import _shown
from ampviz._args import _flag, _real, _seed, _whole

__all__ = [
    "LoopNet",
    "reference_step",
    "save_checkpoint",
    "load_checkpoint",
    "LoopOutcome",
    "LoopReport",
    "accumulation_report",
    "optimizers_report",
    "ClippingReport",
    "clipping_report",
    "PenaltyReport",
    "penalty_report",
    "CheckpointReport",
    "checkpoint_report",
    "SkippedStepReport",
    "skipped_step_report",
    "Scenario",
    "SCENARIOS",
    "MORE_SCENARIOS",
    "ROUNDING",
    "ScenarioResult",
    "CheckReport",
    "check_loop",
    "MISTAKES",
    "mistaken_loop",
    "check_train_loop",
    "check_accumulation_scale",
    "check_order_of_updates",
    "check_scale_test_with_two_optimizers",
    "check_resume_burst",
    "check_why_one_update",
    "check_why_save_scaler_state",
    "check_why_whole_step_skipped",
]

# --------------------------------------------------------------------------------------------
# Part 1: loops, right and wrong, measured
# --------------------------------------------------------------------------------------------


class LoopOutcome(NamedTuple):
    """One loop run for one iteration on a fresh problem: what it raised (``"Type: message"`` or
    ""), per optimizer whether ``optimizer.step()`` ran and whether its weights changed, the
    scale before and after, how many times ``update()`` ran, and a measured note."""

    loop: str
    error: str
    stepped: tuple
    weights_changed: tuple
    scale_before: float
    scale_after: float
    updates: int
    note: str = ""


def _both(flags, yes: str, no: str) -> str:
    if len(flags) == 1:
        return yes if flags[0] else no
    return ", ".join(f"{part}: {yes if f else no}" for part, f in zip(_PARTS, flags))


@dataclass(frozen=True, eq=False)
class LoopReport:
    """Loops of one kind, each run for real: ``outcomes`` (``LoopOutcome``), ``table`` to print."""

    title: str
    outcomes: tuple

    def __getitem__(self, i: int) -> LoopOutcome:
        return self.outcomes[i]

    @property
    def table(self) -> Table:
        rows = [(o.loop, o.error or "-", _both(o.stepped, "ran", "skipped") if not o.error else "-",
                 _both(o.weights_changed, "changed", "unchanged"),
                 f"{number(o.scale_before)} → {number(o.scale_after)}", o.updates, o.note or "-")
                for o in self.outcomes]
        return Table(("loop", "raised", "optimizer.step()", "weights", "scale", "update() calls", "measured"),
                     rows, title=self.title)

    def __str__(self) -> str:
        return str(self.table)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return self.table._repr_html_()


def _run_once(loop: str, body, setup: _Setup, note=None) -> LoopOutcome:
    """Run ``body(setup)`` (one iteration; ``setup.scaler`` counts its calls) and record what it did."""
    scaler = setup.scaler
    before_w, before_steps, before_scale = setup.weights(), list(setup.steps), scaler.get_scale()
    error = ""
    try:
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            body(setup)
    except Exception as exc:  # noqa: BLE001 - the exception is the measurement
        error = _error(exc)
    return LoopOutcome(loop, error, tuple(a > b for a, b in zip(setup.steps, before_steps)),
                       tuple(not torch.equal(a, b) for a, b in zip(before_w, setup.weights())),
                       float(before_scale), float(scaler.get_scale()), scaler.calls["update"],
                       note(setup) if note else "")


def _accumulate_right(s: _Setup):
    opt, scaler, micro = s.optimizers[0], s.scaler, s.batches[0]
    opt.zero_grad()
    for x, y in micro:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = s.model(x, y) / len(micro)
        scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()


def _accumulate_update_each(s: _Setup):
    opt, scaler, micro = s.optimizers[0], s.scaler, s.batches[0]
    opt.zero_grad()
    for j, (x, y) in enumerate(micro):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = s.model(x, y) / len(micro)
        scaler.scale(loss).backward()
        if j == len(micro) - 1:
            scaler.step(opt)
        scaler.update()


def _accumulate_unscale_each(s: _Setup):
    opt, scaler, micro = s.optimizers[0], s.scaler, s.batches[0]
    opt.zero_grad()
    for x, y in micro:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = s.model(x, y) / len(micro)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()


def accumulation_report(micro_batches: int = 2, seed: int = 0) -> LoopReport:
    """Gradient accumulation over ``micro_batches`` micro-batches with the real GradScaler (scale
    2^10), one optimizer step each loop:

    * right: ``scaler.scale(loss / micro_batches).backward()`` for every micro-batch, then
      ``step`` and ``update`` once; on clean data and with a loss spike in the last micro-batch
      (the whole step is skipped: weights unchanged, the scale halved once);
    * ``update()`` after every micro-batch, and ``unscale_`` after every micro-batch: each raises
      (the exact message is in ``error``).
    """
    micro_batches = _whole("micro_batches", micro_batches, 2, 64)
    seed = _seed(seed, spare=1)
    last = micro_batches - 1

    def make(spike=False):
        return _setup(seed, micro_batches=micro_batches, spikes=[(0, last, "ab")] if spike else (),
                      scaler_class=_SpyScaler)

    return LoopReport(
        f"gradient accumulation over {micro_batches} micro-batches",
        (_run_once("scale each micro-batch; step and update() once (right)", _accumulate_right, make()),
         _run_once(f"the same, a loss spike in micro-batch {last + 1} of {micro_batches}", _accumulate_right,
                   make(spike=True)),
         _run_once("update() after every micro-batch", _accumulate_update_each, make()),
         _run_once("unscale_(opt) after every micro-batch", _accumulate_unscale_each, make())))


def _two_losses(s: _Setup, *, summed=False, update_each=False):
    scaler, (x, y) = s.scaler, s.batches[0][0]
    for opt in s.optimizers:
        opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        loss_a, loss_b = s.model.losses(x, y)
    if summed:
        scaler.scale(loss_a + loss_b).backward()
    else:
        scaler.scale(loss_a).backward()
        scaler.scale(loss_b).backward()
    for opt in s.optimizers:
        scaler.step(opt)
        if update_each:
            scaler.update()
    if not update_each:
        scaler.update()


def _grad_ratio(reference: _Setup):
    """A note: part b's gradient as the optimizer used it, relative to ``reference``'s."""
    def note(s: _Setup) -> str:
        mine = torch.cat([p.grad.reshape(-1) for p in _params(s.optimizers[1])])
        right = torch.cat([p.grad.reshape(-1) for p in _params(reference.optimizers[1])])
        return f"b's gradient × {_factor(float(mine.norm() / right.norm()))} of the right one"
    return note


def optimizers_report(seed: int = 0) -> LoopReport:
    """Two losses (``model.losses``: part a's, part b's) and two optimizers (one per part), one
    iteration each at scale 2^10, with the real GradScaler:

    * right: one ``scale`` per loss (or one for their sum), ``step`` per optimizer, one
      ``update()``; when part a's gradients overflow (a loss spike in a's targets) only
      optimizer a skips, b steps, and ``update()`` halves the scale once (found_inf is recorded
      per optimizer);
    * wrong: ``update()`` after each optimizer's step: b is then unscaled by a scale that has
      already changed, so b's step uses a gradient 2× (after a's backoff) or ½× (after a growth,
      shown with ``growth_interval=1``) the right one.
    """
    seed = _seed(seed, spare=1)

    def make(spike=False, growth_interval=2000):
        return _setup(seed, optimizers=2, spikes=[(0, 0, "a")] if spike else (), growth_interval=growth_interval,
                      scaler_class=_SpyScaler)

    right_spike = make(spike=True)
    right_grow = make(growth_interval=1)
    outcomes = (
        _run_once("scale each loss, step each optimizer, update() once (right)", _two_losses, make()),
        _run_once("the same, part a's gradients overflow", _two_losses, right_spike),
        _run_once("scale the sum once, part a's gradients overflow",
                  lambda s: _two_losses(s, summed=True), make(spike=True),
                  note=lambda s: "weights as in the row above: " + str(all(
                      torch.equal(a, b) for a, b in zip(s.weights(), right_spike.weights())))),
        _run_once("update() after each optimizer's step, part a's gradients overflow",
                  lambda s: _two_losses(s, update_each=True), make(spike=True), note=_grad_ratio(right_spike)),
        _run_once("the same loop right, growth_interval=1", _two_losses, right_grow),
        _run_once("update() after each optimizer's step, growth_interval=1",
                  lambda s: _two_losses(s, update_each=True), make(growth_interval=1),
                  note=_grad_ratio(right_grow)),
    )
    return LoopReport("two losses, two optimizers, one scaler", outcomes)


@dataclass(frozen=True, eq=False)
class ClippingReport:
    """``clip_grad_norm_(max_norm)`` in a real AMP step, after ``unscale_`` and before it.

    ``scale``: S; ``norm``: the true gradient norm (what clipping after ``unscale_`` sees);
    ``seen_before_unscale``: what clipping before ``unscale_`` sees (S × ``norm``);
    ``applied_right``/``applied_wrong``: the norm of the gradient the optimizer used.
    """

    max_norm: float
    scale: float
    norm: float
    seen_before_unscale: float
    applied_right: float
    applied_wrong: float

    @property
    def ratio(self) -> float:
        """How many times too large the norm seen before ``unscale_`` is (S)."""
        return self.seen_before_unscale / self.norm

    @property
    def table(self) -> Table:
        rows = [("unscale_ → clip → step (right)", _measured(self.norm), _measured(self.applied_right)),
                ("clip → step (unscales after clipping)", _measured(self.seen_before_unscale),
                 _measured(self.applied_wrong, pow2=True))]
        return Table(("order", "norm clip_grad_norm_ saw", "norm of the gradient applied"), rows,
                     title=f"clip_grad_norm_(max_norm={number(self.max_norm)}) at scale {number(self.scale)}: "
                           f"the norm seen before unscale_ is {_factor(self.ratio)} × too large")

    def __str__(self) -> str:
        return str(self.table)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return self.table._repr_html_()


def clipping_report(max_norm: float = 1.0, seed: int = 0) -> ClippingReport:
    """One step of the real loop (scale 2^10) with ``clip_grad_norm_(max_norm)``, clipping after
    ``scaler.unscale_`` (right) and before it (``step`` then unscales the clipped gradients)."""
    max_norm = _real("max_norm", max_norm)
    if not 0 < max_norm < math.inf:
        raise ValueError(f"max_norm must be a number > 0 (finite), not {_shown(max_norm)}")
    seed = _seed(seed, spare=1)
    out = {}
    for first in (True, False):
        s = _setup(seed)
        opt, scaler, (x, y) = s.optimizers[0], s.scaler, s.batches[0][0]
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = s.model(x, y)
        scaler.scale(loss).backward()
        if first:
            scaler.unscale_(opt)
        seen = float(torch.nn.utils.clip_grad_norm_(_params(opt), max_norm))
        scaler.step(opt)
        applied = float(torch.cat([p.grad.reshape(-1) for p in _params(opt)]).norm())
        scaler.update()
        out[first] = (seen, applied, float(scaler.get_scale()))
    return ClippingReport(max_norm, out[True][2], out[True][0], out[False][0], out[True][1], out[False][1])


@dataclass(frozen=True, eq=False)
class PenaltyReport:
    """A gradient penalty in a real AMP loop: ``penalty``/``wrong_penalty`` are ‖∇loss‖² from the
    scaled gradients unscaled by hand (right) and taken as they are (wrong), ``norm``/``wrong_norm``
    the same for ‖∇loss‖ (the penalty of torch's AMP example); ``runs``: per loop, the scale after
    each iteration and which steps were skipped."""

    scale: float
    penalty: float
    wrong_penalty: float
    norm: float
    wrong_norm: float
    runs: tuple

    @property
    def table(self) -> Table:
        rows = [("‖g‖² unscaled by hand (right)", _measured(self.penalty), "1"),
                ("‖g‖² of the scaled gradients", _measured(self.wrong_penalty),
                 _factor(self.wrong_penalty / self.penalty, pow2=True)),
                ("‖g‖ unscaled by hand (right)", _measured(self.norm), "1"),
                ("‖g‖ of the scaled gradients", _measured(self.wrong_norm),
                 _factor(self.wrong_norm / self.norm, pow2=True))]
        return Table(("penalty", "value", "× the right one"), rows,
                     title=f"gradient penalty at scale {number(self.scale)}")

    @property
    def run_table(self) -> Table:
        rows = [(name, " ".join(number(s) for s in scales), sum(skipped)) for name, scales, skipped in self.runs]
        return Table(("loop", "scale after each iteration", "steps skipped"), rows)

    def __str__(self) -> str:
        return str(self.table) + "\n\n" + str(self.run_table)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return self.table._repr_html_() + self.run_table._repr_html_()


def _penalty_step(s: _Setup, i: int, *, unscale: bool, record=None):
    """One step of loss + ‖∇loss‖² as torch's AMP examples compute a gradient penalty."""
    opt, scaler, (x, y) = s.optimizers[0], s.scaler, s.batches[i][0]
    params = _params(opt)
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = s.model(x, y)
    scaled_grads = torch.autograd.grad(scaler.scale(loss), params, create_graph=True)
    if record is not None:
        record["scale"] = float(scaler.get_scale())
    inv_scale = 1.0 / scaler.get_scale() if unscale else 1.0
    grads = [g * inv_scale for g in scaled_grads]
    with torch.autocast("cpu", dtype=torch.float16):
        penalty = sum(g.pow(2).sum() for g in grads)
        if record is not None:
            record["penalty"] = float(penalty.detach())
            record["norm"] = float(penalty.detach().sqrt())
        loss = loss + penalty
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()


def penalty_report(iterations: int = 6, seed: int = 0) -> PenaltyReport:
    """A gradient penalty ‖∇loss‖² added to the loss, as in torch's AMP examples:
    ``torch.autograd.grad(scaler.scale(loss), params, create_graph=True)``, divided by
    ``scaler.get_scale()`` by hand (right), or not (wrong: the penalty is S² times too large, the
    norm S times). The first iteration's values are measured (scale 2^10); ``runs`` trains
    ``iterations`` steps with each loop."""
    iterations = _whole("iterations", iterations, 1, MAX_ITERATIONS)
    seed = _seed(seed, spare=1)
    values, runs = {}, []
    for unscale, name in ((True, "unscaled by hand (right)"), (False, "on the scaled gradients")):
        s = _setup(seed, iterations=iterations)
        scales, skipped = [], []
        for i in range(iterations):
            before = list(s.steps)
            record = values.setdefault(unscale, {}) if i == 0 else None
            _penalty_step(s, i, unscale=unscale, record=record)
            scales.append(float(s.scaler.get_scale()))
            skipped.append(s.steps == before)
        runs.append((name, tuple(scales), tuple(skipped)))
    return PenaltyReport(values[True]["scale"], values[True]["penalty"], values[False]["penalty"], values[True]["norm"],
                         values[False]["norm"], tuple(runs))


@dataclass(frozen=True, eq=False)
class CheckpointReport:
    """Checkpoint and resume with a GradScaler, measured on a run whose scale settles lower (at 256
    with seed 0).

    ``state_dict``: what ``scaler.state_dict()`` held at the checkpoint; ``settled_scale``: the
    scale there; ``skipped_before``: steps skipped before it (the scale coming down from 2^16);
    after ``load_state_dict`` into a fresh scaler: ``scale_is_none_after_load`` (``_scale`` is
    created lazily), ``get_scale_after_load``, ``scale_after_first_scale`` (``_scale`` after the
    first ``scale()``); over the ``continued`` iterations after the checkpoint: ``skipped_with_state``,
    ``skipped_without_state`` (the scaler not restored: its scale restarts at 2^16),
    ``same_with_state``/``same_without_state`` (weights and scale bit for bit as an uninterrupted
    run); ``empty_state_error``: loading a disabled scaler's state dict into an enabled one;
    ``scales_with_state``/``scales_without_state``: the scale after each of the ``continued``
    iterations (the log a training script keeps), ``log_table`` to print them.
    """

    state_dict: dict
    settled_scale: float
    skipped_before: int
    scale_is_none_after_load: bool
    get_scale_after_load: float
    scale_after_first_scale: float
    continued: int
    skipped_with_state: int
    skipped_without_state: int
    same_with_state: bool
    same_without_state: bool
    empty_state_error: str
    scales_with_state: tuple = ()
    scales_without_state: tuple = ()

    @property
    def burst(self) -> int:
        """The steps that resuming without the scaler's state costs."""
        return self.skipped_without_state - self.skipped_with_state

    @property
    def table(self) -> Table:
        sd = ", ".join(f"{k}: {v!r}" for k, v in self.state_dict.items())
        rows = [("scaler.state_dict() at the checkpoint", sd),
                ("steps skipped before the checkpoint (2^16 down to the settled scale)", self.skipped_before),
                ("after load_state_dict: scaler._scale is None", self.scale_is_none_after_load),
                ("after load_state_dict: get_scale()", number(self.get_scale_after_load)),
                ("after the first scale(): scaler._scale", number(self.scale_after_first_scale)),
                (f"resumed with the scaler's state: steps skipped in {self.continued}", self.skipped_with_state),
                ("resumed with the scaler's state: same as never stopping", self.same_with_state),
                (f"resumed without it: steps skipped in {self.continued}", self.skipped_without_state),
                ("resumed without it: same as never stopping", self.same_without_state),
                ("load_state_dict of a disabled scaler's state_dict()", self.empty_state_error)]
        return Table(("", "measured"), rows, title="checkpoint and resume")

    @property
    def log_table(self) -> Table:
        """The scale after each iteration after resuming, as a training log shows it."""
        rows = [(name, " ".join(number(s) for s in scales), skipped)
                for name, scales, skipped in (("resumed with the scaler's state", self.scales_with_state,
                                               self.skipped_with_state),
                                              ("resumed without it", self.scales_without_state,
                                               self.skipped_without_state))]
        return Table(("after the checkpoint", "scale after each iteration", "steps skipped"), rows)

    def __str__(self) -> str:
        return str(self.table) + "\n\n" + str(self.log_table)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return self.table._repr_html_() + self.log_table._repr_html_()


def _train(s: _Setup, iterations, scales=None) -> list:
    """``reference_step`` over the given iterations; which steps were skipped (and, into
    ``scales`` if given, the scale after each)."""
    skipped = []
    for i in iterations:
        before = list(s.steps)
        reference_step(s.model, s.optimizers, s.scaler, s.batches[i])
        skipped.append(s.steps == before)
        if scales is not None:
            scales.append(float(s.scaler.get_scale()))
    return skipped


def checkpoint_report(checkpoint_at: int = 12, continued: int = 12, seed: int = 0) -> CheckpointReport:
    """Train ``reference_step`` with the default ``GradScaler("cpu")`` (2^16, growth every 2000
    clean steps) on large targets (``LARGE_TARGETS``: the scale settles at 256), checkpoint after
    ``checkpoint_at`` iterations with ``save_checkpoint`` (deep-copied, as a file would hold it),
    and continue ``continued`` iterations in fresh objects: restored with ``load_checkpoint``, and
    restored without the scaler's state. Both are compared with the run that never stopped, bit
    for bit."""
    checkpoint_at = _whole("checkpoint_at", checkpoint_at, 1, MAX_ITERATIONS)
    continued = _whole("continued", continued, 1, MAX_ITERATIONS)
    seed = _seed(seed, spare=2)
    total = checkpoint_at + continued

    def make(model_seed=None):
        return _setup(seed, iterations=total, offset=LARGE_TARGETS, lr=1e-3, init_scale=2.0**16,
                      model_seed=model_seed)

    whole = make()
    skipped_whole = _train(whole, range(total))
    first = make()
    skipped_before = sum(_train(first, range(checkpoint_at)))
    checkpoint = copy.deepcopy(save_checkpoint(first.model, first.optimizers, first.scaler))
    runs = {}
    for with_state in (True, False):
        fresh = make(model_seed=seed + 2)  # another initialisation: the checkpoint must restore it
        fresh.model.load_state_dict(checkpoint["model"])
        for opt, state in zip(fresh.optimizers, checkpoint["optimizers"]):
            opt.load_state_dict(state)
        if with_state:
            fresh.scaler.load_state_dict(checkpoint["scaler"])
            lazy = (fresh.scaler._scale is None, float(fresh.scaler.get_scale()))
            fresh.scaler.scale(torch.ones(()))  # what a first scale() creates (it changes nothing else)
            after_first = float(fresh.scaler._scale)
        scales = []
        skipped = _train(fresh, range(checkpoint_at, total), scales)
        same = (all(torch.equal(a, b) for a, b in zip(fresh.weights(), whole.weights()))
                and fresh.scaler.get_scale() == whole.scaler.get_scale() and skipped == skipped_whole[checkpoint_at:])
        runs[with_state] = (sum(skipped), same, tuple(scales))
    try:
        torch.amp.GradScaler("cpu").load_state_dict(torch.amp.GradScaler("cpu", enabled=False).state_dict())
        empty = "no error"
    except Exception as exc:  # noqa: BLE001 - the exception is the measurement
        empty = _error(exc)
    state = dict(checkpoint["scaler"])
    return CheckpointReport(state, float(state["scale"]), skipped_before, lazy[0], lazy[1], after_first, continued,
                            runs[True][0], runs[False][0], runs[True][1], runs[False][1], empty, runs[True][2],
                            runs[False][2])


@dataclass(frozen=True, eq=False)
class SkippedStepReport:
    """A run with ``StepLR``: per iteration (``table``) the scale, ``get_scale()`` after
    ``update()``, what comparing the two says, whether ``optimizer.step()`` really ran, whether
    ``scheduler.step()`` was called, and the learning rate; ``warnings``: what torch warned."""

    table: Table
    skipped_by_scale: tuple
    skipped_really: tuple
    lr_at_first_step: float
    warnings: tuple

    def __str__(self) -> str:
        caught = [str(w) for w in self.warnings] or ["(no warning)"]
        return str(self.table) + "\n\nwarnings:\n" + "\n".join(caught)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        caught = Table(("warnings",), [(str(w),) for w in self.warnings] or [("(no warning)",)])
        return self.table._repr_html_() + caught._repr_html_()


def skipped_step_report(guard: bool = False, iterations: int = 12, seed: int = 0) -> SkippedStepReport:
    """Train with the default ``GradScaler("cpu")`` on large targets (with seed 0 its first 8 steps
    overflow: 2^16 down to 256) and ``StepLR(step_size=1, gamma=0.5)``, calling ``scheduler.step()`` after
    every ``update()``, or (``guard=True``) only when the step happened: ``get_scale()`` did not
    drop across ``update()``, as Accelerate's ``optimizer_step_was_skipped`` tells it."""
    guard = _flag("guard", guard)
    iterations = _whole("iterations", iterations, 1, MAX_ITERATIONS)
    seed = _seed(seed, spare=1)

    def train():
        s = _setup(seed, iterations=iterations, offset=LARGE_TARGETS, lr=1e-3, init_scale=2.0**16)
        opt, scaler = s.optimizers[0], s.scaler
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        rows, by_scale, really, first_lr = [], [], [], None
        for i in range(iterations):
            lr = opt.param_groups[0]["lr"]
            before, steps = scaler.get_scale(), list(s.steps)
            reference_step(s.model, s.optimizers, scaler, s.batches[i])
            after = scaler.get_scale()
            skipped = after < before
            ran = s.steps != steps
            if ran and first_lr is None:
                first_lr = lr
            call = not guard or not skipped
            if call:
                sched.step()
            by_scale.append(skipped)
            really.append(not ran)
            rows.append((i, number(before), number(after), "skipped" if skipped else "stepped",
                         "ran" if ran else "skipped", "called" if call else "not called", number(lr)))
        table = Table(("iteration", "scale", "get_scale() after update()", "scale dropped → step",
                       "optimizer.step() really", "scheduler.step()", "lr of this step"), rows)
        return table, tuple(by_scale), tuple(really), first_lr

    (table, by_scale, really, first_lr), caught = _capture(train)
    return SkippedStepReport(table, by_scale, really, math.nan if first_lr is None else first_lr, caught)


# --------------------------------------------------------------------------------------------
# Part 3: the lesson's questions, each answered by a real run
# --------------------------------------------------------------------------------------------


def _accumulated_scale(micro_batches: int, spiked: tuple) -> float:
    """The scale after one accumulated step from 2^10 with loss spikes in the micro-batches
    ``spiked`` (counted from 1)."""
    s = _setup(0, micro_batches=micro_batches, spikes=[(0, j - 1, "ab") for j in spiked])
    _accumulate_right(s)
    return float(s.scaler.get_scale())


def check_accumulation_scale(answer) -> Check:
    """Q: gradient accumulation over 4 micro-batches from scale 2^10, loss spikes in micro-batches
    1 and 3 of the same step: the scale after the step (a real run)."""
    return _check(answer, _accumulated_scale(4, (1, 3)),
                  hint="count the update() calls in one step of the right loop, and what each one does")


def _applied_ratios(spike: str) -> tuple:
    """Per optimizer (a, b), the norm of the gradient it applied with ``update()`` after each
    optimizer's step, over the right loop's, when ``spike``'s gradients overflow (nan for the
    optimizer whose gradients overflowed)."""
    right, wrong = _setup(0, optimizers=2, spikes=[(0, 0, spike)]), _setup(0, optimizers=2, spikes=[(0, 0, spike)])
    _two_losses(right)
    _two_losses(wrong, update_each=True)
    out = []
    for a, b in zip(wrong.optimizers, right.optimizers):
        mine, theirs = (torch.cat([p.grad.reshape(-1) for p in _params(o)]).norm() for o in (a, b))
        out.append(float(mine / theirs) if torch.isfinite(theirs) else math.nan)
    return tuple(out)


def check_order_of_updates(answer) -> Check:
    """Q: two optimizers, ``update()`` after each optimizer's step, and this time part b's
    gradients overflow (a's do not): optimizer a applies its right gradient times what factor?
    (a real run: a steps before any ``update()``, so 1)."""
    return _check(answer, _applied_ratios("b")[0],
                  hint="which scale unscales a's gradients: the one before or after an update()? "
                       "Which optimizer steps first?")


def check_scale_test_with_two_optimizers(answer) -> Check:
    """Q: two optimizers, one scaler, only part a's gradients overflow (b steps): does the scale
    test (``get_scale()`` dropped across ``update()``) call the iteration skipped? "yes"/"no"
    (a real run)."""
    spike = optimizers_report()[1]
    return check(answer, None, accept=_yes_no(spike.scale_after < spike.scale_before),
                 hint="there is one scale for all the optimizers: what does update() do to it when any of them "
                      "found an inf?")


def check_resume_burst(answer) -> Check:
    """Q (predict): resumed from a checkpoint without the scaler's state, how many of the next 12
    steps are skipped (``checkpoint_report``: the scale had settled at 256 from 2^16)?"""
    return _check(answer, checkpoint_report().skipped_without_state,
                  hint="a fresh GradScaler starts at 2^16 again, and halves once per skipped step: how many "
                       "halvings from there down to the scale the run had settled at?")


WHY_WHOLE_STEP_SKIPPED = Choice(
    "why_whole_step_skipped",
    "With gradient accumulation, why does one overflowing micro-batch skip the whole step, the clean "
    "micro-batches' gradients too?",
    {"a": "scaler.scale() checks each micro-batch's loss, and the spike's loss is too large",
     "b": "every micro-batch's backward adds into the same .grad, and unscale_ checks that sum once per step: "
          "an inf in one micro-batch's gradients makes the sum inf",
     "c": "update() runs after each micro-batch and halves the scale, so the earlier micro-batches' "
          "gradients no longer match it"},
    "b",
    {"a": "scale() only multiplies (notebook 04, section 1): the spike's inf appears in its scaled fp16 "
          "backward pass, and unscale_ finds it among the gradients",
     "c": "the right loop calls update() once per step (section 1's table: 1 call, 1024 → 512), and update() "
          "after every micro-batch raises"},
)

WHY_ONE_UPDATE = Choice(
    "why_one_update",
    "Two optimizers share one scaler. Why must update() run once per iteration, after every "
    "optimizer's scaler.step, and not after each of them?",
    {"a": "a second update() in one iteration raises an error",
     "b": "the scaler keeps a scale per optimizer, and one update() must see them all to combine them",
     "c": "there is one scale for all the optimizers: an update() between two steps changes it before the "
          "next optimizer's gradients, scaled by the old one, are unscaled",
     "d": "with an update() per optimizer, one optimizer's overflow skips every optimizer's step"},
    "c",
    {"a": "section 2's loop with update() after each optimizer's step raised nothing: the mistake is silent",
     "b": "section 2's one scale halved once (1024 → 512) when only a's gradients overflowed: there is no "
          "scale per optimizer",
     "d": "section 2's table shows b stepping in that loop (a: skipped, b: ran): what goes wrong is the "
          "size of b's gradient, 2× the right one"},
)

WHY_SAVE_SCALER_STATE = Choice(
    "why_save_scaler_state",
    "Why must a checkpoint hold scaler.state_dict() as well as the model's and the optimizer's?",
    {"a": "the scaler's state holds the last step's scaled gradients, which the next step needs",
     "b": "resuming without it raises an error at the first scaler.step()",
     "c": "a fresh scaler starts again at 2^16 and skips steps while it backs off to the scale the run had "
          "settled at; restored, the run goes on as if it had never stopped"},
    "c",
    {"a": "section 5's state dict is five numbers, the scale, three settings and the growth tracker: no gradients",
     "b": "section 5's run resumed without it raised nothing: it ran its 12 iterations and skipped 8 of them"},
)


check_why_whole_step_skipped = WHY_WHOLE_STEP_SKIPPED.checker()


check_why_one_update = WHY_ONE_UPDATE.checker()


check_why_save_scaler_state = WHY_SAVE_SCALER_STATE.checker()
