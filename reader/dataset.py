"""``ShardedDataset``: an IterableDataset that yields whole batches, exactly once per epoch.

The main process owns a few shared-memory cells (epoch, resume point, skip report) created
here, so ``set_epoch`` and resuming reach persistent DataLoader workers, which hold a copy of
the dataset. Each worker reads the cells when its iteration starts and runs the pure plan
(:mod:`shardify.reader.plan.assign`) for its (rank, worker); see :mod:`shardify.reader.sample.pipeline`.

Shuffle and batching: a worker gets whole batches of its rank (batch ``b`` to worker
``b % workers``), and shuffles the samples of all its batches together, before batching,
with a buffer of encoded samples. So a batch holds samples of the worker's share only, each
sample still appears exactly once, and DataLoader's round-robin fetch keeps the rank's batch
count and order.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.utils.data import IterableDataset, get_worker_info

from shardify.reader.plan.assign import batches_per_rank, plan_worker, resumed_role, samples_per_rank
from shardify.reader.delivery.batchpool import BatchChannel, SlotPool
from shardify.reader.sample.fields import output_fields
from shardify.reader.sample.pipeline import Bad, SampleProcessor, batches, bucketed, cut, read_positions, selected_fields
from shardify.reader.delivery.report import EpochReport, SharedReport
from shardify.reader.plan.shuffle import derive_seed, reorder, stream_rng, worker_order
from shardify.reader.io.checksums import ChecksumSpec, with_checksums
from shardify.reader.io.sources import Source, SourceLike, resolve_source
from shardify.reader.io.stream import ShardReader
from shardify.reader.plan.world import World, detect_rank_world, detect_world
from shardify.tario import DEFAULT_MAX_MEMBER

__all__ = ["ReadOptions", "ShardedDataset"]

log = logging.getLogger("shardify.reader")

_EPOCH, _RESUME_EPOCH, _RESUME_BATCHES = range(3)


@dataclass(frozen=True)
class ReadOptions:
    """Every option of a :class:`ShardedDataset` (see its docstring); picklable to workers."""

    batch_size: int
    shuffle: bool = False
    seed: int = 0
    drop_last: bool = False
    transform: Callable[..., Any] | None = None
    fields: tuple[str, ...] | None = None
    map: Callable[[dict[str, Any]], Any] | None = None
    collate_fn: Callable[[list[Any]], Any] | None = None
    shuffle_buffer: int = 1024
    shuffle_block: int = 64
    bucket_length: Callable[[Any], int] | None = None
    bucket_buffer: int | None = None
    on_error: Literal["raise", "skip"] = "raise"
    allow_pickle: bool = False
    verify: bool = False
    max_member_bytes: int = DEFAULT_MAX_MEMBER

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"{self.batch_size=} should be >= 1")
        if self.shuffle_buffer < 1 or self.shuffle_block < 1:
            raise ValueError(f"{self.shuffle_buffer=} and {self.shuffle_block=} should be >= 1")
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"{self.on_error=} should be 'raise' or 'skip'")
        if self.fields is not None and self.map is not None:
            raise ValueError("pass fields=... or map=..., not both")
        if self.max_member_bytes < 0:
            raise ValueError(f"{self.max_member_bytes=} should be >= 0")


def _checksums(source: Source) -> tuple[str, ...]:
    """Each shard's SHA-256 from the split index, for ``verify=True``."""
    missing = [s.url for s in source.shards if not s.sha256]
    if missing:
        raise ValueError(
            f"verify=True needs each shard's sha256 from a split index, and {missing[0]} has none "
            f"({len(missing)} of {len(source.shards)} shards; shards given as a list or pattern have no manifest: "
            "pass verify={shard: sha256} or verify='SHA256SUMS', a sha256sum file)")
    return tuple(s.sha256 for s in source.shards)


