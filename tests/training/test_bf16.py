"""bf16 in practice (``ampviz.training.bf16``), measured with real torch and checked against independent
references: the numpy core (``ampviz.formats.BF16``, ``ampviz.formats.lesson.add``/``update_lost``,
``ampviz.formats.census``), torch's own casts, and a second evaluation path (forward hooks). Each check is
shown to fail on a plausible wrong variant.

* stochastic rounding: only the two bf16 neighbours (Hypothesis over arbitrary float32 bit
  patterns), the carry happens exactly when the noise reaches 65536 minus the low bits (replayed
  from a cloned generator), NaN/inf/overflow, and the statistical test (``rounding_statistics``),
  which the real rounding passes and round-to-nearest, 15 and 17 random bits, a sign-blind
  version and a version without the NaN guard fail;
* Kahan summation: ``kahan_add_`` bit for bit against the numpy core, and on a long accumulation;
* the lost-update runs: every step of every run replayed with the numpy core, the stall of the
  bf16 run, and the three fixes;
* the beam's gradients in fp16 and bf16, and the network that overflows in fp16;
* every public function driven with arbitrary arguments (Hypothesis);
* the figures do not depend on torch's thread count (1 and 2 threads, bit for bit).
"""

import contextlib
import math
import os
import signal

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from ampviz.training import bf16 as B
from ampviz.formats.census import census
from ampviz.formats import BF16, FP16
from ampviz.text import Table
from ampviz.formats.lesson import add, update_lost

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BF16_MAX = float(torch.finfo(torch.bfloat16).max)


def f32(bits) -> torch.Tensor:
    """float32 values from their bit patterns (unsigned 32-bit integers)."""
    return torch.from_numpy(np.asarray(bits, dtype=np.uint64).astype(np.uint32).view(np.float32).copy())


def core_neighbours(v: float):
    """(lower, upper): the bf16 values around v, from the numpy core's round-to-nearest and
    ``neighbours`` (independent of any bit trick); (v, v) for a bf16 value; inf past the max."""
    q = float(BF16.quantize(v))
    if q == v:
        return q, q
    if q < v:
        return q, BF16.neighbours(q)[1]
    return BF16.neighbours(q)[0], q


# ============================================================================================
# Stochastic rounding
# ============================================================================================


def unguarded(x, generator):
    """A wrong variant: the bit trick without the NaN guard."""
    noise = torch.randint(0, 1 << 16, x.shape, generator=generator, dtype=torch.int32)
    return ((x.view(torch.int32) + noise) & -65536).view(torch.float32).to(torch.bfloat16)


def only_neighbours(rounding, x: torch.Tensor, seed=0) -> bool:
    """Every result is NaN for NaN, else one of the value's two bf16 neighbours (the numpy core's)."""
    out = rounding(x, torch.Generator().manual_seed(seed)).double().tolist()
    for v, r in zip(x.double().tolist(), out):
        if math.isnan(v):
            if not math.isnan(r):
                return False
            continue
        if r not in core_neighbours(v):
            return False
    return True


SPECIAL_BITS = [0x00000000, 0x80000000, 0x3F800000, 0xBF800000, 0x3F800001, 0x3F80FFFF, 0x3F7FFFFF, 0xBF7FFFFF,
                0x00000001, 0x8000FFFF, 0x0000FFFF, 0x007FFFFF, 0x7F7F0000, 0x7F7F0001, 0x7F7FFFFF, 0xFF7FFFFF,
                0x7F800000, 0xFF800000, 0x7F800001, 0x7FC00000, 0x7FFFFFFF, 0xFF800001, 0xFFFFFFFF]


@settings(max_examples=60, deadline=None)
@given(bits=st.lists(st.one_of(st.integers(0, 2**32 - 1), st.sampled_from(SPECIAL_BITS)), min_size=1, max_size=64),
       seed=st.integers(0, 2**32))
def test_stochastic_rounding_gives_one_of_the_two_neighbours(bits, seed):
    x = f32(bits)
    assert only_neighbours(B.stochastic_round_bf16, x, seed)
    out = B.stochastic_round_bf16(x, torch.Generator().manual_seed(seed))
    assert out.dtype == torch.bfloat16 and out.shape == x.shape
    exact = (np.asarray(bits, dtype=np.uint64) & 0xFFFF) == 0  # already bf16 (±0, ±inf too): unchanged, bit for bit
    out_bits = out.view(torch.int16).numpy().astype(np.uint16).astype(np.uint64)
    same = out_bits == (np.asarray(bits, dtype=np.uint64) >> 16)
    assert same[exact & ~torch.isnan(x).numpy()].all()


def test_the_neighbour_check_catches_wrong_roundings():
    x = f32(SPECIAL_BITS + [0x3F800000 + k * 997 for k in range(200)])
    assert only_neighbours(B.stochastic_round_bf16, x)
    assert not only_neighbours(B.ROUNDINGS["17 random bits"], x)  # carries twice
    assert not only_neighbours(unguarded, x)  # NaN 0x7F800001 becomes inf, 0xFFFFFFFF a number


