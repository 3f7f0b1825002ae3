"""Finish a split and publish it: the report, the split index, then ``manifest.json`` last.

The order is what makes a half-written dataset impossible to mistake for a finished one:
shards are renamed into place when whole, the report and the split index of the version come
next, and the top-level ``manifest.json`` (the only thing readers trust) is switched last
(:func:`publish_splits`). :func:`shard_entries` is the one place a finished shard becomes
its index entry (with its per-sample table, :mod:`shardify.sampletable`): inline, or for a
split over :data:`SIDECAR_ABOVE_SAMPLES` in a sidecar file beside the shard
(:mod:`shardify.sidecar`), each with its proof in the hash tree over the split's sidecars
(:mod:`shardify.merkle`), written (atomically; fsynced as the conversion's shards are) before
the indexes that name them: the compact index (:mod:`shardify.compactindex`, the tree's root
and each shard's count), then the JSON index.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

from shardify import merkle
from shardify.compactindex import CompactRef, compact_name
from shardify.compactindex import encode as encode_compact
from shardify.convert.inputs.inputs import Ignored
from shardify.convert.write.identity import format_version
from shardify.convert.write.outfs import WORK_DIR, OutputFS
from shardify.convert.write.shardtypes import ShardResult
from shardify.convert.write.versions import load_manifest, remove_stale_shards
from shardify.jsonfiles import json_bytes
from shardify.manifest import MANIFEST_NAME
from shardify.pixels import RawPixels
from shardify.sampletable import SampleTable
from shardify.sidecar import SidecarRef, encode, ref_of, sidecar_name, with_proof
from shardify.splitindex import ShardEntry, SplitIndex, TokenInfo
from shardify.tarfmt import index_name, report_name

__all__ = [
    "finish_split",
    "publish_splits",
    "shard_entries",
    "compact_bytes",
    "compact_fields",
    "write_report",
    "reason_class",
    "SIDECAR_ABOVE_SAMPLES",
]

SIDECAR_ABOVE_SAMPLES = 100_000
"""Splits of more samples keep each shard's per-sample table in a sidecar ``<shard>.idx``
(28 bytes a sample, fetched by a reader only for the shards it reads) rather than in the
JSON index (about 37 bytes a sample, parsed whole by every rank): 3.7 MB of index at most."""


def shard_entries(
    fs: OutputFS, ordered: Sequence[ShardResult], *, durable: bool = True
) -> tuple[tuple[ShardEntry, ...], str | None]:
    """The index entries of a split's finished shards, in order, with their per-sample tables:
    inline, or (over :data:`SIDECAR_ABOVE_SAMPLES` samples) written to ``fs`` as sidecars
    (fsynced when ``durable``); and the hex root of the sidecars' hash tree (None: inline
    tables, or a shard without a table, whose sidecars then carry no proof)."""
    inline = sum(r.nsamples for r in ordered) <= SIDECAR_ABOVE_SAMPLES
    if inline:
        return tuple(_entry(r, samples=r.samples) for r in ordered), None
    proven = all(r.samples for r in ordered)
    shards = len(ordered) if proven else 1  # 1: sidecars without proofs (depth 0)
    tree = None
    if proven:  # the tree needs every leaf before any proof: each body is encoded twice, not kept
        tree = merkle.MerkleTree([merkle.leaf_hash(_body(r, shards)) for r in ordered])
    entries = []
    for i, r in enumerate(ordered):
        ref = None
        if r.samples:
            data = with_proof(_body(r, shards), tree.proof(i) if tree is not None else ())
            fs.write_atomic(sidecar_name(r.url), data, durable=durable)
            ref = ref_of(data)
        entries.append(_entry(r, samples=b"", sidecar=ref))
    return tuple(entries), tree.root.hex() if tree is not None else None


def _entry(r: ShardResult, *, samples: bytes, sidecar: SidecarRef | None = None) -> ShardEntry:
    return ShardEntry(
        url=r.url,
        nsamples=r.nsamples,
        filesize=r.filesize,
        sha256=r.sha256,
        offsets=r.offsets,
        samples=samples,
        sidecar=sidecar,
        tokens=r.tokens,
    )


def _body(r: ShardResult, shards: int) -> bytes:
    """The sidecar of the shard ``r`` without its proof (its leaf in the tree)."""
    return encode(SampleTable(r.samples), filesize=r.filesize, sha256=r.sha256, shards=shards)


def compact_fields(index: SplitIndex) -> dict[str, Any]:
    """What the compact index of ``index`` holds of its fields: the JSON index's ``shardify``
    section, less the root (the compact index has it in its header)."""
    return {k: v for k, v in index.to_json()["shardify"].items() if k != "sidecar_root"}


def compact_bytes(index: SplitIndex) -> bytes:
    """The compact index of ``index`` (a split with a sidecar root): its ``shardify`` fields,
    counts and root. A function of the index alone, so its record is made again at publish."""
    if index.sidecar_root is None:
        raise ValueError(f"split {index.split!r} has no sidecar root, so no compact index")
    counts = [s.nsamples for s in index.shards]
    return encode_compact(compact_fields(index), counts, bytes.fromhex(index.sidecar_root))


def compact_ref(index: SplitIndex) -> CompactRef | None:
    """The manifest's record of the compact index of ``index`` (None: it has none)."""
    if index.sidecar_root is None or index.version is None:
        return None
    data = compact_bytes(index)
    ref = ref_of(data)
    return CompactRef(index=compact_name(index.split, index.version), size=ref.size, sha256=ref.sha256)


