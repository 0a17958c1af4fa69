"""Lesson 04's exercise checkers (``ampviz.checks.check``), and the model answer of its training-step exercise.

* ``check_backoffs_to_zero``, ``check_skip_test``, ``check_clip_before_unscale``,
  ``check_scale_after_pattern``: one question each, the expected answer measured or simulated.
* ``check_why_clip_after_unscale``, ``check_why_check_before_step``, ``check_why_scale_reaches_zero``:
  questions that ask why (``ampviz.checks.Choice``), each right reason measured by a report here.
* ``amp_step_reference``: one correct fp16 AMP training step; ``check_amp_loop`` runs the learner's
  own step beside it (through ``_SpyScaler``, a GradScaler that counts its calls) and names what
  is missing.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from ampviz.checks import Check, Choice, check, check_choice
from ampviz.scaling import TorchGradScaler, simulate
from ampviz.training.gradscaler.runs import found_inf_from
from ampviz.training.gradscaler.unscale import clipping_norms


# --------------------------------------------------------------------------------------------
# Exercise checkers
# --------------------------------------------------------------------------------------------


_UNREADABLE = object()


def _as_answer(answer):
    """The answer as ``check`` reads it: a one-element tensor is its value; an answer that float()
    cannot read without an error or a warning (an int beyond float's range, a complex or meta
    tensor) is unreadable, hence wrong. Text, None and other objects pass as they are."""
    if isinstance(answer, torch.Tensor):
        if answer.numel() != 1 or answer.is_complex() or answer.device.type == "meta":
            return _UNREADABLE
        return answer.detach().reshape(()).item()
    if answer is None or isinstance(answer, str):
        return answer
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            float(answer)
    except (TypeError, ValueError):
        return answer  # check() finds it wrong
    except Exception:  # noqa: BLE001 - OverflowError, a warning, an odd __float__: never the checker's error
        return _UNREADABLE
    return answer


def _check(answer, expected, **kwargs) -> Check:
    answer = _as_answer(answer)
    if answer is _UNREADABLE:
        return check(answer, expected, accept=lambda a: False, hint=kwargs.get("hint", ""))
    return check(answer, expected, **kwargs)


def check_backoffs_to_zero(answer) -> Check:
    """Q: how many overflowing steps in a row take torch's default scale 2^16 to exactly 0."""
    trace = simulate(TorchGradScaler(), found_inf=np.ones(400, bool))
    after = np.append(trace.scale[1:], trace.final.scale)
    return _check(answer, int(np.flatnonzero(after == 0)[0]) + 1,
                 hint="16 halvings reach 1, 126 more the smallest normal float32, "
                      "and float32 has subnormals below that")


def check_skip_test(answer) -> Check:
    """Q: which test detects a skipped step: (a) ``if not scaler.step(opt):`` or (b)
    ``scaler.get_scale() < scale_before`` after ``update()``."""
    return check(answer, "b", accept=lambda a: isinstance(a, str) and a.strip().strip("()").casefold() == "b",
                 hint="what does scaler.step(opt) return for a step SGD did take?")


def check_clip_before_unscale(answer, max_norm: float = 1.0, init_scale: float = 2.0**16) -> Check:
    """Q: clipping to ``max_norm`` *before* ``unscale_`` at scale ``init_scale``: the gradient norm
    the optimizer applies (within 1%), measured by a real GradScaler iteration."""
    expected = clipping_norms(unscale_first=False, max_norm=max_norm, init_scale=init_scale)["applied"]
    return _check(answer, expected, tol=0.01 * abs(expected),
                 hint="clip_grad_norm_ brings the scaled norm to max_norm; then step() divides by the scale")


def check_scale_after_pattern(answer, pattern: str = "..x....", growth_interval: int = 3) -> Check:
    """Q: torch's scaler from 2^16 with ``growth_interval``, over the steps of ``pattern`` (``x``
    overflows, ``.`` is clean): the scale after the last ``update()`` (as ``simulate`` and the real
    GradScaler give it)."""
    trace = simulate(TorchGradScaler(growth_interval=growth_interval), found_inf=found_inf_from(pattern))
    return _check(answer, trace.final.scale,
                 hint="walk the steps: an overflow halves S and sets the tracker to 0; a clean step adds 1, "
                      "and the scale doubles when the tracker reaches growth_interval (then it is 0 again)")


