"""Source of notebooks/07_lightning_autocast_cache.ipynb (built by tools/build_notebooks.py)."""

from build_notebooks import code, md

CELLS = [
    md("""
    # 07 · Lightning pitfall: a `no_grad` pass inside autocast, then a pass with grad

    Why an extra forward pass under `torch.no_grad()` once cost some layers their gradients, why it
    no longer does on the versions this course pins, and what to write if your code must also run
    on older ones.

    You will be able to:
    - tell from the installed torch and Lightning whether the autocast weight cache can bite,
    - recognise the legacy failure: the exact `RuntimeError`, and its silent variant where a layer
      simply stops learning,
    - pick a fix that works everywhere, and say why re-entering autocast is not one inside Lightning.
    """),
    code("""
    import torch

    from ampviz.lessons import check_cache_call, check_layer_without_grad, check_nested_autocast
    from ampviz.pitfalls.autocast_cache import (SimulatedLegacyAutocastCache, fix_table, make_model,
                                                real_lightning, real_plain, simulated_lightning,
                                                simulated_plain, summary, which_world, world)

    torch.manual_seed(0)
    torch.set_num_threads(1)
    """),
    md("""
    ## 1. Which world are you in?

    The pattern is common: inside `training_step`, a forward pass under `torch.no_grad()` (a target
    network, an EMA model, a metric), then the forward pass whose loss is trained, both inside the
    autocast that `precision="bf16-mixed"` (or `"16-mixed"`) puts around the step. Whether that
    trains depends on the versions. `which_world()` finds out by trying, not by reading version numbers:
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    print(which_world())
    """),
    md("""
    ## 2. On the installed versions it works

    The pattern in plain torch, with a Linear → ReLU → Linear model and with a Linear → LayerNorm
    model; `summary` names each parameter and whether `backward()` gave it a `.grad`:

    ```python
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.no_grad():
            model(x)                        # the extra pass
        loss = F.mse_loss(model(x), y)      # the pass that trains
    loss.backward()
    ```
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    print(summary(real_plain("linear")))
    print(summary(real_plain("layernorm")))
    """),
    md("""
    And inside a real `Trainer(precision="bf16-mixed")`, with the same two passes in
    `training_step`; the module also records what it saw of autocast during the step:
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    lit = real_lightning("linear")
    print(summary(lit))
    print(lit.details["seen in training_step"])
    """),
    md("""
    Notice: every parameter has a gradient, and inside Lightning's step the autocast **cache is
    disabled**. Two independent changes made this safe:
    - **torch**: the autocast cache now always makes its cached casts with grad enabled, and skips
      caching in inference mode (pytorch/pytorch PR #165068, fixing #158232).
    - **Lightning ≥ 2.6.0**: the precision plugin enters `torch.autocast(..., cache_enabled=False)`
      (Lightning PR #20921, fixing #20644). Master has since restored caching with a clear when a
      no-grad block exits (PR #21616, after the memory regression #21611); 2.6.6 does not have it.

    Either change alone prevents the failure. Older stacks had neither: Lightning issues #17949
    (closed as won't fix), #19517, #19810, #20251; torch issues #65766, #105211, #112583.
    """),
    md("""
    ## 3. A simulation of the legacy rule

    What follows is **not** the installed library. `SimulatedLegacyAutocastCache` is a
    `torch.overrides.TorchFunctionMode` that applies the **old** caching rule (torch's former
    `cached_cast`) to `F.linear`, so the failure can be seen on any version. The rule: under CPU
    autocast, the cast of an argument is kept and reused when the target is the autocast dtype and
    the source is an fp32 **leaf that requires grad** and is not a view (a parameter, in practice),
    with the cache enabled. The cache is emptied only when the **outermost** autocast exits (or by
    `torch.clear_autocast_cache()`). A cast made under `no_grad` has no `grad_fn`, and the grad pass
    reuses it. The same pattern as above, under the simulation:
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    print(summary(simulated_plain("linear")))
    """),
    md("""
    Notice: this is the historical message. It is raised by `backward()` when **every** path from
    the loss to a trainable tensor passes through a cached cast: the loss then has no `grad_fn` at all.
    When some path avoids the linear layers, nothing is raised. Linear → LayerNorm (on the CPU,
    autocast runs `layer_norm` without casting its weights):
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    print(summary(simulated_plain("layernorm")))
    """),
    md("""
    Notice: the loss has a `grad_fn` through the LayerNorm, so `backward()` succeeds, the LayerNorm
    learns, and the Linear layer's `.grad` stays `None`. The optimizer skips parameters without a
    gradient, so that layer silently keeps its initial weights. This variant is the worse one.

    The same in a real `Trainer`, under the simulation. A `MixedPrecision` plugin whose forward
    context enters autocast with `cache_enabled=True` recreates Lightning ≤ 2.5; the installed
    plugin (`cache_enabled=False`) is shown for comparison:
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    print(summary(simulated_lightning("linear", plugin="legacy")))
    print(summary(simulated_lightning("layernorm", plugin="legacy")))
    print(summary(simulated_lightning("linear", plugin="installed")))
    """),
    md("""
    ## 4. The fixes, under the simulation

    Each arrangement of the two passes, under the simulated legacy rule:
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    print(fix_table("linear"))
    print()
    print(fix_table("layernorm"))
    """),
    md("""
    Notice:
    - **Fix 1 works everywhere**: turn autocast off for the no-grad pass, and nothing is cast or cached there:
      ```python
      with torch.no_grad(), torch.autocast(device_type="cpu", enabled=False):   # "cuda" on a GPU
          target = target_net(x)
      ```
    - **Fix 2**, "re-enter autocast for the grad pass", works only when that autocast is top-level.
      Nested inside an outer autocast, as in a Lightning `training_step`, the cache survives the
      inner block (it is cleared only at the outermost exit), and the failure stays.
    - **Fix 3**: no cache (`cache_enabled=False`, what Lightning ≥ 2.6 does) or
      `torch.clear_autocast_cache()` between the passes. Or upgrade torch or Lightning.
    - Running the grad pass first is also safe: its cached casts carry grad.
    """),
    md("""
    ## Try it

    Write the two passes your own way under the simulation, and see which parameters get a
    gradient. Try a different order, `cache_enabled=False`, a nested `torch.autocast`, or a
    `torch.clear_autocast_cache()` between the passes:
    """),
    code("""
    model = make_model("layernorm")
    x, y = torch.randn(32, 8), torch.randn(32, 4)
    with SimulatedLegacyAutocastCache() as sim:           # the simulated legacy rule
        with torch.autocast("cpu", dtype=torch.bfloat16):
            with torch.no_grad():
                model(x)
            loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
    print("casts reused from the cache:", sim.hits)
    print({name: p.grad is not None for name, p in model.named_parameters()})
    """),
    md("""
    ## Check yourself
    """),
    code("""
    # Legacy rule, inside Lightning <= 2.5's autocast: does wrapping the grad pass in its own
    # torch.autocast(...) give every parameter its gradient? Answer "yes" or "no".
    answer = None
    check_nested_autocast(answer)
    """),
    code("""
    # Legacy rule, Linear -> LayerNorm: which layer's weight keeps .grad = None? "linear" or "layernorm"
    answer = None
    check_layer_without_grad(answer)
    """),
    code("""
    # Name a torch function to call between the two passes that makes the legacy rule harmless.
    answer = None
    check_cache_call(answer)
    """),
    md("""
    The lesson's claims, checked:
    """),
    code("""
    error = "RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn"
    assert world()["torch: grad pass after a no_grad pass gets gradients"]  # the installed torch is fixed
    assert world()["lightning bf16-mixed autocast cache_enabled"] is False  # so is the installed Lightning
    assert None not in real_plain("linear").grad_norms.values()
    assert None not in lit.grad_norms.values() and not lit.details["seen in training_step"]["autocast cache enabled"]
    assert summary(simulated_plain("linear")).endswith(error)  # the simulation: the error ...
    silent = simulated_plain("layernorm").grad_norms  # ... and the silent variant
    assert silent["0.weight"] is None and silent["1.weight"] is not None
    assert summary(simulated_lightning("linear", plugin="legacy")).endswith(error)
    for fix in ("autocast_off_in_no_grad", "reenter_top_level", "cache_disabled", "clear_cache"):
        assert simulated_plain("linear", fix).grad_norms == real_plain("linear").grad_norms, fix
    assert summary(simulated_plain("linear", "reenter_nested")).endswith(error)  # nested re-entry fails
    print("all claims hold")
    """),
    md("""
    ## Summary

    - On torch with PR #165068 (this course's 2.13) and on Lightning ≥ 2.6.0, a `no_grad` pass then
      a grad pass inside one autocast trains correctly: cached casts carry grad, and Lightning's
      autocast does not cache.
    - Under the legacy rule, casts of parameters made in the `no_grad` pass were reused by the grad
      pass until the outermost autocast exited. If every path to a trainable tensor went through
      them: `RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn`.
      Otherwise, silently, some layers got no gradient.
    - Portable fix: `with torch.no_grad(), torch.autocast(device_type, enabled=False):` for the
      extra pass. `cache_enabled=False` or `torch.clear_autocast_cache()` also work; re-entering
      autocast works only at the top level.

    **Next:**
    [08 · Lightning pitfall: a TransformerEncoder that trains in bf16 and crashes in validation](08_lightning_transformer_eval.ipynb).

    **Open exercises**
    1. In *Try it*, put the grad pass first and the `no_grad` pass second. How many casts are reused
       from the cache, and do all parameters get a gradient? Why is this order safe?
    2. Replace `torch.no_grad()` by `torch.inference_mode()` in *Try it*. Does anything change under
       the simulated legacy rule? Today's torch skips caching in inference mode altogether: why is
       that a safe choice?
    3. Build a model in which the simulation raises no error but **two** layers get no gradient.
    4. `SimulatedLegacyAutocastCache` applies the rule to `F.linear` only. Which other ops did the
       real legacy cache affect on the GPU, and how would you extend the simulation to `F.conv2d`?
    """),
]


# The exercise cells (code cells that set `answer = None`), each found by a phrase only it contains:
# (a correct answer, a plausible wrong one), as source text. tests/test_exercises.py runs both.
SOLUTIONS = {
    "wrapping the grad pass": ('"no"', '"yes"'),
    "which layer's weight keeps .grad = None": ('"linear"', '"layernorm"'),
    "Name a torch function": ('"torch.clear_autocast_cache()"', '"torch.cuda.empty_cache()"'),
}
