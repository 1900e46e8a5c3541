"""The launcher's last line: which rank failed first, and how a stop (SIGTERM, Ctrl-C) ended.

Unit tests feed torchrun-shaped failures and rank records to `functrain.launch.status`; the
slow tests start real 2-rank runs with `python -m functrain.launch -n 2`: one rank aborts or is
SIGKILLed while the other is stopped by torchrun, and a `fit` run with a real checkpoint
`Manager` is stopped by SIGTERM, by Ctrl-C, and by two Ctrl-Cs.
"""

import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from functrain.checkpoint import Manager
from functrain.launch import status
from functrain.loop import launch_record

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Failure:
    """torchrun's ProcessFailure, as far as the launcher reads it."""

    def __init__(self, exitcode, message, timestamp=100):
        self.exitcode, self.message, self.timestamp = exitcode, {"message": message}, timestamp


def _record(rank, code=0, signals=(), step=None, when=50.0):
    checkpoint = None if step is None else {"step": step, "url": f"u/{step}", "time": when}
    exit_ = None if code is None else {"code": code, "signals": list(signals)}
    return status.RankRecord(rank, exit=exit_, checkpoint=checkpoint, signals=list(signals))


# -- which rank failed first --------------------------------------------------------------------


def test_a_rank_stopped_by_torchrun_is_never_named_when_another_died_of_a_signal():
    # torchrun writes a made-up message for a signal death; both failures land in one second.
    for signum in (signal.SIGABRT, signal.SIGKILL, signal.SIGSEGV):
        failures = {
            0: _Failure(-15, "Signal 15 (SIGTERM) received by PID 11"),
            1: _Failure(
                -signum, f"Signal {signum} ({signal.Signals(signum).name}) received by PID 12"
            ),
        }
        assert status.root_failure(failures) == 1
        line = status.failure_line(failures, 1)
        assert line.startswith(
            f"functrain.launch: rank 1 failed (killed by {signal.Signals(signum).name})"
        )
        assert status.exit_code_of(failures[1]) == 128 + signum


def test_the_rank_with_its_own_error_wins_over_ranks_that_lost_their_peer():
    failures = {
        0: _Failure(1, "RuntimeError: [gloo] Connection closed by peer [127.0.0.1]:1234"),
        1: _Failure(1, "Traceback ...\nValueError: boom"),
        2: _Failure(-15, "", 99),  # stopped by the agent, earlier in time
    }
    assert status.root_failure(failures) == 1
    assert "rank 1 failed (ValueError: boom)" in status.failure_line(failures, 1)
    assert "also failed: ranks [0, 2]" in status.failure_line(failures, 1)
    # Only a rank that lost its peer and a stopped one: the one that lost its peer.
    assert status.root_failure({3: failures[0], 5: failures[2]}) == 3


def test_a_rank_whose_error_torchrun_missed_is_named_from_its_exit_record():
    # torch 2.6's torchrun saw only rank 0 (its peer had closed) and stopped rank 1, which had
    # raised first and recorded its error while exiting.
    lost_peer = _Failure(1, "RuntimeError: [gloo] Connection closed by peer [127.0.0.1]:1234")
    raised = _record(1, 1, when=99.0)
    raised.exit.update(error="ValueError: boom", time=99.0)
    for failures in ({0: lost_peer}, {0: lost_peer, 1: _Failure(-15, "", 101)}):
        merged = status.with_recorded_errors(failures, {0: _record(0, 1), 1: raised})
        assert status.root_failure(merged) == 1
        line = status.failure_line(merged, 1)
        assert line.startswith("functrain.launch: rank 1 failed (ValueError: boom)"), line
        assert status.exit_code_of(merged[1], raised) == 1
    # A rank whose own error torchrun has keeps torchrun's failure.
    own = {1: _Failure(1, "Traceback ...\nKeyError: 'x'")}
    assert status.with_recorded_errors(own, {1: raised}) == own


