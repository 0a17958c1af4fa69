"""A gradient check-up for your own model: which loss scale, and would bf16 be safer?

``examine(model, batch)`` runs one float32 forward and backward pass of a learner's ``nn.Module`` on
one batch, collects every parameter's gradient and the gradient of every leaf module's output (the
activation gradients, which a float16 backward pass holds too), and reports with ``ampviz.formats.census``:

* per parameter and per module output, the share of its gradient that float16 flushes to zero
  ("lost") or keeps only as a subnormal, at scale 1;
* the largest |gradient| and the largest power-of-two loss scale at which none overflows
  (``ampviz.scaling.lesson.largest_safe_scale``);
* the smallest power-of-two scale at which less than 0.1% of all these gradients is lost, hence a
  recommended range for the initial loss scale (``torch.amp.GradScaler``'s ``init_scale``), or
  the news that no scale loses < 0.1% without overflowing;
* whether bf16 would be safer, and why: forward values (module outputs) beyond fp16's range
  overflow whatever the loss scale; gradients that overflow fp16 even at scale 1; or an empty
  range of good scales.

The model is left as it was: its ``.grad`` tensors, its train/eval flags and its buffers (e.g.
BatchNorm statistics) are restored and every hook is removed, also when the pass fails.

The module also holds the small helpers notebook 07 uses to compare training modes on one
seeded model (``make_mlp``, ``train_modes``, ``lost_table``, ``moved_table``, ``speed_table``).
It imports torch, so ``ampviz/__init__`` never imports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from ampviz.formats.census import CensusResult, census, underflow_fractions
from ampviz.formats import FloatFormat, _describe, get_format
from ampviz.text import Table, measured, number
from ampviz.scaling.lesson import largest_safe_scale

__all__ = [
    "LOST_TARGET",
    "Diagnosis",
    "examine",
    "make_mlp",
    "Trial",
    "train_modes",
    "lost_shares",
    "lost_table",
    "moved_share",
    "moved_table",
    "speed_table",
]

#: The lost share a recommended scale must stay below (0.1%, as in NVIDIA's mixed-precision guide).
LOST_TARGET = 1e-3
_MAX_LOG2 = 127  # a scale is a float32 number


# ------------------------------------------------------------------ the diagnosis
@dataclass(frozen=True, eq=False)
class Diagnosis:
    """What ``examine`` found. Censuses are at scale 1 in ``fmt``, keyed by parameter name
    (``params``) and by module name (``activations``: the gradient of that module's output).

    ``grad_max``: the largest |gradient| of all of them; ``safe_scale``: the largest power of two
    at which none overflows (None if all are zero); ``lost``: the share of all gradient values lost
    at scale 1; ``needed_scale``: the smallest power of two (>= 1) at which less than
    ``LOST_TARGET`` of them is lost (None if no float32 scale does); ``scale_range``: (needed,
    safe) when needed <= safe, else None; ``act_max``: the largest |output| per module (forward);
    ``bf16_safer`` with its ``reasons``; ``bf16_lost``: the share bf16 would lose at scale 1;
    ``nonfinite``: how many gradients are already inf or NaN in float32 (no format or scale helps
    those: ``grad_max`` and the scales are about the finite ones).
    """

    fmt: FloatFormat
    params: dict
    activations: dict
    act_max: dict
    grad_max: float
    safe_scale: float | None
    lost: float
    subnormal: float
    total: int
    needed_scale: float | None
    scale_range: tuple | None
    bf16_safer: bool
    reasons: tuple
    bf16_lost: float
    grads: dict = field(repr=False, default_factory=dict)
    nonfinite: int = 0

    # ---- display
    def summary(self) -> list:
        f = self.fmt.name
        n_lost = round(self.lost * self.total)
        lines = [f"{len(self.params)} parameter gradients and {len(self.activations)} module-output "
                 f"gradients, {self.total:,} values, cast to {f}"]
        if self.safe_scale is not None:
            safe = number(self.safe_scale, pow2=True)
        elif self.nonfinite == 0:
            safe = "none (every gradient is 0)"
        elif self.nonfinite == self.total:
            safe = "none (every gradient is inf or NaN)"
        else:
            safe = "none (every finite gradient is 0)"
        if self.nonfinite:
            lines.append(f"largest finite |gradient|: {measured(self.grad_max, 3)} ({self.nonfinite:,} gradients are "
                         f"inf or NaN already in float32); largest safe scale: {safe}")
        else:
            lines.append(f"largest |gradient|: {measured(self.grad_max, 3)}; largest safe scale: {safe}")
        lines.append(f"at scale 1: lost {n_lost:,} ({100 * self.lost:.2f}%), "
                     f"subnormal {100 * self.subnormal:.2f}%")
        if self.needed_scale is None:
            need = f"none: no scale loses less than {100 * LOST_TARGET:g}%"
        else:
            need = number(self.needed_scale, pow2=True)
        lines.append(f"smallest scale losing < {100 * LOST_TARGET:g}%: {need}")
        if self.safe_scale is None:
            lines.append("recommended initial scale: none (no finite nonzero gradient to scale)")
        elif self.scale_range is None:
            lines.append(f"recommended initial scale: none fits in {f}")
        else:
            lo, hi = (number(s, pow2=True) for s in self.scale_range)
            inside = "inside" if self.scale_range[0] <= 2.0**16 <= self.scale_range[1] else "outside"
            lines.append(f"recommended initial scale: {lo} to {hi} (GradScaler's default 2^16 is {inside})")
        lines.append(f"bf16 safer: {'yes' if self.bf16_safer else 'no'}; " + "; ".join(self.reasons))
        return lines

    def table(self, kind: str | None = None) -> Table:
        """One row per parameter and module output (``kind``: "param" or "output" for one of
        them): size, largest |g|, lost and subnormal shares at scale 1, and the lost share at the
        low end of the recommended range (if any)."""
        if kind not in (None, "param", "output"):
            raise ValueError(f"kind must be 'param', 'output' or None (both), got {_describe(kind)}")
        s = self.scale_range[0] if self.scale_range else None
        head = f"lost at {number(s, pow2=True)} (low end)" if s is not None else "lost at low end: -"
        rows = []
        for k, results in (("param", self.params), ("output", self.activations)):
            if kind is not None and k != kind:
                continue
            for name, c in results.items():
                fr = c.fractions
                g = self.grads[(k, name)]
                big = float(np.max(np.abs(g))) if g.size else 0.0
                at_s = f"{100 * census(g, self.fmt, s).fractions['underflow']:.2f}%" if s is not None else "-"
                rows.append((name, k, f"{c.total:,}", measured(big, 2), f"{100 * fr['underflow']:.2f}%",
                             f"{100 * fr['subnormal']:.1f}%", at_s))
        return Table(("name", "gradient of", "values", "largest |g|", "lost at 1", "subnormal at 1", head),
                     rows, title=f"{self.fmt.name}, by layer")

    def __str__(self) -> str:
        return "\n".join(self.summary()) + "\n\n" + str(self.table())

    __repr__ = __str__

    def _repr_html_(self) -> str:
        import html
        items = "".join(f"<li>{html.escape(line)}</li>" for line in self.summary())
        return f"<ul>{items}</ul>" + self.table()._repr_html_()


# ------------------------------------------------------------------ examine
_BATCH_FORMS = "pass examine(model, (x, y)), or (x, None) without a target"


def _what(x) -> str:
    """A short name for what a learner passed: "a tensor", "a tuple of 3 items", ..."""
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)}"
    if isinstance(x, (tuple, list, dict)):
        return f"a {type(x).__name__} of {len(x)} item{'' if len(x) == 1 else 's'}"
    return _describe(x)


def _one_line(exc: BaseException) -> str:
    try:
        lines = str(exc).strip().splitlines()
    except Exception:  # a broken __str__
        lines = []
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _split_batch(batch) -> tuple:
    """(inputs as a tuple for model(*inputs), target), with one clear error for any other form."""
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        raise TypeError(f"batch must be (inputs, target): got {_what(batch)}; {_BATCH_FORMS}")
    inputs, target = batch
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    elif isinstance(inputs, (tuple, list)):
        inputs = tuple(inputs)
    else:
        raise TypeError(f"inputs (the first item of batch) must be a tensor or a tuple of tensors for "
                        f"model(*inputs), got {_what(inputs)}; {_BATCH_FORMS}")
    return inputs, target


def _default_loss(output, target):
    """Cross-entropy for integer class labels (as the course's training loop), else the mean."""
    if not isinstance(output, torch.Tensor):
        raise TypeError(f"the model returned {_what(output)}, not a tensor, so the default loss cannot use it: "
                        "pass loss_fn=lambda output, target: ... that computes the loss from it")
    if target is not None and not isinstance(target, torch.Tensor):
        raise TypeError(f"target must be a tensor (class labels, or anything loss_fn takes) or None, got "
                        f"{_what(target)}; {_BATCH_FORMS}")
    if target is not None and not target.is_floating_point() and output.dim() >= 2:
        try:
            return nn.functional.cross_entropy(output.float(), target)
        except Exception as exc:  # shapes, labels out of range, bool labels
            raise ValueError(f"cross-entropy of the output (shape {tuple(output.shape)}) with the integer target "
                             f"(shape {tuple(target.shape)}) failed ({_one_line(exc)}): pass one class label "
                             "0..C-1 per row, or a loss_fn") from exc
    return output.float().mean()


def _leaf_modules(model: nn.Module) -> dict:
    return {name: m for name, m in model.named_modules() if name and not any(True for _ in m.children())}


def examine(model: nn.Module, batch, loss_fn=None, *, fmt="fp16") -> Diagnosis:
    """One float32 forward and backward pass of ``model`` on ``batch``, and what ``fmt`` makes of
    its gradients (see the module docstring).

    ``batch``: ``(inputs, target)`` as the course's ``Task.batch()`` returns it; ``inputs`` is a
    tensor or a tuple of tensors passed as ``model(*inputs)``; ``target`` may be None. The loss is
    ``loss_fn(output, target)`` if given, else cross-entropy when ``target`` holds integer class
    labels, else ``output.float().mean()``. Tensors are moved to the device of the model's
    parameters. The pass runs in train mode, without autocast, in the model's own dtype.

    Anything else gets one TypeError or ValueError that says what to pass: a batch that is not
    such a pair (a lone tensor), a model without trainable parameters, a forward pass that fails,
    a model output the default loss cannot use (a tuple, a dict), a loss that is not one number
    or does not depend on the parameters (a detached output). An error raised by ``loss_fn``
    itself reaches the caller as it is.
    """
    fmt = get_format(fmt)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {_what(model)}; pass examine(model, (x, y))")
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError(f"loss_fn must be a function loss_fn(output, target) or None, got {_what(loss_fn)}")
    inputs, target = _split_batch(batch)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters (none with requires_grad=True), so it has no "
                         "gradients to examine: pass a model with parameters, or unfreeze them")
    device = params[0][1].device
    inputs = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs)
    if isinstance(target, torch.Tensor):
        target = target.to(device)

    saved_grads = [(p, p.grad) for _, p in params]
    saved_modes = [(m, m.training) for m in model.modules()]
    saved_buffers = [(b, b.detach().clone()) for b in model.buffers()]
    act_grads: dict = {}
    act_max: dict = {}
    handles = []

    def forward_hook(name):
        def keep(grad):
            g = grad.detach().float().reshape(-1).cpu().numpy()
            act_grads[name] = np.concatenate([act_grads[name], g]) if name in act_grads else g.copy()

        def hook(module, args, output):
            if isinstance(output, torch.Tensor) and output.is_floating_point():
                m = float(output.detach().abs().max()) if output.numel() else 0.0
                prev = act_max.get(name, 0.0)
                act_max[name] = m if math.isnan(m) or m > prev else prev  # NaN sticks
                if output.requires_grad:
                    output.register_hook(keep)
        return hook

    leaves = _leaf_modules(model)
    try:
        for name, m in leaves.items():
            handles.append(m.register_forward_hook(forward_hook(name)))
        model.train()
        for _, p in params:
            p.grad = None
        try:
            output = model(*inputs)
        except Exception as exc:  # wrong shapes, dtypes or argument count: the learner's inputs
            kind = TypeError if isinstance(exc, TypeError) else ValueError
            raise kind(f"model(*inputs) failed ({_one_line(exc)}): pass inputs the model accepts, "
                       "as batch = (inputs, target)") from exc
        loss = loss_fn(output, target) if loss_fn is not None else _default_loss(output, target)
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"loss_fn must return the loss as a tensor, got {_what(loss)}")
        if loss.numel() != 1:
            raise ValueError(f"the loss must be one number, got a tensor of shape {tuple(loss.shape)}: "
                             "reduce it in loss_fn, e.g. with .mean()")
        if not loss.requires_grad:
            raise ValueError("the loss does not depend on the model's trainable parameters (the output is "
                             "detached, or computed under torch.no_grad()): examine needs a loss it can "
                             "backpropagate; return the model's output as it is")
        try:
            loss.backward()
        except Exception as exc:
            raise ValueError(f"loss.backward() failed ({_one_line(exc)}): examine needs a model whose "
                             "loss backpropagates in float32") from exc
        grads = {("param", n): (torch.zeros_like(p) if p.grad is None else p.grad).detach().float()
                 .reshape(-1).cpu().numpy() for n, p in params}
    finally:
        for h in handles:
            h.remove()
        for p, g in saved_grads:
            p.grad = g
        for m, flag in saved_modes:
            m.training = flag
        with torch.no_grad():
            for b, value in saved_buffers:
                b.copy_(value)
    grads.update({("output", n): act_grads[n] for n in leaves if n in act_grads})  # forward order
    return _diagnose(fmt, grads, act_max)


