"""Ending a distributed run cleanly: what functrain made is torn down at exit, in an order that
never aborts and never waits forever.

Why this exists (torch 2.13, gloo): a gloo process group runs its collectives on worker threads,
and a worker drops its last reference to a finished collective *after* waking the caller. Dropping
it releases the tensors, which needs the GIL. When the main thread has already reached interpreter
finalization, taking the GIL ends the worker with `pthread_exit`, whose unwinding meets a
`noexcept` destructor: `terminate called without an active exception`, SIGABRT, exit -6 — about
one run in four with a plain `init_process_group` + `all_reduce` and no `destroy_process_group`
(on an idle machine; less often on a busy one).
Destroying a group joins its workers (its destructor releases the GIL), but only once nothing
holds the group any more, and several things do: every `DeviceMesh` (its group registry),
checkpoint managers, and `torch.distributed.nn.functional`, whose default arguments capture the
default group when that module is first imported after `init_process_group` (see
`functrain._torch`, which holds the workaround).

When: importing functrain registers nothing. `exit_hook` is registered with atexit once, when
functrain itself creates the default process group (`parallel.mesh.init_distributed`) or when
something asks to run at exit (`on_exit`); a mesh functrain makes or lays a state out on is
remembered (weakly) with `release_at_exit`, so no heap walk is needed to find it.

`shutdown()` (run at exit by `exit_hook`; safe to call early and twice) therefore, in this order:

1. runs the exit callbacks functrain registered (`on_exit`: checkpoint managers wait for the save
   in flight, stop their writer thread and destroy their own group);
2. destroys every process group (sub-groups first, then the default group; the store goes with
   them), holding each group's backends meanwhile;
3. drops the references torch itself keeps (the registries of the meshes given to
   `release_at_exit`, the captured defaults) while a destroyed group is still referenced;
4. drops the held backends: each one no group holds any more is destroyed now, joining its
   worker threads with the GIL released (before torch 2.8 a group's own destructor keeps the
   GIL and can deadlock with a worker still freeing the last collective's tensors: see
   `functrain._torch.group_backends`); if gloo workers still live, collects garbage once;
5. if gloo workers still live (a group the user still holds), waits with the GIL released until
   they are idle (bounded), so none is mid-release when finalization starts.

At exit a watchdog bounds the whole: if teardown is still waiting after `FUNCTRAIN_EXIT_TIMEOUT`
seconds (default 60; e.g. a collective left in flight with a peer that vanished), it prints one
line saying what it waited for and ends the process with the run's exit code (1 when unknown).

Example:
    >>> import functrain.parallel as fdist
    >>> fdist.init_mesh()          # registers the exit hook: nothing else to call
    >>> fdist.shutdown()           # or explicitly, e.g. before the process does other work
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

__all__ = [
    "exit_hook",
    "gloo_worker_threads",
    "on_exit",
    "register_exit_hook",
    "release_at_exit",
    "set_exit_code",
    "shutdown",
]

_EXIT_TIMEOUT_ENV = "FUNCTRAIN_EXIT_TIMEOUT"
_QUIESCE_S = 2.0

# Process-level teardown bookkeeping (what atexit itself is): callbacks for objects functrain
# made, held weakly for bound methods so registering never keeps an object alive; the meshes
# whose group registries to empty, held weakly; whether `exit_hook` is registered.
_callbacks: list[Callable[[], Callable[[], None] | None]] = []
_meshes: list[weakref.ref] = []
_exit_code: list[int] = []
_hook_registered: list[bool] = []
_lock = threading.Lock()


def register_exit_hook() -> None:
    """Register `exit_hook` with atexit, once per process (later calls do nothing).

    Called when functrain creates the default process group and by `on_exit`.
    """
    with _lock:
        if _hook_registered:
            return
        _hook_registered.append(True)
    atexit.register(exit_hook)


def release_at_exit(mesh: Any) -> None:
    """Empty `mesh`'s process-group registry at teardown, once its groups are destroyed (a
    mesh still referenced at exit would keep them, and their gloo threads, alive). Held weakly.

    Example:
        >>> release_at_exit(init_device_mesh("cpu", (2,)))
    """
    with _lock:
        _meshes[:] = [ref for ref in _meshes if ref() is not None]
        if not any(ref() is mesh for ref in _meshes):
            _meshes.append(weakref.ref(mesh))


def on_exit(callback: Callable[[], None]) -> None:
    """Run `callback` first in `shutdown()` (last registered runs first, like atexit).

    A bound method is held weakly: an object that is garbage-collected earlier is skipped.

    Args:
        callback: a function or bound method taking no arguments; errors are reported, not raised.
    Example:
        >>> on_exit(manager.close)   # a checkpoint manager still open at exit is closed
    """
    ref: Callable[[], Callable[[], None] | None]
    if hasattr(callback, "__self__") and hasattr(callback, "__func__"):
        ref = weakref.WeakMethod(callback)
    else:
        ref = lambda: callback  # noqa: E731 - a plain function: a strong reference is fine
    with _lock:
        _callbacks.append(ref)
    register_exit_hook()


def set_exit_code(code: int) -> None:
    """Record the exit code the process is about to end with (the watchdog ends with it)."""
    _exit_code[:] = [int(code)]


def gloo_worker_threads() -> list[int] | None:
    """Thread ids of this process's live gloo worker threads (None where they cannot be told:
    no /proc, or a torch that leaves them unnamed, `_torch.gloo_worker_thread_name`)."""
    from .. import _torch

    name = _torch.gloo_worker_thread_name()
    if name is None:
        return None
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    found = []
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() == name:
                    found.append(int(tid))
        except OSError:  # the thread ended meanwhile
            continue
    return found


def shutdown() -> None:
    """Tear down what the run made (see the module docstring); safe to call twice.

    Runs at exit by itself (`exit_hook`); call it to release the process groups earlier.
    """
    _teardown(_Watchdog(None))


def exit_hook() -> None:
    """What atexit runs: `shutdown()` under the watchdog (`FUNCTRAIN_EXIT_TIMEOUT`)."""
    _teardown(_Watchdog(_exit_timeout()))


def _teardown(watchdog: _Watchdog) -> None:
    if not _callbacks and not _distributed_initialized() and not gloo_worker_threads():
        return  # a one-process run that made nothing: nothing to wait for
    watchdog.start()
    try:
        watchdog.doing("closing checkpoint managers and other exit callbacks")
        _run_callbacks()
        watchdog.doing("destroying the process groups")
        groups, backends = _destroy_groups()
        watchdog.doing("releasing the groups torch still references")
        _release_torch_references(groups)
        watchdog.doing("joining gloo's worker threads")
        backends.clear()  # destroys each backend no group holds, with the GIL released
        if gloo_worker_threads():
            gc.collect()  # a group in a reference cycle
        watchdog.doing("waiting for gloo's worker threads to go idle")
        _quiesce_gloo_workers(_QUIESCE_S)
    finally:
        watchdog.stop()


def _run_callbacks() -> None:
    with _lock:
        pending = list(reversed(_callbacks))
        _callbacks.clear()
    for ref in pending:
        callback = ref()
        if callback is None:
            continue
        try:
            callback()
        except Exception as error:  # noqa: BLE001 - at exit, one failure must not stop the rest
            print(f"functrain: at exit, {_name(callback)} failed: {error}", file=sys.stderr)


def _distributed_initialized() -> bool:
    if "torch.distributed" not in sys.modules:
        return False
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _destroy_groups() -> tuple[list[weakref.ref], list[Any]]:
    """Destroy every process group; returns weak references to the groups and their backends
    (held: no group's destructor destroys a backend, see `_torch.group_backends`)."""
    import torch.distributed as dist

    from .. import _torch

    if not (dist.is_available() and dist.is_initialized()):
        return [], []
    groups = _torch.live_groups()
    try:
        backends = _torch.group_backends(groups)
    except (AttributeError, RuntimeError):  # a group torch did not make (a Python subclass)
        backends = []
    refs = [weakref.ref(group) for group in groups]
    del groups
    # With group=None torch destroys every group, newest first, then the default group.
    dist.destroy_process_group()
    return refs, backends


def _release_torch_references(groups: list[weakref.ref]) -> None:
    """Drop the references torch keeps to the destroyed `groups`, so their destructors run now.

    Each step runs only while one of them is still referenced.
    """
    from .. import _torch

    for release in (_torch.release_world_defaults, _release_meshes, gc.collect):
        if all(ref() is None for ref in groups):
            return
        release()


def _release_meshes() -> None:
    """Empty the group registry of every mesh given to `release_at_exit` that still lives
    (meshes are unusable once their groups are destroyed; a child mesh shares its root's)."""
    with _lock:
        meshes = [ref() for ref in _meshes]
        _meshes.clear()
    from .. import _torch

    for mesh in meshes:
        if mesh is not None:
            _torch.release_mesh_groups(mesh)


def _quiesce_gloo_workers(limit_s: float) -> None:
    """Wait, with the GIL released, until no gloo worker is running (bounded by `limit_s`).

    A group still referenced somewhere keeps its workers; a worker that is still releasing its
    last collective is runnable (or waiting for the GIL, which sleeping here hands over), and
    an idle one sleeps on its queue. Three all-idle readings in a row count as quiet.
    """
    tids = gloo_worker_threads()
    if tids is None:
        time.sleep(0.05)  # no /proc: give any worker the GIL for a moment
        return
    if not tids:
        return
    deadline = time.monotonic() + limit_s
    quiet = 0
    while quiet < 3 and time.monotonic() < deadline:
        time.sleep(0.002)
        quiet = quiet + 1 if all(_sleeping(t) for t in tids) else 0


def _sleeping(tid: int) -> bool:
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True  # the thread is gone
    return state in ("S", "I")


def _exit_timeout() -> float:
    raw = os.environ.get(_EXIT_TIMEOUT_ENV, "60")
    try:
        value = float(raw)
    except ValueError:
        print(f"functrain: ignoring {_EXIT_TIMEOUT_ENV}={raw!r} (not a number)", file=sys.stderr)
        return 60.0
    return value if value > 0 else 60.0


class _Watchdog:
    """Ends the process if teardown takes longer than `timeout_s` (a peer that vanished);
    with `timeout_s=None` (an explicit `shutdown()` mid-run) it only keeps the phase's name."""

    def __init__(self, timeout_s: float | None):
        self.timeout_s = timeout_s
        self.what = "starting"
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._watch, name="functrain-exit-watchdog", daemon=True
        )

    def start(self) -> None:
        if self.timeout_s is not None:
            self._thread.start()

    def doing(self, what: str) -> None:
        self.what = what

    def stop(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()

    def _watch(self) -> None:
        if self._done.wait(self.timeout_s):
            return
        code = _exit_code[0] if _exit_code else 1
        print(
            f"functrain: teardown still {self.what} after {self.timeout_s:.0f} s (a peer rank "
            f"may have died); exiting with code {code}. Set {_EXIT_TIMEOUT_ENV} to wait longer.",
            file=sys.stderr,
            flush=True,
        )
        _flush_std_streams()
        os._exit(code)


def _flush_std_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream at exit
            pass


def _name(callback) -> str:
    owner = getattr(callback, "__self__", None)
    name = getattr(callback, "__qualname__", repr(callback))
    return f"{type(owner).__name__}.{callback.__name__}" if owner is not None else name
