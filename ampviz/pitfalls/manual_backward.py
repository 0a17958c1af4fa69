"""Pitfall 1: ``loss.backward()`` instead of ``self.manual_backward(loss)`` under fp16 AMP (torch, lightning),
and two more traps of manual optimization under a GradScaler: ``update()`` once per optimizer, and clipping.

A LightningModule with manual optimization (``automatic_optimization = False``) must call
``self.manual_backward(loss)``: that call goes through the precision plugin, whose ``pre_backward``
returns ``scaler.scale(loss)``. A bare ``loss.backward()`` never scales, and what happens then
depends on the precision Lightning really uses. Each scenario below runs a small seeded model
(three linear layers, SGD, four batches of 16) through a quiet ``lightning.Trainer`` and returns
an ``Outcome``:

* ``cpu_16_mixed``: ``Trainer(accelerator="cpu", precision="16-mixed")`` warns and uses bf16
  autocast with **no** GradScaler, so the buggy code runs, silently;
* ``fp16_loss_backward``: real fp16 AMP (``plugins=[MixedPrecision("16-mixed", "cpu")]``); the
  buggy code raises ``AssertionError: Attempted unscale_ but _scale is None. ...`` at the first
  ``opt.step()``;
* ``fp16_late_loss_backward``: one ``manual_backward`` first, bare ``loss.backward()`` after it:
  no error, and every later gradient is divided by the scale (65536);
* ``fp16_manual_backward``: the fix; gradient norms match fp32 closely;
* ``several_optimizers``: Lightning's plugin calls ``scaler.update()`` inside each ``opt.step()``,
  so an iteration whose loss spike overflows every optimizer's gradients halves the scale once per
  optimizer;
* ``partial_overflow``: one ``manual_backward``, several optimizers, only some of them overflow:
  the first overflowing optimizer's ``update()`` halves the scale before the later optimizers
  unscale, so each later optimizer applies its gradient times 2 (``applied_factor``);
* ``torch_recipe``: the same case in plain PyTorch (one ``scaler.scale(loss).backward()``,
  ``scaler.step`` per optimizer, one ``scaler.update()`` per iteration): the overflowing optimizer
  is skipped, the others apply their true gradient;
* ``clipping``: ``self.clip_gradients`` in manual optimization, at the four places it can go;
* ``run_manual``: the runner all the Lightning scenarios use, for exercises.

``precision_table``, ``norms_table``, ``trace_table``, ``steps_table`` and ``clip_table`` print the
results; ``check_*`` are the lesson's exercise checkers. Gradient norms are those the optimizer
stepped with: the norm of all gradients right after the ``opt.step()`` calls of an iteration (the
precision plugin unscales them in place before stepping). Each optimizer step is also recorded
(``details["steps"]``): the scale the gradients were multiplied by in the backward pass, the scale
``unscale_`` divided them by, whether the scaler skipped the step, and the *applied* gradient (the
one the optimizer stepped with) against the *true* one (the gradients right after the backward
divided by the scale of that backward), and how many gradient entries are inf or NaN after the
step. Lightning is imported inside the functions.
"""

from __future__ import annotations

import logging
import math
import sys
import tempfile
import warnings

import torch

from ampviz.checks import Check, _yes_no, check
from ampviz.text import Table, measured
from ampviz.formats.lesson import _close
from ampviz.pitfalls import Outcome, outcome_of, quiet_trainer

__all__ = [
    "BACKWARDS",
    "CLIPS",
    "run_manual",
    "cpu_16_mixed",
    "precision_warnings",
    "fp16_loss_backward",
    "fp16_late_loss_backward",
    "fp16_manual_backward",
    "fp32_reference",
    "several_optimizers",
    "partial_overflow",
    "torch_recipe",
    "clipping",
    "applied_factor",
    "precision_table",
    "norms_table",
    "trace_table",
    "steps_table",
    "clip_table",
    "check_cpu_precision",
    "check_partial_overflow_factor",
    "check_unscale_wrapper_raises",
    "check_third_optimizer_factor",
    "check_clip_before_step_norm",
]

#: The backward calls ``run_manual`` can put into ``training_step``. The last one is the GAN
#: pattern: per optimizer a forward pass, its own ``self.manual_backward(loss)`` and its ``opt.step()``.
BACKWARDS = ("manual_backward", "loss.backward", "manual_backward, then loss.backward",
             "manual_backward per optimizer")
#: Where ``run_manual`` clips the gradients (``self.clip_gradients(..., gradient_clip_algorithm="norm")``):
#: right before ``opt.step()``; after your own ``scaler.unscale_(opt)`` with ``opt = self.optimizers()``
#: (Lightning's wrapper); after ``scaler.unscale_(opt.optimizer)`` (the torch optimizer inside it);
#: in the ``on_before_optimizer_step`` hook, which the plugin calls after its own ``unscale_``.
CLIPS = ("before opt.step()", "after scaler.unscale_(opt)", "after scaler.unscale_(opt.optimizer)",
         "in on_before_optimizer_step")
