"""`StepLike`: what `fit`, `evaluate` and `predict` may ask of a step, and `as_step` for plain
functions.

A step is `(state, batch) -> (state, metrics)`. The loop needs three more things of it, and asks
for them through this protocol instead of probing attributes:

    step.donated()          a version allowed to update its input state in place (fit owns the
                            state, so it donates); a step that cannot donates returns itself
    step.init_state(state)  the state with whatever the step keeps there added (algorithm states,
                            the fp16 loss scale); idempotent, so fit can build an auto-resume
                            target with the same structure the checkpoint was saved with
    step.evaluator()        an `Evaluator` (the model, how to call it with a state's tensors, the
                            loss), or None when the step has no model to evaluate

`Step` (from `make_step`) and `CompiledStep` implement it; a user's own function is adapted by
`as_step`, with identity defaults.

Example:
    >>> def train_gan(states, batch):          # a user step over a pytree of states
    ...     ...
    ...     return states, metrics
    >>> step = as_step(train_gan)
    >>> step.init_state(states) is states
    True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch

__all__ = ["Evaluator", "FunctionStep", "StepLike", "as_step"]


class Evaluator(NamedTuple):
    """How evaluation runs a step's model.

    Attributes:
        module: the skeleton module (switched to eval mode while evaluating), or None.
        call_model: `(state, *args, **kwargs) -> outputs`, the model run with the state's
            tensors and without gradients.
        loss_fn: `loss_fn(model, batch)` for the eval loss, or None.
    """

    module: torch.nn.Module | None
    call_model: Callable[..., Any]
    loss_fn: Callable[..., Any] | None


@runtime_checkable
class StepLike(Protocol):
    """The protocol of a training step (see the module docstring)."""

    def __call__(self, state: Any, batch: Any) -> tuple[Any, dict]: ...

    def donated(self) -> StepLike: ...

    def init_state(self, state: Any) -> Any: ...

    def evaluator(self) -> Evaluator | None: ...


class FunctionStep:
    """A plain `(state, batch) -> (state, metrics)` function as a `StepLike`.

    It never donates (the function decides what it does with its input), keeps nothing extra in
    the state, and has no model to evaluate (pass `eval_fn` to `fit` or `evaluate`).
    """

    def __init__(self, fn: Callable[[Any, Any], tuple[Any, dict]]):
        self.fn = fn

    def __call__(self, state: Any, batch: Any) -> tuple[Any, dict]:
        return self.fn(state, batch)

    def donated(self) -> FunctionStep:
        return self

    def init_state(self, state: Any) -> Any:
        return state

    def evaluator(self) -> Evaluator | None:
        return None

    def __repr__(self) -> str:
        return f"FunctionStep({getattr(self.fn, '__name__', self.fn)!r})"


def as_step(step: Any) -> StepLike:
    """`step` as a `StepLike`: itself when it implements the protocol, else a `FunctionStep`.

    Raises:
        TypeError: `step` is not callable.
    """
    if isinstance(step, StepLike):
        return step
    if callable(step) and not isinstance(step, torch.nn.Module):
        return FunctionStep(step)
    raise TypeError(
        "a step must be callable as step(state, batch) -> (state, metrics), e.g. "
        f"functrain.make_step(model, loss_fn, optimizer); got {type(step).__name__}"
    )
