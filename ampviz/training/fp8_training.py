"""Real FP8 training on the CPU with torchao, and every FP8 cast it makes, counted exactly.

torchao's float8 training (``torchao.float8.convert_to_float8_training``, torchao 0.18) swaps each
``nn.Linear`` for a ``Float8Linear``. Each of its three matrix products takes two FP8 operands, and
each operand is cast just before the product by ``hp_tensor_to_float8_dynamic``, looked up in
``torchao/float8/float8_linear.py``: six casts per layer per step.

=============  ===============  ===========================  =============================
product        role             tensor cast                  rowwise: one scale per
=============  ===============  ===========================  =============================
output         input            the layer's input x          row of x (``axiswise_dim=-1``)
output         weight           W.t() (in, out)              output unit (``axiswise_dim=0``)
grad_input     grad_output      dL/dy, reshaped (n, out)     row (``axiswise_dim=-1``)
grad_input     weight           W.t() (in, out)              input unit (``axiswise_dim=-1``)
grad_weight    grad_output      dL/dy, reshaped (n, out)     output unit (``axiswise_dim=0``)
grad_weight    input            x, reshaped (n, in)          input unit (``axiswise_dim=0``)
=============  ===============  ===========================  =============================

Each cast is current scaling (``ampviz.formats.fp8``): ``amax = max |x|`` (over the tensor, or
along ``axiswise_dim``), ``scale = f32(max / max(amax, 1e-12))`` (``EPS``), rounded down to a power
of two in the rowwise recipe, and ``data = fp8(clamp(f32(x * scale), -max, max))``. The recipes
(``Float8LinearConfig.from_recipe_name``): ``"tensorwise"`` casts the input and weight to E4M3 and
grad_output to E5M2, one scale per tensor; ``"rowwise"`` casts all three to E4M3, one power-of-two
scale per row or column as in the table.

``record_fp8_casts(model, batch, recipe)`` converts a copy of the model, runs one forward and
backward pass, and keeps every cast: the high-precision tensor, torchao's scale and its FP8 data,
with the counts a lesson shows (``CastCounts``: saturated, clamped, underflowed, subnormal).
``reference_cast`` computes the same cast with the package alone (``current_quantize``, the format's
own cast and categories), to compare bit for bit. ``train_fp8`` trains the course's beam model (or
another ``ampviz.training.live`` model) a few steps in float32, under bf16 autocast, or with its
Linear layers in FP8, and returns the loss per step.

What the counts show: current scaling maps each amax to the format's max, so nothing saturates
(saturated is 0 in every cast of finite values). The clamp still touches values: the amax's product
``f32(amax * scale)`` can come out one float32 step above max, and torchao's power-of-two rounding
can round a scale just below 2**k up to 2**k (``clamped``); both round to max anyway. What is lost
is underflow: values far below their tensor's (or row's) amax. Below an amax of 1e-12 the scale
stops growing (the EPS floor, at ``max * 1e12``), so a tensor (or row) of values all below about
1e-18 in E4M3, or 1e-22 in E5M2, underflows entirely: tiny gradients vanish.

torchao is imported inside the functions (it is a test-only dependency for now); without it they
raise ``ImportError("needs torchao: pip install torchao==0.18.0")``. This module needs torch.
"""

from __future__ import annotations

import copy
import inspect
import logging
import os
from dataclasses import dataclass, fields, replace

import numpy as np
import torch
from torch import nn

from ampviz._args import _flag, _seed, _shown, _whole
from ampviz.formats.catalog import FP8_E4M3, FP8_E5M2
from ampviz.formats.fp8.current import current_quantize
from ampviz.formats.spec import OVERFLOW, SUBNORMAL, UNDERFLOW, FloatFormat

__all__ = ["RECIPES", "TRAIN_MODES", "ROLES", "GEMMS", "CastCounts", "Fp8Cast", "Fp8Casts", "ReferenceCast",
           "Fp8Run", "cast_counts", "record_fp8_casts", "reference_cast", "train_fp8"]

