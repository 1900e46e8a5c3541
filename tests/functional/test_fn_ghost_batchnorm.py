"""Ghost BatchNorm: BatchNorm in eval, and in training when one ghost batch covers the batch."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from functrain.functional.ghost_batchnorm import (
    GhostBatchNorm1d,
    GhostBatchNorm2d,
    apply_ghost_batchnorm,
)


def _pair(seed, momentum=0.1):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(2, 4, 1), nn.BatchNorm2d(4, momentum=momentum))
    with torch.no_grad():
        model[1].running_mean.uniform_(-1, 1)
        model[1].weight.uniform_(0.5, 1.5)
    return model, apply_ghost_batchnorm(model, ghost_batch_size=4)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), batch=st.integers(2, 12))
def test_eval_mode_is_batchnorm_exactly(seed, batch):
    model, ghost = _pair(seed)
    model.eval()
    ghost.eval()
    x = torch.randn(batch, 2, 3, 3)
    assert torch.equal(ghost(x), model(x))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), batch=st.integers(2, 4), momentum=st.sampled_from([0.1, None]))
def test_one_ghost_batch_is_batchnorm_exactly_in_training(seed, batch, momentum):
    model, ghost = _pair(seed, momentum)
    x = torch.randn(batch, 2, 3, 3)
    assert torch.equal(ghost(x), model(x))
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        assert torch.equal(getattr(ghost[1].batchnorm, name), getattr(model[1], name))


def test_each_ghost_batch_is_normalized_on_its_own():
    bn = apply_ghost_batchnorm(nn.BatchNorm1d(3, affine=False), ghost_batch_size=4)
    assert isinstance(bn, GhostBatchNorm1d)
    x = torch.randn(12, 3) + torch.arange(12.0)[:, None]  # chunks with different means
    out = bn(x)
    for chunk in out.split(4):
        torch.testing.assert_close(chunk.mean(0), torch.zeros(3), atol=1e-5, rtol=0)
    assert int(bn.batchnorm.num_batches_tracked) == 3
    # the running mean moved by momentum/3 per chunk (three chunks, so ~ one momentum overall)
    expected = torch.zeros(3)
    for chunk in x.split(4):
        expected = expected + 0.1 / 3 * (chunk.mean(0) - expected)
    torch.testing.assert_close(bn.batchnorm.running_mean, expected)


def test_composers_state_dict_names_and_bad_size():
    model = nn.Sequential(nn.BatchNorm2d(4))
    new = apply_ghost_batchnorm(model, 8)
    assert isinstance(new[0], GhostBatchNorm2d) and isinstance(new[0].batchnorm, nn.BatchNorm2d)
    # Composer's _GhostBatchNorm keeps the BatchNorm as its `batchnorm` child.
    assert list(new.state_dict()) == [f"0.batchnorm.{k}" for k in model[0].state_dict()]
    saved = {k: v + 1 if v.is_floating_point() else v for k, v in new.state_dict().items()}
    apply_ghost_batchnorm(model, 8).load_state_dict(saved, strict=True)
    with pytest.raises(ValueError, match="ghost_batch_size"):
        apply_ghost_batchnorm(model, 0)


# -- by hand: the cumulative average, untracked statistics, the default size, bad input -----------


def _hand_normalized(chunk: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    mean = chunk.sum(0) / chunk.shape[0]
    var = (chunk - mean).square().sum(0) / chunk.shape[0]  # biased, as BatchNorm normalizes
    return (chunk - mean) / (var + eps).sqrt()


def test_momentum_none_averages_every_ghost_batch_seen():
    bn = apply_ghost_batchnorm(nn.BatchNorm1d(2, momentum=None, affine=False), ghost_batch_size=3)
    torch.manual_seed(0)
    x = torch.randn(9, 2) * torch.tensor([1.0, 3.0]) + torch.arange(9.0)[:, None]
    torch.testing.assert_close(bn(x), torch.cat([_hand_normalized(c) for c in x.split(3)]))
    chunks = x.split(3)
    means = torch.stack([c.sum(0) / 3 for c in chunks])
    variances = torch.stack([(c - m).square().sum(0) / 2 for c, m in zip(chunks, means)])
    torch.testing.assert_close(bn.batchnorm.running_mean, means.sum(0) / 3)
    torch.testing.assert_close(bn.batchnorm.running_var, variances.sum(0) / 3)  # unbiased
    assert int(bn.batchnorm.num_batches_tracked) == 3


def test_untracked_statistics_normalize_each_ghost_batch_and_store_nothing():
    bn = nn.BatchNorm1d(2, affine=False, track_running_stats=False)
    ghost = apply_ghost_batchnorm(bn, ghost_batch_size=2)
    x = torch.randn(6, 2) + torch.arange(6.0)[:, None]
    torch.testing.assert_close(ghost(x), torch.cat([_hand_normalized(c) for c in x.split(2)]))
    assert ghost.batchnorm.running_mean is None and ghost.batchnorm.num_batches_tracked is None


def test_the_default_ghost_batch_is_32_samples():
    torch.manual_seed(1)
    x = torch.randn(64, 3) + torch.arange(64.0)[:, None]
    expected = torch.cat([_hand_normalized(x[:32]), _hand_normalized(x[32:])])
    for ghost in (apply_ghost_batchnorm(nn.BatchNorm1d(3)), GhostBatchNorm1d(nn.BatchNorm1d(3))):
        assert ghost.ghost_batch_size == 32
        torch.testing.assert_close(ghost(x), expected, rtol=1e-4, atol=1e-4)


def test_an_uneven_last_ghost_batch_and_a_batch_of_one_chunk():
    # 10 samples in ghost batches of 4: ceil(10 / 4) = 3 chunks of torch.chunk's sizes 4, 4, 2
    x = torch.randn(10, 2) + torch.arange(10.0)[:, None]
    ghost = apply_ghost_batchnorm(nn.BatchNorm1d(2, affine=False), ghost_batch_size=4)
    expected = torch.cat([_hand_normalized(c) for c in (x[:4], x[4:8], x[8:])])
    torch.testing.assert_close(ghost(x), expected)
    assert int(ghost.batchnorm.num_batches_tracked) == 3


def test_wrong_norms_inputs_and_sizes_are_refused():
    with pytest.raises(TypeError, match="GhostBatchNorm2d wraps a BatchNorm2d"):
        GhostBatchNorm2d(nn.BatchNorm1d(2))
    with pytest.raises(ValueError, match="4D input"):
        GhostBatchNorm2d(nn.BatchNorm2d(2))(torch.randn(3, 2))
    for bad in (-1, 2.0, "8"):
        with pytest.raises(ValueError, match="ghost_batch_size must be a positive int"):
            apply_ghost_batchnorm(nn.BatchNorm1d(2), bad)
    assert apply_ghost_batchnorm(nn.BatchNorm1d(2), 1).ghost_batch_size == 1


def test_tracking_switched_off_after_construction_leaves_the_statistics_alone():
    # torch's BatchNorm: with track_running_stats set to False later, training updates nothing
    plain = nn.BatchNorm1d(2)
    plain.track_running_stats = False
    ghost = apply_ghost_batchnorm(plain, ghost_batch_size=2)
    x = torch.randn(4, 2) + 3.0
    plain(x)  # torch's own behaviour, for reference
    ghost(x)
    for bn in (plain, ghost.batchnorm):
        assert torch.equal(bn.running_mean, torch.zeros(2))
        assert torch.equal(bn.running_var, torch.ones(2))
        assert int(bn.num_batches_tracked) == 0