def test_nan_inf_and_zeros():
    x = f32([0x7FC00000, 0x7F800001, 0x7FFFFFFF, 0xFFFFFFFF, 0xFF800001, 0x7F800000, 0xFF800000, 0, 0x80000000])
    x = x.repeat(500)
    out = B.stochastic_round_bf16(x, torch.Generator().manual_seed(1)).float()
    assert torch.isnan(out[torch.isnan(x)]).all()
    keep = ~torch.isnan(x)
    assert torch.equal(out[keep].view(torch.int32), x[keep].view(torch.int32))  # ±inf, ±0 bit for bit
    wrong = unguarded(x, torch.Generator().manual_seed(1)).float()
    assert not torch.isnan(wrong[torch.isnan(x)]).all()


def test_the_carry_happens_exactly_when_the_noise_reaches_the_rest_of_the_gap():
    """Replay the documented draws (``torch.randint(0, 65536, x.shape, int32)``, row-major) from a
    clone of the generator: the result is the upper neighbour exactly when noise >= 65536 - low bits."""
    rng = np.random.default_rng(0)
    bits = np.concatenate([rng.integers(0, 0x7F7FFFFF, 50_000), rng.integers(0x80000000, 0xFF7FFFFF, 50_000),
                           np.array(SPECIAL_BITS[:16])]).astype(np.uint64)
    x = f32(bits)
    gen = torch.Generator().manual_seed(5)
    replay = torch.Generator().manual_seed(5)
    out = B.stochastic_round_bf16(x, gen)
    noise = torch.randint(0, 1 << 16, x.shape, generator=replay, dtype=torch.int32).numpy().astype(np.uint64)
    low = bits & 0xFFFF
    up = noise >= 65536 - low
    # the magnitude's upper 15 bits go up by one step exactly then (the sign bit stays)
    expected = (bits >> 16) + up.astype(np.uint64)
    got = out.view(torch.int16).numpy().astype(np.uint16).astype(np.uint64)
    assert np.array_equal(got, expected)
    assert torch.equal(gen.get_state(), replay.get_state())  # one draw per element, no more
    wrong = B.ROUNDINGS["15 random bits"](x, torch.Generator().manual_seed(5))
    assert not np.array_equal(wrong.view(torch.int16).numpy().astype(np.uint16).astype(np.uint64), expected)


def test_overflow_rounds_to_inf_in_proportion_to_the_distance_past_the_max():
    # between bf16's max (0x7F7F0000) and fp32's max: the neighbours are max and inf (2^128's place)
    bits = [0x7F7F4000, 0x7F7FC000, 0xFF7F4000]
    stats = B.rounding_statistics([BF16_MAX], draws=10)  # the max itself: exact
    assert stats.passed and stats.checks[0].share_up == 0
    draws = 40_000
    x = f32(bits).repeat_interleave(draws)

    def in_proportion(rounding) -> bool:
        out = rounding(x, torch.Generator().manual_seed(3)).float().reshape(3, draws)
        for row, p, sign in zip(out, (0.25, 0.75, 0.25), (1, 1, -1)):
            share = float(torch.isinf(row).float().mean())
            if not (set(row.tolist()) <= {sign * BF16_MAX, sign * math.inf}
                    and abs(share - p) <= 5 * math.sqrt(p * (1 - p) / draws)):
                return False
        return True

    assert in_proportion(B.stochastic_round_bf16)
    assert not in_proportion(B.ROUNDINGS["round to nearest"])  # max, inf, -max every time
    assert not in_proportion(B.ROUNDINGS["15 random bits"])


def test_stochastic_rounding_passes_the_statistical_test():
    stats = B.rounding_statistics()
    assert stats.passed, B.rounding_table(stats)
    assert len(stats.checks) == len(B.DEFAULT_VALUES)
    for c in stats.checks:
        assert (c.lower, c.upper) == core_neighbours(c.value)  # torch's neighbours = the numpy core's
        if c.lower != c.upper:
            assert c.expected == (c.value - c.lower) / (c.upper - c.lower)
    # values spread over the range, both signs
    rng = np.random.default_rng(1)
    values = np.concatenate([rng.standard_normal(20), 10.0 ** rng.uniform(-40, 38, 20) * rng.choice([-1, 1], 20)])
    assert B.rounding_statistics(values.astype(np.float32), draws=20_000, seed=2).passed


@pytest.mark.parametrize("name, fails_on", [
    ("round to nearest", "bias"), ("15 random bits", "bias"), ("17 random bits", "neighbours"),
    ("sign-blind", "bias on negative values only"),
])
def test_wrong_roundings_fail_the_statistical_test(name, fails_on):
    stats = B.rounding_statistics(rounding=name)
    assert not stats.passed
    if fails_on == "neighbours":
        assert not all(c.neighbours_only for c in stats.checks)
        exact = next(c for c in stats.checks if c.lower == c.upper)
        assert not exact.passed  # it moves a value that is already bf16
    elif fails_on == "bias":
        assert all(c.neighbours_only for c in stats.checks)
        assert not all(c.unbiased for c in stats.checks)
    else:
        assert [c.passed for c in stats.checks] == [c.value >= 0 for c in stats.checks]


