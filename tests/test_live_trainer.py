"""LiveTrainer and plot_live, headless: a background training thread, live scaler settings, stop,
pause, one training at a time, errors in the message line; the live figure from records."""

import math
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import ampviz.widgets as widgets
from ampviz import live as L
from ampviz.plots import live_traces, lost_shares, plot_live
from ampviz.widgets import LiveTrainer, running_trainers

LONG = 10**6  # steps of a run that a test stops itself


def trainer_threads():
    return [t for t in threading.enumerate() if t.name == "ampviz-live-trainer" and t.is_alive()]


def wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


def traces(fig, kind, mode=None):
    return [t for t in fig.data if t.meta["kind"] == kind and (mode is None or t.meta["mode"] == mode)]


@pytest.fixture(autouse=True)
def no_training_left_behind():
    yield
    for t in running_trainers():
        t.stop(wait=True)
    assert not trainer_threads()


# ----- plot_live -----
def test_plot_live_of_empty_runs_has_every_trace_and_no_data():
    fig = plot_live({"fp32": [], "fp16+scaler": []}, steps=40)
    kinds = [(t.meta["mode"], t.meta["kind"]) for t in fig.data]
    assert kinds == [("fp32", "loss"), ("fp16+scaler", "loss"), ("fp16+scaler", "scale"),
                     ("fp16+scaler", "skipped"), ("fp16+scaler", "heat")]
    assert all(len(t.x) == 0 for t in fig.data)
    assert np.asarray(fig.data[-1].z).size == 0
    assert list(fig.layout.xaxis.range) == [0, 39]
    notes = {a.name: a.text for a in fig.layout.annotations}
    assert "fp16+scaler" in notes["heat-title"] and "zero or underflows in fp16" in notes["heat-title"]


def test_plot_live_without_a_scaler_says_so_and_keeps_the_heat_map():
    fig = plot_live({"fp32": [], "bf16": []})
    assert [t.meta["kind"] for t in fig.data] == ["loss", "loss", "heat"]
    assert fig.data[-1].meta["mode"] == "bf16"
    notes = {a.name: a.text for a in fig.layout.annotations}
    assert "no mode with a scaler" in notes["scale-title"]
    assert plot_live({}).data[-1].meta["mode"] is None


def test_plot_live_draws_the_records():
    run = L.run_training(L.TrainConfig(mode="fp16+scaler", steps=30, census_every=7, init_scale=2.0**28))
    recs = run.records
    assert any(r.skipped for r in recs)  # 2^28 overflows at first: the scaler backs off
    fig = plot_live({"fp16+scaler": run})
    (loss,) = traces(fig, "loss")
    np.testing.assert_array_equal(loss.x, [r.step for r in recs])
    np.testing.assert_array_equal(loss.y, [r.loss for r in recs])
    (scale,) = traces(fig, "scale")
    np.testing.assert_array_equal(scale.y, [math.log2(r.scale) for r in recs])
    (skipped,) = traces(fig, "skipped")
    assert list(skipped.x) == [r.step for r in recs if r.skipped]
    (heat,) = traces(fig, "heat")
    cens = [r for r in recs if r.param_census]
    assert list(heat.x) == [0, 7, 14, 21, 28] == [r.step for r in cens]
    assert list(heat.y) == list(cens[0].param_census)
    expected = np.array([[lost_shares(r.param_census)[n] for r in cens] for n in heat.y])
    np.testing.assert_array_equal(np.asarray(heat.z), expected)
    c = cens[-1].param_census["fc1.weight"]
    assert heat.z[0][-1] == (c.counts["zero"] + c.counts["underflow"]) / c.total


def test_live_traces_skip_error_records_and_keep_the_order():
    recs = [L.StepRecord(step=0, loss=2.0), L.StepRecord(step=1, error="FloatingPointError: nan")]
    data = live_traces({"fp32": recs, "fp16+scaler": []})
    assert [d["meta"]["kind"] for d in data] == ["loss", "loss", "scale", "skipped", "heat"]
    assert list(data[0]["y"]) == [2.0]
    with pytest.raises(ValueError, match="heat_mode"):
        live_traces({"fp32": recs}, heat_mode="bf16")


