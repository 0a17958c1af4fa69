"""Figure builders: band edges, bars and printed shares come from the core's own numbers."""

import json
import math
import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ampviz.formats.census import census, profile
from ampviz.formats import ALL_FORMATS, CATEGORIES, FORMATS, get_format
from ampviz.plots import (
    BAND_CATEGORIES,
    CATEGORY_COLORS,
    DEFAULT_RANGE_FORMATS,
    LINE_POINTS,
    band_edges,
    census_x_range,
    format_number,
    format_pow2,
    format_share,
    format_shares,
    live_traces,
    plot_census,
    plot_format_ranges,
    plot_live,
    plot_lost_band,
    plot_scale_trace,
    plot_value,
)
from ampviz.plots.census import SMALL_BAR_KEY
from ampviz.plots.formats import _past_max

# A few gradients spread over many binades, one exact zero, both signs.
TINY = np.array(
    [0.0, 2.0**-30, -(2.0**-27), 2.0**-25, 1.5 * 2.0**-20, 2.0**-14, -0.1, 1.0, 3.0, 2.0**15, 70000.0],
    dtype=np.float32,
)


def test_import_ampviz_stays_light():
    code = "import ampviz, sys; assert not {'plotly','ipywidgets','torch'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


# ----- numbers as text -----
@pytest.mark.parametrize(
    "x, text",
    [
        (2.0**-24, "2^-24 ≈ 5.96e-08"),
        (1.0, "2^0 = 1"),
        (0.5, "2^-1 = 0.5"),
        (-(2.0**-14), "-2^-14 ≈ -6.1e-05"),
        (get_format("fp16").max, "(2 - 2^-10)·2^15 = 65504"),
        (get_format("fp8_e4m3").max, "(2 - 2^-2)·2^8 = 448"),
        (0.0, "0"),
        (math.inf, "inf"),
        (math.nan, "nan"),
    ],
)
def test_format_pow2(x, text):
    assert format_pow2(x) == text


def test_format_pow2_falls_back_to_a_fractional_exponent():
    assert format_pow2(0.1) == f"0.1 ≈ 2^{math.log2(0.1):.2f}"


@pytest.mark.parametrize("fraction", [1e-9, 1e-5, 0.00042, 0.3123, 0.5, 0.99996, 1 - 1e-12])
def test_format_share_never_rounds_to_0_or_100(fraction):
    text = format_share(fraction)
    assert text not in ("0%", "100%")
    assert text.endswith("%")


def test_format_share_ends_and_digits():
    assert format_share(0) == "0%"
    assert format_share(1) == "100%"
    assert format_share(0.3123) == "31.2%"


def test_format_number():
    assert format_number(65504.0) == "65504"
    assert format_number(2.0**-24) == "5.96e-08"
    assert format_number(-math.inf) == "-inf"


# ----- bands -----
@pytest.mark.parametrize("name", FORMATS)
def test_band_edges_are_the_format_constants(name):
    fmt = FORMATS[name]
    edges = band_edges(fmt)
    assert edges["underflow"] == (0.0, fmt.underflow_boundary)
    assert edges["subnormal"] == (fmt.underflow_boundary, fmt.smallest_normal)
    assert edges["normal"] == (fmt.smallest_normal, fmt.overflow_boundary)
    assert edges["overflow"] == (fmt.overflow_boundary, math.inf)
    assert fmt.underflow_boundary < fmt.smallest_subnormal < fmt.smallest_normal < fmt.max < fmt.overflow_boundary


def _band_cases():
    for name in ALL_FORMATS:
        for cat in BAND_CATEGORIES:
            yield pytest.param(name, cat, id=f"{name}-{cat}")


@pytest.mark.parametrize("name, cat", _band_cases())
def test_band_interiors_classify_as_their_category(name, cat):
    """A magnitude inside each drawn band lands in that band's category in the core."""
    fmt = ALL_FORMATS[name]
    lo, hi = band_edges(fmt)[cat]
    if lo == hi:  # an empty band: E8M0 has no subnormals
        assert (name, cat) == ("e8m0", "subnormal")
        return
    if lo == 0:
        x = 2.0 ** (math.log2(hi) - 0.5)
    elif math.isinf(hi):
        x = 2.0 ** (math.log2(lo) + 0.5)
    else:
        x = 2.0 ** ((math.log2(lo) + math.log2(hi)) / 2)
    for v in (x, -x):
        assert CATEGORIES[int(fmt.classify_codes(v))] == cat


def test_plot_format_ranges_default_rows_and_band_edges():
    fig = plot_format_ranges()
    bands = {t.name: t for t in fig.data if t.name in BAND_CATEGORIES}
    assert set(bands) == set(BAND_CATEGORIES)
    lo_x, hi_x = fig.layout.xaxis.range
    for cat, trace in bands.items():
        assert list(trace.y) == list(DEFAULT_RANGE_FORMATS)
        assert trace.marker.color == CATEGORY_COLORS[cat]
        for name, base, width, custom in zip(trace.y, trace.base, trace.x, trace.customdata):
            fmt = FORMATS[name]
            lo, hi = band_edges(fmt)[cat]
            assert custom[0] == (lo if lo > 0 else None)
            assert custom[1] == (hi if math.isfinite(hi) else None)
            x0 = lo_x if lo == 0 else math.log2(lo)
            x1 = hi_x if math.isinf(hi) else math.log2(hi)
            assert base == pytest.approx(x0, abs=1e-12)
            assert base + width == pytest.approx(x1, abs=1e-9)
            assert lo_x < math.log2(fmt.underflow_boundary) and math.log2(fmt.overflow_boundary) < hi_x
    # fp16's subnormal band starts at 2**-25 and its normal band at 2**-14
    fp16 = list(DEFAULT_RANGE_FORMATS).index("fp16")
    assert bands["subnormal"].base[fp16] == -25
    assert bands["normal"].base[fp16] == -14


def test_plot_format_ranges_landmarks_and_hover():
    fig = plot_format_ranges(["fp16", "fp8_e4m3"])
    marks = [t for t in fig.data if t.type == "scatter"][0]
    points = dict(zip(marks.hovertext, marks.x))
    fp16 = get_format("fp16")
    assert points["fp16 smallest subnormal: 2^-24 ≈ 5.96e-08"] == math.log2(fp16.smallest_subnormal)
    assert points["fp16 max: (2 - 2^-10)·2^15 = 65504"] == math.log2(fp16.max)
    assert any("saturates to max = 448" in h for h in fig.data[3].hovertext)  # fp8_e4m3 has no inf
    assert any("becomes inf" in h for h in fig.data[3].hovertext)
    # a narrower view when only small formats are shown
    lo, hi = fig.layout.xaxis.range
    assert -40 <= lo < -25 and 16 < hi <= 30


def test_plot_format_ranges_accepts_format_objects_and_rejects_empty():
    fig = plot_format_ranges([get_format("bf16")])
    assert list(fig.data[0].y) == ["bf16"]
    with pytest.raises(ValueError):
        plot_format_ranges([])
    with pytest.raises(ValueError, match="unknown format"):
        plot_format_ranges(["fp12"])


# ----- census -----
def _bars(fig):
    return [t for t in fig.data if t.type == "bar"][0]


def _drawn_bars(fig) -> dict:
    """``{binade: (count, band)}`` as the band outlines draw the bars: each piece of a band's trace
    (between NaN gaps) must be one bar, foot, top, top, foot."""
    drawn = {}
    for t in fig.data:
        if t.meta["kind"] != "bars":
            continue
        x, y = np.asarray(t.x, np.float64), np.asarray(t.y, np.float64)
        assert x.shape == y.shape and (x.size == 0 or (x.size + 1) % 5 == 0)
        for px, py in zip(np.split(x, np.flatnonzero(np.isnan(x))), np.split(y, np.flatnonzero(np.isnan(y)))):
            px, py = px[~np.isnan(px)], py[~np.isnan(py)]
            if not px.size:
                continue
            left = px[0]
            assert list(px) == [left, left, left + 1, left + 1] and py[0] == py[3] == 0 and py[1] == py[2] > 0
            assert int(left) not in drawn  # each binade drawn once
            drawn[int(left)] = (int(py[1]), t.meta["band"])
    return drawn


def _annotation(fig, name):
    return [a for a in fig.layout.annotations if a.name == name][0]


