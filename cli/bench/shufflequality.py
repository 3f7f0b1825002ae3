"""The bench's shuffle figures, from the plan alone (no I/O): (f) how far apart consecutive
samples were in the original order, and (g) distinct classes per batch on class-sorted shards
across ranks, each against a full random permutation's."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from shardify.reader.io.sources import ShardInfo, Source
from shardify.reader.plan.assign import Range
from shardify.reader.plan.blocks import BlockSequence
from shardify.reader.plan.mix import block_sequence, epoch_sequence
from shardify.reader.plan.resume import PlanOptions
from shardify.reader.plan.simulate import Entry, rank_batches

__all__ = ["shuffle_quality", "class_mixing", "permutation_classes", "shuffle_figures"]


def _rank0_batches(
    sizes: list[int],
    *,
    seed: int,
    epoch: int,
    batch_size: int,
    workers: int,
    shuffle_buffer: int,
    shuffle_block: int,
    rank: int = 0,
    world: int = 1,
    interleave: bool = True,
) -> list[list[Entry]]:
    opts = PlanOptions(
        seed=seed,
        shuffle=True,
        batch_size=batch_size,
        drop_last=False,
        block=shuffle_block,
        buffer=shuffle_buffer,
    )
    seq: Sequence[Range] | BlockSequence
    if interleave:  # the default plan's blocks across shards
        seq = block_sequence([sizes], counts=None, seed=seed, epoch=epoch, block=shuffle_block)
    else:
        seq = epoch_sequence(
            [sizes], counts=None, seed=seed, epoch=epoch, shuffle=True, block=shuffle_block, interleave=False
        )
    return rank_batches(seq, opts, epoch=epoch, rank=rank, world=world, workers=max(1, workers))


def shuffle_quality(
    source: Source, *, seed: int, epoch: int, batch_size: int, workers: int, shuffle_buffer: int, shuffle_block: int
) -> dict[str, float]:
    """How well rank 0's epoch is mixed, from the plan alone (no I/O).

    ``gap``: mean |original index difference| of consecutive samples over N/3 (a full random
    permutation gives ~1). ``shards_per_batch``: mean number of distinct shards in a batch.
    """
    start = [0]
    for s in source.sizes:
        start.append(start[-1] + s)
    batches = _rank0_batches(
        source.sizes,
        seed=seed,
        epoch=epoch,
        batch_size=batch_size,
        workers=workers,
        shuffle_buffer=shuffle_buffer,
        shuffle_block=shuffle_block,
    )
    seq = [start[shard] + i for batch in batches for shard, i, _ in batch]
    n = len(seq)
    if n < 2:
        return {"gap": 0.0, "shards_per_batch": 1.0}
    gap = sum(abs(a - b) for a, b in zip(seq, seq[1:])) / (n - 1)
    shards = sum(len({shard for shard, _, _ in batch}) for batch in batches) / len(batches)
    return {"gap": gap / (n / 3), "shards_per_batch": shards}


def permutation_classes(*, classes: int, per_class: int, batch_size: int) -> float:
    """Expected distinct classes in ``batch_size`` samples of a uniform random permutation."""
    n = classes * per_class
    absent = 1.0
    for i in range(min(batch_size, n)):
        absent *= max(0, n - per_class - i) / (n - i)
    return classes * (1 - absent)


def class_mixing(
    *,
    world: int,
    classes: int = 100,
    per_class: int = 1000,
    samples_per_shard: int = 1000,
    batch_size: int = 256,
    workers: int = 4,
    shuffle_buffer: int = 1024,
    shuffle_block: int = 4,
    seed: int = 0,
    epoch: int = 0,
    interleave: bool = True,
) -> float:
    """Mean distinct classes per batch (every rank's batches) on class-sorted shards, over a
    uniform random permutation's; ``interleave=False``: whole shards in order, as before
    cross-rank shuffle. Computed from the plan alone."""
    n = classes * per_class
    sizes = [min(samples_per_shard, n - a) for a in range(0, n, samples_per_shard)]
    start = list(itertools.accumulate(sizes, initial=0))
    distinct, count = 0, 0
    for rank in range(world):
        for batch in _rank0_batches(
            sizes,
            seed=seed,
            epoch=epoch,
            batch_size=batch_size,
            workers=workers,
            shuffle_buffer=shuffle_buffer,
            shuffle_block=shuffle_block,
            rank=rank,
            world=world,
            interleave=interleave,
        ):
            if len(batch) == batch_size:
                distinct += len({(start[s] + i) // per_class for s, i, _ in batch})
                count += 1
    return distinct / count / permutation_classes(classes=classes, per_class=per_class, batch_size=batch_size)


def shuffle_figures(result: dict[str, Any], source: Source, shuffle_buffer: int, shuffle_block: int) -> None:
    """(f): shuffle quality here, with the buffer alone, and at ImageNet scale; (g) class mixing across ranks."""
    batch_size, workers = result["batch_size"], result["num_workers"]
    result["shuffle_quality"] = shuffle_quality(
        source,
        seed=0,
        epoch=1,
        batch_size=batch_size,
        workers=workers,
        shuffle_buffer=shuffle_buffer,
        shuffle_block=shuffle_block,
    )
    result["shuffle_quality_buffer_only"] = shuffle_quality(
        source,
        seed=0,
        epoch=1,
        batch_size=batch_size,
        workers=workers,
        shuffle_buffer=shuffle_buffer,
        shuffle_block=source.num_samples,
    )
    imagenet = Source(name="imagenet-like", split=None, shards=tuple(ShardInfo("", 1251) for _ in range(1024)))
    result["shuffle_quality_imagenet"] = shuffle_quality(
        imagenet, seed=0, epoch=1, batch_size=256, workers=8, shuffle_buffer=shuffle_buffer, shuffle_block=shuffle_block
    )
    result["class_mixing"] = {
        w: class_mixing(world=w, shuffle_buffer=shuffle_buffer, shuffle_block=shuffle_block) for w in (1, 2, 8)
    }
    result["class_mixing_whole_shards"] = {
        w: class_mixing(world=w, shuffle_buffer=shuffle_buffer, shuffle_block=shuffle_block, interleave=False)
        for w in (1, 2, 8)
    }
