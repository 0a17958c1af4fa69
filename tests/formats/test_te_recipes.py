"""ampviz.formats.fp8.te_recipes against Transformer Engine v2.18's formulas, written again here
independently (Python floats, float64 and explicit round-to-nearest-even), bit for bit on seeded
arrays with outliers, zeros, subnormals, inf and NaN; against torchao 0.18 where it has the same
recipe; and one plausible wrong variant per recipe, caught.

The torchao tests skip without torchao, except under CI=true, where they fail."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ampviz.formats.blocks import mx_quantize, nvfp4_quantize, random_hadamard_transform
from ampviz.formats.fp8.te_recipes import (NVFP4_TILES, TE_RELEASE, te_current_scaling, te_float8_block_scaling,
                                           te_mxfp8, te_nvfp4)

F32 = np.float32
FLT_MAX = float(np.finfo(F32).max)
FMT = {"fp8_e4m3": (448.0, 3, -6), "fp8_e5m2": (57344.0, 2, -14)}  # max, mantissa bits, emin


def same(a, b) -> bool:
    a, b = np.asarray(a, F32), np.asarray(b, F32)
    return a.shape == b.shape and bool(np.all((a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))))


def tensor(rng, shape) -> np.ndarray:
    """Log-normal magnitudes over many binades, random signs, with outliers, zeros, -0, float32
    subnormals, and a few exact powers of two."""
    x = (rng.lognormal(0, 4, shape) * rng.choice([-1, 1], shape)).astype(F32)
    flat = x.reshape(-1)
    n = flat.size
    idx = rng.permutation(n)
    flat[idx[: n // 50]] = 0.0
    flat[idx[n // 50: n // 40]] = -0.0
    flat[idx[n // 40: n // 30]] = (rng.uniform(1, 2**23, n // 30 - n // 40) * 2.0**-149).astype(F32)
    flat[idx[n // 30: n // 25]] *= F32(2**20)  # outliers
    flat[idx[n // 25: n // 20]] = np.ldexp(F32(1), rng.integers(-30, 30, n // 20 - n // 25))
    return x


# ---------------------------------------------------------------- the source's formulas, again
def rne(v: float, mbits: int, emin: int) -> float:
    """v rounded to nearest even on a grid with mbits mantissa bits and least exponent emin."""
    if v == 0 or not math.isfinite(v):
        return v
    e = max(math.frexp(abs(v))[1] - 1, emin)
    q = math.ldexp(1.0, e - mbits)
    return math.copysign(round(v / q) * q, v)  # Python's round is half to even; the sign stays


def satfinite(v: float, fmt: str) -> float:
    """``static_cast<fp8>(v)``: clamp to ±max (NaN stays), round to nearest even."""
    top, mbits, emin = FMT[fmt]
    if math.isnan(v):
        return v
    return rne(min(max(v, -top), top), mbits, emin)


def f32(v: float) -> float:
    if not math.isfinite(v):
        return v
    return float(F32(v)) if abs(v) < 2.0**128 else math.copysign(math.inf, v)


def compute_scale_from_amax(amax: float, fp8_max: float, pow2: bool, eps: float = 0.0) -> float:
    """recipe_common.cuh, line by line."""
    if amax < eps:
        amax = eps
    if math.isinf(amax) or amax == 0 or math.isnan(amax):
        return 1.0
    scale = f32(fp8_max / amax)  # __fdiv_rn
    if math.isinf(scale):
        scale = FLT_MAX
    if pow2:
        scale = math.ldexp(1.0, math.frexp(scale)[1] - 1)  # scale_bits &= 0xFF800000
    return scale


def fmax_abs(values) -> float:
    """``fmaxf`` folded from 0: NaN ignored."""
    m = 0.0
    for v in values:
        if not math.isnan(v):
            m = max(m, abs(v))
    return m


def ref_scaled_block(values, fmt, pow2, eps=0.0):
    """(scale_inv, data, dequantized) of one block under TE's per-tensor/block FP8 rule."""
    s = compute_scale_from_amax(fmax_abs(values), FMT[fmt][0], pow2, eps)
    data = [satfinite(f32(v * s), fmt) for v in values]
    inv = f32(1.0 / s)
    return inv, data, [f32(d * inv) for d in data]


# ---------------------------------------------------------------- Float8CurrentScaling
def test_pinned_release():
    assert TE_RELEASE == ("v2.18", "27486e03cfc1fa41f6932dcecdc47c71c47eac3e")