#: torchao's float8 recipes recorded here (``Float8LinearConfig.from_recipe_name``).
RECIPES = ("tensorwise", "rowwise")
#: What ``train_fp8`` trains in: float32, bf16 autocast, or an FP8 recipe.
TRAIN_MODES = ("fp32", "bf16-autocast") + RECIPES
#: The roles of a cast (torchao's ``GemmInputRole``) and the products they feed.
ROLES = ("input", "weight", "grad_output")
GEMMS = ("output", "grad_input", "grad_weight")
_NEEDS = "needs torchao: pip install torchao==0.18.0"
_FORMATS = {torch.float8_e4m3fn: FP8_E4M3, torch.float8_e5m2: FP8_E5M2}


def _torchao():
    """torchao's float8 modules (config, float8_linear, float8_linear_utils), or one clear ImportError."""
    if not torch.cuda.is_available():  # its CUDA kernels cannot load here; skip trying (and the noise)
        os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")
    # torchao's import logs two warnings a learner can do nothing about (the skipped CUDA kernels, and
    # torch's note on an Enum it registers): quiet those two loggers while it imports, then restore them.
    quiet = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [log.level for log in quiet]
    for log in quiet:
        log.setLevel(logging.ERROR)
    try:
        from torchao.float8 import config, float8_linear, float8_linear_utils
    except ImportError:
        raise ImportError(_NEEDS) from None
    finally:
        for log, level in zip(quiet, levels):
            log.setLevel(level)
    return config, float8_linear, float8_linear_utils


