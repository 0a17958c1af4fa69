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

Part 2, the loop checker: a learner writes ``train_step(model, optimizers, scaler, batches,
max_norm)`` (one optimizer step; ``reference_step`` is a correct one) and, for the resume scenario,
``save(model, optimizers, scaler)`` and ``load(checkpoint, model, optimizers, scaler)``.
``check_loop`` runs it through adversarial ``SCENARIOS`` beside the reference and compares the
weights, the scale and which optimizer steps were skipped after every iteration, bit for bit;
``check_train_loop`` is the exercise checker (``ampviz.lessons.Check``). ``mistaken_loop(name)``
writes a loop with one classic mistake (``MISTAKES``) to run through the checker.

Part 3, the questions of notebook 05 (``check_accumulation_scale``, ``check_order_of_updates``,
``check_scale_test_with_two_optimizers``, ``check_resume_burst``): each expected answer comes from
a real run.

Every result is computed by a real run. The runs use a handful of 4×2 float16 matrix products,
so they give the same bits on one or two torch threads (the tests check it), and the reports print
the same text on torch's default, AVX2 and AVX512 CPU kernels; the skipped-step counts and scales
depend only on which gradients overflow, and each overflow (or not) holds by a factor of 1.3 or
more. Reading the scaler's state uses its private attributes (``_scale``,
``_growth_tracker``): that state is the subject.
"""

from __future__ import annotations

import copy
import math
import warnings
from types import MappingProxyType
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ampviz.explain import explain
from ampviz.gradscaler import _capture, _check, _SpyScaler
from ampviz.lessons import Check, Table, _yes_no, check, number
from ampviz.scaling import _shown
from ampviz.training import _flag, _real, _seed, _whole

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
]

#: A loss spike: targets shifted by this much make the scaled float16 backward overflow at any
#: scale of 8 or more (the bias gradient alone is about 10^4 × scale).
SPIKE = 1e4
#: The targets of a run whose scale settles lower: shifted by this much, the largest gradient is
#: 170 to 176 × scale, so scales of 512 and above overflow and 256 does not (each by a factor of
#: 1.3 or more).
LARGE_TARGETS = 170.0
#: The scale the part-1 reports start from: the gradients of the plain problem are below 2.4, so
#: 2^10 leaves a factor of about 25 below float16's overflow.
PART1_SCALE = 2.0**10
#: The longest run a report or a scenario takes (each iteration costs about a millisecond).
MAX_ITERATIONS = 64
#: The most micro-batches a step of a scenario takes.
MAX_MICRO_BATCHES = 16
#: The most scenarios one ``check_loop`` runs.
MAX_SCENARIOS = 32
_PARTS = ("a", "b")


# --------------------------------------------------------------------------------------------
# The problem
# --------------------------------------------------------------------------------------------


class LoopNet(nn.Module):
    """Two linear parts, ``a`` and ``b`` (4 inputs, 2 outputs each), each fit to two of the four
    target columns: ``model(x, y)`` is the loss, the sum of both parts' mean squared errors;
    ``model.losses(x, y)`` gives them one by one (``a`` on ``y[:, :2]``, ``b`` on ``y[:, 2:]``)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 2)
        self.b = nn.Linear(4, 2)

    def losses(self, x, y):
        return F.mse_loss(self.a(x), y[:, :2]), F.mse_loss(self.b(x), y[:, 2:])

    def forward(self, x, y):
        loss_a, loss_b = self.losses(x, y)
        return loss_a + loss_b


def _params(optimizer) -> list:
    return [p for group in optimizer.param_groups for p in group["params"]]


def reference_step(model, optimizers, scaler, batches, max_norm=None):
    """One correct optimizer step with a GradScaler (the model answer of the loop exercise).

    ``batches``: the micro-batches ``(x, y)`` of this step (gradient accumulation when there are
    several); ``optimizers``: a list (one per part of the model, or one for all); ``max_norm``:
    clip each optimizer's gradients to this norm, or None. Zero the gradients once, scale every
    micro-batch's loss (divided by the number of micro-batches: the step's loss is their mean),
    then per optimizer ``unscale_`` (only to clip) and ``step``, and ``update()`` once.
    """
    _step_args(model, optimizers, scaler, batches, max_norm)
    for optimizer in optimizers:
        optimizer.zero_grad()
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(x, y) / len(batches)
        scaler.scale(loss).backward()
    for optimizer in optimizers:
        if max_norm is not None:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(_params(optimizer), max_norm)
        scaler.step(optimizer)
    scaler.update()


def save_checkpoint(model, optimizers, scaler) -> dict:
    """A checkpoint as a correct loop saves it: the model's, every optimizer's and the scaler's
    state dicts."""
    _step_args(model, optimizers, scaler)
    return {"model": model.state_dict(), "optimizers": [opt.state_dict() for opt in optimizers],
            "scaler": scaler.state_dict()}


