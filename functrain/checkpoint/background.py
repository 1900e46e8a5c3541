"""`BackgroundWriter`: the asynchronous half of a `Manager`'s saves.

It owns what writing in the background needs: one worker thread, the host buffers a state is
copied into (reused save after save, so a save allocates nothing after the first), and, on
several ranks, a gloo process group of its own, so that the writes' collectives never interleave
with the training collectives on the default group. A second save waits for the first; an error
of the thread is raised by the next `wait`.

Whoever creates a `BackgroundWriter` closes it (`Manager.close`, `with Manager(...)`, or `fit`
for a manager it made): the save in flight needs its group, and a group still referenced is
never freed. A writer still open when the interpreter exits is closed then, its save in flight
committed first: `open` registers that with `atexit` (and `close` takes it back), so it runs
before functrain's teardown of the process groups, which was registered earlier, when the
default group was made.

Example:
    >>> background = BackgroundWriter(async_save=True)
    >>> staged = background.stage(state)
    >>> background.submit(lambda: writer.write(staged, loc), loc.url, state.step)
    >>> background.wait()
    >>> background.close()
"""

from __future__ import annotations

import atexit
import concurrent.futures
import sys
from collections.abc import Callable
from typing import Any

import torch

from .. import _torch
from .errors import CheckpointError
from .staging import Staged, dist_info, stage


class BackgroundWriter:
    """Stages states on the host and runs their writes, in a worker thread when asynchronous.

    Args:
        async_save: write in a background thread (else `submit` runs the write at once).
        process_group: the ranks that save together (default: all; asynchronous saves on
            several ranks get a gloo group of their own, destroyed by `close`).
    """

    def __init__(self, async_save: bool, process_group=None):
        self.async_save = async_save
        self.rank, world = dist_info(process_group)
        self.group = process_group
        self._wants_group = async_save and process_group is None and world > 1
        self._own_group = False
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.open()
        self._pending: tuple[concurrent.futures.Future, str, int] | None = None
        self._buffers: dict[str, torch.Tensor] = {}  # host copies, reused save after save
        self._plans: dict = {}  # staging's descriptions by structure, reused likewise

    def open(self) -> None:
        """Make the worker thread and the group if `close` gave them back (collective: every
        rank calls it together, as every rank saves and restores together)."""
        made = False  # (a save opens it every time: usually there is nothing to make)
        if self._wants_group and not self._own_group:
            self.group = torch.distributed.new_group(backend="gloo")
            self._own_group = made = True
        if self.async_save and self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="functrain-checkpoint"
            )
            made = True
        if made:
            atexit.unregister(self._close_at_exit)  # once, however often it is opened
            atexit.register(self._close_at_exit)

    def stage(self, state: Any) -> Staged:
        """Describe `state` and take this rank's data off the device (a copy when asynchronous:
        training goes on changing the originals)."""
        buffers = self._buffers if self.async_save else None
        return stage(
            state, copy=self.async_save, buffers=buffers, group=self.group, plans=self._plans
        )

    def submit(self, job: Callable[[], None], url: str, step: int) -> None:
        """Run `job` (the write of step `step` to `url`) in the background, or now when
        synchronous. Call `wait` first: one write is in flight at a time."""
        if self._executor is None:
            job()
        else:
            self._pending = (self._executor.submit(job), url, step)

    @property
    def pending(self) -> bool:
        """True while a write was submitted and not yet waited for."""
        return self._pending is not None

    def wait(self) -> None:
        """Block until the write in flight (if any) is done.

        Raises:
            CheckpointError: that write failed (the error of the background thread).
        """
        pending, self._pending = self._pending, None
        if pending is None:
            return
        future, url, step = pending
        try:
            future.result()
        except Exception as err:
            raise CheckpointError(
                f"the asynchronous save of step {step} to {url} failed: {err}"
            ) from err

    def close(self) -> None:
        """Stop the worker thread and destroy the group this writer made (call `wait` first);
        `open` makes them again."""
        atexit.unregister(self._close_at_exit)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if self._own_group:
            backends = []
            if torch.distributed.is_initialized():
                # The group's backends go last, with the GIL released: before torch 2.8 the
                # group's own destructor keeps the GIL while it joins gloo's workers, and a worker
                # still freeing the last collective's tensors waits for it
                # (`_torch.group_backends`).
                backends = _torch.group_backends([self.group])
                torch.distributed.destroy_process_group(self.group)
            self.group = None  # a group still referenced is never freed (its threads live)
            backends.clear()
            self._own_group = False

    def _close_at_exit(self) -> None:
        try:
            self.wait()  # the save in flight commits before its group goes
        except CheckpointError as err:
            print(f"functrain: at exit, {err}", file=sys.stderr)
        self.close()


__all__ = ["BackgroundWriter"]