ITERATIONS = 4
BATCH = 16
SPIKE = 2.0**20  # the loss spike: its scaled gradients overflow fp16


def _loader():
    """Four fixed batches of 16: x ~ N(0, 1) in 8 dimensions, y = 0.1 · sum(x)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(ITERATIONS * BATCH, 8, generator=g)
    y = 0.1 * x.sum(1, keepdim=True)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH, shuffle=False)


def _params(opt) -> list:
    return [p for group in opt.param_groups for p in group["params"]]


def _inject_inf(opt) -> None:
    """Write inf into the first gradient entry of ``opt``'s first parameter: what an fp16
    overflow confined to that part of the network leaves in the gradients."""
    with torch.no_grad():
        _params(opt)[0].grad.view(-1)[0] = math.inf


def _snapshot(opt) -> list:
    return [None if p.grad is None else p.grad.detach().clone() for p in _params(opt)]


def _norms(opt, snapshot, scaled_by: float) -> tuple[float, float]:
    """(true norm, applied norm) over the gradient entries that were finite right after the
    backward: the snapshot divided by ``scaled_by``, and ``opt``'s gradients as they are now."""
    true_sq = applied_sq = torch.zeros((), dtype=torch.float64)
    for p, g in zip(_params(opt), snapshot):
        if g is None or p.grad is None:
            continue
        finite = torch.isfinite(g)
        true_sq = true_sq + g[finite].double().square().sum()
        applied_sq = applied_sq + p.grad.detach()[finite].double().square().sum()
    return true_sq.sqrt().item() / scaled_by, applied_sq.sqrt().item()


def _found_inf(scaler, opt) -> bool:
    """Whether ``scaler`` found inf/NaN in ``opt``'s gradients since its last ``update()`` (read
    right after ``scaler.step(opt)``: this is the verdict that made it skip ``opt.step()``)."""
    state = scaler._per_optimizer_states.get(id(opt))
    return bool(state) and any(v.item() for v in state["found_inf_per_device"].values())


def _step_record(iteration, k, call, scaled_by, unscaled_by, skipped, opt, snapshot, scale_after) -> dict:
    true, applied = _norms(opt, snapshot, scaled_by)
    nonfinite = sum(int((~torch.isfinite(p.grad)).sum()) for p in _params(opt) if p.grad is not None)
    return dict(iteration=iteration, optimizer=k + 1, call=call, scaled_by=scaled_by, unscaled_by=unscaled_by,
                skipped=skipped, true_norm=true, applied_norm=applied,
                factor=applied / true if true > 0 else None, scale_after=scale_after, nonfinite=nonfinite)


_MODULE = None