def test_the_statistic_itself():
    """Made-up roundings whose results are known: always the upper neighbour; the lower one for
    the first half of the draws and the upper one for the second half."""
    def upper(x, generator):
        lo = x.to(torch.bfloat16)
        return torch.where(lo.float() < x, torch.nextafter(lo, torch.full_like(lo, math.inf)), lo)

    def halves(x, generator):
        n = x.numel()
        lo = (x.view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)
        return torch.where(torch.arange(n) % 1000 < 500, lo, upper(x, generator))

    s = B.rounding_statistics([1 + 2.0**-8, 1 + 2.0**-9], upper, draws=1000)
    assert [c.share_up for c in s.checks] == [1.0, 1.0]
    assert [c.mean for c in s.checks] == [1 + 2.0**-7] * 2
    assert not s.passed and s.checks[0].neighbours_only
    h = B.rounding_statistics([1 + 2.0**-8], halves, draws=1000)
    assert h.checks[0].share_up == 0.5 and h.checks[0].mean == 1 + 2.0**-8 and h.passed
    assert not B.rounding_statistics([1 + 2.0**-9], halves, draws=1000).passed
    with pytest.raises(TypeError, match="^rounding must return a bfloat16 tensor"):
        B.rounding_statistics([1.5], lambda x, g: x, draws=10)


def test_variant_table_and_rounding_table():
    t = B.variant_table()
    assert t.column("rounding") == tuple(B.ROUNDINGS)
    assert t.column("verdict") == ("passes", "fails", "fails", "fails", "fails")
    assert t.column("only the two neighbours") == ("yes", "yes", "yes", "no", "yes")
    r = B.rounding_table(B.rounding_statistics(rounding="sign-blind"))
    assert r.column("verdict").count("biased") == 2 and set(r.column("verdict")) == {"ok", "biased"}
    assert len(r.rows) == len(B.DEFAULT_VALUES)


def test_seeded_and_global_rng_untouched():
    x = torch.linspace(-3, 3, 1001)
    before = torch.random.get_rng_state()
    a = B.stochastic_round_bf16(x, torch.Generator().manual_seed(7))
    b = B.stochastic_round_bf16(x, torch.Generator().manual_seed(7))
    B.lost_update_runs(steps=5)
    B.fp16_overflow(depth=2)
    B.overflow_model()
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    assert torch.equal(torch.random.get_rng_state(), before)


def test_one_line_errors_say_what_to_pass():
    g = torch.Generator().manual_seed(0)
    cases = [
        (lambda: B.stochastic_round_bf16([1.0], g), TypeError,
         "x must be a float32 tensor (e.g. torch.tensor([1.0]) or t.float()), not [1.0]"),
        (lambda: B.stochastic_round_bf16(torch.ones(2, dtype=torch.float64), g), TypeError,
         "x must be a float32 tensor, not a float64 tensor (pass x.float())"),
        (lambda: B.stochastic_round_bf16(torch.ones(2), 0), TypeError,
         "generator must be a torch.Generator (e.g. torch.Generator().manual_seed(0)), not 0"),
        (lambda: B.rounding_statistics([math.inf]), ValueError,
         "values must be finite and at most bf16's largest value (3.3895314e+38) in magnitude, once stored "
         "in float32"),
        (lambda: B.rounding_statistics(rounding="nearest"), ValueError,
         "rounding must be one of 'stochastic', 'round to nearest', '15 random bits', '17 random bits', "
         "'sign-blind' or a function f(x, generator), not 'nearest'"),
        (lambda: B.lost_update_runs(lr=0), ValueError, "lr must be a positive number such as 0.05, not 0.0"),
        (lambda: B.lost_update_runs(steps=5000, features=256), ValueError,
         "steps=5,000 x features=256 is 1,280,000 weights to keep per run; at most 250,000"),
        (lambda: B.kahan_add_(torch.ones(2, dtype=torch.bfloat16), torch.zeros(3, dtype=torch.bfloat16), 1.0),
         ValueError, "compensation must match the weight's dtype, shape and device (torch.bfloat16, (2,), cpu); "
                     "start from torch.zeros_like(weight)"),
        (lambda: B.overflow_table(None), TypeError, "report must be an OverflowReport (from fp16_overflow), not None"),
        (lambda: B.scaler_need(scale=1e39), ValueError,
         "scale must be a positive number within float32's range, such as 65536.0, not 1e+39"),
    ]
    for call, kind, message in cases:
        with pytest.raises(kind) as info:
            call()
        assert str(info.value) == message


# ============================================================================================
# Kahan summation
# ============================================================================================


