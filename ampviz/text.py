"""How the lessons print numbers and tables: ``number`` (an exact value), ``measured`` (a value float
arithmetic computed, at the digits the lesson needs, the same on every CPU) and ``Table`` (a small
text/HTML table whose text is stable from run to run). numpy only.
"""

from __future__ import annotations

import html
import math
import os
from dataclasses import dataclass

import numpy as np

__all__ = ['Table', 'number', 'measured']


# --------------------------------------------------------------------------------------------
# Display
# --------------------------------------------------------------------------------------------


def number(x, *, digits: int = 8, pow2: bool = False) -> str:
    """A value as the lessons print it: ``2^-24`` for powers of two far from 1, else ``%.{digits}g``.

    Powers of two from 2^-2 to 2^16 print as plain numbers (0.25, 1024, 65536), others as ``2^e``
    (with ``pow2=True``, every power of two but 1 does); infinities and NaN print as ``inf``,
    ``-inf`` and ``nan``.
    """
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "-0" if math.copysign(1.0, x) < 0 else "0"
    mant, exp = math.frexp(abs(x))
    if mant == 0.5 and (not -2 <= exp - 1 <= 16 or (pow2 and exp != 1)):
        return f"{'-' if x < 0 else ''}2^{exp - 1}"
    return f"{x:.{digits}g}"


#: How far (relative) a measured value may move on another CPU without changing its printed text.
MEASURED_REL = 1e-6
#: Set to "1" where checked outputs are written or compared (the notebooks' runs in the tests, and
#: tools/run_notebooks.py): ``measured`` then refuses a value on a rounding boundary.
STRICT_DIGITS = "AMPVIZ_STRICT_DIGITS"


def measured(x, digits: int = 4, *, pow2: bool = False) -> str:
    """A value that float arithmetic computed (a norm, a loss, an error), printed as a lesson shows
    it: ``digits`` significant digits, the same text on every CPU.

    Another vendor's BLAS or vector kernels sum in another order, so the last bits of such a value
    differ between machines. The text is the same for every value within ``MEASURED_REL`` (1e-6,
    relative) of ``x``. Where checked outputs are written or compared (the environment variable
    ``AMPVIZ_STRICT_DIGITS`` is "1"), a value that sits closer than that to a rounding boundary at
    ``digits`` digits raises ``ValueError`` (print it with fewer digits, or print a verdict
    instead); elsewhere (a learner's own values) it prints as it is. Zero,
    infinities and NaN print as ``number`` prints them. With ``pow2=True``, a value that is a power
    of two at ``digits`` digits (0.99999982 × 2^-16) prints as ``number`` prints that power (2^-16).
    """
    if isinstance(digits, bool) or not isinstance(digits, (int, np.integer)) or not 1 <= digits <= 9:
        raise ValueError(f"digits must be a whole number from 1 to 9, not {' '.join(repr(digits).split())[:60]}")
    try:
        x = float(x)
    except (TypeError, ValueError):
        raise ValueError(f"measured takes one real number, not {type(x).__name__}") from None
    if x == 0 or not math.isfinite(x):
        return number(x)
    if pow2:
        power = math.ldexp(1.0, round(math.log2(abs(x))))
        if measured(abs(x) / power, digits) == "1":
            return number(math.copysign(power, x), pow2=True)
    text = f"{x:.{digits}g}"
    if os.environ.get(STRICT_DIGITS) != "1":
        return text
    for near in (x * (1 - MEASURED_REL), x * (1 + MEASURED_REL)):
        if f"{near:.{digits}g}" != text:
            raise ValueError(f"{x!r} sits within {MEASURED_REL:g} (relative) of a rounding boundary at {digits} "
                             "significant digits, so another CPU may print it otherwise: print fewer digits or a verdict")
    return text


@dataclass(frozen=True)
class Table:
    """Rows of strings with column headings; prints as aligned text and renders as HTML."""

    columns: tuple
    rows: tuple
    title: str = ""

    def __post_init__(self):
        object.__setattr__(self, "columns", tuple(str(c) for c in self.columns))
        object.__setattr__(self, "rows", tuple(tuple(str(v) for v in r) for r in self.rows))
        for r in self.rows:
            if len(r) != len(self.columns):
                raise ValueError(f"row {r!r} has {len(r)} cells, expected {len(self.columns)}")

    def column(self, name: str) -> tuple:
        """The cells of one column, by heading."""
        i = self.columns.index(name)
        return tuple(r[i] for r in self.rows)

    def __str__(self) -> str:
        widths = [max(len(c), *(len(r[i]) for r in self.rows)) if self.rows else len(c)
                  for i, c in enumerate(self.columns)]
        line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
        out = [self.title] if self.title else []
        out += [line(self.columns), line(["-" * w for w in widths])]
        out += [line(r) for r in self.rows]
        return "\n".join(out)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        esc = html.escape
        head = "".join(f"<th>{esc(c)}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(f"<td>{esc(v)}</td>" for v in r) + "</tr>" for r in self.rows)
        cap = f"<caption>{esc(self.title)}</caption>" if self.title else ""
        return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


