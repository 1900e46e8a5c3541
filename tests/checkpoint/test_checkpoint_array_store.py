"""A consolidated save's fast path writes the bytes a zarr3 array per leaf would.

`array_store.write_all` encodes whole-chunk arrays by stacking them in memory instead of opening a
zarr3 array per leaf; the OCDBT database must hold exactly the keys and bytes that writing each
leaf through its own zarr3 array (the reader's view of the format) holds.
"""

from __future__ import annotations

import numpy as np
import tensorstore as ts
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from functrain.checkpoint import array_store, layout, storage, verify
from functrain.checkpoint.dtypes import TORCH_DTYPES, to_numpy

DTYPES = sorted(TORCH_DTYPES)


def _contents(loc: storage.Location) -> dict[bytes, bytes]:
    store = ts.KvStore.open(array_store.database(loc), context=storage.CONTEXT).result()
    return {key: bytes(store.read(key).result().value) for key in store.list().result()}


def _leaf(key: str, dtype: str, shape: tuple[int, ...], seed: int):
    gen = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (max(1, int(np.prod(shape))) * 16,), generator=gen)
    tensor = raw.to(torch.uint8).view(TORCH_DTYPES[dtype]).flatten()[: int(np.prod(shape))]
    data = to_numpy(tensor.reshape(shape))
    chunks = tuple(max(1, s) for s in shape)  # what staging gives a single-rank leaf
    record = layout.LeafRecord(path=(key,), key_types=(2,), kind="tensor", dtype=dtype)
    record.shape, record.chunks = shape, chunks
    return record, data


def _write_each_leaf(loc, leaves) -> None:
    """The reference: every leaf through its own zarr3 array, as before the fast path."""
    for record, data in leaves:
        spec = {
            "driver": "zarr3",
            "kvstore": array_store.array_kvstore(loc, record.key, True),
            "metadata": verify.array_metadata(record),
            "store_data_equal_to_fill_value": True,
        }
        array = ts.open(spec, create=True, context=storage.CONTEXT).result()
        array.write(data).result()


SHAPES = st.lists(st.integers(0, 4), min_size=0, max_size=3).map(tuple)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    leaves=st.lists(st.tuples(st.sampled_from(DTYPES), SHAPES), min_size=1, max_size=8),
    seed=st.integers(0, 2**16),
)
def test_the_stacked_encoding_writes_the_bytes_of_one_array_per_leaf(
    tmp_path_factory, leaves, seed
):
    base = tmp_path_factory.mktemp("db")
    built = [_leaf(f"leaf{i}", dtype, shape, seed + i) for i, (dtype, shape) in enumerate(leaves)]
    fast, slow = storage.resolve(str(base / "fast")), storage.resolve(str(base / "slow"))
    storage.make_dir(fast)
    files = {
        layout.array_metadata_file(r.key): verify.encode(verify.array_metadata(r)) for r, _ in built
    }
    items = [
        (r.key, verify.array_metadata(r), tuple(slice(0, s) for s in r.shape), d) for r, d in built
    ]
    array_store.write_all(fast, files, items).result()
    _write_each_leaf(slow, built)
    assert _contents(fast) == _contents(slow)


def test_a_zero_d_leaf_and_a_two_d_leaf_of_one_dtype_keep_their_own_chunk_keys(tmp_path):
    built = [_leaf("s", "float32", (), 1), _leaf("m", "float32", (2, 3), 2)]
    loc = storage.resolve(str(tmp_path / "c"))
    storage.make_dir(loc)
    items = [(r.key, verify.array_metadata(r), (), d) for r, d in built]
    array_store.write_all(loc, {}, items).result()
    contents = _contents(loc)
    assert set(contents) == {b"s/c", b"m/c/0/0"}
    assert contents[b"m/c/0/0"][:-4] == built[1][1].tobytes()  # the raw bytes, then a crc32c
