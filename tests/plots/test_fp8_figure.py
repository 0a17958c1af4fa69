"""plot_fp8_scaling read from its JSON: every series drawn inside its axis, above the share axis's
lowest labelled tick (a lone step's tick below it read as drawn under the axis), and every series in
a colour of its own, none two alike (three blues once told the boundary, the underflowed and the
subnormal shares apart badly)."""

import itertools
import math

import numpy as np
import pytest

from ampviz.formats.fp8 import simulate_fp8_scaling, tensor_stream
from ampviz.plots import FP8_COLORS, plot_fp8_scaling
from ampviz.plots import style


def lesson_figure():
    """Lesson 12's figure: delayed scaling, max over 16 steps, on the synthetic stream."""
    return plot_fp8_scaling(simulate_fp8_scaling(tensor_stream(2000, 4096, seed=0), history_len=16))


def axis_of(trace) -> str:
    return {None: "yaxis", "y": "yaxis", "y2": "yaxis2", "y3": "yaxis3"}[trace.yaxis]


def colour_of(trace) -> str:
    return trace.line.color if trace.mode == "lines" else trace.marker.color


def lab(hex_colour: str) -> np.ndarray:
    """CIELAB (D65) of an sRGB colour "#RRGGBB"."""
    rgb = np.array([int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ linear
    xyz /= np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > 216 / 24389, np.cbrt(xyz), (24389 / 27 * xyz + 16) / 116)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def figures():
    """The lesson's figure, and runs whose lone ticks sit on one value: every size from 1 value to
    50,000, delayed and current, with inf and NaN steps (their marks at the top of the value panel)."""
    yield lesson_figure()
    for size in (1, 3, 40, 999, 4096, 50_000):
        s = tensor_stream(300, size, seed=size, wander=0.3, spike_prob=0.03, inf_prob=0.01, nan_prob=0.01)
        yield plot_fp8_scaling(simulate_fp8_scaling(s, history_len=8))
        yield plot_fp8_scaling(simulate_fp8_scaling(s, algo="most_recent", margin=-2))
        yield plot_fp8_scaling(simulate_fp8_scaling(s, "current", fmt="fp8_e5m2"))


def test_no_point_lies_outside_its_axis_or_below_the_lowest_labelled_share():
    """Every finite y of every trace lies within its axis's range; on the share axis (log10 of a
    percent), also at or above its lowest labelled power of ten, lone ticks included. Before, one
    saturated value in 4,096 (0.024%) was drawn under the lowest label (0.1%), where it looked like a
    mark under the step axis."""
    lone_seen = 0
    for fig in figures():
        layout = fig.layout
        for t in fig.data:
            axis = getattr(layout, axis_of(t))
            y = np.asarray(t.y, np.float64)
            y = y[np.isfinite(y)]
            lo, hi = axis.range
            assert ((y >= lo) & (y <= hi)).all(), (t.meta["kind"], y.min(), y.max(), lo, hi)
            if axis_of(t) == "yaxis3":
                assert (y >= min(axis.tickvals)).all(), (t.meta["kind"], y.min(), list(axis.tickvals))
                x = np.asarray(t.x)
                lone_seen += int((np.bincount(x) == 2).sum())
        assert layout.xaxis.anchor == "y3"  # the step axis runs under the share panel
        share = layout.yaxis3
        size = layout.meta["size"]
        assert min(share.tickvals) < math.log10(100.0 / size) - 0.3  # a decade mark below one value's share
    assert lone_seen > 20


def test_the_lesson_figures_lone_saturated_tick_sits_between_labelled_ticks():
    fig = lesson_figure()
    sat = next(t for t in fig.data if t.meta["kind"] == "saturated")
    x, y = np.asarray(sat.x), np.asarray(sat.y, np.float64)
    one = np.flatnonzero(np.asarray(sat.customdata) == 1)
    assert one.size == 2 and (x[one] == 1268).all()  # step 1268 saturates one value of 4,096
    assert list(fig.layout.yaxis3.tickvals) == [-2, -1, 0, 1, 2]
    assert (-2 < y[one]).all() and (y[one] < -1).all()  # between 0.01% and 0.1%


def test_every_series_has_a_colour_of_its_own_from_the_palette():
    """No two series share a colour or look alike: every two differ by at least 30 in CIELAB (the old
    blues: the boundary and the underflowed share the same, the subnormal 26 from them), and each
    colour is one of ``ampviz.plots.style``'s."""
    palette = {c.upper() for group in (style.CATEGORY_COLORS.values(), style.FIELD_COLORS.values(),
                                       style.TRACE_COLORS, style.PRESET_COLORS.values()) for c in group}
    assert {c.upper() for c in FP8_COLORS.values()} <= palette
    assert len(set(FP8_COLORS.values())) == len(FP8_COLORS)
    for (a, ca), (b, cb) in itertools.combinations(FP8_COLORS.items(), 2):
        assert np.linalg.norm(lab(ca) - lab(cb)) >= 30, (a, b)
    s = tensor_stream(400, 512, seed=1, inf_prob=0.01)
    for fig in (lesson_figure(), plot_fp8_scaling(simulate_fp8_scaling(s, history_len=16))):
        colours = {t.meta["kind"]: colour_of(t) for t in fig.data}
        assert colours == {k: FP8_COLORS[k] for k in colours}
        assert len(set(colours.values())) == len(colours)
    assert "nonfinite" in colours and len(colours) == 8


@pytest.mark.parametrize("old", [("#0072B2", "#0072B2"), ("#0072B2", "#56B4E9")])
def test_the_colour_test_sees_the_old_blues(old):
    assert np.linalg.norm(lab(old[0]) - lab(old[1])) < 30
