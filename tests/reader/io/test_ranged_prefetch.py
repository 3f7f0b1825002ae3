"""Per-sample tables loaded ahead and kept within a budget by RangeFetcher: the tables of the next
shards load in the fetch pool before their reads, a table that fails raises where its read is
made, and the tables kept are those of pinned shards plus a least-recently-used few, a dropped
one loaded again when needed; every read stays exact (tools/rangeserver.py on 127.0.0.1)."""

from __future__ import annotations

import functools
import random
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import rangeserver  # tools/rangeserver.py (pytest's pythonpath holds tools/)

from shardify.convert import ShardWriter
from shardify.errors import SidecarError
from shardify.reader.io import ranged as ranged_module
from shardify.reader.io.cache import FetchOptions
from shardify.reader.io.ranged import RangeFetcher, Run, Table
from shardify.reader.io.sources import resolve_source
from shardify.remote import RetryPolicy
from shardify.sampletable import RECORD, SampleRanges, SampleTable

FAST = RetryPolicy(retries=1, backoff_s=0.01, max_backoff_s=0.02, timeout_s=5.0)
SHARDS, PER_SHARD = 30, 8


class Split:
    """A split of ``SHARDS`` shards served on 127.0.0.1: its shard URLs, inline tables, and
    the exact bytes of any samples read from the local files."""

    def __init__(self, root: Path, base: str) -> None:
        source = resolve_source(root / "ds")
        self.tables = [s.samples for s in source.shards]
        self.files = [Path(s.url).read_bytes() for s in source.shards]
        self.urls = [f"{base}/ds/{Path(s.url).name}" for s in source.shards]

    def local(self, shard: int, start: int, stop: int) -> list[bytes]:
        ranges = SampleTable(self.tables[shard]).ranges()
        return [self.files[shard][ranges[i][0] : ranges[i][1]] for i in range(start, stop)]


class Loader:
    """Table loaders (as a sidecar's) that take ``delay`` seconds and record each load: the
    shard, the thread it ran on, when it started; those of ``fail`` raise SidecarError."""

    def __init__(self, tables: list[bytes], *, delay: float = 0.0, fail: frozenset[int] = frozenset()) -> None:
        self.tables, self.delay, self.fail = tables, delay, fail
        self.calls: list[tuple[int, str, float]] = []
        self._lock = threading.Lock()
        self.running = self.most_running = 0
        """Loads under way now, and the most that ever were at once."""

    def of(self, shard: int) -> Callable[[], bytes]:
        return functools.partial(self._load, shard)

    def _load(self, shard: int) -> bytes:
        with self._lock:
            self.calls.append((shard, threading.current_thread().name, time.perf_counter()))
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        time.sleep(self.delay)
        with self._lock:
            self.running -= 1
        if shard in self.fail:
            raise SidecarError("cannot fetch its sidecar (a test's loader)", shard=f"shard-{shard}")
        return self.tables[shard]

    def loads(self) -> Counter[int]:
        return Counter(shard for shard, _, _ in self.calls)


@pytest.fixture
def split(tmp_path: Path) -> Iterator[Split]:
    with ShardWriter(tmp_path / "ds", samples_per_shard=PER_SHARD, fsync=False) as w:
        for i in range(SHARDS * PER_SHARD):
            w.write({"txt": chr(97 + i % 26) * (100 + i * 37 % 300), "cls": i % 5})
    with rangeserver.serve(tmp_path) as (base, _):
        yield Split(tmp_path, base)


def _fetcher(split: Split, loader: Loader, *, requests: int, **kw: int) -> RangeFetcher:
    tables: list[Table] = [loader.of(s) for s in range(SHARDS)]
    fetch = [FetchOptions(retry=FAST, requests=requests)] * SHARDS
    return RangeFetcher(split.urls, tables, fetch, **kw)


