"""The distillation example: a frozen teacher and a trained student in one `fit` through a
`StepLike` class (donation, the student's EMA state before resume, evaluation of the student);
it learns, stays frozen where it should, is killed and resumed bit-identically, and runs under
FSDP on 2 ranks as on 1 process."""

import pytest
import torch
from example_runs import (
    assert_same_tensors,
    kill_at_checkpoint,
    launch,
    load_example,
    tensor_leaves,
)

from functrain.checkpoint import latest, load

QUICK = ["--teacher-epochs", "2", "--epochs", "3", "--threads", "1"]


def test_student_learns_from_a_frozen_teacher(tmp_path):
    kd = load_example("distill_digits")
    result = kd.main(["--teacher-epochs", "6", "--epochs", "8", "--threads", "1"])
    run = result["run"]
    assert result["teacher_accuracy"] > 0.85
    assert result["student_accuracy"] > 0.7  # 10 classes: chance is 0.1
    teacher = run.states["teacher"]
    assert teacher.step == 6 * 22  # trained in its own fit (22 batches per epoch), then frozen
    assert run.states["student"].step == run.timestamp.batch == 8 * 22
    assert "ema" in run.states["student"].algo_state  # init_state of the protocol, via fit


def test_the_teacher_is_not_changed_by_the_distillation_run(tmp_path):
    kd = load_example("distill_digits")
    after = kd.main([*QUICK, "--run-dir", str(tmp_path)])["run"]
    # the teacher as its own run left it (its last checkpoint) vs. after the student's run
    trained = load(latest(tmp_path / "teacher" / "checkpoints"))
    frozen = {k: v for k, v in trained.items() if k.startswith("params.")}
    teacher = {k: v for k, v in tensor_leaves(after.states["teacher"]).items()}
    assert_same_tensors(frozen, {k: v for k, v in teacher.items() if k.startswith("params.")})


@pytest.mark.slow
def test_distillation_killed_and_resumed_is_bit_identical(tmp_path):
    kd = load_example("distill_digits")
    args = [*QUICK, "--save-every", "10ba"]
    reference = kd.main(args)["run"]
    run_dir = tmp_path / "run"
    # the kill lands in the student's run (the teacher's own run has finished by then)
    kill_at_checkpoint("distill_digits", [*args, "--run-dir", str(run_dir)], tmp_path, 40, seed=2)
    resumed = kd.main([*args, "--run-dir", str(run_dir)])
    assert resumed["exit_code"] == 0
    assert_same_tensors(tensor_leaves(reference), tensor_leaves(resumed["run"]))


@pytest.mark.slow
def test_distillation_under_fsdp_on_two_ranks_equals_one_process(tmp_path):
    kd = load_example("distill_digits")
    reference = tensor_leaves(kd.main(QUICK)["run"])
    run_dir = tmp_path / "run"
    out = launch("distill_digits", [*QUICK, "--plan", "fsdp", "--run-dir", str(run_dir)])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "distill: teacher test accuracy" in out.stdout
    saved = load(latest(run_dir / "checkpoints"))
    saved = {k: v for k, v in saved.items() if isinstance(v, torch.Tensor)}
    assert_same_tensors(reference, saved, atol=1e-5)
