"""ampviz.training.loopcheck: GradScaler in real loops (measured, right and wrong) and the loop checker.

Every fact the reports state is checked against the real ``torch.amp.GradScaler("cpu")`` (torch
2.13), with the exact messages of the project's GradScaler specification (section 11). The loop
checker must pass the reference, fail each classic mistake in exactly the scenarios where it
changes the weights, the scale or the skipped steps (and pass the others), with a message that
names the mistake; a one-ulp difference must be seen (passed as rounding, with a note); the runs
must give the same bits on one and two torch threads.
"""

import dataclasses
import inspect
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ampviz.training import gradscaler as G
from ampviz.training import loopcheck as L
from ampviz.training.loopcheck import checker as C

NO_INF_CHECKS = "No inf checks were recorded prior to update."
UNSCALE_TWICE = "unscale_() has already been called on this optimizer since the last update()."
EMPTY_STATE = ("The source state dict is empty, possibly because it was saved from a disabled instance "
               "of GradScaler.")
SCALE_NONE = ("Attempted {} but _scale is None.  This may indicate your script did not use "
              "scaler.scale(loss or outputs) earlier in the iteration.")
SCHEDULER_ORDER = (
    "Detected call of `lr_scheduler.step()` before `optimizer.step()`. In PyTorch 1.1.0 and later, "
    "you should call them in the opposite order: `optimizer.step()` before `lr_scheduler.step()`.  "
    "Failure to do this will result in PyTorch skipping the first value of the learning rate schedule. "
    "See more details at https://pytorch.org/docs/stable/optim.html#how-to-adjust-learning-rate")
ALL = set(L.SCENARIOS)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # steadier on a loaded machine; results do not depend on it


# ---------------------------------------------------------------- learners' loops, right and wrong


def _params(opt):
    return [p for g in opt.param_groups for p in g["params"]]


def make_step(*, zero="once", scaled=True, update="once", unscale="to clip", clip="after unscale_",
              via_scaler=True, autocast=True, divide=True):
    """A learner's train_step with one thing (or none) done wrong."""

    def train_step(model, optimizers, scaler, batches, max_norm):
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
            if unscale in ("twice", "always") or (unscale == "to clip" and (max_norm is not None or not via_scaler)):
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
        if zero == "after the step":
            for opt in optimizers:
                opt.zero_grad(set_to_none=False)

    return train_step


def save_all(model, optimizers, scaler):
    return {"model": model.state_dict(), "optimizers": [o.state_dict() for o in optimizers],
            "scaler": scaler.state_dict()}


def load_parts(*, model=True, optimizers=True, scaler=True):
    def load(checkpoint, m, opts, s):
        if model:
            m.load_state_dict(checkpoint["model"])
        if optimizers:
            for o, state in zip(opts, checkpoint["optimizers"]):
                o.load_state_dict(state)
        if scaler:
            s.load_state_dict(checkpoint["scaler"])
    return load


RIGHT = {"save": save_all, "load": load_parts()}

