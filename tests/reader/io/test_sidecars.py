"""Ranged reads of a split whose per-sample tables are in sidecars (``<shard>.idx``): a reader
fetches the sidecar of a shard the first time it reads from it, once per cache folder, checks
it against the index, and refuses one that does not match (tools/rangeserver.py on 127.0.0.1)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest
import rangeserver  # tools/rangeserver.py (pytest's pythonpath holds tools/)
from builders import text_dataset

from shardify.convert.write import finish
from shardify.errors import SidecarError
from shardify.reader import ShardedDataset
from shardify.reader.io.cache import FetchOptions
from shardify.reader.io.ranged import RangeFetcher
from shardify.reader.io.rangesetup import range_fetcher
from shardify.reader.io.sources import resolve_source
from shardify.remote import RetryPolicy

FAST = RetryPolicy(retries=1, backoff_s=0.01, max_backoff_s=0.02, timeout_s=5.0)


@pytest.fixture
def www(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``www/ds``: 40 samples in 5 shards, tables in sidecars; ``www/inline``: the same, inline."""
    for name, above in (("ds", 0), ("inline", 1000)):
        monkeypatch.setattr(finish, "SIDECAR_ABOVE_SAMPLES", above)
        text_dataset(tmp_path / "www" / name)
    assert len(list((tmp_path / "www" / "ds").glob("*.idx"))) == 5
    assert not list((tmp_path / "www" / "inline").glob("*.idx"))
    return tmp_path / "www"


def _epoch(spec: str | Path, **kw: object) -> list[str]:
    ds = ShardedDataset(spec, batch_size=4, shuffle=True, seed=3, fields=("__key__",), **kw)  # type: ignore[arg-type]
    ds.set_epoch(1)
    return [k for b in ds for k in b]


def _sidecars(paths: list[str]) -> list[str]:
    return [p.rsplit("/", 1)[-1] for p in paths if p.endswith(".idx")]


def _fetcher(url: str, cache: Path) -> tuple[RangeFetcher, list[str]]:
    """A fetcher of the split at ``url`` with a short retry budget and the cache folder ``cache``;
    the file names of its shards."""
    source = resolve_source(url, retry=FAST)
    fetch = FetchOptions(retry=FAST, cache_dir=str(cache))
    ranged = range_fetcher([dataclasses.replace(source, fetch=fetch)])
    assert ranged is not None
    return ranged, [s.url.rsplit("/", 1)[-1] for s in source.shards]


def test_a_reader_touching_k_of_n_shards_fetches_exactly_their_k_sidecars(www: Path, tmp_path: Path) -> None:
    with rangeserver.serve(www) as (base, served):
        ranged, names = _fetcher(f"{base}/ds", tmp_path / "cache")
        served.reset()
        ranged.announce([])
        assert served.paths == []  # nothing fetched before a read
        for shard in (3, 1, 3):
            assert len(ranged.samples(shard, 2, 5)) == 3
        assert _sidecars(served.paths) == [names[3] + ".idx", names[1] + ".idx"]
        ranged.close()
        served.reset()
        again, _ = _fetcher(f"{base}/ds", tmp_path / "cache")  # another process of the node
        served.reset()
        assert len(again.samples(1, 0, 8)) == 8
        assert _sidecars(served.paths) == []
        again.close()


def test_a_ranged_epoch_fetches_the_sidecars_of_the_shards_it_reads(www: Path, monkeypatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    local = _epoch(www / "ds")
    with rangeserver.serve(www) as (base, served):
        served.reset()
        remote = _epoch(f"{base}/ds")
        paths = list(served.paths)
        served.reset()
        assert _epoch(f"{base}/inline") == local  # an inline index reads as before, with no sidecar
        assert _sidecars(served.paths) == []
    assert remote == local and 0 < len(local) < 40
    read = {p.rsplit("/", 1)[-1] for p in paths if p.endswith(".tar")}
    assert sorted(_sidecars(paths)) == sorted(n + ".idx" for n in read) and len(read) < 5


@pytest.mark.parametrize("lie", ["changed", "truncated", "missing"])
def test_a_sidecar_that_does_not_match_the_index_is_refused_naming_the_shard(
    www: Path, tmp_path: Path, lie: str
) -> None:
    entry = json.loads((www / "ds" / "train.json").read_text())["shardlist"][2]
    idx = www / "ds" / f"{entry['url']}.idx"
    data = bytearray(idx.read_bytes())
    if lie == "changed":
        data[40] ^= 1
        idx.write_bytes(bytes(data))
    elif lie == "truncated":
        idx.write_bytes(bytes(data[:-28]))
    else:
        idx.unlink()
    with rangeserver.serve(www) as (base, _):
        ranged, _ = _fetcher(f"{base}/ds", tmp_path / "cache")
        assert len(ranged.samples(1, 0, 8)) == 8  # the other shards read on
        with pytest.raises(SidecarError) as e:
            ranged.samples(2, 0, 3)
        ranged.close()
        assert e.value.shard is not None and e.value.shard.endswith(entry["url"])
        if lie != "changed":  # (a checksum mismatch is retried first: slow with the default policy)
            with pytest.raises(SidecarError) as e:
                _epoch(f"{base}/ds")
            assert e.value.shard is not None and e.value.shard.endswith(entry["url"])


def test_a_shard_whose_sidecar_fails_keeps_the_reads_after_it_planned(www: Path, tmp_path: Path) -> None:
    """Its reads raise where they are made, and the next shard's request, fetched ahead, is used."""
    entry = json.loads((www / "ds" / "train.json").read_text())["shardlist"][2]
    (www / "ds" / f"{entry['url']}.idx").unlink()
    with rangeserver.serve(www) as (base, served):
        ranged, names = _fetcher(f"{base}/ds", tmp_path / "cache")
        ranged.announce([(1, 0, 8), (2, 0, 8), (3, 0, 8)])
        assert len(ranged.samples(1, 0, 8)) == 8
        for _ in range(500):  # until shard 3's request, made ahead, has been answered
            if sum(p.endswith(names[3]) for p in served.paths):
                break
            time.sleep(0.01)
        with pytest.raises(SidecarError):
            ranged.samples(2, 0, 8)
        assert len(ranged.samples(3, 0, 8)) == 8
        ranged.close()
        assert sorted(p.rsplit("/", 1)[-1] for p in served.paths if p.endswith(".tar")) == [names[1], names[3]]
