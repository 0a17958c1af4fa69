"""The tables and checkers of the format lessons (00, 01), numpy only:

* ``format_table``, ``cast_table``, ``cast_rules_table``, ``bits_table``: what a format can hold, what
  a cast does to given values, and their bit patterns;
* ``add``, ``update_lost``, ``lost_band``, ``largest_lost_update``, ``update_table``, ``accumulate``,
  ``stall_table``: which updates a weight loses, why a weight stops learning when it is stored in a
  low-precision format (and why AMP keeps fp32 master weights);
* ``check_*``: the lessons' questions.

Arithmetic in a format is modelled as IEEE arithmetic is defined: the exact result of the operation
on the stored operands, rounded once into the format. torch computes a float16 or bfloat16 addition
on the CPU in float32 and rounds the result; that double rounding gives the same answer, because
float32 carries more than twice the significand bits of either format plus two.
"""

from __future__ import annotations

import math

import numpy as np

from ampviz.checks import Check, Choice, _number_text, _yes_no, check
from ampviz.formats import FP32, get_format
from ampviz.text import Table, number

__all__ = ['format_table', 'cast_table', 'cast_rules_table', 'bits_table', 'add', 'update_lost', 'lost_band', 'largest_lost_update', 'update_table', 'accumulate', 'stall_table', 'check_cast', 'check_fnuz_smallest', 'check_update_lost', 'check_why_fp16_stalls', 'check_why_1000_1_rounds_to_1000', 'check_why_master_weights', 'check_why_bf16_range']


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


# --------------------------------------------------------------------------------------------
# Questions that ask why
# --------------------------------------------------------------------------------------------

# ----- 00: start here -----
WHY_FP16_STALLS = Choice(
    "why_fp16_stalls",
    "In \"Why this course\", fp16 without a scaler stalls, while bf16, also 16 bits and also without a "
    "scaler, learns. Why?",
    {"a": "fp16 keeps too few significant bits for this model's weights, so they are rounded too coarsely "
          "to learn",
     "b": "most of this model's gradients are so small that fp16 rounds them to 0 (its smallest positive "
          "number is 2^-24); bf16 has fp32's range and keeps them",
     "c": "the fp16 loss overflows to inf, and a loss of inf stops the run",
     "d": "fp16 is slower than fp32 on a CPU, so in the same time it trains fewer steps"},
    "b",
    {"a": "bf16 keeps even fewer significant bits than fp16 (switch the explorer to bf16) and learns in the "
          "same runs",
     "c": "that section prints a finite fp16 loss at the start and at the end: the run went through all "
          "its steps and did not learn",
     "d": "every mode ran the same 100 steps: a slower step changes how long they take, not what they learn"},
)


check_why_fp16_stalls = WHY_FP16_STALLS.checker()


WHY_1000_1_ROUNDS_TO_1000 = Choice(
    "why_1000_1_rounds_to_1000",
    "The cast table stores 1000.1 as 1000 in fp16. Why?",
    {"a": "fp16 keeps about 3 decimal digits, so it rounds to its leading decimal digits",
     "b": "fp16 drops the fractional part of a number, as an integer type does",
     "c": "1000.1 needs more precision than a normal number has, so fp16 stores it as a subnormal",
     "d": "fp16 keeps 11 significant bits: from 512 to 1024 that leaves one bit after the binary point, so "
          "its numbers there are 0.5 apart, and 1000 is the nearest to 1000.1"},
    "d",
    {"a": "fp16 rounds in binary, not in decimal: the same table stores 0.1 as 0.099975586, not as 0.1",
     "b": "the same table stores 0.1 and 1/3 with their fractions",
     "c": "the table's category column calls it normal: subnormals are fp16's tiniest numbers, next to 0"},
)


check_why_1000_1_rounds_to_1000 = WHY_1000_1_ROUNDS_TO_1000.checker()


# ----- 01: the fp16 range -----
WHY_MASTER_WEIGHTS = Choice(
    "why_master_weights",
    "Why does mixed-precision training keep an fp32 master copy of the weights?",
    {"a": "a weight kept in fp16 would overflow: past 65504 it becomes inf, and an inf weight ruins every "
          "later step",
     "b": "the gradients of fp16 weights underflow to 0",
     "c": "an update at most half the gap between a weight and its neighbour rounds back to the same "
          "weight: in fp16 a small update to a large weight is lost every time, while fp32's gaps are 2^13 "
          "times smaller and the updates add up",
     "d": "the forward pass must run in fp32 to be accurate, so it needs the weights in fp32"},
    "c",
    {"a": "section 5's weight is 1, far below 65504, and kept in fp16 it still never moves",
     "b": "section 5's updates are 1e-4, a normal fp16 number: the update survives, and it is the sum w + u "
          "that rounds back to w",
     "d": "the recipe casts the fp32 master to fp16 for the forward pass (the stall table's fourth row): "
          "the fp32 copy is there for the updates"},
)


check_why_master_weights = WHY_MASTER_WEIGHTS.checker()


WHY_BF16_RANGE = Choice(
    "why_bf16_range",
    "bf16 has fp32's range, yet a bf16 weight of 1 loses updates that an fp16 weight of 1 keeps. Why?",
    {"a": "of its 16 bits bf16 gives 8 to the exponent, as fp32 does, and only 7 to the mantissa: exponent "
          "bits set the range, mantissa bits the precision",
     "b": "bf16 saturates at its largest number instead of going to inf",
     "c": "bf16's exponent bias is larger (127 against fp16's 15), and a larger bias reaches larger numbers"},
    "a",
    {"b": "the format table's overflow column says inf for bf16, as for fp16: saturating would not move where "
          "its numbers end",
     "c": "with the same exponent bits a larger bias only moves the range down, toward smaller numbers; how "
          "many binades a format spans comes from its exp bits (the format table)"},
)


check_why_bf16_range = WHY_BF16_RANGE.checker()
