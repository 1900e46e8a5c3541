"""What the law checkers share: the failure type, the hypothesis driver, and the step they build.

A law is a function of one `Case` that raises `LawError` when it is broken. `for_all_cases` runs
it on one given case, or on the default `Case()` and then cases hypothesis draws (few,
derandomized, no example database: a law check is a fast, reproducible test). A law broken on
the default case is reported at once; one broken only on some drawn case is shrunk by hypothesis
to a minimal case before the error reaches the caller. The error names the law, the subject, the
case and the leaf that differs.

Example:
    >>> for_all_cases(lambda case: None, case=None, cases=None, settings=None)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import hypothesis
from hypothesis import HealthCheck

from ..optim import Transform, sgd
from ..state import TrainState
from ..step import Algorithm, Step, compose, make_step
from .cases import Case, cross_entropy_loss
from .strategies import cases as default_cases


class LawError(AssertionError):
    """A law does not hold. `law`, `subject`, `case` and `detail` say which, for whom, where, how.

    Example:
        >>> raise LawError("purity", "mixup", Case(), "the step modified its input state", gap)
    """

    def __init__(self, law: str, subject: str, case: Case | None, what: str, detail: str = ""):
        self.law, self.subject, self.case, self.detail = law, subject, case, detail
        where = f" on {case!r}" if case is not None else ""
        message = f"law '{law}' broken by {subject}{where}: {what}"
        super().__init__(message + (f"\n  {detail}" if detail else ""))


def default_settings() -> hypothesis.settings:
    """5 examples, no deadline, derandomized, no example database: fast and reproducible."""
    return hypothesis.settings(
        max_examples=5,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def for_all_cases(
    law: Callable[[Case], None],
    *,
    case: Case | None,
    cases: Any,
    settings: hypothesis.settings | None,
) -> None:
    """Run `law` on `case` if given, else on cases drawn from `cases` (default `cases()`).

    Args:
        law: `Case -> None`, raising `LawError` when broken.
        case: one case to check (no hypothesis).
        cases: a strategy of `Case` (None: `Case()`, then `functrain.testing.cases()`).
        settings: hypothesis settings (None: `default_settings()`).
    """
    if case is not None:
        law(case)
        return
    strategy = cases if cases is not None else default_cases()
    chosen = settings if settings is not None else default_settings()

    def law_holds(case: Case) -> None:
        law(case)

    test = hypothesis.given(strategy)(law_holds)
    if cases is None:
        # The default case first, as an explicit example: most broken laws break on every case,
        # and a failing explicit example is reported at once, without a shrinking search.
        test = hypothesis.example(Case())(test)
    chosen(test)()


def name_of(subject: Any) -> str:
    """A readable name: an Algorithm's name, a function's name, or the repr."""
    if isinstance(subject, Algorithm):
        return f"algorithm '{subject.name}'"
    if isinstance(subject, Transform):
        # The function that built it ("add_l2", "chain"), and what it is when it says (its spec).
        maker = getattr(subject.update, "__qualname__", "update").split(".<locals>")[0]
        spec = repr(subject.spec) if subject.spec is not None else ""
        return f"transform {maker}" + (f" {spec[:117]}..." if len(spec) > 120 else f" {spec}")
    return getattr(subject, "__qualname__", None) or repr(subject)


def made(subject: Any) -> Algorithm | Transform:
    """`subject` itself when it is an `Algorithm` or `Transform`, else `subject()` (a factory)."""
    if isinstance(subject, (Algorithm, Transform)):
        return subject
    if callable(subject):
        out = subject()
        if isinstance(out, (Algorithm, Transform)):
            return out
        raise TypeError(
            f"{name_of(subject)}() returned {type(out).__name__}; a law checker takes an "
            "Algorithm, a Transform, or a function of no arguments returning one"
        )
    raise TypeError(
        f"a law checker takes an Algorithm or a Transform (or a factory of one), got "
        f"{type(subject).__name__}"
    )


def algorithm_step(
    case: Case,
    algorithms: list[Algorithm],
    *,
    optimizer: Transform | None,
    loss_fn: Callable | None,
    steps: int,
) -> tuple[Step, TrainState]:
    """`(step, state)`: the case's model and loss with `algorithms` composed, a fresh state."""
    model = case.model()
    opt = optimizer if optimizer is not None else sgd(0.1, momentum=0.9)
    step = compose(make_step(model, loss_fn or cross_entropy_loss, opt), *algorithms)
    return step, case.state(model, opt, horizon=steps)


def run_steps(step: Step, state: TrainState, case: Case, steps: int) -> tuple[TrainState, list]:
    """`steps` steps over the case's batches; the final state and each step's metrics."""
    metrics = []
    for batch in case.batches(steps):
        state, m = step(state, batch)
        metrics.append(m)
    return state, metrics


__all__ = [
    "LawError",
    "algorithm_step",
    "default_settings",
    "for_all_cases",
    "made",
    "name_of",
    "run_steps",
]
