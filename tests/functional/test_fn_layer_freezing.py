"""Layer-freezing schedule: zero before freeze_start, linear to freeze_level, last layer free."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.functional.layer_freezing import (
    freeze_fraction,
    frozen_names,
    layers_of,
    module_layers,
)

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


class _TinyViT(torch.nn.Module):
    """A parameter on a module with children (ViT's `cls_token`) and a parameter-free child."""

    def __init__(self):
        super().__init__()
        self.cls_token = torch.nn.Parameter(torch.zeros(1, 1, 4))
        self.patch = torch.nn.Linear(4, 4)
        self.blocks = torch.nn.Sequential(
            torch.nn.Linear(4, 4), torch.nn.GELU(), torch.nn.Linear(4, 4)
        )
        self.head = torch.nn.Linear(4, 2)


def test_freeze_layers_counts_leaf_modules_only_as_composer_does():
    from functrain.functional import freeze_layers, module_layers

    model = _TinyViT()
    # Composer's layers: patch, blocks.0, blocks.2, head; cls_token belongs to none
    layers = module_layers(model)
    assert layers == [
        ["patch.weight", "patch.bias"],
        ["blocks.0.weight", "blocks.0.bias"],
        ["blocks.2.weight", "blocks.2.bias"],
        ["head.weight", "head.bias"],
    ]
    assert layers_of(n for n, _ in model.named_parameters()) == layers  # from names alone too
    assert freeze_layers(model, None, 1.0) == (3, 1.0)  # all but the head (4 with cls_token)
    assert freeze_layers(model, None, 0.75) == (1, 0.5)  # int(0.5 * 3)
    frozen = frozen_names([n for n, _ in model.named_parameters()], 1.0)
    assert "cls_token" not in frozen and "head.weight" not in frozen
    assert frozen == [n for layer in layers[:3] for n in layer]
    # a model that is one leaf module is one layer (its own parameters), never frozen
    assert layers_of(["weight", "bias"]) == [["weight", "bias"]]
    assert freeze_layers(torch.nn.Linear(2, 2), None, 1.0) == (0, 1.0)


def _tree(draw_spec):
    """A module tree from a nested spec: an int is a Linear leaf, a list a container, and a
    container marked with a leading "p" owns a parameter of its own (like a cls_token)."""
    if isinstance(draw_spec, int):
        return torch.nn.Linear(draw_spec, 2)
    module = torch.nn.Module()
    items = list(draw_spec)
    if items and items[0] == "p":
        module.token = torch.nn.Parameter(torch.zeros(2))
        items = items[1:]
    for i, item in enumerate(items):
        module.add_module(f"m{i}", _tree(item))
    return module


_SPECS = st.recursive(
    st.integers(1, 3),
    lambda children: (
        st.lists(children, min_size=1, max_size=3).map(lambda xs: ["p", *xs])
        | st.lists(children, min_size=1, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=60, deadline=None)
@given(spec=_SPECS)
def test_layers_from_names_equal_composers_leaf_modules(spec):
    # Law: when every leaf owns parameters, the names alone give Composer's layers, and a
    # container's own parameter is in none of them.
    model = _tree(spec)
    names = [n for n, _ in model.named_parameters()]
    layers = module_layers(model)
    assert layers_of(names) == layers
    in_layers = {n for layer in layers for n in layer}
    assert not any(n.endswith("token") for n in in_layers)
    assert in_layers == {n for n in names if not n.endswith("token")}
