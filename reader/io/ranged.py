"""Ranged reads of remote shards: each process fetches only the bytes of the samples it reads.

A split index written by this shardify lists, per shard, each sample's length and digest
(:mod:`shardify.sampletable`), inline or in a sidecar file (:mod:`~shardify.reader.io.sidecars`)
loaded when the first request of that shard is made. Given the reads a worker will make, in
order (the plan knows them), :class:`RangeFetcher` coalesces reads that touch in the same shard into one request
(up to ``max_request_bytes``), fetches them with at most ``requests`` requests in flight
ahead of use (:func:`~shardify.remote.fetch_range`: exact ranges, retried), and
checks every sample's bytes against the index's digest on arrival: a mismatch raises
:class:`~shardify.errors.ShardFormatError` naming the shard and the sample's key. Memory
holds at most ``requests`` requests' bytes. A read that was not planned is fetched alone.
"""

from __future__ import annotations

import io
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from shardify.errors import KeyRuleError, ShardFormatError
from shardify.keys import split_member_name
from shardify.reader.io.cache import FetchOptions
from shardify.reader.io.compact import CompactShards
from shardify.reader.io.items import READ_ERRORS, Item, damage
from shardify.reader.io.shardfile import ShardFiles
from shardify.reader.io.shardlist import ChainedSequence, LazySequence, Repeated, distinct_values
from shardify.reader.io.sidecars import table_loader
from shardify.reader.io.sources import Source, is_gzip
from shardify.remote import fetch_range, is_remote
from shardify.sampletable import SampleRanges, SampleTable, sample_digest
from shardify.sidecar import SidecarRef
from shardify.tario import KeepMember, iter_members, iter_samples

__all__ = ["RangeFetcher", "RangeStats", "parse_sample", "range_fetcher", "read_ranged"]

log = logging.getLogger("shardify.reader")

Run = tuple[int, int, int]
"""``(shard, start, stop)``: samples ``start..stop-1`` of a shard, read in one go."""
Table = bytes | Callable[[], bytes]
"""A shard's per-sample table, or what loads it (a sidecar) when first needed."""


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
    future: Future[bytes] | None = None
    dropped: bool = False
    runs: deque[Run] = field(default_factory=deque)


def _key_of(data: bytes) -> str | None:
    """The sample key in a tar header's name field (None when it cannot be read)."""
    try:
        return split_member_name(data[:100].split(b"\0", 1)[0].decode("utf-8"))[0]
    except (UnicodeDecodeError, KeyRuleError):
        return None


