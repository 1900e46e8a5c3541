"""The stop agreement of several ranks, off the hot path: started without waiting after a step is
dispatched, read one boundary later, and only every so often.

On one process `fit` decides at every step boundary from its own signals and clock (no
collective). On several ranks every decision that makes them act differently (stop or not, what
the run's clock reads for wall-clock intervals) must be the same everywhere, so it travels in one
small all-reduce of `[stop kind, clock]` (`MAX`). Reading that all-reduce on the host at every
step would stall the device queue on every step (a host sync under NCCL), so `Agreement`:

- starts the all-reduce with `async_op=True` at a boundary, after the step was dispatched, and
  reads it at the next boundary, after the next step was dispatched (under NCCL its result is
  copied to pinned host memory behind the collective, and the read waits on that copy's event
  only, never on the device's whole queue);
- starts one only every `period` batches, a period that grows (x4) from 4 batches up to about
  `target_sec` seconds of the agreed clock; and after every log, evaluation or checkpoint
  boundary, which read the device anyway.

Every rank starts and reads the same agreements at the same boundaries, since when to start one
depends only on batch numbers and the agreed clock; a stop therefore falls on the same step on
every rank, one agreement after the signal or `ctx.request_stop`.

`Boundaries` is what `fit` asks: the decision of a boundary at once on one process, or the
result of the agreement in flight, if any, on several.

Example:
    >>> agreement = Agreement(start_batch=0)
    >>> agreement.start(0, StopKind.NONE, elapsed_sec=0.0)   # at FIT_START
    >>> boundary = agreement.finish()                        # the next boundary: the decision
"""

from __future__ import annotations

import dataclasses
import math
import time as wallclock
from typing import Any

import torch

from .preemption import Boundary, StopKind, StopSignals, decide

__all__ = ["Agreement", "Boundaries", "several_ranks"]

# How often, in seconds of the agreed clock, the ranks agree at most once the period has grown:
# a SIGTERM's grace period (30 s under SLURM and Kubernetes by default) must also fit a checkpoint.
TARGET_SEC = 2.0
FIRST_PERIOD = 4  # batches between the first agreements; x4 after each, up to TARGET_SEC
GROWTH = 4


