"""Staging: a state's leaves described for the checkpoint and this rank's data taken to the host.

The first of a save's two steps (see `writer`), and the only one that has to block training.
`stage(state)` flattens the state by path, describes every leaf (dtype, shape, chunking, and for a
DTensor its mesh and placements) and copies the region this rank writes off the device: each shard
once, replicas only on the rank that owns them. For an asynchronous save the copies go into host
buffers kept from one save to the next (pinned for device tensors, so the copy does not stall),
because the step may update the state in place while the write is still running. Copies off a
CUDA device are queued on its stream and not waited for: the writer waits
(`Staged.wait_for_copies`), the step's next kernels run after them.

Example:
    >>> buffers = {}  # kept by the caller: the next save reuses them
    >>> staged = stage(state, copy=True, buffers=buffers)
    >>> staged.nbytes == sum(item.data.nbytes for item in staged.leaves if item.data is not None)
    True
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import numpy as np
import optree
import torch

from .. import _torch
from .._lazy import is_dtensor
from ..tree import NAMESPACE
from . import layout
from .dtypes import to_numpy, zarr_name
from .errors import CheckpointError
from .sharding import chunk_shape, local_region, shard_boxes
from .structure import of_treedef


@dataclasses.dataclass
class StagedLeaf:
    """A leaf described for tree.json, with the data this rank writes (None: nothing)."""

    record: layout.LeafRecord
    region: tuple[slice, ...] | None = None
    data: np.ndarray | None = None


@dataclasses.dataclass
class Staged:
    """A state taken off the device, ready for `write`."""

    leaves: list[StagedLeaf]
    treedef: str
    step: int | None
    timestamp: dict | None
    rank: int
    world_size: int
    nbytes: int  # bytes of tensor data this rank writes
    empty_nodes: list = dataclasses.field(default_factory=list)  # for orbax: (path, types, kind)
    landed: list = dataclasses.field(default_factory=list)  # CUDA events of the copies (below)

    def wait_for_copies(self) -> None:
        """Block until the device-to-host copies of `stage` are in the host buffers.

        They run on the devices' current streams, ordered before whatever the step does next
        (an in-place update waits for them on the device, not on the host), so `stage` does not
        wait for them: the writer calls this before it reads a buffer.
        """
        for event in self.landed:
            event.synchronize()


def dist_info(group=None) -> tuple[int, int]:
    """`(rank, world_size)` in `group` (`(0, 1)` without torch.distributed)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(group), torch.distributed.get_world_size(group)
    return 0, 1


def stage(
    state: Any,
    *,
    copy: bool = False,
    buffers: dict[str, torch.Tensor] | None = None,
    group=None,
    plans: dict | None = None,
) -> Staged:
    """Describe every leaf of `state` and take this rank's data to the host.

    Args:
        state: any functrain pytree (a `TrainState`, nested dicts/NamedTuples) of tensors,
            DTensors and plain scalars (int, float, bool, str).
        copy: copy the data even when it is already in host memory (needed when the state may
            change before `write` runs, as with an asynchronous save).
        buffers: host buffers from an earlier `stage`, reused when shapes match (filled in).
        group: the process group of the ranks that save together (None: the default group).
        plans: what earlier stages decided per structure (filled in): a state of the same
            structure, with plain tensors of the same dtypes and shapes, reuses their
            descriptions (a performance cache; the step waits for `stage`).
    Returns:
        the `Staged` state.
    """
    rank, world = dist_info(group)
    leaves, treedef = optree.tree_flatten(state, namespace=NAMESPACE)
    found, text = of_treedef(treedef)  # memoized: a known structure is not walked again
    if treedef.num_nodes == 1 and leaves:
        raise CheckpointError(
            "save expects a pytree such as a TrainState or a dict; wrap a lone tensor as "
            "{'name': tensor}"
        )
    staged: list[StagedLeaf] = []
    seen: set[str] = set()
    nbytes = 0
    copies = _Copies()
    plan = None if plans is None else plans.get((text, rank, world))
    new_plan: list[_Known | None] = []
    for index, (leaf, path, types) in enumerate(zip(leaves, found.paths, found.key_types)):
        known = None if plan is None else plan[index]
        if known is not None and not known.fits(leaf):  # another dtype or shape: described anew
            known = None
        if known is not None:  # this structure's keys were checked
            item = known.stage(leaf, copy, buffers, copies)
        else:
            record = layout.LeafRecord(path=path, key_types=types, kind="")
            if plan is None:
                _check_new_key(record.key, seen)
            if isinstance(leaf, torch.Tensor):
                item = _stage_tensor(leaf, record, rank, copy, buffers, copies)
            else:
                item = StagedLeaf(_scalar_record(leaf, record))
        if item.data is not None:
            nbytes += item.data.nbytes
        staged.append(item)
        if plans is not None:
            new_plan.append(known or _Known.of(leaf, item))
    if plans is not None:
        plans[(text, rank, world)] = new_plan
    landed = copies.finish()
    step = getattr(state, "step", None)
    return Staged(
        leaves=staged,
        treedef=text,
        step=int(step) if isinstance(step, int) else None,
        timestamp=_as_dict(getattr(state, "timestamp", None)),
        rank=rank,
        world_size=world,
        nbytes=nbytes,
        empty_nodes=list(found.empty_nodes) if rank == 0 else [],
        landed=landed,
    )


