"""Live mixed-precision training of two tiny models, one step at a time, with a census of the gradients.

``train_steps(TrainConfig(...))`` is a generator: it trains a small seeded model and yields one
``StepRecord`` per step (loss, loss scale, skipped step, gradient norm, step time and, every
``census_every`` steps, how each parameter's gradient and each watched module's output gradient
land in fp16 at the current scale). ``run_training`` collects the records into a ``Run`` that can be
written to CSV or JSON as it grows and read back with ``load_run``, so a run survives a kernel restart.
``ampviz/__init__.py`` never imports this module, so ``import ampviz`` stays free of torch.

Models and data (made here, seeded, nothing downloaded)
--------------------------------------------------------
* ``"mlp"``: a multilayer perceptron (``depth`` ``nn.Linear`` layers, ReLU between them, torch's
  default initialisation) classifying Gaussian inputs into 10 classes given by a fixed random linear
  teacher; a fresh batch every step.
* ``"transformer"``: token embedding plus a learned position embedding, an ``nn.TransformerEncoder``
  (``batch_first=True``, post-norm, no dropout), a mean over the real (unpadded) positions and a
  linear head. Each sequence has its own length and is right-padded with token 0; the padding is
  passed as ``src_key_padding_mask``. The task: which of the tokens 1 ... 9 occurs most often in the
  sequence (the smallest of them on a tie; nine classes).
* ``"beam"``: a regression whose gradients are small for a reason (``ampviz.training.beam``): a residual
  MLP with LayerNorm predicts the deflection, in metres, of simply supported beams under two point
  loads, trained with Adam on a mean squared error in m^2. Without a loss scale its gradients fall
  below fp16's range: fp32, bf16 and fp16 with a scaler learn, fp16 alone stalls.

The classifiers train with SGD (momentum 0.9) on ``cross_entropy`` and batches of 64; the beam with
Adam on ``mse_loss`` and batches of 256 (``TrainConfig``'s defaults per model).

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

What the census sees
--------------------
The gradient census classifies ``true gradient × scale`` cast to float16 (``ampviz.formats.census.census``
with the step's scale; scale 1 without a scaler): what the float16 backward pass holds. Under fp16
autocast the weight gradients are *computed* in float16, so a gradient that underflowed in the
backward pass reaches ``.grad`` as an exact 0 and is counted as "zero", not "underflow"; the share
of zeros (dead ReLU units aside) is then what fp16 lost. In fp32 and bf16 modes the census says what
*would* vanish in float16 at that scale.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import threading
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ampviz.formats.census import CensusResult, census
from ampviz._args import _count as _whole, _number as _real, _shown, _whole as _strict_whole
from ampviz.training import MLP  # the plain MLP of notebook 07's frozen-weights experiment
from ampviz.formats import CATEGORIES, get_format

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

MODES = ("fp32", "fp16", "fp16+scaler", "bf16", "half")
MODELS = ("mlp", "transformer", "beam")

_AUTOCAST = {"fp16": torch.float16, "fp16+scaler": torch.float16, "bf16": torch.bfloat16}
_DEFAULT_LR = {"mlp": 0.05, "transformer": 0.05, "beam": 1e-3}
_DEFAULT_BATCH = {"mlp": 64, "transformer": 64, "beam": 256}


# ------------------------------------------------------------------ configuration and records
@dataclass
class TrainConfig:
    """One training run. The scaler settings mirror ``torch.amp.GradScaler``'s and matter only in
    ``"fp16+scaler"`` mode. ``lr=None`` takes the model's default (0.05 for the classifiers' SGD
    with momentum 0.9, 1e-3 for the beam's Adam); ``batch_size=None`` the model's (64; the beam 256);
    ``census_every=0`` never takes a census; ``watch=None`` watches the model's default modules
    (``Task.watch``) for the activation-gradient census, ``()`` none. ``keep_grads`` stores the
    true gradients (numpy, by parameter name) in the records that carry a census (not saved to files).
    """

    model: str = "mlp"
    mode: str = "fp32"
    steps: int = 50
    lr: float | None = None
    batch_size: int | None = None
    seed: int = 0
    device: str | None = None
    census_every: int = 10
    census_fmt: str = "fp16"
    watch: tuple | None = None
    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    keep_grads: bool = False

    def __post_init__(self):
        if not isinstance(self.model, str) or self.model not in MODELS:
            raise ValueError(f"unknown model {_shown(self.model)}; choose one of {', '.join(MODELS)}")
        if not isinstance(self.mode, str) or self.mode not in MODES:
            raise ValueError(f"unknown mode {_shown(self.mode)}; choose one of {', '.join(MODES)}")
        self.steps = _whole("steps", self.steps, 0, 10**9)
        self.batch_size = (_DEFAULT_BATCH[self.model] if self.batch_size is None
                           else _whole("batch_size", self.batch_size, 1, 65536))
        self.seed = _whole("seed", self.seed, 0)
        self.census_every = _whole("census_every", self.census_every, 0)
        if self.lr is not None:
            lr = _real("lr", self.lr)
            if not (math.isfinite(lr) and lr > 0):
                raise ValueError(f"lr must be a positive number (or None for the model's default), got {_shown(self.lr)}")
        if self.device is not None:
            try:
                torch.device(self.device)
            except (RuntimeError, TypeError, ValueError):
                raise ValueError(f"device must be None or a torch device such as 'cpu' or 'cuda', "
                                 f"got {_shown(self.device)}") from None
        get_format(self.census_fmt)
        if self.watch is not None:
            if isinstance(self.watch, str) or not all(isinstance(n, str) for n in _iterable("watch", self.watch)):
                raise TypeError(f"watch must be None or a list of module names, got {_shown(self.watch)}")
            self.watch = tuple(self.watch)
        init_scale = _real("init_scale", self.init_scale)
        if not (math.isfinite(init_scale) and init_scale >= 0):
            raise ValueError(f"init_scale must be a finite number >= 0, got {_shown(self.init_scale)}")
        _real("growth_factor", self.growth_factor)
        _real("backoff_factor", self.backoff_factor)
        if not math.isfinite(self.growth_factor):
            raise ValueError(f"growth_factor must be a finite number above 1, got {_shown(self.growth_factor)}")
        if not isinstance(self.keep_grads, (bool, np.bool_)):
            raise TypeError(f"keep_grads must be True or False, got {_shown(self.keep_grads)}")
        _check_scaler_settings(self.growth_factor, self.backoff_factor, self.growth_interval)

    @property
    def learning_rate(self) -> float:
        return _DEFAULT_LR[self.model] if self.lr is None else float(self.lr)

    @property
    def uses_scaler(self) -> bool:
        return self.mode == "fp16+scaler"


def _iterable(name: str, value):
    try:
        return list(value)
    except TypeError:
        raise TypeError(f"{name} must be a list, got {_shown(value)}") from None


def _check_scaler_settings(growth_factor=None, backoff_factor=None, growth_interval=None):
    """The checks of GradScaler's constructor (which its setters skip), plus an integer interval."""
    if growth_factor is not None and not _real("growth_factor", growth_factor) > 1.0:
        raise ValueError(f"growth_factor must be > 1.0, got {_shown(growth_factor)}")
    if backoff_factor is not None and not 0.0 < _real("backoff_factor", backoff_factor) < 1.0:
        raise ValueError(f"backoff_factor must be between 0 and 1, got {_shown(backoff_factor)}")
    if growth_interval is not None:
        try:
            _whole("growth_interval", growth_interval, 1)
        except (TypeError, ValueError):
            raise ValueError(f"growth_interval must be an integer >= 1, got {_shown(growth_interval)}") from None


