"""Test your own algorithm or optimizer transform like a law: strategies and one-line checkers.

Needs `hypothesis` (`pip install hypothesis`; it comes with `functrain[test]`).

Strategies (`functrain.testing.strategies`): `cases`, `models`, `states`, `batches`, `keys`,
`seeds`. Law checkers, each one line on an `Algorithm` or a `Transform`:

- `check_purity`: running it never modifies its inputs;
- `check_determinism`: the same inputs and key give the same result (`varies_with_key=True`:
  and another key another result);
- `check_identity_at_zero`: at zero strength it changes nothing;
- `check_commutes` / `check_order`: composed with another one, either order / the declared order;
- `check_resume_equivalence`: a killed-and-resumed `fit` equals an uninterrupted one.

A broken law raises `LawError` (an `AssertionError`) naming the law, a minimal `Case` and the
first leaf that differs. See docs/testing_transforms.md.

Example:
    >>> from functrain.testing import check_purity, check_identity_at_zero
    >>> check_purity(label_smoothing(0.1))
    >>> check_identity_at_zero(label_smoothing, strength="smoothing")
"""

from __future__ import annotations

try:
    import hypothesis  # noqa: F401
except ImportError as error:  # pragma: no cover - hypothesis is a test dependency
    raise ImportError(
        "functrain.testing needs hypothesis: pip install hypothesis (or functrain[test])"
    ) from error

from .cases import Case, TinyCNN, TinyMLP, cross_entropy_loss
from .compare import tree_difference
from .laws import (
    LawError,
    check_commutes,
    check_determinism,
    check_identity_at_zero,
    check_order,
    check_purity,
)
from .resume import check_resume_equivalence
from .runner import default_settings
from .strategies import batches, cases, keys, models, seeds, states

__all__ = [
    "Case",
    "LawError",
    "TinyCNN",
    "TinyMLP",
    "batches",
    "cases",
    "check_commutes",
    "check_determinism",
    "check_identity_at_zero",
    "check_order",
    "check_purity",
    "check_resume_equivalence",
    "cross_entropy_loss",
    "default_settings",
    "keys",
    "models",
    "seeds",
    "states",
    "tree_difference",
]
