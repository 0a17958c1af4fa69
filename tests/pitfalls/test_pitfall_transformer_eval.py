"""Pitfall 3: nn.TransformerEncoder under bf16-mixed crashes only in validation (torch 2.13, CPU)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

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


# ------------------------------------------------------------------ the lesson's further claims
RIGHT_PAD = torch.arange(te.MAX_LEN).unsqueeze(0) >= torch.tensor([[5], [9], [12], [7]])


def test_training_and_validation_differ_in_mode_and_grad_only():
    """Section 1: 'exactly two ways: eval mode and no gradients; autocast is on, in bf16, in both'."""
    ctx = te.crash("bf16-mixed").details
    train, val = ctx["train_context"], ctx["val_context"]
    assert train == {"training": True, "grad_enabled": True, "inference_mode": False, "autocast": True,
                     "autocast_dtype": "bfloat16"}
    assert {k for k in train if train[k] != val[k]} == {"training", "grad_enabled"}


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_validate_test_and_predict_crash_under_inference_mode(stage):
    out = te.crash("bf16-mixed", stage=stage)
    assert out.message == BF16_MESSAGE and out.details["train_steps"] == te.TRAIN_BATCHES
    assert out.details["val_context"]["inference_mode"] is True and out.details["val_context"]["training"] is False


def test_16_mixed_becomes_bf16_mixed_with_only_a_warning():
    import lightning as L

    with pytest.warns(UserWarning, match="AMP with fp16 is not supported on CPU. Using `precision='bf16-mixed'` "
                                         "instead."):
        trainer = L.Trainer(accelerator="cpu", precision="16-mixed", logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False)
    assert trainer.precision == "bf16-mixed"


def test_default_sanity_check_crashes_before_any_training_step():
    """The predict exercise (check_sanity_steps): 0 training steps with num_sanity_val_steps=2 (or 1)."""
    for steps in (1, 2):
        out = te.crash("bf16-mixed", sanity_steps=steps)
        assert out.message == BF16_MESSAGE
        assert out.details["train_steps"] == 0 and out.details["sanity_check"] is True
    assert te.crash("bf16-mixed").details["sanity_check"] is False


def test_the_encoder_asks_whether_a_gradient_must_be_recorded():
    """Section 2 and the transfer exercise (check_frozen_encoder): grad enabled with a frozen encoder
    and an input that does not require grad still crashes; an input that requires grad, or trainable
    weights, or train mode, avoid the fast path."""
    assert te.encoder_call(grad="enabled", frozen=True).message == BF16_MESSAGE
    assert te.encoder_call(grad="enabled", frozen=True, train=True).error_type is None
    assert te.encoder_call(grad="enabled").error_type is None
    enc = te.make_encoder().eval().requires_grad_(False)
    x = torch.randn(4, te.MAX_LEN, te.D_MODEL, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert enc(x, src_key_padding_mask=RIGHT_PAD).dtype == torch.float32  # the Python layers ran
    x = x.detach()
    for frozen, crashes in ((0, True), (1, False)):  # only the first layer's weights are looked at
        enc = te.make_encoder().eval()
        enc.layers[frozen].requires_grad_(False)
        with torch.autocast("cpu", dtype=torch.bfloat16), te._no_nested_warning():
            if crashes:
                with pytest.raises(RuntimeError, match=BF16_MESSAGE):
                    enc(x, src_key_padding_mask=RIGHT_PAD)
            else:
                assert enc(x, src_key_padding_mask=RIGHT_PAD).dtype == torch.float32


def test_a_nested_layer_norm_refuses_bf16_input_with_fp32_weights():
    """Section 2: the message is the nested LayerNorm's; an ordinary LayerNorm accepts the mix."""
    x = torch.randn(4, te.MAX_LEN, te.D_MODEL).bfloat16()
    norm = torch.nn.LayerNorm(te.D_MODEL)
    with te._no_nested_warning():
        nested = torch._nested_tensor_from_mask(x, RIGHT_PAD.logical_not(), mask_check=False)
    with pytest.raises(RuntimeError) as err:
        norm(nested)
    assert str(err.value) == BF16_MESSAGE
    assert norm(x).dtype == torch.bfloat16


