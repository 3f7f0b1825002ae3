"""The chunked layout read back: the same samples as the per-sample layout, in every order,
from any position, exactly once across a resume; a chunk read once per block; damage handled
as damage of its shard; ``shardify verify`` and ``verify=True`` on chunked shards."""

from __future__ import annotations

import gzip
import io
import json
import random
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from shardify.convert import ShardWriter, convert_items
from shardify.convert.verify import verify_dataset
from shardify.errors import ShardFormatError
from shardify.reader import (
    BatchOptions,
    DecodeOptions,
    SamplingOptions,
    ShardedDataset,
    make_loader,
)
from shardify.reader.io import chunked as chunked_module
from shardify.reader.io.sources import resolve_source
from shardify.reader.io.stream import Lost, ShardReader

N = 61


def _sample(i: int) -> dict[str, object]:
    """Fields of every kind a chunk stores: a fixed-shape array (stacked), a label, text and
    json some samples lack, a variable-shape array, bytes (variable)."""
    return {
        "__key__": f"s{i:04d}",
        "npy": np.full((3, 4, 4), i, dtype=np.uint8),
        "cls": i,
        **({"txt": "t" * (i % 7)} if i % 3 else {}),
        **({"meta.json": {"i": i}} if i % 4 == 0 else {}),
        "seq.npy": np.arange(i % 5, dtype=np.int32),
        "raw.bin": bytes([i % 256]) * (i % 3),
    }


def _write(root: Path, chunk: int | None, *, n: int = N, per_shard: int = 25) -> Path:
    with ShardWriter(root, samples_per_shard=per_shard, shard_size=None, fsync=False, chunk=chunk) as w:
        for i in range(n):
            w.write(_sample(i))
    return root


def _columns(batch) -> list:
    return [b.tolist() if isinstance(b, torch.Tensor) else b for b in batch]


FIELDS = ("npy", "cls")


def _epoch(root: Path, **kw) -> list:
    ds = ShardedDataset(root, batch_size=4, fields=FIELDS, **kw)
    ds.set_epoch(kw.pop("epoch", 3))
    return [_columns(b) for b in ds]


@pytest.mark.parametrize("chunk", [1, 4, 7, 25, 1000])
def test_chunked_reads_exactly_what_per_sample_reads(tmp_path: Path, chunk: int) -> None:
    plain = _write(tmp_path / "plain", None)
    packed = _write(tmp_path / "chunked", chunk)
    for shuffle in (False, True):
        assert _epoch(packed, shuffle=shuffle, seed=5) == _epoch(plain, shuffle=shuffle, seed=5)

    def decoded(root: Path) -> list:
        ds = ShardedDataset(root, batch_size=5, map=dict, batching=BatchOptions(collate_fn=list), shuffle=True, seed=2)
        return [
            {
                k: v.tolist() if isinstance(v, np.ndarray) else v
                for k, v in s.items()
                if k not in ("__shard__", "__rng__", "__offset__")
            }
            for b in ds
            for s in b
        ]

    got, want = decoded(packed), decoded(plain)
    assert got == want and len(got) == N
    assert {"txt", "meta.json", "raw.bin"} <= {k for s in got for k in s}
    assert any("txt" not in s for s in got)  # a field some samples lack stays absent, not empty


def test_stacked_arrays_are_views_and_decode_to_writable_copies(tmp_path: Path) -> None:
    root = _write(tmp_path / "c", 8)
    src = resolve_source(root)
    reader = ShardReader(
        [s.url for s in src.shards], src.sizes, skip_damaged=False, chunks=[s.chunk for s in src.shards]
    )
    a, b = list(reader.read(0, 2, 4))
    assert isinstance(a["npy"], np.ndarray) and a["npy"].base is not None and not a["npy"].flags.writeable
    assert np.shares_memory(a["npy"], b["npy"]) is False and a["npy"].base is b["npy"].base  # one chunk buffer
    assert a["cls"] == b"2" and isinstance(a["seq.npy"], bytes)  # variable fields: the sample's own bytes
    out = ShardedDataset(root, batch_size=2, map=lambda s: s["npy"], batching=BatchOptions(collate_fn=list))
    first = next(iter(out))[0]
    assert first.flags.writeable and first.tolist() == np.full((3, 4, 4), 0, np.uint8).tolist()


