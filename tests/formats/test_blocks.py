"""ampviz.formats.blocks against torchao 0.18 (MX ``to_mx``, ``nvfp4_quantize``), Transformer Engine's NVFP4
reference formulas, and the rules' own definitions computed with exact fractions: bit for bit,
with each place where torchao departs from the rule shown, and a wrong variant of each rule caught.

The torchao tests skip without torchao, except under CI=true, where they fail."""

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ampviz.formats import blocks
from ampviz.formats.blocks import nvfp4
from ampviz.formats.blocks import (MX_ELEMENT_FORMATS, TE_RHT_SIGNS, MXBlocks, NVFP4Blocks, hadamard_matrix,
                                   mx_quantize, nvfp4_quantize, random_hadamard_transform, stochastic_round)
from ampviz.formats import E8M0, FP4_E2M1, FP6_E2M3, FP8_E4M3, FP8_E5M2, get_format

MODES = ["floor", "ceil", "even", "rceil"]
NAMES = list(MX_ELEMENT_FORMATS)
F32 = np.float32


# ---------------------------------------------------------------- references
@pytest.fixture(scope="module")
def ao(torchao_modules):
    """torchao's MX and NVFP4 functions; skipped without torchao, a failure under CI=true."""
    config, kernels, mx_tensor, nvfp4_tensor = torchao_modules(
        "torchao.prototype.mx_formats.config", "torchao.prototype.mx_formats.kernels",
        "torchao.prototype.mx_formats.mx_tensor", "torchao.prototype.mx_formats.nvfp4_tensor")
    dtypes = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2, "fp6_e3m2": "fp6_e3m2",
              "fp6_e2m3": "fp6_e2m3", "fp4_e2m1": torch.float4_e2m1fn_x2}

    def to_mx(x: np.ndarray, name: str, mode: str):
        """(scale patterns, element patterns, dequantized values) as torchao gives them."""
        t = torch.from_numpy(np.ascontiguousarray(x, F32))
        m = config.ScaleCalculationMode(mode)
        scale, data = mx_tensor.to_mx(t, dtypes[name], 32, m)
        data = kernels.unpack_uint4(data) if name == "fp4_e2m1" else data.view(torch.uint8)
        values = mx_tensor.MXTensor.to_mx(t, dtypes[name], 32, scaling_mode=m).dequantize(torch.float32)
        return scale.view(torch.uint8).numpy(), data.numpy().reshape(x.shape), values.numpy()

    def nvfp4(x: np.ndarray, per_tensor_scale=True):
        t = torch.from_numpy(np.ascontiguousarray(x, F32))
        if per_tensor_scale is True:
            pts = nvfp4_tensor.per_tensor_amax_to_scale(t.abs().max())
        else:
            pts = None if per_tensor_scale is False else torch.tensor(per_tensor_scale, dtype=torch.float32)
        scales, data = nvfp4_tensor.nvfp4_quantize(t, 16, pts)
        values = nvfp4_tensor.NVFP4Tensor.to_nvfp4(t, per_tensor_scale=pts).dequantize(torch.float32)
        codes = kernels.unpack_uint4(data).numpy().reshape(x.shape)
        return (None if pts is None else pts.numpy()[()]), scales.view(torch.uint8).numpy(), codes, values.numpy()

    return to_mx, nvfp4


def same(a, b) -> np.ndarray:
    """Bit-identical float32 values (NaN equals NaN)."""
    a, b = np.asarray(a, F32), np.asarray(b, F32)
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


def f32_of(q: Fraction) -> float:
    """An exact rational rounded to float32, to nearest even (inf past the range)."""
    if q == 0:
        return 0.0
    a = abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    e += 1 if Fraction(2) ** e <= a / 2 else 0
    e -= 1 if Fraction(2) ** e > a else 0
    ulp = Fraction(2) ** (max(e, -126) - 23)
    r = round(a / ulp) * ulp  # round(): ties to even
    return math.copysign(math.inf if r >= 2**128 else float(r), q)


def mx_rule(x: np.ndarray, fmt, mode: str):
    """The MX rules from their definitions, with exact fractions, one block per row."""
    scales, codes = [], []
    emax, top = fmt.emax, Fraction(fmt.max)
    for row in x.astype(np.float64):
        if np.isnan(row).any() or (np.isinf(row).any() and mode != "rceil"):
            scales.append(255)
            codes.append(None)
            continue
        if np.isinf(row).any():
            k = 127
        else:
            amax = max(Fraction(abs(v)) for v in row)
            if amax == 0:
                k = -127
            elif mode == "rceil":  # the least k with max * 2**k >= amax
                k = -300
                while top * Fraction(2) ** k < amax:
                    k += 1
            else:
                if mode == "even":  # amax rounded to the element's mantissa bits, ties to even
                    e = next(j for j in range(200, -200, -1) if Fraction(2) ** j <= amax)
                    ulp = Fraction(2) ** (e - fmt.mantissa_bits)
                    amax = round(amax / ulp) * ulp
                e = next(j for j in range(200, -200, -1) if Fraction(2) ** j <= amax)  # floor(log2)
                k = e + (1 if mode == "ceil" and Fraction(2) ** e != amax else 0) - emax
        k = min(max(k, -127), 127)
        scale = Fraction(2) ** k
        v = [float(max(-top, min(top, Fraction(val) / scale))) if np.isfinite(val) and val != 0
             else (val if val == 0 else float(np.sign(val)) * fmt.max) for val in row]  # (-0 keeps its sign)
        scales.append(k + 127)
        codes.append(fmt.encode(np.array(v, np.float64)))
    return scales, codes


