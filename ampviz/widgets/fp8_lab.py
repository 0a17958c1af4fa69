"""Fp8ScalingLab: FP8 per-tensor scaling, delayed or current, over a stream of tensors with spikes.

What it shows at a set of settings is computed by this module's functions, over plain settings
(a dict, as ``acting_settings`` makes it): ``lab_stream``, ``simulate_lab``, ``spike_ends``,
``lab_figure`` and ``readout_html``. Fp8ScalingLab and ``BrowserFp8ScalingLab`` both call them."""

from __future__ import annotations

import html
from collections import OrderedDict

import numpy as np

import ipywidgets as W

from ampviz.widgets.figureview import FigureView
from ampviz.formats.fp8 import ALGOS, simulate_fp8_scaling, tensor_stream
from ampviz.plots import format_share, plot_fp8_scaling

from ampviz.widgets.base import _Explorer, _beside, _in_column, _shown, _whole, parse_number

#: The explorer; the module's functions compute what it shows for it and its page twin
#: (``BrowserFp8ScalingLab``), not an API of their own.
__all__ = ["Fp8ScalingLab"]

#: The recipes: (what the learner reads, the value).
RECIPES = (("delayed (earlier amaxes)", "delayed"), ("current (this amax)", "current"))
#: The formats: (what the learner reads, the value).
FORMATS = (("E4M3 (max 448)", "fp8_e4m3"), ("E5M2 (max 57344)", "fp8_e5m2"))
#: Non-finite steps in the stream: (what the learner reads, the value).
NONFINITE = (("none", "none"), ("rare inf steps", "inf"), ("rare NaN steps", "nan"))
#: The history lengths offered (Transformer Engine's default is 1024).
HISTORY_LENGTHS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def lab_stream(seed: int, spike_log2: int, nonfinite: str, steps: int = 2000, size: int = 4096):
    """The lab's stream: ``tensor_stream(steps, size, seed=seed, spike_log2=spike_log2)``, with
    ``Fp8ScalingLab.NONFINITE_PROB`` of inf steps (``"inf"``) or NaN steps (``"nan"``)."""
    p = Fp8ScalingLab.NONFINITE_PROB
    return tensor_stream(steps, size, seed=seed, spike_log2=spike_log2,
                         inf_prob=p if nonfinite == "inf" else 0.0, nan_prob=p if nonfinite == "nan" else 0.0)


# ----- what the lab shows, over plain settings -----
def acting_settings(*, recipe: str, fmt: str, spike_log2: int, nonfinite: str, seed: int, history_len: int,
                    algo: str, margin: int) -> dict:
    """The settings as ``simulate_fp8_scaling``'s and ``lab_stream``'s arguments: the history,
    algo and margin, which apply to delayed scaling only, left out for current scaling (the same
    drawing, the same settings)."""
    s = {"recipe": recipe, "fmt": fmt, "spike_log2": spike_log2, "nonfinite": nonfinite, "seed": seed,
         "history_len": history_len, "algo": algo, "margin": margin}
    if recipe != "delayed":
        for k in ("history_len", "algo", "margin"):
            del s[k]
    return s


def simulate_lab(s: dict, steps: int, size: int) -> tuple:
    """(stream, trace) at the settings ``s`` (``acting_settings``'): ``lab_stream`` of ``steps``
    tensors of ``size`` values, quantized by ``simulate_fp8_scaling``."""
    stream = lab_stream(s["seed"], s["spike_log2"], s["nonfinite"], steps, size)
    kw = {k: s[k] for k in ("history_len", "algo", "margin") if k in s}
    return stream, simulate_fp8_scaling(stream, s["recipe"], fmt=s["fmt"], **kw)


def spike_ends(s: dict, spike_lo: int, spike_hi: int, steps: int, size: int) -> tuple:
    """The traces with spikes of ``2**spike_lo`` and ``2**spike_hi`` (the spike slider's ends) and
    the other settings ``s``: the figure's axes hold them too, so that the spike grows against
    still axes."""
    return tuple(simulate_lab({**s, "spike_log2": v}, steps, size)[1] for v in (spike_lo, spike_hi))


