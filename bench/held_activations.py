"""How many bytes of activations a step holds for its backward pass (a measuring tool).

`held_activation_bytes(step, state, batch)` runs the step's `grads` piece once with its `loss`
piece observed: while the loss runs, every op's output storage is recorded (weakly, through a
`TorchDispatchMode`); when the loss returns — the end of the forward pass, the moment activation
memory peaks — the storages still alive are what autograd, checkpoint's inputs and selective
checkpointing's saved outputs hold for the backward pass. Parameters are not counted (they are
not made inside the forward pass; under gather at use their gathered copies are). It works on
CPU, where no allocator reports a peak, and counts the same thing on CUDA.

It is slow (a Python callback per op): measure with it, time without it.

Example:
    >>> held_activation_bytes(step, state, batch)
    1835008
"""

from __future__ import annotations

import gc
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from functrain.step.pieces import StepPieces


class _Outputs(TorchDispatchMode):
    """Records a weak reference to every op output's storage."""

    def __init__(self):
        super().__init__()
        self.storages: list[weakref.ref] = []  # not keyed by id(): ids of freed ones recur

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor) and leaf.device.type != "meta":
                self.storages.append(weakref.ref(leaf.untyped_storage()))
        return out

    def live_bytes(self) -> int:
        gc.collect()
        seen, total = set(), 0
        for ref in self.storages:
            storage = ref()
            if storage is not None and storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        return total


def held_activation_bytes(step, state, batch) -> int:
    """Bytes of tensors made in the forward pass and alive at its end (the largest over the
    microbatches): the activation memory of one step.

    Args:
        step: a `Step` (from `make_step`/`compose`; its pieces are used).
        state: the `TrainState` to run it on (not changed).
        batch: one batch.
    Returns:
        the bytes, an int.
    """
    pieces: StepPieces = step.pieces
    inner, peaks = pieces.loss, []

    def loss(model, data):
        mode = _Outputs()
        with mode:
            out = inner(model, data)
        peaks.append(mode.live_bytes())
        return out

    observed = pieces._replace(loss=loss)
    observed.grads(observed, state, batch)
    return max(peaks)
