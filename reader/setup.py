"""What a ``ShardedDataset`` is built from: its streams resolved, and what the plan and the
workers need of them and of its options, derived once.

:func:`opened_streams` resolves the source into streams (remote fetch options from
``CacheOptions``, checksums given with ``DecodeOptions(verify=...)``); :meth:`ReadSetup.of` derives
the rest: the mixed source, each stream's output fields, the epoch plan's inputs
(:class:`~shardify.reader.plan.epoch.EpochInputs`) and what a state must match to resume
(:class:`~shardify.reader.delivery.state.ResumeBasis`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, cast

from shardify.reader.delivery.state import ResumeBasis
from shardify.reader.io.checksums import source_checksums, with_checksums
from shardify.reader.io.sources import Source, SourceLike
from shardify.reader.options import ReadOptions
from shardify.reader.plan.epoch import EpochInputs
from shardify.reader.sample.fields import stream_fields
from shardify.reader.streams import MixedOpener, Stream, epoch_counts, mixed_source, resolve_streams

__all__ = ["opened_streams", "ReadSetup"]


def opened_streams(
    source: SourceLike | Source | Stream | Sequence[Stream], *, split: str | None, options: ReadOptions
) -> tuple[Stream, ...]:
    """The streams of ``source``, each with its resolved :class:`Source` (fetched as ``options.cache``
    says; with the checksums ``options.decoding.verify`` gives, when it gives them)."""
    where, decoding = options.cache, options.decoding
    streams = resolve_streams(
        source,
        split=split,
        cache_dir=where.dir,
        cache_limit_bytes=where.limit_bytes,
        skip_unreadable=decoding.on_error == "skip",
        remote={
            "allow_locations": where.allow_locations,
            "ranged": where.ranged,
            "requests": where.requests,
            "retry": where.retry,
        },
    )
    verify = decoding.verify
    if verify is not False and verify is not True:
        streams = tuple(
            dataclasses.replace(st, source=with_checksums(cast(Source, st.source), verify)) for st in streams
        )
    return tuple(streams)


@dataclass(frozen=True)
class ReadSetup:
    """What the plan and the workers need of a dataset's options and streams, derived once."""

    options: ReadOptions
    streams: tuple[Stream, ...]
    sources: tuple[Source, ...]
    source: Source
    """The streams' shards as one source (the dataset's shard numbering)."""
    counts: tuple[int, ...] | None
    """Samples each stream gives an epoch; None: each sample once."""
    stream_fields: tuple[tuple[str, ...], ...]
    tag_stream: bool
    """Each sample says its stream (``__stream__``): several streams, or an output that asks."""
    checksums: Any
    epoch_inputs: EpochInputs
    resume_basis: ResumeBasis

    @property
    def opener(self) -> Callable[[str], tuple[BinaryIO, bool]]:
        """Opens a shard through the source it belongs to."""
        return MixedOpener(self.sources) if len(self.sources) > 1 else self.source.open_tar

    @classmethod
    def of(cls, options: ReadOptions, streams: Sequence[Stream]) -> ReadSetup:
        o, sampling, batching = options, options.sampling, options.batching
        sources = tuple(cast(Source, s.source) for s in streams)  # resolved by now
        source = mixed_source(sources)
        counts = epoch_counts(streams, samples_per_epoch=sampling.samples_per_epoch)
        columns = tuple(stream_fields(s, fields=o.fields, map=o.map) for s in streams)
        wanted = {f for fields in columns for f in fields}
        if "__valid__" in wanted and not sampling.mark_repeats:
            raise ValueError("fields=... names '__valid__': pass sampling=SamplingOptions(mark_repeats=True)")
        inputs = EpochInputs(
            seed=o.seed,
            shuffle=o.shuffle,
            batch_size=o.batch_size,
            drop_last=batching.drop_last,
            block=sampling.shuffle_block,
            buffer=sampling.shuffle_buffer,
            stream_sizes=tuple(tuple(s.sizes) for s in sources),
            counts=counts,
            # a compressed shard cannot seek: read in cross-rank blocks it would be inflated from
            # its start once per block, so datasets with such shards keep whole shards. (A property
            # of the format, not of where shards live: the same dataset reads alike locally and remotely.)
            blocks=not source.has_gzip,
        )
        return cls(
            options=o,
            streams=tuple(streams),
            sources=sources,
            source=source,
            counts=counts,
            stream_fields=columns,
            tag_stream=len(sources) > 1
            or "__stream__" in wanted
            or o.map is not None
            or any(s.map is not None for s in streams),
            checksums=source_checksums(source) if o.decoding.verify is not False else None,
            epoch_inputs=inputs,
            resume_basis=ResumeBasis.of(
                inputs, sources, bucketed=batching.bucket_length is not None, bucket_buffer=batching.bucket_buffer
            ),
        )
