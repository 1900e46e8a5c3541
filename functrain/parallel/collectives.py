"""One bucket's collectives, and `InFlight`: the collectives of one step that have not finished.

A bucket (see `flat`) is gathered with one all-gather (`Kind.SHARD`) or just cast
(`Kind.REPLICATE`), and its gradients are reduced with one reduce-scatter or one all-reduce. The
reduction is launched asynchronously from the backward pass, so communication overlaps the rest of
that pass as in DDP; the launched reductions are kept in the step's `InFlight`, which finishes
them when the backward pass ends (an autograd engine callback) or when the step asks
(`InFlight.wait`). The same object holds the tables of gathering at use (see `reshard`): whatever
one step has in flight lives in the object that step created, never in the module.

Example:
    >>> inflight = InFlight()
    >>> wholes = BucketCollective.apply(bucket, layout, inflight, prefetch(bucket, layout, pieces),
    ...                                 *pieces)
    >>> torch.autograd.grad(loss_of(wholes), pieces)   # reductions launched, finished at the end
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from .. import _torch
from . import comm, flat

if TYPE_CHECKING:
    from .layout import Layout


class InFlight:
    """What one step has in flight: gradient reductions and buckets gathered at use.

    Created by the step for one forward/backward (`Step._grads`, `call_model`) and dropped when
    it returns. Two models stepping in one process have one each, so nothing crosses over.

    Attributes:
        placeholders: `id(local piece) -> (bucket, pieces, index)` of the buckets its modules
            gather at use (see `reshard`).
        live: storage address of a gathered whole -> `(weakref, bucket, pieces, index)`.
        regathered: `id(pieces[0])` -> a bucket's whole tensors gathered again for the backward.
        restore: `id(module)` -> the stack of placeholders to put back when the module returns.
    """

    def __init__(self, layout: Layout | None = None):
        self.layout = layout
        self._reductions: list[tuple[Any, Callable[[], None]]] = []
        self._callback_queued = False
        self.placeholders: dict[int, tuple] = {}
        self.live: dict[int, tuple] = {}
        self.regathered: dict[int, list[torch.Tensor]] = {}
        self.restore: dict[int, list[list[tuple[str, torch.Tensor]]]] = {}

    def add_reduction(self, work: Any, finish: Callable[[], None]) -> None:
        """Remember a launched reduction; inside a backward pass, finish it when the pass ends."""
        self._reductions.append((work, finish))
        if not self._callback_queued and _torch.in_backward_pass():
            self._callback_queued = True
            _torch.queue_backward_callback(self.wait)

    def release(self, key: int) -> None:
        """Free a bucket gathered again in the backward pass (its gradients are being reduced)."""
        self.regathered.pop(key, None)

    def wait(self) -> None:
        """Finish every reduction launched so far (and free what the backward gathered again)."""
        self._callback_queued = False
        self.regathered.clear()
        while self._reductions:
            work, finish = self._reductions.pop(0)
            if work is not None:
                work.wait()
            finish()


def prefetch(bucket: flat.Bucket, layout: Layout, locals_: list[torch.Tensor]):
    """Start the all-gather of a sharded bucket; return `(work, gathered)`."""
    send = locals_[0].new_empty(bucket.segment, dtype=bucket.compute_dtype)
    flat.pack_shards(bucket, locals_, send)
    gathered = send.new_empty(bucket.n * bucket.segment)
    work = comm.all_gather_into(gathered, send, layout.shard_group, async_op=True)
    return work, gathered


def gather_bucket(bucket: flat.Bucket, locals_, prefetched) -> list[torch.Tensor]:
    """The bucket's whole tensors: unpack the prefetched all-gather, or cast replicated ones."""
    if not bucket.sharded:
        return [x.to(bucket.compute_dtype).view_as(x) for x in locals_]
    work, gathered = prefetched
    if work is not None:
        work.wait()
    return flat.unpack_gathered(bucket, gathered)


def gather_detached(bucket: flat.Bucket, layout: Layout, pieces: list[torch.Tensor]):
    """The bucket's whole tensors, outside autograd (evaluation, and again in backward)."""
    with torch.no_grad():
        prefetched = prefetch(bucket, layout, pieces) if bucket.sharded else None
        return gather_bucket(bucket, pieces, prefetched)


class BucketCollective(torch.autograd.Function):
    """Local pieces -> whole compute tensors; backward reduces the gradients of the bucket.

    Forward: a sharded bucket waits for its prefetched all-gather and unpacks it; a replicated
    one casts. Backward: packs the gradients into one flat buffer, launches one reduce-scatter
    (then an all-reduce over `dp_replicate` for HSDP) or one all-reduce, and returns tensors that
    `InFlight` fills once the collective has finished.
    """

    @staticmethod
    def forward(ctx, bucket, layout, inflight, prefetched, *locals_):
        ctx.bucket, ctx.layout, ctx.inflight = bucket, layout, inflight
        ctx.regather_key = id(locals_[0])  # see `reshard`: what the backward pass gathered again
        return tuple(gather_bucket(bucket, locals_, prefetched))

    @staticmethod
    def backward(ctx, *grads):
        ctx.inflight.release(ctx.regather_key)  # every use of the bucket's params is behind us
        results = reduce_bucket(ctx.bucket, ctx.layout, list(grads), ctx.inflight)
        return (None, None, None, None, *results)


def reduce_bucket(
    bucket: flat.Bucket, layout: Layout, grads: list[torch.Tensor], inflight: InFlight
) -> list[torch.Tensor]:
    """Launch the bucket's reduction; return gradient tensors valid once `inflight` finished it."""
    world = layout.dp_size
    if world == 1:  # nothing to reduce: just the dtype
        return [g.to(bucket.param_dtype) for g in grads]
    first = grads[0]
    if not bucket.sharded:
        buffer = first.new_empty(bucket.segment, dtype=bucket.reduce_dtype)
        flat.pack_grads(bucket, grads, buffer)
        reduced = buffer
        work = comm.all_reduce_(buffer, layout.dp_group, async_op=True)
        follow_group = None
    else:
        send = first.new_empty(bucket.n * bucket.segment, dtype=bucket.reduce_dtype)
        flat.pack_grads(bucket, grads, send)
        reduced = send.new_empty(bucket.segment)
        work = comm.reduce_scatter_into(reduced, send, layout.shard_group, async_op=True)
        follow_group = layout.replicate_group if layout.replicas > 1 else None
    views = flat.unpack_reduced(bucket, reduced)
    direct = bucket.reduce_dtype == bucket.param_dtype
    results = [
        v
        if direct and v.is_contiguous()
        else torch.empty(v.shape, dtype=bucket.param_dtype, device=v.device)
        for v in views
    ]

    def finish():
        if follow_group is not None:  # HSDP: the shards' replicas sum across dp_replicate
            comm.all_reduce_(reduced, follow_group)
        reduced.div_(world)
        copies = [(r, v) for r, v in zip(results, views) if r is not v]
        if copies:
            _torch.foreach_copy_([r for r, _ in copies], [v for _, v in copies])

    if bucket.reshard:
        # Gathered at use, a bucket may be gathered (and so reduced) more than once per pass
        # (tied weights, microbatches), and autograd adds those gradients up as soon as they
        # are returned: finish now rather than at the end of the pass.
        if work is not None:
            work.wait()
        finish()
        return results
    inflight.add_reduction(work, finish)
    return results
