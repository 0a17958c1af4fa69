"""ampviz.explain on real exceptions and warnings, raised by real torch code."""

import warnings

import pytest
import torch
import torch.nn.functional as F

from ampviz.explain import explain


def raised(fn):
    try:
        fn()
    except Exception as exc:  # the exception is the test's input
        return exc
    raise AssertionError("expected an exception")


def warned(fn, category):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    hits = [w for w in caught if issubclass(w.category, category)]
    assert hits, f"expected a {category.__name__}"
    return hits[0]


def setup(dtype=torch.float32):
    p = torch.nn.Parameter(torch.ones(2, dtype=dtype))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    return p, opt, scaler


def backward_scaled(p, scaler):
    scaler.scale((p.float() ** 2).sum()).backward()


def unscale_twice():
    p, opt, s = setup()
    backward_scaled(p, s)
    s.unscale_(opt)
    s.unscale_(opt)


def unscale_after_step():
    p, opt, s = setup()
    backward_scaled(p, s)
    s.step(opt)
    s.unscale_(opt)


def step_twice():
    p, opt, s = setup()
    backward_scaled(p, s)
    s.step(opt)
    s.step(opt)


def update_without_step():
    p, opt, s = setup()
    backward_scaled(p, s)
    s.update()


def step_without_grads():
    p, opt, s = setup()
    s.scale(torch.ones(()))
    s.step(opt)


def fp16_grads():
    p, opt, s = setup(torch.float16)
    backward_scaled(p, s)
    s.unscale_(opt)


def closure():
    p, opt, s = setup()
    backward_scaled(p, s)
    s.step(opt, closure=lambda: 0.0)


def new_scale_with_grad():
    p, opt, s = setup()
    backward_scaled(p, s)
    s.update(torch.ones((), requires_grad=True))


def pickle_mid_iteration():
    import copy

    p, opt, s = setup()
    backward_scaled(p, s)
    s.unscale_(opt)
    copy.deepcopy(s)


def transformer_fast_path():
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    enc = torch.nn.TransformerEncoder(layer, 2).eval()
    x = torch.randn(2, 5, 16)
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested tensors are a prototype: torch says so
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            enc(x, src_key_padding_mask=mask)


@pytest.mark.parametrize("make, title", [
    (lambda: setup()[2].step(setup()[1]), "GradScaler was used before scaler.scale(...) ran"),
    (unscale_twice, "unscale_ called twice in one iteration"),
    (unscale_after_step, "unscale_ called after step"),
    (step_twice, "step called twice without update"),
    (update_without_step, "update() with no inf check recorded"),
    (step_without_grads, "step() found no gradients for this optimizer"),
    (fp16_grads, "fp16 weights with GradScaler"),
    (closure, "optimizer closure with GradScaler"),
    (lambda: torch.amp.GradScaler("cpu", growth_factor=1.0), "invalid GradScaler factor"),
    (lambda: torch.amp.GradScaler("cpu", backoff_factor=1.0), "invalid GradScaler factor"),
    (transformer_fast_path, "nn.TransformerEncoder fast path under autocast"),
    (lambda: torch._addmm_activation(torch.ones(4), torch.ones(2, 3, dtype=torch.bfloat16), torch.ones(3, 4)),
     "a matrix multiply got two dtypes"),
    (lambda: F.linear(torch.ones(2, 3, dtype=torch.bfloat16), torch.ones(4, 3)), "a matrix multiply got two dtypes"),
    (lambda: torch.tensor(1.0).backward(), "the loss has no graph"),
    (new_scale_with_grad, "update(new_scale) with a tensor it refuses"),
    (lambda: torch.amp.GradScaler("cpu").load_state_dict({}), "loading an empty GradScaler state"),
    (pickle_mid_iteration, "pickling GradScaler mid-iteration"),
    (lambda: torch.amp.GradScaler("cpu").scale(1.0), "scaler.scale() got something that is not a tensor"),
])
def test_real_errors_are_explained(make, title):
    exc = raised(make)
    e = explain(exc)
    assert e.known and e.title == title, (type(exc).__name__, str(exc))
    assert e.cause and e.fix and title in str(e)


