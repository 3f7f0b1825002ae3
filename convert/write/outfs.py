"""Where the converter writes: a local folder, or any fsspec URL (``s3://``, ``gs://``, ``file://``).

One small interface, so that the writer and the finalize order (shards renamed when
whole, index next, manifest last) are the same code for both. On object storage, a write
becomes visible only when it completes, which is the atomicity a rename gives locally.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO, cast

from shardify.convert.write.gather import GatherFile
from shardify.errors import OutputError
from shardify.jsonfiles import write_bytes_atomic

__all__ = [
    "OutputFS",
    "LocalFS",
    "FsspecFS",
    "OutputLock",
    "is_locked",
    "open_output",
    "is_url",
    "backend_reason",
    "WORK_DIR",
    "output_failed",
    "undone_on_failure",
]

WORK_DIR = ".shardify-work"
"""The folder of an unfinished conversion's progress (records of finished shards, the lock)."""


def is_url(location: str) -> bool:
    """Whether ``location`` names a URL (``scheme://...``) rather than a local path."""
    return "://" in str(location)


class OutputFS:
    """Files directly under one output root, by name (``train-000000.tar``, ``.shardify-work/x``)."""

    location: str
    local: bool

    def open_write(self, name: str, *, durable: bool = False) -> BinaryIO:
        """A new file ``name`` to write; ``durable``: it will be fsynced when finished (a local
        file then starts writing its bytes to disk as they come, so the fsync waits little)."""
        raise NotImplementedError

    def finish_write(self, f: BinaryIO, *, fsync: bool) -> None:
        """Flush (and fsync where that means something) before the file is closed."""
        f.flush()

    def replace(self, src: str, dst: str) -> None:
        raise NotImplementedError

    def exists(self, name: str) -> bool:
        raise NotImplementedError

    def size(self, name: str) -> int:
        raise NotImplementedError

    def open_read(self, name: str) -> BinaryIO:
        raise NotImplementedError

    def read_bytes(self, name: str) -> bytes:
        with self.open_read(name) as f:
            return f.read()

    def listdir(self, prefix: str = "") -> list[str]:
        """Names of the files in the root (or in folder ``prefix`` under it)."""
        raise NotImplementedError

    def entries(self, prefix: str = "") -> list[str]:
        """Names of the files and folders in folder ``prefix`` (empty if it does not exist)."""
        raise NotImplementedError

    def remove(self, name: str) -> None:
        raise NotImplementedError

    def remove_tree(self, name: str) -> None:
        raise NotImplementedError

    def makedirs(self, name: str = "") -> None:
        raise NotImplementedError

    def write_atomic(self, name: str, data: bytes, *, durable: bool = True) -> None:
        """Write the file ``name`` whole or not at all; ``durable=False`` skips the fsync (for
        files checked when read, such as the records of finished shards)."""
        raise NotImplementedError

    def sync_root(self) -> None:
        """Make completed renames durable before the manifest is written (local only)."""

    def __str__(self) -> str:
        return self.location


class LocalFS(OutputFS):
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.location = str(self.root)
        self.local = True

    def _p(self, name: str) -> Path:
        return self.root / name

    def open_write(self, name: str, *, durable: bool = False) -> BinaryIO:
        return GatherFile(self._p(name), write_behind=durable)  # type: ignore[return-value]

    def finish_write(self, f: BinaryIO, *, fsync: bool) -> None:
        f.flush()
        if fsync:
            os.fsync(f.fileno())

    def replace(self, src: str, dst: str) -> None:
        os.replace(self._p(src), self._p(dst))

    def exists(self, name: str) -> bool:
        return self._p(name).exists()

    def size(self, name: str) -> int:
        return self._p(name).stat().st_size

    def open_read(self, name: str) -> BinaryIO:
        return open(self._p(name), "rb")

    def listdir(self, prefix: str = "") -> list[str]:
        folder = self._p(prefix)
        if not folder.is_dir():
            return []
        return sorted(e.name for e in os.scandir(folder) if e.is_file())

    def entries(self, prefix: str = "") -> list[str]:
        folder = self._p(prefix)
        return sorted(os.listdir(folder)) if folder.is_dir() else []

    def remove(self, name: str) -> None:
        try:
            os.unlink(self._p(name))
        except FileNotFoundError:
            pass

    def remove_tree(self, name: str) -> None:
        import shutil

        shutil.rmtree(self._p(name), ignore_errors=True)

    def makedirs(self, name: str = "") -> None:
        self._p(name).mkdir(parents=True, exist_ok=True)

    def write_atomic(self, name: str, data: bytes, *, durable: bool = True) -> None:
        write_bytes_atomic(self._p(name), data, fsync=durable)

    def sync_root(self) -> None:
        fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def backend_reason(e: BaseException) -> str:
    """A storage backend's error in one line, with a hint where the cause is a usual one."""
    text = f"{type(e).__name__}: {e}"
    if type(e).__name__ in ("NoCredentialsError", "PartialCredentialsError"):
        text += " (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile, or pass storage_options)"
    return text


_OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss"})
"""fsspec protocols without real folders: a key's prefix is created by writing the key."""


