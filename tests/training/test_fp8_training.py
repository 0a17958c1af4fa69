"""ampviz.training.fp8_training against torchao 0.18 on the CPU: every FP8 cast its Float8Linear makes in a
forward and backward pass, recorded, equals the package's own current scaling bit for bit (scales as
float32, FP8 codes, and the saturated / clamped / underflowed / subnormal counts), for the tensorwise
and rowwise recipes, on seeded data with tiny and huge values; two plausible wrong rules are caught;
and short FP8 training runs of the beam model are seeded, finite and learn.

The torchao tests skip without torchao, except under CI=true, where they fail."""

import sys

import numpy as np
import pytest
import torch
from torch import nn

from ampviz.formats import FP8_E4M3, FP8_E5M2
from ampviz.formats.fp8 import current_scale
from ampviz.formats.fp8.current import _pow2_floor_torchao
from ampviz.training.fp8_training import (GEMMS, RECIPES, ROLES, TRAIN_MODES, CastCounts, cast_counts,
                                          _torch_counts, record_fp8_casts, reference_cast, train_fp8)
from ampviz.training.live import build_task

F32 = np.float32
STEPS = 50
TORCH_DTYPE = {FP8_E4M3: torch.float8_e4m3fn, FP8_E5M2: torch.float8_e5m2}


@pytest.fixture(scope="module")
def ao(torchao_modules):
    """torchao's float8 modules; skipped without torchao, a failure under CI=true."""
    return torchao_modules("torchao.float8.float8_linear", "torchao.float8.float8_training_tensor")


# ---------------------------------------------------------------- the seeded data
def one_step_past(lo: float = 20000.0) -> float:
    """A float32 amax v > lo whose current scale puts it one float32 step past 448: f32(v * f32(448 / v))."""
    for k in range(1, 1000):
        v = F32(lo) + F32(k) * F32(2**-4)
        if F32(v * F32(np.float64(448) / np.float64(v))) > F32(448):
            return float(v)
    raise AssertionError("no such amax near lo")


def problem(seed: int = 0):
    """A two-layer model and a batch whose casts underflow, meet torchao's EPS floor, and clamp:

    * inputs of log-uniform magnitude, 1e-16 to 1e3, so many values lie far below their tensor's
      and their row's amax;
    * rows 0-3 of the input, and output unit 3's weights of the first layer, scaled below 1e-18:
      under the EPS floor (amax clamped up to 1e-12) their scale cannot lift them, and they vanish;
    * row 4 holds five copies of the float32 just above 3.5: its scale, 448 / 3.5000002, lies just
      below 2**7, and torchao's power-of-two rounding takes it *up* to 128 (rowwise clamps them);
    * row 5 holds the tensor's amax four times, an amax whose product lands one float32 step past 448
      (tensorwise clamps them)."""
    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    with torch.no_grad():
        model[0].weight[3] *= 1e-20
    mag = 10.0 ** (torch.rand(64, 16, generator=g, dtype=torch.float64) * 19 - 16)
    x = (torch.randn(64, 16, generator=g, dtype=torch.float64) * mag).float()
    x[:4] *= 1e-20 / x[:4].abs().amax(dim=1, keepdim=True)
    x[4, :5] = float(np.nextafter(F32(3.5), F32(np.inf)))
    x[4, 5:] = x[4, 5:].clamp(-3, 3)
    v = one_step_past()
    x[5, :4] = torch.tensor([v, v, v, -v])
    assert float(x.abs().max()) == v
    return model, (x, torch.randn(64, 8, generator=g))


def tiny_loss(output, targets):
    """A loss whose gradients are all below 1e-12 (as an unscaled loss in m^2 can make them)."""
    return 1e-30 * nn.functional.mse_loss(output, targets)


@pytest.fixture(scope="module")
def records(ao):
    """The casts of the seeded problem, per recipe, with the plain loss and the tiny one."""
    model, batch = problem()
    return {(recipe, kind): record_fp8_casts(model, batch, recipe, loss=loss)
            for recipe in RECIPES for kind, loss in (("plain", None), ("tiny", tiny_loss))}


