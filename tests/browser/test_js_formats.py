"""ampviz/widgets/js/formats.mjs in Chromium against ampviz.formats, bit for bit: every format's
constants; every bit pattern of every format of at most 16 bits decoded; and for every format,
thousands of seeded float32 patterns (random ones, the specials, every tie between two neighbours
of the smaller formats, the values around each range's ends) cast with each option the Python
methods take: the bits, the values (NaN as NaN, the sign of 0 included) and the categories.
A cast that rounds ties away from zero instead of to even would fail: the tie inputs hold cases
where the two differ."""

import base64
import math

import numpy as np
import pytest

from ampviz.formats import ALL_FORMATS, CATEGORIES
from conftest import js_module_page
#: Each format's options as the Python methods take them (besides the defaults).
OPTIONS = {"fp8_e4m3fnuz": [{"overflow": "saturate"}, {"overflow": "nan"}],
           "fp8_e5m2fnuz": [{"overflow": "saturate"}],
           "fp6_e3m2": [{"overflow": "saturate"}, {"nan": "torchao"}],
           "fp6_e2m3": [{"nan": "torchao"}],
           "fp4_e2m1": [{"nan": "torchao"}],
           "e8m0": [{"overflow": "saturate"}, {"overflow": "nan"}, {"nonpositive": "nan"},
                    {"overflow": "saturate", "nonpositive": "nan"}]}



@pytest.fixture(scope="module")
def page(browser):
    page = js_module_page(browser, "formats", "F")
    yield page
    page.close()


def _f64(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), np.float64)


