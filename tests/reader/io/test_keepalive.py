"""Ranged GETs over kept connections: one connection per fetch thread and host, a connection
the server closed reopened without a retry, redirects followed (http(s) only, not
remembered), proxies from the environment honoured, connections closed when their thread
ends (tools/rangeserver.py on 127.0.0.1)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import rangeserver  # tools/rangeserver.py (pytest's pythonpath holds tools/)

from shardify.keepalive import close_connections
from shardify.remote import RetryPolicy, ShardFetchError, fetch_range

_TOOLS = Path(__file__).parents[3] / "tools"

NO_RETRY = RetryPolicy(retries=0, timeout_s=5.0)
DATA = bytes(range(256)) * 64  # 16 KiB


@pytest.fixture
def www(tmp_path: Path) -> Path:
    (tmp_path / "a.bin").write_bytes(DATA)
    return tmp_path


@pytest.fixture(autouse=True)
def _fresh_connections():
    """Each test starts and ends without kept connections in the test's thread."""
    close_connections()
    yield
    close_connections()


def _ranges(n: int) -> list[tuple[int, int]]:
    return [(i * 700 % 15000, i * 700 % 15000 + 1 + i * 37 % 1000) for i in range(n)]


def _wait_closed(served, timeout: float = 5.0) -> int:
    """The server's open connections once they reach 0 (or the timeout passes)."""
    deadline = time.monotonic() + timeout
    while served.open and time.monotonic() < deadline:
        time.sleep(0.02)
    return served.open


def test_ranged_gets_in_one_thread_use_one_connection(www):
    with rangeserver.serve(www) as (base, served):
        for a, b in _ranges(20):
            assert fetch_range(f"{base}/a.bin", a, b, retry=NO_RETRY) == DATA[a:b]
        assert served.gets == 20 and served.connections == 1


@pytest.mark.parametrize("how", ["silently", "announced"])
def test_a_server_that_closes_after_every_answer_needs_no_retry(www, how):
    with rangeserver.serve(www, rangeserver.Behaviour(close_after=how)) as (base, served):
        for a, b in _ranges(20):
            assert fetch_range(f"{base}/a.bin", a, b, retry=NO_RETRY) == DATA[a:b]
        assert served.gets == 20 and served.connections >= 20


def test_a_connection_dropped_mid_body_is_not_reused_and_counts_as_a_failure(www):
    with rangeserver.serve(www, rangeserver.Behaviour(drop_after=10, faults_left=0)) as (base, served):
        assert fetch_range(f"{base}/a.bin", 0, 100, retry=NO_RETRY) == DATA[:100]  # a kept connection
        served.faults_left = 1
        with pytest.raises(ShardFetchError):
            fetch_range(f"{base}/a.bin", 0, 100, retry=NO_RETRY)
        served.faults_left = 1
        once = RetryPolicy(retries=1, backoff_s=0.0, max_backoff_s=0.0, timeout_s=5.0)
        assert fetch_range(f"{base}/a.bin", 0, 100, retry=once) == DATA[:100]
        assert served.connections == 3


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param({"wrong_range": 1}, id="wrong-content-range"),
        pytest.param({"ignore_range": True}, id="whole-file"),
    ],
)
def test_a_wrong_answer_on_a_kept_connection_is_refused_and_the_next_read_is_right(www, fault):
    with rangeserver.serve(www) as (base, served):
        assert fetch_range(f"{base}/a.bin", 0, 100, retry=NO_RETRY) == DATA[:100]
        for key, value in fault.items():
            setattr(served, key, value)
        with pytest.raises(ShardFetchError):
            fetch_range(f"{base}/a.bin", 100, 200, retry=RetryPolicy(retries=2, backoff_s=0.0, max_backoff_s=0.0))
        assert len(served.paths) == 2  # refused at once, not retried
        for key, value in fault.items():
            setattr(served, key, type(value)())
        assert fetch_range(f"{base}/a.bin", 200, 300, retry=NO_RETRY) == DATA[200:300]


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_followed_each_time_and_not_remembered(www, status):
    with rangeserver.serve(www) as (base, served):
        served.redirects["old.bin"] = (status, "/a.bin")
        for _ in range(3):
            assert fetch_range(f"{base}/old.bin", 100, 200, retry=NO_RETRY) == DATA[100:200]
        assert served.paths == ["old.bin", "a.bin"] * 3 and served.connections == 1


