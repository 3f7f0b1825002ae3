"""A shard's per-sample table in a binary file beside it: ``<shard>.idx``.

Large splits keep each shard's per-sample table (:mod:`shardify.sampletable`) out of the JSON
index, in a sidecar file named after the shard plus ``.idx``; the index entry records its
size and SHA-256 (``{"sidecar": {"sha256": ..., "size": ...}}``). A reader fetches the
sidecar of a shard the first time it reads from that shard, so what a rank reads grows with
the shards it touches, not with the split.

Layout, little-endian, version 2 (written): a 64-byte header (``b"SHFYIDX\\0"``, ``uint16``
version 2, ``uint16`` record size 32, ``uint32`` record count, ``uint64`` the shard's size in
bytes, the shard's 32-byte SHA-256, ``uint32`` the number of proof hashes, 4 zero bytes), then
one 32-byte record per sample: the sample's absolute byte offset in the shard (``uint64``), its
length (``uint32``), its CRC-32 (``uint32``) and its SHA-256's first 16 bytes, as in the inline
table; then the
sidecar's proof: the sibling hashes (32 bytes each) on its leaf's path in the split's hash tree
(:mod:`shardify.merkle`), whose leaf is the sidecar's bytes before the proof. A reader of the
compact index (:mod:`shardify.compactindex`) checks a sidecar against the tree's root alone
(:func:`decode_proven`) and takes the shard's size and SHA-256 from it. Version 1 (a 16-byte
header: magic, version, record size, count; no proof) is still read through the JSON index.

The offsets are redundant with the lengths (each sample starts where the one before ends,
sample 0 at byte 0) and checked to be so; they let a reader fetch a range of records of a
sidecar and know where its samples are.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardify import merkle
from shardify.errors import ManifestError, SidecarError
from shardify.jsonfiles import json_field
from shardify.sampletable import DIGEST_BYTES, RECORD_DTYPE, SampleTable

__all__ = [
    "SUFFIX",
    "HEADER",
    "HEADER_V1",
    "SIDECAR_RECORD",
    "SidecarRef",
    "SidecarProof",
    "SidecarFacts",
    "sidecar_name",
    "encode",
    "encode_v1",
    "with_proof",
    "decode",
    "decode_proven",
    "ref_of",
]

SUFFIX = ".idx"
MAGIC = b"SHFYIDX\0"
VERSION = 2
HEADER_V1 = struct.Struct("<8sHHI")
"""Version 1: magic, version, record size (bytes), record count."""
HEADER = struct.Struct("<8sHHIQ32sI4x")
"""Version 2: magic, version, record size, record count, shard size, shard SHA-256, proof hashes."""
SIDECAR_RECORD = struct.Struct(f"<QII{DIGEST_BYTES}s")
"""One sample: absolute byte offset in the shard, length, CRC-32, SHA-256 prefix."""
_RECORDS = np.dtype([("offset", "<u8"), ("size", "<u4"), ("crc", "<u4"), ("digest", f"S{DIGEST_BYTES}")])
"""The same, as NumPy reads it."""


@dataclass(frozen=True)
class SidecarRef:
    """What a split index records of a shard's sidecar: its ``size`` in bytes and SHA-256."""

    sha256: str
    size: int

    @classmethod
    def from_json(cls, obj: Any, where: str) -> SidecarRef | None:
        """The ``sidecar`` field of the index entry at ``where`` (None: absent)."""
        if obj is None:
            return None
        if not isinstance(obj, dict):
            raise ManifestError(f"{where}: field 'sidecar' should be an object, found {str(obj)[:40]!r}")
        sha = json_field(obj, "sha256", str, f"{where} sidecar")
        size = json_field(obj, "size", int, f"{where} sidecar")
        if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha) or size < 0:
            raise ManifestError(f"{where}: field 'sidecar' should hold a hex sha256 and a size, found {obj!r}")
        return cls(sha256=sha, size=size)


