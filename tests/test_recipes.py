"""Recipes: Composer's algorithms and hyperparameters, usable end to end."""

import pytest
import torch

import functrain
from functrain import optim, recipes
from functrain.algorithms import apply_surgery
from functrain.models import GPT, GPTConfig, SmallResNet, classification_loss, gpt_loss

MILD = ["blurpool", "channels_last", "ema", "label_smoothing", "progressive_resizing"]


def names(algorithms):
    return [a.name for a in algorithms]


def test_cnn_recipes_contain_composers_algorithms():
    assert names(recipes.mild()) == MILD
    assert names(recipes.medium()) == MILD[:4] + ["mixup", "progressive_resizing", "sam"]
    assert names(recipes.hot()) == [
        "blurpool",
        "channels_last",
        "randaugment",  # before the transforms that mix images
        "colout",
        "ema",
        "label_smoothing",
        "mixup",
        "progressive_resizing",
        "sam",
        "stochastic_depth",
    ]
    assert names(recipes.transformer(128)) == [
        "low_precision_layernorm",
        "alibi",
        "gated_linear_units",
        "seq_length_warmup",
    ]


def test_surgery_part_of_each_cnn_recipe():
    torch.manual_seed(0)
    model = SmallResNet(widths=(16, 32), stem_pool=True)
    for recipe in (recipes.mild(), recipes.medium(), recipes.hot()):
        new = apply_surgery(model, recipe)
        kinds = {type(m).__name__ for m in new.modules()}
        assert {"BlurConv2d", "BlurMaxPool2d"} <= kinds
    assert "StochasticBlock" in {
        type(m).__name__ for m in apply_surgery(model, recipes.hot()).modules()
    }


def test_hot_recipe_trains_and_resumes_exactly():
    torch.manual_seed(0)
    algorithms = recipes.hot()
    model = apply_surgery(SmallResNet(in_channels=3, widths=(16, 32)), algorithms)
    opt = optim.decoupled_sgdw(0.05, momentum=0.875, weight_decay=5e-4)
    step = functrain.compose(functrain.make_step(model, classification_loss, opt), *algorithms)
    g = torch.Generator().manual_seed(0)
    batches = [
        (torch.rand(10, 3, 16, 16, generator=g), torch.randint(0, 10, (10,), generator=g))
        for _ in range(4)
    ]
    state = functrain.init(model, opt, seed=0)
    state = state.replace(timestamp=state.timestamp.replace(max_batches=4, batches_per_epoch=4))
    full = state
    for batch in batches:
        full, metrics = step(full, batch)
    assert torch.isfinite(metrics["loss"])
    half = state
    for batch in batches[:2]:
        half, _ = step(half, batch)
    fresh = functrain.compose(functrain.make_step(model, classification_loss, opt), *recipes.hot())
    resumed = functrain.tree.tree_clone(half)
    for batch in batches[2:]:
        resumed, _ = fresh(resumed, batch)
    assert functrain.tree.tree_allclose(full, resumed)


def test_transformer_recipe_trains():
    torch.manual_seed(0)
    algorithms = recipes.transformer(32, min_seq_length=4, step_size=4)
    model = apply_surgery(
        GPT(GPTConfig(vocab_size=16, block_size=16, n_layer=1, n_head=2, n_embd=16)), algorithms
    )
    assert model.wpe is None
    opt = optim.adamw(3e-3)
    step = functrain.compose(functrain.make_step(model, gpt_loss, opt), *algorithms)
    seq = torch.randint(0, 16, (4, 33), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": seq[:, :-1], "labels": seq[:, 1:]}
    state = functrain.init(model, opt)
    state = state.replace(timestamp=state.timestamp.replace(max_batches=10))
    plain = functrain.make_step(model, gpt_loss, opt)  # the full-length loss, no algorithm

    def full_loss(state):
        return float(gpt_loss(lambda ids: plain.call_model(state, ids), batch)[0])

    before = full_loss(state)
    for _ in range(10):  # the warm-up reaches the full length 32 by the last steps
        state, _ = step(state, batch)
    after = full_loss(state)
    assert after < before - 0.05, (before, after)  # it learned the batch at full length


def test_recipes_are_fresh_lists():
    a, b = recipes.mild(), recipes.mild()
    a.pop()
    assert len(b) == len(MILD)
    with pytest.raises(TypeError):
        recipes.mild(0)  # keyword-only options
