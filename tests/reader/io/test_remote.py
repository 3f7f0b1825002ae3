"""Remote datasets: a converted dataset served over HTTP on 127.0.0.1 (a thread in the test),
read like the local copy; dropped connections, failing servers, servers that ignore Range,
fsspec URLs, and a local cache folder shared by several processes."""

from __future__ import annotations

import errno
import gzip
import hashlib
import json
import multiprocessing
import os
import pickle
import re
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

from shardify.convert.options import ConvertOptions
from shardify.convert.synth import make_imagefolder
from shardify.convert.write.run import convert_imagefolder
from shardify.errors import ManifestError, ShardFormatError
from shardify.reader import (
    CacheOptions,
    DecodeOptions,
    SamplingOptions,
    ShardedDataset,
    make_loader,
)
from shardify.reader import transforms as T
from shardify.reader.io.cache import FetchOptions, ShardCache, shard_cache
from shardify.reader.io.sources import Source, resolve_source
from shardify.reader.io.stream import ShardReader
from shardify.remote import RetryPolicy, ShardFetchError, join_url

FAST = RetryPolicy(retries=3, backoff_s=0.01, max_backoff_s=0.02, timeout_s=5.0, chunk_bytes=1024)
NAMES: list[str] = []
"""The converted dataset's shard names (they carry its version token), set by ``dataset``."""
SHARD = ""


@dataclass
class Faults:
    """What the test server does wrong; ``drop`` and ``fail`` count down per shard name."""

    drop: dict[str, int] = field(default_factory=dict)  # name -> cut the body after N bytes, once
    reset: bool = False  # cut with a TCP reset instead of a clean close
    fail: dict[str, int] = field(default_factory=dict)  # name -> HTTP status, every time
    ignore_range: bool = False
    wrong_range: bool = False  # answer a Range request with bytes from one byte earlier
    requests: list[tuple[str, str | None, int]] = field(default_factory=list)  # (name, Range, status)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def gets(self, name: str) -> list[tuple[str | None, int]]:
        with self.lock:
            return [(r, s) for n, r, s in self.requests if n == name]


class _Handler(BaseHTTPRequestHandler):
    """Serves files under ``server.root``; supports ``Range: bytes=N-``."""

    timeout = 10  # no handler thread outlives a stuck client

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        faults: Faults = self.server.faults  # type: ignore[attr-defined]
        rel = unquote(urlsplit(self.path).path).lstrip("/")
        name, rng = rel.rsplit("/", 1)[-1], self.headers.get("Range")
        path = self.server.root / rel  # type: ignore[attr-defined]
        status, start, end = 200, 0, None
        if name in faults.fail:
            status = faults.fail[name]
        elif not path.is_file():
            status = 404
        elif rng and not faults.ignore_range:
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng)
            status, start = 206, int(m.group(1))  # type: ignore[union-attr]
            end = int(m.group(2)) + 1 if m.group(2) else None  # type: ignore[union-attr]
            start -= faults.wrong_range
        with faults.lock:
            faults.requests.append((name, rng, status))
        if status >= 400:
            self.send_error(status)
            return
        data = path.read_bytes()
        total = len(data)
        if end is not None:
            data = data[:end]
        self.send_response(status)
        self.send_header("Content-Length", str(len(data) - start))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{total}")
        self.end_headers()
        body = data[start:]
        with faults.lock:
            cut = faults.drop.pop(name, None)
        if cut is None:
            self.wfile.write(body)
            return
        self.wfile.write(body[:cut])
        self.wfile.flush()
        if faults.reset:  # closed with linger 0 and no shutdown(): the client gets a TCP reset
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.server.resets.add(self.connection)  # type: ignore[attr-defined]


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root, self.faults, self.resets = root, Faults(), set()

    def shutdown_request(self, request: Any) -> None:
        if request in self.resets:
            self.resets.discard(request)
            request.close()
            return
        super().shutdown_request(request)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A converted dataset of 18 small JPEGs in 5 shards (4, 4, 4, 4, 2 samples)."""
    base = tmp_path_factory.mktemp("remote")
    src = make_imagefolder(base / "src", classes=3, per_class=6, sizes=((40, 32), (32, 40)))
    options = ConvertOptions(samples_per_shard=4, workers=1, progress=False)
    convert_imagefolder(src, base / "www" / "ds", options=options)
    global SHARD
    NAMES[:] = [s["url"] for s in json.loads((base / "www" / "ds" / "train.json").read_text())["shardlist"]]
    SHARD = NAMES[1]
    return base / "www" / "ds"


@pytest.fixture
def server(dataset: Path) -> Iterator[tuple[str, Faults]]:
    """``(url of the dataset, faults)``: an HTTP server on 127.0.0.1 for this test only."""
    httpd = _Server(dataset.parent)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/ds", httpd.faults
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


def keys_of(source: Source, *, opener: Any = None) -> list[list[str]]:
    """Every shard's keys, read whole through a ShardReader (as a worker does)."""
    reader = ShardReader(
        [s.url for s in source.shards], source.sizes, skip_damaged=False, opener=opener or source.open_tar
    )
    try:
        return [[str(x["__key__"]) for x in reader.read(i, 0, n)] for i, n in enumerate(source.sizes)]
    finally:
        reader.close()


