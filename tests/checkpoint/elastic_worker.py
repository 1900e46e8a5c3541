"""A small run for the elastic-resume test: fit + Loader + Manager under a plan, losses to JSON.

    python tests/checkpoint/elastic_worker.py --plan none --steps 16 --run-dir D --out L.json
    python -m functrain.launch -n 4 tests/checkpoint/elastic_worker.py --plan fsdp ...

The same script runs alone or under the launcher; with `--run-dir` it auto-resumes, so a run
started on 4 ranks can be continued on 2 or 3.
"""

import argparse
import json

import torch
import torch.nn.functional as F

import functrain
from functrain import dist as fdist
from functrain.checkpoint import Manager
from functrain.data import Loader


class LossRecorder:
    """Keeps each step's loss (already averaged over the data-parallel ranks by the step)."""

    def __init__(self):
        self.losses = {}

    def batch_end(self, ctx):
        self.losses[ctx.state.step] = float(ctx.metrics["loss"])


def loss_fn(model, batch):
    inputs, targets = batch
    return F.cross_entropy(model(inputs), targets)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plan", default="none")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(240, 16, generator=generator)
    targets = torch.randint(0, 5, (240,), generator=generator)
    dataset = torch.utils.data.TensorDataset(inputs, targets)
    loader = Loader(dataset, batch_size=24, shuffle=True, seed=0)  # 24: divisible by 2, 3, 4
    torch.manual_seed(0)
    # 13 hidden units: shards are uneven on 2, 3 and 4 ranks.
    model = torch.nn.Sequential(torch.nn.Linear(16, 13), torch.nn.Tanh(), torch.nn.Linear(13, 5))
    optimizer = functrain.optim.adamw(lr=1e-2)
    plan = None if args.plan == "none" else args.plan
    mesh = fdist.init_mesh() if plan else None
    state = functrain.init(model, optimizer, seed=0, mesh=mesh, plan=plan)
    step = functrain.make_step(model, loss_fn, optimizer)
    recorder = LossRecorder()
    manager = Manager(args.run_dir, every="4ba", keep_last=None, async_save=False)
    functrain.fit(
        step,
        state,
        loader,
        duration=f"{args.steps}ba",
        callbacks=[recorder],
        checkpoints=manager,
        autoresume=True,
        log_interval="1ba",
    )
    if fdist.data_parallel_info()[0] == 0:
        with open(args.out, "w") as f:
            json.dump(recorder.losses, f)
    if plan:
        fdist.shutdown()


if __name__ == "__main__":
    main()
