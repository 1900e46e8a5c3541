"""Optax-style optimizers on `torch._foreach_*` ops.

An optimizer is a `Transform(init, update)`; transforms compose with `chain`, and the updates are
added to the parameters by `apply_updates`. Every `update(grads, state, params=None, **extra)` is
pure unless `extra["donate"]` is True, in which case it may reuse the gradient and state tensors.

Example:
    >>> import torch
    >>> from functrain import optim
    >>> params = {"w": torch.ones(3)}
    >>> opt = optim.chain(optim.clip_by_global_norm(1.0), optim.adamw(1e-3))
    >>> state = opt.init(params)
    >>> updates, state = opt.update({"w": torch.ones(3)}, state, params)
    >>> params = optim.apply_updates(params, updates)
"""

from .accumulation import MultiStepsState, multi_steps
from .adam import (
    ScaleByAdamState,
    ScaleByAmsgradState,
    adam,
    adamw,
    decoupled_adamw,
    scale_by_adam,
)
from .base import (
    EmptyState,
    Transform,
    apply_updates,
    chain,
    differentiable,
    global_norm,
    identity,
)
from .clipping import adaptive_grad_clip, clip_by_global_norm, clip_by_value, unitwise_norm
from .executor import update_in_place
from .fused import FusedCache, FusedPlan, fused_plan, fused_update, why_not_fused
from .hyperparams import InjectHyperparamsState, current_lr, inject_hyperparams
from .lion import ScaleByLionState, lion, scale_by_lion
from .masking import MaskedState, masked, no_decay_mask
from .scale import (
    DecoupledWeightDecayState,
    ScaleByLearningRateState,
    add_decayed_weights,
    add_decoupled_weight_decay,
    scale,
    scale_by_learning_rate,
)
from .sgd import TraceState, decoupled_sgdw, sgd, trace

__all__ = [
    # contract and combinators
    "Transform",
    "EmptyState",
    "apply_updates",
    "chain",
    "identity",
    "masked",
    "no_decay_mask",
    "multi_steps",
    "inject_hyperparams",
    "current_lr",
    "global_norm",
    "differentiable",
    # the executor: fused kernels or the transforms' update, decided in one place
    "update_in_place",
    "FusedCache",
    "FusedPlan",
    "fused_plan",
    "fused_update",
    "why_not_fused",
    # transforms
    "scale",
    "scale_by_learning_rate",
    "add_decayed_weights",
    "add_decoupled_weight_decay",
    "trace",
    "scale_by_adam",
    "scale_by_lion",
    "clip_by_global_norm",
    "clip_by_value",
    "adaptive_grad_clip",
    "unitwise_norm",
    # optimizers
    "sgd",
    "adam",
    "adamw",
    "decoupled_sgdw",
    "decoupled_adamw",
    "lion",
    # states
    "DecoupledWeightDecayState",
    "InjectHyperparamsState",
    "MaskedState",
    "MultiStepsState",
    "ScaleByAdamState",
    "ScaleByAmsgradState",
    "ScaleByLearningRateState",
    "ScaleByLionState",
    "TraceState",
]
