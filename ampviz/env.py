"""What this machine can do for mixed precision, measured rather than promised.

``check()`` reports the versions the course depends on and runs a few quick probes on the best
device torch finds (a CUDA GPU, Apple's MPS, else the CPU): does a float16 / bfloat16 matrix
multiply run, how fast is it compared with float32 on the same device (a measured ratio on small
matrices, so a rough one), and does ``torch.autocast`` on that device produce float16 / bfloat16
results. A probe that fails reports "not supported: <reason>"; ``check()`` itself never raises
(it refuses only arguments that are not a device, a matrix size or a time budget).
On many CPUs float16 matmuls are far *slower* than float32: that is what the probe is for.

torch is imported inside ``check()``, so importing this module stays cheap.
"""

from __future__ import annotations

import html
import numbers
import operator
import platform
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from importlib import metadata

from ampviz._args import _shown

__all__ = ["Probe", "EnvReport", "check", "PACKAGES"]

#: Distributions whose versions the report lists (the import name is not needed: no import happens).
PACKAGES = ("torch", "numpy", "plotly", "ipywidgets", "jupyterlab", "ampviz")

#: The largest matrix ``check`` multiplies: a 1024×1024 float16 matmul takes seconds on a CPU
#: without fast float16, 2048×2048 a minute.
MAX_SIZE = 512
#: The longest time budget of one timing, in seconds (there are three).
MAX_BUDGET_S = 2.0


@dataclass(frozen=True)
class Probe:
    """One measured fact: ``supported`` and a one-line ``detail``; ``speed`` is the measured
    speed relative to float32 (2.0 = twice as fast) where the probe times something."""

    name: str
    supported: bool
    detail: str
    speed: float | None = None

    def __str__(self) -> str:
        return self.detail if self.supported else f"not supported: {self.detail}"


