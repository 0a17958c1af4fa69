"""The fast paths of ampviz.formats.blocks (element tables, bit-level scales, chunks, threads) against the
straightforward implementation of the same rules (``_mx_reference``, ``_nvfp4_reference``, the
exact encoders), bit for bit, on random inputs with every kind of special value; and a wrong
table (one that ignores the bits below the top 16, so it decides ties wrongly) caught."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ampviz.formats import blocks
from ampviz.formats.blocks import tables as block_tables
from ampviz.formats.blocks import MX_ELEMENT_FORMATS, MX_ROUNDING, mx_quantize, nvfp4_quantize
from ampviz.formats import FP4_E2M1, FP8_E4M3

F32 = np.float32
NAMES = list(MX_ELEMENT_FORMATS)


def bits(a) -> np.ndarray:
    """The raw patterns of an array (float32 as uint32), so that equality is bit for bit."""
    a = np.asarray(a)
    return a.view(np.uint32) if a.dtype == np.float32 else a


def assert_same(fast, ref):
    for got, want in zip(fast, ref):
        if got is None or want is None:
            assert got is None and want is None
            continue
        got, want = np.asarray(got), np.asarray(want)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(bits(got), bits(want))


def mx_ref(x, fmt, block, mode):
    xb = np.asarray(x, F32).reshape(*np.shape(x)[:-1], -1, block)
    s, c, v = blocks._mx_reference(xb, MX_ELEMENT_FORMATS[fmt], mode)
    return s, c.reshape(np.shape(x)), v.reshape(np.shape(x))


def nvfp4_ref(x, pts, convention):
    xb = np.asarray(x, F32).reshape(*np.shape(x)[:-1], -1, 16)
    t, s, c, v = blocks._nvfp4_reference(xb, pts, convention)
    return (None if t is None else F32(t)), s, c.reshape(np.shape(x)), v.reshape(np.shape(x))


def tie_blocks(fmt, seed=0, rows=64) -> np.ndarray:
    """Blocks of 32 whose first element 2**(emax + k) fixes the floor scale at 2**k, the rest being
    fmt's rounding midpoints times 2**k, exactly and one float32 step either side (ties, and the
    values a lost low bit would turn into ties)."""
    rng = np.random.default_rng(seed)
    grid = np.unique(np.abs(np.asarray(fmt.decode(np.arange(1 << fmt.bits)), np.float64)))
    grid = grid[np.isfinite(grid)]
    mids = (grid[:-1] + grid[1:]) / 2  # exact in float32: fmt has at most 3 mantissa bits
    out = np.empty((rows, 32), F32)
    for r in range(rows):
        k = int(rng.integers(-100, 100))
        m = F32(rng.choice(mids, 31) * rng.choice([-1.0, 1.0], 31) * 2.0**k)
        step = rng.integers(-1, 2, 31)
        m = np.where(step > 0, np.nextafter(m, F32(np.inf)), np.where(step < 0, np.nextafter(m, F32(-np.inf)), m))
        out[r, 0] = F32(2.0 ** (fmt.emax + k))
        out[r, 1:] = m
    return out


# ---------------------------------------------------------------- the pieces
@pytest.mark.parametrize("name", NAMES)
def test_element_table_is_the_exact_encoder_for_every_top_pattern(name):
    """For every top-16-bit pattern and several low halves (0, 1, 0x8000, 0xFFFF, random), the
    table gives what the exact path gives for clamp(v, ±max)."""
    fmt = MX_ELEMENT_FORMATS[name]
    top = np.arange(1 << 16, dtype=np.uint32) << 16
    low = [0, 1, 0x8000, 0xFFFF, *np.random.default_rng(1).integers(1, 1 << 16, 2)]
    v = np.concatenate([top | np.uint32(lo) for lo in low]).view(F32)
    v = v[~np.isnan(v)]
    index = np.empty(v.shape, np.intp)
    blocks._table_index(v, np.empty(v.shape, np.uint32), index)
    table = blocks._element_table(fmt)
    want = blocks._element_codes(fmt, np.clip(v, -F32(fmt.max), F32(fmt.max)))
    assert np.array_equal(table.codes[index], want)
    assert np.array_equal(bits(table.values[index]), bits(blocks._element_values(fmt, want)))


@pytest.mark.parametrize("mode", MX_ROUNDING)
def test_scale_patterns_from_bits_follow_the_exact_rule(mode):
    """Every float32 exponent (zero, subnormal, normal, inf, NaN) with the mantissas where a rule
    changes its answer, and random ones."""
    rng = np.random.default_rng(2)
    for fmt in MX_ELEMENT_FORMATS.values():
        top_man = int(np.float32(fmt.max).view(np.uint32)) & 0x7FFFFF
        even = (1 << 23) - (1 << (22 - fmt.mantissa_bits))
        edges = {0, 1, 2, 0xFFFF, 0x10000, 0x7FFFFF, top_man, top_man + 1, even - 1, even, even + 1}
        man = np.array(sorted(e for e in edges if 0 <= e <= 0x7FFFFF) + list(rng.integers(0, 1 << 23, 20)))
        pattern = ((np.arange(256)[:, None] << 23) | man[None, :]).astype(np.uint32).reshape(-1)
        got = blocks._mx_scale_codes(pattern, fmt, mode)
        with np.errstate(invalid="ignore"):
            want = blocks._mx_exponents(pattern.view(F32), fmt, mode)
        assert np.array_equal(got, want), fmt.name


def test_abs_max_bits_orders_nan_above_inf_and_ignores_signs():
    x = np.array([[-3.0, 2.0, -0.0, 1.0], [np.inf, -5.0, 0.0, 1.0], [1.0, np.nan, -np.inf, 2.0],
                  [-0.0, -0.0, -0.0, -0.0], [1e-45, -2e-45, 0, 0]], F32)
    for width in (4, 2, 1):  # rows halved to one element, and rows of one
        got = blocks._abs_max_bits(np.ascontiguousarray(x[:, :width]))
        want = np.abs(x[:, :width]).max(axis=1).view(np.uint32)
        finite = ~np.isnan(x[:, :width]).any(axis=1)
        assert np.array_equal(got[finite], want[finite])
        assert (got[~finite] > blocks._INF_BITS).all()
    odd = np.arange(-12, 12, dtype=F32).reshape(4, 6)  # 6 = 2 * 3: one halving, then rows of 3
    assert np.array_equal(blocks._abs_max_bits(odd).view(F32), np.abs(odd).max(axis=1))


# ---------------------------------------------------------------- MX: fast = exact, any input
specials = st.sampled_from([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-40, 3.4e38, 448.0, 6.0, 7.5, 28.0])
element = st.one_of(st.floats(width=32), specials, st.floats(-8, 8, width=32))


@st.composite
def mx_inputs(draw):
    block = draw(st.sampled_from([1, 2, 3, 6, 16, 32, 64]))
    lead = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=5))
    nblocks = draw(st.integers(1, 4))
    x = draw(hnp.arrays(F32, lead + (nblocks * block,), elements=element))
    if draw(st.booleans()):  # blocks spread over the whole float32 range
        k = draw(hnp.arrays(np.int32, lead + (nblocks, 1), elements=st.integers(-150, 127)))
        with np.errstate(over="ignore", invalid="ignore"):
            x = np.ldexp(x.reshape(lead + (nblocks, block)), k).astype(F32).reshape(x.shape)
    return x, block


@settings(max_examples=300, deadline=None)
@given(data=mx_inputs(), name=st.sampled_from(NAMES), mode=st.sampled_from(MX_ROUNDING),
       chunk=st.sampled_from([1, 7, 64, 1 << 15]))
def test_mx_fast_path_equals_the_exact_path(data, name, mode, chunk):
    x, block = data
    old = block_tables._CHUNK  # read where the fast paths live
    block_tables._CHUNK = chunk  # several chunks, a last one cut short
    try:
        got = mx_quantize(x, name, block, mode)
    finally:
        block_tables._CHUNK = old
    assert_same(got, mx_ref(x, name, block, mode))


@pytest.mark.parametrize("name", NAMES)
def test_mx_ties_and_their_neighbours(name):
    fmt = MX_ELEMENT_FORMATS[name]
    x = tie_blocks(fmt, seed=NAMES.index(name))
    for mode in MX_ROUNDING:
        assert_same(mx_quantize(x, name, 32, mode), mx_ref(x, name, 32, mode))
    got = mx_quantize(x, name)  # floor: the scale is 2**k, so each element lands on its midpoint
    assert (got.scales[:, 0] == (np.frexp(x[:, 0])[1] - 1 - fmt.emax + 127)).all()


@pytest.mark.parametrize("name", NAMES)
def test_a_table_without_the_low_bits_is_caught(name):
    """The plausible shortcut, a table on the top 16 bits alone, treats v just above a midpoint as
    the midpoint itself and rounds it to even, down half the time: the checks above see it."""
    fmt = MX_ELEMENT_FORMATS[name]
    right = blocks._element_table(fmt)
    no_low = np.arange(1 << 17) & ~1  # the index as if the low 16 bits were zero
    wrong = blocks._ElementTable(right.codes[no_low], right.values[no_low])
    x = tie_blocks(fmt, seed=7)
    ref = blocks._mx_reference(x.reshape(-1, 1, 32), fmt, "floor")
    ref = (ref[0].reshape(-1), ref[1].reshape(x.shape), ref[2].reshape(x.shape))
    assert_same(blocks._mx_fast(x, fmt, "floor"), ref)
    bad = blocks._mx_fast(x, fmt, "floor", table=wrong)
    assert not np.array_equal(bad[1], ref[1])
    assert np.array_equal(bad[0], ref[0])  # the scales do not use the table


def test_large_inputs_run_in_threads_and_equal_the_exact_path():
    """Over a million values (the threaded size), with NaN, inf and subnormal blocks scattered
    through it, a non-contiguous float64 view as input."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((1 << 15, 40)) * np.exp2(rng.integers(-140, 120, (1 << 15, 1)))).astype(F32)
    x[::997, 3], x[5::1231, 7], x[9::1777, 0] = np.nan, np.inf, -np.inf
    x64 = np.asfortranarray(x[:, :32].astype(np.float64))  # rounded to float32 as before
    assert x64[:, :32].size >= blocks._PARALLEL_MIN
    for name, mode in [("fp8_e4m3", "floor"), ("fp4_e2m1", "rceil"), ("fp6_e2m3", "even")]:
        with np.errstate(over="ignore"):
            assert_same(mx_quantize(x64, name, 32, mode), mx_ref(x[:, :32], name, 32, mode))
    y = np.where(np.isfinite(x), x, 1).astype(F32)[:, :32]
    for convention in ("torchao", "te"):
        assert_same(nvfp4_quantize(y, convention=convention), nvfp4_ref(y, True, convention))