MISTAKES = [
    # (id, step, save/load, the scenarios it must fail, what each failing line must say)
    ("update() per micro-batch", make_step(update="each micro-batch"), RIGHT, {"accumulation"},
     ["AssertionError: " + NO_INF_CHECKS, "Call scaler.step(optimizer) (or unscale_) before scaler.update()",
      "With 2 micro-batches per step: accumulate"]),
    ("unscale_ per micro-batch", make_step(unscale="each micro-batch"), RIGHT, {"accumulation"},
     ["RuntimeError: " + UNSCALE_TWICE, "Unscale once"]),
    ("unscale_ twice per step", make_step(unscale="twice"), RIGHT, ALL, ["RuntimeError: " + UNSCALE_TWICE]),
    ("clipping before unscale_", make_step(clip="before unscale_"), RIGHT, {"clipping"},
     ["clip after scaler.unscale_(optimizer)"]),
    ("no update()", make_step(update="never"), RIGHT, ALL, ["update()"]),
    ("update() per optimizer", make_step(update="each optimizer"), RIGHT, {"two_optimizers"},
     ["called scaler.update() 2 times"]),
    ("loss.backward() without scale", make_step(scaled=False), RIGHT, ALL,
     ["_scale is None.  This may indicate", "Fix: Call scaler.scale(loss).backward()"]),
    ("resume without the scaler's state", make_step(),
     {"save": save_all, "load": load_parts(scaler=False)}, {"resume"},
     ["the scaler's state was not restored", "the scale is 1024", "saved at 256", "scaler.load_state_dict"]),
    ("resume without the model's state", make_step(), {"save": save_all, "load": load_parts(model=False)},
     {"resume"}, ["the weights are not those saved"]),
    ("resume without the optimizers' state", make_step(), {"save": save_all, "load": load_parts(optimizers=False)},
     {"resume"}, ["optimizer.state_dict()"]),
    ("zero_grad missing", make_step(zero="never"), RIGHT, ALL, ["started with the previous step's gradients"]),
    ("zero_grad per micro-batch", make_step(zero="each micro-batch"), RIGHT, {"accumulation"},
     ["zeroed the gradients between micro-batches"]),
    ("optimizer.step() directly", make_step(via_scaler=False), RIGHT,
     {"overflow", "accumulation", "two_optimizers", "resume"},
     ["calls optimizer.step() itself", "overflowed and it stepped anyway", "scaler.step(optimizer)"]),
    ("no autocast", make_step(autocast=False), RIGHT, ALL, ['torch.autocast("cpu", dtype=torch.float16)']),
    ("micro-batch losses not divided", make_step(divide=False), RIGHT, {"accumulation"},
     ["the weights differ", "loss / len(batches)"]),
]


# ---------------------------------------------------------------- part 1: the reports


def test_accumulation_report():
    rows = L.accumulation_report().outcomes
    right, spike, update_each, unscale_each = rows
    assert right.error == "" and right.stepped == (True,) and right.weights_changed == (True,)
    assert (right.scale_before, right.scale_after, right.updates) == (1024.0, 1024.0, 1)
    # an overflow in one micro-batch skips the whole step: weights unchanged, the scale halved once
    assert spike.error == "" and spike.stepped == (False,) and spike.weights_changed == (False,)
    assert (spike.scale_before, spike.scale_after, spike.updates) == (1024.0, 512.0, 1)
    assert update_each.error == "AssertionError: " + NO_INF_CHECKS
    assert unscale_each.error == "RuntimeError: " + UNSCALE_TWICE
    assert L.accumulation_report(micro_batches=4)[1].scale_after == 512.0
    text = str(L.accumulation_report())
    assert NO_INF_CHECKS in text and "1024 → 512" in text


def test_optimizers_report_only_the_overflowing_optimizer_skips():
    rep = L.optimizers_report()
    clean, spike, summed, update_each, grow, grow_each = rep.outcomes
    assert clean.stepped == (True, True) and clean.scale_after == 1024.0
    assert spike.stepped == (False, True) and spike.weights_changed == (False, True)
    assert (spike.scale_after, spike.updates) == (512.0, 1)  # found_inf per optimizer, one backoff
    assert summed.stepped == (False, True) and summed.note.endswith("True")
    assert update_each.updates == 2 and update_each.scale_after == 512.0
    assert update_each.note == "b's gradient × 2 of the right one"
    assert (grow.scale_after, grow_each.scale_after) == (2048.0, 4096.0)
    assert grow_each.note == "b's gradient × 0.5 of the right one"


def _b_grad(update_each: bool, spike: bool):
    """Part b's gradient after one iteration of two losses and two optimizers, done here by hand."""
    s = L._setup(0, optimizers=2, spikes=[(0, 0, "a")] if spike else ())
    (x, y), scaler = s.batches[0][0], s.scaler
    with torch.autocast("cpu", dtype=torch.float16):
        loss_a, loss_b = s.model.losses(x, y)
    scaler.scale(loss_a).backward()
    scaler.scale(loss_b).backward()
    for opt in s.optimizers:
        scaler.step(opt)
        if update_each:
            scaler.update()
    if not update_each:
        scaler.update()
    return torch.cat([p.grad.reshape(-1) for p in _params(s.optimizers[1])])


