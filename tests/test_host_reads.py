"""A multi-rank `fit` reads no collective's result on the host between log, evaluation and
checkpoint boundaries (issue 27): on 2 gloo ranks, 64 steps with a log interval longer than the
run and no checkpoint make at most 4 such reads in the whole run, under the DDP and FSDP plans,
and with `skip_nonfinite=True` or `precision="amp_fp16"`. Counted by `tests/host_reads.py`.
"""

import json
import os
import pathlib
import subprocess
import sys
import types

import pytest
import torch
import torch.nn.functional as F

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
STEPS = 64
MOST = 4
PLANS = ("ddp", "fsdp")
VARIANTS = ("plain", "skip_nonfinite", "amp_fp16")


def _loss(model, batch):
    x, y = batch
    return F.mse_loss(model(x), y)


def _run(plan: str, variant: str) -> tuple[int, list[str], int]:
    """One `fit` of STEPS steps under HostReads; (reads, their sites, the step reached)."""
    from host_reads import HostReads

    import functrain
    from functrain.data import Loader
    from functrain.loop import agreement as agreement_lib

    mesh = functrain.parallel.init_mesh()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(8 * STEPS, 4, generator=generator)
    data = torch.utils.data.TensorDataset(x, x @ torch.ones(4, 1))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = functrain.optim.adamw(lr=1e-2)
    state = functrain.init(model, opt, seed=0, mesh=mesh, plan=plan)
    step = functrain.make_step(
        model,
        _loss,
        opt,
        skip_nonfinite=variant == "skip_nonfinite",
        precision="amp_fp16" if variant == "amp_fp16" else "fp32",
    )
    # The ranks' clock stands still, as if every step took no time (the regime where a sync per
    # step costs most): the agreements' cadence then depends on batch numbers only, and the count
    # on nothing this machine's load can change. (A slower step agrees at most every ~2 s.)
    clock = agreement_lib.wallclock
    agreement_lib.wallclock = types.SimpleNamespace(monotonic=lambda: 0.0)
    try:
        with HostReads() as reads:
            result = functrain.fit(
                step,
                state,
                Loader(data, 4, seed=0),
                duration=f"{STEPS}ba",
                log_interval=f"{10 * STEPS}ba",
                progress=False,
            )
    finally:
        agreement_lib.wallclock = clock
    return reads.count, reads.sites, int(result.step)


def _worker(rank: int, store: str, out: str, cases: list) -> None:
    from functrain.parallel.mesh import init_distributed

    torch.set_num_threads(1)
    init_distributed(init_method=f"file://{store}", rank=rank, world_size=2, timeout_s=120)
    found = {}
    for plan, variant in cases:
        count, sites, step = _run(plan, variant)
        found[f"{plan}/{variant}"] = {"count": count, "sites": sites, "step": step}
    pathlib.Path(out).write_text(json.dumps(found))


def run_two_ranks(tmp_path, cases) -> list[dict]:
    """Run `cases` ((plan, variant) pairs) on 2 gloo ranks; each rank's counts."""
    store = tmp_path / "store"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import test_host_reads as t; "
                f"t._worker({rank}, {str(store)!r}, {str(tmp_path / str(rank))!r}, {cases!r})",
            ],
            env=ENV,
            cwd=str(ROOT),
        )
        for rank in range(2)
    ]
    for proc in procs:
        assert proc.wait(timeout=600) == 0
    return [json.loads((tmp_path / str(rank)).read_text()) for rank in range(2)]


COUNTER_CHECK = """
import torch
import torch.distributed as dist
from host_reads import HostReads

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
plain = torch.arange(3)
with HostReads() as reads:
    reduced = torch.ones(2)
    dist.all_reduce(reduced)
    derived = reduced * 2 + 1
    plain.tolist(), float(plain[0]), int(plain.sum())  # no collective touched these
    reduced.tolist(), float(derived[0]), bool(derived.sum() > 0)  # 3 reads
    copied = torch.empty(2)
    copied.copy_(reduced)  # written from a collective's result: marked too
    copied[1].item()  # 1 read
dist.destroy_process_group()
print(reads.count, *reads.sites[:1])
"""


def test_the_counter_counts_reads_of_a_collectives_result_and_what_derives_from_it():
    proc = subprocess.run(
        [sys.executable, "-c", COUNTER_CHECK], env=ENV, cwd=str(ROOT), capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    count, site = proc.stdout.split()[:2]
    assert count == "4" and site.startswith("<string>:"), proc.stdout


@pytest.fixture(scope="module")
def counts(tmp_path_factory):
    """Every (plan, variant) run once on 2 ranks (one pair of processes per plan), cached."""
    found: dict[str, list[dict]] = {}

    def get(plan: str) -> list[dict]:
        if plan not in found:
            cases = [(plan, variant) for variant in VARIANTS]
            found[plan] = run_two_ranks(tmp_path_factory.mktemp(plan), cases)
        return found[plan]

    return get


def _check(ranks: list[dict], case: str) -> None:
    for rank, found in enumerate(ranks):
        got = found[case]
        assert got["step"] == STEPS, (rank, case)
        assert got["count"] <= MOST, (rank, case, got["count"], got["sites"][:8])
        # each read the run makes is the agreement's (stop, clock), nothing on the step's path
        assert all("loop/agreement.py" in site for site in got["sites"]), (rank, case, got)
        assert got["count"] >= 1, (rank, case)  # the agreement runs: the counter sees it


@pytest.mark.slow
@pytest.mark.parametrize("plan", PLANS)
def test_a_two_rank_fit_reads_a_collective_at_most_four_times(counts, plan):
    _check(counts(plan), f"{plan}/plain")


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS[1:])
@pytest.mark.parametrize("plan", PLANS)
def test_a_guarded_two_rank_fit_reads_a_collective_at_most_four_times(counts, plan, variant):
    _check(counts(plan), f"{plan}/{variant}")