def finish_split(
    fs: OutputFS,
    split: str,
    ordered: Sequence[ShardResult],
    *,
    classes: Sequence[str],
    converter: dict[str, Any],
    skipped: Sequence[Ignored],
    ignored: Sequence[Ignored],
    version: str | None,
    notes: Sequence[Ignored] = (),
    ignored_counts: dict[str, int] | None = None,
    raw_pixels: RawPixels | None = None,
    chunk: int | None = None,
    durable: bool = True,
    tokens: TokenInfo | None = None,
) -> SplitIndex:
    """After the last shard: write the report, then the split index of ``version`` (the token
    in its shards' names, see :mod:`shardify.convert.write.versions`; None: format-1 names).

    ``notes`` (inputs packed with decoder warnings) go to the report only.
    ``ignored_counts`` adds counted-only reasons (items a user function filtered out) to the
    index's ``ignored`` counts without a report line each. ``raw_pixels``: the record of
    images stored pre-decoded (``--raw-pixels``). ``chunk``: the shards are in the
    chunked layout, that many samples a chunk (the index is then format 3). ``durable``: the
    sidecars are fsynced (as the conversion's shards are, its ``fsync`` option). ``tokens``:
    the record of a split of token documents (each shard's lengths come with its result).
    """
    remove_stale_shards(fs, split, version, len(ordered))
    write_report(fs, report_name(split), list(skipped), list(ignored) + list(notes))
    counts = Counter(reason_class(p.reason) for p in ignored)
    counts.update(ignored_counts or {})
    entries, root = shard_entries(fs, ordered, durable=durable)
    index = SplitIndex(
        split=split,
        shards=entries,
        classes=tuple(classes),
        fields=tuple(sorted({f for r in ordered for f in r.fields})),
        converter=converter,
        skipped=dict(Counter(reason_class(p.reason) for p in skipped)),
        ignored=dict(counts),
        version=version,
        raw_pixels=raw_pixels,
        chunk=chunk,
        format_version=format_version(chunk),
        sidecar_root=root if version is not None else None,
        tokens=tokens,
    )
    if index.sidecar_root is not None and version is not None:
        fs.write_atomic(compact_name(split, version), compact_bytes(index))
    fs.write_atomic(index_name(split, version), json_bytes(index.to_json()))
    return index


def publish_splits(fs: OutputFS, indexes: dict[str, SplitIndex]) -> None:
    """Switch ``manifest.json`` (written last) to the finished splits' versions, then write the
    unversioned copy of each index that wids opens and drop the splits' work folders."""
    manifest = load_manifest(fs)
    for split, index in indexes.items():
        manifest = manifest.with_split(split, index, compact_ref(index))
    fs.sync_root()
    fs.write_atomic(MANIFEST_NAME, json_bytes(manifest.to_json()))  # the switch to the new versions
    for split, index in indexes.items():  # the copy wids opens: the same bytes
        fs.write_atomic(index_name(split), json_bytes(index.to_json()))
    for split in indexes:
        fs.remove_tree(f"{WORK_DIR}/{split}")


def reason_class(reason: str) -> str:
    """A reason without its per-file details, for the counts in the index."""
    return reason.split(":", 1)[0].strip()


def write_report(fs: OutputFS, name: str, skipped: list[Ignored], ignored: list[Ignored]) -> None:
    """``{split}.report.jsonl``: one JSON line per skipped or ignored input (and note)."""
    lines = (
        json.dumps({"kind": p.kind, "path": p.path, "reason": p.reason}, ensure_ascii=True) + "\n"
        for p in skipped + ignored
    )
    fs.write_atomic(name, "".join(lines).encode("ascii"))
