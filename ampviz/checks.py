"""The exercise checkers' common parts: ``Check`` (a verdict that prints one fixed line) and
``check`` (an answer against the expected one, read from a number, a word or a phrase). The
questions themselves live with their topic (``check_*`` in ``ampviz.formats.lesson``,
``ampviz.scaling.lesson``, ``ampviz.training.gradscaler`` ...). numpy only.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

__all__ = ['Check', 'check']


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


