"""Pitfall 1 on the pinned stack: loss.backward() instead of self.manual_backward(loss) under fp16 AMP."""

import pytest

pytest.importorskip("lightning")
torch = pytest.importorskip("torch")

from ampviz.pitfalls import manual_backward as mb  # noqa: E402

MESSAGE = ("Attempted unscale_ but _scale is None.  This may indicate your script did not use "
           "scaler.scale(loss or outputs) earlier in the iteration.")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def fp32():
    return mb.fp32_reference()


def test_fp32_reference_runs(fp32):
    assert not fp32.failed and fp32.details["precision"] == "32-true"
    assert len(fp32.grad_norms["per_iteration"]) == mb.ITERATIONS
    assert all(n > 0 for n in fp32.grad_norms["per_iteration"])


def test_cpu_16_mixed_becomes_bf16_without_scaler():
    out = mb.cpu_16_mixed()
    assert not out.failed  # the buggy loss.backward() runs silently
    assert out.details["precision"] == "bf16-mixed"
    assert out.details["plugin"] == "MixedPrecision" and out.details["scaler"] is None
    assert out.details["autocast_dtype"] == "torch.bfloat16"
    assert out.details["warnings"] == [
        "UserWarning: You passed `Trainer(accelerator='cpu', precision='16-mixed')` but AMP with fp16 is not "
        "supported on CPU. Using `precision='bf16-mixed'` instead."]
    assert out.details["max_rel_diff_vs_fp32"] < 0.05  # bf16 rounding only: no scaler, nothing divided


def test_fp16_loss_backward_raises_at_first_step():
    out = mb.fp16_loss_backward()
    assert out.error_type == "AssertionError" and out.message == MESSAGE
    assert "None.  This" in out.message  # two spaces
    assert out.details["precision"] == "16-mixed"
    assert type(out.details["scaler"]).__name__ == "GradScaler"
    assert out.details["autocast_dtype"] == "torch.float16"
    assert out.details["iterations"] == 0 and out.details["trace"] == [
        (0, "training_step starts", None), (0, "after loss.backward()", None)]
    assert out.details["error_chain"] == [
        "lightning/pytorch/core/optimizer.py LightningOptimizer.step",
        "lightning/pytorch/strategies/strategy.py Strategy.optimizer_step",
        "lightning/pytorch/plugins/precision/amp.py MixedPrecision.optimizer_step",
        "torch/amp/grad_scaler.py GradScaler.unscale_",
        "torch/amp/grad_scaler.py GradScaler._check_scale_growth_tracker"]
    assert out.details["scale_calls"] == []  # scaler.scale() never ran


def test_late_loss_backward_is_silently_divided_by_the_scale(fp32):
    out = mb.fp16_late_loss_backward()
    assert not out.failed
    assert out.scale == [65536.0] * mb.ITERATIONS
    ratio = out.details["ratio_vs_fp32"]
    assert abs(ratio[0] - 1) < 0.01  # iteration 0 used manual_backward
    assert out.details["ratio_times_scale"] == pytest.approx(1.0, rel=0.01)  # iteration 1: ≈ 1/65536
    assert all(r < 1e-4 for r in ratio[1:])
    assert len(out.details["scale_calls"]) == 1  # only the first iteration scaled its loss


def test_manual_backward_matches_fp32(fp32):
    out = mb.fp16_manual_backward()
    assert not out.failed and out.details["precision"] == "16-mixed"
    assert out.grad_norms["fp32"] == fp32.grad_norms["per_iteration"]
    assert max(abs(r) for r in out.details["rel_diff_vs_fp32"]) < 5e-3
    assert out.scale == [65536.0] * mb.ITERATIONS
    assert out.details["scale_calls"][0] == [
        "lightning/pytorch/core/module.py LightningModule.manual_backward",
        "lightning/pytorch/strategies/strategy.py Strategy.backward",
        "lightning/pytorch/plugins/precision/amp.py MixedPrecision.pre_backward"]
    assert out.details["trace"][:2] == [(0, "training_step starts", None),
                                        (0, "after self.manual_backward(loss)", 65536.0)]


# ------------------------------------------------------------------------------------------------
# update() once per optimizer (section 7)
# ------------------------------------------------------------------------------------------------


def _steps(out, iteration):
    return [s for s in out.details["steps"] if s["iteration"] == iteration]


