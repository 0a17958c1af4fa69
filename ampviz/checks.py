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

__all__ = ['Check', 'Choice', 'check', 'check_choice']


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




# --------------------------------------------------------------------------------------------
# Questions that ask why: one reason chosen among distractors
# --------------------------------------------------------------------------------------------

#: Every ``Choice`` made, by its name (tests/course/test_exercises.py holds each notebook cell that
#: asks one to list its options as the package words them).
CHOICES: dict[str, "Choice"] = {}

_LETTER = re.compile(r"\(?([a-z])\)?[.):]?")


@dataclass(frozen=True)
class Choice:
    """A question that tests an explanation: pick the reason among ``options`` (letter → text),
    written from real misconceptions. ``right`` is the right letter; ``why_not`` says, for each
    wrong letter, what is wrong with that reason (shown when it is chosen; it never names the
    right one)."""

    name: str
    question: str
    options: dict
    right: str
    why_not: dict

    def __post_init__(self):
        letters = list(self.options)
        if letters != [chr(ord("a") + i) for i in range(len(letters))] or not 2 <= len(letters) <= 6:
            raise ValueError(f"{self.name}: options are lettered a, b, c ... (2 to 6 of them), got {letters}")
        if self.right not in self.options:
            raise ValueError(f"{self.name}: the right letter {self.right!r} is not an option")
        wrong = sorted(set(letters) - {self.right})
        if sorted(self.why_not) != wrong or not all(isinstance(t, str) and t for t in self.why_not.values()):
            raise ValueError(f"{self.name}: why_not needs one non-empty reason for each wrong letter {wrong}")
        if self.name in CHOICES and CHOICES[self.name] != self:
            raise ValueError(f"a different Choice is already named {self.name!r}")
        CHOICES[self.name] = self

    @property
    def letters(self) -> str:
        """The letters, as the hint for an unreadable answer names them: "a, b or c"."""
        letters = list(self.options)
        return ", ".join(letters[:-1]) + " or " + letters[-1]

    def read(self, answer):
        """The letter ``answer`` picks ("b", "(b)", "B)", or the option's own text), else None."""
        said = _said(answer)
        if said is None:
            return None
        letter = _LETTER.fullmatch(said)
        if letter and letter[1] in self.options:
            return letter[1]
        folded = {" ".join(text.casefold().rstrip(".").split()): key for key, text in self.options.items()}
        return folded.get(said)

    def checker(self):
        """The lesson's checker for this question, ``check_<name>(answer)``: ``check_choice(answer,
        self)``, its docstring the question and the right reason."""
        def check_it(answer) -> Check:
            return check_choice(answer, self)

        check_it.__name__ = check_it.__qualname__ = f"check_{self.name}"
        check_it.__doc__ = f"Q: {self.question} Right: ({self.right}) {self.options[self.right].rstrip('.')}."
        return check_it


def check_choice(answer, choice: Choice) -> Check:
    """The verdict on a letter chosen for ``choice``: right, wrong with what is wrong with the reason
    chosen, wrong with the letters to choose from if the answer picks none, or unanswered."""
    if answer is None or answer is Ellipsis:
        return check(answer, None)
    picked = choice.read(answer)
    if picked is None:
        return Check("wrong", f"✗ not quite: answer with one letter, {choice.letters}")
    if picked == choice.right:
        return Check("right", "✓ correct")
    return Check("wrong", f"✗ not quite: ({picked}) {choice.why_not[picked]}")
