"""Remote reads of only what a worker needs: URL confinement of a split index, per-sample
checksums and checked ranged reads, the bytes a node fetches against those it consumes,
and servers that misbehave (tools/rangeserver.py on 127.0.0.1)."""

from __future__ import annotations

import base64
import json
import multiprocessing
import os
import shutil
from pathlib import Path

import pytest
import rangeserver  # tools/rangeserver.py (pytest's pythonpath holds tools/)
import torch
from builders import text_dataset

from shardify.convert import convert_items
from shardify.convert.write import finish
from shardify.errors import LocationError, SampleChecksumError
from shardify.reader import CacheOptions, DecodeOptions, SamplingOptions, ShardedDataset, make_loader
from shardify.reader.io.sources import resolve_source
from shardify.remote import RetryPolicy, ShardFetchError
from shardify.sampletable import SampleTable, sample_digest
from shardify.sidecar import decode as decode_sidecar
from shardify.tarfmt import OFFSET_STRIDE

FAST = RetryPolicy(retries=2, backoff_s=0.01, max_backoff_s=0.02, timeout_s=5.0)


def _dataset(root: Path, n: int = 40, per_shard: int = 8) -> Path:
    return text_dataset(root, n, per_shard=per_shard)


@pytest.fixture
def www(tmp_path: Path) -> Path:
    """``www/ds``: 40 samples in 5 shards; ``www/other``: a copy of it outside the dataset."""
    _dataset(tmp_path / "www" / "ds")
    shutil.copytree(tmp_path / "www" / "ds", tmp_path / "www" / "other")
    return tmp_path / "www"


def _point_shard(index: Path, url: str) -> None:
    obj = json.loads(index.read_text())
    obj["shardlist"][1]["url"] = url
    index.write_text(json.dumps(obj))


@pytest.mark.parametrize(
    "where", ["../other/{name}", "file://{root}/other/{name}", "%2e%2e/other/{name}", "http://localhost:1/ds/{name}"]
)
def test_a_remote_index_cannot_send_the_reader_elsewhere(www, where):
    index = www / "ds" / "train.json"
    name = json.loads(index.read_text())["shardlist"][1]["url"]
    bad = where.format(name=name, root=www)
    _point_shard(index, bad)
    with rangeserver.serve(www) as (base, _):
        with pytest.raises(LocationError) as e:
            resolve_source(f"{base}/ds/train.json", retry=FAST)
        assert f"{base}/ds/train.json" in str(e.value) and "refuses to read" in str(e.value)
        allow = (f"{base}/other/", f"file://{www}/other/", "http://localhost:1/")
        if "%2e" in where:  # a dot-dot segment the server would resolve: refused whatever is allowed
            with pytest.raises(LocationError):
                resolve_source(f"{base}/ds/train.json", retry=FAST, allow_locations=allow)
        else:
            assert len(resolve_source(f"{base}/ds/train.json", retry=FAST, allow_locations=allow).shards) == 5


def test_a_local_index_stays_in_its_folder_and_relative_shards_still_resolve(www):
    assert resolve_source(www / "ds" / "train.json").num_samples == 40
    with rangeserver.serve(www) as (base, _):
        assert resolve_source(f"{base}/ds").num_samples == 40
    _point_shard(
        www / "ds" / "train.json",
        "../other/" + json.loads((www / "ds" / "train.json").read_text())["shardlist"][1]["url"],
    )
    with pytest.raises(LocationError, match="refuses to read"):
        resolve_source(www / "ds" / "train.json")


def _epoch(spec, *, cache=None, epoch_of=None, **kw) -> list[tuple[str, ...]]:
    ds = ShardedDataset(
        spec, batch_size=4, shuffle=True, seed=3, fields=("__key__", "txt"), cache=cache or CacheOptions(), **kw
    )
    ds.set_epoch(1)
    return [tuple(k for k in b[0]) for b in ds]


def _table(entry: dict) -> SampleTable:
    return SampleTable(base64.b64decode(entry["samples"]))


@pytest.mark.parametrize("writer", ["ShardWriter", "convert_items"])
def test_every_writer_lists_each_sample_s_length_and_digest(tmp_path, writer):
    out = tmp_path / "ds"
    if writer == "ShardWriter":
        _dataset(out, n=21, per_shard=8)
    else:
        convert_items(
            range(21),
            lambda i: {"txt": "y" * (i * 53 % 900), "cls": i % 3},
            out,
            samples_per_shard=8,
            workers=2,
            fsync=False,
            progress=False,
        )
    index = json.loads((out / "train.json").read_text())
    assert [e["nsamples"] for e in index["shardlist"]] == [8, 8, 5]
    for e in index["shardlist"]:
        data = (out / e["url"]).read_bytes()
        ranges = _table(e).ranges()
        assert [a for a, _, _ in ranges][::OFFSET_STRIDE] == e["offsets"]
        assert all(sample_digest(data[a:b]) == d for a, b, d in ranges)
        assert ranges[-1][1] == len(data) - 1024  # the end-of-archive blocks follow the last sample


