"""What the framework tests run, in the test process and in fresh processes (``python jobs.py ...``).

A tiny image dataset written with :class:`~shardify.convert.ShardWriter`, and the readers
the tests compare: each batch becomes ``(keys, images, labels)`` so that a test compares
samples, order and augmentation (the crops are drawn per sample, seeded by seed, epoch, key).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shardify.convert import ShardWriter
from shardify.reader import SamplingOptions, ShardedDataset
from shardify.reader import transforms as T

__all__ = ["write_images", "dataset", "take", "sdl_main"]


def write_images(out: Path, *, n: int = 22, samples_per_shard: int = 7) -> Path:
    """``n`` random 20x24 RGB JPEGs in shards of ``samples_per_shard``, labels ``i % 3``."""
    rng = np.random.default_rng(0)
    with ShardWriter(out, split="train", samples_per_shard=samples_per_shard, classes=["a", "b", "c"]) as w:
        for i in range(n):
            w.write({"__key__": f"img{i:03d}", "jpg": rng.integers(0, 255, (20, 24, 3), dtype=np.uint8), "cls": i % 3})
    return out


def dataset(root: Path, **kw: Any) -> ShardedDataset:
    """Shuffled batches of 3 with a random crop and flip (seeded per sample) and each sample's key."""
    options = dict(
        batch_size=3,
        shuffle=True,
        seed=7,
        sampling=SamplingOptions(shuffle_buffer=5, shuffle_block=2),
        transform=T.Compose([T.RandomResizedCrop(12), T.RandomHorizontalFlip()]),
        fields=("__key__", "image", "cls"),
    )
    options.update(kw)
    return ShardedDataset(root, **options)


def plain(batch: Any) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    keys, images, labels = batch
    return list(keys), images.clone(), labels.clone()


def take(loader: Any, n: int | None = None) -> list[tuple[list[str], torch.Tensor, torch.Tensor]]:
    """The first ``n`` batches of a new iteration of ``loader`` (all of them with None)."""
    out = []
    for batch in loader:
        out.append(plain(batch))
        if n is not None and len(out) == n:
            break
    return out


def sdl_main(root: str, workers: str, state: str, out: str) -> None:
    """A new process: a new StatefulDataLoader loads ``state``, reads the rest of epoch 1, then epoch 2."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from shardify.errors import ResumeError

    ds = dataset(Path(root))
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=int(workers))
    loader.load_state_dict(torch.load(state, weights_only=True))
    ds.set_epoch(1)
    try:
        rest: Any = take(loader)
    except ResumeError as e:  # saved after the epoch's last batch: its rest is refused, set_epoch(2) goes on
        rest = str(e)
        loader = StatefulDataLoader(ds, batch_size=None, num_workers=int(workers))
        loader.load_state_dict(torch.load(state, weights_only=True))
    ds.set_epoch(2)
    torch.save({"rest": rest, "next": take(loader)}, out)


if __name__ == "__main__":
    {"sdl": sdl_main}[sys.argv[1]](*sys.argv[2:])