def test_the_autocast_check_reads_cuda_only():
    """Section 2/5: under CPU autocast torch.is_autocast_enabled() is False; with CUDA's flag set by
    hand the same CPU call takes the Python layers and runs."""
    enc = te.make_encoder().eval()
    x = torch.randn(4, te.MAX_LEN, te.D_MODEL)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), te._no_nested_warning():
        assert torch.is_autocast_enabled() is False and torch.is_autocast_enabled("cpu") is True
        with pytest.raises(RuntimeError, match=BF16_MESSAGE):
            enc(x, src_key_padding_mask=RIGHT_PAD)
        torch.set_autocast_enabled("cuda", True)
        try:
            assert torch.is_autocast_enabled() is True and torch.is_autocast_enabled("cuda") is True
            assert enc(x, src_key_padding_mask=RIGHT_PAD).dtype == torch.float32
        finally:
            torch.set_autocast_enabled("cuda", False)
    assert torch.is_autocast_enabled() is False
    torch.set_autocast_enabled("cuda", True)
    try:
        assert te.encoder_call().details == {"dtype": "float32", "padded_zero": False}  # the guide's demo
    finally:
        torch.set_autocast_enabled("cuda", False)
    assert te.encoder_call().message == BF16_MESSAGE


def test_device_none_and_cpu_are_the_same_call(fused_calls):
    """``device`` defaults to today's CPU call: None, "cpu" and torch.device("cpu") give the same
    outcome, details and table; the CPU's autocast is the one switched on (a CUDA autocast would
    avoid the crash, test_the_autocast_check_reads_cuda_only)."""
    for device in (None, "cpu", torch.device("cpu")):
        assert te.encoder_call(device=device).message == BF16_MESSAGE
        assert te.encoder_call(device=device, autocast=None).details == {"dtype": "float32", "padded_zero": True}
        assert te.encoder_call(device=device, grad="enabled").details == {"dtype": "float32", "padded_zero": False}
    assert fused_calls["nested"] == 6  # each crash and each fp32 call packed the batch
    table = te.condition_table()
    assert table.title == "nn.TransformerEncoder, eval + no_grad + bf16 autocast on the CPU, one change at a time"
    cpu = te.condition_table(device="cpu")
    assert (cpu.title, cpu.column("outcome")) == (table.title, table.column("outcome"))


def test_the_device_argument_refuses_what_is_not_a_device():
    what = r"device must be None \(the CPU\), 'cpu', or a CUDA device such as 'cuda' or 'cuda:0'"
    for bad in ("gpu", "CPU", "meta", "mps", "", "cuda:x", torch.device("meta")):
        with pytest.raises(ValueError, match=what):
            te.encoder_call(device=bad)
    for bad in (0, 1.5, True, torch.float16, ["cpu"]):
        with pytest.raises(TypeError, match=what):
            te.encoder_call(device=bad)
    with pytest.raises(ValueError, match=what):
        te.condition_table(device="gpu")
    if not torch.cuda.is_available():
        for device in ("cuda", "cuda:0", torch.device("cuda")):
            with pytest.raises(ValueError, match=r"needs a CUDA device, and torch.cuda.is_available\(\) is False"):
                te.encoder_call(device=device)
            with pytest.raises(ValueError, match="needs a CUDA device"):
                te.condition_table(device=device)
    else:
        with pytest.raises(ValueError, match=f"this machine has {torch.cuda.device_count()} CUDA device"):
            te.encoder_call(device=f"cuda:{torch.cuda.device_count()}")


@pytest.mark.parametrize("condition, change, kwargs", te.CONDITIONS, ids=[c[1] for c in te.CONDITIONS])
def test_output_dtype_shows_the_path(fused_calls, condition, change, kwargs):
    """Section 2: bf16 output where the fused kernel ran, fp32 where the layers ran as Python modules
    (under autocast); a crash is always inside the fused kernel, after the nested packing."""
    out = te.encoder_call(**kwargs)
    if out.failed:
        assert fused_calls["fused"] == 1 and fused_calls["nested"] == 1
    elif kwargs.get("autocast", torch.bfloat16) is not None:
        assert (out.details["dtype"] == "bfloat16") == (fused_calls["fused"] > 0), change
        assert fused_calls["nested"] == 0


def test_only_the_nested_path_leaves_zeros_at_padded_positions(fused_calls):
    """Section 2 and the predict exercise (check_fp32_fast_path): in fp32, eval mode and no_grad, the
    encoder packs the batch and its padded positions come out exactly 0; every other path leaves values."""
    out = te.encoder_call(autocast=None)
    assert out.details == {"dtype": "float32", "padded_zero": True} and fused_calls["nested"] == 1
    for kwargs in ({"train": True}, {"grad": "enabled"}, {"nested": False}, {"fastpath": False}, {"mask": "left"},
                   {"causal": True}):
        assert te.encoder_call(autocast=None, **kwargs).details["padded_zero"] is False, kwargs
    assert fused_calls["nested"] == 1
    assert "padded_zero" not in te.encoder_call(autocast=None, mask="all-false").details  # nothing is padded


