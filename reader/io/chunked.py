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

from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator

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
from shardify.reader.io.items import READ_ERRORS, Item, Lost, damage
from shardify.reader.io.shardfile import ShardFiles, read_at

__all__ = ["ChunkSlicer", "chunk_members"]


_MAX_INDEXED_SAMPLES = 1 << 18
"""Chunk layouts kept per reader, counted in their samples (keys and offsets: ~100 B each)."""

_Index = tuple[list[str], int, dict[str, tuple[int, MemberLayout]]]
"""A chunk's keys, its byte offset, and per field the member's data offset and layout."""


def chunk_members(
    read: Callable[[int, int, str], bytes],
    where: dict[str, tuple[int, int]],
    n: int,
    wanted: Collection[str] | None,
    *,
    url: str,
    key: str,
) -> tuple[list[str], dict[str, tuple[int, MemberLayout]], dict[str, bytes]]:
    """The ``n`` keys of the chunk keyed ``key`` whose members lie at ``where`` (extension ->
    ``(offset, size)``), and per field of ``wanted`` (None: all) its member's offset and layout,
    and the bytes read from its start to find that layout; ``read(offset, size, field)`` reads.
    A chunk without a keys member, whose members are not as the writer makes them, or whose
    first key is not ``key``: ShardFormatError naming the shard and ``key``."""
    if KEYS_EXT not in where:
        raise ShardFormatError(f"chunk has no {KEYS_EXT!r} member (not a chunked shard?)", shard=url, key=key)
    members: dict[str, tuple[int, MemberLayout]] = {}
    heads: dict[str, bytes] = {}
    try:
        keys = chunk_keys(read(*where[KEYS_EXT], KEYS_EXT), n)
        for ext, (at, size) in where.items():
            if ext == KEYS_EXT or (wanted is not None and ext not in wanted):
                continue
            head = read(at, min(size, head_bytes(n)), ext)
            more = head_bytes(n, head)  # a .npy header longer than the usual
            if more:
                head = read(at, min(size, more), ext)
            members[ext], heads[ext] = (at, member_layout(head, size, n, f"field {ext!r}")), head
    except (ValueError, UnicodeDecodeError) as e:  # ArrayFormatError is a ValueError
        raise ShardFormatError(f"damaged chunk: {e}", shard=url, key=key) from e
    if keys[0] != key:
        raise ShardFormatError(f"damaged chunk: its first key is {keys[0]!r}", shard=url, key=key)
    return keys, members, heads


class ChunkSlicer:
    """Reads sample ranges of the chunked shards among ``files`` (whose ``sizes`` count their
    chunks); ``sizes``: samples per shard; ``chunks``: samples per chunk (None: not chunked);
    ``units``: reads whole chunks ``(shard, first, stop)`` as tar samples, for shards read
    forward; ``fields``: the fields a sample gets (None: all)."""

    def __init__(
        self,
        files: ShardFiles,
        sizes: list[int],
        chunks: list[int | None],
        *,
        units: Callable[[int, int, int], Iterator[Item]],
        fields: Collection[str] | None,
    ) -> None:
        self._files = files
        self._units = units
        self._fields = fields
        self._sizes = sizes
        self._chunks = chunks
        self._index: OrderedDict[tuple[int, int], _Index] = OrderedDict()
        self._last: tuple[int, int, Chunk | Lost, int] | None = None
        """``(shard, chunk index, decoded chunk or Lost, its byte offset)`` of the last chunk read whole."""

    def read(self, shard: int, start: int, stop: int) -> Iterator[Item]:
        """Yield the ``stop - start`` items at sample positions ``start..stop-1`` of ``shard``."""
        if start >= stop:
            return
        url = self._files.urls[shard]
        refused = self._files.refused(shard, start, stop)
        if refused is not None:
            yield from refused
            return
        n = self._chunks[shard] or 1
        c = start // n
        while c * n < stop:
            lo, hi = max(start, c * n), min(stop, c * n + n)
            try:
                block = self._block(shard, c, lo - c * n, hi - c * n)
            except (ShardFormatError, *READ_ERRORS) as e:
                self._files.close()
                yield from self._files.lost(shard, lo, hi, damage(url, e), e)
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
        f = self._files.open(shard)
        url = self._files.urls[shard]
        columns: dict[str, Stacked | Variable] = {}
        for ext, (at, layout) in members.items():
            a, b = layout.span(lo, hi)
            columns[ext] = layout.column(read_at(f, at + a, b - a, url=url, key=keys[0], field=ext), lo, hi)
        return keys, offset, columns

    def _chunk_index(self, shard: int, c: int) -> _Index | None:
        """Chunk ``c``'s keys, offset and member layouts, read once and kept."""
        cached = self._index.get((shard, c))
        if cached is not None:
            self._index.move_to_end((shard, c))
            return cached
        found = self._files.unit_members(shard, c)
        if found is None:
            return None
        key, offset, fields = found
        url = self._files.urls[shard]
        n = chunk_samples(self._sizes[shard], self._chunks[shard] or 1, c)
        f = self._files.open(shard)

        def read(at: int, size: int, field: str) -> bytes:
            return read_at(f, at, size, url=url, key=key, field=field)

        where = {ext: (at, size) for ext, at, size in fields}
        keys, members, _ = chunk_members(read, where, n, self._fields, url=url, key=key)
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
            item = next(iter(self._units(shard, c, c + 1)))
            decoded, offset = self._decode(shard, c, item)
            self._last = (shard, c, decoded, offset)
        yield from self._slice(shard, c, decoded, offset, start, stop)

    def _decode(self, shard: int, c: int, item: Item) -> tuple[Chunk | Lost, int]:
        url = self._files.urls[shard]
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
            if not self._files.skip:
                raise
            return Lost(url, c, str(e)), -1
        return chunk, int(item["__offset__"])  # type: ignore[call-overload]

    def _slice(self, shard: int, c: int, decoded: Chunk | Lost, offset: int, start: int, stop: int) -> Iterator[Item]:
        """The items of chunk ``c`` that fall in ``start..stop-1``."""
        n = self._chunks[shard] or 1
        base = c * n
        lo, hi = max(start, base), min(stop, base + n)
        url = self._files.urls[shard]
        if isinstance(decoded, Lost):
            for i in range(lo, hi):
                yield Lost(url, i, decoded.reason)
            return
        for i in range(lo - base, hi - base):
            sample = decoded.sample(i)
            sample["__shard__"] = url
            sample["__offset__"] = offset
            yield sample
