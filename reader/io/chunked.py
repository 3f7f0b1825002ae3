"""Samples out of chunked shards: a range of sample positions read as the chunks that hold them.

A chunked shard (:mod:`shardify.chunk`) is a tar whose "samples" are chunks of ``N``
samples each (the last of a shard may be shorter). :class:`ChunkSlicer` turns a read of
sample positions ``[start, stop)`` into one read of the chunk positions that cover it
(through the shard reader's own machinery: checksums, windows from the index's offsets,
damage), decodes each chunk once, and yields its samples as dicts whose fields are views or
the sample's own bytes (:meth:`shardify.chunk.Chunk.sample`), never a copy of the chunk. The
last chunk decoded is kept, so consecutive blocks of samples from one chunk read it once.

A chunk that cannot be read, or whose members are not as the writer makes them (damaged),
is damage of its shard: a :class:`ShardFormatError`, or under ``skip_damaged`` a
:class:`~shardify.reader.io.stream.Lost` for each of its positions, so a range still yields
exactly ``stop - start`` items.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from shardify.chunk import Chunk, chunk_samples, decode_chunk
from shardify.errors import ShardFormatError

if TYPE_CHECKING:
    from shardify.reader.io.stream import Item, Lost

__all__ = ["ChunkSlicer"]


class ChunkSlicer:
    """Reads sample ranges of chunked shards through ``units``, a reader of chunk ranges
    (``units(shard, first, stop)`` yields one item per chunk position).

    ``sizes``: samples per shard; ``chunks``: samples per chunk of each shard."""

    def __init__(self, units: Callable[[int, int, int], Iterator[Item]], urls: Sequence[str], sizes: Sequence[int],
                 chunks: Sequence[int | None], *, skip_damaged: bool) -> None:
        self._units = units
        self._urls = urls
        self._sizes = sizes
        self._chunks = chunks
        self._skip = skip_damaged
        self._last: tuple[int, int, Chunk | Lost, int] | None = None
        """``(shard, chunk index, decoded chunk or Lost, its byte offset)`` of the last chunk read."""

    def read(self, shard: int, start: int, stop: int) -> Iterator[Item]:
        """Yield the ``stop - start`` items at sample positions ``start..stop-1`` of ``shard``."""
        if start >= stop:
            return
        n = self._chunks[shard] or 1  # only chunked shards are sent here
        first, end = start // n, (stop - 1) // n + 1
        last = self._last
        if last is not None and last[0] == shard and last[1] == first:
            yield from self._slice(shard, first, last[2], last[3], start, stop)
            first += 1
        if first >= end:
            return
        for c, item in zip(range(first, end), self._units(shard, first, end)):
            decoded, offset = self._decode(shard, c, item)
            self._last = (shard, c, decoded, offset)
            yield from self._slice(shard, c, decoded, offset, start, stop)

    def _decode(self, shard: int, c: int, item: Item) -> tuple[Chunk | Lost, int]:
        from shardify.reader.io.stream import Lost

        url = self._urls[shard]
        if isinstance(item, Lost):
            return item, -1
        key = str(item["__key__"])
        try:
            chunk = decode_chunk(item, shard=url, key=key,
                                 count=chunk_samples(self._sizes[shard], self._chunks[shard], c))  # type: ignore[arg-type]
            if chunk.keys[0] != key:
                raise ShardFormatError(f"damaged chunk: its first key is {chunk.keys[0]!r}, its members' key "
                                       f"{key!r}", shard=url, key=key)
        except ShardFormatError as e:
            if not self._skip:
                raise
            return Lost(url, c, str(e)), -1
        return chunk, int(item["__offset__"])  # type: ignore[call-overload]

    def _slice(self, shard: int, c: int, decoded: Chunk | Lost, offset: int, start: int,
               stop: int) -> Iterator[Item]:
        """The items of chunk ``c`` that fall in ``start..stop-1``."""
        from shardify.reader.io.stream import Lost

        n = self._chunks[shard]
        base = c * n  # type: ignore[operator]
        lo, hi = max(start, base), min(stop, base + n)  # type: ignore[operator]
        url = self._urls[shard]
        if isinstance(decoded, Lost):
            for i in range(lo, hi):
                yield Lost(url, i, decoded.reason)
            return
        for i in range(lo - base, hi - base):
            sample = decoded.sample(i)
            sample["__shard__"] = url
            sample["__offset__"] = offset
            yield sample
