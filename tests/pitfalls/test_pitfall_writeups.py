"""The write-ups' claims on the Lightning pitfalls, each run (lessons 08, 09, 10)."""

import pytest

from ampviz.pitfalls.autocast_cache import real_plain, simulated_plain
from ampviz.pitfalls.manual_backward import cpu_16_mixed, fp16_loss_backward
from ampviz.pitfalls.transformer_eval import crash, encoder_call, fix_runs
from ampviz.pitfalls.writeups import accumulation_run, cache_claims, encoder_claims, manual_claims


def test_the_snippet_without_zero_grad_accumulates():
    plain, fixed = accumulation_run(False), accumulation_run(True)
    n, m = plain.grad_norms["per_step"], fixed.grad_norms["per_step"]
    assert plain.details["accumulated"] == [False, True]  # step 2's .grad = step 1's + its own, exactly
    assert fixed.details["accumulated"] == [False, False]
    assert n[0] == m[0] and 1.8 < n[1] / n[0] < 2.2 and 0.8 < m[1] / m[0] < 1.2


def test_accumulation_run_checks_its_arguments():
    with pytest.raises(TypeError):
        accumulation_run(1)
    with pytest.raises((TypeError, ValueError)):
        accumulation_run(False, 0)


def test_manual_claims():
    t = manual_claims(fp16_loss_backward(), cpu_16_mixed())
    assert "AssertionError" in t.rows[0][2] and "'bf16-mixed'" in t.rows[0][2]
    assert t.rows[1][2].startswith("gradients accumulate") and "True" in t.rows[1][2]


def test_cache_claims():
    t = cache_claims(real_plain("linear"), simulated_plain("linear"),
                     simulated_plain("linear", "autocast_off_in_no_grad"), simulated_plain("linear", "reenter_nested"))
    assert t.rows[0][2].startswith("installed torch: trains; simulated legacy cache: RuntimeError: element 0")
    assert t.rows[1][2] == "holds (legacy rule): trains"
    assert "RuntimeError" in t.rows[2][2]


def test_encoder_claims():
    t = encoder_claims(crash("bf16-mixed"), encoder_call(), fix_runs())
    assert "expected scalar type Float but found BFloat16" in t.rows[0][2]
    assert t.rows[1][2] == "holds: plain torch, no Trainer: RuntimeError"
    assert t.rows[2][2].startswith("validates (ran)")
