"""Live mixed-precision training of two tiny models, one step at a time, with a census of the gradients.

``train_steps(TrainConfig(...))`` is a generator: it trains a small seeded model and yields one
``StepRecord`` per step (loss, loss scale, skipped step, gradient norm, step time and, every
``census_every`` steps, how each parameter's gradient and each watched module's output gradient
land in fp16 at the current scale). ``run_training`` collects the records into a ``Run`` that can be
written to CSV or JSON as it grows and read back with ``load_run``, so a run survives a kernel restart.
``ampviz/__init__.py`` never imports this module, so ``import ampviz`` stays free of torch.

Modes (one training loop for all; only the autocast dtype, the scaler and the weights' dtype change)
----------------------------------------------------------------------------------------------------
``"fp32"``: plain float32. ``"fp16"``: ``torch.autocast`` in float16, no loss scaler.
``"fp16+scaler"``: the same with ``torch.amp.GradScaler(device_type)``. ``"bf16"``: autocast in
bfloat16. ``"half"``: ``model.half()`` and float16 inputs, no autocast and no float32 master weights
(the optimizer updates the float16 weights themselves).

Autocast in float16 runs on the CPU too (torch 2.13: ``torch.autocast("cpu", dtype=torch.float16)``
makes ``nn.Linear`` outputs float16), so every mode runs on a machine without a GPU. Its op table
differs from CUDA's (on the CPU ``layer_norm`` and ``softmax`` are not upcast to float32;
``cross_entropy`` is, so the loss under autocast is a float32 scalar on both).

This module holds the training loop (``train_steps``, ``run_training``, ``failure_sentence``) and
``trained_parameter``; the rest lives beside it, and its public API is re-exported here:

* ``config``: ``MODES``, ``MODELS``, ``TrainConfig``, ``ScalerControl``, ``resolve_device``,
  ``describe_device``.
* ``models``: the models and their data (``SequenceClassifier``, ``Task``, ``build_task``).
* ``activations``: what the gradient census sees, and the hooks that take it.
* ``records``: ``StepRecord``, ``Run``, their CSV and JSON files, ``load_run``.
"""

from __future__ import annotations

import contextlib
import csv
import math
import time

import numpy as np
import torch
from torch import nn

from ampviz._args import _shown, _whole as _strict_whole
from ampviz.training import MLP  # noqa: F401 (the plain MLP of notebook 07's frozen-weights experiment)
from ampviz.training.live.config import (MODELS, MODES, ScalerControl, TrainConfig, _AUTOCAST,
    _check_scaler_settings, describe_device, resolve_device)
from ampviz.training.live.models import Task, build_task
from ampviz.training.live.activations import _ActivationWatch, _census_at
from ampviz.training.live.records import (Run, StepRecord, _CENSUSES, _CSV_COLUMNS, _SCALARS, _csv_cell,
    load_run)

__all__ = [
    "MODES",
    "MODELS",
    "TrainConfig",
    "StepRecord",
    "ScalerControl",
    "Run",
    "Task",
    "build_task",
    "describe_device",
    "resolve_device",
    "train_steps",
    "run_training",
    "load_run",
    "failure_sentence",
    "NonFiniteLoss",
]


# ------------------------------------------------------------------ the training loop
def train_steps(config: TrainConfig, control: ScalerControl | None = None, *, model: nn.Module | None = None):
    """Train as ``config`` says, yielding one ``StepRecord`` per step (a generator).

    ``control`` lets another thread change the scaler settings or stop the run between steps.
    ``model`` replaces the task's model (it must take the task's inputs); it is moved to the device,
    and converted with ``.half()`` in "half" mode, in place. An exception inside the run (a
    non-finite loss in any mode but "fp16+scaler", where the scaler skips such steps; out of memory;
    ...) ends it with a last record whose ``error`` says what happened, instead of raising. Hooks are
    removed when the run ends, fails, or the generator is closed.
    """
    device = resolve_device(config.device)
    task = build_task(config.model, config.seed, config.batch_size)
    if model is not None:
        task.model = model
    watch = task.watch if config.watch is None else config.watch
    return _steps(config, control, device, task, watch)


