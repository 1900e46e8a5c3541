"""Preemption: SIGTERM and Ctrl-C stop every rank at the same step boundary, save a checkpoint and
say so; a second Ctrl-C aborts; fit tells the caller through its `FitResult`.

Real processes: two gloo ranks started here, the launcher (`python -m functrain.launch -n 2`) with
signals sent to each rank at its own random moment, and single processes stopped by SIGTERM and
Ctrl-C. Set FUNCTRAIN_PREEMPT_RUNS=20 to run the launcher scenario 20 times (once by default).
"""

import datetime
import json
import os
import pathlib
import random
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import TensorDataset

import functrain
from functrain.checkpoint import Manager, load
from functrain.data import Loader
from functrain.loop.agreement import FIRST_PERIOD, GROWTH, Agreement
from functrain.loop.preemption import Boundary, StopKind, StopSignals, decide

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "preempt_worker.py"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


# -- the decision of one boundary ---------------------------------------------------------------


def test_one_process_decides_alone():
    assert decide(StopKind.NONE, None, 1.5) == Boundary(StopKind.NONE, 1.5)
    assert decide(StopKind.NONE, "early stop", 2.0).stop is StopKind.CALLBACK
    assert decide(StopKind.SIGTERM, "early stop", 2.0).stop is StopKind.SIGTERM  # the strongest
    assert decide(StopKind.SIGINT, None, 0.0).preempted


@settings(max_examples=60, deadline=None)
@given(
    target=st.floats(0.5, 30.0),
    sec_per_batch=st.lists(st.floats(1e-4, 20.0), min_size=1, max_size=12),
)
def test_agreements_come_ever_rarer_up_to_the_target_period(target, sec_per_batch):
    """Several ranks agree first after FIRST_PERIOD batches, then each period is at most GROWTH
    times the last, at least 1 batch, and (once longer than 1) within `target` seconds of the
    agreed clock at the pace last seen; the schedule depends only on agreed values."""
    agreement = Agreement(start_batch=10, target_sec=target)
    batch, clock, periods = 10, 0.0, []
    for pace in sec_per_batch:
        start = agreement.next_start
        clock += (start - batch) * pace
        batch = start
        agreement.record(batch, clock)
        periods.append((agreement.next_start - batch, pace))
    assert periods[0][0] == FIRST_PERIOD
    for (before, _), (period, pace) in zip(periods, periods[1:]):
        assert 1 <= period <= GROWTH * before
        assert period == 1 or period * pace <= target * (1 + 1e-9)


def test_signals_are_noted_and_a_second_ctrl_c_aborts():
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with StopSignals(quiet=True) as signals:
        os.kill(os.getpid(), signal.SIGTERM)
        assert signals.pending is StopKind.SIGTERM  # noted, not killed
    with StopSignals(quiet=True) as signals:
        os.kill(os.getpid(), signal.SIGINT)
        assert signals.pending is StopKind.SIGINT
        with pytest.raises(KeyboardInterrupt, match="second Ctrl-C"):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)  # the handler runs here
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == previous


# -- two ranks: a signal that lands just after the agreement -------------------------------------


def count_step(state, batch):
    x = batch[0]
    new = state.replace(
        step=state.step + 1,
        params={"w": state.params["w"] + x.sum()},
        timestamp=state.timestamp.advance_batch(samples=x.shape[0]),
    )
    return new, {"loss": x.mean()}


def fake_state():
    return functrain.TrainState(
        step=0, params={"w": torch.zeros(())}, buffers={}, opt_state=(), rng=functrain.RngState(0)
    )


class SigtermAtCheckpoint:
    """Sends SIGTERM to its own process from the CHECKPOINT event of batch `at`: after the step
    boundary's agreement, before the loop's decision to go on (where the old loop re-read it)."""

    def __init__(self, at):
        self.at = at

    def checkpoint(self, ctx):
        if ctx.timestamp.batch == self.at:
            os.kill(os.getpid(), signal.SIGTERM)


def _rank_worker(rank: int, port: int, root: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group(
        "gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60)
    )
    try:
        callbacks = [SigtermAtCheckpoint(3)] if rank == 0 else []
        with Manager(root, every="1ba", keep_last=None) as manager:
            result = functrain.fit(
                count_step,
                fake_state(),
                Loader(TensorDataset(torch.ones(80, 1)), 8),
                duration="2ep",
                callbacks=callbacks,
                checkpoints=manager,
                return_result=True,
                progress=False,
            )
        pathlib.Path(out).write_text(
            json.dumps([result.state.timestamp.batch, result.preempted, result.stop_reason])
        )
    finally:
        functrain.parallel.shutdown()  # not a bare destroy: see test_torch_private


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_sigterm_after_the_agreement_stops_both_ranks_at_the_next_boundary(tmp_path):
    port, root = _free_port(), str(tmp_path / "ckpt")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"import sys; sys.path[:0] = [{str(ROOT / 'tests')!r}]; import test_preemption; "
                f"test_preemption._rank_worker({rank}, {port}, {root!r}, "
                f"{str(tmp_path / str(rank))!r})",
            ],
            env=ENV,
        )
        for rank in range(2)
    ]
    for proc in procs:
        assert proc.wait(timeout=180) == 0  # no rank waits alone in a collective
    reports = [json.loads((tmp_path / str(r)).read_text()) for r in range(2)]
    assert [r[:2] for r in reports] == [[4, True], [4, True]]  # the same boundary, both preempted
    assert reports[0][2] == "SIGTERM: preempted"
    assert reports[1][2] == "SIGTERM: preempted (on another rank)"
    with Manager(root) as manager:
        assert [s for s, _ in manager.checkpoints()] == [1, 2, 3, 4]