def same_bits(a, b) -> bool:
    a, b = np.asarray(a, F32), np.asarray(b, F32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def agrees(cast, scale, counts) -> bool:
    return same_bits(cast.scale, scale) and cast.counts == counts


# ---------------------------------------------------------------- what is recorded
@pytest.mark.parametrize("recipe", RECIPES)
def test_six_casts_per_layer_with_torchaos_formats_and_axes(records, recipe):
    """Each layer: input and weight for the output, grad_output and weight for grad_input, grad_output
    and input for grad_weight; tensorwise in E4M3 with grad_output in E5M2, rowwise all E4M3 with
    power-of-two scales along the axes torchao picks."""
    rec = records[(recipe, "plain")]
    assert rec.layers == ("0", "2")
    assert len(rec.casts) == 12
    axes = {("input", "output"): -1, ("weight", "output"): 0, ("grad_output", "grad_input"): -1,
            ("weight", "grad_input"): -1, ("grad_output", "grad_weight"): 0, ("input", "grad_weight"): 0}
    for layer in rec.layers:
        assert sorted((c.role, c.gemm) for c in rec.select(layer)) == sorted(axes)
    for c in rec.casts:
        assert c.role in ROLES and c.gemm in GEMMS
        if recipe == "tensorwise":
            assert c.axis is None and not c.pow2 and c.scale.shape == ()
            assert c.fmt == (FP8_E5M2 if c.role == "grad_output" else FP8_E4M3)
        else:
            assert c.axis == axes[(c.role, c.gemm)] and c.pow2 and c.fmt == FP8_E4M3
            assert c.scale.shape == tuple(1 if d == c.axis % c.hp.ndim else n for d, n in enumerate(c.hp.shape))
        for a in (c.hp, c.scale, c.data, c.codes):
            assert not a.flags.writeable
    # the high-precision tensors are the layer's own: its input, its weight transposed
    model, (x, _) = problem()
    first = rec.select("0", "input", "output")[0]
    assert np.array_equal(first.hp, x.numpy()) and first.hp_dtype == "float32"
    assert np.array_equal(rec.select("0", "weight", "output")[0].hp, model[0].weight.detach().numpy().T)


def test_the_model_and_torchao_are_left_alone(ao):
    """A copy is converted; the wrapped function is put back, also when the pass fails."""
    fl, _ = ao
    real = fl.hp_tensor_to_float8_dynamic
    model, batch = problem()
    before = [p.detach().clone() for p in model.parameters()]

    def broken(output, targets):
        raise RuntimeError("a loss that fails")

    with pytest.raises(RuntimeError, match="a loss that fails"):
        record_fp8_casts(model, batch, "rowwise", loss=broken)
    assert fl.hp_tensor_to_float8_dynamic is real
    record_fp8_casts(model, batch)
    assert fl.hp_tensor_to_float8_dynamic is real
    assert all(type(m) in (nn.Linear, nn.ReLU, nn.Sequential) for m in model.modules())
    assert all(torch.equal(p, q) and p.grad is None for p, q in zip(model.parameters(), before))


# ---------------------------------------------------------------- torchao = the package, bit for bit
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("kind", ["plain", "tiny"])
def test_every_cast_equals_the_package_bit_for_bit(records, recipe, kind):
    """Scales (float32 bits, torchao's shape), FP8 codes and values, and the counts computed from
    torchao's output equal the package's current_quantize and cast_counts on the same tensor."""
    for c in records[(recipe, kind)].casts:
        ref = reference_cast(c)
        assert same_bits(c.scale, ref.scale), c
        assert np.array_equal(c.codes, ref.codes), c
        assert same_bits(c.data, ref.data), c
        assert c.counts == ref.counts == cast_counts(c.hp, c.scale, c.fmt), c


@pytest.mark.parametrize("recipe", RECIPES)
def test_the_beam_models_casts_equal_the_package(ao, recipe):
    """The course's beam model on its first training batch: 36 casts, each equal to the package's."""
    task = build_task("beam", 0)
    rec = record_fp8_casts(task.model, task.batch(), recipe)
    assert len(rec.casts) == 36 and rec.layers[0] == "embed" and rec.layers[-1] == "head"
    for c in rec.casts:
        ref = reference_cast(c)
        assert same_bits(c.scale, ref.scale) and np.array_equal(c.codes, ref.codes) and c.counts == ref.counts, c
    assert rec.total().saturated == 0 and rec.total().underflowed > 0


def test_the_measured_counts(records):
    """What the seeded data does, recipe by recipe (the numbers a lesson can show)."""
    def count(recipe, kind, layer, role, gemm):
        return records[(recipe, kind)].select(layer, role, gemm)[0].counts

    tw = count("tensorwise", "plain", "0", "input", "output")
    rw = count("rowwise", "plain", "0", "input", "output")
    assert tw == CastCounts(size=1024, saturated=0, clamped=4, underflowed=816, subnormal=55)
    assert rw == CastCounts(size=1024, saturated=0, clamped=5, underflowed=697, subnormal=49)
    # rows 0-3 (64 values below 1e-18) vanish in both recipes: tensorwise beside the amax of 2e4,
    # rowwise under the EPS floor
    rows = records[("rowwise", "plain")].select("0", "input", "output")[0]
    assert not rows.data[:4].any() and rows.hp[:4].all()
    assert np.all(rows.scale[:4] == F32(2.0**48))  # 448 / 1e-12, rounded down to a power of two
    assert not records[("tensorwise", "plain")].select("0", "input", "output")[0].data[:4].any()
    # unit 3's sixteen weights, below 1e-18: lost in both recipes (rowwise forward: its own scale
    # meets EPS; rowwise backward: beside the other weights of each input unit)
    for recipe in RECIPES:
        for gemm in ("output", "grad_input"):
            assert count(recipe, "plain", "0", "weight", gemm).underflowed == 16
    # current scaling maps each amax to max: nothing saturates, in any cast
    for rec in records.values():
        assert rec.total().saturated == 0
    # gradients below 1e-12: the EPS floor leaves their scale too small, and every one underflows
    for recipe in RECIPES:
        for gemm in ("grad_input", "grad_weight"):
            c = count(recipe, "tiny", "2", "grad_output", gemm)
            assert c.underflowed == c.size == 512
        assert records[(recipe, "tiny")].total("0", "grad_output").underflowed == 0  # all zero already
        assert np.all(records[(recipe, "tiny")].select("0", "grad_output")[0].hp == 0)


def test_emulated_products_make_the_same_casts(ao):
    """emulate=True (float32 products) and False (torch._scaled_mm): the first layer's forward casts
    are the same bits; every later cast reads a product, and the two products differ in their last
    bits, so those are compared only with the package (above)."""
    model, batch = problem()
    for recipe in RECIPES:
        a, b = (record_fp8_casts(model, batch, recipe, emulate=e) for e in (False, True))
        for x, y in zip(a.select("0", gemm="output"), b.select("0", gemm="output")):
            assert np.array_equal(x.codes, y.codes) and same_bits(x.scale, y.scale)
        for c in b.casts:
            ref = reference_cast(c)
            assert same_bits(c.scale, ref.scale) and np.array_equal(c.codes, ref.codes) and c.counts == ref.counts


# ---------------------------------------------------------------- wrong rules are caught
@pytest.mark.parametrize("recipe", RECIPES)
def test_scale_without_the_eps_floor_is_caught(records, recipe):
    """max / amax without torchao's clamp of the amax to 1e-12: right wherever amax >= 1e-12, wrong
    (scales and counts) for the tensors and rows below it."""
    wrong = right = 0
    for kind in ("plain", "tiny"):
        for c in records[(recipe, kind)].casts:
            amax = np.asarray(c.amax, np.float64)
            with np.errstate(divide="ignore", over="ignore"):
                s = (np.float64(c.fmt.max) / amax).astype(F32)
            s = _pow2_floor_torchao(s) if c.pow2 else s
            if agrees(c, s, cast_counts(c.hp, s, c.fmt)):
                right += 1
            else:
                wrong += 1
                assert (amax < 1e-12).any()
    assert wrong >= 2 and right > wrong


def test_per_tensor_scale_for_rowwise_is_caught(records):
    """The rowwise recipe with one scale for the whole tensor (its amax, the same power-of-two rule)
    gives other scales and counts, wherever the rows' powers of two differ (the fresh weights'
    rows all round to one power of two: there the two rules agree)."""
    rec = records[("rowwise", "plain")]
    wrong = 0
    for c in rec.casts:
        s = np.full(c.scale.shape, current_scale(float(np.abs(c.hp).max()), c.fmt, True), F32)
        n = cast_counts(c.hp, s, c.fmt)
        assert agrees(c, s, n) == (np.unique(c.scale).size == 1)
        wrong += not agrees(c, s, n)
        if c.role == "input" and c.layer == "0":
            assert n.underflowed > c.counts.underflowed  # the rows with small amaxes lose more
    assert wrong >= 8


def test_counts_of_a_saturating_scale_match_torchaos_cast(ao):
    """Current scaling never saturates, but a scale that is too large does (as delayed scaling's can):
    torchao's own cast at a given scale clamps, and the package counts it the same."""
    _, tt = ao
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(4096) * 10.0 ** rng.uniform(-8, 4, 4096)).astype(F32)
    for fmt in (FP8_E4M3, FP8_E5M2):
        for scale in (F32(fmt.max / 1000), F32(fmt.max / 100), F32(2**20)):
            t = tt.hp_tensor_and_scale_to_float8(torch.from_numpy(x), torch.tensor(scale), TORCH_DTYPE[fmt])
            data = t._data.float().numpy()
            y = x * scale
            n = cast_counts(x, scale, fmt)
            assert n == _torch_counts(torch.from_numpy(x), torch.tensor(scale), t._data)
            assert n.saturated > 0 and n.clamped >= n.saturated
            assert n.saturated == int((np.abs(y) > fmt.overflow_boundary).sum())
            assert n.clamped == int(((np.abs(data) == fmt.max) & (np.abs(y) > fmt.max)).sum())
            assert n.underflowed == int(((x != 0) & (data == 0)).sum())
            assert n.subnormal == int(((data != 0) & (np.abs(data) < fmt.smallest_normal)).sum())


