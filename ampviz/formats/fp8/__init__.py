"""FP8 per-tensor scaling, bit for bit: current scaling (torchao's float8 training, and Transformer
Engine's ``Float8CurrentScaling`` recipe with ``convention="te"``) and delayed scaling (Transformer
Engine's ``DelayedScaling`` recipe), as immutable state machines and fast simulators over a stream
of amaxes, and what each costs a stream of tensors (``rms_errors``, ``recipe_table``). Transformer
Engine 2.x ships block scaling recipes too (MXFP8, NVFP4): ``ampviz.formats.blocks``.

An FP8 tensor is stored as ``fp8(x * scale)``, and read back as ``data / scale``. The scale maps the
tensor's largest magnitude, its *amax*, near the format's ``max`` (448 for E4M3, 57344 for E5M2):
``scale = max / amax``. Where the amax comes from is the difference between the two recipes.

**Current scaling** (``current_scale``, ``current_quantize``) uses the tensor's own amax, computed
just before the cast, as torchao's ``float8`` training does (``torchao/float8/float8_utils.py``,
torchao 0.18): ``amax_to_scale`` divides in float64 and rounds once to float32,
``scale = f32(max / max(amax, 1e-12))`` (``EPS``: an all-zero tensor gets ``max * 1e12``, an inf amax
gives 0, NaN gives NaN), and ``round_to_power_of_2`` rounds the scale down to a power of two as
torchao does, ``exp2(floor(log2(scale)))`` in float32. Granularity ``"tensorwise"`` (one amax) or
``"rowwise"`` (one amax per row, along the last axis: torchao's ``AXISWISE`` with ``axiswise_dim=-1``;
its ``rowwise`` recipe rounds the scales to powers of two). ``convention="te"`` follows
Transformer Engine's current-scaling kernel instead (``compute_scale_from_amax`` in
``transformer_engine/common/recipe/recipe_common.cuh``): a float32 division, an amax of 0, inf or
NaN gives scale 1, and powers of two by clearing the mantissa bits (an exact floor).

**Delayed scaling** (``DelayedScaler``, ``simulate_delayed``) uses the amaxes of earlier steps, as
Transformer Engine's ``DelayedScaling`` recipe does (``transformer_engine/pytorch/quantization.py``,
the Python update ``_default_get_amax_and_update_history`` and ``_default_sf_compute``):

* each step quantizes with the scale in force and records its amax in slot 0 of the history
  (``amax_history_len`` slots, here ``history_len``);
* after the step the window's amax is the largest of the last ``history_len`` amaxes, this step's
  included (``algo="max"``; NaN propagates as in ``torch.max``), or this step's alone
  (``"most_recent"``); the history rolls by one and slot 0 is cleared for the next step;
* the next step's scale is ``(max * (1 / amax)) / 2**margin`` in float32, **unless** the window's
  amax is 0 (or less), inf or NaN: then the scale in force stays. A scale that overflows to inf
  becomes float32's largest value. The division is written ``fp8_max / amax`` in Transformer
  Engine, which torch evaluates as ``amax.reciprocal() * fp8_max`` (eager, TorchScript and
  ``torch.compile`` alike, on the CPU): two float32 roundings, so about a quarter of the scales
  are one ulp away from the correctly rounded ``max / amax`` of torchao and of Transformer
  Engine's CUDA kernel.

An inf (or NaN) amax therefore stays in the window and *freezes* the scale for ``history_len``
steps under ``"max"``, and a spike holds the scale down for as long; both show in the trace.

``convention="cuda"`` follows Transformer Engine's fused update instead, the kernel its PyTorch
modules run by default (``kernel_bulk`` in ``transformer_engine/common/recipe/delayed_scaling.cu``,
``fused_amax_and_scale_update_after_reduction``; the Python update runs instead when
``NVTE_UNFUSED_FP8_UPDATE=1`` or ``amax_compute_algo`` or ``scaling_factor_compute_algo`` is a
callable): the scale is ``(max * 2**-margin) / amax``, one correctly rounded float32 division; a
step whose amax is 0 does not roll the history and keeps the scale (the window stops in time);
and the window's max is taken with ``fmaxf``, which drops NaNs (a NaN freezes nothing under
``"max"``; it still counts, as NaN, under ``"most_recent"``).

The recipe's formats: ``HYBRID`` (Transformer Engine's default) quantizes the forward tensors
(activations, weights) in E4M3 and the gradients in E5M2, ``E4M3`` everything in E4M3 (see
``recipe_formats``); a stream here is one tensor, in one format (``fmt``). The scale starts at 1.

Inputs are numbers, lists, numpy arrays or torch tensors, rounded to float32 first (the amax
history and the scales are float32 tensors in both libraries). Results are read-only numpy
arrays. This module needs numpy only.
"""

