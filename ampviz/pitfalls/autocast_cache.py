"""Pitfall 2: the autocast weight cache: a ``torch.no_grad()`` forward, then a forward with grad,
and a weight changed in place inside one autocast block (torch, lightning).

Three worlds, kept apart by name:

- ``real_*``: what the **installed** torch and Lightning do with a no_grad forward, then a forward
  with grad. On torch with pytorch/pytorch PR #165068 (cached casts always carry grad) and Lightning
  >= 2.6.0 (its Trainer's autocast uses ``cache_enabled=False``, Lightning PR #20921) this trains.
- ``simulated_*`` and ``SimulatedLegacyAutocastCache``: a **simulation of the legacy caching rule**
  (the old ``cached_cast`` in torch's ``aten/src/ATen/autocast_mode.cpp``), applied to ``F.linear``
  by a ``torch.overrides.TorchFunctionMode``. It is not the library: it recreates what older
  versions did, so the failure and each fix can be shown on any version.
- ``in_place_update``, ``stale_table``, ``training_loop``, ``loop_table``: what is **still real** on
  the installed torch. The cache keeps the low-precision copy of a weight until the outermost
  autocast exits; a weight changed in place inside one autocast block (an optimizer step, an EMA
  copy) is not seen by later forwards in that block. ``autocast_source`` reads, from the installed
  Lightning, the line that enters autocast in Fabric and in the Trainer.

Every scenario returns an ``Outcome`` (``ampviz.pitfalls``): the exception's type and exact message,
or what the run measured (gradient norm per parameter, ``None`` where a parameter got no gradient;
outputs and losses in ``details``).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from ampviz.checks import Check, Choice, _same, _text_is, _yes_no, check
from ampviz.text import Table
from ampviz.pitfalls import Outcome, outcome_of, quiet_trainer, versions
from ampviz._args import _shown
from ampviz._args import _seed, _whole
from ampviz.training import torch_dtype

__all__ = ["DTYPE", "SIMULATED_FIXES", "STALE_CASES", "LOOP_CASES", "SimulatedLegacyAutocastCache", "make_model",
           "fix_table", "real_plain", "real_lightning", "simulated_plain", "simulated_lightning", "summary",
           "in_place_update", "stale_table", "training_loop", "loop_table", "autocast_source", "which_world", "world",
           "check_params_without_grad", "check_no_grad_sees_update", "check_fabric_loop_loss_changes",
           "check_loop_fixes", "check_why_legacy_no_grad_pass", "check_why_trainer_cache_off"]

DTYPE = torch.bfloat16  # the CPU autocast dtype the lessons use
KINDS = ("linear", "layernorm", "sandwich")
#: The most optimizer steps a Trainer scenario runs (each takes a few milliseconds).
MAX_STEPS = 500
NO_GRAD_ERROR = "element 0 of tensors does not require grad and does not have a grad_fn"

# The pattern under the simulated legacy rule, and each way out; keys are ``simulated_plain``'s ``fix``.
SIMULATED_FIXES = {
    None: "no fix: no_grad pass, then grad pass, inside one outer autocast",
    "grad_first": "reverse order: grad pass first, then the no_grad pass",
    "autocast_off_in_no_grad": "fix 1: autocast disabled inside the no_grad block",
    "reenter_top_level": "fix 2: each pass in its own top-level autocast",
    "reenter_nested": "fix 2 nested: grad pass re-enters autocast inside the outer one",
    "cache_disabled": "fix 3: outer autocast with cache_enabled=False",
    "clear_cache": "fix 3: torch.clear_autocast_cache() between the passes",
}


# --------------------------------------------------------------------------------------------
# The simulated legacy rule
# --------------------------------------------------------------------------------------------


class SimulatedLegacyAutocastCache(TorchFunctionMode):
    """A simulation of the legacy autocast weight cache, for ``F.linear`` on the CPU.

    While active, each ``F.linear`` call under CPU autocast casts its floating-point arguments to
    the autocast dtype itself, and keeps the cast of an argument in a cache under the simulated
    legacy rule: the target is the autocast dtype (``torch.get_autocast_dtype("cpu")``), the source
    is float32, a leaf that requires grad and not a view, and ``torch.is_autocast_cache_enabled()``
    is true. A cached cast is reused as it was made, so one made under ``torch.no_grad()`` has no
    ``grad_fn``. The cache is cleared when ``torch.clear_autocast_cache()`` runs, which
    ``torch.autocast`` calls when the **outermost** autocast exits (and which a user may call).

    ``hits`` counts the reuses of a cached cast. Use it as a context manager::

        with SimulatedLegacyAutocastCache():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                ...
    """

    def __init__(self):
        super().__init__()
        self.cache: dict = {}
        self.hits = 0
        self._real_clear = None

    # ----- clearing: wrap torch.clear_autocast_cache while the simulation is active -----
    def __enter__(self):
        self._real_clear = torch.clear_autocast_cache

        def clear_autocast_cache():
            self.cache.clear()
            self._real_clear()

        torch.clear_autocast_cache = clear_autocast_cache
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            torch.clear_autocast_cache = self._real_clear
            self.cache.clear()

    # ----- the legacy rule -----
    def _cast(self, t, dtype):
        if not (isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != dtype):
            return t
        cacheable = (dtype == torch.get_autocast_dtype("cpu") and t.dtype == torch.float32 and t.requires_grad
                     and t.is_leaf and not t._is_view() and torch.is_autocast_cache_enabled())
        if not cacheable:
            return t.to(dtype)
        key = id(t)
        if key in self.cache and self.cache[key][0] is t:
            self.hits += 1
            return self.cache[key][1]
        cast = t.to(dtype)  # made under the grad mode of the moment: under no_grad, no grad_fn
        self.cache[key] = (t, cast)  # the source is kept, so its id cannot be reused while cached
        return cast

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and torch.is_autocast_enabled("cpu"):
            dtype = torch.get_autocast_dtype("cpu")
            args = tuple(self._cast(a, dtype) for a in args)
            kwargs = {k: self._cast(v, dtype) for k, v in kwargs.items()}
        return func(*args, **kwargs)


# --------------------------------------------------------------------------------------------
# The models and the pattern
# --------------------------------------------------------------------------------------------


def make_model(kind: str = "linear", seed: int = 0) -> nn.Module:
    """``"linear"``: Linear → ReLU → Linear (every path to a weight goes through a linear layer);
    ``"layernorm"``: Linear → LayerNorm (the LayerNorm's weights are reached without one);
    ``"sandwich"``: Linear → LayerNorm → Linear (a LayerNorm between two linear layers)."""
    kind = _kind(kind)
    torch.manual_seed(_seed(seed))
    if kind == "linear":
        return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    if kind == "sandwich":
        return nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 1))
    return nn.Sequential(nn.Linear(8, 4), nn.LayerNorm(4))


def _kind(kind) -> str:
    if not (isinstance(kind, str) and kind in KINDS):
        raise ValueError(f"unknown model kind {_shown(kind)}: one of {', '.join(map(repr, KINDS))}")
    return kind


def _fix(fix):
    if not (fix is None or isinstance(fix, str)) or fix not in SIMULATED_FIXES:
        raise ValueError(f"unknown fix {_shown(fix)}: one of {list(SIMULATED_FIXES)}")
    return fix


def _steps(steps) -> int:
    return _whole("steps", steps, 1, MAX_STEPS)


def _data(model: nn.Module, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    out = model[-1].normalized_shape[0] if isinstance(model[-1], nn.LayerNorm) else model[-1].out_features
    return torch.randn(32, 8, generator=g), torch.randn(32, out, generator=g)


def _grad_norms(model: nn.Module) -> dict:
    return {name: None if p.grad is None else round(float(p.grad.norm()), 6)
            for name, p in model.named_parameters()}


def _autocast(**kwargs):
    return torch.autocast("cpu", dtype=DTYPE, **kwargs)


def _passes(model, x, y, fix):
    """The no_grad pass and the grad pass, arranged as ``fix`` says; returns the loss."""
    fix = _fix(fix)
    loss_of = lambda: F.mse_loss(model(x), y)  # noqa: E731
    if fix == "reenter_top_level":
        with torch.no_grad(), _autocast():
            model(x)
        with _autocast():
            return loss_of()
    with _autocast(cache_enabled=fix != "cache_disabled"):
        if fix == "grad_first":
            loss = loss_of()
            with torch.no_grad():
                model(x)
            return loss
        if fix == "autocast_off_in_no_grad":
            with torch.no_grad(), torch.autocast("cpu", enabled=False):
                model(x)
        else:
            with torch.no_grad():
                model(x)
        if fix == "clear_cache":
            torch.clear_autocast_cache()
        if fix == "reenter_nested":
            with _autocast():
                return loss_of()
        return loss_of()


def _run(name, kind, fix, simulate):
    model = make_model(kind)
    x, y = _data(model)
    sim = SimulatedLegacyAutocastCache() if simulate else contextlib.nullcontext()
    with sim:
        loss = _passes(model, x, y, fix)
        loss.backward()
    details = {"fix": SIMULATED_FIXES[fix], "model": kind, "versions": versions()}
    if simulate:
        details["cache_hits"] = sim.hits
    return Outcome(name=name, loss=float(loss.detach()), grad_norms=_grad_norms(model), details=details)


def real_plain(kind: str = "linear", fix=None) -> Outcome:
    """The pattern with the **installed** torch (no simulation): a no_grad forward, then a forward
    with grad and ``backward()``, inside one ``torch.autocast("cpu", dtype=torch.bfloat16)``
    (or arranged as ``fix`` says, a key of ``SIMULATED_FIXES``)."""
    kind, fix = _kind(kind), _fix(fix)
    name = f"installed torch {torch.__version__}, {kind} model"
    return outcome_of(name, _run, name, kind, fix, simulate=False)


def simulated_plain(kind: str = "linear", fix=None) -> Outcome:
    """The same pattern under the **simulated legacy rule** (``SimulatedLegacyAutocastCache``),
    arranged as ``fix`` says (a key of ``SIMULATED_FIXES``)."""
    kind, fix = _kind(kind), _fix(fix)
    name = f"simulated legacy rule, {kind} model: {SIMULATED_FIXES[fix]}"
    return outcome_of(name, _run, name, kind, fix, simulate=True)


def summary(outcome: Outcome) -> str:
    """One outcome as stable text: the exception (type: message), or which parameters got a
    gradient (no numbers, which may differ in the last bf16 bits from one CPU to another)."""
    if not isinstance(outcome, Outcome):
        raise TypeError(f"outcome must be an Outcome (from real_plain, simulated_plain...), not {_shown(outcome)}")
    if outcome.failed:
        return str(outcome)
    grads = ", ".join(f"{n} {'grad' if g is not None else 'None'}" for n, g in outcome.grad_norms.items())
    return f"{outcome.name}: ran; .grad: {grads}"


def fix_table(kind: str = "linear"):
    """Each arrangement of ``SIMULATED_FIXES`` under the simulated legacy rule: does it train?"""
    kind = _kind(kind)
    rows = []
    for fix, label in SIMULATED_FIXES.items():
        o = simulated_plain(kind, fix)
        missing = [n for n, g in o.grad_norms.items() if g is None]
        result = (f"{o.error_type}" if o.failed else
                  "trains, but no grad for " + ", ".join(missing) if missing else "trains")
        rows.append((label, result))
    return Table(("arrangement (simulated legacy rule)", "result"), rows,
                 title=f"{kind} model, bf16 CPU autocast")


# --------------------------------------------------------------------------------------------
# Inside a Lightning Trainer
# --------------------------------------------------------------------------------------------


def _lightning_module(kind: str):
    import lightning as L

    class NoGradThenGrad(L.LightningModule):
        """training_step: a no_grad forward (say, a target network or a metric), then the loss."""

        def __init__(self):
            super().__init__()
            self.net = make_model(kind)
            self.seen: dict = {}
            self.grad_norms: list = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.seen = {"autocast enabled": torch.is_autocast_enabled("cpu"),
                         "autocast dtype": str(torch.get_autocast_dtype("cpu")),
                         "autocast cache enabled": torch.is_autocast_cache_enabled()}
            with torch.no_grad():
                self.net(x)
            return F.mse_loss(self.net(x), y)

        def on_after_backward(self):
            self.grad_norms.append(_grad_norms(self.net))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return NoGradThenGrad()


def _legacy_plugin():
    """A ``MixedPrecision`` plugin whose forward context uses ``cache_enabled=True``, as
    Lightning <= 2.5 did (Lightning >= 2.6.0 passes ``cache_enabled=False``)."""
    from lightning.pytorch.plugins import MixedPrecision

    class CachingMixedPrecision(MixedPrecision):
        def autocast_context_manager(self):
            return torch.autocast(self.device, dtype=DTYPE, cache_enabled=True)

    return CachingMixedPrecision("bf16-mixed", "cpu")


def _fit(name, kind, plugin, simulate, steps):
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    L.seed_everything(0, verbose=False)
    module = _lightning_module(kind)
    x, y = _data(module.net)
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    settings = {"precision": "bf16-mixed"} if plugin == "installed" else {"plugins": [_legacy_plugin()]}
    sim = SimulatedLegacyAutocastCache() if simulate else contextlib.nullcontext()
    with sim, quiet_trainer(max_steps=steps, **settings) as trainer:
        trainer.fit(module, loader)
    details = {"versions": versions(), "precision": trainer.precision, "seen in training_step": module.seen,
               "steps": trainer.global_step}
    return Outcome(name=name, grad_norms=module.grad_norms[-1] if module.grad_norms else {}, details=details)


def real_lightning(kind: str = "linear", steps: int = 2) -> Outcome:
    """The pattern inside ``training_step`` of a real ``Trainer(precision="bf16-mixed")`` with the
    **installed** torch and Lightning; ``details`` holds what ``training_step`` saw of autocast.
    ``steps``: 1 to ``MAX_STEPS`` optimizer steps."""
    import lightning

    kind, steps = _kind(kind), _steps(steps)

    name = f"installed Lightning {lightning.__version__}, bf16-mixed, {kind} model"
    return outcome_of(name, _fit, name, kind, "installed", False, steps)


def simulated_lightning(kind: str = "linear", plugin: str = "legacy", steps: int = 2) -> Outcome:
    """The pattern in a real Trainer under the **simulated legacy rule**. ``plugin="legacy"``: a
    ``MixedPrecision`` subclass that enters autocast with ``cache_enabled=True`` (Lightning <= 2.5);
    ``plugin="installed"``: the installed Lightning's own ``precision="bf16-mixed"``."""
    if not (isinstance(plugin, str) and plugin in ("legacy", "installed")):
        raise ValueError(f"unknown plugin {_shown(plugin)}: 'legacy' or 'installed'")
    kind, steps = _kind(kind), _steps(steps)
    label = "cache_enabled=True plugin (as Lightning <= 2.5)" if plugin == "legacy" else "installed Lightning plugin"
    name = f"simulated legacy rule in a Trainer, {label}, {kind} model"
    return outcome_of(name, _fit, name, kind, plugin, True, steps)


# --------------------------------------------------------------------------------------------
# Still real on the installed torch: a weight changed in place inside one autocast block
# --------------------------------------------------------------------------------------------

#: Arrangements of ``y1 = lin(x)``, an in-place update of ``lin.weight``, ``y2 = lin(x)``;
#: keys are ``in_place_update``'s ``case``.
STALE_CASES = {
    "one_block": "y1, update, y2 in one autocast block",
    "nested_blocks": "y1 and y2 each in an inner autocast, inside one outer block",
    "cache_disabled": "one block with cache_enabled=False",
    "clear_cache": "one block, torch.clear_autocast_cache() after the update",
    "separate_blocks": "the update between two autocast blocks",
    "no_autocast": "no autocast (float32)",
    "no_grad_passes": "one block, y1 and y2 under torch.no_grad()",
    "inference_mode": "one block, all under torch.inference_mode()",
    "frozen_weight": "one block, a frozen layer (requires_grad_(False))",
}
#: The rows ``stale_table`` shows when no cases are given.
STALE_MAIN = ("one_block", "nested_blocks", "cache_disabled", "clear_cache", "separate_blocks", "no_autocast")
#: CPU autocast's low-precision dtypes (the ones whose casts are cached).
AUTOCAST_DTYPES = (torch.bfloat16, torch.float16)


def _autocast_dtype(dtype) -> torch.dtype:
    dt = torch_dtype(dtype)
    if dt not in AUTOCAST_DTYPES:
        raise ValueError(f"dtype must be torch.bfloat16 or torch.float16 (CPU autocast's low-precision dtypes), "
                         f"not {_shown(dtype)}")
    return dt


def _case(case, cases: dict, what: str) -> str:
    if not (isinstance(case, str) and case in cases):
        raise ValueError(f"unknown {what} {_shown(case)}: one of {', '.join(map(repr, cases))}")
    return case


def _update_run(case: str, dt: torch.dtype) -> dict:
    torch.manual_seed(0)
    lin = nn.Linear(8, 4)
    if case == "frozen_weight":
        lin.requires_grad_(False)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))

    def update():
        with torch.no_grad():
            lin.weight.add_(1.0)

    def block(**kwargs):
        return torch.autocast("cpu", dtype=dt, **kwargs)

    if case == "no_autocast":
        y1 = lin(x)
        update()
        y2 = lin(x)
    elif case == "separate_blocks":
        with block():
            y1 = lin(x)
        update()
        with block():
            y2 = lin(x)
    elif case == "nested_blocks":
        with block():
            with block():
                y1 = lin(x)
            update()
            with block():
                y2 = lin(x)
    else:
        mode = (torch.inference_mode() if case == "inference_mode" else
                torch.no_grad() if case == "no_grad_passes" else contextlib.nullcontext())
        with mode, block(cache_enabled=case != "cache_disabled"):
            y1 = lin(x)
            update()
            if case == "clear_cache":
                torch.clear_autocast_cache()
            y2 = lin(x)
    y1, y2 = y1.detach(), y2.detach()
    # what the update should do: every output grows by the sum of its input row (weight += 1)
    expected = float(x.sum(dim=1).abs().max())
    return {"loss": None, "details": {
        "case": STALE_CASES[case], "autocast dtype": None if case == "no_autocast" else str(dt).replace("torch.", ""),
        "output dtype": str(y2.dtype),
        "output changed": not torch.equal(y1, y2), "max |y2 - y1|": float((y2.float() - y1.float()).abs().max()),
        "expected max |y2 - y1|": expected}}