class RangeFetcher:
    """Sample bytes of the shards ``urls`` that have a table in ``tables`` (empty: not read
    here; a callable: loads it, once, when the shard is first read), fetched with ``fetch``
    (its retry policy, storage options and ``requests``)."""

    def __init__(
        self,
        urls: Sequence[str],
        tables: Sequence[Table],
        fetch: Sequence[FetchOptions],
        *,
        max_request_bytes: int = 1 << 20,
    ) -> None:
        if not len(urls) == len(tables) == len(fetch):
            raise ValueError(f"{len(urls)=}, {len(tables)=} and {len(fetch)=} should be equal, one per shard")
        # kept as given: a compact index's columns make each shard's value on access
        self._urls, self._tables, self._fetch = urls, tables, fetch
        options = distinct_values(fetch)
        self._ranges: dict[int, SampleRanges] = {}
        self._failed: dict[int, ShardFormatError] = {}  # tables that could not be loaded
        self._max = max_request_bytes
        self._runs: deque[Run] = deque()  # planned, not yet made requests
        self._ahead: deque[_Request] = deque()  # submitted, in plan order
        self._pool: ThreadPoolExecutor | None = None
        self._requests = max((f.requests for f in options), default=1)
        self._timeout_s = max((f.retry.timeout_s for f in options), default=0.0)
        self.stats = RangeStats()
        self._lock = threading.Lock()

    def covers(self, shard: int) -> bool:
        """Whether ``shard`` is read in ranges here."""
        return bool(self._tables[shard])

    def offset(self, shard: int, i: int) -> int:
        """The byte offset of sample ``i`` of ``shard``."""
        return self._sample_ranges(shard)[i][0]

    def _sample_ranges(self, shard: int) -> SampleRanges:
        """The ranges of ``shard``'s samples, its table loaded first when it is a sidecar (a
        table that failed to load raises its error again, without another fetch)."""
        found = self._ranges.get(shard)
        if found is None:
            if shard in self._failed:
                raise self._failed[shard]
            table = self._tables[shard]
            try:
                raw = table() if callable(table) else table
            except ShardFormatError as e:
                self._failed[shard] = e
                raise
            found = self._ranges[shard] = SampleTable(raw).ranges()
        return found

    def plan(self, runs: Iterable[Run]) -> None:
        """The reads to come, in order (those of shards not read here are passed over)."""
        self.cancel()
        self._runs.extend(r for r in runs if r[2] > r[1] and self.covers(r[0]))

    def _next_request(self) -> _Request | None:
        """The next request of the plan: its next runs that touch in one shard (up to the
        request size). A shard whose table cannot be loaded stays in the plan as a request that
        failed with its error, raised where its read is made; the reads after it keep their place."""
        while self._runs:
            shard, a, b = self._runs.popleft()
            try:
                ranges = self._sample_ranges(shard)
            except ShardFormatError as e:
                failed: Future[bytes] = Future()
                failed.set_exception(e)
                return _Request(shard, a, b, 0, 0, future=failed, runs=deque([(shard, a, b)]))
            req = _Request(shard, a, b, ranges[a][0], ranges[b - 1][1], runs=deque([(shard, a, b)]))
            while self._runs and self._runs[0][0] == shard and self._runs[0][1] == req.last:
                nxt = self._runs[0][2]
                if ranges[nxt - 1][1] - req.start > self._max:
                    break
                req.last, req.stop = nxt, ranges[nxt - 1][1]
                req.runs.append(self._runs.popleft())
            return req
        return None

    def samples(self, shard: int, start: int, stop: int) -> list[bytes]:
        """The checked bytes of samples ``start..stop-1`` of ``shard``."""
        self._top_up()
        while self._ahead:
            req = self._ahead[0]
            if req.runs and req.runs[0] == (shard, start, stop):
                req.runs.popleft()
                data = self._result(req)
                if not req.runs:
                    self._ahead.popleft()
                    self._top_up()
                return self._slice(req, data, start, stop)
            self._drop(self._ahead.popleft())  # read out of plan (a resume, an error): forget it
            self._top_up()
        ranges = self._sample_ranges(shard)
        req = _Request(shard, start, stop, ranges[start][0], ranges[stop - 1][1])
        return self._slice(req, self._get(req), start, stop)

    def _result(self, req: _Request) -> bytes:
        return req.future.result() if req.future is not None else self._get(req)

    def _slice(self, req: _Request, data: bytes, start: int, stop: int) -> list[bytes]:
        ranges = self._sample_ranges(req.shard)
        return [data[ranges[i][0] - req.start : ranges[i][1] - req.start] for i in range(start, stop)]

    def _top_up(self) -> None:
        while len(self._ahead) < self._requests:
            req = self._next_request()
            if req is None:
                return
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._requests, thread_name_prefix="shardify-ranges")
            if req.future is None:  # (a failed table's request comes with its error)
                req.future = self._pool.submit(self._get, req)
            self._ahead.append(req)

    def _get(self, req: _Request) -> bytes:
        """Fetch ``req`` and check each of its samples against the index (in a pool thread)."""
        url, fetch = self._urls[req.shard], self._fetch[req.shard]
        data = fetch_range(
            url,
            req.start,
            req.stop,
            retry=fetch.retry,
            storage_options=fetch.storage_options,
            cancelled=lambda: req.dropped,
        )
        with self._lock:
            self.stats.requests += 1
            self.stats.bytes += len(data)
        ranges = self._sample_ranges(req.shard)
        for i in range(req.first, req.last):
            a, b, digest = ranges[i]
            if sample_digest(memoryview(data)[a - req.start : b - req.start]) != digest:
                raise ShardFormatError(
                    f"sample {i} (bytes {a}-{b - 1}) does not match the index's checksum "
                    "(corrupt or replaced on the server)",
                    shard=url,
                    key=_key_of(data[a - req.start : b - req.start]),
                )
        return data

    @staticmethod
    def _drop(req: _Request) -> None:
        req.dropped = True
        if req.future is not None:
            req.future.cancel()

    def cancel(self) -> None:
        """Forget the planned reads; waits for those in flight (they are not retried), so no
        request outlives the reads it was made for."""
        running = [req.future for req in self._ahead if req.future is not None]
        for req in self._ahead:
            self._drop(req)
        self._ahead.clear()
        self._runs.clear()
        if running:
            wait(running, timeout=self._timeout_s)

    def close(self) -> None:
        self.cancel()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def parse_sample(data: bytes, *, url: str, offset: int, keep: KeepMember | None, max_member: int) -> dict[str, object]:
    """The sample dict of one sample's tar bytes ``data`` (found at byte ``offset`` of the
    shard ``url``): exactly one sample, or :class:`ShardFormatError`."""
    members = iter_members(io.BytesIO(data), shard=url, keep=keep, max_member=max_member)
    found = list(iter_samples(members, shard=url))
    if len(found) != 1:
        raise ShardFormatError(
            f"bytes {offset}-{offset + len(data) - 1} hold {len(found)} samples, the index says one",
            shard=url,
            key=str(found[0]["__key__"]) if found else None,
        )
    sample = found[0]
    sample["__offset__"] = offset
    return sample