def test_stochastic_rounding_takes_the_exact_path():
    x = np.random.default_rng(4).standard_normal((50, 32)).astype(F32)
    a = mx_quantize(x, "fp4_e2m1", rng=np.random.default_rng(5))
    xb = x.reshape(50, 1, 32)
    s, c, v = blocks._mx_reference(xb, FP4_E2M1, "floor", np.random.default_rng(5))
    assert np.array_equal(a.codes, c.reshape(x.shape)) and np.array_equal(a.scales, s)


# ---------------------------------------------------------------- NVFP4: fast = exact, any input
@st.composite
def nvfp4_inputs(draw):
    lead = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=4))
    x = draw(hnp.arrays(F32, lead + (16 * draw(st.integers(1, 3)),),
                        elements=st.one_of(st.floats(-1e4, 1e4, width=32), specials)))
    if draw(st.booleans()):
        k = draw(hnp.arrays(np.int32, x.shape[:-1] + (1,), elements=st.integers(-150, 127)))
        with np.errstate(over="ignore", invalid="ignore"):
            x = np.ldexp(x, k).astype(F32)
    return x


@settings(max_examples=300, deadline=None)
@given(x=nvfp4_inputs(), pts=st.one_of(st.booleans(), st.floats(1e-44, 1e30)),
       convention=st.sampled_from(["torchao", "te"]))