@dataclass
class StepRecord:
    """One training step.

    ``scale``: the loss scale this step used (None without a scaler); ``skipped``: the scaler
    skipped the optimizer step (``unscale_`` found an inf or NaN in the gradients: its
    ``found_inf``, which ``scaler.step`` reads to decide); ``grad_norm``: the L2 norm of the true (unscaled) gradients, inf or
    NaN when they overflowed; ``step_time``: seconds for data transfer, forward, backward and the
    optimizer step (the census is not counted); ``growth_tracker`` (after the update) and the three
    scaler settings in effect at this step (None without a scaler); ``param_census`` (by parameter
    name) and ``act_census`` (by watched module name): ``CensusResult`` of ``gradient × scale`` in
    ``census_fmt``, every ``census_every`` steps, else None. ``error``: set on the last record of a run
    that stopped on an exception, one sentence that says what happened (``failure_sentence``, e.g.
    "fp16 overflowed at step 4: the model's fp16 output went past 65504, so the loss is inf ...");
    its other fields may then be NaN or None. A scale of 0 (a collapsed scaler) is recorded like
    any other: its census counts every finite gradient as "zero" (all lost).
    """

    step: int
    loss: float = math.nan
    scale: float | None = None
    skipped: bool = False
    grad_norm: float = math.nan
    step_time: float = math.nan
    growth_tracker: int | None = None
    growth_factor: float | None = None
    backoff_factor: float | None = None
    growth_interval: int | None = None
    param_census: dict | None = None
    act_census: dict | None = None
    error: str | None = None
    grads: dict | None = field(default=None, repr=False, compare=False)

