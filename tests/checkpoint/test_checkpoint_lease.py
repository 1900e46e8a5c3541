"""One run owns a Manager root (issue 13 point 7): the lease, its take-over rules on local
files, memory:// and S3 (moto), and saves that never adopt another run's checkpoint. The
two-process case on a local disk is in test_untrusted.py (test_two_processes_on_one_root)."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import threading
import time

import pytest
import torch
from test_checkpoint_storage import BUCKET, s3_server  # noqa: F401 -- a fixture

import functrain
from functrain import checkpoint
from functrain.checkpoint import Manager, layout, lease, lease_owner, lease_store, storage
from functrain.checkpoint.errors import CheckpointError, CheckpointLeaseError

MISSING = b"\x02"  # tensorstore's generation of an absent object: "create only if absent"


def tiny(step: int, value: float = 0.0) -> functrain.TrainState:
    return functrain.TrainState(step=step, params={"w": torch.full((3,), value)}, buffers={},
                                opt_state=(), rng=functrain.RngState())  # fmt: skip


def _write_record(root, **changes) -> lease_owner.Owner:
    """Put another owner's lease record in `root` (as if another run held it)."""
    fields = dict(lease_owner.this_process(30.0).__dict__)
    fields.update(changes)
    owner = lease_owner.Owner(**fields)
    loc = storage.resolve(root)
    if loc.is_local:
        os.makedirs(loc.local_path, exist_ok=True)
        path = os.path.join(loc.local_path, layout.LEASE_FILE)
        with open(path + ".new", "wb") as f:  # atomically, as a real owner does
            f.write(owner.to_json())
        os.replace(path + ".new", path)
    else:
        storage.write_bytes(loc, layout.LEASE_FILE, owner.to_json())
    return owner


@pytest.mark.parametrize("root", ["local", "memory://lease/live"])
def test_a_live_owner_elsewhere_is_refused_and_named(tmp_path, root):
    root = str(tmp_path) if root == "local" else root
    _write_record(root, host="node-17", pid=4242, ttl=10.0)
    stop = threading.Event()

    def keep_refreshing():  # the other run is alive: its refresh count moves
        count = 1
        while not stop.wait(0.1):
            _write_record(root, host="node-17", pid=4242, ttl=10.0, count=count)
            count += 1

    refresher = threading.Thread(target=keep_refreshing)
    refresher.start()
    try:
        manager = Manager(root, async_save=False)
        with pytest.raises(
            CheckpointLeaseError, match=r"in use by another run \(host node-17, pid 4242"
        ):
            manager.save(tiny(1))
        assert checkpoint.checkpoints(root) == []
    finally:
        stop.set()
        refresher.join()


def test_a_silent_owner_elsewhere_is_taken_over_after_its_ttl(tmp_path, caplog):
    _write_record(tmp_path, host="node-17", pid=4242, ttl=0.5)
    manager = Manager(tmp_path, async_save=False)
    manager.save(tiny(1))  # waits until the record stayed unchanged for 0.5 s
    assert "took over the lease" in caplog.text and "not refreshed for 0.5s" in caplog.text
    owner = lease_owner.Owner.parse((tmp_path / layout.LEASE_FILE).read_bytes())
    assert owner.pid == os.getpid()
    manager.close()
    assert layout.LEASE_FILE not in os.listdir(tmp_path)  # released on close


def test_a_torchrun_restart_takes_over_its_own_lease_at_once(tmp_path, monkeypatch):
    # The earlier attempt ran on another node with a lease that would take an hour to expire.
    _write_record(tmp_path, host="node-3", pid=99, ttl=3600.0, run_id="job-7", restart=0)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-7")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    with Manager(tmp_path, async_save=False) as manager:
        manager.save(tiny(1))
    _write_record(tmp_path, host="node-3", pid=99, ttl=0.3, run_id="other-job", restart=0)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "5")
    with Manager(tmp_path, async_save=False) as manager:  # another run's id: waits for its ttl
        manager.save(tiny(2))


