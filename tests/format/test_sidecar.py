"""The sidecar format (:mod:`shardify.sidecar`): a shard's per-sample table in ``<shard>.idx``,
round trip, and every way a sidecar can fail to be the shard's is a SidecarError naming it."""

from __future__ import annotations

import hashlib

import pytest

from shardify.errors import ManifestError, ShardFormatError, SidecarError
from shardify.manifest import ShardEntry
from shardify.sampletable import RECORD, SampleTable
from shardify.sidecar import HEADER, SIDECAR_RECORD, SidecarRef, decode, encode, ref_of, sidecar_name

SIZES = [1536, 2048, 1024, 3072, 1536]
TABLE = SampleTable(b"".join(RECORD.pack(n, hashlib.sha256(bytes([i])).digest()[:16]) for i, n in enumerate(SIZES)))
FILESIZE = sum(SIZES) + 1024


def _decode(data: bytes, ref: SidecarRef | None = None, nsamples: int = len(SIZES)) -> SampleTable:
    return decode(data, shard="train-000001.tar", ref=ref, nsamples=nsamples, filesize=FILESIZE)


def test_a_table_round_trips_with_absolute_offsets() -> None:
    data = encode(TABLE)
    assert len(data) == HEADER.size + len(SIZES) * SIDECAR_RECORD.size == ref_of(data).size
    assert _decode(data, ref_of(data)) == TABLE
    offsets = [o for o, _, _ in SIDECAR_RECORD.iter_unpack(data[HEADER.size :])]
    assert offsets == [a for a, _, _ in TABLE.ranges()] == [0, 1536, 3584, 4608, 7680]
    assert sidecar_name("http://h/ds/train-000001.tar") == "http://h/ds/train-000001.tar.idx"


def _flip(data: bytes, at: int) -> bytes:
    out = bytearray(data)
    out[at] ^= 1
    return bytes(out)


GOOD = encode(TABLE)


@pytest.mark.parametrize(
    ("data", "ref", "nsamples", "says"),
    [
        pytest.param(_flip(GOOD, 40), ref_of(GOOD), 5, "sha256", id="bytes-changed"),
        pytest.param(GOOD[:-1], ref_of(GOOD), 5, "bytes, the index says", id="truncated"),
        pytest.param(_flip(GOOD, 0), None, 5, "header", id="magic"),
        pytest.param(GOOD, None, 4, "4 samples", id="count"),
        pytest.param(_flip(GOOD, HEADER.size + SIDECAR_RECORD.size), None, 5, "starts at", id="offset"),
        pytest.param(GOOD[:10], None, 5, "shorter than its", id="no-header"),
    ],
)
def test_a_sidecar_that_is_not_the_shard_s_is_refused_naming_it(data, ref, nsamples, says) -> None:
    with pytest.raises(SidecarError, match=says) as e:
        _decode(data, ref, nsamples)
    assert isinstance(e.value, ShardFormatError) and e.value.shard == "train-000001.tar"


def test_a_sidecar_past_the_shard_s_end_is_refused() -> None:
    with pytest.raises(SidecarError, match="past the shard"):
        decode(GOOD, shard="s.tar", ref=None, nsamples=5, filesize=FILESIZE - 2048)


def test_an_index_entry_carries_its_sidecar_ref_and_refuses_both_tables() -> None:
    ref = ref_of(GOOD)
    entry = ShardEntry(url="s.tar", nsamples=5, filesize=FILESIZE, sha256="", sidecar=ref)
    obj = entry.to_json()
    assert obj["sidecar"] == {"sha256": ref.sha256, "size": ref.size} and "samples" not in obj
    assert ShardEntry.from_json(obj, source="i.json") == entry
    with pytest.raises(ManifestError, match="sidecar"):
        ShardEntry.from_json({**obj, "sidecar": {"sha256": "xyz", "size": 3}}, source="i.json")
    both = {**obj, **ShardEntry(url="s.tar", nsamples=5, filesize=FILESIZE, sha256="", samples=TABLE.raw).to_json()}
    with pytest.raises(ManifestError, match="sidecar"):
        ShardEntry.from_json(both, source="i.json")


def test_a_tables_ranges_are_its_records_laid_end_to_end_by_index_slice_and_iteration() -> None:
    ranges = TABLE.ranges()
    records, at = [], 0
    for size, digest in RECORD.iter_unpack(TABLE.raw):
        records.append((at, at + size, digest))
        at += size
    assert list(ranges) == records and len(ranges) == len(records)
    assert ranges[-1] == records[-1] and ranges[1:3] == records[1:3]
    with pytest.raises(IndexError):
        ranges[len(records)]
