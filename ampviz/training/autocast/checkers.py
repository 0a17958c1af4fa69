"""The exercise checkers of lesson 03 (autocast); each expected answer comes from a real run.

``check_softmax_dtype``, ``check_sum_loss_step``, ``check_casts_inside_outer``,
``check_round_up_share`` and ``check_stochastic_rounding`` (the last two measure with
``ampviz.training.bf16.rounding_statistics``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ampviz.checks import Check, _number_text, _said, check
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


def check_round_up_share(answer, value: float = 3.01) -> Check:
    """Q: stochastic rounding sends ``value`` (as float32) to one of its two bf16 neighbours: with
    what probability to the upper one? (within 0.005; the neighbours from torch's bf16 cast and
    ``nextafter``, as ``ampviz.training.bf16.rounding_statistics`` finds them)."""
    from ampviz.training.bf16 import rounding_statistics

    expected = rounding_statistics([value], draws=1).checks[0].expected
    return check(answer, expected, tol=0.005,
                 hint="bf16 keeps 8 significant bits, so between 2 and 4 its numbers are 2^-6 apart; the chance "
                      "of the upper neighbour is the distance from the lower one divided by that gap")


#: Bit patterns ``check_stochastic_rounding`` also rounds: NaNs with payloads (the quiet NaN torch
#: makes, a signalling one, the largest negative one), +inf, -inf, +0 and -0.
_SPECIAL_BITS = (0x7FC00000, 0x7F800001, 0x7FBFFFFF, 0xFFFFFFFF, 0x7F800000, 0xFF800000, 0x00000000, 0x80000000)


def _special_values_kept(fn):
    """True if ``fn`` keeps every NaN NaN and returns ±inf and ±0 unchanged (200 draws each), else a hint."""
    bits = torch.tensor([b - (1 << 32) if b >= 1 << 31 else b for b in _SPECIAL_BITS], dtype=torch.int32)
    x = bits.view(torch.float32).repeat(200)
    try:
        out = fn(x, torch.Generator().manual_seed(1))
        nan = torch.isnan(x)
        kept = bool(torch.isnan(out[nan]).all()) and bool(
            torch.equal(out[~nan].view(torch.int16).to(torch.int32) & 0xFFFF,
                        (x[~nan].view(torch.int32) >> 16) & 0xFFFF))
    except Exception as exc:  # noqa: BLE001 - the learner's function on NaN and inf
        return f"your function raised {type(exc).__name__} on NaN or inf: {' '.join(str(exc).split())[:80]}"
    return True if kept else ("NaN must stay NaN and ±inf, ±0 unchanged: the bit trick can carry a NaN's bits into "
                              "inf or a number (torch.where(torch.isnan(x), ...))")


def check_stochastic_rounding(answer) -> Check:
    """Q: write ``f(x, generator)``: a float32 tensor rounded stochastically to bfloat16, drawing
    its random numbers from ``generator``. The answer is the function; the checker runs the
    statistical test of ``ampviz.training.bf16.rounding_statistics`` on it (eleven values, 20,000 draws
    each: only the two neighbours, unbiased within 5 sigmas, exact values unchanged), then rounds
    NaNs (with payloads, whose bit patterns the trick can carry into inf or a number), ±inf and
    ±0 200 times each, with a hint for the way it fails."""
    from ampviz.training.bf16 import rounding_statistics

    if answer is None or answer is Ellipsis:
        return check(answer, None)
    if not callable(answer) or isinstance(answer, type):
        return Check("wrong", "✗ not quite: set answer = your function itself (no call, no quotes)")
    try:
        stats = rounding_statistics(rounding=answer)
    except Exception as exc:  # noqa: BLE001 - whatever the learner's function does is an answer
        first = " ".join(str(exc).split("\n")[0].split())[:120]
        if first.startswith("rounding must return a bfloat16 tensor"):
            return Check("wrong", "✗ not quite: return a bfloat16 tensor of x's shape "
                                  "(.to(torch.bfloat16) at the end)")
        return Check("wrong", f"✗ not quite: your function raised {type(exc).__name__}: {first}")
    if stats.passed:
        special = _special_values_kept(answer)
        if special is True:
            return Check("right", "✓ correct")
        return Check("wrong", f"✗ not quite: {special}")
    if not all(c.neighbours_only for c in stats.checks):
        return Check("wrong", "✗ not quite: some results are not one of the value's two bf16 neighbours (or an "
                              "exact bf16 value moved): the random number must stay below 2^16")
    negative = [c.passed for c in stats.checks if c.value < 0]
    positive = [c.passed for c in stats.checks if c.value >= 0]
    if all(positive) and not all(negative):
        return Check("wrong", "✗ not quite: right for positive values, biased for negative ones: a float32's bits "
                              "hold the magnitude apart from the sign")
    return Check("wrong", "✗ not quite: biased: the mean result is not the value; round up with probability "
                          "(distance to the lower neighbour) / (gap), e.g. 16 random bits added to the low 16 bits")
