"""ampviz.training.gradscaler: the real torch.amp.GradScaler("cpu"), driven and reported.

The driver must equal ``simulate(TorchGradScaler(...))`` step for step (and a wrong simulator must
not); every error and warning must carry torch 2.13's exact text (the strings below are those of
the project's GradScaler specification, section 11); nothing may leak a warning.
"""

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ampviz.training import gradscaler as G
from ampviz.scaling import DynamicScaler, TorchGradScaler, simulate

SCALE_NONE = ("Attempted {} but _scale is None.  This may indicate your script did not use "
              "scaler.scale(loss or outputs) earlier in the iteration.")

EXPECTED_ERRORS = {
    "scaler.step(opt) after loss.backward(), with no scaler.scale() before it":
        ("AssertionError", SCALE_NONE.format("step")),
    "scaler.unscale_(opt) with no scaler.scale() before it":
        ("AssertionError", SCALE_NONE.format("unscale_")),
    "scaler.update() with no scaler.scale() before it":
        ("AssertionError", SCALE_NONE.format("update")),
    "scaler.unscale_(opt) twice in one iteration":
        ("RuntimeError", "unscale_() has already been called on this optimizer since the last update()."),
    "scaler.unscale_(opt) after scaler.step(opt)":
        ("RuntimeError", "unscale_() is being called after step()."),
    "scaler.step(opt) twice in one iteration":
        ("RuntimeError", "step() has already been called since the last update()."),
    "scaler.update() with neither scaler.unscale_(opt) nor scaler.step(opt) before it":
        ("AssertionError", "No inf checks were recorded prior to update."),
    "scaler.update() after scaler.unscale_(opt) alone, no step":
        ("no error", "unscale_'s inf check is enough for update(): the weights did not move (no step), "
                     "and update() counted a clean step (growth tracker 0 -> 1)"),
    "scaler.step(opt) when every .grad is None (no backward)":
        ("AssertionError", "No inf checks were recorded for this optimizer."),
    "scaler.unscale_(opt) on fp16 weights and gradients":
        ("ValueError", "Attempting to unscale FP16 gradients."),
    "scaler.step(opt, closure=...)":
        ("RuntimeError", "Closure use is not currently supported if GradScaler is enabled."),
    "scaler.scale(1.0), a Python float":
        ("ValueError", "outputs must be a Tensor or an iterable of Tensors"),
    'GradScaler("cpu", growth_factor=1.0)':
        ("AssertionError", "The growth factor must be > 1.0."),
    'GradScaler("cpu", backoff_factor=1.0)':
        ("AssertionError", "The backoff factor must be < 1.0."),
}

CUDA_DEPRECATED = ("`torch.cuda.amp.GradScaler(args...)` is deprecated. "
                   "Please use `torch.amp.GradScaler('cuda', args...)` instead.")
CPU_DEPRECATED = ("`torch.cpu.amp.GradScaler(args...)` is deprecated. "
                  "Please use `torch.amp.GradScaler('cpu', args...)` instead.")
DISABLING = "torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling."
SCHEDULER_ORDER = (
    "Detected call of `lr_scheduler.step()` before `optimizer.step()`. In PyTorch 1.1.0 and later, "
    "you should call them in the opposite order: `optimizer.step()` before `lr_scheduler.step()`.  "
    "Failure to do this will result in PyTorch skipping the first value of the learning rate schedule. "
    "See more details at https://pytorch.org/docs/stable/optim.html#how-to-adjust-learning-rate")


def torch_policy(**kw):
    return TorchGradScaler(**kw)


def assert_same(run, trace):
    bad = np.flatnonzero(run.scale.astype(np.float64) != trace.scale.astype(np.float64))
    assert bad.size == 0, f"scale differs first at step {bad[0]}: {run.scale[bad[0]]!r} vs {trace.scale[bad[0]]!r}"
    assert np.array_equal(run.skipped, trace.skipped)
    assert np.array_equal(run.growth_tracker, trace.growth_tracker)
    assert run.final_scale == trace.final.scale
    assert G.same_run(run, trace)


# ---------------------------------------------------------------- the tiny problem
def test_tiny_gradient_is_the_weight_and_steps_are_counted():
    tiny = G.build_tiny((3.0, -4.0), lr=0.5)
    tiny.loss().backward()
    assert tiny.weight.grad.tolist() == [3.0, -4.0]
    assert tiny.loss().item() == 12.5 and tiny.loss(half=True).dtype == torch.float16
    assert tiny.steps_taken == 0
    tiny.optimizer.step()
    assert tiny.steps_taken == 1 and tiny.weight.tolist() == [1.5, -2.0]


