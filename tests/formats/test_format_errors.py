"""ampviz.formats.errors' comparison of formats at equal bits (``scheme_bits``, ``format_error``,
``format_error_table``) against torchao 0.18's own quantizers: MX ``to_mx`` / ``MXTensor``, NVFP4
``nvfp4_quantize`` / ``NVFP4Tensor`` and float8 ``hp_tensor_to_float8_dynamic``, torch's casts for
bf16 and fp16, and the bits each stores counted from the tensors it returns. Each number is
recomputed here from those references; plausible wrong variants (bits that forget the scales, an
error taken before dequantizing, saturation counted by the clamp alone) are shown to differ.

The torchao tests skip without torchao, except under CI=true, where they fail."""


import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ampviz.formats.errors import (DEFAULT_ERROR_SCHEMES, ERROR_SCHEMES, FormatError, check_mx_floor_value,
                                   check_nvfp4_bits, check_outlier_survivors, check_single_level_value,
                                   format_error, format_error_table, relative_error, scheme_bits)
from ampviz.text import Table

F32 = np.float32
MX = {"mxfp8_e4m3": (torch.float8_e4m3fn, 8, 448.0 + 16), "mxfp8_e5m2": (torch.float8_e5m2, 8, 57344.0 + 4096),
      "mxfp6_e3m2": ("fp6_e3m2", 6, 28.0 + 2), "mxfp6_e2m3": ("fp6_e2m3", 6, 7.5 + 0.25),
      "mxfp4": (torch.float4_e2m1fn_x2, 4, 6.0 + 1)}
FP8 = {"fp8_e4m3": (torch.float8_e4m3fn, 448.0 + 16), "fp8_e5m2": (torch.float8_e5m2, 57344.0 + 4096)}
CASTS = {"bf16": (torch.bfloat16, 2.0**128 * (1 - 2.0**-9)), "fp16": (torch.float16, 65520.0)}


@pytest.fixture(scope="module")
def ao(torchao_modules):
    """torchao's MX, NVFP4 and float8 quantizers; skipped without torchao, a failure under CI=true."""
    f8config, float8_scaling_utils, float8_training_tensor, config, kernels, mx_tensor, nvfp4_tensor = torchao_modules(
        "torchao.float8.config", "torchao.float8.float8_scaling_utils", "torchao.float8.float8_training_tensor",
        "torchao.prototype.mx_formats.config", "torchao.prototype.mx_formats.kernels",
        "torchao.prototype.mx_formats.mx_tensor", "torchao.prototype.mx_formats.nvfp4_tensor")

    def reference(x: np.ndarray, scheme: str, rounding: str = "rceil"):
        """(dequantized values, bits stored per element, the magnitude past which each element is
        saturated), all from torchao's tensors."""
        t = torch.from_numpy(np.ascontiguousarray(x, F32))
        n = x.size
        if scheme in CASTS:
            dtype, past = CASTS[scheme]
            q = t.to(dtype)
            return q.float().numpy(), q.element_size() * 8, np.full(x.shape, past)
        if scheme in FP8:
            dtype, past = FP8[scheme]
            f8 = float8_scaling_utils.hp_tensor_to_float8_dynamic(
                t, dtype, float8_training_tensor.LinearMMConfig(),
                scaling_granularity=f8config.ScalingGranularity.TENSORWISE)
            values = f8._data.to(torch.float32) / f8._scale
            bits = (f8._data.numel() * f8._data.element_size() * 8 + f8._scale.numel() * 32) / n
            return values.numpy(), bits, np.full(x.shape, past / np.float64(f8._scale.item()))
        if scheme == "nvfp4":
            pts = nvfp4_tensor.per_tensor_amax_to_scale(t.abs().max())
            scales, data = nvfp4_tensor.nvfp4_quantize(t, 16, pts)
            values = nvfp4_tensor.NVFP4Tensor.to_nvfp4(t, per_tensor_scale=pts).dequantize(torch.float32)
            bits = (data.numel() * 8 + scales.numel() * 8 + pts.numel() * 32) / n  # two fp4 per byte
            block = (pts * scales.to(torch.float32)).numpy().astype(np.float64)
            past = np.repeat(7.0 * block.reshape(*x.shape[:-1], -1), 16, axis=-1)
            return values.numpy(), bits, past
        dtype, element_bits, past = MX[scheme]
        mode = config.ScaleCalculationMode(rounding)
        scale, data = mx_tensor.to_mx(t, dtype, 32, mode)
        values = mx_tensor.MXTensor.to_mx(t, dtype, 32, scaling_mode=mode).dequantize(torch.float32)
        if scheme == "mxfp4":
            assert data.numel() * 2 == n  # packed: 4 bits each
        bits = (n * element_bits + scale.numel() * 8) / n
        k = scale.view(torch.uint8).numpy().astype(np.int64) - 127
        return values.numpy(), bits, np.repeat(np.ldexp(past, k).reshape(*x.shape[:-1], -1), 32, axis=-1)

    return reference