# --------------------------------------------------------------------------------------------
# Questions that ask why (each right reason is a checked output of lesson 04)
# --------------------------------------------------------------------------------------------

WHY_CLIP_AFTER_UNSCALE = Choice(
    "why_clip_after_unscale",
    "Why must scaler.unscale_(optimizer) come before clip_grad_norm_?",
    {"a": "clip_grad_norm_ needs float32 gradients, and until unscale_ they are fp16",
     "b": "until unscale_ the gradients are S·g: clipping compares a norm S times too large with max_norm "
          "and cuts them, and step() then divides them by S",
     "c": "scaler.step() raises an error when the gradients were clipped before unscale_"},
    "b",
    {"a": "the gradients are float32 all along: section 1's, before unscale_, are [196608, -262144], far "
          "beyond fp16's largest value",
     "c": "section 6's wrong order raised nothing and warned nothing: it ran, and applied a gradient of norm 2^-16"},
)

WHY_CHECK_BEFORE_STEP = Choice(
    "why_check_before_step",
    "Why does the scaler look for inf and NaN before it calls optimizer.step(), rather than after?",
    {"a": "optimizer.step() raises an error on an inf gradient, and the check avoids that error",
     "b": "a step taken with an inf or NaN gradient makes the weights inf or NaN; found before, the step "
          "is simply not taken and the weights stay as they were",
     "c": "so that update() can lower the scale and the same step can be redone at the new scale"},
    "b",
    {"a": "section 3's optimizer stepped on an inf gradient with no error: the weight became -inf",
     "c": "nothing is redone: section 2's iteration ends with w still [3, -4] and only the scale halved; "
          "the next iteration brings new gradients"},
)

WHY_SCALE_REACHES_ZERO = Choice(
    "why_scale_reaches_zero",
    "Why is the scale exactly 0 after 166 overflows in a row from 2^16?",
    {"a": "update() sets the scale to 0 after too many overflows in a row, to stop training",
     "b": "float32 flushes subnormal numbers to 0, so the scale is 0 once it falls below 2^-126",
     "c": "each overflow halves it and there is no floor: 165 halvings reach 2^-149, float32's smallest "
          "subnormal, and half of that is a tie that rounds to the even neighbour, 0"},
    "c",
    {"a": "update() only multiplies by backoff_factor: section 4's table halves the scale at every step, "
          "2^-147, 2^-148, 2^-149, then 0",
     "b": "section 4's table shows subnormal scales, 2^-146 to 2^-149, which float32 keeps: the scale is 0 "
          "only one halving after 2^-149"},
)


def check_why_clip_after_unscale(answer) -> Check:
    """Q: why clipping goes after ``unscale_``: (b), the scaled norm is S times too large
    (``clipping_table``)."""
    return check_choice(answer, WHY_CLIP_AFTER_UNSCALE)


def check_why_check_before_step(answer) -> Check:
    """Q: why the inf check comes before ``optimizer.step()``: (b), a step on an inf gradient ruins the
    weights (``unscale_overflow_table``), a skipped one leaves them (``walk_iteration(overflow=True)``)."""
    return check_choice(answer, WHY_CHECK_BEFORE_STEP)


def check_why_scale_reaches_zero(answer) -> Check:
    """Q: why 166 overflows take 2^16 to exactly 0: (c), halving with no floor through float32's
    subnormals, and 2^-150 ties to 0 (``run_real_scaler``)."""
    return check_choice(answer, WHY_SCALE_REACHES_ZERO)


# --------------------------------------------------------------------------------------------
# The learner's own training step
# --------------------------------------------------------------------------------------------

