"""Fault injection: every way tools/rangeserver.py can misbehave, through the public API
(``ShardedDataset`` + ``make_loader``; ``resolve_source`` for the metadata), ranged and
whole-shard (``CacheOptions(ranged=False)``), with 0 workers and, for a representative few, 2.

Each case ends EITHER in a typed error (a :class:`~shardify.errors.ShardifyError`) that names
the shard or URL, OR in a correct epoch (every key exactly once, as a local read gives), and
within :data:`BOUND_S` under a fast retry policy. Faults that pass (one dropped connection, a
few 429/503) are set to misbehave once (``faults_left``), so the retry succeeds; permanent ones
end in the error. Tampered datasets (an index or manifest edited, moved out of its folder) are
tests/reader/test_tampered.py's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import rangeserver  # tools/rangeserver.py (pytest's pythonpath holds tools/)

from shardify.convert import ShardWriter
from shardify.errors import ShardifyError
from shardify.reader import CacheOptions, ShardedDataset, make_loader
from shardify.reader.io.sources import resolve_source
from shardify.remote import RetryPolicy

BOUND_S = 30.0
"""Generous: the slowest case (a trickle, every attempt to its 2 s deadline) takes about 5 s."""
TIME_LIMIT_S = 90  # a hang fails the test (tests/conftest.py)
FAST = RetryPolicy(retries=1, backoff_s=0.01, max_backoff_s=0.02, timeout_s=1.0, deadline_s=2.0, max_retry_after_s=1.0)
TAR = (".tar",)

OK, ERROR = "epoch", "error"

# name -> (Behaviour options, outcome ranged, outcome whole-shard). Whole-shard downloads ask
# for no Range, so the Range faults do not touch them.
FAULTS: dict[str, tuple[dict[str, Any], str, str]] = {
    "ignored-range": ({"ignore_range": True}, OK, OK),
    "wrong-content-range": ({"wrong_range": 8}, ERROR, OK),
    "missing-content-range": ({"no_content_range": True}, ERROR, OK),
    "short-body": ({"short": 10}, ERROR, OK),
    "long-body-once": ({"extra_body": 4096, "no_length": True, "faults_left": 1}, OK, OK),
    "long-body": ({"extra_body": 4096, "no_length": True}, ERROR, ERROR),
    "dropped-once": ({"drop_after": 100, "faults_left": 1}, OK, OK),
    "dropped": ({"drop_after": 100}, ERROR, ERROR),
    "stalled-after-headers": ({"stall_at": 0.0}, ERROR, ERROR),
    "stalled-mid-body": ({"stall_at": 0.5}, ERROR, ERROR),
    "trickled-body": ({"trickle_bps": 1}, ERROR, ERROR),
    "trickled-headers": ({"header_bps": 1}, ERROR, ERROR),
    "429-retry-after-once": ({"error_status": 429, "retry_after": "1", "faults_left": 1}, OK, OK),
    "503-once": ({"error_status": 503, "faults_left": 1}, OK, OK),
    "503": ({"error_status": 503, "retry_after": "0"}, ERROR, ERROR),
    "500": ({"error_status": 500}, ERROR, ERROR),
    "html-200": ({"html_200": True}, ERROR, ERROR),
}
REDIRECTS = {"to-file": ERROR, "to-ftp": ERROR, "to-another-host": OK}
WITH_WORKERS = ("dropped-once", "503", "stalled-mid-body", "ignored-range")


@pytest.fixture(scope="module")
def www(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``www/ds``: 24 samples of ~2 KB in 3 shards (never changed by a test)."""
    root = tmp_path_factory.mktemp("www")
    with ShardWriter(root / "ds", samples_per_shard=8, fsync=False) as w:
        for i in range(24):
            w.write({"txt": chr(97 + i % 26) * 2000, "cls": i % 5})
    return root


@pytest.fixture(scope="module")
def local_keys(www: Path) -> list[str]:
    return sorted(_keys(str(www / "ds"), CacheOptions(), 0))


def _keys(spec: str, cache: CacheOptions, workers: int) -> list[str]:
    ds = ShardedDataset(spec, batch_size=4, fields=("__key__",), cache=cache)
    with make_loader(ds, num_workers=workers) as loader:
        return [str(k) for batch in loader for k in batch]


