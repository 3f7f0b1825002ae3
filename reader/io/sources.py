"""What to read: a shardify dataset (directory, manifest or split index) or a list of tar shards.

Local paths, ``file://``, ``http(s)://`` and any fsspec URL (``s3://``, ``gs://``, ...) work
for the dataset and its shards; a shard's ``url`` in a split index is relative to the index.
Shards are opened only through :func:`open_shard`: a remote shard is first fetched whole
into a local file (streamed, retried, resumed; see :mod:`shardify.remote` and
:mod:`shardify.reader.io.cache`), which the reader then seeks in like a local shard.
Shards without a manifest (a list, or a brace pattern such as ``data-{000..099}.tar``;
``.tar``, ``.tar.gz`` and ``.tgz``, written by shardify, webdataset or GNU tar) are counted by
scanning their headers once, and the counts are logged.

A source from a manifest or split index is pinned to the dataset version it resolved
(:attr:`Source.version`): a shard of that version that cannot be opened any more because
the dataset was converted again and the old version removed raises
:class:`~shardify.errors.DatasetVersionError` naming the dataset and both versions.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, BinaryIO

import braceexpand

from shardify.errors import DatasetVersionError, ManifestError, ShardFormatError, SplitRequiredError
from shardify.manifest import MANIFEST_NAME, Manifest, SplitIndex, load_json
from shardify.reader.io.cache import FetchOptions
from shardify.reader.io.compact import CompactShards, compact_base, read_compact
from shardify.reader.io.locations import check_location
from shardify.reader.io.shardlist import LazySequence, ShardInfo, ShardList, full_info
from shardify.reader.io.shardopen import TAR_SUFFIXES, count_samples, is_gzip, local_path, open_shard, open_tar
from shardify.remote import RetryPolicy, ShardFetchError, fetch_bytes, is_remote, join_url
from shardify.tarfmt import shard_name

__all__ = [
    "ShardInfo",
    "ShardColumns",
    "shard_columns",
    "Source",
    "FetchOptions",
    "RetryPolicy",
    "SourceLike",
    "resolve_source",
    "expand_shards",
    "open_shard",
    "open_tar",
    "is_gzip",
    "count_samples",
]

log = logging.getLogger("shardify.reader")

SourceLike = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
"""A dataset directory, ``manifest.json``, split index, shard pattern, or a list of shards."""


@dataclass(frozen=True)
class Source:
    """Resolved input of a dataset: its shards in order, plus what the manifest says."""

    name: str
    split: str | None
    shards: Sequence[ShardInfo]
    """A tuple, or a :class:`~shardify.reader.io.shardlist.ShardList` that makes each on access
    (a compact index's shards, a mix's)."""
    classes: tuple[str, ...] = ()
    fields: tuple[str, ...] = ()
    unique_keys: bool = True
    """Keys are unique across shards (a shardify split); else a key is only unique in its shard."""
    fetch: FetchOptions = field(default_factory=FetchOptions)
    """How remote shards are fetched (retries, cache folder)."""
    unreadable: tuple[tuple[str, str], ...] = ()
    """``(url, reason)`` of listed shards left out because they could not be counted
    (missing, a directory, damaged), under ``skip_unreadable``."""
    version: str | None = None
    """The dataset version this source reads (from its split index; None: format 1 or a shard list)."""
    dataset: str | None = None
    """Where the dataset's ``manifest.json`` is (a folder or a URL), to tell a version that is gone."""
    sidecar_root: str | None = None
    """The split's sidecar tree root (hex), which stands for every shard's size and SHA-256 in
    the data identity of a resume state; None: a split without version-2 sidecars."""

    @property
    def num_samples(self) -> int:
        return sum(self.sizes)

    @cached_property
    def sizes(self) -> list[int]:
        if isinstance(self.shards, ShardList):
            return self.shards.sizes
        return [s.nsamples for s in self.shards]

    @property
    def urls(self) -> Sequence[str]:
        if isinstance(self.shards, ShardList):
            return self.shards.urls
        return [s.url for s in self.shards]

    def full(self, i: int) -> ShardInfo:
        """Shard ``i`` with its size, SHA-256 and offsets (a compact index's: from its sidecar)."""
        return full_info(self.shards, i)

    @cached_property
    def has_gzip(self) -> bool:
        """Whether a shard is gzip-compressed (a compact index names plain tars only)."""
        if isinstance(self.shards, CompactShards):
            return False
        return any(is_gzip(u) for u in self.urls)

    @cached_property
    def _by_url(self) -> dict[str, int]:
        return {s.url: i for i, s in enumerate(self.shards)}

    def index_of(self, url: str) -> int | None:
        """The number of this source's shard ``url`` (None: not one of its shards)."""
        if isinstance(self.shards, CompactShards):
            return self.shards.index_of(url)
        return self._by_url.get(url)

    def open_tar(self, url: str) -> tuple[BinaryIO, bool]:
        """:func:`open_tar` for one of this source's shards, with its fetch options and checks.

        When the shard cannot be opened and the manifest now lists another version of the
        split, raises :class:`DatasetVersionError` (the pinned version is gone)."""
        i = self.index_of(url)
        try:
            info = self.full(i) if i is not None else None
            return open_tar(
                url, fetch=self.fetch, filesize=info.filesize if info else None, sha256=info.sha256 if info else ""
            )
        except (OSError, ShardFormatError) as e:
            gone = self.version_gone(url)
            if gone is not None:
                raise gone from e
            raise

    def current_version(self) -> str | None:
        """The version of this source's split that the dataset's manifest lists now."""
        if self.dataset is None or self.split is None:
            return None
        if is_remote(self.dataset):
            manifest = Manifest.from_json(_fetch_json(self.dataset, self.fetch, "manifest"), source=self.dataset)
        else:
            manifest = Manifest.load(self.dataset)
        ref = manifest.splits.get(self.split)
        return ref.version if ref is not None else None

    def version_gone(self, url: str) -> DatasetVersionError | None:
        """The error for a shard ``url`` that failed to open, when it failed because the version
        this source pinned was replaced (None: same version, or no manifest to tell)."""
        if self.dataset is None:
            return None
        try:
            now = self.current_version()
        except ManifestError:
            return None
        if now == self.version:
            return None
        return DatasetVersionError(
            f"dataset {self.name}, split {self.split!r}: version {self.version or 'unversioned (format 1)'} "
            f"that this reader opened is gone; the dataset was converted again and is now at version "
            f"{now or 'unversioned'}. Make a new ShardedDataset to read version {now} (the epoch cannot "
            "go on: its samples would mix two versions)",
            shard=url,
        )