def sidecar_name(shard: str) -> str:
    """The sidecar of the shard ``shard`` (a name, path or URL): the same plus ``.idx``."""
    return shard + SUFFIX


@dataclass(frozen=True)
class SidecarProof:
    """How a shard's sidecar is checked without a record of its own: it is leaf ``index`` of
    the hash tree over the ``shards`` sidecars of a split, whose root is ``root``."""

    root: bytes
    index: int
    shards: int


@dataclass(frozen=True)
class SidecarFacts:
    """What a checked version-2 sidecar says of its shard: the size, the SHA-256 (hex) and the table."""

    filesize: int
    sha256: str
    table: SampleTable


def _records(table: SampleTable) -> bytes:
    """The sidecar records of ``table``: each sample's offset, then its table record."""
    given = np.frombuffer(table.raw, dtype=RECORD_DTYPE)
    out = np.empty(len(given), dtype=_RECORDS)
    out["offset"], out["size"], out["crc"], out["digest"] = table.starts(), given["size"], given["crc"], given["digest"]
    return out.tobytes()


def encode_v1(table: SampleTable) -> bytes:
    """A version-1 sidecar of ``table`` (no shard size, SHA-256 or proof), as older writers made."""
    return HEADER_V1.pack(MAGIC, 1, SIDECAR_RECORD.size, len(table)) + _records(table)


def encode(table: SampleTable, *, filesize: int, sha256: str, shards: int) -> bytes:
    """The sidecar of a shard of ``filesize`` bytes, SHA-256 ``sha256`` (hex) and per-sample table
    ``table``, in a split of ``shards`` shards, without its proof: its leaf's bytes in the tree
    (:func:`with_proof` appends the proof)."""
    head = HEADER.pack(
        MAGIC, VERSION, SIDECAR_RECORD.size, len(table), filesize, bytes.fromhex(sha256), merkle.depth(shards)
    )
    return head + _records(table)


def with_proof(body: bytes, proof: Sequence[bytes]) -> bytes:
    """The sidecar ``body`` (from :func:`encode`) with its proof appended."""
    return body + b"".join(proof)


def ref_of(data: bytes) -> SidecarRef:
    """The index's record of the sidecar ``data``."""
    return SidecarRef(sha256=hashlib.sha256(data).hexdigest(), size=len(data))


def _header(data: bytes, shard: str) -> tuple[int, int, int, str, int, int]:
    """``(version, records at, count, sha256 hex, filesize, proof hashes)`` of a sidecar's header."""
    if len(data) < HEADER_V1.size:
        raise SidecarError(f"sidecar is {len(data)} bytes, shorter than its {HEADER_V1.size}-byte header", shard=shard)
    magic, version, record, count = HEADER_V1.unpack_from(data)
    if magic != MAGIC or version not in (1, VERSION) or record != SIDECAR_RECORD.size:
        raise SidecarError(
            f"sidecar header is {magic!r} version {version} records of {record} bytes, "
            f"want {MAGIC!r} version 1 or {VERSION} records of {SIDECAR_RECORD.size}",
            shard=shard,
        )
    if version == 1:
        return 1, HEADER_V1.size, count, "", -1, 0
    if len(data) < HEADER.size:
        raise SidecarError(f"sidecar is {len(data)} bytes, shorter than its {HEADER.size}-byte header", shard=shard)
    _, _, _, count, filesize, sha, hashes = HEADER.unpack_from(data)
    return VERSION, HEADER.size, count, sha.hex(), filesize, hashes


