"""Test-suite settings: hypothesis profiles and the `gpu` marker."""

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

# CI runs derandomized so a failure reproduces; locally hypothesis explores new examples.
settings.register_profile(
    "ci", deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# One intra-op thread: tests are small, multi-rank tests start several processes on 2 cores, and
# oversubscribed threads made single convolutions tens of times slower here.
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
