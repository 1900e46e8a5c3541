"""The fused executor: a whole optimizer composition run with torch's fused kernels, in place.

`chain(clip_by_global_norm(1.0), adamw(lr=1e-3 * cosine(), weight_decay_mask=no_decay_mask))`
is five transforms, and run one by one they are some fifteen foreach kernels, each a pass over
all parameters. Read through their specs (`functrain.optim.spec`), they are one AdamW step:

    clip_by_global_norm     -> a `grad_scale` tensor the kernel divides the gradients by
    scale_by_adam           -> the kernel family (`_fused_adam_` / `_fused_adamw_`)
    masked weight decay     -> parameter groups, one kernel call each, with and without decay
    the lr (a schedule)     -> this step's value, evaluated as `update` would
    decoupled weight decay  -> AdamW's decay rescaled by `lr_t / initial_lr`, or a pre-pass

The recognised form, in order (any part optional except a learning rate or scale):

    [clip_by_global_norm] [L2 decay] [adam | lion | trace] [decay] lr/scale... [decoupled decay]

where each decay may be `masked(..., passthrough=True)` (the optimizers' `weight_decay_mask`), the
whole may sit in `inject_hyperparams`, and the top level may be a `masked` optimizer (only the
selected parameters train). Kernels: torch's `_fused_adam_`/`_fused_adamw_` (adam, adamw,
decoupled_adamw), `_fused_sgd_` (sgd, decoupled_sgdw), and for Lion, which has no torch
kernel, five in-place foreach passes. Anything else (a custom transform, `clip_by_value`,
`multi_steps`, ...) is not fused: `fused_update` returns None, having touched nothing, and the
caller runs the transform's `update`.

The executor works **in place**: it overwrites the parameters, the optimizer state's tensors and
the gradients it is given (the step owns all three; a pure step gives it private copies, see
`functrain.optim.buffers`). It returns the new state, with exactly the structure `update` returns.

Example:
    >>> opt = chain(clip_by_global_norm(1.0), adamw(1e-3, weight_decay_mask=no_decay_mask))
    >>> print(fused_plan(opt, params))
    _fused_adamw_ x2 groups (decay on 1 of 2 tensors), global-norm clip folded in
    >>> state = fused_update(opt, grads, opt.init(params), params)   # params moved in place
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from .fused_cache import FusedCache
from .fused_groups import columns_of, grads_laid_out_like_params, group_layout, selected
from .keeping import keep_where, snapshot
from .kernels import kernels_honour_skip, run_recipe
from .masking import MaskedState
from .recipe import NotFusable, Recipe, moment_trees, recipe_of, resolve
from .spec import AdamSpec, LionSpec, MaskedSpec

__all__ = ["FusedCache", "FusedPlan", "NotFusable", "fused_plan", "fused_update", "why_not_fused"]


@dataclasses.dataclass(frozen=True)
class FusedPlan:
    """What the executor runs for one update: the kernel, its groups, and the extra passes.

    Attributes:
        kernel: "_fused_adam_", "_fused_adamw_", "_fused_sgd_" or "lion (foreach)".
        groups: kernel calls (one per decay setting, device and dtype).
        decayed: how many tensors get weight decay, of `tensors`.
        tensors: how many tensors are updated.
        clip: the global-norm clip runs as the kernel's gradient scale.
        prepasses: in-place passes before the kernel (e.g. "params *= 1 - wd*lr_t/initial_lr").
    """

    kernel: str
    groups: int
    decayed: int
    tensors: int
    clip: bool
    prepasses: tuple[str, ...] = ()

    def __str__(self) -> str:
        text = f"{self.kernel} x{self.groups} group{'s' if self.groups != 1 else ''}"
        if self.decayed not in (0, self.tensors):
            text += f" (decay on {self.decayed} of {self.tensors} tensors)"
        if self.clip:
            text += ", global-norm clip folded in"
        for p in self.prepasses:
            text += f", pre-pass {p}"
        return text


# -- planning and running ------------------------------------------------------------------------


def _prepare(
    transform: Any,
    grads: Any,
    state: Any,
    params: Any,
    extra: Mapping[str, Any],
    cache: FusedCache | None = None,
):
    """Everything decided before a tensor is touched: `(recipe, groups, rebuild, names)`."""
    spec = getattr(transform, "spec", None)
    if not isinstance(grads, Mapping) or not isinstance(params, Mapping):
        raise NotFusable("gradients and params must be {name: tensor} dicts")
    names = list(grads)
    missing = [k for k in names if k not in params]
    if missing:
        raise NotFusable(f"params lack {missing[:5]}")
    wrap = None
    if isinstance(spec, MaskedSpec) and not spec.passthrough:  # a masked optimizer
        if not isinstance(state, MaskedState):
            raise NotFusable("the state is not a MaskedState")
        keep = selected(spec.mask, names, params)
        names = [k for k in names if k in keep]
        params = {k: params[k] for k in names}  # what `masked` shows its inner transform
        spec, state, wrap = spec.inner, state.inner_state, MaskedState
    leaves, rebuild = resolve(spec, state, extra)
    recipe = recipe_of(leaves)
    moments = moment_trees(recipe)
    wanted = set(names)  # one set comparison per tree: this runs on every step
    for tree in moments:
        if not isinstance(tree, Mapping) or len(tree) != len(wanted) or tree.keys() != wanted:
            raise NotFusable("the optimizer state covers other names than the gradients")
    trees = [grads, *moments]
    # What the grouping depends on besides the tensors: whether a decay runs, and its mask.
    decision = (recipe.decay is not None, None if recipe.decay is None else recipe.decay.mask)
    layout = None if cache is None else cache.lookup(params, moments, names, decision)
    if layout is None:
        layout = group_layout(recipe, names, params, trees)
        if cache is not None:
            cache.store(params, moments, names, decision, layout)
    groups = {key: columns_of(group, [params, *trees], local) for key, group, local, _ in layout}
    grads_laid_out_like_params(groups, layout)
    if wrap is not None:
        inner_rebuild = rebuild

        def rebuild(new):
            return wrap(inner_rebuild(new))

    return recipe, groups, rebuild, names


def why_not_fused(transform: Any, params: Mapping[str, torch.Tensor]) -> str | None:
    """Why `transform` would not run fused on `params` (None: it would).

    Example:
        >>> why_not_fused(chain(clip_by_value(1.0), sgd(0.1)), params)
        'a transform without a spec (a custom transform, clip_by_value, ...)'
    """
    try:
        _plan_for(transform, params)
    except NotFusable as reason:
        return str(reason)
    return None


def fused_plan(transform: Any, params: Mapping[str, torch.Tensor]) -> FusedPlan | None:
    """The plan the executor would run for `transform` on `params` (None: not fusable).

    Args:
        transform: a `Transform`.
        params: `{name: tensor}` (their gradients are taken to be alike).
    Returns:
        a `FusedPlan` (printable), or None; `why_not_fused` says why.
    Example:
        >>> str(fused_plan(adamw(1e-3), {"w": torch.zeros(3)}))
        '_fused_adamw_ x1 group'
    """
    try:
        return _plan_for(transform, params)
    except NotFusable:
        return None


def _plan_for(transform: Any, params: Mapping[str, torch.Tensor]) -> FusedPlan:
    from ..units import Timestamp

    state = transform.init(params)
    grads = {k: torch.zeros_like(v) for k, v in params.items()}
    try:
        recipe, groups, _, names = _prepare(transform, grads, state, params, {})
    except ValueError:  # a schedule in epochs or "dur": evaluate it as at a run's start
        time = Timestamp(batches_per_epoch=1, max_batches=1)
        recipe, groups, _, names = _prepare(transform, grads, state, params, {"time": time})
    return _describe(recipe, groups, len(names))


def _describe(recipe: Recipe, groups: dict, tensors: int) -> FusedPlan:
    prepasses = []
    core = recipe.core.spec if recipe.core is not None else None
    if isinstance(core, AdamSpec):
        kernel = "_fused_adam_" if recipe.decay_kind in ("", "l2") else "_fused_adamw_"
    elif isinstance(core, LionSpec):
        kernel = "lion (foreach)"
    else:
        kernel = "_fused_sgd_"
        if recipe.decay_kind in ("coupled", "decoupled"):
            prepasses.append("params *= 1 - decay")
    decayed = sum(len(cols[0]) for (decay, _, _), cols in groups.items() if decay)
    return FusedPlan(
        kernel, len(groups), decayed, tensors, recipe.clip is not None, tuple(prepasses)
    )


def fused_update(
    transform: Any,
    grads: Any,
    state: Any,
    params: Any,
    *,
    norm: torch.Tensor | None = None,
    cache: FusedCache | None = None,
    skip: torch.Tensor | None = None,
    **extra: Any,
) -> Any:
    """Run `transform`'s update with fused kernels, in place; None when it has no fused form.

    Gives the result of `update` + `apply_updates` up to float rounding. The parameters, the
    state's tensors and the gradients are overwritten; on None nothing was touched.

    Args:
        transform: a `Transform` (its `spec` is read).
        grads: `{name: tensor}`.
        state: its state (from `transform.init`).
        params: `{name: tensor}` covering the gradients' names; updated in place.
        norm: the global norm of `grads`, when the caller has it already (the step's
            `grad_norm` metric): a global-norm clip then does not take it again.
        cache: a `FusedCache` that keeps the parameter grouping between calls (optional).
        skip: a 0-d bool tensor decided on the device: where True, the parameters and the
            state's tensors keep their values (the kernels' `found_inf`, else a copy taken
            first) and the state's numbers their old values (as 0-d tensors, see
            `functrain.optim.keeping`); no host read.
        **extra: as for `update` (`time=` a Timestamp for schedules).
    Returns:
        the new state (same structure as `update`'s), or None.
    Example:
        >>> state = fused_update(adamw(1e-3), grads, state, params)
    """
    try:
        recipe, groups, rebuild, names = _prepare(transform, grads, state, params, extra, cache)
    except NotFusable:
        return None
    # The clip's norm is over what the transform sees (a masked optimizer: its names only).
    if norm is not None and len(names) != len(grads):
        norm = None
    if skip is None:
        return rebuild(run_recipe(recipe, groups, [grads[k] for k in names], extra, norm))
    # What the kernels overwrite and would not leave alone on a skip: copied first.
    written = [t for cols in groups.values() for i, col in enumerate(cols) if i != 1 for t in col]
    saved = None if kernels_honour_skip(recipe) else snapshot(written)
    new_leaf_states = run_recipe(recipe, groups, [grads[k] for k in names], extra, norm, skip)
    if saved is not None:
        keep_where(skip, written, written, saved)
    return keep_where(skip, state, rebuild(new_leaf_states))
