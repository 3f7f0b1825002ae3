"""Mid-epoch resume yields exactly the batches the interrupted run had left, undecoded skips."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

from shardify.reader import BatchOptions, SamplingOptions, ShardedDataset, make_loader
from shardify.reader.delivery.state import seal_state


class CountingCrop:
    """A user transform (decoded PIL in, PIL out) that logs each call to a file; random crop."""

    def __init__(self, log: Path) -> None:
        self.log = str(log)

    def __call__(self, img):
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()}\n")
        w, h = img.size
        x, y = random.randrange(w - 12), random.randrange(h - 12)  # global RNG, seeded per sample
        return img.crop((x, y, x + 12, y + 12))


def calls(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def dataset(root, log: Path, **kw) -> ShardedDataset:
    return ShardedDataset(
        root,
        batch_size=3,
        shuffle=True,
        seed=11,
        transform=CountingCrop(log),
        sampling=SamplingOptions(shuffle_buffer=5, shuffle_block=2),
        **kw,
    )


def same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("stop_after", [0, 1, 4, 7])
def test_resume_equals_the_uninterrupted_run(image_dataset, tmp_path, workers, stop_after):
    log = tmp_path / "calls.log"
    ds = dataset(image_dataset, log)
    ds.set_epoch(1)
    full = list(make_loader(ds, num_workers=workers))
    assert len(full) == len(ds) == 8

    ds = dataset(image_dataset, tmp_path / "interrupted.log")  # the interrupted run
    loader = make_loader(ds, num_workers=workers)
    ds.set_epoch(1)
    state = loader.state_dict()  # before the epoch: batches 0
    for i, _ in enumerate(loader if stop_after else ()):
        if i + 1 == stop_after:
            break
    state = loader.state_dict() if stop_after else state
    assert state["epoch"] == 1 and state["batches"] == stop_after

    log = tmp_path / "resumed.log"  # (the interrupted run's workers may still be prefetching)
    ds = dataset(image_dataset, log)  # a new process restoring the checkpoint
    loader = make_loader(ds, num_workers=workers, epoch_ahead=False)  # (calls of this epoch only)
    loader.load_state_dict(state)
    ds.set_epoch(1)
    rest = list(loader)
    assert same(rest, full[stop_after:])
    assert calls(log) == sum(len(b[1]) for b in full[stop_after:])  # skipped batches never decoded
    assert loader.state_dict()["batches"] == 8
    assert same(list(loader), full)  # the resume point is used once
    assert loader.state_dict()["batches"] == 8


def test_resume_the_same_persistent_loader_mid_epoch(image_dataset, tmp_path):
    log = tmp_path / "calls.log"
    ds = dataset(image_dataset, log)
    loader = make_loader(ds, num_workers=2, persistent_workers=True)
    ds.set_epoch(2)
    full = list(loader)
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    state = loader.state_dict()
    del it
    ds.set_epoch(5)  # the trainer moved on, then restores the checkpoint
    loader.load_state_dict(state)
    rest = list(loader)
    assert same(head + rest, full)
    assert loader.state_dict() == seal_state({**state, "batches": 8})


def test_state_is_checked_on_load(counting_dataset):
    root = counting_dataset([5, 5])
    loader = make_loader(ShardedDataset(root, batch_size=2, fields=("cls",), seed=1))
    state = loader.state_dict()
    other = make_loader(ShardedDataset(root, batch_size=2, fields=("cls",), seed=2))
    with pytest.raises(ValueError, match="field 'seed' is 1, this loader has 2"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="field 'batches' is 99, which does not match its checksum"):
        loader.load_state_dict({**state, "batches": 99})
    with pytest.raises(ValueError, match="batches=99 but each rank has 5 batches"):
        loader.load_state_dict(seal_state({**state, "batches": 99}))


def test_bucketed_resume_replays_exactly(tmp_path, shards):
    samples = [(f"k{i:03d}", {"txt": ("x" * (1 + (i * 7) % 13)).encode()}) for i in range(40)]
    root = shards.write_dataset(tmp_path / "b", [samples[:25], samples[25:]])

    def make():
        ds = ShardedDataset(
            root,
            batch_size=4,
            fields=("txt",),
            batching=BatchOptions(collate_fn=list, bucket_length=len, bucket_buffer=12),
            shuffle=True,
        )
        return ds, make_loader(ds, num_workers=2)

    ds, loader = make()
    full = list(loader)
    ds, loader = make()
    loader.load_state_dict(seal_state({**loader.state_dict(), "batches": 5}))
    assert list(loader) == full[5:]


@pytest.mark.parametrize("saved, loaded", [(2, 0), (2, 3), (0, 2), (3, 1)])
def test_resume_with_another_worker_count_reads_the_rest_exactly_once(counting_dataset, saved, loaded):
    """Each sample exactly once (a wrong mapping of the saved place read ~1/5 twice and as many never)."""
    root = counting_dataset([7, 2, 13, 30, 1])

    def make(workers):
        return make_loader(
            ShardedDataset(
                root,
                batch_size=2,
                fields=("cls",),
                shuffle=True,
                seed=3,
                sampling=SamplingOptions(shuffle_buffer=4, shuffle_block=3),
            ),
            num_workers=workers,
        )

    loader = make(saved)
    it = iter(loader)
    head = [next(it) for _ in range(9)]
    state = loader.state_dict()
    del it
    loader.close()
    other = make(loaded)
    other.load_state_dict(state)
    rest = list(other)
    seen = sorted(int(x) for b in head + rest for x in b)
    assert seen == list(range(53))
    assert len(rest) == -(-(53 - 18) // 2)
    other.close()


def _counting(root, *, shuffle_buffer=4, **kw):
    return ShardedDataset(
        root,
        batch_size=2,
        fields=("cls", "__valid__"),
        shuffle=True,
        seed=3,
        sampling=SamplingOptions(mark_repeats=True, shuffle_buffer=shuffle_buffer, shuffle_block=3),
        **kw,
    )


@pytest.mark.parametrize(
    "a, b, k", [((2, 0), (3, 2), 2), ((3, 2), (1, 0), 1), ((1, 3), (2, 1), 4), ((2, 1), (2, 1), 3)]
)
def test_resume_on_another_world_and_workers_reads_the_rest_once(counting_dataset, monkeypatch, a, b, k):
    from collections import Counter

    root = counting_dataset([7, 2, 13, 30, 1])
    seen: Counter = Counter()
    for rank in range(a[0]):  # every rank of the saved run, stopped after k batches
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(a[0]))
        with make_loader(_counting(root), num_workers=a[1]) as loader:
            it = iter(loader)
            for _ in range(k):
                cls, ok = next(it)
                seen.update(cls[ok].tolist())
            state = loader.state_dict()
            del it
    lengths = []
    for rank in range(b[0]):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(b[0]))
        with make_loader(_counting(root), num_workers=b[1]) as loader:
            loader.load_state_dict(state)
            rest = list(loader)
        lengths.append(len(rest))
        seen.update(x for cls, ok in rest for x in cls[ok].tolist())
    assert len(set(lengths)) == 1
    assert seen == Counter(range(53))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_saved_after_the_last_batch_resumes_at_the_next_epoch(image_dataset, tmp_path, workers):
    """Lightning checkpoints after the epoch's last batch, before the loader ends, and makes the
    resumed run's iterator without calling set_epoch: that iterator must be the next epoch's."""
    ds = dataset(image_dataset, tmp_path / "a.log")
    loader = make_loader(ds, num_workers=workers)
    ds.set_epoch(2)
    expected = list(loader)
    ds.set_epoch(1)
    for i, _ in enumerate(loader):
        if i + 1 == len(ds):
            state = loader.state_dict()  # inside the loop: the loader has not seen the end yet
    assert state["epoch"] == 1 and state["batches"] == len(ds)

    ds = dataset(image_dataset, tmp_path / "b.log")
    loader = make_loader(ds, num_workers=workers)
    loader.load_state_dict(state)
    assert ds.epoch == 2
    assert same(list(loader), expected)
    loader.load_state_dict(state)
    ds.set_epoch(1)  # asked for: the rest of epoch 1, which is empty
    assert list(loader) == []


def test_an_epoch_reads_and_resumes_in_the_plans_keyed_block_order(counting_dataset):
    """An epoch's batches are the plan's (blocks in a keyed order per worker, a ramped buffer),
    as simulated from the plan alone; a state records the plan version and resumes that order."""
    from shardify.reader.dataset import PLAN_VERSION
    from shardify.reader.plan.mix import block_sequence
    from shardify.reader.plan.simulate import rank_batches

    root = counting_dataset([7, 2, 13, 30, 1])
    ds = _counting(root, shuffle_buffer=40)  # a ramp from 2 samples to 40
    keyed = block_sequence([ds.source.sizes], counts=None, seed=3, epoch=2, block=3)
    start = [0, 7, 9, 22, 52]
    run = [
        [start[s] + i for s, i, _ in b]
        for b in rank_batches(keyed, ds.plan_options, epoch=2, rank=0, world=1, workers=2)
    ]
    with make_loader(ds, num_workers=2) as loader:
        ds.set_epoch(2)
        assert [cls.tolist() for cls, _ in loader] == run
    with make_loader(_counting(root, shuffle_buffer=40), num_workers=2) as loader:
        loader.dataset.set_epoch(2)
        it = iter(loader)
        head = [next(it)[0].tolist() for _ in range(5)]
        state = loader.state_dict()
        del it
    assert state["plan_version"] == PLAN_VERSION == 4
    with make_loader(_counting(root, shuffle_buffer=40), num_workers=2) as loader:
        loader.load_state_dict(state)
        rest = [cls.tolist() for cls, _ in loader]
    assert head == run[:5] and rest == run[5:]
