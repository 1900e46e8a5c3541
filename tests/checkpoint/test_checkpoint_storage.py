"""Storage URLs, and checkpoints on a real S3-compatible server (moto) started on loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
import torch
from ckpt_helpers import assert_same_state, blank_like, make_state

import functrain
from functrain import checkpoint
from functrain.checkpoint import Manager, storage
from functrain.checkpoint.errors import CheckpointNotCommittedError


def test_paths_and_file_urls_are_local(tmp_path):
    loc = storage.resolve(tmp_path / "run")
    assert loc.is_local and loc.kvstore == {"driver": "file", "path": f"{tmp_path}/run/"}
    assert storage.resolve(f"file://{tmp_path}/run") == loc
    assert loc.child("step_000000001").local_path == f"{tmp_path}/run/step_000000001"
    assert loc.child("step_1").sibling("step_1.tmp").url == f"{tmp_path}/run/step_1.tmp"


def test_fsync_can_be_turned_off_for_local_paths(tmp_path):
    loc = storage.resolve(tmp_path / "fast", {"fsync": False})
    assert not loc.fsync and loc.kvstore["context"] == {"file_io_sync": False}
    assert not loc.child("x").fsync  # inherited by the checkpoint's directories
    state = {"w": torch.arange(5.0), "step": 1}
    checkpoint.save(tmp_path / "fast", state, storage_options={"fsync": False})
    assert checkpoint.load(tmp_path / "fast", like={"w": torch.zeros(5), "step": 0})["step"] == 1
    with pytest.raises(ValueError, match="must be True or False"):
        storage.resolve(tmp_path, {"fsync": "no"})


def test_memory_and_gcs_urls():
    assert storage.resolve("memory://a/b").kvstore == {"driver": "memory", "path": "a/b/"}
    gcs = storage.resolve("gs://bucket/runs/x", {"user_project": "p"})
    assert gcs.kvstore == {
        "driver": "gcs",
        "bucket": "bucket",
        "path": "runs/x/",
        "user_project": "p",
    }
    assert gcs.child("step_1").url == "gs://bucket/runs/x/step_1"


def test_s3_endpoint_and_region_from_options_or_environment(monkeypatch):
    monkeypatch.setenv("FUNCTRAIN_S3_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    monkeypatch.delenv("AWS_REGION", raising=False)
    spec = storage.resolve("s3://bkt/p").kvstore
    assert spec == {
        "driver": "s3",
        "bucket": "bkt",
        "path": "p/",
        "endpoint": "http://127.0.0.1:9",
        "aws_region": "eu-west-1",
    }
    spec = storage.resolve("s3://bkt", {"endpoint": "http://h:1", "region": "us-east-2"}).kvstore
    assert (
        spec["endpoint"] == "http://h:1"
        and spec["aws_region"] == "us-east-2"
        and spec["path"] == ""
    )


@pytest.mark.parametrize(
    "url, options, message",
    [
        ("ftp://host/x", None, "unsupported storage URL"),
        ("s3:///prefix", None, "names no bucket"),
        ("file://host/x", None, "absolute path"),
        ("/tmp/x", {"endpoint": "http://h"}, "do not apply"),
    ],
)
def test_bad_urls_are_explained(url, options, message):
    with pytest.raises(ValueError, match=message):
        storage.resolve(url, options)


def test_child_refuses_nested_names():
    with pytest.raises(ValueError, match="single directory name"):
        storage.resolve("memory://x").child("a/b")


# -- a real S3-compatible server --------------------------------------------------------------

BUCKET = "functrain-ckpt"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def s3_server():
    """moto's S3 server on loopback, with a bucket; yields its endpoint URL."""
    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("moto")
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        deadline = time.time() + 60
        while True:
            try:
                client.create_bucket(Bucket=BUCKET)
                break
            except Exception:
                if time.time() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.2)
        yield endpoint, client
    finally:
        server.terminate()
        server.wait(timeout=30)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _keys(client, prefix: str) -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [obj["Key"] for page in pages for obj in page.get("Contents", [])]


def test_save_load_on_s3(s3_server):
    endpoint, client = s3_server
    options = {"endpoint": endpoint, "region": "us-east-1"}
    state = make_state()
    url = checkpoint.save(f"s3://{BUCKET}/single/ckpt", state, storage_options=options)
    assert url == f"s3://{BUCKET}/single/ckpt"
    keys = _keys(client, "single/ckpt/")
    assert "single/ckpt/COMMIT.json" in keys and "single/ckpt/params.fc.weight/zarr.json" in keys
    assert_same_state(checkpoint.load(url, like=blank_like(state), storage_options=options), state)


def _tiny(step: int) -> functrain.TrainState:
    return functrain.TrainState(
        step=step,
        params={"w": torch.full((4, 3), float(step)), "b": torch.arange(3, dtype=torch.bfloat16)},
        buffers={},
        opt_state=(),
        rng=functrain.RngState(seed=step),
    )


def test_manager_on_s3_retains_and_autoresumes(s3_server, monkeypatch):
    endpoint, client = s3_server
    monkeypatch.setenv("FUNCTRAIN_S3_ENDPOINT", endpoint)  # the endpoint from the environment
    root = f"s3://{BUCKET}/run"
    manager = Manager(root, every="1ba", keep_last=2, async_save=True)
    for step in (1, 2, 3):
        manager.save(_tiny(step))
    manager.wait()
    assert sorted({k.split("/")[1] for k in _keys(client, "run/step_")}) == [
        "step_000000002",
        "step_000000003",
    ]
    # An interrupted save on an object store: files without the commit marker.
    client.put_object(Bucket=BUCKET, Key="run/step_000000050/tree.json", Body=b"{}")
    manager.close()
    with pytest.raises(CheckpointNotCommittedError, match="COMMIT.json"):
        checkpoint.load(f"{root}/step_000000050", like=_tiny(0))
    resumed = Manager(root, every="1ba", keep_last=2)
    assert resumed.latest() == f"{root}/step_000000003"
    assert_same_state(resumed.restore(blank_like(_tiny(3))), _tiny(3))
    # The run that owns the root cleans up what interrupted saves left, already at restore.
    assert not _keys(client, "run/step_000000050/")
    resumed.save(_tiny(4))
    resumed.close()
    assert sorted({k.split("/")[1] for k in _keys(client, "run/step_")}) == [
        "step_000000003",
        "step_000000004",
    ]


def test_corrupted_object_is_detected_on_s3(s3_server):
    endpoint, client = s3_server
    options = {"endpoint": endpoint}
    state = {"w": torch.arange(6.0)}
    url = checkpoint.save(f"s3://{BUCKET}/corrupt/ckpt", state, storage_options=options)
    key = next(k for k in _keys(client, "corrupt/ckpt/w/c/"))
    body = bytearray(client.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    body[0] ^= 0xFF
    client.put_object(Bucket=BUCKET, Key=key, Body=bytes(body))
    with pytest.raises(checkpoint.CheckpointCorruptError, match="corrupt/ckpt/w"):
        checkpoint.load(url, like={"w": torch.zeros(6)}, storage_options=options)
