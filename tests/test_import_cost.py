"""Start-up cost, structurally (issue 15.5): `import functrain` leaves the heavy modules out.

DTensor (`torch.distributed.tensor`, which pulls sympy), tensorstore and ml_dtypes (the checkpoint
format), torch._dynamo and the rest below are imported only by the features that use them. Each
check runs in a fresh interpreter, since this test process has long imported all of them. No
timings here: bench/import_time.py measures the seconds.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from functrain._lazy import is_dtensor, lazy_exports

ROOT = Path(__file__).resolve().parents[1]
HEAVY = [
    "torch.distributed.tensor",
    "torch.distributed._functional_collectives",
    "torch._dynamo",
    "torch._inductor",
    "torch.fx.experimental.symbolic_shapes",
    "sympy",
    "mpmath",
    "tensorstore",
    "ml_dtypes",
    "safetensors",
    "orbax",
]


def run_fresh(code: str) -> dict:
    """Run `code` in a new interpreter (this checkout first); it prints one JSON line."""
    prelude = f"import json, sys\nHEAVY = {HEAVY!r}\n"
    proc = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_functrain_loads_none_of_the_heavy_modules():
    out = run_fresh(
        """
        import torch
        by_torch = set(sys.modules)
        import functrain
        from functrain import make_step, fit, init, optim, schedules, parallel, checkpoint
        print(json.dumps({"loaded": [m for m in HEAVY if m in sys.modules and m not in by_torch]}))
        """
    )
    assert out["loaded"] == [], f"import functrain pulled in {out['loaded']}"


def test_the_public_api_resolves_and_lists_every_lazy_name():
    out = run_fresh(
        """
        import functrain, functrain.checkpoint as ckpt, functrain.parallel as par
        missing = {
            pkg.__name__: [n for n in pkg.__all__ if n not in dir(pkg)]
            for pkg in (functrain, ckpt, par)
        }
        values = {pkg.__name__: [getattr(pkg, n) is not None for n in pkg.__all__]
                  for pkg in (functrain, ckpt, par)}
        from functrain.parallel import fsdp, Plan, LOCAL
        from functrain.checkpoint import Manager, load, save, storage  # a name and a submodule
        from functrain.checkpoint import *  # noqa: every __all__ name resolves
        print(json.dumps({
            "missing": missing,
            "resolved": {k: all(v) for k, v in values.items()},
            "same": Manager is ckpt.manager.Manager and fsdp is par.plans.fsdp,
            "storage_is_module": type(storage).__name__ == "module",
        }))
        """
    )
    assert out["missing"] == {"functrain": [], "functrain.checkpoint": [], "functrain.parallel": []}
    assert all(out["resolved"].values()) and out["same"] and out["storage_is_module"]


def test_checkpointing_imports_tensorstore_and_round_trips():
    out = run_fresh(
        """
        import tempfile, torch, functrain
        before = [m for m in ("tensorstore", "ml_dtypes") if m in sys.modules]
        model = torch.nn.Linear(3, 2)
        state = functrain.init(model, functrain.optim.sgd(lr=0.1), seed=0)
        with tempfile.TemporaryDirectory() as root:
            functrain.checkpoint.save(root + "/ckpt", state)
            back = functrain.checkpoint.load(root + "/ckpt", like=state)
        print(json.dumps({
            "before": before,
            "after": [m for m in ("tensorstore", "ml_dtypes") if m in sys.modules],
            "equal": all(torch.equal(back.params[k], v) for k, v in state.params.items()),
        }))
        """
    )
    assert out["before"] == []
    assert out["after"] == ["tensorstore", "ml_dtypes"] and out["equal"]


def test_a_mesh_plan_imports_dtensor_and_the_step_sees_dtensors():
    out = run_fresh(
        """
        import torch, torch.distributed as dist, functrain
        from functrain._lazy import is_dtensor
        before = "torch.distributed.tensor" in sys.modules
        plain = is_dtensor(torch.zeros(1))  # must not import DTensor to answer
        still_out = "torch.distributed.tensor" not in sys.modules
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        mesh = functrain.parallel.init_mesh(dp_shard=1, device_type="cpu")
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        opt = functrain.optim.adamw(lr=1e-2)
        state = functrain.init(model, opt, seed=0, mesh=mesh, plan="ddp")
        def loss_fn(model, batch):
            return torch.nn.functional.cross_entropy(model(batch[0]), batch[1])

        step = functrain.make_step(model, loss_fn, opt)
        batch = (torch.randn(8, 4), torch.randint(0, 2, (8,)))
        new, metrics = step(state, batch)
        kinds = sorted({type(v).__name__ for v in new.params.values()})
        print(json.dumps({
            "before": before, "plain": plain, "still_out": still_out,
            "after": "torch.distributed.tensor" in sys.modules,
            "kinds": kinds, "all_dtensor": all(is_dtensor(v) for v in new.params.values()),
            "moved": any(not torch.equal(new.params[k].to_local(), state.params[k].to_local())
                         for k in state.params),
            "loss_finite": bool(torch.isfinite(torch.as_tensor(metrics["loss"])).all()),
        }))
        functrain.parallel.shutdown()
        """
    )
    assert not out["before"] and not out["plain"] and out["still_out"]
    assert out["after"] and out["kinds"] == ["DTensor"] and out["all_dtensor"]
    assert out["moved"] and out["loss_finite"]


def test_is_dtensor_is_false_for_plain_tensors_and_subclasses():
    assert not is_dtensor(torch.zeros(2))
    assert not is_dtensor(torch.nn.Parameter(torch.zeros(2)))
    assert not is_dtensor(None) and not is_dtensor(3.0)


def test_lazy_exports_binds_on_first_read_and_rejects_unknown_names(monkeypatch):
    import types

    package = types.ModuleType("fake_lazy_pkg")
    package.__path__ = []  # a package: relative imports resolve against it
    monkeypatch.setitem(sys.modules, "fake_lazy_pkg", package)
    child = types.ModuleType("fake_lazy_pkg.child")
    child.VALUE = object()
    monkeypatch.setitem(sys.modules, "fake_lazy_pkg.child", child)
    getattr_, dir_ = lazy_exports("fake_lazy_pkg", {"VALUE": ".child"})
    assert "VALUE" in dir_() and "VALUE" not in vars(package)
    assert getattr_("VALUE") is child.VALUE
    assert vars(package)["VALUE"] is child.VALUE  # bound: the next read skips __getattr__
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        getattr_("nope")


def test_a_lazily_imported_submodule_reads_as_an_attribute():
    """`functrain.parallel.plans.fsdp(...)` worked when the package imported `plans` eagerly;
    it still does, importing the submodule (and DTensor) on that read only."""
    out = run_fresh(
        """
        import functrain.parallel as parallel
        before = "torch.distributed.tensor" in sys.modules
        plan = parallel.plans.fsdp(reshard_after_forward=True)
        from functrain import checkpoint
        print(json.dumps({
            "before": before,
            "reshard": plan.reshard_after_forward,
            "reader": checkpoint.reader.__name__,
            "unknown": hasattr(parallel, "no_such_module"),
        }))
        """
    )
    assert out == {
        "before": False,
        "reshard": True,
        "reader": "functrain.checkpoint.reader",
        "unknown": False,
    }


def test_one_process_trains_and_checkpoints_without_importing_dtensor():
    """`init`, a step and `fit` in one process with no mesh: the plans and DTensor (about a
    second of import) are never needed, so never loaded."""
    out = run_fresh(
        """
        import os
        os.environ.pop("WORLD_SIZE", None)
        import torch
        import functrain
        model = torch.nn.Linear(4, 2)
        opt = functrain.optim.adamw(1e-2)
        state = functrain.init(model, opt, seed=0)
        step = functrain.make_step(model, lambda m, b: m(b).square().mean(), opt)
        state = functrain.fit(step, state, [torch.randn(8, 4)] * 3, duration="3ba", progress=False)
        print(json.dumps({"dtensor": "torch.distributed.tensor" in sys.modules,
                          "step": state.step, "layout": state.layout is None}))
        """
    )
    assert out == {"dtensor": False, "step": 3, "layout": True}


def test_import_functrain_registers_no_exit_hook_and_changes_nothing_in_torch():
    """Issue 26.3: importing functrain (and its process-level modules) registers no atexit
    callback and leaves torch's `torch.distributed.nn.functional` untouched; the exit hook comes
    once, when functrain creates the default process group."""
    out = run_fresh(
        """
        import atexit
        import optree  # functrain's pytree library registers its own (C++) exit callbacks
        import torch
        import torch.distributed.nn.functional as tdnf
        defaults = {n: f.__defaults__ for n, f in vars(tdnf).items() if callable(f)
                    and getattr(f, "__defaults__", None)}
        before = atexit._ncallbacks()
        import functrain
        from functrain import parallel, checkpoint, launch
        from functrain.parallel import teardown
        import functrain.step, functrain.loop, functrain._torch
        after_import = atexit._ncallbacks()
        same = all(getattr(tdnf, n).__defaults__ is d for n, d in defaults.items())
        parallel.init_distributed()        # functrain creates the default group: one hook
        after_init = atexit._ncallbacks()
        parallel.init_mesh()               # the group exists: no second hook
        teardown.on_exit(lambda: None)
        print(json.dumps({"import": after_import - before, "torch_same": same,
                          "init": after_init - before, "more": atexit._ncallbacks() - before}))
        """
    )
    assert out == {"import": 0, "torch_same": True, "init": 1, "more": 1}