def test_loss_spike_overflows_every_optimizer_and_halves_once_per_optimizer():
    out = mb.several_optimizers(optimizers=3, spike_at=1, iterations=3)
    assert not out.failed
    assert out.scale == [65536.0] * 3 + [32768.0, 16384.0, 8192.0] + [8192.0] * 3
    assert [s["skipped"] for s in _steps(out, 1)] == [True, True, True]  # each found inf in its own grads
    assert [s["unscaled_by"] for s in _steps(out, 1)] == [65536.0, 32768.0, 16384.0]
    assert all(s["factor"] == 1.0 for i in (0, 2) for s in _steps(out, i))
    assert out.details["global_step"] == 9 and out.details["iterations"] == 3  # max_steps counts opt steps
    table = mb.steps_table(out)
    assert table.column("scale after")[5] == "8192" and table.column("step")[3:6] == ("skipped (inf)",) * 3


def test_one_optimizer_overflow_halves_once():
    out = mb.several_optimizers(optimizers=1, spike_at=1, iterations=3)
    assert out.scale == [65536.0, 32768.0, 32768.0]


@pytest.fixture(scope="module")
def partial():
    return mb.partial_overflow(optimizers=2, overflow_in=(1,), spike_at=1, iterations=2)


def test_only_optimizer_1_overflows_optimizer_2_applies_twice_its_gradient(partial):
    assert not partial.failed and partial.details["precision"] == "16-mixed"
    it1 = _steps(partial, 1)
    assert [s["skipped"] for s in it1] == [True, False]
    assert [s["scaled_by"] for s in it1] == [65536.0, 65536.0]
    assert [s["unscaled_by"] for s in it1] == [65536.0, 32768.0]  # opt1's update() ran in between
    assert mb.applied_factor(partial, 1, 2) == 2.0  # exactly
    assert mb.applied_factor(partial, 1, 1) is None  # skipped
    assert mb.applied_factor(partial, 0, 1) == mb.applied_factor(partial, 0, 2) == 1.0
    assert partial.scale == [65536.0, 65536.0, 32768.0, 32768.0]  # halved once: one optimizer found inf
    assert partial.name == "Lightning, 2 optimizers, only optimizer 1 overflows in iteration 1"


def test_the_factor_two_holds_against_fp32_too(partial):
    """The same two optimizers in fp32: optimizer 2's applied gradient in iteration 1 is twice fp32's
    (to fp16 rounding; iteration 0 was clean, so the weights still match)."""
    fp32 = mb.run_manual(optimizers=2, iterations=2)
    by_step = {(s["iteration"], s["optimizer"]): s["applied_norm"] for s in fp32.details["steps"]}
    ratio = {(s["iteration"], s["optimizer"]): s["applied_norm"] / by_step[s["iteration"], s["optimizer"]]
             for s in partial.details["steps"]}
    assert ratio[1, 2] == pytest.approx(2.0, rel=0.01)
    assert ratio[0, 1] == pytest.approx(1.0, rel=0.01) and ratio[0, 2] == pytest.approx(1.0, rel=0.01)


def test_three_optimizers_only_the_second_overflows():
    """The transfer exercise: optimizer 1 stepped before the overflow (factor 1), optimizer 3 after it (2)."""
    out = mb.partial_overflow(optimizers=3, overflow_in=(2,))
    assert [mb.applied_factor(out, 1, k) for k in (1, 2, 3)] == [1.0, None, 2.0]
    assert out.scale[3:] == [65536.0, 32768.0, 32768.0]
    assert mb.check_third_optimizer_factor(mb.applied_factor(out, 1, 3))


def test_every_optimizer_after_an_overflowing_one_gets_the_factor_and_it_does_not_compound():
    out = mb.partial_overflow(optimizers=3, overflow_in=(1,))
    assert [mb.applied_factor(out, 1, k) for k in (1, 2, 3)] == [None, 2.0, 2.0]  # not 4: opt2's update saw no inf
    assert out.scale[-1] == 32768.0


@pytest.mark.parametrize("overflow_in, factors, scale", [
    ((1, 2), [None, None, 4.0], 16384.0),  # two overflowing optimizers before optimizer 3: ×4
    ((1, 3), [None, 2.0, None], 16384.0),  # the scale falls by 2^k for k overflowing optimizers
    ((3,), [1.0, 1.0, None], 32768.0),     # the last one overflowing harms nobody
])
def test_scale_falls_by_two_to_the_number_of_overflowing_optimizers(overflow_in, factors, scale):
    out = mb.partial_overflow(optimizers=3, overflow_in=overflow_in)
    assert [mb.applied_factor(out, 1, k) for k in (1, 2, 3)] == factors
    assert out.scale[-1] == scale
    assert out.name.endswith(("only optimizers 1 and 2 overflow in iteration 1",
                              "only optimizers 1 and 3 overflow in iteration 1",
                              "only optimizer 3 overflows in iteration 1"))


