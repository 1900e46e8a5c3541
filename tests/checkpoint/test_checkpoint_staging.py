"""Staging: leaves described by path, this rank's data taken off the device, buffers reused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ckpt_helpers import make_state

from functrain import checkpoint
from functrain.checkpoint import staging, storage, writer
from functrain.checkpoint.errors import CheckpointError


def test_writer_does_not_reexport_staging():
    # One home per name: staging is imported from `staging`, not through `writer`.
    assert "stage" not in writer.__all__ and "Staged" not in writer.__all__


def test_scalars_are_described_and_carry_no_data():
    staged = staging.stage({"b": True, "i": 3, "f": 0.5, "s": "x", "n": np.int64(4)})
    kinds = {item.record.key: (item.record.kind, item.record.value) for item in staged.leaves}
    assert kinds == {
        "b": ("bool", True),
        "i": ("int", 3),
        "f": ("float", 0.5),
        "s": ("str", "x"),
        "n": ("int", 4),
    }
    assert all(item.data is None for item in staged.leaves) and staged.nbytes == 0


def test_a_plain_tensor_is_written_whole_by_rank_zero():
    tensor = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    (item,) = staging.stage({"w": tensor}).leaves
    assert item.record.kind == "tensor" and item.record.shape == (3, 4)
    assert item.region == (slice(0, 3), slice(0, 4))
    np.testing.assert_array_equal(item.data, tensor.numpy())


def test_without_copy_host_tensors_are_not_copied():
    tensor = torch.ones(4)
    (item,) = staging.stage({"w": tensor}, copy=False).leaves
    tensor.add_(1.0)  # a synchronous save holds the caller's tensors until it is committed
    assert item.data.tolist() == [2.0] * 4


def test_a_lone_tensor_must_be_wrapped(tmp_path):
    with pytest.raises(CheckpointError, match="wrap a lone tensor"):
        checkpoint.save(tmp_path / "c", torch.zeros(2))


def test_stage_copy_is_independent_of_later_updates():
    state = make_state()
    staged = staging.stage(state, copy=True, buffers={})
    before = state.params["fc.weight"].clone()
    state.params["fc.weight"].add_(1.0)  # a donating step updating in place after the copy
    item = next(i for i in staged.leaves if i.record.key == "params.fc.weight")
    np.testing.assert_array_equal(item.data, before.numpy())
    assert staged.nbytes == sum(
        i.data.nbytes for i in staged.leaves if i.data is not None and i.record.kind == "tensor"
    )


def test_staging_buffers_are_reused():
    state = make_state()
    buffers: dict = {}
    staging.stage(state, copy=True, buffers=buffers)
    first = {k: v.data_ptr() for k, v in buffers.items()}
    staging.stage(state, copy=True, buffers=buffers)
    assert first == {k: v.data_ptr() for k, v in buffers.items()} and first


def _described(staged) -> list:
    return [
        (i.record.to_json(), i.region, None if i.data is None else i.data.tobytes())
        for i in staged.leaves
    ]


def test_a_known_structure_stages_exactly_as_a_new_one():
    """`plans` reuses the descriptions of plain tensors of an earlier stage of the same
    structure: the result equals a stage without it, scalars are read afresh, and a tensor of
    another shape or dtype is described anew."""
    state = make_state()
    plans: dict = {}
    staging.stage(state, copy=True, buffers={}, plans=plans)
    later = state.replace(step=state.step + 7)
    later.params["fc.weight"].add_(1.0)
    reused = staging.stage(later, copy=True, buffers={}, plans=plans)
    assert _described(reused) == _described(staging.stage(later, copy=True, buffers={}))
    step = next(i for i in reused.leaves if i.record.key == "step")
    assert step.record.value == state.step + 7
    params = dict(later.params)
    params["fc.weight"] = torch.zeros(5, 2, dtype=torch.float64)  # another shape and dtype
    changed = later.replace(params=params)
    restaged = staging.stage(changed, copy=True, buffers={}, plans=plans)
    weight = next(i for i in restaged.leaves if i.record.key == "params.fc.weight")
    assert weight.record.shape == (5, 2) and weight.data.dtype == np.float64
    assert _described(restaged) == _described(staging.stage(changed, copy=True, buffers={}))
    # and the plan now describes it as it is, so the next save of it is a known leaf again
    (plan,) = plans.values()
    known = next(k for k in plan if k is not None and k.record.key == "params.fc.weight")
    assert known.dtype is torch.float64 and known.shape == (5, 2)


def test_a_known_structure_refills_its_own_buffers_save_after_save():
    # As a manager's saves do: one buffers dict and one plans dict; the state updated in place
    # between saves. The third save reuses the second's staged leaves, refilled.
    state = make_state()
    buffers: dict = {}
    plans: dict = {}
    for step in range(3):
        state.params["fc.weight"].add_(1.0)  # a donating step
        later = state.replace(step=state.step + step)
        staged = staging.stage(later, copy=True, buffers=buffers, plans=plans)
        assert _described(staged) == _described(staging.stage(later, copy=True, buffers={}))
    weight = next(i for i in staged.leaves if i.record.key == "params.fc.weight")
    assert np.shares_memory(weight.data, buffers["params.fc.weight"].numpy())


class _LateCopy:
    """Stands for the CUDA event of a device-to-host copy: the copy lands when waited for."""

    def __init__(self, buffer: torch.Tensor, value: torch.Tensor):
        self.buffer, self.value, self.waited = buffer, value, False

    def synchronize(self) -> None:
        self.buffer.copy_(self.value)
        self.waited = True


def test_the_writer_reads_the_buffers_only_once_the_device_copies_landed(tmp_path):
    # `stage` does not wait for the copies it queues on a CUDA stream; `write` does, first.
    state = {"w": torch.arange(6.0), "step": 3}
    buffers: dict = {}
    staged = staging.stage(state, copy=True, buffers=buffers)
    buffers["w"].zero_()  # the copy has not landed yet
    late = _LateCopy(buffers["w"], state["w"])
    staged.landed.append(late)
    url = writer.write(staged, storage.resolve(tmp_path / "c"))
    assert late.waited
    assert torch.equal(checkpoint.load(url, state)["w"], state["w"])
