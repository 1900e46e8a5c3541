"""Export for inference: safetensors a plain nn.Module loads, EMA weights, torch.export programs."""

from __future__ import annotations

import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch

import functrain
from functrain import checkpoint
from functrain.algorithms.ema import init_ema
from functrain.export import export


class TiedNet(torch.nn.Module):
    """Embedding -> BatchNorm -> output projection tied to the embedding (a language-model head)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(11, 6)
        self.norm = torch.nn.BatchNorm1d(6)
        self.out = torch.nn.Linear(6, 11, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, tokens):
        return self.out(self.norm(self.embed(tokens)))


def trained_state(model):
    """A state whose weights differ from the model's initial ones (as after training)."""
    state = functrain.init(model, functrain.optim.sgd(lr=0.1), seed=0)
    gen = torch.Generator().manual_seed(3)
    params = {k: torch.randn(v.shape, generator=gen) for k, v in state.params.items()}
    buffers = dict(state.buffers)
    buffers["norm.running_mean"] = torch.randn(6, generator=gen)
    buffers["norm.running_var"] = torch.rand(6, generator=gen) + 0.5
    return state.replace(step=12, params=params, buffers=buffers)


def _apply(model, state, ema=False):
    """What the state computes: the model with the state's weights, in eval mode."""
    source = state.algo_state["ema"] if ema else state
    weights = {**state.params, **state.buffers, **source.params, **source.buffers}
    weights["out.weight"] = weights["embed.weight"]
    reference = TiedNet()
    reference.load_state_dict(weights)
    return reference.eval()


TOKENS = torch.tensor([0, 3, 7, 10, 2])


def test_plain_module_loads_the_export_with_identical_outputs(tmp_path):
    model = TiedNet()
    state = trained_state(model)
    paths = export(state, tmp_path, model=model)
    fresh = TiedNet()
    result = fresh.load_state_dict(safetensors.torch.load_file(paths["safetensors"]))
    assert not result.missing_keys and not result.unexpected_keys  # tied names both written
    fresh.eval()
    assert torch.equal(fresh(TOKENS), _apply(model, state)(TOKENS))
    assert paths["program"] is None


def test_ema_weights_when_asked(tmp_path):
    model = TiedNet()
    state = trained_state(model)
    ema = init_ema(state)
    ema = ema._replace(params={k: v * 0.5 for k, v in ema.params.items()}, num_updates=4)
    state = state.replace(algo_state={"ema": ema})
    export(state, tmp_path / "ema", ema=True, model=model)
    export(state, tmp_path / "raw", model=model)
    averaged = safetensors.torch.load_file(str(tmp_path / "ema" / "model.safetensors"))
    raw = safetensors.torch.load_file(str(tmp_path / "raw" / "model.safetensors"))
    assert torch.equal(averaged["embed.weight"], state.params["embed.weight"] * 0.5)
    assert torch.equal(averaged["out.weight"], averaged["embed.weight"])
    assert torch.equal(raw["embed.weight"], state.params["embed.weight"])
    fresh = TiedNet()
    fresh.load_state_dict(averaged)
    assert torch.equal(fresh.eval()(TOKENS), _apply(model, state, ema=True)(TOKENS))


def test_ema_missing_is_explained(tmp_path):
    model = TiedNet()
    with pytest.raises(KeyError, match="compose functrain.algorithms.ema"):
        export(trained_state(model), tmp_path, ema=True)


def test_torch_export_program_serves_the_same_outputs(tmp_path):
    model = TiedNet()
    state = trained_state(model)
    paths = export(state, tmp_path, model=model, example_inputs=(TOKENS,))
    program = torch.export.load(paths["program"])
    assert torch.equal(program.module()(TOKENS), _apply(model, state)(TOKENS))


def test_export_from_a_checkpoint_and_without_model(tmp_path):
    model = TiedNet()
    state = trained_state(model)
    path = checkpoint.save(tmp_path / "ckpt", state)
    paths = export(path, tmp_path / "out")
    weights = safetensors.numpy.load_file(paths["safetensors"])  # no torch, no functrain needed
    assert set(weights) == set(state.params) | set(state.buffers)  # tied weight once
    np.testing.assert_array_equal(weights["embed.weight"], state.params["embed.weight"].numpy())
    with open(paths["safetensors"], "rb") as f:  # metadata names the step and the weights
        length = int.from_bytes(f.read(8), "little")
        header = f.read(length)
    assert b'"step":"12"' in header and b'"weights":"trained"' in header


def test_mismatched_model_is_explained(tmp_path):
    state = trained_state(TiedNet())
    other = torch.nn.Linear(6, 11)
    with pytest.raises(KeyError, match="no weight for the model's state_dict key 'weight'"):
        export(state, tmp_path, model=other)