def core_kahan(w, c, u):
    """One ``kahan_add_`` step in the numpy core (numbers or arrays): each op the exact result
    rounded once (the fp32 update added to the bf16 buffer in fp32, then rounded to bf16)."""
    c1 = np.asarray(BF16.quantize(add(c, u, "fp32")), dtype=np.float64)
    w1 = np.asarray(add(w, c1, "bf16"), dtype=np.float64)
    c2 = np.asarray(add(c1, np.asarray(w) - w1, "bf16"), dtype=np.float64)  # w - w1: nearby bf16 values, exact
    return w1, c2


def test_kahan_add_matches_the_numpy_core_bit_for_bit():
    rng = np.random.default_rng(3)
    n = 400
    w = torch.from_numpy(rng.uniform(-4, 4, n).astype(np.float32)).to(torch.bfloat16)
    c = torch.from_numpy((rng.standard_normal(n) * 1e-3).astype(np.float32)).to(torch.bfloat16)
    u = torch.from_numpy((rng.standard_normal(n) * 10.0 ** rng.uniform(-6, -1, n)).astype(np.float32))
    ew, ec = core_kahan(w.double().numpy(), c.double().numpy(), u.double().numpy())
    w1, c1 = w.clone(), c.clone()
    assert B.kahan_add_(w1, c1, u) is w1
    assert np.array_equal(w1.double().numpy(), ew) and np.array_equal(c1.double().numpy(), ec)
    w2, c2 = w.clone(), c.clone()
    wrong_sign_kahan(w2, c2, u)
    assert np.array_equal(w2.double().numpy(), ew) and not np.array_equal(c2.double().numpy(), ec)


def wrong_sign_kahan(w, c, u):
    """A wrong variant: the last line with the sign turned round."""
    c.add_(u)
    before = w.clone()
    w.add_(c)
    c.add_(w - before)


def accumulate(step, update=1e-4, steps=1000):
    w = torch.ones(1, dtype=torch.bfloat16)
    c = torch.zeros(1, dtype=torch.bfloat16)
    u = torch.full((1,), update)
    for _ in range(steps):
        step(w, c, u)
    return float(w), float(c)


def test_kahan_keeps_the_updates_a_bf16_weight_loses():
    plain = torch.ones(1, dtype=torch.bfloat16)
    for _ in range(1000):
        plain.add_(torch.full((1,), 1e-4))
    assert float(plain) == 1.0 and update_lost(1.0, 1e-4, "bf16", via="fp32")  # every update lost
    w, c = accumulate(B.kahan_add_)
    exact = 1 + 1000 * float(np.float32(1e-4))
    assert w == float(BF16.quantize(exact))  # the bf16 value nearest the exact sum
    # the buffer is bf16 too: it carries each update with 8 bits relative to itself, so the sum
    # w + c drifts, here by about a third of a bf16 step over 1000 updates (not 13 steps)
    assert abs(w + c - exact) < BF16.ulp(exact) / 2
    ww, cc = accumulate(wrong_sign_kahan)
    assert ww != float(BF16.quantize(exact)) and not abs(ww + cc - exact) < BF16.ulp(exact) / 2


# ============================================================================================
# Lost updates in bf16 weights, and the three fixes
# ============================================================================================


@pytest.fixture(scope="module")
def runs(one_torch_thread):
    return B.lost_update_runs()


def q32(x):
    return np.asarray(x, dtype=np.float64).astype(np.float32).astype(np.float64)


def test_every_step_of_every_run_replayed_with_the_numpy_core(runs):
    fp32, bf16, master = runs.runs["fp32"], runs.runs["bf16"], runs.runs["master"]
    kahan, sr = runs.runs["kahan"], runs.runs["stochastic"]
    u = {k: r.updates.astype(np.float64) for k, r in runs.runs.items()}
    # fp32: w + u rounded to fp32
    assert np.array_equal(fp32.weights[1:], q32(fp32.weights[:-1] + u["fp32"]))
    # bf16: fp32 sum rounded to bf16 (torch's add_ of an fp32 update) ...
    assert np.array_equal(bf16.weights[1:], BF16.quantize(q32(bf16.weights[:-1] + u["bf16"])))
    # ... not the update rounded to bf16 first and the exact sum rounded once (a Python float's way)
    assert not np.array_equal(bf16.weights[1:], add(bf16.weights[:-1], BF16.quantize(u["bf16"]), "bf16"))
    # master: an fp32 running sum; the forward pass sees its bf16 copy
    m = np.zeros(runs.features)
    for k in range(runs.steps):
        assert np.array_equal(master.weights[k], BF16.quantize(m))
        moving = u["master"][k] != 0  # its state is unchanged only where fp32 itself loses the update
        lost = update_lost(m, u["master"][k], "fp32") & moving
        assert master.unchanged[k] == lost.sum() / max(moving.sum(), 1)
        m = q32(m + u["master"][k])
    # Kahan: each step as core_kahan
    w, c = np.zeros(runs.features), np.zeros(runs.features)
    for k in range(runs.steps):
        assert np.array_equal(kahan.weights[k], w)
        w, c = core_kahan(w, c, u["kahan"][k])
    # stochastic: one of the two neighbours of the fp32 sum
    s = q32(sr.weights[:-1] + u["stochastic"])
    nb = np.array([[core_neighbours(v) for v in row] for row in s])
    assert ((sr.weights[1:] == nb[..., 0]) | (sr.weights[1:] == nb[..., 1])).all()
    assert (sr.weights[1:] == nb[..., 1])[nb[..., 0] != nb[..., 1]].any()  # and it does go up


