"""The chunk codec and the chunked split's format version: what is stacked and what is not,
same samples -> same bytes, damage named, the size per small sample, and a reader of
format 1..2 refusing a chunked split by name."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from shardify import splitindex as splitindex_module
from shardify.chunk import KEYS_EXT, Stacked, Variable, decode_chunk, encode_chunk
from shardify.convert import ShardWriter
from shardify.errors import EncodeError, ManifestError, ShardFormatError
from shardify.manifest import Manifest
from shardify.npy import encode_array, encode_tensor
from shardify.reader import ShardedDataset
from shardify.reader.sample.decode import decode_field
from shardify.splitindex import SplitIndex


def _chunk(values: list[bytes | None], ext: str = "npy"):
    keys = [f"k{i}" for i in range(len(values))]
    members = encode_chunk(keys, [[(ext, v)] if v is not None else [] for v in values])
    return dict(members), decode_chunk(dict(members), shard="s.tar", key="k0", count=len(values))


def test_fixed_shape_arrays_are_stacked_into_one_npy() -> None:
    arrays = [np.arange(6, dtype="<f4").reshape(2, 3) + i for i in range(4)]
    members, chunk = _chunk([encode_array(a) for a in arrays])
    assert isinstance(chunk.columns["npy"], Stacked)
    assert np.array_equal(np.load(io.BytesIO(members["npy"])), np.stack(arrays))
    for i, a in enumerate(arrays):
        assert np.array_equal(chunk.sample(i)["npy"], a)


@pytest.mark.parametrize("case", ["shapes differ", "dtypes differ", "one lacks it", "fortran order", "not npy"])
def test_arrays_that_cannot_be_stacked_keep_their_own_bytes(case: str) -> None:
    a = np.arange(6, dtype=np.int16).reshape(2, 3)
    values: list[bytes | None] = [encode_array(a), encode_array(a + 1)]
    if case == "shapes differ":
        values.append(encode_array(np.arange(4, dtype=np.int16)))
    elif case == "dtypes differ":
        values.append(encode_array(a.astype(np.int32)))
    elif case == "one lacks it":
        values.append(None)
    elif case == "fortran order":
        buf = io.BytesIO()
        np.save(buf, np.asfortranarray(a))
        values = [buf.getvalue()] * 3
    else:
        values = [b"plain bytes"] * 3
    _, chunk = _chunk(values)
    assert isinstance(chunk.columns["npy"], Variable)
    assert [chunk.sample(i).get("npy") for i in range(3)] == values


def test_raw_view_dtypes_stack_and_decode_to_their_torch_dtype() -> None:
    tensors = [torch.arange(4, dtype=torch.bfloat16) * i for i in range(3)]
    _, chunk = _chunk([encode_tensor(t) for t in tensors])
    assert isinstance(chunk.columns["npy"], Stacked)
    for i, t in enumerate(tensors):
        got = decode_field("npy", chunk.sample(i)["npy"])  # type: ignore[arg-type]
        assert got.dtype == torch.bfloat16 and torch.equal(got, t)


def test_same_samples_give_the_same_bytes(tmp_path: Path) -> None:
    def write(root: Path) -> list[str]:
        with ShardWriter(root, chunk=8, samples_per_shard=20, shard_size=None, fsync=False) as w:
            for i in range(45):
                w.write({"npy": np.full(5, i, np.int64), "txt": "x" * i, "cls": i})
        return [hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.glob("train-*.tar"))]

    assert write(tmp_path / "a") == write(tmp_path / "b")


@pytest.mark.parametrize("damage", ["magic", "count", "offsets", "short", "stacked rows", "keys"])
def test_damaged_members_raise_naming_shard_key_and_field(damage: str) -> None:
    members, _ = _chunk([b"ab", b"cde", b"f"], ext="txt")
    members["npy"] = encode_array(np.zeros((3, 2), np.uint8))
    if damage == "magic":
        members["txt"] = b"XXXXXXXX" + members["txt"][8:]
    elif damage == "count":
        members["txt"] = members["txt"][:8] + (4).to_bytes(8, "little") + members["txt"][16:]
    elif damage == "offsets":
        raw = bytearray(members["txt"])
        raw[32:40] = (7).to_bytes(8, "little")
        members["txt"] = bytes(raw)
    elif damage == "short":
        members["txt"] = members["txt"][:-1]
    elif damage == "stacked rows":
        members["npy"] = encode_array(np.zeros((2, 2), np.uint8))
    else:
        del members[KEYS_EXT]
    with pytest.raises(ShardFormatError, match=r"shard s\.tar, key 'k0': (damaged chunk|chunk has no)") as e:
        decode_chunk(members, shard="s.tar", key="k0", count=3)
    if damage in ("magic", "count", "offsets", "short"):
        assert "field 'txt'" in str(e.value)


def test_a_field_named_like_the_keys_member_is_refused_naming_the_sample(tmp_path: Path) -> None:
    with pytest.raises(EncodeError, match=f"'000000001'.*{KEYS_EXT}"):
        with ShardWriter(tmp_path / "o", chunk=4, fsync=False) as w:
            w.write({"cls": 0})
            w.write({"cls": 1, KEYS_EXT: b"x"})
            w.write({"cls": 2})
            w.write({"cls": 3})
    assert not (tmp_path / "o" / "manifest.json").exists()


def test_a_value_the_writer_cannot_encode_is_named_as_without_chunks(tmp_path: Path) -> None:
    with pytest.raises(EncodeError, match=r"sample 1 \(__key__ 'b'\)"):
        with ShardWriter(tmp_path / "o", chunk=4, fsync=False) as w:
            w.write({"__key__": "a", "cls": 0})
            w.write({"__key__": "b", "cls": object()})


def _small_images(root: Path, chunk: int | None, n: int = 2048) -> float:
    """Bytes per sample of 3x32x32 uint8 arrays with an int label (CIFAR's shape)."""
    rng = np.random.default_rng(0)
    with ShardWriter(root, chunk=chunk, fsync=False) as w:
        for i in range(n):
            w.write({"npy": rng.integers(0, 256, (3, 32, 32), dtype=np.uint8), "cls": int(i % 10)})
    return sum(p.stat().st_size for p in root.glob("train-*.tar")) / n


def test_small_samples_take_at_most_1_2x_mosaicml_bytes(tmp_path: Path) -> None:
    per_sample = _small_images(tmp_path / "plain", None)
    chunked = _small_images(tmp_path / "chunked", 256)
    assert per_sample > 5000  # header + npy + header + label, each padded to 512
    assert chunked <= 1.2 * 3084, chunked  # MosaicML Streaming's 3,084 B/sample for this case
    ds = ShardedDataset(tmp_path / "chunked", batch_size=512, fields=("npy", "cls"))
    assert sum(len(y) for _, y in ds) == 2048


def _chunked_index(tmp_path: Path) -> Path:
    with ShardWriter(tmp_path / "o", chunk=3, fsync=False) as w:
        for i in range(7):
            w.write({"cls": i})
    return tmp_path / "o"


def test_a_reader_of_formats_1_to_2_refuses_a_chunked_split_by_name(tmp_path: Path, monkeypatch) -> None:
    root = _chunked_index(tmp_path)
    assert Manifest.load(root).load_split(root, "train").chunk == 3
    monkeypatch.setattr(splitindex_module, "READ_VERSION", 2)  # what the format-2 reader had
    with pytest.raises(
        ManifestError,
        match=r"train-[0-9a-f]{12}\.json \[shardify\]: field 'format_version' is 3, "
        r"this shardify reads 1\.\.2",
    ):
        Manifest.load(root).load_split(root, "train")


@pytest.mark.parametrize("edit", ["chunk in format 2", "format 3 without chunk", "chunk 0", "offsets per sample"])
def test_the_index_refuses_a_chunk_field_that_cannot_be_right(tmp_path: Path, edit: str) -> None:
    root = _chunked_index(tmp_path)
    obj = json.loads((root / "train.json").read_text())
    ours = obj["shardify"]
    if edit == "chunk in format 2":
        ours["format_version"] = 2
    elif edit == "format 3 without chunk":
        del ours["chunk"]
    elif edit == "chunk 0":
        ours["chunk"] = 0
    else:  # 7 samples in chunks of 3: one window of chunks; a per-sample list has as many
        ours["chunk"] = 1
        obj["shardlist"][0]["nsamples"] = 40
        ours["num_samples"] = 40
    with pytest.raises(ManifestError, match="'chunk'|'offsets'"):
        SplitIndex.from_json(obj, source="t.json")