def _module_class():
    """The LightningModule, defined on first use (so that lightning is imported only then)."""
    global _MODULE
    if _MODULE is not None:
        return _MODULE
    import lightning as L

    class ManualModule(L.LightningModule):
        """Three linear layers, manual optimization, one SGD per layer or one for all."""

        def __init__(self, backward="manual_backward", optimizers=1, spike_at=None, lr=0.05, overflow_in=None,
                     clip=None, clip_val=0.1):
            super().__init__()
            self.automatic_optimization = False
            self.layers = torch.nn.ModuleList([torch.nn.Linear(8, 16), torch.nn.Linear(16, 16),
                                               torch.nn.Linear(16, 1)])
            self.backward_mode, self.n_optimizers, self.spike_at, self.lr = backward, optimizers, spike_at, lr
            self.overflow_in, self.clip, self.clip_val = overflow_in, clip, clip_val
            self.norms, self.losses, self.scales, self.trace, self.dtypes = [], [], [], [], []
            self.steps, self.found_inf = [], []

        def forward(self, x):
            h = torch.relu(self.layers[0](x))
            h = torch.relu(self.layers[1](h))
            return self.layers[2](h)

        def _scaler(self):
            return getattr(self.trainer.precision_plugin, "scaler", None)

        def _scale_now(self):
            scaler = self._scaler()
            return "no scaler" if scaler is None else scaler._scale

        def _note(self, i, moment):
            s = self._scale_now()
            self.trace.append((i, moment, s if isinstance(s, str) else (None if s is None else s.item())))

        def _loss(self, x, y, batch_idx):
            out = self(x)
            self.dtypes.append(out.dtype)
            loss = torch.nn.functional.mse_loss(out, y)
            self.losses.append(loss.item())
            if batch_idx == self.spike_at and self.overflow_in is None:
                loss = loss * SPIKE  # a loss spike: every optimizer's scaled gradients overflow fp16
            return loss

        def _backward(self, loss, batch_idx):
            """The backward call under test; returns the scale the gradients were multiplied by."""
            if self.backward_mode != BACKWARDS[1] and (self.backward_mode != BACKWARDS[2] or batch_idx == 0):
                self.manual_backward(loss)
                self._note(batch_idx, "after self.manual_backward(loss)")
                scaler = self._scaler()
                return 1.0 if scaler is None else scaler.get_scale()
            loss.backward()
            self._note(batch_idx, "after loss.backward()")
            return 1.0  # a bare backward scales nothing

        def _step(self, opt, k, batch_idx, scaled_by):
            """Overflow (if asked), clip (if asked), ``opt.step()``, and record what it applied."""
            if batch_idx == self.spike_at and self.overflow_in is not None and k + 1 in self.overflow_in:
                _inject_inf(opt)
            snapshot = _snapshot(opt)
            scaler = self._scaler()
            unscaled_by = 1.0 if scaler is None else scaler.get_scale()
            if self.clip == CLIPS[1]:
                scaler.unscale_(opt)  # opt: the LightningOptimizer wrapper
            elif self.clip == CLIPS[2]:
                scaler.unscale_(opt.optimizer)  # the torch optimizer inside it
            if self.clip in CLIPS[:3]:
                self.clip_gradients(opt, gradient_clip_val=self.clip_val, gradient_clip_algorithm="norm")
            found_before = len(self.found_inf)
            opt.step()
            skipped = self.found_inf[-1] if len(self.found_inf) > found_before else False
            self.scales.append(None if scaler is None else scaler.get_scale())
            self.steps.append(_step_record(batch_idx, k, f"opt{k + 1}.step()", scaled_by, unscaled_by, skipped,
                                           opt, snapshot, self.scales[-1]))

        def on_before_optimizer_step(self, optimizer):
            if self.clip == CLIPS[3]:  # the plugin has unscaled the gradients just before this hook
                self.clip_gradients(optimizer, gradient_clip_val=self.clip_val, gradient_clip_algorithm="norm")

        def training_step(self, batch, batch_idx):
            x, y = batch
            opts = self.optimizers()
            opts = opts if isinstance(opts, list) else [opts]
            for opt in opts:
                opt.zero_grad()
            self._note(batch_idx, "training_step starts")
            if self.backward_mode == BACKWARDS[3]:  # GAN pattern: each optimizer its own loss and backward
                for k, opt in enumerate(opts):
                    opt.zero_grad()
                    scaled_by = self._backward(self._loss(x, y, batch_idx), batch_idx)
                    self._step(opt, k, batch_idx, scaled_by)
            else:
                scaled_by = self._backward(self._loss(x, y, batch_idx), batch_idx)
                for k, opt in enumerate(opts):
                    self._step(opt, k, batch_idx, scaled_by)
            self._note(batch_idx, "after opt.step()")
            grads = [p.grad.norm() for p in self.parameters() if p.grad is not None]
            self.norms.append(torch.linalg.vector_norm(torch.stack(grads)).item())

        def configure_optimizers(self):
            if self.n_optimizers == 1:
                return torch.optim.SGD(self.parameters(), lr=self.lr)
            return [torch.optim.SGD(layer.parameters(), lr=self.lr) for layer in self.layers[:self.n_optimizers]]

    _MODULE = ManualModule
    return _MODULE


def _chain(frame_or_tb, stop="training_step") -> list[str]:
    """``file function`` for each frame from ``stop`` (excluded) inward, files relative to site-packages
    (the module's own helpers that ``training_step`` calls are left out: the chain shows the libraries)."""
    def where(code):
        path = code.co_filename.replace("\\", "/")
        for marker in ("site-packages/", "ampviz/"):
            if marker in path:
                path = ("ampviz/" if marker == "ampviz/" else "") + path.split(marker, 1)[1]
                break
        else:  # the standard library (contextlib): its file name
            path = path.rsplit("/", 1)[-1]
        return f"{path} {code.co_qualname}"

    if hasattr(frame_or_tb, "tb_frame"):  # a traceback: outermost first
        codes, tb = [], frame_or_tb
        while tb is not None:
            codes.append(tb.tb_frame.f_code)
            tb = tb.tb_next
        names = [c.co_name for c in codes]
        start = max(i for i, n in enumerate(names) if n == stop) + 1 if stop in names else 0
        return [w for w in map(where, codes[start:]) if not w.startswith(_HERE)]
    codes, f = [], frame_or_tb  # a frame: innermost first, walk out to ``stop``
    while f is not None and f.f_code.co_name != stop:
        codes.append(f.f_code)
        f = f.f_back
    return [w for w in map(where, reversed(codes)) if not w.startswith(_HERE)]


_HERE = "ampviz/pitfalls/manual_backward.py "


def _whole(value, low) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _check_overflow_in(overflow_in, optimizers: int, spike_at):
    """``overflow_in`` as a sorted tuple of optimizer numbers (1-based), or a one-line error."""
    if overflow_in is None:
        return None
    if isinstance(overflow_in, (str, bytes)) or not hasattr(overflow_in, "__iter__"):
        raise TypeError(f"overflow_in must be a tuple of optimizer numbers such as (1,), or None; "
                        f"got {type(overflow_in).__name__}")
    chosen = list(overflow_in)
    if not chosen or not all(_whole(k, 1) and k <= optimizers for k in chosen) or len(set(chosen)) != len(chosen):
        raise ValueError(f"overflow_in must name distinct optimizers, each 1 to optimizers={optimizers}; "
                         f"got {tuple(chosen)!r}"[:300])
    if spike_at is None:
        raise ValueError("overflow_in needs spike_at: the iteration whose gradients overflow")
    return tuple(sorted(chosen))


