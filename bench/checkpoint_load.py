"""Checkpoint loads only: raw read vs functrain vs its tensorstore-only path vs DCP, interleaved.

The state of `bench/checkpoint.py` (an MLP with AdamW moments, `--mb` MB) is saved once by each
variant; then every load runs in turn, the order rotating each repetition, and the table shows
median seconds and MB/s. "functrain, tensorstore only" is the same load with the local direct
reads of `functrain.checkpoint.local_chunks` turned off (what every local load did before them),
so a change to the read path is measured against its predecessor in one run. Files are read
just after being written (page cache warm for every variant alike): "raw read" is one
`f.read()` of the same bytes from one file.

Run:
    python bench/checkpoint_load.py [--mb 96] [--reps 7] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings

if __package__ in (None, ""):  # run as `python bench/checkpoint_load.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.checkpoint import Variants, build_state, tensor_bytes  # noqa: E402
from bench.common import markdown_table  # noqa: E402
from functrain import checkpoint  # noqa: E402
from functrain.checkpoint import local_chunks  # noqa: E402

LABELS = {
    "raw": "disk: raw read",
    "functrain": "functrain load",
    "tensorstore": "functrain load, tensorstore only",
    "dcp": "torch.distributed.checkpoint load",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/checkpoint_load.py")
    parser.add_argument("--mb", type=float, default=96.0)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    state = build_state(args.mb)
    mb = tensor_bytes(state) / 2**20
    variants = Variants(state)
    workdir = tempfile.mkdtemp(prefix="functrain-bench-load-", dir=args.dir)
    direct = local_chunks.direct

    def tensorstore_only(path):
        local_chunks.direct = lambda *_: False
        try:
            checkpoint.load(path, like=state)
        finally:
            local_chunks.direct = direct

    try:
        paths = {k: os.path.join(workdir, k) for k in ("raw", "functrain", "dcp")}
        variants.raw_save(paths["raw"])
        variants.functrain_save(paths["functrain"])
        variants.dcp_save(paths["dcp"])
        loads = {
            "raw": lambda: variants.raw_load(paths["raw"]),
            "functrain": lambda: variants.functrain_load(paths["functrain"]),
            "tensorstore": lambda: tensorstore_only(paths["functrain"]),
            "dcp": lambda: variants.dcp_load(paths["dcp"]),
        }
        for load in loads.values():  # one-time costs (imports, thread start-up): untimed
            load()
        names = list(loads)
        times: dict[str, list[float]] = {name: [] for name in names}
        for rep in range(args.reps):
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                start = time.perf_counter()
                loads[name]()
                times[name].append(time.perf_counter() - start)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    median = {k: statistics.median(v) for k, v in times.items()}
    rows = [
        [LABELS[k], median[k], mb / median[k], median[k] / median["raw"], median[k] / median["dcp"]]
        for k in names
    ]
    print(f"state: {mb:.1f} MB in {len(variants.flat)} leaves; {args.reps} reps")
    print(markdown_table(["load", "median s", "MB/s", "vs raw read", "vs DCP"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