def test_torch_recipe_one_update_per_iteration_gets_every_gradient_right():
    out = mb.torch_recipe(optimizers=2, overflow_in=(1,), spike_at=1, iterations=2)
    assert not out.failed
    it1 = _steps(out, 1)
    assert [s["unscaled_by"] for s in it1] == [65536.0, 65536.0]  # both divide by the same scale
    assert [mb.applied_factor(out, 1, k) for k in (1, 2)] == [None, 1.0]
    assert out.scale == [65536.0, 65536.0, 65536.0, 32768.0]  # one update(), one halving
    assert [s["call"] for s in it1] == ["scaler.step(opt1)", "scaler.step(opt2); scaler.update()"]


def test_torch_recipe_with_a_loss_spike_halves_once():
    out = mb.torch_recipe(optimizers=3, overflow_in=None, spike_at=1, iterations=2)
    assert [s["skipped"] for s in _steps(out, 1)] == [True, True, True]
    assert out.scale[-1] == 32768.0  # one update(), one halving, however many optimizers found inf
    assert out.name.endswith("3 optimizers, loss spike in iteration 1")


def test_torch_loop_with_an_update_after_every_step_reproduces_lightnings_factor():
    """The plausible wrong recipe: update() after every step, as Lightning's plugin does. It is the
    per-step update, not anything else in Lightning, that gives optimizer 2 the factor 2."""
    out = mb.torch_recipe(optimizers=2, overflow_in=(1,), spike_at=1, iterations=2, update_every_step=True)
    assert [mb.applied_factor(out, 1, k) for k in (1, 2)] == [None, 2.0]
    assert out.scale == [65536.0, 65536.0, 32768.0, 32768.0]


def test_torch_recipe_trains_the_same_model_as_lightning():
    """Without an overflow the plain loop and the Trainer compute the same gradients: same weights, data, autocast."""
    lightning_run = mb.run_manual(fp16=True, optimizers=2, iterations=3)
    plain = mb.torch_recipe(optimizers=2, overflow_in=None, spike_at=None, iterations=3)
    assert plain.grad_norms["per_iteration"] == pytest.approx(lightning_run.grad_norms["per_iteration"], rel=1e-6)
    assert plain.name == "PyTorch recipe (one scaler.update() per iteration), 2 optimizers"


def test_gan_pattern_each_backward_is_scaled_with_the_current_scale():
    """Open exercise 4: a forward pass, a manual_backward and a step per optimizer. Optimizer 2's
    loss is scaled after optimizer 1's update(), with the scale it is then unscaled by: factor 1."""
    out = mb.partial_overflow(optimizers=2, overflow_in=(1,), backward="manual_backward per optimizer")
    it1 = _steps(out, 1)
    assert [s["scaled_by"] for s in it1] == [65536.0, 32768.0]
    assert [s["unscaled_by"] for s in it1] == [65536.0, 32768.0]
    assert [mb.applied_factor(out, 1, k) for k in (1, 2)] == [None, 1.0]
    assert out.scale[-1] == 32768.0
    assert len(out.details["scale_calls"]) == 4  # one scaler.scale() per optimizer and iteration


def test_growth_is_the_mirror_image():
    """Open exercise 2: growth_interval=1, two optimizers, no overflow. Optimizer 1's update() doubles
    the scale, optimizer 2 divides by twice the scale it was multiplied by: it applies half its
    gradient. The tracker counts optimizer steps: the scale grows twice per iteration."""
    out = mb.run_manual(fp16=True, optimizers=2, growth_interval=1, iterations=2)
    assert [s["factor"] for s in out.details["steps"]] == [1.0, 0.5, 1.0, 0.5]
    assert out.scale == [2.0**17, 2.0**18, 2.0**19, 2.0**20]


