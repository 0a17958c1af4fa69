"""RangeExplorer: a census of values under a loss scale.

What it shows at a format and a scale is computed by this module's functions, over plain
settings: ``binade_extent``, ``figure_x_range``, ``census_figure``, ``scale_label`` and
``readout_html``. RangeExplorer and ``BrowserRangeExplorer`` both call them."""

from __future__ import annotations

import html

import ipywidgets as W

from ampviz.formats.census import Profile, census, profile
from ampviz.widgets.figureview import FigureView
from ampviz.formats import CATEGORIES, get_format

from ampviz.plots import (
    BAND_CATEGORIES,
    BAND_OPACITY,
    CATEGORY_COLORS,
    _count_label,
    census_x_range,
    format_pow2,
    format_share,
    plot_census,
)
from ampviz.plots.census import SMALL_BAR_KEY

from ampviz.widgets.base import _Explorer, _shown, _whole

#: The explorer; the module's functions compute what it shows for it and its page twin
#: (``BrowserRangeExplorer``), not an API of their own.
__all__ = ["RangeExplorer"]


def _swatch(category: str) -> str:
    """A band's colour as the census figure fills it (its colour at the bands' opacity)."""
    return (f'<span class="ampviz-swatch" style="display:inline-block;width:0.9em;height:0.9em;'
            f'margin-right:0.3em;vertical-align:-0.1em;background:{CATEGORY_COLORS[category]};'
            f'opacity:{BAND_OPACITY}"></span>')


# ----- what the explorer shows, over plain settings -----
def binade_extent(prof: Profile, fmt) -> tuple[int, int] | None:
    """(lowest, highest) log2 bin of the values unscaled, as a census in ``fmt`` at scale 1 bins
    them; None when there are none."""
    bins = census(prof, fmt, 1.0).log2_bins
    return (int(bins.min()), int(bins.max())) if len(bins) else None


def figure_x_range(fmt, extent: tuple[int, int] | None, log2_lo: int, log2_hi: int) -> tuple[int, int]:
    """The figure's x range: the format's window and every bin the scales ``2**log2_lo`` to
    ``2**log2_hi`` move the values' binades (``extent``, from ``binade_extent``) to."""
    if extent is None:
        return census_x_range(fmt)
    lo, hi = extent
    return census_x_range(fmt, lo + log2_lo, hi + log2_hi)


def census_figure(result, fmt_name: str, x_range: tuple[int, int]):
    """The figure of a census: no legend and no shares line (the readout is its key), and a title
    that does not name the scale (the label beside the slider does)."""
    return plot_census(result, x_range=x_range, legend=False, shares=False,
                       title=f"{_count_label(result.total)} × the scale above, in {fmt_name}")


#: log2 of the scales a census can take: every power of two that float32 holds
LOG2_LIMITS = (-149, 127)


def slider_span(log2_scale, log2_scale_range) -> tuple[int, int, int]:
    """The scale and the slider's ends, checked: (log2_scale, lo, hi), whole numbers within
    ``LOG2_LIMITS``, the range ``log2_scale_range`` widened to hold ``log2_scale``."""
    log2_scale = _whole("log2_scale", log2_scale, *LOG2_LIMITS)
    try:
        lo_given, hi_given = log2_scale_range
    except (TypeError, ValueError):
        raise TypeError(f"log2_scale_range must be two whole numbers (lowest, highest), got "
                        f"{_shown(log2_scale_range)}") from None
    lo_given = _whole("log2_scale_range[0]", lo_given, *LOG2_LIMITS)
    hi_given = _whole("log2_scale_range[1]", hi_given, *LOG2_LIMITS)
    if lo_given > hi_given:
        raise ValueError(f"log2_scale_range must be (lowest, highest), got {_shown(log2_scale_range)}")
    return log2_scale, min(lo_given, log2_scale), max(hi_given, log2_scale)


def scale_label(log2_scale: int) -> str:
    """The label beside the slider: "scale = 2^3 = 8"."""
    return f"scale = {html.escape(format_pow2(2.0 ** int(log2_scale)))}"


def readout_html(result) -> str:
    """The readout of a census: each band's name after a swatch of its colour (the figure has no
    legend: this is its key), its share and count, and what the triangles on the axis mark."""
    r = result
    shown = [k for k in CATEGORIES if k in BAND_CATEGORIES or r.counts[k]]
    cells = "".join(
        f'<span style="margin-right:1.2em">{_swatch(k) if k in BAND_CATEGORIES else ""}'
        f'<b style="color:{CATEGORY_COLORS[k]}">{k}</b> '
        f"{format_share(r.fractions[k])} <small>({r.counts[k]:,})</small></span>"
        for k in shown
    )
    # the figure has no legend: the readout keys the marks on its axis too (always: a line that
    # came and went with them would move the figure under it while the scale moves)
    key = f'<div class="ampviz-census-marks"><small>▲ on the axis: {html.escape(SMALL_BAR_KEY)}</small></div>'
    return f"<div>{cells}<small>of {_count_label(r.total)}</small></div>{key}"


