"""Tokens out of a token split's shards: any range of its stream, read by byte ranges and checked.

A token split (``shardify convert tokens``) stores document ``d`` as sample ``d`` with one field,
a 1-D ``.npy`` whose header is always 128 bytes. The stream is its documents end to end;
:meth:`TokenShards.read` gives the tokens of positions ``[p, q)`` and where documents begin
in them. Each shard's document lengths (the index's ``tokens``) are turned into offsets only
when the shard is first read (those of the last 256 shards kept), so a plan needs only the totals.

- **Per-sample layout** (``chunk=None``): a range costs one read per shard it touches
  (``os.pread`` locally, a ranged request remotely), the byte offsets from the split's
  per-sample table (:meth:`~shardify.reader.io.samplebytes.SampleBytes.ranges`). The first time
  a process reads a document it reads it whole and checks it against the index's CRC-32 (a
  file) or SHA-256 prefix (a server), and its member's name, size and ``.npy`` header: a
  document that does not match raises :class:`~shardify.errors.SampleChecksumError` (or
  ``ShardFormatError``) naming the shard and key, before any of its tokens is used. The
  document is then marked (one bit a document, for the :data:`_MAX_SHARDS` shards most
  recently read), and later reads of it take only the tokens they need, as ``verify=True``
  trusts a shard once checked: a document many sequences long is read whole once per process,
  not once per sequence; bytes changed after that check go unseen by this process.
- **Chunked layout** (the default): where each chunk's token member lies is found once
  (:mod:`~shardify.reader.tokens.chunks`: the member's table or stacked header checked against
  the index's lengths; in a local file, mapped into memory, every document's header in the
  chunk checked then too). A range then costs one read per chunk it touches (locally, slices
  of the mapped file), of just its tokens (and remotely the 128-byte headers between its
  documents, each checked against the index). The format keeps no per-document checksum in a
  chunked split: bytes changed in place inside a document's tokens go unseen, unless
  ``verify`` is set: then, as ``DecodeOptions(verify=True)`` does for the streaming reader,
  each shard's SHA-256 is checked against the index before its first read in a process (a
  local file hashed whole; a remote one fetched whole, checked on arrival, then read by
  ranges as usual). A local shard is memory-mapped and its size checked once a batch: a file
  truncated since is an error naming it, not a fault (only a cut during that batch's copy is).
"""

from __future__ import annotations

import mmap
import os
import threading
import zlib
from array import array
from bisect import bisect_right
from collections import OrderedDict
from typing import Any

import numpy as np

from shardify.errors import ShardFormatError
from shardify.jsonfiles import file_sha256
from shardify.reader.io.compact import CompactShards
from shardify.reader.io.items import changed_sample, sample_key
from shardify.reader.io.samplebytes import SampleBytes
from shardify.reader.io.shardopen import is_gzip, local_path, open_shard
from shardify.reader.io.source import Source
from shardify.reader.tokens.chunks import MAX_OPEN, NPY_HEADER, Chunk, ChunkLocator
from shardify.remote import ShardFetchError, fetch_range, is_remote
from shardify.sampletable import SampleRanges, sample_digest
from shardify.tarfmt import BLOCK
from shardify.tarheader import header_fields

__all__ = ["TokenShards", "NPY_HEADER"]

_MAX_SHARDS = 256
"""Shards whose document offsets are kept per process (the last made), and whose checked documents are
marked (the most recently read)."""


