"""``check_loop``: a learner's training step run through adversarial scenarios beside
``reference_step``, compared bit for bit (or within rounding, said so), each difference put down
to the first mistake the spies (``ampviz.training.loopcheck.spies``) saw; and the classic mistakes
(``mistaken_loop``) to run through it. ``ampviz.training.loopcheck`` tells the whole story and re-exports
the public names.
"""

from __future__ import annotations

import copy
import inspect
import math
import warnings
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

import torch

from ampviz.explain import explain
from ampviz.checks import Check, check
from ampviz.text import Table, number
from ampviz.training.loopcheck.problem import (LARGE_TARGETS, MAX_ITERATIONS, MAX_MICRO_BATCHES, _PARTS,
                                               _Setup, _error, _factor, _params, _setup, load_checkpoint,
                                               reference_step, save_checkpoint)
from ampviz.training.loopcheck.spies import LoopSpy, TimedOut, guarded, new_finding, watch
from ampviz._args import _shown
from ampviz._args import _flag, _real, _whole

#: The most scenarios one ``check_loop`` runs.
MAX_SCENARIOS = 32


# --------------------------------------------------------------------------------------------
# Part 2: the loop checker
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """An adversarial run for a learner's ``train_step``: ``iterations`` optimizer steps of
    ``micro_batches`` micro-batches, ``optimizers`` optimizers (1, or 2: one per part), loss
    ``spikes`` as (iteration, micro-batch, parts), targets shifted by ``offset``, a scaler with
    ``init_scale`` and ``growth_interval``, clipping at ``max_norm`` (None: none), a checkpoint
    after ``resume_after`` iterations (None: none), a gradient ``penalty`` weight passed to the
    step as ``penalty=`` (0: none), a ``StepLR(step_size=1, gamma=0.5)`` passed as
    ``schedulers=[...]`` (``scheduler=True``; one optimizer, no resume), and the hint given when
    the numbers differ."""

    name: str
    title: str
    hint: str
    iterations: int = 6
    micro_batches: int = 1
    optimizers: int = 1
    spikes: tuple = ()
    offset: float = 0.0
    lr: float = 0.05
    init_scale: float = 2.0**8
    growth_interval: int = 2
    max_norm: float | None = None
    resume_after: int | None = None
    penalty: float = 0.0
    scheduler: bool = False

    def __post_init__(self):
        for name in ("name", "title", "hint"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"{name} must be a string, not {_shown(getattr(self, name))}")
        iterations = _whole("iterations", self.iterations, 1, MAX_ITERATIONS)
        micro = _whole("micro_batches", self.micro_batches, 1, MAX_MICRO_BATCHES)
        optimizers = _whole("optimizers", self.optimizers, 1, 2)
        spikes = self.spikes
        if isinstance(spikes, (str, bytes)) or not isinstance(spikes, (tuple, list)):
            raise TypeError(f"spikes must be a tuple of (iteration, micro_batch, parts) triples, e.g. ((2, 0, 'ab'),), "
                            f"not {_shown(spikes)}")
        checked = []
        for spike in spikes:
            if not isinstance(spike, (tuple, list)) or len(spike) != 3:
                raise TypeError(f"each spike must be (iteration, micro_batch, parts), e.g. (2, 0, 'ab'), "
                                f"not {_shown(spike)}")
            i = _whole("a spike's iteration", spike[0], 0, iterations - 1)
            j = _whole("a spike's micro-batch", spike[1], 0, micro - 1)
            parts = spike[2]
            if not isinstance(parts, str) or not parts or set(parts) - set(_PARTS):
                raise ValueError(f"a spike's parts must be 'a', 'b' or 'ab' (the parts whose targets jump), "
                                 f"not {_shown(parts)}")
            checked.append((i, j, parts))
        offset, lr = _real("offset", self.offset), _real("lr", self.lr)
        if not abs(offset) <= 1e3:
            raise ValueError(f"offset must be a number from -1000 to 1000, not {_shown(self.offset)}")
        if not 0 <= lr <= 1:
            raise ValueError(f"lr must be a number from 0 to 1, not {_shown(self.lr)}")
        init_scale = _real("init_scale", self.init_scale)
        if not 2.0**-24 <= init_scale <= 2.0**24:
            raise ValueError(f"init_scale must be a number from 2^-24 to 2^24, not {_shown(self.init_scale)}")
        growth_interval = _whole("growth_interval", self.growth_interval, 1, 10**6)
        max_norm = self.max_norm
        if max_norm is not None:
            max_norm = _real("max_norm", max_norm)
            if not 0 < max_norm < math.inf:
                raise ValueError(f"max_norm must be a number > 0 (or None: no clipping), not {_shown(self.max_norm)}")
        resume = self.resume_after
        if resume is not None:
            resume = _whole("resume_after", resume, 1, iterations - 1) if iterations > 1 else None
            if resume is None:
                raise ValueError("resume_after needs at least 2 iterations (a checkpoint between two of them)")
        penalty, scheduler = _real("penalty", self.penalty), _flag("scheduler", self.scheduler)
        if not 0 <= penalty <= 10:
            raise ValueError(f"penalty must be a number from 0 to 10 (0: no gradient penalty), "
                             f"not {_shown(self.penalty)}")
        if scheduler and (optimizers != 1 or resume is not None):
            raise ValueError("scheduler=True needs optimizers=1 (the scale tells a skipped step of one optimizer) and "
                             "resume_after=None (save and load take no schedulers)")
        for name, value in (("iterations", iterations), ("micro_batches", micro), ("optimizers", optimizers),
                            ("spikes", tuple(checked)), ("offset", offset), ("lr", lr), ("init_scale", init_scale),
                            ("growth_interval", growth_interval), ("max_norm", max_norm), ("resume_after", resume),
                            ("penalty", penalty), ("scheduler", scheduler)):
            object.__setattr__(self, name, value)