def _as_dict(timestamp: Any) -> dict | None:
    """A dataclass timestamp as a dict (a flat one of plain values, as `Timestamp` is, without
    `dataclasses.asdict`'s deep copy: ~3 us, not ~20); a dict as is; anything else None."""
    if dataclasses.is_dataclass(timestamp) and not isinstance(timestamp, type):
        flat = {f.name: getattr(timestamp, f.name) for f in dataclasses.fields(timestamp)}
        if all(type(value) in (int, float, bool, str) for value in flat.values()):
            return flat
        return dataclasses.asdict(timestamp)
    return timestamp if isinstance(timestamp, dict) else None


def _check_new_key(key: str, seen: set[str]) -> None:
    layout.check_key(key, "saving")
    if key in seen:
        raise CheckpointError(
            f"two leaves share the dotted path {key!r}; rename a dict key so that the joined "
            "paths differ"
        )
    seen.add(key)


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)  # not DTensors: those are decided per save


@dataclasses.dataclass
class _Known:
    """A plain tensor leaf as an earlier stage described it: its record (never modified after
    staging, so shared between saves), the dtype and shape it was made for, its region, and
    once a copying stage put it in a host buffer of its own, that buffer and the `StagedLeaf`
    that holds the buffer's numpy view (the same object save after save: its data is the
    buffer, refilled by each copy)."""

    record: layout.LeafRecord
    dtype: torch.dtype
    shape: torch.Size
    region: tuple[slice, ...] | None
    buffer: torch.Tensor | None = None
    item: StagedLeaf | None = None

    @classmethod
    def of(cls, leaf: Any, item: StagedLeaf) -> _Known | None:
        if type(leaf) not in _PLAIN_TENSORS:  # DTensors: decided per save
            return None
        known = cls(item.record, leaf.dtype, leaf.shape, item.region)
        if item.region is None:  # another rank writes it: nothing changes from save to save
            known.item = item
        return known

    def fits(self, leaf: Any) -> bool:
        return (
            type(leaf) in _PLAIN_TENSORS
            and leaf.dtype is self.dtype
            and leaf.shape == self.shape
            and not leaf.is_meta
        )

    def stage(self, leaf: torch.Tensor, copy: bool, buffers, copies: _Copies) -> StagedLeaf:
        if self.region is None:  # another rank writes it
            return self.item or StagedLeaf(self.record)
        buffer, kept = self.buffer, self.item
        if kept is not None and copy and leaf.is_cpu and buffers.get(self.record.key) is buffer:
            copies.host.append((buffer, leaf))  # into the buffer of the save before
            return kept
        host = _to_host(leaf.detach(), self.record.key, copy, buffers, copies)
        item = StagedLeaf(self.record, self.region, to_numpy(host))
        if copy and buffers is not None and buffers.get(self.record.key) is host and leaf.is_cpu:
            self.buffer, self.item = host, item
        return item


def _scalar_record(value: Any, record: layout.LeafRecord) -> layout.LeafRecord:
    if isinstance(value, (bool, np.bool_)):
        record.kind, record.value = "bool", bool(value)
    elif isinstance(value, (int, np.integer)):
        record.kind, record.value = "int", int(value)
    elif isinstance(value, (float, np.floating)):
        record.kind, record.value = "float", float(value)
    elif isinstance(value, str):
        record.kind, record.value = "str", value
    else:
        raise CheckpointError(
            f"leaf {record.key!r} is a {type(value).__name__}; checkpoints store tensors, "
            "DTensors, int, float, bool and str leaves -- convert it to one of those (a "
            "tensor or a plain number) or keep it out of the state"
        )
    return record


