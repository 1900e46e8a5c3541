"""Fused LayerNorm: a warning no-op without CUDA and Apex."""

import pytest
import torch
from torch import nn

from functrain.functional.fused_layernorm import apply_fused_layernorm, fused_layernorm_available


def test_unavailable_means_an_unchanged_copy_and_a_warning():
    if fused_layernorm_available():
        pytest.skip("Apex is installed: the fused path is exercised instead")
    model = nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3))
    with pytest.warns(UserWarning, match="not available"):
        new = apply_fused_layernorm(model)
    assert new is not model and type(new[1]) is nn.LayerNorm
    x = torch.randn(2, 3)
    assert torch.equal(new(x), model(x))


# -- the fused path, with a stand-in for Apex (neither CUDA nor Apex runs here) -----------------


class _StandInFused(nn.LayerNorm):
    """Apex's `FusedLayerNorm(normalized_shape, eps, elementwise_affine)`, recording its calls."""

    def __init__(self, normalized_shape, eps, elementwise_affine):
        super().__init__(normalized_shape, eps, elementwise_affine)
        self.args = (tuple(self.normalized_shape), eps, elementwise_affine)
        self.moved_to = []
        if self.bias is not None:
            with torch.no_grad():
                self.bias.fill_(0.5)  # a fresh bias that is not zero, so zeroing it shows

    def to(self, *args, **kwargs):  # "cuda" cannot be reached here: record where it was sent
        self.moved_to.append(args)
        return self


@pytest.fixture
def stand_in_apex(monkeypatch):
    import importlib.machinery
    import sys
    import types

    apex = types.ModuleType("apex")
    apex.__spec__ = importlib.machinery.ModuleSpec("apex", None)
    normalization = types.ModuleType("apex.normalization")
    normalization.FusedLayerNorm = _StandInFused
    apex.normalization = normalization
    monkeypatch.setitem(sys.modules, "apex", apex)
    monkeypatch.setitem(sys.modules, "apex.normalization", normalization)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert fused_layernorm_available()


def test_layernorms_become_fused_with_their_weights_and_options(stand_in_apex):
    class SubclassedNorm(nn.LayerNorm):  # not exactly nn.LayerNorm: left alone
        pass

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.LayerNorm(4, eps=1e-3),
        nn.LayerNorm(4, bias=False),
        nn.LayerNorm(4, elementwise_affine=False),
        SubclassedNorm(4),
    )
    with torch.no_grad():
        model[0].weight.uniform_(0.5, 1.5)
        model[0].bias.uniform_(-1, 1)
        model[1].weight.uniform_(0.5, 1.5)
    new = apply_fused_layernorm(model)
    assert [type(m) for m in new] == [_StandInFused, _StandInFused, _StandInFused, SubclassedNorm]
    assert [m.args for m in new[:3]] == [
        ((4,), 1e-3, True),
        ((4,), 1e-5, True),
        ((4,), 1e-5, False),
    ]
    # affine norms go to their weight's device; one without weights to CUDA
    assert [m.moved_to for m in new[:3]] == [[(torch.device("cpu"),)]] * 2 + [[("cuda",)]]
    x = torch.randn(3, 4)
    for fused, plain in zip(new[:3], model[:3], strict=True):
        torch.testing.assert_close(fused(x), plain(x))  # weights copied; a missing bias is zero


def test_apex_without_cuda_is_not_available(stand_in_apex, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not fused_layernorm_available()
    with pytest.warns(UserWarning, match="not available"):
        assert type(apply_fused_layernorm(nn.LayerNorm(2))) is nn.LayerNorm


def test_the_warning_points_at_the_caller():
    if fused_layernorm_available():
        pytest.skip("Apex is installed: nothing to warn about")
    with pytest.warns(UserWarning, match="not available") as caught:
        apply_fused_layernorm(nn.LayerNorm(2))
    assert caught[0].filename == __file__  # stacklevel=2: the line that called the surgery
