"""The launcher's hang watchdog (functrain.launch.watchdog) and the ranks' heartbeat.

Unit tests feed faulthandler-shaped dumps and heartbeat records to the watchdog's functions; the
slow tests start real 2-rank `fit` runs under `python -m functrain.launch --hang-timeout 5s`: one
rank sleeps forever inside `loss_fn` at step 5, or skips a collective the other rank waits in
(a deadlock), and the launcher must name the rank, its step and phase, leave every rank's stack,
stop the job with exit code 124, and restart it when `--max-restarts` allows.
"""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from functrain.launch import watchdog
from functrain.loop.events import Event
from functrain.loop.heartbeat import Heartbeat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STUCK = """\
Thread 0x00007f75b67bb6c0 (most recent call first):
  File "/work/functrain/loop/heartbeat.py", line 127 in _write_loop
  File "/usr/lib/python3.11/threading.py", line 982 in run

Current thread 0x00007f75e1e40b80 (most recent call first):
  File "train.py", line 21 in loss_fn
  File "/work/functrain/step/grads.py", line 110 in _with_tensors
  File "/work/functrain/loop/api.py", line 151 in fit
  File "train.py", line 34 in <module>
  File "<frozen runpy>", line 88 in _run_code
  File "/work/functrain/launch/cli.py", line 332 in _worker
"""
WAITING = """\
Current thread 0x00007fbbd7eff6c0 (most recent call first):
  File "/work/functrain/loop/heartbeat.py", line 127 in _write_loop

Thread 0x00007fbc07660b80 (most recent call first):
  File "/env/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/env/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "/home/u/train.py", line 24 in loss_fn
  File "/work/functrain/loop/api.py", line 151 in fit
  File "/home/u/train.py", line 34 in <module>
  File "<frozen runpy>", line 88 in _run_code
"""


def _beat(step=5, phase="forward-backward", since=100.0, **extra):
    return {"rank": 0, "pid": -1, "attempt": 0, "step": step, "phase": phase, "since": since,
            **extra}  # fmt: skip


@pytest.mark.parametrize(
    "text, seconds",
    [("600", 600.0), ("120s", 120.0), ("10m", 600.0), ("1h", 3600.0), ("0", 0.0), ("2.5s", 2.5)],
)
def test_hang_timeout_reads_seconds_minutes_and_hours(text, seconds):
    assert watchdog.parse_timeout(text) == seconds


def test_a_bad_hang_timeout_names_the_forms_it_takes():
    with pytest.raises(ValueError, match="--hang-timeout 'soon'.*'120s'.*0 to turn"):
        watchdog.parse_timeout("soon")


def test_the_launcher_takes_the_timeout_600s_by_default_and_says_what_a_bad_one_is(capsys):
    from functrain.launch.cli import build_parser

    opts = build_parser().parse_args(["train.py"])
    assert (opts.hang_timeout, opts.hang_dir) == (600.0, None)
    assert build_parser().parse_args(["--hang-timeout", "0", "train.py"]).hang_timeout == 0.0
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--hang-timeout", "soon", "train.py"])
    assert "--hang-timeout 'soon' is not a duration" in capsys.readouterr().err


def test_the_main_thread_and_the_innermost_script_frame_are_found():
    assert watchdog.where(watchdog.main_stack(STUCK)) == ("train.py:21 in loss_fn", None)
    frame, waits = watchdog.where(watchdog.main_stack(WAITING))
    assert (frame, waits) == ("train.py:24 in loss_fn", "distributed_c10d.py:3252 in all_reduce")


def test_the_line_names_the_stuck_rank_and_says_the_others_wait():
    beats = {0: _beat(since=94.0), 1: _beat(since=90.0)}
    line = watchdog.hang_line(beats, {0: WAITING, 1: STUCK}, 100.0, "/runs/a/hang-1")
    assert line == (
        "functrain.launch: hang: rank 1 stuck in forward-backward at step 5 (train.py:21 in "
        "loss_fn) for 10 s; ranks [0] wait in a collective (distributed_c10d.py:3252 in "
        "all_reduce); stacks in /runs/a/hang-1"
    )


def test_every_rank_waiting_is_called_a_deadlock_and_each_rank_is_named():
    beats = {0: _beat(since=90.0), 1: _beat(step=6, phase="data", since=92.0)}
    line = watchdog.hang_line(beats, {0: WAITING, 1: WAITING}, 100.0, "d")
    assert "a deadlock" in line
    assert "rank 0 in forward-backward at step 5 (train.py:24 in loss_fn)" in line
    assert "rank 1 in data at step 6" in line and "for 10 s" in line


