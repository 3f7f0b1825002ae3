"""What makes a first batch early: workers forked with the parent's objects frozen (no full
garbage collection walking them in each worker); the shuffle buffer's ramp is tested in
test_shuffle.py and test_shuffle_quality.py, the header scans in test_scan_fast.py."""

from __future__ import annotations

import gc

import pytest

from shardify.reader import BatchOptions, ShardedDataset, make_loader


def _frozen_objects(sample: dict) -> int:
    return gc.get_freeze_count()  # runs in the worker


@pytest.mark.parametrize("persistent", [True, False])
def test_workers_start_with_the_parents_objects_frozen_and_the_parent_unfreezes(counting_dataset, persistent):
    ds = ShardedDataset(
        counting_dataset([8, 8]), batch_size=4, map=_frozen_objects, batching=BatchOptions(collate_fn=list)
    )
    before = gc.get_freeze_count()
    held = [[i] for i in range(20_000)]  # tracked objects a worker inherits
    with make_loader(ds, num_workers=2, persistent_workers=persistent) as loader:
        for epoch in range(2):
            ds.set_epoch(epoch)
            counts = [c for batch in loader for c in batch]
            assert len(counts) == 16 and min(counts) > before + 10_000, "the worker's objects were not frozen"
            assert gc.get_freeze_count() == before, "this process should unfreeze once its workers started"
    del held


def test_no_workers_freeze_nothing(counting_dataset):
    ds = ShardedDataset(
        counting_dataset([8]), batch_size=4, map=_frozen_objects, batching=BatchOptions(collate_fn=list)
    )
    before = gc.get_freeze_count()
    with make_loader(ds, num_workers=0) as loader:
        assert {c for batch in loader for c in batch} == {before}
