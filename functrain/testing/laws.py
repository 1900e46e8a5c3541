"""One-line law checks for your own `Algorithm` or `Transform`.

Each checker runs its law over a few small cases hypothesis draws (`functrain.testing.cases()`:
MLPs and CNNs, batch sizes, seeds) and raises `LawError` (an `AssertionError`) with the law, a
minimal failing case (hypothesis shrinks it) and the first leaf that differs, with its largest
absolute difference. Algorithms are checked through a real `make_step` (sgd with momentum,
cross-entropy, unless you pass `optimizer=`/`loss_fn=`); transforms by calling `init`/`update`
directly.

Common keyword arguments: `steps` (per example, default 2), `case` (check this one `Case`
instead of drawing), `cases` (a strategy of `Case`), `settings` (hypothesis settings; default 5
derandomized examples), `optimizer` and `loss_fn` (algorithms' step), `rtol`/`atol` (comparisons
between two runs; 0 = bit for bit).

Example:
    >>> check_purity(label_smoothing(0.1))
    >>> check_determinism(mixup(0.4), varies_with_key=True)
    >>> check_identity_at_zero(label_smoothing, strength="smoothing")
    >>> check_commutes(mixup(0.4), label_smoothing(0.1), atol=1e-6)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import hypothesis

from ..optim import Transform, identity
from ..step import Algorithm
from . import algorithm_laws, transform_laws
from .algorithm_laws import Options
from .cases import Case
from .runner import LawError, for_all_cases, made, name_of


def _options(steps, optimizer, loss_fn, rtol=0.0, atol=0.0) -> Options:
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    return Options(steps, optimizer, loss_fn, rtol, atol)


def _laws_of(subject: Any):
    return algorithm_laws if isinstance(subject, Algorithm) else transform_laws


def check_purity(
    subject: Any,
    *,
    steps: int = 2,
    optimizer: Transform | None = None,
    loss_fn: Callable | None = None,
    case: Case | None = None,
    cases: Any = None,
    settings: hypothesis.settings | None = None,
) -> None:
    """Purity: running it never modifies its inputs (state, batch; grads, opt state, params).

    Args:
        subject: an `Algorithm` or `Transform`, or a function of no arguments returning one.
        (the rest: see the module docstring.)
    Raises:
        LawError: a leaf of an input changed, bit for bit.
    Example:
        >>> check_purity(my_algorithm())
    """
    it, opts = made(subject), _options(steps, optimizer, loss_fn)
    for_all_cases(
        lambda c: _laws_of(it).purity(it, c, opts), case=case, cases=cases, settings=settings
    )


def check_determinism(
    subject: Any,
    *,
    varies_with_key: bool = False,
    steps: int = 2,
    optimizer: Transform | None = None,
    loss_fn: Callable | None = None,
    case: Case | None = None,
    cases: Any = None,
    settings: hypothesis.settings | None = None,
) -> None:
    """Determinism: the same inputs and key give the same result, bit for bit.

    Args:
        subject: an `Algorithm` or `Transform` (or a factory of one).
        varies_with_key: (algorithms) also require that another key (`state.rng`) gives another
            result: the law of a random algorithm that draws from the step's key.
    Raises:
        LawError: two runs differ, or (`varies_with_key`) two keys give the same run.
    Example:
        >>> check_determinism(mixup(0.4), varies_with_key=True)
    """
    it, opts = made(subject), _options(steps, optimizer, loss_fn)
    if isinstance(it, Algorithm):
        law = lambda c: algorithm_laws.determinism(it, c, opts, varies_with_key)  # noqa: E731
    elif varies_with_key:
        raise ValueError("varies_with_key applies to Algorithms; a Transform takes no key")
    else:
        law = lambda c: transform_laws.determinism(it, c, opts)  # noqa: E731
    for_all_cases(law, case=case, cases=cases, settings=settings)


def check_identity_at_zero(
    factory: Callable[..., Any],
    strength: str,
    *,
    zero: Any = 0.0,
    options: Mapping[str, Any] | None = None,
    reference: Transform | None = None,
    steps: int = 2,
    optimizer: Transform | None = None,
    loss_fn: Callable | None = None,
    rtol: float = 0.0,
    atol: float = 0.0,
    case: Case | None = None,
    cases: Any = None,
    settings: hypothesis.settings | None = None,
) -> None:
    """Identity at zero strength: `factory(**{strength: zero})` changes nothing.

    For an `Algorithm`: the step with it trains exactly as the plain step (its own `algo_state`
    entry aside). For a `Transform`: its updates equal `reference`'s (default
    `functrain.optim.identity()`, i.e. the gradients themselves).

    Args:
        factory: the constructor, e.g. `label_smoothing`.
        strength: the name of its strength argument, e.g. `"smoothing"`.
        zero: the value meaning "no effect" (default 0.0).
        options: the constructor's other arguments.
        reference: (transforms) what zero strength must equal.
    Raises:
        LawError: a leaf of the result differs (within `rtol`/`atol`).
    Example:
        >>> check_identity_at_zero(label_smoothing, strength="smoothing")
    """
    if not isinstance(strength, str):
        raise TypeError(f"strength is the name of the argument (a str), got {strength!r}")
    it = factory(**{**(options or {}), strength: zero})
    opts = _options(steps, optimizer, loss_fn, rtol, atol)
    if isinstance(it, Algorithm):
        law = lambda c: algorithm_laws.identity_at_zero(it, c, opts)  # noqa: E731
    elif isinstance(it, Transform):
        ref = reference if reference is not None else identity()
        law = lambda c: transform_laws.identity_at_zero(it, ref, c, opts)  # noqa: E731
    else:
        raise TypeError(
            f"{name_of(factory)}({strength}={zero!r}) returned {type(it).__name__}, "
            "not an Algorithm or Transform"
        )
    for_all_cases(law, case=case, cases=cases, settings=settings)


def _pair(a: Any, b: Any) -> tuple[Any, Any]:
    a, b = made(a), made(b)
    if type(a) is not type(b):
        raise TypeError(
            f"commutation and order compare two Algorithms or two Transforms, got "
            f"{type(a).__name__} and {type(b).__name__}"
        )
    return a, b


def check_commutes(
    a: Any,
    b: Any,
    *,
    steps: int = 2,
    optimizer: Transform | None = None,
    loss_fn: Callable | None = None,
    rtol: float = 0.0,
    atol: float = 0.0,
    case: Case | None = None,
    cases: Any = None,
    settings: hypothesis.settings | None = None,
) -> None:
    """Commutation: `a` then `b` equals `b` then `a` (`compose` for algorithms, `chain` for
    transforms), within `rtol`/`atol`.

    Raises:
        LawError: the two orders give different results.
    Example:
        >>> check_commutes(mixup(0.4), label_smoothing(0.1), atol=1e-6)
    """
    a, b = _pair(a, b)
    opts = _options(steps, optimizer, loss_fn, rtol, atol)
    for_all_cases(
        lambda c: _laws_of(a).commutes(a, b, c, opts), case=case, cases=cases, settings=settings
    )


def check_order(
    first: Any,
    second: Any,
    *,
    reference: Any = None,
    steps: int = 2,
    optimizer: Transform | None = None,
    loss_fn: Callable | None = None,
    rtol: float = 0.0,
    atol: float = 0.0,
    case: Case | None = None,
    cases: Any = None,
    settings: hypothesis.settings | None = None,
) -> None:
    """Order: `first` must come before `second`.

    With `reference` (a list of algorithms, or one transform), `first` then `second` must equal
    it on every case. Without, the declared order must matter: on at least one drawn case the
    two orders give different results (else declare `check_commutes` instead).

    Raises:
        LawError: the declared order differs from the reference, or no case tells the orders
            apart.
    Example:
        >>> check_order(cutout(), mixup(0.4))   # the order of a list of data transforms matters
    """
    first, second = _pair(first, second)
    opts = _options(steps, optimizer, loss_fn, rtol, atol)
    laws = _laws_of(first)
    if reference is not None:
        ref: Any = list(reference) if isinstance(first, Algorithm) else made(reference)
        for_all_cases(
            lambda c: laws.order(first, second, ref, c, opts),
            case=case,
            cases=cases,
            settings=settings,
        )
        return
    seen: list[bool] = []
    for_all_cases(
        lambda c: seen.append(laws.orders_differ(first, second, c, opts)),
        case=case,
        cases=cases,
        settings=settings,
    )
    if not any(seen):
        raise LawError(
            "order",
            f"{name_of(first)} then {name_of(second)}",
            case,
            f"the two orders gave the same result on all {len(seen)} cases checked: the order "
            "does not matter there (check_commutes states that), or no case exercises it",
        )


__all__ = [
    "LawError",
    "check_commutes",
    "check_determinism",
    "check_identity_at_zero",
    "check_order",
    "check_purity",
]