@pytest.mark.parametrize("fmt", ["fp16", "bf16", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("scale", [1.0, 2.0**-8, 2.0**12])
def test_plot_census_bars_and_shares_match_census(fmt, scale):
    result = census(TINY, fmt, scale)
    fig = plot_census(TINY, fmt, scale)
    bars = _bars(fig)
    assert list(np.asarray(bars.x) - 0.5) == result.log2_bins.tolist()
    assert list(bars.y) == result.log2_counts.tolist()
    # the counts' bars carry the hover and show nothing; the band outlines draw the same bars
    assert bars.opacity == 0 and len(bars.hovertext) == len(bars.x)
    assert {e: c for e, (c, _) in _drawn_bars(fig).items()} == dict(zip(result.log2_bins.tolist(),
                                                                      result.log2_counts.tolist()))
    shares = _annotation(fig, "shares").text
    for cat in BAND_CATEGORIES:
        assert f"{cat} {format_share(result.fractions[cat])}" in shares
    assert "zero " in shares  # TINY holds one exact zero
    assert fig.layout.meta["counts"] == result.counts
    assert fig.layout.meta["fractions"] == pytest.approx(result.fractions)
    assert sum(fig.layout.meta["counts"].values()) == result.total == TINY.size


def test_plot_census_band_shapes_and_edge_labels():
    fmt = get_format("fp16")
    fig = plot_census(TINY, fmt)
    rects = {s.name: s for s in fig.layout.shapes if s.type == "rect"}
    lo_x, hi_x = fig.layout.xaxis.range
    assert rects["underflow"].x0 == lo_x and rects["underflow"].x1 == math.log2(fmt.underflow_boundary)
    assert rects["subnormal"].x0 == math.log2(fmt.underflow_boundary)
    assert rects["subnormal"].x1 == math.log2(fmt.smallest_normal)
    assert rects["normal"].x1 == math.log2(fmt.overflow_boundary)
    assert rects["overflow"].x0 == math.log2(fmt.overflow_boundary) and rects["overflow"].x1 == hi_x
    for cat in BAND_CATEGORIES:
        assert rects[cat].fillcolor == CATEGORY_COLORS[cat]
    lines = {s.name: s.x0 for s in fig.layout.shapes if s.type == "line"}
    assert lines == {
        "smallest_subnormal": math.log2(fmt.smallest_subnormal),
        "smallest_normal": math.log2(fmt.smallest_normal),
        "max": math.log2(fmt.max),
    }
    assert _annotation(fig, "smallest_subnormal").text.startswith("2^-24")
    assert _annotation(fig, "smallest_normal").text.startswith("2^-14")
    assert _annotation(fig, "max").text.startswith("65504")


def test_plot_census_legend_names_the_bands_or_is_left_out():
    """The legend keys the four bands; ``legend=False`` leaves it out (no band in a legend, none
    drawn) and keeps the same plot area, the bands, bars and labels; anything but a bool is one
    line."""
    with_legend, without = plot_census(TINY, "fp16"), plot_census(TINY, "fp16", legend=False)
    rects = lambda fig: [s for s in fig.layout.shapes if s.type == "rect"]  # noqa: E731
    assert [s.name for s in rects(with_legend) if s.showlegend] == list(BAND_CATEGORIES)
    assert with_legend.layout.showlegend is True
    assert not any(s.showlegend for s in rects(without)) and without.layout.showlegend is False
    area = lambda fig: fig.layout.height - fig.layout.margin.t - fig.layout.margin.b  # noqa: E731
    assert area(without) == area(with_legend) and without.layout.height < with_legend.layout.height
    keys = lambda fig: [t.name for t in fig.data if t.showlegend]  # noqa: E731
    assert keys(with_legend) == [SMALL_BAR_KEY] and keys(without) == []  # the marks under short bars, keyed
    strip = lambda fig: json.loads(fig.update_layout(showlegend=None, height=None, margin_b=None)  # noqa: E731
                                   .update_shapes(showlegend=None).update_traces(showlegend=None).to_json())
    assert strip(without) == strip(with_legend)  # nothing else differs
    for bad in (None, 1, "no", [False]):
        with pytest.raises(TypeError, match="legend must be True or False") as info:
            plot_census(TINY, "fp16", legend=bad)
        assert "\n" not in str(info.value)


def test_plot_census_shares_line_is_left_out_on_request():
    """``shares=False`` leaves out the shares line (and the counts of bands too small to see under
    it) and keeps the plot area; the shares stay in the layout's meta; anything but a bool is one
    line."""
    values = np.concatenate([np.full(1_000, 1.5), np.full(3, 2.0**-26)]).astype(np.float32)
    for legend in (True, False):
        shown, left_out = plot_census(values, "fp16", legend=legend), plot_census(values, "fp16", legend=legend,
                                                                                 shares=False)
        assert "underflow 3 values" in _annotation(shown, "shares").text
        assert [a.name for a in left_out.layout.annotations] == [a.name for a in shown.layout.annotations
                                                                 if a.name != "shares"]
        area = lambda fig: fig.layout.height - fig.layout.margin.t - fig.layout.margin.b  # noqa: E731
        assert area(left_out) == area(plot_census(np.ones(4, np.float32), "fp16", legend=legend))
        assert left_out.layout.meta == shown.layout.meta
        assert json.loads(left_out.to_json())["data"] == json.loads(shown.to_json())["data"]
    for bad in (None, 0, "yes", [True]):
        with pytest.raises(TypeError, match="shares must be True or False") as info:
            plot_census(TINY, "fp16", shares=bad)
        assert "\n" not in str(info.value)


def test_plot_census_accepts_result_profile_and_values_alike():
    result = census(TINY, "fp8_e5m2", 2.0**4)
    a = plot_census(result)
    b = plot_census(profile(TINY), "fp8_e5m2", 2.0**4)
    c = plot_census(TINY.tolist(), "fp8_e5m2", 16)
    assert a.to_json() == b.to_json() == c.to_json()
    assert "fp8_e5m2" in a.layout.title.text and "2^4 = 16" in a.layout.title.text


def test_plot_census_at_a_fixed_range_moves_with_the_scale():
    x_range = census_x_range("fp16", -40, 40)
    before = plot_census(TINY, "fp16", 1.0, x_range=x_range)
    after = plot_census(TINY, "fp16", 2.0**10, x_range=x_range)
    assert list(before.layout.xaxis.range) == list(after.layout.xaxis.range) == list(x_range)
    assert list(after.data[0].x) == list(census(TINY, "fp16", 2.0**10).log2_bins + 0.5)
    assert list(np.asarray(after.data[0].x) - 10) == list(before.data[0].x)
    assert _annotation(before, "shares").text != _annotation(after, "shares").text


def test_plot_census_default_range_holds_every_bar():
    fig = plot_census(TINY, "fp8_e4m3", 2.0**30)
    lo, hi = fig.layout.xaxis.range
    x = np.asarray(fig.data[0].x)
    assert lo <= x.min() - 0.5 and x.max() + 0.5 <= hi


def test_plot_census_fn_format_overflow_band_starts_at_its_boundary():
    fmt = get_format("fp8_e4m3")
    fig = plot_census(TINY, fmt)
    rects = {s.name: s for s in fig.layout.shapes if s.type == "rect"}
    assert rects["overflow"].x0 == math.log2(464.0) == math.log2(fmt.overflow_boundary)


def test_a_figure_changed_leaves_the_next_figures_template_as_plotly_has_it():
    """The figures share plotly's template as kept, not a copy each: a learner's change to one
    figure's template (in place, or a new one) reaches no other figure."""
    import plotly.io as pio

    want = pio.templates["plotly_white"].to_plotly_json()
    a = plot_value("fp16", 0.1)
    a.layout.template.layout.font.size = 99
    a.layout.template.layout.xaxis.gridcolor = "red"
    a.update_layout(template={"layout": {"paper_bgcolor": "red"}})
    b = plot_value("fp16", 0.1)
    assert b.layout.template.to_plotly_json() == want
    assert b.layout.template.layout.font.size is None and b.layout.paper_bgcolor is None


def test_figures_are_deterministic_and_carry_no_uids():
    for build in (lambda: plot_format_ranges(), lambda: plot_census(TINY), lambda: plot_value("fp16", 0.1, 0.1)):
        a, b = build().to_json(), build().to_json()
        assert a == b
        assert '"uid"' not in a


# ----- one value -----
def _zoom_points(fig):
    """The zoom's markers: {name: value}, the value as its hover writes it (repr: exact)."""
    return {t.name: float(t.hovertext[0].split(": ")[1]) for t in fig.data
            if getattr(t, "xaxis", None) == "x2" and t.name != "values"}


def _zoom_positions(fig):
    """The zoom's markers: {name: position}, in gaps from the stored value."""
    return {t.name: t.x[0] for t in fig.data if getattr(t, "xaxis", None) == "x2" and t.name != "values"}


def _zoom_values(fig):
    """The values written under the zoom's markers: {position: text}."""
    (values,) = [t for t in fig.data if t.name == "values"]
    return dict(zip(values.x, values.text))


def test_plot_value_zoom_shows_neighbours_stored_and_typed():
    fmt = get_format("fp16")
    fig = plot_value(fmt, 0.1, typed=0.1)
    below, above = fmt.neighbours(0.1)
    stored = float(fmt.quantize(0.1))
    assert _zoom_points(fig) == {"below": below, "stored": stored, "above": above, "typed": 0.1}
    # drawn in gaps from the stored value: the neighbours one gap (2^-14 here) either side
    gap = 2.0**-14
    assert above - stored == stored - below == gap
    assert _zoom_positions(fig) == {"below": -1.0, "stored": 0.0, "above": 1.0, "typed": (0.1 - stored) / gap}
    assert fig.layout.xaxis2.range == (-1.4, 1.4)
    # below a power of two the grid's spacing halves: the neighbour below sits half a gap away
    assert _zoom_positions(plot_value(fmt, 1.0)) == {"below": -0.5, "stored": 0.0, "above": 1.0}
    assert _zoom_positions(plot_value(fmt, 0.0)) == {"below": -1.0, "stored": 0.0, "above": 1.0}
    assert _zoom_positions(plot_value(fmt, fmt.max)) == {"below": -1.0, "stored": 0.0}
    # a typed number past a saturating format's max, far out: the range holds every point
    fig = plot_value("fp4_e2m1", 1000.0, typed=1000.0)
    lo, hi = fig.layout.xaxis2.range
    assert _zoom_positions(fig) == {"below": -1.0, "stored": 0.0, "typed": (1000.0 - 6.0) / 2.0}
    assert lo < -1.0 and hi > 497.0


@pytest.mark.parametrize("name", ["fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "e8m0", "fp32"])
def test_plot_value_keeps_its_layout_within_a_format(name):
    """Within a format, every stored number's figure has the same layout (less meta, which holds
    the stored value): moving through the patterns only moves the markers and texts, which a
    browser draws without redrawing the axes. NaN and inf say why the zoom is empty instead."""
    fmt = get_format(name)
    rng = np.random.default_rng(0)
    patterns = rng.integers(0, 2**min(fmt.bits, 16), 300) << max(0, fmt.bits - 16)

    def layout(v, typed=None):
        out = plot_value(fmt, v, typed=typed).to_plotly_json()["layout"]
        out.pop("meta")
        return json.dumps(out, sort_keys=True)

    first = None
    for bits in patterns:
        v = float(fmt.decode(int(bits)))
        if not math.isfinite(v):
            assert "annotations" in json.loads(layout(v))
            continue
        first = first or layout(v)
        assert layout(v) == first, (name, int(bits), v)
        # a number typed that rounds to it, half a gap off at most, keeps it too
        below, above = fmt.neighbours(v)
        if math.isfinite(above) and above > v:
            assert layout(v + (above - v) / 3, typed=v + (above - v) / 3) == first
    # a plausible wrong zoom, in the values themselves, would move its range on every pattern
    a, b = plot_value(fmt, 1.0), plot_value(fmt, 3.0)
    assert a.layout.xaxis2.range == b.layout.xaxis2.range
    assert [t.x[0] for t in a.data if t.name == "below"] != [float(fmt.neighbours(1.0)[0])]


def test_plot_value_specials_explain_themselves():
    fig = plot_value("fp16", math.nan)
    assert "NaN" in _annotation(fig, "zoom").text
    fig = plot_value("fp16", 65520.0, typed=65520.0)
    assert "beyond max = 65504" in _annotation(fig, "zoom").text
    fig = plot_value("fp8_e4m3", 448.0)  # no neighbour above the top of an "fn" format
    assert set(_zoom_points(fig)) == {"below", "stored"}


def test_format_shares_lists_zero_and_nan_only_when_present():
    with_specials = census(np.array([1.0, np.nan, 0.0], dtype=np.float32), "fp16")
    line = format_shares(with_specials)
    third = format_share(with_specials.fractions["nan"])
    assert line == f"zero {third} · underflow 0% · subnormal 0% · normal {third} · overflow 0% · nan {third}"
    assert format_shares(census(np.ones(3, dtype=np.float32), "fp16")) == (
        "underflow 0% · subnormal 0% · normal 100% · overflow 0%"
    )


# ----- loss-scale traces -----
def test_plot_scale_trace_draws_change_points_and_skips():
    from ampviz.plots import plot_scale_trace
    from ampviz.scaling import TorchGradScaler, simulate

    rng = np.random.default_rng(0)
    flags = rng.random(100_000) < 0.01
    trace = simulate(TorchGradScaler(growth_interval=50), found_inf=flags)
    fig = plot_scale_trace(trace, max_markers=300)
    line, marks = fig.data
    x = np.asarray(line.x)
    # every change of the scale is a vertex, nothing else is (besides first and last step)
    s = trace.scale.astype(np.float64)
    changes = np.flatnonzero(s[1:] != s[:-1]) + 1
    assert 1000 < changes.size < LINE_POINTS - 2
    assert np.array_equal(x, np.concatenate([[0], changes, [s.size - 1]]))
    assert np.array_equal(np.asarray(line.y), np.log2(s[x]))
    assert len(x) < 20_000 and len(marks.x) == 300 < trace.skipped_count
    assert set(np.asarray(marks.x)) <= set(np.flatnonzero(trace.skipped))
    assert f"{trace.skipped_count:,} skipped" in line.name
    # hovering shows each point's scale: templates over the numbers, the scale at that step
    assert np.array_equal(np.asarray(line.customdata), s[x])
    assert np.array_equal(np.asarray(marks.customdata), s[np.asarray(marks.x)])
    assert line.hovertemplate.startswith(trace.policy.name + " · ") and "%{customdata:,.6~g}" in line.hovertemplate
    assert "skipped" in marks.hovertemplate


def test_a_scaler_name_is_literal_text_in_the_hover_templates():
    """A name holding "%{x}" would be a placeholder in a template: it stays text."""
    import dataclasses

    from ampviz.plots import plot_scale_trace
    from ampviz.scaling import TorchGradScaler, simulate

    trace = simulate(dataclasses.replace(TorchGradScaler(), name="mine %{x} 100%"), found_inf=np.arange(50) % 7 == 0)
    fig = plot_scale_trace(trace)
    for t in fig.data:
        assert "%{x}" not in t.hovertemplate.split(" · ")[0] and "100%" in t.hovertemplate


def _drawn_envelope_misses(trace, x, y, groups):
    """The line (x, y) drawn as a step plot ("hv") against the trace: the groups of steps (as
    _scale_steps cuts them) where the drawn line's lowest or highest log2(scale), or its value at
    the group's first or last step, differs from the trace's; and the drawn points that are not
    the trace's own."""
    s = trace.scale.astype(np.float64)
    with np.errstate(divide="ignore"):
        true = np.where(s == 0, -150.0, np.log2(np.abs(s)))
    n = s.size
    drawn = y[np.searchsorted(x, np.arange(n), side="right") - 1]
    group = np.arange(n) * groups // n
    starts = np.flatnonzero(np.diff(group, prepend=-1))
    ends = np.append(starts[1:], n) - 1
    misses = []
    for a, b in zip(starts, ends):
        t, d = true[a:b + 1], drawn[a:b + 1]
        if not (np.nanmin(t) == np.nanmin(d) and np.nanmax(t) == np.nanmax(d)
                and np.array_equal(t[[0, -1]], d[[0, -1]], equal_nan=True)):
            misses.append(int(group[a]))
    wrong = np.flatnonzero(~((true[x] == y) | (np.isnan(true[x]) & np.isnan(y))))
    return misses, wrong


@pytest.mark.parametrize("flags", ["alternating", "random", "all"])
def test_plot_scale_trace_of_a_scale_that_changes_at_every_step(flags):
    """growth_interval=1 changes the scale at every step: the line is drawn at screen
    resolution, at most LINE_POINTS real points, and reaches every group's lowest and highest
    scale; its last point is the last step's scale. Thinning to evenly spread points instead (a
    plausible shortcut) misses the peaks."""
    from ampviz.plots import _thin, plot_scale_trace
    from ampviz.scaling import TorchGradScaler, simulate

    n = 300_000
    f = {"alternating": np.arange(n) % 2 == 0, "random": np.random.default_rng(1).random(n) < 0.3,
         "all": np.ones(n, bool)}[flags]
    trace = simulate(TorchGradScaler(growth_interval=1, growth_factor=4.0, backoff_factor=0.995), found_inf=f)
    fig = plot_scale_trace(trace)
    line = fig.data[0]
    x, y = np.asarray(line.x), np.asarray(line.y, np.float64)
    assert x.size <= LINE_POINTS and np.all(np.diff(x) > 0) and x[0] == 0 and x[-1] == n - 1
    # hover: a template over each point's scale (numbers, not a string per point)
    assert np.array_equal(np.asarray(line.customdata), trace.scale.astype(np.float64)[x])
    assert line.hovertext is None and "%{customdata" in line.hovertemplate
    misses, wrong = _drawn_envelope_misses(trace, x, y, LINE_POINTS // 4)
    assert misses == [] and wrong.size == 0
    if flags != "all":  # a scale that only falls has its envelope at the ends of each group
        s = trace.scale.astype(np.float64)
        changes = np.concatenate([[0], np.flatnonzero(s[1:] != s[:-1]) + 1, [n - 1]])
        even = _thin(changes, x.size)
        assert _drawn_envelope_misses(trace, even, np.log2(s[even]), LINE_POINTS // 4)[0] != []
    assert len(fig.to_json()) < 1_000_000  # it was ~75 MB at 1M steps


def test_plot_scale_trace_zero_scale_stopped_run_and_lost_panel():
    from ampviz.plots import plot_scale_trace
    from ampviz.scaling import DynamicScaler, TorchGradScaler, simulate

    zero = simulate(TorchGradScaler(), found_inf=np.ones(200, bool))  # reaches exactly 0
    stopped = simulate(DynamicScaler(name="raises", min_scale=2.0**15, raise_at_min=True),
                       found_inf=np.ones(10, bool))
    fig = plot_scale_trace([zero, stopped], lost={"torch": ([0, 100], [0.5, 0.25])})
    y0 = np.asarray(fig.data[0].y)
    assert y0[-1] == -150 and y0[0] == 16
    assert stopped.stopped_at == 1 and any(s.x0 == 1 for s in fig.layout.shapes)
    lost = [d for d in fig.data if d.meta and d.meta.get("kind") == "lost"]
    assert len(lost) == 1 and list(lost[0].y) == [50, 25] and lost[0].yaxis == "y2"


def test_small_figure_texts_read_right():
    """A legend says "1 in 4 shown" (never "every 2th"); a number near 1 is never "2^0.00"; the
    skip markers of a run that stopped end at its stop."""
    import numpy as np

    from ampviz.plots import format_pow2, plot_scale_trace
    from ampviz.scaling import PRESETS, TorchGradScaler, simulate

    assert format_pow2(-0.9995) == "-1 ≈ -2^-0.00072" and format_pow2(1.0007) == "1 ≈ 2^0.001"
    assert format_pow2(0.1) == "0.1 ≈ 2^-3.32"
    dense = simulate(TorchGradScaler(growth_interval=1), found_inf=np.arange(50_000) % 2 == 0)
    names = [d.name for d in plot_scale_trace(dense).data if d.meta["kind"] == "skipped"]
    assert len(names) == 1 and " in " in names[0] and "th shown" not in names[0], names
    stopped = simulate(PRESETS["DeepSpeed ZeRO"], found_inf=np.ones(5_000, bool))
    (marks,) = [d for d in plot_scale_trace(stopped).data if d.meta["kind"] == "skipped"]
    assert len(marks.x) == stopped.skipped_count and max(marks.x) <= stopped.stopped_at


# ----- what a learner sees: layouts that read at notebook widths -----
def _panel_px(fig, axis):
    """Height in pixels of the panel of ``axis`` (a layout key such as "yaxis3")."""
    lo, hi = fig.layout[axis].domain
    m = fig.layout.margin
    return (hi - lo) * (fig.layout.height - m.t - m.b)


def _transformer_names():
    """The parameter names of a real two-layer nn.TransformerEncoder model, as the live census
    reports them."""
    torch = pytest.importorskip("torch")

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 16)
            layer = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
            self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = torch.nn.Linear(16, 2)

    return [name for name, _ in Model().named_parameters()]


def _census_records(names, steps, census_at):
    """StepRecords of a run with a parameter census (of a few gradients each) at ``census_at``."""
    from ampviz.training.live import StepRecord

    rng = np.random.default_rng(0)
    cens = {name: census(2.0 ** rng.uniform(-30, -10, 50), "fp16") for name in names}
    return [StepRecord(step=s, loss=1.0 / (s + 1), param_census=cens if s in census_at else None)
            for s in range(steps)]


def test_heat_map_labels_are_short_unique_and_keep_the_layer_and_the_parameter():
    from ampviz.plots import HEAT_LABEL_CHARS, _short_names

    names = _transformer_names()
    labels = _short_names(names)
    assert len(names) == 2 * 12 + 3 and len(set(labels)) == len(labels)
    assert max(map(len, names)) > 40 and max(map(len, labels)) <= HEAT_LABEL_CHARS
    for name, label in zip(names, labels):
        if len(name) <= HEAT_LABEL_CHARS:
            assert label == name
            continue
        parts = name.split(".")
        assert label.endswith(parts[-1]) and "…" in label  # the parameter itself, and a mark of what is cut
        index = [p for p in parts if p.isdigit()]
        assert f"layers.{index[0]}" in label  # which layer
    assert _short_names(["fc1.weight", "fc1.bias"]) == ["fc1.weight", "fc1.bias"]
    # names whose short forms coincide keep their full names: every row stays its own
    twins = ["encoder.layers.0.self_attn.out_proj.weight", "decoder.layers.0.self_attn.out_proj.weight"]
    assert _short_names(twins) == twins


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.one_of(st.text("abc_xyz", min_size=1, max_size=14), st.integers(0, 12).map(str)),
                         min_size=1, max_size=7).map(".".join), max_size=12, unique=True))
def test_short_names_of_any_names_stay_unique_and_short(names):
    from ampviz.plots import HEAT_LABEL_CHARS, _short_names

    labels = _short_names(names)
    assert len(labels) == len(names) and len(set(labels)) == len(labels)
    assert all(lab == name or len(lab) <= HEAT_LABEL_CHARS for lab, name in zip(labels, names))


def test_live_heat_map_gives_every_row_room_for_its_label():
    """Plotly labels every category row only when the axis has round(1.2 × font size) pixels per
    row (it thins them otherwise; with a forced dtick = 1 they print over each other, as 24 rows in
    the old 171-pixel panel did)."""
    from ampviz.plots import plot_live

    names = _transformer_names()[:24]
    fig = plot_live({"fp16": _census_records(names, 40, {0, 20, 39})})
    (heat,) = [t for t in fig.data if t.meta["kind"] == "heat"]
    assert len(heat.y) == 24
    font = fig.layout.yaxis3.tickfont.size
    assert _panel_px(fig, "yaxis3") >= 24 * round(1.2 * font) and font >= 10
    assert fig.layout.yaxis3.dtick is None  # never forced: beyond 40 rows plotly labels every other one
    assert max(len(y) for y in heat.y) <= 25  # ~140 px of labels at font 10, not ~250
    # a figure of empty runs (the live widget's) leaves room for 18 rows (the beam model's)
    empty = plot_live({"fp16": [], "fp16+scaler": []}, steps=100)
    assert _panel_px(empty, "yaxis3") >= 18 * round(1.2 * empty.layout.yaxis3.tickfont.size)


def test_live_figure_uses_its_width_and_its_texts_fit():
    from ampviz.plots import plot_live

    fig = plot_live({m: _census_records(_transformer_names(), 30, {0, 29}) for m in ("fp32", "fp16", "fp16+scaler")},
                    heat_mode="fp16")
    # the legend sits above the loss panel (not under the step axis, 700 px lower)
    assert fig.layout.legend.orientation == "h" and fig.layout.legend.yanchor == "bottom"
    assert fig.layout.legend.y > 1.0 and fig.layout.yaxis.domain[1] == 1.0
    # the colour bar lies under the step axis, so it takes none of the panels' width
    (heat,) = [t for t in fig.data if t.meta["kind"] == "heat"]
    assert heat.colorbar.orientation == "h" and heat.colorbar.yref == "container"
    assert fig.layout.margin.r <= 20
    # the heat map's title: two lines short enough for a 400-pixel-wide plot (~7 px a character)
    notes = {a.name: a.text for a in fig.layout.annotations}
    assert max(len(line) for line in notes["heat-title"].split("<br>")) <= 50
    # panels stack without overlapping, each title in the gap above its panel
    heat_d, scale_d, loss_d = (fig.layout[a].domain for a in ("yaxis3", "yaxis2", "yaxis"))
    assert heat_d[1] < scale_d[0] < scale_d[1] < loss_d[0]
    assert _panel_px(fig, "yaxis") >= 190


def test_live_x_range_is_the_steps_not_the_heat_cells():
    """A census at steps 0 and 199 draws two cells 199 steps wide; autorange would stretch the axis
    to -99.5 .. 298.5 and squeeze the loss curves into the middle half."""
    from ampviz.plots import plot_live

    fig = plot_live({"fp16": _census_records(["a.weight", "a.bias"], 200, {0, 199})})
    assert list(fig.layout.xaxis.range) == [0, 199]
    assert list(plot_live({"fp16": []}, steps=50).layout.xaxis.range) == [0, 49]


def test_live_loss_axis_names_the_beams_unit():
    """The beam model's loss is in m² (notebook 07 prints it in mm²): the loss axis says so for runs
    of the beam, and only "loss" for the classifiers, a mix of models, or bare records."""
    from ampviz.plots import plot_live
    from ampviz.training.live import TrainConfig, run_training

    def runs(model, modes=("fp32", "fp16")):
        return {m: run_training(TrainConfig(model=model, mode=m, steps=2, census_every=0)) for m in modes}

    def axis(runs_by_mode):
        return plot_live(runs_by_mode).layout.yaxis.title.text

    beam, mlp = runs("beam"), runs("mlp")
    assert axis(beam) == "loss (m²)" and axis({"fp16": beam["fp16"]}) == "loss (m²)"
    assert axis(mlp) == "loss" and axis({"fp32": beam["fp32"], "fp16": mlp["fp16"]}) == "loss"
    assert axis({m: r.records for m, r in beam.items()}) == "loss" and axis({"fp16": []}) == "loss"


def test_coinciding_lines_stay_visible():
    """Scales (or losses) that coincide: each later line is narrower and dashed differently, and
    drawn on top, so every earlier one shows around it; the skip marks come after every line."""
    from ampviz.plots import plot_live, plot_scale_trace
    from ampviz.scaling import DynamicScaler, simulate

    flags = np.arange(3000) % 500 == 0
    runs = [simulate(DynamicScaler(name=name, growth_interval=100), found_inf=flags) for name in ("a", "b", "c")]
    assert np.array_equal(runs[0].scale, runs[2].scale)  # three scalers, one scale
    fig = plot_scale_trace(runs)
    lines = [d for d in fig.data if d.meta["kind"] == "scale"]
    widths = [d.line.width for d in lines]
    assert widths == sorted(widths, reverse=True) and len(set(widths)) == 3
    assert len({d.line.dash for d in lines}) == 3
    kinds = [d.meta["kind"] for d in fig.data]
    assert kinds == ["scale"] * 3 + ["skipped"] * 3
    recs = _census_records(["w"], 10, {0})
    live = plot_live({"fp32": recs, "fp16+scaler": recs})
    loss = [d.line.width for d in live.data if d.meta["kind"] == "loss"]
    assert loss[0] > loss[1]


def test_scale_trace_step_axis_sits_under_the_lower_panel():
    from ampviz.plots import plot_scale_trace
    from ampviz.scaling import TorchGradScaler, simulate

    trace = simulate(TorchGradScaler(growth_interval=20), found_inf=np.arange(500) % 50 == 0)
    fig = plot_scale_trace(trace, lost={"torch": ([0, 100, 400], [0.1, 0.2, 0.1])})
    # the step axis (ticks and title) is drawn under the lowest panel; the upper panel ends above it
    assert fig.layout.xaxis.anchor == "y2" and fig.layout.xaxis.title.text == "step"
    assert fig.layout.yaxis2.domain[0] == 0 and fig.layout.yaxis2.domain[1] < fig.layout.yaxis.domain[0]
    assert plot_scale_trace(trace).layout.xaxis.anchor == "y"


def test_skip_marks_at_a_million_steps_stay_apart_in_a_lane_per_scaler():
    """ScalerLab at 1,000,000 steps: each scaler's skipped steps are at most ``max_markers`` marks
    (60: more than 7 px apart on a 450-pixel-wide panel), in a lane of their own above the scale
    panel, so they neither cover the scale lines nor each other."""
    from ampviz.scaling import synth
    from ampviz.plots import plot_scale_trace
    from ampviz.scaling import PRESETS, TorchGradScaler, simulate

    stream = synth.scenario("spikes", 1_000_000, 0.5, np.random.default_rng(0))
    runs = [simulate(p, grad_max=stream) for p in (TorchGradScaler(), PRESETS["DeepSpeed ZeRO"], PRESETS["Megatron"])]
    fig = plot_scale_trace(runs)
    marks = [d for d in fig.data if d.meta["kind"] == "skipped"]
    assert len(marks) == 3
    for k, (m, run) in enumerate(zip(marks, runs)):
        assert run.skipped_count > 300 and len(m.x) == 60  # many skips, few marks
        assert set(np.asarray(m.x)) <= set(np.flatnonzero(run.skipped))
        assert m.yaxis == "y3" and set(np.asarray(m.y)) == {k}  # the scaler's own lane
    lanes, panel = fig.layout.yaxis3, fig.layout.yaxis
    assert panel.domain[1] < lanes.domain[0]  # above the scale panel, not on its lines
    assert _panel_px(fig, "yaxis3") >= 12 * len(runs)
    names = [d.name for d in fig.data if d.meta["kind"] == "scale"]
    assert all(" marked)" in n for n in names)  # the legend says how many are marked


def test_census_bars_show_the_bands_and_small_counts():
    """Each bar in its band's colour (no dark bars over the bands), with headroom for the labels at
    the top; a count too small to see as a bar (3 overflowing values beside 10,000) gets a mark on
    the axis and its count under the shares line."""
    values = np.concatenate([np.full(10_000, 1.5), np.full(3, 2.0**17 * 1.5), np.full(20, 2.0**-26)]).astype(np.float32)
    fig = plot_census(values, "fp16")
    drawn = _drawn_bars(fig)
    assert {e: band for e, (_, band) in drawn.items()} == {0: "normal", 17: "overflow", -26: "underflow"}
    assert {e: count for e, (count, _) in drawn.items()} == {0: 10_000, 17: 3, -26: 20}
    for t in fig.data:
        if t.meta["kind"] == "bars":
            assert t.fillcolor == CATEGORY_COLORS[t.meta["band"]]
    assert fig.layout.yaxis.range[1] >= 1.4 * 10_000  # the tallest bar ends under the labels' rows
    lowest_label = min(a.y for a in fig.layout.annotations if a.yref == "paper" and a.name != "shares")
    assert 10_000 / fig.layout.yaxis.range[1] < lowest_label - 0.1
    few = {t.meta["band"]: t for t in fig.data if t.meta["kind"] == "few"}
    assert list(few) == list(BAND_CATEGORIES)  # every band has its trace, empty or not
    assert {band: list(t.x) for band, t in few.items()} == {"underflow": [-25.5], "subnormal": [], "normal": [],
                                                             "overflow": [17.5]}
    assert all(list(t.y) == [0] * len(t.x) and t.marker.color == CATEGORY_COLORS[band] for band, t in few.items())
    shares = _annotation(fig, "shares").text
    assert "overflow 3 values" in shares and "underflow 20 values" in shares
    # each mark says what it is: a bar too short to see, with its count (the tails of a census,
    # where the marks sit, read as values beyond the axis, and the axis holds every bar)
    assert list(few["overflow"].hovertext) == ["▲ a bar too short to see at this height, not values beyond the "
                                              "axis<br>2^17 ≤ |v·scale| < 2^18<br>3 values (0.0299%)"]
    assert all(lo <= x <= hi for t in few.values() for x in t.x for lo, hi in [fig.layout.xaxis.range])
    # and the legend keys them: the marks' symbol, named, drawing nothing itself
    (key,) = [t for t in fig.data if t.meta["kind"] == "few-key"]
    assert key.showlegend and key.name == SMALL_BAR_KEY == "a bar too short to see (hover it for its count)"
    assert key.marker.symbol == "triangle-up" and np.isnan(key.x).all() and np.isnan(key.y).all()
    assert fig.data[-1] is key  # after the traces a scale move changes
    assert "values" not in _annotation(plot_census(np.ones(5, np.float32), "fp16"), "shares").text
    assert fig.layout.yaxis.tickformat == ","  # 10,000, not 10k


def test_past_the_max_each_band_says_what_the_cast_does():
    """fp8 E4M3 has no inf: the cast saturates (torch) or gives NaN (ml_dtypes); the figures say
    so instead of "overflow" to inf. The words follow the format's own cast."""
    e4m3, fp16 = get_format("fp8_e4m3"), get_format("fp16")
    assert e4m3.quantize(1e6) == e4m3.max == 448 and math.isnan(e4m3.quantize(1e6, overflow="nan"))
    assert fp16.quantize(1e6) == math.inf
    for fmt, words in ((e4m3, ["saturates to 448", "NaN"]), (fp16, ["becomes inf"])):
        label = _annotation(plot_census(TINY, fmt), "overflow-band").text
        assert all(w in label for w in words) and ("inf" in label) == (fmt is fp16)
    ranges = plot_format_ranges()
    over = [t for t in ranges.data if t.name == "overflow"][0]
    texts = dict(zip(over.y, over.text))
    assert texts["fp8_e4m3"].startswith("saturates to 448") and texts["fp8_e5m2"] == "becomes inf"
    hatched = dict(zip(over.y, over.marker.pattern.shape))
    assert hatched["fp8_e4m3"] == "/" and {hatched[n] for n in over.y if n != "fp8_e4m3"} == {""}
    assert "ml_dtypes' cast gives NaN" in over.hovertext[list(over.y).index("fp8_e4m3")]


def test_plot_value_markers_sit_above_the_band_row_and_never_clip():
    for value, typed in ((0.1, 0.1), (65520.0, 65520.0), (0.0, None), (1e-9, 1e-9)):
        fig = plot_value("fp16", value, typed=typed)
        band = [t for t in fig.data if t.type == "bar"]
        top = max(t.width for t in band) / 2  # the band row spans -w/2 .. w/2
        marks = [t for t in fig.data if t.type == "scatter" and getattr(t, "xaxis", None) != "x2"]
        lo, hi = fig.layout.xaxis.range
        for m in marks:
            assert m.y[0] - top >= 0.15 and m.y[0] < fig.layout.yaxis.range[1]  # its own row
            assert lo < m.x[0] < hi and m.cliponaxis is False
    inf = plot_value("fp16", math.inf)
    assert [t.x[0] for t in inf.data if t.name == "stored"][0] > math.log2(get_format("fp16").overflow_boundary)


def test_zoom_values_are_written_out_under_their_markers():
    fig = plot_value("fp16", 65519.0, typed=65519.0)
    assert list(_zoom_values(fig).values()) == ["65472", "65504", "65519"]  # not "6.547e+4"
    assert list(_zoom_values(fig)) == [-1.0, 0.0, 15 / 32]  # under below, stored and typed
    assert fig.layout.xaxis2.showticklabels is False  # the axis itself writes nothing
    fig = plot_value("fp16", 0.1, typed=0.1)
    positions = _zoom_positions(fig)
    text = _zoom_values(fig)
    assert text[positions["typed"]] == "0.1" and text[0.0] == "0.099976" and len(set(text.values())) == 4
    # a typed value too close to write its own: the stored one still never reads as it
    fig = plot_value("fp32", 0.1, typed=0.1)
    assert abs(_zoom_positions(fig)["typed"]) < 1 / 3
    assert "0.1" not in _zoom_values(fig).values() and len(_zoom_values(fig)) == 3


def test_log2_axes_read_as_powers_of_two():
    """Every log2 axis is labelled 2^k at whole k; a log axis of weights reads 2^-7 or 4, never a
    rounded 0.00781."""
    import re

    from ampviz.plots import plot_live, plot_lost_band, plot_scale_trace
    from ampviz.scaling import TorchGradScaler, simulate

    for fig in (plot_format_ranges(), plot_census(TINY), plot_value("fp16", 0.1)):
        assert fig.layout.xaxis.tickprefix == "2^"
    flat = simulate(TorchGradScaler(), found_inf=np.zeros(100, bool))  # 2^16 throughout: a 0-wide range
    for trace in (flat, simulate(TorchGradScaler(), found_inf=np.ones(200, bool))):
        y = plot_scale_trace(trace).layout.yaxis
        assert y.tickprefix == "2^" and y.tick0 == 0 and float(y.dtick).is_integer() and y.dtick >= 1
    live = plot_live({"fp16+scaler": []}).layout.yaxis2
    assert live.tickprefix == "2^" and max(live.autorangeoptions.include) - min(live.autorangeoptions.include) >= 8
    ticks = plot_lost_band("fp16", 1e-3, 6e4).layout.xaxis.ticktext
    assert all(re.fullmatch(r"2\^-\d+|\d+", t) for t in ticks), ticks
    assert "0.5" in plot_lost_band("fp16", 0.2, 4.0).layout.xaxis.ticktext


# ----- figures built without plotly's validation hold what validating them gives -----
def _wire_and_json(fig):
    """What FigureView sends (packed) and what plotly's renderers write (parsed JSON)."""
    import json

    import plotly.io as pio

    from ampviz.widgets.figureview import pack

    return json.dumps(pack(fig.to_plotly_json()), sort_keys=True), json.loads(pio.to_json(fig))


def _validated(fig):
    import plotly.graph_objects as go

    return go.Figure(fig.to_plotly_json())  # validates every property (raises on an unknown one)


def _assert_as_validated(fig):
    assert _wire_and_json(fig) == _wire_and_json(_validated(fig))


@settings(max_examples=80, deadline=None)
@given(fmt=st.sampled_from(sorted(ALL_FORMATS)),
       value=st.floats(allow_nan=True, allow_infinity=True, width=64),
       typed=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True, width=64)))
