"""Every public function of the torch-side modules (ampviz.training.gradscaler, ampviz.training, ampviz.env,
ampviz.pitfalls, ampviz.pitfalls.autocast_cache, ampviz.pitfalls.transformer_eval), driven with
arbitrary arguments (Hypothesis): each returns, or raises ValueError/TypeError with a one-line
message that says what to pass; never another exception from deep inside torch or Lightning, never
a run that takes minutes or a tensor that fills the memory. The exercise checkers never raise at
all: whatever a learner types is an answer, right or wrong.

(ampviz.pitfalls.manual_backward is driven in tests/test_core_fuzz.py.)"""

import contextlib
import inspect
import math
import os
import re
import signal
import time

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ampviz.pitfalls as P
from ampviz import env
from ampviz.training import gradscaler as G
from ampviz import training as T
from ampviz.formats.census import census
from ampviz.formats import FORMATS
from ampviz.checks import Check
from ampviz.pitfalls import autocast_cache as AC
from ampviz.pitfalls import transformer_eval as TE
from ampviz.scaling import TorchGradScaler, simulate

FUZZ = settings(max_examples=int(os.environ.get("AMPVIZ_FUZZ_EXAMPLES", 40)), deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

#: A call that takes longer than this is a failure (a size that should have been refused).
LIMIT_S = 20.0


# ---------------------------------------------------------------- the property
class TookTooLong(BaseException):
    """Raised by the alarm; a BaseException, so no ``except Exception`` inside a function swallows it."""


@contextlib.contextmanager
def time_limit(seconds: float):
    def alarm(signum, frame):
        raise TookTooLong(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


REFUSED = object()


def one_clear_error(exc: BaseException):
    assert isinstance(exc, (ValueError, TypeError)), f"{type(exc).__name__}: {exc}"
    message = str(exc)
    assert message.strip() and "\n" not in message, repr(message)


def answer(fn, *args, **kwargs):
    """fn's result, or REFUSED after a ValueError/TypeError with a one-line message. Any other
    exception, a MemoryError, or a call running past ``LIMIT_S`` fails the test."""
    try:
        with time_limit(LIMIT_S):
            return fn(*args, **kwargs)
    except (ValueError, TypeError) as exc:
        one_clear_error(exc)
        return REFUSED


# ---------------------------------------------------------------- arbitrary arguments
def _tensor_makers():
    return [
        lambda: torch.tensor(2.0), lambda: torch.tensor([1.0, -2.0]), lambda: torch.ones(2, dtype=torch.float16),
        lambda: torch.ones(3, dtype=torch.bfloat16), lambda: torch.tensor([1, 2]), lambda: torch.tensor([True, False]),
        lambda: torch.ones(2, dtype=torch.complex64), lambda: torch.tensor([math.nan, math.inf]),
        lambda: torch.ones(2, 3), lambda: torch.ones(2, device="meta"), lambda: torch.zeros(0),
        lambda: torch.tensor(3.0, requires_grad=True), lambda: torch.ones(2, dtype=torch.float8_e4m3fn),
        lambda: torch.tensor(7, dtype=torch.int8), lambda: torch.tensor([1e30, -1e-30], dtype=torch.float64),
    ]


def _array_makers():
    return [
        lambda: np.array([1e-8, 0.5, 7e4], np.float32), lambda: np.zeros((2, 2)), lambda: np.array([True, False]),
        lambda: np.array(["a"]), lambda: np.array([1 + 2j]), lambda: np.empty(0), lambda: np.float32(2.0),
        lambda: np.int64(3), lambda: np.array(5.0), lambda: np.array([np.nan, np.inf, -np.inf]),
        lambda: np.array([1, 0, 1], np.uint8), lambda: np.bool_(True), lambda: np.float64(1e300),
    ]


@st.composite
def _whole_branch(draw, strategy):
    """``strategy`` as one branch of a one_of (which would otherwise flatten a nested one_of into its branches)."""
    return draw(strategy)


def weighted(*strategies):
    """One of ``strategies``, each drawn as often as the others (a one_of among them is not flattened)."""
    return st.one_of(*(_whole_branch(s) for s in strategies))


TENSORS = st.sampled_from(_tensor_makers()).map(lambda make: make())
ARRAYS = st.sampled_from(_array_makers()).map(lambda make: make())
FLOATS = st.floats(allow_nan=True, allow_infinity=True)
ANY = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3000), st.integers(), FLOATS,
    st.text(max_size=12), st.binary(max_size=3), st.complex_numbers(max_magnitude=10),
    st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), max_size=5),
    st.lists(st.integers(-(2**70), 2**70), max_size=4), st.lists(st.booleans(), max_size=5),
    st.lists(st.one_of(st.none(), st.text(max_size=2), st.floats()), min_size=1, max_size=3),
    st.tuples(st.floats(-10, 10), st.floats(-10, 10)), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    TENSORS, ARRAYS, st.lists(st.one_of(TENSORS, ARRAYS, st.floats()), min_size=1, max_size=3),
    st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.int8, torch.complex64, torch.float8_e4m3fn,
                     np.float16, Ellipsis, range(3), float, "fp16", "bf16", "cpu", "meta", "cuda", ""]),
    st.builds(object),
)


