"""``op_table``: each op of ``OPS`` measured under ``torch.autocast`` in one or two dtypes.

Next to the measured columns: what torch's documentation lists for CUDA (documented, not measured),
and what this build's CUDA autocast does, on a GPU or on fake CUDA tensors; where the device's and
CUDA's rules differ, the last column says so (``OpTable.differences_table``). ``OpRow`` and
``OpTable`` hold the result. The ops and how one is measured: ``ops``.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ampviz.text import Table
from ampviz.pitfalls import autocast_cache
from ampviz._args import _shown
from ampviz.training.autocast.dispatch import SHORT
from ampviz.training.autocast.ops import _OPS, Cell, _documented, _measure

# --------------------------------------------------------------------------------------------
# The op table
# --------------------------------------------------------------------------------------------


class OpRow(NamedTuple):
    """One op: ``measured`` maps each dtype name ("float16") to the ``Cell`` measured on the
    table's device (a read-only mapping); ``cuda_docs``: what torch's documentation lists for CUDA
    (documented, not measured); ``cuda``: this torch build's CUDA autocast in the table's first
    dtype, run on a GPU or on fake CUDA tensors (``OpTable.cuda_source`` says which; an error there
    if the op cannot run on fake tensors); ``differs``: the rule (or the error) of the first
    measured dtype and of ``cuda`` are not the same."""

    op: str
    group: str
    measured: dict
    cuda_docs: Cell
    cuda: Cell
    differs: bool


@dataclass(frozen=True)
class OpTable:
    """``op_table``'s result: ``rows`` (``OpRow``), the ``dtypes`` and ``device`` measured,
    ``cuda_source`` (how the CUDA column was obtained) and ``table`` to print."""

    rows: tuple
    dtypes: tuple
    device: str
    cuda_source: str
    table: Table

    def row(self, op: str) -> OpRow:
        """The row of ``op`` (a name of ``OPS``)."""
        for r in self.rows:
            if r.op == op:
                return r
        raise ValueError(f"unknown op {_shown(op)}: one of the names in ampviz.training.autocast.OPS")

    def differences(self) -> tuple:
        """The ops whose rule differs between the measured device and CUDA."""
        return tuple(r.op for r in self.rows if r.differs)

    def differences_table(self) -> Table:
        """The rows of ``differences()`` only: the op, the measured columns and this build's CUDA
        column (the documented one and the "differs" column left out)."""
        keep = [i for i, c in enumerate(self.table.columns) if not c.startswith("CUDA docs") and " vs " not in c]
        rows = [tuple(row[i] for i in keep) for r, row in zip(self.rows, self.table.rows) if r.differs]
        return Table(tuple(self.table.columns[i] for i in keep), rows,
                     title=f"where {self.device.upper() if self.device == 'cpu' else 'CUDA'} and CUDA autocast "
                           f"differ: {len(rows)} of {len(self.rows)} ops")

    def __str__(self) -> str:
        return str(self.table)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return self.table._repr_html_()


def _dtypes(dtypes) -> tuple:
    if isinstance(dtypes, (str, torch.dtype)):
        dtypes = (dtypes,)
    if not isinstance(dtypes, (list, tuple)):
        raise TypeError(f"dtypes must be one or two of 'float16', 'bfloat16' (a list or tuple), not {_shown(dtypes)}")
    if not 1 <= len(dtypes) <= 2:
        raise ValueError(f"dtypes must be one or two of 'float16', 'bfloat16', not {_shown(dtypes)}")
    out = tuple(autocast_cache._autocast_dtype(d) for d in dtypes)
    if len(set(out)) != len(out):
        raise ValueError(f"dtypes must not repeat a dtype, not {_shown(dtypes)}")
    return out


def _device(device) -> str:
    if not (isinstance(device, str) and device in ("cpu", "cuda")):
        raise ValueError(f"device must be 'cpu' or 'cuda', not {_shown(device)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' is not available here (torch.cuda.is_available() is False): pass 'cpu'")
    return device


#: Where ``op_table`` takes its CUDA column from (its ``cuda`` argument).
CUDA_SOURCES = ("auto", "fake", "gpu")


def _cuda_where(cuda) -> str:
    if not (isinstance(cuda, str) and cuda in CUDA_SOURCES):
        raise ValueError(f"cuda must be one of {', '.join(map(repr, CUDA_SOURCES))}, not {_shown(cuda)}")
    if cuda == "gpu" and not torch.cuda.is_available():
        raise ValueError("cuda='gpu' needs a GPU (torch.cuda.is_available() is False): pass 'fake' or 'auto'")
    if cuda == "fake" or not torch.cuda.is_available():
        return "fake-cuda"
    return "cuda"


def _release() -> str:
    """torch's version without its build tag ("2.13.0", not "2.13.0+cpu" or "+cu128")."""
    return str(torch.__version__).split("+")[0]