def test_plot_value_holds_what_validation_gives(fmt, value, typed):
    _assert_as_validated(plot_value(fmt, value, typed=typed))


@settings(max_examples=40, deadline=None)
@given(fmt=st.sampled_from(["fp16", "bf16", "fp8_e4m3", "fp8_e5m2"]), log2_scale=st.integers(-40, 40),
       values=st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), max_size=40))
def test_plot_census_holds_what_validation_gives(fmt, log2_scale, values):
    _assert_as_validated(plot_census(np.asarray(values, np.float32), fmt, 2.0**log2_scale))


@settings(max_examples=25, deadline=None)
@given(scenario=st.sampled_from(["steady", "spikes", "bursts"]), steps=st.integers(1, 3000),
       stop=st.booleans(), two=st.booleans(), lost=st.booleans())
def test_plot_scale_trace_holds_what_validation_gives(scenario, steps, stop, two, lost):
    from ampviz import scaling
    from ampviz.scaling import synth
    from ampviz.plots import plot_scale_trace

    g = synth.scenario(scenario, steps, 0.5, np.random.default_rng(0))
    first = scaling.simulate(scaling.PRESETS["apex amp"] if stop else scaling.TorchGradScaler(), grad_max=g * 1e30 if stop else g)
    traces = [first, scaling.simulate(scaling.TorchGradScaler(growth_interval=7), grad_max=g)] if two else [first]
    shares = {"your settings": (np.arange(3), np.array([0.0, 0.25, 1.0]))} if lost else None
    _assert_as_validated(plot_scale_trace(traces, lost=shares))


