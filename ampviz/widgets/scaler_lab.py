"""ScalerLab: dynamic loss scaling on a long gradient stream, live."""

from __future__ import annotations

import html
import math
from collections import OrderedDict

import numpy as np

import ipywidgets as W

from ampviz import scaling
from ampviz.scaling import synth
from ampviz.formats.census import underflow_fractions
from ampviz.widgets.figureview import FigureView

from ampviz.plots import _skipped_marks, format_number, plot_scale_trace

from ampviz.widgets.base import _Explorer, _beside, _in_column, _real, _shown, _table, _whole

#: The explorer; the module's functions compute what it shows for it and its page twin
#: (``BrowserScalerLab``), not an API of their own.
__all__ = ["ScalerLab"]


# ----- dynamic loss scaling, live -----
class ScalerLab(_Explorer):
    """A dynamic loss scaler on a stream of gradients, re-simulated on every slider move.

    Controls: ``init_slider`` (log2 of init_scale), ``growth_slider``, ``backoff_slider``,
    ``interval_input`` (growth_interval), ``scenario_dropdown`` and ``strength_slider`` (the
    gradient stream, from ``ampviz.scaling.synth``), ``loss_dropdown`` (the loss in float32, as autocast
    computes it, or in fp16: ``ampviz.scaling.overflows``), ``overlay`` (other frameworks'
    scalers from ``ampviz.scaling.PRESETS`` to run on the same stream). Your settings run as
    ``torch.amp.GradScaler`` would (``TorchGradScaler``).

    State: ``stream`` (per-step max |gradient|), ``traces`` (``ScalerTrace`` per scaler, yours
    first), ``lost`` (steps and share of ``gradients`` lost to fp16 underflow at your scale),
    ``figure``, ``error``. Invalid settings (growth <= 1, backoff outside (0, 1), interval < 1)
    show a message and keep the last good figure.
    """

    #: The sliders' usual ranges (every position valid; a valid value given beyond them widens them).
    GROWTH_RANGE = (1.001, 4.0)
    BACKOFF_RANGE = (0.005, 0.995)
    #: The width of the controls' column (pixels), beside the figure.
    CONTROLS_WIDTH = 360
    #: The loss-dtype choices: (label, loss_dtype for ``scaling.overflows``).
    LOSSES = (("float32 (autocast)", "float32"), ("fp16 (a .half() model)", "float16"))

    def __init__(self, steps=100_000, *, scenario="spikes", strength=0.5, gradients=None, seed=0,
                 init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
                 overlay=(), loss_dtype="float32"):
        self._init_common()
        self.steps = _whole("steps", steps, 1, 10**8)
        self.seed = _whole("seed", seed, 0)
        self._streams: OrderedDict = OrderedDict()  # (scenario, strength) -> (stream, median): recent ones
        self._lost_cache: dict = {}
        self._runs: OrderedDict = OrderedDict()  # settings -> ScalerTrace: recent runs, reused
        self.traces: list = []
        self.lost = None
        if gradients is None:  # a fixed sample spread over ~25 binades below its largest value, as
            rng = np.random.default_rng(self.seed)  # real gradients are (notebook 02's span ~30)
            gradients = np.exp2(-np.abs(rng.normal(0.0, 8.0, 20_000))).astype(np.float32)
        g = np.abs(np.asarray(gradients, dtype=np.float32).ravel())
        self._grad_shape = g / g.max() if g.size and g.max() > 0 else g

        log2_init = self._log2_init(init_scale)
        growth_factor, backoff_factor = _real("growth_factor", growth_factor), _real("backoff_factor", backoff_factor)
        growth_interval = _whole("growth_interval", growth_interval, 1, 10**7)
        strength = _real("strength", strength)
        if not 0 <= strength <= 1:
            raise ValueError(f"strength must be between 0 and 1, got {_shown(strength)}")
        if not isinstance(scenario, str) or scenario not in synth.SCENARIOS:
            raise ValueError(f"unknown scenario {_shown(scenario)}; choose one of {', '.join(synth.SCENARIOS)}")
        if not isinstance(loss_dtype, str) or loss_dtype not in dict(self.LOSSES).values():
            raise ValueError(f"loss_dtype must be 'float32' (the loss autocast computes in fp32) or 'float16' "
                             f"(a loss computed in fp16), got {_shown(loss_dtype)}")
        unknown = [name for name in overlay if name not in scaling.PRESETS or name == "torch"] \
            if not isinstance(overlay, str) else [overlay]
        if unknown:
            raise ValueError(f"cannot compare with {unknown[0]!r}; choose from "
                             f"{', '.join(n for n in scaling.PRESETS if n != 'torch')}")
        if not (math.isfinite(growth_factor) and growth_factor > 1):
            raise ValueError(f"growth_factor must be a finite number above 1 (the scale must be able to grow), "
                             f"got {_shown(growth_factor)}")
        if not 0 < backoff_factor < 1:
            raise ValueError(f"backoff_factor must be between 0 and 1 (both excluded), got {_shown(backoff_factor)}")
        style = {"description_width": "110px"}
        wide = W.Layout(width="350px")  # within the controls' column, margins included
        self.init_slider = W.IntSlider(value=log2_init, min=-10, max=40,
                                       description="log2 init_scale", style=style, layout=wide)
        # Every position of a slider is a valid setting (Home and End included): growth above 1,
        # backoff strictly between 0 and 1. A valid value beyond the usual range widens it: shown
        # as given, never moved.
        g_lo, g_hi = self.GROWTH_RANGE
        b_lo, b_hi = self.BACKOFF_RANGE
        self.growth_slider = W.FloatSlider(value=growth_factor, min=min(g_lo, growth_factor),
                                           max=max(g_hi, growth_factor), step=0.001,
                                           readout_format=".4g", description="growth_factor",
                                           style=style, layout=wide)
        self.backoff_slider = W.FloatSlider(value=backoff_factor, min=min(b_lo, backoff_factor),
                                            max=max(b_hi, backoff_factor), step=0.005,
                                            readout_format=".4g", description="backoff_factor",
                                            style=style, layout=wide)
        self.interval_input = W.BoundedIntText(value=growth_interval, min=1, max=10**7,
                                               description="growth_interval", style=style)
        self.scenario_dropdown = W.Dropdown(options=list(synth.SCENARIOS), value=scenario,
                                            description="scenario", style=style)
        self.strength_slider = W.FloatSlider(value=strength, min=0.0, max=1.0, step=0.05,
                                             description="strength", style=style, layout=wide)
        self.loss_dropdown = W.Dropdown(options=list(self.LOSSES), value=loss_dtype, description="loss",
                                        style=style)
        others = [(f"{name} (legacy)" if name in scaling.LEGACY else name, name)
                  for name in scaling.PRESETS if name != "torch"]
        self.overlay = W.SelectMultiple(options=others, value=tuple(overlay) if not isinstance(overlay, str) else (overlay,),
                                        rows=min(6, max(len(others), 1)), description="compare with", style=style,
                                        layout=W.Layout(width="340px"))  # the longest name fits
        self.overlay_hint = W.HTML("<small>Ctrl- or Shift-click to compare several</small>",
                                   layout=W.Layout(margin="0 0 0 120px"))
        for w, cls in ((self.init_slider, "init"), (self.growth_slider, "growth"),
                       (self.backoff_slider, "backoff"), (self.interval_input, "interval"),
                       (self.scenario_dropdown, "scenario"), (self.strength_slider, "strength"),
                       (self.loss_dropdown, "loss"), (self.overlay, "overlay")):
            w.add_class(f"ampviz-scaler-{cls}")
            w.observe(self._on_change, names="value")
        self.readout = W.HTML()
        self.readout.add_class("ampviz-scaler-readout")
        self.view.add_class("ampviz-scaler-figure")
        # the controls, message and table in a column, the figure beside them (``_beside``)
        self.ui = _beside([self.init_slider, self.growth_slider, self.backoff_slider, self.interval_input,
                           self.scenario_dropdown, self.strength_slider, self.loss_dropdown, self.overlay,
                           self.overlay_hint, self.message, self.readout], self.view, self.CONTROLS_WIDTH)
        self.ui.add_class("ampviz-scaler-lab")
        self.update()

    @staticmethod
    def _log2_init(init_scale) -> int:
        """log2 of ``init_scale``: the slider moves in powers of two from 2^-10 to 2^40."""
        x = _real("init_scale", init_scale)
        if x > 0 and math.isfinite(x):
            m, e = math.frexp(x)
            if m == 0.5 and -10 <= e - 1 <= 40:
                return e - 1
        raise ValueError(f"init_scale must be a power of two from 2^-10 to 2^40 (the slider moves in "
                         f"powers of two), got {_shown(init_scale)}")

    # ----- read the controls -----
    def policy(self) -> "scaling.DynamicScaler":
        """Your settings as a scaler, or ValueError with what is wrong."""
        return self._policy_of(self.init_slider.value, self._on_grid(self.growth_slider, self.growth_slider.value),
                               self._on_grid(self.backoff_slider, self.backoff_slider.value), self.interval_input.value)

    @staticmethod
    def _policy_of(log2_init, gf, bf, gi) -> "scaling.DynamicScaler":
        problems = []
        if not gf > 1:
            problems.append(f"growth_factor must be above 1 (it is {gf:g}: the scale could never grow)")
        if not 0 < bf < 1:
            problems.append(f"backoff_factor must be between 0 and 1 (it is {bf:g})")
        if not gi >= 1:
            problems.append(f"growth_interval must be at least 1 step (it is {gi})")
        if problems:
            raise ValueError("; ".join(problems) + ". Nothing is redrawn until it is fixed: the figure and "
                             "the table still show the last settings that ran")
        # torch.amp.GradScaler's rule (TorchGradScaler), under its own name in the figure
        return scaling.DynamicScaler(name="your settings", init_scale=2.0 ** log2_init,
                                     growth_factor=gf, backoff_factor=bf, growth_interval=int(gi),
                                     arithmetic="torch", source=scaling.TorchGradScaler().source)

    @property
    def stream(self) -> np.ndarray:
        return self._stream_of(self.scenario_dropdown.value, self.strength_slider.value)

    #: How many gradient streams are kept for reuse (each is ``steps`` long; one made again is the
    #: same, from the same seed).
    KEPT_STREAMS = 3

    def _stream_of(self, scenario: str, strength) -> np.ndarray:
        return self._stream_entry(scenario, strength)[0]

    def _stream_entry(self, scenario: str, strength) -> tuple:
        """(stream, its median largest gradient) of a scenario at a strength, kept for reuse."""
        def make():
            g = synth.scenario(scenario, self.steps, float(strength), np.random.default_rng(self.seed))
            return g, float(np.median(g)) if g.size else 1.0

        return self._recent(self._streams, (scenario, float(strength)), make, self.KEPT_STREAMS)

    # ----- react -----
    #: How many runs are kept for reuse (your recent settings, the slider's next positions, the
    #: frameworks compared).
    KEPT_RUNS = 6
    #: Skipped steps marked per scaler at most (the readout says how many of them are).
    MARKS = 60

    def _on_change(self, change):
        # only your own settings are drawn ahead; the stream and the frameworks compared stay
        self._note_move(change, ((self.init_slider, "init_slider"), (self.growth_slider, "growth_slider"),
                                 (self.backoff_slider, "backoff_slider")))
        self._request_update(change)  # at once from Python; coalesced from the browser

    @staticmethod
    def _on_grid(slider, value):
        """``value`` on ``slider``'s grid of positions (min + k * step), as a decimal rounds it: a
        browser's sum (0.505 + 0.005 = 0.51000000000000001) runs as the position it stands for,
        0.51. Only the run uses it; the slider keeps what the browser sent (writing it back would
        race the next key presses)."""
        if isinstance(slider, W.IntSlider) or not isinstance(value, float) or not math.isfinite(value):
            return value
        k = round((value - slider.min) / slider.step)
        grid = round(slider.min + k * slider.step, 12)
        return grid if abs(grid - value) <= 1e-9 * max(1.0, abs(value)) and slider.min <= grid <= slider.max \
            else value

    def _run(self, policy, g, loss: str, key) -> "scaling.ScalerTrace":
        """``simulate(policy)`` on the stream, reused when the same settings ran recently."""
        return self._recent(self._runs, key, lambda: scaling.simulate(policy, grad_max=g, loss_dtype=loss),
                            2 * self.KEPT_RUNS)  # a run and its lost share each

    def _lost_of(self, key, trace, level: float):
        """``_lost_share(trace, level)``, kept with the run it belongs to."""
        return self._recent(self._runs, ("lost", key, level), lambda: self._lost_share(trace, level),
                            2 * self.KEPT_RUNS)

    def _settings(self, **changed) -> tuple:
        """Your settings as a key (``changed`` replaces some, by slider attribute name)."""
        values = {name: getattr(self, name).value for name in
                  ("init_slider", "growth_slider", "backoff_slider", "interval_input", "scenario_dropdown",
                   "strength_slider", "loss_dropdown")}
        for name in ("growth_slider", "backoff_slider"):
            values[name] = self._on_grid(getattr(self, name), values[name])
        values.update(changed)
        return tuple(values.items())

    def _neighbour(self, slider, k: int):
        """The position ``k`` arrow-key presses away, on the slider's grid (see ``_on_grid``)."""
        value = self._on_grid(slider, slider.value + k * slider.step)
        return value if slider.min <= value <= slider.max else None

    def _drawn(self, **changed) -> tuple:
        """(traces, lost share, readout, figure, prepared figure) for your settings with
        ``changed`` applied (slider attribute name -> value), kept for reuse: every scaler run on
        the stream (yours first, then the frameworks compared). ValueError for invalid settings."""
        settings = self._settings(**changed)
        overlay = tuple(self.overlay.value)
        key = (settings, overlay)
        if (state := self._kept_state(key)) is not None:
            return state
        s = dict(settings)
        mine = self._policy_of(s["init_slider"], s["growth_slider"], s["backoff_slider"], s["interval_input"])
        scenario, strength, loss = s["scenario_dropdown"], s["strength_slider"], s["loss_dropdown"]
        g, typical = self._stream_entry(scenario, strength)
        stream_key = (scenario, float(strength), loss)
        traces = [self._run(mine, g, loss, ("yours", settings))] + [
            self._run(scaling.PRESETS[name], g, loss, ("preset", name, stream_key)) for name in overlay]
        lost = self._lost_of(("yours", settings), traces[0], typical)
        fig = plot_scale_trace(traces, lost={"your settings": lost}, legend_counts=False,
                               max_markers=self.MARKS,
                               title=f"{scenario} gradients (strength {strength:g}), {self.steps:,} steps, "
                                     f"{'float32' if loss == 'float32' else 'fp16'} loss")
        state = (traces, lost, _in_column(self._readout_html(traces)), fig, FigureView.prepare(fig))
        return self._keep_state(key, state, self.KEPT_RUNS)

    def update(self) -> None:
        """Simulate every scaler on the stream and redraw (the last good figure stays on error)."""
        self.traces, self.lost, readout, fig, prepared = self._drawn()
        self._draw(fig, prepared)
        self.readout.value = readout
        self._clear_error()

    def _lost_share(self, trace, level: float):
        """``lost_share`` of the trace, over the gradient sample scaled to ``level``."""
        if self._lost_cache.get("level") != level:
            self._lost_cache = {"level": level, "sample": (self._grad_shape * level).astype(np.float32)}
        return lost_share(trace, self._lost_cache["sample"])

    def _readout_html(self, traces=None) -> str:
        return readout_html(self.traces if traces is None else traces, self.MARKS)