def test_growth_phase_decides_who_is_hurt():
    """growth_interval=2: with two optimizers the scale grows in optimizer 2's update() (harmless);
    an overflow of optimizer 1 alone resets the tracker in its update(), and from then on growth
    lands in optimizer 1's update() and optimizer 2 applies half its gradient. With three
    optimizers the second update is optimizer 2's, so optimizer 3 is hurt at once."""
    clean = mb.run_manual(fp16=True, optimizers=2, growth_interval=2, iterations=3)
    assert [s["factor"] for s in clean.details["steps"]] == [1.0] * 6
    assert clean.scale == [65536.0, 131072.0, 131072.0, 262144.0, 262144.0, 524288.0]
    shifted = mb.run_manual(fp16=True, optimizers=2, growth_interval=2, spike_at=0, overflow_in=(1,), iterations=3)
    assert [mb.applied_factor(shifted, i, 2) for i in range(3)] == [2.0, 0.5, 0.5]
    three = mb.run_manual(fp16=True, optimizers=3, growth_interval=2, iterations=1)
    assert [s["factor"] for s in three.details["steps"]] == [1.0, 1.0, 0.5]


def test_default_growth_interval_lands_mid_iteration_with_three_optimizers():
    """Open exercise 2 with the default growth_interval=2000, on torch's own GradScaler with
    Lightning's order (an update() after every step) and three optimizers: 2000 = 666 × 3 + 2, so
    the 2000th clean update() is optimizer 2's, in iteration 666, and optimizer 3 applies half its
    gradient there; with one update() per iteration, growth waits for iteration 1999 and harms nobody."""
    def first_harm(update_every_step):
        scaler = torch.amp.GradScaler("cpu")
        params = [torch.nn.Parameter(torch.ones(1)) for _ in range(3)]
        opts = [torch.optim.SGD([p], lr=0.0) for p in params]
        for i in range(2100):
            scaled_by = scaler.scale(torch.ones(())).item()  # the scale this iteration's backward uses
            for opt, p in zip(opts, params):
                p.grad = torch.full((1,), scaled_by)  # a true gradient of 1, scaled
            for k, opt in enumerate(opts):
                before = scaler.get_scale()
                scaler.step(opt)
                if before != scaled_by:
                    return i, k + 1, params[k].grad.item()  # the gradient it applied
                if update_every_step:
                    scaler.update()
            if not update_every_step:
                scaler.update()
        return None

    assert first_harm(update_every_step=True) == (666, 3, 0.5)
    assert first_harm(update_every_step=False) is None


def test_bare_loss_backward_skips_on_after_backward():
    """Open exercise 1, discussion: under bf16-mixed a bare loss.backward() gets the gradients right,
    but it bypasses Lightning's backward path, so on_after_backward never runs."""
    from ampviz.pitfalls import quiet_trainer

    class Counting(mb._module_class()):
        def on_after_backward(self):
            self.after_backward = getattr(self, "after_backward", 0) + 1

    for backward, calls in (("manual_backward", 2), ("loss.backward", 0)):
        module = Counting(backward)
        with quiet_trainer(max_steps=2, precision="bf16-mixed") as trainer:
            trainer.fit(module, mb._loader())
        assert getattr(module, "after_backward", 0) == calls, backward


# ------------------------------------------------------------------------------------------------
# Clipping in manual optimization (section 8)
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def clips():
    return {where: mb.clipping(where, clip_val=0.1, iterations=2) for where in mb.CLIPS}


def test_clip_before_step_clips_the_scaled_gradients(clips):
    out = clips["before opt.step()"]
    assert not out.failed
    for s in out.details["steps"]:
        assert s["true_norm"] > 0.4  # clipping has something to do
        assert s["applied_norm"] * s["unscaled_by"] == pytest.approx(0.1, rel=1e-5)  # clip value / scale
        assert s["applied_norm"] != pytest.approx(0.1, rel=0.5)  # the plausible expectation fails


def test_unscale_with_lightnings_wrapper_does_not_raise_and_unscales_twice(clips):
    out = clips["after scaler.unscale_(opt)"]
    assert not out.failed  # no "already been called": the scaler keys its state by id(optimizer)
    for s in out.details["steps"]:
        assert s["applied_norm"] * s["unscaled_by"] == pytest.approx(0.1, rel=1e-5)
    assert mb.check_unscale_wrapper_raises("no") and not mb.check_unscale_wrapper_raises("yes")


def test_unscale_with_the_torch_optimizer_makes_step_raise(clips):
    out = clips["after scaler.unscale_(opt.optimizer)"]
    assert out.error_type == "RuntimeError"
    assert out.message == "unscale_() has already been called on this optimizer since the last update()."
    assert out.details["error_chain"] == [
        "lightning/pytorch/core/optimizer.py LightningOptimizer.step",
        "lightning/pytorch/strategies/strategy.py Strategy.optimizer_step",
        "lightning/pytorch/plugins/precision/amp.py MixedPrecision.optimizer_step",
        "torch/amp/grad_scaler.py GradScaler.unscale_"]
    assert out.details["steps"] == []
    assert str(mb.clip_table(out)).splitlines()[-1].split()[3:5] == ["raised", "RuntimeError"]


