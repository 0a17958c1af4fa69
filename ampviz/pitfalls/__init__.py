"""The three PyTorch Lightning AMP pitfalls, as runnable scenarios (torch, lightning).

Each submodule holds one pitfall: functions that reproduce the failure on the installed versions
and verify each fix, each returning an ``Outcome``. Shared here: ``Outcome``, ``outcome_of`` (run a
scenario, keep what it raised), and ``quiet_trainer`` (a ``lightning.Trainer`` that prints no
progress bar, tips or summaries and writes nothing into the working directory).

- ``ampviz.pitfalls.manual_backward``: ``loss.backward()`` instead of ``self.manual_backward(loss)``;
- ``ampviz.pitfalls.autocast_cache``: the autocast weight cache and ``torch.no_grad()``;
- ``ampviz.pitfalls.transformer_eval``: ``nn.TransformerEncoder`` under ``bf16-mixed`` in validation.
- ``ampviz.pitfalls.questions``: lesson 08's questions that ask why.

Nothing here is imported by ``import ampviz``; lightning is imported inside the functions that need it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import tempfile
import warnings
from dataclasses import dataclass, field

from ampviz.text import measured
from ampviz._args import _shown

__all__ = ["Outcome", "outcome_of", "quiet_trainer", "versions"]


@dataclass
class Outcome:
    """What a scenario did: the exception it raised (type name and exact message), or its results.

    ``grad_norms``: per parameter (or per step), the gradient norms the scenario observed;
    ``loss``: the final (or validation) loss; ``scale``: the loss scale per step where a GradScaler
    ran; ``details``: anything else a lesson shows (e.g. the precision Lightning actually chose).
    """

    name: str
    error_type: str | None = None
    message: str | None = None
    grad_norms: dict = field(default_factory=dict)
    loss: float | None = None
    scale: list = field(default_factory=list)
    details: dict = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.error_type is not None

    def __str__(self) -> str:
        if self.failed:
            return f"{self.name}: {self.error_type}: {self.message}"
        loss = "" if self.loss is None else f", loss {measured(self.loss)}"  # the same on every CPU
        return f"{self.name}: ran{loss}"


def outcome_of(name: str, fn, *args, **kwargs) -> Outcome:
    """Run ``fn(*args, **kwargs)``; an exception becomes the Outcome's error (type and message).

    ``fn`` returns an ``Outcome`` (or a dict of its fields, or None) when it runs through; a
    ``name`` that is not a string, an ``fn`` that is not callable or that returns anything else is
    the caller's mistake, refused with a TypeError rather than recorded as the scenario's outcome.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a string (what the scenario is), not {_shown(name)}")
    if not callable(fn):
        raise TypeError(f"fn must be a function (the scenario to run), not {_shown(fn)}")
    try:
        result = fn(*args, **kwargs)
    except Exception as exc:  # the failure is the lesson: keep its exact type and message
        return Outcome(name=name, error_type=type(exc).__name__, message=str(exc))
    if isinstance(result, Outcome):
        return result
    if result is None:
        return Outcome(name=name)
    if not isinstance(result, dict):
        raise TypeError(f"fn must return an Outcome, a dict of its fields or None, not {_shown(result)}")
    fields = {f.name for f in dataclasses.fields(Outcome)} - {"name"}
    unknown = [k for k in result if k not in fields]
    if unknown:
        raise TypeError(f"fn returned a dict with the key {_shown(unknown[0])}, not a field of Outcome "
                        f"(the fields: {', '.join(sorted(fields))})")
    return Outcome(name=name, **result)


@contextlib.contextmanager
def quiet_trainer(**kwargs):
    """A ``lightning.Trainer`` on the CPU that prints and writes nothing (no progress bar, model
    summary, logger or checkpoints; Lightning's info lines silenced; a temporary root directory),
    as a context manager: ``with quiet_trainer(max_steps=5) as trainer: trainer.fit(...)``.

    Settings Lightning refuses raise its own ValueError/TypeError unchanged when its message is one
    line; any other refusal (a ``MisconfigurationException``, a multi-line message) becomes a
    one-line ValueError/TypeError that names the settings and quotes Lightning."""
    import lightning as L

    settings = dict(accelerator="cpu", devices=1, enable_progress_bar=False, enable_model_summary=False,
                    logger=False, enable_checkpointing=False)
    settings.update(kwargs)
    loggers = [logging.getLogger(n) for n in ("lightning.pytorch", "lightning.fabric", "lightning")]
    levels = [lg.level for lg in loggers]
    with tempfile.TemporaryDirectory() as root, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's tips; a lesson that shows a warning captures it itself
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        try:
            try:
                trainer = L.Trainer(default_root_dir=root, **settings)
            except (ValueError, TypeError) as exc:
                if str(exc).strip() and "\n" not in str(exc):
                    raise  # Lightning's own refusal, exactly as it words it (a lesson may show it)
                raise (TypeError if isinstance(exc, TypeError) else ValueError)(_one_line(exc, kwargs)) from exc
            except Exception as exc:  # e.g. MisconfigurationException: the settings are refused
                raise ValueError(_one_line(exc, kwargs)) from exc
            yield trainer
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)


def _one_line(exc: BaseException, kwargs: dict) -> str:
    """What Lightning said about these Trainer settings, on one line."""
    said = " ".join(str(exc).split()) or "no message"
    settings = ", ".join(f"{k}={_shown(v, 30)}" for k, v in kwargs.items())
    return f"lightning.Trainer refused {settings or 'its settings'}: {type(exc).__name__}: {said}"


def versions() -> dict:
    """The installed torch and lightning versions (the lessons say which world the learner is in)."""
    from importlib import metadata

    import torch

    try:  # from the installed metadata: importing lightning would cost seconds of a setup cell
        lightning_version = metadata.version("lightning")
    except metadata.PackageNotFoundError:
        lightning_version = None
    return {"torch": torch.__version__, "lightning": lightning_version}
