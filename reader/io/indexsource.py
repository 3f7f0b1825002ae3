"""Sources of a shardify dataset: from its folder or URL through ``manifest.json``, or from a split index.

A split whose manifest entry names a compact index is read through it
(:mod:`~shardify.reader.io.compact`); other splits through their JSON index, which must be the
one the manifest records (:meth:`~shardify.manifest.Manifest.split_index`: its size and SHA-256,
its shards and totals), checked before any sample is read, locally as remotely. A shard's
``url`` in a split index is relative to the index, and a manifest or index may name files only
under its own folder (a local one: after resolving links) and the ``allow_locations`` prefixes
(:mod:`shardify.locations`).
"""

from __future__ import annotations

from pathlib import Path

from shardify.errors import IndexMismatchError, ManifestError, SplitRequiredError
from shardify.locations import check_location
from shardify.manifest import MANIFEST_NAME, Manifest
from shardify.reader.io.cache import FetchOptions
from shardify.reader.io.compact import CompactShards, compact_base, read_compact
from shardify.reader.io.shardlist import ShardInfo
from shardify.reader.io.source import Source, fetch_file, fetch_json
from shardify.remote import join_url
from shardify.splitindex import SplitIndex
from shardify.tarfmt import shard_name

__all__ = ["from_manifest", "from_url", "from_index", "check_split"]


def _only_split(manifest: Manifest, split: str | None, where: str) -> str:
    if split is not None:
        return split
    if len(manifest.splits) != 1:
        raise SplitRequiredError(where, sorted(manifest.splits))
    return next(iter(manifest.splits))


def check_split(index: SplitIndex, split: str | None, where: str) -> None:
    if split is not None and split != index.split:
        raise ManifestError(f"{where}: this index is split {index.split!r}, not {split!r}")


_WORK_DIR = ".shardify-work"
"""Where a converter keeps the work of an unfinished conversion (``shardify.convert.write.outfs``)."""


def _unfinished(directory: Path, split: str | None) -> ManifestError | None:
    """The error for a folder whose conversion (of ``split``) was interrupted, or None."""
    work = directory / _WORK_DIR
    try:
        splits = sorted(p.name for p in work.iterdir() if p.is_dir())
    except OSError:
        return None
    if split is not None and split not in splits:
        return None
    return ManifestError(
        f"{directory}: unfinished: a conversion into this folder was interrupted ({work} holds the work of split(s) "
        f"{', '.join(splits) or '?'}); its shards are not read until manifest.json lists the split: run it again "
        "to finish"
    )


def from_manifest(directory: Path, split: str | None, fetch: FetchOptions) -> Source:
    manifest_at = str(directory / MANIFEST_NAME)
    try:
        manifest = Manifest.load(directory)
        split = _only_split(manifest, split, manifest_at)
        ref = manifest.ref(split, source=manifest_at)
        if ref.compact is not None:
            return _from_compact(manifest, split, manifest_at, name=str(directory), fetch=fetch, dataset=str(directory))
        index_at = str(directory / ref.index)
        check_location(manifest_at, index_at, allow=fetch.allow_locations)
        try:
            data = Path(index_at).read_bytes()
        except OSError as e:
            raise ManifestError(f"{index_at}: cannot read split index: {e}") from e
        index = manifest.split_index(split, data, source=index_at)
    except ManifestError as e:
        unfinished = _unfinished(directory, split)
        if unfinished is not None:
            raise unfinished from e
        raise
    return from_index(index, index_at, name=str(directory), fetch=fetch, dataset=str(directory))