def test_clip_in_on_before_optimizer_step_applies_the_clip_value(clips):
    out = clips["in on_before_optimizer_step"]
    assert not out.failed
    for s in out.details["steps"]:
        assert s["true_norm"] > 0.4
        assert s["applied_norm"] == pytest.approx(0.1, rel=1e-4)
    table = mb.clip_table(*clips.values())
    assert table.column("applied norm × scale ÷ clip") == ("1", "1", "1", "1", "-", "6.554e+04", "6.554e+04")


def test_a_clip_value_above_the_true_norm_still_clips_before_step_and_not_in_the_hook():
    """Clip value 1.0, true norm below 0.5: before opt.step() the scaled norm is clipped anyway."""
    before = mb.clipping("before opt.step()", clip_val=1.0)
    hook = mb.clipping("in on_before_optimizer_step", clip_val=1.0)
    for s in before.details["steps"]:
        assert s["true_norm"] < 0.5 and s["applied_norm"] * s["unscaled_by"] == pytest.approx(1.0, rel=1e-5)
    for s in hook.details["steps"]:
        assert s["true_norm"] < 0.5 and s["applied_norm"] == pytest.approx(s["true_norm"], rel=1e-6)


def test_clip_before_step_at_a_lower_scale():
    """The transfer exercise: scale 32768 after an overflow, clip value 1.0: the applied norm is 1/32768."""
    out = mb.run_manual(fp16=True, clip="before opt.step()", clip_val=1.0, spike_at=0, iterations=2)
    first, second = out.details["steps"]
    assert first["skipped"] and second["unscaled_by"] == 32768.0
    assert second["applied_norm"] == pytest.approx(1 / 32768, rel=1e-5)
    assert mb.check_clip_before_step_norm(second["applied_norm"])


def test_clip_in_the_hook_in_an_overflowing_iteration_is_skipped():
    """Open exercise 3: clipping an inf gradient gives NaN, but the scaler decided at unscale_ (before the hook)."""
    out = mb.run_manual(fp16=True, clip="in on_before_optimizer_step", spike_at=1, iterations=3)
    assert [s["skipped"] for s in out.details["steps"]] == [False, True, False]
    assert out.scale == [65536.0, 32768.0, 32768.0]
    size = sum(p.numel() for p in mb._module_class()().parameters())  # 433
    unclipped = mb.run_manual(fp16=True, spike_at=1, iterations=2).details["steps"][1]
    assert 0 < unclipped["nonfinite"] < size  # the spike leaves most entries inf or NaN, not all
    assert out.details["steps"][1]["nonfinite"] == size  # norm NaN: clipping makes every entry NaN
    assert [s["nonfinite"] for s in out.details["steps"][::2]] == [0, 0]
    one_inf = mb.run_manual(fp16=True, clip="in on_before_optimizer_step", spike_at=1, overflow_in=(1,), iterations=2)
    step = one_inf.details["steps"][1]
    assert step["skipped"] and step["nonfinite"] == 1 and step["applied_norm"] == 0.0  # norm inf: × 0, inf × 0 = NaN


def test_trainer_gradient_clip_val_is_refused_in_manual_optimization():
    from ampviz.pitfalls import quiet_trainer

    module = mb._module_class()()
    with pytest.raises(Exception, match="Automatic gradient clipping is not supported for manual optimization."):
        with quiet_trainer(max_steps=1, gradient_clip_val=0.1) as trainer:
            trainer.fit(module, mb._loader())


def test_bf16_with_loss_backward_is_harmless():
    """Open exercise 1: bf16-mixed has no scaler, so a bare loss.backward() matches fp32 to bf16 rounding."""
    out = mb.run_manual("loss.backward", precision="bf16-mixed")
    fp32 = mb.fp32_reference().grad_norms["per_iteration"]
    assert not out.failed and out.details["scaler"] is None
    assert max(abs(a / b - 1) for a, b in zip(out.grad_norms["per_iteration"], fp32)) < 0.01


# ------------------------------------------------------------------------------------------------
# Tables, checkers, bad input
# ------------------------------------------------------------------------------------------------


def test_tables(fp32):
    table = mb.precision_table(fp32)
    assert table.column("trainer.precision") == ("32-true",)
    assert str(mb.trace_table(mb.fp16_loss_backward())).splitlines()[-1].split()[-1] == "AssertionError"
    assert mb.steps_table(fp32).column("applied ÷ true grad") == ("1",) * mb.ITERATIONS
    assert mb.steps_table(fp32).column("scale after") == ("-",) * mb.ITERATIONS