# -- the launcher: SIGTERM to each rank at its own moment -----------------------------------------


def _wait_for(paths, proc, timeout=180):
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert proc.poll() is None, f"the run ended early ({proc.returncode})"
        assert time.monotonic() < deadline, "timed out waiting for the run to start"
        time.sleep(0.01)


RUNS = int(os.environ.get("FUNCTRAIN_PREEMPT_RUNS", "1"))


@pytest.mark.slow
@pytest.mark.parametrize("attempt", range(RUNS))
def test_sigterm_under_the_launcher_stops_both_ranks_at_one_boundary(tmp_path, attempt):
    rng = random.Random(attempt)
    root, out = tmp_path / "ckpt", tmp_path / "out"
    cmd = [sys.executable, "-m", "functrain.launch", "-n", "2", str(WORKER)]
    proc = subprocess.Popen(
        cmd + ["--root", str(root), "--out", str(out), "--steps", "400", "--pace", "0.02"],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_for([out / "pid.0", out / "pid.1"], proc)
        pids = [int((out / f"pid.{r}").read_text()) for r in range(2)]
        time.sleep(rng.uniform(0.1, 1.0))
        first = rng.randrange(2)
        os.kill(pids[first], signal.SIGTERM)
        time.sleep(rng.uniform(0.0, 0.1))  # the other rank's signal comes a moment later
        os.kill(pids[1 - first], signal.SIGTERM)
        output, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    reports = [json.loads((out / f"result.{r}.json").read_text()) for r in range(2)]
    assert reports[0]["step"] == reports[1]["step"] < 400, reports
    assert all(r["preempted"] and r["signal"] == "SIGTERM" for r in reports), reports
    # Each rank exits 75 (restart me). Which code the launcher ends with depends on which rank
    # torchrun saw first: the other may still be exiting when torchrun stops it (launcher side).
    assert proc.returncode != 0, output[-3000:]
    with Manager(root) as manager:
        step, url = manager.checkpoints()[-1]
    assert step == reports[0]["step"] and reports[0]["checkpoint"] == url
    assert load(url)["step"] == step
    assert "stopped by SIGTERM" in output and "run it again with autoresume" in output


# -- one process: what it says, and Ctrl-C ------------------------------------------------------


def _start(tmp_path, *extra):
    root, out = tmp_path / "ckpt", tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), "--root", str(root), "--out", str(out), *extra],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return proc, root, out


@pytest.mark.slow
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 75), (signal.SIGINT, 130)])
def test_one_process_stopped_by_a_signal_says_so_and_saves(tmp_path, signum, code):
    proc, root, out = _start(tmp_path, "--steps", "60", "--pace", "0.05")
    try:
        _wait_for([out / "pid.0"], proc)
        time.sleep(0.3)
        proc.send_signal(signum)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    report = json.loads((out / "result.0.json").read_text())
    assert proc.returncode == code, output
    assert report["preempted"] and not report["finished"] and report["step"] < 60
    name = "SIGTERM" if signum == signal.SIGTERM else "SIGINT"
    assert f"stopped by {name} at step {report['step']}" in output
    assert report["checkpoint"] in output and "Traceback" not in output
    with Manager(root) as manager:
        assert manager.checkpoints()[-1][0] == report["step"]
    if signum == signal.SIGINT:
        assert "press Ctrl-C again to abort" in output
        return  # the resume is the same as after SIGTERM, below
    # a rerun resumes and says where from
    rerun = subprocess.run(
        [sys.executable, str(WORKER), "--root", str(root), "--out", str(out), "--steps", "60",
         "--pace", "0"],
        env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr
    assert f"resumed from {report['checkpoint']} at step {report['step']}" in rerun.stderr
    assert json.loads((out / "result.0.json").read_text())["finished"]


@pytest.mark.slow
def test_a_second_ctrl_c_aborts_at_once(tmp_path):
    proc, root, out = _start(tmp_path, "--steps", "60", "--slow-batch", "12")
    lines: list[str] = []  # the output, read as it comes: the first Ctrl-C must be seen first

    def read():
        for line in proc.stdout:
            lines.append(line)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        _wait_for([out / "slow.0"], proc)  # inside a 30-second step
        proc.send_signal(signal.SIGINT)
        # Two signals sent before the process runs its handler arrive as one (POSIX does not
        # queue them): on a loaded machine a second Ctrl-C 0.5 s later could be lost and the run
        # would wait out the step. Send it once the first was acknowledged.
        deadline = time.monotonic() + 120
        while not any("press Ctrl-C again" in line for line in lines):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.join(timeout=60)
        proc.stdout.close()
    output = "".join(lines)
    # aborted inside the step: no checkpoint at its boundary (step 12), no result
    assert proc.returncode != 0, output
    assert "second Ctrl-C" in output
    assert not (out / "result.0.json").exists()
    with Manager(root) as manager:
        assert manager.checkpoints()[-1][0] == 10  # the periodic ones only: no final save