def test_update_per_optimizer_unscales_b_by_the_backed_off_scale():
    right, wrong = _b_grad(False, True), _b_grad(True, True)
    assert torch.equal(wrong, 2 * right)
    assert torch.equal(_b_grad(True, False), _b_grad(False, False))  # no overflow, no growth: no harm


def test_clipping_report():
    r = L.clipping_report()
    assert r.scale == 1024.0 and r.ratio == 1024.0 and r.seen_before_unscale == 1024.0 * r.norm
    assert r.norm > 1.0 >= r.applied_right * (1 - 1e-6)  # clipping was active
    assert r.applied_wrong == pytest.approx(1.0 / 1024, rel=1e-5)
    assert "1024 × too large" in str(r)
    # the same ratio on notebook 04's one-weight problem (gradscaler.clipping_norms)
    seen = G.clipping_norms(unscale_first=False, init_scale=1024.0)["clipped"]
    assert seen / G.clipping_norms(init_scale=1024.0)["clipped"] == 1024.0


def test_penalty_report():
    r = L.penalty_report()
    assert r.scale == 1024.0
    assert r.wrong_penalty / r.penalty == 2.0**20 and r.wrong_norm / r.norm == 2.0**10
    (right_name, right_scales, right_skipped), (_, wrong_scales, wrong_skipped) = r.runs
    assert not any(right_skipped) and set(right_scales) == {1024.0}
    assert all(wrong_skipped[:3]) and wrong_scales[-1] < 1024.0 / 8  # the scale collapses
    assert "2^20" in str(r.table)


def test_checkpoint_report():
    r = L.checkpoint_report()
    assert r.state_dict == {"scale": 256.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000,
                            "_growth_tracker": 12 - r.skipped_before}
    assert list(r.state_dict) == ["scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"]
    assert r.settled_scale == 256.0 and r.skipped_before == 8 == math.log2(65536 / 256)
    assert r.scale_is_none_after_load and r.get_scale_after_load == 256.0 and r.scale_after_first_scale == 256.0
    assert (r.skipped_with_state, r.same_with_state) == (0, True)
    assert (r.skipped_without_state, r.same_without_state) == (8, False) and r.burst == 8
    assert r.empty_state_error == "RuntimeError: " + EMPTY_STATE


def test_skipped_step_report():
    plain, guarded = L.skipped_step_report(), L.skipped_step_report(guard=True)
    for r in (plain, guarded):
        assert r.skipped_by_scale == r.skipped_really == (True,) * 8 + (False,) * 4
    assert [str(w) for w in plain.warnings] == ["UserWarning: " + SCHEDULER_ORDER]
    assert guarded.warnings == ()
    assert plain.lr_at_first_step == 1e-3 * 0.5**8 and guarded.lr_at_first_step == 1e-3
    assert plain.table.column("scale")[:9] == tuple(str(2**k) for k in range(16, 7, -1))


def test_reports_print_as_tables():
    for r in (L.accumulation_report(), L.clipping_report(), L.penalty_report(iterations=1), L.checkpoint_report(),
              L.skipped_step_report(iterations=1), L.check_loop(L.reference_step, scenarios=["clipping"])):
        assert "<table>" in r._repr_html_() and str(r).strip()


def test_load_checkpoint_refuses_a_checkpoint_that_does_not_fit():
    s = L._setup(0)
    checkpoint = L.save_checkpoint(s.model, s.optimizers, s.scaler)
    other = L._setup(0, optimizers=2)
    with pytest.raises(ValueError, match="^the checkpoint does not fit") as e:
        L.load_checkpoint(checkpoint, other.model, other.optimizers, other.scaler)
    assert "\n" not in str(e.value)
    with pytest.raises(TypeError, match="keys model, optimizers, scaler"):
        L.load_checkpoint({"model": {}}, s.model, s.optimizers, s.scaler)