def test_a_rank_that_caught_the_stop_and_exited_is_not_a_failure_of_its_own():
    failures = {0: _Failure(75, "To enable traceback see ..."), 1: _Failure(-6, "")}
    records = {0: _record(0, 75, ["SIGTERM"]), 1: _record(1, None)}
    assert status.root_failure(failures, records) == 1
    # Every failed rank caught a stop signal and exited by itself: a stop, not a failure.
    both = {0: _record(0, 75, ["SIGTERM"]), 1: _record(1, 75, ["SIGTERM"])}
    assert status.root_failure({0: failures[0], 1: _Failure(75, "")}, both) is None


def test_the_earliest_of_two_real_failures_is_named():
    failures = {0: _Failure(1, "KeyError: 'x'", timestamp=7), 1: _Failure(-9, "", timestamp=5)}
    assert status.root_failure(failures) == 1


# -- how a stop ended ---------------------------------------------------------------------------


def test_stop_line_says_where_every_rank_checkpointed():
    records = {r: _record(r, 0, ["SIGTERM"], step=7, when=60.0) for r in (0, 1)}
    line = status.stop_line("SIGTERM", records, [0, 1], since=55.0)
    assert line == (
        "functrain.launch: stopped by SIGTERM; all 2 ranks checkpointed at step 7 and exited."
    )
    # A checkpoint older than the stop is not claimed as the stop's own.
    older = status.stop_line("SIGTERM", records, [0, 1], since=65.0)
    assert "exited; their newest checkpoint is step 7" in older
    none = status.stop_line("SIGTERM", {r: _record(r) for r in (0, 1)}, [0, 1], since=1.0)
    assert none.endswith("all 2 ranks exited (no functrain checkpoint was written).")


def test_stop_line_names_ranks_that_were_killed():
    records = {0: _record(0, 0, ["SIGTERM"], step=3), 1: _record(1, None)}
    line = status.stop_line("Ctrl-C (SIGINT)", records, [0, 1], since=1.0, note="a second Ctrl-C")
    assert "ranks [1] were killed (a second Ctrl-C); ranks [0] exited" in line


def test_the_second_node_names_its_own_global_ranks():
    records = {8: _record(8, 0, ["SIGTERM"], step=5, when=9.0)}
    records[8].exit["local_rank"] = 0
    ranks = status.node_ranks(records, nproc=2, node_rank=4)  # rank 9 left no record
    assert ranks == [8, 9]
    line = status.stop_line("SIGTERM", records, ranks, since=1.0)
    assert "ranks [9] were killed" in line and "ranks [8] exited" in line


def test_records_round_trip_through_the_status_folder(tmp_path, monkeypatch):
    monkeypatch.setenv(status.STATUS_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    launch_record.record_commit(4, "file:///x/step_4")
    status.write_exit_record(0, ["SIGTERM"])
    (tmp_path / "rank9.exit.json").write_text("{not json")  # a damaged record is skipped
    records = status.read_records(str(tmp_path))
    assert list(records) == [3]
    assert records[3].checkpoint["step"] == 4 and records[3].exit["code"] == 0
    assert records[3].signals == ["SIGTERM"] and records[3].exit["local_rank"] == 1


def test_signal_log_sees_a_signal_that_another_handler_caught():
    caught = []
    old = signal.signal(signal.SIGUSR1, lambda *a: caught.append(1))
    old_term = signal.signal(signal.SIGTERM, lambda *a: caught.append(15))
    try:
        log = status.SignalLog()
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGUSR1)  # not a stop signal: not reported
        assert caught == [15, 1]
        assert log.received() == ["SIGTERM"]
    finally:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGUSR1, old)
        signal.signal(signal.SIGTERM, old_term)


# -- the launcher's exit code, one test per row of docs/events.md's table -------------------------


class _Opts:
    nproc, nnodes, node_rank = "2", "1", 0


def _report(capsys, failures=None, records=None, reason=None, forwarded=None):
    from functrain.launch import cli

    stop = cli._Stop()
    stop.reason = reason
    if forwarded is not None:
        stop.forwarded(forwarded)
    code = cli._report(_Opts(), stop, failures, records or {})
    lines = [line for line in capsys.readouterr().err.splitlines() if line]
    return code, lines[-1] if lines else ""


def test_exit_code_of_a_rank_error_is_the_ranks(capsys):
    failures = {1: _Failure(1, "ValueError: bad batch"), 0: _Failure(-15, "", timestamp=101)}
    records = {0: _record(0, None), 1: _record(1, 1)}
    code, line = _report(capsys, failures, records)
    assert code == 1 and line.startswith("functrain.launch: rank 1 failed (ValueError: bad batch)")