@given(
    st.lists(st.floats(0.05, 10.0), min_size=3, max_size=8),
    st.integers(0, 7),
    st.floats(1.6, 5.0),
)
def test_a_rank_slower_than_1_5x_the_median_of_the_others_is_named_and_only_it(times, who, factor):
    """A law: with the others within 1.4x of each other, the one rank made slower than 1.5x their
    median (by a margin above the jitter floor) is the only straggler named."""
    base = min(times)
    times = [min(t, base * 1.4) for t in times]
    who = who % len(times)
    others = [t for i, t in enumerate(times) if i != who]
    times[who] = max(others) * factor + 0.02
    beats = {r: _beat(step_sec=t) for r, t in enumerate(times)}
    named = watchdog.stragglers(beats)
    assert list(named) == [who]
    assert named[who].startswith("step time")


def test_a_slow_loader_is_named_though_every_step_takes_as_long():
    beats = {r: _beat(step_sec=1.0, data_sec=0.05) for r in range(4)}
    beats[2]["data_sec"] = 0.6  # synchronous DP: the step is the same, the wait for data is not
    assert list(watchdog.stragglers(beats)) == [2]


def test_the_heartbeat_writes_step_and_phase_for_the_launcher(tmp_path, monkeypatch):
    monkeypatch.setenv("FUNCTRAIN_LAUNCH_STATUS", str(tmp_path))
    monkeypatch.setenv("RANK", "3")
    beat = Heartbeat.of_launch(run_dir="/runs/a")
    beat.interval = 0.01
    beat.beat(Event.BATCH_START, 5)
    beat.phase("checkpoint", 6)
    beat.beat(Event.FIT_END, 6)  # the writer thread writes the last state and ends
    assert beat._thread is not None
    beat._thread.join(timeout=30)
    record = watchdog.read_heartbeats(str(tmp_path))[3]
    assert (record["step"], record["phase"], record["run_dir"]) == (6, "done", "/runs/a")
    assert record["pid"] == os.getpid()


def test_a_fit_that_raised_is_done_so_the_script_may_go_on_unwatched(tmp_path, monkeypatch):
    """A test suite under the launcher: one test's `fit` raises, the next tests run no `fit`."""
    monkeypatch.setenv("FUNCTRAIN_LAUNCH_STATUS", str(tmp_path))
    monkeypatch.setenv("RANK", "0")

    class Run:  # FitRun's shape: `run` beats through `self.beat`
        def __init__(self):
            self.beat = Heartbeat.of_launch(run_dir=None)
            self.beat.interval = 0.01

        def run(self):
            self.beat.beat(Event.BATCH_START, 3)
            raise RuntimeError("the step failed")

    fit = Run()
    with pytest.raises(RuntimeError):
        fit.run()
    assert fit.beat._thread is not None
    fit.beat._thread.join(timeout=30)
    assert watchdog.read_heartbeats(str(tmp_path))[0]["phase"] == "done"


def test_outside_a_launch_the_heartbeat_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("FUNCTRAIN_LAUNCH_STATUS", raising=False)
    beat = Heartbeat.of_launch(run_dir=str(tmp_path))
    beat.beat(Event.BATCH_START, 1)
    assert beat.path is None and beat._thread is None and os.listdir(tmp_path) == []


def test_a_finished_rank_and_an_old_attempt_are_never_a_hang(tmp_path):
    watch = watchdog.Watchdog(str(tmp_path), timeout=5.0, hang_dir=str(tmp_path / "h"))
    watch._attempt = 1  # torchrun restarted the ranks once; attempt 0's files are history
    beats = {
        0: _beat(phase="done", since=0.0, attempt=1),
        1: _beat(since=99.0, attempt=1),
        2: _beat(since=0.0, attempt=0),
    }
    for rank, beat in beats.items():
        (tmp_path / f"heartbeat.rank{rank}.json").write_text(json.dumps(beat))
    watch.look(100.0)
    assert watch.hang is None and not (tmp_path / "h").exists()


def test_a_stale_heartbeat_is_a_hang_with_a_stack_file_per_rank(tmp_path):
    """A rank that does not answer SIGUSR1 (here: no process) still gets its file, saying so."""
    watch = watchdog.Watchdog(str(tmp_path), timeout=5.0, hang_dir=str(tmp_path / "h"))
    for rank, since in ((0, 99.0), (1, 90.0)):
        (tmp_path / f"heartbeat.rank{rank}.json").write_text(json.dumps(_beat(since=since)))
    watch.look(100.0)
    assert watch.hang is not None and "rank 1 stuck in forward-backward at step 5" in watch.hang
    assert "ranks [0] are running" in watch.hang  # it moved a second ago
    (folder,) = (tmp_path / "h").iterdir()
    assert folder.name.startswith("hang-") and f"stacks in {folder}" in watch.hang
    assert sorted(p.name for p in folder.iterdir()) == ["rank0.txt", "rank1.txt"]
    assert "did not answer SIGUSR1" in (folder / "rank1.txt").read_text()
    assert watchdog.read_heartbeats(str(tmp_path)) == {}  # the next attempt starts afresh
    watch.look(200.0)  # one hang per attempt: nothing more happens
    assert len(list((tmp_path / "h").iterdir())) == 1