#: The checker's scenarios by name (read-only; ``dataclasses.replace`` one to vary it). The
#: overflow lands one clean step after the scale grew (growth tracker 1), the others' where the
#: tracker is 0: a loop that backs off by hand (``update(new_scale)`` keeps the tracker) differs.
SCENARIOS = MappingProxyType({s.name: s for s in (
    Scenario("overflow", "a loss spike at iteration 3, one clean step after the scale grew", spikes=((3, 0, "ab"),),
             hint="the step whose gradients overflowed must be skipped and the scale halved: step through "
                  "scaler.step(optimizer) and call scaler.update() once per step"),
    Scenario("accumulation", "2 micro-batches per step, a spike in the second of iteration 2", micro_batches=2,
             spikes=((2, 1, "ab"),),
             hint="accumulate: zero the gradients once per step, scaler.scale(loss / len(batches)).backward() for "
                  "every micro-batch, then unscale_/step/update once"),
    Scenario("two_optimizers", "two optimizers, part a's gradients overflow at iteration 2", optimizers=2,
             spikes=((2, 0, "a"),),
             hint="with several optimizers: scaler.step(opt) for each, then one scaler.update() after all of them"),
    Scenario("resume", "a checkpoint after iteration 5 of a run whose scale settled at 256, resumed in fresh "
                       "objects", iterations=10, offset=LARGE_TARGETS, lr=1e-3, init_scale=2.0**10, growth_interval=3,
             resume_after=6,
             hint="save and restore the model's, every optimizer's and the scaler's state_dict()"),
    Scenario("clipping", "gradient clipping at max_norm=0.5", max_norm=0.5,
             hint="clip after scaler.unscale_(optimizer) and before scaler.step(optimizer): clipping the scaled "
                  "gradients clips a norm S times too large"),
)})
#: Scenarios ``check_loop`` runs only when named: each passes the step one more keyword
#: (``penalty=0.1``; ``schedulers=[StepLR]``), and is not checked for a step that takes none.
MORE_SCENARIOS = MappingProxyType({s.name: s for s in (
    Scenario("penalty", "a gradient penalty 0.1 × ‖∇loss‖² (the step takes penalty=0.1)", penalty=0.1,
             hint="add penalty × ‖∇loss‖² to the loss, from the gradients of "
                  "torch.autograd.grad(scaler.scale(loss), model.parameters(), create_graph=True) multiplied by "
                  "1 / scaler.get_scale() (on the scaled gradients the penalty is S² times too large), then "
                  "scaler.scale(loss).backward()"),
    Scenario("scheduler", "a StepLR scheduler (the step takes schedulers=[...]), a loss spike at iteration 2",
             spikes=((2, 0, "ab"),), scheduler=True,
             hint="step the schedulers after a step that ran, not after a skipped one (the scale drops across "
                  "scaler.update() when the step was skipped)"),
)})
#: A right loop that does the step's arithmetic in another order differs from the reference by
#: rounding: float16 rounds each value to 2^-11 (relative), so each gradient moves by a few such
#: roundings and each weight by as much of how far it moved (the summed micro-batch losses:
#: 2^-10.3); a mistake changes the update by a factor (a doubled scale ×2, a missing unscale ×S,
#: a lost micro-batch ½). Accepted: every weight within ``ROUNDING`` of its path (the sum of
#: |change| over the reference's iterations) plus one float32 ulp per step taken, with the same
#: scales, skipped steps and learning rates, and nothing the spies flag.
ROUNDING = 2.0**-7


