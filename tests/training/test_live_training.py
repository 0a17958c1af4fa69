"""ampviz.training.live: one training loop for every AMP mode, step records, censuses, live scaler settings."""

import json
import math
import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ampviz.training import live as L
from ampviz.formats.census import census
from ampviz.formats import CATEGORIES
from ampviz.scaling import TorchGradScaler, simulate
from ampviz.training import torch_cast_counts


def _all_hooks(model):
    return sum(len(m._forward_hooks) + len(m._backward_hooks) for m in model.modules())


def _lost(rec):
    """Share of all parameter gradients that are zero or underflow in the record's census."""
    cs = rec.param_census.values()
    return sum(c.counts["zero"] + c.counts["underflow"] for c in cs) / sum(c.total for c in cs)


@pytest.mark.parametrize("model", L.MODELS)
@pytest.mark.parametrize("mode", L.MODES)
def test_every_mode_trains_a_few_steps(model, mode):
    """On these tasks every mode keeps a finite loss for a few steps, the unprotected ones ("fp16"
    without a scaler, pure "half") included: the gradients are far below fp16's overflow threshold,
    and what they lose to underflow is a small share of the gradient, not the loss. (Not the beam
    in "half": Adam's eps is 0 in fp16 weights, tests/training/test_beam.py.)"""
    if (model, mode) == ("beam", "half"):
        run = L.run_training(L.TrainConfig(model=model, mode=mode, steps=4, census_every=0))
        assert run.error.startswith("half diverged at step 1") and len(run) == 2
        return
    run = L.run_training(L.TrainConfig(model=model, mode=mode, steps=4, census_every=0))
    assert run.error is None and len(run) == 4
    assert [r.step for r in run.records] == [0, 1, 2, 3]
    assert np.isfinite(run["loss"]).all() and np.isfinite(run["grad_norm"]).all()
    assert (run["step_time"] > 0).all() and not run["skipped"].any()
    if mode == "fp16+scaler":
        assert run.records[0].scale == 2.0**16 and run.records[0].growth_interval == 2000
    else:
        assert all(r.scale is None and r.growth_tracker is None for r in run.records)
    assert all(r.param_census is None and r.act_census is None for r in run.records)


def test_same_seed_same_run_and_the_loss_falls():
    a = L.run_training(L.TrainConfig(mode="fp32", steps=200, census_every=0))
    b = L.run_training(L.TrainConfig(mode="fp32", steps=200, census_every=0))
    np.testing.assert_array_equal(a["loss"], b["loss"])
    assert a["loss"][-10:].mean() < a["loss"][:10].mean() - 0.3
    c = L.run_training(L.TrainConfig(mode="fp32", steps=3, census_every=0, seed=1))
    assert c["loss"][0] != a["loss"][0]


def test_the_first_step_matches_a_hand_written_fp32_step():
    task = L.build_task("mlp", seed=0, batch_size=64)
    (x,), y = task.batch()
    torch.nn.functional.cross_entropy(task.model(x), y).backward()
    run = L.run_training(L.TrainConfig(mode="fp32", steps=1, census_every=1, keep_grads=True))
    rec = run.records[0]
    for name, p in task.model.named_parameters():
        np.testing.assert_array_equal(rec.grads[name], p.grad.reshape(-1).numpy())
    norm = torch.linalg.vector_norm(torch.cat([p.grad.reshape(-1) for p in task.model.parameters()]))
    assert rec.grad_norm == pytest.approx(norm.item(), rel=1e-6)


def test_fp16_autocast_runs_on_this_device():
    task = L.build_task("mlp")
    device = L.resolve_device()
    with torch.autocast(device.type, dtype=torch.float16):
        out = task.model.to(device)(task.batch()[0][0].to(device))
    assert out.dtype == torch.float16


