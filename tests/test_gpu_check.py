"""bench/gpu_check.py: skips cleanly without CUDA, prints one table, and its checks run (as a
dry run on the CPU, for those that can)."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def run(*args):
    return subprocess.run(
        [sys.executable, "-m", "bench", "gpu_check", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the checks would run")
def test_without_cuda_every_check_is_skipped_in_one_table_and_it_exits_0():
    from bench.gpu_check import CHECKS

    proc = run()
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("|")]
    assert lines[0].split("|")[1].strip() == "check"
    rows = lines[2:]
    assert len(rows) == len(CHECKS) >= 6
    assert all("skipped" in row and "no CUDA device" in row for row in rows)


def test_checks_are_named_functions_and_unknown_names_are_refused():
    from bench.gpu_check import CHECKS

    names = [c.name for c in CHECKS]
    assert len(set(names)) == len(names) and all(callable(c.run) for c in CHECKS)
    assert {"gpt_bf16_eager", "gpt_bf16_compiled", "microbatch_auto_oom", "async_checkpoint",
            "cuda_memory_monitor", "fsdp_one_rank", "fsdp_offload"} <= set(names)  # fmt: skip
    proc = run("--only", "no_such_check")
    assert proc.returncode == 2 and "unknown check" in proc.stderr


def test_dry_run_on_the_cpu_of_the_checks_that_can_run_there():
    tiny = ["--layers", "1", "--width", "32", "--heads", "2", "--context", "16", "--batch", "2",
            "--vocab", "64", "--steps", "3"]  # fmt: skip
    only = "gpt_bf16_eager,fsdp_one_rank,fsdp_offload,restore_speed"
    proc = run("--device", "cpu", "--only", only, *tiny, "--restore-mb", "4", "--restore-reps", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    rows = [
        line
        for line in proc.stdout.splitlines()
        if line.startswith(("| gpt", "| fsdp", "| restore"))
    ]
    assert len(rows) == 4 and all("| ok " in row for row in rows), proc.stdout
    assert "restored exactly on the device: True" in rows[3], rows[3]
    assert "host: True" in rows[2] and "restored pinned on host: True" in rows[2], rows[2]
    assert "tok/s" in rows[0] and "fused AdamW calls: " in rows[0]
