"""The explorer app (``ExplorerApp``, notebooks/explorer.ipynb): every explorer on one page, a tab each.

The Formats tab is built before the constructor returns; the other tabs in a background thread
that starts when a front end shows the app (here, as a front end would, by counting a view), a
tab is selected, ``wait_ready()`` is called, or ``BUILD_AFTER`` seconds have passed. Tests that
look at a tab before it is ready hold the thread at a gate (``_Gate``) instead of racing it."""

import subprocess
import sys
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ampviz.widgets.app as app_module
from ampviz import scaling
from ampviz.widgets import (BlockExplorer, ExplorerApp, FormatExplorer, Fp8ScalingLab, LiveTrainer, RangeExplorer,
                            ScalerLab)

ANYTHING = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
    st.lists(st.one_of(st.text(max_size=12), st.integers()), max_size=3), st.just(object()), st.just(np.float32(2.0)),
    st.just(np.arange(3)), st.sampled_from(["fairseq", ("jmp", "Keras 3"), ["torch"], "static 1024", 5.0, 10**8]),
)


@pytest.fixture(scope="module")
def gradients():
    return np.exp2(-np.abs(np.random.default_rng(3).normal(0.0, 8.0, 5_000))).astype(np.float32)


@pytest.fixture(scope="module")
def small_app(gradients):
    return ExplorerApp(gradients=gradients, steps=20_000, live=False).wait_ready(timeout=120)


def tab_content(app, index):
    """What tab ``index`` shows: its explorer's ui, or the tab's own "Preparing" / error line."""
    child = app.tabs.children[index]
    return child if index == 0 else child.children[0]


class _Gate:
    """Stands in for an explorer class (or a function) in ampviz.widgets.app: each call waits
    until the test opens the gate, then calls the real one."""

    def __init__(self, real):
        self.real, self.open, self.entered = real, threading.Event(), threading.Event()

    def __call__(self, *args, **kwargs):
        self.entered.set()
        assert self.open.wait(60), "the test never opened the gate"
        return self.real(*args, **kwargs)


def test_tabs_hold_the_explorers_in_order(small_app):
    app = small_app
    assert [type(e) for e in app.explorers] == [FormatExplorer, RangeExplorer, ScalerLab, Fp8ScalingLab, BlockExplorer]
    assert app.tabs.titles == ("Formats", "Ranges", "Loss scaling", "FP8 scaling", "Block scaling")
    assert [tab_content(app, i) for i in range(5)] == [e.ui for e in app.explorers]
    assert (app.fp8.history_slider.value, app.fp8.recipe_buttons.value) == (16, "delayed")
    assert app.blocks.scheme_dropdown.value == "fp4_e2m1"
    assert "ampviz-explorer-app" in app.ui._dom_classes and "ampviz-explorer-tabs" in app.tabs._dom_classes
    assert app.training is None and app.ready and app.errors == {}


def test_the_explorers_share_the_gradients(small_app, gradients):
    app = small_app
    assert np.array_equal(app.gradients, gradients)
    assert app.ranges.result.total == gradients.size
    assert app.scaling.steps == 20_000
    # the lost share is measured on the app's gradients, not ScalerLab's own sample
    shape = np.abs(gradients) / np.abs(gradients).max()
    assert np.array_equal(app.scaling._grad_shape, shape)