def load_checkpoint(checkpoint, model, optimizers, scaler) -> None:
    """Restore what ``save_checkpoint`` saved into a fresh model, optimizers and scaler."""
    _step_args(model, optimizers, scaler)
    if not isinstance(checkpoint, dict) or not {"model", "optimizers", "scaler"} <= set(checkpoint):
        raise TypeError(f"checkpoint must be a dict from save_checkpoint (keys model, optimizers, scaler), "
                        f"not {_shown(checkpoint)}")
    try:
        model.load_state_dict(checkpoint["model"])
        for optimizer, state in zip(optimizers, checkpoint["optimizers"], strict=True):
            optimizer.load_state_dict(state)
        scaler.load_state_dict(checkpoint["scaler"])
    except (RuntimeError, KeyError, ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"the checkpoint does not fit this model, these optimizers and this scaler "
                         f"(save it with save_checkpoint from the same kind of objects): {_error(exc)}") from None


def _step_args(model, optimizers, scaler, batches=None, max_norm=None):
    """Refuse what a training step cannot take, in one line that says what to pass."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module whose model(x, y) is the loss, not {_shown(model)}")
    if not isinstance(optimizers, (list, tuple)) or not optimizers or \
            not all(isinstance(o, torch.optim.Optimizer) for o in optimizers):
        raise TypeError(f"optimizers must be a non-empty list of torch.optim optimizers, not {_shown(optimizers)}")
    if not isinstance(scaler, torch.amp.GradScaler):
        raise TypeError(f'scaler must be a torch.amp.GradScaler (e.g. GradScaler("cpu")), not {_shown(scaler)}')
    if batches is not None:
        if not isinstance(batches, (list, tuple)) or not batches or not all(
                isinstance(b, (list, tuple)) and len(b) == 2 and all(isinstance(t, torch.Tensor) for t in b)
                for b in batches):
            raise TypeError(f"batches must be a non-empty list of (x, y) tensor pairs (the micro-batches), "
                            f"not {_shown(batches)}")
        for x, y in batches:
            if not (x.is_floating_point() and y.is_floating_point() and x.dim() == y.dim() == 2
                    and len(x) == len(y) and x.device.type == y.device.type == "cpu"):
                raise ValueError(f"each micro-batch must be (x, y): two 2-D float CPU tensors with as many rows, "
                                 f"not shapes {tuple(x.shape)} and {tuple(y.shape)}")
            if isinstance(model, LoopNet) and (x.shape[1] != 4 or y.shape[1] != 4):
                raise ValueError(f"a LoopNet takes x and y with 4 columns each, not shapes {tuple(x.shape)} "
                                 f"and {tuple(y.shape)}")
    if max_norm is not None:
        value = _real("max_norm", max_norm)
        if not value > 0:
            raise ValueError(f"max_norm must be a number > 0 (or None: no clipping), not {_shown(max_norm)}")


@dataclass(eq=False)
class _Setup:
    """One run's objects: a fresh seeded model, its optimizers (SGD with momentum), a scaler, the
    batches of every iteration (a list of micro-batches each) and the optimizer steps that really
    ran (counted by step post-hooks: a step GradScaler skips never calls them)."""

    model: LoopNet
    optimizers: list
    scaler: torch.amp.GradScaler
    batches: list
    steps: list

    def weights(self) -> tuple:
        """A copy of each optimizer's parameters, flattened."""
        return tuple(torch.cat([p.detach().reshape(-1) for p in _params(o)]).clone() for o in self.optimizers)


