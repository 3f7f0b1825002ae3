"""Mid-epoch resume yields exactly the batches the interrupted run had left, undecoded skips."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

from shardify.reader import ShardedDataset, make_loader


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
    return ShardedDataset(root, batch_size=3, shuffle=True, seed=11, transform=CountingCrop(log),
                          shuffle_buffer=5, shuffle_block=2, **kw)


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
    for i, _ in enumerate(loader):
        if i + 1 == stop_after:
            break
    state = loader.state_dict() if stop_after else {**loader.state_dict(), "batches": 0}
    assert state["epoch"] == 1 and state["batches"] == stop_after

    log = tmp_path / "resumed.log"  # (the interrupted run's workers may still be prefetching)
    ds = dataset(image_dataset, log)  # a new process restoring the checkpoint
    loader = make_loader(ds, num_workers=workers)
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
    assert loader.state_dict() == {**state, "batches": 8}


def test_state_is_checked_on_load(counting_dataset):
    root = counting_dataset([5, 5])
    loader = make_loader(ShardedDataset(root, batch_size=2, fields=("cls",), seed=1))
    state = loader.state_dict()
    other = make_loader(ShardedDataset(root, batch_size=2, fields=("cls",), seed=2))
    with pytest.raises(ValueError, match="field 'seed' is 1, this loader has 2"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="batches"):
        loader.load_state_dict({**state, "batches": 99})


def test_bucketed_resume_replays_exactly(tmp_path, shards):
    samples = [(f"k{i:03d}", {"txt": ("x" * (1 + (i * 7) % 13)).encode()}) for i in range(40)]
    root = shards.write_dataset(tmp_path / "b", [samples[:25], samples[25:]])

    def make():
        ds = ShardedDataset(root, batch_size=4, fields=("txt",), collate_fn=list, shuffle=True,
                            bucket_length=len, bucket_buffer=12)
        return ds, make_loader(ds, num_workers=2)

    ds, loader = make()
    full = list(loader)
    ds, loader = make()
    loader.load_state_dict({**loader.state_dict(), "batches": 5})
    assert list(loader) == full[5:]


@pytest.mark.parametrize("saved, loaded", [(2, 0), (2, 3), (0, 2)])
def test_resume_with_other_worker_count_is_refused(counting_dataset, saved, loaded):
    root = counting_dataset([7, 2, 13])
    loader = make_loader(ShardedDataset(root, batch_size=2, fields=("cls",), shuffle=True), num_workers=saved)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    loader.close()
    other = make_loader(ShardedDataset(root, batch_size=2, fields=("cls",), shuffle=True), num_workers=loaded)
    with pytest.raises(ValueError, match="field 'workers'"):
        other.load_state_dict(state)
