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


# -- Composer's call signatures: accepted, or rejected with what to do -----------------------------


def test_composers_optimizers_argument_is_rejected_with_the_fix_on_every_surgery():
    import functrain.functional as ff

    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, stride=2), torch.nn.BatchNorm2d(16), torch.nn.MaxPool2d(2)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = [
        lambda: ff.apply_blurpool(model, optimizers=optimizer),
        lambda: ff.apply_channels_last(model, optimizers=optimizer),
        lambda: ff.apply_factorization(model, optimizers=optimizer),
        lambda: ff.apply_ghost_batchnorm(model, optimizers=optimizer),
        lambda: ff.apply_squeeze_excite(model, optimizers=optimizer),
        lambda: ff.apply_low_precision_layernorm(model, optimizers=optimizer),
        lambda: ff.apply_low_precision_groupnorm(model, optimizers=optimizer),
        lambda: ff.apply_weight_standardization(model, optimizers=optimizer),
        lambda: ff.apply_gyro_dropout(model, optimizers=optimizer),
        lambda: ff.apply_stochastic_depth(model, "Bottleneck", optimizers=optimizer),
    ]
    for call in calls:
        with pytest.raises(TypeError, match=r"optimizers=.*functrain\.init\(model, optimizer\)"):
            call()


def test_composers_resnet_bottleneck_name_finds_torchvisions_bottleneck():
    import functrain.functional as ff

    class Bottleneck(torch.nn.Module):  # torchvision's layout and class name
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = torch.nn.Conv2d(4, 4, 1), torch.nn.BatchNorm2d(4)
            self.conv2, self.bn2 = torch.nn.Conv2d(4, 4, 3, padding=1), torch.nn.BatchNorm2d(4)
            self.conv3, self.bn3 = torch.nn.Conv2d(4, 4, 1), torch.nn.BatchNorm2d(4)
            self.relu, self.downsample = torch.nn.ReLU(), None

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            return self.relu(self.bn3(self.conv3(out)) + x)

    model = torch.nn.Sequential(Bottleneck(), Bottleneck())
    new = ff.apply_stochastic_depth(model, target_layer_name="ResNetBottleneck", drop_rate=0.5)
    assert [type(m).__name__ for m in new] == ["StochasticBlock", "StochasticBlock"]
    with pytest.raises(ValueError, match=r"residual blocks here: \['Bottleneck'\]"):
        ff.apply_stochastic_depth(model, target_layer_name="BasicBlockX")