def _run():
    return G.run_real_scaler(G.found_inf_from("..x...x.."), growth_interval=2)


def _trace():
    return simulate(TorchGradScaler(growth_interval=3), found_inf=G.found_inf_from("...x.."))


RUNS = st.sampled_from([_run, _trace]).map(lambda make: make())
FLAG_STREAMS = st.one_of(st.lists(st.booleans(), max_size=12), st.text("x. ", max_size=12).map(G.found_inf_from),
                         st.lists(st.integers(0, 1), max_size=5).map(np.array))
WEIGHTS = st.one_of(st.lists(st.floats(-8, 8, width=32), min_size=1, max_size=4),
                    st.tuples(st.floats(-3e38, 3e38), st.floats(-4, 4)))
POW2 = st.integers(-30, 30).map(lambda k: 2.0**k)
DTYPES = st.sampled_from(["fp16", "bf16", "fp32", "fp8_e4m3", "fp8_e5m2", "float16", torch.float16, torch.bfloat16,
                          torch.float32, torch.float8_e5m2])
SCALER_KWARGS = st.dictionaries(
    st.sampled_from(["init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled", "device", "bogus"]),
    weighted(ANY, POW2, st.sampled_from([2.0, 1.5, 0.5, 0.25, 1, 2, 3, 0])), max_size=3)
OUTCOMES = st.sampled_from([
    lambda: P.Outcome("ran", loss=0.5, grad_norms={"w": 1.0, "b": None}),
    lambda: P.Outcome("failed", error_type="RuntimeError", message="boom"),
    lambda: P.Outcome("with details", loss=0.25, details={"weight_dtype": "float32"}),
]).map(lambda make: make())


def _kwargs_of(names, values=ANY):
    return st.dictionaries(st.sampled_from(names), values, max_size=3)


