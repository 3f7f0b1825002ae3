"""What to read: a shardify dataset (directory, manifest or split index) or a list of tar shards.

Local paths, ``file://``, ``http(s)://`` and any fsspec URL (``s3://``, ``gs://``, ...) work
for the dataset and its shards. A dataset with a manifest or split index becomes a
:class:`~shardify.reader.io.source.Source` through :mod:`~shardify.reader.io.indexsource`.
Shards are opened only through :func:`open_shard`: a remote shard is read in ranges
(:mod:`~shardify.reader.io.ranged`) or fetched whole into a local file (streamed, retried,
resumed; see :mod:`shardify.remote` and :mod:`shardify.reader.io.cache`). Shards without a
manifest (a list, or a brace pattern such as ``data-{000..099}.tar``; ``.tar``, ``.tar.gz``
and ``.tgz``, written by shardify, webdataset or GNU tar) are counted by scanning their
headers once, and the counts are logged.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import braceexpand

from shardify.errors import ManifestError, ShardFormatError
from shardify.manifest import MANIFEST_NAME
from shardify.reader.io.cache import FetchOptions
from shardify.reader.io.indexsource import check_split, from_index, from_manifest, from_url
from shardify.reader.io.shardlist import ShardInfo
from shardify.reader.io.shardopen import TAR_SUFFIXES, count_samples, is_gzip, local_path, open_shard, open_tar
from shardify.reader.io.source import ShardColumns, Source, shard_columns
from shardify.remote import RetryPolicy, is_remote
from shardify.splitindex import SplitIndex

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
    ``allow_locations`` prefixes (:mod:`shardify.locations`; a local one's after resolving links). ``ranged`` and
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
        return from_url(text, split, fetch)
    path = Path(local_path(text))
    if path.is_dir():
        return from_manifest(path, split, fetch)
    if path.name == MANIFEST_NAME:
        return from_manifest(path.parent, split, fetch)
    if path.suffix == ".json":
        index = SplitIndex.load(path)
        check_split(index, split, str(path))
        manifest_near = path.parent / MANIFEST_NAME
        return from_index(
            index, str(path), name=str(path), fetch=fetch, dataset=str(path.parent) if manifest_near.exists() else None
        )
    raise ManifestError(
        f"{text}: not a dataset directory, manifest.json, split index (.json) or tar shard "
        "(.tar, .tar.gz, .tgz, or a {a..b} pattern)"
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
