"""Reading loss-scaler logs: is "Gradient overflow. Skipping step" harmless, or a collapse?

One overflow line every ``growth_interval`` steps is the normal sawtooth: the scale grew,
overflowed once, and came back. Lines whose scale keeps falling mean overflows come more often
than the scale can grow back (it ratchets down); a scale at or below 1 has stopped protecting
small gradients, and 0 (or a minimum-scale error) ends training. ``read_log`` pulls the scale
after each overflow line out of a log's text, ``write_log`` prints a simulated ``ScalerTrace`` the
way a framework would, ``scale_lines`` writes such lines from scales you recorded yourself, and
``diagnose`` gives the verdict with its reason.

What each framework prints when it skips a step (read from its source; ``read_log`` reads all of
them, and ``tests/data/scaler_logs/SOURCES.md`` cites file and commit for each):

- NVIDIA apex ``amp``: ``Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to
  32768.0``; apex ``fp16_utils.FP16_Optimizer``: ``Gradient overflow.  Skipping step, reducing
  loss scale to 32768.0``. Every rank prints its own copy.
- DeepSpeed with ZeRO: ``[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536,
  reducing to 32768`` (rank 0 only). An overflow that hysteresis absorbs prints ``... Attempted
  loss scale: 65536, but hysteresis is 2. Reducing hysteresis to 1``: the step is skipped but the
  scale stays, so it is not a backoff and ``read_log`` does not count it. At its minimum the scaler
  raises ``Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.``
- DeepSpeed without ZeRO: ``[Rank 0] Overflow detected. Skipping step. Attempted loss scale: 65536,
  reducing to 32768.0`` (fused optimizer) or ``[deepspeed] fp16 dynamic loss scale overflow!
  Skipping step. Attempted loss scale: ...`` (unfused), each after ``Reducing dynamic loss scale
  from 65536 to 32768.0`` for the same overflow; ``read_log`` counts the overflow once.
  All DeepSpeed lines are INFO messages: since DeepSpeed 0.17.6 its logger shows only warnings
  unless the config sets ``"log_level": "info"``, so by default it prints nothing either.
- fairseq (0.12): ``NOTE: gradient overflow detected, ignoring gradient, setting loss scale to:
  64.0`` (0.10: ``NOTE: overflow detected, setting loss scale to: 64.0``; 0.9 and older:
  ``| WARNING: overflow detected, ...``); at its minimum it raises ``FloatingPointError: Minimum
  loss scale reached (0.0001). ...``. With ``--amp``: ``AMP: overflow detected, setting scale to
  to 64.0`` (sic). metaseq prints fairseq's line, and at its minimum keeps printing that scale.
- Megatron-LM / megatron-core print no line per overflow. Every ``--log-interval`` iterations the
  progress line says ``... | loss scale: 32768.0 | ... | number of skipped iterations:   2 | ...``;
  ``read_log`` takes the scale from each progress line that reports skipped iterations, and reads
  progress lines only when the log holds no overflow lines (Megatron-DeepSpeed prints both).

Prints nothing when it skips a step: ``torch.amp.GradScaler``; PyTorch Lightning, whose
``"16-mixed"`` precision drives one; NeMo (a GradScaler subclass with hysteresis, or
megatron-core's scaler; NeMo 1 sends ``loss_scale`` to the experiment logger, not to the console);
Keras 2 and Keras 3 ``LossScaleOptimizer``; jmp. There, log the scale yourself. With a GradScaler
(Lightning's is ``trainer.precision_plugin.scaler``)::

    scales = [scaler.get_scale()]
    for batch in loader:
        ...
        scaler.step(optimizer)
        scaler.update()
        scales.append(scaler.get_scale())  # lower than the one before: this step was skipped

then ``read_log(scale_lines(scales))``. What ``scaler.step(optimizer)`` returns cannot tell a
skipped step (it is ``optimizer.step()``'s result, ``None`` for most optimizers, and ``None`` when
skipped). A skip that hysteresis absorbs leaves the scale as it was and cannot be seen this way.
Keras 3 keeps the scale in ``optimizer.dynamic_scale``, jmp in ``loss_scale.loss_scale``.

This module needs numpy only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ampviz.scaling import ScalerTrace, _as_array
from ampviz._args import _shown

__all__ = ["LOG_FORMATS", "Diagnosis", "diagnose", "read_log", "scale_lines", "write_log"]

# A number as the frameworks print it (Python's repr or str of a float or an int). Every part is
# unambiguous (digits after the point only follow a literal point) and possessive, so a line that
# almost matches costs time linear in its length: no split of a long run of digits is retried.
_NUM = r"([-+]?+(?:\d++(?:\.\d*+)?+(?:[eE][-+]?+\d++)?+|inf|nan))"

# The overflow lines read_log counts, one per backoff: (a word every such line holds, so other
# lines are not searched; a pattern whose last group is the scale after the backoff).
_APEX = re.compile(r"Skipping step, (?:loss scaler \d++ )?+reducing loss scale to " + _NUM)
# DeepSpeed's lines (ZeRO's, the fused and unfused optimizers', older ones); a hysteresis line
# goes on "but hysteresis is" after the attempted scale and does not match
_DEEPSPEED = re.compile(r"Skipping step\. Attempted loss scale: " + _NUM + r", reducing to " + _NUM)
# fairseq 0.12 and metaseq ("gradient overflow detected, ignoring gradient, "), fairseq 0.10 and
# older ("overflow detected, ")
_FAIRSEQ = re.compile(r"overflow detected, (?:ignoring gradient, )?+setting loss scale to: " + _NUM)
_FAIRSEQ_AMP = re.compile(r"AMP: overflow detected, setting scale to (?:to )?+" + _NUM)
_AMPVIZ = re.compile(r"loss scale fell from " + _NUM + r" to " + _NUM)
_READERS = (("Skipping step, ", _APEX), ("Attempted loss scale: ", _DEEPSPEED),
            ("setting loss scale to: ", _FAIRSEQ), ("AMP: overflow detected", _FAIRSEQ_AMP),
            ("loss scale fell from ", _AMPVIZ))

# Lines that end the run at the minimum scale (DeepSpeed's exception, fairseq's FloatingPointError
# with or without --amp): there is no scale after them.
_STOPS = ("Current loss scale already at minimum", "Minimum loss scale reached (")

# Megatron's progress line, every --log-interval iterations
_MEGATRON_KEY = "number of skipped iterations:"
_MEGATRON_SKIPPED = re.compile(r"number of skipped iterations: *+(\d++)")
_MEGATRON_SCALE = re.compile(r"\| loss scale: " + _NUM)

#: ``write_log``'s styles: the overflow line a framework prints when it backs off (``{old}`` the
#: scale that overflowed, ``{new}`` the scale after), and the pattern ``read_log`` reads it with
#: (its last group is the scale after). Their origins are in the module docstring.
LOG_FORMATS = {
    "apex": ("Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to {new}", _APEX),
    "apex_fp16_utils": ("Gradient overflow.  Skipping step, reducing loss scale to {new}", _APEX),
    "deepspeed": ("[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {old}, reducing to {new}",
                  _DEEPSPEED),
    "deepspeed_fused": ("[Rank 0] Overflow detected. Skipping step. Attempted loss scale: {old}, reducing to {new}",
                        _DEEPSPEED),
    "deepspeed_unfused": ("[deepspeed] fp16 dynamic loss scale overflow! Skipping step. Attempted loss scale: "
                          "{old}, reducing to {new}", _DEEPSPEED),
    "fairseq": ("NOTE: gradient overflow detected, ignoring gradient, setting loss scale to: {new}", _FAIRSEQ),
    "fairseq_amp": ("AMP: overflow detected, setting scale to to {new}", _FAIRSEQ_AMP),
    "ampviz": ("skipped, loss scale fell from {old} to {new}", _AMPVIZ),
}


def _fmt(x: float) -> str:
    return repr(float(x))


def write_log(trace, style: str = "apex") -> str:
    """The overflow lines a framework would print for a simulated ``ScalerTrace``: one per step
    where the scaler backed off (skipped the step and changed the scale), each prefixed with its
    step number. ``style`` is a key of ``LOG_FORMATS``; scales are written in full (Python's repr
    of the float, where DeepSpeed's ZeRO prints ``int(scale)``), so the log reads back exactly.
    A run that was stopped prints nothing from the step that stopped it; a static scale never
    backs off, so it prints nothing; an overflow that hysteresis absorbed keeps the scale, so it
    prints no "reducing" line either."""
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
    return _lines(template, np.flatnonzero(backed_off).tolist(), scale, after)


def _lines(template: str, steps, before: np.ndarray, after: np.ndarray) -> str:
    return "\n".join(f"step {i}: " + template.format(old=_fmt(before[i]), new=_fmt(after[i])) for i in steps)


def scale_lines(scales) -> str:
    """Log lines for the steps your scaler skipped, from the loss scale you recorded yourself.

    ``scales``: the scale the first step used, then the scale after each step's update, in order
    (for a ``torch.amp.GradScaler``: ``scaler.get_scale()`` before training, then after each
    ``scaler.update()``), so ``scales[i]`` is the scale step ``i`` used and ``scales[i + 1]`` the
    scale after it. Where the scale fell (or became NaN), step ``i`` was skipped, and a line
    ``step i: skipped, loss scale fell from 65536.0 to 32768.0`` is written; ``read_log`` reads
    these lines like a framework's (``LOG_FORMATS["ampviz"]``). A skip that left the scale as it
    was (hysteresis, a static scale) cannot be seen from the scale and gives no line.
    """
    s = _scales(scales, "the loss scale the first step used, then the scale after each step, "
                        "a 1-D list of numbers")
    before, after = s[:-1], s[1:]
    with np.errstate(invalid="ignore"):
        fell = (after < before) | (np.isnan(after) & ~np.isnan(before))
    return _lines(LOG_FORMATS["ampviz"][0], np.flatnonzero(fell).tolist(), before, after)


def read_log(text) -> np.ndarray:
    """The scale after each overflow line found in ``text`` (a string, or bytes in UTF-8), in order.

    Counted, one per backoff: every line of ``LOG_FORMATS`` (apex, DeepSpeed with and without ZeRO,
    fairseq and metaseq, fairseq's ``--amp``, ``scale_lines``) and older wordings of the same
    frameworks; metaseq's line at its minimum too (it names the same scale again, worded as a
    backoff). Not counted: a skipped step that says it keeps the scale (DeepSpeed's "but hysteresis
    is h. Reducing hysteresis to h-1": not a backoff) or names no scale (metaseq's "rejecting
    batch"), and a line that repeats an overflow already counted (DeepSpeed's "Reducing dynamic
    loss scale from" and "Grad overflow on iteration"). A line that ends the run at the minimum
    scale gives NaN, once however many ranks print it: no scale comes after it, as in a simulated
    run that stopped. Megatron's progress lines count only in a log without any of these (see the
    module docstring).

    Prefixes (timestamps, ``[Rank 0]``, torchrun's ``[default0]:``) are ignored; a line that every
    rank prints appears once per rank, so keep one rank's lines of such a log first. Time is
    linear in the length of the text.
    """
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", errors="replace")
    if not isinstance(text, str):
        raise TypeError(f"text must be a log's text (a string), got {_shown(text)}")
    found, progress = [], []
    stopped = False  # the last thing found ended the run: its copies (other ranks) add nothing
    for line in text.splitlines():
        m = None
        for key, pattern in _READERS:
            if key in line:
                m = pattern.search(line)
                if m:
                    break
        if m:
            found.append(float(m.groups()[-1]))
            stopped = False
        elif any(stop in line for stop in _STOPS):
            if not stopped:
                found.append(float("nan"))
            stopped = True
        elif _MEGATRON_KEY in line:
            skipped, scale = _MEGATRON_SKIPPED.search(line), _MEGATRON_SCALE.search(line)
            if skipped and scale and skipped.group(1).strip("0"):  # more than 0 skipped
                progress.append(float(scale.group(1)))
    return np.array(found if found else progress, dtype=np.float64)


@dataclass(frozen=True)
class Diagnosis:
    """``verdict`` is "sawtooth" (harmless), "ratchet" (falling), "collapse" or "unclear"."""

    verdict: str
    reason: str

    def __str__(self) -> str:
        return f"{self.verdict}: {self.reason}"


_WHAT = "the scales a log reports after each overflow (read_log's output), a 1-D list of numbers"


def _scales(scales, what: str = _WHAT) -> np.ndarray:
    """``scales`` as a 1-D float64 array, or one clear error saying ``what`` to pass."""
    if scales is None:
        raise TypeError(f"scales must be {what}, not None")
    if isinstance(scales, (str, bytes, bytearray)):
        hint = ": pass it through read_log first" if what == _WHAT else ""
        raise TypeError(f"scales must be {what}, not text{hint}")
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
      every step is skipped; and NaN, which ``read_log`` also gives for a line that ended the run
      at the minimum scale (DeepSpeed's exception, fairseq's FloatingPointError).
    - "ratchet": the last quarter of the messages reports a scale at least 4x (two binades) below
      the first quarter's: overflows come faster than the scale grows back. The scales alone do
      not show when each overflow came, so a calibration at the start of a run (overflows in
      consecutive steps while the scale comes down from its initial value, e.g. from Megatron's
      2^32) reads as a fall too: leave those first messages out.
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
        return Diagnosis("collapse", "the scale became NaN, or the run stopped at its minimum scale (read_log "
                                     "gives NaN for that line): no step trains after it")
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
