"""What lets `fit` survive preemption: SIGTERM handling, agreeing on a stop across ranks, and the
checkpoint glue that saves and restores the loop's own state (callbacks, data position).

A SIGTERM only asks the run to stop: the current step finishes, every rank agrees to stop at the
same step, the loop writes a final checkpoint and returns. The callbacks' `state_dict()` and the
data loader's position are saved as JSON strings in `state.extra` (see `events.encode_state`), so
`fit(..., autoresume=True)` continues bit-identically from the newest checkpoint.

Example:
    >>> with StopOnSigterm(ctx):          # SIGTERM -> ctx.request_stop(...)
    ...     state = train(...)
    >>> state = with_loop_extra(state, names, callbacks, source)
    >>> manager.save(state)
"""

from __future__ import annotations

import contextlib
import inspect
import os
import signal
import threading
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from .data import DataSource
from .events import Context, decode_state, encode_state
from .state import TrainState

__all__ = [
    "CALLBACKS_KEY",
    "DATA_KEY",
    "StopOnSigterm",
    "agree_on_stop",
    "checkpoint_manager",
    "restore_latest",
    "wait_for_saves",
    "with_loop_extra",
]

# Where fit keeps its own entries in `state.extra` (JSON strings, see events.encode_state).
CALLBACKS_KEY = "callbacks"
DATA_KEY = "data"


class StopOnSigterm:
    """While active, SIGTERM calls `ctx.request_stop("SIGTERM: preempted")` instead of killing.

    The previous handler comes back on exit. Off the main thread (where Python cannot set signal
    handlers) it does nothing.

    Args:
        ctx: the run's `Context`.
    """

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self._old: tuple[Any] | None = None

    def __enter__(self) -> StopOnSigterm:
        if threading.current_thread() is not threading.main_thread():
            return self  # signal handlers can only be set from the main thread

        def on_sigterm(signum, frame):  # finish the current step, checkpoint, return
            self.ctx.request_stop("SIGTERM: preempted")

        old = signal.signal(signal.SIGTERM, on_sigterm)
        self._old = (signal.SIG_DFL if old is None else old,)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old[0])
            self._old = None


def agree_on_stop(ctx: Context) -> None:
    """Stop on every rank when any rank was asked to (a callback, or SIGTERM arriving a step
    apart): ranks that disagree would wait on each other's collectives forever.

    Args:
        ctx: this rank's `Context`; `ctx.request_stop` is called when another rank stops.
    """
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    flag = torch.tensor([1 if ctx.stop_requested else 0], dtype=torch.int32)
    if dist.get_backend() == "nccl":  # a CPU tensor goes through gloo when it is configured
        flag = flag.cuda()
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if int(flag.item()) and not ctx.stop_requested:
        ctx.request_stop("stop requested on another rank")


def checkpoint_manager(checkpoints: Any) -> Any:
    """`fit(checkpoints=...)` as a manager: None, a directory (a new `Manager`), or a manager.

    Raises:
        TypeError: an object without `should_save`, `save` and `restore`.
    """
    if checkpoints is None:
        return None
    if isinstance(checkpoints, (str, os.PathLike)):
        from .checkpoint import Manager

        return Manager(os.fspath(checkpoints))
    missing = [m for m in ("should_save", "save", "restore") if not hasattr(checkpoints, m)]
    if missing:
        raise TypeError(
            f"checkpoints must be a functrain.checkpoint.Manager (or a directory); "
            f"{type(checkpoints).__name__} lacks {missing}"
        )
    return checkpoints


def wait_for_saves(manager: Any, failed: bool) -> None:
    """Finish in-flight saves; when an error is already propagating, warn instead of raising."""
    wait = getattr(manager, "wait", None)
    if not callable(wait):
        return
    if not failed:
        wait()
        return
    try:  # an error is already propagating: finish the save, but do not mask the error
        wait()
    except Exception as error:  # noqa: BLE001
        warnings.warn(f"a checkpoint save failed while handling an error: {error}", stacklevel=3)


