"""Shard boxes and chunk grids (properties), and real multi-process resharding on gloo."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
from checkpoint_worker import SHAPES, build, reference, zeros
from ckpt_helpers import same_bits
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

from functrain import checkpoint
from functrain.checkpoint import array_store, sharding


@st.composite
def layouts(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(0, 13), min_size=ndim, max_size=ndim)))
    mesh = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=2)))
    placements = tuple(
        draw(st.sampled_from(["R"] + [f"S({d})" for d in range(ndim)])) for _ in mesh
    )
    return shape, mesh, placements


def _torch_placements(texts):
    return [Replicate() if t == "R" else Shard(int(t[2:-1])) for t in texts]


@settings(max_examples=50, deadline=None)
@given(layouts())
def test_shard_boxes_match_torch(layout):
    shape, mesh, placements = layout
    for coord, offset, size in sharding.shard_boxes(shape, mesh, placements):
        want_size, want_offset = _compute_local_shape_and_global_offset(
            shape, mesh, list(coord), _torch_placements(placements)
        )
        assert tuple(size) == tuple(want_size)
        if math.prod(size):
            assert tuple(offset) == tuple(want_offset)


@settings(max_examples=50, deadline=None)
@given(layouts(), st.sampled_from([1, 2, 4]), st.sampled_from([8, 64, 10**6]))
def test_chunks_never_straddle_two_shards(layout, itemsize, target):
    shape, mesh, placements = layout
    boxes = [(o, s) for _, o, s in sharding.shard_boxes(shape, mesh, placements) if math.prod(s)]
    chunks = sharding.chunk_shape(shape, [o for o, _ in boxes], itemsize, target)
    assert len(chunks) == len(shape) and all(c >= 1 for c in chunks)
    for offset, size in boxes:
        for dim, chunk in enumerate(chunks):
            assert offset[dim] % chunk == 0  # each shard starts on a chunk boundary
            end = offset[dim] + size[dim]
            assert end % chunk == 0 or end == shape[dim]  # and ends on one (or at the edge)


def test_chunk_shape_examples():
    assert sharding.chunk_shape((10, 4), [(0, 0), (4, 0), (8, 0)], 4) == (4, 4)
    assert sharding.chunk_shape((7,), [(0,)], 4) == (7,)
    assert sharding.chunk_shape((), [()], 4) == ()
    assert sharding.chunk_shape((0, 3), [], 4) == (1, 3)
    # A large unsharded tensor is cut along its first dimension, any size allowed.
    assert sharding.chunk_shape((1000, 1000), [(0, 0)], 4, 1_000_000) == (250, 1000)


def _launch(worlds: tuple[int, ...], root: str, rendezvous_dir: str) -> None:
    worker = os.path.join(os.path.dirname(__file__), "checkpoint_worker.py")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    command = [sys.executable, worker, root, rendezvous_dir, *map(str, worlds)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]


@pytest.mark.slow
def test_any_mesh_to_any_mesh_bitwise(tmp_path, monkeypatch):
    """Saved on 1, 2, 4 and 3 ranks, each loaded by every later world size with other placements
    (uneven and empty shards, 2-D meshes, replicas), and finally by one process: bitwise equal.
    The single-process save is there twice: a directory per leaf, and consolidated (OCDBT)."""
    ref = reference()
    root = str(tmp_path / "ckpts")
    os.makedirs(root)
    checkpoint.save(os.path.join(root, "saved_1"), build(ref))  # a plain, unsharded save
    consolidated = os.path.join(root, "saved_1_consolidated")
    with monkeypatch.context() as patch:
        patch.setattr(array_store, "CONSOLIDATE_BELOW", 2**30)
        checkpoint.save(consolidated, build(ref))
    assert os.path.isfile(os.path.join(consolidated, "manifest.ocdbt"))
    _launch((2, 4, 3), root, str(tmp_path))
    for saved in sorted(d for d in os.listdir(root) if d.startswith("saved_")):
        loaded = checkpoint.load(os.path.join(root, saved), like=build(zeros(ref), blank=True))
        assert loaded.step == 3 and loaded.extra == {"note": "resharded", "lr": 0.5}
        for name in SHAPES:
            assert same_bits(loaded.params[name], ref[name]), f"{saved}: {name}"
    # Each rank wrote only its own chunks: on the 4-rank 2-D save, params.w (Shard(0), Shard(1)
    # over a 2x2 mesh, shape 10x6) has exactly 2x2 chunks of 5x3.
    chunk_dir = os.path.join(root, "saved_4", "params.w", "c")
    chunks = sorted(
        os.path.relpath(os.path.join(d, f), chunk_dir)
        for d, _, fs in os.walk(chunk_dir)
        for f in fs
    )
    assert chunks == ["0/0", "0/1", "1/0", "1/1"]
