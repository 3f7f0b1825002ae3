"""One worker's chain of stages for its share of an epoch, and the chain's state at a batch.

``Read -> [tag] -> Shuffle -> Cut -> Process (per batch) -> Fill -> Collate``; with length
bucketing ``Read -> [tag] -> Shuffle -> Process (per item) -> Bucketed -> Fill -> Collate``
(the groups need the decoded lengths). ``tag`` adds ``__stream__`` and ``__valid__`` to each
sample when the output needs them (:func:`~shardify.reader.streams.sample_tagger`).

A worker resumes at batch ``k`` of its share by restoring the chain's state at that batch
(:func:`state_at_batch`): the shuffle's first ``k * batch_size`` outputs are marked consumed and
never read; with bucketing, the share is replayed and its first ``k`` batches dropped.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from shardify.reader.plan.assign import WorkerPlan
from shardify.reader.plan.shuffle import derive_seed
from shardify.reader.sample.bad import Bad
from shardify.reader.stages.base import Mapped
from shardify.reader.stages.batch import Bucketed, Cut, Fill
from shardify.reader.stages.collate import Collate
from shardify.reader.stages.process import Process
from shardify.reader.stages.read import ItemReader, Read
from shardify.reader.stages.shuffle import Shuffle

__all__ = ["worker_stages", "state_at_batch"]


def _shuffled(
    reader: ItemReader, plan: WorkerPlan, read: Sequence[int], out: Sequence[int], tag: Callable[[Any], Any] | None
) -> Shuffle:
    source = Read(reader, plan.ranges, read)
    return Shuffle(source if tag is None else Mapped(source, tag), out, read=source)


def worker_stages(
    reader: ItemReader,
    plan: WorkerPlan,
    *,
    read: Sequence[int],
    out: Sequence[int],
    process: Callable[[Any], Any],
    collate: Callable[[list[Any]], Any],
    on_bad: Callable[[Bad], None],
    tag: Callable[[tuple[int, Any]], tuple[int, Any]] | None = None,
    bucket_length: Callable[[Any], int] | None = None,
    bucket_buffer: int | None = None,
    seed: int = 0,
    epoch: int = 0,
    rank: int = 0,
    worker: int = 0,
) -> Collate:
    """The chain making ``plan``'s batches from its start: ``read`` and ``out`` are its read and
    output orders (:func:`~shardify.reader.plan.resume.share_order`); ``process`` makes an
    item's output. Lazy: nothing is read before the first batch is asked for."""
    groups: Iterator[list[Any]]
    if bucket_length is None:
        batched = Cut(_shuffled(reader, plan, read, out, tag), plan.batch_sizes())
        groups = Process(batched, process, batched=True)
    else:
        groups = Bucketed(
            lambda: Process(_shuffled(reader, plan, read, out, tag), process),
            batch_size=plan.batch_size,
            length=bucket_length,
            buffer_size=bucket_buffer or 16 * plan.batch_size,
            make_rng=lambda: random.Random(derive_seed("bucket", seed, epoch, rank, worker)),
        )
    return Collate(Fill(groups, on_bad=on_bad), collate)


def state_at_batch(batches: int, *, batch_size: int, samples: int, bucketed: bool) -> dict[str, Any]:
    """The state of :func:`worker_stages`'s chain after its first ``batches`` batches, of a share
    of ``samples`` samples (every batch but the last holds ``batch_size``)."""
    if bucketed:
        groups: dict[str, Any] = {"batches": batches}
    else:
        shuffle = {"yielded": min(batches * batch_size, samples)}
        groups = {"source": {"batches": batches, "source": shuffle}}
    return {"source": {"source": groups, "yielded": 0}}
