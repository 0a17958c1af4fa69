"""One layer, and any code, under autocast, as the dispatcher sees it.

``layer_walk``: one ``nn.Linear`` under CPU autocast (the casts of its input, weight and bias, the
``addmm`` on the copies, the path back to the fp32 weight in the autograd graph, its fp32 gradient);
``under_autocast``: the same record for any code (a lesson's *Try it*), as an ``AutocastRun``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ampviz.text import Table
from ampviz.pitfalls import autocast_cache
from ampviz._args import _shown
from ampviz.training.autocast.dispatch import _dt, _dt_name, _error, _OpLog

# --------------------------------------------------------------------------------------------
# One layer, and any code, under autocast: the ops that reach the dispatcher
# --------------------------------------------------------------------------------------------


def _grad_path(y, names: dict) -> str:
    """``y``'s autograd graph from the output down to the named leaves, one path per leaf:
    "AddmmBackward0 ← TBackward0 ← ToCopyBackward0 ← lin.weight"."""
    paths = []

    def walk(node, path):
        if node is None:
            return
        var = getattr(node, "variable", None)
        if var is not None:
            paths.append(" ← ".join(path + [names.get(id(var), "a leaf")]))
            return
        for nxt, _ in node.next_functions:
            walk(nxt, path + [type(node).__name__])

    walk(y.grad_fn, [])
    return paths


def layer_walk(dtype="float16") -> Table:
    """One ``nn.Linear(8, 4)`` (seed 0) on a float32 batch of 4 under ``torch.autocast("cpu",
    dtype=dtype)``, then a backward pass after the block, as seen at the dispatcher: each op that
    ran (the casts autocast made, named by their source, and the matrix product) with the dtypes
    of its inputs and output; the parameter's dtype before, inside and after the block; the path
    from the output back to the weight in the autograd graph; the dtype of the weight's gradient.

    What it shows on torch 2.13: autocast never changes a parameter; it makes a low-precision copy
    of the input, the weight and the bias (``aten._to_copy``) and runs ``aten.addmm`` on the copies;
    the output is in ``dtype``; the gradient flows back through the cast (``ToCopyBackward0``) and
    arrives in float32, the parameter's dtype."""
    dt = autocast_cache._autocast_dtype(dtype)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        lin = nn.Linear(8, 4)
        x = torch.randn(4, 8)
    names = {id(x): "x", id(lin.weight): "lin.weight", id(lin.bias): "lin.bias"}
    rows = [("x, the input", _dt(x.dtype)), ("lin.weight, lin.bias", f"{_dt(lin.weight.dtype)}, {_dt(lin.bias.dtype)}")]
    with _OpLog() as log:
        with torch.autocast("cpu", dtype=dt):
            y = lin(x)
            inside = lin.weight.dtype
    for name, inputs, outs in log.ops:
        ins = ", ".join(_dt(t.dtype) for t in inputs)
        if name == "_to_copy":
            src = names.get(id(inputs[0]), "a tensor")
            rows.append((f"autocast casts {src}: aten._to_copy", f"{ins} → {_dt(outs[0])} (a new tensor)"))
        else:
            rows.append((f"aten.{name}", f"{ins} → {', '.join(map(_dt, outs))}"))
    rows.append(("y = lin(x)", _dt(y.dtype)))
    rows.append(("lin.weight, inside the block", _dt(inside)))
    for path in _grad_path(y, names):
        rows.append((f"y's graph, back to {path.rsplit(' ← ', 1)[-1]}", path))
    y.float().pow(2).mean().backward()
    rows.append(("after the block: lin.weight, lin.weight.grad",
                 f"{_dt(lin.weight.dtype)}, {_dt(lin.weight.grad.dtype)}"))
    return Table(("nn.Linear(8, 4) on x", "dtype"), rows,
                 title=f'y = lin(x) under torch.autocast("cpu", dtype=torch.{_dt_name(dt)}), then a backward pass')


@dataclass(frozen=True)
class AutocastRun:
    """``under_autocast``'s result: ``ops`` (name, input dtypes, output dtypes) in the order they
    reached the dispatcher (``_to_copy`` rows are casts; autocast's own casts among them);
    ``output``: the dtype of each tensor ``fn`` returned; ``error``: "Type: message" if it raised."""

    dtype: str
    device: str
    ops: tuple
    output: tuple
    error: str | None

    def table(self) -> Table:
        rows = [(("cast " if name == "_to_copy" else "") + f"aten.{name}", ", ".join(ins) or "-", ", ".join(outs))
                for name, ins, outs in self.ops]
        end = f"raised {self.error}" if self.error else "output " + ", ".join(self.output)
        return Table(("op", "inputs", "output"), rows,
                     title=f'under torch.autocast("{self.device}", dtype=torch.{self.dtype}): {end}')

    def __str__(self) -> str:
        return str(self.table())

    __repr__ = __str__


MAX_TRY_OPS = 200


def under_autocast(fn, *args, dtype="float16") -> AutocastRun:
    """Call ``fn(*args)`` under ``torch.autocast("cpu", dtype=dtype)`` and record every op that
    reaches the dispatcher (casts included), with the dtypes of its tensor inputs and outputs, and
    the dtype of what ``fn`` returned (a tensor, or a tuple or list of them). An exception ``fn``
    raises is the result ("Type: message"), not an error of this function. The first
    ``MAX_TRY_OPS`` ops are kept."""
    if not callable(fn):
        raise TypeError(f"fn must be a function of the tensors that follow it (e.g. lambda x: x.softmax(-1)), "
                        f"not {_shown(fn)}")
    dt = autocast_cache._autocast_dtype(dtype)
    error, output = None, ()
    with _OpLog() as log:
        try:
            with torch.autocast("cpu", dtype=dt):
                out = fn(*args)
        except Exception as exc:  # noqa: BLE001 - what the learner's code raises is the result
            error = _error(exc)
        else:
            outs = out if isinstance(out, (list, tuple)) else (out,)
            output = tuple(_dt(o.dtype) if isinstance(o, torch.Tensor) else type(o).__name__ for o in outs)
    ops = tuple((name, tuple(_dt(t.dtype) for t in ins), tuple(map(_dt, outs)))
                for name, ins, outs in log.ops[:MAX_TRY_OPS])
    return AutocastRun(_dt_name(dt), "cpu", ops, output, error)
