"""Two models, two optimizers, one `fit`: a small GAN on scikit-learn's 8x8 digits.

Composer allows one model and optimizer per run, so GANs and teacher-student setups do not fit
it. In functrain the state is a pytree, so the run state is simply `{"generator": TrainState,
"discriminator": TrainState}` and a GAN iteration is one plain function over it: a
discriminator step, then a generator step. `fit` drives that function like any step -- with
checkpoints, auto-resume, progress, loggers and SIGTERM handling -- keeping the loop's own
position beside the two states (a `functrain.FitState`). The discriminator's weights travel to the
generator's loss *in the batch*, so each inner step stays a pure function of its inputs.

Run:
    python examples/gan_digits.py                          # 2000 iterations, ~15 s on one core
    python examples/gan_digits.py --iterations 300         # README's "0.08 after 300": 0.078
    python examples/gan_digits.py --run-dir runs/gan       # checkpoints; a rerun resumes
    python -m functrain.launch -n 2 examples/gan_digits.py --plan fsdp --run-dir runs/gan
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from _common import (
    add_run_args,
    data_parallel_mesh,
    example_parser,
    resumable_checkpoints,
    set_threads,
    stopped,
)

import functrain
from functrain.data import Loader
from functrain.loggers import ConsoleLogger

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
        """Generated images should fool the discriminator (whose whole weights come in the batch)."""
        noise, weights = batch
        logits = torch.func.functional_call(discriminator, weights, (model(noise),))
        return F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits))

    return generator_loss


def make_gan_step(generator, discriminator, g_opt, d_opt, num_images: int):
    """`(states, (images, indices)) -> (states, metrics)`: a discriminator step, then a generator
    step. The noise of each sample is a pure function of the run's key, the step and the sample's
    index in the data set, so a run on N ranks draws exactly the noise of a run on one."""
    d_step = functrain.make_step(discriminator, discriminator_loss, d_opt)
    g_step = functrain.make_step(generator, make_generator_loss(discriminator), g_opt)

    def gan_step(states, batch):
        real, index = batch
        g_state, d_state = states["generator"], states["discriminator"]
        key = functrain.key_for(g_state.rng, g_state.step, "noise")
        noise = torch.randn(num_images, 2, LATENT, generator=key)[index]  # [n, 2, LATENT]
        fake = g_step.pieces.call_model(g_state, noise[:, 0])
        d_state, d_metrics = d_step(d_state, (real, fake))
        # Sharded (FSDP) weights are gathered whole for the generator's loss, by the
        # discriminator's own layout; without a mesh this is the identity.
        d_weights = functrain.parallel.gather_params(d_state.params, d_state.layout)
        g_state, g_metrics = g_step(g_state, (noise[:, 1], d_weights))
        metrics = {
            "d_loss": d_metrics["loss"],
            "g_loss": g_metrics["loss"],
            "d_real": d_metrics["d_real"],
            "samples": d_metrics["samples"],  # global over the ranks, as the loop counts them
        }
        return {"generator": g_state, "discriminator": d_state}, metrics

    return gan_step, g_step


def digit_images() -> torch.Tensor:
    from sklearn.datasets import load_digits

    return torch.tensor(load_digits().images, dtype=torch.float32).flatten(1) / 16.0


def main(argv: list[str] | None = None, callbacks=()) -> dict:
    parser = example_parser(__doc__)
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    parser.add_argument("--plan", default="ddp", help="sharding under the launcher: ddp, fsdp")
    parser.add_argument("--save-every", default="200ba", help="checkpoint interval (--run-dir)")
    add_run_args(parser, lr=2e-3, quick_help="a 50-iteration smoke run")
    args = parser.parse_args(argv)
    set_threads(args.threads, default=1)  # two small MLPs: more threads only wait
    iterations = 50 if args.quick else args.iterations

    images = digit_images()
    loader = Loader(
        torch.utils.data.TensorDataset(images, torch.arange(len(images))),
        args.batch_size,
        seed=args.seed,
    )
    mesh = data_parallel_mesh()
    plan = args.plan if mesh is not None else None
    torch.manual_seed(args.seed)  # the initial weights
    generator, discriminator = make_models()
    g_opt = functrain.optim.adam(lr=args.lr, betas=(0.5, 0.999))
    d_opt = functrain.optim.adam(lr=args.lr, betas=(0.5, 0.999))
    # Both models under one plan: until the layout travels with each state, two plans in one
    # process would share the process-wide sharding policies.
    states = {
        "generator": functrain.init(generator, g_opt, seed=args.seed + 1, mesh=mesh, plan=plan),
        "discriminator": functrain.init(
            discriminator, d_opt, seed=args.seed + 2, mesh=mesh, plan=plan
        ),
    }
    gan_step, g_step = make_gan_step(generator, discriminator, g_opt, d_opt, len(images))
    every = f"{max(1, iterations // 10)}ba"
    with resumable_checkpoints(args.run_dir, every=args.save_every) as checkpoints:
        result = functrain.fit(
            gan_step,
            states,
            loader,
            duration=f"{iterations}ba",
            loggers=[ConsoleLogger(interval=every)],
            callbacks=list(callbacks),
            log_interval="1ba" if iterations < 10 else "10ba",
            checkpoints=checkpoints,
            autoresume=checkpoints is not None,
            run_dir=args.run_dir,
            return_result=True,
        )
    run = result.state  # a FitState: the two TrainStates and the loop's position
    if stopped(result, args.run_dir):  # a stopped run reports no result: it has not finished
        return {"states": run.states, "run": run, "exit_code": result.exit_code}
    # How close are generated images to the data's statistics? (mean pixel intensity per position)
    noise = torch.randn(500, LATENT, generator=torch.Generator().manual_seed(1))
    fake = g_step.pieces.call_model(run.states["generator"], noise)
    mean_gap = float((fake.mean(0) - images.mean(0)).abs().mean())
    if functrain.parallel.data_parallel_info(run.states["generator"].layout)[0] == 0:
        print(f"mean |E[fake] - E[real]| per pixel: {mean_gap:.3f} after {run.step} iterations")
    return {"states": run.states, "run": run, "mean_gap": mean_gap, "exit_code": result.exit_code}


if __name__ == "__main__":
    sys.exit(main()["exit_code"])