class TokenShards(ChunkLocator):
    """The token stream of ``source``, a token split (see the module). Picklable: what a process
    opens (descriptors, offsets) is left behind and made again where it is next used."""

    def __init__(self, source: Source, *, verify: bool = False) -> None:
        info = source.tokens
        where = f"{source.name} split {source.split!r}"
        if info is None:
            raise ValueError(
                f"{where} is not a token split (its index has no 'tokens'): convert it with convert_tokens"
            )
        if isinstance(source.shards, CompactShards):
            raise ValueError(f"{where}: a compact index keeps no document lengths; read its JSON index")
        gz = [s.url for s in source.shards if is_gzip(s.url)]
        if gz:
            raise ValueError(f"{where}: gzip shards cannot be read by ranges ({gz[0]})")
        self.source = source
        self.verify = verify
        self.field = info.field
        self.dtype = np.dtype(info.dtype).newbyteorder("<")
        self.descr = repr(self.dtype.str)
        self.chunk = source.shards[0].chunk if len(source.shards) else None
        self.totals = np.array([_lengths(s.tokens).sum(dtype=np.int64) for s in source.shards], dtype=np.int64)
        self.starts = np.concatenate(([0], np.cumsum(self.totals))).astype(np.int64)
        self.total = int(self.starts[-1])
        self.remote = any(is_remote(u) for u in source.urls)
        """Whether a shard is read from a server (rows are then worth reading concurrently)."""
        self._reset()

    def _reset(self) -> None:
        self.urls = self.source.urls
        self._pid = os.getpid()
        self._docs: OrderedDict[int, array[int]] = OrderedDict()
        self._chunks: OrderedDict[tuple[int, int], Chunk] = OrderedDict()
        self._walk: dict[tuple[int, int], int] = {}
        self._fds: OrderedDict[int, int] = OrderedDict()
        self._headers: dict[int, bytes] = {}
        self._verified: set[int] = set()
        self._checked: OrderedDict[int, bytearray] = OrderedDict()
        self._maps: OrderedDict[int, tuple[mmap.mmap | None, np.ndarray, np.ndarray]] = OrderedDict()
        self._sized: set[int] = set()  # the mapped files whose size this batch has checked
        self._starts = self.starts.tolist()
        self._remote = [is_remote(u) for u in self.urls]
        self._suffix = f".{self.field}".encode()
        self._samples = SampleBytes(self.source) if self.chunk is None else None
        self._lock = threading.RLock()  # the caches, when a batch's rows are read by threads (remote)

    def __getstate__(self) -> dict[str, Any]:
        keep = ("source", "verify", "field", "dtype", "descr", "chunk", "totals", "starts", "total", "remote")
        return {name: self.__dict__[name] for name in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def close(self) -> None:
        """Close this process's files (opened again when next used)."""
        if os.getpid() == self._pid:
            for fd in self._fds.values():
                os.close(fd)
            if self._samples is not None:
                self._samples.close()
        self._reset()

    def ready(self) -> None:
        """Make this process's own caches after a fork (the parent's files and threads are not
        ours); call it before reading from several threads, once a batch: the mapped files' sizes
        are checked again at their next read."""
        if os.getpid() != self._pid:
            self._reset()
        self._sized.clear()

    # -- the stream ----------------------------------------------------------------------------
    def read(self, p: int, q: int, out: np.ndarray, doc_starts: list[int] | None, base: int = 0) -> None:
        """Tokens of stream positions ``[p, q)`` into ``out[:q - p]``; appends to ``doc_starts``
        (unless None) ``base + i`` for each ``i`` where a document begins."""
        self.ready()
        self.read_ready(p, q, out, doc_starts, base)

    def read_ready(self, p: int, q: int, out: np.ndarray, doc_starts: list[int] | None, base: int = 0) -> None:
        """:meth:`read` once :meth:`ready` was called in this process (a batch's rows)."""
        if not 0 <= p <= q <= self.total:
            raise ValueError(f"positions {p}..{q} should lie in the stream's 0..{self.total}")
        shard = bisect_right(self._starts, p) - 1
        at = 0
        while p < q:
            lo, hi = self._starts[shard], self._starts[shard + 1]
            a, b = p - lo, min(q, hi) - lo
            if b > a:
                self._read_shard(shard, a, b, out[at : at + b - a], doc_starts, base + at)
                at += b - a
            p = lo + b
            shard += 1

    def doc_offsets(self, shard: int) -> np.ndarray:
        """Where each document of ``shard`` begins in its tokens (int64, one more: the total)."""
        return np.frombuffer(self._offsets(shard), dtype=np.int64)

    def _offsets(self, shard: int) -> array[int]:
        """:meth:`doc_offsets` as an array (bisected and sliced into ints at no numpy call's cost)."""
        got = self._docs.get(shard)
        with self._lock:
            if got is not None:
                self._docs.move_to_end(shard)
                return got
            cum = np.zeros(self.source.shards[shard].nsamples + 1, dtype=np.int64)
            np.cumsum(_lengths(self.source.shards[shard].tokens), out=cum[1:])
            got = self._docs[shard] = array("q", cum.tobytes())
            if len(self._docs) > _MAX_SHARDS:
                self._docs.popitem(last=False)
            return got

    def _read_shard(self, shard: int, a: int, b: int, out: np.ndarray, doc_starts: list[int] | None, base: int) -> None:
        if self.verify and shard not in self._verified:
            with self._lock:
                self._check_shard(shard)
        cum = self._docs.get(shard) or self._offsets(shard)  # (a hit: no lock, the order of loading kept)
        d0 = bisect_right(cum, a) - 1
        ends = cum[d0 : bisect_right(cum, b - 1, d0) + 1].tolist()  # the documents' first tokens, the last one's end
        if doc_starts is not None:
            doc_starts.extend(base + f - a for f in ends[:-1] if f >= a)
        if self.chunk is None:
            self._read_samples(shard, d0, a, b, ends, out)
            return
        n = self.chunk
        d1 = d0 + len(ends) - 2
        for c in range(d0 // n, d1 // n + 1):
            j0, j1 = max(d0, c * n), min(d1, c * n + n - 1)
            first = ends[j0 - d0]
            t0 = max(a, first) - first
            t1 = min(b, ends[j1 - d0 + 1]) - ends[j1 - d0]
            self._read_chunk(shard, c, j0 - c * n, t0, j1 - c * n, t1, out[max(0, first - a) :])

    # -- per-sample layout ---------------------------------------------------------------------
    def _read_samples(self, shard: int, d0: int, a: int, b: int, ends: list[int], out: np.ndarray) -> None:
        """Documents ``d0..`` (first tokens ``ends``) cut to ``[a, b)``, one read: a document is read
        whole and checked the first time in this process (then marked), later only its tokens needed."""
        assert self._samples is not None  # noqa: S101 - set for the per-sample layout
        docs = range(d0, d0 + len(ends) - 1)
        with self._lock:  # (SampleBytes keeps its tables for one thread)
            marks = self._checked_marks(shard)
            table = self._samples.ranges(shard)
            fresh = [d for d in docs if not marks[d >> 3] >> (d & 7) & 1]
            for d in fresh:  # claimed now: a row of the same batch on another thread reads only its range
                marks[d >> 3] |= 1 << (d & 7)
        try:
            self._read_docs(shard, docs, fresh, table, a, b, ends, out)
        except BaseException:
            with self._lock:  # not checked after all
                for d in fresh:
                    marks[d >> 3] &= ~(1 << (d & 7))
            raise

    def _read_docs(
        self,
        shard: int,
        docs: range,
        fresh: list[int],
        table: SampleRanges,
        a: int,
        b: int,
        ends: list[int],
        out: np.ndarray,
    ) -> None:
        """:meth:`_read_samples`' read: the ``fresh`` documents whole, and checked."""
        d0 = docs[0]
        starts, it, skip = table.ends, self.dtype.itemsize, BLOCK + NPY_HEADER
        d1, s0, s1 = docs[-1], a - ends[0], b - ends[-2]
        lo = starts[d0] if fresh and fresh[0] == d0 else starts[d0] + skip + s0 * it
        hi = starts[d1 + 1] if fresh and fresh[-1] == d1 else starts[d1] + skip + s1 * it
        if self._remote[shard]:
            raw, base = self._pread(shard, lo, hi, None), lo
            view, tokens = memoryview(raw), np.frombuffer(raw, dtype=self.dtype, count=(hi - lo) // it)
        else:  # slices of the mapped file
            mapped, tokens = self._mapped(shard)
            if hi > len(mapped):
                raise ShardFormatError(
                    f"truncated: bytes {lo}-{hi - 1}, the file ends at {len(mapped)}", shard=self.urls[shard]
                )
            view, base = mapped.data, 0
        for d in fresh:
            n = ends[d - d0 + 1] - ends[d - d0]
            self._check_sample(shard, d, view[starts[d] - base : starts[d + 1] - base], n, table)
        at = 0
        for k, d in enumerate(docs):
            t0 = s0 if k == 0 else 0
            t1 = s1 if d == d1 else ends[k + 1] - ends[k]
            pos = (starts[d] + skip + t0 * it - base) // it
            out[at : at + t1 - t0] = tokens[pos : pos + t1 - t0]
            at += t1 - t0

    def _checked_marks(self, shard: int) -> bytearray:
        """One bit per document of ``shard``: checked whole in this process (the shards most
        recently read are kept)."""
        got = self._checked.get(shard)
        if got is not None:
            self._checked.move_to_end(shard)
            return got
        got = self._checked[shard] = bytearray((self.source.shards[shard].nsamples + 7) // 8)
        if len(self._checked) > _MAX_SHARDS:
            self._checked.popitem(last=False)
        return got

    def _check_sample(self, shard: int, d: int, one: memoryview, n: int, table: SampleRanges) -> None:
        """Document ``d``'s tar bytes ``one`` against the index: its CRC-32 (a file) or SHA-256
        prefix (a server), then its member's name, size (``n`` tokens) and ``.npy`` header."""
        url, remote = self.urls[shard], self._remote[shard]
        if sample_digest(one) != table[d][2] if remote else zlib.crc32(one) != table.crcs[d]:
            raise changed_sample(d, table.ends[d], table.ends[d + 1], url=url, key=sample_key(one), remote=remote)
        head = bytes(one[: BLOCK + NPY_HEADER])
        want = NPY_HEADER + n * self.dtype.itemsize
        try:  # the name and size fields as header_fields reads them, without its call (the common case)
            ok = int(head[124:136].split(b"\x00", 1)[0].strip(b" ") or b"0", 8) == want
        except ValueError:  # (base-256: read below)
            ok = False
        if ok and head[:100].split(b"\x00", 1)[0].endswith(self._suffix) and head[BLOCK:] == self._headers.get(n):
            return  # (a header not cached yet, or any mismatch: checked below, naming the key)
        name, size, _, _ = header_fields(head[:BLOCK])
        key = name.decode("utf-8", "replace").partition(".")[0]
        if not name.endswith(self._suffix) or size != want:
            raise ShardFormatError(
                f"document {d}: member {name!r} of {size} bytes, the index says {self.field!r} of {n} tokens",
                shard=url,
                key=key,
            )
        self._check_header(one[BLOCK : BLOCK + NPY_HEADER], n, shard, key)

    # -- chunked layout ------------------------------------------------------------------------
    def _read_chunk(self, shard: int, c: int, j0: int, t0: int, j1: int, t1: int, out: np.ndarray) -> None:
        """Tokens ``t0..`` of document ``j0`` to ``..t1`` of document ``j1`` of chunk ``c`` into
        ``out``: one read, then one copy (or one a document, past the headers between them)."""
        data_at, key, firsts, lengths, headers = self._chunks.get((shard, c)) or self._chunk(shard, c)
        it = self.dtype.itemsize
        if not self._remote[shard]:  # slices of the mapped file (its headers were checked with the chunk)
            tokens, at = self._mapped(shard)[1], 0
            if (data_at + firsts[j1]) // it + t1 > len(tokens):  # cut since the chunk was found
                raise ShardFormatError(
                    f"truncated: the file ends at byte {len(tokens) * it}, inside a chunk",
                    shard=self.urls[shard],
                    key=key,
                )
            for j in range(j0, j1 + 1):
                s0, s1 = t0 if j == j0 else 0, t1 if j == j1 else lengths[j]
                pos = (data_at + firsts[j]) // it + s0
                out[at : at + s1 - s0] = tokens[pos : pos + s1 - s0]
                at += s1 - s0
            return
        head = NPY_HEADER if headers and t0 == 0 else 0
        lo = firsts[j0] + t0 * it - head
        raw = self._pread(shard, data_at + lo, data_at + firsts[j1] + t1 * it, key)
        if head:
            self._check_header(raw[:NPY_HEADER], lengths[j0], shard, key)
        if not headers or j0 == j1:  # the tokens are contiguous
            out[: (len(raw) - head) // it] = np.frombuffer(raw, dtype=self.dtype, offset=head)
            return
        tokens = np.frombuffer(raw, dtype=self.dtype)
        at, pos = lengths[j0] - t0, head // it
        out[:at] = tokens[pos : pos + at]
        for j in range(j0 + 1, j1 + 1):
            pos = (firsts[j] - lo) // it
            self._check_header(raw[pos * it - NPY_HEADER : pos * it], lengths[j], shard, key)
            k = t1 if j == j1 else lengths[j]
            out[at : at + k] = tokens[pos : pos + k]
            at += k

    def _check_shard(self, shard: int) -> None:
        """``shard``'s SHA-256 against the index's (once per process); ShardFormatError naming it."""
        if shard in self._verified:
            return
        info, url = self.source.shards[shard], self.urls[shard]
        if not info.sha256:
            raise ShardFormatError("verify=True needs the shard's sha256 from the split index: none", shard=url)
        try:
            if is_remote(url):  # fetched whole into the cache, checked against the sha256 on arrival
                open_shard(url, fetch=self.source.fetch, filesize=info.filesize, sha256=info.sha256).close()
                found = info.sha256
            else:
                with open(local_path(url), "rb") as f:
                    found = file_sha256(f)
        except (OSError, ShardFetchError) as e:
            raise ShardFormatError(f"cannot check the shard's sha256: {e}", shard=url) from e
        if found != info.sha256:
            raise ShardFormatError(
                f"sha256 {found} does not match the index's {info.sha256} (corrupt or replaced; "
                "`shardify verify` checks every shard)",
                shard=url,
            )
        self._verified.add(shard)

    # -- bytes ---------------------------------------------------------------------------------
    def _pread(self, shard: int, a: int, b: int, key: str | None) -> bytes:
        url = self.urls[shard]
        if self._remote[shard]:
            fetch = self.source.fetch
            try:
                data = fetch_range(url, a, b, retry=fetch.retry, storage_options=fetch.storage_options)
            except ShardFetchError as e:
                raise ShardFormatError(f"cannot fetch bytes {a}-{b - 1}: {e.reason}", shard=url, key=key) from e
        else:
            try:
                fd = self._fds.get(shard)  # (local rows are read by one thread)
                if fd is None:
                    fd = self._fds[shard] = os.open(local_path(url), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                    if len(self._fds) > MAX_OPEN:
                        os.close(self._fds.popitem(last=False)[1])
                data = os.pread(fd, b - a, a)
            except OSError as e:
                raise ShardFormatError(f"cannot read bytes {a}-{b - 1}: {e}", shard=url, key=key) from e
        if len(data) != b - a:
            raise ShardFormatError(f"truncated: bytes {a}-{b - 1} hold only {len(data)}", shard=url, key=key)
        return data


def _lengths(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, dtype="<u4").astype(np.int64)