def test_skipped_steps_and_backoff_match_the_simulator():
    cfg = L.TrainConfig(mode="fp16+scaler", steps=60, census_every=0, init_scale=2.0**40,
                        growth_interval=5)
    run = L.run_training(cfg)
    assert run.error is None
    skipped = run["skipped"].astype(bool)
    assert skipped[:4].all() and (~skipped).sum() > 20
    # the loss stays finite; the skipped steps' true gradients were inf
    assert np.isfinite(run["loss"]).all() and not np.isfinite(run["grad_norm"][skipped]).any()
    trace = simulate(TorchGradScaler(init_scale=2.0**40, growth_interval=5), found_inf=skipped)
    np.testing.assert_array_equal(run["scale"], trace.scale)
    np.testing.assert_array_equal(run["growth_tracker"], trace.growth_tracker)
    first_clean = int(np.argmin(skipped))
    assert run["scale"][first_clean] == 2.0**(40 - first_clean)
    assert run["scale"][first_clean:].max() > run["scale"][first_clean]  # grew again after the backoffs


def test_parameter_census_is_census_of_the_true_gradient_at_the_scale():
    cfg = L.TrainConfig(model="mlp", mode="fp16+scaler", steps=5, census_every=2, keep_grads=True,
                        init_scale=2.0**20)
    run = L.run_training(cfg)
    with_census = [r for r in run.records if r.param_census is not None]
    assert [r.step for r in with_census] == [0, 2, 4]
    assert run.records[1].param_census is None and run.records[1].grads is None
    names = [n for n, _ in L.build_task("mlp").model.named_parameters()]
    for rec in with_census:
        assert list(rec.param_census) == names
        for n in names:
            assert rec.param_census[n] == census(rec.grads[n], "fp16", rec.scale)
            assert rec.param_census[n].counts == torch_cast_counts(rec.grads[n], rec.scale, "float16")
        grads = np.concatenate([rec.grads[n] for n in names])
        assert rec.grad_norm == pytest.approx(float(np.linalg.norm(grads.astype(np.float64))), rel=1e-5)


def test_activation_census_per_watched_module():
    task = L.build_task("transformer", batch_size=8)
    assert task.watch == ("embed", "encoder.layers.0", "encoder.layers.1", "head")
    run = L.run_training(L.TrainConfig(model="transformer", mode="fp16", steps=2, census_every=1,
                                       batch_size=8))
    rec = run.records[0]
    assert list(rec.act_census) == list(task.watch)
    assert rec.act_census["encoder.layers.0"].total == 8 * 16 * 32
    assert rec.act_census["head"].total == 8 * 9
    assert all(c.scale == 1.0 for c in rec.act_census.values())
    mlp = L.run_training(L.TrainConfig(mode="fp16+scaler", steps=1, census_every=1, watch=["fc2"]))
    assert list(mlp.records[0].act_census) == ["fc2"]
    assert mlp.records[0].act_census["fc2"].scale == 2.0**16
    with pytest.raises(ValueError, match="no module named 'nope'"):
        next(L.train_steps(L.TrainConfig(watch=["nope"])))


def test_mid_run_settings_take_effect_the_next_step():
    control = L.ScalerControl()
    cfg = L.TrainConfig(mode="fp16+scaler", steps=12, census_every=0)
    gen = L.train_steps(cfg, control)
    records = [next(gen), next(gen)]  # two clean steps: the tracker is 2
    assert records[-1].growth_tracker == 2
    # torch grows when the tracker *equals* the interval: 1 is already passed, so no growth
    control.set(growth_interval=1)
    records.append(next(gen))
    assert records[-1].growth_interval == 1 and records[-1].growth_tracker == 3
    control.set(growth_interval=5, growth_factor=4.0)  # the tracker reaches 5 at step 4
    records += [next(gen) for _ in range(2)]
    assert records[3].growth_interval == 5 and records[3].growth_factor == 4.0
    assert [r.scale for r in records] == [2.0**16] * 5 and records[4].growth_tracker == 0
    control.set(growth_interval=1)  # tracker 0: from now on every clean step grows
    records += list(gen)
    assert len(records) == 12 and all(r.growth_interval == 1 for r in records[5:])
    assert records[5].scale == 2.0**18
    for a, b in zip(records[5:], records[6:]):
        assert b.scale == (a.scale / 2 if a.skipped else a.scale * 4)
    assert any(r.skipped for r in records[5:]) and not any(r.skipped for r in records[:5])
    # the simulator, restarted with each new setting, predicts the whole trajectory
    skipped = np.array([r.skipped for r in records])
    state, scales = None, []
    for start, stop, kw in [(0, 2, {}), (2, 3, {"growth_interval": 1}),
                            (3, 5, {"growth_interval": 5, "growth_factor": 4.0}),
                            (5, 12, {"growth_interval": 1, "growth_factor": 4.0})]:
        trace = simulate(TorchGradScaler(**kw), found_inf=skipped[start:stop], state=state)
        scales += trace.scale.tolist()
        state = trace.final
    assert scales == [r.scale for r in records]