#: (function name or "*", parameter) -> a strategy of sensible values drawn besides ANY
HINTS = {
    ("build_tiny", "weights"): WEIGHTS, ("*", "weights"): WEIGHTS, ("*", "lr"): st.floats(0, 1),
    ("build_tiny", "dtype"): st.sampled_from([torch.float32, torch.float16, torch.float64, torch.bfloat16]),
    ("*", "init_scale"): POW2, ("*", "scale"): POW2, ("unscale_overflow_table", "grad"): WEIGHTS,
    ("*", "max_norm"): st.floats(0, 10),
    ("*", "found_inf"): FLAG_STREAMS, ("*", "pattern"): st.text("x. o", max_size=12),
    ("*", "run"): RUNS, ("same_run", "a"): RUNS, ("same_run", "b"): RUNS,
    ("step_table", "steps"): st.one_of(st.lists(st.integers(-2, 12), max_size=4), st.builds(range, st.integers(0, 12))),
    ("*", "iterations"): st.integers(0, 8), ("*", "gamma"): st.floats(0, 1),
    ("*", "seed"): st.integers(0, 5), ("*", "depth"): st.integers(0, 6), ("*", "width"): st.integers(0, 16),
    ("*", "features"): st.integers(0, 16), ("*", "classes"): st.integers(0, 12), ("*", "batch"): st.integers(0, 16),
    ("*", "loss_scale"): POW2, ("*", "dtype"): DTYPES, ("*", "values"): WEIGHTS,
    ("torch_add", "a"): st.floats(width=32), ("torch_add", "b"): st.floats(width=32),
    ("*", "w0"): st.floats(-4, 4), ("*", "update"): st.floats(-1, 1),
    ("torch_accumulate", "steps"): st.integers(0, 300),
    ("check", "device"): st.sampled_from([None, "cpu", "meta", "cuda", "cuda:0", "junk", torch.device("cpu")]),
    ("check", "size"): st.integers(0, 48), ("check", "budget_s"): st.floats(0, 0.005),
    ("*", "kind"): st.sampled_from(["linear", "layernorm"]), ("*", "fix"): st.sampled_from(list(AC.SIMULATED_FIXES)),
    ("*", "plugin"): st.sampled_from(["legacy", "installed"]), ("real_lightning", "steps"): st.integers(0, 3),
    ("simulated_lightning", "steps"): st.integers(0, 3), ("summary", "outcome"): OUTCOMES,
    ("*", "precision"): st.sampled_from(["bf16-mixed", "32-true", "16-mixed-fp16", "16-mixed", "bf16-true"]),
    ("*", "stage"): st.sampled_from(["fit", "validate"]), ("*", "name"): st.text(max_size=8),
    ("fix_table", "runs"): st.dictionaries(st.text(max_size=4), OUTCOMES, min_size=1, max_size=3),
    ("*", "tolerance"): st.floats(0, 1), ("*", "batches"): st.integers(0, 4), ("*", "batch_size"): st.integers(0, 4),
    ("encoder_call", "grad"): st.sampled_from(["no_grad", "inference_mode", "enabled"]),
    ("*", "mask"): st.sampled_from(["right", "left", "all-false", "none"]), ("*", "layers"): st.integers(0, 3),
    ("*", "autocast"): st.sampled_from([None, torch.bfloat16, torch.float16]),
}
#: what a function's ``**kwargs`` stand for
VAR_KEYWORDS = {
    "walk_iteration": SCALER_KWARGS, "run_real_scaler": SCALER_KWARGS, "skip_detection_table": SCALER_KWARGS,
    "clipping_table": _kwargs_of(["weights", "lr", "init_scale", "unscale_first", "bogus"]),
    "layer_gradients": _kwargs_of(["depth", "width", "features", "classes", "batch", "seed", "bogus"],
                                  weighted(ANY, st.integers(0, 12))),
    "model_gradients": _kwargs_of(["depth", "width", "features", "classes", "batch", "seed", "bogus"],
                                  weighted(ANY, st.integers(0, 12))),
}


def arguments(fn):
    """A strategy of keyword arguments for fn: each parameter anything, a sensible value, or its default."""
    name = fn.__name__
    required, optional, extra = {}, {}, st.just({})
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            continue
        if p.kind is p.VAR_KEYWORD:
            extra = VAR_KEYWORDS.get(name, st.just({}))
            continue
        choices = [ANY]
        hint = HINTS.get((name, p.name), HINTS.get(("*", p.name)))
        if hint is not None:
            choices += [hint, hint]  # a sensible value twice as often as anything: valid calls run too
        if p.default is not p.empty:
            optional[p.name] = weighted(*choices, st.just(p.default))
        else:
            required[p.name] = weighted(*choices)
    return st.tuples(st.fixed_dictionaries(required, optional=optional), extra).map(
        lambda pair: {**pair[1], **pair[0]})


# ---------------------------------------------------------------- which functions
def public(module):
    return [getattr(module, n) for n in module.__all__ if callable(getattr(module, n))]


#: no arguments to vary: each is called once in ``test_functions_without_arguments``
NO_ARGUMENTS = {"error_cases", "constructor_warnings", "versions", "world", "which_world", "condition_table",
                "old_message", "fix_runs", "fastpath_disabled", "SimulatedLegacyAutocastCache"}
#: checked in tests of their own below (context managers, callables as arguments, checkers)
OWN_TESTS = {"quiet_trainer", "outcome_of", "amp_step_reference"}  # the last: a model answer (a training step)

MODULES = (G, T, env, P, AC, TE)
EVERY = [f for m in MODULES for f in public(m)]
FUZZED = [f for f in EVERY if f.__name__ not in NO_ARGUMENTS | OWN_TESTS and not f.__name__.startswith("check_")]


def _id(f):
    return f"{f.__module__}.{f.__name__}"


def _plain(x):
    """A 0-d tensor or array as its Python number."""
    return x.detach().item() if isinstance(x, torch.Tensor) else np.asarray(x).item()


