"""Flat buckets, checked by simulating every rank of a collective in one process."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.parallel import flat


def test_shard_extent_follows_dtensor_chunking():
    # 5 rows on 4 ranks: chunks of ceil(5/4) = 2, so 2, 2, 1 and an empty last shard
    assert [flat.shard_extent(5, 4, r) for r in range(4)] == [(2, 0), (2, 2), (1, 4), (0, 5)]
    assert [flat.shard_extent(6, 3, r) for r in range(3)] == [(2, 0), (2, 2), (2, 4)]


def test_slot_shapes_and_padding():
    slot = flat.make_slot("w", (5, 3), dim=0, n=2, rank=1, offset=0)
    assert slot.local_shape == (2, 3)
    assert slot.padded_local_shape == (3, 3)
    assert slot.numel == 9 and not slot.even
    whole = flat.make_slot("b", (4,), dim=None, n=1, rank=0, offset=0)
    assert whole.local_shape == (4,) and whole.numel == 4 and whole.even


def _layout(shapes_dims, n, rank, mode="shard", cap=1 << 30):
    entries = []
    for i, (shape, dim) in enumerate(shapes_dims):
        slot = flat.make_slot(
            f"p{i}", shape, dim if mode == "shard" else None, n if mode == "shard" else 1, rank, 0
        )
        kind = flat.Kind.SHARD if mode == "shard" else flat.Kind.REPLICATE
        entries.append(flat.Entry(slot, kind, torch.float32, torch.float32, torch.float32))
    return flat.build_buckets(entries, cap)


def _pieces(full, shape_dim, n, rank):
    shape, dim = shape_dim
    length, start = flat.shard_extent(shape[dim], n, rank)
    return full.narrow(dim, start, length)


shapes = st.lists(
    st.tuples(
        st.lists(st.integers(1, 6), min_size=1, max_size=3).map(tuple), st.integers(0, 2)
    ).map(lambda sd: (sd[0], sd[1] % len(sd[0]))),
    min_size=1,
    max_size=4,
)


@settings(max_examples=40, deadline=None)
@given(shapes=shapes, n=st.integers(1, 4), seed=st.integers(0, 1000))
def test_all_gather_round_trip(shapes, n, seed):
    """Every rank packs its pieces; the concatenated segments unpack to the whole tensors."""
    gen = torch.Generator().manual_seed(seed)
    fulls = [torch.randn(shape, generator=gen) for shape, _ in shapes]
    segments = []
    for rank in range(n):
        (bucket,) = _layout(shapes, n, rank)
        pieces = [_pieces(f, sd, n, rank) for f, sd in zip(fulls, shapes)]
        segments.append(flat.pack_shards(bucket, pieces, torch.empty(bucket.segment)))
    (bucket,) = _layout(shapes, n, 0)
    out = flat.unpack_gathered(bucket, torch.cat(segments))
    for got, want in zip(out, fulls):
        assert got.shape == want.shape and torch.equal(got, want)


@settings(max_examples=40, deadline=None)
@given(shapes=shapes, n=st.integers(1, 4), seed=st.integers(0, 1000))
def test_reduce_scatter_gives_each_rank_its_piece_of_the_sum(shapes, n, seed):
    gen = torch.Generator().manual_seed(seed)
    per_rank = [[torch.randn(shape, generator=gen) for shape, _ in shapes] for _ in range(n)]
    (bucket,) = _layout(shapes, n, 0)
    sends = [flat.pack_grads(bucket, grads, torch.empty(n * bucket.segment)) for grads in per_rank]
    total = torch.stack(sends).sum(0).view(n, bucket.segment)  # what reduce-scatter computes
    for rank in range(n):
        (bucket_r,) = _layout(shapes, n, rank)
        views = flat.unpack_reduced(bucket_r, total[rank].clone())
        for i, (view, sd) in enumerate(zip(views, shapes)):
            want = _pieces(sum(grads[i] for grads in per_rank), sd, n, rank)
            torch.testing.assert_close(view, want)


@settings(max_examples=30, deadline=None)
@given(shapes=shapes, seed=st.integers(0, 1000))
def test_replicate_bucket_round_trip(shapes, seed):
    gen = torch.Generator().manual_seed(seed)
    grads = [torch.randn(shape, generator=gen) for shape, _ in shapes]
    (bucket,) = _layout(shapes, 1, 0, mode="replicate")
    buffer = flat.pack_grads(bucket, grads, torch.empty(bucket.segment))
    assert buffer.numel() == sum(g.numel() for g in grads)
    for view, grad in zip(flat.unpack_reduced(bucket, buffer), grads):
        assert torch.equal(view, grad)


def test_build_buckets_caps_size_and_groups_kinds():
    shapes = [((4, 4), 0)] * 3
    buckets = _layout(shapes, 2, 0, cap=2 * 8 * 4)  # two 8-element pieces per bucket
    assert [len(b.slots) for b in buckets] == [2, 1]
    assert [s.offset for s in buckets[0].slots] == [0, 8]
    # interleaved kinds (sharded weights between replicated biases) still share one bucket each
    entries = []
    for i in range(4):
        sharded = i % 2 == 0
        slot = flat.make_slot(f"p{i}", (4,), 0 if sharded else None, 2 if sharded else 1, 0, 0)
        kind = flat.Kind.SHARD if sharded else flat.Kind.REPLICATE
        entries.append(flat.Entry(slot, kind, torch.float32, torch.float32, torch.float32))
    buckets = flat.build_buckets(entries, 1 << 20)
    assert [(b.kind, b.names) for b in buckets] == [
        (flat.Kind.SHARD, ("p0", "p2")),
        (flat.Kind.REPLICATE, ("p1", "p3")),
    ]


def test_frozen_and_gathered_at_use_parameters_keep_to_buckets_of_their_own():
    def entry(name, **flags):
        slot = flat.make_slot(name, (4,), 0, 2, 0, 0)
        return flat.Entry(slot, flat.Kind.SHARD, *(torch.float32,) * 3, **flags)

    entries = [entry("a"), entry("b", frozen=True), entry("c", at_use="m1"), entry("d")]
    entries += [entry("e", at_use="m1"), entry("f", at_use="m2")]
    buckets = flat.build_buckets(entries, 1 << 20)
    assert [(b.names, b.frozen, b.at_use, b.reshard) for b in buckets] == [
        (("a", "d"), False, None, False),
        (("b",), True, None, False),
        (("c", "e"), False, "m1", True),
        (("f",), False, "m2", True),
    ]


def test_pack_casts_to_bucket_dtype():
    slot = flat.make_slot("w", (4, 2), dim=0, n=2, rank=0, offset=0)
    bucket = flat.Bucket(
        flat.Kind.SHARD, (slot,), slot.numel, torch.bfloat16, torch.float32, torch.float32
    )
    out = flat.pack_shards(bucket, [torch.ones(2, 2)], torch.empty(4, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16 and bool((out == 1).all())


@pytest.mark.parametrize("dim", [0, 1])
def test_uneven_non_leading_dim(dim):
    shape = (3, 5)
    full = torch.arange(15.0).view(shape)
    n = 2
    segments = []
    for rank in range(n):
        (bucket,) = _layout([(shape, dim)], n, rank)
        segments.append(
            flat.pack_shards(
                bucket, [_pieces(full, (shape, dim), n, rank)], torch.empty(bucket.segment)
            )
        )
    (bucket,) = _layout([(shape, dim)], n, 0)
    (out,) = flat.unpack_gathered(bucket, torch.cat(segments))
    assert torch.equal(out, full) and out.is_contiguous()
