"""ampviz.training: real, deterministic gradients, and torch's casts as a reference for the core."""

import math

import numpy as np
import pytest
import torch

from ampviz import FORMATS
from ampviz import training as T
from ampviz.formats.census import census
from ampviz.scaling.lesson import largest_safe_scale


@pytest.fixture(scope="module")
def grads():
    return T.model_gradients(seed=0)


def test_shape_dtype_and_parameter_order(grads):
    problem = T.build_problem(0)
    params = list(problem.model.parameters())
    assert grads.dtype == np.float32 and grads.ndim == 1
    assert grads.size == sum(p.numel() for p in params) == 44362
    layers = T.layer_gradients(0)
    assert list(layers) == [n for n, _ in problem.model.named_parameters()]
    assert list(layers)[:2] == ["fc1.weight", "fc1.bias"] and list(layers)[-1] == "fc12.bias"
    np.testing.assert_array_equal(np.concatenate(list(layers.values())), grads)


def test_deterministic_and_seed_dependent(grads):
    np.testing.assert_array_equal(T.model_gradients(seed=0), grads)
    assert not np.array_equal(T.model_gradients(seed=1), grads)


def test_leaves_the_global_random_state_alone():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    T.model_gradients(seed=5)
    assert torch.equal(torch.get_rng_state(), before)


def test_they_are_the_real_gradients_of_the_loss(grads):
    """Directional derivative of the loss (float64 copy of the same model) along the gradient."""
    problem = T.build_problem(0)
    model = problem.model.double()
    x, y = problem.inputs.double(), problem.targets
    theta = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    d = torch.from_numpy(grads.astype(np.float64))

    def loss_at(t):
        torch.nn.utils.vector_to_parameters(t, model.parameters())
        with torch.no_grad():
            return torch.nn.functional.cross_entropy(model(x), y).item()

    eps = 1e-3 / d.norm().item()
    slope = (loss_at(theta + eps * d) - loss_at(theta - eps * d)) / (2 * eps)
    assert slope == pytest.approx(d.dot(d).item(), rel=1e-4)
    # and element by element against float64 autograd
    torch.nn.utils.vector_to_parameters(theta, model.parameters())
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    g64 = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).numpy()
    np.testing.assert_allclose(grads, g64, rtol=1e-3, atol=1e-6 * np.abs(g64).max())


def test_loss_scale_multiplies_every_gradient_exactly(grads):
    for k in (3, 20):
        s = 2.0**k
        np.testing.assert_array_equal(T.model_gradients(0, loss_scale=s), grads * np.float32(s))


def test_the_lesson_is_visible(grads):
    """What notebook 02 teaches holds for this model: fp16 loses a share at scale 1, the layers
    far from the loss have the smallest gradients, and the largest safe scale loses nothing."""
    c1 = census(grads, "fp16", 1.0)
    assert 0.02 < c1.fractions["underflow"] < 0.2
    assert c1.fractions["subnormal"] > 0.2
    assert 0.2 < c1.fractions["zero"] < 0.7  # ReLU units inactive for the whole batch
    layers = T.layer_gradients(0)
    first, last = np.abs(layers["fc1.weight"]).max(), np.abs(layers["fc12.weight"]).max()
    assert first < last / 100
    s = largest_safe_scale(grads, "fp16")
    cs = census(grads, "fp16", s)
    assert cs.counts["underflow"] == 0 and cs.counts["overflow"] == 0
    assert census(grads, "fp16", 2 * s).counts["overflow"] > 0


def test_build_problem_options_and_validation():
    p = T.build_problem(0, depth=3, width=8, features=4, classes=3, batch=5)
    assert p.inputs.shape == (5, 4) and p.targets.shape == (5,)
    assert int(p.targets.max()) < 3
    assert p.model(p.inputs).shape == (5, 3)
    assert math.isfinite(p.loss().item())
    assert T.model_gradients(0, depth=1, width=8).size == 32 * 10 + 10
    with pytest.raises(ValueError):
        T.build_problem(0, depth=0)
    with pytest.raises(ValueError):
        T.build_problem(0, classes=1)


# ----- torch as the reference -----
@pytest.mark.parametrize("fmt", ["fp16", "bf16", "fp8_e5m2", "fp32"])
def test_torch_cast_counts_equal_census(grads, fmt):
    for k in (-4, 0, 8, 16, 20, 21, 30):
        assert T.torch_cast_counts(grads, 2.0**k, fmt) == census(grads, fmt, 2.0**k).counts, k


def test_torch_cast_counts_special_values():
    v = np.array([0.0, 1e-30, 1e-6, 1.0, 1e5, np.inf, -np.inf, np.nan], np.float32)
    counts = T.torch_cast_counts(v, 1.0, "float16")
    assert counts == {"zero": 1, "underflow": 1, "subnormal": 1, "normal": 1, "overflow": 3, "nan": 1}
    assert counts == census(v, "fp16", 1.0).counts
    with pytest.raises(ValueError, match="no inf"):
        T.torch_cast_counts(v, 1.0, "float8_e4m3fn")


def test_torch_cast_matches_quantize():
    v = [448, 464, 480, 500, 1e6, 57344, 60000, 61439, 61440, 65519, 65520, 2**-25, 1.5 * 2**-25]
    for fmt in ("fp16", "bf16", "fp8_e4m3", "fp8_e5m2"):
        np.testing.assert_array_equal(T.torch_cast(v, fmt), FORMATS[fmt].quantize(np.array(v)))
    assert T.torch_cast([500, 1e6], "fp8_e4m3").tolist() == [448, 448]
    assert T.torch_cast([60000, 61440], "fp8_e5m2").tolist() == [57344, math.inf]


def test_torch_dtype_names():
    assert T.torch_dtype("fp16") is torch.float16
    assert T.torch_dtype("bfloat16") is torch.bfloat16
    assert T.torch_dtype(FORMATS["fp8_e4m3"]) is torch.float8_e4m3fn
    assert T.torch_dtype(torch.float32) is torch.float32
    for bad in ("float99", "tf32", "Tensor"):
        with pytest.raises(ValueError):
            T.torch_dtype(bad)


def test_torch_add_and_accumulate():
    assert T.torch_add(1, 2**-11, "fp16") == 1.0
    assert T.torch_add(1, 2**-10, "fp16") == 1 + 2**-10
    assert T.torch_add(1, 2**-11, "fp32") == 1 + 2**-11
    w = T.torch_accumulate(1.0, 1e-4, 100, "fp16")
    assert w.shape == (101,) and (w == 1.0).all()
    w32 = T.torch_accumulate(1.0, 1e-4, 100, "fp32")
    assert w32[-1] == pytest.approx(1.01, abs=1e-5)
