"""The exercise checkers of lesson 03a (autocast); each expected answer comes from a real run.

``check_softmax_dtype``, ``check_sum_loss_step``, ``check_casts_inside_outer``, and the questions
that ask why. Lesson 03b's (bf16) are in ``ampviz.training.bf16.checkers``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ampviz.checks import Check, Choice, _number_text, _said, check
from ampviz.pitfalls import autocast_cache
from ampviz.training.autocast.dispatch import SHORT
from ampviz.training.autocast.loss import loss_report
from ampviz.training.autocast.weight_cache import weight_casts

# --------------------------------------------------------------------------------------------
# Exercise checkers (the expected answers come from real runs)
# --------------------------------------------------------------------------------------------

#: How a learner may write each dtype (text is folded: case, quotes and spaces ignored).
_DTYPE_WORDS = {
    "fp16": {"fp16", "float16", "half", "torch.float16", "torch.half", "f16"},
    "bf16": {"bf16", "bfloat16", "torch.bfloat16", "brain float", "bfloat"},
    "fp32": {"fp32", "float32", "float", "single", "torch.float32", "torch.float", "f32"},
}


def _dtype_said(answer) -> str | None:
    """A dtype answer as "fp16", "bf16" or "fp32" (a torch dtype or text), else None."""
    if isinstance(answer, torch.dtype):
        return SHORT.get(answer)
    if not isinstance(answer, str):
        return None
    said = " ".join(answer.strip().strip("'\"").strip().rstrip(".").casefold().split())
    return next((k for k, words in _DTYPE_WORDS.items() if said in words), None)


def check_softmax_dtype(answer, dtype="float16") -> Check:
    """Q: under ``torch.autocast("cpu", dtype=dtype)``, ``torch.softmax`` of a Linear layer's
    output: which dtype comes out? Measured by running it (CPU autocast has no rule for softmax,
    so it runs in the dtype the Linear gave it; CUDA autocast would run it in float32)."""
    dt = autocast_cache._autocast_dtype(dtype)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        lin, x = nn.Linear(8, 4), torch.randn(4, 8)
    with torch.autocast("cpu", dtype=dt):
        expected = SHORT[torch.softmax(lin(x), dim=-1).dtype]
    return check(answer, expected, accept=lambda a: _dtype_said(a) == expected,
                 hint="which dtype does the Linear hand to softmax, and is softmax on CPU autocast's lists at all? "
                      '(answer with a dtype: "fp16", "fp32" or torch.float16, ...)')


def check_sum_loss_step(answer) -> Check:
    """Q: ``loss_report``'s model and batch with ``F.mse_loss(output, target, reduction="sum")``
    instead of the mean, fp16 CPU autocast, GradScaler at 65536: does step 1 "run" or is it
    "skipped"? Measured with ``loss_report``."""
    skipped = loss_report("mse_loss(reduction='sum')").step_skipped
    words = ({"skipped", "skip", "skips", "it is skipped", "it's skipped", "skipped step"} if skipped
             else {"runs", "run", "ran", "it runs", "it runs", "step runs"})
    return check(answer, "skipped" if skipped else "runs", accept=lambda a: _said(a) in words,
                 hint="the loss is fp32 either way; how large is d(loss)/d(output) × 65536 with a sum over 24 "
                      "outputs instead of their mean, and in which dtype does that gradient enter the output? "
                      '(answer "runs" or "skipped")')


def check_casts_inside_outer(answer) -> Check:
    """Q: a function runs two forwards of a Linear, each in its own fp16 autocast block (two casts
    of the weight when called on its own); called from inside the caller's own autocast block, how
    many casts of the weight does it make? Measured with ``weight_casts`` inside an outer block."""
    with torch.autocast("cpu", dtype=torch.float16):
        expected = weight_casts("separate_blocks", "float16").weight_casts
    return check(answer, expected, accept=lambda a: _whole_answer(a) == expected,
                 hint="the cache is emptied when which autocast block exits: the inner ones, or the outermost?")


def _whole_answer(answer):
    if isinstance(answer, bool) or answer is None:
        return None
    if isinstance(answer, str):
        answer = _number_text(answer)
    try:
        value = float(answer)
    except (TypeError, ValueError, OverflowError):
        return None
    return int(value) if math.isfinite(value) and value == int(value) else None


# --------------------------------------------------------------------------------------------
# Questions that ask why (each right reason is measured in lesson 03a)
# --------------------------------------------------------------------------------------------

WHY_SOFTMAX_DTYPE = Choice(
    "why_softmax_dtype",
    "After a Linear layer, softmax runs in fp16 under CPU autocast and in fp32 under CUDA autocast. Why?",
    {"a": "the CPU has no fp32 softmax kernel",
     "b": "CPU and CUDA autocast keep separate lists: softmax is on CUDA's fp32 list and on no CPU list, "
          "so on the CPU it runs in the dtype it is given, the Linear's fp16",
     "c": "autocast casts every op's output to the autocast dtype, and CUDA casts it back for softmax"},
    "b",
    {"a": "section 2's table runs softmax on fp32 inputs on the CPU: it comes out fp32, as its input",
     "c": "autocast casts inputs, not outputs: the losses come out fp32 on both devices (section 2's table)"},
)

WHY_STALE_COPY = Choice(
    "why_stale_copy",
    "Inside one fp16 autocast block: y1 = lin(x), then lin.weight.add_(1) under torch.no_grad(), then "
    "y2 = lin(x). y2 is computed with the old weight. Why?",
    {"a": "an update made under no_grad only takes effect when the block exits",
     "b": "autocast keeps the fp16 copy of the weight made by the first forward and hands it out again "
          "until the outermost block exits; nothing compares it with the weight",
     "c": "adding 1 is less than half an fp16 step of the weight, so the update rounds away",
     "d": "autograd keeps the old weight for the backward pass, and the forward reads it from there"},
    "b",
    {"a": "the fp32 weight changes at once: with cache_enabled=False the same update is seen (section 4's table)",
     "c": "the same update is seen in a fresh block, with cache_enabled=False or after clear_autocast_cache() "
          "(section 4's table): it is not lost to rounding",
     "d": "a frozen weight (requires_grad_(False)) is not cached, and its second forward sees the update "
          "(section 4's table)"},
)


check_why_softmax_dtype = WHY_SOFTMAX_DTYPE.checker()


check_why_stale_copy = WHY_STALE_COPY.checker()