def _check_args(optimizers, iterations, spike_at):
    """One-line ValueErrors for the shape of a run: 1 to 3 optimizers, 1 to 4 iterations (the data
    has four batches), and a spike (if any) in one of those iterations."""
    if not _whole(optimizers, 1) or optimizers > 3:
        raise ValueError(f"optimizers must be 1 to 3, got {optimizers!r}"[:300])
    if not _whole(iterations, 1) or iterations > ITERATIONS:
        raise ValueError(f"iterations must be 1 to {ITERATIONS} (the data has {ITERATIONS} batches), "
                         f"got {iterations!r}"[:300])
    if spike_at is not None and (not _whole(spike_at, 0) or spike_at >= iterations):
        raise ValueError(f"spike_at must be an iteration, 0 to iterations - 1 = {iterations - 1}, or None; "
                         f"got {spike_at!r}"[:300])


def run_manual(backward: str = "manual_backward", *, fp16: bool = False, precision: str | None = None,
               optimizers: int = 1, spike_at: int | None = None, iterations: int = ITERATIONS,
               name: str | None = None, overflow_in=None, growth_interval: int | None = None,
               clip: str | None = None, clip_val: float = 0.1) -> Outcome:
    """Fit the seeded module for ``iterations`` batches and report what happened.

    ``backward``: one of ``BACKWARDS``. ``fp16=True``: real fp16 AMP with a GradScaler
    (``plugins=[MixedPrecision("16-mixed", "cpu")]``); otherwise ``precision`` goes to the Trainer
    (``None``: fp32). ``optimizers``: 1 (one SGD for all) to 3 (one per layer). ``spike_at``: the
    iteration whose loss is multiplied by 2^20 (every optimizer's gradients overflow), or, with
    ``overflow_in`` (a tuple of optimizer numbers, 1-based), the iteration in which only those
    optimizers' gradients get an inf. ``growth_interval`` (fp16 only): the GradScaler's, instead of
    its default 2000. ``clip``: one of ``CLIPS``, where ``self.clip_gradients(opt,
    gradient_clip_val=clip_val, gradient_clip_algorithm="norm")`` runs (None: no clipping).

    An exception raised by the fit becomes the Outcome's error; ``details`` always holds the trace
    of ``_scale`` and, for an error, the call chain from ``training_step`` to the raising function.
    So does an exception raised while the Trainer is built (a ``precision`` Lightning does not
    accept: its message lists the ones it does); then ``details["precision"]`` is None and the chain
    starts at ``quiet_trainer``. ``details["steps"]``: one record per optimizer step (see the module
    docstring). Arguments of the wrong kind raise a ValueError or TypeError at once.
    """
    import lightning as L

    if not isinstance(backward, str) or backward not in BACKWARDS:
        raise ValueError(f"backward must be one of {BACKWARDS}, got {backward!r}"[:300])
    if not isinstance(fp16, bool):
        raise TypeError(f"fp16 must be True or False, got {type(fp16).__name__}")
    if fp16 and precision is not None:
        raise ValueError(f"pass fp16=True (real fp16 AMP with a GradScaler) or precision={precision!r}, not both"[:300])
    _check_args(optimizers, iterations, spike_at)
    overflow_in = _check_overflow_in(overflow_in, optimizers, spike_at)
    if growth_interval is not None and (not fp16 or not _whole(growth_interval, 1) or growth_interval > 10**9):
        raise ValueError(f"growth_interval must be a whole number from 1 to 10**9, with fp16=True; "
                         f"got {growth_interval!r}"[:300])
    if clip is not None and (not isinstance(clip, str) or clip not in CLIPS):
        raise ValueError(f"clip must be None or one of {CLIPS}, got {clip!r}"[:300])
    if clip in CLIPS[1:3] and not fp16:
        raise ValueError(f"clip={clip!r} calls scaler.unscale_: pass fp16=True (the only run with a GradScaler)")
    try:
        value = float(clip_val) if isinstance(clip_val, (int, float)) and not isinstance(clip_val, bool) else None
    except OverflowError:  # an int beyond float's range
        value = math.inf
    if value is None or not 0 < value < math.inf:
        raise ValueError(f"clip_val must be a positive finite number, got {clip_val!r}"[:300])
    clip_val = value
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a string or None, got {type(name).__name__}")
    name = name or f"{backward}, {'fp16 + GradScaler' if fp16 else precision or 'fp32'}"
    L.seed_everything(0, verbose=False)
    module = _module_class()(backward, optimizers, spike_at, overflow_in=overflow_in, clip=clip,
                             clip_val=clip_val)
    settings = dict(max_steps=iterations * optimizers)  # global_step counts optimizer steps
    if fp16:
        from lightning.pytorch.plugins import MixedPrecision

        scaler = None if growth_interval is None else torch.amp.GradScaler("cpu", growth_interval=growth_interval)
        plugin = MixedPrecision("16-mixed", "cpu", scaler=scaler)
        settings["plugins"] = [plugin]
        calls = module.scale_calls = []
        real_scale, real_step = plugin.scaler.scale, plugin.scaler.step

        def traced_scale(outputs):
            calls.append(_chain(sys._getframe(1)))
            return real_scale(outputs)

        def traced_step(optimizer, *args, **kwargs):
            result = real_step(optimizer, *args, **kwargs)
            module.found_inf.append(_found_inf(plugin.scaler, optimizer))
            return result

        plugin.scaler.scale = traced_scale  # records who calls scaler.scale(...)
        plugin.scaler.step = traced_step  # records whether the scaler skipped the step
    elif precision is not None:
        settings["precision"] = precision
    details = {}

    def fit():
        try:
            with quiet_trainer(**settings) as trainer:
                details["trainer"] = trainer
                trainer.fit(module, _loader())
        except Exception as exc:  # keep where it came from; outcome_of keeps type and message
            built = "trainer" in details  # else Trainer(...) itself refused, e.g. precision="fp16"
            details["error_chain"] = _chain(exc.__traceback__, "training_step" if built else "fit")
            raise
        return Outcome(name=name)

    out = outcome_of(name, fit)
    trainer = details.pop("trainer", None)
    if trainer is None:  # no Trainer, no training: the outcome is Lightning's error
        out.details.update(details, precision=None, plugin=None, scaler=None, autocast_dtype=None, trace=[],
                           scale_calls=getattr(module, "scale_calls", None), global_step=0, iterations=0,
                           steps=[], optimizers=optimizers)
        return out
    plugin = trainer.precision_plugin
    out.grad_norms = {"per_iteration": list(module.norms)}
    out.loss = module.losses[-1] if module.losses else None
    out.scale = list(module.scales)
    out.details.update(details, precision=trainer.precision, plugin=type(plugin).__name__,
                       scaler=getattr(plugin, "scaler", None),
                       autocast_dtype=str(module.dtypes[0]) if module.dtypes else None,
                       trace=list(module.trace), scale_calls=getattr(module, "scale_calls", None),
                       global_step=trainer.global_step, iterations=len(module.norms), steps=list(module.steps),
                       optimizers=optimizers, clip=clip, clip_val=clip_val)
    return out


