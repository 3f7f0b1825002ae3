"""Reading shards: tar members from a byte stream, grouped into samples.

A hand-written ustar/PAX/GNU parser instead of :mod:`tarfile`, because a reader that runs
for days over shards it did not write must bound its memory by the bytes that are really
there (not by a size a header declares), check header checksums, refuse names that are
not plain relative paths, and say which shard and member broke. It reads only forward, so
it works on pipes, HTTP bodies and gzip streams alike; on those it reads past the end blocks
to the end of the stream, so that gzip checks its CRC trailer. Header blocks are read by
:mod:`shardify.tarheader`.
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

from shardify.errors import CompressedDataError, KeyRuleError, ShardFormatError
from shardify.keys import split_member_name
from shardify.tarfmt import BLOCK
from shardify.tarheader import NO_DATA, ZERO_BLOCK, PaxError, checksum_ok, header_fields, member_problem, pax_records

__all__ = [
    "Member",
    "BadMemberHandler",
    "KeepMember",
    "DEFAULT_MAX_MEMBER",
    "iter_members",
    "iter_samples",
    "DAMAGE_AFTER",
    "walk_members",
    "group_members",
    "skip_bytes",
    "read_to_end",
]

DEFAULT_MAX_MEMBER = 1 << 31
"""Largest member data the reader accepts by default (2 GiB); a member declaring more makes
the shard unreadable, whether or not its field is read (``DecodeOptions(max_member_bytes=)`` of the reader)."""
_CHUNK = 1 << 24
_MAX_EXT_HEADER = 1 << 20


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
    return walk_members(
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


def walk_members(
    f: BinaryIO,
    *,
    shard: str,
    max_member: int,
    on_bad_member: BadMemberHandler | None,
    start_offset: int,
    read_data: bool,
    keep: KeepMember | None = None,
) -> Iterator[Member]:
    """The member walk under :func:`iter_members`; ``read_data=False`` passes over every
    member's data (a header-only scan, as :func:`shardify.tarlayout.scan_layout` makes)."""
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
        if header == ZERO_BLOCK:
            if _read_to_end_needed(f):
                read_to_end(f, shard=shard)
            return
        try:
            raw_name, size, typeflag, stored = header_fields(header)
        except ValueError as e:
            raise ShardFormatError(f"corrupt header at byte {offset}: {e}", shard=shard) from e
        if not checksum_ok(header, stored):
            raise ShardFormatError(f"corrupt header at byte {offset}: checksum mismatch", shard=shard)
        if size < 0:
            raise ShardFormatError(f"corrupt header at byte {offset}: negative size", shard=shard)
        if pending_size is not None:
            size, pending_size = pending_size, None
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
                try:
                    records = pax_records(data)
                except PaxError as e:
                    raise ShardFormatError(f"corrupt PAX header: {e}", shard=shard) from e
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
        data_len = 0 if typeflag in NO_DATA else size
        problem = member_problem(name, typeflag, size, max_member)
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


DAMAGE_AFTER = "__damage_after__"
"""In a sample read in full just before damage: what the damage is (the shard's error's reason)."""


def group_members(
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
    so the sample before it counts as whole; it carries the damage under :data:`DAMAGE_AFTER`,
    so that a member it lacks fails as one that may be behind the damage, not as a field never
    written.
    """
    current: dict[str, object] | None = None
    try:
        for item in group_members(members, shard=shard, on_bad_member=on_bad_member):
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
            current[DAMAGE_AFTER] = e.reason  # a field it lacks may be behind the damage: say so then
            yield current  # read in full before the damage; the error comes at the next request
        raise
