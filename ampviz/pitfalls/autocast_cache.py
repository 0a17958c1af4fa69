"""Pitfall 2: a ``torch.no_grad()`` forward inside autocast, then a forward with grad (torch, lightning).

Two worlds, kept apart by name:

- ``real_*``: what the **installed** torch and Lightning do. On torch with pytorch/pytorch PR #165068
  (cached casts always carry grad) and Lightning >= 2.6.0 (its autocast uses ``cache_enabled=False``,
  Lightning PR #20921) the pattern works.
- ``simulated_*`` and ``SimulatedLegacyAutocastCache``: a **simulation of the legacy caching rule**
  (the old ``cached_cast`` in torch's ``aten/src/ATen/autocast_mode.cpp``), applied to ``F.linear``
  by a ``torch.overrides.TorchFunctionMode``. It is not the library: it recreates what older
  versions did, so the failure and each fix can be shown on any version.

Every scenario returns an ``Outcome`` (``ampviz.pitfalls``): the exception's type and exact message,
or the gradient norm per parameter (``None`` where a parameter got no gradient).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from ampviz.pitfalls import Outcome, outcome_of, quiet_trainer, versions
from ampviz.scaling import _shown
from ampviz.training import _seed, _whole

__all__ = ["DTYPE", "SIMULATED_FIXES", "SimulatedLegacyAutocastCache", "make_model", "fix_table",
           "real_plain", "real_lightning", "simulated_plain", "simulated_lightning", "summary", "which_world", "world"]

DTYPE = torch.bfloat16  # the CPU autocast dtype the lessons use
KINDS = ("linear", "layernorm")
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
    ``"layernorm"``: Linear → LayerNorm (the LayerNorm's weights are reached without one)."""
    kind = _kind(kind)
    torch.manual_seed(_seed(seed))
    if kind == "linear":
        return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    return nn.Sequential(nn.Linear(8, 4), nn.LayerNorm(4))


def _kind(kind) -> str:
    if not (isinstance(kind, str) and kind in KINDS):
        raise ValueError(f"unknown model kind {_shown(kind)}: 'linear' or 'layernorm'")
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
    from ampviz.lessons import Table

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
# Which world
# --------------------------------------------------------------------------------------------


def world() -> dict:
    """What the installed versions do, found by trying (not by version numbers): whether the
    installed torch's autocast cache hands a grad pass casts that carry grad after a no_grad pass
    (pytorch/pytorch PR #165068), and the ``cache_enabled`` of the autocast that Lightning's
    ``bf16-mixed`` plugin enters (``False`` from Lightning 2.6.0 on, PR #20921)."""
    v = versions()
    real = real_plain()
    out = {"torch": v["torch"], "torch: grad pass after a no_grad pass gets gradients":
           not real.failed and None not in real.grad_norms.values(),
           "lightning": v["lightning"], "lightning bf16-mixed autocast cache_enabled": None}
    if v["lightning"] is not None:
        from lightning.pytorch.plugins import MixedPrecision

        ctx = MixedPrecision("bf16-mixed", "cpu").autocast_context_manager()
        out["lightning bf16-mixed autocast cache_enabled"] = bool(ctx._cache_enabled)
    return out


def which_world() -> str:
    """The installed versions, what each does about the autocast cache, and what that means here."""
    w = world()
    torch_ok = w["torch: grad pass after a no_grad pass gets gradients"]
    lightning_ok = w["lightning bf16-mixed autocast cache_enabled"] is False
    lines = [f"torch {w['torch']}: " + ("cached casts carry grad (pytorch/pytorch PR #165068 is in)"
                                        if torch_ok else "a no_grad pass leaves casts without grad (legacy rule)"),
             f"lightning {w['lightning']}: " + (
                 "bf16-mixed enters autocast with cache_enabled=False (Lightning PR #20921 is in)" if lightning_ok
                 else "not installed" if w["lightning"] is None else "bf16-mixed enters autocast with the cache on")]
    if torch_ok:
        lines.append("=> you are in the fixed world: the pattern trains here, in plain torch and in a Trainer;"
                     " its failure is shown below by a simulation of the legacy rule.")
    elif lightning_ok:
        lines.append("=> mixed: Lightning's own autocast is safe here, but an autocast of your own with the"
                     " cache on can still hit the legacy rule.")
    else:
        lines.append("=> you are in the legacy world: the failure shown below can happen in your code.")
    return "\n".join(lines)
