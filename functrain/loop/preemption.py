"""What lets `fit` survive preemption: signals, one agreed decision per step boundary, and the
checkpoint glue that saves and restores the loop's own state (callbacks, data position).

A SIGTERM (a scheduler preempting the job) or a first Ctrl-C (SIGINT) only asks the run to stop:
the handler notes it, the current step finishes, and the loop stops at a step boundary decided
for all ranks alike: on one process the next one (`decide`, no collective); on several ranks the
boundary where the next agreement is read (`functrain.loop.agreement`: a small all-reduce
started without waiting and read one boundary later). The loop acts only on that decision --
never on a flag a signal may set a moment later on one rank -- so all ranks stop at the same
step and enter the final checkpoint's collectives together. A second Ctrl-C aborts at once
(KeyboardInterrupt).

The callbacks' `state_dict()` and the data loader's position are saved as JSON strings in the
state's `extra` (see `saved_state.encode_state`), so `fit(..., autoresume=True)` continues
bit-identically from the newest checkpoint.

Example:
    >>> with StopSignals(rank=0) as signals:
    ...     boundary = decide(signals.pending, ctx.stop_reason, elapsed_sec=12.5)
    ...     if boundary.stop:
    ...         manager.save(with_loop_extra(state, names, callbacks, source))
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import os
import signal
import sys
import threading
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..checkpoint import CheckpointMismatchError
from ..data import DataSource
from .saved_state import decode_state, encode_state

if TYPE_CHECKING:  # the checkpoint machinery (tensorstore) is imported by a run that checkpoints
    from ..checkpoint import Manager

__all__ = [
    "CALLBACKS_KEY",
    "DATA_KEY",
    "Boundary",
    "StopKind",
    "StopSignals",
    "decide",
    "checkpoint_manager",
    "restore_latest",
    "wait_for_saves",
    "with_loop_extra",
]

# Where fit keeps its own entries in the state's `extra` (JSON strings, see saved_state.encode_state).
CALLBACKS_KEY = "callbacks"
DATA_KEY = "data"


class StopKind(enum.IntEnum):
    """Why a run stops; ranks agree on the largest value any of them saw."""

    NONE = 0
    CALLBACK = 1  # ctx.request_stop(...)
    SIGINT = 2  # Ctrl-C
    SIGTERM = 3  # preemption by the scheduler


@dataclasses.dataclass(frozen=True)
class Boundary:
    """The decision every rank takes at one step boundary.

    Attributes:
        stop: why the run stops here (`StopKind.NONE`: it goes on).
        elapsed_sec: the run's wall-clock time, the same on every rank (their maximum), so that
            wall-clock durations and intervals fall on the same step everywhere.
    """

    stop: StopKind = StopKind.NONE
    elapsed_sec: float = 0.0

    @property
    def preempted(self) -> bool:
        """True when a signal (SIGTERM or Ctrl-C) stopped the run, on any rank."""
        return self.stop in (StopKind.SIGTERM, StopKind.SIGINT)


class StopSignals:
    """While active, SIGTERM and the first SIGINT are noted in `pending` instead of killing.

    A second SIGINT raises KeyboardInterrupt at once. The previous handlers come back on exit.
    Off the main thread (where Python cannot set signal handlers) it does nothing.

    Args:
        rank: this process's rank; only rank 0 prints what a Ctrl-C does.
        quiet: print nothing.
    Attributes:
        pending: the `StopKind` of the signal received, or `StopKind.NONE`.
    """

    def __init__(self, rank: int = 0, quiet: bool = False):
        self.rank, self.quiet = rank, quiet
        self.pending = StopKind.NONE
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is not threading.main_thread():
            return self
        for signum, handler in (
            (signal.SIGTERM, self._on_sigterm),
            (signal.SIGINT, self._on_sigint),
        ):
            old = signal.signal(signum, handler)
            self._old[signum] = signal.SIG_DFL if old is None else old
        return self

    def _on_sigterm(self, signum, frame) -> None:
        self.pending = max(self.pending, StopKind.SIGTERM)

    def _on_sigint(self, signum, frame) -> None:
        if self.pending is StopKind.SIGINT:  # the second Ctrl-C: abort now
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt("second Ctrl-C: fit aborted without a final checkpoint")
        self.pending = max(self.pending, StopKind.SIGINT)
        if not self.quiet and self.rank == 0:
            print(
                "\nfunctrain: Ctrl-C -- stopping at the next step boundary and saving a "
                "checkpoint; press Ctrl-C again to abort at once",
                file=sys.stderr,
                flush=True,
            )

    def __exit__(self, *exc: Any) -> None:
        for signum, old in self._old.items():
            signal.signal(signum, old)
        self._old = {}


def decide(pending: StopKind, stop_reason: str | None, elapsed_sec: float) -> Boundary:
    """The decision of one step boundary on one process (several ranks agree on theirs through
    `agreement.Agreement`, off the hot path). No collective, no host read: `fit` calls it at every
    step boundary of a one-process run.

    Args:
        pending: the signal this process received (`StopSignals.pending`).
        stop_reason: `ctx.stop_reason` (a callback's request), or None.
        elapsed_sec: the run's wall-clock time.
    Returns:
        the `Boundary`: the strongest reason to stop (a signal over a callback's request).
    Example:
        >>> decide(StopKind.NONE, "early stop", 2.0).stop
        <StopKind.CALLBACK: 1>
    """
    requested = StopKind.CALLBACK if stop_reason is not None else StopKind.NONE
    return Boundary(max(pending, requested), float(elapsed_sec))


def stop_reason_for(boundary: Boundary, pending: StopKind, own_reason: str | None) -> str:
    """The stop reason this rank reports for an agreed stop.

    Args:
        boundary: the agreed decision (its `stop` is not NONE).
        pending: the signal this rank received.
        own_reason: this rank's `ctx.stop_reason` (a callback's), if any.
    """
    if boundary.stop is StopKind.SIGTERM:
        return "SIGTERM: preempted" + ("" if pending is StopKind.SIGTERM else " (on another rank)")
    if boundary.stop is StopKind.SIGINT:
        return "Ctrl-C (SIGINT)" + ("" if pending is StopKind.SIGINT else " on another rank")
    return own_reason or "stop requested on another rank"


def checkpoint_manager(checkpoints: Manager | str | os.PathLike | None) -> Manager | None:
    """`fit(checkpoints=...)` as a `Manager`: None, a directory (a new `Manager`), or a manager.

    Raises:
        TypeError: anything else.
    """
    if checkpoints is None:
        return None
    from ..checkpoint import Manager

    if isinstance(checkpoints, Manager):
        return checkpoints
    if isinstance(checkpoints, (str, os.PathLike)):
        return Manager(os.fspath(checkpoints))
    raise TypeError(
        "fit(checkpoints=...) takes a functrain.checkpoint.Manager or a directory (a Manager "
        f"that saves every epoch); got {type(checkpoints).__name__}"
    )


def wait_for_saves(manager: Manager, failed: bool) -> None:
    """Finish in-flight saves; when an error is already propagating, warn instead of raising."""
    if not failed:
        manager.wait()
        return
    try:  # an error is already propagating: finish the save, but do not mask the error
        manager.wait()
    except Exception as error:  # noqa: BLE001
        warnings.warn(f"a checkpoint save failed while handling an error: {error}", stacklevel=3)


def with_loop_extra(
    state: Any, names: Sequence[str], callbacks: Sequence[Any], source: DataSource
) -> Any:
    """`state` with the callbacks' state and the data position in `extra` (for saving).

    Args:
        state: a `TrainState` or `FitState` (anything with `extra`, `timestamp`, `replace`).
        names: `events.unique_names(callbacks)`, the keys callback states are saved under.
        callbacks: the run's callbacks and loggers.
        source: the training data's `DataSource`.
    Returns:
        the state with `extra["callbacks"]` and `extra["data"]` set (when there is any).
    """
    extra = dict(state.extra)
    saved = {}
    for name, callback in zip(names, callbacks):
        state_dict = getattr(callback, "state_dict", None)  # optional in the callback protocol
        if callable(state_dict) and not isinstance(callback, torch.nn.Module):
            saved[name] = encode_state(state_dict(), f"{name}.state_dict()")
    if saved:
        extra[CALLBACKS_KEY] = saved
    data_state = source.state_dict(state.timestamp.sample_in_epoch)
    if data_state:
        extra[DATA_KEY] = encode_state(data_state, "train_data state")
    return state.replace(extra=extra)


def restore_latest(
    manager: Manager,
    like: Any,
    names: Sequence[str],
    callbacks: Sequence[Any],
    source: DataSource,
    *,
    inplace: bool = False,
) -> tuple[Any, str | None] | None:
    """Restore the newest checkpoint of `manager` into the run: the state, the callbacks' state
    (`load_state_dict`) and the data position.

    Args:
        manager: the run's checkpoint manager.
        like: the structure to restore into, with everything the step keeps in the state
            (`step.init_state` already applied).
        names, callbacks, source: as in `with_loop_extra`.
        inplace: copy the checkpoint into `like`'s tensors (a donated state: they keep their
            storage, memory format and placement, and stay the model's own parameters).
    Returns:
        `(restored state, path)` -- path None when the state came from the manager's
        `init_from` (a fresh run starting from another run's weights) -- or None when there is
        nothing to restore.
    Raises:
        CheckpointMismatchError: the checkpoint does not fit `like`, with what to do about it.
    """
    # The loop's own entries are read apart: the set of callbacks may differ on resume.
    ignore = (f"extra.{CALLBACKS_KEY}", f"extra.{DATA_KEY}")
    try:
        restored = manager.restore(like=like, ignore=ignore, inplace=inplace)
    except CheckpointMismatchError as error:
        raise CheckpointMismatchError(_mismatch_help(manager.latest(), error)) from error
    path = manager.restored_from  # the root's or a local tier's (None: init_from)
    if restored is None:
        return None
    if path is None:  # the weights of Manager(init_from=...): a new run, nothing else to load
        return restored, None
    saved_extra = _saved_loop_extra(path, manager.storage_options)
    extra = {k: v for k, v in restored.extra.items() if k not in (CALLBACKS_KEY, DATA_KEY)}
    restored = restored.replace(extra={**extra, **saved_extra})
    saved = restored.extra.get(CALLBACKS_KEY, {}) or {}
    where = f"{path or 'the checkpoint'}/tree.json"
    for name, callback in zip(names, callbacks):
        load = getattr(callback, "load_state_dict", None)  # optional in the callback protocol
        if name in saved and callable(load) and not isinstance(callback, torch.nn.Module):
            with _saved_state(where, f"{CALLBACKS_KEY}.{name}", f"callback {name!r}"):
                load(decode_state(saved[name]))
    data_state = restored.extra.get(DATA_KEY)
    with _saved_state(where, DATA_KEY, "the training data's position"):
        source.load_state_dict(
            decode_state(data_state) if isinstance(data_state, str) else None,
            restored.timestamp.batch_in_epoch,
        )
    return restored, path


def _mismatch_help(path: str | None, error: CheckpointMismatchError) -> str:
    """fit's own advice for a checkpoint that does not fit the run (load's names `like`/`strict`,
    which fit does not take)."""
    what = str(error).split(". Fix:")[0]
    return (
        f"fit(autoresume=True) cannot resume from {path}: {what}. The state fit resumes into is "
        "built from the step it was given (model, optimizer, composed algorithms such as ema() "
        "or swa(), precision), which must be the ones the checkpoint was written with. To "
        "continue that run, build the same step; to start a new run from its weights only, "
        f"give fit a Manager with a new root and init_from={path!r} (init_ignore=(...) skips "
        "keys)"
    )


@contextlib.contextmanager
def _saved_state(file: str, key: str, what: str):
    """Turn a failure to read saved loop state into a CheckpointError naming file and fix."""
    from ..checkpoint import CheckpointError

    try:
        yield
    except CheckpointError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as err:
        raise CheckpointError(
            f"{file}: the saved state of {what} (extra.{key}) cannot be restored: {err}. It was "
            "written by an incompatible version of that code, or the checkpoint was modified. "
            "Resume from an earlier checkpoint (move this one aside); a callback whose state "
            "cannot be read starts fresh under another `name` (its saved state is not looked up)"
        ) from err


def _saved_loop_extra(path: str, storage_options: dict | None) -> dict[str, Any]:
    """The `extra["callbacks"]` and `extra["data"]` strings of the checkpoint at `path`."""
    from ..checkpoint import describe

    found: dict[str, Any] = {}
    for record in describe(path, storage_options).records:
        if len(record.path) < 2 or record.path[0] != "extra" or record.kind != "str":
            continue
        if record.path[1] == CALLBACKS_KEY and len(record.path) == 3:
            found.setdefault(CALLBACKS_KEY, {})[record.path[2]] = record.value
        elif record.path[1] == DATA_KEY and len(record.path) == 2:
            found[DATA_KEY] = record.value
    return found
