"""The sidecar format (:mod:`shardify.sidecar`): a shard's per-sample table in ``<shard>.idx``,
round trip, and every way a sidecar can fail to be the shard's is a SidecarError naming it."""

from __future__ import annotations

import hashlib

import pytest

from shardify.errors import ManifestError, ShardFormatError, SidecarError
from shardify.sampletable import RECORD, SampleTable, sample_digest
from shardify.sidecar import HEADER_V1, SIDECAR_RECORD, SidecarRef, decode, encode_v1, ref_of, sidecar_name
from shardify.splitindex import ShardEntry

SIZES = [1536, 2048, 1024, 3072, 1536]
TABLE = SampleTable(b"".join(RECORD.pack(n, i, sample_digest(bytes([i]))) for i, n in enumerate(SIZES)))
FILESIZE = sum(SIZES) + 1024


def _decode(data: bytes, ref: SidecarRef | None = None, nsamples: int = len(SIZES)) -> SampleTable:
    return decode(data, shard="train-000001.tar", ref=ref, nsamples=nsamples, filesize=FILESIZE)


def test_a_table_round_trips_with_absolute_offsets() -> None:
    data = encode_v1(TABLE)
    assert len(data) == HEADER_V1.size + len(SIZES) * SIDECAR_RECORD.size == ref_of(data).size
    assert _decode(data, ref_of(data)) == TABLE
    offsets = [o for o, _, _, _ in SIDECAR_RECORD.iter_unpack(data[HEADER_V1.size :])]
    assert offsets == [a for a, _, _ in TABLE.ranges()] == [0, 1536, 3584, 4608, 7680]
    assert sidecar_name("http://h/ds/train-000001.tar") == "http://h/ds/train-000001.tar.idx"


def _flip(data: bytes, at: int) -> bytes:
    out = bytearray(data)
    out[at] ^= 1
    return bytes(out)


GOOD = encode_v1(TABLE)


@pytest.mark.parametrize(
    ("data", "ref", "nsamples", "says"),
    [
        pytest.param(_flip(GOOD, 40), ref_of(GOOD), 5, "sha256", id="bytes-changed"),
        pytest.param(GOOD[:-1], ref_of(GOOD), 5, "bytes, the index says", id="truncated"),
        pytest.param(_flip(GOOD, 0), None, 5, "header", id="magic"),
        pytest.param(GOOD, None, 4, "4 samples", id="count"),
        pytest.param(_flip(GOOD, HEADER_V1.size + SIDECAR_RECORD.size), None, 5, "starts at", id="offset"),
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
    for size, _crc, digest in RECORD.iter_unpack(TABLE.raw):
        records.append((at, at + size, digest))
        at += size
    assert list(ranges) == records and len(ranges) == len(records)
    assert ranges[-1] == records[-1] and ranges[1:3] == records[1:3]
    with pytest.raises(IndexError):
        ranges[len(records)]


# -- version 2: the shard's size and SHA-256, and a proof in the split's hash tree ----------------
from shardify import merkle  # noqa: E402
from shardify.sidecar import HEADER, SidecarProof, decode_proven, encode, with_proof  # noqa: E402

SHA = hashlib.sha256(b"the shard").hexdigest()


def _split_sidecars(n: int = 5) -> tuple[list[bytes], bytes]:
    """The sidecars of ``n`` shards of one split (each with its proof) and the tree's root."""
    bodies = [encode(TABLE, filesize=FILESIZE + i, sha256=SHA, shards=n) for i in range(n)]
    tree = merkle.MerkleTree([merkle.leaf_hash(b) for b in bodies])
    return [with_proof(b, tree.proof(i)) for i, b in enumerate(bodies)], tree.root


def test_a_v2_sidecar_says_its_shard_s_size_and_sha256_and_proves_its_place() -> None:
    sidecars, root = _split_sidecars()
    for i, data in enumerate(sidecars):
        facts = decode_proven(data, shard=f"s{i}.tar", proof=SidecarProof(root, i, 5), nsamples=len(SIZES))
        assert (facts.filesize, facts.sha256, facts.table) == (FILESIZE + i, SHA, TABLE)
        assert len(data) == HEADER.size + len(SIZES) * SIDECAR_RECORD.size + merkle.depth(5) * merkle.HASH_BYTES
        # the JSON index's path reads it too, checked against the index's size
        assert decode(data, shard="s.tar", ref=ref_of(data), nsamples=len(SIZES), filesize=FILESIZE + i) == TABLE
    with pytest.raises(SidecarError, match="the index says"):
        decode(sidecars[0], shard="s.tar", ref=None, nsamples=len(SIZES), filesize=FILESIZE + 1)


@pytest.mark.parametrize(
    ("which", "proof", "nsamples", "says"),
    [
        pytest.param(1, (None, 0, 5), 5, "does not belong", id="another-shard-s"),
        pytest.param(0, (b"\0" * 32, 0, 5), 5, "does not belong", id="another-version-s"),
        pytest.param(0, (None, 0, 9), 5, "proof has", id="another-split-size"),
        pytest.param(0, (None, 5, 5), 5, "proof has", id="index-past-the-end"),
        pytest.param(0, (None, 0, 5), 4, "4 samples", id="count"),
        pytest.param("v1", (None, 0, 5), 5, "version 1", id="v1-has-no-proof"),
        pytest.param("flip", (None, 0, 5), 5, "does not belong", id="record-changed"),
    ],
)
def test_a_v2_sidecar_that_is_not_this_shard_s_is_refused_naming_it(which, proof, nsamples, says) -> None:
    sidecars, root = _split_sidecars()
    data = encode_v1(TABLE) if which == "v1" else _flip(sidecars[0], 70) if which == "flip" else sidecars[which]
    with pytest.raises(SidecarError, match=says) as e:
        decode_proven(data, shard="s0.tar", proof=SidecarProof(proof[0] or root, proof[1], proof[2]), nsamples=nsamples)
    assert e.value.shard == "s0.tar"
