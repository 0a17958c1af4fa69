"""ampviz.training.loopcheck's checker on loops written the way people write them.

Each right loop must be accepted (bit for bit, or within rounding with a note saying why its bits
differ), each wrong one rejected with a line that names its actual mistake and its fix; a
learner's step must not leak global state into the reference run, and a step that never returns
gets a verdict. The tables print measured values at the digits the lesson needs, the same text
for any value within ``lessons.MEASURED_REL`` of the one measured here.
"""

import dataclasses
import math
import signal
import threading
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ampviz.training import loopcheck as L
from ampviz.text import MEASURED_REL

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # steadier on a loaded machine; results do not depend on it


@pytest.fixture(autouse=True)
def _global_state():
    """Whatever a test's step leaves behind (when the checker fails to restore it) stops here."""
    state = torch.is_grad_enabled(), torch.is_autocast_enabled("cpu")
    yield
    torch.set_grad_enabled(state[0])
    torch.set_autocast_enabled("cpu", state[1])


FP16 = dict(device_type="cpu", dtype=torch.float16)


def _params(opt):
    return [p for g in opt.param_groups for p in g["params"]]


def _losses(model, batches):
    """Each micro-batch's loss under autocast, divided by their number."""
    for x, y in batches:
        with torch.autocast(**FP16):
            yield model(x, y) / len(batches)


def _finish(optimizers, scaler, max_norm):
    """The end of a right step: unscale_ (to clip), clip, step every optimizer, one update()."""
    for opt in optimizers:
        if max_norm is not None:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(_params(opt), max_norm)
        scaler.step(opt)
    scaler.update()


def _wrong(report):
    return {r.name: r for r in report.results if r.status == "wrong"}


# ---------------------------------------------------------------- 1. scale(loss), then loss.backward()


def scale_then_backward_unscaled(model, optimizers, scaler, batches, max_norm):
    for opt in optimizers:
        opt.zero_grad()
    for loss in _losses(model, batches):
        scaler.scale(loss)
        loss.backward()
    _finish(optimizers, scaler, max_norm)


def test_backward_on_the_unscaled_loss_is_named():
    wrong = _wrong(L.check_loop(scale_then_backward_unscaled))
    assert set(wrong) == {"overflow", "accumulation", "two_optimizers", "clipping"}
    for r in wrong.values():
        assert "ran backward on the unscaled loss" in r.message and "scaler.scale(loss).backward()" in r.message
        assert "call scaler.update() once per step" not in r.message and "\n" not in r.message


# ---------------------------------------------------------------- 2. a GradScaler of its own

OUTSIDE = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)


def own_scaler_inside(model, optimizers, scaler, batches, max_norm):
    own = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
    L.reference_step(model, optimizers, own, batches, max_norm)


def scaler_from_outside(model, optimizers, scaler, batches, max_norm):
    L.reference_step(model, optimizers, OUTSIDE, batches, max_norm)


def own_scaler_for_scale_only(model, optimizers, scaler, batches, max_norm):
    own = torch.amp.GradScaler("cpu")
    for opt in optimizers:
        opt.zero_grad()
    for loss in _losses(model, batches):
        own.scale(loss).backward()
    _finish(optimizers, scaler, max_norm)


@pytest.mark.parametrize("step", [own_scaler_inside, scaler_from_outside, own_scaler_for_scale_only],
                         ids=lambda f: f.__name__)
def test_a_scaler_of_its_own_is_named(step):
    wrong = _wrong(L.check_loop(step, scenarios=["overflow", "two_optimizers"]))
    assert set(wrong) == {"overflow", "two_optimizers"}
    for r in wrong.values():
        assert "its own GradScaler instead of the scaler passed in" in r.message, r.message
        assert "never called scaler.scale" not in r.message and "_scale is None" not in r.message


# ---------------------------------------------------------------- 3. zero_grad() between backward and step


