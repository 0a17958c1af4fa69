"""ExplorerApp: every explorer on one page (the explorer app)."""

from __future__ import annotations

import numpy as np

import ipywidgets as W

from ampviz.widgets.format_explorer import FormatExplorer
from ampviz.widgets.live_trainer import LiveTrainer
from ampviz.widgets.range_explorer import RangeExplorer
from ampviz.widgets.scaler_lab import ScalerLab


# ----- the explorer app: every explorer on one page -----
class ExplorerApp:
    """The four explorers on one page, a tab each: the explorer app (``notebooks/explorer.ipynb``,
    served as a page by Voila with ``make explorer``).

    Tabs: ``formats`` (a ``FormatExplorer``), ``ranges`` (a ``RangeExplorer`` over ``gradients``),
    ``scaling`` (a ``ScalerLab`` of ``steps`` steps, its lost share measured on the same
    ``gradients``; ``overlay`` names other frameworks' scalers to draw from the start, none by
    default, since each one adds tens of milliseconds to every slider move at a million steps) and ``training`` (a
    ``LiveTrainer``; ``live=False`` leaves it out). ``gradients`` default to the weight
    gradients of the course's seeded 12-layer MLP (``ampviz.training.model_gradients``, as in
    notebook 02). With either of those, the app sets torch to one intra-op thread, as the
    notebooks' setup cells do.

    A figure drawn while its tab is hidden has no width to size itself to, so selecting a tab
    draws its figure again (``refresh_tab``); the live training figure, a streaming FigureWidget,
    keeps plotly's default width of 700 px instead. ``tabs`` is the ``ipywidgets.Tab``; ``explorers``
    lists the explorers in tab order.
    """

    TITLES = ("Formats", "Ranges", "Loss scaling", "Live training")
    INTRO = ("<i>Formats</i>: click bits or type a number and see what fp16, bf16, fp8 or tf32 store. "
             "<i>Ranges</i>: slide the loss scale and watch real gradients leave the underflow band. "
             "<i>Loss scaling</i>: a dynamic loss scaler on a million steps; compare it with other frameworks'. "
             "<i>Live training</i>: train a small model in several precisions at once and steer its scaler.")

    def __init__(self, *, gradients=None, steps=1_000_000, live=True, seed=0, overlay=()):
        if live or gradients is None:
            import torch

            # the app's kernel is its own: one intra-op thread, as in the notebooks' setup cells.
            # The tiny models train several times faster so on a small machine (JupyterLab on 2
            # cores: 45 steps/s with torch's default 2 threads, 220 with 1), and the gradients
            # are notebook 02's to the bit (a float sum depends on the thread count)
            torch.set_num_threads(1)
        if gradients is None:
            from ampviz.beam import gradients as beam_gradients  # torch: only when the app needs real gradients
            gradients = beam_gradients(seed).all
        self.gradients = np.asarray(gradients, dtype=np.float32)
        self.formats = FormatExplorer("fp16", value=0.1)
        # up to 2^36: past the largest safe scale of the default gradients (2^33)
        self.ranges = RangeExplorer(self.gradients, fmt="fp16", log2_scale=0, log2_scale_range=(-16, 36))
        self.scaling = ScalerLab(steps=steps, scenario="spikes", strength=0.5, gradients=self.gradients,
                                 seed=seed, overlay=overlay)
        # the beam model: fp32 and fp16+scaler learn, fp16 alone stalls (ampviz.beam)
        self.training = LiveTrainer(modes=("fp32", "fp16", "fp16+scaler"), model="beam", steps=300,
                                    seed=seed) if live else None
        self.explorers = [e for e in (self.formats, self.ranges, self.scaling, self.training) if e is not None]
        titles = list(self.TITLES[:len(self.explorers)])
        self.tabs = W.Tab(children=[e.ui for e in self.explorers], titles=titles)
        self.tabs.add_class("ampviz-explorer-tabs")
        self.tabs.observe(self._on_tab, names="selected_index")
        self.intro = W.HTML(value=self.INTRO)
        self.intro.add_class("ampviz-explorer-intro")
        self.ui = W.VBox([self.intro, self.tabs])
        self.ui.add_class("ampviz-explorer-app")

    def refresh_tab(self, index: int | None = None) -> None:
        """Draw the figure of tab ``index`` (default: the selected one) again, now that it has a width."""
        index = self.tabs.selected_index if index is None else index
        if index is None or not 0 <= index < len(self.explorers):
            return
        explorer = self.explorers[index]
        # LiveTrainer streams into a FigureWidget, which is not redrawn: its view keeps the width
        # it got when first shown (plotly's 700 px when that happened in a hidden tab)
        if not isinstance(explorer, LiveTrainer) and explorer.figure is not None:
            explorer._draw(explorer.figure)

    def _on_tab(self, change) -> None:
        try:
            self.refresh_tab(change["new"])
        except Exception as exc:  # shown in that explorer's message line, never a traceback
            self.explorers[change["new"]]._show_error(exc)

    def _repr_mimebundle_(self, **kwargs):
        return self.ui._repr_mimebundle_(**kwargs)