def _diagnose(fmt: FloatFormat, grads: dict, act_max: dict) -> Diagnosis:
    params = {n: census(g, fmt, 1.0) for (kind, n), g in grads.items() if kind == "param"}
    acts = {n: census(g, fmt, 1.0) for (kind, n), g in grads.items() if kind == "output"}
    every = np.concatenate([g for g in grads.values()]) if grads else np.zeros(0, np.float32)
    total = int(every.size)
    whole = census(every, fmt, 1.0)
    lost, subnormal = (whole.counts[k] / max(total, 1) for k in ("underflow", "subnormal"))
    finite = every[np.isfinite(every)]
    grad_max = float(np.max(np.abs(finite))) if finite.size else 0.0
    nonfinite = total - finite.size
    safe = largest_safe_scale(finite, fmt) if grad_max > 0 else None
    scales = 2.0 ** np.arange(0, _MAX_LOG2 + 1)
    shares = underflow_fractions(every, fmt, scales)
    ok = np.flatnonzero(shares < LOST_TARGET)
    needed = float(scales[ok[0]]) if ok.size else None
    scale_range = (needed, safe) if needed is not None and safe is not None and needed <= safe else None
    if needed is not None and safe is None:  # all zero: nothing to lose, nothing to overflow
        scale_range = None

    reasons = []  # why bf16 would be safer (or, last, why not)
    notes = []  # what neither bf16 nor a loss scale fixes: values already inf or NaN in float32
    broken = sorted(n for n, v in act_max.items() if not math.isfinite(v))
    over = {n: v for n, v in act_max.items()
            if math.isfinite(v) and census(np.float32(v), fmt, 1.0).counts["overflow"]}
    if over:
        name, v = max(over.items(), key=lambda kv: kv[1])
        reasons.append(f"{len(over)} module output(s) reach |value| {measured(v, 3)} ({name}), beyond {fmt.name}'s max "
                       f"{number(fmt.max)}: they overflow in the forward pass whatever the loss scale")
    if broken:
        notes.append(f"{len(broken)} module output(s) are already inf or NaN in float32 ({broken[0]})")
    if nonfinite:
        notes.append(f"{nonfinite:,} gradients are already inf or NaN in float32: neither bf16 (float32's "
                     "range) nor a loss scale fixes that; find where they come from (data, loss, model) first")
    if safe is not None and safe < 1:
        reasons.append(f"gradients up to {measured(grad_max, 3)} overflow {fmt.name} even at scale 1")
    elif needed is not None and safe is not None and needed > safe:
        reasons.append(f"losing < {100 * LOST_TARGET:g}% needs scale {number(needed, pow2=True)}, but "
                       f"{number(2 * safe, pow2=True)} already overflows: the gradients span more than "
                       f"{fmt.name}'s range")
    elif needed is None and safe is not None:
        reasons.append(f"no float32 scale brings the lost share below {100 * LOST_TARGET:g}%")
    bf16 = get_format("bf16")
    bf16_lost = census(every, bf16, 1.0).counts["underflow"] / max(total, 1)
    safer = bool(reasons)
    if safer:
        reasons.append(f"bf16 loses {100 * bf16_lost:.2f}% at scale 1 and holds up to {number(bf16.max, digits=3)}")
    elif safe is None:
        reasons.append("every gradient is 0: there is nothing to scale" if not nonfinite
                       else "no gradient is finite and nonzero: there is nothing to scale")
    elif scale_range is not None:
        reasons.append(f"a loss scale from {number(scale_range[0], pow2=True)} to "
                       f"{number(scale_range[1], pow2=True)} keeps {fmt.name} within range")
    reasons = notes + reasons
    return Diagnosis(fmt=fmt, params=params, activations=acts, act_max=dict(act_max), grad_max=grad_max,
                     safe_scale=safe, lost=lost, subnormal=subnormal, total=total, needed_scale=needed,
                     scale_range=scale_range, bf16_safer=safer, reasons=tuple(reasons), bf16_lost=bf16_lost,
                     grads=grads, nonfinite=nonfinite)


