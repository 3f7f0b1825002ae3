"""Samples out of chunked shards: a range of sample positions read from the chunks that hold them.

A chunked shard (:mod:`shardify.chunk`) is a tar whose "samples" are chunks of ``N``
samples each (the last of a shard may be shorter). :class:`ChunkSlicer` reads a range of
sample positions ``[start, stop)`` chunk by chunk:

- On a seekable shard, a chunk's layout (where its members lie, from the index's window of
  chunks or a whole scan, as the shard reader finds sample layouts; its keys; each member's
  offsets table or ``.npy`` header) is read once and kept for the next blocks; then each
  block of samples costs one read per field, of just that block's bytes: the rows of a
  stacked array (``numpy`` views into the bytes read), the span of a variable field (each
  sample its own bytes, sliced by the offsets). A shuffled epoch reads blocks of a few
  samples from chunks in random order, so reading whole chunks would read each one
  ``N / block`` times.
- On a gzip shard (no seeks) or a damaged one read forward under ``skip_damaged``, whole
  chunks are read through the shard reader and decoded; the last one is kept, so
  consecutive blocks of one chunk read it once.

A chunk that cannot be read, or whose members are not as the writer makes them (damaged),
is damage of its shard: a :class:`ShardFormatError` naming the shard and the chunk's key,
or under ``skip_damaged`` a :class:`~shardify.reader.io.items.Lost` for each of its
positions, so a range still yields exactly ``stop - start`` items.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from collections.abc import Iterator
from typing import BinaryIO, Protocol

from shardify.chunk import (
    KEYS_EXT,
    Chunk,
    MemberLayout,
    Stacked,
    Variable,
    chunk_keys,
    chunk_samples,
    decode_chunk,
    head_bytes,
    member_layout,
)
from shardify.errors import ShardFormatError
from shardify.reader.io.items import Item, Lost, damage

__all__ = ["ChunkSlicer", "ShardFiles"]


class ShardFiles(Protocol):
    """What the slicer takes from the shard reader it helps (:class:`~shardify.reader.io.stream.ShardReader`
    is one): its shards' files, checks, member layouts and damage policy."""

    _urls: list[str]
    _skip: bool
    _fields: frozenset[str] | None

    def _open(self, shard: int) -> BinaryIO: ...

    def _verify(self, shard: int) -> ShardFormatError | None: ...

    def _read_units(self, shard: int, start: int, stop: int) -> Iterator[Item]: ...

    def _unit_members(self, shard: int, i: int) -> tuple[str, int, list[tuple[str, int, int]]] | None: ...

    def close(self) -> None: ...


_MAX_INDEXED_SAMPLES = 1 << 18
"""Chunk layouts kept per reader, counted in their samples (keys and offsets: ~100 B each)."""
_ReadErrors = (OSError, EOFError, zlib.error)

_Index = tuple[list[str], int, dict[str, tuple[int, MemberLayout]]]
"""A chunk's keys, its byte offset, and per field the member's data offset and layout."""


def _read_at(f: BinaryIO, at: int, size: int, url: str, key: str, field: str) -> bytes:
    f.seek(at)
    data = f.read(size)
    if len(data) != size:  # the file shrank since it was scanned
        raise ShardFormatError(
            f"truncated: field {field!r} needs {size} bytes at byte {at}, only {len(data)} left", shard=url, key=key
        )
    return data