UNANSWERED = "not answered yet"


@pytest.mark.parametrize("checker, right, wrong", [
    (mb.check_cpu_precision, ["bf16-mixed", "'bf16-mixed'", " BF16-MIXED "], ["16-mixed", "bf16", 16, "fp16"]),
    (mb.check_partial_overflow_factor,
     [2, 2.0, "2", " 2 ", "2.0", "2x", "×2", "x2", "2 times", "two", "twice", 2e0, torch.tensor(2.0)],
     [1, 0.5, 4, "1", "half", "4x", True, [2], "2/0"]),
    (mb.check_third_optimizer_factor,
     [2, 2.0, "2", "2x", "two", "twice", torch.tensor(2.0)],
     [1, 4, 0.5, "1", "once", "four"]),
    (mb.check_unscale_wrapper_raises, ["no", "No", " NO ", "'no'", False], ["yes", "Yes", True, "RuntimeError", 0]),
    (mb.check_clip_before_step_norm,
     [1 / 32768, 2**-15, 3.0517578125e-05, "3.0517578125e-05", "1/32768", "2**-15", "2^-15", 3.052e-05, "3.0518e-5"],
     [1.0, 1, 1 / 65536, 5 / 32768, 5, 3.0e-05, "1.0", "1/65536", "clip"]),
])
def test_checkers_answer_right_wrong_and_unanswered(checker, right, wrong):
    assert checker(None).status == "unanswered" and str(checker(None)).startswith(UNANSWERED)
    assert checker(...).status == "unanswered"
    for answer in right:
        assert checker(answer).status == "right", answer
        assert str(checker(answer)) == "✓ correct"
    for answer in wrong:
        result = checker(answer)
        assert result.status == "wrong", answer
        assert str(result).startswith("✗ not quite: ")


def test_bad_backward_mode():
    with pytest.raises(ValueError, match="backward must be one of"):
        mb.run_manual("backward()")


def test_versions_reads_lightning_without_importing_it():
    """The pitfall notebooks' setup cell prints versions(); importing lightning there would cost
    seconds before the first output."""
    import subprocess
    import sys

    code = ("import sys; from ampviz.pitfalls import versions; v = versions(); "
            "assert 'lightning' not in sys.modules, 'imported'; "
            "import lightning, torch; assert v == {'torch': torch.__version__, 'lightning': lightning.__version__}, v")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_a_precision_lightning_refuses_is_the_outcome_with_lightnings_own_message():
    """precision="fp16" used to end in a bare KeyError: 'trainer' (the Trainer was never built)."""
    import lightning as L

    with pytest.raises(ValueError) as info:  # what Lightning itself says
        L.Trainer(accelerator="cpu", devices=1, precision="fp16", logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False)
    out = mb.run_manual(precision="fp16")
    assert out.failed and out.error_type == "ValueError" and out.message == str(info.value)
    assert "Allowed precision values" in out.message and "'16-mixed'" in out.message
    assert out.details["precision"] is None and out.details["iterations"] == 0 and out.details["trace"] == []
    chain = out.details["error_chain"]
    assert "ampviz/pitfalls/__init__.py quiet_trainer" in chain and chain[-1].startswith("lightning/")
    assert not any(c.startswith("/") for c in chain)  # file names, no machine paths
    assert str(mb.trace_table(out)).splitlines()[-1].split()[-3:] == ["Trainer(...)", "raised", "ValueError"]
    assert mb.precision_table(out).column("trainer.precision") == ("None",)