class _Counting(io.RawIOBase):
    """A shard file that counts the bytes read from it."""

    def __init__(self, path: str, counter: list[int]) -> None:
        self.f, self.counter = open(path, "rb"), counter

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.counter[0] += len(data)
        return data

    def seek(self, *a) -> int:
        return self.f.seek(*a)

    def tell(self) -> int:
        return self.f.tell()

    def seekable(self) -> bool:
        return True

    def close(self) -> None:
        self.f.close()


def test_a_shuffled_block_reads_its_own_bytes_not_its_whole_chunk(tmp_path: Path) -> None:
    root = _write(tmp_path / "c", 64, n=256, per_shard=256)
    src = resolve_source(root)
    (shard,) = src.shards
    counter = [0]
    reader = ShardReader(
        [shard.url],
        [256],
        skip_damaged=False,
        chunks=[64],
        offsets=[shard.offsets],
        filesizes=[shard.filesize],
        opener=lambda url: (_Counting(url, counter), True),
    )
    blocks = list(range(0, 256, 4))
    random.Random(0).shuffle(blocks)  # as a shuffled epoch visits them
    got = {s["__key__"]: s for b in blocks for s in reader.read(0, b, b + 4)}
    assert sorted(got) == [f"s{i:04d}" for i in range(256)]
    assert all(int(got[f"s{i:04d}"]["npy"][0, 0, 0]) == i for i in range(256))
    # the window scan reads the shard once (its index window), each chunk's layout is read once
    # (keys, tables, headers: ~3 KB), then each block only its own bytes; whole chunks would be
    # read 16 times each (16x the shard)
    assert counter[0] < 2 * shard.filesize, (counter[0], shard.filesize)


def test_a_gzip_chunk_is_decoded_once_per_block_of_samples(tmp_path: Path, monkeypatch) -> None:
    root = _write(tmp_path / "c", 16, n=48, per_shard=48)
    src = resolve_source(root)
    gz = tmp_path / "shard.tar.gz"
    gz.write_bytes(gzip.compress(Path(src.shards[0].url).read_bytes()))
    decoded: list[str] = []
    real = chunked_module.decode_chunk

    def counting(members, **kw):
        decoded.append(kw["key"])
        return real(members, **kw)

    monkeypatch.setattr(chunked_module, "decode_chunk", counting)
    reader = ShardReader([str(gz)], [48], skip_damaged=False, chunks=[16])
    keys = [s["__key__"] for start in range(0, 48, 4) for s in reader.read(0, start, start + 4)]
    assert keys == [f"s{i:04d}" for i in range(48)]
    assert decoded == ["s0000", "s0016", "s0032"]


@pytest.mark.parametrize("chunk", [None, 5], ids=["per-sample", "chunked"])
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch_yields_the_rest_exactly_once(tmp_path: Path, chunk: int | None, workers: int) -> None:
    root = _write(tmp_path / "c", chunk)

    def make():
        ds = ShardedDataset(
            root,
            batch_size=3,
            fields=("cls",),
            shuffle=True,
            seed=7,
            sampling=SamplingOptions(shuffle_buffer=6, shuffle_block=2),
        )
        ds.set_epoch(1)
        return make_loader(ds, num_workers=workers)

    full = [b.tolist() for b in make()]
    loader = make()
    it = iter(loader)
    head = [next(it).tolist() for _ in range(7)]
    state = loader.state_dict()
    del it
    loader.close()
    resumed = make()
    resumed.load_state_dict(state)
    rest = [b.tolist() for b in resumed]
    assert head + rest == full
    assert sorted(x for b in head + rest for x in b) == list(range(N))


