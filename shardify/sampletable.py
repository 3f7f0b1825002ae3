"""A shard's per-sample table: where each sample's bytes are and what they hash to.

A split index may list, per shard, one record per sample: the length of the sample's tar
bytes (its members' headers, data and padding, from its first header to the next sample's)
as a little-endian ``uint32``, their CRC-32 (zlib's, the same polynomial as gzip's) as a
little-endian ``uint32``, then the first 16 bytes of their SHA-256: 24 bytes a sample.
Sample ``i`` starts where sample ``i - 1`` ends (sample 0 at byte 0). In the JSON index the
table is the shard's ``samples`` field, base64. It lets a reader fetch exactly the byte ranges
of the samples it reads (HTTP ``Range``), and check every sample it reads without hashing the
whole shard. Shards of a chunked split, and samples of 4 GiB or more, have no table.

Two checksums, for two threats. A sample read from a shard file (local, or fetched whole and
checked against the shard's SHA-256 on arrival) is checked by default against its CRC-32: it
catches accidental change (a flipped bit, a torn write, a file edited in place) at about a
fifth of a SHA-256's cost (docs/reliability.md). A sample fetched by byte range from a server
is checked against its SHA-256 prefix, since the server may be the one changing it: a CRC-32
can be forged at will, 128 bits of SHA-256 cannot.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from shardify.crc import crc32
from shardify.errors import ManifestError

__all__ = [
    "DIGEST_BYTES",
    "CRC_BYTES",
    "RECORD",
    "RECORD_DTYPE",
    "sample_digest",
    "SampleRanges",
    "SampleTable",
    "TableBuilder",
    "table_from_json",
]

DIGEST_BYTES = 16
"""Bytes of each sample's SHA-256 kept in its record: the first 16."""
CRC_BYTES = 4
"""Bytes of each sample's CRC-32 in its record, little-endian."""
RECORD = struct.Struct(f"<II{DIGEST_BYTES}s")
RECORD_DTYPE = np.dtype([("size", "<u4"), ("crc", "<u4"), ("digest", f"S{DIGEST_BYTES}")])
"""A record as NumPy reads it: the same 24 bytes as :data:`RECORD`."""
_MAX_SIZE = (1 << 32) - 1


_HELD_PIECE = 2047
"""hashlib lets other threads run while it hashes 2,048 bytes or more at once (it releases the
interpreter lock, then must take it back); fed pieces shorter than that, it keeps the lock."""
_HELD_UP_TO = 64 << 10
"""Samples up to this size are hashed in pieces of :data:`_HELD_PIECE`, keeping the lock."""


def sample_digest(data: bytes | memoryview) -> bytes:
    """The SHA-256 prefix the table keeps of ``data`` (what a ranged read is checked against).

    A small sample is hashed without letting go of the interpreter lock: a fetch thread
    checking each sample of a batch would otherwise hand the lock over and wait for it back
    once a sample, which under a busy main thread cost more than the hash itself (5 KiB samples
    fetched ahead: 11.5 us of a thread's CPU a sample against 4.1 alone; 3.4 us in pieces)."""
    n = len(data)
    if n <= _HELD_PIECE or n > _HELD_UP_TO:  # (up to a piece, one call keeps the lock anyway)
        return hashlib.sha256(data).digest()[:DIGEST_BYTES]
    view = memoryview(data)
    h = hashlib.sha256(view[:_HELD_PIECE])
    for at in range(_HELD_PIECE, n, _HELD_PIECE):
        h.update(view[at : at + _HELD_PIECE])
    return h.digest()[:DIGEST_BYTES]


@dataclass(frozen=True)
class SampleTable:
    """The decoded table of one shard: ``starts[i]`` and ``sizes[i]`` of sample ``i`` in bytes."""

    raw: bytes

    def __len__(self) -> int:
        return len(self.raw) // RECORD.size

    def records(self) -> Iterator[tuple[int, int, bytes]]:
        return (r for r in RECORD.iter_unpack(self.raw))

    def starts(self) -> np.ndarray:
        """The byte offset of each sample in the shard (int64): the lengths before it, summed."""
        starts = np.zeros(len(self), dtype=np.int64)
        np.cumsum(_sizes(self.raw)[:-1], dtype=np.int64, out=starts[1:])
        return starts

    def ranges(self) -> SampleRanges:
        """``(start, stop, digest)`` of every sample, in bytes of the shard."""
        return SampleRanges(self.raw)

    def problem(self, *, nsamples: int, filesize: int) -> str | None:
        """Why this table cannot be the shard's (None: it fits its count and size; each range
        is checked against its digest when it is read)."""
        if len(self.raw) != nsamples * RECORD.size:
            return f"{len(self.raw)} bytes, want {RECORD.size} per sample ({nsamples} samples)"
        sizes = _sizes(self.raw)
        end = int(sizes.sum(dtype=np.uint64))
        if end > filesize:
            return f"its samples end at byte {end}, past the shard's {filesize} bytes"
        if not sizes.all():
            return "a sample of 0 bytes"
        return None


