"""Small, tested building blocks for the lesson notebooks (numpy only).

The notebooks show their results through these functions so that they hold no logic of their own:

* ``Table``: a small text/HTML table whose text is stable from run to run (notebook outputs are
  compared against stored ones);
* ``format_table``, ``cast_table``, ``bits_table``: what a format can hold, what a cast does to
  given values, and their bit patterns;
* ``add``, ``update_lost``, ``lost_band``, ``largest_lost_update``, ``update_table``,
  ``accumulate``, ``stall_table``: which updates a weight loses, why a weight
  stops learning when it is stored in a low-precision format (and why AMP keeps fp32 master weights);
* ``largest_safe_scale``, ``census_table``, ``layer_table``: choosing a static loss scale and
  seeing what it does;
* ``scheme_bits``, ``relative_error``, ``format_error``, ``format_error_table``: what fp8 with a
  scale per tensor, MX and NVFP4 block scaling do to a tensor, at equal bits (scales included);
* ``check`` and the ``check_*`` questions: exercise checkers that answer with one fixed line
  (the *Check yourself* cells of every notebook; the expected answer lives here, not in the cell).

Arithmetic in a format is modelled as IEEE arithmetic is defined: the exact result of the operation
on the stored operands, rounded once into the format. torch computes a float16 or bfloat16 addition
on the CPU in float32 and rounds the result; that double rounding gives the same answer, because
float32 carries more than twice the significand bits of either format plus two.
"""

from __future__ import annotations

import html
import math
import os
import re
from dataclasses import dataclass

import numpy as np

from ampviz.census import census
from ampviz.formats import FP32, get_format

__all__ = [
    "Table",
    "number",
    "measured",
    "format_table",
    "cast_table",
    "cast_rules_table",
    "bits_table",
    "add",
    "update_lost",
    "lost_band",
    "largest_lost_update",
    "update_table",
    "accumulate",
    "stall_table",
    "largest_safe_scale",
    "census_table",
    "layer_table",
    "trace_table",
    "ERROR_SCHEMES",
    "DEFAULT_ERROR_SCHEMES",
    "FormatError",
    "scheme_bits",
    "relative_error",
    "format_error",
    "format_error_table",
    "Check",
    "check",
    "check_cast",
    "check_fnuz_smallest",
    "check_update_lost",
    "check_safe_scale",
    "check_overflow_action",
    "check_batch_effect",
    "check_scale_direction",
    "check_hysteresis_skips",
    "check_steady_interval",
    "check_log_verdict",
    "check_mode_without_loss",
    "check_range_shift",
    "check_mx_floor_value",
    "check_outlier_survivors",
    "check_nvfp4_bits",
    "check_single_level_value",
]


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


# --------------------------------------------------------------------------------------------
# Formats and casts
# --------------------------------------------------------------------------------------------


def format_table(formats=("fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2")) -> Table:
    """Each format's layout and constants (names as in ``numpy.finfo``)."""
    rows = []
    for f in map(get_format, formats):
        rows.append((
            f.name, f.exponent_bits, f.mantissa_bits, f.bias, number(f.max),
            number(f.smallest_normal, pow2=True), number(f.smallest_subnormal, pow2=True),
            number(f.eps, pow2=True),
            "inf" if f.specials == "ieee" else "none: no inf (the cast decides)",
        ))
    return Table(("format", "exp bits", "mantissa bits", "bias", "max", "smallest normal",
                  "smallest subnormal", "eps", "overflow"), rows)


#: The casts ``cast_rules_table`` compares: (column title, ``quantize``'s ``overflow`` rule or None
#: for the format's own, a function of the format).
CAST_RULES = (
    ("torch 2.13, CPU (this course)", lambda f: None),
    ("ml_dtypes; torch before 2.12", lambda f: "inf" if f.specials == "ieee" else "nan"),
    ("CUDA, saturating (satfinite)", lambda f: "saturate"),
)


def cast_rules_table(values, fmt) -> Table:
    """What each finite value becomes when cast to ``fmt`` by three libraries' casts, which agree
    within the range and differ past its end (``FloatFormat.quantize``'s ``overflow`` rules):
    torch's CPU cast, ml_dtypes' (and torch's before 2.12), CUDA's saturating fp8 conversion."""
    fmt = get_format(fmt)
    values, labels = _labelled(values, None)
    if not all(math.isfinite(v) for v in values):
        raise ValueError("values must be finite numbers: what CUDA's saturating cast does with inf is not modelled here")
    x = np.asarray(values)
    cols = [fmt.quantize(x, overflow=rule(fmt)) for _, rule in CAST_RULES]
    rows = [(lab, *(number(c[i]) for c in cols)) for i, lab in enumerate(labels)]
    return Table(("value", *(title for title, _ in CAST_RULES)), rows, title=f"cast to {fmt.name}")


def _labelled(values, labels):
    """(values as a list of floats, one label per value: given, or the value printed)."""
    values = list(np.asarray(values, dtype=np.float64).ravel())
    labels = [number(v) for v in values] if labels is None else [str(s) for s in labels]
    if len(labels) != len(values):
        raise ValueError(f"{len(labels)} labels for {len(values)} values")
    return values, labels


def cast_table(values, fmt, labels=None) -> Table:
    """What each of ``values`` becomes when cast to ``fmt``: stored value and category."""
    fmt = get_format(fmt)
    values, labels = _labelled(values, labels)
    stored = fmt.quantize(np.asarray(values))
    cats = fmt.classify(np.asarray(values))
    rows = [(lab, number(s), c) for lab, s, c in zip(labels, stored, cats)]
    return Table(("value", f"stored in {fmt.name}", "category"), rows)


