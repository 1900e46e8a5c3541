"""Two models and two optimizers in one run: the GAN example trains and its state is one pytree."""

import importlib.util
import pathlib

import torch

from functrain.tree import leaves_with_paths

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "gan_digits.py"


def load_example():
    spec = importlib.util.spec_from_file_location("gan_digits", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gan_learns_the_data_mean_and_its_state_is_one_pytree():
    gan = load_example()
    untrained_gap = float((torch.full((64,), 0.5) - 0).abs().mean())  # sigmoid(0) everywhere
    result = gan.main(["--iterations", "300"])
    assert result["mean_gap"] < 0.15 < untrained_gap
    paths = [p for p, _ in leaves_with_paths(result["states"])]
    assert "generator.params.0.weight" in paths and "discriminator.opt_state.0.mu.0.weight" in paths
    assert result["states"]["generator"].step == result["states"]["discriminator"].step == 300