def test_lost_shares_are_the_half_ulp_rule(runs):
    """The per-step share of lost updates equals the numpy core's ``update_lost(..., via="fp32")``;
    in the bf16 run it is also the share that left the weights unchanged."""
    for key, run in runs.runs.items():
        w = BF16.quantize(run.weights[:-1])
        moving = run.updates != 0
        lost = update_lost(w, run.updates, "bf16", via="fp32") & moving
        expected = lost.sum(1) / np.maximum(moving.sum(1), 1)
        assert np.array_equal(run.lost, expected), key
    bf16 = runs.runs["bf16"]
    assert np.array_equal(bf16.lost, bf16.unchanged)
    # a wrong rule, "lost when |u| < eps * |w|" (a whole step instead of half), disagrees
    wrong = (np.abs(bf16.updates) < 2.0**-7 * np.abs(bf16.weights[:-1])).mean(1)
    assert not np.array_equal(wrong, bf16.lost)


def fixed(runs, key) -> bool:
    """The claim for a fix: near the best bf16 weights can do (the fp32 run's, rounded)."""
    return runs.runs[key].final_loss <= 3 * runs.floor_loss and runs.distance(key) <= 2 * runs.floor_distance


def test_bf16_stalls_and_the_three_fixes_learn(runs):
    bf16 = runs.runs["bf16"]
    k = runs.stalled_at
    assert k is not None and 0 < k < runs.steps // 2
    assert (bf16.weights[k:] == bf16.weights[k]).all() and (bf16.unchanged[k:] == 1).all()
    assert bf16.unchanged[k - 1] < 1
    assert runs.runs["fp32"].final_loss < 1e-9 and runs.floor_loss < 1e-4
    assert bf16.final_loss > 100 * runs.floor_loss and runs.distance("bf16") > 10 * runs.floor_distance
    for key in ("master", "kahan", "stochastic"):
        assert fixed(runs, key), key
        assert bf16.final_loss > 100 * runs.runs[key].final_loss
    assert not fixed(runs, "bf16")  # the same test on the run that stalls
    assert runs.runs["master"].unchanged.mean() < 0.001  # the master copy takes (almost) every update
    assert runs.runs["kahan"].unchanged.mean() < 0.05
    table = B.lost_update_table(runs)
    assert table.column("weights")[:5] == tuple(B.METHODS.values())
    assert f"bf16 stalled from step {k}" in table.title


def test_the_loss_by_step_table(runs):
    t = B.lost_update_steps_table(runs)
    k = runs.stalled_at
    steps = [0, 25, 50, k, 100, 200, 400]
    assert t.columns == ("weights", *(f"step {s}" + (" (stall)" if s == k else "") for s in steps))
    for row, run in zip(t.rows, runs.runs.values()):
        assert row == (run.label, *(f"{run.loss[s]:.3g}" for s in steps))
    bf16 = t.rows[1]
    assert len(set(bf16[4:])) == 1 and bf16[3] != bf16[2]  # the bf16 loss no longer moves from the stall on
    assert all(float(row[-1]) < 1e-3 < float(bf16[-1]) for i, row in enumerate(t.rows) if i != 1)
    assert B.lost_update_steps_table(runs, [400, 0]).columns == ("weights", "step 400", "step 0")
    for bad, kind in (([401], ValueError), ("0", TypeError), ([], TypeError), ([1.5], ValueError)):
        with pytest.raises(kind):
            B.lost_update_steps_table(runs, bad)


def test_fewer_methods_and_zero_steps():
    r = B.lost_update_runs(steps=0, methods=["bf16", "fp32"])
    assert list(r.runs) == ["fp32", "bf16"] and r.stalled_at is None
    assert r.runs["bf16"].loss.shape == (1,) and r.distance("bf16") == 0
    with pytest.raises(ValueError, match="^methods must"):
        B.lost_update_runs(methods=["kahan"])


# ============================================================================================
# When bf16 needs no scaler; a network that overflows in fp16
# ============================================================================================


@pytest.fixture(scope="module")
def need(one_torch_thread):
    return B.scaler_need()


def test_scaler_need_counts_match_the_numpy_census(need):
    from ampviz.training.beam import gradients

    g = gradients(0)
    for c in need.casts:
        values = g.weights if c.gradients == "parameters" else g.layer_outputs
        counts = census(values, "fp16" if c.dtype == "float16" else "bf16", c.scale).counts
        assert (c.underflow, c.subnormal, c.overflow) == (counts["underflow"], counts["subnormal"],
                                                          counts["overflow"] + counts["nan"])
    # a wrong rule, "fp16 holds [6.1e-5, 65504]" (the normal range only), counts far more as lost
    outputs = np.abs(g.layer_outputs)
    assert int((outputs < FP16.smallest_normal).sum()) != next(
        c.underflow for c in need.casts if (c.gradients, c.dtype, c.scale) == ("layer outputs", "float16", 1.0))


