"""The exercise checkers of lesson 03b (bf16 in practice): ``check_round_up_share``,
``check_stochastic_rounding`` (both measure with ``rounding_statistics``), and the questions that
ask why.
"""

from __future__ import annotations

import torch

from ampviz.checks import Check, Choice, check
from ampviz.training.bf16.rounding_stats import rounding_statistics


def check_round_up_share(answer, value: float = 3.01) -> Check:
    """Q: stochastic rounding sends ``value`` (as float32) to one of its two bf16 neighbours: with
    what probability to the upper one? (within 0.005; the neighbours from torch's bf16 cast and
    ``nextafter``, as ``ampviz.training.bf16.rounding_statistics`` finds them)."""
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


# --------------------------------------------------------------------------------------------
# Questions that ask why (each right reason is measured in lesson 03b)
# --------------------------------------------------------------------------------------------

WHY_BF16_NO_SCALER = Choice(
    "why_bf16_no_scaler",
    "At scale 1, fp16 flushes about 97% of the beam model's layer-output gradients to 0, bf16 none. Why?",
    {"a": "bf16 keeps more significant bits than fp16",
     "b": "bf16 has fp32's 8 exponent bits: its smallest normal number is 2^-126, so gradients far below "
          "fp16's 2^-24 are ordinary bf16 numbers",
     "c": "bf16 autocast scales the loss by itself"},
    "b",
    {"a": "bf16 keeps 8 significant bits, fp16 11: bf16 is the less precise of the two",
     "c": "nothing scales the loss: section 1 casts the gradients at scale 1 and bf16 loses none"},
)

WHY_BF16_STALLS = Choice(
    "why_bf16_stalls",
    "The run with bf16 weights stops learning at step 71 while the fp32 run goes on. Why?",
    {"a": "its gradients underflow to 0 in bf16",
     "b": "each update (learning rate × gradient) is below half the gap between the weight and its bf16 "
          "neighbour, so w.add_(u) rounds back to w",
     "c": "its forward pass overflows in bf16",
     "d": "the learning rate is too large for bf16: a smaller one would not stall"},
    "b",
    {"a": "bf16 has fp32's range (section 1): the updates are not 0, they are lost when added to the weight (section 3)",
     "c": "section 2's network, which overflows fp16, stays within 1% of fp32 in bf16; this model is small",
     "d": "a smaller learning rate makes every update smaller, so more of them are lost: it stalls later, "
          "at a higher loss (open exercise 1)"},
)

WHY_TF32_ERROR = Choice(
    "why_tf32_error",
    "In section 5, TF32's error on the layer is about 8 times smaller than bf16's. Why?",
    {"a": "TF32 sums the products in higher precision than bf16",
     "b": "TF32 keeps 10 mantissa bits to bf16's 7: each input is rounded to a step 2^3 = 8 times finer",
     "c": "TF32 has more exponent bits than bf16"},
    "b",
    {"a": "section 5 sums every mode's products exactly and rounds the result once to float32: the modes "
          "differ only in how their inputs are rounded",
     "c": "TF32 and bf16 both have fp32's 8 exponent bits (section 5's format table): the same range"},
)


check_why_bf16_no_scaler = WHY_BF16_NO_SCALER.checker()


check_why_bf16_stalls = WHY_BF16_STALLS.checker()


check_why_tf32_error = WHY_TF32_ERROR.checker()
