"""Stochastic rounding to bf16, the real one and four plausible wrong ones.

``stochastic_round_bf16``: add 16 random bits to the low half of the fp32 bit pattern and cut them
off (unbiased: on average it returns its input). ``ROUNDINGS`` names it beside round to nearest,
15 and 17 random bits, and a sign-blind version, which ``rounding_stats`` tests.
"""

from __future__ import annotations

import torch

from ampviz.training.bf16.arguments import _float32_tensor, _generator

# --------------------------------------------------------------------------------------------
# Stochastic rounding
# --------------------------------------------------------------------------------------------


def stochastic_round_bf16(x, generator) -> torch.Tensor:
    """``x`` (a float32 tensor) rounded to bfloat16 stochastically: each value goes to one of its
    two bf16 neighbours, to the one farther from zero with probability equal to the value's
    distance from the nearer one divided by the gap between them, so the rounding is unbiased: on
    average it returns ``x``.

    How: a bf16 value is an fp32 value whose low 16 bits are 0. Add a random integer from 0 to
    65535 (drawn from ``generator`` with ``torch.randint``) to the fp32 bit pattern and clear the
    low 16 bits: the pattern carries into bit 16 exactly when the random number is at least 65536
    minus the low bits, that is with probability (low bits) / 65536, the value's position in the
    gap. The pattern holds the magnitude apart from the sign, so negative values round
    symmetrically (away from zero with the same probability); subnormals and the step from one
    binade to the next need nothing special (the patterns keep counting up); the addition never
    reaches the sign bit. Values that are already bf16 (low bits 0), ±0 and ±inf are returned
    unchanged; NaN stays NaN. A finite value beyond bf16's largest (3.3895e38, up to fp32's
    3.4028e38) becomes inf with probability proportional to its distance past it, inf standing
    where 2^128 would be (as in round to nearest, which gives inf from halfway there).

    ``generator``: a ``torch.Generator`` on x's device; one draw per element, in x's row-major
    order. The result has x's shape, is a new tensor and carries no gradient.
    """
    x = _float32_tensor("x", x)
    gen = _generator(generator, x.device)
    x = x.detach().contiguous()
    noise = torch.randint(0, 1 << 16, x.shape, generator=gen, dtype=torch.int32, device=x.device)
    bits = (x.view(torch.int32) + noise) & -65536  # -65536 is 0xFFFF0000 as an int32
    rounded = bits.view(torch.float32).to(torch.bfloat16)  # exact: the low 16 bits are 0
    return torch.where(torch.isnan(x), x.to(torch.bfloat16), rounded)


def _round_to_nearest(x, generator) -> torch.Tensor:
    """A wrong stochastic rounding: torch's round to nearest (ties to even), no randomness."""
    return _float32_tensor("x", x).detach().to(torch.bfloat16)


def _fifteen_bits(x, generator) -> torch.Tensor:
    """A wrong stochastic rounding: 15 random bits instead of 16 (rounds up too rarely)."""
    x = _float32_tensor("x", x).detach().contiguous()
    gen = _generator(generator, x.device)
    noise = torch.randint(0, 1 << 15, x.shape, generator=gen, dtype=torch.int32, device=x.device)
    rounded = ((x.view(torch.int32) + noise) & -65536).view(torch.float32).to(torch.bfloat16)
    return torch.where(torch.isnan(x), x.to(torch.bfloat16), rounded)


def _seventeen_bits(x, generator) -> torch.Tensor:
    """A wrong stochastic rounding: 17 random bits instead of 16 (can carry twice: two steps up,
    and it moves values that are already bf16)."""
    x = _float32_tensor("x", x).detach().contiguous()
    gen = _generator(generator, x.device)
    noise = torch.randint(0, 1 << 17, x.shape, generator=gen, dtype=torch.int32, device=x.device)
    rounded = ((x.view(torch.int32) + noise) & -65536).view(torch.float32).to(torch.bfloat16)
    return torch.where(torch.isfinite(x), rounded, x.to(torch.bfloat16))


def _sign_blind(x, generator) -> torch.Tensor:
    """A wrong stochastic rounding: floating-point arithmetic that takes the step between the
    neighbours as positive, so a negative value's share of the step is negative and it always
    rounds toward zero (right on positive values)."""
    x = _float32_tensor("x", x).detach().contiguous()
    gen = _generator(generator, x.device)
    low = (x.view(torch.int32) & -65536).view(torch.float32)  # truncated toward zero
    step = ((low.view(torch.int32) + 65536).view(torch.float32) - low).abs()
    share = (x.double() - low.double()) / step.double()
    up = torch.rand(x.shape, generator=gen, dtype=torch.float64, device=x.device) < share
    rounded = torch.where(up, low + step, low).to(torch.bfloat16)
    return torch.where(torch.isfinite(x), rounded, x.to(torch.bfloat16))


#: Rounding functions ``rounding_statistics`` and ``variant_table`` test, by name: the real one
#: and four plausible wrong ones (``f(x, generator)``: float32 tensor -> bfloat16 tensor).
ROUNDINGS = {
    "stochastic": stochastic_round_bf16,
    "round to nearest": _round_to_nearest,
    "15 random bits": _fifteen_bits,
    "17 random bits": _seventeen_bits,
    "sign-blind": _sign_blind,
}