def test_bf16_keeps_the_gradients_fp16_loses(need):
    assert need.share("layer outputs", "float16") > 0.9
    assert need.share("parameters", "float16") > 0.05
    for grads in B.GRADIENT_SETS:
        assert need.share(grads, "bfloat16") == 0
        assert need.share(grads, "float16", need.scale) < 0.01
    assert need.zeros("layer outputs", "float16") > 0.9
    assert need.zeros("layer outputs", None) == 0
    assert need.zeros("layer outputs", "bfloat16") < 0.001
    smallest = {(r.gradients, r.autocast): r.smallest for r in need.runs}
    assert smallest["layer outputs", "float16"] == 2.0**-24  # fp16's floor: below it everything is 0
    assert smallest["layer outputs", "bfloat16"] > 2.0**-100  # nowhere near bf16's 2^-126
    table = B.scaler_need_table(need)
    assert len(table.rows) == 12 and "2^-24" in table.column("smallest nonzero |gradient|")
    with pytest.raises(ValueError, match="^no cast to float16 at scale 2"):
        need.share("parameters", "float16", 2.0)


def hooked_outputs(x, dtype):
    """An independent evaluation: a fresh ``overflow_model()`` cast with ``.to(dtype)``, run as a
    whole, each Linear layer's output read by a forward hook."""
    model = B.overflow_model().to(dtype)
    seen = {}
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            m.register_forward_hook(lambda mod, inp, out, name=name: seen.__setitem__(name, out.detach()))
    with torch.no_grad():
        model(x.to(dtype))
    return seen


def test_fp16_overflow_against_a_second_evaluation():
    report = B.fp16_overflow()
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(1))
    for dtype, maxima in ((torch.float32, report.fp32_max), (torch.bfloat16, report.bf16_max),
                          (torch.float16, report.fp16_max)):
        seen = hooked_outputs(x, dtype)
        assert tuple(seen) == report.layers
        assert [float(t.float().abs()[~torch.isnan(t)].max()) for t in seen.values()] == list(maxima)
        if dtype == torch.float16:
            assert [int(torch.isinf(t).sum()) for t in seen.values()] == list(report.fp16_inf)
            assert [int(torch.isnan(t).sum()) for t in seen.values()] == list(report.fp16_nan)


def overflows_in_fp16_only(report) -> bool:
    """The claim: bf16 stays finite past 65504; fp16 first gives inf where the activations first
    pass 65504 (all earlier layers finite), then NaN at or after that layer."""
    if not (report.bf16_finite and report.largest > 65504 and report.first_inf and report.first_nan):
        return False
    i = report.layers.index(report.first_inf)
    return (report.fp32_max[i] > 65504 and all(m <= 65504 for m in report.fp16_max[:i])
            and report.layers.index(report.first_nan) >= i)


def test_a_bf16_network_that_overflows_in_fp16():
    report = B.fp16_overflow()
    assert overflows_in_fp16_only(report)
    assert (report.first_inf, report.first_nan) == ("fc9", "fc10")
    assert report.largest_at == "fc10" and report.largest > 2e5
    assert not overflows_in_fp16_only(B.fp16_overflow(gain=2.0))  # a network that stays in range
    table = B.overflow_table(report)
    assert table.column("layer") == report.layers and "first inf in fp16 at fc9" in table.title


# ============================================================================================
# Thread count
# ============================================================================================


def snapshot():
    """The figures a lesson prints, with the defaults it uses."""
    runs = B.lost_update_runs()
    need = B.scaler_need()
    return (
        {k: (r.weights.tobytes(), r.loss.tobytes(), r.lost.tobytes(), r.unchanged.tobytes())
         for k, r in runs.runs.items()},
        str(B.variant_table()),
        str(B.overflow_table(B.fp16_overflow())),
        need.casts, need.runs,
        B.stochastic_round_bf16(torch.linspace(-1, 1, 200_001), torch.Generator().manual_seed(0)).view(torch.int16),
    )


def test_figures_do_not_depend_on_the_thread_count():
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = snapshot()
        torch.set_num_threads(2)
        two = snapshot()
    finally:
        torch.set_num_threads(n)
    assert one[:5] == two[:5]
    assert torch.equal(one[5], two[5])


# ============================================================================================
# Arbitrary arguments: a result or a one-line ValueError/TypeError
# ============================================================================================


class TookTooLong(BaseException):
    pass


