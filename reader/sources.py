"""What to read: a shardify dataset (directory, manifest or split index) or a list of tar shards.

Shards are opened only through :func:`open_shard` (local paths and ``file://`` for now), so
remote URLs are one function away. Shards without a manifest (a list, or a brace pattern
such as ``data-{000..099}.tar``; ``.tar``, ``.tar.gz`` and ``.tgz``, written by shardify,
webdataset or GNU tar) are counted by scanning their headers once, and the counts are logged.
"""

from __future__ import annotations

import gzip
import logging
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import braceexpand

from shardify.errors import ManifestError, ShardFormatError
from shardify.manifest import MANIFEST_NAME, Manifest, SplitIndex
from shardify.tario import scan_sample_offsets

__all__ = [
    "ShardInfo",
    "Source",
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

_GZIP_SUFFIXES = (".tar.gz", ".tgz")
_TAR_SUFFIXES = (".tar",) + _GZIP_SUFFIXES


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """One shard to read: where it is and how many samples it holds."""

    url: str
    nsamples: int


@dataclass(frozen=True)
class Source:
    """Resolved input of a dataset: its shards in order, plus what the manifest says."""

    name: str
    split: str | None
    shards: tuple[ShardInfo, ...]
    classes: tuple[str, ...] = ()
    fields: tuple[str, ...] = ()
    unique_keys: bool = True
    """Keys are unique across shards (a shardify split); else a key is only unique in its shard."""

    @property
    def num_samples(self) -> int:
        return sum(s.nsamples for s in self.shards)

    @property
    def sizes(self) -> list[int]:
        return [s.nsamples for s in self.shards]


def is_gzip(url: str) -> bool:
    """Whether the shard at ``url`` is a gzip-compressed tar (by its name)."""
    return url.lower().endswith(_GZIP_SUFFIXES)


def _local_path(url: str) -> str:
    if url.startswith("file://"):
        return url[len("file://"):]
    if "://" in url:
        scheme = url.split("://", 1)[0]
        raise ManifestError(f"{url}: scheme {scheme!r} is not supported yet (local paths and file://)")
    return url


def open_shard(url: str) -> BinaryIO:
    """Open the raw bytes of a shard (or manifest) for reading; the one place that touches storage."""
    return open(_local_path(url), "rb")  # noqa: SIM115 - the caller closes it


class _ForwardOnly:
    """A forward-only view of a stream, so skips read through instead of seeking (gzip)."""

    def __init__(self, f: BinaryIO) -> None:
        self._f = f

    def read(self, n: int = -1) -> bytes:
        return self._f.read(n)

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        self._f.close()


def open_tar(url: str) -> tuple[BinaryIO, bool]:
    """Open a shard as an uncompressed tar stream; returns ``(stream, seekable)``."""
    raw = open_shard(url)
    if not is_gzip(url):
        return raw, True
    stream = gzip.GzipFile(fileobj=raw, mode="rb")
    return _ForwardOnly(stream), False  # type: ignore[return-value]


def count_samples(url: str) -> int:
    """Samples in a shard, found by scanning its headers (errors name the shard)."""
    f, _ = open_tar(url)
    try:
        return len(scan_sample_offsets(f, shard=url))
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise ShardFormatError(f"cannot read: {e}", shard=url) from e
    finally:
        f.close()


def expand_shards(spec: SourceLike) -> list[str]:
    """Expand brace patterns (``a-{000..009}.tar``) in a path or a list of paths."""
    items = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
    out: list[str] = []
    for item in items:
        out.extend(braceexpand.braceexpand(os.fspath(item)))
    return out


def _is_shard_spec(text: str) -> bool:
    return "{" in text or text.lower().endswith(_TAR_SUFFIXES)


def resolve_source(spec: SourceLike, *, split: str | None = None, count_threads: int = 8) -> Source:
    """Resolve ``spec`` into a :class:`Source`; shard lists are counted here, once."""
    if not isinstance(spec, (str, os.PathLike)):
        return _from_shards(expand_shards(spec), name=f"{len(spec)} shard paths", threads=count_threads)
    text = os.fspath(spec)
    if _is_shard_spec(text):
        return _from_shards(expand_shards(text), name=text, threads=count_threads)
    path = Path(_local_path(text))
    if path.is_dir():
        return _from_manifest(path, split)
    if path.name == MANIFEST_NAME:
        return _from_manifest(path.parent, split)
    if path.suffix == ".json":
        index = SplitIndex.load(path)
        if split is not None and split != index.split:
            raise ManifestError(f"{path}: this index is split {index.split!r}, not {split!r}")
        return _from_index(index, path.parent, name=str(path))
    raise ManifestError(
        f"{text}: not a dataset directory, manifest.json, split index (.json) or tar shard "
        "(.tar, .tar.gz, .tgz, or a {a..b} pattern)"
    )


def _from_manifest(directory: Path, split: str | None) -> Source:
    manifest = Manifest.load(directory)
    if split is None:
        if len(manifest.splits) != 1:
            raise ManifestError(
                f"{directory / MANIFEST_NAME}: pass split=...; splits: {sorted(manifest.splits)}"
            )
        split = next(iter(manifest.splits))
    return _from_index(manifest.load_split(directory, split), directory, name=str(directory))


def _from_index(index: SplitIndex, directory: Path, *, name: str) -> Source:
    shards = tuple(ShardInfo(url=str(directory / e.url), nsamples=e.nsamples) for e in index.shards)
    return Source(name=name, split=index.split, shards=shards, classes=index.classes,
                  fields=index.fields, unique_keys=True)


def _from_shards(urls: list[str], *, name: str, threads: int) -> Source:
    if not urls:
        raise ManifestError(f"{name}: no shards")
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(urls)))) as pool:
        counts = list(pool.map(count_samples, urls))
    shown = ", ".join(f"{os.path.basename(u)}={n}" for u, n in zip(urls[:8], counts[:8]))
    more = f", ... ({len(urls) - 8} more)" if len(urls) > 8 else ""
    log.info("counted %d samples in %d shards of %s: %s%s", sum(counts), len(urls), name, shown, more)
    shards = tuple(ShardInfo(url=u, nsamples=n) for u, n in zip(urls, counts))
    return Source(name=name, split=None, shards=shards, unique_keys=len(urls) == 1)
