"""stochastic_depth: surgery + drop-rate warm-up through buffers; draws keyed by the run's seed."""

import pytest
import torch
from _algo_model_helpers import (
    assert_pure,
    assert_resume_exact,
    image_batches,
    make,
    run,
    with_horizon,
)

import functrain
from functrain import optim
from functrain.algorithms import apply_surgery, stochastic_depth
from functrain.models import SmallResNet, classification_loss
from functrain.tree import tree_allclose

OPT = optim.sgd(0.05, momentum=0.9)


def resnet():
    torch.manual_seed(0)
    return SmallResNet(widths=(4, 8), blocks_per_stage=2)


def test_warmup_ramps_the_rates_through_the_buffers():
    algorithm = stochastic_depth("ResidualBlock", drop_rate=0.4, drop_warmup="4ba")
    model = apply_surgery(resnet(), [algorithm])
    state = functrain.init(model, OPT)
    targets = {k: float(v) for k, v in state.buffers.items() if k.endswith("target_drop_rate")}
    assert sorted(targets.values()) == pytest.approx([0.1, 0.2, 0.3, 0.4])  # linear over depth
    step = functrain.compose(functrain.make_step(model, classification_loss, OPT), algorithm)
    for i, batch in enumerate(image_batches(6, batch_size=4)):
        state, _ = step(state, batch)
        for name, target in targets.items():
            current = float(state.buffers[name.replace("target_drop_rate", "drop_rate")])
            assert current == pytest.approx(target * min(1.0, i / 4))


def test_zero_rate_trains_like_the_plain_model():
    algorithm = stochastic_depth("ResidualBlock", drop_rate=0.0)
    plain_model = resnet()
    model = apply_surgery(plain_model, [algorithm])
    batches = image_batches(3, batch_size=4)
    _, m1 = run(
        make(plain_model, classification_loss, lambda: [], OPT),
        functrain.init(plain_model, OPT),
        batches,
    )
    _, m2 = run(
        make(model, classification_loss, lambda: [algorithm], OPT),
        functrain.init(model, OPT),
        batches,
    )
    assert float(m1["loss"]) == pytest.approx(float(m2["loss"]), rel=1e-5)


def test_drops_are_a_function_of_the_seed():
    algorithm = stochastic_depth(
        "ResidualBlock", stochastic_method="block", drop_rate=0.9, drop_distribution="uniform"
    )
    model = apply_surgery(resnet(), [algorithm])
    batches = image_batches(4, batch_size=4)
    step = make(model, classification_loss, lambda: [algorithm], OPT)
    runs = [run(step, functrain.init(model, OPT, seed=s), batches)[0] for s in (0, 0, 1)]
    assert tree_allclose(runs[0], runs[1])
    assert not tree_allclose(runs[0].params, runs[2].params)


@pytest.mark.parametrize("method", ["block", "sample"])
def test_pure_and_resumable(method):
    def factory():
        return [stochastic_depth("ResidualBlock", method, drop_rate=0.5, drop_warmup="0.5dur")]

    model = apply_surgery(resnet(), factory())
    state = with_horizon(functrain.init(model, OPT), 4)
    batches = image_batches(4, batch_size=4)
    assert_pure(make(model, classification_loss, factory, OPT), state, batches[0])
    assert_resume_exact(model, classification_loss, factory, state, batches, opt=OPT)


def test_bad_arguments():
    with pytest.raises(ValueError, match="stochastic_method"):
        stochastic_depth("ResidualBlock", stochastic_method="layer")
    with pytest.raises(ValueError, match="drop_distribution"):
        stochastic_depth("ResidualBlock", drop_distribution="cubic")
    with pytest.raises(ValueError, match="no 'Bottleneck'"):
        apply_surgery(resnet(), [stochastic_depth("Bottleneck")])
