"""Two models, two optimizers, one run: a small GAN on scikit-learn's 8x8 digits.

Composer allows one optimizer per run, so GANs and teacher-student setups do not fit it. In
functrain the state is a pytree, so the run state is simply `{"generator": TrainState,
"discriminator": TrainState}` and a GAN iteration is two pure steps in a row. The other network's
weights travel *in the batch*, so each step stays a pure function of its inputs.

Run:
    python examples/gan_digits.py            # ~2000 iterations, a few seconds
    python examples/gan_digits.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import functrain

LATENT = 16


def make_models() -> tuple[torch.nn.Module, torch.nn.Module]:
    generator = torch.nn.Sequential(
        torch.nn.Linear(LATENT, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64), torch.nn.Sigmoid()
    )
    discriminator = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.LeakyReLU(0.2), torch.nn.Linear(128, 1)
    )
    return generator, discriminator


def discriminator_loss(model, batch):
    """Real images should score 1, generated ones 0."""
    real, fake = batch
    logits_real, logits_fake = model(real), model(fake)
    loss = F.binary_cross_entropy_with_logits(
        logits_real, torch.ones_like(logits_real)
    ) + F.binary_cross_entropy_with_logits(logits_fake, torch.zeros_like(logits_fake))
    return loss, {"d_real": torch.sigmoid(logits_real).mean()}


def make_generator_loss(discriminator: torch.nn.Module):
    def generator_loss(model, batch):
        """Generated images should fool the discriminator (whose weights come in the batch)."""
        noise, disc_params = batch
        logits = torch.func.functional_call(discriminator, disc_params, (model(noise),))
        return F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits))

    return generator_loss


def make_gan_step(generator, discriminator, g_opt, d_opt):
    """`(states, real) -> (states, metrics)`: one discriminator step, then one generator step."""
    d_step = functrain.make_step(discriminator, discriminator_loss, d_opt)
    g_step = functrain.make_step(generator, make_generator_loss(discriminator), g_opt)

    def gan_step(states, real):
        g_state, d_state = states["generator"], states["discriminator"]
        n = real.shape[0]
        # Noise is a pure function of the run's key and the step, like every random draw here.
        key = functrain.key_for(g_state.rng, g_state.step, "noise")
        noise = torch.randn(2, n, LATENT, generator=key)
        fake = g_step.pieces.call_model(g_state, noise[0])
        d_state, d_metrics = d_step(d_state, (real, fake))
        g_state, g_metrics = g_step(g_state, (noise[1], d_state.params))
        metrics = {
            "d_loss": d_metrics["loss"],
            "g_loss": g_metrics["loss"],
            "d_real": d_metrics["d_real"],
        }
        return {"generator": g_state, "discriminator": d_state}, metrics

    return gan_step


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="a 50-iteration smoke run")
    args = parser.parse_args(argv)
    iterations = 50 if args.quick else args.iterations

    from sklearn.datasets import load_digits

    images = torch.tensor(load_digits().images, dtype=torch.float32).flatten(1) / 16.0
    torch.manual_seed(0)
    generator, discriminator = make_models()
    g_opt = functrain.optim.adam(lr=2e-3, betas=(0.5, 0.999))
    d_opt = functrain.optim.adam(lr=2e-3, betas=(0.5, 0.999))
    states = {
        "generator": functrain.init(generator, g_opt, seed=1),
        "discriminator": functrain.init(discriminator, d_opt, seed=2),
    }
    gan_step = make_gan_step(generator, discriminator, g_opt, d_opt)
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))
    for i in range(iterations):
        start = (i * args.batch_size) % (len(images) - args.batch_size)
        states, metrics = gan_step(states, images[order[start : start + args.batch_size]])
        if i % max(1, iterations // 10) == 0 or i == iterations - 1:
            print(
                f"iter {i:5d}  d_loss {float(metrics['d_loss']):.3f}  "
                f"g_loss {float(metrics['g_loss']):.3f}  D(real) {float(metrics['d_real']):.2f}"
            )
    # How close are generated images to the data's statistics? (mean pixel intensity per position)
    noise = torch.randn(500, LATENT, generator=torch.Generator().manual_seed(1))
    samples = functrain.make_step(generator, make_generator_loss(discriminator), g_opt)
    fake = samples.pieces.call_model(states["generator"], noise)
    mean_gap = float((fake.mean(0) - images.mean(0)).abs().mean())
    print(f"mean |E[fake] - E[real]| per pixel: {mean_gap:.3f}")
    return {"states": states, "mean_gap": mean_gap}


if __name__ == "__main__":
    main()