# ------------------------------------------------------------------ comparing training modes
def make_mlp(depth: int = 12, seed: int = 0) -> nn.Module:
    """The course's MLP (``ampviz.training.live.MLP``: 32 inputs, 64 units wide, 10 classes) with ``depth``
    layers, initialised from ``seed`` (the caller's random state is left alone). Its inputs are the
    "mlp" task's, so ``run_training(TrainConfig(model="mlp", ...), model=make_mlp())`` trains it."""
    from ampviz.training.live import MLP

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MLP(depth=depth)


@dataclass
class Trial:
    """One mode's run, the trained model, and its parameters before training (float32 copies)."""

    mode: str
    run: object
    model: nn.Module
    start: dict


def train_modes(modes, *, depth: int = 12, seed: int = 0, census_fmt=None, **config) -> dict:
    """Train a fresh ``make_mlp(depth, seed)`` in each mode on the same batches (``TrainConfig``
    fields as keywords, e.g. ``steps=100``). ``census_fmt``: a format, or a dict mode -> format
    (default fp16). Returns mode -> ``Trial``."""
    from ampviz.training.live import TrainConfig, run_training

    out = {}
    for mode in modes:
        fmt = census_fmt.get(mode, "fp16") if isinstance(census_fmt, dict) else (census_fmt or "fp16")
        model = make_mlp(depth, seed)
        start = {n: p.detach().clone() for n, p in model.named_parameters()}
        cfg = TrainConfig(model="mlp", mode=mode, seed=seed, census_fmt=fmt, **config)
        out[mode] = Trial(mode, run_training(cfg, model=model), model, start)
    return out


