"""Pitfall 2: a no_grad forward inside autocast, then a grad forward (ampviz.pitfalls.autocast_cache).

The installed versions (torch 2.13, Lightning 2.6.6) train correctly; the simulated legacy rule
reproduces the historical error, its silent variant, and the result of each fix.
"""

import pytest
import torch

from ampviz.pitfalls import autocast_cache as ac

ERROR = "element 0 of tensors does not require grad and does not have a grad_fn"


def _all_grads(outcome):
    return bool(outcome.grad_norms) and all(g is not None and g > 0 for g in outcome.grad_norms.values())


# ----- the installed versions -----
@pytest.mark.parametrize("kind", ["linear", "layernorm"])
def test_installed_torch_trains(kind):
    o = ac.real_plain(kind)
    assert not o.failed and _all_grads(o)
    assert o.details["versions"]["torch"] == torch.__version__


def test_installed_torch_matches_simulation_without_the_pattern():
    """Where the legacy rule does not bite (grad pass first), the simulation gives the real gradients."""
    assert ac.simulated_plain("linear", "grad_first").grad_norms == ac.real_plain("linear").grad_norms


def test_installed_lightning_trains_and_disables_the_cache():
    o = ac.real_lightning()
    assert not o.failed and _all_grads(o)
    assert o.details["precision"] == "bf16-mixed" and o.details["steps"] == 2
    assert o.details["seen in training_step"] == {"autocast enabled": True, "autocast dtype": "torch.bfloat16",
                                                  "autocast cache enabled": False}


def test_world_on_the_pinned_versions():
    w = ac.world()
    assert w["torch: grad pass after a no_grad pass gets gradients"] is True
    assert w["lightning bf16-mixed autocast cache_enabled"] is False
    assert "fixed world" in ac.which_world()


# ----- the simulated legacy rule -----
def test_simulation_reproduces_the_error():
    o = ac.simulated_plain("linear")
    assert (o.error_type, o.message) == ("RuntimeError", ERROR)


def test_simulation_silent_variant_leaves_linear_without_grad():
    o = ac.simulated_plain("layernorm")
    assert not o.failed
    assert o.grad_norms["0.weight"] is None and o.grad_norms["0.bias"] is None  # the Linear
    assert o.grad_norms["1.weight"] > 0 and o.grad_norms["1.bias"] > 0  # the LayerNorm trains
    assert o.details["cache_hits"] == 2


@pytest.mark.parametrize("fix", ["grad_first", "autocast_off_in_no_grad", "reenter_top_level",
                                 "cache_disabled", "clear_cache"])
@pytest.mark.parametrize("kind", ["linear", "layernorm"])
def test_simulation_fixes_work(kind, fix):
    o = ac.simulated_plain(kind, fix)
    assert not o.failed and _all_grads(o)
    assert o.grad_norms == ac.real_plain(kind).grad_norms  # the same gradients as the installed torch


def test_reentering_autocast_nested_does_not_help():
    o = ac.simulated_plain("linear", "reenter_nested")
    assert (o.error_type, o.message) == ("RuntimeError", ERROR)
    assert ac.simulated_plain("layernorm", "reenter_nested").grad_norms["0.weight"] is None


def test_fix_table_lists_every_arrangement():
    table = ac.fix_table("linear")
    assert len(table.rows) == len(ac.SIMULATED_FIXES)
    assert table.column("result").count("RuntimeError") == 2  # no fix, and the nested re-entry
    assert "no grad for 0.weight, 0.bias" in str(ac.fix_table("layernorm"))


def test_simulation_follows_the_legacy_rule():
    """Only fp32 leaves that require grad are cached; only with the cache enabled; cleared when the
    outermost autocast exits or by torch.clear_autocast_cache(); nothing leaks after the mode."""
    w = torch.randn(3, 3, requires_grad=True)
    frozen = torch.randn(3, 3)  # no grad: never cached
    x = torch.randn(2, 3)
    real_clear = torch.clear_autocast_cache
    with ac.SimulatedLegacyAutocastCache() as sim:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                torch.nn.functional.linear(x, w)
                torch.nn.functional.linear(x, frozen)
                torch.nn.functional.linear(x, w[:2])  # a view: not cached
            assert [v[0] is w for v in sim.cache.values()] == [True]  # the inner exit keeps it
            out = torch.nn.functional.linear(x, w)
            assert sim.hits == 1 and out.dtype == torch.bfloat16
            torch.clear_autocast_cache()
            assert sim.cache == {}
            with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
                torch.nn.functional.linear(x, w)
            assert sim.cache == {}
            torch.nn.functional.linear(x, w)
        assert sim.cache == {}  # the outermost exit clears it
        torch.nn.functional.linear(x, w)  # no autocast: untouched
        assert sim.cache == {}
    assert torch.clear_autocast_cache is real_clear


def test_simulation_in_a_trainer():
    o = ac.simulated_lightning("linear", plugin="legacy")
    assert (o.error_type, o.message) == ("RuntimeError", ERROR)
    silent = ac.simulated_lightning("layernorm", plugin="legacy")
    assert not silent.failed and silent.grad_norms["0.weight"] is None and silent.grad_norms["1.weight"] > 0
    installed = ac.simulated_lightning("linear", plugin="installed")  # cache_enabled=False: the rule never caches
    assert not installed.failed and installed.grad_norms == ac.real_lightning("linear").grad_norms


def test_unknown_arguments_are_refused():
    with pytest.raises(ValueError):
        ac.make_model("conv")
    with pytest.raises(ValueError):
        ac.simulated_plain("linear", "nope")
    with pytest.raises(ValueError):
        ac.simulated_lightning(plugin="nope")


def test_summary_is_stable_text():
    assert ac.summary(ac.simulated_plain("linear")).endswith("RuntimeError: " + ERROR)
    text = ac.summary(ac.simulated_plain("layernorm"))
    assert "0.weight None, 0.bias None, 1.weight grad, 1.bias grad" in text
