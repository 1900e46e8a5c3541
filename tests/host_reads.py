"""Count the host reads of a collective's result: what stalls a GPU's queue under NCCL.

A read of a tensor on the host (`.tolist()`, `.item()`, `float(t)`, `int(t)`, `bool(t)`, `if t:`)
waits for the device to finish what computes it; when that tensor came from a collective (or was
computed from one), the host also waits for every other rank to get there. On CPU (gloo) the
collectives run the same code path, so counting such reads here shows what a GPU cluster would
pay. Reads of tensors that no collective touched (the loader's CPU index lists, a count made on
the host) are not counted: they are harmless.

`HostReads` is a `TorchFunctionMode`: it marks the tensors a collective writes (the
`torch.distributed` collectives, by whatever name a module bound them, and the functional
collectives of `torch.ops._c10d_functional`) and, op by op, every tensor computed from a marked
one (in-place ops mark the tensor they write). It is thread-local, like every torch mode: a
background thread's reads are not seen.

Example:
    >>> with HostReads() as reads:
    ...     functrain.fit(step, state, loader, duration="64ba")
    >>> reads.count, reads.sites[:1]
    (3, ['functrain/loop/agreement.py:123 finish'])
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

# The functions whose tensor arguments a collective writes (in place, or into an output tensor).
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "broadcast",
    "reduce",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
)
READS = ("tolist", "item", "__float__", "__int__", "__bool__", "__index__")
_FUNCTIONAL = ("_c10d_functional", "c10d_functional")


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


class HostReads(TorchFunctionMode):
    """While active, count host reads of tensors that hold (or derive from) a collective's result.

    Attributes:
        count: the reads counted.
        sites: where each was made: "file:line function" of the first frame outside torch and
            this module.
    """

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.sites: list[str] = []
        self._marked = WeakIdKeyDictionary()
        self._patched: list[tuple[Any, str, Any]] = []

    # -- marking ------------------------------------------------------------------------------

    def _mark(self, tensors: list[torch.Tensor]) -> None:
        for t in tensors:
            self._marked[t] = True

    def _is_marked(self, tensors: list[torch.Tensor]) -> bool:
        return any(t in self._marked for t in tensors)

    def _wrap(self, fn):
        def collective(*args, **kwargs):
            self._mark(_tensors((args, kwargs)))  # the outputs are among the arguments
            return fn(*args, **kwargs)

        collective.__wrapped__ = fn  # type: ignore[attr-defined]
        return collective

    def __enter__(self) -> HostReads:
        # Patch each collective under every name a loaded module bound it to (functrain's comm
        # binds some at import time); restored on exit.
        originals = {
            id(getattr(dist, n)): getattr(dist, n) for n in COLLECTIVES if hasattr(dist, n)
        }
        wrappers = {key: self._wrap(fn) for key, fn in originals.items()}
        for module in list(sys.modules.values()):
            name = getattr(module, "__name__", "") or ""
            if not (name.startswith("torch.distributed") or name.startswith("functrain")):
                continue
            for attr, value in list(vars(module).items()):
                if id(value) in originals and value is originals[id(value)]:
                    self._patched.append((module, attr, value))
                    setattr(module, attr, wrappers[id(value)])
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        for module, attr, value in reversed(self._patched):
            setattr(module, attr, value)
        self._patched = []

    # -- the mode -----------------------------------------------------------------------------

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        inputs = _tensors((args, kwargs))
        if name in READS:
            if self._is_marked(inputs):
                self.count += 1
                self.sites.append(_site())
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        namespace = getattr(func, "namespace", None) or str(func).split(".")[0]
        if namespace in _FUNCTIONAL or self._is_marked(inputs):
            self._mark(_tensors(out))
            if name.endswith("_") or "out" in kwargs:  # in place: the written tensor too
                self._mark(inputs[:1] + _tensors(kwargs.get("out")))
        return out


def _site() -> str:
    for frame in reversed(traceback.extract_stack()[:-2]):
        path = frame.filename.replace("\\", "/")
        if "/torch/" in path or path.endswith("/host_reads.py"):
            continue
        short = path.split("/functrain/", 1)[-1] if "/functrain/" in path else path
        return f"{short}:{frame.lineno} {frame.name}"
    return "?"
