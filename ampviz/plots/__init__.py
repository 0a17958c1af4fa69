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

Where each figure lives (one module per topic; this package only re-exports their names):

* ``style``: colours per category, bit field and overlaid line, and the quick figure builder;
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
* ``fp8``: FP8 per-tensor scaling over a stream of tensors (``plot_fp8_scaling``).
"""

from __future__ import annotations

# Every name the one-file module had, private helpers too (explorers, notebooks and tests import
# some of them from here).
from ampviz.plots.style import (BAND_CATEGORIES, BAND_OPACITY, CATEGORY_COLORS, FIELD_COLORS, TRACE_COLORS,
                                _LABELS_AS_THEY_ARE, _LAYOUT_ARRAYS, _LINEAR, _WHITE, _WHITE_AXIS, _figure, _template)
from ampviz.plots.arguments import _census_result, _shown, _title
from ampviz.plots.text import _pow2_short, _power_text, format_number, format_pow2, format_share, format_shares
from ampviz.plots.formats import (DEFAULT_RANGE_FORMATS, _VALUE_MARK_Y, _band_hover, _band_traces, _distinct_texts,
                                  _has_subnormals, _landmark_trace, _log2_window, _past_max, _past_min, band_edges,
                                  plot_format_ranges, plot_value)
from ampviz.plots.census import _HEADROOM, _SMALL_BAR, _count_label, census_x_range, plot_census
from ampviz.plots.axes import (_LOG2_FLOOR, _changes, _finite_log2, _log2_scale, _log2_ticks, _marked_part,
                               _padded_range, _share_top, _thin)
from ampviz.plots.scaling import (LINE_POINTS, TRACE_DASHES, _LANE_PX, _envelope, _line_width, _scale_steps,
                                  _scaler_traces, _skipped_marks, _template_text, plot_scale_trace)
from ampviz.plots.live import (HEAT_COLUMNS, HEAT_LABEL_CHARS, HEAT_MODE_ORDER, LIVE_DATA_KEYS, _HEAT_DEFAULT_PX,
                               _HEAT_ROW_PX, _LIVE_MODE_COLORS, _live_geometry, _loss_note, _loss_width, _mode_color,
                               _records_of, _runs, _short_name, _short_names, _skipped_count, heat_mode_of,
                               live_traces, lost_shares, plot_live)
from ampviz.plots.lost import (_BAND_FILL, _BAND_LINE, _LOST_BAND_POINTS, _POINT_COLORS, _band_points, _band_weights,
                               _float, _positive_number, plot_lost_band)
from ampviz.plots.ranks import RANK_MARK_COLORS, RANK_MARKS, _RANK_POISON_FILL, _ranks_trace, plot_ranks
from ampviz.plots.blocks import BLOCK_COLORS, _block_element_format, _block_extents, _block_parts, plot_blocks
from ampviz.plots.fp8 import (FP8_COLORS, _FP8_PANELS, _FP8_SHARE_DOMAIN, _LONE_TICK_PX, _fp8_extents, _fp8_lines,
                              _fp8_trace, _log_percent_or_gap, _percent_decades, _run_ends, plot_fp8_scaling)

__all__ = [
    "BAND_CATEGORIES",
    "BAND_OPACITY",
    "CATEGORY_COLORS",
    "DEFAULT_RANGE_FORMATS",
    "FIELD_COLORS",
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
]
