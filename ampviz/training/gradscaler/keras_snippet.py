"""The TensorFlow snippet of the loss-scaling write-up, run on a real Keras ``LossScaleOptimizer``.

The write-up (``WRITEUP_LOSS_SCALING``) wraps an optimizer in a ``LossScaleOptimizer``, multiplies
the loss by ``loss_scale.loss_scale``, unscales with ``loss_scale.unscale(...)`` and applies the
gradients with the *inner* optimizer. ``keras_snippet()`` runs each of those calls on Keras 3 (the
Keras that TensorFlow's ``tf.keras`` is from TensorFlow 2.16 on), on its torch backend, so that no
TensorFlow is needed:

* which of the attributes the snippet uses the optimizer lacks, with the AttributeError;
* one step with an inf gradient applied the snippet's way (the inner optimizer) and the way Keras
  documents (the ``LossScaleOptimizer`` itself): the weights after it, and the loss scale.

Keras is imported only here, with ``KERAS_BACKEND=torch`` while it loads (the environment is put
back afterwards); a Keras already loaded with another backend is refused with a one-line error.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import numpy as np

__all__ = ["KerasSnippetRun", "keras_snippet"]

#: The attributes of ``LossScaleOptimizer`` the write-up's snippet calls.
SNIPPET_ATTRIBUTES = ("loss_scale", "unscale")


@dataclass(frozen=True)
class KerasSnippetRun:
    """What Keras did with the write-up's snippet.

    ``missing``: the snippet's attributes the optimizer lacks; ``error``: the AttributeError of the
    first one, "AttributeError: ..."; ``inner`` and ``wrapped``: (weights after one step with the
    gradient [inf, 1] from weights [1, 1], the loss scale after it), applied by the inner optimizer
    (the snippet) and by the ``LossScaleOptimizer``; ``initial_scale``: the scale before.
    """

    version: str
    missing: tuple
    error: str
    initial_scale: float
    inner: tuple
    wrapped: tuple


def _keras():
    """Keras, on its torch backend."""
    if "keras" not in sys.modules:
        before = os.environ.get("KERAS_BACKEND")
        os.environ["KERAS_BACKEND"] = "torch"
        try:
            import keras
        except ImportError as exc:
            raise ImportError("keras_snippet needs Keras 3: pip install keras (it runs on torch)") from exc
        finally:
            if before is None:
                os.environ.pop("KERAS_BACKEND", None)
            else:
                os.environ["KERAS_BACKEND"] = before
    import keras

    if keras.backend.backend() != "torch":
        raise RuntimeError(f"keras_snippet needs Keras on its torch backend; this Keras was loaded with "
                           f"{keras.backend.backend()!r}: restart the kernel and call keras_snippet() first")
    return keras


def _one_step(keras, through_wrapper: bool) -> tuple:
    """Weights [1, 1], gradient [inf, 1], Adam (lr 0.1) wrapped in a LossScaleOptimizer; one step."""
    import torch

    inner = keras.optimizers.Adam(learning_rate=0.1)
    wrapped = keras.optimizers.LossScaleOptimizer(inner)
    w = keras.Variable(np.ones(2, np.float32))
    wrapped.build([w])  # makes the loss scale (and the inner optimizer's slots)
    grad = torch.tensor([float("inf"), 1.0])
    (wrapped if through_wrapper else inner).apply_gradients([(grad, w)])
    return tuple(float(v) for v in w.value.detach().tolist()), float(wrapped.dynamic_scale)  # (torch backend)


def keras_snippet() -> KerasSnippetRun:
    """Run the write-up's TensorFlow snippet's calls on Keras 3's ``LossScaleOptimizer``."""
    keras = _keras()
    lso = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam())
    lso.build([keras.Variable(np.ones(2, np.float32))])
    missing = tuple(name for name in SNIPPET_ATTRIBUTES if not hasattr(lso, name))
    error = ""
    if missing:
        try:
            getattr(lso, missing[0])
        except AttributeError as exc:
            error = f"AttributeError: {exc}"
    return KerasSnippetRun(version=keras.__version__, missing=missing, error=error,
                           initial_scale=float(lso.dynamic_scale), inner=_one_step(keras, False),
                           wrapped=_one_step(keras, True))
