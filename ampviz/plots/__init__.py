"""Figures: data in, ``plotly.graph_objects.Figure`` out.

Every ``plot_*`` function is pure: it reads a format (``ampviz.formats``) or a census
(``ampviz.formats.census``) and returns a new figure, so notebooks can show it, tests can assert on
``fig.data`` / ``fig.layout``, and explorers can redraw it on every change.

Magnitudes are drawn on a log2 axis: x = log2 |value|, so one unit is one binade [2^e, 2^(e+1)).
A format's window is split into the bands that ``FloatFormat.classify`` sorts values into, with
edges taken from the format's own constants:

* underflow: 0 < |x| <= ``underflow_boundary`` (half the smallest subnormal) becomes 0;
* subnormal: ``underflow_boundary`` < |x| < ``smallest_normal`` (stored with fewer bits);
* normal: ``smallest_normal`` <= |x| < ``overflow_boundary`` (values above ``max`` round down to it);
* overflow: |x| >= ``overflow_boundary`` becomes inf (in an "fn" format such as fp8 E4M3 only
  values above the boundary overflow, and torch's cast saturates them to ``max``; ml_dtypes' cast
  gives NaN). The figures write in the band what happens there ("becomes inf", "saturates to 448").

Colours are fixed per category (``CATEGORY_COLORS``) and per bit field (``FIELD_COLORS``).

Where each figure lives (one module per topic; this package only re-exports their public names):

* ``style``: colours per category, bit field, overlaid line and scaler preset, the heat map's colour
  scale, the config every figure is shown with (``FIGURE_CONFIG``, ``Figure``), and the quick
  figure builder;
* ``arguments``: argument checks shared by the figures (a value in a message, a title, a census);
* ``text``: numbers as text (``format_number``, ``format_pow2``, ``format_share``, ``format_shares``);
* ``formats``: a format's bands (``band_edges``, ``plot_format_ranges``) and one value (``plot_value``);
* ``census``: a census over a format's bands (``plot_census``, ``census_x_range``);
* ``axes``: long series made short and their axes (log2 of scales, thinning, ranges, ticks);
* ``scaling``: loss-scale traces (``plot_scale_trace``);
* ``live``: live training (``plot_live``, ``live_traces``, ``lost_shares``, ``heat_mode_of``);
* ``lost``: updates a low-precision weight loses (``plot_lost_band``);
* ``ranks``: loss scales across ranks (``plot_ranks``);
* ``blocks``: MX and NVFP4 block scaling (``plot_blocks``);
* ``fp8``: FP8 per-tensor scaling over a stream of tensors (``plot_fp8_scaling``) and training losses
  side by side (``plot_loss_curves``).
"""

from __future__ import annotations

# Re-exported from the modules below: the public API (``__all__``) and the private helpers the
# explorers and tests use.
from ampviz.plots.style import (BAND_CATEGORIES, BAND_OPACITY, CATEGORY_COLORS, FIELD_COLORS, FIGURE_CONFIG,
    LOST_COLORSCALE, PRESET_COLORS, Figure, scaler_colors)
from ampviz.plots.text import format_number, format_pow2, format_share, format_shares
from ampviz.plots.formats import DEFAULT_RANGE_FORMATS, band_edges, plot_format_ranges, plot_value
from ampviz.plots.census import _count_label, census_x_range, plot_census
from ampviz.plots.axes import _changes, _marked_part, _padded_range, _share_top, _thin
from ampviz.plots.scaling import LINE_POINTS, _skipped_marks, plot_scale_trace
from ampviz.plots.live import (HEAT_LABEL_CHARS, HEAT_MODE_ORDER, LIVE_DATA_KEYS, _short_names, heat_mode_of,
    live_traces, lost_shares, plot_live)
from ampviz.plots.lost import plot_lost_band
from ampviz.plots.ranks import RANK_MARKS, plot_ranks
from ampviz.plots.blocks import BLOCK_COLORS, plot_blocks
from ampviz.plots.fp8 import FP8_COLORS, _run_ends, plot_fp8_scaling, plot_loss_curves

__all__ = [
    "BAND_CATEGORIES",
    "BAND_OPACITY",
    "CATEGORY_COLORS",
    "DEFAULT_RANGE_FORMATS",
    "FIELD_COLORS",
    "FIGURE_CONFIG",
    "Figure",
    "LOST_COLORSCALE",
    "PRESET_COLORS",
    "HEAT_MODE_ORDER",
    "LINE_POINTS",
    "LIVE_DATA_KEYS",
    "band_edges",
    "census_x_range",
    "format_number",
    "format_pow2",
    "format_shares",
    "format_share",
    "heat_mode_of",
    "live_traces",
    "lost_shares",
    "plot_census",
    "plot_format_ranges",
    "plot_live",
    "plot_lost_band",
    "plot_scale_trace",
    "plot_value",
    "plot_ranks",
    "BLOCK_COLORS",
    "plot_blocks",
    "FP8_COLORS",
    "plot_fp8_scaling",
    "plot_loss_curves",
]