def in_place_update(case: str = "one_block", dtype="bfloat16") -> Outcome:
    """On the **installed** torch: ``y1 = lin(x)``; ``with torch.no_grad(): lin.weight.add_(1)``;
    ``y2 = lin(x)``, arranged as ``case`` says (a key of ``STALE_CASES``), under CPU autocast in
    ``dtype`` (bfloat16 or float16). ``details["output changed"]``: whether ``y2`` differs from ``y1``
    (it must: every output moves by the sum of its input row, ``details["expected max |y2 - y1|"]``)."""
    case, dt = _case(case, STALE_CASES, "case"), _autocast_dtype(dtype)
    name = f"installed torch {torch.__version__}, {str(dt).replace('torch.', '')} autocast: {STALE_CASES[case]}"
    return outcome_of(name, _update_run, case, dt)


def _cases(cases, known: dict, default) -> tuple:
    if cases is None:
        return tuple(default)
    if isinstance(cases, str):
        cases = (cases,)
    if not isinstance(cases, (list, tuple)) or not cases:
        raise TypeError(f"cases must be a list of keys of {', '.join(map(repr, known))}, not {_shown(cases)}")
    return tuple(_case(c, known, "case") for c in cases)


def stale_table(cases=None) -> Table:
    """``in_place_update`` for each of ``cases`` (keys of ``STALE_CASES``; default: the main ones),
    under bf16 and fp16 CPU autocast: does the output see the in-place update?"""
    cases = _cases(cases, STALE_CASES, STALE_MAIN)
    rows = []
    for case in cases:
        verdicts = []
        for dt in AUTOCAST_DTYPES:
            changed = in_place_update(case, dt).details["output changed"]
            verdicts.append("changes" if changed else "stale: old weight")
        rows.append((STALE_CASES[case], *verdicts))
    return Table(("arrangement", "bf16: y2", "fp16: y2"), rows,
                 title="y1 = lin(x); lin.weight.add_(1) under no_grad; y2 = lin(x)")