# ---------------------------------------------------------------- driver == simulator
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 400), p=st.sampled_from([0.0, 0.02, 0.2, 0.7]),
       init_scale=st.sampled_from([2.0**16, 1.0, 3e38, 2.0**-140, 0.1]),
       growth_factor=st.sampled_from([2.0, 1.5, 1.001]),
       backoff_factor=st.sampled_from([0.5, 0.9, 0.125]),
       growth_interval=st.sampled_from([1, 2, 3, 7, 50, 0]))
def test_driver_equals_simulate_on_random_streams(seed, n, p, init_scale, growth_factor, backoff_factor,
                                                  growth_interval):
    flags = np.random.default_rng(seed).random(n) < p
    kw = dict(init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
              growth_interval=growth_interval)
    assert_same(G.run_real_scaler(flags, **kw), simulate(torch_policy(**kw), found_inf=flags))


def test_driver_equals_simulate_on_a_long_stream():
    flags = np.random.default_rng(0).random(5000) < 0.01
    run = G.run_real_scaler(flags, growth_interval=50)
    assert_same(run, simulate(TorchGradScaler(growth_interval=50), found_inf=flags))
    assert np.array_equal(run.found_inf, flags) and run.skipped_count == int(flags.sum())


def test_default_growth_exactly_at_2000_and_4000():
    run = G.run_real_scaler(np.zeros(4001, bool))
    after = run.scale_after
    assert np.flatnonzero(after[1:] != after[:-1]).tolist() == [1998, 3998]
    assert after[1999] == 2.0**17 and after[3999] == 2.0**18 and after[4000] == 2.0**18
    assert run.growth_tracker[[1998, 1999, 2000, 3999, 4000]].tolist() == [1999, 0, 1, 0, 1]
    assert_same(run, simulate(TorchGradScaler(), found_inf=np.zeros(4001, bool)))


def test_166_backoffs_reach_exactly_zero_and_zero_stays():
    flags = np.r_[np.ones(166, bool), np.zeros(5, bool)]
    run = G.run_real_scaler(flags, growth_interval=2)
    after = run.scale_after
    assert after[164] == 2.0**-149 and after[165] == 0.0
    assert np.all(after[165:] == 0.0) and run.growth_tracker[-5:].tolist() == [1, 0, 1, 0, 1]
    assert not run.skipped[166:].any()  # at scale 0 the step still runs
    assert_same(run, simulate(TorchGradScaler(growth_interval=2), found_inf=flags))


ODD = dict(growth_factor=1.001, backoff_factor=0.9)


@pytest.mark.parametrize("kw, wrong", [
    (dict(ODD, growth_interval=3), DynamicScaler(growth_interval=3, arithmetic="float32", **ODD)),
    (dict(ODD, growth_interval=0), DynamicScaler(growth_interval=0, growth_at_least=True, **ODD)),
    (dict(ODD, growth_interval=3), DynamicScaler(growth_interval=3, tracker_after_overflow=-1, **ODD)),
    (dict(growth_interval=1, init_scale=2.0**120), DynamicScaler(growth_interval=1, init_scale=2.0**120,
                                                                 inf_guard=False)),
], ids=["float32 product", ">= instead of ==", "tracker -1 after overflow", "growth to inf allowed"])
def test_a_wrong_simulator_is_caught(kw, wrong):
    """The comparison can fail: plausible wrong variants differ from the real scaler."""
    flags = np.random.default_rng(1).random(300) < 0.02
    run = G.run_real_scaler(flags, **kw)
    assert G.same_run(run, simulate(TorchGradScaler(**kw), found_inf=flags))
    assert not G.same_run(run, simulate(wrong, found_inf=flags))


def test_same_run_compares_every_array():
    flags = G.found_inf_from("..x....")
    run = G.run_real_scaler(flags, growth_interval=2)
    trace = simulate(TorchGradScaler(growth_interval=2), found_inf=flags)
    assert G.same_run(run, trace)
    assert not G.same_run(run, simulate(TorchGradScaler(growth_interval=3), found_inf=flags))
    assert not G.same_run(run, simulate(TorchGradScaler(growth_interval=2), found_inf=flags[:-1]))
    assert not G.same_run(run, simulate(TorchGradScaler(growth_interval=2, init_scale=2.0**15), found_inf=flags))


