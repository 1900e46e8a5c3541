"""The small ResNet: shapes, the residual protocol, BatchNorm, and it learns digits."""

import pytest
import torch

import functrain
from functrain import optim
from functrain.models import ResidualBlock, SmallResNet, classification_loss


def test_shapes_for_28_and_8_pixel_images():
    torch.manual_seed(0)
    assert SmallResNet(stem_pool=True)(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    assert SmallResNet(in_channels=3, num_classes=4, widths=(8, 16, 32))(
        torch.randn(2, 3, 8, 8)
    ).shape == (2, 4)
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in SmallResNet().modules())


@pytest.mark.parametrize("stride,c_out", [(1, 4), (2, 8)])
def test_block_is_relu_of_shortcut_plus_branch(stride, c_out):
    torch.manual_seed(0)
    block = ResidualBlock(4, c_out, stride).eval()
    x = torch.randn(2, 4, 6, 6)
    torch.testing.assert_close(block(x), block.relu(block.shortcut(x) + block.residual_branch(x)))
    assert (block.downsample is None) == (stride == 1 and c_out == 4)


def test_errors():
    with pytest.raises(ValueError, match="widths"):
        SmallResNet(widths=())
    with pytest.raises(ValueError, match="images"):
        SmallResNet()(torch.randn(2, 28, 28))


def test_learns_digits():
    datasets = pytest.importorskip("sklearn.datasets")
    digits = datasets.load_digits()
    x = torch.tensor(digits.images[:512], dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target[:512])
    torch.manual_seed(0)
    model = SmallResNet(widths=(8, 16))
    opt = optim.adamw(1e-2)
    step = functrain.make_step(model, classification_loss, opt)
    state = functrain.init(model, opt)
    for _ in range(3):
        for i in range(0, 512, 64):
            state, metrics = step(state, (x[i : i + 64], y[i : i + 64]))
    model.eval()
    x_test = torch.tensor(digits.images[1000:1400], dtype=torch.float32).unsqueeze(1) / 16.0
    y_test = torch.tensor(digits.target[1000:1400])
    accuracy = (step.call_model(state, x_test).argmax(1) == y_test).float().mean()
    assert float(accuracy) > 0.5  # chance is 0.1; ~0.7 after these 24 steps
