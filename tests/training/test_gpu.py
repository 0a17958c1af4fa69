"""On a CUDA device: the live trainer learns in fp32, fp16 with a scaler and bf16; CUDA autocast's op
table; fp8 casts past the range; pitfall 3 (the encoder's fast path) does not crash.

The tests marked ``gpu`` need a CUDA device; where there is none, tests/conftest.py skips them with
"needs a CUDA device (torch.cuda.is_available() is False)". Two kinds of test run on any machine:
the CPU half of the autocast op table (the same measurement, against the CPU's own op lists) and a
check of the skipping itself. Each GPU test takes seconds.
"""

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from ampviz.training import live as L  # noqa: E402
from ampviz.formats import FP8_E4M3, FP8_E5M2  # noqa: E402
from ampviz.pitfalls import transformer_eval as te  # noqa: E402
from ampviz.scaling import TorchGradScaler, simulate  # noqa: E402

CUDA = "cuda"
BF16_MESSAGE = "expected scalar type Float but found BFloat16"


# ------------------------------------------------------------------ the live trainer on CUDA
#: steps and "it learned" of each model, as the CPU tests judge them: the mlp as in
#: test_live_training.py::test_same_seed_same_run_and_the_loss_falls (the last ten losses' mean at
#: least 0.3 below the first ten's), the beam as in test_beam.py (the last ten's mean under a tenth
#: of the first loss).
LEARNS = {
    "mlp": (200, lambda loss: loss[-10:].mean() < loss[:10].mean() - 0.3),
    "beam": (200, lambda loss: loss[-10:].mean() < 0.1 * loss[0]),
}


