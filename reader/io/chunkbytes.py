"""Random access to the samples of chunked shards (``--chunk N``, :mod:`shardify.chunk`), a batch at a time.

Sample ``p`` of a chunked shard is row ``p % N`` of chunk ``p // N``. A shard's chunks are found
by one header-only scan (:func:`~shardify.tario.scan_layout`, once per shard and process); a
chunk's keys and member layouts (each member's ``.npy`` header or offsets table) are read the
first time one of its samples is, and kept (:data:`MAX_CHUNK_SAMPLES`). A batch then costs one
``pread`` per sample and field, straight into the batch's column
(:mod:`~shardify.reader.io.columns`): a stacked field's row (:class:`Rows` when every sample's
chunk stacks it alike), a variable field's own bytes (:class:`Spans`).

Checks: this layout's index has no per-sample or per-chunk checksums, only each shard's SHA-256.
A local shard is checked against it when a process first opens it (read whole once per
process); a remote one is fetched whole into the node's cache on first touch and checked there
(:class:`~shardify.reader.io.mapfiles.OpenShards`). Each chunk's members are checked as the
streaming reader checks them (its keys member starts with its key, tables and headers that fit
their member): else a :class:`ShardFormatError` naming the shard and the chunk's key, for that
chunk's samples only.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from shardify.chunk import MemberLayout, chunk_samples
from shardify.errors import ShardFormatError
from shardify.reader.io.chunked import chunk_members
from shardify.reader.io.columns import Column, Rows, Spans, Values
from shardify.reader.io.mapfiles import MAX_OPEN_FILES, OpenShards
from shardify.reader.io.source import Source
from shardify.tario import ShardLayout, scan_layout

__all__ = ["MAX_CHUNK_SAMPLES", "ChunkBatch", "ChunkBytes"]

MAX_CHUNK_SAMPLES = 1 << 18
"""Chunk layouts kept per process, counted in their samples (keys and offsets: ~100 B each)."""

_Chunk = tuple[list[str], int, dict[str, tuple[int, MemberLayout]], dict[str, bytes]]
"""A chunk's keys, its byte offset, per field its member's data offset and layout, and the
samples' data of its small variable members (labels, short texts), read with the layout."""

SMALL_MEMBER = 64 << 10
"""A variable member up to this size is read whole with its chunk's layout (one read for all
its samples' values instead of one each)."""


class ChunkBatch:
    """A batch read from chunked shards: each sample's key and chunk offset, one column per
    field, and ``bad[j]``: why sample ``j``'s chunk cannot be read (left out of the columns)."""

    def __init__(self, keys: list[str], offsets: list[int], fields: dict[str, Column], bad: dict[int, Exception]):
        self.keys, self.offsets, self.fields, self.bad = keys, offsets, fields, bad


