"""Dynamic loss scalers as small immutable state machines, and a fast simulator.

A dynamic loss scaler multiplies the loss by a scale S so that small gradients survive in fp16,
and adjusts S as it goes: after an overflow (some gradient became inf or NaN) it skips the
optimizer step and *backs off* (S *= backoff_factor); after enough clean steps in a row it *grows*
(S *= growth_factor). Frameworks differ in the details (hysteresis, floors and ceilings, whether
growth may reach inf, how the product is rounded), and the details decide whether a run survives.

``DynamicScaler`` is one configurable machine; each framework is a configuration of it
(``TorchGradScaler`` and the other presets in ``PRESETS``). Its state is immutable:
``policy.adjust(state, found_inf)`` returns the next state, as jmp's ``DynamicLossScale.adjust``
does. ``simulate(policy, found_inf=...)`` or ``simulate(policy, grad_max=...)`` runs a whole stream
and returns a ``ScalerTrace`` of numpy arrays.

``TorchGradScaler()`` reproduces ``torch.amp.GradScaler``'s ``_amp_update_scale_`` kernel exactly
(torch 2.13): the scale is a float32, each update multiplies in double precision and rounds once to
float32, a backoff resets the growth tracker to 0, growth happens only when the tracker *equals*
``growth_interval`` (and resets it to 0), growth that would give inf (or NaN) is refused, and there
is no floor: repeated backoffs reach float32's subnormals and, with a factor of 0.5, exactly 0.

Some frameworks end the run by raising: DeepSpeed ZeRO and fairseq at their minimum scale, apex amp
(and fairseq and metaseq) at a scale of 0, which they divide by, DeepSpeed ZeRO at an overflow once
its scale is inf. The state then says ``stopped``, and the trace gives the step and the exception
(``ScalerTrace.stopped_at``, ``ScalerTrace.stop_reason``).

Speed: the state only changes at overflows and growths, so ``simulate`` works per event, not per
step. Where events are far apart it searches for the next one with numpy and fills the clean
stretch before it with slices (the counters that fairseq's tolerance keeps just advance by its
length). Where they come every few steps (growth_interval=1, a scale that keeps overflowing) it
runs ``adjust`` written out as a Python loop over events, and takes at once what needs no loop:
a scale that no backoff (or no growth) moves stays until the other kind of step comes, and on a
found_inf stream whose every update is one exactly rounded multiplication (float64, or factors
that are float32 values) the scales are numpy's running product. Torch's rounding of a double
product to float32 (``_mul``) cannot be batched that way for other factors (0.995, 1.001): each
product depends on the rounding of the one before, so those runs stay a loop. The trace equals
stepping ``adjust`` once per step in every case, to the bit.

Where things are (this package's ``__init__`` only re-exports them):

- ``scaler``: ``ScalerState``, ``DynamicScaler`` and the arithmetic that rounds the scale.
- ``presets``: ``PRESETS`` and ``LEGACY``; each framework family's presets in its own module:
  ``torch_amp`` (``TorchGradScaler``, ``StaticScaler``), ``deepspeed``,
  ``megatron``, ``apex`` (apex amp, NeMo), ``keras`` (Keras 2 and 3),
  ``jmp``, ``fairseq`` (fairseq, metaseq); ``arguments``: their argument checks.
- ``inputs``: the checks of found_inf, grad_max, the format and the loss dtype.
- ``overflow``: the overflow model ``overflows`` and its per-gradient thresholds.
- ``simulate``: ``ScalerTrace`` and ``simulate``; its machinery in ``streams`` (the steps to run
  over), ``arrays`` (the trace being filled), ``events`` (event by event) and
  ``steps`` (step by step).

This module needs numpy only.
"""

from __future__ import annotations

# Re-exported from the modules below: the public API (``__all__``) and the private names other
# modules and tests use. Patch a module-level value where the code that reads it lives.
from ampviz._args import _shown
from ampviz.formats import FP16, FP32, FloatFormat, get_format
from ampviz.scaling.inputs import _as_array, _overflow_format
from ampviz.scaling.overflow import _thresholds32, overflows
from ampviz.scaling.presets import LEGACY, PRESETS
from ampviz.scaling.presets.apex import ApexAmpScaler, ApexHysteresisScaler
from ampviz.scaling.presets.deepspeed import DeepSpeedScaler, DeepSpeedZeroScaler
from ampviz.scaling.presets.fairseq import FairseqScaler, MetaseqScaler
from ampviz.scaling.presets.jmp import JmpScaler
from ampviz.scaling.presets.keras import Keras3Scaler, KerasScaler
from ampviz.scaling.presets.megatron import MegatronScaler
from ampviz.scaling.presets.torch_amp import StaticScaler, TorchGradScaler
from ampviz.scaling.scaler import DynamicScaler, ScalerState
from ampviz.scaling.simulator import ScalerTrace, simulate
from ampviz.scaling.streams import _ScaleDependentOverflows

__all__ = [
    "DynamicScaler",
    "ScalerState",
    "ScalerTrace",
    "TorchGradScaler",
    "StaticScaler",
    "ApexAmpScaler",
    "ApexHysteresisScaler",
    "DeepSpeedZeroScaler",
    "DeepSpeedScaler",
    "MegatronScaler",
    "KerasScaler",
    "Keras3Scaler",
    "JmpScaler",
    "FairseqScaler",
    "MetaseqScaler",
    "PRESETS",
    "LEGACY",
    "simulate",
    "overflows",
]
