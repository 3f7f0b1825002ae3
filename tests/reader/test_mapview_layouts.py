"""MapDataset over both layouts (per-sample and chunked), raw-pixel fields, whole-shard reads of
remote shards, and the batch path: every index, key and batch gives what ShardedDataset gives;
damage says where; gzip shards are refused by name."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rangeserver  # tools/rangeserver.py (pytest's pythonpath holds tools/)
import torch
from torch.utils.data import DataLoader, default_collate

from shardify.convert import ShardWriter
from shardify.errors import ShardFormatError
from shardify.reader import BatchOptions, CacheOptions, DecodeOptions, MapDataset, ShardedDataset
from shardify.reader import transforms as T
from shardify.reader.mapbatch import BatchList
from shardify.remote import RetryPolicy

FIELDS = ("__key__", "npy", "cls", "txt")
N = 30
FAST = RetryPolicy(retries=1, backoff_s=0.01)


def _write(root: Path, chunk: int | None) -> Path:
    """``N`` samples of a fixed-shape array, a label, a text and (every 5th) a JSON, 9 a shard."""
    with ShardWriter(root, fsync=False, samples_per_shard=9, **({"chunk": chunk} if chunk else {})) as w:
        for i in range(N):
            sample: dict[str, Any] = {"npy": np.full((2, 3), i, np.int16), "cls": i % 3, "txt": f"t{i}" * (i % 4)}
            if i % 5 == 0:
                sample["json"] = {"a": i}
            w.write(sample)
    return root


@pytest.fixture(scope="module", params=[None, 4], ids=["per-sample", "chunked"])
def root(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(tmp_path_factory.mktemp("layouts") / "www" / "ds", request.param)


def _streamed(root: Path, fields: Any = FIELDS, **kw: Any) -> list[Any]:
    ds = ShardedDataset(root, batch_size=1, fields=fields, batching=BatchOptions(collate_fn=list), **kw)
    return [s for b in ds for s in b]


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, (tuple, list)):
        return len(got) == len(want) and all(_same(a, b) for a, b in zip(got, want))
    if isinstance(want, (np.ndarray, torch.Tensor)):
        return (
            bool(np.array_equal(np.asarray(got), np.asarray(want))) and np.asarray(got).dtype == np.asarray(want).dtype
        )
    return bool(got == want)


def test_every_index_key_and_batch_gives_the_streamed_sample(root: Path) -> None:
    want = _streamed(root)
    ds = MapDataset(root, fields=FIELDS)
    assert len(ds) == N and _same([ds[i] for i in range(N)], want)
    assert _same([ds.get(s[0]) for s in want[::7]], want[::7])
    order = [int(i) for i in np.random.default_rng(0).permutation(N)] + [3, 3]
    assert _same(ds.__getitems__(order), [want[i] for i in order])
    with pytest.raises(KeyError):
        ds.get("nope")
    loader = DataLoader(ds, batch_size=7, shuffle=True, num_workers=2, collate_fn=ds.collate)
    assert sorted(k for b in loader for k in b[0]) == sorted(s[0] for s in want)


def test_fixed_fields_are_decoded_as_one_batch_equal_to_default_collate(root: Path) -> None:
    want = _streamed(root, ("npy", "cls"))
    ds = MapDataset(root, fields=("npy", "cls"))
    order = [int(i) for i in np.random.default_rng(1).permutation(N) if i % 5]  # (alike: no json)
    got = ds.__getitems__(order)
    assert isinstance(got, BatchList), "a batch of fixed fields takes the batch path"
    assert _same(got, [want[i] for i in order])
    x, y = ds.collate(got)
    dx, dy = default_collate([want[i] for i in order])
    assert torch.equal(x, dx) and x.dtype == torch.int16 and torch.equal(y, dy) and y.dtype == dy.dtype
    ex, ey = default_collate(got)  # a DataLoader without collate_fn=ds.collate
    assert torch.equal(ex, dx) and torch.equal(ey, dy)
    keys = _streamed(root, "__key__")
    keyed = MapDataset(root, fields=("__key__", "npy")).__getitems__(order[:5])
    assert isinstance(keyed, BatchList) and [k for k, _ in keyed] == [keys[i] for i in order[:5]]


def test_map_sees_every_field_a_sample_has(root: Path) -> None:
    ds = MapDataset(root, map=lambda s: (s["__key__"], sorted(k for k in s if not k.startswith("__"))))
    with_json, without = ["cls", "json", "npy", "txt"], ["cls", "npy", "txt"]
    assert [ds[i][1] for i in (0, 1, 5)] == [with_json, without, with_json]
    assert [s[1] for s in ds.__getitems__([5, 1, 0])] == [with_json, without, with_json]


def test_over_http_chunked_shards_and_whole_mode_are_fetched_whole_once_and_checked(root: Path, tmp_path: Path) -> None:
    want = _streamed(root)
    order = [int(i) for i in np.random.default_rng(2).permutation(N)]
    chunked = "chunk" in (root / "train.json").read_text()
    with rangeserver.serve(root.parent) as (base, behaviour):
        for ranged in (True, False):
            cache = CacheOptions(retry=FAST, ranged=ranged, dir=tmp_path / f"cache-{ranged}")
            ds = MapDataset(f"{base}/ds", fields=FIELDS, cache=cache)
            behaviour.reset()
            assert _same(ds.__getitems__(order), [want[i] for i in order])
            shard_gets = [p for p in behaviour.paths if p.endswith(".tar")]
            if chunked or not ranged:
                assert len(shard_gets) == 4, "each shard fetched whole, once"
            assert _same(ds.__getitems__(order[:9]), [want[i] for i in order[:9]])
            if chunked or not ranged:
                assert len([p for p in behaviour.paths if p.endswith(".tar")]) == 4, "then read from the copy"
                again = MapDataset(f"{base}/ds", fields=FIELDS, cache=cache)  # another process, say
                assert _same(again.__getitems__(order[:9]), [want[i] for i in order[:9]])
                assert len([p for p in behaviour.paths if p.endswith(".tar")]) == 4, "the node's copy is shared"


def test_a_changed_chunked_shard_fails_its_sha256_naming_it_or_its_samples_are_skipped(tmp_path: Path) -> None:
    root = _write(tmp_path / "ds", 4)
    shard = sorted(root.glob("*.tar"))[1]
    data = bytearray(shard.read_bytes())
    data[data.index(b"\x93NUMPY") + 200] ^= 1  # one byte of a stacked row: no structure changes
    shard.write_bytes(bytes(data))
    ds = MapDataset(root, fields=FIELDS)
    with pytest.raises(ShardFormatError, match="SHA-256") as e:
        ds[10]
    assert e.value.shard == str(shard)
    assert ds[0][0] == "000000000", "other shards read on"
    skip = MapDataset(root, fields=FIELDS, decoding=DecodeOptions(on_error="skip"))
    got = skip.__getitems__([0, 10, 20])
    assert [s[0] for s in got] == ["000000000", "000000020"] and skip.skipped == 1


def test_a_gzip_shard_is_refused_naming_it(tmp_path: Path) -> None:
    root = _write(tmp_path / "ds", None)
    tar = sorted(root.glob("*.tar"))[0]
    tgz = tmp_path / "a.tar.gz"
    with open(tar, "rb") as src, gzip.open(tgz, "wb") as out:
        shutil.copyfileobj(src, out)
    ds = MapDataset([str(tgz)], fields=("npy",))
    with pytest.raises(ShardFormatError, match="gzip-compressed: random access needs an uncompressed tar") as e:
        ds[0]
    assert e.value.shard == str(tgz)


@pytest.mark.parametrize("chunk", [None, 3], ids=["per-sample", "chunked"])
def test_raw_pixel_fields_decode_as_the_streaming_reader_decodes_them(tmp_path: Path, chunk: int | None) -> None:
    from shardify.convert.options import ConvertOptions
    from shardify.convert.synth import make_imagefolder
    from shardify.convert.write.run import convert_imagefolder

    src = make_imagefolder(tmp_path / "src", classes=2, per_class=4, sizes=((48, 40), (30, 52)))
    out = tmp_path / "ds"
    options = ConvertOptions(samples_per_shard=3, workers=1, progress=False, fsync=False, raw_pixels=40, chunk=chunk)
    convert_imagefolder(src, out, options=options)
    assert "raw_pixels" in (out / "train.json").read_text()
    fields = ("__key__", "image", "cls")
    for transform in (None, T.imagenet_train(24)):
        stream = ShardedDataset(out, batch_size=1, fields=fields, transform=transform, seed=5)
        stream.set_epoch(1)
        want = {b[0][0]: (b[1][0], int(b[2][0])) for b in stream}
        ds = MapDataset(out, fields=fields, transform=transform, seed=5)
        ds.set_epoch(1)
        got = {k: (x, c) for k, x, c in ds.__getitems__(list(range(len(ds))))}
        assert got.keys() == want.keys() and len(got) == 8
        assert all(torch.equal(got[k][0], want[k][0]) and got[k][1] == want[k][1] for k in got)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_collated_batch_crosses_from_a_worker_as_one_shared_storage(root: Path, workers: int) -> None:
    """A worker sends each storage of a batch as a shared-memory segment of its own: the batch's
    columns come from a worker as views of one (the worker's recycled slot, mapslots), and in
    the process itself as they were stacked; the values of default_collate either way."""
    want = _streamed(root, ("npy", "cls"))
    ds = MapDataset(root, fields=("npy", "cls"))
    alike = [i for i in range(N) if i % 5]  # (no json: every batch takes the batch path)
    loader = DataLoader(ds, batch_size=8, sampler=alike, num_workers=workers, collate_fn=ds.collate)
    seen = 0
    for x, y in loader:
        wx, wy = default_collate([want[i] for i in alike[seen : seen + len(y)]])
        assert torch.equal(x, wx) and torch.equal(y, wy) and y.dtype == torch.int64
        assert (x.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()) == (workers > 0)
        seen += len(y)
    assert seen == len(alike)