def test_control_from_another_thread_and_stop():
    control = L.ScalerControl()
    cfg = L.TrainConfig(mode="fp16+scaler", steps=50, census_every=0)
    seen = []

    def on_step(rec):
        seen.append(rec.step)
        if rec.step == 3:
            t = threading.Thread(target=control.set, kwargs={"backoff_factor": 0.25})
            t.start()
            t.join()
        if rec.step == 6:
            control.stop()

    run = L.run_training(cfg, control, on_step=on_step)
    assert seen == list(range(7)) and len(run) == 7 and run.error is None
    assert [r.backoff_factor for r in run.records] == [0.5] * 4 + [0.25] * 3
    for bad in ({"growth_factor": 1.0}, {"backoff_factor": 1.5}, {"growth_interval": 0},
                {"growth_interval": 2.5}):
        with pytest.raises(ValueError):
            control.set(**bad)


def test_nan_loss_ends_the_run_with_an_error_record():
    run = L.run_training(L.TrainConfig(mode="fp32", lr=1e30, steps=10, census_every=0))
    assert len(run) == 2 and run.records[0].error is None
    last = run.records[-1]
    assert last.step == 1 and math.isnan(last.loss)
    assert run.error == last.error == ("fp32 diverged at step 1: the loss is nan (training diverged: try a "
                                       "smaller learning rate)")


def test_hooks_are_removed_at_the_end_on_error_and_on_close():
    def model():
        return L.build_task("mlp").model

    m = model()
    L.run_training(L.TrainConfig(steps=2, census_every=1), model=m)
    assert _all_hooks(m) == 0
    m = model()
    run = L.run_training(L.TrainConfig(steps=5, lr=1e30, census_every=1), model=m)
    assert run.error and _all_hooks(m) == 0
    m = model()
    gen = L.train_steps(L.TrainConfig(steps=5, census_every=1), model=m)
    next(gen)
    assert _all_hooks(m) == len(L.build_task("mlp").watch)
    gen.close()
    assert _all_hooks(m) == 0
    m = model()  # a generator never started never registers anything
    L.train_steps(L.TrainConfig(steps=5), model=m).close()
    assert _all_hooks(m) == 0

    class Boom(torch.nn.Module):  # an exception that is not a NaN: recorded, hooks gone
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(32, 10)

        def forward(self, x):
            raise RuntimeError("out of memory (pretend)")

    b = Boom()
    run = L.run_training(L.TrainConfig(steps=3, watch=["fc1"]), model=b)
    assert run.error == "fp32 stopped at step 0: out of memory (choose a smaller batch or model)"
    assert _all_hooks(b) == 0


def _same(a: L.Run, b: L.Run):
    assert a.config == b.config and a.device == b.device and len(a) == len(b)
    for ra, rb in zip(a.records, b.records):
        for k in L._SCALARS + L._CENSUSES:
            va, vb = getattr(ra, k), getattr(rb, k)
            if isinstance(va, float) and math.isnan(va):
                assert math.isnan(vb), k
            else:
                assert va == vb and type(va) is type(vb), k