def test_nvfp4_fast_path_equals_the_exact_path(x, pts, convention):
    if convention == "te" and pts is not True:
        pts = True  # the only choice it has
    assert_same(nvfp4_quantize(x, pts, convention=convention), nvfp4_ref(x, pts, convention))


def test_nvfp4_cases_the_fast_path_leaves():
    """A zero tensor (tensor scale 0), a tensor scale whose reciprocal overflows, NaN and inf."""
    tiny = np.full((2, 16), 1e-44, F32)
    for x, pts in [(np.zeros((2, 16), F32), True), (tiny, True), (np.ones((1, 32), F32), 1e-44),
                   (np.array([[np.nan] + [1] * 15], F32), True), (np.array([[np.inf] + [1] * 15], F32), False)]:
        assert blocks._nvfp4_fast(x.reshape(-1, 1, 16), pts, "torchao") is None
        assert_same(nvfp4_quantize(x, pts), nvfp4_ref(x, pts, "torchao"))
    x = np.random.default_rng(6).standard_normal((4, 32)).astype(F32)
    assert blocks._nvfp4_fast(x.reshape(4, 2, 16), True, "torchao") is not None


def test_e4m3_lookup_is_the_exact_encoder():
    s = np.concatenate([np.linspace(-448, 448, 20001, dtype=F32), np.float32([2.0**-6, 2.0**-9, 1e-45, -0.0]),
                        (FP8_E4M3.decode(np.arange(126)) + FP8_E4M3.decode(np.arange(1, 127))).astype(F32) / 2])
    assert np.array_equal(blocks._e4m3_lookup(s), blocks._e4m3_codes(s))
