"""``ampviz.formats.lesson``: the format lessons' tables and arithmetic in a format, checked bit for bit
against torch (the reference the lessons cite)."""

import math

import numpy as np
import pytest
import torch

from ampviz import FORMATS, FP16
from ampviz import checks
from ampviz import text as TX
from ampviz.formats import lesson as FL
from ampviz.scaling import lesson as SL
from ampviz.training import lesson as TL

MODULES = (TX, checks, FL, SL, TL)

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


# ----- formats and casts -----
def test_format_table_shows_each_formats_constants():
    t = FL.format_table()
    rows = {r[0]: dict(zip(t.columns, r)) for r in t.rows}
    assert rows["fp16"]["max"] == "65504"
    assert rows["fp16"]["smallest normal"] == "2^-14"
    assert rows["fp16"]["smallest subnormal"] == "2^-24"
    assert rows["fp16"]["eps"] == "2^-10"
    assert rows["bf16"]["smallest subnormal"] == "2^-133"
    assert rows["fp8_e4m3"]["max"] == "448" and rows["fp8_e4m3"]["overflow"] == "none: no inf (the cast decides)"
    assert rows["fp8_e5m2"]["max"] == "57344" and rows["fp8_e5m2"]["overflow"] == "inf"
    assert rows["fp8_e5m2"]["eps"] == "2^-2" and rows["fp8_e4m3"]["smallest normal"] == "2^-6"
    for name, row in rows.items():
        f = FORMATS[name]
        assert (row["exp bits"], row["mantissa bits"], row["bias"]) == (
            str(f.exponent_bits), str(f.mantissa_bits), str(f.bias))


def test_cast_table_matches_quantize_and_classify():
    vals = [2**-14, 1e-7, 1.5 * 2**-25, 2**-25, 65519, 65520]
    t = FL.cast_table(vals, "fp16")
    assert t.column("stored in fp16") == ("2^-14", "2^-23", "2^-24", "0", "65504", "inf")
    assert t.column("category") == ("normal", "subnormal", "subnormal", "underflow", "normal", "overflow")
    assert FL.cast_table([500], "fp8_e4m3").rows == (("500", "448", "overflow"),)
    assert FL.cast_table([1], "fp16", labels=["one"]).rows[0][0] == "one"
    with pytest.raises(ValueError, match="labels"):
        FL.cast_table([1, 2], "fp16", labels=["one"])


def test_bits_table():
    t = FL.bits_table([1.0, 2**-24, 65520.0, 0.0], "fp16")
    assert t.column("sign exponent mantissa") == (
        "0 01111 0000000000", "0 00000 0000000001", "0 11111 0000000000", "0 00000 0000000000")
    assert t.column("means") == ("1.0000000000 × 2^0", "0.0000000001 × 2^-14", "inf",
                                 "0.0000000000 × 2^-14 (zero)")
    assert FL.bits_table([448.0], "fp8_e4m3").rows[0][1] == "0 1111 110"


def test_bits_table_of_the_new_formats():
    """E8M0 has no sign bit and no mantissa (a power of two per code, 0xFF NaN); fnuz's NaN is the
    pattern -0 would have; fp4 saturates; an "fn" NaN reads as nan, not as a number."""
    e8 = FL.bits_table([1.0, 0.25, 0.0, -2.0, float("nan")], "e8m0")
    assert e8.column("sign exponent mantissa") == ("01111111", "01111101", "00000000", "10000000", "11111111")
    assert e8.column("means") == ("2^0", "2^-2", "2^-127", "2^1", "nan")
    assert all(len(p) == 8 and " " not in p for p in e8.column("sign exponent mantissa"))
    fnuz = FL.bits_table([1.0, -0.0, 1e9, float("nan")], "fp8_e4m3fnuz")
    assert fnuz.column("sign exponent mantissa") == ("0 1000 000", "0 0000 000", "1 0000 000", "1 0000 000")
    assert fnuz.column("means")[2:] == ("nan", "nan") and fnuz.column("exponent field")[0] == "8"
    fp4 = FL.bits_table([6.0, 100.0, -0.5], "fp4_e2m1")
    assert fp4.column("sign exponent mantissa") == ("0 11 1", "0 11 1", "1 00 1")
    assert fp4.column("means") == ("1.1 × 2^2", "1.1 × 2^2", "0.1 × 2^0")
    assert FL.bits_table([float("nan")], "fp8_e4m3").column("means") == ("nan",)


# ----- arithmetic in a format, against torch -----
def _random_values(fmt, n, rng):
    """n random finite values of fmt (decoded from random bit patterns)."""
    f = FORMATS[fmt]
    v = f.decode(rng.integers(0, 1 << f.bits, size=4 * n)) if f.bits <= 16 else \
        rng.standard_normal(4 * n).astype(np.float32) * 2.0 ** rng.integers(-40, 40, size=4 * n)
    v = v[np.isfinite(v)]
    return v[:n]