def _setup(seed: int = 0, *, iterations: int = 1, micro_batches: int = 1, optimizers: int = 1, spikes=(),
           offset: float = 0.0, lr: float = 0.05, init_scale: float = PART1_SCALE, growth_interval: int = 2000,
           scaler_class=torch.amp.GradScaler, model_seed: int | None = None) -> _Setup:
    """A fresh problem. ``spikes``: (iteration, micro-batch, part) triples, part ``"a"``, ``"b"`` or
    ``"ab"``: those targets shifted by ``SPIKE``. ``offset`` shifts every target (``LARGE_TARGETS``:
    a run whose scale settles at 256). The model's initialisation comes from ``model_seed``
    (``seed`` unless given), the data from ``seed + 1``; the caller's random state is left alone."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed if model_seed is None else model_seed)
        model = LoopNet()
    gen = torch.Generator().manual_seed(seed + 1)
    teacher = torch.randn(4, 4, generator=gen) * 0.5
    batches = []
    for _ in range(iterations):
        micro = []
        for _ in range(micro_batches):
            x = torch.randn(8, 4, generator=gen)
            micro.append((x, x @ teacher + offset))
        batches.append(micro)
    for i, j, parts in spikes:
        x, y = batches[i][j]
        y = y.clone()
        for part in parts:
            cols = slice(0, 2) if part == "a" else slice(2, 4)
            y[:, cols] += SPIKE
        batches[i][j] = (x, y)
    if optimizers == 1:
        opts = [torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)]
    else:
        opts = [torch.optim.SGD(getattr(model, part).parameters(), lr=lr, momentum=0.9) for part in _PARTS]
    steps = [0] * len(opts)
    for k, opt in enumerate(opts):
        opt.register_step_post_hook(lambda o, args, kwargs, k=k: steps.__setitem__(k, steps[k] + 1))
    scaler = scaler_class("cpu", init_scale=init_scale, growth_interval=growth_interval)
    return _Setup(model, opts, scaler, batches, steps)


def _error(exc: BaseException) -> str:
    """``Type: first line of the message`` (the type alone when the message is empty or unreadable)."""
    try:
        lines = str(exc).strip().splitlines()
    except Exception:  # noqa: BLE001 - an exception whose __str__ fails is still named
        lines = []
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


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
        return f"b's gradient × {number(float(mine.norm() / right.norm()))} of the right one"
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
        rows = [("unscale_ → clip → step (right)", number(self.norm), number(self.applied_right)),
                ("clip → step (unscales after clipping)", number(self.seen_before_unscale),
                 number(self.applied_wrong))]
        return Table(("order", "norm clip_grad_norm_ saw", "norm of the gradient applied"), rows,
                     title=f"clip_grad_norm_(max_norm={number(self.max_norm)}) at scale {number(self.scale)}: "
                           f"the norm seen before unscale_ is {number(self.ratio)} × too large")

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
        rows = [("‖g‖² unscaled by hand (right)", number(self.penalty), "1"),
                ("‖g‖² of the scaled gradients", number(self.wrong_penalty),
                 number(self.wrong_penalty / self.penalty, pow2=True)),
                ("‖g‖ unscaled by hand (right)", number(self.norm), "1"),
                ("‖g‖ of the scaled gradients", number(self.wrong_norm),
                 number(self.wrong_norm / self.norm, pow2=True))]
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
# Part 2: the loop checker
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """An adversarial run for a learner's ``train_step``: ``iterations`` optimizer steps of
    ``micro_batches`` micro-batches, ``optimizers`` optimizers (1, or 2: one per part), loss
    ``spikes`` as (iteration, micro-batch, parts), targets shifted by ``offset``, a scaler with
    ``init_scale`` and ``growth_interval``, clipping at ``max_norm`` (None: none), a checkpoint
    after ``resume_after`` iterations (None: none), and the hint given when the numbers differ."""

    name: str
    title: str
    hint: str
    iterations: int = 6
    micro_batches: int = 1
    optimizers: int = 1
    spikes: tuple = ()
    offset: float = 0.0
    lr: float = 0.05
    init_scale: float = 2.0**8
    growth_interval: int = 2
    max_norm: float | None = None
    resume_after: int | None = None

    def __post_init__(self):
        for name in ("name", "title", "hint"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"{name} must be a string, not {_shown(getattr(self, name))}")
        iterations = _whole("iterations", self.iterations, 1, MAX_ITERATIONS)
        micro = _whole("micro_batches", self.micro_batches, 1, MAX_MICRO_BATCHES)
        optimizers = _whole("optimizers", self.optimizers, 1, 2)
        spikes = self.spikes
        if isinstance(spikes, (str, bytes)) or not isinstance(spikes, (tuple, list)):
            raise TypeError(f"spikes must be a tuple of (iteration, micro_batch, parts) triples, e.g. ((2, 0, 'ab'),), "
                            f"not {_shown(spikes)}")
        checked = []
        for spike in spikes:
            if not isinstance(spike, (tuple, list)) or len(spike) != 3:
                raise TypeError(f"each spike must be (iteration, micro_batch, parts), e.g. (2, 0, 'ab'), "
                                f"not {_shown(spike)}")
            i = _whole("a spike's iteration", spike[0], 0, iterations - 1)
            j = _whole("a spike's micro-batch", spike[1], 0, micro - 1)
            parts = spike[2]
            if not isinstance(parts, str) or not parts or set(parts) - set(_PARTS):
                raise ValueError(f"a spike's parts must be 'a', 'b' or 'ab' (the parts whose targets jump), "
                                 f"not {_shown(parts)}")
            checked.append((i, j, parts))
        offset, lr = _real("offset", self.offset), _real("lr", self.lr)
        if not abs(offset) <= 1e3:
            raise ValueError(f"offset must be a number from -1000 to 1000, not {_shown(self.offset)}")
        if not 0 <= lr <= 1:
            raise ValueError(f"lr must be a number from 0 to 1, not {_shown(self.lr)}")
        init_scale = _real("init_scale", self.init_scale)
        if not 2.0**-24 <= init_scale <= 2.0**24:
            raise ValueError(f"init_scale must be a number from 2^-24 to 2^24, not {_shown(self.init_scale)}")
        growth_interval = _whole("growth_interval", self.growth_interval, 1, 10**6)
        max_norm = self.max_norm
        if max_norm is not None:
            max_norm = _real("max_norm", max_norm)
            if not 0 < max_norm < math.inf:
                raise ValueError(f"max_norm must be a number > 0 (or None: no clipping), not {_shown(self.max_norm)}")
        resume = self.resume_after
        if resume is not None:
            resume = _whole("resume_after", resume, 1, iterations - 1) if iterations > 1 else None
            if resume is None:
                raise ValueError("resume_after needs at least 2 iterations (a checkpoint between two of them)")
        for name, value in (("iterations", iterations), ("micro_batches", micro), ("optimizers", optimizers),
                            ("spikes", tuple(checked)),
                            ("offset", offset), ("lr", lr), ("init_scale", init_scale),
                            ("growth_interval", growth_interval), ("max_norm", max_norm), ("resume_after", resume)):
            object.__setattr__(self, name, value)


#: The checker's scenarios by name (read-only; ``dataclasses.replace`` one to vary it).
SCENARIOS = MappingProxyType({s.name: s for s in (
    Scenario("overflow", "a loss spike at iteration 2", spikes=((2, 0, "ab"),),
             hint="the step whose gradients overflowed must be skipped and the scale halved: step through "
                  "scaler.step(optimizer) and call scaler.update() once per step"),
    Scenario("accumulation", "2 micro-batches per step, a spike in the second of iteration 2", micro_batches=2,
             spikes=((2, 1, "ab"),),
             hint="accumulate: zero the gradients once per step, scaler.scale(loss / len(batches)).backward() for "
                  "every micro-batch, then unscale_/step/update once"),
    Scenario("two_optimizers", "two optimizers, part a's gradients overflow at iteration 2", optimizers=2,
             spikes=((2, 0, "a"),),
             hint="with several optimizers: scaler.step(opt) for each, then one scaler.update() after all of them"),
    Scenario("resume", "a checkpoint after iteration 5 of a run whose scale settled at 256, resumed in fresh "
                       "objects", iterations=10, offset=LARGE_TARGETS, lr=1e-3, init_scale=2.0**10, growth_interval=3,
             resume_after=6,
             hint="save and restore the model's, every optimizer's and the scaler's state_dict()"),
    Scenario("clipping", "gradient clipping at max_norm=0.5", max_norm=0.5,
             hint="clip after scaler.unscale_(optimizer) and before scaler.step(optimizer): clipping the scaled "
                  "gradients clips a norm S times too large"),
)})


class _LoopSpy(_SpyScaler):
    """A real GradScaler that also records which optimizers were stepped through it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.stepped = set()

    def step(self, optimizer, *args, **kwargs):
        self.stepped.add(id(optimizer))
        return super().step(optimizer, *args, **kwargs)