def same_values(a, b) -> bool:
    """Equal values, NaN where NaN, and the same sign on zeros."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    nan = np.isnan(a)
    return (a.shape == b.shape and np.array_equal(nan, np.isnan(b)) and np.array_equal(a[~nan], b[~nan])
            and np.array_equal(np.signbit(a[~nan]), np.signbit(b[~nan])))


def test_the_module_has_every_format_with_its_constants(page):
    got = page.evaluate("""() => Object.fromEntries(Object.values(F.FORMATS).map((f) => [f.name,
        [f.bits, f.emin, f.emax, f.max, f.smallestNormal, f.smallestSubnormal, f.eps, f.overflowBoundary,
         f.underflowBoundary, f.nanBits]]))""")
    assert list(got) == list(ALL_FORMATS)
    for name, f in ALL_FORMATS.items():
        want = [f.bits, f.emin, f.emax, f.max, f.smallest_normal, f.smallest_subnormal, f.eps, f.overflow_boundary,
                f.underflow_boundary, f.nan_bits]
        assert got[name] == want, name


@pytest.mark.parametrize("name", [n for n, f in ALL_FORMATS.items() if f.bits <= 16])
def test_every_bit_pattern_decodes_as_in_python(page, name):
    fmt = ALL_FORMATS[name]
    got = _f64(page.evaluate("""(name) => { const f = F.FORMATS[name]; const n = 2 ** f.bits;
        const out = new Float64Array(n); for (let b = 0; b < n; b++) out[b] = F.decode(f, b); return b64(out); }""",
                             name))
    assert same_values(got, fmt.decode(np.arange(2**fmt.bits)))
    fields = page.evaluate("(name) => [1, 2 ** F.FORMATS[name].bits - 2].map((b) => F.fields(name, b))", name)
    assert fields == [list(fmt.fields(1)), list(fmt.fields(2**fmt.bits - 2))]


def inputs(fmt, seed: int = 0) -> tuple:
    """Float32 bit patterns for ``fmt``: (all of them, the ties between neighbours)."""
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):  # fp32's overflow boundary is inf in float32
        special = np.array([0.0, -0.0, np.inf, -np.inf, 1.0, -1.0, fmt.max, -fmt.max, fmt.overflow_boundary,
                            -fmt.overflow_boundary, fmt.underflow_boundary, fmt.smallest_normal, fmt.smallest_subnormal,
                            1.5 * fmt.smallest_subnormal, 2.0**-126, 2.0**-149, 3.4e38, 1e-45],
                           np.float64).astype(np.float32).view(np.uint32)
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0x7FA00000, 0xFFE00001], np.uint32)
    random = rng.integers(0, 2**32, 6000, dtype=np.uint64).astype(np.uint32)
    lo, hi = max(math.log2(fmt.smallest_subnormal) - 3, -152), min(math.log2(fmt.max) + 2, 127.9)
    near = (np.exp2(rng.uniform(lo, hi, 6000)) * rng.choice([-1, 1], 6000)).astype(np.float32).view(np.uint32)
    ties = np.array([], np.uint32)
    if fmt.bits <= 16:
        values = np.asarray(fmt.decode(np.arange(2 ** (fmt.bits - 1) if fmt.name != "e8m0" else 255)), np.float64)
        values = np.unique(values[np.isfinite(values)])
        mids = ((values[:-1] + values[1:]) / 2).astype(np.float32)
        exact = mids.astype(np.float64) == (values[:-1] + values[1:]) / 2
        ties = np.concatenate([mids[exact], -mids[exact]]).view(np.uint32)
    return np.concatenate([special, nans, random, near, ties]), ties


@pytest.mark.parametrize("name", list(ALL_FORMATS))
def test_float32_values_cast_as_in_python(page, name):
    fmt = ALL_FORMATS[name]
    patterns, ties = inputs(fmt)
    x = patterns.view(np.float32)
    for options in [{}] + OPTIONS.get(name, []):
        got = page.evaluate("""([name, data, options]) => { const u = new Uint32Array(bytesOf(data));
            const bits = new Float64Array(u.length), values = new Float64Array(u.length), cats = new Float64Array(u.length);
            for (let i = 0; i < u.length; i++) { const r = F.castBits32(name, u[i], options);
              bits[i] = r.bits; values[i] = r.value; cats[i] = F.CATEGORIES.indexOf(r.category); }
            return [b64(bits), b64(values), b64(cats)]; }""",
                            [name, base64.b64encode(patterns.tobytes()).decode(), options])
        bits, values, cats = (_f64(t) for t in got)
        want_bits = np.asarray(fmt.encode(x, **options), np.float64)
        assert np.array_equal(bits, want_bits), (name, options, np.flatnonzero(bits != want_bits)[:5])
        assert same_values(values, fmt.quantize(x, **options)), (name, options)
        if not options:
            assert np.array_equal(cats, fmt.classify_codes(x)), name
    if ties.size:  # ties to even: rounding half away from zero would give another value for some
        t = ties.view(np.float32).astype(np.float64)
        q = np.asarray(fmt.quantize(ties.view(np.float32)), np.float64)
        if name == "e8m0":  # its own rule: the nearest power of two, ties up
            assert (np.abs(q) > np.abs(t)).all()
        else:
            assert (np.abs(q) < np.abs(t)).any() and (np.abs(q) > np.abs(t)).any(), name


@pytest.mark.parametrize("name", list(ALL_FORMATS))
def test_numbers_go_through_float32_as_in_python(page, name):
    """cast(fmt, x) for float64 numbers, not float32 values: a number past float32's range is inf,
    one below its smallest subnormal underflows, and the format's rounding comes after float32's."""
    fmt = ALL_FORMATS[name]
    rng = np.random.default_rng(1)
    x = np.concatenate([np.exp2(rng.uniform(-160, 135, 3000)) * rng.choice([-1, 1], 3000),
                        [1e-50, -1e-50, 1e39, -1e39, 0.1, 1 / 3, 1 + 2.0**-30, 65519.99, 448.5, 1e-300]])
    got = page.evaluate("""([name, xs]) => xs.map((x) => { const r = F.cast(name, x); return [r.bits, r.category]; })""",
                        [name, x.tolist()])
    assert [b for b, _ in got] == np.asarray(fmt.encode(x)).tolist()
    assert [c for _, c in got] == np.asarray(fmt.classify(x)).tolist()


def test_bad_arguments_are_refused_in_one_line(page):
    errors = page.evaluate("""() => [() => F.decode('fp16', 65536), () => F.decode('fp99', 0), () => F.cast('fp16', '1'),
        () => F.castBits32('fp16', -1), () => F.castBits32('fp16', 0, {overflow: 'inf'}),
        () => F.castBits32('fp4_e2m1', 0, {nan: 'x'})].map((f) => { try { f(); return null; }
        catch (e) { return e.message; } })""")
    assert all(e and "\n" not in e for e in errors), errors
    assert "0 to 65535" in errors[0] and "fmt must be one of fp32" in errors[1] and "takes no overflow" in errors[4]
    assert set(CATEGORIES) == set(page.evaluate("() => F.CATEGORIES"))
