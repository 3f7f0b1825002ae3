"""A key index file written in bounded memory (write_key_file): byte for byte the file of the
in-memory build, whatever the number of buckets, repeated keys in stored order, its memory
bounded by a bucket rather than the split, and no file left when it fails."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from shardify.reader.io.keyindex import build_key_index, load_key_index, write_key_file, write_key_index


def _keys(n: int) -> list[str]:
    return [f"{i % 101}/sample-{i:07d}" if i % 7 else "repeated" for i in range(n)]


@pytest.mark.parametrize("n", [0, 1, 2, 1000])
@pytest.mark.parametrize("bucket_bytes, block", [(64 << 20, 1 << 20), (4096, 3), (16, 1), (1 << 12, 1000)])
def test_the_file_is_the_in_memory_builds(tmp_path: Path, n: int, bucket_bytes: int, block: int) -> None:
    keys = _keys(n)
    write_key_index(build_key_index(keys), tmp_path / "memory.keys")
    write_key_file(iter(keys), tmp_path / "disk.keys", nsamples=n, bucket_bytes=bucket_bytes, block=block)
    assert (tmp_path / "disk.keys").read_bytes() == (tmp_path / "memory.keys").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["disk.keys", "memory.keys"], "no temporary left"
    index = load_key_index(tmp_path / "disk.keys", nsamples=n)
    if n:
        assert index.candidates("repeated") == list(range(0, n, 7)), "a repeated key: every index, in order"
        assert index.candidates(keys[-1]) == ([n - 1] if keys[-1] != "repeated" else list(range(0, n, 7)))
        assert index.candidates("absent") == []


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_is_bounded_by_a_bucket_not_by_the_split(tmp_path: Path) -> None:
    n = 200_000  # 3.2 MB of (hash, index) records
    keys = _keys(n)
    disk = _peak(lambda: write_key_file(iter(keys), tmp_path / "k", nsamples=n, bucket_bytes=64 << 10, block=4096))
    memory = _peak(lambda: write_key_index(build_key_index(keys), tmp_path / "m"))
    assert memory > 3 * 16 * n // 2, "the in-memory build holds the whole split"
    assert disk < 2 << 20 and disk * 3 < memory, f"peak {disk} bytes against {memory} in memory"
    assert (tmp_path / "k").read_bytes() == (tmp_path / "m").read_bytes()


def test_a_wrong_count_is_an_error_and_leaves_no_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="3 keys for a split of 4"):
        write_key_file(iter(["a", "b", "c"]), tmp_path / "k", nsamples=4)

    def failing():
        yield "a"
        raise OSError("the shard went away")

    with pytest.raises(OSError, match="went away"):
        write_key_file(failing(), tmp_path / "k", nsamples=2, bucket_bytes=16)
    assert list(tmp_path.iterdir()) == []
    assert np.array_equal(build_key_index([]).hashes, np.zeros(0, "<u8"))
