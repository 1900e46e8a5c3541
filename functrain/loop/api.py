"""`fit`: the training driver, and with `functrain.loop.evaluation` the only place with side effects.

`fit` feeds batches to a step `(state, batch) -> (state, metrics)` until the run's duration is
reached, emitting the events of `functrain.loop.events` to callbacks and loggers, evaluating and
checkpointing at their intervals. Everything a run is lives in the returned state (the data
position is its timestamp's epoch and batch), so calling `fit` again with a longer duration
continues the run, and `autoresume=True` continues from the newest checkpoint.

The state is one `TrainState`, or any pytree of states (`{"g": ..., "d": ...}`, a teacher and a
student) trained by a user step over the whole pytree; then `fit` trains and returns a
`functrain.FitState` that holds the pytree and the loop's own position (see fit_state.py).

Example:
    >>> step = functrain.make_step(model, loss_fn, opt)
    >>> state = functrain.fit(step, state, Loader(train_set, 128), duration="3ep",
    ...                       eval_data=Loader(test_set, 512, shuffle=False, drop_last=False),
    ...                       eval_metrics=["accuracy"], checkpoints=Manager("runs/a"),
    ...                       autoresume=True)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from ..units import TimeLike
from .launch_record import launched, record_commit
from .options import FitOptions
from .run import FitRun, StepError

__all__ = ["StepError", "fit"]


def fit(
    step: Callable[[Any, Any], tuple[Any, dict]],
    state: Any,
    train_data: Any,
    *,
    duration: TimeLike,
    eval_data: Any = None,
    eval_interval: TimeLike | None = "1ep",
    eval_fn: Callable | None = None,
    eval_metrics: Any = None,
    eval_state_fn: Callable[[Any], Any] | None = None,
    input_key: Any = 0,
    target_key: Any = 1,
    train_metrics: Any = None,
    callbacks: Iterable[Any] = (),
    loggers: Iterable[Any] = (),
    checkpoints: Any = None,
    autoresume: bool = False,
    log_interval: TimeLike | None = "10ba",
    donate: bool = True,
    run_dir: str | os.PathLike | None = None,
    seed: int | None = None,
    progress: bool = True,
    return_result: bool = False,
    on_data_change: str = "error",
    sanity_check_batches: int = 2,
) -> Any:
    """Train `state` with `step` on `train_data` until `duration`, and return the final state.

    Args:
        step: `(state, batch) -> (state, metrics)`, e.g. from `functrain.make_step`, or any
            `functrain.StepLike` (a plain function is adapted by `functrain.as_step`).
        state: the `TrainState` to start from; or a pytree of states for a step over all of
            them (`{"g": TrainState, "d": TrainState}`), which fit wraps in a `FitState` with
            the loop's own position; or a `FitState` returned by an earlier `fit` (continues
            it). With `donate=True` it is consumed: use only the returned state afterwards.
        train_data: a `functrain.data.Loader` (resumes mid-epoch in O(1)), an iterable with
            `state_dict`/`load_state_dict` (resumes through them), or any re-iterable of batches
            such as a `DataLoader` (resumes by replaying the epoch's earlier batches).
        duration: the run's TOTAL length, counted from step 0 ("3ep", "500ba", "1e6tok",
            "50000sp", "2h"); a state that already reached it returns at once, so calling `fit`
            again with a longer duration continues the run. Schedules written in "dur" (and
            "ep") units then follow the new length, as in Composer.
        eval_data: an iterable of evaluation batches, or `{name: iterable}` for several sets.
        eval_interval: how often to evaluate ("1ep", "500ba", "0.25dur", "10m"); None: only
            at the end. An evaluation also runs at the end unless the last batch had one.
        eval_fn: `(model, batch) -> (outputs, targets)` for the metrics (see `evaluate`).
        eval_metrics: metrics for evaluation: names ("accuracy", "cross_entropy",
            "perplexity"), `functrain.metrics` objects, torchmetrics metrics, or a dict of them.
            The eval loss (the step's loss on the eval batches) is always reported.
        eval_state_fn: `state -> state` evaluated in place of the training state, e.g.
            `functrain.algorithms.swap_in_ema` to evaluate the EMA weights (as Composer does).
        input_key, target_key: where inputs and targets sit in a batch (as in `evaluate`).
        train_metrics: metrics computed on the training batches from the step's outputs (no
            extra forward pass): the step's metrics must hold the model's outputs under
            "outputs" (`loss_fn` returns `loss, {"outputs": logits}`) and, optionally, the
            targets under "targets" (else `batch[target_key]`). Logged as "train/<name>" at
            each log interval, over the batches since the previous one.
        callbacks: objects with a method per event they handle (see `functrain.loop.events`).
        loggers: callbacks that also have `log_metrics(metrics, step)`.
        checkpoints: a `functrain.checkpoint.Manager`, or a directory for one that saves every
            epoch (closed when fit returns); saved when `should_save(timestamp)` says so, when
            the run stops early, and at the end.
        autoresume: restore the newest committed checkpoint of `checkpoints` before training.
        log_interval: how often the step's metrics go to the loggers ("10ba"); None: never.
        donate: let the step update the state in place (JAX's donation): fast, and `state`
            must not be used after the call.
        run_dir: the run's directory, given to callbacks as `ctx.run_dir`; fit writes the logged
            metrics to `<run_dir>/metrics.jsonl` (`python -m functrain.plot run_dir`) unless a
            `JSONLLogger` is among the loggers.
        seed: if set, seeds torch's global generator at the start (from `seed` and the state's
            step) for code outside functrain that draws from it; functrain's own randomness
            always derives from `state.rng`.
        progress: show progress (a bar in a terminal, a periodic line elsewhere, on rank 0) and
            the loop's status lines (resumed, already finished, stopped); False: silent.
        return_result: return a `functrain.FitResult` (the state, and whether the run finished,
            stopped or was preempted, with its checkpoint) instead of the state alone.
        on_data_change: a resume whose checkpoint counted its position on other data (another
            length, batch size or world size): "error" (refuse, naming both), "restart_epoch"
            (the interrupted epoch starts over) or "by_samples" (the position converted by the
            samples trained in the epoch); the remaining epochs count at the new length.
        sanity_check_batches: at a fresh start with `eval_data`, evaluate this many batches of
            each eval set before training (no state change, nothing logged), so that a broken
            evaluation fails at once and not after the first epoch; 0: off.
    Returns:
        the trained `TrainState` (a `FitState` for a pytree of states), or a `FitResult`.
    Raises:
        ValueError: a bad duration/interval string, empty data, or data that changed under a
            mid-epoch resume. `StepError`: the step failed on a batch (its position and shape
            are named). `functrain.loop.events.CallbackError`: a callback raised.
            `functrain.checkpoint.CheckpointMismatchError`: the newest checkpoint does not fit
            the step's state. In every case any in-flight checkpoint save finishes first, so
            checkpoints on disk stay intact.

    SIGTERM or a first Ctrl-C stops the run at the next step boundary (on every rank at the same
    step), saves a checkpoint and returns (`FitResult.preempted`); a second Ctrl-C aborts.
    """
    options = FitOptions.create(
        duration=duration,
        eval_data=eval_data,
        eval_interval=eval_interval,
        eval_fn=eval_fn,
        eval_metrics=eval_metrics,
        eval_state_fn=eval_state_fn,
        input_key=input_key,
        target_key=target_key,
        train_metrics=train_metrics,
        callbacks=callbacks,
        loggers=loggers,
        checkpoints=checkpoints,
        autoresume=autoresume,
        log_interval=log_interval,
        donate=donate,
        run_dir=run_dir,
        seed=seed,
        progress=progress,
        on_data_change=on_data_change,
        sanity_check_batches=sanity_check_batches,
    )
    run = FitRun(step, state, train_data, options)
    manager = run.checkpoints
    if manager is not None and launched():
        manager.subscribe(record_commit)  # the launcher's last line names the last commit
    try:
        result = run.run()
    finally:
        if manager is not None and manager is options.checkpoints:
            manager.release(wait=False)  # the caller's manager: lease back, reusable
    return result if return_result else result.state