#: Training loops (SGD, lr 0.1, the same batch every step); keys are ``training_loop``'s ``case``.
LOOP_CASES = {
    "outer": "the whole loop inside one autocast block",
    "per_step": "autocast around the forward and the loss, in each step",
    "outer_no_grad_step": "(a) one block, opt.step() wrapped in torch.no_grad()",
    "outer_cache_disabled": "(b) one block with cache_enabled=False",
    "outer_zero_grad_keep": "(c) one block, opt.zero_grad(set_to_none=False)",
    "outer_clear_after_step": "(d) one block, torch.clear_autocast_cache() after opt.step()",
    "fabric_outer": "Fabric bf16-mixed, the whole loop inside fabric.autocast()",
    "fabric_per_step": "Fabric bf16-mixed, no fabric.autocast() (the model's forward is wrapped)",
}
#: The most steps a loop runs (each takes about a millisecond).
MAX_LOOP_STEPS = 200


@contextlib.contextmanager
def _quiet_lightning():
    """Lightning's info lines ("Using bfloat16 Automatic Mixed Precision (AMP)") and tips, silenced."""
    loggers = [logging.getLogger(n) for n in ("lightning", "lightning.fabric", "lightning.pytorch",
                                              "lightning_utilities.core.rank_zero")]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)


