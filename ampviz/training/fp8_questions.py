"""Three questions about FP8 training, each answered by a real run (torchao 0.18, on the CPU).

1. **Which layers to keep in high precision?** ``filter_runs`` trains the beam model (or the MLP)
   with torchao's ``convert_to_float8_training(model, module_filter_fn=...)`` under several filters
   (``FILTERS``), and records which Linear layers each one converts and the loss per step.
   torchao's recommended filter (the example in ``convert_to_float8_training``'s documentation):
   do not convert the last module, nor any Linear whose ``in_features`` or ``out_features`` is not a
   multiple of 16 (the FP8 matrix multiply's hardware requirement). Its experimental automatic
   filter (``_auto_filter_for_recipe``) adds size thresholds from H100 benchmarks (tensorwise
   converts a layer only if in_features > 4096 or out_features > 1024; rowwise asks more); it
   converts none of the course's small layers (``FilterRuns.auto_converted`` is empty).
2. **Does FP8 need a GradScaler?** ``scaler_effect`` trains the same seeded run with the loss
   multiplied by S and the gradients multiplied back by 1/S, as a scaler does. The gradients flow
   in high precision between layers, and each cast of grad_output takes its own current scale from
   its own amax, so for a power of two S the FP8 codes, their counts and the final weights are the
   same bit for bit, as long as no amax falls below torchao's floor of 1e-12 (``EPS``): there the
   scale stops growing and a scale S shrinks the values with it. Beside it, the same first batch
   under fp16 autocast, where S decides how many gradients underflow.
3. **The dtype gradients accumulate in.** ``accumulation_runs`` sums the beam model's gradients
   over micro-batches into float32 ``.grad`` buffers, or bf16 ones (bf16 parameters), with torch's
   own autograd accumulation, against the float64 sum of the same micro-batch gradients.

Each returns plain records (dataclasses of numbers, names and read-only numpy arrays). torchao is
imported inside the functions (``ImportError`` without it, as in ``fp8_training``).
"""

from __future__ import annotations

import copy
import hashlib
import math
import numbers
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ampviz._args import _seed, _shown, _whole
from ampviz.formats.fp8.current import EPS
from ampviz.training.fp8_training import Fp8Casts, _convert, _LossCurve, _numpy, _recipe, _record_pass, _torchao

__all__ = ["FILTERS", "QUESTION_MODELS", "GRAD_DTYPES", "FilterRun", "FilterRuns", "ScaledRun", "Fp16Underflow",
           "ScalerEffect", "AccumulationRun", "module_filter", "linear_names", "filter_runs", "scaler_effect",
           "accumulation_runs"]

#: The filters ``filter_runs`` compares: which Linear layers stay ``nn.Linear``.
FILTERS = ("all", "ends", "dims16", "torchao")
_FILTER_WORDS = {
    "all": "every Linear converted",
    "ends": "the first and the last Linear kept in high precision",
    "dims16": "Linears whose in_features or out_features is not a multiple of 16 kept",
    "torchao": "torchao's documented filter: the last Linear, and those not multiples of 16, kept",
}
#: The course's models these questions train (``ampviz.training.live.build_task``).
QUESTION_MODELS = ("beam", "mlp")
#: The dtypes of the ``.grad`` buffers ``accumulation_runs`` accumulates into.
GRAD_DTYPES = ("fp32", "bf16")
_GRAD_TORCH = {"fp32": torch.float32, "bf16": torch.bfloat16}
MAX_MICRO_BATCHES = 1024


def _model_name(model) -> str:
    if not isinstance(model, str) or model not in QUESTION_MODELS:
        raise ValueError(f"model must be 'beam' or 'mlp', not {_shown(model)}")
    return model


def _one_thread(fn):
    """``fn()`` on one torch thread (the count restored after), so seeded runs repeat exactly."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn()
    finally:
        torch.set_num_threads(threads)


def _readonly(a) -> np.ndarray:
    a = np.array(a)
    a.flags.writeable = False
    return a


# ------------------------------------------------------------------ 1. which layers to keep
def linear_names(model: nn.Module) -> tuple:
    """The names of ``model``'s ``nn.Linear`` layers, in the order they are registered (for the
    course's models, the forward order)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch nn.Module, not {_shown(model)}")
    return tuple(name for name, m in model.named_modules() if isinstance(m, nn.Linear))