class ChunkBytes:
    """Samples of ``source``'s chunked shards by (shard, position); ``chunks[i]``: samples per
    chunk of shard ``i``; ``fields``: the fields read (None: all). Picklable: what a process
    opens is made again where it is next used."""

    def __init__(self, source: Source, *, chunks: Sequence[int], fields: Collection[str] | None, max_member: int):
        self.source, self._wanted, self._max_member = source, fields, max_member
        self.chunked = [int(n) for n in chunks]
        """Samples per chunk of each shard (0: not chunked)."""
        self._reset()

    def _reset(self) -> None:
        self.urls, self._pid = self.source.urls, os.getpid()
        self._files = OpenShards(self.source, whole_sha256=True)
        self._layouts: OrderedDict[int, ShardLayout] = OrderedDict()
        self._index: OrderedDict[tuple[int, int], _Chunk] = OrderedDict()
        self._fds: dict[int, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {k: self.__dict__[k] for k in ("source", "chunked", "_wanted", "_max_member")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def _check_pid(self) -> None:
        if os.getpid() != self._pid:
            self._reset()

    def keys(self, shard: int) -> list[str]:
        """Every sample key of chunked shard ``shard``, in stored order."""
        self._check_pid()
        n = self.chunked[shard]
        return [k for c in range(-(-self.source.sizes[shard] // n)) for k in self._chunk(shard, c)[0]]

    def key(self, shard: int, position: int) -> str:
        self._check_pid()
        c, i = divmod(position, self.chunked[shard])
        return self._chunk(shard, c)[0][i]

    def gather(self, shards: np.ndarray, positions: np.ndarray, submit: Callable[..., Future[Any]]) -> ChunkBatch:
        """The samples ``(shards[j], positions[j])`` as a :class:`ChunkBatch`, in that order."""
        self._check_pid()
        n = len(shards)
        keys, offsets = [""] * n, [0] * n
        found: list[tuple[int, int, _Chunk] | None] = [None] * n
        bad: dict[int, Exception] = {}
        self._files.open_many(shards.tolist(), submit)
        # this batch's descriptors, kept for it when it touches few enough shards that none is closed meanwhile
        self._fds = {} if len(set(shards.tolist())) <= MAX_OPEN_FILES // 2 else None
        failed: dict[int, ShardFormatError] = {}  # a shard that cannot be opened is tried once a batch
        try:
            for j, (s, p) in enumerate(zip(shards.tolist(), positions.tolist())):
                c, i = divmod(p, self.chunked[s])
                try:
                    if s in failed:
                        raise failed[s]
                    chunk = self._chunk(s, c)
                except ShardFormatError as e:
                    if s not in self._files.files:
                        failed[s] = e
                    bad[j] = e
                    continue
                found[j] = (s, i, chunk)
                keys[j], offsets[j] = chunk[0][i], chunk[1]
            names = dict.fromkeys(ext for f in found if f is not None for ext in f[2][2])
            fields = {ext: self._column(ext, found) for ext in names}
        finally:
            self._fds = None
        return ChunkBatch(keys, offsets, fields, bad)

    def _column(self, ext: str, found: list[tuple[int, int, _Chunk] | None]) -> Column:
        members = [f[2][2].get(ext) if f is not None else None for f in found]
        layouts = [m[1] if m is not None else None for m in members]
        first = layouts[0]
        if (
            first is not None
            and first.ends is None
            and all(
                m is not None and m.ends is None and m.dtype == first.dtype and m.shape == first.shape for m in layouts
            )
        ):
            return self._rows(found, members, first)
        if all(m is None or m.ends is not None for m in layouts):
            return self._spans(ext, found, members)
        return Values([self._value(f, m) if f is not None and m is not None else None for f, m in zip(found, members)])

    def _rows(self, found: list[Any], members: list[Any], layout: MemberLayout) -> Rows:
        row = layout.row
        out = np.empty(len(found) * row, np.uint8)
        view = out.data
        for j, ((s, i, _), (at, m)) in enumerate(zip(found, members)):
            self._pread(s, view[j * row : (j + 1) * row], at + m.start + i * row)
        dtype: np.dtype[Any] = layout.dtype  # type: ignore[assignment]  # set for stacked members
        return Rows(out.view(dtype).reshape(len(found), *layout.shape))

    def _spans(self, ext: str, found: list[Any], members: list[Any]) -> Spans:
        n = len(found)
        size, present = np.zeros(n, np.int64), np.ones(n, bool)
        for j, (f, m) in enumerate(zip(found, members)):
            if f is None or m is None or (m[1].present is not None and not m[1].present[f[1]]):
                present[j] = False
            else:
                ends = m[1].ends
                size[j] = ends[f[1] + 1] - ends[f[1]]
        at = np.zeros(n, np.int64)
        np.cumsum(size[:-1], out=at[1:])
        data = np.empty(int(size.sum()), np.uint8)
        view = data.data
        for j in np.flatnonzero(present).tolist():
            (s, i, chunk), (start, m) = found[j], members[j]
            small = chunk[3].get(ext)
            if small is not None:
                view[at[j] : at[j] + size[j]] = small[m.ends[i] : m.ends[i + 1]]
            else:
                self._pread(s, view[at[j] : at[j] + size[j]], start + m.start + m.ends[i])
        return Spans(data, at, size, None if present.all() else present)

    def _value(self, f: tuple[int, int, _Chunk], member: tuple[int, MemberLayout]) -> bytes | np.ndarray | None:
        s, i, _ = f
        at, m = member
        a, b = m.span(i, i + 1)
        if m.present is not None and not m.present[i]:
            return None
        data = bytearray(b - a)
        self._pread(s, memoryview(data), at + a)
        column = m.column(bytes(data), i, i + 1)
        return column.value(i)

    def _pread(self, shard: int, into: memoryview, at: int) -> None:
        fd = self._fds.get(shard) if self._fds is not None else None
        if fd is None:
            fd = self._files.fd(shard)
            if self._fds is not None:
                self._fds[shard] = fd
        try:
            got = os.preadv(fd, [into], at)
        except OSError as e:
            raise ShardFormatError(f"cannot read bytes {at}-{at + len(into) - 1}: {e}", shard=self.urls[shard]) from e
        if got != len(into):
            raise ShardFormatError(
                f"truncated: bytes {at}-{at + len(into) - 1} hold only {got} (shorter than its index says)",
                shard=self.urls[shard],
            )

    def _layout(self, shard: int) -> ShardLayout:
        found = self._layouts.get(shard)
        if found is None:
            fd = self._files.fd(shard)
            with os.fdopen(os.dup(fd), "rb") as f:
                f.seek(0)
                found = scan_layout(f, shard=self.urls[shard], max_member=self._max_member)
            self._layouts[shard] = found
            if len(self._layouts) > 64:
                self._layouts.popitem(last=False)
        return found

    def _chunk(self, shard: int, c: int) -> _Chunk:
        """Chunk ``c`` of ``shard``: its keys, offset and member layouts, read once and kept."""
        cached = self._index.get((shard, c))
        if cached is not None:
            self._index.move_to_end((shard, c))
            return cached
        url, per = self.urls[shard], self.chunked[shard]
        layout = self._layout(shard)
        if c >= len(layout):
            raise ShardFormatError(f"holds {len(layout)} chunks, its index says more", shard=url)
        key, offset, n = layout.key(c), int(layout.offsets[c]), chunk_samples(self.source.sizes[shard], per, c)
        where = {ext: (at, size) for ext, at, size in layout.fields(c)}

        def read(at: int, size: int, field: str) -> bytes:
            return self._read(shard, at, size)

        keys, members, heads = chunk_members(read, where, n, self._wanted, url=url, key=key)
        small: dict[str, bytes] = {}
        for ext, (at, m) in members.items():
            size = where[ext][1]
            if m.ends is not None and size <= SMALL_MEMBER:
                head = heads[ext]
                small[ext] = head[m.start :] if len(head) == size else self._read(shard, at + m.start, size - m.start)
        self._index[(shard, c)] = (keys, offset, members, small)
        while len(self._index) > max(1, MAX_CHUNK_SAMPLES // per):
            self._index.popitem(last=False)
        return keys, offset, members, small

    def _read(self, shard: int, at: int, size: int) -> bytes:
        data = bytearray(size)
        self._pread(shard, memoryview(data), at)
        return bytes(data)

    def close(self) -> None:
        self._files.close()