class _Trace:
    """What a run did after each iteration (weights, scale, skipped per optimizer) and what the
    spies saw in it (autocast, scale/update calls, stale or lost gradients, steps that bypassed
    the scaler); ``error``/``error_at``: what it raised, and in which iteration (or "save"/"load")."""

    def __init__(self):
        self.weights, self.scales, self.skipped, self.findings = [], [], [], []
        self.error, self.error_at, self.after_load = None, None, None


def _watch(s: _Setup, finding: dict):
    """Spies on the model: autocast in the forward pass; the gradient a parameter holds when a
    backward pass reaches it (stale at the first of a step, lost at a later one)."""
    model = s.model

    def forward_hook(module, args, output):
        finding["forwards"] += 1
        if torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.float16:
            finding["autocast"] += 1

    handles = [model.a.register_forward_hook(forward_hook)]
    for p in model.parameters():
        def hook(grad, p=p):
            seen = finding["backwards"].get(id(p), 0)
            holds = p.grad is not None and bool(p.grad.ne(0).any())
            if seen == 0 and holds:
                finding["stale"] = True
            if seen > 0 and not holds:
                finding["lost"] = True
            finding["backwards"][id(p)] = seen + 1
        handles.append(p.register_hook(hook))
    return handles


def _new_finding() -> dict:
    return {"forwards": 0, "autocast": 0, "backwards": {}, "stale": False, "lost": False, "scale": 0,
            "update": 0, "bypassed": False}