def test_a_sigkilled_owner_on_this_machine_is_taken_over_at_once(tmp_path):
    script = (
        "import sys, time, torch; import functrain; from functrain.checkpoint import Manager\n"
        "m = Manager(sys.argv[1], async_save=False, lease_ttl=3600)\n"
        "m.save(functrain.TrainState(step=1, params={'w': torch.ones(3)}, buffers={},"
        " opt_state=(), rng=functrain.RngState()))\n"
        "print('saved', flush=True); time.sleep(600)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)],
                             stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
    try:
        assert child.stdout.readline().strip() == "saved"
        child.kill()
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
    # A one-hour ttl: only the dead-process rule can let this through without waiting.
    with Manager(tmp_path, async_save=False, lease_ttl=3600) as manager:
        assert manager.restore(tiny(0)).step == 1


def test_a_lease_lost_to_another_run_stops_the_next_commit(tmp_path):
    manager = Manager(tmp_path, async_save=True)
    manager.save(tiny(1))
    manager.wait()
    _write_record(tmp_path, host="node-2", pid=7, token="someone-else")  # took it over
    manager.save(tiny(2))
    with pytest.raises(CheckpointError, match="lost the lease.*taken over by host node-2, pid 7"):
        manager.wait()
    assert [s for s, _ in checkpoint.checkpoints(tmp_path)] == [1]  # step 2 never committed
    manager.close()
    assert layout.LEASE_FILE in os.listdir(tmp_path)  # the new owner's record is left alone


def test_save_never_returns_another_runs_checkpoint_of_the_same_step(tmp_path):
    with Manager(tmp_path, async_save=False) as first:
        first.save(tiny(5, value=1.0))
    second = Manager(tmp_path, async_save=False)  # a new run that did not resume
    with pytest.raises(CheckpointError, match="step 5 that this run neither wrote nor resumed"):
        second.save(tiny(5, value=2.0))
    assert checkpoint.load(checkpoint.latest(tmp_path), like=tiny(0)).params["w"][0] == 1.0
    second.restore(tiny(0))  # having resumed it, saving the same step again is a no-op
    assert second.save(tiny(5, value=2.0)) == str(tmp_path / "step_000000005")
    second.close()


def test_only_saves_and_restores_take_the_lease(tmp_path):
    with Manager(tmp_path, async_save=False) as manager:
        manager.save(tiny(1))
        reader = Manager(tmp_path)  # listing is not owning
        assert reader.latest() == str(tmp_path / "step_000000001") and reader.checkpoints()
        assert (
            lease_owner.Owner.parse((tmp_path / layout.LEASE_FILE).read_bytes()).pid == os.getpid()
        )
    unleased = Manager(tmp_path, async_save=False, lease_ttl=None)
    assert unleased.restore(tiny(0)).step == 1
    assert layout.LEASE_FILE not in os.listdir(tmp_path)


def test_the_lease_is_refreshed_while_the_run_lives(tmp_path):
    manager = Manager(tmp_path, async_save=False, lease_ttl=0.4)
    manager.save(tiny(1))
    first = lease_owner.Owner.parse((tmp_path / layout.LEASE_FILE).read_bytes())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the background refresher bumps the count
        time.sleep(0.1)
        now = lease_owner.Owner.parse((tmp_path / layout.LEASE_FILE).read_bytes())
        if now.count > first.count:
            break
    assert now.count > first.count and now.token == first.token
    manager.close()


# -- object stores ----------------------------------------------------------------------------


def test_s3_conditional_writes_let_exactly_one_of_many_take_the_lease(s3_server):  # noqa: F811
    endpoint, _ = s3_server
    for trial in range(5):
        root = storage.resolve(f"s3://{BUCKET}/race/{trial}", {"endpoint": endpoint})
        stores = [lease_store.ObjectStore(root) for _ in range(8)]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            won = list(
                pool.map(lambda s: s[1].swap(f"{s[0]}".encode(), MISSING), enumerate(stores))
            )
        assert sum(won) == 1, won


def test_s3_two_processes_one_root(s3_server):  # noqa: F811
    endpoint, _ = s3_server
    root = f"s3://{BUCKET}/owned"
    options = {"endpoint": endpoint}
    script = (
        "import sys, time, torch; import functrain; from functrain.checkpoint import Manager\n"
        "m = Manager(sys.argv[1], async_save=False, storage_options={'endpoint': sys.argv[2]})\n"
        "m.save(functrain.TrainState(step=1, params={'w': torch.ones(3)}, buffers={},"
        " opt_state=(), rng=functrain.RngState()))\n"
        "print('saved', flush=True); time.sleep(600)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.Popen([sys.executable, "-c", script, root, endpoint],
                             stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
    try:
        assert child.stdout.readline().strip() == "saved"
        second = Manager(root, async_save=False, storage_options=options)
        with pytest.raises(CheckpointLeaseError, match=f"pid {child.pid}"):
            second.restore(tiny(0))
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    with Manager(root, async_save=False, storage_options=options, lease_ttl=3600) as third:
        assert third.restore(tiny(0)).step == 1  # the owner died on this machine: at once


# -- a lease record is untrusted input (issue 30 point 9) --------------------------------------


def _in_thread(fn) -> tuple[threading.Thread, list]:
    """Run `fn` in a daemon thread; its outcome lands in the returned list. (A hang guard: a
    test that would otherwise block forever fails instead.)"""
    outcome: list = []

    def run():
        try:
            outcome.append(fn())
        except BaseException as err:  # noqa: BLE001 -- handed to the test
            outcome.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=300)
    return thread, outcome


@pytest.mark.parametrize("ttl", [1e9, float("inf")])
def test_an_endless_ttl_is_waited_out_at_most_max_ttl_saying_who_and_how(
    tmp_path, caplog, monkeypatch, ttl
):
    monkeypatch.setattr(lease, "MAX_TTL", 0.5)
    monkeypatch.setattr(lease, "WAIT_REPORT_S", 0.0)
    _write_record(tmp_path, host="node-17", pid=4242, ttl=ttl)
    manager = Manager(tmp_path, async_save=False, lease_ttl=0.4)  # within the (patched) bound
    thread, outcome = _in_thread(lambda: manager.save(tiny(1)))
    assert not thread.is_alive(), "the run waited out a record's ttl without bound"
    assert isinstance(outcome[0], str), outcome
    waits = [r.getMessage() for r in caplog.records if "waiting for the lease" in r.getMessage()]
    assert waits and "host node-17, pid 4242" in waits[0]
    assert f"delete {tmp_path / layout.LEASE_FILE}" in waits[0]  # how to take the root over
    assert "not refreshed for 0.5s" in caplog.text
    manager.close()


def test_a_lease_file_that_is_a_fifo_is_refused(tmp_path):
    os.mkfifo(tmp_path / layout.LEASE_FILE)
    manager = Manager(tmp_path, async_save=False)
    thread, outcome = _in_thread(lambda: manager.save(tiny(1)))
    if thread.is_alive():  # blocked opening the FIFO: let it go before failing
        os.close(os.open(tmp_path / layout.LEASE_FILE, os.O_WRONLY | os.O_NONBLOCK))
    assert not thread.is_alive(), "opening the FIFO blocked"
    assert isinstance(outcome[0], CheckpointError) and "not a regular file" in str(outcome[0])
    assert checkpoint.checkpoints(tmp_path) == []


def test_a_failed_lease_write_leaves_no_partial_file(tmp_path, monkeypatch):
    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    manager = Manager(tmp_path, async_save=False)
    with pytest.raises(CheckpointError, match="No space left on device"):
        manager.save(tiny(1))
    assert os.listdir(tmp_path) == []  # no LEASE.json.*.partial left behind


@pytest.mark.parametrize("below", [False, True])
def test_a_root_that_is_a_file_raises_checkpoint_error(tmp_path, below):
    path = tmp_path / "not_a_dir"
    path.write_text("x")
    root = path / "run" if below else path
    for listing in (checkpoint.checkpoints, checkpoint.latest):
        with pytest.raises(CheckpointError, match="not a directory"):
            listing(root)
    manager = Manager(root, async_save=False)
    with pytest.raises(CheckpointError, match="not a directory"):
        manager.latest()
    with pytest.raises(CheckpointError):
        manager.save(tiny(1))
    with pytest.raises(CheckpointError):
        manager.restore(tiny(0))
    manager.close()
