"""Layer freezing (FreezeOut-style): progressively stop training the earliest layers.

No layer is frozen until `freeze_start` of training has passed; then the frozen fraction grows
linearly to `freeze_level` at the end of training. A "layer" is, as in Composer, a leaf module
(one without children) that owns parameters, in the model's definition order; the last layer is
never frozen. A parameter owned directly by a module with children (a ViT's `cls_token`) belongs
to no layer: it is neither counted nor frozen.

Example:
    >>> freeze_fraction(0.75, freeze_start=0.5, freeze_level=1.0)
    0.5
    >>> frozen_names(["a.weight", "a.bias", "b.weight", "c.weight"], fraction=1.0)
    ['a.weight', 'a.bias', 'b.weight']
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def freeze_fraction(elapsed: float, freeze_start: float = 0.5, freeze_level: float = 1.0) -> float:
    """The fraction of layers frozen after `elapsed` (a fraction of the run) of training."""
    if not 0.0 <= freeze_start < 1.0:
        raise ValueError(f"freeze_start must be in [0, 1), got {freeze_start}")
    if not 0.0 <= freeze_level <= 1.0:
        raise ValueError(f"freeze_level must be in [0, 1], got {freeze_level}")
    if elapsed <= freeze_start:
        return 0.0
    progress = min(1.0, (elapsed - freeze_start) / (1.0 - freeze_start))
    return freeze_level * progress


def layers_of(param_names: Iterable[str]) -> list[list[str]]:
    """Parameter names grouped by owning leaf module, in first-appearance order.

    From names alone a module is a leaf when no other parameter lives below it, so a parameter
    whose owner has parameter-owning children (`"cls_token"` beside `"blocks.0.weight"`) is left
    out. Given the module, `module_layers` also treats children without parameters as Composer does.
    """
    layers: dict[str, list[str]] = {}
    for name in param_names:
        owner = name.rsplit(".", 1)[0] if "." in name else ""
        layers.setdefault(owner, []).append(name)
    parents: set[str] = set()  # every proper prefix of an owner is a module with children
    for owner in layers:
        parts = owner.split(".") if owner else []
        parents.update(".".join(parts[:k]) for k in range(len(parts)))
    return [names for owner, names in layers.items() if owner not in parents]


def module_layers(model: Any) -> list[list[str]]:
    """The layers of an `nn.Module` as Composer counts them: leaf modules that own parameters.

    Args:
        model: the module; walked depth-first through `children()` in definition order.
    Returns:
        each layer's parameter names (as `model.named_parameters()` spells them).
    Example:
        >>> module_layers(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()))
        [['0.weight', '0.bias']]
    """
    names = {id(p): n for n, p in model.named_parameters()}
    layers: list[list[str]] = []

    def walk(module: Any) -> None:
        children = list(module.children())
        if not children:
            owned = [names[id(p)] for p in module.parameters() if id(p) in names]
            if owned:
                layers.append(owned)
        for child in children:
            walk(child)

    walk(model)
    return layers


def frozen_names(param_names: Iterable[str], fraction: float) -> list[str]:
    """The parameters of the first `int(fraction * (layers - 1))` layers."""
    layers = layers_of(param_names)
    depth = int(fraction * len(layers[:-1]))
    return [name for layer in layers[:depth] for name in layer]


def freeze_layers(
    model: Any,
    optimizers: Any = None,
    current_duration: float = 0.0,
    freeze_start: float = 0.5,
    freeze_level: float = 1.0,
) -> tuple[int, float]:
    """Composer's `freeze_layers`, pure: how many layers are frozen at `current_duration`.

    Composer sets `requires_grad=False` on those layers and removes them from the optimizers;
    functrain changes neither: its `layer_freezing` algorithm masks their updates in the step,
    and `frozen_names(names, fraction)` lists the parameters.

    Args:
        model: the `nn.Module` (its parameter-owning leaf modules, in definition order, are
            the layers, as in Composer).
        optimizers: Composer's argument; only None (functrain rewires no optimizer).
        current_duration: the elapsed fraction of training, in [0, 1].
        freeze_start, freeze_level: as in `freeze_fraction`.
    Returns:
        `(freeze_depth, freeze_percentage)`: the number of frozen layers and their fraction.
    """
    from .module_surgery import reject_optimizers

    reject_optimizers("freeze_layers", optimizers)
    fraction = freeze_fraction(float(current_duration), freeze_start, freeze_level)
    return int(fraction * len(module_layers(model)[:-1])), fraction
