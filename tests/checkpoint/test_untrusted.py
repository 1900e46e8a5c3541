"""Checkpoints as untrusted input: every crafted or damaged checkpoint below is loaded in a child
process under an address-space limit (RLIMIT_AS) and a time limit, and must give a
CheckpointError that names the checkpoint -- or load exactly what was saved. Never a crash
(std::bad_alloc aborts the process), a hang (a FIFO), a wrong value (a flipped endian codec),
another exception, or executed code (a pickle payload creating a marker file).

The attacks are applied to copies (hard links, files replaced rather than edited) of a few
pristine checkpoints made once: a functrain Manager root of two steps (the newest one is
attacked; "manager" loads auto-resume it and must fall back to the older one or load it
correctly), orbax-layout checkpoints (zarr3; zarr2; zarr2 in OCDBT), and a root written by
`fit` with callback and data state. Attacks run in a few child processes (start-up dominates).
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest
import torch
import untrusted_attacks as atk
from torch.utils.data import TensorDataset
from untrusted_worker import Counter, small_state

import functrain
from functrain import checkpoint
from functrain.checkpoint import array_store, layout, lease_owner
from functrain.data import Loader

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS and FIFOs: Linux")

WORKER = os.path.join(os.path.dirname(__file__), "untrusted_worker.py")
STEP = "step_000000008"  # the attacked checkpoint (small_state(seed=1) has step 8)
JOB_TIMEOUT = 60.0  # seconds one load may take on a loaded machine before it counts as a hang
LIMIT_MB = 1536  # address space the child may add after its warm-up


# -- pristine checkpoints -----------------------------------------------------------------------


def _fit_root(root: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = functrain.optim.sgd(lr=0.1)
    step = functrain.make_step(model, lambda m, b: ((m(b[0]) - b[1]) ** 2).mean(), optimizer)
    data = TensorDataset(torch.ones(16, 3), torch.zeros(16, 1))
    manager = checkpoint.Manager(root, every="2ba", async_save=False)
    functrain.fit(
        step,
        functrain.init(model, optimizer, seed=0),
        Loader(data, 4, seed=1),
        duration="1ep",
        callbacks=[Counter()],
        checkpoints=manager,
    )
    manager.close()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    base = str(tmp_path_factory.mktemp("pristine"))
    root = os.path.join(base, "root")
    with pytest.MonkeyPatch.context() as patch:  # a directory per leaf: the files attacked
        patch.setattr(array_store, "CONSOLIDATE_BELOW", 0)
        manager = checkpoint.Manager(root, every=None, async_save=False)
        manager.save(small_state(0))  # step 7: what auto-resume falls back to
        manager.save(small_state(1))  # step 8: attacked
        manager.close()
        _fit_root(os.path.join(base, "fit"))
    for name, ocdbt, zarr3 in (("orbax3", False, True), ("orbax2", False, False)):
        atk.write_orbax(os.path.join(base, name), use_ocdbt=ocdbt, use_zarr3=zarr3)
    atk.write_orbax(os.path.join(base, "ocdbt"), use_ocdbt=True, use_zarr3=False)
    return base


# -- the attacks --------------------------------------------------------------------------------

Attack = collections.namedtuple("Attack", "name kind base modes mutate")
ROOT_FILES = ["COMMIT.json", "tree.json", "_METADATA", "_CHECKPOINT_METADATA",
              "commit_success.txt", "_strings.json"]  # fmt: skip


def _attacks(pristine: str, marker: str) -> list[Attack]:
    step_dir = os.path.join(pristine, "root", STEP)
    files = atk.files_of(step_dir)
    metadata = [f for f in files if "/" not in f or f.endswith("/zarr.json")]
    chunks = [f for f in files if f not in metadata]
    out: list[Attack] = []

    def add(name, kind, mutate, modes=("like",), base="root"):
        out.append(Attack(name, kind, base, modes, mutate))

    # Pickle payloads in every file (of every pickle protocol), also with the digests fixed.
    for i, name in enumerate(files):
        data = atk.pickle_bytes(marker, i % 6)
        modes = ("like", "manager") if name in ROOT_FILES else ("like",)
        add(
            f"pickle in {name}",
            "pickle",
            lambda d, n=name, b=data: atk.replace(f"{d}/{n}", b),
            modes,
        )
    for name in ("tree.json", "params.fc.weight/zarr.json", "COMMIT.json"):
        data = atk.pickle_bytes(marker, 4)
        add(f"pickle in {name}, digests fixed", "pickle",
            lambda d, n=name, b=data: (atk.replace(f"{d}/{n}", b), atk.fix_digests(d)),
            ("like", "nolike"))  # fmt: skip
    # Bit flips, truncation, missing files.
    for name in metadata + chunks:
        size = os.path.getsize(os.path.join(step_dir, name))
        for where in sorted({size // 3, size - 1}):
            add(f"bit flip at {where} of {name}", "bit flip",
                lambda d, n=name, w=where: atk.replace(
                    f"{d}/{n}", _flip(atk.read(f"{d}/{n}"), w)))  # fmt: skip
        for keep in sorted({0, size - 1}):
            add(f"truncated to {keep} bytes: {name}", "truncation",
                lambda d, n=name, k=keep: atk.replace(f"{d}/{n}", atk.read(f"{d}/{n}")[:k]))  # fmt: skip
        add(f"missing {name}", "missing file", lambda d, n=name: os.unlink(f"{d}/{n}"),
            ("like", "manager") if name in ROOT_FILES or name in chunks[:3] else ("like",))  # fmt: skip
    add(
        "missing array directory",
        "missing file",
        lambda d: shutil.rmtree(f"{d}/params.fc.weight"),
        ("like", "nolike", "manager"),
    )
    add("flips in several chunks", "bit flip",
        lambda d: [atk.replace(f"{d}/{c}", _flip(atk.read(f"{d}/{c}"), 7)) for c in chunks[:4]],
        ("manager",))  # fmt: skip
    _huge(add)
    _codecs(add)
    _disagreements(add)
    _special_files(add, pristine, step_dir)
    _commit(add)
    _nesting(add)
    _traversal(add, marker)
    _orbax(add)
    _loop_state(add)
    _bombs(add)
    _leases(add)
    return out


def _flip(data: bytes, where: int) -> bytes:
    data = bytearray(data)
    data[where % len(data)] ^= 0x04
    return bytes(data)


def _huge(add) -> None:
    w = "params.fc.weight"
    for modes, label in ((("like", "manager"), ""), (("nolike",), " without like")):
        add(
            f"huge chunk shape{label}",
            "huge",
            lambda d: atk.chunk_shape_of(d, w, [2**40, 4]),
            modes,
        )
        add(f"huge chunk shape, zarr.json only{label}", "huge",
            lambda d: atk.set_zarr(d, w, chunk_grid={"name": "regular",
                                   "configuration": {"chunk_shape": [2**31, 2**31]}}), modes)  # fmt: skip
        add(f"huge shape{label}", "huge", lambda d: atk.shape_of(d, w, [2**40, 4]), modes)
        add(f"huge 2-d shape{label}", "huge", lambda d: atk.shape_of(d, w, [2**31, 2**31]), modes)
        add(f"shape of 40 dimensions{label}", "huge", lambda d: atk.shape_of(d, w, [2] * 40), modes)
        add(f"negative shape{label}", "huge", lambda d: atk.shape_of(d, w, [-8, 4], [1, 4]), modes)
        add(f"zero chunk shape{label}", "huge", lambda d: atk.chunk_shape_of(d, w, [0, 4]), modes)
        add(f"chunk larger than the array{label}", "huge",
            lambda d: atk.chunk_shape_of(d, w, [9, 4]), modes)  # fmt: skip
        add(
            f"shape as a float{label}",
            "huge",
            lambda d: atk.set_zarr(d, w, shape=[8.0, 4.0]),
            modes,
        )
        add(f"chunk shape as bools{label}", "huge",
            lambda d: atk.chunk_shape_of(d, w, [True, True]), modes)  # fmt: skip


def _codecs(add) -> None:
    w = "params.fc.weight"
    crc = {"name": "crc32c"}
    little = {"name": "bytes", "configuration": {"endian": "little"}}
    chains = {
        "endian flipped to big": [{"name": "bytes", "configuration": {"endian": "big"}}, crc],
        "a transpose added": [{"name": "transpose", "configuration": {"order": [1, 0]}}, little, crc],
        "gzip added": [little, {"name": "gzip", "configuration": {"level": 5}}, crc],
        "blosc added": [little, {"name": "blosc", "configuration": {"cname": "lz4", "clevel": 5,
                        "shuffle": "shuffle", "typesize": 4, "blocksize": 0}}, crc],
        "zstd added": [little, {"name": "zstd", "configuration": {"level": 1}}, crc],
        "checksum removed": [little],
        "order swapped": [crc, little],
        "bytes codec missing": [crc],
        "no codecs": [],
        "a codec repeated": [little, crc, crc],
        "unknown codec": [little, {"name": "evil"}, crc],
        "codecs not a list": {"name": "bytes"},
        "sharding over a functrain array": [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": [1, 4], "codecs": [little], "index_codecs": [little, crc]}}],
        "bytes with an extra setting": [{"name": "bytes", "configuration": {"endian": "little",
                                         "x": 1}}, crc],
    }  # fmt: skip
    for label, chain in chains.items():
        add(f"codec tampering: {label}", "codec", lambda d, c=chain: atk.set_codecs(d, w, c),
            ("like", "nolike", "manager"))  # fmt: skip
    tweaks = {
        "fill value 1 with a chunk removed": lambda d: (
            atk.set_zarr(d, w, fill_value=1.0),
            [os.unlink(os.path.join(d, w, "c", *p)) for p in [["0", "0"]]],
        ),
        "fill value 1": lambda d: atk.set_zarr(d, w, fill_value=1.0),
        "fill value NaN": lambda d: atk.set_zarr(d, w, fill_value="NaN"),
        "attributes added": lambda d: atk.set_zarr(d, w, attributes={"x": 1}),
        "storage transformer added": lambda d: atk.set_zarr(
            d, w, storage_transformers=[{"name": "evil"}]),
        "chunk key encoding v2": lambda d: atk.set_zarr(d, w, chunk_key_encoding={
            "name": "v2", "configuration": {"separator": "."}}),
        "zarr_format 2": lambda d: atk.set_zarr(d, w, zarr_format=2),
        "node type group": lambda d: atk.set_zarr(d, w, node_type="group"),
        "rectilinear chunk grid": lambda d: atk.set_zarr(d, w, chunk_grid={
            "name": "rectilinear", "configuration": {"chunk_shapes": [[4, 4], [4]]}}),
        "dimension names": lambda d: atk.set_zarr(d, w, dimension_names=["a", "b"]),
    }  # fmt: skip
    for label, fn in tweaks.items():
        add(f"metadata tampering: {label}", "codec", fn, ("like", "nolike"))


def _disagreements(add) -> None:
    w, b = "params.fc.weight", "extra.mixed.bf16"
    cases = {
        "zarr.json float64, tree.json float32": lambda d: atk.set_zarr(d, w, data_type="float64"),
        "tree.json float64, zarr.json float32": lambda d: atk.set_leaf(d, w, dtype="float64"),
        "both float64 (the bytes are float32)": lambda d: (
            atk.set_leaf(d, w, dtype="float64"), atk.set_zarr(d, w, data_type="float64")),
        "both int32 (same width, other type)": lambda d: (
            atk.set_leaf(d, w, dtype="int32"), atk.set_zarr(d, w, data_type="int32")),
        "bf16 read as float16": lambda d: (
            atk.set_leaf(d, b, dtype="float16"), atk.set_zarr(d, b, data_type="float16")),
        "zarr.json shape transposed": lambda d: atk.set_zarr(d, w, shape=[4, 8]),
        "both shapes transposed": lambda d: atk.shape_of(d, w, [4, 8], [4, 8]),
        "tree.json shape only": lambda d: atk.set_leaf(d, w, shape=[16, 2], chunks=[16, 2]),
        "object dtype": lambda d: (
            atk.set_leaf(d, w, dtype="object"), atk.set_zarr(d, w, data_type="object")),
        "numpy object dtype string": lambda d: (
            atk.set_leaf(d, w, dtype="|O"), atk.set_zarr(d, w, data_type="|O")),
        "string dtype": lambda d: (
            atk.set_leaf(d, w, dtype="string"), atk.set_zarr(d, w, data_type="string")),
        "a tensor leaf made a scalar": lambda d: atk.set_leaf(d, w, kind="float", value=1.0),
        "a scalar leaf made a tensor": lambda d: atk.set_leaf(
            d, "rng.counter", kind="tensor", dtype="int64", shape=[], chunks=[]),
        "scalar value of another kind": lambda d: atk.set_leaf(d, "rng.counter", value="4"),
        "scalar value a float for an int": lambda d: atk.set_leaf(d, "rng.counter", value=4.5),
        "scalar value a bool for an int": lambda d: atk.set_leaf(d, "rng.counter", value=True),
        "scalar value NaN for an int": lambda d: atk.set_leaf(d, "rng.counter", value=float("nan")),
        "duplicate leaf": lambda d: atk.edit_json(
            d, "tree.json", lambda t: t["leaves"].append(dict(t["leaves"][0]))),
        "leaf removed": lambda d: atk.edit_json(d, "tree.json", lambda t: t["leaves"].pop(0)),
    }  # fmt: skip
    # The files disagree: wrong with or without `like`. (A consistent rewrite -- "both" -- is
    # another checkpoint, which only `like` can refuse.)
    for label, fn in cases.items():
        consistent = label.startswith(("both", "bf16", "a tensor", "a scalar", "scalar value"))
        modes = ("like", "manager") if consistent else ("like", "nolike", "manager")
        add(f"disagreement: {label}", "dtype/shape disagreement", fn, modes)


def _special_files(add, pristine: str, step_dir: str) -> None:
    w = "params.fc.weight"
    outside = os.path.join(pristine, "outside")
    if not os.path.exists(outside):  # another run's checkpoint, with other values
        checkpoint.save(os.path.join(outside, STEP), small_state(3).replace(step=8))
    other = os.path.join(outside, STEP)
    chunk = next(f for f in atk.files_of(step_dir) if f.startswith(w + "/c/"))
    add(
        "array directory symlinked outside",
        "symlink/special",
        lambda d: atk.symlink(f"{d}/{w}", f"{other}/{w}"),
        ("like", "nolike", "manager"),
    )
    add(
        "chunk symlinked outside",
        "symlink/special",
        lambda d: atk.symlink(f"{d}/{chunk}", f"{other}/{chunk}"),
        ("like", "manager"),
    )
    add(
        "chunk symlinked to /dev/zero",
        "symlink/special",
        lambda d: atk.symlink(f"{d}/{chunk}", "/dev/zero"),
        ("like",),
    )
    add(
        "chunk symlinked to itself",
        "symlink/special",
        lambda d: atk.symlink(f"{d}/{chunk}", f"{d}/{chunk}"),
        ("like",),
    )
    add(
        "zarr.json symlinked outside",
        "symlink/special",
        lambda d: atk.symlink(f"{d}/{w}/zarr.json", f"{other}/{w}/zarr.json"),
        ("like",),
    )
    for name in ("COMMIT.json", "tree.json"):  # identical content, but from outside
        add(
            f"{name} symlinked to an identical copy outside",
            "symlink/special",
            lambda d, n=name: atk.symlink(f"{d}/{n}", _copy_outside(d, n)),
            ("like", "manager"),
        )
    for name in (chunk, f"{w}/zarr.json", "COMMIT.json", "tree.json"):
        add(
            f"FIFO in place of {name}",
            "symlink/special",
            lambda d, n=name: atk.make_fifo(f"{d}/{n}"),
            ("like", "manager"),
        )
    add(
        "FIFO in place of an array directory",
        "symlink/special",
        lambda d: atk.make_fifo(f"{d}/{w}"),
        ("like",),
    )
    add(
        "socket in place of a chunk",
        "symlink/special",
        lambda d: atk.make_socket(f"{d}/{chunk}"),
        ("like",),
    )
    if _can_mknod():
        add("character device in place of a chunk", "symlink/special",
            lambda d: (os.unlink(f"{d}/{chunk}"),
                       os.mknod(f"{d}/{chunk}", 0o600 | 0o020000, os.makedev(1, 5))),
            ("like",))  # fmt: skip
    # A symlinked step directory in a Manager root is not one of its checkpoints.
    add("newer step directory symlinked outside", "symlink/special",
        lambda d: os.symlink(other, os.path.join(os.path.dirname(d), "step_000000009")),
        ("manager",))  # fmt: skip


def _copy_outside(d: str, name: str) -> str:
    target = f"{d}.outside-{name}"
    shutil.copyfile(f"{d}/{name}", target)
    return target


def _can_mknod() -> bool:
    probe = f"/tmp/functrain-mknod-probe-{os.getpid()}"
    try:
        os.mknod(probe, 0o600 | 0o020000, os.makedev(1, 5))
    except OSError:
        return False
    os.unlink(probe)
    return True


def _commit(add) -> None:
    def rename(d, to):
        os.rename(d, os.path.join(os.path.dirname(d), to))

    cases = {
        "COMMIT step 999": (lambda d: atk.edit_json(d, "COMMIT.json", lambda c: c.update(step=999),
                                                    fix=False), ("like", "manager")),
        "tree.json step 999": (lambda d: atk.edit_json(d, "tree.json", lambda t: t.update(step=999)),
                               ("like", "manager")),
        "state step leaf 999": (lambda d: atk.set_leaf(d, "step", value=999), ("like", "manager")),
        "renamed step_000000999": (lambda d: rename(d, "step_000000999"), ("manager",)),
        "renamed step_000000001": (lambda d: rename(d, "step_000000001"), ("manager",)),
        "COMMIT step a string": (lambda d: atk.edit_json(d, "COMMIT.json",
                                 lambda c: c.update(step="8"), fix=False), ("like",)),
        "COMMIT version 99": (lambda d: atk.edit_json(d, "COMMIT.json",
                              lambda c: c.update(version=99), fix=False), ("like", "manager")),
        "COMMIT of another format": (lambda d: atk.edit_json(d, "COMMIT.json",
                                     lambda c: c.update(format="x"), fix=False), ("like",)),
        "COMMIT without digest": (lambda d: atk.edit_json(d, "COMMIT.json",
                                  lambda c: c.pop("tree_blake2b"), fix=False), ("like",)),
        "COMMIT forgets a zarr.json": (lambda d: atk.edit_json(d, "COMMIT.json",
                                       lambda c: c["files"].pop("params.fc.weight/zarr.json"),
                                       fix=False), ("like", "manager")),
        "COMMIT files not a map": (lambda d: atk.edit_json(d, "COMMIT.json",
                                   lambda c: c.update(files=[1]), fix=False), ("like",)),
        "COMMIT a list": (lambda d: atk.replace(f"{d}/COMMIT.json",
                                               b"[" + atk.read(f"{d}/COMMIT.json") + b"]"),
                          ("like", "manager")),
        "COMMIT timestamp a string": (lambda d: atk.edit_json(d, "COMMIT.json",
                                      lambda c: c.update(timestamp="x"), fix=False), ("like",)),
    }  # fmt: skip
    for label, (fn, modes) in cases.items():
        add(f"commit disagreement: {label}", "COMMIT disagreement", fn, modes)


def _nesting(add) -> None:
    levels = 100_000

    def deep_file(d, name, prefix, suffix, fix=True):
        atk.replace(f"{d}/{name}", (prefix + atk.deep(levels) + suffix).encode())
        if fix:
            atk.fix_digests(d)

    w = "params.fc.weight"
    cases = {
        "tree.json nested": lambda d: deep_file(d, "tree.json", "", ""),
        "tree.json leaves nested": lambda d: deep_file(
            d, "tree.json", '{"format":"functrain.checkpoint","version":1,"leaves":', "}"),
        "tree.json layout nested 500 levels": lambda d: atk.set_leaf(
            d, w, layout=json.loads(atk.deep(500))),
        "tree.json value nested 500 levels": lambda d: atk.set_leaf(
            d, "rng.counter", value=json.loads(atk.deep(500))),
        "COMMIT.json nested": lambda d: deep_file(d, "COMMIT.json", "", "", fix=False),
        "COMMIT.json timestamp nested": lambda d: deep_file(
            d, "COMMIT.json", '{"format":"functrain.checkpoint","version":1,"timestamp":', "}",
            fix=False),
        "zarr.json nested": lambda d: deep_file(d, f"{w}/zarr.json", "", ""),
        "zarr.json codecs nested": lambda d: atk.set_codecs(d, w, json.loads(atk.deep(500))),
    }  # fmt: skip
    for label, fn in cases.items():
        add(f"deep nesting: {label}", "deep nesting", fn, ("like", "manager"))
    add("deep nesting: LEASE.json nested", "deep nesting",
        lambda d: atk.replace(os.path.join(os.path.dirname(d), "LEASE.json"),
                              atk.deep(levels).encode()), ("manager",))  # fmt: skip


def _traversal(add, marker: str) -> None:
    w = "params.fc.weight"
    for evil in (["..", "..", "outside"], ["/etc", "passwd"], [".."], ["a\\..\\b"], ["x\0y"]):

        def edit(tree, evil=evil):
            leaf = next(x for x in tree["leaves"] if x["key"] == w)
            leaf.update(path=evil, key_types=[2] * len(evil), key=".".join(evil))

        add(f"traversal in a tree.json key {evil!r}", "traversal",
            lambda d, e=edit: atk.edit_json(d, "tree.json", e), ("like", "nolike", "manager"))  # fmt: skip
    add("traversal in COMMIT files", "traversal",
        lambda d: atk.edit_json(d, "COMMIT.json", lambda c: c["files"].update(
            {"../../outside/zarr.json": "0" * 32}), fix=False), ("like",))  # fmt: skip
    for key in ("../evil", "a/b", "..", "/abs", "tree.json", "x" * 300, "", "a\\b"):
        add(f"traversal on save: key {key[:20]!r}", "traversal", {"key": key},
            ("save", "save-nested"), base=None)  # fmt: skip


def _orbax(add) -> None:
    for base in ("orbax3", "orbax2", "ocdbt"):
        add(f"{base}: pristine", "orbax interop", lambda d: None, ("orbax", "orbax-nolike"), base)
        for name in ("_METADATA",):
            add(f"{base}: pickle in {name}", "pickle", lambda d, n=name: atk.replace(
                f"{d}/{n}", atk.pickle_bytes("/nonexistent", 2)), ("orbax",), base)  # fmt: skip
            add(f"{base}: deep {name}", "deep nesting", lambda d, n=name: atk.replace(
                f"{d}/{n}", ('{"tree_metadata":' + atk.deep(100_000) + "}").encode()),
                ("orbax",), base)  # fmt: skip
        add(f"{base}: traversal in _METADATA", "traversal", _orbax_traversal, ("orbax",), base)
        add(f"{base}: _METADATA entries malformed", "dtype/shape disagreement", lambda d:
            atk.edit_json(d, "_METADATA", lambda m: m["tree_metadata"].update(
                {"x": {"key_metadata": [{"key": [1]}], "value_metadata": 3}}), fix=False),
            ("orbax",), base)  # fmt: skip
    for where in ("manifest.ocdbt",):
        add(f"ocdbt: truncated {where}", "truncation", lambda d, n=where: atk.replace(
            f"{d}/{n}", atk.read(f"{d}/{n}")[:20]), ("orbax",), "ocdbt")  # fmt: skip
        for i in range(4):
            add(f"ocdbt: bit flip {i} in {where}", "bit flip", lambda d, n=where, i=i: atk.replace(
                f"{d}/{n}", _flip(atk.read(f"{d}/{n}"), (i * 7919) % os.path.getsize(f"{d}/{n}"))),
                ("orbax",), "ocdbt")  # fmt: skip
    add("ocdbt: data files flipped", "bit flip", _flip_ocdbt_data, ("orbax",), "ocdbt")
    w3, w2 = "params.w", "params.w"

    def zarr2(d, **changes):
        atk.edit_json(d, f"{w2}/.zarray", lambda m: m.update(changes), fix=False)

    cases3 = {
        "endian big inside the shard": lambda d: _orbax_codecs(d, endian="big"),
        "inner chunk huge": lambda d: _orbax_codecs(d, inner=[2**31, 2**31]),
        "gzip inside the shard": lambda d: _orbax_codecs(d, compressor={"name": "gzip"}),
        "shape huge": lambda d: atk.edit_json(d, f"{w3}/zarr.json", lambda m: m.update(
            shape=[2**40, 3], chunk_grid={"name": "regular",
                                          "configuration": {"chunk_shape": [4, 3]}}), fix=False),
        "shape transposed": lambda d: atk.edit_json(d, f"{w3}/zarr.json", lambda m: m.update(
            shape=[3, 4], chunk_grid={"name": "regular",
                                      "configuration": {"chunk_shape": [3, 4]}}), fix=False),
    }  # fmt: skip
    for label, fn in cases3.items():
        add(f"orbax3: {label}", "codec", fn, ("orbax", "orbax-nolike"), "orbax3")
    cases2 = {
        "Fortran order": dict(order="F"),
        "big-endian dtype": dict(dtype=">f4"),
        "object dtype": dict(dtype="|O"),
        "a filter": dict(filters=[{"id": "delta", "dtype": "<f4"}]),
        "gzip compressor": dict(compressor={"id": "gzip", "level": 1}),
        "huge chunks": dict(chunks=[2**31, 2**31]),
        "huge shape": dict(shape=[2**40, 3]),
        "fill value 1": dict(fill_value=1),
    }
    for label, changes in cases2.items():
        add(f"orbax2: {label}", "codec", lambda d, c=changes: zarr2(d, **c),
            ("orbax", "orbax-nolike"), "orbax2")  # fmt: skip


def _orbax_traversal(d):
    def edit(meta):
        entry = next(iter(meta["tree_metadata"].values()))
        entry["key_metadata"] = [{"key": "..", "key_type": 2}, {"key": "etc", "key_type": 2}]

    atk.edit_json(d, "_METADATA", edit, fix=False)


def _orbax_codecs(d, endian="little", inner=None, compressor=None):
    def edit(meta):
        config = meta["codecs"][0]["configuration"]
        config["codecs"][0] = {"name": "bytes", "configuration": {"endian": endian}}
        if inner is not None:
            config["chunk_shape"] = inner
        if compressor is not None:
            config["codecs"][1] = compressor

    atk.edit_json(d, "params.w/zarr.json", edit, fix=False)


def _flip_ocdbt_data(d):
    for name in atk.files_of(d):
        if name.startswith("d/") or "/d/" in name:
            atk.replace(f"{d}/{name}", _flip(atk.read(f"{d}/{name}"), 10))


def _loop_state(add) -> None:
    good = {"seen": 4, "w": {"__tensor__": "float32", "shape": [3], "data": [0.0, 1.0, 2.0]}}

    def with_state(value, key="extra.callbacks.counter"):
        def mutate(d):
            atk.set_leaf(d, key, value=value if isinstance(value, str) else json.dumps(value))

        return mutate

    cases = {
        "not JSON": with_state("{not json"),
        "dtype names a torch function": with_state({**good, "w": {**good["w"], "__tensor__": "load"}}),
        "dtype names a dunder": with_state({**good, "w": {**good["w"], "__tensor__": "__class__"}}),
        "dtype not a string": with_state({**good, "w": {**good["w"], "__tensor__": [1]}}),
        "tensor data of another size": with_state({**good, "w": {**good["w"], "shape": [4]}}),
        "tensor of a huge shape": with_state({**good, "w": {**good["w"], "shape": [2**40]}}),
        "tensor data not numbers": with_state({**good, "w": {**good["w"], "data": ["a", {}, []]}}),
        "tensor without data": with_state({"seen": 4, "w": {"__tensor__": "float32"}}),
        "nested 100000 deep": with_state(atk.deep(100_000)),
        "nested 500 deep": with_state(atk.deep(500)),
        "a list, not a dict": with_state([1, 2, 3]),
        "missing entries": with_state({"w": good["w"]}),
        "data position not JSON": with_state("[[[", key="extra.data"),
        "data position a list": with_state([1], key="extra.data"),
        "data position nested": with_state(atk.deep(100_000), key="extra.data"),
    }  # fmt: skip
    add("loop state: pristine", "malformed loop state", lambda d: None, ("fit",), "fit")
    for label, fn in cases.items():
        add(f"loop state: {label}", "malformed loop state", fn, ("fit",), "fit")


def _bombs(add) -> None:
    w = "params.fc.weight"
    gzip = atk.gzip_bomb(1 << 26)  # refused unread: functrain never writes gzip

    def gzip_array(d):
        atk.set_codecs(d, w, [{"name": "bytes", "configuration": {"endian": "little"}},
                              {"name": "gzip", "configuration": {"level": 9}}])  # fmt: skip
        for name in atk.files_of(f"{d}/{w}/c"):
            atk.replace(f"{d}/{w}/c/{name}", gzip)
        atk.fix_digests(d)

    add("gzip bomb in a functrain array", "gzip bomb", gzip_array, ("like", "nolike", "manager"))

    def sparse(d, name, size=600 * 2**20):
        os.unlink(f"{d}/{name}")
        with open(f"{d}/{name}", "wb") as f:
            f.truncate(size)

    add("600 MB tree.json", "gzip bomb", lambda d: sparse(d, "tree.json"), ("like", "manager"))
    add("600 MB zarr.json", "gzip bomb", lambda d: sparse(d, f"{w}/zarr.json"), ("like",))
    zstd = atk.zstd_bomb(1 << 30)

    def zstd_shard(d):
        for name in atk.files_of(f"{d}/params.w/c"):
            atk.replace(f"{d}/params.w/c/{name}", atk.shard_with(zstd))

    add("zstd bomb in an orbax shard", "gzip bomb", zstd_shard, ("orbax", "orbax-nolike"), "orbax3")


def _leases(add) -> None:
    def owner(**changes):
        me = lease_owner.this_process(30.0)
        fields = dict(me.__dict__)
        fields.update(changes)
        return lease_owner.Owner(**fields)

    def write(d, record: lease_owner.Owner | bytes):
        data = record if isinstance(record, bytes) else record.to_json()
        atk.replace(os.path.join(os.path.dirname(d), "LEASE.json"), data)

    parent = os.getpid()  # alive for as long as the test runs: another run on this machine
    alive = owner(pid=parent, pid_start=lease_owner.pid_start(parent))
    add("two writers: the root is leased by a live run here", "two writers",
        lambda d: write(d, alive), ("manager",))  # fmt: skip
    dead = owner(pid=_dead_pid())
    add("two writers: lease of a dead run here (taken over)", "two writers",
        lambda d: write(d, dead), ("manager",))  # fmt: skip
    add(
        "two writers: lease of a run elsewhere, last seen long ago",
        "two writers",
        lambda d: write(d, owner(host="elsewhere", refreshed=time.time() - 3600)),
        ("manager",),
    )
    add("two writers: lease of a live pid started later (reused pid)", "two writers",
        lambda d: write(d, owner(pid=parent, pid_start=1)), ("manager",))  # fmt: skip
    add("two writers: garbage lease", "two writers",
        lambda d: write(d, b"\x80\x04garbage"), ("manager",))  # fmt: skip
    add("two writers: lease with a pickle", "pickle",
        lambda d: write(d, atk.pickle_bytes("/nonexistent", 2)), ("manager",))  # fmt: skip


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# -- running them ---------------------------------------------------------------------------------


def _prepare(attacks, pristine: str, work: str, marker: str) -> list[dict]:
    """One damaged copy per attack (hard links; only what its modes need), and its jobs; the
    modes that only read it come first, auto-resume (which renames) last."""
    jobs = []
    for i, attack in enumerate(attacks):
        case = os.path.join(work, f"case{i}")
        job = {"attack": attack.name, "kind": attack.kind, "marker": marker}
        if attack.base is None:  # saving
            for mode in attack.modes:
                os.makedirs(f"{case}-{mode}")
                jobs.append({**job, "id": f"{i}:{mode}", "mode": mode, "path": f"{case}-{mode}",
                             "key": attack.mutate["key"], "nested": mode == "save-nested"})  # fmt: skip
            continue
        if attack.base == "root":
            if "manager" in attack.modes:
                shutil.copytree(os.path.join(pristine, "root"), case, copy_function=os.link)
            else:  # only the attacked checkpoint
                os.makedirs(case)
                src = os.path.join(pristine, "root", STEP)
                shutil.copytree(src, os.path.join(case, STEP), copy_function=os.link)
            target = os.path.join(case, STEP)
        else:
            shutil.copytree(os.path.join(pristine, attack.base), case, copy_function=os.link)
            target = case
            if attack.base == "fit":
                newest = max(n for n in os.listdir(case) if n.startswith("step_"))
                target = os.path.join(case, newest)
        attack.mutate(target)
        for mode in sorted(attack.modes, key=lambda m: m == "manager"):
            path = {"like": target, "nolike": target}.get(mode, case)
            jobs.append({**job, "id": f"{i}:{mode}", "mode": mode.replace("-nolike", ""),
                         "path": path, "seed": 0 if attack.base == "fit" else 1,
                         "like": not mode.endswith("-nolike")})  # fmt: skip
    return jobs


def _run(jobs: list[dict], work: str, batches: int = 2) -> dict[str, dict]:
    """Run the jobs in a few children; a crash or hang is recorded and the rest go on."""
    results: dict[str, dict] = {}
    size = -(-len(jobs) // batches)
    queue = [jobs[i : i + size] for i in range(0, len(jobs), size)]
    attempt = 0
    while queue:
        batch = [j for j in queue.pop(0) if j["id"] not in results]
        if not batch:
            continue
        attempt += 1
        jobs_file = os.path.join(work, f"jobs{attempt}.json")
        results_file = os.path.join(work, f"results{attempt}.jsonl")
        with open(jobs_file, "w") as f:
            json.dump(batch, f)
        child = subprocess.Popen(
            [sys.executable, WORKER, jobs_file, results_file, str(LIMIT_MB)],
            env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path)),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        current, since = None, time.monotonic()
        while child.poll() is None:
            time.sleep(0.2)
            lines = _lines(results_file)
            starts = [r["start"] for r in lines if "start" in r]
            finished = {r["id"] for r in lines if "status" in r}
            running = starts[-1] if starts and starts[-1] not in finished else None
            if running != current:
                current, since = running, time.monotonic()
            # Start-up (imports, warm-up) may take minutes on a loaded machine; a job may not.
            allowed = JOB_TIMEOUT if starts else 300.0
            if (current is not None or not starts) and time.monotonic() - since > allowed:
                child.kill()
        output = child.communicate()[0]
        lines = _lines(results_file)
        results.update({r["id"]: r for r in lines if "status" in r})
        starts = [r["start"] for r in lines if "start" in r]
        unfinished = [s for s in starts if s not in results]
        if unfinished:  # the job that crashed or hung the child; the rest run in a new one
            how = "hang" if child.returncode == -9 else f"crash (exit {child.returncode})"
            results[unfinished[-1]] = {"status": how, "message": output[-2000:]}
            queue.insert(0, batch)
        elif len(results) < len({j["id"] for j in batch} | set(results)) and not starts:
            raise AssertionError(f"the worker failed before any attack:\n{output[-4000:]}")
    return results


def _lines(path: str) -> list[dict]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip().endswith("}")]
    except FileNotFoundError:
        return []


def test_untrusted_checkpoints_give_clear_errors_or_correct_loads(pristine, tmp_path):
    work = str(tmp_path)
    marker = os.path.join(work, "PWNED")
    started = time.monotonic()
    attacks = _attacks(pristine, marker)
    jobs = _prepare(attacks, pristine, work, marker)
    prepared = time.monotonic()
    results = _run(jobs, work)
    print(f"\nprepared in {prepared - started:.0f}s, ran in {time.monotonic() - prepared:.0f}s")
    assert not os.path.exists(marker), "a pickle payload was executed"
    failures, table = [], collections.Counter()
    for job in jobs:
        result = results[job["id"]]
        status = result["status"]
        table[(job["kind"], status)] += 1
        if status not in ("error", "correct"):
            failures.append(f"{job['attack']} [{job['mode']}]: {status} {result.get('type', '')} "
                            f"{result.get('message', '')[:300]}")  # fmt: skip
        elif status == "error" and not _names_the_checkpoint(job, result["message"]):
            failures.append(f"{job['attack']} [{job['mode']}]: the error names no file: "
                            f"{result['message'][:300]}")  # fmt: skip
    summary = "\n".join(
        f"  {kind:28s} {status:8s} {n}" for (kind, status), n in sorted(table.items())
    )
    print(f"\n{len(attacks)} attacks, {len(jobs)} loads:\n{summary}")
    assert not failures, f"{len(failures)} of {len(jobs)} loads failed:\n" + "\n".join(failures)


def _names_the_checkpoint(job: dict, message: str) -> bool:
    if job["mode"].startswith("save"):
        return "cannot save leaf" in message or "save" in message
    return os.path.basename(job["path"].rstrip("/")) in message or job["path"] in message


def test_the_attack_suite_detects_a_reader_that_trusts_codecs(pristine, tmp_path, monkeypatch):
    """The suite's own check: with codec validation planted away, a flipped endian codec loads
    wrong values, and the suite reports it as "wrong"."""
    from functrain.checkpoint import verify

    case = str(tmp_path / "case")
    shutil.copytree(os.path.join(pristine, "root", STEP), case)
    atk.set_codecs(case, "params.fc.weight",
                   [{"name": "bytes", "configuration": {"endian": "big"}}, {"name": "crc32c"}])  # fmt: skip
    original = verify.check_array_metadata

    def trusting(meta, url, record, orbax=False):
        try:
            return original(meta, url, record, orbax=orbax)
        except checkpoint.CheckpointCorruptError:
            return meta

    monkeypatch.setattr(verify, "check_array_metadata", trusting)
    loaded = checkpoint.load(case, like=small_state(5))
    assert not torch.equal(loaded.params["fc.weight"], small_state(1).params["fc.weight"])


def test_two_processes_on_one_root(tmp_path):
    """A second process using a root that a live run owns is refused, naming the owner."""
    root = str(tmp_path / "root")
    script = (
        "import sys, time, torch; import functrain; from functrain.checkpoint import Manager\n"
        "m = Manager(sys.argv[1], async_save=False)\n"
        "m.save(functrain.TrainState(step=1, params={'w': torch.ones(2)}, buffers={},"
        " opt_state=(), rng=functrain.RngState()))\n"
        "print('saved', flush=True); time.sleep(600)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    holder = subprocess.Popen([sys.executable, "-c", script, root], stdout=subprocess.PIPE,
                              text=True, env=env)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "saved"
        second = checkpoint.Manager(root, async_save=False)
        like = functrain.TrainState(step=0, params={"w": torch.zeros(2)}, buffers={},
                                    opt_state=(), rng=functrain.RngState())  # fmt: skip
        with pytest.raises(checkpoint.CheckpointLeaseError) as err:
            second.restore(like)
        assert f"pid {holder.pid}" in str(err.value) and socket.gethostname() in str(err.value)
        with pytest.raises(checkpoint.CheckpointLeaseError):
            second.save(functrain.TrainState(step=2, params={"w": torch.ones(2)}, buffers={},
                                             opt_state=(), rng=functrain.RngState()))  # fmt: skip
        assert [s for s, _ in checkpoint.checkpoints(root)] == [1]  # nothing was written
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    # Its process gone (SIGKILL), the next run takes the root over at once.
    third = checkpoint.Manager(root, async_save=False)
    like = functrain.TrainState(step=0, params={"w": torch.zeros(2)}, buffers={}, opt_state=(),
                                rng=functrain.RngState())  # fmt: skip
    assert third.restore(like).step == 1
    third.close()
    assert layout.LEASE_FILE not in os.listdir(root)