def test_the_comparison_catches_what_validation_would_change():
    """The check above can fail: a template left as its name, an empty list of annotations or a
    misspelt property all differ from (or are refused by) the validated figure."""
    import plotly.graph_objects as go

    fig = plot_value("fp16", 0.1)
    raw = fig.to_plotly_json()
    named = go.Figure({"data": raw["data"], "layout": {**raw["layout"], "template": "plotly_white"}}, _validate=False)
    assert _wire_and_json(named) != _wire_and_json(_validated(named))
    empty = go.Figure({"data": raw["data"], "layout": {**raw["layout"], "shapes": []}}, _validate=False)
    assert _wire_and_json(empty) != _wire_and_json(_validated(empty))
    typo = go.Figure({"data": [{**raw["data"][0], "hovertxt": ["x"]}], "layout": raw["layout"]}, _validate=False)
    with pytest.raises(ValueError, match="hovertxt"):
        _validated(typo)


# ----- the formats beyond the course's six -----
@pytest.mark.parametrize("name", [n for n in ALL_FORMATS if n not in FORMATS])
def test_band_edges_of_the_new_formats(name):
    fmt = ALL_FORMATS[name]
    edges = band_edges(fmt)
    assert edges["underflow"] == (0.0, fmt.underflow_boundary)
    assert edges["overflow"] == (fmt.overflow_boundary, math.inf)
    if name == "e8m0":  # no subnormals: an empty band, and the normal band from the underflow edge
        assert edges["subnormal"] == (fmt.underflow_boundary, fmt.underflow_boundary)
        assert edges["normal"] == (fmt.underflow_boundary, fmt.overflow_boundary)
    else:
        assert edges["subnormal"] == (fmt.underflow_boundary, fmt.smallest_normal)
        assert edges["normal"] == (fmt.smallest_normal, fmt.overflow_boundary)
        assert fmt.underflow_boundary < fmt.smallest_subnormal < fmt.smallest_normal
    assert fmt.max < fmt.overflow_boundary


