"""``ShardedDataset``: an IterableDataset that yields whole batches, exactly once per epoch.

``source``: a shardify dataset directory, its ``manifest.json`` or a split index, or tar shards
without a manifest (a list or a ``{000..099}`` pattern; ``.tar``, ``.tar.gz``, ``.tgz``), which
are counted once here. ``split``: needed when the dataset has several. Any of these may be a
URL (``http(s)://`` or an fsspec URL): remote shards are downloaded (streamed, retried, resumed
with HTTP Range) into ``cache=CacheOptions(dir=...)`` (shared safely by workers and ranks,
LRU-evicted under its ``limit_bytes``), or without it into a small per-process temporary
folder; for training on remote data, give a cache directory.

Output: ``fields`` (checked against the split index, if any, when the dataset is built; default
``("image", "cls")``, or the split's tensor field and ``cls`` when it has no images:
:mod:`~shardify.reader.sample.fields`) gives one column per entry (an extension, ``"a;b"``
alternatives, or ``"image"`` for any image extension); image fields go through ``transform``
(uint8 CHW), others are decoded by extension. Or ``map(sample_dict)`` builds the output (see
:class:`~shardify.reader.sample.processor.SampleProcessor`). ``__stream__`` (the stream's index),
``__key__`` and, with ``mark_repeats``, ``__valid__`` are there too. ``shuffle``/``seed``: the
seeded shuffle; ``seed`` also seeds augmentation.

The other options come in four groups (:mod:`shardify.reader.options`; each defaults to its
class's defaults): ``batching`` (:class:`BatchOptions`: ``collate_fn``, length bucketing,
``drop_last``), ``sampling`` (:class:`SamplingOptions`: ``samples_per_epoch``, ``mark_repeats``,
the shuffle's buffer and block sizes), ``decoding`` (:class:`DecodeOptions`: ``allow_pickle``,
``max_member_bytes``, ``device``; ``on_error="skip"``, see :attr:`last_epoch_report`;
``verify``, checksums from the split index or given, see :mod:`shardify.reader.io.checksums`)
and ``cache`` (:class:`CacheOptions`). Only the fields the output needs are read from a shard
(all of them with ``map``); an image over ``PIL.Image.MAX_IMAGE_PIXELS`` pixels is a bad sample
(see docs/reliability.md).

Several sources: ``source`` as a list of :class:`Stream` (each with its ``weight``, ``split``,
``transform``, ``map``, ``fields``: the per-sample keywords above, per stream); batches mix
them, ``sampling.samples_per_epoch`` split between the streams by weight.

``decoding=DecodeOptions(device="cuda")``: workers only read the bytes and draw each image's
crop and flip (the same draws as on the CPU); ``make_loader`` decodes the batch there with
nvJPEG and crops, resizes, flips and normalises it in batched calls (images the workers cannot
send as baseline JPEGs are decoded in the workers, counted in :attr:`last_epoch_report`). Needs
a crop transform (optionally followed by ``RandomHorizontalFlip``) and ``shardify[gpu]``; ``map=``,
a custom ``collate_fn=`` and ``bucket_length=`` are refused there. ``decoder="nvimgcodec"``
decodes with nvImageCodec (hardware engines, then CUDA, then the CPU, only each crop's region);
``worker_share=`` has the workers decode a share of each batch themselves. See
:mod:`shardify.reader.sample.decoders`.

How it runs: the main process owns a few shared-memory cells (epoch and resume point:
:mod:`shardify.reader.delivery.shared_epoch`; skip report: :mod:`shardify.reader.delivery.report`)
created with the dataset, so ``set_epoch`` and resuming reach persistent DataLoader workers,
which hold a copy of the dataset. Each worker reads the cells when its iteration starts, plans
its share (:class:`~shardify.reader.plan.epoch.EpochPlan`, a pure value) and runs its stages
(:mod:`shardify.reader.worker`, :mod:`shardify.reader.stages`); under make_loader, a persistent
worker makes the next epoch's first batch as its share of an epoch ends
(:mod:`shardify.reader.delivery.ahead`). The epoch's sequence mixes blocks
of every stream and shard (:mod:`shardify.reader.plan.mix`); a worker gets whole batches of its
rank's slice of it (batch ``b`` to worker ``b % workers``) and shuffles the samples of all its
batches together, before batching, with a buffer of encoded samples. So a batch holds samples
of the worker's share only, each sample still appears exactly once, and DataLoader's
round-robin fetch keeps the rank's batch count and order. A resume on another topology plans
what is left of the epoch (:mod:`shardify.reader.plan.resume`). ``state_dict``/``load_state_dict``
save and restore one process's place in its share: the protocol of torchdata's
``StatefulDataLoader`` (:mod:`shardify.reader.delivery.place`, :mod:`shardify.reader.delivery.state`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from shardify.reader.delivery.ahead import EpochAhead
from shardify.reader.delivery.batchpool import SlotPool, WorkerSlots, unsend
from shardify.reader.delivery.place import ProcessPlace, require_state
from shardify.reader.delivery.report import EpochReport, SharedReport
from shardify.reader.delivery.shared_epoch import MAX_SEGMENTS, EpochControl, SharedEpoch
from shardify.reader.delivery.state import IterPosition
from shardify.reader.io.sources import Source, SourceLike
from shardify.reader.options import (
    BatchOptions,
    CacheOptions,
    DecodeOptions,
    ReadOptions,
    SamplingOptions,
    with_defaults,
)
from shardify.reader.plan.assign import batches_per_rank, resumed_role, samples_per_rank
from shardify.reader.plan.blocks import BlockSequence
from shardify.reader.plan.epoch import EpochPlan
from shardify.reader.plan.resume import PLAN_VERSION, PlanOptions, Segment
from shardify.reader.plan.world import World, detect_rank_world, detect_world
from shardify.reader.sample.decoders import Decoding, choose_decoding
from shardify.reader.setup import ReadSetup, opened_streams
from shardify.reader.streams import Stream
from shardify.reader.worker import ProcessReader, share_batches, share_chain
from shardify.suggest import suggest_keywords

__all__ = ["ReadOptions", "ShardedDataset", "Stream", "PLAN_VERSION", "MAX_SEGMENTS"]


@suggest_keywords
class ShardedDataset(EpochControl, IterableDataset[Any]):
    """Batches of a sharded dataset for this rank, the same number on every rank (the keywords:
    :mod:`shardify.reader.dataset`)."""

    def __init__(
        self,
        source: SourceLike | Source | Stream | Sequence[Stream],
        *,
        split: str | None = None,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        transform: Callable[..., Any] | None = None,
        fields: Sequence[str] | None = None,
        map: Callable[[dict[str, Any]], Any] | None = None,
        batching: BatchOptions | None = None,
        sampling: SamplingOptions | None = None,
        decoding: DecodeOptions | None = None,
        cache: CacheOptions | None = None,
    ) -> None:
        super().__init__()
        groups = with_defaults(dict(batching=batching, sampling=sampling, decoding=decoding, cache=cache))
        columns = (fields,) if isinstance(fields, str) else (tuple(fields) if fields is not None else None)
        self.options = ReadOptions(
            batch_size=batch_size, shuffle=shuffle, seed=seed, transform=transform, fields=columns, map=map, **groups
        )
        self.streams = opened_streams(source, split=split, options=self.options)
        # where images are decoded, chosen once: in the workers, or prepared there and decoded by make_loader
        self.decode_strategy: Decoding = choose_decoding(self.options, self.streams)
        self.decode_device: torch.device | None = self.decode_strategy.device
        self._setup = setup = ReadSetup.of(self.options, self.streams)
        self.source, self.epoch_inputs, self.resume_basis = setup.source, setup.epoch_inputs, setup.resume_basis
        self._shared_epoch = SharedEpoch()  # the epoch and resume point, seen by persistent workers
        self._report = SharedReport()
        self._rank_world: tuple[int, int] | None = None
        self._readers = ProcessReader()
        self.batch_slots = WorkerSlots()  # make_loader's Loader attaches its channel while workers start
        self._place = ProcessPlace()  # this process's iteration, or a place loaded for its next
        self.epoch_ahead = EpochAhead()  # make_loader enables it for persistent workers

    # -- sizes and the plan --------------------------------------------------------------------

    @property
    def num_samples(self) -> int:
        """Samples in the source (all streams, all ranks)."""
        return self.source.num_samples

    @property
    def samples_per_epoch(self) -> int:
        """Samples of an epoch over all ranks (``samples_per_epoch``, else every sample once)."""
        return self.epoch_inputs.samples_per_epoch

    @property
    def stream_counts(self) -> tuple[int, ...]:
        """Samples each stream gives an epoch."""
        return self.resume_basis.stream_counts

    @property
    def stream_samples(self) -> tuple[int, ...]:
        """Samples of each stream's data (one pass), in stream order."""
        return self.resume_basis.stream_samples

    @property
    def samples_per_rank(self) -> int:
        """Samples each rank reads per epoch, padding repeats included."""
        return samples_per_rank(
            self.samples_per_epoch, world=detect_rank_world()[1], drop_last=self.options.batching.drop_last
        )

    def __len__(self) -> int:
        """Batches each rank yields per epoch (the same on every rank)."""
        o = self.options
        return batches_per_rank(
            self.samples_per_epoch,
            world=detect_rank_world()[1],
            batch_size=o.batch_size,
            drop_last=o.batching.drop_last,
        )

    @property
    def plan_options(self) -> PlanOptions:
        """The options of this dataset's plan (:data:`PLAN_VERSION`)."""
        return self.epoch_inputs.plan_options()

    def epoch_sequence(self, epoch: int, *, history: Sequence[Segment] = ()) -> tuple[Any, ...] | BlockSequence:
        """The epoch's samples in order, after ``history``'s: ``(shard, start, stop)`` ranges, or
        with shuffled blocks (and no history) a :class:`BlockSequence`."""
        return self.epoch_inputs.sequence(epoch, history)[0]

    @property
    def last_epoch_report(self) -> EpochReport:
        """Samples skipped in the current epoch's last reading on this rank (``on_error="skip"``),
        and with ``device``, how its images were decoded (``decoded_by``)."""
        report = self._report.read(self.epoch)
        tally = getattr(self.decode_strategy, "tally", None)
        if tally is not None and tally.epoch == self.epoch:
            report = dataclasses.replace(report, decoded_by=tuple(sorted(tally.read().items())))
        return report

    @property
    def shared_report(self) -> SharedReport:
        """Where this rank's processes count the epoch's skipped and CPU-decoded samples."""
        return self._report

    def __getstate__(self) -> dict[str, Any]:
        # Pickled only for spawn/forkserver workers: they cannot see the parent's process
        # group, so carry the rank and world detected here (fork workers inherit it).
        return {**self.__dict__, "_rank_world": detect_rank_world()}

    # -- one process's place: torchdata's StatefulDataLoader protocol (delivery/place.py) --------

    def _world(self) -> World:
        return detect_world(self._rank_world if get_worker_info() is not None else None)

    def state_dict(self) -> dict[str, Any]:
        """This process's place in its epoch: the batches of its share it has yielded so far."""
        return self._place.state_dict(self.resume_basis, epoch=self.epoch, world=self._world())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make this process's next iteration go on from ``state`` (checked now; anything but a
        state, such as None, is refused with ResumeError)."""
        require_state(state, owner="dataset")
        self._place.load_state_dict(self.resume_basis, state, world=self._world())

    # -- what runs in each worker (reader/worker.py) ---------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        in_worker = get_worker_info() is not None
        world = self._world()
        epoch, consumed, history = self._shared_epoch.start()
        if not in_worker:
            self.clear_resume()  # in-process: nobody else reads it
        slot = self._report.begin(world.worker, world.workers, in_worker=in_worker, epoch=epoch)
        position, plan = self._place.begin(
            self.epoch_inputs, world=world, epoch=epoch, consumed=consumed, history=history
        )
        pool = self.batch_slots.pool(world.worker) if in_worker else None  # under make_loader: shared memory
        release = functools.partial(unsend, pool)
        end: Callable[[EpochPlan], None] | None = None
        made = None
        if not in_worker:
            end = lambda _: self._report.warn(self.epoch)  # noqa: E731
        elif self.epoch_ahead.enabled:  # a persistent worker: the next epoch's first batch, made ahead
            made = self.epoch_ahead.take(position, release)
            end = functools.partial(self._make_ahead, world, pool)
        return share_batches(
            plan,
            position,
            setup=self._setup,
            readers=self._readers,
            decoding=self.decode_strategy,
            slots=pool,
            report=self._report,
            slot=slot,
            on_end=end,
            made=made,
        )

    def _make_ahead(self, world: World, pool: SlotPool | None, plan: EpochPlan) -> None:
        """Once this worker's share of ``plan``'s epoch is done: make the next epoch's first batch
        (:mod:`shardify.reader.delivery.ahead`), for the place the next iteration is likely to have."""
        epoch = self.epoch_ahead.next_epoch(plan.epoch)
        role, skip = resumed_role(world.worker, workers=world.workers, consumed=0)
        place = IterPosition(epoch=epoch, role=role, workers=world.workers, world=world.world, batches=skip)
        ranks = dict(rank=world.rank, world=world.world, workers=world.workers)
        make_plan = functools.partial(self.epoch_inputs.worker, epoch, worker=role, history=(), **ranks)
        release = functools.partial(unsend, pool)
        chain = functools.partial(
            share_chain, skip=skip, setup=self._setup, readers=self._readers, decoding=self.decode_strategy, slots=pool
        )
        self.epoch_ahead.start(place, make_plan, lambda p, on_bad: chain(p, on_bad=on_bad), release)
