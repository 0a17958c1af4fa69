"""FigureView and pack: a figure's parts travel as JSON the browser decodes back to the same
numbers (bit for bit, NaN kept as a gap), and anything that cannot travel is refused in one line
when it is assigned, never later inside the kernel's messaging."""

import base64
import json
import math

import numpy as np
import plotly.graph_objects as go
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ampviz.widgets.figureview import FigureView, pack

WIRE = {"f8": np.float64, "f4": np.float32, "i4": np.int32, "i2": np.int16, "i1": np.int8,
        "u4": np.uint32, "u2": np.uint16, "u1": np.uint8}


def decode(v):
    """What the browser's decode() does (figureview's _ESM), in Python: arrays as lists."""
    if isinstance(v, list):
        return [decode(x) for x in v]
    if isinstance(v, dict):
        if "ampviz_nd" in v:
            arr = np.frombuffer(base64.b64decode(v["b64"]), np.dtype(WIRE[v["ampviz_nd"]]).newbyteorder("<"))
            return arr.reshape(v["shape"]).tolist()
        if "bdata" in v and "dtype" in v:  # plotly's own typed-array spec, which plotly.js reads
            arr = np.frombuffer(base64.b64decode(v["bdata"]), np.dtype(v["dtype"]).newbyteorder("<"))
            return arr.reshape(v.get("shape", arr.shape)).tolist()
        return {k: decode(x) for k, x in v.items()}
    return v