def _first_census(run, step):
    for rec in run.records:
        if rec.step == step and rec.param_census is not None:
            return rec.param_census
    raise ValueError(f"the run has no parameter census at step {step}")


def lost_shares(run, step: int = 0, reference=None) -> dict:
    """Per parameter, the share of its gradient lost at ``step``: values that end as 0 in the
    census's format (counted "zero" or "underflow") beyond the exact zeros of ``reference`` (a run
    of the same model in fp32, whose zeros are dead ReLU units; without it, "underflow" only).

    Under fp16 autocast an underflowed gradient reaches ``.grad`` as an exact 0, so only a
    reference can tell it from a dead unit."""
    cen = _first_census(run, step)
    ref = _first_census(reference, step) if reference is not None else None
    out = {}
    for name, c in cen.items():
        if ref is None:
            out[name] = c.counts["underflow"] / max(c.total, 1)
        else:
            extra = c.counts["zero"] + c.counts["underflow"] - ref[name].counts["zero"]
            out[name] = max(extra, 0) / max(c.total, 1)
    return out


def lost_table(runs: dict, step: int = 0, reference="fp32", weights_only: bool = True) -> Table:
    """One row per parameter, one column per run (label -> ``Run`` or ``Trial``): the share of
    its gradient lost at ``step`` (``lost_shares`` against ``reference``: the label of one of
    ``runs``, or a ``Run`` / ``Trial``), and a last row for all parameters together. A column
    whose census format is not the first column's names its format."""
    runs = {k: getattr(v, "run", v) for k, v in runs.items()}
    ref = runs.get(reference) if isinstance(reference, str) else getattr(reference, "run", reference)
    per = {k: lost_shares(r, step, ref) for k, r in runs.items()}
    first = next(iter(runs.values()))
    cen = _first_census(first, step)
    names = [n for n in cen if not weights_only or n.endswith("weight")]
    sizes = {n: cen[n].total for n in cen}
    fmt = cen[names[0]].fmt.name if names else ""
    heads = [k if _first_census(r, step)[names[0]].fmt.name == fmt else f"{k} (in {_first_census(r, step)[names[0]].fmt.name})"
             for k, r in runs.items()] if names else list(runs)
    rows = [(n, f"{sizes[n]:,}", *(f"{100 * per[k][n]:.2f}%" for k in runs)) for n in names]
    total = sum(sizes[n] for n in names)
    rows.append(("all", f"{total:,}", *(f"{100 * sum(per[k][n] * sizes[n] for n in names) / total:.2f}%"
                                         for k in runs)))
    return Table(("parameter", "values", *heads), rows,
                 title=f"share of each gradient lost (ends as 0 in {fmt}) at step {step}")


