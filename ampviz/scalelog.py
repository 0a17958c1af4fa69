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

__all__ = ["LOG_FORMATS", "Diagnosis", "diagnose", "read_log", "write_log"]

_NUM = r"([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|inf|nan))"

#: The overflow lines frameworks print (their wording, see the frameworks' sources), each with a
#: pattern whose last group is the scale after the backoff.
LOG_FORMATS = {
    "apex": ("Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to {new}",
             re.compile(r"Gradient overflow\.\s+Skipping step, loss scaler \d+ reducing loss scale to " + _NUM)),
    "deepspeed": ("[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {old}, reducing to {new}",
                  re.compile(r"OVERFLOW! Rank \d+ Skipping step\. Attempted loss scale: " + _NUM
                             + r", reducing to " + _NUM)),
    "fairseq": ("NOTE: overflow detected, setting loss scale to: {new}",
                re.compile(r"overflow detected, setting loss scale to: " + _NUM)),
}


def _fmt(x: float) -> str:
    return repr(float(x))


def write_log(trace, style: str = "apex") -> str:
    """The overflow lines a framework would print for a simulated ``ScalerTrace``, one per
    skipped step that lowered the scale, each prefixed with its step number."""
    if style not in LOG_FORMATS:
        raise ValueError(f"unknown log style {style!r}; choose one of {', '.join(LOG_FORMATS)}")
    template = LOG_FORMATS[style][0]
    scale = np.asarray(trace.scale, dtype=np.float64)
    after = np.append(scale[1:], trace.final.scale)
    lines = []
    for i in np.flatnonzero(np.asarray(trace.skipped) & (after != scale)).tolist():
        lines.append(f"step {i}: " + template.format(old=_fmt(scale[i]), new=_fmt(after[i])))
    return "\n".join(lines)


def read_log(text: str) -> np.ndarray:
    """The scale after each overflow line found in ``text`` (any of ``LOG_FORMATS``), in order."""
    found = []
    for line in str(text).splitlines():
        for _, pattern in LOG_FORMATS.values():
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


def diagnose(scales) -> Diagnosis:
    """A verdict on the scales reported after each overflow (``read_log``'s output).

    - "collapse": the scale reached 1 or less (or 0, or NaN): it no longer lifts small gradients,
      and at 0 every gradient is 0 or NaN.
    - "ratchet": the last quarter of the messages reports a scale at least 4x (two binades) below
      the first quarter's: overflows come faster than the scale grows back.
    - "sawtooth": otherwise; the scale comes back to the same level, and each message is one
      skipped step: harmless.
    - "unclear": fewer than 4 messages (a calibration at the start looks like this too).
    """
    s = np.asarray(scales, dtype=np.float64).ravel()
    if s.size and (np.isnan(s).any() or s.min() <= 1):
        low = "NaN" if np.isnan(s).any() else f"{s.min():g}"
        return Diagnosis("collapse", f"the scale fell to {low}: small gradients are no longer protected")
    if s.size < 4:
        return Diagnosis("unclear", f"{s.size} overflow message(s): too few to see a trend")
    q = max(s.size // 4, 1)
    first, last = float(np.median(s[:q])), float(np.median(s[-q:]))
    if last <= first / 4:
        return Diagnosis("ratchet", f"the scale after an overflow fell from about {first:g} to {last:g}: "
                                    "overflows come faster than the scale grows back")
    return Diagnosis("sawtooth", f"the scale keeps returning to about {last:g}: each message is one "
                                 "skipped step, which is harmless")