# ----- LiveTrainer -----
def test_import_of_widgets_does_not_import_torch():
    code = "import ampviz.widgets, sys; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_controls_have_stable_css_classes():
    lt = LiveTrainer(modes=("fp32",), steps=5)
    classes = {c for w in (lt.ui, lt.start_button, lt.pause_button, lt.stop_button, lt.progress,
                           lt.interval_slider, lt.growth_slider, lt.backoff_slider, lt.figure_box,
                           lt.device_line, lt.model_dropdown, lt.lr_input, lt.steps_input,
                           lt.mode_checks["fp16+scaler"]) for c in w._dom_classes}
    for name in ("trainer", "start", "pause", "stop", "progress", "interval", "growth", "backoff",
                 "figure", "device", "model", "lr", "steps", "mode-fp16-scaler"):
        assert f"ampviz-live-{name}" in classes
    assert lt.device_line.value.startswith("device: cpu")
    assert lt.pause_button.disabled and lt.stop_button.disabled and not lt.start_button.disabled


def test_a_short_run_fills_the_records_and_the_figure():
    lt = LiveTrainer(modes=("fp32", "fp16+scaler"), model="mlp", steps=40, census_every=10)
    fig0 = lt.figure
    lt.start_button.click()
    assert lt.wait(30) and not lt.running and lt.error is None
    assert lt.figure is fig0  # the empty figure shown before the start is the one that fills
    assert set(lt.runs) == {"fp32", "fp16+scaler"}
    for mode, run in lt.runs.items():
        assert [r.step for r in run.records] == list(range(40))
        (loss,) = traces(lt.figure, "loss", mode)
        np.testing.assert_array_equal(loss.y, run["loss"])
    ref = L.run_training(L.TrainConfig(mode="fp16+scaler", steps=40, census_every=10))
    np.testing.assert_array_equal(lt.runs["fp16+scaler"]["loss"], ref["loss"])  # modes side by side = alone
    (heat,) = traces(lt.figure, "heat")
    assert heat.meta["mode"] == "fp16+scaler" and list(heat.x) == [0, 10, 20, 30]
    assert lt.progress.value == 80 and "80 / 80 steps" in lt.status.value and "done" in lt.status.value
    assert not trainer_threads() and not running_trainers()
    assert not lt.start_button.disabled and lt.stop_button.disabled


def test_scaler_sliders_act_on_the_running_training_and_stop_is_quick():
    lt = LiveTrainer(modes=("fp16+scaler",), steps=LONG, census_every=0)
    lt.start()
    run = lt.runs["fp16+scaler"]
    assert wait_for(lambda: len(run) > 5)
    assert run.records[-1].growth_interval == 2000
    t0 = time.monotonic()
    lt.interval_slider.value = 7
    lt.backoff_slider.value = 0.25
    assert wait_for(lambda: run.records[-1].growth_interval == 7, timeout=0.5), "setting not seen in 0.5 s"
    assert time.monotonic() - t0 < 0.5
    assert run.records[-1].backoff_factor == 0.25
    t0 = time.monotonic()
    lt.stop_button.click()
    lt.thread.join(0.5)
    assert not lt.thread.is_alive() and time.monotonic() - t0 < 0.5
    assert not lt.running and not trainer_threads()
    assert "stopped" in lt.status.value and len(run) < LONG


def test_only_one_training_at_a_time():
    a = LiveTrainer(modes=("fp32",), steps=LONG, census_every=0)
    a.start()
    first = a.thread
    a.start()  # starting twice restarts
    assert not first.is_alive() and len(trainer_threads()) == 1 and running_trainers() == [a]
    b = LiveTrainer(modes=("fp32",), steps=LONG, census_every=0)  # the cell run again
    assert not a.running and not trainer_threads()
    a.start()
    b.start()
    assert not a.running and b.running and len(trainer_threads()) == 1 and running_trainers() == [b]
    b.stop()
    assert not trainer_threads() and running_trainers() == []