def test_an_epoch_over_http_matches_the_local_one_batch_for_batch(dataset, server):
    url, faults = server

    def batches(where: str) -> list[tuple[Any, ...]]:
        ds = ShardedDataset(
            where,
            split="train",
            batch_size=4,
            shuffle=True,
            seed=3,
            sampling=SamplingOptions(shuffle_block=2),
            transform=T.ResizeCenterCrop(resize=24, crop=16),
        )
        ds.set_epoch(1)
        return [tuple(batch) for batch in make_loader(ds, num_workers=2)]

    local, remote = batches(str(dataset)), batches(url)
    assert len(local) == len(remote) == 5
    for (li, ll), (ri, rl) in zip(local, remote):
        assert li.shape == ri.shape and bool((li == ri).all()) and ll.tolist() == rl.tolist()
    assert all(status in (200, 206) for _, _, status in faults.requests)


@pytest.mark.parametrize("spec", ["{url}", "{url}/", "{url}/manifest.json", "{url}/train.json"])
def test_folder_manifest_and_index_urls_resolve_alike(dataset, server, spec):
    url, _ = server
    local = resolve_source(dataset, split="train")
    src = resolve_source(spec.format(url=url), split="train", retry=FAST)
    assert src.split == "train" and src.sizes == local.sizes == [4, 4, 4, 4, 2]
    assert [s.url for s in src.shards] == [f"{url}/{NAMES[i]}" for i in range(5)]
    assert [(s.filesize, s.sha256) for s in src.shards] == [(s.filesize, s.sha256) for s in local.shards]
    assert src.classes == local.classes


def test_shard_pattern_url_without_manifest_is_counted_and_read(dataset, server):
    url, _ = server
    version = NAMES[0].split("-")[1]
    src = resolve_source(url + f"/train-{version}-{{000000..000004}}.tar", retry=FAST)
    assert src.sizes == [4, 4, 4, 4, 2] and src.split is None
    assert keys_of(src) == keys_of(resolve_source(dataset))


@pytest.mark.parametrize("reset", [False, True], ids=["close", "reset"])
def test_dropped_connection_resumes_with_range_and_same_samples(dataset, server, reset):
    url, faults = server
    faults.drop[SHARD], faults.reset = 3000, reset
    assert keys_of(resolve_source(url, retry=FAST)) == keys_of(resolve_source(dataset))
    (first, second), rng = faults.gets(SHARD), None
    assert first == (None, 200)
    if second[0] is not None or not reset:  # a reset may also discard the bytes already sent
        rng = re.fullmatch(r"bytes=(\d+)-", second[0] or "")
        assert rng is not None and 0 < int(rng.group(1)) <= 3000 and second[1] == 206


def test_wrong_content_range_is_refused(server):
    url, faults = server
    faults.drop[SHARD], faults.wrong_range = 3000, True
    with pytest.raises(
        ShardFetchError,
        match=r"Range bytes=3000-, the server answered 206 with "
        r"Content-Range 'bytes 2999-\d+/\d+'",
    ):
        keys_of(resolve_source(url, retry=FAST))


def test_gzip_shards_over_http(dataset, server):
    url, _ = server
    (dataset.parent / "gz").mkdir(exist_ok=True)
    for i in range(5):
        data = (dataset / NAMES[i]).read_bytes()
        (dataset.parent / "gz" / f"part-{i}.tgz").write_bytes(gzip.compress(data, mtime=0))
    src = resolve_source(url.replace("/ds", "/gz/part-{0..4}.tgz"), retry=FAST)
    assert src.sizes == [4, 4, 4, 4, 2] and keys_of(src) == keys_of(resolve_source(dataset))


