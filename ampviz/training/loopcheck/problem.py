"""The problem every loop of ``ampviz.training.loopcheck`` trains, the right loop, and what its reports and
its checker share (``ampviz.training.loopcheck`` tells the whole story and re-exports the public names).

``LoopNet``: two linear parts fit by mean squared error under CPU float16 autocast;
``reference_step``: one correct optimizer step with a GradScaler (gradient accumulation, several
optimizers, clipping, a gradient penalty, learning-rate schedulers); ``save_checkpoint`` and
``load_checkpoint``; ``_setup``: a fresh seeded problem (model, optimizers, scaler, batches with
loss spikes, the optimizer steps that really ran); ``_measured``/``_factor``: measured values as
the tables print them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ampviz.text import measured, number
from ampviz._args import _shown
from ampviz._args import _real

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


def reference_step(model, optimizers, scaler, batches, max_norm=None, penalty=0.0, schedulers=()):
    """One correct optimizer step with a GradScaler (the model answer of the loop exercise).

    ``batches``: the micro-batches ``(x, y)`` of this step (gradient accumulation when there are
    several); ``optimizers``: a list (one per part of the model, or one for all); ``max_norm``:
    clip each optimizer's gradients to this norm, or None. Zero the gradients once, scale every
    micro-batch's loss (divided by the number of micro-batches: the step's loss is their mean),
    then per optimizer ``unscale_`` (only to clip) and ``step``, and ``update()`` once.

    ``penalty``: add ``penalty × ‖∇loss‖²`` to each micro-batch's loss as torch's AMP example
    does: the gradients of ``scaler.scale(loss)`` (``create_graph=True``) times
    ``1 / scaler.get_scale()``. ``schedulers``: learning-rate schedulers, stepped after a step
    that ran (the scale did not drop across ``update()``), not after a skipped one.
    """
    _step_args(model, optimizers, scaler, batches, max_norm, penalty, schedulers)
    for optimizer in optimizers:
        optimizer.zero_grad()
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(x, y) / len(batches)
        if penalty:
            scaled_grads = torch.autograd.grad(scaler.scale(loss), list(model.parameters()), create_graph=True)
            inv_scale = 1.0 / scaler.get_scale()
            grads = [g * inv_scale for g in scaled_grads]
            with torch.autocast("cpu", dtype=torch.float16):
                loss = loss + penalty * sum(g.pow(2).sum() for g in grads)
        scaler.scale(loss).backward()
    for optimizer in optimizers:
        if max_norm is not None:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(_params(optimizer), max_norm)
        scaler.step(optimizer)
    scale = scaler.get_scale()
    scaler.update()
    if scaler.get_scale() >= scale:
        for scheduler in schedulers:
            scheduler.step()


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


def _step_args(model, optimizers, scaler, batches=None, max_norm=None, penalty=0.0, schedulers=()):
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
    if not 0 <= _real("penalty", penalty) < math.inf:
        raise ValueError(f"penalty must be a number >= 0 (0: no gradient penalty), not {_shown(penalty)}")
    if not isinstance(schedulers, (list, tuple)) or not all(
            isinstance(s, torch.optim.lr_scheduler.LRScheduler) and s.optimizer in optimizers for s in schedulers):
        raise TypeError(f"schedulers must be a list of torch.optim.lr_scheduler schedulers of these optimizers, "
                        f"not {_shown(schedulers)}")


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
    schedulers: list

    def weights(self) -> tuple:
        """A copy of each optimizer's parameters, flattened."""
        return tuple(torch.cat([p.detach().reshape(-1) for p in _params(o)]).clone() for o in self.optimizers)


def _setup(seed: int = 0, *, iterations: int = 1, micro_batches: int = 1, optimizers: int = 1, spikes=(),
           offset: float = 0.0, lr: float = 0.05, init_scale: float = PART1_SCALE, growth_interval: int = 2000,
           scaler_class=torch.amp.GradScaler, model_seed: int | None = None, scheduler: bool = False) -> _Setup:
    """A fresh problem. ``spikes``: (iteration, micro-batch, part) triples, part ``"a"``, ``"b"`` or
    ``"ab"``: those targets shifted by ``SPIKE``. ``offset`` shifts every target (``LARGE_TARGETS``:
    a run whose scale settles at 256). The model's initialisation comes from ``model_seed``
    (``seed`` unless given), the data from ``seed + 1``; the caller's random state is left alone.
    ``scheduler``: a ``StepLR(step_size=1, gamma=0.5)`` per optimizer."""
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
    schedulers = [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5) for opt in opts] if scheduler else []
    return _Setup(model, opts, scaler, batches, steps, schedulers)


def _error(exc: BaseException) -> str:
    """``Type: first line of the message`` (the type alone when the message is empty or unreadable)."""
    try:
        lines = str(exc).strip().splitlines()
    except Exception:  # noqa: BLE001 - an exception whose __str__ fails is still named
        lines = []
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


# --------------------------------------------------------------------------------------------
# Display
# --------------------------------------------------------------------------------------------


def _measured(x, *, pow2: bool = False) -> str:
    """A value torch computed, at the 4 digits the lessons need, the same text on every CPU
    (``ampviz.text.measured``: a value on a rounding boundary raises rather than print digits
    another CPU may not); with ``pow2``, a power of two at those digits as 2^k."""
    return measured(x, digits=4, pow2=pow2)


def _factor(x, *, pow2: bool = False) -> str:
    """A ratio of two measured values: a power of two as ``number`` prints it (a ratio that comes
    out exactly 2^k is one value scaled by 2^k from the other, which is exact on every CPU), any
    other as ``_measured``."""
    exact = math.isfinite(x) and x != 0 and math.frexp(abs(x))[0] == 0.5
    return number(x, pow2=pow2) if exact else _measured(x)