def from_url(url: str, split: str | None, fetch: FetchOptions) -> Source:
    """A dataset at a remote URL: its folder, its ``manifest.json`` or a split index."""
    if url.endswith(".json") and url.rsplit("/", 1)[-1] != MANIFEST_NAME:
        index = SplitIndex.from_json(fetch_json(url, fetch, "split index"), source=url)
        check_split(index, split, url)
        return from_index(index, url, name=url, fetch=fetch)
    top = url if url.endswith(".json") else url.rstrip("/") + "/" + MANIFEST_NAME
    manifest = Manifest.from_json(fetch_json(top, fetch, "manifest"), source=top)
    split = _only_split(manifest, split, top)
    ref = manifest.ref(split, source=top)
    if ref.compact is not None:
        return _from_compact(manifest, split, top, name=url.removesuffix("/" + MANIFEST_NAME), fetch=fetch, dataset=top)
    index_url = join_url(top, ref.index)
    check_location(top, index_url, allow=fetch.allow_locations)
    index = manifest.split_index(split, fetch_file(index_url, fetch, "split index"), source=index_url)
    return from_index(index, index_url, name=url.removesuffix("/" + MANIFEST_NAME), fetch=fetch, dataset=top)


def _from_compact(
    manifest: Manifest, split: str, manifest_at: str, *, name: str, fetch: FetchOptions, dataset: str
) -> Source:
    """``split`` through the compact index the manifest at ``manifest_at`` names for it."""
    ref = manifest.splits[split]
    if ref.compact is None or ref.version is None:
        raise ManifestError(f"{manifest_at}: split {split!r} names a compact index without a version token")
    index_at = _shard_location(manifest_at, ref.compact.index)
    check_location(manifest_at, index_at, allow=fetch.allow_locations)
    compact = read_compact(index_at, ref.compact, fetch, split=split)
    fields = {k: v for k, v in compact.fields.items() if k != "num_samples"}
    meta = SplitIndex.from_json({"wids_version": 1, "shardlist": [], "shardify": fields}, source=index_at)
    manifest.check_index(split, meta, source=index_at)
    if meta.chunk is not None or compact.num_samples != ref.samples or compact.shards != ref.shards:
        raise IndexMismatchError(
            f"{index_at}: split {split!r}: {compact.shards} shards of {compact.num_samples} samples"
            f"{' in chunks' if meta.chunk is not None else ''}; the manifest lists {ref.shards} shards of "
            f"{ref.samples} samples",
            split=split,
            entry=min(compact.shards, ref.shards) if compact.shards != ref.shards else None,
        )
    base = compact_base(index_at)
    check_location(index_at, base + shard_name(split, 0, ref.version), allow=fetch.allow_locations)
    shards = CompactShards(
        base=base, split=split, version=ref.version, counts=compact.counts, root=compact.root, fetch=fetch
    )
    return Source(
        name=name,
        split=split,
        shards=shards,
        classes=meta.classes,
        fields=meta.fields,
        unique_keys=True,
        fetch=fetch,
        version=ref.version,
        dataset=dataset,
        sidecar_root=compact.root.hex(),
    )


def _shard_location(index_at: str, relative: str) -> str:
    """Where a shard listed in the index at ``index_at`` (a path or a URL) is."""
    if "://" in relative or "://" in index_at:
        return join_url(index_at, relative)
    return str(Path(index_at).parent / relative)


def from_index(
    index: SplitIndex, index_at: str, *, name: str, fetch: FetchOptions, dataset: str | None = None
) -> Source:
    for e in index.shards:
        check_location(index_at, _shard_location(index_at, e.url), allow=fetch.allow_locations)
    shards = tuple(
        ShardInfo(
            url=_shard_location(index_at, e.url),
            nsamples=e.nsamples,
            filesize=e.filesize,
            sha256=e.sha256,
            offsets=e.offsets,
            chunk=index.chunk,
            samples=e.samples,
            sidecar=e.sidecar,
            tokens=e.tokens,
        )
        for e in index.shards
    )
    return Source(
        name=name,
        split=index.split,
        shards=shards,
        classes=index.classes,
        fields=index.fields,
        unique_keys=True,
        fetch=fetch,
        version=index.version,
        dataset=dataset,
        sidecar_root=index.sidecar_root,
        tokens=index.tokens,
    )
