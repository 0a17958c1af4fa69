"""Pitfall 1: ``loss.backward()`` instead of ``self.manual_backward(loss)`` under fp16 AMP (torch, lightning).

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
* ``several_optimizers``: Lightning calls ``scaler.update()`` after each ``opt.step()``, so one
  overflowing iteration halves the scale once per optimizer;
* ``run_manual``: the runner all of them use, for exercises.

``precision_table``, ``norms_table``, ``trace_table`` and ``scale_table`` print the results;
``check_*`` are the lesson's exercise checkers. Gradient norms are those the optimizer stepped
with: the norm of all gradients right after the ``opt.step()`` calls of an iteration (the precision
plugin unscales them in place before stepping). Lightning is imported inside the functions.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import warnings

import torch

from ampviz.lessons import Check, Table, check
from ampviz.pitfalls import Outcome, outcome_of, quiet_trainer

__all__ = [
    "BACKWARDS",
    "run_manual",
    "cpu_16_mixed",
    "precision_warnings",
    "fp16_loss_backward",
    "fp16_late_loss_backward",
    "fp16_manual_backward",
    "fp32_reference",
    "several_optimizers",
    "precision_table",
    "norms_table",
    "trace_table",
    "scale_table",
    "check_cpu_precision",
    "check_backward_call",
    "check_scale_after_overflow",
]

BACKWARDS = ("manual_backward", "loss.backward", "manual_backward, then loss.backward")
ITERATIONS = 4
BATCH = 16


def _loader():
    """Four fixed batches of 16: x ~ N(0, 1) in 8 dimensions, y = 0.1 · sum(x)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(ITERATIONS * BATCH, 8, generator=g)
    y = 0.1 * x.sum(1, keepdim=True)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH, shuffle=False)


_MODULE = None


def _module_class():
    """The LightningModule, defined on first use (so that lightning is imported only then)."""
    global _MODULE
    if _MODULE is not None:
        return _MODULE
    import lightning as L

    class ManualModule(L.LightningModule):
        """Three linear layers, manual optimization, one SGD per layer or one for all."""

        def __init__(self, backward="manual_backward", optimizers=1, spike_at=None, lr=0.05):
            super().__init__()
            self.automatic_optimization = False
            self.layers = torch.nn.ModuleList([torch.nn.Linear(8, 16), torch.nn.Linear(16, 16),
                                               torch.nn.Linear(16, 1)])
            self.backward_mode, self.n_optimizers, self.spike_at, self.lr = backward, optimizers, spike_at, lr
            self.norms, self.losses, self.scales, self.trace, self.dtypes = [], [], [], [], []

        def forward(self, x):
            h = torch.relu(self.layers[0](x))
            h = torch.relu(self.layers[1](h))
            return self.layers[2](h)

        def _scale_now(self):
            scaler = getattr(self.trainer.precision_plugin, "scaler", None)
            return "no scaler" if scaler is None else scaler._scale

        def _note(self, i, moment):
            s = self._scale_now()
            self.trace.append((i, moment, s if isinstance(s, str) else (None if s is None else s.item())))

        def training_step(self, batch, batch_idx):
            x, y = batch
            opts = self.optimizers()
            opts = opts if isinstance(opts, list) else [opts]
            for opt in opts:
                opt.zero_grad()
            self._note(batch_idx, "training_step starts")
            out = self(x)
            self.dtypes.append(out.dtype)
            loss = torch.nn.functional.mse_loss(out, y)
            self.losses.append(loss.item())
            if batch_idx == self.spike_at:
                loss = loss * 2.0**20  # a loss spike: its scaled gradients overflow fp16
            if self.backward_mode == "manual_backward" or (
                    self.backward_mode == BACKWARDS[2] and batch_idx == 0):
                self.manual_backward(loss)
                self._note(batch_idx, "after self.manual_backward(loss)")
            else:
                loss.backward()
                self._note(batch_idx, "after loss.backward()")
            for opt in opts:
                opt.step()
                scaler = getattr(self.trainer.precision_plugin, "scaler", None)
                self.scales.append(None if scaler is None else scaler.get_scale())
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
    """``file function`` for each frame from ``stop`` (excluded) inward, files relative to site-packages."""
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
        return [where(c) for c in codes[start:]]
    codes, f = [], frame_or_tb  # a frame: innermost first, walk out to ``stop``
    while f is not None and f.f_code.co_name != stop:
        codes.append(f.f_code)
        f = f.f_back
    return [where(c) for c in reversed(codes)]


