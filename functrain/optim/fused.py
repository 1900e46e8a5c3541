"""The fused executor: a whole optimizer composition run with torch's fused kernels, in place.

`chain(clip_by_global_norm(1.0), adamw(lr=1e-3 * cosine(), weight_decay_mask=no_decay_mask))`
is five transforms, and run one by one they are some fifteen foreach kernels, each a pass over
all parameters. Read through their specs (`functrain.optim.spec`), they are one AdamW step:

    clip_by_global_norm     -> a `grad_scale` tensor the kernel divides the gradients by
    scale_by_adam           -> the kernel family (`torch._fused_adam_` / `torch._fused_adamw_`)
    masked weight decay     -> parameter groups, one kernel call each, with and without decay
    the lr (a schedule)     -> this step's value, evaluated as `update` would
    decoupled weight decay  -> AdamW's decay rescaled by `lr_t / initial_lr`, or a pre-pass

The recognised form, in order (any part optional except a learning rate or scale):

    [clip_by_global_norm] [L2 decay] [adam | lion | trace] [decay] lr/scale... [decoupled decay]

where each decay may be `masked(..., passthrough=True)` (the optimizers' `weight_decay_mask`), the
whole may sit in `inject_hyperparams`, and the top level may be a `masked` optimizer (only the
selected parameters train). Kernels: `torch._fused_adam_`/`_fused_adamw_` (adam, adamw,
decoupled_adamw), `torch._fused_sgd_` (sgd, decoupled_sgdw), and for Lion, which has no torch
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
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ._foreach import is_dtensor, placed_alike
from .adam import ScaleByAdamState, ScaleByAmsgradState
from .base import EmptyState
from .fused_cache import FusedCache
from .hyperparams import InjectHyperparamsState
from .kernels import run_recipe
from .lion import ScaleByLionState
from .masking import MaskedState
from .scale import DecoupledWeightDecayState, ScaleByLearningRateState
from .sgd import TraceState
from .spec import (
    AdamSpec,
    ChainSpec,
    ClipByGlobalNormSpec,
    DecoupledWeightDecaySpec,
    InjectSpec,
    LearningRateSpec,
    LionSpec,
    MaskedSpec,
    MomentumSpec,
    ScaleSpec,
    WeightDecaySpec,
)

__all__ = ["FusedCache", "FusedPlan", "NotFusable", "fused_plan", "fused_update", "why_not_fused"]

_PLAIN = (torch.Tensor, torch.nn.Parameter)
_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


class NotFusable(Exception):
    """Raised inside the planner: this composition (or these tensors) has no fused form."""


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


# -- resolving a spec against a state ------------------------------------------------------------


@dataclasses.dataclass
class _Leaf:
    """One primitive transform in the flattened composition, with its current state."""

    spec: Any
    state: Any
    mask: Any = None  # a masked decay's mask (None: every name)


def _resolve(spec: Any, state: Any, extra: Mapping[str, Any]) -> tuple[list[_Leaf], Callable]:
    """Flatten `spec` (and the matching `state`) into leaves, with a function that rebuilds the
    state tree from the leaves' new states."""

    if spec is None:
        raise NotFusable("a transform without a spec (a custom transform, clip_by_value, ...)")
    if isinstance(spec, ChainSpec):
        if not isinstance(state, tuple) or len(state) != len(spec.parts):
            raise NotFusable("the state does not match the chain")
        leaves, rebuilds, sizes = [], [], []
        for part, part_state in zip(spec.parts, state):
            sub, rebuild = _resolve(part, part_state, extra)
            leaves += sub
            rebuilds.append(rebuild)
            sizes.append(len(sub))

        def rebuild_chain(new):
            out, at = [], 0
            for rebuild, size in zip(rebuilds, sizes):
                out.append(rebuild(new[at : at + size]))
                at += size
            return tuple(out)

        return leaves, rebuild_chain
    if isinstance(spec, InjectSpec):
        if not isinstance(state, InjectHyperparamsState):
            raise NotFusable("the state is not an InjectHyperparamsState")
        values = spec.values_at(state.count, extra)
        inner = spec.build(values)
        leaves, rebuild = _resolve(getattr(inner, "spec", None), state.inner_state, extra)
        count = state.count + 1
        return leaves, lambda new: InjectHyperparamsState(count, values, rebuild(new))
    if isinstance(spec, MaskedSpec):
        if not spec.passthrough or not isinstance(state, MaskedState):
            raise NotFusable("masked(..., passthrough=False) inside a composition")
        if not isinstance(spec.inner, (WeightDecaySpec, DecoupledWeightDecaySpec)):
            raise NotFusable("masked(..., passthrough=True) of something other than a decay")
        _check_state(spec.inner, state.inner_state)
        leaf = _Leaf(spec.inner, state.inner_state, mask=spec.mask)
        return [leaf], lambda new: MaskedState(new[0])
    _check_state(spec, state)
    return [_Leaf(spec, state)], lambda new: new[0]


