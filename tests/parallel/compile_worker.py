"""`compile_step` over the forward run's installers, on 2 real ranks (gloo).

Launched as `python -m functrain.launch -n 2 tests/parallel/compile_worker.py --out r.json`;
rank 0 writes the results as JSON for tests/parallel/test_parallel_compile.py. Each case trains
the GPT of forward_run_worker.py (dropout on) for 4 steps with the eager step and with
`compile_step(step, backend=<counting aot_eager>)` on the same ranks, and records how far apart
the parameters end, how many graphs were compiled, how often they ran and the graph breaks:

- tensor parallelism (tp=2) alone, with a gathered column-parallel layer, under activation
  checkpointing, and under checkpointing with offload of the other blocks;
- FSDP's gather at use (`reshard_after_forward=True`) under offload, checkpointing, and both;
- q, k and v layers reading one input (the eager step shares their `copy_to_tp`; the
  compiled one gives each its own), and a gathered column-parallel layer against the same
  model without tensor parallelism.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F
from forward_run_worker import BATCH, TP_STYLES, batches, model
from parallel_launching import finish_worker

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from test_compile import CountingBackend  # noqa: E402

import functrain  # noqa: E402
from functrain import parallel as fdist  # noqa: E402
from functrain.algorithms import activation_checkpointing, activation_offload  # noqa: E402
from functrain.models.gpt import gpt_loss  # noqa: E402
from functrain.parallel import plans as fplans  # noqa: E402

STEPS = 4


class QKV(torch.nn.Module):
    """Three column-parallel layers reading one input, and a row-parallel one after them."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(8, 16) for _ in range(3))
        self.o = torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.o(torch.sigmoid(self.q(x)) * self.k(x) + self.v(x))


def qkv_model() -> QKV:
    torch.manual_seed(0)
    return QKV()


def qkv_loss(net, batch):
    return F.mse_loss(net(batch[0]), batch[1])


def qkv_batches():
    g = torch.Generator().manual_seed(2)
    return [(torch.randn(BATCH, 8, generator=g), torch.randn(BATCH, 8, generator=g))] * 2


def train(make, loss, data, mesh, plan, algorithms=(), backend=None) -> dict:
    net = make()
    opt = functrain.optim.adamw(1e-2)
    state = functrain.init(net, opt, seed=0, mesh=mesh, plan=plan)
    step = functrain.compose(functrain.make_step(net, loss, opt), *algorithms)
    if backend is not None:
        step = functrain.compile_step(step, backend=backend)
    rank, world = fdist.data_parallel_info(state.layout)
    per = BATCH // world
    for _ in range(STEPS // len(data)):
        for x, y in data:
            state, _ = step(
                state, (x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per])
            )
    return fdist.full_params(state.params)


def compare(mesh, plan, algorithms=(), make=model, loss=gpt_loss, data=None) -> dict:
    data = batches() if data is None else data
    eager = train(make, loss, data, mesh, plan, algorithms)
    torch._dynamo.utils.counters.clear()
    backend = CountingBackend("aot_eager")
    compiled = train(make, loss, data, mesh, plan, algorithms, backend)
    return {
        "max_error": max(float((compiled[k] - eager[k]).abs().max()) for k in eager),
        "identical": all(torch.equal(compiled[k], eager[k]) for k in eager),
        "graphs": backend.graphs,
        "calls": backend.calls,
        "graph_breaks": sum(torch._dynamo.utils.counters["graph_break"].values()),
        "steps": STEPS,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    rank, _ = fdist.init_distributed(timeout_s=300)
    results = {}
    tp_mesh = fdist.init_mesh(tp=2)
    tp = fplans.tp(TP_STYLES)
    results["tp"] = compare(tp_mesh, tp)
    results["tp_colwise_gather"] = compare(
        tp_mesh, fplans.tp({"blocks.*.mlp.fc": "colwise_gather"})
    )
    results["tp_under_checkpointing"] = compare(tp_mesh, tp, [activation_checkpointing("Block")])
    results["tp_under_checkpointing_and_offload"] = compare(
        tp_mesh, tp, [activation_checkpointing("Block", every=2), activation_offload("Block")]
    )
    qkv = dict(make=qkv_model, loss=qkv_loss, data=qkv_batches())
    results["tp_shared_input"] = compare(tp_mesh, fplans.tp("auto"), **qkv)
    # a gathered column-parallel layer trains as the model without tensor parallelism does
    gathered = fplans.tp({"q": "colwise_gather"})
    one = train(**qkv, mesh=None, plan=None)  # the default layout of the 2 ranks
    two = train(**qkv, mesh=tp_mesh, plan=gathered)
    results["colwise_gather_vs_without_tp"] = {
        "max_error": max(float((two[k] - one[k]).abs().max()) for k in one)
    }
    fsdp_mesh = fdist.init_mesh(dp_shard=-1)
    at_use = fplans.fsdp(reshard_after_forward=True)
    results["gather_at_use"] = compare(fsdp_mesh, at_use)
    results["gather_under_offload"] = compare(fsdp_mesh, at_use, [activation_offload("Block")])
    results["gather_under_checkpointing"] = compare(
        fsdp_mesh, at_use, [activation_checkpointing("Block")]
    )
    results["gather_under_checkpointing_and_offload"] = compare(
        fsdp_mesh,
        at_use,
        [activation_offload("Block"), activation_checkpointing("Block", every=2)],
    )
    return finish_worker(rank, args.out, results)


if __name__ == "__main__":
    sys.exit(main())