@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad_between_backward_and_step_is_named(set_to_none):
    def step(model, optimizers, scaler, batches, max_norm):
        for opt in optimizers:
            opt.zero_grad()
        for loss in _losses(model, batches):
            scaler.scale(loss).backward()
        for opt in optimizers:
            opt.zero_grad(set_to_none=set_to_none)
        _finish(optimizers, scaler, max_norm)

    report = L.check_loop(step)
    wrong = _wrong(report)
    assert set(wrong) == {"overflow", "accumulation", "two_optimizers", "clipping"}
    for r in wrong.values():
        assert "zeroed the gradients after backward and before scaler.step" in r.message, r.message
        assert "Make the loss depend" not in r.message and "zero_grad()" in r.message


# ---------------------------------------------------------------- 4. a gradient penalty


def penalty_step(unscale=True):
    """torch's AMP example of a gradient penalty (penalty × ‖∇loss‖²), unscaled by hand or not."""

    def train_step(model, optimizers, scaler, batches, max_norm, penalty=0.0):
        for opt in optimizers:
            opt.zero_grad()
        for loss in _losses(model, batches):
            if penalty:
                params = list(model.parameters())
                scaled = torch.autograd.grad(scaler.scale(loss), params, create_graph=True)
                inv = 1.0 / scaler.get_scale() if unscale else 1.0
                grads = [g * inv for g in scaled]
                with torch.autocast(**FP16):
                    loss = loss + penalty * sum(g.pow(2).sum() for g in grads)
            scaler.scale(loss).backward()
        _finish(optimizers, scaler, max_norm)

    return train_step


def test_a_right_gradient_penalty_passes():
    report = L.check_loop(penalty_step(), scenarios=["penalty", *L.SCENARIOS], save=L.save_checkpoint,
                          load=L.load_checkpoint)
    assert report.ok and all(r.message == "ok" for r in report.results), str(report)
    # the penalty changes the run: a step that leaves it out fails the penalty scenario
    r = L.check_loop(lambda *a, penalty=0.0: L.reference_step(*a), scenarios="penalty")["penalty"]
    assert r.status == "wrong" and "the weights differ" in r.message and "penalty" in r.message


def test_a_penalty_on_the_scaled_gradients_is_named():
    r = L.check_loop(penalty_step(unscale=False), scenarios=["penalty"])["penalty"]
    assert r.status == "wrong" and r.iteration == 0
    assert "1 / scaler.get_scale()" in r.message and "S² times too large" in r.message
    assert "zeroed the gradients" not in r.message


def test_the_penalty_scenario_needs_a_penalty_parameter():
    r = L.check_loop(lambda model, optimizers, scaler, batches, max_norm: None, scenarios=["penalty"])["penalty"]
    assert r.status == "not checked" and "takes no penalty parameter" in r.message
    assert L.check_loop(L.reference_step, scenarios=["penalty"]).ok  # reference_step takes penalty=


# ---------------------------------------------------------------- 5. a learning-rate scheduler


def scheduler_step(guard=True):
    def train_step(model, optimizers, scaler, batches, max_norm, schedulers=()):
        for opt in optimizers:
            opt.zero_grad()
        for loss in _losses(model, batches):
            scaler.scale(loss).backward()
        before = scaler.get_scale()
        _finish(optimizers, scaler, max_norm)
        if not guard or scaler.get_scale() >= before:  # the scale drops only when the step was skipped
            for scheduler in schedulers:
                scheduler.step()

    return train_step


def test_a_guarded_scheduler_passes_and_an_unguarded_one_is_named():
    report = L.check_loop(scheduler_step(), scenarios=["scheduler", *L.SCENARIOS], save=L.save_checkpoint,
                          load=L.load_checkpoint)
    assert report.ok and all(r.message == "ok" for r in report.results), str(report)
    r = L.check_loop(scheduler_step(guard=False), scenarios=["scheduler"])["scheduler"]
    skipped = 2  # the scenario's loss spike
    assert r.status == "wrong" and r.iteration == skipped
    assert f"iteration {skipped} stepped the scheduler although the optimizer step was skipped" in r.message
    # never stepping it is another mistake, named as such
    r = L.check_loop(lambda *a, schedulers=(): L.reference_step(*a), scenarios=["scheduler"])["scheduler"]
    assert r.status == "wrong" and r.iteration == 0 and "did not step the scheduler" in r.message
    # reference_step takes schedulers=; a step that takes none is not checked there
    assert L.check_loop(L.reference_step, scenarios=["scheduler"]).ok
    r = L.check_loop(lambda model, optimizers, scaler, batches, max_norm: None, scenarios=["scheduler"])
    assert r["scheduler"].status == "not checked" and "takes no schedulers parameter" in r["scheduler"].message