def lab_figure(trace, hold=()):
    """The lab's figure of ``trace``: no counts in the legend (the readout has them), its axes
    holding the traces ``hold`` (``spike_ends``)."""
    return plot_fp8_scaling(trace, legend_counts=False, hold=hold)


def readout_html(trace) -> str:
    """The readout: the steps that saturate, the steps that lose at least 1% of their values to
    underflow, the steps with subnormals, the mean share underflowed, and the worst step."""
    n = trace.steps
    lossy = int((trace.underflowed_share >= 0.01).sum())
    w = trace.worst_step
    some = {k: int((np.asarray(getattr(trace, k)) > 0).sum()) for k in ("underflowed", "subnormal")}
    line = (f"steps that saturate: {trace.saturated_steps:,} of {n:,} · "
            f"steps that lose ≥ 1% to underflow: {lossy:,} (any: {some['underflowed']:,}) · "
            f"steps with subnormals: {some['subnormal']:,} · "
            f"mean underflowed {format_share(float(np.mean(trace.underflowed_share)))}")
    worst = (f"worst step {w:,}: {int(trace.saturated[w]):,} saturated, {int(trace.underflowed[w]):,} "
             f"underflowed ({format_share(trace.underflowed_share[w])}) of {trace.size:,} values, "
             f"amax {float(trace.amax[w]):.3g}, scale {float(trace.scale[w]):.3g}")
    return f"<div>{html.escape(line)}</div><div>{html.escape(worst)}</div>"


