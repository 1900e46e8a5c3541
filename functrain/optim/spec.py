"""What a transform *is*, told to the fused executor: one small record per kind of transform.

Each transform built by this package carries a `spec` (the `Transform.spec` field): a frozen
record of its kind and hyperparameters, e.g. `AdamSpec(b1=0.9, b2=0.999, eps=1e-8,
amsgrad=False)`. Combinators describe their children (`ChainSpec`, `MaskedSpec`, `InjectSpec`).
`functrain.optim.fused` reads these records to run a whole composition with torch's fused
kernels (torch's `_fused_adamw_`, `_fused_sgd_`, ...), instead of one foreach kernel per
transform. A transform without a spec (`spec=None`, e.g. a user's own) simply runs its `update`.

The records describe; they never compute. Each one says how its transform's state advances, so
the executor returns a state with exactly the structure `update` would have returned.

Example:
    >>> from functrain.optim import adamw
    >>> adamw(1e-3).spec.parts[0]
    AdamSpec(b1=0.9, b2=0.999, eps=1e-08, amsgrad=False)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

ScalarOrSchedule = float | Callable[[Any], float]


@dataclasses.dataclass(frozen=True)
class AdamSpec:
    """`scale_by_adam`: state `ScaleByAdamState` (or `ScaleByAmsgradState`)."""

    b1: float
    b2: float
    eps: float
    amsgrad: bool


@dataclasses.dataclass(frozen=True)
class LionSpec:
    """`scale_by_lion`: state `ScaleByLionState`."""

    b1: float
    b2: float


@dataclasses.dataclass(frozen=True)
class MomentumSpec:
    """`trace` (torch's SGD momentum buffer): state `TraceState`."""

    decay: float
    nesterov: bool
    dampening: float


@dataclasses.dataclass(frozen=True)
class LearningRateSpec:
    """`scale_by_learning_rate`: multiply by `sign * lr_t`; state `ScaleByLearningRateState`."""

    lr: ScalarOrSchedule
    sign: float


@dataclasses.dataclass(frozen=True)
class ScaleSpec:
    """`scale(factor)`: multiply by a constant; no state."""

    factor: float


@dataclasses.dataclass(frozen=True)
class WeightDecaySpec:
    """`add_decayed_weights`: add `weight_decay * param` to the update; no state."""

    weight_decay: float


@dataclasses.dataclass(frozen=True)
class DecoupledWeightDecaySpec:
    """`add_decoupled_weight_decay`: subtract `weight_decay * lr_t / base * param` (`base` 0: a
    ratio of 1); state `DecoupledWeightDecayState`."""

    weight_decay: float
    lr: ScalarOrSchedule
    base: float


@dataclasses.dataclass(frozen=True)
class ClipByGlobalNormSpec:
    """`clip_by_global_norm`: scale all updates to a global norm of at most `max_norm`."""

    max_norm: float


@dataclasses.dataclass(frozen=True)
class ChainSpec:
    """`chain(*transforms)`: the children's specs in order (None where a child has none)."""

    parts: tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class MaskedSpec:
    """`masked(inner, mask, passthrough)`: `inner` on the names the mask selects."""

    inner: Any
    mask: Mapping[str, bool] | Callable[[Any], Mapping[str, bool]]
    passthrough: bool


@dataclasses.dataclass(frozen=True)
class InjectSpec:
    """`inject_hyperparams(factory)(...)`: `values_at(count, extra)` gives this update's
    hyperparameters, `build(values)` the transform they make (whose own spec says the rest)."""

    values_at: Callable[[int, Mapping[str, Any]], dict[str, float]]
    build: Callable[[dict[str, float]], Any]
