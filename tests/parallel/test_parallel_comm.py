"""Collective wrappers and the byte counter."""

import pytest
import torch

from functrain.parallel import comm


@pytest.mark.parametrize(
    "op, n, expected",
    [
        ("all_reduce", 2, 1000.0),  # 2 (n-1)/n of 1000 bytes
        ("all_reduce", 4, 1500.0),
        ("all_gather", 4, 750.0),
        ("reduce_scatter", 2, 500.0),
        ("broadcast", 8, 1000.0),
        ("all_reduce", 1, 0.0),
    ],
)
def test_ring_bytes(op, n, expected):
    assert comm.ring_bytes(op, 1000, n) == expected


def test_ring_bytes_rejects_unknown_ops():
    with pytest.raises(ValueError, match="unknown collective"):
        comm.ring_bytes("all_to_all", 10, 2)


def test_counter_records_and_resets():
    counter = comm.CommCounter()
    counter.record("all_reduce", 400, 2)
    counter.record("all_gather", 400, 4)
    assert counter.calls == {"all_reduce": 1, "all_gather": 1}
    assert counter.sent_bytes == 400 + 300
    snap = counter.snapshot()
    counter.reset()
    assert (
        counter.sent_bytes == 0 and not counter.calls and snap["payload_bytes"]["all_gather"] == 400
    )


def test_one_rank_groups_copy_and_count_nothing(mesh1):
    group = mesh1["dp_shard"].get_group()
    before = comm.COUNTER.snapshot()
    out = torch.empty(3)
    assert comm.all_gather_into(out, torch.arange(3.0), group) is None
    assert torch.equal(out, torch.arange(3.0))
    red = torch.empty(3)
    comm.reduce_scatter_into(red, torch.ones(3), group)
    assert torch.equal(red, torch.ones(3))
    x = torch.ones(2)
    assert comm.all_reduce_(x, group) is None and torch.equal(x, torch.ones(2))
    assert comm.COUNTER.snapshot() == before