def test_runs_round_trip_through_csv_and_json(tmp_path):
    cfg = L.TrainConfig(model="transformer", mode="fp16+scaler", steps=3, census_every=2, batch_size=8,
                        init_scale=2.0**30)
    run = L.run_training(cfg, save_to=tmp_path / "live.csv")
    assert run.records[0].skipped and not math.isfinite(run.records[0].grad_norm)
    for path in (run.to_csv(tmp_path / "run.csv"), run.to_json(tmp_path / "run.json"), tmp_path / "live.csv"):
        _same(run, L.load_run(path))
    broken = L.run_training(L.TrainConfig(mode="fp32", lr=1e30, steps=4, census_every=1))
    for path in (broken.to_csv(tmp_path / "b.csv"), broken.to_json(tmp_path / "b.json")):
        back = L.load_run(path)
        _same(broken, back)
        assert back.error.startswith("fp32 diverged at step")
    (tmp_path / "x.csv").write_text("step,loss\n0,1.0\n")
    with pytest.raises(ValueError, match="not an ampviz run"):
        L.load_run(tmp_path / "x.csv")


def test_lesson_fp16_without_a_scaler_loses_more_gradients_to_underflow():
    """Under fp16 autocast an underflowed weight gradient arrives as an exact 0, so the share of
    zero gradients is what fp16 lost (plus dead ReLU units, the same in both runs). The seeded run
    without a scaler loses more, at every census, and leaves about a quarter of all gradients
    subnormal (precision lost); with the scaler at 2**16 almost none are."""
    runs = {mode: L.run_training(L.TrainConfig(mode=mode, steps=41, census_every=10))
            for mode in ("fp16", "fp16+scaler")}
    plain = [r for r in runs["fp16"].records if r.param_census]
    scaled = [r for r in runs["fp16+scaler"].records if r.param_census]
    assert len(plain) == len(scaled) == 5
    assert all(_lost(a) > _lost(b) for a, b in zip(plain, scaled))

    def share(rec, cat):
        return sum(c.counts[cat] for c in rec.param_census.values()) / sum(
            c.total for c in rec.param_census.values())

    assert all(share(r, "subnormal") > 0.2 for r in plain)
    assert all(share(r, "subnormal") < 1e-3 for r in scaled)
    # at step 0 (same weights, same batch) the extra zeros are about what an fp32 run's census
    # predicts would underflow in fp16 at scale 1 (not exactly: fp16 also rounds inside backward)
    fp32 = L.run_training(L.TrainConfig(mode="fp32", steps=1, census_every=1)).records[0]
    extra = _lost(plain[0]) - _lost(scaled[0])
    assert 0.5 < extra / share(fp32, "underflow") < 2


def test_device_choice_and_description():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert L.resolve_device().type == expected
    assert L.resolve_device("cpu") == torch.device("cpu")
    line = L.describe_device()
    assert line.startswith(expected) and ":" in line and "\n" not in line
    assert L.describe_device("cpu") == "cpu: asked for explicitly"
    run = L.run_training(L.TrainConfig(steps=1, device="cpu", census_every=0))
    assert run.device == "cpu: asked for explicitly"


def test_config_validation():
    for bad in ({"mode": "fp8"}, {"model": "cnn"}, {"steps": -1}, {"batch_size": 0},
                {"growth_factor": 1.0}, {"backoff_factor": 1.0}, {"growth_interval": 0},
                {"census_fmt": "fp7"}):
        with pytest.raises(ValueError):
            L.TrainConfig(**bad)
    assert L.TrainConfig().learning_rate == 0.05 and L.TrainConfig(lr=0.1).learning_rate == 0.1


# ----- long runs and lost data -----
def test_a_collapsed_scale_is_recorded_to_the_last_step():
    """lr=1e10 drives the fp16+scaler run into overflow after overflow until its scale is 0; the
    run goes on to its last step, and the census at scale 0 counts every gradient as lost, as
    torch's multiply-then-cast gives (gradient × 0 is 0, inf × 0 NaN)."""
    run = L.run_training(L.TrainConfig(mode="fp16+scaler", lr=1e10, steps=300, census_every=10))
    assert len(run) == 300 and run.error is None
    assert run["scale"][-1] == 0.0 and run["skipped"][-50:].all()
    rec = run.records[-10]
    assert rec.scale == 0.0 and rec.param_census is not None
    for c in rec.param_census.values():
        assert c.scale == 0.0 and c.counts["zero"] + c.counts["nan"] == c.total