def _steps(config, control, device, task, watch):
    mode = config.mode
    model = task.model.to(device)
    if mode == "half":
        model.half()
    model.train()
    if task.optimizer == "adam":
        optimizer = torch.optim.Adam(model.parameters(), lr=config.learning_rate)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=config.learning_rate, momentum=0.9)
    scaler = None
    if config.uses_scaler:
        scaler = torch.amp.GradScaler(device.type, init_scale=config.init_scale,
                                      growth_factor=config.growth_factor,
                                      backoff_factor=config.backoff_factor,
                                      growth_interval=config.growth_interval)
    autocast_dtype = _AUTOCAST.get(mode)
    names = [n for n, _ in model.named_parameters()]
    acts = _ActivationWatch(model, watch)
    step = 0
    try:
        for step in range(config.steps):
            if control is not None:
                if control.stopped:
                    return
                if scaler is not None:
                    for key, value in control.take().items():
                        getattr(scaler, f"set_{key}")(value)
            take_census = config.census_every > 0 and step % config.census_every == 0
            rec = _one_step(config, model, optimizer, scaler, task, device, autocast_dtype,
                            names, acts, take_census, step)
            yield rec
    except Exception as e:  # noqa: BLE001 - a run ends with a record, never by raising into the caller
        yield StepRecord(step=step, error=failure_sentence(mode, e, step, config.learning_rate))
    finally:
        acts.remove()


def _one_step(config, model, optimizer, scaler, task, device, autocast_dtype, names, acts,
              take_census, step) -> StepRecord:
    inputs, targets = task.batch()
    t0 = time.perf_counter()
    inputs = tuple(x.to(device) for x in inputs)
    targets = targets.to(device)
    if config.mode == "half":
        inputs = tuple(x.half() if x.is_floating_point() else x for x in inputs)
    optimizer.zero_grad(set_to_none=True)
    acts.active = take_census
    acts.grads = {}
    autocast = (torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype is not None
                else contextlib.nullcontext())
    with autocast:
        output = model(*inputs)
        loss = task.loss(output, targets)
    loss_value = loss.item()
    if not math.isfinite(loss_value) and scaler is None:
        if not all(bool(torch.isfinite(p).all()) for p in model.parameters()):
            raise NonFiniteLoss(loss_value, step, config.mode, weights=True)
        where = ("the model's fp16 output" if output.dtype == torch.float16 and not bool(torch.isfinite(output).all())
                 else "the fp16 loss" if loss.dtype == torch.float16 and math.isinf(loss_value) else None)
        raise NonFiniteLoss(loss_value, step, config.mode, where)
    if scaler is not None:
        scaled = scaler.scale(loss)
        scale = scaler.get_scale()
        scaled.backward()
        scaler.unscale_(optimizer)
    else:
        scale = 1.0
        loss.backward()
    acts.active = False
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    grad_norm = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])).item() if grads else 0.0
    rec = StepRecord(step=step, loss=loss_value, grad_norm=grad_norm)
    if scaler is not None:
        # skipped exactly when unscale_ found an inf or NaN, as scaler.step decides (also at a
        # scale of 0, where the backoff leaves the scale unchanged)
        found = scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
        rec.skipped = bool(sum(float(v) for v in found.values()))
        scaler.step(optimizer)
        scaler.update()
        rec.scale = scale
        rec.growth_tracker = int(scaler.state_dict()["_growth_tracker"])
        rec.growth_factor = scaler.get_growth_factor()
        rec.backoff_factor = scaler.get_backoff_factor()
        rec.growth_interval = scaler.get_growth_interval()
    else:
        optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    rec.step_time = time.perf_counter() - t0
    if take_census:
        true_grads = {}
        for name, p in zip(names, model.parameters()):
            g = torch.zeros_like(p) if p.grad is None else p.grad
            true_grads[name] = g.detach().float().reshape(-1).cpu().numpy()
        rec.param_census = {n: _census_at(g, config.census_fmt, scale) for n, g in true_grads.items()}
        s32 = np.float32(scale)
        with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
            rec.act_census = {n: _census_at(acts.grads[n] / s32 if scale else acts.grads[n],
                                            config.census_fmt, scale)
                              for n in acts.names if n in acts.grads}
        if config.keep_grads:
            rec.grads = true_grads
    acts.grads = {}
    return rec


class NonFiniteLoss(FloatingPointError):
    """The loss of a step without a loss scaler is inf or NaN. ``weights``: the weights themselves
    are no longer all finite (the previous update made some inf or NaN); else ``overflowed``: where
    an fp16 value went past fp16's largest value, 65504 ("the model's fp16 output" when the output
    held inf or NaN, "the fp16 loss" when the loss itself, computed in fp16, is inf), else None."""

    def __init__(self, value: float, step: int, mode: str, overflowed: str | None = None, weights: bool = False):
        super().__init__(f"the loss is {value} at step {step} in mode {mode!r}")
        self.value, self.step, self.mode, self.overflowed = value, step, mode, overflowed
        self.weights = weights


