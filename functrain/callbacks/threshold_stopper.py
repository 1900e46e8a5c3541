"""`ThresholdStopper`: stop as soon as an evaluation metric reaches a target.

For time-to-quality runs ("train until 97% accuracy"): after each evaluation the monitored
metric is compared with the threshold, and reaching it asks the loop to stop.

Example:
    >>> functrain.fit(step, state, loader, duration="50ep", eval_data=val,
    ...               callbacks=[ThresholdStopper("accuracy", 0.97)])  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from .early_stopper import _check_mode, eval_value


class ThresholdStopper:
    """Stop training once `monitor` reaches `threshold`.

    Args:
        monitor: an evaluation metric name (a key of `ctx.eval_metrics`).
        threshold: the target value.
        mode: "max": stop when the metric is >= threshold (accuracy); "min": when <= (loss).
    """

    def __init__(self, monitor: str, threshold: float, mode: str = "max"):
        _check_mode(mode, "ThresholdStopper")
        self.monitor = monitor
        self.threshold = float(threshold)
        self.mode = mode
        self.reached_at: int | None = None  # timestamp.batch where the target was reached

    def reached(self, value: float) -> bool:
        """True when `value` meets the target."""
        return value >= self.threshold if self.mode == "max" else value <= self.threshold

    def eval_end(self, ctx: Any) -> None:
        value = eval_value(ctx, self.monitor, "ThresholdStopper")
        if self.reached(value):
            self.reached_at = ctx.timestamp.batch
            sign = ">=" if self.mode == "max" else "<="
            ctx.request_stop(
                f"ThresholdStopper: {self.monitor!r} = {value:.6g} {sign} {self.threshold:.6g} "
                f"at batch {ctx.timestamp.batch}"
            )
