"""Which weight updates a low-precision weight loses: ``ampviz.formats.lesson.update_lost`` and
``lost_band`` (and the figure ``ampviz.plots.plot_lost_band``), checked against torch's own
arithmetic on every finite fp16 weight and every finite bf16 weight.

The references are the torch operations an update goes through:

* ``w + u`` with ``w`` a float16/bfloat16 tensor and ``u`` a Python float, or a tensor of w's
  dtype (torch casts a Python float to w's dtype first): ``update_lost(w, u, fmt)``. Vectorised
  here as ``w + u.to(w.dtype)``; ``test_a_python_float_is_cast_to_the_weights_dtype_first``
  shows that this is what a Python float does.
* ``w.add_(u)`` with ``u`` a float32 tensor, and an SGD step on fp16 weights, which add in fp32
  and round the fp32 sum into w's dtype: ``update_lost(w, u, fmt, via="fp32")``.

The updates are a grid relative to each weight (u = ±w · 2^-k · (1 + j/8), spanning the band of
lost updates), the exact ties at half the gap to each neighbour, and the values next to them.
The lesson's rule (lost exactly when |u| is at most half the gap on u's side, a tie lost only on
a weight whose last mantissa bit is 0) is checked against torch on the same cases, and the old
rule ("lost iff the weight is >= 2048 times larger") is shown to disagree with torch.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ampviz.formats import lesson as L
from ampviz.formats import BF16, FP16, FP32, get_format

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
#: 2^(emax + 1): where the gap above a format's max ends (its rounding boundary is halfway there).
BEYOND_MAX = {"fp16": 2.0**16, "bf16": 2.0**128}
#: k of the relative grid u = ±w · 2^-k · (1 + j/8): the band lies between 2^-(m+2) and 2^-(m+1) of w.
GRID_K = {"fp16": range(9, 14), "bf16": range(6, 11)}


def all_weights(fmt: str) -> torch.Tensor:
    """Every finite value of fmt, from its bit patterns (torch's own decoding)."""
    bits = torch.from_numpy(np.arange(1 << 16, dtype=np.uint16).view(np.int16))
    w = bits.view(DTYPES[fmt])
    return w[torch.isfinite(w)]


def neighbours(w: torch.Tensor, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """(value below, value above) each weight, as float64; past max, 2^(emax+1) stands in for inf."""
    inf = torch.full_like(w, math.inf)
    up = torch.nextafter(w, inf).double().numpy()
    down = torch.nextafter(w, -inf).double().numpy()
    up[np.isinf(up)] = BEYOND_MAX[fmt]
    down[np.isinf(down)] = -BEYOND_MAX[fmt]
    return down, up


def half_gaps(w: torch.Tensor, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """(half the gap below w, half the gap above w), both positive, exact in float64."""
    w64 = w.double().numpy()
    down, up = neighbours(w, fmt)
    return (w64 - down) / 2, (up - w64) / 2


def relative_grid(fmt: str) -> list[float]:
    return [s * 2.0**-k * (1 + j / 8) for s in (1.0, -1.0) for k in GRID_K[fmt] for j in range(8)]


def torch_lost(w: torch.Tensor, u: np.ndarray) -> np.ndarray:
    """torch's ``w + u`` with u stored in w's dtype (what a Python float u is): did w stay?"""
    ut = torch.from_numpy(np.asarray(u, dtype=np.float64)).to(w.dtype)
    return ((w + ut) == w).numpy()


def torch_lost_fp32(w: torch.Tensor, u: np.ndarray) -> np.ndarray:
    """torch's ``w.add_(u)`` with u an fp32 tensor (added in fp32, rounded into w's dtype)."""
    ut = torch.from_numpy(np.asarray(u, dtype=np.float64)).to(torch.float32)
    return (w.clone().add_(ut) == w).numpy()


def cases(w: torch.Tensor, fmt: str):
    """(name, u as float64 array) for the grid, the ties and their neighbours in fmt and in fp32."""
    w64 = w.double().numpy()
    below, above = half_gaps(w, fmt)
    for factor in relative_grid(fmt):
        yield f"u = w * {factor:g}", w64 * factor
    for name, tie in (("+half gap above", above), ("-half gap below", -below)):
        yield name, tie
        t = torch.from_numpy(tie)
        for tdt in (DTYPES[fmt], torch.float32):  # the values of the format, and of fp32, next to the tie
            near = t.to(tdt)
            for direction in (math.inf, -math.inf):
                yield f"{name}, next {tdt} {direction:+}", torch.nextafter(near, torch.full_like(near, direction)
                                                                           ).double().numpy()


def rule_lost(w: torch.Tensor, u: np.ndarray, fmt: str) -> np.ndarray:
    """The lesson's rule, with the update stored in fmt: lost iff |u| < half the gap on u's side,
    or equal to it (a tie) on a weight whose last mantissa bit is 0."""
    uq = torch.from_numpy(np.asarray(u, dtype=np.float64)).to(w.dtype).double().numpy()
    below, above = half_gaps(w, fmt)
    half = np.where(uq > 0, above, below)
    even = (w.view(torch.int16).numpy() & 1) == 0
    return (uq == 0) | (np.abs(uq) < half) | ((np.abs(uq) == half) & even)


# ----- every finite weight, against torch -----
@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
def test_update_lost_is_torchs_addition_on_every_weight(fmt):
    w = all_weights(fmt)
    assert w.numel() == {"fp16": 63488, "bf16": 65280}[fmt]
    n = 0
    for name, u in cases(w, fmt):
        theirs = torch_lost(w, u)
        np.testing.assert_array_equal(L.update_lost(w, u, fmt), theirs, err_msg=name)
        np.testing.assert_array_equal(rule_lost(w, u, fmt), theirs, err_msg=f"the rule, {name}")
        n += theirs.size
    assert n == 90 * w.numel()  # 80 grid points, 2 ties, 8 values next to them


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
def test_update_lost_via_fp32_is_torchs_in_place_addition_on_every_weight(fmt):
    w = all_weights(fmt)
    differs = 0
    for name, u in cases(w, fmt):
        theirs = torch_lost_fp32(w, u)
        np.testing.assert_array_equal(L.update_lost(w, u, fmt, via="fp32"), theirs, err_msg=name)
        differs += int(np.count_nonzero(theirs != torch_lost(w, u)))
    assert differs > 1000  # an fp32 update is not the same as one stored in fmt: via matters


def test_how_the_update_arrives_matters_both_ways():
    """w = 1 in fp16, where the tie is 1 + 2^-11 (it rounds to 1, the even neighbour).

    u = 2^-11 + 2^-24 (an fp32 value): the exact sum is past the tie, but the fp32 sum is the fp32
    tie 1 + 2^-11 + 2^-24, which rounds to the even 1 + 2^-11, the fp16 tie: lost in torch's
    fp32 in-place addition. As a Python float it is cast to fp16 first, to 2^-11: lost as well.
    u = 2^-11 + 2^-23: cast to fp16 it is 2^-11 again (lost), but fp32 holds 1 + 2^-11 + 2^-23,
    past the tie: kept."""
    w = torch.ones(1, dtype=torch.float16)
    fp32_tie, past = 2.0**-11 + 2.0**-24, 2.0**-11 + 2.0**-23
    assert fp32_tie > L.lost_band(1.0, "fp16")[1]  # one rounding of the exact sum would keep it
    for u, stored, in_fp32 in ((fp32_tie, True, True), (past, True, False)):
        assert bool(w + u == w) is stored and L.update_lost(1.0, u, "fp16") is stored
        assert bool(w.clone().add_(torch.tensor([u])) == w) is in_fp32
        assert L.update_lost(1.0, u, "fp16", via="fp32") is in_fp32


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
def test_sgd_step_on_low_precision_weights_is_via_fp32(fmt):
    """An optimizer step on fp16/bf16 weights: ``-lr`` cast to the weight's dtype, times the
    gradient, added in fp32. Gradients chosen so that lr * grad lands around the band."""
    w = all_weights(fmt)
    w = w[w != 0]
    rng = np.random.default_rng(0)
    lr = 0.01
    rel = 2.0 ** rng.uniform(-GRID_K[fmt][-1] - 1, -GRID_K[fmt][0] + 1, size=w.numel())
    grad = torch.from_numpy(w.double().numpy() * rel * rng.choice([-1, 1], size=w.numel()) / lr).to(w.dtype)
    grad[~torch.isfinite(grad)] = 0
    p = torch.nn.Parameter(w.clone())
    p.grad = grad.clone()
    torch.optim.SGD([p], lr=lr).step()
    theirs = (p.detach() == w).numpy()
    u = get_format(fmt).quantize(-lr) * grad.double().numpy()  # exact in fp32: both are values of fmt
    np.testing.assert_array_equal(L.update_lost(w, u, fmt, via="fp32"), theirs)
    assert 0.1 < theirs.mean() < 0.9  # both fates are common


def test_a_python_float_is_cast_to_the_weights_dtype_first():
    """``w + u`` and ``w.add_(u)`` with a Python float u: what ``update_lost`` (via=None) models."""
    w = all_weights("fp16")
    for u in (2.0**-11, -(2.0**-12), -(2.0**-11), 2.0**-11 * (1 + 2.0**-23), 0.1 / 3000, -3e-8, 2.0**-25,
              2.0**-11 * (1 + 2.0**-11 + 2.0**-40), 1e-3, 16.0, -16.0, 15.99):
        ours = L.update_lost(w, u, "fp16")
        np.testing.assert_array_equal(ours, ((w + u) == w).numpy(), err_msg=repr(u))
        np.testing.assert_array_equal(ours, (w.clone().add_(u) == w).numpy(), err_msg=repr(u))
        np.testing.assert_array_equal(ours, torch_lost(w, np.full(w.shape, u)), err_msg=repr(u))


# ----- the band of lost updates -----
@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
@pytest.mark.parametrize("via", [None, "fp32"])
def test_lost_band_edges_are_exact_on_every_weight(fmt, via):
    """The edges are lost; the next update value beyond each edge is not (torch)."""
    w = all_weights(fmt)
    lo, hi = L.lost_band(w, fmt, via=via)
    assert (lo <= 0).all() and (hi >= 0).all()
    lost = torch_lost if via is None else torch_lost_fp32
    udt = w.dtype if via is None else torch.float32
    assert lost(w, hi).all() and lost(w, lo).all()
    for edge, direction in ((hi, math.inf), (lo, -math.inf)):
        e = torch.from_numpy(edge).to(udt)
        beyond = torch.nextafter(e, torch.full_like(e, direction)).double().numpy()
        assert not lost(w, beyond).any()
    assert (torch.from_numpy(hi).to(udt).double().numpy() == hi).all()  # values of the update format


@pytest.mark.parametrize("fmt, m", [("fp16", 10), ("bf16", 7)])
def test_band_is_between_a_quarter_and_a_half_eps_of_w(fmt, m):
    """For weights whose half gap is a normal value of the format above the smallest (fp16:
    |w| >= 2^-2), both edges lie between 2^-(m+2) and 2^-(m+1) of |w| (1/4096 and 1/2048 in
    fp16), both ends are reached, and an edge is the half gap itself exactly on weights whose
    last mantissa bit is 0 (elsewhere the update value just below it)."""
    f = get_format(fmt)
    w = all_weights(fmt)
    w = w[w.abs().double() >= 2.0 ** (f.emin + m + 2)]
    w64 = np.abs(w.double().numpy())
    lo, hi = L.lost_band(w, fmt)
    for edge in (hi, -lo):
        ratio = edge / w64
        assert ratio.min() == 2.0 ** -(m + 2) and ratio.max() == 2.0 ** -(m + 1)
    below, above = half_gaps(w, fmt)  # in value terms: a positive update moves towards `above`
    even = (w.view(torch.int16).numpy() & 1) == 0
    for edge, half in ((hi, above), (-lo, below)):
        np.testing.assert_array_equal(edge == half, even)
        np.testing.assert_array_equal(edge < half, ~even)


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
def test_via_fp32_moves_the_edges_by_at_most_one_fp32_step(fmt):
    """With the update and the sum in fp32, each edge lies within one fp32 step of w + u (half a
    step, plus one step of u itself) of the half gap."""
    w = all_weights(fmt)
    w = w[w.abs().double() >= 2.0 ** (get_format(fmt).emin + 1)]
    lo32, hi32 = L.lost_band(w, fmt, via="fp32")
    below, above = half_gaps(w, fmt)
    w64 = w.double().numpy()
    for edge, half, total in ((hi32, above, w64 + above), (-lo32, below, w64 - below)):
        step = np.spacing(np.abs(total).astype(np.float32)).astype(np.float64)
        u_step = np.spacing(half.astype(np.float32)).astype(np.float64)
        assert (np.abs(edge - half) <= step / 2 + u_step).all() and (np.abs(edge - half) <= step).all()
    lo16, hi16 = L.lost_band(w, fmt)
    assert (hi32 != hi16).mean() > 0.5 and (lo32 != lo16).mean() > 0.5


def test_lost_band_examples():
    assert L.lost_band(1.0, "fp16") == (-(2.0**-12), 2.0**-11)  # below 1 the grid is twice as fine
    assert L.lost_band(1.5, "fp16") == (-(2.0**-11), 2.0**-11)
    assert L.lost_band(-1.0, "fp16") == (-(2.0**-11), 2.0**-12)
    assert L.lost_band(1.0, "bf16") == (-(2.0**-9), 2.0**-8)
    assert L.lost_band(65504, "fp16") == (-15.9921875, 15.9921875)  # odd max: 65520 is inf, 65488 goes down
    assert L.lost_band(2.0**-24, "fp16") == (0.0, 0.0)  # no fp16 update is lost on a subnormal weight
    assert L.lost_band(0.0, "fp16", via="fp32") == (-(2.0**-25), 2.0**-25)  # 2^-25 ties to 0
    assert L.lost_band(448, "fp8_e4m3") == (-16.0, 448.0)  # a saturating format keeps its max
    lo, hi = L.lost_band([1.0, 1.5], "fp16")
    assert lo.tolist() == [-(2.0**-12), -(2.0**-11)] and hi.tolist() == [2.0**-11, 2.0**-11]
    assert L.largest_lost_update(-1.0, "fp16") == 2.0**-12 and L.add(-1.0, 2.0**-12, "fp16") == -1.0


# ----- the issue's examples and the old rule -----
def test_the_issues_examples():
    w = torch.tensor([1.9004], dtype=torch.float16)
    assert not bool(w + 1.9004 / 3000 == w)  # the weight is 3000x larger, and the update counts
    assert not L.update_lost(1.9004, 1.9004 / 3000, "fp16")
    one = torch.ones(1, dtype=torch.float16)
    assert float(one - 2.0**-11) == 1 - 2.0**-11 == 0.99951171875  # kept: below 1 the gap is 2^-11
    assert not L.update_lost(1.0, -(2.0**-11), "fp16") and L.update_lost(1.0, 2.0**-11, "fp16")
    assert L.update_lost(1.0, -(2.0**-12), "fp16")  # the tie below 1 goes to 1 (even)
    odd = 1 + 2.0**-10  # last mantissa bit 1: both ties leave it
    assert not L.update_lost(odd, 2.0**-11, "fp16") and not L.update_lost(odd, -(2.0**-11), "fp16")
    even = 1 + 2.0**-9
    assert L.update_lost(even, 2.0**-11, "fp16") and L.update_lost(even, -(2.0**-11), "fp16")


def test_the_2048_rule_disagrees_with_torch():
    w = all_weights("fp16")
    w = w[w != 0]
    w64 = np.abs(w.double().numpy())
    says_lost_but_kept = says_kept_but_lost = 0
    for _, u in cases(w, "fp16"):
        wrong = (u == 0) | (w64 >= 2048 * np.abs(u))
        theirs = torch_lost(w, u)
        says_lost_but_kept += int(np.count_nonzero(wrong & ~theirs))
        says_kept_but_lost += int(np.count_nonzero(~wrong & theirs))
    assert says_lost_but_kept > 100_000  # e.g. 1.9004 + 1.9004/3000, and 1 - 2^-11
    assert says_kept_but_lost > 1000  # e.g. 2^-11 + 2^-23 on 1.0: cast to fp16 it is the tie 2^-11


# ----- any input: an answer or one line that says what to pass -----
FLOATS = st.floats(allow_nan=True, allow_infinity=True)


@settings(max_examples=300, deadline=None)
@given(w=FLOATS, u=FLOATS, fmt=st.sampled_from(["fp16", "bf16"]), via=st.sampled_from([None, "fp32"]))
def test_update_lost_any_float_is_torch(w, u, fmt, via):
    wt = torch.tensor([w], dtype=torch.float32).to(DTYPES[fmt])
    if via is None:
        theirs = bool((wt + u) == wt)
    else:
        theirs = bool(wt.clone().add_(torch.tensor([u], dtype=torch.float32)) == wt)
    assert L.update_lost(w, u, fmt, via=via) is theirs


@settings(max_examples=300, deadline=None)
@given(w=st.floats(allow_nan=False, allow_infinity=False), u=FLOATS,
       fmt=st.sampled_from(["fp16", "bf16", "fp32", "fp8_e4m3", "fp8_e5m2", "tf32"]),
       via=st.sampled_from([None, "fp32"]))
def test_lost_band_any_weight(w, u, fmt, via):
    """The band's edges are lost, the update values just beyond them are not, and any update is
    lost exactly when its stored value lies in the band."""
    f = get_format(fmt)
    wq = f.quantize(w)
    if not math.isfinite(wq):
        with pytest.raises(ValueError, match="must be finite") as e:
            L.lost_band(w, fmt, via=via)
        assert "\n" not in str(e.value)
        return
    lo, hi = L.lost_band(w, fmt, via=via)
    v = f if via is None else FP32
    assert lo <= 0 <= hi and v.quantize(lo) == lo and v.quantize(hi) == hi
    assert L.update_lost(w, lo, fmt, via=via) and L.update_lost(w, hi, fmt, via=via)
    below, above = v.neighbours(lo)[0], v.neighbours(hi)[1]
    if math.isfinite(above):
        assert not L.update_lost(w, above, fmt, via=via)
    if math.isfinite(below):
        assert not L.update_lost(w, below, fmt, via=via)
    assert L.update_lost(w, u, fmt, via=via) is (lo <= v.quantize(u) <= hi)


def test_update_lost_shapes_and_types():
    assert L.update_lost(1.0, 2.0**-11, "fp16") is True
    out = L.update_lost(np.array([1.0, 1.5]), [[2.0**-11], [-(2.0**-11)]], "fp16")
    assert out.dtype == bool and out.tolist() == [[True, True], [False, True]]
    w16 = torch.tensor([1.0], dtype=torch.float16)
    assert L.update_lost(w16, torch.tensor(2.0**-11), torch.float16).tolist() == [True]
    assert L.update_lost(math.inf, 1.0, "fp16") and not L.update_lost(math.nan, 0.0, "fp16")
    assert L.update_lost(0.0, 1e-9, "fp16") and not L.update_lost(0.0, 1e-9, "fp32")  # 1e-9 underflows in fp16


@pytest.mark.parametrize("call, error, text", [
    (lambda: L.update_lost("1", 0.1, "fp16"), TypeError, "not text"),
    (lambda: L.update_lost(1.0, None, "fp16"), TypeError, "got None"),
    (lambda: L.update_lost([1.0, 2.0], [1.0, 2.0, 3.0], "fp16"), ValueError, "broadcast together"),
    (lambda: L.update_lost(1.0, 0.1, "fp17"), ValueError, "unknown format"),
    (lambda: L.update_lost(1.0, 0.1, "fp16", via="fp16"), ValueError, "via must be None"),
    (lambda: L.update_lost(1.0, 0.1, "fp16", via=3), ValueError, "via must be None"),
    (lambda: L.lost_band(math.inf, "fp16"), ValueError, "must be finite"),
    (lambda: L.lost_band([1.0, 70000.0], "fp16"), ValueError, "stores as inf"),
    (lambda: L.lost_band(1.0, "fp16", via="bf16"), ValueError, "via must be None"),
    (lambda: L.largest_lost_update([1.0, 2.0], "fp16"), TypeError, "one number"),
    (lambda: L.largest_lost_update(0.0, "fp16"), ValueError, "nonzero finite"),
])
def test_errors_are_one_line_and_say_what_to_pass(call, error, text):
    with pytest.raises(error, match=text) as e:
        call()
    assert "\n" not in str(e.value)


# ----- the figure -----
def test_plot_lost_band_draws_the_core_numbers():
    from ampviz.plots import plot_lost_band

    points = [(1.9004, 1.9004 / 3000), (1.0, -(2.0**-11)), (1.0, 2.0**-11), (-1.5, 1.5 / 4000)]
    fig = plot_lost_band("fp16", 1.0, 4.0, points=points)
    ws = torch.from_numpy(np.arange(0x3C00, 0x4401, dtype=np.int16)).view(torch.float16).double().numpy()
    lo, hi = L.lost_band(ws, "fp16")
    traces = {d.meta["kind"]: d for d in fig.data}
    np.testing.assert_array_equal(traces["upper"].x, ws)
    np.testing.assert_array_equal(traces["upper"].y, hi / ws)
    np.testing.assert_array_equal(traces["lower"].x, ws)
    np.testing.assert_array_equal(traces["lower"].y, lo / ws)
    assert traces["upper"].fill == "tonexty"
    assert (traces["upper"].y[0], traces["lower"].y[0]) == (2.0**-11, -(2.0**-12))  # w = 1
    marked = {kind: sorted(zip(traces[kind].x, traces[kind].y)) for kind in ("lost", "kept")}
    assert marked["lost"] == [(1.0, 2.0**-11), (1.5, (1.5 / 4000) / -1.5)]
    w = float(FP16.quantize(1.9004))
    assert marked["kept"] == [(1.0, -(2.0**-11)), (w, (1.9004 / 3000) / w)]
    lines = sorted(s.y0 for s in fig.layout.shapes)
    assert lines == [-(2.0**-11), -(2.0**-12), 2.0**-12, 2.0**-11]
    assert sorted(a.text for a in fig.layout.annotations) == ["-1/2048", "-1/4096", "1/2048", "1/4096"]
    assert fig.layout.meta == {"fmt": "fp16", "via": None, "weights": ws.size}
    assert fig.to_json() == plot_lost_band("fp16", 1.0, 4.0, points=points).to_json()  # no random ids


def test_plot_lost_band_wide_ranges_formats_and_via():
    from ampviz.plots import plot_lost_band

    fig = plot_lost_band("fp32", 1.0, 2.0**20)
    x = np.asarray(fig.data[0].x)
    assert 4096 <= x.size <= 4096 + 21 and set(2.0 ** np.arange(21)) <= set(x.tolist())
    np.testing.assert_array_equal(fig.data[1].y, L.lost_band(x, "fp32")[1] / x)
    fig = plot_lost_band("bf16", 0.5, 2.0, via="fp32")
    x = np.asarray(fig.data[0].x)
    assert x.size == 257 and fig.layout.meta["via"] == "fp32"
    np.testing.assert_array_equal(fig.data[1].y, L.lost_band(x, "bf16", via="fp32")[1] / x)
    assert sorted(a.text for a in fig.layout.annotations) == ["-1/256", "-1/512", "1/256", "1/512"]
    assert plot_lost_band("fp16", 60000, 1e6).data[0].x[-1] == 65504  # stops at max


@pytest.mark.parametrize("kwargs, error, text", [
    ({"w_min": 2.0, "w_max": 1.0}, ValueError, "below w_max"),
    ({"w_min": -1.0}, ValueError, "positive finite"),
    ({"w_min": "1"}, TypeError, "positive number"),
    ({"w_min": 70000.0, "w_max": 80000.0}, ValueError, "no fp16 value"),
    ({"points": [(1.0,)]}, TypeError, "pairs"),
    ({"points": [(0.0, 1.0)]}, ValueError, "nonzero finite"),
    ({"points": [(1.0, "a")]}, TypeError, "pairs of numbers"),
    ({"via": "fp16"}, ValueError, "via must be None"),
    ({"fmt": "fp17"}, ValueError, "unknown format"),
    ({"title": 3}, TypeError, "title"),
])
def test_plot_lost_band_refuses_in_one_line(kwargs, error, text):
    from ampviz.plots import plot_lost_band

    with pytest.raises(error, match=text) as e:
        plot_lost_band(**kwargs)
    assert "\n" not in str(e.value)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w_min=st.floats(1e-8, 1e5), span=st.floats(1.001, 64.0), fmt=st.sampled_from(["fp16", "bf16", "fp8_e5m2"]))
def test_plot_lost_band_any_range(w_min, span, fmt):
    from ampviz.plots import plot_lost_band

    try:
        fig = plot_lost_band(fmt, w_min, w_min * span)
    except ValueError as e:
        assert "no " in str(e) and "\n" not in str(e)
        return
    x = np.asarray(fig.data[0].x)
    assert (x >= w_min).all() and (x <= w_min * span).all() and (np.diff(x) > 0).all()
    np.testing.assert_array_equal(fig.data[0].y, L.lost_band(x, fmt)[0] / x)
