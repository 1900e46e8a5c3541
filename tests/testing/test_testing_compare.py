"""tree_difference: None for equal trees, else the leaf, the count, the max abs gap and where."""

import math

import torch
from hypothesis import given
from hypothesis import strategies as st

from functrain.testing import tree_difference
from functrain.tree import tree_clone

shapes = st.lists(st.integers(1, 4), min_size=0, max_size=3)


@given(shape=shapes, seed=st.integers(0, 100), data=st.data())
def test_one_changed_element_is_named(shape, seed, data):
    gen = torch.Generator().manual_seed(seed)
    tree = {"a": {"w": torch.randn(shape, generator=gen)}, "b": (torch.arange(3), 7)}
    assert tree_difference(tree, tree_clone(tree)) is None
    changed = tree_clone(tree)
    flat = changed["a"]["w"].reshape(-1)
    i = data.draw(st.integers(0, flat.numel() - 1))
    delta = data.draw(st.floats(0.25, 100.0))
    flat[i] += delta
    message = tree_difference(tree, changed)
    index = tuple(int(j) for j in torch.unravel_index(torch.tensor(i), tuple(shape)))
    assert message.startswith(f"leaf a.w: 1 of {flat.numel()} elements differ")
    assert f"at index {index}" in message
    reported = float(message.split("max abs difference ")[1].split(" ")[0])
    assert math.isclose(reported, delta, rel_tol=1e-4)
    # within a tolerance larger than the change, equal
    assert tree_difference(tree, changed, atol=delta * 1.01) is None
    assert tree_difference(tree, changed, ignore=("a",)) is None


def test_structure_types_scalars_nans_and_signed_zeros():
    assert "differ in structure" in tree_difference({"a": 1}, {"b": 1})
    assert tree_difference({"a": 1}, {"a": 2}) == "leaf a: expected 1, got 2"
    assert "expected shape (2,) torch.float32, got shape (2,) torch.float64" in tree_difference(
        torch.zeros(2), torch.zeros(2, dtype=torch.float64)
    )
    assert "expected Tensor" in tree_difference({"a": torch.zeros(())}, {"a": 0.0})
    nan = torch.tensor([float("nan"), 1.0])
    assert tree_difference(nan, nan.clone()) is None
    assert "1 of 2 elements differ" in tree_difference(nan, torch.tensor([0.0, 1.0]))
    assert tree_difference(torch.tensor([0.0]), torch.tensor([-0.0])) is None
    assert "expected 2, got 5" in tree_difference(torch.arange(3), torch.tensor([0, 1, 5]))
    assert tree_difference(torch.tensor([True]), torch.tensor([True])) is None
    assert "1 of 1" in tree_difference(torch.tensor([True]), torch.tensor([False]))
