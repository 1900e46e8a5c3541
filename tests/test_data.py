"""Tests of functrain.data: a pure, world-size-independent batch order and O(1) resume."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import Dataset, IterableDataset, TensorDataset

from functrain.data import DataSource, Loader, ResumableBatchSampler, epoch_order


class CountingDataset(Dataset):
    """A map-style dataset that counts how many samples were loaded."""

    def __init__(self, n):
        self.n = n
        self.loads = 0

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        self.loads += 1
        return torch.tensor([float(index)]), index


def ids(batch):
    """The sample indices in a batch of CountingDataset or of an arange TensorDataset."""
    return batch[1].tolist()


def arange_dataset(n):
    return TensorDataset(torch.arange(n, dtype=torch.float32)[:, None], torch.arange(n))


def test_epoch_order_is_a_pure_permutation():
    a = epoch_order(100, seed=3, epoch=2)
    assert sorted(a.tolist()) == list(range(100))
    assert torch.equal(a, epoch_order(100, seed=3, epoch=2))
    assert not torch.equal(a, epoch_order(100, seed=3, epoch=3))
    assert not torch.equal(a, epoch_order(100, seed=4, epoch=2))
    assert epoch_order(5, seed=0, epoch=0, shuffle=False).tolist() == [0, 1, 2, 3, 4]


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(8, 80),
    per_rank=st.integers(1, 6),
    world=st.sampled_from([1, 2, 3, 4]),
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 5),
)
def test_ranks_slice_the_same_global_batches(n, per_rank, world, seed, epoch):
    batch_size = per_rank * world
    if batch_size > n:
        batch_size = world  # keep at least one batch
    single = Loader(arange_dataset(n), batch_size, seed=seed, rank=0, world_size=1)
    global_batches = [ids(b) for b in single.epoch_iter(epoch)]
    per_rank_batches = [
        [ids(b) for b in Loader(arange_dataset(n), batch_size, seed=seed, rank=r, world_size=world)
         .epoch_iter(epoch)]
        for r in range(world)
    ]  # fmt: skip
    assert all(len(batches) == len(global_batches) for batches in per_rank_batches)
    for index, expected in enumerate(global_batches):
        joined = sum((per_rank_batches[r][index] for r in range(world)), [])
        assert joined == expected
        assert len(per_rank_batches[0][index]) == batch_size // world


@settings(max_examples=30, deadline=None)
@given(n=st.integers(5, 60), batch_size=st.integers(1, 7), start=st.integers(0, 60))
def test_resume_equals_the_tail_of_the_epoch(n, batch_size, start):
    loader = Loader(arange_dataset(n), batch_size, seed=1, drop_last=False, rank=0, world_size=1)
    full = [ids(b) for b in loader.epoch_iter(4)]
    start = min(start, len(full))
    assert [ids(b) for b in loader.epoch_iter(4, start_batch=start)] == full[start:]


def test_resume_loads_no_sample_before_the_resume_point():
    dataset = CountingDataset(1000)
    loader = Loader(dataset, batch_size=10, seed=0, rank=0, world_size=1)
    first = next(loader.epoch_iter(epoch=3, start_batch=97))
    assert dataset.loads == 10  # one batch, nothing replayed
    assert (
        ids(first)
        == Loader(arange_dataset(1000), 10, seed=0, rank=0, world_size=1)
        .sampler()
        .global_batch(3, 97)
        .tolist()
    )


def test_dataloader_workers_give_the_same_batches():
    dataset = CountingDataset(40)
    plain = [ids(b) for b in Loader(dataset, 8, seed=2, rank=0, world_size=1).epoch_iter(1, 2)]
    # "spawn": other tests may have started threads (orbax imports JAX); forking those can deadlock.
    workers = Loader(
        dataset, 8, seed=2, num_workers=2, rank=0, world_size=1, multiprocessing_context="spawn"
    ).epoch_iter(1, 2)
    assert [ids(b) for b in workers] == plain
    assert len(plain) == 3


def test_tensor_fast_path_matches_the_dataloader_collate():
    """The fast path (indexing the tensors) gives what torch's DataLoader gives for the same
    order: the Loader's own DataLoader path (a non-TensorDataset view of the same samples, or an
    explicit collate_fn) and a plain DataLoader over the epoch's order, built here."""
    dataset = arange_dataset(30)
    fast = list(Loader(dataset, 6, seed=5, rank=0, world_size=1).epoch_iter(0))
    view = torch.utils.data.Subset(dataset, range(30))  # not a TensorDataset: no fast path
    slow = list(Loader(view, 6, seed=5, rank=0, world_size=1).epoch_iter(0))
    via_collate = list(
        Loader(dataset, 6, seed=5, rank=0, world_size=1, collate_fn=torch.utils.data.default_collate)
        .epoch_iter(0)
    )  # fmt: skip
    order = epoch_order(30, seed=5, epoch=0).tolist()
    by_hand = list(
        torch.utils.data.DataLoader(
            dataset, batch_sampler=[order[i : i + 6] for i in range(0, 30, 6)]
        )
    )
    assert len(fast) == len(slow) == len(via_collate) == len(by_hand) == 5
    assert sorted(i for b in fast for i in ids(b)) == list(range(30))  # every sample, once
    for batches in (slow, via_collate, fast):
        for got, want in zip(batches, by_hand, strict=True):
            assert type(got) in (tuple, list) and len(got) == len(want) == 2
            for x, y in zip(got, want, strict=True):
                assert x.dtype == y.dtype and torch.equal(x, y)


