"""``ShardedDataset``: an IterableDataset that yields whole batches, exactly once per epoch.

The main process owns a few shared-memory cells (epoch and resume point:
:mod:`shardify.reader.delivery.shared_epoch`; skip report: :mod:`shardify.reader.delivery.report`)
created with the dataset, so ``set_epoch`` and resuming reach persistent DataLoader workers,
which hold a copy of the dataset. Each worker reads the cells when its iteration starts and
runs the pure plan (:mod:`shardify.reader.plan.assign`) for its (rank, worker), then its share's
chain of stages (:func:`shardify.reader.sample.pipeline.share_batches`).

Shuffle and batching: the epoch's sequence mixes blocks of every stream and shard
(:mod:`shardify.reader.plan.mix`); a worker gets whole batches of its rank's slice of it
(batch ``b`` to worker ``b % workers``), and shuffles the samples of all its batches
together, before batching, with a buffer of encoded samples. So a batch holds samples of the
worker's share only, each sample still appears exactly once, and DataLoader's round-robin
fetch keeps the rank's batch count and order. A resume on another topology plans what is
left of the epoch (:mod:`shardify.reader.plan.resume`).

``state_dict``/``load_state_dict`` save and restore one process's place in its share (one
worker's, or the main process's with no workers): the protocol of torchdata's
``StatefulDataLoader``, which calls them in each worker (:mod:`shardify.reader.delivery.place`,
:mod:`shardify.reader.delivery.state`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from shardify.reader.delivery.batchpool import SlotPool, WorkerSlots
from shardify.reader.delivery.place import ProcessPlace, loaded_place
from shardify.reader.delivery.report import EpochReport, SharedReport
from shardify.reader.delivery.shared_epoch import MAX_SEGMENTS, SharedEpoch
from shardify.reader.delivery.state import IterPosition, load_iter_state, make_iter_state
from shardify.reader.deprecated import apply_old_keywords
from shardify.reader.io.checksums import source_checksums, with_checksums
from shardify.reader.io.ranged import range_fetcher
from shardify.reader.io.sources import Source, SourceLike, is_gzip
from shardify.reader.io.stream import ShardReader
from shardify.reader.options import (
    BatchOptions,
    CacheOptions,
    DecodeOptions,
    ErrorOptions,
    ReadOptions,
    SamplingOptions,
    ShuffleOptions,
    with_defaults,
)
from shardify.reader.plan.assign import (
    batches_per_rank,
    plan_worker,
    resumed_role,
    samples_per_rank,
    sequence_length,
    sequence_starts,
)
from shardify.reader.plan.blocks import BlockSequence
from shardify.reader.plan.mix import layout_sequence
from shardify.reader.plan.resume import LAYOUT, LAYOUTS, PlanOptions, Segment, resumed_sequence, share_order
from shardify.reader.plan.world import World, detect_rank_world, detect_world
from shardify.reader.sample.collate import private_empty
from shardify.reader.sample.decoders import Decoding, choose_decoding
from shardify.reader.sample.fields import loaded_fields, stream_fields
from shardify.reader.sample.pipeline import share_batches
from shardify.reader.stages.transport import Transport
from shardify.reader.streams import MixedOpener, Stream, epoch_counts, mixed_source, resolve_streams, tag_samples

__all__ = ["ReadOptions", "ShardedDataset", "Stream", "LAYOUT", "LAYOUTS", "MAX_SEGMENTS"]


class ShardedDataset(IterableDataset):
    """Batches of a sharded dataset for this rank, the same number on every rank.

    ``source``: a shardify dataset directory, its ``manifest.json`` or a split index, or tar
    shards without a manifest (a list or a ``{000..099}`` pattern; ``.tar``, ``.tar.gz``,
    ``.tgz``), which are counted once here. ``split``: needed when the dataset has several.
    Any of these may be a URL (``http(s)://`` or an fsspec URL): remote shards are downloaded
    (streamed, retried, resumed with HTTP Range) into ``cache=CacheOptions(dir=...)`` (shared
    safely by workers and ranks, LRU-evicted under its ``limit_bytes``), or without it into a
    small per-process temporary folder; for training on remote data, give a cache directory.

    Output: ``fields`` (checked against the split index, if any, when the dataset is built;
    default ``("image", "cls")``, or the split's tensor field and ``cls`` when it has no
    images: :mod:`~shardify.reader.sample.fields`) gives one column per entry (an
    extension, ``"a;b"`` alternatives, or ``"image"`` for any image extension); image fields
    go through ``transform`` (uint8 CHW), others are decoded by extension. Or ``map(sample_dict)``
    builds the output (see :class:`~shardify.reader.sample.pipeline.SampleProcessor`).
    ``__stream__`` (the stream's index), ``__key__`` and, with ``mark_repeats``, ``__valid__``
    are there too. ``shuffle``/``seed``: the seeded shuffle; ``seed`` also seeds augmentation.

    The other options come in groups (:mod:`shardify.reader.options`; each defaults to its
    class's defaults): ``shuffling`` (:class:`ShuffleOptions`: buffer and block sizes),
    ``batching`` (:class:`BatchOptions`: ``collate_fn``, length bucketing), ``sampling``
    (:class:`SamplingOptions`: ``samples_per_epoch``, ``mark_repeats``), ``decoding``
    (:class:`DecodeOptions`: ``allow_pickle``, ``max_member_bytes``), ``errors``
    (:class:`ErrorOptions`: ``on_error="skip"``, see :attr:`last_epoch_report`; ``verify``,
    checksums from the split index or given, see :mod:`shardify.reader.io.checksums`) and
    ``cache`` (:class:`CacheOptions`). Only the fields the output needs are read from a shard
    (all of them with ``map``); an image over ``PIL.Image.MAX_IMAGE_PIXELS`` pixels is a bad
    sample (see docs/reliability.md). The keywords these groups replaced
    (``shuffle_buffer=``, ``on_error=``, ...) still work for one release, with a
    ``DeprecationWarning`` (:mod:`shardify.reader.deprecated`).

    Several sources: ``source`` as a list of :class:`Stream` (each with its ``weight``,
    ``split``, ``transform``, ``map``, ``fields``: the per-sample keywords above, per stream);
    batches mix them, ``sampling.samples_per_epoch`` split between the streams by weight.

    ``decoding=DecodeOptions(device="cuda")``: workers only read the bytes and draw each
    image's crop and flip (the same draws as on the CPU); ``make_loader`` decodes the batch
    there with nvJPEG and crops, resizes, flips and normalises it in batched calls (images the
    workers cannot send as baseline JPEGs are decoded in the workers, counted in
    :attr:`last_epoch_report`). Needs a crop transform (optionally followed by
    ``RandomHorizontalFlip``) and ``shardify[gpu]``; ``map=``, a custom ``collate_fn=`` and
    ``bucket_length=`` are refused there. See :mod:`shardify.reader.sample.decoders`.
    """

    def __init__(
        self,
        source: SourceLike | Source | Stream | Sequence[Stream],
        *,
        split: str | None = None,
        batch_size: int | None = None,
        shuffle: bool = False,
        seed: int = 0,
        transform: Callable[..., Any] | None = None,
        fields: Sequence[str] | None = None,
        map: Callable[[dict[str, Any]], Any] | None = None,
        drop_last: bool = False,
        shuffling: ShuffleOptions | None = None,
        batching: BatchOptions | None = None,
        sampling: SamplingOptions | None = None,
        decoding: DecodeOptions | None = None,
        errors: ErrorOptions | None = None,
        cache: CacheOptions | None = None,
        **deprecated: Any,
    ) -> None:
        super().__init__()
        groups = with_defaults(
            apply_old_keywords(
                deprecated,
                dict(
                    shuffling=shuffling,
                    batching=batching,
                    sampling=sampling,
                    decoding=decoding,
                    errors=errors,
                    cache=cache,
                ),
                known=tuple(inspect.signature(ShardedDataset.__init__).parameters),
            )
        )  # to name a misspelt one
        if batch_size is None:  # required; a default of None lets a misspelt batchsize= be named first
            raise TypeError("ShardedDataset() missing 1 required keyword-only argument: 'batch_size'")
        where = groups.pop("cache")  # the source's, not the workers'
        verify = groups["errors"].verify
        self.options = o = ReadOptions.from_groups(
            batch_size=batch_size,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            transform=transform,
            fields=(fields,) if isinstance(fields, str) else (tuple(fields) if fields is not None else None),
            map=map,
            **groups,
        )
        self.streams = resolve_streams(
            source,
            split=split,
            cache_dir=where.dir,
            cache_limit_bytes=where.limit_bytes,
            skip_unreadable=o.on_error == "skip",
            remote={"allow_locations": where.allow_locations, "ranged": where.ranged, "requests": where.requests},
        )
        sources: list[Source] = [s.source for s in self.streams]  # type: ignore[misc]
        if verify is not False and verify is not True:
            sources = [with_checksums(s, verify) for s in sources]
            self.streams = tuple(dataclasses.replace(st, source=s) for st, s in zip(self.streams, sources))
        # where images are decoded, chosen once: in the workers, or planned there and decoded by make_loader
        self.decode_strategy: Decoding = choose_decoding(groups["decoding"].device, self.options, self.streams)
        self.decode_device: torch.device | None = self.decode_strategy.device
        self._sources = tuple(sources)
        self.source = mixed_source(sources)
        self._opener = MixedOpener(sources) if len(sources) > 1 else self.source.open_tar
        self._stream_sizes = tuple(tuple(s.sizes) for s in sources)
        self._counts = epoch_counts(self.streams, samples_per_epoch=o.samples_per_epoch)  # None: each sample once
        # a compressed shard cannot seek: read in cross-rank blocks it would be inflated from its
        # start once per block, so datasets with such shards keep whole shards. (A property of
        # the format, not of where shards live: the same dataset reads alike locally and remotely.)
        self._blocks = not any(is_gzip(sh.url) for sh in self.source.shards)
        self._stream_fields = tuple(stream_fields(s, fields=o.fields, map=o.map) for s in self.streams)
        wanted = {f for fields in self._stream_fields for f in fields}
        if "__valid__" in wanted and not o.mark_repeats:
            raise ValueError("fields=... names '__valid__': pass sampling=SamplingOptions(mark_repeats=True)")
        self._tag_stream = (
            len(sources) > 1
            or "__stream__" in wanted
            or map is not None
            or any(s.map is not None for s in self.streams)
        )
        self._checksums = source_checksums(self.source) if o.verify else None
        self._shared_epoch = SharedEpoch()  # the epoch and resume point, seen by persistent workers
        self._report = SharedReport()
        self._rank_world: tuple[int, int] | None = None
        self._reader: tuple[int, ShardReader] | None = None
        self.batch_slots = WorkerSlots()  # make_loader's Loader attaches its channel while workers start
        # (key, sequence, starts): the last epoch's
        self._planned: tuple[tuple, tuple | BlockSequence, np.ndarray | None] | None = None
        self._place = ProcessPlace()  # this process's iteration, or a place loaded for its next

    # -- what the main process controls ------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._shared_epoch.epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next iteration (shard order, shuffle, augmentation).

        A resume point (``resume_at``, or the loader's ``load_state_dict``) survives only if it
        is for this same epoch; one that no iteration has started from yet is not dropped
        silently: another epoch raises :class:`~shardify.errors.ResumeError` naming the saved
        epoch and batches (the epoch after a finished one is allowed). ``clear_resume()`` drops it.
        """
        self._shared_epoch.set_epoch(epoch)

    def resume_at(self, epoch: int, batches: int, *, history: Sequence[Segment] = (), layout: int = LAYOUT) -> None:
        """Make the next iteration of ``epoch`` skip its first ``batches`` batches (not decoded).

        ``history``: the parts of the epoch consumed before on other topologies (their samples
        are left out and the rest is planned anew); ``layout``: the epoch's (see :data:`LAYOUT`).
        """
        self._shared_epoch.resume_at(epoch, batches, history=history, layout=layout)

    def resume_after_end(self, epoch: int) -> None:
        """Make the next iteration ``epoch + 1``'s: ``epoch`` was read to its end (a state saved
        after its last batch, as Lightning does). Its resume point stays, so ``set_epoch(epoch)``
        still asks for its (empty) rest."""
        self._shared_epoch.step_past(epoch)

    def clear_resume(self) -> None:
        self._shared_epoch.clear_resume()

    @property
    def resume_history(self) -> tuple[tuple[Segment, ...], int]:
        """``(segments, layout)`` of the pending resume point (``((), LAYOUT)`` when none)."""
        return self._shared_epoch.resume_history

    @property
    def resume_point(self) -> tuple[int, int] | None:
        """``(epoch, batches)`` the next iteration resumes from, if any."""
        return self._shared_epoch.resume_point

    @property
    def num_samples(self) -> int:
        """Samples in the source (all streams, all ranks)."""
        return self.source.num_samples

    @property
    def samples_per_epoch(self) -> int:
        """Samples of an epoch over all ranks (``samples_per_epoch``, else every sample once)."""
        return self.num_samples if self._counts is None else sum(self._counts)

    @property
    def stream_counts(self) -> tuple[int, ...]:
        """Samples each stream gives an epoch."""
        return self._counts if self._counts is not None else tuple(s.source.num_samples for s in self.streams)  # type: ignore[union-attr]

    @property
    def samples_per_rank(self) -> int:
        """Samples each rank reads per epoch, padding repeats included."""
        _, world = detect_rank_world()
        return samples_per_rank(self.samples_per_epoch, world=world, drop_last=self.options.drop_last)

    def __len__(self) -> int:
        """Batches each rank yields per epoch (the same on every rank)."""
        _, world = detect_rank_world()
        o = self.options
        return batches_per_rank(self.samples_per_epoch, world=world, batch_size=o.batch_size, drop_last=o.drop_last)

    @property
    def plan_options(self) -> PlanOptions:
        """The options of this dataset's plan under the current :data:`LAYOUT`."""
        return self.layout_options(LAYOUT)

    def layout_options(self, layout: int) -> PlanOptions:
        """The options of this dataset's plan under ``layout`` (layouts before 3: no buffer ramp;
        before 4: the buffer simulated in Python)."""
        o = self.options
        return PlanOptions(
            seed=o.seed,
            shuffle=o.shuffle,
            batch_size=o.batch_size,
            drop_last=o.drop_last,
            block=o.shuffle_block,
            buffer=o.shuffle_buffer,
            ramp=layout >= 3,
            vectorised=layout >= 4,
        )

    def epoch_sequence(
        self, epoch: int, *, history: Sequence[Segment] = (), layout: int = LAYOUT
    ) -> tuple | BlockSequence:
        """The epoch's samples in order, after ``history``'s: ``(shard, start, stop)`` ranges, or
        under layout 4 with shuffled blocks (and no history) a :class:`BlockSequence`."""
        return self._sequence(epoch, tuple(history), layout)[0]

    def _sequence(
        self, epoch: int, history: tuple[Segment, ...], layout: int
    ) -> tuple[tuple | BlockSequence, np.ndarray | None]:
        """``(sequence, sequence_starts)`` of an epoch, planned once per process and epoch: a
        process's workers, its next iteration and a resume check reuse them (pure functions)."""
        o = self.options
        key = (epoch, history, layout, o.seed, o.shuffle, o.shuffle_block, o.batch_size, o.drop_last, o.shuffle_buffer)
        if self._planned is None or self._planned[0] != key:
            seq = layout_sequence(
                self._stream_sizes,
                counts=self._counts,
                seed=o.seed,
                epoch=epoch,
                shuffle=o.shuffle,
                block=o.shuffle_block,
                layout=layout,
                blocks=self._blocks,
            )
            if history:
                seq = resumed_sequence(seq, history, self.layout_options(layout), epoch=epoch)
            self._planned = (key, seq, sequence_starts(seq))
        return self._planned[1], self._planned[2]

    @property
    def last_epoch_report(self) -> EpochReport:
        """Samples skipped in the current epoch's last reading on this rank (``on_error="skip"``)."""
        return self._report.read(self.epoch)

    @property
    def shared_report(self) -> SharedReport:
        """Where this rank's processes count the epoch's skipped and CPU-decoded samples."""
        return self._report

    @property
    def stream_samples(self) -> tuple[int, ...]:
        """Samples of each stream's data (one pass), in stream order."""
        return tuple(sum(s) for s in self._stream_sizes)

    def __getstate__(self) -> dict[str, Any]:
        # Pickled only for spawn/forkserver workers: they cannot see the parent's process
        # group, so carry the rank and world detected here (fork workers inherit it).
        state = dict(self.__dict__)
        state["_rank_world"] = detect_rank_world()
        state["_reader"] = None
        state["_planned"] = None  # a spawned worker plans its epoch itself rather than unpickle it
        return state

    # -- one process's place: torchdata's StatefulDataLoader protocol ---------------------------

    def state_dict(self) -> dict[str, Any]:
        """This process's place in its epoch: the batches of its share it has yielded so far.

        torchdata's ``StatefulDataLoader`` calls this in each worker after every batch (in this
        process with ``num_workers=0``) and restores it with :meth:`load_state_dict` in the
        same worker of a new loader: the loader's state then resumes exactly. For
        :func:`~shardify.reader.make_loader`'s loader, save ``loader.state_dict()`` instead.
        """
        place = self._place.saved()
        if place is None:
            world = detect_world(self._rank_world if get_worker_info() is not None else None)
            place = IterPosition(
                epoch=self.epoch, role=world.worker, workers=world.workers, world=world.world, batches=0, layout=LAYOUT
            )
        return make_iter_state(self, place)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make this process's next iteration go on from ``state`` (from :meth:`state_dict`).

        Checked now (seed, plan options, same world and workers); applied by the next
        iteration if it is of the same epoch. If the epoch was set to another one, a state
        that had not finished its share raises there (``set_epoch`` the saved epoch first),
        and a finished one is dropped.
        """
        world = detect_world(self._rank_world if get_worker_info() is not None else None)
        self._place.load(load_iter_state(self, state, world=world.world, workers=world.workers))

    def _take_pending(self, epoch: int, world: World) -> IterPosition | None:
        """The place loaded for this iteration, if any (see :meth:`load_state_dict`)."""
        place = self._place.take()
        if place is None:
            return None
        seq, starts = self._sequence(place.epoch, place.history, place.layout)
        total = plan_worker(
            seq,
            rank=world.rank,
            world=world.world,
            worker=place.role,
            workers=world.workers,
            batch_size=self.options.batch_size,
            drop_last=self.options.drop_last,
            starts=starts,
        ).num_batches
        o = self.options  # batch b of the rank is worker b % workers's: the epoch's last is this role's?
        samples = int(starts[-1]) if starts is not None else sequence_length(seq)  # layout 4 has no starts
        rank_batches = batches_per_rank(samples, world=world.world, batch_size=o.batch_size, drop_last=o.drop_last)
        last = rank_batches > 0 and place.role == (rank_batches - 1) % world.workers
        return loaded_place(place, epoch=epoch, total=total, holds_last=last)

    # -- what runs in each worker --------------------------------------------------------------

    def _shard_reader(self) -> ShardReader:
        pid = os.getpid()
        if self._reader is None or self._reader[0] != pid:  # a forked copy must not share files
            shards = self.source.shards
            self._reader = (
                pid,
                ShardReader(
                    [s.url for s in shards],
                    [s.nsamples for s in shards],
                    skip_damaged=self.options.on_error == "skip",
                    checksums=self._checksums,
                    opener=self._opener,
                    fields=loaded_fields(self._stream_fields),
                    max_member=self.options.max_member_bytes,
                    offsets=[s.offsets for s in shards],
                    filesizes=[s.filesize for s in shards],
                    chunks=[s.chunk for s in shards],
                    ranged=range_fetcher(self._sources),
                ),
            )
        return self._reader[1]

    def __iter__(self) -> Iterator[Any]:
        in_worker = get_worker_info() is not None
        world = detect_world(self._rank_world if in_worker else None)
        epoch, consumed, history, layout = self._shared_epoch.start()
        if not in_worker:
            self.clear_resume()  # in-process: nobody else reads it
        slot = self._report.begin(world.worker, world.workers, in_worker=in_worker, epoch=epoch)
        role, skip = resumed_role(world.worker, workers=world.workers, consumed=consumed)
        loaded = self._take_pending(epoch, world)
        if loaded is not None:
            role, skip, history, layout = loaded.role, loaded.batches, loaded.history, loaded.layout
        pool = self.batch_slots.pool(world.worker) if in_worker else None
        self._place.position = IterPosition(
            epoch=epoch,
            role=role,
            workers=world.workers,
            world=world.world,
            batches=skip,
            history=history,
            layout=layout,
        )
        return self._run(
            World(world.rank, world.world, role, world.workers),
            slot,
            position=self._place.position,
            log_report=not in_worker,
            pool=pool,
        )

    def _run(
        self, world: World, slot: int, *, position: IterPosition, log_report: bool, pool: SlotPool | None
    ) -> Iterator[Any]:
        """The batches of ``world.worker``'s share (its plan role) from ``position``, counted there."""
        o = self.options
        epoch, skip, history, layout = position.epoch, position.batches, position.history, position.layout
        seq, starts = self._sequence(epoch, history, layout)
        plan = plan_worker(
            seq,
            rank=world.rank,
            world=world.world,
            worker=world.worker,
            workers=world.workers,
            batch_size=o.batch_size,
            drop_last=o.drop_last,
            starts=starts,
        )
        sizes = plan.batch_sizes()[skip:]
        if not sizes:
            return
        read, out = share_order(
            plan, self.layout_options(layout), epoch=epoch, rank=world.rank, worker=world.worker, segment=len(history)
        )
        # the batch tensors made in the worker's shared-memory slots (no copy on the way out), if it has them
        collate = self.decode_strategy.collate(o, empty=pool.empty if pool is not None else private_empty)
        tag = None
        if self._tag_stream or o.mark_repeats:
            tag = functools.partial(
                tag_samples,
                plan=plan,
                streams=self._stream_sizes if self._tag_stream else None,
                mark_repeats=o.mark_repeats,
            )
        processors = self.decode_strategy.processors(self.streams, self._stream_fields, o, epoch=epoch)
        reader = self._shard_reader()
        try:
            batches: Iterator[Any] = share_batches(
                reader,
                plan,
                read=read,
                out=out,
                sizes=sizes,
                skip=skip,
                options=o,
                epoch=epoch,
                rank=world.rank,
                worker=world.worker,
                processors=processors,
                collate=collate,
                on_bad=functools.partial(self._report.record_bad, slot),
                tag=tag,
            )
            if pool is not None:  # in a worker under make_loader: batches travel in recycled shared memory
                batches = Transport(batches, pool)
            for batch in self._report.stages.timed(slot, batches):
                position.batches += 1  # before the yield: a state taken after next() counts this batch
                yield batch
        finally:
            reader.close()
        if log_report:
            self._report.warn(self.epoch)
