"""Channels-last: same function, NHWC weights, input model untouched."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.functional.channels_last import apply_channels_last
from functrain.models import SmallResNet


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_same_function_in_channels_last(seed):
    torch.manual_seed(seed)
    model = SmallResNet(widths=(8, 16)).eval()
    new = apply_channels_last(model)
    assert new.stem[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert model.stem[0].weight.is_contiguous()  # the original keeps its layout
    x = torch.randn(3, 1, 8, 8)
    torch.testing.assert_close(
        new(x.to(memory_format=torch.channels_last)), model(x), rtol=1e-5, atol=1e-5
    )