def amp_step_reference(model, optimizer, scaler, x, y):
    """One correct fp16 AMP training step on the CPU (the model answer of notebook 04's exercise):
    zero the gradients, forward and loss under autocast, backward from the scaled loss, step
    through the scaler, update the scale once."""
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = torch.nn.functional.mse_loss(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss


class _SpyScaler(torch.amp.GradScaler):
    """A real GradScaler that counts the calls made to it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = {"scale": 0, "unscale_": 0, "step": 0, "update": 0}

    def scale(self, outputs):
        self.calls["scale"] += 1
        return super().scale(outputs)

    def unscale_(self, optimizer):
        self.calls["unscale_"] += 1
        return super().unscale_(optimizer)

    def step(self, optimizer, *args, **kwargs):
        self.calls["step"] += 1
        return super().step(optimizer, *args, **kwargs)

    def update(self, new_scale=None):
        self.calls["update"] += 1
        return super().update(new_scale)


#: The loop check: 6 iterations; the batch of iteration 2 is so large that its fp16 forward pass
#: overflows (outputs past 65504), so a correct step skips it and halves the scale; growth every
#: 2 clean steps, so the scale also grows within the run.
LOOP_ITERATIONS, LOOP_OVERFLOW_AT = 6, 2


def _loop_run(train_step):
    """(weights after each iteration, scale after each iteration, the spy, autocast seen) for
    ``train_step`` on a fresh seeded model; exceptions propagate."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        gen = torch.Generator().manual_seed(1)
        batches = [(torch.randn(8, 4, generator=gen), torch.randn(8, 2, generator=gen))
                   for _ in range(LOOP_ITERATIONS)]
    x, y = batches[LOOP_OVERFLOW_AT]
    batches[LOOP_OVERFLOW_AT] = (x * 1e6, y)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = _SpyScaler("cpu", init_scale=2.0**16, growth_interval=2)
    seen = {"autocast": False, "forwards": 0}

    def hook(module, args, output):
        seen["forwards"] += 1
        seen["autocast"] |= torch.is_autocast_enabled("cpu") and output.dtype == torch.float16

    handle = model.register_forward_hook(hook)
    weights, scales, updates = [], [], []
    try:
        for x, y in batches:
            before = scaler.calls["update"]
            train_step(model, optimizer, scaler, x, y)
            updates.append(scaler.calls["update"] - before)
            weights.append(torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()]))
            scales.append(scaler.get_scale())
    finally:
        handle.remove()
    return weights, scales, scaler, seen, updates


def check_amp_loop(answer) -> Check:
    """Q: write ``train_step(model, optimizer, scaler, x, y)``, one fp16 AMP training step with
    ``torch.amp.GradScaler`` (the loss: ``mse_loss(model(x), y)``). The checker trains a small model
    with it for 6 iterations, one of which overflows in fp16, beside ``amp_step_reference``, and
    compares the weights and the scale after every iteration, bit for bit; a wrong step gets one
    line that names what is missing."""
    if answer is None or answer is Ellipsis:
        return check(None, None)
    if not callable(answer):
        return Check("wrong", "✗ not quite: set answer = train_step, the function itself (no call, no quotes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            weights, scales, scaler, seen, updates = _loop_run(answer)
    except Exception as exc:  # noqa: BLE001 - whatever the learner's step raises is the verdict
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        return Check("wrong", f"✗ not quite: train_step raised {type(exc).__name__}: {first}")
    ref_weights, ref_scales, *_ = _loop_run(amp_step_reference)
    calls = scaler.calls
    if seen["forwards"] == 0:
        return Check("wrong", "✗ not quite: train_step never ran the model: compute the loss from model(x)")
    if not seen["autocast"]:
        return Check("wrong", '✗ not quite: the forward pass did not run under torch.autocast("cpu", '
                              "dtype=torch.float16), so nothing ran in fp16")
    if calls["scale"] == 0:
        return Check("wrong", "✗ not quite: the loss was never scaled: backward from scaler.scale(loss), "
                              "not from loss")
    if calls["step"] == 0:
        return Check("wrong", "✗ not quite: step through the scaler, scaler.step(optimizer): it unscales the "
                              "gradients and skips a step whose gradients overflowed")
    if any(n != 1 for n in updates):
        return Check("wrong", "✗ not quite: call scaler.update() exactly once per iteration, after "
                              "scaler.step(optimizer)")
    for i, (w, r) in enumerate(zip(weights, ref_weights)):
        if not torch.equal(w, r) or scales[i] != ref_scales[i]:
            if i == LOOP_OVERFLOW_AT:
                hint = ("the iteration whose fp16 forward pass overflowed changed the weights: let "
                        "scaler.step(optimizer) decide whether to step, it skips such a step")
            else:
                hint = "are the gradients zeroed (optimizer.zero_grad()) in every iteration?"
            return Check("wrong", f"✗ not quite: after iteration {i} the weights or the scale differ from a "
                                  f"correct step: {hint}")
    return Check("right", "✓ correct")