@pytest.mark.parametrize("fn, kwargs, error, says", [
    (mb.run_manual, dict(fp16=True, precision="16-mixed"), ValueError, "pass fp16=True .* or precision='16-mixed', not both"),
    (mb.run_manual, dict(fp16=1), TypeError, "fp16 must be True or False"),
    (mb.run_manual, dict(optimizers=0), ValueError, "optimizers must be 1 to 3, got 0"),
    (mb.run_manual, dict(optimizers=4), ValueError, "optimizers must be 1 to 3, got 4"),
    (mb.run_manual, dict(iterations=0), ValueError, r"iterations must be 1 to 4 \(the data has 4 batches\), got 0"),
    (mb.run_manual, dict(iterations=-1), ValueError, "iterations must be 1 to 4"),  # max_steps=-1: no step limit
    (mb.run_manual, dict(iterations=10**9), ValueError, "iterations must be 1 to 4"),  # would run for hours
    (mb.run_manual, dict(spike_at=1.5), ValueError, "spike_at must be an iteration, 0 to iterations - 1 = 3, or None"),
    (mb.run_manual, dict(spike_at=4), ValueError, "spike_at must be an iteration"),  # would never happen
    (mb.run_manual, dict(name=3), TypeError, "name must be a string or None"),
    (mb.run_manual, dict(optimizers=2, overflow_in=(1,)), ValueError, "overflow_in needs spike_at"),
    (mb.run_manual, dict(optimizers=2, spike_at=0, overflow_in=(3,)), ValueError,
     "overflow_in must name distinct optimizers, each 1 to optimizers=2"),
    (mb.run_manual, dict(optimizers=2, spike_at=0, overflow_in=(1, 1)), ValueError, "distinct optimizers"),
    (mb.run_manual, dict(optimizers=2, spike_at=0, overflow_in=()), ValueError, "distinct optimizers"),
    (mb.run_manual, dict(optimizers=2, spike_at=0, overflow_in=1), TypeError, r"overflow_in must be a tuple .* \(1,\)"),
    (mb.run_manual, dict(optimizers=2, spike_at=0, overflow_in="1"), TypeError, "overflow_in must be a tuple"),
    (mb.run_manual, dict(growth_interval=1), ValueError, "growth_interval must be .* with fp16=True"),
    (mb.run_manual, dict(fp16=True, growth_interval=0), ValueError, "growth_interval must be a whole number"),
    (mb.run_manual, dict(clip="clip"), ValueError, "clip must be None or one of"),
    (mb.run_manual, dict(clip="after scaler.unscale_(opt)"), ValueError, "pass fp16=True"),
    (mb.run_manual, dict(clip_val=0), ValueError, "clip_val must be a positive finite number, got 0"),
    (mb.run_manual, dict(clip_val=10**400), ValueError, "clip_val must be a positive finite number"),
    (mb.run_manual, dict(clip_val="0.1"), ValueError, "clip_val must be a positive finite number, got '0.1'"),
    (mb.partial_overflow, dict(backward="loss.backward"), ValueError, "backward must be 'manual_backward' or"),
    (mb.partial_overflow, dict(overflow_in=None), ValueError, r"overflow_in must name the optimizers .* \(1,\)"),
    (mb.torch_recipe, dict(update_every_step="yes"), TypeError, "update_every_step must be True or False"),
    (mb.torch_recipe, dict(optimizers=5), ValueError, "optimizers must be 1 to 3"),
    (mb.clipping, dict(clip=None), ValueError, "clip must be one of"),
    (mb.applied_factor, dict(outcome="run", iteration=1, optimizer=2), TypeError, "outcome must be an Outcome"),
    (mb.steps_table, dict(outcome=None), TypeError, "outcome must be an Outcome"),
])
def test_bad_arguments_are_one_line_errors(fn, kwargs, error, says):
    with pytest.raises(error, match=says) as info:
        fn(**kwargs)
    assert "\n" not in str(info.value)


def test_applied_factor_names_a_step_that_is_not_there(partial):
    with pytest.raises(ValueError, match="has no step of optimizer 3 in iteration 1"):
        mb.applied_factor(partial, 1, 3)
    with pytest.raises(TypeError, match="each outcome must be an Outcome"):
        mb.clip_table(partial, "x")


# ------------------------------------------------------------------------------------------------
# Arbitrary input (Hypothesis): a result or a one-line ValueError/TypeError, never anything else
# ------------------------------------------------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

ANY = st.one_of(st.none(), st.booleans(), st.integers(-5, 6), st.integers(), st.floats(allow_nan=True),
                st.text(max_size=6), st.tuples(st.integers(-1, 4)), st.lists(st.integers(0, 4), max_size=4),
                st.sampled_from(mb.CLIPS + mb.BACKWARDS))
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _answers_or_refuses(fn, **kwargs):
    try:
        result = fn(**kwargs)
    except (ValueError, TypeError) as exc:
        assert str(exc).strip() and "\n" not in str(exc), repr(str(exc))
        return None
    return result


def _mostly(valid):
    """Three draws in four from ``valid``, else anything: most runs get through the checks and train."""
    return st.one_of(valid, valid, valid, ANY)


