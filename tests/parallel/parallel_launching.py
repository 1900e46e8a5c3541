"""Helpers for tests that start real processes with `python -m functrain.launch`."""

from __future__ import annotations

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
_LAUNCH_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def launched_world() -> int | None:
    """The launcher's world size when this process is one of its ranks, else None."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["WORLD_SIZE"])
    return None


def clean_env(extra_path: str | None = None) -> dict:
    """This environment minus any launcher's variables (a nested launch starts its own world)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _LAUNCH_VARS and not k.startswith("TORCHELASTIC")
    }
    paths = [p for p in (extra_path, ROOT, env.get("PYTHONPATH")) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def launch(n: int, args: list[str], timeout: float = 400, extra_path: str | None = None):
    """`python -m functrain.launch -n N args...` in a clean environment; the CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-m", "functrain.launch", "-n", str(n), *args],
        env=clean_env(extra_path),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def launched_results(
    tmp_path_factory, worker: str, timeout: float = 400, with_dir: bool = False
) -> dict:
    """Launch `tests/parallel/<worker>` once on 2 ranks and return the JSON rank 0 wrote to its
    `--out` (`with_dir`: the worker also gets `--dir`, a fresh folder). Skips inside a launched
    world (no nested launch); fails the test with the ranks' stderr when the launch fails."""
    import json

    import pytest

    if launched_world() is not None:
        pytest.skip("starts its own 2-rank launch")
    work = tmp_path_factory.mktemp(os.path.splitext(worker)[0])
    out = work / "results.json"
    args = [os.path.join(HERE, worker), "--out", str(out)]
    proc = launch(2, args + (["--dir", str(work)] if with_dir else []), timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"2-rank run failed:\n{proc.stderr[-6000:]}")
    return json.loads(out.read_text())


def run_python(args: list[str], timeout: float = 120, extra_path: str | None = None):
    """`python args...` (one process, no launcher) in a clean environment."""
    return subprocess.run(
        [sys.executable, *args],
        env=clean_env(extra_path),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def finish_worker(rank: int, out: str, results) -> int:
    """A multi-rank worker's last lines: rank 0 writes `results` as JSON to `out`, every rank
    shuts its process group down; returns the exit code 0."""
    import json

    from functrain import parallel as fdist

    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f, indent=1)
    fdist.shutdown()
    return 0
