"""Tiny datasets for the reader tests, written directly with the format modules in tmp_path.

Samples of a "counting" dataset carry their global index as ``cls`` (and a ``txt`` copy), so
a test reads indices back and checks exactly-once without any image decoding.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest

from shardify.convert.synth import jpeg_bytes, natural_image
from shardify.keys import member_name
from shardify.manifest import Manifest, ShardEntry, SplitIndex, write_json_atomic
from shardify.tarfmt import END_OF_ARCHIVE, padding, shard_name, ustar_header

Sample = tuple[str, dict[str, bytes]]


def tar_bytes(samples: Sequence[Sample]) -> bytes:
    """A shard in the format's layout: members ordered by extension, fixed headers."""
    out = bytearray()
    for key, fields in samples:
        for ext in sorted(fields):
            data = fields[ext]
            out += ustar_header(member_name(key, ext), len(data)) + data + padding(len(data))
    return bytes(out + END_OF_ARCHIVE)


def write_dataset(
    root: Path,
    shards: Sequence[Sequence[Sample]],
    *,
    split: str = "train",
    classes: Sequence[str] = (),
) -> Path:
    """Write shards, the split index and the manifest of one split under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    entries, fields = [], set()
    for i, samples in enumerate(shards):
        data = tar_bytes(samples)
        name = shard_name(split, i)
        (root / name).write_bytes(data)
        entries.append(
            ShardEntry(url=name, nsamples=len(samples), filesize=len(data), sha256=hashlib.sha256(data).hexdigest())
        )
        for _, f in samples:
            fields.update(f)
    index = SplitIndex(split=split, shards=tuple(entries), classes=tuple(classes), fields=tuple(sorted(fields)))
    write_json_atomic(root / f"{split}.json", index.to_json())
    Manifest.load_or_empty(root).with_split(split, index).save(root)
    return root


def counting_shards(sizes: Sequence[int]) -> list[list[Sample]]:
    """Shards of the given sizes; sample ``g`` (global index) has ``cls`` = ``txt`` = ``g``."""
    shards, g = [], 0
    for s, n in enumerate(sizes):
        samples = []
        for i in range(n):
            samples.append((f"s{s:03d}_{i:05d}", {"cls": str(g).encode(), "txt": str(g).encode()}))
            g += 1
        shards.append(samples)
    return shards


def image_shards(sizes: Sequence[int], *, classes: int = 3, size: tuple[int, int] = (48, 40)) -> list[list[Sample]]:
    """Shards of small natural JPEGs; ``cls`` is the global index modulo ``classes``."""
    shards, g = [], 0
    for n in sizes:
        samples = []
        for _ in range(n):
            w, h = size if g % 2 else (size[1], size[0])
            jpg = jpeg_bytes(natural_image(w, h, seed=g), quality=85)
            samples.append((f"img{g:05d}", {"cls": str(g % classes).encode(), "jpg": jpg}))
            g += 1
        shards.append(samples)
    return shards


@pytest.fixture
def counting_dataset(tmp_path: Path) -> Callable[..., Path]:
    """``make(sizes, name="ds")`` -> the directory of a counting dataset."""

    def make(sizes: Sequence[int], *, name: str = "ds") -> Path:
        return write_dataset(tmp_path / name, counting_shards(sizes))

    return make


@pytest.fixture(scope="session")
def image_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 shards of 7, 2 and 13 small JPEGs (22 in all), 3 classes."""
    root = tmp_path_factory.mktemp("images") / "ds"
    return write_dataset(root, image_shards([7, 2, 13]), classes=("a", "b", "c"))


@pytest.fixture
def shards() -> SimpleNamespace:
    """The builders above, for tests that write their own shards."""
    return SimpleNamespace(
        tar_bytes=tar_bytes, write_dataset=write_dataset, counting=counting_shards, images=image_shards
    )
