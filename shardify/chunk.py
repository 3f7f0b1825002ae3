"""The chunked shard layout: N consecutive samples stored as one tar "sample" of stacked fields.

A chunk of ``n`` samples is written as the members of one tar sample whose key is the key
of its first sample (so member names stay unique in a split and sorted by key):

- ``{key}.chunk-keys``: the ``n`` sample keys, in order, as a *variable* member (below).
- ``{key}.{ext}`` for every field any sample of the chunk has, either
  - *stacked*: a plain ``.npy`` (format 1.0) of shape ``(n, *shape)``, when the field is an
    ``npy`` field that every sample has with the same header (dtype, shape, C order); sample
    ``i`` is ``array[i]``, a view; or
  - *variable*: ``SHRDVAR1`` (8 bytes), ``n`` and ``flags`` (little-endian uint64 each),
    ``n + 1`` little-endian uint64 end offsets into the data (the first 0), then, when
    ``flags & 1``, ``n`` presence bytes (1: the sample has the field), then the data: the
    per-sample member bytes (as the per-sample layout would store them) one after another.
    Sample ``i`` is ``data[offsets[i]:offsets[i + 1]]``.

Everything is a pure function of the samples, so the same samples give the same bytes.
:func:`encode_chunk` makes the members; :func:`decode_chunk` checks them and returns the
columns that slice a sample out without copying the chunk.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from shardify import CHUNKED_FORMAT_VERSION
from shardify.errors import ArrayFormatError, EncodeError, ShardFormatError
from shardify.npy import npy_header, npy_layout, view_array

__all__ = [
    "KEYS_EXT",
    "VAR_MAGIC",
    "CHUNKED_FORMAT_VERSION",
    "encode_chunk",
    "encode_variable",
    "decode_chunk",
    "chunk_keys",
    "member_layout",
    "head_bytes",
    "MemberLayout",
    "Chunk",
    "Stacked",
    "Variable",
    "chunk_count",
    "chunk_samples",
]

KEYS_EXT = "chunk-keys"
"""The member holding a chunk's sample keys; a field of this name cannot be chunked."""
VAR_MAGIC = b"SHRDVAR1"

_HEAD = struct.Struct("<8sQQ")
_HAS_PRESENCE = 1


