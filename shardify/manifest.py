"""The manifest: one top-level ``manifest.json`` and one index per split, versioned.

Each split index is a ``wids-shard-index-v1`` file that ``wids.ShardListDataset`` opens
unmodified, plus a ``shardify`` section with our fields. Every conversion of a split has a
version token (format 2): its shards and its index (``{split}-{version}.json``) carry it in
their names and are never rewritten with other bytes, so a reader that opened one version
keeps reading it while the next is written. ``manifest.json`` names the current version of
each split and is the only file that switches; ``{split}.json`` is a copy of the current
index for wids. Everything is written through a temporary file and :func:`os.replace`, the
index before the top-level manifest, so a split exists only once it is complete.
"""

from __future__ import annotations

import base64
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardify import CHUNKED_FORMAT_VERSION, FORMAT_VERSION
from shardify.compactindex import CompactRef
from shardify.errors import ManifestError
from shardify.jsonfiles import (
    file_sha256,
    hex_field,
    json_bytes,
    json_field,
    load_json,
    write_bytes_atomic,
    write_json_atomic,
)
from shardify.pixels import RawPixels
from shardify.sampletable import SampleTable, table_from_json
from shardify.sidecar import SidecarRef
from shardify.tarfmt import OFFSET_STRIDE, VERSION_CHARS, index_name, is_temp_name, report_name

__all__ = [
    "MANIFEST_NAME",
    "ShardEntry",
    "SplitIndex",
    "RawPixels",
    "SplitRef",
    "Manifest",
    "index_name",
    "report_name",
    "is_temp_name",
    "write_json_atomic",
    "write_bytes_atomic",
    "json_bytes",
    "file_sha256",
    "load_json",
]

MANIFEST_NAME = "manifest.json"
WIDS_KIND = "wids-shard-index-v1"
FORMAT_NAME = "shardify"


READ_VERSION = max(FORMAT_VERSION, CHUNKED_FORMAT_VERSION)
"""Newest format version this shardify reads (3: chunked splits)."""


def _check_version(version: int, source: str) -> None:
    if version < 1 or version > READ_VERSION:
        raise ManifestError(f"{source}: field 'format_version' is {version}, this shardify reads 1..{READ_VERSION}")


