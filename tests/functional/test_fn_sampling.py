"""Random draws only from explicit generators: determinism and the missing-generator error."""

import numpy as np
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


def test_uniform_is_low_plus_span_times_one_float64_rand_draw():
    # NumPy's uniform(low, high): low + (high - low) * U[0, 1), one torch.rand draw per value
    u = torch.rand(4, generator=torch.Generator().manual_seed(11), dtype=torch.float64)
    got = uniform(2.0, 5.0, 4, torch.Generator().manual_seed(11))
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, 2.0 + 3.0 * u, rtol=0, atol=0)
    # a known pair: the mean of many draws of U(2, 5) is 3.5, the extremes near 2 and 5
    many = uniform(2.0, 5.0, 20_000, torch.Generator().manual_seed(0))
    assert abs(float(many.mean()) - 3.5) < 0.05
    assert float(many.min()) < 2.01 and float(many.max()) > 4.99


def test_the_numpy_seed_is_one_draw_of_torch_randint_over_62_bits():
    # The documented derivation (so a resumed run redraws the same Beta variates): the NumPy
    # generator is seeded with torch.randint(0, 2**62) from the caller's generator.
    for seed in range(8):
        reference = torch.Generator().manual_seed(seed)
        numpy_seed = int(torch.randint(0, 2**62, (1,), generator=reference))
        expected = np.random.default_rng(numpy_seed)
        g = torch.Generator().manual_seed(seed)
        got = numpy_rng(g)
        assert got.random() == expected.random()
        # and it consumed exactly that one draw of the torch generator
        assert torch.equal(torch.rand(3, generator=g), torch.rand(3, generator=reference))


def test_beta_draws_vary_with_the_generator_and_follow_beta_alpha_alpha():
    draws = [beta(2.0, torch.Generator().manual_seed(s)) for s in range(400)]
    assert len(set(draws)) == len(draws)  # every generator state seeds a different stream
    # Beta(2, 2): mean 1/2, variance 1 / 20
    mean = sum(draws) / len(draws)
    var = sum((d - mean) ** 2 for d in draws) / len(draws)
    assert abs(mean - 0.5) < 0.04 and abs(var - 0.05) < 0.012