def precision_warnings(precision: str = "16-mixed") -> list[str]:
    """The warnings ``Trainer(accelerator="cpu", precision=...)`` gives when it is constructed
    (``quiet_trainer`` silences them, so this builds a throwaway quiet Trainer of its own)."""
    import lightning as L

    logger = logging.getLogger("lightning.pytorch")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with tempfile.TemporaryDirectory() as root, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            L.Trainer(accelerator="cpu", devices=1, precision=precision, default_root_dir=root, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    finally:
        logger.setLevel(level)
    return [f"{w.category.__name__}: {w.message}" for w in caught]


def fp32_reference() -> Outcome:
    """The same run in fp32 with ``self.manual_backward(loss)``: the gradients to compare against."""
    return run_manual("manual_backward", name="fp32 reference")


def _relative(norms, reference) -> list[float]:
    return [a / b - 1.0 for a, b in zip(norms, reference)]


def cpu_16_mixed() -> Outcome:
    """``Trainer(accelerator="cpu", precision="16-mixed")`` with the buggy ``loss.backward()``:
    Lightning switches to bf16-mixed with no scaler, and the code runs without a complaint.
    ``details``: what Lightning chose, the warning it gave, the autocast dtype, and the largest
    relative difference of the gradient norms from fp32."""
    out = run_manual("loss.backward", precision="16-mixed", name="precision='16-mixed' on CPU, loss.backward()")
    ref = fp32_reference().grad_norms["per_iteration"]
    out.details["warnings"] = precision_warnings("16-mixed")
    out.details["max_rel_diff_vs_fp32"] = max(abs(r) for r in _relative(out.grad_norms["per_iteration"], ref))
    return out


def fp16_loss_backward() -> Outcome:
    """Real fp16 AMP, ``loss.backward()``: ``AssertionError`` at the first ``opt.step()``."""
    return run_manual("loss.backward", fp16=True, name="fp16 AMP, loss.backward()")


def fp16_late_loss_backward() -> Outcome:
    """Real fp16 AMP: ``self.manual_backward(loss)`` in iteration 0, ``loss.backward()`` after it.

    No error; from iteration 1 on, the optimizer steps with gradients divided by the scale.
    ``details["ratio_vs_fp32"]``: gradient norm / fp32 gradient norm per iteration (iteration 1 is
    the first bare backward, from the same weights as fp32 up to fp16 rounding), and
    ``ratio_times_scale``: that ratio at iteration 1 times the scale (≈ 1)."""
    out = run_manual(BACKWARDS[2], fp16=True, name="fp16 AMP, manual_backward once, then loss.backward()")
    ref = fp32_reference().grad_norms["per_iteration"]
    ratio = [a / b for a, b in zip(out.grad_norms["per_iteration"], ref)]
    out.grad_norms["fp32"] = ref
    out.details.update(ratio_vs_fp32=ratio, ratio_times_scale=ratio[1] * out.scale[1])
    return out


def fp16_manual_backward() -> Outcome:
    """Real fp16 AMP, ``self.manual_backward(loss)`` (the fix). ``details["rel_diff_vs_fp32"]``:
    the relative difference of the gradient norm from fp32 in each iteration."""
    out = run_manual("manual_backward", fp16=True, name="fp16 AMP, self.manual_backward(loss)")
    ref = fp32_reference().grad_norms["per_iteration"]
    out.grad_norms["fp32"] = ref
    out.details["rel_diff_vs_fp32"] = _relative(out.grad_norms["per_iteration"], ref)
    return out


def several_optimizers(optimizers: int = 3, spike_at: int = 1, iterations: int = 3) -> Outcome:
    """Real fp16 AMP, ``manual_backward``, one SGD per layer; the loss of iteration ``spike_at``
    is multiplied by 2^20, so every optimizer's scaled gradients overflow. ``scale``:
    ``scaler.get_scale()`` after every ``opt.step()`` (``optimizers`` per iteration)."""
    return run_manual("manual_backward", fp16=True, optimizers=optimizers, spike_at=spike_at,
                      iterations=iterations, name=f"{optimizers} optimizers, loss spike in iteration {spike_at}")


def _overflow_name(overflow_in) -> str:
    """"only optimizer 1 overflows", "only optimizers 1 and 3 overflow"."""
    if len(overflow_in) == 1:
        return f"only optimizer {overflow_in[0]} overflows"
    numbers = [str(k) for k in overflow_in]
    return f"only optimizers {', '.join(numbers[:-1])} and {numbers[-1]} overflow"


def partial_overflow(optimizers: int = 2, overflow_in=(1,), spike_at: int = 1, iterations: int = 2,
                     backward: str = "manual_backward") -> Outcome:
    """Real fp16 AMP in a real Trainer, one SGD per layer, one ``self.manual_backward(loss)`` per
    iteration: in iteration ``spike_at`` only the optimizers in ``overflow_in`` (1-based) find an
    inf in their gradients. ``details["steps"]``: what each ``opt.step()`` applied;
    ``applied_factor(out, spike_at, k)`` is optimizer k's applied ÷ true gradient in that iteration.
    ``backward="manual_backward per optimizer"`` runs the GAN pattern (a backward per optimizer)."""
    if not isinstance(backward, str) or backward not in (BACKWARDS[0], BACKWARDS[3]):
        raise ValueError(f"backward must be {BACKWARDS[0]!r} or {BACKWARDS[3]!r}, got {backward!r}"[:300])
    if overflow_in is None:
        raise ValueError("overflow_in must name the optimizers that overflow, such as (1,) "
                         "(for a loss spike that overflows them all: several_optimizers)")
    _check_args(optimizers, iterations, spike_at)
    overflow_in = _check_overflow_in(overflow_in, optimizers, spike_at)
    return run_manual(backward, fp16=True, optimizers=optimizers, spike_at=spike_at, iterations=iterations,
                      overflow_in=overflow_in,
                      name=f"Lightning, {optimizers} optimizers, {_overflow_name(overflow_in)} in iteration {spike_at}")


def torch_recipe(optimizers: int = 2, overflow_in=(1,), spike_at: int = 1, iterations: int = 2,
                 update_every_step: bool = False) -> Outcome:
    """The same model, data and overflow as ``partial_overflow``, trained by PyTorch's recipe for
    several optimizers, without Lightning: per iteration one ``scaler.scale(loss).backward()``
    under fp16 autocast, ``scaler.step(opt)`` for each optimizer, then **one** ``scaler.update()``.
    ``update_every_step=True`` calls ``scaler.update()`` after every ``scaler.step`` instead (what
    Lightning's plugin does). ``overflow_in=None`` with a ``spike_at``: a loss spike (× 2^20) in
    that iteration, as in ``several_optimizers``. Same ``details["steps"]`` records as ``run_manual``."""
    if not isinstance(update_every_step, bool):
        raise TypeError(f"update_every_step must be True or False, got {type(update_every_step).__name__}")
    _check_args(optimizers, iterations, spike_at)
    overflow_in = _check_overflow_in(overflow_in, optimizers, spike_at)
    torch.manual_seed(0)  # what L.seed_everything(0) does to torch: the same initial weights as run_manual
    model = _module_class()(optimizers=optimizers)
    opts = [torch.optim.SGD(layer.parameters(), lr=model.lr) for layer in model.layers[:optimizers]]
    scaler = torch.amp.GradScaler("cpu")
    steps, norms = [], []
    for i, (x, y) in enumerate(_loader()):
        if i >= iterations:
            break
        for opt in opts:
            opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss * SPIKE if i == spike_at and overflow_in is None else loss).backward()
        scaled_by = scaler.get_scale()
        for k, opt in enumerate(opts):
            if i == spike_at and overflow_in is not None and k + 1 in overflow_in:
                _inject_inf(opt)
        for k, opt in enumerate(opts):
            snapshot = _snapshot(opt)
            unscaled_by = scaler.get_scale()
            scaler.step(opt)
            skipped = _found_inf(scaler, opt)
            call = f"scaler.step(opt{k + 1})"
            if update_every_step or k == len(opts) - 1:
                scaler.update()
                call += "; scaler.update()"
            steps.append(_step_record(i, k, call, scaled_by, unscaled_by, skipped, opt, snapshot,
                                      scaler.get_scale()))
        grads = [p.grad.norm() for p in model.parameters() if p.grad is not None]
        norms.append(torch.linalg.vector_norm(torch.stack(grads)).item())
    how = "scaler.update() after every step" if update_every_step else "one scaler.update() per iteration"
    name = (f"PyTorch recipe ({how}), {optimizers} optimizers"
            + ("" if spike_at is None else f", loss spike in iteration {spike_at}" if overflow_in is None
               else f", {_overflow_name(overflow_in)} in iteration {spike_at}"))
    return Outcome(name=name, loss=loss.item(), grad_norms={"per_iteration": norms},
                   scale=[s["scale_after"] for s in steps],
                   details=dict(steps=steps, optimizers=optimizers, iterations=len(norms)))


