"""The kernels behind the fused executor (`functrain.optim.fused`): one step of a recognised
composition, in place, with torch's fused optimizer kernels.

`run_recipe` evaluates the step's hyperparameters exactly as the transforms' `update` does (the
lr at `extra["time"]` or the transform's own count, the decoupled decay's ratio), runs one kernel
call per parameter group, and returns each primitive transform's new state.

    adam core   `_fused_adam_` (no decay, or L2 before the core) / `_fused_adamw_`
                (decay times the lr, or a decoupled decay folded in as wd * ratio / lr)
    sgd core    `_fused_sgd_` (momentum, dampening, Nesterov, L2); a decay applied after
                the momentum is a pre-pass `params *= 1 - decay`
    lion core   five in-place foreach passes (torch has no Lion kernel)

The kernels are torch's private names, reached through `functrain._torch`.

A global-norm clip is the kernels' `grad_scale` (they divide the gradients by it), except where
no kernel takes one (Lion) or float32 would round it (float64 parameters): there the gradients
are scaled first, as `clip_by_global_norm` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .. import _torch
from .adam import ScaleByAdamState, ScaleByAmsgradState
from .base import global_norm
from .keeping import found_inf
from .lion import ScaleByLionState
from .scale import next_decay_state, next_lr_state
from .sgd import TraceState
from .spec import AdamSpec, DecoupledWeightDecaySpec, LionSpec, MomentumSpec, ScaleSpec


def run_recipe(
    recipe: Any,
    groups: dict,
    grads: list[Any],
    extra: Mapping[str, Any],
    norm: torch.Tensor | None = None,
    skip: torch.Tensor | None = None,
) -> list:
    """Evaluate this step's hyperparameters, run the kernels, and advance every leaf's state.

    `norm` is `grads`' global norm when the caller has it (else a clip takes it here). `skip`, a
    0-d bool tensor, is handed to the Adam and SGD kernels as their `found_inf`: where it is
    True they write nothing (`kernels_honour_skip` says when that is all that runs); the states
    returned are advanced all the same (the caller selects them, `functrain.optim.keeping`).
    """

    multiplier, new_states = 1.0, {}
    for leaf in recipe.scales:
        if isinstance(leaf.spec, ScaleSpec):
            multiplier *= leaf.spec.factor
            new_states[id(leaf)] = leaf.state
        else:
            new_states[id(leaf)] = next_lr_state(leaf.spec.lr, leaf.state, extra)
            multiplier *= leaf.spec.sign * new_states[id(leaf)].lr
    for leaf in [recipe.decay, *recipe.inert]:
        if leaf is not None and isinstance(leaf.spec, DecoupledWeightDecaySpec):
            new_states[id(leaf)] = next_decay_state(leaf.spec.lr, leaf.spec.base, leaf.state, extra)
        elif leaf is not None:
            new_states[id(leaf)] = leaf.state
    grad_scale: torch.Tensor | None = None
    clip_factor: torch.Tensor | None = None
    if recipe.clip is not None:
        new_states[id(recipe.clip)] = recipe.clip.state
        max_norm = recipe.clip.spec.max_norm
        if norm is None:
            norm = global_norm(grads)
        # The kernels divide by grad_scale: max(norm, max_norm) / max_norm is exactly 1.0 below
        # the threshold, as clip_by_global_norm's factor is.
        clamped = torch.clamp(norm, min=max_norm)
        grad_scale = clamped / max_norm
        if (
            recipe.core is not None
            and isinstance(recipe.core.spec, LionSpec)
            or any(dtype == torch.float64 for _, _, dtype in groups)
        ):  # the factor itself is needed only where no kernel takes a gradient scale
            clip_factor = torch.full_like(norm, max_norm) / clamped
    lr = -multiplier  # the kernels descend: param -= lr * direction
    decay = recipe.decay
    wd, decoupled = 0.0, 0.0
    if decay is not None:
        if recipe.decay_kind == "decoupled":
            decoupled = decay.spec.weight_decay * new_states[id(decay)].factor
        else:
            wd = decay.spec.weight_decay
    core = recipe.core
    for (decayed, device, dtype), columns in groups.items():
        scale = None if grad_scale is None else grad_scale.to(device, torch.float32)
        prescaled = False  # the gradients already carry the clipping factor
        if scale is not None and dtype == torch.float64:
            # The kernels read their gradient scale as float32, which would round a float64
            # run's clipping: scale the gradients in float64 instead (one more pass).
            assert clip_factor is not None  # set with grad_scale
            _torch.foreach("mul", inplace=True)(columns[1], clip_factor.to(device))
            scale, prescaled = None, True
        group_wd, group_decoupled = (wd, decoupled) if decayed else (0.0, 0.0)
        if core is not None and isinstance(core.spec, AdamSpec):
            _adam(
                core, columns, lr, group_wd, group_decoupled, recipe.decay_kind, scale, device,
                None if skip is None else found_inf(skip, device),
            )  # fmt: skip
        elif core is not None and isinstance(core.spec, LionSpec):
            # not twice: a float64 group's gradients were scaled above
            lion_clip = None if clip_factor is None or prescaled else clip_factor.to(device)
            _lion(core.spec, columns, lr, group_wd, group_decoupled, recipe.decay_kind, lion_clip)
        else:
            _sgd(
                core, columns, lr, group_wd, group_decoupled, recipe.decay_kind, scale,
                None if skip is None else found_inf(skip, device),
            )  # fmt: skip
    if core is not None:
        count = core.state.count + 1
        if isinstance(core.spec, AdamSpec):
            kind = ScaleByAmsgradState if core.spec.amsgrad else ScaleByAdamState
            new_states[id(core)] = kind(count, *core.state[1:])
        elif isinstance(core.spec, LionSpec):
            new_states[id(core)] = ScaleByLionState(count, core.state.mu)
        else:
            new_states[id(core)] = TraceState(count, core.state.momentum)
    return [new_states[id(leaf)] for leaf in recipe.leaves]


def _kernel(name: str) -> Any:
    kernel = _torch.fused_optimizer_kernel(name)
    if kernel is None:  # the planner runs before a tensor is touched; this torch lacks it
        raise NotImplementedError(
            f"torch {torch.__version__} has no fused {name} kernel; functrain needs a torch "
            "that has it (see pyproject.toml's declared range)"
        )
    return kernel


def _prescale(params: list[torch.Tensor], factor: float) -> None:
    if factor != 1.0:
        _torch.foreach("mul", inplace=True)(params, factor)


def kernels_honour_skip(recipe: Any) -> bool:
    """True when a skip handed to `run_recipe` leaves every tensor untouched by itself: torch's
    Adam or SGD kernel alone writes them (no Lion passes, no decay pre-pass on the params)."""
    core = recipe.core
    if core is not None and isinstance(core.spec, LionSpec):
        return False
    if core is not None and isinstance(core.spec, AdamSpec):
        return recipe.decay_kind != "decoupled"  # at lr 0 it is a pre-pass
    return recipe.decay_kind not in ("coupled", "decoupled")


def _step_tensor(count: Any, device: Any) -> torch.Tensor:
    """Adam's bias-correction step `count + 1` as the kernels read it (float32, on `device`);
    a count a device-decided skip left as a tensor stays on the device."""
    if isinstance(count, torch.Tensor):
        return (count + 1).to(device=device, dtype=torch.float32)
    return torch.full((), float(count + 1), device=device)


def _adam(core, columns, lr, wd, decoupled, kind, grad_scale, device, skip=None) -> None:
    spec = core.spec
    params, grads, mu, nu = columns[:4]
    nu_max = columns[4] if spec.amsgrad else []
    weight_decay = wd
    if kind == "decoupled" and decoupled:
        if lr != 0.0:  # AdamW's decay is lr * wd: fold the decoupled factor into it
            weight_decay = decoupled / lr
        else:
            _prescale(params, 1.0 - decoupled)
    kernel = _kernel("adam" if kind in ("", "l2") else "adamw")
    step = _step_tensor(core.state.count, device)
    kernel(
        params,
        grads,
        mu,
        nu,
        nu_max,
        [step] * len(params),
        lr=lr,
        beta1=spec.b1,
        beta2=spec.b2,
        weight_decay=weight_decay,
        eps=spec.eps,
        amsgrad=spec.amsgrad,
        maximize=False,
        grad_scale=grad_scale,
        found_inf=skip,
    )


def _sgd(core, columns, lr, wd, decoupled, kind, grad_scale, skip=None) -> None:
    params, grads = columns[:2]
    buffers = columns[2] if core is not None else []
    if kind == "coupled":  # after the momentum, times the lr: a multiplicative decay
        _prescale(params, 1.0 - lr * wd)
        wd = 0.0
    elif kind == "decoupled":
        _prescale(params, 1.0 - decoupled)
    spec = core.spec if core is not None else MomentumSpec(0.0, False, 0.0)
    _kernel("sgd")(
        params,
        grads,
        buffers,
        weight_decay=wd if kind == "l2" else 0.0,
        momentum=spec.decay,
        lr=lr,
        dampening=spec.dampening,
        nesterov=spec.nesterov,
        maximize=False,
        # A count a device-decided skip left as a tensor is read here (SGD with momentum only).
        is_first_step=core is None or bool(core.state.count == 0),
        grad_scale=grad_scale,
        found_inf=skip,
    )


def _lion(spec: LionSpec, columns, lr, wd, decoupled, kind, clip_factor) -> None:
    params, grads, mu = columns
    if clip_factor is not None:  # no kernel to hand a gradient scale to: clip as the chain does
        _torch.foreach("mul", inplace=True)(grads, clip_factor)
    if kind == "l2" and wd:
        _torch.foreach("add", inplace=True)(grads, params, alpha=wd)
    direction = list(_torch.foreach("lerp")(mu, grads, 1.0 - spec.b1))
    _torch.foreach("sign", inplace=True)(direction)
    _torch.foreach("lerp", inplace=True)(mu, grads, 1.0 - spec.b2)
    if kind == "coupled":
        _prescale(params, 1.0 - lr * wd)
    elif kind == "decoupled":
        _prescale(params, 1.0 - decoupled)
    _torch.foreach("add", inplace=True)(params, direction, alpha=-lr)
