"""Dataset builders that test modules import by name (pytest's pythonpath holds tests/), so that
no test file pastes its own copy; the ``shards`` fixture of tests/conftest.py hands out the
builders that write shards by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["text_dataset", "augmented"]


def text_dataset(
    root: Path,
    n: int = 40,
    *,
    per_shard: int = 8,
    base: int = 300,
    spread: int = 700,
    classes: int = 5,
    fsync: bool = False,
) -> Path:
    """``n`` samples written by ``ShardWriter``: ``txt`` of one letter, ``base + i * 37 % spread``
    long (samples of many sizes), and ``cls`` = ``i % classes``."""
    from shardify.convert import ShardWriter

    with ShardWriter(root, samples_per_shard=per_shard, fsync=fsync) as w:
        for i in range(n):
            w.write({"txt": chr(97 + i % 26) * (base + i * 37 % spread), "cls": i % classes})
    return root


def augmented(root: Path, **kw: Any) -> Any:
    """A ``ShardedDataset`` of ``root`` as ImageNet training reads it: batches of 8, shuffled
    (seed 3), ``imagenet_train(64)``; ``kw`` adds options."""
    from shardify.reader import ShardedDataset
    from shardify.reader import transforms as T

    return ShardedDataset(root, batch_size=8, shuffle=True, seed=3, transform=T.imagenet_train(64), **kw)