def with_loop_extra(
    state: TrainState, names: Sequence[str], callbacks: Sequence[Any], source: DataSource
) -> TrainState:
    """`state` with the callbacks' state and the data position in `extra` (for saving).

    Args:
        state: the state to save.
        names: `events.unique_names(callbacks)`, the keys callback states are saved under.
        callbacks: the run's callbacks and loggers.
        source: the training data's `DataSource`.
    Returns:
        the state with `extra["callbacks"]` and `extra["data"]` set (when there is any).
    """
    extra = dict(state.extra)
    saved = {}
    for name, callback in zip(names, callbacks):
        state_dict = getattr(callback, "state_dict", None)
        if callable(state_dict) and not isinstance(callback, torch.nn.Module):
            saved[name] = encode_state(state_dict(), f"{name}.state_dict()")
    if saved:
        extra[CALLBACKS_KEY] = saved
    data_state = source.state_dict(state.timestamp.sample_in_epoch)
    if data_state:
        extra[DATA_KEY] = encode_state(data_state, "train_data state")
    return state.replace(extra=extra)


def restore_latest(
    manager: Any,
    state: TrainState,
    names: Sequence[str],
    callbacks: Sequence[Any],
    source: DataSource,
) -> TrainState | None:
    """Restore the newest checkpoint of `manager` into the run: the state, the callbacks' state
    (`load_state_dict`) and the data position.

    Args:
        manager: the checkpoint manager.
        state: the current state (the structure to restore into).
        names, callbacks, source: as in `with_loop_extra`.
    Returns:
        the restored state, or None when there is no checkpoint.
    """
    like = with_loop_extra(state, names, callbacks, source)
    path = None
    if "ignore" in inspect.signature(manager.restore).parameters:
        # The loop's own entries are read apart: the set of callbacks may differ on resume.
        restored = manager.restore(
            like=like, ignore=(f"extra.{CALLBACKS_KEY}", f"extra.{DATA_KEY}")
        )
        path = manager.latest()  # after restore: a damaged newer checkpoint was set aside
        saved_extra = _saved_loop_extra(path, manager) if restored is not None and path else {}
    else:
        restored = manager.restore(like=like)
        saved_extra = restored.extra if restored is not None else {}
    if restored is None:
        return None
    if saved_extra:
        extra = {k: v for k, v in restored.extra.items() if k not in (CALLBACKS_KEY, DATA_KEY)}
        restored = restored.replace(extra={**extra, **saved_extra})
    saved = restored.extra.get(CALLBACKS_KEY, {}) or {}
    where = f"{path or 'the checkpoint'}/tree.json"
    for name, callback in zip(names, callbacks):
        load = getattr(callback, "load_state_dict", None)
        if name in saved and callable(load) and not isinstance(callback, torch.nn.Module):
            with _saved_state(where, f"{CALLBACKS_KEY}.{name}", f"callback {name!r}"):
                load(decode_state(saved[name]))
    data_state = restored.extra.get(DATA_KEY)
    with _saved_state(where, DATA_KEY, "the training data's position"):
        source.load_state_dict(
            decode_state(data_state) if isinstance(data_state, str) else None,
            restored.timestamp.batch_in_epoch,
        )
    return restored


@contextlib.contextmanager
def _saved_state(file: str, key: str, what: str):
    """Turn a failure to read saved loop state into a CheckpointError naming file and fix."""
    from .checkpoint import CheckpointError

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


def _saved_loop_extra(path: Any, manager: Any) -> dict[str, Any]:
    """The `extra["callbacks"]` and `extra["data"]` strings of the checkpoint at `path`."""
    from .checkpoint import describe

    found: dict[str, Any] = {}
    for record in describe(path, getattr(manager, "storage_options", None)).records:
        if len(record.path) < 2 or record.path[0] != "extra" or record.kind != "str":
            continue
        if record.path[1] == CALLBACKS_KEY and len(record.path) == 3:
            found.setdefault(CALLBACKS_KEY, {})[record.path[2]] = record.value
        elif record.path[1] == DATA_KEY and len(record.path) == 2:
            found[DATA_KEY] = record.value
    return found
