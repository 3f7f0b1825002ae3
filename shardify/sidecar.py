"""A shard's per-sample table in a binary file beside it: ``<shard>.idx``.

Large splits keep each shard's per-sample table (:mod:`shardify.sampletable`) out of the JSON
index, in a sidecar file named after the shard plus ``.idx``; the index entry records its
size and SHA-256 (``{"sidecar": {"sha256": ..., "size": ...}}``). A reader fetches the
sidecar of a shard the first time it reads from that shard, so what a rank reads grows with
the shards it touches, not with the split.

Layout, little-endian: a 16-byte header (``b"SHFYIDX\\0"``, ``uint16`` version 1, ``uint16``
record size 28, ``uint32`` record count), then one 28-byte record per sample: the sample's
absolute byte offset in the shard (``uint64``), its length (``uint32``) and the first 16
bytes of its SHA-256, as in the inline table. The offsets are redundant with the lengths
(each sample starts where the one before ends, sample 0 at byte 0) and checked to be so;
they let a reader fetch a range of records of a sidecar and know where its samples are.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Any

from shardify.errors import ManifestError, SidecarError
from shardify.jsonfiles import json_field
from shardify.sampletable import DIGEST_BYTES, RECORD, SampleTable

__all__ = ["SUFFIX", "HEADER", "SIDECAR_RECORD", "SidecarRef", "sidecar_name", "encode", "decode", "ref_of"]

SUFFIX = ".idx"
MAGIC = b"SHFYIDX\0"
VERSION = 1
HEADER = struct.Struct("<8sHHI")
"""magic, version, record size (bytes), record count."""
SIDECAR_RECORD = struct.Struct(f"<QI{DIGEST_BYTES}s")
"""One sample: absolute byte offset in the shard, length, the first bytes of its SHA-256."""


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


def encode(table: SampleTable) -> bytes:
    """The sidecar of a shard whose inline table is ``table``."""
    out = bytearray(HEADER.pack(MAGIC, VERSION, SIDECAR_RECORD.size, len(table)))
    at = 0
    for size, digest in table.records():
        out += SIDECAR_RECORD.pack(at, size, digest)
        at += size
    return bytes(out)


def ref_of(data: bytes) -> SidecarRef:
    """The index's record of the sidecar ``data``."""
    return SidecarRef(sha256=hashlib.sha256(data).hexdigest(), size=len(data))


def decode(data: bytes, *, shard: str, ref: SidecarRef | None, nsamples: int, filesize: int) -> SampleTable:
    """The table in the sidecar ``data`` of ``shard``, checked against ``ref`` (when given), its
    header, and the shard's ``nsamples`` and ``filesize``; else :class:`SidecarError`."""
    if ref is not None:
        if len(data) != ref.size:
            raise SidecarError(f"sidecar is {len(data)} bytes, the index says {ref.size}", shard=shard)
        got = hashlib.sha256(data).hexdigest()
        if got != ref.sha256.lower():
            raise SidecarError(f"sidecar's sha256 is {got}, the index says {ref.sha256}", shard=shard)
    if len(data) < HEADER.size:
        raise SidecarError(f"sidecar is {len(data)} bytes, shorter than its {HEADER.size}-byte header", shard=shard)
    magic, version, record, count = HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION or record != SIDECAR_RECORD.size:
        raise SidecarError(
            f"sidecar header is {magic!r} version {version} records of {record} bytes, "
            f"want {MAGIC!r} version {VERSION} records of {SIDECAR_RECORD.size}",
            shard=shard,
        )
    if count != nsamples or len(data) != HEADER.size + count * record:
        raise SidecarError(
            f"sidecar holds {len(data) - HEADER.size} bytes of records and says {count}; "
            f"the shard has {nsamples} samples of {record} bytes each",
            shard=shard,
        )
    raw, at = bytearray(), 0
    for offset, size, digest in SIDECAR_RECORD.iter_unpack(memoryview(data)[HEADER.size :]):
        if offset != at:
            raise SidecarError(
                f"sidecar says sample {len(raw) // RECORD.size} starts at {offset}, want {at}", shard=shard
            )
        raw += RECORD.pack(size, digest)
        at += size
    table = SampleTable(bytes(raw))
    problem = table.problem(nsamples=nsamples, filesize=filesize)
    if problem is not None:
        raise SidecarError(f"sidecar does not fit the shard: {problem}", shard=shard)
    return table
