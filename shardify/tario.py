"""Reading shards: tar members from a byte stream, grouped into samples.

A hand-written ustar/PAX/GNU parser instead of :mod:`tarfile`, because a reader that runs
for days over shards it did not write must bound its memory by the bytes that are really
there (not by a size a header declares), check header checksums, refuse names that are
not plain relative paths, and say which shard and member broke. It reads only forward, so
it works on pipes, HTTP bodies and gzip streams alike; on those it reads past the end blocks
to the end of the stream, so that gzip checks its CRC trailer.
"""

from __future__ import annotations

import gzip
import os
import zlib
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

from shardify.errors import CompressedDataError, KeyRuleError, ShardFormatError
from shardify.keys import split_member_name
from shardify.tarfmt import BLOCK

__all__ = [
    "Member",
    "BadMemberHandler",
    "iter_members",
    "iter_samples",
    "scan_sample_offsets",
    "scan_layout",
    "scan_window",
    "ShardLayout",
    "skip_bytes",
    "DEFAULT_MAX_MEMBER",
    "KeepMember",
    "read_to_end",
]

DEFAULT_MAX_MEMBER = 1 << 31
"""Largest member data the reader accepts by default (2 GiB); a member declaring more makes
the shard unreadable, whether or not its field is read (``DecodeOptions(max_member_bytes=)`` of the reader)."""
_CHUNK = 1 << 24
_MAX_EXT_HEADER = 1 << 20
_REGULAR = (b"0", b"\x00", b"7")
_SKIPPED_SILENTLY = (b"5", b"g")  # directories, global PAX headers


@dataclass(frozen=True, slots=True)
class Member:
    """One regular file of a shard: its name, its bytes, and the offset of its first header
    (its PAX or GNU extension header, if it has one): seeking there reads it whole;
    ``data_offset`` is where its ``size`` bytes of data start (``data`` is empty when a scan
    skipped them)."""

    name: str
    data: bytes
    offset: int
    data_offset: int = -1
    size: int = -1
    skipped: bool = False
    """The data was passed over unread (a field the caller does not want); ``data`` is empty."""


BadMemberHandler = Callable[[str, str], None]
"""Called as ``handler(name, reason)`` for a member that is skipped instead of raising."""

KeepMember = Callable[[str], bool]
"""Called as ``keep(name)``: False passes over that member's data without reading it into memory."""


def skip_bytes(f: BinaryIO, n: int) -> int:
    """Advance ``f`` by ``n`` bytes (seek when possible); returns how many were skipped."""
    if n <= 0:
        return 0
    try:
        if f.seekable():
            here = f.tell()
            end = f.seek(0, os.SEEK_END)
            target = min(here + n, end)
            f.seek(target)
            return target - here
    except (OSError, AttributeError):
        pass
    done = 0
    while done < n:
        chunk = f.read(min(_CHUNK, n - done))
        if not chunk:
            break
        done += len(chunk)
    return done


def _key_of(name: str) -> str | None:
    """The sample key of member ``name``, or None when it has none (for locating damage)."""
    try:
        return split_member_name(name)[0]
    except KeyRuleError:
        return None


def _read_exact(f: BinaryIO, n: int, *, shard: str, what: str, key: str | None = None) -> bytes:
    """Read exactly ``n`` bytes, growing memory only with bytes that really arrive."""
    if n <= _CHUNK:
        data = f.read(n)
    else:
        parts, got = [], 0
        while got < n:
            part = f.read(min(_CHUNK, n - got))
            if not part:
                break
            parts.append(part)
            got += len(part)
        data = b"".join(parts)
    if len(data) != n:
        raise ShardFormatError(f"truncated: {what} needs {n} bytes, only {len(data)} left", shard=shard, key=key)
    return data


def _octal(field: bytes, *, shard: str, what: str) -> int:
    if field and field[0] & 0x80:  # GNU base-256
        value = int.from_bytes(field[1:], "big")
        return -value if field[0] & 0x40 else value
    text = field.split(b"\x00", 1)[0].strip(b" ")
    if not text:
        return 0
    try:
        return int(text, 8)
    except ValueError as e:
        raise ShardFormatError(f"corrupt header: {what} field {field!r} is not octal", shard=shard) from e


