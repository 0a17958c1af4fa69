"""Notebook 11's exercise checkers (``check_*``): each expected answer comes from the simulator or
the compress-hook model, which the tests hold to real runs.
"""

from __future__ import annotations

import re

import numpy as np

from ampviz.checks import Check, _number_text, _said, check
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
