"""`fit`: the training driver, and with `functrain.evaluation` the only place with side effects.

`fit` feeds batches to a pure step `(state, batch) -> (state, metrics)` until the run's duration is
reached, emitting the events of `functrain.events` to callbacks and loggers, evaluating and
checkpointing at their intervals. Everything a run is lives in the returned `TrainState` (the data
position is `state.timestamp`'s epoch and batch), so calling `fit` again with a longer duration
continues the run, and `autoresume=True` continues from the newest checkpoint.

Example:
    >>> step = functrain.make_step(model, loss_fn, opt)
    >>> state = functrain.fit(step, state, Loader(train_set, 128), duration="3ep",
    ...                       eval_data=Loader(test_set, 512, shuffle=False, drop_last=False),
    ...                       eval_metrics=["accuracy"], checkpoints=Manager("runs/a"),
    ...                       autoresume=True)
"""

from __future__ import annotations

import math
import os
import time as wallclock
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from .batching import to_device
from .data import DataSource
from .evaluation import describe_batch, dp_info, evaluate, predict, run_eval, state_device
from .events import Context, Event, dispatch, unique_names
from .horizon import Every as _Every
from .horizon import (
    check_fraction_intervals,
    data_batches_per_epoch,
    max_batches_for,
    run_finished,
)
from .horizon import parse_time as _parse_time
from .metrics import resolve_metrics
from .preemption import (
    StopOnSigterm,
    agree_on_stop,
    checkpoint_manager,
    restore_latest,
    wait_for_saves,
    with_loop_extra,
)
from .rng import RngState, seed_for
from .state import TrainState
from .step_protocol import as_step
from .time import TimeLike, TimeUnit

# `evaluate` and `predict` live in functrain.evaluation; re-exported so `from functrain.loop
# import evaluate, predict` keeps working. The duration/interval parsing (`_parse_time`, `_Every`)
# lives in functrain.horizon; its old private names stay importable from here.
__all__ = ["StepError", "evaluate", "fit", "predict"]

# Step metrics that are counts, not measurements: kept out of the "train/" logs.
_NOT_LOGGED = ("samples", "tokens")


class StepError(RuntimeError):
    """The step failed on a batch; names the batch's position and structure. See `__cause__`."""


# ------------------------------------------------------------------------------------------------
# fit