def _loop_run(case: str, steps: int) -> dict:
    model = make_model("linear")
    x, y = _data(model)
    losses = []
    if case.startswith("fabric"):
        from lightning.fabric import Fabric

        with _quiet_lightning():
            fabric = Fabric(accelerator="cpu", devices=1, precision="bf16-mixed")
            wrapped, opt = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
            with fabric.autocast() if case == "fabric_outer" else contextlib.nullcontext():
                for _ in range(steps):
                    opt.zero_grad()
                    loss = F.mse_loss(wrapped(x), y)
                    fabric.backward(loss)
                    opt.step()
                    losses.append(float(loss.detach()))
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        outer = contextlib.nullcontext() if case == "per_step" else _autocast(cache_enabled=case != "outer_cache_disabled")
        with outer:
            for _ in range(steps):
                opt.zero_grad(set_to_none=case != "outer_zero_grad_keep")
                with _autocast() if case == "per_step" else contextlib.nullcontext():
                    loss = F.mse_loss(model(x), y)
                loss.backward()
                with torch.no_grad() if case == "outer_no_grad_step" else contextlib.nullcontext():
                    opt.step()
                if case == "outer_clear_after_step":
                    torch.clear_autocast_cache()
                losses.append(float(loss.detach()))
    with torch.no_grad():
        after = float(F.mse_loss(model(x), y))  # float32, outside any autocast: the weights as they are
    return {"loss": losses[-1], "details": {"case": LOOP_CASES[case], "losses": losses, "steps": steps,
                                            "loss after the loop (float32)": after}}