class _Trace:
    """What a run did after each iteration (weights, scale, skipped per optimizer, learning rates)
    and what the spies saw in it (``spies``); ``start``: the weights before it;
    ``error``/``error_at``: what it raised, and in which iteration (or "save"/"load")."""

    def __init__(self):
        self.weights, self.scales, self.skipped, self.lrs, self.findings = [], [], [], [], []
        self.error, self.error_at, self.after_load, self.start = None, None, None, None


def _takes(fn, name: str) -> bool:
    """Whether ``fn`` takes the keyword ``name``."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind == p.VAR_KEYWORD or (p.name == name and p.kind != p.POSITIONAL_ONLY) for p in params)


def _iterate(step, s: _Setup, scenario: Scenario, iterations, trace: _Trace, timeout) -> bool:
    """Run ``step`` over ``iterations`` of ``s``, recording into ``trace``; False once it raised."""
    extra = {"penalty": scenario.penalty} if scenario.penalty else {}
    if scenario.scheduler:
        extra["schedulers"] = list(s.schedulers)
    for i in iterations:
        finding = s.scaler.finding = new_finding()
        handles = watch(s.model, s.model.a, finding)
        before, epochs = list(s.steps), [sch.last_epoch for sch in s.schedulers]
        try:
            guarded(step, (s.model, s.optimizers, s.scaler, s.batches[i], scenario.max_norm), extra,
                    timeout=timeout, scaler=s.scaler, finding=finding)
        except (Exception, TimedOut) as exc:  # noqa: BLE001 - whatever the learner's step raises is the verdict
            trace.error, trace.error_at = exc, i
            trace.findings.append(finding)
            return False
        finally:
            for h in handles:
                h.remove()
        finding["bypassed"] = any(after > b and id(opt) not in finding["stepped"]
                                  for opt, after, b in zip(s.optimizers, s.steps, before))
        finding["scheduled"] = tuple(sch.last_epoch - e for sch, e in zip(s.schedulers, epochs))
        trace.findings.append(finding)
        trace.weights.append(torch.cat(s.weights()))
        trace.scales.append(float(s.scaler.get_scale()))
        trace.skipped.append(tuple(after == b for after, b in zip(s.steps, before)))
        trace.lrs.append(tuple(g["lr"] for opt in s.optimizers for g in opt.param_groups))
    return True


def _state_after_load(saved: _Setup, fresh: _Setup) -> dict:
    """What a load restored, part by part, compared with the objects that were saved."""
    def opt_state(opt):
        return [t for st in opt.state_dict()["state"].values() for t in st.values() if isinstance(t, torch.Tensor)]

    same_opt = all(len(opt_state(a)) == len(opt_state(b)) and
                   all(torch.equal(x, y) for x, y in zip(opt_state(a), opt_state(b)))
                   for a, b in zip(saved.optimizers, fresh.optimizers))
    return {"model": all(torch.equal(a, b) for a, b in zip(saved.weights(), fresh.weights())),
            "optimizers": same_opt,
            "scale": (float(saved.scaler.get_scale()), float(fresh.scaler.get_scale())),
            "tracker": (int(saved.scaler._get_growth_tracker()), int(fresh.scaler._get_growth_tracker()))}


def _run_scenario(step, scenario: Scenario, save, load, timeout=None) -> _Trace:
    """One scenario with ``step`` (and ``save``/``load`` at the checkpoint), on a fresh problem;
    each call of them within ``timeout`` seconds (None: no limit)."""
    trace = _Trace()

    def make(model_seed=None):
        return _setup(0, iterations=scenario.iterations, micro_batches=scenario.micro_batches,
                      optimizers=scenario.optimizers, spikes=tuple(scenario.spikes), offset=scenario.offset,
                      lr=scenario.lr, init_scale=scenario.init_scale, growth_interval=scenario.growth_interval,
                      scaler_class=LoopSpy, model_seed=model_seed, scheduler=scenario.scheduler)

    s = make()
    trace.start = torch.cat(s.weights())
    cut = scenario.iterations if scenario.resume_after is None else scenario.resume_after
    if not _iterate(step, s, scenario, range(cut), trace, timeout) or scenario.resume_after is None:
        return trace
    fresh = make(model_seed=1)  # another initialisation: the checkpoint must restore the weights
    where = "save"
    try:
        checkpoint = copy.deepcopy(guarded(save, (s.model, s.optimizers, s.scaler), {}, timeout=timeout,
                                           scaler=s.scaler, finding=new_finding()))  # as a file would hold it
        where = "load"
        guarded(load, (checkpoint, fresh.model, fresh.optimizers, fresh.scaler), {}, timeout=timeout,
                scaler=fresh.scaler, finding=new_finding())
    except (Exception, TimedOut) as exc:  # noqa: BLE001 - the learner's save or load raising is the verdict
        trace.error, trace.error_at = exc, where
        return trace
    trace.after_load = _state_after_load(s, fresh)
    _iterate(step, fresh, scenario, range(cut, scenario.iterations), trace, timeout)
    return trace


class ScenarioResult(NamedTuple):
    """One scenario's verdict: ``status`` "ok", "wrong" or "not checked"; ``message``: one line,
    what is wrong and how to fix it ("ok", or why the bits differ when only rounding does);
    ``iteration``: the first iteration that went wrong (or None); ``scales``/``reference_scales``:
    the scale after each iteration."""

    name: str
    title: str
    status: str
    message: str
    iteration: int | None = None
    scales: tuple = ()
    reference_scales: tuple = ()


def _explained(exc: BaseException, where, scenario: Scenario) -> str:
    """What was raised, where, and how to fix it (``ampviz.explain``; with gradient accumulation
    also the scenario's hint, since an error there is usually one call made per micro-batch)."""
    at = f"{where}(...)" if where in ("save", "load") else f"iteration {where}"
    if isinstance(exc, TimedOut):
        return (f"{at} did not return within {number(exc.args[0])} s: a loop that never ends? (a right step takes "
                "milliseconds here; check_loop(..., timeout=...) allows more)")
    found = explain(exc)
    fix = f" Fix: {found.fix}" if found.known else ""
    if scenario.micro_batches > 1 and where not in ("save", "load"):
        fix += f" With {scenario.micro_batches} micro-batches per step: {scenario.hint}."
    return f"raised {_error(exc)} (in {at}).{fix}"


#: What the spies can see go wrong, blamed in this order: (whether it explains an error better
#: than the error itself, the test on an iteration's finding, what the iteration did and the fix).
_SPIED = (
    (False, lambda f: f["forwards"] == 0, "never ran the model: the loss is model(x, y), for each (x, y) in batches"),
    (False, lambda f: f["autocast"] < f["forwards"],
     'ran the model outside torch.autocast("cpu", dtype=torch.float16): compute the loss under autocast'),
    (True, lambda f: f["other_scaler"],
     "used its own GradScaler instead of the scaler passed in: scale, unscale_, step and update with the scaler "
     "argument (a scaler made anew starts again from its initial scale)"),
    (False, lambda f: f["scale"] == 0, "never called scaler.scale: backward from scaler.scale(loss), not from loss"),
    (False, lambda f: f["backwards"] and not f["through_scale"],
     "called scaler.scale(loss) but ran backward on the unscaled loss: backward from what scaler.scale returns, "
     "scaler.scale(loss).backward()"),
    (False, lambda f: f["stale"], "started with the previous step's gradients: zero them once per step "
                                  "(optimizer.zero_grad() for every optimizer)"),
    (False, lambda f: f["lost"], "zeroed the gradients between micro-batches: zero them once, before the first "
                                 "micro-batch"),
    (True, lambda f: f["cleared"],
     "zeroed the gradients after backward and before scaler.step, which then had none to apply: call "
     "optimizer.zero_grad() once at the start of the step, before the first backward"),
    (False, lambda f: f["update"] != 1, "called scaler.update() {update} times: call it once per step, after every "
                                        "optimizer's scaler.step"),
    (False, lambda f: f["new_scale"],
     "set the scale by hand with scaler.update(new_scale), which keeps the growth count, so the scale grows again "
     "too early: call scaler.update() with no argument, which halves the scale after an overflow and restarts the "
     "count"),
)


def _spied(trace: _Trace, i: int, decisive: bool = False) -> str | None:
    """The first thing the spies saw go wrong up to iteration ``i``, or None (``decisive``: only
    what explains an error better than the error itself)."""
    for k, f in enumerate(trace.findings[:i + 1]):
        for explains_error, seen, says in _SPIED:
            if (explains_error or not decisive) and seen(f):
                return f"iteration {k} " + says.format(**f)
    return None


def _diagnose(trace: _Trace, ref: _Trace, scenario: Scenario, i: int) -> str:
    """The first thing the spies saw go wrong, else what differs and the scenario's hint."""
    spied = _spied(trace, i)
    if spied:
        return spied
    for k, f in enumerate(trace.findings[:i + 1]):
        if f["bypassed"]:
            what = (f"in iteration {i} the gradients overflowed and it stepped anyway"
                    if any(r and not m for m, r in zip(trace.skipped[i], ref.skipped[i])) else
                    f"after iteration {i} the weights differ")
            return (f"the loop calls optimizer.step() itself: {what}; step with scaler.step(optimizer), which "
                    "skips a step whose gradients overflowed")
    if scenario.resume_after is not None and i >= scenario.resume_after and trace.after_load:
        loaded = trace.after_load
        if loaded["scale"][0] != loaded["scale"][1] or loaded["tracker"][0] != loaded["tracker"][1]:
            after = slice(scenario.resume_after, None)
            mine, theirs = sum(map(any, trace.skipped[after])), sum(map(any, ref.skipped[after]))
            return (f"the scaler's state was not restored: after loading, the scale is {number(loaded['scale'][1])} "
                    f"(growth tracker {loaded['tracker'][1]}) where it was saved at {number(loaded['scale'][0])} "
                    f"({loaded['tracker'][0]}), and {mine} of the next {len(trace.skipped[after])} steps were "
                    f"skipped (the reference skipped {theirs}): save scaler.state_dict() in the checkpoint and "
                    "restore it with scaler.load_state_dict(...)")
        if not loaded["model"]:
            return "after loading, the weights are not those saved: save model.state_dict() and load it"
        if not loaded["optimizers"]:
            return ("after loading, the optimizers' state (momentum) is not that saved: save each "
                    "optimizer.state_dict() and load it")
    if trace.lrs[i] != ref.lrs[i] and trace.skipped[i] == ref.skipped[i]:
        mine, theirs = trace.findings[i]["scheduled"], ref.findings[i]["scheduled"]
        if any(mine) and not any(theirs):
            return (f"iteration {i} stepped the scheduler although the optimizer step was skipped (its gradients "
                    "overflowed), so the schedule runs one step ahead for each skipped step: "
                    f"{scenario.hint}")
        if any(theirs) and not any(mine):
            return f"iteration {i} did not step the scheduler after a step that ran: {scenario.hint}"
        return (f"after iteration {i}: learning rate {', '.join(map(number, trace.lrs[i]))}, the reference's "
                f"{', '.join(map(number, ref.lrs[i]))}: {scenario.hint}")
    what = []
    if trace.skipped[i] != ref.skipped[i]:
        parts = [f"{_PARTS[k] if len(trace.skipped[i]) > 1 else 'the optimizer'} "
                 f"{'skipped' if mine else 'stepped'} where the reference {'skipped' if theirs else 'stepped'}"
                 for k, (mine, theirs) in enumerate(zip(trace.skipped[i], ref.skipped[i])) if mine != theirs]
        what.append("; ".join(parts))
    if not _same_float(trace.scales[i], ref.scales[i]):
        what.append(f"scale {number(trace.scales[i])}, the reference's {number(ref.scales[i])}")
    if not what:
        what.append("the weights differ" + _moved(trace, ref, i))
    return f"after iteration {i}: {', '.join(what)}: {scenario.hint}"


def _moved(trace: _Trace, ref: _Trace, i: int) -> str:
    """When the weights differ first at a step both took from the same weights and the loop's
    change is k times the reference's (within ``ROUNDING``): that k, a hint at a scale or loss
    multiplied, or unscaled twice."""
    start = ref.weights[i - 1] if i else ref.start
    if i and not _same_bits(trace.weights[i - 1], start):
        return ""
    mine, theirs = trace.weights[i] - start, ref.weights[i] - start
    k = float(mine @ theirs / (theirs @ theirs)) if theirs.any() else math.nan
    if not (math.isfinite(k) and k > 0 and abs(k - 1) > ROUNDING
            and float((mine - k * theirs).norm()) <= ROUNDING * float(theirs.norm())):
        return ""
    return f": they moved {_factor(k)} × as far as the reference's (it applied {_factor(k)} × the right gradients)"


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit (so NaN equals the same NaN, and 0.0 differs from -0.0)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.int32), b.view(torch.int32))


