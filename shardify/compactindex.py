"""A split's compact binary index, ``{split}-{version}.cidx``: what a reader needs up front, and no more.

A split with sidecars (:mod:`shardify.sidecar`) gets, beside its JSON index (kept for wids and
webdataset), a compact index that readers read instead: the split's fields, one ``uint32`` sample
count per shard, and the root of the hash tree over the shards' sidecars (:mod:`shardify.merkle`).
It names no shard: shard ``i`` is :func:`shardify.tarfmt.shard_name` ``(split, i, version)``, in
the index's folder. Everything else a reader knows of a shard (its size, its SHA-256, where each
sample is and what it hashes to) comes from that shard's sidecar, checked against the root the
first time the shard is read. At 1 B samples in 436,110 shards it is 1.7 MB where the JSON
index is 522 MB, and a rank reads the sidecars of the shards it touches only.

Layout, little-endian: a 64-byte header (``b"SHFYCIDX"``, ``uint16`` version 1, ``uint16`` 0,
``uint32`` length of the fields, ``uint64`` shards, ``uint64`` samples, the tree's 32-byte root),
then the fields as UTF-8 JSON (the JSON index's ``shardify`` section without per-shard data), then
the counts. The manifest records the file's size and SHA-256 (:class:`CompactRef`), so a reader
checks it whole before it trusts a byte of it.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from shardify.errors import IndexMismatchError, ManifestError
from shardify.jsonfiles import hex_field, json_field

__all__ = ["SUFFIX", "HEADER", "CompactRef", "CompactIndex", "compact_name", "encode", "decode"]

SUFFIX = ".cidx"
MAGIC = b"SHFYCIDX"
VERSION = 1
HEADER = struct.Struct("<8sHHIQQ32s")
"""magic, version, 0, length of the fields (bytes), shards, samples, the sidecars' tree root."""


def compact_name(split: str, version: str) -> str:
    """File name of a split version's compact index, beside its JSON index."""
    return f"{split}-{version}{SUFFIX}"


@dataclass(frozen=True)
class CompactRef:
    """The manifest's record of a split's compact index: its file name, size and SHA-256."""

    index: str
    size: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "size": self.size, "sha256": self.sha256}

    @classmethod
    def from_json(cls, obj: Any, where: str) -> CompactRef | None:
        if obj is None:
            return None
        if not isinstance(obj, dict):
            raise ManifestError(f"{where}: field 'compact' should be an object, found {str(obj)[:40]!r}")
        ref = cls(
            index=json_field(obj, "index", str, f"{where} compact"),
            size=json_field(obj, "size", int, f"{where} compact"),
            sha256=json_field(obj, "sha256", str, f"{where} compact"),
        )
        hex_field(obj, "sha256", 64, f"{where} compact")
        if ref.size < HEADER.size:
            raise ManifestError(f"{where}: field 'compact' says {ref.size} bytes, less than a compact index's header")
        if "/" in ref.index or "\\" in ref.index or not ref.index.endswith(SUFFIX):
            raise ManifestError(f"{where}: field 'compact' names {ref.index!r}, not a {SUFFIX} file beside it")
        return ref


@dataclass(frozen=True, eq=False)
class CompactIndex:
    """A decoded compact index: the split's ``fields`` (as in the JSON index's ``shardify``
    section), each shard's sample ``counts`` and the sidecars' tree ``root``."""

    fields: dict[str, Any]
    counts: npt.NDArray[np.uint32]
    root: bytes

    @property
    def shards(self) -> int:
        return len(self.counts)

    @property
    def num_samples(self) -> int:
        return int(self.counts.sum(dtype=np.uint64))


def encode(fields: dict[str, Any], counts: npt.ArrayLike, root: bytes) -> bytes:
    """The compact index of a split with ``fields``, shard sample ``counts`` and tree ``root``."""
    meta = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    arr = np.asarray(counts, dtype="<u4")
    head = HEADER.pack(MAGIC, VERSION, 0, len(meta), len(arr), int(arr.sum(dtype=np.uint64)), root)
    return head + meta + arr.tobytes()


def decode(data: bytes, *, source: str, sha256: str | None = None, split: str | None = None) -> CompactIndex:
    """The compact index in ``data`` (read from ``source``), checked against the manifest's
    ``sha256`` when given (else :class:`IndexMismatchError` naming ``split``), then its header and
    length; else :class:`ManifestError` naming ``source``."""
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise IndexMismatchError(
            f"{source}: {f'split {split!r}: ' if split else ''}the compact index's sha256 is not the one the "
            "manifest records: it was changed after the manifest was written",
            split=split,
        )
    if len(data) < HEADER.size:
        raise ManifestError(f"{source}: {len(data)} bytes, shorter than a compact index's {HEADER.size}-byte header")
    magic, version, _, meta_len, shards, samples, root = HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise ManifestError(f"{source}: not a compact index of version {VERSION} (header {magic!r}, version {version})")
    if len(data) != HEADER.size + meta_len + 4 * shards or shards < 1:
        raise ManifestError(
            f"{source}: {len(data)} bytes; its header says {meta_len} bytes of fields and {shards} shards "
            f"({HEADER.size + meta_len + 4 * shards} bytes)"
        )
    try:
        fields = json.loads(data[HEADER.size : HEADER.size + meta_len])
    except (UnicodeDecodeError, ValueError) as e:
        raise ManifestError(f"{source}: the compact index's fields are not JSON: {e}") from e
    if not isinstance(fields, dict):
        raise ManifestError(f"{source}: the compact index's fields should be an object")
    counts = np.frombuffer(data, dtype="<u4", offset=HEADER.size + meta_len).astype(np.uint32)
    if int(counts.sum(dtype=np.uint64)) != samples:
        raise ManifestError(f"{source}: the shards' counts sum to {int(counts.sum())}, the header says {samples}")
    return CompactIndex(fields=fields, counts=counts, root=root)