@contextlib.contextmanager
def time_limit(seconds: float):
    def alarm(signum, frame):
        raise TookTooLong(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


REFUSED = object()


def answer(fn, *args, **kwargs):
    try:
        with time_limit(20.0):
            return fn(*args, **kwargs)
    except (ValueError, TypeError) as exc:
        message = str(exc)
        assert message.strip() and "\n" not in message, repr(message)
        return REFUSED


TENSORS = st.sampled_from([
    lambda: torch.tensor([1.0, -2.5, 1e-40]), lambda: torch.tensor(3.0), lambda: torch.zeros(0),
    lambda: torch.ones(2, 3), lambda: torch.ones(3, dtype=torch.bfloat16), lambda: torch.ones(2, dtype=torch.float16),
    lambda: torch.ones(2, dtype=torch.float64), lambda: torch.tensor([1, 2]), lambda: torch.tensor([True]),
    lambda: torch.ones(2, dtype=torch.complex64), lambda: torch.ones(2, device="meta"),
    lambda: torch.tensor([math.nan, math.inf, -math.inf]), lambda: torch.ones(3, requires_grad=True),
    lambda: torch.ones(4)[::2], lambda: torch.ones(1).expand(3), lambda: torch.ones(2).to_sparse(),
]).map(lambda make: make())
JUNK = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.integers(), st.floats(), st.text(max_size=6),
                 st.binary(max_size=3), st.complex_numbers(max_magnitude=3), TENSORS,
                 st.lists(st.floats(width=32), max_size=4), st.just(np.array([1.0, 2.0])), st.just(object()),
                 st.integers(10**5, 10**30), st.floats(-1e3, 0),
                 st.sampled_from([1e39, -1e39, 1e300, 5e-324, 1e-45, math.inf, -math.inf, math.nan, 2**64, -(2**63) - 1]))


def float32_tensors():
    values = st.lists(st.floats(width=32), max_size=12)
    shaped = values.map(lambda v: torch.tensor(v, dtype=torch.float32))
    return st.one_of(shaped, shaped.map(lambda t: t[::2]), shaped.map(lambda t: t.reshape(1, -1, 1)),
                     st.floats(width=32).map(lambda v: torch.tensor(v, dtype=torch.float32)),
                     shaped.map(lambda t: t.requires_grad_()), shaped.map(lambda t: nn.Parameter(t)))


SEEDS = st.one_of(st.integers(0, 3), st.integers(-(2**63), 2**64 - 3), st.floats(0, 5).map(float.__floor__))
BF16_VALUES = st.lists(st.floats(-BF16_MAX, BF16_MAX, width=32), min_size=1, max_size=5)
GENERATOR = st.builds(lambda s: torch.Generator().manual_seed(s), st.integers(0, 2**32))


def drive(data, fn, valid: dict):
    """Call ``fn(**kwargs)``: every argument valid (twice as often), one argument arbitrary, or all
    arbitrary (each drawn from its valid values or from anything). Valid arguments must give a
    result; any others a result or a one-line ValueError/TypeError."""
    mode = data.draw(st.sampled_from(["valid", "valid", "one arbitrary", "all arbitrary"]), label="mode")
    odd = data.draw(st.sampled_from(sorted(valid)), label="arbitrary") if mode == "one arbitrary" else None
    kwargs = {}
    for name, strategy in valid.items():
        arbitrary = mode == "all arbitrary" or name == odd
        kwargs[name] = data.draw(st.one_of(strategy, JUNK) if arbitrary else strategy, label=name)
    result = answer(fn, **kwargs)
    if mode == "valid":
        assert result is not REFUSED, kwargs
    return kwargs, result


@pytest.fixture(scope="module")
def small_results(one_torch_thread):
    return {
        "stats": B.rounding_statistics([1.5, 1 + 2.0**-9], draws=50),
        "need": B.scaler_need(batch_size=4),
        "report": B.fp16_overflow(depth=2, width=4, batch=2),
        "runs": B.lost_update_runs(steps=3, features=2, samples=4),
    }


EXAMPLES = int(os.environ.get("AMPVIZ_FUZZ_EXAMPLES", 40))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@FUZZ
@given(data=st.data())
def test_fuzz_stochastic_round_bf16(data):
    kw, r = drive(data, B.stochastic_round_bf16, {"x": float32_tensors(), "generator": GENERATOR})
    if r is not REFUSED:
        assert r.dtype == torch.bfloat16 and r.shape == kw["x"].shape and not r.requires_grad
        assert only_neighbours(B.stochastic_round_bf16, kw["x"].detach().reshape(-1))


@FUZZ
@given(data=st.data())
def test_fuzz_rounding_statistics_and_tables(data):
    valid = {"values": BF16_VALUES, "rounding": st.sampled_from(list(B.ROUNDINGS)), "draws": st.integers(1, 300),
             "seed": SEEDS, "sigmas": st.floats(0.1, 10)}
    kw, r = drive(data, B.rounding_statistics, valid)
    if r is not REFUSED:
        assert isinstance(B.rounding_table(r), Table) and len(r.checks) == np.size(kw["values"])
        if kw["rounding"] == "stochastic":
            assert all(c.neighbours_only for c in r.checks)
    del valid["rounding"]
    kw, t = drive(data, B.variant_table, valid)
    assert t is REFUSED or len(t.rows) == len(B.ROUNDINGS)


