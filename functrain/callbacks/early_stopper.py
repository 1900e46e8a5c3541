"""`EarlyStopper`: stop when an evaluation metric has stopped improving.

After each evaluation the monitored metric is compared with the best so far; an improvement of
more than `min_delta` resets the patience. Patience is counted in evaluations (an int) or in
training time since the best result (a `Time` such as "2ep" or "500ba"). The best value and the
count are the callback's `state_dict`, so a resumed run stops exactly when the uninterrupted one
would have.

Example:
    >>> stopper = EarlyStopper(monitor="accuracy", patience=3, mode="max")
    >>> functrain.fit(step, state, loader, duration="50ep", eval_data=val,
    ...               callbacks=[stopper])  # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..units import Time, TimeLike


def eval_value(ctx: Any, monitor: str, owner: str) -> float:
    """`ctx.eval_metrics[monitor]` as a float, or a clear error naming the metrics there are."""
    metrics = getattr(ctx, "eval_metrics", None) or {}
    if monitor not in metrics:
        raise KeyError(
            f"{owner} monitors {monitor!r}, but the evaluation produced {sorted(metrics)}; "
            f"pass monitor=<one of those> (or add the metric to the evaluation)"
        )
    return float(metrics[monitor])


def _check_mode(mode: str, owner: str) -> None:
    if mode not in ("min", "max"):
        raise ValueError(f"{owner} mode must be 'min' (lower is better) or 'max', got {mode!r}")


class EarlyStopper:
    """Stop training when `monitor` has not improved for `patience`.

    Args:
        monitor: an evaluation metric name (a key of `ctx.eval_metrics`).
        patience: evaluations without improvement (int), or training time without improvement
            (a `Time` or string: "2ep", "1000ba").
        min_delta: the smallest change that counts as an improvement.
        mode: "max" if larger is better (accuracy), "min" if smaller is (loss).
    """

    def __init__(
        self,
        monitor: str = "accuracy",
        patience: int | TimeLike = 3,
        min_delta: float = 0.0,
        mode: str = "max",
    ):
        _check_mode(mode, "EarlyStopper")
        if min_delta < 0:
            raise ValueError(f"EarlyStopper min_delta must be >= 0, got {min_delta}")
        self.monitor = monitor
        if isinstance(patience, int) and not isinstance(patience, bool):
            if patience < 1:
                raise ValueError(f"EarlyStopper patience must be >= 1 evaluation, got {patience}")
            self.patience: int | Time = patience
        else:
            self.patience = Time.coerce(patience)
        self.min_delta = float(min_delta)
        self.mode = mode
        self.best: float | None = None
        self.best_batch = 0  # timestamp.batch of the best evaluation
        self.wait = 0  # evaluations since the best

    def _improved(self, value: float) -> bool:
        if math.isnan(value):
            return False
        if self.best is None:
            return True
        if self.mode == "max":
            return value > self.best + self.min_delta
        return value < self.best - self.min_delta

    def eval_end(self, ctx: Any) -> None:
        value = eval_value(ctx, self.monitor, "EarlyStopper")
        batch = ctx.timestamp.batch
        if self._improved(value):
            self.best, self.best_batch, self.wait = value, batch, 0
            return
        self.wait += 1
        if isinstance(self.patience, int):
            out_of_patience = self.wait >= self.patience
            waited = f"{self.wait} evaluations"
        else:
            out_of_patience = batch - self.best_batch >= ctx.timestamp.to_batches(self.patience)
            waited = f"{batch - self.best_batch} batches (patience {self.patience})"
        if out_of_patience:
            ctx.request_stop(
                f"EarlyStopper: {self.monitor!r} has not improved on its best {self.best:.6g} "
                f"(at batch {self.best_batch}) for {waited}; stopping at batch {batch}"
            )

    def state_dict(self) -> dict[str, Any]:
        """Plain values: the best result, where it was, and the evaluations since."""
        return {
            "best": self.best if self.best is not None else float("nan"),
            "has_best": self.best is not None,
            "best_batch": self.best_batch,
            "wait": self.wait,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.best = float(state["best"]) if state.get("has_best") else None
        self.best_batch = int(state.get("best_batch", 0))
        self.wait = int(state.get("wait", 0))