#: torch dtypes and the ampviz formats that model them
CORE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float8_e4m3fn: "fp8_e4m3",
              torch.float8_e5m2: "fp8_e5m2"}


def _same_as_core(dtype, core, result) -> bool:
    """torch's answer equals the numpy core's (quantize, census), where the core models the dtype
    and takes the arguments."""
    name = CORE_NAMES.get(T.torch_dtype(dtype))
    if name is None:
        return True
    try:
        expected = core(name)
    except (ValueError, TypeError):  # e.g. census takes only positive scales that fit in float32
        return True
    if isinstance(expected, dict):
        return expected == result
    return np.array_equal(np.asarray(expected, np.float64).reshape(np.shape(result)), result, equal_nan=True)


def _n_values(values) -> int:
    return values.numel() if isinstance(values, torch.Tensor) else int(np.asarray(values, dtype=object).size)


#: What a result must be, where that is cheap to state: fn name -> check(kwargs, result).
RESULTS = {
    "found_inf_from": lambda kw, r: r.tolist() == [c == "x" for c in kw["pattern"] if not c.isspace()],
    # the driver sets each step's gradient itself: exactly the overflowing steps are skipped, whatever the settings
    "run_real_scaler": lambda kw, r: (np.array_equal(r.skipped, np.asarray(kw["found_inf"], bool))
                                      and r.scale.dtype == np.float32 and len(r.returned) == r.steps),
    "skip_detection_table": lambda kw, r: (r.column("optimizer.step() really")
                                           == tuple("skipped" if f else "ran" for f in np.asarray(
                                               kw.get("found_inf", (True, False)), bool))),
    "same_run": lambda kw, r: r is (type(kw["a"]) is type(kw["b"])),  # RUNS: one real run, one shorter trace
    "walk_iteration": lambda kw, r: [s.key for s in r.snapshots] == ["GradScaler", "scale", "backward", "unscale_",
                                                                     "step", "update"],
    "step_table": lambda kw, r: len(r.rows) == (len(list(kw["steps"])) if kw.get("steps") is not None
                                                else min(kw["run"].steps if hasattr(kw["run"], "steps")
                                                         else kw["run"].scale.size, 20)),
    "torch_cast": lambda kw, r: r.dtype == np.float64 and r.size == _n_values(kw["values"]) and _same_as_core(
        kw["dtype"], lambda name: FORMATS[name].quantize(T.torch_cast(kw["values"], "fp32")), r),
    "torch_cast_counts": lambda kw, r: sum(r.values()) == _n_values(kw["values"]) and _same_as_core(
        kw.get("dtype", "float16"), lambda name: census(kw["values"], name, kw.get("scale", 1.0)).counts, r),
    "torch_accumulate": lambda kw, r: (r.shape == (int(kw["steps"]) + 1,) and np.array_equal(
        r[:1], T.torch_cast([_plain(kw["w0"])], kw["dtype"]), equal_nan=True)),
    "model_gradients": lambda kw, r: r.dtype == np.float32 and r.size == sum(p.numel() for p in T.build_problem(
        kw.get("seed", 0), **{k: v for k, v in kw.items() if k not in ("seed", "loss_scale")}).model.parameters()),
    "check": lambda kw, r: [p.name for p in r.probes] == ["fp16 matmul", "bf16 matmul", "autocast fp16",
                                                          "autocast bf16"],
    "make_data": lambda kw, r: r[0].shape == (int(kw["batches"]) * int(kw.get("batch_size", TE.BATCH)), TE.MAX_LEN),
    "summary": lambda kw, r: isinstance(r, str) and r.startswith(kw["outcome"].name),
}


@pytest.mark.parametrize("fn", FUZZED, ids=_id)
def test_public_function_answers_or_refuses_in_one_line(fn):
    expect = RESULTS.get(fn.__name__)

    @FUZZ
    @given(kwargs=arguments(fn))
    def run(kwargs):
        result = answer(fn, **kwargs)
        if expect is not None and result is not REFUSED:
            assert expect(kwargs, result), (kwargs, result)

    run()


@pytest.mark.parametrize("name", sorted(NO_ARGUMENTS - {"fix_runs"}))
def test_functions_without_arguments(name):
    """fix_runs (five Lightning runs, about 20 s) is run by tests/pitfalls/test_pitfall_transformer_eval.py."""
    fn = next(f for f in EVERY if f.__name__ == name)
    result = answer(fn)
    assert result is not REFUSED


