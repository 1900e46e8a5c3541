"""The child process of test_untrusted.py: loads crafted checkpoints under a memory limit.

    python untrusted_worker.py JOBS.json RESULTS.jsonl LIMIT_MB

Each job names a mode (how to load) and a path. Before a job the worker writes `{"start": id}`
to RESULTS and flushes, after it `{"id", "status", ...}`: "error" (a CheckpointError: the
message and class are kept), "correct" (loaded, and equal bit for bit to what was saved),
"wrong" (loaded, with other values) or "exception" (any other exception). A crash or a hang
leaves a "start" without a result: the parent sees it and names the job.

The address-space limit (RLIMIT_AS) is set after the imports and a warm-up load, at what the
process uses plus LIMIT_MB: an attack that makes the reader allocate beyond that fails there.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ckpt_helpers import blank_like, same_bits  # noqa: E402

import functrain  # noqa: E402
from functrain import checkpoint  # noqa: E402
from functrain.checkpoint import CheckpointError  # noqa: E402
from functrain.tree import leaves_with_paths  # noqa: E402

_REFERENCES: dict[int, functrain.TrainState] = {}


def small_state(seed: int) -> functrain.TrainState:
    """A TrainState with every kind of leaf the format stores (float32, bf16, fp8 and int64
    tensors, int/float/bool/str scalars, a callback's saved state) but few directories: the
    attack suite makes hundreds of copies of it. Step 7 + seed."""
    gen = torch.Generator().manual_seed(seed)
    return functrain.TrainState(
        step=7 + seed,
        params={
            "fc.weight": torch.randn(8, 4, generator=gen),
            "fc.bias": torch.randn(8, generator=gen),
        },
        buffers={"count": torch.tensor(3 + seed)},
        opt_state=(),
        rng=functrain.RngState(seed=seed, counter=4),
        timestamp=functrain.Timestamp(epoch=1, batch=7 + seed),
        extra={
            "callbacks": {"early_stop": {"best": 0.25, "monitor": "loss", "on": True}},
            "mixed": {
                "bf16": torch.randn(5, 3, generator=gen).to(torch.bfloat16),
                "e4m3": torch.randn(4, 4, generator=gen).to(torch.float8_e4m3fn),
                "int": torch.randint(-(2**40), 2**40, (3,), generator=gen),
            },
        },
    )


def reference(seed: int) -> functrain.TrainState:
    if seed not in _REFERENCES:
        _REFERENCES[seed] = small_state(seed)
    return _REFERENCES[seed]


def same_state(a, b) -> bool:
    flat_a, flat_b = leaves_with_paths(a), leaves_with_paths(b)
    if [k for k, _ in flat_a] != [k for k, _ in flat_b]:
        return False
    for (_, x), (_, y) in zip(flat_a, flat_b):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if isinstance(x, torch.Tensor) and not same_bits(x, y):
            return False
        if not isinstance(x, torch.Tensor) and (type(x) is not type(y) or x != y):
            return False
    return True


def same_flat(loaded: dict, state) -> bool:
    """A load without `like` ({dotted key: value}) against a state."""
    expected = dict(leaves_with_paths(state))
    if set(loaded) != set(expected):
        return False
    for key, value in expected.items():
        got = loaded[key]
        if isinstance(value, torch.Tensor):
            if not (isinstance(got, torch.Tensor) and same_bits(got, value)):
                return False
        elif type(got) is not type(value) or got != value:
            return False
    return True


def run_like(job):
    state = reference(job["seed"])
    loaded = checkpoint.load(job["path"], like=blank_like(state))
    return same_state(loaded, state)


def run_nolike(job):
    return same_flat(checkpoint.load(job["path"]), reference(job["seed"]))


def run_manager(job):
    """Auto-resume of a root whose newest checkpoint (seed 1) may be damaged over seed 0's."""
    manager = checkpoint.Manager(job["path"], async_save=False, lease_ttl=job.get("ttl", 30.0))
    try:
        restored = manager.restore(blank_like(reference(1)))
    finally:
        manager.close()
    if same_state(restored, reference(1)):
        return True
    if not same_state(restored, reference(0)):
        return False
    # It resumed step 7: any newer checkpoint must have been set aside (renamed, not deleted).
    names = os.listdir(job["path"])
    newer = [
        n
        for n in names
        if n.startswith("step_")
        and n[5:].isdigit()
        and int(n[5:]) > 7
        and os.path.lexists(os.path.join(job["path"], n, "COMMIT.json"))  # (committed ones)
    ]
    aside = [n for n in names if ".corrupt-" in n]
    return not newer and len(aside) + len([n for n in names if n[5:].isdigit()]) >= 2


def run_orbax(job):
    """An orbax-layout checkpoint: {"params": {"w", "b"}, "step"} (see test_untrusted)."""
    expected = {
        "w": torch.arange(12, dtype=torch.float32).reshape(4, 3),
        "b": torch.arange(5, dtype=torch.float64) / 3,
    }
    if job.get("like", True):
        like = {"params": {k: torch.zeros_like(v) for k, v in expected.items()}, "step": 0}
        loaded = checkpoint.load(job["path"], like=like)
        params, step = loaded["params"], loaded["step"]
    else:
        flat = checkpoint.load(job["path"])
        if set(flat) != {"params.w", "params.b", "step"}:
            return False
        params, step = {"w": flat["params.w"], "b": flat["params.b"]}, flat["step"]
    return step == 42 and all(same_bits(params[k], v) for k, v in expected.items())


def run_save(job):
    """Saving keys that try to leave the directory fails (or, nested under a dict key, forms a
    safe name) and never writes outside the checkpoint's directory."""
    target = os.path.join(job["path"], "inside", "ckpt")
    value = torch.arange(2.0)
    state = {"params": {job["key"]: value}} if job.get("nested") else {job["key"]: value}
    try:
        checkpoint.save(target, state)
    finally:
        written = [
            os.path.relpath(os.path.join(folder, name), job["path"])
            for folder, dirs, files in os.walk(job["path"])
            for name in dirs + files
        ]
        stray = [w for w in written if w != "inside" and not w.startswith("inside/ckpt")]
        if stray:
            raise AssertionError(f"save wrote outside its directory: {stray}")
    loaded = checkpoint.load(
        target, like={k: {**v} if isinstance(v, dict) else v for k, v in state.items()}
    )
    flat = leaves_with_paths(loaded)
    return len(flat) == 1 and same_bits(flat[0][1], value)


class Counter:
    """A callback with state, as in test_untrusted's training run."""

    name = "counter"

    def __init__(self):
        self.seen = 0

    def batch_end(self, ctx):
        self.seen += 1

    def state_dict(self):
        return {"seen": self.seen, "w": torch.arange(3.0)}

    def load_state_dict(self, state):
        if not torch.equal(state["w"], torch.arange(3.0)):  # (a KeyError when it is missing)
            raise ValueError(f"restored a wrong callback state: {state!r}")
        self.seen = state["seen"]


def run_fit(job):
    """fit(autoresume=True) on a root whose newest checkpoint's loop state may be crafted."""
    from torch.utils.data import TensorDataset

    from functrain.data import Loader

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = functrain.optim.sgd(lr=0.1)
    step = functrain.make_step(model, lambda m, b: ((m(b[0]) - b[1]) ** 2).mean(), optimizer)
    state = functrain.init(model, optimizer, seed=0)
    data = TensorDataset(torch.ones(16, 3), torch.zeros(16, 1))
    counter = Counter()
    manager = checkpoint.Manager(job["path"], every="2ba", async_save=False)
    out = functrain.fit(
        step,
        state,
        Loader(data, 4, seed=1),
        duration="1ep",
        callbacks=[counter],
        checkpoints=manager,
        autoresume=True,
    )
    manager.close()
    return out.timestamp.batch == 4 and counter.seen == 4


MODES = {
    "like": run_like,
    "nolike": run_nolike,
    "manager": run_manager,
    "orbax": run_orbax,
    "save": run_save,
    "save-nested": run_save,
    "fit": run_fit,
}


def warm_up(path: str) -> None:
    """One real save and load, so that lazily started thread pools count before the limit."""
    checkpoint.save(path, reference(0))
    checkpoint.load(path, like=blank_like(reference(0)))
    checkpoint.load(path)


def main() -> None:
    jobs_file, results_file, limit_mb = sys.argv[1], sys.argv[2], int(sys.argv[3])
    jobs = json.loads(Path(jobs_file).read_text())
    warm_up(results_file + ".warmup")
    reference(1)
    with open("/proc/self/statm") as f:
        used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = used + limit_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    with open(results_file, "a") as out:
        for job in jobs:
            out.write(json.dumps({"start": job["id"]}) + "\n")
            out.flush()
            result = {"id": job["id"]}
            try:
                result["status"] = "correct" if MODES[job["mode"]](job) else "wrong"
            except CheckpointError as err:
                result.update(status="error", type=type(err).__name__, message=str(err)[:600])
            except BaseException as err:  # noqa: BLE001 -- reported as a failure of the attack
                result.update(status="exception", type=type(err).__name__, message=str(err)[:600])
            out.write(json.dumps(result) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