def test_drop_last_false_splits_the_last_batch_over_ranks():
    # 10 samples, batch 4: batches of 4, 4, 2; on 4 ranks the last one leaves ranks 2, 3 empty.
    sizes = []
    for rank in range(4):
        loader = Loader(arange_dataset(10), 4, drop_last=False, rank=rank, world_size=4)
        sizes.append([len(ids(b)) for b in loader.epoch_iter(0)])
        assert len(loader) == len(sizes[-1])
    assert sizes == [[1, 1, 1], [1, 1, 1], [1, 1], [1, 1]]
    assert Loader(arange_dataset(10), 4, drop_last=False, rank=0, world_size=4).num_batches == 3


def test_iterating_a_loader_uses_set_epoch():
    loader = Loader(arange_dataset(12), 4, seed=0, rank=0, world_size=1)
    loader.set_epoch(2)
    assert [ids(b) for b in loader] == [ids(b) for b in loader.epoch_iter(2)]


def test_two_iterators_do_not_share_a_position():
    loader = Loader(arange_dataset(12), 4, seed=0, rank=0, world_size=1)
    a = loader.epoch_iter(0, 0)
    b = loader.epoch_iter(1, 2)
    assert [ids(x) for x in a] == [ids(x) for x in loader.epoch_iter(0)]
    assert len(list(b)) == 1


def test_bad_input_names_the_problem():
    with pytest.raises(ValueError, match="empty"):
        Loader(arange_dataset(0), 4)
    with pytest.raises(ValueError, match="fewer than batch_size"):
        Loader(arange_dataset(3), 4)
    with pytest.raises(ValueError, match="not divisible by world_size=4"):
        len(Loader(arange_dataset(30), 6, rank=0, world_size=4))
    with pytest.raises(ValueError, match="positive int"):
        Loader(arange_dataset(30), 0)

    class Stream(IterableDataset):
        def __iter__(self):
            yield torch.zeros(1)

    with pytest.raises(TypeError, match="map-style"):
        Loader(Stream(), 4)
    with pytest.raises(ValueError, match="start_batch"):
        next(Loader(arange_dataset(8), 4, rank=0, world_size=1).epoch_iter(0, 3))
    sampler = ResumableBatchSampler(8, 4)
    with pytest.raises(ValueError, match="start_batch"):
        sampler.set_position(0, -1)


def test_data_source_kinds_and_fallback_replay():
    batches = [torch.full((2,), float(i)) for i in range(5)]
    source = DataSource(batches)
    assert source.kind == "replay" and source.batches_per_epoch() == 5
    with pytest.warns(UserWarning, match="replaying"):
        rest = list(source.epoch_iter(0, 3))
    assert [float(b[0]) for b in rest] == [3.0, 4.0]
    assert DataSource(Loader(arange_dataset(8), 4)).kind == "loader"
    with pytest.raises(TypeError, match="re-iterable"):
        DataSource(42)


def test_data_source_checks_the_loader_on_mid_epoch_resume():
    saved = DataSource(Loader(arange_dataset(40), 8, seed=1)).state_dict(16)
    DataSource(Loader(arange_dataset(40), 8, seed=1)).load_state_dict(saved, batch_in_epoch=2)
    with pytest.raises(ValueError, match="batch_size: saved 8, now 4"):
        DataSource(Loader(arange_dataset(40), 4, seed=1)).load_state_dict(saved, batch_in_epoch=2)
    # at an epoch boundary nothing depends on the old order
    DataSource(Loader(arange_dataset(40), 4, seed=1)).load_state_dict(saved, batch_in_epoch=0)


class StatefulStream:
    """An iterable that resumes through state_dict (as torchdata's StatefulDataLoader does)."""

    def __init__(self, n):
        self.n, self.position, self.yielded = n, 0, 0

    def __iter__(self):
        while self.position < self.n:
            self.position += 1
            self.yielded += 1
            yield torch.tensor([float(self.position - 1)])
        self.position = 0

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


