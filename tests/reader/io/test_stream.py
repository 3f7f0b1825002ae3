"""Ranged shard reads: seeking (tar), reading forward (gzip), damaged shards."""

from __future__ import annotations

import gzip
import io
import random
import zlib

import pytest

from shardify.errors import ShardFormatError
from shardify.reader import ShardedDataset
from shardify.reader.io.stream import Lost, ShardReader
from shardify.tario import iter_members


def keys(items) -> list[str | None]:
    return [None if isinstance(x, Lost) else x["__key__"] for x in items]


@pytest.fixture
def shard(tmp_path, shards):
    """One plain and one gzip copy of a 20-sample shard."""
    data = shards.tar_bytes(shards.counting([20])[0])
    plain, packed = tmp_path / "a.tar", tmp_path / "a.tgz"
    plain.write_bytes(data)
    packed.write_bytes(gzip.compress(data, mtime=0))
    return {"tar": str(plain), "tgz": str(packed), "bytes": data}


@pytest.mark.parametrize("kind", ["tar", "tgz"])
def test_random_ranges_give_the_right_samples(shard, kind):
    reader = ShardReader([shard[kind]], [20], skip_damaged=False)
    rng = random.Random(0)
    for _ in range(40):
        a = rng.randrange(20)
        b = rng.randrange(a, 21)
        assert keys(reader.read(0, a, b)) == [f"s000_{i:05d}" for i in range(a, b)]
    reader.close()


def test_a_range_reads_only_its_bytes(shard, tmp_path):
    reader = ShardReader([shard["tar"]], [20], skip_damaged=False)
    got = list(reader.read(0, 3, 5))
    assert [x["cls"] for x in got] == [b"3", b"4"]
    end = got[1]["__offset__"] + 2 * 512 * 2  # where sample 5 starts
    assert reader._files._file is not None and got[1]["__offset__"] < reader._files._file[1].tell() <= end


def truncated(tmp_path, data: bytes, at: int, name: str = "t.tar") -> str:
    path = tmp_path / name
    path.write_bytes(data[:at])
    return str(path)


@pytest.mark.parametrize("kind", ["tar", "tgz"])
def test_truncated_shard_raises_naming_it_or_keeps_what_precedes(shard, tmp_path, kind):
    cut = 11 * 4 * 512 + 700  # inside sample 11 (each sample: 2 members of 1 block + header)
    data = shard["bytes"][:cut]
    url = truncated(tmp_path, gzip.compress(data, mtime=0) if kind == "tgz" else data, len(data) * 2, name=f"t.{kind}")
    with pytest.raises(ShardFormatError, match=f"shard {url}"):
        list(ShardReader([url], [20], skip_damaged=False).read(0, 0, 20))
    items = list(ShardReader([url], [20], skip_damaged=True).read(0, 0, 20))
    # the damage is in sample 11's first member: sample 10, read in full before it, is kept
    assert keys(items) == [f"s000_{i:05d}" for i in range(11)] + [None] * 9
    assert all(url in x.reason for x in items[11:])
    later = list(ShardReader([url], [20], skip_damaged=True).read(0, 15, 17))
    assert keys(later) == [None, None]


def test_garbage_and_missing_shards(tmp_path):
    garbage = tmp_path / "g.tar"
    garbage.write_bytes(random.Random(0).randbytes(5000))
    missing = str(tmp_path / "missing.tar")
    reader = ShardReader([str(garbage), missing], [3, 2], skip_damaged=True)
    assert keys(reader.read(0, 0, 3)) == [None] * 3
    assert keys(reader.read(1, 0, 2)) == [None] * 2
    with pytest.raises(ShardFormatError, match="g.tar"):
        list(ShardReader([str(garbage)], [3], skip_damaged=False).read(0, 1, 2))
    with pytest.raises(ShardFormatError, match="missing.tar"):
        list(ShardReader([missing], [3], skip_damaged=False).read(0, 0, 1))


