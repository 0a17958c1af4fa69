"""The notebooks' checked outputs on other machines: torch on 2 threads instead of the setup cells'
one, and torch's CPU kernels for another instruction set (``ATEN_CPU_CAPABILITY``: "default", the
plain C++ kernels, and "avx2"). A checked output must state what the lesson needs at a precision
every CPU reproduces; these runs are how a machine with another CPU is tried here.

Only the notebooks whose checked outputs come from torch's kernels are run (06 computes with
numpy alone; 01 prints torch's casts and additions of single numbers, which IEEE rounding fixes
on every CPU). Each variant runs them through nbval, as ``make test`` does, in a kernel of its own."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TORCH_NOTEBOOKS = ["02_loss_scaling", "03_autocast", "04_gradscaler_internals", "05_gradscaler_in_a_real_loop",
                   "07_live_training", "08_lightning_manual_backward", "09_lightning_autocast_cache",
                   "10_lightning_transformer_eval", "13_mx_and_nvfp4"]

# Imported by every Python process started with this folder on PYTHONPATH (the kernels): torch on
# the number of threads the variant asks for, whatever the notebook's setup cell sets.
SITECUSTOMIZE = '''
import os
n = os.environ.get("AMPVIZ_TEST_TORCH_THREADS")
if n:
    import torch
    _set = torch.set_num_threads
    torch.set_num_threads = lambda _n: _set(int(n))
    _set(int(n))
'''


def _has_avx2() -> bool:
    try:
        return " avx2 " in Path("/proc/cpuinfo").read_text().replace("\n", " ")
    except OSError:
        return False


VARIANTS = {
    "2 threads": {"AMPVIZ_TEST_TORCH_THREADS": "2"},
    "default kernels": {"ATEN_CPU_CAPABILITY": "default"},
    "avx2 kernels": {"ATEN_CPU_CAPABILITY": "avx2"},
}


def test_the_thread_switch_works(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "AMPVIZ_TEST_TORCH_THREADS": "2"}
    code = "import torch; torch.set_num_threads(1); print(torch.get_num_threads())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "2"


@pytest.mark.parametrize("variant", VARIANTS)
def test_checked_outputs_hold_on_another_machine(variant, tmp_path):
    if variant == "avx2 kernels" and not _has_avx2():
        pytest.skip("this CPU has no AVX2")
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**os.environ, **VARIANTS[variant], "PYTHONPATH": str(tmp_path)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile",
           "--nbval-lax", "--nbval-current-env", "--nbval-cell-timeout=300",
           "--nbval-sanitize-with", str(ROOT / "tests" / "nbval_sanitize.cfg"),
           *(str(ROOT / "notebooks" / f"{name}.ipynb") for name in TORCH_NOTEBOOKS)]
    out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert out.returncode == 0, f"{variant}:\n{out.stdout[-6000:]}\n{out.stderr[-2000:]}"
