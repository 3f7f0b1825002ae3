"""Every way in writes the same shards it always has: the shards of a fixed image folder (the
CLI), of a ``ShardWriter`` and of ``convert_items``, and their index entries (offsets, per-sample
tables), hash to recorded SHA-256s.

The inputs are built byte by byte (binary PPM images, numpy arrays, text), never by an encoder
whose output may change with its version, so the recorded hashes hold on any machine. They were
recorded from the converter that had two shard writers (one for planned shards, one for shards
cut as samples come), then again when the table's records gained a CRC-32 (the hashed entry
now holds each sample's length instead of the table's bytes); the one writer must write the same
bytes, shard for shard, in every layout: per-sample and chunked, a shard whose every input was skipped, one and
two workers. Run this file as a script to print the hashes of the code at hand.
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from shardify.cli import main
from shardify.convert import ShardWriter, convert_items
from shardify.sampletable import SampleTable


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
    size, hash, offsets, each sample's length from the per-sample table; not its name, which
    holds the version token, nor the table's checksums, whose format tests/format pins)."""
    entries = json.loads((out / "train.json").read_text())["shardlist"]
    hashes = []
    for entry in entries:
        url = entry.pop("url")
        if "samples" in entry:
            entry["samples"] = [size for size, *_ in SampleTable(base64.b64decode(entry["samples"])).records()]
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
    "cli-per-sample": ["24b49b151828dfcf", "797cb141c9e8d911", "d4576fae78c0b005", "ddbdfa55ebc25e7c"],
    "cli-one-per-shard": [
        "6b6b49cc34770ad1",
        "0ac8d152c692d5b4",
        "0e6188cd1c9bf2c1",
        "ba8d34712a8a67f4",
        "a5778e76815d860f",
        "7162c9a22afbceb4",
        "200b0dfe7cdbca61",
        "4f8f21e50ec42975",
        "71462f19ced2a3bd",
        "76410145f30d70e5",
        "90277029f59c0e23",
        "9139c4f1a7f3f5f8",
        "bccd242309db76d7",
        "b8906f9e0b5248fa",
        "f4320080665a01db",
        "c53399deb344aa55",
    ],
    "cli-chunked": ["e708995c96a91cbe", "862e0ec0519052f5", "264eba83c11d85e9"],
    "writer-size": [
        "3aed182531195a9d",
        "ec282e835dd66252",
        "97c990b54f74ab96",
        "f25e1fab4508a406",
        "b6682611dab17fc0",
        "9a34716d6276b5d0",
        "3b6cc0125cc2cefb",
        "10aeadc7d4f81a04",
        "67084be7fbcc0b62",
        "ff13e7e3ecf134ca",
        "fbd28f5fd83b9109",
        "eed1cb6f4ece193c",
        "5fe4aa3fa2854f74",
    ],
    "writer-chunked": ["b8a8713af8cde459", "7c1f9a43fc33a5ae", "08429205e55cd724"],
    "items-one-worker": [
        "6e3789b92e525955",
        "42fbf0aa4ee591f4",
        "adee3f183e7e51a7",
        "78e1086943135708",
        "1b513b2fdab6ef64",
    ],
    "items-two-workers": [
        "6d3c12254e73576a",
        "825cf3fb84932c6e",
        "6fd135d1aced383e",
        "73594f331ab3df8b",
        "8267137e5da05b5f",
        "f7a6d439805e0f82",
        "3a735ff9b2cf8722",
        "c2d29d4a913bf8cc",
        "daa1a405120f6a63",
        "3f80050454d13826",
        "09b15c94c69dbfb4",
        "8537b9ed213c9821",
        "de916af832492af6",
        "0be1338641429611",
        "e6b43e09c369d813",
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
