"""The tiny problem every lesson-04 report runs on, the real scaler it drives, and reading that scaler's state.

* ``build_tiny``: one weight vector ``w`` and plain SGD, with loss ½‖w‖², so the gradient *is* ``w``
  and every number in a report can be checked by eye. ``Tiny.steps_taken`` counts the optimizer
  steps that really ran (an optimizer step post-hook; a step GradScaler skips never calls it).
* ``_scaler`` / ``_torch_scaler``: ``torch.amp.GradScaler("cpu", ...)`` with torch's defaults, the
  settings checked (or passed to torch as they are, to see what it refuses).
* ``_entry``, ``_stage``, ``_found_inf``: the scaler's private per-optimizer state, read without
  changing it; ``_plain``, ``_vec``: its numbers as plain text.

Reading the scaler's state uses its private attributes (``_scale``, ``_growth_tracker``,
``_per_optimizer_states``): that state is the subject of the lesson.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ampviz.text import number
from ampviz._args import _shown
from ampviz._args import _real, _real_array, _whole

INF = math.inf
DEFAULTS = {"init_scale": 2.0**16, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000}

_FLT_MAX = float(torch.finfo(torch.float32).max)
#: The floating-point dtypes a ``Tiny`` can be trained in on the CPU.
_TINY_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


# --------------------------------------------------------------------------------------------
# Checking arguments
# --------------------------------------------------------------------------------------------


def _values(name: str, values, dtype) -> torch.Tensor:
    """A number, a list, an array or a tensor of real numbers as a fresh CPU tensor of ``dtype``
    (the same values ``torch.tensor(values, dtype=dtype)`` gives: both round each value once)."""
    if isinstance(values, torch.Tensor) and not (values.is_complex() or values.dtype == torch.bool
                                                 or values.device.type == "meta"):
        return values.detach().to("cpu", dtype, copy=True)
    return torch.from_numpy(_real_array(name, values, "real numbers (e.g. (3.0, -4.0))")).to(dtype)


def _scale_value(name: str, value) -> float:
    """A loss scale torch can store: any float32 value (inf and NaN too), not a finite value beyond it."""
    x = _real(name, value)
    if math.isfinite(x) and abs(x) > _FLT_MAX:
        raise ValueError(f"{name} must be within float32's range (|{name}| <= 3.4e38, or inf), not {_shown(value)}")
    return x


_SETTINGS = ("init_scale", "growth_factor", "backoff_factor", "growth_interval")


def _scaler_settings(kwargs: dict) -> dict:
    """GradScaler's settings, checked as torch checks them (growth_factor > 1, backoff_factor < 1)
    and for what torch would fail on later (a non-number, a value it cannot store)."""
    for key in kwargs:
        if key not in _SETTINGS:
            raise TypeError(f"unknown GradScaler setting {_shown(key)}: use init_scale, growth_factor, "
                            "backoff_factor or growth_interval")
    out = dict(kwargs)
    if "init_scale" in kwargs:
        out["init_scale"] = _scale_value("init_scale", kwargs["init_scale"])
    if "growth_factor" in kwargs:
        out["growth_factor"] = _real("growth_factor", kwargs["growth_factor"])
        if out["growth_factor"] <= 1.0:
            raise ValueError(f"growth_factor must be > 1.0 (torch's GradScaler refuses others), "
                             f"not {_shown(kwargs['growth_factor'])}")
    if "backoff_factor" in kwargs:
        out["backoff_factor"] = _real("backoff_factor", kwargs["backoff_factor"])
        if out["backoff_factor"] >= 1.0:
            raise ValueError(f"backoff_factor must be < 1.0 (torch's GradScaler refuses others), "
                             f"not {_shown(kwargs['backoff_factor'])}")
    if "growth_interval" in kwargs:
        out["growth_interval"] = _whole("growth_interval", kwargs["growth_interval"], -(2**63), 2**63 - 1)
    return out


# --------------------------------------------------------------------------------------------
# The tiny problem
# --------------------------------------------------------------------------------------------


@dataclass(eq=False)
class Tiny:
    """A weight vector ``weight`` trained by ``optimizer`` (SGD) on the loss ½‖w‖².

    The gradient of that loss is ``w`` itself. ``steps_taken`` counts the calls of
    ``optimizer.step()`` that really ran.
    """

    weight: torch.nn.Parameter
    optimizer: torch.optim.SGD
    steps_taken: int = 0

    def loss(self, half: bool = False) -> torch.Tensor:
        """½‖w‖², a 0-dim tensor; with ``half=True`` computed in float16 (a half-precision loss)."""
        w = self.weight.half() if half else self.weight
        return 0.5 * (w * w).sum()


def build_tiny(weights=(3.0, -4.0), lr: float = 0.1, dtype=torch.float32) -> Tiny:
    """A fresh ``Tiny``: the weights (float32 unless ``dtype`` says otherwise) and SGD with ``lr``."""
    if dtype not in _TINY_DTYPES:
        raise TypeError(f"dtype must be torch.float16, torch.bfloat16, torch.float32 or torch.float64, "
                        f"not {_shown(dtype)}")
    lr_value, top = _real("lr", lr), torch.finfo(dtype).max
    if not 0 <= lr_value <= top:  # SGD's step multiplies by lr in the weights' dtype
        raise ValueError(f"lr must be a number from 0 to {top:.4g} (the largest {str(dtype).replace('torch.', '')}), "
                         f"not {_shown(lr)}")
    weight = torch.nn.Parameter(_values("weights", weights, dtype))
    tiny = Tiny(weight, torch.optim.SGD([weight], lr=lr_value))

    def count(optimizer, args, kwargs):
        tiny.steps_taken += 1

    tiny.optimizer.register_step_post_hook(count)
    return tiny


def _scaler(**kwargs) -> torch.amp.GradScaler:
    """``torch.amp.GradScaler("cpu")`` with the settings given, each checked."""
    return _torch_scaler(**_scaler_settings(kwargs))


def _torch_scaler(**kwargs) -> torch.amp.GradScaler:
    """``torch.amp.GradScaler("cpu")`` exactly as torch builds it (and refuses it)."""
    return torch.amp.GradScaler("cpu", **{**DEFAULTS, **kwargs})


def _backward_scaled(tiny, scaler):
    scaler.scale(tiny.loss()).backward()


# --------------------------------------------------------------------------------------------
# Reading the scaler's state
# --------------------------------------------------------------------------------------------


def _entry(scaler, optimizer):
    """The scaler's per-optimizer record, or None. ``.get`` on the defaultdict creates nothing."""
    return scaler._per_optimizer_states.get(id(optimizer))


def _stage(scaler, optimizer) -> str:
    entry = _entry(scaler, optimizer)
    return entry["stage"].name if entry else "READY"


def _found_inf(scaler, optimizer) -> dict:
    entry = _entry(scaler, optimizer)
    return {dev.type: float(v) for dev, v in entry["found_inf_per_device"].items()} if entry else {}


def _plain(x: float) -> str:
    """A float32 value as plain text: whole numbers in full (262144), others with 7 significant
    digits (float32 holds about 7), specials as inf / -inf / nan."""
    x = float(x)
    if math.isfinite(x) and x == int(x) and abs(x) < 1e15:
        return str(int(x))
    return number(x, digits=7)


def _vec_np(a) -> str:
    return "None" if a is None else "[" + ", ".join(_plain(x) for x in a.tolist()) + "]"


def _vec(t) -> str:
    if t is None:
        return "None"
    return _vec_np(t.detach().reshape(-1).double().numpy())


def _tensor_or_none(t):
    return None if t is None else t.detach().reshape(-1).double().numpy().copy()
