"""BlockExplorer and plot_blocks, headless: the figure and the readout follow ``ampviz.formats.blocks``
exactly for every control; the outlier costs its block's neighbours their precision as
``mx_quantize`` predicts; moves from the browser are coalesced; every bad input is a one-line
message."""

import html
import json
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ampviz.formats.blocks import MX_ROUNDING, mx_quantize, nvfp4_quantize, random_hadamard_transform
from ampviz.formats import FP4_E2M1, FP8_E4M3, get_format
from ampviz.plots import plot_blocks
from ampviz.widgets.block_explorer import BlockExplorer
from widget_checks import move_quickly, one_line, refused, text  # tests/, on the path as pytest runs
from layout_checks import contains  # tests/widgets/, on the path as pytest runs

MX = ["fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1"]
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ANYTHING = st.one_of(
    st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20), st.lists(st.integers(), max_size=3), st.just(object()), st.just(np.float32(2.0)),
    st.just(np.arange(3)), st.just(complex(1, 1)),
)





# ----- the model, computed here without the explorer -----
def row(data="normal", k=8, seed=0, n=128, at=37):
    rng = np.random.default_rng(seed)
    if data == "normal":
        x = rng.standard_normal(n)
        x[at] = 2.0**k
    else:
        x = rng.lognormal(0.0, 2.0, n) * rng.choice([-1.0, 1.0], n)
    return x.astype(np.float32)


def expected(scheme="fp8_e4m3", block=32, rounding="floor", pts=True, data="normal", k=8, seed=0, hadamard=False):
    """(row quantized, result) as ampviz.formats.blocks gives them for these settings."""
    x = row(data, k, seed)
    if hadamard:
        x = random_hadamard_transform(x)
    if scheme == "nvfp4":
        return x, nvfp4_quantize(x, per_tensor_scale=pts)
    return x, mx_quantize(x, scheme, block_size=block, rounding=rounding)


def scale_values(result):
    """Each block's scale as a float: 2^(code - 127) for MX, E4M3 value × tensor scale for NVFP4."""
    if hasattr(result, "tensor_scale"):
        s = np.asarray(FP8_E4M3.decode(result.scales.astype(np.int64)), np.float32)
        return s if result.tensor_scale is None else (np.float32(result.tensor_scale) * s).astype(np.float32)
    return np.ldexp(1.0, result.scales.astype(int) - 127)


def traces(fig):
    return {t.meta["kind"]: t for t in fig.data}