@pytest.mark.parametrize("second", [-signal.SIGTERM, 1])
def test_both_ranks_failing_exit_with_the_failed_ranks_code_never_143(capsys, second):
    # rank 1 raised too, but torchrun SIGTERMed it while it was still exiting (its teardown):
    # the code its script ended with counts, not the signal that finished it off
    failures = {0: _Failure(1, "CheckpointLeaseError: lost the lease", timestamp=100),
                1: _Failure(second, "CheckpointLeaseError: lost the lease", timestamp=101)}  # fmt: skip
    records = {0: _record(0, 1), 1: _record(1, 1)}
    code, line = _report(capsys, failures, records)
    assert code == 1
    assert line.startswith("functrain.launch: rank 0 failed (CheckpointLeaseError")
    # both finished off by SIGTERM, only the records say how they ended
    failures = {
        r: _Failure(-signal.SIGTERM, "Traceback ... RuntimeError: x", 100 + r) for r in (0, 1)
    }
    assert _report(capsys, failures, records)[0] == 1


@pytest.mark.parametrize("own, expected", [(75, 75), (0, 143)])
def test_sigterm_to_the_launcher_keeps_the_ranks_own_code(capsys, own, expected):
    # torchrun re-raises the stop, so there are no failures: only the records hold the 75
    records = {r: _record(r, own, ["SIGTERM"], step=7, when=60.0) for r in (0, 1)}
    code, line = _report(capsys, None, records, reason="SIGTERM")
    assert code == expected
    assert line == "functrain.launch: stopped by SIGTERM; all 2 ranks exited; their newest " + (
        "checkpoint is step 7."
    )


def test_ctrl_c_exits_130(capsys):
    records = {r: _record(r, 0, ["SIGTERM"], step=7) for r in (0, 1)}
    assert _report(capsys, None, records, reason="Ctrl-C (SIGINT)")[0] == 130


@pytest.mark.parametrize("sig, expected", [(signal.SIGHUP, 129), (signal.SIGQUIT, 131)])
def test_a_hangup_is_a_stop_never_a_success(capsys, sig, expected):
    records = {r: _record(r, 0, ["SIGTERM"], step=7) for r in (0, 1)}
    records[0].exit["stop_time"] = records[1].exit["stop_time"] = 40.0
    code, line = _report(capsys, None, records, forwarded=sig)
    assert code == expected
    assert (
        line
        == f"functrain.launch: stopped by {sig.name}; all 2 ranks checkpointed at step 7 "
        + ("and exited.")
    )


def test_one_rank_signalled_stops_both_and_no_rank_failed(capsys):
    # SIGTERM to rank 1 alone: fit stops both at one boundary, both scripts exit 75
    failures = {r: _Failure(75, "", timestamp=100 + r) for r in (0, 1)}
    records = {0: _record(0, 75, step=7), 1: _record(1, 75, ["SIGTERM"], step=7)}
    code, line = _report(capsys, failures, records)
    assert code == 75
    assert line.startswith("functrain.launch: stopped by SIGTERM (sent to the ranks);"), line


# -- real launches ------------------------------------------------------------------------------


def _env():
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
        and not k.startswith("TORCHELASTIC")
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    return env


def _launch(args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "functrain.launch", "-n", "2", *args],
        env=_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


THREADS = (
    "import os, torch; print('threads', os.environ.get('OMP_NUM_THREADS'), torch.get_num_threads())"
)