# ---------------------------------------------------------------- 6. rounding


def summed_losses(model, optimizers, scaler, batches, max_norm):
    for opt in optimizers:
        opt.zero_grad()
    with torch.autocast(**FP16):
        loss = sum(model(x, y) for x, y in batches) / len(batches)
    scaler.scale(loss).backward()
    _finish(optimizers, scaler, max_norm)


def test_summing_the_micro_batch_losses_passes_within_rounding():
    report = L.check_loop(summed_losses, save=L.save_checkpoint, load=L.load_checkpoint)
    assert report.ok, str(report)
    acc = report["accumulation"]
    assert acc.status == "ok" and acc.message.startswith("ok, within rounding: ") and "\n" not in acc.message
    assert "float16" in acc.message  # why its bits differ
    assert all(r.message == "ok" for r in report.results if r.name != "accumulation")
    assert report.verdict == "all 5 scenarios ok; within rounding, not bit for bit: accumulation"
    assert str(L.check_train_loop(summed_losses)).startswith("✓ correct")


def doubled_scale(model, optimizers, scaler, batches, max_norm):
    for opt in optimizers:
        opt.zero_grad()
    for loss in _losses(model, batches):
        (2 * scaler.scale(loss)).backward()
    _finish(optimizers, scaler, max_norm)


def missing_unscale(model, optimizers, scaler, batches, max_norm):
    for opt in optimizers:
        opt.zero_grad()
    for loss in _losses(model, batches):
        scaler.scale(loss).backward()
    for opt in optimizers:
        for p in _params(opt):
            p.grad.mul_(scaler.get_scale())  # step divides by the scale: the scaled gradients are applied
    _finish(optimizers, scaler, max_norm)


def nudged(rel):
    """The right step, then one bias moved by ``rel`` of itself."""
    def train_step(model, optimizers, scaler, batches, max_norm):
        L.reference_step(model, optimizers, scaler, batches, max_norm)
        with torch.no_grad():
            model.b.bias[0] *= 1 + rel
    return train_step


@pytest.mark.parametrize("step, factor", [(doubled_scale, "2"), (missing_unscale, "256"), (nudged(1e-3), None)],
                         ids=["doubled scale", "missing unscale", "nudged 1e-3"])
def test_a_wrong_loop_is_not_passed_as_rounding(step, factor):
    report = L.check_loop(step, scenarios=["overflow", "accumulation", "clipping"])
    wrong = _wrong(report)
    assert {"overflow", "accumulation"} <= set(wrong), str(report)
    for r in wrong.values():
        assert "the weights differ" in r.message and "rounding" not in r.message
        assert (f"they moved {factor} × as far as the reference's" in r.message) == (factor is not None), r.message
    if factor:  # where clipping is active it rescales any gradient to max_norm: only rounding tells them apart
        assert report["clipping"].message.startswith("ok, within rounding")


