"""What mixed precision buys: the step time and peak memory of one transformer block trained in
each precision, measured on a real device and kept as a record the course shows.

``measure(mode, shape, device)`` trains one seeded pre-LayerNorm transformer block (``GptBlock``:
causal self-attention through ``scaled_dot_product_attention`` and a GELU feed-forward, the shape
a ``BlockShape``) for a few AdamW steps in one of ``MODES``:

* "fp32": float32 everywhere, matmuls at ``set_float32_matmul_precision("highest")``;
* "tf32": the same model at "high" (TF32 tensor cores on an NVIDIA GPU since Ampere);
* "bf16": ``torch.autocast`` in bfloat16 (float32 weights, no scaler);
* "fp16+scaler": autocast in float16 with ``torch.amp.GradScaler``;
* "fp8-tensorwise", "fp8-rowwise": every ``nn.Linear`` converted by torchao's
  ``convert_to_float8_training`` with that recipe, the rest under bf16 autocast (torchao's
  ``Float8Linear`` reads the autocast dtype for its output).

Every mode keeps float32 weights and AdamW's float32 states, so the memory differences are the
activations and casts. A step is timed from a device synchronisation to the next (forward,
backward, optimizer step); the step time kept is the median over the timed steps, after warm-up
steps that are not counted; the peak memory is ``torch.cuda.max_memory_allocated`` over the whole
mode (None on a CPU, which has no such counter). ``compiled=True`` runs the block through
``torch.compile`` (its compile time then falls in the warm-up and is reported apart).

``record(...)`` measures the modes one after another and returns a dict (device, versions, date,
the shape and the command that reproduces it, one entry per mode); ``bench/bench_gpu.py --record``
writes it to ``RECORD_PATH``. ``load_record()`` reads that file back (None while none exists:
the course shows a record only once a real device made one) and ``record_table`` prints it with
each mode's time and memory against fp32's from the same run.

This module needs only torch and numpy (torchao for the FP8 modes, converted by
``ampviz.training.fp8_training`` and imported when one runs), so it runs on a bare GPU machine
with the repository on the path.
"""

from __future__ import annotations

import datetime
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from ampviz._args import _flag, _seed, _shown, _whole

__all__ = ["MODES", "BlockShape", "GptBlock", "ModeResult", "measure", "record", "load_record",
           "record_table", "RECORD_PATH", "REPRODUCE"]

MODES = ("fp32", "tf32", "bf16", "fp16+scaler", "fp8-tensorwise", "fp8-rowwise")
#: Where ``bench/bench_gpu.py --record`` keeps the record the course shows.
RECORD_PATH = Path(__file__).with_name("gpu_record.json")
#: The command that makes the record (run from the repository's root on a CUDA machine).
REPRODUCE = "python bench/bench_gpu.py --part block --record ampviz/training/gpu_record.json"
_AUTOCAST = {"bf16": torch.bfloat16, "fp16+scaler": torch.float16, "fp8-tensorwise": torch.bfloat16,
             "fp8-rowwise": torch.bfloat16}


#: The largest block and batch ``BlockShape`` takes (a GPU's), and the largest ``measure`` trains on a CPU.
MAX_PARAMS, MAX_TOKENS = 4_000_000_000, 1 << 20
CPU_MAX_PARAMS, CPU_MAX_TOKENS = 4_000_000, 4096


@dataclass(frozen=True)
class BlockShape:
    """The block and its batch: ``d_model`` wide, ``heads`` attention heads, a feed-forward of
    ``ffn``, and ``batch`` sequences of ``seq`` tokens."""

    d_model: int = 4096
    heads: int = 32
    ffn: int = 16384
    batch: int = 4
    seq: int = 2048

    def __post_init__(self):
        for name in ("d_model", "heads", "ffn", "batch", "seq"):
            object.__setattr__(self, name, _whole(name, getattr(self, name), 1, 1 << 16))
        if self.d_model % self.heads:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of heads ({self.heads})")
        if self.params > MAX_PARAMS or self.tokens > MAX_TOKENS:
            raise ValueError(f"a block of at most {MAX_PARAMS:,} weights and {MAX_TOKENS:,} tokens a step, "
                             f"not {self.params:,} and {self.tokens:,}")

    @property
    def params(self) -> int:
        """The block's weights and biases."""
        d, f = self.d_model, self.ffn
        return 4 * d * d + 4 * d + 2 * d * f + f + d + 4 * d  # qkv, out, fc1, fc2, two LayerNorms

    @property
    def tokens(self) -> int:
        return self.batch * self.seq


