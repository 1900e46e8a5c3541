"""Auto-resume through `fit` with what a step keeps in the state: EMA, SWA, a recipe, fp16 loss
scaling. A run crashes after some checkpoints (or is SIGKILLed), a fresh `fit` with a real
`Manager` resumes it, and the result equals the uninterrupted run bit for bit. Also: the error
when a checkpoint does not fit the step, and a finished run extended with a longer duration."""

import json
import logging
import shutil
import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import functrain
from functrain import datasets
from functrain.algorithms import apply_surgery, ema, swa
from functrain.checkpoint import CheckpointMismatchError, Manager
from functrain.data import Loader
from functrain.tree import leaves_with_paths


def small_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(16, 10),
    )  # fmt: skip


def ce_loss(model, batch):
    images, labels = batch
    return F.cross_entropy(model(images), labels)


def algorithms_for(variant: str) -> list:
    if variant == "ema":
        return [ema(half_life="3ba")]
    if variant == "swa":
        return [swa(swa_start="0.25dur", swa_end="0.9dur", update_interval="2ba")]
    if variant == "mild":
        return functrain.recipes.mild()
    return []


def build(variant: str, seed: int = 0):
    """(step, state, loader) of a small digits run with the variant's algorithms."""
    torch.manual_seed(seed)
    algorithms = algorithms_for(variant)
    model = apply_surgery(small_cnn(), algorithms)
    opt = functrain.optim.adamw(lr=3e-3)
    precision = "amp_fp16" if variant == "amp_fp16" else "fp32"
    step = functrain.compose(
        functrain.make_step(model, ce_loss, opt, precision=precision), *algorithms
    )
    split = datasets.digits(seed=0)
    train = torch.utils.data.Subset(split.train, range(128))
    return step, functrain.init(model, opt, seed=seed), Loader(train, 16, seed=3)


class CrashAt:
    def __init__(self, batch):
        self.batch = batch

    def batch_end(self, ctx):
        if ctx.timestamp.batch == self.batch:
            raise RuntimeError("simulated crash")


def tensors(state) -> dict:
    return {p: v for p, v in leaves_with_paths(state) if isinstance(v, torch.Tensor)}


def assert_bit_identical(a, b):
    ta, tb = tensors(a), tensors(b)
    assert sorted(ta) == sorted(tb)
    for key in ta:
        assert torch.equal(ta[key], tb[key]), key


DURATION = "3ep"  # 8 batches per epoch: 24 batches


@pytest.mark.parametrize("variant", ["ema", "swa", "mild", "amp_fp16"])
def test_autoresume_keeps_what_the_step_keeps_in_the_state(tmp_path, variant):
    step, state, loader = build(variant)
    reference = functrain.fit(step, state, loader, duration=DURATION, progress=False)
    assert reference.algo_state  # the variant really keeps something there
    step, state, loader = build(variant)
    with Manager(tmp_path, every="5ba", keep_last=2) as manager:
        with pytest.raises(functrain.CallbackError, match="simulated crash"):
            functrain.fit(step, state, loader, duration=DURATION, checkpoints=manager,
                          callbacks=[CrashAt(13)], progress=False)  # fmt: skip
        assert manager.checkpoints()[-1][0] == 10
    step, state, loader = build(variant, seed=7)  # another init: all of it comes from the save
    with Manager(tmp_path, every="5ba", keep_last=2) as manager:
        resumed = functrain.fit(step, state, loader, duration=DURATION, checkpoints=manager,
                                autoresume=True, return_result=True, progress=False)  # fmt: skip
    assert resumed.resumed_from.endswith("step_000000010") and resumed.finished
    assert_bit_identical(reference, resumed.state)


def test_a_checkpoint_of_another_step_gets_advice_fit_can_follow(tmp_path):
    step, state, loader = build("ema")
    with Manager(tmp_path, every="5ba") as manager:
        functrain.fit(step, state, loader, duration="5ba", checkpoints=manager, progress=False)
    step, state, loader = build("none")  # the same model, without the EMA it was saved with
    with Manager(tmp_path, every="5ba") as manager:
        with pytest.raises(CheckpointMismatchError) as info:
            functrain.fit(step, state, loader, duration="10ba", checkpoints=manager,
                          autoresume=True, progress=False)  # fmt: skip
    message = str(info.value)
    assert "algo_state.ema" in message and "init_from=" in message
    assert "strict=" not in message and "like=" not in message  # options fit does not take