def test_fewer_samples_than_the_manifest_says(shard):
    with pytest.raises(ShardFormatError, match="holds 20 samples, the source says 25"):
        list(ShardReader([shard["tar"]], [25], skip_damaged=False).read(0, 0, 1))
    items = list(ShardReader([shard["tar"]], [25], skip_damaged=True).read(0, 18, 25))
    assert keys(items) == ["s000_00018", "s000_00019"] + [None] * 5


@pytest.mark.parametrize("skip", [False, True])
def test_a_shard_cut_short_after_its_scan_names_the_sample(shard, skip):
    """Fields are read where the scan found them; a file that shrank since is damage, not garbage."""
    reader = ShardReader([shard["tar"]], [20], skip_damaged=skip)
    assert keys(reader.read(0, 0, 2)) == ["s000_00000", "s000_00001"]  # scanned now
    with open(shard["tar"], "r+b") as f:
        f.truncate(len(shard["bytes"]) // 2)
    if not skip:
        with pytest.raises(ShardFormatError, match="truncated") as e:
            list(reader.read(0, 8, 20))
        assert shard["tar"] in str(e.value) and "s000_000" in str(e.value)
        return
    got = list(reader.read(0, 8, 20))
    assert len(got) == 12 and keys(got)[0] == "s000_00008" and isinstance(got[-1], Lost)
    assert "truncated" in got[-1].reason


def flipped_silently(data: bytes) -> bytes:
    """``gzip.compress(data)`` with one byte of its deflate stream changed such that it still
    inflates without error, to a well-formed tar with other member data: only the CRC-32 in
    the gzip trailer tells."""
    packed = gzip.compress(data, mtime=0)
    for pos in range(len(packed) // 2, len(packed) - 8):
        for bit in (1, 2, 4, 8, 16, 32, 64, 128):
            bad = bytearray(packed)
            bad[pos] ^= bit
            inflate = zlib.decompressobj(-zlib.MAX_WBITS)
            try:
                out = inflate.decompress(bytes(bad[10:-8]))
                if not inflate.eof or inflate.unused_data or len(out) != len(data) or out == data:
                    continue
                list(iter_members(io.BytesIO(out), shard="-"))  # the tar inside is well formed
            except (zlib.error, ShardFormatError):
                continue
            return bytes(bad)
    raise AssertionError("no silent flip found")


def test_a_gzip_shard_with_a_bad_crc_is_damage(shard, tmp_path):
    """A byte flipped in the deflate data that still inflates (6 of 6 samples read, pixels
    changed, before): the CRC in the gzip trailer is checked once the archive ends."""
    url = str(tmp_path / "flipped.tgz")
    (tmp_path / "flipped.tgz").write_bytes(flipped_silently(shard["bytes"]))
    with pytest.raises(ShardFormatError, match=f"shard {url}: corrupt compressed data.*CRC check failed"):
        list(ShardReader([url], [20], skip_damaged=False).read(0, 0, 20))
    items = list(ShardReader([url], [20], skip_damaged=True).read(0, 0, 20))
    assert keys(items)[-1] is None and "CRC check failed" in items[-1].reason
    with pytest.raises(ShardFormatError, match=f"shard {url}: .*CRC check failed"):  # a list is counted first
        ShardedDataset([url], batch_size=4, fields=("cls",))


def test_a_zero_byte_tar_in_a_shard_list_is_an_error(shard, tmp_path):
    empty = tmp_path / "empty.tar"
    empty.write_bytes(b"")
    with pytest.raises(ShardFormatError, match=f"shard {empty}: empty file"):
        ShardedDataset([shard["tar"], str(empty)], batch_size=4, fields=("cls",))
    with pytest.raises(ShardFormatError, match=f"shard {empty}: empty file"):
        list(ShardReader([str(empty)], [1], skip_damaged=False).read(0, 0, 1))


@pytest.mark.parametrize("kind", ["tar", "tgz"])
def test_only_the_selected_fields_are_read(shard, kind):
    reader = ShardReader([shard[kind]], [20], skip_damaged=False, fields={"cls"})
    got = list(reader.read(0, 5, 8))
    assert [sorted(x) for x in got] == [["__key__", "__offset__", "__shard__", "cls"]] * 3
    assert [x["cls"] for x in got] == [b"5", b"6", b"7"]