from __future__ import annotations

import numpy as np

# The code lives in the modules below (each imports its siblings directly): current (current
# scaling), delayed (delayed scaling), stream (a stream of tensors under either recipe), compare
# (the RMS error of a run and recipes side by side) and common (the checks and recipe_formats they
# share); the exercise checkers stay here.
# The public API (``__all__``) and the private names other modules and tests use are re-exported.
from ampviz.formats.catalog import FP8_E4M3, FP8_E5M2, get_format  # noqa: F401
from ampviz.formats.fp8.common import _readonly, recipe_formats
from ampviz.formats.fp8.current import (CONVENTIONS, EPS, GRANULARITIES, CurrentScaled, _pow2_floor_bits,
    _pow2_floor_torchao, current_quantize, current_scale)
from ampviz.formats.fp8.delayed import (ALGOS, DELAYED_CONVENTIONS, DelayedScaler, DelayedState, DelayedTrace,
    simulate_delayed)
from ampviz.formats.fp8.stream import (BASES, RECIPES, Fp8ScalingTrace, TensorStream, simulate_fp8_scaling,
    tensor_stream)
from ampviz.formats.fp8.compare import recipe_table, rms_errors
from ampviz.formats.fp8.te_recipes import (NVFP4_TILES, TE_RELEASE, TEQuantized, te_current_scaling,
    te_float8_block_scaling, te_mxfp8, te_nvfp4)
from ampviz.formats.inputs import _TORCH_MAX_NAN, _describe, _real_array  # noqa: F401
from ampviz.formats.spec import FloatFormat  # noqa: F401

__all__ = [
    "ALGOS",
    "GRANULARITIES",
    "CONVENTIONS",
    "DELAYED_CONVENTIONS",
    "EPS",
    "DelayedScaler",
    "DelayedState",
    "DelayedTrace",
    "CurrentScaled",
    "recipe_formats",
    "current_scale",
    "current_quantize",
    "simulate_delayed",
]
__all__ += ["RECIPES", "BASES", "TensorStream", "Fp8ScalingTrace", "tensor_stream", "simulate_fp8_scaling",
            "rms_errors", "recipe_table"]
__all__ += ["TE_RELEASE", "NVFP4_TILES", "TEQuantized", "te_current_scaling", "te_float8_block_scaling",
            "te_mxfp8", "te_nvfp4"]


# ------------------------------------------------------------------ exercise checkers
def _spike_hold_steps(history_len: int = 16, algo: str = "max") -> int:
    """Steps after a lone ×2^8 spike (flat amax 1 otherwise) whose scale is lower than before it."""
    a = np.ones(60, np.float32)
    a[20] = 256
    tr = simulate_delayed(a, history_len=history_len, algo=algo)
    return int((tr.scale[21:] < tr.scale[20]).sum())


def check_spike_hold(answer):
    """Q: delayed scaling, ``history_len=16``, ``algo="max"``; the amax is flat except for one step
    ×2^8. For how many steps after the spike is the scale 2^8 lower?"""
    from ampviz.checks import check

    return check(answer, _spike_hold_steps(), hint="the spike's amax stays in the window until the history "
                                                   "has rolled past it")


def check_current_scale(answer):
    """Q: torchao's current scaling, E4M3: the scale of a tensor whose amax is 3.5."""
    from ampviz.checks import check

    return check(answer, current_scale(3.5, FP8_E4M3), hint="the scale maps the amax onto the format's max")


def check_inf_current(answer):
    """Q: torchao's current scaling, a tensor with one inf among finite values: what share of the
    finite values become 0?"""
    from ampviz.checks import _said, check

    q = current_quantize(np.array([1.0, 2.0, 3.0, np.inf], np.float32))
    share = float(np.mean(q.data[:3] == 0))

    def accept(a) -> bool:
        said = _said(a)
        if said is not None:
            return said in ("100%", "100 %", "all", "all of them", "1", "1.0") if share == 1 else False
        return not isinstance(a, (bool, np.bool_)) and float(a) == share

    return check(answer, share, accept=accept, hint="what is 448 / inf?")


