"""Batch item access by key: get/set for tuples, lists, dicts, NamedTuples and accessor pairs."""

from typing import NamedTuple

import pytest
import torch

from functrain.data import num_samples
from functrain.functional.batch import get_item, set_item, take


class Pair(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor


@pytest.mark.parametrize(
    "batch, key",
    [
        ((torch.zeros(2), torch.ones(2)), 1),
        ([torch.zeros(2), torch.ones(2)], 0),
        ({"image": torch.zeros(2), "label": torch.ones(2)}, "label"),
        (Pair(torch.zeros(2), torch.ones(2)), 1),
    ],
)
def test_set_item_replaces_one_item_and_keeps_the_input_and_container_type(batch, key):
    before = get_item(batch, key).clone()
    new = set_item(batch, key, torch.full((2,), 7.0))
    assert type(new) is type(batch)
    assert torch.equal(get_item(new, key), torch.full((2,), 7.0))
    assert torch.equal(get_item(batch, key), before)  # the input batch is untouched


def test_accessor_pair_handles_any_layout():
    key = (lambda b: b["inner"]["x"], lambda b, v: {**b, "inner": {**b["inner"], "x": v}})
    batch = {"inner": {"x": 1, "z": 2}}
    assert get_item(batch, key) == 1
    assert set_item(batch, key, 5) == {"inner": {"x": 5, "z": 2}}
    assert batch["inner"]["x"] == 1


def test_bad_keys_name_the_problem_and_the_fix():
    with pytest.raises(KeyError, match="target_key"):
        get_item({"a": 1}, "b")
    with pytest.raises(TypeError, match="integers"):
        get_item((1, 2), "label")
    with pytest.raises(IndexError, match="out of range"):
        set_item((1, 2), 5, 0)
    with pytest.raises(TypeError, match="getter, setter"):
        get_item(torch.zeros(3), 0)


def test_take_indexes_every_batch_sized_leaf_and_carries_the_rest():
    tree = {"a": torch.arange(4), "b": (torch.arange(8).view(4, 2), 0.5), "c": torch.arange(3)}
    out = take(tree, torch.tensor([3, 1]))
    assert torch.equal(out["a"], torch.tensor([3, 1]))
    assert torch.equal(out["b"][0], torch.tensor([[6, 7], [2, 3]]))
    assert out["b"][1] == 0.5 and torch.equal(out["c"], torch.arange(3))
    assert num_samples(tree) == 4
    with pytest.raises(ValueError, match="batch dimension"):
        num_samples(torch.tensor(1.0))


@pytest.mark.parametrize("key", [2, -3])
def test_a_key_one_past_either_end_gets_the_batch_message_not_pythons(key):
    # Python's own IndexError ("tuple index out of range") would not name the fix
    with pytest.raises(IndexError, match=r"batch of 2 items; pass input_key="):
        get_item((1, 2), key)
    with pytest.raises(IndexError, match=r"batch of 2 items; pass input_key="):
        set_item([1, 2], key, 0)
    assert get_item((1, 2), key + (-1 if key > 0 else 1)) == (2 if key > 0 else 1)


def test_num_samples_skips_leading_scalars_and_0d_tensors():
    assert num_samples((0.5, torch.arange(3))) == 3
    assert num_samples({"a": torch.tensor(1.0), "b": torch.zeros(5, 2)}) == 5
    assert num_samples([torch.zeros(2, 3), torch.zeros(7)]) == 2  # the first batched tensor wins
    with pytest.raises(ValueError, match="batch dimension"):
        num_samples((0.5, torch.tensor(2.0)))


def test_a_mapping_that_cannot_be_rebuilt_from_a_dict_comes_back_as_a_plain_dict():
    from collections.abc import Mapping
    from types import MappingProxyType

    class Record(Mapping):  # built from keyword fields only: Record(dict) raises TypeError
        def __init__(self, *, image, label):
            self._items = {"image": image, "label": label}

        def __getitem__(self, key):
            return self._items[key]

        def __iter__(self):
            return iter(self._items)

        def __len__(self):
            return len(self._items)

    record = Record(image=1, label=2)
    new = set_item(record, "label", 5)
    assert type(new) is dict and new == {"image": 1, "label": 5} and record["label"] == 2
    proxy = MappingProxyType({"image": 1, "label": 2})  # rebuilds from a dict: keeps its type
    new = set_item(proxy, "label", 5)
    assert type(new) is MappingProxyType and dict(new) == {"image": 1, "label": 5}
    assert proxy["label"] == 2


def test_num_samples_and_take_on_a_bare_tensor_and_0d_leaves():
    assert num_samples(torch.zeros(5, 2)) == 5  # the leading dimension, not another
    assert torch.equal(take(torch.arange(6).view(3, 2), torch.tensor([2])), torch.tensor([[4, 5]]))
    scalar = torch.tensor(2.0)
    out = take((torch.arange(3), scalar), torch.tensor([1, 1]))
    assert torch.equal(out[0], torch.tensor([1, 1])) and out[1] is scalar  # 0-d: carried
