"""Local copies of remote shards, so that the reader seeks in them exactly like in local shards.

With ``cache_dir=`` the copies stay, shared by every worker and rank that names the same
folder, and the least recently used are removed to keep the total under a byte limit.
Without one, each process keeps its last few shards in a temporary folder removed at exit.

How processes share a folder (also across machines, where ``flock`` works on it):

- only a complete, checked file (size, and SHA-256 when the manifest has it) has its final
  name: a download goes to ``<name>.part-<pid>-<random>``, is fsynced, then renamed with
  :func:`os.replace`; a partial download is never read as whole;
- a lock file per shard (``.locks/<name>``, :func:`fcntl.flock`) makes a second process wait
  for the first one's download instead of fetching again; ``.part`` files found under the
  lock were left by a dead download and are removed;
- using a file bumps its mtime; eviction removes the oldest. A removed file stays readable
  to a process that has it open, and the next open fetches it again;
- a download that fails on the local disk (full: ``ENOSPC``, over quota: ``EDQUOT``, at the
  write, the flush or the fsync) removes its ``.part`` file and raises
  :class:`~shardify.remote.ShardFetchError` naming the shard and the cache folder;
  nothing is left under the final name, so the next open (with room) fetches it again.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import hashlib
import logging
import multiprocessing.util
import os
import re
import secrets
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit

from shardify.remote import RetryPolicy, ShardFetchError, download

__all__ = ["FetchOptions", "ShardCache", "shard_cache", "open_remote"]

log = logging.getLogger("shardify.reader")

_PART = re.compile(r"\.part-\d+-[0-9a-f]+$")
_FINAL = re.compile(r"^[0-9a-f]{16}-[A-Za-z0-9._-]+$")
_LOCKS = ".locks"
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


@dataclass(frozen=True)
class FetchOptions:
    """How remote shards are read: ``retry`` (attempts, backoff, timeouts); ``cache_dir``, a
    folder kept across runs and shared by processes, LRU-evicted above ``cache_limit_bytes``
    (None: no limit); without it, a per-process temporary folder of ``temp_shards`` shards."""

    retry: RetryPolicy = field(default_factory=RetryPolicy)
    cache_dir: str | None = None
    cache_limit_bytes: int | None = None
    temp_shards: int = 2
    storage_options: Mapping[str, Any] | None = None
    """Options of the fsspec backend (``s3://``: ``key``, ``secret``, ``endpoint_url``, ...);
    default: the backend's usual places (environment, config files)."""
    allow_locations: tuple[str, ...] = ()
    """URL or path prefixes a split index may send the reader to besides its own folder
    (:mod:`shardify.locations`)."""
    ranged: bool = True
    """Read only the byte ranges of the samples a worker reads, where the index allows it
    (:mod:`shardify.reader.io.ranged`); False: fetch whole shards into the cache."""
    requests: int = 64
    """Ranged requests in flight per worker, ahead of use."""

    def __post_init__(self) -> None:
        if self.cache_limit_bytes is not None and self.cache_limit_bytes < 0:
            raise ValueError(f"{self.cache_limit_bytes=} should be >= 0 (or None: no limit)")
        if self.cache_limit_bytes is not None and self.cache_dir is None:
            raise ValueError(f"{self.cache_limit_bytes=} needs cache_dir=...")
        if self.temp_shards < 1:
            raise ValueError(f"{self.temp_shards=} should be >= 1")
        if self.requests < 1:
            raise ValueError(f"{self.requests=} should be >= 1")


class ShardCache:
    """Complete copies of remote files in ``directory``, at most ``limit_bytes`` in total and
    ``limit_files`` files (None: no limit); the file just fetched is always kept.
    ``durable`` fsyncs each file before it gets its final name."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        limit_bytes: int | None = None,
        limit_files: int | None = None,
        durable: bool = True,
    ) -> None:
        self.directory = Path(directory)
        self.limit_bytes, self.limit_files, self.durable = limit_bytes, limit_files, durable
        (self.directory / _LOCKS).mkdir(parents=True, exist_ok=True)
        self._fetched: set[str] = set()
        self._warned = False

    def path_for(self, url: str, sha256: str = "") -> Path:
        """Where the copy of ``url`` goes; the expected checksum is part of the name, so a
        dataset rewritten in place never reads a stale copy."""
        digest = hashlib.sha256(f"{url}\n{sha256.lower()}".encode()).hexdigest()[:16]
        base = re.sub(r"[^A-Za-z0-9._-]", "_", os.path.basename(urlsplit(url).path))[-80:] or "file"
        return self.directory / f"{digest}-{base}"

    def open(
        self,
        url: str,
        *,
        retry: RetryPolicy,
        size: int | None = None,
        sha256: str = "",
        storage_options: Mapping[str, Any] | None = None,
        key: str = "",
    ) -> BinaryIO:
        """The complete copy of ``url``, open for reading at byte 0; fetched first when needed.
        ``key`` names the copy in place of ``sha256`` for a file checked otherwise once read."""
        final = self.path_for(url, sha256 or key)
        f = _open_complete(final, size)
        if f is not None:
            return f
        with _locked(self.directory / _LOCKS / final.name):
            f = _open_complete(final, size)
            if f is not None:  # another process fetched it while this one waited
                return f
            with contextlib.suppress(FileNotFoundError):
                final.unlink()  # a copy of the wrong size
            self._remove_leftovers(final)
            f = self._fetch(url, final, retry=retry, size=size, sha256=sha256, storage_options=storage_options)
        self._note_fetch(url)
        self._evict(keep=final)
        return f

    def _fetch(
        self,
        url: str,
        final: Path,
        *,
        retry: RetryPolicy,
        size: int | None,
        sha256: str,
        storage_options: Mapping[str, Any] | None,
    ) -> BinaryIO:
        part = final.with_name(f"{final.name}.part-{os.getpid()}-{secrets.token_hex(4)}")
        f = open(part, "w+b")  # noqa: SIM115 - returned to the caller, who closes it
        try:
            download(url, f, retry=retry, size=size, sha256=sha256, storage_options=storage_options)
            f.flush()
            if self.durable:
                os.fsync(f.fileno())
            os.replace(part, final)
        except BaseException as e:
            f.close()
            with contextlib.suppress(FileNotFoundError):
                part.unlink()
            full = _disk_full(e)
            if full is not None:
                raise ShardFetchError(
                    f"no space left in the cache folder {self.directory} ({full.strerror or full}) while "
                    f"downloading{f' its {size} bytes' if size is not None else ''}; the partial copy was removed. "
                    "Free space there, or lower cache_limit_bytes",
                    shard=url,
                ) from e
            raise
        f.seek(0)
        return f

    def _remove_leftovers(self, final: Path) -> None:
        for p in self.directory.glob(f"{glob.escape(final.name)}.part-*"):
            if _PART.search(p.name):
                log.info("removing %s, left by an interrupted download", p)
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()

    def _note_fetch(self, url: str) -> None:
        if url in self._fetched and self.limit_files is not None and not self._warned:
            self._warned = True
            log.warning(
                "%s: fetched again because only %d shards are kept in %s; pass "
                "cache_dir=... with room for a worker's shards to fetch each shard once",
                url,
                self.limit_files,
                self.directory,
            )
        self._fetched.add(url)

    def entries(self) -> list[tuple[int, int, Path]]:
        """``(mtime_ns, size, path)`` of the complete copies, oldest first."""
        out = []
        with os.scandir(self.directory) as it:
            for e in it:
                if _FINAL.match(e.name) and not _PART.search(e.name):
                    with contextlib.suppress(FileNotFoundError):
                        st = e.stat(follow_symlinks=False)
                        out.append((st.st_mtime_ns, st.st_size, Path(e.path)))
        return sorted(out)

    def _evict(self, *, keep: Path) -> None:
        entries = self.entries()
        total, count = sum(size for _, size, _ in entries), len(entries)
        for _, size, path in entries:
            over_bytes = self.limit_bytes is not None and total > self.limit_bytes
            over_files = self.limit_files is not None and count > self.limit_files
            if not (over_bytes or over_files):
                break
            if path == keep:
                continue
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                log.debug("evicted %s (%d bytes)", path, size)
            total, count = total - size, count - 1
        if self.limit_bytes is not None and total > self.limit_bytes:
            log.warning(
                "%s: %d bytes kept, above cache_limit_bytes=%d: the shard in use is larger",
                self.directory,
                total,
                self.limit_bytes,
            )


def _disk_full(e: BaseException) -> OSError | None:
    """The ``ENOSPC``/``EDQUOT`` error behind ``e`` (raised at once, or as the cause of a failed download)."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in _DISK_FULL:
            return seen
        seen = seen.__cause__
    return None


def _open_complete(path: Path, size: int | None) -> BinaryIO | None:
    """``path`` open for reading if it is there (and of ``size`` bytes); bumps its mtime."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - returned to the caller
    except FileNotFoundError:
        return None
    if size is not None and os.fstat(f.fileno()).st_size != size:
        f.close()
        return None
    with contextlib.suppress(OSError):
        os.utime(f.fileno())
    return f


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


_caches: dict[tuple[int, str | None, int | None, int], ShardCache] = {}
_caches_lock = threading.Lock()


def shard_cache(options: FetchOptions) -> ShardCache:
    """This process's cache for ``options`` (a forked child makes its own)."""
    key = (os.getpid(), options.cache_dir, options.cache_limit_bytes, options.temp_shards)
    with _caches_lock:
        cache = _caches.get(key)
        if cache is None:
            if options.cache_dir is not None:
                cache = ShardCache(options.cache_dir, limit_bytes=options.cache_limit_bytes)
            else:
                folder = tempfile.mkdtemp(prefix="shardify-shards-")
                # Runs at exit of the main process and of multiprocessing children (DataLoader workers).
                multiprocessing.util.Finalize(
                    None, shutil.rmtree, args=(folder,), kwargs={"ignore_errors": True}, exitpriority=0
                )
                cache = ShardCache(folder, limit_files=options.temp_shards, durable=False)
            _caches[key] = cache
        return cache


def open_remote(
    url: str, *, options: FetchOptions, size: int | None = None, sha256: str = "", key: str = ""
) -> BinaryIO:
    """A local, seekable copy of the remote file ``url``, open at byte 0 (see the module)."""
    return shard_cache(options).open(
        url, retry=options.retry, size=size, sha256=sha256, storage_options=options.storage_options, key=key
    )


def forget_remote(url: str, *, options: FetchOptions, key: str) -> None:
    """Drop the cached copy of ``url`` named by ``key`` (found wrong once read: fetched again next time)."""
    with contextlib.suppress(OSError):
        shard_cache(options).path_for(url, key).unlink()
