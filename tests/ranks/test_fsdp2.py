"""FSDP2's MixedPrecisionPolicy on real gloo ranks (``ampviz.ranks.fsdp2``).

Every run here is real: forked ranks, gloo, ``fully_shard``. The reference is exact math (float64 on
the same float32 weights and batches). Plausible wrong models fail on the same runs: gradients
coming back in param_dtype, an fp16 reduce that sums and then divides (or divides fully first),
a plain GradScaler that lets the rank with a clean shard step.
"""

import math

import numpy as np
import pytest
import torch

from ampviz import ranks as R
from ampviz.ranks import fsdp2
from ampviz.text import Table


@pytest.fixture(scope="module", autouse=True)
def warm():
    fsdp2._warm()


@pytest.fixture(scope="module")
def errors():
    """Every default policy on 2 ranks, and one (fp16 params, fp16 reduce) on 4."""
    two = fsdp2.policy_errors((2,))
    four = fsdp2.policy_errors((4,), (("fp16", "fp16"), ("bf16", "bf16"), (None, None)))
    return two, four


def test_policies_run_with_sharded_fp32_gradients_and_outputs_in_param_dtype(errors):
    two, four = errors
    for (p, r, ws), run in {**two.runs, **four.runs}.items():
        assert run.world_size == ws == len(run.grads)
        assert run.output_dtype == ({"fp16": "float16", "bf16": "bfloat16", None: "float32"}[p],) * ws
        # the wrong model "gradients come back in param_dtype": they are fp32 DTensors, sharded on dim 0
        assert run.grad_dtype == run.local_grad_dtype == ("float32",) * ws
        assert all(run.dtensor) and run.placements == ("(Shard(dim=0),)",) * ws
        assert run.grads.dtype == np.float32 and run.grads.shape == (ws, 64 * 64 + 64)
        assert run.ranks_identical  # every rank gathers the same bits
        assert np.all(run.error == run.error[0])


def test_errors_against_the_exact_mean_sit_in_their_bands(errors):
    two, four = errors
    e = lambda p, r, ws=2: (four if ws == 4 else two).error(p, r, ws)  # noqa: E731
    for ws in (2, 4):
        assert e(None, None, ws) <= 1e-6  # fp32 end to end: the mean, to the last bits of an fp32 sum
        assert 5e-5 < e("fp16", "fp16", ws) < 2e-3
        assert 5e-4 < e("bf16", "bf16", ws) < 2e-2
    assert 5e-5 < e("fp16", "fp32") < 2e-3 and 5e-4 < e("bf16", "fp32") < 2e-2
    assert e("bf16", "fp32") > 4 * e("fp16", "fp32")  # bf16 keeps 8 bits, fp16 11: about 8 times the error
    # the reduce dtype alone: params fp32, only the reduce rounds
    assert 3e-5 < e(None, "fp16") < 2e-3 and 3e-4 < e(None, "bf16") < 1e-2
    assert e(None, "bf16") > 4 * e(None, "fp16") > 100 * e(None, None)
    # the wrong model "a low-precision policy gives an fp32-exact mean": every low-precision run is far off
    assert min(e(p, r) for p, r in fsdp2.COMBOS if (p, r) != (None, None)) > 100 * e(None, None)


def test_the_reduce_dtype_sets_the_grid_of_the_gradient(errors):
    two, four = errors
    def on_grid(grads, dtype):
        return bool(np.all(torch.from_numpy(grads).to(dtype).float().numpy() == grads))
    for run in (two.runs[("fp16", "fp16", 2)], four.runs[("fp16", "fp16", 4)], two.runs[(None, "fp16", 2)]):
        assert on_grid(run.grads, torch.float16)  # summed in fp16: fp16 values, held in fp32
    for run in (two.runs[("bf16", "bf16", 2)], four.runs[("bf16", "bf16", 4)], two.runs[(None, "bf16", 2)]):
        assert on_grid(run.grads, torch.bfloat16)
    for key in (("fp16", "fp32", 2), ("bf16", "fp32", 2)):
        assert not on_grid(two.runs[key].grads, torch.float16)  # an fp32 reduce: not even fp16 values


