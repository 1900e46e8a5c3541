"""`MemoryMonitor`: host memory (process RSS) and the accelerator's allocator statistics.

On CUDA the caching allocator's counters (allocated, reserved, their peaks, allocation retries --
a sign of fragmentation -- and out-of-memory events) come from `torch.cuda.memory_stats`, which
reads host-side bookkeeping and never synchronises the device. The process's resident set size is
always reported, so CPU runs get a number too.

Example:
    >>> functrain.fit(step, state, loader, duration="1ep", callbacks=[MemoryMonitor()])  # doctest: +SKIP
    # logs {"memory/cpu_rss_gib": 0.41, "memory/cpu_peak_rss_gib": 0.43, ...}
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from ..units import TimeLike
from .interval import LogCadence

GIB = float(1 << 30)


def process_memory() -> dict[str, float]:
    """This process's resident set size and its peak, in bytes (keys "rss", "peak_rss").

    Reads /proc/self/status on Linux; elsewhere the peak comes from `getrusage` (and the current
    value from psutil when it is installed).
    """
    out: dict[str, float] = {}
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    out["rss"] = float(line.split()[1]) * 1024
                elif line.startswith("VmHWM:"):
                    out["peak_rss"] = float(line.split()[1]) * 1024
    except OSError:
        pass
    if "peak_rss" not in out:
        try:
            import resource  # POSIX only

            peak = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
            out["peak_rss"] = peak if sys.platform == "darwin" else peak * 1024  # bytes vs KiB
        except ImportError:
            pass
    if "rss" not in out:
        try:
            import psutil

            out["rss"] = float(psutil.Process().memory_info().rss)
        except ImportError:
            pass
    return out


def cuda_memory(device: torch.device | int | None = None) -> dict[str, float]:
    """The CUDA caching allocator's statistics for `device` (bytes and counts).

    Returns:
        "allocated", "peak_allocated", "reserved", "peak_reserved" (bytes), "alloc_retries" and
        "ooms" (counts).
    """
    stats = torch.cuda.memory_stats(device)
    return {
        "allocated": float(stats.get("allocated_bytes.all.current", 0)),
        "peak_allocated": float(stats.get("allocated_bytes.all.peak", 0)),
        "reserved": float(stats.get("reserved_bytes.all.current", 0)),
        "peak_reserved": float(stats.get("reserved_bytes.all.peak", 0)),
        "alloc_retries": float(stats.get("num_alloc_retries", 0)),
        "ooms": float(stats.get("num_ooms", 0)),
    }


class MemoryMonitor:
    """Log memory use in GiB under "memory/...".

    Keys: "memory/cpu_rss_gib", "memory/cpu_peak_rss_gib" always; on CUDA also
    "memory/allocated_gib", "memory/peak_allocated_gib", "memory/reserved_gib",
    "memory/peak_reserved_gib", "memory/alloc_retries", "memory/ooms".

    Args:
        interval: when to log; None follows the loop's logging interval.
        device: the accelerator to watch; None: the device of the state's parameters.
    """

    def __init__(self, interval: TimeLike | None = None, device: torch.device | str | None = None):
        self.cadence = LogCadence(interval)
        self.device = torch.device(device) if device is not None else None

    def _device(self, ctx: Any) -> torch.device:
        if self.device is not None:
            return self.device
        params = ctx.state.params
        return next(iter(params.values())).device if params else torch.device("cpu")

    def measure(self, device: torch.device) -> dict[str, float]:
        """The current numbers for `device` (host memory included)."""
        values = {}
        host = process_memory()
        if "rss" in host:
            values["memory/cpu_rss_gib"] = host["rss"] / GIB
        if "peak_rss" in host:
            values["memory/cpu_peak_rss_gib"] = host["peak_rss"] / GIB
        if device.type == "cuda":
            stats = cuda_memory(device)
            for key in ("allocated", "peak_allocated", "reserved", "peak_reserved"):
                values[f"memory/{key}_gib"] = stats[key] / GIB
            values["memory/alloc_retries"] = stats["alloc_retries"]
            values["memory/ooms"] = stats["ooms"]
        elif device.type == "mps":
            values["memory/allocated_gib"] = torch.mps.current_allocated_memory() / GIB
            values["memory/reserved_gib"] = torch.mps.driver_allocated_memory() / GIB
        return values

    def batch_end(self, ctx: Any) -> None:
        if self.cadence.due(ctx):
            ctx.log(self.measure(self._device(ctx)))
