"""The lessons' shared parts: ``ampviz.text`` (number, measured, Table) and ``ampviz.checks``, and the
tables and checkers of ``ampviz.formats.lesson``, ``ampviz.scaling.lesson`` and ``ampviz.training.lesson``.

Arithmetic is checked bit for bit against torch (the reference the lessons cite)."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ampviz import FORMATS, FP16
from ampviz import checks
from ampviz import text as TX
from ampviz.formats import lesson as FL
from ampviz.scaling import lesson as SL
from ampviz.training import lesson as TL

MODULES = (TX, checks, FL, SL, TL)
ALL_NAMES = [n for m in MODULES for n in m.__all__]
NAMED = {n: getattr(m, n) for m in MODULES for n in m.__all__}
from ampviz.formats.census import census

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


# ----- display -----
@pytest.mark.parametrize("x, text", [
    (2.0**-24, "2^-24"), (2.0**-3, "2^-3"), (0.25, "0.25"), (1.0, "1"), (65536.0, "65536"),
    (2.0**17, "2^17"), (-(2.0**-24), "-2^-24"), (65504.0, "65504"), (0.1, "0.1"),
    (math.inf, "inf"), (-math.inf, "-inf"), (math.nan, "nan"), (0.0, "0"), (-0.0, "-0"),
    (1.0 + 2**-10, "1.0009766"),
])
def test_number(x, text):
    assert TX.number(x) == text


def test_number_pow2():
    assert TX.number(0.25, pow2=True) == "2^-2" and TX.number(1024.0, pow2=True) == "2^10"
    assert TX.number(1.0, pow2=True) == "1" and TX.number(3.0, pow2=True) == "3"


def test_table_text_html_and_validation():
    t = TX.Table(("a", "long heading"), [(1, "x<y"), ("22", 3.5)], title="T")
    lines = str(t).splitlines()
    assert lines[0] == "T"
    assert lines[1] == "a   long heading"
    assert lines[2] == "--  ------------"
    assert lines[3] == "1   x<y"
    assert repr(t) == str(t)
    assert "x&lt;y" in t._repr_html_() and "<caption>T</caption>" in t._repr_html_()
    assert t.column("a") == ("1", "22")
    with pytest.raises(ValueError, match="2 cells"):
        TX.Table(("a", "b", "c"), [(1, 2)])


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


# ----- loss scaling -----
def test_largest_safe_scale_by_brute_force():
    rng = np.random.default_rng(3)
    for fmt in ("fp16", "fp8_e5m2", "fp8_e4m3", "bf16"):
        for _ in range(50):
            g = (rng.standard_normal(100) * 2.0 ** rng.uniform(-30, 5)).astype(np.float32)
            s = SL.largest_safe_scale(g, fmt)
            assert math.log2(s).is_integer()
            assert census(g, fmt, s).counts["overflow"] == 0
            if s < 2.0**127:
                assert census(g, fmt, 2 * s).counts["overflow"] > 0


def test_largest_safe_scale_edges():
    assert SL.largest_safe_scale([1.0], "fp16") == 32768.0  # 65536 overflows
    assert SL.largest_safe_scale([65504.0], "fp16") == 1.0
    assert SL.largest_safe_scale([0.5, -0.99], "fp16") == 65536.0  # 0.99 * 65536 = 64880.6 < 65504
    assert SL.largest_safe_scale([2.0**-140], "bf16") == 2.0**127  # capped: a scale is a float32
    for bad in ([], [0.0, 0.0], [1.0, math.inf], [math.nan]):
        with pytest.raises(ValueError):
            SL.largest_safe_scale(bad, "fp16")


def test_census_table_counts_match_census():
    rng = np.random.default_rng(4)
    g = (rng.standard_normal(1000) * 1e-6).astype(np.float32)
    g[:10] = 0
    g[10] = 1.0
    t = SL.census_table(g, "fp16", [1.0, 2.0**16, 2.0**17, 3.0])
    assert t.column("scale") == ("2^0", "2^16", "2^17", "3")
    assert t.title == "fp16, 1,000 values"
    for row, s in zip(t.rows, [1.0, 2.0**16, 2.0**17, 3.0]):
        c = census(g, "fp16", s).counts
        expected = [c["zero"], c["underflow"], c["subnormal"], c["normal"], c["overflow"] + c["nan"]]
        assert [int(cell.split()[0].replace(",", "")) for cell in row[1:]] == expected
    assert t.rows[0][1] == "10 (1.00%)"
    assert t.rows[2][5] == "1 (0.10%)"  # 1.0 * 2^17 overflows


SCALES = [1.0, 2.0**16, 3.0]


@pytest.mark.parametrize("scales, same_as", [
    (np.array(SCALES), SCALES), (torch.tensor(SCALES), SCALES), (tuple(SCALES), SCALES), (iter(SCALES), SCALES),
    (np.float32(SCALES), SCALES), ([1, 65536, np.float32(3)], SCALES), (4.0, [4.0]), (np.float32(4), [4.0]),
    (torch.tensor(4.0), [4.0]), (np.array([4.0]), [4.0]), (4, [4.0]), ([], []), (np.array([]), []),
])
def test_census_table_takes_a_scale_or_a_sequence_array_or_tensor_of_them(scales, same_as):
    g = np.float32([0, 1e-8, 1e-6, 1.0, 7e4])
    t = SL.census_table(g, "fp16", scales)
    assert t == SL.census_table(g, "fp16", same_as) and len(t.rows) == len(same_as)


@pytest.mark.parametrize("scales", [np.ones((2, 2)), torch.ones(2, 1), "2.0", None, [1.0, None], {"a": 1.0}, [True],
                                    [1.0, "x"], object(), 1 + 2j, [[1.0], [2.0]], [0.0], [-1.0], [math.nan], math.inf])
def test_census_table_refuses_other_scales_in_one_line_saying_what_to_pass(scales):
    with pytest.raises(ValueError, match="scale") as info:
        SL.census_table(np.float32([1.0, 2.0]), "fp16", scales)
    assert "\n" not in str(info.value) and ("pass" in str(info.value) or "positive number" in str(info.value))


@settings(max_examples=60, deadline=None)
@given(scales=st.one_of(st.floats(), st.lists(st.floats(), max_size=4),
                        hnp.arrays(np.float64, hnp.array_shapes(min_dims=0, max_dims=2, max_side=3)),
                        st.integers(-2**70, 2**70), st.text(max_size=3), st.none()))
def test_census_table_answers_or_refuses_any_scales(scales):
    try:
        t = SL.census_table(np.float32([0, 1e-8, 1.0, 7e4]), "bf16", scales)
    except ValueError as e:
        assert "\n" not in str(e) and "scale" in str(e)
        return
    assert len(t.rows) == np.size(scales) and all(len(row) == 6 for row in t.rows)


def test_layer_table():
    t = SL.layer_table({"a": np.array([0.0, 1e-9, 1e-6, 1.0], np.float32), "b": np.array([2.0], np.float32)})
    assert t.column("name") == ("a", "b")
    assert t.rows[0][1:] == ("4", "1", "25.0%", "25.0%", "25.0%", "25.0%")
    assert t.title == "fp16 at scale 2^0"


# ----- checkers -----
def test_check_states_and_no_numbers_in_messages():
    assert checks.check(None, 1.0).status == "unanswered"
    assert checks.check(..., 1.0).status == "unanswered"
    assert "not answered yet" in str(checks.check(None, 1.0))
    right, wrong = checks.check(2.0, 2.0), checks.check(3.0, 2.0, hint="think")
    assert right and not wrong
    assert str(right) == "✓ correct" and str(wrong) == "✗ not quite: think"
    assert checks.check(2.05, 2.0, tol=0.1)
    assert checks.check(math.inf, math.inf) and not checks.check(1e300, math.inf)
    assert checks.check(" Skip ", "skip") and not checks.check(1, "skip")
    assert not checks.check("abc", 1.0)


def test_question_checkers():
    assert FL.check_fnuz_smallest(2**-10) and not FL.check_fnuz_smallest(2**-9)
    assert FL.check_cast(float("inf"), 65520.0) and not FL.check_cast(65504, 65520.0)
    g = np.array([0.0, 1e-9, 1e-9, 1.0], np.float32)
    assert SL.check_safe_scale(32768, g) and not SL.check_safe_scale(65536, g)
    assert SL.check_overflow_action("it skips the step") and not SL.check_overflow_action("clip")
    for c in (FL.check_fnuz_smallest(1.0), SL.check_safe_scale(1, g), FL.check_cast(1, 65520.0)):
        assert c.status == "wrong" and not any(ch.isdigit() for ch in str(c).split(":")[0])



def test_later_question_checkers():
    assert FL.check_cast(65504, 65519) and FL.check_cast(np.inf, 65520) and not FL.check_cast(65519, 65519)
    assert FL.check_cast(256, 257, "bf16") and not FL.check_cast(257, 257, "bf16")
    assert SL.check_scale_direction(" Down ") and not SL.check_scale_direction("up")
    assert SL.check_hysteresis_skips(1) and not SL.check_hysteresis_skips(2)
    ratchet = [1024.0, 1024.0, 512.0, 256.0, 256.0, 128.0, 64.0, 32.0]
    assert SL.check_log_verdict("ratchet", ratchet) and not SL.check_log_verdict("sawtooth", ratchet)
    assert SL.check_log_verdict("'sawtooth'", [1024.0] * 8)
    assert TL.check_mode_without_loss("fp16+scaler") and not TL.check_mode_without_loss("fp16")
    assert FL.check_update_lost("no") and FL.check_update_lost(False) and not FL.check_update_lost("yes")
    assert FL.check_update_lost("no", w=1.5, u=1.5 / 3000) and not FL.check_update_lost("yes", w=1.5, u=1.5 / 3000)
    assert FL.check_update_lost("yes", w=1.0, u=-2**-12) and not FL.check_update_lost("no", w=1.0, u=-2**-12)
    assert FL.check_update_lost(" Yes ", w=1.0, u=2**-11) and FL.check_update_lost(None).status == "unanswered"
    yes_no = checks._yes_no(False, {"it does not"})
    assert yes_no("no") and yes_no(" No. ") and yes_no(False) and yes_no(np.False_) and yes_no("it does not")
    assert not yes_no("yes") and not yes_no(True) and not yes_no(0)


@pytest.mark.parametrize("name", [n for n in ALL_NAMES if n.startswith("check_")])
def test_every_checker_answers_none_with_not_answered(name):
    """Each checker takes ``answer`` first and says "not answered yet" to None, whatever it needs."""
    extra = {"check_safe_scale": (np.ones(3, np.float32),), "check_cast": (1.0,), "check_log_verdict": ([1.0] * 4,)}
    c = NAMED[name](None, *extra.get(name, ()))
    assert c.status == "unanswered" and str(c).startswith("not answered yet")
    wrong = NAMED[name]("certainly not this", *extra.get(name, ()))
    assert wrong.status == "wrong" and str(wrong).startswith("✗ not quite: ")

def test_trace_table():
    from ampviz.scaling.lesson import trace_table
    from ampviz.scaling import DynamicScaler, TorchGradScaler, simulate

    flags = np.zeros(50, bool)
    flags[[3, 4, 10]] = True
    t1 = simulate(TorchGradScaler(growth_interval=5), found_inf=flags)
    t2 = simulate(DynamicScaler(name="raises", min_scale=2.0**15, raise_at_min=True), found_inf=flags)
    table = trace_table([t1, t2])
    assert table.column("scaler") == ("torch", "raises")
    assert table.column("skipped steps") == (str(t1.skipped_count), "2")  # steps after the stop excluded
    assert t2.stopped_at == 4 and table.column("stopped at step") == ("-", "4")
    assert table.column("final scale")[1] == "stopped"
    assert table.column("lowest scale")[0] == TX.number(float(t1.scale.min()))


@pytest.mark.parametrize("answer", [10**400, -10**400, "tensor", "tensor with grad", 1 + 2j, object()])
def test_checkers_take_any_answer_without_raising(answer):
    """Whatever a learner types is an answer: an int beyond float's range, a tensor that requires
    grad (no warning), anything else; the right value given as such a tensor is right."""
    import warnings

    import torch

    from ampviz.formats.lesson import check_cast, check_fnuz_smallest

    if answer == "tensor":
        answer = torch.ones(3)
    elif answer == "tensor with grad":
        answer = torch.tensor(2.0**-10, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for result in (check_fnuz_smallest(answer), check_cast(answer, 65520.0)):
            assert result.status in ("right", "wrong")
    expected_right = isinstance(answer, torch.Tensor) and answer.dim() == 0
    assert (check_fnuz_smallest(answer).status == "right") == expected_right
    assert check_cast(answer, 65520.0).status == "wrong"


def test_checkers_take_every_way_of_writing_the_same_number():
    """A value printed to a few digits, a power of two typed as text, a numeric string: the same
    answer. Near misses and other powers of two are not."""
    for same in (2**-10, 9.77e-4, "9.77e-4", "2**-10", "2^-10", " 2 ** (-10) ", np.float16(2**-10)):
        assert FL.check_fnuz_smallest(same).status == "right", same
    for other in (9.8e-4, 2**-9, "2^-9", "2**", "two", True, float("nan")):
        assert FL.check_fnuz_smallest(other).status == "wrong", other
    assert FL.check_fnuz_smallest(None).status == "unanswered"
    assert FL.check_cast("65536", 65520, "bf16") and FL.check_cast("2^16", 65520, "bf16")
    assert FL.check_cast("inf", 65520, "fp16") and not FL.check_cast("inf", 65520, "bf16")
    assert FL.check_cast("32,768", 32768) and SL.check_safe_scale("2**15", np.array([1.0], np.float32))


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


def test_the_steady_interval_is_the_clean_steps_between_overflows():
    from ampviz.scaling import synth
    from ampviz.scaling import TorchGradScaler, simulate

    spikes = synth.found_inf_every(10_000, 500, offset=250)
    steady = simulate(TorchGradScaler(growth_interval=499), found_inf=spikes)
    ratchet = simulate(TorchGradScaler(growth_interval=500), found_inf=spikes)
    assert steady.scale.min() == 2.0**15 and steady.final.scale == 2.0**15 and ratchet.final.scale == 2.0**-4
    assert SL.check_steady_interval(499) and SL.check_steady_interval("499")
    assert SL.check_steady_interval(500).status == "wrong" and SL.check_steady_interval(2000).status == "wrong"
    assert SL.check_steady_interval(None).status == "unanswered"


def test_the_fairseq_log_of_notebook_04_is_a_sawtooth():
    from ampviz.scaling.scalelog import diagnose, read_log

    line = "NOTE: gradient overflow detected, ignoring gradient, setting loss scale to: {}"
    log = "\n".join(line.format(s) for s in (64.0, 64.0, 32.0, 64.0, 64.0, 64.0))
    assert read_log(log).tolist() == [64.0, 64.0, 32.0, 64.0, 64.0, 64.0] and diagnose(read_log(log)).verdict == "sawtooth"
    assert SL.check_log_verdict("sawtooth", read_log(log)) and not SL.check_log_verdict("ratchet", read_log(log))


def test_range_shift_checker():
    for right in ("up", " Up ", "higher", "'up'"):
        assert TL.check_range_shift(right)
    for wrong in ("down", "same", 1, None):
        assert TL.check_range_shift(wrong).status == ("unanswered" if wrong is None else "wrong")


def test_word_answers_take_their_synonyms():
    for right in ("down", "It goes down", "decreases", " falls "):
        assert SL.check_scale_direction(right), right
    assert SL.check_scale_direction("up").status == "wrong" and SL.check_scale_direction("sideways").status == "wrong"
    for right in ("fp16+scaler", "fp16 with a scaler", "FP16 + scaler"):
        assert TL.check_mode_without_loss(right), right
    assert TL.check_mode_without_loss("fp16").status == "wrong"


def test_fractions_typed_as_text_are_numbers():
    assert checks.check("5/1024", 5 / 1024) and checks.check("5 / 2**10", 5 / 1024) and checks.check("1/2^15", 2.0**-15)
    for bad in ("1/0", "a/b", "1/2/3", "/"):
        assert checks.check(bad, 0.5).status == "wrong"


def test_one_number_reader_for_every_checker():
    """checks._number_text is the one reader (notebook 08's checkers use it too)."""
    from ampviz.checks import _number_text

    for text, value in (("2x", 2.0), ("×2", 2.0), ("2 times", 2.0), ("twice", 2.0), ("-2^-24", -(2.0**-24)),
                        ("2^(-24)", 2.0**-24), ("32,768", 32768.0), ("1/2^15", 2.0**-15)):
        assert _number_text(text) == value, text
    for text in ("1/0", "2**", "max", "2**99999"):
        assert _number_text(text) == text