def _rule_of(cell: Cell) -> str:
    return "error" if cell.error else cell.rule


def op_table(dtypes=("float16", "bfloat16"), device: str = "cpu", cuda: str = "auto") -> OpTable:
    """Each op of ``OPS`` run under ``torch.autocast(device, dtype=...)`` for each of ``dtypes``
    (one or two of "float16", "bfloat16"), on float32 inputs ("(mixed)" ops: one input in the
    autocast dtype, one float32). Each cell: the output dtype and the rule that gave it:

    - "ran in fp16" / "ran in bf16": autocast cast the inputs down (its lower-precision list);
    - "ran in fp32": autocast runs it in float32 (its fp32 list): found by running the op once more
      on inputs in the autocast dtype, which still gives float32;
    - "as its input": autocast leaves it alone: on inputs in the autocast dtype it stays there;
    - "widest input": mixed inputs, autocast cast the low-precision one up to float32 (its promote
      list; seen as a cast at the dispatcher);
    - "own promotion": mixed inputs, autocast left the op alone; the op's own type promotion gave
      float32;
    - "error: ...": the op raised under autocast.

    The CUDA columns: torch's documented CUDA lists (not measured), and this build's CUDA autocast in
    the first dtype, from where ``cuda`` says: "fake" runs it on fake CUDA tensors (the same
    autocast dispatch picks the dtype; no GPU kernel runs, and none is needed), "gpu" measures it on
    the GPU (only where ``torch.cuda.is_available()``), "auto" (the default) measures it on the GPU
    when there is one, else on fake tensors. With ``cuda="fake"`` the table prints the same text
    with or without a GPU (a lesson's checked output); a test marked ``gpu`` holds the fake run to
    the GPU's. ``device="cuda"`` measures the main columns on the GPU too (only where one is
    available).
    """
    dts, device = _dtypes(dtypes), _device(device)
    cuda_where = _cuda_where(cuda)
    cuda_source = "measured on CUDA" if cuda_where == "cuda" else "this build's CUDA autocast on fake CUDA tensors"
    rows = []
    for op in _OPS:
        measured = types.MappingProxyType({str(dt).replace("torch.", ""): _measure(op, device, dt) for dt in dts})
        cuda = _measure(op, cuda_where, dts[0])
        first = measured[str(dts[0]).replace("torch.", "")]
        rows.append(OpRow(op.name, op.group, measured, _documented(op, dts[0]), cuda,
                          _rule_of(first) != _rule_of(cuda)))
    dev = device.upper() if device == "cpu" else "CUDA"
    columns = ("op", *(f"{dev} {SHORT[dt]} (measured)" for dt in dts), "CUDA docs (not measured)",
               f"CUDA {SHORT[dts[0]]} ({'measured' if cuda_where == 'cuda' else 'fake tensors'})",
               f"{dev} vs CUDA")
    table_rows = [(r.op, *map(str, r.measured.values()), str(r.cuda_docs), str(r.cuda),
                   "differs" if r.differs else "same") for r in rows]
    title = f"torch {_release()}: torch.autocast on float32 inputs"
    return OpTable(tuple(rows), tuple(str(d).replace("torch.", "") for d in dts), device, cuda_source,
                   Table(columns, table_rows, title=title))