def test_new_formats_bands_say_what_their_casts_do():
    """Past max: fnuz and E8M0 become NaN (both libraries), fp6/fp4 saturate (hatched); below the
    range, E8M0 (no zero) gives its smallest value; E8M0 draws no subnormal band or tick."""
    names = [n for n in ALL_FORMATS if n not in FORMATS]
    fig = plot_format_ranges(names)
    bands = {t.name: t for t in fig.data if t.name in BAND_CATEGORIES}
    over = dict(zip(bands["overflow"].y, bands["overflow"].text))
    hatch = dict(zip(bands["overflow"].y, bands["overflow"].marker.pattern.shape))
    for name in names:
        fmt = ALL_FORMATS[name]
        assert math.isnan(fmt.quantize(fmt.overflow_boundary * 2)) == (over[name] == "becomes NaN")
        if name.startswith(("fp6", "fp4")):
            assert over[name] == f"saturates to max {format_number(fmt.max)}" and hatch[name] == "/"
            assert fmt.quantize(fmt.overflow_boundary * 2) == fmt.max
        else:
            assert over[name] == "becomes NaN" and hatch[name] == ""
    under = dict(zip(bands["underflow"].y, bands["underflow"].text))
    e8m0 = get_format("e8m0")
    assert under["e8m0"] == "becomes 2^-127" and e8m0.quantize(e8m0.underflow_boundary) == 2.0**-127
    assert {under[n] for n in names if n != "e8m0"} == {"becomes 0"}
    sub = bands["subnormal"]
    k = list(sub.y).index("e8m0")
    assert sub.x[k] == 0 and sub.text[k] == "" and "no subnormals" in sub.hovertext[k]
    assert all(w > 0 for n, w in zip(sub.y, sub.x) if n != "e8m0")
    marks = [t for t in fig.data if t.type == "scatter"][0]
    e8m0_marks = [h for h in marks.hovertext if h.startswith("e8m0 ")]
    assert len(e8m0_marks) == 2 and not any("subnormal" in h for h in e8m0_marks)
    assert sum(h.startswith("fp4_e2m1 ") for h in marks.hovertext) == 3