def lost_share(trace, sample: np.ndarray):
    """(steps, shares): the share of ``sample`` (float32 gradients) lost to fp16 underflow at the
    scale in effect, at the steps where the trace's scale changes (at most 200 of them), and once
    more at its last step."""
    s = trace.scale.astype(np.float64)
    if s.size == 0:
        return np.zeros(0, np.int64), np.zeros(0)
    changed = np.flatnonzero(s[1:] != s[:-1]) + 1
    idx = np.concatenate([[0], changed])
    if idx.size > 200:
        idx = idx[np.linspace(0, idx.size - 1, 200).round().astype(np.int64)]
    scales = s[idx]
    usable = np.isfinite(scales) & (scales > 0) & (scales <= 3e38)
    shares = np.where(scales == 0, 1.0, 0.0)  # a zero scale loses every gradient
    if usable.any():
        shares[usable] = underflow_fractions(sample, "fp16", scales[usable])
    return np.append(idx, s.size - 1), np.append(shares, shares[-1])


def readout_html(traces, marks: int) -> str:
    """The table under a scaler lab's controls: per scaler, its skipped steps (and how many are
    marked, of ``marks`` at most), its final scale (or where it stopped) and its lowest scale."""
    rows = []
    for t in traces:
        finite = t.scale[np.isfinite(t.scale)]
        low = format_number(float(finite.min())) if finite.size else "—"
        if t.stopped_at is not None:
            reason = getattr(t, "stop_reason", None)
            end = f"stopped at step {t.stopped_at:,}" + (f" ({html.escape(reason)})" if reason else "")
        else:
            end = format_number(float(t.final.scale))
        _, _, part = _skipped_marks(t, marks)
        skipped = f"{t.skipped_count:,}" + (f" ({part} marked)" if part else "")
        rows.append((html.escape(t.policy.name), skipped, end, low))
    return _table(("scaler", "skipped steps", "final scale", "lowest scale"), rows)
