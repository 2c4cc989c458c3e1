"""sampan.io: token windows and files, collation, the resumable sampler and DataLoader."""

from __future__ import annotations

import json
import pickle
import random

import numpy as np
import pytest
import torch

from sampan.io import (
    DataLoader,
    Dataset,
    ResumableBatchSampler,
    ResumableSampler,
    TokenWindowDataset,
    collate_dicts,
    default_collate,
    epoch_order,
    write_token_file,
)


class IndexDataset(Dataset):
    """Item i is {"idx": i, "x": [i, i*i]}: batches can be compared by their indices."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"idx": torch.tensor(i), "x": torch.tensor([i, i * i], dtype=torch.float32)}


class NoisyDataset(Dataset):
    """Items drawn from the process-global RNGs, to observe how workers are seeded."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([torch.rand(()).item(), float(np.random.rand()), random.random()])


def indices(batches: list[dict[str, torch.Tensor]]) -> list[list[int]]:
    return [b["idx"].tolist() for b in batches]


def take(loader: DataLoader, k: int) -> list[dict[str, torch.Tensor]]:
    """The next k batches, crossing epoch boundaries like a step-driven training loop does."""
    out: list[dict[str, torch.Tensor]] = []
    while len(out) < k:
        for batch in loader:
            out.append(batch)
            if len(out) == k:
                break
    return out


# -- TokenWindowDataset and token files ------------------------------------------------------------


def test_token_windows_default_stride_and_overlap():
    tokens = np.arange(20, dtype=np.int32)
    ds = TokenWindowDataset(tokens, seq_len=5)
    assert len(ds) == 4
    item = ds[2]
    assert item["input_ids"].dtype == torch.long
    assert item["input_ids"].tolist() == [10, 11, 12, 13, 14]
    assert torch.equal(item["labels"], item["input_ids"])
    item["labels"][0] = -1  # labels is a copy, not a view of input_ids
    assert item["input_ids"][0] == 10
    assert ds[-1]["input_ids"].tolist() == [15, 16, 17, 18, 19]
    with pytest.raises(IndexError):
        ds[4]

    overlapping = TokenWindowDataset(tokens, seq_len=5, stride=3)
    assert len(overlapping) == (20 - 5) // 3 + 1 == 6
    assert [overlapping[i]["input_ids"][0].item() for i in range(6)] == [0, 3, 6, 9, 12, 15]


def test_token_windows_from_tensor_do_not_alias_source():
    tokens = torch.arange(10)
    ds = TokenWindowDataset(tokens, seq_len=4, stride=2)
    assert len(ds) == 4
    item = ds[1]
    item["input_ids"][0] = 99
    assert tokens[2] == 2


@pytest.mark.parametrize("dtype, high", [("uint16", 65_535), ("uint32", 100_000)])
def test_token_file_round_trip(tmp_path, dtype, high):
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, high + 1, size=1000)
    tokens[0] = high
    path = write_token_file(tmp_path / "train.bin", tokens, dtype=dtype)
    assert path.stat().st_size == 1000 * np.dtype(dtype).itemsize
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.bin"]  # no temp file left behind

    ds = TokenWindowDataset.from_file(path, dtype, seq_len=64, stride=50)
    assert isinstance(ds.tokens, np.memmap)
    assert len(ds) == (1000 - 64) // 50 + 1
    for i in (0, 7, len(ds) - 1):
        assert ds[i]["input_ids"].tolist() == tokens[i * 50 : i * 50 + 64].tolist()
    # The file is raw little-endian ids with no header (nanoGPT's format).
    assert np.fromfile(path, dtype=np.dtype(dtype).newbyteorder("<")).tolist() == tokens.tolist()

    # A pickled copy (what a spawned worker gets) reopens the file instead of carrying its data.
    blob = pickle.dumps(ds)
    assert len(blob) < 1000
    copy = pickle.loads(blob)
    assert torch.equal(copy[3]["input_ids"], ds[3]["input_ids"])


def test_write_token_file_replaces_atomically(tmp_path):
    path = tmp_path / "t.bin"
    write_token_file(path, [1, 2, 3])
    write_token_file(path, torch.tensor([4, 5, 6, 7]))
    assert np.fromfile(path, dtype="<u2").tolist() == [4, 5, 6, 7]


