"""Random access to samples' bytes by the split index's per-sample table: no tar scan.

:class:`SampleBytes` gives the checked tar bytes of any samples of a source's shards: their
byte ranges come from each shard's table (:mod:`shardify.sampletable`; inline, a sidecar or a
compact index's sidecar, loaded when a shard is first touched). A local shard is read with
``os.pread``, or for a batch memory-mapped (files kept open and mapped by
:class:`~shardify.reader.io.mapfiles.OpenShards`), each sample
checked against its CRC-32; a remote one by ranged requests (:func:`~shardify.remote.fetch_range`,
with the source's retries), each sample checked against its SHA-256 prefix, or with ``whole``
fetched whole into the node's cache on first touch (checked by its SHA-256), then read and
checked as a local file. The samples of one call are grouped by shard, neighbours within
``gap_bytes`` coalesced into one read (``remote_gap_bytes`` for a ranged shard: a request's
latency costs more than the bytes between; up to ``max_request_bytes``), and remote requests run
concurrently (``threads``); :meth:`SampleBytes.prefetch` starts a later batch's ranged requests
early, for the read that asks for them. :meth:`SampleBytes.gather` puts a batch's samples one after another
in one buffer (each copied straight into its place, CRC-32s compared as one array). A sample that
does not match comes back as a :class:`~shardify.errors.SampleChecksumError` naming the shard
and key, for its position only; a file shorter than its table is a :class:`ShardFormatError`
naming it.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardify.crc import crc32
from shardify.errors import SampleChecksumError, ShardFormatError
from shardify.reader.io.fetchpool import DaemonPool
from shardify.reader.io.items import changed_sample, sample_key
from shardify.reader.io.mapfiles import OpenShards, gzip_refused
from shardify.reader.io.rangeplan import Run, request_groups, sample_runs
from shardify.reader.io.shardfile import Table
from shardify.reader.io.shardopen import is_gzip
from shardify.reader.io.source import Source
from shardify.reader.io.tablesetup import sample_tables
from shardify.remote import (
    MultiRangeRefused,
    ShardFetchError,
    fetch_range,
    fetch_ranges,
    is_remote,
    multi_range_ok,
)
from shardify.sampletable import SampleRanges, sample_digest

__all__ = ["SampleBytes", "Got", "Gathered"]

Got = bytes | SampleChecksumError
"""A sample's checked tar bytes, or why they do not match the index."""
Reads = dict[tuple[int, int], Got]
"""Samples read, by ``(shard, position)``."""
Task = tuple[Callable[..., Reads], tuple[Any, ...], list[Run]]
"""A request: its function, its arguments and the runs it reads."""


@dataclass(frozen=True, slots=True)
class Gathered:
    """A batch's checked tar bytes, one sample after another in ``data`` (``uint8``): sample
    ``j`` is ``data[at[j]:at[j + 1]]``, found at byte ``offsets[j]`` of its shard; ``bad[j]``:
    why sample ``j`` does not match (its bytes left out)."""

    data: np.ndarray
    at: np.ndarray
    offsets: np.ndarray
    bad: dict[int, SampleChecksumError]


_MAX_TABLES = 4096
"""Shard tables kept per process (the most recently used)."""

MULTI_RANGE_GAP_BYTES = 4 << 10
"""Neighbours closer than this are one range of a multi-range request (a range costs its part's
headers, about 100 bytes, and their parse)."""

