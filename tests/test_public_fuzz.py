"""Every public function of the numpy core's teaching helpers and of the view's figure builders,
driven with arbitrary arguments (Hypothesis): each returns, or raises ValueError/TypeError with a
one-line message that says what to pass; never another exception from deep inside. The exercise
checkers never raise at all: whatever a learner types is an answer, right or wrong.

(The formats, census, scaling, scalelog, explain and doctor modules have fuzz tests of their own.)"""

import inspect

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ampviz import checks, plots, text
from ampviz.formats import errors, lesson as formats_lesson
from ampviz.scaling import lesson as scaling_lesson, synth
from ampviz.training import lesson as training_lesson

LESSON_MODULES = (text, checks, formats_lesson, errors, scaling_lesson, training_lesson)

SMALL = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3000), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.sampled_from(["fp16", "bf16", "fp8_e4m3", "fp32", "down", "spikes", "steady"]),
    st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), max_size=6),
    st.just(np.array([1e-8, 0.5, 70000.0], np.float32)), st.just(np.zeros((2, 2))), st.just(complex(1, 2)),
    st.just(object()), st.just(np.random.default_rng(0)), st.just({"a": 1}), st.just(b"\x00"),
)

HUGE_SIZES = 10**7  # a size argument above this is refused or costs memory, never a crash elsewhere


def _call(fn, args: dict):
    try:
        fn(**args)
    except (ValueError, TypeError) as e:
        msg = str(e)
        assert msg.strip() and "\n" not in msg, f"{fn.__name__}{args!r}: {msg!r}"
    except MemoryError:
        pytest.fail(f"{fn.__name__}{args!r} ran out of memory instead of refusing the size")


def _public(module):
    return [getattr(module, name) for name in module.__all__
            if inspect.isfunction(getattr(module, name)) and not name.startswith("check")]


def _strategy(fn):
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]

    def fix(drawn):
        # sizes that would ask for terabytes are another test's business: keep the drawn ones modest
        return {k: (v % HUGE_SIZES if isinstance(v, int) and not isinstance(v, bool) and abs(v) > HUGE_SIZES
                    else v) for k, v in drawn.items()}

    required = {p.name: SMALL for p in params if p.default is p.empty}
    optional = {p.name: SMALL for p in params if p.default is not p.empty}
    return st.fixed_dictionaries(required, optional=optional).map(fix)


FUNCTIONS = _public(synth) + [f for m in LESSON_MODULES for f in _public(m)] + _public(plots)


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f"{f.__module__}.{f.__name__}")
def test_public_function_answers_or_refuses_in_one_line(fn):
    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(args=_strategy(fn))
    def run(args):
        _call(fn, args)

    run()


CHECKERS = [getattr(m, n) for m in LESSON_MODULES for n in m.__all__ if n.startswith("check_")]


@pytest.mark.parametrize("checker", CHECKERS, ids=lambda f: f.__name__)
def test_checkers_take_any_answer(checker):
    params = list(inspect.signature(checker).parameters)
    from ampviz.checks import Choice
    demo = Choice("demo_fuzz", "Why?", {"a": "this", "b": "that"}, "a", {"b": "that is not it"})
    extra = {"values": np.array([1e-8, 0.5], np.float32), "scales": [2.0**15, 2.0**14, 2.0**15, 2.0**16],
             "diagnosis": None, "value": 0.1, "fmt": "fp16", "choice": demo}

    @settings(max_examples=60, deadline=None)
    @given(answer=SMALL)
    def run(answer):
        kwargs = {p: extra[p] for p in params[1:] if p in extra}
        if "diagnosis" in kwargs:
            pytest.skip("needs a real diagnosis (tests/course/test_exercises.py runs it)")
        result = checker(answer, **kwargs)
        assert str(result).strip() and "\n" not in str(result).strip()

    run()


@settings(max_examples=80, deadline=None)
@given(steps=st.one_of(st.integers(), st.floats(), st.none()))
def test_huge_or_odd_sizes_are_refused_before_allocating(steps):
    for make in (lambda: synth.steady(steps, rng=0), lambda: synth.found_inf_every(steps, 10),
                 lambda: synth.scenario("spikes", steps, 0.5, 0)):
        try:
            out = make()
        except (ValueError, TypeError) as e:
            assert "\n" not in str(e)
            continue
        assert len(out) == steps


# ----- ampviz.training.live: settings and saved runs -----
LIVE_FIELDS = ["model", "mode", "steps", "lr", "batch_size", "seed", "device", "census_every", "census_fmt",
               "watch", "init_scale", "growth_factor", "backoff_factor", "growth_interval", "keep_grads"]


@settings(max_examples=200, deadline=None)
@given(kwargs=st.dictionaries(st.sampled_from(LIVE_FIELDS), SMALL, max_size=4))
def test_train_config_answers_or_refuses_in_one_line(kwargs):
    from ampviz.training import live

    _call(live.TrainConfig, kwargs)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(st.binary(max_size=300), st.text(max_size=300).map(str.encode),
                      st.text(max_size=200).map(lambda t: ("# ampviz run " + t).encode())))
def test_load_run_reads_a_run_or_says_what_is_wrong(tmp_path, data):
    from ampviz.training import live

    for suffix in (".csv", ".json"):
        path = tmp_path / f"run{suffix}"
        path.write_bytes(data)
        try:
            run = live.load_run(path)
        except (ValueError, TypeError) as e:
            assert str(e).strip() and "\n" not in str(e)
        else:
            assert isinstance(run, live.Run)
