"""Helpers for the tests that kill an example script and resume it: load an example as a module,
run it in a subprocess that pauses at a checkpoint until it is killed, compare states.

    python -c "...; example_runs.run_paused('gan_digits', [...], marker, at_batch)"
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import random
import signal
import subprocess
import sys
import time

import torch

from functrain.tree import leaves_with_paths

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TESTS = ROOT / "tests"


def load_example(name: str):
    """The example script `examples/<name>.py` as a module (its folder on sys.path)."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))  # the scripts import _common from their folder
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class PauseAtCheckpoint:
    """At the first checkpoint at or after batch `at`: touch `marker` and wait to be killed.

    The save was just handed to the manager's background thread, so a kill soon after lands
    inside an asynchronous save or just after it.
    """

    def __init__(self, marker: str, at: int):
        self.marker, self.at = marker, at

    def checkpoint(self, ctx):
        if ctx.timestamp.batch >= self.at:
            pathlib.Path(self.marker).touch()
            time.sleep(600)


def run_paused(name: str, argv: list[str], marker: str, at: int) -> None:
    """Worker: run example `name` with `argv`, pausing at its checkpoint of batch >= `at`."""
    load_example(name).main(argv, callbacks=[PauseAtCheckpoint(marker, at)])


def kill_at_checkpoint(name: str, argv: list[str], tmp_path, at: int, seed: int) -> None:
    """Run example `name` in a subprocess and SIGKILL it a random moment after its checkpoint at
    batch >= `at`; asserts that it was killed (not finished)."""
    marker = tmp_path / "paused"
    code = (
        f"import sys; sys.path[:0] = [{str(TESTS)!r}, {str(ROOT)!r}]; import example_runs; "
        f"example_runs.run_paused({name!r}, {argv!r}, {str(marker)!r}, {at})"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        deadline = time.monotonic() + 300
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert marker.exists(), f"the run never reached batch {at} (exit code {proc.poll()})"
        time.sleep(random.Random(seed).uniform(0.0, 0.05))
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()


def tensor_leaves(tree) -> dict[str, torch.Tensor]:
    """`{dotted path: tensor}` of a pytree's tensor leaves (DTensors in full)."""
    out = {}
    for path, leaf in leaves_with_paths(tree):
        if isinstance(leaf, torch.Tensor):
            out[path] = leaf.full_tensor() if hasattr(leaf, "full_tensor") else leaf
    return out


def assert_same_tensors(a: dict, b: dict, atol: float = 0.0) -> None:
    """Same keys; equal tensors (bit for bit when atol is 0)."""
    assert sorted(a) == sorted(b)
    for key in a:
        x, y = a[key].detach().cpu(), b[key].detach().cpu()
        if atol == 0.0:
            assert torch.equal(x, y), key
        else:
            assert torch.allclose(x.double(), y.double(), atol=atol, rtol=0), (
                key,
                float((x.double() - y.double()).abs().max()),
            )


def launch(script: str, argv: list[str], n: int = 2, timeout: float = 300):
    """`python -m functrain.launch -n N examples/<script>.py argv` (completed process)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "functrain.launch", "-n", str(n), str(EXAMPLES / f"{script}.py")]
    return subprocess.run(
        cmd + argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=str(ROOT)
    )