def test_five_redirects_are_followed(www):
    with rangeserver.serve(www) as (base, served):
        served.redirects.update({f"hop-{i}": (307, f"/hop-{i + 1}") for i in range(1, 5)})
        served.redirects["hop-5"] = (307, f"{base}/a.bin")
        assert fetch_range(f"{base}/hop-1", 5, 50, retry=NO_RETRY) == DATA[5:50]


@pytest.mark.parametrize(
    ("redirects", "gets"),
    [
        pytest.param({"old.bin": "file:///etc/passwd"}, 1, id="to-file"),
        pytest.param({"old.bin": "ftp://127.0.0.1/a.bin"}, 1, id="to-ftp"),
        pytest.param({"old.bin": "/old.bin"}, 6, id="a-loop"),
        pytest.param(
            {"old.bin": "/hop-1", **{f"hop-{i}": f"/hop-{i + 1}" for i in range(1, 5)}, "hop-5": "/a.bin"}, 6, id="six"
        ),
    ],
)
def test_a_redirect_elsewhere_or_too_many_is_refused_naming_the_url(www, redirects, gets):
    with rangeserver.serve(www) as (base, served):
        served.redirects.update({path: (302, to) for path, to in redirects.items()})
        with pytest.raises(ShardFetchError) as e:
            fetch_range(f"{base}/old.bin", 0, 10, retry=RetryPolicy(retries=1, backoff_s=0.0, max_backoff_s=0.0))
        assert e.value.shard == f"{base}/old.bin" and "a.bin" not in served.paths
        assert len(served.paths) == gets  # refused at once, not retried: the first answer and 5 redirects


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter with ``env`` on top of a proxy-free environment."""
    clean = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    return subprocess.run(
        [sys.executable, "-W", "always::ResourceWarning", "-c", textwrap.dedent(code)],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


_FETCH = """
    from shardify.remote import RetryPolicy, ShardFetchError, fetch_range
    try:
        policy = RetryPolicy(retries=0, timeout_s=5.0)
        data = fetch_range({url!r}, 0, 50, retry=policy) + fetch_range({url!r}, 50, 100, retry=policy)
        print("ok" if data == bytes(range(100)) else "wrong bytes")
    except ShardFetchError:
        print("ShardFetchError")
"""


def test_a_proxy_in_the_environment_is_used(www):
    with rangeserver.serve(www) as (proxy, served):  # a proxy answers a GET of an absolute URL
        out = _run(_FETCH.format(url="http://shards.invalid/a.bin"), {"http_proxy": proxy})
        assert out.stdout.strip() == "ok", out.stderr
        assert served.paths == ["a.bin", "a.bin"]
        served.paths.clear()
        out = _run(_FETCH.format(url="http://shards.invalid/a.bin"), {})
        assert out.stdout.strip() == "ShardFetchError", out.stderr  # without it: no such host
        assert served.paths == []


def test_no_proxy_bypasses_the_proxy(www):
    dead = "http://127.0.0.1:9"  # nothing listens: a request through it fails
    with rangeserver.serve(www) as (base, served):
        url = f"{base}/a.bin"
        out = _run(_FETCH.format(url=url), {"http_proxy": dead, "no_proxy": "127.0.0.1"})
        assert out.stdout.strip() == "ok", out.stderr
        assert served.gets == 2 and served.connections == 1  # directly, over a kept connection
        out = _run(_FETCH.format(url=url), {"http_proxy": dead})
        assert out.stdout.strip() == "ShardFetchError", out.stderr
        assert served.gets == 2


_SWITCH = """
    import os
    from shardify.remote import RetryPolicy, ShardFetchError, fetch_range
    policy = RetryPolicy(retries=0, timeout_s=5.0)

    def fetch():
        try:
            return "ok" if fetch_range({url!r}, 0, 50, retry=policy) == bytes(range(50)) else "wrong bytes"
        except ShardFetchError:
            return "ShardFetchError"

    seen = [fetch()]
    os.environ["http_proxy"] = {dead!r}
    seen.append(fetch())
    os.environ["no_proxy"] = "127.0.0.1"
    seen.append(fetch())
    del os.environ["http_proxy"], os.environ["no_proxy"]
    seen.append(fetch())
    print(" ".join(seen))
