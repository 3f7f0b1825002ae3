"""Reading a range ``[start, stop)`` of a shard's samples, as encoded bytes, without decoding.

Plain tar shards are scanned once per process for where each sample's fields lie
(:func:`shardify.tario.scan_layout`, headers only, checked as strictly as reading them);
then each field of a sample is one read at its offset, with no header parsed again. Gzip
shards cannot seek, so a cursor streams forward and skips samples by reading through them
(reopening when a range lies behind it).

With ``skip_damaged``, a truncated or garbage shard does not raise: the samples before the
damage are read as usual and every later position comes back as a :class:`Lost` marker, so
a range always yields exactly ``stop - start`` items. The sample just before the damage is
kept when all its members were read before it (the damage is not in one of its own
members; see :func:`shardify.tario.iter_samples`).

With ``checksums``, each shard's SHA-256 is checked against the manifest's before its first
sample is used (once per shard and process, again when a local shard's file changed since);
a mismatch raises, or with ``skip_damaged`` loses every position of the shard.

With ``tables`` (each shard's per-sample table, :mod:`shardify.sampletable`), every sample of
a plain tar shard is read whole and checked against its CRC-32 (:mod:`~shardify.reader.io.seekread`):
one that does not match is a :class:`~shardify.errors.SampleChecksumError` naming the shard
and key, or with ``skip_damaged`` that position alone comes back :class:`Lost`. Gzip and
chunked shards have no table.

A shard that cannot be opened (deleted, never there, a directory, no permission) is damage
like any other: a :class:`ShardFormatError` naming it, or with ``skip_damaged`` its positions
come back :class:`Lost`. Without a table, only the ``fields`` asked for are read into memory;
the others are passed over (not read on a plain tar, read through in chunks on gzip). A gzip shard read to
its last sample is read to its trailer too, so a CRC mismatch is damage of that shard.

Chunked shards (``chunks``, :mod:`shardify.chunk`) are read by the same machinery in units of
chunks, and :class:`~shardify.reader.io.chunked.ChunkSlicer` slices the samples out.

The reader picks a strategy per range and delegates to it, each standing on the shard file
object (:mod:`~shardify.reader.io.shardfile`: open, verify, layouts, damage): checked byte
ranges (:mod:`~shardify.reader.io.ranged`), seeks by a window's or the whole shard's layout
(:mod:`~shardify.reader.io.seekread`), forward reading (:mod:`~shardify.reader.io.forward`)
and chunks (:mod:`~shardify.reader.io.chunked`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import BinaryIO

from shardify.chunk import KEYS_EXT, chunk_count
from shardify.errors import KeyRuleError, ShardFormatError
from shardify.keys import split_member_name
from shardify.reader.io.chunked import ChunkSlicer
from shardify.reader.io.forward import read_forward
from shardify.reader.io.items import Item, Lost
from shardify.reader.io.ranged import RangeFetcher, read_ranged
from shardify.reader.io.seekread import read_scanned, read_windows
from shardify.reader.io.shardfile import ShardChecks, ShardFiles, Table
from shardify.reader.io.shardlist import distinct_values
from shardify.reader.io.shardopen import open_tar
from shardify.tario import DEFAULT_MAX_MEMBER

__all__ = ["Lost", "Item", "ShardReader"]


class ShardReader:
    def __init__(
        self,
        urls: Sequence[str],
        sizes: Sequence[int],
        *,
        skip_damaged: bool,
        opener: Callable[[str], tuple[BinaryIO, bool]] = open_tar,
        checksums: Sequence[str] | None = None,
        fields: Collection[str] | None = None,
        max_member: int = DEFAULT_MAX_MEMBER,
        offsets: Sequence[Sequence[int]] | None = None,
        filesizes: Sequence[int | None] | None = None,
        chunks: Sequence[int | None] | None = None,
        ranged: RangeFetcher | None = None,
        tables: Sequence[Table] | None = None,
    ) -> None:
        units = list(sizes)
        """Samples per shard, or for a chunked shard chunks: the units its tar samples are."""
        chunked = list(chunks) if chunks is not None and any(distinct_values(chunks)) else None
        if chunked is not None:
            if len(chunked) != len(urls):
                raise ValueError(f"{len(chunked)=} should be {len(urls)}, one per shard")
            units = [n if c is None else chunk_count(n, c) for n, c in zip(sizes, chunked)]
            if fields is not None:
                fields = {*fields, KEYS_EXT}
        self._fields = frozenset(fields) if fields is not None else None
        keep = None if self._fields is None else functools.partial(_keep_member, self._fields)
        self._files = ShardFiles(
            urls,
            units,
            skip_damaged=skip_damaged,
            opener=opener,
            checks=ShardChecks(checksums=checksums, offsets=offsets, filesizes=filesizes, tables=tables),
            max_member=max_member,
            keep=keep,
        )
        self._chunks = chunked
        self._slicer = (
            None
            if chunked is None
            else ChunkSlicer(self._files, list(sizes), chunked, units=self._read_units, fields=self._fields)
        )
        self._ranged = ranged

    def announce(self, runs: Iterable[tuple[int, int, int]]) -> None:
        """The ``(shard, start, stop)`` reads to come, in order: ranged shards fetch ahead."""
        if self._ranged is not None:
            self._ranged.announce(runs)

    def read(self, shard: int, start: int, stop: int) -> Iterator[Item]:
        """Yield the ``stop - start`` items at positions ``start..stop-1`` of shard ``shard``."""
        if self._slicer is not None and self._chunks is not None and self._chunks[shard] is not None:
            return self._slicer.read(shard, start, stop)
        return self._read_units(shard, start, stop)

    def close(self) -> None:
        """Close the shard files and the ranged fetcher (its requests aborted, its threads ended)."""
        self._files.close()
        if self._ranged is not None:
            self._ranged.close()

    def _read_units(self, shard: int, start: int, stop: int) -> Iterator[Item]:
        """Tar samples ``start..stop-1`` of ``shard`` (chunks, in a chunked shard)."""
        files = self._files
        if self._ranged is not None and self._ranged.covers(shard):  # every range checked on arrival
            yield from read_ranged(self._ranged, files, shard, start, stop)
            return
        refused = files.refused(shard, start, stop)
        if refused is not None:
            yield from refused
        elif not files.seekable(shard):
            yield from read_forward(files.cursor(shard, start), start, stop, skip_damaged=files.skip)
        else:
            try:
                ranges = files.sample_ranges(shard)  # each sample checked against it
            except ShardFormatError as e:  # a sidecar missing, or not this shard's
                yield from files.lost(shard, start, stop, e)
                return
            if files.windowed(shard, start, stop):
                yield from read_windows(files, shard, start, stop, self._fields, ranges)
            else:
                yield from read_scanned(files, shard, start, stop, self._fields, ranges)


def _keep_member(fields: frozenset[str], name: str) -> bool:
    """Whether the member ``name`` holds one of ``fields`` (a name breaking the key rules is
    kept, so that grouping reports it as it would otherwise)."""
    try:
        return split_member_name(name)[1] in fields
    except KeyRuleError:
        return True
