"""Private output buffers for a pure update: purity at the price of one copy, never of an
allocation.

A pure step must not touch its input state, so its update needs fresh tensors for the new
parameters and optimizer state. Fresh memory is what costs on a CPU (a first touch of new pages
is several times slower than the update itself); the kernels' in-place form is what is fast.
`BufferPool` gives both: `private_copies(tensors)` returns copies of `tensors` that the caller
may update in place, written into the buffers of the state the *previous* call was given, when
nothing outside the pool still refers to them. In the usual loop

    state, metrics = step(state, batch)      # the old state is dropped here

the old state's tensors are unreferenced by the next call, so the update writes the new state
into them: two states' worth of memory, as any pure step needs, and no allocation. A state the
caller still holds (a snapshot, a list of states, the model's own parameters) is referenced, and
its buffers are never reused; fresh ones are made instead.

"Referenced" is checked on every level a reader could hold: the Python tensor object (its
reference count and weak references), the C++ tensor (autograd's saved tensors, DLPack), its
storage (views, `.numpy()`, `.detach()` aliases) and the storage's Python object. Only plain
(non-DTensor) leaf tensors are recycled; others are copied into fresh tensors.

Example:
    >>> pool = BufferPool()
    >>> mine = pool.private_copies([p, m, v])   # equal to p, m, v; safe to update in place
"""

from __future__ import annotations

import operator
import sys
import weakref
from collections.abc import Sequence

import torch

from .. import _torch

__all__ = ["BufferPool"]


_STORAGE_USE_COUNT = _torch.storage_use_counter()  # torch's C function (no Python frame)


def _counts(pool: list, index: int) -> tuple[int, int, int, int, int]:
    """Every reference count of `pool[index]`, as seen from inside this function: the Python
    object's references and weak references, the C++ tensor's references, its storage's C++
    references and the Python references of a storage object made for the count."""
    tensor = pool[index]
    storage = tensor.untyped_storage()
    return (
        sys.getrefcount(tensor),
        weakref.getweakrefcount(tensor),
        tensor._use_count(),
        _STORAGE_USE_COUNT(storage._cdata),  # the storage fetched once, counted in C
        sys.getrefcount(storage),
    )


# What an otherwise unreferenced tensor in a pool list shows (measured, so it holds on any
# Python version): only the pool's own references.
_UNREFERENCED = _counts([torch.empty(1)], 0)


def _fits(buffer: torch.Tensor, like: torch.Tensor) -> bool:
    return (
        type(buffer) is torch.Tensor
        and buffer.shape == like.shape
        and buffer.dtype == like.dtype
        and buffer.device == like.device
        and buffer.stride() == like.stride()
        and buffer.grad_fn is None
    )


class BufferPool:
    """Recycles the tensors of the state one call back as output buffers (see the module doc).

    Not thread-safe: one pool per step, used by one caller at a time.
    """

    def __init__(self) -> None:
        self._retired: list[torch.Tensor] = []
        # What the last call returned. When a call is given exactly these tensors back (the
        # loop `state = step(state, batch)`), each retired buffer fits by construction: the
        # output in slot i was made to fit the input in slot i, which is retired[i] now.
        self._given: list[torch.Tensor] = []

    def private_copies(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Copies of `tensors` (same values, shapes, strides, dtypes, requires_grad) that share
        memory with nothing anyone else holds.

        `tensors` are retired into the pool afterwards: the next call may write into them once
        the caller has let go of them.

        Args:
            tensors: the input state's tensors (never modified).
        Returns:
            one private tensor per input, in order.
        """
        # The state has the same structure every step, so the buffer for slot i is the tensor
        # that held slot i of the previous call's input.
        tensors = list(tensors)
        fed_back = len(tensors) == len(self._given) and all(map(operator.is_, tensors, self._given))
        retired, self._retired, self._given = self._retired, tensors, []
        out, plain_out, plain_in = [], [], []
        for index, tensor in enumerate(tensors):
            if type(tensor) is not torch.Tensor:  # DTensors and subclasses: a fresh clone
                out.append(tensor.detach().clone().requires_grad_(tensor.requires_grad))
                continue
            buffer = None
            # No local name may hold the candidate while its references are counted. A shape
            # check stays on the fed-back path: `resize_` is the one in-place change of layout.
            if index < len(retired) and (
                retired[index].shape == tensor.shape if fed_back else _fits(retired[index], tensor)
            ):
                if _counts(retired, index) == _UNREFERENCED:
                    buffer = retired[index]
            if buffer is None:
                buffer = torch.empty_like(tensor, memory_format=torch.preserve_format)
            if buffer.requires_grad != tensor.requires_grad:
                buffer.requires_grad_(tensor.requires_grad)
            out.append(buffer)
            plain_out.append(buffer)
            plain_in.append(tensor)
        if plain_out:
            with torch.no_grad():
                _torch.foreach_copy_(plain_out, plain_in)
        self._given = list(out)
        return out

    def clear(self) -> None:
        """Let go of the retired and the last returned tensors (their memory returns once the
        caller drops them)."""
        self._retired, self._given = [], []
