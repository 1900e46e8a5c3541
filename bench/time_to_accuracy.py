"""Time to accuracy: do the speedup recipes reach a target sooner than the baseline on a CPU?

Two tasks, each trained from scratch with a baseline and with speedup variants over several
seeds:

    fashion_mnist   a small ResNet-style CNN on Fashion-MNIST; target: 91% test accuracy,
                    checked every 100 steps on a fixed random 3,000-image subset of the test set
                    and confirmed on all 10,000 images when the subset reaches it
    shakespeare     a character GPT on Shakespeare's works; target: validation loss 2.0 nats/char
                    on 256 fixed windows of held-out text

Variants are recipes (`functrain.recipes`, or a CPU-pruned version of one) and, opt-in with
`--method-seeds`, single methods (`functrain.algorithms`). Each is composed onto the same step,
optimizer, schedule and data order as the baseline. A run records its training seconds
(evaluation excluded) and optimizer steps at the first evaluation that meets the target, and
stops there (or at the step budget: the run length that the schedules, progressive resizing and
warm-up are defined against).

The machine is shared and noisy, so all runs of a task are alive at once and take turns, one
evaluation interval each, with the order rotating every round. A burst of load from other
processes then hits every variant alike. Steps to target do not depend on the load at all but
seconds do, so both are reported: as medians over seeds, and as the median of per-seed ratios
baseline / variant (pairs share the seed, hence the initial weights and the data order). The two
tasks run in two processes with one torch thread each, because oversubscribed threads on a busy
machine make step times several times slower and erratic.

Usage:
    python bench/time_to_accuracy.py                     # recipes, 3 seeds (~10-15 min, 2 cores)
    python bench/time_to_accuracy.py --method-seeds 1    # plus every single method on seed 0
    python bench/time_to_accuracy.py --quick             # a smoke run (seconds)
    python bench/time_to_accuracy.py --tasks shakespeare --seeds 5 --variants transformer
    python -m bench time_to_accuracy ...                 # the same, from the suite runner

Writes `bench/results/time_to_accuracy.json` (or `--out`).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

if __package__ in (None, ""):  # run as a script: make `bench` and `functrain` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import functrain
from bench import common
from functrain import algorithms as alg
from functrain import optim, recipes, schedules
from functrain.data import Loader
from functrain.datasets import DatasetNotFound
from functrain.loop import evaluate
from functrain.models import GPT, GPTConfig, SmallResNet, classification_loss, gpt_loss

DEFAULT_OUT = os.path.join(common.RESULTS_DIR, "time_to_accuracy.json")
TASKS = ("fashion_mnist", "shakespeare")


# ------------------------------------------------------------------------------------------------
# what is compared


@dataclass(frozen=True)
class Variant:
    """One way of training a task.

    Attributes:
        name: its name in tables and JSON.
        kind: "baseline", "recipe" (a bundle of methods) or "method" (one method).
        build: returns a fresh list of `Algorithm`s (surgery and step transforms).
        description: what it adds to the baseline.
        max_seeds: run it on at most this many of the seeds (None: all). Single methods run on
            the first `--method-seeds` seeds instead (none by default: they are opt-in).
    """

    name: str
    kind: str
    build: Callable[[], list]
    description: str
    max_seeds: int | None = None

    def runs_on(self, index: int, method_seeds: int) -> bool:
        """Whether this variant trains on the `index`-th seed."""
        if self.kind == "method":
            return index < method_seeds
        return self.max_seeds is None or index < self.max_seeds


@dataclass
class Task:
    """A model, its data, a target and the variants to compare.

    Attributes:
        name: the task's name.
        metric: the evaluation metric the target is on ("accuracy" or "loss").
        target: the value to reach.
        higher_is_better: True for accuracy, False for a loss.
        make_model: builds the baseline model (weights drawn from torch's global generator,
            which each run seeds).
        loss_fn: the step's `loss_fn(model, batch)`.
        make_optimizer: builds the optimizer (with its learning-rate schedule).
        train_set: a map-style dataset of training batches' items.
        batch_size: the training batch size.
        budget_steps: the run's length in optimizer steps (the horizon of every "dur").
        eval_every: steps between evaluations.
        eval_batches: the fixed held-out batches the target is measured on.
        full_batches: the whole held-out set, when `eval_batches` is a subset of it (None: it
            is not). A crossing seen on the subset counts only if it holds on the whole set
            too, and the final score is taken on it.
        variants: what to compare; the first is the baseline.
        info: facts about the setup for the JSON.
    """

    name: str
    metric: str
    target: float
    higher_is_better: bool
    make_model: Callable[[], torch.nn.Module]
    loss_fn: Callable
    make_optimizer: Callable[[], Any]
    train_set: Any
    batch_size: int
    budget_steps: int
    eval_every: int
    eval_batches: list
    variants: list[Variant]
    full_batches: list | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def reached(self, value: float) -> bool:
        """Whether `value` meets the target."""
        if not math.isfinite(value):
            return False
        return value >= self.target if self.higher_is_better else value <= self.target


def _batches(tensors: Sequence[torch.Tensor], size: int) -> list[tuple[torch.Tensor, ...]]:
    """Fixed evaluation batches: consecutive slices of `size` rows."""
    n = len(tensors[0])
    return [tuple(t[i : i + size] for t in tensors) for i in range(0, n, size)]


# ------------------------------------------------------------------------------------------------
# Fashion-MNIST


def fashion_mnist_task(quick: bool = False) -> Task:
    """SmallResNet (16/32/64 channels, stem max-pool) on Fashion-MNIST, target 91% test accuracy.

    Baseline: AdamW (lr 4e-3, weight decay 5e-4), linear warm-up then linear decay to zero over
    3,000 steps of batch 64 (3.2 epochs). Variants: the part of Composer's mild recipe that pays
    on a CPU, mild as published (one seed), and mild's methods one at a time.
    """
    from functrain.datasets import fashion_mnist

    split = fashion_mnist()
    train_x, train_y = split.train.tensors
    test_x, test_y = split.test.tensors
    if quick:
        widths, batch_size, budget, every, n_eval = (4, 8), 32, 20, 10, 256
        train_set = torch.utils.data.TensorDataset(train_x[:1024], train_y[:1024])
        target = 0.2
    else:
        widths, batch_size, budget, every, n_eval = (16, 32, 64), 64, 3000, 100, 3000
        train_set = split.train
        target = 0.91
    # A fixed random subset for the frequent checks (the test set's first images are easier
    # than the rest); the whole test set confirms a crossing and gives the final score.
    subset = torch.randperm(len(test_y), generator=torch.Generator().manual_seed(0))[:n_eval]
    eval_batches = _batches((test_x[subset], test_y[subset]), 500)
    full_batches = None if quick else _batches((test_x, test_y), 1000)

    def make_model() -> torch.nn.Module:
        return SmallResNet(in_channels=1, num_classes=10, widths=widths, stem_pool=True)

    def make_optimizer():
        # In batches, not "dur": the optimizer evaluates the schedule at init, before a horizon.
        warmup = f"{max(1, budget * 3 // 100)}ba"
        lr = 4e-3 * schedules.linear_with_warmup(t_warmup=warmup, t_max=f"{budget}ba")
        return optim.adamw(lr=lr, weight_decay=5e-4)

    ema_args = {"half_life": "100ba", "update_interval": "20ba"}  # as in Composer's mild
    resize_args = {"initial_scale": 0.5, "delay_fraction": 0.4, "finetune_fraction": 0.2}

    def cpu_recipe() -> list:
        # mild without the two methods that do not pay here: BlurPool's extra convolutions cost
        # more than they gain, and the low-resolution phase of progressive resizing is wasted on
        # 28x28 images (the model then scores far worse at full size; see the report)
        keep = ("channels_last", "ema", "label_smoothing")
        return [a for a in recipes.mild() if a.name in keep]

    variants = [
        Variant("baseline", "baseline", list, "AdamW, linear warm-up and decay"),
        Variant("mild_cpu", "recipe", cpu_recipe, "Composer's mild without BlurPool and "
                "progressive resizing: channels-last, EMA, label smoothing 0.08"),
        Variant("mild", "recipe", recipes.mild, "Composer's mild recipe as published "
                "(BlurPool, channels-last, EMA, label smoothing, progressive resizing)",
                max_seeds=1),
        Variant("channels_last", "method", lambda: [alg.channels_last()],
                "channels-last memory format"),
        Variant("ema", "method", lambda: [alg.ema(**ema_args)],
                "EMA, half-life 100 batches, updated every 20"),
        Variant("label_smoothing", "method", lambda: [alg.label_smoothing(0.08)],
                "label smoothing 0.08"),
        Variant("progressive_resizing", "method",
                lambda: [alg.progressive_resizing(size_increment=4, **resize_args)],
                "progressive resizing from 14x14 (scale 0.5, delay 0.4, fine-tune 0.2)"),
        Variant("blurpool", "method", lambda: [alg.blurpool()], "BlurPool"),
    ]  # fmt: skip
    return Task(
        name="fashion_mnist",
        metric="accuracy",
        target=target,
        higher_is_better=True,
        make_model=make_model,
        loss_fn=classification_loss,
        make_optimizer=make_optimizer,
        train_set=train_set,
        batch_size=batch_size,
        budget_steps=budget,
        eval_every=every,
        eval_batches=eval_batches,
        full_batches=full_batches,
        variants=variants,
        info={
            "model": f"SmallResNet(widths={widths}, stem_pool=True)",
            "train_samples": len(train_set),
            "eval_samples": sum(len(b[1]) for b in eval_batches),
            "full_samples": len(test_y),
            "optimizer": "adamw(lr=4e-3 * linear_with_warmup(0.03dur), weight_decay=5e-4)",
        },
    )


# ------------------------------------------------------------------------------------------------
# Shakespeare


def shakespeare_corpus() -> tuple[torch.Tensor, list[str]]:
    """All 42 works as one tensor of character ids (works in name order) and the alphabet."""
    from functrain.datasets import shakespeare

    text = "".join(shakespeare().values())
    alphabet = sorted(set(text))
    lookup = np.zeros(max(map(ord, alphabet)) + 1, dtype=np.uint8)
    lookup[[ord(c) for c in alphabet]] = np.arange(len(alphabet), dtype=np.uint8)
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    return torch.from_numpy(lookup[codes].astype(np.int64)), alphabet


def _windows(ids: torch.Tensor, starts: torch.Tensor, length: int) -> tuple[torch.Tensor, ...]:
    """Inputs `ids[s : s+length]` and next-character targets for each start `s`."""
    index = starts[:, None] + torch.arange(length + 1)[None, :]
    rows = ids[index]
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def shakespeare_task(quick: bool = False) -> Task:
    """A 3-layer character GPT (width 96, context 64) on Shakespeare, target 2.0 nats/char.

    The last 5% of the corpus is held out; the target is measured on 256 fixed windows of it.
    Baseline: AdamW (lr 3e-3, weight decay 0.1 off biases and norms), linear warm-up then cosine
    decay over 1,000 steps of batch 32. Variants: the transformer recipe (low-precision
    LayerNorm, ALiBi, GLU, sequence-length warm-up), the recipe without the warm-up, and its
    methods one at a time.
    """
    ids, alphabet = shakespeare_corpus()
    if quick:
        ids = ids[:200_000]
        context, layers, width, heads, batch_size, budget, every, n_eval = 16, 1, 16, 2, 8, 8, 4, 16
        target = 4.3
    else:
        context, layers, width, heads = 64, 3, 96, 4
        batch_size, budget, every, n_eval = 32, 1000, 50, 256
        target = 2.0
    cut = int(len(ids) * 0.95)
    train_ids, val_ids = ids[:cut], ids[cut:]
    starts = torch.arange(0, len(train_ids) - context - 1, context)
    train_set = torch.utils.data.TensorDataset(*_windows(train_ids, starts, context))
    generator = torch.Generator().manual_seed(0)
    val_starts = torch.randint(0, len(val_ids) - context - 1, (n_eval,), generator=generator)
    eval_batches = _batches(_windows(val_ids, val_starts, context), 64)
    config = GPTConfig(
        vocab_size=len(alphabet), block_size=context, n_layer=layers, n_head=heads, n_embd=width
    )

    def make_model() -> torch.nn.Module:
        return GPT(config)

    def make_optimizer():
        warmup, t_max = f"{max(1, budget * 3 // 100)}ba", f"{budget}ba"  # see fashion_mnist_task
        lr = 3e-3 * schedules.cosine_annealing_with_warmup(warmup, t_max=t_max, alpha_f=0.1)
        return optim.adamw(lr=lr, weight_decay=0.1, weight_decay_mask=optim.no_decay_mask)

    def alibi_glu() -> list:
        # The recipe's two architecture changes alone, to separate what they buy (fewer steps)
        # from what sequence-length warm-up buys (cheaper early steps). Low-precision LayerNorm
        # is left out as it does nothing outside autocast.
        keep = ("alibi", "gated_linear_units")
        return [a for a in recipes.transformer(context) if a.name in keep]

    variants = [
        Variant("baseline", "baseline", list, "AdamW, warm-up and cosine decay"),
        Variant("transformer", "recipe", lambda: recipes.transformer(context),
                "low-precision LayerNorm, ALiBi, GLU, sequence-length warm-up (0.3 of the run)"),
        Variant("alibi_glu", "recipe", alibi_glu, "the transformer recipe without "
                "sequence-length warm-up: ALiBi and GLU"),
        Variant("alibi", "method",
                lambda: [alg.alibi(context, train_sequence_length_scaling=1.0)],
                "ALiBi instead of learned positions (full-length rows, as in the recipe)"),
        Variant("seq_length_warmup", "method",
                lambda: [alg.seq_length_warmup(0.3, 8, context, 8)],
                "sequence length 8 -> 64 over the first 30% of the run"),
        Variant("gated_linear_units", "method", lambda: [alg.gated_linear_units()], "GLU MLPs"),
    ]  # fmt: skip
    return Task(
        name="shakespeare",
        metric="loss",
        target=target,
        higher_is_better=False,
        make_model=make_model,
        loss_fn=gpt_loss,
        make_optimizer=make_optimizer,
        train_set=train_set,
        batch_size=batch_size,
        budget_steps=budget,
        eval_every=every,
        eval_batches=eval_batches,
        variants=variants,
        info={
            "model": f"GPT(n_layer={layers}, n_embd={width}, n_head={heads}, context={context})",
            "alphabet": len(alphabet),
            "train_chars": len(train_ids),
            "eval_tokens": n_eval * context,
            "optimizer": "adamw(lr=3e-3 * cosine_annealing_with_warmup(0.03dur, alpha_f=0.1), "
            "weight_decay=0.1, no decay on biases/norms)",
        },
    )


TASK_BUILDERS: dict[str, Callable[[bool], Task]] = {
    "fashion_mnist": fashion_mnist_task,
    "shakespeare": shakespeare_task,
}


# ------------------------------------------------------------------------------------------------
# one training run


class Run:
    """One (variant, seed) of a task: its step, state, data position and clock.

    Args:
        task: the task.
        variant: the variant.
        seed: seeds the initial weights (torch's global generator, which `nn.init` draws from),
            the data order and the state's keys.
    """

    def __init__(self, task: Task, variant: Variant, seed: int):
        self.task, self.variant, self.seed = task, variant, seed
        torch.manual_seed(seed)  # the same initial weights for every variant of this seed
        algorithms = variant.build()
        model = alg.apply_surgery(task.make_model(), algorithms)
        optimizer = task.make_optimizer()
        base = functrain.make_step(model, task.loss_fn, optimizer, donate=True)
        self.step = functrain.compose(base, *algorithms)
        state = functrain.init(model, optimizer, seed=seed)
        self.loader = Loader(task.train_set, task.batch_size, seed=seed, rank=0, world_size=1)
        # What `fit` sets: progressive resizing, warm-up and "dur" schedules read the horizon.
        self.state = state.replace(
            timestamp=state.timestamp.replace(
                batches_per_epoch=self.loader.num_batches, max_batches=task.budget_steps
            )
        )
        self.batches = self.loader.epoch_iter(0)
        self.train_seconds = 0.0  # wall clock
        self.train_cpu_seconds = 0.0  # this process's CPU time: what other processes' load
        # does not inflate (with one torch thread it is the work of this run alone)
        # (step, train seconds, train CPU seconds, metric) after every evaluation
        self.history: list[tuple[int, float, float, float]] = []
        self.reached_at: tuple[int, float, float] | None = None
        self.confirmations: list[tuple[int, float]] = []  # (step, metric on the whole set)
        self.diverged = False

    @property
    def steps(self) -> int:
        return self.state.step

    @property
    def done(self) -> bool:
        return self.diverged or self.reached_at is not None or self.steps >= self.task.budget_steps

    def train(self, steps: int) -> None:
        """Train `steps` more optimizer steps (at most to the budget); the time is counted."""
        steps = min(steps, self.task.budget_steps - self.steps)
        started, cpu_started = time.perf_counter(), time.process_time()
        loss = None
        for _ in range(steps):
            batch = next(self.batches, None)
            if batch is None:  # end of an epoch
                self.state = self.state.replace(timestamp=self.state.timestamp.advance_epoch())
                self.batches = self.loader.epoch_iter(self.state.timestamp.epoch)
                batch = next(self.batches)
            self.state, metrics = self.step(self.state, batch)
            loss = metrics["loss"]
        if loss is not None and not math.isfinite(float(loss)):
            self.diverged = True
        self.train_seconds += time.perf_counter() - started
        self.train_cpu_seconds += time.process_time() - cpu_started

    def evaluation_state(self) -> functrain.TrainState:
        """The weights to score: the moving average when the variant keeps one (as Composer)."""
        if "ema" in self.state.algo_state:
            return alg.swap_in_ema(self.state)
        return self.state

    def score(self, batches: list) -> float:
        """The task's metric on `batches` (not timed)."""
        metrics = ["accuracy"] if self.task.metric == "accuracy" else None
        results = evaluate(self.step, self.evaluation_state(), batches, metrics=metrics)
        return float(results[self.task.metric])

    def evaluate(self) -> float:
        """Score the held-out subset, record it, and note the first time the target is met.

        A crossing on the subset is confirmed on the whole set when the task has one (neither
        evaluation is timed); the run stops only once both meet the target.
        """
        value = self.score(self.task.eval_batches)
        self.history.append((self.steps, self.train_seconds, self.train_cpu_seconds, value))
        if self.reached_at is None and self.task.reached(value):
            if self.task.full_batches is not None:
                full = self.score(self.task.full_batches)
                self.confirmations.append((self.steps, full))
                if not self.task.reached(full):
                    return value
            self.reached_at = (self.steps, self.train_seconds, self.train_cpu_seconds)
        return value

    def record(self, final_metric: float | None) -> dict[str, Any]:
        """This run's row of the JSON."""
        steps, seconds, cpu_seconds = self.reached_at if self.reached_at else (None, None, None)
        return {
            "variant": self.variant.name,
            "seed": self.seed,
            "reached": self.reached_at is not None,
            "steps_to_target": steps,
            "seconds_to_target": seconds,
            "cpu_seconds_to_target": cpu_seconds,
            "final_step": self.steps,
            "final_metric": self.history[-1][3] if self.history else None,
            "final_metric_full": final_metric,
            "train_seconds": self.train_seconds,
            "train_cpu_seconds": self.train_cpu_seconds,
            "seconds_per_step": self.train_seconds / max(self.steps, 1),
            "cpu_seconds_per_step": self.train_cpu_seconds / max(self.steps, 1),
            "diverged": self.diverged,
            "history": [list(h) for h in self.history],
            "confirmations": [list(c) for c in self.confirmations],
        }


# ------------------------------------------------------------------------------------------------
# the comparison


def run_task(
    task: Task,
    seeds: Sequence[int],
    method_seeds: int,
    *,
    to_end: bool = False,
    variants: Sequence[str] | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Train every variant of `task` on its seeds, interleaved; returns the task's JSON record.

    Args:
        task: the task.
        seeds: the seeds of the baseline and the recipes.
        method_seeds: how many of `seeds` the single methods run on (0: none).
        to_end: keep training to the budget after the target (the final metric is then the
            budget's); by default a run stops at the target.
        variants: names to run (default all); the baseline always runs.
        log: where progress lines go.
    """
    chosen = [
        v
        for v in task.variants
        if (variants is None or v.name in variants or v.kind == "baseline")
        and any(v.runs_on(i, method_seeds) for i in range(len(seeds)))
    ]
    runs = [
        Run(task, variant, seed)
        for index, seed in enumerate(seeds)
        for variant in chosen
        if variant.runs_on(index, method_seeds)
    ]
    started = time.perf_counter()
    for run in runs:  # the starting point, so a run that is already there counts 0 steps
        run.evaluate()
    round_index = 0
    while True:
        active = [r for r in runs if not r.done or (to_end and r.steps < task.budget_steps)]
        active = [r for r in active if not r.diverged]
        if not active:
            break
        shift = round_index % len(active)  # rotate: nobody always runs right after the evals
        for run in active[shift:] + active[:shift]:
            run.train(task.eval_every)
            run.evaluate()
        round_index += 1
        if round_index % 5 == 0:
            latest = ", ".join(
                f"{r.variant.name}/{r.seed}: {r.history[-1][3]:.3f}@{r.steps}" for r in active
            )
            log(f"  [{task.name}] {time.perf_counter() - started:.0f} s, {task.metric} {latest}")
    rows = []
    for run in runs:
        final = run.score(task.full_batches) if task.full_batches is not None else None
        rows.append(run.record(final))
    return {
        "task": task.name,
        "metric": task.metric,
        "target": task.target,
        "higher_is_better": task.higher_is_better,
        "batch_size": task.batch_size,
        "budget_steps": task.budget_steps,
        "eval_every": task.eval_every,
        "seeds": list(seeds),
        "method_seeds": list(seeds[:method_seeds]),
        "info": task.info,
        "variants": {
            v.name: {"kind": v.kind, "description": v.description, "algorithms": _names(v)}
            for v in chosen
        },
        "runs": rows,
        "summary": summarize(rows, chosen[0].name),
        "wall_seconds": time.perf_counter() - started,
    }


def _names(variant: Variant) -> list[str]:
    return [a.name for a in variant.build()]


def _median(values: Sequence[float]) -> float | None:
    """The median, with an unreached run counted as infinitely slow (None if that is the median)."""
    if not values:
        return None
    value = statistics.median(sorted(values))
    return None if math.isinf(value) else value


def summarize(rows: list[dict], baseline: str) -> dict[str, dict[str, Any]]:
    """Per variant: runs reaching the target, median steps and times, and the speedups.

    A speedup is the median over seeds of `baseline / variant` for the same seed, in steps, wall
    seconds and CPU seconds separately; a variant run that missed the target counts as a ratio
    of 0 and a baseline run that missed it leaves its seed out.
    """
    inf = math.inf
    units = ("steps", "seconds", "cpu_seconds")
    by_seed = {r["seed"]: r for r in rows if r["variant"] == baseline}
    summary = {}
    for name in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == name]
        ratios: dict[str, list[float]] = {unit: [] for unit in units}
        for r in mine:
            base = by_seed.get(r["seed"])
            if base is None or not base["reached"]:
                continue
            for unit in units:
                value = r[f"{unit}_to_target"]
                ratios[unit].append(base[f"{unit}_to_target"] / value if r["reached"] else 0.0)
        entry: dict[str, Any] = {"runs": len(mine), "reached": sum(r["reached"] for r in mine)}
        for unit in units:
            times = [r[f"{unit}_to_target"] if r["reached"] else inf for r in mine]
            entry[f"median_{unit}"] = _median(times)
            entry[f"speedup_{unit}"] = statistics.median(ratios[unit]) if ratios[unit] else None
            entry[f"speedups_{unit}"] = ratios[unit]
        for unit in ("seconds", "cpu_seconds"):
            entry[f"median_{unit}_per_step"] = statistics.median(
                r[f"{unit}_per_step"] for r in mine
            )
        summary[name] = entry
    return summary


# ------------------------------------------------------------------------------------------------
# reporting


def _ratio(value: float | None) -> str | None:
    if value is None:
        return None
    return "missed" if value == 0 else f"{value:.2f}x"  # 0: the median run missed the target


def run_table(record: dict) -> str:
    """Every run: steps, wall and CPU seconds to the target, and the final metric."""
    header = ["task", "variant", "seed", "steps to target", "s to target", "CPU s to target",
              "final metric"]  # fmt: skip
    full = any(r["final_metric_full"] is not None for r in record["runs"])
    if full:
        header.append("final (full set)")
    rows = []
    for r in record["runs"]:
        row = [record["task"], r["variant"], r["seed"], r["steps_to_target"],
               r["seconds_to_target"], r["cpu_seconds_to_target"], round(r["final_metric"], 4)]  # fmt: skip
        if full:
            value = r["final_metric_full"]
            row.append(None if value is None else round(value, 4))
        rows.append(row)
    return common.markdown_table(header, rows)


def summary_table(record: dict) -> str:
    """Per variant: medians, per-step cost and the speedups baseline / variant."""
    header = ["task", "variant", "reached", "median steps", "median s", "median CPU s",
              "CPU ms/step", "speedup (steps)", "speedup (wall)", "speedup (CPU)"]  # fmt: skip
    rows = []
    for name, s in record["summary"].items():
        rows.append([
            record["task"], name, f"{s['reached']}/{s['runs']}", s["median_steps"],
            s["median_seconds"], s["median_cpu_seconds"],
            round(1e3 * s["median_cpu_seconds_per_step"], 1), _ratio(s["speedup_steps"]),
            _ratio(s["speedup_seconds"]), _ratio(s["speedup_cpu_seconds"]),
        ])  # fmt: skip
    return common.markdown_table(header, rows)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python bench/time_to_accuracy.py",
        description="Time and steps to a target for baseline vs speedup recipes.",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny models, seconds")
    parser.add_argument("--tasks", default=",".join(TASKS), help=f"comma list of {TASKS}")
    parser.add_argument(
        "--variants", default=None, help="comma list (default: all; baseline always)"
    )
    parser.add_argument("--seeds", type=int, default=None, help="seeds per recipe (default 3)")
    parser.add_argument(
        "--method-seeds",
        type=int,
        default=None,
        help="seeds per single method (default 0: recipes only; 1 with --quick)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process (1)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="tasks run in parallel processes (default: 2 if 2+ cores, 1 with "
                        "--quick)")  # fmt: skip
    parser.add_argument("--to-end", action="store_true", help="train to the budget, not the target")
    parser.add_argument("--out", default=DEFAULT_OUT, help="the JSON file to write")
    args = parser.parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in TASK_BUILDERS]
    if unknown:
        parser.error(f"unknown task(s) {unknown}; choose from {list(TASK_BUILDERS)}")
    args.tasks = tasks
    args.variants = None if args.variants is None else args.variants.split(",")
    if args.seeds is None:
        args.seeds = 1 if args.quick else 3
    if args.method_seeds is None:
        args.method_seeds = 1 if args.quick else 0
    if args.jobs is None:
        args.jobs = 1 if args.quick or (os.cpu_count() or 1) < 2 else 2
    if args.seeds < 1 or args.method_seeds < 0 or args.threads < 1 or args.jobs < 1:
        parser.error("--seeds, --threads and --jobs must be >= 1 and --method-seeds >= 0")
    args.method_seeds = min(args.method_seeds, args.seeds)
    return args


def run_named_task(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """Build task `name` and run it (in this process or a worker); its JSON record."""
    torch.set_num_threads(options["threads"])
    try:
        task = TASK_BUILDERS[name](options["quick"])
    except DatasetNotFound as error:
        print(f"[{name}] skipped: {error}", flush=True)
        return {"task": name, "skipped": str(error)}
    return run_task(
        task,
        list(range(options["seeds"])),
        options["method_seeds"],
        to_end=options["to_end"],
        variants=options["variants"],
        log=lambda line: print(line, flush=True),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; prints the tables and writes the JSON. Returns an exit code."""
    args = parse_args(argv)
    options = {
        "quick": args.quick,
        "seeds": args.seeds,
        "method_seeds": args.method_seeds,
        "threads": args.threads,
        "to_end": args.to_end,
        "variants": args.variants,
    }
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        started = time.perf_counter()
        environment = common.environment()
        jobs = min(args.jobs, len(args.tasks))
        print(f"tasks {', '.join(args.tasks)}: {jobs} process(es), {args.threads} thread(s) each")
        if jobs > 1:
            # One process per task, each on its own core: the tasks' runs are interleaved within
            # a process, so the noise the two processes inflict on each other is shared alike.
            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
                futures = [pool.submit(run_named_task, name, options) for name in args.tasks]
                records = [future.result() for future in futures]
        else:
            records = [run_named_task(name, options) for name in args.tasks]
        for record in records:
            if "skipped" in record:
                continue
            print(f"\n== {record['task']} ({record['wall_seconds']:.0f} s) ==")
            print(run_table(record))
            print()
            print(summary_table(record), flush=True)
        payload = {
            "benchmark": "time_to_accuracy",
            "created": common.timestamp(),
            "config": {**options, "tasks": args.tasks, "jobs": jobs},
            "environment": environment,
            "tasks": records,
            "wall_seconds": time.perf_counter() - started,
        }
        payload["environment"]["load_average_end"] = (
            list(os.getloadavg()) if hasattr(os, "getloadavg") else None
        )
        path = common.write_json(args.out, payload)
        print(f"\nwrote {path} ({payload['wall_seconds']:.0f} s)")
        return 0
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    sys.exit(main())
