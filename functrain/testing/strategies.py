"""Hypothesis strategies for training: small models, their states, matching batches, keys.

All of them draw a few integers and build the tensors from them, so examples are cheap, shrink
towards the smallest model, batch and seed, and print in one line.

- `cases()`: `Case` records (a model's architecture, batch size and seed), what the law checkers
  draw; everything else is rebuilt from a case.
- `models()`: small MLP/CNN modules (`TinyMLP`, `TinyCNN`) with `input_shape` and `classes`.
- `states(optimizer)`: `functrain.init(model, optimizer, seed=...)` of such a model.
- `batches(model)`: `(inputs, class indices)` that fit `model` (or a `Case`).
- `keys()` and `seeds()`: `functrain.rng.RngState` keys and plain seeds.

Example:
    >>> @given(state=states(functrain.optim.adamw(1e-3)), key=keys())
    ... def test_my_step(state, key): ...
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st

from ..rng import RngState
from ..state import TrainState, init
from .cases import KINDS, Case

SEED_MAX = 2**31 - 1


def seeds() -> st.SearchStrategy[int]:
    """Seeds in `[0, 2**31 - 1]`, shrinking towards 0.

    Example:
        >>> @given(seed=seeds())
        ... def test_runs_under_any_seed(seed): ...
    """
    return st.integers(0, SEED_MAX)


def keys() -> st.SearchStrategy[RngState]:
    """`RngState` keys (`state.rng`): a seed and a small split counter.

    Example:
        >>> @given(key=keys())
        ... def test_same_key_same_draw(key):
        ...     a = torch.rand(3, generator=functrain.rng.key_for(key, 0, "mine"))
    """
    return st.builds(RngState, seed=seeds(), counter=st.integers(0, 3))


def cases(
    kinds: tuple[str, ...] = KINDS,
    *,
    max_features: int = 6,
    max_hidden: int = 8,
    max_classes: int = 5,
    max_batch: int = 6,
    max_seed: int = 1000,
) -> st.SearchStrategy[Case]:
    """`Case` records: small classification setups of the given kinds.

    Args:
        kinds: which architectures to draw ("mlp", "cnn").
        max_features, max_hidden, max_classes, max_batch: upper bounds of the drawn sizes
            (features are the CNN's channels; its images are 2x2 to 5x5).
        max_seed: upper bound of the drawn seeds.
    Returns:
        a strategy of `Case`.
    Example:
        >>> check_purity(my_algorithm, cases=cases(kinds=("cnn",)))
    """
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ValueError(f"cases: kinds must be a non-empty subset of {KINDS}, got {kinds}")
    return st.builds(
        Case,
        kind=st.sampled_from(tuple(kinds)),
        features=st.integers(1, max_features),
        size=st.integers(2, 5),
        hidden=st.integers(1, max_hidden),
        classes=st.integers(2, max_classes),
        batch_size=st.integers(2, max_batch),
        seed=st.integers(0, max_seed),
    )


def models(kinds: tuple[str, ...] = KINDS, **bounds: int) -> st.SearchStrategy[torch.nn.Module]:
    """Small modules (`TinyMLP` or `TinyCNN`) with `input_shape` and `classes` attributes.

    Args:
        kinds: which architectures to draw.
        **bounds: passed to `cases` (`max_hidden=16`, ...).
    Returns:
        a strategy of freshly built modules (weights a pure function of the draw).
    Example:
        >>> @given(model=models(), data=st.data())
        ... def test_forward(model, data):
        ...     x, y = data.draw(batches(model))
    """
    return cases(kinds, **bounds).map(lambda case: case.model())


def states(
    optimizer: Any, source: st.SearchStrategy[torch.nn.Module] | None = None
) -> st.SearchStrategy[TrainState]:
    """`functrain.init(model, optimizer, seed=...)` of drawn models.

    Args:
        optimizer: a `functrain.optim.Transform`.
        source: where the models come from (default `models()`).
    Returns:
        a strategy of initial `TrainState`s (at step 0, the drawn seed as `state.rng.seed`).
    Example:
        >>> @given(state=states(functrain.optim.sgd(0.1)))
        ... def test_init(state): assert state.step == 0
    """
    drawn = source if source is not None else models()
    return st.builds(lambda model, seed: init(model, optimizer, seed=seed), drawn, seeds())


def batches(
    model: Any, batch_sizes: st.SearchStrategy[int] | None = None
) -> st.SearchStrategy[tuple[torch.Tensor, torch.Tensor]]:
    """`(inputs, class indices)` batches that fit `model`.

    Args:
        model: a module with `input_shape` and `classes` (from `models()`), or a `Case`.
        batch_sizes: the batch sizes to draw (default 2 to 6).
    Returns:
        a strategy of `(x, y)`: standard normal inputs of shape `(n, *input_shape)` and targets
        in `range(classes)`.
    Example:
        >>> x, y = data.draw(batches(model))
        >>> loss = torch.nn.functional.cross_entropy(model(x), y)
    """
    shape, classes = getattr(model, "input_shape", None), getattr(model, "classes", None)
    if shape is None or not isinstance(classes, int):
        raise TypeError(
            "batches(model) needs a model from functrain.testing.models() or a Case (something "
            f"with input_shape and classes), got {type(model).__name__}"
        )
    sizes = batch_sizes if batch_sizes is not None else st.integers(2, 6)

    def build(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(n, *shape, generator=gen)
        return x, torch.randint(0, classes, (n,), generator=gen)

    return st.builds(build, sizes, seeds())


__all__ = ["batches", "cases", "keys", "models", "seeds", "states"]