def clipping(clip: str = CLIPS[0], clip_val: float = 0.1, iterations: int = 2) -> Outcome:
    """Real fp16 AMP, one optimizer, ``self.manual_backward(loss)``, and
    ``self.clip_gradients(opt, gradient_clip_val=clip_val, gradient_clip_algorithm="norm")`` at the
    place ``clip`` (one of ``CLIPS``). ``details["steps"]``: the true and the applied gradient norm
    of each step; an exception (``opt.step()`` refusing) is the Outcome's error."""
    if not isinstance(clip, str) or clip not in CLIPS:
        raise ValueError(f"clip must be one of {CLIPS}, got {clip!r}"[:300])
    return run_manual("manual_backward", fp16=True, iterations=iterations, clip=clip, clip_val=clip_val,
                      name=f"clip_gradients {clip}")


def applied_factor(outcome: Outcome, iteration: int, optimizer: int) -> float | None:
    """The gradient optimizer ``optimizer`` (1-based) applied in ``iteration``, divided by the true
    gradient (its gradients right after the backward, divided by that backward's scale): 1 when
    the scaler divided by the scale it multiplied by. None for a skipped step."""
    if not isinstance(outcome, Outcome):
        raise TypeError(f"outcome must be an Outcome (from run_manual, partial_overflow or torch_recipe), "
                        f"got {type(outcome).__name__}")
    steps = outcome.details.get("steps", []) if isinstance(outcome.details, dict) else []
    for s in steps:
        if s["iteration"] == iteration and s["optimizer"] == optimizer:
            return None if s["skipped"] else s["factor"]
    done = sorted({(s["iteration"], s["optimizer"]) for s in steps})
    raise ValueError(f"{outcome.name!r} has no step of optimizer {optimizer!r} in iteration {iteration!r} "
                     f"(it has {len(done)} steps)"[:300])


