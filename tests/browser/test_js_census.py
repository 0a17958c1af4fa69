"""ampviz/widgets/js/census.mjs in Chromium against ampviz.formats.census.census, exactly: counts
per category and the log2 histogram, for seeded data sets (gradients far below fp16's range,
activations past it, float32 subnormals, zeros of both signs, infinities and NaNs) at scales from
2^-30 to 2^40, odd ones included, in every format. A census that multiplied in float64 instead of
float32 would count some values of the edge data set in another category."""

import base64

import numpy as np
import pytest

from ampviz.formats import ALL_FORMATS
from ampviz.formats.census import census
from conftest import js_module_page


@pytest.fixture(scope="module")
def page(browser):
    page = js_module_page(browser, "census", "C")
    yield page
    page.close()


def data(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = 20000
    x = (rng.standard_normal(n) * np.exp2(rng.uniform(-40, 20, n))).astype(np.float32)
    x[:50] = 0
    x[50:60] = -0.0
    x[60:200] = (np.float32(2.0**-149) * rng.integers(1, 2**20, 140)).astype(np.float32)
    x[200:210] = np.inf
    x[210:215] = -np.inf
    x[215:220] = np.nan
    return x


def edge_data(fmt, s: float) -> np.ndarray:
    """float32 values whose products with s land on and beside the format's edges."""
    targets = np.array([fmt.underflow_boundary, fmt.smallest_normal, fmt.max, fmt.overflow_boundary,
                        fmt.smallest_subnormal], np.float64) / s
    with np.errstate(over="ignore", under="ignore"):
        t = targets.astype(np.float32)
        near = [t]
        for _ in range(3):
            near.append(np.nextafter(near[-1], np.float32(np.inf)))
        down = [t]
        for _ in range(3):
            down.append(np.nextafter(down[-1], np.float32(0)))
    return np.concatenate(near + down).astype(np.float32)


def run(page, x, fmt, scale):
    return page.evaluate("""([data, fmt, scale]) => {
        return C.census(new Float32Array(bytesOf(data)), fmt, scale); }""", [base64.b64encode(x.tobytes()).decode(), fmt, scale])


@pytest.mark.parametrize("name", list(ALL_FORMATS))
def test_census_counts_and_histogram_equal_the_package(page, name):
    x = data()
    for scale in (1.0, 2.0**-30, 2.0**16, 2.0**40, 3.0, 1 / 3, 65504.0):
        got = run(page, np.concatenate([x, edge_data(ALL_FORMATS[name], scale)]), name, scale)
        want = census(np.concatenate([x, edge_data(ALL_FORMATS[name], scale)]), name, scale)
        assert got["counts"] == want.counts, (name, scale)
        assert got["total"] == want.total and got["scale"] == want.scale
        assert got["log2Bins"] == want.log2_bins.tolist() and got["log2Counts"] == want.log2_counts.tolist(), (name, scale)


def test_a_float64_multiply_would_be_caught(page):
    """Values whose exact product with the scale 0.7 lies below fp16's overflow boundary (65520)
    while the float32 product reaches it (93600 is one): the package and the page count them as
    overflow; a census that cast the exact product would call them normal."""
    s32 = np.float32(0.7)
    v = np.float32(65520 / float(s32))
    near = [v]
    for _ in range(40):
        near.append(np.nextafter(near[-1], np.float32(0)))
    near = np.array(near, np.float32)
    tricky = near[(near.astype(np.float64) * float(s32) < 65520) & ((near * s32).astype(np.float32) >= 65520)]
    assert tricky.size > 0
    assert np.isfinite((tricky.astype(np.float64) * float(s32)).astype(np.float16)).all()  # cast directly: normal
    assert census(tricky, "fp16", 0.7).counts["overflow"] == tricky.size
    assert run(page, tricky, "fp16", 0.7)["counts"]["overflow"] == tricky.size


def test_bad_scales_are_refused_in_one_line(page):
    errors = page.evaluate("""() => [0, -1, Infinity, NaN, 1e39].map((s) => { try { C.census([1], 'fp16', s); return null; }
        catch (e) { return e.message; } })""")
    assert all(e and "positive number" in e for e in errors), errors
