"""Helpers for model surgery: replace submodules of a (copied) model by policy.

Surgery in functrain is `Module -> Module` on a deep copy, applied once before `functrain.init`, so
the original model is never modified and the state is built from the final architecture.

Example:
    >>> model = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(2, 2))
    >>> new = replace_modules(model, lambda name, m: torch.nn.GELU() if isinstance(m, torch.nn.ReLU) else None)
    >>> type(new[0]).__name__, type(model[0]).__name__
    ('GELU', 'ReLU')
"""

from __future__ import annotations

import copy
from collections.abc import Callable

from torch import nn

# policy(qualified_name, module) -> replacement module, or None to keep (and recurse into) it.
Policy = Callable[[str, nn.Module], "nn.Module | None"]


def check_module(model: object, what: str) -> nn.Module:
    """Raise a clear TypeError unless `model` is an `nn.Module`."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"{what} expects a torch.nn.Module, got {type(model).__name__}")
    return model


def reject_optimizers(what: str, optimizers: object) -> None:
    """Raise a clear TypeError when Composer's `optimizers=` argument is given to a surgery.

    Composer's surgery mutates the model in place and rewires the optimizers that hold its
    parameters. functrain's returns a new model and holds no optimizer: the optimizer's state is
    built from the final model by `functrain.init`, after surgery.
    """
    if optimizers is None:
        return
    raise TypeError(
        f"{what} got optimizers= ({type(optimizers).__name__}): functrain's surgery returns a new "
        "model and changes no optimizer, so there is nothing to rewire. Drop the argument and "
        f"build the state after surgery: model = {what}(model, ...); "
        "state = functrain.init(model, optimizer)"
    )


def replace_modules(model: nn.Module, policy: Policy, *, copy_model: bool = True) -> nn.Module:
    """Replace every submodule for which `policy` returns a module; recurse into the others.

    Replaced modules are not recursed into, so a replacement that wraps the original module is
    not replaced again.

    Args:
        model: the model (not modified unless `copy_model=False`).
        policy: `(qualified_name, module) -> new module | None`.
        copy_model: work on a deep copy (the default) or in place.
    Returns:
        the model with the replacements made (the root itself can be replaced).
    """
    check_module(model, "replace_modules")
    root = copy.deepcopy(model) if copy_model else model
    replaced = policy("", root)
    if replaced is not None:
        return replaced
    _replace_children(root, "", policy)
    return root


def _replace_children(module: nn.Module, prefix: str, policy: Policy) -> None:
    for name, child in list(module.named_children()):
        qualified = f"{prefix}{name}"
        new = policy(qualified, child)
        if new is not None:
            setattr(module, name, new)
        else:
            _replace_children(child, qualified + ".", policy)


def reclass(module: nn.Module, cls: type) -> nn.Module:
    """Turn `module` (a surgery copy) into an instance of its subclass `cls`, keeping its state.

    For drop-in subclasses that only override `forward`: parameters, buffers and their names are
    unchanged, so checkpoints stay interchangeable.
    """
    if not issubclass(cls, type(module)):
        raise TypeError(f"{cls.__name__} is not a subclass of {type(module).__name__}")
    module.__class__ = cls
    return module


def count_modules(model: nn.Module, types: type | tuple[type, ...]) -> int:
    """How many submodules of `model` are instances of `types`."""
    return sum(isinstance(m, types) for m in model.modules())


def shared_parameter_ids(model: nn.Module) -> set[int]:
    """Ids of parameters reachable under more than one name (tied weights)."""
    seen: dict[int, int] = {}
    for _, param in model.named_parameters(remove_duplicate=False):
        seen[id(param)] = seen.get(id(param), 0) + 1
    return {pid for pid, count in seen.items() if count > 1}
