"""A save reads leaf paths and empty containers off the treedef (memoized by it); they are what
walking the tree itself with optree's accessors gives, for any nesting of containers."""

from __future__ import annotations

import collections
from typing import NamedTuple

import optree
import torch
from hypothesis import given
from hypothesis import strategies as st

from functrain.checkpoint import layout, structure
from functrain.tree import NAMESPACE, key_to_str

Pair = collections.namedtuple("Pair", "left right")


class _Moments(NamedTuple):
    mu: torch.Tensor
    nu: tuple


def _reference(tree):
    """Paths, key types and empty containers by flattening the tree with accessors."""
    accessors, _, _ = optree.tree_flatten_with_accessor(tree, namespace=NAMESPACE)
    paths = [tuple(key_to_str(e) for e in a) for a in accessors]
    types = [tuple(_key_type(e) for e in a) for a in accessors]

    def is_empty(node) -> bool:
        spec = optree.tree_structure(node, namespace=NAMESPACE)
        return not spec.is_leaf() and spec.num_children == 0

    found, nodes, _ = optree.tree_flatten_with_accessor(tree, is_leaf=is_empty, namespace=NAMESPACE)
    empty = []
    for accessor, node in zip(found, nodes):
        if accessor and is_empty(node):
            kind = "None" if node is None else "List" if isinstance(node, list) else "Dict"
            kind = "Tuple" if isinstance(node, tuple) else kind
            path = tuple(key_to_str(e) for e in accessor)
            empty.append((path, tuple(_key_type(e) for e in accessor), kind))
    return paths, types, empty


def _key_type(entry) -> int:
    named = (optree.NamedTupleEntry, optree.StructSequenceEntry)
    if isinstance(entry, optree.SequenceEntry) and not isinstance(entry, named):
        return layout.KEY_SEQUENCE
    return layout.KEY_MAPPING


TREES = st.recursive(
    st.integers(0, 9) | st.none(),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.sampled_from(["a", "b", "c", "1"]), inner, max_size=3)
        | st.tuples(inner, inner).map(lambda t: Pair(*t))
    ),
    max_leaves=12,
)


@given(TREES)
def test_paths_and_empty_containers_from_the_treedef_are_the_tree_walks(tree):
    paths, types, empty = _reference(tree)
    leaves, got_paths, got_types, _ = structure.leaf_paths(tree)
    assert (got_paths, got_types) == (paths, types)
    assert leaves == optree.tree_leaves(tree, namespace=NAMESPACE)
    assert structure.empty_nodes(tree) == empty


def test_dict_keys_equal_as_values_but_not_as_names_keep_their_own_paths():
    # {1: x} and {True: x} have equal treedefs; their leaves are named "1" and "True".
    assert structure.leaf_paths({1: 0})[1] == [("1",)]
    assert structure.leaf_paths({True: 0})[1] == [("True",)]
    assert structure.leaf_paths({1: 0})[1] == [("1",)]  # after {True: x}'s, still its own


def test_a_known_structure_of_string_keys_is_found_by_its_treedef_alone():
    # A save of a structure seen before skips its text (~70 us); equal treedefs of string keys
    # and positions name their leaves alike, so the memo by treedef can be trusted for them.
    tree = {"params": {"w": 1, "b": [2, 3]}, "moments": _Moments(4, ())}
    first, text = structure.of_treedef(optree.tree_structure(tree, namespace=NAMESPACE))
    assert first.exact and text == str(optree.tree_structure(tree, namespace=NAMESPACE))
    again = structure.of_treedef(optree.tree_structure(dict(tree), namespace=NAMESPACE))
    assert again[0] is first and again[1] == text
    # a key that is not a string makes the structure inexact: looked up by its text too
    assert not structure.of_treedef(optree.tree_structure({1: 0}, namespace=NAMESPACE))[0].exact


def test_leaf_paths_name_sequences_and_mappings():
    tree = {"opt": [_Moments(torch.zeros(1), ()), {"lr": 0.1}], "w": torch.ones(2)}
    leaves, paths, key_types, _ = structure.leaf_paths(tree)
    assert paths == [("opt", "0", "mu"), ("opt", "1", "lr"), ("w",)]
    seq, mapping = layout.KEY_SEQUENCE, layout.KEY_MAPPING
    # a NamedTuple's fields are looked up by name, like a dict's keys (as orbax does)
    assert key_types == [(mapping, seq, mapping), (mapping, seq, mapping), (mapping,)]
    assert leaves[1] == 0.1


def test_empty_nodes_are_listed_with_their_kind():
    tree = {"chain": [{}, (), None, torch.zeros(1)], "m": _Moments(torch.zeros(1), ())}
    found = {path: kind for path, _, kind in structure.empty_nodes(tree)}
    assert found == {
        ("chain", "0"): "Dict",
        ("chain", "1"): "Tuple",
        ("chain", "2"): "None",
        ("m", "nu"): "Tuple",
    }
