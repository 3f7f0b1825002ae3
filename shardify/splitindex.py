"""A split's index, ``{split}-{version}.json``: the wids shard list plus shardify's own fields.

Each split index is a ``wids-shard-index-v1`` file that ``wids.ShardListDataset`` opens
unmodified (``shardlist``: each shard's ``url``, relative to the index, and ``nsamples``),
plus a ``shardify`` section with our fields. Loading validates every field and names the
field and the file; :mod:`shardify.manifest` checks an index against the manifest that lists it.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardify import CHUNKED_FORMAT_VERSION, FORMAT_VERSION
from shardify.errors import ManifestError
from shardify.jsonfiles import hex_field, json_field, load_json
from shardify.pixels import RawPixels
from shardify.sampletable import SampleTable, table_from_json
from shardify.sidecar import SidecarRef
from shardify.tarfmt import OFFSET_STRIDE, VERSION_CHARS, report_name

__all__ = ["READ_VERSION", "WIDS_KIND", "FORMAT_NAME", "check_format_version", "ShardEntry", "SplitIndex", "TokenInfo"]

WIDS_KIND = "wids-shard-index-v1"
FORMAT_NAME = "shardify"


READ_VERSION = max(FORMAT_VERSION, CHUNKED_FORMAT_VERSION)
"""Newest format version this shardify reads (3: chunked splits)."""


def check_format_version(version: int, source: str) -> None:
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
    tokens: bytes = b""
    """A token split's document lengths in tokens, little-endian uint32 in sample order (``tokens``
    in the JSON as base64; readers that do not know it ignore it); empty: not a token split."""

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
        if self.tokens:
            out["tokens"] = base64.b64encode(self.tokens).decode("ascii")
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
        tokens = _token_lengths(obj.get("tokens", ""), nsamples, where)
        entry = cls(
            url=url,
            nsamples=nsamples,
            filesize=filesize,
            sha256=sha,
            offsets=tuple(offsets),
            samples=table,
            tokens=tokens,
        )
        return dataclasses.replace(entry, sidecar=sidecar) if sidecar is not None else entry


@dataclass(frozen=True)
class TokenInfo:
    """A token split's record (``tokens`` in the ``shardify`` section): each sample is one
    document, field ``field``, a 1-D ``.npy`` of ``dtype`` ending in ``eos`` when set."""

    field: str
    dtype: str
    """``uint16`` or ``uint32``."""
    vocab_size: int | None
    eos: int | None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, obj: Any, source: str) -> TokenInfo:
        if not isinstance(obj, dict):
            raise ManifestError(f"{source}: field 'tokens' should be an object, found {obj!r}")
        info = cls(
            field=json_field(obj, "field", str, source),
            dtype=json_field(obj, "dtype", str, source),
            vocab_size=obj.get("vocab_size"),
            eos=obj.get("eos"),
        )
        if info.dtype not in ("uint16", "uint32") or not all(
            v is None or type(v) is int for v in (info.vocab_size, info.eos)
        ):
            raise ManifestError(f"{source}: field 'tokens' is not a token record: {obj!r}")
        return info


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
    tokens: TokenInfo | None = None
    """Set for a split of token documents (``shardify convert tokens``)."""

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
                **({"tokens": self.tokens.to_json()} if self.tokens is not None else {}),
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
        check_format_version(version, where)
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
            tokens=TokenInfo.from_json(ours["tokens"], where) if "tokens" in ours else None,
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


def _token_lengths(text: Any, nsamples: int, where: str) -> bytes:
    """The ``tokens`` field of a shard entry: base64 of ``nsamples`` uint32 lengths (or absent)."""
    try:
        data = base64.b64decode(text, validate=True) if isinstance(text, str) else None
    except (binascii.Error, ValueError):
        data = None
    if data is None or (data and len(data) != 4 * nsamples):
        raise ManifestError(
            f"{where}: field 'tokens' should be base64 of {nsamples} uint32 lengths, found {text!r:.40}"
        )
    return data


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