def _stage_tensor(tensor, record, rank, copy, buffers, copies: _Copies) -> StagedLeaf:
    where = f"leaf {record.key!r}"
    if tensor.device.type == "meta":
        raise CheckpointError(f"{where} is a meta tensor (no data); materialize it before saving")
    record.kind, record.dtype = "tensor", zarr_name(tensor.dtype, where)
    record.shape = tuple(tensor.shape)
    itemsize = tensor.element_size()
    if is_dtensor(tensor):
        tensor = _without_partial(tensor)
        offset, shape, writes = local_region(tensor, where)
        mesh = tensor.device_mesh
        texts = tuple(_placement_text(p) for p in tensor.placements)
        boxes = shard_boxes(record.shape, tuple(mesh.shape), texts)
        offsets = [o for _, o, s in boxes if math.prod(s)]
        record.chunks = chunk_shape(record.shape, offsets, itemsize)
        record.layout = {
            "mesh_shape": list(mesh.shape),
            "mesh_dim_names": list(mesh.mesh_dim_names) if mesh.mesh_dim_names else None,
            "placements": list(texts),
        }
        local = tensor.to_local() if writes else None
    else:
        offset, shape, writes = (0,) * tensor.dim(), record.shape, rank == 0
        record.chunks = _whole_array_chunks(record.shape, itemsize)
        local = tensor if writes else None
    if local is None:
        return StagedLeaf(record)
    host = _to_host(local.detach(), record.key, copy, buffers, copies)
    region = tuple(slice(o, o + s) for o, s in zip(offset, shape))
    return StagedLeaf(record, region, to_numpy(host))


@functools.lru_cache(maxsize=256)
def _whole_array_chunks(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """The chunk shape of an array written whole by one rank (a function of its arguments,
    memoized: a state has few distinct shapes, and a save asks once per leaf)."""
    return chunk_shape(shape, [(0,) * len(shape)], itemsize)


def _placement_text(placement) -> str:
    from .sharding import placement_str

    return placement_str(placement)


def _without_partial(dtensor):
    """Reduce Partial placements (pending sums) to Replicate so the saved value is final."""
    from torch.distributed.tensor import Partial, Replicate

    if any(isinstance(p, Partial) for p in dtensor.placements):
        placements = [Replicate() if isinstance(p, Partial) else p for p in dtensor.placements]
        dtensor = dtensor.redistribute(placements=placements)
    return dtensor


def _to_host(tensor, key, copy, buffers, copies: _Copies) -> torch.Tensor:
    """`tensor` in host memory: itself, or the buffer it is copied into (`copies` runs it)."""
    on_host = tensor.device.type == "cpu"
    if on_host and not copy:
        return tensor
    buffer = None if buffers is None else buffers.get(key)
    if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
        pin = tensor.is_cuda  # a non-blocking copy needs page-locked memory
        buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pin)
        if buffers is not None:
            buffers[key] = buffer
    if on_host:
        copies.host.append((buffer, tensor))
    elif tensor.is_cuda:
        buffer.copy_(tensor, non_blocking=True)  # on the tensor's stream (see `_Copies`)
        copies.devices.add(tensor.device)
    else:  # another accelerator: copied before the step goes on
        buffer.copy_(tensor)
    return buffer


@dataclasses.dataclass
class _Copies:
    """The copies of one stage. Host copies run together at the end, as one foreach copy:
    torch's copy on the intra-op threads the step just used (they are still awake; copies on
    threads of our own contend with them), with one call's overhead for all leaves. CUDA
    copies are queued at once, non-blocking into pinned memory, on each device's current
    stream: the step's next kernels, an in-place update among them, run after them, so the
    host does not wait; `finish` records an event behind them for the writer
    (`Staged.wait_for_copies`). The state's host tensors are not read after `finish`."""

    host: list[tuple[torch.Tensor, torch.Tensor]] = dataclasses.field(default_factory=list)
    devices: set = dataclasses.field(default_factory=set)

    def finish(self) -> list:
        """Run the host copies; return the events the device copies complete at."""
        if self.host:
            buffers, tensors = zip(*self.host)
            with torch.no_grad():  # tensors that require grad are copied as values
                _torch.foreach_copy_(list(buffers), list(tensors))
        landed = []
        for device in self.devices:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            landed.append(event)
        return landed