@pytest.mark.parametrize("values", [
    np.array([1.0, -2.5e-8, 0.0, -0.0, 65504.0, 1e30], np.float32),
    np.array([np.inf, -np.inf, np.nan, 3.0], np.float32),
    np.random.default_rng(0).standard_normal(1000).astype(np.float32),
])
def test_census_at_scale_zero_is_torchs_multiply_then_cast(values):
    got = L._census_at(values, "fp16", 0.0)
    cast = (torch.from_numpy(values) * 0.0).to(torch.float16)
    assert got.total == values.size and got.scale == 0.0
    assert got.counts["zero"] == int((cast == 0).sum()) and got.counts["nan"] == int(cast.isnan().sum())
    assert sum(got.counts.values()) == values.size
    assert L._census_at(values, "fp16", 2.0**10) == census(values, "fp16", 2.0**10)


def test_the_failure_sentences():
    half = L.run_training(L.TrainConfig(mode="half", lr=1e5, steps=3, census_every=0))
    assert half.error == ("half stopped at step 0: the learning rate 100000 does not fit in fp16 (largest "
                          "65504), so SGD cannot apply it to fp16 weights; choose a smaller learning rate")
    fp16 = L.run_training(L.TrainConfig(mode="fp16", lr=100, steps=10, census_every=0))
    assert fp16.error.startswith(f"fp16 overflowed at step {len(fp16) - 1}: the model's fp16 output went "
                                 "past 65504, so the loss is ")
    fp32 = L.run_training(L.TrainConfig(mode="fp32", lr=100, steps=10, census_every=0))
    assert fp32.error.startswith(f"fp32 diverged at step {len(fp32) - 1}: the loss is nan")

    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no message")

    assert L.failure_sentence("bf16", Unprintable(), 3) == "bf16 stopped at step 3: Unprintable: "
    assert "\n" not in L.failure_sentence("fp32", ValueError("first\nsecond"), 0)


def _row_ends(data: bytes, header_lines: int = 2) -> list:
    """Offsets just past each complete step row of a run's CSV (rows end with \\r\\n)."""
    ends, pos, seen = [], 0, 0
    while True:
        nl = data.find(b"\n", pos)
        if nl < 0:
            return ends
        seen += 1
        pos = nl + 1
        if seen > header_lines:
            ends.append(pos)


def test_a_csv_cut_anywhere_loses_at_most_the_step_in_progress(tmp_path):
    """The file ``run_training(save_to=...)`` writes, cut at every byte: every complete row is read
    back exactly, the row in progress is dropped, and only a cut inside the first line (the
    settings, before any step) gives an error, which says so."""
    path = tmp_path / "live.csv"
    run = L.run_training(L.TrainConfig(mode="fp16+scaler", steps=6, census_every=3, init_scale=2.0**30),
                         save_to=path)
    data = path.read_bytes()
    ends = _row_ends(data)
    assert len(ends) == 6 and ends[-1] == len(data)
    first_line = data.index(b"\n")
    cut_file = tmp_path / "cut.csv"
    for cut in range(len(data) + 1):
        cut_file.write_bytes(data[:cut])
        if cut <= first_line:
            with pytest.raises(ValueError, match="first line|not an ampviz run"):
                L.load_run(cut_file)
            continue
        back = L.load_run(cut_file)
        complete = sum(e <= cut for e in ends)
        # a row whose \r\n was cut after the \r is complete in content but counted as in progress
        assert len(back) in (complete, complete - 1) if cut < len(data) else len(back) == 6, cut
        assert len(back) >= complete - (data[cut - 1:cut] == b"\r"), cut
        _same(L.Run(run.config, run.records[:len(back)], run.device), back)


def test_a_broken_row_in_the_middle_is_an_error_with_its_line(tmp_path):
    path = tmp_path / "live.csv"
    L.run_training(L.TrainConfig(mode="fp32", steps=3, census_every=0), save_to=path)
    lines = path.read_text().split("\n")
    lines[3] = lines[3].replace(",", ";", 2)
    path.write_text("\n".join(lines))
    with pytest.raises(ValueError, match="line 4"):
        L.load_run(path)