def bits_table(values, fmt, labels=None) -> Table:
    """Each value's bit pattern in ``fmt`` once cast, split into sign | exponent | mantissa."""
    fmt = get_format(fmt)
    values, labels = _labelled(values, labels)
    rows = []
    for lab, v in zip(labels, values):
        bits = int(fmt.encode(v))
        sign, exp, man = fmt.fields(bits)
        e, m = fmt.exponent_bits, fmt.mantissa_bits
        stored = float(fmt.decode(bits))
        if fmt.specials == "fnu":  # E8M0: no sign bit, no mantissa; each code a power of two
            pattern = f"{exp:0{e}b}"
            meaning = "nan" if math.isnan(stored) else f"2^{exp - fmt.bias}"
            rows.append((lab, pattern, exp, meaning, number(stored)))
            continue
        pattern = f"{sign} {exp:0{e}b} {man:0{m}b}"
        if math.isinf(stored):
            meaning = "inf"
        elif math.isnan(stored):  # ieee's all-ones exponent, fn's S.1111.111, fnuz's 1.0000.000
            meaning = "nan"
        elif exp == 0:
            meaning = f"0.{man:0{m}b} × 2^{fmt.emin}" + ("" if man else " (zero)")
        else:
            meaning = f"1.{man:0{m}b} × 2^{exp - fmt.bias}"
        rows.append((lab, pattern, exp, meaning, number(fmt.quantize(v))))
    return Table(("value", "sign exponent mantissa", "exponent field", "means", "stored"), rows)


# --------------------------------------------------------------------------------------------
# Weight updates in a low-precision format
# --------------------------------------------------------------------------------------------


