"""``shardify verify`` and ``shardify info``: check a finished dataset, describe it.

The dataset is named as the reader names it (a folder, ``manifest.json`` or a split index;
a path or a URL: see :mod:`shardify.convert.dataset_files`). Verify reads every shard once:
its checksum and size against the index, its members against the format (names, adjacency, key rules, unique keys,
counts), and with
``decode`` every image decoded and every label parsed. A chunked split's chunks are checked
as the reader decodes them (keys, counts, offsets tables), then each of their samples as above. It reports every
problem it finds
with the shard and key, rather than stopping at the first.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO, cast

import numpy as np

from shardify.chunk import chunk_samples, decode_chunk
from shardify.compactindex import CompactRef
from shardify.compactindex import decode as decode_compact
from shardify.convert.dataset_files import DatasetFiles, locate_dataset
from shardify.convert.fieldsizes import field_bytes
from shardify.convert.inputs.sniff import IMAGE_FIELDS, ImageCheckError, check_image, describe_error
from shardify.convert.write.finish import compact_fields
from shardify.convert.write.versions import stray_files
from shardify.crc import crc32
from shardify.errors import ArrayFormatError, KeyRuleError, ManifestError, ShardFormatError, ShardifyError
from shardify.keys import check_key
from shardify.npy import npy_layout
from shardify.progress import progress_bar
from shardify.sampletable import DIGEST_BYTES, SampleTable
from shardify.sidecar import SidecarProof, decode_proven, sidecar_name
from shardify.sidecar import decode as decode_sidecar
from shardify.splitindex import ShardEntry, SplitIndex, TokenInfo
from shardify.tarfmt import OFFSET_STRIDE, shard_name, shard_of_split
from shardify.tario import iter_members, iter_samples

__all__ = ["Problem", "VerifyReport", "verify_dataset", "dataset_info"]


@dataclass(frozen=True)
class Problem:
    split: str
    shard: str | None
    key: str | None
    message: str

    def __str__(self) -> str:
        where = self.split + (f"/{self.shard}" if self.shard else "") + (f" key {self.key!r}" if self.key else "")
        return f"{where}: {self.message}"


@dataclass
class VerifyReport:
    checked: dict[str, dict[str, int]] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


class _HashingReader:
    """A forward-only view of a file that hashes what is read (so seeks are disabled); with a
    per-sample table, also each sample's bytes, against its checksum (``mismatched``: the sample
    numbers whose bytes do not match the table's CRC-32 or SHA-256 prefix)."""

    def __init__(self, f: BinaryIO, table: bytes = b"") -> None:
        self.f = f
        self.hash = hashlib.sha256()
        self.size = 0
        self._ranges = SampleTable(table if table else b"").ranges()
        self._at = 0  # the sample whose bytes come next
        self._sample = 0  # the running CRC-32 of the sample's bytes so far
        self._sha = hashlib.sha256()  # and their SHA-256
        self.mismatched: list[int] = []

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.hash.update(data)
        if self._ranges:
            self._hash_samples(memoryview(data), self.size)
        self.size += len(data)
        return data

    def _hash_samples(self, data: memoryview, pos: int) -> None:
        while data and self._at < len(self._ranges):
            start, stop, digest = self._ranges[self._at]
            if pos >= stop:
                self._at += 1
                continue
            take = max(0, start - pos)  # bytes before this sample (none: samples are contiguous)
            data, pos = data[take:], pos + take
            part = data[: stop - pos]
            self._sample = crc32(part, self._sample)
            self._sha.update(part)
            data, pos = data[len(part) :], pos + len(part)
            if pos == stop:
                crc, sha = self._sample, self._sha.digest()[:DIGEST_BYTES]
                if crc != self._ranges.crcs[self._at] or sha != digest:
                    self.mismatched.append(self._at)
                self._sample, self._sha = 0, hashlib.sha256()
                self._at += 1

    def seekable(self) -> bool:
        return False