@dataclass(frozen=True)
class ShardColumns:
    """Per-shard values a reader checks and seeks with, as sequences: lists for a source of
    :class:`ShardInfo`, made on access (a compact shard's from its sidecar) for a shard list."""

    offsets: Sequence[Sequence[int]]
    filesizes: Sequence[int | None]
    chunks: Sequence[int | None] | None


def shard_columns(source: Source) -> ShardColumns:
    """The :class:`ShardColumns` of ``source``'s shards."""
    shards = source.shards
    if isinstance(shards, ShardList):
        n = len(shards)
        return ShardColumns(
            offsets=LazySequence(n, lambda i: source.full(i).offsets),
            filesizes=LazySequence(n, lambda i: source.full(i).filesize),
            chunks=None if isinstance(shards, CompactShards) else LazySequence(n, lambda i: shards[i].chunk),
        )
    return ShardColumns(
        offsets=[s.offsets for s in shards], filesizes=[s.filesize for s in shards], chunks=[s.chunk for s in shards]
    )


def expand_shards(spec: SourceLike) -> list[str]:
    """Expand brace patterns (``a-{000..009}.tar``) in a path or a list of paths."""
    items = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
    out: list[str] = []
    for item in items:
        out.extend(braceexpand.braceexpand(os.fspath(item)))
    return out


def _is_shard_spec(text: str) -> bool:
    return "{" in text or text.lower().endswith(TAR_SUFFIXES)


