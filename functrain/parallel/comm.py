"""The collectives functrain issues, each counted, so communication volume is measured.

Every collective goes through these wrappers, which skip groups of one rank and add to
`COUNTER`. Volume is counted as the bytes *each rank sends* under the bandwidth-optimal ring
algorithms, the usual yardstick for data-parallel traffic:

    all_gather:      (n-1)/n * output bytes
    reduce_scatter:  (n-1)/n * input bytes
    all_reduce:      2 (n-1)/n * bytes         (a reduce-scatter then an all-gather)
    broadcast:       bytes

so DDP moves about 2x the parameter bytes per step and FSDP about 2x to 3x. `bench/distributed.py`
applies the same formulas to what PyTorch's DDP and FSDP2 issue.

Example:
    >>> COUNTER.reset()
    >>> all_reduce_(grads_flat, group)
    >>> COUNTER.sent_bytes            # 2 (n-1)/n * grads_flat.nbytes
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import torch
import torch.distributed as dist

# torch >= 2.13 renamed the tensor collectives; older releases only have the old names.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclasses.dataclass
class CommCounter:
    """Running totals of the collectives issued by this process.

    Attributes:
        calls: number of collectives, by operation name.
        payload_bytes: bytes of the tensors handed to each operation (output for all-gather,
            input otherwise), by operation.
        sent_bytes: ring-algorithm bytes this rank sends, summed over all operations.
    """

    calls: Counter = dataclasses.field(default_factory=Counter)
    payload_bytes: Counter = dataclasses.field(default_factory=Counter)
    sent_bytes: float = 0.0

    def record(self, op: str, payload: int, group_size: int) -> None:
        """Add one collective of `payload` bytes over `group_size` ranks.

        Not while dynamo traces (`compile_step`): the collective becomes part of the compiled
        graph, which runs no Python per call to count with, and a count traced inside an
        autograd function's forward would leak a value of its subgraph into the outer graph
        ("Argument 'add' of Node 'scalar_tensor' does not belong to this Graph")."""
        if torch.compiler.is_compiling():
            return
        self.calls[op] += 1
        self.payload_bytes[op] += payload
        self.sent_bytes += ring_bytes(op, payload, group_size)

    def reset(self) -> None:
        """Zero every total."""
        self.calls.clear()
        self.payload_bytes.clear()
        self.sent_bytes = 0.0

    def snapshot(self) -> dict:
        """A plain-dict copy of the totals."""
        return {
            "calls": dict(self.calls),
            "payload_bytes": dict(self.payload_bytes),
            "sent_bytes": self.sent_bytes,
        }


COUNTER = CommCounter()


def ring_bytes(op: str, payload: int, group_size: int) -> float:
    """Bytes one rank sends for `op` on `payload` bytes over `group_size` ranks (ring algorithms).

    Args:
        op: "all_gather", "reduce_scatter", "all_reduce" or "broadcast".
        payload: output bytes for all_gather, input bytes otherwise.
        group_size: ranks in the group.
    Returns:
        the bytes sent by each rank.
    """
    n = group_size
    if n <= 1:
        return 0.0
    if op in ("all_gather", "reduce_scatter"):
        return payload * (n - 1) / n
    if op == "all_reduce":
        return 2.0 * payload * (n - 1) / n
    if op == "broadcast":
        return float(payload)
    raise ValueError(f"unknown collective {op!r}")


def group_size(group) -> int:
    """Ranks in `group` (1 when distribution is not initialised)."""
    if group is None and not dist.is_initialized():
        return 1
    return dist.get_world_size(group)


def all_gather_into(output: torch.Tensor, local: torch.Tensor, group, async_op: bool = False):
    """Concatenate every rank's `local` (equal sizes) into `output`, in rank order.

    Returns:
        a work handle when `async_op` (None when the group has one rank), else None.
    """
    n = group_size(group)
    if n == 1:
        output.copy_(local.reshape(output.shape))
        return None
    COUNTER.record("all_gather", output.numel() * output.element_size(), n)
    return _all_gather_single(output, local, group=group, async_op=async_op)


def reduce_scatter_into(output: torch.Tensor, full: torch.Tensor, group, async_op: bool = False):
    """Sum `full` (n equal chunks, in rank order) over ranks; this rank's chunk into `output`."""
    n = group_size(group)
    if n == 1:
        output.copy_(full.reshape(output.shape))
        return None
    COUNTER.record("reduce_scatter", full.numel() * full.element_size(), n)
    return _reduce_scatter_single(
        output, full, op=dist.ReduceOp.SUM, group=group, async_op=async_op
    )


def all_reduce_(tensor: torch.Tensor, group, async_op: bool = False):
    """Sum `tensor` over the ranks of `group`, in place (gloo has no AVG: divide afterwards)."""
    n = group_size(group)
    if n == 1:
        return None
    COUNTER.record("all_reduce", tensor.numel() * tensor.element_size(), n)
    return dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group, async_op=async_op)


def broadcast_(tensor: torch.Tensor, src_group_rank: int, group) -> None:
    """Overwrite `tensor` with the copy held by the rank `src_group_rank` of `group`."""
    n = group_size(group)
    if n == 1:
        return
    COUNTER.record("broadcast", tensor.numel() * tensor.element_size(), n)
    dist.broadcast(tensor, group_src=src_group_rank, group=group)


def all_gather_list(outputs: list[torch.Tensor], local: torch.Tensor, group) -> None:
    """Every rank's `local` into `outputs[rank]` (sizes may differ by rank only if padded first)."""
    n = group_size(group)
    if n == 1:
        outputs[0].copy_(local)
        return
    COUNTER.record("all_gather", sum(t.numel() * t.element_size() for t in outputs), n)
    dist.all_gather(outputs, local, group=group)
