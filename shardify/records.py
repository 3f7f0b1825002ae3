"""Byte records appended in order: in memory up to a budget, beyond it in a temporary file.

What keeps the converter's driver flat in memory however many inputs it plans: the sample
table (~100 bytes a listing row) and the keys (~20 bytes) of a split are :class:`Records`.
Past :data:`SPILL_BYTES` held in memory, the records and their end offsets are written to two
unlinked temporary files (in ``$SHARDIFY_SPILL_DIR``, else the system's temporary folder)
and read back with ``os.pread``: the bytes stay in the OS page cache, out of the process's
resident memory, and worker processes forked from it read the same files.
"""

from __future__ import annotations

import os
import struct
import tempfile
from array import array
from collections.abc import Iterable, Iterator
from typing import IO, Any

import numpy as np

from shardify.errors import OutputError

__all__ = ["Records", "Repeats", "SPILL_BYTES", "SpillError", "repeated", "spill_dir"]

SPILL_BYTES = 8 << 20
"""Bytes of records (plus 8 per record for its end) held in memory before they go to disk."""
_END = struct.Struct("<q")
_TWO_ENDS = struct.Struct("<2q")


class SpillError(OutputError):
    """The temporary files of spilled records cannot be written (disk full, no such folder)."""

    def __init__(self, cause: OSError) -> None:
        folder = spill_dir() or tempfile.gettempdir()
        super().__init__(
            f"cannot write the converter's temporary files in {folder}: {cause.strerror or cause}; "
            "set SHARDIFY_SPILL_DIR to a folder with room (about 130 bytes a listing row)"
        )


def spill_dir() -> str | None:
    """Where spilled records go: ``$SHARDIFY_SPILL_DIR``, else None (the system's temporary folder)."""
    return os.environ.get("SHARDIFY_SPILL_DIR") or None


