"""The pure step: `(state, batch) -> (state, metrics)` built from named pieces.

`make.py` builds a `Step` from the pieces (`pieces.py`), planned once (`plan.py`, `checks.py`);
`grads.py` runs the forward and backward over microbatches (`batching.py`) with the model called
through `model_calls.py`; `precision.py` and `guards.py` are the mixed-precision and
skip-nonfinite pieces; `compile.py` wraps a step in `torch.compile`; `protocol.py` is the
`StepLike` contract the loop accepts. Nothing here imports the loop.

Example:
    >>> from functrain.step import make_step
    >>> step = make_step(model, loss_fn, functrain.optim.adamw(lr=1e-3))
    >>> state, metrics = step(state, batch)
"""

from .make import Algorithm, GradResult, Step, StepPieces, compose, make_step

__all__ = ["Algorithm", "GradResult", "Step", "StepPieces", "compose", "make_step"]
