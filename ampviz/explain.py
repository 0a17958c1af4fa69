"""What an AMP error means: cause and fix for the errors and warnings mixed precision produces.

``explain(exc)`` takes an exception (or a warning) that a learner met and returns an
``Explanation``: what it means, why it happens, how to fix it, and where the course shows it.
Messages are matched on their exact wording on the pinned stack (torch 2.13, lightning 2.6.6);
anything else gets an honest "not an AMP error ampviz knows".

This module needs nothing but the standard library.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, replace

__all__ = ["Explanation", "explain", "KNOWN"]


@dataclass(frozen=True)
class Explanation:
    """``known`` is False for errors this module does not recognise."""

    title: str
    cause: str
    fix: str
    lesson: str = ""
    known: bool = True

    def __str__(self) -> str:
        lines = [self.title, f"  cause: {self.cause}", f"  fix:   {self.fix}"]
        if self.lesson:
            lines.append(f"  see:   {self.lesson}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        import html

        rows = [("cause", self.cause), ("fix", self.fix)] + ([("see", self.lesson)] if self.lesson else [])
        body = "".join(f"<tr><td><b>{k}</b></td><td>{html.escape(v)}</td></tr>" for k, v in rows)
        return f"<p><b>{html.escape(self.title)}</b></p><table>{body}</table>"


def _rule(types, pattern, title, cause, fix, lesson=""):
    return (tuple(types), re.compile(pattern), Explanation(title, cause, fix, lesson))


_NB_GRADSCALER = "notebook 04 (GradScaler internals)"

#: (exception or warning type names, message pattern, explanation), tried in order.
KNOWN = [
    _rule(["AssertionError"], r"Attempted (unscale_|step|update|_check_inf_per_device) but _scale is None",
          "GradScaler was used before scaler.scale(...) ran",
          "The scaler creates its scale lazily at the first scaler.scale(loss). No scale() ran before "
          "this call: the backward pass used loss.backward() instead of scaler.scale(loss).backward(). "
          "In Lightning manual optimization this is loss.backward() instead of "
          "self.manual_backward(loss); only the first step raises, later ones are silently unscaled.",
          "Call scaler.scale(loss).backward() (Lightning: self.manual_backward(loss)).",
          "notebooks 04 and 08"),
    _rule(["RuntimeError"], r"unscale_\(\) has already been called on this optimizer since the last update\(\)",
          "unscale_ called twice in one iteration",
          "scaler.unscale_(optimizer) may run once per optimizer between two update() calls; gradient "
          "accumulation or clipping code often calls it on every micro-batch.",
          "Unscale once, right before clipping and step(), after the last accumulated backward.", _NB_GRADSCALER),
    _rule(["RuntimeError"], r"unscale_\(\) is being called after step\(\)",
          "unscale_ called after step",
          "step() already unscaled (and maybe applied) the gradients of this optimizer.",
          "Order per iteration: scale(loss).backward(), unscale_(opt) (optional, e.g. for clipping), "
          "step(opt), update().", _NB_GRADSCALER),
    _rule(["RuntimeError"], r"step\(\) has already been called since the last update\(\)",
          "step called twice without update",
          "Each optimizer may step once per iteration; update() closes the iteration. A missing "
          "update(), or an earlier update() that raised, leaves the optimizer marked as stepped.",
          "Call scaler.update() once after the optimizers' step() calls, every iteration.", _NB_GRADSCALER),
    _rule(["AssertionError"], r"No inf checks were recorded for this optimizer",
          "step() found no gradients for this optimizer",
          "Every parameter of this optimizer has .grad None: the backward pass did not reach them "
          "(a frozen or unused module, or a loss computed under no_grad).",
          "Make the loss depend on these parameters, or leave them out of the optimizer.", _NB_GRADSCALER),
    _rule(["AssertionError"], r"No inf checks were recorded prior to update",
          "update() with no inf check recorded",
          "update() needs the overflow checks that unscale_() or step() record in this iteration "
          "(unscale_() alone is enough).",
          "Call scaler.step(optimizer) (or unscale_) before scaler.update().", _NB_GRADSCALER),
    _rule(["ValueError"], r"Attempting to unscale FP16 gradients",
          "fp16 weights with GradScaler",
          "GradScaler expects fp32 parameters (autocast keeps weights fp32 and casts copies); these "
          "parameters are fp16 (model.half(), an fp16 checkpoint), so unscaling in fp16 would lose "
          "exactly the small gradients scaling protects.",
          "Keep the model in fp32 and use torch.autocast; or train in bf16 without a scaler.",
          "notebooks 04 and 07"),
    _rule(["RuntimeError"], r"Closure use is not currently supported if GradScaler is enabled",
          "optimizer closure with GradScaler",
          "A closure (as LBFGS needs) re-evaluates the loss inside step(), outside the scaler's control.",
          "Use an optimizer without a closure, or train LBFGS without AMP.", _NB_GRADSCALER),
    _rule(["AssertionError"], r"The (growth|backoff) factor must be",
          "invalid GradScaler factor",
          "growth_factor must be above 1 and backoff_factor below 1.",
          "E.g. growth_factor=2.0, backoff_factor=0.5 (torch's defaults).", _NB_GRADSCALER),
    _rule(["AssertionError"], r"new_scale should be a float or a 1-element",
          "update(new_scale) with a tensor it refuses",
          "update(new_scale) takes a Python float, or a one-element tensor on the scaler's device type "
          "that does not require grad.",
          "Pass float(value), or a detached one-element tensor on the same device.", _NB_GRADSCALER),
    _rule(["RuntimeError"], r"The source state dict is empty",
          "loading an empty GradScaler state",
          "The state dict came from a disabled scaler (GradScaler(enabled=False) saves {}).",
          "Save the state of an enabled scaler, or skip loading it when AMP was off.", _NB_GRADSCALER),
    _rule(["AssertionError"], r"A GradScaler instance may only be pickled at the beginning of an iteration",
          "pickling GradScaler mid-iteration",
          "Between scale()/unscale_()/step() and update() the scaler holds per-optimizer state that "
          "cannot be pickled (a deepcopy or a checkpoint taken mid-iteration).",
          "Checkpoint before the iteration starts or after scaler.update(); save scaler.state_dict().",
          _NB_GRADSCALER),
    _rule(["ValueError"], r"outputs must be a Tensor or an iterable of Tensors",
          "scaler.scale() got something that is not a tensor",
          "scale() multiplies tensors (the loss); a Python number or None has no graph to scale.",
          "Pass the loss tensor: scaler.scale(loss).backward().", _NB_GRADSCALER),
    _rule(["RuntimeError"], r"expected scalar type Float but found (BFloat16|Half)",
          "nn.TransformerEncoder fast path under autocast",
          "In eval mode without grad, nn.TransformerEncoder (nested tensors on, batch_first, a padding "
          "mask) takes a fused fast path that does not follow autocast on the CPU: a LayerNorm gets "
          "low-precision activations with fp32 weights. Training works; validation crashes.",
          "enable_nested_tensor=False, torch.backends.mha.set_fastpath_enabled(False), an fp32 island "
          "around the encoder, or bf16-true precision.", "notebook 10"),
    _rule(["RuntimeError"], r"(mat1 and mat2|m1 and m2) (must have|to have) the same dtype",
          "a matrix multiply got two dtypes",
          "A bf16/fp16 tensor met fp32 weights outside autocast (or, on older torch, inside the "
          "TransformerEncoder fast path: the same bug as 'expected scalar type Float').",
          "Run the op under torch.autocast, or cast the input to the weights' dtype.", "notebook 10"),
    _rule(["RuntimeError"], r"element 0 of tensors does not require grad and does not have a grad_fn",
          "the loss has no graph",
          "Nothing the loss depends on requires grad: it was computed under torch.no_grad(), from "
          "detached tensors, or (older torch/Lightning) from autocast's cached weight casts made "
          "during an earlier no_grad pass inside the same autocast.",
          "Compute the loss with grad enabled; disable autocast inside no_grad blocks, or use "
          "autocast(cache_enabled=False).", "notebook 09"),
    _rule(["RuntimeError", "NotImplementedError"],
          r"_amp_foreach_non_finite_check_and_unscale_cuda\" not implemented for 'BFloat16'",
          "GradScaler with bf16 gradients on CUDA",
          "bf16 has fp32's exponent range, so it needs no loss scaling; the CUDA unscale kernel does not "
          "accept bf16 gradients.",
          "Drop the GradScaler for bf16 (Lightning: precision='bf16-mixed' uses none).", "notebook 07"),
    _rule(["UserWarning"], r"Detected call of `lr_scheduler.step\(\)` before `optimizer.step\(\)`",
          "scheduler stepped before the optimizer",
          "With GradScaler the first iteration often overflows (the initial scale is large) and its "
          "optimizer step is skipped; the scheduler still stepped, so torch warns.",
          "Harmless once; or step the scheduler only when the scale did not drop.", _NB_GRADSCALER),
    _rule(["UserWarning"], r"torch.cuda.amp.GradScaler is enabled, but CUDA is not available",
          "GradScaler disabled itself",
          "torch.amp.GradScaler() defaults to device 'cuda'; without CUDA it becomes a no-op scaler.",
          "Use torch.amp.GradScaler('cpu') on a CPU.", _NB_GRADSCALER),
    _rule(["FutureWarning"], r"`torch.(cuda|cpu).amp.GradScaler\(args...\)` is deprecated",
          "deprecated GradScaler import",
          "torch.cuda.amp.GradScaler and torch.cpu.amp.GradScaler are old spellings.",
          "torch.amp.GradScaler('cuda', ...) or torch.amp.GradScaler('cpu', ...).", _NB_GRADSCALER),
]


_UNKNOWN = Explanation(
    title="",
    cause="This message is not one of the mixed-precision errors the course explains.",
    fix="Read the traceback from the bottom; if it mentions autocast, GradScaler or a dtype, "
        "compare with notebooks 04 and 08-10.",
    known=False,
)
_MAX_LINKS = 1000  # exceptions looked at in one chain or group, at most


def _text(exc) -> str:
    """str(exc), or as much of its message as can be had when its __str__ is broken."""
    try:
        text = str(exc)
        if isinstance(text, str):
            return text
    except Exception:
        pass
    try:
        return " ".join(a if isinstance(a, str) else repr(a) for a in exc.args)
    except Exception:
        return ""


def _linked(exc) -> list:
    """The exceptions an exception leads to: the members of a group, its cause, and its context
    (unless suppressed, as ``raise ... from None`` does), as a traceback shows them."""
    out = []
    try:
        members = getattr(exc, "exceptions", None) if isinstance(exc, BaseExceptionGroup) else None
        out.extend(m for m in (members or ()) if isinstance(m, BaseException))
    except Exception:
        pass
    for attr in ("__cause__", "__context__"):
        try:
            if attr == "__context__" and getattr(exc, "__suppress_context__", False):
                continue
            linked = getattr(exc, attr, None)
        except Exception:
            continue
        if isinstance(linked, BaseException):
            out.append(linked)
    return out


def _chain(exc) -> list:
    """exc and every exception it leads to, breadth first, each once (chains can loop)."""
    seen, order, queue = set(), [], [exc]
    while queue and len(order) < _MAX_LINKS:
        e = queue.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        order.append(e)
        queue.extend(_linked(e))
    return order


def _match(names, text):
    for types, pattern, explanation in KNOWN:
        if (names is None or names & set(types)) and pattern.search(text):
            return explanation
    return None


def explain(exc) -> Explanation:
    """Cause and fix for an AMP exception or warning: an exception, a warning instance, a
    ``warnings.WarningMessage`` from ``warnings.catch_warnings(record=True)``, or the message as a
    string (e.g. copied from a traceback).

    A known error is found also where it is the cause or context of another exception (``raise
    ... from ...``, an error raised while handling one) or a member of an ``ExceptionGroup``; the
    first one found, outermost first, is explained. A string is matched on its wording alone.
    """
    if isinstance(exc, warnings.WarningMessage):
        exc = exc.message
    if isinstance(exc, (bytes, bytearray)):
        exc = exc.decode("utf-8", "replace")
    if isinstance(exc, str):
        found = _match(None, exc)
        if found is not None:
            return found
        return replace(_UNKNOWN, title="not an AMP error ampviz knows (a message)")
    if not isinstance(exc, BaseException):
        name = type(exc).__name__
        got = "None" if exc is None else f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"
        raise TypeError(f"explain takes an exception, a warning or a message string, got {got}; pass the "
                        "exception you caught: except Exception as exc: explain(exc)")
    for e in _chain(exc):
        found = _match({cls.__name__ for cls in type(e).__mro__}, _text(e))
        if found is not None:
            return found
    return replace(_UNKNOWN, title=f"not an AMP error ampviz knows ({type(exc).__name__})")