@dataclass(frozen=True)
class EnvReport:
    python: str
    versions: dict
    cpu: str
    gpu: str
    device: str
    probes: tuple = field(default_factory=tuple)

    def probe(self, name: str) -> Probe:
        for p in self.probes:
            if p.name == name:
                return p
        raise KeyError(name)

    def _rows(self):
        yield "python", self.python
        for name, v in self.versions.items():
            yield name, v
        yield "cpu", self.cpu
        yield "gpu", self.gpu

    def __str__(self) -> str:
        lines = ["Versions and hardware"]
        lines += [f"  {k:<12}{v}" for k, v in self._rows()]
        lines.append(f"Measured on this machine's {self.device}")
        lines += [f"  {p.name:<15}{p}" for p in self.probes]
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        esc = html.escape
        rows = "".join(f"<tr><th style='text-align:left'>{esc(k)}</th><td style='text-align:left'>"
                       f"{esc(str(v))}</td></tr>" for k, v in self._rows())
        probes = "".join(
            f"<tr><th style='text-align:left'>{esc(p.name)}</th><td style='text-align:left'>"
            f"{'✓ ' if p.supported else '✗ '}{esc(str(p))}</td></tr>" for p in self.probes)
        return (f"<table><caption style='text-align:left'>Versions and hardware</caption>{rows}</table>"
                f"<table><caption style='text-align:left'>Measured on this machine's "
                f"{esc(self.device)}</caption>{probes}</table>")


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"
    except Exception as e:  # a broken installation must not stop the report
        return f"unknown ({type(e).__name__})"


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _reason(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    text = text if len(text) <= 160 else text[:157] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _run_quietly(fn):
    """fn() with warnings recorded instead of shown (or raised); returns (result, warning texts)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [str(w.message).strip().splitlines()[0] for w in caught]


def _pick_device(torch) -> tuple[str, str]:
    """(device type, GPU description)."""
    try:
        if torch.cuda.is_available():
            names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
            return "cuda", f"{torch.cuda.device_count()} × CUDA: {', '.join(names)}"
    except Exception as e:
        return "cpu", f"CUDA present but unusable ({_reason(e)})"
    try:
        if torch.backends.mps.is_available():
            return "mps", "Apple MPS"
    except Exception:
        pass
    return "cpu", "none found"


def _timer(torch, device: str, budget_s: float):
    def sync():
        if device == "cuda":
            torch.cuda.synchronize()
        elif device == "mps":
            torch.mps.synchronize()

    def time_it(fn) -> float:
        """Median seconds per call of fn: one warm-up, then calls for about budget_s (at least 3,
        or just 1 when a single call already takes longer than the budget)."""
        t = time.perf_counter()
        fn()
        sync()
        at_least = 3 if time.perf_counter() - t < budget_s / 3 else 1
        times = []
        start = time.perf_counter()
        while len(times) < at_least or (time.perf_counter() - start < budget_s and len(times) < 50):
            t = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    return time_it


def _matmul_probe(torch, device, dtype, size, time_it, fp32_time) -> Probe:
    label = {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    name = f"{label} matmul"
    try:
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(size, size, generator=gen).to(device=device, dtype=dtype)
        b = torch.randn(size, size, generator=gen).to(device=device, dtype=dtype)
        (out, seconds), notes = _run_quietly(lambda: ((a @ b), time_it(lambda: a @ b)))
        if out.dtype != dtype or not bool(torch.isfinite(out).all()):
            return Probe(name, False, f"the result was {out.dtype} or not finite")
        speed = fp32_time / seconds if fp32_time else None
        if speed is None:
            detail = f"runs ({size}×{size}); no fp32 timing to compare with"
        else:
            word = "faster" if speed >= 1 else "slower"
            factor = speed if speed >= 1 else 1 / speed
            detail = (f"runs; {factor:.2g}× {word} than fp32 here "
                      f"(measured: {size}×{size} matmul, median of repeats)")
        if notes:
            detail += f"; warned: {notes[0]}"
        return Probe(name, True, detail, speed)
    except Exception as e:
        return Probe(name, False, _reason(e))


def _autocast_probe(torch, device, device_type, dtype) -> Probe:
    label = {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    name = f"autocast {label}"
    try:
        a = torch.ones(8, 8, device=device)

        def run():
            with torch.autocast(device_type=device_type, dtype=dtype):
                return a @ a

        out, notes = _run_quietly(run)
        if out.dtype != dtype:
            why = f"matmul output stayed {str(out.dtype).replace('torch.', '')}"
            return Probe(name, False, why + (f" ({notes[0]})" if notes else ""))
        detail = f"runs (matmul output {str(out.dtype).replace('torch.', '')})"
        return Probe(name, True, detail + (f"; warned: {notes[0]}" if notes else ""))
    except Exception as e:
        return Probe(name, False, _reason(e))


def _check_arguments(device, size, budget_s) -> tuple:
    is_torch_device = type(device).__name__ == "device" and type(device).__module__.split(".")[0] == "torch"
    if device is not None and not isinstance(device, str) and not is_torch_device:
        raise TypeError(f"device must be None (the best found) or a device name such as 'cpu', 'cuda' "
                        f"or 'mps', not {_shown(device)}")
    if isinstance(size, bool) or not isinstance(size, numbers.Integral):
        raise TypeError(f"size must be a whole number (the matrices are size × size), not {_shown(size)}")
    if not 1 <= operator.index(size) <= MAX_SIZE:
        raise ValueError(f"size must be between 1 and {MAX_SIZE} (a larger float16 matmul can take minutes "
                         f"on a CPU), not {_shown(size)}")
    if isinstance(budget_s, bool) or not isinstance(budget_s, numbers.Real):
        raise TypeError(f"budget_s must be a number of seconds, not {_shown(budget_s)}")
    if not 0 <= float(budget_s) <= MAX_BUDGET_S:
        raise ValueError(f"budget_s must be between 0 and {MAX_BUDGET_S:g} seconds, not {_shown(budget_s)}")
    return device, operator.index(size), float(budget_s)


def _device(torch, device):
    """The device as torch names it ("cpu", "cuda:1"), and its type for autocast ("cuda")."""
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise ValueError(f"device must be a device name such as 'cpu', 'cuda', 'cuda:0' or 'mps', "
                         f"not {_shown(device)}") from None
    return str(dev), dev.type


def check(device: str | None = None, *, size: int = 256, budget_s: float = 0.1) -> EnvReport:
    """Versions, hardware, and measured fp16/bf16 support on ``device`` (default: the best found).

    Each timing runs for about ``budget_s`` seconds (at least 3 calls, at most 50); the whole check
    takes well under a second on most machines (plus the import of torch). ``size``: the side of
    the matrices multiplied (1 to 512); ``budget_s``: 0 to 2 seconds.
    """
    device, size, budget_s = _check_arguments(device, size, budget_s)
    python = f"{platform.python_version()} ({sys.implementation.name})"
    versions = {name: _version(name) for name in PACKAGES}
    cpu = _cpu_name()
    try:
        import torch
    except Exception as e:
        reason = f"torch could not be imported ({_reason(e)})"
        probes = tuple(Probe(n, False, reason) for n in
                       ("fp16 matmul", "bf16 matmul", "autocast fp16", "autocast bf16"))
        return EnvReport(python, versions, cpu, "unknown (no torch)", str(device or "cpu"), probes)

    found, gpu = _pick_device(torch)
    device, device_type = _device(torch, found if device is None else device)
    time_it = _timer(torch, device_type, budget_s)
    try:
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(size, size, generator=gen).to(device)
        fp32_time = time_it(lambda: a @ a)
    except Exception:
        fp32_time = None
    probes = (
        _matmul_probe(torch, device, torch.float16, size, time_it, fp32_time),
        _matmul_probe(torch, device, torch.bfloat16, size, time_it, fp32_time),
        _autocast_probe(torch, device, device_type, torch.float16),
        _autocast_probe(torch, device, device_type, torch.bfloat16),
    )
    return EnvReport(python, versions, cpu, gpu, device, probes)