@pytest.mark.parametrize("name", [n for n in ALL_FORMATS if n not in FORMATS])
def test_plot_value_marks_every_pattern_of_a_new_format_at_its_value(name):
    """Every bit pattern's value (at most 256) is marked where it is: log2 |value| on the band row,
    the value itself on the zoom, nothing on either for NaN."""
    fmt = ALL_FORMATS[name]
    for bits in range(1 << fmt.bits):
        v = float(fmt.decode(bits))
        fig = plot_value(fmt, v)
        lo, hi = fig.layout.xaxis.range
        top = [t for t in fig.data if t.name == "stored" and getattr(t, "xaxis", None) != "x2"]
        zoom = [t for t in fig.data if t.name == "stored" and getattr(t, "xaxis", None) == "x2"]
        if math.isnan(v):
            assert top == [] and zoom == [] and fig.layout.meta["stored"] is None
            continue
        assert fig.layout.meta["stored"] == v and zoom[0].x[0] == 0.0 and zoom[0].hovertext[0] == f"stored: {v!r}"
        assert top[0].x[0] == (lo + 1.0 if v == 0 else math.log2(abs(v)))


def test_the_explorers_figures_say_their_axis_types_and_draw_labels_as_they_are():
    """Every axis of the figures the explorers redraw on each move has its type written out (plotly
    otherwise guesses it from the data at every draw), every linear axis carries numbers only (a
    category or date axis named linear would draw nothing), and tick labels are drawn without
    being measured to hide those past the axis."""
    from ampviz.widgets import BlockExplorer, FormatExplorer, Fp8ScalingLab, RangeExplorer, ScalerLab

    figures = {"FormatExplorer": FormatExplorer("fp16", 0.1).figure,
               "RangeExplorer": RangeExplorer(np.float32([1e-8, 1e-3, 1.0])).figure,
               "ScalerLab": ScalerLab(steps=2000).figure, "BlockExplorer": BlockExplorer().figure,
               "Fp8ScalingLab": Fp8ScalingLab().figure}
    for name, fig in figures.items():
        layout = fig.layout.to_plotly_json()
        axes = {k: v for k, v in layout.items() if re.fullmatch(r"[xy]axis\d*", k)}
        assert axes and all(a.get("type") in ("linear", "log") for a in axes.values()), (name, axes)
        assert all(a.get("ticklabeloverflow") == "allow" for a in axes.values() if a.get("visible", True)), name
        for t in fig.data:
            for letter in "xy":
                ref = getattr(t, f"{letter}axis") or letter
                values = getattr(t, letter)
                if values is not None and axes[f"{letter}axis{ref[1:]}"]["type"] == "linear":
                    assert np.asarray(values).dtype.kind in "iuf", (name, t.meta, letter)