def test_token_validation_errors(tmp_path):
    tokens = np.arange(10)
    with pytest.raises(ValueError, match="seq_len"):
        TokenWindowDataset(tokens, seq_len=0)
    with pytest.raises(ValueError, match="stride"):
        TokenWindowDataset(tokens, seq_len=2, stride=0)
    with pytest.raises(ValueError, match="too short"):
        TokenWindowDataset(tokens, seq_len=11)
    with pytest.raises(ValueError, match="1-D"):
        TokenWindowDataset(tokens.reshape(2, 5), seq_len=2)
    with pytest.raises(ValueError, match="integer"):
        TokenWindowDataset(np.ones(10, dtype=np.float32), seq_len=2)
    with pytest.raises(ValueError, match="integer"):
        TokenWindowDataset(torch.ones(10), seq_len=2)

    with pytest.raises(ValueError, match="dtype"):
        write_token_file(tmp_path / "a.bin", tokens, dtype="int8")
    with pytest.raises(ValueError, match="does not fit uint16"):
        write_token_file(tmp_path / "a.bin", [1, 70_000], dtype="uint16")
    with pytest.raises(ValueError, match="-1"):
        write_token_file(tmp_path / "a.bin", [-1, 3], dtype="uint32")
    assert not any(tmp_path.iterdir())  # failed writes leave nothing

    path = write_token_file(tmp_path / "short.bin", [1, 2, 3], dtype="uint16")
    with pytest.raises(ValueError, match="too short"):
        TokenWindowDataset.from_file(path, "uint16", seq_len=4)
    with pytest.raises(ValueError, match="not a multiple of 4"):
        TokenWindowDataset.from_file(path, "uint32", seq_len=1)  # 6 bytes are not uint32s
    with pytest.raises(ValueError, match="dtype"):
        TokenWindowDataset.from_file(path, "float32", seq_len=1)
    (tmp_path / "empty.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="0 tokens"):
        TokenWindowDataset.from_file(tmp_path / "empty.bin", seq_len=1)
    with pytest.raises(FileNotFoundError):
        TokenWindowDataset.from_file(tmp_path / "missing.bin", seq_len=1)


# -- collation -------------------------------------------------------------------------------------


def test_collate_dicts_stacks_and_names_mismatches():
    samples = [{"a": torch.tensor([i, i]), "b": i} for i in range(3)]
    batch = collate_dicts(samples)
    assert batch["a"].tolist() == [[0, 0], [1, 1], [2, 2]]
    assert batch["b"].tolist() == [0, 1, 2]
    assert default_collate(samples)["a"].tolist() == batch["a"].tolist()
    with pytest.raises(ValueError, match="'a'.*shape"):
        collate_dicts([{"a": torch.zeros(2)}, {"a": torch.zeros(3)}])
    with pytest.raises(ValueError, match="keys"):
        collate_dicts([{"a": torch.zeros(2)}, {"b": torch.zeros(2)}])


# -- samplers --------------------------------------------------------------------------------------


def test_epoch_order_is_seeded_randperm():
    expected = torch.randperm(50, generator=torch.Generator().manual_seed(7 + 3))
    assert torch.equal(epoch_order(50, seed=7, epoch=3, shuffle=True), expected)
    assert epoch_order(5, seed=7, epoch=3, shuffle=False).tolist() == [0, 1, 2, 3, 4]


def test_sampler_order_deterministic_and_epochs_differ():
    def epoch_batches(seed: int, epoch: int) -> list[list[int]]:
        s = ResumableBatchSampler(30, 4, shuffle=True, seed=seed)
        s.set_epoch(epoch)
        return list(s)

    assert epoch_batches(0, 0) == epoch_batches(0, 0)
    assert epoch_batches(0, 0) != epoch_batches(0, 1)
    assert epoch_batches(0, 0) != epoch_batches(1, 0)
    unshuffled = ResumableBatchSampler(10, 4)
    assert list(unshuffled) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]

    per_sample = ResumableSampler(10, shuffle=True, seed=3)
    per_sample.set_epoch(2, position=4)
    assert list(per_sample) == epoch_order(10, 3, 2, True)[4:].tolist()