def module_filter(filter: str, model: nn.Module):
    """The ``module_filter_fn(module, name)`` for ``convert_to_float8_training`` that ``filter``
    (one of ``FILTERS``) describes for ``model``: True converts the layer, False keeps it.

    * "all": every Linear (what passing no filter does);
    * "ends": all but the first and the last Linear;
    * "dims16": the Linears whose ``in_features`` and ``out_features`` are both multiples of 16;
    * "torchao": torchao's documented example: all but the last Linear and those not multiples of 16."""
    if not isinstance(filter, str) or filter not in FILTERS:
        raise ValueError(f"filter must be one of {', '.join(map(repr, FILTERS))}, not {_shown(filter)}")
    names = linear_names(model)
    if not names:
        raise ValueError("model has no nn.Linear layer for torchao to convert to FP8")

    def dims16(m) -> bool:
        return m.in_features % 16 == 0 and m.out_features % 16 == 0

    rules = {"all": lambda m, n: True,
             "ends": lambda m, n: n not in (names[0], names[-1]),
             "dims16": lambda m, n: dims16(m),
             "torchao": lambda m, n: n != names[-1] and dims16(m)}
    rule = rules[filter]

    def module_filter_fn(module: nn.Module, fqn: str) -> bool:
        return isinstance(module, nn.Linear) and rule(module, fqn)

    module_filter_fn.__doc__ = _FILTER_WORDS[filter]
    return module_filter_fn


@dataclass(frozen=True, eq=False)
class FilterRun(_LossCurve):
    """One filtered run: ``filter`` (one of ``FILTERS``), ``converted`` and ``kept`` (the Linear
    layers' names, as ``Float8Linear`` and as ``nn.Linear``), ``cast_layers`` (the layers whose FP8
    casts one recorded pass of the fresh model made), ``losses`` (one per step, float64, read-only)
    and ``error`` (None, or why the run stopped). ``start``: the first loss; ``end``: the mean of
    the last 10."""

    filter: str
    converted: tuple
    kept: tuple
    cast_layers: tuple
    losses: np.ndarray
    error: str | None = None


@dataclass(frozen=True, eq=False)
class FilterRuns:
    """``filter_runs``'s answer: the ``model``, ``recipe``, ``steps`` and ``seed``; ``fp32`` (the
    same run's losses with no layer converted); ``runs`` (a ``FilterRun`` per filter); and
    ``auto_converted`` (the layers torchao's automatic filter for the recipe would convert)."""

    model: str
    recipe: str
    steps: int
    seed: int
    fp32: np.ndarray
    runs: tuple
    auto_converted: tuple

    def run(self, filter: str) -> FilterRun:
        for r in self.runs:
            if r.filter == filter:
                return r
        raise ValueError(f"filter must be one of {', '.join(repr(r.filter) for r in self.runs)} (the filters "
                         f"run), not {_shown(filter)}")

    @property
    def fp32_end(self) -> float:
        return float(np.mean(self.fp32[-10:]))


def _filter_names(filters) -> tuple:
    if isinstance(filters, str):
        filters = (filters,)
    try:
        filters = tuple(filters)
    except TypeError:
        raise TypeError(f"filters must be names from {', '.join(map(repr, FILTERS))}, not {_shown(filters)}") from None
    bad = [f for f in filters if not (isinstance(f, str) and f in FILTERS)]
    if bad or not filters:
        raise ValueError(f"filters must be names from {', '.join(map(repr, FILTERS))}, not {_shown(filters)}")
    return tuple(dict.fromkeys(filters))