"""


def test_the_proxy_decision_follows_the_environment_as_it_changes(www):
    """The decision is remembered per host (urllib's costs as much as a request), yet a proxy
    set, bypassed or removed between two requests to one host is seen at the next."""
    dead = "http://127.0.0.1:9"
    with rangeserver.serve(www) as (base, served):
        out = _run(_SWITCH.format(url=f"{base}/a.bin", dead=dead), {})
        assert out.stdout.split() == ["ok", "ShardFetchError", "ok", "ok"], out.stderr
        assert served.gets == 3


_MOVE = """
    import os
    from shardify.remote import RetryPolicy, fetch_range
    policy = RetryPolicy(retries=0, timeout_s=5.0)
    for proxy in ({first!r}, {second!r}):
        os.environ["http_proxy"] = proxy
        assert fetch_range("http://shards.invalid/a.bin", 0, 50, retry=policy) == bytes(range(50))
    print("ok")
"""


def test_a_proxy_moved_to_another_address_is_used_at_the_next_request(www):
    """urllib reads the proxies when its opener is built: one opener per proxy setting."""
    with rangeserver.serve(www) as (first, one), rangeserver.serve(www) as (second, two):
        out = _run(_MOVE.format(first=first, second=second), {})
        assert out.stdout.strip() == "ok", out.stderr
        assert (one.paths, two.paths) == (["a.bin"], ["a.bin"])


def test_the_proxy_decision_is_made_once_per_host_and_environment(www, monkeypatch):
    import urllib.request

    calls = []
    real = urllib.request.getproxies
    monkeypatch.setattr(urllib.request, "getproxies", lambda: calls.append(1) or real())
    for name in ("http_proxy", "HTTP_PROXY", "no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    with rangeserver.serve(www) as (base, _):
        for i in range(5):
            assert fetch_range(f"{base}/a.bin", i, i + 10, retry=NO_RETRY) == DATA[i : i + 10]
    assert len(calls) == 1


def test_a_threads_connections_close_when_it_ends_without_resource_warnings(www):
    code = """
        import gc, sys, threading
        from concurrent.futures import ThreadPoolExecutor
        from shardify.remote import RetryPolicy, fetch_range
        url = sys.argv[1]
        def fetch():
            for i in range(5):
                got = fetch_range(url, i, i + 10, retry=RetryPolicy(retries=0, timeout_s=5.0))
                assert got == bytes(range(i, i + 10))
        t = threading.Thread(target=fetch)
        t.start()
        t.join()
        pool = ThreadPoolExecutor(4)
        for _ in range(8):
            pool.submit(fetch)
        pool.shutdown(wait=True)
        gc.collect()
        print("done", flush=True)
        sys.stdin.read()  # the test looks at the server's open connections now
    """
    with rangeserver.serve(www) as (base, served):
        proc = subprocess.Popen(
            [sys.executable, "-W", "always::ResourceWarning", "-c", textwrap.dedent(code), f"{base}/a.bin"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "done"
            assert 2 <= served.connections <= 5 and _wait_closed(served) == 0
        finally:
            _, err = proc.communicate("", timeout=30)
    assert proc.returncode == 0 and "ResourceWarning" not in err, err


def test_threads_of_a_pool_each_keep_their_own_connection(www):
    with rangeserver.serve(www) as (base, served):
        pool = ThreadPoolExecutor(4)
        futures = [pool.submit(fetch_range, f"{base}/a.bin", a, b, retry=NO_RETRY) for a, b in _ranges(64)]
        assert [f.result() for f in futures] == [DATA[a:b] for a, b in _ranges(64)]
        pool.shutdown(wait=True)
        assert served.connections <= 4 and _wait_closed(served) == 0