def test_the_fp32_reference_validates_on_the_nested_path(fused_calls):
    """The predict exercise, in the real Trainer: 32-true validation packs nested tensors too (and
    only validation does); a run under set_fastpath_enabled(False) never does."""
    out = te.lightning_run("32-true", stage="validate")
    assert not out.failed and fused_calls["nested"] == te.VAL_BATCHES
    assert fused_calls["fused"] == te.VAL_BATCHES * te.LAYERS
    assert not te.lightning_run("32-true", fastpath=False).failed
    assert fused_calls["nested"] == te.VAL_BATCHES


def test_the_targeted_fixes_train_identically_and_validate_differently(fixes, fused_calls):
    """Section 4: training never takes the fast path, so both targeted fixes end with bit-identical
    weights; enable_nested_tensor=False still runs the fused kernel in validation, the switch does not.
    Every bf16 fix's weights differ from fp32's."""
    ref = fixes['precision="32-true" (the fp32 reference)'].details["state"]
    nested = fixes["enable_nested_tensor=False"]
    switch = fixes["torch.backends.mha.set_fastpath_enabled(False)"]
    assert all(torch.equal(nested.details["state"][k], switch.details["state"][k]) for k in ref)
    assert nested.loss != switch.loss
    for name, out in fixes.items():
        if out.details["state"] is not ref:
            assert any(not torch.equal(out.details["state"][k].float(), ref[k]) for k in ref), name
    assert fused_calls["fused"] == 0
    te.lightning_run(name="nested", **te.FIXES["enable_nested_tensor=False"])
    assert fused_calls["fused"] == te.VAL_BATCHES * te.LAYERS and fused_calls["nested"] == 0
    te.lightning_run(name="switch", **te.FIXES["torch.backends.mha.set_fastpath_enabled(False)"])
    assert fused_calls["fused"] == te.VAL_BATCHES * te.LAYERS


def test_dropping_autocast_changes_training_too(fixes):
    for name in ('precision="32-true" (the fp32 reference)', 'precision="bf16-true"'):
        assert fixes[name].details["train_context"]["autocast"] is False
    for name in ("fp32 island around the encoder", "enable_nested_tensor=False",
                 "torch.backends.mha.set_fastpath_enabled(False)"):
        assert fixes[name].details["train_context"]["autocast"] is True


def test_a_hand_written_layer_runs():
    """Section 5: 'writing your own layer' works (built from nn.MultiheadAttention, post-norm)."""
    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = torch.nn.MultiheadAttention(te.D_MODEL, te.NHEAD, batch_first=True)
            self.ff = torch.nn.Sequential(torch.nn.Linear(te.D_MODEL, te.FFN), torch.nn.ReLU(),
                                          torch.nn.Linear(te.FFN, te.D_MODEL))
            self.norm1, self.norm2 = torch.nn.LayerNorm(te.D_MODEL), torch.nn.LayerNorm(te.D_MODEL)

        def forward(self, x, pad):
            x = self.norm1(x + self.attn(x, x, x, key_padding_mask=pad, need_weights=False)[0])
            return self.norm2(x + self.ff(x))

    layers = torch.nn.ModuleList([Layer(), Layer()]).eval()
    h = torch.randn(4, te.MAX_LEN, te.D_MODEL)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for layer in layers:
            h = layer(h, RIGHT_PAD)
    assert torch.isfinite(h[~RIGHT_PAD]).all()  # it runs