def fit(
    step: Callable[[TrainState, Any], tuple[TrainState, dict]],
    state: TrainState,
    train_data: Any,
    *,
    duration: TimeLike,
    eval_data: Any = None,
    eval_interval: TimeLike | None = "1ep",
    eval_fn: Callable | None = None,
    eval_metrics: Any = None,
    eval_state_fn: Callable[[TrainState], TrainState] | None = None,
    callbacks: Iterable[Any] = (),
    loggers: Iterable[Any] = (),
    checkpoints: Any = None,
    autoresume: bool = False,
    log_interval: TimeLike | None = "10ba",
    donate: bool = True,
    run_dir: str | os.PathLike | None = None,
    seed: int | None = None,
) -> TrainState:
    """Train `state` with `step` on `train_data` until `duration`, and return the final state.

    Args:
        step: `(state, batch) -> (state, metrics)`, e.g. from `functrain.make_step`; gradient
            accumulation and precision are the step's options.
        state: the `TrainState` to start from. With `donate=True` it is consumed: its tensors are
            updated in place, so use only the returned state afterwards.
        train_data: a `functrain.data.Loader` (resumes mid-epoch in O(1)), an iterable with
            `state_dict`/`load_state_dict` (resumes through them), or any re-iterable of batches
            such as a `DataLoader` (resumes by replaying the epoch's earlier batches).
        duration: the run's TOTAL length, counted from step 0 ("3ep", "500ba", "1e6tok",
            "50000sp", "2h"); a state that already reached it returns at once, so calling `fit`
            again with a longer duration continues the run.
        eval_data: an iterable of evaluation batches, or `{name: iterable}` for several sets.
        eval_interval: how often to evaluate ("1ep", "500ba", "0.25dur", "10m"); None: only
            at the end. An evaluation also runs at the end unless the last batch had one.
        eval_fn: `(model, batch) -> (outputs, targets)` for the metrics (see `evaluate`).
        eval_metrics: metrics for evaluation: names ("accuracy", "cross_entropy",
            "perplexity"), `functrain.metrics` objects, torchmetrics metrics, or a dict of them.
            The eval loss (`step.loss_fn` on the eval batches) is always reported.
        eval_state_fn: `state -> state` evaluated in place of the training state, e.g.
            `functrain.algorithms.swap_in_ema` to evaluate the EMA weights (as Composer does).
        callbacks: objects with a method per event they handle (see `functrain.events`).
        loggers: callbacks that also have `log_metrics(metrics, step)`.
        checkpoints: a `functrain.checkpoint.Manager`, or a directory for one that saves every
            epoch (closed when fit returns); saved when `should_save(timestamp)` says so, and at
            the end.
        autoresume: restore the newest committed checkpoint of `checkpoints` before training.
        log_interval: how often the step's metrics go to the loggers ("10ba"); None: never.
        donate: let the step update the state in place (JAX's donation): fast, and `state`
            must not be used after the call.
        run_dir: the run's directory, given to callbacks as `ctx.run_dir`.
        seed: if set, seeds torch's global generator at the start (from `seed` and the state's
            step) for code outside functrain that draws from it; functrain's own randomness
            always derives from `state.rng`.
    Returns:
        the trained `TrainState`.
    Raises:
        ValueError: a bad duration/interval string, empty data, or data that changed under a
            mid-epoch resume. `StepError`: the step failed on a batch (its position and shape
            are named). `functrain.events.CallbackError`: a callback raised. In every case any
            in-flight checkpoint save finishes first, so checkpoints on disk stay intact.
    """
    run = _FitRun(
        step,
        state,
        train_data,
        duration=duration,
        eval_data=eval_data,
        eval_interval=eval_interval,
        eval_fn=eval_fn,
        eval_metrics=eval_metrics,
        eval_state_fn=eval_state_fn,
        callbacks=callbacks,
        loggers=loggers,
        checkpoints=checkpoints,
        autoresume=autoresume,
        log_interval=log_interval,
        donate=donate,
        run_dir=run_dir,
        seed=seed,
    )
    return run.run()