def _same_float(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _within_rounding(w: torch.Tensor, ref: torch.Tensor, path: torch.Tensor, steps: int) -> bool:
    """Every weight within ``ROUNDING`` of its path plus a float32 ulp per step (or equal, or both NaN)."""
    ulp = torch.nextafter(ref.abs(), torch.tensor(math.inf)) - ref.abs()
    return bool(((w == ref) | (w.isnan() & ref.isnan()) | ((w - ref).abs() <= ROUNDING * path + steps * ulp)).all())


#: The note of a scenario passed within rounding (why its bits differ).
_ROUNDED = ("ok, within rounding: not bit for bit, but every weight within 2^-7 of how far it moved, as the same "
            "arithmetic done in another order rounds (e.g. one backward of the summed micro-batch losses adds their "
            "gradients in float16, in autocast's cached float16 weight, where the reference adds them in float32)")


def _compare(trace: _Trace, ref: _Trace, scenario: Scenario) -> ScenarioResult:
    base = dict(name=scenario.name, title=scenario.title, scales=tuple(trace.scales),
                reference_scales=tuple(ref.scales))
    if ref.error is not None:  # never: the reference runs every scenario (tested)
        raise RuntimeError(f"the reference raised in scenario {scenario.name}: {_error(ref.error)}")
    path, steps, rounded = torch.zeros_like(ref.start), 0, False
    for i, finding in enumerate(trace.findings):
        if finding["leaked"]:
            what, was, now, how = finding["leaked"]
            return ScenarioResult(status="wrong", iteration=i, **base, message=(
                f"iteration {i} returned with {what} {now} (it was {was}), so the rest of the loop runs so too: "
                f"{how}"))
        if i == len(trace.weights):
            break
        path += (ref.weights[i] - (ref.weights[i - 1] if i else ref.start)).abs()
        steps += not all(ref.skipped[i])
        if _same_float(trace.scales[i], ref.scales[i]) and trace.skipped[i] == ref.skipped[i] \
                and trace.lrs[i] == ref.lrs[i]:
            if _same_bits(trace.weights[i], ref.weights[i]):
                continue
            if _spied(trace, i) is None and _within_rounding(trace.weights[i], ref.weights[i], path, steps):
                rounded = True
                continue
        return ScenarioResult(status="wrong", message=_diagnose(trace, ref, scenario, i), iteration=i, **base)
    if trace.error is not None:
        at = scenario.resume_after if trace.error_at in ("save", "load") else trace.error_at
        spied = None if trace.error_at in ("save", "load") else _spied(trace, at, decisive=True)
        return ScenarioResult(status="wrong", message=spied or _explained(trace.error, trace.error_at, scenario),
                              iteration=at, **base)
    return ScenarioResult(status="ok", message=_ROUNDED if rounded else "ok", **base)


@dataclass(frozen=True, eq=False)
class CheckReport:
    """``check_loop``'s answer: one ``ScenarioResult`` per scenario and an overall ``verdict``."""

    results: tuple

    @property
    def ok(self) -> bool:
        return all(r.status == "ok" for r in self.results)

    @property
    def verdict(self) -> str:
        wrong = [r.name for r in self.results if r.status == "wrong"]
        unchecked = [r.name for r in self.results if r.status == "not checked"]
        rounded = [r.name for r in self.results if r.status == "ok" and r.message != "ok"]
        if wrong:
            return f"{len(wrong)} of {len(self.results)} scenarios wrong: {', '.join(wrong)}"
        note = f"; within rounding, not bit for bit: {', '.join(rounded)}" if rounded else ""
        if unchecked:
            return f"every checked scenario ok; not checked: {', '.join(unchecked)}{note}"
        return f"all {len(self.results)} scenarios ok{note}"

    def __getitem__(self, name: str) -> ScenarioResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(f"{_shown(name)}: one of {', '.join(_shown(r.name) for r in self.results)}")

    @property
    def table(self) -> Table:
        return Table(("scenario", "result"), [(r.name, r.message) for r in self.results], title=self.verdict)

    def __str__(self) -> str:
        return str(self.table)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return self.table._repr_html_()


def _scenarios(scenarios) -> list:
    """The scenarios to run: ``SCENARIOS`` for None; names (of ``SCENARIOS`` or ``MORE_SCENARIOS``)
    or ``Scenario``s."""
    if scenarios is None:
        return list(SCENARIOS.values())
    if isinstance(scenarios, (str, Scenario)):
        scenarios = [scenarios]
    named = {**SCENARIOS, **MORE_SCENARIOS}
    if not isinstance(scenarios, (list, tuple)):
        raise TypeError(f"scenarios must be a list of scenario names ({', '.join(named)}) or Scenarios, "
                        f"or None for all, not {_shown(scenarios)}")
    if len(scenarios) > MAX_SCENARIOS:
        raise ValueError(f"scenarios must list at most {MAX_SCENARIOS}, not {len(scenarios)}")
    out = []
    for item in scenarios:
        if isinstance(item, Scenario):
            out.append(item)
        elif isinstance(item, str) and item in named:
            out.append(named[item])
        else:
            raise ValueError(f"unknown scenario {_shown(item)}: use {', '.join(named)} or a Scenario "
                             "(e.g. dataclasses.replace(SCENARIOS['overflow'], spikes=((4, 0, 'ab'),)))")
    return out


def _callable(name: str, fn, signature: str):
    if fn is not None and not callable(fn):
        raise TypeError(f"{name} must be a function {signature}, not {_shown(fn)}")
    return fn


def _unchecked(scenario: Scenario, train_step, save, load) -> str | None:
    """Why ``scenario`` cannot run these functions (None: it can)."""
    signature = "train_step(model, optimizers, scaler, batches, max_norm, {})"
    if scenario.resume_after is not None and (save is None or load is None):
        return "not checked: pass save= and load= (your checkpoint functions)"
    for needed, name, default in ((scenario.penalty, "penalty", "penalty=0.0"), (scenario.scheduler, "schedulers",
                                                                                 "schedulers=()")):
        if needed and not _takes(train_step, name):
            return f"not checked: the step takes no {name} parameter: write {signature.format(default)}"
    return None


def check_loop(train_step, *, save=None, load=None, scenarios=None, timeout=10.0) -> CheckReport:
    """Run ``train_step(model, optimizers, scaler, batches, max_norm)`` through ``scenarios`` (all
    of ``SCENARIOS`` for None; names, also of ``MORE_SCENARIOS``, or ``Scenario`` objects such as
    ``dataclasses.replace(SCENARIOS["overflow"], spikes=((4, 0, "ab"),))`` for a spike at another
    step) beside ``reference_step``, and compare the weights, the scale, which optimizer steps
    were skipped and the learning rates after every iteration: bit for bit, or within rounding
    (``ROUNDING``; the verdict says so) when the spies saw nothing wrong either.

    ``train_step`` does one optimizer step: ``model(x, y)`` is the loss of a micro-batch (run it
    under ``torch.autocast("cpu", dtype=torch.float16)``), ``batches`` the step's micro-batches,
    ``optimizers`` a list, ``scaler`` a ``torch.amp.GradScaler("cpu")``, ``max_norm`` a norm to
    clip the gradients to, or None. The resume scenario needs ``save(model, optimizers, scaler)``
    (returns the checkpoint) and ``load(checkpoint, model, optimizers, scaler)``: the checkpoint is
    deep-copied between them, as writing it to disk would; without them it is not checked. The
    "penalty" scenario passes ``penalty=`` (a gradient penalty's weight) and "scheduler"
    ``schedulers=`` (a list of learning-rate schedulers, one per optimizer): a step without that
    parameter is not checked there. Errors these functions raise are explained with
    ``ampviz.explain``; a call that has not returned after ``timeout`` seconds (None: no limit) is
    stopped, and the scenarios after it are not run. torch's global state (grad mode, autocast...)
    is restored after each call, and a call that left it changed is wrong.
    """
    _callable("train_step", train_step, "train_step(model, optimizers, scaler, batches, max_norm)")
    if train_step is None:
        raise TypeError("train_step must be a function train_step(model, optimizers, scaler, batches, max_norm), "
                        "not None")
    _callable("save", save, "save(model, optimizers, scaler) -> checkpoint")
    _callable("load", load, "load(checkpoint, model, optimizers, scaler)")
    if timeout is not None and not 0 < _real("timeout", timeout) <= 86400:
        raise ValueError(f"timeout must be a number of seconds from 0 to 86400 (or None: no limit), "
                         f"not {_shown(timeout)}")
    chosen = _scenarios(scenarios)
    results, stopped = [], None
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        torch.manual_seed(0)
        for scenario in chosen:
            why = f"not checked: stopped after {stopped} timed out" if stopped else \
                _unchecked(scenario, train_step, save, load)
            if why:
                results.append(ScenarioResult(scenario.name, scenario.title, "not checked", why))
                continue
            trace = _run_scenario(train_step, scenario, save, load, timeout)
            ref = _run_scenario(reference_step, scenario, save_checkpoint, load_checkpoint)
            results.append(_compare(trace, ref, scenario))
            if isinstance(trace.error, TimedOut):
                stopped = scenario.name
    return CheckReport(tuple(results))


# --------------------------------------------------------------------------------------------
# Classic mistakes, to run through the checker
# --------------------------------------------------------------------------------------------


def _step_with(*, zero="once", scaled=True, update="once", unscale="to clip", clip="after unscale_",
               via_scaler=True, autocast=True, divide=True):
    """``reference_step`` with one thing (or none) done otherwise (the choices of ``MISTAKES``)."""

    def train_step(model, optimizers, scaler, batches, max_norm=None):
        if zero == "once":
            for opt in optimizers:
                opt.zero_grad()
        for j, (x, y) in enumerate(batches):
            if zero == "each micro-batch":
                for opt in optimizers:
                    opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16, enabled=autocast):
                loss = model(x, y) / (len(batches) if divide else 1)
            (scaler.scale(loss) if scaled else loss).backward()
            if unscale == "each micro-batch":
                for opt in optimizers:
                    scaler.unscale_(opt)
            if update == "each micro-batch" and j < len(batches) - 1:
                scaler.update()
        for opt in optimizers:
            if max_norm is not None and clip == "before unscale_":
                torch.nn.utils.clip_grad_norm_(_params(opt), max_norm)
            if unscale == "twice" or (unscale == "to clip" and (max_norm is not None or not via_scaler)):
                scaler.unscale_(opt)
            if max_norm is not None and clip == "after unscale_":
                torch.nn.utils.clip_grad_norm_(_params(opt), max_norm)
            if unscale == "twice":
                scaler.unscale_(opt)
            if via_scaler:
                scaler.step(opt)
            else:
                opt.step()
            if update == "each optimizer":
                scaler.update()
        if update in ("once", "each micro-batch"):
            scaler.update()

    return train_step