def test_embeddings_come_out_in_fp32_under_autocast():
    """Section 5: the lesson's island needs no cast, since an embedding is no autocast op."""
    model = te.EncoderClassifier()
    tokens, pad, _ = te.make_data(1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model.embed(tokens).dtype == torch.float32
        assert te.EncoderClassifier(project=True).project(model.embed(tokens)).dtype == torch.bfloat16


# ------------------------------------------------------------------ the open exercises' answers
def test_open_exercise_1_pooling_over_all_positions(fused_calls):
    """With pool="all" the fp32 reference (nested path in validation: zeros at padded positions, values
    in training) moves ~0.03 away from the fixes that avoid the nested path; the fp32 island and
    bf16-true take the nested path too; fp32 without the fast path sides with the fixes."""
    runs = te.fix_runs(pool="all")
    assert fused_calls["nested"] == 3 * te.VAL_BATCHES  # 32-true, bf16-true, the island: one per batch
    assert te.fix_table(runs).column("within 0.001 of fp32") == ("yes", "no", "yes", "no", "no")
    ref = runs['precision="32-true" (the fp32 reference)'].loss
    slow = te.lightning_run("32-true", pool="all", fastpath=False).loss
    assert 0.02 < ref - slow < 0.05
    for name in ("enable_nested_tensor=False", "torch.backends.mha.set_fastpath_enabled(False)"):
        assert abs(runs[name].loss - slow) < 1e-3 and abs(runs[name].loss - ref) > 2e-2
    masked_fp32 = te.lightning_run("32-true").loss
    assert te.lightning_run("32-true", fastpath=False).loss == pytest.approx(masked_fp32, abs=1e-6)


def test_open_exercise_2_a_causal_mask_avoids_the_nested_path():
    out = te.encoder_call(causal=True)
    assert out.details == {"dtype": "bfloat16", "padded_zero": False}  # the fused kernel, not nested
    assert te.encoder_call(causal=True, mask="left").details == {"dtype": "bfloat16", "padded_zero": False}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        enc = te.make_encoder().eval()
        x = torch.randn(4, te.MAX_LEN, te.D_MODEL)
    causal = torch.ones(te.MAX_LEN, te.MAX_LEN, dtype=torch.bool).triu(1)
    with torch.no_grad(), te.fastpath_disabled():
        plain = enc(x, src_key_padding_mask=RIGHT_PAD)
        masked = enc(x, causal, src_key_padding_mask=RIGHT_PAD)
    real = ~RIGHT_PAD
    diff = (plain[real] - masked[real]).abs()
    assert diff.max() > 1 and diff.mean() > 0.1  # the model computes something else (1.23 and 0.18 here)


def test_open_exercise_3_an_island_without_the_cast_fails_in_the_first_training_step():
    out = te.lightning_run(project=True, fp32_island=True, cast=False)
    assert (out.error_type, out.message) == ("RuntimeError", "expected m1 and m2 to have the same dtype, but got: "
                                                             "c10::BFloat16 != float")
    assert out.details["train_steps"] == 0 and out.details["raised_in"] == "proj = linear(q, w, b)"
    fixed = te.lightning_run(project=True, fp32_island=True)
    assert not fixed.failed and abs(fixed.loss - te.lightning_run("32-true", project=True).loss) < 1e-3


# ------------------------------------------------------------------ the exercise checkers
@pytest.mark.parametrize("answer", [0, 0.0, "0", " 0 ", "0.0", "zero", "Zero", "none", "'0'", "no steps",
                                    "no training steps", torch.tensor(0), np.int64(0)])
def test_check_sanity_steps_right(answer):
    assert te.check_sanity_steps(answer).status == "right"


@pytest.mark.parametrize("answer", [8, "8", 2, 1, 16, False, True, "eight", "", "abc", [0], -1])
def test_check_sanity_steps_wrong(answer):
    result = te.check_sanity_steps(answer)
    assert result.status == "wrong" and str(result).startswith("✗ not quite: ")


YES = ["yes", "Yes", "YES", " yes ", "'yes'", '"Yes"', "yes.", "y", "true", True, np.bool_(True)]
NO = ["no", "No", "n", "false", False, np.bool_(False), "maybe", "", 1, 0, None.__class__]


@pytest.mark.parametrize("checker", [te.check_all_false_mask, te.check_fp32_fast_path, te.check_frozen_encoder])
def test_yes_checkers(checker):
    for answer in YES:
        assert checker(answer).status == "right", answer
    for answer in NO:
        result = checker(answer)
        assert result.status == "wrong" and str(result).startswith("✗ not quite: "), answer
    assert checker(None).status == "unanswered" and str(checker(None)).startswith("not answered yet")


@pytest.mark.parametrize("answer", ["bf16-true", "BF16-TRUE", " bf16-true ", 'precision="bf16-true"',
                                    "precision='bf16-true'", "precision = bf16-true", '"bf16-true"', "bf16 true",
                                    "bf16_true", "bf16true", "bf16-true."])
def test_check_furthest_fix_right(answer):
    assert te.check_furthest_fix(answer).status == "right"


@pytest.mark.parametrize("answer", ["fp32 island", "fp32 island around the encoder", "enable_nested_tensor=False",
                                    "torch.backends.mha.set_fastpath_enabled(False)", "32-true", "bf16-mixed",
                                    "bf16", "true", "", 16, True, ["bf16-true"]])
def test_check_furthest_fix_wrong(answer):
    result = te.check_furthest_fix(answer)
    assert result.status == "wrong" and str(result).startswith("✗ not quite: ")


def test_check_furthest_fix_names_the_run_that_is_furthest(fixes):
    """The checker's answer is the measured one: bf16-true is furthest from fp32."""
    ref = fixes['precision="32-true" (the fp32 reference)'].loss
    furthest = max((name for name in fixes if "32-true" not in name), key=lambda n: abs(fixes[n].loss - ref))
    assert te.check_furthest_fix(furthest) and furthest == 'precision="bf16-true"'


def test_checker_synonyms():
    for checker in (te.check_frozen_encoder, te.check_all_false_mask):
        for answer in ("crash", "crashes", "It crashes", "raises"):
            assert checker(answer), answer
        for answer in ("runs", "it runs", "no crash"):
            assert not checker(answer), answer
    for answer in ("it does", "the fast path", "Fast path"):
        assert te.check_fp32_fast_path(answer), answer
    assert not te.check_fp32_fast_path("slow path")
    assert te.check_sanity_steps(None).status == "unanswered"


def test_hints_do_not_give_the_answer_away():
    for checker, wrong in ((te.check_sanity_steps, 8), (te.check_fp32_fast_path, "no"),
                           (te.check_frozen_encoder, "no"), (te.check_all_false_mask, "no"),
                           (te.check_furthest_fix, "32-true")):
        hint = str(checker(wrong)).lower()
        assert "yes" not in hint.split() and " 0" not in hint and "zero" not in hint and "bf16-true" not in hint


# ------------------------------------------------------------------ arbitrary input
ANYTHING = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=True), st.text(max_size=8),
                     st.sampled_from([torch.bfloat16, np.bool_(True), [], {}, "masked", "all", "fit", "test",
                                      "predict", 1.5, float("inf")]))


