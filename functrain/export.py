"""Export for inference: safetensors weights a plain `nn.Module` loads, and a `torch.export` program.

`export(state, "out/")` writes `out/model.safetensors` whose names are the model's `state_dict()`
keys, so `model.load_state_dict(safetensors.torch.load_file("out/model.safetensors"))` restores the
trained (or, with `ema=True`, the averaged) weights in any PyTorch program, without functrain.
Given `model` and `example_inputs` it also writes `out/model.pt2`, a `torch.export` program for
serving (`torch.export.load`).

An export is all or nothing: every file is built in memory first (a model `torch.export` cannot
trace writes nothing), a new local folder is written under a temporary name and renamed into
place, and in an existing folder each file is replaced whole. A Hugging Face model exports with
its key/value cache off (`model.config.use_cache = False`): its `DynamicCache` output is not a
tensor tree, and the error says so.

EMA weights are read from `state.algo_state["ema"]`, which holds `params` and `buffers` as
`{fqn: tensor}` and `num_updates` (see `functrain.algorithms.ema.EMAState`); before averaging has
started (`num_updates == 0`) the trained weights are exported.

Example:
    >>> paths = functrain.export(state, "out/", ema=True, model=model,
    ...                          example_inputs=(torch.randn(1, 3, 32, 32),))
    >>> fresh = Net()
    >>> fresh.load_state_dict(safetensors.torch.load_file(paths["safetensors"]))
"""

from __future__ import annotations

import copy
import io
import os
import shutil
import uuid
from collections.abc import Mapping
from typing import Any

import torch

from ._lazy import is_dtensor

SAFETENSORS_FILE = "model.safetensors"
PROGRAM_FILE = "model.pt2"


def export(
    state: Any,
    path: str | os.PathLike,
    *,
    ema: bool = False,
    model: torch.nn.Module | None = None,
    example_inputs: tuple | None = None,
    dynamic_shapes: Any = None,
    storage_options: dict | None = None,
) -> dict[str, str | None]:
    """Write a state's weights for inference.

    Every rank calls it (sharded weights are gathered); rank 0 writes.

    Args:
        state: a `TrainState`, or the path/URL of a functrain checkpoint.
        path: the output directory (a path or URL, as for checkpoints).
        ema: export the EMA weights from `state.algo_state["ema"]` instead of the trained ones.
        model: the model the state trains. With it, every `state_dict()` key is written, tied
            weights under each of their names, and shapes are checked; without it, the names are
            those of `state.params` and `state.buffers` (tied weights once).
        example_inputs: positional inputs for `torch.export`; with `model`, also writes
            `model.pt2`.
        dynamic_shapes: passed to `torch.export.export` (e.g. a dynamic batch dimension).
        storage_options: backend options for `path` (S3 endpoint, ...).
    Returns:
        `{"safetensors": url, "program": url or None}`.
    """
    from safetensors.torch import save as safetensors_bytes

    from .checkpoint import storage  # imported here: it needs tensorstore

    params, buffers, step = _weights(state, ema)
    tensors = _named_for(model, params, buffers) if model is not None else {**params, **buffers}
    tensors = {name: _host(t) for name, t in tensors.items()}
    tensors = _unshared(tensors)
    out = storage.resolve(path, storage_options)
    rank = torch.distributed.get_rank() if _distributed() else 0
    program = None
    if rank == 0:
        metadata = {"format": "pt", "producer": "functrain", "weights": "ema" if ema else "trained"}
        if step is not None:
            metadata["step"] = str(step)
        files = {SAFETENSORS_FILE: safetensors_bytes(tensors, metadata=metadata)}
        if model is not None and example_inputs is not None:
            buffer = io.BytesIO()
            torch.export.save(_exported(model, tensors, example_inputs, dynamic_shapes), buffer)
            files[PROGRAM_FILE] = buffer.getvalue()
            program = out.file_url(PROGRAM_FILE)
        _write_all(out, files)
    elif model is not None and example_inputs is not None:
        program = out.file_url(PROGRAM_FILE)
    if _distributed():
        torch.distributed.barrier()  # the files exist on every rank's return
    return {"safetensors": out.file_url(SAFETENSORS_FILE), "program": program}