def test_the_first_tab_is_ready_before_the_others(gradients, monkeypatch):
    monkeypatch.setattr(ExplorerApp, "BUILD_AFTER", 3600.0)
    gate = _Gate(app_module.RangeExplorer)
    monkeypatch.setattr(app_module, "RangeExplorer", gate)
    app = ExplorerApp(gradients=gradients, steps=5_000, live=False)
    try:
        # the constructor returned with Formats built; nothing else starts before the app is shown
        assert isinstance(app.formats, FormatExplorer) and app.formats.figure is not None
        assert tab_content(app, 0) is app.formats.ui
        assert not gate.entered.is_set()
        app.ui._view_count = 1  # what the front end reports once it shows the app
        assert gate.entered.wait(30)
        # Ranges is held at the gate, Loss scaling waits behind it
        assert app.ranges is None and app.scaling is None and app.explorers == [app.formats]
        assert not app.ready
        for index, title in ((1, "Ranges"), (2, "Loss scaling")):
            line = tab_content(app, index)
            assert "ampviz-tab-status" in line._dom_classes and f"Preparing the {title} tab" in line.value
        with pytest.raises(TimeoutError, match="not all built within 0.05 s"):
            app.wait_ready(timeout=0.05)
    finally:
        gate.open.set()
    app.wait_ready(timeout=120)
    assert [tab_content(app, i) for i in range(5)] == [app.formats.ui, app.ranges.ui, app.scaling.ui, app.fp8.ui,
                                                      app.blocks.ui]
    assert app.ready and app.errors == {}


def test_a_tab_selected_before_it_is_ready_shows_its_explorer_when_ready(gradients, monkeypatch):
    monkeypatch.setattr(ExplorerApp, "BUILD_AFTER", 3600.0)
    gate = _Gate(app_module.ScalerLab)
    monkeypatch.setattr(app_module, "ScalerLab", gate)
    app = ExplorerApp(gradients=gradients, steps=5_000, live=False)
    app.tabs.selected_index = 2  # the learner opens Loss scaling before anything else is built
    assert gate.entered.wait(30)  # the selection started the build; the lab is held at the gate
    placeholder = app.tabs.children[2]
    assert "Preparing the Loss scaling tab" in tab_content(app, 2).value
    gate.open.set()
    app.wait_ready(timeout=120)
    # the same tab, still selected, now holds the lab: the view the browser shows updates in place
    assert app.tabs.selected_index == 2 and app.tabs.children[2] is placeholder
    assert tab_content(app, 2) is app.scaling.ui and app.scaling.figure is not None


def test_the_tabs_are_built_even_if_no_front_end_reports_a_view(gradients, monkeypatch):
    monkeypatch.setattr(ExplorerApp, "BUILD_AFTER", 0.05)
    gate = _Gate(app_module.RangeExplorer)
    monkeypatch.setattr(app_module, "RangeExplorer", gate)
    app = ExplorerApp(gradients=gradients, steps=5_000, live=False)
    assert gate.entered.wait(30)  # no view, no selection, no wait: BUILD_AFTER started it
    gate.open.set()
    assert app.wait_ready(timeout=120).ready