# ------------------------------------------------------------------------------------------------
# Reports
# ------------------------------------------------------------------------------------------------


def precision_table(*outcomes: Outcome) -> Table:
    """What Lightning really used in each run: precision, plugin, scaler, autocast dtype."""
    def scaler_text(s):
        return "None" if s is None else f"{type(s).__module__}.{type(s).__name__}"
    rows = [(o.name, o.details["precision"], o.details["plugin"], scaler_text(o.details["scaler"]),
             o.details["autocast_dtype"]) for o in outcomes]
    return Table(("run", "trainer.precision", "precision_plugin", "precision_plugin.scaler",
                  "activations"), rows)


def _g(x, digits=4) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


def _m(x, digits=4) -> str:
    """A norm or ratio torch computed: the same text on every CPU (``measured``)."""
    return "-" if x is None else measured(x, digits)


def norms_table(outcome: Outcome, reference: Outcome) -> Table:
    """Gradient norm per iteration next to fp32's, with their ratio, at 3 significant digits (at 4,
    a norm of notebook 08 sits on a rounding boundary, which another CPU may cross)."""
    a, b = outcome.grad_norms["per_iteration"], reference.grad_norms["per_iteration"]
    rows = [(i, _m(x, 3), _m(y, 3), _m(x / y, 3)) for i, (x, y) in enumerate(zip(a, b))]
    return Table(("iteration", "grad norm", "fp32 grad norm", "ratio"), rows, title=outcome.name)


