"""ampviz.training.gpu_record: the transformer block the GPU record times, each mode run for real on
the CPU (a small block), the committed record read back, and its table's ratios."""

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn import functional as F

from ampviz.training import gpu_record as R

TINY = R.BlockShape(d_model=32, heads=4, ffn=64, batch=2, seq=8)


def test_the_block_is_causal_self_attention_and_a_gelu_feed_forward():
    """GptBlock's forward equals the block written out in float64: LayerNorm, q k v, softmax over the
    earlier tokens only, the output projection, and h + fc2(GELU(fc1(LN(h))))."""
    torch.manual_seed(0)
    block = R.GptBlock(32, 4, 64).double()
    h = torch.randn(2, 8, 32, dtype=torch.float64)
    b, s, d, nh = 2, 8, 32, 4
    q, k, v = block.qkv(block.norm1(h)).split(d, dim=-1)
    heads = lambda t: t.view(b, s, nh, d // nh).transpose(1, 2)  # noqa: E731
    q, k, v = heads(q), heads(k), heads(v)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d // nh)
    scores = scores.masked_fill(torch.triu(torch.ones(s, s, dtype=torch.bool), 1), float("-inf"))
    a = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, d)
    h1 = h + block.out(a)
    want = h1 + block.fc2(F.gelu(block.fc1(block.norm2(h1))))
    assert torch.allclose(block(h), want, rtol=1e-12, atol=1e-12)
    # a plausible wrong block, attention without the causal mask, is caught
    unmasked = (q @ k.transpose(-1, -2) / math.sqrt(d // nh)).softmax(-1) @ v
    assert not torch.allclose(a, unmasked.transpose(1, 2).reshape(b, s, d), atol=1e-6)


@pytest.mark.parametrize("shape", [TINY, R.BlockShape(), R.BlockShape(64, 8, 256, 1, 4)])
def test_params_counts_every_weight_and_bias(shape):
    if shape.params > 10**8:  # the record's own block, counted without building it
        d, f = shape.d_model, shape.ffn
        assert shape.params == (3 * d * d + 3 * d) + (d * d + d) + (d * f + f) + (f * d + d) + 4 * d == 201_379_840
        return
    block = R.GptBlock(shape.d_model, shape.heads, shape.ffn)
    assert shape.params == sum(p.numel() for p in block.parameters())
    assert shape.tokens == shape.batch * shape.seq


@pytest.mark.parametrize("kwargs, match", [
    (dict(d_model=30, heads=4), "multiple of heads"),
    (dict(d_model=0), "d_model"),
    (dict(batch=True), "batch must be a whole number"),
    (dict(d_model=65536, ffn=65536), "at most 4,000,000,000 weights"),
])
def test_bad_shapes_are_refused_in_one_line(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match) as e:
        R.BlockShape(**kwargs)
    assert "\n" not in str(e.value)


def test_every_mode_trains_on_the_cpu_and_only_fp8_changes_the_loss():
    """Each mode runs: the loss falls, the CPU has no memory counter, nothing is compiled. fp32 and
    TF32 (no TF32 on a CPU) give the same losses; the FP8 recipes' differ from fp32's in the 4th digit."""
    results = {m: R.measure(m, TINY, "cpu", steps=3, warmup=1) for m in R.MODES}
    for mode, r in results.items():
        assert r.error is None, (mode, r.error)
        assert r.step_ms > 0 and r.peak_mib is None and r.compile_s is None
        assert r.loss_last < r.loss_first, mode
    assert results["fp32"].loss_last == results["tf32"].loss_last
    for mode in ("fp8-tensorwise", "fp8-rowwise"):
        assert results[mode].loss_last != results["fp32"].loss_last
        assert math.isclose(results[mode].loss_last, results["fp32"].loss_last, rel_tol=1e-2)


def test_fp8_modes_convert_every_linear_and_tf32_is_set_only_while_it_runs(monkeypatch):
    from torchao.float8.float8_linear import Float8Linear

    seen = {}
    build = R._build

    def spy(mode, shape, dev, seed):
        model, x, target = build(mode, shape, dev, seed)
        seen[mode] = (torch.get_float32_matmul_precision(),
                      {type(m).__name__ for m in model.modules() if isinstance(m, torch.nn.Linear)})
        return model, x, target

    monkeypatch.setattr(R, "_build", spy)
    before = torch.get_float32_matmul_precision()
    for mode in ("fp32", "tf32", "fp8-rowwise"):
        R.measure(mode, TINY, "cpu", steps=1, warmup=1)
        assert torch.get_float32_matmul_precision() == before
    assert seen["tf32"][0] == "high" and seen["fp32"][0] == "highest"
    assert seen["fp8-rowwise"][1] == {Float8Linear.__name__} and seen["fp32"][1] == {"Linear"}


def test_a_mode_that_cannot_run_says_why_instead_of_raising(monkeypatch):
    def no_torchao(*args):
        raise ImportError("No module named 'torchao'")

    monkeypatch.setattr(R, "_build", no_torchao)
    r = R.measure("fp8-tensorwise", TINY, "cpu")
    assert r.error == "ImportError: No module named 'torchao'" and r.step_ms is None


@pytest.mark.parametrize("call, match", [
    (lambda: R.measure("fp64", TINY, "cpu"), "mode must be one of 'fp32'"),
    (lambda: R.measure("fp32", TINY, "tpu"), "device must be 'cpu' or 'cuda'"),
    (lambda: R.measure("fp32", TINY, 3), "device must be 'cpu' or 'cuda'"),
    (lambda: R.measure("fp32", R.BlockShape(), "cpu"), "on a CPU, a block of at most"),
    (lambda: R.measure("fp32", (1, 2), "cpu"), "shape must be a BlockShape"),
    (lambda: R.measure("fp32", TINY, "cpu", steps=0), "steps"),
    (lambda: R.measure("fp32", TINY, "cpu", lr=float("nan")), "lr must be a number above 0"),
    (lambda: R.record("fp32", TINY, "cpu"), "modes must be a list or tuple"),
    (lambda: R.record(("fp32",), TINY, "cpu", compiled=True), "compiled must be a list or tuple"),
    (lambda: R.record(("fp32",), TINY, "cpu", deadline_s=-1), "deadline_s must be None or a number"),
    (lambda: R.record(("fp32",), TINY, "cpu", on_result=3), "on_result must be None or a function"),
])
def test_bad_arguments_get_one_line_errors(call, match):
    with pytest.raises((TypeError, ValueError), match=match) as e:
        call()
    assert "\n" not in str(e.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="asks for CUDA where there is none")
def test_cuda_where_there_is_none_is_one_line():
    with pytest.raises(ValueError, match="torch sees no CUDA device here"):
        R.measure("fp32", TINY, "cuda")


def test_record_keeps_each_mode_saves_as_it_goes_and_stops_at_its_deadline():
    saved = []
    rec = R.record(("fp32", "bf16"), TINY, "cpu", steps=1, warmup=1, compiled=(False,),
                   on_result=lambda r: saved.append(len(r["results"])))
    assert [r["mode"] for r in rec["results"]] == ["fp32", "bf16"] and saved == [1, 2]
    assert rec["params"] == TINY.params and rec["command"] == R.REPRODUCE and rec["skipped"] == 0
    assert rec["environment"]["device"] == "cpu" and rec["environment"]["torch"] == torch.__version__
    assert R.record(("fp32", "bf16"), TINY, "cpu", deadline_s=0)["skipped"] == 2


# ---------------------------------------------------------------- the committed record
def test_the_committed_record_was_made_on_a_cuda_device_with_every_mode():
    """The record the course shows: real CUDA, every mode eager and compiled, nothing failed, each
    run trained (the loss fell), and its block is the one BlockShape() describes."""
    rec = R.load_record()
    assert rec is not None, "ampviz/training/gpu_record.json is missing"
    env = rec["environment"]
    assert env["cuda"] and env["capability"] and env["device"] != "cpu" and env["torchao"]
    assert rec["shape"] == R.BlockShape().__dict__ and rec["params"] == R.BlockShape().params
    assert rec["command"] == R.REPRODUCE and rec["skipped"] == 0
    seen = sorted((r["mode"], r["compiled"]) for r in rec["results"])
    assert seen == sorted((m, c) for m in R.MODES for c in (False, True))
    for r in rec["results"]:
        assert r["error"] is None and r["step_ms"] > 0 and r["peak_mib"] > 0
        assert r["loss_last"] < r["loss_first"]
        assert (r["compile_s"] is not None) == r["compiled"]


def test_the_tables_ratios_are_fp32s_time_over_each_modes():
    rec = R.load_record()
    for compiled in (False, True):
        table = R.record_table(rec, compiled=compiled)
        rows = {r["mode"]: r for r in rec["results"] if r["compiled"] == compiled}
        for mode, cell, memory in zip(table.column("mode"), table.column("speed-up vs fp32"),
                                      table.column("memory vs fp32")):
            assert cell == f"{rows['fp32']['step_ms'] / rows[mode]['step_ms']:.2f}x"
            assert memory == f"{rows[mode]['peak_mib'] / rows['fp32']['peak_mib']:.2f}x"
        # the plausible wrong ratio, each mode's time over fp32's, would show bf16 slower than fp32
        assert float(table.column("speed-up vs fp32")[table.column("mode").index("bf16")][:-1]) > 1
    assert "compile" in R.record_table(rec, compiled=True).title


def test_a_missing_record_is_none_and_a_wrong_file_is_refused(tmp_path):
    assert R.load_record(tmp_path / "none.json") is None
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"results": 3}))
    with pytest.raises(ValueError, match="is not a GPU record"):
        R.load_record(bad)
    with pytest.raises(TypeError, match="rec must be a record from load_record"):
        R.record_table([1, 2])