# ----- a census under a loss scale -----
class RangeExplorer(_Explorer):
    """Where a set of gradients lands in a low-precision format as the loss scale changes.

    Controls: ``scale_slider`` (an IntSlider for log2 of the scale; CSS class
    ``ampviz-scale-slider``) and ``format_dropdown`` (fp16, bf16, fp8_e4m3, fp8_e5m2). On every
    change it takes ``census(profile, fmt, 2**k)``, keeps it as ``.result``, writes the shares into
    ``readout`` and draws ``plot_census`` into ``output`` (kept as ``.figure``). The x axis stays
    fixed while the scale moves (it changes only with the format). The figure has no legend and no
    shares line, and its title does not name the scale: the readout is its key, each band's name
    after a swatch of its colour, with the shares and what the triangles on the axis mark (a bar
    too short to see), and the label beside the slider names the scale.
    So a scale move changes only the figure's points (unless the tallest bar changes), and the
    browser moves the bars instead of redrawing the figure.
    """

    FORMAT_CHOICES = ("fp16", "bf16", "fp8_e4m3", "fp8_e5m2")
    #: log2 of the scales a census can take (the module's LOG2_LIMITS)
    LOG2_LIMITS = LOG2_LIMITS

    def __init__(self, values, fmt="fp16", log2_scale=0, log2_scale_range=(-16, 32)):
        self._init_common()
        name = get_format(fmt).name
        if name not in self.FORMAT_CHOICES:
            raise ValueError(f"RangeExplorer shows {', '.join(self.FORMAT_CHOICES)}; got {name!r}")
        self.profile = values if isinstance(values, Profile) else profile(values)
        self.result = None
        # lowest and highest binade of the unscaled values; the slider shifts them by k
        self._bin_extent = binade_extent(self.profile, name)

        log2_scale, lo, hi = slider_span(log2_scale, log2_scale_range)
        self.scale_slider = W.IntSlider(
            value=int(log2_scale), min=lo, max=hi, step=1, description="log2 scale",
            layout=W.Layout(width="420px"),
        )
        self.scale_slider.add_class("ampviz-scale-slider")
        self.scale_label = W.HTML()
        self.scale_label.add_class("ampviz-scale-label")
        self.format_dropdown = W.Dropdown(options=list(self.FORMAT_CHOICES), value=name, description="format")
        self.format_dropdown.add_class("ampviz-format-dropdown")
        self.readout = W.HTML()
        self.readout.add_class("ampviz-census-readout")
        self.view.add_class("ampviz-census-figure")

        self.scale_slider.observe(self._on_change, names="value")
        self.format_dropdown.observe(self._on_change, names="value")

        self.ui = W.VBox(
            [
                W.HBox([self.scale_slider, self.scale_label], layout=W.Layout(flex_flow="row wrap")),
                self.format_dropdown,
                self.message,
                self.readout,
                self.view,
            ]
        )
        self.ui.add_class("ampviz-range-explorer")
        self.update()

    @property
    def scale(self) -> float:
        return 2.0 ** self.scale_slider.value

    @property
    def fmt(self):
        return get_format(self.format_dropdown.value)

    def x_range(self) -> tuple[int, int]:
        """The figure's x range: the format's window and every bin the slider can reach."""
        return figure_x_range(self.fmt, self._bin_extent, self.scale_slider.min, self.scale_slider.max)

    #: How many drawn positions are kept (the recent ones and the slider's next ones).
    KEPT_DRAWN = 8

    def _on_change(self, change):
        self._note_move(change, ((self.scale_slider, "log2_scale"),))
        self._request_update(change)  # at once from Python; coalesced from the browser

    def _drawn(self, log2_scale: int | None = None) -> tuple:
        """(census, scale label, readout, figure, prepared figure) at a slider position (the
        slider's own by default) and the dropdown's format, kept for reuse."""
        log2_scale = self.scale_slider.value if log2_scale is None else log2_scale
        name = self.format_dropdown.value
        key = (int(log2_scale), name, self.x_range())
        if (state := self._kept_state(key)) is not None:
            return state
        result = census(self.profile, name, 2.0 ** int(log2_scale))
        # the readout names the bands and prints the shares, the label beside the slider the
        # scale: the layout stays while the scale moves, and FigureView moves the bars instead of
        # redrawing the figure
        fig = census_figure(result, name, key[2])
        state = (result, scale_label(log2_scale), readout_html(result), fig, FigureView.prepare(fig))
        return self._keep_state(key, state, self.KEPT_DRAWN)

    def update(self) -> None:
        """Census at the slider's scale and the dropdown's format, then redraw."""
        self.result, label, readout, fig, prepared = self._drawn()
        self._draw(fig, prepared)
        self.scale_label.value = label
        self.readout.value = readout
        self._clear_error()