def test_driver_validates_its_stream():
    with pytest.raises(ValueError, match="1-D"):
        G.run_real_scaler(np.zeros((2, 2), bool))
    with pytest.raises(TypeError, match="booleans"):
        G.run_real_scaler([0.5, 1.0])
    empty = G.run_real_scaler([])
    assert empty.steps == 0 and empty.final_scale == 65536.0


def test_found_inf_from():
    assert G.found_inf_from("..x x.").tolist() == [False, False, True, True, False]
    with pytest.raises(ValueError, match="'o'"):
        G.found_inf_from("..o")


def test_step_table_is_the_same_for_the_real_run_and_the_trace():
    flags = G.found_inf_from("...x....x...")
    run = G.run_real_scaler(flags, growth_interval=3)
    trace = simulate(TorchGradScaler(growth_interval=3), found_inf=flags)
    table = G.step_table(run, steps=range(12))
    assert str(table) == str(G.step_table(trace, steps=range(12)))
    assert table.column("update()") == ("count", "count", "grow", "back off", "count", "count", "grow",
                                        "count", "back off", "count", "count", "grow")
    assert table.column("tracker after") == tuple("120012010120")
    assert table.column("scale after")[2] == "2^17" and table.column("optimizer.step()")[3] == "skipped"
    assert len(G.step_table(run).rows) == 12
    with pytest.raises(IndexError):
        G.step_table(run, steps=[12])


# ---------------------------------------------------------------- one iteration
def test_walk_iteration_clean():
    walk = G.walk_iteration()
    assert [s.key for s in walk.snapshots] == ["GradScaler", "scale", "backward", "unscale_", "step", "update"]
    assert walk["GradScaler"].scale is None and walk["GradScaler"].tracker is None
    assert (walk["scale"].scale, walk["scale"].scale_dtype) == (65536.0, "torch.float32")
    assert (walk["scale"].tracker, walk["scale"].tracker_dtype) == (0, "torch.int32")
    assert walk["scale"].grad is None
    assert walk["backward"].grad.tolist() == [3.0 * 65536, -4.0 * 65536]  # S·g, exactly
    assert walk["unscale_"].grad.tolist() == [3.0, -4.0] and walk["unscale_"].found_inf == {"cpu": 0.0}
    assert [s.stage for s in walk.snapshots] == ["READY", "READY", "READY", "UNSCALED", "STEPPED", "READY"]
    assert walk["step"].weight.tolist() == pytest.approx([2.7, -3.6]) and "returned None" in walk["step"].note
    assert (walk["update"].scale, walk["update"].tracker, walk["update"].found_inf) == (65536.0, 1, {})
    text = str(walk)
    assert "12.5 × 65536 = 819200" in text and "[196608, -262144]" in text
    assert "<table>" in walk._repr_html_()
    with pytest.raises(KeyError) as err:
        walk["zero_grad\nx"]
    message = err.value.args[0]
    assert "\n" not in message and "'zero_grad\\nx'" in message and "'step'" in message


def test_walk_iteration_overflow_and_growth():
    walk = G.walk_iteration(overflow=True)
    assert math.isinf(walk["backward"].grad[0]) and walk["unscale_"].found_inf == {"cpu": 1.0}
    assert walk["step"].weight.tolist() == [3.0, -4.0] and "skipped" in walk["step"].note
    assert (walk["update"].scale, walk["update"].tracker) == (32768.0, 0)
    grown = G.walk_iteration(growth_interval=1)
    assert (grown["update"].scale, grown["update"].tracker) == (2.0**17, 0)
    assert "tracker reached growth_interval" in grown["update"].note


def test_step_skips_and_update_backs_off():
    """On an inf gradient, scaler.step() skips optimizer.step() and leaves the scale as it is; only
    update() multiplies it by backoff_factor (notebook 02, section 6)."""
    walk = G.walk_iteration(overflow=True)
    assert walk["unscale_"].found_inf == {"cpu": 1.0}
    assert walk["step"].weight.tolist() == [3.0, -4.0] and "skipped" in walk["step"].note
    assert [walk[c].scale for c in ("scale", "backward", "unscale_", "step")] == [65536.0] * 4
    assert (walk["update"].scale, walk["update"].tracker) == (32768.0, 0)
    quartered = G.walk_iteration(overflow=True, backoff_factor=0.25)
    assert (quartered["step"].scale, quartered["update"].scale) == (65536.0, 16384.0)


