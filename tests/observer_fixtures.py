"""Shared fixtures for the callback and logger tests: a tiny real state, the loop's Context, a recording logger.

Both tests/callbacks and tests/loggers load these through their conftest; helpers are handed out
as fixtures (not imported).
"""

from __future__ import annotations

import pytest
import torch

import functrain
from functrain.loop.events import Context
from functrain.units import Time


class Recorder:
    """A logger that keeps every call."""

    def __init__(self):
        self.calls: list[tuple[int, dict]] = []
        self.images: list[tuple[str, object, int]] = []

    def log_metrics(self, metrics, step):
        self.calls.append((step, dict(metrics)))

    def log_images(self, name, images, step):
        self.images.append((name, images, step))

    def merged(self) -> dict:
        """All logged keys -> their last value."""
        out = {}
        for _, metrics in self.calls:
            out.update(metrics)
        return out

    def steps(self) -> list[int]:
        return [step for step, _ in self.calls]


def _tiny_state(seed: int = 0) -> functrain.TrainState:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    return functrain.init(model, functrain.optim.sgd(lr=0.1), seed=seed)


def _make_ctx(state=None, *, log_interval="1ba", loggers=None, **fields) -> Context:
    """The loop's own Context, filled as fit fills it."""
    ctx = Context(
        state=state if state is not None else _tiny_state(),
        loggers=list(loggers) if loggers is not None else [Recorder()],
        **fields,
    )
    ctx.log_interval = Time.coerce(log_interval) if log_interval is not None else None
    return ctx


def _advance(ctx: Context, samples: int = 8, tokens: int = 0, **metrics) -> Context:
    """What fit does after one step: a new state one batch further and the step's metrics."""
    state = ctx.state
    ctx.state = state.replace(
        step=state.step + 1, timestamp=state.timestamp.advance_batch(samples, tokens)
    )
    ctx.metrics = {"loss": torch.tensor(1.0), "lr": 0.1, **metrics}
    return ctx


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def ctx(recorder) -> Context:
    return _make_ctx(loggers=[recorder])


@pytest.fixture(scope="session")
def tiny_state():  # a stateless factory
    """`tiny_state(seed=0)` -> a TrainState of a 4-3-2 MLP trained by SGD(lr=0.1)."""
    return _tiny_state


@pytest.fixture(scope="session")
def make_ctx():  # a stateless factory
    """`make_ctx(state=None, *, log_interval="1ba", loggers=None, **fields)` -> Context."""
    return _make_ctx


@pytest.fixture(scope="session")
def advance():  # a stateless factory
    """`advance(ctx, samples=8, tokens=0, **metrics)`: one step of fit on the context."""
    return _advance


@pytest.fixture(scope="session")
def new_recorder():  # a stateless factory
    """A factory of recording loggers."""
    return Recorder


# Tensor methods that copy a value to the host (on CUDA: wait for the device).
SYNC_METHODS = {"item", "tolist", "__float__", "__int__", "__bool__", "__index__", "cpu", "numpy"}


class SyncCountingTensor(torch.Tensor):
    """A tensor that records every host read of itself or of tensors computed from it."""

    reads: list[str] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in SYNC_METHODS:
            SyncCountingTensor.reads.append(name)
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.fixture
def counting():
    """`counting(value)` -> a 0-d tensor whose host reads land in `counting.reads`."""
    SyncCountingTensor.reads = []

    def make(value: float) -> torch.Tensor:
        return torch.tensor(float(value)).as_subclass(SyncCountingTensor)

    make.reads = SyncCountingTensor.reads
    return make
