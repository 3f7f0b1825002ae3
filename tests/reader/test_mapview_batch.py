"""MapDataset's batch path: a batch's tar headers parsed at once only when every sample is the
plain case alike (else None: parsed one by one), and fields decoded per batch exactly as the
per-sample decoders decode them."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

from shardify.convert import ShardWriter
from shardify.npy import encode_array
from shardify.reader import MapDataset
from shardify.reader.io.tarbatch import parse_batch
from shardify.reader.mapbatch import BatchList


def _tar(samples: list[list[tuple[str, bytes]]], fmt: int = tarfile.USTAR_FORMAT) -> tuple[np.ndarray, np.ndarray]:
    """The samples' members as one tar's bytes (no end blocks) and each sample's start (and the end)."""
    out, starts = io.BytesIO(), [0]
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for members in samples:
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            starts.append(out.tell())
    data = np.frombuffer(out.getvalue(), np.uint8)[: starts[-1]]
    return data, np.array(starts, np.int64)


def _parse(samples: list[list[tuple[str, bytes]]], fmt: int = tarfile.USTAR_FORMAT) -> object:
    data, at = _tar(samples, fmt)
    return parse_batch(data, at[:-1], at[1:], max_member=1 << 20)


def test_plain_samples_alike_are_parsed_at_once() -> None:
    samples = [[(f"k{i}.cls", str(i).encode()), (f"k{i}.tokens.npy", b"x" * (600 + i))] for i in range(5)]
    data, at = _tar(samples)
    parsed = parse_batch(data, at[:-1], at[1:], max_member=1 << 20)
    assert parsed is not None and parsed.keys(data) == [f"k{i}" for i in range(5)]
    assert list(parsed.fields) == ["cls", "tokens.npy"]
    assert [parsed.fields["cls"].value(j) for j in range(5)] == [str(i).encode() for i in range(5)]
    assert parsed.fields["tokens.npy"].value(4) == b"x" * 604


@pytest.mark.parametrize(
    "samples",
    [
        pytest.param(
            [[("a.cls", b"1"), ("a.txt", b"t")], [("b.cls", b"1"), ("c.txt", b"t")]], id="a member of another key"
        ),
        pytest.param([[("a.cls", b"1"), ("a.txt", b"t")], [("b.cls", b"1"), ("b.json", b"{}")]], id="another field"),
        pytest.param([[("a.cls", b"1"), ("a.txt", b"t")], [("b.cls", b"1")]], id="fewer members"),
        pytest.param([[("a.cls", b"1")], [("b.cls", b"1"), ("b.txt", b"t")]], id="more members"),
        pytest.param([[("a.cls", b"1"), ("a.cls", b"2")]], id="a field twice"),
        pytest.param([[("a", b"1")]], id="no field"),
    ],
)
def test_anything_but_plain_samples_alike_is_left_to_the_one_by_one_parse(samples: list) -> None:
    assert _parse(samples) is None


def test_extension_headers_and_long_names_are_left_to_the_one_by_one_parse() -> None:
    assert _parse([[("a.cls", b"1")], [("b" * 120 + ".cls", b"1")]], tarfile.PAX_FORMAT) is None
    assert _parse([[("a.cls", b"1")], [("d/" * 60 + "b.cls", b"1")]]) is None  # the ustar prefix field


def test_npy_fields_are_one_batch_only_when_their_headers_agree(tmp_path: Path) -> None:
    with ShardWriter(tmp_path / "ds", fsync=False) as w:
        for i in range(6):
            raw = io.BytesIO()
            np.save(raw, np.full(3 if i != 4 else 4, i, ">i4"))  # big-endian, stored as given; sample 4: another shape
            w.write({"npy": raw.getvalue(), "cls": i})
    ds = MapDataset(tmp_path / "ds", fields=("npy", "cls"))
    alike = ds.__getitems__([5, 0, 3])
    assert isinstance(alike, BatchList)
    assert all(x.dtype == np.dtype("=i4") and x.flags.writeable for x, _ in alike)
    assert [(x.tolist(), y) for x, y in alike] == [([5] * 3, 5), ([0] * 3, 0), ([3] * 3, 3)]
    mixed = ds.__getitems__([3, 4])
    assert not isinstance(mixed, BatchList) and [x.tolist() for x, _ in mixed] == [[3] * 3, [4] * 4]
    assert np.array_equal(ds.collate(alike)[0].numpy(), np.stack([x for x, _ in alike]))
    assert encode_array(alike[0][0]) == encode_array(ds[5][0])


def test_a_shard_truncated_after_it_was_mapped_is_an_error_naming_it_not_a_fault(tmp_path: Path) -> None:
    from shardify.errors import ShardFormatError

    with ShardWriter(tmp_path / "ds", fsync=False) as w:
        for i in range(40):
            w.write({"npy": np.full(300, i, np.int64), "cls": i})
    ds = MapDataset(tmp_path / "ds", fields=("npy", "cls"))
    assert [y for _, y in ds.__getitems__([0, 39])] == [0, 39], "mapped now"
    shard = Path(ds.source.urls[0])
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)
    with pytest.raises(ShardFormatError, match="truncated") as e:
        ds.__getitems__([1, 39])
    assert e.value.shard == str(shard)
    assert ds[1][1] == 1, "what is still there reads on"


def test_npy_fields_of_samples_of_other_lengths_are_one_batch_too(tmp_path: Path) -> None:
    with ShardWriter(tmp_path / "ds", fsync=False) as w:
        for i in range(6):
            w.write({"npy": np.full((2, 2), i, np.uint8), "cls": i, "txt": "x" * (100 + 700 * i)})
    ds = MapDataset(tmp_path / "ds", fields=("npy", "cls"))
    got = ds.__getitems__([4, 0, 5, 1])
    assert isinstance(got, BatchList), "members at other places in each sample"
    assert [(x.tolist(), y) for x, y in got] == [([[i, i], [i, i]], i) for i in (4, 0, 5, 1)]
    assert all(x.flags.writeable and x.flags.c_contiguous for x, _ in got)


def test_npy_headers_of_one_length_that_differ_keep_each_samples_dtype(tmp_path: Path) -> None:
    with ShardWriter(tmp_path / "ds", fsync=False) as w:
        for i in range(4):
            w.write({"npy": np.full(4, i, np.int16 if i % 2 else np.uint16), "cls": i})
    ds = MapDataset(tmp_path / "ds", fields=("npy", "cls"))
    got = ds.__getitems__([0, 1, 2, 3])
    assert [x.dtype for x, _ in got] == [np.dtype(np.uint16), np.dtype(np.int16)] * 2


@pytest.mark.parametrize(
    "values",
    [
        pytest.param([b"0", b"7", b"12", b"007", b"123456789012345678", b"5"], id="plain digits"),
        pytest.param([b" 3", b"-2", b"4\n"], id="blanks and signs"),
    ],
)
def test_labels_of_a_batch_are_the_per_sample_decoders(values: list[bytes]) -> None:
    from shardify.reader.io.columns import Spans
    from shardify.reader.mapbatch import _labels
    from shardify.reader.sample.decode import decode_field

    data = np.frombuffer(b"".join(values), np.uint8)
    size = np.array([len(v) for v in values])
    at = np.concatenate([[0], np.cumsum(size)[:-1]])
    assert _labels(Spans(data, at, size), len(values)) == [decode_field("cls", v) for v in values]
