"""ampviz/widgets/js/blocks.mjs in Chromium against ampviz.formats.blocks.mx_quantize, bit for bit:
every MX element format under every scale rule, on seeded rows of normal, log-normal and outlier
data, zeros, float32 subnormals, values past float32's range (infinities) and huge blocks; the
scales, the element codes and the dequantized values. NaN blocks: the scales and values (NaN)."""

import base64

import numpy as np
import pytest

from ampviz.formats.blocks import MX_ELEMENT_FORMATS, MX_ROUNDING, mx_quantize
from conftest import js_module_page


@pytest.fixture(scope="module")
def page(browser):
    page = js_module_page(browser, "blocks", "B")
    yield page
    page.close()


def rows(seed: int = 0, n: int = 64 * 32) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32)
    x[: n // 4] *= np.exp2(rng.uniform(-30, 30, n // 4)).astype(np.float32)  # log-normal spread
    x[rng.integers(0, n, 40)] *= np.float32(2.0**10)  # outliers
    x[64:96] = 0  # a zero block
    x[96:128] = np.float32(2.0**-140) * rng.integers(1, 64, 32)  # float32 subnormals
    with np.errstate(over="ignore"):  # some pass float32's range: infinities
        x[128:160] = rng.standard_normal(32).astype(np.float32) * np.float32(3e38)
    x[160] = np.inf
    x[200] = -np.inf
    # blocks whose amax is exactly an element format's max times a power of two (rceil's edge)
    for j, top in enumerate((448.0 * 8, 57344.0 / 16, 6.0 * 32, 7.5 * 4, 28.0 / 8)):
        x[320 + 32 * j] = np.float32(top)
        x[321 + 32 * j:352 + 32 * j] = np.clip(x[321 + 32 * j:352 + 32 * j], -top / 2, top / 2)
    return x


def run(page, x, fmt, block, rounding):
    got = page.evaluate("""([data, fmt, block, rounding]) => {
        const r = B.mxQuantize(new Float32Array(bytesOf(data)), fmt, block, rounding);
        return [b64(r.scales), b64(r.codes), b64(r.values)]; }""",
                        [base64.b64encode(x.tobytes()).decode(), fmt, block, rounding])
    return (np.frombuffer(base64.b64decode(got[0]), np.uint8), np.frombuffer(base64.b64decode(got[1]), np.uint8),
            np.frombuffer(base64.b64decode(got[2]), np.float32))


@pytest.mark.parametrize("fmt", list(MX_ELEMENT_FORMATS))
@pytest.mark.parametrize("rounding", MX_ROUNDING)
def test_mx_blocks_equal_the_package(page, fmt, rounding):
    for block, seed in ((32, 0), (16, 1)):
        x = rows(seed)
        scales, codes, values = run(page, x, fmt, block, rounding)
        want = mx_quantize(x, fmt, block, rounding)
        assert np.array_equal(scales, want.scales), (fmt, rounding, block)
        assert np.array_equal(codes, want.codes), (fmt, rounding, block)
        assert np.array_equal(values.view(np.uint32), want.values.view(np.uint32)), (fmt, rounding, block)


@pytest.mark.parametrize("rounding", MX_ROUNDING)
def test_blocks_with_a_nan_have_the_packages_scale_and_nan_values(page, rounding):
    x = rows(2)
    x[[5, 300]] = np.nan
    scales, _, values = run(page, x, "fp8_e4m3", 32, rounding)
    want = mx_quantize(x, "fp8_e4m3", 32, rounding)
    assert np.array_equal(scales, want.scales) and scales[0] == scales[9] == 255
    assert np.array_equal(np.isnan(values), np.isnan(want.values))
    ok = ~np.isnan(values)
    assert np.array_equal(values[ok], want.values[ok])


def test_the_scale_rules_differ_on_these_rows():
    """The rows reach every rule's own case: no two rules give the same scales everywhere."""
    x = rows(0)
    scales = {r: mx_quantize(x, "fp8_e4m3", 32, r).scales for r in MX_ROUNDING}
    assert all(not np.array_equal(scales[a], scales[b]) for a in MX_ROUNDING for b in MX_ROUNDING if a < b)


def test_bad_arguments_are_refused_in_one_line(page):
    errors = page.evaluate("""() => [() => B.mxQuantize([1], 'fp16'), () => B.mxQuantize([1, 2], 'fp4_e2m1', 32),
        () => B.mxQuantize([1], 'fp4_e2m1', 1, 'up'), () => B.mxQuantize([1], 'fp4_e2m1', 0)].map((f) => {
        try { f(); return null; } catch (e) { return e.message; } })""")
    assert all(e and "\n" not in e for e in errors), errors


def nvfp4_rows(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    n = 64 * 16
    normal = rng.standard_normal(n).astype(np.float32)
    spread = (rng.standard_normal(n) * np.exp2(rng.uniform(-20, 20, n))).astype(np.float32)
    outliers = normal.copy()
    outliers[rng.integers(0, n, 12)] *= np.float32(2.0**10)
    tiny = (normal * np.float32(1e-6)).astype(np.float32)
    huge = (normal * np.float32(1e30)).astype(np.float32)
    zeros = normal.copy()
    zeros[:64] = 0
    zeros[100] = -0.0
    return {"normal": normal, "spread": spread, "outliers": outliers, "tiny": tiny, "huge": huge, "zeros": zeros}


def run_nvfp4(page, x, per_tensor_scale, convention):
    got = page.evaluate("""([data, pts, convention]) => {
        const r = B.nvfp4Quantize(new Float32Array(bytesOf(data)), pts, convention);
        return [r.tensorScale, b64(r.scales), b64(r.codes), b64(r.values)]; }""",
                        [base64.b64encode(x.tobytes()).decode(), per_tensor_scale, convention])
    return (got[0], np.frombuffer(base64.b64decode(got[1]), np.uint8), np.frombuffer(base64.b64decode(got[2]), np.uint8),
            np.frombuffer(base64.b64decode(got[3]), np.float32))


@pytest.mark.parametrize("per_tensor_scale, convention", [(True, "torchao"), (False, "torchao"), (0.01, "torchao"),
                                                           (True, "te")])
def test_nvfp4_equals_the_package(page, per_tensor_scale, convention):
    from ampviz.formats.blocks import nvfp4_quantize

    for name, x in nvfp4_rows(0).items():
        pts, scales, codes, values = run_nvfp4(page, x, per_tensor_scale, convention)
        want = nvfp4_quantize(x, per_tensor_scale, convention=convention)
        assert (pts is None) == (want.tensor_scale is None), name
        if pts is not None:
            assert np.float32(pts).view(np.uint32) == np.float32(want.tensor_scale).view(np.uint32), name
        assert np.array_equal(scales, want.scales), (name, per_tensor_scale, convention)
        assert np.array_equal(codes, want.codes), (name, per_tensor_scale, convention)
        assert np.array_equal(values.view(np.uint32), want.values.view(np.uint32)), (name, per_tensor_scale, convention)


def test_nvfp4_refuses_what_it_does_not_compute(page):
    errors = page.evaluate("""() => [() => B.nvfp4Quantize([1], true), () => B.nvfp4Quantize(new Array(16).fill(Infinity)),
        () => B.nvfp4Quantize(new Array(16).fill(1), false, 'te'), () => B.nvfp4Quantize(new Array(16).fill(1), -1),
        () => B.nvfp4Quantize(new Array(16).fill(1), true, 'cuda')].map((f) => {
        try { f(); return null; } catch (e) { return e.message; } })""")
    assert all(e and "\n" not in e for e in errors), errors