CHECKERS = [f for f in EVERY if f.__name__.startswith("check_")]


@pytest.mark.parametrize("checker", CHECKERS, ids=_id)
def test_checkers_take_any_answer(checker):
    @settings(max_examples=40, deadline=None)
    @given(response=weighted(ANY, st.integers(0, 200), st.floats(0, 2**20), st.sampled_from(["b", "(b)", " B ", "a"])))
    def run(response):
        with time_limit(LIMIT_S):
            result = checker(response)  # never raises: any answer is right, wrong or not given yet
        assert isinstance(result, Check) and result.status in ("right", "wrong", "unanswered")
        assert str(result).strip() and "\n" not in str(result).strip()

    run()


# ---------------------------------------------------------------- callables and context managers
SCENARIOS = st.sampled_from([
    lambda *a, **k: None, lambda *a, **k: {"loss": 0.5, "details": {"k": 1}}, lambda *a, **k: P.Outcome("given"),
    lambda *a, **k: 5, lambda *a, **k: {"bogus": 1}, lambda *a, **k: {"name": "twice"}, lambda *a, **k: 1 / 0,
    lambda *a, **k: [], lambda *a, **k: (_ for _ in ()).throw(RuntimeError("two\nlines")),
])


@FUZZ
@given(name=st.one_of(ANY, st.text(max_size=8)), fn=st.one_of(SCENARIOS, ANY), args=st.lists(ANY, max_size=2),
       kwargs=st.dictionaries(st.sampled_from(["x", "steps", "kind"]), ANY, max_size=2))
def test_outcome_of_keeps_what_the_scenario_raised_or_refuses(name, fn, args, kwargs):
    out = answer(P.outcome_of, name, fn, *args, **kwargs)
    if out is REFUSED:
        return
    assert isinstance(out, P.Outcome) and isinstance(name, str) and callable(fn)
    try:
        expected = fn(*args, **kwargs)
    except Exception as exc:  # the scenario's own failure is the outcome, type and message exactly
        assert (out.name, out.error_type, out.message) == (name, type(exc).__name__, str(exc))
        return
    if isinstance(expected, P.Outcome):
        assert out.name == expected.name
    else:
        assert out.name == name and not out.failed and out.loss == (expected or {}).get("loss")


TRAINER_SETTINGS = ["max_steps", "max_epochs", "precision", "accelerator", "devices", "callbacks", "plugins",
                    "max_time", "limit_train_batches", "profiler", "default_root_dir", "bogus", "logger",
                    "num_sanity_val_steps", "strategy"]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kwargs=st.dictionaries(st.sampled_from(TRAINER_SETTINGS),
                              st.one_of(ANY, st.sampled_from(["bf16-mixed", "fp16", "gpu", "cpu", "simple", 1, 2])),
                              max_size=3))
def test_quiet_trainer_builds_a_trainer_or_refuses(kwargs):
    lightning = pytest.importorskip("lightning")

    def enter():
        with P.quiet_trainer(**kwargs) as trainer:
            return trainer

    trainer = answer(enter)
    assert trainer is REFUSED or isinstance(trainer, lightning.Trainer)


# ---------------------------------------------------------------- regressions
def _meta(*shape):
    return torch.ones(*shape, device="meta")


def _tensor_needing_grad():
    return torch.tensor(3.0, requires_grad=True)


