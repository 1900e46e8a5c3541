"""A script launched on N ranks that calls `init` without a mesh trains data-parallel over all
of them (as Composer and Lightning do), not N independent copies writing one checkpoint folder."""

import json
import os
import textwrap

import pytest
from parallel_launching import launch, launched_world, run_python

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    import torch.nn.functional as F
    import functrain
    from functrain.checkpoint import Manager
    from functrain.data import Loader

    root, out = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 9), torch.nn.Tanh(), torch.nn.Linear(9, 3))
    opt = functrain.optim.sgd(0.5)           # plain SGD: an unaveraged gradient would show
    state = functrain.init(model, opt, seed=0)   # no mesh, no plan
    gen = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 6, generator=gen),
                                          torch.randint(0, 3, (64,), generator=gen))
    loader = Loader(data, batch_size=16, shuffle=True, seed=0)
    step = functrain.make_step(model, lambda m, b: F.cross_entropy(m(b[0]), b[1]), opt)
    sizes = []

    class BatchSizes:
        def batch_end(self, ctx):
            sizes.append(int(ctx.batch[0].shape[0]))

    manager = Manager(root, every="2ba", keep_last=None, async_save=False)
    state = functrain.fit(step, state, loader, duration="6ba", callbacks=[BatchSizes()],
                          checkpoints=manager)
    manager.close()
    rank, world = functrain.parallel.data_parallel_info(state.layout)
    full = functrain.parallel.full_params(state.params)
    try:  # iterated by hand on a rank of a larger world, a Loader needs its placement
        next(iter(Loader(data, batch_size=16)))
        unplaced = "no error"
    except ValueError as error:
        unplaced = str(error)
    result = {"rank": rank, "world": world, "sizes": sizes, "unplaced": unplaced,
              "plan": None if state.layout is None else state.layout.plan.name,
              "params": {k: v.tolist() for k, v in full.items()}}
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(result, f)
    """
)


def _max_error(a: dict, b: dict) -> float:
    import torch

    return max(float((torch.tensor(a[k]) - torch.tensor(b[k])).abs().max()) for k in b)


def _commits(root) -> list[dict]:
    paths = sorted(root.glob("*/COMMIT.json"))
    return [json.loads(p.read_text()) for p in paths]


def test_no_mesh_under_the_launcher_means_data_parallel_over_all_ranks(tmp_path):
    if launched_world() not in (None, 1) and os.environ["RANK"] != "0":
        pytest.skip("rank 0 runs the nested launch")
    script = tmp_path / "no_mesh.py"
    script.write_text(SCRIPT)
    alone = run_python([str(script), str(tmp_path / "alone"), str(tmp_path / "alone")])
    assert alone.returncode == 0, alone.stderr[-4000:]
    assert "training data-parallel" not in alone.stderr  # one process: nothing to say
    proc = launch(2, [str(script), str(tmp_path / "ckpt"), str(tmp_path / "two")])
    assert proc.returncode == 0, proc.stderr[-4000:]

    one = json.loads((tmp_path / "alone.rank0.json").read_text())
    assert (one["world"], one["plan"], one["sizes"]) == (1, None, [16] * 6)
    assert one["unplaced"] == "no error"  # one process: the whole batch, no placement needed
    for rank in (0, 1):
        got = json.loads((tmp_path / f"two.rank{rank}.json").read_text())
        assert (got["rank"], got["world"], got["plan"]) == (rank, 2, "ddp")
        assert got["sizes"] == [8] * 6  # each rank trains on its half of every global batch
        assert "rank=r, world_size=n" in got["unplaced"], got["unplaced"]
        assert _max_error(got["params"], one["params"]) <= 1e-5  # = one process, same batches

    said = [line for line in (proc.stdout + proc.stderr).splitlines() if "no mesh given" in line]
    assert len(said) == 1 and "[rank0]" in said[0] and "plan='ddp'" in said[0], said
    # one writer: every checkpoint was committed by one 2-rank run, not by two 1-rank ones
    commits = _commits(tmp_path / "ckpt")
    assert [c["step"] for c in commits] == [2, 4, 6]
    assert all(c["world_size"] == 2 for c in commits), commits
