"""LiveTrainer and plot_live, headless: a background training thread, live scaler settings, stop,
pause, one training at a time, errors in the message line; the live figure from records."""

import math
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import ampviz.widgets as widgets
from ampviz.training import live as L
from ampviz.plots import live_traces, lost_shares, plot_live
from ampviz.widgets.figureview import FigureView
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
    """The traces of ``kind`` (and ``mode``) of a go.Figure or a FigureView (whose traces are dicts)."""
    meta = (lambda t: t["meta"]) if isinstance(fig, FigureView) else (lambda t: t.meta)
    return [t for t in fig.data if meta(t)["kind"] == kind and (mode is None or meta(t)["mode"] == mode)]


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


def test_heat_mode_error_stays_on_one_line_whatever_the_run_names():
    from ampviz.plots import heat_mode_of
    with pytest.raises(ValueError) as err:
        heat_mode_of(["\n", "fp16\nx"], heat_mode="bf16\n")
    message = str(err.value)
    assert "\n" not in message and "'fp16\\nx'" in message and "'bf16\\n'" in message
    assert heat_mode_of(["\n", "fp16"], heat_mode="\n") == "\n"


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
        np.testing.assert_array_equal(loss["y"], run["loss"])
    ref = L.run_training(L.TrainConfig(mode="fp16+scaler", steps=40, census_every=10))
    np.testing.assert_array_equal(lt.runs["fp16+scaler"]["loss"], ref["loss"])  # modes side by side = alone
    (heat,) = traces(lt.figure, "heat")
    assert heat["meta"]["mode"] == "fp16+scaler" and list(heat["x"]) == [0, 10, 20, 30]
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
    assert re.fullmatch(r"fp32 diverged at step \d+: the loss is nan \(training diverged: try a "
                        r"smaller learning rate\)", lt.error)
    assert "fp32 diverged" in lt.message.value
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
    monkeypatch.setattr(widgets.live_trainer, "live_traces", lambda *a, **k: 1 / 0)
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
    deadline = time.perf_counter() + 60  # a loaded machine may take seconds to the first step
    while len(draws) < 4 and time.perf_counter() < deadline:
        time.sleep(0.02)
    lt.stop()
    gaps = np.diff(draws[:-1])  # the last draw is the final one, after the stop
    # the trainer times its own clock readings, the test its calls: allow a few ms between them
    assert len(draws) >= 4 and (gaps >= 0.09).all()
    assert len(lt.runs["fp32"]) > len(draws)  # steps between draws: not one redraw per step
    (loss,) = traces(lt.figure, "loss")
    assert len(loss["y"]) == len(lt.runs["fp32"])  # the final draw shows every record


# ----- long runs, slow steps, collapsed scales, bad settings -----
def test_one_run_at_a_time_whatever_the_step_time(monkeypatch):
    """Stop + Start (and a new trainer, as when the cell is run again) while a step takes longer
    than Start waits for it: the new run waits for the old thread, never trains beside it, and
    the old run never writes into the new one."""
    active, peak, lock = [0], [0], threading.Lock()
    real = L._one_step

    def slow_step(*args, **kwargs):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        try:
            time.sleep(1.3)  # longer than start() waits for a stopping run (1 s)
            return real(*args, **kwargs)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(L, "_one_step", slow_step)
    lt = LiveTrainer(modes=("fp32",), steps=2, census_every=0, redraw_interval=0)
    statuses = []
    lt.status.observe(lambda change: statuses.append(change["new"]), names="value")
    lt.start()
    old_run = lt.runs["fp32"]
    assert wait_for(lambda: active[0] == 1)
    assert lt.stop(wait=True, timeout=0.05) is False  # still inside its step
    lt.start()
    assert lt.running and len(trainer_threads()) == 2  # the new thread waits for the old one
    assert lt.wait(30)
    assert peak[0] == 1
    assert [r.step for r in lt.runs["fp32"].records] == [0, 1] and lt.runs["fp32"] is not old_run
    assert len(old_run) <= 1
    assert any("waiting for the previous run to end" in s for s in statuses)
    assert "2 / 2 steps" in lt.status.value and "done" in lt.status.value
    assert not lt.start_button.disabled

    lt.start()  # the same again through a new trainer: the cell run again mid-step
    assert wait_for(lambda: active[0] == 1)
    b = LiveTrainer(modes=("fp32",), steps=1, census_every=0, redraw_interval=0)
    b.start()
    assert b.wait(30) and lt.wait(30)
    assert peak[0] == 1 and [r.step for r in b.runs["fp32"].records] == [0]
    assert not trainer_threads() and running_trainers() == []


