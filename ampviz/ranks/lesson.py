"""Notebooks 11a's and 11b's exercise checkers (``check_*``): each expected answer comes from the simulator or
the compress-hook model, which the tests hold to real runs.
"""

from __future__ import annotations

import re

import numpy as np

from ampviz.checks import Check, Choice, _number_text, _said, check
from ampviz.ranks.reduce_precision import simulate_compress_hook
from ampviz.ranks.simulator import simulate_ranks
from ampviz.scaling import TorchGradScaler

def check_ddp_skips(answer) -> Check:
    """Q: DDP + GradScaler("cpu"), 4 ranks; only rank 3's backward overflows, at step 1
    (``["....", "....", "....", ".x.."]``). How many ranks skip step 1?"""
    trace = simulate_ranks(TorchGradScaler(init_scale=1024), found_inf=["....", "....", "....", ".x.."], mode="ddp")
    return check(answer, int(trace.found_inf[:, 1].sum()),
                 hint="DDP all-reduces the gradients during backward, before any rank's unscale_ looks at them")


def check_local_scales(answer) -> Check:
    """Q: a scaler per rank on gradients never all-reduced, from 1024 with ``growth_interval=2``,
    2 ranks, overflows ``["x...", "...."]``: each rank's scale after the last step, as
    ``(rank 0, rank 1)``."""
    trace = simulate_ranks(TorchGradScaler(init_scale=1024, growth_interval=2), found_inf=["x...", "...."],
                           mode="local")
    expected = tuple(float(s) for s in trace.final_scale)

    def accept(a) -> bool:
        if isinstance(a, str) or not hasattr(a, "__len__") or len(a) != len(expected):
            return False
        got = [_number_text(v) if isinstance(v, str) else v for v in a]
        return all(not isinstance(g, (str, bool, np.bool_)) and float(g) == e for g, e in zip(got, expected))

    return check(answer, expected, accept=accept,
                 hint="walk each rank on its own: an overflow halves its scale and resets its count; "
                      "2 clean steps in a row double it")


def check_found_inf_op(answer) -> Check:
    """Q: sharded gradients on gloo; the ranks' found_inf flags are ``[0, 1, 0, 0]`` and each rank
    all-reduces its flag before the step. Which of "sum", "max", "min" and "avg" does *not* make
    every rank skip? (Real gloo gives 1, 1, 0 and 0.25 on every rank: only "min" leaves 0.) Torch's
    own ``dist.ReduceOp.MIN``, or its name as text, counts too."""
    import torch.distributed as dist

    if answer is None or answer is Ellipsis:
        return check(answer, "min")
    if isinstance(answer, (dist.ReduceOp, dist.ReduceOp.RedOpType)):  # torch's own, e.g. dist.ReduceOp.MIN
        answer = "min" if answer == dist.ReduceOp.MIN else "not min"
    said = _said(answer)
    ok = said is not None and re.fullmatch(r"((torch\.distributed|dist)\.)?(reduceop\.)?(redoptype\.|op\.)?min", said)
    if ok:
        return Check("right", "✓ correct")
    return Check("wrong", "✗ not quite: all-reduce [0, 1, 0, 0] with each op in your head: a rank skips "
                          "when its flag is not 0; which op gives every rank 0?")


def _share_text(a):
    if isinstance(a, str) and a.strip().endswith("%"):
        v = _number_text(a.strip()[:-1])
        return v / 100 if isinstance(v, float) else a
    return _number_text(a) if isinstance(a, str) else a


def check_compress_share(answer) -> Check:
    """Q: ``fp16_compress_hook`` at 8 ranks, gradients ~ N(0, 1), scale 40,000: what share of the
    all-reduced gradient entries is not finite? (within 0.02; 0.3 or "30%")"""
    sim = simulate_compress_hook("fp16", world_size=8, steps=1, length=16_384)
    expected = float(sim.nonfinite[0] / sim.length)

    def accept(a) -> bool:
        v = _share_text(a)
        return not isinstance(v, (str, bool, np.bool_)) and abs(float(v) - expected) <= 0.02

    return check(answer, expected, accept=accept,
                 hint="one rank's entry is finite after the cast when |40,000 g| <= 65,504; an element of "
                      "the sum is finite only if it is finite on every rank")