def test_server_that_ignores_range_restarts_the_shard_without_duplicates(dataset, server):
    url, faults = server
    faults.drop[SHARD], faults.ignore_range = 3000, True
    got, want = keys_of(resolve_source(url, retry=FAST)), keys_of(resolve_source(dataset))
    assert got == want and len(set(got[1])) == 4
    assert [s for _, s in faults.gets(SHARD)] == [200, 200] and faults.gets(SHARD)[1][0] is not None


@pytest.mark.parametrize(
    ("status", "attempts", "cause"),
    [
        pytest.param(503, 4, "gave up after 4 attempts.*HTTP 503", id="5xx-retried"),
        pytest.param(429, 4, "gave up after 4 attempts.*HTTP 429", id="429-retried"),
        pytest.param(403, 1, "cannot fetch: HTTP 403", id="4xx-at-once"),
    ],
)
def test_failing_server_gives_a_clear_error_after_the_budget(server, status, attempts, cause):
    url, faults = server
    src = resolve_source(url, retry=FAST)
    faults.fail[SHARD] = status
    began = time.monotonic()
    with pytest.raises(ShardFetchError, match=f"shard {re.escape(url)}/{SHARD}: {cause}") as info:
        keys_of(src)
    assert time.monotonic() - began < 5 and len(faults.gets(SHARD)) == attempts
    assert isinstance(info.value, ShardFormatError) and info.value.shard == f"{url}/{SHARD}"
    again = pickle.loads(pickle.dumps(info.value))  # crosses from a worker to the trainer
    assert str(again) == str(info.value) and again.shard == info.value.shard


def test_corrupt_copy_on_the_server_fails_the_checksum(dataset, server, tmp_path):
    url, faults = server
    src = resolve_source(url, retry=RetryPolicy(retries=1, backoff_s=0.0, max_backoff_s=0.0))
    shard = dataset / SHARD
    good = shard.read_bytes()
    try:
        shard.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
        with pytest.raises(ShardFetchError, match="sha256 is .* the manifest says"):
            keys_of(src)
    finally:
        shard.write_bytes(good)
    assert len(faults.gets(SHARD)) == 2


def test_missing_remote_dataset_is_a_manifest_error(server):
    url, _ = server
    with pytest.raises(ManifestError, match=r"/nothing/manifest.json: cannot read manifest: .*HTTP 404"):
        resolve_source(url.replace("/ds", "/nothing"), retry=FAST)


def _read_in_child(url: str, cache_dir: str, out: Any) -> None:
    try:
        src = resolve_source(url, retry=FAST, cache_dir=cache_dir)
        out.put(keys_of(src))
    except BaseException as e:  # reported to the test, not lost in the child
        out.put(repr(e))


def test_two_processes_sharing_a_cache_fetch_each_shard_once(dataset, server, tmp_path):
    url, faults = server
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_read_in_child, args=(url, str(tmp_path / "cache"), out)) for _ in range(2)]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=60) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    want = keys_of(resolve_source(dataset))
    assert results == [want, want]
    shards = Counter(n for n, _, _ in faults.requests if n.endswith(".tar"))
    assert shards == {NAMES[i]: 1 for i in range(5)}
    cache = ShardCache(tmp_path / "cache")
    assert len(cache.entries()) == 5 and not list((tmp_path / "cache").glob("*.part-*"))


def test_cache_limit_keeps_the_most_recently_used(dataset, server, tmp_path):
    url, faults = server
    sizes = [(dataset / NAMES[i]).stat().st_size for i in range(5)]
    limit = sizes[4] + max(sizes[:4])
    src = resolve_source(url, retry=FAST, cache_dir=tmp_path / "c", cache_limit_bytes=limit)
    keys_of(src)
    cache = ShardCache(tmp_path / "c")
    kept = [p.name.split("-", 1)[1] for _, _, p in cache.entries()]
    assert sum(size for _, size, _ in cache.entries()) <= limit
    assert kept == [NAMES[3], NAMES[4]]
    before = len(faults.requests)
    src.open_tar(src.shards[4].url)[0].close()  # a hit: no request
    assert len(faults.requests) == before
    src.open_tar(src.shards[0].url)[0].close()  # evicted: fetched again, 3 evicted now
    assert faults.gets(NAMES[0])[-1] == (None, 200) and len(faults.requests) == before + 1
    assert [p.name.split("-", 1)[1] for _, _, p in cache.entries()] == [NAMES[4], NAMES[0]]


