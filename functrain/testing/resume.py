"""Resume equivalence: a killed-and-resumed `fit` ends exactly where an uninterrupted one does.

The check runs `fit` three times on one `Case` (a small model, a dataset of a few batches so the
run crosses an epoch boundary):

1. uninterrupted, for `steps` batches;
2. with a checkpoint `Manager` saving every `steps // 2` batches in a temporary directory, killed
   (a callback raises) one batch after that checkpoint;
3. a fresh run (a new model, a newly built step and algorithm) with `autoresume=True`, to `steps`.

Every leaf of the final states of 1 and 3 must be equal, bit for bit (wall-clock time aside).

Example:
    >>> check_resume_equivalence(lambda: ema(half_life="2ba"))
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any

from ..optim import Transform, sgd
from ..step import Algorithm, compose, make_step
from .cases import Case, cross_entropy_loss
from .compare import tree_difference
from .runner import LawError, made, name_of


class _Killed(Exception):
    """The simulated kill (raised by a callback, so `fit` stops as a crash would stop it)."""


class _KillAt:
    def __init__(self, batch: int):
        self.batch = batch

    def batch_end(self, ctx: Any) -> None:
        if ctx.timestamp.batch == self.batch:
            raise _Killed(f"killed at batch {self.batch}")


def check_resume_equivalence(
    subject: Any,
    *,
    steps: int = 4,
    optimizer: Transform | None = None,
    loss_fn: Callable | None = None,
    case: Case | None = None,
) -> None:
    """Resume equivalence of an `Algorithm` or `Transform` under `fit` and a checkpoint `Manager`.

    Args:
        subject: an `Algorithm` or `Transform`, or (better) a function of no arguments returning
            one: the resumed run builds its own, as a restarted process would.
        steps: the run's length in batches (>= 4, even numbers resume at the midpoint).
        optimizer: (algorithms) the step's optimizer (default sgd(0.1, momentum=0.9)).
        loss_fn: the step's loss (default the cases' cross-entropy).
        case: the model and data (default `Case(kind="cnn")`, which has BatchNorm buffers).
    Raises:
        LawError: a leaf of the resumed state differs from the uninterrupted one's, or the run
            did not resume.
        ValueError: the algorithm declares `resumable=False`.
    Example:
        >>> check_resume_equivalence(lambda: label_smoothing(0.1))
    """
    import functrain  # the loop and checkpoints: imported when a check runs, not with the module
    from functrain.checkpoint import Manager
    from functrain.data import Loader

    if not isinstance(steps, int) or steps < 4:
        raise ValueError(f"steps must be an int >= 4 (kill after the midpoint), got {steps!r}")
    case = case if case is not None else Case(kind="cnn")
    first = made(subject)
    subject_name = name_of(first)
    if isinstance(first, Algorithm) and not first.resumable:
        raise ValueError(
            f"{subject_name} declares resumable=False: a resumed run is not expected to match "
            "an uninterrupted one; drop this check or make the algorithm resumable"
        )
    half, duration = steps // 2, f"{steps}ba"
    # A dataset of half the run: the run crosses an epoch boundary, the kill lands in epoch 2.
    dataset = case.dataset(max(2, half))

    def build():
        it, model = made(subject), case.model()
        if isinstance(it, Algorithm):
            opt = optimizer if optimizer is not None else sgd(0.1, momentum=0.9)
            step = compose(make_step(model, loss_fn or cross_entropy_loss, opt), it)
        else:
            opt = it
            step = make_step(model, loss_fn or cross_entropy_loss, opt)
        loader = Loader(dataset, case.batch_size, seed=case.seed)
        return step, functrain.init(model, opt, seed=case.seed), loader

    step, state, loader = build()
    reference = functrain.fit(step, state, loader, duration=duration, progress=False)
    with tempfile.TemporaryDirectory(prefix="functrain-resume-law-") as root:
        step, state, loader = build()
        with Manager(root, every=f"{half}ba", keep_last=1) as manager:
            try:
                functrain.fit(
                    step,
                    state,
                    loader,
                    duration=duration,
                    checkpoints=manager,
                    callbacks=[_KillAt(half + 1)],
                    progress=False,
                )
            except functrain.CallbackError as error:
                if not isinstance(error.__cause__, _Killed):
                    raise
            else:
                raise AssertionError("the run to be killed was not killed (the check's own bug)")
        step, state, loader = build()
        with Manager(root, every=f"{half}ba", keep_last=1) as manager:
            result = functrain.fit(
                step,
                state,
                loader,
                duration=duration,
                checkpoints=manager,
                autoresume=True,
                return_result=True,
                progress=False,
            )
    if not result.resumed_from or not result.finished:
        raise LawError(
            "resume equivalence",
            subject_name,
            case,
            f"the second run did not resume and finish (resumed_from={result.resumed_from!r}, "
            f"finished={result.finished})",
        )
    # Wall-clock time differs by nature; the data position is written only by a run that saves.
    ignore = ("timestamp.elapsed_sec", "extra.data")
    gap = tree_difference(reference, result.state, ignore=ignore)
    if gap is not None:
        raise LawError(
            "resume equivalence",
            subject_name,
            case,
            f"killed after batch {half + 1}, resumed from the checkpoint at batch {half} and run "
            f"to {steps}, the state differs from the uninterrupted run's "
            "(expected: uninterrupted, got: resumed)",
            gap,
        )


__all__ = ["check_resume_equivalence"]
