"""The GAN example: two models and two optimizers in one `fit` (a pytree of states), which
learns, is killed and resumed bit-identically, and runs under FSDP on 2 ranks as on 1 process."""

import pytest
import torch
from example_runs import (
    assert_same_tensors,
    kill_at_checkpoint,
    launch,
    load_example,
    tensor_leaves,
)
from sklearn.datasets import load_digits

import functrain
from functrain.checkpoint import latest, load

ONE_THREAD = ["--threads", "1"]


def test_gan_learns_the_data_mean_and_its_state_is_one_pytree():
    gan = load_example("gan_digits")
    data_mean = torch.tensor(load_digits().images, dtype=torch.float32).flatten(1).mean(0) / 16
    untrained_gap = float((0.5 - data_mean).abs().mean())  # the generator starts near sigmoid(0)
    result = gan.main(["--iterations", "300", *ONE_THREAD])
    assert result["mean_gap"] < 0.5 * untrained_gap
    run = result["run"]
    assert isinstance(run, functrain.FitState) and run.timestamp.batch == 300
    assert run.timestamp.epoch == 300 // (1797 // 64)  # the loop's own position, epochs too
    paths = list(tensor_leaves(run))
    assert "states.generator.params.0.weight" in paths
    assert any(p.startswith("states.discriminator.opt_state.") for p in paths)
    assert run.states["generator"].step == run.states["discriminator"].step == 300
    # the horizon reached the inner states (their schedules could use "dur" units)
    assert run.states["generator"].timestamp.max_batches == 300


@pytest.mark.slow
def test_gan_killed_and_resumed_is_bit_identical(tmp_path):
    gan = load_example("gan_digits")
    args = ["--iterations", "60", "--save-every", "10ba", *ONE_THREAD]
    reference = gan.main(args)["run"]
    run_dir = tmp_path / "run"
    kill_at_checkpoint("gan_digits", [*args, "--run-dir", str(run_dir)], tmp_path, at=30, seed=1)
    assert latest(run_dir / "checkpoints") is not None  # something to resume from
    resumed = gan.main([*args, "--run-dir", str(run_dir)])
    assert resumed["exit_code"] == 0
    assert_same_tensors(tensor_leaves(reference), tensor_leaves(resumed["run"]))
    assert resumed["run"].timestamp.batch == 60
    # metrics.jsonl for `python -m functrain.plot`: the killed and the resumed run's lines
    from functrain.loggers import read_metrics

    series = read_metrics(run_dir / "metrics.jsonl")
    assert [step for step, _ in series["train/g_loss"]][-1] == 60


@pytest.mark.slow
def test_gan_under_fsdp_on_two_ranks_equals_one_process(tmp_path):
    gan = load_example("gan_digits")
    args = ["--iterations", "30", "--save-every", "10ba", *ONE_THREAD]
    reference = tensor_leaves(gan.main(args)["run"])
    run_dir = tmp_path / "run"
    out = launch("gan_digits", [*args, "--plan", "fsdp", "--run-dir", str(run_dir)])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "after 30 iterations" in out.stdout
    # progress by default, on rank 0 only, as whole lines through the launcher's rank prefixes
    output = out.stdout + out.stderr
    assert "[rank0]: train (end): epoch 1  batch 30/30 (100%)" in output
    assert "[rank1]: train" not in output
    saved = load(latest(run_dir / "checkpoints"))
    saved = {k: v for k, v in saved.items() if isinstance(v, torch.Tensor)}
    # reduction order differs between 1 and 2 ranks: equal up to float rounding
    assert_same_tensors(reference, saved, atol=1e-5)