def on_axis(fig, v) -> np.ndarray:
    """Where ``plot_blocks`` puts magnitudes on its value axis: log2 |v|, a 0 on the zero row
    (``layout.meta["zero_y"]``), inf and NaN nowhere (NaN)."""
    v = np.asarray(v, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(np.isfinite(v) & (v != 0), np.log2(np.abs(v)), np.nan)
    return np.where(v == 0, fig.layout.meta["zero_y"], y)


def dequantized(fig) -> np.ndarray:
    """The dequantized row as ``plot_blocks`` draws it (a level from i - 0.35 to i + 0.35 for each
    element i at log2 |q_i|, a gap after each, q_i in its hover data), checked to be that shape,
    as one value per element."""
    t = traces(fig)["dequantized"]
    x, y = np.asarray(t.x, float), np.asarray(t.y, float)
    n = x.size // 3
    assert x.size == 3 * n and t.mode == "lines" and t.type == "scatter"
    assert np.array_equal(x[0::3], np.arange(n) - 0.35) and np.array_equal(x[1::3], np.arange(n) + 0.35)
    assert np.isnan(x[2::3]).all() and np.isnan(y[2::3]).all()
    assert np.array_equal(y[0::3], y[1::3], equal_nan=True)
    data = np.asarray(t.customdata, dtype=object)
    q = np.asarray(data[0::3, 1], np.float64)
    assert np.array_equal(np.asarray(data[1::3, 1], np.float64), q, equal_nan=True)
    assert np.array_equal(y[0::3], on_axis(fig, q), equal_nan=True)
    return q


def level_elements(t, half: float) -> np.ndarray:
    """The elements a trace of levels draws (a level from i - half to i + half for each element i,
    a gap after each, one path), checked to be that shape, with their heights."""
    x, y = np.asarray(t.x, float), np.asarray(t.y, float)
    assert x.size % 3 == 0 and t.mode == "lines" and t.type == "scatter"
    at = np.rint(x[0::3] + half)
    assert np.array_equal(x[0::3], at - half) and np.array_equal(x[1::3], at + half)
    assert np.isnan(x[2::3]).all() and np.isnan(y[2::3]).all()
    assert np.array_equal(y[0::3], y[1::3], equal_nan=True)
    return at.astype(int), y[0::3]


def originals(fig) -> tuple:
    """The original row as ``plot_blocks`` draws it (a level from i - 0.45 to i + 0.45 at
    log2 |x_i| for each element, each element's block and x in its hover data), checked to be that
    shape: the heights, the blocks and the values, one per element."""
    t = traces(fig)["original"]
    at, y = level_elements(t, 0.45)
    assert np.array_equal(at, np.arange(at.size))
    data = np.asarray(t.customdata, np.float64)
    assert np.array_equal(data[0::3], data[1::3], equal_nan=True) and np.isnan(data[2::3]).all()
    return y, data[0::3, 0], data[0::3, 1]


def marked(fig, kind: str) -> np.ndarray:
    """The elements ``plot_blocks`` marks saturated or flushed (a thick level from i - 0.45 to
    i + 0.45 at the dequantized value), checked to be that shape and to sit on the dequantized
    values."""
    at, y = level_elements(traces(fig)[kind], 0.45)
    assert np.array_equal(y, on_axis(fig, dequantized(fig)[at]), equal_nan=True)
    return at


def errors(fig) -> np.ndarray:
    """The relative-error row as ``plot_blocks`` draws it (a centred step from -0.5 to n - 0.5,
    filled to 0), checked to be that shape, as one value per element."""
    t = traces(fig)["error"]
    x, y = np.asarray(t.x, float), np.asarray(t.y, float)
    n = x.size - 2
    assert t.line.shape == "hvh" and t.fill == "tozeroy" and t.type == "scatter"
    assert np.array_equal(x, np.concatenate([[-0.5], np.arange(n), [n - 0.5]]))
    assert np.array_equal(np.asarray(t.customdata), np.concatenate([[0], np.arange(n), [n - 1]]))
    assert np.array_equal(y[[0, -1]], y[[1, -2]], equal_nan=True)
    return y[1:-1]


def assert_figure_follows(fig, x, result, fmt):
    """Every trace of ``plot_blocks`` holds what the result says, element by element."""
    t = traces(fig)
    n, blocks = x.size, result.scales.size
    bs = n // blocks
    orig_y, orig_block, orig_x = originals(fig)
    assert np.array_equal(orig_y, on_axis(fig, x), equal_nan=True)
    assert np.array_equal(orig_x, x.astype(np.float64), equal_nan=True)
    assert np.array_equal(dequantized(fig), result.values, equal_nan=True)
    s = scale_values(result)
    top = get_format(fmt).max * s.astype(np.float64)
    least = get_format(fmt).smallest_subnormal * s.astype(np.float64)
    for kind, bound in (("range", top), ("least", least)):
        assert np.array_equal(np.asarray(t[kind].y, float)[0::3], on_axis(fig, bound), equal_nan=True), kind
        assert np.array_equal(np.asarray(t[kind].x, float)[0::3], np.arange(blocks) * bs - 0.5), kind
    # every magnitude drawn is on the value axis, and the zero row under its lowest power of two
    drawn = np.concatenate([np.asarray(t[k].y, float) for k in ("range", "least", "original", "dequantized")])
    lo, hi = fig.layout.yaxis.range
    assert lo < np.nanmin(drawn) and np.nanmax(drawn) < hi
    assert fig.layout.yaxis.tickvals[0] == fig.layout.meta["zero_y"] and fig.layout.yaxis.ticktext[0] == "0"
    assert fig.layout.meta["zero_y"] + 1 < min(fig.layout.yaxis.tickvals[1:])
    assert fig.layout.meta["scales"] == [float(v) for v in s] and fig.layout.meta["block_size"] == bs
    assert fig.layout.meta["scale_codes"] == result.scales.tolist() and fig.layout.meta["fmt"] == get_format(fmt).name
    sat = np.flatnonzero(np.abs(x.astype(np.float64)) > np.repeat(top, bs))
    flushed = np.flatnonzero((x != 0) & (result.values == 0))
    for kind, want in (("saturated", sat), ("flushed", flushed)):
        assert np.array_equal(marked(fig, kind), want), kind
    with np.errstate(divide="ignore", invalid="ignore"):
        err = np.where(x != 0, np.abs(result.values.astype(np.float64) - x) / np.abs(x.astype(np.float64)), 0.0)
    assert np.allclose(errors(fig), err, rtol=0, atol=0, equal_nan=True)
    worst = [float(err[b * bs:(b + 1) * bs].max()) for b in range(blocks)]
    assert fig.layout.meta["block_worst"] == worst
    assert len([s for s in fig.layout.shapes if s.type == "line"]) == blocks - 1
    # hovering an element names its block, and its dequantized value its block's scale (the text
    # written above the block)
    assert np.array_equal(orig_block, np.arange(n) // bs)
    above = list(t["scale"].text)
    assert len(above) == blocks and np.array_equal(t["scale"].x, np.arange(blocks) * bs + (bs - 1) / 2)
    assert [row[0] for row in t["dequantized"].customdata] == [above[i // bs] if k < 2 else None
                                                              for i in range(n) for k in range(3)]
    assert "q = %{customdata[1]" in t["dequantized"].hovertemplate and "%{customdata[0]}" in t["dequantized"].hovertemplate
    assert "x = %{customdata[1]" in t["original"].hovertemplate and "%{y:.3~%}" in t["error"].hovertemplate
    assert "element %{x:.0f}" in t["dequantized"].hovertemplate and "element %{customdata}" in t["error"].hovertemplate
    return err


def assert_explorer_follows(ex, scheme="fp8_e4m3", block=32, rounding="floor", pts=True, data="normal", k=8, seed=0,
                            hadamard=False):
    assert ex.error is None
    x, result = expected(scheme, block, rounding, pts, data, k, seed, hadamard)
    assert np.array_equal(ex.x, x) and np.array_equal(ex.data, row(data, k, seed))
    assert type(ex.result) is type(result)
    for a, b in zip(ex.result, result):
        assert (a is None and b is None) or np.array_equal(a, b, equal_nan=True)
    err = assert_figure_follows(ex.figure, x, result, "fp4_e2m1" if scheme == "nvfp4" else scheme)
    read = text(ex.readout)
    nz = err[x != 0]
    assert f"mean relative error {_share(nz.mean())} · max {_share(nz.max())}" in read
    meta = ex.figure.layout.meta
    assert f"saturated {_share(meta['saturated'] / 128)} ({meta['saturated']})" in read
    assert f"flushed to zero {_share(meta['flushed'] / 128)} ({meta['flushed']})" in read
    # the table's rows: the block, its scale (NVFP4: the E4M3 scale written above the block, then
    # the scale it makes with the tensor scale), the worst relative error
    rows = [re.findall(r"<td[^>]*>([^<]*)</td>", r) for r in re.findall(r"<tr>(.*?)</tr>", ex.readout.value)[1:]]
    assert [int(r[0]) for r in rows] == list(range(result.scales.size))
    assert [html.unescape(r[-1]) for r in rows] == [_share(w) for w in meta["block_worst"]]
    assert all(len(r) == (4 if scheme == "nvfp4" else 3) for r in rows)
    if scheme == "nvfp4":
        assert [html.unescape(r[1]) for r in rows] == list(next(t for t in ex.figure.data
                                                                if t.meta["kind"] == "scale").text)
    assert ("After undoing the transform" in read) == hadamard


def _share(v):
    from ampviz.plots import format_share

    return format_share(v)


# ----- the explorer follows ampviz.formats.blocks -----
def test_the_explorer_starts_as_mx_quantize_predicts():
    ex = BlockExplorer()
    assert_explorer_follows(ex)
    assert ex.figure.layout.meta["scheme"] == "mx" and ex.result.scales.size == 4
    assert ex.tensor_scale_checkbox.disabled and not ex.block_dropdown.disabled


@pytest.mark.parametrize("scheme", MX + ["nvfp4"])
def test_every_scheme_follows_ampviz_blocks(scheme):
    ex = BlockExplorer()
    ex.scheme_dropdown.value = scheme
    assert_explorer_follows(ex, scheme=scheme)
    assert ex.block_dropdown.disabled == ex.rounding_dropdown.disabled == (scheme == "nvfp4")
    assert ex.tensor_scale_checkbox.disabled == (scheme != "nvfp4")


@pytest.mark.parametrize("control, value, kw", [
    ("block_dropdown", 16, dict(block=16)),
    *[("rounding_dropdown", r, dict(rounding=r)) for r in MX_ROUNDING[1:]],
    ("data_dropdown", "lognormal", dict(data="lognormal")),
    ("outlier_slider", 13, dict(k=13)),
    ("seed_input", 7, dict(seed=7)),
    ("hadamard_checkbox", True, dict(hadamard=True)),
])
def test_every_mx_control_follows_ampviz_blocks(control, value, kw):
    ex = BlockExplorer("fp4_e2m1")
    before = json.dumps(ex.figure.to_plotly_json()["data"], default=str)
    getattr(ex, control).value = value
    assert_explorer_follows(ex, scheme="fp4_e2m1", **kw)
    core_changed = not np.array_equal(expected("fp4_e2m1", **kw)[1].scales, expected("fp4_e2m1")[1].scales) or \
        not np.array_equal(expected("fp4_e2m1", **kw)[1].values, expected("fp4_e2m1")[1].values)
    assert (json.dumps(ex.figure.to_plotly_json()["data"], default=str) != before) == core_changed
    assert core_changed or control == "rounding_dropdown"  # every other control changes this row


@pytest.mark.parametrize("control, value, kw", [
    ("tensor_scale_checkbox", False, dict(pts=False)),
    ("hadamard_checkbox", True, dict(hadamard=True)),
    ("outlier_slider", 3, dict(k=3)),
    ("data_dropdown", "lognormal", dict(data="lognormal")),
])
def test_every_nvfp4_control_follows_ampviz_blocks(control, value, kw):
    ex = BlockExplorer("nvfp4")
    getattr(ex, control).value = value
    assert_explorer_follows(ex, scheme="nvfp4", **kw)
    if control == "tensor_scale_checkbox":
        assert ex.result.tensor_scale is None and ex.figure.layout.meta["tensor_scale"] is None


def test_a_wiring_that_ignored_a_control_would_fail():
    """Block size, rounding and the per-tensor scale each change what is drawn, as the core says."""
    ex = BlockExplorer()
    ex.block_dropdown.value = 16
    assert ex.figure.layout.meta["block_size"] == 16 and ex.result.scales.size == 8
    assert not np.array_equal(ex.result.values, expected()[1].values)
    ex.rounding_dropdown.value = "ceil"  # the outlier 2^8 is a power of two: only the others' blocks change
    floor = expected(block=16)[1].scales
    assert (ex.result.scales.astype(int) - floor == (np.arange(8) != 2)).all()
    ex = BlockExplorer("nvfp4")
    two = ex.result.values
    ex.tensor_scale_checkbox.value = False
    assert not np.array_equal(ex.result.values, two)


@pytest.mark.parametrize("fmt", MX)
def test_the_outlier_raises_its_blocks_scale_and_its_neighbours_error(fmt):
    """The outlier 2^k sits in block 1 (elements 32-63): its scale is 2^(k - emax) (floor), the
    other blocks keep theirs, and its neighbours' errors grow with k until they flush to zero."""
    f = get_format(fmt)
    ex = BlockExplorer(fmt, log2_outlier=0)
    others = ex.result.scales[[0, 2, 3]].copy()
    last = None
    for k in range(2, 25, 2):
        ex.outlier_slider.value = k
        assert_explorer_follows(ex, scheme=fmt, k=k)
        assert int(ex.result.scales[1]) == k - f.emax + 127
        assert np.array_equal(ex.result.scales[[0, 2, 3]], others)
        err = errors(ex.figure)
        neighbours = np.delete(err[32:64], 37 - 32)
        if last is not None:  # a power-of-two scale: each neighbour's error only grows
            assert (neighbours >= last).all()
        last = neighbours
        assert err[37] == 0  # the outlier itself is exact
    # at 2^24 a neighbour flushes to zero exactly when x / scale is below half the smallest subnormal
    x = np.delete(ex.x[32:64], 37 - 32).astype(np.float64)
    tiny = np.abs(x) / 2.0 ** (24 - f.emax) < f.smallest_subnormal / 2
    assert np.array_equal(neighbours == 1, tiny)
    assert tiny.all() == (fmt != "fp8_e5m2")  # E5M2 reaches down to 2^-16: its neighbours survive


def test_fp4_flushes_the_neighbours_that_fp8_keeps():
    x, r = expected("fp4_e2m1", k=12)
    flushed = np.flatnonzero((x != 0) & (r.values == 0))
    assert set(range(32, 64)) - {37} <= set(flushed.tolist())  # the whole block of the outlier
    assert (expected("fp4_e2m1", k=0)[1].values[32:64] == 0).sum() <= 2  # without the outlier: one or two
    ex = BlockExplorer("fp4_e2m1", log2_outlier=12)
    assert np.array_equal(marked(ex.figure, "flushed"), flushed)
    ex.scheme_dropdown.value = "fp8_e4m3"
    kept = marked(ex.figure, "flushed")
    assert ((kept >= 32) & (kept < 64)).sum() <= 2  # E4M3 keeps the outlier's neighbours


# ----- every position valid; bad input a one-line message -----
@FUZZ
@given(scheme=st.sampled_from(MX + ["nvfp4"]), block=st.sampled_from([16, 32]), rounding=st.sampled_from(MX_ROUNDING),
       pts=st.booleans(), data=st.sampled_from(["normal", "lognormal"]), k=st.integers(-10, 40),
       seed=st.integers(-5, 2**33), hadamard=st.booleans())
def test_every_control_position_follows_the_core(scheme, block, rounding, pts, data, k, seed, hadamard):
    ex = _shared()
    ex.scheme_dropdown.value = scheme
    ex.block_dropdown.value = block
    ex.rounding_dropdown.value = rounding
    ex.tensor_scale_checkbox.value = pts
    ex.data_dropdown.value = data
    ex.outlier_slider.value = k  # the slider holds it between 0 and 24
    ex.seed_input.value = seed  # held between 0 and 2^32 - 1
    ex.hadamard_checkbox.value = hadamard
    k, seed = ex.outlier_slider.value, ex.seed_input.value
    assert 0 <= k <= 24 and 0 <= seed < 2**32
    assert ex.error is None
    assert_explorer_follows(ex, scheme, 16 if scheme == "nvfp4" else block, rounding, pts, data, k, seed, hadamard)


_LAB = []


def _shared():
    if not _LAB:
        _LAB.append(BlockExplorer())
    return _LAB[0]


@settings(max_examples=60, deadline=None)
@given(kwargs=st.dictionaries(st.sampled_from(["scheme", "block_size", "rounding", "per_tensor_scale", "data",
                                               "log2_outlier", "hadamard", "seed", "n", "outlier_at"]),
                              ANYTHING, max_size=3))
def test_every_constructor_argument_is_valid_or_a_one_line_message(kwargs):
    if refused(lambda: BlockExplorer(**kwargs)) is None:
        ex = BlockExplorer(**kwargs)
        assert ex.error is None and ex.figure is not None


@pytest.mark.parametrize("kwargs, message", [
    (dict(scheme="mxfp8"), "scheme must be one of 'fp8_e4m3'"),
    (dict(block_size=64), "block_size must be 16 or 32"),
    (dict(block_size=True), "block_size must be 16 or 32"),
    (dict(rounding="up"), "rounding must be one of 'floor', 'ceil', 'even', 'rceil'"),
    (dict(per_tensor_scale="yes"), "per_tensor_scale must be True or False"),
    (dict(data="uniform"), "data must be one of 'normal', 'lognormal'"),
    (dict(log2_outlier=25), "log2_outlier must be between 0 and 24"),
    (dict(log2_outlier=2.5), "log2_outlier must be a whole number"),
    (dict(hadamard=1), "hadamard must be True or False"),
    (dict(seed=-1), "seed must be between 0 and"),
    (dict(n=96 + 16), "n must be a multiple of 32"),
    (dict(n=512), "n must be between 64 and 256"),
    (dict(outlier_at=128), "outlier_at must be between 0 and 127"),
])
def test_the_constructor_says_what_is_wrong(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=re.escape(message)) as info:
        BlockExplorer(**kwargs)
    assert one_line(str(info.value))


def test_the_constructor_sets_the_controls():
    ex = BlockExplorer("nvfp4", per_tensor_scale=False, data="lognormal", hadamard=True, seed=3, n=64)
    assert ex.x.size == 64 and ex.result.tensor_scale is None and ex.outlier_slider.disabled
    x = random_hadamard_transform(row("lognormal", seed=3, n=64))
    assert np.array_equal(ex.result.values, nvfp4_quantize(x, per_tensor_scale=False).values)


# ----- one view, updated in place; moves from the browser coalesced -----
def _sent(view):
    from ampviz.widgets.figureview import _to_json

    return json.dumps([_to_json(view.data, view), _to_json(view.figure_layout, view)], sort_keys=True)


def test_the_figure_is_updated_in_place_and_classes_are_stable():
    from ampviz.widgets.figureview import FigureView

    ex = BlockExplorer()
    view = ex.view
    assert isinstance(view, FigureView) and contains(ex.ui, view)
    ex.scheme_dropdown.value = "nvfp4"
    assert ex.view is view and _sent(view) == _sent(BlockExplorer("nvfp4").view)
    classes = {c for w in (ex.scheme_dropdown, ex.block_dropdown, ex.rounding_dropdown, ex.tensor_scale_checkbox,
                           ex.data_dropdown, ex.outlier_slider, ex.seed_input, ex.hadamard_checkbox, ex.readout,
                           ex.view, ex.ui, ex.message) for c in w._dom_classes}
    assert {"ampviz-blocks-scheme", "ampviz-blocks-block-size", "ampviz-blocks-rounding", "ampviz-blocks-tensor-scale",
            "ampviz-blocks-data", "ampviz-blocks-outlier", "ampviz-blocks-seed", "ampviz-blocks-hadamard",
            "ampviz-blocks-readout", "ampviz-blocks-figure", "ampviz-block-explorer", "ampviz-message"} <= classes


def test_browser_moves_are_coalesced_and_the_last_position_wins(monkeypatch):
    ex = BlockExplorer("fp4_e2m1")
    values = list(range(9, 19))
    move_quickly(ex, "outlier_slider", values, monkeypatch)
    fresh = BlockExplorer("fp4_e2m1", log2_outlier=values[-1])
    assert _sent(ex.view) == _sent(fresh.view) and ex.readout.value == fresh.readout.value
    assert _sent(ex.view) != _sent(BlockExplorer("fp4_e2m1", log2_outlier=values[-2]).view)
    assert_explorer_follows(ex, "fp4_e2m1", k=values[-1])


def test_the_next_outlier_positions_are_drawn_ahead_and_are_exact():
    ex = BlockExplorer()
    ex.outlier_slider.set_state({"value": 10})
    assert ex.settle(30)
    keys = [dict(k)["log2_outlier"] for k in ex._drawn_states]
    assert 11 in keys and 9 in keys and keys.index(11) < keys.index(9)
    ex.outlier_slider.set_state({"value": 11})
    assert ex.settle(30)
    assert _sent(ex.view) == _sent(BlockExplorer(log2_outlier=11).view)
    assert len(ex._drawn_states) <= ex.KEPT_DRAWN


def test_the_work_ahead_waits_for_the_front_end_and_a_new_move_ends_the_wait():
    """After a browser's move is drawn and sent, the worker waits AHEAD_DELAY before it draws
    the next positions ahead (on two cores that work took the CPU from the server relaying the
    move and the browser drawing it); a move that comes meanwhile is drawn at once."""
    import time

    ex = BlockExplorer()
    ex.AHEAD_DELAY = 30.0
    ex.outlier_slider.set_state({"value": 10})
    deadline = time.monotonic() + 30
    while int(ex.outlier_slider.value) != 10 or ex.result is None or int(ex.result.scales[1]) != 10 - 8 + 127:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.3)
    assert not ex.settle(0)  # waiting: the worker is alive, and nothing is drawn ahead yet
    assert [dict(k)["log2_outlier"] for k in ex._drawn_states] == [8, 10]
    t = time.monotonic()
    ex.AHEAD_DELAY = 0.0
    ex.outlier_slider.set_state({"value": 12})  # ends the wait: drawn at once, then worked ahead
    assert ex.settle(20) and time.monotonic() - t < 20
    assert int(ex.result.scales[1]) == 12 - 8 + 127
    keys = [dict(k)["log2_outlier"] for k in ex._drawn_states]
    assert 13 in keys and 11 in keys


def test_a_move_made_in_python_redraws_before_it_returns():
    ex = BlockExplorer()
    ex.outlier_slider.value = 12
    assert ex._worker is None and int(ex.result.scales[1]) == 12 - 8 + 127 and ex.settle(0)


# ----- plot_blocks -----
def test_plot_blocks_marks_saturation_under_floor():
    """E4M3 floor: an amax of 500 gets scale 1 and is held at 448 (the OCP rule's overflow)."""
    x = np.linspace(-3, 3, 32).astype(np.float32)
    x[5] = 500
    r = mx_quantize(x, "fp8_e4m3", 32, "floor")
    fig = plot_blocks(x, r)
    assert_figure_follows(fig, x, r, "fp8_e4m3")
    assert marked(fig, "saturated").tolist() == [5] and dequantized(fig)[5] == 448
    assert marked(plot_blocks(x, mx_quantize(x, "fp8_e4m3", 32, "rceil")), "saturated").size == 0
    assert plot_blocks(x, r, title="mine").layout.title.text == "mine"


def test_plot_blocks_nvfp4_scale_is_the_e4m3_block_scale_times_the_tensor_scale():
    x = np.array([0, .3, -.7, 1.2, 2.6, 5.1, 6, 7.9, -12, .01, .02, .05, 1, 2, 3, 4] * 2, np.float32)
    r = nvfp4_quantize(x)
    fig = plot_blocks(x, r)
    assert_figure_follows(fig, x, r, FP4_E2M1)
    assert fig.layout.meta["scale_codes"] == [126, 126] and fig.layout.meta["tensor_scale"] == float(r.tensor_scale)
    assert np.array_equal(dequantized(fig)[:16], [0, 0, -1, 1, 3, 6, 6, 8, -12, 0, 0, 0, 1, 2, 3, 4])


@pytest.mark.parametrize("bad, result, message", [
    ([1.0] * 32, "not a result", "result must be MXBlocks or NVFP4Blocks"),
    ([1.0] * 16, mx_quantize([1.0] * 32, "fp8_e4m3"), "x must be one row and result its quantization"),
    ([[1.0] * 32], mx_quantize([[1.0] * 32], "fp8_e4m3"), "x must be one row"),
])
def test_plot_blocks_refuses_what_does_not_fit(bad, result, message):
    with pytest.raises((TypeError, ValueError), match=re.escape(message)) as info:
        plot_blocks(bad, result)
    assert one_line(str(info.value))
    with pytest.raises(TypeError, match="title must be a string"):
        plot_blocks([1.0] * 32, mx_quantize([1.0] * 32, "fp8_e4m3"), title=3)


def _wire_and_json(fig):
    import plotly.io as pio

    from ampviz.widgets.figureview import pack

    return json.dumps(pack(fig.to_plotly_json()), sort_keys=True), json.loads(pio.to_json(fig))


@settings(max_examples=30, deadline=None)
@given(scheme=st.sampled_from(MX + ["nvfp4", "nvfp4-single"]), block=st.sampled_from([16, 32]),
       rounding=st.sampled_from(MX_ROUNDING), blocks=st.integers(1, 8),
       special=st.lists(st.sampled_from([0.0, np.inf, -np.inf, np.nan, 1e30, 1e-30, 448.0, -0.0]), max_size=4),
       seed=st.integers(0, 100))
def test_plot_blocks_holds_what_validation_gives(scheme, block, rounding, blocks, special, seed):
    import plotly.graph_objects as go

    rng = np.random.default_rng(seed)
    n = 32 * blocks
    x = (rng.standard_normal(n) * 2.0 ** rng.integers(-20, 20, n)).astype(np.float32)
    x[rng.integers(0, n, len(special))] = special
    if scheme.startswith("nvfp4"):
        r = nvfp4_quantize(x, per_tensor_scale=scheme == "nvfp4")
    else:
        r = mx_quantize(x, scheme, block, rounding)
    fig = plot_blocks(x, r)
    assert _wire_and_json(fig) == _wire_and_json(go.Figure(fig.to_plotly_json()))
    if not special:
        assert_figure_follows(fig, x, r, "fp4_e2m1" if scheme.startswith("nvfp4") else scheme)


def test_a_share_below_a_hundredth_of_a_percent_is_escaped_in_the_readout():
    ex = BlockExplorer(block_size=16, log2_outlier=16, seed=1, hadamard=True)
    assert "&lt;0.01%" in ex.readout.value and "<0.01%" not in ex.readout.value
    assert_explorer_follows(ex, block=16, k=16, seed=1, hadamard=True)


def test_the_outlier_grows_against_a_still_value_axis():
    """Every outlier position draws one layout (the value axis holds the rows at the slider's two
    ends), so a move only moves the marks; the legend then names the marks without counts, which
    the readout gives. Without ``hold`` the axis fits its own row, and moves with the outlier."""
    from ampviz.widgets.figureview import FigureView

    ex = BlockExplorer("fp4_e2m1", log2_outlier=0)
    keys = set()
    for k in range(ex.outlier_slider.min, ex.outlier_slider.max + 1):
        ex.outlier_slider.value = k
        keys.add(FigureView.prepare(ex.figure).layout_key)
        assert_explorer_follows(ex, scheme="fp4_e2m1", k=k)
    assert len(keys) == 1
    t = traces(ex.figure)
    assert (t["saturated"].name, t["flushed"].name) == ("saturated (held at the block's max)", "flushed to 0")
    assert f"({ex.figure.layout.meta['flushed']:,})" in text(ex.readout)
    lo, hi = ex.figure.layout.yaxis.range
    for x, result in ex._outlier_ends():
        y = on_axis(ex.figure, np.concatenate([x, result.values]))
        assert lo < np.nanmin(y) and np.nanmax(y) < hi
    low, high = (plot_blocks(x, r).layout.yaxis.range for x, r in ex._outlier_ends())
    assert low != high and tuple(low) != (lo, hi)
    # the lognormal data place no outlier: the slider is off and the axis fits the row
    ex.data_dropdown.value = "lognormal"
    assert ex._outlier_ends() == () and ex.figure.layout.yaxis.range == plot_blocks(ex.x, ex.result).layout.yaxis.range


@pytest.mark.parametrize("scheme", ["fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1", "nvfp4"])
def test_the_dotted_floor_is_where_values_flush(scheme):
    """The lesson's reading of the dotted step (each block's smallest nonzero value): a value
    flushes to 0 exactly when it is at most half of it, as the real quantizer decides (every
    power of two of the row's span, on both sides of that half)."""
    k = np.arange(-40, 8, 0.25)
    x = np.concatenate([2.0 ** k, -(2.0 ** k)]).astype(np.float32)
    x = np.concatenate([x, np.zeros((-x.size) % 32, np.float32)])
    x[5] = 2.0**10  # an outlier lifts the first block's range
    r = nvfp4_quantize(x) if scheme == "nvfp4" else mx_quantize(x, scheme, 32)
    fig = plot_blocks(x, r)
    bs = fig.layout.meta["block_size"]
    least = 2.0 ** np.repeat(np.asarray(traces(fig)["least"].y, float)[0::3], bs)
    flushed = np.zeros(x.size, bool)
    flushed[marked(fig, "flushed")] = True
    assert flushed.any() and (~flushed & (x != 0)).any()
    assert np.array_equal(flushed, (x != 0) & (np.abs(x) <= least / 2))
    assert np.array_equal(flushed, (x != 0) & (r.values == 0))


@pytest.mark.parametrize("hold, message", [
    ("rows", "hold must be a list of (x, result) pairs, got str"),
    ([[1.0] * 32], "hold must be a list of (x, result) pairs, got an item"),
    ([([1.0] * 16, mx_quantize([1.0] * 32, "fp8_e4m3"))], "each held x must be one row and result its quantization"),
    ([([1.0] * 32, "no")], "result must be MXBlocks or NVFP4Blocks"),
])
def test_plot_blocks_refuses_a_hold_that_is_not_rows_and_their_results(hold, message):
    x = [1.0] * 32
    with pytest.raises((TypeError, ValueError), match=re.escape(message)) as info:
        plot_blocks(x, mx_quantize(x, "fp8_e4m3"), hold=hold)
    assert one_line(str(info.value))
    with pytest.raises(TypeError, match="legend_counts must be True or False"):
        plot_blocks(x, mx_quantize(x, "fp8_e4m3"), legend_counts="no")


def test_lesson_13s_static_figure_shows_what_its_text_says():
    """Lesson 13's static figure (the row of its section 1: N(0, 1) from seed 0 with 2^10 at
    element 37, MXFP4 in blocks of 32): block 1's scale is 2^8, its range runs from 2^7 (dotted)
    to 6 × 2^8 (solid), far above its other 31 values, which sit on the 0 row, flushed; the
    other blocks keep 2^-1."""
    x = np.random.default_rng(0).standard_normal(128).astype(np.float32)
    x[37] = 2.0**10
    fig = plot_blocks(x, mx_quantize(x, "fp4_e2m1"))
    t = traces(fig)
    assert list(t["scale"].text) == ["2^-1", "2^8", "2^-1", "2^-1"]
    assert np.asarray(t["least"].y, float)[3] == 7 and np.asarray(t["range"].y, float)[3] == np.log2(6 * 2.0**8)
    others = np.array([i for i in range(32, 64) if i != 37])
    assert set(marked(fig, "flushed").tolist()) >= set(others.tolist())
    assert np.all(originals(fig)[0][others] < 7)  # below the dotted step
    assert np.all(dequantized(fig)[others] == 0) and np.all(on_axis(fig, dequantized(fig)[others]) == fig.layout.meta["zero_y"])


# ----- one name for each scale; controls that do not apply are not shown -----
def _rows(ex):
    return [[html.unescape(c) for c in re.findall(r"<td[^>]*>([^<]*)</td>", r)]
            for r in re.findall(r"<tr>(.*?)</tr>", ex.readout.value)[1:]]


def test_nvfp4_names_both_scales_of_a_block_the_same_way_in_the_table_and_the_figure():
    """Under NVFP4 the figure writes each block's E4M3 scale above it (448), while its elements
    take that × the tensor scale (0.388): the table shows both, headed as such, each row saying
    how the one makes the other, and hovering a label says the same."""
    from ampviz.plots import format_number

    ex = BlockExplorer("nvfp4")
    meta, r = ex.figure.layout.meta, ex.result
    labels = list(next(t for t in ex.figure.data if t.meta["kind"] == "scale").text)
    head = [html.unescape(h) for h in re.findall(r"<th[^>]*>([^<]*)</th>", ex.readout.value)]
    assert head == ["block", "E4M3 scale (above the block)", "scale = E4M3 scale × tensor scale",
                    "worst relative error"]
    ts = format_number(r.tensor_scale)
    e4m3 = FP8_E4M3.decode(r.scales.astype(np.int64))
    for b, row in enumerate(_rows(ex)):
        assert row[1] == labels[b] == format_number(e4m3[b])  # the label above block b
        assert row[2] == f"{labels[b]} × {ts} = {format_number(meta['scales'][b])}"
        assert meta["scale_words"][b] == f"E4M3 scale {labels[b]} × tensor scale {ts} = {format_number(meta['scales'][b])}"
    hover = next(t for t in ex.figure.data if t.meta["kind"] == "scale").hovertext
    assert list(hover) == [f"block {b}: {w}" for b, w in enumerate(meta["scale_words"])]
    assert f"multiplied by that × the per-tensor scale {ts}" in text(ex.readout)
    big = int(np.argmax(e4m3))  # the outlier's block: its label is the E4M3 maximum, 448
    assert labels[big] == "448" and _rows(ex)[big][2].startswith("448 × ")
    ex.tensor_scale_checkbox.value = False  # no tensor scale: the E4M3 scale is the scale
    rows = _rows(ex)
    assert all(row[1] == row[2] for row in rows)
    assert "with no per-tensor scale, that is the scale its values take" in text(ex.readout)
    ex.scheme_dropdown.value = "fp8_e4m3"
    assert re.findall(r"<th[^>]*>([^<]*)</th>", ex.readout.value)[1] == "scale (E8M0, above the block)"


def test_the_per_tensor_scale_box_is_hidden_and_disabled_where_it_does_not_apply():
    ex = BlockExplorer("fp8_e4m3")
    box = ex.tensor_scale_checkbox
    assert box.disabled and box.layout.display == "none"
    for scheme in ("fp8_e5m2", "fp6_e3m2", "fp4_e2m1"):
        ex.scheme_dropdown.value = scheme
        assert box.disabled and box.layout.display == "none"
    ex.scheme_dropdown.value = "nvfp4"
    assert not box.disabled and box.layout.display != "none" and box.value is True
    ex.scheme_dropdown.value = "fp8_e5m2"
    assert box.disabled and box.layout.display == "none"
    assert not BlockExplorer("nvfp4").tensor_scale_checkbox.layout.display