def _checksum_ok(header: bytes, stored: int) -> bool:
    unsigned = sum(header[:148]) + 256 + sum(header[156:])
    if unsigned == stored:
        return True
    signed = sum((b ^ 0x80) - 0x80 for b in header[:148]) + 256
    signed += sum((b ^ 0x80) - 0x80 for b in header[156:])
    return signed == stored


def _pax_records(data: bytes, *, shard: str) -> dict[str, str]:
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0:
            break
        try:
            length = int(data[pos:space])
        except ValueError as e:
            raise ShardFormatError("corrupt PAX header: bad record length", shard=shard) from e
        if length <= 0 or pos + length > len(data):
            raise ShardFormatError("corrupt PAX header: record overruns the header", shard=shard)
        record = data[space + 1 : pos + length - 1]
        key, _, value = record.partition(b"=")
        records[key.decode("utf-8", "replace")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


def _unsafe_reason(name: str) -> str | None:
    if "/" not in name and "\\" not in name and "\x00" not in name:
        return ".. is not a file name" if name == ".." else None
    if name.startswith("/") or name.startswith("\\"):
        return "absolute member name"
    parts = name.replace("\\", "/").split("/")
    if ".." in parts:
        return "member name contains '..'"
    if "\x00" in name:
        return "member name contains NUL"
    return None


def iter_members(
    f: BinaryIO,
    *,
    shard: str,
    max_member: int = DEFAULT_MAX_MEMBER,
    on_bad_member: BadMemberHandler | None = None,
    start_offset: int = 0,
    keep: KeepMember | None = None,
) -> Iterator[Member]:
    """Yield the regular-file members of the tar stream ``f`` in archive order.

    Raises ShardFormatError (naming ``shard``) for a truncated or corrupt archive, and for an
    empty file (0 bytes is no archive, as for ``tar`` and :mod:`tarfile`). A member
    that is well framed but unusable (a link, a device, an unsafe or non-UTF-8 name, data
    over ``max_member`` bytes) raises too, unless ``on_bad_member`` is given: then it is
    reported there and skipped. ``start_offset`` is the stream position of ``f`` (used for
    the offsets reported when reading starts mid-archive). A member whose name ``keep``
    refuses is yielded with ``skipped=True`` and its data passed over unread (seeked, or read
    through in chunks). On a gzip stream, or any stream that cannot seek (a pipe), the end
    of the archive is followed by :func:`read_to_end`, so gzip checks its CRC trailer.
    """
    return _walk(
        f,
        shard=shard,
        max_member=max_member,
        on_bad_member=on_bad_member,
        start_offset=start_offset,
        read_data=True,
        keep=keep,
    )


def _read_to_end_needed(f: BinaryIO) -> bool:
    """Whether the end of the archive in ``f`` is not the end of what must be checked: a gzip
    stream (its trailer follows), or any forward-only stream (a pipe, an HTTP body)."""
    if isinstance(f, gzip.GzipFile):
        return True
    try:
        return not f.seekable()
    except (OSError, AttributeError):
        return True


def read_to_end(f: BinaryIO, *, shard: str) -> int:
    """Read ``f`` through to its end in bounded chunks, discarding the bytes; returns their count.

    For a gzip stream this is what checks the trailer (CRC-32 and length of the data): a
    tar reader that stops at the end-of-archive blocks would take a corrupted ``.tgz`` as
    good. Errors (a CRC mismatch, a truncated or garbled stream) raise ShardFormatError.
    """
    done = 0
    try:
        while True:
            chunk = f.read(_CHUNK)
            if not chunk:
                return done
            done += len(chunk)
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        raise CompressedDataError(
            f"corrupt compressed data after the end of the archive: {type(e).__name__}: {e}", shard=shard
        ) from e


def _walk(
    f: BinaryIO,
    *,
    shard: str,
    max_member: int,
    on_bad_member: BadMemberHandler | None,
    start_offset: int,
    read_data: bool,
    keep: KeepMember | None = None,
) -> Iterator[Member]:
    offset = start_offset
    pending_name: str | None = None
    pending_size: int | None = None
    first_header: int | None = None  # where a member's extension headers began
    while True:
        header = f.read(BLOCK)
        if not header:
            if offset == 0:
                raise ShardFormatError("empty file (0 bytes): not a tar archive", shard=shard)
            return  # end of data on a block boundary: treat as end of archive
        if len(header) < BLOCK:
            raise ShardFormatError(f"truncated: partial header at byte {offset}", shard=shard)
        if header == _ZERO_BLOCK:
            if _read_to_end_needed(f):
                read_to_end(f, shard=shard)
            return
        stored = _octal(header[148:156], shard=shard, what="checksum")
        if not _checksum_ok(header, stored):
            raise ShardFormatError(f"corrupt header at byte {offset}: checksum mismatch", shard=shard)
        typeflag = header[156:157]
        size = _octal(header[124:136], shard=shard, what="size")
        if size < 0:
            raise ShardFormatError(f"corrupt header at byte {offset}: negative size", shard=shard)
        if pending_size is not None:
            size, pending_size = pending_size, None
        raw_name = header[0:100].split(b"\x00", 1)[0]
        if header[257:262] == b"ustar" and header[345:346] != b"\x00":
            prefix = header[345:500].split(b"\x00", 1)[0]
            if prefix:
                raw_name = prefix + b"/" + raw_name
        member_offset = offset
        offset += BLOCK
        if typeflag in (b"x", b"L"):
            if first_header is None:
                first_header = member_offset
            if size > _MAX_EXT_HEADER:
                raise ShardFormatError(
                    f"extension header at byte {member_offset} declares {size} bytes (limit {_MAX_EXT_HEADER})",
                    shard=shard,
                )
            data = _read_exact(f, size, shard=shard, what=f"extension header at byte {member_offset}")
            skip = -size % BLOCK
            if skip and skip_bytes(f, skip) != skip:
                raise ShardFormatError("truncated after an extension header", shard=shard)
            offset += size + skip
            if typeflag == b"L":
                pending_name = data.split(b"\x00", 1)[0].decode("utf-8", "surrogateescape")
            else:
                records = _pax_records(data, shard=shard)
                if "path" in records:
                    pending_name = records["path"]
                if "size" in records:
                    try:
                        pending_size = int(records["size"])
                    except ValueError as e:
                        raise ShardFormatError("corrupt PAX header: size is not a number", shard=shard) from e
                    if pending_size < 0:
                        raise ShardFormatError("corrupt PAX header: negative size", shard=shard)
            continue
        if pending_name is not None:
            name, pending_name = pending_name, None
        else:
            name = raw_name.decode("utf-8", "surrogateescape")
        if first_header is not None:
            member_offset, first_header = first_header, None
        data_len = 0 if typeflag in _NO_DATA else size
        problem = _member_problem(name, typeflag, size, max_member)
        if problem is not None:
            total = data_len + (-data_len % BLOCK)
            if problem:
                if on_bad_member is None:
                    raise ShardFormatError(
                        f"{problem} (member {name!r} at byte {member_offset})", shard=shard, key=_key_of(name)
                    )
                on_bad_member(name, problem)
            if skip_bytes(f, total) != total:
                raise ShardFormatError(
                    f"truncated: member {name!r} at byte {member_offset}", shard=shard, key=_key_of(name)
                )
            offset += total
            continue
        total = size + (-size % BLOCK)
        data_offset = offset
        skipped = not read_data or (keep is not None and not keep(name))
        if skipped:
            data, skip = b"", total
        else:
            data = _read_exact(f, size, shard=shard, what=f"member {name!r}", key=_key_of(name))
            skip = total - size
        if skip and skip_bytes(f, skip) != skip:
            raise ShardFormatError(
                f"truncated: member {name!r} at byte {member_offset}", shard=shard, key=_key_of(name)
            )
        offset += total
        yield Member(name, data, member_offset, data_offset, size, skipped)


_ZERO_BLOCK = bytes(BLOCK)
_NO_DATA = (b"1", b"2", b"3", b"4", b"5", b"6")
_KINDS = {b"1": "hard link", b"2": "symbolic link", b"3": "character device", b"4": "block device", b"6": "FIFO"}


def _member_problem(name: str, typeflag: bytes, size: int, max_member: int) -> str | None:
    """Why a member is not yielded: None if it is fine, "" to skip it silently."""
    if typeflag in _SKIPPED_SILENTLY:
        return ""
    if typeflag not in _REGULAR:
        kind = _KINDS.get(typeflag, f"member of type {typeflag!r}")
        return f"{kind}, not a regular file"
    reason = _unsafe_reason(name)
    if reason is not None:
        return reason
    if not name.isascii():
        try:
            name.encode("utf-8")  # undecodable bytes became surrogates, which do not encode
        except UnicodeEncodeError:
            return "member name is not UTF-8"
    if size > max_member:
        return f"member declares {size} bytes, over the limit of {max_member}"
    return None


def _grouped(
    members: Iterator[Member], *, shard: str, on_bad_member: BadMemberHandler | None
) -> Iterator[tuple[str, str, Member] | None]:
    """Each member as ``(key, field, member)`` once the grouping rules accept it, and None
    where a sample ends. The rules: a name without a dot, a field repeated within a sample,
    or a key that comes back after another key raises ShardFormatError (or goes to
    ``on_bad_member``, and the member is left out)."""
    seen: set[str] = set()
    last: str | None = None
    fields: set[str] = set()
    for m in members:
        try:
            key, field = split_member_name(m.name)
        except KeyRuleError as e:
            if on_bad_member is None:
                raise ShardFormatError(str(e), shard=shard) from e
            on_bad_member(m.name, str(e))
            continue
        if key == last:
            problem = f"field {field!r} appears twice in the sample" if field in fields else None
        else:
            if last is not None:
                yield None
                last = None
            problem = (
                (
                    "key appears again after other keys (duplicate or non-adjacent members; "
                    "GNU tar keeps a sample's members together with `tar --sort=name`)"
                )
                if key in seen
                else None
            )
        if problem is not None:
            if on_bad_member is None:
                raise ShardFormatError(problem, shard=shard, key=key)
            on_bad_member(m.name, problem)
            continue
        if key != last:
            seen.add(key)
            last, fields = key, set()
        fields.add(field)
        yield key, field, m
    if last is not None:
        yield None


def iter_samples(
    members: Iterator[Member],
    *,
    shard: str,
    on_bad_member: BadMemberHandler | None = None,
) -> Iterator[dict[str, object]]:
    """Group adjacent members by key into sample dicts, webdataset's way.

    A sample is ``{"__key__": key, "__shard__": shard, "__offset__": first header offset,
    ext: bytes, ...}``. A name without a dot, a field repeated within a sample, or a key
    that comes back after another key raises ShardFormatError (or goes to ``on_bad_member``).
    When the archive is damaged after the last member read so far of a sample, that sample
    is yielded before the error is raised, unless the error names its key (the damage is in
    one of its own members). A damaged header cannot be told apart from the next sample's,
    so the sample before it counts as whole (a member it lacks then fails as a missing field).
    """
    current: dict[str, object] | None = None
    try:
        for item in _grouped(members, shard=shard, on_bad_member=on_bad_member):
            if item is None:
                if current is not None:
                    yield current
                current = None
                continue
            key, field, m = item
            if current is None:
                current = {"__key__": key, "__shard__": shard, "__offset__": m.offset}
            if not m.skipped:
                current[field] = m.data
    except ShardFormatError as e:
        if current is not None and e.key != current["__key__"] and not isinstance(e, CompressedDataError):
            yield current  # read in full before the damage; the error comes at the next request
        raise


@dataclass(frozen=True, slots=True)
class ShardLayout:
    """Where each sample of a plain tar shard lies, from one header-only scan.

    Sample ``i`` has key :meth:`key` ``(i)`` and its first header at ``offsets[i]``; its
    members are ``first[i] .. first[i + 1] - 1``, member ``j`` being field ``exts[ext[j]]``
    with ``size[j]`` bytes of data at ``data[j]``. Compact (18 bytes per member, 24 per
    sample plus its key), so a reader can keep the layouts of the shards it reads and fetch a sample's
    fields with one read each, without parsing headers again.
    """

    offsets: array
    first: array
    ext: array
    data: array
    size: array
    exts: tuple[str, ...]
    key_text: bytes
    key_ends: array

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
    members = _walk(f, shard=shard, max_member=max_member, on_bad_member=None, start_offset=0, read_data=False)
    for item in _grouped(members, shard=shard, on_bad_member=None):
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
        if header == _ZERO_BLOCK:
            at_end = True
            break
        if header[156:157] != b"0" or header[345] != 0 or header[124] & 0x80 or header[148] & 0x80:
            return None
        try:
            length = int(header[124:136].split(b"\x00", 1)[0].strip(b" ") or b"0", 8)
            sums.append(int(header[148:156].split(b"\x00", 1)[0].strip(b" ") or b"0", 8))
        except ValueError:
            return None
        heads.append(at)
        raw = header[:100].split(b"\x00", 1)[0]
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