# ------------------------------------------------------------------ counts
@dataclass(frozen=True)
class CastCounts:
    """What one FP8 cast did to its ``size`` values (x the high-precision value, y = f32(x * scale)):

    * ``saturated``: |y| past the format's overflow boundary (max plus half a step: beyond 464 for
      E4M3, from 61440 on for E5M2), where rounding alone would overflow; the clamp holds it at
      ±max. The package's rule (``ampviz.formats.fp8.simulate_fp8_scaling``, ``census``).
    * ``clamped``: |y| > max, every value the clamp changed (the saturated ones, and those between
      max and the boundary, which round to max anyway).
    * ``underflowed``: x != 0 whose FP8 value is 0.
    * ``subnormal``: FP8 value nonzero and below the format's smallest normal.

    NaN values count in none of them. Counts add (``a + b``)."""

    size: int
    saturated: int
    clamped: int
    underflowed: int
    subnormal: int

    def __add__(self, other: "CastCounts") -> "CastCounts":
        if not isinstance(other, CastCounts):
            return NotImplemented
        return CastCounts(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


_NONE = CastCounts(0, 0, 0, 0, 0)


def _fmt_of(fmt) -> FloatFormat:
    if fmt in _FORMATS:
        return _FORMATS[fmt]
    if fmt in (FP8_E4M3, FP8_E5M2):
        return fmt
    raise ValueError(f"fmt must be FP8_E4M3 or FP8_E5M2 (or torch.float8_e4m3fn, torch.float8_e5m2), "
                     f"not {_shown(fmt)}")


def cast_counts(x, scale, fmt) -> CastCounts:
    """The counts of casting ``x`` (float32 values, any shape) at ``scale`` (a number, or float32
    scales that broadcast against x, as torchao's rowwise scales do) to ``fmt``, by the package's
    own rules: y = f32(x * scale) in numpy, its category from ``FloatFormat.classify_codes``."""
    f = _fmt_of(fmt)
    x = np.asarray(x, np.float32)
    s = np.asarray(scale, np.float32)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        y = np.asarray(x * s, np.float32)
    x = np.broadcast_to(x, y.shape)
    cls = np.asarray(f.classify_codes(y))
    cls = np.where((y == 0) & (x != 0), UNDERFLOW, cls)  # the product itself underflowed in float32
    return CastCounts(size=int(y.size), saturated=int((cls == OVERFLOW).sum()),
                      clamped=int((np.abs(y) > np.float32(f.max)).sum()),
                      underflowed=int((cls == UNDERFLOW).sum()), subnormal=int((cls == SUBNORMAL).sum()))


def _torch_counts(hp: torch.Tensor, scale: torch.Tensor, fp8: torch.Tensor) -> CastCounts:
    """The counts from torchao's own output: its scale and FP8 data, with the product recomputed as
    torchao computes it (``hp.to(float32) * scale``) and the format read from ``torch.finfo``."""
    fi = torch.finfo(fp8.dtype)
    top = float(fi.max)
    step = 2.0 ** np.floor(np.log2(top)) * float(fi.eps)  # the gap below max
    boundary = top + step / 2  # a tie there goes to the even neighbour: max if its last bit is 0
    tie_overflows = int(top / step) % 2 == 1
    with torch.no_grad():
        y = hp.detach().to(torch.float32) * scale
        a = y.abs()
        data = fp8.to(torch.float32)
        sat = (a > boundary) | ((a == boundary) if tie_overflows else torch.zeros_like(a, dtype=torch.bool))
        return CastCounts(size=int(y.numel()), saturated=int(sat.sum()), clamped=int((a > top).sum()),
                          underflowed=int(((hp != 0) & (data == 0)).sum()),
                          subnormal=int(((data != 0) & (data.abs() < fi.smallest_normal)).sum()))


# ------------------------------------------------------------------ the records
@dataclass(frozen=True, eq=False)
class Fp8Cast:
    """One cast torchao made: ``layer`` (the module's name), ``role`` (one of ``ROLES``), ``gemm``
    (the product it feeds, one of ``GEMMS``), ``fmt`` (FP8_E4M3 or FP8_E5M2), ``granularity``
    ("tensorwise" or "rowwise"), ``axis`` (torchao's ``axiswise_dim``, the axis the amax is taken
    along; None for tensorwise), ``pow2`` (scales rounded down to powers of two), ``hp`` (the
    high-precision tensor as torchao received it, float32; ``hp_dtype`` its torch dtype), ``amax``,
    ``scale`` (float32, torchao's shape: 0-d, or keeping the reduced axis as 1), ``data`` (the FP8
    values, float32), ``codes`` (their bit patterns, uint8) and ``counts`` (``CastCounts`` from
    torchao's output). Arrays are read-only."""

    layer: str
    role: str
    gemm: str
    fmt: FloatFormat
    granularity: str
    axis: int | None
    pow2: bool
    hp: np.ndarray
    hp_dtype: str
    amax: np.ndarray
    scale: np.ndarray
    data: np.ndarray
    codes: np.ndarray
    counts: CastCounts

    def __repr__(self) -> str:
        c = self.counts
        return (f"Fp8Cast({self.layer} {self.role}->{self.gemm}, {self.fmt.name} {self.granularity}, "
                f"shape {self.hp.shape}: {c.underflowed} underflowed, {c.subnormal} subnormal, "
                f"{c.saturated} saturated of {c.size})")


@dataclass(frozen=True, eq=False)
class Fp8Casts:
    """The casts of one forward and backward pass (``record_fp8_casts``), in the order torchao made
    them: ``recipe``, ``loss`` (the float32 loss of the pass) and ``casts`` (``Fp8Cast``s)."""

    recipe: str
    loss: float
    casts: tuple

    @property
    def layers(self) -> tuple:
        """The converted layers, in forward order."""
        return tuple(dict.fromkeys(c.layer for c in self.casts))

    def select(self, layer=None, role=None, gemm=None) -> tuple:
        """The casts of ``layer``, ``role`` and ``gemm`` (None: any)."""
        return tuple(c for c in self.casts if (layer is None or c.layer == layer)
                     and (role is None or c.role == role) and (gemm is None or c.gemm == gemm))

    def total(self, layer=None, role=None, gemm=None) -> CastCounts:
        """The counts of those casts, added."""
        return sum((c.counts for c in self.select(layer, role, gemm)), _NONE)

    def table(self) -> str:
        """One line per cast: layer, role, product, format, shape, the amax and the scale (their range
        over the rows for rowwise, 3 significant digits) and the counts."""
        def span(a) -> str:
            a = np.asarray(a, np.float64).ravel()
            lo, hi = f"{a.min():.3g}", f"{a.max():.3g}"
            return lo if lo == hi else f"{lo}..{hi}"

        rows = [f"{'layer':<13} {'role':<11} {'product':<11} {'format':<8} {'shape':<7} {'amax':>17} {'scale':>17} "
                f"{'underflowed':>11} {'subnormal':>9} {'clamped':>7} {'saturated':>9} {'values':>7}"]
        for c in self.casts:
            n = c.counts
            rows.append(f"{c.layer:<13} {c.role:<11} {c.gemm:<11} {c.fmt.name:<8} {'x'.join(map(str, c.hp.shape)):<7} "
                        f"{span(c.amax):>17} {span(c.scale):>17} "
                        f"{n.underflowed:>11,} {n.subnormal:>9,} {n.clamped:>7,} {n.saturated:>9,} {n.size:>7,}")
        return "\n".join(rows)


def _numpy(t: torch.Tensor) -> np.ndarray:
    """A read-only numpy copy: float tensors (any float dtype, fp8 included) as float32, others as they are."""
    t = t.detach().cpu()
    a = np.array((t.to(torch.float32) if t.is_floating_point() else t).numpy(), order="C")
    a.flags.writeable = False
    return a


def _split_batch(batch):
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
        raise TypeError(f"batch must be (inputs, targets), as a task's batch() returns it, not {_shown(batch)}")
    inputs, targets = batch
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    if not all(isinstance(t, torch.Tensor) for t in inputs + (targets,)):
        raise TypeError("batch must hold tensors: (inputs, targets), inputs a tensor or a tuple of them")
    return inputs, targets


def _recipe(recipe) -> str:
    if not isinstance(recipe, str) or recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {', '.join(map(repr, RECIPES))}, not {_shown(recipe)}")
    return recipe


def _config(recipe: str, emulate: bool):
    config, _, _ = _torchao()
    return replace(config.Float8LinearConfig.from_recipe_name(recipe), emulate=emulate)


def _convert(model: nn.Module, recipe: str, emulate: bool, module_filter_fn=None) -> nn.Module:
    """``model`` with its Linear layers swapped in place (those ``module_filter_fn(module, name)`` passes)."""
    _, _, utils = _torchao()
    if not any(isinstance(m, nn.Linear) for m in model.modules()):
        raise ValueError("model has no nn.Linear layer for torchao to convert to FP8")
    return utils.convert_to_float8_training(model, config=_config(recipe, emulate), module_filter_fn=module_filter_fn)


def record_fp8_casts(model: nn.Module, batch, recipe: str = "tensorwise", *, loss=None,
                     emulate: bool = False) -> Fp8Casts:
    """Convert a copy of ``model`` with torchao's ``recipe`` ("tensorwise" or "rowwise"), run one
    forward and backward pass on ``batch`` = (inputs, targets) (inputs a tensor or a tuple of them,
    for ``model(*inputs)``), and record every FP8 cast torchao makes (``Fp8Casts``). ``model``
    itself is left alone.

    ``loss(output, targets)`` defaults to ``mse_loss`` for float targets, ``cross_entropy`` for class
    labels. ``emulate``: torchao's ``Float8LinearConfig(emulate=...)``; the casts are the same either
    way (False runs the products with ``torch._scaled_mm``, which the CPU has). The casts are
    recorded by wrapping ``hp_tensor_to_float8_dynamic`` where ``float8_linear.py`` looks it up; the
    original is put back afterwards, also when the pass fails."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch nn.Module, not {_shown(model)}")
    recipe = _recipe(recipe)
    emulate = _flag("emulate", emulate)
    inputs, targets = _split_batch(batch)
    if loss is None:
        loss = nn.functional.mse_loss if targets.is_floating_point() else nn.functional.cross_entropy
    elif not callable(loss):
        raise TypeError(f"loss must be a function loss(output, targets), not {_shown(loss)}")
    converted = _convert(copy.deepcopy(model), recipe, emulate)
    value, casts = _record_pass(converted, inputs, targets, loss)
    return Fp8Casts(recipe, value, casts)


def _record_pass(converted: nn.Module, inputs: tuple, targets, loss) -> tuple:
    """One forward and backward pass of an already converted model, recording every FP8 cast:
    (the float32 loss, the ``Fp8Cast``s in order). The gradients stay in ``converted``."""
    _, fl, _ = _torchao()
    names = {id(m.linear_mm_config): (name or "(model)") for name, m in converted.named_modules()
             if isinstance(m, fl.Float8Linear)}
    real = fl.hp_tensor_to_float8_dynamic
    signature = inspect.signature(real)
    casts, phase, seen = [], ["forward"], {}

    def recorded(*args, **kwargs):
        out = real(*args, **kwargs)
        a = signature.bind(*args, **kwargs)
        a.apply_defaults()
        a = a.arguments
        layer = names.get(id(a["linear_mm_config"]), "?")
        role = a["gemm_input_role"].value
        if phase[0] == "forward":
            gemm = "output"
        elif role == "grad_output":  # grad_input's cast comes first, then grad_weight's
            seen[layer] = seen.get(layer, 0) + 1
            gemm = "grad_input" if seen[layer] == 1 else "grad_weight"
        else:
            gemm = "grad_input" if role == "weight" else "grad_weight"
        axis = a["axiswise_dim"]
        hp = a["hp_tensor"]
        with torch.no_grad():
            amax = hp.abs().amax() if axis is None else hp.abs().amax(dim=axis, keepdim=True)
            counts = _torch_counts(hp, out._scale, out._data)
        casts.append(Fp8Cast(
            layer=layer, role=role, gemm=gemm, fmt=_FORMATS[a["float8_dtype"]],
            granularity="tensorwise" if axis is None else "rowwise", axis=axis,
            pow2=bool(a["round_scales_to_power_of_2"]), hp=_numpy(hp), hp_dtype=str(hp.dtype).replace("torch.", ""),
            amax=_numpy(amax), scale=_numpy(out._scale), data=_numpy(out._data),
            codes=_numpy(out._data.view(torch.uint8)), counts=counts))
        return out

    fl.hp_tensor_to_float8_dynamic = recorded
    try:
        out = converted(*inputs)
        value = loss(out, targets)
        phase[0] = "backward"
        value.backward()
    finally:
        fl.hp_tensor_to_float8_dynamic = real
    return float(value.detach()), tuple(casts)


# ------------------------------------------------------------------ the package's own cast
@dataclass(frozen=True, eq=False)
class ReferenceCast:
    """A cast computed by the package alone (``reference_cast``): ``scale`` (float32, in torchao's
    shape), ``data`` (FP8 values, float32), ``codes`` (uint8) and ``counts`` (``cast_counts``)."""

    scale: np.ndarray
    data: np.ndarray
    codes: np.ndarray
    counts: CastCounts


def reference_cast(cast: Fp8Cast) -> ReferenceCast:
    """The cast ``cast`` records, computed from its high-precision tensor by the package alone:
    ``ampviz.formats.fp8.current_quantize`` (the scale rule and the saturating cast, with the amax
    taken along ``cast.axis``: the axis is moved last for its rowwise scaling, and back) and
    ``cast_counts`` on the package's scale. torchao's scale, data and counts should equal these
    bit for bit."""
    if not isinstance(cast, Fp8Cast):
        raise TypeError(f"cast must be an Fp8Cast (from record_fp8_casts), not {_shown(cast)}")
    x = cast.hp
    if cast.axis is None:
        q = current_quantize(x, cast.fmt, "tensorwise", cast.pow2)
        scale, data, codes = q.scale, q.data, q.codes
    else:
        q = current_quantize(np.moveaxis(x, cast.axis, -1), cast.fmt, "rowwise", cast.pow2)
        scale, data, codes = (np.moveaxis(v, -1, cast.axis) for v in (q.scale, q.data, q.codes))
    scale, data, codes = (np.array(v, order="C") for v in (scale, data, codes))  # 0-d stays 0-d
    for v in (scale, data, codes):
        v.flags.writeable = False
    return ReferenceCast(scale, data, codes, cast_counts(x, scale, cast.fmt))


# ------------------------------------------------------------------ training
class _LossCurve:
    """``start`` (the first step's loss) and ``end`` (the mean of the last 10 steps') of a run's ``losses``."""

    losses: np.ndarray

    @property
    def start(self) -> float:
        return float(self.losses[0])

    @property
    def end(self) -> float:
        return float(np.mean(self.losses[-10:]))


@dataclass(frozen=True, eq=False)
class Fp8Run(_LossCurve):
    """The losses of ``train_fp8``: ``mode``, ``model``, ``seed``, ``losses`` (one per step, float64,
    read-only) and ``error`` (None, or why the run stopped early). ``start`` is the first step's
    loss, ``end`` the mean of the last 10 steps' losses."""

    mode: str
    model: str
    seed: int
    losses: np.ndarray
    error: str | None = None


def train_fp8(mode: str = "tensorwise", steps: int = 50, *, model: str = "beam", seed: int = 0, lr=None,
              batch_size=None, emulate: bool = False) -> Fp8Run:
    """Train the course's ``model`` ("beam", or another of ``ampviz.training.live.MODELS``) for
    ``steps`` steps in ``mode``: "fp32", "bf16-autocast", or an FP8 recipe ("tensorwise",
    "rowwise"), and return its loss per step (``Fp8Run``).

    It is the course's training loop, ``run_training(TrainConfig(model, mode, steps, seed, lr,
    batch_size, census_every=0))`` (the seeded model, batches, loss and optimizer of
    ``build_task(model, seed)``), in "fp32" for an FP8 recipe, with the task's model converted by
    ``convert_to_float8_training`` and torchao's recipe config (``emulate`` as in
    ``record_fp8_casts``), and in "bf16" (CPU autocast) for "bf16-autocast". It runs on one torch
    thread (the thread count is restored after), so two runs with one seed give the same losses.
    In the "transformer", attention's ``out_proj`` is swapped too, but ``nn.MultiheadAttention``
    reads its weight directly, so attention stays in float32: only the feed-forward layers and the
    head cast to FP8."""
    from ampviz.training.live import MODELS, TrainConfig, build_task, run_training

    if not isinstance(mode, str) or mode not in TRAIN_MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, TRAIN_MODES))}, not {_shown(mode)}")
    if not isinstance(model, str) or model not in MODELS:
        raise ValueError(f"model must be one of {', '.join(map(repr, MODELS))}, not {_shown(model)}")
    steps = _whole("steps", steps, 1, 10**5)
    seed = _seed(seed, spare=2)
    emulate = _flag("emulate", emulate)
    config = TrainConfig(model=model, mode="bf16" if mode == "bf16-autocast" else "fp32", steps=steps, seed=seed,
                         lr=lr, batch_size=batch_size, census_every=0, device="cpu")
    net = None
    if mode in RECIPES:
        net = _convert(build_task(model, seed, config.batch_size).model, mode, emulate)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run = run_training(config, model=net)
    finally:
        torch.set_num_threads(threads)
    losses = np.array(run["loss"], np.float64)
    if run.error is not None:
        losses = losses[:-1]  # the last record holds the error, not a step
    losses.flags.writeable = False
    return Fp8Run(mode, model, seed, losses, run.error)
