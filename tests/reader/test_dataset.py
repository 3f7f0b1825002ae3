"""ShardedDataset end to end: ranks, workers, epochs, outputs, augmentation determinism."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from shardify.errors import FieldError, SampleError
from shardify.reader import (
    BatchOptions,
    DecodeOptions,
    SamplingOptions,
    ShardedDataset,
    make_loader,
)
from shardify.reader import transforms as T


def run(ds: ShardedDataset, workers: int = 0) -> list[list[int]]:
    loader = make_loader(ds, num_workers=workers) if workers else ds
    return [[int(x) for x in batch] for batch in loader]


def flat(batches: list[list[int]]) -> list[int]:
    return [x for b in batches for x in b]


def counting(root, **kw) -> ShardedDataset:
    kw.setdefault("batch_size", 3)
    return ShardedDataset(root, fields=("cls",), **kw)


@pytest.mark.parametrize("shuffle", [False, True])
def test_zero_and_two_workers_give_the_same_samples(counting_dataset, shuffle):
    root = counting_dataset([7, 2, 13])
    ds = counting(root, shuffle=shuffle, seed=5, sampling=SamplingOptions(shuffle_buffer=4, shuffle_block=2))
    zero, two = run(ds, 0), run(ds, 2)
    assert len(zero) == len(two) == len(ds) == 8
    assert sorted(flat(zero)) == sorted(flat(two)) == list(range(22))
    if not shuffle:
        assert zero == two == [list(range(i, min(i + 3, 22))) for i in range(0, 22, 3)]


def test_every_rank_same_count_and_exactly_once(counting_dataset, monkeypatch):
    root = counting_dataset([7, 2, 13])
    for world in (2, 3, 5):
        for drop_last in (False, True):
            seen: Counter = Counter()
            counts = set()
            for rank in range(world):
                monkeypatch.setenv("RANK", str(rank))
                monkeypatch.setenv("WORLD_SIZE", str(world))
                ds = counting(root, batch_size=2, shuffle=True, batching=BatchOptions(drop_last=drop_last))
                batches = run(ds, 2 if rank == 0 else 0)
                assert len(batches) == len(ds)
                assert sum(map(len, batches)) == (ds.samples_per_rank if not drop_last else len(ds) * 2)
                counts.add(len(batches))
                seen.update(flat(batches))
            assert len(counts) == 1
            if drop_last:
                assert max(seen.values()) == 1 and 22 - len(seen) < world * 2
            else:
                assert set(seen) == set(range(22)) and sum(seen.values()) - 22 < world


def test_set_epoch_reaches_persistent_workers(counting_dataset):
    root = counting_dataset([5] * 6)
    ds = counting(root, shuffle=True, seed=1)
    loader = make_loader(ds, num_workers=2, persistent_workers=True)
    orders = []
    for epoch in (0, 1, 2, 0):
        ds.set_epoch(epoch)
        orders.append(flat([[int(x) for x in b] for b in loader]))
    assert all(sorted(o) == list(range(30)) for o in orders)
    assert orders[0] != orders[1] != orders[2] and orders[3] == orders[0]
    fresh = counting(root, shuffle=True, seed=1)
    fresh.set_epoch(1)
    assert flat(run(fresh, 2)) == orders[1]  # the same seed and epoch give the same order on every run


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_fewer_shards_than_ranks_times_workers(counting_dataset, monkeypatch):
    root = counting_dataset([1, 2])
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        ds = counting(root, batch_size=1)
        assert len(run(ds, 4)) == len(ds) == 2  # 2 of the 4 workers get nothing, and say nothing


def key_and_pixels(sample: dict) -> tuple[str, torch.Tensor]:
    return sample["__key__"], sample["jpg"]


def test_one_and_two_workers_augment_a_key_identically(image_dataset):
    pixels = []
    for workers in (1, 2):
        ds = ShardedDataset(
            image_dataset,
            batch_size=4,
            shuffle=True,
            seed=3,
            map=key_and_pixels,
            transform=T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip()]),
            batching=BatchOptions(collate_fn=list),
        )
        ds.set_epoch(2)
        got = {k: p for batch in make_loader(ds, num_workers=workers) for k, p in batch}
        assert len(got) == 22
        pixels.append(got)
    assert all(torch.equal(pixels[0][k], pixels[1][k]) for k in pixels[0])
    ds.set_epoch(3)
    later = {k: p for batch in ds for k, p in batch}
    assert sum(not torch.equal(later[k], pixels[0][k]) for k in later) > 11  # new crops each epoch


def test_default_output_is_images_and_labels(image_dataset):
    ds = ShardedDataset(
        image_dataset, batch_size=8, transform=T.RandomResizedCrop(16), batching=BatchOptions(drop_last=True)
    )
    batches = list(ds)
    assert len(batches) == len(ds) == 2
    images, labels = batches[0]
    assert images.shape == (8, 3, 16, 16) and images.dtype == torch.uint8
    assert labels.dtype == torch.int64 and labels.tolist() == [g % 3 for g in range(8)]


def test_fields_alternatives_and_map(counting_dataset):
    root = counting_dataset([4])
    ds = ShardedDataset(root, batch_size=2, fields=("png;txt", "cls"), batching=BatchOptions(collate_fn=list))
    assert [s for b in ds for s in b] == [(str(g), g) for g in range(4)]
    ds = ShardedDataset(root, batch_size=4, map=lambda s: s["cls"] * 10 + len(s["__key__"]))
    assert next(iter(ds)).tolist() == [10 * g + len("s000_00000") for g in range(4)]
    with pytest.raises(ValueError, match="not both"):
        ShardedDataset(root, batch_size=2, fields=("cls",), map=len)
    with pytest.raises(FieldError, match=r"no field 'npy' in this split \(its samples hold cls, txt\)"):
        ShardedDataset(root, batch_size=2, fields=("npy",))  # when built, not at the first batch


def test_pickle_only_by_name(tmp_path, shards):
    import pickle

    root = shards.write_dataset(tmp_path / "p", [[("a", {"pkl": pickle.dumps({"x": 1}), "cls": b"0"})]])
    with pytest.raises(SampleError, match="pickle"):
        list(ShardedDataset(root, batch_size=1, fields=("pkl",), batching=BatchOptions(collate_fn=list)))
    with pytest.raises(SampleError, match="pickle"):  # the skip policy does not hide it
        list(
            ShardedDataset(
                root,
                batch_size=1,
                fields=("pkl",),
                batching=BatchOptions(collate_fn=list),
                decoding=DecodeOptions(on_error="skip"),
            )
        )
    ds = ShardedDataset(
        root,
        batch_size=1,
        fields=("pkl",),
        batching=BatchOptions(collate_fn=list),
        decoding=DecodeOptions(allow_pickle=True),
    )
    assert list(ds) == [[{"x": 1}]]


def test_lengths(counting_dataset, monkeypatch):
    root = counting_dataset([7, 2, 13])
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    assert (len(counting(root, batch_size=4)), counting(root, batch_size=4).samples_per_rank) == (2, 6)
    assert (
        len(counting(root, batch_size=4, batching=BatchOptions(drop_last=True))),
        counting(root, batch_size=4, batching=BatchOptions(drop_last=True)).samples_per_rank,
    ) == (1, 5)
    assert counting(root).num_samples == 22


def test_bucketing_groups_by_length_and_keeps_counts(tmp_path, shards):
    samples = [(f"k{i:03d}", {"txt": ("x" * (1 + (i * 7) % 13)).encode()}) for i in range(40)]
    root = shards.write_dataset(tmp_path / "b", [samples[:25], samples[25:]])
    ds = ShardedDataset(
        root,
        batch_size=4,
        fields=("txt",),
        shuffle=True,
        batching=BatchOptions(collate_fn=list, bucket_length=len, bucket_buffer=20),
    )
    batches = list(make_loader(ds, num_workers=2))
    assert len(batches) == len(ds) == 10
    assert sorted(s for b in batches for s in b) == sorted(s["txt"].decode() for _, s in samples)
    spread = sum(max(map(len, b)) - min(map(len, b)) for b in batches) / len(batches)
    assert spread < 6  # unbucketed batches of random lengths 1..13 spread ~8


def test_spawned_workers_see_epoch_rank_and_report(counting_dataset, monkeypatch, tmp_path):
    root = counting_dataset([5, 5])
    (root / "train-000001.tar").write_bytes(b"garbage" * 100)
    monkeypatch.setenv("WORLD_SIZE", "1")
    ds = ShardedDataset(root, batch_size=2, fields=("cls",), shuffle=True, decoding=DecodeOptions(on_error="skip"))
    loader = make_loader(ds, num_workers=2, multiprocessing_context="spawn")
    orders = []
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        orders.append(flat([[int(x) for x in b] for b in loader]))
        assert ds.last_epoch_report.lost == 5 and len(orders[-1]) == 10
    assert set(orders[0]) == set(orders[1]) == set(range(5)) and orders[0] != orders[1]


def test_an_epoch_is_planned_once_per_process(counting_dataset, monkeypatch):
    """The plan is a pure function: a process plans an epoch's sequence once and reuses it;
    a new epoch is planned anew, a new order of the same samples."""
    import shardify.reader.plan.epoch as epoch_module

    calls: list[int] = []
    real = epoch_module.planned_sequence
    monkeypatch.setattr(epoch_module, "planned_sequence", lambda *a, **kw: calls.append(kw["epoch"]) or real(*a, **kw))
    epoch_module._sequence.cache_clear()  # planned by an earlier test of the same inputs
    ds = counting(
        counting_dataset([7, 2, 13]), shuffle=True, seed=5, sampling=SamplingOptions(shuffle_buffer=4, shuffle_block=2)
    )
    first = run(ds)
    assert run(ds) == first
    assert calls == [0]
    ds.set_epoch(1)
    second = run(ds)
    assert calls == [0, 1]
    assert second != first and sorted(flat(second)) == sorted(flat(first)) == list(range(22))
