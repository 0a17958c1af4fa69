"""The explorer app (``ExplorerApp``, notebooks/explorer.ipynb): every explorer on one page, a tab each."""

import numpy as np
import pytest

from ampviz.widgets import ExplorerApp, FormatExplorer, LiveTrainer, RangeExplorer, ScalerLab


@pytest.fixture(scope="module")
def gradients():
    return np.exp2(-np.abs(np.random.default_rng(3).normal(0.0, 8.0, 5_000))).astype(np.float32)


@pytest.fixture(scope="module")
def small_app(gradients):
    return ExplorerApp(gradients=gradients, steps=20_000, live=False)


def test_tabs_hold_the_explorers_in_order(small_app):
    app = small_app
    assert [type(e) for e in app.explorers] == [FormatExplorer, RangeExplorer, ScalerLab]
    assert app.tabs.titles == ("Formats", "Ranges", "Loss scaling")
    assert list(app.tabs.children) == [e.ui for e in app.explorers]
    assert "ampviz-explorer-app" in app.ui._dom_classes and "ampviz-explorer-tabs" in app.tabs._dom_classes
    assert app.training is None


def test_the_explorers_share_the_gradients(small_app, gradients):
    app = small_app
    assert app.ranges.result.total == gradients.size
    assert app.scaling.steps == 20_000
    # the lost share is measured on the app's gradients, not ScalerLab's own sample
    shape = np.abs(gradients) / np.abs(gradients).max()
    assert np.array_equal(app.scaling._grad_shape, shape)


def test_selecting_a_tab_draws_its_figure_again(gradients, monkeypatch):
    app = ExplorerApp(gradients=gradients, steps=5_000, live=False)
    drawn = []
    for e in app.explorers:
        monkeypatch.setattr(e, "_draw", lambda fig, e=e: drawn.append((e, fig)))
    app.tabs.selected_index = 2
    assert drawn == [(app.scaling, app.scaling.figure)]
    app.tabs.selected_index = 1
    assert drawn[-1] == (app.ranges, app.ranges.figure)


def test_a_failing_redraw_is_shown_not_raised(gradients, monkeypatch):
    app = ExplorerApp(gradients=gradients, steps=5_000, live=False)

    def broken(fig):
        raise RuntimeError("no room")

    monkeypatch.setattr(app.scaling, "_draw", broken)
    app.tabs.selected_index = 2  # must not raise
    assert app.scaling.error == "internal error (RuntimeError): no room"
    assert "no room" in app.scaling.message.value


def test_the_default_app_uses_the_course_model_and_a_million_steps():
    from ampviz.beam import gradients

    app = ExplorerApp()
    try:
        assert app.tabs.titles == ("Formats", "Ranges", "Loss scaling", "Live training")
        assert isinstance(app.training, LiveTrainer) and not app.training.running
        assert app.training.model_dropdown.value == "beam" and app.training.lr_input.value == 1e-3
        import torch

        assert torch.get_num_threads() == 1
        assert np.array_equal(app.gradients, gradients(0).all)  # notebook 02's
        assert app.ranges.scale_slider.max == 36  # past their largest safe scale, 2^33
        assert app.scaling.steps == 1_000_000 and len(app.scaling.traces[0].scale) == 1_000_000
        assert [t.policy.name for t in app.scaling.traces] == ["your settings"]
        app.tabs.selected_index = 3  # the live tab: nothing redrawn, nothing started
        assert app.training.error is None and not app.training.running
    finally:
        app.training.stop()
