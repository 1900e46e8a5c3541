"""Surgery algorithms: apply_surgery runs them in order on a copy; their step part is the identity."""

import warnings

import pytest
import torch
from _algo_model_helpers import assert_resume_exact, image_batches, make, run
from torch import nn

import functrain
from functrain import algorithms as A
from functrain import optim
from functrain.algorithms.surgery import surgery_algorithm, surgery_of
from functrain.models import GPT, GPTConfig, SmallResNet, classification_loss, gpt_loss

OPT = optim.sgd(0.05, momentum=0.9)

CNN_SURGERY = [
    A.blurpool(),
    A.channels_last(),
    A.squeeze_excite(latent_channels=4, min_channels=16),
    A.ghost_batchnorm(ghost_batch_size=4),
    A.weight_standardization(n_last_layers_ignore=1),
    A.factorize(min_channels=16, latent_channels=4, min_features=16, latent_features=4),
]


def resnet():
    torch.manual_seed(0)
    return SmallResNet(widths=(16, 32), stem_pool=True)


def test_apply_surgery_copies_and_applies_in_order():
    model = resnet()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    new = A.apply_surgery(model, CNN_SURGERY)
    kinds = {type(m).__name__ for m in new.modules()}
    assert {
        "BlurConv2d",
        "BlurMaxPool2d",
        "SqueezeExciteConv2d",
        "GhostBatchNorm2d",
        "StandardizedConv2d",
    } <= kinds
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # input untouched
    assert new(torch.randn(4, 1, 16, 16)).shape == (4, 10)


def test_pure_surgery_leaves_the_step_alone():
    pieces = functrain.make_step(nn.Linear(2, 2), lambda m, b: m(b).sum(), OPT).pieces
    for algorithm in CNN_SURGERY + [A.low_precision_layernorm(), A.gated_linear_units()]:
        assert algorithm.apply(pieces) is pieces
        assert callable(surgery_of(algorithm))
    assert surgery_of(A.sam()) is None


def test_surgered_cnn_trains_and_resumes():
    def factory():
        return CNN_SURGERY

    model = A.apply_surgery(resnet(), CNN_SURGERY)
    state = functrain.init(model, OPT)
    batches = image_batches(4, size=16)
    _, first = make(model, classification_loss, factory, OPT)(state, batches[0])
    final = assert_resume_exact(model, classification_loss, factory, state, batches, opt=OPT)
    _, last = run(make(model, classification_loss, factory, OPT), final, [batches[0]] * 4)
    assert float(last["loss"]) < float(first["loss"])


def test_transformer_surgery_trains():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=16, block_size=16, n_layer=1, n_head=2, n_embd=16))
    algorithms = [A.low_precision_layernorm(), A.gated_linear_units(), A.alibi(32, 1.0)]
    model = A.apply_surgery(model, algorithms)
    seq = torch.randint(0, 16, (4, 17), generator=torch.Generator().manual_seed(0))
    batch = (seq[:, :-1], seq[:, 1:])
    opt = optim.adamw(3e-3)
    step = make(model, gpt_loss, lambda: algorithms, opt, precision="amp_bf16")
    state = functrain.init(model, opt)
    _, first = step(state, batch)
    _, last = run(step, state, [batch] * 10)
    assert float(last["loss"]) < float(first["loss"])


def test_fused_layernorm_is_a_warning_noop_on_cpu():
    if torch.cuda.is_available():
        pytest.skip("checks the CPU fallback")
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        new = A.apply_surgery(model, [A.fused_layernorm()])
    assert any("not available" in str(w.message) for w in caught)
    x = torch.randn(3, 4)
    assert torch.equal(new(x), model(x))


def test_custom_surgery_algorithm_and_errors():
    algorithm = surgery_algorithm("double", lambda m: nn.Sequential(m, m))
    assert isinstance(A.apply_surgery(nn.Linear(2, 2), [algorithm]), nn.Sequential)
    with pytest.raises(TypeError, match="nn.Module"):
        A.apply_surgery("not a model", [algorithm])
    with pytest.raises(TypeError, match="Algorithm"):
        A.apply_surgery(nn.Linear(2, 2), [lambda m: m])
