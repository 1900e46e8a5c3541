"""Multi-rank scenarios of "the layout is a value" (run by parallel_worker.py on every rank).

- two models with the same parameter names and different plans train side by side, and each
  equals its own single-process run (computed here without the parallel package);
- OptimizerMonitor and NaNMonitor, run through `fit` under fsdp, report what one process does.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

import functrain
from functrain import parallel as fdist
from functrain.parallel import plans as fplans

BF16 = fplans.fsdp(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
SIDE_STEPS = 6


def sgd():
    # plain SGD, no clipping: a gradient that is summed instead of averaged over the ranks (or
    # not reduced at all) changes every update, so the comparison below catches it
    return functrain.optim.sgd(0.5)


def bf16_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x).float(), y)


def _mixed_precision_reference(make, batches, rank_slice, world: int) -> dict:
    """What fsdp(param_dtype=bf16, reduce_dtype=fp32) on `world` ranks computes, by hand in one
    process: each rank's slice runs with bf16 copies of the fp32 weights and bf16 inputs, the
    gradients are cast to fp32, averaged over the ranks and applied to the fp32 weights."""
    model = make("mlp")
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    for batch in batches("mlp", SIDE_STEPS):
        total = None
        for r in range(world):
            x, y = rank_slice(batch, r, world)
            low = {k: v.to(torch.bfloat16).requires_grad_() for k, v in params.items()}
            logits = torch.func.functional_call(model, low, (x.to(torch.bfloat16),))
            grads = torch.autograd.grad(F.cross_entropy(logits.float(), y), list(low.values()))
            grads = [g.float() for g in grads]
            total = grads if total is None else [a + b for a, b in zip(total, grads)]
        params = {k: p - 0.5 * (g / world) for (k, p), g in zip(params.items(), total)}
    return params


def _fp32_reference(make, batches) -> dict:
    """Plain SGD on the global batches, by hand in one process."""
    model = make("mlp")
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    for x, y in batches("mlp", SIDE_STEPS):
        leaves = {k: v.requires_grad_() for k, v in params.items()}
        loss = F.cross_entropy(torch.func.functional_call(model, leaves, (x,)), y)
        grads = torch.autograd.grad(loss, list(leaves.values()))
        params = {k: (p - 0.5 * g).detach() for (k, p), g in zip(leaves.items(), grads)}
    return params


def scenario_side_by_side(world, *, make, batches, rank_slice, classify_loss, max_error, mesh_for):
    """Model A (fsdp, bf16 compute) and model B (ddp, fp32), with identical parameter names,
    take turns on the same ranks; each must equal its own single-process run."""
    rank0 = torch.distributed.get_rank() == 0
    ref_a = _mixed_precision_reference(make, batches, rank_slice, world) if rank0 else None
    ref_b = _fp32_reference(make, batches) if rank0 else None
    mesh = mesh_for(world)
    model_a, model_b = make("mlp"), make("mlp")
    a = functrain.init(model_a, sgd(), seed=0, mesh=mesh, plan=BF16)
    b = functrain.init(model_b, sgd(), seed=0, mesh=mesh, plan="ddp")
    step_a = functrain.make_step(model_a, bf16_loss, sgd())
    step_b = functrain.make_step(model_b, classify_loss, sgd())
    rank, n = fdist.data_parallel_info(a.layout)
    for batch in batches("mlp", SIDE_STEPS):
        local = rank_slice(batch, rank, n)
        a, _ = step_a(a, local)
        b, _ = step_b(b, local)
    return {
        "a_error": max_error(fdist.full_params(a.params), ref_a),
        "b_error": max_error(fdist.full_params(b.params), ref_b),
        # the two references differ: the comparison can tell bf16 compute from fp32
        "bf16_vs_fp32": max_error(ref_a, ref_b),
        "plans": [a.layout.plan.name, b.layout.plan.name],
        "a_param_dtype": str(a.layout.policy("fc1.weight").param_dtype),
        "b_param_dtype": str(b.layout.policy("fc1.weight").param_dtype),
    }


class _Recorder:
    def __init__(self):
        self.values: dict[int, dict] = {}

    def log_metrics(self, metrics, step):
        self.values.setdefault(step, {}).update(metrics)


def _monitored_fit(make, classify_loss, mesh, plan, data, monitors, aux=None):
    model = make("mlp")
    state = functrain.init(model, sgd(), seed=0, mesh=mesh, plan=plan)

    def loss_fn(model, batch):
        loss = classify_loss(model, batch)
        return (loss, aux(batch)) if aux is not None else loss

    step = functrain.make_step(model, loss_fn, sgd(), report_grad_norms=True)
    recorder = _Recorder()
    state = functrain.fit(
        step, state, data, duration="3ba", callbacks=monitors, loggers=[recorder],
        log_interval="1ba",
    )  # fmt: skip
    return state, recorder.values


def scenario_optimizer_monitor(world, *, make, batches, classify_loss, mesh_for, **_):
    """OptimizerMonitor through fit: under fsdp on `world` ranks vs one process, same norms."""
    from functrain.callbacks import OptimizerMonitor
    from functrain.data import Loader

    x = torch.cat([b[0] for b in batches("mlp", 3)])
    y = torch.cat([b[1] for b in batches("mlp", 3)])
    data = Loader(torch.utils.data.TensorDataset(x, y), batch_size=8, shuffle=False)
    monitor = OptimizerMonitor(interval="1ba", group_by="module")
    _, alone = _monitored_fit(make, classify_loss, None, "local", data, [monitor])
    mesh = mesh_for(world)
    monitor = OptimizerMonitor(interval="1ba", group_by="module")
    _, sharded = _monitored_fit(make, classify_loss, mesh, "fsdp", data, [monitor])
    keys = sorted(k for k in alone[1] if k.startswith("l2_norm/"))
    errors = [
        abs(sharded[step][k] - alone[step][k]) / max(1.0, abs(alone[step][k]))
        for step in alone
        for k in keys
    ]
    return {
        "keys": keys,
        "max_rel_error": max(errors),
        "param_norm_fc1": [sharded[3]["l2_norm/param/fc1"], alone[3]["l2_norm/param/fc1"]],
    }


def scenario_nan_monitor(world, *, make, classify_loss, mesh_for, batches, **_):
    """A metric that is NaN on one rank only trips NaNMonitor on every rank, at the same step."""
    from functrain.callbacks import NaNMonitor, NonFiniteError
    from functrain.data import Loader

    x = torch.cat([b[0] for b in batches("mlp", 3)])
    y = torch.cat([b[1] for b in batches("mlp", 3)])
    data = Loader(torch.utils.data.TensorDataset(x, y), batch_size=8, shuffle=False)
    last_rank = torch.distributed.get_rank() == world - 1
    seen = []

    def probe(batch):  # NaN on the last rank from its second batch on; 0 everywhere else
        seen.append(1)
        bad = last_rank and len(seen) >= 2
        return {"probe": torch.tensor(math.nan if bad else 0.0)}

    mesh = mesh_for(world)
    try:
        _monitored_fit(
            make, classify_loss, mesh, "fsdp", data, [NaNMonitor(("probe",), interval="1ba")],
            aux=probe,
        )  # fmt: skip
    except Exception as error:  # the loop wraps callback errors; find the monitor's
        cause = error
        while cause is not None and not isinstance(cause, NonFiniteError):
            cause = cause.__cause__
        return {"raised": cause is not None, "message": str(cause or error)}
    return {"raised": False, "message": None}