@pytest.fixture
def scalers(monkeypatch):
    """Every ``torch.amp.GradScaler`` made during the test (the live trainer looks the class up on
    ``torch.amp`` when it makes its scaler)."""
    made = []

    class Recorded(torch.amp.GradScaler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(torch.amp, "GradScaler", Recorded)
    return made


@pytest.mark.gpu
@pytest.mark.parametrize("model", list(LEARNS))
@pytest.mark.parametrize("mode", ["fp32", "fp16+scaler", "bf16"])
def test_the_live_trainer_learns_on_cuda(model, mode, scalers):
    if mode == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU cannot compute in bfloat16")
    steps, learned = LEARNS[model]
    net = L.build_task(model).model  # the run's own seeded model, kept to see where it trained
    run = L.run_training(L.TrainConfig(model=model, mode=mode, steps=steps, device=CUDA, census_every=0),
                         model=net)
    assert run.error is None and len(run) == steps
    assert run.device == f"{CUDA} ({torch.cuda.get_device_name(CUDA)}): asked for explicitly"
    assert {p.device.type for p in net.parameters()} == {CUDA}
    loss = run["loss"]
    assert np.isfinite(loss).all() and learned(loss), (loss[:10].mean(), loss[-10:].mean())
    assert (run["step_time"] > 0).all()
    if mode != "fp16+scaler":
        assert scalers == [] and all(r.scale is None for r in run.records)
        return
    (scaler,) = scalers  # a CUDA GradScaler, enabled (without CUDA it would disable itself)
    assert scaler._device == CUDA and scaler.is_enabled()
    assert scaler._scale.device.type == CUDA and scaler._growth_tracker.device.type == CUDA
    assert run.records[0].scale == 2.0**16
    skipped = run["skipped"].astype(bool)
    trace = simulate(TorchGradScaler(), found_inf=skipped)  # the scale follows torch's update rule
    np.testing.assert_array_equal(run["scale"], trace.scale)
    np.testing.assert_array_equal(run["growth_tracker"], trace.growth_tracker)
    assert scaler.get_scale() == trace.final.scale and scaler._get_growth_tracker() == trace.final.growth_tracker


# ------------------------------------------------------------------ the autocast op table
def _inputs(device, dtype):
    gen = torch.Generator().manual_seed(0)

    def x(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    return x


#: op -> (what it computes from float32 inputs ``a`` and autocast-dtype inputs ``h``, its policy).
#: Policies are torch's autocast op lists: ATen/autocast_mode.h (AT_FORALL_LOWER_PRECISION_FP,
#: AT_FORALL_FP32, AT_FORALL_FP32_SET_OPT_DTYPE), registered for CUDA in aten/src/ATen/autocast_mode.cpp,
#: and the lists "CUDA Ops that can autocast to float16" / "... to float32" of torch's AMP docs
#: (torch.amp, "Autocast Op Reference"). "lower": the output is the autocast dtype, even from float32
#: inputs; "float32": the output is float32, even from inputs in the autocast dtype (the op upcasts
#: them). The lower-precision ops get float32 inputs and the float32 ops inputs in the autocast dtype,
#: so that each policy shows.
OPS = {
    "matmul": (lambda a, h: torch.matmul(a(4, 8), a(8, 3)), "lower"),
    "linear": (lambda a, h: F.linear(a(4, 8), a(3, 8), a(3)), "lower"),
    "conv2d": (lambda a, h: F.conv2d(a(1, 2, 6, 6), a(3, 2, 3, 3)), "lower"),
    "bmm": (lambda a, h: torch.bmm(a(2, 4, 8), a(2, 8, 3)), "lower"),
    "addmm": (lambda a, h: torch.addmm(a(4, 3), a(4, 8), a(8, 3)), "lower"),
    "softmax": (lambda a, h: torch.softmax(h(4, 8), dim=-1), "float32"),
    "log_softmax": (lambda a, h: torch.log_softmax(h(4, 8), dim=-1), "float32"),
    "layer_norm": (lambda a, h: F.layer_norm(h(4, 8), (8,)), "float32"),
    "sum": (lambda a, h: torch.sum(h(4, 8)), "float32"),
    "exp": (lambda a, h: torch.exp(h(4, 8)), "float32"),
    "mse_loss": (lambda a, h: F.mse_loss(h(4, 8), h(4, 8)), "float32"),
}
#: CPU autocast registers its own lists (KERNEL_CPU in autocast_mode.cpp): the same matrix products
#: and convolutions in the lower dtype, but softmax, log_softmax, layer_norm, sum and exp are in no
#: CPU list, so they compute in whatever dtype they are given ("input"); mse_loss is upcast on both.
CPU_POLICY = {**{op: policy for op, (_, policy) in OPS.items()},
              **dict.fromkeys(("softmax", "log_softmax", "layer_norm", "sum", "exp"), "input")}
POLICY = {CUDA: {op: policy for op, (_, policy) in OPS.items()}, "cpu": CPU_POLICY}


def autocast_output_dtypes(device: str, dtype) -> dict:
    """op -> the dtype of its output under ``torch.autocast(device, dtype=dtype)``."""
    a, h = _inputs(device, torch.float32), _inputs(device, dtype)
    with torch.autocast(device, dtype=dtype):
        return {op: fn(a, h).dtype for op, (fn, _) in OPS.items()}


def _expected(policy: str, dtype):
    return {"lower": dtype, "float32": torch.float32, "input": dtype}[policy]


@pytest.mark.parametrize("device", [pytest.param(CUDA, marks=pytest.mark.gpu), "cpu"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_autocast_op_table(device, dtype):
    if device == CUDA and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU cannot compute in bfloat16")
    measured = autocast_output_dtypes(device, dtype)
    expected = {op: _expected(policy, dtype) for op, policy in POLICY[device].items()}
    assert measured == expected
    # the table is the device's own: the other device's policy gets the five upcasts wrong
    other = POLICY["cpu" if device == CUDA else CUDA]
    wrong = {op: _expected(policy, dtype) for op, policy in other.items()}
    assert {op for op in OPS if wrong[op] != measured[op]} == {"softmax", "log_softmax", "layer_norm", "sum", "exp"}


# ------------------------------------------------------------------ fp8 casts past the range
#: In range, at the edge of the range (E4M3: 448 is the largest value, 464 the tie that rounds to it;
#: E5M2: 57344 the largest, 61440 the tie that rounds up past it), beyond it, ±inf and NaN.
FP8_VALUES = np.array([0.0, -0.0, 1.0, -3.25, 448.0, 460.0, 464.0, 465.0, 500.0, -500.0, 1e4, 57344.0,
                       60000.0, 61439.0, 61440.0, -1e6, 3e38, np.inf, -np.inf, np.nan], dtype=np.float32)

#: What torch's cast does past the range, the same on CUDA as on the CPU:
#: * E4M3 (no inf): torch >= 2.12 saturates finite overflow and ±inf to ±448 (pytorch PR #178817,
#:   torch/headeronly/util/Float8_e4m3fn.h; the CUDA copy kernel, aten/src/ATen/native/cuda/Copy.cu,
#:   calls the same conversion, or ``__nv_cvt_float_to_fp8(..., __NV_SATFINITE, __NV_E4M3)`` in
#:   builds with CUDA >= 13.2). That is ``FloatFormat.quantize``'s default (``overflow=None``, the
#:   course's convention); torch <= 2.11 gave NaN (``overflow="nan"``, as ml_dtypes does).
#: * E5M2: not saturating: ±inf, on both devices (Copy.cu passes ``__NV_NOSAT`` for E5M2): the
#:   default again. Transformer Engine's kernels saturate E5M2 too (``__NV_SATFINITE``):
#:   ``overflow="saturate"``, which torch's cast is not.
#: name -> (format, torch dtype, the rule torch's cast follows, a rule it does not follow)
NEW_E4M3 = torch.torch_version.TorchVersion(torch.__version__) >= "2.12"
FP8 = {"e4m3": (FP8_E4M3, torch.float8_e4m3fn, None if NEW_E4M3 else "nan", "nan" if NEW_E4M3 else "saturate"),
       "e5m2": (FP8_E5M2, torch.float8_e5m2, None, "saturate")}


def _same(got, want, label):
    """Equal values, NaN where NaN, and the same sign (also of zeros)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    both_nan = np.isnan(got) & np.isnan(want)
    assert (both_nan | (got == want)).all(), f"{label}: {got.tolist()} != {want.tolist()}"
    assert (np.signbit(got) == np.signbit(want))[~np.isnan(want)].all(), label


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(FP8))
def test_fp8_casts_past_the_range_on_cuda(name):
    fmt, dtype, rule, not_rule = FP8[name]
    x = torch.tensor(FP8_VALUES)
    on_cuda = x.to(CUDA).to(dtype)
    on_cpu = x.to(dtype)
    got = on_cuda.float().cpu().numpy()
    _same(got, fmt.quantize(FP8_VALUES, overflow=rule), f"CUDA vs quantize(overflow={rule!r})")
    _same(got, on_cpu.float().numpy(), "CUDA vs CPU cast")
    finite = torch.from_numpy(~np.isnan(got))  # NaN codes may differ between conversions; no other code may
    assert torch.equal(on_cuda.view(torch.uint8).cpu()[finite], on_cpu.view(torch.uint8)[finite])
    # the other convention differs exactly where the values overflow (±inf included)
    other = fmt.quantize(FP8_VALUES, overflow=not_rule)
    differs = ~((got == other) | (np.isnan(got) & np.isnan(other)))
    overflows = fmt.classify(FP8_VALUES) == "overflow"
    assert overflows.sum() >= 5 and (differs == overflows).all()


# ------------------------------------------------------------------ pitfall 3 on CUDA
@pytest.mark.gpu
def test_pitfall_3_does_not_crash_under_cuda_autocast(fused_calls):
    """The call that crashes on the CPU (eval, no_grad, right padding, bf16 autocast) runs on CUDA:
    ``torch.is_autocast_enabled()`` sees CUDA's autocast, so the encoder skips the fast path and runs
    its layers as Python modules (float32 output: CUDA autocast runs layer_norm in float32; padded
    positions hold values). Without autocast it takes the fast path, as on the CPU."""
    for autocast in (torch.bfloat16, torch.float16):
        out = te.encoder_call(device=CUDA, autocast=autocast)
        assert not out.failed, out
        assert out.details == {"dtype": "float32", "padded_zero": False}
    assert fused_calls == {"fused": 0, "nested": 0}
    fp32 = te.encoder_call(device=CUDA, autocast=None)
    assert fp32.details == {"dtype": "float32", "padded_zero": True}
    assert fused_calls == {"fused": te.LAYERS, "nested": 1}
    table = te.condition_table(device=CUDA)
    assert table.title == (f"nn.TransformerEncoder, eval + no_grad + bf16 autocast on the GPU ({torch.device(CUDA)}), "
                           "one change at a time")
    assert set(table.column("outcome")) == {"runs (float32 output)"}
    cpu = te.condition_table()  # the same calls on the CPU: the crash
    assert cpu.column("outcome")[0] == f"RuntimeError: {BF16_MESSAGE}"


# ------------------------------------------------------------------ the skipping itself (CPU)
GENERATED_PLAIN = '''
import sys


def test_a_plain_test_does_not_load_torch():
    assert "torch" not in sys.modules
'''
GENERATED_GPU = '''
import pytest


@pytest.mark.gpu
def test_needs_cuda():
    import torch

    assert torch.zeros(1, device="cuda").item() == 0
'''


def _pytest(folder: Path, name: str) -> str:
    """pytest on ``folder/name`` in a process of its own, without the installed plugins (nbval alone
    takes seconds to load), so only the copied conftest.py is in play."""
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "--strict-markers",
                           name], cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    return done.stdout + done.stderr


def test_gpu_marked_tests_skip_with_the_reason_without_cuda(tmp_path):
    """tests/conftest.py, copied beside two generated test files and run by pytest in a process of its
    own: the marker is registered (``--strict-markers`` accepts it), the gpu test is reported skipped
    with the reason (without the hook it would fail at ``device="cuda"``), and a session without gpu
    tests never imports torch."""
    if torch.cuda.is_available():
        pytest.skip("CUDA is present here: the gpu tests run instead of skipping")
    shutil.copy(Path(__file__).resolve().parents[1] / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # their own root: not this project's settings
    (tmp_path / "test_plain.py").write_text(textwrap.dedent(GENERATED_PLAIN))
    (tmp_path / "test_gpu_only.py").write_text(textwrap.dedent(GENERATED_GPU))
    out = _pytest(tmp_path, "test_gpu_only.py")
    assert re.search(r"^SKIPPED \[1\] test_gpu_only\.py:\d+: needs a CUDA device "
                     r"\(torch\.cuda\.is_available\(\) is False\)$", out, re.M), out
    assert re.search(r"^1 skipped in ", out, re.M) and "failed" not in out and "error" not in out.lower(), out
    plain = _pytest(tmp_path, "test_plain.py")
    assert re.search(r"^1 passed in ", plain, re.M), plain


# ------------------------------------------------------------------ bench/bench_gpu.py's cases (CPU)
def test_every_gpu_bench_case_builds_and_steps_on_the_cpu():
    """Each case of bench/bench_gpu.py makes its model and trains one step on the CPU, so that a case
    the trainer refuses (a model past its size limit, a setting it rejects) fails here, not first on
    a GPU. A model past the limit is refused, as the check would show."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "bench" / "bench_gpu.py"
    spec = importlib.util.spec_from_file_location("bench_gpu", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert len(bench.CASES) == 3
    for label, settings, make_model in bench.CASES:
        model = make_model() if make_model is not None else None
        run = L.run_training(L.TrainConfig(mode="fp32", steps=1, census_every=0, device="cpu", **settings), model=model)
        assert run.error is None and len(run) == 1, (label, run.error)
    from ampviz.training import MLP

    with pytest.raises(ValueError, match="weights; at most 10,000,000"):
        MLP(width=4096)  # the width this bench once asked for


def test_the_gpu_benchs_block_part_writes_a_record_the_course_reads(tmp_path, capsys):
    """bench/bench_gpu.py --part block, run on the CPU with a small block: it prints each mode as it
    goes, writes a record that load_record reads back with every mode, and prints the tables."""
    import importlib.util

    from ampviz.training import gpu_record

    path = Path(__file__).resolve().parents[2] / "bench" / "bench_gpu.py"
    spec = importlib.util.spec_from_file_location("bench_gpu", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "record.json"
    bench.bench_block(str(out), None, "cpu", gpu_record.BlockShape(32, 4, 64, 2, 8), (False,))
    rec = gpu_record.load_record(out)
    assert [r["mode"] for r in rec["results"]] == list(gpu_record.MODES)
    assert all(r["error"] is None for r in rec["results"])
    printed = capsys.readouterr().out
    assert printed.count("ms/step") == len(gpu_record.MODES) and "speed-up vs fp32" in printed
