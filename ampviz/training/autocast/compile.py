"""The autocast weight cache and ``torch.compile``.

``compile_report``, ``compile_table``: a weight changed in place between two forwards inside one
autocast block: the eager forward reuses the cached low-precision copy (stale), a ``torch.compile``-d
forward casts the weight on every call and sees the update.
"""

from __future__ import annotations

import itertools
import time
import warnings
from dataclasses import dataclass

import torch
from torch import nn

from ampviz.text import Table
from ampviz.pitfalls import autocast_cache
from ampviz._args import _shown
from ampviz.training.autocast.dispatch import SHORT

# --------------------------------------------------------------------------------------------
# torch.compile
# --------------------------------------------------------------------------------------------

#: The ``torch.compile`` backends ``compile_report`` takes: "aot_eager" traces and runs the graph
#: with eager kernels (about a second); "inductor" generates and compiles C++ (its first compile in
#: a fresh cache takes many seconds, later ones reuse its on-disk cache). ``compile_report`` reports
#: the time it took.
BACKENDS = ("aot_eager", "inductor")
_fresh = itertools.count()


@dataclass(frozen=True)
class CompileReport:
    """``compile_report``'s result: ``backend``; ``output_dtype`` of the eager and of the compiled
    forward under autocast; ``eager_sees_update``/``compiled_sees_update``: whether, inside one
    autocast block, a forward after an in-place update of the weight gives a different output
    (eager: no, the cached copy; compiled: the graph casts the weight on every call);
    ``same_as_fresh_eager``: the compiled output after the update equals, bit for bit, an eager
    forward of the updated weight in a fresh block; ``seconds``: the compile and first call."""

    backend: str
    dtype: str
    output_dtype: str
    compiled_output_dtype: str
    eager_sees_update: bool
    compiled_sees_update: bool
    same_as_fresh_eager: bool
    seconds: float
    warnings: tuple = ()


def _fresh_forward():
    """``forward(model, x) = model(x)`` as a new code object each time, so each ``torch.compile``
    compiles afresh (no recompiles of a shared one, no global reset)."""
    namespace = {}
    exec(compile("def forward(model, x):\n    return model(x)\n", f"<ampviz.training.autocast forward {next(_fresh)}>",
                 "exec"), namespace)
    return namespace["forward"]


def _updated_twice(forward, dt):
    """``(y1, y2, fresh)``: y1, an in-place update of the weight, y2 in one autocast block; then an
    eager forward of the updated weight in a new block."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        lin = nn.Linear(8, 4)
        x = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=dt):
        y1 = forward(lin, x)
        with torch.no_grad():
            lin.weight.add_(1.0)
        y2 = forward(lin, x)
    with torch.autocast("cpu", dtype=dt):
        fresh = lin(x)
    return y1.detach(), y2.detach(), fresh.detach()


def compile_report(backend: str = "aot_eager", dtype="bfloat16") -> CompileReport:
    """``forward(model, x) = model(x)`` compiled with ``torch.compile(backend=backend)`` (one of
    ``BACKENDS``) and called twice inside one CPU autocast block in ``dtype``, with the weight
    changed in place between the calls, beside the same in eager mode. Measured on torch 2.13: the
    eager forward reuses the cached low-precision weight (stale); the compiled forward sees the
    update (Dynamo traces autocast into the graph with its cache off, so the graph casts the
    weight on every call)."""
    if not (isinstance(backend, str) and backend in BACKENDS):
        raise ValueError(f"unknown backend {_shown(backend)}: one of {', '.join(map(repr, BACKENDS))}")
    dt = autocast_cache._autocast_dtype(dtype)
    e1, e2, _ = _updated_twice(lambda model, x: model(x), dt)
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = torch.compile(_fresh_forward(), backend=backend)
        c1, c2, fresh = _updated_twice(compiled, dt)
    seconds = time.perf_counter() - start
    return CompileReport(backend=backend, dtype=str(dt).replace("torch.", ""), output_dtype=SHORT[e2.dtype],
                         compiled_output_dtype=SHORT[c2.dtype], eager_sees_update=not torch.equal(e1, e2),
                         compiled_sees_update=not torch.equal(c1, c2), same_as_fresh_eager=torch.equal(c2, fresh),
                         seconds=seconds, warnings=tuple(str(w.message).splitlines()[0] for w in caught))


def compile_table(backend: str = "aot_eager", dtype="bfloat16") -> Table:
    """``compile_report(backend, dtype)`` as a table, beside the same two forwards in eager mode:
    for each, the output dtype, whether the second forward (after the in-place update of the
    weight, inside the same autocast block) gives a different output, and whether it equals an
    eager forward of the updated weight in a fresh block. No timings (they change from run to run)."""
    r = compile_report(backend, dtype)
    dt = autocast_cache._autocast_dtype(dtype)
    _, e2, fresh = _updated_twice(lambda model, x: model(x), dt)
    yes = lambda b: "yes" if b else "no"  # noqa: E731
    rows = [("eager", r.output_dtype, "yes" if r.eager_sees_update else "no: stale copy",
             yes(torch.equal(e2, fresh))),
            (f'torch.compile(forward, backend="{r.backend}")', r.compiled_output_dtype,
             "yes" if r.compiled_sees_update else "no: stale copy", yes(r.same_as_fresh_eager))]
    return Table(("forward", "output", "y2 sees the in-place update", "y2 equals a fresh eager forward"), rows,
                 title=f"y1 = forward(lin, x); lin.weight.add_(1); y2 = forward(lin, x), in one {SHORT[dt]} CPU "
                       "autocast block")