def test_unscale_overflow_is_not_detected():
    table = G.unscale_overflow_table()
    values = dict(table.rows)
    assert values["found_inf recorded by unscale_"] == "0"
    assert values["w.grad after unscale_ (× 1/S)"] == "[inf, 1024]"
    assert values["optimizer.step()"] == "ran" and values["w after the step"].startswith("[-inf")


# ---------------------------------------------------------------- errors
def test_every_error_case_has_its_exact_message():
    cases = G.error_cases()
    assert [c.case for c in cases] == list(EXPECTED_ERRORS)
    for c in cases:
        assert (c.error, c.message) == EXPECTED_ERRORS[c.case], c.case
    assert "None.  This may" in cases[0].message  # two spaces
    assert str(cases[0]).splitlines()[1] == "    AssertionError: " + SCALE_NONE.format("step")


def test_a_case_that_stops_raising_is_reported(monkeypatch):
    from ampviz.training.gradscaler import errors as gradscaler_errors  # error_cases reads _CASES there

    monkeypatch.setattr(gradscaler_errors, "_CASES", (("harmless", lambda: None), *G._CASES[:1]))
    cases = G.error_cases()
    assert cases[0] == G.ErrorCase("harmless", "no error", "")
    assert cases[1].error == "AssertionError"


# ---------------------------------------------------------------- clipping
def test_clipping_after_unscale_clips_the_true_gradients():
    right = G.clipping_norms(unscale_first=True)
    wrong = G.clipping_norms(unscale_first=False)
    assert right["backward"] == wrong["backward"] == 5.0 * 65536
    assert right["clipped"] == 5.0 and wrong["clipped"] == 5.0 * 65536
    assert right["applied"] == pytest.approx(1.0, rel=1e-6)
    assert wrong["applied"] == pytest.approx(2.0**-16, rel=1e-6)
    assert right["weight"].tolist() == pytest.approx([3 - 0.1 * 0.6, -4 + 0.1 * 0.8], rel=1e-6)
    table = G.clipping_table()
    assert table.column("‖grad‖ the optimizer applied")[1] == "2^-16"


# ---------------------------------------------------------------- detecting a skipped step
def test_step_returns_none_whether_or_not_the_step_was_skipped():
    run = G.run_real_scaler([True, False, False])
    assert run.skipped.tolist() == [True, False, False]
    assert run.returned == (None, None, None)
    table = G.skip_detection_table([True, False])
    assert table.column("`if scaler.step(opt):` says") == ("skipped", "skipped")  # wrong for step 1
    assert table.column("optimizer.step() really") == ("skipped", "ran")
    assert table.column("`get_scale() < before` says") == ("skipped", "taken")  # right


# ---------------------------------------------------------------- warnings
def test_constructor_warnings_exact_texts():
    reports = {r.call: r for r in G.constructor_warnings()}
    assert not torch.cuda.is_available()  # the pinned CPU build: the disabling warning is expected
    cuda = reports["torch.cuda.amp.GradScaler()"]
    assert cuda.warnings == (G.Caught("FutureWarning", CUDA_DEPRECATED), G.Caught("UserWarning", DISABLING))
    assert not cuda.enabled and cuda.scale_is_identity and cuda.get_scale == 1.0
    cpu = reports["torch.cpu.amp.GradScaler()"]
    assert cpu.warnings == (G.Caught("FutureWarning", CPU_DEPRECATED),) and cpu.enabled
    default = reports["torch.amp.GradScaler()"]
    assert default.warnings == (G.Caught("UserWarning", DISABLING),) and not default.enabled
    explicit = reports['torch.amp.GradScaler("cpu")']
    assert explicit.warnings == () and explicit.enabled and explicit.get_scale == 65536.0
    assert "(no warning)" in str(explicit) and "  Disabling." in str(default)


