"""functrain.functional.surgery gathers every surgery core under one import."""

import torch

from functrain.functional import surgery
from functrain.functional.blurpool import apply_blurpool
from functrain.models import SmallResNet


def test_every_exported_name_resolves_and_is_the_core_itself():
    assert all(callable(getattr(surgery, name)) for name in surgery.__all__)
    assert surgery.apply_blurpool is apply_blurpool
    appliers = [n for n in surgery.__all__ if n.startswith("apply_")]
    assert len(appliers) == 13  # every surgery in the task list (low-precision norms: two)


def test_cores_chain_on_copies():
    torch.manual_seed(0)
    model = SmallResNet(widths=(16, 32)).eval()
    chained = surgery.apply_channels_last(surgery.apply_low_precision_groupnorm(model)).eval()
    x = torch.randn(2, 1, 8, 8)
    torch.testing.assert_close(chained(x), model(x), rtol=1e-5, atol=1e-5)
