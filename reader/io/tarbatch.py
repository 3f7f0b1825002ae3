"""A batch of samples' tar bytes parsed at once, with NumPy over the whole batch.

The samples of a batch, read and checked (:mod:`~shardify.reader.io.samplebytes`), lie one after
another in one ``uint8`` buffer. What shardify writes is the plain case of
:mod:`~shardify.reader.io.sampleparse`: ustar headers of regular files, one key, each field once,
each member's data padded to the block, the last one ending the sample. When every sample of
the batch is that case with the same fields in the same order (as every sample of a split
converted with one field set is), :func:`parse_batch` finds each member's data offset and size
for the whole batch with a few array operations per member (no per-sample header parsing) and
gives one :class:`~shardify.reader.io.columns.Spans` column per field. Anything else gives None: the caller parses those
samples one by one (:func:`~shardify.reader.io.sampleparse.parse_sample`), with its errors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardify.reader.io.columns import Spans, uniform_rows
from shardify.tarfmt import BLOCK

__all__ = ["TarBatch", "parse_batch"]

_NAME = np.arange(100)
_HEAD = 346
"""Header bytes parsed: the name (0..99), the size (124..135), the type flag (156) and the
first byte of the ustar prefix (345)."""
_COLS = np.arange(_HEAD)
_POW8 = 8 ** np.arange(10, -1, -1, dtype=np.int64)
_REGULAR = (ord("0"), 0)
_MAX_MEMBERS = 64
"""More members than this per sample: parsed one by one."""


@dataclass(frozen=True, slots=True)
class TarBatch:
    """Where each sample's key and each field's bytes lie in the batch buffer."""

    key_at: np.ndarray
    key_len: np.ndarray
    fields: dict[str, Spans]

    def keys(self, data: np.ndarray) -> list[str]:
        """Each sample's key (ASCII, as the tar headers name it)."""
        return [data[a : a + n].tobytes().decode("ascii") for a, n in zip(self.key_at.tolist(), self.key_len.tolist())]


def _headers(data: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The first :data:`_HEAD` bytes of the headers at ``at`` (each at least a block before
    the end of ``data``), one row each: a strided view when they lie at one stride (samples
    alike), else gathered."""
    view = uniform_rows(data, at, _HEAD)
    if view is not None:
        return view
    gathered: np.ndarray = data[at[:, None] + _COLS]
    return gathered


def parse_batch(data: np.ndarray, starts: np.ndarray, stops: np.ndarray, *, max_member: int) -> TarBatch | None:
    """The members of the samples ``data[starts[j]:stops[j]]`` (see the module); None unless
    every one is the plain case with the first sample's fields, in its order."""
    if not len(starts):
        return None
    at = starts.astype(np.int64, copy=True)
    fields: dict[str, Spans] = {}
    key_len: np.ndarray | None = None
    key_name: np.ndarray | None = None
    for _ in range(_MAX_MEMBERS):
        if np.any(at + BLOCK > stops):
            return None
        head = _headers(data, at)
        # a regular file, its whole name in the name field (no ustar prefix, no extension header)
        if not np.all((head[:, 156] == _REGULAR[0]) | (head[:, 156] == _REGULAR[1])) or np.any(head[:, 345]):
            return None
        digits = head[:, 124:135].astype(np.int64) - ord("0")
        if np.any((digits < 0) | (digits > 7)):  # the writer's 11 octal digits (else: one by one)
            return None
        size = digits @ _POW8
        if np.any(size > max_member):
            return None
        name = head[:, :100]
        dot = np.argmax(name == ord("."), axis=1)
        end = np.argmax(name == 0, axis=1)
        rows = np.arange(len(at))
        if not np.all((name[rows, dot] == ord(".")) & (end > dot + 1)) or np.any(dot == 0):
            return None
        ext = name[0, dot[0] + 1 : end[0]].tobytes()
        n = len(ext)
        if np.any(end - dot - 1 != n):
            return None
        if np.any(name[rows[:, None], dot[:, None] + 1 + np.arange(n)] != np.frombuffer(ext, np.uint8)):
            return None
        if key_len is None:
            key_len, key_name = dot, name
        elif np.any(dot != key_len) or np.any((name != key_name) & (_NAME < key_len[:, None])):
            return None  # a member of another key
        try:
            field = ext.decode("ascii")
        except UnicodeDecodeError:
            return None
        if field in fields or field.startswith("__"):
            return None
        fields[field] = Spans(data, at + BLOCK, size)
        at = at + BLOCK + (size + BLOCK - 1) // BLOCK * BLOCK
        done = at == stops
        if np.all(done):
            return TarBatch(starts.astype(np.int64), dot.astype(np.int64), fields)
        if np.any(done) or np.any(at > stops):
            return None
    return None