def _write_all(out: Any, files: dict[str, bytes]) -> None:
    """Write `files` into `out` so that a failure leaves no half-written export.

    A local folder that does not exist yet is written under a temporary sibling name and renamed
    into place; in an existing folder (another export's, or one holding a model's config) each
    file replaces its old version whole, and a `model.pt2` of an earlier export that this one does
    not replace is removed (it would serve the old weights). Object stores have no rename: each
    object appears whole, and nothing is written before every file was built.
    """
    from .checkpoint import storage

    if not out.is_local or os.path.isdir(out.local_path):
        for name, data in files.items():
            storage.write_bytes(out, name, data)
        if PROGRAM_FILE not in files and storage.exists(out, PROGRAM_FILE):
            storage.delete_file(out, PROGRAM_FILE)
        return
    parent = os.path.dirname(out.local_path)
    os.makedirs(parent, exist_ok=True)
    # os.mkdir, not mkdtemp: the folder keeps the umask's permissions once renamed into place
    temporary = os.path.join(parent, f".{out.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.partial")
    os.mkdir(temporary)
    try:
        staged = storage.resolve(temporary)
        storage.write_many(staged, files)
        storage.rename_dir(staged, out)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)  # gone after the rename; else the debris


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _weights(state: Any, ema: bool) -> tuple[dict, dict, int | None]:
    """`(params, buffers, step)` of a TrainState or a checkpoint path."""
    from .checkpoint import storage

    if isinstance(state, (str, os.PathLike, storage.Location)):
        from .checkpoint import load

        flat = load(state)
        state = _FromCheckpoint(flat)
    params, buffers = dict(state.params), dict(state.buffers)
    if not ema:
        return params, buffers, getattr(state, "step", None)
    average = getattr(state, "algo_state", {}).get("ema")
    if average is None:
        raise KeyError(
            "export(ema=True) found no EMA weights in state.algo_state['ema']; compose "
            "functrain.algorithms.ema() into the step, or export with ema=False"
        )
    if _get(average, "num_updates", 1) == 0:  # averaging has not started yet
        return params, buffers, getattr(state, "step", None)
    params.update(_get(average, "params", {}))
    buffers.update(_get(average, "buffers", {}) or {})
    return params, buffers, getattr(state, "step", None)


def _get(obj: Any, name: str, default: Any) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


class _FromCheckpoint:
    """The parts of a TrainState `export` reads, rebuilt from a checkpoint's flat keys."""

    def __init__(self, flat: dict[str, Any]):
        def under(prefix: str) -> dict[str, Any]:
            return {k[len(prefix) :]: v for k, v in flat.items() if k.startswith(prefix)}

        self.params, self.buffers = under("params."), under("buffers.")
        self.step = flat.get("step")
        ema = under("algo_state.ema.")
        self.algo_state = {}
        if ema:
            self.algo_state["ema"] = {
                "params": {k[7:]: v for k, v in ema.items() if k.startswith("params.")},
                "buffers": {k[8:]: v for k, v in ema.items() if k.startswith("buffers.")},
                "num_updates": ema.get("num_updates", 1),
            }


def _named_for(model: torch.nn.Module, params: dict, buffers: dict) -> dict[str, torch.Tensor]:
    """One tensor per `model.state_dict()` key, tied weights under each of their names."""
    canonical: dict[int, str] = {}
    alias: dict[str, str] = {}
    named: list[tuple[str, torch.Tensor]] = list(model.named_parameters(remove_duplicate=False))
    named += list(model.named_buffers(remove_duplicate=False))
    for name, tensor in named:
        alias[name] = canonical.setdefault(id(tensor), name)
    out = {}
    for key, reference in model.state_dict().items():
        source = alias.get(key, key)
        value = params.get(source, buffers.get(source))
        if value is None:
            raise KeyError(
                f"the state has no weight for the model's state_dict key {key!r} (looked up as "
                f"{source!r}); pass the model the state was initialised from"
            )
        if tuple(value.shape) != tuple(reference.shape):
            raise ValueError(
                f"{key!r} has shape {list(value.shape)} in the state but {list(reference.shape)} "
                "in the model; pass the model the state was initialised from"
            )
        out[key] = value
    return out


def _host(tensor: torch.Tensor) -> torch.Tensor:
    if is_dtensor(tensor):
        tensor = tensor.full_tensor()  # collective: every rank calls export
    return tensor.detach().to("cpu").contiguous()


def _unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Copies for names that share storage (tied weights): safetensors stores each name alone."""
    seen: set[int] = set()
    out = {}
    for name, tensor in tensors.items():
        pointer = tensor.untyped_storage().data_ptr() if tensor.numel() else id(tensor)
        out[name] = tensor.clone() if pointer in seen else tensor
        seen.add(pointer)
    return out


def _exported(model, tensors, example_inputs, dynamic_shapes):
    """A `torch.export` program of `model` carrying the exported weights."""
    serving = copy.deepcopy(model).eval()
    # assign=True swaps in the exported tensors even when the model's own are sharded or meta.
    serving.load_state_dict(tensors, strict=True, assign=True)
    if not isinstance(example_inputs, tuple):
        example_inputs = (example_inputs,)
    with torch.no_grad():
        try:
            return torch.export.export(serving, example_inputs, dynamic_shapes=dynamic_shapes)
        except Exception as error:
            config = getattr(model, "config", None)
            if getattr(config, "use_cache", False) and "Cache" in str(error):
                raise RuntimeError(
                    f"torch.export cannot trace {type(model).__name__}'s output: with "
                    "`config.use_cache` on, a Hugging Face model returns its key/value cache (a "
                    "`DynamicCache`), which is not a tree of tensors. Export with the cache off: "
                    "`model.config.use_cache = False` (or build the model with "
                    "`use_cache=False`), then call functrain.export again. Nothing was written."
                ) from error
            raise