def _load_without(part: str):
    """``load_checkpoint`` that leaves out one part: "model", "optimizers" or "scaler"."""

    def load(checkpoint, model, optimizers, scaler):
        if part != "model":
            model.load_state_dict(checkpoint["model"])
        if part != "optimizers":
            for optimizer, state in zip(optimizers, checkpoint["optimizers"]):
                optimizer.load_state_dict(state)
        if part != "scaler":
            scaler.load_state_dict(checkpoint["scaler"])

    return load


_MISTAKES = {
    "update() after every micro-batch": dict(step=dict(update="each micro-batch")),
    "unscale_ after every micro-batch": dict(step=dict(unscale="each micro-batch")),
    "micro-batch losses not divided": dict(step=dict(divide=False)),
    "zero_grad() before every micro-batch": dict(step=dict(zero="each micro-batch")),
    "no zero_grad()": dict(step=dict(zero="never")),
    "update() after each optimizer": dict(step=dict(update="each optimizer")),
    "no update()": dict(step=dict(update="never")),
    "unscale_ twice": dict(step=dict(unscale="twice")),
    "clip before unscale_": dict(step=dict(clip="before unscale_")),
    "loss.backward() without scale": dict(step=dict(scaled=False)),
    "optimizer.step() instead of scaler.step": dict(step=dict(via_scaler=False)),
    "no autocast": dict(step=dict(autocast=False)),
    "resume without the scaler's state": dict(load="scaler"),
    "resume without the model's state": dict(load="model"),
    "resume without the optimizers' state": dict(load="optimizers"),
}
#: The classic mistakes ``mistaken_loop`` writes, by name.
MISTAKES = tuple(_MISTAKES)


