"""Staging: a state's leaves described for the checkpoint and this rank's data taken to the host.

The first of a save's two steps (see `writer`), and the only one that has to block training.
`stage(state)` flattens the state by path, describes every leaf (dtype, shape, chunking, and for a
DTensor its mesh and placements) and copies the region this rank writes off the device: each shard
once, replicas only on the rank that owns them. For an asynchronous save the copies go into host
buffers kept from one save to the next (pinned for device tensors, so the copy does not stall),
because the step may update the state in place while the write is still running.

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
from ..tree import NAMESPACE, key_to_str
from . import layout
from .dtypes import to_numpy, zarr_name
from .errors import CheckpointError
from .sharding import chunk_shape, local_region, shard_boxes


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


def dist_info(group=None) -> tuple[int, int]:
    """`(rank, world_size)` in `group` (`(0, 1)` without torch.distributed)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(group), torch.distributed.get_world_size(group)
    return 0, 1


@dataclasses.dataclass(frozen=True)
class Structure:
    """What a save needs of a pytree's structure, independent of its leaves' values.

    Attributes:
        paths: every leaf's path as strings, in flatten order.
        key_types: orbax's key type per path entry (`layout.KEY_SEQUENCE`/`KEY_MAPPING`).
        empty_nodes: `(path, key_types, kind)` of the empty containers (see `empty_nodes`).
    """

    paths: tuple[tuple[str, ...], ...]
    key_types: tuple[tuple[int, ...], ...]
    empty_nodes: tuple[tuple[tuple[str, ...], tuple[int, ...], str], ...]


def structure(treedef: Any, text: str) -> Structure:
    """The `Structure` of the pytrees of `treedef` (`text` is `str(treedef)`).

    A function of its arguments only, so it is memoized by them: a run saves one structure over
    and over, and walking it costs ~10 us per leaf (the text is part of the key because treedefs
    compare dict keys by value: `{1: x}` equals `{True: x}` but names its leaf "True").

    Example:
        >>> leaves, treedef = optree.tree_flatten({"a": 1, "b": []}, namespace=NAMESPACE)
        >>> structure(treedef, str(treedef)).empty_nodes
        ((('b',), (2,), 'List'),)
    """
    try:
        return _memoized_structure(treedef, text)
    except TypeError:  # a custom node whose metadata is not hashable: nothing to key a memo by
        return _walk_structure(treedef)


@functools.lru_cache(maxsize=16)
def _memoized_structure(treedef: Any, text: str) -> Structure:
    return _walk_structure(treedef)


def _walk_structure(treedef: Any) -> Structure:
    paths, key_types, empty = [], [], []
    # (spec, entries on the way to it), depth first in flatten order
    stack: list[tuple[Any, tuple]] = [(treedef, ())]
    while stack:
        spec, entries = stack.pop()
        if spec.is_leaf():
            paths.append(tuple(key_to_str(e) for e in entries))
            key_types.append(tuple(_key_type(e) for e in entries))
            continue
        if spec.num_children == 0:
            if entries:  # (an empty root is no entry of anything)
                path = tuple(key_to_str(e) for e in entries)
                empty.append((path, tuple(_key_type(e) for e in entries), _empty_kind(spec)))
            continue
        children = spec.children()
        accessors = spec.one_level().accessors()  # one entry per child, of optree's own kinds
        for child, accessor in reversed(list(zip(children, accessors))):
            stack.append((child, (*entries, accessor[0])))
    return Structure(tuple(paths), tuple(key_types), tuple(empty))


def _empty_kind(spec) -> str:
    if spec.kind == optree.PyTreeKind.NONE:
        return "None"
    if issubclass(spec.type, tuple):
        return "Tuple"
    return "List" if issubclass(spec.type, list) else "Dict"


def leaf_paths(tree: Any) -> tuple[list, list[tuple[str, ...]], list[tuple[int, ...]], Any]:
    """`(leaves, paths, key_types, treedef)` of a pytree, paths as tuples of strings."""
    leaves, treedef = optree.tree_flatten(tree, namespace=NAMESPACE)
    found = structure(treedef, str(treedef))
    return leaves, list(found.paths), list(found.key_types), treedef


