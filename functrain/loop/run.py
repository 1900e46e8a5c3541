"""`FitRun`: one call of `fit` -- the epoch loop, its step boundaries, evaluation, checkpoints
and auto-resume, over the one copy of the state it holds.

`functrain.fit` parses its keywords into a `FitOptions` and runs a `FitRun`; the `Context` that
callbacks see reads the run's state (`ctx.state`) rather than holding a copy of its own. Every
decision after a step boundary follows the boundary's agreed `preemption.Boundary`.

Example:
    >>> result = FitRun(step, state, loader, FitOptions.create(duration="2ep")).run()
    >>> result.state.timestamp.epoch
    2
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from ..loggers import JSONLLogger, ProgressBar
from ..rng import RngState, seed_for
from ..step.batching import to_device
from ..step.protocol import as_step
from ..units import Timestamp, TimeUnit
from . import heartbeat, report
from .agreement import Boundaries
from .data_position import PositionedSource
from .evaluation import describe_batch, dp_info, state_device
from .events import Context, Event, dispatch, unique_names
from .fit_metrics import check_eval_sets, evaluate_sets, update_train_metrics
from .horizon import (
    Every,
    check_fraction_intervals,
    data_batches_per_epoch,
    estimated_horizon,
    max_batches_for,
    run_finished,
)
from .options import FitOptions, FitResult
from .preemption import (
    Boundary,
    StopKind,
    StopSignals,
    checkpoint_manager,
    restore_latest,
    stop_reason_for,
    wait_for_saves,
    with_loop_extra,
)
from .sanity_check import sanity_check
from .state_adapter import adapter_for

__all__ = ["FitRun", "StepError"]

# Step metrics that are not measurements: kept out of the "train/" logs.
_NOT_LOGGED = ("samples", "tokens", "outputs", "targets")


class StepError(RuntimeError):
    """The step failed on a batch; names the batch's position and structure. See `__cause__`."""