def _iterate(step, s: _Setup, scenario: Scenario, iterations, trace: _Trace) -> bool:
    """Run ``step`` over ``iterations`` of ``s``, recording into ``trace``; False once it raised."""
    for i in iterations:
        finding = _new_finding()
        handles = _watch(s, finding)
        calls = dict(s.scaler.calls)
        s.scaler.stepped = set()
        before = list(s.steps)
        try:
            step(s.model, s.optimizers, s.scaler, s.batches[i], scenario.max_norm)
        except Exception as exc:  # noqa: BLE001 - whatever the learner's step raises is the verdict
            trace.error, trace.error_at = exc, i
            return False
        finally:
            for h in handles:
                h.remove()
        finding["scale"] = s.scaler.calls["scale"] - calls["scale"]
        finding["update"] = s.scaler.calls["update"] - calls["update"]
        finding["bypassed"] = any(after > b and id(opt) not in s.scaler.stepped
                                  for opt, after, b in zip(s.optimizers, s.steps, before))
        trace.findings.append(finding)
        trace.weights.append(torch.cat([w for w in s.weights()]))
        trace.scales.append(float(s.scaler.get_scale()))
        trace.skipped.append(tuple(after == b for after, b in zip(s.steps, before)))
    return True


def _state_after_load(saved: _Setup, fresh: _Setup) -> dict:
    """What a load restored, part by part, compared with the objects that were saved."""
    def opt_state(opt):
        return [t for st in opt.state_dict()["state"].values() for t in st.values() if isinstance(t, torch.Tensor)]

    same_opt = all(len(opt_state(a)) == len(opt_state(b)) and
                   all(torch.equal(x, y) for x, y in zip(opt_state(a), opt_state(b)))
                   for a, b in zip(saved.optimizers, fresh.optimizers))
    return {"model": all(torch.equal(a, b) for a, b in zip(saved.weights(), fresh.weights())),
            "optimizers": same_opt,
            "scale": (float(saved.scaler.get_scale()), float(fresh.scaler.get_scale())),
            "tracker": (int(saved.scaler._get_growth_tracker()), int(fresh.scaler._get_growth_tracker()))}


def _run_scenario(step, scenario: Scenario, save, load) -> _Trace:
    """One scenario with ``step`` (and ``save``/``load`` at the checkpoint), on a fresh problem."""
    trace = _Trace()

    def make(model_seed=None):
        spikes = tuple(scenario.spikes)
        return _setup(0, iterations=scenario.iterations, micro_batches=scenario.micro_batches,
                      optimizers=scenario.optimizers, spikes=spikes, offset=scenario.offset, lr=scenario.lr,
                      init_scale=scenario.init_scale, growth_interval=scenario.growth_interval,
                      scaler_class=_LoopSpy, model_seed=model_seed)

    s = make()
    cut = scenario.iterations if scenario.resume_after is None else scenario.resume_after
    if not _iterate(step, s, scenario, range(cut), trace) or scenario.resume_after is None:
        return trace
    fresh = make(model_seed=1)  # another initialisation: the checkpoint must restore the weights
    try:
        checkpoint = copy.deepcopy(save(s.model, s.optimizers, s.scaler))  # as a file would hold it
    except Exception as exc:  # noqa: BLE001 - the learner's save raising is the verdict
        trace.error, trace.error_at = exc, "save"
        return trace
    try:
        load(checkpoint, fresh.model, fresh.optimizers, fresh.scaler)
    except Exception as exc:  # noqa: BLE001 - the learner's load raising is the verdict
        trace.error, trace.error_at = exc, "load"
        return trace
    trace.after_load = _state_after_load(s, fresh)
    _iterate(step, fresh, scenario, range(cut, scenario.iterations), trace)
    return trace


class ScenarioResult(NamedTuple):
    """One scenario's verdict: ``status`` "ok", "wrong" or "not checked"; ``message``: one line,
    what is wrong and how to fix it; ``iteration``: the first iteration that went wrong (or None);
    ``scales``/``reference_scales``: the scale after each iteration."""

    name: str
    title: str
    status: str
    message: str
    iteration: int | None = None
    scales: tuple = ()
    reference_scales: tuple = ()


def _explained(exc: BaseException, where, scenario: Scenario) -> str:
    """What was raised, where, and how to fix it (``ampviz.explain``; with gradient accumulation
    also the scenario's hint, since an error there is usually one call made per micro-batch)."""
    at = f"in {where}(...)" if where in ("save", "load") else f"in iteration {where}"
    found = explain(exc)
    fix = f" Fix: {found.fix}" if found.known else ""
    if scenario.micro_batches > 1 and where not in ("save", "load"):
        fix += f" With {scenario.micro_batches} micro-batches per step: {scenario.hint}."
    return f"raised {_error(exc)} ({at}).{fix}"