@pytest.mark.parametrize("fmt", list(FMT))
@pytest.mark.parametrize("pow2", [False, True])
def test_current_scaling_matches_the_source(fmt, pow2):
    rng = np.random.default_rng(1)
    cases = [tensor(rng, (300,)) for _ in range(6)]
    cases += [np.zeros(8, F32), np.array([1e-45, -2e-45], F32), np.array([1.0, np.inf, -3.0], F32),
              np.array([np.nan, 2.0, -0.5], F32), np.array([np.nan, np.nan], F32), np.array([3e38, -1e-30], F32),
              np.array([1e-40, 5e-39], F32)]
    for x in cases:
        r = te_current_scaling(x, fmt, power_2_scale=pow2)
        inv, data, deq = ref_scaled_block([float(v) for v in x], fmt, pow2)
        assert same(r.scales, inv) and same(r.data, data) and same(r.dequantized, deq), x


def test_current_scaling_special_tensors():
    """amax 0, inf and NaN give scale 1 (the all-zero tensor stays 0, inf saturates); a NaN
    element is left out of the amax and stays NaN; epsilon floors the amax."""
    r = te_current_scaling(np.array([1.0, np.inf, -2.0], F32))
    assert float(r.scales) == 1.0 and list(r.data) == [1.0, 448.0, -2.0] and r.saturated == 0
    r = te_current_scaling(np.array([np.nan, 4.0], F32))
    assert float(r.scales) == F32(1 / F32(112)) and np.isnan(r.data[0]) and r.data[1] == 448
    assert float(te_current_scaling(np.array([1e-3], F32), amax_epsilon=1.0).scales) == F32(1 / 448)
    assert float(te_current_scaling(np.zeros(4, F32)).scales) == 1.0


def test_current_scaling_matches_torchao_on_finite_tensors(torchao_modules):
    """torchao's tensorwise current scaling (float64 division, amax clamped to 1e-12) stores the
    same data on finite tensors; it departs on an all-zero tensor (scale 4.48e14, not 1) and on
    an inf (scale 0: every value NaN or 0, where TE saturates the inf)."""
    config, su = torchao_modules("torchao.float8.config", "torchao.float8.float8_scaling_utils")
    from torchao.float8.float8_training_tensor import LinearMMConfig

    rng = np.random.default_rng(2)
    for fmt, dt in (("fp8_e4m3", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)):
        for _ in range(20):
            x = tensor(rng, (64, 48))
            t = su.hp_tensor_to_float8_dynamic(torch.from_numpy(x), dt, LinearMMConfig())
            r = te_current_scaling(x, fmt)
            assert same(r.data, t._data.float().numpy())
            assert same(r.scales, (1 / t._scale.float()).numpy())
    t = su.hp_tensor_to_float8_dynamic(torch.zeros(4), torch.float8_e4m3fn, LinearMMConfig())
    assert float(t._scale) == F32(448 / 1e-12) != float(1 / te_current_scaling(np.zeros(4, F32)).scales)


def test_current_scaling_wrong_variant_is_caught():
    """Rounding the power-of-two scale as torchao does (a float32 log2, which sends a scale just
    below 2**k up to 2**k) is not TE's mantissa mask: amax 14.000001 gives 16, not 32."""
    amax = float(np.nextafter(F32(14), F32(np.inf)))
    s = F32(448) / F32(amax)
    wrong = float(np.exp2(np.floor(np.log2(s))))
    r = te_current_scaling(np.array([amax, 1.0], F32), power_2_scale=True)
    assert float(r.scales) == 1 / 16 and wrong == 32.0


