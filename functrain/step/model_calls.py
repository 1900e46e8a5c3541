"""`ModelCalls`: the one way functrain shares a model's forward passes between several uses.

Evaluation computes the loss and the metrics from one forward pass; label smoothing, MixUp and
CutMix call the user's `loss_fn` once per target but run the model once. Both hand the user's
function a `ModelCalls` in place of the model, with one rule:

    The calls are recorded in order. After `replay()`, the k-th call returns the k-th recorded
    outputs when its arguments are the same objects as that call's (tensors by identity, plain
    values by equality); any other call runs the model.

So a `loss_fn` that calls the model twice (two dropout masks, a second input) gets two real
forward passes while recording, and each rerun reuses them in the same order. Arguments are
compared by identity, never by value: no device sync, and predictable — pass the batch's own
tensors (`model(batch[0])`) to share a pass. The recorded arguments are kept alive, so an
identity is never mistaken for that of a freed object.

Example:
    >>> calls = ModelCalls(model)
    >>> loss = loss_fn(calls, batch)          # runs the model
    >>> calls.replay()
    >>> outputs = calls(batch[0])             # the outputs loss_fn saw, no second pass
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["ModelCalls"]


class ModelCalls:
    """Records a model's calls and replays them by position (see the module docstring).

    Args:
        call: what runs the model, `call(*args, **kwargs) -> outputs`.
        module: where attribute lookups (`model.config`, `model.training`) go; default `call`.
    """

    def __init__(self, call: Callable[..., Any], module: Any = None):
        self._call = call
        self._module = call if module is None else module
        self._calls: list[tuple[tuple, dict, Any]] = []
        self._cursor: int | None = None  # None while recording

    def replay(self) -> None:
        """Start replaying from the first recorded call."""
        self._cursor = 0

    def reset(self) -> None:
        """Forget every recorded call and record again (a new batch)."""
        self._calls.clear()
        self._cursor = None

    @property
    def recorded(self) -> int:
        """How many calls were recorded."""
        return len(self._calls)

    def first_outputs(self) -> Any:
        """The outputs of the first recorded call.

        Raises:
            RuntimeError: when nothing called the model.
        """
        if not self._calls:
            raise RuntimeError(
                "the loss function never called the model, so its outputs are unknown; call "
                "model(...) inside loss_fn"
            )
        return self._calls[0][2]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._cursor is None:
            out = self._call(*args, **kwargs)
            self._calls.append((args, kwargs, out))
            return out
        index = self._cursor
        self._cursor += 1
        if index < len(self._calls):
            rec_args, rec_kwargs, out = self._calls[index]
            if same_objects(args, rec_args) and same_objects(kwargs, rec_kwargs):
                return out
        return self._call(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names not set in __init__: the model's own attributes.
        return getattr(self.__dict__["_module"], name)


def same_objects(a: Any, b: Any) -> bool:
    """True when `a` and `b` are the same call arguments: tensors the same objects, containers
    alike, other values equal. A plain recursion, so that it traces cleanly under compile."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return False
    if type(a) is not type(b):
        return False
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(map(same_objects, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_objects(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - equality that is not a bool (arrays): different
        return False