#: Inputs that failed before (the id says how: the exception raised, a wrong result, minutes of
#: work or gigabytes asked for); now a one-line ValueError/TypeError whose message says ``says``,
#: or (None) the right result.
REGRESSIONS = [
    # ampviz.training.gradscaler
    pytest.param(G.build_tiny, (torch.tensor([3.0, -4.0]),), {}, None, "", id="build_tiny-tensor-UserWarning"),
    pytest.param(G.build_tiny, (), {"dtype": torch.int64}, TypeError, "dtype must be torch.float16",
                 id="build_tiny-int-dtype-RuntimeError"),
    pytest.param(G.unscale_overflow_table, (), {"lr": np.float64(1e300)}, ValueError, "lr must be a number from 0",
                 id="unscale_overflow_table-huge-lr-RuntimeError"),
    pytest.param(G.unscale_overflow_table, (), {"grad": [1.0, 2.0, 3.0]}, ValueError, "grad must have the shape",
                 id="unscale_overflow_table-grad-shape-RuntimeError"),
    pytest.param(G.walk_iteration, (), {"growth_factor": 1.0}, ValueError, "growth_factor must be > 1.0",
                 id="walk_iteration-growth_factor-AssertionError"),
    pytest.param(G.walk_iteration, (), {"enabled": False}, TypeError, "unknown GradScaler setting 'enabled'",
                 id="walk_iteration-enabled-AttributeError"),
    pytest.param(G.walk_iteration, (), {"init_scale": 1e300}, ValueError, "init_scale must be within float32",
                 id="walk_iteration-init_scale-RuntimeError"),
    pytest.param(G.walk_iteration, (), {"overflow": True, "weights": []}, ValueError, "at least one number",
                 id="walk_iteration-no-weights-IndexError"),
    pytest.param(G.walk_iteration, (), {"overflow": True, "weights": 3.0}, None, "",
                 id="walk_iteration-one-weight-IndexError"),
    pytest.param(G.walk_iteration, (), {"overflow": torch.ones(2)}, TypeError, "overflow must be True or False",
                 id="walk_iteration-tensor-flag-RuntimeError"),
    pytest.param(G.run_real_scaler, (np.zeros(10**6, bool),), {}, ValueError, "at most 20,000 steps",
                 id="run_real_scaler-a-million-steps-took-minutes"),
    pytest.param(G.same_run, (None, None), {}, TypeError, "a must be a RealRun", id="same_run-None-AttributeError"),
    pytest.param(G.step_table, (None,), {}, TypeError, "run must be a RealRun", id="step_table-None-AttributeError"),
    pytest.param(G.clipping_norms, (), {"unscale_first": torch.ones(2)}, TypeError, "unscale_first must be True",
                 id="clipping_norms-tensor-flag-RuntimeError"),
    pytest.param(G.clipping_table, (_tensor_needing_grad(),), {}, None, "",
                 id="clipping_table-grad-tensor-UserWarning"),
    pytest.param(G.scheduler_report, (), {"gamma": 15041107193867.0}, ValueError, "gamma must be a number >= 0",
                 id="scheduler_report-huge-gamma-RuntimeError"),
    pytest.param(G.scheduler_report, (), {"iterations": 10**9}, ValueError, "iterations must be between 0 and 10,000",
                 id="scheduler_report-a-billion-iterations-took-hours"),
    # ampviz.training
    pytest.param(T.MLP, (), {"width": -1}, ValueError, "width must be between 1", id="MLP-negative-width-RuntimeError"),
    pytest.param(T.build_problem, (0,), {"width": 10**5, "depth": 3}, ValueError, "at most 10,000,000",
                 id="build_problem-ten-billion-weights"),
    pytest.param(T.layer_gradients, (0,), {"loss_scale": torch.ones(2), "depth": 1}, TypeError,
                 "loss_scale must be a number", id="layer_gradients-tensor-scale-RuntimeError"),
    pytest.param(T.torch_dtype, (np.zeros((2, 2)),), {}, TypeError, "dtype must be a torch dtype",
                 id="torch_dtype-array-multi-line-message"),
    pytest.param(T.torch_cast, ([1e300], "fp16"), {}, None, "", id="torch_cast-huge-RuntimeWarning"),
    pytest.param(T.torch_cast, (torch.ones(2, requires_grad=True), "fp16"), {}, None, "",
                 id="torch_cast-grad-tensor-RuntimeError"),
    pytest.param(T.torch_cast, ([1.0], torch.complex64), {}, ValueError, "dtype must be one of",
                 id="torch_cast-complex-UserWarning"),
    pytest.param(T.torch_cast, ([1.0], "float4_e2m1fn_x2"), {}, ValueError, "dtype must be one of",
                 id="torch_cast-float4-NotImplementedError"),
    pytest.param(T.torch_cast_counts, ([1.0], torch.ones(3), "fp16"), {}, TypeError, "scale must be a number",
                 id="torch_cast_counts-tensor-scale-counted-one-value-three-times"),
    pytest.param(T.torch_add, (1, 2, "fp8_e4m3"), {}, ValueError, "dtype must be one of",
                 id="torch_add-fp8-NotImplementedError"),
    pytest.param(T.torch_accumulate, (1.0, 1e-4, 10**9, "fp16"), {}, ValueError, "steps must be between 0",
                 id="torch_accumulate-8-GB-and-an-hour"),
    # ampviz.env
    pytest.param(env.check, (), {"size": "256"}, TypeError, "size must be a whole number",
                 id="check-string-size-reported-fp16-unsupported"),
    pytest.param(env.check, (), {"size": 10**5}, ValueError, "size must be between 1 and 512",
                 id="check-size-40-GB"),
    pytest.param(env.check, (), {"size": 512, "budget_s": 3600}, ValueError, "budget_s must be between 0 and 2",
                 id="check-budget-took-half-a-minute"),
    # ampviz.pitfalls
    pytest.param(P.outcome_of, ("scenario", 5), {}, TypeError, "fn must be a function",
                 id="outcome_of-not-callable-became-the-outcome"),
    pytest.param(AC.summary, (None,), {}, TypeError, "outcome must be an Outcome", id="summary-None-AttributeError"),
    pytest.param(AC.real_lightning, (), {"steps": -1}, ValueError, "steps must be between 1 and 500",
                 id="real_lightning-steps-minus-1-trained-1000-epochs"),
    pytest.param(AC.real_plain, ("conv",), {}, ValueError, "unknown model kind 'conv'",
                 id="real_plain-bad-kind-became-the-outcome"),
    pytest.param(TE.make_data, (-1,), {}, ValueError, "batches must be at least 0",
                 id="make_data-negative-RuntimeError"),
    pytest.param(TE.make_data, (10**6,), {}, ValueError, "at most 100,000 sequences", id="make_data-gigabytes"),
    pytest.param(TE.encoder_call, (), {"mask": "top"}, ValueError, "mask must be one of",
                 id="encoder_call-mask-KeyError"),
    pytest.param(TE.encoder_call, (), {"grad": "off"}, ValueError, "grad must be one of",
                 id="encoder_call-grad-KeyError"),
    pytest.param(TE.encoder_call, (), {"autocast": torch.float32}, ValueError, "autocast must be torch.bfloat16",
                 id="encoder_call-fp32-autocast-UserWarning"),
    pytest.param(TE.encoder_call, (), {"layers": 0, "layer_only": True}, ValueError, "layers must be between 1",
                 id="encoder_call-no-layer-IndexError"),
    pytest.param(TE.EncoderClassifier, (), {"nested": torch.ones(2)}, TypeError, "nested must be True or False",
                 id="EncoderClassifier-tensor-flag-RuntimeError"),
    pytest.param(TE.lightning_run, ("32-true",), {"stage": "tune"}, ValueError, "stage must be one of 'fit'",
                 id="lightning_run-stage-ZeroDivisionError"),
    pytest.param(TE.fix_table, ({},), {}, TypeError, "runs must be a dict", id="fix_table-empty-StopIteration"),
    pytest.param(TE.fix_table, ({"ref": P.Outcome("ref", loss=0.5)},), {}, None, "", id="fix_table-no-dtype-KeyError"),
]