def expected(reference, x: np.ndarray, scheme: str, rounding: str = "rceil") -> tuple:
    """(bits, relative error, flushed share, saturated share), each from ``reference``'s tensors."""
    values, bits, past = reference(x, scheme, rounding)
    x64, q64 = x.astype(np.float64), values.astype(np.float64)
    error = np.linalg.norm((q64 - x64).ravel()) / np.linalg.norm(x64.ravel())
    flushed = np.mean(values[x != 0] == 0)
    saturated = np.mean(np.abs(x64) > past)
    return bits, error, flushed, saturated


def tensors(seed: int) -> dict:
    """Weight- and gradient-like tensors: normal rows of various sizes, outliers, a tiny and a huge one."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((24, 64)) * 0.05).astype(F32)
    g = (rng.standard_normal((16, 96)) * np.exp(rng.normal(0, 2, (16, 1))) * 1e-4).astype(F32)
    g[3, 7] = 0.5  # an outlier row entry
    heavy = (rng.standard_t(2, (8, 128)) * rng.uniform(0.5, 3.5, (8, 1))).astype(F32)
    heavy[:, ::9] = 0.0  # exact zeros
    tiny = (rng.standard_normal((4, 32)) * 1e-7).astype(F32)
    huge = (rng.standard_normal((4, 32)) * 1e5).astype(F32)
    return {"w": w, "g": g, "heavy": heavy, "tiny": tiny, "huge": huge}


# ---------------------------------------------------------------- against torchao
@pytest.mark.parametrize("scheme", list(ERROR_SCHEMES))
def test_every_number_matches_torchaos_tensors(ao, scheme):
    for seed in range(3):
        for name, x in tensors(seed).items():
            r = format_error(x, scheme)
            values, _, _ = ao(x, scheme)
            assert np.array_equal(r.values.view(np.uint32), values.view(np.uint32)), (scheme, name)
            bits, error, flushed, saturated = expected(ao, x, scheme)
            assert r.bits == bits and r.flushed == flushed and r.saturated == saturated, (scheme, name)
            assert r.error == pytest.approx(error, rel=1e-12), (scheme, name)


@pytest.mark.parametrize("rounding", ["floor", "ceil", "even", "rceil"])
def test_mx_scale_roundings_match_torchao(ao, rounding):
    for name, x in tensors(7).items():
        for scheme in MX:
            r = format_error(x, scheme, rounding=rounding)
            bits, error, flushed, saturated = expected(ao, x, scheme, rounding)
            assert (r.bits, r.flushed, r.saturated) == (bits, flushed, saturated), (scheme, name)
            assert r.error == pytest.approx(error, rel=1e-12)


def test_mx_scales_default_to_rceil_as_torchaos_configs_do(torchao_modules):
    """torchao 0.18's MXFP8 training config and MX inference config choose rceil unless told
    otherwise, and so does the comparison here; its lower-level ``to_mx`` and ``MXTensor.to_mx``
    default to the OCP floor rule, as ``mx_quantize`` does. Lesson 13 says which path computes
    rceil how: ``_to_mx_rceil`` converts with the PTX instruction only under torch.compile, on a CUDA
    GPU of SM100 or later, with torch 2.12 or later, and otherwise takes a float32 log2."""
    import inspect

    from ampviz.formats.blocks import mx_quantize
    from ampviz.formats.errors import DEFAULT_MX_ROUNDING

    config, inference, training, mx_tensor = torchao_modules(
        "torchao.prototype.mx_formats.config", "torchao.prototype.mx_formats.inference_workflow",
        "torchao.prototype.moe_training.config", "torchao.prototype.mx_formats.mx_tensor")
    mode = config.ScaleCalculationMode
    assert training.MXFP8TrainingOpConfig().scale_calculation_mode is mode.RCEIL
    assert inference.MXDynamicActivationMXWeightConfig().scaling_mode is mode.RCEIL
    assert mode(DEFAULT_MX_ROUNDING) is mode.RCEIL
    for f in (mx_tensor.to_mx, mx_tensor.MXTensor.to_mx):
        assert inspect.signature(f).parameters["scaling_mode"].default is mode.FLOOR
    assert inspect.signature(mx_quantize).parameters["rounding"].default == "floor"
    assert inspect.signature(format_error).parameters["rounding"].default == "rceil"
    assert inspect.signature(format_error_table).parameters["rounding"].default == "rceil"
    source = "".join(inspect.getsource(mx_tensor._to_mx_rceil).split())
    for needed in ("torch.compiler.is_compiling()", "is_sm_at_least_100()", 'torch_version_at_least("2.12.0.dev0")',
                   "descale.is_cuda", "cvt.rp.satfinite.ue8m0x2.f32", "torch.ceil(torch.log2(descale))"):
        assert needed in source, needed


def test_the_table_prints_the_references_numbers(ao):
    x = tensors(1)
    table = format_error_table({"w": x["w"], "g": x["g"]}, list(ERROR_SCHEMES), rounding="rceil")
    assert table.columns == ("tensor", "scheme", "bits/element", "relative error", "flushed to 0", "saturated")
    assert len(table.rows) == 2 * len(ERROR_SCHEMES)
    rows = iter(table.rows)
    for name in ("w", "g"):
        for scheme in ERROR_SCHEMES:
            bits, error, flushed, saturated = expected(ao, x[name], scheme, "rceil")
            assert next(rows) == (name, ERROR_SCHEMES[scheme], f"{bits:.3f}".rstrip("0").rstrip("."),
                                  f"{100 * error:.3g}%", f"{100 * flushed:.2f}%", f"{100 * saturated:.2f}%")
    assert "MX scales: rceil" in table.title


def test_wrong_variants_differ_from_the_references(ao):
    """Bits without the scales, the error of the element values before dequantizing, an error
    normalised by the largest value instead of the RMS, and saturation counted as 'at the
    block's largest value': each disagrees with the reference somewhere."""
    from ampviz.formats.blocks import mx_quantize, nvfp4_quantize
    from ampviz.formats import FP4_E2M1, FP8_E4M3

    x = tensors(2)["heavy"]
    for scheme, element_bits in (("mxfp8_e4m3", 8), ("mxfp4", 4), ("nvfp4", 4), ("fp8_e4m3", 8)):
        bits, _, _, _ = expected(ao, x, scheme)
        assert element_bits != bits and scheme_bits(scheme, x.size) == bits
    _, error, _, saturated = expected(ao, x, "mxfp4")
    q = mx_quantize(x, "fp4_e2m1")
    before_dequantize = np.asarray(FP4_E2M1.decode(q.codes.astype(np.int64)), np.float64)
    assert abs(relative_error(x, before_dequantize) - error) > 0.1
    by_max = np.sqrt(np.mean((q.values.astype(np.float64) - x) ** 2)) / np.abs(x).max()
    assert abs(by_max - error) > 1e-3
    at_top = np.mean(np.abs(q.values) == np.repeat(6.0 * np.ldexp(1.0, q.scales.astype(int) - 127), 32, axis=-1))
    assert at_top != saturated
    n = nvfp4_quantize(x)
    _, error, _, _ = expected(ao, x, "nvfp4")
    unscaled = np.asarray(FP4_E2M1.decode(n.codes.astype(np.int64)), np.float64)
    assert abs(relative_error(x, unscaled) - error) > 0.1
    # and the block scale alone, without the tensor scale: a different dequantized tensor
    block_only = unscaled * np.repeat(np.asarray(FP8_E4M3.decode(n.scales.astype(np.int64))), 16, axis=-1)
    assert abs(relative_error(x, block_only) - error) > 0.1


# ---------------------------------------------------------------- without torchao
def test_bits_per_element_include_the_scales():
    assert [scheme_bits(s, 4096) for s in ERROR_SCHEMES] == [16, 16, 8 + 1 / 128, 8 + 1 / 128, 8.25, 8.25, 6.25,
                                                            6.25, 4.25, 4.5078125]
    assert scheme_bits("nvfp4", 16) == 6.5 and scheme_bits("fp8_e5m2", 1) == 40


def test_floor_saturates_and_rceil_does_not():
    """A block whose amax is 500 in MXFP8 E4M3: floor's scale 1 clamps it to 448 (saturated), rceil's
    scale 2 keeps it (512); an amax of 450 is clamped too, but rounding would have given 448 anyway:
    not counted as saturated."""
    row = np.zeros(32, F32)
    row[0] = 500.0
    floor, rceil = format_error(row, "mxfp8_e4m3", rounding="floor"), format_error(row, "mxfp8_e4m3")
    assert floor.values[0] == 448 and floor.saturated == 1 / 32 and floor.flushed == 0
    assert rceil.values[0] == 512 and rceil.saturated == 0
    assert floor.error == pytest.approx(52 / 500) and rceil.error == pytest.approx(12 / 500)
    row[0] = 450.0
    assert format_error(row, "mxfp8_e4m3").saturated == 0
    assert format_error(row * 1e5, "fp16").saturated == 1 / 32 and np.isinf(format_error(row * 1e5, "fp16").error)


def test_an_outlier_flushes_its_own_block_only():
    x = np.random.default_rng(0).standard_normal(128).astype(F32)
    x[37] = 2.0**10
    r = format_error(x, "mxfp4")
    zeros = (r.values == 0).reshape(4, 32).sum(axis=1)
    assert zeros[1] == 31 and zeros[[0, 2, 3]].max() < 8
    assert r.flushed == np.count_nonzero((r.values == 0) & (x != 0)) / 128


def test_relative_error_is_rms_over_rms():
    assert relative_error([3.0, 4.0], [3.0, 4.0]) == 0
    assert relative_error([3.0, 4.0], [0.0, 0.0]) == 1
    assert relative_error([1.0, -1.0], [1.5, -0.5]) == 0.5
    with pytest.raises(ValueError, match="one shape"):
        relative_error([1.0, 2.0], [1.0])


def test_the_table_reads_like_the_lesson():
    x = tensors(0)
    t = format_error_table({"weight": x["w"]}, "mxfp4")
    assert isinstance(t, Table) and t.rows[0][:3] == ("weight", "MXFP4 E2M1", "4.25")
    t = format_error_table({"weight": x["w"]}, ["bf16", "fp16"])
    assert t.title == "relative error = RMS(dequantized - x) / RMS(x)"
    assert t.column("bits/element") == ("16", "16")
    default = format_error_table({"g": x["g"]})
    assert [row[1] for row in default.rows] == [ERROR_SCHEMES[s] for s in DEFAULT_ERROR_SCHEMES]
    assert isinstance(format_error(x["w"], "nvfp4"), FormatError)
    with pytest.raises(ValueError):
        format_error(x["w"], "nvfp4").values[0] = 1  # read-only


def test_torch_tensors_are_read_as_their_values():
    x = tensors(0)["w"]
    a = format_error_table({"w": x})
    assert format_error_table({"w": torch.from_numpy(x)}) == a
    assert format_error_table({"w": torch.from_numpy(x).requires_grad_()}) == a


# ---------------------------------------------------------------- bad input
BAD = [
    (dict(tensors=[1.0] * 32), TypeError, "tensors must be a non-empty dict"),
    (dict(tensors={}), TypeError, "tensors must be a non-empty dict"),
    (dict(tensors={1: np.ones(32)}), TypeError, "keys must be names"),
    (dict(tensors={"w": np.ones(31)}), ValueError, "multiple of 32"),
    (dict(tensors={"w": np.ones(16)}, schemes="nvfp4"), None, None),
    (dict(tensors={"w": np.ones(31)}, schemes=["bf16"]), None, None),
    (dict(tensors={"w": np.zeros(32)}), ValueError, "all zeros"),
    (dict(tensors={"w": np.r_[np.ones(31), np.inf]}), ValueError, "finite"),
    (dict(tensors={"w": np.r_[np.ones(31), 1e39]}), ValueError, "finite"),
    (dict(tensors={"w": 3.0}), ValueError, "non-empty array"),
    (dict(tensors={"w": "abc"}), TypeError, "not text"),
    (dict(tensors={"w": None}), TypeError, "got None"),
    (dict(tensors={"w": np.ones(32)}, schemes="mxfp5"), ValueError, "scheme must be one of"),
    (dict(tensors={"w": np.ones(32)}, schemes=[]), TypeError, "schemes must be"),
    (dict(tensors={"w": np.ones(32)}, schemes=3), TypeError, "schemes must be"),
    (dict(tensors={"w": np.ones(32)}, rounding="up"), ValueError, "rounding must be one of"),
]


@pytest.mark.parametrize("kwargs, exc, words", BAD, ids=range(len(BAD)))
def test_bad_arguments_say_what_to_pass(kwargs, exc, words):
    if exc is None:
        assert isinstance(format_error_table(**kwargs), Table)
        return
    with pytest.raises(exc) as info:
        format_error_table(**kwargs)
    message = str(info.value)
    assert words in message and "\n" not in message


def test_scheme_bits_and_format_error_refuse_bad_arguments():
    for n in (0, -1, 2.5, True, "4096", None):
        with pytest.raises(ValueError, match="positive int"):
            scheme_bits("nvfp4", n)
    with pytest.raises(ValueError, match="scheme must be one of"):
        format_error(np.ones(32), "MXFP4")
    with pytest.raises(ValueError, match="multiple of 16"):
        format_error(np.ones(24), "nvfp4")


_any = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=True), st.text(max_size=6),
                 st.lists(st.floats(-1e6, 1e6), max_size=40), st.sampled_from(list(ERROR_SCHEMES) + ["floor", "rceil"]))


@settings(max_examples=200, deadline=None)
@given(tensors=st.one_of(_any, st.dictionaries(st.one_of(st.text(max_size=3), st.integers()), _any, max_size=2),
                         st.builds(lambda n, s: {"x": np.random.default_rng(s).standard_normal(n)},
                                   st.sampled_from([16, 32, 48, 64]), st.integers(0, 9))),
       schemes=st.one_of(_any, st.lists(_any, max_size=3), st.just(DEFAULT_ERROR_SCHEMES)),
       rounding=st.one_of(_any, st.sampled_from(["floor", "ceil", "even", "rceil"])))
def test_any_arguments_give_a_table_or_one_clear_error(tensors, schemes, rounding):
    try:
        t = format_error_table(tensors, schemes, rounding=rounding)
    except (TypeError, ValueError) as exc:
        message = str(exc)
        assert message and "\n" not in message and len(message) < 300
    else:
        assert isinstance(t, Table) and t.rows


# ---------------------------------------------------------------- the lesson's checkers
def test_the_checkers_hold_the_blocks_arithmetic():
    assert check_mx_floor_value(448) and not check_mx_floor_value(512) and not check_mx_floor_value(500)
    assert check_outlier_survivors(0) and not check_outlier_survivors(31)
    assert check_nvfp4_bits(4.5078125) and check_nvfp4_bits("4.508") and not check_nvfp4_bits(4.5)
    assert not check_nvfp4_bits(4.25) and not check_nvfp4_bits(4)
    assert check_single_level_value(0) and not check_single_level_value(1e-3)
    assert check_single_level_value(None).status == "unanswered"


# ---------------------------------------------------------------- the course model's layer
def test_trained_parameter_is_the_live_loops_last_step():
    """The weight after the steps and the gradient of the last one, as ``train_steps`` records them."""
    from ampviz.training.live import TrainConfig, train_steps
    from ampviz.training.live import trained_parameter

    name = "encoder.layers.0.self_attn.in_proj_weight"
    got = trained_parameter("transformer", name, steps=5, seed=3)
    again = trained_parameter("transformer", name, steps=5, seed=3)
    assert got["weight"].shape == got["gradient"].shape == (96, 32)
    assert all(np.array_equal(got[k], again[k]) for k in got)  # seeded
    records = list(train_steps(TrainConfig(model="transformer", steps=5, seed=3, census_every=4, keep_grads=True)))
    assert np.array_equal(records[4].grads[name], got["gradient"].ravel())
    assert not np.array_equal(trained_parameter("transformer", name, steps=4, seed=3)["weight"], got["weight"])
    with pytest.raises(ValueError, match="name must be one of the model's parameters"):
        trained_parameter("transformer", "fc1.weight")
    with pytest.raises(ValueError, match="model must be one of"):
        trained_parameter("resnet")


def test_trained_parameter_default_is_the_mlp_layer_and_prints_alike_on_any_thread_count():
    """The default layer (lesson 13's) is the MLP's fc4 after 100 steps. On 1 and 2 threads its
    values agree to a few units in float32's last place (bit for bit on some CPUs, not on all: an
    AVX-512 machine sums a few hundred of them otherwise), and lesson 13's tables print the same."""
    from ampviz.formats.errors import ERROR_SCHEMES, format_error_table
    from ampviz.training.live import TrainConfig, train_steps
    from ampviz.training.live import trained_parameter

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = trained_parameter(steps=100)
        torch.set_num_threads(2)
        two = trained_parameter("mlp", "fc4.weight", steps=100, seed=0)
    finally:
        torch.set_num_threads(before)
    assert one["weight"].shape == one["gradient"].shape == (64, 64)
    assert all(np.abs(one[k] - two[k]).max() <= 1e-6 * np.abs(one[k]).max() for k in one)
    for rounding in ("floor", "rceil"):
        assert str(format_error_table(one, list(ERROR_SCHEMES), rounding=rounding)) == \
            str(format_error_table(two, list(ERROR_SCHEMES), rounding=rounding))
    records = list(train_steps(TrainConfig(model="mlp", steps=3, census_every=2, keep_grads=True)))
    assert np.array_equal(records[2].grads["fc4.weight"], trained_parameter(steps=3)["gradient"].ravel())


def test_relative_error_reads_numbers_past_float32_as_inf_without_a_warning():
    """3.4028235677973366e38 is past float32's largest value: read as inf, as a cast gives it, with no
    overflow warning escaping (the suite turns warnings into errors); the error is then NaN or inf."""
    from ampviz.formats.errors import relative_error

    past = 3.4028235677973366e38
    assert float(np.finfo(np.float32).max) < past
    assert math.isnan(relative_error(past, past))  # inf - inf
    assert math.isnan(relative_error([past, 1.0], [1.0, 1.0]))  # inf / inf
    assert relative_error([1.0, 1.0], [past, 1.0]) == math.inf  # inf / 2
    assert relative_error([3.0, 4.0], [3.0, 4.0]) == 0.0 and relative_error([3.0, 4.0], [0.0, 0.0]) == 1.0
