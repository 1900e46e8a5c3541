"""Laws every optimizer obeys: zero gradients keep the params (no decay), purity, determinism,
donate == pure, and updates never alias the state."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functrain.optim import (
    adam,
    adamw,
    adaptive_grad_clip,
    apply_updates,
    chain,
    clip_by_global_norm,
    clip_by_value,
    decoupled_adamw,
    decoupled_sgdw,
    inject_hyperparams,
    lion,
    masked,
    multi_steps,
    no_decay_mask,
    sgd,
)
from functrain.tree import tensor_leaves, tree_allclose, tree_clone

OPTIMIZERS = {
    "sgd": lambda: sgd(0.1),
    "sgd_momentum": lambda: sgd(0.1, momentum=0.9, dampening=0.1),
    "sgd_nesterov": lambda: sgd(lambda t: 0.1 / (1 + t), momentum=0.9, nesterov=True),
    "adam": lambda: adam(1e-2),
    "adam_amsgrad": lambda: adam(1e-2, amsgrad=True),
    "adamw": lambda: adamw(1e-2, weight_decay=0.0),
    "decoupled_sgdw": lambda: decoupled_sgdw(0.1, momentum=0.9),
    "decoupled_adamw": lambda: decoupled_adamw(1e-2, weight_decay=0.0),
    "lion": lambda: lion(1e-3),
    "clipped": lambda: chain(
        clip_by_global_norm(1.0),
        clip_by_value(0.5),
        adaptive_grad_clip(),
        adamw(1e-2, weight_decay=0),
    ),
    "masked": lambda: masked(adam(1e-2), no_decay_mask),
    "multi_steps": lambda: multi_steps(sgd(0.1, momentum=0.9), every_k=2),
    "injected": lambda: inject_hyperparams(adamw)(lr=lambda t: 1e-2 * 0.9**t, weight_decay=0.0),
}
names = st.sampled_from(sorted(OPTIMIZERS))
seeds = st.integers(0, 2**31 - 1)


@settings(max_examples=30, deadline=None)
@given(name=names, seed=seeds, donate=st.booleans())
def test_zero_gradient_keeps_parameters(random_tree, name, seed, donate):
    opt = OPTIMIZERS[name]()
    params = random_tree(seed)
    originals = tree_clone(params)
    state = opt.init(params)
    for _ in range(3):
        zeros = {k: torch.zeros_like(v) for k, v in params.items()}
        updates, state = opt.update(zeros, state, params, donate=donate)
        params = apply_updates(params, updates, donate=donate)
    assert tree_allclose(params, originals)


def _run(opt, random_tree, seed, donate, steps=3):
    params = random_tree(seed)
    state = opt.init(params)
    history = []
    for step in range(steps):
        grads = random_tree(seed + 1 + step)
        updates, state = opt.update(grads, state, params, donate=donate)
        history.append(tree_clone(updates))
        params = apply_updates(params, updates, donate=donate)
    return params, state, history


@settings(max_examples=30, deadline=None)
@given(name=names, seed=seeds)
def test_pure_update_leaves_inputs_unchanged(random_tree, name, seed):
    opt = OPTIMIZERS[name]()
    params = random_tree(seed)
    state = opt.init(params)
    _, state = opt.update(random_tree(seed + 1), state, params)  # a non-trivial state
    grads = random_tree(seed + 2)
    copies = tree_clone((grads, state, params))
    updates, new_state = opt.update(grads, state, params)
    apply_updates(params, updates)
    assert tree_allclose((grads, state, params), copies)
    # Updates never share memory with the new state (later in-place ops would corrupt it).
    state_ptrs = {t.data_ptr() for t in tensor_leaves(new_state)}
    assert not state_ptrs & {t.data_ptr() for t in tensor_leaves(updates)}


@settings(max_examples=30, deadline=None)
@given(name=names, seed=seeds)
def test_deterministic_and_donate_equals_pure(random_tree, name, seed):
    p1, s1, h1 = _run(OPTIMIZERS[name](), random_tree, seed, donate=False)
    p2, s2, h2 = _run(OPTIMIZERS[name](), random_tree, seed, donate=False)
    p3, s3, h3 = _run(OPTIMIZERS[name](), random_tree, seed, donate=True)
    assert tree_allclose((p1, s1, h1), (p2, s2, h2))  # bit for bit
    assert tree_allclose((p1, s1, h1), (p3, s3, h3))