def test_other_readers_see_one_sample_per_chunk_with_stacked_members(tmp_path: Path) -> None:
    root = _write(tmp_path / "c", 10)
    index = json.loads((root / "train.json").read_text())
    first = root / index["shardlist"][0]["url"]
    with tarfile.open(first) as tar:
        names = tar.getnames()
        stacked = np.load(io.BytesIO(tar.extractfile("s0000.npy").read()))
    assert names[:6] == [
        "s0000.chunk-keys",
        "s0000.cls",
        "s0000.meta.json",
        "s0000.npy",
        "s0000.raw.bin",
        "s0000.seq.npy",
    ]
    assert {n.split(".")[0] for n in names} == {"s0000", "s0010", "s0020"}  # 25 samples: chunks of 10, 10, 5
    assert stacked.shape == (10, 3, 4, 4) and stacked[7].max() == 7
    assert index["shardify"]["format_version"] == 3 and index["shardify"]["chunk"] == 10
    assert index["shardify"]["converter"]["format_version"] == 3
    assert index["shardify"]["converter"]["options"]["chunk"] == 10
    wds = pytest.importorskip("webdataset")
    seen = list(wds.WebDataset([str(first)], shardshuffle=False, empty_check=False))
    assert [s["__key__"] for s in seen] == ["s0000", "s0010", "s0020"]  # one sample per chunk
    assert set(seen[0]) >= {"chunk-keys", "npy", "cls"}
    assert json.loads((root / "manifest.json").read_text())["format_version"] == 2  # other splits stay readable


def _damage_chunk(root: Path) -> tuple[Path, str]:
    """Garble the offsets table of the second chunk's ``cls`` member of shard 0 (same size)."""
    path = root / json.loads((root / "train.json").read_text())["shardlist"][0]["url"]
    data = bytearray(path.read_bytes())
    with tarfile.open(path) as tar:
        member = tar.getmember("s0005.cls")
    data[member.offset_data + 24 + 8 : member.offset_data + 24 + 16] = (10**9).to_bytes(8, "little")
    path.write_bytes(bytes(data))
    return path, "s0005"


def test_a_damaged_chunk_is_damage_of_its_shard(tmp_path: Path) -> None:
    root = _write(tmp_path / "c", 5)
    path, key = _damage_chunk(root)
    src = resolve_source(root)
    kw = dict(chunks=[s.chunk for s in src.shards])
    with pytest.raises(ShardFormatError, match=f"key '{key}': damaged chunk: field 'cls'") as e:
        list(ShardReader([s.url for s in src.shards], src.sizes, skip_damaged=False, **kw).read(0, 0, 25))
    assert str(path) in str(e.value)
    items = list(ShardReader([s.url for s in src.shards], src.sizes, skip_damaged=True, **kw).read(0, 0, 25))
    assert [i for i, x in enumerate(items) if isinstance(x, Lost)] == list(range(5, 10))  # that chunk's samples
    with pytest.raises(ShardFormatError, match="damaged chunk"):
        list(ShardedDataset(root, batch_size=4, fields=("cls",)))
    kept = [
        x
        for b in ShardedDataset(root, batch_size=4, fields=("cls",), decoding=DecodeOptions(on_error="skip"))
        for x in b.tolist()
    ]
    assert len(kept) == N and not set(range(5, 10)) & set(kept)  # lost samples replaced by repeats
    # with verify=True the checksum catches it first: the whole shard is lost
    checked = [
        x
        for b in ShardedDataset(
            root, batch_size=4, fields=("cls",), decoding=DecodeOptions(on_error="skip", verify=True)
        )
        for x in b.tolist()
    ]
    assert not set(range(25)) & set(checked)
    problems = [(p.shard, p.key, p.message) for p in verify_dataset(root).problems]
    assert len(problems) == 1 and problems[0][0] == path.name and f"'{key}': damaged chunk" in problems[0][2]


