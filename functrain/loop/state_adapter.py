"""The loop's state seen one way, whatever `fit` was given: `SingleState` for one `TrainState`,
`StateTree` for a pytree of states held in a `FitState`.

`fit` picks the adapter once, when it starts (`adapter_for`), so the loop body has no mode branches,
and the adapter is the one place where the loop writes a timestamp: `after_step` (the position
one batch further), `with_timestamp` (the epoch end, the agreed clock, an estimated horizon, a
converted data position) and `with_horizon` (the run's length, set at the start).

The two differ in who advances the batch counters. One `TrainState` carries its position and its
step advances it (`Step` does; a step function must), so `SingleState` takes what the step
returned. A pytree of states has no single position (a GAN steps two states per batch, a frozen
teacher none), so `StateTree` advances the `FitState`'s timestamp, one batch per call of the step,
and copies the horizon into every inner `TrainState`, whose schedules read it to resolve "ep" and
"dur" units. Both keep in one value what the loop checkpoints and returns: the `TrainState`, or
the `FitState` with its pytree, timestamp and extra.

Example:
    >>> adapter, state = adapter_for({"g": g_state, "d": d_state}, world_size=1)
    >>> output, metrics = adapter.call(step, state, batch)     # the step sees the pytree
    >>> state = adapter.after_step(state, output, metrics, batch)
    >>> state.timestamp.batch
    1
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from ..state import TrainState
from ..step.batching import num_samples
from ..units import Timestamp
from .fit_state import FitState, map_train_states

__all__ = ["LoopState", "SingleState", "StateTree", "adapter_for"]


class LoopState(Protocol):
    """What the loop asks of its state; `SingleState` and `StateTree` answer.

    `state` below is the loop's value: a `TrainState`, or a `FitState`. It has `timestamp`,
    `step`, `extra` and `replace`, which the loop reads directly.
    """

    def init(self, step: Any, state: Any) -> Any:
        """`state` with what `step` keeps in it added (`step.init_state`)."""
        ...

    def step_state(self, state: Any) -> Any:
        """What the step (and evaluation) takes: the `TrainState`, or the `FitState`'s pytree."""
        ...

    def call(self, step: Any, state: Any, batch: Any) -> tuple[Any, Any]:
        """The step's raw `(output, metrics)` on one batch, checked by `after_step`."""
        ...

    def after_step(self, state: Any, output: Any, metrics: Any, batch: Any) -> Any:
        """The loop's state after the step returned `(output, metrics)`: one batch further.

        Raises:
            TypeError: the step did not return `(state, metrics)`.
        """
        ...

    def with_timestamp(self, state: Any, ts: Timestamp) -> Any:
        """`state` at `ts` (a changed horizon reaches the inner states of a tree)."""
        ...

    def with_horizon(self, state: Any, ts: Timestamp) -> Any:
        """`state` at `ts`, whose horizon is the run's: every inner state gets it."""
        ...


class SingleState:
    """One `TrainState`: the step takes it and returns it advanced.

    Example:
        >>> adapter = SingleState()
        >>> adapter.after_step(state, *step(state, batch), batch).step
        1
    """

    def init(self, step: Any, state: Any) -> Any:
        return step.init_state(state)

    def step_state(self, state: Any) -> Any:
        return state

    def call(self, step: Any, state: Any, batch: Any) -> tuple[Any, Any]:
        return step(state, batch)

    def after_step(self, state: Any, output: Any, metrics: Any, batch: Any) -> Any:
        if not isinstance(metrics, Mapping):
            _refuse(metrics)
        if not isinstance(output, TrainState):
            raise TypeError(
                f"the step returned a {type(output).__name__} for a TrainState; a step returns "
                "(new_state, metrics). For a step over several states pass them as a pytree "
                "({'g': ..., 'd': ...}) to fit"
            )
        return output  # its step advanced the timestamp

    def with_timestamp(self, state: Any, ts: Timestamp) -> Any:
        # the one place the loop writes a TrainState's timestamp
        return state.replace(timestamp=ts)

    with_horizon = with_timestamp  # the horizon is the timestamp's own


class StateTree:
    """A `FitState` over a pytree of states: the step takes the pytree, this advances the
    timestamp and copies the horizon inward.

    Args:
        world_size: the data-parallel ranks (a batch counts their samples when the step does
            not report `metrics["samples"]`).
    Example:
        >>> tree = StateTree(world_size=2)
        >>> tree.after_step(FitState({}), {}, {"loss": 0.1}, torch.zeros(8, 3)).timestamp.sample
        16
    """

    def __init__(self, world_size: int = 1):
        self.world_size = world_size

    def init(self, step: Any, state: Any) -> Any:
        return state.replace(states=step.init_state(state.states))

    def step_state(self, state: Any) -> Any:
        return state.states

    def call(self, step: Any, state: Any, batch: Any) -> tuple[Any, Any]:
        return step(state.states, batch)

    def after_step(self, state: Any, output: Any, metrics: Any, batch: Any) -> Any:
        if not isinstance(metrics, Mapping):
            _refuse(metrics)
        # `Step` reports the global sample count as an int; a step function may not
        samples = metrics.get("samples")
        if not isinstance(samples, int) or isinstance(samples, bool):
            samples = num_samples(batch) * self.world_size
        tokens = metrics.get("tokens", 0)
        tokens = tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else 0
        return _moved(state, output, state.timestamp.advance_batch(samples, tokens), False)

    def with_timestamp(self, state: Any, ts: Timestamp) -> Any:
        return _moved(state, state.states, ts, False)

    def with_horizon(self, state: Any, ts: Timestamp) -> Any:
        # always shared: inner states made apart from this FitState may hold another horizon
        return _moved(state, state.states, ts, True)


def _moved(run: FitState, states: Any, ts: Timestamp, share: bool) -> FitState:
    """The one place the loop writes a `FitState`'s timestamp: `run` with `states` at `ts`, the
    horizon copied into every inner `TrainState` when `share` or when it changed (a tree walk
    only then, never on an ordinary step)."""
    before = run.timestamp
    if (
        share
        or ts.batches_per_epoch != before.batches_per_epoch
        or ts.max_batches != before.max_batches
    ):
        horizon = {"batches_per_epoch": ts.batches_per_epoch, "max_batches": ts.max_batches}

        def with_horizon(inner: TrainState) -> TrainState:
            return inner.replace(timestamp=inner.timestamp.replace(**horizon))

        states = map_train_states(with_horizon, states)
    return run.replace(states=states, timestamp=ts)


def _refuse(metrics: Any) -> None:
    # checked inline by the callers: no call on an ordinary step
    raise TypeError(
        f"the step returned {type(metrics).__name__} as its metrics; a step returns "
        "(state, metrics) with metrics a dict such as {'loss': loss}"
    )


def adapter_for(state: Any, world_size: int = 1) -> tuple[LoopState, Any]:
    """The adapter for what `fit` was given, and the loop's state: a `TrainState` as it is, a
    `FitState` as it is (a run continued), any other pytree wrapped in a `FitState`.

    Args:
        state: what `fit` was given.
        world_size: the data-parallel ranks (see `StateTree`).
    Returns:
        `(adapter, loop state)`.
    Example:
        >>> adapter, run = adapter_for({"g": g_state, "d": d_state})
        >>> type(adapter).__name__, type(run).__name__
        ('StateTree', 'FitState')
    """
    if isinstance(state, TrainState):
        return SingleState(), state
    if not isinstance(state, FitState):
        state = FitState(states=state)
    return StateTree(world_size), state