def test_a_ranged_epoch_fetches_only_its_samples_and_equals_the_local_one(www, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    local = _epoch(www / "ds")
    with rangeserver.serve(www) as (base, served):
        served.reset()
        remote = _epoch(f"{base}/ds")
        index = json.loads((www / "ds" / "train.json").read_text())
        sizes = [b - a for e in index["shardlist"] for a, b, _ in _table(e).ranges()]  # keys are 0, 1, ...
    assert remote == local and 0 < len(local)
    key_bytes = sum(sizes[int(k)] for b in local for k in b)
    index_bytes = len((www / "ds" / "train.json").read_bytes()) + len((www / "ds" / "manifest.json").read_bytes())
    assert served.sent - index_bytes <= 1.2 * key_bytes, (served.sent, index_bytes, key_bytes)


def test_an_index_without_a_sample_table_reads_whole_shards_as_before(www):
    index = www / "ds" / "train.json"
    obj = json.loads(index.read_text())
    for e in obj["shardlist"]:
        del e["samples"]
    index.write_text(json.dumps(obj))
    local = _epoch(www / "ds" / "train.json", decoding=DecodeOptions(verify=True))
    with rangeserver.serve(www) as (base, served):
        assert _epoch(f"{base}/ds/train.json", decoding=DecodeOptions(verify=True)) == local
    assert served.sent >= sum(e["filesize"] for e in obj["shardlist"])


def test_a_sample_changed_on_the_server_is_refused_naming_the_shard_and_key(www):
    index = json.loads((www / "ds" / "train.json").read_text())
    entry = index["shardlist"][2]
    local = sorted(k for b in _epoch(www / "ds") for k in b)
    a, b, _ = _table(entry).ranges()[3]
    shard = www / "ds" / entry["url"]
    data = bytearray(shard.read_bytes())
    data[b - 600] ^= 1  # in the data of sample 3, not a header
    shard.write_bytes(bytes(data))
    with rangeserver.serve(www) as (base, _):
        with pytest.raises(SampleChecksumError) as e:
            _epoch(f"{base}/ds")
        skipped = _epoch(f"{base}/ds", decoding=DecodeOptions(on_error="skip"))
    assert e.value.shard.endswith(entry["url"]) and e.value.key == f"{19:09d}"
    assert "checksum" in str(e.value)
    keys = sorted(k for b in skipped for k in b)
    assert set(keys) == set(local) - {f"{19:09d}"}  # that position alone, not the rest of its request


def _tables(root: Path, index: dict) -> list[SampleTable]:
    """Each shard's table: inline in the index, or from its sidecar."""
    return [
        _table(e)
        if "samples" in e
        else decode_sidecar(
            (root / f"{e['url']}.idx").read_bytes(),
            shard=e["url"],
            ref=None,
            nsamples=e["nsamples"],
            filesize=e["filesize"],
        )
        for e in index["shardlist"]
    ]


def _node(spec: str, rank: int, world: int, cache: str, stop_after: int | None, state: dict | None, out) -> None:
    """One node (a process with its own cache folder): its keys, its loader state after
    ``stop_after`` batches, and the bytes in its cache folder."""
    try:
        torch.set_num_threads(1)  # a forked child must not enter the OpenMP pool its parent started
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
        ds = ShardedDataset(
            spec,
            batch_size=4,
            shuffle=True,
            seed=3,
            fields=("__key__", "__valid__"),
            cache=CacheOptions(dir=cache, limit_bytes=4096),
            sampling=SamplingOptions(mark_repeats=True),
        )
        keys: list[str] = []
        with make_loader(ds, num_workers=0) as loader:
            if state is not None:
                loader.load_state_dict(state)
            for n, (batch, valid) in enumerate(loader):
                keys.extend(k for k, ok in zip(batch, valid.tolist()) if ok)
                if stop_after is not None and n + 1 == stop_after:
                    break
            saved = loader.state_dict()
        out.put((keys, saved, sum(f.stat().st_size for f in Path(cache).rglob("*") if f.is_file())))
    except BaseException as e:  # noqa: BLE001 - shown by the test
        out.put(e)


def _run_node(*args) -> tuple[list[str], dict, int]:
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    p = ctx.Process(target=_node, args=(*args, out))
    p.start()
    try:
        got = out.get(timeout=60)
        if isinstance(got, BaseException):
            raise got
        return got
    finally:
        p.join(timeout=30)


@pytest.mark.parametrize("compact", [False, True], ids=["json-index-inline-tables", "compact-index-sidecars"])
def test_nodes_fetch_their_share_read_exactly_once_and_resume_on_another_world(www, tmp_path, monkeypatch, compact):
    if compact:  # the same samples, tables in sidecars and a compact index that readers read instead
        monkeypatch.setattr(finish, "SIDECAR_ABOVE_SAMPLES", 0)
        shutil.rmtree(www / "ds")
        _dataset(www / "ds")
    manifest = json.loads((www / "ds" / "manifest.json").read_text())["splits"]["train"]
    index_at = manifest["compact"]["index"] if compact else manifest["index"]
    index = json.loads((www / "ds" / "train.json").read_text())
    sizes = [b - a for e in _tables(www / "ds", index) for a, b, _ in e.ranges()]  # keys are 0, 1, ...
    sidecars = sum(f.stat().st_size for f in (www / "ds").glob("*.idx"))  # at most all of them
    meta = len((www / "ds" / "manifest.json").read_bytes()) + len((www / "ds" / index_at).read_bytes()) + sidecars
    dataset_bytes = sum(e["filesize"] for e in index["shardlist"])
    with rangeserver.serve(www) as (base, served):
        union: list[str] = []
        for rank in range(3):  # a whole epoch on 3 nodes: each fetches about what it consumes
            served.reset()
            keys, _, cached = _run_node(f"{base}/ds", rank, 3, str(tmp_path / f"node{rank}"), None, None)
            consumed = sum(sizes[int(k)] for k in set(keys))
            assert served.sent - meta <= 1.2 * consumed, (rank, served.sent, meta, consumed)
            if compact:  # the node read the compact index, never the JSON one
                names = {p.rsplit("/", 1)[-1] for p in served.paths}
                assert index_at in names and not {n for n in names if n.endswith(".json")} - {"manifest.json"}
            assert cached < dataset_bytes / 10  # the node's cache holds no shards
            union += keys
        assert sorted(union) == [f"{i:09d}" for i in range(40)]
        head, state = [], None
        for rank in range(3):  # stopped after one batch on 3 nodes, resumed on 2
            keys, state, _ = _run_node(f"{base}/ds", rank, 3, str(tmp_path / f"a{rank}"), 1, None)
            head += keys
        rest = []
        for rank in range(2):
            keys, _, _ = _run_node(f"{base}/ds", rank, 2, str(tmp_path / f"b{rank}"), None, state)
            rest += keys
    assert 8 <= len(head) <= 12 and sorted(head + rest) == [f"{i:09d}" for i in range(40)]


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        pytest.param({"short": 100}, "shorter range", id="short-range"),
        pytest.param({"drop_after": 100}, "connection closed after 100 of", id="dropped-mid-range"),
    ],
)
def test_a_short_or_dropped_range_is_retried_then_refused(www, fault, message):
    local = _epoch(www / "ds")
    with rangeserver.serve(www) as (base, served):
        source = resolve_source(f"{base}/ds", retry=FAST)
        for key, value in fault.items():
            setattr(served, key, value)
        served.faults_left = 2  # the first two answers are wrong, their retries right
        assert _epoch(source) == local
        served.faults_left = None  # every answer wrong: refused once the retries are spent
        with pytest.raises(ShardFetchError, match=message) as e:
            _epoch(source)
    assert "gave up after 3 attempts" in str(e.value) and e.value.shard.startswith(base)


