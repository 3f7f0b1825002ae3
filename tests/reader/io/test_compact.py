"""A split read through its compact index (``{split}-{version}.cidx``, :mod:`shardify.compactindex`):
the same epochs as through the JSON index, locally and over HTTP (tools/rangeserver.py on
127.0.0.1), with only the compact index and the sidecars of the shards read fetched; each sidecar
checked against the index's root, so another shard's or version's is refused naming the shard;
nothing made per shard up front, however many shards the split has."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import rangeserver  # tools/rangeserver.py (pytest's pythonpath holds tools/)
from builders import text_dataset

from shardify import compactindex
from shardify.convert import ShardWriter
from shardify.convert.write import finish
from shardify.errors import ManifestError, SidecarError
from shardify.reader import CacheOptions, DecodeOptions, ShardedDataset, Stream
from shardify.reader.delivery.basis import data_identity
from shardify.reader.io import compact as compact_io
from shardify.reader.io.compact import CompactShards
from shardify.reader.io.sources import resolve_source
from shardify.reader.worker import ProcessReader
from shardify.remote import RetryPolicy, ShardFetchError


@pytest.fixture
def www(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``www/ds``: 60 samples in 6 shards of 10 with sidecars and a compact index."""
    monkeypatch.setattr(finish, "SIDECAR_ABOVE_SAMPLES", 0)
    text_dataset(tmp_path / "www" / "ds", 60, per_shard=10)
    return tmp_path / "www"


def _split(root: Path) -> dict:
    return json.loads((root / "manifest.json").read_text())["splits"]["train"]


def _epoch(spec: str | Path, **kw: object) -> list[str]:
    ds = ShardedDataset(spec, batch_size=4, shuffle=True, seed=3, fields=("__key__",), **kw)  # type: ignore[arg-type]
    ds.set_epoch(2)
    return [k for b in ds for k in b]


def test_the_compact_and_json_indexes_read_the_same_epochs_locally_and_over_http(www: Path, monkeypatch) -> None:
    ds = www / "ds"
    index = ds / _split(ds)["index"]
    assert isinstance(resolve_source(ds).shards, CompactShards)  # the manifest's compact index is read
    assert not isinstance(resolve_source(index).shards, CompactShards)  # a JSON index given is read as it is
    for rank, world in ((0, 1), (1, 3)):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        through_json = _epoch(index)
        assert _epoch(ds) == through_json and _epoch(ds, decoding=DecodeOptions(verify=True)) == through_json
        with rangeserver.serve(www) as (base, _):
            assert _epoch(f"{base}/ds") == through_json
            assert _epoch(f"{base}/ds", decoding=DecodeOptions(verify=True)) == through_json


def test_over_http_only_the_compact_index_and_the_read_shards_sidecars_are_fetched_once_per_cache(
    www: Path, tmp_path: Path, monkeypatch
) -> None:
    split = _split(www / "ds")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")  # a quarter of the epoch: not every shard is read
    cache = CacheOptions(dir=tmp_path / "cache")
    with rangeserver.serve(www) as (base, served):
        keys = _epoch(f"{base}/ds", cache=cache)
        names = [p.rsplit("/", 1)[-1] for p in served.paths]
        read = {n for n in names if n.endswith(".tar")}
        assert names.count(split["compact"]["index"]) == 1 and split["index"] not in names and "train.json" not in names
        assert sorted(n for n in names if n.endswith(".idx")) == sorted(n + ".idx" for n in read)
        assert 0 < len(read) < 6 and len(keys) == 15
        served.reset()
        compact_io._facts.clear()  # another process of the node: its memo is empty, the cache is not
        assert _epoch(f"{base}/ds", cache=cache) == keys
        assert not [p for p in served.paths if p.endswith((".cidx", ".idx"))]


