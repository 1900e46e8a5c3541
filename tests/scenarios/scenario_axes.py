"""The scenario matrix's axes, the pairs that cannot run, and the `Scenario` record.

Axes (issue 11, "The scenario matrix"):

- algorithm: none; `recipe` (EMA + label smoothing + MixUp + CutMix); SWA; SAM; BlurPool (surgery,
  through `apply_surgery`); sequence-length warm-up and activation checkpointing of every block
  (both on a GPT; every other value trains a CNN on scikit-learn's digits, so the model is a
  function of the algorithm and no pair is lost to it); `batchnorm`, a CNN with BatchNorm (each
  rank normalises with its own batch's statistics, and the running statistics are rank 0's on
  every rank after each step: issue 30.1);
- precision: fp32, amp_bf16, amp_fp16 (each fp16 run has a batch engineered to overflow);
- layout: one process; DDP, FSDP, FSDP with `reshard_after_forward` and FSDP with `offload` (the
  shards and the optimizer state in host memory, the update there) on 2 ranks under
  `functrain.launch`; two simulated nodes of one rank each (two `functrain.launch --nnodes 2
  --node-rank i --master-addr 127.0.0.1` on loopback, an HSDP mesh of one replica per node);
- microbatch: off, on (microbatches of 4);
- schedule: the warm-up of the learning-rate schedule in `ba`, `ep` or `dur` units;
- optimizer: plain (`adamw`) or decoupled (`decoupled_sgdw`);
- interruption: none; SIGKILL of the whole job at a random step; SIGKILL right after a save was
  handed to the asynchronous writer; SIGTERM; SIGINT (Ctrl-C); a crash that torchrun's
  `--max-restarts` restarts; a clean stop resumed on a different number of ranks (2 -> 1);
- recovery (issue 29): `ckpt`, the Manager's persistent root only; `tiers`, a fast local tier
  (`LocalTier`, every 3 steps, with a replica in a second "node's" folder) beside it, so a kill
  resumes from the newer local snapshot; `rollback`, a `rollback_guard` composed last, with one
  sample weighted to spike the loss once an epoch (rolled back and skipped).

Example:
    >>> s = Scenario.from_row({**{a: v[0] for a, v in AXES.items()}, "interruption": "sigterm"})
    >>> s.id
    'none.fp32.single.mb-off.ba.plain.ckpt.sigterm'
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Mapping
from typing import Any

from scenario_covering import Forbidden

AXES: dict[str, list[str]] = {
    "algorithm": [
        "none",
        "recipe",
        "swa",
        "sam",
        "blurpool",
        "seq_warmup",
        "act_ckpt",
        "batchnorm",
    ],
    "precision": ["fp32", "amp_bf16", "amp_fp16"],
    "layout": ["single", "ddp", "fsdp", "fsdp_raf", "fsdp_offload", "two_nodes"],
    "microbatch": ["off", "on"],
    "schedule": ["ba", "ep", "dur"],
    "optimizer": ["plain", "decoupled"],
    "recovery": ["ckpt", "tiers", "rollback"],
    "interruption": [
        "none",
        "kill_step",
        "kill_save",
        "sigterm",
        "sigint",
        "restart",
        "rank_change",
    ],
}

MULTI_RANK = ("ddp", "fsdp", "fsdp_raf", "fsdp_offload", "two_nodes")

FORBIDDEN: list[Forbidden] = [
    Forbidden(
        "layout",
        "single",
        "interruption",
        "restart",
        "torchrun's --max-restarts restarts the ranks of a launch; the one-process layout is "
        "plain `python script.py`, with no launcher to restart it",
    ),
    Forbidden(
        "layout",
        "single",
        "interruption",
        "rank_change",
        "a resume on a different number of ranks goes from the 2-rank layouts to one process; "
        "the one-process layout has no other rank count in this matrix",
    ),
]

# Training configurations differ by everything but the interruption: runs that share one also
# share their uninterrupted reference.
CONFIG_AXES = (
    "algorithm", "precision", "layout", "microbatch", "schedule", "optimizer", "recovery",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One row of the matrix: a value for every axis."""

    algorithm: str
    precision: str
    layout: str
    microbatch: str
    schedule: str
    optimizer: str
    interruption: str
    recovery: str = "ckpt"  # a default (so a field after `interruption`): added for issue 29

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Scenario:
        unknown = [f"{a}={row[a]!r}" for a in AXES if row[a] not in AXES[a]]
        if unknown:
            raise ValueError(f"not axis values: {', '.join(unknown)}")
        return cls(**{a: row[a] for a in AXES})

    @property
    def row(self) -> dict[str, str]:
        return {a: getattr(self, a) for a in AXES}

    @property
    def id(self) -> str:
        return ".".join(f"mb-{v}" if a == "microbatch" else v for a, v in self.row.items())

    @property
    def config(self) -> dict[str, str]:
        """The training configuration (what the reference run shares)."""
        return {a: getattr(self, a) for a in CONFIG_AXES}

    @property
    def config_id(self) -> str:
        return ".".join(self.config.values())

    def reference(self) -> Scenario:
        """The same training configuration, uninterrupted."""
        return dataclasses.replace(self, interruption="none")

    def event_step(self, total_steps: int) -> int:
        """The step the interruption is aimed at: random, but a function of the scenario.

        Kills, signals and crashes come after step 6, so a committed checkpoint always exists
        when they land (saves at 4 and 6; the save of 6 waits for that of 4): the run then
        really resumes, which is what the matrix tests. After a `kill_save` another save must
        follow; a signal must land before the run ends.
        """
        rng = random.Random(hashlib.sha256(self.id.encode()).hexdigest())
        low = {"kill_save": 5, "rank_change": 3}.get(self.interruption, 7)
        high = {"kill_save": 4, "sigterm": 5, "sigint": 5}.get(self.interruption, 2)
        return rng.randint(low, total_steps - high)
