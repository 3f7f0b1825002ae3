"""MapDataset: every index and every key gives the stored sample (local, HTTP, S3), through any
sampler, with the streaming reader's augmentation; bad indices, keys and shards say where."""

from __future__ import annotations

import mmap
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rangeserver  # tools/rangeserver.py (pytest's pythonpath holds tools/)
import torch
from builders import text_dataset
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, RandomSampler, WeightedRandomSampler

from shardify.errors import SampleChecksumError, SampleError
from shardify.reader import CacheOptions, DecodeOptions, MapDataset, ShardedDataset
from shardify.reader import transforms as T
from shardify.reader.io.keyindex import KeyIndex, key_hash, load_key_index
from shardify.remote import RetryPolicy

FIELDS = ("__key__", "txt", "cls")
N = 42
FAST = RetryPolicy(retries=1, backoff_s=0.01)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return text_dataset(tmp_path_factory.mktemp("map") / "ds", n=N, per_shard=8)


@pytest.fixture(scope="module")
def stored(root: Path) -> list[tuple[str, str, int]]:
    """Every sample as the streaming reader gives it, in stored order (no shuffle, no workers)."""
    ds = ShardedDataset(root, batch_size=1, fields=FIELDS, batching=_as_list())
    return [tuple(s) for batch in ds for s in batch]


def _as_list() -> Any:
    from shardify.reader import BatchOptions

    return BatchOptions(collate_fn=list)


def _keys(batches: Any) -> list[str]:
    return [k for b in batches for k in b[0]]


def test_every_index_and_every_key_gives_the_stored_sample(root: Path, stored: list[tuple[str, str, int]]) -> None:
    ds = MapDataset(root, fields=FIELDS)
    assert len(ds) == N
    assert [tuple(ds[i]) for i in range(N)] == stored
    assert tuple(ds[-1]) == stored[-1]
    assert [tuple(ds.get(k)) for k, _, _ in stored] == stored
    order = list(np.random.default_rng(0).permutation(N)) + [5, 5]
    assert [tuple(s) for s in ds.__getitems__(order)] == [stored[i] for i in order]


def test_bad_index_and_key_name_the_split(root: Path) -> None:
    ds = MapDataset(root, fields=FIELDS)
    with pytest.raises(IndexError, match=f"index {N} out of range .*'train' of {N}"):
        ds[N]
    with pytest.raises(KeyError, match=r"no sample with key 'nope' in .* split 'train'"):
        ds.get("nope")


def test_a_key_index_file_is_built_once_then_memory_mapped(root: Path, tmp_path: Path, stored: list) -> None:
    path = tmp_path / "train.keys"
    ds = MapDataset(root, fields=FIELDS, key_index=path)
    assert tuple(ds.get(stored[7][0])) == stored[7]
    index = load_key_index(path, nsamples=N)
    assert isinstance(index.hashes.base.obj, mmap.mmap) and list(index.hashes) == sorted(index.hashes)
    again = pickle.loads(pickle.dumps(ds))
    assert tuple(again.get(stored[30][0])) == stored[30]
    with pytest.raises(Exception, match="key index of 42 samples"):
        load_key_index(path, nsamples=N + 1)


def test_a_hash_shared_by_two_keys_is_told_apart_by_the_key_read() -> None:
    h = key_hash("a")
    index = KeyIndex(np.array([1, h, h, h + 1], dtype="<u8"), np.array([9, 3, 4, 8], dtype="<u8"))
    assert index.candidates("a") == [3, 4] and index.candidates("b") == []


@pytest.mark.parametrize("workers", [0, 2])
def test_a_shuffled_dataloader_gives_each_sample_once(root: Path, stored: list, workers: int) -> None:
    ds = MapDataset(root, fields=FIELDS)
    assert len(pickle.dumps(ds)) < 20_000, "cheap to pickle to a worker"
    loader = DataLoader(ds, batch_size=5, shuffle=True, num_workers=workers)
    keys = _keys(loader)
    assert sorted(keys) == sorted(k for k, _, _ in stored) and keys != [k for k, _, _ in stored]
    weighted = DataLoader(ds, batch_size=4, sampler=WeightedRandomSampler([1.0] * N, 10), num_workers=workers)
    assert len(_keys(weighted)) == 10
    batched = DataLoader(ds, batch_sampler=BatchSampler(RandomSampler(ds), 6, False), num_workers=workers)
    assert sorted(_keys(batched)) == sorted(k for k, _, _ in stored)


def test_a_distributed_sampler_of_three_ranks_reads_each_sample_once(root: Path, stored: list) -> None:
    ds = MapDataset(root, fields=FIELDS)
    seen: list[str] = []
    for rank in range(3):
        sampler = DistributedSampler(ds, num_replicas=3, rank=rank, shuffle=True, seed=1)
        sampler.set_epoch(2)
        seen += _keys(DataLoader(ds, batch_size=4, sampler=sampler, num_workers=0))
    assert sorted(seen) == sorted(k for k, _, _ in stored)


