"""``Stream``: one source of a mixed dataset, with its weight and its own per-sample options.

``ShardedDataset([Stream("out/web", weight=3), Stream("out/books", weight=1)], ...)`` mixes
sources; the per-source options (``split``, ``weight``, ``transform``, ``map``, ``fields``)
live here rather than on the dataset. How an epoch draws from each stream is
:mod:`shardify.reader.plan.mix`.
"""

from __future__ import annotations

import array
import dataclasses
import itertools
import os
from bisect import bisect_right
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any, BinaryIO, cast

from shardify.reader.io.shardlist import ChainedShards
from shardify.reader.io.sources import Source, SourceLike, resolve_source
from shardify.reader.io.stream import Item
from shardify.reader.plan.assign import WorkerPlan
from shardify.reader.plan.mix import stream_counts

__all__ = [
    "Stream",
    "resolve_streams",
    "mixed_source",
    "MixedOpener",
    "stream_weights",
    "epoch_counts",
    "tag_samples",
    "sample_tagger",
]


@dataclass(frozen=True)
class Stream:
    """One source of a :class:`~shardify.reader.ShardedDataset` and its options.

    ``source``/``split``: as for the dataset. ``weight``: its share of each epoch's
    ``SamplingOptions.samples_per_epoch`` (give every stream a weight, or none: then shares
    follow sizes). ``transform``, ``map``, ``fields``: the dataset's per-sample keywords under
    the same names, replacing the dataset's for this stream's samples. The option groups
    (:mod:`shardify.reader.options`) are the dataset's, shared by all streams.
    """

    source: SourceLike | Source
    _: KW_ONLY
    split: str | None = None
    weight: float | None = None
    transform: Callable[..., Any] | None = None
    map: Callable[[dict[str, Any]], Any] | None = None
    fields: Sequence[str] | None = None

    def __post_init__(self) -> None:
        if self.weight is not None and not self.weight > 0:
            raise ValueError(f"Stream({self.source!r}): {self.weight=} should be > 0")
        if self.fields is not None and self.map is not None:
            raise ValueError(f"Stream({self.source!r}): pass fields=... or map=..., not both")
        if isinstance(self.fields, str):
            object.__setattr__(self, "fields", (self.fields,))
        elif self.fields is not None:
            object.__setattr__(self, "fields", tuple(self.fields))


def resolve_streams(
    source: Any,
    *,
    split: str | None,
    cache_dir: str | os.PathLike[str] | None,
    cache_limit_bytes: int | None,
    skip_unreadable: bool = False,
    remote: Mapping[str, Any] | None = None,
) -> tuple[Stream, ...]:
    """The dataset's ``source`` argument as streams whose ``source`` is a resolved :class:`Source`
    (``skip_unreadable`` and the ``remote`` keywords: see :func:`~shardify.reader.io.sources.resolve_source`)."""
    if isinstance(source, Stream):
        streams = [source]
    elif isinstance(source, (list, tuple)) and source and all(isinstance(s, Stream) for s in source):
        streams = list(source)
    elif isinstance(source, (list, tuple)) and any(isinstance(s, Stream) for s in source):
        raise TypeError("pass a list of Stream objects or a list of shard paths, not both")
    else:
        streams = [Stream(source, split=split)]
    out = []
    for s in streams:
        if not isinstance(s.source, Source):
            s = dataclasses.replace(
                s,
                source=resolve_source(
                    s.source,
                    split=s.split,
                    cache_dir=cache_dir,
                    cache_limit_bytes=cache_limit_bytes,
                    skip_unreadable=skip_unreadable,
                    **(remote or {}),
                ),
            )
        out.append(s)
    return tuple(out)


def stream_weights(streams: Sequence[Stream]) -> list[float]:
    """Each stream's weight; when none is given, its number of samples."""
    given = [s.weight for s in streams]
    if all(w is None for w in given):
        return [float(s.source.num_samples) for s in streams]  # type: ignore[union-attr]
    if any(w is None for w in given):
        missing = next(s.source for s in streams if s.weight is None)
        raise ValueError(
            f"give every stream a weight or none; the stream of {getattr(missing, 'name', missing)} has none"
        )
    return [float(w) for w in given]  # type: ignore[arg-type]


def epoch_counts(streams: Sequence[Stream], *, samples_per_epoch: int | None) -> tuple[int, ...] | None:
    """Samples each stream gives an epoch: ``samples_per_epoch`` (default: all the samples)
    split by weight (:func:`~shardify.reader.plan.mix.stream_counts`); None, each sample of each
    stream once, when neither ``samples_per_epoch`` nor several weighted streams are given."""
    weighted = len(streams) > 1 and any(s.weight is not None for s in streams)
    if samples_per_epoch is None and not weighted:
        return None
    if samples_per_epoch is None:
        samples_per_epoch = sum(cast(Source, s.source).num_samples for s in streams)  # resolved by now
    return tuple(stream_counts(samples_per_epoch, stream_weights(streams)))


def mixed_source(sources: Sequence[Source]) -> Source:
    """One :class:`Source` holding the shards of ``sources`` in order (the dataset's shard numbering)."""
    if len(sources) == 1:
        return sources[0]
    fields = sorted({f for s in sources for f in s.fields}) if all(s.fields for s in sources) else []
    return Source(
        name=" + ".join(s.name for s in sources),
        split=None,
        shards=ChainedShards([s.shards for s in sources]),
        fields=tuple(fields),
        unique_keys=False,
        fetch=sources[0].fetch,
    )


class MixedOpener:
    """Opens a shard through the :class:`Source` it belongs to (its fetch options and checks)."""

    def __init__(self, sources: Sequence[Source]) -> None:
        self._sources = list(sources)

    def __call__(self, url: str) -> tuple[BinaryIO, bool]:
        owner = next((s for s in self._sources if s.index_of(url) is not None), None)
        if owner is None:
            raise KeyError(f"{url} is a shard of none of the mixed sources")
        return owner.open_tar(url)


def sample_tagger(
    plan: WorkerPlan, *, streams: Sequence[Sequence[int]] | None, mark_repeats: bool
) -> Callable[[tuple[int, Item]], tuple[int, Item]]:
    """A function adding ``__stream__`` (when ``streams``, each stream's shard sizes, is given)
    and, with ``mark_repeats``, ``__valid__`` to the sample dict of a worker's ``(position, item)``."""
    of = array.array("i")
    if streams is not None:
        first = list(itertools.accumulate((len(s) for s in streams), initial=0))
        for shard, a, b in plan.ranges:
            of.extend([bisect_right(first, shard) - 1] * (b - a))
    repeats = plan.repeats() if mark_repeats else None

    def tag(pair: tuple[int, Item]) -> tuple[int, Item]:
        p, item = pair
        if type(item) is dict:
            if streams is not None:
                item["__stream__"] = of[p]
            if repeats is not None:
                item["__valid__"] = p not in repeats
        return pair

    return tag


def tag_samples(
    items: Iterator[tuple[int, Item]], plan: WorkerPlan, *, streams: Sequence[Sequence[int]] | None, mark_repeats: bool
) -> Iterator[tuple[int, Item]]:
    """:func:`sample_tagger` applied to each of a worker's ``(position, item)``s."""
    return map(sample_tagger(plan, streams=streams, mark_repeats=mark_repeats), items)
