"""Real gradients from a small torch model, and torch's own casts and sums to check the core against.

``ampviz/__init__.py`` never imports this module, so ``import ampviz`` stays free of torch.

The model behind ``model_gradients`` is a plain multilayer perceptron with torch's defaults; only
its depth was chosen, deep enough for the effect to show clearly (at depth 8 fp16 loses under 1%
of the gradients, at 16 almost a quarter). 12 ``nn.Linear`` layers (64 units wide) with ReLU between
them and torch's default initialisation (``nn.Linear`` draws weights and biases from U(-1/sqrt(fan_in), 1/sqrt(fan_in))),
a 10-class cross-entropy loss averaged over a batch of 256 synthetic examples (Gaussian inputs,
labels from a fixed random linear teacher). Two honest effects make its gradients small:

* the mean over the batch divides every gradient by 256;
* that initialisation is small for ReLU (weight variance 1/(3 fan_in), against He's 2/fan_in), so
  gradients shrink layer by layer on the way back from the loss, here by about a factor of two per
  layer: the largest weight gradient is about 2^-7 in the last layer and 2^-19 in the first
  (vanishing gradients, as in any deep network without normalisation or residual connections).

ReLU units that are inactive for the whole batch give exact zero gradients. One forward and one
backward pass in float32, on the CPU, in a few milliseconds.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ampviz._args import SEED_MAX, SEED_MIN, _flag, _real, _real_array, _seed, _shown, _whole  # noqa: F401 (used here and by the torch-side modules)

__all__ = [
    "MLP",
    "Problem",
    "build_problem",
    "layer_gradients",
    "model_gradients",
    "torch_dtype",
    "torch_cast",
    "torch_cast_counts",
    "torch_add",
    "torch_accumulate",
]


def _check_sizes(features, width, depth, classes, batch=None, *, min_classes=1) -> tuple:
    """The sizes of an ``MLP`` (and of a batch), refused when they would not fit in memory or would
    take more than a few seconds."""
    features = _whole("features", features, 1, MAX_WEIGHTS)
    width = _whole("width", width, 1, MAX_WEIGHTS)
    depth = _whole("depth", depth, 1, MAX_DEPTH)
    classes = _whole("classes", classes, min_classes, MAX_WEIGHTS)
    params = _parameters(features, width, depth, classes)
    weights = params + (features * classes if batch is not None else 0)  # and the teacher of build_problem
    if weights > MAX_WEIGHTS:
        raise ValueError(f"features={features}, width={width}, depth={depth}, classes={classes} make "
                         f"{weights:,} weights; at most {MAX_WEIGHTS:,}")
    if batch is None:
        return features, width, depth, classes
    batch = _whole("batch", batch, 1, MAX_ACTIVATIONS)
    activations = batch * (features + 2 * (depth - 1) * width + classes)
    if activations > MAX_ACTIVATIONS:
        raise ValueError(f"batch={batch} makes {activations:,} activations; at most {MAX_ACTIVATIONS:,} "
                         "(a smaller batch, width or depth)")
    if batch * params > MAX_WORK:
        raise ValueError(f"batch={batch} × {params:,} weights is {batch * params:,} multiply-adds per pass; "
                         f"at most {MAX_WORK:,} (a smaller batch, width or depth)")
    return features, width, depth, classes, batch


def _parameters(features: int, width: int, depth: int, classes: int) -> int:
    if depth == 1:
        return features * classes + classes
    return features * width + width + (depth - 2) * (width * width + width) + width * classes + classes


#: Limits of the problems built here: beyond them a problem takes more than a few seconds or a
#: lot of memory (the default problem: 44,362 weights, 256 × 44,362 multiply-adds).
MAX_DEPTH = 1_000
MAX_WEIGHTS = 10**7
MAX_ACTIVATIONS = 5 * 10**7
MAX_WORK = 10**10


class MLP(nn.Sequential):
    """``depth`` Linear layers (fc1 ... fcN) with ReLU between them, torch's default initialisation."""

    def __init__(self, features=32, width=64, depth=6, classes=10):
        features, width, depth, classes = _check_sizes(features, width, depth, classes)
        layers, d = OrderedDict(), features
        for i in range(1, depth):
            layers[f"fc{i}"] = nn.Linear(d, width)
            layers[f"relu{i}"] = nn.ReLU()
            d = width
        layers[f"fc{depth}"] = nn.Linear(d, classes)
        super().__init__(layers)


@dataclass
class Problem:
    """A model and one batch of data: ``loss()`` is the mean cross-entropy on that batch."""

    model: nn.Module
    inputs: torch.Tensor
    targets: torch.Tensor

    def loss(self) -> torch.Tensor:
        return nn.functional.cross_entropy(self.model(self.inputs), self.targets)