def test_a_tab_that_cannot_be_built_says_why_in_one_line(gradients, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no room\nfor a million steps")

    monkeypatch.setattr(app_module, "ScalerLab", broken)
    app = ExplorerApp(gradients=gradients, steps=5_000, live=False)
    with pytest.raises(RuntimeError, match=r"^the Loss scaling tab could not be prepared: internal error "
                                           r"\(RuntimeError\): no room for a million steps$"):
        app.wait_ready(timeout=120)
    assert app.errors == {"Loss scaling": "internal error (RuntimeError): no room for a million steps"}
    line = tab_content(app, 2).value
    assert "⚠ The Loss scaling tab could not be prepared: internal error (RuntimeError): no room for a " \
           "million steps" in line and "\n" not in line
    # the other tabs are built as usual
    assert isinstance(app.ranges, RangeExplorer) and tab_content(app, 1) is app.ranges.ui
    assert app.scaling is None and not app.ready


def test_failing_gradients_are_shown_in_every_tab_that_needs_them(monkeypatch):
    def no_model(seed):
        raise ValueError("the course model could not be loaded")

    monkeypatch.setattr(app_module, "_course_gradients", no_model)
    app = ExplorerApp(steps=5_000, live=False)
    with pytest.raises(RuntimeError) as info:
        app.wait_ready(timeout=120)
    assert str(info.value) == ("the Ranges tab could not be prepared: the course model could not be loaded; "
                               "the Loss scaling tab could not be prepared: the course model could not be loaded")
    for index in (1, 2):
        assert "could not be prepared: the course model could not be loaded" in tab_content(app, index).value
    assert app.gradients is None and app.ranges is None and app.scaling is None
    assert tab_content(app, 0) is app.formats.ui  # the first tab does not need them


@pytest.mark.parametrize("kwargs, error, words", [
    ({"steps": 0}, ValueError, "steps must be between 1 and 100,000,000, got 0"),
    ({"steps": "many"}, TypeError, "steps must be a whole number"),
    ({"seed": -1}, ValueError, "seed must be between 0 and 4,294,967,295, got -1"),
    ({"seed": 2**32}, ValueError, "seed must be between 0 and 4,294,967,295, got 4,294,967,296"),
    ({"live": "yes"}, TypeError, "live must be True"),
    ({"overlay": ["nonsense"]}, ValueError, "cannot compare with 'nonsense'; choose from"),
    ({"overlay": ["torch"]}, ValueError, "cannot compare with 'torch'"),
    ({"overlay": 3}, TypeError, "overlay must be a list of scaler names"),
])
def test_bad_settings_are_refused_at_once(kwargs, error, words):
    with pytest.raises(error, match="^" + words):
        ExplorerApp(gradients=np.ones(10, np.float32), **{"live": False, **kwargs})


def _whole_in(value, lo, hi=None) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return False
    return float(value).is_integer() and lo <= value and (hi is None or value <= hi)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["steps", "seed", "live", "overlay"]), value=ANYTHING)
def test_any_setting_is_taken_or_refused_in_one_line(name, value, monkeypatch):
    monkeypatch.setattr(ExplorerApp, "BUILD_AFTER", 3600.0)  # nothing is built in the background here
    if name == "overlay":
        names = (value,) if isinstance(value, str) else value
        valid = isinstance(names, (list, tuple)) and all(
            isinstance(n, str) and n in scaling.PRESETS and n != "torch" for n in names)
    else:
        valid = {"steps": _whole_in(value, 1, 10**8), "seed": _whole_in(value, 0, 2**32 - 1),
                 "live": isinstance(value, bool)}[name]
    try:
        app = ExplorerApp(gradients=np.ones(10, np.float32), **{"live": False, name: value})
    except (TypeError, ValueError) as e:
        assert str(e).strip() and "\n" not in str(e), repr(str(e))
        assert not valid, f"{name}={value!r} refused: {e}"
        return
    assert valid, f"{name}={value!r} taken"
    if name in ("steps", "seed"):
        assert getattr(app, name) == int(value)
    elif name == "live":
        assert app.live is value and len(app.tabs.titles) == (6 if value else 5)
    else:
        assert app._overlay == tuple(names)


@settings(max_examples=60, deadline=None)
@given(timeout=ANYTHING)
def test_wait_ready_takes_any_timeout_or_refuses_it_in_one_line(small_app, timeout):
    try:
        assert small_app.wait_ready(timeout=timeout) is small_app  # built: it returns at once
    except (TypeError, ValueError) as e:
        assert str(e).strip() and "\n" not in str(e), repr(str(e))
        assert not (timeout is None or isinstance(timeout, (int, float, np.floating)) and not isinstance(timeout, bool)
                    and timeout >= 0), f"timeout={timeout!r} refused: {e}"


def test_wait_ready_refuses_a_bad_timeout(small_app):
    with pytest.raises(TypeError, match="^timeout must be a number, got 'soon'$"):
        small_app.wait_ready(timeout="soon")
    with pytest.raises(ValueError, match="^timeout must be a number of seconds, at least 0"):
        small_app.wait_ready(timeout=-1)
    with pytest.raises(ValueError, match="^timeout must be a number of seconds, at least 0"):
        small_app.wait_ready(timeout=float("nan"))
    assert small_app.wait_ready(timeout=0) is small_app  # built: no wait needed


