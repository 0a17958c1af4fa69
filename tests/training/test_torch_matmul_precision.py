"""``ampviz.training.matmul_precision``: what ``torch.set_float32_matmul_precision`` sets and does on
this CPU, the global setting restored (even on an error), and the emulated modes' errors on a real
layer against torch's own casts."""

from __future__ import annotations

import pytest
import torch

import ampviz.training.matmul_precision as mp
from ampviz.formats.matmul_precision import MATMUL_MODES, relative_error
from ampviz.training.matmul_precision import SETTINGS, layer_error, precision_switches


def _state():
    return mp._saved_setting()


@pytest.fixture(scope="module")
def switches():
    return {row.setting: row for row in precision_switches()}


def test_each_setting_reports_itself_and_sets_the_backends(switches):
    assert list(switches) == list(SETTINGS)
    assert {s: r.reported for s, r in switches.items()} == {s: s for s in SETTINGS}
    assert {s: r.mkldnn_matmul for s, r in switches.items()} == {"highest": "ieee", "high": "tf32", "medium": "bf16"}
    assert {s: r.cuda_matmul for s, r in switches.items()} == {"highest": "ieee", "high": "tf32", "medium": "tf32"}


def test_the_measurements_agree_with_each_other(switches):
    highest = switches["highest"]
    assert not highest.changed and highest.changed_share == 0 and highest.closest == "fp32"
    assert highest.error < 2.0**-20  # a float32 kernel: summation error only
    for row in switches.values():
        assert row.changed == (row.changed_share > 0)
        assert row.closest in MATMUL_MODES
        if not row.changed:
            assert row.error == highest.error
        assert all(kernel.endswith(")") for kernel in row.onednn)


def test_highest_is_torchs_plain_forward(switches):
    layer, x, reference = mp._layer(0, 64)
    with torch.no_grad():
        out = layer(x)
    assert switches["highest"].error == relative_error(out.numpy(), reference.numpy())


@pytest.mark.parametrize("start", ["highest", "high", "medium"])
def test_the_global_setting_is_restored(start):
    before = _state()
    try:
        torch.set_float32_matmul_precision(start)
        inside = _state()
        precision_switches(batch=4)
        assert _state() == inside
    finally:
        mp._restore(before)


def test_the_backend_flags_are_restored_as_set_apart():
    before = _state()
    try:
        torch.set_float32_matmul_precision("highest")
        torch.backends.mkldnn.matmul.fp32_precision = "bf16"  # set apart: torch names no one setting now
        inside = _state()
        assert inside[0] is None
        precision_switches(batch=4)
        assert _state() == inside
    finally:
        mp._restore(before)


def test_the_global_setting_is_restored_on_an_error(monkeypatch):
    before = _state()
    calls = []

    def failing(fn):
        calls.append(torch.get_float32_matmul_precision())
        if len(calls) == 2:
            raise RuntimeError("kernel failed")
        return fn(), ""

    monkeypatch.setattr(mp, "_run_logged", failing)
    with pytest.raises(RuntimeError, match="kernel failed"):
        precision_switches(batch=4)
    assert calls == ["highest", "high"] and _state() == before


def test_torchs_random_state_is_left_alone():
    state = torch.random.get_rng_state()
    layer_error("bf16", batch=4)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_layer_errors_in_order_and_against_torchs_casts():
    errors = {mode: layer_error(mode) for mode in MATMUL_MODES}
    assert errors["fp32"] < errors["bf16x3"] < errors["tf32"] < errors["bf16"]
    assert errors["bf16x3"] < errors["bf16"] / 2**9
    layer, x, _ = mp._layer(0, 64)
    w = layer.weight.detach()
    reference = x.double() @ w.double().T
    fp32 = reference.float().double()  # the float64 product rounded to float32
    bf16 = (x.to(torch.bfloat16).double() @ w.to(torch.bfloat16).double().T).float().double()
    hx, hw = x.to(torch.bfloat16), w.to(torch.bfloat16)
    lx, lw = (x - hx.float()).to(torch.bfloat16), (w - hw.float()).to(torch.bfloat16)
    bf16x3 = (hx.double() @ hw.double().T + hx.double() @ lw.double().T + lx.double() @ hw.double().T).float().double()
    for mode, torch_built in [("fp32", fp32), ("bf16", bf16), ("bf16x3", bf16x3)]:
        assert errors[mode] == pytest.approx(relative_error(torch_built.numpy(), reference.numpy()), rel=1e-6)


def test_bad_arguments_are_one_line_errors():
    for call in [lambda: layer_error("fp64"), lambda: layer_error(None), lambda: layer_error("bf16", batch=0),
                 lambda: layer_error("bf16", seed="x"), lambda: precision_switches(batch=1.5)]:
        with pytest.raises((ValueError, TypeError)) as info:
            call()
        assert str(info.value) and "\n" not in str(info.value)