def verify_dataset(
    root: str | os.PathLike[str],
    *,
    splits: list[str] | None = None,
    decode: bool = False,
    storage_options: dict[str, Any] | None = None,
    progress: bool = False,
    allow_locations: Sequence[str] = (),
) -> VerifyReport:
    """Check every shard of ``splits`` (default: all) of the dataset at ``root``: a folder, its
    ``manifest.json`` or a split index, as a path or a URL (``s3://``, ``file://``, ``http(s)://``).
    ``progress``: a bar of shard bytes checked on stderr (only when it is a terminal). A file
    outside the dataset's folder (a local one: after resolving links) is a problem unless it is
    under one of the ``allow_locations`` prefixes, as for the reader."""
    dataset = locate_dataset(root, storage_options=storage_options, allow_locations=allow_locations)
    report = VerifyReport()
    indexes = []
    for split in splits or dataset.splits:
        try:
            indexes.append(dataset.load_split(split))
        except ManifestError as e:
            report.problems.append(Problem(split, None, None, str(e)))
    bar = progress_bar(
        total=sum(e.filesize for index in indexes for e in index.shards), desc="verify", unit="B", enabled=progress
    )
    try:
        for index in indexes:
            ref = dataset.manifest.splits[index.split] if dataset.manifest is not None else None
            compact = ref.compact if ref is not None else None
            if compact is not None:
                _verify_compact(dataset.files, index, compact, report.problems)
            _verify_split(dataset.files, index, decode, report, bar)
    finally:
        if bar is not None:
            bar.close()
    if not dataset.files.remote:
        for name, why in stray_files(dataset.files.folder):
            report.problems.append(Problem("(dataset)", name, None, why))
    return report


def _counted(shards: Sequence[ShardEntry], bar: Any) -> Iterator[ShardEntry]:
    """``shards``, advancing ``bar`` (if any) by each one's size once the caller is done with it."""
    for entry in shards:
        yield entry
        if bar is not None:
            bar.update(entry.filesize)


def _verify_split(files: DatasetFiles, index: SplitIndex, decode: bool, report: VerifyReport, bar: Any = None) -> None:
    split = index.split
    keys: set[str] = set()
    problems = report.problems
    for i, entry in enumerate(_counted(index.shards, bar)):
        if entry.url != shard_name(split, i, index.version):
            problems.append(
                Problem(split, entry.url, None, f"shard {i} should be named {shard_name(split, i, index.version)}")
            )
        proof = SidecarProof(bytes.fromhex(index.sidecar_root), i, len(index.shards)) if index.sidecar_root else None
        table = _sidecar_table(files, entry, problems, split, proof) if entry.sidecar is not None else entry.samples
        try:
            f = files.open_stream(entry.url)
        except ShardifyError as e:
            problems.append(Problem(split, entry.url, None, getattr(e, "reason", str(e))))
            continue
        with f:
            reader = _HashingReader(f, table if not index.chunk else b"")
            # (of a stream that cannot seek, iter_members calls read() alone: all this one has)
            stream = cast(BinaryIO, reader)
            count = units = 0
            shard_keys: list[str] = []  # in order: to name a sample whose bytes fail the table
            offsets: list[int] = []  # of samples (chunks) 0, OFFSET_STRIDE, ...: what the index should list
            try:
                for unit in iter_samples(iter_members(stream, shard=entry.url), shard=entry.url):
                    if units % OFFSET_STRIDE == 0:
                        offsets.append(int(unit["__offset__"]))  # type: ignore[call-overload]
                    for sample in _unit_samples(unit, index, units, entry.nsamples, entry.url):
                        count += 1
                        shard_keys.append(str(sample.get("__key__")))
                        try:
                            _check_sample(split, entry.url, sample, index, keys, decode, problems)
                            if index.tokens is not None and count <= len(entry.tokens) // 4:
                                length = int.from_bytes(entry.tokens[4 * count - 4 : 4 * count], "little")
                                _check_tokens(split, entry.url, sample, index.tokens, length, problems)
                        except Exception as e:  # any sample, however hostile, is a reported problem
                            problems.append(
                                Problem(
                                    split,
                                    entry.url,
                                    str(sample.get("__key__")),
                                    f"cannot check the sample: {describe_error(e)}",
                                )
                            )
                    units += 1
                while reader.read(1 << 20):
                    pass
            except ShardifyError as e:
                problems.append(Problem(split, entry.url, None, str(e)))
                continue
        if reader.size != entry.filesize:
            problems.append(Problem(split, entry.url, None, f"size is {reader.size}, the index says {entry.filesize}"))
        if entry.sha256 and reader.hash.hexdigest() != entry.sha256:
            problems.append(Problem(split, entry.url, None, "sha256 does not match the index (corrupt or replaced)"))
        for n in reader.mismatched:
            key = shard_keys[n] if n < len(shard_keys) else None
            problems.append(
                Problem(split, entry.url, key, f"sample {n}'s bytes do not match the index's per-sample checksum")
            )
        if count != entry.nsamples:
            problems.append(Problem(split, entry.url, None, f"holds {count} samples, the index says {entry.nsamples}"))
        elif entry.offsets and list(entry.offsets) != offsets:
            wrong = next(k for k, (a, b) in enumerate(zip(entry.offsets, offsets)) if a != b)
            problems.append(
                Problem(
                    split,
                    entry.url,
                    None,
                    f"the index's offset of {'chunk' if index.chunk else 'sample'} "
                    f"{wrong * OFFSET_STRIDE} is {entry.offsets[wrong]}, "
                    f"the shard's is {offsets[wrong]}",
                )
            )
    for name in files.names() or ():
        found = shard_of_split(name, split)
        if found is not None and found[0] == index.version and found[1] >= len(index.shards):
            problems.append(Problem(split, name, None, "shard file not listed in the index"))
    report.checked[split] = {"shards": len(index.shards), "samples": len(keys)}


