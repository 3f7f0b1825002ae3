"""Every remote fetch ends: one deadline per request whatever pace the server sends at,
``Retry-After`` honoured up to a bound, a body longer than the file cut off and retried, and
the retry policy set through ``CacheOptions(retry=...)`` (tools/rangeserver.py on 127.0.0.1).

Each call that could hang runs in a thread joined with a generous bound: before these fixes it
hung for minutes; the figures it takes now are well under a tenth of the bound."""

from __future__ import annotations

import email.utils
import io
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import rangeserver  # tools/rangeserver.py (pytest's pythonpath holds tools/)

from shardify.convert import ShardWriter
from shardify.errors import ShardifyError
from shardify.fetchcontrol import retry_after
from shardify.reader import CacheOptions, ShardedDataset
from shardify.reader.io.sources import resolve_source
from shardify.remote import RetryPolicy, ShardFetchError, download, fetch_bytes, fetch_range

BOUND_S = 60.0  # "does not hang": each bounded call here takes a few seconds at most
SHORT = RetryPolicy(retries=0, timeout_s=30.0, deadline_s=1.0)  # a read timeout far above the deadline


@pytest.fixture
def www(tmp_path: Path) -> Path:
    """``www/ds``: 24 samples of ~2 KB in 3 shards."""
    with ShardWriter(tmp_path / "www" / "ds", samples_per_shard=8, fsync=False) as w:
        for i in range(24):
            w.write({"txt": chr(97 + i % 26) * 2000, "cls": i % 5})
    return tmp_path / "www"


def _bounded(fn: Callable[[], Any]) -> tuple[float, Any]:
    """``(seconds, what fn returned or raised)``; fails when ``fn`` is still running after BOUND_S."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out.append(e)

    start = time.monotonic()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(BOUND_S)
    assert not t.is_alive(), f"still running after {BOUND_S} s"
    return time.monotonic() - start, out[0]


def _shard(www: Path) -> str:
    return sorted(p.name for p in (www / "ds").glob("*.tar"))[0]


def test_worst_case_follows_from_the_policy():
    p = RetryPolicy()
    assert (p.timeout_s, p.deadline_s, p.retries, p.max_retry_after_s) == (30.0, 300.0, 5, 60.0)
    assert p.worst_case_s == 6 * 300.0 + 5 * 60.0
    q = RetryPolicy(retries=3, backoff_s=1.0, max_backoff_s=3.0, deadline_s=10.0, max_retry_after_s=0.0)
    assert q.worst_case_s == 4 * 10.0 + (1.0 + 2.0 + 3.0)
    with pytest.raises(ValueError, match="deadline_s"):
        RetryPolicy(deadline_s=0)


def test_retry_after_reads_seconds_and_http_dates():
    now = 1_700_000_000.0
    assert retry_after("30") == 30.0
    assert retry_after(email.utils.formatdate(now + 12, usegmt=True), now=now) == pytest.approx(12.0)
    assert retry_after(email.utils.formatdate(now - 12, usegmt=True), now=now) == 0.0
    assert retry_after("soon") is None and retry_after(None) is None


@pytest.mark.parametrize("what", ["manifest", "index"])
def test_a_trickled_metadata_file_ends_at_the_deadline(www, what):
    clean = () if what == "manifest" else ("manifest.json",)  # the split's index: the other .json
    b = rangeserver.Behaviour(trickle_bps=1, fault_paths=(".json",), clean_paths=clean)
    with rangeserver.serve(www, b) as (base, _):
        took, got = _bounded(lambda: resolve_source(f"{base}/ds", retry=SHORT))
    assert isinstance(got, ShardifyError) and "deadline of 1 s" in str(got), got
    assert took < BOUND_S / 6


@pytest.mark.parametrize("stall_at", [0.0, 0.5], ids=["after-headers", "half-body"])
def test_a_stalled_range_ends_at_the_deadline_not_the_read_timeout(www, stall_at):
    name = _shard(www)
    with rangeserver.serve(www, rangeserver.Behaviour(stall_at=stall_at)) as (base, _):
        took, got = _bounded(lambda: fetch_range(f"{base}/ds/{name}", 0, 4000, retry=SHORT))
    assert isinstance(got, ShardFetchError), got
    assert took < 10  # the read timeout (30 s) would hold it three times as long


@pytest.mark.parametrize("stall_at", [0.0, 0.5], ids=["after-headers", "half-body"])
def test_a_stalled_download_ends_at_the_deadline(www, stall_at):
    name = _shard(www)
    with rangeserver.serve(www, rangeserver.Behaviour(stall_at=stall_at)) as (base, _):
        took, got = _bounded(lambda: fetch_bytes(f"{base}/ds/{name}", retry=SHORT))
    assert isinstance(got, ShardFetchError), got
    assert took < 10


@pytest.mark.parametrize("request_kind", ["range", "download", "metadata"])
def test_trickled_headers_end_at_the_deadline(www, request_kind):
    """Status line and headers at 2 bytes/s (about a minute for them all): each socket read
    returns within the read timeout, so only the deadline's watchdog ends the request."""
    name = _shard(www)
    calls: dict[str, Callable[[str], Any]] = {
        "range": lambda base: fetch_range(f"{base}/ds/{name}", 0, 4000, retry=SHORT),  # a kept connection
        "download": lambda base: fetch_bytes(f"{base}/ds/{name}", retry=SHORT),  # through urllib
        "metadata": lambda base: resolve_source(f"{base}/ds", retry=SHORT),
    }
    with rangeserver.serve(www, rangeserver.Behaviour(header_bps=2)) as (base, _):
        took, got = _bounded(lambda: calls[request_kind](base))
    assert isinstance(got, ShardifyError) and "deadline of 1 s" in str(got), got
    assert took < BOUND_S / 6