@settings(max_examples=60, deadline=None)
@given(answer=st.one_of(ANYTHING, st.lists(st.integers(), max_size=3), st.binary(max_size=3),
                        st.complex_numbers(max_magnitude=3)))
def test_checkers_never_raise(answer):
    for checker in (te.check_sanity_steps, te.check_fp32_fast_path, te.check_frozen_encoder,
                    te.check_all_false_mask, te.check_furthest_fix):
        result = checker(answer)
        assert result.status in ("right", "wrong", "unanswered") and "\n" not in str(result)


def _one_line_refusal(exc):
    assert isinstance(exc, (TypeError, ValueError)) and str(exc).strip() and "\n" not in str(exc)


@settings(max_examples=60, deadline=None)
@given(kwargs=st.dictionaries(st.sampled_from(["nested", "fp32_island", "cast", "project", "pool"]), ANYTHING,
                              max_size=3))
def test_encoder_classifier_builds_or_refuses(kwargs):
    try:
        model = te.EncoderClassifier(**kwargs)
    except Exception as exc:  # noqa: BLE001 - the property: a one-line TypeError/ValueError
        _one_line_refusal(exc)
        return
    tokens, pad, _ = te.make_data(1, batch_size=2)
    assert model(tokens, pad).shape == (2, te.CLASSES)


@settings(max_examples=40, deadline=None)
@given(kwargs=st.dictionaries(st.sampled_from(["frozen", "causal", "train", "grad", "mask", "autocast"]), ANYTHING,
                              max_size=3))
def test_encoder_call_answers_or_refuses(kwargs):
    try:
        out = te.encoder_call(**kwargs)
    except Exception as exc:  # noqa: BLE001
        _one_line_refusal(exc)
        return
    assert out.failed or out.details["dtype"] in ("float32", "bfloat16", "float16")


@settings(max_examples=40, deadline=None)
@given(device=st.one_of(ANYTHING, st.sampled_from(["cpu", "cpu:0", "cuda", "cuda:0", "cuda:99", "meta", "mps",
                                                   "gpu", torch.device("cpu"), torch.device("meta")])))
def test_the_device_argument_answers_or_refuses(device):
    try:
        out = te.encoder_call(device=device, autocast=None)
    except Exception as exc:  # noqa: BLE001
        _one_line_refusal(exc)
        return
    assert out.details == {"dtype": "float32", "padded_zero": True}


@settings(max_examples=25, deadline=None)
@given(kwargs=st.dictionaries(st.sampled_from(["cast", "project", "pool", "stage", "sanity_steps"]), ANYTHING,
                              min_size=1, max_size=2))
def test_lightning_run_answers_or_refuses(kwargs):
    try:
        out = te.lightning_run(**kwargs)
    except Exception as exc:  # noqa: BLE001
        _one_line_refusal(exc)
        return
    assert out.failed or out.loss > 0


def test_fix_runs_refuses_an_unknown_pool():
    for pool in ("mean", None, 1, True):
        with pytest.raises(ValueError, match="pool must be 'masked'"):
            te.fix_runs(pool)
