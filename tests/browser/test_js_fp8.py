"""ampviz/widgets/js/fp8.mjs in Chromium against ampviz.formats.fp8.simulate_fp8_scaling, bit for
bit: delayed scaling (history 1, 16 and 1024, "max" and "most_recent", margins, Transformer
Engine's Python update and its CUDA kernel) and current scaling (torchao's and TE's, with and
without power-of-two scales), in E4M3 and E5M2, over seeded streams with spikes, inf and NaN steps
and zero amaxes: each step's amax, scale, frozen flag and the saturated, underflowed and subnormal
counts."""

import base64

import numpy as np
import pytest

from ampviz.formats.fp8 import TensorStream, simulate_fp8_scaling, tensor_stream
from conftest import js_module_page

SETTINGS = [
    ("delayed", {}), ("delayed", {"history_len": 16}), ("delayed", {"history_len": 1}),
    ("delayed", {"algo": "most_recent"}), ("delayed", {"margin": 2, "history_len": 16}),
    ("delayed", {"convention": "cuda", "history_len": 16}), ("delayed", {"convention": "cuda", "algo": "most_recent"}),
    ("delayed", {"fmt": "fp8_e5m2", "margin": -1}),
    ("current", {}), ("current", {"round_to_power_of_2": True}), ("current", {"convention": "te"}),
    ("current", {"convention": "te", "round_to_power_of_2": True}), ("current", {"fmt": "fp8_e5m2"}),
]
JS_NAMES = {"history_len": "historyLen", "round_to_power_of_2": "roundToPowerOf2"}


@pytest.fixture(scope="module")
def page(browser):
    page = js_module_page(browser, "fp8", "P")
    yield page
    page.close()


def streams() -> dict:
    plain = tensor_stream(600, 1024, seed=0)
    bad = tensor_stream(600, 1024, seed=1, base="normal", spike_log2=14, spike_prob=0.02, inf_prob=0.01,
                        nan_prob=0.01)
    zeros = np.zeros(1024, np.float32)
    zeros[:10] = np.float32(1e-30)  # amaxes that underflow past torchao's 1e-12 floor once scaled
    # E4M3's tie: after a step of amax 1 (scale 448), a magnitude of f32(29/28) lands the amax on 464
    # exactly, which rounds to 448 (not saturated); one more float32 step up saturates
    tie = TensorStream(base=np.array([1.0, -0.5, 0.25, 2.0**-12], np.float32),
                       magnitude=np.array([1.0, 29 / 28, 1.0, np.nextafter(np.float32(29 / 28), np.float32(2))], np.float32),
                       spike=np.zeros(4, bool), nonfinite=np.zeros(4, np.uint8))
    return {"plain": plain, "bad": bad, "tiny": tensor_stream(300, base=zeros, seed=2), "tie": tie}


def run(page, stream, recipe, settings):
    b64 = lambda a: base64.b64encode(np.ascontiguousarray(a).tobytes()).decode()  # noqa: E731
    options = {JS_NAMES.get(k, k): v for k, v in settings.items()}
    got = page.evaluate("""([sorted, mag, bad, recipe, options]) => {
        const r = P.simulateFp8Scaling({sortedAbs: new Float32Array(bytesOf(sorted)), magnitude: new Float32Array(bytesOf(mag)),
          nonfinite: new Uint8Array(bytesOf(bad))}, recipe, options);
        return [b64(r.amax), b64(r.scale), b64(r.frozen), b64(r.saturated), b64(r.underflowed), b64(r.subnormal)]; }""",
                        [b64(stream.sorted_abs), b64(stream.magnitude), b64(stream.nonfinite), recipe, options])
    dtypes = (np.float32, np.float32, np.uint8, np.float64, np.float64, np.float64)
    return [np.frombuffer(base64.b64decode(t), d) for t, d in zip(got, dtypes)]


def same32(a, b) -> bool:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    nan = np.isnan(a)
    return np.array_equal(nan, np.isnan(b)) and np.array_equal(a[~nan].view(np.uint32), b[~nan].view(np.uint32))


@pytest.mark.parametrize("recipe, settings", SETTINGS, ids=lambda v: str(v))
def test_every_recipe_gives_the_packages_trace(page, recipe, settings):
    for name, stream in streams().items():
        amax, scale, frozen, sat, under, sub = run(page, stream, recipe, settings)
        want = simulate_fp8_scaling(stream, recipe, **settings)
        assert same32(amax, want.amax) and same32(scale, want.scale), (name, recipe, settings)
        assert np.array_equal(frozen.astype(bool), want.frozen), (name, recipe, settings)
        assert np.array_equal(sat, want.saturated) and np.array_equal(under, want.underflowed), (name, recipe, settings)
        assert np.array_equal(sub, want.subnormal), (name, recipe, settings)


def test_the_streams_reach_every_case():
    """Saturated steps, underflow, subnormals, frozen updates and NaN scales all occur, so a wrong
    count or update would show."""
    s = streams()
    d16 = simulate_fp8_scaling(s["bad"], history_len=16)
    cur = simulate_fp8_scaling(s["tiny"], "current")
    assert d16.saturated.sum() > 0 and d16.underflowed.sum() > 0 and d16.subnormal.sum() > 0 and d16.frozen.any()
    assert np.isnan(simulate_fp8_scaling(s["bad"], "current").scale).any()
    assert cur.underflowed.sum() > 0
    tie = simulate_fp8_scaling(s["tie"], history_len=1)
    assert tie.scale[1] == 448 and np.float32(np.float32(29 / 28) * np.float32(448)) == 464
    assert tie.saturated.tolist() == [0, 0, 0, 1]  # 464 is the tie that rounds to 448; one step more saturates


def test_bad_settings_are_refused_in_one_line(page):
    errors = page.evaluate("""() => [() => P.simulateDelayed([1], {historyLen: 0}), () => P.simulateDelayed([1], {algo: 'mean'}),
        () => P.currentScale([1], 'fp16'), () => P.simulateFp8Scaling({sortedAbs: [1], magnitude: [1], nonfinite: [0]}, 'late'),
        () => P.currentScale([1], 'fp8_e4m3', false, 'jax')].map((f) => { try { f(); return null; } catch (e) { return e.message; } })""")
    assert all(e and "\n" not in e for e in errors), errors
