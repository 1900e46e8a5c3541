"""An 8-member ensemble, vmapped vs sequential (issue 28.1): one training step of 8 MLPs on
digits, run as one `torch.func.vmap` call or as 8 calls.

    python -m bench ensemble [--members 8] [--reps 7] [--calls 10]

Each member is bench overhead's digits MLP shape (64-32-10, tanh), its own initialisation and its
own minibatch of 32; the optimizer is functrain's AdamW. One torch thread, medians of per-step
CPU time, interleaved:

    vmapped_step         torch.func.vmap(step, in_dims=(0, 0)) over the members' states stacked
                         by functrain.stack_states, `step` from functrain.make_step (it runs its
                         torch.func form under vmap: func grads, the optimizer per tensor)
    vmapped              torch.func.vmap over the members of a hand-written functional step:
                         torch.func.grad of the loss over functional_call, optim.update,
                         optim.apply_updates (the optimizer's foreach ops run per tensor there)
    sequential_func      that functional step, once per member
    sequential_step      functrain.make_step (donating, the fused AdamW), once per member

The ratio is to `sequential_step`; the note gives vmapped_step's ratio to it ("8-member
ensemble, vmapped vs sequential") and the hand-written vmapped one's.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

import torch

from . import common


def _data(members: int, batch: int):
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32)
    x = (x - x.mean(0)) / (x.std(0) + 1e-6)
    y = torch.tensor(digits.target)
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(0, len(x), (members, batch), generator=gen)
    return x[idx], y[idx]  # (members, batch, 64), (members, batch)


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 10))


def _variants(members: int, batch: int):
    import functrain
    from functrain import optim
    from functrain.tree import tree_map

    xs, ys = _data(members, batch)
    models = [_model(i) for i in range(members)]
    base = models[0]
    opt = optim.adamw(1e-3)

    def loss(params, x, y):
        return torch.nn.functional.cross_entropy(torch.func.functional_call(base, params, (x,)), y)

    def functional_step(params, state, x, y):
        grads = torch.func.grad(loss)(params, x, y)
        updates, state = opt.update(grads, state, params)
        return optim.apply_updates(params, updates), state

    members_params = [
        {k: v.detach().clone() for k, v in m.named_parameters()} for m in models
    ]  # fmt: skip
    dims = tree_map(
        lambda v: 0 if isinstance(v, torch.Tensor) else None, opt.init(members_params[0])
    )
    held = {"params": tree_map(lambda *v: torch.stack(v), *members_params)}
    held["state"] = torch.func.vmap(opt.init, out_dims=dims)(held["params"])
    batched = torch.func.vmap(functional_step, in_dims=(0, dims, 0, 0), out_dims=(0, dims))

    def vmapped():
        held["params"], held["state"] = batched(held["params"], held["state"], xs, ys)

    seq = {"params": members_params, "states": [opt.init(p) for p in members_params]}

    def sequential_func():
        for i in range(members):
            seq["params"][i], seq["states"][i] = functional_step(
                seq["params"][i], seq["states"][i], xs[i], ys[i]
            )

    def ce(model, b):
        return torch.nn.functional.cross_entropy(model(b[0]), b[1])

    steps = [functrain.make_step(m, ce, opt, donate=True) for m in models]
    trains = {"states": [functrain.init(m, opt, seed=0) for m in models]}
    stacked = {"state": functrain.stack_states(trains["states"])}
    vstep = torch.func.vmap(functrain.make_step(base, ce, opt), in_dims=(0, 0))

    def vmapped_step():
        stacked["state"], _ = vstep(stacked["state"], (xs, ys))

    def sequential_step():
        for i in range(members):
            trains["states"][i], _ = steps[i](trains["states"][i], (xs[i], ys[i]))

    return {
        "vmapped_step": vmapped_step,
        "vmapped": vmapped,
        "sequential_func": sequential_func,
        "sequential_step": sequential_step,
    }


def main(argv: Sequence[str] | None = None) -> dict:
    """`python -m bench ensemble`: time the ensemble step both ways; print a table, write JSON."""
    parser = argparse.ArgumentParser(
        prog="python -m bench ensemble", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--calls", type=int, default=10, help="steps per block")
    parser.add_argument("--out", default=f"{common.RESULTS_DIR}/ensemble.json")
    args = parser.parse_args(argv)
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        variants = _variants(args.members, args.batch)
        for fn in variants.values():  # warm up (first calls allocate, plan, build buffers)
            fn()
            fn()
        times: dict[str, list[float]] = {name: [] for name in variants}
        names = list(variants)
        for rep in range(args.reps):
            shift = rep % len(names)
            for name in names[shift:] + names[:shift]:
                started = time.process_time()
                for _ in range(args.calls):
                    variants[name]()
                times[name].append((time.process_time() - started) / args.calls)
    finally:
        torch.set_num_threads(saved)
    floor = statistics.median(times["sequential_step"])
    report = common.new_report("ensemble", argv, members=args.members, variants={})
    rows = []
    for name, ts in times.items():
        median = statistics.median(ts)
        report["variants"][name] = {"median_ms": 1e3 * median, "ratio": median / floor}
        rows.append([name, 1e3 * median, median / floor])
    ratio = report["variants"]["vmapped_step"]["ratio"]
    hand = report["variants"]["vmapped"]["ratio"]
    report["note"] = (
        f"{args.members}-member ensemble, vmapped vs sequential: one vmapped make_step step "
        f"takes {ratio:.2f}x the time of {args.members} sequential functrain steps (a "
        f"hand-written vmapped functional step: {hand:.2f}x); medians of {args.reps} repeats"
    )
    print(common.markdown_table(["ensemble step", "ms", "vs sequential_step"], rows))
    print(report["note"])
    common.write_json(args.out, report)
    return report