def _table(data: memoryview, *, shard: str, nsamples: int, filesize: int) -> SampleTable:
    """The table in the records ``data``, checked to be laid end to end and to fit the shard."""
    records = np.frombuffer(data, dtype=_RECORDS)
    starts = np.zeros(len(records), dtype=np.uint64)
    np.cumsum(records["size"][:-1], dtype=np.uint64, out=starts[1:])
    wrong = np.flatnonzero(records["offset"] != starts)
    if len(wrong):
        i = int(wrong[0])
        raise SidecarError(f"sidecar says sample {i} starts at {records['offset'][i]}, want {starts[i]}", shard=shard)
    out = np.empty(len(records), dtype=RECORD_DTYPE)
    out["size"], out["crc"], out["digest"] = records["size"], records["crc"], records["digest"]
    table = SampleTable(out.tobytes())
    problem = table.problem(nsamples=nsamples, filesize=filesize)
    if problem is not None:
        raise SidecarError(f"sidecar does not fit the shard: {problem}", shard=shard)
    return table


def _sized(data: bytes, *, shard: str, at: int, count: int, hashes: int, nsamples: int) -> None:
    if count != nsamples or len(data) != at + count * SIDECAR_RECORD.size + hashes * merkle.HASH_BYTES:
        raise SidecarError(
            f"sidecar holds {len(data) - at} bytes of records and proof and says {count} records and "
            f"{hashes} hashes; the shard has {nsamples} samples of {SIDECAR_RECORD.size} bytes each",
            shard=shard,
        )


def decode(data: bytes, *, shard: str, ref: SidecarRef | None, nsamples: int, filesize: int) -> SampleTable:
    """The table in the sidecar ``data`` of ``shard``, checked against ``ref`` (when given), its
    header, and the shard's ``nsamples`` and ``filesize``; else :class:`SidecarError`."""
    if ref is not None:
        if len(data) != ref.size:
            raise SidecarError(f"sidecar is {len(data)} bytes, the index says {ref.size}", shard=shard)
        got = hashlib.sha256(data).hexdigest()
        if got != ref.sha256.lower():
            raise SidecarError(f"sidecar's sha256 is {got}, the index says {ref.sha256}", shard=shard)
    version, at, count, _, size, hashes = _header(data, shard)
    _sized(data, shard=shard, at=at, count=count, hashes=hashes, nsamples=nsamples)
    if version > 1 and size != filesize:
        raise SidecarError(f"sidecar says the shard is {size} bytes, the index says {filesize}", shard=shard)
    records = memoryview(data)[at : at + count * SIDECAR_RECORD.size]
    return _table(records, shard=shard, nsamples=nsamples, filesize=filesize)


def decode_proven(data: bytes, *, shard: str, proof: SidecarProof, nsamples: int) -> SidecarFacts:
    """The facts of the version-2 sidecar ``data`` of ``shard``, checked to be leaf
    ``proof.index`` of the tree whose root is ``proof.root`` (so written with this shard by the
    conversion that wrote the compact index) and to fit the shard's ``nsamples``; else
    :class:`SidecarError`."""
    version, at, count, sha, filesize, hashes = _header(data, shard)
    if version == 1:
        raise SidecarError("sidecar is version 1 (no proof); a compact index names version-2 sidecars", shard=shard)
    _sized(data, shard=shard, at=at, count=count, hashes=hashes, nsamples=nsamples)
    if hashes != merkle.depth(proof.shards) or not 0 <= proof.index < proof.shards:
        raise SidecarError(
            f"sidecar's proof has {hashes} hashes; shard {proof.index} of a split of {proof.shards} "
            f"needs {merkle.depth(proof.shards)}",
            shard=shard,
        )
    body = len(data) - hashes * merkle.HASH_BYTES
    view = memoryview(data)
    path = [bytes(view[k : k + merkle.HASH_BYTES]) for k in range(body, len(data), merkle.HASH_BYTES)]
    found = merkle.root_from_proof(merkle.leaf_hash(view[:body]), proof.index, path)
    if found != proof.root:
        raise SidecarError(
            f"sidecar does not belong to this split: its proof leads to root {found.hex()[:16]}..., "
            f"the compact index has {proof.root.hex()[:16]}... (another shard's, or another version's)",
            shard=shard,
        )
    table = _table(view[at:body], shard=shard, nsamples=nsamples, filesize=filesize)
    return SidecarFacts(filesize=filesize, sha256=sha, table=table)
