"""MosaicML Streaming through `fit`, with the real package: MDS shards written by its `MDSWriter`
from the digits, read from a directory and from an S3-compatible server on loopback (moto), on one
and two ranks, SIGKILLed mid-epoch and resumed exactly through the dataset's own state.

Every run is a subprocess (tests/streaming_worker.py) that records, per step and rank, the sample
ids it trained on; the expectations are Streaming's own order (a plain `DataLoader` over a fresh
`StreamingDataset`) and an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from functrain.streaming import INSTALL_COMMAND, StreamingData, collate_samples, import_streaming

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "streaming_worker.py")
NUM_SAMPLES, GLOBAL_BATCH = 1280, 64  # 20 batches per epoch; the worker trains 2 epochs
BUCKET = "streaming-tests"
_LAUNCH_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def _streaming():
    try:
        return import_streaming()
    except ImportError:
        pytest.skip(f"MosaicML Streaming is not installed ({INSTALL_COMMAND})")


def test_import_error_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "streaming", None)  # `import streaming` raises ImportError
    with pytest.raises(ImportError, match="pip install --no-deps"):
        import_streaming()


def test_collate_samples_copies_and_orders_columns():
    x = np.arange(4, dtype=np.float32)
    x.setflags(write=False)  # MDS gives read-only views of the shard
    samples = [{"x": x, "y": 1, "id": 5}, {"x": x + 1, "y": 2, "id": 6}]
    xs, ys = collate_samples(samples, ("x", "y"))
    assert torch.equal(xs, torch.tensor([[0.0, 1, 2, 3], [1, 2, 3, 4]]))
    assert ys.tolist() == [1, 2]
    with pytest.raises(KeyError, match="'z'"):
        collate_samples(samples, ("z",))


def test_streaming_data_rejects_a_dataset_without_batch_size():
    class NoBatch:
        batch_size = None

        def state_dict(self, num_samples, from_beginning):
            return {}

        def load_state_dict(self, state):
            pass

    with pytest.raises(ValueError, match="batch_size="):
        StreamingData(NoBatch())
    with pytest.raises(TypeError, match="StreamingDataset"):
        StreamingData(object())


# -- the real package ---------------------------------------------------------------------------


def _write_shards(out) -> None:
    """The first NUM_SAMPLES digits as MDS shards (several, so shard boundaries are crossed)."""
    streaming = _streaming()
    from sklearn.datasets import load_digits

    digits = load_digits()
    columns = {"x": "ndarray:float32:64", "y": "int", "id": "int"}
    with streaming.MDSWriter(out=out, columns=columns, size_limit=1 << 15) as writer:
        for i in range(NUM_SAMPLES):
            x = (digits.data[i] / 16).astype(np.float32)
            writer.write({"x": x, "y": int(digits.target[i]), "id": i})


@pytest.fixture(scope="module")
def streaming_env(tmp_path_factory):
    """Shards in a directory, a private TMPDIR for Streaming's file locks, and cleanup of the
    shared memory that killed runs leave behind (only the blocks created during these tests)."""
    _streaming()
    base = tmp_path_factory.mktemp("streaming")
    shards = base / "shards"
    _write_shards(str(shards))
    before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    tmp = base / "tmp"
    tmp.mkdir()
    yield {"base": base, "shards": str(shards), "tmp": str(tmp)}
    if os.path.isdir("/dev/shm"):
        for name in set(os.listdir("/dev/shm")) - before:
            if name[:6].isdigit() and name[6:7] == "_":  # Streaming's `<prefix>_<name>` blocks
                with _ignore_missing():
                    os.unlink(os.path.join("/dev/shm", name))


class _ignore_missing:
    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        return kind is not None and issubclass(kind, FileNotFoundError)


def _env(streaming_env, extra=None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARS}
    env = {k: v for k, v in env.items() if not k.startswith("TORCHELASTIC")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    env["TMPDIR"] = streaming_env["tmp"]
    env.update(extra or {})
    return env


def _run(streaming_env, run_dir, *, ranks=1, kill_at=-1, remote=None, cache=None, extra=None):
    """One worker run (under the launcher when ranks > 1); returns its CompletedProcess."""
    args = [
        WORKER,
        "--remote",
        remote or streaming_env["shards"],
        "--cache",
        str(cache or (streaming_env["base"] / "unused-cache")),
        "--out-dir",
        str(run_dir),
        "--every",
        "5ba",
        "--kill-at",
        str(kill_at),
    ]
    command = [sys.executable, *args]
    if ranks > 1:
        command = [sys.executable, "-m", "functrain.launch", "-n", str(ranks), *args]
    proc = subprocess.run(
        command,
        env=_env(streaming_env, extra),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    if kill_at < 0:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    else:  # killed on purpose: by SIGKILL (one process) or the launcher reporting it (N ranks)
        assert proc.returncode != 0, "the run was meant to be killed"
        assert (run_dir / "ckpt").is_dir(), proc.stderr[-6000:]
    return proc


def _steps(run_dir, rank=0) -> list[dict]:
    with open(run_dir / f"ids.{rank}.jsonl") as f:
        return [json.loads(line) for line in f]


def _last_per_step(records) -> dict[int, list[int]]:
    """step -> the ids of the last time it ran (a step redone after a kill replaces the lost one)."""
    return {r["step"]: r["ids"] for r in records}


def _global(run_dir, ranks) -> dict[int, list[int]]:
    """step -> the ids of the global batch (the ranks' batches in rank order)."""
    per_rank = [_last_per_step(_steps(run_dir, r)) for r in range(ranks)]
    return {s: sum((p[s] for p in per_rank), []) for s in per_rank[0]}


def _params(run_dir):
    from safetensors.torch import load_file

    return load_file(str(run_dir / "params.safetensors"))


def _saved_data_state(run_dir) -> dict:
    """Streaming's state as saved in the newest checkpoint (fit's `extra.data`)."""
    from functrain.checkpoint import Manager, describe
    from functrain.loop.saved_state import decode_state

    with Manager(run_dir / "ckpt") as manager:
        path = manager.latest()
    for record in describe(path).records:
        if tuple(record.path) == ("extra", "data"):
            return decode_state(record.value)["state"]
    raise AssertionError("no data state in the checkpoint")


def _streaming_order(shards, epochs=2) -> list[list[int]]:
    """Streaming's own order for one rank: a plain DataLoader over a fresh StreamingDataset."""
    streaming = _streaming()
    dataset = streaming.StreamingDataset(
        local=shards, batch_size=GLOBAL_BATCH, shuffle=True, shuffle_seed=7
    )
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=GLOBAL_BATCH, collate_fn=lambda s: [x["id"] for x in s]
    )
    return [batch for _ in range(epochs) for batch in loader]


