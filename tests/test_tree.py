"""Pytree helpers: paths, clone, allclose."""

import dataclasses
from typing import NamedTuple

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain import tree


class PairState(NamedTuple):
    count: int
    mu: dict


@tree.register_dataclass
@dataclasses.dataclass(frozen=True)
class Holder:
    a: int
    b: dict


def test_paths_name_fields_not_indices():
    value = {"opt": PairState(3, {"fc.weight": torch.ones(2)}), "h": Holder(1, {"x": [2.0]})}
    assert [p for p, _ in tree.leaves_with_paths(value)] == [
        "h.a",
        "h.b.x.0",
        "opt.count",
        "opt.mu.fc.weight",
    ]


def test_clone_is_deep_for_tensors():
    value = {"w": torch.zeros(3), "n": 1}
    copy = tree.tree_clone(value)
    copy["w"].add_(1)
    assert value["w"].sum() == 0 and copy["n"] == 1


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=5))
def test_allclose_reflexive_and_detects_change(values):
    a = {"x": torch.tensor(values), "k": len(values)}
    assert tree.tree_allclose(a, tree.tree_clone(a))
    b = {"x": torch.tensor(values) + 1.0, "k": len(values)}
    assert not tree.tree_allclose(a, b)
    assert not tree.tree_allclose(a, {"x": torch.tensor(values)})
