"""The manifest: one top-level ``manifest.json`` and one index per split, versioned.

Each split index (:mod:`shardify.splitindex`) is a ``wids-shard-index-v1`` file that
``wids.ShardListDataset`` opens unmodified, plus a ``shardify`` section with our fields. Every
conversion of a split has a version token (format 2): its shards and its index
(``{split}-{version}.json``) carry it in their names and are never rewritten with other bytes,
so a reader that opened one version keeps reading it while the next is written.
``manifest.json`` names the current version of each split and is the only file that switches;
``{split}.json`` is a copy of the current index for wids. Everything is written through a
temporary file and :func:`os.replace`, the index before the top-level manifest, so a split
exists only once it is complete.

The manifest is what a reader trusts: it records each split index's size and SHA-256, and its
shard, sample and byte totals, and :meth:`Manifest.split_index` checks an index against them
(and its shards' names against the format's rule) before a sample is read, so an index with an
entry removed, repeated, replaced or recounted is refused, naming the split and the entry.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardify import FORMAT_VERSION
from shardify.compactindex import CompactRef
from shardify.errors import IndexMismatchError, ManifestError
from shardify.jsonfiles import (
    hex_field,
    json_bytes,
    json_field,
    load_json,
    write_json_atomic,
)
from shardify.splitindex import FORMAT_NAME, SplitIndex, check_format_version
from shardify.tarfmt import VERSION_CHARS, index_name, shard_name, shard_of_split

__all__ = [
    "MANIFEST_NAME",
    "SplitRef",
    "Manifest",
    "index_bytes",
]

MANIFEST_NAME = "manifest.json"


def index_bytes(index: SplitIndex) -> bytes:
    """The bytes of the file of ``index``, as the writer writes it and the manifest records them."""
    return json_bytes(index.to_json())


@dataclass(frozen=True)
class SplitRef:
    """The top-level manifest's entry for one split: its index file (name, size, SHA-256) and
    the totals the index must sum to."""

    index: str
    index_size: int
    """Size in bytes of the index file (:func:`index_bytes`)."""
    index_sha256: str
    """Hex SHA-256 of the index file: a reader refuses an index with other bytes."""
    samples: int
    shards: int
    bytes: int
    version: str | None = None
    """The split's current version token (format 2); None in format 1 manifests."""
    compact: CompactRef | None = None
    """The split's compact binary index (:mod:`shardify.compactindex`), which readers read
    instead of the JSON index; None: none (a split without sidecars)."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": self.index,
            "index_size": self.index_size,
            "index_sha256": self.index_sha256,
            "samples": self.samples,
            "shards": self.shards,
            "bytes": self.bytes,
        }
        if self.version is not None:
            out["version"] = self.version
        if self.compact is not None:
            out["compact"] = self.compact.to_json()
        return out

    @classmethod
    def from_json(cls, ref: Any, where: str) -> SplitRef:
        if not isinstance(ref, dict):
            raise ManifestError(f"{where}: should be an object, found {ref!r}")
        missing = [k for k in ("index_size", "index_sha256") if k not in ref]
        if missing:
            raise ManifestError(
                f"{where}: {'fields' if len(missing) > 1 else 'field'} {' and '.join(map(repr, missing))} "
                f"{'are' if len(missing) > 1 else 'is'} missing: a manifest records the size and "
                "SHA-256 of each split's index, which a reader checks the index against; convert the split "
                "again to write a manifest that has them"
            )
        sha = hex_field(ref, "index_sha256", 64, where)
        if sha is None:
            raise ManifestError(f"{where}: field 'index_sha256' should be 64 lowercase hex digits, found None")
        out = cls(
            index=json_field(ref, "index", str, where),
            index_size=json_field(ref, "index_size", int, where),
            index_sha256=sha,
            samples=json_field(ref, "samples", int, where),
            shards=json_field(ref, "shards", int, where),
            bytes=json_field(ref, "bytes", int, where),
            version=hex_field(ref, "version", VERSION_CHARS, where),
            compact=CompactRef.from_json(ref.get("compact"), where),
        )
        if min(out.index_size, out.samples, out.shards, out.bytes) < 0:
            raise ManifestError(f"{where}: a negative size or total: {ref!r}")
        return out


@dataclass(frozen=True)
class Manifest:
    """The top-level ``manifest.json``: the format, its version, and the finished splits."""

    splits: dict[str, SplitRef]
    format_version: int = FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "format_version": self.format_version,
            "splits": {k: v.to_json() for k, v in sorted(self.splits.items())},
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any], *, source: str) -> Manifest:
        fmt = obj.get("format")
        if fmt != FORMAT_NAME:
            raise ManifestError(f"{source}: field 'format' should be {FORMAT_NAME!r}, found {fmt!r}")
        version = json_field(obj, "format_version", int, source)
        check_format_version(version, source)
        raw = json_field(obj, "splits", dict, source)
        splits = {name: SplitRef.from_json(ref, f"{source} (split {name!r})") for name, ref in raw.items()}
        return cls(splits=splits, format_version=version)

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> Manifest:
        """Load ``manifest.json`` from a dataset directory."""
        path = Path(directory) / MANIFEST_NAME
        try:
            text = path.read_bytes()
        except FileNotFoundError as e:
            raise ManifestError(f"{path}: no manifest; is this a finished shardify dataset?") from e
        except OSError as e:
            raise ManifestError(f"{path}: cannot read manifest: {e}") from e
        return cls.from_json(load_json(text, source=str(path)), source=str(path))

    @classmethod
    def load_or_empty(cls, directory: str | os.PathLike[str]) -> Manifest:
        if not (Path(directory) / MANIFEST_NAME).exists():
            return cls(splits={})
        return cls.load(directory)

    def ref(self, split: str, *, source: str) -> SplitRef:
        """The entry of ``split``; ManifestError naming ``source`` and the splits there are."""
        if split not in self.splits:
            raise ManifestError(f"{source}: no split {split!r}; splits: {sorted(self.splits)}")
        return self.splits[split]

    def load_split(self, directory: str | os.PathLike[str], split: str) -> SplitIndex:
        """Load and check (:meth:`split_index`) the index of ``split`` in the folder ``directory``,
        as the manifest names it (the reader also checks where that is: :mod:`shardify.locations`)."""
        path = Path(directory) / self.ref(split, source=str(Path(directory) / MANIFEST_NAME)).index
        try:
            data = path.read_bytes()
        except OSError as e:
            raise ManifestError(f"{path}: cannot read split index: {e}") from e
        return self.split_index(split, data, source=str(path))

    def split_index(self, split: str, data: bytes, *, source: str) -> SplitIndex:
        """The index of ``split`` in ``data`` (read from ``source``), checked against the manifest
        before any sample is read: its split, version, shards (named by the format's rule, in
        order), totals, size and SHA-256. A mismatch is :class:`IndexMismatchError` naming the
        split and the first entry that disagrees."""
        ref = self.ref(split, source=source)
        found = (len(data), hashlib.sha256(data).hexdigest())
        same = found == (ref.index_size, ref.index_sha256)
        try:
            index = SplitIndex.from_json(load_json(data, source=source), source=source)
        except ManifestError as e:
            if same:
                raise
            raise IndexMismatchError(f"{_not_recorded(split, found, ref, source)}: {e}", split=split) from e
        self.check_index(split, index, source=source)
        self.check_entries(split, index, source=source)
        if not same:
            raise IndexMismatchError(
                f"{_not_recorded(split, found, ref, source)}; its shards, counts and totals agree with the "
                "manifest, so another field was changed",
                split=split,
            )
        return index

    def check_index(self, split: str, index: SplitIndex, *, source: str) -> None:
        """Raise ManifestError unless ``index`` is of the split and version the manifest lists for ``split``."""
        ref = self.splits[split]
        if index.split != split:
            raise ManifestError(f"{source}: field 'split' is {index.split!r}, the manifest lists it as {split!r}")
        if index.version != ref.version:
            raise ManifestError(
                f"{source}: field 'version' is {index.version!r}, the manifest lists "
                f"version {ref.version!r} for split {split!r}"
            )

    def check_entries(self, split: str, index: SplitIndex, *, source: str) -> None:
        """Raise :class:`IndexMismatchError` unless shard ``i`` of ``index`` is named
        ``shard_name(split, i, version)`` and the shard, sample and byte totals are the manifest's."""
        ref = self.splits[split]
        for i, entry in enumerate(index.shards):
            want = shard_name(split, i, ref.version)
            if entry.url != want:
                other = shard_of_split(entry.url, split)
                whose = f" (shard {other[1]}'s name)" if other is not None and other[0] == ref.version else ""
                raise IndexMismatchError(
                    f"{source}: split {split!r}: entry {i} of the index names {entry.url!r}{whose}; shard {i} "
                    f"is {want!r} (an entry removed, repeated or replaced?)",
                    split=split,
                    entry=i,
                )
        if len(index.shards) != ref.shards:
            i = min(len(index.shards), ref.shards)
            raise IndexMismatchError(
                f"{source}: split {split!r}: the index lists {len(index.shards)} shards, the manifest "
                f"{ref.shards}: shard {i} ({shard_name(split, i, ref.version)}) is "
                f"{'missing from' if len(index.shards) < ref.shards else 'extra in'} the index",
                split=split,
                entry=i,
            )
        totals = (("samples", index.num_samples, ref.samples), ("bytes", index.num_bytes, ref.bytes))
        for what, have, recorded in totals:
            if have != recorded:
                raise IndexMismatchError(
                    f"{source}: split {split!r}: the index's shards hold {have:,} {what}, the manifest "
                    f"records {recorded:,} (a shard's count or size changed)",
                    split=split,
                )

    def with_split(self, split: str, index: SplitIndex, compact: CompactRef | None = None) -> Manifest:
        """The manifest with ``split`` switched to ``index`` (its versioned index file, whose bytes
        are :func:`index_bytes`) and its ``compact`` index, if it has one."""
        data = index_bytes(index)
        ref = SplitRef(
            index=index_name(split, index.version),
            index_size=len(data),
            index_sha256=hashlib.sha256(data).hexdigest(),
            samples=index.num_samples,
            shards=len(index.shards),
            bytes=index.num_bytes,
            version=index.version,
            compact=compact,
        )
        return Manifest(splits={**self.splits, split: ref}, format_version=FORMAT_VERSION)

    def without_split(self, split: str) -> Manifest:
        return Manifest(splits={k: v for k, v in self.splits.items() if k != split}, format_version=self.format_version)

    def save(self, directory: str | os.PathLike[str]) -> None:
        write_json_atomic(Path(directory) / MANIFEST_NAME, self.to_json())


def _not_recorded(split: str, found: tuple[int, str], ref: SplitRef, source: str) -> str:
    return (
        f"{source}: split {split!r}: the index is {found[0]:,} bytes with SHA-256 {found[1][:16]}..., "
        f"the manifest records {ref.index_size:,} bytes with SHA-256 {ref.index_sha256[:16]}...: "
        "it was changed after the manifest was written"
    )
