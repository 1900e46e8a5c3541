"""Tests of the covering-array generator: coverage (checked by brute force), forbidden pairs,
determinism, and sizes against known optima and lower bounds."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scenario_axes import AXES, FORBIDDEN, Scenario
from scenario_covering import (
    Forbidden,
    allowed,
    covering_array,
    full_product,
    interactions,
    missing,
)


def _axes(sizes):
    return {f"x{i}": list(range(n)) for i, n in enumerate(sizes)}


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 4), min_size=2, max_size=5),
    strength=st.integers(1, 3),
    seed=st.integers(0, 3),
)
def test_every_tuple_is_covered_and_rows_are_complete(sizes, strength, seed):
    axes = _axes(sizes)
    strength = min(strength, len(axes))
    rows = covering_array(axes, strength, seed=seed)
    assert missing(rows, axes, strength) == []
    assert all(set(r) == set(axes) and all(r[a] in axes[a] for a in axes) for r in rows)
    # never more rows than the cross product, never fewer than the largest t axes' product
    largest = sorted(sizes, reverse=True)[:strength]
    bound = 1
    for n in largest:
        bound *= n
    assert bound <= len(rows) <= len(full_product(axes))


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(2, 4), min_size=3, max_size=5), pick=st.randoms())
def test_forbidden_pairs_never_appear_and_need_no_covering(sizes, pick):
    axes = _axes(sizes)
    a, b = pick.sample(list(axes), 2)
    rule = Forbidden(a, pick.choice(axes[a]), b, pick.choice(axes[b]), "test")
    rows = covering_array(axes, 2, forbidden=[rule])
    assert not any(rule.hit_by(r) for r in rows)
    assert missing(rows, axes, 2, [rule]) == []
    # and the forbidden pair really is what is missing without the rule
    assert missing(rows, axes, 2) == [{a: rule.value_a, b: rule.value_b}]


def test_the_same_seed_gives_the_same_rows_and_seeds_differ():
    axes = _axes([3, 3, 2, 4])
    assert covering_array(axes, 2, seed=5) == covering_array(axes, 2, seed=5)
    designs = {repr(covering_array(axes, 2, seed=s)) for s in range(6)}
    assert len(designs) > 1


def test_known_optimum_sizes():
    # 3 binary axes pairwise: 4 rows (the orthogonal array OA(4, 3, 2, 2)); 4 ternary: 9.
    assert len(covering_array(_axes([2, 2, 2]), 2)) == 4
    assert len(covering_array(_axes([3, 3, 3, 3]), 2)) <= 11  # optimum 9, greedy close
    # strength = number of axes: the cross product itself
    assert len(covering_array(_axes([2, 3, 2]), 3)) == 12


def test_missing_finds_a_dropped_row():
    axes = _axes([2, 2, 2])
    rows = covering_array(axes, 2)
    assert missing(rows[1:], axes, 2)  # every row of an optimal design is needed


def test_an_impossible_tuple_is_reported():
    # x2 has one value, forbidden with both values of x0: no row can be built at all.
    axes = {"x0": [0, 1], "x1": [0, 1], "x2": [0]}
    rules = [Forbidden("x0", v, "x2", 0, "test") for v in (0, 1)]
    with pytest.raises(ValueError, match="no allowed row holds"):
        covering_array(axes, 2, forbidden=rules)


def test_bad_axes_are_refused():
    with pytest.raises(ValueError, match="no values"):
        covering_array({"a": [], "b": [1]}, 2)
    with pytest.raises(ValueError, match="repeats"):
        covering_array({"a": [1, 1], "b": [1]}, 2)
    with pytest.raises(ValueError, match="strength"):
        covering_array({"a": [1], "b": [1]}, 3)
    with pytest.raises(ValueError, match="not an axis value"):
        covering_array({"a": [1], "b": [1]}, 2, forbidden=[Forbidden("a", 2, "b", 1, "x")])


def test_interactions_count_matches_the_formula():
    axes = _axes([2, 3, 4])
    assert len(interactions(axes, 2)) == 2 * 3 + 2 * 4 + 3 * 4
    rule = Forbidden("x0", 0, "x1", 0, "test")
    assert len(interactions(axes, 2, [rule])) == 2 * 3 + 2 * 4 + 3 * 4 - 1
    # a triple holding a forbidden pair is not required either
    assert len(interactions(axes, 3, [rule])) == 24 - 4


def test_the_matrix_axes_and_their_impossible_pairs():
    assert allowed({"layout": "ddp", "interruption": "restart"}, FORBIDDEN)
    assert not allowed({"layout": "single", "interruption": "restart"}, FORBIDDEN)
    assert not allowed({"layout": "single", "interruption": "rank_change"}, FORBIDDEN)
    products = [len(v) for v in AXES.values()]
    total = 1
    for n in products:
        total *= n
    # 2 forbidden pairs, each removing the rows that hold it
    others = total // (len(AXES["layout"]) * len(AXES["interruption"]))
    assert len(full_product(AXES, FORBIDDEN)) == total - 2 * others


def test_scenario_ids_round_trip_and_event_steps_are_reproducible():
    row = {axis: values[-1] for axis, values in AXES.items()}
    s = Scenario.from_row(row)
    assert s.row == row and s.reference().interruption == "none"
    assert s.event_step(18) == Scenario.from_row(row).event_step(18)
    for values in itertools.islice(itertools.product(*AXES.values()), 0, 7000, 97):
        s = Scenario.from_row(dict(zip(AXES, values)))
        low = 3 if s.interruption == "rank_change" else 5 if s.interruption == "kill_save" else 7
        assert low <= s.event_step(18) <= 16
    with pytest.raises(ValueError, match="not axis values"):
        Scenario.from_row({**row, "layout": "tpu"})