def test_reports_leave_the_random_state_alone():
    state = torch.random.get_rng_state()
    L.accumulation_report(), L.penalty_report(iterations=1)
    L.check_loop(L.reference_step, scenarios=["overflow"])
    assert torch.equal(state, torch.random.get_rng_state())


# ---------------------------------------------------------------- part 2: the checker


def test_the_reference_passes_every_scenario():
    report = L.check_loop(L.reference_step, save=L.save_checkpoint, load=L.load_checkpoint)
    assert report.ok and report.verdict == "all 5 scenarios ok"
    assert [r.name for r in report.results] == list(L.SCENARIOS)
    assert all(r.status == "ok" and r.message == "ok" for r in report.results)
    # a learner's right loops, written differently: the same bits
    for step in (make_step(), make_step(unscale="always"), make_step(zero="after the step")):
        assert L.check_loop(step, **RIGHT).ok


@pytest.mark.parametrize("name, step, funcs, failing, says", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_each_mistake_fails_exactly_its_scenarios(name, step, funcs, failing, says):
    report = L.check_loop(step, **funcs)
    wrong = {r.name for r in report.results if r.status == "wrong"}
    assert wrong == failing, str(report)
    assert all(r.status == "ok" for r in report.results if r.name not in failing)
    for r in report.results:
        assert "\n" not in r.message
        if r.name in failing:
            assert all(s in r.message for s in says), r.message
    assert not report.ok and report.verdict.startswith(f"{len(failing)} of 5 scenarios wrong")


def test_the_scenarios_are_adversarial():
    """What each scenario does to the reference loop: the spike is skipped, the scale halved, one
    optimizer alone skips, the resumed scale had settled below the fresh one, clipping clips."""
    def trace(scenario):
        return C._run_scenario(L.reference_step, scenario, L.save_checkpoint, L.load_checkpoint)

    t = trace(L.SCENARIOS["accumulation"])
    assert [any(s) for s in t.skipped] == [False, False, True, False, False, False]
    assert t.scales[:4] == [256.0, 512.0, 256.0, 256.0]
    # the overflow lands one clean step after the scale grew: the growth tracker is 1, not 0
    t = trace(L.SCENARIOS["overflow"])
    assert [any(s) for s in t.skipped] == [False, False, False, True, False, False]
    assert t.scales == [256.0, 512.0, 512.0, 256.0, 256.0, 512.0]
    t = trace(L.SCENARIOS["two_optimizers"])
    assert t.skipped[2] == (True, False) and t.scales[2] == t.scales[1] / 2
    resume = L.SCENARIOS["resume"]
    t = trace(resume)
    assert t.scales[resume.resume_after - 1] == 256.0 < resume.init_scale
    assert sum(any(s) for s in t.skipped) >= 3
    clip = trace(L.SCENARIOS["clipping"])
    free = trace(dataclasses.replace(L.SCENARIOS["clipping"], max_norm=None))
    assert not any(torch.equal(a, b) for a, b in zip(clip.weights, free.weights))


def test_resuming_the_reference_is_bit_for_bit_the_run_that_never_stopped():
    resume = L.SCENARIOS["resume"]
    a = C._run_scenario(L.reference_step, resume, L.save_checkpoint, L.load_checkpoint)
    b = C._run_scenario(L.reference_step, dataclasses.replace(resume, resume_after=None), None, None)
    assert len(a.weights) == resume.iterations
    assert all(torch.equal(x, y) for x, y in zip(a.weights, b.weights))
    assert a.scales == b.scales and a.skipped == b.skipped


def test_one_ulp_is_seen_and_put_down_to_rounding():
    def nudged(model, optimizers, scaler, batches, max_norm):
        L.reference_step(model, optimizers, scaler, batches, max_norm)
        with torch.no_grad():
            w = model.b.bias
            w[0] = torch.nextafter(w[0], torch.tensor(math.inf))

    report = L.check_loop(nudged, scenarios="overflow")
    r = report["overflow"]  # seen, and put down to rounding: a float32 ulp per step is what rounding can do
    assert r.status == "ok" and r.message.startswith("ok, within rounding: not bit for bit")
    assert report.verdict == "all 1 scenarios ok; within rounding, not bit for bit: overflow"


def test_a_chosen_step_and_custom_scenarios():
    late = dataclasses.replace(L.SCENARIOS["overflow"], name="late", spikes=((4, 0, "ab"),))
    r = L.check_loop(make_step(via_scaler=False), scenarios=[late, "clipping"])
    assert r["late"].status == "wrong" and r["late"].iteration == 4 and "in iteration 4" in r["late"].message
    assert r["clipping"].status == "ok"
    assert L.check_loop(L.reference_step, scenarios=[late]).ok
    odd = dataclasses.replace(late, name="two\nlines")
    report = L.check_loop(L.reference_step, scenarios=[odd])
    assert report["two\nlines"].status == "ok"
    with pytest.raises(KeyError) as err:
        report["late"]
    message = err.value.args[0]
    assert "\n" not in message and "'two\\nlines'" in message


def test_resume_needs_save_and_load():
    report = L.check_loop(L.reference_step)
    assert report["resume"].status == "not checked" and not report.ok
    assert report.verdict == "every checked scenario ok; not checked: resume"


def test_errors_in_save_or_load_are_explained():
    def load(checkpoint, model, optimizers, scaler):
        load_parts(scaler=False)(checkpoint, model, optimizers, scaler)
        scaler.load_state_dict(checkpoint.get("grad_scaler", {}))

    r = L.check_loop(L.reference_step, save=save_all, load=load, scenarios=["resume"])["resume"]
    assert r.status == "wrong" and r.iteration == L.SCENARIOS["resume"].resume_after
    assert r.message.startswith(f"raised RuntimeError: {EMPTY_STATE} (in load(...)). Fix: ")
    r = L.check_loop(L.reference_step, save=lambda *a: (x for x in ()), load=load, scenarios=["resume"])["resume"]
    assert r.status == "wrong" and "(in save(...))" in r.message


def test_the_runs_are_the_same_on_one_and_two_threads():
    def run(n):
        old = torch.get_num_threads()
        torch.set_num_threads(n)
        try:
            traces = [C._run_scenario(L.reference_step, s, L.save_checkpoint, L.load_checkpoint)
                      for s in L.SCENARIOS.values()]
            texts = [str(L.optimizers_report()), str(L.clipping_report()), str(L.penalty_report(iterations=2))]
            return traces, texts, str(L.check_loop(make_step(update="each optimizer"), **RIGHT))
        finally:
            torch.set_num_threads(old)

    (ta, xa, ra), (tb, xb, rb) = run(1), run(2)
    for a, b in zip(ta, tb):
        assert all(torch.equal(x, y) for x, y in zip(a.weights, b.weights))
        assert a.scales == b.scales and a.skipped == b.skipped
    assert xa == xb and ra == rb


def test_check_train_loop():
    assert L.check_train_loop(None).status == "unanswered"
    right = L.check_train_loop((L.reference_step, L.save_checkpoint, L.load_checkpoint))
    assert right.status == "right" and str(right) == "✓ correct"
    alone = L.check_train_loop(make_step())
    assert alone.status == "right" and "resume not checked" in str(alone)
    wrong = L.check_train_loop((make_step(), save_all, load_parts(scaler=False)))
    assert wrong.status == "wrong"
    assert str(wrong).startswith("✗ not quite: resume: the scaler's state was not restored")
    wrong = L.check_train_loop(make_step(unscale="each micro-batch"))
    assert wrong.status == "wrong" and UNSCALE_TWICE in str(wrong)
    for bad in ("train_step", 3, (1, 2), [L.reference_step], lambda: None, lambda *a: 1 / 0):
        r = L.check_train_loop(bad)
        assert r.status == "wrong" and "\n" not in str(r)


@st.composite
def scenarios(draw):
    n, micro, optimizers = draw(st.integers(1, 6)), draw(st.integers(1, 3)), draw(st.integers(1, 2))
    spike = st.tuples(st.integers(0, n - 1), st.integers(0, micro - 1), st.sampled_from(["a", "b", "ab"]))
    spikes = draw(st.lists(spike, max_size=2))
    resume = draw(st.one_of(st.none(), st.integers(1, n - 1))) if n > 1 else None
    return L.Scenario("drawn", "a drawn scenario", "-", iterations=n, micro_batches=micro,
                      optimizers=optimizers, spikes=tuple(spikes), offset=draw(st.floats(-1000, 1000)),
                      lr=draw(st.floats(0, 1)), init_scale=draw(st.sampled_from([2.0**-24, 3.0, 2.0**16, 2.0**24])),
                      growth_interval=draw(st.integers(1, 3)),
                      max_norm=draw(st.one_of(st.none(), st.floats(1e-3, 10))), resume_after=resume,
                      penalty=draw(st.sampled_from([0.0, 0.1])),
                      scheduler=draw(st.booleans()) if optimizers == 1 and resume is None else False)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios(), mistake=st.sampled_from(MISTAKES))
