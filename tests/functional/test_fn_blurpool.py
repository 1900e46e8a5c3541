"""BlurPool: a normalized low-pass filter, weights kept, constant regions unchanged."""

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from functrain.functional.blurpool import (
    BlurConv2d,
    BlurMaxPool2d,
    apply_blurpool,
    binomial_filter_2d,
    blur_2d,
)


def test_filter_sums_to_one_and_is_symmetric():
    f = binomial_filter_2d()
    assert f.shape == (1, 1, 3, 3)
    assert float(f.sum()) == 1.0
    assert torch.equal(f, f.flip(-1)) and torch.equal(f, f.transpose(-1, -2))


@settings(max_examples=25, deadline=None)
@given(c=st.integers(1, 4), value=st.floats(-5, 5), stride=st.integers(1, 2))
def test_blur_keeps_constant_interiors(c, value, stride):
    x = torch.full((2, c, 8, 8), value)
    out = blur_2d(x, stride=stride)
    assert out.shape[-1] == (8 - 1) // stride + 1
    interior = out[..., 1:-1, 1:-1]  # zero padding only touches the border
    torch.testing.assert_close(interior, torch.full_like(interior, value))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), blur_first=st.booleans(), bias=st.booleans())
def test_blurconv_copies_weights_and_matches_on_constant_input(seed, blur_first, bias):
    torch.manual_seed(seed)
    conv = nn.Conv2d(16, 8, 3, stride=2, padding=1, bias=bias)
    blur = BlurConv2d.from_conv2d(conv, blur_first=blur_first)
    assert torch.equal(blur.conv.weight, conv.weight)
    x = torch.full((1, 16, 12, 12), 0.7)
    out, ref = blur(x), conv(x)
    assert out.shape == ref.shape
    # away from the borders a constant input gives the same output
    torch.testing.assert_close(out[..., 2:-2, 2:-2], ref[..., 2:-2, 2:-2], rtol=1e-5, atol=1e-5)


def test_blurmaxpool_shape_and_constants():
    pool = BlurMaxPool2d.from_maxpool2d(nn.MaxPool2d(2))
    x = torch.full((1, 3, 8, 8), 2.0)
    out = pool(x)
    assert out.shape == nn.MaxPool2d(2)(x).shape
    torch.testing.assert_close(out[..., 1:-1, 1:-1], torch.full_like(out[..., 1:-1, 1:-1], 2.0))


def test_apply_blurpool_replaces_the_right_modules_on_a_copy():
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2),  # stem: too few input channels
        nn.Conv2d(16, 16, 3, stride=2),
        nn.Conv2d(16, 16, 3, stride=1),
        nn.MaxPool2d(2),
    )
    new = apply_blurpool(model)
    assert [type(m).__name__ for m in new] == ["Conv2d", "BlurConv2d", "Conv2d", "BlurMaxPool2d"]
    assert [type(m).__name__ for m in model] == ["Conv2d", "Conv2d", "Conv2d", "MaxPool2d"]
    assert new(torch.randn(1, 3, 32, 32)).shape == model(torch.randn(1, 3, 32, 32)).shape
    only_pools = apply_blurpool(model, replace_convs=False)
    assert type(only_pools[1]) is nn.Conv2d and type(only_pools[3]) is BlurMaxPool2d


def test_nothing_to_replace_warns_and_bad_filter_errors():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        apply_blurpool(nn.Linear(2, 2))
    assert any("changed nothing" in str(w.message) for w in caught)
    assert [w.filename for w in caught] == [__file__]  # stacklevel=2: the caller's line
    with pytest.raises(ValueError, match="odd"):
        blur_2d(torch.zeros(1, 1, 4, 4), filter=torch.ones(1, 1, 2, 2))
    with pytest.raises(TypeError, match="nn.Module"):
        apply_blurpool("model")


def test_state_dict_names_are_composers():
    from functrain.functional import apply_blurpool

    model = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, stride=2), torch.nn.MaxPool2d(2))
    new = apply_blurpool(model, min_channels=1)
    # composer/algorithms/blurpool/blurpool_layers.py: BlurConv2d keeps `conv` and `blur_filter`,
    # BlurMaxPool2d a `filt2d` buffer.
    assert set(new.state_dict()) == {"0.conv.weight", "0.conv.bias", "0.blur_filter", "1.filt2d"}
    new.load_state_dict({k: v.clone() for k, v in new.state_dict().items()}, strict=True)


