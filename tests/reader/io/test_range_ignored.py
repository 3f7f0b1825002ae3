"""A server that ignores ``Range`` (answers 200 with the whole file, as Python's http.server
does): the reader switches that host to whole-shard reads, warns once per host and process, and
finishes the epoch with the same samples; no worker traceback for an expected condition."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import rangeserver  # tools/rangeserver.py (pytest's pythonpath holds tools/)
from builders import text_dataset

from shardify.reader import CacheOptions, ShardedDataset, make_loader
from shardify.remote import RangeNotSupported, RetryPolicy, fetch_range

FAST = RetryPolicy(retries=1, backoff_s=0.01, max_backoff_s=0.02, timeout_s=5.0, deadline_s=30.0)


@pytest.fixture
def www(tmp_path: Path) -> Path:
    text_dataset(tmp_path / "www" / "ds")
    return tmp_path / "www"


def _keys(spec: object, workers: int = 0) -> list[str]:
    ds = ShardedDataset(spec, batch_size=4, shuffle=True, seed=3, fields=("__key__",), cache=CacheOptions(retry=FAST))
    with make_loader(ds, num_workers=workers) as loader:
        return [k for batch in loader for k in batch]


def test_a_ranged_fetch_answered_whole_says_so_at_once(www):
    name = sorted(p.name for p in (www / "ds").glob("*.tar"))[0]
    with rangeserver.serve(www, rangeserver.Behaviour(ignore_range=True)) as (base, served):
        with pytest.raises(RangeNotSupported, match="ignores Range"):
            fetch_range(f"{base}/ds/{name}", 0, 100, retry=FAST)
        assert served.paths.count(f"ds/{name}") == 1  # not retried


def test_the_epoch_finishes_from_whole_shards_with_one_warning(www, caplog):
    local = _keys(www / "ds")
    with rangeserver.serve(www, rangeserver.Behaviour(ignore_range=True)) as (base, served):
        with caplog.at_level(logging.WARNING, logger="shardify.reader"):
            assert _keys(f"{base}/ds") == local
            assert _keys(f"{base}/ds") == local  # a second epoch: no new warning
        host = base.split("://", 1)[1]
        shards = {p for p in served.paths if p.endswith(".tar")}
    warned = [r for r in caplog.records if "ignores Range" in r.getMessage()]
    assert len(warned) == 1 and host in warned[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(shards) == 5


def test_workers_finish_the_epoch_without_a_traceback(www, capfd):
    local = sorted(_keys(www / "ds"))
    with rangeserver.serve(www, rangeserver.Behaviour(ignore_range=True)) as (base, _):
        assert sorted(_keys(f"{base}/ds", workers=2)) == local
    err = capfd.readouterr().err
    assert "Traceback" not in err
    assert err.count("ignores Range") <= 2  # once per worker process at most


@pytest.mark.parametrize("workers", [0, 2])
def test_the_whole_answer_to_a_ranged_request_becomes_the_shard_s_copy(www, tmp_path, workers):
    """The 200 body is used (checked, stored in the cache): each shard is fetched once, not
    once ranged and once more whole (with workers, once per worker process at most: each
    learns of the host for itself; the others then find the copy in the shared cache)."""
    local = [k for b in ShardedDataset(www / "ds", batch_size=4, fields=("__key__",)) for k in b]
    cache = CacheOptions(retry=FAST, dir=tmp_path / "cache")
    with rangeserver.serve(www, rangeserver.Behaviour(ignore_range=True)) as (base, served):
        ds = ShardedDataset(f"{base}/ds", batch_size=4, fields=("__key__",), cache=cache)
        with make_loader(ds, num_workers=workers) as loader:
            got = [k for batch in loader for k in batch]
        gets = {p: served.paths.count(p) for p in served.paths if p.endswith(".tar")}
    assert sorted(got) == sorted(local)
    assert len(gets) == 5 and max(gets.values()) <= max(1, workers), gets
    copies = sorted(p.read_bytes() for p in (tmp_path / "cache").glob("*.tar"))
    assert copies == sorted(p.read_bytes() for p in (www / "ds").glob("*.tar"))