def _same(a, b) -> bool:
    return a == b or (a != a and b != b)  # NaN equal to NaN


def _runs_by_loop(values):
    """The first and last index of each run of equal values, one step at a time."""
    n = len(values)
    return [i for i in range(n) if i == 0 or i == n - 1 or not _same(values[i], values[i - 1])
            or not _same(values[i], values[i + 1])]


@pytest.mark.parametrize("values", [[], [1.0], [1.0, 1.0, 2.0, 2.0, 2.0, 1.0], [np.nan, np.nan, 1.0, np.nan],
                                    [3, 3, 3], [0.5, np.inf, np.inf, -np.inf, np.nan, np.nan, np.nan]])
def test_run_ends_and_changes_treat_nan_as_one_run(values):
    """``_changes`` (where a run begins) and ``_run_ends`` (each run's first and last index), shared
    by the scale lines of ``plot_scale_trace`` and ``plot_fp8_scaling``, against a plain loop."""
    from ampviz.plots import _changes, _run_ends

    assert _run_ends(values).tolist() == _runs_by_loop(values)
    assert _changes(values).tolist() == [i for i in range(1, len(values)) if not _same(values[i], values[i - 1])]
    # a NaN that never equals NaN would split a run of NaNs into runs of one
    assert _run_ends([np.nan] * 4).tolist() == [0, 3]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.floats(-200, 200, allow_subnormal=False), st.just(float("nan")), st.just(float("inf"))), max_size=40),
       st.sampled_from([1, 2, 5, 10, 25, 200]))
def test_scale_axis_range_holds_the_values_with_room_and_snaps_to_ticks(values, step):
    """The scale axis's fixed range: every finite value at least a quarter tick inside it, its ends
    on whole ticks, and no more than a tick and a quarter beyond the values (None without a finite
    value). A range snapped without the quarter-tick room (a plausible shortcut) puts a scale of a
    whole power of two on the panel's edge."""
    from ampviz.plots import _padded_range

    got = _padded_range(values, step)
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        assert got is None
        return
    lo, hi = got
    assert lo <= min(finite) - step / 4 and hi >= max(finite) + step / 4
    assert lo > min(finite) - 1.25 * step - 1e-9 and hi < max(finite) + 1.25 * step + 1e-9
    assert lo / step == round(lo / step) and hi / step == round(hi / step)
    tight = [math.floor(min(finite) / step) * step, math.ceil(max(finite) / step) * step]
    if min(finite) / step == round(min(finite) / step):
        assert tight[0] == min(finite) and lo < tight[0]  # the shortcut's edge on the value


def test_share_axis_top_is_a_round_number_above_the_largest_share():
    from ampviz.plots import _share_top

    assert _share_top([0.0, 0.05, float("nan")]) == 0.1  # 1.2 × 0.05 = 0.06 -> 0.1
    assert _share_top([0.075]) == 0.1 and _share_top([0.1]) == 0.2 and _share_top([30.0]) == 50.0
    assert _share_top([90.0]) == 200.0 and _share_top([]) == 1.0 and _share_top([0.0]) == 1.0
    for top in (1e-5, 0.003, 0.4, 7.0, 99.0):
        t = _share_top([top])
        assert 1.2 * top <= t <= 3 * 1.2 * top and re.fullmatch(r"[125]e[-+]\d+", f"{t:.0e}")