def run_manual(backward: str = "manual_backward", *, fp16: bool = False, precision: str | None = None,
               optimizers: int = 1, spike_at: int | None = None, iterations: int = ITERATIONS,
               name: str | None = None) -> Outcome:
    """Fit the seeded module for ``iterations`` batches and report what happened.

    ``backward``: one of ``BACKWARDS``. ``fp16=True``: real fp16 AMP with a GradScaler
    (``plugins=[MixedPrecision("16-mixed", "cpu")]``); otherwise ``precision`` goes to the Trainer
    (``None``: fp32). ``optimizers``: 1 (one SGD for all) to 3 (one per layer). ``spike_at``: the
    iteration whose loss is multiplied by 2^20. An exception raised by the fit becomes the
    Outcome's error; ``details`` always holds the trace of ``_scale`` and, for an error, the call
    chain from ``training_step`` to the raising function. So does an exception raised while the
    Trainer is built (a ``precision`` Lightning does not accept: its message lists the ones it
    does); then ``details["precision"]`` is None and the chain starts at ``quiet_trainer``.
    Arguments of the wrong kind raise a ValueError or TypeError at once.
    """
    import lightning as L

    if backward not in BACKWARDS:
        raise ValueError(f"backward must be one of {BACKWARDS}, got {backward!r}")
    if fp16 and precision is not None:
        raise ValueError(f"pass fp16=True (real fp16 AMP with a GradScaler) or precision={precision!r}, not both")
    for arg, value, low, high in (("optimizers", optimizers, 1, 3), ("iterations", iterations, 1, None),
                                  ("spike_at", spike_at, 0, None)):
        if arg == "spike_at" and value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < low or (high and value > high):
            allowed = f"{low} to {high}" if high else f"a whole number >= {low}"
            raise ValueError(f"{arg} must be {allowed}{' or None' if arg == 'spike_at' else ''}, got {value!r}")
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a string or None, got {type(name).__name__}")
    name = name or f"{backward}, {'fp16 + GradScaler' if fp16 else precision or 'fp32'}"
    L.seed_everything(0, verbose=False)
    module = _module_class()(backward, optimizers, spike_at)
    settings = dict(max_steps=iterations * optimizers)  # global_step counts optimizer steps
    if fp16:
        from lightning.pytorch.plugins import MixedPrecision

        plugin = MixedPrecision("16-mixed", "cpu")
        settings["plugins"] = [plugin]
        calls = module.scale_calls = []
        real_scale = plugin.scaler.scale

        def traced_scale(outputs):
            calls.append(_chain(sys._getframe(1)))
            return real_scale(outputs)

        plugin.scaler.scale = traced_scale  # records who calls scaler.scale(...)
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
                           scale_calls=getattr(module, "scale_calls", None), global_step=0, iterations=0)
        return out
    plugin = trainer.precision_plugin
    out.grad_norms = {"per_iteration": list(module.norms)}
    out.loss = module.losses[-1] if module.losses else None
    out.scale = list(module.scales)
    out.details.update(details, precision=trainer.precision, plugin=type(plugin).__name__,
                       scaler=getattr(plugin, "scaler", None),
                       autocast_dtype=str(module.dtypes[0]) if module.dtypes else None,
                       trace=list(module.trace), scale_calls=getattr(module, "scale_calls", None),
                       global_step=trainer.global_step, iterations=len(module.norms))
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
    is multiplied by 2^20, so its scaled gradients overflow. ``scale``: ``scaler.get_scale()``
    after every ``opt.step()`` (``optimizers`` per iteration)."""
    return run_manual("manual_backward", fp16=True, optimizers=optimizers, spike_at=spike_at,
                      iterations=iterations, name=f"{optimizers} optimizers, overflow in iteration {spike_at}")


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


def norms_table(outcome: Outcome, reference: Outcome) -> Table:
    """Gradient norm per iteration next to fp32's, with their ratio."""
    a, b = outcome.grad_norms["per_iteration"], reference.grad_norms["per_iteration"]
    rows = [(i, _g(x), _g(y), _g(x / y)) for i, (x, y) in enumerate(zip(a, b))]
    return Table(("iteration", "grad norm", "fp32 grad norm", "ratio"), rows, title=outcome.name)


def trace_table(outcome: Outcome) -> Table:
    """The scaler's ``_scale`` at each moment of each iteration (and the error, if one was raised)."""
    rows = [(i, moment, "None" if s is None else (s if isinstance(s, str) else _g(s, 6)))
            for i, moment, s in outcome.details["trace"]]
    if outcome.failed:
        where = "opt.step() raised" if outcome.details.get("precision") is not None else "Trainer(...) raised"
        rows.append((rows[-1][0] if rows else 0, where, f"{outcome.error_type}"))
    return Table(("iteration", "moment", "scaler._scale"), rows, title=outcome.name)


def scale_table(outcome: Outcome, optimizers: int = 3) -> Table:
    """``scaler.get_scale()`` after each ``opt.step()``, one row per optimizer step."""
    rows = [(k // optimizers, f"opt{k % optimizers + 1}.step()", _g(s, 6)) for k, s in enumerate(outcome.scale)]
    return Table(("iteration", "call", "scale after it"), rows, title=outcome.name)


# ------------------------------------------------------------------------------------------------
# Exercise checkers
# ------------------------------------------------------------------------------------------------


def check_cpu_precision(answer) -> Check:
    """Q: the value of ``trainer.precision`` for ``Trainer(accelerator="cpu", precision="16-mixed")``."""
    return check(answer, "bf16-mixed", accept=lambda a: isinstance(a, str) and a.strip().strip("'\"").casefold()
                 == "bf16-mixed", hint="read the warning Lightning gives when the Trainer is built")


def check_backward_call(answer) -> Check:
    """Q: which call, in a LightningModule with manual optimization, makes the scaler scale the loss."""
    return check(answer, "manual_backward",
                 accept=lambda a: isinstance(a, str) and "manual_backward" in a,
                 hint="the call that goes through the precision plugin's pre_backward")


def check_scale_after_overflow(answer) -> Check:
    """Q: four optimizers, the scale at 65536, one overflowing iteration: the scale after it."""
    return check(answer, 65536.0 / 2**4, hint="scaler.update() runs after every opt.step(), and each halves the scale")