def test_augmentation_equals_the_streaming_readers(tmp_path: Path) -> None:
    from shardify.convert.options import ConvertOptions
    from shardify.convert.synth import make_imagefolder
    from shardify.convert.write.run import convert_imagefolder

    src = make_imagefolder(tmp_path / "src", classes=2, per_class=5, sizes=((48, 40),))
    out = tmp_path / "ds"
    convert_imagefolder(src, out, options=ConvertOptions(samples_per_shard=4, workers=1, progress=False, fsync=False))
    fields = ("__key__", "image", "cls")
    stream = ShardedDataset(out, batch_size=1, shuffle=True, seed=3, transform=T.imagenet_train(32), fields=fields)
    stream.set_epoch(1)
    streamed = {b[0][0]: b[1] for b in stream}
    ds = MapDataset(out, seed=3, transform=T.imagenet_train(32), fields=fields)
    ds.set_epoch(1)
    mapped = {s[0]: s[1] for s in DataLoader(ds, batch_size=None, shuffle=True, num_workers=2)}
    assert mapped.keys() == streamed.keys() and len(mapped) == 10
    assert all(torch.equal(mapped[k], streamed[k][0]) for k in mapped)
    ds.set_epoch(2)
    assert not all(torch.equal(ds.get(k)[1], streamed[k][0]) for k in mapped), "a new epoch, new crops"


def _damage(root: Path, stored: list, index: int) -> None:
    ds = MapDataset(root, fields=FIELDS)
    shard, pos = ds.locate(index)
    path = Path(ds.source.urls[shard])
    data = bytearray(path.read_bytes())
    data[ds._bytes.offset(shard, pos) + 600] ^= 0xFF  # a byte of the sample's txt
    path.write_bytes(bytes(data))


def test_a_damaged_sample_is_an_error_naming_shard_and_key_or_is_skipped(
    tmp_path: Path, stored: list, root: Path
) -> None:
    copy = text_dataset(tmp_path / "ds", n=N, per_shard=8)
    _damage(copy, stored, 10)
    ds = MapDataset(copy, fields=FIELDS)
    with pytest.raises(SampleChecksumError) as e:
        ds[10]
    assert e.value.key == stored[10][0] and e.value.shard == ds.source.urls[1]
    with pytest.raises(SampleChecksumError):
        ds.get(stored[10][0])
    assert tuple(ds[11]) == stored[11], "only that sample"
    skip = MapDataset(copy, fields=FIELDS, decoding=DecodeOptions(on_error="skip"))
    got = skip.__getitems__([9, 10, 11])
    assert [s[0] for s in got] == [stored[9][0], stored[11][0]] and skip.skipped == 1
    with pytest.raises((SampleChecksumError, SampleError)):
        skip[10]


def test_over_http_every_index_and_key_with_coalesced_ranged_requests(root: Path, stored: list) -> None:
    www = root.parent
    with rangeserver.serve(www) as (base, behaviour):
        ds = MapDataset(f"{base}/{root.name}", fields=FIELDS, cache=CacheOptions(retry=FAST))
        behaviour.reset()
        assert [tuple(s) for s in ds.__getitems__(list(range(N)))] == stored
        assert behaviour.gets <= 6, "one ranged request per shard for a whole batch of neighbours"
        assert [tuple(ds[i]) for i in range(0, N, 5)] == stored[::5]
        assert tuple(ds.get(stored[20][0])) == stored[20]
        keys = _keys(DataLoader(ds, batch_size=7, shuffle=True, num_workers=2))
        assert sorted(keys) == sorted(k for k, _, _ in stored)


def test_get_compares_the_key_read_when_every_key_shares_one_hash(
    root: Path, stored: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shardify.reader.io import keyindex

    monkeypatch.setattr(keyindex, "key_hash", lambda key: 7)
    ds = MapDataset(root, fields=FIELDS)
    assert [tuple(ds.get(k)) for k, _, _ in stored[::9]] == stored[::9]
    with pytest.raises(KeyError):
        ds.get("nope")


def test_over_http_a_damaged_sample_names_shard_and_key_and_failed_requests_are_retried(
    tmp_path: Path, stored: list
) -> None:
    copy = text_dataset(tmp_path / "www" / "ds", n=N, per_shard=8)
    _damage(copy, stored, 10)
    behaviour = rangeserver.Behaviour(error_status=503, faults_left=3, fault_paths=(".tar",))
    with rangeserver.serve(tmp_path / "www", behaviour) as (base, _):
        ds = MapDataset(f"{base}/ds", fields=FIELDS, cache=CacheOptions(retry=RetryPolicy(retries=4, backoff_s=0.01)))
        assert [tuple(s) for s in ds.__getitems__([0, 20, 41])] == [stored[0], stored[20], stored[41]]
        with pytest.raises(SampleChecksumError) as e:
            ds.__getitems__([9, 10])
    assert e.value.key == stored[10][0] and e.value.shard == f"{base}/ds/{Path(ds.source.urls[1]).name}"


def test_local_files_kept_open_are_bounded(root: Path, stored: list, monkeypatch: pytest.MonkeyPatch) -> None:
    from shardify.reader.io import mapfiles

    monkeypatch.setattr(mapfiles, "MAX_OPEN_FILES", 2)
    ds = MapDataset(root, fields=FIELDS)
    assert [tuple(ds[i]) for i in range(N)] == stored and [tuple(ds[i]) for i in range(N)] == stored
    assert len(ds._bytes._files.files) == 2