def filter_runs(model: str = "beam", recipe: str = "tensorwise", steps: int = 50, seed: int = 0, *,
                filters=FILTERS) -> FilterRuns:
    """Train the course's ``model`` ("beam" or "mlp") ``steps`` steps with torchao's ``recipe``
    ("tensorwise" or "rowwise"), once per filter in ``filters`` (``FILTERS``: "all", "ends",
    "dims16", "torchao"), and once in float32.

    Each run is ``train_fp8``'s: the course's loop (``run_training``) on the seeded task of
    ``build_task(model, seed)``, one torch thread, with the model converted by
    ``convert_to_float8_training(model, config=..., module_filter_fn=module_filter(filter, model))``.
    The "all" run is ``train_fp8(recipe)`` itself. Before training, one forward and backward pass of
    the freshly converted model on the task's first batch records which layers cast to FP8."""
    from ampviz.training.live import TrainConfig, build_task, run_training

    model = _model_name(model)
    recipe = _recipe(recipe)
    steps = _whole("steps", steps, 1, 10**5)
    seed = _seed(seed, spare=2)
    filters = _filter_names(filters)
    _, fl, utils = _torchao()
    config = TrainConfig(model=model, mode="fp32", steps=steps, seed=seed, census_every=0, device="cpu")

    def losses_of(net) -> tuple:
        run = _one_thread(lambda: run_training(config, model=net))
        losses = np.array(run["loss"], np.float64)
        return _readonly(losses[:-1] if run.error is not None else losses), run.error

    fp32, _ = losses_of(None)
    runs = []
    for name in filters:
        task = build_task(model, seed, config.batch_size)
        fn = module_filter(name, task.model)
        net = _convert(task.model, recipe, False, fn)
        converted = tuple(n for n, m in net.named_modules() if isinstance(m, fl.Float8Linear))
        kept = tuple(n for n, m in net.named_modules() if type(m) is nn.Linear)
        probe = build_task(model, seed, config.batch_size)  # the first batch, from a stream of its own
        inputs, targets = probe.batch()
        _, casts = _one_thread(lambda: _record_pass(copy.deepcopy(net), inputs, targets, probe.loss))
        losses, error = losses_of(net)
        runs.append(FilterRun(name, converted, kept, tuple(dict.fromkeys(c.layer for c in casts)), losses, error))
    auto = utils._auto_filter_for_recipe(recipe, [])
    plain = build_task(model, seed, config.batch_size).model
    auto_converted = tuple(n for n, m in plain.named_modules() if isinstance(m, nn.Linear) and auto(m, n))
    return FilterRuns(model, recipe, steps, seed, fp32, tuple(runs), auto_converted)


# ------------------------------------------------------------------ 2. does FP8 need a GradScaler?
@dataclass(frozen=True, eq=False)
class ScaledRun:
    """One run of ``scaler_effect`` at loss scale ``scale``: per step (arrays, read-only)
    ``losses`` (the unscaled float32 loss), ``underflowed`` (nonzero values of the grad_output casts
    that became 0 in FP8, all layers added), ``floored`` (the grad_output amaxes, whole tensors or
    rows, below torchao's floor of 1e-12) and ``digests`` (a SHA-256 of the grad_output casts' FP8
    codes, in cast order); ``values`` (the grad_output values cast per step), ``weights`` (every
    parameter after the last step, flattened, float32) and ``first`` (the first step's casts,
    ``Fp8Casts``)."""

    scale: float
    losses: np.ndarray
    underflowed: np.ndarray
    floored: np.ndarray
    digests: tuple
    values: int
    weights: np.ndarray
    first: Fp8Casts


@dataclass(frozen=True)
class Fp16Underflow:
    """The first batch under fp16 autocast with the loss multiplied by ``scale``: of ``values``
    gradients of the Linear layers' outputs (nonzero in float32 at scale 1), ``underflowed`` are 0."""

    scale: float
    values: int
    underflowed: int


@dataclass(frozen=True, eq=False)
class ScalerEffect:
    """``scaler_effect``'s answer: ``recipe``, ``steps``, ``seed``; ``runs`` (a ``ScaledRun`` per
    scale, in the order asked) and ``fp16`` (an ``Fp16Underflow`` per scale)."""

    recipe: str
    steps: int
    seed: int
    runs: tuple
    fp16: tuple

    def run(self, scale) -> ScaledRun:
        for r in self.runs:
            if r.scale == scale:
                return r
        raise ValueError(f"scale must be one of the scales run ({', '.join(repr(r.scale) for r in self.runs)}), "
                         f"not {_shown(scale)}")

    def same(self, a, b) -> bool:
        """Whether the runs at scales ``a`` and ``b`` cast the same FP8 codes at every step and end
        with the same weights, bit for bit."""
        ra, rb = self.run(a), self.run(b)
        return ra.digests == rb.digests and np.array_equal(ra.weights.view(np.uint32), rb.weights.view(np.uint32))


def _scales(scales) -> tuple:
    what = "scales must be positive numbers whose float32 value and reciprocal are finite, such as (1.0, 65536.0)"
    try:
        scales = tuple(scales)
    except TypeError:
        raise TypeError(f"{what}, not {_shown(scales)}") from None
    if not scales:
        raise ValueError(f"{what}, not an empty list")
    out = []
    for s in scales:
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, numbers.Real):
            raise TypeError(f"{what}, not {_shown(s)}")
        try:
            with np.errstate(over="ignore", divide="ignore"):
                s32 = float(np.float32(float(s)))
                inv = float(np.float32(1 / np.float64(s32))) if s32 > 0 else math.inf
        except OverflowError:  # an int beyond float range
            s32 = inv = math.inf
        if not (math.isfinite(s32) and s32 > 0 and math.isfinite(inv)):
            raise ValueError(f"{what}, not {_shown(s)}")
        out.append(s32)
    return tuple(dict.fromkeys(out))