_STATE_OF = {
    LionSpec: ScaleByLionState,
    MomentumSpec: TraceState,
    LearningRateSpec: ScaleByLearningRateState,
    DecoupledWeightDecaySpec: DecoupledWeightDecayState,
    ScaleSpec: EmptyState,
    WeightDecaySpec: EmptyState,
    ClipByGlobalNormSpec: EmptyState,
}


def _check_state(spec: Any, state: Any) -> None:

    kind: type
    if isinstance(spec, AdamSpec):
        kind = ScaleByAmsgradState if spec.amsgrad else ScaleByAdamState
    elif type(spec) in _STATE_OF:
        kind = _STATE_OF[type(spec)]
    else:
        raise NotFusable(f"no fused form for {type(spec).__name__}")
    if type(state) is not kind:
        raise NotFusable(f"{type(spec).__name__} with a {type(state).__name__} state")


# -- the recognised form -------------------------------------------------------------------------


@dataclasses.dataclass
class _Recipe:
    """The composition as one optimizer step."""

    leaves: list[_Leaf]  # all of them, in the composition's order
    core: _Leaf | None = None  # adam, lion or trace; None: plain SGD
    clip: _Leaf | None = None
    decay: _Leaf | None = None
    decay_kind: str = ""  # "l2" (before the core), "coupled" (times lr), "decoupled" (after lr)
    scales: list[_Leaf] = dataclasses.field(default_factory=list)
    inert: list[_Leaf] = dataclasses.field(default_factory=list)  # decays of 0: state only


def _recipe(leaves: list[_Leaf]) -> _Recipe:
    recipe = _Recipe(leaves)
    phase = 0  # 0: before the core, 1: after the core, 2: after a scale
    for index, leaf in enumerate(leaves):
        spec = leaf.spec
        if isinstance(spec, ClipByGlobalNormSpec):
            if index != 0:
                raise NotFusable("clip_by_global_norm anywhere but first")
            recipe.clip = leaf
        elif isinstance(spec, (AdamSpec, LionSpec, MomentumSpec)):
            if phase != 0 or recipe.core is not None:
                raise NotFusable(f"{type(spec).__name__} after another core or a scale")
            recipe.core, phase = leaf, 1
        elif isinstance(spec, (LearningRateSpec, ScaleSpec)):
            recipe.scales.append(leaf)
            phase = 2
        elif isinstance(spec, (WeightDecaySpec, DecoupledWeightDecaySpec)):
            if spec.weight_decay == 0.0:
                recipe.inert.append(leaf)
                continue
            kind = _decay_kind(spec, phase)
            if recipe.decay is not None:
                raise NotFusable("two weight decays")
            recipe.decay, recipe.decay_kind = leaf, kind
        else:  # pragma: no cover - _check_state admits only the kinds above
            raise NotFusable(f"no fused form for {type(spec).__name__}")
    if not recipe.scales:
        raise NotFusable("no learning rate or scale")
    if recipe.core is None and recipe.decay_kind == "coupled":
        recipe.decay_kind = "l2"  # plain SGD: decay before or after the (absent) core is one
    return recipe


def _decay_kind(spec: Any, phase: int) -> str:
    if isinstance(spec, DecoupledWeightDecaySpec):
        if phase != 2:
            raise NotFusable("decoupled weight decay before the learning rate")
        return "decoupled"
    if phase == 2:
        raise NotFusable("add_decayed_weights after the learning rate")
    return "l2" if phase == 0 else "coupled"


# -- the tensors ---------------------------------------------------------------------------------


def _selected(mask: Any, names: list[str], source: Mapping[str, Any]) -> set[str]:
    values = mask(source) if callable(mask) else mask
    missing = [k for k in names if k not in values]
    if missing:
        raise NotFusable(f"the mask has no entry for {missing[:5]}")  # update() says it clearly
    return {k for k in names if bool(values[k])}


def _local(x: torch.Tensor) -> torch.Tensor:
    return x._local_tensor if is_dtensor(x) else x


def _pieces(tensors: list[Any]) -> list[torch.Tensor] | None:
    """The local tensors a kernel can run on (a parameter, its gradient, its moments), or None
    when they do not line up."""
    for t in tensors:
        if type(t) not in _PLAIN:
            param = tensors[0]
            if not all(is_dtensor(x) and placed_alike(param, x) for x in tensors):
                return None
            tensors = [_local(x) for x in tensors]
            break
    dtype, device = tensors[0].dtype, tensors[0].device
    if dtype not in _FLOATS:
        return None
    for t in tensors:
        if t.dtype != dtype or t.device != device:
            return None
    # The kernels walk each tensor's memory as one flat array, so a parameter and its moments
    # must be dense and laid out alike (the gradient, tensors[1], is checked on every call).
    param = tensors[0]
    if not dense(param) or not all(same_layout(t, param) for t in tensors[2:]):
        return None
    return tensors


