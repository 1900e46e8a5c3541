"""How much a load may allocate: the process's memory budget, checked before any array is read.

A checkpoint loaded without `like` allocates what its metadata declares; crafted metadata could
declare more than the machine has, and the allocation would kill the process instead of raising.

Example:
    >>> check_fits_in_memory([("file:///ckpt/params.w", "float32", (3, 4))])
"""

from __future__ import annotations

import math
import os
import resource

from .dtypes import numpy_dtype
from .errors import CheckpointCorruptError


def memory_budget() -> int:
    """The bytes this process could still allocate: physical memory, or less under an
    address-space limit (RLIMIT_AS)."""
    try:
        budget = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        budget = 2**62
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        used = 0
        try:
            with open("/proc/self/statm") as f:
                used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            pass
        budget = min(budget, max(0, soft - used))
    return budget


def check_fits_in_memory(arrays: list[tuple[str, str, tuple[int, ...]]]) -> None:
    """Refuse a load without `like` whose arrays could not all be allocated.

    Args:
        arrays: `(url, dtype, shape)` of every array the load reads whole.
    Raises:
        CheckpointCorruptError: naming the largest array, before anything is allocated.
    """
    total = 0
    largest: tuple[str, int, str, tuple[int, ...]] = ("", -1, "", ())
    for url, dtype, shape in arrays:
        nbytes = math.prod(shape) * numpy_dtype(dtype).itemsize
        total += nbytes
        if nbytes > largest[1]:
            largest = (url, nbytes, dtype, shape)
    budget = memory_budget()
    if total <= budget:
        return
    url, nbytes, dtype, shape = largest
    raise CheckpointCorruptError(
        f"loading without `like` would allocate {total} bytes, more than this process can "
        f"({budget}); the largest array, {url}, declares {dtype}{list(shape)} ({nbytes} bytes). "
        "Either its metadata is corrupted or crafted, or the checkpoint is too large to load "
        "whole: pass like= (a state of meta tensors gives the shapes without memory) or "
        "ignore=/weights_only= to load a part",
        reason="metadata",
    )


__all__ = ["check_fits_in_memory", "memory_budget"]
