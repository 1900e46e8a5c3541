"""Counter-based random keys: every random choice is a pure function of (seed, step, purpose, rank).

functrain's own draws (MixUp, CutMix, dropout masks of its algorithms, ...) take a generator from
`key_for`, so a run is bit-identical under the same seed, and a resumed run draws exactly what the
uninterrupted one would have drawn at that step. Modules that draw from torch's global generator
(`nn.Dropout`) are made just as reproducible by `seeded_global_rng`, which the step wraps around
each forward pass: the global generator is seeded from the step's key and restored afterwards.

Example:
    >>> rng = RngState(seed=0)
    >>> a = torch.rand(2, generator=key_for(rng, step=3, purpose="mixup"))
    >>> b = torch.rand(2, generator=key_for(rng, step=3, purpose="mixup"))
    >>> bool((a == b).all())
    True
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

import torch


class RngState(NamedTuple):
    """The run's randomness: a seed, and a counter bumped by `split` for independent streams."""

    seed: int = 0
    counter: int = 0


def split(rng: RngState) -> tuple[RngState, RngState]:
    """Two independent states: the advanced one to keep, and one to consume."""
    return rng._replace(counter=rng.counter + 1), rng


def seed_for(rng: RngState, step: int, purpose: str, rank: int = 0) -> int:
    """A 63-bit integer seed derived by hashing (seed, counter, step, purpose, rank)."""
    text = f"{rng.seed}/{rng.counter}/{step}/{purpose}/{rank}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


def key_for(
    rng: RngState, step: int, purpose: str, rank: int = 0, device: str | torch.device = "cpu"
) -> torch.Generator:
    """A fresh `torch.Generator` seeded from (rng, step, purpose, rank).

    Args:
        rng: the run's `RngState` (`state.rng`).
        step: the training step the draw belongs to.
        purpose: a name that separates streams ("mixup", "dropout", ...).
        rank: the data-parallel rank, for draws that must differ per rank.
        device: where the generator lives.
    Returns:
        a seeded generator to pass as `generator=` to torch's random functions.
    """
    gen = torch.Generator(device=device)
    gen.manual_seed(seed_for(rng, step, purpose, rank))
    return gen


class seeded_global_rng:  # noqa: N801 - used like a function: `with seeded_global_rng(...)`
    """Run a block with torch's global generator seeded to `seed`, restoring it afterwards.

    Modules such as `nn.Dropout` draw from the global generator; the step wraps the forward pass in
    this so that their masks, too, are a pure function of the key. (It seeds the generator object
    directly: `torch.manual_seed` also queues a seed for every CUDA device, which costs a stack
    capture per call. A class rather than a generator function: it runs on every forward pass.)

    Example:
        >>> with seeded_global_rng(7):
        ...     a = torch.rand(2)
        >>> with seeded_global_rng(7):
        ...     b = torch.rand(2)
        >>> bool((a == b).all())
        True
    """

    __slots__ = ("_generators", "_saved", "_seed")

    def __init__(self, seed: int, device: torch.device | str = "cpu"):
        self._seed = seed
        self._generators = [torch.default_generator]
        device = torch.device(device)
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            self._generators.append(torch.cuda.default_generators[index])
        self._saved: list = []

    def __enter__(self) -> None:
        self._saved = [g.get_state() for g in self._generators]
        for g in self._generators:
            g.manual_seed(self._seed)

    def __exit__(self, *exc) -> None:
        for g, state in zip(self._generators, self._saved):
            g.set_state(state)