class Records:
    """Byte records in append order; O(1) append and random read, sequential reads in spans.

    Memory is at most ``spill_bytes`` (default :data:`SPILL_BYTES`) whatever the count: the
    records before the last ``spill_bytes`` worth live in a temporary file that disappears
    with the object (it is unlinked from the start).
    """

    def __init__(self, *, spill_bytes: int | None = None) -> None:
        self._limit = SPILL_BYTES if spill_bytes is None else spill_bytes
        self._data = bytearray()
        """The records not yet in the file, back to back."""
        self._ends = array("q")
        """Where each record held in memory ends, counted from the first record's start."""
        self._files: tuple[IO[bytes], IO[bytes]] | None = None
        """(records, their ends as little-endian int64s), once spilled."""
        self._flushed = 0
        """Records in the file."""
        self._flushed_bytes = 0

    def __len__(self) -> int:
        return self._flushed + len(self._ends)

    @property
    def spilled(self) -> bool:
        return self._files is not None

    @property
    def nbytes(self) -> int:
        """Bytes of all records and their ends, in memory and on disk."""
        return self._flushed_bytes + len(self._data) + 8 * len(self)

    @property
    def resident_bytes(self) -> int:
        """Bytes of records and ends held in memory."""
        return len(self._data) + 8 * len(self._ends)

    def append(self, record: bytes | bytearray) -> None:
        self._data += record
        self._ends.append(self._flushed_bytes + len(self._data))
        if len(self._data) + 8 * len(self._ends) > self._limit:
            self._flush()

    def extend(self, data: bytes | bytearray, ends: Any) -> None:
        """Append records given back to back in ``data``; ``ends`` (int64s, any buffer) says
        where each ends in ``data``."""
        base = self._flushed_bytes + len(self._data)
        self._data += data
        self._ends.frombytes((np.frombuffer(ends, dtype=np.int64) + base).astype("<i8").tobytes())
        if len(self._data) + 8 * len(self._ends) > self._limit:
            self._flush()

    def _flush(self) -> None:
        try:
            if self._files is None:
                folder = spill_dir()
                self._files = (
                    tempfile.TemporaryFile(prefix="shardify-records-", dir=folder),
                    tempfile.TemporaryFile(prefix="shardify-ends-", dir=folder),
                )
            data_file, ends_file = self._files
            _pwrite_all(data_file.fileno(), self._data, self._flushed_bytes)
            _pwrite_all(
                ends_file.fileno(), np.frombuffer(self._ends, dtype=np.int64).astype("<i8").tobytes(), 8 * self._flushed
            )
        except OSError as e:
            raise SpillError(e) from e
        self._flushed += len(self._ends)
        self._flushed_bytes += len(self._data)
        self._data = bytearray()
        self._ends = array("q")

    def _file_bounds(self, i: int) -> tuple[int, int]:
        """Start and end of record ``i`` (in the file) in the whole store."""
        fd = self._files[1].fileno()  # type: ignore[index]
        if i == 0:
            return 0, _END.unpack(os.pread(fd, 8, 0))[0]
        return _TWO_ENDS.unpack(os.pread(fd, 16, 8 * (i - 1)))

    def __getitem__(self, i: int) -> bytes | bytearray:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"record {i} of {n}")
        k = i - self._flushed
        if k >= 0:
            fb, ends = self._flushed_bytes, self._ends
            return self._data[(ends[k - 1] if k else fb) - fb : ends[k] - fb]
        start, end = self._file_bounds(i)
        return os.pread(self._files[0].fileno(), end - start, start)  # type: ignore[index]

    def take(self, indices: Iterable[int]) -> Iterator[bytes | bytearray]:
        """The records at ``indices`` (each in ``range(len(self))``), in that order."""
        if self._files is None:
            data, ends = self._data, self._ends
            for i in indices:
                yield data[ends[i - 1] if i else 0 : ends[i]]
            return
        pread, two = os.pread, _TWO_ENDS.unpack
        data_fd, ends_fd = self._files[0].fileno(), self._files[1].fileno()
        flushed, get = self._flushed, self.__getitem__
        for i in indices:
            if 0 < i < flushed:  # (the common case, inline: a plan reads millions)
                start, end = two(pread(ends_fd, 16, 8 * i - 8))
                yield pread(data_fd, end - start, start)
            else:
                yield get(i)

    def spans(
        self, start: int = 0, stop: int | None = None, *, chunk: int = 1 << 14
    ) -> Iterator[tuple[bytes | bytearray, np.ndarray]]:
        """Records ``start..stop`` (default: all) read in order, ``chunk`` at a time: each
        span is ``(data, ends)``, its records back to back and where each ends in ``data``."""
        stop = len(self) if stop is None else min(stop, len(self))
        for lo in range(start, stop, chunk):
            yield self._span(lo, min(lo + chunk, stop))

    def _span(self, lo: int, hi: int) -> tuple[bytes | bytearray, np.ndarray]:
        flushed, fb = self._flushed, self._flushed_bytes
        parts = []
        if lo < flushed:
            fd = self._files[1].fileno()  # type: ignore[index]
            a = max(lo - 1, 0)
            raw = np.frombuffer(os.pread(fd, 8 * (min(hi, flushed) - a), 8 * a), dtype="<i8")
            parts.append(raw if lo == 0 else raw[1:])
            first = 0 if lo == 0 else int(raw[0])
        else:
            k = lo - flushed
            first = self._ends[k - 1] if k else fb
        if hi > flushed:
            mem = np.frombuffer(self._ends, dtype=np.int64)
            parts.append(mem[max(lo - flushed, 0) : hi - flushed])
        ends = np.concatenate(parts) if len(parts) > 1 else parts[0]
        last = int(ends[-1])
        if first >= fb:
            data: bytes | bytearray = self._data[first - fb : last - fb]
        elif last <= fb:
            data = os.pread(self._files[0].fileno(), last - first, first)  # type: ignore[index]
        else:
            data = os.pread(self._files[0].fileno(), fb - first, first) + self._data[: last - fb]  # type: ignore[index]
        return data, ends.astype(np.int64) - first

    def __iter__(self) -> Iterator[bytes | bytearray]:
        for data, ends in self.spans():
            begin = 0
            for end in ends.tolist():
                yield data[begin:end]
                begin = end

    def __getstate__(self) -> dict[str, Any]:
        """Pickled as records in memory (a spilled store's files belong to its process)."""
        data = bytearray()
        ends = array("q")
        for chunk, chunk_ends in self.spans():
            ends.frombytes((chunk_ends + len(data)).tobytes())
            data += chunk
        return {"_limit": self._limit, "_data": data, "_ends": ends, "_files": None, "_flushed": 0, "_flushed_bytes": 0}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


