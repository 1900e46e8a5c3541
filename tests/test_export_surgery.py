"""docs/export.md's claims on a model changed by GLU surgery, checked as written there.

A GPT-2 changed by `gated_linear_units` cannot be loaded into plain transformers (its MLP keys are
gone); rebuilt from the same config with the same surgery, it loads strictly and computes what the
trained model computes; its `model.pt2` serves without the surgery.
"""

from __future__ import annotations

import pytest
import safetensors.torch
import torch

import functrain
from functrain.export import export
from functrain.functional import apply_gated_linear_units

transformers = pytest.importorskip("transformers")


def _config():
    return transformers.GPT2Config(vocab_size=17, n_positions=8, n_embd=8, n_layer=2, n_head=2,
                                   bos_token_id=0, eos_token_id=0, use_cache=False)  # fmt: skip


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A GLU GPT-2 with trained-like (random) weights, exported with its config and a program."""
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = apply_gated_linear_units(transformers.GPT2LMHeadModel(_config()))
    state = functrain.init(model, functrain.optim.sgd(lr=0.1), seed=0)
    gen = torch.Generator().manual_seed(1)
    params = {k: torch.randn(v.shape, generator=gen) * 0.2 for k, v in state.params.items()}
    state = state.replace(params=params)
    ids = torch.randint(0, 17, (2, 8), generator=torch.Generator().manual_seed(2))
    out = tmp_path_factory.mktemp("glu") / "out"
    paths = export(state, out, model=model, example_inputs=(ids,))
    model.config.save_pretrained(out)
    model.load_state_dict(safetensors.torch.load_file(paths["safetensors"]))
    with torch.no_grad():
        expected = model.eval()(ids).logits
    return out, paths, ids, expected


def test_plain_transformers_cannot_load_a_glu_export(exported):
    out, paths, _, _ = exported
    plain = transformers.GPT2LMHeadModel(transformers.GPT2Config.from_pretrained(out))
    with pytest.raises(RuntimeError) as error:
        plain.load_state_dict(safetensors.torch.load_file(paths["safetensors"]))
    message = str(error.value)
    assert "transformer.h.0.mlp.c_fc.weight" in message  # missing
    assert "transformer.h.0.mlp.gate.weight" in message  # unexpected


def test_rebuilt_with_the_same_surgery_loads_strictly_and_matches(exported):
    out, paths, ids, expected = exported
    config = transformers.GPT2Config.from_pretrained(out)  # the docs' recipe, line for line
    model = apply_gated_linear_units(transformers.GPT2LMHeadModel(config))
    model.load_state_dict(safetensors.torch.load_file(paths["safetensors"]))
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)


def test_the_program_serves_without_the_surgery(exported):
    _, paths, ids, expected = exported
    program = torch.export.load(paths["program"])
    with torch.no_grad():
        torch.testing.assert_close(program.module()(ids).logits, expected)
