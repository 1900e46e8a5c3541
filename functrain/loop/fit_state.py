"""`FitState`: what `fit` trains when the state is a pytree of states (a GAN, a teacher and a
student), with the loop's own position beside it.

One `TrainState` carries its position itself (`state.timestamp`, advanced by the step). A pytree of
states has no single position: a GAN steps two states per batch, a frozen teacher none. So `fit`
wraps the pytree in a `FitState` whose `timestamp` the *loop* advances, one batch per call of the
user's step, and checkpoints the two together (`states.<path>...`, `timestamp.*`, `extra.*`), so
an auto-resumed run continues exactly where the interrupted one stopped. `fit` returns the
`FitState`; pass it back to `fit` with a longer duration to continue the run.

The loop also writes the run's horizon (`batches_per_epoch`, `max_batches`) into every
`TrainState` inside, so that schedules in "ep" or "dur" units resolve in the inner steps; the
inner states' own counters stay their steps' business.

Example:
    >>> run = functrain.fit(gan_step, {"g": g_state, "d": d_state}, loader, duration="500ba")
    >>> run.timestamp.batch, run.states["g"].step
    (500, 500)
    >>> run = functrain.fit(gan_step, run, loader, duration="1000ba")   # continues
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import optree

from ..state import TrainState
from ..step.batching import num_samples
from ..tree import NAMESPACE, fast_replace, register_dataclass
from ..units import Timestamp

__all__ = [
    "FitState",
    "advance",
    "call_step",
    "check_step_output",
    "map_train_states",
    "share_horizon",
]


@register_dataclass
@dataclasses.dataclass(frozen=True)
class FitState:
    """A pytree of states trained together, and the loop's position.

    Attributes:
        states: the user's pytree (`{"generator": TrainState, "discriminator": TrainState}`,
            `{"teacher": ..., "student": ...}`, or any pytree of tensors and scalars).
        timestamp: the run's position, advanced by the loop after each call of the step.
        extra: what the loop checkpoints of its own (callback states, the data position).
    """

    states: Any
    timestamp: Timestamp = dataclasses.field(default_factory=Timestamp)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def step(self) -> int:
        """The number of batches trained (the checkpoint's step number)."""
        return self.timestamp.batch

    def replace(self, **changes: Any) -> FitState:
        """A copy with some fields changed."""
        return fast_replace(self, changes)


def map_train_states(fn: Callable[[TrainState], TrainState], tree: Any) -> Any:
    """`tree` with `fn` applied to every `TrainState` in it (other leaves unchanged).

    Args:
        fn: `TrainState -> TrainState`.
        tree: any pytree.
    Returns:
        the same structure.
    Example:
        >>> map_train_states(lambda s: s.replace(step=0), {"a": state, "n": 3})["n"]
        3
    """

    def visit(node: Any) -> Any:
        return fn(node) if isinstance(node, TrainState) else node

    return optree.tree_map(
        visit, tree, is_leaf=lambda x: isinstance(x, TrainState), namespace=NAMESPACE
    )


def advance(run: FitState, states: Any, metrics: Any, batch: Any, world_size: int) -> FitState:
    """`run` after its step made `states` from one batch: the position one batch further.

    Args:
        run: the `FitState` before the step.
        states: the pytree the step returned.
        metrics: the step's metrics; `metrics["samples"]` (an int, the global count as `Step`
            reports it) and `metrics["tokens"]` are used when present.
        batch: this rank's batch (its leading dimension times `world_size` counts the samples
            otherwise).
        world_size: the number of data-parallel ranks.
    Returns:
        the new `FitState`.
    Example:
        >>> advance(FitState({}), {}, {"loss": 0.1}, torch.zeros(8, 3), 2).timestamp.sample
        16
    """
    samples = metrics.get("samples")
    if not isinstance(samples, int) or isinstance(samples, bool):
        samples = num_samples(batch) * world_size
    tokens = metrics.get("tokens", 0)
    tokens = tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else 0
    return run.replace(states=states, timestamp=run.timestamp.advance_batch(samples, tokens))


def share_horizon(run: FitState) -> FitState:
    """`run` with its horizon (`batches_per_epoch`, `max_batches`) in every inner `TrainState`,
    whose schedules read it to resolve "ep" and "dur" units."""
    ts = run.timestamp

    def with_horizon(inner: TrainState) -> TrainState:
        horizon = {"batches_per_epoch": ts.batches_per_epoch, "max_batches": ts.max_batches}
        return inner.replace(timestamp=inner.timestamp.replace(**horizon))

    return run.replace(states=map_train_states(with_horizon, run.states))


def call_step(step: Any, state: Any, batch: Any, multi: bool, world_size: int) -> tuple[Any, Any]:
    """One call of the user's step on `fit`'s state.

    Args:
        step: the step, `(state, batch) -> (state, metrics)`.
        state: a `TrainState` (the step advances it), or a `FitState` when `multi`.
        batch: the batch.
        multi: the state is a `FitState`: the step takes its pytree, the loop advances it.
        world_size: the data-parallel ranks (a batch counts their samples).
    Returns:
        `(new state, metrics)`, checked by `check_step_output`.
    Example:
        >>> state, metrics = call_step(step, state, batch, multi=False, world_size=1)
    """
    if not multi:
        return step(state, batch)
    states, metrics = step(state.states, batch)
    if not isinstance(metrics, Mapping):
        return states, metrics  # refused by check_step_output
    return advance(state, states, metrics, batch, world_size), metrics


def check_step_output(state: Any, metrics: Any, multi: bool) -> None:
    """Refuse what a step returned when it is not `(state, metrics)`, saying what a step returns.

    Raises:
        TypeError: the metrics are not a mapping, or one `TrainState` came back as another type.
    """
    if not isinstance(metrics, Mapping):
        raise TypeError(
            f"the step returned {type(metrics).__name__} as its metrics; a step returns "
            "(state, metrics) with metrics a dict such as {'loss': loss}"
        )
    if not multi and not isinstance(state, TrainState):
        raise TypeError(
            f"the step returned a {type(state).__name__} for a TrainState; a step returns "
            "(new_state, metrics). For a step over several states pass them as a pytree "
            "({'g': ..., 'd': ...}) to fit"
        )
