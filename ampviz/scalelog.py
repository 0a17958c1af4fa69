"""Reading loss-scaler logs: is "Gradient overflow. Skipping step" harmless, or a collapse?

Every dynamic loss scaler prints a line when it skips a step and lowers the scale. One such line
every ``growth_interval`` steps is the normal sawtooth: the scale grew, overflowed once, and came
back. Lines whose scale keeps falling mean overflows come more often than the scale can grow
back (it ratchets down); a scale at or below 1 has stopped protecting small gradients, and 0
(or a minimum-scale error) ends training. ``read_log`` pulls the scales out of a log's text,
``write_log`` prints a simulated ``ScalerTrace`` the way a framework would, and ``diagnose``
gives the verdict with its reason.

This module needs numpy only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ampviz.scaling import ScalerTrace, _as_array, _shown

__all__ = ["LOG_FORMATS", "Diagnosis", "diagnose", "read_log", "write_log"]

# A number as the frameworks print it (Python's repr or str of a float or an int). Every part is
# unambiguous (digits after the point only follow a literal point) and possessive, so a line that
# almost matches costs time linear in its length: no split of a long run of digits is retried.
_NUM = r"([-+]?+(?:\d++(?:\.\d*+)?+(?:[eE][-+]?+\d++)?+|inf|nan))"

#: The overflow lines frameworks print (their wording, see the frameworks' sources), each with a
#: pattern whose last group is the scale after the backoff.
LOG_FORMATS = {
    "apex": ("Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to {new}",
             re.compile(r"Gradient overflow\.\s++Skipping step, loss scaler \d++ reducing loss scale to " + _NUM)),
    "deepspeed": ("[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {old}, reducing to {new}",
                  re.compile(r"OVERFLOW! Rank \d++ Skipping step\. Attempted loss scale: " + _NUM
                             + r", reducing to " + _NUM)),
    "fairseq": ("NOTE: overflow detected, setting loss scale to: {new}",
                re.compile(r"overflow detected, setting loss scale to: " + _NUM)),
}

# A word every line of a style holds: lines without it are not searched at all.
_KEYS = {"apex": "Gradient overflow", "deepspeed": "OVERFLOW!", "fairseq": "overflow detected"}


def _fmt(x: float) -> str:
    return repr(float(x))


def write_log(trace, style: str = "apex") -> str:
    """The overflow lines a framework would print for a simulated ``ScalerTrace``: one per step
    where the scaler backed off (skipped the step and changed the scale), each prefixed with its
    step number. A run that was stopped prints nothing from the step that stopped it; a static
    scale never backs off, so it prints nothing; an overflow that hysteresis absorbed keeps the
    scale, so it prints no "reducing" line either."""
    if not isinstance(trace, ScalerTrace):
        raise TypeError(f"trace must be a ScalerTrace (from ampviz.scaling.simulate), got {_shown(trace)}")
    if not isinstance(style, str) or style not in LOG_FORMATS:
        raise ValueError(f"unknown log style {_shown(style)}; choose one of {', '.join(LOG_FORMATS)}")
    template = LOG_FORMATS[style][0]
    if not trace.policy.dynamic or trace.steps == 0:
        return ""
    scale = np.asarray(trace.scale, dtype=np.float64)
    after = np.append(scale[1:], trace.final.scale)
    changed = ~((after == scale) | (np.isnan(after) & np.isnan(scale)))
    backed_off = np.asarray(trace.skipped, bool) & changed
    if trace.stopped_at is not None:
        backed_off[trace.stopped_at:] = False  # the run ended there: nothing more is printed
    lines = []
    for i in np.flatnonzero(backed_off).tolist():
        lines.append(f"step {i}: " + template.format(old=_fmt(scale[i]), new=_fmt(after[i])))
    return "\n".join(lines)


def read_log(text) -> np.ndarray:
    """The scale after each overflow line found in ``text`` (a string, or bytes in UTF-8; any of
    ``LOG_FORMATS``), in order. Time is linear in the length of the text."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", errors="replace")
    if not isinstance(text, str):
        raise TypeError(f"text must be a log's text (a string), got {_shown(text)}")
    found = []
    for line in text.splitlines():
        for style, (_, pattern) in LOG_FORMATS.items():
            if _KEYS[style] in line:
                m = pattern.search(line)
                if m:
                    found.append(float(m.groups()[-1]))
                    break
    return np.array(found, dtype=np.float64)


