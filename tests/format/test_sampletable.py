"""The per-sample table: 24-byte records of each sample's length, CRC-32 and SHA-256 prefix,
built from the bytes a writer writes, read back as ranges with their checksums."""

from __future__ import annotations

import hashlib
import os
import zlib

import pytest

from shardify.sampletable import DIGEST_BYTES, RECORD, SampleTable, TableBuilder, sample_digest


def test_the_table_holds_each_sample_s_length_crc32_and_sha256_whatever_the_writes() -> None:
    samples = [os.urandom(n) for n in (1024, 1536, 512, 4096)]
    data = b"".join(samples)
    builder = TableBuilder()
    at = 0
    for s in samples:  # where each starts, marked ahead of the bytes
        builder.mark(at)
        at += len(s)
    for k in range(0, len(data), 700):  # writes that do not line up with the samples
        builder.feed(data[k : k + 700])
    builder.mark(at)  # where the last ends, once written
    table = SampleTable(builder.table(len(samples)))
    assert RECORD.size == 24 and DIGEST_BYTES == 16 and len(table.raw) == 24 * len(samples)
    assert list(table.records()) == [(len(s), zlib.crc32(s), hashlib.sha256(s).digest()[:16]) for s in samples]
    ranges = table.ranges()
    assert [ranges[i] for i in range(len(samples))] == [
        (a, a + len(s), sample_digest(s)) for a, s in zip([0, 1024, 2560, 3072], samples)
    ]
    assert list(ranges.ends) == [0, 1024, 2560, 3072, 7168]
    assert list(ranges.crcs) == [zlib.crc32(s) for s in samples]  # what a reader compares, as ints


@pytest.mark.parametrize("n", [0, 1, 2047, 2048, 4093, 4094, 4095, 5120, 65535, 65536, 65537, 300_000])
def test_sample_digest_is_the_sha256_prefix_whatever_the_size(n: int) -> None:
    """Small samples are hashed in pieces (keeping the interpreter lock): the same digest."""
    data = os.urandom(n)
    want = hashlib.sha256(data).digest()[:16]
    assert sample_digest(data) == want == sample_digest(memoryview(data))
    assert sample_digest(memoryview(b"x" + data)[1:]) == want


@pytest.mark.parametrize("n", [2048, 3000, 4093, 5120, 65536])
def test_a_small_sample_is_never_handed_to_hashlib_whole_enough_to_let_go_of_the_lock(
    n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hashlib releases the interpreter lock for 2,048 bytes or more at once: a sample up to
    64 KiB reaches it in pieces below that, so a fetch thread checking it keeps the lock."""
    from shardify import sampletable

    fed: list[int] = []
    real = hashlib.sha256

    class Recording:
        def __init__(self, data: memoryview) -> None:
            self._h = real(data)
            fed.append(len(data))

        def update(self, data: memoryview) -> None:
            self._h.update(data)
            fed.append(len(data))

        def digest(self) -> bytes:
            return self._h.digest()

    monkeypatch.setattr(sampletable.hashlib, "sha256", Recording)
    data = os.urandom(n)
    assert sample_digest(data) == hashlib.new("sha256", data).digest()[:DIGEST_BYTES]
    assert sum(fed) == n and max(fed) < 2048
