"""Activation checkpointing under `fsdp(reshard_after_forward=True)` on N ranks (gloo).

Launched as `python -m functrain.launch -n 2 tests/parallel/actckpt_worker.py --out r.json
--dir DIR`; rank 0 writes the results as JSON for tests/parallel/test_parallel_actckpt.py.
Every rank computes the single-process reference (no checkpointing, no mesh) on the global
batch itself, so the comparison needs no communication.
"""

from __future__ import annotations

import argparse
import sys

import torch
from parallel_launching import finish_worker

import functrain
from functrain import parallel as fdist
from functrain.algorithms import activation_checkpointing, activation_offload
from functrain.callbacks import ActivationMonitor
from functrain.checkpoint import Manager
from functrain.models.gpt import GPT, GPTConfig, gpt_loss
from functrain.parallel import plans as fplans

STEPS = 4
BATCH = 4
RESHARD = fplans.fsdp(reshard_after_forward=True)
ALGORITHMS = {
    "full": lambda: activation_checkpointing("Block"),
    "every2": lambda: activation_checkpointing("Block", every=2),
    "selective": lambda: activation_checkpointing("Block", policy="selective"),
    "offload": lambda: activation_offload(),
    "offload_blocks_every2_checkpointed": lambda: [
        activation_checkpointing("Block", every=2),
        activation_offload("Block"),
    ],
}


def model(dropout=0.0) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=29, block_size=8, n_layer=4, n_head=2, n_embd=16,
                         dropout=dropout))  # fmt: skip


def batches(steps=STEPS):
    g = torch.Generator().manual_seed(1)
    return [
        (
            torch.randint(0, 29, (BATCH, 8), generator=g),
            torch.randint(0, 29, (BATCH, 8), generator=g),
        )
        for _ in range(steps)
    ]


def run(algorithm=None, mesh=None, dropout=0.0, microbatch=None):
    net = model(dropout)
    opt = functrain.optim.adamw(1e-2)
    if mesh is None:
        state = functrain.init(net, opt, seed=0, plan="local")
    else:
        state = functrain.init(net, opt, seed=0, mesh=mesh, plan=RESHARD)
    step = functrain.make_step(net, gpt_loss, opt, microbatch_size=microbatch)
    if algorithm is not None:
        algorithms = algorithm if isinstance(algorithm, list) else [algorithm]
        step = functrain.compose(step, *algorithms)
    rank, world = fdist.data_parallel_info(state.layout)
    per = BATCH // world
    for x, y in batches():
        state, _ = step(state, (x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]))
    return fdist.full_params(state.params) if mesh is not None else dict(state.params)


def max_error(a, b) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in b)


def without_key_biases(params: dict) -> dict:
    """`params` without the attention key biases (the middle third of each `attn.qkv.bias`).

    Their gradient is zero by construction: a key bias adds q·b to every score in a query's row,
    and softmax ignores a constant added to a row. Computed, it is float32 rounding noise whose
    value follows the summation order (one process sums 4 samples; 2 ranks sum 2 each, then
    reduce), and AdamW divides it by its own running RMS, so the noise moves these entries by up
    to ~lr per step in a direction the order picks (after 4 steps: 5e-6 on torch 2.13, 1.04e-5
    on 2.6). Every other entry agrees within 1.4e-7 on both.
    """
    out = dict(params)
    for name, value in params.items():
        if name.endswith("attn.qkv.bias"):
            width = value.shape[0] // 3
            out[name] = torch.cat([value[:width], value[2 * width :]])
    return out


def compared(result, same_ranks, one_process) -> dict:
    """`result` against the same ranks without the algorithm (every entry) and against one
    process without it (the entries with a gradient: `without_key_biases`)."""
    return {
        "vs_same_ranks": max_error(result, same_ranks),
        "vs_one_process": max_error(without_key_biases(result), without_key_biases(one_process)),
    }


def gathers_per_step(mesh, algorithm) -> int:
    """All-gathers at use in one step: checkpointed blocks gather again when recomputed."""
    from functrain.parallel import reshard

    original, calls = reshard._gather, []

    def counting(*args):
        calls.append(1)
        return original(*args)

    reshard._gather = counting
    try:
        net = model()
        opt = functrain.optim.adamw(1e-2)
        state = functrain.init(net, opt, seed=0, mesh=mesh, plan=RESHARD)
        step = functrain.make_step(net, gpt_loss, opt)
        step = functrain.compose(step, algorithm) if algorithm is not None else step
        x, y = batches(1)[0]
        rank, world = fdist.data_parallel_info(state.layout)
        per = BATCH // world
        step(state, (x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]))
    finally:
        reshard._gather = original
    return len(calls)


