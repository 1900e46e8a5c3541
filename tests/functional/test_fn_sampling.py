"""Random draws only from explicit generators: determinism and the missing-generator error."""

import pytest
import torch

from functrain.functional.sampling import beta, numpy_rng, randint, require_generator, uniform


def test_draws_are_a_pure_function_of_the_generator_state():
    def draws(seed):
        g = torch.Generator().manual_seed(seed)
        return beta(0.4, g), uniform(0.1, 3.0, 5, g).tolist(), randint(-3, 4, g)

    assert draws(1) == draws(1)
    assert draws(1) != draws(2)
    b, u, r = draws(3)
    assert 0 <= b <= 1 and all(0.1 <= v <= 3.0 for v in u) and -3 <= r < 4
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert numpy_rng(g1).random() == numpy_rng(g2).random()


def test_a_missing_generator_says_what_was_random_and_how_to_fix_it():
    with pytest.raises(ValueError, match="mixup's coefficient.*generator=torch.Generator"):
        require_generator(None, "mixup's coefficient")
    with pytest.raises(TypeError, match="torch.Generator"):
        require_generator(3, "x")
