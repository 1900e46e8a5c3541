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
    from sklearn.datasets import load_digits

    data_mean = torch.tensor(load_digits().images, dtype=torch.float32).flatten(1).mean(0) / 16
    untrained_gap = float((0.5 - data_mean).abs().mean())  # the generator starts near sigmoid(0)
    result = gan.main(["--iterations", "300"])
    assert result["mean_gap"] < 0.5 * untrained_gap
    paths = [p for p, _ in leaves_with_paths(result["states"])]
    assert "generator.params.0.weight" in paths
    assert any(p.startswith("discriminator.opt_state.") for p in paths)
    assert result["states"]["generator"].step == result["states"]["discriminator"].step == 300