class GptBlock(nn.Module):
    """A pre-LayerNorm transformer block: h + attn(LN(h)), then h + fc2(GELU(fc1(LN(h)))), with
    causal attention by ``F.scaled_dot_product_attention``."""

    def __init__(self, d_model: int, heads: int, ffn: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, ffn)
        self.fc2 = nn.Linear(ffn, d_model)

    def forward(self, h):
        b, s, d = h.shape
        q, k, v = self.qkv(self.norm1(h)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.out(a.transpose(1, 2).reshape(b, s, d))
        return h + self.fc2(F.gelu(self.fc1(self.norm2(h))))


@dataclass(frozen=True)
class ModeResult:
    """One mode's measurement: ``step_ms`` (median step time, ms), ``peak_mib`` (peak device memory
    over the mode, MiB; None on a CPU), ``compile_s`` (the first step's time when compiled, else
    None), ``loss_first`` and ``loss_last`` (the training loss at the first and last step, to show
    the run trained), ``error`` (the one-line reason a mode could not run, else None)."""

    mode: str
    step_ms: float | None
    peak_mib: float | None
    compile_s: float | None
    loss_first: float | None
    loss_last: float | None
    error: str | None = None


def _check_mode(mode) -> str:
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, MODES))}, not {_shown(mode)}")
    return mode


def _device(device) -> torch.device:
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be 'cpu' or 'cuda' (a str or torch.device), not {_shown(device)}")
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"device must be 'cpu' or 'cuda', not {device!r}") from e
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', not {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' asked for, but torch sees no CUDA device here")
    return dev


def _sync(dev: torch.device):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _build(mode: str, shape: BlockShape, dev: torch.device, seed: int):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GptBlock(shape.d_model, shape.heads, shape.ffn)
        x = torch.randn(shape.batch, shape.seq, shape.d_model)
        target = torch.randn(shape.batch, shape.seq, shape.d_model)
    if mode.startswith("fp8-"):  # the course's own conversion (real FP8 products: emulate=False)
        from ampviz.training.fp8_training import _convert

        model = _convert(model, mode.split("-")[1], emulate=False)
    return model.to(dev), x.to(dev), target.to(dev)


def measure(mode: str = "fp32", shape: BlockShape | None = None, device="cuda", *, steps: int = 10,
            warmup: int = 3, compiled: bool = False, seed: int = 0, lr: float = 1e-4) -> ModeResult:
    """Train a seeded ``GptBlock`` of ``shape`` (default ``BlockShape()``) for ``warmup`` + ``steps``
    AdamW steps in ``mode`` on ``device`` and return the ``ModeResult``. A mode that cannot run
    here (torchao missing, FP8 matmuls the device lacks, out of memory) gives a result whose
    ``error`` says why, not an exception; bad arguments raise."""
    mode = _check_mode(mode)
    shape = BlockShape() if shape is None else shape
    if not isinstance(shape, BlockShape):
        raise TypeError(f"shape must be a BlockShape, not {_shown(shape)}")
    dev = _device(device)
    if dev.type == "cpu" and (shape.params > CPU_MAX_PARAMS or shape.tokens > CPU_MAX_TOKENS):
        raise ValueError(f"on a CPU, a block of at most {CPU_MAX_PARAMS:,} weights and {CPU_MAX_TOKENS:,} tokens "
                         f"a step (not {shape.params:,} and {shape.tokens:,}): pass a smaller BlockShape")
    steps, warmup = _whole("steps", steps, 1, 10_000), _whole("warmup", warmup, 1, 1_000)
    compiled, seed = _flag("compiled", compiled), _seed(seed)
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not (0 < lr <= 1):
        raise ValueError(f"lr must be a number above 0 and at most 1, not {_shown(lr)}")
    precision = torch.get_float32_matmul_precision()
    model = None
    try:
        torch.set_float32_matmul_precision("high" if mode == "tf32" else "highest")
        if dev.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(dev)
        model, x, target = _build(mode, shape, dev, seed)
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        scaler = torch.amp.GradScaler(dev.type) if mode == "fp16+scaler" else None
        if compiled:
            torch._dynamo.reset()  # each mode compiles afresh, not against the last mode's guards
        forward = torch.compile(model) if compiled else model
        dtype = _AUTOCAST.get(mode)
        times, losses = [], []
        for _ in range(warmup + steps):
            _sync(dev)
            t0 = time.perf_counter()
            with torch.autocast(dev.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                loss = F.mse_loss(forward(x).float(), target)
            opt.zero_grad(set_to_none=True)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
            _sync(dev)
            times.append(time.perf_counter() - t0)
            losses.append(float(loss.detach()))
        peak = torch.cuda.max_memory_allocated(dev) / 2**20 if dev.type == "cuda" else None
        return ModeResult(mode, statistics.median(times[warmup:]) * 1e3, peak,
                          times[0] if compiled else None, losses[0], losses[-1])
    except (ImportError, RuntimeError, NotImplementedError, AssertionError) as e:  # torch.OutOfMemoryError is a RuntimeError
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        return ModeResult(mode, None, None, None, None, None, f"{type(e).__name__}: {reason}")
    finally:
        torch.set_float32_matmul_precision(precision)
        del model
        if dev.type == "cuda":
            torch.cuda.empty_cache()


def _environment(dev: torch.device) -> dict:
    env = {"torch": torch.__version__, "date": datetime.date.today().isoformat()}
    try:
        import torchao

        env["torchao"] = torchao.__version__
    except ImportError:
        env["torchao"] = None
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        env.update(device=props.name, capability=f"{props.major}.{props.minor}", cuda=torch.version.cuda,
                   memory_gib=round(props.total_memory / 2**30, 1))
    else:
        env.update(device="cpu", capability=None, cuda=None, memory_gib=None)
    return env


def record(modes=MODES, shape: BlockShape | None = None, device="cuda", *, steps: int = 10, warmup: int = 3,
           compiled=(False,), deadline_s: float | None = None, on_result=None) -> dict:
    """Measure ``modes`` (each of ``MODES``) on ``device``, eager and/or compiled as ``compiled``
    lists, and return the record: ``{"environment", "shape", "params", "tokens", "steps",
    "warmup", "command", "results": [ModeResult as a dict, with "compiled"]}``. Once
    ``deadline_s`` seconds have passed, the modes not yet begun are left out (and counted in
    ``"skipped"``); ``on_result(record)`` is called after each mode (to save a partial record)."""
    if isinstance(modes, str) or not isinstance(modes, (list, tuple)) or not modes:
        raise TypeError(f"modes must be a list or tuple of {', '.join(map(repr, MODES))}, not {_shown(modes)}")
    modes = tuple(_check_mode(m) for m in modes)
    if not isinstance(compiled, (list, tuple)) or not compiled:
        raise TypeError(f"compiled must be a list or tuple of True/False (eager, compiled), not {_shown(compiled)}")
    compiled = tuple(_flag("compiled", c) for c in compiled)
    if deadline_s is not None and (isinstance(deadline_s, bool) or not isinstance(deadline_s, (int, float))
                                   or not deadline_s >= 0):
        raise ValueError(f"deadline_s must be None or a number of seconds at least 0, not {_shown(deadline_s)}")
    if on_result is not None and not callable(on_result):
        raise TypeError(f"on_result must be None or a function of the record, not {_shown(on_result)}")
    shape = BlockShape() if shape is None else shape
    if not isinstance(shape, BlockShape):
        raise TypeError(f"shape must be a BlockShape, not {_shown(shape)}")
    dev = _device(device)
    steps, warmup = _whole("steps", steps, 1, 10_000), _whole("warmup", warmup, 1, 1_000)
    out = {"environment": _environment(dev), "shape": asdict(shape), "params": shape.params,
           "tokens": shape.tokens, "steps": steps, "warmup": warmup, "command": REPRODUCE,
           "results": [], "skipped": 0}
    t0 = time.perf_counter()
    for c in compiled:
        for mode in modes:
            if deadline_s is not None and time.perf_counter() - t0 > deadline_s:
                out["skipped"] += 1
                continue
            result = measure(mode, shape, dev, steps=steps, warmup=warmup, compiled=c)
            out["results"].append({**asdict(result), "compiled": c})
            if on_result is not None:
                on_result(out)
    return out


def load_record(path=None) -> dict | None:
    """The record ``bench/bench_gpu.py --record`` wrote (``RECORD_PATH`` by default), or None while
    there is none."""
    path = Path(RECORD_PATH if path is None else path)
    if not path.exists():
        return None
    rec = json.loads(path.read_text())
    if not isinstance(rec, dict) or not isinstance(rec.get("results"), list) or "environment" not in rec:
        raise ValueError(f"{path.name} is not a GPU record (no environment and results)")
    return rec


def _fmt(x, unit: str) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:,.0f} {unit}" if x >= 100 else f"{x:.3g} {unit}"


