"""One worker's chain of stages for its share of an epoch, built by one function from the plan.

``Read -> [tag] -> Shuffle -> Cut -> Process (per batch) -> Fill -> Collate``; with length
bucketing ``Read -> [tag] -> Shuffle -> Process (per item) -> Bucketed -> Fill -> Collate``
(the groups need the decoded lengths). ``tag`` adds ``__stream__`` and ``__valid__`` to each
sample when the output needs them (:func:`~shardify.reader.streams.sample_tagger`).

:func:`build_chain` takes the worker's :class:`~shardify.reader.plan.epoch.EpochPlan` and a
small :class:`ChainContext` (what the dataset gives: the reader, the per-sample processing,
collation, bucketing). A worker resumes at batch ``k`` of its share with ``chain.skip(k)``:
each stage turns "after my first ``k`` outputs" into its source's terms (a batch stage passes
batches down, ``Cut`` turns them into samples, ``Shuffle`` marks its first outputs consumed so
they are never read, ``Bucketed`` replays), so no code outside a stage knows its state.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from shardify.reader.plan.epoch import EpochPlan
from shardify.reader.plan.shuffle import derive_seed
from shardify.reader.sample.bad import Bad
from shardify.reader.stages.base import Mapped
from shardify.reader.stages.batch import Bucketed, Cut, Fill
from shardify.reader.stages.collate import Collate
from shardify.reader.stages.process import Process
from shardify.reader.stages.read import ItemReader, Read
from shardify.reader.stages.shuffle import Shuffle

__all__ = ["ChainContext", "build_chain"]


@dataclass(frozen=True)
class ChainContext:
    """What a worker's chain needs besides its plan."""

    reader: ItemReader
    process: Callable[[Any], Any]
    """Makes an item's output (a :class:`~shardify.reader.sample.bad.Bad` for a skipped one)."""
    collate: Callable[[list[Any]], Any]
    on_bad: Callable[[Bad], None]
    """Told of each skipped sample."""
    tag: Callable[[tuple[int, Any]], tuple[int, Any]] | None = None
    bucket_length: Callable[[Any], int] | None = None
    bucket_buffer: int | None = None
    """Samples grouped by length at once (default: 16 batches)."""
    seed: int = 0


def _shuffled(plan: EpochPlan, ctx: ChainContext) -> Shuffle:
    read, out = plan.orders()
    source = Read(ctx.reader, plan.share.ranges, read)
    return Shuffle(source if ctx.tag is None else Mapped(source, ctx.tag), out, read=source)


def build_chain(plan: EpochPlan, ctx: ChainContext) -> Collate:
    """The chain making ``plan``'s batches from its start (``chain.skip(k)`` before the first
    batch: from batch ``k``). Lazy: nothing is read before the first batch is asked for."""
    share = plan.share
    groups: Iterator[list[Any]]
    if ctx.bucket_length is None:
        groups = Process(Cut(_shuffled(plan, ctx), share.batch_sizes()), ctx.process, batched=True)
    else:
        seed = derive_seed("bucket", ctx.seed, plan.epoch, plan.rank, plan.worker)
        groups = Bucketed(
            lambda: Process(_shuffled(plan, ctx), ctx.process),
            batch_size=share.batch_size,
            length=ctx.bucket_length,
            buffer_size=ctx.bucket_buffer or 16 * share.batch_size,
            make_rng=lambda: random.Random(seed),
        )
    return Collate(Fill(groups, on_bad=ctx.on_bad), ctx.collate)
