"""LiveTrainer: train the course's models in several precisions at once, and steer the scaler."""

from __future__ import annotations

import html
import math
import threading
import time

import ipywidgets as W

from ampviz.widgets.figureview import FigureView

from ampviz.plots import live_traces, plot_live

from ampviz.widgets.base import _ERROR_STYLE, _Explorer, _real, _shown, _shows_errors, _whole


# ----- live training -----
_REGISTRY_LOCK = threading.Lock()
_RUNNING: set = set()  # the LiveTrainers whose current run has a live thread
# Held by the one thread that trains: a run started while an older one still finishes its step
# waits here ("waiting for the previous run to end") instead of training beside it.
_TRAINING = threading.Lock()


def running_trainers() -> list:
    """The ``LiveTrainer``s whose training thread is running now (at most one trains; a run just
    started may still wait for an older one to finish its step)."""
    with _REGISTRY_LOCK:
        return list(_RUNNING)


def _stop_running(timeout: float = 5.0) -> None:
    """Ask every running trainer to stop, and wait up to ``timeout`` s for their threads. A run
    that is still inside a long step ends after it; a new run waits for it (``_TRAINING``)."""
    for trainer in running_trainers():
        trainer.stop(wait=True, timeout=timeout)


class _LiveRun:
    """One press of Start: its runs, controls, events and thread. The thread writes only into its
    own ``_LiveRun``, so a run that ends late can never write into the next one."""

    def __init__(self, runs: dict, controls: dict, total: int):
        self.runs, self.controls, self.total = runs, controls, total
        self.stop_event = threading.Event()
        self.resume = threading.Event()
        self.resume.set()
        self.held = threading.Event()  # set while the thread waits in a pause
        self.waiting = False  # waiting for an older run's thread to end
        self.errors: list = []
        self.active_time = 0.0
        self.thread: threading.Thread | None = None
        self.ended = False  # the thread has finished its work (it may still draw a last time)

    @property
    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive() and not self.ended


