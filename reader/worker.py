"""What runs in each worker (or in the training process without workers): one share's batches.

:func:`share_batches` builds the worker's chain of stages for its
:class:`~shardify.reader.plan.epoch.EpochPlan` (:func:`~shardify.reader.stages.chain.build_chain`),
skips it to the position's batch, over this process's :class:`ShardReader`
(:class:`ProcessReader`: one per process, never shared by a forked copy), and counts each batch
it yields in the position, so that a state taken after it counts it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from typing import Any

from shardify.reader.delivery.ahead import Made
from shardify.reader.delivery.batchpool import SlotPool
from shardify.reader.delivery.report import SharedReport
from shardify.reader.delivery.state import IterPosition
from shardify.reader.io.rangesetup import range_fetcher
from shardify.reader.io.sources import shard_columns
from shardify.reader.io.stream import ShardReader
from shardify.reader.io.tablesetup import sample_tables
from shardify.reader.options import ReadOptions
from shardify.reader.plan.epoch import EpochPlan
from shardify.reader.sample.bad import Bad
from shardify.reader.sample.collate import private_empty
from shardify.reader.sample.decoders import Decoding
from shardify.reader.sample.fields import loaded_fields
from shardify.reader.setup import ReadSetup
from shardify.reader.stages.chain import ChainContext, build_chain
from shardify.reader.stages.process import by_stream
from shardify.reader.stages.sharedmem import ToSharedMemory
from shardify.reader.streams import sample_tagger

__all__ = ["ProcessReader", "share_chain", "share_batches"]


class ProcessReader:
    """This process's :class:`ShardReader` of a dataset, made on first use (a forked copy makes its own)."""

    def __init__(self) -> None:
        self._reader: tuple[int, ShardReader] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"_reader": None}  # open files stay in the process that opened them

    def get(self, setup: ReadSetup, options: ReadOptions) -> ShardReader:
        pid = os.getpid()
        if self._reader is None or self._reader[0] != pid:  # a forked copy must not share files
            source = setup.source
            columns = shard_columns(source)
            self._reader = (
                pid,
                ShardReader(
                    source.urls,
                    source.sizes,
                    skip_damaged=options.skip_errors,
                    checksums=setup.checksums,
                    opener=setup.opener,
                    fields=loaded_fields(setup.stream_fields),
                    max_member=options.decoding.max_member_bytes,
                    offsets=columns.offsets,
                    filesizes=columns.filesizes,
                    chunks=columns.chunks,
                    ranged=range_fetcher(setup.sources),
                    tables=sample_tables(setup.sources) if options.decoding.check_samples else None,
                ),
            )
        return self._reader[1]


def share_chain(
    plan: EpochPlan,
    skip: int,
    *,
    setup: ReadSetup,
    readers: ProcessReader,
    decoding: Decoding,
    slots: SlotPool | None,
    on_bad: Callable[[Bad], None],
) -> tuple[Iterator[Any], ShardReader]:
    """``plan``'s batches after its first ``skip`` (packed in ``slots``, if given), and the reader
    they are read with (the caller closes it): the chain of stages of one share."""
    o = setup.options
    tag = None
    if setup.tag_stream or o.sampling.mark_repeats:
        tag = sample_tagger(
            plan.share,
            streams=setup.epoch_inputs.stream_sizes if setup.tag_stream else None,
            mark_repeats=o.sampling.mark_repeats,
        )
    processors = decoding.processors(setup.streams, setup.stream_fields, o, epoch=plan.epoch)
    reader = readers.get(setup, o)
    context = ChainContext(
        reader=reader,
        process=by_stream(processors),
        collate=decoding.collate(o, empty=slots.empty if slots is not None else private_empty),
        on_bad=on_bad,
        tag=tag,
        bucket_length=o.batching.bucket_length,
        bucket_buffer=o.batching.bucket_buffer,
        seed=o.seed,
    )
    try:
        chain = build_chain(plan, context)
        chain.skip(skip)
    except BaseException:
        reader.close()
        raise
    if slots is not None:  # in a worker under make_loader: batches travel in recycled shared memory
        return ToSharedMemory(chain, slots), reader
    return chain, reader


def share_batches(
    plan: EpochPlan | Callable[[], EpochPlan],
    position: IterPosition,
    *,
    setup: ReadSetup,
    readers: ProcessReader,
    decoding: Decoding,
    slots: SlotPool | None,
    report: SharedReport,
    slot: int,
    on_end: Callable[[EpochPlan], None] | None = None,
    made: Made | None = None,
) -> Iterator[Any]:
    """The batches of ``plan``'s share (or of the plan it makes, when the first batch is asked
    for) after ``position.batches``, each counted in ``position`` before it is yielded; ``on_end``
    is called with the plan once all were. ``decoding`` makes each sample's output and collates the
    batches, in the worker's shared-memory ``slots`` when it has them (then the ToSharedMemory stage
    sends them through the slots). ``made``: the chain of this very place with its first batch made
    ahead (:mod:`shardify.reader.delivery.ahead`), gone on with. The reader is closed when the share
    ends or the iteration stops."""
    on_bad = functools.partial(report.record_bad, slot)
    if made is not None and made.plan is not None:
        share = made.plan
        made.report_to(on_bad)  # skipped while made ahead: this epoch's report
    else:
        share = plan if isinstance(plan, EpochPlan) else plan()
    if position.batches >= share.num_batches:
        return
    if made is not None:
        batches, reader = made.chained(), made.reader
        timed = report.stages.timed(slot, batches, base=made.base, busy=made.busy)
    else:
        batches, reader = share_chain(
            share, position.batches, setup=setup, readers=readers, decoding=decoding, slots=slots, on_bad=on_bad
        )
        timed = report.stages.timed(slot, batches)
    try:
        for batch in timed:
            position.batches += 1  # before the yield: a state taken after next() counts this batch
            yield batch
    finally:
        reader.close()
    if on_end is not None:
        on_end(share)