def _diagnose(trace: _Trace, ref: _Trace, scenario: Scenario, i: int) -> str:
    """The first thing the spies saw go wrong, else what differs and the scenario's hint."""
    for k, f in enumerate(trace.findings[:i + 1]):
        if f["forwards"] == 0:
            return f"iteration {k} never ran the model: the loss is model(x, y), for each (x, y) in batches"
        if f["autocast"] < f["forwards"]:
            return (f"iteration {k} ran the model outside torch.autocast(\"cpu\", dtype=torch.float16): "
                    "compute the loss under autocast")
        if f["scale"] == 0:
            return f"iteration {k} never called scaler.scale: backward from scaler.scale(loss), not from loss"
        if f["stale"]:
            return (f"iteration {k} started with the previous step's gradients: zero them once per step "
                    "(optimizer.zero_grad() for every optimizer)")
        if f["lost"]:
            return (f"iteration {k} zeroed the gradients between micro-batches: zero them once, before the "
                    "first micro-batch")
        if f["update"] != 1:
            return (f"iteration {k} called scaler.update() {f['update']} times: call it once per step, after "
                    "every optimizer's scaler.step")
        if f["bypassed"]:
            what = (f"in iteration {i} the gradients overflowed and it stepped anyway"
                    if any(r and not m for m, r in zip(trace.skipped[i], ref.skipped[i])) else
                    f"after iteration {i} the weights differ")
            return (f"the loop calls optimizer.step() itself: {what}; step with scaler.step(optimizer), which "
                    "skips a step whose gradients overflowed")
    if scenario.resume_after is not None and i >= scenario.resume_after and trace.after_load:
        loaded = trace.after_load
        if loaded["scale"][0] != loaded["scale"][1] or loaded["tracker"][0] != loaded["tracker"][1]:
            after = slice(scenario.resume_after, None)
            mine, theirs = sum(map(any, trace.skipped[after])), sum(map(any, ref.skipped[after]))
            return (f"the scaler's state was not restored: after loading, the scale is {number(loaded['scale'][1])} "
                    f"(growth tracker {loaded['tracker'][1]}) where it was saved at {number(loaded['scale'][0])} "
                    f"({loaded['tracker'][0]}), and {mine} of the next {len(trace.skipped[after])} steps were "
                    f"skipped (the reference skipped {theirs}): save scaler.state_dict() in the checkpoint and "
                    "restore it with scaler.load_state_dict(...)")
        if not loaded["model"]:
            return "after loading, the weights are not those saved: save model.state_dict() and load it"
        if not loaded["optimizers"]:
            return ("after loading, the optimizers' state (momentum) is not that saved: save each "
                    "optimizer.state_dict() and load it")
    what = []
    if trace.skipped[i] != ref.skipped[i]:
        parts = [f"{_PARTS[k] if len(trace.skipped[i]) > 1 else 'the optimizer'} "
                 f"{'skipped' if mine else 'stepped'} where the reference {'skipped' if theirs else 'stepped'}"
                 for k, (mine, theirs) in enumerate(zip(trace.skipped[i], ref.skipped[i])) if mine != theirs]
        what.append("; ".join(parts))
    if not _same_float(trace.scales[i], ref.scales[i]):
        what.append(f"scale {number(trace.scales[i])}, the reference's {number(ref.scales[i])}")
    if not what:
        what.append("the weights differ")
    return f"after iteration {i}: {', '.join(what)}: {scenario.hint}"


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit (so NaN equals the same NaN, and 0.0 differs from -0.0)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.int32), b.view(torch.int32))


