"""Shard files a random-access reader keeps open: local files, and remote shards fetched whole.

:class:`OpenShards` opens shard ``i`` of a source the first time it is read and keeps the
:data:`MAX_OPEN_FILES` most recently used open (per process: opened again after a fork). A
remote shard is fetched whole through the node's cache (:func:`~shardify.reader.io.cache.open_remote`:
one download per node, checked against the index's size and SHA-256, then read like a local
file); :meth:`OpenShards.open_many` fetches a batch's new shards concurrently, and
:meth:`OpenShards.mapped` memory-maps a file (a sample's bytes copied out with no system call). ``whole_sha256``:
a local shard is also checked against the index's SHA-256 when first opened (reading it
whole once per process), for layouts whose index has no per-sample checksums.
"""

from __future__ import annotations

import mmap
import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import BinaryIO

from shardify.errors import ShardFormatError
from shardify.jsonfiles import file_sha256
from shardify.reader.io.cache import open_remote
from shardify.reader.io.shardopen import is_gzip, local_path
from shardify.reader.io.source import Source
from shardify.remote import ShardFetchError, is_remote

__all__ = ["MAX_OPEN_FILES", "OpenShards", "gzip_refused"]

MAX_OPEN_FILES = 128
"""Shard files kept open per process (the most recently used; others closed)."""


def gzip_refused(url: str) -> ShardFormatError:
    """The error for random access to a gzip shard (it cannot seek: no sample's bytes can be
    read without inflating everything before them)."""
    return ShardFormatError(
        "is gzip-compressed: random access needs an uncompressed tar (convert without compression), "
        "or read it with ShardedDataset",
        shard=url,
    )


class OpenShards:
    """The open files of ``source``'s shards, by shard number; see the module."""

    def __init__(self, source: Source, *, whole_sha256: bool = False) -> None:
        self.source, self.whole_sha256 = source, whole_sha256
        self.urls = source.urls
        self.files: OrderedDict[int, BinaryIO] = OrderedDict()
        self._maps: dict[int, mmap.mmap | bytes] = {}

    def fd(self, shard: int) -> int:
        """The descriptor of shard ``shard``'s file (opened first if it is not)."""
        f = self.files.get(shard)
        if f is None:
            self._keep(shard, self._open(shard))
            return self.files[shard].fileno()
        self.files.move_to_end(shard)
        return f.fileno()

    def mapped(self, shard: int) -> mmap.mmap | bytes:
        """Shard ``shard``'s file memory-mapped (read-only; ``b""`` when empty). Its size is checked at
        each call (one ``fstat``): a file truncated since it was mapped is mapped again at its new
        size, so that a read past its end is an error naming it, never a fault, unless it is cut
        during that very read."""
        fd = self.fd(shard)
        size = os.fstat(fd).st_size
        found = self._maps.get(shard)
        if found is None or len(found) != size:
            found = mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else b""
            self._maps[shard] = found
        return found

    def open_many(self, shards: Sequence[int], submit: Callable[..., Future[BinaryIO]]) -> None:
        """Open the shards of ``shards`` not open yet, the remote ones concurrently (``submit``)."""
        new = [s for s in dict.fromkeys(shards) if s not in self.files]
        remote = [s for s in new if is_remote(self.urls[s])]
        if len(remote) > 1:
            for shard, future in [(s, submit(self._open, s)) for s in remote]:
                self._keep(shard, future.result())

    def _keep(self, shard: int, f: BinaryIO) -> None:
        self.files[shard] = f
        if len(self.files) > max(1, MAX_OPEN_FILES):
            gone, f = self.files.popitem(last=False)
            self._maps.pop(gone, None)  # (unmapped when collected: samples are copied out of it)
            f.close()

    def _open(self, shard: int) -> BinaryIO:
        url = self.urls[shard]
        if is_gzip(url):
            raise gzip_refused(url)
        try:
            if is_remote(url):
                info = self.source.full(shard)
                return open_remote(url, options=self.source.fetch, size=info.filesize, sha256=info.sha256)
            f: BinaryIO = open(local_path(url), "rb", buffering=0)  # noqa: SIM115 (kept open, closed by close)
        except ShardFetchError as e:
            raise ShardFormatError(f"cannot fetch it whole: {e.reason}", shard=url) from e
        except OSError as e:
            raise ShardFormatError(f"cannot open it: {e}", shard=url) from e
        if self.whole_sha256:
            try:
                self._check_whole(shard, f)
            except BaseException:
                f.close()
                raise
        return f

    def _check_whole(self, shard: int, f: BinaryIO) -> None:
        want = self.source.full(shard).sha256
        if not want:
            return
        try:
            f.seek(0)
            got = file_sha256(f)
        except OSError as e:
            raise ShardFormatError(f"cannot read it: {e}", shard=self.urls[shard]) from e
        if got != want.lower():
            raise ShardFormatError(
                f"its SHA-256 is {got}, the index says {want}: changed or damaged since it was written",
                shard=self.urls[shard],
            )

    def close(self) -> None:
        """Close every file (reopened when next read)."""
        for f in self.files.values():
            f.close()
        self.files.clear()
        self._maps.clear()