def test_the_app_without_live_training_never_imports_torch():
    code = ("import sys, numpy as np\n"
            "from ampviz.widgets import ExplorerApp\n"
            "app = ExplorerApp(gradients=np.exp2(-np.arange(40.0)), steps=1_000, live=False).wait_ready(120)\n"
            "assert app.ready and len(app.explorers) == 5\n"
            "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_the_default_app_uses_the_course_model_and_a_million_steps():
    from ampviz.training.beam import gradients

    app = ExplorerApp().wait_ready(timeout=300)
    try:
        assert app.tabs.titles == ("Formats", "Ranges", "Loss scaling", "FP8 scaling", "Block scaling",
                                   "Live training")
        assert [type(e) for e in app.explorers] == [FormatExplorer, RangeExplorer, ScalerLab, Fp8ScalingLab,
                                                    BlockExplorer, LiveTrainer]
        assert tab_content(app, 5) is app.training.ui
        assert isinstance(app.training, LiveTrainer) and not app.training.running
        assert app.training.model_dropdown.value == "beam" and app.training.lr_input.value == 1e-3
        import threading

        import torch

        # torch.set_num_threads, called in the app's builder thread, reaches every thread that
        # runs its first torch op afterwards (the live trainer's, a fresh one here); a thread
        # that ran torch before keeps its own count (this one, in a long test session)
        seen = []
        fresh = threading.Thread(target=lambda: seen.append((torch.get_num_threads(), gradients(0).all)))
        fresh.start()
        fresh.join()
        assert seen[0][0] == 1
        assert np.array_equal(app.gradients, seen[0][1])  # notebook 02's, to the bit, on one thread
        assert app.ranges.scale_slider.max == 36  # past their largest safe scale, 2^33
        assert app.scaling.steps == 1_000_000 and len(app.scaling.traces[0].scale) == 1_000_000
        assert [t.policy.name for t in app.scaling.traces] == ["your settings"]
        app.tabs.selected_index = 3  # the live tab: nothing started
        assert app.training.error is None and not app.training.running
    finally:
        app.training.stop()


# ----- no upload to Plotly Cloud from any figure -----
def figure_views(widget) -> list:
    """Every FigureView in a widget's tree."""
    from ampviz.widgets.figureview import FigureView

    if isinstance(widget, FigureView):
        return [widget]
    return [v for child in getattr(widget, "children", ()) for v in figure_views(child)]


def test_no_figure_view_offers_a_cloud_link(small_app):
    """plotly.js 3 shows a "Share chart → upload to Plotly Cloud" button unless its config says
    not to; every explorer's view (and the app's, in Voila) says so."""
    from ampviz.widgets import RanksLab
    from ampviz.widgets.figureview import FigureView

    def no_cloud(config):
        assert config["showSendToCloud"] is False and "showLink" not in config  # plotly.js 3 has no showLink
        assert {"sendDataToCloud", "sendChartToCloud"} <= set(config["modeBarButtonsToRemove"])
        assert config["displaylogo"] is False

    explorers = [*small_app.explorers, RanksLab(steps=30),
                 LiveTrainer(modes=("fp32",), steps=2, census_every=0)]
    assert {type(e).__name__ for e in explorers} >= {"FormatExplorer", "RangeExplorer", "ScalerLab", "Fp8ScalingLab",
                                                      "BlockExplorer", "RanksLab", "LiveTrainer"}
    views = figure_views(small_app.ui)
    for explorer in explorers:
        mine = figure_views(explorer.ui)
        assert mine, type(explorer).__name__
        views += mine
    for view in views:
        no_cloud(view.config)
    no_cloud(FigureView().config)
    assert FigureView(config={"showSendToCloud": True}).config["showSendToCloud"] is True  # unless asked