def training_loop(case: str = "outer", steps: int = 5) -> Outcome:
    """A training loop on the **installed** torch (and Lightning Fabric for the ``fabric_*`` cases):
    the Linear → ReLU → Linear model, SGD (lr 0.1), the same batch at every step, bf16 CPU
    autocast arranged as ``case`` says (a key of ``LOOP_CASES``); ``steps``: 2 to 200.
    ``details["losses"]``: the loss each step computed; ``details["loss after the loop (float32)"]``:
    a fresh float32 forward with the final weights."""
    case, steps = _case(case, LOOP_CASES, "case"), _whole("steps", steps, 2, MAX_LOOP_STEPS)
    return outcome_of(f"training loop: {LOOP_CASES[case]}", _loop_run, case, steps)


def _trend(losses) -> str:
    if len(set(losses)) == 1:
        return "frozen at its first value"
    if all(b < a for a, b in zip(losses, losses[1:])):
        return "falls at every step"
    return "changes"


def loop_table(cases=None, steps: int = 5) -> Table:
    """``training_loop`` for each of ``cases`` (keys of ``LOOP_CASES``; default: all): what the
    loss the loop computes does over ``steps`` steps."""
    cases = _cases(cases, LOOP_CASES, LOOP_CASES)
    steps = _whole("steps", steps, 2, MAX_LOOP_STEPS)
    rows = []
    for case in cases:
        o = training_loop(case, steps)
        rows.append((LOOP_CASES[case], o.error_type if o.failed else _trend(o.details["losses"])))
    return Table(("loop", f"loss over {steps} steps"), rows, title="SGD on one batch, bf16 CPU autocast")