# -- real launches ------------------------------------------------------------------------------

HANGS = textwrap.dedent(
    """
    import os, sys, time
    import torch
    import torch.nn.functional as F
    import torch.distributed as dist
    import functrain
    from functrain import parallel as fdist

    mode = sys.argv[1]
    torch.set_num_threads(1)
    mesh = fdist.init_mesh()
    rank = dist.get_rank()
    stats = dist.new_group(backend="gloo")   # the script's own collective, beside the step's
    first = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    at = {"step": 0}

    class Where:
        def batch_start(self, ctx):
            at["step"] = ctx.state.step

    def loss_fn(model, batch):
        here = at["step"] == 5 and rank == 1 and first
        if here and mode == "sleep":
            print(f"sleeping at {time.time()}", flush=True)
            time.sleep(100000)
        loss = F.cross_entropy(model(batch[0]), batch[1])
        if mode == "deadlock" and not here:
            dist.all_reduce(torch.ones(1), group=stats)   # rank 1 skips it at step 5
        return loss

    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(8, 8, generator=gen), torch.randint(0, 3, (8,), generator=gen))]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 13), torch.nn.Tanh(), torch.nn.Linear(13, 3))
    optimizer = functrain.optim.sgd(0.1)
    state = functrain.init(model, optimizer, mesh=mesh, plan="ddp")
    step = functrain.make_step(model, loss_fn, optimizer)
    state = functrain.fit(step, state, batches * 12, duration="12ba", callbacks=[Where()],
                          log_interval=None, run_dir=sys.argv[2])
    print(f"fit returned at step {state.step}", flush=True)
    """
)


def _env():
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
        and not k.startswith("TORCHELASTIC")
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    return env


def _launch(tmp_path, mode, *flags):
    script = tmp_path / "hangs.py"
    script.write_text(HANGS)
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "functrain.launch", "-n", "2", "--hang-timeout", "5s", *flags,
         str(script), mode, str(run_dir)],
        env=_env(), cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return proc, time.time(), run_dir


def _stacks(run_dir):
    folders = sorted(p for p in run_dir.iterdir() if p.name.startswith("hang-"))
    assert len(folders) == 1, folders
    return {p.name: p.read_text() for p in folders[0].iterdir()}, folders[0]


def _last_line(err):
    return [line for line in err.splitlines() if line.startswith("functrain.launch:")][-1]


@pytest.mark.slow
def test_a_rank_sleeping_in_loss_fn_is_named_with_its_step_phase_and_stack(tmp_path):
    proc, ended, run_dir = _launch(tmp_path, "sleep")
    assert proc.returncode == watchdog.HANG_CODE, proc.stderr[-4000:]
    line = _last_line(proc.stderr)
    assert "rank 1 stuck in forward-backward at step 5 (hangs.py:" in line, line
    assert " in loss_fn) for " in line and "ranks [0] wait in a collective" in line, line
    stacks, folder = _stacks(run_dir)
    assert f"stacks in {folder}" in line and line.endswith("all ranks were stopped.")
    assert sorted(stacks) == ["rank0.txt", "rank1.txt"]
    assert "in loss_fn" in stacks["rank1.txt"] and "most recent call first" in stacks["rank0.txt"]
    slept = float(proc.stdout.split("sleeping at ")[1].split()[0])
    assert ended - slept < 5 + 30  # the bound: hang-timeout + 30 s


@pytest.mark.slow
def test_a_rank_that_skips_a_collective_is_found_as_a_deadlock(tmp_path):
    proc, _, run_dir = _launch(tmp_path, "deadlock")
    assert proc.returncode == watchdog.HANG_CODE, proc.stderr[-4000:]
    line = _last_line(proc.stderr)
    assert "a deadlock" in line, line
    assert "rank 0 in forward-backward at step 5 (hangs.py:" in line, line
    assert "in loss_fn) waits in a collective (" in line and "in all_reduce" in line, line
    assert "rank 1 in forward-backward at step 5" in line, line
    stacks, _ = _stacks(run_dir)
    assert "in loss_fn" in stacks["rank0.txt"] and "all_reduce" in stacks["rank0.txt"]


@pytest.mark.slow
def test_a_hang_restarts_the_job_when_max_restarts_allows(tmp_path):
    proc, _, run_dir = _launch(tmp_path, "sleep", "--max-restarts", "1")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stderr.count("functrain.launch: hang: rank 1 stuck") == 1, proc.stderr[-4000:]
    assert "stopping every rank" in proc.stderr
    assert proc.stdout.count("fit returned at step 12") == 2, proc.stdout[-3000:]