def check_margin_scale(answer):
    """Q: delayed scaling, E4M3, ``margin=1``: the window's amax is 3.5. The next step's scale?"""
    from ampviz.checks import check

    scale = float(DelayedScaler(margin=1, history_len=1).update(DelayedState(1.0, ()), 3.5).scale)
    return check(answer, scale, hint="the scale is (max / amax) / 2**margin")


__all__ += ["check_spike_hold", "check_current_scale", "check_inf_current", "check_margin_scale"]


# ------------------------------------------------------------------ questions that ask why
from ampviz.checks import Choice  # noqa: E402  (numpy only, as this package)

WHY_FP8_DELAYED_SATURATES = Choice(
    "why_fp8_delayed_saturates",
    "Section 3: under delayed scaling the spike step saturates 1,060 of its 4,096 values; current scaling "
    "saturates no value at any step. Why?",
    {"a": "delayed scaling's history is too short: a longer history would have remembered a spike that size",
     "b": "delayed scaling casts each step with a scale computed from earlier steps' amaxes, 2^8 too high for "
          "the spike; current scaling computes the scale from the spike's own amax before the cast",
     "c": "current scaling does not clamp: its largest values become inf instead of being held at ±448",
     "d": "the spike widens the tensor's span past what E4M3 keeps, and only current scaling can cover it"},
    "b",
    {"a": "with a history of 1,024 steps the first spike saturates too (section 2): no history holds an amax "
          "that has not happened yet",
     "c": "current scaling maps the tensor's own amax onto 448, so nothing is left to clamp or to become inf "
          "(section 2: 0 steps saturate)",
     "d": "a spike multiplies the whole tensor by 2^8, which moves its values without widening their span; "
          "current scaling fits the spike steps as it fits every other (section 2)"},
)


check_why_fp8_delayed_saturates = WHY_FP8_DELAYED_SATURATES.checker()


WHY_FP8_HYBRID_FORMATS = Choice(
    "why_fp8_hybrid_formats",
    "HYBRID casts activations and weights to E4M3 and gradients to E5M2. Why this split?",
    {"a": "gradients need E5M2's inf to detect an overflow and skip the step, as a loss scaler does",
     "b": "gradients are smaller numbers than activations, and E5M2 reaches smaller numbers",
     "c": "E5M2 keeps 14 more binades, room for the gradients' wider and spikier range; E4M3 keeps one more "
          "mantissa bit, a finer step, for the forward tensors",
     "d": "E5M2 rounds more finely than E4M3, and gradients need the precision"},
    "c",
    {"a": "the cast clamps to ±max before it rounds (section 2 counts saturated values, held at ±max): a "
          "gradient past the range becomes ±57344, not inf",
     "b": "the scale moves any tensor's values into the window: section 1's gradients (× 2^-20) land as the "
          "activations do once scaled; what matters is how many binades a tensor spans, not how small it is",
     "d": "E5M2 has 2 mantissa bits to E4M3's 3: its step is twice as coarse, and its RMS error about twice "
          "E4M3's (section 6)"},
)


check_why_fp8_hybrid_formats = WHY_FP8_HYBRID_FORMATS.checker()


WHY_FP8_MARGIN_TRADES = Choice(
    "why_fp8_margin_trades",
    "Section 5, synthetic stream: margin 1 removes the saturations that drift causes, and doubles the share "
    "of values underflowed. Why both?",
    {"a": "margin widens E4M3's window by a binade at the top",
     "b": "margin smooths the amax history, so the scale reacts to the drift more slowly",
     "c": "margin divides the scale by 2^margin: the window slides down a binade, which leaves a binade of "
          "headroom above the amax and drops the binade at its bottom below the smallest subnormal",
     "d": "margin rounds the scale down to a power of two"},
    "c",
    {"a": "the window is E4M3's 17.8 binades at every margin (section 1): margin moves where it sits, not how "
          "wide it is",
     "b": "margin changes no amax and no history: the scale is still max / amax of the same window, divided "
          "by 2^margin (section 2's formula)",
     "d": "that is round_to_power_of_2, an option of current scaling (open exercise 2); margin divides the "
          "scale by exactly 2^margin, whatever it is"},
)


check_why_fp8_margin_trades = WHY_FP8_MARGIN_TRADES.checker()


__all__ += ["check_why_fp8_delayed_saturates", "check_why_fp8_hybrid_formats", "check_why_fp8_margin_trades"]