def mx_blocks(seed: int, n: int = 1200) -> np.ndarray:
    """Blocks of every kind, one per row: normal, tiny (float32 subnormals too), huge, powers of
    two, integers, amax just above/below each format's max * 2**k, zeros, -0, NaN and inf."""
    rng = np.random.default_rng(seed)
    kinds = []
    g = rng.standard_normal((n, 32))
    kinds.append(g * np.exp2(rng.uniform(-60, 60, (n, 1))))
    kinds.append(g[: n // 4] * np.exp2(rng.uniform(-152, -95, (n // 4, 1))))
    kinds.append(g[: n // 4] * np.exp2(rng.uniform(100, 126, (n // 4, 1))))
    kinds.append(np.round(g[: n // 8] * 20))
    p2 = rng.standard_normal((n // 8, 32))
    p2[:, 0] = np.exp2(rng.integers(-126, 127, n // 8))
    kinds.append(p2)
    for f in MX_ELEMENT_FORMATS.values():  # amax = max * 2**k moved by -2..2 float32 steps
        k = rng.integers(-120, 100, 40)
        b = rng.uniform(-1, 1, (40, 32)) * f.max * 0.5 * np.exp2(k)[:, None]
        edge = np.ldexp(F32(f.max), k).astype(F32)
        for j, step in enumerate(rng.integers(-2, 3, 40)):
            for _ in range(abs(step)):
                edge[j] = np.nextafter(edge[j], F32(np.inf if step > 0 else 0))
        b[:, 3] = edge
        kinds.append(b)
    special = np.zeros((12, 32))
    special[1] = -0.0
    special[2, 5], special[3, 0], special[4, 31] = np.nan, -np.nan, np.inf
    special[5, 7], special[5, 8] = -np.inf, np.nan
    special[6, 0], special[6, 1:] = np.inf, np.linspace(-3, 3, 31)
    special[7, 0], special[7, 1:] = np.nan, np.linspace(-3, 3, 31)
    special[8] = np.linspace(-3, 3, 32)
    special[8, 5] = 500.0
    special[9, :4] = [1e-40, -2e-41, 0, 1e-45]
    special[10] = 3.4e38
    special[11, ::2] = -0.0
    kinds.append(special)
    with np.errstate(over="ignore"):
        return np.concatenate(kinds).astype(F32)


def torchao_departures(x: np.ndarray, ours: MXBlocks, fmt, mode: str) -> np.ndarray:
    """The blocks (rows) where torchao departs from the rule, by the three documented causes."""
    finite = np.isfinite(x).all(axis=-1)
    nonzero_tiny = (ours.scales[:, 0] == 0) & (np.abs(x) > 0).any(axis=-1) & finite
    if mode != "rceil":
        has_inf = np.isinf(x).any(axis=-1) & ~np.isnan(x).any(axis=-1)
        return nonzero_tiny | has_inf
    amax = np.abs(x).max(axis=-1).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = (amax / fmt.max).astype(F32)  # torchao's float32 descale
        logged = np.ceil(np.log2(d))  # float32 log2 rounds 2**k * (1 + tiny) to k
    exact = ours.scales[:, 0].astype(np.int64) - 127
    return nonzero_tiny | (finite & (amax > 0) & (logged != exact) & (exact > -127))


# ---------------------------------------------------------------- MX against torchao
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", NAMES)
def test_mx_matches_torchao_bit_for_bit_outside_its_departures(ao, name, mode):
    to_mx, _ = ao
    fmt = MX_ELEMENT_FORMATS[name]
    x = mx_blocks(seed=NAMES.index(name))
    ours = mx_quantize(x, name, 32, mode)
    scales, codes, values = to_mx(x, name, mode)
    dep = torchao_departures(x, ours, fmt, mode)
    keep = ~dep
    assert np.array_equal(ours.scales[keep], scales[keep])
    assert np.array_equal(ours.codes[keep], codes[keep])
    assert same(ours.values[keep], values[keep]).all()
    # the kinds of block the brief names are all there, and matched
    kinds = {"zero": (x == 0).all(-1), "nan": np.isnan(x).any(-1), "inf": np.isinf(x).any(-1),
             "huge": np.abs(x).max(-1) > 1e30, "tiny": (np.abs(x).max(-1) < 1e-25) & (x != 0).any(-1)}
    for kind, rows in kinds.items():
        assert rows.any(), kind
    assert (keep & kinds["zero"]).any() and (keep & kinds["nan"]).any() and (keep & kinds["huge"]).any()
    assert (keep & kinds["tiny"]).any()
    # and where torchao departs, the departure is exactly the documented one
    for r in np.flatnonzero(dep):
        explain_departure(x[r], ours.scales[r, 0], scales[r, 0], codes[r], fmt, mode)


def explain_departure(row, ours_scale, ao_scale, ao_codes, fmt, mode):
    top = F32(fmt.max)
    if np.isinf(row).any():  # 2: floor/ceil/even keep a finite scale 2**(128 - emax), saturate inf
        assert mode != "rceil" and ours_scale == 255 and ao_scale == 127 + 128 - fmt.emax
        expect = np.clip(row / F32(2.0 ** (128 - fmt.emax)), -top, top)
        assert np.array_equal(ao_codes, fmt.encode(expect))
    elif ours_scale == 0:  # 1 and 3: scale 2**-127 stored, 2**-126 (floor...) or 1.0 (rceil) used
        assert ao_scale == 0
        used = F32(2.0**-126) if mode != "rceil" else F32(1.0)
        v = np.clip((row / used) if mode != "rceil" else row * used, -top, top)
        assert np.array_equal(ao_codes, fmt.encode(v))
    else:  # 3: rceil one scale too small, just above max * 2**k
        assert mode == "rceil" and ao_scale == ours_scale - 1
        amax = np.abs(row).max()
        k = int(ours_scale) - 127
        assert np.ldexp(fmt.max, k - 1) < amax < np.ldexp(fmt.max, k - 1) * (1 + 2.0**-16)


def test_the_departures_happen_and_differ(ao):
    """Each departure, on a block built for it (E4M3), against the rule."""
    to_mx, _ = ao
    rows = np.zeros((4, 32), F32)
    rows[0, :3] = [1e-40, -3e-39, 2.5e-40]  # float32-subnormal amax: scale 2**-127
    rows[1, 0], rows[1, 1:4] = np.inf, [1.0, -2.0, 3.0]
    rows[2, 0], rows[2, 1] = np.nextafter(F32(3.5), F32(4)), 0.03  # amax/448 just above 2**-7
    rows[3, :3] = [5e-38, -1e-37, 2e-38]  # normal amax, scale 2**-127 under rceil
    for mode, r, want in [("floor", 0, "2**-126 used"), ("floor", 1, "inf kept finite"),
                          ("rceil", 2, "one scale too small"), ("rceil", 3, "1.0 used")]:
        ours = mx_quantize(rows[r:r + 1], "fp8_e4m3", 32, mode)
        scales, codes, values = to_mx(rows[r:r + 1], "fp8_e4m3", mode)
        assert not (np.array_equal(ours.scales, scales) and np.array_equal(ours.codes, codes)), want
    ours = mx_quantize(rows, "fp8_e4m3", 32, "rceil")
    ao_scales, ao_codes, _ = to_mx(rows[2:3], "fp8_e4m3", "rceil")
    assert ours.scales[2, 0] == 127 - 6 and ao_scales[0, 0] == 127 - 7
    # 3.5000002 * 2**6 = 224.00002 -> 224 (exact scale); * 2**7 = 448.00003, saturated to 448
    assert FP8_E4M3.decode(int(ours.codes[2, 0])) == 224 and FP8_E4M3.decode(int(ao_codes[0, 0])) == 448
    assert FP8_E4M3.decode(int(ours.codes[2, 1])) == 1.875 != FP8_E4M3.decode(int(ao_codes[0, 1])) == 3.75
    assert ours.codes[0, 0] == FP8_E4M3.encode(1e-40 * 2.0**127)  # the stored scale is the one used
    assert list(mx_quantize(rows[1:2], "fp8_e4m3", 32, "floor").scales[0]) == [255]


def test_the_small_run_of_the_design_notes(ao):
    """E4M3, rows [amax 500 with a ±3 ramp], [zeros], [NaN first], [inf first]: scale patterns
    per mode (torchao's inf row: 247, ours NaN 255 under floor/ceil/even)."""
    to_mx, _ = ao
    x = np.zeros((4, 32), F32)
    x[0] = np.linspace(-3, 3, 32)
    x[0, 5] = 500
    x[2, 0], x[2, 1:] = np.nan, np.linspace(-3, 3, 31)
    x[3, 0], x[3, 1:] = np.inf, np.linspace(-3, 3, 31)
    want = {"floor": [127, 0, 255, 255], "rceil": [128, 0, 255, 254], "ceil": [128, 0, 255, 255],
            "even": [128, 0, 255, 255]}
    for mode, scales in want.items():
        got = mx_quantize(x, "fp8_e4m3", 32, mode)
        assert list(got.scales[:, 0]) == scales
        assert list(to_mx(x, "fp8_e4m3", mode)[0][:, 0]) == scales[:3] + [254 if mode == "rceil" else 247]
        assert got.values[0, 5] == (448 if mode == "floor" else 512)
        assert np.isnan(got.values[2]).all()
    assert mx_quantize(x, "fp8_e4m3", 32, "floor").values[0, 0] == -3


# ---------------------------------------------------------------- MX against its definition
@pytest.mark.parametrize("mode", MODES)
def test_mx_follows_the_rule_computed_with_fractions(mode):
    x = mx_blocks(seed=9, n=40)
    x = x[np.random.default_rng(3).choice(len(x), 90, replace=False)]
    for name, fmt in MX_ELEMENT_FORMATS.items():
        got = mx_quantize(x, fmt, 32, mode)
        scales, codes = mx_rule(x, fmt, mode)
        assert list(got.scales[:, 0]) == scales, name
        for r, c in enumerate(codes):
            if c is not None:
                assert np.array_equal(got.codes[r], c), (name, r)
                scale = np.ldexp(1.0, int(scales[r]) - 127)
                with np.errstate(over="ignore"):  # 448 * 2**127 is inf in float32, as in torchao
                    assert same(got.values[r], (np.asarray(fmt.decode(c)) * scale).astype(F32)).all()
            else:
                assert np.isnan(got.values[r]).all()


def scales_by_e8m0_cast(x, fmt):
    """A plausible wrong rule: the E8M0 cast (round to nearest) of amax / 2**emax."""
    amax = np.abs(x).max(axis=-1).astype(np.float64)
    return np.asarray(E8M0.encode(amax / 2.0**fmt.emax))


def scales_by_float32_log2(x, fmt):
    """Another: rceil as torchao computes it, ceil(log2(amax / max)) in float32."""
    with np.errstate(divide="ignore"):
        d = (np.abs(x).max(axis=-1) / F32(fmt.max)).astype(F32)
        return (np.clip(np.ceil(np.log2(d)), -127, 127) + 127).astype(np.int64)


def test_wrong_scale_rules_are_caught():
    x = mx_blocks(seed=4, n=200)
    x = x[np.isfinite(x).all(-1) & (np.abs(x).max(-1) > 1e-30)]
    for name, fmt in MX_ELEMENT_FORMATS.items():
        assert not np.array_equal(scales_by_e8m0_cast(x, fmt), mx_quantize(x, fmt, 32, "floor").scales[:, 0])
        assert not np.array_equal(scales_by_float32_log2(x, fmt), mx_quantize(x, fmt, 32, "rceil").scales[:, 0])
    # and the rule is not the element cast without saturation: 500 would be NaN in ml_dtypes' E4M3
    import ml_dtypes

    row = np.zeros((1, 32), F32)
    row[0, 0] = 500
    assert np.isnan(np.float32(500 / 2.0**0).astype(ml_dtypes.float8_e4m3fn).astype(F32))
    assert mx_quantize(row, "fp8_e4m3").values[0, 0] == 448


def test_mx_shapes_blocks_and_options():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 64)).astype(F32)
    r = mx_quantize(x, FP6_E2M3, block_size=16, rounding="even")
    assert isinstance(r, MXBlocks) and r.scales.shape == (2, 3, 4) and r.codes.shape == r.values.shape == x.shape
    assert r.scales.dtype == r.codes.dtype == np.uint8 and r.values.dtype == np.float32
    flat = mx_quantize(x.reshape(-1, 16), "fp6_e2m3", 16, "EVEN")
    assert np.array_equal(flat.codes.reshape(x.shape), r.codes)
    assert np.array_equal(mx_quantize(torch.from_numpy(x), torch.float8_e5m2).codes, mx_quantize(x, "fp8_e5m2").codes)
    for field in r:
        with pytest.raises(ValueError):
            field.reshape(-1)[0] = 0  # read-only
    with pytest.raises(AttributeError):
        r.scales = None
    assert np.all(r.codes < 64) and np.all(mx_quantize(x, "fp4_e2m1").codes < 16)


@pytest.mark.parametrize("call, error, says", [
    (lambda: mx_quantize(np.ones(30), "fp8_e4m3"), ValueError, "multiple of the block size 32"),
    (lambda: mx_quantize(1.0, "fp8_e4m3"), ValueError, "at least one axis"),
    (lambda: mx_quantize(np.ones(32), "fp16"), ValueError, "fmt must be an MX element format"),
    (lambda: mx_quantize(np.ones(32), "e8m0"), ValueError, "fmt must be an MX element format"),
    (lambda: mx_quantize(np.ones(32), None), ValueError, "fmt must be an MX element format"),
    (lambda: mx_quantize(np.ones(32), "fp4_e2m1", 0), ValueError, "block_size must be a positive int"),
    (lambda: mx_quantize(np.ones(32), "fp4_e2m1", 32.0), TypeError, "block_size must be a positive int"),
    (lambda: mx_quantize(np.ones(32), "fp4_e2m1", rounding="nearest"), ValueError, "rounding must be one of"),
    (lambda: mx_quantize(np.ones(32), "fp4_e2m1", rng=3), TypeError, "rng must be a numpy Generator"),
    (lambda: mx_quantize(["a"] * 32, "fp4_e2m1"), TypeError, "must be numbers"),
    (lambda: nvfp4_quantize(np.ones(8)), ValueError, "multiple of the block size 16"),
    (lambda: nvfp4_quantize(np.ones(16), per_tensor_scale="yes"), TypeError, "per_tensor_scale must be True"),
    (lambda: nvfp4_quantize(np.ones(16), per_tensor_scale=-1.0), ValueError, "positive finite decode scale"),
    (lambda: nvfp4_quantize(np.ones(16), convention="cuda"), ValueError, "convention must be one of"),
    (lambda: nvfp4_quantize(np.ones(16), False, convention="te"), ValueError, "no single-level scaling"),
    (lambda: stochastic_round([1.0], "e8m0", np.random.default_rng()), ValueError, "signed element format"),
    (lambda: stochastic_round([1.0], "fp4_e2m1", None), TypeError, "pass rng="),
    (lambda: hadamard_matrix([1, 1, 1]), ValueError, "power-of-four count"),
    (lambda: hadamard_matrix([1, -1]), ValueError, "power-of-four count"),
    (lambda: hadamard_matrix([1, 2, 1, 1]), ValueError, "power-of-four count"),
    (lambda: random_hadamard_transform(np.ones(16), inverse="yes"), TypeError, "inverse must be True or False"),
])
def test_bad_arguments_are_one_line_errors_that_say_what_to_pass(call, error, says):
    with pytest.raises(error, match=says) as info:
        call()
    assert "\n" not in str(info.value)


def test_rounding_accepts_torchaos_enum(ao):
    from torchao.prototype.mx_formats.config import ScaleCalculationMode

    x = mx_blocks(seed=6, n=10)
    assert np.array_equal(mx_quantize(x, "fp8_e4m3", rounding=ScaleCalculationMode.RCEIL).scales,
                          mx_quantize(x, "fp8_e4m3", rounding="rceil").scales)


@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float6_e2m3fn", "float4_e2m1fn",
                                  "float8_e8m0fnu", "float8_e4m3fnuz"])
def test_ml_dtypes_arrays_are_quantized_as_their_float32_values(name):
    import ml_dtypes

    with np.errstate(all="ignore"):
        a = mx_blocks(seed=21, n=200).astype(getattr(ml_dtypes, name))
    plain = a.astype(F32)
    for fmt, mode in (("fp8_e4m3", "floor"), ("fp4_e2m1", "rceil"), ("fp6_e3m2", "even")):
        got, ref = mx_quantize(a, fmt, rounding=mode), mx_quantize(plain, fmt, rounding=mode)
        assert np.array_equal(got.scales, ref.scales) and np.array_equal(got.codes, ref.codes)
        assert same(got.values, ref.values).all()
    got, ref = nvfp4_quantize(a[:, :32]), nvfp4_quantize(plain[:, :32])
    assert same(got.tensor_scale, ref.tensor_scale) and np.array_equal(got.scales, ref.scales)
    assert np.array_equal(got.codes, ref.codes) and same(got.values, ref.values).all()


# ---------------------------------------------------------------- NVFP4 against torchao
def nvfp4_data(seed: int) -> list:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(6):
        x = rng.standard_normal((64, 64)) * np.exp2(rng.uniform(-25, 25, (64, 1))) * np.exp2(rng.uniform(-30, 30))
        x[::9] = 0
        x[3::7, :5] = -0.0
        x[5::11, 16:32] *= 1e-9  # blocks far below the tensor's amax: scales clamp at 2**-6
        out.append(x.astype(F32))
    out.append(np.array([[0, .3, -.7, 1.2, 2.6, 5.1, 6, 7.9, -12, .01, .02, .05, 1, 2, 3, 4] * 2], F32))
    out.append(np.zeros((3, 32), F32))  # torchao: 0/0 block scales (NaN), NaN values
    out.append(np.array([[np.inf] + [1] * 15, [2] * 16], F32))
    out.append(rng.standard_normal((2, 3, 48)).astype(F32))
    return out


@pytest.mark.parametrize("two_level", [True, False])
def test_nvfp4_matches_torchao_bit_for_bit(ao, two_level):
    _, nvfp4 = ao
    for x in nvfp4_data(seed=11):
        pts, scales, codes, values = nvfp4(x, two_level)
        r = nvfp4_quantize(x, two_level)
        assert isinstance(r, NVFP4Blocks)
        assert (pts is None and r.tensor_scale is None) or same(r.tensor_scale, pts)
        assert np.array_equal(r.scales.reshape(scales.shape), scales)
        assert np.array_equal(r.codes, codes)
        assert same(r.values, values).all()


def test_nvfp4_calibrated_scale_and_the_demo_row(ao):
    _, nvfp4 = ao
    x = nvfp4_data(seed=12)[0]
    pts, scales, codes, values = nvfp4(x, 0.0123)
    r = nvfp4_quantize(x, 0.0123)
    assert r.tensor_scale == pts and np.array_equal(r.scales, scales) and np.array_equal(r.codes, codes)
    demo = nvfp4_quantize(nvfp4_data(seed=0)[6])
    assert demo.tensor_scale == F32(12) / F32(2688) and list(demo.scales[0]) == [126, 126]  # 448
    assert list(demo.values[0, :16]) == [0, 0, -1, 1, 3, 6, 6, 8, -12, 0, 0, 0, 1, 2, 3, 4]
    assert FP8_E4M3.decode(nvfp4_quantize(nvfp4_data(seed=0)[6], False).scales[0, 0]) == 2.0


def test_nvfp4_with_nan_is_nan_where_torchao_is(ao):
    """A NaN reaches every block through the tensor scale. torch's reductions write their own NaN
    payloads (``max`` gives 0xFFFFFFFF), which decide the meaningless patterns of NaN-scale
    blocks; the NaN-ness of every scale and value is the same."""
    _, nvfp4 = ao
    x = np.array([[np.nan] + [1] * 15, [2] * 16, [-np.nan] + [0] * 15], F32)
    for two_level in (True, False):
        pts, scales, codes, values = nvfp4(x, two_level)
        r = nvfp4_quantize(x, two_level)
        nan_scale = np.isnan(FP8_E4M3.decode(scales.astype(np.int64)))
        assert np.array_equal(np.isnan(FP8_E4M3.decode(r.scales.astype(np.int64))), nan_scale)
        assert np.array_equal(np.isnan(r.values), np.isnan(values))
        assert np.array_equal(r.codes[~nan_scale.repeat(16, -1)], codes[~nan_scale.repeat(16, -1)])


def nvfp4_nan_data() -> list:
    """Tensors holding NaN: one NaN, NaN in some blocks and rows, all NaN, -NaN, NaN beside inf
    and zeros, and enough blocks for torch's vectorized loops and their remainders."""
    rng = np.random.default_rng(19)
    x = rng.standard_normal((8, 64)).astype(F32)
    x[rng.random((8, 64)) < 0.05] = np.nan
    y = rng.standard_normal((3, 2, 48)).astype(F32)
    y[1, 1, 20] = -np.nan
    return [np.array([[np.nan] + [1] * 15, [2] * 16, [-np.nan] + [0] * 15], F32),
            np.array([[np.nan] * 16, [2] * 16], F32), np.full((2, 32), np.nan, F32),
            np.array([[1] * 5 + [np.nan] + [2] * 10], F32), x, y,
            np.array([[np.inf] + [1] * 15, [0] * 15 + [np.nan]], F32), np.full((33, 16), -np.nan, F32)]


def nvfp4_agrees_on_nan(ao, x, two_level) -> bool:
    """Whether nvfp4_quantize gives torchao's tensor scale (every bit), block scale patterns and
    element patterns (both follow the NaNs' signs and payloads), and NaN exactly where torchao's
    values are NaN. An element that is NaN itself may keep its own NaN in torch's multiply (in a
    loop's remainder, on some processors) where ours keeps the scale's: either pattern is torch's."""
    _, nvfp4 = ao
    pts, scales, codes, values = nvfp4(x, two_level)
    r = nvfp4_quantize(x, two_level)
    own = np.asarray(FP4_E2M1.encode(x, nan="torchao")).astype(np.uint8)
    return ((pts is None and r.tensor_scale is None or F32(pts).view(np.uint32) == F32(r.tensor_scale).view(np.uint32))
            and np.array_equal(r.scales.reshape(scales.shape), scales)
            and ((r.codes == codes) | np.isnan(x) & (codes == own)).all() and same(r.values, values).all())


@pytest.mark.parametrize("two_level", [True, False])
def test_nvfp4_with_nan_matches_torchao(ao, two_level):
    """torch's ``max`` of |x| over the tensor writes the NaN 0xFFFFFFFF (negative): the tensor
    scale is that NaN, and finite blocks divided by it get the block scale pattern 0xFF."""
    for x in nvfp4_nan_data():
        assert nvfp4_agrees_on_nan(ao, x, two_level), x
    r = nvfp4_quantize(nvfp4_nan_data()[0], two_level)
    assert r.scales.ravel().tolist() == ([0x7F, 0xFF, 0x7F] if two_level else [0x7F, 43, 0x7F])


def test_nvfp4_positive_nan_tensor_amax_is_caught(ao, monkeypatch):
    """The plausible variant, a tensor amax that is numpy's positive NaN, differs from torchao."""
    x = nvfp4_nan_data()[0]
    assert nvfp4_agrees_on_nan(ao, x, True)
    monkeypatch.setattr(nvfp4, "_TORCH_MAX_NAN", F32(np.nan))  # read where nvfp4_quantize lives
    assert not nvfp4_agrees_on_nan(ao, x, True)


# ---------------------------------------------------------------- NVFP4: Transformer Engine's reference
def te_reference(x: torch.Tensor):
    """Transformer Engine's ``NVFP4QuantizerRef._quantize_blockwise_reference`` (1x16 tiles, no
    pow-2 scales, no 4over6) with its global amax, transcribed; codes unpacked."""
    fp4_max, e4m3_max = torch.tensor(6.0), torch.tensor(448.0)
    f32max = torch.tensor(torch.finfo(torch.float32).max)
    global_amax = torch.max(torch.abs(x)).to(torch.float32).view(1)
    m, n = x.shape
    xr = x.view(m, n // 16, 16)
    vec_max = torch.amax(torch.abs(xr), dim=-1, keepdim=True).to(torch.float32)
    enc_g = torch.min(torch.div(e4m3_max * fp4_max, global_amax), f32max)
    if enc_g == torch.tensor(0.0):
        enc_g = torch.tensor(1.0)
    dec_g = torch.div(1.0, enc_g)
    dec = torch.min(vec_max * (enc_g * torch.reciprocal(fp4_max)), f32max)
    dec = torch.clamp(dec, min=-e4m3_max, max=e4m3_max).to(torch.float8_e4m3fn)
    enc = torch.min(torch.div(1.0, dec.to(torch.float32) * dec_g), f32max)
    c = torch.clamp(xr.to(torch.float32) * enc, -fp4_max, fp4_max).reshape(m, n)
    q = torch.zeros_like(c, dtype=torch.uint8)  # cast_to_fp4x2's table, before packing
    for lo_ok, hi_ok, code in [(c >= 0.0, c <= 0.25, 0), (c > 0.25, c < 0.75, 1), (c >= 0.75, c <= 1.25, 2),
                               (c > 1.25, c < 1.75, 3), (c >= 1.75, c <= 2.5, 4), (c > 2.5, c < 3.5, 5),
                               (c >= 3.5, c <= 5.0, 6), (c > 5.0, c == c, 7), (c >= -0.25, c < -0.0, 8),
                               (c < -0.25, c > -0.75, 9), (c <= -0.75, c >= -1.25, 10), (c < -1.25, c > -1.75, 11),
                               (c <= -1.75, c >= -2.5, 12), (c < -2.5, c > -3.5, 13), (c <= -3.5, c >= -5.0, 14),
                               (c < -5.0, c == c, 15)]:
        q[lo_ok & hi_ok] = code
    return dec_g.reshape(-1).numpy()[0], dec.view(torch.uint8).numpy().reshape(m, -1), q.numpy()


def test_te_convention_matches_transformer_engines_formulas():
    data = nvfp4_data(seed=13)
    rng = np.random.default_rng(14)
    tiny = rng.standard_normal((8, 64)).astype(F32)
    tiny[:, 16:48] *= 1e-6  # block scales below 2**-6: E4M3 subnormals, and 0
    data += [tiny, np.zeros((2, 16), F32), np.array([[-0.0] * 8 + [1] * 8], F32)] + nvfp4_nan_data()
    for x in data:
        x2 = x.reshape(-1, x.shape[-1])
        pts, scales, codes = te_reference(torch.from_numpy(x2.copy()))
        r = nvfp4_quantize(x, convention="te")
        assert F32(r.tensor_scale).view(np.uint32) == F32(pts).view(np.uint32)  # NaN: torch.min's 0x7FC00000
        sign = 0x7F if np.isnan(x).any() else 0xFF  # a NaN block scale's sign is torch.min's loop's choice
        assert np.array_equal(r.scales.reshape(scales.shape) & sign, scales & sign)
        assert np.array_equal(r.codes.reshape(codes.shape), codes)


def test_te_and_torchao_differ_exactly_where_documented(ao):
    """Same patterns on ordinary data; TE keeps block scales below 2**-6 (down to 0) where torchao
    clamps to 2**-6 (pattern 0x08), and writes -0 as pattern 0 where torchao writes 0x8."""
    _, nvfp4 = ao
    x = np.random.default_rng(15).standard_normal((100, 160)).astype(F32)
    te, ta = nvfp4_quantize(x, convention="te"), nvfp4_quantize(x)
    assert np.array_equal(te.scales, ta.scales) and np.array_equal(te.codes, ta.codes)
    pts = np.abs(x).max() / F32(2688)
    x[0, :16] *= F32(0.004 * 6) * pts / np.abs(x[0, :16]).max()  # block scale 0.004 < 2**-6
    x[1, :16] = 0.0
    x[2, 16] = -0.0
    te, ta = nvfp4_quantize(x, convention="te"), nvfp4_quantize(x)
    assert np.array_equal(ta.scales, nvfp4(x)[1]) and np.array_equal(ta.codes, nvfp4(x)[2])
    assert ta.scales[0, 0] == ta.scales[1, 0] == 0x08 and te.scales[1, 0] == 0 and 0 < te.scales[0, 0] < 0x08
    assert ta.codes[2, 16] == 0x8 and te.codes[2, 16] == 0
    assert np.argwhere(te.scales != ta.scales).tolist() == [[0, 0], [1, 0]]
    diff = {tuple(p) for p in np.argwhere(te.codes != ta.codes).tolist()}
    assert (2, 16) in diff and diff - {(2, 16)} <= {(0, j) for j in range(16)} and len(diff) > 1


# ---------------------------------------------------------------- stochastic rounding
def bias_check(rounding, values, fmt, draws=4000, seed=0):
    """(all draws are one of the two neighbours, every mean within 5 standard errors of the value)."""
    rng = np.random.default_rng(seed)
    x = np.repeat(values.astype(F32)[:, None], draws, axis=1)
    q = np.asarray(rounding(x, fmt, rng), np.float64)
    v = values.astype(F32).astype(np.float64)
    lo = np.array([fmt.neighbours(t)[0] if fmt.quantize(t) > t else fmt.quantize(t) for t in v])
    hi = np.array([fmt.neighbours(t)[1] if fmt.quantize(t) < t else fmt.quantize(t) for t in v])
    neighbours = ((q == lo[:, None]) | (q == hi[:, None])).all()
    p = np.where(hi > lo, (v - lo) / np.where(hi > lo, hi - lo, 1), 0)
    se = (hi - lo) * np.sqrt(p * (1 - p) / draws) + 1e-300
    return neighbours, bool((np.abs(q.mean(axis=1) - v) <= 5 * se + 1e-12 * np.abs(v)).all())


def sr_values(fmt, seed=1):
    rng = np.random.default_rng(seed)
    v = rng.uniform(-1, 1, 60) * fmt.max
    v = np.concatenate([v, v * 1e-2, rng.uniform(-1, 1, 20) * fmt.smallest_normal, [fmt.max * 0.999, 0.0]])
    return v[np.abs(v) < fmt.max]


@pytest.mark.parametrize("fmt", [FP4_E2M1, FP6_E2M3, FP8_E4M3, FP8_E5M2, get_format("fp8_e4m3fnuz")],
                         ids=lambda f: f.name)
def test_stochastic_rounding_is_unbiased_within_the_range(fmt):
    neighbours, unbiased = bias_check(stochastic_round, sr_values(fmt), fmt)
    assert neighbours and unbiased


def test_stochastic_rounding_saturates_and_keeps_specials():
    rng = np.random.default_rng(2)
    q = stochastic_round(np.float32([7.0, -100.0, np.inf, np.nan, -0.0, 0.5, 4.0]), FP4_E2M1, rng)
    assert list(q[:3]) == [6, -6, 6] and np.isnan(q[3]) and np.signbit(q[4]) and list(q[5:]) == [0.5, 4.0]
    # beyond the range the mean is max, not x: unbiased within the range only
    assert stochastic_round(np.full(1000, 6.5), FP4_E2M1, rng).mean() == 6


def test_wrong_stochastic_roundings_are_caught():
    vals = sr_values(FP4_E2M1)
    nearest = lambda x, fmt, rng: fmt.quantize(x)  # noqa: E731
    coin = lambda x, fmt, rng: np.where(rng.random(np.shape(x)) < 0.5,  # noqa: E731
                                        stochastic_round(x, fmt, np.random.default_rng(0)), fmt.quantize(x))
    assert bias_check(nearest, vals, FP4_E2M1) == (True, False)
    assert bias_check(coin, vals, FP4_E2M1)[1] is False


def test_block_quantizers_round_stochastically_when_given_a_generator():
    x = np.tile(np.float32([6.0, 0.3, -0.7, 1.2, 2.6, 0.1, 1.0, 4.5] * 4), (3000, 1))  # amax 6: scale 1
    for r in (lambda rng: mx_quantize(x, "fp4_e2m1", rng=rng), lambda rng: nvfp4_quantize(x, False, rng=rng)):
        det, sto = r(None), r(np.random.default_rng(3))
        assert np.array_equal(det.scales, sto.scales) and np.array_equal(det.values[0], FP4_E2M1.quantize(x[0]))
        err = np.abs(sto.values.mean(axis=0) - x[0])
        assert (err < 5 * 2 * 0.5 / np.sqrt(3000)).all()  # 5 standard errors of the widest gap
        assert not np.array_equal(det.codes, sto.codes)


# ---------------------------------------------------------------- random Hadamard transform
def test_hadamard_matrix_is_the_recipes():
    h2 = np.array([[1, 1], [1, -1]])
    h16 = np.kron(np.kron(np.kron(h2, h2), h2), h2)  # Sylvester, built another way
    m = hadamard_matrix()
    assert np.array_equal(m, np.diag(TE_RHT_SIGNS) @ h16 / 4)
    assert np.array_equal(m @ m.T, np.eye(16))
    assert TE_RHT_SIGNS == (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)
    assert np.array_equal(hadamard_matrix([1, -1, 1, 1]), np.diag([1, -1, 1, 1]) @ np.kron(h2, h2) / 2)


def test_random_hadamard_transform_is_exact_sums_rounded_once():
    rng = np.random.default_rng(16)
    x = (rng.standard_normal((30, 32)) * np.exp2(rng.uniform(-20, 20, (30, 1)))).astype(F32)
    x[0, :16] = np.float32([1e30, 1e-30, -3, 7e-20] * 4)  # a span float64 cannot add exactly
    x[1, :16] = np.float32([1e-45, -2e-45] * 8)  # float32 subnormals: /4 is not float32
    m = [[Fraction(v) for v in row] for row in hadamard_matrix()]
    y = random_hadamard_transform(x)
    assert y.dtype == np.float32 and y.shape == x.shape
    for r in range(x.shape[0]):
        for c in range(2):
            chunk = [Fraction(float(v)) for v in x[r, 16 * c:16 * c + 16]]
            want = [f32_of(sum(chunk[i] * m[i][j] for i in range(16))) for j in range(16)]
            assert same(y[r, 16 * c:16 * c + 16], want).all(), (r, c)
    # the inverse undoes it up to the two float32 roundings; torch's float32 matmul agrees to an ulp
    chunks = x[2:].reshape(-1, 16)
    size = np.abs(chunks).max(axis=1, keepdims=True)  # errors are relative to a chunk's norm
    back = random_hadamard_transform(y[2:], inverse=True).reshape(-1, 16)
    assert (np.abs(back - chunks) <= 2.0**-21 * size).all()
    mm = (torch.from_numpy(chunks) @ torch.from_numpy(hadamard_matrix()).float()).numpy()
    assert (np.abs(mm - y[2:].reshape(-1, 16)) <= 2.0**-22 * size).all()


def test_wrong_transforms_are_caught():
    x = np.random.default_rng(17).standard_normal((4, 16)).astype(F32)
    y = random_hadamard_transform(x)
    assert not np.array_equal(random_hadamard_transform(x, signs=[1] * 16), y)  # no random signs
    assert not np.array_equal((x @ (np.diag(TE_RHT_SIGNS) @ np.kron(np.kron(np.kron(
        [[1, 1], [1, -1]], [[1, 1], [1, -1]]), [[1, 1], [1, -1]]), [[1, 1], [1, -1]]) / 16)).astype(F32), y)


# ---------------------------------------------------------------- any input: an answer or one clear error
junk = st.one_of(st.none(), st.text(max_size=4), st.integers(-3, 70), st.floats(), st.booleans(),
                 st.lists(st.integers(-2, 2), max_size=3), st.just(object()))
shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=33)
arrays = st.one_of(hnp.arrays(st.sampled_from([np.float32, np.float64]), shapes, elements=st.floats(width=32)),
                   hnp.arrays(st.sampled_from([np.int16, np.bool_]), shapes))


@settings(max_examples=120, deadline=None)
@given(x=st.one_of(arrays, junk), fmt=st.one_of(st.sampled_from(NAMES + ["e8m0", "fp16"]), junk),
       block=st.one_of(st.sampled_from([1, 2, 16, 32]), junk),
       rounding=st.one_of(st.sampled_from(MODES + ["RCEIL"]), junk), seed=st.one_of(st.none(), st.integers(0, 9)))
def test_mx_quantize_answers_or_refuses(x, fmt, block, rounding, seed):
    rng = None if seed is None else np.random.default_rng(seed)
    try:
        r = mx_quantize(x, fmt, block, rounding, rng=rng)
    except (TypeError, ValueError) as exc:
        assert "\n" not in str(exc) and str(exc).strip()
        return
    assert r.codes.shape == r.values.shape == np.shape(x) and r.scales.shape[:-1] == np.shape(x)[:-1]
    assert not any(a.flags.writeable for a in r)


@settings(max_examples=120, deadline=None)
@given(x=st.one_of(arrays, junk), pts=st.one_of(st.booleans(), st.floats(), junk),
       convention=st.one_of(st.sampled_from(["torchao", "te", "TE"]), junk),
       seed=st.one_of(st.none(), st.integers(0, 9)))
def test_nvfp4_quantize_answers_or_refuses(x, pts, convention, seed):
    rng = None if seed is None else np.random.default_rng(seed)
    try:
        r = nvfp4_quantize(x, pts, convention=convention, rng=rng)
    except (TypeError, ValueError) as exc:
        assert "\n" not in str(exc) and str(exc).strip()
        return
    assert r.codes.shape == r.values.shape == np.shape(x) and np.all(r.codes < 16)
    assert r.tensor_scale is None or r.tensor_scale.dtype == np.float32


@settings(max_examples=120, deadline=None)
@given(x=st.one_of(arrays, junk), fmt=st.one_of(st.sampled_from(NAMES + ["e8m0", "fp16", "bf16"]), junk),
       signs=st.one_of(st.just(TE_RHT_SIGNS), st.lists(st.sampled_from([1, -1]), min_size=1, max_size=16), junk),
       inverse=st.one_of(st.booleans(), junk), seed=st.one_of(st.none(), st.integers(0, 9)))
def test_rounding_and_transforms_answer_or_refuse(x, fmt, signs, inverse, seed):
    rng = None if seed is None else np.random.default_rng(seed)
    for call in (lambda: stochastic_round(x, fmt, rng), lambda: hadamard_matrix(signs),
                 lambda: random_hadamard_transform(x, signs, inverse=inverse)):
        try:
            out = call()
        except (TypeError, ValueError) as exc:
            assert "\n" not in str(exc) and str(exc).strip()
            continue
        assert isinstance(out, (np.ndarray, float))


def test_importing_blocks_needs_numpy_only():
    import subprocess
    import sys

    code = ("import sys, numpy as np; import ampviz, ampviz.formats.blocks as b; "
            "b.mx_quantize(np.ones(32), 'fp4_e2m1'); b.nvfp4_quantize(np.ones(16)); "
            "assert not {'torch', 'plotly', 'ipywidgets', 'torchao'} & set(sys.modules), 'heavy import'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