def _scaled_run(recipe: str, scale: float, steps: int, seed: int) -> ScaledRun:
    """The beam model trained ``steps`` steps in ``recipe`` with the loss times ``scale`` and the
    gradients times 1/scale (float32, computed in float64 as GradScaler's ``unscale_`` does)."""
    from ampviz.training.live import TrainConfig, build_task

    task = build_task("beam", seed)
    net = _convert(task.model, recipe, False)
    opt = torch.optim.Adam(net.parameters(), lr=TrainConfig(model="beam").learning_rate)
    s = torch.tensor(scale, dtype=torch.float32)
    inv = torch.tensor(scale, dtype=torch.float64).reciprocal().float()
    underflowed, floored, digests, first, values = [], [], [], None, 0
    plain = []

    def scaled_loss(output, targets):
        loss = nn.functional.mse_loss(output, targets)
        plain.append(float(loss.detach()))
        return loss * s

    for step in range(steps):
        inputs, targets = task.batch()
        opt.zero_grad(set_to_none=True)
        _, casts = _record_pass(net, inputs, targets, scaled_loss)
        for p in net.parameters():
            p.grad.mul_(inv)
        opt.step()
        grads = [c for c in casts if c.role == "grad_output"]
        underflowed.append(sum(c.counts.underflowed for c in grads))
        floored.append(sum(int((np.asarray(c.amax, np.float64) < EPS).sum()) for c in grads))
        digest = hashlib.sha256()
        for c in grads:
            digest.update(c.codes.tobytes())
        digests.append(digest.hexdigest())
        if first is None:
            first, values = Fp8Casts(recipe, plain[-1], casts), sum(c.counts.size for c in grads)
    weights = torch.cat([p.detach().reshape(-1) for p in net.parameters()]).to(torch.float32)
    return ScaledRun(scale, _readonly(np.array(plain, np.float64)), _readonly(np.array(underflowed, np.int64)),
                     _readonly(np.array(floored, np.int64)), tuple(digests), values, _numpy(weights), first)


def scaler_effect(recipe: str = "tensorwise", scales=(1.0, 2.0**-20, 2.0**16), steps: int = 20,
                  seed: int = 0) -> ScalerEffect:
    """The beam model trained ``steps`` steps with torchao's ``recipe``, once per loss scale S in
    ``scales``: the loss multiplied by S before the backward pass, the gradients multiplied by 1/S
    before Adam's step (what a loss scaler does, here at a fixed S). Each step records the FP8
    casts of grad_output (``ScaledRun``). Beside them, the first batch's backward pass under fp16
    autocast at each S (``ampviz.training.beam.gradients``): how many of the Linear layers' output
    gradients are 0 there (``Fp16Underflow``).

    What it shows: for a power of two S, ``S * x`` has the same FP8 codes as ``x`` under current
    scaling (the scale comes out divided by S exactly), so the FP8 codes, the underflow counts and
    the final weights do not change with S, unless S pushes an amax below the 1e-12 floor
    (``floored``), where the scale stops growing and the tiny gradients vanish. In fp16 the same S
    moves every gradient against fixed limits, and decides how many underflow."""
    from ampviz.training.beam import gradients

    recipe = _recipe(recipe)
    scales = _scales(scales)
    steps = _whole("steps", steps, 1, 10**4)
    seed = _seed(seed, spare=2)
    _torchao()
    runs = tuple(_one_thread(lambda: _scaled_run(recipe, s, steps, seed)) for s in scales)
    exact = _one_thread(lambda: gradients(seed)).layer_outputs
    fp16 = []
    for s in scales:
        g = _one_thread(lambda: gradients(seed, loss_scale=s, autocast="float16")).layer_outputs
        fp16.append(Fp16Underflow(s, int((exact != 0).sum()), int(((g == 0) & (exact != 0)).sum())))
    return ScalerEffect(recipe, steps, seed, runs, tuple(fp16))