# ---------------------------------------------------------------- Float8BlockScaling
def ref_blocks(x, fmt, block_dim, pow2):
    """(scale_inv per block, data) by the source's rule, block by block."""
    m = int(np.prod(x.shape[:-1]))
    n = x.shape[-1]
    x2 = x.reshape(m, n)
    nb = -(-n // 128)
    if block_dim == 1:
        inv = np.zeros((m, nb), F32)
        data = np.zeros((m, n), F32)
        for i in range(m):
            for j in range(nb):
                vals = [float(v) for v in x2[i, j * 128:(j + 1) * 128]]
                inv[i, j], d, _ = ref_scaled_block(vals, fmt, pow2)
                data[i, j * 128:(j + 1) * 128] = d
        return inv.reshape(x.shape[:-1] + (nb,)), data.reshape(x.shape)
    mb = -(-m // 128)
    inv = np.zeros((mb, nb), F32)
    data = np.zeros((m, n), F32)
    for i in range(mb):
        for j in range(nb):
            tile = x2[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            s, d, _ = ref_scaled_block([float(v) for v in tile.ravel()], fmt, pow2)
            inv[i, j] = s
            data[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = np.array(d, F32).reshape(tile.shape)
    return inv, data.reshape(x.shape)


@pytest.mark.parametrize("block_dim", [1, 2])
@pytest.mark.parametrize("pow2", [True, False])
def test_block_scaling_matches_the_source(block_dim, pow2):
    rng = np.random.default_rng(3)
    x = tensor(rng, (130, 300))  # edge blocks cut short in both directions
    x[0, :128] = 0.0
    x[1, 5] = np.inf
    x[2, 7] = np.nan
    x[129, 299] = -np.inf
    for fmt in FMT:
        r = te_float8_block_scaling(x, fmt, block_dim, pow2)
        inv, data = ref_blocks(x, fmt, block_dim, pow2)
        assert same(r.scales, inv) and same(r.data, data)
        full = np.repeat(inv, 128, axis=-1)[:, :300] if block_dim == 1 else \
            np.repeat(np.repeat(inv, 128, 0), 128, 1)[:130, :300]
        assert same(r.dequantized, (data * full).astype(F32))


def test_block_scaling_matches_torchao_rowwise_per_block(torchao_modules):
    """1x128 blocks with power-of-two scales are torchao's rowwise current scaling applied to
    each 128 values (on finite blocks whose scale is not just below a power of two)."""
    config, su = torchao_modules("torchao.float8.config", "torchao.float8.float8_scaling_utils")
    from torchao.float8.float8_training_tensor import LinearMMConfig

    rng = np.random.default_rng(4)
    x = rng.standard_normal((32, 512)).astype(F32) * np.ldexp(F32(1), rng.integers(-8, 8, (32, 1)))
    t = su.hp_tensor_to_float8_dynamic(torch.from_numpy(x.reshape(-1, 128)), torch.float8_e4m3fn, LinearMMConfig(),
                                       scaling_granularity=config.ScalingGranularity.AXISWISE, axiswise_dim=-1,
                                       round_scales_to_power_of_2=True)
    r = te_float8_block_scaling(x)
    assert same(r.data, t._data.float().numpy().reshape(x.shape))
    assert same(r.scales, (1 / t._scale.float()).numpy().reshape(32, 4))


def test_block_scaling_wrong_variant_is_caught():
    """A float32 scale where the recipe's default is a power of two changes the stored scales."""
    x = tensor(np.random.default_rng(5), (4, 256))
    right = te_float8_block_scaling(x)
    wrong = te_float8_block_scaling(x, power_2_scale=False)
    assert np.all(np.frexp(right.scales)[0] == 0.5)
    assert not same(right.scales, wrong.scales) and not same(right.data, wrong.data)


# ---------------------------------------------------------------- MXFP8BlockScaling
def ref_e8m0_round_up(v: float) -> int:
    """The least E8M0 pattern whose power of two is >= v (NaN 255, inf 254), exactly."""
    if math.isnan(v):
        return 255
    if math.isinf(v):
        return 254
    if v <= 2.0**-127:
        return 0
    m, e = math.frexp(v)  # v = m * 2**e, m in [0.5, 1)
    k = e - 1 if m == 0.5 else e
    return min(k + 127, 254)


def ref_mxfp8(x, fmt):
    top = FMT[fmt][0]
    rcp = f32(1.0 / top)
    codes, data, deq = [], [], []
    for blk in x.reshape(-1, 32):
        vals = [float(v) for v in blk]
        c = ref_e8m0_round_up(f32(fmax_abs(vals) * rcp))
        mult = math.nan if c == 255 else math.ldexp(1.0, 127 - c)
        d = [satfinite(f32(v * mult), fmt) for v in vals]
        back = 0.0 if c == 0 else (math.inf if c == 255 else math.ldexp(1.0, c - 127))
        codes.append(c)
        data += d
        deq += [f32(v * back) if not (v == 0 and math.isinf(back)) else math.nan for v in d]
    return np.array(codes), np.array(data, F32), np.array(deq, F32)


@pytest.mark.parametrize("fmt", list(FMT))
def test_mxfp8_matches_the_source(fmt):
    rng = np.random.default_rng(6)
    x = tensor(rng, (40, 128))
    x[0] = 0.0
    x[1, :32] = (rng.uniform(-1, 1, 32) * 2.0**-130).astype(F32)  # a block below 448 * 2**-127
    x[2, 3] = np.inf
    x[3, 40] = np.nan
    x[4, :32] = 3e38
    r = te_mxfp8(x, fmt)
    codes, data, deq = ref_mxfp8(x, fmt)
    assert np.array_equal(r.scales.ravel(), codes) and same(r.data.ravel(), data)
    assert same(r.dequantized.ravel(), deq)
    assert r.scales[1, 0] == 0 and np.all(r.dequantized[1, :32] == 0)  # exp2f(0) is 0: read back as 0


@pytest.mark.parametrize("fmt", list(FMT))
def test_mxfp8_product_rule_is_the_exact_round_up(fmt):
    """amax * f32(1/max) rounded up gives ceil(log2(amax / max)) exactly, for every float32 amax of
    a whole binade around max (and so, scaled by powers of two, for every normal amax)."""
    top = FMT[fmt][0]
    lo = np.float32(top).view(np.uint32) & np.uint32(0xFF800000)
    a = np.arange(int(lo) - (1 << 22), int(lo) + (1 << 23) + (1 << 22), dtype=np.uint32).view(F32)
    r = te_mxfp8(np.concatenate((a, np.zeros((-a.size) % 32, F32))).reshape(-1, 32)[:, :1].repeat(32, 1), fmt)
    exact = mx_quantize(np.concatenate((a, np.zeros((-a.size) % 32, F32))).reshape(-1, 32)[:, :1].repeat(32, 1),
                        fmt, rounding="rceil")
    assert np.array_equal(r.scales, exact.scales)


def test_mxfp8_matches_torchao_rceil(torchao_modules):
    """torchao's ``to_mx`` with RCEIL stores the same scales and elements on ordinary blocks;
    it departs where a block holds NaN (scale 255 there, TE leaves NaN out of the amax), where
    its float32 log2 rounds amax / max just above 2**k down, and in reading pattern 0 back."""
    (mx_tensor, cfg) = torchao_modules("torchao.prototype.mx_formats.mx_tensor", "torchao.prototype.mx_formats.config")
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((64, 256)) * np.ldexp(1.0, rng.integers(-20, 20, (64, 1)))).astype(F32)
    for fmt, dt in (("fp8_e4m3", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)):
        s, q = mx_tensor.to_mx(torch.from_numpy(x), dt, 32, cfg.ScaleCalculationMode.RCEIL)
        r = te_mxfp8(x, fmt)
        assert np.array_equal(r.scales.ravel(), s.view(torch.uint8).numpy().ravel())
        assert same(r.data, q.float().numpy())
    y = np.ones(32, F32)
    y[0] = np.nan
    s, _ = mx_tensor.to_mx(torch.from_numpy(y), torch.float8_e4m3fn, 32, cfg.ScaleCalculationMode.RCEIL)
    assert int(s.view(torch.uint8)[0]) == 255 and te_mxfp8(y).scales[0] == 127 - 8


def test_mxfp8_wrong_variant_is_caught():
    """OCP's floor rule (floor(log2 amax) - 8) is not TE's round-up: amax 500 gets 2**0 and
    saturates to 448 under floor; TE gives 2**1 and stores 250 -> 256."""
    x = np.full(32, 3.0, F32)
    x[0] = 500.0
    r = te_mxfp8(x)
    floor = mx_quantize(x, "fp8_e4m3", rounding="floor")
    assert r.scales[0] == 128 and floor.scales[0] == 127 and r.saturated == 0
    assert r.dequantized[0] == 512 and floor.values[0] == 448


# ---------------------------------------------------------------- NVFP4BlockScaling
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def ref_e4m3(v: float) -> float:
    return satfinite(v, "fp8_e4m3")


def ref_nvfp4(x2, tile):
    """_quantize_blockwise_reference, in Python floats: (S_dec, block scale values, e2m1 values)."""
    m, n = x2.shape
    gmax = max(abs(float(v)) for v in x2.ravel())
    s_enc = min(f32(2688.0 / gmax) if gmax else math.inf, FLT_MAX)
    s_enc = 1.0 if s_enc == 0 else s_enc
    s_dec = f32(1.0 / s_enc)
    mult = f32(s_enc * f32(1 / 6))
    scales = np.zeros((m, n // 16))
    vals = np.zeros((m, n))
    for i in range(m):
        for j in range(n // 16):
            if tile == "1x16":
                vmax = max(abs(float(v)) for v in x2[i, j * 16:(j + 1) * 16])
            else:
                r0 = i // 16 * 16
                vmax = max(abs(float(v)) for v in x2[r0:r0 + 16, j * 16:(j + 1) * 16].ravel())
            dec = ref_e4m3(min(f32(vmax * mult), FLT_MAX))
            enc = min(f32(1.0 / f32(dec * s_dec)) if dec else math.inf, FLT_MAX)
            scales[i, j] = dec
            for k in range(16):
                y = min(max(f32(float(x2[i, j * 16 + k]) * enc), -6.0), 6.0)
                vals[i, j * 16 + k] = math.copysign(rne(abs(y), 1, 0), y) if y else 0.0
    return s_dec, scales, vals


@pytest.mark.parametrize("tile", NVFP4_TILES)
def test_nvfp4_matches_the_source(tile):
    rng = np.random.default_rng(8)
    x = tensor(rng, (32, 64))
    x[:16, :16] = 0.0
    x[20, 16:32] = (rng.uniform(-1, 1, 16) * 1e-6).astype(F32)  # a block scale below 2**-6
    r = te_nvfp4(x, tile)
    s_dec, scales, vals = ref_nvfp4(x, tile)
    from ampviz.formats import FP8_E4M3
    assert r.tensor_scale == F32(s_dec)
    assert same(np.asarray(FP8_E4M3.decode(r.scales.astype(np.int64)), F32), scales)
    assert same(np.abs(r.data), np.abs(vals)) and np.all(np.abs(r.data) <= 6)


def test_nvfp4_1x16_equals_the_blocks_te_convention_and_rht_is_applied_first():
    x = tensor(np.random.default_rng(9), (8, 64))
    r, b = te_nvfp4(x), nvfp4_quantize(x, convention="te")
    assert np.array_equal(r.scales, b.scales) and same(r.dequantized, b.values) and r.tensor_scale == b.tensor_scale
    h = te_nvfp4(x, rht=True)
    assert same(h.dequantized, te_nvfp4(random_hadamard_transform(x)).dequantized)


def test_nvfp4_matches_torchao_on_gaussian_data(torchao_modules):
    """torchao's two-level NVFP4 gives the same block scales as TE's reference on N(0, 1) data;
    it departs on small blocks (it clamps block scales up to 2**-6, TE keeps E4M3 subnormals)."""
    (nv,) = torchao_modules("torchao.prototype.mx_formats.nvfp4_tensor")
    x = np.random.default_rng(10).standard_normal((16, 128)).astype(F32)
    xt = torch.from_numpy(x)
    s, _ = nv.nvfp4_quantize(xt, 16, nv.per_tensor_amax_to_scale(xt.abs().max()))
    assert np.array_equal(te_nvfp4(x).scales.ravel(), s.view(torch.uint8).numpy().ravel())


def test_nvfp4_wrong_variant_is_caught():
    """1x16 blocks for a weight whose rows differ: the recipe's 16x16 tiles share one scale down
    the tile, so the small rows get the big row's scale (and round to 0 more often)."""
    x = np.full((16, 16), 0.01, F32)
    x[0] = 5.0
    tiles, rows = te_nvfp4(x, "16x16"), te_nvfp4(x, "1x16")
    assert len(set(tiles.scales.ravel())) == 1 and len(set(rows.scales.ravel())) == 2
    assert tiles.underflowed == 15 * 16 and rows.underflowed == 0


def test_nvfp4_stochastic_rounding_is_unbiased_on_average():
    x = np.tile(np.linspace(-1, 1, 16, dtype=F32), (1, 1))
    x[0, 0] = 6.0
    rng = np.random.default_rng(11)
    mean = np.mean([te_nvfp4(x, rng=rng).dequantized for _ in range(3000)], axis=0)
    assert np.allclose(mean, x, atol=0.03)


# ---------------------------------------------------------------- bad input
BAD = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=6),
                st.lists(st.floats(width=32), max_size=40), st.just(np.zeros((0, 32))), st.just(object()),
                st.just(np.zeros((16, 32), F32)), st.just(complex(1, 2)), st.sampled_from(["fp8_e5m2", "1x16", 2]))


@settings(max_examples=150, deadline=None)
@given(fn=st.sampled_from([te_current_scaling, te_float8_block_scaling, te_mxfp8, te_nvfp4]),
       x=BAD, a=BAD, b=BAD)
def test_bad_input_gives_one_line_errors(fn, x, a, b):
    try:
        fn(x, a, b) if fn in (te_current_scaling, te_float8_block_scaling, te_nvfp4) else fn(x, a)
    except (ValueError, TypeError) as e:
        assert str(e).strip() and "\n" not in str(e)