@pytest.fixture(scope="module")
def reference(streaming_env):
    """An uninterrupted one-rank run on the local shards."""
    run = streaming_env["base"] / "reference"
    _run(streaming_env, run)
    return run


@pytest.mark.slow
def test_fit_trains_on_streamings_own_order(streaming_env, reference):
    expected = _streaming_order(streaming_env["shards"])  # the package's own order, in-process
    records = _steps(reference)
    assert [r["step"] for r in records] == list(range(1, 41))
    assert [r["ids"] for r in records] == expected
    assert [r["epoch"] for r in records] == [0] * 20 + [1] * 20
    for epoch in range(2):  # each epoch is a permutation of the data set
        ids = sum((r["ids"] for r in records[20 * epoch : 20 * epoch + 20]), [])
        assert sorted(ids) == list(range(NUM_SAMPLES))


def _killed_and_resumed(streaming_env, run, kills, **kwargs):
    for kill_at in kills:
        _run(streaming_env, run, kill_at=kill_at, **kwargs)
    return run


@pytest.mark.slow
def test_sigkill_mid_epoch_resumes_exactly_through_streamings_state(streaming_env, reference):
    run = streaming_env["base"] / "killed"
    # every 5ba: killed after 22 -> resumes at the epoch boundary (20); after 33 -> from 30, mid-
    # epoch. (A save after a mid-epoch resume is checked by the two-rank test.)
    _killed_and_resumed(streaming_env, run, [22, 33])
    assert _saved_data_state(run) == {
        "epoch": 1,
        "sample_in_epoch": 10 * GLOBAL_BATCH,
        "num_canonical_nodes": 1,
        "shuffle_seed": 7,
        "initial_physical_nodes": 1,
    }
    _run(streaming_env, run)
    records = _steps(run)
    starts = [
        r["step"] for i, r in enumerate(records) if i == 0 or r["pid"] != records[i - 1]["pid"]
    ]
    assert starts == [1, 21, 31]  # each process started right after the checkpoint: no replay
    assert _last_per_step(records) == _last_per_step(_steps(reference))
    expected, got = _params(reference), _params(run)
    assert all(torch.equal(expected[k], got[k]) for k in expected)  # bit-identical


