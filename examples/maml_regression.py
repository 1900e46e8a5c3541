"""MAML on sine regression: differentiating through functrain optimizer updates.

Each task is a sine wave `y = a * sin(x + phase)` (amplitude in [0.1, 5], phase in [0, pi]); a
model sees 10 points of a new task, takes `inner_steps` steps of a functrain optimizer on them,
and is judged on 10 other points of the same task. MAML (Finn et al. 2017) learns the starting
parameters for which those few steps work best: the meta-gradient flows through the inner
updates, which `differentiable=True` makes autograd ops (`update` and `apply_updates` out of
place, recorded). The meta-optimizer is an ordinary functrain Adam.

    python examples/maml_regression.py                  # about 30 s on one CPU core
    python examples/maml_regression.py --iterations 2000 --inner-steps 3

Prints the meta-loss on held-out tasks before and after meta-training (it drops).
"""

from __future__ import annotations

import argparse
import math

import torch

from functrain import optim

HIDDEN = 40
SHOTS = 10


def init_params(seed: int) -> dict[str, torch.Tensor]:
    """A 1-40-40-1 MLP's parameters as a dict (the model is the function `forward`)."""
    gen = torch.Generator().manual_seed(seed)

    def linear(n_in: int, n_out: int) -> tuple[torch.Tensor, torch.Tensor]:
        bound = 1 / math.sqrt(n_in)
        w = (torch.rand(n_out, n_in, generator=gen) * 2 - 1) * bound
        return w, torch.zeros(n_out)

    params = {}
    for i, (n_in, n_out) in enumerate([(1, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, 1)]):
        params[f"{i}.weight"], params[f"{i}.bias"] = linear(n_in, n_out)
    return params


def forward(params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    h = torch.relu(x @ params["0.weight"].T + params["0.bias"])
    h = torch.relu(h @ params["1.weight"].T + params["1.bias"])
    return h @ params["2.weight"].T + params["2.bias"]


def sample_tasks(n: int, gen: torch.Generator) -> list[tuple[torch.Tensor, ...]]:
    """`n` tasks, each `(x_support, y_support, x_query, y_query)` with SHOTS points apiece."""
    tasks = []
    for _ in range(n):
        amplitude = 0.1 + 4.9 * torch.rand((), generator=gen)
        phase = math.pi * torch.rand((), generator=gen)
        x = torch.rand(2 * SHOTS, 1, generator=gen) * 10 - 5
        y = amplitude * torch.sin(x + phase)
        tasks.append((x[:SHOTS], y[:SHOTS], x[SHOTS:], y[SHOTS:]))
    return tasks


def adapted_loss(meta_params, task, inner_opt, inner_steps: int) -> torch.Tensor:
    """The query loss after `inner_steps` differentiable inner updates on the support set."""
    x_s, y_s, x_q, y_q = task
    params, state = dict(meta_params), inner_opt.init(meta_params)
    for _ in range(inner_steps):
        loss = torch.nn.functional.mse_loss(forward(params, x_s), y_s)
        grads = torch.autograd.grad(loss, list(params.values()), create_graph=True)
        updates, state = inner_opt.update(dict(zip(params, grads)), state, params)
        params = optim.apply_updates(params, updates)  # on the tape: a function of meta_params
    return torch.nn.functional.mse_loss(forward(params, x_q), y_q)


def meta_loss(meta_params, tasks, inner_opt, inner_steps: int) -> torch.Tensor:
    losses = [adapted_loss(meta_params, t, inner_opt, inner_steps) for t in tasks]
    return torch.stack(losses).mean()


def train(
    iterations: int = 1000,
    inner_steps: int = 1,
    inner_lr: float = 0.01,
    meta_lr: float = 1e-2,
    tasks_per_batch: int = 5,
    seed: int = 0,
) -> tuple[float, float]:
    """Meta-train; returns the held-out meta-loss `(before, after)`.

    Example:
        >>> before, after = train(iterations=300)
        >>> after < before
        True
    """
    torch.manual_seed(seed)
    meta_params = {k: v.requires_grad_(True) for k, v in init_params(seed).items()}
    inner_opt = optim.sgd(inner_lr, differentiable=True)
    meta_opt = optim.adam(meta_lr)
    meta_state = meta_opt.init(meta_params)
    gen = torch.Generator().manual_seed(seed + 1)
    held_out = sample_tasks(50, torch.Generator().manual_seed(seed + 2))

    def evaluate_meta(params) -> float:
        return meta_loss(params, held_out, inner_opt, inner_steps).item()

    before = evaluate_meta(meta_params)
    for _ in range(iterations):
        loss = meta_loss(meta_params, sample_tasks(tasks_per_batch, gen), inner_opt, inner_steps)
        grads = torch.autograd.grad(loss, list(meta_params.values()))
        updates, meta_state = meta_opt.update(
            dict(zip(meta_params, grads)), meta_state, meta_params
        )
        meta_params = optim.apply_updates(meta_params, updates)  # ordinary: fresh leaves
    return before, evaluate_meta(meta_params)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--inner-steps", type=int, default=1)
    parser.add_argument("--inner-lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    before, after = train(args.iterations, args.inner_steps, args.inner_lr, seed=args.seed)
    print(
        f"held-out meta-loss (after {args.inner_steps} inner step(s)): {before:.3f} -> {after:.3f}"
    )


if __name__ == "__main__":
    main()
