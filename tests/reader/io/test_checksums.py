"""``verify=`` with checksums the user gives: shards without a split index,
local or over HTTP, checked against a mapping or a ``sha256sum`` sidecar file."""

from __future__ import annotations

import functools
import hashlib
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from shardify.errors import ManifestError, ShardFormatError
from shardify.reader import DecodeOptions, ShardedDataset, make_loader
from shardify.reader.io.sources import resolve_source
from shardify.remote import RetryPolicy, ShardFetchError

TIME_LIMIT_S = 60
"""A hang fails the test instead of stalling the run (see tests/conftest.py)."""


@pytest.fixture
def www(tmp_path, shards) -> Path:
    """3 counting shards of 5 samples and their ``SHA256SUMS``, in ``www/``."""
    root = tmp_path / "www"
    root.mkdir()
    lines = []
    for i, samples in enumerate(shards.counting([5, 5, 5])):
        data = shards.tar_bytes(samples)
        (root / f"part-{i}.tar").write_bytes(data)
        lines.append(f"{hashlib.sha256(data).hexdigest()}  part-{i}.tar\n")
    (root / "SHA256SUMS").write_text("".join(lines))
    return root


def tamper(path: Path) -> None:
    """Change one label digit; the tar stays well formed, only a checksum can tell."""
    data = bytearray(path.read_bytes())
    at = data.index(b"ustar") + 512 - 257  # the first member's data
    data[at] = ord("9") if data[at] != ord("9") else ord("8")
    path.write_bytes(bytes(data))


def urls(root: Path) -> list[str]:
    return [str(root / f"part-{i}.tar") for i in range(3)]


def values(ds: ShardedDataset, workers: int = 0) -> list[int]:
    with make_loader(ds, num_workers=workers) as loader:
        return sorted(int(x) for b in loader for x in b)


@pytest.mark.parametrize("how", ["sidecar", "mapping"])
def test_user_checksums_pass_intact_shards_and_catch_a_tampered_one(www, how):
    sums = str(www / "SHA256SUMS")
    if how == "mapping":
        sums = {line.split()[1]: line.split()[0] for line in (www / "SHA256SUMS").read_text().splitlines()}
    ds = ShardedDataset(urls(www), batch_size=4, fields=("cls",), decoding=DecodeOptions(verify=sums))
    assert values(ds, workers=2) == list(range(15))
    tamper(www / "part-1.tar")
    assert len(values(ShardedDataset(urls(www), batch_size=4, fields=("cls",)))) == 15  # unnoticed without
    with pytest.raises(ShardFormatError, match=r"part-1\.tar: sha256 .* does not match"):
        values(ShardedDataset(urls(www), batch_size=4, fields=("cls",), decoding=DecodeOptions(verify=sums)), workers=2)
    ds = ShardedDataset(urls(www), batch_size=4, fields=("cls",), decoding=DecodeOptions(verify=sums, on_error="skip"))
    assert set(values(ds)) == set(range(5)) | set(range(10, 15)) and ds.last_epoch_report.lost == 5


def test_checksums_given_wrong_are_refused_when_the_dataset_is_made(www):
    with pytest.raises(ValueError, match="verify=True needs each shard's sha256.*SHA256SUMS"):
        ShardedDataset(urls(www), batch_size=4, decoding=DecodeOptions(verify=True))
    with pytest.raises(ValueError, match=r"no checksum for shard .*part-2\.tar"):
        ShardedDataset(
            urls(www), batch_size=4, decoding=DecodeOptions(verify={"part-0.tar": "0" * 64, "part-1.tar": "0" * 64})
        )
    with pytest.raises(ValueError, match="not 64 hex digits"):
        ShardedDataset(urls(www), batch_size=4, decoding=DecodeOptions(verify={"part-0.tar": "abc"}))
    (www / "BAD").write_text("not a checksum line\n")
    with pytest.raises(ManifestError, match="BAD, line 1: want"):
        ShardedDataset(urls(www), batch_size=4, decoding=DecodeOptions(verify=str(www / "BAD")))
    with pytest.raises(ManifestError, match="cannot read the checksum file"):
        ShardedDataset(urls(www), batch_size=4, decoding=DecodeOptions(verify=str(www / "MISSING")))


@pytest.fixture
def served(www) -> Iterator[str]:
    """The URL of ``www/`` on an HTTP server on 127.0.0.1 for this test only."""
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(www))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


def test_a_shard_list_over_http_is_checked_against_a_sidecar_over_http(www, served, tmp_path):
    remote = [f"{served}/part-{i}.tar" for i in range(3)]
    fast = RetryPolicy(retries=1, backoff_s=0.0, max_backoff_s=0.0)
    source = resolve_source(remote, cache_dir=tmp_path / "cache", retry=fast)
    ds = ShardedDataset(source, batch_size=4, fields=("cls",), decoding=DecodeOptions(verify=f"{served}/SHA256SUMS"))
    assert [s.sha256 for s in ds.source.shards] == [
        line.split()[0] for line in (www / "SHA256SUMS").read_text().splitlines()
    ]
    assert values(ds) == list(range(15))
    tamper(www / "part-2.tar")
    source = resolve_source(remote, cache_dir=tmp_path / "cache2", retry=fast)
    ds = ShardedDataset(source, batch_size=4, fields=("cls",), decoding=DecodeOptions(verify=f"{served}/SHA256SUMS"))
    with pytest.raises(ShardFetchError, match=r"part-2\.tar: .*sha256 is .* the manifest says"):
        values(ds)