MAX_AHEAD = 1 << 16
"""Samples fetched ahead (:meth:`SampleBytes.prefetch`) kept per process, waiting to be read."""


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
        whole: bool = False,
    ) -> None:
        if threads < 1 or min(gap_bytes, remote_gap_bytes) < 0 or max_request_bytes < 1:
            raise ValueError(
                f"{threads=} should be >= 1, {gap_bytes=} and {remote_gap_bytes=} >= 0, {max_request_bytes=} >= 1"
            )
        self.source = source
        self._threads, self._max = threads, max_request_bytes
        self._gap, self._remote_gap = gap_bytes, remote_gap_bytes
        self._whole = whole
        self._reset()

    def _reset(self) -> None:
        self.urls = self.source.urls  # (a tuple source's builds a list: once per process, not per sample)
        self._pid = os.getpid()
        self._tables: Sequence[Table] | None = None
        self._ranges: OrderedDict[int, SampleRanges] = OrderedDict()
        self._files = OpenShards(self.source)
        self._pool: DaemonPool | None = None
        self._ahead: OrderedDict[tuple[int, int], Future[Reads]] = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        keep = ("source", "_threads", "_max", "_gap", "_remote_gap", "_whole")
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
        if is_gzip(self.urls[shard]):
            raise gzip_refused(self.urls[shard])
        if not raw:
            raise ShardFormatError(
                "has no per-sample table (shards listed without a split index, or written by an older shardify): "
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
        """The bytes of each ``(shard, position)`` of ``wanted``, in that order (those fetched
        ahead, :meth:`prefetch`, taken from there)."""
        self._check_pid()
        got: dict[tuple[int, int], Got] = {}
        ahead: dict[Future[Reads], None] = {}  # (in order, each once)
        rest = list(wanted)
        if self._ahead:
            rest = []
            for w in wanted:
                future = self._ahead.pop(w, None)
                if future is None:
                    rest.append(w)
                else:
                    ahead[future] = None
        runs = self._runs(rest)
        tasks = self._remote_tasks([r for r in runs if self._ranged(r[0])])
        if len(tasks) > 1:
            for future in [self._pooled().submit(fn, *args) for fn, args, _ in tasks]:
                got.update(future.result())
        elif tasks:
            fn, args, _ = tasks[0]
            got.update(fn(*args))
        for run in runs:
            if not self._ranged(run[0]):
                got.update(self._read_run(run))
        for future in ahead:
            got.update(future.result())
        return [got[w] for w in wanted]

    def prefetch(self, wanted: Sequence[tuple[int, int]]) -> None:
        """Start fetching the samples of ``wanted`` read by ranged requests, for a later
        :meth:`read` to take (up to :data:`MAX_AHEAD` samples kept; the oldest dropped). A
        failed fetch is raised by the read that takes it, as if it were fetched then."""
        self._check_pid()
        new = [w for w in dict.fromkeys(wanted) if w not in self._ahead and self._ranged(w[0])]
        for fn, args, runs in self._remote_tasks(self._runs(new)):
            future = self._pooled().submit(fn, *args)
            for shard, positions in runs:
                for p in positions:
                    self._ahead[(shard, p)] = future
        while len(self._ahead) > MAX_AHEAD:
            self._ahead.popitem(last=False)

    def _runs(self, wanted: Sequence[tuple[int, int]]) -> list[Run]:
        """``wanted`` as runs ``(shard, sorted positions)``, each one read (:func:`sample_runs`)."""
        return sample_runs(wanted, lambda s: self.ranges(s).ends, self._gap_of, self._max)

    def _gap_of(self, shard: int) -> int:
        """The gap up to which samples of ``shard`` are read as one range: ``gap_bytes`` locally;
        remotely small where one request carries many ranges (a range costs its part's
        headers), else ``remote_gap_bytes`` (a range costs a request)."""
        if not self._ranged(shard):
            return self._gap
        return min(self._remote_gap, MULTI_RANGE_GAP_BYTES) if multi_range_ok(self.urls[shard]) else self._remote_gap

    def _remote_tasks(self, runs: list[Run]) -> list[Task]:
        """The requests of ranged ``runs`` (:func:`request_groups`), as ``(function, args, runs)``."""
        tasks: list[Task] = []
        for group in request_groups(runs, lambda s: self.ranges(s).ends, lambda s: multi_range_ok(self.urls[s])):
            if len(group) == 1:
                tasks.append((self._read_run, (group[0],), group))
            else:
                tasks.append((self._read_runs, (group[0][0], group), group))
        return tasks

    def _read_run(self, run: Run) -> Reads:
        shard, positions = run
        ranges = self._ranges.get(shard) or self.ranges(shard)  # (a pool thread: loaded by _runs)
        url = self.urls[shard]
        a, b = ranges.ends[positions[0]], ranges.ends[positions[-1] + 1]
        remote = self._ranged(shard)
        data = self._fetch(url, a, b) if remote else self._pread(shard, url, a, b)
        out: Reads = {}
        _check(ranges, url, shard, positions, data, a, out, remote=remote)
        return out

    def _read_runs(self, shard: int, runs: list[Run]) -> Reads:
        """The ranged ``runs`` of ``shard`` in one multi-range request (one request a run when
        its host refuses that: asked so once, then remembered)."""
        ranges = self._ranges.get(shard) or self.ranges(shard)
        url = self.urls[shard]
        spans = [(ranges.ends[r[1][0]], ranges.ends[r[1][-1] + 1]) for r in runs]
        fetch = self.source.fetch
        try:
            datas = fetch_ranges(url, spans, retry=fetch.retry, storage_options=fetch.storage_options)
        except MultiRangeRefused:
            datas = [self._fetch(url, a, b) for a, b in spans]
        except ShardFetchError as e:
            raise ShardFormatError(f"cannot fetch {len(spans)} ranges: {e.reason}", shard=url) from e
        out: Reads = {}
        for run, data, (a, _) in zip(runs, datas, spans):
            _check(ranges, url, shard, run[1], data, a, out, remote=True)
        return out

    def _fetch(self, url: str, a: int, b: int) -> bytes:
        fetch = self.source.fetch
        try:
            return fetch_range(url, a, b, retry=fetch.retry, storage_options=fetch.storage_options)
        except ShardFetchError as e:
            raise ShardFormatError(f"cannot fetch bytes {a}-{b - 1}: {e.reason}", shard=url) from e

    def _pread(self, shard: int, url: str, a: int, b: int) -> bytes:
        fd = self._files.fd(shard)
        try:
            data = os.pread(fd, b - a, a)
        except OSError as e:
            raise ShardFormatError(f"cannot read bytes {a}-{b - 1}: {e}", shard=url) from e
        if len(data) != b - a:
            raise _truncated(url, a, b, len(data))
        return data

    def _ranged(self, shard: int) -> bool:
        """Whether shard ``shard`` is read by ranged requests (remote, not fetched whole)."""
        return not self._whole and is_remote(self.urls[shard])

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Run ``fn(*args)`` on this process's fetch threads."""
        return self._pooled().submit(fn, *args)

    def _pooled(self) -> DaemonPool:
        if self._pool is None:
            self._pool = DaemonPool(self._threads, "shardify-mapview")  # never holds the process at exit
        return self._pool

    def gather(self, shards: np.ndarray, positions: np.ndarray) -> Gathered:
        """The checked bytes of samples ``(shards[j], positions[j])``, in that order, in one buffer."""
        self._check_pid()
        n = len(shards)
        order = np.argsort(shards, kind="stable")
        groups = np.split(order, np.flatnonzero(np.diff(shards[order])) + 1) if n else []
        a, b, crc = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.uint32)
        for g in groups:
            ranges = self.ranges(int(shards[g[0]]))
            ends, p = np.frombuffer(ranges.ends, np.int64), positions[g]
            a[g], b[g], crc[g] = ends[p], ends[p + 1], np.frombuffer(ranges.crcs, np.uint32)[p]
        at = np.zeros(n + 1, np.int64)
        np.cumsum(b - a, out=at[1:])
        parts: list[bytes] = [b""] * n
        bad: dict[int, SampleChecksumError] = {}
        ranged = [g for g in groups if self._ranged(int(shards[g[0]]))]
        if ranged:
            js = np.concatenate(ranged).tolist()
            for j, got in zip(js, self.read(list(zip(shards[js].tolist(), positions[js].tolist())))):
                if isinstance(got, SampleChecksumError):
                    bad[j], parts[j] = got, bytes(int(at[j + 1] - at[j]))
                else:
                    parts[j] = got
        local = [g for g in groups if not self._ranged(int(shards[g[0]]))]
        self._files.open_many([int(shards[g[0]]) for g in local], self._pooled().submit)
        starts, stops = a.tolist(), b.tolist()
        for g in local:
            self._copy_checked(int(shards[g[0]]), g.tolist(), parts, starts, stops, crc[g], bad, positions)
        return Gathered(np.frombuffer(b"".join(parts), np.uint8), at, a, bad)

    def _copy_checked(
        self,
        shard: int,
        js: list[int],
        parts: list[bytes],
        starts: list[int],
        stops: list[int],
        crc: np.ndarray,
        bad: dict[int, SampleChecksumError],
        positions: np.ndarray,
    ) -> None:
        """Copy samples ``js`` of ``shard`` out of its memory map into ``parts``, then check their CRC-32s."""
        url = self.urls[shard]
        try:
            mapped = self._files.mapped(shard)
        except (OSError, ValueError) as e:
            raise ShardFormatError(f"cannot map it: {e}", shard=url) from e
        a, b = [starts[j] for j in js], [stops[j] for j in js]
        if max(b) > len(mapped):
            w = next(w for w, stop in enumerate(b) if stop > len(mapped))
            raise _truncated(url, a[w], b[w], max(0, len(mapped) - a[w]))
        pieces = list(map(mapped.__getitem__, map(slice, a, b)))
        for j, piece in zip(js, pieces):
            parts[j] = piece
        sums = np.array(list(map(crc32, pieces)), np.uint32)
        for w in np.flatnonzero(sums != crc).tolist():
            j = js[w]
            key = sample_key(parts[j])
            bad[j] = changed_sample(int(positions[j]), starts[j], stops[j], url=url, key=key, remote=False)

    def close(self) -> None:
        """Close this process's descriptors and threads (made again when next used)."""
        if os.getpid() == self._pid:
            self._files.close()
            if self._pool is not None:
                self._pool.shutdown()
        self._reset()


def _check(
    ranges: SampleRanges, url: str, shard: int, positions: list[int], data: bytes, a: int, out: Reads, *, remote: bool
) -> None:
    """The samples ``positions`` of ``shard`` (table ``ranges``, at ``url``) out of ``data``
    (its bytes from ``a``) into ``out``, each checked: against its SHA-256 prefix when
    ``remote``, else its CRC-32."""
    view = memoryview(data)
    ends, whole = ranges.ends, len(positions) == 1 and type(data) is bytes  # (one sample: its bytes as they are)
    for p in positions:
        s, e = ends[p], ends[p + 1]
        one = view[s - a : e - a]
        ok = sample_digest(one) == ranges.digest(p) if remote else crc32(one) == ranges.crcs[p]
        if ok:
            out[(shard, p)] = data if whole and e - s == len(data) else bytes(one)
        else:
            out[(shard, p)] = changed_sample(p, s, e, url=url, key=sample_key(one), remote=remote)


def _truncated(url: str, a: int, b: int, got: int) -> ShardFormatError:
    return ShardFormatError(
        f"truncated: bytes {a}-{b - 1} hold only {got} (the file is shorter than its index says)", shard=url
    )
