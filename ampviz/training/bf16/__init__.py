"""bf16 in practice: what bf16 makes unnecessary, what it makes possible, and what it costs.

bf16 keeps fp32's 8 exponent bits and only 7 mantissa bits. Every function here measures one
consequence of that with real torch (2.13, CPU) on seeded models and data:

1. **No loss scaler needed** (``scaler_need``): the beam model's gradients (``ampviz.training.beam``) at
   scale 1, cast to fp16 and to bf16 by torch: the share that fp16 flushes to 0 and bf16 keeps, and
   the gradients of real fp16 and bf16 autocast backward passes of the same batch.
2. **No overflow where fp16 overflows** (``overflow_model``, ``fp16_overflow``): a small seeded
   ReLU network without normalisation whose activations grow layer by layer past 65504. Evaluated
   in bf16 it stays finite; cast to fp16, one layer's outputs become inf and the next turns them
   into NaN. The report gives each layer's largest activation in fp32, bf16 and fp16 and the first
   layer where fp16 gives inf and NaN.
3. **Lost updates in bf16 weights, and three fixes** (``lost_update_runs``): plain gradient
   descent on a seeded linear regression, with the weights kept in five ways on the same data and
   the same gradients: fp32 (the reference), bf16 (each update rounded to nearest into the weight:
   updates up to half a bf16 step, 2^-9 to 2^-8 of the weight, are lost and the weights stall far
   from the optimum), bf16 with fp32 master weights, bf16 with a bf16 Kahan compensation buffer
   (``kahan_add_``), and bf16 with stochastic rounding (``stochastic_round_bf16``). Per step:
   the loss, the share of updates a bf16 weight rounding to nearest loses, and the share after
   which the run's stored state did not change at all.
4. **Stochastic rounding** (``stochastic_round_bf16``): add 16 random bits to the low half of the
   fp32 bit pattern and cut them off. ``rounding_statistics`` tests a rounding function
   statistically (unbiased within a bound from the binomial spread, only the two bf16 neighbours,
   exact values unchanged); ``variant_table`` runs it on the real function and on plausible wrong
   ones (``ROUNDINGS``), which fail.

The forward and backward passes of the regression run in float64 from the stored weights, and the
gradient is rounded once to float32: the runs differ only in how the update lands on the weight.

Thread count and CPU: the figures these functions return do not depend on torch's thread count
(``tests/training/test_bf16.py`` compares 1 and 2 threads bit for bit). The random bits come from
``torch.randint`` on a seeded ``torch.Generator``, which draws in order whatever the threads; the
regression's gradient is a float64 matrix-vector product rounded to float32, so another BLAS
kernel could change it only where a float64 rounding error crosses a float32 rounding boundary.
The fp32, fp16 and bf16 passes of the beam and the overflow network use torch's CPU kernels (matrix
products, autocast): their last bits could differ on another CPU or torch build, which was not
measured; the tests hold the figures to this stack's.

Everything is seeded: models are initialised inside ``torch.random.fork_rng`` and data come from
their own ``torch.Generator``, so the caller's random state is left as it was. This module needs
torch; ``ampviz/__init__.py`` does not import it.

Where the code lives (this module re-exports it all, so ``from ampviz.training.bf16 import X`` keeps
working): ``arguments`` (``BF16_MAX`` and the shared argument checks), ``rounding``
(``stochastic_round_bf16`` and the wrong roundings of ``ROUNDINGS``), ``rounding_stats``
(``rounding_statistics``, ``rounding_table``, ``variant_table``), ``scaler`` (``scaler_need``),
``overflow`` (``overflow_model``, ``fp16_overflow``), ``kahan`` (``kahan_add_``) and
``updates`` (``lost_update_runs`` and its tables), ``checkers`` (lesson 03b's exercises).
"""

from __future__ import annotations

# Re-exported from the modules below: the public API (``__all__``) and the private names other
# modules and tests use. Patch a module-level value where the code that reads it lives.
from ampviz.training.bf16.rounding import ROUNDINGS, stochastic_round_bf16
from ampviz.training.bf16.rounding_stats import (DEFAULT_VALUES, RoundingCheck, RoundingStats,
    rounding_statistics, rounding_table, variant_table)
from ampviz.training.bf16.scaler import (GRADIENT_SETS, GradientShare, RunZeros, ScalerNeed, scaler_need,
    scaler_need_table)
from ampviz.training.bf16.overflow import OverflowReport, fp16_overflow, overflow_model, overflow_table
from ampviz.training.bf16.kahan import kahan_add_
from ampviz.training.bf16.updates import (METHODS, LostUpdateRuns, UpdateRun, lost_update_runs,
    lost_update_steps_table, lost_update_table)
from ampviz.training.bf16.checkers import (check_round_up_share, check_stochastic_rounding, check_why_bf16_no_scaler,
    check_why_bf16_stalls, check_why_tf32_error)

__all__ = [
    # stochastic rounding
    "stochastic_round_bf16",
    "ROUNDINGS",
    "RoundingCheck",
    "RoundingStats",
    "rounding_statistics",
    "rounding_table",
    "variant_table",
    "DEFAULT_VALUES",
    # 1: no scaler in bf16
    "GradientShare",
    "RunZeros",
    "GRADIENT_SETS",
    "ScalerNeed",
    "scaler_need",
    "scaler_need_table",
    # 2: overflow in fp16
    "overflow_model",
    "OverflowReport",
    "fp16_overflow",
    "overflow_table",
    # 3: lost updates and their fixes
    "kahan_add_",
    "METHODS",
    "UpdateRun",
    "LostUpdateRuns",
    "lost_update_runs",
    "lost_update_table",
    "lost_update_steps_table",
    # lesson 03b's exercises
    "check_round_up_share",
    "check_stochastic_rounding",
    "check_why_bf16_no_scaler",
    "check_why_bf16_stalls",
    "check_why_tf32_error",
]