# -- impulse responses, by hand: a constant input cannot tell a blur from no blur --------------

# the binomial filter's 1-D taps; the 2-D filter is their outer product / 16
TAPS = torch.tensor([1.0, 2.0, 1.0])


def _impulse(size: int, at: int, channels: int = 1) -> torch.Tensor:
    x = torch.zeros(1, channels, size, size)
    x[..., at, at] = 1.0
    return x


def test_blur_of_an_impulse_is_the_binomial_filter():
    out = blur_2d(_impulse(7, 3, channels=2))
    expected = torch.zeros(1, 2, 7, 7)
    expected[..., 2:5, 2:5] = torch.outer(TAPS, TAPS) / 16
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-7)


def test_strided_blur_of_an_impulse_samples_every_other_filtered_pixel():
    # filtered rows/cols 2, 3, 4 are nonzero; stride 2 keeps 0, 2, 4, 6 -> taps 1 (row 2), 1 (row 4)
    out = blur_2d(_impulse(7, 3), stride=2)
    expected = torch.zeros(1, 1, 4, 4)
    expected[..., 1:3, 1:3] = 1 / 16
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-7)


@pytest.mark.parametrize("blur_first", [True, False])
def test_blurconv_of_an_impulse_is_the_scaled_strided_blur(blur_first):
    # a 1x1 convolution of weight 3 commutes with the blur: both orders give 3 * strided blur
    conv = nn.Conv2d(1, 1, 1, stride=2, bias=False)
    with torch.no_grad():
        conv.weight.fill_(3.0)
    out = BlurConv2d.from_conv2d(conv, blur_first=blur_first)(_impulse(7, 3))
    expected = torch.zeros(1, 1, 4, 4)
    expected[..., 1:3, 1:3] = 3 / 16
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)


def test_blurmaxpool_of_an_impulse():
    # max over 2x2 windows at stride 1 turns the impulse at (3, 3) of 8x8 into a 2x2 block of ones
    # at rows/cols 2..3 of 7x7; the stride-2 blur (zero padding 1) then weighs rows 2, 3 with taps
    # (2, 1) for output row 1 and row 3 with tap 1 for output row 2: (0, 3, 1, 0) / 4 per axis
    out = BlurMaxPool2d.from_maxpool2d(nn.MaxPool2d(2))(_impulse(8, 3))
    axis = torch.tensor([0.0, 3.0, 1.0, 0.0])
    torch.testing.assert_close(out[0, 0], torch.outer(axis, axis) / 16, rtol=0, atol=1e-7)


# -- defaults, against a hand-written max and blur (independent of max_pool2d and conv2d) -------


def _hand_max(x: torch.Tensor, k: int, padding: int = 0) -> torch.Tensor:
    """Max over every kxk window at stride 1 (padding with -inf, as max-pooling does)."""
    x = torch.nn.functional.pad(x, (padding,) * 4, value=float("-inf")) if padding else x
    return x.unfold(2, k, 1).unfold(3, k, 1).amax(dim=(-1, -2))


def _hand_blur(x: torch.Tensor, stride: int) -> torch.Tensor:
    """The 3x3 binomial weighting of each zero-padded neighbourhood, then every stride-th pixel."""
    h, w = x.shape[-2:]
    padded = torch.zeros(*x.shape[:-2], h + 2, w + 2)
    padded[..., 1:-1, 1:-1] = x
    out = sum(
        TAPS[i] * TAPS[j] / 16 * padded[..., i : i + h, j : j + w]
        for i in range(3)
        for j in range(3)
    )
    return out[..., ::stride, ::stride]


def test_blurmax_pool2d_defaults_are_a_2x2_max_then_a_stride_2_blur():
    from functrain.functional.blurpool import blurmax_pool2d

    torch.manual_seed(0)
    x = torch.randn(2, 3, 7, 9)  # odd sizes: padding or ceil_mode would change the shape
    torch.testing.assert_close(blurmax_pool2d(x), _hand_blur(_hand_max(x, 2), 2))


@pytest.mark.parametrize("kernel_size", [2, 3])
def test_blurmaxpool2d_defaults_stride_is_the_kernel_size_without_padding(kernel_size):
    torch.manual_seed(1)
    x = torch.randn(1, 2, 9, 8)
    expected = _hand_blur(_hand_max(x, kernel_size), kernel_size)
    torch.testing.assert_close(BlurMaxPool2d(kernel_size)(x), expected)