def _sidecar_table(
    files: DatasetFiles, entry: ShardEntry, problems: list[Problem], split: str, proof: SidecarProof | None
) -> bytes:
    """The table in the sidecar of ``entry`` (checked against its record in the index and, with a
    ``proof``, against the split's tree root and the shard's size and SHA-256; then sample by sample
    against the shard's bytes as it is read); empty, with a problem, if unusable."""
    try:
        data = files.read_bytes(sidecar_name(entry.url))
        table = decode_sidecar(
            data, shard=entry.url, ref=entry.sidecar, nsamples=entry.nsamples, filesize=entry.filesize
        )
    except (ShardifyError, OSError) as e:
        problems.append(Problem(split, entry.url, None, getattr(e, "reason", str(e))))
        return b""
    if proof is not None:  # what a reader of the compact index checks; the samples are checked still
        try:
            facts = decode_proven(data, shard=entry.url, proof=proof, nsamples=entry.nsamples)
        except ShardifyError as e:
            problems.append(Problem(split, entry.url, None, getattr(e, "reason", str(e))))
        else:
            if facts.sha256 != entry.sha256:
                problems.append(Problem(split, entry.url, None, "its sidecar's sha256 of the shard is not the index's"))
    return table.raw


def _verify_compact(files: DatasetFiles, index: SplitIndex, ref: CompactRef, problems: list[Problem]) -> None:
    """The compact index the manifest names for ``index``'s split: its bytes against the manifest's
    record, its fields, counts and root against the JSON index (each sidecar's proof is checked
    with its shard)."""
    split = index.split
    try:
        compact = decode_compact(files.read_bytes(ref.index), source=files.where(ref.index), sha256=ref.sha256)
    except (ShardifyError, OSError) as e:
        problems.append(Problem(split, ref.index, None, getattr(e, "reason", str(e))))
        return
    if compact.counts.tolist() != [e.nsamples for e in index.shards]:
        problems.append(Problem(split, ref.index, None, "its shard counts are not the JSON index's"))
    if index.sidecar_root is None or compact.root.hex() != index.sidecar_root:
        problems.append(Problem(split, ref.index, None, "its sidecar root is not the JSON index's"))
    if compact.fields != compact_fields(index):
        problems.append(Problem(split, ref.index, None, "its fields are not the JSON index's"))


def _unit_samples(unit: dict[str, Any], index: SplitIndex, n: int, nsamples: int, url: str) -> list[dict[str, Any]]:
    """The samples of tar sample ``n`` of a shard: itself, or in a chunked split the samples of
    the chunk (a damaged chunk raises ShardFormatError, a problem of its shard)."""
    if index.chunk is None:
        return [unit]
    key = str(unit["__key__"])
    chunk = decode_chunk(unit, shard=url, key=key, count=max(1, chunk_samples(nsamples, index.chunk, n)))
    if chunk.keys[0] != key:
        raise ShardFormatError(f"damaged chunk: its first key is {chunk.keys[0]!r}", shard=url, key=key)
    return [chunk.sample(i) for i in range(len(chunk.keys))]