@pytest.mark.parametrize("fmt", ["fp16", "bf16", "fp32"])
def test_add_is_torchs_addition(fmt):
    rng = np.random.default_rng(1)
    a = _random_values(fmt, 20000, rng)
    b = _random_values(fmt, 20000, rng)
    # make close magnitudes common too, where rounding matters most
    b[::2] = a[::2] * 2.0 ** rng.integers(-14, 2, size=b[::2].size)
    b = np.asarray(FORMATS[fmt].quantize(b))
    dt = TORCH_DTYPES[fmt]
    ours = np.asarray(FL.add(a, b, fmt))
    theirs = (torch.tensor(a, dtype=torch.float32).to(dt) + torch.tensor(b, dtype=torch.float32).to(dt)
              ).double().numpy()
    np.testing.assert_array_equal(ours, theirs)


def test_add_scalar_and_the_1_plus_2_pow_minus_11_claim():
    assert FL.add(1.0, 2**-11, "fp16") == 1.0
    assert FL.add(1.0, 2**-10, "fp16") == 1.0 + 2**-10
    assert FL.add(1.0, 2**-11, "fp32") == 1.0 + 2**-11
    assert isinstance(FL.add(1.0, 2.0, "fp16"), float)


@pytest.mark.parametrize("fmt, expected", [("fp16", 2**-11), ("bf16", 2**-8), ("fp32", 2**-24),
                                           ("fp8_e4m3", 2**-4), ("fp8_e5m2", 2**-3)])
def test_largest_lost_update_at_one(fmt, expected):
    assert FL.largest_lost_update(1.0, fmt) == expected


def test_largest_lost_update_is_the_largest_for_many_weights():
    rng = np.random.default_rng(2)
    weights = np.concatenate([_random_values("fp16", 300, rng), [-1.0, -2.0, -0.5, 1.0, 2.0**-14, 65504.0]])
    for w in weights:
        if w == 0:
            continue
        u = FL.largest_lost_update(w, "fp16")
        assert FL.add(w, u, "fp16") == w
        bigger = FP16.neighbours(u)[1]
        assert FL.add(w, bigger, "fp16") != w
    with pytest.raises(ValueError):
        FL.largest_lost_update(0.0, "fp16")
    with pytest.raises(ValueError):
        FL.largest_lost_update(math.inf, "fp16")


def test_largest_lost_update_on_negative_powers_of_two():
    """On -1 a positive update moves towards 0, where the gap is half as wide: 2^-12, not 2^-11
    (-1 + 2^-11 = -0.99951 is an fp16 value)."""
    assert FL.largest_lost_update(-1.0, "fp16") == 2**-12
    assert FL.add(-1.0, 2**-12, "fp16") == -1.0 and FL.add(-1.0, 2**-11, "fp16") == -1 + 2**-11
    assert FL.largest_lost_update(2**-14, "fp16") == 0.0  # 2^-25 is no fp16 value; 2^-24 moves it
    assert FL.largest_lost_update(448, "fp8_e4m3") == 448  # a saturating format keeps its max


def test_update_table_ratios():
    t = FL.update_table(1.0, ("fp32", "bf16", "fp16"))
    assert t.column("w / u") == ("16,777,216", "256", "2,048")
    assert t.column("w / |u| (u < 0)") == ("33,554,432", "512", "4,096")  # below 1 the gap is half as wide
    assert t.column("most negative u lost") == ("-2^-25", "-2^-9", "-2^-12")
    assert t.column("eps") == ("2^-23", "2^-7", "2^-10")
    t = FL.update_table(1.5, ("fp16",))
    assert t.rows == (("fp16", "2^-10", "2^-11", "-2^-11", "3,072", "3,072"),)
    assert FL.update_table(2**-14, ("fp16",)).rows[0][-2:] == ("inf", "inf")  # no fp16 update is lost


@pytest.mark.parametrize("fmt", ["fp16", "bf16", "fp32"])
def test_accumulate_matches_torch(fmt):
    ours = FL.accumulate(1.0, 1e-4, 300, fmt)
    w = torch.tensor(1.0, dtype=TORCH_DTYPES[fmt])
    u = torch.tensor(1e-4, dtype=torch.float32).to(TORCH_DTYPES[fmt])
    theirs = [float(w)]
    for _ in range(300):
        w = w + u
        theirs.append(float(w))
    np.testing.assert_array_equal(ours, theirs)
    assert ours.shape == (301,)


def test_accumulate_stalls_in_fp16_and_moves_in_fp32():
    assert (FL.accumulate(1.0, 1e-4, 1000, "fp16") == 1.0).all()
    end = FL.accumulate(1.0, 1e-4, 1000, "fp32")[-1]
    assert abs(end - 1.1) < 1e-4
    assert (FL.accumulate(0.0, 1e-4, 10, "fp16")[1:] > 0).all()  # from 0 the same update counts
    with pytest.raises(ValueError):
        FL.accumulate(1.0, 1e-4, -1, "fp16")


