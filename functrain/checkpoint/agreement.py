"""Agreement among the saving ranks: every phase of a save ends with every rank knowing whether
every other rank succeeded, so one rank failing makes all of them raise instead of waiting forever
at a barrier. On one rank each is the identity.

Example:
    >>> phase(lambda: write_my_shards(), group, "writing", url)   # raises on every rank if any failed
    >>> agree(True, group)
    True
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .errors import CheckpointError
from .staging import dist_info


def agree(ok: bool, group=None) -> bool:
    """True when every rank of `group` reports `ok` (a barrier that also carries failures)."""
    rank, world = dist_info(group)
    if world == 1:
        return ok
    backend = torch.distributed.get_backend(group)
    device = "cuda" if backend == "nccl" else "cpu"
    flag = torch.tensor([0 if ok else 1], dtype=torch.int32, device=device)
    torch.distributed.all_reduce(flag, group=group)
    return int(flag.item()) == 0


def _device(group) -> str:
    return "cuda" if torch.distributed.get_backend(group) == "nccl" else "cpu"


def max_over_ranks(value: int, group=None) -> int:
    """The largest of every rank's `value` (a barrier too)."""
    _, world = dist_info(group)
    if world == 1:
        return value
    flag = torch.tensor([value], dtype=torch.int64, device=_device(group))
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=group)
    return int(flag.item())


def share_text(text: str | None, group=None) -> str | None:
    """Rank 0's `text` (or None) on every rank of `group` (bytes, not pickle)."""
    rank, world = dist_info(group)
    if world == 1:
        return text
    device = _device(group)
    data = b"" if text is None or rank != 0 else text.encode()
    size = torch.tensor([len(data) + 1 if rank == 0 and text is not None else 0], device=device)
    torch.distributed.all_reduce(size, group=group)
    if int(size.item()) == 0:
        return None
    buffer = torch.zeros(int(size.item()) - 1, dtype=torch.uint8, device=device)
    if rank == 0 and data:
        buffer.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    torch.distributed.all_reduce(buffer, group=group)
    return bytes(buffer.cpu().tolist()).decode()


def phase(fn: Callable[[], None], group, what: str, url: str) -> None:
    """Run `fn` on this rank, then make every rank fail if any rank failed."""
    error = None
    try:
        fn()
    except BaseException as err:  # re-raised below, once the other ranks know
        error = err
    if not agree(error is None, group):
        if error is not None:
            raise error
        raise CheckpointError(f"another rank failed while {what} {url}; see that rank's error")


__all__ = ["agree", "max_over_ranks", "phase", "share_text"]