def fit_resume(mesh, root) -> dict:
    """A fit that crashes at batch 5 (last checkpoint at 4) resumed by a fresh fit equals the
    uninterrupted 6 batches bit for bit (same 2 ranks), with dropout on."""

    def build():
        net = model(dropout=0.1)
        opt = functrain.optim.adamw(1e-2)
        state = functrain.init(net, opt, seed=0, mesh=mesh, plan=RESHARD)
        step = functrain.compose(
            functrain.make_step(net, gpt_loss, opt), activation_checkpointing("Block")
        )
        x = torch.cat([b[0] for b in batches(3)])
        y = torch.cat([b[1] for b in batches(3)])
        data = functrain.data.Loader(torch.utils.data.TensorDataset(x, y), 4, seed=2)
        return step, state, data

    step, state, data = build()
    whole = functrain.fit(step, state, data, duration="6ba", progress=False)

    class CrashAt:  # every rank fails at batch 5, after the save at batch 4
        def batch_end(self, ctx):
            if ctx.timestamp.batch == 5:
                raise RuntimeError("simulated crash")

    step, state, data = build()
    with Manager(f"{root}/ckpt", every="2ba", async_save=False) as manager:
        try:
            functrain.fit(step, state, data, duration="6ba", checkpoints=manager,
                          callbacks=[CrashAt()], progress=False)  # fmt: skip
            raise AssertionError("the simulated crash did not happen")
        except functrain.CallbackError:
            pass
    step, state, data = build()
    with Manager(f"{root}/ckpt", every="2ba", async_save=False) as manager:
        resumed = functrain.fit(step, state, data, duration="6ba", checkpoints=manager,
                                autoresume=True, return_result=True, progress=False)  # fmt: skip
    a, b = fdist.full_params(whole.params), fdist.full_params(resumed.state.params)
    return {
        "resumed_from": resumed.resumed_from,
        "identical": all(torch.equal(a[k], b[k]) for k in a),
        "max_error": max_error(a, b),
    }


class Recorder:
    def __init__(self):
        self.merged = {}

    def log_metrics(self, metrics, step):
        self.merged.update({k: v for k, v in metrics.items() if k.startswith("activations/")})


def monitored(mesh) -> dict:
    """ActivationMonitor's numbers after one batch (checkpointing on when `mesh` is given)."""
    net = model()
    opt = functrain.optim.adamw(1e-2)
    if mesh is None:
        state = functrain.init(net, opt, seed=0, plan="local")
        step = functrain.make_step(net, gpt_loss, opt)
    else:
        state = functrain.init(net, opt, seed=0, mesh=mesh, plan=RESHARD)
        step = functrain.compose(
            functrain.make_step(net, gpt_loss, opt), activation_checkpointing("Block")
        )
    x, y = batches(1)[0]
    recorder = Recorder()
    functrain.fit(step, state, functrain.data.Loader(torch.utils.data.TensorDataset(x, y), BATCH),
                  duration="1ba", callbacks=[ActivationMonitor(net, interval="1ba")],
                  loggers=[recorder], progress=False)  # fmt: skip
    return recorder.merged


def monitor_error(mesh) -> dict:
    sharded, alone = monitored(mesh), monitored(None)
    worst = max(abs(sharded[k] - alone[k]) / max(1.0, abs(alone[k])) for k in alone)
    return {"same_keys": sorted(sharded) == sorted(alone), "keys": len(alone), "error": worst}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--dir", required=True)
    args = parser.parse_args(argv)
    rank, world = fdist.init_distributed(timeout_s=120)
    mesh = fdist.init_mesh(dp_shard=-1)
    reference, same_ranks = run(), run(None, mesh)
    results = {}
    for name, make in ALGORITHMS.items():
        results[name] = compared(run(make(), mesh), same_ranks, reference)
    micro = run(ALGORITHMS["full"](), mesh, microbatch=1)
    results["microbatch"] = compared(micro, run(None, mesh, microbatch=1), reference)
    # dropout: the ranks draw other masks than one process; checkpointed vs not on these ranks
    plain = run(None, mesh, dropout=0.1)
    results["dropout_identical"] = {
        name: all(torch.equal(a, plain[k]) for k, a in run(make(), mesh, dropout=0.1).items())
        for name, make in ALGORITHMS.items()
    }
    results["gathers"] = {
        "none": gathers_per_step(mesh, None),
        "full": gathers_per_step(mesh, ALGORITHMS["full"]()),
    }
    results["monitor"] = monitor_error(mesh)
    results["resume"] = fit_resume(mesh, args.dir)
    return finish_worker(rank, args.out, results)


if __name__ == "__main__":
    sys.exit(main())