KWARGS = {"optimizers": _mostly(st.integers(1, 3)), "overflow_in": _mostly(st.sampled_from([None, (1,)])),
          "spike_at": _mostly(st.sampled_from([None, 0])), "iterations": _mostly(st.integers(1, 4)),
          "growth_interval": _mostly(st.sampled_from([None, 1, 2])), "clip": _mostly(st.sampled_from((None,) + mb.CLIPS)),
          "clip_val": _mostly(st.floats(1e-3, 10.0)), "fp16": _mostly(st.just(True)),
          "backward": _mostly(st.sampled_from(mb.BACKWARDS)), "update_every_step": _mostly(st.booleans())}


@FUZZ
@given(kwargs=st.fixed_dictionaries({"fp16": KWARGS["fp16"]},
                                    optional={k: v for k, v in KWARGS.items() if k not in ("fp16", "update_every_step")}))
def test_run_manual_answers_or_refuses_in_one_line(kwargs):
    out = _answers_or_refuses(mb.run_manual, **kwargs)
    if out is not None:
        assert isinstance(out, mb.Outcome)
        assert len(out.details["steps"]) <= mb.ITERATIONS * 3
        for s in out.details["steps"]:
            assert s["skipped"] or s["factor"] is None or s["factor"] > 0


@FUZZ
@given(fn=st.sampled_from([mb.partial_overflow, mb.torch_recipe, mb.clipping]),
       kwargs=st.fixed_dictionaries({}, optional=KWARGS))
def test_scenarios_answer_or_refuse_in_one_line(fn, kwargs):
    import inspect

    accepted = inspect.signature(fn).parameters
    out = _answers_or_refuses(fn, **{k: v for k, v in kwargs.items() if k in accepted})
    if out is not None:
        assert isinstance(out, mb.Outcome)
        assert isinstance(str(mb.steps_table(out)), str)


@FUZZ
@given(outcome=st.one_of(ANY, st.just("partial")), iteration=ANY, optimizer=ANY)
def test_applied_factor_and_tables_answer_or_refuse(outcome, iteration, optimizer, partial):
    outcome = partial if outcome == "partial" else outcome
    factor = _answers_or_refuses(mb.applied_factor, outcome=outcome, iteration=iteration, optimizer=optimizer)
    assert factor is None or factor in (1.0, 2.0)
    _answers_or_refuses(mb.steps_table, outcome=outcome)
    try:
        mb.clip_table(outcome)
    except TypeError as exc:
        assert "\n" not in str(exc)


@settings(max_examples=200, deadline=None)
@given(answer=st.one_of(ANY, st.text(max_size=12), st.floats(), st.complex_numbers(), st.binary(max_size=4),
                        st.from_regex(r"\s*[x×]?\s*-?\d{1,6}(\.\d{0,4})?([eE][-+]?\d{1,3})?\s*(x|times)?\s*",
                                      fullmatch=True),
                        st.from_regex(r"\d{1,3}\s*(/|\*\*|\^)\s*-?\d{1,6}", fullmatch=True)))
def test_checkers_never_raise(answer):
    for checker in (mb.check_cpu_precision, mb.check_partial_overflow_factor, mb.check_third_optimizer_factor,
                    mb.check_unscale_wrapper_raises, mb.check_clip_before_step_norm):
        result = checker(answer)
        assert result.status in ("right", "wrong", "unanswered")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(optimizers=st.integers(1, 3), iterations=st.integers(1, 3), data=st.data(),
       backward=st.sampled_from([mb.BACKWARDS[0], mb.BACKWARDS[3]]), growth_interval=st.sampled_from([None, 1, 2, 3]))
def test_every_applied_factor_is_the_scale_of_the_backward_over_the_scale_of_unscale(
        optimizers, iterations, data, backward, growth_interval):
    """In any valid run without clipping, each optimizer applies its true gradient times (the scale
    its backward multiplied by) ÷ (the scale unscale_ divided by), exactly: the whole story of section 7."""
    spike_at = data.draw(st.sampled_from([None] + list(range(iterations))))
    overflow_in = None if spike_at is None else data.draw(st.sampled_from(
        [None] + [tuple(sorted(c)) for c in ((1,), (optimizers,), tuple(range(1, optimizers + 1)))]))
    out = mb.run_manual(backward, fp16=True, optimizers=optimizers, iterations=iterations, spike_at=spike_at,
                        overflow_in=overflow_in, growth_interval=growth_interval)
    assert not out.failed and len(out.details["steps"]) == optimizers * iterations
    for s in out.details["steps"]:
        if not s["skipped"]:
            assert s["factor"] == s["scaled_by"] / s["unscaled_by"]