def scheduler_before_optimizer():
    p = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([p], lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    sched.step()


def test_real_warnings_are_explained():
    w = warned(scheduler_before_optimizer, UserWarning)
    assert explain(w).title == "scheduler stepped before the optimizer"
    w = warned(lambda: torch.cuda.amp.GradScaler(), FutureWarning)
    assert explain(w).title == "deprecated GradScaler import"
    if not torch.cuda.is_available():
        w = warned(lambda: torch.amp.GradScaler(), UserWarning)
        assert explain(w).title == "GradScaler disabled itself"


def test_cuda_bf16_unscale_message():
    """This one needs CUDA to happen; the message is torch's dispatch error as CUDA prints it."""
    exc = RuntimeError('"_amp_foreach_non_finite_check_and_unscale_cuda" not implemented for \'BFloat16\'')
    assert explain(exc).title == "GradScaler with bf16 gradients on CUDA"


def test_unknown_errors_are_said_to_be_unknown():
    e = explain(raised(lambda: 1 / 0))
    assert not e.known and "not an AMP error ampviz knows" in e.title
    e = explain(raised(lambda: torch.ones(2) @ torch.ones(3)))  # a shape error, not AMP
    assert not e.known


# ---------------------------------------------------------------- chains, groups, strings, broken exceptions
NO_SCALE = "GradScaler was used before scaler.scale(...) ran"


def step_before_scale():
    p, opt, s = setup()
    s.step(opt)  # AssertionError: Attempted step but _scale is None ...


def wrapped_by_cause():
    try:
        step_before_scale()
    except AssertionError as exc:
        raise RuntimeError("training failed at step 0") from exc


def wrapped_by_context():
    try:
        step_before_scale()
    except AssertionError:
        raise RuntimeError("the training loop crashed while reporting an error")


def wrapped_twice():
    try:
        wrapped_by_cause()
    except RuntimeError as exc:
        raise ValueError("epoch 3 failed") from exc


def in_a_group():
    errors = [raised(lambda: 1 / 0), raised(step_before_scale)]
    raise ExceptionGroup("two ranks failed", errors)


def in_a_nested_group():
    try:
        in_a_group()
    except ExceptionGroup as group:
        raise ExceptionGroup("the run failed", [ValueError("config"), RuntimeError("shutdown")]) from group


def context_suppressed():
    try:
        step_before_scale()
    except AssertionError:
        raise RuntimeError("something else") from None


@pytest.mark.parametrize("make", [wrapped_by_cause, wrapped_by_context, wrapped_twice, in_a_group, in_a_nested_group])
def test_a_known_error_is_found_as_cause_context_or_group_member(make):
    exc = raised(make)
    assert type(exc) is not AssertionError  # the premise: the known error is not the outer one
    assert explain(exc).title == NO_SCALE


def test_a_suppressed_context_is_not_looked_at_as_a_traceback_hides_it():
    exc = raised(context_suppressed)
    assert exc.__context__ is not None and exc.__suppress_context__
    assert not explain(exc).known


def test_the_outermost_known_error_wins():
    try:
        try:
            step_before_scale()
        except AssertionError as inner:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().") \
                from inner
    except RuntimeError as exc:
        outer = exc
    assert explain(outer).title == "unscale_ called twice in one iteration"


def test_cycles_in_the_chain_end():
    a, b = RuntimeError("a"), ValueError("b")
    a.__context__, b.__context__ = b, a
    assert not explain(a).known
    known = raised(step_before_scale)
    c = RuntimeError("c")
    c.__cause__, known.__context__ = known, c
    assert explain(c).title == NO_SCALE


def test_a_message_string_is_explained():
    exc = raised(step_before_scale)
    assert explain(str(exc)).title == NO_SCALE
    assert explain(f"AssertionError: {exc}").title == NO_SCALE  # the last line of a traceback
    assert explain(str(raised(unscale_twice))).title == "unscale_ called twice in one iteration"
    e = explain("CUDA out of memory")
    assert not e.known and "not an AMP error ampviz knows" in e.title


class BrokenStr(AssertionError):
    def __str__(self):
        raise RuntimeError("__str__ is broken")


class NotAString(RuntimeError):
    def __str__(self):
        return 42


def test_an_exception_whose_str_breaks_never_raises():
    e = explain(BrokenStr(str(raised(step_before_scale))))  # the message is still in its args
    assert e.title == NO_SCALE
    assert not explain(BrokenStr()).known
    assert not explain(NotAString("x")).known
    wrapper = RuntimeError("outer")
    wrapper.__cause__ = BrokenStr()
    assert not explain(wrapper).known


@pytest.mark.parametrize("bad", [None, 42, ["error"], RuntimeError])
def test_what_is_not_an_exception_is_one_clear_type_error(bad):
    with pytest.raises(TypeError, match="explain takes an exception, a warning or a message string") as info:
        explain(bad)
    assert "\n" not in str(info.value)
