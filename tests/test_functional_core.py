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


def test_eight_mlps_trained_in_one_vmapped_step_equal_eight_separate_runs():
    """Issue 28.1 at the optimizer level: 8 digits MLPs, 5 steps of functional_call + grad +
    functrain AdamW, vmapped over the members, equal 8 separate runs to 1e-6."""
    from bench import ensemble
    from functrain import optim
    from functrain.tree import tree_allclose, tree_map

    xs, ys = ensemble._data(8, 32)
    models = [ensemble._model(i) for i in range(8)]
    opt = optim.adamw(1e-2)

    def step(params, state, x, y):
        def loss(p):
            out = torch.func.functional_call(models[0], p, (x,))
            return torch.nn.functional.cross_entropy(out, y)

        updates, state = opt.update(torch.func.grad(loss)(params), state, params)
        return optim.apply_updates(params, updates), state

    separate = [{k: v.detach().clone() for k, v in m.named_parameters()} for m in models]
    dims = tree_map(lambda v: 0 if isinstance(v, torch.Tensor) else None, opt.init(separate[0]))
    params = tree_map(lambda *v: torch.stack(v), *separate)
    state = torch.func.vmap(opt.init, out_dims=dims)(params)
    states = [opt.init(p) for p in separate]
    batched = torch.func.vmap(step, in_dims=(0, dims, 0, 0), out_dims=(0, dims))
    for _ in range(5):
        params, state = batched(params, state, xs, ys)
        for i in range(8):
            separate[i], states[i] = step(separate[i], states[i], xs[i], ys[i])
    assert not tree_allclose(separate[0], separate[1])  # the members differ
    for i in range(8):
        member = tree_map(lambda v, i=i: v[i], params)
        assert tree_allclose(member, separate[i], atol=1e-6, rtol=0)


def test_the_ensemble_bench_writes_its_four_rows_and_the_ratio(tmp_path):
    from bench import ensemble

    out = tmp_path / "ensemble.json"
    report = ensemble.main(["--members", "2", "--reps", "1", "--calls", "1", "--out", str(out)])
    assert set(report["variants"]) == {
        "vmapped_step",
        "vmapped",
        "sequential_func",
        "sequential_step",
    }
    assert report["variants"]["sequential_step"]["ratio"] == 1.0
    assert "vmapped vs sequential" in report["note"] and out.exists()