def _same_float(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _compare(trace: _Trace, ref: _Trace, scenario: Scenario) -> ScenarioResult:
    base = dict(name=scenario.name, title=scenario.title, scales=tuple(trace.scales),
                reference_scales=tuple(ref.scales))
    if ref.error is not None:  # never: the reference runs every scenario (tested)
        raise RuntimeError(f"the reference raised in scenario {scenario.name}: {_error(ref.error)}")
    for i in range(len(trace.weights)):
        if not (_same_bits(trace.weights[i], ref.weights[i]) and _same_float(trace.scales[i], ref.scales[i])
                and trace.skipped[i] == ref.skipped[i]):
            return ScenarioResult(status="wrong", message=_diagnose(trace, ref, scenario, i), iteration=i, **base)
    if trace.error is not None:
        return ScenarioResult(status="wrong", message=_explained(trace.error, trace.error_at, scenario),
                              iteration=scenario.resume_after if trace.error_at in ("save", "load") else trace.error_at,
                              **base)
    return ScenarioResult(status="ok", message="ok", **base)


@dataclass(frozen=True, eq=False)
class CheckReport:
    """``check_loop``'s answer: one ``ScenarioResult`` per scenario and an overall ``verdict``."""

    results: tuple

    @property
    def ok(self) -> bool:
        return all(r.status == "ok" for r in self.results)

    @property
    def verdict(self) -> str:
        wrong = [r.name for r in self.results if r.status == "wrong"]
        unchecked = [r.name for r in self.results if r.status == "not checked"]
        if wrong:
            return f"{len(wrong)} of {len(self.results)} scenarios wrong: {', '.join(wrong)}"
        if unchecked:
            return f"every checked scenario ok; not checked: {', '.join(unchecked)}"
        return f"all {len(self.results)} scenarios ok"

    def __getitem__(self, name: str) -> ScenarioResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(f"{_shown(name)}: one of {', '.join(_shown(r.name) for r in self.results)}")

    @property
    def table(self) -> Table:
        return Table(("scenario", "result"), [(r.name, r.message) for r in self.results], title=self.verdict)

    def __str__(self) -> str:
        return str(self.table)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return self.table._repr_html_()


def _scenarios(scenarios) -> list:
    """The scenarios to run: all for None; names of ``SCENARIOS`` or ``Scenario``s."""
    if scenarios is None:
        return list(SCENARIOS.values())
    if isinstance(scenarios, (str, Scenario)):
        scenarios = [scenarios]
    if not isinstance(scenarios, (list, tuple)):
        raise TypeError(f"scenarios must be a list of scenario names ({', '.join(SCENARIOS)}) or Scenarios, "
                        f"or None for all, not {_shown(scenarios)}")
    if len(scenarios) > MAX_SCENARIOS:
        raise ValueError(f"scenarios must list at most {MAX_SCENARIOS}, not {len(scenarios)}")
    out = []
    for item in scenarios:
        if isinstance(item, Scenario):
            out.append(item)
        elif isinstance(item, str) and item in SCENARIOS:
            out.append(SCENARIOS[item])
        else:
            raise ValueError(f"unknown scenario {_shown(item)}: use {', '.join(SCENARIOS)} or a Scenario "
                             "(e.g. dataclasses.replace(SCENARIOS['overflow'], spikes=((4, 0, 'ab'),)))")
    return out


def _callable(name: str, fn, signature: str):
    if fn is not None and not callable(fn):
        raise TypeError(f"{name} must be a function {signature}, not {_shown(fn)}")
    return fn


def check_loop(train_step, *, save=None, load=None, scenarios=None) -> CheckReport:
    """Run ``train_step(model, optimizers, scaler, batches, max_norm)`` through ``scenarios`` (all
    of ``SCENARIOS`` for None; names, or ``Scenario`` objects such as
    ``dataclasses.replace(SCENARIOS["overflow"], spikes=((4, 0, "ab"),))`` for a spike at another
    step) beside ``reference_step``, and compare the weights, the scale and which optimizer steps
    were skipped after every iteration, bit for bit.

    ``train_step`` does one optimizer step: ``model(x, y)`` is the loss of a micro-batch (run it
    under ``torch.autocast("cpu", dtype=torch.float16)``), ``batches`` the step's micro-batches,
    ``optimizers`` a list, ``scaler`` a ``torch.amp.GradScaler("cpu")``, ``max_norm`` a norm to
    clip the gradients to, or None. The resume scenario needs ``save(model, optimizers, scaler)``
    (returns the checkpoint) and ``load(checkpoint, model, optimizers, scaler)``: the checkpoint is
    deep-copied between them, as writing it to disk would; without them it is not checked.
    Errors ``train_step`` raises are explained with ``ampviz.explain``.
    """
    _callable("train_step", train_step, "train_step(model, optimizers, scaler, batches, max_norm)")
    if train_step is None:
        raise TypeError("train_step must be a function train_step(model, optimizers, scaler, batches, max_norm), "
                        "not None")
    _callable("save", save, "save(model, optimizers, scaler) -> checkpoint")
    _callable("load", load, "load(checkpoint, model, optimizers, scaler)")
    chosen = _scenarios(scenarios)
    results = []
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        torch.manual_seed(0)
        for scenario in chosen:
            if scenario.resume_after is not None and (save is None or load is None):
                results.append(ScenarioResult(scenario.name, scenario.title, "not checked",
                                              "not checked: pass save= and load= (your checkpoint functions)"))
                continue
            trace = _run_scenario(train_step, scenario, save, load)
            ref = _run_scenario(reference_step, scenario, save_checkpoint, load_checkpoint)
            results.append(_compare(trace, ref, scenario))
    return CheckReport(tuple(results))


# --------------------------------------------------------------------------------------------
# Classic mistakes, to run through the checker
# --------------------------------------------------------------------------------------------


def _step_with(*, zero="once", scaled=True, update="once", unscale="to clip", clip="after unscale_",
               via_scaler=True, autocast=True, divide=True):
    """``reference_step`` with one thing (or none) done otherwise (the choices of ``MISTAKES``)."""

    def train_step(model, optimizers, scaler, batches, max_norm=None):
        if zero == "once":
            for opt in optimizers:
                opt.zero_grad()
        for j, (x, y) in enumerate(batches):
            if zero == "each micro-batch":
                for opt in optimizers:
                    opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16, enabled=autocast):
                loss = model(x, y) / (len(batches) if divide else 1)
            (scaler.scale(loss) if scaled else loss).backward()
            if unscale == "each micro-batch":
                for opt in optimizers:
                    scaler.unscale_(opt)
            if update == "each micro-batch" and j < len(batches) - 1:
                scaler.update()
        for opt in optimizers:
            if max_norm is not None and clip == "before unscale_":
                torch.nn.utils.clip_grad_norm_(_params(opt), max_norm)
            if unscale == "twice" or (unscale == "to clip" and (max_norm is not None or not via_scaler)):
                scaler.unscale_(opt)
            if max_norm is not None and clip == "after unscale_":
                torch.nn.utils.clip_grad_norm_(_params(opt), max_norm)
            if unscale == "twice":
                scaler.unscale_(opt)
            if via_scaler:
                scaler.step(opt)
            else:
                opt.step()
            if update == "each optimizer":
                scaler.update()
        if update in ("once", "each micro-batch"):
            scaler.update()

    return train_step


