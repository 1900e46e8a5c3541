"""MemoryMonitor: process RSS on CPU, allocator statistics on CUDA."""

from __future__ import annotations

import mmap

import pytest
import torch

from functrain.callbacks import MemoryMonitor, cuda_memory, process_memory


def test_process_memory_sees_a_new_allocation():
    before = process_memory()
    assert before["rss"] > 0 and before["peak_rss"] >= before["rss"] * 0.99
    # 64 MiB of fresh pages, written so they are resident. An anonymous mapping, not a tensor:
    # after other tests the allocator may hand back memory that is resident already.
    block = mmap.mmap(-1, 64 * 2**20)
    block.write(b"\1" * len(block))
    after = process_memory()
    assert after["rss"] - before["rss"] > 48 * 2**20
    assert after["peak_rss"] >= after["rss"] * 0.99
    block.close()


def test_logs_host_memory_on_cpu(make_ctx, advance, recorder):
    ctx = make_ctx(loggers=[recorder], log_interval="2ba")
    monitor = MemoryMonitor()
    for _ in range(4):
        monitor.batch_end(advance(ctx))
    assert [step for step, _ in recorder.calls] == [2, 4]
    values = recorder.calls[-1][1]
    assert set(values) == {"memory/cpu_rss_gib", "memory/cpu_peak_rss_gib"}
    assert 0.01 < values["memory/cpu_rss_gib"] < 64


@pytest.mark.gpu
def test_cuda_allocator_statistics(make_ctx, advance, recorder):
    ctx = make_ctx(loggers=[recorder])
    monitor = MemoryMonitor(device="cuda")
    before = cuda_memory()["allocated"]
    block = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    monitor.batch_end(advance(ctx))
    values = recorder.calls[-1][1]
    assert values["memory/allocated_gib"] * 2**30 - before >= 256 * 2**20
    assert values["memory/peak_allocated_gib"] >= values["memory/allocated_gib"]
    assert values["memory/reserved_gib"] >= values["memory/allocated_gib"]
    assert values["memory/ooms"] == 0
    del block
