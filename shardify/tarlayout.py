"""Where each sample of a tar shard lies: a header-only scan into a compact :class:`ShardLayout`.

:func:`scan_layout` reads a whole shard's headers (a fast path for the plain ustar files
shardify writes, else the full member walk of :mod:`shardify.tarmembers`);
:func:`scan_window` reads only the headers of the samples a split index's offsets point to.
Both take header fields from :func:`shardify.tarheader.header_fields`.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from shardify.errors import ShardFormatError
from shardify.tarfmt import BLOCK
from shardify.tarheader import ZERO_BLOCK, header_fields
from shardify.tarmembers import DEFAULT_MAX_MEMBER, group_members, walk_members

__all__ = ["ShardLayout", "scan_layout", "scan_window", "scan_sample_offsets"]


@dataclass(frozen=True, slots=True)
class ShardLayout:
    """Where each sample of a plain tar shard lies, from one header-only scan.

    Sample ``i`` has key :meth:`key` ``(i)`` and its first header at ``offsets[i]``; its
    members are ``first[i] .. first[i + 1] - 1``, member ``j`` being field ``exts[ext[j]]``
    with ``size[j]`` bytes of data at ``data[j]``. Compact (18 bytes per member, 24 per
    sample plus its key), so a reader can keep the layouts of the shards it reads and fetch a sample's
    fields with one read each, without parsing headers again.
    """

    offsets: array[int]
    first: array[int]
    ext: array[int]
    data: array[int]
    size: array[int]
    exts: tuple[str, ...]
    key_text: bytes
    key_ends: array[int]

    def __len__(self) -> int:
        return len(self.offsets)

    def key(self, i: int) -> str:
        return self.key_text[self.key_ends[i - 1] if i else 0 : self.key_ends[i]].decode("utf-8", "surrogateescape")

    def fields(self, i: int) -> Iterator[tuple[str, int, int]]:
        """``(field, data offset, size)`` of each member of sample ``i``, in shard order."""
        for j in range(self.first[i], self.first[i + 1]):
            yield self.exts[self.ext[j]], self.data[j], self.size[j]


def scan_layout(f: BinaryIO, *, shard: str, max_member: int = DEFAULT_MAX_MEMBER) -> ShardLayout:
    """The :class:`ShardLayout` of the tar stream ``f``, reading headers only.

    Member data is skipped with seeks, so on a local file this costs one 512-byte read per
    member. Raises ShardFormatError wherever :func:`iter_samples` would (a bad header or
    member, a name without a field, a field twice in a sample, a key that comes back after
    another key), and when the data a header declares is not all there.
    """
    fast = _scan_plain(f, max_member=max_member)
    if fast is not None:
        return fast
    offsets, first, ext, data, size = array("q"), array("q"), array("H"), array("q"), array("q")
    exts: dict[str, int] = {}
    key_text = bytearray()
    key_ends = array("q")
    starts = True
    members = walk_members(f, shard=shard, max_member=max_member, on_bad_member=None, start_offset=0, read_data=False)
    for item in group_members(members, shard=shard, on_bad_member=None):
        if item is None:
            starts = True
            continue
        key, field, m = item
        if starts:
            offsets.append(m.offset)
            first.append(len(data))
            key_text += key.encode("utf-8", "surrogateescape")
            key_ends.append(len(key_text))
            starts = False
        if field not in exts and len(exts) > 0xFFFF:
            raise ShardFormatError(f"more than {0xFFFF + 1} different field names", shard=shard, key=key)
        ext.append(exts.setdefault(field, len(exts)))
        data.append(m.data_offset)
        size.append(m.size)
    first.append(len(data))
    return ShardLayout(offsets, first, ext, data, size, tuple(exts), bytes(key_text), key_ends)


_PLAIN_CHUNK = 1 << 20
_PLAIN_HOP = 1 << 14
"""What the plain scan reads after passing over a member of this size or more (a photo):
the next header and the small members after it, not 1 MiB of image bytes to skip."""


def _scan_plain(f: BinaryIO, *, max_member: int) -> ShardLayout | None:
    """:func:`scan_layout` for the common case, several times faster: a seekable plain ustar
    file of regular members with short ASCII names (what shardify writes). Headers are read
    in 1 MiB windows and their checksums checked in one numpy step per window. Returns None
    at anything else, or anything wrong, and the caller scans again with the full parser,
    which accepts what it accepts and raises what it raises."""
    try:
        if not f.seekable() or f.tell() != 0:
            return None
        end = f.seek(0, os.SEEK_END)
    except (OSError, AttributeError):
        return None
    if end == 0:  # not an archive: the full parser says so
        return None
    try:
        found = _plain_layout(f, end, max_member)
    except OSError:
        found = None
    layout = None if found is None else found[0]  # without a count, a scan ends only at the archive's end
    f.seek(0 if layout is None else end)  # as the full parser leaves it: at the start, or read through
    return layout


def scan_window(
    f: BinaryIO,
    *,
    start: int,
    count: int,
    next_start: int | None,
    filesize: int | None = None,
    max_member: int = DEFAULT_MAX_MEMBER,
) -> ShardLayout | None:
    """The layout of the ``count`` samples whose headers begin at byte ``start`` of a plain
    shardify shard (offsets as the split index lists them, see ``OFFSET_STRIDE``).

    Checked against the index: the file must have its ``filesize`` (when given), and the
    window must end exactly where the next one begins (``next_start``), or, for the last
    window (None), at the end of the archive. Anything
    else (a shard replaced or damaged since, a foreign shard, an unusual header) returns
    None, and the caller scans the whole shard with :func:`scan_layout`, which says what
    is wrong. Offsets in the result are the shard's own; indexes are the window's.
    """
    try:
        end = f.seek(0, os.SEEK_END)
        if filesize is not None and end != filesize:
            return None
        # the window's headers and the next sample's first one, nothing past them
        limit = end if next_start is None else min(end, next_start + BLOCK)
        found = _plain_layout(f, limit, max_member, start=start, count=count)
    except (OSError, ValueError):
        return None
    if found is None:
        return None
    layout, pos, at_end = found
    if len(layout) != count:
        return None
    if next_start is None:
        return layout if at_end else None
    return layout if not at_end and pos == next_start else None


def _plain_layout(
    f: BinaryIO, end: int, max_member: int, *, start: int = 0, count: int | None = None
) -> tuple[ShardLayout, int, bool] | None:
    """``(layout, offset where the scan stopped, whether at the end of the archive)``, from
    ``start``, reading no byte at or past ``end``; stops before sample ``count`` when given.
    None: not a plain shard here."""
    import numpy as np

    offsets, first, ext, data, size = array("q"), array("q"), array("H"), array("q"), array("q")
    exts: dict[str, int] = {}
    key_text = bytearray()
    key_ends = array("q")
    seen: set[str] = set()
    fields: set[str] = set()
    last: str | None = None
    pos, buf, buf_at, heads, sums = start, b"", start, array("q"), array("q")
    at_end = False
    length = _PLAIN_HOP  # the last member's size: after a large one (and first), read a hop, not a chunk

    def checksums_ok() -> bool:
        if not heads:
            return True
        rows = np.frombuffer(buf, dtype=np.uint8)[np.asarray(heads)[:, None] + np.arange(BLOCK)].astype(np.int64)
        found = rows.sum(axis=1) - rows[:, 148:156].sum(axis=1) + 8 * 32
        return bool((found == np.asarray(sums)).all())

    while True:
        if pos + BLOCK > buf_at + len(buf):
            if not checksums_ok():
                return None
            heads, sums = array("q"), array("q")
            if pos >= end:
                at_end = True
                break  # end of data on a block boundary
            f.seek(pos)
            buf, buf_at = f.read(min(_PLAIN_CHUNK if length < _PLAIN_HOP else _PLAIN_HOP, end - pos)), pos
            if len(buf) < BLOCK:
                return None
        at = pos - buf_at
        header = buf[at : at + BLOCK]
        if header == ZERO_BLOCK:
            at_end = True
            break
        if header[156:157] != b"0" or header[345] != 0 or header[124] & 0x80 or header[148] & 0x80:
            return None
        try:
            raw, length, _, stored = header_fields(header)
        except ValueError:
            return None
        sums.append(stored)
        heads.append(at)
        dot = raw.find(b".")
        if length > max_member or dot <= 0 or not raw.isascii() or b"/" in raw or b"\\" in raw:
            return None
        name = raw.decode("ascii")
        key, field = name[:dot], name[dot + 1 :].lower()
        if key == last:
            if field in fields:
                return None
        else:
            if count is not None and len(offsets) == count:
                break  # ``pos`` is where the next sample begins
            if key in seen:
                return None
            seen.add(key)
            last, fields = key, set()
            offsets.append(pos)
            first.append(len(data))
            key_text += raw[:dot]
            key_ends.append(len(key_text))
        fields.add(field)
        ext.append(exts.setdefault(field, len(exts)))
        data.append(pos + BLOCK)
        size.append(length)
        pos += BLOCK + length + (-length % BLOCK)
        if len(exts) > 0xFFFF or pos > end:
            return None
    if not checksums_ok():
        return None
    first.append(len(data))
    return ShardLayout(offsets, first, ext, data, size, tuple(exts), bytes(key_text), key_ends), pos, at_end


def scan_sample_offsets(f: BinaryIO, *, shard: str, max_member: int = DEFAULT_MAX_MEMBER) -> list[tuple[str, int]]:
    """``[(key, offset of its first header)]`` for each sample, reading headers only
    (see :func:`scan_layout`, which it checks the same way)."""
    layout = scan_layout(f, shard=shard, max_member=max_member)
    return [(layout.key(i), layout.offsets[i]) for i in range(len(layout))]
