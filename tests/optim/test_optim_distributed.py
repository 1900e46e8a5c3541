"""Optimizers on DTensor leaves (2 ranks, gloo): same numbers as on plain tensors.

One spawned pair of processes checks, on a mesh of 2 CPU ranks, with parameters sharded by rows
(FSDP-like `Shard(0)`), by columns (`Shard(1)`, a TP layout whose unit norms cross shards) and
replicated: `global_norm` is the true global norm, and `adamw`+clipping, `sgd` (Nesterov) and
`lion` give the same parameters as the unsharded run, on both the pure and the donating path.
"""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from functrain.optim import (
    adamw,
    adaptive_grad_clip,
    apply_updates,
    chain,
    clip_by_global_norm,
    global_norm,
    lion,
    sgd,
)

WORLD = 2


def _trees(seed):
    gen = torch.Generator().manual_seed(seed)
    shapes = {"rows": (6, 3), "cols": (4, 6), "bias": (5,)}
    return {k: torch.randn(s, generator=gen) for k, s in shapes.items()}


def _optimizers():
    return {
        "adamw_clipped": chain(
            clip_by_global_norm(0.5), adaptive_grad_clip(0.05), adamw(1e-2, weight_decay=0.1)
        ),
        "sgd_nesterov": sgd(0.1, momentum=0.9, nesterov=True, weight_decay=1e-2),
        "lion": lion(1e-3, weight_decay=0.1),
    }


def _worker(rank, store_file):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from functrain.parallel import init_distributed

    torch.set_num_threads(1)
    # A file store needs no port, so parallel test runs on one machine cannot collide. functrain's
    # init also tears the groups down at exit (a spawned rank that exits with live gloo threads
    # can abort in interpreter shutdown).
    init_distributed("gloo", init_method=f"file://{store_file}", rank=rank, world_size=WORLD)
    mesh = init_device_mesh("cpu", (WORLD,))
    placements = {"rows": [Shard(0)], "cols": [Shard(1)], "bias": [Replicate()]}

    def shard(tree):
        return {k: distribute_tensor(v.clone(), mesh, placements[k]) for k, v in tree.items()}

    def full(tree):
        return {k: v.full_tensor() for k, v in tree.items()}

    grads = _trees(1)
    flat = torch.cat([g.flatten() for g in grads.values()])
    assert torch.allclose(global_norm(shard(grads)), torch.linalg.vector_norm(flat))
    # a tree of one sharded leaf (the device and dtype come from that first leaf alone)
    rows = shard({"rows": grads["rows"]})
    assert torch.allclose(global_norm(rows), torch.linalg.vector_norm(grads["rows"]))
    # a tree mixing a plain leaf (first, "a") and a sharded one (last): one norm over both
    mixed = {"a": grads["bias"], "rows": rows["rows"]}
    want = torch.linalg.vector_norm(torch.cat([grads["bias"], grads["rows"].flatten()]))
    assert torch.allclose(global_norm(mixed), want)

    for name in _optimizers():
        for donate in (False, True):
            plain_opt, sharded_opt = _optimizers()[name], _optimizers()[name]
            plain, sharded = _trees(0), shard(_trees(0))
            s_plain, s_sharded = plain_opt.init(plain), sharded_opt.init(sharded)
            for step in range(3):
                g = _trees(10 + step)
                g_sharded = shard(g)  # before the plain update, which may donate g
                u, s_plain = plain_opt.update(g, s_plain, plain, donate=donate)
                plain = apply_updates(plain, u, donate=donate)
                u, s_sharded = sharded_opt.update(g_sharded, s_sharded, sharded, donate=donate)
                sharded = apply_updates(sharded, u, donate=donate)
            got = full(sharded)
            for k in plain:
                diff = (got[k] - plain[k]).abs().max().item()
                assert diff <= 1e-6, f"{name} donate={donate} {k}: {diff}"


@pytest.mark.slow
def test_dtensor_leaves_match_plain_tensors(tmp_path):
    if not dist.is_available():
        pytest.skip("torch.distributed is not available in this build")
    mp.spawn(_worker, args=(str(tmp_path / "store"),), nprocs=WORLD, join=True)