class Fp8ScalingLab(_Explorer):
    """A stream of tensors (``ampviz.formats.fp8.tensor_stream``: a slow drift, spikes of 2^k, optionally
    rare inf or NaN steps) quantized to FP8 with delayed or current scaling
    (``ampviz.formats.fp8.simulate_fp8_scaling``), drawn by ``plot_fp8_scaling``.

    Controls: ``recipe_buttons`` (delayed, as Transformer Engine's ``DelayedScaling``, or current,
    as torchao's), ``history_slider`` (``amax_history_len``; the length in use is shown in
    ``history_input`` beside it, where a length can be typed: text that is not one of
    ``HISTORY_LENGTHS`` is refused with a message, and the box shows the length in use again),
    ``algo_dropdown`` (``"max"`` or
    ``"most_recent"``), ``margin_slider`` (the scale is divided by 2**margin), ``fmt_dropdown``
    (E4M3 or E5M2), ``spike_slider`` (log2 of the spikes), ``nonfinite_dropdown`` and
    ``seed_input``. The history, algo and margin apply to delayed scaling only and are disabled
    for current scaling.

    State: ``stream``, ``trace`` (the ``Fp8ScalingTrace``), ``figure``, ``error``. The readout
    counts the steps that saturate, the steps that lose at least 1% of their values to underflow,
    the mean share underflowed, and the worst step.
    """

    RECIPES = RECIPES
    FORMATS = FORMATS
    NONFINITE = NONFINITE
    HISTORY_LENGTHS = HISTORY_LENGTHS
    MARGIN_RANGE = (-4, 8)
    SPIKE_RANGE = (0, 16)
    MAX_SEED = 2**32 - 1
    STEPS = 2000
    SIZE = 4096
    #: The chance of a non-finite step when the stream has them.
    NONFINITE_PROB = 0.002
    #: How many drawn settings are kept for reuse.
    KEPT_DRAWN = 8
    #: The width of the controls' column (pixels), beside the figure.
    CONTROLS_WIDTH = 360

    def __init__(self, recipe="delayed", *, history_len=1024, algo="max", margin=0, fmt="fp8_e4m3", spike_log2=8,
                 nonfinite="none", seed=0):
        self._init_common()
        self._ends = OrderedDict()  # settings (all but the spike) -> the runs at the spike slider's ends
        for name, value, options in (("recipe", recipe, RECIPES), ("fmt", fmt, FORMATS),
                                     ("nonfinite", nonfinite, NONFINITE)):
            allowed = [v for _, v in options]
            if not isinstance(value, str) or value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {_shown(value)}")
        if not isinstance(algo, str) or algo not in ALGOS:
            raise ValueError(f"algo must be one of {', '.join(map(repr, ALGOS))}, got {_shown(algo)}")
        history_len = _whole("history_len", history_len, 1, HISTORY_LENGTHS[-1])
        if history_len not in HISTORY_LENGTHS:
            raise ValueError(f"history_len must be a power of two from 1 to 1,024, got {history_len:,}")
        margin = _whole("margin", margin, *self.MARGIN_RANGE)
        spike_log2 = _whole("spike_log2", spike_log2, *self.SPIKE_RANGE)
        seed = _whole("seed", seed, 0, self.MAX_SEED)

        self.stream = self.trace = None
        style = {"description_width": "110px"}
        wide = W.Layout(width="350px")  # within the controls' column, margins included
        # buttons wide enough for "delayed (earlier amaxes)" (the default width cuts it off)
        self.recipe_buttons = W.ToggleButtons(options=list(RECIPES), value=recipe, description="recipe",
                                              style={**style, "button_width": "220px"})
        # the slider's own readout is editable in the browser but reads nothing typed into it (a
        # SelectionSlider's): the length in use is shown, and can be typed, in a box beside it
        self.history_slider = W.SelectionSlider(options=list(HISTORY_LENGTHS), value=history_len,
                                                description="history length", style=style,
                                                layout=W.Layout(width="280px"), readout=False)
        self.history_input = W.Text(value=str(history_len), continuous_update=False,
                                    layout=W.Layout(width="64px"),
                                    tooltip="amax_history_len: a power of two from 1 to 1,024 (then Enter)")
        self.history_input.add_class("ampviz-fp8-history-input")
        self._history_syncing = False
        self.algo_dropdown = W.Dropdown(options=list(ALGOS), value=algo, description="amax algo", style=style)
        self.margin_slider = W.IntSlider(value=margin, min=self.MARGIN_RANGE[0], max=self.MARGIN_RANGE[1],
                                         description="margin", style=style, layout=wide)
        self.fmt_dropdown = W.Dropdown(options=list(FORMATS), value=fmt, description="format", style=style)
        self.spike_slider = W.IntSlider(value=spike_log2, min=self.SPIKE_RANGE[0], max=self.SPIKE_RANGE[1],
                                        description="log2 spike", style=style, layout=wide)
        self.nonfinite_dropdown = W.Dropdown(options=list(NONFINITE), value=nonfinite, description="non-finite",
                                             style=style)
        self.seed_input = W.BoundedIntText(value=seed, min=0, max=self.MAX_SEED, description="stream seed",
                                           style=style)
        for w, cls in ((self.recipe_buttons, "recipe"), (self.history_slider, "history"),
                       (self.algo_dropdown, "algo"), (self.margin_slider, "margin"), (self.fmt_dropdown, "fmt"),
                       (self.spike_slider, "spike"), (self.nonfinite_dropdown, "nonfinite"),
                       (self.seed_input, "seed")):
            w.add_class(f"ampviz-fp8-{cls}")
            w.observe(self._on_change, names="value")
        self.history_slider.observe(self._show_history, names="value")
        self.history_input.observe(self._on_history_typed, names="value")
        self.readout = W.HTML()
        self.readout.add_class("ampviz-fp8-readout")
        self.view.add_class("ampviz-fp8-figure")
        # the controls, message and readout in a column, the figure beside them (``_beside``)
        self.ui = _beside([self.recipe_buttons, W.HBox([self.history_slider, self.history_input]),
                           self.algo_dropdown, self.margin_slider, self.fmt_dropdown, self.spike_slider,
                           self.nonfinite_dropdown, self.seed_input, self.message, self.readout],
                          self.view, self.CONTROLS_WIDTH)
        self.ui.add_class("ampviz-fp8-lab")
        self._enable()
        self.update()

    # ----- read the controls -----
    def settings(self) -> dict:
        """The controls' settings as ``simulate_fp8_scaling``'s and ``lab_stream``'s arguments."""
        return self._settings()

    def _settings(self, **changed) -> dict:
        """``settings()`` with ``changed`` (a slider's setting name -> value) in place of the
        controls' values."""
        s = {"recipe": self.recipe_buttons.value, "fmt": self.fmt_dropdown.value,
             "spike_log2": int(self.spike_slider.value), "nonfinite": self.nonfinite_dropdown.value,
             "seed": int(self.seed_input.value), "history_len": int(self.history_slider.value),
             "algo": self.algo_dropdown.value, "margin": int(self.margin_slider.value)}
        s.update(changed)
        return acting_settings(**s)

    def simulate(self, **changed):
        """(stream, trace) for the controls' settings (``changed`` replaces some, as in
        ``settings()``)."""
        return simulate_lab(self._settings(**changed), self.STEPS, self.SIZE)

    # ----- react -----
    def _enable(self) -> None:
        current = self.recipe_buttons.value == "current"
        self.history_slider.disabled = self.algo_dropdown.disabled = self.margin_slider.disabled = current
        self.history_input.disabled = current

    def _show_history(self, change=None) -> None:
        """The history box shows the length in use (the slider's)."""
        self._history_syncing = True
        try:
            self.history_input.value = str(self.history_slider.value)
        finally:
            self._history_syncing = False

    def _on_history_typed(self, change) -> None:
        """A length typed into the history box (on Enter): the slider moves to it. Text that is not
        one of the lengths is refused with a message, and the box shows the length in use again."""
        if self._history_syncing:
            return
        typed = str(change["new"]) if isinstance(change, dict) else str(self.history_input.value)
        try:
            try:
                value = parse_number(typed)
            except ValueError:
                value = None
            if value is None or value not in HISTORY_LENGTHS:
                raise ValueError(f"the history length must be a power of two from 1 to 1,024, got "
                                 f"{_shown(typed.strip(), 20)}: the figure still uses "
                                 f"{self.history_slider.value:,}")
        except ValueError as exc:
            self._show_history()
            self._show_error(exc)
            return
        if int(value) == self.history_slider.value:
            self._show_history()  # "128.0" or " 128": shown as the length in use
        else:
            self.history_slider.value = int(value)  # redraws; the box follows the slider

    def _on_change(self, change) -> None:
        self._enable()
        self._note_move(change, ((self.spike_slider, "spike_log2"), (self.margin_slider, "margin"),
                                 (self.history_slider, "history_len")))
        self._request_update(change)  # at once from Python; coalesced from the browser

    def _drawn(self, **changed) -> tuple:
        """(stream, trace, readout, figure, prepared figure) for the settings (``changed`` replaces
        some), kept for reuse."""
        key = tuple(sorted(self._settings(**changed).items()))
        if (state := self._kept_state(key)) is not None:
            return state
        stream, trace = self.simulate(**changed)
        fig = lab_figure(trace, hold=self._spike_ends(**changed))
        state = (stream, trace, _in_column(readout_html(trace)), fig, FigureView.prepare(fig))
        return self._keep_state(key, state, self.KEPT_DRAWN)

    def _spike_ends(self, **changed) -> tuple:
        """``spike_ends`` at the settings, at the spike slider's two ends (kept per settings, all
        but the spike): a move of the slider only moves the lines."""
        s = self._settings(**changed)
        key = tuple(sorted((k, v) for k, v in s.items() if k != "spike_log2"))
        return self._recent(self._ends, key, lambda: spike_ends(s, self.spike_slider.min, self.spike_slider.max,
                                                                self.STEPS, self.SIZE), self.KEPT_DRAWN)

    def update(self) -> None:
        """Simulate with the controls' settings and redraw."""
        self.stream, self.trace, readout, fig, prepared = self._drawn()
        self._draw(fig, prepared)
        self.readout.value = readout
        self._clear_error()