def test_a_finished_run_extended_follows_the_new_duration(capfd):
    # Composer's rule: schedules are functions of the (new) duration. A run of 10 batches with
    # a linear decay to 0 over "1dur", extended to 20: at batch 10 the lr is that of 10/20.
    def run(duration, state=None):
        torch.manual_seed(0)
        model = nn.Linear(3, 1)
        opt = functrain.optim.sgd(lr=0.1 * functrain.schedules.linear(alpha_f=0.0, t_max="1dur"))
        step = functrain.make_step(model, lambda m, b: F.mse_loss(m(b[0]), b[1]), opt)
        state = state or functrain.init(model, opt)
        lrs = []

        class Lr:
            def batch_end(self, ctx):
                lrs.append(ctx.metrics["lr"])

        data = torch.utils.data.TensorDataset(torch.randn(20, 3), torch.randn(20, 1))
        state = functrain.fit(step, state, Loader(data, 2, seed=0), duration=duration,
                              callbacks=[Lr()])  # fmt: skip
        return state, lrs

    state, first = run("10ba")
    _, second = run("20ba", state)
    assert first[-1] == pytest.approx(0.1 * (1 - 9 / 10))
    assert second[0] == pytest.approx(0.1 * (1 - 10 / 20))  # the lr jumps back up, as Composer's
    err = capfd.readouterr().err
    assert "length changed from 10 to 20 batches" in err and "follow the new length" in err


def _lease_threads() -> set:
    """The live threads of checkpoint managers: lease refreshers and background writers."""
    names = ("functrain-lease", "functrain-checkpoint")
    return {t for t in threading.enumerate() if t.name.startswith(names) and t.is_alive()}


def test_fit_gives_back_the_lease_of_a_manager_it_was_given_and_the_manager_stays_usable(
    tmp_path, caplog
):
    root = tmp_path / "run"
    before = _lease_threads()
    step, state, loader = build("none")
    manager = Manager(root, every="4ba", keep_last=2, lease_ttl=0.5)
    state = functrain.fit(step, state, loader, duration="4ba", checkpoints=manager, progress=False)
    assert _lease_threads() == before  # no thread refreshes the lease (or waits) after fit
    assert not (root / "LEASE.json").exists()  # released: another run may take the root
    with caplog.at_level(logging.WARNING, logger="functrain.checkpoint"):
        shutil.rmtree(root)  # a user's TemporaryDirectory going away
        # A second fit with the same manager takes the lease again and saves as before.
        functrain.fit(step, state, loader, duration="8ba", checkpoints=manager, progress=False)
    assert [s for s, _ in manager.checkpoints()] == [8]
    assert not [r for r in caplog.records if "lease" in r.getMessage()]
    assert _lease_threads() == before
    manager.close()


def test_fit_under_the_launcher_records_each_commit(tmp_path, monkeypatch):
    folder = tmp_path / "status"
    folder.mkdir()
    monkeypatch.setenv("FUNCTRAIN_LAUNCH_STATUS", str(folder))
    monkeypatch.setenv("RANK", "0")
    step, state, loader = build("none")
    with Manager(tmp_path / "run", every="4ba") as manager:
        functrain.fit(step, state, loader, duration="8ba", checkpoints=manager, progress=False)
        record = json.loads((folder / "rank0.checkpoint.json").read_text())
        assert (record["step"], record["url"]) == (8, manager.latest())


def test_fit_keeps_the_best_checkpoints_by_eval_accuracy_across_a_crash(tmp_path):
    class Seen:  # what each checkpoint was saved with, across both runs
        def __init__(self):
            self.accuracy = {}

        def checkpoint(self, ctx):
            self.accuracy[ctx.timestamp.batch] = ctx.eval_metrics["accuracy"]

    seen = Seen()
    split = datasets.digits(seed=0)
    held_out = Loader(torch.utils.data.Subset(split.test, range(64)), 32, shuffle=False)

    def run(crash: bool):
        step, state, loader = build("none")
        manager = Manager(tmp_path, every="1ep", keep_last=1, keep_best=2,
                          monitor="eval/accuracy", mode="max")  # fmt: skip
        callbacks = [seen, CrashAt(8 * 3 + 2)] if crash else [seen]
        with manager:
            return functrain.fit(step, state, loader, duration="5ep", checkpoints=manager,
                                 eval_data=held_out, eval_interval="1ep",
                                 eval_metrics=["accuracy"], callbacks=callbacks,
                                 autoresume=not crash, progress=False)  # fmt: skip

    with pytest.raises(functrain.CallbackError, match="simulated crash"):
        run(crash=True)
    run(crash=False)
    assert sorted(seen.accuracy) == [8, 16, 24, 32, 40]
    ranked = sorted(seen.accuracy, key=lambda b: (seen.accuracy[b], b), reverse=True)
    kept = {step for step, _ in functrain.checkpoint.checkpoints(tmp_path)}
    assert kept == set(ranked[:2]) | {40}