def test_scheduler_warning_after_a_skipped_first_step():
    report = G.scheduler_report()
    assert report.warnings == (G.Caught("UserWarning", SCHEDULER_ORDER),)
    assert report.table.column("optimizer.step()") == ("skipped", "skipped", "skipped", "ran", "ran")
    assert report.table.column("lr of this step")[:4] == ("0.1", "0.05", "0.025", "0.0125")
    guarded = G.scheduler_report(guard=True)
    assert guarded.warnings == ()
    assert guarded.table.column("lr of this step")[:4] == ("0.1",) * 4
    assert guarded.table.column("scheduler.step()")[:4] == ("not called",) * 3 + ("called",)


def test_no_warning_leaks():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        G.constructor_warnings()
        G.scheduler_report()
        G.error_cases()
        G.walk_iteration()
    assert caught == []


# ---------------------------------------------------------------- checkers
@pytest.mark.parametrize("checker, right, wrong", [
    (G.check_scale_after_pattern, 65536, 32768),
    (G.check_backoffs_to_zero, 166, 165),
    (G.check_skip_test, "b", "a"),
    (G.check_clip_before_unscale, 2.0**-16, 1.0),
])
def test_checkers(checker, right, wrong):
    assert checker(right).status == "right" and str(checker(right)) == "✓ correct"
    assert checker(wrong).status == "wrong" and str(checker(wrong)).startswith("✗ not quite")
    assert checker(None).status == "unanswered"


# ---------------------------------------------------------------- notebook 04's exercises
def test_scale_after_pattern_is_the_real_scalers():
    from ampviz.training.gradscaler import check_scale_after_pattern

    real = G.run_real_scaler(G.found_inf_from("..x...."), growth_interval=3)
    assert real.scale_after[-1] == 65536.0
    assert check_scale_after_pattern(65536) and check_scale_after_pattern("2^16") and check_scale_after_pattern(2.0**16)
    for wrong in (32768, 131072, "x", True):
        assert check_scale_after_pattern(wrong).status == "wrong"
    assert check_scale_after_pattern(None).status == "unanswered"


def test_clip_before_unscale_takes_other_settings():
    from ampviz.training.gradscaler import check_clip_before_unscale

    assert G.clipping_norms(unscale_first=False, max_norm=5.0, init_scale=2.0**10)["applied"] == pytest.approx(5 / 2**10)
    assert check_clip_before_unscale(5 / 2**10, max_norm=5.0, init_scale=2.0**10)
    assert check_clip_before_unscale("0.00488", max_norm=5.0, init_scale=2.0**10)
    assert check_clip_before_unscale(5, max_norm=5.0, init_scale=2.0**10).status == "wrong"
    assert check_clip_before_unscale(2**-16) and check_clip_before_unscale(1).status == "wrong"


def _steps():
    import torch.nn.functional as F

    def body(m, o, s, x, y, *, autocast=torch.float16, zero=True, scaled=True, via_scaler=True, update=1):
        if zero:
            o.zero_grad()
        with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
            loss = F.mse_loss(m(x), y)
        (s.scale(loss) if scaled else loss).backward()
        if via_scaler:
            s.step(o)
        else:
            s.unscale_(o)
            o.step()
        for _ in range(update):
            s.update()

    return body


@pytest.mark.parametrize("variant, verdict", [
    ({}, "✓ correct"),
    ({"autocast": None}, "did not run under torch.autocast"),
    ({"autocast": torch.bfloat16}, "did not run under torch.autocast"),
    ({"scaled": False}, "_scale is None"),
    ({"via_scaler": False}, "step through the scaler, scaler.step(optimizer)"),
    ({"zero": False}, "optimizer.zero_grad()"),
    ({"update": 0}, "step() has already been called since the last update()"),
    ({"update": 2}, "No inf checks were recorded prior to update"),
])
def test_the_loop_checker_names_what_a_step_gets_wrong(variant, verdict):
    from ampviz.training.gradscaler import check_amp_loop

    body = _steps()
    result = check_amp_loop(lambda m, o, s, x, y: body(m, o, s, x, y, **variant))
    assert verdict in str(result) and "\n" not in str(result)
    assert (result.status == "right") == (variant == {})


def test_the_loop_checker_takes_any_answer():
    from ampviz.training.gradscaler import amp_step_reference, check_amp_loop

    assert check_amp_loop(amp_step_reference)
    assert check_amp_loop(None).status == "unanswered"
    for bad in ("train_step", 3, [], lambda: None, lambda *a: 1 / 0):
        r = check_amp_loop(bad)
        assert r.status == "wrong" and "\n" not in str(r)