class _FitRun:
    """One call of `fit`: its configuration, position and event context."""

    def __init__(self, step, state, train_data, **options):
        step = as_step(step)
        if not isinstance(state, TrainState):
            raise TypeError(
                f"fit needs a TrainState (functrain.init(model, optimizer)), got "
                f"{type(state).__name__}"
            )
        self.duration = _parse_time(options["duration"], "duration")
        if self.duration.unit is TimeUnit.DURATION:
            raise ValueError(
                f"fit(duration={options['duration']!r}): the duration cannot be a fraction of "
                "itself; use epochs, batches, samples, tokens or wall-clock time ('3ep', '500ba')"
            )
        self.eval_every = _Every(_parse_time(options["eval_interval"], "eval_interval", True))
        self.log_every = _Every(_parse_time(options["log_interval"], "log_interval", True))
        if options["donate"]:
            step = step.donated()
        self.step = step
        self.state = state
        self.source = DataSource(train_data, placement=dp_info(state))  # the state's dp slice
        self.eval_sets = _eval_sets(options["eval_data"])
        self.eval_fn = options["eval_fn"]
        self.eval_metrics = resolve_metrics(options["eval_metrics"])
        self.eval_state_fn = options["eval_state_fn"]
        self.callbacks = list(options["callbacks"]) + list(options["loggers"])
        for logger in options["loggers"]:
            if not callable(getattr(logger, "log_metrics", None)):
                raise TypeError(
                    f"logger {type(logger).__name__} has no log_metrics(metrics, step) method; "
                    "pass plain observers as callbacks="
                )
        self.names = unique_names(self.callbacks)
        self.checkpoints = checkpoint_manager(options["checkpoints"])
        # a Manager made here from a directory is closed here; one passed in stays open
        self._own_manager = isinstance(options["checkpoints"], (str, os.PathLike))
        self.autoresume = options["autoresume"]
        if self.autoresume and self.checkpoints is None:
            raise ValueError("fit(autoresume=True) needs checkpoints=Manager(root) to resume from")
        self.seed = options["seed"]
        self.rank, self.world_size = dp_info(state)
        self.device = state_device(state)
        self.ctx = Context(
            rank=self.rank,
            world_size=self.world_size,
            run_dir=None if options["run_dir"] is None else os.fspath(options["run_dir"]),
            loggers=[cb for cb in self.callbacks if callable(getattr(cb, "log_metrics", None))],
            duration=self.duration,
        )
        self.ctx.log_interval = self.log_every.interval
        self.last_saved_batch = -1
        self.last_eval_batch = -1
        self.last_log_batch = -1

    # -- the run -----------------------------------------------------------------------------

    def run(self) -> TrainState:
        ctx = self.ctx
        failed = True
        try:
            with StopOnSigterm(ctx):  # SIGTERM: finish the step, checkpoint, return
                ctx.state = self.state
                self._emit(Event.INIT)
                if self.autoresume:
                    self._resume()
                self._set_horizon()
                if self.seed is not None:
                    torch.manual_seed(
                        seed_for(RngState(self.seed), self.state.step, "fit", self.rank)
                    )
                self._emit(Event.FIT_START)
                trained = self._train()
                stopped = ctx.stop_requested
                if (
                    trained
                    and not stopped
                    and self.eval_sets
                    and self.last_eval_batch != self._batch()
                ):
                    self._evaluate()
                if trained or ctx.stop_requested:
                    self._checkpoint(final=True)
                self._emit(Event.FIT_END)
                failed = False
                return self.state
        finally:
            if self.checkpoints is not None:
                wait_for_saves(self.checkpoints, failed)
                if self._own_manager:
                    self.checkpoints.close()

    def _train(self) -> bool:
        """The epoch loop; True when at least one batch was trained."""
        ctx, trained = self.ctx, False
        bpe = self.state.timestamp.batches_per_epoch
        agree_on_stop(ctx)
        while not self._done() and not ctx.stop_requested:
            ts = self.state.timestamp
            epoch, start = ts.epoch, ts.batch_in_epoch
            if start == 0:
                self._emit(Event.EPOCH_START)
            seen = 0
            epoch_complete = True
            for batch in self.source.epoch_iter(epoch, start):
                seen += 1
                trained = True
                self._train_batch(batch)
                agree_on_stop(ctx)
                ts = self.state.timestamp
                last_of_epoch = bool(bpe) and ts.batch_in_epoch >= bpe
                if not last_of_epoch:
                    if self.checkpoints is not None and self.checkpoints.should_save(ts):
                        self._checkpoint()
                    if ctx.stop_requested or self._done():
                        epoch_complete = False  # the final checkpoint is written in run()
                        break
                else:
                    break
            if seen == 0 and start == 0:
                raise ValueError(
                    f"train_data yielded no batch in epoch {epoch}: it is empty, or a one-shot "
                    "iterator that was already used up; pass a re-iterable (a list, a "
                    "DataLoader or functrain.data.Loader)"
                )
            if epoch_complete:
                self._end_epoch()
                agree_on_stop(ctx)
        return trained

    def _train_batch(self, batch: Any) -> None:
        ctx = self.ctx
        if self.device is not None:
            batch = to_device(batch, self.device, non_blocking=True)
        ctx.batch = batch
        self._emit(Event.BATCH_START)
        state = self.state
        try:
            state, metrics = self.step(state, batch)
        except Exception as error:
            ts = self.state.timestamp
            raise StepError(
                f"the step failed on batch {ts.batch_in_epoch} of epoch {ts.epoch} (batch "
                f"{ts.batch} of the run), a {describe_batch(batch)}: {type(error).__name__}: "
                f"{error}. Check that loss_fn(model, batch) can consume this batch."
            ) from error
        elapsed = self._elapsed0 + (wallclock.monotonic() - self._t0)
        self.state = state.replace(timestamp=state.timestamp.replace(elapsed_sec=elapsed))
        self._estimate_horizon()
        ctx.state, ctx.metrics = self.state, metrics
        ts = self.state.timestamp
        if self.log_every.at_batch_end(ts):
            self._log_train(metrics, ts.batch)
        self._emit(Event.BATCH_END)
        bpe = ts.batches_per_epoch
        last_of_epoch = bool(bpe) and ts.batch_in_epoch >= bpe
        if not last_of_epoch and not self.eval_every.by_epoch and self.eval_every.at_batch_end(ts):
            self._evaluate()

    def _log_train(self, metrics: dict[str, Any], batch: int) -> None:
        shown = {k: v for k, v in metrics.items() if k not in _NOT_LOGGED}
        self.ctx.log({f"train/{k}": v for k, v in shown.items()}, step=batch)
        self.last_log_batch = batch

    def _end_epoch(self) -> None:
        before = self.state.timestamp
        after = before.advance_epoch()
        if not before.batches_per_epoch and before.batch_in_epoch:
            after = after.replace(batches_per_epoch=before.batch_in_epoch)  # learnt from the data
        if not after.max_batches and self.duration.unit is TimeUnit.EPOCH:
            bpe = after.batches_per_epoch
            self.max_batches = max_batches_for(self.duration, bpe, after, self.source.data)
            after = after.replace(max_batches=self.max_batches)
        self.state = self.state.replace(timestamp=after)
        self.ctx.state = self.state
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

    # -- horizon -----------------------------------------------------------------------------

    def _set_horizon(self) -> None:
        ts = self.state.timestamp
        # 0 when the data has no length: then what an earlier epoch of this run learnt, if any
        bpe = data_batches_per_epoch(self.source) or ts.batches_per_epoch
        self.max_batches = max_batches_for(self.duration, bpe, ts, self.source.data)
        self.state = self.state.replace(
            timestamp=ts.replace(batches_per_epoch=bpe, max_batches=self.max_batches)
        )
        self.ctx.state = self.state
        self._elapsed0, self._t0 = self.state.timestamp.elapsed_sec, wallclock.monotonic()
        check_fraction_intervals(
            self.duration,
            self.max_batches,
            {"eval_interval": self.eval_every.interval, "log_interval": self.log_every.interval},
        )

    def _estimate_horizon(self) -> None:
        """Samples/tokens durations: fix `max_batches` after the first counted batch."""
        ts = self.state.timestamp
        if ts.max_batches or self.duration.unit not in (TimeUnit.SAMPLE, TimeUnit.TOKEN):
            return
        try:
            estimate = int(math.ceil(ts.to_batches(self.duration) - 1e-9))
        except ValueError:
            return
        self.max_batches = estimate
        self.state = self.state.replace(timestamp=ts.replace(max_batches=estimate))

    def _done(self) -> bool:
        return run_finished(self.duration, self.state.timestamp)

    def _batch(self) -> int:
        return self.state.timestamp.batch

    # -- evaluation, checkpoints, resume -----------------------------------------------------

    def _evaluate(self) -> None:
        ctx = self.ctx
        results: dict[str, float] = {}
        state = self.state if self.eval_state_fn is None else self.eval_state_fn(self.state)
        for name, data in self.eval_sets.items():
            values = run_eval(
                self.step,
                state,
                data,
                metrics=self.eval_metrics,
                eval_fn=self.eval_fn,
                emit=self._emit,
                ctx=ctx,
                device=self.device,
            )
            results.update({(k if name is None else f"{name}/{k}"): v for k, v in values.items()})
            ctx.eval_metrics = dict(results)
        ctx.log({f"eval/{k}": v for k, v in results.items()}, step=self._batch())
        self.last_eval_batch = self._batch()

    def _checkpoint(self, final: bool = False) -> None:
        if self.checkpoints is None or self.last_saved_batch == self._batch():
            return
        self.state = with_loop_extra(self.state, self.names, self.callbacks, self.source)
        path = self.checkpoints.save(self.state)
        self.last_saved_batch = self._batch()
        self.ctx.state = self.state
        self.ctx.checkpoint_path = path
        self._emit(Event.CHECKPOINT)

    def _resume(self) -> None:
        restored = restore_latest(
            self.checkpoints, self.state, self.names, self.callbacks, self.source
        )
        if restored is None:
            return
        self.state = restored
        self.last_saved_batch = restored.timestamp.batch
        latest = getattr(self.checkpoints, "latest", None)
        self.ctx.resumed_from = latest() if callable(latest) else True
        self.ctx.state = self.state

    def _emit(self, event: Event) -> None:
        dispatch(event, self.callbacks, self.ctx)


def _eval_sets(eval_data: Any) -> dict[str | None, Any]:
    if eval_data is None:
        return {}
    if isinstance(eval_data, Mapping):
        return {str(k): v for k, v in eval_data.items()}
    return {None: eval_data}