def _record(step, skipped=False, census=None):
    return L.StepRecord(step=step, loss=1.0 / (step + 1), scale=2.0**16, skipped=skipped,
                        param_census=census)


def test_a_bounded_run_keeps_memory_and_the_shape_of_the_run():
    run = L.Run(L.TrainConfig(), max_records=1000)
    skipped_steps = set(range(0, 100_000, 37))
    for step in range(100_000):
        run.append(_record(step, skipped=step in skipped_steps))
        assert len(run) <= 1000
    assert run.steps_recorded == 100_000 and run.skipped_recorded == len(skipped_steps)
    steps = [r.step for r in run.records]
    assert steps == sorted(steps) and steps[0] == 0 and steps[-1] == 99_999
    regular = [s for s in steps if s % run.stride == 0]
    assert regular == list(range(0, 100_000, run.stride))  # evenly spaced
    kept_skipped = [r.step for r in run.records if r.skipped]
    assert len(kept_skipped) > len(regular) // 8  # skipped steps kept more densely than the others
    unbounded = L.Run(L.TrainConfig())
    for step in range(3000):
        unbounded.append(_record(step))
    assert len(unbounded) == 3000 and unbounded.stride == 1
    with pytest.raises(ValueError, match="max_records"):
        L.Run(L.TrainConfig(), max_records=3)


def test_every_step_skipped_stays_bounded_too():
    run = L.Run(L.TrainConfig(), max_records=200)
    for step in range(50_000):
        run.append(_record(step, skipped=True))
    assert len(run) <= 200 and run.skipped_recorded == 50_000


# ---------------------------------------------------------------- load_run on any file
def _small_run() -> L.Run:
    """A run of three steps with censuses, a skipped step, inf and NaN, and an error, built without training."""
    c = census(np.float32([0, 1e-8, 1e-3, 1.0, np.inf]), "fp16", 2.0**16)
    recs = [L.StepRecord(step=0, loss=2.5, scale=2.0**16, skipped=True, grad_norm=math.inf, step_time=0.01,
                         growth_tracker=0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
                         param_census={"w": c}, act_census={"fc": c}),
            L.StepRecord(step=1, loss=1.5, scale=2.0**15, grad_norm=3.0, step_time=0.02, growth_tracker=1,
                         growth_factor=2.0, backoff_factor=0.5, growth_interval=2000),
            L.StepRecord(step=2, error="fp16 overflowed at step 2")]
    return L.Run(L.TrainConfig(mode="fp16+scaler", steps=3, census_every=2), recs, device="cpu")


@pytest.fixture(scope="module")
def run_files(tmp_path_factory):
    """A folder to write files in, and the small run's JSON and CSV text."""
    folder = tmp_path_factory.mktemp("runs")
    run = _small_run()
    return folder, run.to_json(folder / "ok.json").read_text(), run.to_csv(folder / "ok.csv").read_text()


def _loads_a_valid_run_or_refuses_in_one_line(path):
    """load_run(path) gives a run that writes and reads back the same, or one ValueError line
    that names the file and what was expected."""
    try:
        run = L.load_run(path)
    except ValueError as e:
        assert type(e) is ValueError and "\n" not in str(e) and str(path) in str(e), repr(e)
        assert "expected" in str(e) or "not an ampviz run" in str(e) or "line" in str(e), str(e)
        return None
    assert isinstance(run, L.Run) and isinstance(run.config, L.TrainConfig) and isinstance(run.device, str)
    for k in L._SCALARS + L._CENSUSES:
        assert len(run[k]) == len(run)
    for rec in run.records:
        assert isinstance(rec.step, int) and isinstance(rec.skipped, bool)
        for k in L._CENSUSES:
            for c in (getattr(rec, k) or {}).values():
                assert set(c.counts) == set(CATEGORIES) and repr(c)
    for back in (L.load_run(run.to_json(path.with_suffix(".back.json"))),
                 L.load_run(run.to_csv(path.with_suffix(".back.csv")))):
        _same(run, back)
    return run