#: Where Lightning enters autocast: the installed function whose source ``autocast_source`` reads.
AUTOCAST_ENTRIES = {
    "fabric": ("lightning.fabric.plugins.precision.amp", "MixedPrecision", "forward_context"),
    "trainer": ("lightning.pytorch.plugins.precision.amp", "MixedPrecision", "autocast_context_manager"),
}


def autocast_source(where: str = "fabric") -> list:
    """The line(s) of the **installed** Lightning that enter ``torch.autocast``, read with
    ``inspect.getsource``: ``"fabric"``: ``MixedPrecision.forward_context`` of ``lightning.fabric``
    (what ``fabric.autocast()`` and every forward of a model from ``fabric.setup`` enter);
    ``"trainer"``: ``MixedPrecision.autocast_context_manager`` of ``lightning.pytorch``."""
    import importlib

    where = _case(where, AUTOCAST_ENTRIES, "place")
    module, cls, method = AUTOCAST_ENTRIES[where]
    fn = getattr(getattr(importlib.import_module(module), cls), method)
    return [line.strip() for line in inspect.getsource(fn).splitlines() if "torch.autocast(" in line]


# --------------------------------------------------------------------------------------------
# Exercise checkers
# --------------------------------------------------------------------------------------------


def check_params_without_grad(answer) -> Check:
    """Q: simulated legacy rule, Linear → LayerNorm → Linear, a no_grad pass then a grad pass in one
    autocast: how many of its six parameters keep ``.grad = None``? (4: both Linear layers' weight
    and bias)."""
    return check(answer, 4, accept=lambda a: _text_is("four")(a) or _same(a, 4, 0.0),
                 hint="follow each Linear's cached cast: which parameters does the loss reach without one?")


