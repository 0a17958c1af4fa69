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


def test_update_runs_once_per_optimizer():
    out = mb.several_optimizers(optimizers=3, spike_at=1, iterations=3)
    assert not out.failed
    assert out.scale == [65536.0] * 3 + [32768.0, 16384.0, 8192.0] + [8192.0] * 3
    assert out.details["global_step"] == 9 and out.details["iterations"] == 3  # max_steps counts opt steps
    table = mb.scale_table(out)
    assert table.column("scale after it")[5] == "8192"


def test_one_optimizer_overflow_halves_once():
    out = mb.several_optimizers(optimizers=1, spike_at=1, iterations=3)
    assert out.scale == [65536.0, 32768.0, 32768.0]


def test_tables_and_checks(fp32):
    table = mb.precision_table(fp32)
    assert table.column("trainer.precision") == ("32-true",)
    assert str(mb.trace_table(mb.fp16_loss_backward())).splitlines()[-1].split()[-1] == "AssertionError"
    assert mb.check_cpu_precision(None).status == "unanswered"
    assert mb.check_cpu_precision("bf16-mixed") and not mb.check_cpu_precision("16-mixed")
    assert mb.check_backward_call("self.manual_backward(loss)") and not mb.check_backward_call("loss.backward()")
    assert mb.check_scale_after_overflow(4096) and not mb.check_scale_after_overflow(32768)


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


@pytest.mark.parametrize("kwargs, error, says", [
    (dict(fp16=True, precision="16-mixed"), ValueError, "pass fp16=True .* or precision='16-mixed', not both"),
    (dict(optimizers=0), ValueError, "optimizers must be 1 to 3, got 0"),
    (dict(optimizers=4), ValueError, "optimizers must be 1 to 3, got 4"),
    (dict(iterations=0), ValueError, "iterations must be a whole number >= 1, got 0"),
    (dict(iterations=-1), ValueError, "iterations must be a whole number >= 1, got -1"),  # max_steps=-1 would mean no step limit
    (dict(spike_at=1.5), ValueError, "spike_at must be a whole number >= 0 or None"),
    (dict(name=3), TypeError, "name must be a string or None"),
])
def test_bad_arguments_are_one_line_errors(kwargs, error, says):
    with pytest.raises(error, match=says) as info:
        mb.run_manual(**kwargs)
    assert "\n" not in str(info.value)
