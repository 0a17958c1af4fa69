"""The write-ups' GradScaler claims, run on the real torch.amp.GradScaler("cpu") (lessons 02 and 04)."""

import pytest
import torch

from ampviz.training.gradscaler.writeups import (default_init_scale, fp16_limits, gradscaler_claims,
    loss_scaling_claims, step_if_pattern, update_report)

STEPPED = "step() has already been called since the last update()"


def test_the_if_step_pattern_crashes_on_its_second_iteration():
    run = step_if_pattern(2)
    assert run.returned == (None,) and run.updates == 0 and run.steps_taken == 1
    assert run.crashed_at == 2 and run.error.startswith("RuntimeError: ") and STEPPED in run.error
    assert STEPPED in run.verdict


def test_one_iteration_of_the_pattern_runs():
    run = step_if_pattern(1)
    assert run.crashed_at is None and run.error is None and run.verdict == "runs 1 iterations"


def test_iterations_are_checked():
    with pytest.raises((TypeError, ValueError)):
        step_if_pattern(0)


def test_the_default_scale_and_fp16s_limits():
    assert default_init_scale() == 2.0**16
    lim = fp16_limits()
    assert lim == {"smallest_normal": 2.0**-14, "max": 65504.0, "keeps_2^-24": True, "keeps_2^-25": False}


def test_update_changes_the_scale_and_not_the_weights_dtype():
    up = update_report()
    assert up.clean == (2.0**16, 2.0**17) and up.overflow == (2.0**16, 2.0**15)
    assert up.dtypes == (str(torch.float32),)


def test_the_lessons_tables_hold_the_verdicts():
    ls = loss_scaling_claims()
    assert len(ls.rows) == 5 and "crashes at iteration 2" in ls.rows[2][2] and STEPPED in ls.rows[2][2]
    assert "has no loss_scale and no unscale" in ls.rows[4][2] and "scale 32768 → 16384" in ls.rows[4][2]
    assert ls.rows[1][2] == "holds: get_scale() = 65536" and ls.rows[3][2].startswith("not measured here")
    gs = gradscaler_claims()
    assert len(gs.rows) == 3 and "not precision" in gs.rows[0][2] and "float32" in gs.rows[0][2]
    assert gs.rows[1][2].startswith("deprecated: FutureWarning")


# ----- the TensorFlow snippet, on Keras 3's LossScaleOptimizer -----
def test_the_keras_snippet_run_matches_keras_itself():
    """keras_snippet's figures are Keras's own: the attributes the snippet calls are missing, an inf
    gradient through the inner optimizer poisons a weight and leaves the scale, through the
    LossScaleOptimizer it is skipped and the scale halves; a finite one through the wrapper steps."""
    import math

    import numpy as np

    from ampviz.training.gradscaler.keras_snippet import keras_snippet

    run = keras_snippet()
    import keras

    assert keras.backend.backend() == "torch" and run.version == keras.__version__
    assert run.missing == ("loss_scale", "unscale") and run.error.endswith("has no attribute 'loss_scale'")
    lso = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam())
    assert hasattr(lso, "scale_loss") and not hasattr(lso, "unscale")  # what Keras offers instead
    assert run.initial_scale == 2.0**15
    (w_inner, s_inner), (w_wrapped, s_wrapped) = run.inner, run.wrapped
    assert math.isnan(w_inner[0]) and 0.89 < w_inner[1] < 0.91 and s_inner == 2.0**15
    assert w_wrapped == (1.0, 1.0) and s_wrapped == 2.0**14
    w = keras.Variable(np.ones(2, np.float32))
    wrapped = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(learning_rate=0.1))
    wrapped.build([w])
    import torch
    wrapped.apply_gradients([(torch.tensor([1.0, 1.0]), w)])  # a finite gradient: the step runs
    assert max(w.value.detach().tolist()) < 1.0 and float(wrapped.dynamic_scale) == 2.0**15


def test_keras_on_another_backend_is_refused_in_one_line(monkeypatch):
    import keras
    import pytest

    from ampviz.training.gradscaler import keras_snippet as K

    keras_snippet_fn = K.keras_snippet
    keras_snippet_fn()  # loads Keras on torch first
    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    with pytest.raises(RuntimeError, match=r"^keras_snippet needs Keras on its torch backend; .*'jax'") as err:
        keras_snippet_fn()
    assert "\n" not in str(err.value)
