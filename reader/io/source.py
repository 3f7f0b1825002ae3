"""A resolved dataset: its shards in order, what its manifest says, and how to open a shard.

:class:`Source` is what :func:`~shardify.reader.io.sources.resolve_source` makes of a dataset
folder, manifest, split index or shard list (:mod:`~shardify.reader.io.indexsource` for the
first three). A source from a manifest or split index is pinned to the dataset version it
resolved (:attr:`Source.version`): a shard of that version that cannot be opened any more
because the dataset was converted again and the old version removed raises
:class:`~shardify.errors.DatasetVersionError` naming the dataset and both versions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, BinaryIO

from shardify.errors import DatasetVersionError, ManifestError, ShardFormatError
from shardify.jsonfiles import load_json
from shardify.manifest import Manifest
from shardify.reader.io.cache import FetchOptions
from shardify.reader.io.compact import CompactShards
from shardify.reader.io.shardlist import (
    ChainedSequence,
    ChainedShards,
    LazySequence,
    Repeated,
    ShardInfo,
    ShardList,
    full_info,
)
from shardify.reader.io.shardopen import is_gzip, open_tar
from shardify.remote import ShardFetchError, fetch_bytes, is_remote
from shardify.splitindex import TokenInfo

__all__ = ["Source", "ShardColumns", "shard_columns", "fetch_file", "fetch_json"]


def fetch_file(url: str, fetch: FetchOptions, what: str) -> bytes:
    """The bytes of the small file at the URL ``url`` (``what`` it is, for the error)."""
    try:
        return fetch_bytes(url, retry=fetch.retry, storage_options=fetch.storage_options)
    except ShardFetchError as e:
        raise ManifestError(f"{url}: cannot read {what}: {e.reason}") from e


def fetch_json(url: str, fetch: FetchOptions, what: str) -> dict[str, Any]:
    """The JSON file at the URL ``url`` (``what`` it is, for the error)."""
    return load_json(fetch_file(url, fetch, what), source=url)


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
    tokens: TokenInfo | None = None
    """A token split's record (``shardify convert tokens``); its shards carry their documents'
    lengths (:attr:`ShardInfo.tokens`). None: not a token split."""

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
        return _has_gzip(self.shards)

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
            manifest = Manifest.from_json(fetch_json(self.dataset, self.fetch, "manifest"), source=self.dataset)
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


def _has_gzip(shards: Sequence[ShardInfo]) -> bool:
    if isinstance(shards, CompactShards):
        return False
    if isinstance(shards, ChainedShards):
        return any(_has_gzip(part) for part in shards.parts)
    return any(is_gzip(s.url) for s in shards)


def _chunks(shards: Sequence[ShardInfo]) -> Sequence[int | None]:
    """Each shard's ``chunk``: a compact index's are all None (it names plain tars only)."""
    if isinstance(shards, CompactShards):
        return Repeated(len(shards), None)
    if isinstance(shards, ChainedShards):
        return ChainedSequence([_chunks(part) for part in shards.parts])
    return [s.chunk for s in shards]


def shard_columns(source: Source) -> ShardColumns:
    """The :class:`ShardColumns` of ``source``'s shards."""
    shards = source.shards
    if isinstance(shards, ShardList):
        n = len(shards)
        return ShardColumns(
            offsets=LazySequence(n, lambda i: source.full(i).offsets),
            filesizes=LazySequence(n, lambda i: source.full(i).filesize),
            chunks=_chunks(shards),
        )
    return ShardColumns(
        offsets=[s.offsets for s in shards], filesizes=[s.filesize for s in shards], chunks=[s.chunk for s in shards]
    )
