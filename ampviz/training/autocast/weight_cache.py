"""The autocast weight cache, counted at the dispatcher.

``weight_casts``: how often autocast casts a weight in two forwards of a ``nn.Linear``, in each
arrangement of ``CACHE_CASES`` (one block, nested blocks, separate blocks, ``cache_enabled=False``,
``torch.clear_autocast_cache()``, ``no_grad``, ``inference_mode``, a frozen weight, a nested block
with the other dtype); ``cache_table`` puts next to each count whether a weight changed in place
between the forwards is seen (``ampviz.pitfalls.autocast_cache.in_place_update``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

from ampviz.text import Table
from ampviz.pitfalls import autocast_cache
from ampviz._args import _shown
from ampviz.training.autocast.dispatch import SHORT, _CastLog, _error

# --------------------------------------------------------------------------------------------
# The weight cache
# --------------------------------------------------------------------------------------------

#: Arrangements of two forwards ``y1 = lin(x)``, ``y2 = lin(x)``; keys are ``weight_casts``'s ``case``.
CACHE_CASES = {
    "one_block": "both forwards in one autocast block",
    "nested_blocks": "each forward in an inner autocast, inside one outer block",
    "separate_blocks": "each forward in its own autocast block",
    "cache_disabled": "one block with cache_enabled=False",
    "clear_cache": "one block, torch.clear_autocast_cache() between the forwards",
    "no_grad": "one block, both forwards under torch.no_grad()",
    "no_grad_then_grad": "one block, the first forward under torch.no_grad()",
    "inference_mode": "one block, all under torch.inference_mode()",
    "frozen_weight": "one block, the weight frozen (requires_grad_(False))",
    "other_dtype_inside": "one block, the second forward in an inner block with the other dtype",
    "no_autocast": "no autocast",
}
#: ``cache_table``'s stale column: the ``ampviz.pitfalls.autocast_cache.STALE_CASES`` key of each case.
_STALE_CASE = {"one_block": "one_block", "nested_blocks": "nested_blocks", "separate_blocks": "separate_blocks",
               "cache_disabled": "cache_disabled", "clear_cache": "clear_cache", "no_grad": "no_grad_passes",
               "inference_mode": "inference_mode", "frozen_weight": "frozen_weight", "no_autocast": "no_autocast"}


@dataclass(frozen=True)
class CacheReport:
    """``weight_casts``'s result: ``weight_casts``/``bias_casts``/``input_casts``: how many casts of
    the layer's weight, bias and input reached the dispatcher in the two forwards (each cast autocast
    makes is one ``aten._to_copy``/``aten.to``; a cached copy reused makes none); ``output_dtypes``;
    ``grad_fn``: whether the second output has a ``grad_fn``; ``shared_copy``: whether both outputs
    hang on the same cast node of the weight in the autograd graph (None where there is no graph);
    ``error``: "Type: message" if the second forward raised; ``inside_autocast``: the call itself
    ran inside an autocast block (then that outer block, not these, decides when the cache is
    emptied)."""

    case: str
    description: str
    dtype: str
    weight_casts: int
    bias_casts: int
    input_casts: int
    output_dtypes: tuple
    grad_fn: bool | None
    shared_copy: bool | None
    error: str | None
    inside_autocast: bool


def _case(case) -> str:
    if not (isinstance(case, str) and case in CACHE_CASES):
        raise ValueError(f"unknown case {_shown(case)}: one of {', '.join(map(repr, CACHE_CASES))}")
    return case


def _weight_node(y, weight):
    """The ``ToCopyBackward0`` node (the cast of ``weight``) that ``y`` hangs on (None if none)."""
    seen, todo = set(), [y.grad_fn] if y is not None and y.grad_fn is not None else []
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__ == "ToCopyBackward0":
            leaves = [n for n, _ in node.next_functions if n is not None]
            if any(getattr(n, "variable", None) is weight for n in leaves):
                return node
        todo.extend(n for n, _ in node.next_functions)
    return None


def _autocast_depth() -> int:
    depth = torch.autocast_increment_nesting()
    torch.autocast_decrement_nesting()
    return depth - 1


def weight_casts(case: str = "one_block", dtype="float16") -> CacheReport:
    """Two forwards of ``nn.Linear(8, 4)`` (seed 0) on the same input, arranged as ``case`` says (a
    key of ``CACHE_CASES``), under CPU autocast in ``dtype``; every dtype cast that reaches the
    dispatcher is counted (a ``TorchDispatchMode`` below autocast), per source tensor.

    On torch 2.13: a weight that requires grad is cast once for both forwards of one block (the
    second forward reuses the cached copy: ``weight_casts == 1``, and in grad mode both outputs hang
    on the same cast node), also in nested blocks and under ``no_grad`` (cached copies carry grad:
    pytorch/pytorch PR #165068); it is cast for each forward with ``cache_enabled=False``, after
    ``torch.clear_autocast_cache()``, in separate blocks (the cache is emptied when the outermost
    block exits), under ``inference_mode`` and for a frozen weight. The input is cast every time.
    ``other_dtype_inside``: the cache is keyed by the weight alone, so an inner block with the other
    dtype is handed the cached copy in the first dtype and the matrix product raises.
    (``clear_cache`` empties the whole cache, an enclosing block's too.)"""
    case, dt = _case(case), autocast_cache._autocast_dtype(dtype)
    other = torch.bfloat16 if dt == torch.float16 else torch.float16
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        lin = nn.Linear(8, 4)
        x = torch.randn(4, 8)
    if case == "frozen_weight":
        lin.requires_grad_(False)
    inside = _autocast_depth() > 0
    block = lambda **kw: torch.autocast("cpu", dtype=kw.pop("dtype", dt), **kw)  # noqa: E731
    ys, error = [], None
    with _CastLog() as log:
        try:
            if case == "no_autocast":
                ys += [lin(x), lin(x)]
            elif case == "separate_blocks":
                with block():
                    ys.append(lin(x))
                with block():
                    ys.append(lin(x))
            elif case == "nested_blocks":
                with block():
                    with block():
                        ys.append(lin(x))
                    with block():
                        ys.append(lin(x))
            else:
                mode = (torch.inference_mode() if case == "inference_mode" else
                        torch.no_grad() if case == "no_grad" else contextlib.nullcontext())
                with mode, block(cache_enabled=case != "cache_disabled"):
                    with torch.no_grad() if case == "no_grad_then_grad" else contextlib.nullcontext():
                        ys.append(lin(x))
                    if case == "clear_cache":
                        torch.clear_autocast_cache()
                    if case == "other_dtype_inside":
                        with block(dtype=other):
                            ys.append(lin(x))
                    else:
                        ys.append(lin(x))
        except RuntimeError as exc:  # the other dtype's cached copy: the lesson is the error
            error = _error(exc)
    count = lambda t: sum(src is t for src, _, _ in log.casts)  # noqa: E731
    last = ys[-1] if len(ys) == 2 else None
    nodes = [_weight_node(y, lin.weight) for y in ys]
    shared = (nodes[0] is nodes[1]) if len(nodes) == 2 and None not in nodes else None
    return CacheReport(
        case=case, description=CACHE_CASES[case], dtype=str(dt).replace("torch.", ""),
        weight_casts=count(lin.weight), bias_casts=count(lin.bias), input_casts=count(x),
        output_dtypes=tuple(SHORT[y.dtype] for y in ys), grad_fn=None if last is None else last.grad_fn is not None,
        shared_copy=shared, error=error, inside_autocast=inside)


def _cases(cases) -> tuple:
    if cases is None:
        return tuple(CACHE_CASES)
    if isinstance(cases, str):
        cases = (cases,)
    if not isinstance(cases, (list, tuple)) or not cases:
        raise TypeError(f"cases must be a list of keys of CACHE_CASES ({', '.join(map(repr, CACHE_CASES))}), "
                        f"not {_shown(cases)}")
    return tuple(_case(c) for c in cases)


def cache_table(cases=None, dtype="float16") -> Table:
    """``weight_casts`` for each of ``cases`` (keys of ``CACHE_CASES``; default: all) in ``dtype``:
    the casts of the weight in two forwards, and whether a weight changed in place between two
    forwards is seen by the second (``ampviz.pitfalls.autocast_cache.in_place_update``, the same
    arrangement; "—" where it has none). One cast for two forwards means the second forward used
    the cached copy, and a cached copy does not see an in-place update."""
    cases, dt = _cases(cases), autocast_cache._autocast_dtype(dtype)
    rows = []
    for case in cases:
        r = weight_casts(case, dt)
        casts = f"raises {r.error.split(':')[0]}" if r.error else str(r.weight_casts)
        stale = "—"
        if case in _STALE_CASE:
            o = autocast_cache.in_place_update(_STALE_CASE[case], dt)
            stale = o.error_type if o.failed else ("yes" if o.details["output changed"] else "no: stale copy")
        rows.append((r.description, casts, stale))
    return Table(("two forwards of nn.Linear", "casts of the weight", "sees an in-place update"), rows,
                 title=f"the autocast weight cache, {SHORT[dt]} CPU autocast")
