"""A composition read as one optimizer step: the fused executor's recipe.

`resolve` flattens a transform's spec (`functrain.optim.spec`) and its state into primitive
leaves (adam, lion or trace; a clip; decays; learning rates and scales), each with its current
state; `recipe_of` checks that they are in the recognised form

    [clip_by_global_norm] [L2 decay] [adam | lion | trace] [decay] lr/scale... [decoupled decay]

and says what each leaf is to the kernels. `NotFusable` says why a composition has no such form.

Example:
    >>> leaves, rebuild = resolve(adamw(1e-3).spec, state, {})
    >>> recipe_of(leaves).decay_kind
    'coupled'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from .adam import ScaleByAdamState, ScaleByAmsgradState
from .base import EmptyState
from .hyperparams import InjectHyperparamsState
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


class NotFusable(Exception):
    """Raised inside the planner: this composition (or these tensors) has no fused form."""


# -- resolving a spec against a state ------------------------------------------------------------


@dataclasses.dataclass
class Leaf:
    """One primitive transform in the flattened composition, with its current state."""

    spec: Any
    state: Any
    mask: Any = None  # a masked decay's mask (None: every name)


def resolve(spec: Any, state: Any, extra: Mapping[str, Any]) -> tuple[list[Leaf], Callable]:
    """Flatten `spec` (and the matching `state`) into leaves, with a function that rebuilds the
    state tree from the leaves' new states."""

    if spec is None:
        raise NotFusable("a transform without a spec (a custom transform, clip_by_value, ...)")
    if isinstance(spec, ChainSpec):
        if not isinstance(state, tuple) or len(state) != len(spec.parts):
            raise NotFusable("the state does not match the chain")
        leaves, rebuilds, sizes = [], [], []
        for part, part_state in zip(spec.parts, state):
            sub, rebuild = resolve(part, part_state, extra)
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
        leaves, rebuild = resolve(getattr(inner, "spec", None), state.inner_state, extra)
        count = state.count + 1
        return leaves, lambda new: InjectHyperparamsState(count, values, rebuild(new))
    if isinstance(spec, MaskedSpec):
        if not spec.passthrough or not isinstance(state, MaskedState):
            raise NotFusable("masked(..., passthrough=False) inside a composition")
        if not isinstance(spec.inner, (WeightDecaySpec, DecoupledWeightDecaySpec)):
            raise NotFusable("masked(..., passthrough=True) of something other than a decay")
        _check_state(spec.inner, state.inner_state)
        leaf = Leaf(spec.inner, state.inner_state, mask=spec.mask)
        return [leaf], lambda new: MaskedState(new[0])
    _check_state(spec, state)
    return [Leaf(spec, state)], lambda new: new[0]


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
class Recipe:
    """The composition as one optimizer step."""

    leaves: list[Leaf]  # all of them, in the composition's order
    core: Leaf | None = None  # adam, lion or trace; None: plain SGD
    clip: Leaf | None = None
    decay: Leaf | None = None
    decay_kind: str = ""  # "l2" (before the core), "coupled" (times lr), "decoupled" (after lr)
    scales: list[Leaf] = dataclasses.field(default_factory=list)
    inert: list[Leaf] = dataclasses.field(default_factory=list)  # decays of 0: state only


def recipe_of(leaves: list[Leaf]) -> Recipe:
    recipe = Recipe(leaves)
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


def moment_trees(recipe: Recipe) -> list[Any]:
    core = recipe.core
    if core is None:
        return []
    if isinstance(core.spec, AdamSpec):
        trees = [core.state.mu, core.state.nu]
        return trees + ([core.state.nu_max] if core.spec.amsgrad else [])
    if isinstance(core.spec, LionSpec):
        return [core.state.mu]
    return [core.state.momentum]
