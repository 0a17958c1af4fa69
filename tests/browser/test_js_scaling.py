"""ampviz/widgets/js/scaling.mjs in Chromium against ampviz.scaling.simulate, bit for bit: every
framework preset (and odd custom policies: hysteresis, tolerance, windows, clamps, a run that
stops) over seeded found_inf streams and grad_max streams, in fp16 and bf16, with the loss in
float32 or in the format: each step's scale, skipped flag, growth tracker and hysteresis, the
final state, where the run stopped and the exception it stopped with. A scale grown in float64
instead of rounded to float32 (torch's arithmetic) fails the test."""

import base64
import dataclasses

import numpy as np
import pytest

from ampviz.scaling import PRESETS, DynamicScaler, TorchGradScaler, simulate
from conftest import js_module_page

CUSTOM = {
    "hysteresis 3, refill clean": DynamicScaler(hysteresis=3, refill="clean", growth_interval=50),
    "hysteresis 2, refill at growth": DynamicScaler(hysteresis=2, growth_interval=20),
    "tolerance 0.25": DynamicScaler(tolerance=0.25, growth_interval=30, arithmetic="float64"),
    "window, metaseq-like": DynamicScaler(window_scaling=True, growth_interval=8, backoff_factor=0.5,
                                          no_backoff_below=2.0**-5, arithmetic="float64"),
    "clamped, stops at min": DynamicScaler(min_scale=1.0, max_scale=2.0**20, raise_at_min=True,
                                           growth_interval=40, init_scale=8.0),
    "stops at a scale": DynamicScaler(raise_at_scale=0.5, init_scale=4.0, growth_interval=1000, arithmetic="float64"),
    "odd factors": DynamicScaler(growth_factor=1.7, backoff_factor=0.3, growth_interval=7, init_scale=1000.0),
    "grows every step": TorchGradScaler(growth_interval=1, init_scale=2.0**100),
}
POLICIES = {**PRESETS, **CUSTOM}


def as_js(policy: DynamicScaler) -> dict:
    fields = dataclasses.asdict(policy)
    fields.pop("source")
    return fields


@pytest.fixture(scope="module")
def page(browser):
    page = js_module_page(browser, "scaling", "S")
    yield page
    page.close()


def streams(seed: int, n: int = 3000) -> dict:
    rng = np.random.default_rng(seed)
    bursts = rng.random(n) < np.where((np.arange(n) // 300) % 2 == 0, 0.002, 0.2)
    g = np.exp2(rng.normal(-12, 3, n)) * np.where(rng.random(n) < 0.01, 2.0**12, 1.0)
    g[rng.integers(0, n, 3)] = np.inf
    return {"found_inf": bursts, "grad_max": g}


def run_js(page, policy, **stream) -> dict:
    kind, values = next(iter(stream.items()))
    key = {"found_inf": "foundInf", "grad_max": "gradMax"}[kind]
    options = {k: v for k, v in stream.items() if k != kind}
    got = page.evaluate("""([p, key, values, options]) => {
        const r = S.simulate(p, {[key]: values, ...options});
        return {scale: b64(r.scale), skipped: b64(r.skipped), tracker: b64(r.growth_tracker), hyst: b64(r.hysteresis),
                final: r.final, stoppedAt: r.stoppedAt, stopReason: r.stopReason}; }""",
                        [as_js(policy), key, np.asarray(values, np.float64).tolist(), options])
    arr = lambda name, dtype: np.frombuffer(base64.b64decode(got[name]), dtype)  # noqa: E731
    return {"scale": arr("scale", np.float64), "skipped": arr("skipped", np.uint8).astype(bool),
            "tracker": arr("tracker", np.int32), "hyst": arr("hyst", np.int32), "final": got["final"],
            "stopped_at": got["stoppedAt"], "stop_reason": got["stopReason"]}


def assert_same(js: dict, trace, name):
    scale = np.asarray(trace.scale, np.float64)
    nan = np.isnan(scale)
    assert np.array_equal(nan, np.isnan(js["scale"])) and np.array_equal(scale[~nan], js["scale"][~nan]), name
    assert np.array_equal(js["skipped"], trace.skipped), name
    assert np.array_equal(js["tracker"], trace.growth_tracker), name
    assert np.array_equal(js["hyst"], np.asarray(trace.hysteresis)), name
    assert (js["stopped_at"], js["stop_reason"]) == (trace.stopped_at, trace.stop_reason), name
    final = trace.final._asdict()
    for key, value in final.items():
        got = js["final"][key]
        assert got == value or (value != value and got != got), (name, key, got, value)


@pytest.mark.parametrize("name", list(POLICIES))
def test_found_inf_streams_give_the_same_trace(page, name):
    for seed in (0, 1):
        flags = streams(seed)["found_inf"]
        assert_same(run_js(page, POLICIES[name], found_inf=flags.astype(float)),
                    simulate(POLICIES[name], found_inf=flags), name)


@pytest.mark.parametrize("name", list(POLICIES))
@pytest.mark.parametrize("fmt, in_format", [("fp16", False), ("fp16", True), ("bf16", False)])
def test_grad_max_streams_give_the_same_trace(page, name, fmt, in_format):
    g = streams(2)["grad_max"]
    js = run_js(page, POLICIES[name], grad_max=g, fmt=fmt, lossInFormat=in_format)
    trace = simulate(POLICIES[name], grad_max=g, fmt=fmt, loss_dtype=fmt if in_format else "float32")
    assert_same(js, trace, (name, fmt, in_format))
    if name == "torch" and fmt == "fp16" and not in_format:
        assert 0 < trace.skipped.sum() < g.size


def test_a_scale_not_rounded_to_float32_would_be_caught():
    """torch's arithmetic rounds each grown or backed-off scale to float32: with growth 1.7 the
    float64 products leave float32 after the first growth, so a float64 port would differ."""
    policy = CUSTOM["odd factors"]
    flags = streams(0)["found_inf"]
    torch_scales = np.asarray(simulate(policy, found_inf=flags).scale, np.float64)
    f64 = np.asarray(simulate(dataclasses.replace(policy, arithmetic="float64"), found_inf=flags).scale, np.float64)
    assert not np.array_equal(torch_scales, f64)


def test_overflows_is_the_package_model(page):
    from ampviz.scaling import overflows

    rng = np.random.default_rng(3)
    s = np.exp2(rng.uniform(-10, 40, 2000))
    g = np.exp2(rng.uniform(-40, 20, 2000))
    for fmt, in_format in (("fp16", False), ("fp16", True), ("bf16", False), ("bf16", True)):
        got = page.evaluate("([s, g, fmt, low]) => s.map((x, i) => S.overflows(x, g[i], fmt, low))",
                            [s.tolist(), g.tolist(), fmt, in_format])
        want = overflows(s, g, fmt, fmt if in_format else "float32")
        assert got == want.tolist(), (fmt, in_format)
