"""Knowledge distillation in one `fit`: a frozen teacher and a small student on the 8x8 digits.

First a teacher (a wide MLP) is trained with an ordinary `fit`. Then the run state becomes the
pytree `{"teacher": TrainState, "student": TrainState}` and one step drives both: the teacher's
logits (no gradients: it stays frozen), then a student step on a loss that mixes the teacher's
softened outputs with the labels (Hinton et al., 2015). The step is a small class implementing
the `functrain.StepLike` protocol, so `fit` can donate the student's memory, add the student's EMA
state before it resumes from a checkpoint, and evaluate the student (the EMA weights) as it would
a step from `make_step`. Train accuracy comes from the student's outputs (no extra forward pass).

Run:
    python examples/distill_digits.py                      # a few seconds
    python examples/distill_digits.py --run-dir runs/kd    # checkpoints; a rerun resumes
    python -m functrain.launch -n 2 examples/distill_digits.py --plan fsdp --run-dir runs/kd
"""

from __future__ import annotations

import os
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
from functrain import datasets
from functrain.algorithms import ema, swap_in_ema
from functrain.data import Loader
from functrain.loggers import ConsoleLogger


def mlp(width: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, 10)
    )


def cross_entropy(model, batch):
    """The labels' cross-entropy (the teacher's loss, and the student's evaluation loss)."""
    images, labels = batch[0], batch[1]
    logits = model(images)
    return F.cross_entropy(logits, labels), {"outputs": logits}


def make_distillation_loss(temperature: float, alpha: float):
    def distillation_loss(model, batch):
        """alpha * T^2 * KL(teacher_T || student_T) + (1 - alpha) * cross-entropy."""
        images, labels, teacher_logits = batch
        logits = model(images)
        soft = F.kl_div(
            F.log_softmax(logits / temperature, dim=-1),
            F.log_softmax(teacher_logits / temperature, dim=-1),
            log_target=True,
            reduction="batchmean",
        )
        hard = F.cross_entropy(logits, labels)
        loss = alpha * temperature**2 * soft + (1 - alpha) * hard
        return loss, {"outputs": logits, "soft_loss": soft.detach()}

    return distillation_loss


class DistillationStep:
    """`({"teacher", "student"}, (images, labels)) -> (states, metrics)`: a `StepLike`.

    Args:
        teacher: the teacher's `Step` (only its model call is used: the teacher never trains).
        student: the student's `Step`, whose loss takes `(images, labels, teacher_logits)`.
    """

    def __init__(self, teacher: functrain.Step, student: functrain.Step):
        self.teacher, self.student = teacher, student

    def __call__(self, states, batch):
        images, labels = batch
        teacher_logits = self.teacher.pieces.call_model(states["teacher"], images)  # no grad
        student, metrics = self.student(states["student"], (images, labels, teacher_logits))
        return {"teacher": states["teacher"], "student": student}, metrics

    # -- the StepLike protocol: what fit may ask of a step ------------------------------------

    def donated(self) -> DistillationStep:
        """The student updates in place (fit owns the states); the teacher is only read."""
        return DistillationStep(self.teacher, self.student.donated())

    def init_state(self, states):
        """The student's algorithm state (its EMA), added before fit builds a restore target."""
        return {**states, "student": self.student.init_state(states["student"])}

    def evaluator(self) -> functrain.Evaluator:
        """Evaluate the student, with the labels' cross-entropy as the loss."""
        student = self.student.evaluator()

        def call_model(states, *args, **kwargs):
            return student.call_model(states["student"], *args, **kwargs)

        return functrain.Evaluator(student.module, call_model, cross_entropy)


def student_ema(states):
    """Evaluate the student's EMA weights (as Composer evaluates an EMA model)."""
    return {**states, "student": swap_in_ema(states["student"])}


