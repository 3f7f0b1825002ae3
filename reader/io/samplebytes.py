"""Random access to samples' bytes by the split index's per-sample table: no tar scan.

:class:`SampleBytes` gives the checked tar bytes of any samples of a source's shards: their
byte ranges come from each shard's table (:mod:`shardify.sampletable`; inline, a sidecar or a
compact index's sidecar, loaded when a shard is first touched). A local shard is read with
``os.pread`` (a descriptor per shard and process, the :data:`MAX_OPEN_FILES` most recently
used kept open, opened again after a fork), each sample
checked against its CRC-32; a remote one by ranged requests (:func:`~shardify.remote.fetch_range`,
with the source's retries), each sample checked against its SHA-256 prefix. The samples of one
call are grouped by shard, neighbours within ``gap_bytes`` coalesced into one read
(``remote_gap_bytes`` for a remote shard: a request's latency costs more than the bytes between;
up to ``max_request_bytes``), and remote requests run concurrently (``threads``). A sample that does
not match comes back as a :class:`~shardify.errors.SampleChecksumError` naming the shard and key,
for its position only; a file shorter than its table is a :class:`ShardFormatError` naming it.
"""

from __future__ import annotations

import os
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from shardify.errors import SampleChecksumError, ShardFormatError
from shardify.reader.io.fetchpool import DaemonPool
from shardify.reader.io.items import changed_sample, sample_key
from shardify.reader.io.shardfile import Table
from shardify.reader.io.shardopen import local_path
from shardify.reader.io.source import Source
from shardify.reader.io.tablesetup import sample_tables
from shardify.remote import ShardFetchError, fetch_range, is_remote
from shardify.sampletable import SampleRanges, sample_digest

__all__ = ["SampleBytes", "Got"]

Got = bytes | SampleChecksumError
"""A sample's checked tar bytes, or why they do not match the index."""

_MAX_TABLES = 4096
"""Shard tables kept per process (the most recently used)."""
MAX_OPEN_FILES = 128
"""Local shard files kept open per process (the most recently used; others closed)."""