def check_no_grad_sees_update(answer) -> Check:
    """Q: one autocast block, ``y1 = lin(x)`` and ``y2 = lin(x)`` both under ``torch.no_grad()``, the
    weight changed in place between them: does ``y2`` differ from ``y1``? ("no": no_grad does not
    stop the cache)."""
    return check(answer, "no", accept=_yes_no(False),
                 hint="which conditions decide whether a cast is cached (03a, section 4)? Is the grad mode "
                      "one of them today?")


_LETTERS = ("a", "b", "c", "d")


def _letters(answer):
    """The set of option letters in an answer: "b, d", "bd", "B and D", ["b", "d"], ("(b)", "d")."""
    if isinstance(answer, str):
        text = answer.casefold().replace(" and ", " ").replace("&", " ")
        chars = [c for c in text if c.isalnum()]
        return set(chars) if all(c in _LETTERS for c in chars) else None
    if isinstance(answer, (list, tuple, set, frozenset)):
        parts = [_letters(a) if isinstance(a, str) else None for a in answer]
        if any(p is None or len(p) != 1 for p in parts):
            return None
        return set().union(*parts)
    return None


def check_fabric_loop_loss_changes(answer) -> Check:
    """Q: Fabric ``bf16-mixed`` on the CPU, the whole training loop inside ``with fabric.autocast():``:
    does the loss change from step to step? ("no": it stays at its first value)."""
    return check(answer, "no", accept=_yes_no(False),
                 hint="opt.step() changes the weights in place; when is the cache emptied?")


def check_loop_fixes(answer) -> Check:
    """Q: which of the changes (a)-(d) make the one-block loop train? ("b" and "d", in any form)."""
    return check(answer, "b, d", accept=lambda a: _letters(a) == {"b", "d"},
                 hint="a fix must either stop the caching or empty the cache after the weights change")


WHY_LEGACY_NO_GRAD_PASS = Choice(
    "why_legacy_no_grad_pass",
    "Under the simulated legacy rule, the Linear -> LayerNorm model runs a no_grad pass, then a grad pass, "
    "inside one autocast block, and backward() leaves its Linear layer with .grad = None. Why?",
    {"a": "torch.no_grad() switches requires_grad off on the parameters until the autocast block exits",
     "b": "the no_grad pass cached the bf16 casts of the Linear weights, made without a grad_fn, and the grad "
          "pass was handed the same casts: the cache is emptied only when the outermost autocast exits",
     "c": "a bf16 cast made under autocast never carries a gradient back to its fp32 weight",
     "d": "the optimizer skips the Linear layers, whose bf16 gradients are too small"},
    "b",
    {"a": "the LayerNorm's parameters, which the loss reaches without a cast, get their gradient in the same "
          "run (section 3's layernorm model)",
     "c": "with the grad pass first, or with the cache off or cleared, every parameter gets its gradient "
          "(section 4's tables)",
     "d": ".grad is None right after backward(), before any optimizer runs (section 3)"},
)