def test_plot_scale_trace_without_counts_in_the_legend():
    """``legend_counts=False`` (ScalerLab's figure): names without counts, so a move that changes
    the counts keeps the names, and with them the layout; the axes' ranges are fixed and hold every
    line."""
    from ampviz.plots import plot_scale_trace
    from ampviz.scaling import TorchGradScaler, simulate

    runs = [simulate(TorchGradScaler(growth_interval=g), found_inf=np.arange(3000) % k == 0)
            for g, k in ((50, 7), (20, 5))]
    counted = plot_scale_trace(runs, max_markers=60)
    plain = plot_scale_trace(runs, max_markers=60, legend_counts=False)
    assert [d.name for d in plain.data] == [r.policy.name for r in runs] + [f"{r.policy.name}: skipped" for r in runs]
    assert [d.name for d in counted.data] != [d.name for d in plain.data]
    assert all(" marked)" in d.name for d in counted.data if d.meta["kind"] == "scale")
    for a, b in zip(counted.data, plain.data):  # only the names differ
        assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y) and a.hovertemplate == b.hovertemplate
    lo, hi = plain.layout.yaxis.range
    ys = np.concatenate([np.asarray(d.y) for d in plain.data if d.meta["kind"] == "scale"])
    assert lo < ys.min() and ys.max() < hi and plain.layout.yaxis.autorange is None
    with pytest.raises(TypeError, match="legend_counts must be True or False"):
        plot_scale_trace(runs, legend_counts="no")


def test_plot_scale_trace_lost_panel_has_a_fixed_range_over_the_shares():
    from ampviz.plots import plot_scale_trace
    from ampviz.scaling import TorchGradScaler, simulate

    run = simulate(TorchGradScaler(), found_inf=np.zeros(100, bool))
    steps, shares = np.arange(100), np.linspace(0, 0.0004, 100)  # up to 0.04 %
    fig = plot_scale_trace(run, lost={"your settings": (steps, shares)})
    assert tuple(fig.layout.yaxis2.range) == (0, 0.05)
    assert max(fig.data[-1].y) <= fig.layout.yaxis2.range[1]


# ----- one look everywhere: no cloud link, a preset's own colour, labels kept whole -----
def _every_plot():
    """One figure of every plot_* function (the static figures the lessons show)."""
    from ampviz import scaling
    from ampviz.formats.blocks import mx_quantize, nvfp4_quantize
    from ampviz.formats.fp8 import simulate_fp8_scaling, tensor_stream
    from ampviz.plots import plot_blocks, plot_fp8_scaling

    stream = np.full(50, 1.0)
    row = np.linspace(-3, 3, 32).astype(np.float32)
    return {
        "plot_census": plot_census(TINY, "fp16"),
        "plot_format_ranges": plot_format_ranges(),
        "plot_value": plot_value("fp16", 0.1),
        "plot_scale_trace": plot_scale_trace(scaling.simulate(scaling.PRESETS["Megatron"], grad_max=stream)),
        "plot_live": plot_live({"fp16": []}),
        "plot_lost_band": plot_lost_band("fp16"),
        "plot_blocks": plot_blocks(row, mx_quantize(row, "fp8_e4m3")),
        "plot_blocks nvfp4": plot_blocks(row, nvfp4_quantize(row)),
        "plot_fp8_scaling": plot_fp8_scaling(simulate_fp8_scaling(tensor_stream(20, 64, seed=0), "current")),
    }


def assert_no_cloud_link(config):
    """plotly.js's config ``config`` offers no upload to Plotly Cloud: no "Share chart" button in
    the modebar, no link under the figure."""
    assert config["showSendToCloud"] is False and "showLink" not in config  # plotly.js 3 has no showLink
    assert {"sendDataToCloud", "sendChartToCloud"} <= set(config["modeBarButtonsToRemove"])
    assert config["displaylogo"] is False


def test_every_plot_is_shown_with_no_cloud_link(monkeypatch, recwarn):
    """plotly.js 3 offers "Share chart → upload to Plotly Cloud" unless told not to: every figure
    is shown (notebook display, show(), HTML) with FIGURE_CONFIG, which turns it off."""
    import warnings

    import plotly.io as pio
    from ampviz.plots import FIGURE_CONFIG, Figure

    assert_no_cloud_link(FIGURE_CONFIG)
    monkeypatch.setattr(pio.renderers, "default", "plotly_mimetype")
    warnings.simplefilter("always")
    for name, fig in _every_plot().items():
        assert isinstance(fig, Figure), name
        assert_no_cloud_link(fig.config)
        bundle = fig._repr_mimebundle_()
        assert_no_cloud_link(bundle["application/vnd.plotly.v1+json"]["config"])
        html = fig.to_html(include_plotlyjs=False)
        assert '"showSendToCloud": false' in html and '"sendChartToCloud"' in html, name
    # no option plotly.py does not know (it warns of each)
    assert not [w for w in recwarn if "config" in str(w.message)]
    shown = plot_census(TINY, "fp16").to_html(config={"scrollZoom": True}, include_plotlyjs=False)
    assert '"scrollZoom": true' in shown and '"showSendToCloud": false' in shown  # a config given goes over it


def test_the_live_heat_map_has_an_explicit_light_to_dark_colour_scale():
    """Named, "Blues" ran light to dark in plotly.py (which resolves the name in a static figure)
    and dark to light in plotly.js (which the live figure's traces reach as sent): the heat map's
    scale is spelled out, 0% lost light, 100% dark, the same in the trace dicts and the figure."""
    from ampviz.plots import LOST_COLORSCALE

    def lightness(color):
        return sum(int(v) for v in re.findall(r"\d+", color))

    (heat,) = [t for t in plot_live({"fp16": []}).data if t.meta["kind"] == "heat"]
    static = [[float(p), c] for p, c in heat.colorscale]
    (sent,) = [t for t in live_traces({"fp16": []}) if t["meta"]["kind"] == "heat"]
    assert isinstance(sent["colorscale"], list) and [[float(p), c] for p, c in sent["colorscale"]] == static
    assert static == LOST_COLORSCALE and static[0][0] == 0.0 and static[-1][0] == 1.0
    assert lightness(static[0][1]) > lightness(static[-1][1])  # 0% lost: the light end


def test_a_preset_keeps_its_colour_whatever_is_drawn_with_it():
    from ampviz import scaling
    from ampviz.plots import PRESET_COLORS, scaler_colors

    assert set(PRESET_COLORS) == set(scaling.PRESETS)  # every preset has one, and they differ
    assert len(set(PRESET_COLORS.values())) == len(PRESET_COLORS)
    stream = np.full(30, 1.0)
    runs = {name: scaling.simulate(p, grad_max=stream) for name, p in scaling.PRESETS.items()}

    def colors(names):
        fig = plot_scale_trace([runs[n] for n in names])
        return {t.meta["policy"]: t.line.color for t in fig.data if t.meta["kind"] == "scale"}

    for group in (["DeepSpeed ZeRO"], ["Megatron", "DeepSpeed ZeRO"], ["torch", "fairseq", "DeepSpeed ZeRO"],
                  list(reversed(list(scaling.PRESETS)))):
        assert colors(group) == {n: PRESET_COLORS[n] for n in group}
    # a scaler of no preset takes a colour no preset drawn with it has
    mine = scaling.simulate(scaling.DynamicScaler(name="mine", init_scale=2.0**16), grad_max=stream)
    fig = plot_scale_trace([mine, runs["torch"], runs["Megatron"]])
    got = {t.meta["policy"]: t.line.color for t in fig.data if t.meta["kind"] == "scale"}
    assert got["torch"] == PRESET_COLORS["torch"] and got["Megatron"] == PRESET_COLORS["Megatron"]
    assert got["mine"] not in (PRESET_COLORS["torch"], PRESET_COLORS["Megatron"])
    assert scaler_colors(["mine", "other"])[0] != scaler_colors(["mine", "other"])[1]


@pytest.mark.parametrize("fmt", ["fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "fp32"])
def test_the_outer_bands_words_are_never_cut_by_the_figures_edge(fmt):
    """bf16's overflow band is 10 binades of 282 on the axis, too narrow for "becomes inf" drawn
    from its edge ("becomes in" showed): such words are set against the plot's outer edge, inside
    it, and kept whole."""
    from ampviz.plots.census import _MARGIN_PX, _PLOT_PX, _text_px

    fig = plot_census(TINY, fmt)
    lo, hi = fig.layout.xaxis.range
    f = get_format(fmt)
    for name, words in (("underflow-band", "becomes 0"), ("overflow-band", _past_max(f).replace(" (", "<br>("))):
        note = _annotation(fig, name)
        assert note.text == words
        px = (hi - lo) / _PLOT_PX  # binades per pixel at the narrowest plot
        if note.xanchor == "left":  # from x to the right: within the plot and its right margin
            assert note.x >= lo and (hi - note.x) / px + _MARGIN_PX["r"] >= _text_px(words)
        else:
            assert note.x <= hi and (note.x - lo) / px + _MARGIN_PX["l"] >= _text_px(words)
    if fmt == "bf16":
        over = _annotation(fig, "overflow-band")
        assert (over.x, over.xanchor, over.text) == (hi, "right", "becomes inf")