def test_pause_holds_between_steps_and_resume_goes_on():
    lt = LiveTrainer(modes=("fp32", "fp16"), steps=LONG, census_every=0)
    lt.start()
    assert wait_for(lambda: len(lt.runs["fp16"]) > 3)
    lt.pause_button.click()
    assert wait_for(lambda: lt._held.is_set())
    assert lt.paused and lt.pause_button.description == "Resume"
    counts = {m: len(r) for m, r in lt.runs.items()}
    time.sleep(0.3)
    assert {m: len(r) for m, r in lt.runs.items()} == counts
    assert counts["fp32"] == counts["fp16"]  # held between whole rounds
    assert wait_for(lambda: "paused" in lt.status.value)
    lt.pause_button.click()
    assert not lt.paused and lt.pause_button.description == "Pause"
    assert wait_for(lambda: len(lt.runs["fp32"]) > counts["fp32"] + 3)
    lt.pause()
    lt.stop()  # stop also ends a paused run
    assert not lt.running and not trainer_threads()


def test_a_failing_mode_shows_its_error_and_the_others_go_on():
    lt = LiveTrainer(modes=("fp32", "fp16+scaler"), lr=1e30, steps=20, census_every=0)
    lt.start()
    assert lt.wait(30)
    assert lt.error.startswith("fp32: FloatingPointError: the loss is nan")
    assert "FloatingPointError" in lt.message.value and "fp32" in lt.message.value
    assert lt.runs["fp32"].error is not None and len(lt.runs["fp16+scaler"]) == 20
    assert "failed" in lt.status.value


def test_an_internal_error_in_the_thread_is_shown(monkeypatch):
    lt = LiveTrainer(modes=("fp32",), steps=LONG, census_every=0)

    def broken(self, rec):
        raise RuntimeError("disk full")

    monkeypatch.setattr(L.Run, "append", broken)
    lt.start()
    assert lt.wait(5) and not lt.running
    assert lt.error == "internal error (RuntimeError): disk full"
    assert "disk full" in lt.message.value


def test_a_drawing_error_never_ends_the_run(monkeypatch):
    monkeypatch.setattr(widgets, "live_traces", lambda *a, **k: 1 / 0)
    lt = LiveTrainer(modes=("fp32",), steps=30, census_every=0)
    lt.start()
    assert lt.wait(10) and len(lt.runs["fp32"]) == 30
    assert "ZeroDivisionError" in lt.message.value


def test_bad_controls_show_a_message_and_start_nothing():
    lt = LiveTrainer(modes=("fp32",), steps=10)
    lt.mode_checks["fp32"].value = False
    lt.start_button.click()
    assert "select at least one mode" in lt.error and not lt.running and lt.thread is None
    lt.mode_checks["fp32"].value = True
    lt.lr_input.value = -1.0
    lt.start_button.click()
    assert "learning rate" in lt.error and lt.thread is None
    with pytest.raises(ValueError, match="unknown mode"):
        LiveTrainer(modes=("fp64",))


def test_redraws_are_throttled():
    lt = LiveTrainer(modes=("fp32",), steps=LONG, census_every=0, redraw_interval=0.1)
    draws = []
    original = lt._draw_live
    lt._draw_live = lambda: (draws.append(time.perf_counter()), original())
    lt.start()
    time.sleep(0.55)
    lt.stop()
    gaps = np.diff(draws[:-1])  # the last draw is the final one, after the stop
    assert 3 <= len(draws) <= 8 and (gaps >= 0.1).all()
    (loss,) = traces(lt.figure, "loss")
    assert len(loss.y) == len(lt.runs["fp32"])  # the final draw shows every record
