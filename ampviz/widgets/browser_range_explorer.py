"""BrowserRangeExplorer: RangeExplorer computed in the browser, with no kernel round trip per move.

The page gets the values (float32, base64) once, and at every scale the slider reaches takes the
census that ``ampviz.formats.census.census`` takes (``js/range_explorer_view.mjs``: the magnitudes
sorted once, then a few binary searches that cast values as ``js/census.mjs`` does), and writes
the readout and draws the figure RangeExplorer shows (``js/censusplot.mjs``: ``plot_census`` and
RangeExplorer's readout and scale label, bit for bit with the package). A drag repaints at every
position. Python holds the settings as synced state (``fmt``, ``log2_scale``); ``result``,
``scale_label()``, ``readout_html()``, ``figure()`` and ``x_range()`` compute, with the package and
the functions RangeExplorer draws with (``range_explorer``'s ``census_figure``, ``scale_label``,
``readout_html``, ``figure_x_range``), what the page shows for them.

The same front end runs on a static page with no kernel: it needs only the state.
"""

from __future__ import annotations

import traitlets

from ampviz.formats import get_format
from ampviz.formats.census import Profile, census, profile
from ampviz.widgets.base import _whole
from ampviz.widgets.browser_base import _Setting, _TemplatedPageExplorer, b64
from ampviz.widgets.range_explorer import (RangeExplorer, binade_extent, census_figure, figure_x_range, readout_html,
                                           scale_label, slider_span)

__all__ = ["BrowserRangeExplorer"]


class BrowserRangeExplorer(_TemplatedPageExplorer):
    """RangeExplorer's controls, readout and figure, computed by the page (see the module's docstring).

    ``BrowserRangeExplorer(values, fmt="fp16", log2_scale=0, log2_scale_range=(-16, 32))`` takes
    RangeExplorer's arguments (and raises its errors). The page has a scale slider over the whole
    powers of two from ``2**lo`` to ``2**hi`` (``log2_scale_range``, widened to hold
    ``log2_scale``) and a format dropdown (fp16, bf16, fp8_e4m3, fp8_e5m2). Assigning
    ``explorer.log2_scale = 8`` or ``explorer.fmt = "bf16"`` moves the page's control and redraws
    there; a log2 scale outside the slider's ends is refused.
    """

    FRONT_END = "range_explorer_view"
    TEMPLATE = "plotly_white"

    fmt = _Setting("fp16").tag(sync=True)
    log2_scale = _Setting(0).tag(sync=True)

    #: The values, float32 little-endian, in base64.
    values = traitlets.Unicode(read_only=True).tag(sync=True)
    log2_scale_min = traitlets.Int(read_only=True).tag(sync=True)
    log2_scale_max = traitlets.Int(read_only=True).tag(sync=True)
    formats = traitlets.List(read_only=True).tag(sync=True)

    FORMAT_CHOICES = RangeExplorer.FORMAT_CHOICES
    LOG2_LIMITS = RangeExplorer.LOG2_LIMITS
    #: The most values the page is sent (8 MB of float32).
    MAX_VALUES = 2_000_000

    def __init__(self, values, fmt="fp16", log2_scale=0, log2_scale_range=(-16, 32)):
        # RangeExplorer's own checks, in its order and words: the same arguments give the same errors
        name = self._format_name(fmt)
        prof = values if isinstance(values, Profile) else profile(values)
        if prof.total > self.MAX_VALUES:
            raise ValueError(f"values must be at most {self.MAX_VALUES:,} here (the page receives 4 bytes per value); "
                             f"RangeExplorer, computed by the kernel, takes more; got {prof.total:,}")
        log2_scale, lo, hi = slider_span(log2_scale, log2_scale_range)
        super().__init__()
        self.profile = prof
        # lowest and highest binade of the unscaled values (RangeExplorer's, taken as it takes it)
        self._bin_extent = binade_extent(prof, self.FORMAT_CHOICES[0])
        with self.hold_trait_notifications():
            self.set_trait("values", b64(prof.values, "<f4"))
            self.set_trait("log2_scale_min", lo)
            self.set_trait("log2_scale_max", hi)
            self.set_trait("formats", list(self.FORMAT_CHOICES))
            self._set_figure_style()
            self.fmt = name
            self.log2_scale = log2_scale

    @classmethod
    def _format_name(cls, fmt) -> str:
        name = get_format(fmt).name
        if name not in cls.FORMAT_CHOICES:
            raise ValueError(f"RangeExplorer shows {', '.join(cls.FORMAT_CHOICES)}; got {name!r}")
        return name

    # ----- every setting checked, in RangeExplorer's words -----
    @traitlets.validate("fmt")
    def _valid_fmt(self, proposal):
        try:
            return self._format_name(proposal["value"])
        except (TypeError, ValueError) as e:
            raise traitlets.TraitError(str(e)) from None

    @traitlets.validate("log2_scale")
    def _valid_log2_scale(self, proposal):
        try:
            return _whole("log2_scale", proposal["value"], self.log2_scale_min, self.log2_scale_max)
        except (TypeError, ValueError) as e:
            raise traitlets.TraitError(str(e)) from None

    # ----- what the page shows, computed by the package -----
    @property
    def scale(self) -> float:
        return 2.0 ** self.log2_scale

    @property
    def result(self):
        """The census at the settings: ``census(profile, fmt, 2**log2_scale)``, as RangeExplorer takes it."""
        return census(self.profile, self.fmt, self.scale)

    def scale_label(self) -> str:
        """The label beside the slider, as RangeExplorer writes it: "scale = 2^0 = 1"."""
        return scale_label(self.log2_scale)

    def readout_html(self) -> str:
        """The readout, as RangeExplorer writes it (of ``result``: no figure made)."""
        return readout_html(self.result)

    def figure(self):
        """The figure the page draws, as RangeExplorer draws it."""
        return self._kept((self.fmt, self.log2_scale),
                          lambda: census_figure(self.result, self.fmt, self.x_range()))

    def x_range(self) -> tuple[int, int]:
        """The figure's x range: the format's window and every bin the slider can reach."""
        return figure_x_range(get_format(self.fmt), self._bin_extent, self.log2_scale_min, self.log2_scale_max)
