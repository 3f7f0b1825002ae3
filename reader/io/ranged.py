"""Ranged reads of remote shards: each process fetches only the bytes of the samples it reads.

A split index written by this shardify lists, per shard, each sample's length and digest
(:mod:`shardify.sampletable`), inline or in a sidecar file (:mod:`~shardify.reader.io.sidecars`).
Given the reads a worker will make, in order (the plan knows them), :class:`RangeFetcher`
loads the sidecars of the next ``requests`` shards in its pool, coalesces reads that touch in
the same shard into one request (up to ``max_request_bytes``), fetches them with at most
``requests`` requests in flight ahead of use (:func:`~shardify.remote.fetch_range`: exact
ranges, retried), and checks every sample's bytes against the index's digest on arrival: a
mismatch is a :class:`~shardify.errors.SampleChecksumError` naming the shard and the sample's
key, for that position only (the request's other samples are used). Memory holds at most
``requests`` requests' bytes, the tables of the shards they and the
loads ahead are for, and the most recently used others up to ``table_cache_bytes``. A read
that was not announced is fetched alone.

A host that ignores ``Range`` is read whole (:mod:`~shardify.reader.io.wholehost`), samples still
checked. Fetch threads are daemons (:mod:`~shardify.reader.io.fetchpool`); :meth:`RangeFetcher.cancel`
aborts the requests in flight (shuts their sockets), so none outlives the reads it was made for.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections import Counter, OrderedDict, deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Any

from shardify.errors import SampleChecksumError, ShardFormatError
from shardify.reader.io.cache import FetchOptions
from shardify.reader.io.fetchpool import DaemonPool
from shardify.reader.io.items import READ_ERRORS, Item, changed_sample, damage, sample_key
from shardify.reader.io.sampleparse import parse_sample
from shardify.reader.io.shardfile import ShardFiles, Table
from shardify.reader.io.shardlist import distinct_values
from shardify.reader.io.wholehost import Opener, range_of_whole, read_whole_from, reads_whole
from shardify.remote import Abort, RangeNotSupported, fetch_range
from shardify.sampletable import RECORD, SampleRanges, SampleTable, sample_digest

__all__ = ["RangeFetcher", "RangeStats", "read_ranged"]

log = logging.getLogger("shardify.reader")

Run = tuple[int, int, int]
"""``(shard, start, stop)``: samples ``start..stop-1`` of a shard, read in one go."""
Fetched = tuple[bytes, dict[int, SampleChecksumError]]
"""A request's bytes and its samples that do not match the index, by position."""
STOP_WAIT_S = 1.0
"""How long :meth:`RangeFetcher.cancel` waits for the aborted requests to end."""


@dataclass
class RangeStats:
    """What one process fetched: ``requests`` made and body ``bytes`` received."""

    requests: int = 0
    bytes: int = 0


@dataclass
class _Request:
    shard: int
    first: int  # first sample
    last: int  # one past the last sample
    start: int  # bytes
    stop: int
    future: Future[Fetched] | None = None
    abort: Abort = field(default_factory=Abort)
    runs: deque[Run] = field(default_factory=deque)


def _table_bytes(ranges: SampleRanges) -> int:
    return len(ranges) * RECORD.size  # the table's records: what it weighs against the budget