def _run(spec: str, cache: CacheOptions, workers: int) -> tuple[float, list[str] | ShardifyError]:
    start = time.monotonic()
    try:
        got: list[str] | ShardifyError = _keys(spec, cache, workers)
    except ShardifyError as e:
        got = e
    return time.monotonic() - start, got


def _check(got: list[str] | ShardifyError, took: float, outcome: str, local: list[str], names: tuple[str, ...]) -> None:
    assert took < BOUND_S, f"took {took:.1f} s"
    if outcome == OK:
        assert isinstance(got, list), got
        assert sorted(got) == local  # every key exactly once
    else:
        assert isinstance(got, ShardifyError), f"expected an error, read {len(got)} keys"
        said = f"{got} {getattr(got, 'shard', '')}"
        assert any(n in said for n in names), said


def _shard_names(www: Path) -> tuple[str, ...]:
    return tuple(sorted(p.name for p in (www / "ds").glob("*.tar")))


def _cases() -> Iterator[Any]:
    for name, (_, ranged_outcome, whole_outcome) in FAULTS.items():
        for ranged, outcome in ((True, ranged_outcome), (False, whole_outcome)):
            for workers in (0, 2) if name in WITH_WORKERS else (0,):
                mode = "ranged" if ranged else "whole"
                yield pytest.param(name, ranged, workers, outcome, id=f"{name}-{mode}-{workers}w")


@pytest.mark.parametrize(("fault", "ranged", "workers", "outcome"), list(_cases()))
def test_a_faulty_shard_server(www, local_keys, tmp_path, fault, ranged, workers, outcome):
    options, _, _ = FAULTS[fault]
    behaviour = rangeserver.Behaviour(fault_paths=TAR, **options)
    cache = CacheOptions(ranged=ranged, dir=tmp_path / "cache", retry=FAST)
    with rangeserver.serve(www, behaviour) as (base, _):
        took, got = _run(f"{base}/ds", cache, workers)
    _check(got, took, outcome, local_keys, _shard_names(www))


@pytest.mark.parametrize("ranged", [True, False], ids=["ranged", "whole"])
@pytest.mark.parametrize("where", list(REDIRECTS))
def test_a_redirected_shard(www, local_keys, tmp_path, where, ranged):
    """Every shard redirected: to another scheme (refused), or to another host (followed)."""
    names = _shard_names(www)
    with rangeserver.serve(www) as (other, _):
        targets = {
            "to-file": lambda name: f"file://{www}/ds/{name}",
            "to-ftp": lambda name: f"ftp://127.0.0.1:1/ds/{name}",
            "to-another-host": lambda name: f"{other}/ds/{name}",
        }
        redirects = {f"ds/{n}": (302, targets[where](n)) for n in names}
        with rangeserver.serve(www, rangeserver.Behaviour(redirects=redirects)) as (base, _):
            cache = CacheOptions(ranged=ranged, dir=tmp_path / "cache", retry=FAST)
            took, got = _run(f"{base}/ds", cache, 0)
    _check(got, took, REDIRECTS[where], local_keys, names)
    if where != "to-another-host":  # refused at once, not tried (urllib alone would follow ftp://)
        assert any(s in str(got) for s in ("only http:// and https:// redirects", "is not allowed")), got


@pytest.mark.parametrize(
    "fault",
    [
        {"header_bps": 1},
        {"trickle_bps": 1},
        {"stall_at": 0.0},
        {"error_status": 503, "retry_after": "0"},
        {"error_status": 429, "retry_after": "1", "faults_left": 1},
        {"html_200": True},
        {"drop_after": 10, "faults_left": 1},
    ],
    ids=["trickled-headers", "trickled-body", "stalled", "503", "429-once", "html-200", "dropped-once"],
)
def test_a_faulty_manifest(www, fault):
    """The manifest is fetched like a shard: it either arrives whole and right or the source
    is an error naming its URL, within the bound."""
    behaviour = rangeserver.Behaviour(fault_paths=("manifest.json",), **fault)
    with rangeserver.serve(www, behaviour) as (base, _):
        start = time.monotonic()
        try:
            got: Any = resolve_source(f"{base}/ds", retry=FAST)
        except ShardifyError as e:
            got = e
        took = time.monotonic() - start
    assert took < BOUND_S
    if "faults_left" in fault:
        assert not isinstance(got, ShardifyError), got
        assert got.num_samples == 24
    else:
        assert isinstance(got, ShardifyError), got
        assert "manifest.json" in f"{got} {getattr(got, 'shard', '')}"
