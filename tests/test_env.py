"""ampviz.env: the environment check measures, reports, and never raises."""

import subprocess
import sys

import pytest
import torch

from ampviz import env

PROBES = ("fp16 matmul", "bf16 matmul", "autocast fp16", "autocast bf16")


@pytest.fixture(scope="module")
def report():
    return env.check(budget_s=0.02)


def test_versions_and_hardware(report):
    assert set(report.versions) == set(env.PACKAGES)
    assert report.versions["torch"] == torch.__version__
    assert report.versions["ampviz"] == __import__("ampviz").__version__
    assert report.python.startswith(".".join(map(str, sys.version_info[:2])))
    assert report.cpu
    expected = "cuda" if torch.cuda.is_available() else (
        "mps" if torch.backends.mps.is_available() else "cpu")
    assert report.device == expected
    if expected == "cpu":
        assert report.gpu == "none found"


def test_probes_are_measured_on_this_machine(report):
    assert tuple(p.name for p in report.probes) == PROBES
    for name in ("fp16 matmul", "bf16 matmul"):
        p = report.probe(name)
        # torch 2.13 runs both on the CPU; the ratio is measured, so only its sign is known
        assert p.supported, p.detail
        assert p.speed is not None and p.speed > 0
        assert ("faster" in p.detail) == (p.speed >= 1)
    for name, dt in (("autocast fp16", "float16"), ("autocast bf16", "bfloat16")):
        assert report.probe(name).supported
        assert f"output {dt}" in report.probe(name).detail
    with pytest.raises(KeyError):
        report.probe("fp64 matmul")


def test_text_and_html(report):
    text = str(report)
    assert repr(report) == text
    assert "Versions and hardware" in text and f"Measured on this machine's {report.device}" in text
    for name in PROBES + env.PACKAGES:
        assert name in text
    html = report._repr_html_()
    assert html.count("<table>") == 2 and "✓" in html


def test_a_failing_device_reports_not_supported():
    r = env.check("meta", budget_s=0.01)
    assert [p.name for p in r.probes] == list(PROBES)
    assert not r.probe("autocast fp16").supported
    assert str(r.probe("autocast fp16")).startswith("not supported: ")
    assert "not supported" in str(r)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_on_a_cpu_only_machine_reports_not_supported():
    # torch warns ("CUDA is not available ... Disabling autocast") and fails: neither escapes
    r = env.check("cuda", budget_s=0.01)
    assert not any(p.supported for p in r.probes)
    assert all(str(p).startswith("not supported: ") for p in r.probes)


def test_without_torch_every_probe_says_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    r = env.check()
    assert all(not p.supported and "torch could not be imported" in p.detail for p in r.probes)
    assert "not supported: torch could not be imported" in str(r)


def test_missing_package_version():
    assert env._version("surely-not-an-installed-distribution") == "not installed"


def test_importing_env_does_not_import_torch():
    code = "import sys, ampviz.env; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_gpu_is_described_and_probed_without_raising(monkeypatch):
    """A machine that reports a CUDA GPU (simulated here; torch is the CPU build) gets a GPU line,
    and probes that cannot run there say why instead of raising."""
    if torch.cuda.is_available():
        pytest.skip("a real GPU is present; the simulation is for CPU-only machines")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Imaginary GPU")
    r = env.check(budget_s=0.01)
    assert r.device == "cuda" and r.gpu == "2 × CUDA: Imaginary GPU"
    assert all(str(p).startswith("not supported: ") for p in r.probes)
