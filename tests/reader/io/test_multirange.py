"""Many byte ranges of one file in one GET (shardify.remote.fetch_ranges) against
tools/rangeserver.py on 127.0.0.1: every span exactly, whatever shape of answer the server
chooses; servers that refuse many ranges remembered; truncated and lying answers."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
import rangeserver  # tools/rangeserver.py (pytest's pythonpath holds tools/)

from shardify.fetchcontrol import Abort
from shardify.keepalive import close_connections
from shardify.remote import (
    MAX_RANGE_HEADER_BYTES,
    MultiRangeRefused,
    RangeNotSupported,
    RetryPolicy,
    ShardFetchError,
    fetch_range,
    fetch_ranges,
    multi_range_ok,
    split_spans,
)

NO_RETRY = RetryPolicy(retries=0, timeout_s=5.0)
FAST = RetryPolicy(retries=2, backoff_s=0.01, max_backoff_s=0.02, timeout_s=5.0)
DATA = random.Random(0).randbytes(3 << 20)
BIG = 64 << 20  # a sparse file much larger than the socket buffers: a 200 for it cannot all be sent unread


@pytest.fixture
def www(tmp_path: Path) -> Path:
    (tmp_path / "a.bin").write_bytes(DATA)
    with open(tmp_path / "big.bin", "wb") as f:
        f.truncate(BIG)
    return tmp_path


@pytest.fixture(autouse=True)
def _fresh_connections():
    close_connections()
    yield
    close_connections()


@pytest.fixture
def proxy_env(monkeypatch):
    """Sets ``http_proxy`` for the test."""
    for name in ("no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    return lambda proxy: monkeypatch.setenv("http_proxy", proxy)


def _spans(rng: random.Random, n: int, size: int = len(DATA)) -> list[tuple[int, int]]:
    """``n`` random spans of 1 byte to 64 KiB (sizes spread evenly on a log scale), gaps of 0
    (touching) to 4 KiB, within ``size`` bytes."""
    spans, at = [], rng.randint(0, 1000)
    for _ in range(n):
        length = int(2 ** rng.uniform(0, 16))
        spans.append((at, at + length))
        at += length + rng.choice([0, 1, rng.randint(2, 4096)])
    assert at <= size
    return spans


def _fetch_all(url: str, spans, retry: RetryPolicy = NO_RETRY) -> list[bytes]:
    return [got for group in split_spans(spans) for got in fetch_ranges(url, group, retry=retry)]


def _wait(condition, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while not condition() and time.monotonic() < end:
        time.sleep(0.02)
    return condition()


@pytest.mark.parametrize("mode", ["answer", "coalesce", "shuffle", "merge"])
@pytest.mark.parametrize("n", [1, 2, 7, 64, 300])
def test_every_span_comes_back_exactly_whatever_the_answers_shape(www, mode, n):
    rng = random.Random(n)
    spans = _spans(rng, n)
    with rangeserver.serve(www, rangeserver.Behaviour(multi_range=mode)) as (base, served):
        url = f"{base}/a.bin"
        assert _fetch_all(url, spans) == [DATA[a:b] for a, b in spans]
        assert served.gets == len(split_spans(spans))  # one GET per group, none retried
        assert served.connections == 1  # every answer read to its end: the connection was kept
        assert multi_range_ok(url)


@pytest.mark.parametrize("mode", ["whole", "first"])
def test_a_server_that_refuses_many_ranges_is_remembered(www, mode):
    spans = [(0, 10), (5000, 6000), (BIG - 10, BIG)]
    with rangeserver.serve(www, rangeserver.Behaviour(multi_range=mode)) as (base, served):
        url = f"{base}/big.bin"
        assert multi_range_ok(url)
        with pytest.raises(MultiRangeRefused, match=f"{base}/big.bin.*3 ranges, bytes 0-9, 5000-5999") as e:
            fetch_ranges(url, spans, retry=FAST)
        assert not isinstance(e.value, RangeNotSupported)
        assert served.paths == ["big.bin"]  # not retried
        assert not multi_range_ok(url) and not multi_range_ok(f"{base}/another.bin")  # the host
        # the answer was not read: its connection is closed, the server could not send it all
        assert _wait(lambda: served.open == 0)
        assert served.sent < BIG // 2
        # one range per request still works, on a new connection
        assert [fetch_range(url, a, b, retry=NO_RETRY) for a, b in spans] == [b"\0" * (b - a) for a, b in spans]
        assert served.connections == 2
    with rangeserver.serve(www) as (other, _):
        assert multi_range_ok(f"{other}/big.bin")  # another host (port) is not marked


@pytest.mark.parametrize("no_length", [False, True], ids=["content-length", "close-delimited"])
def test_a_truncated_answer_is_retried(www, no_length):
    spans = [(0, 100), (1000, 30000), (40000, 40001)]
    faults = rangeserver.Behaviour(drop_after=5000, no_length=no_length, faults_left=1)
    with rangeserver.serve(www, faults) as (base, served):
        assert fetch_ranges(f"{base}/a.bin", spans, retry=FAST) == [DATA[a:b] for a, b in spans]
        assert served.gets == 2


def test_an_answer_truncated_every_time_fails_after_the_retries_naming_the_url(www):
    spans = [(0, 100), (1000, 30000)]
    with rangeserver.serve(www, rangeserver.Behaviour(drop_after=5000)) as (base, served):
        with pytest.raises(ShardFetchError, match=f"{base}/a.bin.*2 ranges, bytes 0-99, 1000-29999.*3 attempts") as e:
            fetch_ranges(f"{base}/a.bin", spans, retry=FAST)
        assert not isinstance(e.value, MultiRangeRefused)
        assert served.gets == 3
        assert multi_range_ok(f"{base}/a.bin")


def test_a_busy_server_is_waited_for(www):
    spans = [(0, 100), (200, 300)]
    with rangeserver.serve(www, rangeserver.Behaviour(error_status=503, faults_left=2)) as (base, served):
        assert fetch_ranges(f"{base}/a.bin", spans, retry=FAST) == [DATA[0:100], DATA[200:300]]
        assert served.paths == ["a.bin"] * 3


@pytest.mark.parametrize(
    "mode, fault, why",
    [
        pytest.param("answer", {"wrong_range": 1}, "no part of the answer covers bytes 10-99", id="shifted"),
        pytest.param("shuffle", {"wrong_range": -1}, "covers bytes 10-99", id="shifted-back"),
        pytest.param("answer", {"part_lies": 3}, "longer or shorter than its Content-Range", id="part-length"),
        pytest.param("merge", {"no_content_range": True}, "Content-Range ''", id="merged-no-range"),
    ],
)
def test_a_lying_answer_is_refused_at_once_naming_the_url(www, mode, fault, why):
    spans = [(10, 100), (1000, 30000), (40000, 40001)]
    with rangeserver.serve(www, rangeserver.Behaviour(multi_range=mode, **fault)) as (base, served):
        with pytest.raises(ShardFetchError, match=f"shard {base}/a.bin: cannot fetch 3 ranges.*{why}") as e:
            fetch_ranges(f"{base}/a.bin", spans, retry=FAST)
        assert not isinstance(e.value, MultiRangeRefused)
        assert served.paths == ["a.bin"]  # permanent: not retried
        assert _wait(lambda: served.open == 0)  # the connection was not kept


def test_a_merged_answer_whose_range_is_shifted_is_never_returned(www):
    spans = [(100, 200), (1000, 2000)]
    with rangeserver.serve(www, rangeserver.Behaviour(multi_range="merge", wrong_range=1)) as (base, _):
        with pytest.raises(ShardFetchError):
            fetch_ranges(f"{base}/a.bin", spans, retry=FAST)


def test_a_redirect_is_followed(www):
    spans = [(0, 100), (200, 300)]
    with rangeserver.serve(www, rangeserver.Behaviour(redirects={"old.bin": (302, "/a.bin")})) as (base, served):
        assert fetch_ranges(f"{base}/old.bin", spans, retry=NO_RETRY) == [DATA[0:100], DATA[200:300]]
        assert served.paths == ["old.bin", "a.bin"] and served.connections == 1


def test_a_proxy_in_the_environment_is_used(www, proxy_env):
    spans = [(0, 100), (200, 300), (5000, 9000)]
    with rangeserver.serve(www, rangeserver.Behaviour(multi_range="shuffle")) as (proxy, served):
        proxy_env(proxy)  # the test server answers a GET of an absolute URL as a proxy
        got = fetch_ranges("http://shards.invalid/a.bin", spans, retry=NO_RETRY)
        assert got == [DATA[a:b] for a, b in spans]
        assert served.paths == ["a.bin"]


def test_a_proxy_answering_the_whole_file_is_refused_and_remembered(www, proxy_env):
    with rangeserver.serve(www, rangeserver.Behaviour(multi_range="whole")) as (proxy, served):
        proxy_env(proxy)
        with pytest.raises(MultiRangeRefused, match="shards-whole.invalid/big.bin"):
            fetch_ranges("http://shards-whole.invalid/big.bin", [(0, 1), (5, 6)], retry=NO_RETRY)
        assert not multi_range_ok("http://shards-whole.invalid/x")
        assert _wait(lambda: served.open == 0) and served.sent < BIG // 2


@pytest.mark.parametrize(
    "spans",
    [
        pytest.param([], id="none"),
        pytest.param([(5, 5)], id="empty-span"),
        pytest.param([(10, 20), (0, 5)], id="unsorted"),
        pytest.param([(0, 10), (9, 20)], id="overlapping"),
        pytest.param([(i * 10**9, i * 10**9 + 1) for i in range(300)], id="header-too-long"),
    ],
)
def test_bad_spans_are_refused_before_any_request(www, spans):
    with rangeserver.serve(www) as (base, served):
        with pytest.raises(ValueError):
            fetch_ranges(f"{base}/a.bin", spans, retry=NO_RETRY)
        assert served.gets == 0


def test_the_most_spans_that_fit_go_in_one_request(www):
    spans = [(i * 10, i * 10 + 3) for i in range(len(DATA) // 10)]
    group = split_spans(spans)[0]
    assert len(group) > 100
    with rangeserver.serve(www) as (base, served):
        assert fetch_ranges(f"{base}/a.bin", group, retry=NO_RETRY) == [DATA[a:b] for a, b in group]
        with pytest.raises(ValueError, match=str(MAX_RANGE_HEADER_BYTES)):
            fetch_ranges(f"{base}/a.bin", group + [spans[len(group)]], retry=NO_RETRY)
        assert served.gets == 1


def test_an_aborted_fetch_stops(www):
    abort = Abort()
    abort.fire()
    with rangeserver.serve(www) as (base, served):
        with pytest.raises(ShardFetchError):
            fetch_ranges(f"{base}/a.bin", [(0, 1), (5, 6)], retry=FAST, abort=abort)
        assert served.gets == 0


def test_other_schemes_fetch_span_by_span(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    fs.pipe("/multirange/a.bin", DATA[:100000])
    spans = _spans(random.Random(5), 5, 100000)
    url = "memory://multirange/a.bin"
    assert fetch_ranges(url, spans, retry=NO_RETRY) == [DATA[a:b] for a, b in spans]
    assert not multi_range_ok(url) and not multi_range_ok(f"file://{tmp_path}/a.bin")
    with pytest.raises(ValueError):
        fetch_ranges(url, [(5, 1)], retry=NO_RETRY)
