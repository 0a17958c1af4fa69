"""Pitfall 3: nn.TransformerEncoder under bf16-mixed crashes only in validation (torch 2.13, CPU)."""

import pytest
import torch

pytest.importorskip("lightning")

from ampviz.pitfalls import transformer_eval as te  # noqa: E402

BF16_MESSAGE = "expected scalar type Float but found BFloat16"
HALF_MESSAGE = "expected scalar type Float but found Half"
OLD_MESSAGE = "mat1 and mat2 must have the same dtype, but got BFloat16 and Float"


@pytest.fixture(scope="module")
def fixes():
    return te.fix_runs()


def test_training_runs_then_first_validation_crashes():
    out = te.crash("bf16-mixed")
    assert (out.error_type, out.message) == ("RuntimeError", BF16_MESSAGE)
    assert out.details["train_steps"] == te.TRAIN_BATCHES  # every training step ran
    assert out.details["val_batches"] == 0  # the very first validation batch raised
    assert "torch._transformer_encoder_layer_fwd" in out.details["raised_in"]
    assert out.details["val_context"] == {"training": False, "grad_enabled": False, "inference_mode": False,
                                          "autocast": True, "autocast_dtype": "bfloat16"}


def test_trainer_validate_crashes_under_inference_mode():
    out = te.crash("bf16-mixed", stage="validate")
    assert out.message == BF16_MESSAGE and out.details["train_steps"] == te.TRAIN_BATCHES
    assert out.details["val_context"]["inference_mode"] is True


def test_16_mixed_becomes_bf16_mixed_on_cpu():
    out = te.crash("16-mixed")
    assert out.message == BF16_MESSAGE
    assert out.details["val_context"]["autocast_dtype"] == "bfloat16"


def test_condition_table():
    table = te.condition_table()
    outcomes = dict(zip(table.column("changed to"), table.column("outcome")))
    crashes = {"nothing switched off", "inference_mode instead of no_grad", "an all-False mask (no padding)",
               "num_layers=1"}
    for change, outcome in outcomes.items():
        if change in crashes:
            assert outcome == f"RuntimeError: {BF16_MESSAGE}", change
        elif change == "autocast in fp16":
            assert outcome == f"RuntimeError: {HALF_MESSAGE}"
        else:
            assert outcome.startswith("runs ("), change
    assert len(outcomes) == len(te.CONDITIONS) == 15


@pytest.mark.parametrize("grad", ["no_grad", "inference_mode"])
def test_plain_torch_crash(grad):
    out = te.encoder_call(grad=grad)
    assert (out.error_type, out.message) == ("RuntimeError", BF16_MESSAGE)


def test_old_message_at_the_op():
    out = te.old_message()
    assert (out.error_type, out.message) == ("RuntimeError", OLD_MESSAGE)


def test_fixes_validate_close_to_fp32(fixes):
    """Tolerance: |val loss - fp32 val loss| < 1e-3 for the bf16-mixed fixes (fp32 weights, the
    encoder or everything in bf16 autocast during training), < 2e-2 for bf16-true (bf16 weights).
    Not identical: training under bf16 autocast already takes the weights elsewhere."""
    ref = fixes['precision="32-true" (the fp32 reference)']
    assert not ref.failed and ref.details["weight_dtype"] == "float32"
    for name, out in fixes.items():
        assert not out.failed, f"{name}: {out}"
        assert out.details["train_steps"] == te.TRAIN_BATCHES and out.details["val_batches"] == te.VAL_BATCHES
        if out is ref:
            continue
        diff = abs(out.loss - ref.loss)
        if name == 'precision="bf16-true"':
            assert out.details["weight_dtype"] == "bfloat16" and out.details["val_context"]["autocast"] is False
            assert 0 < diff < 2e-2
        else:
            assert out.details["weight_dtype"] == "float32" and out.details["val_context"]["autocast"] is True
            assert 0 < diff < 1e-3, name


def test_reruns_are_bit_identical(fixes):
    assert te.lightning_run("32-true").loss == fixes['precision="32-true" (the fp32 reference)'].loss
    name = "enable_nested_tensor=False"
    assert te.lightning_run(name=name, **te.FIXES[name]).loss == fixes[name].loss


def test_fastpath_setting_is_restored(fixes):
    assert torch.backends.mha.get_fastpath_enabled() is True
    with pytest.raises(ZeroDivisionError), te.fastpath_disabled():
        assert torch.backends.mha.get_fastpath_enabled() is False
        1 / 0
    assert torch.backends.mha.get_fastpath_enabled() is True


def test_fix_table(fixes):
    exact = te.fix_table(fixes, exact=True)
    assert exact.column("vs fp32")[0] == "identical"
    assert exact.column("weights") == ("float32", "bfloat16", "float32", "float32", "float32")
    table = te.fix_table(fixes)  # the lesson's claim, at a precision every CPU reproduces
    assert table.column("within 0.001 of fp32") == ("yes", "no", "yes", "yes", "yes")
    ref = fixes['precision="32-true" (the fp32 reference)'].loss
    assert table.column("validation loss") == tuple(f"{o.loss:.2f}" for o in fixes.values())
    assert abs(fixes['precision="bf16-true"'].loss - ref) > 1e-3
    assert te.fix_table(fixes, tolerance=1e-2).column("within 0.01 of fp32") == ("yes",) * 5


def test_real_fp16_autocast_crashes_with_half():
    out = te.crash("16-mixed-fp16")  # MixedPrecision("16-mixed", "cpu") plugin
    assert (out.error_type, out.message) == ("RuntimeError", HALF_MESSAGE)
    assert out.details["train_steps"] == te.TRAIN_BATCHES
    assert out.details["val_context"]["autocast_dtype"] == "float16"


def test_fp32_island_needs_the_cast_when_the_input_is_bf16():
    """The claim of the lesson's section 5: autocast off alone is not enough for a bf16 input."""
    enc = te.make_encoder().eval()
    x = torch.randn(4, te.MAX_LEN, te.D_MODEL).bfloat16()
    pad = torch.arange(te.MAX_LEN).unsqueeze(0) >= torch.tensor([[5], [9], [12], [7]])
    with torch.no_grad(), torch.autocast("cpu", enabled=False):
        with pytest.raises(RuntimeError, match="expected m1 and m2 to have the same dtype"):
            enc(x, src_key_padding_mask=pad)
        assert enc(x.float(), src_key_padding_mask=pad).dtype == torch.float32
