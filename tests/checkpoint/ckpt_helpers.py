"""Shared helpers of the checkpoint tests: a real TrainState with every kind of leaf, and bitwise
comparison of whole states."""

from __future__ import annotations

import torch

import functrain
from functrain.algorithms.ema import init_ema
from functrain.tree import leaves_with_paths, tree_flatten, tree_map


class Net(torch.nn.Module):
    """Linear -> BatchNorm -> Linear: parameters, float and int buffers."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.fc = torch.nn.Linear(4, width)
        self.bn = torch.nn.BatchNorm1d(width)
        self.head = torch.nn.Linear(width, 3)

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.fc(x))))


def make_state(seed: int = 0, width: int = 8) -> functrain.TrainState:
    """A TrainState from `functrain.init` with every field filled with distinct values.

    Parameters, optimizer moments (AdamW), EMA and SWA averages, rng, timestamp, callback state,
    the data position, and extra tensors in bf16, fp8 and int64.
    """
    torch.manual_seed(seed)
    model = Net(width)
    state = functrain.init(model, functrain.optim.adamw(lr=1e-3), seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)

    def fill(x):
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return torch.randn(x.shape, generator=gen).to(x.dtype)
        return x

    state = state.replace(
        step=7 + seed,
        params=tree_map(fill, state.params),
        opt_state=tree_map(fill, state.opt_state),
    )
    ema = init_ema(state)._replace(num_updates=5)
    ema = ema._replace(params=tree_map(fill, ema.params))
    swa = {"average": tree_map(fill, dict(state.params)), "count": 3}
    return state.replace(
        rng=functrain.RngState(seed=seed, counter=4),
        algo_state={"ema": ema, "swa": swa},
        timestamp=functrain.Timestamp(epoch=1, batch=7 + seed, sample=224, batches_per_epoch=5),
        extra={
            "callbacks": {"early_stop": {"best": 0.25, "wait": 2, "monitor": "loss", "on": True}},
            "data": {"epoch": 1, "position": 96},
            "mixed": {
                "bf16": torch.randn(5, 3, generator=gen).to(torch.bfloat16),
                "e4m3": torch.randn(4, 4, generator=gen).to(torch.float8_e4m3fn),
                "e5m2": torch.randn(6, generator=gen).to(torch.float8_e5m2),
                "int": torch.randint(-(2**40), 2**40, (3, 2), generator=gen),
                "bool": torch.tensor([True, False, True]),
                "scalar": torch.tensor(2.5, dtype=torch.float64),
            },
        },
    )


def blank_like(state: functrain.TrainState) -> functrain.TrainState:
    """`state` with every tensor zeroed and every scalar reset: a `like` that shares nothing."""

    def blank(x):
        if isinstance(x, torch.Tensor):
            return torch.zeros_like(x)
        if isinstance(x, bool):
            return False
        if isinstance(x, (int, float)):
            return type(x)(0)
        if isinstance(x, str):
            return ""
        return x

    return tree_map(blank, state)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaNs and fp8 included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def assert_same_state(a, b) -> None:
    """Same structure, same leaf types, and every tensor bitwise equal."""
    _, spec_a = tree_flatten(a)
    _, spec_b = tree_flatten(b)
    assert spec_a == spec_b, f"structures differ:\n{spec_a}\n{spec_b}"
    for (key, x), (_, y) in zip(leaves_with_paths(a), leaves_with_paths(b)):
        assert type(x) is type(y), f"{key}: {type(x).__name__} != {type(y).__name__}"
        if isinstance(x, torch.Tensor):
            assert same_bits(x, y), f"{key} differs"
        else:
            assert x == y, f"{key}: {x!r} != {y!r}"