@dataclass(frozen=True)
class Diagnosis:
    """``verdict`` is "sawtooth" (harmless), "ratchet" (falling), "collapse" or "unclear"."""

    verdict: str
    reason: str

    def __str__(self) -> str:
        return f"{self.verdict}: {self.reason}"


def _scales(scales) -> np.ndarray:
    """``scales`` as a 1-D float64 array, or one clear error."""
    what = "the scales a log reports after each overflow (read_log's output), a 1-D list of numbers"
    if scales is None:
        raise TypeError(f"scales must be {what}, not None")
    if isinstance(scales, (str, bytes, bytearray)):
        raise TypeError(f"scales must be {what}, not text: pass it through read_log first")
    arr = _as_array("scales", scales, what)  # lists, numpy arrays, torch tensors
    if arr.ndim != 1:
        got = f"a single value {_shown(scales)}" if arr.ndim == 0 else f"an array of shape {arr.shape}"
        raise ValueError(f"scales must be {what}; got {got}")
    if arr.size == 0:
        return np.zeros(0, np.float64)
    kind = arr.dtype.kind
    if kind == "O":
        if any(v is None or isinstance(v, (str, bytes, bool, np.bool_)) for v in arr.flat):
            raise TypeError(f"scales must be {what}; got {_shown(scales)}")  # numpy would make None NaN
        try:
            return arr.astype(np.float64)
        except OverflowError:
            raise ValueError(f"scales has a number too large for a float; pass {what}") from None
        except (TypeError, ValueError):
            raise TypeError(f"scales must be {what}; got {_shown(scales)}") from None
    if kind not in "iuf":
        raise TypeError(f"scales must be {what}; got {arr.dtype} values")
    with np.errstate(over="ignore"):
        return arr.astype(np.float64)


def diagnose(scales) -> Diagnosis:
    """A verdict on the scales reported after each overflow (``read_log``'s output).

    - "collapse": the scale reached 1 or less (or 0, or NaN): it no longer lifts small gradients,
      and at 0 every gradient is 0 or NaN. Also a scale of inf: every scaled gradient overflows, so
      every step is skipped.
    - "ratchet": the last quarter of the messages reports a scale at least 4x (two binades) below
      the first quarter's: overflows come faster than the scale grows back.
    - "sawtooth": otherwise; the scale comes back to the same level, and each message is one
      skipped step: harmless.
    - "unclear": fewer than 4 messages (a calibration at the start looks like this too).

    A negative scale (from a negative backoff factor) is judged by its magnitude, which is what
    protects small gradients. Anything but a 1-D list of numbers is a TypeError or ValueError.
    """
    s = _scales(scales)
    # a negative scale (a negative backoff factor, which torch accepts) lifts gradients by its
    # magnitude: the verdict is on magnitudes
    signed = " (in magnitude: the scale's sign flips)" if s.size and (s < 0).any() else ""
    s = np.abs(s)
    if s.size and np.isnan(s).any():
        return Diagnosis("collapse", "the scale became NaN: every step overflows and training stalls")
    if s.size and np.isinf(s).any():
        return Diagnosis("collapse", "the scale is infinite: every scaled gradient overflows, so every "
                                     "step is skipped")
    if s.size and s.min() <= 1:
        return Diagnosis("collapse", f"the scale fell to {s.min():g}{signed}: small gradients are no "
                                     "longer protected")
    if s.size < 4:
        return Diagnosis("unclear", f"{s.size} overflow message(s): too few to see a trend")
    q = max(s.size // 4, 1)
    first, last = float(np.median(s[:q])), float(np.median(s[-q:]))
    if last <= first / 4:
        return Diagnosis("ratchet", f"the scale after an overflow fell from about {first:g} to {last:g}{signed}: "
                                    "overflows come faster than the scale grows back")
    return Diagnosis("sawtooth", f"the scale keeps returning to about {last:g}{signed}: each message is one "
                                 "skipped step, which is harmless")
