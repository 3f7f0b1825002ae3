"""Every way in writes the same shard bytes it always has: the shards of a fixed image folder (the
CLI), of a ``ShardWriter`` and of ``convert_items`` hash to recorded SHA-256s.

The inputs are built byte by byte (binary PPM images, numpy arrays, text), never by an encoder
whose output may change with its version, so the recorded hashes hold on any machine. They were
recorded from the converter that had two shard writers (one for planned shards, one for shards
cut as samples come); the one writer that replaced them must write the same bytes, shard for
shard, in every layout: per-sample and chunked, a shard whose every input was skipped, one and
two workers. Run this file as a script to print the hashes of the code at hand.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest

from shardify.cli import main
from shardify.convert import ShardWriter, convert_items


def _ppm(width: int, height: int, seed: int) -> bytes:
    pixels = bytes((seed * 31 + i * 7) % 256 for i in range(width * height * 3))
    return f"P6 {width} {height} 255\n".encode() + pixels


def _image_folder(root: Path) -> Path:
    for c in range(3):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(5):
            seed = c * 5 + i
            (root / f"c{c}" / f"img{i}.ppm").write_bytes(_ppm(8 + seed % 4, 6 + seed % 3, seed))
    (root / "c1" / "bad.jpg").write_bytes(b"\xff\xd8\xff junk")  # not a JPEG: skipped
    return root


_CLI = {
    "cli-per-sample": ["--samples-per-shard", "4", "--workers", "2"],
    "cli-one-per-shard": ["--samples-per-shard", "1", "--workers", "1", "--allow-empty"],
    "cli-chunked": ["--chunk", "3", "--samples-per-shard", "7", "--metadata", "always", "--no-shuffle"],
}


def _samples(n: int):
    for i in range(n):
        yield {"npy": np.arange(i, i + 50, dtype=np.int32), "cls": i % 7, "txt": f"s{i}" * (i % 20)}


_WRITER = {"writer-size": {"shard_size": "24KB"}, "writer-chunked": {"chunk": 8, "samples_per_shard": 30}}


def _fn(i: int) -> dict[str, object] | None:
    if i % 13 == 5:
        raise ValueError("a bad item")
    if i % 11 == 3:
        return None
    return {"npy": np.full(i % 40 + 1, i, np.uint16), "cls": i % 5, "__key__": f"k{i:05d}"}


_ITEMS = {
    "items-one-worker": {"workers": 1, "samples_per_shard": 23},
    "items-two-workers": {"workers": 2, "shard_size": "16KB"},
    "items-chunked": {"workers": 2, "chunk": 5, "samples_per_shard": 30},
}


def _shard_hashes(out: Path) -> list[str]:
    return [hashlib.sha256(p.read_bytes()).hexdigest()[:16] for p in sorted(out.glob("train-*.tar"))]


def write(case: str, tmp: Path) -> list[str]:
    """Write case ``case`` under ``tmp``; the SHA-256 (first 16 hex digits) of its shards, in order."""
    out = tmp / case
    if case in _CLI:
        src = _image_folder(tmp / "src") if not (tmp / "src").exists() else tmp / "src"
        code = main(["convert", "imagefolder", str(src), str(out), "--quiet", "--no-fsync", *_CLI[case]])
        assert code == 3  # the junk file was skipped
    elif case in _WRITER:
        with ShardWriter(out, fsync=False, **_WRITER[case]) as w:
            for sample in _samples(90):
                w.write(sample)
    else:
        convert_items(range(120), _fn, out, fsync=False, **_ITEMS[case])
    return _shard_hashes(out)


EXPECTED: dict[str, list[str]] = {
    "cli-per-sample": ["210d7fd7078813cf", "09c3346de6ac7d2f", "e50f115ab38c8dda", "30a438128597e66e"],
    "cli-one-per-shard": [
        "42e61761c11b3f88",
        "5c21d548d9a3b018",
        "5f70bf18a0860070",
        "b5415a739873c0ed",
        "ecc42f1c7124525e",
        "3dfde72d1eb634a8",
        "4936b394d310cb04",
        "d830112e83f0f93b",
        "5ac4802c7134d385",
        "318a5509b949a351",
        "d1d52f8889e0ed19",
        "f4852394fcca09ec",
        "3fc6f377c68d168f",
        "71ab10f79c52553b",
        "f5ed24e5a9550c36",
        "3d57bd854223818d",
    ],
    "cli-chunked": ["9403daaadc83c0d9", "bfc7b1349598a040", "1e560b85ae2dc377"],
    "writer-size": [
        "ab49acfd3fc65b7f",
        "97f2d5cf407025f8",
        "f94012b506e10dff",
        "229fc64959494fc8",
        "1374cdd3a3621a11",
        "ccd050db008ed5a1",
        "a87eba3afe9252b7",
        "38c7e6a2ff798a05",
        "77c1f739c7435053",
        "6446b0b22c6f6bc8",
        "6635169b2c70f861",
        "35fcaa3ee6bd6d99",
        "45fa09d3b10c037c",
    ],
    "writer-chunked": ["47f9adef83f409ce", "adfe38bba7649f9d", "6517ad89b86f6793"],
    "items-one-worker": [
        "d934ea71d2c9dfb6",
        "27d51ed392a0238c",
        "7d157f8056c68918",
        "7f38f9ec1452daaf",
        "f1180c73a7b8f795",
    ],
    "items-two-workers": [
        "047c7e3f9192a681",
        "d83be5034dd5de45",
        "f4f2ddbc9eac01e0",
        "2d70589cfeeab8e4",
        "08794b41014577fc",
        "58ece461da459378",
        "fa154238ad105efd",
        "12b93a822ba10cd2",
        "1cb2e09888ed51d4",
        "e7c3adc72ed2ed39",
        "77ab821cf0a548df",
        "d6d38804a9fe600f",
        "408062b198c89891",
        "6eaa2840caa43892",
        "0570b9a71f46c856",
    ],
    "items-chunked": ["f2dea3dcf5812a31", "7de55f2c1330ae65", "4dee86d89df91b9e", "b6ec1ab5a7d2db4a"],
}


@pytest.mark.parametrize("case", [*_CLI, *_WRITER, *_ITEMS])
def test_the_shards_are_the_bytes_they_always_were(case: str, tmp_path: Path) -> None:
    assert write(case, tmp_path) == EXPECTED[case]


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        for name in [*_CLI, *_WRITER, *_ITEMS]:
            print(f"    {name!r}: {write(name, Path(d))!r},", file=sys.stdout)