def chunk_count(nsamples: int, chunk: int) -> int:
    """Chunks a shard of ``nsamples`` holds: every chunk has ``chunk`` samples but the last."""
    return -(-nsamples // chunk)


def chunk_samples(nsamples: int, chunk: int, index: int) -> int:
    """Samples in chunk ``index`` of a shard of ``nsamples``."""
    return min(chunk, nsamples - index * chunk)


def encode_variable(values: Sequence[bytes | None]) -> bytes:
    """A variable member of ``values`` (None: the sample lacks the field)."""
    ends = np.zeros(len(values) + 1, dtype="<u8")
    absent = None in values
    np.cumsum([0 if v is None else len(v) for v in values], out=ends[1:])
    parts = [_HEAD.pack(VAR_MAGIC, len(values), _HAS_PRESENCE if absent else 0), ends.tobytes()]
    if absent:
        parts.append(bytes(0 if v is None else 1 for v in values))
    parts.extend(v for v in values if v is not None)
    return b"".join(parts)


def _stacked(values: Sequence[bytes | None]) -> bytes | None:
    """The stacked ``.npy`` of ``values``, or None when they cannot be stacked (a sample lacks
    the field, headers differ, not a whole C-order ``.npy`` of a plain or raw-view dtype)."""
    first = values[0]
    if first is None:
        return None
    try:
        array = view_array(first)
    except (ArrayFormatError, ValueError):
        return None
    if not array.flags.c_contiguous and array.ndim > 1:  # fortran order
        return None
    start = len(first) - array.nbytes
    head = first[:start]
    if any(v is None or len(v) != len(first) or v[:start] != head for v in values):
        return None
    descr = repr(np.lib.format.dtype_to_descr(array.dtype))
    return b"".join([npy_header(descr, (len(values), *array.shape))] + [v[start:] for v in values])  # type: ignore[index]


def encode_chunk(keys: Sequence[str], samples: Sequence[Sequence[tuple[str, bytes]]]) -> list[tuple[str, bytes]]:
    """The members (sorted ``(ext, data)`` pairs) of one chunk of ``samples`` with ``keys``."""
    columns: dict[str, list[bytes | None]] = {}
    for i, (key, members) in enumerate(zip(keys, samples)):
        for ext, data in members:
            column = columns.get(ext)
            if column is None:  # not setdefault: its default would be a new list per member
                if ext == KEYS_EXT:
                    raise EncodeError(f"sample {key!r}: field {KEYS_EXT!r} is reserved in the chunked layout")
                column = columns[ext] = [None] * len(keys)
            column[i] = data
    out = [(KEYS_EXT, encode_variable([k.encode("ascii") for k in keys]))]
    for ext, values in columns.items():
        stacked = _stacked(values) if ext.rpartition(".")[2] == "npy" else None
        out.append((ext, stacked if stacked is not None else encode_variable(values)))
    out.sort(key=lambda m: m[0])
    return out


@dataclass(frozen=True, slots=True)
class Stacked:
    """A stacked field over samples ``first..``: sample ``i`` is ``array[i - first]``, a
    read-only view of the bytes read."""

    array: np.ndarray
    first: int = 0

    def value(self, i: int) -> np.ndarray:
        row: np.ndarray = self.array[i - self.first]
        return row


@dataclass(frozen=True, slots=True)
class Variable:
    """A variable field: sample ``i`` is ``data[base + ends[i]:base + ends[i + 1]]`` (its own
    bytes); None when the sample lacks the field."""

    data: bytes | memoryview
    base: int
    ends: list[int]
    present: bytes | None

    def value(self, i: int) -> bytes | None:
        if self.present is not None and not self.present[i]:
            return None
        return bytes(self.data[self.base + self.ends[i] : self.base + self.ends[i + 1]])


def head_bytes(n: int, head: bytes | None = None) -> int:
    """Bytes of a member's start that hold its layout for a chunk of ``n`` samples: a variable
    member's tables, or a stacked member's ``.npy`` header. Given the ``head`` read so far,
    the bytes its ``.npy`` header needs (0 when it has them)."""
    if head is None:
        return max(128, _HEAD.size + 9 * n + 8)
    if head[:6] != b"\x93NUMPY" or len(head) < 12:
        return 0
    end = 10 + (head[8] | head[9] << 8) if head[6] == 1 else 12 + int.from_bytes(head[8:12], "little")
    return end if end > len(head) else 0


@dataclass(frozen=True, slots=True)
class MemberLayout:
    """Where the samples of one chunk member lie (byte offsets from the member's start)."""

    start: int
    """Where the samples' data begins."""
    ends: list[int] | None
    """Variable member: end of each sample's data, from ``start`` (``ends[0]`` is 0)."""
    present: bytes | None = None
    dtype: np.dtype | None = None
    shape: tuple[int, ...] = ()
    """Stacked member: one sample's dtype and shape."""

    @property
    def row(self) -> int:
        """Bytes per sample of a stacked member."""
        count = 1
        for d in self.shape:
            count *= d
        return count * self.dtype.itemsize if self.dtype is not None else 0

    def span(self, lo: int, hi: int) -> tuple[int, int]:
        """The byte range of the member that holds samples ``lo..hi-1``."""
        if self.ends is None:
            return self.start + lo * self.row, self.start + hi * self.row
        return self.start + self.ends[lo], self.start + self.ends[hi]

    def column(self, data: bytes | memoryview, lo: int, hi: int) -> Stacked | Variable:
        """The column of samples ``lo..hi-1`` from ``data``, the bytes of :meth:`span` (no copy)."""
        if self.ends is None:
            dtype: np.dtype = self.dtype  # type: ignore[assignment]  # set for stacked members
            array = np.frombuffer(
                data, dtype=dtype, count=(hi - lo) * (self.row // dtype.itemsize) if dtype.itemsize else 0
            )
            return Stacked(array.reshape((hi - lo, *self.shape)), lo)
        return Variable(data, -self.ends[lo], self.ends, self.present)


def member_layout(head: bytes | memoryview, size: int, n: int, what: str) -> MemberLayout:
    """The layout of a chunk member of ``size`` bytes for ``n`` samples from its first bytes
    (:func:`head_bytes`, or all of it); ValueError naming ``what`` when it cannot be right."""
    if bytes(head[:6]) == b"\x93NUMPY":
        dtype, shape, fortran, nbytes, offset = npy_layout(head)
        if dtype.hasobject or fortran or not shape or shape[0] != n or offset + nbytes != size:
            raise ValueError(
                f"{what}: stacked array {dtype} {shape} of {nbytes} bytes at {offset} "
                f"in a member of {size}, the chunk has {n} samples"
            )
        return MemberLayout(start=offset, ends=None, dtype=dtype, shape=tuple(shape[1:]))
    if len(head) < _HEAD.size:
        raise ValueError(f"{what}: {size} bytes, too short for a chunk member")
    magic, count, flags = _HEAD.unpack_from(head)
    if magic != VAR_MAGIC:
        raise ValueError(f"{what}: starts {bytes(magic)!r}, neither {VAR_MAGIC!r} nor a .npy")
    if count != n or flags & ~_HAS_PRESENCE:
        raise ValueError(f"{what}: holds {count} samples (flags {flags}), the chunk has {n}")
    at = _HEAD.size + 8 * (count + 1)
    base = at + (count if flags & _HAS_PRESENCE else 0)
    if min(size, len(head)) < base:
        raise ValueError(f"{what}: {size} bytes, its table of {count} samples needs {base}")
    ends = np.frombuffer(head, dtype="<u8", count=count + 1, offset=_HEAD.size)
    if ends[0] != 0 or np.any(ends[1:] < ends[:-1]) or int(ends[-1]) != size - base:
        raise ValueError(f"{what}: offsets are not increasing from 0 to the {size - base} data bytes")
    return MemberLayout(start=base, ends=ends.tolist(), present=bytes(head[at:base]) if flags & _HAS_PRESENCE else None)


def chunk_keys(data: bytes | memoryview, n: int) -> list[str]:
    """The sample keys of a chunk of ``n`` samples, from its whole keys member."""
    layout = member_layout(data, len(data), n, f"field {KEYS_EXT!r}")
    if layout.ends is None or layout.present is not None:
        raise ValueError(f"field {KEYS_EXT!r}: not a list of {n} keys")
    s = layout.start
    return [bytes(data[s + a : s + b]).decode("ascii") for a, b in zip(layout.ends, layout.ends[1:])]


@dataclass(frozen=True, slots=True)
class Chunk:
    """A decoded chunk (or a block of its samples): its sample keys and one column per field."""

    keys: list[str]
    columns: dict[str, Stacked | Variable]

    def sample(self, i: int) -> dict[str, object]:
        """The fields of sample ``i`` (views or the sample's own bytes; no copy of the chunk)."""
        out: dict[str, object] = {"__key__": self.keys[i]}
        for ext, column in self.columns.items():
            v = column.value(i)
            if v is not None:
                out[ext] = v
        return out


def decode_chunk(members: Mapping[str, object], *, shard: str, key: str, count: int | None = None) -> Chunk:
    """Check and decode a chunk's members (ext -> bytes); ``count``: the samples it must hold.

    A member that is not as :func:`encode_chunk` writes it raises :class:`ShardFormatError`
    naming the shard, the chunk's key and the field."""
    raw = members.get(KEYS_EXT)
    if not isinstance(raw, (bytes, memoryview)):
        raise ShardFormatError(f"chunk has no {KEYS_EXT!r} member (not a chunked shard?)", shard=shard, key=key)
    try:
        if count is None:
            count = _HEAD.unpack_from(raw)[1] if len(raw) >= _HEAD.size else 0
        keys = chunk_keys(raw, count)
        columns: dict[str, Stacked | Variable] = {}
        for ext, data in members.items():
            if ext.startswith("__") or ext == KEYS_EXT or not isinstance(data, (bytes, memoryview)):
                continue
            layout = member_layout(data, len(data), len(keys), f"field {ext!r}")
            columns[ext] = layout.column(memoryview(data)[layout.start :], 0, len(keys))
    except (ValueError, UnicodeDecodeError) as e:  # ArrayFormatError is a ValueError
        raise ShardFormatError(f"damaged chunk: {e}", shard=shard, key=key) from e
    if not keys:
        raise ShardFormatError("damaged chunk: it holds no sample", shard=shard, key=key)
    return Chunk(keys, columns)