def resolve_source(
    spec: SourceLike,
    *,
    split: str | None = None,
    count_threads: int = 8,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit_bytes: int | None = None,
    retry: RetryPolicy | None = None,
    temp_shards: int = 2,
    skip_unreadable: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    allow_locations: Sequence[str] = (),
    ranged: bool = True,
    requests: int = 64,
) -> Source:
    """Resolve ``spec`` into a :class:`Source`; shard lists are counted here, once.

    A listed shard that cannot be counted raises :class:`ShardFormatError` naming it, or with
    ``skip_unreadable`` is left out, logged and kept in :attr:`Source.unreadable`.

    Remote shards are fetched into ``cache_dir`` (kept and shared by processes, the least
    recently used removed above ``cache_limit_bytes``), else into a per-process temporary
    folder holding the last ``temp_shards``; ``retry`` bounds the attempts, backoff and timeouts.
    ``storage_options`` go to the fsspec backend of ``s3://`` and other URLs (credentials,
    endpoint); by default it takes them from its usual places (``AWS_*`` variables, ``~/.aws``).
    A manifest or split index may name files only under its own folder, and under the
    ``allow_locations`` prefixes (:mod:`shardify.reader.io.locations`). ``ranged`` and
    ``requests``: see :class:`~shardify.reader.io.cache.FetchOptions`.
    """
    fetch = FetchOptions(
        retry=retry or RetryPolicy(),
        cache_limit_bytes=cache_limit_bytes,
        cache_dir=os.fspath(cache_dir) if cache_dir is not None else None,
        temp_shards=temp_shards,
        storage_options=storage_options,
        allow_locations=tuple(allow_locations),
        ranged=ranged,
        requests=requests,
    )
    if not isinstance(spec, (str, os.PathLike)):
        return _from_shards(
            expand_shards(spec),
            name=f"{len(spec)} shard paths",
            threads=count_threads,
            fetch=fetch,
            skip_unreadable=skip_unreadable,
        )
    text = os.fspath(spec)
    if _is_shard_spec(text):
        return _from_shards(
            expand_shards(text), name=text, threads=count_threads, fetch=fetch, skip_unreadable=skip_unreadable
        )
    if is_remote(text):
        return _from_url(text, split, fetch)
    path = Path(local_path(text))
    if path.is_dir():
        return _from_manifest(path, split, fetch)
    if path.name == MANIFEST_NAME:
        return _from_manifest(path.parent, split, fetch)
    if path.suffix == ".json":
        index = SplitIndex.load(path)
        _check_split(index, split, str(path))
        manifest_near = path.parent / MANIFEST_NAME
        return _from_index(
            index, str(path), name=str(path), fetch=fetch, dataset=str(path.parent) if manifest_near.exists() else None
        )
    raise ManifestError(
        f"{text}: not a dataset directory, manifest.json, split index (.json) or tar shard "
        "(.tar, .tar.gz, .tgz, or a {a..b} pattern)"
    )


def _only_split(manifest: Manifest, split: str | None, where: str) -> str:
    if split is not None:
        return split
    if len(manifest.splits) != 1:
        raise SplitRequiredError(where, sorted(manifest.splits))
    return next(iter(manifest.splits))


def _check_split(index: SplitIndex, split: str | None, where: str) -> None:
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


def _from_manifest(directory: Path, split: str | None, fetch: FetchOptions) -> Source:
    try:
        manifest = Manifest.load(directory)
        split = _only_split(manifest, split, str(directory / MANIFEST_NAME))
        if split in manifest.splits and manifest.splits[split].compact is not None:
            return _from_compact(
                manifest,
                split,
                str(directory / MANIFEST_NAME),
                name=str(directory),
                fetch=fetch,
                dataset=str(directory),
            )
        index = manifest.load_split(directory, split)
    except ManifestError as e:
        unfinished = _unfinished(directory, split)
        if unfinished is not None:
            raise unfinished from e
        raise
    return _from_index(
        index, str(directory / manifest.splits[split].index), name=str(directory), fetch=fetch, dataset=str(directory)
    )


def _fetch_json(url: str, fetch: FetchOptions, what: str) -> dict[str, Any]:
    try:
        data = fetch_bytes(url, retry=fetch.retry, storage_options=fetch.storage_options)
    except ShardFetchError as e:
        raise ManifestError(f"{url}: cannot read {what}: {e.reason}") from e
    return load_json(data, source=url)