def empty_nodes(tree: Any) -> list[tuple[tuple[str, ...], tuple[int, ...], str]]:
    """The empty containers of a pytree (`{}`, `()`, `None`, an empty NamedTuple) by path.

    They hold no leaf, but orbax lists them in `_METADATA`: without them, a sequence whose
    middle entry is empty (an optimizer chain with a stateless transform) has a hole orbax
    cannot rebuild.
    """
    treedef = optree.tree_structure(tree, namespace=NAMESPACE)
    return list(structure(treedef, str(treedef)).empty_nodes)


def _key_type(entry) -> int:
    named = (optree.NamedTupleEntry, optree.StructSequenceEntry)
    if isinstance(entry, optree.SequenceEntry) and not isinstance(entry, named):
        return layout.KEY_SEQUENCE
    return layout.KEY_MAPPING


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
    text = str(treedef)
    found = structure(treedef, text)  # the one walk of the tree's structure in a save
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
        if known is not None and known.fits(leaf):  # this structure's keys were checked
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
    copies.finish()
    timestamp = getattr(state, "timestamp", None)
    if dataclasses.is_dataclass(timestamp) and not isinstance(timestamp, type):
        timestamp = dataclasses.asdict(timestamp)
    step = getattr(state, "step", None)
    return Staged(
        leaves=staged,
        treedef=text,
        step=int(step) if isinstance(step, int) else None,
        timestamp=timestamp if isinstance(timestamp, dict) else None,
        rank=rank,
        world_size=world,
        nbytes=nbytes,
        empty_nodes=list(found.empty_nodes) if rank == 0 else [],
    )


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
    the host buffer a copying stage put it in, with that buffer's numpy view."""

    record: layout.LeafRecord
    dtype: torch.dtype
    shape: torch.Size
    region: tuple[slice, ...] | None
    buffer: torch.Tensor | None = None
    array: np.ndarray | None = None

    @classmethod
    def of(cls, leaf: Any, item: StagedLeaf) -> _Known | None:
        if type(leaf) not in _PLAIN_TENSORS:  # DTensors: decided per save
            return None
        return cls(item.record, leaf.dtype, leaf.shape, item.region)

    def fits(self, leaf: Any) -> bool:
        return (
            type(leaf) in _PLAIN_TENSORS
            and leaf.dtype is self.dtype
            and leaf.shape == self.shape
            and not leaf.is_meta
        )

    def stage(self, leaf: torch.Tensor, copy: bool, buffers, copies: _Copies) -> StagedLeaf:
        if self.region is None:  # another rank writes it
            return StagedLeaf(self.record)
        key, buffer = self.record.key, self.buffer
        if buffer is not None and copy and leaf.is_cpu and buffers.get(key) is buffer:
            copies.host.append((buffer, leaf))  # into the buffer of the save before
            return StagedLeaf(self.record, self.region, self.array)
        host = _to_host(leaf.detach(), key, copy, buffers, copies)
        array = to_numpy(host)
        if copy and buffers is not None and buffers.get(key) is host and leaf.is_cpu:
            self.buffer, self.array = host, array
        return StagedLeaf(self.record, self.region, array)


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
        pin = not on_host and torch.cuda.is_available()
        buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pin)
        if buffers is not None:
            buffers[key] = buffer
    if on_host:
        copies.host.append((buffer, tensor))
    else:
        buffer.copy_(tensor, non_blocking=True)
        copies.device += 1
    return buffer


@dataclasses.dataclass
class _Copies:
    """The copies of one stage: device-to-host copies start at once (non-blocking, pinned);
    host copies run together at the end, as one foreach copy: torch's copy on the intra-op
    threads the step just used (they are still awake; copies on threads of our own contend with
    them), with one call's overhead for all leaves. The state is not read after `finish`."""

    host: list[tuple[torch.Tensor, torch.Tensor]] = dataclasses.field(default_factory=list)
    device: int = 0

    def finish(self) -> None:
        if self.host:
            buffers, tensors = zip(*self.host)
            with torch.no_grad():  # tensors that require grad are copied as values
                _torch.foreach_copy_(list(buffers), list(tensors))
        if self.device and torch.cuda.is_available():
            torch.cuda.synchronize()  # the non-blocking device-to-host copies must have landed