def dense(t: torch.Tensor) -> bool:
    """True when `t`'s elements fill its memory exactly once, in some order of its dimensions
    (contiguous, channels-last, a transposed contiguous tensor; not a slice with a step)."""
    expected = 1
    for stride, size in sorted((s, n) for s, n in zip(t.stride(), t.shape) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when `a` and `b` (of one shape) have the same strides, except on dimensions of size
    1, where a stride says nothing."""
    return all(x == y or n == 1 for x, y, n in zip(a.stride(), b.stride(), a.shape))


def _grads_laid_out_like_params(groups: dict) -> None:
    """Give each group's gradient column its parameter's memory layout, copying where they
    differ.

    Why: the kernels index a gradient's memory as if it were laid out like its parameter. A
    gradient that is not (`torch.bmm(x, w.transpose(1, 2))` gives a 3-D weight a transposed
    one) would silently get wrong updates, so it is copied; the gradients are the executor's to
    overwrite. A gradient of another dtype or device has no fused form.

    Raises:
        NotFusable: a gradient's dtype or device differs from its parameter's.
    """
    for columns in groups.values():
        params, grads = columns[0], columns[1]
        for i, (param, grad) in enumerate(zip(params, grads)):
            if grad.dtype != param.dtype or grad.device != param.device:
                raise NotFusable("a gradient of another dtype or device than its parameter")
            if not same_layout(grad, param):
                grads[i] = torch.empty_like(param).copy_(grad)


def _moment_trees(recipe: _Recipe) -> list[Any]:
    core = recipe.core
    if core is None:
        return []
    if isinstance(core.spec, AdamSpec):
        trees = [core.state.mu, core.state.nu]
        return trees + ([core.state.nu_max] if core.spec.amsgrad else [])
    if isinstance(core.spec, LionSpec):
        return [core.state.mu]
    return [core.state.momentum]


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
        keep = _selected(spec.mask, names, params)
        names = [k for k in names if k in keep]
        params = {k: params[k] for k in names}  # what `masked` shows its inner transform
        spec, state, wrap = spec.inner, state.inner_state, MaskedState
    leaves, rebuild = _resolve(spec, state, extra)
    recipe = _recipe(leaves)
    moments = _moment_trees(recipe)
    for tree in moments:
        if (
            not isinstance(tree, Mapping)
            or len(tree) != len(names)
            or any(k not in tree for k in names)
        ):
            raise NotFusable("the optimizer state covers other names than the gradients")
    trees = [grads, *moments]
    # What the grouping depends on besides the tensors: whether a decay runs, and its mask.
    decision = (recipe.decay is not None, None if recipe.decay is None else recipe.decay.mask)
    layout = None if cache is None else cache.lookup(params, moments, names, decision)
    if layout is None:
        layout = _group_layout(recipe, names, params, trees)
        if cache is not None:
            cache.store(params, moments, names, decision, layout)
    groups = {key: _columns(group, [params, *trees], local) for key, group, local in layout}
    _grads_laid_out_like_params(groups)
    if wrap is not None:
        inner_rebuild = rebuild

        def rebuild(new):
            return wrap(inner_rebuild(new))

    return recipe, groups, rebuild, names


def _group_layout(recipe: _Recipe, names: list[str], params: Mapping, trees: list) -> list:
    """`[(group key, names, DTensor pieces)]`: which kernel call updates each parameter.

    Raises:
        NotFusable: a parameter's tensors (it, its gradient, its moments) do not line up.
    """
    decay_on = recipe.decay is not None
    decayed = None
    if recipe.decay is not None and recipe.decay.mask is not None:
        decayed = _selected(recipe.decay.mask, names, params)
    groups: dict[tuple, tuple[list[str], bool]] = {}
    for name in names:
        tensors = [params[name], *[tree[name] for tree in trees]]
        pieces = _pieces(tensors)
        if pieces is None:
            raise NotFusable(f"{name!r}: tensors of mixed kinds, dtypes or devices")
        first = pieces[0]
        key = (decay_on and (decayed is None or name in decayed), first.device, first.dtype)
        group = groups.get(key)
        if group is None:
            group = groups[key] = ([], pieces[0] is not tensors[0])
        group[0].append(name)
    return [(key, group, local) for key, (group, local) in groups.items()]


def _columns(names: list[str], trees: list, local: bool) -> list[list[torch.Tensor]]:
    """The kernel's tensor lists for one group: a column per tree (params, grads, moments)."""
    if local:
        return [[_local(tree[name]) for name in names] for tree in trees]
    return [[tree[name] for name in names] for tree in trees]


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


def _describe(recipe: _Recipe, groups: dict, tensors: int) -> FusedPlan:
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
    new_leaf_states = run_recipe(recipe, groups, [grads[k] for k in names], extra, norm)
    return rebuild(new_leaf_states)
