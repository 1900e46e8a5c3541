"""An object-store root that cannot be reached fails when it is opened, bounded, naming the fix.

Issue 30: an `s3://` root without an endpoint hung over 120 s with no message. No test here
needs the network: a machine without it (CI's) is exactly the case, and the other two use
loopback sockets that refuse or never answer.
"""

from __future__ import annotations

import socket

import pytest

import functrain.checkpoint as checkpoint
from functrain.checkpoint import storage
from functrain.checkpoint.errors import CheckpointStorageError
from functrain.checkpoint.reachable import check_reachable

_ENDPOINT_VARS = ("FUNCTRAIN_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")


@pytest.fixture
def no_endpoint(monkeypatch):
    """No endpoint in the environment, and no way to reach AWS (a proxy that refuses)."""
    for var in _ENDPOINT_VARS:
        monkeypatch.delenv(var, raising=False)
    with socket.socket() as sock:  # a closed port: every connection to it is refused at once
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(var, f"http://127.0.0.1:{port}")
    for var in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)


def test_s3_root_without_endpoint_names_the_option(no_endpoint, tmp_path):
    with pytest.raises(CheckpointStorageError) as info:
        checkpoint.Manager("s3://functrain-no-such-bucket/run", every="1ba")
    message = str(info.value)
    assert "s3://functrain-no-such-bucket/run" in message
    assert "no S3 endpoint was given" in message
    assert "storage_options={'endpoint'" in message and "FUNCTRAIN_S3_ENDPOINT" in message


def test_latest_on_unreachable_s3_root_raises(no_endpoint):
    with pytest.raises(CheckpointStorageError, match="endpoint"):
        checkpoint.latest("s3://functrain-no-such-bucket/run")


def test_refused_endpoint_is_named():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with pytest.raises(CheckpointStorageError) as info:
        checkpoint.Manager("s3://bucket/run", storage_options={"endpoint": endpoint})
    assert f"the S3 endpoint {endpoint} failed" in str(info.value)


def test_silent_endpoint_times_out():
    # A server that takes the connection and never answers: the wait is bounded by the timeout.
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        endpoint = f"http://127.0.0.1:{server.getsockname()[1]}"
        loc = storage.resolve("s3://bucket/run", {"endpoint": endpoint})
        with pytest.raises(CheckpointStorageError, match=r"did not answer within 0.5 s"):
            check_reachable(loc, timeout=0.5)


def test_local_and_memory_roots_are_not_contacted(tmp_path):
    check_reachable(storage.resolve(tmp_path / "missing"))
    check_reachable(storage.resolve("memory://nowhere"))
