"""What a live training run is asked to do: the modes and models, ``TrainConfig``, ``ScalerControl`` and the device.

* ``MODES`` / ``MODELS``: the names a run accepts; ``TrainConfig``: one run's settings, each
  checked, with the model's default learning rate and batch size.
* ``ScalerControl``: scaler settings changed while a run is going (from a widget in another
  thread), taken by the training loop at its next step; ``stop()`` ends the run.
* ``resolve_device`` / ``describe_device``: the device a run will use, and one line saying why.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np
import torch

from ampviz._args import _count as _whole, _number as _real, _shown
from ampviz.formats import get_format

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
                raise ValueError(f"lr must be a positive number (or None for the model's default), "
                                 f"got {_shown(self.lr)}")
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