def test_stall_table():
    t = FL.stall_table(1.0, 1e-4, 1000)
    rows = {r[0]: r for r in t.rows}
    assert rows["fp16 weight"][1:] == ("1", "0")
    assert rows["bf16 weight"][1:] == ("1", "0")
    assert rows["fp32 weight"][1] == TX.number(FL.accumulate(1.0, 1e-4, 1000, "fp32")[-1])
    assert rows["fp32 master, fp16 copy"][1] == TX.number(FP16.quantize(FL.accumulate(1.0, 1e-4, 1000, "fp32")[-1]))
    assert rows["exact"][1:] == ("1.1", "0.1")


def test_the_fnuz_checker_holds_torchs_float8_e4m3fnuz():
    import torch

    codes = torch.arange(256, dtype=torch.int64).to(torch.uint8)
    values = codes.view(torch.float8_e4m3fnuz).float()
    finite = values[torch.isfinite(values)]
    assert float(finite[finite > 0].min()) == FL.E4M3FNUZ_SMALLEST == 2.0**-10
    assert float(finite.max()) == FL.E4M3FNUZ_MAX == torch.finfo(torch.float8_e4m3fnuz).max
    assert FL.check_fnuz_smallest("2^-10") and FL.check_fnuz_smallest(0.000977)
    assert FL.check_fnuz_smallest(2**-9).status == "wrong"  # E4M3's own (bias 7)
    assert FL.check_fnuz_smallest(None).status == "unanswered"


def test_cast_rules_table_compares_the_three_casts():
    t = FL.cast_rules_table([448, 500], "fp8_e4m3")
    assert [row[1:] for row in t.rows] == [("448", "448", "448"), ("448", "nan", "448")]
    t = FL.cast_rules_table([61440], "fp8_e5m2")
    assert t.rows[0][1:] == ("inf", "inf", "57344")
    with pytest.raises(ValueError, match="finite"):
        FL.cast_rules_table([np.inf], "fp8_e4m3")
    row = [r for r in FL.format_table().rows if r[0] == "fp8_e4m3"][0]
    assert "saturates" not in row[-1]  # saturation is the cast's, not the format's


# ----- the reasons lessons 00 and 01's questions that ask why accept -----
def test_1000_1_is_stored_as_1000_because_fp16s_numbers_there_are_half_apart():
    """00: 1000.1 is a normal number rounded onto its binade's grid (0.5 apart from 512 to 1024), not
    to decimal digits or to an integer (``WHY_1000_1_ROUNDS_TO_1000``)."""
    assert FP16.quantize(1000.1) == 1000.0 and FP16.classify(1000.1) == "normal"
    assert FP16.neighbours(1000.0) == (999.5, 1000.5) and FP16.ulp(512.0) == FP16.ulp(1023.0) == 0.5
    assert FP16.quantize(0.1) != 0.1 and FP16.quantize(1 / 3) % 1 != 0  # binary, and fractions kept
    assert FL.check_why_1000_1_rounds_to_1000("d") and FL.check_why_1000_1_rounds_to_1000("a").status == "wrong"


def test_small_updates_are_lost_on_an_fp16_weight_and_add_up_on_an_fp32_master():
    """01: 1e-4 is a normal fp16 number (the update survives) and yet every one of 1000 such updates
    is lost on a weight of 1 kept in fp16; fp32's gaps are 2^13 times smaller (``WHY_MASTER_WEIGHTS``)."""
    from ampviz.formats import FP32

    assert FP16.classify(1e-4) == "normal" and FL.update_lost(1.0, 1e-4, "fp16")
    assert (FL.accumulate(1.0, 1e-4, 1000, "fp16") == 1.0).all()
    assert FP16.eps / FP32.eps == 2.0**13 and abs(FL.accumulate(1.0, 1e-4, 1000, "fp32")[-1] - 1.1) < 1e-4
    assert FL.check_why_master_weights("c") and FL.check_why_master_weights("b").status == "wrong"


def test_exponent_bits_not_the_bias_give_bf16_fp32s_range():
    """01: bf16 has fp32's 8 exponent bits and only 7 mantissa bits, and goes to inf past its max like
    fp16; fp16's 5 exponent bits with bf16's bias would only move fp16's range down (``WHY_BF16_RANGE``)."""
    from ampviz.formats import BF16, FP32
    from ampviz.formats.spec import FloatFormat

    assert (BF16.exponent_bits, BF16.bias, BF16.mantissa_bits) == (FP32.exponent_bits, FP32.bias, 7)
    assert BF16.smallest_normal == FP32.smallest_normal and BF16.eps == 2.0**-7 > FP16.eps
    assert FL.update_lost(1.0, 2.0**-9, "bf16") and not FL.update_lost(1.0, 2.0**-9, "fp16")
    assert BF16.quantize(1e39) == np.inf  # not saturated
    shifted = FloatFormat("fp16 with bias 127", 5, 10, 127)
    assert shifted.max < FP16.max and shifted.smallest_normal < FP16.smallest_normal
    assert shifted.max / shifted.smallest_normal == FP16.max / FP16.smallest_normal  # as many binades
    assert FL.check_why_bf16_range("a") and FL.check_why_bf16_range("c").status == "wrong"
