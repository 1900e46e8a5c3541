"""Test-suite settings: hypothesis profiles and the `gpu` marker."""

import json
import os

import pytest
import torch
from hypothesis import HealthCheck, settings

# CI runs derandomized so a failure reproduces; locally hypothesis explores new examples.
settings.register_profile(
    "ci", deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
# `python -m bench mutants` runs a module's tests once per mutant: few examples, derandomized (a
# survivor reproduces), no example database (the scratch copy is thrown away).
MUTANT_EXAMPLES = 10
settings.register_profile(
    "mutants",
    max_examples=MUTANT_EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
PROFILE = os.environ.get("FUNCTRAIN_HYPOTHESIS_PROFILE") or (
    "ci" if os.environ.get("CI") else "dev"
)
settings.load_profile(PROFILE)

# One intra-op thread: tests are small, multi-rank tests start several processes on 2 cores, and
# oversubscribed threads made single convolutions tens of times slower here.
torch.set_num_threads(1)


def pytest_addoption(parser):
    parser.addoption(
        "--mutant-durations",
        help="bench mutants: a JSON file of each test's seconds; written by the unmutated run "
        "when missing, else the tests run fastest first (a mutant is usually killed in a second)",
    )


def pytest_collection_modifyitems(config, items):
    if PROFILE == "mutants":
        _cap_examples(items)
        _fastest_first(config, items)
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def _cap_examples(items):
    """At most MUTANT_EXAMPLES examples per property test, also where a test sets its own count
    (`@settings(max_examples=...)` overrides a profile)."""
    for item in items:
        test = getattr(item, "obj", None)
        test = getattr(test, "__func__", test)  # a test method: its function holds the settings
        own = getattr(test, "_hypothesis_internal_use_settings", None)
        if own is not None and own.max_examples > MUTANT_EXAMPLES:
            test._hypothesis_internal_use_settings = settings(own, max_examples=MUTANT_EXAMPLES)


def _fastest_first(config, items):
    path = config.getoption("--mutant-durations")
    if path and os.path.exists(path):
        with open(path) as f:
            seconds = json.load(f)
        items.sort(key=lambda item: seconds.get(item.nodeid, 0.0))  # stable: file order on ties


_durations: dict[str, float] = {}


def pytest_runtest_logreport(report):
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session):
    path = session.config.getoption("--mutant-durations")
    if PROFILE == "mutants" and path and not os.path.exists(path):
        with open(path, "w") as f:
            json.dump(_durations, f)
