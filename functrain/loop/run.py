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

import math
import os
import time as wallclock
from collections.abc import Mapping
from typing import Any

import torch

from ..data import DataSource, place
from ..loggers import JSONLLogger, ProgressBar
from ..rng import RngState, seed_for
from ..state import TrainState
from ..step.batching import to_device
from ..step.protocol import as_step
from ..units import Timestamp, TimeUnit
from . import report
from .agreement import Agreement, several_ranks
from .evaluation import describe_batch, dp_info, run_eval, state_device
from .events import Context, Event, dispatch, unique_names
from .fit_state import FitState, advance, share_horizon
from .horizon import (
    Every,
    check_fraction_intervals,
    data_batches_per_epoch,
    max_batches_for,
    run_finished,
)
from .options import FitOptions, FitResult
from .preemption import (
    Boundary,
    StopKind,
    StopSignals,
    agree,
    checkpoint_manager,
    restore_latest,
    stop_reason_for,
    wait_for_saves,
    with_loop_extra,
)

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
        self.multi = not isinstance(state, TrainState)
        if self.multi and not isinstance(state, FitState):
            state = FitState(states=state)
        self.state = state  # the one copy of the run's state; ctx.state reads it
        self.source = DataSource(train_data, placement=dp_info(state))  # the state's dp slice
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
        self.rank, self.world_size = dp_info(state)
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
        self.agreement: Agreement | None = None  # on several ranks, made when training starts
        self._synced_batch = -1  # the batch of the latest log, evaluation or checkpoint
        self.last_saved_batch = self.last_eval_batch = self.last_log_batch = -1
        self._elapsed0, self._t0 = state.timestamp.elapsed_sec, wallclock.monotonic()

    # -- the run -----------------------------------------------------------------------------

    def run(self) -> FitResult:
        failed, aborted = True, False
        try:
            with self.signals:  # SIGTERM, Ctrl-C: finish the step, checkpoint, return
                self._emit(Event.INIT)
                self._check_eval_sets()
                self.state = self._init_state(self.state)
                found = self._resume() if self.options.autoresume else None
                previous_horizon = self.timestamp.max_batches
                self._set_horizon()
                self._announce(found, previous_horizon)
                if self.options.seed is not None:
                    seed = seed_for(RngState(self.options.seed), self.state.step, "fit", self.rank)
                    torch.manual_seed(seed)
                self._emit(Event.FIT_START)
                if several_ranks():
                    self.agreement = Agreement(self._batch())
                    self._start_agreement()  # read at the first boundary
                else:
                    self._agree_now()
                trained = self._train()
                if self.agreement is not None:
                    self.agreement.drop()  # superseded: the run's end needs no decision
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
                self._boundary()  # the step boundary: every decision below follows it
                ts = self.timestamp
                if bool(ts.batches_per_epoch) and ts.batch_in_epoch >= ts.batches_per_epoch:
                    break  # the last batch of the epoch: _end_epoch saves and stops
                if self.checkpoints is not None and self.checkpoints.should_save(ts):
                    self._checkpoint()
                if self.boundary.stop or self._done():
                    epoch_complete = False  # the final checkpoint is written in run()
                    break
                self._start_agreement()
            if seen == 0 and start == 0:
                raise ValueError(
                    f"train_data yielded no batch in epoch {epoch}: it is empty, or a one-shot "
                    "iterator that was already used up; pass a re-iterable (a list, a "
                    "DataLoader or functrain.data.Loader)"
                )
            if epoch_complete:
                self._end_epoch()
                if self.agreement is None or not self._done():
                    # an epoch end waits for its decision: an EarlyStopper stops here
                    self._agree_now()
        return trained

    def _train_batch(self, batch: Any) -> None:
        ctx = self.ctx
        if self.device is not None:
            batch = to_device(batch, self.device, non_blocking=True)
        ctx.batch = batch
        self._emit(Event.BATCH_START)
        try:
            state, metrics = self._call_step(batch)
        except Exception as error:
            ts = self.timestamp
            raise StepError(
                f"the step failed on batch {ts.batch_in_epoch} of epoch {ts.epoch} (batch "
                f"{ts.batch} of the run), a {describe_batch(batch)}: {type(error).__name__}: "
                f"{error}. Check that loss_fn(model, batch) can consume this batch."
            ) from error
        self._check_step_output(state, metrics)
        self.state = state
        self._estimate_horizon()
        ctx.metrics = metrics
        self._update_train_metrics(metrics, batch)
        ts = self.timestamp
        if self.log_every.at_batch_end(ts):
            self._log_train(metrics, ts.batch)
        self._emit(Event.BATCH_END)
        last_of_epoch = bool(ts.batches_per_epoch) and ts.batch_in_epoch >= ts.batches_per_epoch
        if not last_of_epoch and not self.eval_every.by_epoch and self.eval_every.at_batch_end(ts):
            self._evaluate()

    def _call_step(self, batch: Any) -> tuple[Any, dict]:
        if not self.multi:
            return self.step(self.state, batch)
        # A step over a pytree of states: the loop advances its own position.
        states, metrics = self.step(self.state.states, batch)
        if not isinstance(metrics, Mapping):
            return states, metrics  # refused by _check_step_output
        return advance(self.state, states, metrics, batch, self.world_size), metrics

    def _check_step_output(self, state: Any, metrics: Any) -> None:
        if not isinstance(metrics, Mapping):
            raise TypeError(
                f"the step returned {type(metrics).__name__} as its metrics; a step returns "
                "(state, metrics) with metrics a dict such as {'loss': loss}"
            )
        if not self.multi and not isinstance(state, TrainState):
            raise TypeError(
                f"the step returned a {type(state).__name__} for a TrainState; a step returns "
                "(new_state, metrics). For a step over several states pass them as a pytree "
                "({'g': ..., 'd': ...}) to fit"
            )

    def _log_train(self, metrics: Mapping[str, Any], batch: int) -> None:
        shown = {k: v for k, v in metrics.items() if k not in _NOT_LOGGED}
        for name, metric in self.options.train_metrics.items():
            shown[name] = metric.compute()  # collective under several ranks: all ranks log
            metric.reset()
        self.ctx.log({f"train/{k}": v for k, v in shown.items()}, step=batch)
        self.last_log_batch = self._synced_batch = batch

    def _update_train_metrics(self, metrics: Mapping[str, Any], batch: Any) -> None:
        if not self.options.train_metrics:
            return
        outputs = metrics.get("outputs")
        if outputs is None:
            raise ValueError(
                "fit(train_metrics=...) computes the metrics from the step's outputs, but the "
                f"step's metrics have none (keys: {sorted(metrics)}); return them from loss_fn: "
                "`return loss, {'outputs': logits}` (and 'targets' when the batch's "
                "target_key does not hold them)"
            )
        targets = metrics.get("targets")
        if targets is None:
            targets = _batch_item(batch, self.options.target_key)
        for metric in self.options.train_metrics.values():
            metric.update(outputs, targets)

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
        self._set_timestamp(after)
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
            self._checkpoint()

    # -- the agreed step boundary --------------------------------------------------------------

    def _clock(self) -> float:
        """This rank's own clock of the run (the agreed one is `timestamp.elapsed_sec`)."""
        return self._elapsed0 + (wallclock.monotonic() - self._t0)

    def _pending(self) -> StopKind:
        """What this rank would stop for: its signal, or a callback's `request_stop`."""
        requested = StopKind.CALLBACK if self.ctx.stop_reason is not None else StopKind.NONE
        return max(self.signals.pending, requested)

    def _boundary(self) -> None:
        """A step boundary: one process decides now; several ranks read the agreement started
        at an earlier boundary, if one is in flight (else nothing changes here)."""
        if self.agreement is None:
            self._agree_now()
        elif self.agreement.in_flight:
            self._apply(self.agreement.finish())

    def _start_agreement(self) -> None:
        """On several ranks, start an agreement when the cadence says so, or after a log, an
        evaluation or a checkpoint at this boundary (which read the device anyway)."""
        agreement, batch = self.agreement, self._batch()
        if agreement is None or agreement.in_flight:
            return
        if agreement.due(batch) or self._synced_batch == batch:
            agreement.start(batch, self._pending(), self._clock())

    def _agree_now(self) -> None:
        """Take this boundary's decision with every rank now (stop or not, the run's clock)."""
        if self.agreement is None:
            self._apply(agree(self._pending(), None, self._clock()))
            return
        self.agreement.drop()
        self.agreement.start(self._batch(), self._pending(), self._clock())
        self._apply(self.agreement.finish())

    def _apply(self, boundary: Boundary) -> None:
        self.boundary = boundary
        if boundary.stop is not StopKind.NONE:
            pending = self.signals.pending
            self.ctx.stop_reason = stop_reason_for(boundary, pending, self.ctx.stop_reason)
        self._set_timestamp(self.timestamp.replace(elapsed_sec=boundary.elapsed_sec))

    # -- the state and its horizon -------------------------------------------------------------

    @property
    def timestamp(self) -> Timestamp:
        return self.state.timestamp

    def _set_timestamp(self, ts: Timestamp) -> None:
        before = self.state.timestamp
        self.state = self.state.replace(timestamp=ts)
        horizon = (ts.batches_per_epoch, ts.max_batches)
        if self.multi and horizon != (before.batches_per_epoch, before.max_batches):
            self.state = share_horizon(self.state)

    def _init_state(self, state: Any) -> Any:
        """What the step keeps in the state, added before a restore target is built."""
        if self.multi:
            return state.replace(states=self.step.init_state(state.states))
        return self.step.init_state(state)

    def _step_state(self) -> Any:
        """The state the step takes: the TrainState, or the pytree of a FitState."""
        return self.state.states if self.multi else self.state

    def _set_horizon(self) -> None:
        ts = self.timestamp
        # 0 when the data has no length: then what an earlier epoch of this run learnt, if any
        bpe = data_batches_per_epoch(self.source) or ts.batches_per_epoch
        max_batches = max_batches_for(self.options.duration, bpe, ts, self.source.data)
        self._set_timestamp(ts.replace(batches_per_epoch=bpe, max_batches=max_batches))
        if self.multi:
            self.state = share_horizon(self.state)
        self._elapsed0, self._t0 = self.timestamp.elapsed_sec, wallclock.monotonic()
        for every in (self.eval_every, self.log_every):
            every.start(self._elapsed0)
        check_fraction_intervals(
            self.options.duration,
            max_batches,
            {"eval_interval": self.eval_every.interval, "log_interval": self.log_every.interval},
        )

    def _estimate_horizon(self) -> None:
        """Samples/tokens durations: fix `max_batches` after the first counted batch."""
        ts = self.timestamp
        if ts.max_batches or self.options.duration.unit not in (TimeUnit.SAMPLE, TimeUnit.TOKEN):
            return
        try:
            estimate = int(math.ceil(ts.to_batches(self.options.duration) - 1e-9))
        except ValueError:
            return
        self._set_timestamp(ts.replace(max_batches=estimate))

    def _done(self) -> bool:
        return run_finished(self.options.duration, self.timestamp)

    def _batch(self) -> int:
        return self.timestamp.batch

    # -- evaluation, checkpoints, resume -----------------------------------------------------

    def _check_eval_sets(self) -> None:
        """An evaluation set with a length of 0 on every rank fails now, not after training."""
        for name, data in self.options.eval_sets.items():
            try:
                count = len(place(data, self.rank, self.world_size))  # this rank's part
            except TypeError:
                continue  # unsized: checked when evaluated
            _no_eval_batches(name, _sum_over_ranks(count))

    def _evaluate(self) -> None:
        ctx = self.ctx
        results: dict[str, float] = {}
        state = self._step_state()
        if self.options.eval_state_fn is not None:
            state = self.options.eval_state_fn(state)
        for name, data in self.options.eval_sets.items():
            counted = _Counted(place(data, self.rank, self.world_size))  # this rank's part
            values = run_eval(
                self.step,
                state,
                counted,
                metrics=self.options.eval_metrics,
                eval_fn=self.options.eval_fn,
                emit=self._emit,
                ctx=ctx,
                device=self.device,
                input_key=self.options.input_key,
                target_key=self.options.target_key,
            )
            _no_eval_batches(name, _sum_over_ranks(counted.count))
            results.update({(k if name is None else f"{name}/{k}"): v for k, v in values.items()})
            ctx.eval_metrics = dict(results)
        ctx.log({f"eval/{k}": v for k, v in results.items()}, step=self._batch())
        self.last_eval_batch = self._synced_batch = self._batch()

    def _checkpoint(self) -> None:
        if self.checkpoints is None or self.last_saved_batch == self._batch():
            return
        self.state = with_loop_extra(self.state, self.names, self.callbacks, self.source)
        path = self.checkpoints.save(self.state)
        self.last_saved_batch = self._synced_batch = self._batch()
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
        self.state = restored
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
        dispatch(event, self.callbacks, self.ctx)


class _Counted:
    """An iterable that counts the batches it yields (to refuse an evaluation of none)."""

    def __init__(self, data: Any):
        self.data, self.count = data, 0

    def __iter__(self):
        for batch in self.data:
            self.count += 1
            yield batch


def _sum_over_ranks(count: int) -> int:
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return count
    total = torch.tensor([count], dtype=torch.int64)
    if dist.get_backend() == "nccl":
        total = total.cuda()
    dist.all_reduce(total)
    return int(total.item())


def _no_eval_batches(name: str | None, total: int) -> None:
    if total == 0:
        which = "eval_data" if name is None else f"eval_data[{name!r}]"
        raise ValueError(
            f"{which} yields no batch (on any rank), so its metrics would be NaN: check the "
            "evaluation set's length, and that a Loader used for it has drop_last=False when "
            "the set is smaller than one batch"
        )


def _batch_item(batch: Any, key: Any) -> Any:
    try:
        return batch[key]
    except (KeyError, IndexError, TypeError) as error:
        raise ValueError(
            f"cannot take the targets from a batch that is a {describe_batch(batch)} with key "
            f"{key!r} ({type(error).__name__}: {error}); pass fit(target_key=...), or return "
            "them from loss_fn under 'targets'"
        ) from None