def several_ranks() -> bool:
    """True when torch.distributed runs more than one process (then the ranks must agree)."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


@dataclasses.dataclass
class _InFlight:
    batch: int  # the boundary it was started at
    values: torch.Tensor  # [kind, clock]: the collective's output, or its pinned host copy
    work: Any  # the gloo work handle to wait on (None under NCCL: `event` instead)
    event: Any  # the CUDA event behind the host copy (None on CPU)


class Agreement:
    """The agreements of one `fit` on several ranks: when to start one, and its result.

    Args:
        start_batch: the run's batch when `fit` starts (a resumed run counts from there).
        target_sec: the longest period between agreements once it has grown, in agreed seconds.
    Attributes:
        next_start: the batch at whose boundary the next agreement starts (unless one is due
            earlier after a log, evaluation or checkpoint).
    """

    def __init__(self, start_batch: int, target_sec: float = TARGET_SEC):
        self.target_sec = target_sec
        self.next_start = start_batch
        self._period = FIRST_PERIOD // GROWTH  # grown to FIRST_PERIOD by the first result
        self._last: tuple[int, float] | None = None  # (batch, clock) of the latest result
        self._inflight: _InFlight | None = None

    @property
    def in_flight(self) -> bool:
        """True while an agreement was started and not yet read."""
        return self._inflight is not None

    def due(self, batch: int) -> bool:
        """True when the cadence starts an agreement at the boundary of `batch`."""
        return self._inflight is None and batch >= self.next_start

    def start(self, batch: int, pending: StopKind, elapsed_sec: float) -> None:
        """Start the all-reduce of this rank's `[stop kind, clock]` without waiting for it.

        Args:
            batch: the boundary's batch (the same on every rank).
            pending: this rank's stop kind (its signal, or CALLBACK for a `request_stop`).
            elapsed_sec: this rank's clock of the run.
        """
        dist = torch.distributed
        if dist.get_backend() == "nccl":  # a CPU tensor goes through gloo when it is configured
            # Filled on the device (no copy from pageable host memory, which would sync).
            device = torch.device("cuda", torch.cuda.current_device())
            values = torch.full((2,), float(pending), dtype=torch.float64, device=device)
            values[1] = float(elapsed_sec)
            dist.all_reduce(values, op=dist.ReduceOp.MAX, async_op=True).wait()  # stream order
            host = torch.empty(2, dtype=torch.float64, pin_memory=True)
            host.copy_(values, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._inflight = _InFlight(batch, host, None, event)
            return
        values = torch.tensor([float(pending), float(elapsed_sec)], dtype=torch.float64)
        work = dist.all_reduce(values, op=dist.ReduceOp.MAX, async_op=True)
        self._inflight = _InFlight(batch, values, work, None)

    def finish(self) -> Boundary:
        """Wait for the agreement in flight and read it (the one host read of an agreement).

        Returns:
            the agreed `Boundary`: the largest stop kind and the largest clock of all ranks.
        """
        inflight = self._wait()
        kind, elapsed = inflight.values.tolist()
        self.record(inflight.batch, elapsed)
        return Boundary(StopKind(int(kind)), elapsed)

    def drop(self) -> None:
        """Wait for an agreement in flight without reading it (a later one supersedes it: stop
        kinds and clocks only grow)."""
        if self._inflight is not None:
            self._wait()

    def _wait(self) -> _InFlight:
        inflight = self._inflight
        if inflight is None:
            raise RuntimeError("no agreement in flight: start() one before finish()")
        self._inflight = None
        if inflight.work is not None:
            inflight.work.wait()
        if inflight.event is not None:
            inflight.event.synchronize()  # waits for this copy only, not the device's queue
        return inflight

    def record(self, batch: int, elapsed: float) -> None:
        """Note the agreed clock `elapsed` of the agreement started at `batch`, and set the next
        start: the period grows x4, up to about `target_sec` of the agreed clock (at least 1).

        Example:
            >>> agreement = Agreement(0)
            >>> agreement.record(0, 0.0); agreement.next_start
            4
        """
        period = self._period * GROWTH
        if self._last is not None and batch > self._last[0]:
            sec_per_batch = (elapsed - self._last[1]) / (batch - self._last[0])
            if sec_per_batch > 0:
                period = min(period, math.floor(self.target_sec / sec_per_batch))
        self._period = max(1, period)
        self._last = (batch, elapsed)
        self.next_start = batch + self._period


class Boundaries:
    """The decisions of `fit`'s step boundaries: at once on one process, through `Agreement`s
    (read one boundary after they start) on several ranks.

    Args:
        signals: the run's `StopSignals`.
        ctx: the run's `Context` (a callback's `request_stop` sets its `stop_reason`).
    Attributes:
        synced_batch: the batch of the latest log, evaluation or checkpoint (set by the loop);
            an agreement starts after it, as the device was read there anyway.
    Example:
        >>> boundaries = Boundaries(signals, ctx)
        >>> boundaries.begin(batch=0)          # FIT_START: one process decides now
        Boundary(stop=<StopKind.NONE: 0>, elapsed_sec=0.0)
    """

    def __init__(self, signals: StopSignals, ctx: Any):
        self.signals, self.ctx = signals, ctx
        self.agreement: Agreement | None = None
        self.synced_batch = -1
        self.start_clock(0.0)

    def start_clock(self, elapsed_sec: float) -> None:
        """This rank's clock reads `elapsed_sec` now (the run's clock when `fit` starts)."""
        self._elapsed0, self._t0 = elapsed_sec, wallclock.monotonic()

    def clock(self) -> float:
        """This rank's own clock of the run (the agreed one is the timestamp's `elapsed_sec`)."""
        return self._elapsed0 + (wallclock.monotonic() - self._t0)

    def pending(self) -> StopKind:
        """What this rank would stop for: its signal, or a callback's `request_stop`."""
        requested = StopKind.CALLBACK if self.ctx.stop_reason is not None else StopKind.NONE
        return max(self.signals.pending, requested)

    def begin(self, batch: int) -> Boundary | None:
        """FIT_START: one process decides now; several ranks start the first agreement."""
        if not several_ranks():
            return self.now(batch)
        self.agreement = Agreement(batch)
        self.after(batch)
        return None

    def at(self, batch: int) -> Boundary | None:
        """A step boundary's decision, or None when nothing is decided here (several ranks with
        no agreement in flight: the previous decision holds)."""
        if self.agreement is None:
            return self.now(batch)
        return self.agreement.finish() if self.agreement.in_flight else None

    def after(self, batch: int) -> None:
        """After a boundary's decisions: on several ranks, start an agreement when the cadence
        says so, or after a log, an evaluation or a checkpoint at this boundary."""
        agreement = self.agreement
        if agreement is None or agreement.in_flight:
            return
        if agreement.due(batch) or self.synced_batch == batch:
            agreement.start(batch, self.pending(), self.clock())

    def now(self, batch: int) -> Boundary:
        """The decision of this boundary with every rank, waiting for it (an epoch end)."""
        if self.agreement is None:  # one process: nothing to wait for
            return decide(self.signals.pending, self.ctx.stop_reason, self.clock())
        self.agreement.drop()
        self.agreement.start(batch, self.pending(), self.clock())
        return self.agreement.finish()

    def end(self) -> None:
        """Training ended: wait for an agreement in flight (nothing is left to decide)."""
        if self.agreement is not None:
            self.agreement.drop()

    @property
    def several(self) -> bool:
        """True when the decisions are agreements of several ranks."""
        return self.agreement is not None