@pytest.fixture(scope="module")
def s3_server(streaming_env):
    """moto's S3 server on loopback with a bucket; yields the environment that points at it."""
    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("moto")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "S3_ENDPOINT_URL": endpoint,  # where Streaming's S3 downloader and uploader go
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        deadline = time.time() + 60
        while True:
            try:
                client.create_bucket(Bucket=BUCKET)
                break
            except Exception:
                if time.time() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.2)
        yield env, client
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.slow
def test_shards_on_s3_train_and_resume_like_the_local_ones(
    streaming_env, reference, s3_server, monkeypatch
):
    env, client = s3_server
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    remote = f"s3://{BUCKET}/digits"
    _write_shards((str(streaming_env["base"] / "upload"), remote))  # MDSWriter uploads them
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix="digits/")
    names = sorted(o["Key"] for o in listed["Contents"])
    assert "digits/index.json" in names and len(names) > 2
    run = streaming_env["base"] / "s3-run"
    # A restarted job has an empty cache: each process downloads into its own local directory.
    for i, kill_at in enumerate([27, -1]):
        cache = streaming_env["base"] / f"s3-cache-{i}"
        _run(streaming_env, run, kill_at=kill_at, remote=remote, cache=cache, extra=env)
        assert any(name.endswith(".mds") for name in os.listdir(cache))  # downloaded shards
    records = _steps(run)
    assert [r["step"] for r in records if r["pid"] == records[-1]["pid"]][0] == 26
    assert _last_per_step(records) == _last_per_step(_steps(reference))
    expected, got = _params(reference), _params(run)
    assert all(torch.equal(expected[k], got[k]) for k in expected)


@pytest.mark.slow
def test_two_ranks_read_their_own_parts_resume_exactly_and_resume_on_one_rank(
    streaming_env, reference
):
    full = streaming_env["base"] / "two-full"
    _run(streaming_env, full, ranks=2)
    one = _last_per_step(_steps(reference))
    rank0, rank1 = (_last_per_step(_steps(full, r)) for r in (0, 1))
    for step in one:  # disjoint halves whose union is the one-rank global batch
        assert len(rank0[step]) == len(rank1[step]) == GLOBAL_BATCH // 2
        assert not set(rank0[step]) & set(rank1[step])
        assert sorted(rank0[step] + rank1[step]) == sorted(one[step])
    # Same samples per step, summed in another order: close to one rank, not bitwise.
    expected, got = _params(reference), _params(full)
    assert all(torch.allclose(expected[k], got[k], rtol=1e-4, atol=1e-5) for k in expected)

    killed = streaming_env["base"] / "two-killed"
    # Killed after 27 -> resumes from 25, mid-epoch; after 33 -> from 30, saved by that resumed
    # run: the saved sample_in_epoch counts from the epoch's start, not from the resume point.
    _killed_and_resumed(streaming_env, killed, [27, 33], ranks=2)
    assert _saved_data_state(killed)["sample_in_epoch"] == 10 * GLOBAL_BATCH
    on_one = streaming_env["base"] / "two-then-one"
    shutil.copytree(killed, on_one)
    _run(streaming_env, killed, ranks=2)
    assert _global(killed, 2) == _global(full, 2)
    expected, got = _params(full), _params(killed)
    assert all(torch.equal(expected[k], got[k]) for k in expected)  # same ranks: bit-identical

    _run(streaming_env, on_one, ranks=1)  # the 2-rank run's checkpoint, continued on one rank
    after = {s: ids for s, ids in _last_per_step(_steps(on_one)).items() if s > 30}
    assert sorted(after) == list(range(31, 41))
    full_global = _global(full, 2)
    assert all(sorted(after[s]) == sorted(full_global[s]) for s in after)  # the same samples
    expected, got = _params(full), _params(on_one)
    assert all(torch.allclose(expected[k], got[k], rtol=1e-4, atol=1e-5) for k in expected)
