"""`FitOptions`, fit's options as one typed record, and `FitResult`, how a run ended.

`fit` keeps its keyword signature; the keywords are checked and parsed once, into a frozen
`FitOptions` (durations and intervals as `Time`s, metrics as metric objects, callbacks and
loggers as tuples), and the loop reads that record, never a dict of strings.

`fit(..., return_result=True)` returns a `FitResult`: the state and whether the run finished,
stopped on request, or was preempted (SIGTERM or Ctrl-C), with the checkpoint it left.

Example:
    >>> options = FitOptions.create(duration="3ep", eval_interval="500ba")
    >>> options.duration, options.eval_interval
    (Time(3, 'ep'), Time(500, 'ba'))
    >>> result = functrain.fit(step, state, loader, duration="3ep", return_result=True)
    >>> if result.preempted:
    ...     sys.exit(result.exit_code)   # 75: ask the scheduler (or torchrun) to run it again
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..metrics import resolve_metrics
from ..units import Time, TimeLike, TimeUnit
from .data_position import check_on_change
from .horizon import parse_time

__all__ = ["EXIT_INTERRUPTED", "EXIT_PREEMPTED", "FitOptions", "FitResult"]

# Exit codes for a script whose run was stopped by a signal: 75 is EX_TEMPFAIL ("try again"), the
# code batch schedulers and `torchrun --max-restarts` take as "restart me"; 130 is the shell's
# code for a process ended by Ctrl-C.
EXIT_PREEMPTED = 75
EXIT_INTERRUPTED = 130


@dataclasses.dataclass(frozen=True)
class FitOptions:
    """Everything `fit` was asked to do, checked and parsed (see `fit` for each option).

    Build it with `FitOptions.create(**fit_keywords)`, which validates and parses.

    Attributes:
        duration: the run's total length (never a fraction of itself).
        eval_sets: `{name or None: iterable of batches}`.
        eval_interval, log_interval: parsed intervals, None for never (eval: only at the end).
        eval_fn, eval_state_fn: as given.
        eval_metrics, train_metrics: `{name: metric object}`.
        input_key, target_key: where inputs and targets sit in a batch.
        callbacks, loggers: tuples, in order.
        checkpoints: a `functrain.checkpoint.Manager`, a directory (fit makes a Manager that
            saves every epoch and closes it), or None.
        autoresume, donate, progress: flags.
        run_dir: the run's directory as a string, or None.
        seed: the seed of torch's global generator at the start, or None.
        on_data_change: what a resume does when the training data's definition (length, batch
            size, world size) changed: "error", "restart_epoch" or "by_samples".
        sanity_check_batches: eval batches per eval set run before training at a fresh start
            (0: none), to fail early on a broken evaluation.
    """

    duration: Time
    eval_sets: Mapping[str | None, Any] = dataclasses.field(default_factory=dict)
    eval_interval: Time | None = Time(1, TimeUnit.EPOCH)
    eval_fn: Callable | None = None
    eval_metrics: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    eval_state_fn: Callable[[Any], Any] | None = None
    input_key: Any = 0
    target_key: Any = 1
    train_metrics: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    callbacks: tuple[Any, ...] = ()
    loggers: tuple[Any, ...] = ()
    checkpoints: Any = None
    autoresume: bool = False
    log_interval: Time | None = Time(10, TimeUnit.BATCH)
    donate: bool = True
    run_dir: str | None = None
    seed: int | None = None
    progress: bool = True
    on_data_change: str = "error"
    sanity_check_batches: int = 2

    @classmethod
    def create(
        cls,
        *,
        duration: TimeLike,
        eval_data: Any = None,
        eval_interval: TimeLike | None = "1ep",
        eval_fn: Callable | None = None,
        eval_metrics: Any = None,
        eval_state_fn: Callable | None = None,
        input_key: Any = 0,
        target_key: Any = 1,
        train_metrics: Any = None,
        callbacks: Iterable[Any] = (),
        loggers: Iterable[Any] = (),
        checkpoints: Any = None,
        autoresume: bool = False,
        log_interval: TimeLike | None = "10ba",
        donate: bool = True,
        run_dir: str | os.PathLike | None = None,
        seed: int | None = None,
        progress: bool = True,
        on_data_change: str = "error",
        sanity_check_batches: int = 2,
    ) -> FitOptions:
        """Check and parse `fit`'s keywords.

        Raises:
            ValueError: a bad duration or interval (naming the argument), or autoresume
                without checkpoints. TypeError: a logger without `log_metrics`.
        """
        parsed = parse_time(duration, "duration")
        assert parsed is not None  # allow_none=False: parse_time raised on None
        if parsed.unit is TimeUnit.DURATION:
            raise ValueError(
                f"fit(duration={duration!r}): the duration cannot be a fraction of itself; use "
                "epochs, batches, samples, tokens or wall-clock time ('3ep', '500ba')"
            )
        loggers = tuple(loggers)
        for logger in loggers:
            if not callable(getattr(logger, "log_metrics", None)):
                raise TypeError(
                    f"logger {type(logger).__name__} has no log_metrics(metrics, step) method; "
                    "pass plain observers as callbacks="
                )
        if autoresume and checkpoints is None:
            raise ValueError("fit(autoresume=True) needs checkpoints=Manager(root) to resume from")
        evaluated = resolve_metrics(eval_metrics)
        trained = resolve_metrics(train_metrics)
        # A metric object given for both would be reset by each evaluation mid-window.
        shared = {id(m) for m in evaluated.values()}
        trained = {k: copy.deepcopy(m) if id(m) in shared else m for k, m in trained.items()}
        return cls(
            duration=parsed,
            eval_sets=_eval_sets(eval_data),
            eval_interval=parse_time(eval_interval, "eval_interval", True),
            eval_fn=eval_fn,
            eval_metrics=evaluated,
            eval_state_fn=eval_state_fn,
            input_key=input_key,
            target_key=target_key,
            train_metrics=trained,
            callbacks=tuple(callbacks),
            loggers=loggers,
            checkpoints=checkpoints,
            autoresume=bool(autoresume),
            log_interval=parse_time(log_interval, "log_interval", True),
            donate=bool(donate),
            run_dir=None if run_dir is None else os.fspath(run_dir),
            seed=seed,
            progress=bool(progress),
            on_data_change=check_on_change(on_data_change),
            sanity_check_batches=_count(sanity_check_batches, "sanity_check_batches"),
        )


@dataclasses.dataclass(frozen=True)
class FitResult:
    """How a call of `fit` ended (`fit(..., return_result=True)`).

    Attributes:
        state: the trained state (what `fit` returns otherwise).
        finished: the run reached its duration.
        stop_reason: why it stopped early (a callback's reason, "SIGTERM: preempted",
            "Ctrl-C (SIGINT)"), or None.
        preempted: a signal stopped it (SIGTERM or Ctrl-C, on any rank); it saved a checkpoint
            when it had a manager, and a rerun with `autoresume=True` continues it.
        signal: "SIGTERM", "SIGINT" or None.
        checkpoint: the newest checkpoint written (or resumed from) by this call, or None.
        resumed_from: the checkpoint this call resumed from, or None.
    """

    state: Any
    finished: bool
    stop_reason: str | None = None
    preempted: bool = False
    signal: str | None = None
    checkpoint: str | None = None
    resumed_from: str | None = None

    @property
    def exit_code(self) -> int:
        """The exit code for a script: 75 after SIGTERM (restart me), 130 after Ctrl-C, else 0."""
        if self.signal == "SIGTERM":
            return EXIT_PREEMPTED
        if self.signal == "SIGINT":
            return EXIT_INTERRUPTED
        return 0


def _eval_sets(eval_data: Any) -> dict[str | None, Any]:
    if eval_data is None:
        return {}
    if isinstance(eval_data, Mapping):
        return {str(k): v for k, v in eval_data.items()}
    return {None: eval_data}


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"fit({what}={value!r}): must be a whole number >= 0 (0: off)")
    return value