def test_the_table_prints_what_every_cpu_reproduces(errors):
    two, _ = errors
    t = two.table()
    assert isinstance(t, Table) and str(two) == str(t)
    assert t.columns[-1] == "error, 2 ranks" and len(t.rows) == len(fsdp2.COMBOS)
    assert t.rows[0][:5] == ("None", "None", "float32", "float32", "< 1e-6")
    for row in t.rows[1:]:
        assert float(row[4]) == pytest.approx(two.error(row[0] if row[0] != "None" else None,
                                                        row[1] if row[1] != "None" else None, 2), rel=0.05)
    one = two.table(digits=1)
    assert all(c == "< 1e-6" or (len(c) == 5 and c[1:3] == "e-") for c in one.column("error, 2 ranks"))


def test_recorded_divide_factors_follow_the_rule(errors):
    two, four = errors
    for (p, r, ws), run in {**two.runs, **four.runs}.items():
        reduce = r or p or "fp32"
        assert set(run.factors) == {fsdp2.divide_factors(ws, reduce)}
    assert two.runs[("fp16", "fp16", 2)].factors[0] == (2, 1.0, "SUM")
    assert four.runs[("fp16", "fp16", 4)].factors[0] == (2, 2.0, "SUM")
    assert two.runs[("bf16", "bf16", 2)].factors[0] == (None, None, "AVG")


class _Group:
    def __init__(self, n):
        self.n = n

    def size(self):
        return self.n


def test_divide_factors_equal_torchs_own_rule():
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import _get_gradient_divide_factors
    for ws in range(1, 65):
        for name, dt in fsdp2.DTYPES.items():
            pre, post, rs, _ = _get_gradient_divide_factors(_Group(ws), None, dt)
            assert fsdp2.divide_factors(ws, name) == (pre, None if post is None else float(post), rs.name)
    assert fsdp2.divide_factors(8, "fp16") == (4, 2.0, "SUM") and fsdp2.divide_factors(16, "fp16") == (4, 4.0, "SUM")


def _fp16_reduce(rows, pre, post):
    """The pre/post-divide model of an fp16 reduce (each rank's fp16 gradient divided by ``pre`` in
    fp16, summed in fp16 in rank order, divided by ``post``)."""
    h = rows.astype(np.float16)
    with np.errstate(over="ignore"):
        acc = (h[0] / np.float16(pre)).astype(np.float16)
        for row in h[1:]:
            acc = (acc + (row / np.float16(pre)).astype(np.float16)).astype(np.float16)
        return (acc / np.float16(post)).astype(np.float16).astype(np.float32)


def test_fp16_reduce_divides_by_about_sqrt_n_before_and_the_rest_after():
    # columns: near fp16's top, half of it, a subnormal the pre-divide rounds, plain values
    row = np.array([40000.0, 20000.0, 3 * 2.0**-24, 1.0, -0.5, 1000.0, 2.0**-14, 3.0], np.float32)
    two = fsdp2.run_fsdp2_reduce(np.stack([row, row]), "fp16")
    four = fsdp2.run_fsdp2_reduce(np.stack([row] * 4), "fp16")
    assert set(two.factors) == {(2, 1.0, "SUM")} == {two.expected}
    assert set(four.factors) == {(2, 2.0, "SUM")} == {four.expected}
    for run, (pre, post) in ((two, (2, 1)), (four, (2, 2))):
        assert all(np.array_equal(r, run.reduced[0], equal_nan=True) for r in run.reduced)  # every rank
        assert np.array_equal(run.reduced[0], _fp16_reduce(run.grads, pre, post), equal_nan=True)
    # 40000 on each of 2 ranks: 20000 + 20000, finite; on 4 ranks 4 x 20000 overflows
    assert two.reduced[0, 0] == 40000 and math.isinf(four.reduced[0, 0]) and four.reduced[0, 1] == 20000
    # the subnormal 3 x 2^-24 halves to 1.5 x 2^-24, rounds to 2 x 2^-24: the mean comes back as 4 x 2^-24
    assert two.reduced[0, 2] == 4 * 2.0**-24
    # wrong models: sum then divide by N overflows on 2 ranks; divide by N first stays finite on 4
    assert math.isinf(_fp16_reduce(two.grads, 1, 2)[0]) and np.isfinite(_fp16_reduce(four.grads, 4, 1)[0])
    assert not np.array_equal(_fp16_reduce(two.grads, 1, 2), two.reduced[0], equal_nan=True)
    assert not np.array_equal(_fp16_reduce(four.grads, 4, 1), four.reduced[0], equal_nan=True)
    # an fp32 reduce is one AVG: exact here, 40000 on 4 ranks too
    f32 = fsdp2.run_fsdp2_reduce(np.stack([row] * 4), "fp32")
    assert set(f32.factors) == {(None, None, "AVG")} and np.array_equal(f32.reduced[0], row)


