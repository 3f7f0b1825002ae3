"""The seeds' recipe through shardify: ``data/<ID>.pt`` + partition + labels, read back as batches.

Converted with ``pt_to_npy=True``: every ID and label comes back once per epoch, with the
tensor ``torch.load`` gives; two shuffled epochs give the same (id, label) pairs as the
map-style ``Dataset`` + ``DataLoader(shuffle=True)``; batches are one preallocated tensor per
field (recycled shared-memory slots) and go through the device prefetcher unchanged.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from shardify.convert.options import ConvertOptions
from shardify.convert.write.run import convert_ids
from shardify.reader import ShardedDataset, make_loader

TIME_LIMIT_S = 120


class TensorFiles(Dataset):
    """The map-style recipe of the seeds: ``torch.load`` in ``__getitem__``."""

    def __init__(self, root: Path, ids: list[str], labels: dict[str, int]) -> None:
        self.root, self.ids, self.labels = root, ids, labels

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, str]:
        ident = self.ids[index]
        return torch.load(self.root / f"{ident}.pt", weights_only=True), self.labels[ident], ident


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """96 train and 24 validation IDs (not key-safe ones too), 3x8x8 float32, 10 classes; converted."""
    work = tmp_path_factory.mktemp("ids")
    data = work / "data"
    data.mkdir()
    g = torch.Generator().manual_seed(0)
    ids = [f"id-{i:03d}" if i % 7 else f"odd id.{i}" for i in range(120)]
    labels = {ident: int(v) for ident, v in zip(ids, torch.randint(0, 10, (120,), generator=g))}
    for ident in ids:
        torch.save(torch.randn(3, 8, 8, generator=g), data / f"{ident}.pt")
    partition = {"train": ids[:96], "validation": ids[96:]}
    (work / "partition.json").write_text(json.dumps(partition))
    (work / "labels.json").write_text(json.dumps(labels))
    result = convert_ids(
        data,
        work / "out",
        partition=work / "partition.json",
        labels=work / "labels.json",
        pt_to_npy=True,
        options=ConvertOptions(workers=1, progress=False, fsync=False, samples_per_shard=20),
    )
    assert result.num_skipped == 0
    return {"data": data, "out": work / "out", "partition": partition, "labels": labels}


@pytest.mark.parametrize("split", ["train", "validation"])
def test_every_id_and_label_comes_back_once_with_its_tensor(recipe, split: str) -> None:
    ds = ShardedDataset(recipe["out"], split=split, batch_size=16, shuffle=True, fields=("npy", "cls", "json"))
    seen: dict[str, tuple[torch.Tensor, int]] = {}
    with make_loader(ds, num_workers=2) as loader:
        for x, y, meta in loader:
            assert x.dtype == torch.float32 and x.shape[1:] == (3, 8, 8) and y.dtype == torch.int64
            for ident, tensor, label in zip(meta["path"], x, y.tolist()):
                assert ident not in seen
                seen[ident] = (tensor.clone(), label)
    assert sorted(seen) == sorted(recipe["partition"][split])
    for ident, (tensor, label) in seen.items():
        assert label == recipe["labels"][ident]
        assert torch.equal(tensor, torch.load(recipe["data"] / f"{ident}.pt", weights_only=True))


def test_two_epochs_give_the_map_style_recipe_s_id_label_pairs(recipe) -> None:
    ids, labels = recipe["partition"]["train"], recipe["labels"]
    theirs = DataLoader(
        TensorFiles(recipe["data"], ids, labels),
        batch_size=16,
        shuffle=True,
        num_workers=2,
        generator=torch.Generator().manual_seed(0),
    )
    ds = ShardedDataset(
        recipe["out"], split="train", batch_size=16, shuffle=True, seed=0, fields=("npy", "cls", "json")
    )
    orders = []
    with make_loader(ds, num_workers=2) as ours:
        for epoch in range(2):
            ds.set_epoch(epoch)
            mine = [(i, label) for _, y, meta in ours for i, label in zip(meta["path"], y.tolist())]
            want = [(i, label) for _, y, idents in theirs for i, label in zip(idents, y.tolist())]
            assert Counter(mine) == Counter(want) and len(mine) == len(ids) == len(set(mine))
            orders.append([i for i, _ in mine])
    assert orders[0] != orders[1], "shuffle=True should change the order between epochs"


def test_batches_are_one_preallocated_tensor_per_field_from_recycled_slots(recipe) -> None:
    ds = ShardedDataset(recipe["out"], split="train", batch_size=48, fields=("npy", "cls"))  # 36 KB: inline
    big = ShardedDataset(recipe["out"], split="train", batch_size=4, fields=("npy", "cls"))
    with make_loader(ds, num_workers=2) as loader:
        for x, _ in loader:
            assert x.is_contiguous() and x.shape == (48, 3, 8, 8)
    import shardify.reader.delivery.batchpool as bp

    def in_a_slot(x: torch.Tensor) -> bool:
        """Whether ``x`` lies in a slot a worker sent this process (see batchpool)."""
        bases = [base for c in bp._CHANNELS.values() for _, base in c._maps.values()]
        return any(b.ctypes.data <= x.data_ptr() < b.ctypes.data + b.nbytes for b in bases)

    old = bp.INLINE_BYTES
    bp.INLINE_BYTES = 64  # so these small batches take the slot path (fork workers inherit it)
    batches = 0
    try:
        with make_loader(big, num_workers=2) as loader:
            for epoch in range(3):
                big.set_epoch(epoch)
                for x, y in loader:
                    assert x.is_contiguous() and x.shape == (4, 3, 8, 8) and in_a_slot(x)
                    batches += 1
                    del x, y
            slots = sum(len(c._maps) for c in bp._CHANNELS.values())
    finally:
        bp.INLINE_BYTES = old
    assert batches == 3 * 24 and 2 <= slots <= 2 * bp.MAX_SLOTS  # a few slots per worker, reused


def test_the_device_path_moves_tensor_batches_unchanged(recipe) -> None:
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    ds = ShardedDataset(recipe["out"], split="validation", batch_size=8, fields=("npy", "cls"))
    with make_loader(ds, num_workers=2) as loader:
        host = [(x.clone(), y.clone()) for x, y in loader]
    for device in devices:
        with make_loader(ds, num_workers=2, device=device) as loader:
            assert loader.dataloader.pin_memory == (device == "cuda")
            moved = list(loader)
        assert len(moved) == len(host) == 3
        for (x, y), (hx, hy) in zip(moved, host):
            assert x.device.type == device and x.dtype == torch.float32  # not taken for an image
            assert torch.equal(x.cpu(), hx) and torch.equal(y.cpu(), hy)