# ---------------------------------------------------------------- training
@pytest.fixture(scope="module")
def runs(ao):
    return {m: train_fp8(m, STEPS) for m in TRAIN_MODES}


def plain_loop(steps: int = STEPS, seed: int = 0) -> np.ndarray:
    """The beam model trained by hand: its seeded task, Adam at 1e-3, float32, one thread."""
    task = build_task("beam", seed)
    opt = torch.optim.Adam(task.model.parameters(), lr=1e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    losses = []
    try:
        for _ in range(steps):
            (x,), y = task.batch()
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(task.model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    finally:
        torch.set_num_threads(threads)
    return np.array(losses)


def test_fp32_run_is_a_plain_torch_loop(runs):
    assert np.array_equal(runs["fp32"].losses, plain_loop())


def test_runs_are_seeded(runs):
    for mode in ("tensorwise", "rowwise"):
        assert np.array_equal(train_fp8(mode, STEPS).losses, runs[mode].losses)
    assert not np.array_equal(train_fp8("tensorwise", STEPS, seed=1).losses, runs["tensorwise"].losses)


def test_every_mode_learns(runs):
    """All four runs are finite and fall below half their first loss; the FP8 runs end within 5% of
    float32's."""
    for mode, run in runs.items():
        assert run.error is None and run.losses.shape == (STEPS,)
        assert np.isfinite(run.losses).all()
        assert run.end < 0.5 * run.start, mode
        assert abs(run.end / runs["fp32"].end - 1) < 0.05, mode
    # the first step's loss is the forward pass alone: FP8 casts change it, bf16 barely
    assert runs["tensorwise"].start != runs["fp32"].start != runs["rowwise"].start


# ---------------------------------------------------------------- errors
def test_clear_errors(ao, monkeypatch):
    model, batch = problem()
    with pytest.raises(ValueError, match="recipe must be one of 'tensorwise', 'rowwise'"):
        record_fp8_casts(model, batch, "rowwise_with_gw_hp")
    with pytest.raises(TypeError, match="batch must be"):
        record_fp8_casts(model, batch[0])
    with pytest.raises(ValueError, match="no nn.Linear"):
        record_fp8_casts(nn.ReLU(), batch)
    with pytest.raises(ValueError, match="mode must be one of"):
        train_fp8("fp16")
    with pytest.raises(ValueError, match="model must be one of"):
        train_fp8("fp32", model="resnet")
    monkeypatch.setitem(sys.modules, "torchao.float8", None)
    with pytest.raises(ImportError, match=r"^needs torchao: pip install torchao==0\.18\.0$"):
        record_fp8_casts(model, batch)
    with pytest.raises(ImportError, match="needs torchao"):
        train_fp8("rowwise", 2)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", RECIPES)
def test_on_cuda_every_cast_equals_the_package_and_the_cpus(ao, recipe):
    """On a CUDA device, with the products run by ``torch._scaled_mm`` (emulate=False), every cast
    torchao makes still equals the package's bit for bit; the first layer's forward casts (same
    input, same weight) are the CPU's to the bit. (cuBLAS wants every dimension a multiple of 16,
    so the seeded problem's last layer is 32 -> 16 here.)"""
    def problem16():
        model, (x, _) = problem()
        torch.manual_seed(1)
        model[2] = nn.Linear(32, 16)
        return model, (x, torch.randn(64, 16, generator=torch.Generator().manual_seed(2)))

    model, (x, y) = problem16()
    cuda = record_fp8_casts(model.to("cuda"), (x.to("cuda"), y.to("cuda")), recipe)
    cpu = record_fp8_casts(*problem16(), recipe, emulate=True)  # older torch: no rowwise _scaled_mm on a CPU
    assert len(cuda.casts) == len(cpu.casts) == 12
    for c in cuda.casts:
        ref = reference_cast(c)
        assert same_bits(c.scale, ref.scale) and np.array_equal(c.codes, ref.codes) and c.counts == ref.counts, c
    for g, c in zip(cuda.casts[:2], cpu.casts[:2]):
        assert (g.layer, g.role) == (c.layer, c.role) and np.array_equal(g.codes, c.codes) and same_bits(g.scale, c.scale)