def test_a_state_made_through_either_index_resumes_through_the_other(www: Path) -> None:
    ds = www / "ds"
    through_compact, through_json = resolve_source(ds), resolve_source(ds / _split(ds)["index"])
    assert through_compact.sidecar_root == through_json.sidecar_root is not None
    assert data_identity(through_compact) == data_identity(through_json)
    other = www / "other"
    shutil.copytree(ds, other)
    (other / "train-x.tmp").write_text("")  # the same data copied elsewhere: the same identity
    assert data_identity(resolve_source(other)) == data_identity(through_compact)


@pytest.mark.parametrize("damage", ["changed", "truncated", "missing", "escaping"])
def test_a_damaged_or_escaping_compact_index_is_refused_naming_it(www: Path, damage: str) -> None:
    ds = www / "ds"
    name = _split(ds)["compact"]["index"]
    data = (ds / name).read_bytes()
    if damage == "changed":  # a byte of its fields: only the manifest's SHA-256 tells
        at = data.index(b'"split"') + 2
        (ds / name).write_bytes(data[:at] + bytes([data[at] ^ 0x20]) + data[at + 1 :])
    elif damage == "truncated":
        (ds / name).write_bytes(data[:-4])
    elif damage == "missing":
        (ds / name).unlink()
    else:
        manifest = json.loads((ds / "manifest.json").read_text())
        manifest["splits"]["train"]["compact"]["index"] = "../" + name
        (ds / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError) as e:
        resolve_source(ds)
    assert name in str(e.value)
    with rangeserver.serve(www) as (base, _):
        with pytest.raises(ManifestError) as e:
            resolve_source(f"{base}/ds")
        assert name in str(e.value)


def _swap_in_another_shards_sidecar(ds: Path) -> tuple[str, set[str]]:
    """Shard 2's sidecar replaced by shard 1's (well formed, of this split): its name and keys."""
    index = json.loads((ds / _split(ds)["index"]).read_text())
    one, two = index["shardlist"][1]["url"], index["shardlist"][2]["url"]
    shutil.copy(ds / f"{one}.idx", ds / f"{two}.idx")
    return two, {f"{i:09d}" for i in range(20, 30)}


def test_another_shards_sidecar_is_refused_by_the_root_naming_the_shard(www: Path) -> None:
    ds = www / "ds"
    shard, keys = _swap_in_another_shards_sidecar(ds)
    for spec in (ds, None):
        with rangeserver.serve(www) as (base, _):
            where = spec if spec is not None else f"{base}/ds"
            with pytest.raises(SidecarError) as e:
                _epoch(where, decoding=DecodeOptions(verify=True))
            assert e.value.shard is not None and e.value.shard.endswith(shard)
            compact_io._facts.clear()
            got = _epoch(where, decoding=DecodeOptions(on_error="skip"))
            assert set(got) == {f"{i:09d}" for i in range(60)} - keys  # exactly that shard's samples lost
            compact_io._facts.clear()


