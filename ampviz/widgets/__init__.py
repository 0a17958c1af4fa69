"""Explorers: small ipywidgets classes over the core.

Each explorer keeps its state on the instance (so a notebook or a test can read it), builds its
controls once, and answers every change with a three-step adapter: read the controls, ask the
core (``ampviz.formats``, ``ampviz.formats.census``, ``ampviz.scaling``, ``ampviz.ranks``, ``ampviz.formats.blocks``,
``ampviz.formats.fp8``), redraw (a figure
from ``ampviz.plots``, sent to the explorer's ``FigureView`` in place). The last figure is also kept as
``.figure``.

An error inside a callback (text that is not a number, a bit pattern out of range) is shown in
the explorer's message line and kept as ``.error``; it never escapes as a traceback.

Show an explorer by making it the last expression of a cell, or with ``display(explorer)``.

``BrowserFormatExplorer``, ``BrowserRangeExplorer``, ``BrowserScalerLab``,
``BrowserFp8ScalingLab`` and ``BrowserBlockExplorer`` are those explorers computed by the page itself (``ampviz.widgets.browser_*``): no kernel round trip per move, and they run on the
course's static site with no kernel at all.

The view is a package, one module per explorer on a shared base (``ampviz.widgets.base``); this
module gathers them, so ``from ampviz.widgets import ScalerLab`` works as before.
"""

from ampviz.widgets.app import ExplorerApp
from ampviz.widgets.base import parse_number
from ampviz.widgets.block_explorer import BlockExplorer
from ampviz.widgets.browser_block_explorer import BrowserBlockExplorer
from ampviz.widgets.browser_format_explorer import BrowserFormatExplorer
from ampviz.widgets.browser_fp8_lab import BrowserFp8ScalingLab
from ampviz.widgets.browser_range_explorer import BrowserRangeExplorer
from ampviz.widgets.browser_scaler_lab import BrowserScalerLab
from ampviz.widgets.format_explorer import FormatExplorer
from ampviz.widgets.fp8_lab import Fp8ScalingLab
from ampviz.widgets.live_trainer import LiveTrainer, running_trainers
from ampviz.widgets.range_explorer import RangeExplorer
from ampviz.widgets.ranks_lab import RanksLab
from ampviz.widgets.scaler_lab import ScalerLab

__all__ = ["BlockExplorer", "BrowserBlockExplorer", "BrowserFormatExplorer", "BrowserFp8ScalingLab", "BrowserRangeExplorer", "BrowserScalerLab", "ExplorerApp", "FormatExplorer", "Fp8ScalingLab", "LiveTrainer", "RangeExplorer",
           "RanksLab", "ScalerLab", "parse_number", "running_trainers"]