# --------------------------------------------------------------------------------------------
# Questions that ask why (11a: the scalers across ranks; 11b: the all-reduce's numerics)
# --------------------------------------------------------------------------------------------

WHY_DDP_AGREE = Choice(
    "why_ddp_agree",
    "Under DDP with a GradScaler per rank, only rank 1's backward overflows at step 2, yet all four "
    "ranks skip step 2. Why?",
    {"a": "DDP sends rank 0's found_inf flag to every rank",
     "b": "DDP all-reduces the gradients during backward(), before unscale_ checks them: every scaler "
          "checks the same summed gradients, and one inf in the sum is an inf on every rank",
     "c": "GradScaler all-reduces its found_inf flag over the process group by itself"},
    "b",
    {"a": "rank 0's own gradients were finite at step 2 (section 1's table): the skip follows rank 1's overflow",
     "c": "a plain GradScaler shares nothing: with gradients that are never all-reduced, each rank skips "
          "only its own overflow (section 2a)"},
)

WHY_FSDP1_HALF_STEP = Choice(
    "why_fsdp1_half_step",
    "FSDP1 with a plain GradScaler: an inf reaches rank 0's shard at step 2; rank 0 skips and rank 1 "
    "steps. Why does rank 1's scaler not see the inf?",
    {"a": "after the reduce-scatter each rank holds and checks only its own shard of the gradients, "
          "and a plain GradScaler does not share its flag",
     "b": "rank 1's scale is lower, so the same gradient does not overflow there",
     "c": "the reduce-scatter drops non-finite values before they reach rank 1",
     "d": "FSDP1 casts the gradients to fp32, which turns an inf back into a number"},
    "a",
    {"b": "both ranks hold the same scale until step 2's update (section 2c's table)",
     "c": "nothing is dropped: rank 0's shard holds the inf, and with ShardedGradScaler both ranks skip",
     "d": "an inf cast to fp32 stays inf: casting up changes no value"},
)

WHY_RING_ORDER = Choice(
    "why_ring_order",
    "Summing the same four ranks' gradients in bf16 in rank order instead of gloo's ring order "
    "changes about a third of the results. Why?",
    {"a": "floating-point addition is not associative: each add rounds, so another order rounds "
          "at other points and can end on other bits",
     "b": "the ring order drops small gradients that rank order keeps",
     "c": "gloo sums in fp32 and rounds once to bf16 at the end, the rank-order model after every add"},
    "a",
    {"b": "both orders keep every gradient: the errors are roundings, and grow alike with the ranks (section 1)",
     "c": "summing once and rounding once is the floor (\"once\"): it does not match gloo either, "
          "while the ring order, rounding after every add, matches it bit for bit"},
)

WHY_COMPRESS_SKIPS = Choice(
    "why_compress_skips",
    "Under GradScaler, fp16_compress_hook makes steps skip that DDP's fp32 all-reduce never skips. Why?",
    {"a": "fp16 keeps fewer mantissa bits, and the rounding errors of the sum grow into inf",
     "b": "the hook casts the scaled gradients to fp16 before it divides by the world size, so every "
          "scaled gradient above 65,504 on any rank becomes inf",
     "c": "the fp16 sum over the ranks overflows, although every rank's own gradients fit in fp16",
     "d": "the hook divides first, and the small gradients it makes underflow"},
    "b",
    {"a": "rounding errors are relative, a few parts in 10^4: they make no inf; the range does",
     "c": "the entries that become inf are those with |40,000 g| > 65,504 on some rank (1 − 0.9^ranks of "
          "them, section 2): each rank's cast makes the inf, before any sum",
     "d": "underflow gives zeros, not infs, and the hook casts before it divides"},
)


check_why_ddp_agree = WHY_DDP_AGREE.checker()


check_why_fsdp1_half_step = WHY_FSDP1_HALF_STEP.checker()


check_why_ring_order = WHY_RING_ORDER.checker()


check_why_compress_skips = WHY_COMPRESS_SKIPS.checker()
