"""`fit`, `evaluate` and `predict`: the driver, and the only place in functrain with side effects.

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

import inspect
import math
import os
import signal
import threading
import time as wallclock
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from .batching import to_device
from .data import DataSource, Loader
from .events import Context, Event, decode_state, dispatch, encode_state, unique_names
from .metrics import Mean, resolve_metrics
from .rng import RngState, seed_for
from .state import TrainState
from .time import Time, TimeLike, Timestamp, TimeUnit

__all__ = ["StepError", "evaluate", "fit", "predict"]

# Step metrics that are counts, not measurements: kept out of the "train/" logs.
_NOT_LOGGED = ("samples", "tokens")
# Where fit keeps its own entries in `state.extra` (JSON strings, see events.encode_state).
CALLBACKS_KEY = "callbacks"
DATA_KEY = "data"


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


def _parse_time(value: Any, what: str, allow_none: bool = False) -> Time | None:
    if value is None and allow_none:
        return None
    try:
        parsed = Time.coerce(value)
    except (TypeError, ValueError) as error:
        raise ValueError(f"fit({what}={value!r}): {error}") from None
    if parsed.value <= 0:
        raise ValueError(f"fit({what}={value!r}): must be positive")
    return parsed


class _Every:
    """Whether an interval falls on a batch end or an epoch end."""

    def __init__(self, interval: Time | None):
        self.interval = interval
        self._last_clock = wallclock.monotonic()

    @property
    def by_epoch(self) -> bool:
        interval = self.interval
        return (
            interval is not None
            and interval.unit is TimeUnit.EPOCH
            and float(interval.value).is_integer()
        )

    def at_batch_end(self, ts: Timestamp) -> bool:
        interval = self.interval
        if interval is None:
            return False
        if self.by_epoch:  # the batch that completes a due epoch
            bpe = ts.batches_per_epoch
            return (
                bool(bpe) and ts.batch_in_epoch == bpe and (ts.epoch + 1) % int(interval.value) == 0
            )
        if interval.unit is TimeUnit.SECOND:
            now = wallclock.monotonic()
            if now - self._last_clock >= interval.value:
                self._last_clock = now
                return True
            return False
        try:
            every = max(1, round(ts.to_batches(interval)))
        except ValueError:  # samples/tokens before any was counted
            return False
        return ts.batch % every == 0

    def at_epoch_end(self, ts: Timestamp) -> bool:
        return self.by_epoch and ts.epoch % int(self.interval.value) == 0


class _FitRun:
    """One call of `fit`: its configuration, position and event context."""

    def __init__(self, step, state, train_data, **options):
        if not callable(step):
            raise TypeError(
                "fit's first argument must be a step (state, batch) -> (state, metrics), e.g. "
                f"functrain.make_step(model, loss_fn, optimizer); got {type(step).__name__}"
            )
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
        if options["donate"] and hasattr(step, "with_options"):
            config = getattr(step, "config", None)
            if not getattr(config, "donate", False):
                step = step.with_options(donate=True)
        self.step = step
        self.state = state
        self.source = DataSource(train_data)
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
        self.checkpoints = _manager(options["checkpoints"])
        # a Manager made here from a directory is closed here; one passed in stays open
        self._own_manager = isinstance(options["checkpoints"], (str, os.PathLike))
        self.autoresume = options["autoresume"]
        if self.autoresume and self.checkpoints is None:
            raise ValueError("fit(autoresume=True) needs checkpoints=Manager(root) to resume from")
        self.seed = options["seed"]
        self.rank, self.world_size = _dp_info()
        self.device = _state_device(state)
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
        self._old_sigterm = None

    # -- the run -----------------------------------------------------------------------------

    def run(self) -> TrainState:
        ctx = self.ctx
        self._install_sigterm()
        failed = True
        try:
            ctx.state = self.state
            self._emit(Event.INIT)
            if self.autoresume:
                self._resume()
            self._set_horizon()
            if self.seed is not None:
                torch.manual_seed(seed_for(RngState(self.seed), self.state.step, "fit", self.rank))
            self._emit(Event.FIT_START)
            trained = self._train()
            stopped = ctx.stop_requested
            if trained and not stopped and self.eval_sets and self.last_eval_batch != self._batch():
                self._evaluate()
            if trained or ctx.stop_requested:
                self._checkpoint(final=True)
            self._emit(Event.FIT_END)
            failed = False
            return self.state
        finally:
            self._restore_sigterm()
            if self.checkpoints is not None:
                self._wait_for_saves(failed)
                if self._own_manager:
                    self.checkpoints.close()

    def _train(self) -> bool:
        """The epoch loop; True when at least one batch was trained."""
        ctx, trained = self.ctx, False
        bpe = self.state.timestamp.batches_per_epoch
        self._agree_on_stop()
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
                self._agree_on_stop()
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
                self._agree_on_stop()
        return trained

    def _agree_on_stop(self) -> None:
        """Stop on every rank when any rank was asked to (a callback, or SIGTERM arriving a step
        apart): ranks that disagree would wait on each other's collectives forever."""
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return
        flag = torch.tensor([1 if self.ctx.stop_requested else 0], dtype=torch.int32)
        if dist.get_backend() == "nccl":  # a CPU tensor goes through gloo when it is configured
            flag = flag.cuda()
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if int(flag.item()) and not self.ctx.stop_requested:
            self.ctx.request_stop("stop requested on another rank")

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
            shown = {k: v for k, v in metrics.items() if k not in _NOT_LOGGED}
            ctx.log({f"train/{k}": v for k, v in shown.items()}, step=ts.batch)
        self._emit(Event.BATCH_END)
        bpe = ts.batches_per_epoch
        last_of_epoch = bool(bpe) and ts.batch_in_epoch >= bpe
        if not last_of_epoch and not self.eval_every.by_epoch and self.eval_every.at_batch_end(ts):
            self._evaluate()

    def _end_epoch(self) -> None:
        before = self.state.timestamp
        after = before.advance_epoch()
        if not before.batches_per_epoch and before.batch_in_epoch:
            after = after.replace(batches_per_epoch=before.batch_in_epoch)  # learnt from the data
        if not after.max_batches and self.duration.unit is TimeUnit.EPOCH:
            self.max_batches = self._max_batches(after.batches_per_epoch, after)
            after = after.replace(max_batches=self.max_batches)
        self.state = self.state.replace(timestamp=after)
        self.ctx.state = self.state
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
        data = self.source.data
        if isinstance(data, Loader):
            bpe = data.num_batches
            if data.world_size > 1 and not data.drop_last:
                last = data.num_samples % data.batch_size
                if last % data.world_size:
                    raise ValueError(
                        f"training on {data.world_size} ranks with drop_last=False: the last "
                        f"batch of {last} samples cannot be split evenly over the ranks; use "
                        "Loader(..., drop_last=True) for training"
                    )
        else:
            bpe = self.source.batches_per_epoch()
        if bpe == 0 and _has_len(data):
            raise ValueError(
                "train_data is empty (0 batches per epoch): check the dataset's length, and "
                "that batch_size is not larger than the dataset with drop_last=True"
            )
        ts = self.state.timestamp
        if not bpe:
            bpe = ts.batches_per_epoch  # learnt in an earlier epoch of this run
        self.max_batches = self._max_batches(bpe, ts)
        self.state = self.state.replace(
            timestamp=ts.replace(batches_per_epoch=bpe, max_batches=self.max_batches)
        )
        self.ctx.state = self.state
        self._elapsed0, self._t0 = self.state.timestamp.elapsed_sec, wallclock.monotonic()
        for what, every in (("eval_interval", self.eval_every), ("log_interval", self.log_every)):
            unit = every.interval.unit if every.interval is not None else None
            if (
                unit is TimeUnit.DURATION
                and not self.max_batches
                and self.duration.unit
                not in (
                    TimeUnit.SAMPLE,
                    TimeUnit.TOKEN,
                )
            ):
                raise ValueError(
                    f"fit({what}={str(every.interval)!r}): a fraction of the run needs a known "
                    f"run length, but duration={str(self.duration)!r} gives none for this data; "
                    "use batches or epochs"
                )

    def _max_batches(self, bpe: int, ts: Timestamp) -> int:
        duration = self.duration
        if duration.unit is TimeUnit.BATCH:
            return int(math.ceil(duration.value))
        if duration.unit is TimeUnit.EPOCH:
            if bpe:
                return int(math.ceil(duration.value * bpe - 1e-9))
            if not float(duration.value).is_integer():
                raise ValueError(
                    f"fit(duration={duration}): a fractional number of epochs needs data with a "
                    "length; use batches instead"
                )
            return 0
        if duration.unit is TimeUnit.SAMPLE and isinstance(self.source.data, Loader):
            return int(math.ceil(duration.value / self.source.data.batch_size))
        if duration.unit in (TimeUnit.SAMPLE, TimeUnit.TOKEN) and ts.batch:
            return int(math.ceil(ts.to_batches(duration) - 1e-9))
        return 0  # tokens before the first batch, wall-clock time: estimated or unknown

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
        ts, duration = self.state.timestamp, self.duration
        if duration.unit in (TimeUnit.BATCH, TimeUnit.EPOCH) and ts.max_batches:
            return ts.batch >= ts.max_batches
        return ts.reached(duration)

    def _batch(self) -> int:
        return self.state.timestamp.batch

    # -- evaluation, checkpoints, resume -----------------------------------------------------

    def _evaluate(self) -> None:
        ctx = self.ctx
        results: dict[str, float] = {}
        state = self.state if self.eval_state_fn is None else self.eval_state_fn(self.state)
        for name, data in self.eval_sets.items():
            values = _run_eval(
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
        self.state = self._with_extra(self.state)
        path = self.checkpoints.save(self.state)
        self.last_saved_batch = self._batch()
        self.ctx.state = self.state
        self.ctx.checkpoint_path = path
        self._emit(Event.CHECKPOINT)

    def _with_extra(self, state: TrainState) -> TrainState:
        """`state` with the callbacks' state and the data position in `extra` (for saving)."""
        extra = dict(state.extra)
        saved = {}
        for name, callback in zip(self.names, self.callbacks):
            state_dict = getattr(callback, "state_dict", None)
            if callable(state_dict) and not isinstance(callback, torch.nn.Module):
                saved[name] = encode_state(state_dict(), f"{name}.state_dict()")
        if saved:
            extra[CALLBACKS_KEY] = saved
        data_state = self.source.state_dict(state.timestamp.sample_in_epoch)
        if data_state:
            extra[DATA_KEY] = encode_state(data_state, "train_data state")
        return state.replace(extra=extra)

    def _resume(self) -> None:
        manager = self.checkpoints
        like = self._with_extra(self.state)
        if "ignore" in inspect.signature(manager.restore).parameters:
            # The loop's own entries are read apart: the set of callbacks may differ on resume.
            path = manager.latest()
            restored = manager.restore(
                like=like, ignore=(f"extra.{CALLBACKS_KEY}", f"extra.{DATA_KEY}")
            )
            saved_extra = _saved_loop_extra(path, manager) if restored is not None and path else {}
        else:
            restored = manager.restore(like=like)
            saved_extra = restored.extra if restored is not None else {}
        if restored is None:
            return
        if saved_extra:
            extra = {k: v for k, v in restored.extra.items() if k not in (CALLBACKS_KEY, DATA_KEY)}
            restored = restored.replace(extra={**extra, **saved_extra})
        self.state = restored
        self.last_saved_batch = restored.timestamp.batch
        latest = getattr(manager, "latest", None)
        self.ctx.resumed_from = latest() if callable(latest) else True
        saved = restored.extra.get(CALLBACKS_KEY, {}) or {}
        for name, callback in zip(self.names, self.callbacks):
            load = getattr(callback, "load_state_dict", None)
            if name in saved and callable(load) and not isinstance(callback, torch.nn.Module):
                load(decode_state(saved[name]))
        data_state = restored.extra.get(DATA_KEY)
        self.source.load_state_dict(
            decode_state(data_state) if isinstance(data_state, str) else None,
            restored.timestamp.batch_in_epoch,
        )
        self.ctx.state = self.state

    def _wait_for_saves(self, failed: bool) -> None:
        wait = getattr(self.checkpoints, "wait", None)
        if not callable(wait):
            return
        if not failed:
            wait()
            return
        try:  # an error is already propagating: finish the save, but do not mask the error
            wait()
        except Exception as error:  # noqa: BLE001
            warnings.warn(
                f"a checkpoint save failed while handling an error: {error}", stacklevel=3
            )

    # -- events and signals ------------------------------------------------------------------

    def _emit(self, event: Event) -> None:
        dispatch(event, self.callbacks, self.ctx)

    def _install_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread

        def on_sigterm(signum, frame):  # finish the current step, checkpoint, return
            self.ctx.request_stop("SIGTERM: preempted")

        old = signal.signal(signal.SIGTERM, on_sigterm)
        self._old_sigterm = (signal.SIG_DFL if old is None else old,)

    def _restore_sigterm(self) -> None:
        if self._old_sigterm is not None:
            signal.signal(signal.SIGTERM, self._old_sigterm[0])
            self._old_sigterm = None


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


def _eval_sets(eval_data: Any) -> dict[str | None, Any]:
    if eval_data is None:
        return {}
    if isinstance(eval_data, Mapping):
        return {str(k): v for k, v in eval_data.items()}
    return {None: eval_data}


def _manager(checkpoints: Any) -> Any:
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


def _has_len(data: Any) -> bool:
    try:
        len(data)
    except TypeError:
        return False
    return True


def _dp_info() -> tuple[int, int]:
    from .dist.compute import data_parallel_info

    return data_parallel_info()


def _state_device(state: TrainState) -> torch.device | None:
    """The device batches go to: the params' device when it is not the CPU."""
    for tensor in state.params.values():
        device = tensor.device
        return None if device.type == "cpu" else device
    return None


def describe_batch(batch: Any) -> str:
    """A short description of a batch's structure ("tuple of 2: Tensor[32, 8] float32, ...")."""

    def one(x: Any) -> str:
        if isinstance(x, torch.Tensor):
            return f"Tensor{list(x.shape)} {str(x.dtype).replace('torch.', '')}"
        if isinstance(x, Mapping):
            return "dict{" + ", ".join(f"{k!r}: {one(v)}" for k, v in x.items()) + "}"
        if isinstance(x, (list, tuple)):
            return f"{type(x).__name__} of {len(x)}: " + ", ".join(one(v) for v in x)
        return type(x).__name__

    text = one(batch)
    return text if len(text) < 300 else text[:297] + "..."


# ------------------------------------------------------------------------------------------------
# evaluate and predict


class _ModelProxy:
    """Runs the model with a state's params, without gradients, remembering its last outputs.

    `loss_fn(model, batch)` and `eval_fn(model, batch)` receive this in place of the module: a call
    with the same arguments as the previous one returns the cached outputs, so computing the loss
    and the metrics costs one forward pass. Attribute access falls through to the module.
    """

    def __init__(self, call: Callable[..., Any], module: torch.nn.Module | None):
        self._call, self._module = call, module
        self._key: tuple | None = None
        self.last_outputs: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = tuple(id(a) for a in args) + tuple((k, id(v)) for k, v in sorted(kwargs.items()))
        if key != self._key:
            with torch.no_grad():
                self.last_outputs = self._call(*args, **kwargs)
            self._key = key
        return self.last_outputs

    def __getattr__(self, name: str) -> Any:
        if self._module is None:
            raise AttributeError(name)
        return getattr(self._module, name)


def _runner(step_or_model: Any, state: TrainState | None):
    """`(call, module, loss_fn)` for a Step or a plain module."""
    if isinstance(step_or_model, torch.nn.Module):
        module = step_or_model
        if state is None:
            return module, module, None
        tensors = {**state.params, **state.buffers}

        def call(*args, **kwargs):
            return torch.func.functional_call(module, tensors, args, kwargs, tie_weights=True)

        return call, module, None
    pieces = getattr(step_or_model, "pieces", None)
    if pieces is None or not hasattr(pieces, "call_model"):
        if not callable(step_or_model):
            raise TypeError(
                "evaluate/predict take a functrain Step (from make_step) or a torch.nn.Module; "
                f"got {type(step_or_model).__name__}"
            )

        def no_model(*args, **kwargs):
            raise TypeError(
                f"the step {getattr(step_or_model, '__name__', step_or_model)!r} is a plain "
                "function, so there is no model to evaluate: build it with functrain.make_step, "
                "or pass an eval_fn that does not call the model"
            )

        return no_model, None, None
    if state is None:
        raise ValueError("evaluate/predict with a Step need the TrainState whose params to use")
    base = step_or_model
    while not hasattr(base, "model") and hasattr(base, "step"):  # a CompiledStep wraps a Step
        base = base.step
    module = getattr(base, "model", None)

    def call(*args, **kwargs):
        return pieces.call_model(state, *args, **kwargs)

    return call, module, getattr(base, "loss_fn", None)


def _get(batch: Any, key: Any, what: str) -> Any:
    try:
        return batch[key]
    except (KeyError, IndexError, TypeError) as error:
        raise ValueError(
            f"cannot take the {what} from a batch that is a {describe_batch(batch)} with key "
            f"{key!r} ({type(error).__name__}: {error}); pass eval_fn=lambda model, batch: "
            f"(outputs, targets), or {what[:-1]}_key=..."
        ) from None


class _EvalMode:
    """`module.eval()` for a block, restoring the previous mode after."""

    def __init__(self, module: torch.nn.Module | None):
        self.module = module

    def __enter__(self):
        self.was_training = self.module.training if self.module is not None else False
        if self.module is not None:
            self.module.eval()

    def __exit__(self, *exc):
        if self.module is not None:
            self.module.train(self.was_training)


def _run_eval(
    step_or_model,
    state,
    data,
    *,
    metrics: dict[str, Any],
    eval_fn,
    emit,
    ctx,
    device,
    input_key=0,
    target_key=1,
) -> dict[str, float]:
    call, module, loss_fn = _runner(step_or_model, state)
    from .step import normalize_loss

    proxy = _ModelProxy(call, module)
    loss_mean = Mean("loss") if loss_fn is not None else None
    for metric in metrics.values():
        metric.reset()
    ctx.eval_metrics = {}
    emit(Event.EVAL_START)
    with _EvalMode(module), torch.no_grad():
        for batch in data:
            if device is not None:
                batch = to_device(batch, device, non_blocking=True)
            ctx.batch, ctx.outputs = batch, None
            emit(Event.EVAL_BATCH_START)
            if loss_fn is not None:
                loss, _ = normalize_loss(loss_fn(proxy, batch))
                loss_mean.update(loss, _batch_size(batch))
            if eval_fn is not None:
                outputs, targets = eval_fn(proxy, batch)
            elif metrics:
                if proxy.last_outputs is None:
                    proxy(_get(batch, input_key, "inputs"))
                outputs, targets = proxy.last_outputs, _get(batch, target_key, "targets")
            else:
                outputs, targets = proxy.last_outputs, None
            for metric in metrics.values():
                metric.update(outputs, targets)
            ctx.outputs = outputs
            emit(Event.EVAL_BATCH_END)
            proxy._key, proxy.last_outputs = None, None
    results = {}
    if loss_mean is not None:
        results["loss"] = loss_mean.compute()
    for name, metric in metrics.items():
        results[name] = metric.compute()
    ctx.eval_metrics = results
    ctx.batch = ctx.outputs = None
    emit(Event.EVAL_END)
    return results


def _batch_size(batch: Any) -> int:
    from .batching import num_samples

    try:
        return num_samples(batch)
    except ValueError:
        return 1


def evaluate(
    step_or_model: Any,
    state: TrainState | None,
    data: Iterable[Any],
    *,
    metrics: Any = None,
    eval_fn: Callable | None = None,
    callbacks: Iterable[Any] = (),
    input_key: Any = 0,
    target_key: Any = 1,
) -> dict[str, float]:
    """Evaluate the state's params on `data`: the mean loss and `metrics`, over all ranks.

    Args:
        step_or_model: a `Step` (its `loss_fn` gives "loss"; the model runs through
            `step.pieces.call_model`) or a `torch.nn.Module` (run with `state`'s tensors, or as
            it is when `state` is None).
        state: the `TrainState` whose params to evaluate.
        data: an iterable of batches (each rank passes its shard, e.g. a
            `Loader(..., shuffle=False, drop_last=False)`).
        metrics: names ("accuracy", "cross_entropy", "perplexity"), metric objects,
            torchmetrics metrics, or `{name: metric}`.
        eval_fn: `(model, batch) -> (outputs, targets)` for the metrics; `model` runs without
            gradients (default: `model(batch[input_key])` and `batch[target_key]`).
        callbacks: receive EVAL_START, EVAL_BATCH_START, EVAL_BATCH_END and EVAL_END.
        input_key, target_key: where inputs and targets sit in a batch (Composer's convention).
    Returns:
        `{"loss": float (with a Step), <metric name>: float, ...}`, reduced over all ranks (every
        rank must call `evaluate`).
    Example:
        >>> evaluate(step, state, test_loader, metrics=["accuracy"])
        {'loss': 0.08, 'accuracy': 0.975}
    """
    rank, world = _dp_info()
    callbacks = list(callbacks)
    ctx = Context(state=state, rank=rank, world_size=world)
    device = _state_device(state) if state is not None else None

    def emit(event: Event) -> None:
        dispatch(event, callbacks, ctx)

    return _run_eval(
        step_or_model,
        state,
        data,
        metrics=resolve_metrics(metrics),
        eval_fn=eval_fn,
        emit=emit,
        ctx=ctx,
        device=device,
        input_key=input_key,
        target_key=target_key,
    )


def predict(
    step_or_model: Any,
    state: TrainState | None,
    data: Iterable[Any],
    *,
    predict_fn: Callable | None = None,
    callbacks: Iterable[Any] = (),
    input_key: Any = 0,
    to_cpu: bool = True,
) -> list[Any]:
    """The model's outputs on every batch of `data`, with the state's params and no gradients.

    Args:
        step_or_model: a `Step` or a `torch.nn.Module` (as in `evaluate`).
        state: the `TrainState` whose params to use.
        data: an iterable of batches.
        predict_fn: `(model, batch) -> outputs` (default: `model(batch[input_key])` for a
            tuple/list batch, `model(**batch)` for a dict, `model(batch)` for a tensor).
        callbacks: receive PREDICT_START, PREDICT_BATCH_START, PREDICT_BATCH_END, PREDICT_END.
        input_key: where inputs sit in a tuple/list batch.
        to_cpu: move tensor outputs to the CPU (frees device memory as you go).
    Returns:
        a list with one entry of outputs per batch.
    Example:
        >>> logits = torch.cat(predict(step, state, test_loader))
    """
    rank, world = _dp_info()
    callbacks = list(callbacks)
    ctx = Context(state=state, rank=rank, world_size=world)
    device = _state_device(state) if state is not None else None
    call, module, _ = _runner(step_or_model, state)
    proxy = _ModelProxy(call, module)
    outputs_all = []
    dispatch(Event.PREDICT_START, callbacks, ctx)
    with _EvalMode(module), torch.no_grad():
        for batch in data:
            if device is not None:
                batch = to_device(batch, device, non_blocking=True)
            ctx.batch, ctx.outputs = batch, None
            dispatch(Event.PREDICT_BATCH_START, callbacks, ctx)
            if predict_fn is not None:
                outputs = predict_fn(proxy, batch)
            elif isinstance(batch, Mapping):
                outputs = proxy(**batch)
            elif isinstance(batch, (tuple, list)):
                outputs = proxy(_get(batch, input_key, "inputs"))
            else:
                outputs = proxy(batch)
            proxy._key = None
            if to_cpu:
                outputs = _to_cpu(outputs)
            ctx.outputs = outputs
            dispatch(Event.PREDICT_BATCH_END, callbacks, ctx)
            outputs_all.append(outputs)
    ctx.batch = ctx.outputs = None
    dispatch(Event.PREDICT_END, callbacks, ctx)
    return outputs_all


def _to_cpu(outputs: Any) -> Any:
    """Tensors in `outputs` (a tensor, a dict such as a Hugging Face output, a list/tuple) on CPU."""
    if isinstance(outputs, torch.Tensor):
        return outputs.cpu()
    if isinstance(outputs, Mapping):
        moved = {k: _to_cpu(v) for k, v in outputs.items()}
        try:
            return type(outputs)(**moved)
        except TypeError:
            return moved
    if isinstance(outputs, (list, tuple)) and not hasattr(outputs, "_fields"):
        return type(outputs)(_to_cpu(v) for v in outputs)
    return outputs