def full_step(model, optimizers, scaler, batches, max_norm, penalty=0.0, schedulers=()):
    """A right loop written otherwise: one backward of the losses summed under one autocast (when
    there is no penalty, which is per micro-batch), clipping every parameter at once when there is
    one optimizer, the penalty's squared norm from one concatenated vector."""
    for opt in optimizers:
        opt.zero_grad(set_to_none=False)
    if penalty:
        losses = list(_losses(model, batches))
    else:
        with torch.autocast(**FP16):
            losses = [sum(model(x, y) for x, y in batches) / len(batches)]
    for loss in losses:
        if penalty:
            params = list(model.parameters())
            grads = torch.autograd.grad(scaler.scale(loss), params, create_graph=True)
            flat = torch.cat([g.reshape(-1) for g in grads]) / scaler.get_scale()
            with torch.autocast(**FP16):
                loss = loss + penalty * flat.pow(2).sum()
        scaler.scale(loss).backward()
    if max_norm is not None and len(optimizers) == 1:
        scaler.unscale_(optimizers[0])
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, foreach=False)
        max_norm = None
    before = scaler.get_scale()
    _finish(optimizers, scaler, max_norm)
    if scaler.get_scale() >= before:
        for scheduler in schedulers:
            scheduler.step()


@st.composite
def any_scenario(draw):
    n, micro, optimizers = draw(st.integers(1, 6)), draw(st.integers(1, 3)), draw(st.integers(1, 2))
    spike = st.tuples(st.integers(0, n - 1), st.integers(0, micro - 1), st.sampled_from(["a", "b", "ab"]))
    resume = draw(st.one_of(st.none(), st.integers(1, n - 1))) if n > 1 else None
    return L.Scenario("drawn", "a drawn scenario", "-", iterations=n, micro_batches=micro, optimizers=optimizers,
                      spikes=tuple(draw(st.lists(spike, max_size=2))), offset=draw(st.floats(-1000, 1000)),
                      lr=draw(st.floats(0, 1)), init_scale=draw(st.sampled_from([2.0**-24, 3.0, 2.0**16, 2.0**24])),
                      growth_interval=draw(st.integers(1, 3)), max_norm=draw(st.one_of(st.none(), st.floats(1e-3, 10))),
                      resume_after=resume, penalty=draw(st.sampled_from([0.0, 0.1])),
                      scheduler=draw(st.booleans()) if optimizers == 1 and resume is None else False)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=any_scenario())
def test_a_right_loop_written_otherwise_passes_any_scenario(scenario):
    """Passed, bit for bit or within rounding, unless an overflow went otherwise: full_step's one
    float16 sum of the micro-batches' weight gradients (autocast's cached weight) overflows at
    half the scale their separate ones do, a real difference that the checker reports as such."""
    r = L.check_loop(full_step, scenarios=[scenario], save=L.save_checkpoint, load=L.load_checkpoint)["drawn"]
    overflowed_otherwise = scenario.micro_batches > 1 and "skipped where the reference stepped" in r.message
    assert r.status == "ok" or overflowed_otherwise, (scenario, r.message)


# ---------------------------------------------------------------- 7. global state and time


def grad_left_off(model, optimizers, scaler, batches, max_norm):
    L.reference_step(model, optimizers, scaler, batches, max_norm)
    torch.set_grad_enabled(False)


def autocast_left_on(model, optimizers, scaler, batches, max_norm):
    L.reference_step(model, optimizers, scaler, batches, max_norm)
    torch.autocast(**FP16).__enter__()


def test_a_step_that_leaves_grad_off_gets_a_verdict():
    report = L.check_loop(grad_left_off)
    assert torch.is_grad_enabled()
    assert set(_wrong(report)) == set(L.SCENARIOS) - {"resume"}
    r = report["overflow"]
    assert r.iteration == 0 and "torch.is_grad_enabled()" in r.message and "torch.no_grad()" in r.message


def test_a_step_that_leaves_autocast_on_gets_a_verdict_and_changes_nothing_else():
    report = L.check_loop(autocast_left_on, scenarios=["overflow"])
    assert not torch.is_autocast_enabled("cpu")
    r = report["overflow"]
    assert r.status == "wrong" and r.iteration == 0 and "autocast" in r.message
    assert L.check_loop(L.reference_step, scenarios=["overflow"]).ok  # the reference runs as before


def spins(model, optimizers, scaler, batches, max_norm):
    while True:
        pass


def sleeps(model, optimizers, scaler, batches, max_norm):
    time.sleep(60)


def swallows(model, optimizers, scaler, batches, max_norm):
    while True:
        try:
            time.sleep(0.01)
        except Exception:  # noqa: BLE001 - what a careless step does
            pass