def add(a, b, fmt):
    """``a + b`` computed in ``fmt``: both operands stored in fmt, the exact sum rounded once.

    float64 holds the sum of two fp16 values exactly; for wider formats the sum is rounded to
    float64 first, which cannot change the final rounding (53 >= 2 * 24 + 2 significand bits).
    """
    fmt = get_format(fmt)
    qa = np.asarray(fmt.quantize(a), dtype=np.float64)
    qb = np.asarray(fmt.quantize(b), dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        s = qa + qb
    return fmt.quantize(s if np.ndim(s) else float(s))


def _brief(x, limit: int = 40) -> str:
    """``repr(x)`` on one line, cut to ``limit`` characters, for a message."""
    text = " ".join(repr(x).split())
    return text if len(text) <= limit else text[:limit] + "…"


def _update_via(via):
    """None, or FP32: the format an update and the sum pass through (see ``update_lost``)."""
    if via is None:
        return None
    try:
        v = get_format(via)
    except (TypeError, ValueError):
        v = None
    if v is not FP32:
        raise ValueError(f"via must be None (the update is stored in fmt) or 'fp32' (the update and the sum "
                         f"are fp32 values), got {_brief(via)}")
    return v


def _stored_weights(w, fmt):
    """w stored in fmt, as a float64 array."""
    return np.asarray(fmt.quantize(w), dtype=np.float64)


def _lost(wq: np.ndarray, u, fmt, via) -> np.ndarray:
    """Whether fmt(wq + u) == wq, for weights wq already stored in fmt (see ``update_lost``)."""
    if via is None:
        s = np.asarray(add(wq, u, fmt), dtype=np.float64)
    else:
        s = np.asarray(fmt.quantize(np.asarray(add(wq, u, via), dtype=np.float64)), dtype=np.float64)
    return s == wq


def update_lost(w, u, fmt, *, via=None):
    """Whether adding the update ``u`` to the weight ``w`` leaves the weight unchanged in ``fmt``.

    The weight is first stored in ``fmt`` (as it would be in a tensor of that dtype). An update is
    lost exactly when the rounded sum is the stored weight again: when |u| is at most half the gap
    between w and its neighbour on u's side, a tie (exactly half) being lost only when w's last
    mantissa bit is 0 (round to nearest, ties to even). In fp16 that is between 1/4096 and 1/2048
    of |w|, depending on where w sits in its binade (for |w| >= 0.25; fp16 holds the updates of
    smaller weights only coarsely); at a power of two the gap below w is half the gap above, so on
    w = 1 the update 2^-11 is lost and -2^-11 is not (0.99951 is kept).

    ``via`` says how the update reaches the weight, as torch (CPU) computes it:

    * ``None`` (default): u is stored in ``fmt`` too and the exact sum is rounded once, as in
      torch's ``w + u`` and ``w.add_(u)`` for a weight tensor ``w`` of that dtype and a Python
      number ``u`` (torch casts it to w's dtype, through float32, before adding) or a tensor ``u``
      of w's dtype. This is ``add(w, u, fmt) == w``.
    * ``"fp32"``: u is an fp32 value and the sum is rounded to fp32 before it is rounded into
      ``fmt``, as in ``w.add_(u)`` with an fp32 tensor ``u`` of w's shape, and in an optimizer
      step on an fp16 or bf16 weight: SGD's ``p.add_(grad, alpha=-lr)`` casts ``-lr`` to p's dtype,
      multiplies it by the gradient and adds in fp32, then rounds into p's dtype (so pass
      ``u = fmt(-lr) * grad``). The fp32 rounding can turn an update a hair past half the gap into
      the tie itself (or one a hair short of it into a value past it): the edges of the band move
      by at most one fp32 step of w + u (about 2^-23 of w).

    ``w`` and ``u`` are numbers or arrays that broadcast together (lists, numpy arrays, tensors).
    The answer is a bool for two numbers, else a numpy bool array. A NaN weight or result is never
    "lost" (NaN equals nothing); an infinite weight loses every finite update.
    """
    fmt = get_format(fmt)
    via = _update_via(via)
    wq = _stored_weights(w, fmt)
    uq = np.asarray((fmt if via is None else via).quantize(u), dtype=np.float64)  # refuses non-numbers
    try:
        np.broadcast_shapes(wq.shape, uq.shape)
    except ValueError:
        raise ValueError(f"w and u must be numbers or arrays of shapes that broadcast together, got shapes "
                         f"{wq.shape} and {uq.shape}") from None
    lost = _lost(wq, uq, fmt, via)
    return bool(lost) if lost.ndim == 0 else lost


def _search_patterns(wq: np.ndarray, sign: float, fmt, via) -> np.ndarray:
    """The largest |u| of the update format (fmt, or ``via``) with u of the given sign lost on each
    weight of ``wq``: a bisection over the update format's non-negative bit patterns, whose values
    grow with the pattern; the lost updates of one sign are those from 0 up to that |u|."""
    v = fmt if via is None else via
    top = int(v.encode(np.inf)) if v.specials == "ieee" else int(v.encode(v.max))  # largest pattern to try
    lo = np.zeros(wq.shape, dtype=np.int64)  # u = 0 is always lost on a finite weight
    hi = np.full(wq.shape, top + 1, dtype=np.int64)  # beyond the last pattern: "not lost"
    while True:
        open_ = hi - lo > 1
        if not open_.any():
            break
        mid = (lo + hi) // 2
        lost = _lost(wq, sign * np.asarray(v.decode(np.where(open_, mid, 0)), dtype=np.float64), fmt, via)
        lo = np.where(open_ & lost, mid, lo)
        hi = np.where(open_ & ~lost, mid, hi)
    return np.asarray(v.decode(lo), dtype=np.float64)


def lost_band(w, fmt, *, via=None):
    """(most negative, most positive) update lost on the weight ``w`` in ``fmt``, as exact values.

    The updates are values of ``fmt`` (with ``via="fp32"``: fp32 values), and ``update_lost``
    agrees: ``update_lost(w, u, fmt)`` is true exactly when ``lo <= fmt(u) <= hi`` (with
    ``via="fp32"``, when ``lo <= fp32(u) <= hi``).
    Roughly ±half the gap between w and its neighbour on each side: at w = 1 in fp16 the band is
    (-2^-12, 2^-11), at w = 1.5 it is (-2^-11, 2^-11), so relative to w each edge runs from 1/2048
    (just above a power of two) down to 1/4096 (just below the next). Where half the gap is not
    itself lost (a tie on a weight whose last mantissa bit is 1, or a value the update format
    cannot hold) the edge is the update value just inside it; it is 0 where no update of that sign
    is lost (e.g. on fp16's subnormals). In a saturating format ("fn") every larger update is lost
    on its max.

    ``w``: a finite number, or an array of them (after storing in ``fmt``); an array gives two arrays.
    """
    fmt = get_format(fmt)
    via = _update_via(via)
    wq = _stored_weights(w, fmt)
    if not np.all(np.isfinite(wq)):
        stored = number(wq[~np.isfinite(wq)][0] if wq.ndim else wq)
        raise ValueError(f"w must be finite once stored in {fmt.name} (inf and NaN have no band of lost "
                         f"updates), got a weight that stores as {stored}")
    hi = _search_patterns(wq, 1.0, fmt, via)
    lo = -_search_patterns(wq, -1.0, fmt, via) + 0.0  # (+ 0.0: no -0)
    if wq.ndim == 0:
        return float(lo), float(hi)
    return lo, hi


def largest_lost_update(w, fmt) -> float:
    """The largest positive update u (a value of ``fmt``) with ``w + u == w`` in ``fmt``.

    Every smaller positive update is lost too; ``lost_band`` gives both sides. It is about half
    the gap between w and the next value above it: for w = 1 that is eps / 2 (the tie rounds to
    the even neighbour, 1), for w = 1.5 too, so relative to w the lost updates reach 1/2048 of w
    just above a power of two and only about 1/4096 just below the next. A negative update is lost
    up to half the gap below w, which at a power of two is half as wide (on 1.0, -2^-12).
    """
    fmt = get_format(fmt)
    q = fmt.quantize(w)
    if np.ndim(q) != 0:
        raise TypeError(f"w must be one number, got {np.size(q)} values; lost_band(w, fmt) takes arrays")
    if not math.isfinite(q) or q == 0:
        raise ValueError(f"w must be a nonzero finite value of {fmt.name}, got {_brief(w)}")
    return lost_band(q, fmt)[1]


def update_table(w=1.0, formats=("fp32", "bf16", "fp16")) -> Table:
    """For each format: eps, the largest positive and the most negative update lost on ``w``, and
    how many times smaller than w each is. The two differ where w is a power of two (the gap
    below it is half the gap above it), so an update is not simply lost once the weight is some
    fixed number of times larger."""
    rows = []
    for f in map(get_format, formats):
        hi = largest_lost_update(w, f)
        lo = lost_band(w, f)[0]
        q = abs(float(f.quantize(w)))
        ratios = [f"{q / abs(u):,.0f}" if u else "inf" for u in (hi, lo)]
        rows.append((f.name, number(f.eps), number(hi), number(lo), *ratios))
    return Table(("format", "eps", f"largest u > 0 lost on w = {number(w)}", "most negative u lost",
                  "w / u", "w / |u| (u < 0)"), rows)


def accumulate(w0, update, steps: int, fmt) -> np.ndarray:
    """The weight after each of ``steps`` additions of ``update``, all stored in ``fmt``.

    Returns ``steps + 1`` values (the start included), as float64. Once an addition leaves the
    weight unchanged (the update is lost), every later one does too, so the rest is filled at once.
    """
    fmt = get_format(fmt)
    if isinstance(steps, (bool, np.bool_)) or not isinstance(steps, (int, np.integer)):
        raise TypeError(f"steps must be a whole number, got {type(steps).__name__}")
    if not 0 <= steps <= MAX_ACCUMULATE_STEPS:
        raise ValueError(f"steps must be between 0 and {MAX_ACCUMULATE_STEPS:,} (each is one rounded "
                         f"addition), got {steps:,}")
    w = float(fmt.quantize(w0))
    u = float(fmt.quantize(update))
    out = np.empty(steps + 1)
    out[0] = w
    for i in range(1, steps + 1):
        nxt = float(add(w, u, fmt))
        if nxt == w or (math.isnan(nxt) and math.isnan(w)):  # stalled: every later step gives the same
            out[i:] = nxt
            break
        w = out[i] = nxt
    return out


#: The most additions ``accumulate`` makes (each is a rounded addition in Python).
MAX_ACCUMULATE_STEPS = 100_000


def stall_table(w0=1.0, update=1e-4, steps=1000, formats=("fp16", "bf16", "fp32"),
                master="fp32", model="fp16") -> Table:
    """Where a weight ends after ``steps`` identical updates, by the format it is kept in.

    One row per format, plus the mixed-precision recipe: the weight kept in ``master`` (fp32) and
    cast to ``model`` (fp16) for the forward pass.
    """
    rows = []
    for f in map(get_format, formats):
        end = float(accumulate(w0, update, steps, f)[-1])  # a Python float: inf - inf is NaN, no warning
        rows.append((f"{f.name} weight", number(end), number(end - float(f.quantize(w0)))))
    master, model = get_format(master), get_format(model)
    end = float(accumulate(w0, update, steps, master)[-1])
    copy = float(model.quantize(end))
    rows.append((f"{master.name} master, {model.name} copy", number(copy),
                 number(copy - float(model.quantize(w0)))))
    rows.append(("exact", number(w0 + steps * update), number(steps * update)))
    return Table(("kept as", f"weight after {steps:,} steps", "change"), rows)


# --------------------------------------------------------------------------------------------
# Loss scaling
# --------------------------------------------------------------------------------------------


def largest_safe_scale(values, fmt="fp16") -> float:
    """The largest power of two S for which no value of ``values * S`` overflows in ``fmt``.

    "Overflows" is as in ``ampviz.census``: the float32 product rounds past the format's max
    (to inf, or to a saturated max in an "fn" format). Only the largest magnitude matters. A scale
    is a float32 number, so the answer is at most 2^127.
    """
    fmt = get_format(fmt)
    with np.errstate(over="ignore"):  # float64 beyond float32's range becomes inf, as torch casts it
        v = np.abs(np.asarray(values, dtype=np.float32).ravel())
    if v.size == 0 or not np.all(np.isfinite(v)):
        raise ValueError("values must be a non-empty array of finite numbers")
    m = float(v.max())
    if m == 0:
        raise ValueError("all values are zero: every scale is safe")
    k = min(math.floor(math.log2(fmt.max / m)) + 1, 127)
    while census(np.float32(m), fmt, 2.0 ** k).counts["overflow"]:
        k -= 1
    return 2.0 ** k


def _scale_label(scale: float) -> str:
    mant, exp = math.frexp(scale)
    return f"2^{exp - 1}" if mant == 0.5 else number(scale)


def _share(count: int, total: int) -> str:
    return f"{count:,} ({100 * count / total:.2f}%)" if total else "0"


def _scale_list(scales) -> list:
    """``census_table``'s scales as a list of numbers: one number, or a sequence (or iterator), 1-D
    numpy array or 1-D torch tensor of them; anything else is one ValueError."""
    from collections.abc import Iterator

    from ampviz.formats import _describe, _real_array

    try:
        arr = _real_array(list(scales) if isinstance(scales, Iterator) else scales, "scales")
    except (TypeError, ValueError):
        arr = None
    if arr is None or arr.ndim > 1 or arr.dtype.kind == "b":
        raise ValueError(f"scales must be one positive number or a list, 1-D numpy array or 1-D torch tensor of "
                         f"them, e.g. [1.0, 2.0**16]; got {_describe(scales)}")
    return arr.reshape(-1).tolist()


def census_table(values, fmt="fp16", scales=(1.0,)) -> Table:
    """What ``values * scale`` becomes in ``fmt`` for each scale: count and share per category.

    ``scales``: one positive number, or a list, 1-D numpy array or 1-D torch tensor of them.
    "lost" counts nonzero values that end as 0 (``underflow``); "overflow" those that round to inf
    (or saturate). Exact zeros in ``values`` are counted apart.
    """
    fmt = get_format(fmt)
    rows, n = [], 0
    for s in _scale_list(scales):
        c = census(values, fmt, s)
        n = c.total
        rows.append((_scale_label(c.scale), _share(c.counts["zero"], n), _share(c.counts["underflow"], n),
                     _share(c.counts["subnormal"], n), _share(c.counts["normal"], n),
                     _share(c.counts["overflow"] + c.counts["nan"], n)))
    return Table(("scale", "zero already", "lost (-> 0)", "subnormal", "normal", "overflow"), rows,
                 title=f"{fmt.name}, {n:,} values" if rows else "")


def layer_table(layers: dict, fmt="fp16", scale=1.0) -> Table:
    """One row per named array (e.g. a layer's gradient): size, largest magnitude and what
    ``fmt`` does to it at ``scale`` (shares of that array)."""
    fmt = get_format(fmt)
    if not isinstance(layers, dict):
        raise TypeError(f"layers must be a dict name -> array of values, got {type(layers).__name__}")
    rows = []
    for name, values in layers.items():
        with np.errstate(over="ignore"):  # float64 beyond float32's range becomes inf, as torch casts it
            v = np.asarray(values, dtype=np.float32).ravel()
        c = census(v, fmt, scale)
        f = c.fractions
        big = float(np.max(np.abs(v))) if v.size else 0.0
        rows.append((name, f"{v.size:,}", f"{big:.2g}", f"{100 * f['zero']:.1f}%",
                     f"{100 * f['underflow']:.1f}%", f"{100 * f['subnormal']:.1f}%",
                     f"{100 * f['normal']:.1f}%"))
    return Table(("name", "values", "largest |value|", "zero already", "lost (-> 0)", "subnormal",
                  "normal"), rows, title=f"{fmt.name} at scale {_scale_label(float(np.float32(scale)))}")


def trace_table(traces) -> Table:
    """One row per simulated scaler (``ampviz.scaling.ScalerTrace``): skipped steps, where the
    scale ended and how low it went, and the step at which a scaler that raises stopped the run
    (steps after a stop are not counted as skipped)."""
    from ampviz.scaling import ScalerTrace

    traces = list(traces) if isinstance(traces, (list, tuple)) else [traces]
    if not all(isinstance(t, ScalerTrace) for t in traces):
        raise TypeError("traces must be a ScalerTrace or a list of them (from ampviz.scaling.simulate)")
    rows = []
    for t in traces:
        end = t.steps if t.stopped_at is None else t.stopped_at + 1
        scale = np.asarray(t.scale[:end], dtype=np.float64)
        skipped = t.skipped_count
        final = "stopped" if t.stopped_at is not None else number(t.final.scale)
        rows.append((t.policy.name, f"{skipped:,}", number(scale[0]) if scale.size else "-",
                     final, number(scale.min()) if scale.size else "-",
                     "-" if t.stopped_at is None else f"{t.stopped_at:,}"))
    return Table(("scaler", "skipped steps", "initial scale", "final scale", "lowest scale", "stopped at step"), rows)


# --------------------------------------------------------------------------------------------
# Block formats: the error of every format at equal bits
# --------------------------------------------------------------------------------------------

#: The schemes ``format_error`` knows: a plain cast (bf16, fp16), FP8 with one float32 scale per
#: tensor (torchao's current scaling, ``ampviz.fp8.current_quantize``), OCP MX with blocks of 32
#: and E8M0 scales (``ampviz.blocks.mx_quantize``) and NVFP4 (``ampviz.blocks.nvfp4_quantize``).
ERROR_SCHEMES = {
    "bf16": "bf16, cast",
    "fp16": "fp16, cast",
    "fp8_e4m3": "fp8 E4M3, one scale per tensor",
    "fp8_e5m2": "fp8 E5M2, one scale per tensor",
    "mxfp8_e4m3": "MXFP8 E4M3",
    "mxfp8_e5m2": "MXFP8 E5M2",
    "mxfp6_e3m2": "MXFP6 E3M2",
    "mxfp6_e2m3": "MXFP6 E2M3",
    "mxfp4": "MXFP4 E2M1",
    "nvfp4": "NVFP4",
}
#: The schemes ``format_error_table`` compares unless told otherwise.
DEFAULT_ERROR_SCHEMES = ("fp8_e4m3", "fp8_e5m2", "mxfp8_e4m3", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4", "nvfp4")
_MX_ELEMENT = {"mxfp8_e4m3": "fp8_e4m3", "mxfp8_e5m2": "fp8_e5m2", "mxfp6_e3m2": "fp6_e3m2",
               "mxfp6_e2m3": "fp6_e2m3", "mxfp4": "fp4_e2m1"}
MX_BLOCK, NVFP4_BLOCK = 32, 16


@dataclass(frozen=True, eq=False)
class FormatError:
    """How one scheme stores one tensor: ``bits`` per element, the scales' share included;
    ``error``, the relative error RMS(q - x) / RMS(x) of the dequantized values q; ``flushed``,
    the share of nonzero values that become 0; ``saturated``, the share of values more than half a
    step past the largest magnitude their block (or tensor) holds, which the clamp to that
    magnitude decided, not the rounding (in bf16 and fp16 they become inf); ``values``, q
    (float32, x's shape)."""

    scheme: str
    bits: float
    error: float
    flushed: float
    saturated: float
    values: np.ndarray


def _scheme(scheme) -> str:
    if not isinstance(scheme, str) or scheme not in ERROR_SCHEMES:
        raise ValueError(f"scheme must be one of {', '.join(map(repr, ERROR_SCHEMES))}, got {_brief(scheme)}")
    return scheme


def scheme_bits(scheme, n) -> float:
    """Bits per element of a tensor of ``n`` elements stored in ``scheme``, its scales included:
    16 for bf16 and fp16; 8 + 32/n for fp8 with a float32 scale per tensor; element bits + 8/32
    for MX (an E8M0 scale per 32 elements); 4 + 8/16 + 32/n for NVFP4 (an E4M3 scale per 16
    elements and a float32 scale per tensor)."""
    scheme = _scheme(scheme)
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be the number of elements, a positive int, got {_brief(n)}")
    n = int(n)
    if scheme in ("bf16", "fp16"):
        return 16.0
    if scheme in ("fp8_e4m3", "fp8_e5m2"):
        return 8 + 32 / n
    if scheme == "nvfp4":
        return 4 + 8 / NVFP4_BLOCK + 32 / n
    return get_format(_MX_ELEMENT[scheme]).bits + 8 / MX_BLOCK


def _half_step_past(fmt) -> float:
    """The format's max plus half the gap to the value that would follow it (E4M3: 448 + 16):
    where round to nearest would leave max behind if the format went on."""
    return fmt.max + 2.0 ** (math.floor(math.log2(fmt.max)) - fmt.mantissa_bits - 1)


def _dequantized(x32: np.ndarray, scheme: str, rounding: str):
    """(dequantized float32 values, float64 magnitudes beyond which each element is saturated:
    half a step past the largest value its block or tensor holds)."""
    from ampviz.blocks import mx_quantize, nvfp4_quantize
    from ampviz.formats import FP4_E2M1, FP8_E4M3
    from ampviz.fp8 import current_quantize

    if scheme in ("bf16", "fp16"):
        fmt = get_format(scheme)
        return np.asarray(fmt.quantize(x32), np.float32), np.full(x32.shape, _half_step_past(fmt))
    if scheme in ("fp8_e4m3", "fp8_e5m2"):
        fmt = get_format(scheme)
        q = current_quantize(x32, fmt)
        return q.dequantized, np.full(x32.shape, _half_step_past(fmt) / np.float64(q.scale))
    if scheme == "nvfp4":
        q = nvfp4_quantize(x32)
        with np.errstate(over="ignore", under="ignore"):
            block = np.asarray(FP8_E4M3.decode(q.scales.astype(np.int64)), np.float32)
            if q.tensor_scale is not None:
                block = (q.tensor_scale * block).astype(np.float32)  # as the dequantize multiplies
        return q.values, np.repeat(_half_step_past(FP4_E2M1) * block.astype(np.float64), NVFP4_BLOCK, axis=-1)
    fmt = get_format(_MX_ELEMENT[scheme])
    q = mx_quantize(x32, fmt, MX_BLOCK, rounding)
    top = np.ldexp(_half_step_past(fmt), q.scales.astype(np.int32) - 127)
    return q.values, np.repeat(top, MX_BLOCK, axis=-1)


def _tensor(x, what: str, block: int) -> np.ndarray:
    from ampviz.formats import _real_array

    arr = _real_array(x, what)
    if arr.ndim == 0 or arr.size == 0:
        raise ValueError(f"{what} must be a non-empty array (blocks run along its last axis), got shape {arr.shape}")
    with np.errstate(over="ignore", invalid="ignore"):
        x32 = arr.astype(np.float32)
    if not np.isfinite(x32).all():
        raise ValueError(f"{what} must hold finite numbers (in float32): an inf or NaN makes every error inf or NaN")
    if not x32.any():
        raise ValueError(f"{what} is all zeros: its relative error is 0/0; pass a tensor with a nonzero value")
    if x32.shape[-1] % block:
        raise ValueError(f"{what}: the last axis ({x32.shape[-1]} values) must be a multiple of {block} for "
                         f"these schemes' blocks; pass a weight or gradient whose rows are, or pad them")
    return x32


def _rounding(rounding) -> str:
    from ampviz.blocks import MX_ROUNDING

    if isinstance(rounding, str) and rounding in MX_ROUNDING:
        return rounding
    raise ValueError(f"rounding must be one of {', '.join(map(repr, MX_ROUNDING))} (how MX picks a block's "
                     f"scale), got {_brief(rounding)}")


def _block_of(schemes) -> int:
    if any(s in _MX_ELEMENT for s in schemes):
        return MX_BLOCK
    return NVFP4_BLOCK if "nvfp4" in schemes else 1


def format_error(x, scheme, *, rounding="floor") -> FormatError:
    """What ``scheme`` (one of ``ERROR_SCHEMES``) does to the tensor ``x`` (float32 first; blocks
    run along its last axis, which must be a multiple of 32 for MX and 16 for NVFP4).
    ``rounding``: how MX picks a block's scale ("floor", the OCP rule, "ceil", "even" or
    "rceil"; see ``ampviz.blocks``). FP8 is scaled as torchao's tensorwise current scaling,
    NVFP4 with its float32 tensor scale, as torchao; see ``FormatError`` for the numbers."""
    scheme = _scheme(scheme)
    rounding = _rounding(rounding)
    x32 = _tensor(x, "x", _block_of((scheme,)))
    return _format_error(x32, scheme, rounding)


def relative_error(x, q) -> float:
    """RMS(q - x) / RMS(x) of a tensor ``x`` and its dequantized values ``q`` (both read as float32,
    computed in float64): the error of a quantization as a share of the tensor's size."""
    from ampviz.formats import _real_array

    x, q = _real_array(x, "x"), _real_array(q, "q")
    if x.shape != q.shape:
        raise ValueError(f"x and q must have one shape (q: x dequantized), got {x.shape} and {q.shape}")
    # a number past float32's range reads as inf (and the error as inf or NaN), as a cast gives it
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        x64, q64 = x.astype(np.float32).astype(np.float64), q.astype(np.float32).astype(np.float64)
        return math.sqrt(np.sum((q64 - x64) ** 2) / np.sum(x64 ** 2))


def _format_error(x32: np.ndarray, scheme: str, rounding: str) -> FormatError:
    q, top = _dequantized(x32, scheme, rounding)
    x64 = x32.astype(np.float64)
    error = relative_error(x32, q)
    nonzero = x32 != 0
    flushed = np.count_nonzero(nonzero & (q == 0)) / np.count_nonzero(nonzero)
    saturated = np.count_nonzero(np.abs(x64) > top) / x32.size
    values = np.array(q, np.float32)
    values.setflags(write=False)
    return FormatError(scheme, scheme_bits(scheme, x32.size), error, flushed, saturated, values)


def _bits_text(bits: float) -> str:
    return f"{bits:.3f}".rstrip("0").rstrip(".")


def _percent(share: float, digits: int = 2) -> str:
    return f"{100 * share:.{digits}f}%"


def format_error_table(tensors, schemes=DEFAULT_ERROR_SCHEMES, *, rounding="floor") -> Table:
    """One row per tensor and scheme: bits per element (scales included), the relative error
    RMS(q - x) / RMS(x) of the dequantized values, and the shares flushed to zero and saturated
    (see ``format_error``). ``tensors``: a dict name -> array (a layer's weights, its gradient);
    ``schemes``: names from ``ERROR_SCHEMES`` (one name, or a list); ``rounding``: MX's scale rule."""
    if not isinstance(tensors, dict) or not tensors:
        raise TypeError(f"tensors must be a non-empty dict name -> array (e.g. {{'weight': w, 'gradient': g}}), "
                        f"got {_brief(tensors)}")
    if isinstance(schemes, str):
        schemes = (schemes,)
    if not isinstance(schemes, (list, tuple)) or not schemes:
        raise TypeError(f"schemes must be a scheme name or a non-empty list of them ({', '.join(ERROR_SCHEMES)}), "
                        f"got {_brief(schemes)}")
    schemes = tuple(_scheme(s) for s in schemes)
    rounding = _rounding(rounding)
    block = _block_of(schemes)
    rows = []
    for name, x in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensors' keys must be names (str), got {_brief(name)}")
        x32 = _tensor(x, f"tensors[{name!r}]", block)
        for s in schemes:
            r = _format_error(x32, s, rounding)
            rows.append((name, ERROR_SCHEMES[s], _bits_text(r.bits), f"{100 * r.error:.3g}%",
                         _percent(r.flushed), _percent(r.saturated)))
    title = "relative error = RMS(dequantized - x) / RMS(x)" + ("" if block == 1 else f"; MX scales: {rounding}")
    return Table(("tensor", "scheme", "bits/element", "relative error", "flushed to 0", "saturated"), rows,
                 title=title)


# --------------------------------------------------------------------------------------------
# Exercise checkers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """The verdict on one answer: ``status`` is "right", "wrong" or "unanswered"."""

    status: str
    message: str

    def __bool__(self) -> bool:
        return self.status == "right"

    def __str__(self) -> str:
        return self.message

    __repr__ = __str__


#: Numbers learners write in words, and the plain number syntax ``_number_text`` reads.
_NUMBER_WORDS = {"one": 1.0, "once": 1.0, "two": 2.0, "twice": 2.0, "double": 2.0, "doubled": 2.0, "four": 4.0,
                 "half": 0.5, "halved": 0.5}
_PLAIN = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?"


def _number_text(text: str):
    """A number typed as text as a float, else the text unchanged (then it matches no number):
    "32768", "32,768", "6.1e-5", "inf", "2**-24", "2^(-24)", "5/1024", "1/2^15", "2x", "×2",
    "2 times", "two", "twice"."""
    t = (text.strip().strip("'\"").casefold().replace("×", "x").replace(" ", "").replace("_", "")
         .replace(",", "").replace("(", "").replace(")", ""))
    t = t.removesuffix("times").removesuffix("x").removeprefix("x").removeprefix("*")
    if t in _NUMBER_WORDS:
        return _NUMBER_WORDS[t]
    try:
        if t.count("/") == 1:
            top, bottom = (_number_text(part) for part in t.split("/"))
            ok = isinstance(top, float) and isinstance(bottom, float) and bottom != 0
            return top / bottom if ok else text
        power = re.fullmatch(f"({_PLAIN})(?:\\*\\*|\\^)({_PLAIN})", t)
        if power:  # "-2^-24" is -(2^-24), as written on paper
            base = float(power[1])
            return math.copysign(abs(base) ** float(power[2]), base)
        return float(t)
    except (ValueError, OverflowError, ZeroDivisionError):
        return text


def _same(answer, expected, tol: float) -> bool:
    if isinstance(expected, str):
        return isinstance(answer, str) and answer.strip().casefold() == expected.casefold()
    if hasattr(answer, "detach") and callable(answer.detach):  # a tensor that requires grad
        try:
            answer = answer.detach()
        except Exception:  # noqa: BLE001 - not a tensor after all: compared as it is
            pass
    if isinstance(answer, str):
        answer = _number_text(answer)
    try:
        a = float(answer)
    except (TypeError, ValueError, RuntimeError, OverflowError):  # (an int beyond float's range is
        return False  # no float's value, not even inf's)
    e = float(expected)
    if math.isnan(e):
        return math.isnan(a)
    if math.isinf(e) or math.isinf(a):
        return a == e
    return abs(a - e) <= tol


def check(answer, expected, *, tol: float = 0.0, hint: str = "", accept=None) -> Check:
    """Compare an answer with the expected value; the message never shows either number.

    ``None`` (or ``...``) means not answered yet. Numbers match within ``tol``; strings match
    case-insensitively; ``accept`` (a function of the answer) replaces the comparison if given.
    """
    if answer is None or answer is Ellipsis:
        return Check("unanswered", "not answered yet: set `answer` above and run the cell again")
    try:
        ok = bool(accept(answer) if accept is not None else _same(answer, expected, tol))
    except Exception:  # noqa: BLE001 - whatever a learner types is an answer: one that does not fit is wrong
        ok = False
    if ok:
        return Check("right", "✓ correct")
    return Check("wrong", "✗ not quite" + (f": {hint}" if hint else ""))


def _said(answer) -> str | None:
    """A text answer, folded: case, quotes, runs of spaces and a final full stop ignored (None if
    the answer is not text)."""
    if not isinstance(answer, str):
        return None
    return " ".join(answer.strip().strip("'\"").strip().rstrip(".!").strip().casefold().split())


def _text_is(*accepted):
    """An ``accept`` function: the answer is one of ``accepted`` (as ``_said`` folds it)."""
    def accept(answer) -> bool:
        return _said(answer) in accepted
    return accept


def _yes_no(expected: bool, more=()):
    """An ``accept`` function for a yes/no question: True/False (numpy's too), "yes"/"y"/"true" or
    "no"/"n"/"false" in any case, or one of the question's own words ``more`` ("crashes")."""
    def accept(answer) -> bool:
        if isinstance(answer, (bool, np.bool_)):
            return bool(answer) is expected
        words = {"yes", "y", "true"} if expected else {"no", "n", "false"}
        return _said(answer) in words | set(more)
    return accept


# ----- 00 and 01: formats and casts -----
def check_cast(answer, value, fmt="fp16") -> Check:
    """Q: what ``value`` becomes when it is cast to ``fmt`` (the stored value, exactly)."""
    return check(answer, get_format(fmt).quantize(float(value)),
                 hint="find the format's two numbers around the value (or its largest one) and round to the "
                      "nearest, ties to the even one; what does the format do past its largest number?")


def _close(expected: float, rel: float):
    """An ``accept`` function: a number within ``rel`` of ``expected`` (a value printed to a few
    digits, such as 5.96e-8 for 2^-24, is the same answer)."""
    def accept(answer) -> bool:
        a = _number_text(answer) if isinstance(answer, str) else answer
        if isinstance(a, (bool, np.bool_)) or isinstance(a, str):
            return False
        a = float(a)
        return math.isfinite(a) and abs(a - expected) <= rel * abs(expected)
    return accept


#: float8_e4m3fnuz (AMD MI300's E4M3): 4 exponent bits, 3 mantissa bits, bias 8, one NaN (0x80),
#: no inf, no -0. Its smallest subnormal and its max, as ``torch.finfo``/its bit patterns give them.
E4M3FNUZ_SMALLEST, E4M3FNUZ_MAX = 2.0**-10, 240.0


def check_fnuz_smallest(answer) -> Check:
    """Q: the smallest positive number of float8_e4m3fnuz (bias 8 instead of E4M3's 7): 2^-10."""
    return check(answer, E4M3FNUZ_SMALLEST, accept=_close(E4M3FNUZ_SMALLEST, 5e-4),
                 hint="the smallest subnormal is 2^(1 - bias) x 2^-(mantissa bits); which of those changed?")


def check_update_lost(answer, w=1.0, u=-(2.0**-11), fmt="fp16") -> Check:
    """Q: is the update ``u`` lost on a weight ``w`` kept in ``fmt`` (does ``w + u`` round back to
    w)? "yes" or "no" (or True/False). The default is 1.0 - 2^-11 in fp16: "no", it is kept."""
    lost = update_lost(w, u, fmt)
    return check(answer, "yes" if lost else "no", accept=_yes_no(lost),
                 hint="compare |u| with half the gap between w and its neighbour on u's side "
                      "(below a power of two the gap is half as wide)")


# ----- 02: loss scaling -----
def check_safe_scale(answer, values, fmt="fp16") -> Check:
    """Q: the largest power-of-two loss scale at which no value of ``values`` overflows."""
    return check(answer, largest_safe_scale(values, fmt),
                 hint="find max|g|, then the largest power of two S with S * max|g| below 65504")


def check_overflow_action(answer) -> Check:
    """Q: what GradScaler does with a step whose gradients contain inf: "skip" (and lower the scale)."""
    return check(answer, "skip", accept=lambda a: isinstance(a, str) and "skip" in a.casefold(),
                 hint="applying an inf gradient would turn the weights into inf or NaN")


def check_batch_effect(answer) -> Check:
    """Q: with a batch of 1024 instead of 256, does fp16 lose "more" or "fewer" of the beam model's
    gradients at scale 1? "more": the mean over the batch divides each output's gradient by the
    batch size (tests/test_beam.py measures it)."""
    def accept(a) -> bool:
        return isinstance(a, str) and a.strip().strip("'\"").strip().casefold() in ("more", "more of them",
                                                                                  "it loses more", "larger", "higher")
    return check(answer, "more", accept=accept,
                 hint="the loss is a mean over batch x 64 numbers: what does a larger batch do to each term's gradient?")


# ----- 04: dynamic loss scalers -----
def check_scale_direction(answer) -> Check:
    """Q: torch's rule (growth_interval 2000), an overflow every 500 steps: does the scale go
    "up" or "down"?"""
    return check(answer, "down", accept=_text_is("down", "it goes down", "goes down", "decreases", "falls",
                                                 "lower"),
                 hint="growth needs growth_interval clean steps in a row")


def check_hysteresis_skips(answer) -> Check:
    """Q: how many overflows in a row Megatron's default scaler skips without backing off."""
    from ampviz.scaling import PRESETS

    return check(answer, PRESETS["Megatron"].hysteresis - 1, hint="the budget is spent before the backoff")


def check_steady_interval(answer, every: int = 500) -> Check:
    """Q: overflows that no scale avoids come every ``every`` steps; the largest ``growth_interval``
    at which torch's scale holds steady instead of ratcheting down: ``every - 1``, the clean steps
    between two overflows (``simulate`` shows it: tests/test_lessons.py)."""
    return check(answer, every - 1, hint="growth needs growth_interval clean steps in a row: how many clean "
                                         "steps lie between two overflows?")


def check_log_verdict(answer, scales) -> Check:
    """Q: ``ampviz.scalelog.diagnose``'s verdict on the scales a log reports after each overflow:
    "sawtooth", "ratchet" or "collapse"."""
    from ampviz.scalelog import diagnose

    verdict = diagnose(scales).verdict
    return check(answer, verdict, accept=_text_is(verdict),
                 hint="compare the first and the last quarter of the messages")


# ----- 05: live training -----
def check_mode_without_loss(answer) -> Check:
    """Q: which mode lost no gradient to underflow at step 0, "fp16" or "fp16+scaler"."""
    return check(answer, "fp16+scaler", accept=_text_is("fp16+scaler", "fp16 + scaler", "fp16 with a scaler",
                                                        "fp16 with scaler", "fp16+gradscaler"),
                 hint="which mode multiplied the loss before the backward pass?")


def check_range_shift(answer) -> Check:
    """Q: with a batch of 1024 instead of 256, does the low end of the beam model's recommended
    initial scale (``examine``) go "up" or "down"? "up": more of its gradients are lost at scale 1
    (tests/test_doctor.py measures it)."""
    return check(answer, "up", accept=_text_is("up", "higher", "it goes up", "rises", "larger"),
                 hint="a larger batch divides each output's gradient by more: does that lose more or fewer?")



# ----- 13: MX and NVFP4 block scaling -----
def check_mx_floor_value(answer) -> Check:
    """Q: MXFP8 E4M3 with the OCP floor scale; a block of 32 whose largest value is 500 (the rest
    0): what does 500 dequantize to? 448: the scale is 2^(8 - 8) = 1 and 500 saturates."""
    from ampviz.blocks import mx_quantize

    row = np.zeros(MX_BLOCK, np.float32)
    row[0] = 500.0
    expected = float(mx_quantize(row, "fp8_e4m3", MX_BLOCK, "floor").values[0])
    return check(answer, expected, hint="the floor scale is 2^(floor(log2 amax) - 8); divide 500 by it and "
                                        "compare with E4M3's largest value")


def check_outlier_survivors(answer) -> Check:
    """Q: MXFP4 (floor scale), one block of 32: 31 values 1.0 and one 1024. How many of the 31 ones
    are still nonzero after dequantizing? 0: the scale is 2^(10 - 2) = 256 and 1/256 rounds to 0."""
    from ampviz.blocks import mx_quantize

    row = np.ones(MX_BLOCK, np.float32)
    row[5] = 1024.0
    q = mx_quantize(row, "fp4_e2m1", MX_BLOCK, "floor").values
    expected = int(np.count_nonzero(np.delete(q, 5)))
    return check(answer, expected, hint="find the block's scale from 1024, then what 1.0 divided by it becomes "
                                        "in E2M1, whose smallest nonzero magnitude is 0.5")


def check_nvfp4_bits(answer, n: int = 4096) -> Check:
    """Q: bits per element of NVFP4 for a tensor of ``n`` (4096) elements, both levels of scales
    included: 4 + 8/16 + 32/4096 = 4.5078125 (within 2e-4 of it, relatively)."""
    expected = scheme_bits("nvfp4", n)
    return check(answer, expected, accept=_close(expected, 2e-4),
                 hint="each element's 4 bits, plus its share of an 8-bit scale per 16 elements and of one "
                      "32-bit scale for the whole tensor")


def check_single_level_value(answer) -> Check:
    """Q: NVFP4 without the tensor scale (``per_tensor_scale=False``), a block of 16 values all
    1e-3: what does 1e-3 dequantize to? 0: the block scale 1e-3/6 is below E4M3's 2^-6, where it
    is clamped, and 1e-3 / 2^-6 = 0.064 rounds to 0 in E2M1."""
    from ampviz.blocks import nvfp4_quantize

    expected = float(nvfp4_quantize(np.full(NVFP4_BLOCK, 1e-3, np.float32), per_tensor_scale=False).values[0])
    return check(answer, expected, hint="the block scale is amax / 6, held between E4M3's 2^-6 and 448; divide "
                                        "1e-3 by it and round to E2M1")
