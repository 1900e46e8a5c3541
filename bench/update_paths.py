"""The ways to run a pure AdamW update, side by side: what purity costs and which design keeps it
cheapest (issue 15.1).

    python -m bench update [--model mlp] [--reps 7]

On the parameter shapes of one of `bench overhead`'s models, with moments and gradients of the
same shapes, one torch thread, medians of per-update CPU time, interleaved:

    inplace            torch._fused_adamw_ on the state itself: the donating step, the floor
    recycled_copy      copy params and moments into buffers nobody holds, then the fused kernel
                       on them: what functrain's pure step does (`functrain.optim.buffers`)
    fresh_copy         the same into freshly allocated tensors (no recycling)
    foreach_pure       the transforms' own out-of-place path (`update` + `apply_updates`)
    inductor_into      torch.compile of the out-of-place arithmetic, writing into recycled buffers
                       (the "one fused pass writing new outputs"; compile time reported)

The ratio is to `inplace`. Fresh memory is what costs on a CPU (first-touch page faults); an
out-of-place pass costs more than an in-place one even into warm buffers, since each output line
must first be fetched (write-allocate), which is why `inductor_into` does not beat
`recycled_copy`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

import torch

from . import common


def _shapes(model: str) -> list[tuple[int, ...]]:
    from .models import model_specs

    return [tuple(p.shape) for p in model_specs()[model].build().parameters()]


def _variants(shapes):
    from functrain import optim
    from functrain.optim.buffers import BufferPool

    gen = torch.Generator().manual_seed(0)
    p = [torch.randn(s, generator=gen) for s in shapes]
    g = [torch.randn(s, generator=gen) for s in shapes]
    m = [torch.randn(s, generator=gen).abs() for s in shapes]
    v = [torch.randn(s, generator=gen).abs() for s in shapes]
    kwargs = dict(lr=1e-3, beta1=0.9, beta2=0.999, weight_decay=1e-2, eps=1e-8, amsgrad=False,
                  maximize=False)  # fmt: skip
    steps = [torch.tensor(3.0)] * len(p)

    def inplace():
        torch._fused_adamw_(p, g, m, v, [], steps, **kwargs)

    pool, held = BufferPool(), {"state": p + m + v}

    def recycled_copy():
        mine = pool.private_copies(held["state"])
        n = len(p)
        torch._fused_adamw_(mine[:n], g, mine[n : 2 * n], mine[2 * n :], [], steps, **kwargs)
        held["state"] = mine  # the previous one is dropped, as a training loop drops it

    def fresh_copy():
        new = [t.clone() for t in p + m + v]
        n = len(p)
        torch._fused_adamw_(new[:n], g, new[n : 2 * n], new[2 * n :], [], steps, **kwargs)

    opt = optim.adamw(1e-3, weight_decay=1e-2)
    names = [f"t{i}" for i in range(len(p))]
    params, grads = dict(zip(names, p)), dict(zip(names, g))
    state = opt.init(params)

    def foreach_pure():
        updates, _ = opt.update(grads, state, params)
        optim.apply_updates(params, updates)

    def arithmetic(bp, bm, bv, p, g, m, v, step_size, bc2_sqrt, decay):
        for bp_, bm_, bv_, p_, g_, m_, v_ in zip(bp, bm, bv, p, g, m, v):
            m2 = m_ + 0.1 * (g_ - m_)
            v2 = v_ * 0.999 + 0.001 * g_ * g_
            bp_.copy_(p_ * decay - step_size * m2 / (v2.sqrt() / bc2_sqrt + 1e-8))
            bm_.copy_(m2)
            bv_.copy_(v2)

    compiled = torch.compile(arithmetic, fullgraph=True, dynamic=False)
    out = [t.clone() for t in p + m + v]
    n = len(p)
    scalars = (1e-3 / (1 - 0.9**3), (1 - 0.999**3) ** 0.5, 1 - 1e-5)
    started = time.perf_counter()
    compiled(out[:n], out[n : 2 * n], out[2 * n :], p, g, m, v, *scalars)
    compile_s = time.perf_counter() - started

    def inductor_into():
        compiled(out[:n], out[n : 2 * n], out[2 * n :], p, g, m, v, *scalars)

    variants = {
        "inplace": inplace,
        "recycled_copy": recycled_copy,
        "fresh_copy": fresh_copy,
        "foreach_pure": foreach_pure,
        "inductor_into": inductor_into,
    }
    return variants, {"inductor_into": compile_s}


def main(argv: Sequence[str] | None = None) -> dict:
    """`python -m bench update`: time the update paths; print a table, write JSON."""
    parser = argparse.ArgumentParser(
        prog="python -m bench update", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--model", default="mlp", help="whose parameter shapes (bench overhead's)")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--calls", type=int, default=10, help="updates per block")
    parser.add_argument("--out", default=f"{common.RESULTS_DIR}/update.json")
    args = parser.parse_args(argv)
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with common.fresh_compile_cache():
            variants, compile_s = _variants(_shapes(args.model))
            for fn in variants.values():
                fn()
                fn()
            times = {name: [] for name in variants}
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
    floor = statistics.median(times["inplace"])
    rows, report = [], common.new_report("update", argv, model=args.model, variants={})
    for name, ts in times.items():
        median = statistics.median(ts)
        report["variants"][name] = {"median_ms": 1e3 * median, "ratio": median / floor,
                                    "compile_s": compile_s.get(name)}  # fmt: skip
        rows.append([name, 1e3 * median, median / floor, compile_s.get(name)])
    print(common.markdown_table(["update path", "ms", "vs in place", "compile s"], rows))
    common.write_json(args.out, report)
    return report