def _load_without(part: str):
    """``load_checkpoint`` that leaves out one part: "model", "optimizers" or "scaler"."""

    def load(checkpoint, model, optimizers, scaler):
        if part != "model":
            model.load_state_dict(checkpoint["model"])
        if part != "optimizers":
            for optimizer, state in zip(optimizers, checkpoint["optimizers"]):
                optimizer.load_state_dict(state)
        if part != "scaler":
            scaler.load_state_dict(checkpoint["scaler"])

    return load


_MISTAKES = {
    "update() after every micro-batch": dict(step=dict(update="each micro-batch")),
    "unscale_ after every micro-batch": dict(step=dict(unscale="each micro-batch")),
    "micro-batch losses not divided": dict(step=dict(divide=False)),
    "zero_grad() before every micro-batch": dict(step=dict(zero="each micro-batch")),
    "no zero_grad()": dict(step=dict(zero="never")),
    "update() after each optimizer": dict(step=dict(update="each optimizer")),
    "no update()": dict(step=dict(update="never")),
    "unscale_ twice": dict(step=dict(unscale="twice")),
    "clip before unscale_": dict(step=dict(clip="before unscale_")),
    "loss.backward() without scale": dict(step=dict(scaled=False)),
    "optimizer.step() instead of scaler.step": dict(step=dict(via_scaler=False)),
    "no autocast": dict(step=dict(autocast=False)),
    "resume without the scaler's state": dict(load="scaler"),
    "resume without the model's state": dict(load="model"),
    "resume without the optimizers' state": dict(load="optimizers"),
}
#: The classic mistakes ``mistaken_loop`` writes, by name.
MISTAKES = tuple(_MISTAKES)


def mistaken_loop(mistake: str) -> dict:
    """A loop with one classic mistake (one of ``MISTAKES``), everything else as ``reference_step``,
    ``save_checkpoint`` and ``load_checkpoint`` do it: ``{"train_step": ..., "save": ..., "load": ...}``,
    to pass on as ``check_loop(**mistaken_loop(mistake))``."""
    if not isinstance(mistake, str) or mistake not in _MISTAKES:
        raise ValueError(f"unknown mistake {_shown(mistake)}: use one of {', '.join(repr(m) for m in MISTAKES)}")
    spec = _MISTAKES[mistake]
    load = _load_without(spec["load"]) if "load" in spec else load_checkpoint
    return {"train_step": _step_with(**spec.get("step", {})), "save": save_checkpoint, "load": load}


def check_train_loop(answer) -> Check:
    """Q: write ``train_step(model, optimizers, scaler, batches, max_norm)`` (gradient
    accumulation, several optimizers, clipping) and, to check resuming too, ``save`` and ``load``:
    ``answer = train_step`` or ``answer = (train_step, save, load)``. The checker runs
    ``check_loop`` and answers with its verdict: ✓, or the first wrong scenario's line."""
    if answer is None or answer is Ellipsis:
        return check(None, None)
    save = load = None
    if isinstance(answer, (tuple, list)):
        if len(answer) != 3 or not all(callable(f) for f in answer):
            return Check("wrong", "✗ not quite: answer = train_step, or answer = (train_step, save, load): "
                                  "three functions")
        answer, save, load = answer
    if not callable(answer):
        return Check("wrong", "✗ not quite: set answer = train_step, the function itself (no call, no quotes)")
    report = check_loop(answer, save=save, load=load)
    wrong = [r for r in report.results if r.status == "wrong"]
    if wrong:
        return Check("wrong", f"✗ not quite: {wrong[0].name}: {wrong[0].message}")
    if not report.ok:
        return Check("right", "✓ correct (resume not checked: answer = (train_step, save, load) checks it too)")
    return Check("right", "✓ correct")


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
