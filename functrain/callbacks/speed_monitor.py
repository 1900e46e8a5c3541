"""`SpeedMonitor`: throughput (batches, samples, tokens per second) and model FLOPs utilisation.

Rates are measured over a sliding window of recent batches from host clocks and the timestamp's
counters (Python ints), so measuring never waits for the device; over a window the host cannot
run ahead of the device by more than its queue, so the average is right. Time spent in evaluation
is left out of training throughput.

MFU (model FLOPs utilisation) is `achieved model FLOP/s / (peak FLOP/s per device * devices)`. It
needs the model's FLOPs per sample (forward + backward; ~6 * parameters * tokens per sample for a
transformer) and the device's peak, given or looked up for known GPUs.

Example:
    >>> SpeedMonitor(window_size=50, flops_per_sample=6 * n_params * seq_len)  # doctest: +SKIP
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any

import torch

from ..units import TimeLike
from .interval import LogCadence

# Dense (no sparsity) peak FLOP/s from the vendors' data sheets, per precision. Matched by
# substring of the lower-cased device name, first match wins (so "h100 pcie" precedes "h100").
PEAK_FLOPS: list[tuple[str, dict[str, float]]] = [
    ("h200", {"fp64": 67e12, "fp32": 67e12, "tf32": 494.5e12, "bf16": 989.5e12, "fp16": 989.5e12, "fp8": 1979e12}),
    ("h100 pcie", {"fp64": 51e12, "fp32": 51e12, "tf32": 378e12, "bf16": 756e12, "fp16": 756e12, "fp8": 1513e12}),
    ("h100", {"fp64": 67e12, "fp32": 67e12, "tf32": 494.5e12, "bf16": 989.5e12, "fp16": 989.5e12, "fp8": 1979e12}),
    ("a100", {"fp64": 19.5e12, "fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12}),
    ("l40s", {"fp32": 91.6e12, "tf32": 183e12, "bf16": 362e12, "fp16": 362e12, "fp8": 733e12}),
    ("a10", {"fp32": 31.2e12, "tf32": 62.5e12, "bf16": 125e12, "fp16": 125e12}),
    ("l4", {"fp32": 30.3e12, "tf32": 60e12, "bf16": 121e12, "fp16": 121e12, "fp8": 242e12}),
    ("v100", {"fp64": 7.8e12, "fp32": 15.7e12, "fp16": 125e12}),
    ("t4", {"fp32": 8.1e12, "fp16": 65e12}),
]  # fmt: skip


def device_peak_flops(
    device: torch.device | str | None = None, dtype: str = "bf16"
) -> float | None:
    """The dense peak FLOP/s of a known GPU in a precision, or None when unknown (CPUs included).

    Args:
        device: a CUDA device (default: the current one).
        dtype: "fp64", "fp32", "tf32", "bf16", "fp16" or "fp8".
    Returns:
        FLOP/s, or None.
    Example:
        >>> device_peak_flops("cpu") is None
        True
    """
    device = torch.device(device) if device is not None else None
    if device is not None and device.type != "cuda":
        return None
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device).lower()
    for pattern, table in PEAK_FLOPS:
        if pattern in name:
            return table.get(dtype)
    return None


class SpeedMonitor:
    """Log throughput and, when FLOPs are known, MFU.

    Logged keys: "throughput/batches_per_sec", "throughput/samples_per_sec",
    "throughput/tokens_per_sec" (when tokens are counted), the same per device under
    "throughput/device/...", "throughput/flops_per_sec", "throughput/device/flops_per_sec",
    "throughput/mfu", and "wall_clock/train", "wall_clock/eval", "wall_clock/total" (seconds).

    Args:
        window_size: batches in the sliding window the rates are averaged over.
        flops_per_sample: model FLOPs (forward + backward) per sample, or a callable
            `batch -> FLOPs of this rank's batch` for variable-size batches. None: no FLOPs/MFU.
        peak_flops: peak FLOP/s of one device; None looks the device up (`device_peak_flops`).
        peak_dtype: the precision for the look-up ("bf16", "fp16", "tf32", "fp32", "fp8").
        interval: when to log; None follows the loop's logging interval.
    """

    def __init__(
        self,
        window_size: int = 100,
        flops_per_sample: float | Callable[[Any], float] | None = None,
        peak_flops: float | None = None,
        peak_dtype: str = "bf16",
        interval: TimeLike | None = None,
    ):
        if window_size < 2:
            raise ValueError(
                f"SpeedMonitor needs window_size >= 2 to measure a rate, got {window_size}"
            )
        self.window_size = window_size
        self.flops_per_sample = flops_per_sample
        self.peak_flops = peak_flops
        self.peak_dtype = peak_dtype
        self.cadence = LogCadence(interval)
        # (train seconds, batches, samples, tokens, flops) at the end of recent batches.
        self._window: collections.deque = collections.deque(maxlen=window_size)
        self._flops = 0.0
        self._train_sec_before = 0.0  # from earlier fit calls / before a resume
        self._eval_sec = 0.0
        self._eval_sec_this_fit = 0.0
        self._fit_began: float | None = None
        self._eval_began: float | None = None
        self._peak: float | None = None

    def _train_clock(self) -> float:
        """Seconds of training in this fit call so far, evaluation left out."""
        began = time.perf_counter() if self._fit_began is None else self._fit_began
        return time.perf_counter() - began - self._eval_sec_this_fit

    def fit_start(self, ctx: Any) -> None:
        self._fit_began = time.perf_counter()
        self._eval_sec_this_fit = 0.0
        self._window.clear()  # no rate across the gap between fit calls
        self._peak = self.peak_flops
        if self._peak is None and self.flops_per_sample is not None and ctx.state.params:
            device = next(iter(ctx.state.params.values())).device
            self._peak = device_peak_flops(device, self.peak_dtype)

    def eval_start(self, ctx: Any) -> None:
        self._eval_began = time.perf_counter()

    def eval_end(self, ctx: Any) -> None:
        if self._eval_began is not None:
            spent = time.perf_counter() - self._eval_began
            self._eval_sec += spent
            self._eval_sec_this_fit += spent
            self._eval_began = None

    def batch_end(self, ctx: Any) -> None:
        if self._fit_began is None:  # used without fit_start: start the clock now
            self.fit_start(ctx)
        ts = ctx.timestamp
        if callable(self.flops_per_sample):
            world = getattr(ctx, "world_size", 1) or 1
            self._flops += float(self.flops_per_sample(ctx.batch)) * world
        elif self.flops_per_sample is not None:
            self._flops = float(self.flops_per_sample) * ts.sample
        self._window.append((self._train_clock(), ts.batch, ts.sample, ts.token, self._flops))
        if self.cadence.due(ctx):
            values = self.measure(getattr(ctx, "world_size", 1) or 1)
            if values:
                ctx.log(values)

    def measure(self, world_size: int = 1) -> dict[str, float]:
        """The current rates (empty until the window holds two batches)."""
        train_sec = self._train_sec_before + (self._train_clock() if self._fit_began else 0.0)
        values = {
            "wall_clock/train": train_sec,
            "wall_clock/eval": self._eval_sec,
            "wall_clock/total": train_sec + self._eval_sec,
        }
        if len(self._window) < 2:
            return values
        (t0, b0, s0, k0, f0), (t1, b1, s1, k1, f1) = self._window[0], self._window[-1]
        seconds = t1 - t0
        if seconds <= 0:
            return values
        rates = {"batches_per_sec": (b1 - b0) / seconds, "samples_per_sec": (s1 - s0) / seconds}
        if k1 > k0:
            rates["tokens_per_sec"] = (k1 - k0) / seconds
        if self.flops_per_sample is not None:
            rates["flops_per_sec"] = (f1 - f0) / seconds
        for name, rate in rates.items():
            values[f"throughput/{name}"] = rate
            if name != "batches_per_sec":
                values[f"throughput/device/{name}"] = rate / world_size
        if self._peak and "flops_per_sec" in rates:
            values["throughput/mfu"] = rates["flops_per_sec"] / (self._peak * world_size)
        return values

    def fit_end(self, ctx: Any) -> None:
        if self._fit_began is not None:
            self._train_sec_before += self._train_clock()
            self._fit_began = None

    def state_dict(self) -> dict[str, float]:
        """Wall-clock totals, so they keep counting across a resume."""
        train_sec = self._train_sec_before + (self._train_clock() if self._fit_began else 0.0)
        return {"train_sec": train_sec, "eval_sec": self._eval_sec}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self._train_sec_before = float(state.get("train_sec", 0.0))
        self._eval_sec = float(state.get("eval_sec", 0.0))
        if self._fit_began is not None:  # restored mid-fit: count this fit's time on top
            self._train_sec_before -= self._train_clock()