@dataclass(frozen=True)
class ShardEntry:
    """One shard of a split: its URL relative to the dataset directory, size and checksum."""

    url: str
    nsamples: int
    filesize: int
    sha256: str
    offsets: tuple[int, ...] = ()
    """Byte offset of the first header of samples 0, OFFSET_STRIDE, 2 * OFFSET_STRIDE, ...
    (empty: not recorded, as in indexes written before it was; readers then scan)."""
    samples: bytes = b""
    """The per-sample table (:mod:`shardify.sampletable`: each sample's length and digest),
    ``samples`` in the JSON as base64; empty: not recorded (older indexes, chunked splits, a sidecar)."""
    sidecar: SidecarRef | None = None
    """Size and SHA-256 of the table's sidecar ``<url>.idx`` (:mod:`shardify.sidecar`); None: none."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "url": self.url,
            "nsamples": self.nsamples,
            "filesize": self.filesize,
            "sha256": self.sha256,
        }
        if self.offsets:
            out["offsets"] = list(self.offsets)
        if self.samples:
            out["samples"] = base64.b64encode(self.samples).decode("ascii")
        if self.sidecar is not None:
            out["sidecar"] = {"sha256": self.sidecar.sha256, "size": self.sidecar.size}
        return out

    @classmethod
    def from_json(cls, obj: Any, *, source: str, chunk: int | None = None) -> ShardEntry:
        """``chunk``: the split's samples per chunk; its ``offsets`` are then those of chunks
        0, OFFSET_STRIDE, ... (``ceil(nsamples / chunk)`` chunks)."""
        if not isinstance(obj, dict):
            raise ManifestError(f"{source}: shardlist entry should be an object, found {obj!r}")
        url = json_field(obj, "url", str, source)
        where = f"{source} (shard {url})"
        nsamples = json_field(obj, "nsamples", int, where)
        filesize = json_field(obj, "filesize", int, where)
        sha = obj.get("sha256", "")
        if not isinstance(sha, str):
            raise ManifestError(f"{where}: field 'sha256' should be str, found {sha!r}")
        if nsamples < 0 or filesize < 0:
            raise ManifestError(f"{where}: negative nsamples={nsamples} or filesize={filesize}")
        offsets = obj.get("offsets", [])
        units = nsamples if chunk is None else -(-nsamples // chunk)
        expected = -(-units // OFFSET_STRIDE)
        if (
            not isinstance(offsets, list)
            or not all(type(o) is int for o in offsets)
            or (
                offsets
                and (
                    len(offsets) != expected
                    or offsets[0] != 0
                    or any(b <= a for a, b in zip(offsets, offsets[1:]))
                    or offsets[-1] >= filesize
                )
            )
        ):
            unit = "samples" if chunk is None else "chunks"
            raise ManifestError(
                f"{where}: field 'offsets' should be {expected} increasing byte offsets from 0 "
                f"(one every {OFFSET_STRIDE} {unit}), found {str(offsets)[:80]}"
            )
        table = table_from_json(obj.get("samples", ""), where)
        problem = SampleTable(table).problem(nsamples=nsamples, filesize=filesize) if table and chunk is None else None
        if table and chunk is not None:
            problem = "a chunked split has no per-sample table"
        if problem is not None:
            raise ManifestError(f"{where}: field 'samples' does not fit the shard: {problem}")
        sidecar = SidecarRef.from_json(obj.get("sidecar"), where)
        if sidecar is not None and (table or chunk is not None):
            raise ManifestError(f"{where}: field 'sidecar' goes with no 'samples' field and no chunked layout")
        entry = cls(url=url, nsamples=nsamples, filesize=filesize, sha256=sha, offsets=tuple(offsets), samples=table)
        return dataclasses.replace(entry, sidecar=sidecar) if sidecar is not None else entry


@dataclass(frozen=True)
class SplitIndex:
    """A split's index: the wids shard list plus shardify's own fields."""

    split: str
    shards: tuple[ShardEntry, ...]
    classes: tuple[str, ...] = ()
    fields: tuple[str, ...] = ()
    converter: dict[str, Any] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    ignored: dict[str, int] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    version: str | None = None
    """The conversion's version token (format 2); None for format 1 indexes."""
    raw_pixels: RawPixels | None = None
    """Set when the images are stored pre-decoded (``--raw-pixels``); absent from the JSON otherwise."""
    chunk: int | None = None
    """Samples per chunk of a chunked split (format 3, :mod:`shardify.chunk`); None: one tar
    sample per sample."""
    sidecar_root: str | None = None
    """Hex root of the hash tree over the shards' version-2 sidecars (:mod:`shardify.merkle`),
    also in the compact index; None: no sidecars, or version-1 ones."""

    @property
    def num_samples(self) -> int:
        return sum(s.nsamples for s in self.shards)

    @property
    def num_bytes(self) -> int:
        return sum(s.filesize for s in self.shards)

    @property
    def num_skipped(self) -> int:
        return sum(self.skipped.values())

    def to_json(self) -> dict[str, Any]:
        ours: dict[str, Any] = {"format_version": self.format_version, "split": self.split}
        if self.version is not None:
            ours["version"] = self.version
        if self.chunk is not None:
            ours["chunk"] = self.chunk
        if self.sidecar_root is not None:
            ours["sidecar_root"] = self.sidecar_root
        return {
            "__kind__": WIDS_KIND,
            "wids_version": 1,
            "name": self.split,
            "shardlist": [s.to_json() for s in self.shards],
            FORMAT_NAME: {
                **ours,
                "num_samples": self.num_samples,
                "classes": list(self.classes),
                "fields": list(self.fields),
                "converter": self.converter,
                "skipped": dict(sorted(self.skipped.items())),
                "ignored": dict(sorted(self.ignored.items())),
                "report": report_name(self.split),
                **({"raw_pixels": self.raw_pixels.to_json()} if self.raw_pixels is not None else {}),
            },
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any], *, source: str) -> SplitIndex:
        if obj.get("wids_version") != 1:
            raise ManifestError(f"{source}: field 'wids_version' should be 1, found {obj.get('wids_version')!r}")
        raw_shards = json_field(obj, "shardlist", list, source)
        ours = json_field(obj, FORMAT_NAME, dict, source)
        where = f"{source} [{FORMAT_NAME}]"
        version = json_field(ours, "format_version", int, where)
        _check_version(version, where)
        split = json_field(ours, "split", str, where)
        classes = json_field(ours, "classes", list, where)
        if not all(isinstance(c, str) for c in classes):
            raise ManifestError(f"{where}: field 'classes' should be a list of str")
        fields = ours.get("fields", [])
        token = hex_field(ours, "version", VERSION_CHARS, where)
        chunk = _chunk(ours, version, where)
        shards = tuple(ShardEntry.from_json(s, source=source, chunk=chunk) for s in raw_shards)
        declared = ours.get("num_samples")
        index = cls(
            split=split,
            shards=shards,
            classes=tuple(classes),
            fields=tuple(fields),
            converter=dict(ours.get("converter", {})),
            skipped={str(k): int(v) for k, v in dict(ours.get("skipped", {})).items()},
            ignored={str(k): int(v) for k, v in dict(ours.get("ignored", {})).items()},
            format_version=version,
            version=token,
            raw_pixels=RawPixels.from_json(ours["raw_pixels"], source=where) if "raw_pixels" in ours else None,
            chunk=chunk,
            sidecar_root=hex_field(ours, "sidecar_root", 64, where),
        )
        if declared is not None and declared != index.num_samples:
            raise ManifestError(
                f"{where}: field 'num_samples' is {declared}, the shardlist sums to {index.num_samples}"
            )
        return index

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SplitIndex:
        path = Path(path)
        try:
            text = path.read_bytes()
        except OSError as e:
            raise ManifestError(f"{path}: cannot read split index: {e}") from e
        return cls.from_json(load_json(text, source=str(path)), source=str(path))