def test_a_collapsed_scale_trains_to_the_end_and_is_drawn():
    lt = LiveTrainer(modes=("fp16+scaler",), steps=30, census_every=10, init_scale=0)
    lt.start()
    assert lt.wait(60) and lt.error is None
    run = lt.runs["fp16+scaler"]
    assert len(run) == 30 and (run["scale"] == 0).all()
    (scale,) = traces(lt.figure, "scale")
    assert len(scale["y"]) == 30 and np.isfinite(scale["y"]).all()  # drawn at the axis floor, not dropped
    assert "30 / 30 steps" in lt.status.value and "done" in lt.status.value


def test_failures_are_sentences_and_the_status_follows_the_last_action():
    lt = LiveTrainer(modes=("half", "fp32"), steps=5, census_every=0, lr=1e5)
    lt.start()
    assert lt.wait(30)
    assert lt.error.startswith("half stopped at step 0: the learning rate 100000 does not fit in fp16")
    assert "c10::Half" not in lt.error and "failed" in lt.status.value
    (loss,) = traces(lt.figure, "loss", "half")
    assert "stopped at step 0" in loss["name"]  # the figure says why the line is short
    lt.lr_input.value = -1.0
    lt.start_button.click()
    assert "learning rate" in lt.error and "failed" not in lt.status.value
    assert lt.status.value == "not started: see the message above"


def test_a_long_run_stays_bounded():
    lt = LiveTrainer(modes=("fp32", "fp16+scaler"), steps=400, census_every=10, max_records=64,
                     growth_interval=1, growth_factor=4.0, redraw_interval=0)
    lt.start()
    assert lt.wait(120) and lt.error is None
    for mode, run in lt.runs.items():
        assert len(run) <= 64 and run.steps_recorded == 400
        (loss,) = traces(lt.figure, "loss", mode)
        assert len(loss["y"]) == len(run)
    run = lt.runs["fp16+scaler"]
    assert run.skipped_recorded > 0
    (marks,) = traces(lt.figure, "skipped")
    assert marks["name"] == f"fp16+scaler: {run.skipped_recorded:,} skipped"  # every skip counted
    assert "800 / 800 steps" in lt.status.value


@pytest.mark.parametrize("kwargs, message", [
    ({"growth_factor": 1.0}, "growth_factor must be > 1.0"),
    ({"growth_factor": float("inf")}, "growth_factor must be a finite number"),
    ({"backoff_factor": 1.0}, "backoff_factor must be between 0 and 1"),
    ({"growth_interval": 0}, "growth_interval must be at least 1"),
    ({"growth_interval": 2.5}, "growth_interval must be a whole number"),
    ({"steps": 0}, "steps must be between 1 and 10,000,000"),
    ({"steps": "many"}, "steps must be a whole number"),
    ({"lr": -1}, "lr must be a positive number"),
    ({"init_scale": -1.0}, "init_scale must be a finite number >= 0"),
    ({"modes": ("fp64",)}, "unknown mode 'fp64'"),
    ({"modes": 3}, "modes must be a mode or a list of modes"),
    ({"model": "cnn"}, "unknown model 'cnn'"),
    ({"census_every": -1}, "census_every must be at least 0"),
])
def test_settings_the_trainer_cannot_use_are_one_line_errors(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=re.escape(message)) as e:
        LiveTrainer(**kwargs)
    assert "\n" not in str(e.value)


def test_settings_are_shown_as_given():
    lt = LiveTrainer(modes="fp32", growth_factor=10.0, backoff_factor=0.99, growth_interval=20_000)
    assert lt.modes == ["fp32"]
    assert lt.growth_slider.value == 10.0 and lt.growth_slider.max >= 10.0
    assert lt.backoff_slider.value == 0.99 and lt.interval_slider.value == 20_000
    assert lt.scaler_settings() == {"growth_factor": 10.0, "backoff_factor": 0.99, "growth_interval": 20_000}


