"""What ``torch.set_float32_matmul_precision`` does on this machine's CPU, measured, and what each
precision would cost a real layer: ``precision_switches()`` and ``layer_error(mode)``.

On NVIDIA GPUs, "high" lets float32 matmuls run on TF32 tensor cores (or as three bf16 products)
and "medium" in bf16; ``ampviz.formats.matmul_precision`` emulates those exactly. On a CPU the
same call sets oneDNN's flag too: torch 2.13's ``set_float32_matmul_precision`` sets
``torch.backends.mkldnn.matmul.fp32_precision`` to "ieee", "tf32" or "bf16" (and
``torch.backends.cuda.matmul.fp32_precision`` to "ieee", "tf32", "tf32"). Torch's MKLDNN notes
say this flag lets oneDNN compute float32 matmuls (``nn.Linear`` included) in bf16 internally;
for "tf32", torch 2.13 warns (when oneDNN's TF32 flag is set through ``torch.backends.mkldnn.flags``)
that TF32 on oneDNN is only available on Intel GPUs. Whether a CPU
matmul's result changes, and how, depends on the CPU and on which oneDNN kernel it picks, so
``precision_switches`` runs one seeded ``nn.Linear`` under each setting and reports the bits, the
error against float64 and the oneDNN kernel that ran (from oneDNN's verbose log). It restores the
global setting afterwards, even on an error.
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass

import numpy as np
import torch

from ampviz._args import _seed, _shown, _whole
from ampviz.formats.matmul_precision import MATMUL_MODES, emulated_matmul, relative_error

__all__ = ["SETTINGS", "SwitchReport", "precision_switches", "layer_error"]

#: The settings of ``torch.set_float32_matmul_precision``, from the most precise.
SETTINGS = ("highest", "high", "medium")
#: The seeded layer both functions measure: ``nn.Linear(FEATURES, FEATURES)`` on a batch of 64.
FEATURES = 256


@dataclass(frozen=True)
class SwitchReport:
    """One setting of ``torch.set_float32_matmul_precision``, measured on this CPU.

    ``reported``: what ``torch.get_float32_matmul_precision()`` says after setting it;
    ``mkldnn_matmul`` and ``cuda_matmul``: the backends' ``fp32_precision`` it set;
    ``changed``: whether the layer's float32 output differs, in any bit, from the one under
    "highest"; ``changed_share``: the share of output elements that differ; ``error``: the output's
    relative error against the float64 forward (``ampviz.formats.matmul_precision.relative_error``);
    ``closest``: the emulated mode (``MATMUL_MODES``) whose error on the same layer is nearest to
    ``error`` on a log scale, "fp32" meaning the measured error of "highest" itself; ``onednn``: the
    oneDNN kernels the forward ran, as ``implementation (fpmath mode)``, empty when none ran (the
    matmul went to another BLAS)."""

    setting: str
    reported: str
    mkldnn_matmul: str
    cuda_matmul: str
    changed: bool
    changed_share: float
    error: float
    closest: str
    onednn: tuple[str, ...]


def _layer(seed: int, batch: int):
    """The seeded layer and batch: (x, weight, bias, float64 output), torch's global RNG untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layer = torch.nn.Linear(FEATURES, FEATURES)
        x = torch.randn(batch, FEATURES)
    with torch.no_grad():
        reference = x.double() @ layer.weight.double().T + layer.bias.double()
    return layer, x, reference


def _onednn_kernels(log: str) -> tuple[str, ...]:
    """The kernels in oneDNN's verbose log: ``implementation (fpmath mode)`` per primitive run."""
    kernels = []
    for line in log.splitlines():
        fields = line.split(",")
        if len(fields) > 9 and fields[2] == "primitive" and fields[3] == "exec":
            fpmath = next((a.split(":", 1)[1] for a in fields[9].split() if a.startswith("attr-fpmath:")), "f32")
            kernels.append(f"{fields[6]} ({fpmath})")
    return tuple(kernels)


