"""A local shard file that writes what it is given without copying it, and writes behind.

The shard writer hands over each image's bytes as read, between small joined headers.
:class:`GatherFile` keeps references to them and writes ~1 MiB at a time with one
``writev``, so the bytes are copied once, into the page cache (a buffered file would copy
them into its buffer first). When the file will be fsynced (``write_behind``), it asks the
kernel to start writing each 2 MiB to disk as soon as it is written (Linux
``sync_file_range``, a hint), so the disk works while the next samples are read and the
fsync at the end waits only for the last 2 MiB instead of the whole shard.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import TracebackType

__all__ = ["GatherFile", "GATHER_BYTES", "WRITE_BEHIND_BYTES"]

GATHER_BYTES = 1 << 20
"""Bytes gathered before one ``writev``."""
_GATHER_PARTS = 512
"""Pieces gathered at most before one ``writev`` (Linux takes up to 1,024)."""
WRITE_BEHIND_BYTES = 2 << 20
"""Bytes written between two requests to start writing them to disk."""
_SYNC_FILE_RANGE_WRITE = 2
"""``SYNC_FILE_RANGE_WRITE``: start writing the range's dirty pages, do not wait."""

_sync_file_range: Callable[[int, int, int], object] | None = None
_looked_up = False


def start_writeback(fd: int, offset: int, nbytes: int) -> bool:
    """Ask the kernel to start writing ``nbytes`` of ``fd`` from ``offset`` to disk, without
    waiting; False where that cannot be asked (the fsync later does the whole work)."""
    global _sync_file_range, _looked_up
    if not _looked_up:
        _sync_file_range, _looked_up = _load_sync_file_range(), True
    if _sync_file_range is None:
        return False
    _sync_file_range(fd, offset, nbytes)  # a hint: a failure to write shows at the fsync
    return True


def _load_sync_file_range() -> Callable[[int, int, int], object] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return lambda fd, offset, nbytes: fn(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)


class GatherFile:
    """A new local file (created or truncated, mode 0666 less the umask) taking ``write``
    calls of bytes, kept by reference until written; any other buffer (which could change
    once the call returns) is written before ``write`` returns."""

    def __init__(self, path: str | os.PathLike[str], *, write_behind: bool = False) -> None:
        self.name = os.fspath(path)
        self._fd = os.open(self.name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o666)
        self._parts: list[bytes | memoryview] = []
        self._pending = 0
        self._written = 0
        self._behind = 0
        """Bytes from the start whose write to disk has been asked for."""
        self._write_behind = write_behind
        self.closed = False

    def write(self, data: bytes | memoryview) -> int:
        if self.closed:
            raise ValueError(f"{self.name}: write to a closed file")
        n = len(data) if type(data) is bytes else memoryview(data).nbytes
        self._parts.append(data)
        self._pending += n
        if self._pending >= GATHER_BYTES or len(self._parts) >= _GATHER_PARTS or type(data) is not bytes:
            self.flush()  # a buffer that may change (a memoryview of a reused slot) is written now
        return n

    def flush(self) -> None:
        """Write what was gathered; start writing it to disk when ``write_behind`` and 2 MiB
        have come since the last start."""
        parts, total = self._parts, self._pending
        if not parts:
            return
        self._parts, self._pending = [], 0
        done = os.writev(self._fd, parts)
        if done < total:  # a short write (a signal, or the disk filling up): write the rest
            rest = memoryview(b"".join(parts))[done:]  # bytes.join takes any buffer
            while rest:
                rest = rest[os.write(self._fd, rest) :]
        self._written += total
        if self._write_behind and self._written - self._behind >= WRITE_BEHIND_BYTES:
            self._write_behind = start_writeback(self._fd, self._behind, self._written - self._behind)
            self._behind = self._written

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        if self.closed:
            return
        try:
            self.flush()
        finally:
            self.closed = True
            os.close(self._fd)

    def __enter__(self) -> GatherFile:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
