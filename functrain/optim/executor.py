"""The one optimizer executor: an update applied in place, fused where it can be, and where it
cannot, the transforms' own `update`.

`update_in_place(transform, grads, state, params)` is `transform.update` followed by
`apply_updates`, both on tensors the caller owns (it overwrites `params`, the state's tensors and
`grads`). Which path runs is decided here, and only here:

- the fused executor (`functrain.optim.fused`: torch's fused kernels for the whole composition)
  when the transform describes itself (`Transform.spec`), every parameter and gradient is a
  plain tensor or a DTensor placed like its parameter, and the composition and tensors have a
  fused form (the executor declines, touching nothing, when they do not);
- otherwise the transforms' `update(..., donate=True)` and `apply_updates(..., donate=True)`;
- under `torch.compile` tracing, always the latter: inductor fuses the foreach math itself.

Both paths give the same parameters and states (`tests/optim/test_optim_executor.py` checks it
over random compositions), so a caller (the step) need not know which ran.

Example:
    >>> params, state = update_in_place(adamw(1e-3), grads, state, params, time=timestamp)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ._foreach import is_dtensor, placed_alike
from .base import apply_updates
from .fused import fused_update
from .fused_cache import FusedCache
from .keeping import keep_where, snapshot

__all__ = ["may_fuse", "update_in_place"]

_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def update_in_place(
    transform: Any,
    grads: Any,
    state: Any,
    params: Any,
    *,
    norm: torch.Tensor | None = None,
    cache: FusedCache | None = None,
    skip: torch.Tensor | None = None,
    **extra: Any,
) -> tuple[Any, Any]:
    """One optimizer update applied to `params`, in place: `(new params, new state)`.

    Args:
        transform: a `functrain.optim.Transform`.
        grads: the gradients, `{name: tensor}` (overwritten).
        state: `transform`'s state (its tensors are overwritten).
        params: the parameters the gradients are for (overwritten; a dict may cover more names).
        norm: `grads`' global norm when the caller has it already, so a fused global-norm clip
            does not take it a second time.
        cache: a `FusedCache` that keeps the fused grouping between calls on the same tensors.
        skip: a 0-d bool tensor a guard decided on the device: where True, `params` and the
            state keep their values (the fused kernels write nothing; the transforms' path runs
            on and is undone from a copy) and the state's numbers become 0-d tensors holding
            the old ones (`functrain.optim.keeping`). Nothing is read on the host.
        **extra: as for `update` (`time=` a Timestamp for schedules).
    Returns:
        `(params, state)`: the updated parameters (the same tensors where updated in place) and
        the new state, with exactly the structure `transform.update` returns.
    Example:
        >>> params, state = update_in_place(sgd(0.1), grads, state, params)
    """
    if not torch.compiler.is_compiling() and may_fuse(transform, params, grads):
        new_state = fused_update(
            transform, grads, state, params, norm=norm, cache=cache, skip=skip, **extra
        )
        if new_state is not None:
            return params, new_state
    extra.pop("donate", None)
    saved = None if skip is None else snapshot((params, state))
    updates, new_state = transform.update(grads, state, params, donate=True, **extra)
    new_params = apply_updates(params, updates, donate=True)
    if skip is None:
        return new_params, new_state
    return keep_where(skip, (params, state), (new_params, new_state), saved)


def may_fuse(transform: Any, params: Any, grads: Any) -> bool:
    """True when the fused executor may be tried: `transform` describes itself (`spec`), and
    every gradient and its parameter are plain tensors, or DTensors placed alike (the kernels are
    elementwise, so they run on each rank's local pieces without DTensor's per-op dispatch). The
    fused executor checks the rest (the composition, dtypes, devices, layouts).

    Example:
        >>> may_fuse(adamw(1e-3), {"w": torch.zeros(2)}, {"w": torch.ones(2)})
        True
    """
    if getattr(transform, "spec", None) is None or not isinstance(grads, Mapping) or not grads:
        return False
    if not isinstance(params, Mapping):
        return False
    for name, grad in grads.items():
        param = params.get(name)
        if type(param) in _PLAIN_TENSORS and type(grad) in _PLAIN_TENSORS:
            continue  # the common case, decided by two type lookups
        if param is None or not (is_dtensor(param) or is_dtensor(grad)):
            return False
        if not placed_alike(param, grad):
            return False
    return True
