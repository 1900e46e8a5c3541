"""`sync_batchnorm` (issue 30.1): BatchNorm over the global batch of the data-parallel ranks.

The multi-rank check (2 ranks under ddp and fsdp equal one process on the global batch,
parameters and running statistics) is in test_parallel_multirank.py; here, in one process, the
conversion keeps names and values and a world of one behaves as plain BatchNorm.
"""

import pytest
import torch
from torch import nn

from functrain.parallel.sync_bn import SyncBatchNorm, sync_batchnorm


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.BatchNorm1d(64))


def test_conversion_keeps_names_values_and_mode(mesh1):
    plain = _net()
    with torch.no_grad():
        plain[1].running_mean.add_(0.5)
    plain.eval()
    synced = sync_batchnorm(_net().eval(), mesh1)
    synced.load_state_dict(plain.state_dict())
    assert isinstance(synced[1], SyncBatchNorm) and isinstance(synced[3], SyncBatchNorm)
    assert list(synced.state_dict()) == list(plain.state_dict())
    assert not synced[1].training


@pytest.mark.parametrize("momentum", [0.1, None])
def test_one_rank_is_plain_batchnorm_in_training_and_evaluation(mesh1, momentum):
    plain, synced = _net(), sync_batchnorm(_net(), mesh1)
    for model in (plain, synced):
        model[1].momentum = momentum
    x = torch.randn(5, 3, 6, 6)
    for _ in range(2):
        assert torch.equal(plain(x), synced(x))
    assert all(
        torch.equal(a, b) for a, b in zip(plain.state_dict().values(), synced.state_dict().values())
    )
    plain.eval(), synced.eval()
    assert torch.equal(plain(x), synced(x))


def test_rejects_a_one_dimensional_input(mesh1):
    with pytest.raises(ValueError, match=r"\(N, C, ...\)"):
        sync_batchnorm(nn.BatchNorm1d(3), mesh1)(torch.randn(3))
