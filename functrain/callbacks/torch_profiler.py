"""`TorchProfiler`: record a window of training steps with `torch.profiler` as a Chrome trace.

The profiler follows torch's schedule: skip `skip_first` steps (compilation and warm-up belong
elsewhere), then per cycle wait `wait` steps, warm up `warmup` steps (recording, then discarded)
and record `active` steps, `repeat` times. Each recorded window is written as
`<trace_dir>/rank<r>_step<s>.json` (open it in https://ui.perfetto.dev or chrome://tracing; a
".json.gz" is written with `compress=True`). CUDA activity is recorded when the state lives on
CUDA.

Example:
    >>> prof = TorchProfiler(skip_first=5, wait=0, warmup=1, active=3)
    >>> functrain.fit(step, state, loader, duration="20ba", callbacks=[prof])  # doctest: +SKIP
    >>> prof.traces  # doctest: +SKIP
    [PosixPath('run/traces/rank0_step9.json')]
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch


class TorchProfiler:
    """Profile a window of steps and write Chrome traces.

    Args:
        skip_first: steps skipped before the first cycle.
        wait: steps idle at the start of each cycle.
        warmup: steps recorded and discarded (the profiler's own start-up cost).
        active: steps recorded per cycle.
        repeat: cycles (0: until the run ends).
        trace_dir: where traces go; None: `RUN_DIR/traces` (else ./traces).
        record_shapes / profile_memory / with_stack / with_flops: `torch.profiler.profile`'s
            options of the same names.
        compress: write `.json.gz` instead of `.json`.
    """

    def __init__(
        self,
        skip_first: int = 1,
        wait: int = 0,
        warmup: int = 1,
        active: int = 3,
        repeat: int = 1,
        trace_dir: str | os.PathLike | None = None,
        *,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        with_flops: bool = False,
        compress: bool = False,
    ):
        counts = {"skip_first": skip_first, "wait": wait, "warmup": warmup, "repeat": repeat}
        for name, value in counts.items():
            if value < 0:
                raise ValueError(f"TorchProfiler {name} must be >= 0, got {value}")
        if active < 1:
            raise ValueError(f"TorchProfiler active must be >= 1 step, got {active}")
        self.schedule = torch.profiler.schedule(
            skip_first=skip_first, wait=wait, warmup=warmup, active=active, repeat=repeat
        )
        self.trace_dir = Path(trace_dir) if trace_dir is not None else None
        self.options = dict(
            record_shapes=record_shapes,
            profile_memory=profile_memory,
            with_stack=with_stack,
            with_flops=with_flops,
        )
        self.compress = compress
        self.traces: list[Path] = []  # files written so far
        self._profiler: torch.profiler.profile | None = None
        self._dir: Path | None = None
        self._rank = 0
        self._step = 0

    def _write(self, profiler: torch.profiler.profile) -> None:
        suffix = ".json.gz" if self.compress else ".json"
        path = self._dir / f"rank{self._rank}_step{self._step}{suffix}"
        profiler.export_chrome_trace(str(path))
        self.traces.append(path)

    def fit_start(self, ctx: Any) -> None:
        if self._profiler is not None:
            return
        self._rank = int(getattr(ctx, "rank", 0) or 0)
        run_dir = getattr(ctx, "run_dir", None)
        self._dir = self.trace_dir or (Path(run_dir) / "traces" if run_dir else Path("traces"))
        self._dir.mkdir(parents=True, exist_ok=True)
        activities = [torch.profiler.ProfilerActivity.CPU]
        params = ctx.state.params
        if params and next(iter(params.values())).device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profiler = torch.profiler.profile(
            activities=activities,
            schedule=self.schedule,
            on_trace_ready=self._write,
            **self.options,
        )
        self._profiler.start()

    def batch_end(self, ctx: Any) -> None:
        if self._profiler is not None:
            self._step = int(ctx.state.step)
            self._profiler.step()

    def fit_end(self, ctx: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stop profiling (a window still recording is written)."""
        if self._profiler is not None:
            profiler, self._profiler = self._profiler, None
            profiler.stop()
