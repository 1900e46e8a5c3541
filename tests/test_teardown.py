"""Every run exits cleanly: functrain's exit hook tears down what the run made.

What aborts a run at exit is a gloo worker thread still alive when the interpreter finalizes
(functrain/teardown.py says why); whether the race strikes depends on timing, so these tests
check the deterministic part: after the exit hook, no gloo worker thread is left, in one process
and on 2 ranks, with a mesh, DTensors, an FSDP `fit` and an open asynchronous checkpoint
`Manager` — and no explicit shutdown call. A dead peer does not make teardown hang, and a
teardown that cannot finish is ended by its watchdog with the run's exit code.
"""

import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest
import torch

from functrain.checkpoint import Manager

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DIST_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _env(**extra):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _DIST_VARS and not k.startswith("TORCHELASTIC")
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def _python(script, *args, timeout=300, ranks=None, **env):
    """`python script args...`, or under `python -m functrain.launch -n ranks` when given."""
    launcher = [] if ranks is None else ["-m", "functrain.launch", "-n", str(ranks)]
    return subprocess.run(
        [sys.executable, *launcher, str(script), *map(str, args)],
        env=_env(**env),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


RUN = textwrap.dedent(
    """
    import sys
    import torch
    import torch.nn.functional as F
    import functrain
    from functrain import parallel as fdist
    from functrain.checkpoint import Manager
    from torch.distributed.tensor import Shard, distribute_tensor
    from bench.exit_worker import arrange_exit_check

    arrange_exit_check(teardown=sys.argv[2] == "teardown")
    torch.set_num_threads(1)
    mesh = fdist.init_mesh()
    full = distribute_tensor(torch.arange(4.0), mesh["dp_shard"], [Shard(0)]).full_tensor()
    model = torch.nn.Sequential(torch.nn.Linear(8, 13), torch.nn.Tanh(), torch.nn.Linear(13, 3))
    optimizer = functrain.optim.sgd(0.1)
    state = functrain.init(model, optimizer, mesh=mesh, plan="fsdp")
    step = functrain.make_step(model, lambda m, b: F.cross_entropy(m(b[0]), b[1]), optimizer)
    batches = [(torch.randn(8, 8), torch.randint(0, 3, (8,)))] * 4
    manager = Manager(sys.argv[1], every="2ba")   # asynchronous, never closed by the script
    state = functrain.fit(step, state, batches, duration="3ba", checkpoints=manager,
                          log_interval=None)
    manager.save(state.replace(step=9))           # in flight when the script ends
    print("script done", flush=True)
    """
)


def _alive_after_exit(text):
    from bench.exit_worker import EXIT_CHECK

    return [line.split(EXIT_CHECK)[1].strip() for line in text.splitlines() if EXIT_CHECK in line]


def _skip_where_workers_cannot_be_counted(stdout):
    """Skip the count where this torch leaves gloo's worker threads unnamed (torch 2.6): there
    the exit check says "unknown" rather than a count of threads it cannot tell apart."""
    if "unknown" in _alive_after_exit(stdout):
        pytest.skip(
            f"torch {torch.__version__} leaves gloo's worker threads unnamed: they cannot be "
            "counted (functrain._torch.gloo_worker_thread_name)"
        )


@pytest.mark.slow
def test_one_process_ends_with_no_gloo_worker_left_and_its_save_committed(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(RUN)
    proc = _python(script, tmp_path / "ckpt", "teardown")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "script done" in proc.stdout
    assert Manager(str(tmp_path / "ckpt"), async_save=False).latest().endswith("step_000000009")
    _skip_where_workers_cannot_be_counted(proc.stdout)
    assert _alive_after_exit(proc.stdout) == ["0"], proc.stdout + proc.stderr[-2000:]
    # The control: the same run without functrain's exit hook leaves gloo workers behind.
    control = _python(script, tmp_path / "ckpt2", "none")
    assert _alive_after_exit(control.stdout) not in ([], ["0"]), control.stdout


@pytest.mark.slow
def test_two_ranks_end_with_no_gloo_worker_left(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(RUN)
    proc = _python(script, tmp_path / "c", "teardown", ranks=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _skip_where_workers_cannot_be_counted(proc.stdout)
    assert sorted(_alive_after_exit(proc.stdout)) == ["0", "0"], proc.stdout[-3000:]


PEER_DIES = textwrap.dedent(
    """
    import os, signal, sys, time
    import torch
    import torch.distributed as dist
    from functrain import parallel as fdist

    fdist.init_distributed(timeout_s=60)
    mesh = fdist.init_mesh()
    dist.all_reduce(torch.ones(1))
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    while not os.path.exists(sys.argv[1]):    # the test says when rank 1 is gone
        time.sleep(0.05)
    work = dist.all_reduce(torch.ones(1), async_op=True)   # left in flight with a dead peer
    print("rank 0 leaves", flush=True)
    """
)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_teardown_does_not_hang_or_abort_when_a_peer_died(tmp_path):
    script = tmp_path / "peer.py"
    script.write_text(PEER_DIES)
    gone = tmp_path / "rank1_gone"
    port = str(_free_port())
    ranks = [
        subprocess.Popen(
            [sys.executable, str(script), str(gone)],
            env=_env(
                RANK=str(r),
                WORLD_SIZE="2",
                LOCAL_RANK=str(r),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
                FUNCTRAIN_EXIT_TIMEOUT="120",
            ),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    try:
        assert ranks[1].wait(timeout=240) == -signal.SIGKILL
        gone.write_text("")
        out, err = ranks[0].communicate(timeout=240)
    finally:
        for proc in ranks:
            proc.kill()
            proc.stdout.close()  # rank 1's pipes are never read (closing twice is harmless)
            proc.stderr.close()
    assert "rank 0 leaves" in out, err[-3000:]
    assert ranks[0].returncode == 0, err[-3000:]
    assert "teardown still" not in err  # finished by itself, not ended by the watchdog


STUCK = textwrap.dedent(
    """
    import time
    from functrain.parallel import teardown

    teardown.on_exit(lambda: time.sleep(600))   # an exit step that never finishes
    teardown.set_exit_code(3)
    print("script done", flush=True)
    """
)


def test_the_watchdog_ends_a_stuck_teardown_with_the_runs_exit_code(tmp_path):
    script = tmp_path / "stuck.py"
    script.write_text(STUCK)
    proc = _python(script, timeout=120, FUNCTRAIN_EXIT_TIMEOUT="1")
    assert proc.returncode == 3, proc.stderr
    assert "script done" in proc.stdout
    assert (
        "functrain: teardown still closing checkpoint managers and other exit callbacks after 1 s"
        in proc.stderr
    )


DESTROY_AFTER_COLLECTIVE = textwrap.dedent(
    """
    import faulthandler, sys
    import torch
    import torch.distributed as dist
    from functrain import parallel as fdist
    from functrain.checkpoint.background import BackgroundWriter

    faulthandler.dump_traceback_later(150, exit=True)   # a hang fails with every thread's stack
    fdist.init_distributed(timeout_s=60)
    for _ in range(int(sys.argv[1])):
        writer = BackgroundWriter(async_save=True)       # makes its own gloo group
        dist.all_reduce(torch.ones(256), group=writer.group)   # only gloo holds it at the end
        writer.close()                                   # destroys the group at once
    dist.all_reduce(torch.ones(256))   # and the exit hook destroys the default group right after
    print("closed", sys.argv[1], flush=True)
    """
)


@pytest.mark.slow
def test_groups_destroyed_right_after_a_collective_on_a_temporary(tmp_path):
    """A gloo group destroyed while a worker still frees the last collective's tensor: before
    torch 2.8 the group's destructor kept the GIL that the worker needs (a deadlock within a
    few dozen tries on torch 2.6); functrain drops the groups' backends last, GIL released
    (`functrain._torch.group_backends`), in `BackgroundWriter.close` and at exit."""
    script = tmp_path / "destroy.py"
    script.write_text(DESTROY_AFTER_COLLECTIVE)
    proc = _python(script, 200, ranks=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("closed 200") == 2, proc.stdout[-2000:]