def build_problem(seed: int = 0, *, depth: int = 12, width: int = 64, features: int = 32,
                  classes: int = 10, batch: int = 256) -> Problem:
    """The seeded MLP and batch described in the module docstring.

    The model's initialisation draws from torch's global generator, seeded with ``seed`` inside
    ``torch.random.fork_rng`` so the caller's random state is left as it was; the data come from
    their own ``torch.Generator`` (seeded with ``seed + 1``).
    """
    seed = _seed(seed, spare=1)
    features, width, depth, classes, batch = _check_sizes(features, width, depth, classes, batch, min_classes=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MLP(features, width, depth, classes)
    gen = torch.Generator().manual_seed(seed + 1)
    inputs = torch.randn(batch, features, generator=gen)
    teacher = torch.randn(features, classes, generator=gen)
    targets = (inputs @ teacher).argmax(dim=1)
    return Problem(model, inputs, targets)


def layer_gradients(seed: int = 0, *, loss_scale: float = 1.0, **kwargs) -> dict:
    """Gradient of each parameter after one forward/backward pass, by name ("fc1.weight", ...).

    The backward pass starts from ``loss * loss_scale`` (what a loss scaler does), all in float32;
    for a power-of-two scale every gradient comes out multiplied by exactly that power of two.
    Each value is a flattened float32 numpy array (a copy). ``kwargs`` go to ``build_problem``.
    """
    loss_scale = _real("loss_scale", loss_scale)
    problem = build_problem(seed, **kwargs)
    problem.model.zero_grad(set_to_none=True)
    (problem.loss() * loss_scale).backward()
    return {name: p.grad.detach().reshape(-1).numpy().copy()
            for name, p in problem.model.named_parameters()}


def model_gradients(seed: int = 0, *, loss_scale: float = 1.0, **kwargs) -> np.ndarray:
    """All parameter gradients of the seeded model, concatenated in parameter order (float32).

    Deterministic for a given seed on a given machine; see the module docstring for the model and
    ``layer_gradients`` for ``loss_scale``.
    """
    return np.concatenate(list(layer_gradients(seed, loss_scale=loss_scale, **kwargs).values()))


# --------------------------------------------------------------------------------------------
# torch's own arithmetic, as an independent reference for the numpy core
# --------------------------------------------------------------------------------------------

_DTYPE_NAMES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16",
                "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}


def torch_dtype(dtype) -> torch.dtype:
    """A torch dtype from itself, its name ("float16") or an ampviz format name ("fp16")."""
    if isinstance(dtype, torch.dtype):
        return dtype
    name = getattr(dtype, "name", dtype)  # an ampviz FloatFormat (or a numpy dtype)
    if not isinstance(name, str):
        raise TypeError(f"dtype must be a torch dtype, its name ('float16') or a format name ('fp16'), "
                        f"not {_shown(dtype)}")
    dt = getattr(torch, _DTYPE_NAMES.get(name, name), None) if name.isidentifier() else None
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {_shown(dtype)}: a torch dtype name such as 'float16' or "
                         f"one of {', '.join(_DTYPE_NAMES)}")
    return dt


#: The floating-point dtypes torch casts to (float4_e2m1fn_x2 packs two values in a byte: no casts).
_CASTS = {getattr(torch, n) for n in ("float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2",
                                      "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu") if hasattr(torch, n)}
#: ... and those torch does arithmetic in on the CPU
_ARITHMETIC = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _float_dtype(dtype, allowed=_CASTS) -> torch.dtype:
    dt = torch_dtype(dtype)
    if dt not in allowed:
        names = ", ".join(sorted(str(d).replace("torch.", "") for d in allowed))
        raise ValueError(f"dtype must be one of {names}, not {str(dt).replace('torch.', '')}")
    return dt


def _float32_values(values) -> torch.Tensor:
    """Real numbers as a float32 tensor (values beyond float32's range become inf, as a cast makes them)."""
    return torch.from_numpy(_real_array("values", values, "real numbers", np.float32))


def torch_cast(values, dtype) -> np.ndarray:
    """``values`` (float32) cast to ``dtype`` by torch, returned as float64."""
    dt = _float_dtype(dtype)
    return _float32_values(values).to(dt).to(torch.float64).numpy()


_NO_INF = {getattr(torch, n) for n in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
           if hasattr(torch, n)}


def torch_cast_counts(values, scale=1.0, dtype="float16") -> dict:
    """Count what ``(values * scale).to(dtype)`` gives, using torch only.

    Categories as in ``ampviz.formats.census``: "zero" (was 0), "underflow" (nonzero, became 0),
    "subnormal", "normal", "overflow" (became inf), "nan"; each value falls in exactly one. Only
    formats with inf (not float8_e4m3fn, which saturates) are supported.
    """
    dt = _float_dtype(dtype)
    if dt in _NO_INF:
        raise ValueError(f"{dt} has no inf; overflow cannot be counted from the cast alone")
    scale = _real("scale", scale)
    v = _float32_values(values).reshape(-1)
    c = (v * scale).to(dt).to(torch.float32)
    a = c.abs()
    tiny = torch.finfo(dt).tiny
    counts = {
        "zero": v == 0,
        "underflow": (v != 0) & (c == 0),
        "subnormal": (a > 0) & (a < tiny),
        "normal": torch.isfinite(a) & (a >= tiny),
        "overflow": torch.isinf(c) & ~torch.isnan(v),
        "nan": torch.isnan(c) & (v != 0),  # a zero stays "zero", even at a NaN or infinite scale
    }
    return {k: int(m.sum()) for k, m in counts.items()}


def torch_add(a, b, dtype) -> float:
    """``a + b`` with both operands stored in ``dtype`` and added by torch."""
    dt = _float_dtype(dtype, _ARITHMETIC)
    a, b = _real("a", a), _real("b", b)
    return float(torch.tensor(a, dtype=torch.float32).to(dt) + torch.tensor(b, dtype=torch.float32).to(dt))


#: The longest loop of ``torch_accumulate`` (a few seconds).
MAX_STEPS = 10**6


def torch_accumulate(w0, update, steps: int, dtype) -> np.ndarray:
    """The weight after each of ``steps`` in-place additions ``w += update``, in torch's ``dtype``.

    Returns ``steps + 1`` values (the start included), as float64.
    """
    dt = _float_dtype(dtype, _ARITHMETIC)
    w0, update = _real("w0", w0), _real("update", update)
    steps = _whole("steps", steps, 0, MAX_STEPS)
    w = torch.tensor(w0, dtype=torch.float32).to(dt)
    u = torch.tensor(update, dtype=torch.float32).to(dt)
    out = np.empty(steps + 1)
    out[0] = float(w)
    for i in range(1, steps + 1):
        w += u
        out[i] = float(w)
    return out