# ----- what the learner reads: per mode, and the heat map's colours -----
def test_a_failed_mode_is_reported_per_mode_and_the_bar_ends_full():
    """Half fails at step 1 (the beam's Adam in fp16 weights) while the other modes finish: the
    status says so mode by mode, each in one short line, the count and the bar leave out the steps
    the failed mode will never train, and the message line keeps the whole sentence."""
    lt = LiveTrainer(modes=("fp32", "fp16+scaler", "half"), model="beam", steps=12, census_every=0,
                     redraw_interval=0)
    lt.start()
    assert lt.wait(60)
    half = lt.runs["half"]
    assert half.error is not None and half.error.startswith("half diverged at step 1:")
    assert lt.error == half.error and all(lt.runs[m].error is None for m in ("fp32", "fp16+scaler"))
    lines = [re.sub(r"<[^>]+>", "", html_line) for html_line in re.findall(r"<div[^>]*>.*?</div>", lt.status.value)]
    head, *per_mode = [line.replace("&#x27;", "'") for line in lines]
    trained = 12 + 12 + 1  # the failed step trains nothing
    assert re.fullmatch(rf"{trained} / {trained} steps · [\d,]+ steps/s · 2 finished, 1 failed \(36 planned\)", head)
    assert per_mode == ["fp32: 12 / 12 steps · finished", "fp16+scaler: 12 / 12 steps · finished",
                        "half: 1 / 12 steps · failed: diverged at step 1: the previous update made some weights "
                        "inf or NaN"]
    assert all(len(line) < 100 for line in per_mode)  # short: the message line has the advice
    assert lt.progress.value == lt.progress.max == trained and lt.progress.bar_style == "danger"
    assert "(in fp16 weights an optimizer's own small numbers" in lt.error


def test_a_run_that_finishes_says_done_per_mode():
    lt = LiveTrainer(modes=("fp32", "bf16"), model="beam", steps=5, census_every=0, redraw_interval=0)
    lt.start()
    assert lt.wait(60) and lt.error is None
    text = re.sub(r"<[^>]+>", "\n", lt.status.value)
    assert "10 / 10 steps" in text and "done" in text and "(" not in text.split("\n")[1]
    assert "fp32: 5 / 5 steps · finished" in text and "bf16: 5 / 5 steps · finished" in text
    assert lt.progress.value == lt.progress.max == 10 and lt.progress.bar_style == ""


def test_the_live_and_the_static_heat_maps_share_one_explicit_colour_scale():
    """The live figure's traces reach plotly.js as sent, where "Blues" runs dark to light, while
    plotly.py resolves the same name light to dark for the lesson's static figure: both use one
    scale spelled out, 0% lost at the light end."""
    from ampviz.plots import LOST_COLORSCALE

    def scale_of(trace):
        scale = trace["colorscale"] if isinstance(trace, dict) else trace.colorscale
        assert not isinstance(scale, str), "a named scale: plotly.js and plotly.py read it differently"
        return [[float(p), str(c)] for p, c in scale]

    def lightness(color):
        return sum(int(v) for v in re.findall(r"\d+", color))

    lt = LiveTrainer(modes=("fp16", "fp16+scaler"), steps=4, census_every=2, redraw_interval=0)
    (before,) = traces(lt.figure, "heat")  # the empty live figure, as first shown
    lt.start()
    assert lt.wait(60) and lt.error is None
    (live,) = traces(lt.figure, "heat")  # redrawn from the records
    assert len(live["x"]) == 2
    (static,) = traces(plot_live(lt.runs), "heat")  # lesson 07's figure of the same runs
    assert scale_of(before) == scale_of(live) == scale_of(static) == LOST_COLORSCALE
    scale = scale_of(static)
    assert scale[0][0] == 0.0 and scale[-1][0] == 1.0 and lightness(scale[0][1]) > lightness(scale[-1][1])
    assert live["zmin"] == static.zmin == 0.0 and live["zmax"] == static.zmax == 1.0


def test_the_live_figure_names_the_loss_unit_of_the_model_chosen():
    """LiveTrainer draws from empty runs, which name no model: its loss axis takes the unit from the
    model chosen ("loss (m²)" for the beam, as lesson 07's static figure), and a new choice redraws it."""
    lt = LiveTrainer(modes=("fp32",), model="beam", steps=5)
    assert lt.figure.figure_layout["yaxis"]["title"]["text"] == "loss (m²)"
    lt.model_dropdown.value = "mlp"
    lt._new_figure(["fp32"], 5)
    assert lt.figure.figure_layout["yaxis"]["title"]["text"] == "loss"
