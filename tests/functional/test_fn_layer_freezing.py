"""Layer-freezing schedule: zero before freeze_start, linear to freeze_level, last layer free."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.functional.layer_freezing import freeze_fraction, frozen_names, layers_of

NAMES = ["stem.weight", "stem.bias", "a.0.weight", "a.1.weight", "a.1.bias", "head.weight"]


@settings(max_examples=50, deadline=None)
@given(
    start=st.floats(0.0, 0.95),
    level=st.floats(0.0, 1.0),
    t=st.floats(0.0, 1.0),
    dt=st.floats(0.0, 0.5),
)
def test_schedule_is_monotone_and_bounded(start, level, t, dt):
    a = freeze_fraction(t, start, level)
    b = freeze_fraction(min(1.0, t + dt), start, level)
    assert 0.0 <= a <= b <= level + 1e-12
    if t <= start:
        assert a == 0.0
    assert freeze_fraction(1.0, start, level) == pytest.approx(level)


@settings(max_examples=30, deadline=None)
@given(fraction=st.floats(0.0, 1.0))
def test_frozen_layers_are_a_prefix_that_excludes_the_last(fraction):
    frozen = frozen_names(NAMES, fraction)
    assert frozen == NAMES[: len(frozen)]
    assert "head.weight" not in frozen
    layers = layers_of(NAMES)
    assert [len(layer) for layer in layers] == [2, 1, 2, 1]
    assert len([layer for layer in layers if layer[0] in frozen]) == int(fraction * 3)


def test_argument_errors():
    with pytest.raises(ValueError, match="freeze_start"):
        freeze_fraction(0.5, freeze_start=1.0)
    with pytest.raises(ValueError, match="freeze_level"):
        freeze_fraction(0.5, freeze_level=-0.1)


def test_freeze_layers_under_composers_signature_counts_without_freezing():
    import torch

    from functrain.functional import freeze_layers

    model = torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(5)])  # 5 layers
    assert freeze_layers(model, current_duration=0.25) == (0, 0.0)  # before freeze_start
    # three quarters through: (0.75 - 0.5) / 0.5 = half of the 4 freezable layers
    assert freeze_layers(model, None, 0.75) == (2, 0.5)
    assert freeze_layers(model, None, 1.0, freeze_level=0.5) == (2, 0.5)
    assert all(p.requires_grad for p in model.parameters())  # nothing was frozen
    with pytest.raises(TypeError, match="optimizers="):
        freeze_layers(model, torch.optim.SGD(model.parameters(), lr=0.1), 0.75)


def test_default_schedule_freezes_everything_by_the_end():
    # Defaults: start at half of training, reach a frozen fraction of 1 at the end, linearly.
    assert freeze_fraction(0.5) == 0.0
    assert freeze_fraction(0.75) == 0.5
    assert freeze_fraction(0.9) == pytest.approx(0.8)
    assert freeze_fraction(1.0) == 1.0
    assert frozen_names(NAMES, freeze_fraction(1.0)) == NAMES[:5]  # all but the last layer


@pytest.mark.parametrize("start", [-0.5, -1e-9, 1.0, 1.5])
def test_freeze_start_outside_the_unit_interval_is_rejected(start):
    with pytest.raises(ValueError, match="freeze_start must be in \\[0, 1\\)"):
        freeze_fraction(0.5, freeze_start=start)