@pytest.mark.parametrize("given, expected", [(None, "1 1"), ("2", "2 2")])
def test_each_rank_gets_one_thread_unless_omp_num_threads_is_set(tmp_path, given, expected):
    script = tmp_path / "threads.py"
    script.write_text(THREADS)
    env = _env()
    env.pop("OMP_NUM_THREADS", None)
    if given is not None:
        env["OMP_NUM_THREADS"] = given
    proc = subprocess.run(
        [sys.executable, "-m", "functrain.launch", "-n", "1", str(script)],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"[rank0]: threads {expected}" in proc.stdout, proc.stdout + proc.stderr[-2000:]


DIES = textwrap.dedent(
    """
    import os, signal, sys, time
    import torch
    import torch.distributed as dist
    import functrain.parallel as fdist

    fdist.init_mesh()
    dist.all_reduce(torch.ones(1))             # both ranks got this far
    if dist.get_rank() == 1:
        if sys.argv[1] == "abort":
            os.abort()
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)                            # rank 0 lives on until torchrun stops it
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("how, name", [("abort", "SIGABRT"), ("kill", "SIGKILL")])
def test_the_rank_that_died_is_named_not_the_one_torchrun_stopped(tmp_path, how, name):
    script = tmp_path / "dies.py"
    script.write_text(DIES)
    proc = _launch([str(script), how])
    assert f"functrain.launch: rank 1 failed (killed by {name}); all ranks were stopped" in (
        proc.stderr
    ), proc.stderr[-3000:]
    assert proc.returncode == 128 + getattr(signal, name)


FIT = textwrap.dedent(
    """
    import os, sys, signal, time
    import torch
    import torch.nn.functional as F
    import functrain
    from functrain import parallel as fdist
    from functrain.checkpoint import Manager

    class Beat:
        def batch_end(self, ctx):
            if ctx.state.step == 1:
                print(f"pid {ctx.rank} {os.getpid()}", flush=True)
            if ctx.rank == 0:
                print(f"beat {ctx.state.step}", flush=True)
            time.sleep(0.05)

    if sys.argv[2] == "ignore-sigterm":   # a rank that never stops by itself
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    torch.set_num_threads(1)
    mesh = fdist.init_mesh()
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(8, 8, generator=gen), torch.randint(0, 3, (8,), generator=gen))]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 13), torch.nn.Tanh(), torch.nn.Linear(13, 3))
    optimizer = functrain.optim.sgd(0.1)
    state = functrain.init(model, optimizer, mesh=mesh, plan="fsdp")
    step = functrain.make_step(model, lambda m, b: F.cross_entropy(m(b[0]), b[1]), optimizer)
    manager = Manager(sys.argv[1], every="100000ba")   # saves only when stopped or done
    if sys.argv[2] == "ignore-sigterm":
        while True:
            print("beat 99", flush=True)
            time.sleep(0.2)
    duration = "3ba" if sys.argv[2] == "short" else "100000ba"
    state = functrain.fit(step, state, batches * 100000, duration=duration,
                          checkpoints=manager, autoresume=True,   # the lease: at the start
                          callbacks=[Beat()], log_interval=None)
    print(f"fit returned at step {state.step}", flush=True)
    if sys.argv[2] == "exit75":   # the examples' `sys.exit(result.exit_code)` after SIGTERM
        sys.exit(75)
    """
)


def _launch_and_signal(tmp_path, mode, signals):
    """Start the fit script on 2 ranks, wait until it trains, then send each of `signals` to the
    launcher (each after the launcher's line about the previous one). Returns (code, out, err)."""
    script = tmp_path / "fit_stop.py"
    script.write_text(FIT)
    proc = subprocess.Popen(
        [sys.executable, "-m", "functrain.launch", "-n", "2", "--stop-timeout", "300"]
        + [str(script), str(tmp_path / "ckpt"), mode],
        env=_env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = [], []
    drain = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    drain.start()
    try:
        for line in proc.stdout:  # training has started once rank 0 reports a few steps
            out.append(line)
            if "beat " in line and int(line.rsplit(" ", 1)[1]) >= 3:
                break
        else:
            raise AssertionError("the run ended before training:\n" + "".join(out + err))
        for index, signum in enumerate(signals):
            if index:  # the next one only once the launcher said it handles the previous
                while not any("asking every rank" in line for line in err):
                    assert proc.poll() is None, "".join(err)
                    threading.Event().wait(0.1)
            proc.send_signal(signum)
        out.extend(proc.stdout)
        proc.wait(timeout=240)
        drain.join(timeout=60)
    except BaseException:
        proc.kill()
        raise
    finally:
        drain.join(timeout=60)
        proc.stdout.close()
        proc.stderr.close()
    return proc.returncode, "".join(out), "".join(err)


def _last_line(err):
    lines = [line for line in err.splitlines() if line.startswith("functrain.launch:")]
    assert lines, err[-3000:]
    return lines[-1]


@pytest.mark.slow
@pytest.mark.parametrize(
    "signum, reason, code",
    [
        (signal.SIGTERM, "SIGTERM", 143),
        (signal.SIGINT, "Ctrl-C (SIGINT)", 130),
        (signal.SIGHUP, "SIGHUP", 129),  # a closed terminal, a dropped ssh session
        (signal.SIGQUIT, "SIGQUIT", 131),
    ],
)
def test_a_stop_checkpoints_every_rank_and_ends_with_one_line(tmp_path, signum, reason, code):
    returncode, out, err = _launch_and_signal(tmp_path, "train", [signum])
    last = _last_line(err)
    prefix = f"functrain.launch: stopped by {reason}; all 2 ranks checkpointed at step "
    assert last.startswith(prefix) and last.endswith(" and exited."), err[-3000:]
    step = int(last[len(prefix) :].split()[0])
    assert returncode == code
    assert "Traceback" not in err, err[-3000:]
    assert f"[rank0]: fit returned at step {step}" in out
    # The checkpoint the line names is committed and holds that step.
    manager = Manager(str(tmp_path / "ckpt"), async_save=False)
    assert manager.latest().endswith(f"step_{step:09d}")


@pytest.mark.slow
def test_a_second_ctrl_c_kills_every_rank_at_once(tmp_path):
    # The ranks ignore SIGTERM, so only the second Ctrl-C (not the 300 s timeout) ends them.
    returncode, _, err = _launch_and_signal(tmp_path, "ignore-sigterm", [signal.SIGINT] * 2)
    assert "functrain.launch: second Ctrl-C: killing every rank now" in err, err[-3000:]
    assert _last_line(err) == (
        "functrain.launch: stopped by Ctrl-C (SIGINT); ranks [0, 1] were killed (a second Ctrl-C)."
    )
    assert returncode == 130


@pytest.mark.slow
def test_sigterm_with_ranks_exiting_75_exits_75(tmp_path):
    returncode, out, err = _launch_and_signal(tmp_path, "exit75", [signal.SIGTERM])
    assert _last_line(err).startswith("functrain.launch: stopped by SIGTERM; all 2 ranks "), err
    assert returncode == 75  # the ranks' "run me again", not 143


BOTH_FAIL = textwrap.dedent(
    """
    import torch
    import torch.distributed as dist
    import functrain.parallel as fdist

    fdist.init_mesh()
    dist.all_reduce(torch.ones(1))             # both ranks got this far
    raise ValueError(f"rank {dist.get_rank()} fails too")
    """
)


@pytest.mark.slow
def test_both_ranks_failing_exit_1_never_143(tmp_path):
    script = tmp_path / "both_fail.py"
    script.write_text(BOTH_FAIL)
    for _ in range(3):  # which rank torchrun sees first, and how it ends the other, varies
        proc = _launch([str(script)])
        line = _last_line(proc.stderr)
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert "failed (ValueError: rank " in line and "all ranks were stopped" in line, line


def _alive(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()  # a zombie has ended
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ranks_die_with_a_killed_launcher(tmp_path):
    script = tmp_path / "fit_stop.py"
    script.write_text(FIT)
    proc = subprocess.Popen(
        [sys.executable, "-m", "functrain.launch", "-n", "2", str(script), str(tmp_path / "c"), "train"],
        env=_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        start_new_session=True,
    )  # fmt: skip
    pids = {}
    try:
        for line in proc.stdout:
            if "pid " in line:
                rank, pid = line.split("pid ", 1)[1].split()
                pids[int(rank)] = int(pid)
            if len(pids) == 2 and "beat " in line and int(line.rsplit(" ", 1)[1]) >= 3:
                break
        assert len(pids) == 2, pids
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its group; the ranks have their own
        proc.wait(timeout=60)
        deadline = threading.Event()
        for _ in range(600):  # the kernel kills them at once; allow a loaded machine a minute
            if not any(_alive(pid) for pid in pids.values()):
                break
            deadline.wait(0.1)
        assert not any(_alive(pid) for pid in pids.values()), pids
    finally:
        for pid in pids.values():
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        proc.stdout.close()
    # The same command right away: the dead run's lease is taken over, not refused.
    again = _launch([str(script), str(tmp_path / "c"), "short"])
    assert again.returncode == 0, again.stderr[-3000:]
    assert "fit returned at step 3" in again.stdout
    assert "took over the lease" in again.stderr and "its process is gone" in again.stderr


@pytest.mark.slow
def test_sigterm_to_one_rank_stops_both_and_names_no_failure(tmp_path):
    script = tmp_path / "fit_stop.py"
    script.write_text(FIT)
    proc = subprocess.Popen(
        [sys.executable, "-m", "functrain.launch", "-n", "2", str(script), str(tmp_path / "c"), "exit75"],
        env=_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    err = []
    drain = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    drain.start()
    pids, out = {}, []
    try:
        for line in proc.stdout:
            out.append(line)
            if "pid " in line:
                rank, pid = line.split("pid ", 1)[1].split()
                pids[int(rank)] = int(pid)
            if len(pids) == 2 and "beat " in line and int(line.rsplit(" ", 1)[1]) >= 3:
                break
        assert len(pids) == 2, "".join(out + err)
        os.kill(pids[1], signal.SIGTERM)  # a scheduler preempting one process
        out.extend(proc.stdout)
        proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
        drain.join(timeout=60)
        proc.stdout.close()
        proc.stderr.close()
    stderr = "".join(err)
    last = _last_line(stderr)
    assert last.startswith("functrain.launch: stopped by SIGTERM (sent to the ranks); all 2 "), last
    assert "failed" not in last
    assert proc.returncode == 75
    steps = {line.rsplit(" ", 1)[1] for line in "".join(out).splitlines() if "fit returned" in line}
    assert len(steps) == 1  # both ranks stopped at the same boundary


HOLD = textwrap.dedent(
    """
    import sys, time
    from functrain.checkpoint import storage
    from functrain.checkpoint.lease import Lease

    Lease(storage.resolve(sys.argv[1]), 30.0).acquire()
    print("holding", flush=True)
    time.sleep(600)
    """
)


def _holder(root):
    """A live process of this machine that holds `root`'s lease (as a rank of another run)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(root)], env=_env(), cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout.readline().strip() == "holding"
    return proc


@pytest.mark.slow
def test_a_refused_lease_exits_with_the_ranks_code_never_143(tmp_path):
    """docs/events.md's "lease refused" row: the root is another live run's; after waiting for
    it to exit, the ranks fail with CheckpointLeaseError, and the launch exits 1, naming it."""
    script = tmp_path / "fit_stop.py"
    script.write_text(FIT)
    holder = _holder(tmp_path / "ckpt")
    try:
        proc = _launch([str(script), str(tmp_path / "ckpt"), "short"])
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    line = _last_line(proc.stderr)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "failed (CheckpointLeaseError: " in line and "all ranks were stopped" in line, line
    assert f"pid {holder.pid}" in proc.stderr and "did not exit in 10s" in proc.stderr


@pytest.mark.slow
def test_a_restart_right_after_a_killed_run_waits_for_the_old_owner(tmp_path):
    """The issue-30 restart: the old run's rank still holds the lease (its launcher was killed a
    moment ago); the new launch waits for it instead of failing, and takes over once it is gone."""
    script = tmp_path / "fit_stop.py"
    script.write_text(FIT)
    holder = _holder(tmp_path / "ckpt")
    proc = subprocess.Popen(
        [sys.executable, "-m", "functrain.launch", "-n", "2", str(script), str(tmp_path / "ckpt"), "short"],
        env=_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    err = []
    try:
        for line in proc.stderr:
            err.append(line)
            if "waiting up to 10s for it to exit" in line:
                break
        assert f"pid {holder.pid}" in "".join(err), "".join(err)[-3000:]
        holder.kill()  # the old owner dies now, as a rank of a killed launcher does
        holder.wait()
        err.extend(proc.stderr)
        proc.wait(timeout=240)
    finally:
        for p in (holder, proc):
            if p.poll() is None:
                p.kill()
                p.wait()
        holder.stdout.close()
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == 0, "".join(err)[-3000:]
    assert "took over the lease" in "".join(err)  # from the dead owner
