"""The exercise checkers: ``ampviz.checks.check`` and every lesson's ``check_*`` questions (those of
``ampviz.formats.lesson``, ``ampviz.scaling.lesson`` and ``ampviz.training.lesson``) answer None,
any input and every way of writing a number in one fixed line."""

import math

import numpy as np
import pytest

from ampviz import checks
from ampviz import text as TX
from ampviz.formats import lesson as FL
from ampviz.scaling import lesson as SL
from ampviz.training import lesson as TL

MODULES = (TX, checks, FL, SL, TL)
ALL_NAMES = [n for m in MODULES for n in m.__all__]
NAMED = {n: getattr(m, n) for m in MODULES for n in m.__all__}


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


@pytest.mark.parametrize("name", [n for n in ALL_NAMES if n.startswith("check_") and n != "check_choice"])
def test_every_checker_answers_none_with_not_answered(name):
    """Each checker takes ``answer`` first and says "not answered yet" to None, whatever it needs."""
    extra = {"check_safe_scale": (np.ones(3, np.float32),), "check_cast": (1.0,), "check_log_verdict": ([1.0] * 4,)}
    c = NAMED[name](None, *extra.get(name, ()))
    assert c.status == "unanswered" and str(c).startswith("not answered yet")
    wrong = NAMED[name]("certainly not this", *extra.get(name, ()))
    assert wrong.status == "wrong" and str(wrong).startswith("✗ not quite: ")

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


# ----- questions that ask why -----
def _choice(name="demo_why", **kw):
    fields = dict(question="Why?", options={"a": "because of x", "b": "because of y.", "c": "because of z"},
                  right="b", why_not={"a": "x is not it", "c": "z is not it"})
    fields.update(kw)
    return checks.Choice(name, **fields)


def test_a_choice_reads_letters_and_option_texts():
    q = _choice()
    for right in ("b", "B", "(b)", "b)", " b. ", "'b'", "Because of Y", "because of y."):
        assert checks.check_choice(right, q).status == "right", right
    assert str(checks.check_choice("a", q)) == "✗ not quite: (a) x is not it"
    assert str(checks.check_choice("c)", q)) == "✗ not quite: (c) z is not it"
    for unreadable in ("d", "ab", "", 2, True, 1.5, ["b"], object(), "because"):
        assert str(checks.check_choice(unreadable, q)) == "✗ not quite: answer with one letter, a, b or c"
    assert checks.check_choice(None, q).status == "unanswered"
    assert checks.check_choice(..., q).status == "unanswered"
    assert q.letters == "a, b or c" and checks.CHOICES["demo_why"] is q
    checker = q.checker()
    assert checker.__name__ == "check_demo_why" and checker.__doc__ == "Q: Why? Right: (b) because of y."
    assert [str(checker(x)) for x in ("b", "a", None)] == [str(checks.check_choice(x, q)) for x in ("b", "a", None)]


def test_a_wrong_choice_is_refused_when_made():
    with pytest.raises(ValueError, match="lettered a, b, c"):
        _choice("bad1", options={"a": "x", "c": "y"}, why_not={"c": "no"}, right="a")
    with pytest.raises(ValueError, match="lettered a, b, c"):
        _choice("bad2", options={"a": "x"}, why_not={}, right="a")
    with pytest.raises(ValueError, match="is not an option"):
        _choice("bad3", right="d")
    with pytest.raises(ValueError, match="one non-empty reason for each wrong letter"):
        _choice("bad4", why_not={"a": "x is not it"})
    with pytest.raises(ValueError, match="one non-empty reason for each wrong letter"):
        _choice("bad5", why_not={"a": "x is not it", "c": ""})
    _choice("twice")
    _choice("twice")  # the same question made again (a module reloaded) is the same question
    with pytest.raises(ValueError, match="already named 'twice'"):
        _choice("twice", question="Why not?")


def _all_choices():
    """Every Choice the package makes (its lesson modules imported)."""
    import importlib
    import pkgutil

    import ampviz
    for info in pkgutil.walk_packages(ampviz.__path__, "ampviz."):
        importlib.import_module(info.name)
    return [q for name, q in checks.CHOICES.items() if not name.startswith(("demo_", "bad", "twice"))]


def test_every_why_question_of_the_package_is_well_made_and_has_its_checker():
    """Each has a checker ``check_<name>`` in the module that made it, which answers its right letter
    right and each wrong letter with that letter's own reason; no hint names the right letter."""
    import sys

    choices = _all_choices()
    assert choices, "the lessons ask why"
    for q in choices:
        owners = [m for m in list(sys.modules.values())
                  if getattr(m, "__name__", "").startswith("ampviz") and getattr(m, f"check_{q.name}", None)]
        assert owners, f"no check_{q.name} for the question {q.question!r}"
        checker = getattr(owners[0], f"check_{q.name}")
        assert checker(q.right).status == "right" and checker(None).status == "unanswered"
        for letter, reason in q.why_not.items():
            assert str(checker(letter)) == f"✗ not quite: ({letter}) {reason}"
            assert f"({q.right})" not in reason
        assert len(set(q.options.values())) == len(q.options), f"{q.name}: two options read the same"


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.none(), st.text(max_size=30), st.integers(), st.floats(allow_nan=True), st.booleans(),
                 st.lists(st.text(max_size=3), max_size=3), st.sampled_from(["a", "(c)", "B)", "because of z"])))
def test_a_choice_answers_anything_in_one_line(answer):
    q = _choice()
    verdict = checks.check_choice(answer, q)
    assert verdict.status in ("right", "wrong", "unanswered")
    assert "\n" not in str(verdict)
    assert (verdict.status == "right") == (q.read(answer) == "b")