WHY_TRAINER_CACHE_OFF = Choice(
    "why_trainer_cache_off",
    "Inside a Trainer(precision=\"bf16-mixed\") training_step, a weight changed in place is never served "
    "stale, yet a training loop inside one `with fabric.autocast():` computes the same loss at every step. "
    "Why the difference?",
    {"a": "the Trainer clears the autocast cache after every optimizer step",
     "b": "the Trainer's precision plugin enters autocast with cache_enabled=False, so nothing is cached; "
          "Fabric's enters it without that argument, with the cache on",
     "c": "training_step runs outside autocast: the Trainer casts the model to bf16 itself",
     "d": "Fabric's bf16-mixed keeps the weights themselves in bf16, so opt.step()'s small updates are "
          "rounded away"},
    "b",
    {"a": "there is nothing to clear: section 2 found the cache disabled inside training_step "
          "('autocast cache enabled': False)",
     "c": "section 2 found autocast enabled, in bf16, inside training_step",
     "d": "the same Fabric loop without fabric.autocast() around it learns at every step (the Fabric rows "
          "of the third question's table), with the same model and the same bf16-mixed"},
)


check_why_legacy_no_grad_pass = WHY_LEGACY_NO_GRAD_PASS.checker()


check_why_trainer_cache_off = WHY_TRAINER_CACHE_OFF.checker()


# --------------------------------------------------------------------------------------------
# Which world
# --------------------------------------------------------------------------------------------


def world() -> dict:
    """What the installed versions do, found by trying (not by version numbers): whether the
    installed torch's autocast cache hands a grad pass casts that carry grad after a no_grad pass
    (pytorch/pytorch PR #165068); whether a forward inside one autocast block sees a weight changed
    in place since the last forward (it does not while the cache holds the old cast); and the
    ``cache_enabled`` of the autocast that Lightning's ``bf16-mixed`` enters, in the Trainer's
    plugin (``False`` from Lightning 2.6.0 on, PR #20921) and in Fabric's."""
    v = versions()
    real = real_plain()
    update = in_place_update("one_block")
    out = {"torch": v["torch"], "torch: grad pass after a no_grad pass gets gradients":
           not real.failed and None not in real.grad_norms.values(),
           "torch: in-place weight update seen inside one autocast block":
           not update.failed and update.details["output changed"],
           "lightning": v["lightning"], "lightning bf16-mixed autocast cache_enabled": None,
           "lightning fabric bf16-mixed autocast cache_enabled": None}
    if v["lightning"] is not None:
        from lightning.fabric.plugins.precision import MixedPrecision as FabricMixedPrecision
        from lightning.pytorch.plugins import MixedPrecision

        ctx = MixedPrecision("bf16-mixed", "cpu").autocast_context_manager()
        out["lightning bf16-mixed autocast cache_enabled"] = bool(ctx._cache_enabled)
        ctx = FabricMixedPrecision("bf16-mixed", "cpu").forward_context()
        out["lightning fabric bf16-mixed autocast cache_enabled"] = bool(ctx._cache_enabled)
    return out


def which_world() -> str:
    """The installed versions, what each does with the autocast cache, and what that means here."""
    w = world()
    torch_ok = w["torch: grad pass after a no_grad pass gets gradients"]
    fresh = w["torch: in-place weight update seen inside one autocast block"]
    trainer = w["lightning bf16-mixed autocast cache_enabled"]
    fabric = w["lightning fabric bf16-mixed autocast cache_enabled"]
    lines = [f"torch {w['torch']}: " + ("cached casts carry grad (pytorch/pytorch PR #165068 is in)"
                                        if torch_ok else "a no_grad pass leaves casts without grad (legacy rule)"),
             f"torch {w['torch']}: " + ("a weight changed in place inside one autocast block is seen at once"
                                        if fresh else "a weight changed in place inside one autocast block is "
                                        "not seen: the cached low-precision copy is reused")]
    if w["lightning"] is None:
        lines.append("lightning: not installed")
    else:
        lines += [f"lightning {w['lightning']} Trainer: bf16-mixed enters autocast with " + (
                      "cache_enabled=False (Lightning PR #20921 is in)" if trainer is False else "the cache on"),
                  f"lightning {w['lightning']} Fabric: bf16-mixed enters autocast with " + (
                      "cache_enabled=False" if fabric is False else "the cache on (cache_enabled not passed)")]
    if torch_ok:
        lines.append("=> a no_grad pass, then a grad pass, trains here; its old failure is shown below by a"
                     " simulation of the legacy rule.")
    elif trainer is False:
        lines.append("=> mixed: the Trainer's own autocast is safe here, but an autocast of your own with the"
                     " cache on can still hit the legacy rule.")
    else:
        lines.append("=> you are in the legacy world: the failure shown below can happen in your code.")
    if not fresh:
        lines.append("=> still real here: a weight changed in place inside one autocast block with the cache on"
                     " (section 5).")
    return "\n".join(lines)