@settings(max_examples=max(EXAMPLES // 3, 1), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_scaler_need(data):
    valid = {"seed": st.integers(0, 3), "batch_size": st.integers(1, 8),
             "scale": st.one_of(st.integers(-30, 60).map(lambda k: 2.0**k), st.floats(1e-30, 1e30))}
    kw, r = drive(data, B.scaler_need, valid)
    assert r is REFUSED or len(B.scaler_need_table(r).rows) == 12


@FUZZ
@given(data=st.data())
def test_fuzz_overflow(data):
    valid = {"seed": SEEDS, "width": st.integers(1, 16), "depth": st.integers(1, 6), "gain": st.floats(0.1, 20)}
    kw, m = drive(data, B.overflow_model, valid)
    assert m is REFUSED or isinstance(m, nn.Sequential)
    valid["batch"] = st.integers(1, 8)
    kw, r = drive(data, B.fp16_overflow, valid)
    assert r is REFUSED or len(B.overflow_table(r).rows) == len(r.layers) == int(kw["depth"]) + 1


@FUZZ
@given(data=st.data())
def test_fuzz_lost_update_runs(data):
    methods = st.lists(st.sampled_from(list(B.METHODS)), max_size=5).map(lambda m: ["fp32", "bf16", *m])
    valid = {"seed": SEEDS, "steps": st.integers(0, 20), "lr": st.floats(1e-4, 1e4), "features": st.integers(1, 8),
             "samples": st.integers(1, 16), "methods": st.one_of(methods, methods.map(tuple))}
    kw, r = drive(data, B.lost_update_runs, valid)
    if r is not REFUSED:
        assert len(B.lost_update_table(r).rows) == len(r.runs) + 1
        assert all(run.loss.shape == (r.steps + 1,) for run in r.runs.values())


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return torch.equal(a, b)


def kahan_checked(weight, compensation, update):
    """``kahan_add_``, checking that a refusal leaves the tensors as they were."""
    kept = [(t, t.clone()) for t in (weight, compensation)
            if isinstance(t, torch.Tensor) and t.layout == torch.strided and not t.is_meta]
    try:
        return B.kahan_add_(weight, compensation, update)
    except (ValueError, TypeError):
        assert all(same_values(t, c) for t, c in kept)
        raise


@FUZZ
@given(data=st.data())
def test_fuzz_kahan_add_(data):
    dtype = data.draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32, torch.float64]))
    shape = data.draw(st.sampled_from([(), (3,), (2, 3)]))
    weight = torch.randn(shape).to(dtype)
    valid = {"weight": st.just(weight), "compensation": st.just(torch.zeros_like(weight)),
             "update": st.one_of(st.just(torch.randn(shape)), st.just(torch.randn(shape[-1:])), st.floats(-1, 1))}
    kw, r = drive(data, kahan_checked, valid)
    assert r is REFUSED or r is kw["weight"]


def test_kahan_add_refuses_an_expanded_weight_and_changes_nothing():
    weight = torch.ones(1, dtype=torch.bfloat16).expand(3)
    comp = torch.zeros(3, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="^cannot update these tensors in place"):
        B.kahan_add_(weight, comp, torch.full((3,), 0.5))
    assert comp.tolist() == [0.0, 0.0, 0.0] and weight.tolist() == [1.0, 1.0, 1.0]


@FUZZ
@given(data=st.data())
def test_fuzz_tables_and_methods(small_results, data):
    which = data.draw(st.sampled_from(["stats", "need", "report", "runs", None]))
    arg = small_results[which] if which else data.draw(JUNK)
    tables = {B.RoundingStats: B.rounding_table, B.ScalerNeed: B.scaler_need_table,
              B.OverflowReport: B.overflow_table, B.LostUpdateRuns: B.lost_update_table}
    t = answer(B.lost_update_steps_table, arg)
    assert (t is REFUSED) == (not isinstance(arg, B.LostUpdateRuns))
    for table in tables.values():
        t = answer(table, arg)
        assert (t is REFUSED) == (tables.get(type(arg)) is not table)
    need, runs = small_results["need"], small_results["runs"]
    grads, dtypes = st.sampled_from(list(B.GRADIENT_SETS)), st.sampled_from(["float16", "bfloat16"])
    kw, r = drive(data, need.share, {"gradients": grads, "dtype": dtypes, "scale": st.just(1.0)})
    assert r is REFUSED or 0 <= r <= 1
    kw, r = drive(data, need.zeros, {"gradients": grads, "autocast": st.sampled_from([None, "float16", "bfloat16"])})
    assert r is REFUSED or 0 <= r <= 1
    kw, r = drive(data, runs.distance, {"method": st.sampled_from(list(runs.runs))})
    assert r is REFUSED or r >= 0
    steps = st.one_of(st.none(), st.lists(st.integers(0, runs.steps), min_size=1, max_size=4))
    kw, t = drive(data, B.lost_update_steps_table, {"result": st.just(runs), "steps": steps})
    assert t is REFUSED or len(t.rows) == len(runs.runs)
