"""The laws for a `Transform` (an optax-style `init`/`update` pair), checked by calling it.

Each function checks one law on one `Case`: the case's model gives the parameters, `case.grads`
gives random gradients, and the transform runs `steps` updates (each with `time=` a timestamp, as
the step passes it), the parameters moving by `apply_updates`. Without `donate` an update must be
pure, deterministic, and is compared leaf by leaf. `functrain.testing.laws` drives them.

Example:
    >>> purity(functrain.optim.adamw(1e-3), Case(), Options())
"""

from __future__ import annotations

from typing import Any

from ..optim import Transform, apply_updates, chain
from ..units import Timestamp
from .algorithm_laws import Options
from .cases import Case
from .compare import snapshot, tree_difference
from .runner import LawError, name_of


def _params(case: Case) -> dict:
    model = case.model()
    return {k: p.detach() for k, p in model.named_parameters() if p.requires_grad}


def _time(i: int, steps: int) -> Timestamp:
    return Timestamp(batch=i, max_batches=steps, batches_per_epoch=steps)


def _run(transform: Transform, case: Case, opts: Options) -> tuple[list, Any, dict]:
    """Every step's updates, the final transform state and the final parameters."""
    params = _params(case)
    state = transform.init(params)
    updates_seen = []
    for i in range(opts.steps):
        updates, state = transform.update(
            case.grads(params, i), state, params, time=_time(i, opts.steps)
        )
        params = apply_updates(params, updates)
        updates_seen.append(updates)
    return updates_seen, state, params


def purity(transform: Transform, case: Case, opts: Options) -> None:
    """`init` leaves the parameters untouched; `update` its gradients, state and parameters."""
    subject = name_of(transform)
    params = _params(case)
    before = snapshot(params)
    state = transform.init(params)
    gap = tree_difference(before, params)
    if gap is not None:
        raise LawError("purity", subject, case, "init modified the parameters", gap)
    for i in range(opts.steps):
        grads = case.grads(params, i)
        inputs = {"grads": grads, "state": state, "params": params}
        before = snapshot(inputs)
        updates, state = transform.update(grads, state, params, time=_time(i, opts.steps))
        for name in ("grads", "state", "params"):
            gap = tree_difference(before[name], inputs[name])
            if gap is not None:
                raise LawError(
                    "purity",
                    subject,
                    case,
                    f"update {i + 1} modified its input {name} (without donate=True an update "
                    "must return new tensors)",
                    gap,
                )
        params = apply_updates(params, updates)


def determinism(transform: Transform, case: Case, opts: Options) -> None:
    """The same inputs give the same updates, state and parameters."""
    gap = tree_difference(_run(transform, case, opts), _run(transform, case, opts))
    if gap is not None:
        raise LawError(
            "determinism",
            name_of(transform),
            case,
            f"two runs of {opts.steps} updates from the same inputs differ "
            "(leaf paths: 0 = updates per step, 1 = state, 2 = params)",
            gap,
        )


def _compare(law: str, subject: str, case: Case, expected, got, what: str, opts: Options) -> None:
    # Updates and parameters only: the two transforms' states need not have the same shape.
    exp_updates, _, exp_params = expected
    got_updates, _, got_params = got
    gap = tree_difference(
        (exp_updates, exp_params), (got_updates, got_params), rtol=opts.rtol, atol=opts.atol
    )
    if gap is not None:
        raise LawError(
            law, subject, case, what + " (leaf paths: 0 = updates per step, 1 = params)", gap
        )


def identity_at_zero(zero: Transform, reference: Transform, case: Case, opts: Options) -> None:
    """At zero strength the transform's updates equal `reference`'s (by default the identity)."""
    _compare(
        "identity at zero strength",
        name_of(zero),
        case,
        _run(reference, case, opts),
        _run(zero, case, opts),
        "at zero strength its updates differ from the reference's "
        "(expected: reference, got: the transform)",
        opts,
    )


def commutes(a: Transform, b: Transform, case: Case, opts: Options) -> None:
    """`chain(a, b)` updates exactly as `chain(b, a)`."""
    _compare(
        "commutation",
        f"{name_of(a)} with {name_of(b)}",
        case,
        _run(chain(a, b), case, opts),
        _run(chain(b, a), case, opts),
        "chain(a, b) and chain(b, a) differ (expected: chain(a, b), got: chain(b, a))",
        opts,
    )


def order(first: Transform, second: Transform, reference: Transform, case: Case, opts: Options):
    """`chain(first, second)` updates exactly as `reference`."""
    _compare(
        "order",
        f"{name_of(first)} then {name_of(second)}",
        case,
        _run(reference, case, opts),
        _run(chain(first, second), case, opts),
        "chain(first, second) differs from the reference (expected: reference, got: chain)",
        opts,
    )


def orders_differ(first: Transform, second: Transform, case: Case, opts: Options) -> bool:
    """Whether `chain(first, second)` and `chain(second, first)` differ on `case`."""
    a, b = _run(chain(first, second), case, opts), _run(chain(second, first), case, opts)
    return tree_difference((a[0], a[2]), (b[0], b[2])) is not None


__all__ = ["commutes", "determinism", "identity_at_zero", "order", "orders_differ", "purity"]