def failure_sentence(mode: str, exc: BaseException, step: int, lr: float | None = None) -> str:
    """What ended a run, in one sentence a learner can act on (the exception's type and first
    line follow in brackets where the sentence is not enough)."""
    try:
        text = str(exc).strip()
    except Exception:  # noqa: BLE001 - an exception whose message cannot be made
        text = ""
    text = text.splitlines()[0] if text else ""
    if isinstance(exc, NonFiniteLoss):
        if getattr(exc, "weights", False):
            hint = (" (in fp16 weights an optimizer's own small numbers, such as Adam's eps of 1e-8, "
                    "are 0: keep the weights in fp32 with autocast, or use bf16)" if mode == "half"
                    else " (try a smaller learning rate)")
            return (f"{mode} diverged at step {step}: the previous update made some weights inf or NaN, "
                    f"so the loss is {exc.value}{hint}")
        if exc.overflowed:
            return (f"{mode} overflowed at step {step}: {exc.overflowed} went past 65504, so "
                    f"the loss is {exc.value} (lower the learning rate, or use bf16, whose range "
                    "reaches 3.4e38)")
        return (f"{mode} diverged at step {step}: the loss is {exc.value} "
                "(training diverged: try a smaller learning rate)")
    if "cannot be converted to type c10::Half" in text and mode == "half":
        shown = f" {lr:g}" if lr is not None else ""
        return (f"half stopped at step {step}: the learning rate{shown} does not fit in fp16 (largest "
                "65504), so SGD cannot apply it to fp16 weights; choose a smaller learning rate")
    if isinstance(exc, MemoryError) or "out of memory" in text.lower():
        return f"{mode} stopped at step {step}: out of memory (choose a smaller batch or model)"
    return f"{mode} stopped at step {step}: {type(exc).__name__}: {text}"


# ------------------------------------------------------------------ runs: collect, save
def run_training(config: TrainConfig, control: ScalerControl | None = None, *,
                 model: nn.Module | None = None, save_to=None, on_step=None) -> Run:
    """Run ``train_steps`` to the end and collect its records into a ``Run``.

    ``save_to``: a CSV path written as the run goes (one flushed row per step), so a kernel restart
    loses at most the step in progress; ``load_run`` reads it back. ``on_step(record)`` is called
    after each step (e.g. to redraw a plot).
    """
    run = Run(config=config, device=describe_device(config.device))
    writer = f = None
    if save_to is not None:
        f = open(save_to, "w", newline="")
        run._write_csv_head(f)
        writer = csv.writer(f)
    try:
        for rec in train_steps(config, control, model=model):
            run.append(rec)
            if writer is not None:
                writer.writerow([_csv_cell(k, getattr(rec, k)) for k in _CSV_COLUMNS])
                f.flush()
            if on_step is not None:
                on_step(rec)
    finally:
        if f is not None:
            f.close()
    return run


def trained_parameter(model: str = "mlp", name: str = "fc4.weight", *, steps: int = 100, seed: int = 0) -> dict:
    """One parameter of a course model after ``steps`` float32 training steps:
    ``{"weight": ..., "gradient": ...}``, float32 numpy arrays of the parameter's shape (copies).

    ``model``: "mlp", "transformer" or "beam", built and trained as ``ampviz.training.live.train_steps``
    does (``TrainConfig(model, mode="fp32", steps=steps, seed=seed)``: its seeded initialisation,
    batches, optimizer and learning rate); ``name``: the parameter, as ``named_parameters()``
    calls it. The weight is the one after the last step; the gradient is the last step's (the
    one that step applied), as ``p.grad`` holds it.

    The defaults are lesson 13's layer: the MLP's fourth layer after 100 steps. The MLP trains to
    the same bits on 1, 2 or 4 torch threads, and torch's other CPU kernel sets (default, AVX2)
    move its values by a few units in the last place; the transformer's and the beam's float sums
    depend on the thread count as well, and the transformer's differences grow as it trains.
    """
    if not isinstance(model, str) or model not in MODELS:
        raise ValueError(f"model must be one of {', '.join(map(repr, MODELS))}, got {_shown(model)}")
    steps = _strict_whole("steps", steps, 1, 100_000)
    seed = _strict_whole("seed", seed, 0, 2**31 - 1)
    net = build_task(model, seed).model
    params = dict(net.named_parameters())
    if not isinstance(name, str) or name not in params:
        raise ValueError(f"name must be one of the model's parameters ({', '.join(params)}), got {_shown(name)}")
    last = None
    for last in train_steps(TrainConfig(model=model, mode="fp32", steps=steps, seed=seed, census_every=0),
                            model=net):
        pass
    if last is not None and last.error:
        raise RuntimeError(f"training {model!r} failed: {last.error}")
    p = params[name]
    return {"weight": p.detach().numpy().copy(), "gradient": p.grad.detach().numpy().copy()}