class StreamingLike:
    """MosaicML StreamingDataset's signature: state_dict(num_samples, from_beginning)."""

    def __init__(self):
        self.loaded = None

    def __iter__(self):
        return iter([torch.zeros(2)])

    def state_dict(self, num_samples, from_beginning):
        return {"sample_in_epoch": num_samples, "from_beginning": from_beginning}

    def load_state_dict(self, state):
        self.loaded = state


def test_stateful_iterables_resume_through_their_state():
    stream = StatefulStream(6)
    source = DataSource(stream)
    assert source.kind == "stateful"
    it = source.epoch_iter(0, 0)
    next(it), next(it)
    saved = source.state_dict(samples_in_epoch=2)
    fresh = StatefulStream(6)
    resumed = DataSource(fresh)
    resumed.load_state_dict(saved, batch_in_epoch=2)
    assert [float(b[0]) for b in resumed.epoch_iter(0, 2)] == [2.0, 3.0, 4.0, 5.0]
    assert fresh.yielded == 4  # nothing replayed

    streaming = StreamingLike()
    loader_like = type("DL", (), {"dataset": streaming, "__iter__": lambda self: iter([])})()
    source = DataSource(loader_like)
    assert source.kind == "stateful"
    saved = source.state_dict(samples_in_epoch=64)
    # fit's count runs from the epoch's start (Composer passes True too; False would add the
    # resumed offset again after a mid-epoch resume: tests/test_streaming.py, with the package).
    assert saved == {"state": {"sample_in_epoch": 64, "from_beginning": True}}
    source.load_state_dict(saved, batch_in_epoch=8)
    assert streaming.loaded == {"sample_in_epoch": 64, "from_beginning": True}


# -- mutation-testing survivors of functrain/data/ (bench mutants, issue 17) --------------------


def _squares(n=12):
    return TensorDataset(torch.arange(n) ** 2, torch.arange(n))


def test_plain_iteration_yields_epoch_0_until_set_epoch_says_otherwise():
    # expected order from epoch_order itself is circular; compare with epoch_iter(0) and (1)
    loader = Loader(_squares(), 4, seed=3, rank=0, world_size=1)
    first = [b[1].tolist() for b in loader]
    assert first == [b[1].tolist() for b in loader.epoch_iter(0)]
    assert first != [b[1].tolist() for b in loader.epoch_iter(1)]  # the epochs differ
    loader.set_epoch(1)
    assert [b[1].tolist() for b in loader] == [b[1].tolist() for b in loader.epoch_iter(1)]


def test_a_loader_without_placement_is_placed_by_fit_one_with_it_keeps_its_own():
    unplaced = Loader(_squares(), 4)
    assert unplaced.placed_explicitly is False
    placed = unplaced.placed(1, 2)
    assert (placed.rank, placed.world_size) == (1, 2)
    assert (unplaced.rank, unplaced.world_size) == (0, 1)  # a copy: the original is unchanged
    own = Loader(_squares(), 4, rank=0, world_size=1)
    assert own.placed_explicitly is True and own.placed(1, 2).rank == 0


class _Items(Dataset):
    """A map-style dataset that is not a TensorDataset (the DataLoader path)."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.tensor([float(i)])


def test_a_multiprocessing_context_without_workers_is_ignored():
    # DataLoader refuses a context with num_workers=0; the loader must pass it only with workers
    loader = Loader(
        _Items(), 4, shuffle=False, rank=0, world_size=1, multiprocessing_context="spawn"
    )
    assert [b.flatten().tolist() for b in loader.epoch_iter(0)] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_a_collate_fn_is_used_on_in_memory_tensors_too():
    def doubled(samples):  # sum of the squares, doubled: not what default_collate gives
        return 2 * torch.stack([s[0] for s in samples]).sum()

    loader = Loader(_squares(4), 4, shuffle=False, rank=0, world_size=1, collate_fn=doubled)
    assert [int(b) for b in loader.epoch_iter(0)] == [2 * (0 + 1 + 4 + 9)]


def test_data_without_a_length_has_zero_batches_per_epoch():
    class Stream(IterableDataset):
        def __iter__(self):
            return iter([torch.zeros(2)] * 3)

    assert DataSource(Stream()).batches_per_epoch() == 0
    assert DataSource([torch.zeros(2)] * 3).batches_per_epoch() == 3


def test_a_replayed_resume_warns_once_per_source():
    source = DataSource([torch.full((1,), float(i)) for i in range(5)])
    with pytest.warns(UserWarning, match="replaying and dropping"):
        assert float(next(source.epoch_iter(0, 2))) == 2.0
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second warning would raise here
        assert float(next(source.epoch_iter(1, 3))) == 3.0
