"""Every way in writes the same shards it always has: the shards of a fixed image folder (the
CLI), of a ``ShardWriter`` and of ``convert_items``, and their index entries (offsets, per-sample
tables), hash to recorded SHA-256s.

The inputs are built byte by byte (binary PPM images, numpy arrays, text), never by an encoder
whose output may change with its version, so the recorded hashes hold on any machine. They were
recorded from the converter that had two shard writers (one for planned shards, one for shards
cut as samples come); the one writer that replaced them must write the same bytes, shard for
shard, in every layout: per-sample and chunked, a shard whose every input was skipped, one and
two workers. Run this file as a script to print the hashes of the code at hand.
"""

from __future__ import annotations

import hashlib
import json
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
    """Per shard, in order: SHA-256 (16 hex digits) of its bytes and of its index entry (count,
    size, hash, offsets, per-sample table; not its name, which holds the version token)."""
    entries = json.loads((out / "train.json").read_text())["shardlist"]
    hashes = []
    for entry in entries:
        url = entry.pop("url")
        digest = hashlib.sha256((out / url).read_bytes())
        digest.update(json.dumps(entry, sort_keys=True).encode())
        hashes.append(digest.hexdigest()[:16])
    return hashes


def write(case: str, tmp: Path) -> list[str]:
    """Write case ``case`` under ``tmp``; see :func:`_shard_hashes`."""
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
    "cli-per-sample": ["161d4aa1a3604384", "c3642f476413fd84", "7ddb3c68f458431e", "286a896aca994e14"],
    "cli-one-per-shard": [
        "7b61be3af6c99a69",
        "69bf92f6bd929ee9",
        "0e6188cd1c9bf2c1",
        "defaae397cac0853",
        "41b7fe59de20cced",
        "67a894846ae3f6a7",
        "4ca6efd33b81ff6f",
        "63b56b69eabf44cd",
        "a01b4028bc7215de",
        "f12df3ad32c86335",
        "e4e793a0efe67b5c",
        "cbfbbab1a4890b10",
        "4be644b90b70b269",
        "ac76b6472398a796",
        "6a3974c8166f0d79",
        "f5bfbcf3c6632a3e",
    ],
    "cli-chunked": ["e708995c96a91cbe", "862e0ec0519052f5", "264eba83c11d85e9"],
    "writer-size": [
        "bd2cc8cda329e281",
        "fa40af3c5aae3b62",
        "f48a181bb58a940a",
        "e1c571bbb2e3cabf",
        "f3c60e266ee5f364",
        "e560b51856c1e47b",
        "2bf1f89fcb86dd73",
        "54c57c1a14555786",
        "2bbb5a636645f19f",
        "0749e756d21a1a95",
        "5025a206609d6d81",
        "fd43d1babea68343",
        "9de993d6fbf0e9e9",
    ],
    "writer-chunked": ["b8a8713af8cde459", "7c1f9a43fc33a5ae", "08429205e55cd724"],
    "items-one-worker": [
        "669d38398ef29e2a",
        "5c85f552794ef3d6",
        "219bd13c2ff682b6",
        "e077167eafd9cdc7",
        "42fef24183548032",
    ],
    "items-two-workers": [
        "4163cbe170794f9a",
        "5d3abefa3ae68253",
        "44b5515c6236dc1c",
        "a1bca6efe3b56feb",
        "7ee364da427bb75a",
        "c1176a3bb83772a3",
        "74bd789f10f63553",
        "02607424e0df1508",
        "3734b0bd7aaab257",
        "9397b6b3583ce9b4",
        "df397452434bbed6",
        "288b749263394bd0",
        "a3b3d57537c456be",
        "57c62f1c488994a3",
        "e6dbc50e225d32d3",
    ],
    "items-chunked": ["03645ad343d95c6f", "d5a63c1a554ac817", "535d94783b71e052", "5495415c9f609bc3"],
}


@pytest.mark.parametrize("case", [*_CLI, *_WRITER, *_ITEMS])
def test_the_shards_are_the_bytes_they_always_were(case: str, tmp_path: Path) -> None:
    assert write(case, tmp_path) == EXPECTED[case]


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        for name in [*_CLI, *_WRITER, *_ITEMS]:
            print(f"    {name!r}: {write(name, Path(d))!r},", file=sys.stdout)