class RangeFetcher:
    """Sample bytes of the shards ``urls`` that have a table in ``tables`` (empty: not read
    here; a callable: loads it, in the pool, up to ``requests`` shards ahead of the reads),
    fetched with ``fetch`` (its retry policy, storage options and ``requests``). The tables of
    shards with reads announced or in flight are kept; of the others, the most recently used
    up to ``table_cache_bytes`` (records' bytes); one dropped is loaded again when needed."""

    def __init__(
        self,
        urls: Sequence[str],
        tables: Sequence[Table],
        fetch: Sequence[FetchOptions],
        *,
        openers: Sequence[Opener] | None = None,
        max_request_bytes: int = 1 << 20,
        table_cache_bytes: int = 32 << 20,
    ) -> None:
        if not len(urls) == len(tables) == len(fetch):
            raise ValueError(f"{len(urls)=}, {len(tables)=} and {len(fetch)=} should be equal, one per shard")
        if table_cache_bytes < 0:
            raise ValueError(f"{table_cache_bytes=} should be >= 0")
        # kept as given: a compact index's columns make each shard's value on access
        self._urls, self._tables, self._fetch, self._openers = urls, tables, fetch, openers
        options = distinct_values(fetch)
        self._failed: dict[int, ShardFormatError] = {}  # tables that could not be loaded
        self._max = max_request_bytes
        self._runs: deque[Run] = deque()  # announced, tables not yet asked for
        self._window: deque[Run] = deque()  # announced, tables asked for, not yet made requests
        self._window_shards: Counter[int] = Counter()  # the window's runs per shard (at most `requests` shards)
        self._ahead: deque[_Request] = deque()  # submitted, in announced order
        self._pool: DaemonPool | None = None
        self._requests = max((f.requests for f in options), default=1)
        # Tables, touched by the worker's thread only (a pool thread gets the ranges it needs
        # with its task): a shard is pinned by each of its runs in the window or in requests
        # ahead, and while it is the shard last read (``offset`` follows ``samples``).
        self._pins: Counter[int] = Counter()
        self._held: dict[int, SampleRanges] = {}  # loaded, of pinned shards
        self._loads: dict[int, Future[SampleRanges]] = {}  # loading in the pool, of pinned shards
        self._lru: OrderedDict[int, SampleRanges] = OrderedDict()  # loaded, of the others, oldest first
        self._lru_bytes, self._budget = 0, table_cache_bytes
        self._current: tuple[int, SampleRanges] | None = None
        self._abandoned: list[Future[SampleRanges]] = []  # loads no longer wanted, still running
        self.stats = RangeStats()
        self._lock = threading.Lock()

    def covers(self, shard: int) -> bool:
        """Whether ``shard`` is read in ranges here."""
        return bool(self._tables[shard])

    def offset(self, shard: int, i: int) -> int:
        """The byte offset of sample ``i`` of ``shard``."""
        return self._sample_ranges(shard)[i][0]

    def _load(self, shard: int) -> SampleRanges:
        table = self._tables[shard]
        return SampleTable(table() if callable(table) else table).ranges()

    def _sample_ranges(self, shard: int) -> SampleRanges:
        """The ranges of ``shard``'s samples: kept, loading (waited for), or loaded now (a table
        that failed to load raises its error again, without another fetch)."""
        if self._current is not None and self._current[0] == shard:
            return self._current[1]
        found = self._held.get(shard)
        if found is not None:
            return found
        if shard in self._failed:
            raise self._failed[shard]
        load = self._loads.get(shard)
        try:
            if load is not None:
                found = self._held[shard] = load.result()
                del self._loads[shard]
                return found
            found = self._lru.get(shard)
            if found is not None:
                self._lru.move_to_end(shard)
                return found
            found = self._load(shard)  # not announced: loaded in this thread
        except ShardFormatError as e:
            self._failed[shard] = e
            self._loads.pop(shard, None)
            raise
        self._keep(shard, found)
        return found

    def _keep(self, shard: int, ranges: SampleRanges) -> None:
        """The table of a shard no longer pinned: most recently used; drops the least recently
        used above the budget."""
        self._lru[shard] = ranges
        self._lru_bytes += _table_bytes(ranges)
        while self._lru_bytes > self._budget and self._lru:
            self._lru_bytes -= _table_bytes(self._lru.popitem(last=False)[1])

    def _pin(self, shard: int, ranges: SampleRanges | None = None) -> None:
        """One more reason to keep ``shard``'s table (``ranges``, when the caller has it); the
        first one loads it, in the pool when it is a sidecar."""
        self._pins[shard] += 1
        if self._pins[shard] > 1 or shard in self._failed:
            return
        found = self._lru.pop(shard, None)
        if found is not None:
            self._lru_bytes -= _table_bytes(found)
            self._held[shard] = found
        elif ranges is not None:
            self._held[shard] = ranges
        elif callable(self._tables[shard]):
            self._loads[shard] = self._executor().submit(self._load, shard)
        else:  # an inline table: nothing to wait for
            self._held[shard] = self._load(shard)

    def _unpin(self, shard: int) -> None:
        self._pins[shard] -= 1
        if self._pins[shard]:
            return
        del self._pins[shard]
        found = self._held.pop(shard, None)
        load = self._loads.pop(shard, None)
        if load is not None and not load.cancel():
            if load.done() and load.exception() is None:
                found = load.result()
            elif not load.done():
                self._abandoned.append(load)  # waited for by cancel()
        if found is not None:
            self._keep(shard, found)

    def _current_is(self, shard: int, ranges: SampleRanges) -> None:
        """``shard`` is being read: its table stays while ``offset`` may ask for it."""
        if self._current is not None and self._current[0] == shard:
            return
        self._pin(shard, ranges)
        if self._current is not None:
            self._unpin(self._current[0])
        self._current = shard, ranges

    def announce(self, runs: Iterable[Run]) -> None:
        """The reads to come, in order (those of shards not read here are passed over); the
        tables of the first ``requests`` shards start loading."""
        self.cancel()
        self._runs.extend(r for r in runs if r[2] > r[1] and self.covers(r[0]))
        self._fill()

    def _fill(self) -> None:
        """Ask for the tables of the next announced runs, up to ``requests`` shards ahead of the
        request being built."""
        while self._runs and (len(self._window_shards) < self._requests or self._runs[0][0] in self._window_shards):
            run = self._runs.popleft()
            self._window.append(run)
            self._window_shards[run[0]] += 1
            self._pin(run[0])

    def _take(self) -> Run:
        """The next run of the window (it stays pinned, now by its request)."""
        run = self._window.popleft()
        self._window_shards[run[0]] -= 1
        if not self._window_shards[run[0]]:
            del self._window_shards[run[0]]
        return run

    def _next_request(self) -> _Request | None:
        """The next request of the announced reads: its next runs that touch in one shard (up to the
        request size). A shard whose table cannot be loaded stays among them as a request that
        failed with its error, raised where its read is made; the reads after it keep their place."""
        self._fill()
        if not self._window:
            return None
        shard, a, b = run = self._take()
        self._fill()
        try:
            ranges = self._sample_ranges(shard)  # waits only for a table not yet loaded
        except ShardFormatError as e:
            failed: Future[Fetched] = Future()
            failed.set_exception(e)
            return _Request(shard, a, b, 0, 0, future=failed, runs=deque([run]))
        req = _Request(shard, a, b, ranges[a][0], ranges[b - 1][1], runs=deque([run]))
        while self._window and self._window[0][0] == shard and self._window[0][1] == req.last:
            nxt = self._window[0][2]
            if ranges[nxt - 1][1] - req.start > self._max:
                break
            req.last, req.stop = nxt, ranges[nxt - 1][1]
            req.runs.append(self._take())
            self._fill()
        return req

    def samples(self, shard: int, start: int, stop: int) -> list[bytes | SampleChecksumError]:
        """The checked bytes of samples ``start..stop-1`` of ``shard`` (the error of each that
        does not match the index)."""
        self._top_up()
        while self._ahead:
            req = self._ahead[0]
            if req.runs and req.runs[0] == (shard, start, stop):
                req.runs.popleft()
                try:
                    data = self._result(req)
                    self._current_is(shard, self._sample_ranges(shard))
                finally:
                    self._unpin(shard)
                if not req.runs:
                    self._ahead.popleft()
                    self._top_up()
                return self._slice(req, data, start, stop)
            self._drop(self._ahead.popleft())  # read out of order (a resume, an error): forget it
            self._top_up()
        ranges = self._sample_ranges(shard)
        self._current_is(shard, ranges)
        req = _Request(shard, start, stop, ranges[start][0], ranges[stop - 1][1])
        return self._slice(req, self._get(req, ranges), start, stop)

    def _result(self, req: _Request) -> Fetched:
        return req.future.result() if req.future is not None else self._get(req, self._sample_ranges(req.shard))

    def _slice(self, req: _Request, got: Fetched, start: int, stop: int) -> list[bytes | SampleChecksumError]:
        ranges, (data, bad) = self._sample_ranges(req.shard), got
        return [bad.get(i) or data[ranges[i][0] - req.start : ranges[i][1] - req.start] for i in range(start, stop)]

    def _executor(self) -> DaemonPool:
        if self._pool is None:
            self._pool = DaemonPool(self._requests, "shardify-ranges")
        return self._pool

    def _top_up(self) -> None:
        while len(self._ahead) < self._requests:
            req = self._next_request()
            if req is None:
                return
            if req.future is None:  # (a failed table's request comes with its error)
                req.future = self._executor().submit(self._get, req, self._sample_ranges(req.shard))
            self._ahead.append(req)

    def _get(self, req: _Request, ranges: SampleRanges) -> Fetched:
        """Fetch ``req`` and check each of its samples against ``ranges``, its shard's table
        (in a pool thread: the table comes with the task, whatever the worker's thread drops)."""
        url, fetch = self._urls[req.shard], self._fetch[req.shard]
        openers = self._openers
        if openers is not None and reads_whole(url):
            data = range_of_whole(openers[req.shard], url, req.start, req.stop)
        else:
            try:
                data = fetch_range(
                    url,
                    req.start,
                    req.stop,
                    retry=fetch.retry,
                    storage_options=fetch.storage_options,
                    abort=req.abort,
                    take_whole=openers is not None,  # the whole shard, if that is the answer: kept
                )
            except RangeNotSupported as e:
                if openers is None:
                    raise
                read_whole_from(url)
                data = range_of_whole(openers[req.shard], url, req.start, req.stop, e.body)
        with self._lock:
            self.stats.requests += 1
            self.stats.bytes += len(data)
        bad: dict[int, SampleChecksumError] = {}
        for i in range(req.first, req.last):
            a, b, digest = ranges[i]
            one = memoryview(data)[a - req.start : b - req.start]
            if sample_digest(one) != digest:
                bad[i] = changed_sample(i, a, b, url=url, key=sample_key(one), remote=True)
        return data, bad

    def _drop(self, req: _Request) -> None:
        req.abort.fire()
        if req.future is not None:
            req.future.cancel()
        while req.runs:
            self._unpin(req.runs.popleft()[0])

    def cancel(self) -> None:
        """Forget the announced reads; aborts the requests in flight and waits (up to
        :data:`STOP_WAIT_S`) for them and the table loads to end."""
        running: list[Future[Any]] = [r.future for r in self._ahead if r.future is not None]
        for req in self._ahead:
            self._drop(req)
        self._ahead.clear()
        while self._window:
            self._unpin(self._take()[0])
        self._runs.clear()
        running += self._abandoned
        self._abandoned = []
        if running and not sys.is_finalizing():  # (at exit, daemon threads no longer run: nothing to wait for)
            wait(running, timeout=STOP_WAIT_S)

    def close(self) -> None:
        self.cancel()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


def read_ranged(ranged: RangeFetcher, files: ShardFiles, shard: int, start: int, stop: int) -> Iterator[Item]:
    """Positions ``start..stop-1`` of ``shard`` from its checked byte ranges."""
    url, index = files.urls[shard], start
    try:
        for data in ranged.samples(shard, start, stop):
            if isinstance(data, SampleChecksumError):
                yield from files.lost(shard, index, index + 1, data)
            else:
                yield parse_sample(
                    data, url=url, offset=ranged.offset(shard, index), keep=files.keep, max_member=files.max_member
                )
            index += 1
    except (ShardFormatError, *READ_ERRORS) as e:
        yield from files.lost(shard, index, stop, damage(url, e), e)