def test_leftover_part_and_wrong_size_copies_are_never_used(dataset, server, tmp_path):
    url, faults = server
    src = resolve_source(url, retry=FAST, cache_dir=tmp_path / "c")
    info = src.shards[1]
    final = ShardCache(tmp_path / "c").path_for(info.url, info.sha256)
    junk = b"\0" * info.filesize  # looks whole by its size
    final.with_name(final.name + ".part-12345-0badf00d").write_bytes(junk)
    f, _ = src.open_tar(info.url)
    with f:
        assert hashlib.sha256(f.read()).hexdigest() == info.sha256
    assert len(faults.gets(SHARD)) == 1 and not list(final.parent.glob("*.part-*"))
    final.write_bytes((dataset / SHARD).read_bytes()[:-512])  # a damaged copy under the final name
    f, _ = src.open_tar(info.url)
    with f:
        assert hashlib.sha256(f.read()).hexdigest() == info.sha256
    assert len(faults.gets(SHARD)) == 2


def _temp_cache_child(url: str, out: Any) -> None:
    try:
        src = resolve_source(url, retry=FAST)
        keys = keys_of(src)
        cache = shard_cache(src.fetch)
        out.put((keys, str(cache.directory), len(cache.entries())))
    except BaseException as e:
        out.put(repr(e))


def test_without_cache_dir_a_process_keeps_two_shards_and_removes_them_at_exit(dataset, server):
    url, _ = server
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    proc = ctx.Process(target=_temp_cache_child, args=(url, out))
    proc.start()
    try:
        result = out.get(timeout=60)
    finally:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
    keys, folder, kept = result
    assert keys == keys_of(resolve_source(dataset)) and kept == 2
    assert proc.exitcode == 0 and not Path(folder).exists()


def test_fsspec_url_reads_like_local(dataset):
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    for p in dataset.iterdir():
        fs.pipe(f"/remote-test/ds/{p.name}", p.read_bytes())
    try:
        src = resolve_source("memory://remote-test/ds", retry=FAST)
        assert src.shards[0].url == f"memory://remote-test/ds/{NAMES[0]}"
        assert keys_of(src) == keys_of(resolve_source(dataset))
        with pytest.raises(ManifestError, match="memory://remote-test/none/manifest.json: cannot read"):
            resolve_source("memory://remote-test/none", retry=FAST)
    finally:
        fs.rm("/remote-test", recursive=True)


@pytest.mark.parametrize(
    ("base", "relative", "want"),
    [
        pytest.param("http://h/ds/train.json", "train-000000.tar", "http://h/ds/train-000000.tar", id="http"),
        pytest.param("https://h/a/b/x.json", "../s.tar", "https://h/a/s.tar", id="http-parent"),
        pytest.param("s3://bucket/ds/train.json", "train-000000.tar", "s3://bucket/ds/train-000000.tar", id="s3"),
        pytest.param("s3://bucket/ds/train.json", "sub/../x.tar", "s3://bucket/ds/x.tar", id="s3-dots"),
        pytest.param("http://h/ds/train.json", "s3://other/x.tar", "s3://other/x.tar", id="absolute"),
    ],
)
def test_shard_urls_are_relative_to_the_index(base, relative, want):
    assert join_url(base, relative) == want


def test_options_are_checked():
    with pytest.raises(ValueError, match="retries"):
        RetryPolicy(retries=-1)
    with pytest.raises(ValueError, match="needs cache_dir"):
        FetchOptions(cache_limit_bytes=10)
    policy = RetryPolicy(backoff_s=1.0, max_backoff_s=4.0)
    assert all(0.5 <= policy.delay(1) <= 1.0 and policy.delay(n) <= 4.0 for n in range(1, 30))


def test_dataset_cache_dir_shared_by_two_workers_fetches_each_shard_once(dataset, server, tmp_path):
    url, faults = server
    ds = ShardedDataset(
        url,
        split="train",
        batch_size=4,
        shuffle=True,
        seed=0,
        sampling=SamplingOptions(shuffle_block=2),
        transform=T.ResizeCenterCrop(resize=24, crop=16),
        cache=CacheOptions(dir=tmp_path / "cache", ranged=False),
    )
    loader = make_loader(ds, num_workers=2)
    for epoch in range(2):
        ds.set_epoch(epoch)
        assert sum(len(labels) for _, labels in loader) == 18
    loader.close()
    shard_gets = Counter(n for n, _, _ in faults.requests if n.endswith(".tar"))
    assert shard_gets == {NAMES[i]: 1 for i in range(5)}