def same(a, b) -> bool:
    """Equal as the browser sees them: NaN equals NaN, a non-finite scalar arrives as None."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def expected(v):
    """What pack promises, in plain Python: arrays and numeric lists as (nested) lists of numbers,
    non-finite scalars None."""
    if isinstance(v, np.ndarray):
        if v.ndim == 0:
            return expected(v.item())
        if v.dtype.kind == "b":
            return v.astype(np.uint8).tolist()
        if v.dtype.kind in "iu" and v.dtype.itemsize == 8:
            return v.astype(np.float64).tolist()
        if v.dtype.kind == "f" and v.dtype.itemsize == 2:
            return v.astype(np.float32).tolist()
        return v.tolist()
    if isinstance(v, dict):
        return {str(k): expected(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        if v and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            return np.asarray(v, dtype=np.float64).tolist()
        return [expected(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


arrays = hnp.arrays(st.sampled_from([np.float64, np.float32, np.float16, np.int64, np.int32, np.uint8, np.int8,
                                     np.bool_]),
                    hnp.array_shapes(min_dims=0, max_dims=2, max_side=5))
leaves = st.one_of(st.none(), st.booleans(), st.integers(-2**53, 2**53), st.floats(), st.text(max_size=5), arrays)
values = st.recursive(leaves, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                     st.dictionaries(st.text(max_size=4), kids, max_size=4)),
                      max_leaves=12)
bad = st.one_of(st.just({1, 2}), st.just(b"x"), st.just(1 + 2j), st.just(object()),
                st.just(np.array([1 + 1j])), st.just(np.datetime64("2020-01-01")), st.just(np.array(["2020-01-01"], "M8[D]")))


@settings(max_examples=300, deadline=None)
@given(value=values)
def test_pack_sends_what_the_browser_decodes_to_the_same_numbers(value):
    packed = pack(value)
    text = json.dumps(packed, allow_nan=False)  # valid JSON: no NaN, no inf, nothing else
    assert same(decode(json.loads(text)), expected(value))


@settings(max_examples=100, deadline=None)
@given(good=values, wrong=bad, where=st.sampled_from(["leaf", "list", "dict"]))
def test_what_cannot_travel_is_refused_in_one_line_when_assigned(good, wrong, where):
    part = {"leaf": wrong, "list": [good, wrong], "dict": {"a": good, "b": wrong}}[where]
    with pytest.raises(TypeError) as info:
        pack(part)
    assert "\n" not in str(info.value) and "cannot send" in str(info.value)
    view = FigureView()
    for call in (lambda: view.set_data([{"type": "scatter", "x": part}]),
                 lambda: view.set_layout({"title": part}),
                 lambda: view.update({"data": [{"y": part}], "layout": {}}),
                 lambda: FigureView({"data": [], "layout": {"x": part}})):
        with pytest.raises(TypeError) as info:
            call()
        assert "\n" not in str(info.value)
    assert view.data == [] and view.figure_layout == {} and view.revision == 0  # nothing half-assigned


@settings(max_examples=100, deadline=None)
@given(figure=st.one_of(values, bad, st.builds(dict, data=values, layout=values)))
def test_any_figure_argument_is_a_figure_or_one_line(figure):
    try:
        view = FigureView(figure)
    except TypeError as e:
        assert "\n" not in str(e)
        return
    assert isinstance(view.data, list) and all(isinstance(t, dict) for t in view.data)
    json.dumps(pack(view.data), allow_nan=False)


def test_exact_bits_and_gaps():
    """float32 and float64 arrays arrive bit for bit; NaN stays NaN in an array (a gap in a line)
    and becomes None as a scalar (JSON has no NaN)."""
    x64 = np.array([0.1, np.nan, -0.0, 1e-308, np.inf, 2.0**-1074])
    x32 = np.array([0.1, np.nan, 2.0**-149, 3.4e38], np.float32)
    out = decode(json.loads(json.dumps(pack({"x": x64, "y": x32, "z": float("nan")}), allow_nan=False)))
    assert np.array_equal(np.array(out["x"]).view(np.uint64), x64.view(np.uint64), equal_nan=False)
    assert np.array_equal(np.array(out["y"], np.float32).view(np.uint32), x32.view(np.uint32))
    assert out["z"] is None


def test_integers_travel_in_the_narrowest_type_that_holds_them():
    """Counts of 4,096 values and steps 0..1,999 travel as int16 whatever integer type they were
    made in (a plot need not choose one for the wire); values that need more keep more, and every
    value arrives."""
    cases = [(np.array([0, 4096], np.int32), "i2"), (np.arange(2000, dtype=np.int64), "i2"),
             (np.array([0, 200], np.int32), "u1"), (np.array([-1, 70_000], np.int32), "i4"),
             (np.array([0, 70_000], np.uint32), "i4"), (np.array([0, 2**32 - 1], np.uint32), "u4"), (np.array([-3, 3], np.int16), "i1"),
             (np.array([0, 2**40], np.int64), "f8"), (np.array([5], ">i4"), "i1")]
    for a, wire in cases:
        packed = pack(a)
        assert packed["ampviz_nd"] == wire, (a.dtype, a.tolist())
        assert decode(json.loads(json.dumps(packed))) == a.tolist()
    counts = np.full(2000, 4096, np.int32)  # two bytes each on the wire, not four
    assert base64.b64decode(pack(counts)["b64"]) == counts.astype("<i2").tobytes()


def test_a_plotly_figure_round_trips():
    fig = go.Figure(go.Scatter(x=np.arange(5), y=np.array([1.0, np.nan, 3.0, 4.0, 5.0])), layout={"title": "t"})
    view = FigureView(fig)
    trace = decode(pack(view.data))[0]
    assert trace["x"] == [0, 1, 2, 3, 4] and math.isnan(trace["y"][1]) and trace["y"][2] == 3.0
    assert view.figure_layout["title"]["text"] == "t"
    with pytest.raises(TypeError, match="list of trace dicts"):
        FigureView({"data": [1, 2], "layout": {}})
    with pytest.raises(TypeError, match="a figure must be a plotly Figure"):
        FigureView("figure")


def test_a_prepared_figure_sends_what_the_figure_sends_and_is_not_packed_twice():
    """``prepare`` packs ahead of time; ``update(prepared)`` then sends exactly what
    ``update(figure)`` sends (a second pack would turn the packed arrays' shapes into arrays)."""
    import plotly.graph_objects as go

    from ampviz.widgets.figureview import Prepared, _to_json

    fig = go.Figure(go.Scatter(x=np.arange(5), y=np.linspace(0, 1, 5)), layout={"title": {"text": "t"}})
    prepared = FigureView.prepare(fig)
    assert isinstance(prepared, Prepared)
    a, b = FigureView(), FigureView()
    a.update(fig)
    b.update(prepared)
    assert _to_json(a.data, a) == _to_json(b.data, b) and _to_json(a.figure_layout, a) == _to_json(b.figure_layout, b)
    assert a._shown_layout == b._shown_layout and a.revision == b.revision == 1
    lists = [{"type": "scatter", "x": [0.0, 1.0], "y": [2.0, 3.0]}]
    assert pack(pack(lists)) != pack(lists)  # why it matters: a packed array's shape is a list of numbers
    b.update(FigureView.prepare(go.Figure(go.Scatter(x=[1, 2], y=[3, 4]), layout={"title": {"text": "t"}})))
    assert b._shown_layout == a._shown_layout and b.revision == 2  # same layout: only the data went
    with pytest.raises(TypeError, match="plotly Figure or a dict"):
        FigureView.prepare(object())


def test_layout_meta_stays_with_the_figure():
    """``layout.meta`` (facts for Python; plotly draws nothing from it) does not travel: figures
    that differ only in it send their layout once, and the view's layout has none."""
    from ampviz.widgets.figureview import FigureView

    def figure(worst):
        return {"data": [{"type": "scatter", "x": [0, 1], "y": [worst, 1]}],
                "layout": {"title": {"text": "t"}, "meta": {"worst": worst}}}

    view = FigureView(figure(1))
    sent = []
    view.observe(lambda c: sent.append(c["name"]), names=["data", "figure_layout"])
    view.update(figure(2))
    view.update(FigureView.prepare(figure(3)))
    assert sent == ["data", "data"] and "meta" not in view.figure_layout and view.figure_layout["title"]["text"] == "t"
    view.set_layout({"title": {"text": "u"}, "meta": {"worst": 4}})
    assert "meta" not in view.figure_layout and sent[-1] == "figure_layout"
