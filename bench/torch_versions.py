"""The declared torch range, tested: one venv per torch version, the core test subset in each.

`pyproject.toml` declares `torch>=X`; this suite checks that claim instead of trusting it. For each
version (default: the oldest declared, `X.0`, and the newest the registry serves that this
workplace allows, 2.14.1) it makes a virtual environment outside the repository, installs that
torch and the project (`-e ".[test]"`) into it, runs the core subset of the tests (step, optim,
parallel, compile, loop, teardown, checkpoint reader and resume) and prints one row per version.
The rows go to bench/results/torch_versions.json and docs/torch_versions.md.

Too heavy for `.ci/run`: each torch is a multi-GB install (a CUDA build, run on the CPU here).
Run it when the torch range or a private torch name (functrain/_torch.py) changes. Each run's
whole output is kept as `last-run.log` in its venv.

Example:
    python -m bench torch_versions                      # oldest declared and 2.14.1
    python -m bench torch_versions --versions 2.6.0 --install-only
    python -m bench torch_versions --versions 2.13.0 --venvs /tmp/tv
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NEWEST = "2.14.1"
CORE_SUBSET = [
    "tests/test_step.py",
    "tests/test_step_checks.py",
    "tests/test_step_plan.py",
    "tests/test_step_protocol.py",
    "tests/test_step_skip.py",
    "tests/optim",
    "tests/parallel",
    "tests/test_compile.py",
    "tests/test_loop.py",
    "tests/test_teardown.py",
    "tests/checkpoint/test_checkpoint_reader.py",
    "tests/checkpoint/test_checkpoint_resume.py",
]
NOTES = "## Notes"  # docs/torch_versions.md keeps its text from this heading on
# Outside the repository on purpose: a venv is gigabytes and must never be committed.
DEFAULT_VENVS = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "functrain-torch"


def oldest_declared(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """The lower bound of the `torch>=` requirement in pyproject.toml, as `X.Y.0`.

    Example:
        >>> oldest_declared()   # with "torch>=2.6" declared
        '2.6.0'
    """
    match = re.search(r'"torch>=([0-9.]+)[",]', pyproject.read_text())
    if match is None:
        raise SystemExit("pyproject.toml declares no `torch>=` lower bound to test")
    parts = (match.group(1).split(".") + ["0", "0"])[:3]
    return ".".join(parts)


def ensure_venv(version: str, venvs: Path) -> Path:
    """A venv with torch==`version` and the project installed; returns its python.

    The project is installed again when pyproject.toml changed since (a new dependency).
    """
    home = venvs / f"torch-{version}"
    python = home / "bin" / "python"
    marker = home / ".functrain-installed"
    project = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]
    if marker.exists() and marker.read_text().split()[1:] == [project]:
        return python
    pip = [str(python), "-m", "pip", "install", "-q"]
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(home)], check=True)
        subprocess.run(pip + [f"torch=={version}"], check=True)
    # The same torch stays pinned while the project's extras resolve.
    (home / "constraints.txt").write_text(f"torch=={version}\n")
    subprocess.run(pip + ["-c", str(home / "constraints.txt"), "-e", f"{ROOT}[test]"], check=True)
    marker.write_text(f"{version} {project}")
    return python


def run_subset(python: Path, timeout_s: float) -> dict:
    """Run the core subset with `python`; returns counts, seconds and the closing line."""
    start = time.perf_counter()
    proc = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *CORE_SUBSET],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    # The whole output stays beside the venv (outside the repository) for reading the failures.
    (python.parent.parent / "last-run.log").write_text(proc.stdout + proc.stderr)
    closing = [line for line in proc.stdout.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    line = closing[-1].strip("= ") if closing else proc.stdout[-300:]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|errors?|skipped)", line)}
    version = subprocess.run(
        [str(python), "-c", "import torch; print(torch.__version__)"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return {
        "torch": version,
        "exit_code": proc.returncode,
        "seconds": round(time.perf_counter() - start, 1),
        "passed": counts.get("passed", 0),
        "failed": counts.get("failed", 0),
        "errors": counts.get("errors", counts.get("error", 0)),
        "skipped": counts.get("skipped", 0),
        "closing_line": line,
    }


def write_table(rows: list[dict]) -> str:
    """The markdown table of `rows` (also written to docs/torch_versions.md)."""
    lines = [
        "| torch | passed | failed | errors | skipped | seconds |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['torch']} | {r['passed']} | {r['failed']} | {r['errors']} | {r['skipped']} "
            f"| {r['seconds']} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench torch_versions")
    parser.add_argument("--versions", nargs="*", default=None, help="torch versions to test")
    parser.add_argument("--venvs", type=Path, default=DEFAULT_VENVS, help="where the venvs live")
    parser.add_argument("--install-only", action="store_true", help="make the venvs, run nothing")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per version")
    opts = parser.parse_args(argv)
    versions = opts.versions or [oldest_declared(), NEWEST]
    if ROOT in opts.venvs.resolve().parents:
        raise SystemExit(f"--venvs {opts.venvs} is inside the repository; choose a folder outside")
    rows = []
    for version in versions:
        python = ensure_venv(version, opts.venvs)
        if opts.install_only:
            print(f"torch {version}: venv ready at {python.parent.parent}")
            continue
        row = run_subset(python, opts.timeout)
        rows.append(row)
        print(f"torch {row['torch']:<16} {row['closing_line']}", flush=True)
    if not rows:
        return 0
    table = write_table(rows)
    print(table)
    out = ROOT / "bench" / "results" / "torch_versions.json"
    out.write_text(json.dumps({"subset": CORE_SUBSET, "rows": rows}, indent=2) + "\n")
    doc = ROOT / "docs" / "torch_versions.md"
    # The hand-written notes below the table (from a "## Notes" heading on) survive a rerun.
    old = doc.read_text() if doc.exists() else ""
    notes = old[old.index(NOTES) :] if NOTES in old else ""
    doc.write_text(
        "# The torch versions the core suite was run on\n\n"
        "Written by `python -m bench torch_versions` (one venv per torch version, the core test "
        "subset in each: " + ", ".join(f"`{p}`" for p in CORE_SUBSET) + "). The range "
        "`pyproject.toml` declares is the range in this table.\n\n"
        + table
        + "\n"
        + ("\n" + notes if notes else "")
    )
    return 0 if all(r["failed"] == 0 and r["errors"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
