"""Shared fixtures for the optimizer tests: a real small model on sklearn digits, and random trees."""

from __future__ import annotations

import pytest
import torch

from functrain.optim import apply_updates

STEPS = 200
BATCH = 32


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Run these tiny models on one thread: on a shared 2-core machine, two threads contend and
    make each step several times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _mlp(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 10))
    return model.to(dtype)


@pytest.fixture(scope="session")
def digits():
    """`(x, y, batches)`: standardised digits and 200 fixed minibatch index tensors."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float64)
    x = (x - x.mean(0)) / (x.std(0) + 1e-6)
    y = torch.tensor(data.target)
    gen = torch.Generator().manual_seed(1234)
    batches = [torch.randint(0, len(x), (BATCH,), generator=gen) for _ in range(STEPS)]
    return x, y, batches


@pytest.fixture(scope="session")
def train_torch(digits):
    """`train_torch(make_opt, make_scheduler=None, dtype=float64) -> {name: tensor}`: 200 steps
    of a torch optimizer on the MLP."""
    x64, y, batches = digits

    def run(make_opt, make_scheduler=None, dtype=torch.float64):
        model, x = _mlp(dtype), x64.to(dtype)
        opt = make_opt(model.parameters())
        sched = make_scheduler(opt) if make_scheduler else None
        for idx in batches:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
            if sched is not None:
                sched.step()
        return {k: v.detach().clone() for k, v in model.named_parameters()}

    return run


@pytest.fixture(scope="session")
def train_functional(digits):
    """`train_functional(transform, donate=False, dtype=float64) -> {name: tensor}`: the same 200
    steps with a functrain optimizer (grads from autograd.grad over functional_call)."""
    x64, y, batches = digits

    def run(transform, donate=False, dtype=torch.float64):
        model, x = _mlp(dtype), x64.to(dtype)
        params = {k: v.detach().clone() for k, v in model.named_parameters()}
        state = transform.init(params)
        for idx in batches:
            leaves = {k: v.requires_grad_(True) for k, v in params.items()}
            out = torch.func.functional_call(model, leaves, (x[idx],))
            loss = torch.nn.functional.cross_entropy(out, y[idx])
            grads = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))
            params = {k: v.detach() for k, v in leaves.items()}
            updates, state = transform.update(grads, state, params, donate=donate)
            params = apply_updates(params, updates, donate=donate)
        return params

    return run


def max_abs_diff(a: dict, b: dict) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="session")
def max_diff():
    """`max_diff(a, b)`: max abs difference over two `{name: tensor}` dicts."""
    return max_abs_diff


@pytest.fixture(scope="session")
def random_tree():
    """`random_tree(seed, scale=1.0) -> {name: tensor}` with a matrix, a bias and a conv kernel."""

    def make(seed: int, scale: float = 1.0, dtype=torch.float32) -> dict:
        gen = torch.Generator().manual_seed(seed)
        shapes = {"fc.weight": (5, 3), "fc.bias": (5,), "conv.weight": (4, 2, 3, 3)}
        return {k: scale * torch.randn(s, generator=gen, dtype=dtype) for k, s in shapes.items()}

    return make