@pytest.mark.parametrize("fn, args, kwargs, error, says", REGRESSIONS)
def test_inputs_that_failed_before(fn, args, kwargs, error, says):
    result = answer(fn, *args, **kwargs)
    if error is None:
        assert result is not REFUSED
        return
    with pytest.raises(error, match=re.escape(says)):
        fn(*args, **kwargs)


def test_regressions_answer_right():
    """The inputs above that now run give what their valid twins give."""
    same = G.build_tiny(torch.tensor([3.0, -4.0]))
    assert same.weight.tolist() == G.build_tiny([3.0, -4.0]).weight.tolist() and same.weight.dtype == torch.float32
    walk = G.walk_iteration(overflow=True, weights=3.0)
    assert math.isinf(walk["backward"].grad[0]) and "skipped" in walk["step"].note
    assert str(G.clipping_table(_tensor_needing_grad())) == str(G.clipping_table(3.0))
    assert T.torch_cast([1e300, -1e300], "fp16").tolist() == [math.inf, -math.inf]  # float32 first, as documented
    assert T.torch_cast(torch.ones(2, requires_grad=True), "fp16").tolist() == [1.0, 1.0]
    table = TE.fix_table({"ref": P.Outcome("ref", loss=0.5), "other": P.Outcome("other", loss=0.5004)})
    assert table.rows == (("ref", "-", "0.50", "yes"), ("other", "-", "0.50", "yes"))


