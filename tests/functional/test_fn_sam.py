"""SAM's ascent: a step of norm rho along the gradient."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.functional.gradient_clipping import global_grad_norm
from functrain.functional.sam import perturb, sam_perturbation


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), rho=st.floats(0.0, 2.0))
def test_perturbation_has_norm_rho_along_the_gradient(seed, rho):
    g = torch.Generator().manual_seed(seed)
    grads = {"a": torch.randn(3, 2, generator=g), "b": torch.randn(4, generator=g)}
    delta = sam_perturbation(grads, rho)
    assert float(global_grad_norm(delta)) == pytest.approx(rho, rel=1e-5, abs=1e-7)
    norm = global_grad_norm(grads)
    for k in grads:
        torch.testing.assert_close(delta[k], grads[k] * rho / norm)
    params = {"a": torch.zeros(3, 2), "b": torch.ones(4), "frozen": torch.ones(1)}
    moved = perturb(params, delta)
    assert moved["frozen"] is params["frozen"]
    torch.testing.assert_close(moved["b"], 1 + delta["b"])


def test_zero_gradient_and_errors():
    delta = sam_perturbation({"w": torch.zeros(3)}, rho=0.05)
    assert torch.equal(delta["w"], torch.zeros(3))
    with pytest.raises(ValueError, match="rho"):
        sam_perturbation({"w": torch.ones(1)}, rho=-0.1)


def test_defaults_give_a_step_of_norm_five_hundredths():
    # Default rho 0.05: the gradient (3, 4) has norm 5, so e = 0.05 * (3, 4) / 5 = (0.03, 0.04).
    delta = sam_perturbation({"w": torch.tensor([3.0, 4.0]), "b": torch.tensor([0.0])})
    torch.testing.assert_close(delta["w"], torch.tensor([0.03, 0.04]))
    assert torch.equal(delta["b"], torch.zeros(1))
    # Default epsilon 1e-12 only matters for tiny gradients: norm 5e-12 gives the scale
    # 0.05 / (5e-12 + 1e-12), so e = (3e-12, 4e-12) * 0.05 / 6e-12 = (0.025, 0.0333...).
    tiny = sam_perturbation({"w": torch.tensor([3e-12, 4e-12])})
    torch.testing.assert_close(tiny["w"], torch.tensor([0.025, 0.2 / 6]), rtol=1e-5, atol=0)


def test_epsilon_zero_is_exact_and_a_negative_epsilon_is_rejected():
    delta = sam_perturbation({"w": torch.tensor([0.0, 2.0])}, rho=0.5, epsilon=0.0)
    assert torch.equal(delta["w"], torch.tensor([0.0, 0.5]))
    for bad in (-1e-12, -0.5, -2.0):
        with pytest.raises(ValueError, match="epsilon >= 0"):
            sam_perturbation({"w": torch.ones(1)}, epsilon=bad)