class TableBuilder:
    """Builds a shard's table from the bytes written to it: :meth:`mark` where each sample
    starts and where the last ends, :meth:`feed` every byte in order."""

    def __init__(self) -> None:
        self._marks: list[int] = []
        self._crc: int | None = None
        self._sha = hashlib.sha256()
        self._start = 0
        self._pos = 0
        self._records = bytearray()
        self.broken = False
        """A sample was too large for the table: it is dropped (:meth:`table` is empty)."""

    def mark(self, at: int) -> None:
        """A sample starts (or the last one ends) at byte ``at`` (not before what was fed)."""
        if at == self._pos:
            self._cut()
        else:
            self._marks.append(at)

    def feed(self, data: bytes | memoryview) -> None:
        view = data if type(data) is bytes else memoryview(data).cast("B")
        n = len(view)
        if not self._marks or self._marks[0] >= self._pos + n:  # within one sample: most writes
            if self._crc is not None and n:
                self._crc = crc32(view, self._crc)
                self._sha.update(view)
            self._pos += n
            return
        view = memoryview(view)
        while self._marks and self._marks[0] < self._pos + len(view):
            n = self._marks.pop(0) - self._pos
            self._update(view[:n])
            view = view[n:]
            self._cut()
        self._update(view)

    def _update(self, view: memoryview) -> None:
        if self._crc is not None and len(view):
            self._crc = crc32(view, self._crc)
            self._sha.update(view)
        self._pos += len(view)

    def _cut(self) -> None:
        if self._crc is not None:
            size = self._pos - self._start
            if size > _MAX_SIZE:
                self.broken = True
            else:
                self._records += RECORD.pack(size, self._crc, self._sha.digest()[:DIGEST_BYTES])
        self._crc, self._sha, self._start = 0, hashlib.sha256(), self._pos

    def table(self, nsamples: int) -> bytes:
        """The table, once the last sample's end was marked; empty if it does not hold
        ``nsamples`` records (a chunked shard, never marked) or a sample was too large."""
        if self.broken or len(self._records) != nsamples * RECORD.size:
            return b""
        return bytes(self._records)


class SampleRanges(Sequence[tuple[int, int, bytes]]):
    """``(start, stop, digest)`` of each sample of a table (``digest``: its SHA-256 prefix), made
    on access: the table's records, one 8-byte end and one 4-byte CRC-32 a sample are all it
    holds besides them (a reader keeps those of every shard it reads, so not three Python objects
    a sample). :attr:`ends` (``ends[i]`` and
    ``ends[i + 1]`` bound sample ``i``) and :attr:`crcs` (each sample's CRC-32 as an int) are
    there for a reader's per-sample loop, at no method call's cost."""

    def __init__(self, raw: bytes) -> None:
        self._raw = raw
        ends = np.zeros(len(raw) // RECORD.size + 1, dtype="<i8")
        np.cumsum(_sizes(raw), dtype="<i8", out=ends[1:])
        self.ends = array("q")
        self.ends.frombytes(ends.tobytes())  # an array: indexing gives a Python int, at no numpy cost
        self.crcs = array("I")
        whole = raw[: len(raw) // RECORD.size * RECORD.size]
        self.crcs.frombytes(np.frombuffer(whole, dtype=RECORD_DTYPE)["crc"].astype(np.uint32).tobytes())

    def __len__(self) -> int:
        return len(self.ends) - 1

    @overload
    def __getitem__(self, i: int) -> tuple[int, int, bytes]: ...
    @overload
    def __getitem__(self, i: slice) -> list[tuple[int, int, bytes]]: ...
    def __getitem__(self, i: int | slice) -> tuple[int, int, bytes] | list[tuple[int, int, bytes]]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample {i} of a table of {n}")
        return self.ends[i], self.ends[i + 1], self.digest(i)

    def digest(self, i: int) -> bytes:
        """Sample ``i``'s SHA-256 prefix (``i`` in range: no check)."""
        at = i * RECORD.size + 4 + CRC_BYTES
        return self._raw[at : at + DIGEST_BYTES]


def _sizes(raw: bytes) -> np.ndarray:
    """The uint32 sample lengths of a table's records."""
    return np.frombuffer(raw, dtype=RECORD_DTYPE)["size"]


def table_from_json(text: Any, where: str) -> bytes:
    """The table in an index entry's ``samples`` field (base64) at ``where``; else ManifestError."""
    if not isinstance(text, str):
        raise ManifestError(f"{where}: field 'samples' should be a base64 str, found {str(text)[:40]!r}")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ManifestError(f"{where}: field 'samples' is not base64: {e}") from e