def _run_logged(fn):
    """``fn()`` with oneDNN's verbose log on, and the log it printed (captured at file descriptor 1)."""
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 1)
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                result = fn()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        log.seek(0)
        return result, log.read().decode(errors="replace")


def _saved_setting():
    """The global matmul precision as torch holds it: the legacy setting (None where the backends'
    flags were set apart, so that torch refuses to name one) and the backends' ``fp32_precision``."""
    try:
        legacy = torch.get_float32_matmul_precision()
    except RuntimeError:
        legacy = None
    return legacy, torch.backends.cuda.matmul.fp32_precision, torch.backends.mkldnn.matmul.fp32_precision


def _restore(saved) -> None:
    legacy, cuda, mkldnn = saved
    # where torch named no one setting, the flags go back over the default, "highest"
    torch.set_float32_matmul_precision(legacy if legacy is not None else "highest")
    torch.backends.cuda.matmul.fp32_precision = cuda
    torch.backends.mkldnn.matmul.fp32_precision = mkldnn


def _closest(error: float, candidates: dict[str, float]) -> str:
    return min(candidates, key=lambda mode: abs(np.log2(max(error, 1e-300)) - np.log2(max(candidates[mode], 1e-300))))


def precision_switches(*, seed=0, batch=64) -> tuple[SwitchReport, ...]:
    """Each setting of ``torch.set_float32_matmul_precision`` (``SETTINGS``), measured: a seeded
    ``nn.Linear(256, 256)`` forward on a seeded batch, on the CPU, compared bit for bit with the one
    under "highest" and against float64 (see ``SwitchReport``). The global setting (the matmul
    ``fp32_precision`` of the CUDA and oneDNN backends) is restored afterwards, even on an error."""
    seed = _seed(seed)
    batch = _whole("batch", batch, 1, 4096)
    layer, x, reference = _layer(seed, batch)
    emulated = {mode: layer_error(mode, seed=seed, batch=batch) for mode in MATMUL_MODES if mode != "fp32"}
    saved = _saved_setting()
    outputs, rows = {}, []
    try:
        for setting in SETTINGS:
            torch.set_float32_matmul_precision(setting)
            state = (torch.get_float32_matmul_precision(), torch.backends.mkldnn.matmul.fp32_precision,
                     torch.backends.cuda.matmul.fp32_precision)
            with torch.no_grad():
                out, log = _run_logged(lambda: layer(x))
            outputs[setting] = (state, out, _onednn_kernels(log))
    finally:
        _restore(saved)
    base = outputs["highest"][1]
    fp32_error = relative_error(base.numpy(), reference.numpy())
    for setting in SETTINGS:
        (reported, mkldnn, cuda), out, kernels = outputs[setting]
        differ = (out.view(torch.int32) != base.view(torch.int32))
        error = relative_error(out.numpy(), reference.numpy())
        rows.append(SwitchReport(setting, reported, mkldnn, cuda, bool(differ.any()),
                                 float(differ.double().mean()), error,
                                 _closest(error, {"fp32": fp32_error, **emulated}), kernels))
    return tuple(rows)


def layer_error(mode: str, *, seed=0, batch=64) -> float:
    """The relative error of ``mode``'s emulated matmul (``ampviz.formats.matmul_precision``) on a
    real layer: the product x·Wᵀ of a seeded ``nn.Linear(256, 256)`` (torch's own initialisation)
    and a seeded batch of ``batch`` rows of N(0, 1), against its float64 product. The bias is left
    out: it is added after the matmul, in float32, whatever the matmul precision."""
    if not isinstance(mode, str) or mode not in MATMUL_MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, MATMUL_MODES))}, not {_shown(mode)}")
    seed = _seed(seed)
    batch = _whole("batch", batch, 1, 4096)
    layer, x, _ = _layer(seed, batch)
    w = layer.weight.detach()
    reference = (x.double() @ w.double().T).numpy()
    return relative_error(emulated_matmul(x, w.T, mode), reference)