def record_table(rec: dict, *, compiled: bool = False):
    """The record's modes (eager, or ``compiled``) as an ``ampviz.text.Table``: step time, speed-up
    and peak memory against fp32 from the same run, and the loss at the first and last step."""
    from ampviz.text import Table

    if not isinstance(rec, dict) or not isinstance(rec.get("results"), list):
        raise TypeError(f"rec must be a record from load_record(), not {_shown(rec)}")
    rows_in = [r for r in rec["results"] if bool(r.get("compiled")) == bool(compiled)]
    base = next((r for r in rows_in if r["mode"] == "fp32" and r["error"] is None), None)
    rows = []
    for r in rows_in:
        if r["error"] is not None:
            rows.append((r["mode"], "did not run: " + r["error"], "", "", "", ""))
            continue
        speed = f"{base['step_ms'] / r['step_ms']:.2f}x" if base else "-"
        memory = f"{r['peak_mib'] / base['peak_mib']:.2f}x" if base and r["peak_mib"] and base["peak_mib"] else "-"
        rows.append((r["mode"], _fmt(r["step_ms"], "ms"), speed, _fmt(r["peak_mib"], "MiB"), memory,
                     f"{r['loss_first']:.3f} -> {r['loss_last']:.3f}"))
    env = rec["environment"]
    title = (f"{env.get('device')}, torch {env.get('torch')}, CUDA {env.get('cuda')}, torchao {env.get('torchao')}, "
             f"{env.get('date')}; {'torch.compile' if compiled else 'eager'}")
    return Table(("mode", "step time", "speed-up vs fp32", "peak memory", "memory vs fp32", "loss first -> last"),
                 rows, title)
