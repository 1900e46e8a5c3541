"""replace_modules/reclass: surgery on a copy, no recursion into replacements, names kept."""

import pytest
import torch
from torch import nn

from functrain.functional.module_surgery import (
    count_modules,
    reclass,
    replace_modules,
    shared_parameter_ids,
)


class Wrapper(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)


def test_replace_on_a_copy_without_recursing_into_replacements():
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU(), nn.Linear(2, 2)))
    seen = []

    def policy(name, module):
        seen.append(name)
        return Wrapper(module) if isinstance(module, nn.Linear) else None

    new = replace_modules(model, policy)
    assert isinstance(new[0], Wrapper) and isinstance(new[1][1], Wrapper)
    assert isinstance(model[0], nn.Linear)  # original untouched
    assert "0.inner" not in seen and count_modules(new, Wrapper) == 2
    assert seen == ["", "0", "1", "1.0", "1.1"]


def test_reclass_keeps_state_and_checks_the_type():
    class Loud(nn.Linear):
        pass

    layer = nn.Linear(2, 3)
    keys = list(layer.state_dict())
    new = reclass(layer, Loud)
    assert isinstance(new, Loud) and list(new.state_dict()) == keys
    with pytest.raises(TypeError, match="subclass"):
        reclass(nn.ReLU(), Loud)


def test_shared_parameters_are_found():
    a = nn.Linear(2, 2)
    model = nn.Sequential(a, nn.Linear(2, 2))
    model[1].weight = a.weight
    assert shared_parameter_ids(model) == {id(a.weight)}
    with pytest.raises(TypeError, match="nn.Module"):
        replace_modules(torch.zeros(1), lambda n, m: None)
