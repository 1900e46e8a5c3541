"""The laws for an `Algorithm` (a `StepPieces -> StepPieces` rewrite), checked through a real step.

Each function here checks one law on one `Case`: it builds the case's model with the algorithm
composed into `make_step` (pure, not donating), runs a few steps, and raises `LawError` naming
the leaf that differs. `functrain.testing.laws` drives them over hypothesis-drawn cases.

Example:
    >>> purity(mixup(0.4), Case(), Options())
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ..optim import Transform
from ..rng import RngState
from ..step import Algorithm
from .cases import Case
from .compare import snapshot, tree_difference
from .runner import LawError, algorithm_step, name_of, run_steps


class Options(NamedTuple):
    """How a law runs: steps per example, the optimizer and loss of the step, tolerances."""

    steps: int = 2
    optimizer: Transform | None = None
    loss_fn: Callable | None = None
    rtol: float = 0.0
    atol: float = 0.0


def _build(case: Case, algorithms: list[Algorithm], opts: Options):
    return algorithm_step(
        case, algorithms, optimizer=opts.optimizer, loss_fn=opts.loss_fn, steps=opts.steps
    )


def _outcome(case: Case, algorithms: list[Algorithm], opts: Options, rng: RngState | None = None):
    step, state = _build(case, algorithms, opts)
    if rng is not None:
        state = state.replace(rng=rng)
    return run_steps(step, state, case, opts.steps)


def _losses(metrics: list[dict]) -> list:
    return [m.get("loss") for m in metrics]


def purity(algorithm: Algorithm, case: Case, opts: Options) -> None:
    """Every step leaves its input state and batch untouched, bit for bit."""
    step, state = _build(case, [algorithm], opts)
    for i, batch in enumerate(case.batches(opts.steps)):
        before_state, before_batch = snapshot(state), snapshot(batch)
        new_state, _ = step(state, batch)
        for what, before, after in (("state", before_state, state), ("batch", before_batch, batch)):
            gap = tree_difference(before, after)
            if gap is not None:
                raise LawError(
                    "purity",
                    name_of(algorithm),
                    case,
                    f"step {i + 1} modified its input {what} (compare every leaf before/after)",
                    gap,
                )
        state = new_state


def determinism(algorithm: Algorithm, case: Case, opts: Options, varies_with_key: bool) -> None:
    """The same state (and key) and batches give the same result; another key another one."""
    first, first_metrics = _outcome(case, [algorithm], opts)
    again, again_metrics = _outcome(case, [algorithm], opts)
    gap = tree_difference((first, _losses(first_metrics)), (again, _losses(again_metrics)))
    if gap is not None:
        raise LawError(
            "determinism",
            name_of(algorithm),
            case,
            f"two runs of {opts.steps} steps from the same state and key differ (a draw that "
            "does not come from the step's key, e.g. torch's global generator?)",
            gap,
        )
    if varies_with_key:
        other_key = RngState(seed=case.seed + 1)
        other, other_metrics = _outcome(case, [algorithm], opts, rng=other_key)
        same = tree_difference(
            (first, _losses(first_metrics)), (other, _losses(other_metrics)), ignore=("0.rng",)
        )
        if same is None:
            raise LawError(
                "determinism",
                name_of(algorithm),
                case,
                f"runs under keys {first.rng} and {other_key} are identical: the algorithm "
                "ignores the key (draw with functrain.rng.key_for(state.rng, state.step, name))",
            )


def _compare_runs(
    law: str,
    subject: str,
    case: Case,
    expected: tuple[Any, list],
    got: tuple[Any, list],
    what: str,
    opts: Options,
    ignore: tuple[str, ...] = (),
) -> None:
    (state_a, metrics_a), (state_b, metrics_b) = expected, got
    gap = tree_difference(
        (state_a, _losses(metrics_a)),
        (state_b, _losses(metrics_b)),
        rtol=opts.rtol,
        atol=opts.atol,
        ignore=ignore,
    )
    if gap is not None:
        raise LawError(law, subject, case, what, gap)


def identity_at_zero(zero: Algorithm, case: Case, opts: Options) -> None:
    """The step with `zero` (the algorithm at zero strength) trains exactly as the plain step."""
    plain = _outcome(case, [], opts)
    with_zero = _outcome(case, [zero], opts)
    # The algorithm's own bookkeeping is the one thing allowed to differ.
    ignore = tuple(
        f"0.algo_state.{k}" for k in with_zero[0].algo_state if k not in plain[0].algo_state
    )
    _compare_runs(
        "identity at zero strength",
        name_of(zero),
        case,
        plain,
        with_zero,
        f"at zero strength, {opts.steps} steps with it differ from the plain step's "
        "(expected: plain step, got: with the algorithm)",
        opts,
        ignore,
    )


def commutes(a: Algorithm, b: Algorithm, case: Case, opts: Options) -> None:
    """`compose(step, a, b)` trains exactly as `compose(step, b, a)`."""
    _compare_runs(
        "commutation",
        f"{name_of(a)} with {name_of(b)}",
        case,
        _outcome(case, [a, b], opts),
        _outcome(case, [b, a], opts),
        f"composed in the two orders, {opts.steps} steps differ "
        f"(expected: [{a.name}, {b.name}], got: [{b.name}, {a.name}])",
        opts,
    )


def order(
    first: Algorithm, second: Algorithm, reference: list[Algorithm], case: Case, opts: Options
) -> None:
    """`compose(step, first, second)` trains exactly as `compose(step, *reference)`."""
    _compare_runs(
        "order",
        f"{name_of(first)} then {name_of(second)}",
        case,
        _outcome(case, reference, opts),
        _outcome(case, [first, second], opts),
        f"[{first.name}, {second.name}] differs from the reference "
        f"[{', '.join(r.name for r in reference)}] (expected: reference, got: declared order)",
        opts,
    )


def orders_differ(first: Algorithm, second: Algorithm, case: Case, opts: Options) -> bool:
    """Whether the two composition orders give different results on `case`."""
    a, b = _outcome(case, [first, second], opts), _outcome(case, [second, first], opts)
    return tree_difference((a[0], _losses(a[1])), (b[0], _losses(b[1]))) is not None


__all__ = [
    "Options",
    "commutes",
    "determinism",
    "identity_at_zero",
    "order",
    "orders_differ",
    "purity",
]
