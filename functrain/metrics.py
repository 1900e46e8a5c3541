"""Evaluation metrics: accuracy, cross-entropy and perplexity, reduced correctly across ranks.

Each metric keeps two float64 sums (what it adds up, and how many it counted), never per-rank
averages, and `compute()` all-reduces them when `torch.distributed` is initialised (every rank
must call it), so a sharded evaluation gives the value over the whole data set. The values are
the ones torchmetrics gives (micro accuracy, `Perplexity`; the tests check it), without its
import cost; any `torchmetrics.Metric` plugs in as well, reduced by torchmetrics itself.

The protocol `evaluate` uses is tiny: `update(outputs, targets)`, `compute() -> float`,
`reset()`, and a `name`. `outputs` may be logits, or an object with `.logits` (Hugging Face
outputs), or a dict with "logits".

Example:
    >>> acc = Accuracy()
    >>> acc.update(torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 0]))
    >>> acc.compute()
    0.5
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F


@runtime_checkable
class Metric(Protocol):
    """What `evaluate` needs from a metric."""

    name: str

    def update(self, outputs: Any, targets: Any) -> None: ...

    def compute(self) -> float: ...

    def reset(self) -> None: ...


def logits_of(outputs: Any) -> torch.Tensor:
    """The logits tensor in a model's outputs (a tensor, `.logits`, `["logits"]` or `[0]`)."""
    if isinstance(outputs, torch.Tensor):
        return outputs
    logits = getattr(outputs, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(outputs, Mapping) and isinstance(outputs.get("logits"), torch.Tensor):
        return outputs["logits"]
    if isinstance(outputs, (tuple, list)) and outputs and isinstance(outputs[0], torch.Tensor):
        return outputs[0]
    raise TypeError(
        "cannot find logits in the model's outputs (expected a tensor, an object with .logits, "
        f"a dict with 'logits' or a tuple starting with a tensor); got {type(outputs).__name__}. "
        "Pass eval_fn=lambda model, batch: (logits, targets) to evaluate"
    )


def _flatten(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Class logits `[..., C]` and targets `[...]` (indices) or `[..., C]` (probabilities),
    flattened to `[N, C]` and `[N]` / `[N, C]`."""
    if logits.dim() < 2:
        raise ValueError(
            f"expected class logits of shape [batch, classes] or [batch, length, classes], "
            f"got shape {tuple(logits.shape)}"
        )
    classes = logits.shape[-1]
    dense = targets.is_floating_point() and targets.shape == logits.shape
    if not dense and targets.shape != logits.shape[:-1]:
        raise ValueError(
            f"targets of shape {tuple(targets.shape)} do not match logits of shape "
            f"{tuple(logits.shape)}: expected class indices of shape {tuple(logits.shape[:-1])} "
            "or probabilities of the logits' shape"
        )
    flat_logits = logits.reshape(-1, classes)
    flat_targets = targets.reshape(-1, classes) if dense else targets.reshape(-1).long()
    return flat_logits, flat_targets


class _Base:
    """A weighted mean kept as two float64 sums (value total, weight total).

    Sums, not per-rank means, are what is reduced across ranks, so any sharding of the data gives
    the value over the whole data set. (The sums are tiny tensors on the outputs' device; nothing
    is copied to the host until `compute`.)
    """

    name = "metric"

    def __init__(self, name: str):
        self.name = name
        self.reset()

    def reset(self) -> None:
        """Forget everything seen."""
        self._sums: torch.Tensor | None = None  # [value total, weight total]

    def _add(self, total: torch.Tensor, weight: torch.Tensor) -> None:
        pair = torch.stack(
            [total.detach().double().reshape(()), weight.detach().double().reshape(())]
        )
        self._sums = pair if self._sums is None else self._sums + pair.to(self._sums.device)

    def _reduced(self) -> tuple[float, float]:
        """`(value total, weight total)` summed over every rank (all ranks must call this)."""
        sums = self._sums if self._sums is not None else torch.zeros(2, dtype=torch.float64)
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            sums = sums.clone()
            if dist.get_backend() == "nccl" and sums.device.type != "cuda":
                sums = sums.cuda()
            # SUM over the world: ranks holding the same shard (tensor parallel) scale both sums
            # alike, so the ratio is still the mean over distinct samples.
            dist.all_reduce(sums, op=dist.ReduceOp.SUM)
        total, weight = sums.tolist()
        return total, weight

    def compute(self) -> float:
        """The value over everything seen since `reset`, over all ranks (NaN if nothing)."""
        total, weight = self._reduced()
        return total / weight if weight else float("nan")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class Accuracy(_Base):
    """The fraction of correct predictions (top-k), micro-averaged over samples (and positions).

    Args:
        top_k: a prediction counts as correct when the target is among the top k logits.
        ignore_index: targets equal to this are not counted (padding in sequence tasks).
        name: the key in `evaluate`'s results.
    Example:
        >>> Accuracy(top_k=5, name="top5")
    """

    def __init__(self, top_k: int = 1, ignore_index: int | None = None, name: str = "accuracy"):
        self.top_k = top_k
        self.ignore_index = ignore_index
        super().__init__(name)

    def update(self, outputs: Any, targets: torch.Tensor) -> None:
        """Count the correct predictions of a batch."""
        logits = logits_of(outputs).detach()
        targets = targets.detach()
        if logits.dim() > 1 and logits.shape[-1] == 1 and targets.shape == logits.shape[:-1]:
            logits = logits.squeeze(-1)  # [N, 1] logits of a binary classifier
        if logits.shape == targets.shape and not targets.is_floating_point():
            correct = (logits > 0).long() == targets  # one logit per sample: binary
            keep = torch.ones_like(correct)
        else:
            logits, targets = _flatten(logits, targets)
            if targets.dim() == 2:
                targets = targets.argmax(dim=-1)  # probability targets: the likeliest class
            k = min(self.top_k, logits.shape[-1])
            top = logits.topk(k, dim=-1).indices
            correct = (top == targets[:, None]).any(dim=-1)
            keep = (
                torch.ones_like(correct)
                if self.ignore_index is None
                else targets != self.ignore_index
            )
        self._add((correct & keep).sum(), keep.sum())


class CrossEntropy(_Base):
    """The mean cross-entropy (nats) of the logits against the targets, per counted target.

    Args:
        ignore_index: targets equal to this are not counted (padding, prompt tokens).
        name: the key in `evaluate`'s results.
    """

    def __init__(self, ignore_index: int = -100, name: str = "cross_entropy"):
        self.ignore_index = ignore_index
        super().__init__(name)

    def update(self, outputs: Any, targets: torch.Tensor) -> None:
        """Add a batch's summed cross-entropy and its number of targets."""
        logits, targets = _flatten(logits_of(outputs).detach(), targets.detach())
        if targets.dim() == 2:
            count = torch.tensor(targets.shape[0], device=logits.device)
            total = F.cross_entropy(logits.float(), targets.float(), reduction="sum")
        else:
            count = (targets != self.ignore_index).sum()
            total = F.cross_entropy(
                logits.float(), targets, ignore_index=self.ignore_index, reduction="sum"
            )
        self._add(total, count)


class Perplexity(CrossEntropy):
    """`exp(cross-entropy)`: the effective number of equally likely next tokens.

    Args:
        ignore_index: targets equal to this are not counted.
        name: the key in `evaluate`'s results.
    """

    def __init__(self, ignore_index: int = -100, name: str = "perplexity"):
        super().__init__(ignore_index=ignore_index, name=name)

    def compute(self) -> float:
        """`exp` of the mean cross-entropy over all ranks."""
        return math.exp(super().compute())


class Mean(_Base):
    """A weighted mean of scalars (`evaluate` uses it for the loss).

    Example:
        >>> m = Mean("loss"); m.update(torch.tensor(2.0), 3); m.update(torch.tensor(4.0), 1)
        >>> m.compute()
        2.5
    """

    def __init__(self, name: str = "mean"):
        super().__init__(name)

    def update(self, value: torch.Tensor | float, weight: torch.Tensor | float = 1.0) -> None:
        """Add `value` with weight `weight`."""
        value = torch.as_tensor(value).detach().double()
        weight = torch.as_tensor(weight, dtype=torch.float64, device=value.device)
        self._add(value * weight, weight)


class TorchMetric:
    """Any `torchmetrics.Metric` under the functrain protocol (fed the outputs' logits).

    torchmetrics reduces its own state across ranks in `compute()`.

    Example:
        >>> TorchMetric(torchmetrics.classification.MulticlassF1Score(10), name="f1")
    """

    def __init__(self, metric: Any, name: str):
        self.name = name
        self.metric = metric

    def update(self, outputs: Any, targets: Any) -> None:
        """Pass the logits and targets to the wrapped metric (moved to their device)."""
        logits = logits_of(outputs).detach()
        if self.metric.device != logits.device:
            self.metric = self.metric.to(logits.device)
        self.metric.update(logits, targets)

    def compute(self) -> float:
        """The wrapped metric's value as a float."""
        return float(self.metric.compute())

    def reset(self) -> None:
        """Reset the wrapped metric."""
        self.metric.reset()


_BY_NAME = {"accuracy": Accuracy, "cross_entropy": CrossEntropy, "perplexity": Perplexity}


def as_metric(metric: Any, name: str | None = None) -> Any:
    """A functrain metric from a metric, a torchmetrics metric, or a name in
    ("accuracy", "cross_entropy", "perplexity")."""
    if isinstance(metric, str):
        if metric not in _BY_NAME:
            raise ValueError(f"unknown metric {metric!r}; known names: {sorted(_BY_NAME)}")
        return _BY_NAME[metric](name=name or metric)
    if isinstance(metric, (_Base, TorchMetric)):
        if name is not None:
            metric.name = name
        return metric
    if _is_torchmetric(metric):
        return TorchMetric(metric, name or type(metric).__name__.lower())
    if all(callable(getattr(metric, m, None)) for m in ("update", "compute", "reset")):
        if name is not None:
            metric.name = name
        elif not isinstance(getattr(metric, "name", None), str):
            raise ValueError(f"metric {metric!r} has no `name`; pass metrics as {{name: metric}}")
        return metric
    raise TypeError(
        "a metric must be a name ('accuracy', 'cross_entropy', 'perplexity'), a torchmetrics "
        f"Metric, or have update/compute/reset; got {type(metric).__name__}"
    )


def _is_torchmetric(metric: Any) -> bool:
    # Checked by module name so that torchmetrics (seconds to import) loads only when used.
    return any(c.__module__.startswith("torchmetrics.") for c in type(metric).__mro__)


def resolve_metrics(metrics: Any) -> dict[str, Any]:
    """`{name: metric}` from None, one metric, a list of metrics, or a `{name: metric}` dict."""
    if metrics is None:
        return {}
    if isinstance(metrics, Mapping):
        items = [as_metric(m, name) for name, m in metrics.items()]
    elif isinstance(metrics, (str, _Base, TorchMetric)) or not isinstance(metrics, Iterable):
        items = [as_metric(metrics)]
    else:
        items = [as_metric(m) for m in metrics]
    resolved: dict[str, Any] = {}
    for metric in items:
        if metric.name in resolved:
            raise ValueError(f"two metrics are named {metric.name!r}; pass {{name: metric}}")
        resolved[metric.name] = metric
    return resolved