# ------------------------------------------------------------------ 3. the dtype gradients accumulate in
@dataclass(frozen=True)
class AccumulationRun:
    """The beam model's gradient summed over ``micro_batches`` micro-batches (each loss divided by
    their number, as gradient accumulation does) into ``grad_dtype`` ("fp32" or "bf16") ``.grad``
    buffers: ``relative_error`` (the 2-norm of its error against the float64 sum of the same
    micro-batch gradients, over the norm of that sum), ``floor`` (the same for that sum rounded
    once to ``grad_dtype``: the least a buffer of that dtype can do) and ``values`` (the number of
    gradient values)."""

    grad_dtype: str
    micro_batches: int
    relative_error: float
    floor: float
    values: int


def _micro_batches(micro_batches) -> tuple:
    what = f"micro_batches must be whole numbers from 1 to {MAX_MICRO_BATCHES:,}, such as (1, 8, 32)"
    if isinstance(micro_batches, (numbers.Integral, np.integer)) and not isinstance(micro_batches, (bool, np.bool_)):
        micro_batches = (micro_batches,)
    try:
        values = tuple(micro_batches)
    except TypeError:
        raise TypeError(f"{what}, not {_shown(micro_batches)}") from None
    if not values:
        raise ValueError(f"{what}, not an empty list")
    out = []
    for n in values:
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, (numbers.Integral, np.integer)):
            raise TypeError(f"{what}, not {_shown(n)}")
        if not 1 <= int(n) <= MAX_MICRO_BATCHES:
            raise ValueError(f"{what}, not {_shown(n)}")
        out.append(int(n))
    return tuple(dict.fromkeys(out))


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).to(torch.float64) for t in tensors])


def _relative(a: torch.Tensor, exact: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(a - exact) / torch.linalg.vector_norm(exact))


def accumulation_runs(micro_batches=(1, 8, 32), grad_dtype: str = "fp32", *, batch_size: int = 256,
                      seed: int = 0) -> tuple:
    """For each count n in ``micro_batches``: the beam model's gradient over the first n
    micro-batches of ``batch_size`` examples (its seeded task, ``build_task("beam", seed)``),
    accumulated by torch's autograd (``loss / n`` backward n times, no zeroing between) into
    ``grad_dtype`` ``.grad`` buffers, against the float64 sum of the same n gradients
    (``AccumulationRun`` per n).

    The model's weights are first rounded to bf16, so that both runs compute the same float32
    micro-batch gradients: "fp32" backpropagates through the float32 model (float32 ``.grad``);
    "bf16" through bf16 parameters used as float32 (``torch.func.functional_call`` with each
    bf16 parameter's ``.float()``), so each micro-batch gradient is rounded to bf16 once and added
    into a bf16 ``.grad``. The float64 sum adds the float32 gradients of ``torch.autograd.grad``."""
    from torch.func import functional_call

    from ampviz.training.live import build_task

    counts = _micro_batches(micro_batches)
    if not isinstance(grad_dtype, str) or grad_dtype not in GRAD_DTYPES:
        raise ValueError(f"grad_dtype must be 'fp32' or 'bf16', not {_shown(grad_dtype)}")
    batch_size = _whole("batch_size", batch_size, 1, 4096)
    seed = _seed(seed, spare=2)

    def measure() -> tuple:
        task = build_task("beam", seed, batch_size)
        model = task.model
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).to(torch.float32))
        names = [n for n, _ in model.named_parameters()]
        params = list(model.parameters())
        batches = [task.batch() for _ in range(max(counts))]
        out = []
        for n in counts:
            exact = sum(_flat(torch.autograd.grad(task.loss(model(*x), y) / n, params)) for x, y in batches[:n])
            if grad_dtype == "fp32":
                model.zero_grad(set_to_none=True)
                for x, y in batches[:n]:
                    (task.loss(model(*x), y) / n).backward()
                grads = [p.grad for p in params]
            else:
                low = {name: p.detach().to(torch.bfloat16).requires_grad_() for name, p in zip(names, params)}
                for x, y in batches[:n]:
                    output = functional_call(model, {k: v.float() for k, v in low.items()}, x)
                    (task.loss(output, y) / n).backward()
                grads = [low[name].grad for name in names]
            once = exact.to(_GRAD_TORCH[grad_dtype]).to(torch.float64)
            out.append(AccumulationRun(grad_dtype, n, _relative(_flat(grads), exact), _relative(once, exact),
                                       int(exact.numel())))
        return tuple(out)

    return _one_thread(measure)
