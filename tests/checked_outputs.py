"""The notebooks' checked outputs on machines other than this one, shared by the tests that run the
notebooks anyway (so that no notebook is run once more only for this).

Another CPU computes torch's float sums in another order: MKL's BLAS picks kernels by instruction
set, oneDNN likewise, torch's own vector kernels by ``ATEN_CPU_CAPABILITY``, and more threads split
reductions otherwise. ``VARIANTS`` emulates two such machines on this one, each knob at another
value than ``make test``'s plain nbval run (one thread, this CPU's own kernels):

* "AVX2 kernels, 2 threads": the Binder test runs every notebook so in its fresh environment
  (``tests/course/test_binder.py``);
* "SSE4.2 kernels, plain C++ kernels, 3 threads": the exercises test runs every lesson so
  (``tests/course/test_exercises.py``).

Both then compare every checked cell's outputs with the stored ones as nbval does
(``differences``): streams by name, every MIME type but images and widget views, each through the
sanitize patterns of ``tests/nbval_sanitize.cfg``.
"""

from __future__ import annotations

import configparser
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKED = "# NBVAL_CHECK_OUTPUT"

# Imported by every Python process started with its folder on PYTHONPATH (the kernels): torch on the
# number of threads the variant asks for, whatever the notebook's setup cell sets.
SITECUSTOMIZE = '''
import os
n = os.environ.get("AMPVIZ_TEST_TORCH_THREADS")
if n:
    import torch
    _set = torch.set_num_threads
    torch.set_num_threads = lambda _n: _set(int(n))
    _set(int(n))
'''

VARIANTS = {
    "AVX2 kernels, 2 threads": {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2",
                                "ATEN_CPU_CAPABILITY": "avx2", "AMPVIZ_TEST_TORCH_THREADS": "2"},
    "SSE4.2 kernels, plain C++ kernels, 3 threads": {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "DNNL_MAX_CPU_ISA": "SSE41",
                                                     "ATEN_CPU_CAPABILITY": "default",
                                                     "AMPVIZ_TEST_TORCH_THREADS": "3"},
}
SKIPPED = ("image/png", "image/jpeg", "application/vnd.jupyter.widget-view+json")


def has_avx2() -> bool:
    try:
        return " avx2 " in Path("/proc/cpuinfo").read_text().replace("\n", " ")
    except OSError:
        return False


def variant_env(name: str, folder: Path) -> dict:
    """The environment variables of variant ``name`` for a kernel, with ``folder`` (where its
    sitecustomize.py is written) first on PYTHONPATH and ``ampviz.text.measured`` strict. AVX2 kernels on a CPU without AVX2: none
    (the variant then runs as this machine)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = dict(VARIANTS[name])
    if "AVX2" in name and not has_avx2():
        env = {"AMPVIZ_TEST_TORCH_THREADS": env["AMPVIZ_TEST_TORCH_THREADS"]}
    # OpenMP's idle threads sleep instead of spinning: the variant's threads also run the loops the
    # package keeps on one thread (train_fp8), and on a busy machine (2 cores, 3 other busy
    # processes) the spinning threads made lesson 14's 200 beam steps take 77 s in the kernel, not
    # 1.5 s, past the cell timeout. The wait policy changes no result, only how threads wait.
    return {**env, "PYTHONPATH": str(folder), "AMPVIZ_STRICT_DIGITS": "1",  # measured refuses a boundary
            "OMP_WAIT_POLICY": "PASSIVE"}


def _patterns() -> list:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "tests" / "nbval_sanitize.cfg", encoding="utf-8")
    return [(re.compile(cfg[s]["regex"]), cfg[s]["replace"]) for s in cfg.sections()]


def _sanitized(value, patterns) -> str:
    text = "".join(value) if isinstance(value, list) else str(value)
    for regex, replace in patterns:
        text = regex.sub(replace, text)
    return text


def _keyed(outputs, patterns) -> dict:
    """A cell's outputs as nbval compares them: each stream name and MIME type to its values."""
    keyed = {}
    for out in outputs:
        kind = out.get("output_type")
        if kind == "stream":
            keyed.setdefault(out["name"], []).append(_sanitized(out["text"], patterns))
        elif kind == "error":
            keyed.setdefault("error", []).append(f"{out['ename']}: {out['evalue']}")
        else:
            for mime, value in out.get("data", {}).items():
                if mime not in SKIPPED:
                    keyed.setdefault(mime, []).append(_sanitized(value, patterns))
    return {key: "".join(values) if key in ("stdout", "stderr") else values for key, values in keyed.items()}


def checked_cells(cells) -> list[int]:
    return [i for i, c in enumerate(cells) if c["cell_type"] == "code" and CHECKED in "".join(c["source"])]


def differences(stored_cells, run_cells, where=None) -> list[str]:
    """Each checked cell of ``stored_cells`` whose outputs in ``run_cells`` differ from the stored
    ones, as "cell N: <key>: stored ... / here ...". ``where`` maps a stored cell's index to its
    index in ``run_cells`` (default: the same)."""
    patterns = _patterns()
    found = []
    for i in checked_cells(stored_cells):
        j = i if where is None else where[i]
        if "".join(run_cells[j]["source"]) != "".join(stored_cells[i]["source"]):
            found.append(f"cell {i}: the run's cell {j} has other source")
            continue
        stored, here = _keyed(stored_cells[i]["outputs"], patterns), _keyed(run_cells[j]["outputs"], patterns)
        for key in sorted(set(stored) | set(here)):
            if stored.get(key) != here.get(key):
                a, b = repr(stored.get(key)), repr(here.get(key))
                at = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                start = max(at - 120, 0)
                found.append(f"cell {i}: {key}, from character {start}:\n  stored {a[start:at + 120]}\n"
                             f"  here   {b[start:at + 120]}")
    return found