def main(argv: list[str] | None = None, callbacks=()) -> dict:
    parser = example_parser(__doc__)
    parser.add_argument("--teacher-epochs", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=15, help="the student's epochs")
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    parser.add_argument("--student-width", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=4.0)
    parser.add_argument("--alpha", type=float, default=0.9)
    parser.add_argument("--plan", default="ddp", help="sharding under the launcher: ddp, fsdp")
    parser.add_argument("--save-every", default="1ep", help="checkpoint interval (--run-dir)")
    add_run_args(parser, lr=3e-3, quick_help="one teacher and two student epochs")
    args = parser.parse_args(argv)
    set_threads(args.threads, default=1)  # two small MLPs: more threads only wait
    teacher_epochs, epochs = (1, 2) if args.quick else (args.teacher_epochs, args.epochs)
    split = datasets.digits(seed=0)
    train = Loader(split.train, args.batch_size, seed=args.seed)
    test = Loader(split.test, 256, shuffle=False, drop_last=False)
    mesh = data_parallel_mesh()
    plan = args.plan if mesh is not None else None
    teacher_dir = os.path.join(args.run_dir, "teacher") if args.run_dir else None

    # 1. The teacher: an ordinary run (resumable; a rerun finds it finished).
    torch.manual_seed(args.seed)
    teacher_model, student_model = mlp(256), mlp(args.student_width)
    teacher_opt = functrain.optim.adamw(lr=args.lr)
    teacher = functrain.make_step(teacher_model, cross_entropy, teacher_opt)
    teacher_state = functrain.init(teacher_model, teacher_opt, seed=args.seed, mesh=mesh, plan=plan)
    with resumable_checkpoints(teacher_dir, every="1ep") as checkpoints:
        result = functrain.fit(
            teacher,
            teacher_state,
            train,
            duration=f"{teacher_epochs}ep",
            eval_data=test,
            eval_metrics=["accuracy"],
            eval_interval=None,
            checkpoints=checkpoints,
            autoresume=checkpoints is not None,
            run_dir=teacher_dir,
            return_result=True,
        )
    if stopped(result, teacher_dir):  # the student needs the whole teacher
        return {"exit_code": result.exit_code}
    teacher_state = result.state

    # 2. The student, against the frozen teacher: one step over both states.
    student_opt = functrain.optim.adamw(lr=args.lr)
    loss = make_distillation_loss(args.temperature, args.alpha)
    student = functrain.compose(
        functrain.make_step(student_model, loss, student_opt), ema(half_life="20ba")
    )
    states = {
        "teacher": teacher_state,
        "student": functrain.init(
            student_model, student_opt, seed=args.seed + 1, mesh=mesh, plan=plan
        ),
    }
    step = DistillationStep(teacher, student)
    with resumable_checkpoints(args.run_dir, every=args.save_every) as checkpoints:
        result = functrain.fit(
            step,
            states,
            train,
            duration=f"{epochs}ep",
            eval_data=test,
            eval_metrics=["accuracy"],
            eval_state_fn=student_ema,
            train_metrics=["accuracy"],
            log_interval="1ep",
            loggers=[ConsoleLogger(interval=f"{max(1, epochs // 3)}ep")],
            callbacks=list(callbacks),
            checkpoints=checkpoints,
            autoresume=checkpoints is not None,
            run_dir=args.run_dir,
            return_result=True,
        )
    run = result.state  # a FitState: both states and the loop's position
    if stopped(result, args.run_dir):  # a stopped run reports no result: it has not finished
        return {"run": run, "exit_code": result.exit_code}
    teacher_acc = functrain.evaluate(teacher, run.states["teacher"], test, metrics=["accuracy"])
    student_acc = functrain.evaluate(step, student_ema(run.states), test, metrics=["accuracy"])
    if functrain.parallel.data_parallel_info(run.states["student"].layout)[0] == 0:
        print(
            f"distill: teacher test accuracy {teacher_acc['accuracy']:.4f}, student (EMA, width "
            f"{args.student_width}) {student_acc['accuracy']:.4f} after {run.step} batches"
        )
    return {
        "run": run,
        "teacher_accuracy": teacher_acc["accuracy"],
        "student_accuracy": student_acc["accuracy"],
        "exit_code": result.exit_code,
    }


if __name__ == "__main__":
    sys.exit(main()["exit_code"])
