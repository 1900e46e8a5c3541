"""chain, identity, apply_updates, global_norm."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.optim import (
    EmptyState,
    Transform,
    adamw,
    apply_updates,
    chain,
    clip_by_global_norm,
    global_norm,
    identity,
    lion,
    scale,
    sgd,
)
from functrain.tree import tree_allclose

TRANSFORMS = {
    "sgd_momentum": lambda: sgd(0.1, momentum=0.9),
    "adamw": lambda: adamw(1e-2),
    "lion": lambda: lion(1e-3, weight_decay=0.1),
    "clip": lambda: clip_by_global_norm(0.5),
}


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), name=st.sampled_from(sorted(TRANSFORMS)))
def test_chain_of_one_equals_the_transform(random_tree, seed, name):
    t, c = TRANSFORMS[name](), chain(TRANSFORMS[name]())
    params = random_tree(seed)
    st_t, st_c = t.init(params), c.init(params)
    assert tree_allclose(st_c, (st_t,))
    for step in range(3):
        g = random_tree(seed + step + 1)
        u_t, st_t = t.update(g, st_t, params)
        u_c, st_c = c.update(g, st_c, params)
        assert tree_allclose(u_t, u_c)
        assert tree_allclose(st_c, (st_t,))


def test_chain_composes_in_order_and_empty_chain_is_identity():
    g = {"w": torch.tensor([1.0, -2.0])}
    t = chain(scale(2.0), clip_by_global_norm(1.0))
    updates, state = t.update(g, t.init(g))
    assert state == (EmptyState(), EmptyState())
    assert torch.allclose(global_norm(updates), torch.tensor(1.0))
    empty = chain()
    updates, state = empty.update(g, empty.init(g))
    assert updates is g and state == ()
    with pytest.raises(TypeError, match="not a Transform"):
        chain(scale(1.0), lambda g: g)
    with pytest.raises(ValueError, match="tuple of 2"):
        t.update(g, EmptyState())


def test_identity():
    t = identity()
    assert isinstance(t, Transform)
    g = {"w": torch.ones(2)}
    updates, state = t.update(g, t.init(g), None, time=None, unknown_extra=1)
    assert updates is g and state == EmptyState()


def test_apply_updates_pure_and_donate():
    params = {"w": torch.ones(2, requires_grad=True), "frozen": torch.zeros(3)}
    updates = {"w": torch.tensor([0.5, -0.5])}
    new = apply_updates(params, updates)
    assert torch.equal(new["w"], torch.tensor([1.5, 0.5])) and new["w"].requires_grad
    assert torch.equal(params["w"].detach(), torch.ones(2))  # pure
    assert new["frozen"] is params["frozen"]  # names without an update are kept as they are
    plain = {"w": torch.ones(2)}
    storage = plain["w"].data_ptr()
    donated = apply_updates(plain, updates, donate=True)
    assert donated["w"].data_ptr() == storage and torch.equal(plain["w"], torch.tensor([1.5, 0.5]))


def test_apply_updates_casts_to_param_dtype_and_checks_structure():
    params = {"w": torch.ones(2, dtype=torch.bfloat16)}
    new = apply_updates(params, {"w": torch.full((2,), 0.5)})
    assert new["w"].dtype == torch.bfloat16 and torch.equal(new["w"].float(), torch.full((2,), 1.5))
    with pytest.raises(ValueError, match="not in params"):
        apply_updates(params, {"v": torch.ones(2)})
    with pytest.raises(ValueError, match="structure"):
        apply_updates([torch.ones(2)], [torch.ones(2), torch.ones(2)])
    assert tree_allclose(
        apply_updates((torch.ones(1),), (torch.ones(1),)), (torch.full((1,), 2.0),)
    )


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), scale_=st.floats(1e-3, 1e3))
def test_global_norm_is_the_norm_of_everything(random_tree, seed, scale_):
    tree = random_tree(seed, scale_)
    flat = torch.cat([v.flatten() for v in tree.values()])
    assert torch.allclose(global_norm(tree), torch.linalg.vector_norm(flat), rtol=1e-5)
    assert global_norm({}).item() == 0.0
    assert global_norm({"a": torch.ones(4, dtype=torch.float64)}).dtype == torch.float64


def test_global_norm_of_low_precision_leaves_is_float32():
    # bf16 leaves: each leaf's norm is cast to float32 before the squares are summed, so the
    # result is float32 (and 3-4-12 gives 13 exactly); float64 anywhere gives float64.
    tree = {"a": torch.tensor([3.0, 4.0], dtype=torch.bfloat16), "b": torch.tensor([12.0])}
    assert global_norm(tree).dtype == torch.float32 and global_norm(tree).item() == 13.0
    only_bf16 = {"a": torch.tensor([3.0, 4.0], dtype=torch.bfloat16)}
    assert global_norm(only_bf16).dtype == torch.float32
    mixed = {"a": torch.tensor([3.0, 4.0], dtype=torch.float64), "b": torch.tensor([12.0])}
    assert global_norm(mixed).dtype == torch.float64 and global_norm(mixed).item() == 13.0
    assert global_norm({}).item() == 0.0