class FitRun:
    """One call of `fit`: its options, the state it trains (one copy), and its event context."""

    def __init__(self, step: Any, state: Any, train_data: Any, options: FitOptions):
        self.options = options
        step = as_step(step)
        self.step = step.donated() if options.donate else step
        self.rank, self.world_size = dp_info(state)
        # one TrainState, or a tree of states: chosen here, so the loop below has no mode
        self.adapter, state = adapter_for(state, self.world_size)
        self.state = state  # the one copy of the run's state; ctx.state reads it
        # the state's dp slice; its position is saved with what defines it, checked on resume
        self.source = PositionedSource(
            train_data, (self.rank, self.world_size), options.on_data_change
        )
        self.eval_every = Every(options.eval_interval)
        self.log_every = Every(options.log_interval)
        self.checkpoints = checkpoint_manager(options.checkpoints)
        # a Manager made here from a directory is closed here; one passed in stays open
        self._own_manager = isinstance(options.checkpoints, (str, os.PathLike))
        loggers = list(options.loggers)
        observers = list(options.callbacks) + loggers
        self.progress = next((cb for cb in observers if isinstance(cb, ProgressBar)), None)
        if self.progress is None and options.progress:
            self.progress = ProgressBar()
            loggers.append(self.progress)
        if options.run_dir is not None and not any(isinstance(c, JSONLLogger) for c in observers):
            loggers.append(JSONLLogger())  # <run_dir>/metrics.jsonl, for functrain.plot
        self.callbacks = list(options.callbacks) + loggers
        self.names = unique_names(self.callbacks)
        self.device = state_device(state)
        self.ctx = Context(
            run=self,
            rank=self.rank,
            world_size=self.world_size,
            run_dir=options.run_dir,
            loggers=[cb for cb in self.callbacks if callable(getattr(cb, "log_metrics", None))],
            duration=options.duration,
            log_interval=options.log_interval,
        )
        self.signals = StopSignals(rank=self.rank, quiet=not options.progress)
        self.boundary = Boundary()  # the decision of the latest step boundary
        self.boundaries = Boundaries(self.signals, self.ctx)
        self.last_saved_batch = self.last_eval_batch = self.last_log_batch = -1
        self.boundaries.start_clock(state.timestamp.elapsed_sec)
        self.beat = heartbeat.Heartbeat.of_launch(options.run_dir)  # the launcher's watchdog

    # -- the run -----------------------------------------------------------------------------

    def run(self) -> FitResult:
        failed, aborted = True, False
        try:
            with self.signals:  # SIGTERM, Ctrl-C: finish the step, checkpoint, return
                self._emit(Event.INIT)
                check_eval_sets(self.options.eval_sets, self.rank, self.world_size)
                # what the step keeps in the state, added before a restore target is built
                self.state = self.adapter.init(self.step, self.state)
                found = self._resume() if self.options.autoresume else None
                previous_horizon = self.timestamp.max_batches
                self._set_horizon()
                self._announce(found, previous_horizon)
                where, fresh = (self.rank, self.world_size, self.device), self._batch() == 0
                sanity_check(
                    self.step, self.adapter.step_state(self.state), self.options, where, fresh
                )
                if self.options.seed is not None:
                    seed = seed_for(RngState(self.options.seed), self.state.step, "fit", self.rank)
                    torch.manual_seed(seed)
                self._emit(Event.FIT_START)
                self._apply(self.boundaries.begin(self._batch()))
                trained = self._train()
                self.boundaries.end()
                stopped = bool(self.boundary.stop)
                if (
                    trained
                    and not stopped
                    and self.options.eval_sets
                    and self.last_eval_batch != self._batch()
                ):
                    self._evaluate()
                if trained or stopped:
                    self._checkpoint()
                if self.checkpoints is not None:
                    self.checkpoints.wait()  # committed before FIT_END and the "stopped" line
                self._emit(Event.FIT_END)
                self._say_end()
                failed = False
                return self._result()
        except KeyboardInterrupt:
            aborted = True  # a second Ctrl-C: no waiting for saves in flight
            raise
        finally:
            if self.checkpoints is not None and not aborted:
                wait_for_saves(self.checkpoints, failed)
                if self._own_manager:
                    self.checkpoints.close()

    def _train(self) -> bool:
        """The epoch loop; True when at least one batch was trained."""
        trained = False
        while not self._done() and not self.boundary.stop:
            ts = self.timestamp
            epoch, start = ts.epoch, ts.batch_in_epoch
            if start == 0:
                self._emit(Event.EPOCH_START)
            seen, epoch_complete = 0, True
            for batch in self.source.epoch_iter(epoch, start):
                seen += 1
                trained = True
                self._train_batch(batch)
                # the step boundary: every decision below follows it
                self._apply(self.boundaries.at(self._batch()))
                ts = self.timestamp
                if bool(ts.batches_per_epoch) and ts.batch_in_epoch >= ts.batches_per_epoch:
                    break  # the last batch of the epoch: _end_epoch saves and stops
                if self.checkpoints is not None and self.checkpoints.should_save(ts):
                    self._checkpoint(scheduled=True)
                if self.boundary.stop or self._done():
                    epoch_complete = False  # the final checkpoint is written in run()
                    break
                self.boundaries.after(self._batch())
            if seen == 0 and start == 0:
                raise ValueError(
                    f"train_data yielded no batch in epoch {epoch}: it is empty, or a one-shot "
                    "iterator that was already used up; pass a re-iterable (a list, a "
                    "DataLoader or functrain.data.Loader)"
                )
            if epoch_complete:
                self._end_epoch()
                if not (self.boundaries.several and self._done()):
                    # an epoch end waits for its decision: an EarlyStopper stops here
                    self._apply(self.boundaries.now(self._batch()))
        return trained

    def _train_batch(self, batch: Any) -> None:
        ctx = self.ctx
        if self.device is not None:
            batch = to_device(batch, self.device, non_blocking=True)
        ctx.batch = batch
        self._emit(Event.BATCH_START)
        try:
            output, metrics = self.adapter.call(self.step, self.state, batch)
        except Exception as error:
            ts = self.timestamp
            raise StepError(
                f"the step failed on batch {ts.batch_in_epoch} of epoch {ts.epoch} (batch "
                f"{ts.batch} of the run), a {describe_batch(batch)}: {type(error).__name__}: "
                f"{error}. Check that loss_fn(model, batch) can consume this batch."
            ) from error
        self.state = self.adapter.after_step(self.state, output, metrics, batch)
        self._estimate_horizon()
        ctx.metrics = metrics
        update_train_metrics(self.options, metrics, batch)
        ts = self.timestamp
        if self.log_every.at_batch_end(ts):
            self._log_train(metrics, ts.batch)
        self._emit(Event.BATCH_END)
        last_of_epoch = bool(ts.batches_per_epoch) and ts.batch_in_epoch >= ts.batches_per_epoch
        if not last_of_epoch and not self.eval_every.by_epoch and self.eval_every.at_batch_end(ts):
            self._evaluate()

    def _log_train(self, metrics: Mapping[str, Any], batch: int) -> None:
        shown = {k: v for k, v in metrics.items() if k not in _NOT_LOGGED}
        for name, metric in self.options.train_metrics.items():
            shown[name] = metric.compute()  # collective under several ranks: all ranks log
            metric.reset()
        self.ctx.log({f"train/{k}": v for k, v in shown.items()}, step=batch)
        self.last_log_batch = self.boundaries.synced_batch = batch

    def _end_epoch(self) -> None:
        before = self.timestamp
        after = before.advance_epoch()
        if not before.batches_per_epoch and before.batch_in_epoch:
            after = after.replace(batches_per_epoch=before.batch_in_epoch)  # learnt from the data
        if not after.max_batches and self.options.duration.unit is TimeUnit.EPOCH:
            bpe = after.batches_per_epoch
            after = after.replace(
                max_batches=max_batches_for(self.options.duration, bpe, after, self.source.data)
            )
        self.state = self.adapter.with_timestamp(self.state, after)
        if self.log_every.at_epoch_end(after) and self.last_log_batch != before.batch:
            # An epoch interval on data of unknown length: the last batch of the epoch was only
            # known once the data ran out, so its metrics are logged here.
            self._log_train(self.ctx.metrics, before.batch)
        self._emit(Event.EPOCH_END)
        if self.eval_every.at_epoch_end(after) or (
            not self.eval_every.by_epoch and self.eval_every.at_batch_end(before)
        ):
            self._evaluate()
        if self.checkpoints is not None and (
            self.checkpoints.should_save(before) or self.checkpoints.should_save(after)
        ):
            self._checkpoint(scheduled=True)

    # -- the agreed step boundary --------------------------------------------------------------

    def _apply(self, boundary: Boundary | None) -> None:
        """Follow a boundary's decision (None: nothing was decided there)."""
        if boundary is None:
            return
        self.boundary = boundary
        if boundary.stop is not StopKind.NONE:
            pending = self.signals.pending
            self.ctx.stop_reason = stop_reason_for(boundary, pending, self.ctx.stop_reason)
        ts = self.timestamp.replace(elapsed_sec=boundary.elapsed_sec)
        self.state = self.adapter.with_timestamp(self.state, ts)

    # -- the state and its horizon -------------------------------------------------------------

    @property
    def timestamp(self) -> Timestamp:
        return self.state.timestamp

    def _set_horizon(self) -> None:
        ts = self.timestamp
        # 0 when the data has no length: then what an earlier epoch of this run learnt, if any
        bpe = data_batches_per_epoch(self.source) or ts.batches_per_epoch
        max_batches = max_batches_for(self.options.duration, bpe, ts, self.source.data)
        horizon = ts.replace(batches_per_epoch=bpe, max_batches=max_batches)
        self.state = self.adapter.with_horizon(self.state, horizon)
        self.boundaries.start_clock(self.timestamp.elapsed_sec)
        for every in (self.eval_every, self.log_every):
            every.start(self.timestamp.elapsed_sec)
        check_fraction_intervals(
            self.options.duration,
            max_batches,
            {"eval_interval": self.eval_every.interval, "log_interval": self.log_every.interval},
        )

    def _estimate_horizon(self) -> None:
        """Samples/tokens durations: fix `max_batches` after the first counted batch."""
        if (ts := estimated_horizon(self.options.duration, self.timestamp)) is not None:
            self.state = self.adapter.with_timestamp(self.state, ts)

    def _done(self) -> bool:
        return run_finished(self.options.duration, self.timestamp)

    def _batch(self) -> int:
        return self.timestamp.batch

    # -- evaluation, checkpoints, resume -----------------------------------------------------

    def _evaluate(self) -> None:
        state = self.adapter.step_state(self.state)
        if self.options.eval_state_fn is not None:
            state = self.options.eval_state_fn(state)
        where = (self.rank, self.world_size, self.device)
        results = evaluate_sets(self.step, state, self.options, where, self._emit, self.ctx)
        self.ctx.log({f"eval/{k}": v for k, v in results.items()}, step=self._batch())
        self.last_eval_batch = self.boundaries.synced_batch = self._batch()

    def _checkpoint(self, scheduled: bool = False) -> None:  # scheduled: only the tiers due
        # The run's last save goes to the root even when this batch's scheduled save went to
        # the local tier only (which the manager's close removes); one the root already holds
        # the manager keeps, returning the same path.
        again = self.last_saved_batch == self._batch()
        if self.checkpoints is None or (again and scheduled):
            return
        self.beat.phase("checkpoint", self._batch())
        self.state = with_loop_extra(self.state, self.names, self.callbacks, self.source)
        metrics = {f"eval/{k}": v for k, v in self.ctx.eval_metrics.items()}  # for keep_best
        path = self.checkpoints.save(self.state, metrics=metrics, scheduled=scheduled)
        self.last_saved_batch = self.boundaries.synced_batch = self._batch()
        if not (again and path == self.ctx.checkpoint_path):
            self.ctx.checkpoint_path = path
            self._emit(Event.CHECKPOINT)

    def _resume(self) -> tuple[str | None, Timestamp] | None:
        """Restore the newest checkpoint; `(path or None for init_from, its timestamp)`."""
        # A donated state is fit's to overwrite: loading into its tensors keeps them the model's
        # own (channels-last strides and all), exactly as in the run that was interrupted.
        found = restore_latest(
            self.checkpoints,
            self.state,
            self.names,
            self.callbacks,
            self.source,
            inplace=self.options.donate,
        )
        if found is None:
            return None
        restored, path = found
        moved = self.source.reposition(restored.timestamp)  # on_data_change's conversion
        self.state = restored = self.adapter.with_timestamp(restored, moved)
        if path is not None:
            self.last_saved_batch = restored.timestamp.batch
            self.ctx.resumed_from = self.ctx.checkpoint_path = path
        return path, restored.timestamp

    # -- what the run says ---------------------------------------------------------------------

    def _say(self, text: str | None) -> None:
        if text and self.progress is not None:
            self.progress.say(text)

    def _announce(self, found: tuple[str | None, Timestamp] | None, previous_horizon: int) -> None:
        """The status lines of the start: resumed, already finished, or a changed length."""
        if found is not None:
            init_from = self.checkpoints.init_from
            self._say(report.resumed(found[0], init_from, self.state))
        if self._done():
            self._say(report.already_finished(self.state, self.options.duration))
        else:
            self._say(report.length_changed(self.state, previous_horizon, self.options.duration))

    def _say_end(self) -> None:
        if self.boundary.stop:
            path = None if self.checkpoints is None else self.ctx.checkpoint_path
            self._say(report.stopped(self.boundary, self.ctx.stop_reason, self.state, path))

    def _result(self) -> FitResult:
        boundary = self.boundary
        return FitResult(
            state=self.state,
            finished=self._done(),
            stop_reason=self.ctx.stop_reason if boundary.stop else None,
            preempted=boundary.preempted,
            signal=boundary.stop.name if boundary.preempted else None,
            checkpoint=self.ctx.checkpoint_path,
            resumed_from=self.ctx.resumed_from,
        )

    def _emit(self, event: Event) -> None:
        self.beat.beat(event, self._batch())
        dispatch(event, self.callbacks, self.ctx)