def mistaken_loop(mistake: str) -> dict:
    """A loop with one classic mistake (one of ``MISTAKES``), everything else as ``reference_step``,
    ``save_checkpoint`` and ``load_checkpoint`` do it: ``{"train_step": ..., "save": ..., "load": ...}``,
    to pass on as ``check_loop(**mistaken_loop(mistake))``."""
    if not isinstance(mistake, str) or mistake not in _MISTAKES:
        raise ValueError(f"unknown mistake {_shown(mistake)}: use one of {', '.join(repr(m) for m in MISTAKES)}")
    spec = _MISTAKES[mistake]
    load = _load_without(spec["load"]) if "load" in spec else load_checkpoint
    return {"train_step": _step_with(**spec.get("step", {})), "save": save_checkpoint, "load": load}


def check_train_loop(answer) -> Check:
    """Q: write ``train_step(model, optimizers, scaler, batches, max_norm)`` (gradient
    accumulation, several optimizers, clipping) and, to check resuming too, ``save`` and ``load``:
    ``answer = train_step`` or ``answer = (train_step, save, load)``. The checker runs
    ``check_loop`` and answers with its verdict: ✓, or the first wrong scenario's line."""
    if answer is None or answer is Ellipsis:
        return check(None, None)
    save = load = None
    if isinstance(answer, (tuple, list)):
        if len(answer) != 3 or not all(callable(f) for f in answer):
            return Check("wrong", "✗ not quite: answer = train_step, or answer = (train_step, save, load): "
                                  "three functions")
        answer, save, load = answer
    if not callable(answer):
        return Check("wrong", "✗ not quite: set answer = train_step, the function itself (no call, no quotes)")
    report = check_loop(answer, save=save, load=load)
    wrong = [r for r in report.results if r.status == "wrong"]
    if wrong:
        return Check("wrong", f"✗ not quite: {wrong[0].name}: {wrong[0].message}")
    rounded = [r.name for r in report.results if r.status == "ok" and r.message != "ok"]
    note = f" (within rounding, not bit for bit: {', '.join(rounded)})" if rounded else ""
    if not report.ok:
        return Check("right", f"✓ correct{note} (resume not checked: answer = (train_step, save, load) checks it "
                              "too)")
    return Check("right", f"✓ correct{note}")
