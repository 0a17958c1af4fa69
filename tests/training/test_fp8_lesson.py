"""ampviz.training.fp8_lesson: lesson 14's tables. The recipe table's rows are the recipes themselves
(torchao's two casts through the package, which equal torchao's; Transformer Engine's five through
te_recipes), its counts are values stored as 0, and a wrong count is caught; the loss table reads
train_fp8's runs; every function answers bad input in one line."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ampviz.formats.errors import relative_error
from ampviz.formats.fp8 import current_quantize
from ampviz.formats.fp8 import te_recipes as te
from ampviz.plots import plot_loss_curves
from ampviz.training import fp8_lesson as L
from ampviz.training.fp8_training import Fp8Run


def test_outlier_activations_are_seeded_gaussian_with_scaled_columns():
    x, cols = L.outlier_activations()
    y, cols2 = L.outlier_activations()
    assert x.dtype == np.float32 and x.shape == (256, 512) and not x.flags.writeable
    assert np.array_equal(x, y) and np.array_equal(cols, cols2) and cols.tolist() == sorted(cols.tolist())
    plain, _ = L.outlier_activations(factor=1)
    assert np.array_equal(x[:, cols], plain[:, cols] * np.float32(200))
    rest = np.setdiff1d(np.arange(512), cols)
    assert np.array_equal(x[:, rest], plain[:, rest]) and abs(float(plain.std()) - 1) < 0.01


def test_recipe_table_rows_are_the_recipes():
    """Each row's counts and errors recomputed from the recipe it names."""
    x, cols = L.outlier_activations()
    table = L.recipe_table(x, cols)
    assert table.column("recipe") == tuple(name for name, _, _ in L.RECIPE_ROWS)
    assert all(("(run)" in c) == (who == "torchao") for c, (_, who, _) in zip(table.column("computed by"), L.RECIPE_ROWS))
    rest = np.setdiff1d(np.arange(x.shape[1]), cols)
    want = []
    for granularity, pow2 in (("tensorwise", False), ("rowwise", True)):
        q = current_quantize(x, granularity=granularity, round_to_power_of_2=pow2)
        d = np.asarray(q.dequantized, np.float32)
        want.append((np.asarray(q.scale).size, 0, int(((d == 0) & (x != 0)).sum()), d))
    for q in (te.te_current_scaling(x), te.te_float8_block_scaling(x, block_dim=1),
              te.te_float8_block_scaling(x, block_dim=2), te.te_mxfp8(x), te.te_nvfp4(x)):
        want.append((q.scales.size, q.saturated, q.underflowed, q.dequantized))
    for row, (scales, saturated, underflowed, d) in zip(table.rows, want):
        assert row[2:5] == (f"{scales:,}", f"{saturated:,}", f"{underflowed:,}")
        assert row[5] == f"{100 * relative_error(x, d):.2g}%"
        assert row[6] == f"{100 * relative_error(x[:, rest], d[:, rest]):.2g}%"
    # the scales each recipe stores: one, one per row, per 1x128, per 128x128 tile, per 32, per 16
    assert table.column("scales") == ("1", "256", "1", "1,024", "8", "4,096", "8,192")


def test_underflow_counts_values_stored_as_zero_not_values_below_the_smallest_subnormal():
    """A plausible wrong count, the values under E4M3's smallest subnormal before scaling (2^-9),
    would give a far larger number than the values the scaled cast really stores as 0."""
    x, cols = L.outlier_activations()
    counted = int(L.recipe_table(x, cols).column("underflowed")[0])
    q = current_quantize(x)
    assert counted == int(((np.asarray(q.dequantized) == 0) & (x != 0)).sum()) == 175
    assert int((np.abs(x) < 2.0**-9).sum()) != counted


def test_the_finer_the_scale_the_fewer_values_flushed_next_to_outliers():
    """What lesson 14's third question asks about: tensorwise > rowwise > 1x128 > MXFP8."""
    counts = [int(c.replace(",", "")) for c in L.recipe_table(*L.outlier_activations()).column("underflowed")]
    tensorwise, rowwise, te_current, block128, _, mx, _ = counts
    assert tensorwise == te_current > rowwise > block128 > mx > 0
    assert all(c == "0" for c in L.recipe_table(*L.outlier_activations(factor=1)).column("underflowed")[:6])