def _chunk(obj: dict[str, Any], version: int, source: str) -> int | None:
    """The ``chunk`` field: samples per chunk, in a format-3 index only (where it is required)."""
    chunk = obj.get("chunk")
    if chunk is None and version < CHUNKED_FORMAT_VERSION:
        return None
    if version < CHUNKED_FORMAT_VERSION or type(chunk) is not int or chunk < 1:
        raise ManifestError(
            f"{source}: field 'chunk' should be a positive int in a format-{CHUNKED_FORMAT_VERSION} "
            f"(chunked) index, found {chunk!r} with format_version {version}"
        )
    return chunk


@dataclass(frozen=True)
class SplitRef:
    """The top-level manifest's entry for one split."""

    index: str
    samples: int
    shards: int
    bytes: int
    version: str | None = None
    """The split's current version token (format 2); None in format 1 manifests."""
    compact: CompactRef | None = None
    """The split's compact binary index (:mod:`shardify.compactindex`), which readers read
    instead of the JSON index; None: none (a split without sidecars)."""

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if self.version is None:
            del out["version"]
        if self.compact is None:
            del out["compact"]
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
        _check_version(version, source)
        raw = json_field(obj, "splits", dict, source)
        splits = {}
        for name, ref in raw.items():
            where = f"{source} (split {name!r})"
            if not isinstance(ref, dict):
                raise ManifestError(f"{where}: should be an object, found {ref!r}")
            splits[name] = SplitRef(
                index=json_field(ref, "index", str, where),
                samples=json_field(ref, "samples", int, where),
                shards=json_field(ref, "shards", int, where),
                bytes=json_field(ref, "bytes", int, where),
                version=hex_field(ref, "version", VERSION_CHARS, where),
                compact=CompactRef.from_json(ref.get("compact"), where),
            )
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

    def load_split(self, directory: str | os.PathLike[str], split: str) -> SplitIndex:
        """Load the index of ``split``; the error lists the splits there are."""
        if split not in self.splits:
            raise ManifestError(f"{Path(directory) / MANIFEST_NAME}: no split {split!r}; splits: {sorted(self.splits)}")
        ref = self.splits[split]
        index = SplitIndex.load(Path(directory) / ref.index)
        self.check_index(split, index, source=str(Path(directory) / ref.index))
        return index

    def check_index(self, split: str, index: SplitIndex, *, source: str) -> None:
        """Raise ManifestError unless ``index`` is the one the manifest lists for ``split``."""
        ref = self.splits[split]
        if index.split != split:
            raise ManifestError(f"{source}: field 'split' is {index.split!r}, the manifest lists it as {split!r}")
        if index.version != ref.version:
            raise ManifestError(
                f"{source}: field 'version' is {index.version!r}, the manifest lists "
                f"version {ref.version!r} for split {split!r}"
            )

    def with_split(self, split: str, index: SplitIndex, compact: CompactRef | None = None) -> Manifest:
        """The manifest with ``split`` switched to ``index`` (its versioned index file) and its
        ``compact`` index, if it has one."""
        ref = SplitRef(
            index=index_name(split, index.version),
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