def test_unreachable_shard_under_the_skip_policy_is_counted_not_raised(dataset, server):
    url, faults = server
    faults.fail[SHARD] = 503
    ds = ShardedDataset(
        resolve_source(url, retry=FAST),
        batch_size=4,
        decoding=DecodeOptions(on_error="skip"),
        transform=T.ResizeCenterCrop(resize=24, crop=16),
    )
    batches = list(ds)
    assert len(batches) == len(ds) == 5
    report = ds.last_epoch_report
    assert report.lost == 4 and any(SHARD in shard and "503" in why for shard, _, why in report.entries)


@pytest.mark.parametrize(
    "spec",
    [
        "{path}",
        "{path}/manifest.json",
        "{path}/train.json",
        "file://{path}",
        "file://{path}/train.json",
        "{url}",
        "{url}/",
        "{url}/manifest.json",
        "{url}/train.json",
    ],
)
def test_info_and_verify_accept_what_the_reader_accepts(dataset, server, spec, capsys):
    from shardify.cli import main

    url, faults = server
    where = spec.format(path=dataset, url=url)
    assert main(["verify", where, "--json"]) == 0, capsys.readouterr()
    report = json.loads(capsys.readouterr().out)
    assert report == {"ok": True, "checked": {"train": {"shards": 5, "samples": 18}}, "problems": []}
    assert main(["info", where, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["splits"]["train"]["samples"] == 18 and info["splits"]["train"]["shards"] == 5
    if where.startswith("http"):
        assert len(faults.gets(SHARD)) == 1, "verify reads each shard once"


def test_verify_of_a_missing_remote_dataset_names_the_url(server, capsys):
    from shardify.cli import main

    url, _ = server
    missing = url.replace("/ds", "/nothing")
    assert main(["verify", missing]) == 1
    assert re.search(rf"{re.escape(missing)}/manifest.json: .*HTTP 404", capsys.readouterr().err)


class _FullDisk:
    """A file whose disk fills: ``write`` (or ``fsync``, via ``flush``) raises ENOSPC once
    ``room`` bytes were written; the bytes before that land."""

    def __init__(self, f: Any, room: int) -> None:
        self._f, self.room = f, room

    def write(self, data: bytes) -> int:
        if len(data) > self.room:
            self._f.write(bytes(data[: self.room]))
            self.room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self._f.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


@pytest.mark.parametrize("where", ["write", "fsync"])
def test_a_full_disk_names_the_shard_and_the_cache_and_leaves_no_entry(dataset, server, tmp_path, monkeypatch, where):
    """ENOSPC while a shard is downloaded into cache_dir: a clear error naming the shard and the
    folder; no copy under the final name and no .part file; the next reader (with room) fetches
    the shard again and reads its true bytes."""
    import shardify.reader.io.cache as cache_mod

    url, faults = server
    cache_dir = tmp_path / "cache"
    src = resolve_source(url, retry=FAST, cache_dir=cache_dir)
    info = src.shards[1]
    if where == "write":
        real_open = open
        monkeypatch.setattr(
            cache_mod,
            "open",
            lambda p, mode="r", *a, **k: (
                _FullDisk(real_open(p, mode, *a, **k), 700) if ".part-" in str(p) else real_open(p, mode, *a, **k)
            ),
            raising=False,
        )
    else:

        def fsync(fd: int) -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(cache_mod.os, "fsync", fsync)
    with pytest.raises(ShardFetchError) as caught:
        src.open_tar(info.url)
    message = str(caught.value)
    assert info.url in message and str(cache_dir) in message and "no space left" in message, message
    cause: BaseException | None = caught.value
    while cause is not None and not (isinstance(cause, OSError) and cause.errno == errno.ENOSPC):
        cause = cause.__cause__
    assert cause is not None  # chained with raise ... from
    assert ShardCache(cache_dir).entries() == [] and not list(cache_dir.glob("*.part-*"))
    monkeypatch.undo()
    reader = resolve_source(url, retry=FAST, cache_dir=cache_dir)  # a new reader, with room
    f, _ = reader.open_tar(info.url)
    with f:
        assert hashlib.sha256(f.read()).hexdigest() == info.sha256
    assert [r for r in faults.gets(SHARD)] == [(None, 200), (None, 200)]
    assert len(ShardCache(cache_dir).entries()) == 1
