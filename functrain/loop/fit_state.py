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
inner states' own counters stay their steps' business. Both are done by `StateTree`
(state_adapter.py), the one writer of the timestamp.

Example:
    >>> run = functrain.fit(gan_step, {"g": g_state, "d": d_state}, loader, duration="500ba")
    >>> run.timestamp.batch, run.states["g"].step
    (500, 500)
    >>> run = functrain.fit(gan_step, run, loader, duration="1000ba")   # continues
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import optree

from ..state import TrainState
from ..tree import NAMESPACE, fast_replace, register_dataclass
from ..units import Timestamp

__all__ = ["FitState", "map_train_states"]


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