def test_a_server_that_ignores_range_is_read_whole_and_whole_shards_still_work(www):
    local = _epoch(www / "ds")
    with rangeserver.serve(www, rangeserver.Behaviour(ignore_range=True)) as (base, _):
        assert _epoch(f"{base}/ds") == local  # (tests/reader/io/test_range_ignored.py: the details)
        assert _epoch(f"{base}/ds", cache=CacheOptions(ranged=False)) == local


@pytest.mark.parametrize("requests", [1, 3])
def test_requests_in_flight_per_worker_are_bounded_by_the_option(www, requests):
    with rangeserver.serve(www, rangeserver.Behaviour(delay_s=0.02)) as (base, served):
        source = resolve_source(f"{base}/ds", retry=FAST, requests=requests)
        served.reset()
        ds = ShardedDataset(source, batch_size=4, shuffle=True, seed=1, fields=("__key__", "cls"))
        assert sum(len(b[0]) for b in ds) == 40
    assert min(requests, 2) <= served.most_active <= requests  # fetched ahead, never more than asked at once


def test_closing_the_reader_ends_its_fetch_threads(www):
    """A reader's fetch threads (daemons, idle between reads) end when it is closed."""
    import threading
    import time

    from shardify.reader.io.rangesetup import range_fetcher
    from shardify.reader.io.stream import ShardReader

    def fetch_threads() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("shardify-ranges")]

    with rangeserver.serve(www) as (base, _):
        src = resolve_source(f"{base}/ds", retry=FAST)
        reader = ShardReader(src.urls, src.sizes, skip_damaged=False, ranged=range_fetcher([src]))
        reader.announce([(0, 0, 4), (1, 0, 4)])
        assert len(list(reader.read(0, 0, 4))) == 4
        assert fetch_threads()
        reader.close()
        end = time.monotonic() + 30
        while fetch_threads() and time.monotonic() < end:
            time.sleep(0.01)
    assert not fetch_threads()