class FsspecFS(OutputFS):
    """An fsspec URL prefix. The user's installed fsspec backend (s3fs, gcsfs, ...) does the I/O.

    Credentials and endpoints come from the backend's usual places (for S3: ``AWS_*``
    variables, ``~/.aws``, ``AWS_ENDPOINT_URL``) or from ``storage_options``. Listings are
    never taken from the backend's cache, since worker processes write the same prefix.
    """

    def __init__(self, url: str, *, storage_options: Mapping[str, Any] | None = None) -> None:
        try:
            import fsspec
        except ImportError as e:  # pragma: no cover - fsspec is a declared extra
            raise ImportError(f"writing to {url} needs fsspec: pip install 'shardify[remote]'") from e
        self.location = url.rstrip("/")
        self.fs: Any
        try:
            self.fs, self.path = fsspec.core.url_to_fs(self.location, **dict(storage_options or {}))
        except ImportError as e:
            raise OutputError(
                f"{self.location}: no storage backend for this URL ({e}); for s3:// install 'shardify[s3]'"
            ) from e
        protocols = self.fs.protocol if isinstance(self.fs.protocol, (tuple, list)) else (self.fs.protocol,)
        self.object_store = bool(_OBJECT_STORES.intersection(protocols))
        self.local = False

    def _p(self, name: str) -> str:
        return f"{self.path}/{name}" if name else self.path

    def open_write(self, name: str, *, durable: bool = False) -> BinaryIO:
        return cast(BinaryIO, self.fs.open(self._p(name), "wb"))

    def replace(self, src: str, dst: str) -> None:
        self.fs.mv(self._p(src), self._p(dst))

    def exists(self, name: str) -> bool:
        self.fs.invalidate_cache(self._p(name))
        return bool(self.fs.exists(self._p(name)))

    def size(self, name: str) -> int:
        self.fs.invalidate_cache(self._p(name))
        return int(self.fs.size(self._p(name)))

    def open_read(self, name: str) -> BinaryIO:
        return cast(BinaryIO, self.fs.open(self._p(name), "rb"))

    def listdir(self, prefix: str = "") -> list[str]:
        folder = self._p(prefix)
        self.fs.invalidate_cache(folder)
        if not self.fs.exists(folder):
            return []
        entries = self.fs.ls(folder, detail=True)
        return sorted(e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "file")

    def entries(self, prefix: str = "") -> list[str]:
        folder = self._p(prefix)
        self.fs.invalidate_cache(folder)
        if not self.fs.exists(folder):
            return []
        return sorted(n.rstrip("/").rsplit("/", 1)[-1] for n in self.fs.ls(folder, detail=False))

    def remove(self, name: str) -> None:
        if self.fs.exists(self._p(name)):
            self.fs.rm(self._p(name))

    def remove_tree(self, name: str) -> None:
        if self.fs.exists(self._p(name)):
            self.fs.rm(self._p(name), recursive=True)

    def makedirs(self, name: str = "") -> None:
        """Create a folder; on an object store, check instead (for the root) that the bucket
        exists and answers, so that a wrong bucket or credential fails here, naming the URL."""
        if not self.object_store:
            self.fs.makedirs(self._p(name), exist_ok=True)
            return
        if name:
            return
        bucket = self.path.split("/", 1)[0]
        try:
            self.fs.info(bucket)
        except FileNotFoundError as e:
            raise OutputError(
                f"{self.location}: bucket {bucket!r} does not exist (or is not visible with "
                "these credentials); create it first"
            ) from e
        except Exception as e:  # the backend's own errors (botocore's have no common base with OSError)
            raise OutputError(f"{self.location}: cannot reach the store: {backend_reason(e)}") from e

    def write_atomic(self, name: str, data: bytes, *, durable: bool = True) -> None:
        tmp = f"{name}.tmp-upload"
        self.fs.pipe_file(self._p(tmp), data)
        self.fs.mv(self._p(tmp), self._p(name))


def output_failed(fs: OutputFS, error: OSError) -> OutputError:
    """The error for ``error`` met while writing ``fs``: it names the output and says nothing
    was marked finished (a rerun resumes)."""
    return OutputError(f"{fs.location}: writing the output failed: {error}; nothing was marked finished")


@contextlib.contextmanager
def undone_on_failure(fs: OutputFS, undo: Callable[[], None]) -> Iterator[None]:
    """Run the block; if it raises, call ``undo`` (release the lock, drop the open shard) and
    re-raise, an OSError as :func:`output_failed`'s error."""
    try:
        yield
    except OSError as e:
        undo()
        raise output_failed(fs, e) from e
    except BaseException:
        undo()
        raise


def open_output(location: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None) -> OutputFS:
    """The OutputFS for a local path or an fsspec URL (``storage_options``: the backend's options)."""
    text = str(location)
    return FsspecFS(text, storage_options=storage_options) if is_url(text) else LocalFS(text)


class OutputLock:
    """An exclusive lock on a local output folder, so two conversions (or a conversion and
    ``shardify gc``) never write it at once.

    Object stores have no such lock; there, running two conversions into one prefix is the
    user's mistake to avoid (documented).
    """

    def __init__(self, fs: OutputFS) -> None:
        self.fs = fs
        fs.makedirs(WORK_DIR)
        self.f = None
        if isinstance(fs, LocalFS):
            self.f = open(fs.root / WORK_DIR / "lock", "a+")  # noqa: SIM115 - held until release
            try:
                fcntl.flock(self.f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as e:
                self.f.close()
                raise OutputError(f"{fs.location}: another shardify conversion is writing this folder") from e

    def release(self) -> None:
        """Unlock; remove the work folder when no unfinished split is left in it."""
        if not [n for n in self.fs.entries(WORK_DIR) if n != "lock"]:
            self.fs.remove_tree(WORK_DIR)
        if self.f is not None:
            fcntl.flock(self.f.fileno(), fcntl.LOCK_UN)
            self.f.close()


def is_locked(location: str | os.PathLike[str]) -> bool:
    """Whether a conversion holds the lock of the local output folder ``location`` now."""
    path = Path(location) / WORK_DIR / "lock"
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below
    except OSError:
        return False
    with f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        return False
