"""The `restore_speed` check of `python -m bench gpu_check`: a checkpoint restored from local disk
into device memory, against the raw read of the same bytes and `torch.load`.

What only a GPU machine shows (issue 27.3-4): the restore a preempted job pays on every rank, from
its local NVMe into the accelerator. A state of `--restore-mb` MB (64 float32 leaves) lives on the
device; it is saved once with `checkpoint.save`, with `torch.save` and as one raw file, and each is
read back into device memory, interleaved and repeated (medians): functrain
`checkpoint.load(like=state)`; the raw bytes read and copied to the device; `torch.load(...,
map_location=device)`. The restored leaves must equal the saved ones exactly. The disk's page
cache is warm for every variant alike (a cold read needs root to drop caches).

With `--device cpu` it runs as a dry run of itself (the host is the device), so a CPU test keeps it
working.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import torch


def _state(megabytes: float, device: str) -> dict[str, torch.Tensor]:
    per_leaf = max(1, int(megabytes * 2**20 / 4 / 64))
    gen = torch.Generator().manual_seed(0)
    return {f"w{i:02d}": torch.randn(per_leaf, generator=gen).to(device) for i in range(64)}


def _synchronized(ctx) -> None:
    if ctx.device == "cuda":
        torch.cuda.synchronize()


def check_restore_speed(ctx):
    """The check: a `bench.gpu_check.Result` (imported here: gpu_check imports this module)."""
    from bench.gpu_check import Result, ok
    from functrain import checkpoint

    state = _state(ctx.restore_mb, ctx.device)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    with tempfile.TemporaryDirectory() as root:
        ours, theirs, raw = (os.path.join(root, n) for n in ("functrain", "torch.pt", "raw.bin"))
        checkpoint.save(ours, state)
        torch.save({k: v.cpu() for k, v in state.items()}, theirs)
        with open(raw, "wb") as f:
            for t in state.values():
                f.write(t.cpu().numpy().tobytes())

        def load_functrain():
            return checkpoint.load(ours, like=state)

        def load_raw():
            with open(raw, "rb") as f:
                host = torch.frombuffer(bytearray(f.read()), dtype=torch.float32)
            return host.to(ctx.device)

        def load_torch():
            return torch.load(theirs, map_location=ctx.device, weights_only=True)

        variants = {"functrain": load_functrain, "raw": load_raw, "torch.load": load_torch}
        times: dict[str, list[float]] = {name: [] for name in variants}
        restored = None
        for rep in range(ctx.restore_reps):
            names = list(variants)
            for name in names[rep % 3 :] + names[: rep % 3]:
                _synchronized(ctx)
                started = time.perf_counter()
                out = variants[name]()
                _synchronized(ctx)
                times[name].append(time.perf_counter() - started)
                if name == "functrain":
                    restored = out
    median = {name: statistics.median(ts) for name, ts in times.items()}
    same = restored is not None and all(
        torch.equal(restored[k], v) and restored[k].device == v.device for k, v in state.items()
    )
    mb_s = {name: nbytes / 2**20 / s for name, s in median.items()}
    ratio = median["functrain"] / median["raw"]
    return Result(
        ok(same),
        f"{nbytes / 2**20:.0f} MB into {ctx.device}: functrain {mb_s['functrain']:.0f} MB/s, raw "
        f"read+copy {mb_s['raw']:.0f} MB/s ({ratio:.2f}x its time), torch.load "
        f"{mb_s['torch.load']:.0f} MB/s",
        f"medians of {ctx.restore_reps}; restored exactly on the device: {same}",
        {"seconds": median, "mb_per_s": mb_s, "vs_raw": ratio, "exact": same},
    )
