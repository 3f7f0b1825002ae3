"""MapDataset.collate's batches from workers through recycled shared memory: the values of
default_collate, one storage a batch, and a slot written again only once the main process has
freed every tensor over it."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, default_collate

from shardify.reader import MapDataset, mapslots
from shardify.reader import transforms as T


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from shardify.convert.options import ConvertOptions
    from shardify.convert.synth import make_imagefolder
    from shardify.convert.write.run import convert_imagefolder

    tmp = tmp_path_factory.mktemp("slots")
    src = make_imagefolder(tmp / "src", classes=2, per_class=12, sizes=((48, 40), (30, 52)))
    convert_imagefolder(src, tmp / "ds", options=ConvertOptions(samples_per_shard=7, progress=False, fsync=False))
    return tmp / "ds"


def _received(packed: Any) -> Any:
    """What unpickling ``packed`` gives in the main process (a batch not in a slot: itself)."""
    if not isinstance(packed, mapslots._InSlot):
        return packed
    rebuild, args = packed.__reduce__()
    return rebuild(*args)


def test_a_slot_is_written_again_only_after_its_batch_is_freed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mapslots, "get_worker_info", lambda: object())  # as inside a worker
    monkeypatch.setattr(mapslots, "_SLOTS", None)
    batch = [(torch.full((3, 4, 4), i, dtype=torch.uint8), i) for i in range(5)]
    first = mapslots.collate_in_slot(batch)
    x, y = _received(first)
    wx, wy = default_collate(batch)
    assert torch.equal(x, wx) and torch.equal(y, wy) and y.dtype == wy.dtype
    assert x.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()  # one storage a batch
    second = mapslots.collate_in_slot(batch)  # the first batch is still held: another slot
    assert second.storage.data_ptr() != first.storage.data_ptr()
    del x, y
    gc.collect()
    third = mapslots.collate_in_slot(batch)  # freed: its slot again
    assert third.storage.data_ptr() == first.storage.data_ptr()
    held = [_received(mapslots.collate_in_slot(batch)) for _ in range(mapslots.SLOTS)]
    assert all(isinstance(h, list) for h in held[-2:])  # every slot busy: fresh memory, as torch's
    assert all(torch.equal(h[0], wx) for h in held)


def test_columns_already_stacked_go_in_one_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mapslots, "get_worker_info", lambda: object())
    monkeypatch.setattr(mapslots, "_SLOTS", None)
    columns = [torch.arange(24, dtype=torch.int16).reshape(2, 3, 4), torch.tensor([7, 8]), ["a", "b"]]
    x, y, keys = _received(mapslots.columns_in_slot(columns))
    assert torch.equal(x, columns[0]) and torch.equal(y, columns[1]) and keys == ["a", "b"]
    assert x.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
    one = _received(mapslots.columns_in_slot(columns[0]))
    assert torch.equal(one, columns[0])


def test_batches_kept_by_the_loop_stay_as_made(photos: Path) -> None:
    """Workers reuse slots while the loop keeps some batches for good: every kept batch still
    holds what default_collate gives for its samples (same crops: same seed, epoch and key)."""
    ds = MapDataset(photos, transform=T.imagenet_train(24), seed=3)
    batches = [list(range(i, min(i + 4, len(ds)))) for i in range(0, len(ds), 4)]
    kept, want = [], []
    for epoch in range(3):
        ds.set_epoch(epoch)
        loader = DataLoader(ds, batch_sampler=batches, num_workers=2, collate_fn=ds.collate)
        for b, (x, y) in enumerate(loader):
            assert x.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()  # one storage
            if b % 3 == 0:
                kept.append((x, y))
                want.append(default_collate(ds.__getitems__(batches[b])))
    assert len(kept) == 6
    for (x, y), (wx, wy) in zip(kept, want):
        assert torch.equal(x, wx) and torch.equal(y, wy)


def test_spawned_workers_send_batches_through_slots_too(photos: Path) -> None:
    """A spawned worker imports the module afresh and keeps its own slots: its batches come in
    one storage and equal the in-process ones."""
    ds = MapDataset(photos, transform=T.imagenet_train(24), seed=5)
    batches = [list(range(i, min(i + 4, len(ds)))) for i in range(0, len(ds), 4)]
    loader = DataLoader(
        ds, batch_sampler=batches, num_workers=2, collate_fn=ds.collate, multiprocessing_context="spawn"
    )
    for b, (x, y) in enumerate(loader):
        wx, wy = default_collate(ds.__getitems__(batches[b]))
        assert torch.equal(x, wx) and torch.equal(y, wy)
        assert x.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()  # one storage: a slot