def test_any_scenario_passes_the_reference_and_answers_a_mistake_in_one_line(scenario, mistake):
    assert L.check_loop(L.reference_step, save=L.save_checkpoint, load=L.load_checkpoint, scenarios=[scenario]).ok
    report = L.check_loop(mistake[1], scenarios=[scenario], **mistake[2])
    # the mistakes' steps take no penalty= or schedulers=: such a scenario is not checked for them
    extra = scenario.penalty or scenario.scheduler
    assert all(r.status in (("not checked",) if extra else ("ok", "wrong")) and "\n" not in r.message
               for r in report.results)


# ---------------------------------------------------------------- arbitrary arguments

SMALL = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 70), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8), st.sampled_from(list(L.SCENARIOS)), st.lists(st.integers(-2, 5), max_size=3),
    st.just(object()), st.just({"a": 1}), st.just(b"\x00"), st.just(torch.ones(2)), st.just(torch.tensor(0.5)),
    st.just(L.reference_step), st.just(lambda *a: None), st.just(lambda *a: 1 / 0),
    st.just(L.LoopNet()), st.just(torch.amp.GradScaler("cpu")),
)


def _answers_or_refuses(fn, args):
    try:
        fn(**args)
    except (ValueError, TypeError) as e:
        msg = str(e)
        assert msg.strip() and "\n" not in msg, f"{fn.__name__}{args!r}: {msg!r}"


