"""ampviz.scaling.recipes: the recipe, the draws and the arithmetic that remains rebuild every
scenario stream of synth bit for bit, and the exception list holds every step where an exp2 a few
ulps off would change the float32 stream."""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ampviz.scaling import recipes, synth

GRID = [round(k * 0.05, 12) for k in range(21)]


@pytest.mark.parametrize("name", list(synth.SCENARIOS))
def test_rebuild_equals_synth_on_the_slider_grid_and_between(name):
    z = recipes.normals(20_000, 0)
    rng = np.random.default_rng(7)
    for s in GRID + list(rng.random(6)) + [0.35000000000000003, 1e-300]:
        want = synth.scenario(name, 20_000, s, np.random.default_rng(0))
        assert np.array_equal(recipes.rebuild(recipes.recipe(name, s), z), want), (name, s)


def test_rebuild_holds_for_other_seeds_and_lengths():
    for seed, steps in ((1, 1), (2, 2), (3, 999), (12, 100_000)):
        z = recipes.normals(steps, seed)
        for name in synth.SCENARIOS:
            want = synth.scenario(name, steps, 0.65, np.random.default_rng(seed))
            assert np.array_equal(recipes.rebuild(recipes.recipe(name, 0.65), z), want), (name, seed, steps)


def test_the_draws_are_the_seeds_standard_normals():
    assert np.array_equal(recipes.normals(500, 3), np.random.default_rng(3).standard_normal(500))
    assert recipes.normals(0, 0).size == 0


def test_a_different_linspace_or_warmup_would_differ():
    """The level's arithmetic matters to the bit of log2 (which the browser test holds): a + i *
    (b - a) / div is not numpy's linspace, and a warm-up computed as a * (1 - t) + b * t is not
    synth's."""
    z = recipes.normals(20_000, 0)
    i = np.arange(z.size)
    rec = recipes.recipe("drift", 0.7)
    lv = rec["level"]
    wrong = z * 0.5 + (lv["a"] + i * (lv["b"] - lv["a"]) / (z.size - 1))
    assert not np.array_equal(wrong, recipes._log2_stream(rec, z))
    assert np.array_equal(z * 0.5 + np.linspace(lv["a"], lv["b"], z.size), recipes._log2_stream(rec, z))
    rec = recipes.recipe("warmup", 0.7)
    lv = rec["level"]
    t = np.minimum(i / 500, 1.0)
    wrong = z * 0.5 + (lv["a"] * (1 - t) + lv["b"] * t)
    assert not np.array_equal(wrong, recipes._log2_stream(rec, z))


def test_an_exp2_a_few_ulps_off_changes_only_the_exception_steps():
    z = recipes.normals(100_000, 0)
    for name in synth.SCENARIOS:
        for s in GRID:
            rec = recipes.recipe(name, s)
            y = np.exp2(recipes._log2_stream(rec, z))
            steps, values = recipes.exceptions(rec, z)
            assert np.array_equal(values, y[steps].astype(np.float32))
            for k in (-4, 4):  # another libm, off by a few ulps everywhere
                off = (y + k * np.spacing(y)).astype(np.float32)
                changed = np.flatnonzero(off != y.astype(np.float32))
                assert np.isin(changed, steps).all(), (name, s, k)
    # the margin is not vacuous: some step of the grid lies that close to a float32 midpoint
    assert sum(recipes.exceptions(recipes.recipe(n, s), z)[0].size for n in synth.SCENARIOS for s in GRID) >= 1


def test_an_exception_is_a_step_next_to_a_float32_midpoint():
    rec = {"jitter": 0.0, "level": {"kind": "constant", "a": math.log2(1 + 2.0**-24)}, "events": None}
    steps, values = recipes.exceptions(rec, np.zeros(3))
    assert steps.tolist() == [0, 1, 2]
    assert values.tolist() == [float(np.float32(np.exp2(math.log2(1 + 2.0**-24))))] * 3
    rec["level"]["a"] = math.log2(1 + 2.0**-20)
    assert recipes.exceptions(rec, np.zeros(3))[0].size == 0


def test_parts_bundles_what_a_page_needs():
    p = recipes.parts("spikes", 1000, 0.5, seed=4)
    assert p["recipe"] == recipes.recipe("spikes", 0.5)
    assert np.array_equal(p["normals"], recipes.normals(1000, 4))
    assert p["exception_steps"].dtype.kind == "i" and p["exception_values"].dtype == np.float32


def test_bad_input_is_one_clear_error():
    with pytest.raises(ValueError, match="unknown scenario 'gusts'; choose one of steady"):
        recipes.recipe("gusts", 0.5)
    with pytest.raises(ValueError, match="strength must be between 0 and 1"):
        recipes.recipe("drift", 1.5)
    with pytest.raises(TypeError, match="strength must be a number"):
        recipes.recipe("drift", "x")
    with pytest.raises(ValueError, match="seed"):
        recipes.normals(10, -1)
    with pytest.raises((TypeError, ValueError), match="steps"):
        recipes.normals(-1, 0)


@settings(max_examples=60, deadline=None)
@given(name=st.one_of(st.sampled_from(list(synth.SCENARIOS)), st.text(max_size=8)),
       strength=st.one_of(st.floats(allow_nan=True), st.integers(-3, 3), st.none(), st.text(max_size=3)))
def test_any_recipe_argument_gives_a_recipe_or_one_clear_error(name, strength):
    try:
        rec = recipes.recipe(name, strength)
    except (TypeError, ValueError) as e:
        assert "\n" not in str(e) and str(e)
        return
    z = recipes.normals(300, 1)
    assert np.array_equal(recipes.rebuild(rec, z), synth.scenario(name, 300, strength, np.random.default_rng(1)))