_BUCKET_BITS = 8
"""A spilled :class:`Repeats` sorts its values into 2**8 files by their top bits."""
_PAIR = np.dtype([("value", "<i8"), ("index", "<i8")])
_SLICE = 1 << 16


class Repeats:
    """int64 values appended in order (hashes), to find the indices of those that occur more
    than once: in memory up to ``spill_bytes`` (8 bytes a value; default a quarter of
    :data:`SPILL_BYTES`, as finding them sorts copies), beyond it as (value, index)
    pairs in 256 temporary files by the value's top 8 bits, each file checked alone, so
    memory is one file's pairs (16 bytes a value over 256: 4 MB at 64 M values)."""

    def __init__(self, *, spill_bytes: int | None = None) -> None:
        self._limit = SPILL_BYTES // 4 if spill_bytes is None else spill_bytes  # (sorted in copies)
        self._values = array("q")
        self._buckets: list[IO[bytes]] | None = None
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def extend(self, values: Iterable[int]) -> None:
        chunk = array("q", values)
        if self._buckets is None:
            self._values.extend(chunk)
            if 8 * len(self._values) > self._limit:
                try:
                    folder = spill_dir()
                    self._buckets = [
                        tempfile.TemporaryFile(prefix="shardify-hashes-", dir=folder) for _ in range(1 << _BUCKET_BITS)
                    ]
                    held, self._values = self._values, array("q")
                    self._spill(np.frombuffer(held, dtype=np.int64), 0)
                except OSError as e:
                    raise SpillError(e) from e
        else:
            try:
                self._spill(np.frombuffer(chunk, dtype=np.int64), self._count)
            except OSError as e:
                raise SpillError(e) from e
        self._count += len(chunk)

    def _spill(self, values: np.ndarray, base: int) -> None:
        if len(values) > _SLICE:  # a few MB of temporaries at a time
            for lo in range(0, len(values), _SLICE):
                self._spill(values[lo : lo + _SLICE], base + lo)
            return
        assert self._buckets is not None, "spilled"
        which = (values.view(np.uint64) >> np.uint64(64 - _BUCKET_BITS)).astype(np.intp)
        by = np.argsort(which, kind="stable")
        pairs = np.empty(len(values), dtype=_PAIR)
        pairs["value"] = values[by]
        pairs["index"] = by + base
        pos = 0
        for bucket, count in enumerate(np.bincount(which, minlength=1 << _BUCKET_BITS).tolist()):
            if count:
                self._buckets[bucket].write(pairs[pos : pos + count].tobytes())
                pos += count

    def repeated(self) -> list[int]:
        """The indices, in increasing order, of the values that occur more than once."""
        if self._buckets is None:
            return repeated(self._values)
        found: list[int] = []
        for f in self._buckets:
            f.flush()
            f.seek(0)
            pairs = np.frombuffer(f.read(), dtype=_PAIR)
            f.seek(0, os.SEEK_END)
            if len(pairs) > 1:
                found += pairs["index"][repeated(np.ascontiguousarray(pairs["value"]))].tolist()
        return sorted(found)


def repeated(values: Any) -> list[int]:
    """The indices, in increasing order, of the values that occur more than once in
    ``values`` (int64s, any buffer)."""
    flat = np.frombuffer(values, dtype=np.int64)
    ordered = np.sort(flat)
    if not (ordered[1:] == ordered[:-1]).any():
        return []  # the usual case, in the memory of one copy
    by_value = np.argsort(flat, kind="stable")
    ordered = flat[by_value]
    same = ordered[1:] == ordered[:-1]
    twice = np.zeros(len(flat), dtype=bool)
    twice[1:] = same
    twice[:-1] |= same
    out: list[int] = np.sort(by_value[twice]).tolist()
    return out


def _pwrite_all(fd: int, data: bytes | bytearray, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n
