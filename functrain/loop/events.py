"""Loop events and the callback protocol.

The loop (`functrain.fit`, `evaluate`, `predict`) is the only place with side effects. At fixed
points it emits an `Event`; a callback is any object with a method named after the event in
lower case (`def batch_end(self, ctx): ...`). The method gets a `Context` that carries the state,
the step's metrics, the timestamp and a way to stop the run. Callbacks observe; they never change
the state (the step is the only thing that makes a new state).

The order `fit` emits them in (docs/events.md has the table and Composer's mapping):

    INIT                     once per fit call, before auto-resume
    FIT_START                with the (possibly restored) state
      EPOCH_START            at batch 0 of an epoch (not when resuming mid-epoch)
        BATCH_START          before the step, `ctx.batch` is the batch
        BATCH_END            after the step, `ctx.metrics` are its metrics
        [EVAL_START, EVAL_BATCH_START, EVAL_BATCH_END, ..., EVAL_END]   when eval is due
        [CHECKPOINT]         after a checkpoint was written (`ctx.checkpoint_path`)
      EPOCH_END              the timestamp already counts the finished epoch
        [EVAL_*], [CHECKPOINT]
    [EVAL_*]                 a final evaluation, when the last batch was not evaluated
    [CHECKPOINT]             a final checkpoint, when the last batch was not saved
    FIT_END

`predict` emits PREDICT_START, PREDICT_BATCH_START, PREDICT_BATCH_END, PREDICT_END; a standalone
`evaluate` emits the EVAL_* events.

Example:
    >>> class PrintLoss:
    ...     def batch_end(self, ctx):
    ...         if ctx.timestamp.batch % 100 == 0:
    ...             print(ctx.timestamp.batch, float(ctx.metrics["loss"]))
    >>> functrain.fit(step, state, loader, duration="1ep", callbacks=[PrintLoss()])
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np


class Event(str, enum.Enum):
    """The points of the loop where callbacks run; the value is the callback method's name."""

    INIT = "init"
    FIT_START = "fit_start"
    EPOCH_START = "epoch_start"
    BATCH_START = "batch_start"
    BATCH_END = "batch_end"
    EPOCH_END = "epoch_end"
    EVAL_START = "eval_start"
    EVAL_BATCH_START = "eval_batch_start"
    EVAL_BATCH_END = "eval_batch_end"
    EVAL_END = "eval_end"
    CHECKPOINT = "checkpoint"
    PREDICT_START = "predict_start"
    PREDICT_BATCH_START = "predict_batch_start"
    PREDICT_BATCH_END = "predict_batch_end"
    PREDICT_END = "predict_end"
    FIT_END = "fit_end"


@runtime_checkable
class Callback(Protocol):
    """What a callback may have; every method is optional (define only the events you handle).

    A callback defines any of `init`, `fit_start`, `epoch_start`, `batch_start`, `batch_end`,
    `epoch_end`, `eval_start`, `eval_batch_start`, `eval_batch_end`, `eval_end`, `checkpoint`,
    `predict_start`, `predict_batch_start`, `predict_batch_end`, `predict_end`, `fit_end`, each
    taking a `Context`. State that must survive a restart goes through `state_dict()` (numbers,
    strings, None, lists and str-keyed dicts of them, and tensors) and `load_state_dict(d)`; the
    loop saves it, encoded by `encode_state`, in `state.extra["callbacks"][callback_name(cb)]`
    with every checkpoint, and gives it back after an auto-resume.
    """

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class CallbackError(RuntimeError):
    """A callback raised; names the callback and the event. The original error is `__cause__`."""

    def __init__(self, callback_name: str, event: Event, error: BaseException, where: str = ""):
        self.callback_name = callback_name
        self.event = event
        super().__init__(
            f"callback {callback_name!r} raised {type(error).__name__} in "
            f"{event.value}() (event {event.name}{where}): {error}. The run stopped; checkpoints "
            "already written are intact (fix the callback and rerun with autoresume=True to "
            "continue from the newest one)."
        )


