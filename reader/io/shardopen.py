"""Opening a shard's bytes: the one place that touches storage, and the one that unwraps gzip.

A remote shard is fetched whole into a local file first (streamed, retried, resumed, checked;
see :mod:`shardify.remote` and :mod:`shardify.reader.io.cache`), which the reader then seeks
in like a local one. A ``.tar.gz`` or ``.tgz`` shard is read as a forward-only stream.
"""

from __future__ import annotations

import gzip
from typing import BinaryIO

from shardify.errors import ShardFormatError
from shardify.reader.io.cache import FetchOptions, open_remote
from shardify.remote import is_remote
from shardify.tario import scan_sample_offsets

__all__ = ["TAR_SUFFIXES", "is_gzip", "local_path", "open_shard", "open_tar", "count_samples"]

_GZIP_SUFFIXES = (".tar.gz", ".tgz")
TAR_SUFFIXES = (".tar",) + _GZIP_SUFFIXES
"""The names of the shards a source lists: plain and gzip-compressed tars."""


def is_gzip(url: str) -> bool:
    """Whether the shard at ``url`` is a gzip-compressed tar (by its name)."""
    return url.lower().endswith(_GZIP_SUFFIXES)


def local_path(url: str) -> str:
    """The file path of a local ``url`` (a path, or ``file://``)."""
    return url[len("file://") :] if url.startswith("file://") else url


def open_shard(
    url: str, *, fetch: FetchOptions | None = None, filesize: int | None = None, sha256: str = ""
) -> BinaryIO:
    """Open the raw bytes of a shard for reading, seekable; the one place that touches storage.

    A remote shard is fetched into a local copy first (``fetch``: retries and cache folder;
    ``filesize`` and ``sha256`` are checked when given); failures raise
    :class:`~shardify.remote.ShardFetchError` naming the URL.
    """
    if is_remote(url):
        return open_remote(url, options=fetch or FetchOptions(), size=filesize, sha256=sha256)
    return open(local_path(url), "rb")  # noqa: SIM115 - the caller closes it


class _ForwardOnly:
    """A forward-only view of a stream, so skips read through instead of seeking (gzip)."""

    def __init__(self, f: BinaryIO | gzip.GzipFile) -> None:
        self._f = f

    def read(self, n: int = -1) -> bytes:
        return self._f.read(n)

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        self._f.close()


def read_whole(url: str, *, fetch: FetchOptions, size: int | None = None, sha256: str = "", key: str = "") -> bytes:
    """The bytes of the file ``url`` (an index file, a sidecar): a remote one through the node's
    cache (:func:`~shardify.reader.io.cache.open_remote`: checked against ``size`` and
    ``sha256`` when given, named by ``key`` when not), a local one read. Raises
    :class:`~shardify.remote.ShardFetchError` or OSError, for the caller to name what it is."""
    if is_remote(url):
        with open_remote(url, options=fetch, size=size, sha256=sha256, key=key) as f:
            return f.read()
    with open(local_path(url), "rb") as f:
        return f.read()


def open_tar(
    url: str, *, fetch: FetchOptions | None = None, filesize: int | None = None, sha256: str = ""
) -> tuple[BinaryIO, bool]:
    """Open a shard as an uncompressed tar stream; returns ``(stream, seekable)``."""
    raw = open_shard(url, fetch=fetch, filesize=filesize, sha256=sha256)
    if not is_gzip(url):
        return raw, True
    stream = gzip.GzipFile(fileobj=raw, mode="rb")
    return _ForwardOnly(stream), False  # type: ignore[return-value]


def count_samples(url: str, *, fetch: FetchOptions | None = None) -> int:
    """Samples in a shard, found by scanning its headers (errors name the shard: a shard
    missing, a directory, or unreadable is a ShardFormatError too)."""
    try:
        f, _ = open_tar(url, fetch=fetch)
    except OSError as e:
        raise ShardFormatError(f"cannot open: {type(e).__name__}: {e.strerror or e}", shard=url) from e
    try:
        return len(scan_sample_offsets(f, shard=url))
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise ShardFormatError(f"cannot read: {e}", shard=url) from e
    finally:
        f.close()