def test_loss_table_reads_the_runs():
    losses = np.array([4.0, 3.0] + [1.0] * 10)
    runs = [Fp8Run("fp32", "beam", 0, losses, None), Fp8Run("tensorwise", "beam", 0, losses * 2, None)]
    table = L.loss_table(runs)
    assert table.rows == (("fp32", "4", "1", "1.00x"), ("tensorwise", "8", "2", "2.00x"))
    assert table.columns[-1] == "vs fp32" and "12 steps" in table.title
    assert L.loss_table({r.mode: r for r in runs}.values()).rows == table.rows


@pytest.mark.parametrize("call, match", [
    (lambda: L.loss_table([]), "runs must be a list of train_fp8's runs"),
    (lambda: L.loss_table("fp32"), "runs must be a list of train_fp8's runs"),
    (lambda: L.loss_table([1, 2]), "runs must be a list of train_fp8's runs"),
    (lambda: L.outlier_activations(rows=0), "rows"),
    (lambda: L.outlier_activations(outliers=600), "outliers"),
    (lambda: L.outlier_activations(factor=float("nan")), "factor must be a number above 0"),
    (lambda: L.outlier_activations(factor=True), "factor must be a number above 0"),
    (lambda: L.recipe_table(np.ones((4, 100), np.float32)), "multiple of 128"),
    (lambda: L.recipe_table([[1.0] * 128]), "numpy array"),
    (lambda: L.recipe_table(np.full((2, 128), np.inf, np.float32)), "finite"),
    (lambda: L.recipe_table(np.ones((2, 128), np.float32), [200]), "outlier_columns must lie in 0 to 127"),
    (lambda: L.recipe_table(np.ones((2, 128), np.float32), 3), "outlier_columns must be column indices"),
    (lambda: plot_loss_curves({}), "curves must be a dict"),
    (lambda: plot_loss_curves({"a": [1.0, 0.0]}), "finite losses above 0"),
    (lambda: plot_loss_curves({"a": ["x"]}), "must be a sequence of numbers"),
])
def test_bad_input_gets_one_line(call, match):
    with pytest.raises((TypeError, ValueError), match=match) as e:
        call()
    assert "\n" not in str(e.value)


def test_the_loss_figure_draws_one_line_per_run_on_a_log_axis():
    fig = plot_loss_curves({"fp32": [1.0, 0.5], "rowwise": [1.0, 0.6, 0.4]})
    assert [t.name for t in fig.data] == ["fp32", "rowwise"] and list(fig.data[1].y) == [1.0, 0.6, 0.4]
    assert fig.layout.yaxis.type == "log"


@pytest.mark.parametrize("name", ["why_fp8_no_scaler", "why_fp8_filter", "why_fp8_finer_blocks"])
def test_each_question_grades_its_right_letter_only(name):
    check = getattr(L, "check_" + name)
    choice = getattr(L, name.upper())
    assert check(choice.right).status == "right"
    assert all(check(letter).status == "wrong" for letter in choice.options if letter != choice.right)


@settings(max_examples=40, deadline=None)
@given(rows=st.one_of(st.integers(-1, 6), st.floats(allow_nan=True), st.text(max_size=2)),
       cols=st.sampled_from([128, 256, 100, 0]),
       outliers=st.one_of(st.integers(-1, 3), st.none()),
       factor=st.one_of(st.floats(allow_nan=True), st.floats(-10, 1e7), st.integers(-3, 3), st.text(max_size=2)))
def test_arbitrary_settings_give_a_table_or_a_one_line_error(rows, cols, outliers, factor):
    try:
        x, columns = L.outlier_activations(rows, cols, outliers, factor)
        table = L.recipe_table(x, columns)
    except (TypeError, ValueError) as e:
        assert "\n" not in str(e)
        return
    assert len(table.rows) == len(L.RECIPE_ROWS)
    assert all(cell.endswith("%") and math.isfinite(float(cell[:-1])) for cell in table.column("RMS error"))