class ShardedDataset(IterableDataset):
    """Batches of a sharded dataset for this rank, the same number on every rank.

    ``source``: a shardify dataset directory, its ``manifest.json`` or a split index, or tar
    shards without a manifest (a list or a ``{000..099}`` pattern; ``.tar``, ``.tar.gz``,
    ``.tgz``), which are counted once here. ``split``: needed when the dataset has several.
    Any of these may be a URL (``http(s)://`` or an fsspec URL): remote shards are downloaded
    (streamed, retried, resumed with HTTP Range) into ``cache_dir`` (shared safely by workers
    and ranks, LRU-evicted under ``cache_limit_bytes``), or without it into a small
    per-process temporary folder; for training on remote data, give a ``cache_dir``.

    Output: ``fields`` (checked against the split index, if any, when the dataset is built;
    default ``("image", "cls")``, or the split's tensor field and ``cls`` when it has no
    images: :mod:`~shardify.reader.sample.fields`) gives one column per entry (an
    extension, ``"a;b"`` alternatives, or ``"image"`` for any image extension); image fields
    go through ``transform`` (uint8 CHW), others are decoded by extension. Or ``map(sample_dict)`` builds the output (see
    :class:`~shardify.reader.sample.pipeline.SampleProcessor`). ``collate_fn`` (default
    ``default_collate``) makes the batch. ``on_error="skip"`` skips bad samples and samples of
    damaged shards, repeating good samples of the same batch in their place; see
    :attr:`last_epoch_report`. Pickle fields load only with ``allow_pickle=True``.
    ``verify=True`` checks each shard's SHA-256 against the split index before its samples are
    used (once per shard and process); a mismatch raises naming the shard, or under
    ``on_error="skip"`` every sample of the shard is skipped and counted. Shards without a
    split index (a list, a pattern) take their checksums from ``verify={shard: sha256}`` or
    ``verify="SHA256SUMS"`` (a ``sha256sum`` file, path or URL; see
    :mod:`shardify.reader.io.checksums`), checked the same way.
    ``shuffle_buffer`` encoded samples per worker; ``shuffle_block`` samples read per seek.
    Only the fields the output needs are read from a shard (all of them with ``map``); a shard
    holding a member over ``max_member_bytes`` (default 2 GiB) is damaged, and an image over
    ``PIL.Image.MAX_IMAGE_PIXELS`` pixels is a bad sample (see docs/reliability.md).
    ``bucket_length(output) -> int`` groups samples of similar length into batches, within
    ``bucket_buffer`` samples (default 16 batches); a resume then decodes the skipped part again.
    """

    def __init__(
        self,
        source: SourceLike | Source,
        *,
        split: str | None = None,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        transform: Callable[..., Any] | None = None,
        drop_last: bool = False,
        fields: Sequence[str] | None = None,
        map: Callable[[dict[str, Any]], Any] | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        shuffle_buffer: int = 1024,
        shuffle_block: int = 64,
        bucket_length: Callable[[Any], int] | None = None,
        bucket_buffer: int | None = None,
        on_error: Literal["raise", "skip"] = "raise",
        allow_pickle: bool = False,
        verify: bool | ChecksumSpec = False,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit_bytes: int | None = None,
        max_member_bytes: int = DEFAULT_MAX_MEMBER,
    ) -> None:
        super().__init__()
        self.options = ReadOptions(
            batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
            transform=transform, fields=(fields,) if isinstance(fields, str) else (
                tuple(fields) if fields is not None else None), map=map,
            collate_fn=collate_fn, shuffle_buffer=shuffle_buffer, shuffle_block=shuffle_block,
            bucket_length=bucket_length, bucket_buffer=bucket_buffer, on_error=on_error,
            allow_pickle=allow_pickle, verify=verify is not False, max_member_bytes=max_member_bytes)
        if isinstance(source, Source):
            self.source = source
        else:
            self.source = resolve_source(source, split=split, cache_dir=cache_dir, cache_limit_bytes=cache_limit_bytes,
                                         skip_unreadable=on_error == "skip")
        if verify is not False and verify is not True:
            self.source = with_checksums(self.source, verify)
        self._checksums = _checksums(self.source) if verify is not False else None
        self._output_fields = () if map is not None else output_fields(
            self.options.fields, self.source.fields, where=f"{self.source.name} split {self.source.split!r}")
        self._state = torch.tensor([0, -1, 0], dtype=torch.int64).share_memory_()
        self._report = SharedReport()
        self._rank_world: tuple[int, int] | None = None
        self._reader: tuple[int, ShardReader] | None = None
        self._channel: BatchChannel | None = None  # set by make_loader's Loader while it starts workers
        self._pool: tuple[int, SlotPool] | None = None

    # -- what the main process controls ------------------------------------------------------

    @property
    def epoch(self) -> int:
        return int(self._state[_EPOCH])

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next iteration (shard order, shuffle, augmentation).

        A pending resume point (``resume_at``) survives only if it is for this same epoch.
        """
        if epoch < 0:
            raise ValueError(f"{epoch=} should be >= 0")
        if int(self._state[_RESUME_EPOCH]) != epoch:
            self.clear_resume()
        self._state[_EPOCH] = epoch

    def resume_at(self, epoch: int, batches: int) -> None:
        """Make the next iteration of ``epoch`` skip its first ``batches`` batches (not decoded)."""
        if epoch < 0 or batches < 0:
            raise ValueError(f"{epoch=} and {batches=} should be >= 0")
        self._state[_EPOCH] = epoch
        self._state[_RESUME_EPOCH] = epoch
        self._state[_RESUME_BATCHES] = batches

    def clear_resume(self) -> None:
        self._state[_RESUME_EPOCH] = -1
        self._state[_RESUME_BATCHES] = 0

    @property
    def resume_point(self) -> tuple[int, int] | None:
        """``(epoch, batches)`` the next iteration resumes from, if any."""
        e = int(self._state[_RESUME_EPOCH])
        return None if e < 0 else (e, int(self._state[_RESUME_BATCHES]))

    @property
    def num_samples(self) -> int:
        """Samples in the source (all ranks)."""
        return self.source.num_samples

    @property
    def samples_per_rank(self) -> int:
        """Samples each rank reads per epoch, padding repeats included."""
        _, world = detect_rank_world()
        return samples_per_rank(self.num_samples, world=world, drop_last=self.options.drop_last)

    def __len__(self) -> int:
        """Batches each rank yields per epoch (the same on every rank)."""
        _, world = detect_rank_world()
        o = self.options
        return batches_per_rank(self.num_samples, world=world, batch_size=o.batch_size, drop_last=o.drop_last)

    @property
    def last_epoch_report(self) -> EpochReport:
        """Samples skipped in the current epoch's last reading on this rank (``on_error="skip"``)."""
        return self._report.read(self.epoch)

    def __getstate__(self) -> dict[str, Any]:
        # Pickled only for spawn/forkserver workers: they cannot see the parent's process
        # group, so carry the rank and world detected here (fork workers inherit it).
        state = dict(self.__dict__)
        state["_rank_world"] = detect_rank_world()
        state["_reader"] = None
        state["_pool"] = None
        return state

    # -- what runs in each worker --------------------------------------------------------------

    def _shard_reader(self) -> ShardReader:
        pid = os.getpid()
        if self._reader is None or self._reader[0] != pid:  # a forked copy must not share files
            shards = self.source.shards
            self._reader = (pid, ShardReader([s.url for s in shards], [s.nsamples for s in shards],
                                             skip_damaged=self.options.on_error == "skip",
                                             checksums=self._checksums, opener=self.source.open_tar,
                                             fields=None if self.options.map is not None else
                                             selected_fields(self._output_fields),
                                             max_member=self.options.max_member_bytes))
        return self._reader[1]

    def _slot_pool(self, worker: int) -> SlotPool | None:
        """This worker process's batch pool, when a Loader gave the workers a channel."""
        if self._channel is None or worker >= self._channel.tokens.shape[0]:
            return None
        pid = os.getpid()
        if self._pool is None or self._pool[0] != pid:
            self._pool = (pid, SlotPool(self._channel, worker))
        return self._pool[1]

    def __iter__(self) -> Iterator[Any]:
        in_worker = get_worker_info() is not None
        world = detect_world(self._rank_world if in_worker else None)
        epoch = int(self._state[_EPOCH])
        consumed = int(self._state[_RESUME_BATCHES]) if int(self._state[_RESUME_EPOCH]) == epoch else 0
        if not in_worker:
            self.clear_resume()  # in-process: nobody else reads it
        slot = SharedReport.slot(world.worker, world.workers, in_worker=in_worker)
        self._report.start(slot, epoch=epoch, workers=world.workers if in_worker else 0)
        role, skip = resumed_role(world.worker, workers=world.workers, consumed=consumed)
        plan_world = World(world.rank, world.world, role, world.workers)
        pool = self._slot_pool(world.worker) if in_worker else None
        return self._run(plan_world, epoch, skip, slot, log_report=not in_worker, pool=pool)

    def _run(self, world: World, epoch: int, skip: int, slot: int, *, log_report: bool,
             pool: SlotPool | None) -> Iterator[Any]:
        o = self.options
        plan = plan_worker(self.source.sizes, seed=o.seed, epoch=epoch, shuffle=o.shuffle,
                           rank=world.rank, world=world.world, worker=world.worker,
                           workers=world.workers, batch_size=o.batch_size, drop_last=o.drop_last)
        sizes = plan.batch_sizes()[skip:]
        if not sizes:
            return
        rng = stream_rng(o.seed, epoch, world.rank, world.worker) if o.shuffle else None
        read, out = worker_order(plan.num_samples, rng=rng, block=o.shuffle_block, buffer_size=o.shuffle_buffer)
        # Bucketing groups by decoded length, so a resume replays the worker's share from its start.
        done = 0 if o.bucket_length is not None else min(skip * o.batch_size, len(out))
        mask = None
        if done:
            mask = bytearray(len(out))
            for p in out[:done]:
                mask[p] = 1
        process = SampleProcessor(seed=o.seed, epoch=epoch, transform=o.transform, fields=self._output_fields,
                                  map=o.map, allow_pickle=o.allow_pickle, skip_errors=o.on_error == "skip",
                                  unique_keys=self.source.unique_keys)
        collate = o.collate_fn
        if collate is None:
            from shardify.reader.sample.collate import default_collate as collate
        if pool is not None:
            collate = functools.partial(pool.collate, collate)

        def on_bad(bad: Bad) -> None:
            self._report.record(slot, shard=bad.shard, key=bad.key, reason=bad.reason, lost=bad.lost)

        reader = self._shard_reader()
        try:
            outputs = map(process, reorder(read_positions(reader, plan.ranges, read, mask), out[done:]))
            if o.bucket_length is None:
                groups: Iterator[list[Any]] = cut(outputs, sizes)
            else:
                groups = bucketed(outputs, batch_size=o.batch_size, length=o.bucket_length,
                                  buffer_size=o.bucket_buffer or 16 * o.batch_size,
                                  rng=random.Random(derive_seed("bucket", o.seed, epoch, world.rank, world.worker)))
                groups = itertools.islice(groups, skip, None)
            yield from batches(groups, collate=collate, on_bad=on_bad)
        finally:
            reader.close()
        if log_report:
            report = self.last_epoch_report
            if report:
                log.warning("%s", report)
