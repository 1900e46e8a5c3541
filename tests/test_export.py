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


class Untraceable(TiedNet):
    """A model whose tracing fails (after the weights were built, before anything is written)."""

    def forward(self, tokens):
        raise ValueError("cannot trace this")


def test_a_failed_export_leaves_no_folder_and_no_debris(tmp_path):
    model = Untraceable()
    with pytest.raises(ValueError, match="cannot trace this"):  # the error, not reworded
        export(trained_state(model), tmp_path / "out", model=model, example_inputs=(TOKENS,))
    assert list(tmp_path.iterdir()) == []  # no half-written export, no temporary folder


def test_a_failed_export_into_an_existing_export_keeps_the_old_files(tmp_path):
    model = TiedNet()
    state = trained_state(model)
    paths = export(state, tmp_path, model=model, example_inputs=(TOKENS,))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert sorted(before) == ["model.pt2", "model.safetensors"]
    bad = Untraceable()
    with pytest.raises(ValueError, match="cannot trace this"):
        export(trained_state(bad).replace(step=13), tmp_path, model=bad, example_inputs=(TOKENS,))
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    # a later export without a program removes the old one: it would serve the old weights
    export(state.replace(step=14), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]
    assert paths["safetensors"].endswith("model.safetensors")


def test_a_new_export_folder_appears_whole_with_the_umasks_permissions(tmp_path):
    import os
    import stat

    model = TiedNet()
    target = tmp_path / "deep" / "out"
    export(trained_state(model), target, model=model, example_inputs=(TOKENS,))
    assert sorted(p.name for p in target.iterdir()) == ["model.pt2", "model.safetensors"]
    assert [p.name for p in target.parent.iterdir()] == ["out"]  # no temporary sibling left
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o777 & ~umask


def test_hf_cache_output_names_use_cache_false(tmp_path):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(vocab_size=17, n_positions=8, n_embd=8, n_layer=1, n_head=2,
                                     bos_token_id=0, eos_token_id=0)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    state = functrain.init(model, functrain.optim.sgd(lr=0.1), seed=0)
    ids = torch.randint(0, 17, (1, 8), generator=torch.Generator().manual_seed(0))
    with pytest.raises(RuntimeError, match=r"model\.config\.use_cache = False") as error:
        export(state, tmp_path / "gpt2", model=model, example_inputs=(ids,))
    assert "DynamicCache" in str(error.value) and "Nothing was written" in str(error.value)
    assert list(tmp_path.iterdir()) == []
    model.config.use_cache = False  # the fix the message names
    paths = export(state, tmp_path / "gpt2", model=model, example_inputs=(ids,))
    program = torch.export.load(paths["program"])
    with torch.no_grad():
        torch.testing.assert_close(program.module()(ids).logits, model.eval()(ids).logits)