def test_a_failed_mode_shows_its_reason_in_the_table():
    rec = R.record(("fp32",), TINY, "cpu", steps=1, warmup=1)
    rec["results"].append({**rec["results"][0], "mode": "fp8-rowwise", "step_ms": None, "error": "ImportError: x"})
    table = R.record_table(rec)
    assert table.rows[1][:2] == ("fp8-rowwise", "did not run: ImportError: x")


def test_the_package_ships_the_record():
    """Binder installs the package without -e: the record must be package data."""
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["package-data"]["ampviz.training"] == ["gpu_record.json"]


@settings(max_examples=30, deadline=None)
@given(d=st.one_of(st.integers(-2, 80), st.floats(allow_nan=True), st.text(max_size=3), st.none()),
       heads=st.one_of(st.integers(-1, 9), st.booleans()),
       mode=st.one_of(st.sampled_from(R.MODES), st.text(max_size=6), st.integers()),
       steps=st.one_of(st.integers(-1, 2), st.floats(allow_nan=True)),
       device=st.one_of(st.just("cpu"), st.text(max_size=5), st.integers()))
def test_arbitrary_arguments_give_a_result_or_a_one_line_error(d, heads, mode, steps, device):
    try:
        shape = R.BlockShape(d_model=d, heads=heads, ffn=16, batch=1, seq=4)
        r = R.measure(mode, shape, device, steps=steps, warmup=1)
    except (TypeError, ValueError) as e:
        assert "\n" not in str(e)
        return
    assert r.error is None and r.step_ms > 0