@pytest.mark.parametrize("drop_last", [False, True])
def test_every_sample_once_per_epoch(drop_last):
    s = ResumableBatchSampler(23, 5, shuffle=True, seed=11, drop_last=drop_last)
    for epoch in range(3):
        s.set_epoch(epoch)
        batches = list(s)
        assert len(batches) == len(s) == (4 if drop_last else 5)
        flat = [i for b in batches for i in b]
        assert len(flat) == len(set(flat))  # no repeats
        if drop_last:
            assert len(flat) == 20 and all(len(b) == 5 for b in batches)
        else:
            assert sorted(flat) == list(range(23))


@pytest.mark.parametrize("num_replicas", [2, 3])
def test_sharded_ranks_cover_each_global_batch(num_replicas):
    n, b = 23, 2
    g = b * num_replicas
    single = ResumableBatchSampler(n, g, shuffle=True, seed=5)
    single.set_epoch(1)
    reference = list(single)
    ranks = []
    for r in range(num_replicas):
        s = ResumableBatchSampler(n, b, shuffle=True, seed=5, num_replicas=num_replicas, rank=r)
        s.set_epoch(1)
        ranks.append(list(s))
    assert all(len(batches) == len(reference) for batches in ranks)
    for step, global_batch in enumerate(reference):
        joined = [i for r in range(num_replicas) for i in ranks[r][step]]
        # Same data each step whatever the world size; the last batch is padded to split evenly.
        assert joined[: len(global_batch)] == global_batch
        assert len({len(ranks[r][step]) for r in range(num_replicas)}) == 1
    covered = [i for r in range(num_replicas) for batch in ranks[r] for i in batch]
    assert set(covered) == set(range(n))
    pad = -(n % g) % num_replicas  # the last global batch is padded up to a multiple of the ranks
    assert pad > 0 and len(covered) == n + pad
    order = epoch_order(n, 5, 1, True).tolist()
    assert covered.count(order[0]) == 2  # padding repeats the epoch's start

    dropped = [
        ResumableBatchSampler(n, b, drop_last=True, num_replicas=num_replicas, rank=r)
        for r in range(num_replicas)
    ]
    assert sorted(i for s in dropped for batch in s for i in batch) == list(range(n // g * g))


def test_group_by_length_batches_similar_lengths_and_resumes():
    lengths = torch.randint(5, 128, (1000,), generator=torch.Generator().manual_seed(0))

    def waste(batches):  # share of a padded batch that is padding
        return 1 - sum(int(lengths[b].sum()) for b in batches) / sum(len(b) * int(lengths[b].max()) for b in batches)

    plain = list(ResumableBatchSampler(1000, 32, shuffle=True, seed=1, drop_last=True))
    grouped = ResumableBatchSampler(1000, 32, shuffle=True, seed=1, drop_last=True, lengths=lengths.tolist())
    batches = list(grouped)
    assert waste(plain) > 0.4 and waste(batches) < 0.1, (waste(plain), waste(batches))
    assert len(batches) == len(plain) and len({i for b in batches for i in b}) == 31 * 32  # no repeats
    assert batches == list(grouped)  # deterministic
    # Batches are not in length order: the groups of a window are shuffled.
    firsts = [int(lengths[b].max()) for b in batches]
    assert firsts != sorted(firsts, reverse=True)
    # Resuming at batch 7 of epoch 1 gives exactly the rest of that epoch.
    grouped.set_epoch(1)
    epoch1 = list(grouped)
    grouped.set_epoch(1, 7)
    assert list(grouped) == epoch1[7:] and epoch1 != batches
    # Data-parallel ranks split each global batch as without grouping.
    ranks = [list(ResumableBatchSampler(1000, 16, shuffle=True, seed=1, drop_last=True, num_replicas=2, rank=r,
                                        lengths=lengths.tolist())) for r in range(2)]
    assert [a + b for a, b in zip(*ranks, strict=True)] == batches
    with pytest.raises(ValueError, match="one int per sample"):
        ResumableBatchSampler(10, 2, lengths=[3] * 9)
    # A checkpoint of a grouped loader does not resume an ungrouped one (the orders differ).
    state = DataLoader(IndexDataset(10), batch_size=2, shuffle=True, lengths=list(range(10))).state_dict()
    with pytest.raises(ValueError, match="group_by_length differs"):
        DataLoader(IndexDataset(10), batch_size=2, shuffle=True).load_state_dict(state)


def test_trainer_group_by_length_needs_lengths(tmp_path):
    from sampan.trainer import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=2, group_by_length=True,
                             tensorboard=False)
    with pytest.raises(ValueError, match="group_by_length needs a train dataset with a `lengths` attribute"):
        Trainer(torch.nn.Linear(2, 2), args, IndexDataset(8))


def test_sampler_argument_errors():
    with pytest.raises(ValueError, match="rank"):
        ResumableBatchSampler(10, 2, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="no batches"):
        ResumableBatchSampler(3, 2, drop_last=True, num_replicas=2)
    with pytest.raises(ValueError, match="batch_size"):
        ResumableBatchSampler(10, 0)


# -- DataLoader ------------------------------------------------------------------------------------


def test_loader_epochs_len_and_order():
    loader = DataLoader(IndexDataset(10), batch_size=4, shuffle=True, seed=3)
    assert len(loader) == 3
    first = indices(list(loader))
    assert loader.epoch == 1 and loader.batch_index == 0
    second = indices(list(loader))
    assert loader.epoch == 2
    assert sorted(i for b in first for i in b) == list(range(10))
    assert first != second
    assert first == [b.tolist() for b in epoch_order(10, 3, 0, True).split(4)]
    fresh = DataLoader(IndexDataset(10), batch_size=4, shuffle=True, seed=3)
    assert indices(list(fresh)) == first
    fresh.set_epoch(1)
    assert indices(list(fresh)) == second


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_mid_epoch_matches_uninterrupted_run(num_workers):
    def make(workers: int) -> DataLoader:
        return DataLoader(IndexDataset(22), batch_size=4, shuffle=True, seed=42, num_workers=workers)

    total = 3 * 6  # three epochs of 6 batches
    reference = indices(take(make(0), total))
    for k in (4, 6, 9):  # mid-epoch, exactly at an epoch end, in the second epoch
        interrupted = make(0)
        assert indices(take(interrupted, k)) == reference[:k]
        state = json.loads(json.dumps(interrupted.state_dict()))
        assert state["batch_index"] == (k % 6 if k != 6 else 6)
        resumed = make(num_workers)
        resumed.load_state_dict(state)
        assert indices(take(resumed, total - k)) == reference[k:]


@pytest.mark.timeout(60)
def test_state_counts_handed_batches_not_prefetched():
    loader = DataLoader(IndexDataset(40), batch_size=2, shuffle=True, num_workers=2, prefetch_factor=4)
    it = iter(loader)
    got = [next(it) for _ in range(3)]  # workers have prefetched well beyond these 3
    assert loader.state_dict()["batch_index"] == 3
    resumed = DataLoader(IndexDataset(40), batch_size=2, shuffle=True)
    resumed.load_state_dict(loader.state_dict())
    assert indices(got + list(resumed)) == indices(
        list(DataLoader(IndexDataset(40), batch_size=2, shuffle=True))
    )


@pytest.mark.timeout(60)
@pytest.mark.parametrize("persistent", [False, True])
def test_workers_give_same_batches_as_main_process(persistent):
    def run(workers: int) -> list[list[int]]:
        loader = DataLoader(
            IndexDataset(13),
            batch_size=3,
            shuffle=True,
            seed=9,
            num_workers=workers,
            persistent_workers=persistent,
        )
        return indices(list(loader)) + indices(list(loader))

    main, workers = run(0), run(2)
    assert main == workers
    assert len(main) == 10


@pytest.mark.timeout(60)
def test_iterating_does_not_touch_global_torch_rng():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    np_before, py_before = np.random.get_state()[1].copy(), random.getstate()
    for workers in (0, 2):
        list(DataLoader(IndexDataset(8), batch_size=2, shuffle=True, num_workers=workers))
    assert torch.equal(torch.get_rng_state(), before)
    assert np.array_equal(np.random.get_state()[1], np_before) and random.getstate() == py_before
    # The check has teeth: plain torch DataLoader draws its worker base seed from the global RNG.
    list(torch.utils.data.DataLoader(IndexDataset(8), batch_size=2))
    assert not torch.equal(torch.get_rng_state(), before)


@pytest.mark.timeout(60)
def test_worker_rngs_seeded_from_seed_epoch_worker():
    def run(seed: int, epoch: int) -> torch.Tensor:
        loader = DataLoader(NoisyDataset(), batch_size=2, seed=seed, num_workers=2)
        loader.set_epoch(epoch)
        return torch.cat(list(loader))

    a = run(0, 0)
    assert torch.equal(a, run(0, 0))  # torch, numpy and python RNGs all reproducible
    assert not torch.equal(a, run(0, 1))
    assert not torch.equal(a, run(1, 0))
    assert len(set(a[:, 1].tolist())) == 8  # the two workers do not share a numpy stream


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers, persistent", [(0, False), (2, True)])
def test_new_iterator_continues_and_supersedes_old(num_workers, persistent):
    loader = DataLoader(
        IndexDataset(12), batch_size=2, num_workers=num_workers, persistent_workers=persistent
    )
    it1 = iter(loader)
    assert [next(it1)["idx"].tolist() for _ in range(2)] == [[0, 1], [2, 3]]
    it2 = iter(loader)
    assert next(it2)["idx"].tolist() == [4, 5]
    with pytest.raises(RuntimeError, match="superseded"):
        next(it1)
    assert indices(list(it2)) == [[6, 7], [8, 9], [10, 11]]
    with pytest.raises(StopIteration):
        next(it2)
    assert (loader.epoch, loader.batch_index) == (1, 0)
    it3 = iter(loader)
    assert next(it3)["idx"].tolist() == [0, 1]
    loader.set_epoch(0)  # also supersedes the live iterator
    with pytest.raises(RuntimeError, match="superseded"):
        next(it3)
    assert indices(list(loader))[0] == [0, 1]


def test_load_state_dict_checks_settings():
    def make(**kw) -> DataLoader:
        args = {"batch_size": 4, "shuffle": True, "seed": 0, "num_replicas": 1, **kw}
        return DataLoader(IndexDataset(16), **args)

    state = make().state_dict()
    assert set(state) >= {"epoch", "batch_index", "seed", "num_samples", "batch_size", "num_replicas"}
    with pytest.raises(ValueError, match="dataset length differs.*16.*15"):
        DataLoader(IndexDataset(15), batch_size=4, shuffle=True).load_state_dict(state)
    with pytest.raises(ValueError, match="global batch size differs"):
        make(batch_size=2).load_state_dict(state)
    with pytest.raises(ValueError, match="global batch size differs"):
        make(num_replicas=2).load_state_dict(state)
    with pytest.raises(ValueError, match="seed differs"):
        make(seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="shuffle differs"):
        make(shuffle=False).load_state_dict(state)
    with pytest.raises(ValueError, match="lacks 'epoch'"):
        make().load_state_dict({k: v for k, v in state.items() if k != "epoch"})
    with pytest.raises(ValueError, match="past the end"):
        make().load_state_dict({**state, "batch_index": 5})


def test_resume_on_a_different_world_size_with_same_global_batch():
    single = DataLoader(IndexDataset(20), batch_size=4, shuffle=True, seed=2)
    head = indices(take(single, 2))
    state = json.loads(json.dumps(single.state_dict()))
    rest = indices(take(single, 3))
    ranks = []
    for r in range(2):
        loader = DataLoader(IndexDataset(20), batch_size=2, shuffle=True, seed=2, num_replicas=2, rank=r)
        loader.load_state_dict(state)
        ranks.append(indices(list(loader)))
    assert [a + b for a, b in zip(*ranks, strict=True)] == rest
    assert len(head) == 2


def test_wait_seconds_grows():
    loader = DataLoader(IndexDataset(6), batch_size=2)
    assert loader.wait_seconds == 0.0
    it = iter(loader)
    next(it)
    first = loader.wait_seconds
    assert isinstance(first, float) and first > 0.0
    list(it)
    assert loader.wait_seconds > first