_SCALARS = ("step", "loss", "scale", "skipped", "grad_norm", "step_time", "growth_tracker",
            "growth_factor", "backoff_factor", "growth_interval", "error")
_CENSUSES = ("param_census", "act_census")


class ScalerControl:
    """Scaler settings to change while a run is going, e.g. from a widget callback in another thread.

    ``set(...)`` stores the new values under a lock; the training loop takes them at the start of
    its next step and calls ``scaler.set_growth_factor`` / ``set_backoff_factor`` /
    ``set_growth_interval``, so the record of that step shows them. ``stop()`` asks the run to end
    before its next step. Note torch's rule: the scale grows when the growth tracker *equals*
    ``growth_interval``, so lowering the interval below the clean steps already counted postpones
    growth until the next backoff resets the tracker.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._pending: dict = {}
        self._stop = False

    def set(self, *, growth_factor=None, backoff_factor=None, growth_interval=None) -> None:
        _check_scaler_settings(growth_factor, backoff_factor, growth_interval)
        new = {"growth_factor": growth_factor, "backoff_factor": backoff_factor,
               "growth_interval": None if growth_interval is None else int(growth_interval)}
        with self._lock:
            self._pending.update({k: v for k, v in new.items() if v is not None})

    def stop(self) -> None:
        with self._lock:
            self._stop = True

    @property
    def stopped(self) -> bool:
        with self._lock:
            return self._stop

    def take(self) -> dict:
        """The settings changed since the last call (and forget them)."""
        with self._lock:
            pending, self._pending = self._pending, {}
        return pending


# ------------------------------------------------------------------ device
def resolve_device(device=None) -> torch.device:
    """``device`` if given, else CUDA when available, else the CPU."""
    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def describe_device(device=None) -> str:
    """One line: the device a run will use, and why."""
    dev = resolve_device(device)
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
        why = "asked for explicitly" if device is not None else "CUDA is available"
        return f"{dev} ({name}): {why}"
    if device is not None:
        return f"{dev}: asked for explicitly"
    if torch.version.cuda is None:
        return f"{dev}: this torch build ({torch.__version__}) has no CUDA support"
    return f"{dev}: torch was built with CUDA {torch.version.cuda} but no GPU is visible"


# ------------------------------------------------------------------ models and data
class SequenceClassifier(nn.Module):
    """Embedding + position embedding -> TransformerEncoder with a padding mask -> masked mean -> Linear."""

    def __init__(self, vocab=10, max_len=16, d_model=32, nhead=4, dim_feedforward=64, num_layers=2,
                 classes=9):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers)
        self.head = nn.Linear(d_model, classes)

    def forward(self, tokens: torch.Tensor, pad_mask: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        h = self.embed(tokens) + self.pos(positions)
        h = self.encoder(h, src_key_padding_mask=pad_mask)
        keep = (~pad_mask).unsqueeze(-1).to(h.dtype)
        pooled = (h * keep).sum(dim=1) / keep.sum(dim=1)
        return self.head(pooled)


@dataclass
class Task:
    """A model, its batches and the modules the activation census watches by default.

    ``batch()`` returns ``(inputs, targets)``: a tuple of CPU tensors for ``model(*inputs)`` and
    the targets (class labels, or the beam's deflections), drawn from the task's own seeded
    generator (a fresh batch per call). ``loss(output, targets)`` is the task's loss and
    ``optimizer`` its optimizer ("sgd": SGD with momentum 0.9, "adam": Adam).
    """

    model: nn.Module
    make_batch: object
    watch: tuple
    loss: object = nn.functional.cross_entropy
    optimizer: str = "sgd"

    def batch(self):
        return self.make_batch()


def build_task(name: str = "mlp", seed: int = 0, batch_size: int | None = None) -> Task:
    """The seeded model and data stream ``name`` ("mlp", "transformer" or "beam"), on the CPU in
    float32; ``batch_size=None`` takes the model's default.

    The model's initialisation draws from torch's global generator seeded with ``seed`` inside
    ``torch.random.fork_rng`` (the caller's random state is left alone); the data come from their
    own ``torch.Generator`` seeded with ``seed + 1``.
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    if batch_size is None:
        batch_size = _DEFAULT_BATCH[name]
    if name == "beam":
        data = _beam_data(seed + 1)
        model = data.model(seed)
        watch = tuple(n for n, m in model.named_modules() if isinstance(m, nn.Linear))
        return Task(model, data.sampler(batch_size, seed + 2), watch, nn.functional.mse_loss, "adam")
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if name == "mlp":
            model = MLP()
        else:
            model = SequenceClassifier()
    if name == "mlp":
        features = model[0].in_features
        classes = model[-1].out_features
        teacher = torch.randn(features, classes, generator=gen)

        def make_batch():
            x = torch.randn(batch_size, features, generator=gen)
            return (x,), (x @ teacher).argmax(dim=1)

        watch = tuple(n for n, m in model.named_children() if isinstance(m, nn.Linear))
        return Task(model, make_batch, watch)

    vocab, max_len = model.embed.num_embeddings, model.pos.num_embeddings

    def make_batch():
        lengths = torch.randint(max_len // 4, max_len + 1, (batch_size,), generator=gen)
        tokens = torch.randint(1, vocab, (batch_size, max_len), generator=gen)
        pad_mask = torch.arange(max_len).unsqueeze(0) >= lengths.unsqueeze(1)
        tokens[pad_mask] = 0
        counts = nn.functional.one_hot(tokens, vocab)[:, :, 1:].sum(dim=1)  # padding (0) not counted
        return (tokens, pad_mask), counts.argmax(dim=1)  # ties: the smallest token

    watch = ("embed",) + tuple(f"encoder.layers.{i}" for i in range(len(model.encoder.layers))) + ("head",)
    return Task(model, make_batch, watch)


_BEAM_DATA: dict = {}


def _beam_data(seed: int):
    """The beam data set for ``seed`` (5,120 beams), made once per process."""
    from ampviz.training.beam import BeamData

    if seed not in _BEAM_DATA:
        _BEAM_DATA.clear()  # one data set at a time: 1.4 MB each
        _BEAM_DATA[seed] = BeamData(seed)
    return _BEAM_DATA[seed]


# ------------------------------------------------------------------ activation-gradient census
class _ActivationWatch:
    """Forward hooks that, while ``active``, put a tensor hook on each watched module's output and
    keep its gradient (as float32 numpy). A tensor hook rather than ``register_full_backward_hook``:
    the latter warns when a module's inputs need no gradient (the first layer, the embedding)."""

    def __init__(self, model: nn.Module, names):
        modules = dict(model.named_modules())
        missing = [n for n in names if n not in modules]
        if missing:
            raise ValueError(f"no module named {', '.join(map(repr, missing))} in the model")
        self.names = tuple(names)
        self.active = False
        self.grads: dict = {}
        self.handles = []
        for name in names:
            self.handles.append(modules[name].register_forward_hook(self._forward_hook(name)))

    def _forward_hook(self, name):
        def keep(grad):
            g = grad.detach().float().reshape(-1).cpu().numpy()
            self.grads[name] = np.concatenate([self.grads[name], g]) if name in self.grads else g.copy()

        def hook(module, args, output):
            if self.active and isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(keep)

        return hook

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []


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


def _census_at(values, fmt, scale) -> CensusResult:
    """``census(values, fmt, scale)``, also at the scale 0 a collapsed scaler reaches: there
    ``gradient × 0`` is 0 for every finite gradient (counted as "zero": everything is lost) and
    NaN for an infinite or NaN one, as torch's multiply-then-cast gives."""
    if scale != 0:
        return census(values, fmt, scale)
    v = np.asarray(values, dtype=np.float32)
    with np.errstate(invalid="ignore"):
        return replace(census(v * np.float32(0.0), fmt, 1.0), scale=0.0)


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


# ------------------------------------------------------------------ runs: collect, save, load
def _census_to_dict(c: CensusResult) -> dict:
    return {"fmt": c.fmt.name, "scale": c.scale, "total": c.total, "counts": dict(c.counts),
            "log2_bins": c.log2_bins.tolist(), "log2_counts": c.log2_counts.tolist()}


def _read_field(name: str, value, kind):
    """A number read from a file, checked: ``kind`` int (within int64) or float (an int stands
    for a float, as JSON writes 2.0 as 2 in other tools); anything else is a ValueError."""
    if not isinstance(value, bool) and isinstance(value, (int, float) if kind is float else int):
        if kind is int and -2**63 <= value < 2**63:
            return value
        if kind is float and (isinstance(value, float) or abs(value) < 2**1023):
            return float(value)
    raise ValueError(f"{name} must be {'a number' if kind is float else 'a whole number'}, not {_shown(value, 30)}")


def _census_from_dict(d) -> CensusResult:
    if not isinstance(d, dict):
        raise ValueError(f"a census must be an object with fmt, scale, total, counts, log2_bins, log2_counts, "
                         f"not {_shown(d, 30)}")
    counts, bins, hist = d.get("counts"), d.get("log2_bins"), d.get("log2_counts")
    if not isinstance(counts, dict) or set(counts) != set(CATEGORIES):
        raise ValueError(f"a census's counts must give {', '.join(CATEGORIES)}, not {_shown(counts, 30)}")
    if not isinstance(bins, list) or not isinstance(hist, list) or len(bins) != len(hist):
        raise ValueError("a census's log2_bins and log2_counts must be two lists of whole numbers of one length")
    return CensusResult(fmt=get_format(d.get("fmt")), scale=_read_field("scale", d.get("scale"), float),
                        total=_read_field("total", d.get("total"), int),
                        counts={k: _read_field(k, counts[k], int) for k in CATEGORIES},
                        log2_bins=np.array([_read_field("log2_bins", b, int) for b in bins], dtype=np.int64),
                        log2_counts=np.array([_read_field("log2_counts", c, int) for c in hist], dtype=np.int64))


def _record_to_dict(rec: StepRecord) -> dict:
    out = {k: getattr(rec, k) for k in _SCALARS}
    for k in _CENSUSES:
        c = getattr(rec, k)
        out[k] = None if c is None else {n: _census_to_dict(v) for n, v in c.items()}
    return out


def _record_from_dict(d) -> StepRecord:
    """A StepRecord from the fields a file holds (censuses as dicts), each checked (ValueError)."""
    if not isinstance(d, dict):
        raise ValueError(f"a step must be an object of fields, not {_shown(d, 30)}")
    kw = {}
    for k in _SCALARS:
        v = d.get(k)
        if k == "skipped" and not isinstance(v, bool):
            raise ValueError(f"skipped must be true or false, not {_shown(v, 30)}")
        if k == "error" and not (v is None or isinstance(v, str)):
            raise ValueError(f"error must be text, not {_shown(v, 30)}")
        if k not in ("skipped", "error") and (v is not None or k == "step"):
            v = _read_field(k, v, int if k in _INT_FIELDS else float)
        kw[k] = v
    for k in _CENSUSES:
        c = d.get(k)
        if not (c is None or isinstance(c, dict)):
            raise ValueError(f"{k} must be an object of censuses by name, not {_shown(c, 30)}")
        kw[k] = None if c is None else {n: _census_from_dict(v) for n, v in c.items()}
    return StepRecord(**kw)

_INT_FIELDS = {"step", "growth_tracker", "growth_interval"}
_FLOAT_FIELDS = {"loss", "scale", "grad_norm", "step_time", "growth_factor", "backoff_factor"}


def _csv_cell(key, value) -> str:
    if value is None:
        return ""
    if key in _CENSUSES:
        return json.dumps({n: _census_to_dict(v) for n, v in value.items()}, separators=(",", ":"))
    return repr(value) if isinstance(value, float) else str(value)


def _parse_cell(key, text: str):
    if text == "":
        return None
    if key in _CENSUSES:
        return json.loads(text)  # checked by _record_from_dict
    if key in _INT_FIELDS:
        return int(text)
    if key in _FLOAT_FIELDS:
        return float(text)
    if key == "skipped":
        return text == "True"
    return text

_CSV_COLUMNS = _SCALARS + _CENSUSES
_CSV_MAGIC = "# ampviz run "


@dataclass
class Run:
    """The records of one run, with its config and device line; ``run["loss"]`` is a column
    (numpy float array, None as NaN; census columns as lists).

    ``max_records`` bounds the memory of a long run (a live widget's): when more records than that
    are held, the run keeps every ``stride``-th step (``stride`` doubles each time), the skipped
    steps more densely (every ``stride // 8``-th), the failed step and the last one, and drops the
    others. ``steps_recorded`` and ``skipped_recorded`` count every step appended, kept or not.
    ``None`` (the default) keeps every record.
    """

    config: TrainConfig
    records: list = field(default_factory=list)
    device: str = ""
    max_records: int | None = None
    stride: int = 1
    steps_recorded: int = 0
    skipped_recorded: int = 0

    def __post_init__(self):
        if self.max_records is not None and (isinstance(self.max_records, bool)
                                             or not isinstance(self.max_records, int) or self.max_records < 16):
            raise ValueError(f"max_records must be None or an integer >= 16, got {self.max_records!r}")
        if not self.steps_recorded and self.records:
            self.steps_recorded = len(self.records)
            self.skipped_recorded = sum(bool(r.skipped) for r in self.records)

    def append(self, rec: StepRecord) -> None:
        self.records.append(rec)
        self.steps_recorded += 1
        self.skipped_recorded += bool(rec.skipped)
        if self.max_records is not None and len(self.records) > self.max_records:
            self._thin()

    def _thin(self) -> None:
        """Double the stride until at most half of ``max_records`` records are kept."""
        recs, last = self.records, self.records[-1]
        while len(recs) > self.max_records // 2:
            self.stride *= 2
            s, s_skip = self.stride, max(self.stride // 8, 1)
            recs = [r for r in recs if r.step % s == 0 or r.error is not None or r is last
                    or (r.skipped and r.step % s_skip == 0)]
        self.records = recs

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, key):
        values = [getattr(r, key) for r in self.records]
        if key in _CENSUSES or key == "error":
            return values
        return np.array([math.nan if v is None else v for v in values], dtype=float)

    @property
    def error(self) -> str | None:
        return self.records[-1].error if self.records else None

    def _header(self) -> dict:
        return {"config": asdict(self.config), "device": self.device}

    def to_json(self, path) -> Path:
        """Write the run as JSON (non-finite floats as NaN / Infinity, as Python's json does)."""
        path = Path(path)
        data = {**self._header(), "records": [_record_to_dict(r) for r in self.records]}
        path.write_text(json.dumps(data))
        return path

    def to_csv(self, path) -> Path:
        """Write the run as CSV: a ``# ampviz run {...}`` line with the config, then one row per
        step; census columns hold JSON."""
        path = Path(path)
        with open(path, "w", newline="") as f:
            self._write_csv_head(f)
            writer = csv.writer(f)
            for rec in self.records:
                writer.writerow([_csv_cell(k, getattr(rec, k)) for k in _CSV_COLUMNS])
        return path

    def _write_csv_head(self, f) -> None:
        f.write(_CSV_MAGIC + json.dumps(self._header()) + "\n")
        csv.writer(f).writerow(_CSV_COLUMNS)

    @classmethod
    def from_json(cls, path) -> "Run":
        """Read a JSON file written by ``to_json`` (any other content: one ValueError line)."""
        text = _run_text(path)
        with _reading(path, "its content"):
            data = json.loads(text)
            if not isinstance(data, dict) or not isinstance(data.get("records"), list):
                raise ValueError("it is not a JSON object with config, device and a list of records")
            config, device = _config_from_dict(data.get("config")), _device_line(data)
        with _reading(path, "a step"):
            return cls(config=config, device=device, records=[_record_from_dict(d) for d in data["records"]])

    @classmethod
    def from_csv(cls, path) -> "Run":
        """Read a CSV written by ``to_csv`` or saved row by row by ``run_training``. A last row cut
        off (the kernel died while writing it) is dropped: every complete row is kept. Any other
        content is one ValueError line."""
        text = _run_text(path)
        first, sep, rest = text.partition("\n")
        if not first.startswith(_CSV_MAGIC):
            raise _not_a_run(path, f"it is not an ampviz run (its first line should start with {_CSV_MAGIC!r})")
        if not sep:
            raise _not_a_run(path, "it ends inside its first line: the run's settings were never written "
                                   "completely, and no step was recorded")
        with _reading(path, "the run's settings on its first line"):
            head = json.loads(first[len(_CSV_MAGIC):])
            if not isinstance(head, dict):
                raise ValueError("it is not a JSON object with config and device")
            config, device = _config_from_dict(head.get("config")), _device_line(head)
        with _reading(path, "its rows"):
            rows = list(csv.reader(io.StringIO(rest, newline="")))
        if rest and not rest.endswith("\n"):
            rows = rows[:-1]  # the row in progress when the file was cut
        records = []
        if rows:  # (a header line cut short was dropped above: no step had been written yet)
            columns, rows = rows[0], rows[1:]
            unknown = [c for c in columns if c not in _CSV_COLUMNS]
            if unknown:
                raise _not_a_run(path, f"unknown column {_shown(unknown[0], 30)}, not an ampviz run")
            for n, row in enumerate(rows, start=3):
                if len(row) != len(columns):
                    raise _not_a_run(path, f"line {n} has {len(row)} fields where the header has {len(columns)}")
                cells = dict(zip(columns, row))
                with _reading(path, f"line {n}, a step"):
                    records.append(_record_from_dict({k: _parse_cell(k, cells.get(k, "")) for k in _CSV_COLUMNS}))
        return cls(config=config, device=device, records=records)


def _config_from_dict(d) -> TrainConfig:
    if not isinstance(d, dict):
        raise ValueError(f"the config must be an object of TrainConfig's settings, not {_shown(d, 30)}")
    known = {f.name for f in fields(TrainConfig)}
    return TrainConfig(**{k: v for k, v in d.items() if k in known})


def _device_line(head: dict) -> str:
    device = head.get("device", "")
    if not isinstance(device, str):
        raise ValueError(f"the device must be text, not {_shown(device, 30)}")
    return device


_EXPECTED_RUN = "expected an ampviz run as Run.to_json, Run.to_csv or run_training(save_to=...) writes it"


def _not_a_run(path, why: str) -> ValueError:
    """One line: the file, what is wrong with it, and what was expected."""
    return ValueError(f"{path}: {' '.join(str(why).split())}; {_EXPECTED_RUN}")


@contextlib.contextmanager
def _reading(path, what: str):
    """Turn what a malformed file raises while ``what`` is read into one ``_not_a_run`` line."""
    try:
        yield
    except (ValueError, TypeError, KeyError, OverflowError, RecursionError, csv.Error) as e:
        raise _not_a_run(path, f"cannot read {what} ({str(e)[:150]})") from None


def _run_text(path) -> str:
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise _not_a_run(path, "it is not text (not UTF-8: a binary file?)") from None


def load_run(path) -> Run:
    """Read a run written by ``Run.to_csv`` or ``Run.to_json`` (or saved as it went by ``run_training``);
    a ``.json`` file as JSON, any other as CSV. A file that is not such a run (binary, other JSON,
    damaged) is one ValueError line that names the file and says what was expected."""
    path = Path(path)
    return Run.from_json(path) if path.suffix.lower() == ".json" else Run.from_csv(path)


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