@pytest.mark.parametrize("step", [spins, sleeps, swallows], ids=lambda f: f.__name__)
def test_a_step_that_never_returns_is_timed_out(step):
    start = time.monotonic()
    report = L.check_loop(step, timeout=0.3)
    assert time.monotonic() - start < 10
    first = report.results[0]
    assert first.status == "wrong" and first.iteration == 0
    assert first.message.startswith("iteration 0 did not return within 0.3 s") and "\n" not in first.message
    assert all(r.status == "not checked" for r in report.results[1:])
    # nothing is left behind: no alarm, the handler as it was
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL
    assert L.check_loop(L.reference_step, scenarios="overflow", timeout=5).ok


def test_a_timeout_off_the_main_thread():
    out = {}
    worker = threading.Thread(target=lambda: out.setdefault("r", L.check_loop(spins, scenarios="overflow",
                                                                              timeout=0.3)))
    worker.start()
    worker.join(30)
    assert not worker.is_alive()
    assert out["r"]["overflow"].message.startswith("iteration 0 did not return within 0.3 s")


@pytest.mark.parametrize("bad", [0, -1, math.nan, "10", True])
def test_timeout_must_be_a_positive_number(bad):
    with pytest.raises((ValueError, TypeError), match="^timeout must be") as e:
        L.check_loop(L.reference_step, timeout=bad)
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------- 8. a manual backoff


def manual_backoff(model, optimizers, scaler, batches, max_norm):
    for opt in optimizers:
        opt.zero_grad()
    for loss in _losses(model, batches):
        scaler.scale(loss).backward()
    overflow = False
    for opt in optimizers:
        scaler.unscale_(opt)
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(_params(opt), max_norm)
        overflow |= not all(torch.isfinite(p.grad).all() for p in _params(opt) if p.grad is not None)
        scaler.step(opt)
    if overflow:
        scaler.update(scaler.get_scale() / 2)
    else:
        scaler.update()


def test_a_manual_backoff_is_named():
    wrong = _wrong(L.check_loop(manual_backoff))
    assert "overflow" in wrong
    r = wrong["overflow"]
    assert "scaler.update(new_scale)" in r.message and "scaler.update() with no argument" in r.message


# ---------------------------------------------------------------- tables at the digits the lesson needs


def _as_another_cpu(report, pairs, rel):
    """``report`` with each measured value moved by ``rel`` (relative), as another CPU may measure
    it; a value S^k times another stays so (scaling by a power of two is exact on any CPU)."""
    moved = {}
    for name, (of, factor) in pairs.items():
        moved[name] = getattr(report, name) * (1 + rel) if of is None else moved[of] * factor
    return dataclasses.replace(report, **moved)


def test_the_penalty_table_prints_measured_values_at_4_digits():
    r = L.penalty_report(iterations=1)
    text = str(r.table)
    assert "2.879" in text and "3.019e+06" in text and "1.697" in text and "1737" in text
    assert "2^20" in text and "2^10" in text  # S² and S: exact by construction
    assert "1.69674" not in text and "1737.46" not in text
    pairs = {"penalty": (None, 1), "wrong_penalty": ("penalty", 2.0**20), "norm": (None, 1),
             "wrong_norm": ("norm", 2.0**10)}
    for rel in (MEASURED_REL / 2, -MEASURED_REL / 2):
        assert str(_as_another_cpu(r, pairs, rel).table) == text


def test_the_clipping_table_prints_measured_values_at_4_digits():
    r = L.clipping_report()
    text = str(r.table)
    assert "1.697" in text and "1737" in text and "1.6967" not in text and "0.9999" not in text
    pairs = {"norm": (None, 1), "seen_before_unscale": ("norm", 2.0**10), "applied_right": (None, 1),
             "applied_wrong": (None, 1)}
    for rel in (MEASURED_REL / 2, -MEASURED_REL / 2):
        assert str(_as_another_cpu(r, pairs, rel).table) == text