def test_the_small_run_round_trips(run_files):
    folder, _, _ = run_files
    for name in ("ok.json", "ok.csv"):
        _same(_small_run(), _loads_a_valid_run_or_refuses_in_one_line(folder / name))


@pytest.mark.parametrize("name, data", [
    ("binary.json", b"\x89PNG\r\n\x1a\n\x00\xff\xfe"), ("binary.csv", b"\xff\xfe\x00\x81"), ("list.json", b"[]"),
    ("number.json", b"3"), ("deep.json", b"[" * 100_000), ("no_config.json", b'{"records": []}'),
    ("bad_config.json", b'{"config": [], "records": []}'), ("bad_record.json", b'{"config": {}, "records": [1]}'),
    ("bad_step.json", b'{"config": {}, "records": [{"step": "one"}]}'),
    ("bad_census.json", b'{"config": {}, "records": [{"step": 0, "param_census": {"w": [1]}}]}'),
    ("bad_bins.json", b'{"config": {}, "records": [{"step": 0, "param_census": {"w": {"fmt": "fp16", "scale": 1, '
                      b'"total": 0, "counts": {}, "log2_bins": [1e300], "log2_counts": []}}}]}'),
    ("list_head.csv", b"# ampviz run []\nstep\n"),
    ("bad_census.csv", b'# ampviz run {"config": {}}\nstep,param_census\n0,[1]\n'),
])
def test_load_run_refuses_binary_and_misshapen_files_in_one_line(tmp_path, name, data):
    (tmp_path / name).write_bytes(data)
    with pytest.raises(ValueError) as info:
        L.load_run(tmp_path / name)
    assert type(info.value) is ValueError and "\n" not in str(info.value) and name in str(info.value)
    assert "expected" in str(info.value), str(info.value)


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                         max_size=4), max_leaves=12)


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=300), suffix=st.sampled_from([".json", ".csv", ".txt"]))
def test_load_run_on_arbitrary_bytes(run_files, data, suffix):
    folder, _, _ = run_files
    path = folder / f"bytes{suffix}"
    path.write_bytes(data)
    _loads_a_valid_run_or_refuses_in_one_line(path)


@settings(max_examples=150, deadline=None)
@given(value=json_values)
def test_load_run_on_arbitrary_json(run_files, value):
    folder, _, _ = run_files
    path = folder / "any.json"
    path.write_text(json.dumps(value))
    _loads_a_valid_run_or_refuses_in_one_line(path)


def _replace_at(value, route: list, new):
    """value with the item at ``route`` (indices into nested lists and dicts, taken modulo their
    sizes) replaced by ``new``."""
    if not route or not isinstance(value, (list, dict)) or not value:
        return new
    keys = list(value) if isinstance(value, dict) else list(range(len(value)))
    key = keys[route[0] % len(keys)]
    out = dict(value) if isinstance(value, dict) else list(value)
    out[key] = _replace_at(value[key], route[1:], new)
    return out


@settings(max_examples=300, deadline=None)
@given(route=st.lists(st.integers(0, 50), max_size=6), new=json_values)
def test_load_run_on_a_run_with_one_value_changed(run_files, route, new):
    """A saved run with any one value (a setting, a field, a census count) changed to any JSON
    value: a valid run, or one line."""
    folder, text, _ = run_files
    path = folder / "changed.json"
    path.write_text(json.dumps(_replace_at(json.loads(text), route, new)))
    _loads_a_valid_run_or_refuses_in_one_line(path)


@settings(max_examples=300, deadline=None)
@given(at=st.integers(0, 10_000), cut=st.integers(0, 40), new=st.text(max_size=12))
def test_load_run_on_a_csv_with_some_text_changed(run_files, at, cut, new):
    folder, _, text = run_files
    at %= len(text)
    path = folder / "changed.csv"
    path.write_text(text[:at] + new + text[at + cut:], newline="")
    _loads_a_valid_run_or_refuses_in_one_line(path)
