"""The short runs `python -m bench exits` starts many times: the public API, no shutdown call.

    python -m functrain.launch -n 2 bench/exit_worker.py --workload fsdp_ckpt --dir D

Workloads (each ends by simply returning, as a user's script does):
    fit        init_mesh + fsdp + `fit` for 4 steps (plain SGD), no checkpoint
    fsdp_ckpt  the same with an asynchronous `checkpoint.Manager` saving every 2 steps, never
               closed by the script
    dtensor    init_mesh + one DTensor `full_tensor()` (the smallest path that pinned groups)
"""

from __future__ import annotations

import argparse
import os

WORKLOADS = ("fit", "fsdp_ckpt", "dtensor")


EXIT_CHECK = "exit-check: gloo worker threads alive after teardown:"


def arrange_exit_check(teardown: bool = True) -> None:
    """At exit, after functrain's teardown (or without it), print how many gloo worker threads
    are still alive: a live worker at interpreter finalization is what aborts, so this counts a
    run at risk even when the race did not strike this time."""
    import atexit

    from functrain.parallel import teardown as functrain_teardown

    def check() -> None:
        alive = functrain_teardown.gloo_worker_threads()
        print(f"{EXIT_CHECK} {'unknown' if alive is None else len(alive)}", flush=True)

    # Called before the script makes its process group, so before functrain registers its
    # exit hook (it does once, when it creates the default group).
    atexit.register(check)  # atexit runs last-registered first: the check runs after teardown
    if teardown:
        functrain_teardown.register_exit_hook()
    else:  # the control: functrain's hook never registered (what a run without it does)
        functrain_teardown.register_exit_hook = lambda: None


def run(workload: str, directory: str) -> None:
    """One rank's part of `workload` (reads the launcher's environment); returns normally."""
    import torch
    import torch.nn.functional as F

    import functrain
    from functrain import parallel as fdist
    from functrain.checkpoint import Manager

    torch.set_num_threads(1)
    mesh = fdist.init_mesh(dp_shard=-1)
    if workload == "dtensor":
        from torch.distributed.tensor import Shard, distribute_tensor

        full = distribute_tensor(torch.arange(12.0), mesh["dp_shard"], [Shard(0)]).full_tensor()
        assert full.tolist() == list(range(12)), full
        return
    if workload not in WORKLOADS:
        raise SystemExit(f"unknown workload {workload!r}; choose from {WORKLOADS}")
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(8, 8, generator=gen), torch.randint(0, 3, (8,), generator=gen))] * 4
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 13), torch.nn.Tanh(), torch.nn.Linear(13, 3))
    optimizer = functrain.optim.sgd(0.1)
    state = functrain.init(model, optimizer, seed=0, mesh=mesh, plan="fsdp")
    step = functrain.make_step(model, lambda m, b: F.cross_entropy(m(b[0]), b[1]), optimizer)
    manager = None
    if workload == "fsdp_ckpt":
        manager = Manager(os.path.join(directory, "ckpt"), every="2ba", keep_last=2)
    state = functrain.fit(
        step, state, batches, duration="4ba", checkpoints=manager, log_interval=None
    )
    assert state.step == 4, state.step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", choices=WORKLOADS, default="fit")
    parser.add_argument("--dir", required=True, help="a scratch directory of this run")
    parser.add_argument("--exit-check", action="store_true", help="count gloo threads at exit")
    args = parser.parse_args()
    if args.exit_check:
        arrange_exit_check()
    run(args.workload, args.dir)


if __name__ == "__main__":
    main()
