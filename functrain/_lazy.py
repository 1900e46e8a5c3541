"""Import on first use: what only some runs need stays out of `import functrain`.

`import torch` already costs seconds; DTensor (`torch.distributed.tensor`, which pulls sympy
through torch's symbolic shapes) and tensorstore with ml_dtypes (the checkpoint format) would add
about 1.5 s more to every `import functrain`, including in each rank of a launch and in every
script that never shards or checkpoints. So:

- `is_dtensor(x)`: the DTensor test without importing DTensor. No DTensor can exist before the
  module defining its class has run, so when `torch.distributed.tensor` is not in `sys.modules`
  the answer is False, correctly and at the cost of one dict look-up. The import system's own
  table is the only state consulted.
- `lazy_exports(package, names)`: a package's PEP 562 `__getattr__` and `__dir__` that import
  a public name's submodule when the name is first read (`functrain.checkpoint.Manager`,
  `from functrain.parallel import fsdp`), then bind it on the package as an import would.
  Type checkers see the names through the package's `if TYPE_CHECKING:` imports.

Example:
    >>> is_dtensor(torch.zeros(2))
    False
    >>> __getattr__, __dir__ = lazy_exports(__name__, {"Manager": ".manager"})
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeGuard

import torch

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

DTENSOR_MODULE = "torch.distributed.tensor"


def is_dtensor(x: Any) -> TypeGuard[DTensor]:
    """Whether `x` is a DTensor, without importing `torch.distributed.tensor`.

    Args:
        x: any value.
    Returns:
        True for a DTensor. False for anything else, and always False while DTensor's module has
        not been imported (then no DTensor exists).
    """
    if type(x) is torch.Tensor:  # the common case, without a module look-up
        return False
    module = sys.modules.get(DTENSOR_MODULE)
    if module is None:
        return False
    cls = getattr(module, "DTensor", None)  # None while that module is still being imported
    return cls is not None and isinstance(x, cls)


def dtensor_loaded() -> bool:
    """Whether any DTensor can exist in this process (its module has been imported)."""
    return getattr(sys.modules.get(DTENSOR_MODULE), "DTensor", None) is not None


def lazy_exports(
    package: str, names: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's `__getattr__` and `__dir__` for names imported on first use (PEP 562).

    Args:
        package: the package's `__name__`.
        names: `{public name: relative submodule}` such as `{"Manager": ".manager"}`.
    Returns:
        `(__getattr__, __dir__)`, to assign at the package's top level.
    Example:
        >>> __getattr__, __dir__ = lazy_exports(__name__, {"load": ".reader"})
    """

    def __getattr__(name: str) -> Any:
        submodule = names.get(name)
        if submodule is None:
            # A submodule read as an attribute (`functrain.parallel.plans.fsdp`), as it could be
            # when the package imported it eagerly: import it now. Anything else is unknown.
            if not name.startswith("__") and importlib.util.find_spec(f"{package}.{name}"):
                return importlib.import_module(f"{package}.{name}")
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(submodule, package), name)
        setattr(sys.modules[package], name, value)  # bound as an import binds it: looked up once
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names))

    return __getattr__, __dir__
