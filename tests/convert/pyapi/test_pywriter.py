"""ShardWriter: every value type round-trips through shardify's reader and webdataset; bad input is refused clearly."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from shardify.convert import ShardWriter, ValueOptions
from shardify.convert.pyapi.values import ORIGINAL_KEY_FIELD, encode_array, encode_value
from shardify.convert.verify import verify_dataset
from shardify.errors import EncodeError, KeyRuleError, OutputError
from shardify.manifest import Manifest
from shardify.reader import BatchOptions

FAST = {"fsync": False}


def _samples() -> list[dict[str, object]]:
    rgb = np.random.default_rng(0).integers(0, 256, (12, 10, 3), dtype=np.uint8)
    return [
        {
            "__key__": "first",
            "bin": b"\x00\xffraw",
            "txt": "héllo wörld",
            "cls": 2,
            "meta.json": {"a": [1, 2.5, None], "b": "x"},
            "npy": np.arange(12, dtype=np.float32).reshape(3, 4),
            "fortran.npy": np.asfortranarray(np.arange(6, dtype=np.int16).reshape(2, 3)),
            "pt": torch.linspace(0, 1, 5, dtype=torch.float64),
            "tensor.npy": torch.arange(4, dtype=torch.int32),
            "png": Image.fromarray(rgb),
            "jpg": rgb,
            "mask.png": rgb[:, :, 0],
        },
        {
            "txt": "second",
            "cls": np.int64(0),
            "list.json": [1, "two"],
            "npy": np.zeros((0, 3), dtype=np.uint8),
            "pt": torch.ones(2, 2, dtype=torch.bfloat16)[1],
        },
    ]


def _check_decoded(decoded: dict[str, object], original: dict[str, object]) -> None:
    for field, value in original.items():
        if field.startswith("__"):
            continue
        got = decoded[field]
        if isinstance(value, np.ndarray) and field.endswith("npy"):
            assert isinstance(got, np.ndarray) and got.dtype == value.dtype and got.shape == value.shape
            assert np.array_equal(got, value)  # memory order is not kept: C order, the same bytes for equal values
        elif isinstance(value, torch.Tensor) and field.endswith("npy"):
            assert np.array_equal(got, value.numpy()) and got.dtype == value.numpy().dtype
        elif isinstance(value, torch.Tensor):
            assert isinstance(got, torch.Tensor) and got.dtype == value.dtype and torch.equal(got, value)
        elif field in ("png", "mask.png"):
            want = value if isinstance(value, Image.Image) else Image.fromarray(value)
            assert np.array_equal(np.asarray(got), np.asarray(want.convert("RGB")))  # lossless; the reader gives RGB
        elif field == "jpg":
            assert got.size == (value.shape[1], value.shape[0])
        elif field == "bin":
            assert got == value
        else:
            assert got == value, field


def test_every_value_type_round_trips_through_shardify_and_webdataset(tmp_path: Path) -> None:
    import webdataset as wds

    from shardify.reader import ShardedDataset
    from shardify.reader.sample.decode import decode_field

    out = tmp_path / "out"
    samples = _samples()
    with ShardWriter(out, samples_per_shard=1, classes=("a", "b", "c"), **FAST) as w:
        keys = [w.write(s) for s in samples]
    assert keys == ["first", "000000001"]
    assert verify_dataset(out).ok
    assert Manifest.load(out).splits["train"].samples == 2

    ds = ShardedDataset(out, batch_size=1, map=lambda s: s, batching=BatchOptions(collate_fn=list))
    via_reader = {s["__key__"]: s for batch in ds for s in batch}
    assert set(via_reader) == set(keys)
    for key, original in zip(keys, samples):
        _check_decoded(via_reader[key], original)

    urls = [str(p) for p in sorted(out.glob("train-*.tar"))]
    via_wds = {s["__key__"]: s for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False)}
    for key, original in zip(keys, samples):
        raw = via_wds[key]
        assert set(raw) - {"__key__", "__url__", "__local_path__"} == {f for f in original if not f.startswith("__")}
        _check_decoded({f: decode_field(f, raw[f]) for f in raw if not f.startswith("__")}, original)
        # and with the libraries' own loaders, as a webdataset user would
        if "pt" in original:
            assert torch.equal(torch.load(io.BytesIO(raw["pt"]), weights_only=True), original["pt"])
        assert np.array_equal(np.load(io.BytesIO(raw["npy"]), allow_pickle=False), original["npy"])


def test_wids_opens_the_split(tmp_path: Path) -> None:
    import wids

    with ShardWriter(tmp_path / "out", samples_per_shard=1, **FAST) as w:
        for s in _samples():
            w.write(s)
    ds = wids.ShardListDataset(
        str(tmp_path / "out" / "train.json"), cache_dir=str(tmp_path / "cache"), transformations=[]
    )
    assert len(ds) == 2 and {ds[i]["__key__"] for i in range(2)} == {"first", "000000001"}


def test_a_full_disk_is_an_output_error_and_nothing_looks_finished(tmp_path: Path, monkeypatch) -> None:
    from shardify.convert.write.tarwrite import HashingWriter

    real = HashingWriter.write

    def write(self: HashingWriter, data: bytes) -> None:
        if self.size + len(data) > 20_000:
            raise OSError(28, "No space left on device")
        real(self, data)

    monkeypatch.setattr(HashingWriter, "write", write)
    out = tmp_path / "out"
    with pytest.raises(
        OutputError, match=r"train-[0-9a-f]{12}-000000.tar: cannot write shard: No space left on device"
    ):
        with ShardWriter(out, **FAST) as w:
            for i in range(100):
                w.write({"npy": np.zeros(1000, np.uint8), "cls": i})
    assert not (out / "manifest.json").exists() and not list(out.glob(".*.tmp"))


def test_same_samples_give_the_same_bytes_and_a_tensor_view_stores_only_itself(tmp_path: Path, tree_bytes) -> None:
    for name in ("a", "b"):
        with ShardWriter(tmp_path / name, samples_per_shard=1, **FAST) as w:
            for s in _samples():
                w.write(s)
    assert tree_bytes(tmp_path / "a") == tree_bytes(tmp_path / "b")
    base = torch.arange(100_000, dtype=torch.float32)
    view = encode_value("pt", base[10:20], ValueOptions())
    assert view == encode_value("pt", base[10:20].clone(), ValueOptions())
    assert len(view) < 4096  # not the 400 KB base storage
    assert encode_array(np.arange(6).reshape(2, 3)) == _np_save(np.arange(6).reshape(2, 3))
    fortran = np.arange(6).reshape(2, 3).T
    assert encode_array(fortran) == _np_save(np.ascontiguousarray(fortran))  # equal values, equal bytes


def _np_save(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def test_exception_inside_with_leaves_no_finished_split(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="user code failed"):
        with ShardWriter(out, samples_per_shard=2, **FAST) as w:
            for i in range(5):
                w.write({"txt": str(i)})
            raise RuntimeError("user code failed")
    assert not (out / "manifest.json").exists() and not (out / "train.json").exists()
    assert not list(out.glob(".*.tmp"))
    # the lock was released: a new writer finishes the split, and only its shards remain
    with ShardWriter(out, samples_per_shard=2, **FAST) as w:
        w.write({"txt": "only"})
    assert Manifest.load(out).splits["train"].samples == 1
    shards = sorted(p.name for p in out.glob("train-*.tar"))
    assert len(shards) == 1 and shards[0].endswith("-000000.tar"), shards


def test_a_finished_split_is_kept_unless_overwrite_and_a_second_writer_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with ShardWriter(out, **FAST) as w:
        w.write({"txt": "a"})
    from shardify.errors import OutputExistsError

    with pytest.raises(OutputExistsError, match="already finished"):
        ShardWriter(out, **FAST).open()
    with ShardWriter(out, overwrite=True, **FAST) as w:
        with pytest.raises(OutputError, match="another shardify conversion"):
            ShardWriter(out, split="other", **FAST).open()
        w.write({"txt": "b"})


def test_writing_a_split_again_never_changes_the_files_a_reader_may_be_reading(tmp_path: Path) -> None:
    from shardify.convert import convert_items
    from shardify.reader import ShardedDataset

    out = tmp_path / "out"
    with ShardWriter(out, samples_per_shard=2, **FAST) as w:
        for i in range(4):
            w.write({"txt": f"old {i}"})
    reader = ShardedDataset(out, batch_size=4, fields=("txt",), batching=BatchOptions(collate_fn=list))
    first = {p.name: p.read_bytes() for p in out.glob("train-*.tar")}
    # the same options with other samples, then convert_items: each a new version beside the old one
    with ShardWriter(out, samples_per_shard=2, overwrite=True, **FAST) as w:
        for i in range(4):
            w.write({"txt": f"new {i}"})
    convert_items(range(3), lambda i: {"txt": f"items {i}"}, out, overwrite=True, **FAST)
    for name, data in first.items():
        assert (out / name).read_bytes() == data, name
    assert sorted(t for b in reader for t in b) == [f"old {i}" for i in range(4)]  # the pinned version
    again = ShardedDataset(out, batch_size=3, fields=("txt",), batching=BatchOptions(collate_fn=list))
    assert sorted(t for b in again for t in b) == [f"items {i}" for i in range(3)]
    assert len({p.name.split("-")[1] for p in out.glob("train-*.tar")}) == 3


@pytest.mark.parametrize(
    "sample, match",
    [
        pytest.param({"txt": {1, 2}}, r"sample 0: field 'txt': cannot store a builtins.set", id="set"),
        pytest.param(
            {"npy": np.array([object()], dtype=object)}, r"field 'npy': cannot store an object array", id="object-array"
        ),
        pytest.param({"txt": 3}, r"field 'txt'.*an int goes in a 'cls' field", id="int-in-txt"),
        pytest.param({"cls": 1.5}, r"field 'cls'.*'\*\.json' fields", id="float-label"),
        pytest.param({"jpg": torch.zeros(3, 4, 4)}, r"field 'jpg'.*tensors go in", id="tensor-as-jpg"),
        pytest.param({"npy": Image.new("RGB", (2, 2))}, r"field 'npy'.*images go in", id="image-as-npy"),
        pytest.param({"jpg": np.zeros((4, 4, 4), np.uint8)}, r"field 'jpg': cannot encode a RGBA", id="rgba-jpeg"),
        pytest.param(
            {"png": np.zeros((4, 4), np.float32)}, r"field 'png': an image array should be uint8", id="float-image"
        ),
        pytest.param({"JPG": b"x"}, r"field 'JPG'.*lower-case", id="upper-case-field"),
        pytest.param({"meta.json": {"x": object()}}, r"field 'meta.json': cannot encode as JSON", id="json-object"),
        pytest.param({"__key__": 7, "txt": "x"}, r"sample 0.*__key__ should be a str", id="int-key"),
        pytest.param({"__key__": "k"}, r"sample 0 \(__key__ 'k'\).*no fields", id="empty"),
        pytest.param({"cls": 5}, r"label 5 is outside 0..2", id="label-out-of-range"),
        pytest.param(["not", "a", "dict"], r"sample 0.*should be a dict", id="list-sample"),
    ],
)
def test_unsupported_values_give_a_clear_type_error(tmp_path: Path, sample: object, match: str) -> None:
    out = tmp_path / "out"
    with pytest.raises(EncodeError, match=match) as caught:
        with ShardWriter(out, classes=("a", "b", "c"), **FAST) as w:
            w.write(sample)  # type: ignore[arg-type]
    assert isinstance(caught.value, TypeError)
    assert not (out / "manifest.json").exists()


def test_keys_follow_the_key_rules_and_duplicates_name_both_samples(tmp_path: Path) -> None:
    from shardify.keys import check_key

    with ShardWriter(tmp_path / "a", **FAST) as w:
        key = w.write({"__key__": "dir/file name.v2", "txt": "x"})
        plain = w.write({"__key__": "ok_key-1", "txt": "y"})
    check_key(key)
    assert key.startswith("dir__file_name_v2-") and plain == "ok_key-1"
    import tarfile

    from shardify.reader.sample.decode import decode_field

    with tarfile.open(next((tmp_path / "a").glob("train-*-000000.tar"))) as tf:
        names = tf.getnames()
        original = tf.extractfile(f"{key}.{ORIGINAL_KEY_FIELD}").read()
    assert decode_field(ORIGINAL_KEY_FIELD, original) == "dir/file name.v2"
    assert f"{plain}.{ORIGINAL_KEY_FIELD}" not in names

    with pytest.raises(KeyRuleError, match=r"sample 2 and sample 0 have the same key 'dup'"):
        with ShardWriter(tmp_path / "b", **FAST) as w:
            w.write({"__key__": "dup", "txt": "x"})
            w.write({"txt": "y"})
            w.write({"__key__": "dup", "txt": "z"})
    with pytest.raises(KeyRuleError, match=r"sample 1 and sample 0 have the same key '000000001'"):
        with ShardWriter(tmp_path / "c", **FAST) as w:
            w.write({"__key__": "000000001", "txt": "x"})
            w.write({"txt": "y"})  # its index key is 000000001
    assert not (tmp_path / "b" / "manifest.json").exists()


def test_shards_are_cut_at_the_size_bound(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with ShardWriter(out, shard_size="16KB", **FAST) as w:
        for i in range(40):
            w.write({"npy": np.full(1000, i, dtype=np.uint8), "cls": i})
    index = json.loads((out / "train.json").read_text())
    sizes = [s["filesize"] for s in index["shardlist"]]
    assert len(sizes) > 3 and all(s <= 16_000 for s in sizes) and sum(s["nsamples"] for s in index["shardlist"]) == 40
    assert index["shardify"]["converter"]["source"] == "python"
    assert verify_dataset(out).ok
