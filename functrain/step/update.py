"""The step's default `update` piece: the optimizer update, fused in place, pure by copying.

A pure step (`donate=False`) copies the trainable params and the optimizer state into buffers
nobody else holds (recycled from the state of the call before, `functrain.optim.buffers`) and
then runs exactly the donating update on them, so purity is a property, not a price. The update
is the fused executor (`functrain.optim.fused`: torch's fused kernels for the whole composition)
when the optimizer has a fused form, else its own `update` with `donate=True`.

The piece is an object, not a bound method of the step, so a step knows its own default piece by
identity (`pieces.update is step.update_piece`) even in a shallow copy (`compile_step`).

Example:
    >>> piece = UpdatePiece(functrain.optim.sgd(lr=0.1), StepConfig())
    >>> state = piece(grads, state)            # a new state; the input state is untouched
"""

from __future__ import annotations

from typing import Any

import torch

from ..optim import FusedCache, apply_updates, fused_update
from ..optim._foreach import is_dtensor, placed_alike
from ..optim.buffers import BufferPool
from ..state import TrainState
from ..tree import tree_flatten, tree_unflatten
from .pieces import StepConfig

__all__ = ["UpdatePiece"]

_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


class UpdatePiece:
    """`update(grads, state, norm=None) -> state` (see the module docstring).

    Args:
        optimizer: the `functrain.optim.Transform`.
        config: the step's `StepConfig` (its `donate`).
    """

    def __init__(self, optimizer: Any, config: StepConfig):
        self.optimizer = optimizer
        self.donate = config.donate
        self._fused_cache = FusedCache()
        self._buffer_pool: BufferPool | None = None

    def __call__(
        self, grads: dict, state: TrainState, norm: torch.Tensor | None = None
    ) -> TrainState:
        """The optimizer update of `state` with `grads`.

        Args:
            grads: `{name: gradient}` of the trainable parameters.
            state: the state to update (consumed when donating).
            norm: `grads`' global norm when the step has it (its metric), so a fused global-norm
                clip does not take it a second time.
        Returns:
            the updated state.
        """
        trainable = {k: state.params[k] for k in grads}
        if torch.compiler.is_compiling():  # traced: the functional path, which inductor fuses
            updates, opt_state = self.optimizer.update(
                grads, state.opt_state, trainable, time=state.timestamp, donate=self.donate
            )
            new_params = apply_updates(trainable, updates, donate=self.donate)
            return state.replace(params={**state.params, **new_params}, opt_state=opt_state)
        params, opt_state = trainable, state.opt_state
        if not self.donate:
            params, opt_state = self.private_copies(params, opt_state)
        new_opt_state = None
        if self.can_fuse(params, grads):
            new_opt_state = fused_update(
                self.optimizer,
                grads,
                opt_state,
                params,
                norm=norm,
                # A pure step's buffers are recycled only when nothing refers to them.
                cache=self._fused_cache if self.donate else None,
                time=state.timestamp,
            )
        if new_opt_state is None:  # no fused form: the transforms' own in-place path
            updates, new_opt_state = self.optimizer.update(
                grads, opt_state, params, time=state.timestamp, donate=True
            )
            params = apply_updates(params, updates, donate=True)
        return state.replace(params={**state.params, **params}, opt_state=new_opt_state)

    def private_copies(self, params: dict, opt_state: Any) -> tuple[dict, Any]:
        """Copies of `params` and of `opt_state`'s tensors that this piece may update in place."""
        if self._buffer_pool is None:
            self._buffer_pool = BufferPool()
        leaves, spec = tree_flatten(opt_state)
        slots = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        copies = self._buffer_pool.private_copies([*params.values(), *(leaves[i] for i in slots)])
        for i, copy in zip(slots, copies[len(params) :]):
            leaves[i] = copy
        return dict(zip(params, copies)), tree_unflatten(spec, leaves)

    def can_fuse(self, params: dict, grads: dict) -> bool:
        """True when the fused executor may run: the optimizer describes itself (`spec`), and
        every parameter and gradient is a plain tensor or a DTensor placed like its parameter
        (the kernels are elementwise, so they run on each rank's local pieces without DTensor's
        per-op dispatch). The executor checks the rest (the composition, dtypes, devices) and
        declines, touching nothing, when it has no fused form."""
        if getattr(self.optimizer, "spec", None) is None or not grads:
            return False
        for name, grad in grads.items():
            param = params[name]
            if is_dtensor(param) or is_dtensor(grad):
                if not placed_alike(param, grad):
                    return False
            elif not (type(param) in _PLAIN_TENSORS and type(grad) in _PLAIN_TENSORS):
                return False
        return True
