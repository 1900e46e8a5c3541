"""Which region of a tensor each rank writes and reads, and how arrays are chunked.

A DTensor's shard on one rank is a box of the global tensor (`Shard` placements cut it with
`torch.chunk` semantics, `Replicate` leaves it whole). A checkpoint writes each box once (replicas
on mesh coordinate 0 write, the others skip) into a zarr3 array whose chunk grid puts every shard
boundary on a chunk boundary, so no two ranks ever write one chunk. Any other mesh then reads just
the boxes its own placements ask for.

Example:
    >>> shard_boxes((10, 4), mesh_shape=(3,), placements=("S(0)",))
    [((0,), (0, 0), (4, 4)), ((1,), (4, 0), (4, 4)), ((2,), (8, 0), (2, 4))]
    >>> chunk_shape((10, 4), [b for _, b, _ in shard_boxes((10, 4), (3,), ("S(0)",))], 4)
    (4, 4)
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch

from .. import _torch

# Arrays are cut into chunks of at most this many bytes where shard boundaries allow: smaller
# chunks let a reader on another mesh fetch little more than its own region, and let tensorstore
# encode and write several chunks in parallel.
TARGET_CHUNK_BYTES = 32 * 2**20


def placement_str(placement) -> str:
    """A placement as text: "R", "S(0)", "P(sum)"."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    if type(placement) is Shard:
        return f"S({placement.dim})"
    if isinstance(placement, Replicate):
        return "R"
    if isinstance(placement, Partial):
        return f"P({placement.reduce_op})"
    return repr(placement)


def _shard_dim(text: str) -> int | None:
    return int(text[2:-1]) if text.startswith("S(") else None


def shard_box(
    global_shape: Sequence[int],
    mesh_shape: Sequence[int],
    placements: Sequence[str],
    coord: Sequence[int],
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The `(offset, shape)` box of the shard held at mesh coordinate `coord`.

    Args:
        global_shape: the tensor's global shape.
        mesh_shape: the device mesh's shape.
        placements: one "R" or "S(d)" per mesh dimension (see `placement_str`).
        coord: the rank's coordinate in the mesh.
    Returns:
        the box's offset and shape (an empty box has a 0 in its shape).
    """
    start = [0] * len(global_shape)
    size = list(global_shape)
    for mesh_dim, text in enumerate(placements):
        dim = _shard_dim(text)
        if dim is None:
            continue
        n = mesh_shape[mesh_dim]
        full = -(-size[dim] // n)  # torch.chunk: ceil-sized pieces, the last ones smaller
        lo = min(size[dim], full * coord[mesh_dim])
        hi = min(size[dim], lo + full)
        start[dim] += lo
        size[dim] = hi - lo
    return tuple(start), tuple(size)


def shard_boxes(global_shape, mesh_shape, placements):
    """`[(coord, offset, shape), ...]` for every coordinate of the mesh (see `shard_box`)."""
    coords = itertools.product(*(range(n) for n in mesh_shape))
    return [(c, *shard_box(global_shape, mesh_shape, placements, c)) for c in coords]


def chunk_shape(
    global_shape: Sequence[int],
    offsets: Sequence[Sequence[int]],
    itemsize: int,
    target_bytes: int | None = None,
) -> tuple[int, ...]:
    """A zarr chunk shape that puts every shard boundary on a chunk boundary.

    A dimension cut at offsets o_1..o_k gets a chunk size dividing gcd(o_i), so ranks never share
    a chunk, uneven shards included; uncut dimensions are whole. Chunks larger than `target_bytes`
    are split further along their first dimension where divisibility allows.

    Args:
        global_shape: the array's shape.
        offsets: the offsets of the non-empty shards (one offset tuple per shard).
        itemsize: bytes per element.
        target_bytes: the preferred upper bound on a chunk's size (default TARGET_CHUNK_BYTES).
    Returns:
        the chunk shape (every entry >= 1).
    """
    target_bytes = target_bytes or TARGET_CHUNK_BYTES
    chunks, cut = [], []
    for dim, size in enumerate(global_shape):
        step = 0
        for offset in offsets:
            step = math.gcd(step, offset[dim])
        chunks.append(max(1, step if step else size))
        cut.append(bool(step))
    nbytes = itemsize * math.prod(chunks)
    for dim, extent in enumerate(chunks):
        if nbytes <= target_bytes:
            break
        if extent <= 1:
            continue
        pieces = -(-nbytes // target_bytes)
        if not cut[dim]:
            new = -(-extent // pieces)
        else:  # must divide the shard step: the smallest divisor of `extent` giving enough pieces
            divisor = next((k for k in range(pieces, min(extent, 64) + 1) if extent % k == 0), 1)
            new = extent // divisor
        nbytes = nbytes // extent * new
        chunks[dim] = new
    return tuple(chunks)


def check_placements(dtensor, where: str) -> tuple[str, ...]:
    """The placements of `dtensor` as text; error on those checkpoints cannot address."""
    texts = tuple(placement_str(p) for p in dtensor.placements)
    for text in texts:
        if text != "R" and _shard_dim(text) is None and not text.startswith("P("):
            raise NotImplementedError(
                f"{where}: placement {text} is not supported by checkpoints (its shards are not "
                "contiguous boxes); redistribute it to Shard/Replicate placements before saving"
            )
    return texts


def local_region(dtensor, where: str) -> tuple[tuple[int, ...], tuple[int, ...], bool]:
    """This rank's `(offset, shape, writes)` for a DTensor (`writes`: the first replica).

    Args:
        dtensor: a DTensor with Shard/Replicate placements.
        where: the leaf's name, for error messages.
    Returns:
        the local box and whether this rank is the one that writes it.
    """

    texts = check_placements(dtensor, where)
    mesh = dtensor.device_mesh
    coord = mesh.get_coordinate()
    if coord is None:  # this rank is not part of the tensor's mesh
        return tuple(0 for _ in dtensor.shape), tuple(0 for _ in dtensor.shape), False
    shape, offset = _torch.local_shape_and_offset(dtensor.shape, mesh, dtensor.placements)
    mine = shard_box(tuple(dtensor.shape), tuple(mesh.shape), texts, coord)
    if math.prod(shape) and (tuple(offset), tuple(shape)) != mine:
        raise AssertionError(f"{where}: shard box {mine} disagrees with torch's {offset, shape}")
    first_replica = all(c == 0 for c, t in zip(coord, texts) if _shard_dim(t) is None)
    return tuple(offset), tuple(shape), first_replica and math.prod(shape) > 0


def dtensor_from_local(local: torch.Tensor, like):
    """A DTensor placed like `like` (a DTensor) whose shard on this rank is `local`, on
    `local`'s device (a host shard of `fsdp(offload=True)` stays on the host)."""
    from ..parallel.offload import dtensor_like

    return dtensor_like(local, like)