def _from_url(url: str, split: str | None, fetch: FetchOptions) -> Source:
    """A dataset at a remote URL: its folder, its ``manifest.json`` or a split index."""
    if url.endswith(".json") and url.rsplit("/", 1)[-1] != MANIFEST_NAME:
        index = SplitIndex.from_json(_fetch_json(url, fetch, "split index"), source=url)
        _check_split(index, split, url)
        return _from_index(index, url, name=url, fetch=fetch)
    top = url if url.endswith(".json") else url.rstrip("/") + "/" + MANIFEST_NAME
    manifest = Manifest.from_json(_fetch_json(top, fetch, "manifest"), source=top)
    split = _only_split(manifest, split, top)
    if split not in manifest.splits:
        raise ManifestError(f"{top}: no split {split!r}; splits: {sorted(manifest.splits)}")
    if manifest.splits[split].compact is not None:
        return _from_compact(manifest, split, top, name=url.removesuffix("/" + MANIFEST_NAME), fetch=fetch, dataset=top)
    index_url = join_url(top, manifest.splits[split].index)
    check_location(top, index_url, allow=fetch.allow_locations)
    index = SplitIndex.from_json(_fetch_json(index_url, fetch, "split index"), source=index_url)
    manifest.check_index(split, index, source=index_url)
    return _from_index(index, index_url, name=url.removesuffix("/" + MANIFEST_NAME), fetch=fetch, dataset=top)


def _from_compact(
    manifest: Manifest, split: str, manifest_at: str, *, name: str, fetch: FetchOptions, dataset: str
) -> Source:
    """``split`` through the compact index the manifest at ``manifest_at`` names for it."""
    ref = manifest.splits[split]
    if ref.compact is None or ref.version is None:
        raise ManifestError(f"{manifest_at}: split {split!r} names a compact index without a version token")
    index_at = _shard_location(manifest_at, ref.compact.index)
    check_location(manifest_at, index_at, allow=fetch.allow_locations)
    compact = read_compact(index_at, ref.compact, fetch)
    fields = {k: v for k, v in compact.fields.items() if k != "num_samples"}
    meta = SplitIndex.from_json({"wids_version": 1, "shardlist": [], "shardify": fields}, source=index_at)
    manifest.check_index(split, meta, source=index_at)
    if meta.chunk is not None or compact.num_samples != ref.samples or compact.shards != ref.shards:
        raise ManifestError(
            f"{index_at}: {compact.shards} shards of {compact.num_samples} samples"
            f"{' in chunks' if meta.chunk is not None else ''}; the manifest lists {ref.shards} shards of "
            f"{ref.samples} samples for split {split!r}"
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


def _from_index(
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
    )


def _count_or_error(url: str, fetch: FetchOptions) -> int | ShardFormatError:
    try:
        return count_samples(url, fetch=fetch)
    except ShardFormatError as e:
        return e


def _from_shards(
    urls: list[str], *, name: str, threads: int, fetch: FetchOptions, skip_unreadable: bool = False
) -> Source:
    if not urls:
        raise ManifestError(f"{name}: no shards")
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(urls)))) as pool:
        found = list(pool.map(lambda u: _count_or_error(u, fetch), urls))
    errors = [(u, e) for u, e in zip(urls, found) if isinstance(e, ShardFormatError)]
    if errors and not skip_unreadable:
        raise errors[0][1]
    for u, e in errors:
        log.warning("skipping shard %s (on_error='skip'): %s", u, e.reason)
    unreadable = tuple((u, e.reason) for u, e in errors)
    kept = [(u, n) for u, n in zip(urls, found) if isinstance(n, int)]
    urls, counts = [u for u, _ in kept], [n for _, n in kept]
    if not urls:
        raise ManifestError(f"{name}: no readable shards ({len(errors)} skipped; first: {errors[0][1]})")
    shown = ", ".join(f"{os.path.basename(u)}={n}" for u, n in zip(urls[:8], counts[:8]))
    more = f", ... ({len(urls) - 8} more)" if len(urls) > 8 else ""
    log.info("counted %d samples in %d shards of %s: %s%s", sum(counts), len(urls), name, shown, more)
    shards = tuple(ShardInfo(url=u, nsamples=n) for u, n in zip(urls, counts))
    return Source(name=name, split=None, shards=shards, unique_keys=len(urls) == 1, fetch=fetch, unreadable=unreadable)