def moved_share(trial: Trial, name: str | None = None) -> float:
    """The share of the weights (of one parameter, or of all) that differ from their start, compared
    in the dtype the model keeps them in."""
    moved = total = 0
    for n, p in trial.model.named_parameters():
        if name is not None and n != name:
            continue
        start = trial.start[n].to(p.dtype)
        moved += int((p.detach() != start).sum())
        total += p.numel()
    return moved / max(total, 1)


def moved_table(trials: dict, weights_only: bool = True) -> Table:
    """One row per parameter, one column per trial: the share of its weights that moved at all."""
    first = next(iter(trials.values()))
    names = [n for n, _ in first.model.named_parameters() if not weights_only or n.endswith("weight")]
    rows = [(n, *(f"{100 * moved_share(t, n):.1f}%" for t in trials.values())) for n in names]
    rows.append(("all", *(f"{100 * moved_share(t):.1f}%" for t in trials.values())))
    steps = len(first.run)
    return Table(("parameter", *trials), rows, title=f"share of weights changed after {steps} steps")


def speed_table(trials: dict) -> Table:
    """Measured training speed per mode (median step time, the first step left out): a timing,
    different on every machine and every run."""
    rows = []
    base = None
    for label, t in trials.items():
        run = getattr(t, "run", t)
        times = run["step_time"][1:]
        times = times[np.isfinite(times)]
        med = float(np.median(times)) if times.size else math.nan
        base = med if base is None else base
        rows.append((label, f"{1 / med:,.0f}" if med > 0 else "-", f"{1000 * med:.2f}",
                     f"{base / med:.2f}×" if med > 0 else "-"))
    device = getattr(getattr(next(iter(trials.values())), "run", None), "device", "")
    first = next(iter(trials))
    return Table(("mode", "steps/s", "ms/step (median)", f"speed vs {first}"), rows, title=device)