def read_ranged(ranged: RangeFetcher, files: ShardFiles, shard: int, start: int, stop: int) -> Iterator[Item]:
    """Positions ``start..stop-1`` of ``shard`` from its checked byte ranges."""
    url, index = files.urls[shard], start
    try:
        for data in ranged.samples(shard, start, stop):
            yield parse_sample(
                data, url=url, offset=ranged.offset(shard, index), keep=files.keep, max_member=files.max_member
            )
            index += 1
    except (ShardFormatError, *READ_ERRORS) as e:
        yield from files.lost(shard, index, stop, damage(url, e), e)


def range_fetcher(sources: Sequence[Source]) -> RangeFetcher | None:
    """A fetcher for the shards of ``sources`` (in order, as the dataset numbers them) read in
    ranges: remote, plain tar with a per-sample table (inline, in a sidecar, or a compact index's
    proven sidecar), of a source whose ``fetch.ranged`` is on; None when there is none (every
    shard is read whole, as local files or through the cache). A compact index's shards get
    their table loaders on access, not one per shard up front."""
    urls: list[Sequence[str]] = []
    tables: list[Sequence[Table]] = []
    fetch: list[Sequence[FetchOptions]] = []
    covered = False
    for src in sources:
        n = len(src.shards)
        column = _tables(src)
        covered = covered or column is not None
        urls.append(src.urls)
        tables.append(column if column is not None else Repeated(n, b""))
        fetch.append(Repeated(n, src.fetch))
    if not covered:
        return None
    return RangeFetcher(ChainedSequence(urls), ChainedSequence(tables), ChainedSequence(fetch))


def _tables(src: Source) -> Sequence[Table] | None:
    """The tables of ``src``'s shards for ranged reads (b"": read whole); None: none is ranged."""
    shards = src.shards
    if isinstance(shards, CompactShards):
        if not (src.fetch.ranged and len(shards) and is_remote(shards.base)):
            return None
        return LazySequence(len(shards), shards.table_loader)
    column: list[Table] = []
    for sh in shards:
        ranged = src.fetch.ranged and is_remote(sh.url) and sh.chunk is None and not is_gzip(sh.url)
        if ranged and isinstance(sh.sidecar, SidecarRef) and sh.filesize is not None:
            column.append(table_loader(sh.url, sh.sidecar, nsamples=sh.nsamples, filesize=sh.filesize, fetch=src.fetch))
        else:
            column.append(sh.samples if ranged else b"")
    return column if any(column) else None
