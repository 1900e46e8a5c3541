"""Low-precision norms: exactly the plain norm in fp32, the autocast dtype under autocast."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from functrain.functional.low_precision_norm import (
    LPGroupNorm,
    LPLayerNorm,
    apply_low_precision_groupnorm,
    apply_low_precision_layernorm,
)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), width=st.integers(2, 16))
def test_layernorm_is_exact_in_fp32_and_bf16_under_autocast(seed, width):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width))
    with torch.no_grad():
        model[1].weight.uniform_(0.5, 1.5)
    new = apply_low_precision_layernorm(model)
    assert isinstance(new[1], LPLayerNorm) and type(model[1]) is nn.LayerNorm
    assert list(dict(new.named_parameters())) == list(dict(model.named_parameters()))
    x = torch.randn(3, width)
    assert torch.equal(new(x), model(x))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = new(x)
    assert low.dtype == torch.bfloat16
    # Compare with fp32 LayerNorm of the same bf16 input: normalising few, nearly equal values
    # amplifies the input's rounding, which is autocast's doing, not the norm's.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = model[0](x)
    reference = model[1](hidden.float())
    torch.testing.assert_close(low.float(), reference, rtol=0.05, atol=0.05)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_groupnorm_is_exact_in_fp32(seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(2, 8, 1), nn.GroupNorm(4, 8))
    new = apply_low_precision_groupnorm(model)
    assert isinstance(new[1], LPGroupNorm)
    x = torch.randn(2, 2, 4, 4)
    assert torch.equal(new(x), model(x))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert new(x).dtype == torch.bfloat16


def test_composers_precision_argument():
    from functrain.functional import LPLayerNorm

    model = torch.nn.Sequential(torch.nn.LayerNorm(4))
    assert isinstance(apply_low_precision_layernorm(model, "amp_bf16")[0], LPLayerNorm)
    with pytest.warns(UserWarning, match="no effect"):
        unchanged = apply_low_precision_layernorm(model, "fp32")
    assert type(unchanged[0]) is torch.nn.LayerNorm and unchanged is not model


# -- under autocast by hand, norms without weights, Composer's precision names ------------------


def _hand_group_norm(x, groups, weight, bias, eps):
    n, c = x.shape[:2]
    grouped = x.double().reshape(n, groups, -1)
    mean = grouped.mean(-1, keepdim=True)
    var = (grouped - mean).square().mean(-1, keepdim=True)
    normed = ((grouped - mean) / (var + eps).sqrt()).reshape(x.shape)
    shape = (1, c) + (1,) * (x.dim() - 2)
    return normed * weight.double().reshape(shape) + bias.double().reshape(shape)


def test_groupnorm_under_autocast_uses_its_groups_weight_bias_and_eps():
    torch.manual_seed(0)
    norm = nn.GroupNorm(2, 4, eps=0.5)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-1, 1)
    new = apply_low_precision_groupnorm(nn.Sequential(norm))
    x = torch.randn(2, 4, 3, 3) * 2
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = new(x)
    assert low.dtype == torch.bfloat16
    expected = _hand_group_norm(x.bfloat16(), 2, norm.weight, norm.bias, 0.5)
    torch.testing.assert_close(low.double(), expected, rtol=0.03, atol=0.03)


def test_layernorm_under_autocast_uses_its_eps():
    torch.manual_seed(1)
    new = apply_low_precision_layernorm(nn.LayerNorm(6, eps=0.5))
    x = torch.randn(3, 6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = new(x)
    assert low.dtype == torch.bfloat16  # from a float32 input
    xb = x.bfloat16().double()
    mean = xb.mean(-1, keepdim=True)
    expected = (xb - mean) / ((xb - mean).square().mean(-1, keepdim=True) + 0.5).sqrt()
    torch.testing.assert_close(low.double(), expected, rtol=0.03, atol=0.03)


def test_norms_without_weights_or_bias_run_under_autocast():
    x = torch.randn(2, 4, 3)
    for norm in (nn.LayerNorm(3, elementwise_affine=False), nn.LayerNorm(3, bias=False)):
        new = apply_low_precision_layernorm(norm)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = new(x)
        assert low.dtype == torch.bfloat16
        torch.testing.assert_close(low.float(), norm(x.bfloat16().float()), rtol=0.03, atol=0.03)
    group = apply_low_precision_groupnorm(nn.GroupNorm(2, 4, affine=False))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert group(x).dtype == torch.bfloat16


def test_every_composer_precision_name_and_the_warnings_caller():
    import enum

    class Precision(enum.Enum):  # Composer's enum: values are the names
        AMP_FP16 = "amp_fp16"
        FP32 = "fp32"

    class Subclassed(nn.GroupNorm):  # not exactly nn.GroupNorm: left alone
        pass

    model = nn.Sequential(nn.GroupNorm(1, 2), Subclassed(1, 2))
    for precision in (None, "amp_fp16", "AMP_BF16", Precision.AMP_FP16):
        new = apply_low_precision_groupnorm(model, precision)
        assert [type(m) for m in new] == [LPGroupNorm, Subclassed], precision
    for precision in ("fp32", Precision.FP32, "amp"):
        with pytest.warns(UserWarning, match="no effect") as caught:
            unchanged = apply_low_precision_groupnorm(model, precision)
        assert [type(m) for m in unchanged] == [nn.GroupNorm, Subclassed]
        assert caught[0].filename == __file__  # stacklevel: the caller of the surgery
    assert [type(m) for m in model] == [nn.GroupNorm, Subclassed]


@pytest.mark.parametrize("kind", ["layer", "group"])
def test_the_norm_kernel_runs_with_autocast_off(kind, monkeypatch):
    # CUDA's autocast runs layer_norm and group_norm in float32 (CPU's leaves them alone), so
    # the low-precision norm must call the kernel with autocast disabled, in the autocast dtype
    import torch.nn.functional as F

    name = f"{kind}_norm"
    kernel, seen = getattr(F, name), []

    def spy(x, *args, **kwargs):
        seen.append((torch.is_autocast_enabled("cpu"), x.dtype))
        return kernel(x, *args, **kwargs)

    monkeypatch.setattr(F, name, spy)
    norm = nn.LayerNorm(4) if kind == "layer" else nn.GroupNorm(2, 4)
    new = (apply_low_precision_layernorm if kind == "layer" else apply_low_precision_groupnorm)(
        norm
    )
    with torch.autocast("cpu", dtype=torch.bfloat16):
        new(torch.randn(2, 4, 4))
    assert seen == [(False, torch.bfloat16)]