class SampleBytes:
    """Checked sample bytes of ``source``'s shards by (shard, position); see the module.

    Picklable: what a process opens (descriptors, tables, threads) is left behind and made again
    where it is next used."""

    def __init__(
        self,
        source: Source,
        *,
        threads: int = 64,
        gap_bytes: int = 64 << 10,
        remote_gap_bytes: int = 256 << 10,
        max_request_bytes: int = 8 << 20,
    ) -> None:
        if threads < 1 or min(gap_bytes, remote_gap_bytes) < 0 or max_request_bytes < 1:
            raise ValueError(
                f"{threads=} should be >= 1, {gap_bytes=} and {remote_gap_bytes=} >= 0, {max_request_bytes=} >= 1"
            )
        self.source = source
        self._threads, self._max = threads, max_request_bytes
        self._gap, self._remote_gap = gap_bytes, remote_gap_bytes
        self._reset()

    def _reset(self) -> None:
        self.urls = self.source.urls  # (a tuple source's builds a list: once per process, not per sample)
        self._pid = os.getpid()
        self._tables: Sequence[Table] | None = None
        self._ranges: OrderedDict[int, SampleRanges] = OrderedDict()
        self._fds: OrderedDict[int, int] = OrderedDict()
        self._pool: DaemonPool | None = None

    def __getstate__(self) -> dict[str, Any]:
        keep = ("source", "_threads", "_max", "_gap", "_remote_gap")
        return {name: self.__dict__[name] for name in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def _check_pid(self) -> None:
        if os.getpid() != self._pid:  # a forked child: the parent's descriptors and threads are not ours
            self._reset()

    def ranges(self, shard: int) -> SampleRanges:
        """Shard ``shard``'s per-sample table; ShardFormatError when it has none."""
        self._check_pid()
        got = self._ranges.get(shard)
        if got is not None:
            self._ranges.move_to_end(shard)
            return got
        if self._tables is None:
            self._tables = sample_tables([self.source]) or ()
        table = self._tables[shard] if shard < len(self._tables) else b""
        raw = table() if callable(table) else table
        if not raw:
            raise ShardFormatError(
                "has no per-sample table (a chunked or gzip shard, or shards listed without a split index): "
                "random access needs one; convert with this shardify, or read it with ShardedDataset",
                shard=self.urls[shard],
            )
        got = SampleRanges(raw)
        self._ranges[shard] = got
        if len(self._ranges) > _MAX_TABLES:
            self._ranges.popitem(last=False)
        return got

    def offset(self, shard: int, position: int) -> int:
        """The byte offset of sample ``position`` of ``shard``."""
        return self.ranges(shard).ends[position]

    def read(self, wanted: Sequence[tuple[int, int]]) -> list[Got]:
        """The bytes of each ``(shard, position)`` of ``wanted``, in that order."""
        self._check_pid()
        runs = self._runs(wanted)
        remote = [r for r in runs if is_remote(self.urls[r[0]])]
        got: dict[tuple[int, int], Got] = {}
        if len(remote) > 1:
            if self._pool is None:
                self._pool = DaemonPool(self._threads, "shardify-mapview")  # never holds the process at exit
            futures = [self._pool.submit(self._read_run, run) for run in remote]
            for future in futures:
                got.update(future.result())
        for run in runs:
            if len(remote) <= 1 or not is_remote(self.urls[run[0]]):
                got.update(self._read_run(run))
        return [got[w] for w in wanted]

    def _runs(self, wanted: Sequence[tuple[int, int]]) -> list[tuple[int, list[int]]]:
        """``wanted`` as runs ``(shard, sorted positions)``, each one read."""
        runs: list[tuple[int, list[int]]] = []
        for shard, pos in sorted(set(wanted)):
            ends = self.ranges(shard).ends
            if runs and runs[-1][0] == shard:
                first, last = runs[-1][1][0], runs[-1][1][-1]
                gap = self._remote_gap if is_remote(self.urls[shard]) else self._gap
                if ends[pos] - ends[last + 1] <= gap and ends[pos + 1] - ends[first] <= self._max:
                    runs[-1][1].append(pos)
                    continue
            runs.append((shard, [pos]))
        return runs

    def _read_run(self, run: tuple[int, list[int]]) -> dict[tuple[int, int], Got]:
        shard, positions = run
        ranges = self._ranges.get(shard) or self.ranges(shard)  # (a pool thread: loaded by _runs)
        url = self.urls[shard]
        a, b = ranges.ends[positions[0]], ranges.ends[positions[-1] + 1]
        remote = is_remote(url)
        data = self._fetch(url, a, b) if remote else self._pread(shard, url, a, b)
        out: dict[tuple[int, int], Got] = {}
        view = memoryview(data)
        for p in positions:
            s, e = ranges.ends[p], ranges.ends[p + 1]
            one = view[s - a : e - a]
            ok = sample_digest(one) == ranges[p][2] if remote else zlib.crc32(one) == ranges.crcs[p]
            if ok:
                out[(shard, p)] = bytes(one)
            else:
                out[(shard, p)] = changed_sample(p, s, e, url=url, key=sample_key(one), remote=remote)
        return out

    def _fetch(self, url: str, a: int, b: int) -> bytes:
        fetch = self.source.fetch
        try:
            return fetch_range(url, a, b, retry=fetch.retry, storage_options=fetch.storage_options)
        except ShardFetchError as e:
            raise ShardFormatError(f"cannot fetch bytes {a}-{b - 1}: {e.reason}", shard=url) from e

    def _pread(self, shard: int, url: str, a: int, b: int) -> bytes:
        fd = self._fds.get(shard)
        try:
            if fd is None:
                fd = self._fds[shard] = os.open(local_path(url), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                if len(self._fds) > MAX_OPEN_FILES:
                    os.close(self._fds.popitem(last=False)[1])
            else:
                self._fds.move_to_end(shard)
            data = os.pread(fd, b - a, a)
        except OSError as e:
            raise ShardFormatError(f"cannot read bytes {a}-{b - 1}: {e}", shard=url) from e
        if len(data) != b - a:
            raise ShardFormatError(
                f"truncated: bytes {a}-{b - 1} hold only {len(data)} (the file is shorter than its index says)",
                shard=url,
            )
        return data

    def close(self) -> None:
        """Close this process's descriptors and threads (made again when next used)."""
        if os.getpid() == self._pid:
            for fd in self._fds.values():
                os.close(fd)
            if self._pool is not None:
                self._pool.shutdown()
        self._reset()
