"""Flat communication buffers: many parameters, one collective.

A *bucket* is a run of parameters that share a collective. In a `SHARD` bucket every parameter is
split over the `dp_shard` ranks along one dim (FSDP); each rank's pieces are packed, padded to equal
chunk lengths, into one segment, so a single `all_gather` rebuilds every parameter and a single
`reduce_scatter` returns every gradient shard. In a `REPLICATE` bucket (DDP) the gradients are
packed side by side for one `all_reduce`.

Padding follows DTensor's uneven `Shard` rule: a dim of size `s` over `n` ranks is cut into chunks
of `ceil(s / n)`, so the last ranks may hold a shorter (or empty) piece.

Example (two ranks, a (5, 3) weight sharded on dim 0, so chunks of 3 rows, the last one padded):
    >>> slot = make_slot("w", compute_shape=(5, 3), dim=0, n=2, rank=1, offset=0)
    >>> slot.local_shape, slot.padded_local_shape, slot.numel
    ((2, 3), (3, 3), 9)
"""

from __future__ import annotations

import dataclasses
import enum

import torch

from .. import _torch


def shard_extent(size: int, n: int, rank: int) -> tuple[int, int]:
    """`(length, offset)` of `rank`'s chunk of a dim of `size` cut over `n` ranks (DTensor's rule)."""
    chunk = -(-size // n)
    start = min(size, chunk * rank)
    return max(0, min(size, start + chunk) - start), start


@dataclasses.dataclass(frozen=True)
class Slot:
    """Where one parameter lives in a bucket.

    Attributes:
        name: the parameter's name.
        compute_shape: the shape compute sees (whole along the data-parallel dims).
        local_shape: this rank's piece.
        dim: the dim cut over `dp_shard` (None: the parameter is replicated there).
        pad: chunk length along `dim` (every rank's piece is padded to it).
        n: ranks the dim is cut over (1 when replicated).
        offset: first element of the parameter in this rank's segment.
    """

    name: str
    compute_shape: tuple[int, ...]
    local_shape: tuple[int, ...]
    dim: int | None
    pad: int
    n: int
    offset: int

    @property
    def padded_local_shape(self) -> tuple[int, ...]:
        if self.dim is None:
            return self.compute_shape
        shape = list(self.compute_shape)
        shape[self.dim] = self.pad
        return tuple(shape)

    @property
    def numel(self) -> int:
        """Elements this parameter takes in one rank's segment."""
        count = 1
        for size in self.padded_local_shape:
            count *= size
        return count

    @property
    def even(self) -> bool:
        """True when no padding is needed."""
        return self.dim is None or self.pad * self.n == self.compute_shape[self.dim]

    @property
    def split_shape(self) -> tuple[int, ...]:
        """The padded full shape with `dim` unflattened into `(n, pad)`."""
        shape = self.compute_shape
        return shape[: self.dim] + (self.n, self.pad) + shape[self.dim + 1 :]


def make_slot(
    name: str, compute_shape: tuple[int, ...], dim: int | None, n: int, rank: int, offset: int
) -> Slot:
    """A `Slot` for a parameter of `compute_shape` cut on `dim` over `n` ranks (this is `rank`)."""
    compute_shape = tuple(compute_shape)
    if dim is None:
        return Slot(name, compute_shape, compute_shape, None, 0, 1, offset)
    length, _ = shard_extent(compute_shape[dim], n, rank)
    local = list(compute_shape)
    local[dim] = length
    return Slot(name, compute_shape, tuple(local), dim, -(-compute_shape[dim] // n), n, offset)


class Kind(enum.Enum):
    """How a bucket communicates."""

    SHARD = "shard"  # all-gather for compute, reduce-scatter of gradients, over `dp_shard`
    REPLICATE = "replicate"  # whole on every rank: all-reduce of gradients


@dataclasses.dataclass(frozen=True)
class Bucket:
    """Parameters that share one collective.

    Attributes:
        kind: `Kind.SHARD` or `Kind.REPLICATE`.
        slots: the parameters, in order.
        segment: elements per rank (shard) or in total (replicate).
        compute_dtype: dtype of the gathered parameters (mixed precision's param dtype).
        reduce_dtype: dtype gradients are reduced in.
        param_dtype: dtype of the stored parameters (and of the final gradients).
        frozen: its parameters take no gradient (never reduced; kept apart from trainable ones).
        at_use: the module whose forward gathers the bucket when it runs
            (`fsdp(reshard_after_forward=True)`); None: gathered once per step.
    """

    kind: Kind
    slots: tuple[Slot, ...]
    segment: int
    compute_dtype: torch.dtype
    reduce_dtype: torch.dtype
    param_dtype: torch.dtype
    frozen: bool = False
    at_use: str | None = None

    @property
    def sharded(self) -> bool:
        """True for a `Kind.SHARD` bucket."""
        return self.kind is Kind.SHARD

    @property
    def reshard(self) -> bool:
        """True for a bucket gathered when its module runs (`fsdp(reshard_after_forward=True)`)."""
        return self.at_use is not None

    @property
    def n(self) -> int:
        """Ranks the bucket's parameters are cut over (1 for a replicated bucket)."""
        return self.slots[0].n

    @property
    def even(self) -> bool:
        return all(slot.even for slot in self.slots)

    @property
    def names(self) -> tuple[str, ...]:
        """The names of its parameters, in order."""
        return tuple(slot.name for slot in self.slots)


@dataclasses.dataclass(frozen=True)
class Entry:
    """One parameter on its way into a bucket (see `build_buckets`).

    Attributes:
        slot: where it sits (its offset is reassigned).
        kind, frozen, at_use: which bucket it may share (see `Bucket`).
        compute_dtype, reduce_dtype, param_dtype: its dtypes (see `Bucket`).
    """

    slot: Slot
    kind: Kind
    compute_dtype: torch.dtype
    reduce_dtype: torch.dtype
    param_dtype: torch.dtype
    frozen: bool = False
    at_use: str | None = None


def pack_shards(bucket: Bucket, locals_: list[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    """Copy this rank's pieces into its segment `out` (cast to the compute dtype)."""
    if not bucket.even:
        out.zero_()  # padding goes over the wire: keep it deterministic
    dests = [
        out[s.offset : s.offset + s.numel]
        .view(s.padded_local_shape)
        .narrow(s.dim, 0, s.local_shape[s.dim])
        for s in bucket.slots
    ]
    _torch.foreach_copy_(dests, locals_)
    return out


def unpack_gathered(bucket: Bucket, gathered: torch.Tensor) -> list[torch.Tensor]:
    """Whole parameters from the all-gathered `(n * segment)` buffer (one copy each)."""
    rows = gathered.view(bucket.n, bucket.segment)
    out = []
    for s in bucket.slots:
        chunks = rows[:, s.offset : s.offset + s.numel].view((s.n,) + s.padded_local_shape)
        full = chunks.movedim(0, s.dim).reshape(_padded_full_shape(s))  # copies: rank-major -> dim
        if not s.even:
            full = full.narrow(s.dim, 0, s.compute_shape[s.dim])
            if s.dim != 0:
                full = full.contiguous()
        out.append(full)
    return out


def pack_grads(bucket: Bucket, grads: list[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    """Copy whole gradients into the send buffer of one collective (cast to the reduce dtype).

    "shard": `out` has `n * segment` elements, rank `r`'s chunks in row `r`; "replicate": `out` has
    `segment` elements, the gradients side by side.
    """
    if not bucket.sharded:
        dests = [out[s.offset : s.offset + s.numel].view(s.compute_shape) for s in bucket.slots]
        _torch.foreach_copy_(dests, grads)
        return out
    rows = out.view(bucket.n, bucket.segment)
    dests, srcs = [], []
    for s, grad in zip(bucket.slots, grads):
        if not s.even:  # pad to n * pad along dim, zeros in the padding
            padded = grad.new_zeros(_padded_full_shape(s))
            padded.narrow(s.dim, 0, s.compute_shape[s.dim]).copy_(grad)
            grad = padded
        dests.append(
            rows[:, s.offset : s.offset + s.numel]
            .view((s.n,) + s.padded_local_shape)
            .movedim(0, s.dim)
        )
        srcs.append(grad.reshape(s.split_shape))
    _torch.foreach_copy_(dests, srcs)
    return out


def unpack_reduced(bucket: Bucket, reduced: torch.Tensor) -> list[torch.Tensor]:
    """Views of this rank's gradient pieces in the reduced buffer (`segment` elements)."""
    out = []
    for s in bucket.slots:
        piece = reduced[s.offset : s.offset + s.numel].view(s.padded_local_shape)
        if bucket.sharded and not s.even:
            piece = piece.narrow(s.dim, 0, s.local_shape[s.dim])
        out.append(piece)
    return out


def _padded_full_shape(s: Slot) -> tuple[int, ...]:
    shape = list(s.compute_shape)
    shape[s.dim] = s.n * s.pad
    return tuple(shape)


def build_buckets(entries: list[Entry], cap_bytes: int) -> list[Bucket]:
    """Group parameters with the same kind, flags and dtypes into buckets of at most `cap_bytes`.

    Parameters join the open bucket of their kind in order (kinds may interleave, e.g. sharded
    weights between replicated tensor-parallel biases), so there is one collective per kind until
    a bucket fills up.

    Args:
        entries: one `Entry` per parameter, in parameter order; slot offsets are reassigned.
        cap_bytes: close a bucket once adding a parameter would take it past this many bytes
            (per-rank segment, in the reduce dtype).
    Returns:
        the buckets, ordered by their first parameter.
    """
    open_: dict[tuple, list[Slot]] = {}
    sizes: dict[tuple, int] = {}
    closed: list[tuple[int, Bucket]] = []  # (index of first parameter, bucket)
    first: dict[tuple, int] = {}

    def close(key):
        kind, frozen, at_use, compute_dtype, reduce_dtype, param_dtype, _ = key
        bucket = Bucket(
            kind,
            tuple(open_.pop(key)),
            sizes.pop(key),
            compute_dtype,
            reduce_dtype,
            param_dtype,
            frozen=frozen,
            at_use=at_use,
        )
        closed.append((first.pop(key), bucket))

    for index, e in enumerate(entries):
        key = (e.kind, e.frozen, e.at_use, e.compute_dtype, e.reduce_dtype, e.param_dtype, e.slot.n)
        itemsize = torch.empty((), dtype=e.reduce_dtype).element_size()
        if key in open_ and (sizes[key] + e.slot.numel) * itemsize > cap_bytes:
            close(key)
        if key not in open_:
            open_[key], sizes[key], first[key] = [], 0, index
        open_[key].append(dataclasses.replace(e.slot, offset=sizes[key]))
        sizes[key] += e.slot.numel
    for key in list(open_):
        close(key)
    return [bucket for _, bucket in sorted(closed, key=lambda item: item[0])]
