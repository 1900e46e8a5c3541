"""`RuntimeEstimator`: how long the run still needs (ETA).

The estimate is wall-clock time per batch since this fit call started measuring, times the
batches left until the run's horizon (`timestamp.max_batches`, which `fit` sets from its
duration). Evaluation time is inside the wall clock, so its cost is spread over the batches. The
first batches are skipped because they include one-off costs (compilation, allocator warm-up,
data-loader start).

Example:
    >>> functrain.fit(step, state, loader, duration="5ep", callbacks=[RuntimeEstimator()])  # doctest: +SKIP
    # logs {"time/remaining_estimate": 812.4, "time/progress": 0.31, ...}
"""

from __future__ import annotations

import time
from typing import Any

from ..units import TimeLike
from .interval import LogCadence

_SECONDS_PER_UNIT = {"seconds": 1.0, "minutes": 60.0, "hours": 3600.0, "days": 86400.0}


class RuntimeEstimator:
    """Log the estimated remaining time.

    Keys: "time/remaining_estimate" (in `time_unit`), "time/elapsed" (this fit call, same unit),
    "time/progress" (fraction of the horizon done).

    Args:
        skip_batches: batches at the start of each fit call left out of the estimate.
        time_unit: "seconds", "minutes", "hours" or "days".
        interval: when to log; None follows the loop's logging interval.
    """

    def __init__(
        self, skip_batches: int = 1, time_unit: str = "seconds", interval: TimeLike | None = None
    ):
        if time_unit not in _SECONDS_PER_UNIT:
            raise ValueError(
                f"unknown time_unit {time_unit!r}; use one of {list(_SECONDS_PER_UNIT)}"
            )
        if skip_batches < 0:
            raise ValueError(f"skip_batches must be >= 0, got {skip_batches}")
        self.skip_batches = skip_batches
        self.time_unit = time_unit
        self.cadence = LogCadence(interval)
        self._fit_began: float | None = None
        self._seen = 0
        self._start: tuple[float, int] | None = None  # (clock, batch) where measuring began

    def fit_start(self, ctx: Any) -> None:
        self._fit_began = time.perf_counter()
        self._seen = 0
        self._start = None
        if self.skip_batches == 0:
            self._start = (self._fit_began, ctx.timestamp.batch)

    def estimate(self, timestamp: Any) -> float | None:
        """Seconds left until `timestamp.max_batches`, or None when it cannot be told yet."""
        if self._start is None or not timestamp.max_batches:
            return None
        began, first_batch = self._start
        done = timestamp.batch - first_batch
        if done <= 0:
            return None
        per_batch = (time.perf_counter() - began) / done
        return per_batch * max(0, timestamp.max_batches - timestamp.batch)

    def batch_end(self, ctx: Any) -> None:
        if self._fit_began is None:  # used without fit_start
            self.fit_start(ctx)
        self._seen += 1
        if self._start is None and self._seen >= self.skip_batches:
            self._start = (time.perf_counter(), ctx.timestamp.batch)
            return
        if not self.cadence.due(ctx):
            return
        remaining = self.estimate(ctx.timestamp)
        if remaining is None:
            return
        unit = _SECONDS_PER_UNIT[self.time_unit]
        ts = ctx.timestamp
        began = self._fit_began if self._fit_began is not None else time.perf_counter()
        ctx.log(
            {
                "time/remaining_estimate": remaining / unit,
                "time/elapsed": (time.perf_counter() - began) / unit,
                "time/progress": ts.batch / ts.max_batches,
            }
        )