def test_the_watchdog_forgets_requests_that_ended(www):
    """Many requests, each done long before its deadline: none is fired afterwards, and the
    watchdog's heap does not keep them all."""
    from shardify import fetchcontrol

    name = _shard(www)
    with rangeserver.serve(www) as (base, _):
        for _ in range(200):
            assert len(fetch_range(f"{base}/ds/{name}", 0, 100, retry=RetryPolicy(retries=0))) == 100
    assert len(fetchcontrol._WATCHDOG._heap) <= 130


@pytest.mark.parametrize("ranged", [True, False], ids=["ranged", "whole"])
def test_an_epoch_over_trickled_shards_ends_with_the_policy_from_cache_options(www, ranged):
    b = rangeserver.Behaviour(trickle_bps=10, fault_paths=(".tar",))
    with rangeserver.serve(www, b) as (base, _):
        policy = RetryPolicy(retries=1, backoff_s=0.0, max_backoff_s=0.0, deadline_s=1)
        cache = CacheOptions(ranged=ranged, retry=policy)
        ds = ShardedDataset(f"{base}/ds", batch_size=4, fields=("__key__",), cache=cache)
        took, got = _bounded(lambda: [batch for batch in ds])
    assert isinstance(got, ShardFetchError) and "deadline" in str(got), got
    assert took < BOUND_S / 3


def test_cache_options_take_a_retry_policy_only():
    assert CacheOptions().retry == RetryPolicy()
    with pytest.raises(TypeError, match="RetryPolicy"):
        CacheOptions(retry=5)  # type: ignore[arg-type]


@pytest.mark.parametrize("form", ["seconds", "http-date"])
def test_retry_after_is_waited_for(www, form):
    value = "1" if form == "seconds" else email.utils.formatdate(time.time() + 3, usegmt=True)  # >= 2 s ahead
    b = rangeserver.Behaviour(error_status=429, retry_after=value, faults_left=2)
    policy = RetryPolicy(retries=3, backoff_s=0.01, max_backoff_s=0.02)
    with rangeserver.serve(www, b) as (base, served):
        took, got = _bounded(lambda: fetch_bytes(f"{base}/ds/manifest.json", retry=policy))
    assert isinstance(got, bytes) and got == (www / "ds" / "manifest.json").read_bytes()
    assert took >= 1.0  # without Retry-After: two backoffs of at most 0.02 s


def test_retry_after_is_bounded_and_the_retries_are_counted(www):
    b = rangeserver.Behaviour(error_status=503, retry_after="3600")
    policy = RetryPolicy(retries=2, backoff_s=0.01, max_backoff_s=0.02, max_retry_after_s=0.2)
    with rangeserver.serve(www, b) as (base, served):
        took, got = _bounded(lambda: fetch_bytes(f"{base}/ds/manifest.json", retry=policy))
        assert served.paths.count("ds/manifest.json") == 3
    assert isinstance(got, ShardFetchError) and "gave up after 3 attempts" in str(got) and "503" in str(got)
    assert 0.39 <= took < BOUND_S / 6  # two waits of 0.2 s, not an hour


@pytest.mark.parametrize("faults", [1, None], ids=["once", "always"])
def test_a_body_longer_than_the_shard_is_cut_off_and_retried(www, tmp_path, faults):
    b = rangeserver.Behaviour(extra_body=4 << 20, no_length=True, fault_paths=(".tar",), faults_left=faults)
    cache_dir = tmp_path / "cache"
    policy = RetryPolicy(retries=1, backoff_s=0.0, max_backoff_s=0.0, timeout_s=5.0)
    local = [list(batch) for batch in ShardedDataset(www / "ds", batch_size=4, fields=("__key__",))]
    with rangeserver.serve(www, b) as (base, _):
        cache = CacheOptions(ranged=False, dir=cache_dir, retry=policy)
        ds = ShardedDataset(f"{base}/ds", batch_size=4, fields=("__key__",), cache=cache)
        took, got = _bounded(lambda: [list(batch) for batch in ds])
    assert not list(cache_dir.glob("*.part-*"))
    sizes = {p.stat().st_size for p in cache_dir.glob("*.tar")}
    assert sizes <= {p.stat().st_size for p in (www / "ds").glob("*.tar")}  # never a byte past the file
    if faults == 1:
        assert got == local
    else:
        assert isinstance(got, ShardFetchError) and "longer than the" in str(got), got


def test_an_html_page_for_a_range_or_a_shard_is_refused(www):
    name = _shard(www)
    with rangeserver.serve(www, rangeserver.Behaviour(html_200=True, fault_paths=(".tar",))) as (base, _):
        with pytest.raises(ShardFetchError, match="the manifest says"):  # a shard's size is known
            download(f"{base}/ds/{name}", io.BytesIO(), retry=SHORT, size=(www / "ds" / name).stat().st_size)
        with pytest.raises(ShardFetchError, match="whole file"):
            fetch_range(f"{base}/ds/{name}", 0, 100, retry=SHORT)


def test_a_missing_content_range_is_refused(www):
    name = _shard(www)
    with rangeserver.serve(www, rangeserver.Behaviour(no_content_range=True)) as (base, _):
        with pytest.raises(ShardFetchError, match="Content-Range"):
            fetch_range(f"{base}/ds/{name}", 0, 100, retry=SHORT)
