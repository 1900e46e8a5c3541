"""An ensemble of 8 MLPs on scikit-learn's digits, trained in one vmapped functrain step.

    python examples/ensemble_digits.py                   # 8 members, 30 epochs: seconds on CPU
    python examples/ensemble_digits.py --members 16 --epochs 50

Each member has its own initialisation and sees the training set in its own order. Their
`TrainState`s are stacked into one (`functrain.stack_states`); `torch.func.vmap` maps the step
that `functrain.make_step` built over the stacked state and the members' batches, so one call
trains all members (JAX's `jax.vmap(train_step)`). At the end the state is split again
(`functrain.unstack_states`) and each member, and the ensemble (the mean of the members'
probabilities), is evaluated on the test set.

Prints each member's test accuracy and the ensemble's (above the members' mean: 0.964 against
0.961 for the defaults).
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from _common import example_parser, set_threads
from torch import nn

import functrain
from functrain import datasets


def build_model(seed: int, hidden: int) -> nn.Module:
    """A 64-hidden-10 MLP with its own initialisation."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.Tanh(), nn.Linear(hidden, 10))


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


def member_batches(n: int, members: int, batch_size: int, gen: torch.Generator):
    """One epoch of index batches `[members, batch_size]`: each member its own permutation."""
    orders = torch.stack([torch.randperm(n, generator=gen) for _ in range(members)])
    for start in range(0, n - batch_size + 1, batch_size):
        yield orders[:, start : start + batch_size]


def main(argv: list[str] | None = None) -> dict:
    parser = example_parser(__doc__)
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=None,
        help="torch intra-op threads (default: OMP_NUM_THREADS, else 1)",
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="two epochs (a smoke test)")
    args = parser.parse_args(argv)
    set_threads(args.threads, default=1)  # tiny models: more threads only wait
    split = datasets.digits(seed=0)
    x_train, y_train = split.train.tensors
    x_test, y_test = split.test.tensors

    optimizer = functrain.optim.adamw(lr=args.lr, weight_decay=1e-4)
    models = [build_model(args.seed + i, args.hidden) for i in range(args.members)]
    # Members share the Python numbers of a state (step, counters, the run's seed): those are
    # static under vmap. They differ in every tensor: weights, moments.
    stacked = functrain.stack_states([functrain.init(m, optimizer, seed=args.seed) for m in models])
    step = functrain.make_step(models[0], loss_fn, optimizer)
    # in_dims: the state and the batch both have a member axis (each member its own batch).
    ensemble_step = torch.func.vmap(step, in_dims=(0, 0))

    gen = torch.Generator().manual_seed(args.seed)
    started = time.perf_counter()
    for epoch in range(2 if args.quick else args.epochs):
        losses = []
        for idx in member_batches(len(x_train), args.members, args.batch_size, gen):
            stacked, metrics = ensemble_step(stacked, (x_train[idx], y_train[idx]))
            losses.append(metrics["loss"])
        if epoch % 10 == 0 or epoch == args.epochs - 1:
            mean = torch.stack(losses).mean(0)
            print(f"epoch {epoch:3d}  loss per member " + " ".join(f"{v:.3f}" for v in mean))
    seconds = time.perf_counter() - started

    members = functrain.unstack_states(stacked)
    with torch.no_grad():
        probs = torch.stack([step.call_model(m, x_test).softmax(-1) for m in members])
    accuracies = [(p.argmax(-1) == y_test).float().mean().item() for p in probs]
    ensemble = (probs.mean(0).argmax(-1) == y_test).float().mean().item()
    print("member test accuracy  " + " ".join(f"{a:.3f}" for a in accuracies))
    print(f"ensemble test accuracy {ensemble:.3f}  ({stacked.step} steps in {seconds:.1f} s)")
    return {"state": stacked, "members": accuracies, "ensemble": ensemble, "seconds": seconds}


if __name__ == "__main__":
    main()
