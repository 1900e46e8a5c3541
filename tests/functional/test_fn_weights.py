"""functrain.functional.weights gathers the pure gradient/weight cores under one import."""

import torch

from functrain.functional import weights


def test_every_exported_name_resolves():
    assert all(callable(getattr(weights, name)) for name in weights.__all__)


def test_cores_compose_on_dicts():
    grads = {"w": torch.tensor([3.0, 4.0])}
    clipped = weights.clip_grad_norm(grads, 1.0)
    delta = weights.sam_perturbation(clipped, rho=0.5)
    torch.testing.assert_close(delta["w"], torch.tensor([0.3, 0.4]))
    averaged = weights.swa_average({"w": torch.zeros(2)}, clipped, num_averaged=1)
    torch.testing.assert_close(averaged["w"], torch.tensor([0.3, 0.4]))
    assert torch.equal(weights.compute_ema(clipped, grads, 0.0)["w"], clipped["w"])
