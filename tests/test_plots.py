"""Figure builders: band edges, bars and printed shares come from the core's own numbers."""

import math
import subprocess
import sys

import numpy as np
import pytest

from ampviz.census import census, profile
from ampviz.formats import CATEGORIES, FORMATS, get_format
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
    plot_census,
    plot_format_ranges,
    plot_value,
)

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
    for name in FORMATS:
        for cat in BAND_CATEGORIES:
            yield pytest.param(name, cat, id=f"{name}-{cat}")


@pytest.mark.parametrize("name, cat", _band_cases())
def test_band_interiors_classify_as_their_category(name, cat):
    """A magnitude inside each drawn band lands in that band's category in the core."""
    fmt = FORMATS[name]
    lo, hi = band_edges(fmt)[cat]
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


def test_figures_are_deterministic_and_carry_no_uids():
    for build in (lambda: plot_format_ranges(), lambda: plot_census(TINY), lambda: plot_value("fp16", 0.1, 0.1)):
        a, b = build().to_json(), build().to_json()
        assert a == b
        assert '"uid"' not in a


# ----- one value -----
def _zoom_points(fig):
    return {t.name: t.x[0] for t in fig.data if getattr(t, "xaxis", None) == "x2"}


def test_plot_value_zoom_shows_neighbours_stored_and_typed():
    fmt = get_format("fp16")
    fig = plot_value(fmt, 0.1, typed=0.1)
    below, above = fmt.neighbours(0.1)
    assert _zoom_points(fig) == {"below": below, "stored": fmt.quantize(0.1), "above": above, "typed": 0.1}


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
    assert len(line.hovertext) == x.size
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
