"""Arbitrary input for every public function of ampviz.formats, ampviz.formats.census, ampviz.explain and
ampviz.training.doctor.examine: the answer is right (torch's own cast, torch's multiply-and-cast, the
brute-force census, the nearest value of the format) or one ValueError/TypeError with a one-line
message, never another exception."""

import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from torch import nn

from ampviz.formats.census import CensusResult, Profile, census, census_reference, profile, underflow_fractions
from ampviz.training.doctor import Diagnosis, examine
from ampviz.explain import KNOWN, Explanation, explain
from ampviz.formats import CATEGORIES, FORMATS, FloatFormat, get_format

FUZZ = settings(max_examples=150, deadline=None)
TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
                "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
BIT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def one_clear_error(exc: BaseException):
    assert isinstance(exc, (ValueError, TypeError)), f"{type(exc).__name__}: {exc}"
    message = str(exc)
    assert message.strip() and "\n" not in message, repr(message)


def outcome(fn, *args, **kwargs):
    """(result, None) or (None, the exception), after checking that an exception is a clear one."""
    try:
        return fn(*args, **kwargs), None
    except Exception as exc:  # the property under test: which exceptions come out
        one_clear_error(exc)
        return None, exc


def same(a, b) -> bool:
    """Bit-identical float64 values (NaN equals NaN; -0.0 differs from 0.0)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a.shape == b.shape and bool(np.all((a.view(np.int64) == b.view(np.int64)) | (np.isnan(a) & np.isnan(b))))


# ---------------------------------------------------------------- inputs
small_shapes = hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=5)
real_dtypes = st.one_of(hnp.floating_dtypes(sizes=(16, 32, 64)), hnp.integer_dtypes(), hnp.unsigned_integer_dtypes(),
                        hnp.boolean_dtypes())
real_arrays = hnp.arrays(real_dtypes, small_shapes)


@st.composite
def real_tensors(draw):
    arr = draw(hnp.arrays(st.sampled_from([np.float32, np.float64, np.int32, np.bool_]), small_shapes))
    t = torch.from_numpy(np.array(arr))
    dtype = draw(st.sampled_from([None, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2,
                                  torch.float32, torch.float64]))
    if dtype is not None:
        t = t.to(dtype)
    if t.is_floating_point() and t.element_size() > 1 and draw(st.booleans()):
        t = t.requires_grad_()
    return t


real_python = st.one_of(
    st.floats(), st.integers(), st.booleans(), st.fractions(),
    st.lists(st.one_of(st.floats(width=32), st.integers(-(2**80), 2**80)), max_size=5),
    st.lists(st.lists(st.floats(), min_size=2, max_size=2), max_size=3),
)
junk = st.one_of(
    st.none(), st.text(max_size=4), st.binary(max_size=4), st.complex_numbers(),
    st.lists(st.one_of(st.none(), st.text(max_size=2), st.complex_numbers()), min_size=1, max_size=3),
    hnp.arrays(st.one_of(hnp.complex_number_dtypes(), hnp.datetime64_dtypes(), hnp.timedelta64_dtypes(),
                         hnp.unicode_string_dtypes(), hnp.byte_string_dtypes()), small_shapes),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2), st.sets(st.integers(), max_size=2),
    st.just(torch.ones(2, dtype=torch.complex64)), st.just(torch.ones(2, device="meta")),
    st.just(object()), st.decimals(allow_nan=False),
)
#: ("real", numbers that must be accepted) or ("junk", what must be refused) or ("any", either).
inputs = st.one_of(
    st.tuples(st.just("real"), st.one_of(real_arrays, real_tensors(), real_python)),
    st.tuples(st.just("junk"), junk),
    st.tuples(st.just("any"), st.one_of(
        st.sampled_from([tuple, frozenset, slice, type, Decimal, Fraction]).flatmap(st.from_type),
        st.builds(range, st.integers(-5, 5), st.integers(-5, 50)))),  # (from_type's ranges can be huge)
)


def torch_values(x) -> torch.Tensor:
    """x as the tensor torch would cast: a tensor itself; numpy's reading of anything else (Python
    numbers numpy keeps as objects, e.g. ints beyond 64 bits, through float64, inf beyond it)."""
    if isinstance(x, torch.Tensor):
        return x.detach()
    arr = np.asarray(x)
    if arr.dtype == object:
        flat = [float(v) if abs(v) < 2**1024 else math.copysign(math.inf, v) for v in arr.reshape(-1)]
        arr = np.array(flat, np.float64).reshape(arr.shape)
    if arr.dtype.kind in "iu":  # numpy's other name for a 64-bit integer (2**63 reads as "ulonglong"),
        arr = arr.astype(arr.dtype.str)  # which torch refuses, becomes the canonical one
    # native byte order, C order (ascontiguousarray would make a 0-d array 1-d)
    return torch.from_numpy(np.array(arr, dtype=arr.dtype.newbyteorder("="), order="C"))


def torch_cast(x, name) -> np.ndarray:
    return torch_values(x).to(TORCH_DTYPES[name]).to(torch.float64).numpy()


def categories(x, fmt) -> np.ndarray:
    """The category of each value, from torch's cast (and, for a saturating format, from where the
    float32 value lies against the overflow boundary)."""
    v = torch_values(x)
    orig = v.to(torch.float64).numpy()
    v32 = np.abs(v.to(torch.float32).to(torch.float64).numpy())
    q = np.abs(torch_cast(x, fmt.name))
    cat = np.full(q.shape, "normal", dtype=object)
    cat[q < fmt.smallest_normal] = "subnormal"
    cat[(q == 0) & (orig != 0)] = "underflow"
    cat[orig == 0] = "zero"
    over = np.isinf(v32) | (v32 > fmt.overflow_boundary) | ((v32 == fmt.overflow_boundary) & (fmt.specials == "ieee"))
    cat[over] = "overflow"
    cat[np.isnan(orig)] = "nan"
    return cat.astype(str)


def torch_bits(x, name) -> np.ndarray:
    t = torch_values(x).to(TORCH_DTYPES[name])
    size = t.element_size()
    return t.view(BIT_VIEW[size]).to(torch.int64).numpy() & ((1 << (8 * size)) - 1)


# ---------------------------------------------------------------- formats
@FUZZ
@given(tagged=inputs, name=st.sampled_from(sorted(TORCH_DTYPES)))
@example(tagged=("real", 2**63), name="bf16")  # numpy reads it as a "ulonglong" array, which torch refused
def test_value_methods_agree_with_torch_or_refuse(tagged, name):
    kind, x = tagged
    fmt = FORMATS[name]
    q, err = outcome(fmt.quantize, x)
    assert (err is None) == (kind != "junk") or kind == "any", (kind, x, err)
    if err is not None:
        for method in (fmt.classify, fmt.classify_codes, fmt.encode):  # refused alike
            assert type(outcome(method, x)[1]) is type(err)
        return
    ref = torch_cast(x, name)
    assert same(q, ref), (x, q, ref)
    assert isinstance(q, float) == (ref.ndim == 0)
    codes = fmt.classify_codes(x)
    assert np.array_equal(np.asarray(fmt.classify(x)), np.array(CATEGORIES)[codes])
    assert np.array_equal(np.array(CATEGORIES)[codes], categories(x, fmt))
    keep = ~np.isnan(ref)
    assert np.array_equal(np.asarray(fmt.encode(x))[keep], torch_bits(x, name)[keep])


@FUZZ
@given(tagged=inputs, name=st.sampled_from(sorted(FORMATS)))
def test_neighbours_and_ulp_of_one_number_or_refuse(tagged, name):
    kind, x = tagged
    fmt = FORMATS[name]
    pair, err = outcome(fmt.neighbours, x)
    ulp, err2 = outcome(fmt.ulp, x)
    assert (err is None) == (err2 is None)
    if err is not None:
        return
    q = float(np.asarray(fmt.quantize(x)).reshape(()))
    lo, hi = pair
    if math.isnan(q):
        assert math.isnan(lo) and math.isnan(hi) and math.isnan(ulp)
        return
    if math.isinf(q):
        assert (lo, hi) in ((fmt.max, q), (q, -fmt.max)) and math.isnan(ulp)
        return
    if abs(q) == fmt.max and fmt.specials == "fn":  # nothing beyond max: NaN, as documented
        assert math.isnan(hi if q > 0 else lo)
        lo, hi = (lo, math.inf) if q > 0 else (-math.inf, hi)
    assert lo < q < hi or (q == 0 and lo < 0 < hi)
    if 0 <= q < fmt.max:
        assert hi - q == ulp == fmt.quantize(hi) - q  # the next value up, one ulp away
    for v in (lo, hi):
        assert math.isnan(v) or math.isinf(v) or fmt.quantize(v) == v


PATTERN_NAMES = sorted(name for name, dt in TORCH_DTYPES.items() if torch.finfo(dt).bits <= 16)


def pattern_value(name, k: int) -> float:
    dt = TORCH_DTYPES[name]
    size = torch.finfo(dt).bits // 8
    t = torch.tensor([k], dtype=torch.int64).to(torch.int32).to(BIT_VIEW[size]) if size == 2 else \
        torch.tensor([k], dtype=torch.int64).to(torch.uint8)
    return float(t.view(dt).to(torch.float64))


@FUZZ
@given(bits=st.one_of(st.integers(-5, 70_000), st.integers(), st.floats(), st.lists(st.integers(0, 255), max_size=4),
                      real_arrays, junk),
       name=st.sampled_from(PATTERN_NAMES))
def test_decode_and_fields_read_patterns_like_torch_or_refuse(bits, name):
    fmt = FORMATS[name]
    values, err = outcome(fmt.decode, bits)
    fields, err2 = outcome(fmt.fields, bits)
    assert (err is None) == (err2 is None)
    if err is not None:
        return
    ks = np.asarray(torch_values(bits).to(torch.float64).numpy()).astype(np.int64).reshape(-1)
    expected = [pattern_value(name, int(k)) for k in ks]
    assert same(np.asarray(values).reshape(-1), expected)
    sign, exp, man = (np.asarray(f).reshape(-1) for f in fields)
    assert np.array_equal((sign << (fmt.bits - 1)) | (exp << fmt.mantissa_bits) | man, ks)


@FUZZ
@given(fmt=st.one_of(st.sampled_from(sorted(FORMATS)), st.sampled_from([torch.float16, torch.bfloat16, torch.int8]),
                     st.text(max_size=8), junk, st.integers()))
def test_get_format_or_refuse(fmt):
    got, err = outcome(get_format, fmt)
    assert err is not None or got in FORMATS.values()


def nearest_reference(fmt: FloatFormat, x32: np.ndarray) -> np.ndarray:
    """Round to nearest, ties to the even pattern, over the decoded table of every pattern (the
    slot above max stands for overflow: inf in "ieee", saturation to max in "fn")."""
    n = 1 << (fmt.bits - 1)
    vals = np.asarray(fmt.decode(np.arange(n)), np.float64)  # the positive patterns, in increasing order
    finite = vals[np.isfinite(vals)]
    top = finite[-1]
    grid = np.append(finite, top + fmt.ulp(top))
    a = np.abs(x32.astype(np.float64))
    i = np.clip(np.searchsorted(grid, a), 1, grid.size - 1)
    lo, hi = grid[i - 1], grid[i]
    pick_hi = (a - lo > hi - a) | ((a - lo == hi - a) & (i % 2 == 0))
    k = np.where(pick_hi, i, i - 1)
    k = np.where(a <= grid[0], 0, k)
    q = grid[np.minimum(k, grid.size - 1)]
    over = (k == grid.size - 1) | np.isinf(a)
    q = np.where(over, np.inf if fmt.specials == "ieee" else top, q)
    q = np.where(np.isnan(a), np.nan, q)
    return np.copysign(q, x32.astype(np.float64))


@FUZZ
@given(name=st.one_of(st.text(max_size=3), st.none()),
       e=st.one_of(st.integers(0, 9), st.integers(), st.floats(), st.booleans(), st.none()),
       m=st.one_of(st.integers(-1, 24), st.integers(), st.floats(), st.none()),
       bias=st.one_of(st.integers(-130, 160), st.integers(), st.floats(), st.none()),
       specials=st.sampled_from(["ieee", "fn", "fnuz", None, 1]),
       x=hnp.arrays(np.float32, 64, elements=st.floats(width=32)))
def test_any_format_that_is_made_rounds_to_its_nearest_value(name, e, m, bias, specials, x):
    fmt, err = outcome(FloatFormat, name, e, m, bias, specials)
    if err is not None:
        return
    smallest = fmt.decode(1)
    assert smallest == fmt.smallest_subnormal and np.float32(smallest) == smallest  # in float32's range
    assert np.float32(fmt.max) == fmt.max and fmt.max == fmt.decode(fmt.encode(fmt.max))
    if fmt.bits > 16:  # the table would be too long to build here
        return
    top = 1 << (fmt.bits - 1)
    vals = np.asarray(fmt.decode(np.arange(top)), np.float64)
    assert np.nanmax(vals[np.isfinite(vals)]) == fmt.max
    mids = (vals[np.isfinite(vals)][1:] + vals[np.isfinite(vals)][:-1]) / 2  # every tie
    x = np.concatenate([x, np.float32(vals[np.isfinite(vals)]), np.float32(mids),
                        np.float32([fmt.overflow_boundary, fmt.underflow_boundary, np.inf, -np.inf, np.nan])])
    assert same(fmt.quantize(x), nearest_reference(fmt, x))


# ---------------------------------------------------------------- census
scales = st.one_of(st.floats(min_value=1e-30, max_value=1e30), st.integers(1, 2**20).map(lambda k: 2.0 ** (k % 60 - 30)),
                   st.floats(), st.integers(), junk, st.just(torch.tensor(8.0, requires_grad=True)),
                   st.lists(st.floats(0.5, 4), min_size=0, max_size=2))


def torch_counts(v32: np.ndarray, name: str, s32: np.float32) -> dict:
    """Categories of (v * scale).to(dtype) as torch computes them, on float32 values."""
    p = (torch.from_numpy(v32) * torch.tensor(s32)).numpy()
    x = np.where(v32 == 0, np.float32(0), p)  # a zero stays "zero"
    cat = categories(torch.from_numpy(x.astype(np.float32)), FORMATS[name]) if v32.size else np.zeros(0, str)
    cat = np.where((v32 != 0) & (p == 0) & ~np.isnan(v32), "underflow", cat)
    return {c: int((cat == c).sum()) for c in CATEGORIES}


@FUZZ
@given(tagged=inputs, fmt=st.one_of(st.sampled_from(sorted(FORMATS)), junk), scale=scales)
def test_census_counts_like_torch_or_refuses(tagged, fmt, scale):
    kind, x = tagged
    result, err = outcome(census, x, fmt, scale)
    ref, err_ref = outcome(census_reference, x, fmt, scale)
    assert type(err) is type(err_ref)
    if err is not None:
        return
    assert isinstance(result, CensusResult) and result == ref
    v32 = torch_values(x).to(torch.float32).reshape(-1).numpy()
    assert result.total == v32.size == sum(result.counts.values())
    if result.fmt.name in TORCH_DTYPES:
        assert result.counts == torch_counts(v32, result.fmt.name, np.float32(result.scale))
    p = profile(x)
    assert isinstance(p, Profile) and census(p, fmt, scale) == result
    fractions = underflow_fractions(x, fmt, [result.scale, 1.0])
    assert fractions.tolist() == [result.fractions["underflow"], census(x, fmt, 1.0).fractions["underflow"]]


@FUZZ
@given(tagged=inputs, scale_list=st.one_of(
    st.lists(st.one_of(st.floats(), st.integers(-5, 2**30), st.just(torch.tensor(4.0, requires_grad=True))), max_size=3),
    st.floats(), junk))
def test_profile_and_underflow_fractions_or_refuse(tagged, scale_list):
    kind, x = tagged
    p, err = outcome(profile, x)
    assert (err is None) == (kind != "junk") or kind == "any"
    if err is not None:
        return
    got, err = outcome(underflow_fractions, x, "fp16", scale_list)
    each = [outcome(census, p, "fp16", s) for s in (scale_list if isinstance(scale_list, list) else [scale_list])]
    if any(e is not None for _, e in each):  # a scale census refuses: so does underflow_fractions
        assert err is not None
        return
    assert got.tolist() == [c.fractions["underflow"] for c, _ in each]


# ---------------------------------------------------------------- explain
KNOWN_MESSAGES = [
    ("AssertionError", "Attempted step but _scale is None.  This may indicate your script did not use "
                       "scaler.scale(loss or outputs) earlier in the iteration."),
    ("RuntimeError", "unscale_() has already been called on this optimizer since the last update()."),
    ("ValueError", "Attempting to unscale FP16 gradients."),
    ("RuntimeError", "element 0 of tensors does not require grad and does not have a grad_fn"),
]
TYPES = {"AssertionError": AssertionError, "RuntimeError": RuntimeError, "ValueError": ValueError}


class BrokenStr(RuntimeError):
    def __str__(self):
        raise ValueError("no message for you")


def is_known(exc) -> bool:
    names = {c.__name__ for c in type(exc).__mro__}
    try:
        text = str(exc)
    except Exception:  # a broken __str__: its args are the message
        text = " ".join(map(str, exc.args))
    return any(names & set(types) and pattern.search(text) for types, pattern, _ in KNOWN)


def reachable(exc) -> list:
    seen, stack, out = set(), [exc], []
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        out.append(e)
        stack.extend(getattr(e, "exceptions", ()))
        if e.__cause__ is not None:
            stack.append(e.__cause__)
        if e.__context__ is not None and not e.__suppress_context__:
            stack.append(e.__context__)
    return out


@st.composite
def exception_graphs(draw):
    """A few exceptions, some with known messages, linked by causes, contexts (cycles too) and groups."""
    n = draw(st.integers(1, 5))
    nodes = []
    for _ in range(n):
        if draw(st.booleans()):
            type_name, message = draw(st.sampled_from(KNOWN_MESSAGES))
            cls = TYPES[type_name]
        else:
            cls, message = draw(st.sampled_from([RuntimeError, ValueError, KeyError, BrokenStr])), draw(st.text(max_size=20))
        nodes.append(cls(message))
    for e in nodes:
        e.__cause__ = draw(st.one_of(st.none(), st.sampled_from(nodes)))
        e.__context__ = draw(st.one_of(st.none(), st.sampled_from(nodes)))
        e.__suppress_context__ = draw(st.booleans())
    if draw(st.booleans()):
        members = draw(st.lists(st.sampled_from(nodes), min_size=1, max_size=3))
        nodes.append(ExceptionGroup("group", members))
    return nodes[-1]


@FUZZ
@given(exc=exception_graphs())
def test_explain_finds_any_reachable_known_error_and_never_raises(exc):
    e = explain(exc)
    assert isinstance(e, Explanation)
    assert e.known == any(is_known(x) for x in reachable(exc))


@FUZZ
@given(x=st.one_of(st.text(), st.sampled_from([m for _, m in KNOWN_MESSAGES]), junk, st.integers(), real_arrays))
def test_explain_takes_a_message_or_refuses(x):
    e, err = outcome(explain, x)
    if isinstance(x, (str, bytes)):
        assert isinstance(e, Explanation)
    else:
        assert err is not None


# ---------------------------------------------------------------- doctor.examine
class Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x), x


with torch.random.fork_rng(devices=[]):
    torch.manual_seed(0)
    MODELS = [nn.Linear(4, 3), nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)), nn.ReLU(), Pair(),
              nn.Linear(4, 3).requires_grad_(False)]
tensors = st.one_of(
    st.builds(lambda n, k: torch.randn(n, k), st.integers(0, 4), st.sampled_from([3, 4, 5])),
    st.builds(lambda n: torch.randint(0, 5, (n,)), st.integers(0, 4)),
    st.sampled_from([torch.full((2, 4), float("nan")), torch.full((2, 4), 1e30), torch.zeros(2, 4, dtype=torch.bool)]),
)
batches = st.one_of(
    tensors, st.none(), junk,
    st.lists(st.one_of(tensors, st.none(), st.integers(), st.tuples(tensors)), min_size=0, max_size=3),
    st.tuples(st.one_of(tensors, st.tuples(tensors), st.none(), st.text(max_size=2)), st.one_of(tensors, st.none(), junk)),
)
loss_fns = st.sampled_from([None, lambda out, t: out.float().sum() if isinstance(out, torch.Tensor) else out[0].sum(),
                            lambda out, t: out, lambda out, t: 2.0, "mean"])


@settings(max_examples=120, deadline=None)
@given(model=st.one_of(st.sampled_from(MODELS), junk), batch=batches, loss_fn=loss_fns,
       fmt=st.one_of(st.sampled_from(["fp16", "bf16", "fp8_e4m3"]), junk))
def test_examine_diagnoses_or_refuses(model, batch, loss_fn, fmt):
    d, err = outcome(examine, model, batch, loss_fn, fmt=fmt)
    for m in MODELS:
        assert not any(mod._forward_hooks for mod in m.modules()) and all(p.grad is None for p in m.parameters())
    if err is not None:
        return
    assert isinstance(d, Diagnosis)
    every = np.concatenate(list(d.grads.values()))
    assert d.total == every.size and d.nonfinite == int((~np.isfinite(every)).sum())
    assert 0 <= d.lost <= 1 and str(d)
    if d.nonfinite == d.total:
        assert "every gradient is 0" not in str(d)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py