class Context:
    """What a callback sees. The loop owns it and updates its fields before each event.

    Inside `fit` the context is bound to the run: `ctx.state` and `ctx.timestamp` read the one
    copy of the state the loop holds (they cannot be assigned). A context made by hand (tests,
    `evaluate`, `predict`) holds the `state` it was given, and that one may be reassigned.

    Attributes:
        event: the event being dispatched.
        state: what `fit` trains: a `TrainState`, or for a pytree of states the
            `functrain.FitState` holding them (read it; do not modify its tensors).
        timestamp: the run's position (`state.timestamp`).
        metrics: the last step's metrics (`{"loss": tensor, "grad_norm": tensor, "lr": ...}`;
            tensors are not synced to the host until you read them).
        eval_metrics: the last evaluation's results, `{name: float}`.
        batch: the current batch at BATCH_START/BATCH_END and the EVAL_/PREDICT_ batch events.
        outputs: the model's outputs at EVAL_BATCH_END and PREDICT_BATCH_END.
        rank: this process's data-parallel rank; `world_size` the number of data-parallel ranks.
        run_dir: the run's directory (None when fit got none).
        loggers: the loggers `ctx.log` writes to.
        duration: the run's length as given to fit (a `functrain.units.Time`), else None.
        log_interval: how often fit sends the step's metrics to the loggers (a `Time`).
        checkpoint_path: the path of the newest checkpoint written (at CHECKPOINT and after).
        resumed_from: the checkpoint the run resumed from, if any.
        stop_reason: why a stop was requested (None while running on).
    Example:
        >>> ctx = Context(state=state)
        >>> ctx.timestamp is state.timestamp
        True
    """

    def __init__(
        self,
        state: Any = None,
        *,
        rank: int = 0,
        world_size: int = 1,
        run_dir: str | None = None,
        loggers: Sequence[Any] = (),
        duration: Any = None,
        log_interval: Any = None,
        run: Any = None,
    ):
        self.event: Event | None = None
        self.metrics: dict[str, Any] = {}
        self.eval_metrics: dict[str, float] = {}
        self.batch: Any = None
        self.outputs: Any = None
        self.rank = rank
        self.world_size = world_size
        self.run_dir = run_dir
        self.loggers = loggers
        self.duration = duration
        self.log_interval = log_interval
        self.checkpoint_path: Any = None
        self.resumed_from: Any = None
        self.stop_reason: str | None = None
        self._state = state
        self._run = run  # the loop's run: the one holder of the state (`run.state`)

    @property
    def state(self) -> Any:
        """The current state (inside `fit`: the loop's own copy, read-only)."""
        return self._run.state if self._run is not None else self._state

    @state.setter
    def state(self, value: Any) -> None:
        if self._run is not None:
            raise AttributeError(
                "ctx.state is the state fit trains and cannot be replaced by a callback; "
                "callbacks observe it (changes to training belong in the step)"
            )
        self._state = value

    @property
    def timestamp(self):
        """The current `functrain.units.Timestamp` (`state.timestamp`)."""
        state = self.state
        return None if state is None else state.timestamp

    @property
    def stop_requested(self) -> bool:
        """True once a callback (or a signal) asked the loop to stop."""
        return self.stop_reason is not None

    def request_stop(self, reason: str = "stop requested by a callback") -> None:
        """Ask the loop to stop at the next step boundary (it still checkpoints and emits
        FIT_END). Under several ranks the loop stops every rank at the same step.

        Args:
            reason: why, shown to loggers and kept in `ctx.stop_reason`.
        """
        if self.stop_reason is None:
            self.stop_reason = str(reason)

    def __repr__(self) -> str:
        ts = self.timestamp
        where = "" if ts is None else f", epoch={ts.epoch}, batch={ts.batch}"
        return f"Context(event={self.event}{where}, rank={self.rank}/{self.world_size})"

    def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Send `metrics` to every logger's `log_metrics` (on every rank: loggers write on rank 0
        unless built to log all ranks).

        Args:
            metrics: `{name: number | 0-d tensor | nested dict}`; nested dicts are flattened
                with "/" ("grad_norms/fc.weight"); non-numeric values are skipped.
            step: the x-axis value (default: the state's batch count).
        """
        if not self.loggers:
            return
        flat = scalar_metrics(metrics)
        if not flat:
            return
        if step is None:
            step = self.timestamp.batch if self.state is not None else 0
        for logger in self.loggers:
            log_metrics = getattr(logger, "log_metrics", None)
            if log_metrics is not None:
                log_metrics(flat, int(step))


def scalar_metrics(metrics: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """`metrics` flattened to `{name: float}`: 0-d / one-element tensors and numbers are kept,
    nested dicts become "outer/inner" names, anything else (outputs, None, strings, bools) is
    dropped. The tensors of each device reach the host in one transfer (`loggers.to_floats`).

    Args:
        metrics: `{name: number | tensor | nested dict | ...}`.
        prefix: prepended to every name.
    Returns:
        `{name: float}` in the order of `metrics`.
    Example:
        >>> scalar_metrics({"loss": torch.tensor(0.5), "n": {"a": 1}, "out": torch.zeros(3)})
        {'loss': 0.5, 'n/a': 1.0}
    """
    # Imported here: functrain.loggers imports the callbacks, which import this module.
    from ..loggers.base import to_floats

    def without_flags(tree: Mapping[str, Any]) -> dict[str, Any]:
        # Flags (a bool such as "skipped") are not measurements; to_floats would keep them.
        return {
            k: without_flags(v) if isinstance(v, Mapping) else v
            for k, v in tree.items()
            if not isinstance(v, (bool, np.bool_))
        }

    return {f"{prefix}{k}": v for k, v in to_floats(without_flags(metrics)).items()}


def callback_name(callback: Any) -> str:
    """The key a callback's state is saved under: its `name` attribute, else its class name."""
    name = getattr(callback, "name", None)
    return name if isinstance(name, str) and name else type(callback).__name__


def unique_names(callbacks: Iterable[Any]) -> list[str]:
    """`callback_name` of each callback, with "#2", "#3", ... appended to repeated names."""
    seen: dict[str, int] = {}
    names = []
    for callback in callbacks:
        name = callback_name(callback)
        seen[name] = seen.get(name, 0) + 1
        names.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return names


# The method each event calls: a constant table (an enum's `.value` is a Python-level property,
# and this is read for every callback at every event).
_METHOD_NAMES = {event: event.value for event in Event}


def dispatch(event: Event, callbacks: Sequence[Any], ctx: Context) -> None:
    """Call `cb.<event.value>(ctx)` on every callback that defines it, in order.

    Raises:
        CallbackError: when a callback raises; it names the callback and the event.
    """
    ctx.event = event
    name = _METHOD_NAMES[event]
    for callback in callbacks:
        method = getattr(callback, name, None)
        if not callable(method):  # not handled (or a data attribute that shares the name)
            continue
        try:
            method(ctx)
        except Exception as error:  # noqa: BLE001 -- re-raised with the callback's name
            where = ""
            ts = ctx.timestamp
            if ts is not None:
                where = f" at epoch {ts.epoch}, batch {ts.batch}"
            raise CallbackError(callback_name(callback), event, error, where) from error