class ChunkSlicer:
    """Reads sample ranges of the chunked shards of ``reader`` (its helper: it uses the
    reader's checksums, files, layouts and damage policy). ``sizes``: samples per shard."""

    def __init__(self, reader: ShardFiles, sizes: list[int], chunks: list[int | None]) -> None:
        self._r = reader
        self._sizes = sizes
        self._chunks = chunks
        self._index: OrderedDict[tuple[int, int], _Index] = OrderedDict()
        self._last: tuple[int, int, Chunk | Lost, int] | None = None
        """``(shard, chunk index, decoded chunk or Lost, its byte offset)`` of the last chunk read whole."""

    def read(self, shard: int, start: int, stop: int) -> Iterator[Item]:
        """Yield the ``stop - start`` items at sample positions ``start..stop-1`` of ``shard``."""
        if start >= stop:
            return
        url = self._r._urls[shard]
        mismatch = self._r._verify(shard)
        if mismatch is not None:
            if not self._r._skip:
                raise mismatch
            for i in range(start, stop):
                yield Lost(url, i, str(mismatch))
            return
        n = self._chunks[shard] or 1
        c = start // n
        while c * n < stop:
            lo, hi = max(start, c * n), min(stop, c * n + n)
            try:
                block = self._block(shard, c, lo - c * n, hi - c * n)
            except (ShardFormatError, *_ReadErrors) as e:
                error = damage(url, e)
                self._r.close()
                if not self._r._skip:
                    raise error from e
                for i in range(lo, hi):
                    yield Lost(url, i, str(error))
                c += 1
                continue
            if block is None:  # not seekable, or damaged and read forward: whole chunks
                yield from self._whole(shard, c, start, stop)
            else:
                keys, offset, columns = block
                base = c * n
                for i in range(lo - base, hi - base):
                    sample: dict[str, object] = {"__key__": keys[i], "__shard__": url, "__offset__": offset}
                    for ext, column in columns.items():
                        v = column.value(i)
                        if v is not None:
                            sample[ext] = v
                    yield sample
            c += 1

    # -- seekable shards: a block's bytes only -------------------------------------------------
    def _block(
        self, shard: int, c: int, lo: int, hi: int
    ) -> tuple[list[str], int, dict[str, Stacked | Variable]] | None:
        """Samples ``lo..hi-1`` of chunk ``c`` (indices within the chunk): keys, the chunk's
        offset and one column per field; None when the shard must be read forward."""
        index = self._chunk_index(shard, c)
        if index is None:
            return None
        keys, offset, members = index
        f = self._r._open(shard)
        url = self._r._urls[shard]
        columns: dict[str, Stacked | Variable] = {}
        for ext, (at, layout) in members.items():
            a, b = layout.span(lo, hi)
            columns[ext] = layout.column(_read_at(f, at + a, b - a, url, keys[0], ext), lo, hi)
        return keys, offset, columns

    def _chunk_index(self, shard: int, c: int) -> _Index | None:
        """Chunk ``c``'s keys, offset and member layouts, read once and kept."""
        cached = self._index.get((shard, c))
        if cached is not None:
            self._index.move_to_end((shard, c))
            return cached
        found = self._r._unit_members(shard, c)
        if found is None:
            return None
        key, offset, fields = found
        url = self._r._urls[shard]
        n = chunk_samples(self._sizes[shard], self._chunks[shard] or 1, c)
        where = {ext: (at, size) for ext, at, size in fields}
        if KEYS_EXT not in where:
            raise ShardFormatError(f"chunk has no {KEYS_EXT!r} member (not a chunked shard?)", shard=url, key=key)
        f = self._r._open(shard)
        wanted = self._r._fields
        members: dict[str, tuple[int, MemberLayout]] = {}
        try:
            keys = chunk_keys(_read_at(f, *where[KEYS_EXT], url, key, KEYS_EXT), n)
            for ext, (at, size) in where.items():
                if ext == KEYS_EXT or (wanted is not None and ext not in wanted):
                    continue
                head = _read_at(f, at, min(size, head_bytes(n)), url, key, ext)
                more = head_bytes(n, head)  # a .npy header longer than the usual
                if more:
                    head = _read_at(f, at, min(size, more), url, key, ext)
                layout = member_layout(head, size, n, f"field {ext!r}")
                members[ext] = (at, layout)
        except (ValueError, UnicodeDecodeError) as e:  # ArrayFormatError is a ValueError
            raise ShardFormatError(f"damaged chunk: {e}", shard=url, key=key) from e
        if keys[0] != key:
            raise ShardFormatError(f"damaged chunk: its first key is {keys[0]!r}", shard=url, key=key)
        index = (keys, offset, members)
        self._index[(shard, c)] = index
        while len(self._index) > max(1, _MAX_INDEXED_SAMPLES // (self._chunks[shard] or 1)):
            self._index.popitem(last=False)
        return index

    # -- gzip or damaged shards: whole chunks --------------------------------------------------
    def _whole(self, shard: int, c: int, start: int, stop: int) -> Iterator[Item]:
        """The items of chunk ``c`` in ``start..stop-1``, from the chunk read whole."""
        last = self._last
        if last is not None and last[0] == shard and last[1] == c:
            decoded, offset = last[2], last[3]
        else:
            item = next(iter(self._r._read_units(shard, c, c + 1)))
            decoded, offset = self._decode(shard, c, item)
            self._last = (shard, c, decoded, offset)
        yield from self._slice(shard, c, decoded, offset, start, stop)

    def _decode(self, shard: int, c: int, item: Item) -> tuple[Chunk | Lost, int]:
        url = self._r._urls[shard]
        if isinstance(item, Lost):
            return item, -1
        key = str(item["__key__"])
        try:
            chunk = decode_chunk(
                item, shard=url, key=key, count=chunk_samples(self._sizes[shard], self._chunks[shard] or 1, c)
            )
            if chunk.keys[0] != key:
                raise ShardFormatError(f"damaged chunk: its first key is {chunk.keys[0]!r}", shard=url, key=key)
        except ShardFormatError as e:
            if not self._r._skip:
                raise
            return Lost(url, c, str(e)), -1
        return chunk, int(item["__offset__"])  # type: ignore[call-overload]

    def _slice(self, shard: int, c: int, decoded: Chunk | Lost, offset: int, start: int, stop: int) -> Iterator[Item]:
        """The items of chunk ``c`` that fall in ``start..stop-1``."""
        n = self._chunks[shard] or 1
        base = c * n
        lo, hi = max(start, base), min(stop, base + n)
        url = self._r._urls[shard]
        if isinstance(decoded, Lost):
            for i in range(lo, hi):
                yield Lost(url, i, decoded.reason)
            return
        for i in range(lo - base, hi - base):
            sample = decoded.sample(i)
            sample["__shard__"] = url
            sample["__offset__"] = offset
            yield sample