def test_a_chunk_whose_keys_are_not_its_own_is_damage(tmp_path: Path) -> None:
    """The keys member must start with the key the chunk's members are named by."""
    root = _write(tmp_path / "c", 5)
    path = root / json.loads((root / "train.json").read_text())["shardlist"][0]["url"]
    data = bytearray(path.read_bytes())
    with tarfile.open(path) as tar:
        member = tar.getmember("s0005.chunk-keys")
    at = member.offset_data + 24 + 8 * 6  # the keys' data, after the header and 6 offsets
    assert data[at : at + 5] == b"s0005"
    data[at : at + 5] = b"x0005"
    path.write_bytes(bytes(data))
    src = resolve_source(root)
    reader = ShardReader(
        [s.url for s in src.shards], src.sizes, skip_damaged=False, chunks=[s.chunk for s in src.shards]
    )
    with pytest.raises(ShardFormatError, match="key 's0005': damaged chunk: its first key is 'x0005'"):
        list(reader.read(0, 5, 7))
    assert any("its first key is 'x0005'" in p.message for p in verify_dataset(root).problems)


def test_verify_checks_the_samples_of_each_chunk(tmp_path: Path) -> None:
    root = _write(tmp_path / "c", 6)
    report = verify_dataset(root)
    assert report.ok, report.problems
    assert report.checked["train"] == {"shards": 3, "samples": N}


def test_convert_items_and_shard_writer_write_the_same_chunked_bytes(tmp_path: Path) -> None:
    _write(tmp_path / "w", 6, per_shard=20)
    convert_items(
        range(N),
        _sample,
        tmp_path / "i",
        samples_per_shard=20,
        shard_size=None,
        workers=2,
        fsync=False,
        progress=False,
        chunk=6,
    )
    w = json.loads((tmp_path / "w" / "train.json").read_text())["shardlist"]
    i = json.loads((tmp_path / "i" / "train.json").read_text())["shardlist"]
    assert [s["sha256"] for s in w] == [s["sha256"] for s in i] and len(w) == 4


def test_a_chunked_and_a_per_sample_stream_mix_exactly_once(tmp_path: Path) -> None:
    from shardify.reader import Stream

    plain, packed = _write(tmp_path / "plain", None), _write(tmp_path / "chunked", 4)
    ds = ShardedDataset(
        [Stream(plain), Stream(packed)], batch_size=8, fields=("cls", "__stream__"), shuffle=True, seed=1
    )
    got = sorted((int(s), int(c)) for cls, stream in ds for c, s in zip(cls, stream))
    assert got == sorted([(0, i) for i in range(N)] + [(1, i) for i in range(N)])


def test_a_truncated_chunked_shard_keeps_the_chunks_before_the_cut(tmp_path: Path) -> None:
    root = _write(tmp_path / "c", 5)
    path = root / json.loads((root / "train.json").read_text())["shardlist"][0]["url"]
    with tarfile.open(path) as tar:
        cut = tar.getmember("s0015.npy").offset_data + 100  # inside the 4th chunk
    path.write_bytes(path.read_bytes()[:cut])
    src = resolve_source(root)
    kw = dict(
        chunks=[s.chunk for s in src.shards],
        offsets=[s.offsets for s in src.shards],
        filesizes=[s.filesize for s in src.shards],
    )
    with pytest.raises(ShardFormatError, match=str(path.name)):
        list(ShardReader([s.url for s in src.shards], src.sizes, skip_damaged=False, **kw).read(0, 0, 25))
    items = list(ShardReader([s.url for s in src.shards], src.sizes, skip_damaged=True, **kw).read(0, 0, 25))
    assert len(items) == 25
    assert [x["__key__"] for x in items[:15]] == [f"s{i:04d}" for i in range(15)]
    assert all(isinstance(x, Lost) for x in items[15:])
