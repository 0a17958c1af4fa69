"""The notebooks' checked outputs on other machines.

Another CPU computes torch's float sums in another order, so a checked output must state what the
lesson needs at a precision every CPU reproduces, and a claims cell must assert with a margin every
CPU meets. Two nets hold that:

* every notebook is run as on two other machines by the tests that run it anyway
  (``tests/checked_outputs.py``): the Binder test with AVX2 kernels on 2 threads, the exercises
  test with SSE4.2 MKL and oneDNN kernels, torch's plain C++ kernels and 3 threads; each compares
  every checked cell with its stored outputs. Here: that the switches reach torch and that the
  comparison finds what nbval finds;
* a scan of every checked output: a number printed with 5 or more significant digits must be an
  exact value (a low-precision format's value, a power-of-two multiple of a short decimal, or one
  listed below with why it is exact). A number that float arithmetic computed is printed through
  ``ampviz.text.measured``, which rounds it to the digits the lesson needs and, in every run
  that writes or compares checked outputs, refuses a value within 1e-6 (relative) of a rounding
  boundary, so that a machine whose last bits differ prints the same text whatever CPU CI has.
"""

import copy
import html
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from checked_outputs import VARIANTS, differences, has_avx2, variant_env

ROOT = Path(__file__).resolve().parents[2]
LESSONS = sorted(p for p in (ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
PROBE = ("import torch; torch.set_num_threads(1); "
         "print(torch.get_num_threads(), torch.backends.cpu.get_cpu_capability())")


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_variants_switches_reach_torch(variant, tmp_path):
    env = {**os.environ, **variant_env(variant, tmp_path)}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    threads, capability = out.stdout.split()
    assert threads == VARIANTS[variant]["AMPVIZ_TEST_TORCH_THREADS"]
    if "AVX2" not in variant or has_avx2():
        assert capability == VARIANTS[variant]["ATEN_CPU_CAPABILITY"].upper()


def test_the_comparison_finds_what_nbval_finds():
    stored = json.loads((ROOT / "notebooks" / "04_gradscaler_internals.ipynb").read_text())["cells"]
    checked = [i for i, c in enumerate(stored) if "# NBVAL_CHECK_OUTPUT" in "".join(c["source"])]
    assert checked and differences(stored, stored) == []
    run = copy.deepcopy(stored)
    out = next(o for o in run[checked[0]]["outputs"] if o.get("output_type") == "stream" or "data" in o)
    text = out["text"] if "text" in out else out["data"]["text/plain"]
    text = "".join(text)
    digit = next(k for k, ch in enumerate(text) if ch.isdigit())
    changed = text[:digit] + str((int(text[digit]) + 1) % 10) + text[digit + 1:]
    if "text" in out:
        out["text"] = changed
    else:
        out["data"]["text/plain"] = changed
    assert [d.split(",")[0] for d in differences(stored, run)] == [f"cell {checked[0]}: " +
                                                                   ("stdout" if "text" in out else "text/plain")]
    sanitized = copy.deepcopy(stored)
    sanitized[checked[0]]["outputs"].append({"output_type": "stream", "name": "stdout", "text": "at 0x7f00aa"})
    stored[checked[0]]["outputs"].append({"output_type": "stream", "name": "stdout", "text": "at 0x55d1bb"})
    assert differences(stored, sanitized) == []  # addresses are sanitized, as nbval_sanitize.cfg says


# ---------------------------------------------------------------------------------------------
# The scan: long numbers in checked outputs are exact values
# ---------------------------------------------------------------------------------------------

NUMBER = re.compile(r"(?<![\w.^])-?(?:\d+\.\d+(?:e[-+]?\d+)?|\d+e[-+]?\d+)(?![\w.])")

#: Numbers of 5 or more significant digits that checked outputs print, which no CPU computes
#: otherwise, by notebook, with why.
EXACT = {
    "00_start_here": {"1000.1": "a value the cell passes in"},
    "01_fp16_range": {"3.4028235e+38": "float32's largest value",
                      "1.1001100110": "a significand's bits", "1.1111111111": "a significand's bits",
                      "1.1000166": "1,000 float32 additions, one IEEE rounding at a time",
                      "0.10001659": "the same sum less 1"},
    "03b_bf16_in_practice": {"1.0000001": "1 + 2^-23, a value passed in", "9.9999461e-41": "a float32 subnormal passed in",
                             "0.74895": "a count of 20,000 seeded draws, over 20,000",
                             "0.75355": "a count of 20,000 seeded draws, over 20,000",
                             "3.4028235e+38": "float32's largest value", "0.33333334": "1/3 cast to float32, one cast",
                             "2.0393": "a loss read from the GPU record's file, as it was written"},
    "13_mx_and_nvfp4": {"3.50000024": "the float32 after 3.5", "0.00781250093": "one IEEE float32 division"},
}


def _significant(text: str) -> int:
    return len(text.split("e")[0].lstrip("-").replace(".", "").lstrip("0"))


def _low_precision_value(text: str, bits: int = 12) -> bool:
    """``text`` prints a number of at most ``bits`` significant bits (an fp16, bf16 or fp8 value)."""
    x = float(text)
    if x == 0 or not math.isfinite(x):
        return True
    mant, exp = math.frexp(x)
    value = math.ldexp(round(mant * 2**bits) / 2**bits, exp)
    return float(f"{value:.{_significant(text)}g}") == x


def _short_decimal_times_power_of_two(text: str, digits: int = 4) -> bool:
    """``text`` is a number of at most ``digits`` significant digits times a power of two (0.001 × 2^-8)."""
    x = abs(float(text))
    return any(float(f"{math.ldexp(x, k):.{digits}g}") == math.ldexp(x, k) for k in range(-64, 65))


def long_numbers(text: str) -> list:
    """The numbers in ``text`` printed with 5 or more significant digits that are not plainly exact."""
    return [t for t in NUMBER.findall(text) if _significant(t) >= 5
            and not _low_precision_value(t) and not _short_decimal_times_power_of_two(t)]


def _checked_text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            parts.append("".join(out["text"]))
        elif "data" in out:
            parts.append("".join(out["data"].get("text/plain", "")))
            parts.append(html.unescape(re.sub(r"<[^>]+>", " ", "".join(out["data"].get("text/html", "")))))
    return "\n".join(parts)


def test_the_scan_tells_exact_values_from_computed_ones():
    assert long_numbers("0.099975586 1.0078125 3.90625e-06 262144.0 65504 2^-24") == []
    assert long_numbers("‖g‖ 1.6967441 and 1737.4659, ratio 0.99999982") == ["1.6967441", "1737.4659", "0.99999982"]
    assert long_numbers("loss 0.128053, norm 0.4596") == ["0.128053"]


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_checked_outputs_print_no_long_computed_number(path):
    exact = EXACT.get(path.stem, {})
    cells = json.loads(path.read_text())["cells"]
    found = {}
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "code" and "# NBVAL_CHECK_OUTPUT" in "".join(cell["source"]):
            extra = sorted(set(long_numbers(_checked_text(cell))) - set(exact))
            if extra:
                found[i] = extra
    assert not found, (f"{path.name}: checked cells print computed numbers at full precision {found}; print them "
                       "through ampviz.text.measured (or list an exact one in EXACT with why)")