PUBLIC = [getattr(L, n) for n in L.__all__
          if callable(getattr(L, n)) and n != "check_train_loop"
          and (inspect.isfunction(getattr(L, n)) or n in ("Scenario", "LoopNet"))]


@pytest.mark.parametrize("fn", PUBLIC, ids=lambda f: f.__name__)
def test_public_functions_answer_or_refuse_in_one_line(fn):
    params = [p for p in inspect.signature(fn).parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    required = {p.name: SMALL for p in params if p.default is p.empty}
    optional = {p.name: SMALL for p in params if p.default is not p.empty}

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(args=st.fixed_dictionaries(required, optional=optional))
    def run(args):
        _answers_or_refuses(fn, args)

    run()


@settings(max_examples=25, deadline=None)
@given(answer=st.one_of(SMALL, st.tuples(SMALL, SMALL, SMALL)))
def test_check_train_loop_takes_any_answer(answer):
    r = L.check_train_loop(answer)
    assert r.status in ("right", "wrong", "unanswered") and str(r).strip() and "\n" not in str(r)


# ---------------------------------------------------------------- the lesson's mistakes and questions

#: The scenarios each of the package's classic mistakes must fail (the same as MISTAKES above).
MISTAKEN_LOOPS = {
    "update() after every micro-batch": {"accumulation"},
    "unscale_ after every micro-batch": {"accumulation"},
    "micro-batch losses not divided": {"accumulation"},
    "zero_grad() before every micro-batch": {"accumulation"},
    "no zero_grad()": ALL,
    "update() after each optimizer": {"two_optimizers"},
    "no update()": ALL,
    "unscale_ twice": ALL,
    "clip before unscale_": {"clipping"},
    "loss.backward() without scale": ALL,
    "optimizer.step() instead of scaler.step": {"overflow", "accumulation", "two_optimizers", "resume"},
    "no autocast": ALL,
    "resume without the scaler's state": {"resume"},
    "resume without the model's state": {"resume"},
    "resume without the optimizers' state": {"resume"},
}


def test_every_mistaken_loop_fails_exactly_its_scenarios():
    assert list(L.MISTAKES) == list(MISTAKEN_LOOPS)
    for name, failing in MISTAKEN_LOOPS.items():
        loop = L.mistaken_loop(name)
        assert set(loop) == {"train_step", "save", "load"}
        report = L.check_loop(**loop)
        assert {r.name for r in report.results if r.status == "wrong"} == failing, (name, str(report))
        assert all(r.status == "ok" for r in report.results if r.name not in failing)


def test_a_mistaken_loop_says_what_the_tests_own_mistake_says():
    """The package's mistakes give, word for word, the lines of the test's independent copies."""
    pairs = {"update() after each optimizer": ("update() per optimizer", "two_optimizers"),
             "unscale_ after every micro-batch": ("unscale_ per micro-batch", "accumulation"),
             "resume without the scaler's state": ("resume without the scaler's state", "resume")}
    mine = {m[0]: m for m in MISTAKES}
    for name, (theirs, scenario) in pairs.items():
        _, step, funcs, _, _ = mine[theirs]
        a = L.check_loop(**L.mistaken_loop(name), scenarios=[scenario])[scenario]
        b = L.check_loop(step, scenarios=[scenario], **funcs)[scenario]
        assert a.message == b.message and a.scales == b.scales


def test_mistaken_loop_refuses_an_unknown_name():
    with pytest.raises(ValueError, match="^unknown mistake 'no scaler': use one of 'update"):
        L.mistaken_loop("no scaler")


def test_checkpoint_report_logs_the_scale_after_resuming():
    r = L.checkpoint_report()
    assert r.scales_with_state == (256.0,) * 12
    assert r.scales_without_state == tuple(2.0**k for k in range(15, 7, -1)) + (256.0,) * 4
    assert "32768 16384 8192 4096 2048 1024 512 256 256 256 256 256" in str(r.log_table)
    assert str(r).endswith(str(r.log_table))


def test_the_lessons_questions():
    # accumulation: two spikes in one step of 4 micro-batches halve the scale once
    assert L._accumulated_scale(4, (1, 3)) == 512.0 and L._accumulated_scale(4, ()) == 1024.0
    assert [str(L.check_accumulation_scale(a)) for a in (512, "2^9", 256)] == ["✓ correct"] * 2 + [
        "✗ not quite: count the update() calls in one step of the right loop, and what each one does"]
    # update() per optimizer: only the optimizers after an update are unscaled wrongly
    a_ratio, b_ratio = L._applied_ratios("b")
    assert a_ratio == 1.0 and math.isnan(b_ratio)
    assert L._applied_ratios("a")[1] == 2.0
    assert L.check_order_of_updates(1).status == "right" and L.check_order_of_updates(2).status == "wrong"
    # one scale for every optimizer: the scale test calls the iteration skipped although b stepped
    assert L.check_scale_test_with_two_optimizers("yes").status == "right"
    assert L.check_scale_test_with_two_optimizers(True).status == "right"
    assert L.check_scale_test_with_two_optimizers("no").status == "wrong"
    # resumed without the scaler's state: 8 of the next 12 skipped
    assert L.check_resume_burst(8).status == "right" and L.check_resume_burst(0).status == "wrong"
    for checker in (L.check_accumulation_scale, L.check_order_of_updates, L.check_scale_test_with_two_optimizers,
                    L.check_resume_burst):
        assert checker(None).status == "unanswered"
        for bad in ("", "eight", torch.ones(3), object(), 10**400, float("nan")):
            r = checker(bad)
            assert r.status == "wrong" and str(r).startswith("✗ not quite") and "\n" not in str(r)
