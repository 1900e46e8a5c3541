"""`python -m functrain.launch`: the torchrun command line it builds, and real launches."""

import os
import textwrap

import pytest
from parallel_launching import launch, launched_world, run_python

from functrain.launch import cli as launcher


def argv_for(*args):
    return launcher.torchrun_argv(launcher.build_parser().parse_args(list(args)))


def test_single_node_uses_a_free_port():
    argv = argv_for("-n", "4", "train.py", "--lr", "3e-4")
    assert "--nproc-per-node=4" in argv and "--standalone" in argv
    assert argv[-5:] == ["functrain.launch", "--worker", "train.py", "--lr", "3e-4"]
    assert "--tee=3" in argv  # per-rank prefixed output


def test_multi_node_flags_pass_through():
    argv = argv_for(
        "-n",
        "8",
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--master-addr",
        "10.0.0.1",
        "--master-port",
        "29500",
        "--max-restarts",
        "3",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "10.0.0.1:29400",
        "--rdzv-id",
        "job7",
        "--rdzv-conf",
        "timeout=60",
        "--no-prefix",
        "train.py",
    )
    for flag in (
        "--nnodes=2",
        "--node-rank=1",
        "--master-addr=10.0.0.1",
        "--master-port=29500",
        "--max-restarts=3",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=10.0.0.1:29400",
        "--rdzv-id=job7",
        "--rdzv-conf=timeout=60",
    ):
        assert flag in argv
    assert "--standalone" not in argv and "--tee=3" not in argv


def test_module_mode_and_script_arguments():
    argv = argv_for("-n", "2", "-m", "pytest", "tests/parallel", "-q", "-x")
    assert argv[-6:] == ["--worker", "-m", "pytest", "tests/parallel", "-q", "-x"]


def test_missing_script_is_a_clear_error(capsys):
    assert launcher.main(["-n", "2", "no_such_script.py"]) == 2
    assert "no such script 'no_such_script.py'" in capsys.readouterr().err


PROBE = textwrap.dedent(
    """
    import sys
    import functrain.parallel as fdist

    fdist.init_mesh(dp_shard=-1)
    rank, world = fdist.init_distributed()  # the existing world's (rank, size)
    print(f"probe rank={rank} world={world} argv={sys.argv[1:]}", flush=True)
    """
)


@pytest.mark.slow
def test_unchanged_script_runs_alone_and_as_a_module_under_the_launcher(tmp_path):
    if launched_world() not in (None, 1) and os.environ["RANK"] != "0":
        pytest.skip("rank 0 runs the nested launch")
    (tmp_path / "ft_launch_probe.py").write_text(PROBE)
    alone = run_python([str(tmp_path / "ft_launch_probe.py"), "x"])
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert "probe rank=0 world=1 argv=['x']" in alone.stdout
    proc = launch(2, ["-m", "ft_launch_probe", "--flag", "1"], extra_path=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        assert f"[rank{rank}]: probe rank={rank} world=2 argv=['--flag', '1']" in proc.stdout


CRASH = textwrap.dedent(
    """
    import torch
    import torch.distributed as dist
    import functrain.parallel as fdist

    fdist.init_mesh()
    rank, _ = fdist.init_distributed()
    dist.all_reduce(torch.ones(1))          # both ranks got this far
    if rank == 1:
        raise ValueError("boom on purpose")
    dist.all_reduce(torch.ones(1))          # rank 0 waits here for a rank that is gone
    print("rank 0 should never get here", flush=True)
    """
)


@pytest.mark.slow
def test_a_crashing_rank_stops_all_ranks_and_is_named(tmp_path):
    if launched_world() not in (None, 1) and os.environ["RANK"] != "0":
        pytest.skip("rank 0 runs the nested launch")
    script = tmp_path / "crash.py"
    script.write_text(CRASH)
    proc = launch(2, [str(script)], timeout=180)
    assert proc.returncode != 0
    assert "functrain.launch: rank 1 failed (ValueError: boom on purpose)" in proc.stderr
    assert "all ranks were stopped" in proc.stderr
    assert "should never get here" not in proc.stdout
