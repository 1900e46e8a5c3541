"""The forward run's installers in pairs that interact, on 2 real ranks (gloo).

Launched as `python -m functrain.launch -n 2 tests/parallel/forward_run_worker.py --out r.json`;
rank 0 writes the results as JSON for tests/test_forward_run.py. Each pair trains the same GPT
twice on the same ranks, with and without the algorithm installed over the layout's installer:

- tensor parallelism (tp=2) under activation checkpointing (the recomputation runs the parallel
  forwards again), and under checkpointing with offload of the other blocks;
- FSDP's gather at use (`reshard_after_forward=True`, 2 shards) under activation offload, of the
  whole forward and of chosen blocks (views of gathered parameters stay handles that are gathered
  again, not host copies), and under both offload and checkpointing.
"""

from __future__ import annotations

import argparse
import sys

import torch
from parallel_launching import finish_worker

import functrain
from functrain import parallel as fdist
from functrain.algorithms import activation_checkpointing, activation_offload
from functrain.models.gpt import GPT, GPTConfig, gpt_loss
from functrain.parallel import plans as fplans
from functrain.parallel import reshard

STEPS = 2
BATCH = 4
TP_STYLES = {"blocks.*.mlp.fc": "colwise", "blocks.*.mlp.proj": "rowwise"}


def model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=29, block_size=8, n_layer=2, n_head=2, n_embd=16,
                         dropout=0.1))  # fmt: skip


def batches():
    g = torch.Generator().manual_seed(1)
    return [
        (
            torch.randint(0, 29, (BATCH, 8), generator=g),
            torch.randint(0, 29, (BATCH, 8), generator=g),
        )
        for _ in range(STEPS)
    ]


def train(mesh, plan, algorithms=()) -> tuple[dict, int]:
    """The full parameters after `STEPS` steps, and how many buckets were gathered at use."""
    original, gathers = reshard._gather, []

    def counting(*args):
        gathers.append(1)
        return original(*args)

    reshard._gather = counting
    try:
        net = model()
        opt = functrain.optim.adamw(1e-2)
        state = functrain.init(net, opt, seed=0, mesh=mesh, plan=plan)
        step = functrain.compose(functrain.make_step(net, gpt_loss, opt), *algorithms)
        rank, world = fdist.data_parallel_info(state.layout)
        per = BATCH // world
        for x, y in batches():
            state, _ = step(
                state, (x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per])
            )
    finally:
        reshard._gather = original
    return fdist.full_params(state.params), len(gathers)


def compare(mesh, plan, algorithms) -> dict:
    plain, plain_gathers = train(mesh, plan)
    installed, gathers = train(mesh, plan, algorithms)
    return {
        "max_error": max(float((installed[k] - plain[k]).abs().max()) for k in plain),
        "identical": all(torch.equal(installed[k], plain[k]) for k in plain),
        "gathers_at_use": [plain_gathers, gathers],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    rank, _ = fdist.init_distributed(timeout_s=120)
    results = {}
    tp_mesh = fdist.init_mesh(tp=2)
    results["tp_under_checkpointing"] = compare(
        tp_mesh, fplans.tp(TP_STYLES), [activation_checkpointing("Block")]
    )
    results["tp_under_checkpointing_and_offload"] = compare(
        tp_mesh,
        fplans.tp(TP_STYLES),
        [activation_checkpointing("Block", every=2), activation_offload("Block")],
    )
    fsdp_mesh = fdist.init_mesh(dp_shard=-1)
    reshard_plan = fplans.fsdp(reshard_after_forward=True)
    results["gather_under_offload"] = compare(fsdp_mesh, reshard_plan, [activation_offload()])
    results["gather_under_offload_of_blocks"] = compare(
        fsdp_mesh, reshard_plan, [activation_offload("Block")]
    )
    # composed in the other order than the run installs them: offload is still outside
    results["gather_under_checkpointing_and_offload"] = compare(
        fsdp_mesh,
        reshard_plan,
        [activation_offload("Block"), activation_checkpointing("Block", every=2)],
    )
    return finish_worker(rank, args.out, results)


if __name__ == "__main__":
    sys.exit(main())