@pytest.mark.parametrize("scale", [math.inf, math.nan])
def test_torch_cast_counts_puts_each_value_in_one_category(scale):
    """A zero at an infinite or NaN scale was counted twice, as "zero" and as "nan" (0 × inf is NaN)."""
    counts = T.torch_cast_counts([0.0, -0.0, 1.0, 1e-30], scale, "fp16")
    assert sum(counts.values()) == 4 and counts["zero"] == 2
    assert counts["nan" if math.isnan(scale) else "overflow"] == 2


def test_step_out_of_range_is_a_value_error_and_an_index_error():
    run = _run()
    for bad in ([run.steps], [-1]):
        with pytest.raises(ValueError, match="outside the run"):
            G.step_table(run, steps=bad)
        with pytest.raises(IndexError):
            G.step_table(run, steps=bad)


def test_checkers_read_a_tensor_answer_and_call_an_unreadable_one_wrong():
    """Before, each of these answers raised: a UserWarning, an OverflowError, a RuntimeError."""
    assert G.check_scale_after_pattern(torch.tensor(65536.0, requires_grad=True)).status == "right"
    assert G.check_scale_after_pattern(65536).status == "right"
    assert G.check_backoffs_to_zero(10**400).status == "wrong"
    assert G.check_clip_before_unscale(_meta(2)).status == "wrong"
    assert G.check_clip_before_unscale(torch.tensor(1 + 2j)).status == "wrong"
    assert G.check_backoffs_to_zero(None).status == "unanswered"


def test_a_torch_device_is_probed_like_its_name():
    """check(torch.device("cpu")) reported autocast as not supported (autocast wants the type name)."""
    by_object = env.check(torch.device("cpu"), size=16, budget_s=0.001)
    by_name = env.check("cpu", size=16, budget_s=0.001)
    assert by_object.device == by_name.device == "cpu"
    assert [p.supported for p in by_object.probes] == [p.supported for p in by_name.probes]
    assert by_object.probe("autocast bf16").supported


def test_quiet_trainer_relays_lightnings_refusals_on_one_line():
    pytest.importorskip("lightning")
    with pytest.raises(ValueError, match="Precision 'fp16' is invalid"):  # Lightning's own words, as before
        with P.quiet_trainer(precision="fp16"):
            pass
    with pytest.raises(ValueError, match="lightning.Trainer refused accelerator='gpu': MisconfigurationException"):
        with P.quiet_trainer(accelerator="gpu"):  # was a MisconfigurationException
            pass
    with pytest.raises(ValueError, match="refused max_time=5: AttributeError"):
        with P.quiet_trainer(max_time=5):  # was an AttributeError
            pass


# ---------------------------------------------------------------- the harness can fail
def test_the_harness_catches_other_errors_multi_line_messages_and_slow_calls():
    with pytest.raises(ZeroDivisionError):
        answer(lambda: 1 / 0)
    with pytest.raises(AssertionError):
        answer(lambda: (_ for _ in ()).throw(ValueError("two\nlines")))
    with pytest.raises(AssertionError):
        answer(lambda: (_ for _ in ()).throw(TypeError("")))
    with pytest.raises(TookTooLong), time_limit(0.05):
        time.sleep(1)
    assert answer(lambda: (_ for _ in ()).throw(ValueError("x must be 1, got 2"))) is REFUSED
    assert answer(lambda: 5) == 5


def test_the_core_comparison_can_fail():
    """A plausible wrong answer (the bf16 rounding for fp16, a census at another scale) is caught."""
    x = [1 + 2**-9, 65520.0]  # fp16 keeps 1 + 2**-9 and overflows 65520; bf16 rounds both
    torch_result = T.torch_cast(x, "fp16")
    assert torch_result.tolist() == [1 + 2**-9, math.inf]
    assert _same_as_core("fp16", lambda name: FORMATS[name].quantize(x), torch_result)
    assert not _same_as_core("fp16", lambda name: FORMATS["bf16"].quantize(x), torch_result)
    counts = T.torch_cast_counts([1e-30, 1.0], 1.0, "fp16")
    assert _same_as_core("fp16", lambda name: census([1e-30, 1.0], name, 1.0).counts, counts)
    assert not _same_as_core("fp16", lambda name: census([1e-30, 1.0], name, 2.0**-30).counts, counts)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py
