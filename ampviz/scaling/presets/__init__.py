"""All the framework presets by name: ``PRESETS`` (each framework's scaler at its defaults) and
``LEGACY`` (those new training no longer starts with, and why). Each framework family's presets
are in its own module: ``torch_amp``, ``deepspeed``, ``megatron``,
``apex`` (with NeMo), ``keras``, ``jmp``, ``fairseq`` (with
metaseq).
"""

from __future__ import annotations

from ampviz.scaling.presets.apex import ApexAmpScaler, ApexHysteresisScaler
from ampviz.scaling.presets.deepspeed import DeepSpeedScaler, DeepSpeedZeroScaler
from ampviz.scaling.presets.fairseq import FairseqScaler, MetaseqScaler
from ampviz.scaling.presets.jmp import JmpScaler
from ampviz.scaling.presets.keras import Keras3Scaler, KerasScaler
from ampviz.scaling.presets.megatron import MegatronScaler
from ampviz.scaling.presets.torch_amp import StaticScaler, TorchGradScaler


# ------------------------------------------------------------------ framework presets
# Each preset is a DynamicScaler configured as one framework's scaler, with that framework's
# defaults. Parameters use torch's names; each docstring gives the framework's own. The rules, as
# read from each project's source, are collected in the design notes on loss scalers, and
# tests/scaling/test_presets.py checks every preset against a plain transcription of its rule.


#: Each framework's scaler at its defaults, as its current release (apex amp: its last) runs it, by
#: name: first the scalers current training runs with, then a static scale, then the ``LEGACY`` ones.
PRESETS = {p.name: p for p in (
    TorchGradScaler(), DeepSpeedZeroScaler(), DeepSpeedScaler(), MegatronScaler(), ApexHysteresisScaler(),
    Keras3Scaler(), JmpScaler(), StaticScaler(),
    KerasScaler(), ApexAmpScaler(), FairseqScaler(), MetaseqScaler(),
)}

#: The presets of frameworks that new training no longer starts with, and why: kept because their
#: scalers live on in old code, papers and logs.
LEGACY = {
    "Keras 2": "tf.keras's LossScaleOptimizer, replaced by Keras 3's",
    "apex amp": "removed from NVIDIA apex in 2025",
    "fairseq": "its repository is archived",
    "metaseq": "its repository is archived",
}
