"""ScalerLab, Fp8ScalingLab and BlockExplorer lay their controls in a column beside the figure, so
that a learner moving a control sees the figure change on a 1400 × 900 screen (stacked, their
controls and readouts pushed the figure's foot below it). The browser holds the sizes
(tests/browser/test_voila.py); here, where each widget sits."""

import pytest

from ampviz.widgets import BlockExplorer, Fp8ScalingLab, ScalerLab
from ampviz.widgets.base import FIGURE_MIN_WIDTH
from layout_checks import contains  # tests/widgets/, on the path as pytest runs

EXPLORERS = {
    "ScalerLab": (lambda: ScalerLab(steps=2000, overlay=("DeepSpeed ZeRO", "Megatron")),
                  ("init_slider", "growth_slider", "backoff_slider", "interval_input", "scenario_dropdown",
                   "strength_slider", "loss_dropdown", "overlay", "overlay_hint")),
    "Fp8ScalingLab": (lambda: Fp8ScalingLab(history_len=16),
                      ("recipe_buttons", "history_slider", "history_input", "algo_dropdown", "margin_slider",
                       "fmt_dropdown", "spike_slider", "nonfinite_dropdown", "seed_input")),
    "BlockExplorer": (lambda: BlockExplorer("nvfp4", hadamard=True),
                      ("scheme_dropdown", "block_dropdown", "rounding_dropdown", "tensor_scale_checkbox",
                       "data_dropdown", "outlier_slider", "seed_input", "hadamard_checkbox")),
}


@pytest.mark.parametrize("name", list(EXPLORERS))
def test_controls_in_a_column_beside_the_figure(name):
    make, controls = EXPLORERS[name]
    ex = make()
    column, side = ex.ui.children
    assert "ampviz-controls" in column._dom_classes and "ampviz-figure-side" in side._dom_classes
    # every control, the message line and the readout in the column; the figure alone beside it
    for attr in (*controls, "message", "readout"):
        widget = getattr(ex, attr)
        assert contains(column, widget) and not contains(side, widget), attr
    assert side.children == (ex.view,) and not contains(column, ex.view)
    # side by side where the page holds both, the figure under the controls where it does not
    assert ex.ui.layout.flex_flow == "row wrap"
    width = type(ex).CONTROLS_WIDTH
    assert column.layout.width == f"{width}px" and column.layout.flex == f"0 0 {width}px"
    assert side.layout.flex == f"1 1 {FIGURE_MIN_WIDTH}px" and side.layout.min_width == "0"
    # a 1400-pixel screen holds both: JupyterLab with its file browser open gives a notebook's
    # output 968 pixels (measured in Chromium), Voila's app page 1334
    assert width + 16 + FIGURE_MIN_WIDTH <= 968
    # the figure is shorter than a 900-pixel screen with the tabs above it
    assert ex.figure.layout.height <= 720


def test_a_readout_in_the_column_is_spaced_as_text():
    """The readouts beside the figure have their lines spaced as text, not at the controls' 28 px."""
    for name, (make, _) in EXPLORERS.items():
        ex = make()
        assert ex.readout.value.startswith('<div class="ampviz-column-text" style="line-height:1.35">'), name