def trace_table(outcome: Outcome) -> Table:
    """The scaler's ``_scale`` at each moment of each iteration (and the error, if one was raised)."""
    rows = [(i, moment, "None" if s is None else (s if isinstance(s, str) else _g(s, 6)))
            for i, moment, s in outcome.details["trace"]]
    if outcome.failed:
        where = "opt.step() raised" if outcome.details.get("precision") is not None else "Trainer(...) raised"
        rows.append((rows[-1][0] if rows else 0, where, f"{outcome.error_type}"))
    return Table(("iteration", "moment", "scaler._scale"), rows, title=outcome.name)


def steps_table(outcome: Outcome) -> Table:
    """One row per optimizer step: the scale its gradients were multiplied by (in the backward)
    and divided by (in ``unscale_``), whether the scaler skipped it, the applied ÷ true gradient,
    and ``scaler.get_scale()`` after it."""
    if not isinstance(outcome, Outcome):
        raise TypeError(f"outcome must be an Outcome (from run_manual, partial_overflow or torch_recipe), "
                        f"got {type(outcome).__name__}")
    rows = [(s["iteration"], s["call"], _g(s["scaled_by"], 6), _g(s["unscaled_by"], 6),
             "skipped (inf)" if s["skipped"] else "applied", "-" if s["skipped"] else _g(s["factor"]),
             _g(s["scale_after"], 6)) for s in outcome.details.get("steps", [])]
    return Table(("iteration", "call", "scaled by", "unscaled by", "step", "applied ÷ true grad",
                  "scale after"), rows, title=outcome.name)


def clip_table(*outcomes: Outcome) -> Table:
    """For runs of ``clipping``: per step, whether ``opt.step()`` ran, the true gradient norm and
    the applied one in units of the clip value, and the applied norm times the scale (in the same units)."""
    rows = []
    for o in outcomes:
        if not isinstance(o, Outcome):
            raise TypeError(f"each outcome must be an Outcome from clipping(...), got {type(o).__name__}")
        clip_val = o.details.get("clip_val") or 1.0
        for s in o.details.get("steps", []):
            rows.append((o.details.get("clip"), s["iteration"], "ran", _m(s["true_norm"] / clip_val, 2),
                         _m(s["applied_norm"] / clip_val), _m(s["applied_norm"] * s["unscaled_by"] / clip_val)))
        if o.failed:
            rows.append((o.details.get("clip"), len(o.details.get("steps", [])), f"raised {o.error_type}",
                         "-", "-", "-"))
    return Table(("clip_gradients", "iteration", "opt.step()", "true norm ÷ clip", "applied norm ÷ clip",
                  "applied norm × scale ÷ clip"), rows)


# ------------------------------------------------------------------------------------------------
# Exercise checkers
# ------------------------------------------------------------------------------------------------


def check_cpu_precision(answer) -> Check:
    """Q: the value of ``trainer.precision`` for ``Trainer(accelerator="cpu", precision="16-mixed")``."""
    return check(answer, "bf16-mixed", accept=lambda a: isinstance(a, str) and a.strip().strip("'\"").casefold()
                 == "bf16-mixed", hint="read the warning Lightning gives when the Trainer is built")


def check_partial_overflow_factor(answer) -> Check:
    """Q: Lightning, two optimizers, one ``self.manual_backward(loss)``, only optimizer 1's
    gradients overflow: optimizer 2's applied gradient ÷ its true gradient (2)."""
    return check(answer, 2.0, accept=_close(2.0, 1e-9),
                 hint="which scale multiplied optimizer 2's gradients, and which scale divides them after "
                      "optimizer 1's step has run update()?")


def check_unscale_wrapper_raises(answer) -> Check:
    """Q: ``scaler.unscale_(opt)`` with ``opt = self.optimizers()``, clip, ``opt.step()``: does
    ``opt.step()`` raise? ("no": the scaler tracks optimizers by ``id``, and the plugin unscales
    the torch optimizer inside the wrapper, so the gradients are unscaled twice, silently.)"""
    return check(answer, "no", accept=_yes_no(False),
                 hint="the scaler keeps its per-optimizer state by id(optimizer): which object does the "
                      "plugin pass to unscale_?")


def check_third_optimizer_factor(answer) -> Check:
    """Q: Lightning, three optimizers, one ``self.manual_backward(loss)``, only optimizer 2's
    gradients overflow: optimizer 3's applied gradient ÷ its true gradient (2)."""
    return check(answer, 2.0, accept=_close(2.0, 1e-9),
                 hint="follow the scale through the three opt.step() calls: which update() changes it, and "
                      "which optimizers unscale after that?")


def check_clip_before_step_norm(answer) -> Check:
    """Q: fp16 AMP at scale 32768, ``self.clip_gradients(opt, gradient_clip_val=1.0, ...)`` right
    before ``opt.step()``, true gradient norm 5: the norm of the gradient the optimizer applies
    (1/32768 = 3.0517578125e-05, within 0.1%)."""
    return check(answer, 1.0 / 32768, accept=_close(1.0 / 32768, 1e-3),
                 hint="clip_gradients sees the gradients before the plugin unscales them: what is their norm "
                      "then, what does clipping make it, and what does unscale_ do next?")