def _check_sample(
    split: str,
    shard: str,
    sample: dict[str, Any],
    index: SplitIndex,
    keys: set[str],
    decode: bool,
    problems: list[Problem],
) -> None:
    key = str(sample["__key__"])
    try:
        check_key(key)
    except KeyRuleError as e:
        problems.append(Problem(split, shard, key, str(e)))
    if key in keys:
        problems.append(Problem(split, shard, key, "key appears in more than one place in the split"))
    keys.add(key)
    if "cls" in sample:
        try:
            label = int(sample["cls"])
            if label < 0 or (index.classes and label >= len(index.classes)):
                problems.append(
                    Problem(split, shard, key, f"label {label} out of range for {len(index.classes)} classes")
                )
        except ValueError:
            problems.append(Problem(split, shard, key, f"cls {sample['cls'][:20]!r} is not an int"))
    if "json" in sample:
        try:
            json.loads(sample["json"])
        except ValueError as e:
            problems.append(Problem(split, shard, key, f"json member is not valid JSON: {e}"))
        except RecursionError:
            problems.append(Problem(split, shard, key, "json member is nested too deeply to parse"))
    if decode:
        for ext, data in sample.items():
            if ext in IMAGE_FIELDS or ext.rsplit(".", 1)[-1] in IMAGE_FIELDS:
                try:
                    info = check_image(data, full=True)
                    if info.ext != ext.rsplit(".", 1)[-1] and not (info.ext, ext) == ("tiff", "tif"):
                        problems.append(Problem(split, shard, key, f"field {ext!r} holds {info.ext} data"))
                except ImageCheckError as e:
                    problems.append(Problem(split, shard, key, f"field {ext!r}: {e}"))


def _check_tokens(
    split: str, shard: str, sample: dict[str, Any], info: TokenInfo, n: int, problems: list[Problem]
) -> None:
    """A token document is a 1-D ``.npy`` of the split's dtype and of the length its index records."""
    try:
        dtype, shape, _, _, _ = npy_layout(memoryview(sample.get(info.field) or b""))
        if dtype.str != np.dtype(info.dtype).newbyteorder("<").str or shape != (n,):
            raise ArrayFormatError(f"holds {dtype} {shape}, the index says {info.dtype} ({n},)")
    except ArrayFormatError as e:
        problems.append(Problem(split, shard, str(sample["__key__"]), f"field {info.field!r}: {e}"))


def dataset_info(
    root: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None, sample_shards: int = 0
) -> dict[str, Any]:
    """A JSON-able description of a dataset (a folder, ``manifest.json`` or split index, a path
    or a URL): splits, samples, shards, bytes, classes; with ``sample_shards``, each split's
    bytes per sample by field, from the headers of that many of its shards
    (:func:`~shardify.convert.fieldsizes.field_bytes`)."""
    dataset = locate_dataset(root, storage_options=storage_options)
    out: dict[str, Any] = {"path": os.fspath(root), "format_version": dataset.format_version, "splits": {}}
    for split in dataset.splits:
        index = dataset.load_split(split)
        out["splits"][split] = {
            "samples": index.num_samples,
            "shards": len(index.shards),
            "bytes": index.num_bytes,
            "classes": len(index.classes),
            "class_names": list(index.classes),
            "fields": list(index.fields),
            "labels": index.converter.get("labels"),
            "skipped": dict(index.skipped),
            "ignored": dict(index.ignored),
            "converter": index.converter,
            "version": index.version,
            **({} if index.chunk is None else {"chunk": index.chunk}),
        }
        if sample_shards > 0:
            try:
                out["splits"][split]["field_bytes"] = field_bytes(dataset.files, index, shards=sample_shards).to_json()
            except ShardifyError as e:  # a description still describes what it can: verify says what is wrong
                out["splits"][split]["field_bytes_error"] = str(e)
        if index.raw_pixels is not None:
            out["splits"][split]["raw_pixels"] = index.raw_pixels.to_json()
        if index.tokens is not None:
            lengths = sum(int(np.frombuffer(e.tokens, "<u4").sum(dtype=np.uint64)) for e in index.shards)
            out["splits"][split]["tokens"] = {**index.tokens.to_json(), "num_tokens": lengths}
    return out