class LiveTrainer(_Explorer):
    """Train a tiny model in several AMP modes at once and watch it live.

    The selected modes (``mode_checks``) train side by side in one background thread, one step of
    each mode in turn (``ampviz.training.live.train_steps``; every mode sees the same seeded model and
    batches), so the kernel stays free while they run. Controls: ``model_dropdown``, ``lr_input``,
    ``steps_input``, and the scaler sliders ``growth_slider``, ``backoff_slider``,
    ``interval_slider`` (growth_factor, backoff_factor, growth_interval of "fp16+scaler"), which
    act on a running training from its next step (``live.ScalerControl``); buttons ``start_button``,
    ``pause_button`` (Pause / Resume, held between steps), ``stop_button`` (the run ends within a
    step); ``progress`` with ``status`` (steps done and steps per second, then a short line per
    mode: its steps, and whether it finished, stopped, or failed and why; a failed mode's steps
    not trained leave the count and the bar, which ends full, red when a mode failed), ``device_line``
    (``live.describe_device``) and the message line.

    The figure (``figure``, a ``FigureView`` built from ``plot_live`` of empty runs) is redrawn
    from the records at most once per ``redraw_interval`` seconds, and no more often than keeps
    drawing under about a tenth of the run's time. Its state is the whole figure,
    so a page reloaded (or shown in Voila) draws the run as it is. A long run stays cheap: each
    mode's ``live.Run`` keeps at most ``max_records`` records (thinned evenly, skipped steps kept
    more densely; ``live.Run.max_records``), so memory and the cost of a redraw do not grow with
    the run. All widget writes of a run happen in ``_refresh`` and ``_sync_controls``.

    Only one training runs at a time: constructing or starting a LiveTrainer stops any other
    running one first; if that one is inside a long step, the new run waits for it to end
    (the status says so) and never trains beside it.

    State: ``runs`` (mode -> ``live.Run``, growing while the thread runs), ``running``, ``paused``,
    ``thread``, ``error`` (what ended a mode, in a sentence, e.g. "fp16 overflowed at step 12: the
    loss is inf", or an internal error), ``figure``.
    Methods ``start()``, ``pause()``, ``resume()``, ``stop(wait=True)``, ``wait(timeout)``.
    """

    GROWTH_RANGE = (1.01, 4.0)
    BACKOFF_RANGE = (0.05, 0.95)

    def __init__(self, modes=("fp32", "fp16", "fp16+scaler"), model="mlp", steps=300, lr=None, *,
                 growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, init_scale=2.0**16,
                 census_every=10, seed=0, batch_size=None, device=None, redraw_interval=0.1,
                 max_records=4000):
        from ampviz.training import live  # torch: imported when a trainer is made, not with ampviz.widgets

        self._live = live
        if isinstance(modes, str):
            modes = (modes,)
        try:
            modes = tuple(modes)
        except TypeError:
            raise TypeError(f"modes must be a mode or a list of modes from {', '.join(live.MODES)}, "
                            f"got {_shown(modes)}") from None
        unknown = [m for m in modes if m not in live.MODES]
        if unknown:
            raise ValueError(f"unknown mode {unknown[0]!r}; choose from {', '.join(live.MODES)}")
        if model not in live.MODELS:
            raise ValueError(f"unknown model {_shown(model)}; choose one of {', '.join(live.MODELS)}")
        steps = _whole("steps", steps, 1, 10**7)
        if lr is not None:
            lr = _real("lr", lr)
            if not (math.isfinite(lr) and lr > 0):
                raise ValueError(f"lr must be a positive number (or None for the model's default), got {_shown(lr)}")
        growth_factor = _real("growth_factor", growth_factor)
        backoff_factor = _real("backoff_factor", backoff_factor)
        growth_interval = _whole("growth_interval", growth_interval, 1)
        live._check_scaler_settings(growth_factor, backoff_factor, growth_interval)
        if not math.isfinite(growth_factor):
            raise ValueError(f"growth_factor must be a finite number above 1, got {_shown(growth_factor)}")
        init_scale = _real("init_scale", init_scale)
        if not (math.isfinite(init_scale) and init_scale >= 0):
            raise ValueError(f"init_scale must be a finite number >= 0, got {_shown(init_scale)}")
        self.census_every = _whole("census_every", census_every, 0)
        self.seed = _whole("seed", seed, 0)
        self.batch_size = None if batch_size is None else _whole("batch_size", batch_size, 1, 65536)
        self.redraw_interval = _real("redraw_interval", redraw_interval)
        if not (math.isfinite(self.redraw_interval) and self.redraw_interval >= 0):
            raise ValueError(f"redraw_interval must be a number of seconds >= 0, got {_shown(redraw_interval)}")
        self.max_records = None if max_records is None else _whole("max_records", max_records, 16)
        self.init_scale = init_scale
        self.device = None if device is None else str(live.resolve_device(device))
        device_text = live.describe_device(device)  # a bad device name fails here, before anything starts

        _stop_running()
        self._init_common(view=False)  # a FigureView per figure layout, in figure_box
        self.runs: dict = {}
        self._run: _LiveRun | None = None
        self._ui_lock = threading.RLock()  # a late thread's last refresh never overwrites the next run's

        style = {"description_width": "110px"}
        wide = W.Layout(width="380px")
        self.mode_checks = {m: W.Checkbox(value=m in modes, description=m, indent=False,
                                          layout=W.Layout(width="auto", margin="0 1em 0 0"))
                            for m in live.MODES}
        for m, box in self.mode_checks.items():
            box.add_class("ampviz-live-mode")
            box.add_class(f"ampviz-live-mode-{m.replace('+', '-')}")
        self.model_dropdown = W.Dropdown(options=list(live.MODELS), value=model, description="model", style=style)
        # another model brings its own learning rate (the classifiers' SGD takes 0.05, the beam's Adam 1e-3)
        self.model_dropdown.observe(
            lambda change: setattr(self.lr_input, "value", live.TrainConfig(model=change["new"]).learning_rate),
            names="value")
        default_lr = live.TrainConfig(model=model).learning_rate if lr is None else lr
        self.lr_input = W.FloatText(value=default_lr, description="learning rate", style=style)
        self.steps_input = W.BoundedIntText(value=steps, min=1, max=10**7, description="steps", style=style)
        # the sliders' ranges reach every valid value given: shown as given, never moved silently
        g_lo, g_hi = self.GROWTH_RANGE
        b_lo, b_hi = self.BACKOFF_RANGE
        self.growth_slider = W.FloatSlider(value=growth_factor, min=min(g_lo, growth_factor),
                                           max=max(g_hi, growth_factor), step=0.01, readout_format=".3g",
                                           description="growth_factor", style=style, layout=wide)
        self.backoff_slider = W.FloatSlider(value=backoff_factor, min=min(b_lo, backoff_factor),
                                            max=max(b_hi, backoff_factor), step=0.05, readout_format=".3g",
                                            description="backoff_factor", style=style, layout=wide)
        self.interval_slider = W.IntSlider(value=growth_interval, min=1, max=max(5000, growth_interval),
                                           description="growth_interval", style=style, layout=wide)
        self.start_button = W.Button(description="Start", button_style="success", icon="play")
        self.pause_button = W.Button(description="Pause", icon="pause")
        self.stop_button = W.Button(description="Stop", button_style="danger", icon="stop")
        self.progress = W.IntProgress(value=0, min=0, max=1, description="progress", style=style)
        self.status = W.HTML(value="not started")
        self.device_line = W.HTML(value=f"device: {html.escape(device_text)}")
        for w, cls in ((self.model_dropdown, "model"), (self.lr_input, "lr"), (self.steps_input, "steps"),
                       (self.growth_slider, "growth"), (self.backoff_slider, "backoff"),
                       (self.interval_slider, "interval"), (self.start_button, "start"),
                       (self.pause_button, "pause"), (self.stop_button, "stop"),
                       (self.progress, "progress"), (self.status, "status"), (self.device_line, "device")):
            w.add_class(f"ampviz-live-{cls}")
        for slider in (self.growth_slider, self.backoff_slider, self.interval_slider):
            slider.observe(self._on_scaler_setting, names="value")
        self.start_button.on_click(self._on_start)
        self.pause_button.on_click(self._on_pause)
        self.stop_button.on_click(self._on_stop)

        self._figure_key = None
        self.figure_box = W.Box(layout=W.Layout(width="100%"))
        self.figure_box.add_class("ampviz-live-figure")
        self._new_figure([m for m in live.MODES if m in modes], steps)
        self.ui = W.VBox([
            W.HBox(list(self.mode_checks.values()), layout=W.Layout(flex_flow="row wrap")),
            W.HBox([W.VBox([self.model_dropdown, self.lr_input, self.steps_input]),
                    W.VBox([self.growth_slider, self.backoff_slider, self.interval_slider])],
                   layout=W.Layout(flex_flow="row wrap")),
            W.HBox([self.start_button, self.pause_button, self.stop_button, self.progress, self.status],
                   layout=W.Layout(flex_flow="row wrap", align_items="center")),
            self.device_line, self.message, self.figure_box,
        ])
        self.ui.add_class("ampviz-live-trainer")
        self._sync_controls()

    # ----- read the controls -----
    @property
    def modes(self) -> list:
        """The selected modes, in ``live.MODES`` order."""
        return [m for m, box in self.mode_checks.items() if box.value]

    @property
    def running(self) -> bool:
        """The current run's thread is alive (training, paused, or waiting for an older run)."""
        return self._run is not None and self._run.alive

    @property
    def thread(self) -> threading.Thread | None:
        return None if self._run is None else self._run.thread

    @property
    def paused(self) -> bool:
        return self.running and not self._run.resume.is_set()

    @property
    def _held(self) -> threading.Event:
        return self._run.held

    def scaler_settings(self) -> dict:
        return {"growth_factor": float(self.growth_slider.value),
                "backoff_factor": float(self.backoff_slider.value),
                "growth_interval": int(self.interval_slider.value)}

    def configs(self) -> list:
        """One ``live.TrainConfig`` per selected mode, from the controls (ValueError when they are wrong)."""
        modes = self.modes
        if not modes:
            raise ValueError("select at least one mode to train")
        lr = float(self.lr_input.value)
        if not (math.isfinite(lr) and lr > 0):
            raise ValueError(f"the learning rate must be a positive number, got {lr:g}")
        steps = int(self.steps_input.value)
        if not 1 <= steps <= 10**7:
            raise ValueError(f"steps must be between 1 and 10,000,000, got {steps:,}")
        return [self._live.TrainConfig(model=self.model_dropdown.value, mode=m, steps=steps,
                                       lr=lr, batch_size=self.batch_size, seed=self.seed, device=self.device,
                                       census_every=self.census_every, init_scale=self.init_scale,
                                       **self.scaler_settings())
                for m in modes]

    # ----- actions -----
    def start(self) -> None:
        """Start training the selected modes in a background thread (any running training is
        stopped first; if it is inside a long step, this run waits for it to end)."""
        try:
            configs = self.configs()
        except (ValueError, TypeError):
            if not self.running:  # the status line must not go on describing an earlier run
                self.status.value = "not started: see the message above"
            raise
        _stop_running(timeout=1.0)
        live = self._live
        device_text = live.describe_device(self.device)
        total = sum(c.steps for c in configs)
        run = _LiveRun({c.mode: live.Run(config=c, device=device_text, max_records=self.max_records)
                        for c in configs},
                       {c.mode: live.ScalerControl() for c in configs}, total)
        gens = {c.mode: live.train_steps(c, run.controls[c.mode]) for c in configs}
        run.thread = threading.Thread(target=self._work, args=(run, gens), name="ampviz-live-trainer",
                                      daemon=True)
        with self._ui_lock:
            self._run, self.runs = run, run.runs
            self._clear_error()
            self.progress.max, self.progress.value, self.progress.bar_style = max(total, 1), 0, ""
            self._new_figure([c.mode for c in configs], max(c.steps for c in configs))
            self._figure_key = None  # this figure now belongs to a run: the next start builds a fresh one
            self.status.value = f"0 / {total:,} steps · starting"
        with _REGISTRY_LOCK:
            _RUNNING.add(self)
        run.thread.start()
        self._sync_controls()

    def pause(self, wait: bool = True, timeout: float = 2.0) -> None:
        """Hold the run between two steps (``wait``: until the thread holds)."""
        run = self._run
        if run is None or not run.alive:
            return
        run.resume.clear()
        self._sync_controls()
        if wait and threading.current_thread() is not run.thread:
            deadline = time.monotonic() + timeout
            while run.alive and not run.held.is_set() and time.monotonic() < deadline:
                run.held.wait(0.01)

    def resume(self) -> None:
        """Go on after ``pause()``."""
        if self._run is not None:
            self._run.resume.set()
        self._sync_controls()

    def stop(self, wait: bool = True, timeout: float = 5.0) -> bool:
        """Ask the run to end before its next step; ``wait``: join the thread (at most ``timeout``
        seconds). True when it has ended."""
        run = self._run
        if run is None:
            return True
        run.stop_event.set()
        for control in run.controls.values():
            control.stop()
        run.resume.set()
        if wait:
            return self.wait(timeout)
        return not run.alive

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the training thread to end; True when it has."""
        t = self.thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)
        return t is None or not t.is_alive()

    # ----- callbacks -----
    @_shows_errors
    def _on_start(self, button):
        self.start()

    @_shows_errors
    def _on_pause(self, button):
        if self.paused:
            self.resume()
        else:
            self.pause(wait=False)

    @_shows_errors
    def _on_stop(self, button):
        self.stop(wait=True)

    @_shows_errors
    def _on_scaler_setting(self, change):
        settings = self.scaler_settings()
        if self._run is not None:
            for control in self._run.controls.values():
                control.set(**settings)

    # ----- the training thread -----
    def _work(self, run: _LiveRun, gens: dict) -> None:
        active = dict(gens)
        try:
            if not _TRAINING.acquire(blocking=False):
                run.waiting = True
                self._refresh(run)
                while not _TRAINING.acquire(timeout=0.05):
                    if run.stop_event.is_set():
                        return
                run.waiting = False
            try:
                self._train(run, active)
            finally:
                _TRAINING.release()
        except Exception as exc:  # a bug, not the learner's input: shown, never lost
            run.errors.append(f"internal error ({type(exc).__name__}): {exc}")
        finally:
            for gen in gens.values():
                gen.close()
            run.held.clear()
            run.waiting = False
            run.ended = True
            with _REGISTRY_LOCK:
                if self._run is run or not self.running:
                    _RUNNING.discard(self)
            self._refresh(run, ended=True)

    def _train(self, run: _LiveRun, active: dict) -> None:
        last_draw, draw_cost = time.perf_counter(), 0.0
        while active and not run.stop_event.is_set():
            if not run.resume.is_set():
                if not run.held.is_set():
                    run.held.set()
                    self._refresh(run)
                run.resume.wait(0.05)
                continue
            run.held.clear()
            t0 = time.perf_counter()
            for mode, gen in list(active.items()):
                rec = next(gen, None)
                if rec is None:
                    del active[mode]
                    continue
                run.runs[mode].append(rec)
                if rec.error is not None:
                    run.errors.append(rec.error)
            t1 = time.perf_counter()
            run.active_time += t1 - t0
            # at most one redraw per redraw_interval, and never more than ~10% of the time drawing
            if t1 - last_draw >= max(self.redraw_interval, 10 * draw_cost):
                last_draw = t1
                self._refresh(run)
                draw_cost = time.perf_counter() - t1

    @staticmethod
    def _mode_steps(r) -> tuple[int, int, str | None]:
        """(steps trained, steps it was to train, what ended it or None) of one mode's ``live.Run``:
        a failed mode's last record says why it ended, and is no step trained."""
        error = r.error
        return r.steps_recorded - (error is not None), r.config.steps, error

    def _expected(self, run: _LiveRun) -> int:
        """The steps the run will have trained when it ends: each mode's steps, a failed mode's
        only those it trained (it trains no more)."""
        total = 0
        for r in run.runs.values():
            done, steps, error = self._mode_steps(r)
            total += done if error is not None else steps
        return total

    @staticmethod
    def _short_reason(mode: str, error: str) -> str:
        """What ended a mode, short: the failure sentence without the mode's name and the advice
        after it ("overflowed at step 12: … went past 65504"); the message line has it whole."""
        text = error[len(mode) + 1:] if error.startswith(mode + " ") else error
        for cut in (" (", ", so ", "; "):
            at = text.find(cut)
            if at > 0:
                text = text[:at]
        return text

    def _state(self, run: _LiveRun, ended: bool) -> str:
        if not ended:
            return "waiting for the previous run to end" if run.waiting else (
                "paused" if not run.resume.is_set() else "running")
        modes = [self._mode_steps(r) for r in run.runs.values()]
        failed = sum(error is not None for _, _, error in modes)
        finished = sum(error is None and done >= steps for done, steps, error in modes)
        if run.errors and not failed:  # an internal error: no mode says why
            return "failed"
        if failed:
            return "failed" if not finished else f"{finished} finished, {failed} failed"
        return "stopped" if finished < len(modes) else "done"

    def _mode_lines(self, run: _LiveRun, ended: bool) -> str:
        """One short line per mode: its steps, and whether it finished, failed (and why), or
        stopped (HTML)."""
        lines = []
        for mode, r in run.runs.items():
            done, steps, error = self._mode_steps(r)
            if error is not None:
                state = f"failed: {self._short_reason(mode, error)}"
            elif done >= steps:
                state = "finished"
            elif ended:
                state = "stopped"
            else:
                state = ""
            text = f"{mode}: {done:,} / {steps:,} steps" + (f" · {state}" if state else "")
            color = "#B00020" if error is not None else "inherit"
            lines.append(f'<div class="ampviz-live-mode-status" style="color:{color}">{html.escape(text)}</div>')
        return "".join(lines)

    def _refresh(self, run: _LiveRun | None = None, ended: bool = False) -> None:
        """Progress, status, message and figure from the records so far (never raises). Only the
        current run draws: a run that ended late leaves the widgets to the newer one."""
        run = self._run if run is None else run
        if run is None:
            return
        with self._ui_lock:
            if run is not self._run:
                return
            try:
                done = sum(self._mode_steps(r)[0] for r in run.runs.values())
                rate = done / run.active_time if run.active_time > 0 else 0.0
                # a failed mode trains no more: the bar and the count leave its other steps out
                expected = self._expected(run)
                self.progress.max = max(expected, 1)
                self.progress.value = min(done, self.progress.max)
                self.progress.bar_style = ("danger" if ended and any(r.error for r in run.runs.values())
                                           else "")
                head = (f"{done:,} / {expected:,} steps · {rate:,.0f} steps/s · "
                        f"{self._state(run, ended)}")
                if expected != run.total:
                    head += f" ({run.total:,} planned)"
                self.status.value = f"<div>{html.escape(head)}</div>{self._mode_lines(run, ended)}"
                if run.errors:
                    self.error = "; ".join(run.errors)
                    self.message.value = f'<span style="{_ERROR_STYLE}">⚠ {html.escape(self.error)}</span>'
                self._sync_controls()
                self._draw_live()
            except Exception as exc:  # drawing must never end a run or escape the thread
                self._show_error(exc)

    def _draw_live(self) -> None:
        data = live_traces(self.runs, heat_mode=self._heat_mode)
        if [d["meta"] for d in data] != [t["meta"] for t in self.figure.data]:
            raise RuntimeError("the live figure's traces do not match the runs")
        self.figure.set_data(data)

    def _sync_controls(self) -> None:
        running = self.running
        self.start_button.disabled = running
        self.pause_button.disabled = not running
        self.pause_button.description = "Resume" if self.paused else "Pause"
        self.pause_button.icon = "play" if self.paused else "pause"
        self.stop_button.disabled = not running
        for w in (*self.mode_checks.values(), self.model_dropdown, self.lr_input, self.steps_input):
            w.disabled = running

    def _new_figure(self, modes: list, steps: int) -> None:
        """A fresh FigureView from ``plot_live`` of empty runs (every trace present from the start),
        its loss axis in the unit of the model chosen."""
        model = self.model_dropdown.value
        key = (tuple(modes), int(steps), model)
        if key == self._figure_key and self.figure is not None:
            return
        fig = plot_live({m: [] for m in modes}, steps=steps, model=model)
        self._heat_mode = fig.layout.meta["heat_mode"]
        view = FigureView(fig)
        view.add_class("ampviz-live-plot")
        old, self.figure, self._figure_key = self.figure, view, key
        self.figure_box.children = (view,)
        if old is not None:
            old.close()


