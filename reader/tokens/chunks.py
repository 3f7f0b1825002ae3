"""Where a chunked token split's chunks lie, found and checked once per process (for
:class:`~shardify.reader.tokens.shards.TokenShards`, which reads them).

The index gives the offset of every 32nd chunk; the tar headers are read from there to the
chunk wanted. A chunk's token member must be exactly what the index's document lengths make
(its table of document sizes, or a stacked array's header), else ShardFormatError names the
shard and the chunk's key. In a local file, which is then mapped into memory, every document's
128-byte ``.npy`` header in the chunk is checked too, once, so rows need not check the headers
they read, and the chunk must lie within the file.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from shardify.chunk import VAR_MAGIC
from shardify.errors import ShardFormatError
from shardify.npy import npy_header
from shardify.reader.io.shardopen import local_path
from shardify.reader.io.source import Source
from shardify.tarfmt import BLOCK, OFFSET_STRIDE, padded_size
from shardify.tarheader import header_fields

__all__ = ["ChunkLocator", "Chunk", "NPY_HEADER", "MAX_OPEN"]

NPY_HEADER = 128
"""Bytes of a token document's ``.npy`` header (a 1-D array's is always 128)."""
MAX_OPEN = 128
"""Local shard files kept open, and kept mapped, per process (the last opened)."""
_VAR_HEAD = struct.Struct("<8sQQ")
_MAX_CHUNKS = 1 << 14
"""Chunk locations kept per process."""

Chunk = tuple[int, str, list[int], list[int], bool]
"""A chunk's token member: where its data begins, the chunk's key, where each document's first
token lies from there, each document's length, and whether documents have their own header (a
variable member)."""


class ChunkLocator:
    """Finding chunks and checking the bytes around tokens; a base of ``TokenShards``, which
    sets these attributes and reads bytes (:meth:`_pread`)."""

    source: Source
    dtype: np.dtype
    descr: str
    field: str
    urls: Sequence[str]
    _lock: threading.RLock
    _remote: list[bool]
    _headers: dict[int, bytes]
    _chunks: OrderedDict[tuple[int, int], Chunk]
    _walk: dict[tuple[int, int], int]
    _maps: OrderedDict[int, tuple[mmap.mmap | None, np.ndarray, np.ndarray]]
    _sized: set[int]
    chunk: int | None

    def doc_offsets(self, shard: int) -> np.ndarray:
        raise NotImplementedError

    def _pread(self, shard: int, a: int, b: int, key: str | None) -> bytes:
        raise NotImplementedError

    def _chunk(self, shard: int, c: int) -> Chunk:
        """Chunk ``c`` of ``shard``'s token member, found by walking the tar headers from the
        nearest chunk whose offset is known, and checked against the index's lengths."""
        with self._lock:
            return self._find_chunk(shard, c, self.doc_offsets(shard))

    def _find_chunk(self, shard: int, c: int, cum: np.ndarray) -> Chunk:
        got = self._chunks.get((shard, c))
        if got is not None:
            self._chunks.move_to_end((shard, c))
            return got
        offsets = self.source.shards[shard].offsets
        k = c - c % OFFSET_STRIDE if offsets else 0
        start = offsets[k // OFFSET_STRIDE] if offsets else 0
        while k < c:  # chunks whose start the index does not give: walk from the nearest one
            known = self._walk.get((shard, k + 1))
            if known is None:
                found = self._chunks.get((shard, k)) or self._locate(shard, k, start, cum)
                self._chunks[(shard, k)] = found
                known = self._walk[(shard, k + 1)] = self._next(shard, k, found, cum)
            k, start = k + 1, known
        got = self._locate(shard, c, start, cum)
        self._chunks[(shard, c)] = got
        self._walk[(shard, c + 1)] = self._next(shard, c, got, cum)  # (a later walk past it reads nothing)
        if len(self._chunks) > _MAX_CHUNKS:
            self._chunks.popitem(last=False)
            self._walk.clear()
        return got

    def _next(self, shard: int, c: int, found: Chunk, cum: np.ndarray) -> int:
        """Where chunk ``c + 1`` starts: past chunk ``c``'s token member."""
        return found[0] + padded_size(self._member_size(self._lengths_of(shard, c, cum)))

    def _lengths_of(self, shard: int, c: int, cum: np.ndarray) -> np.ndarray:
        n = self.chunk or 1
        return np.diff(cum[c * n : min(c * n + n, len(cum) - 1) + 1])

    def _member_size(self, lengths: np.ndarray) -> int:
        """Bytes of a chunk's token member for documents of ``lengths``."""
        headers = 0 if self._stacked(lengths) else NPY_HEADER * len(lengths)
        return len(self._expected_head(lengths)) + headers + int(lengths.sum()) * int(self.dtype.itemsize)

    @staticmethod
    def _stacked(lengths: np.ndarray) -> bool:
        return bool((lengths == lengths[0]).all())

    def _expected_head(self, lengths: np.ndarray) -> bytes:
        """The bytes before the first document's data that the writer makes for ``lengths``:
        a stacked array's header, or a variable member's table (each document's header follows
        in the data, counted there)."""
        if self._stacked(lengths):
            return npy_header(self.descr, (len(lengths), int(lengths[0])))
        ends = np.zeros(len(lengths) + 1, dtype="<u8")
        np.cumsum(lengths * self.dtype.itemsize + NPY_HEADER, out=ends[1:])
        return _VAR_HEAD.pack(VAR_MAGIC, len(lengths), 0) + ends.tobytes()

    def _locate(self, shard: int, c: int, start: int, cum: np.ndarray) -> Chunk:
        url = self.urls[shard]
        head = self._pread(shard, start, start + BLOCK, None)
        name, size, _, _ = header_fields(head)
        key = name.decode("utf-8", "replace").rpartition(".chunk-keys")[0] or None
        if not name.endswith(b".chunk-keys"):
            raise ShardFormatError(f"chunk {c}: found member {name!r} at byte {start}, not a chunk's keys", shard=url)
        lengths = self._lengths_of(shard, c, cum)
        expected = self._expected_head(lengths)
        stacked = self._stacked(lengths)
        member = start + BLOCK + padded_size(size)
        got = self._pread(shard, member, member + BLOCK + len(expected), key)
        tname, tsize, _, _ = header_fields(got[:BLOCK])
        want = self._member_size(lengths)
        if tname != f"{key}.{self.field}".encode() or tsize != want or got[BLOCK:] != expected:
            raise ShardFormatError(
                f"damaged chunk: member {tname!r} of {tsize} bytes does not hold the {len(lengths)} documents of "
                f"{int(lengths.sum())} tokens the index records ({self.field!r} of {want} bytes)",
                shard=url,
                key=key,
            )
        it = self.dtype.itemsize
        tokens_before = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
        if stacked:
            firsts = len(expected) + tokens_before * it
        else:
            firsts = len(expected) + (np.arange(len(lengths), dtype=np.int64) + 1) * NPY_HEADER + tokens_before * it
        if not self._remote[shard]:
            self._check_mapped(shard, key, member + BLOCK + want, None if stacked else member + BLOCK + firsts, lengths)
        return member + BLOCK, key or "", firsts.tolist(), lengths.tolist(), not stacked

    def _check_mapped(
        self, shard: int, key: str | None, end: int, firsts: np.ndarray | None, lengths: np.ndarray
    ) -> None:
        """A local chunk, once: its member lies within the file, and every document's ``.npy``
        header (before ``firsts``, when the documents have their own) is the index's."""
        raw = self._mapped(shard)[0]
        if len(raw) < end:
            raise ShardFormatError(
                f"truncated: the chunk ends at byte {end}, the file at {len(raw)}", shard=self.urls[shard], key=key
            )
        if firsts is None:
            return
        heads = raw[(firsts - NPY_HEADER)[:, None] + np.arange(NPY_HEADER)].tobytes()
        known = self._headers
        ns = lengths.tolist()
        if heads != b"".join([known.get(n) or self._header(n) for n in ns]):
            for i, n in enumerate(ns):  # the first that differs raises, naming the chunk
                self._check_header(heads[i * NPY_HEADER : (i + 1) * NPY_HEADER], n, shard, key)

    def _mapped(self, shard: int) -> tuple[np.ndarray, np.ndarray]:
        """Local ``shard`` mapped into memory, as bytes and as tokens (the last MAX_OPEN mapped kept;
        one dropped is unmapped once no array holds it). The file's size is checked at its first
        call of a batch (``mmap.size()``, one ``fstat``): a file truncated since it was mapped is
        mapped again at its new size, so that a read past its end is an error naming it, never a
        fault (SIGBUS), unless it is cut during that batch's copies."""
        got = self._maps.get(shard)
        if got is not None and (shard in self._sized or got[0] is None or got[0].size() == len(got[0])):
            self._sized.add(shard)
            return got[1], got[2]
        url = self.urls[shard]
        try:
            with open(local_path(url), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        except (OSError, ValueError) as e:
            raise ShardFormatError(f"cannot map the file: {e}", shard=url) from e
        buffer = mapped if mapped is not None else b""
        entry = (
            mapped,
            np.frombuffer(buffer, dtype=np.uint8),
            np.frombuffer(buffer, dtype=self.dtype, count=size // self.dtype.itemsize),
        )
        with self._lock:
            self._maps[shard] = entry
            if len(self._maps) > MAX_OPEN:
                self._maps.popitem(last=False)
        return entry[1], entry[2]

    def _header(self, n: int) -> bytes:
        """The ``.npy`` header of a document of ``n`` tokens."""
        want = self._headers.get(n)
        if want is None:
            want = self._headers[n] = npy_header(self.descr, (n,))
        return want

    def _check_header(self, head: bytes | memoryview, n: int, shard: int, key: str | None) -> None:
        if bytes(head) != self._header(n):
            raise ShardFormatError(
                f"a document's .npy header is not that of {n} tokens of {self.dtype} (as the index records)",
                shard=self.urls[shard],
                key=key,
            )