@pytest.mark.parametrize("kind", fsdp2.SCALERS)
def test_an_inf_in_one_ranks_shard_makes_every_rank_skip(kind):
    run = fsdp2.run_fsdp2_scaler(kind, 2, inf_rank=1, shard=0)
    # the inf came from rank 1 but landed in rank 0's shard; rank 1's shard is clean
    assert list(run.shard_finite) == [False, True]
    # the wrong model "a plain GradScaler lets the clean rank step": both skip, both back off
    assert list(run.stepped) == [False, False] and run.skipped.all() and not run.changed.any()
    assert list(run.scale) == [512.0, 512.0]
    # ShardedGradScaler SUMs a flag the DTensor unscale already MAX-reduced: 2 on 2 ranks; GradScaler: 1
    assert list(run.found_inf) == ([2.0, 2.0] if kind == "sharded" else [1.0, 1.0])
    assert "skipped" in str(run.table())


def test_four_ranks_skip_and_a_clean_step_steps_everywhere():
    run = fsdp2.run_fsdp2_scaler("plain", 4, inf_rank=3, shard=1)
    assert list(run.shard_finite) == [True, False, True, True] and not run.stepped.any()
    assert list(run.found_inf) == [1.0] * 4 and list(run.scale) == [512.0] * 4
    clean = fsdp2.run_fsdp2_scaler("sharded", 2, inf_rank=None)
    assert clean.shard_finite.all() and clean.stepped.all() and clean.changed.all()
    assert list(clean.found_inf) == [0.0, 0.0] and list(clean.scale) == [1024.0, 1024.0]


def test_run_fsdp2_policy_alone_and_torch_dtypes():
    run = fsdp2.run_fsdp2_policy(torch.bfloat16, torch.float32, 2)
    assert run.param_dtype == "bf16" and run.reduce_dtype == "fp32" and run.output_dtype == ("bfloat16",) * 2
    assert 5e-4 < run.error[0] < 2e-2 and run.ranks_identical
    assert "bf16" in repr(run)


@pytest.mark.parametrize("call", [
    lambda: fsdp2.run_fsdp2_policy("fp8", None),
    lambda: fsdp2.run_fsdp2_policy(torch.int32, None),
    lambda: fsdp2.run_fsdp2_policy(3, None),
    lambda: fsdp2.run_fsdp2_policy(None, "bf16", 1),
    lambda: fsdp2.run_fsdp2_policy(None, None, 2.5),
    lambda: fsdp2.run_fsdp2_policy(None, None, 2, batch=0),
    lambda: fsdp2.run_fsdp2_policy(None, None, 2, timeout=-1),
    lambda: fsdp2.policy_errors(1),
    lambda: fsdp2.policy_errors((2,), ("fp16",)),
    lambda: fsdp2.policy_errors((2,), ()),
    lambda: fsdp2.policy_errors(None),
    lambda: fsdp2.divide_factors(0),
    lambda: fsdp2.divide_factors(2, "int8"),
    lambda: fsdp2.run_fsdp2_reduce([1.0, 2.0]),
    lambda: fsdp2.run_fsdp2_reduce("abc"),
    lambda: fsdp2.run_fsdp2_scaler("fp16"),
    lambda: fsdp2.run_fsdp2_scaler("plain", 2, inf_rank=2),
    lambda: fsdp2.run_fsdp2_scaler("plain", 2, init_scale=math.inf),
])
def test_bad_arguments_are_refused_in_one_line(call):
    with pytest.raises((TypeError, ValueError)) as info:
        call()
    assert "\n" not in str(info.value) and str(info.value).strip()


def test_exported():
    for name in ("run_fsdp2_policy", "policy_errors", "divide_factors", "run_fsdp2_reduce", "run_fsdp2_scaler"):
        assert name in R.__all__ and getattr(R, name) is getattr(fsdp2, name)
