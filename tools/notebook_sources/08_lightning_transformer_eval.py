"""Source of notebooks/08_lightning_transformer_eval.ipynb (built by tools/build_notebooks.py)."""

from build_notebooks import code, md

CELLS = [
    md("""
    # 08 · Lightning pitfall: a TransformerEncoder that trains in bf16 and crashes in validation

    Under `precision="bf16-mixed"` every training step runs, and the first validation batch raises.
    Why only validation, exactly when, and which fixes really work.

    You will be able to:
    - reproduce the crash in a real `Trainer` and name every condition it needs,
    - tell the current error message from the old one that write-ups quote,
    - choose a fix, and say what it costs compared with fp32.
    """),
    code("""
    import torch

    from ampviz.lessons import check_left_padding_crash, check_local_fix
    from ampviz.pitfalls import versions
    from ampviz.pitfalls.transformer_eval import (condition_table, crash, encoder_call, fix_runs,
                                                  fix_table, old_message)

    torch.manual_seed(0)
    torch.set_num_threads(1)
    versions()
    """),
    md("""
    ## 1. The crash, in a real Trainer

    The model is small: token embedding plus position embedding, an `nn.TransformerEncoder`
    (2 layers, `batch_first=True`, defaults otherwise) called with a `src_key_padding_mask` for
    right-padded sequences, a mean over the real positions, a linear head. `crash()` trains it for
    one epoch of 8 SGD steps under `precision="bf16-mixed"` (no sanity-check validation) and then
    lets Lightning validate:
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    out = crash("bf16-mixed")
    print(f"{out.error_type}: {out.message}")
    print("training steps done:", out.details["train_steps"], "| validation batches done:", out.details["val_batches"])
    print("raised in:", out.details["raised_in"])
    print("validation ran with:", out.details["val_context"])
    """),
    md("""
    Notice:
    - All 8 training steps ran; the very first validation batch raised, inside
      `torch._transformer_encoder_layer_fwd`, the fused "fast path" of the encoder layer.
    - Validation differs from training in exactly two ways here: eval mode and no gradients
      (`no_grad` during `fit`; `trainer.validate/test/predict` use `inference_mode`). Autocast is on
      in both.
    - `"16-mixed"` on the CPU is turned into `"bf16-mixed"` by Lightning 2.6 (with only a warning),
      so it gives the same message. Real fp16 autocast, through the `MixedPrecision("16-mixed", "cpu")`
      plugin, says `Half` instead:
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    for precision, stage in [("16-mixed", "fit"), ("16-mixed-fp16", "fit"), ("bf16-mixed", "validate")]:
        out = crash(precision, stage=stage)
        print(f"{precision:14} {stage:9} inference_mode={out.details['val_context']['inference_mode']!s:5}  "
              f"{out.error_type}: {out.message}")
    """),
    md("""
    ## 2. Exactly when: one condition off at a time

    The same encoder call in plain torch, no Lightning: a fresh fp32 encoder in eval mode, under
    `no_grad` and CPU autocast in bf16, on a right-padded batch with its padding mask. Each row
    changes one thing:
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    condition_table()
    """),
    md("""
    Notice:
    - It crashes only when all of these hold: eval mode, grad disabled (`no_grad` *or*
      `inference_mode`), `nn.TransformerEncoder` with `enable_nested_tensor=True` (the default),
      the fast path enabled, a padding mask (even one with no padding in it), right padding,
      `batch_first=True`, `norm_first=False`, and CPU autocast (bf16 or fp16).
    - With those, the encoder packs the padded batch into a **nested tensor** and each layer runs the
      fused kernel; its LayerNorm then receives bf16 activations and fp32 weights. A single
      `TransformerEncoderLayer` called directly packs nothing and runs; a one-layer *encoder* still crashes.
    - On CUDA the encoder skips the fast path under autocast. On the CPU it does not: its check,
      `torch.is_autocast_enabled()` without a device, looks at CUDA only.
    - The output dtype differs between paths (bf16 or fp32). The fast path also leaves zeros at padded
      positions where the slow path leaves values: pool with the mask, never over all positions.
    """),
    md("""
    ## 3. The message you will find when you search

    Older torch failed on the same path with a different message, and most write-ups quote that one.
    It was fixed upstream (pytorch/pytorch#132613), so on this torch you only see it by calling the op
    that used to receive the mixed dtypes, a fused `bias + input @ weight` with a bf16 input and fp32 weights:
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    print(old_message())
    """),
    md("""
    Notice: searching for `mat1 and mat2 must have the same dtype` finds the old bug; the current one
    reads `expected scalar type Float but found BFloat16`. Same cause (a fused kernel fed bf16
    activations and fp32 weights), different op, different text.
    """),
    md("""
    ## 4. The fixes, each with its validation loss

    Each fix trains the same seeded model on the same data, then validates. The reference is fp32
    (`precision="32-true"`):
    - `precision="bf16-true"`: weights, activations and optimizer state all in bf16, no autocast;
    - an **fp32 island**: `with torch.autocast(device_type, enabled=False): h = encoder(h.float(), ...)`;
    - `enable_nested_tensor=False` on the encoder;
    - `torch.backends.mha.set_fastpath_enabled(False)` around the run (and restored afterwards: it is a
      global switch).
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    runs = fix_runs()
    fix_table(runs)
    """),
    md("""
    The exact losses on this machine (after training, they differ from one CPU to another in the
    fourth decimal, so this output is not checked; the verdicts above are):
    """),
    code("""
    fix_table(runs, exact=True)
    """),
    md("""
    Notice:
    - Every fix validates. None of the bf16 ones gives *exactly* fp32's loss: training under bf16
      autocast already moved the weights a little differently. The three bf16-mixed fixes stay within
      1e-3 of fp32; `bf16-true` is further off, because its weights themselves are bf16 (7 mantissa
      bits), and their updates are rounded to bf16 too.
    - `32-true` and `bf16-true` avoid the crash by dropping autocast, so they change all of training,
      not just validation.
    - The two targeted fixes change only the encoder's path and keep bf16-mixed everywhere else:
      `enable_nested_tensor=False` is local to one module; `set_fastpath_enabled(False)` is global
      ("write your own encoder layer" amounts to the same thing).
    """),
    md("""
    ## 5. What the usual advice gets wrong or leaves out

    - Write-ups quote `mat1 and mat2 must have the same dtype, but got BFloat16 and Float`; torch 2.13
      prints `expected scalar type Float but found BFloat16` (or `... Half`), so a search for the old
      text finds an already fixed bug.
    - Their fixes (`bf16-true`, `32-true`, an fp32 island, writing your own layer) work, but are broader
      than needed; the two one-line fixes, `enable_nested_tensor=False` and
      `torch.backends.mha.set_fastpath_enabled(False)`, are not mentioned.
    - An fp32 island needs both parts: autocast off *and* `h.float()`. Here the embeddings are fp32
      already, but when the encoder's input comes out of an autocast op (a Linear projection, say) it is
      bf16, and without the cast the encoder fails again (`expected m1 and m2 to have the same dtype`).
    - "It's fixed, it doesn't happen on my GPU": CUDA skips the fast path under autocast, the CPU does not.
    - Upstream: Lightning-AI/pytorch-lightning#19980; pytorch/pytorch#132613, #107663, #82783 (PR #84722).
    """),
    md("""
    ## Try it

    Switch conditions yourself: `encoder_call` takes `train`, `grad` ("no_grad", "inference_mode",
    "enabled"), `nested`, `fastpath`, `mask` ("right", "left", "all-false", "none"), `batch_first`,
    `norm_first`, `layers`, `layer_only` and `autocast` (a dtype or `None`). Try two changes at once:
    """),
    code("""
    print(encoder_call(mask="left", grad="inference_mode"))
    print(encoder_call(autocast=torch.float16, layers=1))
    """),
    md("""
    ## Check yourself
    """),
    code("""
    # Under precision="bf16-mixed" on the CPU, does this crash?  model.eval(); with torch.no_grad(): model(x, pad)
    # but with a left-padded mask. Answer "yes" or "no".
    answer = None
    check_left_padding_crash(answer)
    """),
    code("""
    # Which of the fixes keeps bf16-mixed training and changes nothing outside one module?
    # Answer "nested" (enable_nested_tensor=False), "fastpath" (set_fastpath_enabled(False)) or "bf16-true".
    answer = None
    check_local_fix(answer)
    """),
    md("""
    The lesson's claims, checked on this machine's torch and lightning:
    """),
    code("""
    assert crash().message == "expected scalar type Float but found BFloat16"
    assert encoder_call(train=True).error_type is None and encoder_call(grad="enabled").error_type is None
    assert encoder_call(nested=False).error_type is None and encoder_call(fastpath=False).error_type is None
    assert old_message().message == "mat1 and mat2 must have the same dtype, but got BFloat16 and Float"
    ref = runs['precision="32-true" (the fp32 reference)'].loss
    assert all(not out.failed for out in runs.values())
    assert all(abs(out.loss - ref) < 1e-3 for name, out in runs.items() if "bf16-true" not in name)
    assert abs(runs['precision="bf16-true"'].loss - ref) < 2e-2
    assert torch.backends.mha.get_fastpath_enabled()  # the global switch was restored
    print("all claims hold")
    """),
    md("""
    ## Summary

    - Under CPU autocast, `nn.TransformerEncoder` in eval mode without gradients packs a right-padded
      batch into a nested tensor and runs a fused kernel that rejects bf16 activations with fp32
      weights: training works, validation crashes with `expected scalar type Float but found BFloat16`.
    - The message older write-ups quote (`mat1 and mat2 must have the same dtype ...`) belongs to an
      already fixed op.
    - Fix it locally with `enable_nested_tensor=False` (or globally with
      `torch.backends.mha.set_fastpath_enabled(False)`, restored afterwards); `bf16-true`, `32-true` and
      an fp32 island also work but change more. Expect a validation loss close to fp32's, not equal.

    **Next:** that was the last lesson. The map of the whole course is in
    [Start here: mixed-precision training, made visible](00_start_here.ipynb).

    **Open exercises**
    1. Call `crash("bf16-mixed", stage="validate")` and find, in `details["val_context"]`, the one
       difference from validation during `fit`. Why does it not matter for this bug?
    2. Remove the masked pooling from `EncoderClassifier.forward` (mean over all positions) and compare
       the validation loss of the `enable_nested_tensor=False` fix with the fp32 island's.
    3. Put an `nn.Linear(16, 16)` projection before the encoder and build an fp32 island with autocast
       off but *without* `h.float()`: which op fails, and why did the model in this lesson not need the cast?
    """),
]


# The exercise cells (code cells that set `answer = None`), each found by a phrase only it contains:
# (a correct answer, a plausible wrong one), as source text. tests/test_exercises.py runs both.
SOLUTIONS = {
    "with a left-padded mask": ('"no"', '"yes"'),
    "changes nothing outside one module": ('"nested"', '"fastpath"'),
}
