"""What the five page-computed explorers share (``BrowserScalerLab``, ``BrowserFormatExplorer``,
``BrowserRangeExplorer``, ``BrowserFp8ScalingLab``, ``BrowserBlockExplorer``).

Each is an anywidget whose front end (``js/<name>_view.mjs``) computes in the page: its ``_esm`` is
that module bundled (``jsbundle.bundle``), it answers the page's request for plotly.js
(``answer_plotly_request``), and it ships numpy arrays as base64 text. ``_PageExplorer`` holds
those; ``_TemplatedPageExplorer`` adds the ``template`` and ``config`` the page builds its figure
with, for the explorers whose front end takes them from the state. ``_Setting`` is the trait type
of a setting that the explorer checks itself, in its kernel twin's words. What each page shows,
Python computes with the kernel explorer's module-level functions.
"""

from __future__ import annotations

import base64
from collections import OrderedDict

import anywidget
import numpy as np
import plotly.io as pio
import traitlets

from ampviz.plots.style import _template, figure_config
from ampviz.widgets.base import _Explorer
from ampviz.widgets.figureview import answer_plotly_request
from ampviz.widgets.jsbundle import bundle


def b64(a, dtype=None) -> str:
    """The array ``a``'s bytes, little-endian, as base64 text: in ``dtype`` when given (float32
    for values the page casts itself), else in ``a``'s own dtype."""
    a = np.asarray(a)
    return base64.b64encode(np.ascontiguousarray(a, dtype=np.dtype(dtype or a.dtype).newbyteorder("<"))
                            .tobytes()).decode()


class _Setting(traitlets.Any):
    """A setting that takes any value, None included, to the explorer's own check (its kernel
    twin's, in its words: a FloatFormat held by its name, 4.0 as 4); traitlets' Any lets None
    through unchecked."""

    allow_none = False


class _PageExplorer(anywidget.AnyWidget):
    """An explorer computed in the page: its front end is ``FRONT_END`` (a module of ``js/``,
    bundled with the modules it imports into ``_esm``), and plotly.js is sent once per page, to
    the first view that asks. A subclass checks its arguments, then calls ``super().__init__()``
    and sets its state."""

    _esm = traitlets.Unicode().tag(sync=True)

    #: The front end's module in ``js/`` (without ``.mjs``).
    FRONT_END: str = ""
    #: How many computed states (``_kept``) are kept for reuse.
    KEPT = 16

    def __init__(self, **kwargs):
        super().__init__(_esm=bundle(self.FRONT_END), **kwargs)
        self.on_msg(answer_plotly_request)  # plotly.js, sent once per page to the first view that asks
        self._kept_states: OrderedDict = OrderedDict()

    def _kept(self, key, make):
        """What ``make()`` computes for ``key`` (hashable: the settings it depends on), kept for
        reuse; only the ``KEPT`` most recently used are kept."""
        return _Explorer._recent(self._kept_states, key, make, self.KEPT)


class _TemplatedPageExplorer(_PageExplorer):
    """A page explorer whose front end builds its figure with plotly's template and config taken
    from the state (``template``, ``config``); ``_set_figure_style()`` sets them."""

    #: plotly's template the figure names (plotly.py fills it in; the page puts it in the layout).
    template = traitlets.Dict(read_only=True).tag(sync=True)
    #: The figure's plotly.js config: ``figure_config()``.
    config = traitlets.Dict(read_only=True).tag(sync=True)

    #: The template's name; None: plotly's default when the explorer is made (as a figure that
    #: names none takes it).
    TEMPLATE: str | None = None

    def _set_figure_style(self) -> None:
        self.set_trait("template", _template(self.TEMPLATE or pio.templates.default))
        self.set_trait("config", figure_config())