def test_a_split_of_50000_shards_is_set_up_and_planned_without_a_shard_info_each(tmp_path: Path, monkeypatch) -> None:
    """The compact index alone (no shard is read): the dataset, its resume basis and an epoch's
    plan touch a handful of shards, not one ShardInfo per shard."""
    version, counts = "0123456789ab", np.full(50_000, 7, dtype=np.uint32)
    fields = {"format_version": 2, "split": "train", "version": version, "classes": [], "fields": ["txt"]}
    data = compactindex.encode(fields, counts, hashlib.sha256(b"root").digest())
    (tmp_path / f"train-{version}.cidx").write_bytes(data)
    ref = {"index": f"train-{version}.cidx", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    split = {"index": f"train-{version}.json", "samples": 350_000, "shards": 50_000, "bytes": 0, "version": version}
    split |= {"index_size": 2, "index_sha256": hashlib.sha256(b"{}").hexdigest()}  # not read: the compact one is
    manifest = {"format": "shardify", "format_version": 2, "splits": {"train": {**split, "compact": ref}}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    made: list[int] = []  # shard entries and shard URLs made
    info, url = CompactShards._info, CompactShards.url
    monkeypatch.setattr(CompactShards, "_info", lambda self, i: made.append(i) or info(self, i))
    monkeypatch.setattr(CompactShards, "url", lambda self, i: made.append(i) or url(self, i))
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    ds = ShardedDataset(tmp_path, batch_size=64, shuffle=True, seed=1, fields=("txt",))
    assert len(ds.source.shards) == 50_000 and ds.source.num_samples == 350_000
    ds.state_dict()
    assert len(made) < 10, len(made)
    with ShardWriter(tmp_path / "small", samples_per_shard=4, fsync=False) as w:
        for _ in range(8):
            w.write({"txt": "x"})
    made.clear()  # a mix with another split: the same
    mix = ShardedDataset([Stream(tmp_path), Stream(tmp_path / "small")], batch_size=64, shuffle=True, seed=1)
    assert len(mix.source.shards) == 50_002
    mix.state_dict()
    ProcessReader().get(mix._setup, mix._setup.options)  # what a worker makes before its first read
    assert len(made) < 10, len(made)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mix_of_a_compact_and_a_json_split_reads_each_exactly_once(www: Path, monkeypatch, workers: int) -> None:
    from shardify.reader import Stream, make_loader
    from shardify.reader.io.shardlist import ChainedShards

    monkeypatch.setattr(finish, "SIDECAR_ABOVE_SAMPLES", 10_000)
    with ShardWriter(www / "small", samples_per_shard=7, fsync=False) as w:  # a JSON index, inline tables
        for i in range(20):
            w.write({"__key__": f"s{i:04d}", "txt": "s" * (50 + i), "cls": 0})
    with rangeserver.serve(www) as (base, _):
        for where in (str(www), base):
            ds = ShardedDataset(
                [Stream(f"{where}/ds"), Stream(f"{where}/small")],
                batch_size=5,
                shuffle=True,
                seed=4,
                fields=("__key__",),
            )
            assert isinstance(ds.source.shards, ChainedShards) and len(ds.source.shards) == 9
            with make_loader(ds, num_workers=workers) as loader:
                keys = [k for batch in loader for k in batch]
            assert sorted(keys) == sorted([f"{i:09d}" for i in range(60)] + [f"s{i:04d}" for i in range(20)])


def test_whole_shards_fetched_through_a_compact_index_are_checked_against_their_sidecars(www: Path, tmp_path) -> None:
    """``ranged=False``: each shard is fetched whole into the cache and checked against the size
    and SHA-256 its sidecar holds (found by the shard's URL), so a shard changed on the server fails."""
    ds = www / "ds"
    source = resolve_source(ds)
    entries = json.loads((ds / _split(ds)["index"]).read_text())["shardlist"]
    for i in (0, 3, 5):
        assert source.index_of(source.shards[i].url) == i
        full = source.full(i)
        assert (full.filesize, full.sha256) == (entries[i]["filesize"], entries[i]["sha256"])
    assert source.index_of(str(ds / "train-000000000000-000001.tar")) is None
    shard = ds / entries[3]["url"]
    data = bytearray(shard.read_bytes())
    data[600] ^= 1  # in sample 30's data: the shard's size and tar structure are unchanged
    shard.write_bytes(bytes(data))
    fast = RetryPolicy(retries=0, backoff_s=0.01, max_backoff_s=0.02, timeout_s=5.0)
    with rangeserver.serve(www) as (base, _):
        remote = resolve_source(f"{base}/ds", retry=fast, ranged=False, cache_dir=tmp_path / "cache")
        remote.open_tar(remote.shards[2].url)[0].close()  # an intact shard is fetched and opened
        with pytest.raises(ShardFetchError) as e:
            remote.open_tar(remote.shards[3].url)
    assert "sha256" in e.value.reason and e.value.shard is not None and e.value.shard.endswith(entries[3]["url"])
