"""The functional core used as a JAX user would (issue 28): MAML through differentiable
functrain optimizer updates (examples/maml_regression.py)."""

from __future__ import annotations

import pytest
import torch
from example_runs import load_example


def test_maml_meta_training_lowers_the_held_out_meta_loss():
    maml = load_example("maml_regression")
    before, after = maml.train(iterations=300, seed=0)
    assert after < 0.7 * before, (before, after)


def test_the_maml_meta_gradient_equals_finite_differences_through_two_inner_updates():
    maml = load_example("maml_regression")
    start = {k: v.double() for k, v in maml.init_params(0).items()}
    task = [t.double() for t in maml.sample_tasks(1, torch.Generator().manual_seed(0))[0]]
    inner = maml.optim.sgd(0.01, momentum=0.9, differentiable=True)

    def loss_at(params):
        params = {k: v.detach().requires_grad_(True) for k, v in params.items()}
        return maml.adapted_loss(params, task, inner, 2), params

    loss, params = loss_at(start)
    grads = torch.autograd.grad(loss, list(params.values()))
    gen = torch.Generator().manual_seed(1)
    direction = {
        k: torch.randn(v.shape, generator=gen, dtype=torch.float64) for k, v in start.items()
    }
    eps = 1e-6
    plus = loss_at({k: v + eps * direction[k] for k, v in start.items()})[0]
    minus = loss_at({k: v - eps * direction[k] for k, v in start.items()})[0]
    numeric = ((plus - minus) / (2 * eps)).item()
    analytic = sum((g * direction[k]).sum() for g, k in zip(grads, start)).item()
    assert analytic == pytest.approx(numeric, rel=1e-5)
