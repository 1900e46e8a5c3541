"""Random draws from an explicit `torch.Generator` (functrain never touches a global generator).

The functional cores take `generator=`; these helpers turn it into the draws they need. Beta and
Dirichlet variates come from a NumPy generator seeded by one draw of the torch generator, so every
draw is still a pure function of the generator's state.

Example:
    >>> g = torch.Generator().manual_seed(0)
    >>> 0.0 <= beta(0.2, g) <= 1.0
    True
"""

from __future__ import annotations

import numpy as np
import torch


def require_generator(generator: torch.Generator | None, what: str) -> torch.Generator:
    """`generator`, or a clear error saying which random choice needed one.

    Args:
        generator: the caller's generator (may be None).
        what: the function and the choice, e.g. "mixup_batch's mixing coefficient".
    """
    if generator is None:
        raise ValueError(
            f"{what} is random: pass generator=torch.Generator().manual_seed(seed) (in a step, "
            "functrain.rng.key_for(state.rng, state.step, name)), or pass the value explicitly; "
            "functrain never draws from torch's global generator"
        )
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    return generator


def numpy_rng(generator: torch.Generator) -> np.random.Generator:
    """A NumPy generator seeded from one draw of `generator` (for Beta/Dirichlet variates)."""
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    return np.random.default_rng(seed)


def beta(alpha: float, generator: torch.Generator) -> float:
    """One draw from `Beta(alpha, alpha)` (alpha > 0)."""
    return float(numpy_rng(generator).beta(alpha, alpha))


def uniform(low: float, high: float, size: int, generator: torch.Generator) -> torch.Tensor:
    """`size` float64 draws from `U(low, high)`, NumPy's `uniform(low, high)` formula."""
    u = torch.rand(size, generator=generator, dtype=torch.float64)
    return low + (high - low) * u


def randint(low: int, high: int, generator: torch.Generator) -> int:
    """One integer in `[low, high)` (`high > low`)."""
    return int(torch.randint(low, high, (1,), generator=generator))
