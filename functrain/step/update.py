"""The step's default `update` piece: the optimizer update, fused in place, pure by copying.

A pure step (`donate=False`) copies the trainable params and the optimizer state into buffers
nobody else holds (recycled from the state of the call before, `functrain.optim.buffers`) and
then runs exactly the donating update on them, so purity is a property, not a price. Which path
the update takes (torch's fused kernels or the transforms' own `update`) is the optimizer's
business: `functrain.optim.executor.update_in_place` decides.

The piece is an object, not a bound method of the step, so a step knows its own default piece by
identity (`pieces.update is step.update_piece`) even in a shallow copy (`compile_step`).

Example:
    >>> piece = UpdatePiece(functrain.optim.sgd(lr=0.1), StepConfig())
    >>> state = piece(grads, state)            # a new state; the input state is untouched
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _torch
from ..optim import FusedCache, apply_updates
from ..optim.buffers import BufferPool
from ..optim.executor import update_in_place
from ..optim.keeping import keep_where, snapshot
from ..state import TrainState
from ..tree import tree_flatten, tree_unflatten
from .pieces import StepConfig

__all__ = ["UpdatePiece"]


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
        self,
        grads: dict,
        state: TrainState,
        norm: torch.Tensor | None = None,
        skip: torch.Tensor | None = None,
        transformed: bool | None = None,
    ) -> TrainState:
        """The optimizer update of `state` with `grads`.

        Args:
            grads: `{name: gradient}` of the trainable parameters.
            state: the state to update (consumed when donating).
            norm: `grads`' global norm when the step has it (its metric), so a fused global-norm
                clip does not take it a second time.
            skip: a guard's 0-d bool tensor: where True the update is discarded on the device
                (`functrain.optim.executor.update_in_place`).
            transformed: under torch.func transforms, when the caller knows (the step asks
                torch once per call); None: asked here.
        Returns:
            the updated state.
        """
        trainable = {k: state.params[k] for k in grads}
        # Traced: the functional path, which inductor fuses; under torch.func transforms (vmap
        # over stacked states): the functional path, one op per tensor, nothing in place.
        if torch.compiler.is_compiling() or (
            _torch.functorch_transforms_active() if transformed is None else transformed
        ):
            saved = None
            if skip is not None and self.donate:
                saved = snapshot((trainable, state.opt_state), pieces=False)
            updates, opt_state = self.optimizer.update(
                grads, state.opt_state, trainable, time=state.timestamp, donate=self.donate
            )
            new_params = apply_updates(trainable, updates, donate=self.donate)
            if skip is not None:  # selected out of place: the functional path stays functional
                before, after = (trainable, state.opt_state), (new_params, opt_state)
                new_params, opt_state = keep_where(skip, before, after, saved, inplace=False)
            return state.replace(params={**state.params, **new_params}, opt_state=opt_state)
        params, opt_state = trainable, state.opt_state
        if not self.donate:
            params, opt_state = self.private_copies(params, opt_state)
        params, new_opt_state = update_in_place(
            self.optimizer,
            grads,
            opt_state,
            params,
            norm=norm,
            # A pure step's buffers are recycled only when nothing refers to them.
            cache=self._fused_cache if self.donate else None,
            skip=skip,
            time=state.timestamp,
        )
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