def test_blurmaxpool2d_keeps_the_pools_padding():
    torch.manual_seed(2)
    x = torch.randn(1, 2, 8, 8)
    pool = BlurMaxPool2d.from_maxpool2d(nn.MaxPool2d(3, stride=2, padding=1))
    torch.testing.assert_close(pool(x), _hand_blur(_hand_max(x, 3, padding=1), 2))


def test_blurmaxpool2d_has_maxpool2ds_defaults():
    # "same arguments as MaxPool2d": the defaults are torch's, attribute by attribute
    ours, torchs = BlurMaxPool2d(3), nn.MaxPool2d(3)
    for name in ("kernel_size", "stride", "padding", "dilation", "ceil_mode"):
        assert getattr(ours, name) == getattr(torchs, name), name


@pytest.mark.parametrize("shape", [(1, 1, 2, 3), (1, 1, 3, 2), (1, 1, 3, 4)])
def test_a_filter_even_in_either_dimension_is_refused(shape):
    with pytest.raises(ValueError, match="odd"):
        blur_2d(torch.zeros(1, 1, 6, 6), filter=torch.ones(shape))


@pytest.mark.parametrize("shape", [(3, 3), (1, 3, 3), (2, 1, 3, 3), (1, 3, 3, 3), (6, 1, 3, 3)])
def test_a_filter_of_the_wrong_shape_is_refused_with_the_expected_one(shape):
    with pytest.raises(ValueError, match=r"\(1, 1, kh, kw\) or \(C, 1, kh, kw\) with C = 3"):
        blur_2d(torch.zeros(1, 3, 6, 6), filter=torch.ones(shape) / 9)


def test_a_per_channel_filter_filters_each_channel_with_its_own():
    # channel 0: the identity (a centred one), channel 1: the binomial filter
    filt = torch.zeros(2, 1, 3, 3)
    filt[0, 0, 1, 1] = 1.0
    filt[1, 0] = torch.outer(TAPS, TAPS) / 16
    x = _impulse(5, 2, channels=2)
    expected = torch.zeros(1, 2, 5, 5)
    expected[0, 0, 2, 2] = 1.0
    expected[0, 1, 1:4, 1:4] = torch.outer(TAPS, TAPS) / 16
    torch.testing.assert_close(blur_2d(x, filter=filt), expected, rtol=0, atol=1e-7)


def test_apply_blurpool_blurs_before_the_strided_conv_by_default():
    torch.manual_seed(3)
    conv = nn.Conv2d(16, 4, 3, stride=2, padding=1)
    new = apply_blurpool(nn.Sequential(conv))
    assert new[0].blur_first and new[0].conv.stride == (2, 2)  # the cheap order
    x = torch.randn(1, 16, 8, 8)
    expected = torch.nn.functional.conv2d(
        _hand_blur(x, 1), conv.weight, conv.bias, stride=2, padding=1
    )
    torch.testing.assert_close(new(x), expected, rtol=1e-5, atol=1e-5)


def test_a_5x5_filter_keeps_the_size_and_centres_on_the_impulse():
    # 'same' zero padding of kh // 2 = 2: the impulse's response is the filter, centred on it
    filt = torch.arange(25.0).reshape(1, 1, 5, 5) / 300
    out = blur_2d(_impulse(9, 4), filter=filt)
    expected = torch.zeros(1, 1, 9, 9)
    expected[..., 2:7, 2:7] = filt.flip(-1, -2)  # conv2d is a correlation: the impulse flips it
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-7)


def test_blurconv_blurs_first_by_default_and_min_channels_is_16():
    conv = nn.Conv2d(4, 4, 3, stride=2, padding=1)
    for blur in (BlurConv2d(nn.Conv2d(4, 4, 3, stride=2)), BlurConv2d.from_conv2d(conv)):
        assert blur.blur_first and blur.conv.stride == (2, 2) and blur.blur_stride == 1
    model = nn.Sequential(nn.Conv2d(15, 16, 3, stride=2), nn.Conv2d(16, 16, 3, stride=2))
    assert [type(m).__name__ for m in apply_blurpool(model)] == ["Conv2d", "BlurConv2d"]