def test_tables_of_the_next_shards_load_in_the_pool_before_their_reads(split: Split) -> None:
    delay, n = 0.1, 12
    loader = Loader(split.tables, delay=delay)
    ranged = _fetcher(split, loader, requests=4)
    runs = [(s, 0, 4) for s in range(n)]
    asked: dict[int, float] = {}
    ranged.announce(runs)
    for s, a, b in runs:
        asked[s] = time.perf_counter()
        assert ranged.samples(s, a, b) == split.local(s, a, b)
    ranged.close()
    assert loader.loads() == Counter(range(n))  # each table loaded once
    assert all(thread.startswith("shardify-ranges") for _, thread, _ in loader.calls)
    assert all(started < asked[s] for s, _, started in loader.calls)  # each load began before its read
    assert loader.most_running > 1  # loaded side by side, not one after the other (whatever the machine's speed)


def test_a_table_that_fails_raises_where_its_read_is_made_and_later_reads_succeed(split: Split) -> None:
    loader = Loader(split.tables, delay=0.02, fail=frozenset({2}))
    ranged = _fetcher(split, loader, requests=4)
    ranged.announce([(1, 0, 8), (2, 0, 8), (3, 0, 8), (4, 0, 4)])
    assert ranged.samples(1, 0, 8) == split.local(1, 0, 8)
    with pytest.raises(SidecarError) as e:
        ranged.samples(2, 0, 8)
    assert e.value.shard == "shard-2"
    assert ranged.samples(3, 0, 8) == split.local(3, 0, 8)
    with pytest.raises(SidecarError):  # read again, out of plan: the same error, not another load
        ranged.samples(2, 0, 4)
    assert ranged.samples(4, 0, 4) == split.local(4, 0, 4)
    ranged.close()
    assert loader.loads() == Counter([1, 2, 3, 4])
    assert all(thread.startswith("shardify-ranges") for _, thread, _ in loader.calls)


def test_a_table_dropped_from_a_tiny_budget_is_loaded_again_and_reads_stay_exact(split: Split) -> None:
    n = 6
    runs = [(s, 0, 4) for s in range(n)] + [(s, 4, 8) for s in range(n)]
    for budget, loads in ((0, 2), (32 << 20, 1)):
        loader = Loader(split.tables)
        ranged = _fetcher(split, loader, requests=1, table_cache_bytes=budget)
        ranged.announce(runs)
        for s, a, b in runs:
            assert ranged.samples(s, a, b) == split.local(s, a, b)
        assert ranged.samples(0, 2, 6) == split.local(0, 2, 6)  # out of plan
        ranged.close()
        assert loader.loads() == {s: loads + (s == 0 and budget == 0) for s in range(n)}, budget


def test_tables_kept_never_exceed_those_pinned_plus_the_budget(split: Split, monkeypatch: pytest.MonkeyPatch) -> None:
    live: weakref.WeakSet[SampleRanges] = weakref.WeakSet()

    class Counted(SampleTable):
        def ranges(self) -> SampleRanges:
            found = super().ranges()
            live.add(found)
            return found

    monkeypatch.setattr(ranged_module, "SampleTable", Counted)
    requests, budget_tables = 2, 3
    loader = Loader(split.tables)
    ranged = _fetcher(split, loader, requests=requests, table_cache_bytes=budget_tables * PER_SHARD * RECORD.size)
    rng = random.Random(0)
    runs: list[Run] = []
    for _ in range(3):
        blocks = [(s, a, a + 4) for s in range(SHARDS) for a in (0, 4)]
        rng.shuffle(blocks)
        runs += blocks
    pinned = 2 * requests + 1  # shards of the window ahead, of the requests ahead, and the one being read
    kept = []
    ranged.announce(runs)
    for s, a, b in runs:
        assert ranged.samples(s, a, b) == split.local(s, a, b)
        kept.append(len(live))
    ranged.close()
    assert max(kept) <= pinned + budget_tables, max(kept)
    assert loader.loads().total() > SHARDS  # tables were dropped and loaded again
